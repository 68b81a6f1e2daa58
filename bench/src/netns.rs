//! A veth pair between two network namespaces, made and removed by the
//! benchmark, so that kernel sockets and DPDK `net_af_packet` ports can be
//! measured over a real (virtual) Ethernet link without a NIC.
//!
//! [`VethPair::create`] makes two namespaces named `emxb-<pid>-<n>-0-p<ns>`
//! and `emxb-<pid>-<n>-1-p<ns>` (`<n>` counts pairs within this process,
//! `<ns>` is the inode of its pid namespace: runs in containers that share
//! `/run/netns` may have the same pid, and cannot see each other's), a veth pair
//! with one end in each, and configures both ends; dropping the pair deletes
//! the namespaces and the veth with them. [`VethPair::enter`] moves the calling
//! thread into one namespace, so that the sockets and ports it opens live
//! there. [`cleanup_on_signal`] deletes whatever is still registered when the
//! process is interrupted.
//!
//! Needs root (`CAP_SYS_ADMIN` and `CAP_NET_ADMIN`) and iproute2's `ip`.

use std::fs::File;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, Once};

/// Prefix of every namespace this module makes; the owning pid follows it.
const NS_PREFIX: &str = "emxb-";
/// Where `ip netns` keeps its namespace handles.
const NETNS_DIR: &str = "/run/netns";
/// Error text when the process lacks the privileges to make namespaces.
const NEED_ROOT: &str = "the veth link needs root (network namespaces): run as root or with sudo";

/// Namespaces that exist now and must be deleted if the process is interrupted.
static REGISTRY: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Held (read) by every `ip` command this module runs, and taken (write) by
/// the signal cleanup, which marks it stopping: the cleanup waits for the
/// commands under way (a namespace being made now is made, then deleted),
/// and none starts after it.
static IP_GATE: std::sync::RwLock<bool> = std::sync::RwLock::new(false);
/// Number of pairs created by this process so far (makes names unique).
static PAIR_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A veth pair whose two ends live in two network namespaces of their own.
///
/// Both namespaces (and so the veth) are deleted on drop. The fields describe
/// the link for side 0 and side 1: index `i` is the end inside `ns[i]`.
#[derive(Debug)]
pub struct VethPair {
    /// Namespace names, `emxb-<pid>-<n>-0-p<ns>` and `emxb-<pid>-<n>-1-p<ns>`.
    pub ns: [String; 2],
    /// Interface name of the veth end inside each namespace (`emxb0`, `emxb1`).
    pub ifname: [String; 2],
    /// IPv4 address of each end, `10.233.<n>.1/24` and `10.233.<n>.2/24`.
    pub ip: [Ipv4Addr; 2],
    /// MAC address of each end: fixed, locally administered, `02:45:4d:58:<n>:01`/`02`.
    pub mac: [[u8; 6]; 2],
    /// MTU of both ends.
    pub mtu: u16,
    /// The network namespace the process started in (of its main thread), for [`VethPair::leave`].
    home: File,
}

impl VethPair {
    /// Makes both namespaces and the veth pair between them.
    ///
    /// Each end gets its fixed MAC, the MTU `mtu` (68 to 65535), its IPv4
    /// address and is brought up, as is `lo` in each namespace. IPv6 is
    /// disabled in both namespaces before the link exists (no router
    /// solicitations or DAD frames on the link). Offloads stay as Linux sets
    /// them (TSO, GSO, GRO on): the kernel baselines are measured the way an
    /// application would meet them. Stale namespaces of
    /// an earlier run whose owning pid is dead are removed first. The
    /// namespaces are registered for [`cleanup_on_signal`] before they are
    /// made; this does not install the handler itself.
    ///
    /// Errors name the fix: not root, `ip` missing (install iproute2), or the
    /// failing `ip` command and its message.
    pub fn create(mtu: u16) -> Result<VethPair, String> {
        if mtu < 68 {
            return Err(format!("MTU {mtu} is below IPv4's minimum of 68"));
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(NEED_ROOT.to_string());
        }
        check_ip_tool()?;
        remove_stale();

        let pid = std::process::id();
        let n = PAIR_COUNTER.fetch_add(1, Ordering::Relaxed);
        let ns = [0, 1].map(|side| format!("{NS_PREFIX}{pid}-{n}-{side}-p{}", pid_ns()));
        let ifname = [0, 1].map(|side| format!("emxb{side}"));
        let subnet = (n % 256) as u8;
        let ip = [1, 2].map(|host| Ipv4Addr::new(10, 233, subnet, host));
        let mac = [1, 2].map(|host| [0x02, 0x45, 0x4d, 0x58, subnet, host]);
        let home = File::open("/proc/self/ns/net")
            .map_err(|e| format!("cannot open /proc/self/ns/net: {e}"))?;

        for name in &ns {
            let registered = REGISTRY
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(name);
            if registered {
                return Err(format!(
                    "network namespace {name} is already in use by this process"
                ));
            }
            if namespace_exists(name) {
                // Same pid as ours, in our pid namespace, but not made by this
                // process: left over by an earlier process that had our pid
                // and was killed.
                delete_namespace(name);
                if namespace_exists(name) {
                    return Err(format!(
                        "network namespace {name} exists and cannot be removed: `ip netns delete {name}`"
                    ));
                }
            }
        }

        // From here on the pair owns the names; drop deletes whatever was made.
        register(&ns);
        let pair = VethPair {
            ns,
            ifname,
            ip,
            mac,
            mtu,
            home,
        };
        pair.configure()?;
        Ok(pair)
    }

