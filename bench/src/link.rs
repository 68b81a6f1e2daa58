//! The links the benchmark runs on, all inside one process: two sides (A,
//! the pinger's, and B, the echo's) joined by three independent channels, so
//! that raw frames and each emx engine have a queue pair to themselves.
//!
//! - `memif-pair`: two `net_memif` ports in this process, three queue pairs.
//! - `veth`: three veth pairs, each between two network namespaces this
//!   program makes (and removes, also when interrupted), with a
//!   `net_af_packet` port on each end. The calling thread enters a namespace
//!   just while it opens the port there: the port's socket stays in it.

use std::time::Duration;

use dpdk_ffi::{Eal, Mempool, Port, PortConfig};

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

/// An open link.
pub struct Link {
    /// What it is, in words.
    pub name: String,
    /// The channels, indexed by [`RAW`], [`EMX_INLINE`], [`EMX_THREAD`].
    pub channels: Vec<Channel>,
    /// The namespaces of a veth link (removed when dropped, after the ports).
    pub veth: Vec<VethPair>,
    /// The frame payload limit.
    pub mtu: u16,
}

impl Link {
    /// Opens a link of `kind` with frames of up to `mtu` bytes of payload.
    pub fn open(
        kind: LinkKind,
        eal: &Eal,
        pool: &Mempool,
        mtu: u16,
        pmd: VethPmd,
    ) -> Result<Link, String> {
        match kind {
            LinkKind::MemifPair => memif_pair(eal, pool, mtu),
            LinkKind::Veth => veth(eal, pool, mtu, pmd),
            LinkKind::Memif => Err("the memif link joins two processes: run one with --role server and the other with --role client".into()),
        }
    }

    /// This process's side of a memif link to another process: one port
    /// (the memif server or client on `socket`) with three queue pairs. Both
    /// ends of each channel are this port; the other side's are remote.
    pub fn memif_side(
        eal: &Eal,
        pool: &Mempool,
        mtu: u16,
        socket: &str,
        server: bool,
    ) -> Result<Link, String> {
        if server {
            // A stale socket file from a killed run would refuse the bind.
            let _ = std::fs::remove_file(socket);
        } else {
            // The server may still be starting.
            let t = std::time::Instant::now();
            while !memif_listening(socket) {
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
        })
    }
}

/// Whether a memif server listens on `socket`: DPDK 22.11 makes it an
/// abstract Unix socket (`@path` in /proc/net/unix), older ones a file.
fn memif_listening(socket: &str) -> bool {
    let abstract_name = format!("@{socket}");
    std::path::Path::new(socket).exists()
        || std::fs::read_to_string("/proc/net/unix").is_ok_and(|t| {
            t.lines()
                .any(|l| l.split_whitespace().last() == Some(abstract_name.as_str()))
        })
}

/// A memif port with three queue pairs, sized for frames of `mtu`.
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
    // memif's ring buffers hold 2048 bytes by default: size them for a whole
    // jumbo frame, so that a frame is one descriptor.
    let bsize = if mtu > 1500 {
        format!(",bsize={}", (usize::from(mtu) + 14).next_power_of_two())
    } else {
        String::new()
    };
    Port::from_devargs(
        eal,
        &format!("net_memif{n},role={role},socket={sock}{bsize}"),
        &cfg,
        pool,
    )
    .map_err(|e| e.to_string())
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
            let port = port.map_err(|e| e.to_string())?;
            port.wait_link(Duration::from_secs(10))
                .map_err(|e| e.to_string())?;
            ends.push(End { port, queue: 0 });
        }
        let b = ends.pop().expect("two ends");
        let a = ends.pop().expect("two ends");
        channels.push(Channel { a, b });
        pairs.push(pair);
    }
    Ok(Link {
        name: match pmd {
            VethPmd::AfPacket => "veth pairs between namespaces, net_af_packet".into(),
            VethPmd::AfXdp => "veth pairs between namespaces, net_af_xdp".into(),
        },
        channels,
        veth: pairs,
        mtu,
    })
}
