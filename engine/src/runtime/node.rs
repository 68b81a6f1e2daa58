//! Starting an engine from one configuration value: the EAL, the DPDK port
//! the link runs on, and the engine. Deserializable, so a file can hold it
//! (the cluster file format builds on this).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dpdk_ffi::{Eal, HugepageMode, Mempool, Port, PortConfig, DEFAULT_DATA_ROOM};
use serde::Deserialize;

use super::engine::{Engine, EngineConfig};
use super::Error;
use crate::io::DpdkIo;

/// Sends DPDK's own messages (the EAL's, the drivers') through `tracing`
/// from now on, with target `dpdk`, instead of straight to stderr: an
/// application whose log is `tracing`'s then has them in its format (JSON
/// lines, say), under its level filter, and, for those the EAL writes on
/// the thread that starts it, in its span. DPDK's errors are `ERROR`, its
/// warnings `WARN`, its notices and information `INFO`, its debug lines
/// `DEBUG`.
///
/// Call it once, before starting a node; it holds for the life of the
/// process, and only for an EAL that this crate starts (see
/// [`dpdk_ffi::log_to`]). `false` when DPDK's messages already had a
/// destination.
pub fn log_dpdk_to_tracing() -> bool {
    fn sink(level: dpdk_ffi::LogLevel, line: &str) {
        use dpdk_ffi::LogLevel as L;
        match level {
            L::Error => tracing::error!(target: "dpdk", "{line}"),
            L::Warning => tracing::warn!(target: "dpdk", "{line}"),
            L::Notice | L::Info => tracing::info!(target: "dpdk", "{line}"),
            L::Debug => tracing::debug!(target: "dpdk", "{line}"),
        }
    }
    dpdk_ffi::log_to(sink)
}

/// Hugepage choice, as a configuration file spells it.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Hugepages {
    /// Hugepages when enough are free, ordinary pages otherwise.
    #[default]
    Auto,
    /// Hugepages or an error saying how to reserve them.
    Require,
    /// Ordinary pages (`--no-huge`).
    Never,
}

/// How the EAL starts.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EalConfig {
    /// Hugepages or not (default auto).
    #[serde(default)]
    pub hugepages: Hugepages,
    /// Memory in MiB (default 512): all the EAL has with `--no-huge`; on
    /// hugepages, what must be free for `auto` to take them (or `require`
    /// to start), while the EAL takes pages as it needs them.
    #[serde(default = "default_memory")]
    pub memory_mb: u32,
    /// Further EAL arguments, passed as they are.
    #[serde(default)]
    pub args: Vec<String>,
}

fn default_memory() -> u32 {
    512
}

impl Default for EalConfig {
    fn default() -> Self {
        EalConfig {
            hugepages: Hugepages::Auto,
            memory_mb: default_memory(),
            args: Vec::new(),
        }
    }
}

impl EalConfig {
    /// Starts the EAL (once per process).
    pub fn start(&self) -> Result<Eal, Error> {
        self.start_for(&[])
    }

    /// Starts the EAL (once per process) for ports to be opened from
    /// `devargs`: a NIC among them is allowed on the PCI bus (see
    /// [`EalBuilder::port`](dpdk_ffi::EalBuilder::port)).
    pub fn start_for(&self, devargs: &[&str]) -> Result<Eal, Error> {
        let mode = match self.hugepages {
            Hugepages::Auto => HugepageMode::Auto,
            Hugepages::Require => HugepageMode::Require,
            Hugepages::Never => HugepageMode::Never,
        };
        let mut b = Eal::builder().hugepages(mode).memory_mb(self.memory_mb);
        for d in devargs {
            b = b.port(d);
        }
        for a in &self.args {
            b = b.arg(a.clone());
        }
        b.init().map_err(Error::from)
    }
}

/// The DPDK port a link runs on.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LinkConfig {
    /// Device arguments: a vdev (`net_memif0,role=server,socket=/run/emx.sock`,
    /// `net_af_packet0,iface=eth0`, ...) or a PCI address (`0000:03:00.0`).
    pub devargs: String,
    /// MTU (default: the driver's).
    #[serde(default)]
    pub mtu: Option<u16>,
    /// Mbufs in the port's pool (default 16383).
    #[serde(default = "default_mbufs")]
    pub mbufs: u32,
    /// How long to wait for the link to come up, in milliseconds (default 10000).
    #[serde(default = "default_link_wait")]
    pub link_wait_ms: u64,
}

fn default_mbufs() -> u32 {
    16383
}

fn default_link_wait() -> u64 {
    10_000
}

/// Bytes an mbuf takes in its pool beside its data room: `struct rte_mbuf`
/// (two cache lines) and the mempool's object header (one).
const MBUF_OVERHEAD: u64 = 192;

impl LinkConfig {
    /// The data room of each mbuf of the link's pool, in bytes.
    pub fn mbuf_room(&self) -> u16 {
        self.mtu
            .map_or(DEFAULT_DATA_ROOM, dpdk_ffi::data_room_for_mtu)
    }