    /// Runs every `ip` step of [`VethPair::create`] after the names are registered.
    fn configure(&self) -> Result<(), String> {
        for name in &self.ns {
            ip(&["netns", "add", name])?;
        }
        for side in 0..2 {
            self.in_namespace(side, disable_ipv6)?;
        }
        let mtu = self.mtu.to_string();
        ip(&[
            "link",
            "add",
            &self.ifname[0],
            "netns",
            &self.ns[0],
            "mtu",
            &mtu,
            "type",
            "veth",
            "peer",
            "name",
            &self.ifname[1],
            "netns",
            &self.ns[1],
            "mtu",
            &mtu,
        ])?;
        for side in 0..2 {
            let (ns, ifname) = (&self.ns[side], &self.ifname[side]);
            let mac = format_mac(&self.mac[side]);
            ip(&["-n", ns, "link", "set", "dev", ifname, "address", &mac])?;
            let addr = format!("{}/24", self.ip[side]);
            ip(&["-n", ns, "addr", "add", &addr, "dev", ifname])?;
            // The peer's address is known: no ARP exchange in the kernel
            // baselines' round trips (DPDK's transports have none), nor its
            // entry going stale in a long run.
            let (peer_ip, peer_mac) = (
                self.ip[1 - side].to_string(),
                format_mac(&self.mac[1 - side]),
            );
            ip(&[
                "-n",
                ns,
                "neigh",
                "replace",
                &peer_ip,
                "lladdr",
                &peer_mac,
                "dev",
                ifname,
                "nud",
                "permanent",
            ])?;
        }
        for side in 0..2 {
            let ns = &self.ns[side];
            ip(&["-n", ns, "link", "set", "dev", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", "dev", &self.ifname[side], "up"])?;
        }
        Ok(())
    }

    /// Runs `f` on a short-lived thread that has entered namespace `side`.
    fn in_namespace<F>(&self, side: usize, f: F) -> Result<(), String>
    where
        F: FnOnce() -> Result<(), String> + Send + 'static,
    {
        let path = format!("{NETNS_DIR}/{}", self.ns[side]);
        std::thread::scope(|s| {
            s.spawn(|| {
                setns_path(&path)?;
                f()
            })
            .join()
            .unwrap_or_else(|_| Err("namespace helper thread panicked".to_string()))
        })
    }

    /// Moves the calling thread into namespace `side` (0 or 1): `setns` on
    /// `/run/netns/<name>` with `CLONE_NEWNET`. Sockets and DPDK `af_packet`
    /// ports that this thread creates afterwards live in that namespace;
    /// threads it spawns afterwards start in it too. Other threads are not moved.
    pub fn enter(&self, side: usize) -> Result<(), String> {
        let name = self
            .ns
            .get(side)
            .ok_or_else(|| format!("no side {side}: a pair has sides 0 and 1"))?;
        setns_path(&format!("{NETNS_DIR}/{name}"))
    }

    /// Moves the calling thread back to the network namespace the process
    /// started in (the main thread's when [`VethPair::create`] ran).
    pub fn leave(&self) -> Result<(), String> {
        setns_fd(&self.home, "the starting namespace")
    }
}

impl Drop for VethPair {
    /// Deletes both namespaces (the veth goes with them) and unregisters them
    /// from the signal cleanup; one that could not be deleted is named.
    fn drop(&mut self) {
        let gone: Vec<&String> = self.ns.iter().filter(|n| delete_namespace(n)).collect();
        for n in self.ns.iter().filter(|n| !gone.contains(n)) {
            eprintln!(
                "emx-bench: network namespace {n} could not be deleted; remove it with \
                 `ip netns delete {n}` (the next veth run tries too)"
            );
        }
        // One not deleted stays registered: the signal cleanup, or the next
        // run's sweep, tries it again.
        let mut reg = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        reg.retain(|n| !gone.contains(&n));
    }
}

/// Installs, once per process, a handler for SIGINT, SIGTERM and SIGHUP that
/// deletes every namespace still registered by [`VethPair::create`] and then
/// exits the process with status 128 + the signal, as a shell reports it
/// (130 for SIGINT, 143 for SIGTERM). `ip` commands under way finish first,
/// and no other starts: a signal in the middle of making a pair leaves
/// nothing behind.
///
/// The handler is a thread waiting on the signals (signal-hook), so the
/// deletion runs outside signal context. A second signal exits at once,
/// without waiting for the cleanup. [`VethPair::create`] does not install
/// it: call this once at start-up, before the first pair is made. Later calls
/// do nothing.
pub fn cleanup_on_signal() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("emx-bench: cannot install the namespace cleanup on signals: {e}");
                return;
            }
        };
        let spawned = std::thread::Builder::new()
            .name("netns-cleanup".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    // A second signal ends the process at once, should the
                    // cleanup hang (an `ip` under way that never returns):
                    // signal-hook keeps catching them, so it was swallowed.
                    let again = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]);
                    if let Ok(mut again) = again {
                        let _ = std::thread::Builder::new()
                            .name("netns-cleanup-2".into())
                            .spawn(move || {
                                if let Some(sig) = again.forever().next() {
                                    eprintln!(
                                        "emx-bench: a second signal: exiting without the \
                                         cleanup; namespaces {NS_PREFIX}{}-* may remain (the \
                                         next veth run removes them, or `ip netns delete` them)",
                                        std::process::id()
                                    );
                                    std::process::exit(128 + sig);
                                }
                            });
                    }
                    // Held until exit: `ip` commands under way end first, and
                    // no other starts (one would make what this loop missed).
                    let mut gate = IP_GATE.write().unwrap_or_else(|p| p.into_inner());
                    *gate = true;
                    // Held until exit: a pair being made now cannot register
                    // names that this loop would miss.
                    let reg = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
                    let (gone, kept): (Vec<&String>, Vec<&String>) =
                        reg.iter().partition(|n| delete_namespace(n));
                    let names =
                        |v: &[&String]| v.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ");
                    if !gone.is_empty() {
                        eprintln!(
                            "emx-bench: signal {sig}: removed network namespaces {}",
                            names(&gone)
                        );
                    }
                    if !kept.is_empty() {
                        eprintln!(
                            "emx-bench: signal {sig}: could not remove network namespaces {} \
                             (the next veth run removes them, or `ip netns delete` them)",
                            names(&kept)
                        );
                    }
                    // As a shell reports death by the signal.
                    std::process::exit(128 + sig);
                }
            });
        if let Err(e) = spawned {
            eprintln!("emx-bench: cannot start the namespace cleanup thread: {e}");
        }
    });
}

