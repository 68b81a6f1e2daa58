//! The links the benchmark runs on: two sides (A, the pinger's, and B, the
//! echo's) joined by three channels, one for raw frames and one for each emx
//! engine. Where the link allows, each channel is a queue pair of its own.
//! The two sides are in this process, or with [`Link::side`] one in each of
//! two processes (`memif`, or `devargs` with `--role`).
//!
//! - `memif-pair`: two `net_memif` ports in this process, three queue pairs.
//! - `veth`: three veth pairs, each between two network namespaces this
//!   program makes (and removes, also when interrupted), with a
//!   `net_af_packet` (or `net_af_xdp`) port on each end, and a fourth pair
//!   with no port, for the kernel baselines. The calling thread enters a
//!   namespace just while it opens the port there: the port's socket stays
//!   in it.
//! - `devargs`: any port DPDK can probe (a NIC by PCI address, or a virtual
//!   device's devargs), with one queue pair. A NIC spreads frames over its
//!   queues by their IP headers, and emx frames have none: every frame comes
//!   in on queue 0. So the three channels are one queue pair, *shared*: the
//!   session opens one transport at a time on it (see [`Link::shared`]).

use std::time::Duration;

use dpdk_ffi::{Eal, Mempool, Port, PortConfig, MEMIF_MAX_MTU};

use crate::netns::VethPair;

/// Which link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkKind {
    /// Two memif ports in this process (shared memory; no NIC, no hugepages needed).
    MemifPair,
    /// Veth pairs between network namespaces, over `net_af_packet` (needs root).
    Veth,
    /// A memif link between two processes: one runs `--role server`, the
    /// other `--role client`.
    Memif,
    /// Ports given by EAL devargs (`--devargs`): a NIC by PCI address, or
    /// any virtual device. Two in this process, or one per process with `--role`.
    Devargs,
}

impl LinkKind {
    /// The MTU a link runs at unless `--mtu` says otherwise. memif is shared
    /// memory with no wire and no MTU of its own: it runs jumbo frames
    /// ([`MEMIF_MAX_MTU`]), which halve the per-frame work of every transport
    /// on 1 MiB streams. The others keep Ethernet's 1500, which every NIC and
    /// veth takes.
    pub fn default_mtu(self) -> u16 {
        match self {
            LinkKind::MemifPair | LinkKind::Memif => MEMIF_MAX_MTU,
            LinkKind::Veth | LinkKind::Devargs => 1500,
        }
    }
}

/// What one process's side of a two-process link is.
#[derive(Clone, Debug)]
pub enum SideSpec {
    /// A memif port on this socket, with three queue pairs.
    Memif(String),
    /// A port from these devargs, with one queue pair.
    Devargs(String),
}

impl SideSpec {
    /// The devargs the EAL must know of at start (a NIC's).
    pub fn devargs(&self) -> Vec<&str> {
        match self {
            SideSpec::Memif(_) => Vec::new(),
            SideSpec::Devargs(d) => vec![d.as_str()],
        }
    }
}

/// One side of a channel: a port and its queue.
#[derive(Clone)]
pub struct End {
    /// The port.
    pub port: Port,
    /// The queue pair on it.
    pub queue: u16,
}

/// A channel: the pinger's end and the echo's end.
#[derive(Clone)]
pub struct Channel {
    /// The pinger's side.
    pub a: End,
    /// The echo's side.
    pub b: End,
}

/// Channels.
pub const RAW: usize = 0;
/// The channel of emx with inline progress.
pub const EMX_INLINE: usize = 1;
/// The channel of emx with a polling thread.
pub const EMX_THREAD: usize = 2;
/// The veth pair of the kernel baselines (after the channels' pairs).
pub const KERNEL: usize = 3;

/// An open link.
pub struct Link {
    /// What it is, in words.
    pub name: String,
    /// The channels, indexed by [`RAW`], [`EMX_INLINE`], [`EMX_THREAD`].
    pub channels: Vec<Channel>,
    /// The namespaces of a veth link (removed when dropped, after the
    /// ports): one pair per channel, then the kernel baselines' ([`KERNEL`]).
    pub veth: Vec<VethPair>,
    /// The frame payload limit.
    pub mtu: u16,
    /// Whether the channels are one queue pair that only one transport at a
    /// time may hold.
    pub shared: bool,
}

