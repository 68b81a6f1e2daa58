//! The Environment Abstraction Layer: started once per process, cleaned up when
//! the last handle to it goes.

use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::error::{Errno, Error, Result};
use crate::sys;

const NOT_STARTED: u8 = 0;
const RUNNING: u8 = 1;
const FAILED: u8 = 2;
const STOPPED: u8 = 3;
static STATE: AtomicU8 = AtomicU8::new(NOT_STARTED);

/// Whether the EAL runs on hugepages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HugepageMode {
    /// Hugepages when enough are free and hugetlbfs is mounted; otherwise
    /// ordinary pages (`--no-huge`). The default.
    #[default]
    Auto,
    /// Hugepages or an error that says how to reserve them.
    Require,
    /// Ordinary pages (`--no-huge -m <memory> --no-shconf`).
    Never,
}

/// A handle to the running EAL. Clones share it; the EAL is cleaned up
/// (`rte_eal_cleanup`) when the last clone, and every mempool, port and memory
/// region made from it, is gone.
#[derive(Clone)]
pub struct Eal(Arc<EalInner>);

struct EalInner {
    hugepages: bool,
    args: Vec<String>,
}

impl std::fmt::Debug for Eal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Eal")
            .field("hugepages", &self.0.hugepages)
            .field("args", &self.0.args)
            .finish()
    }
}

/// Builds the EAL's argument list. Every option has a default that works on a
/// machine with no NIC and no hugepages.
#[derive(Clone, Debug)]
pub struct EalBuilder {
    file_prefix: Option<String>,
    hugepages: HugepageMode,
    memory_mb: u32,
    vdevs: Vec<String>,
    pci: Vec<String>,
    log_level: u32,
    extra: Vec<String>,
}

impl Default for EalBuilder {
    fn default() -> Self {
        EalBuilder {
            file_prefix: None,
            hugepages: HugepageMode::Auto,
            memory_mb: 512,
            vdevs: Vec::new(),
            pci: Vec::new(),
            log_level: 5,
            extra: Vec::new(),
        }
    }
}

impl EalBuilder {
    /// `--file-prefix`; the default, `emx-<pid>`, keeps processes apart.
    pub fn file_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.file_prefix = Some(prefix.into());
        self
    }

    /// Hugepages or not ([`HugepageMode::Auto`] by default).
    pub fn hugepages(mut self, mode: HugepageMode) -> Self {
        self.hugepages = mode;
        self
    }

    /// Memory in MiB: preallocated without hugepages, and the amount of free
    /// hugepage memory `Auto` looks for. Default 512.
    pub fn memory_mb(mut self, mb: u32) -> Self {
        self.memory_mb = mb;
        self
    }

    /// A virtual device to create at start (`--vdev=<devargs>`). Devices can
    /// also be added later with [`Port::from_devargs`](crate::Port::from_devargs).
    pub fn vdev(mut self, devargs: impl Into<String>) -> Self {
        self.vdevs.push(devargs.into());
        self
    }

    /// A PCI device to use (`-a <addr>[,args]`). Without any (here or as an
    /// allow or block option in [`arg`](Self::arg)), the PCI bus is not
    /// scanned (`--no-pci`).
    pub fn pci(mut self, addr: impl Into<String>) -> Self {
        self.pci.push(addr.into());
        self
    }

    /// Whatever the EAL must know at start for a port to be opened later with
    /// [`Port::from_devargs`](crate::Port::from_devargs)`(devargs)`: a NIC (a
    /// PCI address, with or without arguments) must be allowed on the PCI
    /// bus, which is otherwise not scanned; a virtual device needs nothing.
    pub fn port(self, devargs: &str) -> Self {
        if is_pci_address(devargs.split(',').next().unwrap_or("")) {
            self.pci(devargs)
        } else {
            self
        }
    }

    /// DPDK's global log level (1 emergency .. 8 debug). Default 5 (warning).
    pub fn log_level(mut self, level: u32) -> Self {
        self.log_level = level;
        self
    }

    /// Any further EAL argument, passed as is (for example `--lcores=...`).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra.push(arg.into());
        self
    }

    /// The argument list [`init`](Self::init) will pass, after the hugepage
    /// choice is made.
    pub fn args(&self) -> Result<(Vec<String>, bool)> {
        let mut args = vec!["emx".to_string()];
        let prefix = self
            .file_prefix
            .clone()
            .unwrap_or_else(|| format!("emx-{}", std::process::id()));
        args.push(format!("--file-prefix={prefix}"));
        let huge = match self.hugepages {
            HugepageMode::Never => false,
            HugepageMode::Auto => hugepages_usable(self.memory_mb).is_ok(),
            HugepageMode::Require => {
                hugepages_usable(self.memory_mb).map_err(Error::NoHugepages)?;
                true
            }
        };
        if huge {
            args.push("--in-memory".into());
        } else {
            args.extend([
                "--no-huge".into(),
                format!("-m{}", self.memory_mb),
                "--no-shconf".into(),
            ]);
        }
        // One lcore (the main thread), allowed on every CPU this process may use:
        // a plain `-l 0` would pin the main thread, and every thread it spawns
        // afterwards, to CPU 0. Polling threads register themselves and pin
        // themselves.
        if !self
            .extra
            .iter()
            .any(|a| a.starts_with("-l") || a.starts_with("--lcores"))
        {
            args.push(format!("--lcores=0@({})", allowed_cpus()));
        }
        args.push("--no-telemetry".into());
        args.push(format!("--log-level={}", self.log_level));
        // PCI devices named in the extra arguments count as much as those
        // given with `pci`: `--no-pci` would make the EAL skip the bus scan,
        // and their probe fail with "no such device".
        let pci_named = self.extra.iter().any(|a| {
            [
                "-a",
                "-b",
                "-w",
                "--allow",
                "--block",
                "--pci-whitelist",
                "--pci-blacklist",
            ]
            .iter()
            .any(|o| a.starts_with(o))
        });
        if self.pci.is_empty() && !pci_named {
            args.push("--no-pci".into());
        }
        args.extend(self.pci.iter().map(|p| format!("-a{p}")));
        args.extend(self.vdevs.iter().map(|v| format!("--vdev={v}")));
        // A device allowed both ways (a cluster file's eal_args and its port)
        // is allowed once, with the port's arguments.
        let dev = |p: &str| {
            let d = p.split(',').next().unwrap_or("");
            pci_canonical(d).unwrap_or_else(|| d.to_string())
        };
        let ours: Vec<String> = self.pci.iter().map(|p| dev(p)).collect();
        let mut extra = self.extra.iter().peekable();
        while let Some(a) = extra.next() {
            let value = match a.as_str() {
                "-a" | "--allow" => extra.peek().map(|v| v.as_str()),
                _ => a.strip_prefix("--allow=").or_else(|| a.strip_prefix("-a")),
            };
            if value.is_some_and(|v| ours.contains(&dev(v))) {
                if a == "-a" || a == "--allow" {
                    extra.next();
                }
                continue;
            }
            args.push(a.clone());
        }
        Ok((args, huge))
    }

    /// Starts the EAL. Fails with [`Error::EalAlreadyStarted`] when it has
    /// been started (or a start was tried) in this process before.
    pub fn init(self) -> Result<Eal> {
        let (args, huge) = self.args()?;
        Eal::init_args(args, huge, true)
    }
}