/// Adds `names` to the registry deleted on signal.
fn register(names: &[String]) {
    let mut reg = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    reg.extend(names.iter().cloned());
}

/// Formats a MAC address as `ip` expects it.
fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// An `ip` command in a process group of its own: a Ctrl-C at the terminal
/// (sent to the terminal's whole group) reaches emx-bench, whose cleanup
/// then deletes what it made, and not the `ip` commands under way, which it
/// would kill half done (a second Ctrl-C killed the cleanup's own).
fn ip_command() -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new("ip");
    c.process_group(0);
    c
}

/// Checks that iproute2's `ip` can be run.
fn check_ip_tool() -> Result<(), String> {
    match ip_command().arg("-V").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "`ip -V` failed ({}): install iproute2",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err("the veth link needs the `ip` command: install iproute2".to_string())
        }
        Err(e) => Err(format!("cannot run `ip`: {e}: install iproute2")),
    }
}

/// Runs `ip ARGS`, turning a failure into an error naming the command and its message.
fn ip(args: &[&str]) -> Result<(), String> {
    let gate = IP_GATE.read().unwrap_or_else(|p| p.into_inner());
    if *gate {
        return Err("stopping on a signal".to_string());
    }
    let out = ip_command().args(args).output();
    drop(gate);
    let out = out.map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            "the veth link needs the `ip` command: install iproute2".to_string()
        } else {
            format!("cannot run `ip`: {e}")
        }
    })?;
    if out.status.success() {
        return Ok(());
    }
    let mut msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if msg.is_empty() {
        // Killed, or crashed: its status is all there is to say.
        msg = out.status.to_string();
    }
    let hint = hint_for(&msg, nix::unistd::geteuid().is_root());
    Err(format!("`ip {}` failed: {msg}{hint}", args.join(" ")))
}