impl Link {
    /// Opens a link of `kind` in this process with frames of up to `mtu`
    /// bytes of payload: `pmd` is the veth link's driver, `devargs` the
    /// devargs link's two ports.
    pub fn open(
        kind: LinkKind,
        eal: &Eal,
        pool: &Mempool,
        mtu: u16,
        pmd: VethPmd,
        devargs: &[String],
    ) -> Result<Link, String> {
        match (kind, devargs) {
            (LinkKind::MemifPair, _) => memif_pair(eal, pool, mtu),
            (LinkKind::Veth, _) => veth(eal, pool, mtu, pmd),
            (LinkKind::Memif, _) => Err("the memif link joins two processes: run one with --role server and the other with --role client".into()),
            (LinkKind::Devargs, [a, b]) => Self::devargs_pair(eal, pool, mtu, a, b),
            (LinkKind::Devargs, _) => Err("the devargs link in one process needs two ports, joined outside it: give --devargs twice (or once per process with --role)".into()),
        }
    }

    /// Two ports from EAL devargs in this process, joined outside it (a
    /// cable between two NIC ports, or two virtual devices that meet).
    fn devargs_pair(eal: &Eal, pool: &Mempool, mtu: u16, a: &str, b: &str) -> Result<Link, String> {
        let name = |d: &str| d.split(',').next().unwrap_or_default().trim().to_owned();
        if name(a) == name(b) {
            return Err(format!(
                "both --devargs name the device `{}`: each port needs a name of its own \
                 (net_memif0 and net_memif1, say; or two PCI addresses)",
                name(a)
            ));
        }
        let a = devargs_port(eal, pool, mtu, a)?;
        let b = devargs_port(eal, pool, mtu, b)?;
        for p in [&a, &b] {
            p.wait_link(Duration::from_secs(10))
                .map_err(|e| e.to_string())?;
        }
        joined(pool, &a, &b)?;
        joined(pool, &b, &a)?;
        let ch = Channel {
            a: End { port: a, queue: 0 },
            b: End { port: b, queue: 0 },
        };
        Ok(Link {
            name: format!(
                "{} to {}, one queue pair",
                ch.a.port.name(),
                ch.b.port.name()
            ),
            channels: vec![ch.clone(), ch.clone(), ch],
            veth: Vec::new(),
            mtu,
            shared: true,
        })
    }

    /// This process's side of a link to another process: one port whose
    /// queue pairs are both ends of each channel (the other side's are
    /// remote). `server`: the side that waits for the other.
    pub fn side(
        eal: &Eal,
        pool: &Mempool,
        mtu: u16,
        spec: &SideSpec,
        server: bool,
    ) -> Result<Link, String> {
        match spec {
            SideSpec::Memif(socket) => Self::memif_side(eal, pool, mtu, socket, server),
            SideSpec::Devargs(devargs) => {
                let port = devargs_port(eal, pool, mtu, devargs)?;
                let end = End { port, queue: 0 };
                let ch = Channel {
                    a: end.clone(),
                    b: end,
                };
                Ok(Link {
                    name: format!("{}, one queue pair, two processes", ch.a.port.name()),
                    channels: vec![ch.clone(), ch.clone(), ch],
                    veth: Vec::new(),
                    mtu,
                    shared: true,
                })
            }
        }
    }