    /// The EAL memory the link's mbuf pool takes at least, in bytes (the
    /// pool's own bookkeeping comes on top).
    pub fn pool_bytes(&self) -> u64 {
        u64::from(self.mbufs) * (u64::from(self.mbuf_room()) + MBUF_OVERHEAD)
    }
}

/// Everything one node needs: EAL, link, engine.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// EAL settings.
    #[serde(default)]
    pub eal: EalConfig,
    /// The port.
    pub link: LinkConfig,
    /// The engine.
    pub engine: EngineConfig,
}

/// A node started from a [`NodeConfig`]: the engine, and the DPDK objects it
/// runs on (kept so that they close in order when the node is dropped).
pub struct Node {
    /// The engine.
    pub engine: Engine,
    /// The port.
    pub port: Port,
    /// The port's mbuf pool.
    pub pool: Mempool,
    /// The EAL.
    pub eal: Eal,
}

/// Registers `len` bytes of memory for zero-copy sends: hugepages when the
/// EAL runs on them and there are free ones, ordinary pages otherwise, with a
/// warning when hugepages were meant to be used (ordinary pages are slower
/// for the NIC to reach and need locking). An EAL started without hugepages
/// (`hugepages = "never"`, or none usable) gets ordinary pages: the region
/// used to take free hugepages regardless. Carve message buffers out of
/// it with [`ExtMem::alloc`](dpdk_ffi::ExtMem::alloc), and map it for each
/// port that sends from it with [`ExtMem::dma_map`](dpdk_ffi::ExtMem::dma_map):
/// a NIC behind VFIO cannot reach it otherwise.
pub fn register_memory(eal: &Eal, len: usize) -> Result<dpdk_ffi::ExtMem, Error> {
    if !eal.uses_hugepages() {
        return Ok(dpdk_ffi::ExtMem::with_pages(eal, len, false)?);
    }
    let region = dpdk_ffi::ExtMem::new(eal, len)?;
    if !region.is_hugepages() {
        tracing::warn!(
            bytes = region.len(),
            "registered memory is on ordinary pages: no free hugepages (reserve them with scripts/setup.sh)"
        );
    }
    Ok(region)
}

/// Starts the EAL, brings up the port, waits for its link and starts the
/// engine on it.
pub fn start_node(cfg: &NodeConfig) -> Result<Node, Error> {
    start_node_until(cfg, &|| false)
}

/// [`start_node`] that gives up with [`Error::Stopped`] as soon as `stop`
/// says so while it waits for the link (up to `link_wait_ms`): a daemon told
/// to stop during its start-up stops then, not when the wait ends.
pub fn start_node_until(cfg: &NodeConfig, stop: &dyn Fn() -> bool) -> Result<Node, Error> {
    let eal = cfg.eal.start_for(&[&cfg.link.devargs])?;
    start_on(&eal, &cfg.link, &cfg.engine, stop)
}

/// Like [`start_node`] in a process whose EAL already runs (several nodes in
/// one process, as tests and the benchmark do).
pub fn start_node_on(eal: &Eal, link: &LinkConfig, engine: &EngineConfig) -> Result<Node, Error> {
    start_on(eal, link, engine, &|| false)
}

fn start_on(
    eal: &Eal,
    link: &LinkConfig,
    engine: &EngineConfig,
    stop: &dyn Fn() -> bool,
) -> Result<Node, Error> {
    // Named per start: a node of the same number may run in this process
    // (another cluster), or have left its pool waiting for mbufs still out.
    static STARTS: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "emx{}_{}",
        engine.node,
        STARTS.fetch_add(1, Ordering::Relaxed)
    );
    let room = link.mbuf_room();
    // A per-lcore cache of 256, or what DPDK allows a small pool (2/3 of it).
    let cache = (link.mbufs / 3 * 2).min(256);
    let pool = Mempool::new(eal, &name, link.mbufs, cache, room).map_err(|e| match e {
        // No memory for it: say how much it takes, and where more comes from.
        dpdk_ffi::Error::Call { errno, .. } if errno.is_out_of_memory() => Error::Pool {
            mbufs: link.mbufs,
            room,
            mib: link.pool_bytes().div_ceil(1 << 20),
            hugepages: eal.uses_hugepages(),
            source: Box::new(e.into()),
        },
        e => Error::from(e),
    })?;
    let pcfg = PortConfig {
        mtu: link.mtu,
        ..PortConfig::default()
    };
    let port = Port::from_devargs(eal, &link.devargs, &pcfg, &pool)?;
    if port
        .wait_link_unless(Duration::from_millis(link.link_wait_ms), stop)?
        .is_none()
    {
        return Err(Error::Stopped);
    }
    let io = DpdkIo::new(&port, 0, &pool)?;
    let engine = Engine::start(engine, io)?;
    Ok(Node {
        engine,
        port,
        pool,
        eal: eal.clone(),
    })
}