/// Root without the capabilities network namespaces need (a container's
/// default set).
const NEED_CAPS: &str = "the veth link needs CAP_SYS_ADMIN and CAP_NET_ADMIN (network \
                         namespaces), which this root lacks: in a container, run it with \
                         --privileged (or --cap-add SYS_ADMIN --cap-add NET_ADMIN)";

/// What to do about an `ip` failure that says `msg`, as root or not.
fn hint_for(msg: &str, root: bool) -> String {
    let lower = msg.to_lowercase();
    if lower.contains("permission denied") || lower.contains("operation not permitted") {
        format!(": {}", if root { NEED_CAPS } else { NEED_ROOT })
    } else if lower.contains("unknown device type") {
        ": this kernel has no veth driver: `modprobe veth` on the host (CONFIG_VETH)".to_string()
    } else {
        String::new()
    }
}

/// Whether `ip netns` has a namespace called `name`.
fn namespace_exists(name: &str) -> bool {
    std::path::Path::new(NETNS_DIR).join(name).exists()
}

/// Deletes namespace `name`, ignoring errors (it may not exist); whether it
/// is gone.
fn delete_namespace(name: &str) -> bool {
    let _ = ip_command().args(["netns", "delete", name]).output();
    !namespace_exists(name)
}

/// The inode of this process's pid namespace (`/proc/self/ns/pid`), which
/// tells runs that share `/run/netns` from different pid namespaces apart;
/// 0 where it cannot be read.
fn pid_ns() -> u64 {
    static NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NS.get_or_init(|| {
        std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .and_then(|l| {
                let l = l.to_string_lossy().into_owned();
                l.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
            })
            .unwrap_or(0)
    })
}

/// Owner of a namespace name made by this module, if it is one: its pid, and
/// its pid namespace (`None` for names of earlier builds, which had none).
fn owner_pid(name: &str) -> Option<(i32, Option<u64>)> {
    let rest = name.strip_prefix(NS_PREFIX)?;
    let mut parts = rest.split('-');
    let pid = parts.next()?.parse::<i32>().ok()?;
    let n = parts.next()?;
    let side = parts.next()?;
    let ns = match parts.next() {
        None => None,
        Some(p) => Some(p.strip_prefix('p')?.parse::<u64>().ok()?),
    };
    let shape_ok = !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
        && (side == "0" || side == "1")
        && parts.next().is_none();
    (shape_ok && pid > 0).then_some((pid, ns))
}

/// Whether process `pid` runs (in this pid namespace): it exists and is no
/// zombie (one killed outright whose parent has not reaped it yet, a test
/// runner's timeout say, is over; the testbed scripts' `run_over` says the
/// same).
fn pid_alive(pid: i32) -> bool {
    // Signal 0 only checks that the process exists.
    if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
        == Err(nix::errno::Errno::ESRCH)
    {
        return false;
    }
    // The state is the field after the last ')' (the name may hold any).
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| {
        st.rsplit(')')
            .next()
            .is_none_or(|rest| !rest.trim_start().starts_with('Z'))
    })
}

/// Removes namespaces `emxb-<pid>-<n>-<side>-p<ns>` left by processes of
/// this pid namespace that are dead, or whose pid another process took since
/// (it started after the namespace was made: in a container pids are small
/// and soon reused, and such a namespace stayed until that process ended).
/// Another pid namespace's are left alone: its pids mean nothing here.
fn remove_stale() {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    let me = std::process::id() as i32;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some((pid, ns)) = owner_pid(&name) {
            if ns.is_none_or(|ns| ns == pid_ns()) && pid != me {
                let made = entry.metadata().and_then(|m| m.modified()).ok();
                let reused = made.is_some_and(|made| started_after(started_at(pid), made));
                if reused || !pid_alive(pid) {
                    delete_namespace(&name);
                }
            }
        }
    }
}