impl Eal {
    /// A builder with defaults that need no NIC and no hugepages.
    pub fn builder() -> EalBuilder {
        EalBuilder::default()
    }

    /// Starts the EAL with a raw argument list (`args[0]` is the program
    /// name). Prefer [`Eal::builder`].
    pub fn init<I, S>(args: I) -> Result<Eal>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let args: Vec<String> = args.into_iter().map(Into::into).collect();
        let huge = !args.iter().any(|a| a == "--no-huge");
        Self::init_args(args, huge, false)
    }

    /// Starts the EAL; `filter_logs`: leave out the warnings that the
    /// builder's options make certain (see `log.rs`).
    fn init_args(args: Vec<String>, hugepages: bool, filter_logs: bool) -> Result<Eal> {
        let cargs = args
            .iter()
            .map(|a| {
                CString::new(a.as_str()).map_err(|_| Error::EalArgument {
                    arg: a.clone(),
                    why: "it contains a NUL byte",
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if let Err(state) =
            STATE.compare_exchange(NOT_STARTED, RUNNING, Ordering::AcqRel, Ordering::Acquire)
        {
            return Err(Error::EalAlreadyStarted(match state {
                RUNNING => "started",
                FAILED => "started once (and that start failed)",
                _ => "started and stopped",
            }));
        }
        if filter_logs {
            crate::log::filter();
        }
        // The EAL keeps pointers into argv for the life of the process, and may
        // permute the array: both the strings and the array are leaked.
        let argv: &'static mut [*mut c_char] = Box::leak(
            cargs
                .into_iter()
                .map(CString::into_raw)
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        );
        // SAFETY: argv holds argc valid NUL-terminated strings that live for the
        // rest of the process; STATE guarantees this is the only call.
        let ret = unsafe { sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
        if ret < 0 {
            STATE.store(FAILED, Ordering::Release);
            let errno = Errno::last();
            let hint = match errno.0 {
                libc::EALREADY => " (the EAL was started by other code in this process)",
                libc::EACCES => " (permission denied: run as root, or use --no-huge and a writable --file-prefix)",
                libc::ENOMEM => " (not enough memory: reserve hugepages, or lower -m)",
                libc::ENOTSUP | libc::ENODEV => " (a device in the arguments could not be probed: check --vdev and -a)",
                libc::EINVAL => " (an argument was not understood: see the EAL's message above)",
                _ => "",
            };
            return Err(Error::EalInit { errno, hint });
        }
        // SAFETY: takes no arguments and only swaps the print callbacks of
        // libraries the EAL's drivers loaded; nothing else runs in them yet.
        unsafe { sys::emx_quiet_bpf_logs() };
        Ok(Eal(Arc::new(EalInner { hugepages, args })))
    }

    /// True when the EAL runs on hugepages, false with `--no-huge`.
    pub fn uses_hugepages(&self) -> bool {
        self.0.hugepages
    }

    /// The arguments the EAL was started with.
    pub fn args(&self) -> &[String] {
        &self.0.args
    }

    /// True when DMA addresses are virtual addresses (IOVA as VA).
    pub fn iova_is_va(&self) -> bool {
        // SAFETY: the EAL is running; a plain query.
        unsafe { sys::rte_eal_iova_mode() == sys::RTE_IOVA_VA }
    }

    /// Whether the EAL is running in this process.
    pub fn is_running() -> bool {
        STATE.load(Ordering::Acquire) == RUNNING
    }
}

impl Drop for EalInner {
    fn drop(&mut self) {
        // Pools dropped with mbufs out, or while a put was in progress, are
        // freed now, or the memory stays: those mbufs, or the puts, may still
        // be read.
        let waiting = crate::mempool::reclaim(1_000);
        if waiting > 0 {
            // (Pools that wait only for what AF_XDP ports kept are not the
            // application's doing: said nothing of.)
            let unexplained = crate::mempool::waiting_unexplained();
            if unexplained > 0 {
                eprintln!(
                    "dpdk-ffi: {unexplained} dropped mempool(s) could not be freed (mbufs still \
                     out, or a burst or free still running); DPDK's memory stays mapped until \
                     the process exits"
                );
            }
            STATE.store(STOPPED, Ordering::Release);
            return;
        }
        // DPDK 22.11's rte_eal_cleanup unmaps memory that its interrupt
        // thread, still running, reads when it wakes (cleanup itself wakes
        // it): park that thread for good first (see the C shim). It has then
        // finished every handler it started, with the unregistrations that
        // drivers such as memif leave pending. Devices still on the EAL's
        // buses (a NIC no Port closed) are closed by cleanup with the thread
        // parked: a driver that waits for its interrupt handler there waits
        // out its own timeout.
        let control = crate::control::control();
        // SAFETY: the EAL is running; callers take turns under the control lock.
        let parked = unsafe { sys::emx_intr_stop(crate::control::INTERRUPT_WAIT_MS) };
        drop(control);
        if parked != 0 {
            // The thread is stuck, or this is it: leave the memory mapped.
            eprintln!(
                "dpdk-ffi: warning: the EAL interrupt thread could not be stopped ({}); DPDK's \
                 memory stays mapped until the process exits",
                crate::control::interrupt_wait_error(parked)
            );
            STATE.store(STOPPED, Ordering::Release);
            return;
        }
        // SAFETY: this is the last handle: every port, mempool and region holds
        // one, so all of them are closed and freed by now.
        unsafe { sys::rte_eal_cleanup() };
        STATE.store(STOPPED, Ordering::Release);
    }
}

/// Ok when hugetlbfs is mounted and at least `memory_mb` of 2 MiB (or larger)
/// hugepages are free; otherwise why not.
pub(crate) fn hugepages_usable(memory_mb: u32) -> std::result::Result<(), String> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if !mounts
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("hugetlbfs"))
    {
        return Err("no hugetlbfs is mounted".into());
    }
    let free_kb = free_hugepage_kb(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default());
    if free_kb == 0 {
        return Err("no hugepages are reserved or free".into());
    }
    if free_kb < u64::from(memory_mb) * 1024 {
        return Err(format!(
            "{} MiB of hugepages are free, fewer than the {memory_mb} MiB asked for",
            free_kb / 1024
        ));
    }
    Ok(())
}

/// Hugepage memory free for the taking, in KiB, from `/proc/meminfo`: free
/// pages less those other mappings have reserved but not touched yet (they
/// count as free until touched, and are not ours to take).
fn free_hugepage_kb(meminfo: &str) -> u64 {
    let field = |name: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    field("HugePages_Free:").saturating_sub(field("HugePages_Rsvd:")) * field("Hugepagesize:")
}

/// The CPUs this process may run on, as an EAL cpuset list ("0,1,3").
fn allowed_cpus() -> String {
    let mut cpus = Vec::new();
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            for cpu in 0..libc::CPU_SETSIZE as usize {
                if libc::CPU_ISSET(cpu, &set) {
                    cpus.push(cpu.to_string());
                }
            }
        }
    }
    if cpus.is_empty() {
        "0".into()
    } else {
        cpus.join(",")
    }
}