    /// This process's side of a memif link to another process: one port
    /// (the memif server or client on `socket`) with three queue pairs. Both
    /// ends of each channel are this port; the other side's are remote.
    fn memif_side(
        eal: &Eal,
        pool: &Mempool,
        mtu: u16,
        socket: &str,
        server: bool,
    ) -> Result<Link, String> {
        if server {
            if memif_bound(socket) {
                return Err(format!(
                    "a memif server already listens on {socket}: stop it, or give this one \
                     another --socket (and its clients the same)"
                ));
            }
            // A stale socket file from a killed run would refuse the bind.
            // Only a socket: a file given as --socket by mistake is refused,
            // not removed (as root, any file at that path went).
            match std::fs::symlink_metadata(socket) {
                Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
                    let _ = std::fs::remove_file(socket);
                }
                Ok(_) => {
                    return Err(format!(
                        "--socket {socket} is a file that is no socket: give the memif socket \
                         another path"
                    ))
                }
                Err(_) => {}
            }
        } else {
            // The server may still be starting.
            let t = std::time::Instant::now();
            while !dpdk_ffi::memif_listening(socket) {
                if t.elapsed() > Duration::from_secs(10) {
                    return Err(format!(
                        "no memif server at {socket}: start `emx-bench --link memif --role server --socket {socket}` first"
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let role = if server { "server" } else { "client" };
        let port = memif_port(eal, pool, mtu, 0, role, socket)?;
        let channels = (0..3)
            .map(|q| {
                let end = End {
                    port: port.clone(),
                    queue: q,
                };
                Channel {
                    a: end.clone(),
                    b: end,
                }
            })
            .collect();
        Ok(Link {
            name: format!("memif between two processes ({role} side)"),
            channels,
            veth: Vec::new(),
            mtu,
            shared: false,
        })
    }
}

/// Whether a process has a Unix socket bound at `socket`, as a file or in
/// the abstract namespace (`/proc/net/unix` lists both; a file left by a
/// killed server is not listed).
fn memif_bound(socket: &str) -> bool {
    let abstract_name = format!("@{socket}");
    std::fs::read_to_string("/proc/net/unix").is_ok_and(|t| {
        t.lines().any(|l| {
            l.split_whitespace()
                .nth(7)
                .is_some_and(|p| p == socket || p == abstract_name)
        })
    })
}

/// A memif port with three queue pairs, sized for frames of `mtu` (dpdk-ffi
/// gives memif ring buffers that hold a whole frame).
fn memif_port(
    eal: &Eal,
    pool: &Mempool,
    mtu: u16,
    n: u8,
    role: &str,
    sock: &str,
) -> Result<Port, String> {
    let cfg = PortConfig {
        rx_queues: 3,
        tx_queues: 3,
        mtu: Some(mtu),
        ..PortConfig::default()
    };
    Port::from_devargs(
        eal,
        &format!("net_memif{n},role={role},socket={sock}"),
        &cfg,
        pool,
    )
    .map_err(|e| e.to_string())
}

/// A port from EAL devargs with one queue pair, sized for frames of `mtu`.
fn devargs_port(eal: &Eal, pool: &Mempool, mtu: u16, devargs: &str) -> Result<Port, String> {
    let cfg = PortConfig {
        mtu: Some(mtu),
        ..PortConfig::default()
    };
    // (dpdk-ffi says what to do about a PCI device that will not probe.)
    Port::from_devargs(eal, devargs, &cfg, pool).map_err(port_error)
}

/// A port's error, with the option that sets what it refused.
fn port_error(e: dpdk_ffi::Error) -> String {
    match e {
        dpdk_ffi::Error::MtuTooLarge { max_mtu, .. } => format!("{e}: give --mtu {max_mtu}"),
        e => e.to_string(),
    }
}

fn memif_pair(eal: &Eal, pool: &Mempool, mtu: u16) -> Result<Link, String> {
    let sock = format!("/tmp/emx-bench-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let port = |role: &str, n: u8| memif_port(eal, pool, mtu, n, role, &sock);
    let a = port("server", 0)?;
    let b = port("client", 1)?;
    for p in [&a, &b] {
        p.wait_link(Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
    }
    let channels = (0..3)
        .map(|q| Channel {
            a: End {
                port: a.clone(),
                queue: q,
            },
            b: End {
                port: b.clone(),
                queue: q,
            },
        })
        .collect();
    Ok(Link {
        name: "memif pair, one process".into(),
        channels,
        veth: Vec::new(),
        mtu,
        shared: false,
    })
}

/// The DPDK driver of the veth link's ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum VethPmd {
    /// `net_af_packet`: a packet socket per port.
    AfPacket,
    /// `net_af_xdp`: an AF_XDP socket per port (generic XDP on a veth).
    AfXdp,
}

fn veth(eal: &Eal, pool: &Mempool, mtu: u16, pmd: VethPmd) -> Result<Link, String> {
    crate::netns::cleanup_on_signal();
    let cfg = PortConfig {
        mtu: Some(mtu),
        ..PortConfig::default()
    };
    let mut pairs = Vec::new();
    let mut channels = Vec::new();
    for c in 0..3 {
        let pair = VethPair::create(mtu)?;
        let mut ends = Vec::new();
        for side in 0..2 {
            pair.enter(side)?;
            let devargs = match pmd {
                VethPmd::AfPacket => format!(
                    "net_af_packet{},iface={},qpairs=1",
                    2 * c + side,
                    pair.ifname[side]
                ),
                VethPmd::AfXdp => format!(
                    "net_af_xdp{},iface={},start_queue=0,queue_count=1",
                    2 * c + side,
                    pair.ifname[side]
                ),
            };
            let port = Port::from_devargs(eal, &devargs, &cfg, pool);
            pair.leave()?;
            let port = port.map_err(port_error)?;
            port.wait_link(Duration::from_secs(10))
                .map_err(|e| e.to_string())?;
            ends.push(End { port, queue: 0 });
        }
        let b = ends.pop().expect("two ends");
        let a = ends.pop().expect("two ends");
        channels.push(Channel { a, b });
        pairs.push(pair);
    }
    // The kernel baselines get a pair no DPDK port is on. On a channel's
    // pair, an af_packet port's socket would take a copy of every datagram
    // (the kernel's work, on the baseline's clock), and an AF_XDP port
    // takes the frames from the kernel altogether.
    pairs.push(VethPair::create(mtu)?);
    Ok(Link {
        name: match pmd {
            VethPmd::AfPacket => "veth pairs between namespaces, net_af_packet".into(),
            VethPmd::AfXdp => "veth pairs between namespaces, net_af_xdp".into(),
        },
        channels,
        veth: pairs,
        mtu,
        shared: false,
    })
}

/// Checks that a frame `from` sends reaches `to`: two ports that do not meet
/// (net_ring ports, which loop back to themselves; two NIC ports with no
/// cable between them) would leave every measurement waiting for ever.
fn joined(pool: &Mempool, from: &Port, to: &Port) -> Result<(), String> {
    use dpdk_ffi::{Burst, Mbuf};
    /// IEEE's local experimental EtherType 2, as raw frames; a stray probe
    /// is drained below, before any transport runs.
    const PROBE_ETHERTYPE: u16 = 0x88B6;
    const MARK: &[u8] = b"emx-bench link probe";
    let (mut tx, mut rx) = (
        from.tx_queue(0).map_err(|e| e.to_string())?,
        to.rx_queue(0).map_err(|e| e.to_string())?,
    );
    let nonce = std::process::id().to_be_bytes();
    let probe = || -> Result<Mbuf, String> {
        let mut m = Mbuf::alloc(pool).map_err(|e| e.to_string())?;
        let f = m.append(60).map_err(|e| e.to_string())?;
        f.fill(0);
        f[..6].copy_from_slice(&to.mac());
        f[6..12].copy_from_slice(&from.mac());
        f[12..14].copy_from_slice(&PROBE_ETHERTYPE.to_be_bytes());
        f[14..14 + MARK.len()].copy_from_slice(MARK);
        f[14 + MARK.len()..18 + MARK.len()].copy_from_slice(&nonce);
        Ok(m)
    };
    let is_probe = |d: &[u8]| {
        d.len() >= 18 + MARK.len()
            && d[12..14] == PROBE_ETHERTYPE.to_be_bytes()
            && &d[14..14 + MARK.len()] == MARK
            && d[14 + MARK.len()..18 + MARK.len()] == nonce
    };
    let mut burst: Burst = Burst::new();
    let start = std::time::Instant::now();
    let mut sent_at = None::<std::time::Instant>;
    let mut arrived = None::<std::time::Instant>;
    // Until it came, and 50 ms more to take any copy sent again.
    while arrived.is_none_or(|t| t.elapsed() < Duration::from_millis(50)) {
        // (A probe that came just before the deadline still gets its 50 ms.)
        if arrived.is_none() && start.elapsed() > Duration::from_secs(2) {
            // Did they come back to the sender? (And its pool gets them back.)
            let mut back = false;
            if let Ok(mut own) = from.rx_queue(0) {
                own.rx_burst(&mut burst);
                back = burst.drain().any(|m| is_probe(m.data()));
            }
            return Err(format!(
                "no frame sent by {} reached {} within 2 s{}: the two --devargs ports must be \
                 joined (a cable between two NIC ports, or two virtual devices that meet, such \
                 as a memif server and client on one socket; net_ring ports loop back to \
                 themselves)",
                from.name(),
                to.name(),
                if back {
                    " (they came back to the port that sent them)"
                } else {
                    ""
                }
            ));
        }
        if arrived.is_none() && sent_at.is_none_or(|t| t.elapsed() > Duration::from_millis(200)) {
            // (A link just up may drop the first.)
            let _ = tx.tx_one(probe()?);
            sent_at = Some(std::time::Instant::now());
        }
        rx.rx_burst(&mut burst);
        for m in burst.drain() {
            if is_probe(m.data()) {
                arrived.get_or_insert_with(std::time::Instant::now);
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}