/// /proc's clock ticks a second (`USER_HZ`: 100 on Linux, whatever the
/// kernel's own tick).
const USER_HZ: f64 = 100.0;

/// When process `pid` started, in seconds since the epoch (to a tick), if
/// /proc tells.
fn started_at(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22, the start in ticks since boot; the fields after the name
    // (which may hold anything) start with the 3rd.
    let ticks: f64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    Some(now - uptime + ticks / USER_HZ)
}

/// Whether a process that started at `started` (seconds since the epoch)
/// came after a namespace made at `made`: then it cannot be the one that
/// made it. A second's margin, for the clocks' resolutions and steps: a
/// live owner is never taken for another.
fn started_after(started: Option<f64>, made: std::time::SystemTime) -> bool {
    let Ok(made) = made.duration_since(std::time::UNIX_EPOCH) else {
        return false;
    };
    started.is_some_and(|s| s > made.as_secs_f64() + 1.0)
}

/// `setns(CLONE_NEWNET)` on the namespace file at `path`, for the calling thread.
fn setns_path(path: &str) -> Result<(), String> {
    let f = File::open(path).map_err(|e| format!("cannot open network namespace {path}: {e}"))?;
    setns_fd(&f, path)
}

/// `setns(CLONE_NEWNET)` on the namespace file `f`, for the calling thread.
fn setns_fd(f: &File, what: &str) -> Result<(), String> {
    match nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => Err(format!(
            "cannot enter {what}: {}: {}",
            nix::errno::Errno::EPERM.desc(),
            if nix::unistd::geteuid().is_root() {
                NEED_CAPS
            } else {
                NEED_ROOT
            }
        )),
        Err(nix::errno::Errno::EINVAL) => Err(format!(
            "cannot enter {what}: {}: this kernel has no network namespaces \
             (CONFIG_NET_NS)",
            nix::errno::Errno::EINVAL.desc()
        )),
        Err(e) => Err(format!("cannot enter {what}: {}", e.desc())),
    }
}