/// Whether `s` is a PCI address, `[DDDD:]BB:DD.F` in hex (no arguments).
pub fn is_pci_address(s: &str) -> bool {
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
    let Some((rest, func)) = s.rsplit_once('.') else {
        return false;
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let (domain, bus, dev) = match parts[..] {
        [d, b, v] => (Some(d), b, v),
        [b, v] => (None, b, v),
        _ => return false,
    };
    domain.is_none_or(|d| hex(d, 4))
        && hex(bus, 2)
        && hex(dev, 2)
        && func.len() == 1
        && func.bytes().all(|b| (b'0'..=b'7').contains(&b))
}

/// A PCI address as DPDK names the device and its port: with the domain
/// (`0000:` when left out) and in lower case. `None` for anything else.
///
/// ```
/// assert_eq!(dpdk_ffi::pci_canonical("03:00.0").as_deref(), Some("0000:03:00.0"));
/// assert_eq!(dpdk_ffi::pci_canonical("0000:AF:00.1").as_deref(), Some("0000:af:00.1"));
/// assert_eq!(dpdk_ffi::pci_canonical("net_null0"), None);
/// ```
pub fn pci_canonical(s: &str) -> Option<String> {
    if !is_pci_address(s) {
        return None;
    }
    let s = s.to_ascii_lowercase();
    Some(match s.matches(':').count() {
        1 => format!("0000:{s}"),
        _ => s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(b: EalBuilder) -> Vec<String> {
        b.hugepages(HugepageMode::Never).args().unwrap().0
    }

    /// Pages reserved by other mappings are not free for us.
    #[test]
    fn reserved_hugepages_are_not_free() {
        let info = "HugePages_Total:     512\nHugePages_Free:      256\nHugePages_Rsvd:      \
                    200\nHugepagesize:       2048 kB\n";
        assert_eq!(free_hugepage_kb(info), 56 * 2048);
        assert_eq!(
            free_hugepage_kb("HugePages_Free: 3\nHugepagesize: 2048 kB\n"),
            3 * 2048
        );
        assert_eq!(free_hugepage_kb(""), 0);
    }

    #[test]
    fn pci_addresses() {
        for ok in ["0000:03:00.0", "03:00.1", "0000:af:1f.7"] {
            assert!(is_pci_address(ok), "{ok}");
        }
        for bad in [
            "0000:03:00",
            "03.00.0",
            "0000:03:00.8",
            "zz:00.0",
            "net_tap0",
        ] {
            assert!(!is_pci_address(bad), "{bad}");
        }
    }

    /// A NIC is allowed on the PCI bus, which is scanned; virtual devices
    /// leave it unscanned. `--no-pci` used to be passed whenever `pci` was
    /// not called, even with `-a ADDR` among the extra arguments (as a
    /// cluster file's `eal_args` give it), so no NIC could ever be opened.
    #[test]
    fn the_pci_bus_is_scanned_for_a_nic() {
        let nic = args(Eal::builder().port("0000:af:00.0,rxq_cqe_comp_en=0"));
        assert!(
            nic.iter().any(|a| a == "-a0000:af:00.0,rxq_cqe_comp_en=0"),
            "{nic:?}"
        );
        assert!(!nic.iter().any(|a| a == "--no-pci"), "{nic:?}");
        let named = args(Eal::builder().arg("-a").arg("0000:af:00.0"));
        assert!(!named.iter().any(|a| a == "--no-pci"), "{named:?}");
        // Named both ways (a cluster file's eal_args and its port): once,
        // with the port's arguments.
        let both = args(
            Eal::builder()
                .port("0000:af:00.0,x=1")
                .arg("-a")
                .arg("0000:af:00.0")
                .arg("--allow=0000:af:00.0"),
        );
        let named: Vec<&String> = both.iter().filter(|a| a.contains("0000:af:00.0")).collect();
        assert_eq!(named, ["-a0000:af:00.0,x=1"], "{both:?}");
        // However the address is written.
        let spelt = args(Eal::builder().port("AF:00.0,x=1").arg("-a0000:af:00.0"));
        let named: Vec<&String> = spelt.iter().filter(|a| a.starts_with("-a")).collect();
        assert_eq!(named, ["-aAF:00.0,x=1"], "{spelt:?}");
        let vdev = args(Eal::builder().port("net_memif0,role=server"));
        assert!(vdev.iter().any(|a| a == "--no-pci"), "{vdev:?}");
        assert!(!vdev.iter().any(|a| a.starts_with("-a")), "{vdev:?}");
    }
}