/// Disables IPv6 in the calling thread's network namespace (all and default,
/// so interfaces made afterwards start without it). A kernel without IPv6 is fine.
fn disable_ipv6() -> Result<(), String> {
    for conf in ["all", "default"] {
        let path = format!("/proc/sys/net/ipv6/conf/{conf}/disable_ipv6");
        match std::fs::write(&path, "1") {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("cannot write {path}: {e}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::time::{Duration, Instant};

    /// Environment variable that makes [`signal_helper`] do its work.
    const HELPER_ENV: &str = "EMXB_NETNS_SIGNAL_HELPER";

    /// Names listed by `ip netns list` (first word of each line).
    fn listed() -> Vec<String> {
        let out = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    }

    /// Runs `ip -n ns ARGS` and returns stdout.
    fn ip_out(ns: &str, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["-n", ns])
            .args(args)
            .output()
            .expect("ip");
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn create_and_drop() {
        let pair = VethPair::create(1500).expect("create veth pair");
        let names = listed();
        for side in 0..2 {
            assert!(
                names.contains(&pair.ns[side]),
                "{} not in {names:?}",
                pair.ns[side]
            );
            let link = ip_out(&pair.ns[side], &["link", "show", "dev", &pair.ifname[side]]);
            assert!(link.contains(&format_mac(&pair.mac[side])), "{link}");
            assert!(link.contains("mtu 1500"), "{link}");
            assert!(link.contains("state UP") || link.contains(",UP"), "{link}");
            let addr = ip_out(
                &pair.ns[side],
                &["-4", "addr", "show", "dev", &pair.ifname[side]],
            );
            assert!(addr.contains(&format!("{}/24", pair.ip[side])), "{addr}");
            let addr6 = ip_out(
                &pair.ns[side],
                &["-6", "addr", "show", "dev", &pair.ifname[side]],
            );
            assert!(addr6.trim().is_empty(), "IPv6 still on: {addr6}");
            // The peer's address, known for good: no ARP in a round trip.
            let neigh = ip_out(
                &pair.ns[side],
                &["neigh", "show", "dev", &pair.ifname[side]],
            );
            let peer = format!(
                "{} lladdr {}",
                pair.ip[1 - side],
                format_mac(&pair.mac[1 - side])
            );
            assert!(
                neigh.contains(&peer) && neigh.contains("PERMANENT"),
                "{neigh}"
            );
        }
        {
            let reg = REGISTRY.lock().unwrap();
            assert!(pair.ns.iter().all(|n| reg.contains(n)));
        }
        let ns = pair.ns.clone();
        drop(pair);
        let names = listed();
        for n in &ns {
            assert!(!names.contains(n), "{n} still listed after drop: {names:?}");
        }
        let reg = REGISTRY.lock().unwrap();
        assert!(ns.iter().all(|n| !reg.contains(n)));
    }

    #[test]
    fn enter_and_leave_move_the_thread() {
        let pair = VethPair::create(9000).expect("create veth pair");
        let ino = |p: &str| {
            std::fs::metadata(p)
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .unwrap()
        };
        let home = ino("/proc/thread-self/ns/net");
        std::thread::scope(|s| {
            s.spawn(|| {
                pair.enter(1).unwrap();
                assert_eq!(
                    ino("/proc/thread-self/ns/net"),
                    ino(&format!("{NETNS_DIR}/{}", pair.ns[1]))
                );
                // The peer's address answers from here: the link is up.
                let sock = std::net::UdpSocket::bind((pair.ip[1], 0)).expect("bind in ns 1");
                drop(sock);
                pair.leave().unwrap();
                assert_eq!(ino("/proc/thread-self/ns/net"), home);
            });
        });
        assert!(pair.enter(2).is_err());
    }

    /// An `ip` failure's hint names the fix: root for a user, capabilities
    /// for a root that lacks them (a container), the veth module.
    #[test]
    fn ip_failures_name_their_fix() {
        let denied = "mount --make-shared /run/netns failed: Operation not permitted";
        assert_eq!(hint_for(denied, false), format!(": {NEED_ROOT}"));
        assert!(hint_for(denied, true).contains("CAP_SYS_ADMIN"));
        assert!(hint_for(denied, true).contains("--privileged"));
        assert!(hint_for("Error: Unknown device type.", true).contains("modprobe veth"));
        assert_eq!(hint_for("RTNETLINK answers: File exists", true), "");
    }

    #[test]
    fn not_root_error_names_the_fix() {
        if !nix::unistd::geteuid().is_root() {
            assert_eq!(VethPair::create(1500).unwrap_err(), NEED_ROOT);
            panic!("{NEED_ROOT}");
        }
        // As root: run create_and_drop in a copy of this binary as user nobody.
        use std::os::unix::process::CommandExt;
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "netns::tests::create_and_drop",
                "--test-threads=1",
            ])
            .uid(65534)
            .gid(65534)
            .output()
            .expect("run the test binary as nobody");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !out.status.success(),
            "create_and_drop passed without root:\n{text}"
        );
        assert!(text.contains(NEED_ROOT), "no root hint in:\n{text}");
    }

    #[test]
    fn stale_names_parse() {
        assert_eq!(owner_pid("emxb-123-4-0"), Some((123, None)));
        assert_eq!(owner_pid("emxb-123-4-1"), Some((123, None)));
        assert_eq!(
            owner_pid("emxb-123-4-1-p4026531836"),
            Some((123, Some(4026531836)))
        );
        assert_eq!(owner_pid("emxb-123-4-1-4026531836"), None);
        assert_eq!(owner_pid("emxb-123-4-1-p"), None);
        assert_eq!(owner_pid("emxb-123-4-1-p7-0"), None);
        assert_eq!(owner_pid("emxb-123-4-2"), None);
        assert_eq!(owner_pid("emxb-123-0"), None);
        assert_eq!(owner_pid("other-123-4-0"), None);
        assert_eq!(owner_pid("emxb-x-4-0"), None);
    }

    /// A pid taken by a process that started after the namespace named for
    /// it was made is not its maker's; one that started before may be.
    #[test]
    fn a_pid_reused_since_the_namespace_was_made_is_not_its_owner() {
        let made = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert!(started_after(Some(1_000_002.0), made));
        assert!(!started_after(Some(1_000_000.5), made), "within the margin");
        assert!(!started_after(Some(999_990.0), made));
        assert!(!started_after(None, made));
        // This process started before now, to a tick.
        let me = started_at(std::process::id() as i32).unwrap();
        assert!(!started_after(Some(me), std::time::SystemTime::now()));
        assert!(started_after(
            Some(me),
            std::time::SystemTime::now() - Duration::from_secs(3600 * 24 * 365)
        ));
    }

    /// A live run's namespaces are kept: its process started before it
    /// made them.
    #[test]
    fn a_live_owners_namespace_is_kept() {
        if !nix::unistd::geteuid().is_root() {
            panic!("{NEED_ROOT}");
        }
        let mut child = Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let name = format!("{NS_PREFIX}{}-0-0-p{}", child.id(), pid_ns());
        ip(&["netns", "add", &name]).expect("make a namespace");
        remove_stale();
        let kept = namespace_exists(&name);
        delete_namespace(&name);
        let _ = child.kill();
        let _ = child.wait();
        assert!(kept, "a live owner's {name} was removed");
    }

    #[test]
    fn stale_namespace_of_dead_pid_is_removed() {
        if !nix::unistd::geteuid().is_root() {
            panic!("{NEED_ROOT}");
        }
        // Pids that are dead: a child that has exited and been reaped, and
        // one that has exited and is not reaped yet (a zombie).
        let mut child = Command::new("true").spawn().expect("spawn true");
        let dead = child.id();
        child.wait().unwrap();
        let mut zombie = Command::new("true").spawn().expect("spawn true");
        let t = Instant::now();
        let stat = format!("/proc/{}/stat", zombie.id());
        while !std::fs::read_to_string(&stat)
            .unwrap_or_default()
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
        {
            assert!(t.elapsed() < Duration::from_secs(5), "no zombie");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Named as this build names them, and as earlier builds did.
        let stale: Vec<String> = [dead, zombie.id()]
            .iter()
            .flat_map(|pid| {
                [
                    format!("{NS_PREFIX}{pid}-0-0-p{}", pid_ns()),
                    format!("{NS_PREFIX}{pid}-0-1"),
                ]
            })
            .collect();
        // A dead pid of another pid namespace means nothing here: its run
        // may be going on (in a container that shares /run/netns).
        let other = format!("{NS_PREFIX}{dead}-0-0-p{}", pid_ns() + 1);
        for ns in stale.iter().chain([&other]) {
            ip(&["netns", "add", ns]).expect("make a stale namespace");
            assert!(namespace_exists(ns));
        }
        let pair = VethPair::create(1500).expect("create veth pair");
        let left: Vec<&String> = stale.iter().filter(|ns| namespace_exists(ns)).collect();
        let kept = namespace_exists(&other);
        for ns in stale.iter().chain([&other]) {
            delete_namespace(ns);
        }
        drop(pair);
        zombie.wait().unwrap();
        assert!(left.is_empty(), "stale namespaces not removed: {left:?}");
        assert!(kept, "another pid namespace's {other} was removed");
    }

    /// Helper for [`another_pid_namespaces_run_leaves_ours_alone`], run in a
    /// pid namespace of its own: makes (and so sweeps) a pair.
    #[test]
    #[ignore = "helper process of another_pid_namespaces_run_leaves_ours_alone"]
    fn pair_in_own_pid_namespace_helper() {
        if std::env::var_os(HELPER_ENV).is_none() {
            return;
        }
        drop(VethPair::create(1500).expect("create veth pair"));
        tell_parent("EMXB-DONE");
    }

    /// A run in another pid namespace (a container sharing /run/netns) sees
    /// none of our pids: its sweep used to take our namespaces for a dead
    /// process's and delete them under us.
    #[test]
    fn another_pid_namespaces_run_leaves_ours_alone() {
        if !nix::unistd::geteuid().is_root() {
            panic!("{NEED_ROOT}");
        }
        let pair = VethPair::create(1500).expect("create veth pair");
        let out = Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc"])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "netns::tests::pair_in_own_pid_namespace_helper",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HELPER_ENV, "1")
            .output()
            .expect("run unshare");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("EMXB-DONE"), "the helper failed: {out:?}");
        let gone: Vec<&String> = pair.ns.iter().filter(|n| !namespace_exists(n)).collect();
        assert!(gone.is_empty(), "removed by the other run: {gone:?}");
    }

    /// A helper process's line to the test that runs it, straight to fd 1:
    /// the test harness captures `println!` even for a child.
    fn tell_parent(line: &str) {
        let mut out = std::io::stdout();
        std::io::Write::write_all(&mut out, format!("{line}\n").as_bytes()).unwrap();
        std::io::Write::flush(&mut out).unwrap();
    }

    /// Runs the ignored test `name` of this binary as a helper process, its
    /// stdout piped.
    fn helper(name: &str) -> std::process::Child {
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                &format!("netns::tests::{name}"),
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HELPER_ENV, "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("re-exec the test binary")
    }

    /// Helper for [`a_signal_while_pairs_are_made_leaves_nothing`], run in a
    /// child process: makes and removes pairs until signalled.
    #[test]
    #[ignore = "helper process of a_signal_while_pairs_are_made_leaves_nothing"]
    fn signal_setup_helper() {
        if std::env::var_os(HELPER_ENV).is_none() {
            return;
        }
        cleanup_on_signal();
        tell_parent("EMXB-READY");
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            // A pair that cannot be made ends the helper (exit 101, not the
            // signal's 143): it would leave nothing behind for nothing.
            drop(VethPair::create(1500).expect("create veth pair"));
        }
    }

    /// A signal that comes while a pair is being made (about 40 `ip` calls)
    /// leaves no namespace of the process behind: the cleanup waits for the
    /// command under way. It used to delete the registered names while an
    /// `ip netns add` of one of them was still running, which then made it.
    #[test]
    fn a_signal_while_pairs_are_made_leaves_nothing() {
        if !nix::unistd::geteuid().is_root() {
            panic!("{NEED_ROOT}");
        }
        for round in 0..24u64 {
            // Spread over a pair's making (each takes about 100 ms here).
            let delay_ms = 5 + round * 37 % 150;
            let mut child = helper("signal_setup_helper");
            let pid = child.id();
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            // (Its output ending first, a helper that exited without
            // starting, fails here: it spun for good.)
            loop {
                match lines.next() {
                    Some(Ok(l)) if l.contains("EMXB-READY") => break,
                    Some(Ok(_)) => {}
                    other => panic!("round {round}: the helper did not start: {other:?}"),
                }
            }
            std::thread::sleep(Duration::from_millis(delay_ms));
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
            let status = child.wait().unwrap();
            // An `ip` the helper ran outlives it: give one time to finish.
            std::thread::sleep(Duration::from_millis(100));
            let mine = format!("{NS_PREFIX}{pid}-");
            let left: Vec<String> = listed()
                .into_iter()
                .filter(|n| n.starts_with(&mine))
                .collect();
            for n in &left {
                delete_namespace(n);
            }
            assert!(left.is_empty(), "round {round}: left behind {left:?}");
            assert_eq!(status.code(), Some(143), "round {round}: {status:?}");
        }
    }

    /// Helper for [`signal_cleanup_removes_namespaces`], run in a child process:
    /// makes a pair, prints its namespaces and sleeps until signalled. Does
    /// nothing unless the environment variable selects it.
    #[test]
    #[ignore = "helper process of signal_cleanup_removes_namespaces"]
    fn signal_helper() {
        if std::env::var_os(HELPER_ENV).is_none() {
            return;
        }
        cleanup_on_signal();
        let pair = VethPair::create(1500).expect("create veth pair");
        tell_parent(&format!("EMXB-NS {} {}", pair.ns[0], pair.ns[1]));
        std::thread::sleep(Duration::from_secs(60));
        drop(pair);
    }

    #[test]
    fn signal_cleanup_removes_namespaces() {
        if !nix::unistd::geteuid().is_root() {
            panic!("{NEED_ROOT}");
        }
        let mut child = helper("signal_helper");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let names: Vec<String> = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    // libtest may print "test ... " before it on the same line.
                    if let Some(at) = line.find("EMXB-NS ") {
                        break line[at + 8..]
                            .split_whitespace()
                            .map(str::to_string)
                            .collect();
                    }
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("helper exited before printing its namespaces");
                }
            }
        };
        assert_eq!(names.len(), 2);
        let before = listed();
        for n in &names {
            assert!(before.contains(n), "{n} not listed while the helper runs");
        }
        // SAFETY: sending SIGINT to our own child.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                for n in &names {
                    delete_namespace(n);
                }
                panic!("helper did not exit within 20 s of SIGINT");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let after = listed();
        for n in &names {
            delete_namespace(n);
        }
        assert_eq!(status.code(), Some(130), "helper exit status {status:?}");
        for n in &names {
            assert!(
                !after.contains(n),
                "{n} still listed after SIGINT: {after:?}"
            );
        }
    }
}
