//! The public face of the runtime: an [`Engine`] runs one protocol core over
//! one link, and hands out an [`Endpoint`] through which an application sends
//! and receives.
//!
//! Two ways to make progress:
//! - [`ProgressMode::Thread`]: a polling thread, pinned to a core, owns the
//!   link and the protocol core. Application threads submit requests through
//!   a lock-free ring and take completions from another; a full ring is
//!   reported as [`Error::WouldBlock`], never lost. Idle, the thread backs off
//!   (spin, yield, short sleep) unless told to spin forever.
//! - [`ProgressMode::Inline`]: no thread; the application thread drives
//!   progress itself whenever it tests or waits, with no cross-core hop. The
//!   lowest latency on few cores. An inline engine acts only while driven:
//!   it acknowledges, answers rendezvous pulls and keepalives only inside
//!   its endpoint's calls (`test`, `wait`, `progress`, and `isend` and
//!   `probe`, which send and poll). A peer waiting on an engine that nobody
//!   drives hears nothing, and after `peer_timeout` declares it unreachable;
//!   keep calling [`Endpoint::progress`] when idle.
//!
//! ```
//! use emx::io::{MemNetwork, PacketIo};
//! use emx::proto::Addr;
//! use emx::runtime::{Engine, EngineConfig, PeerConfig};
//!
//! // Two engines on an in-memory link (a DPDK port works the same way, through
//! // `emx::io::DpdkIo`).
//! let (link_a, link_b) = MemNetwork::pair(1500);
//! let peer = |node, mac| PeerConfig { node, endpoint: 0, mac };
//! let cfg_a = EngineConfig { peers: vec![peer(2, link_b.mac())], ..EngineConfig::new(1) };
//! let cfg_b = EngineConfig { peers: vec![peer(1, link_a.mac())], ..EngineConfig::new(2) };
//! let (mut ea, mut eb) = (Engine::start(&cfg_a, link_a)?, Engine::start(&cfg_b, link_b)?);
//! let (mut a, mut b) = (ea.endpoint()?, eb.endpoint()?);
//!
//! let recv = b.irecv(None, 0x42, u64::MAX, vec![0u8; 5]).expect("posted");
//! let send = a.isend(Addr::new(2, 0), 0x42, b"hello".to_vec()).expect("sent");
//! // Inline progress: drive both sides until both requests are done.
//! let (mut got, mut sent) = (None, None);
//! while got.is_none() || sent.is_none() {
//!     if sent.is_none() { sent = a.test(send)?; }
//!     if got.is_none() { got = b.test(recv)?; }
//! }
//! let (buf, info) = got.unwrap().into_recv()?;
//! assert_eq!((buf.as_ref(), info.src), (&b"hello"[..], Addr::new(1, 0)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use serde::Deserialize;

use crate::io::{IoStats, PacketIo};
use crate::proto::{
    Addr, Completion, Core, CoreConfig, CoreStats, MacAddr, MessageId, Now, PeerStats, ProbeInfo,
    RecvError, Rejected, SendError,
};

use super::buffer::{RecvBuf, SendBuf};
use super::driver::{Clock, Driver, LazyNow, Progress, BURST};
use super::request::{
    request_of, Buf, Completed, CoreCompletion, Kind, Message, Request, Requests,
};
use super::Error;

/// How progress is made.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case", tag = "mode", deny_unknown_fields)]
pub enum ProgressMode {
    /// The application thread drives progress inside test and wait.
    #[default]
    Inline,
    /// A polling thread owns the link.
    Thread {
        /// CPU to pin it to (`None`: not pinned).
        #[serde(default)]
        core: Option<usize>,
        /// Never back off when idle (for an isolated core). Give `core`
        /// too: unpinned, the spinning thread may share a CPU with others,
        /// which then wait for whole time slices (milliseconds) for it, or
        /// it for them.
        #[serde(default)]
        spin: bool,
    },
}

/// Protocol settings, as a configuration file gives them (times in
/// microseconds). Unset fields take the defaults of [`CoreConfig`].
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ProtocolConfig {
    /// EtherType of emx frames (default 0x88B5).
    pub ethertype: Option<u16>,
    /// Cluster id.
    pub cluster: Option<u16>,
    /// Messages up to this many bytes go eager.
    pub eager_threshold: Option<u64>,
    /// Bytes of the unexpected-message store.
    pub unexpected_bytes: Option<u64>,
    /// Send window in frames (1..=256).
    pub window: Option<u32>,
    /// Bytes per rendezvous pull (default 256 KiB).
    pub pull_block: Option<u32>,
    /// Pulls in flight per rendezvous receive (1..=8).
    pub pull_inflight: Option<u8>,
    /// Most small messages packed into one frame (1: no packing).
    pub pack_max: Option<u16>,
    /// Messages up to this many bytes may be packed.
    pub pack_below: Option<u32>,
    /// Rendezvous data is received with streaming stores while receives posted
    /// for large messages hold at least this many bytes (0: never).
    pub stream_min: Option<u64>,
    /// Most peers.
    pub max_peers: Option<usize>,
    /// Most outstanding sends.
    pub max_sends: Option<usize>,
    /// Most outstanding receives.
    pub max_recvs: Option<usize>,
    /// A silent peer is declared unreachable after this long (µs).
    pub peer_timeout_us: Option<u64>,
    /// Keepalive interval (µs).
    pub keepalive_us: Option<u64>,
    /// Initial retransmission timeout (µs).
    pub rto_initial_us: Option<u64>,
    /// Lower bound of the retransmission timeout (µs; 1000 by default).
    /// Raise it where a receiver may stall longer (a shared or virtual
    /// machine, a slow link), or frames are sent again for nothing.
    pub rto_min_us: Option<u64>,
    /// Upper bound of the retransmission timeout, after backoff (µs).
    pub rto_max_us: Option<u64>,
    /// Longest an acknowledgement waits to be coalesced or to ride on a
    /// reply (µs); below `rto_min_us`.
    pub ack_delay_us: Option<u64>,
    /// Acknowledge at once after this many in-order frames.
    pub ack_every: Option<u32>,
    /// Checksum coverage of frames: `"off"` (the Ethernet FCS alone),
    /// `"header"` or `"full"` (header and payload, for links that may
    /// corrupt data past the FCS). All nodes must agree.
    pub checksum: Option<crate::proto::ChecksumMode>,
}

impl ProtocolConfig {
    /// The core configuration for a link of this MTU.
    pub fn core_config(&self, mtu: usize) -> CoreConfig {
        let d = CoreConfig::default();
        let us = |v: Option<u64>, dflt: Duration| v.map_or(dflt, Duration::from_micros);
        CoreConfig {
            ethertype: self.ethertype.unwrap_or(d.ethertype),
            cluster: self.cluster.unwrap_or(d.cluster),
            mtu,
            max_peers: self.max_peers.unwrap_or(d.max_peers),
            max_sends: self.max_sends.unwrap_or(d.max_sends),
            max_recvs: self.max_recvs.unwrap_or(d.max_recvs),
            window: self.window.unwrap_or(d.window),
            eager_threshold: self.eager_threshold.unwrap_or(d.eager_threshold),
            unexpected_bytes: self.unexpected_bytes.unwrap_or(d.unexpected_bytes),
            pull_block: self.pull_block.unwrap_or(d.pull_block),
            pull_inflight: self.pull_inflight.unwrap_or(d.pull_inflight),
            pack_max: self.pack_max.unwrap_or(d.pack_max),
            pack_below: self.pack_below.unwrap_or(d.pack_below),
            stream_min: self.stream_min.unwrap_or(d.stream_min),
            peer_timeout: us(self.peer_timeout_us, d.peer_timeout),
            keepalive: us(self.keepalive_us, d.keepalive),
            rto_initial: us(self.rto_initial_us, d.rto_initial),
            rto_min: us(self.rto_min_us, d.rto_min),
            rto_max: us(self.rto_max_us, d.rto_max),
            ack_delay: us(self.ack_delay_us, d.ack_delay),
            ack_every: self.ack_every.unwrap_or(d.ack_every),
            checksum: self.checksum.unwrap_or(d.checksum),
        }
    }
}

/// A peer known from the start.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// Its node number.
    pub node: u16,
    /// Its endpoint (default 0).
    #[serde(default)]
    pub endpoint: u8,
    /// Its MAC address, `aa:bb:cc:dd:ee:ff`, or `auto` (the same as
    /// [`AUTO_MAC`]): learnt from the peer's first frame, and again when it
    /// restarts with a new one.
    #[serde(deserialize_with = "de_mac")]
    pub mac: [u8; 6],
}

/// A peer's MAC address that is not known in advance: the engine greets
/// everyone on the segment and learns the address from the answer.
pub const AUTO_MAC: [u8; 6] = crate::wire::MacAddr::BROADCAST.0;

fn de_mac<'de, D: serde::Deserializer<'de>>(d: D) -> Result<[u8; 6], D::Error> {
    let s = String::deserialize(d)?;
    if s == "auto" {
        return Ok(AUTO_MAC);
    }
    parse_mac(&s).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "bad MAC address `{s}` (want aa:bb:cc:dd:ee:ff or auto)"
        ))
    })
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// How to run an engine. Deserializable, so it can come from a file.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// This node's number.
    pub node: u16,
    /// This node's endpoints (default `[0]`). Several need a polling thread:
    /// one thread drives them all, and each gets its own rings.
    #[serde(default = "default_endpoints")]
    pub endpoints: Vec<u8>,
    /// Session epoch; a fresh one per start, from the clock, when unset. A
    /// restarted node must come back with an epoch above every one it had
    /// before, and giving up on a peer moves its epoch toward that peer one
    /// up each time (so that the peer takes it for a restart): a boot counter
    /// given here must step past those, `boot << 16` say, or a peer may take
    /// the restarted node for the one it knew.
    #[serde(default)]
    pub epoch: Option<u32>,
    /// Progress mode.
    #[serde(default)]
    pub progress: ProgressMode,
    /// Protocol settings.
    #[serde(default)]
    pub protocol: ProtocolConfig,
    /// Peers known from the start.
    #[serde(default)]
    pub peers: Vec<PeerConfig>,
    /// Entries of the submission and completion rings (default 1024, at
    /// most [`MAX_RING`]).
    #[serde(default = "default_ring")]
    pub ring: usize,
    /// The longest a polling thread with nothing to do sleeps at a time, in
    /// microseconds (default [`DEFAULT_IDLE_SLEEP_US`], within
    /// [`IDLE_SLEEP_US`]). Idle, it spins, then yields, then sleeps for
    /// twice as long each time from 20 us up to this: a frame that arrives
    /// during a sleep waits for its end, while the application's calls and a
    /// stop wake it at once. Longer sleeps take less CPU from a shared
    /// machine; shorter ones answer sooner after a quiet spell. Inline
    /// engines, and a polling thread that spins, never sleep.
    #[serde(default = "default_idle_sleep_us")]
    pub idle_sleep_us: u64,
}

/// The most entries a submission or completion ring may have.
pub const MAX_RING: usize = 1 << 20;

/// A polling thread's longest idle sleep unless [`EngineConfig::idle_sleep_us`]
/// says otherwise: 1 ms.
pub const DEFAULT_IDLE_SLEEP_US: u64 = 1000;

/// What [`EngineConfig::idle_sleep_us`] may be: from the first sleep (20 us)
/// to a second.
pub const IDLE_SLEEP_US: std::ops::RangeInclusive<u64> = 20..=1_000_000;

fn default_ring() -> usize {
    1024
}

fn default_endpoints() -> Vec<u8> {
    vec![0]
}

fn default_idle_sleep_us() -> u64 {
    DEFAULT_IDLE_SLEEP_US
}

impl EngineConfig {
    /// A configuration with defaults for node `node`.
    pub fn new(node: u16) -> EngineConfig {
        EngineConfig {
            node,
            endpoints: default_endpoints(),
            epoch: None,
            progress: ProgressMode::Inline,
            protocol: ProtocolConfig::default(),
            peers: Vec::new(),
            ring: default_ring(),
            idle_sleep_us: DEFAULT_IDLE_SLEEP_US,
        }
    }

    /// A configuration with defaults for node `node` that knows one peer
    /// from the start: endpoint 0 of node `peer`, at `mac` (or
    /// [`AUTO_MAC`] to learn it).
    ///
    /// ```
    /// use emx::runtime::EngineConfig;
    /// let cfg = EngineConfig::with_peer(1, 2, [2, 0, 0, 0, 0, 2]);
    /// assert_eq!((cfg.node, cfg.peers[0].node, cfg.peers[0].endpoint), (1, 2, 0));
    /// ```
    pub fn with_peer(node: u16, peer: u16, mac: [u8; 6]) -> EngineConfig {
        EngineConfig {
            peers: vec![PeerConfig {
                node: peer,
                endpoint: 0,
                mac,
            }],
            ..EngineConfig::new(node)
        }
    }
}

/// A driver with its link type erased, so that the engine is not generic.
trait Drive: Send {
    fn progress(
        &mut self,
        now: crate::proto::Time,
        sink: &mut dyn FnMut(usize, Completion<SendBuf, RecvBuf>),
    ) -> Progress;
    /// [`progress`](Drive::progress) for an inline endpoint: its completions
    /// go straight into its request table, with no call through a closure
    /// object per completion.
    fn progress_inline(&mut self, now: crate::proto::Time, requests: &mut Requests) -> Progress;
    fn core(&mut self, i: usize) -> &mut Core<SendBuf, RecvBuf>;
    fn flush(&mut self, now: crate::proto::Time);
    fn io_stats(&self) -> IoStats;
    /// Frames built and waiting for room on a full link.
    fn tx_backlog(&self) -> usize;
    fn enter_thread(&self) -> Result<Option<dpdk_ffi::ThreadRegistration>, crate::io::IoError>;
}

impl<L: PacketIo + Send> Drive for Driver<L>
where
    L::Frame: Send,
{
    fn progress(
        &mut self,
        now: crate::proto::Time,
        sink: &mut dyn FnMut(usize, Completion<SendBuf, RecvBuf>),
    ) -> Progress {
        Driver::progress_all(self, now, sink)
    }
    fn progress_inline(&mut self, now: crate::proto::Time, requests: &mut Requests) -> Progress {
        Driver::progress_all(self, now, |_, c| requests.finish(c))
    }
    fn core(&mut self, i: usize) -> &mut Core<SendBuf, RecvBuf> {
        self.core_at(i)
            .expect("endpoint index within the driver's cores")
    }
    fn flush(&mut self, now: crate::proto::Time) {
        Driver::flush(self, now);
    }
    fn io_stats(&self) -> IoStats {
        Driver::io_stats(self)
    }
    fn tx_backlog(&self) -> usize {
        Driver::tx_backlog(self)
    }
    fn enter_thread(&self) -> Result<Option<dpdk_ffi::ThreadRegistration>, crate::io::IoError> {
        self.io().enter_thread()
    }
}

enum Cmd {
    Send {
        req: Request,
        dst: Addr,
        bits: u64,
        buf: SendBuf,
    },
    Recv {
        req: Request,
        src: Option<Addr>,
        bits: u64,
        mask: u64,
        buf: RecvBuf,
    },
    Cancel {
        req: Request,
    },
    Probe {
        src: Option<Addr>,
        bits: u64,
        mask: u64,
    },
    MProbe {
        src: Option<Addr>,
        bits: u64,
        mask: u64,
    },
    MRecv {
        req: Request,
        msg: MessageId,
        buf: RecvBuf,
    },
    AddPeer {
        addr: Addr,
        mac: [u8; 6],
    },
    Stats {
        addr: Addr,
    },
    CoreStats,
    Peers,
    Reconnect {
        addr: Addr,
    },
    /// The endpoint is gone (closed or dropped): abort every outstanding
    /// request and take no new message ([`Core::begin_close`]); once the core
    /// has owed its peers nothing for `LINGER` (at most `CLOSE_MAX`), close
    /// it ([`Core::close`]): it then drops every frame unanswered, as if the
    /// endpoint's process had ended.
    Close,
    /// How many of this endpoint's requests are under way
    /// ([`Core::in_progress`]).
    InProgress,
}

enum Event {
    /// A request the core finished.
    Finished(CoreCompletion),
    /// A request the core refused.
    Done {
        req: Request,
        c: Completed,
    },
    Probe(Result<Option<ProbeInfo>, RecvError>),
    MProbe(Result<Option<(MessageId, ProbeInfo)>, RecvError>),
    AddPeer(Result<(), Error>),
    /// (boxed: rare, and large next to the completions the ring mostly carries)
    Stats(Box<(Option<PeerStats>, IoStats)>),
    /// (boxed for the same reason)
    CoreStats(Box<CoreStats>),
    Peers(Vec<PeerStatus>),
    Reconnect(bool),
    InProgress(usize),
}

/// A peer as an endpoint sees it: who it is, whether its session is up, when
/// it was last heard, and its counters.
#[derive(Clone, Debug)]
pub struct PeerStatus {
    /// Its address.
    pub addr: Addr,
    /// Its Ethernet address.
    pub mac: [u8; 6],
    /// Its session epoch as known here (0: not learnt yet).
    pub epoch: u32,
    /// Declared unreachable (silent past the liveness deadline while
    /// something waited on it); it comes back with a new epoch, when it
    /// speaks to this endpoint again, or after
    /// [`Endpoint::reconnect`].
    pub down: bool,
    /// Time since a frame of it was last accepted (`None`: never).
    pub silent_for: Option<Duration>,
    /// The smoothed round-trip time of its session (`None`: no sample yet).
    pub srtt: Option<Duration>,
    /// The retransmission timeout of its session now, backoff included.
    pub rto: Duration,
    /// Its counters.
    pub stats: PeerStats,
}

fn reconnect(core: &mut Core<SendBuf, RecvBuf>, now: crate::proto::Time, addr: Addr) -> bool {
    core.peer_id(addr).is_some_and(|p| core.reconnect(now, p))
}

fn peer_status(core: &Core<SendBuf, RecvBuf>, now: crate::proto::Time) -> Vec<PeerStatus> {
    core.peers()
        .map(|(id, addr, mac)| {
            let info = core.peer_info(id).expect("listed peer");
            PeerStatus {
                addr,
                mac: mac.0,
                epoch: info.epoch,
                down: info.dead,
                silent_for: core
                    .peer_last_heard(id)
                    .map(|t| Duration::from_nanos(now.0.saturating_sub(t.0))),
                srtt: (!info.srtt.is_zero()).then_some(info.srtt),
                rto: info.rto,
                stats: *core.peer_stats(id).expect("listed peer"),
            }
        })
        .collect()
}

thread_local! {
    /// Whether this thread has been offered for registration with DPDK (by
    /// the first progress call of an inline endpoint on it).
    static INLINE_CHECKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// This thread's DPDK registration, if that made one, kept until the
    /// thread ends.
    static INLINE_THREAD: std::cell::RefCell<Option<dpdk_ffi::ThreadRegistration>> =
        const { std::cell::RefCell::new(None) };
}

/// Registers the calling thread with the link's DPDK, once per thread, as a
/// polling thread is: a thread DPDK does not know has no mempool cache, so
/// each mbuf it takes or gives back goes through the pool's shared ring. A
/// one-thread memif round trip (`runtime_cost`, both sides driven from one
/// spawned thread) took 1.9-2.5 us unregistered against 1.2-1.9 us
/// registered. Without a free lcore id the thread goes on unregistered.
///
/// The registration lasts as long as the thread (an lcore id taken, and the
/// EAL kept, until it ends): a thread that drives inline endpoints is
/// expected to live as long as they do. A link with nothing to register (the
/// in-memory one) leaves the thread to be offered again.
#[cold]
fn register_inline_thread(driver: &dyn Drive) {
    match driver.enter_thread() {
        Ok(Some(reg)) => {
            INLINE_CHECKED.with(|c| c.set(true));
            if reg.is_new() {
                INLINE_THREAD.with(|r| *r.borrow_mut() = Some(reg));
            }
        }
        Ok(None) => {}
        Err(e) => {
            INLINE_CHECKED.with(|c| c.set(true));
            tracing::debug!(error = %e, "inline thread not registered with DPDK");
        }
    }
}

const RUNNING: u8 = 0;
const STOPPING: u8 = 1;
const STOPPED: u8 = 2;

/// What one endpoint shares with the polling thread, besides its completion
/// ring, whose two ends they hold (the thread the producer, the endpoint the
/// consumer: an `rtrb` single-producer ring).
struct EpShared {
    cmds: ArrayQueue<Cmd>,
    /// Events a stopped polling thread found no room for in the completion
    /// ring: taken by the endpoint once it sees the engine stopped, so that
    /// no request is left without its completion and buffer.
    leftover: Mutex<VecDeque<Event>>,
    /// Set by the polling thread while events wait for room in the ring:
    /// the endpoint that makes room wakes it (see `Shared::kick`), rather
    /// than leave them to wait out its backoff sleep.
    backlogged: AtomicBool,
    waiting: AtomicBool,
    waiter: Mutex<Option<Thread>>,
    /// The CPU the waiter parked on (`usize::MAX`: not known).
    waiter_cpu: AtomicUsize,
}

impl EpShared {
    fn new(ring: usize) -> EpShared {
        EpShared {
            cmds: ArrayQueue::new(ring),
            leftover: Mutex::new(VecDeque::new()),
            backlogged: AtomicBool::new(false),
            waiting: AtomicBool::new(false),
            waiter: Mutex::new(None),
            waiter_cpu: AtomicUsize::new(usize::MAX),
        }
    }

    /// Wakes the endpoint's thread if it parked waiting for events; returns,
    /// when it woke one, the CPU it parked on (`usize::MAX`: not known).
    fn wake(&self, always: bool) -> Option<usize> {
        // Pairs with the fence in `Endpoint::idle`: either the endpoint sees
        // the event just pushed before it parks, or this sees it waiting.
        std::sync::atomic::fence(Ordering::SeqCst);
        // Taken, so that events delivered before it runs do not wake it (and
        // yield to it) again. (Were it only about to park, the unpark still
        // reaches it: its park returns at once.)
        if always || self.waiting.swap(false, Ordering::SeqCst) {
            // Unparked once the lock is released: a thread woken on this CPU
            // runs at once, and the lock it takes before it parks again must
            // not be held by the thread it just preempted (on 2 CPUs, where
            // emx-bench's pinger shares its polling thread's CPU, that cost
            // two more switches between them on every round trip).
            let t = self
                .waiter
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(t) = t {
                t.unpark();
                return Some(self.waiter_cpu.load(Ordering::Relaxed));
            }
        }
        None
    }
}

/// Moves events from the front of `backlog` into the completion ring while
/// it has room, published together (one store of the ring's tail for the
/// lot, where each event pushed alone took the line from the endpoint's
/// thread again); returns whether any went.
fn deliver(events: &mut rtrb::Producer<Event>, backlog: &mut VecDeque<Event>) -> bool {
    if backlog.is_empty() {
        // Nothing to read the ring's head for: that line is the endpoint's.
        return false;
    }
    let n = backlog.len().min(events.slots());
    if n == 0 {
        return false;
    }
    match events.write_chunk_uninit(n) {
        Ok(chunk) => chunk.fill_from_iter(backlog.drain(..n)) != 0,
        Err(_) => false,
    }
}

struct Shared {
    eps: Vec<EpShared>,
    state: AtomicU8,
    /// Until when a stopping engine keeps driving the requests under way.
    drain_until: Mutex<Option<Instant>>,
    /// The polling thread, and whether it is asleep (backed off): a submitter
    /// wakes it rather than leave the request waiting out the sleep.
    poller: std::sync::OnceLock<Thread>,
    poller_asleep: AtomicBool,
    /// The polling thread spins and never sleeps (`spin`): nobody need
    /// wake it, so a submitter, or an endpoint that makes room in its ring,
    /// skips the fence and the look that waking takes.
    poller_spins: bool,
    /// The CPU the polling thread is pinned to, if it is.
    poller_core: Option<usize>,
    /// The polling thread died (panicked): the engine is stopped, and what
    /// it held is lost.
    died: AtomicBool,
}

impl Shared {
    /// Why the engine takes no more work: shut down, or its polling thread died.
    fn stopped_error(&self) -> Error {
        if self.died.load(Ordering::Acquire) {
            Error::Thread(
                "the polling thread died (its panic message is above): the engine is stopped, \
                 and the requests it held are lost with their buffers"
                    .into(),
            )
        } else {
            Error::ShutDown
        }
    }
}

/// Held by the polling thread: when it unwinds (a panic in a link or the
/// core), the engine is marked stopped and its endpoints woken, so that their
/// waits end with [`Error::Thread`] instead of waiting for completions that
/// will never come.
struct DeathWatch(Arc<Shared>);

impl Drop for DeathWatch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.died.store(true, Ordering::Release);
            self.0.state.store(STOPPED, Ordering::Release);
            for eps in &self.0.eps {
                eps.wake(true);
            }
        }
    }
}

impl Shared {
    /// Wakes the polling thread if it is asleep: a command was submitted.
    #[inline]
    fn kick(&self) {
        if self.poller_spins {
            // The fence below would wait for this thread's stores to reach
            // the cache, the command's among them, whose line the spinning
            // poller holds: a cross-core miss on every submission.
            return;
        }
        // Pairs with the fence in Backoff::snooze: either the poller sees the
        // command before it parks, or this sees it asleep and wakes it.
        std::sync::atomic::fence(Ordering::SeqCst);
        // Taken, so that the submissions that follow before it runs do not
        // wake it again. (Were it only about to park, the unpark still
        // reaches it: its park returns at once.)
        if self.poller_asleep.swap(false, Ordering::SeqCst) {
            if let Some(t) = self.poller.get() {
                t.unpark();
                // The kernel tends to wake a thread on its waker's CPU (on
                // the development VM, always): a caller that goes on spinning
                // there would hold the polling thread off until its time
                // slice ends, about 3 ms. Let it run first, unless it is
                // pinned to another CPU and cannot run here.
                if self
                    .poller_core
                    .is_none_or(|c| dpdk_ffi::current_cpu() == Some(c))
                {
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// How long an inline endpoint being closed keeps driving after its engine
/// fell idle: well past the delayed-acknowledgement timer (20 us by default).
const LINGER: Duration = Duration::from_millis(5);

/// How long a polling thread's endpoint being closed may keep its core
/// answering for what it owes its peers (see `Cmd::Close`).
const CLOSE_MAX: Duration = Duration::from_secs(1);

/// Whether cores that are closing have settled: owed their peers nothing
/// ([`Core::owes_nothing`]) for `LINGER` without a break. The moment more
/// covers a peer whose acknowledgement was lost and that sends again.
#[derive(Clone, Copy, Default)]
struct Settling(Option<Instant>);

impl Settling {
    /// Notes whether they owe nothing now; true once they have for `LINGER`.
    fn settled(&mut self, owe_nothing: bool) -> bool {
        if !owe_nothing {
            self.0 = None;
            return false;
        }
        self.0.get_or_insert_with(Instant::now).elapsed() >= LINGER
    }
}

/// What closing an endpoint found.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Requests that finished on their own (before the close, untaken, or
    /// while draining).
    pub drained: usize,
    /// Requests still outstanding at the deadline, aborted: they completed
    /// with [`Error::ShutDown`], their buffers handed back.
    pub aborted: usize,
    /// Requests whose completion never came back: a polling thread that did
    /// not answer the close within a second, or had died. Their buffers are
    /// gone (registered ranges go back to their region only once the thread
    /// lets go of them).
    pub lost: usize,
    /// Every request the endpoint held (outstanding, or finished and not
    /// yet taken), with its completion (and buffer).
    pub completed: Vec<(Request, Completed)>,
}

/// One emx engine: a protocol core over a link, progressed by a polling
/// thread or inline. With a polling thread, keep it while its endpoints are
/// in use: dropping it stops them (their requests then fail with
/// [`Error::ShutDown`]). An inline engine's endpoint drives the link itself
/// and outlives the engine.
pub struct Engine {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    inline: Option<Box<dyn Drive>>,
    /// Each endpoint's end of its completion ring, until it is handed out
    /// (a polling thread's engine).
    events: Vec<Option<rtrb::Consumer<Event>>>,
    /// Local endpoints, in the order of the driver's cores.
    locals: Vec<Addr>,
    taken: Vec<bool>,
    /// The core's `max_sends` and `max_recvs`, which each endpoint's request
    /// table enforces.
    limits: (usize, usize),
    /// The core's eager threshold: longer sends are rendezvous ones.
    eager_threshold: u64,
    clock: Clock,
    epoch: u32,
}

impl Engine {
    /// Starts an engine over `io` (a [`DpdkIo`](crate::io::DpdkIo) port queue,
    /// an in-memory link, or a wrapper of either).
    pub fn start<L: PacketIo + Send + 'static>(cfg: &EngineConfig, io: L) -> Result<Engine, Error>
    where
        L::Frame: Send,
    {
        let clock = Clock::new();
        let eps = &cfg.endpoints;
        let unique = eps.iter().collect::<std::collections::BTreeSet<_>>().len() == eps.len();
        if eps.is_empty() || eps.len() > 64 || !unique {
            return Err(Error::Setup(format!(
                "endpoints {eps:?}: give 1 to 64 distinct endpoint numbers"
            )));
        }
        if eps.len() > 1 && cfg.progress == ProgressMode::Inline {
            return Err(Error::Setup(format!(
                "{} endpoints need progress mode \"thread\": an inline engine is driven by one \
                 application thread, so it has one endpoint",
                eps.len()
            )));
        }
        if cfg.ring > MAX_RING {
            return Err(Error::Setup(format!(
                "ring = {}: rings take at most {MAX_RING} entries",
                cfg.ring
            )));
        }
        if !IDLE_SLEEP_US.contains(&cfg.idle_sleep_us) {
            return Err(Error::Setup(format!(
                "idle_sleep_us = {}: a polling thread's longest idle sleep must lie within \
                 {}..={} microseconds",
                cfg.idle_sleep_us,
                IDLE_SLEEP_US.start(),
                IDLE_SLEEP_US.end()
            )));
        }
        // A link's frames hold the Ethernet header first; one too short for
        // it (a `PacketIo` of the application's) is refused, not wrapped.
        let mtu = io.max_frame().checked_sub(14).ok_or_else(|| {
            Error::Setup(format!(
                "the link's frames ({} bytes at most) cannot hold an Ethernet header",
                io.max_frame()
            ))
        })?;
        let core_cfg = cfg.protocol.core_config(mtu);
        let epoch = cfg.epoch.unwrap_or_else(fresh_epoch);
        let max_requests = core_cfg.max_sends + core_cfg.max_recvs;
        let locals: Vec<Addr> = eps.iter().map(|&e| Addr::new(cfg.node, e)).collect();
        // Frames to this node's own MAC do not come back from the link: a
        // node's endpoints reach peers on other nodes only.
        if let Some(p) = cfg.peers.iter().find(|p| p.node == cfg.node) {
            return Err(Error::Setup(format!(
                "peer {}:{} is on this node ({}): an engine reaches endpoints of other nodes \
                 only (no loopback to its own address); leave it out of the peers",
                p.node, p.endpoint, cfg.node
            )));
        }
        let mut cores = Vec::with_capacity(eps.len());
        for &local in &locals {
            let mut core = Core::new(
                core_cfg.clone(),
                local,
                MacAddr(io.mac()),
                epoch,
                clock.now(),
            )
            .map_err(Error::Config)?;
            for p in &cfg.peers {
                core.add_peer(Addr::new(p.node, p.endpoint), MacAddr(p.mac))
                    .map_err(Error::Peer)?;
            }
            cores.push(core);
        }
        let ring = cfg.ring.max(BURST);
        // Only a polling thread's endpoints submit through the command ring:
        // inline, a ring of `ring` slots (70 MB at the largest) went unused.
        let cmds = match cfg.progress {
            ProgressMode::Thread { .. } => ring,
            ProgressMode::Inline => 1,
        };
        let shared = Arc::new(Shared {
            eps: (0..eps.len()).map(|_| EpShared::new(cmds)).collect(),
            state: AtomicU8::new(RUNNING),
            drain_until: Mutex::new(None),
            poller: std::sync::OnceLock::new(),
            poller_asleep: AtomicBool::new(false),
            poller_spins: matches!(cfg.progress, ProgressMode::Thread { spin: true, .. }),
            poller_core: match cfg.progress {
                ProgressMode::Thread { core, .. } => core,
                ProgressMode::Inline => None,
            },
            died: AtomicBool::new(false),
        });
        let driver: Box<dyn Drive> = Box::new(Driver::with_cores(cores, io));
        let mut engine = Engine {
            shared,
            thread: None,
            inline: None,
            events: Vec::new(),
            taken: vec![false; locals.len()],
            locals,
            limits: (core_cfg.max_sends, core_cfg.max_recvs),
            eager_threshold: core_cfg.eager_threshold,
            clock,
            epoch,
        };
        match cfg.progress {
            ProgressMode::Inline => engine.inline = Some(driver),
            ProgressMode::Thread { core, spin } => {
                if spin && core.is_none() {
                    tracing::warn!(
                        "a polling thread that spins with no CPU of its own may share one with \
                         other threads, which then wait whole time slices for it: give it a core \
                         (ProgressMode::Thread {{ core: Some(cpu), .. }}, `cores` in a cluster file)"
                    );
                }
                let shared = engine.shared.clone();
                let (producers, consumers): (Vec<_>, Vec<_>) = (0..engine.locals.len())
                    .map(|_| rtrb::RingBuffer::new(ring))
                    .unzip();
                engine.events = consumers.into_iter().map(Some).collect();
                let (ready_tx, ready_rx) = std::sync::mpsc::channel();
                let backoff = Backoff::new(spin, cfg.idle_sleep_us);
                // The starter's span goes with the thread, so that its log
                // lines say what the starter's do (a daemon's node, say).
                let span = tracing::Span::current();
                let handle = std::thread::Builder::new()
                    .name(format!("emx-poll-{}", cfg.node))
                    .spawn(move || {
                        let _starter = span.entered();
                        poll_thread(
                            driver,
                            shared,
                            producers,
                            clock,
                            core,
                            backoff,
                            max_requests,
                            ready_tx,
                        )
                    })
                    .map_err(|e| Error::Thread(e.to_string()))?;
                ready_rx
                    .recv()
                    .map_err(|_| Error::Thread("polling thread died at start".into()))??;
                engine.thread = Some(handle);
            }
        }
        Ok(engine)
    }

    /// The session epoch of this start (the configured one, or the one
    /// chosen from the clock): peers see a restart as a new epoch.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The address of this engine's first endpoint.
    pub fn local(&self) -> Addr {
        self.locals[0]
    }

    /// The addresses of all its endpoints.
    pub fn locals(&self) -> &[Addr] {
        &self.locals
    }

    /// The first endpoint (the only one, usually), handed out once.
    pub fn endpoint(&mut self) -> Result<Endpoint, Error> {
        self.endpoint_id(self.locals[0].endpoint)
    }

    /// Endpoint number `id` of this node, handed out once.
    pub fn endpoint_id(&mut self, id: u8) -> Result<Endpoint, Error> {
        let Some(ep) = self.locals.iter().position(|a| a.endpoint == id) else {
            return Err(Error::Setup(format!(
                "this engine has no endpoint {id} (it has {:?})",
                self.locals
            )));
        };
        if std::mem::replace(&mut self.taken[ep], true) {
            return Err(Error::EndpointTaken);
        }
        let mode = match self.inline.take() {
            Some(driver) => Mode::Inline(driver),
            None => Mode::Thread(
                self.events
                    .get_mut(ep)
                    .and_then(Option::take)
                    .ok_or(Error::EndpointTaken)?,
            ),
        };
        Ok(Endpoint {
            shared: self.shared.clone(),
            ep,
            closed: false,
            mode,
            requests: Requests::new(self.limits.0, self.limits.1),
            reply: None,
            clock: self.clock,
            local: self.locals[ep],
            eager_spins: Endpoint::THREAD_EAGER_SPINS,
            eager_threshold: self.eager_threshold,
        })
    }

    /// Stops accepting work, lets requests under way (sends, and receives
    /// whose messages are arriving) finish until `deadline` from now,
    /// completes the rest (receives still waiting for a message among them)
    /// with [`Error::ShutDown`], and stops the polling thread, which owns
    /// the link: it closes then, whether endpoints are still held or not.
    ///
    /// Inline, with its endpoint handed out, the endpoint drives the link,
    /// and this returns at once: the endpoint refuses new work from now on,
    /// and its own calls (`test`, `wait`, `progress`) do the rest, requests
    /// under way finishing until the deadline and the others then completing
    /// with [`Error::ShutDown`] (a receive still waiting for a message at
    /// once, when nothing else is under way). Its link closes when the
    /// engine and its endpoint are gone; [`Endpoint::close`] drains it too.
    pub fn shutdown(mut self, deadline: Duration) -> Result<(), Error> {
        self.stop(deadline)
    }

    fn stop(&mut self, deadline: Duration) -> Result<(), Error> {
        let until = after(deadline);
        *self
            .shared
            .drain_until
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(until);
        self.shared.state.store(STOPPING, Ordering::Release);
        // Not left to wait out a back-off sleep (up to `idle_sleep_us`).
        if let Some(t) = self.shared.poller.get() {
            t.unpark();
        }
        let joined = self.thread.take().map(|t| t.join());
        // Stopped whether the thread returned or died: waits on its
        // endpoints end either way (see `Endpoint::wait_until`).
        self.shared.state.store(STOPPED, Ordering::Release);
        for eps in &self.shared.eps {
            eps.wake(true);
        }
        match joined {
            Some(Err(_)) => Err(Error::Thread("polling thread panicked".into())),
            _ => Ok(()),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if self.thread.is_none() && self.inline.is_none() {
            // Inline, with its endpoint handed out: the endpoint drives the
            // link and goes on working (`Engine::start(..)?.endpoint()?`
            // drops the engine at once). `shutdown` or `close` stop it.
            return;
        }
        let _ = self.stop(Duration::ZERO);
    }
}

/// A source that is not a peer, refused as [`Core::post_recv`] refuses it.
fn known_source(core: &super::RuntimeCore, src: Option<Addr>) -> Result<(), RecvError> {
    match src {
        Some(a) if core.peer_id(a).is_none() => Err(RecvError::UnknownPeer),
        _ => Ok(()),
    }
}

/// [`Core::probe`], with a source that is not a peer refused.
fn probe(
    core: &super::RuntimeCore,
    src: Option<Addr>,
    bits: u64,
    mask: u64,
) -> Result<Option<ProbeInfo>, RecvError> {
    known_source(core, src).map(|()| core.probe(src, bits, mask))
}

/// [`Core::mprobe`], with a source that is not a peer refused.
fn mprobe(
    core: &mut super::RuntimeCore,
    src: Option<Addr>,
    bits: u64,
    mask: u64,
) -> Result<Option<(MessageId, ProbeInfo)>, RecvError> {
    known_source(core, src).map(|()| core.mprobe(src, bits, mask))
}

/// The completion of a receive that the core refused on the polling thread
/// (one refused by a core closing as the engine stops ends with `ShutDown`).
fn recv_refused(req: Request, r: Rejected<RecvError, RecvBuf>) -> Event {
    Event::Done {
        req,
        c: Completed {
            buf: Buf::Recv(r.buf),
            result: Err(match r.error {
                RecvError::Closed => Error::ShutDown,
                e => Error::Recv(e),
            }),
        },
    }
}

/// `d` from now. A deadline further off than an `Instant` holds
/// (`Duration::MAX`: no deadline) is a year away, which no drain outlasts.
fn after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 86_400))
}

/// A session epoch from the clock: a restart comes back with a later one.
///
/// The core compares epochs as serial numbers, which order two epochs less
/// than 2^31 apart. In milliseconds that is 24.8 days of an incarnation's
/// life; in the microseconds this used to count, 36 minutes, so that a node
/// restarted after half of all longer lives came back with an epoch that
/// read as older, and its peers took it for a stale frame until the liveness
/// deadline. (Past the window, the same: any new epoch is taken after that
/// silence.) Two engines started within one millisecond in one process get
/// successive epochs, so no two share one. Never 0, which means "unknown".
fn fresh_epoch() -> u32 {
    static LAST: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let clock = clock_epoch(t);
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = if last == 0 || crate::proto::core::epoch_after(clock, last) {
            clock
        } else {
            match last.wrapping_add(1) {
                0 => 1,
                e => e,
            }
        };
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// The epoch of a clock reading `since` the Unix epoch: its milliseconds,
/// modulo 2^32 (never 0).
fn clock_epoch(since: Duration) -> u32 {
    (since.as_millis() as u32).max(1)
}

/// Spin, then yield, then sleep ever longer, while idle.
///
/// The sleeps double from 20 us to `max_sleep_us`
/// ([`EngineConfig::idle_sleep_us`], 1 ms by default): an idle polling
/// thread that woke every 50 us stole its core from the application thread
/// beside it often enough to show in that thread's p99 (31 us instead of
/// 2 us in emx-bench). The price is up to a sleep before the first frame
/// after a long idle period is seen; `spin` avoids it on an isolated core.
struct Backoff {
    idle: u32,
    sleep_us: u64,
    max_sleep_us: u64,
    spin_forever: bool,
}

impl Backoff {
    const SPINS: u32 = 2000;
    const YIELDS: u32 = 100;
    const MIN_SLEEP_US: u64 = *IDLE_SLEEP_US.start();

    /// `max_sleep_us` within [`IDLE_SLEEP_US`] (`Engine::start` checks it).
    fn new(spin_forever: bool, max_sleep_us: u64) -> Backoff {
        debug_assert!(IDLE_SLEEP_US.contains(&max_sleep_us));
        Backoff {
            idle: 0,
            sleep_us: Self::MIN_SLEEP_US,
            max_sleep_us,
            spin_forever,
        }
    }

    fn reset(&mut self) {
        self.idle = 0;
        self.sleep_us = Self::MIN_SLEEP_US;
    }

    /// One idle round; `backlog` is what each endpoint's ring had no room
    /// for.
    fn snooze(
        &mut self,
        shared: &Shared,
        backlog: &[VecDeque<Event>],
        events: &[rtrb::Producer<Event>],
    ) {
        self.idle = self.idle.saturating_add(1);
        if self.spin_forever || self.idle < Self::SPINS {
            std::hint::spin_loop();
        } else if self.idle < Self::SPINS + Self::YIELDS {
            std::thread::yield_now();
        } else {
            // Asleep, but a submitter, or an endpoint that makes room for
            // its backlog, can wake us (see Shared::kick); only frames from
            // the wire wait out the sleep.
            shared.poller_asleep.store(true, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            let nothing_to_do = shared
                .eps
                .iter()
                .zip(backlog)
                .zip(events)
                .all(|((e, b), r)| e.cmds.is_empty() && (b.is_empty() || r.is_full()));
            if nothing_to_do {
                std::thread::park_timeout(Duration::from_micros(self.sleep_us));
            }
            shared.poller_asleep.store(false, Ordering::SeqCst);
            self.sleep_us = (self.sleep_us * 2).min(self.max_sleep_us);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn poll_thread(
    mut driver: Box<dyn Drive>,
    shared: Arc<Shared>,
    mut events: Vec<rtrb::Producer<Event>>,
    clock: Clock,
    core: Option<usize>,
    mut backoff: Backoff,
    max_requests: usize,
    ready: std::sync::mpsc::Sender<Result<(), Error>>,
) {
    if let Some(c) = core {
        // (A cpu set holds CPUs below 1024: core_affinity panics past it.)
        if c >= 1024 || !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
            let _ = ready.send(Err(Error::Setup(format!(
                "cannot pin the polling thread to CPU {c} (not one this process may run on: \
                 see `taskset -p $$` or the container's cpuset); give another core, or none"
            ))));
            return;
        }
    }
    let _reg = match driver.enter_thread() {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(e.into()));
            return;
        }
    };
    let _ = shared.poller.set(std::thread::current());
    let _watch = DeathWatch(shared.clone());
    let _ = ready.send(Ok(()));
    tracing::debug!(
        ?core,
        spin = backoff.spin_forever,
        idle_sleep_us = backoff.max_sleep_us,
        endpoints = shared.eps.len(),
        "polling thread started"
    );
    let n_eps = shared.eps.len();
    // Per endpoint: the core's id of each request, by request slot (for
    // cancel), and the events its ring had no room for (bounded by the
    // requests outstanding, each completing once, plus one reply per control
    // command).
    let mut ids: CoreIds = vec![vec![None; max_requests]; n_eps];
    let mut backlog: Vec<VecDeque<Event>> =
        (0..n_eps).map(|_| VecDeque::with_capacity(BURST)).collect();
    // What each endpoint's `backlogged` flag says (written only on change).
    let mut backlogged = vec![false; n_eps];
    // Endpoints dropped: nobody reads their rings.
    let mut gone = vec![false; n_eps];
    // Stopping: since when every core was closing, and whether they settled.
    let mut cores_closing: Option<Instant> = None;
    let mut stop_settling = Settling::default();
    // Endpoints gone (`Cmd::Close`), until their cores close: since when,
    // and whether their cores settled.
    let mut closing: Vec<Option<(Instant, Settling)>> = vec![None; n_eps];
    let mut n_closing = 0;
    loop {
        let now = clock.now();
        let mut work = 0;
        for (ep, eps) in shared.eps.iter().enumerate() {
            for _ in 0..BURST {
                let Some(cmd) = eps.cmds.pop() else { break };
                work += 1;
                let core = driver.core(ep);
                match cmd {
                    Cmd::Send {
                        req,
                        dst,
                        bits,
                        buf,
                    } => match core.send(now, dst, bits, buf, req.0) {
                        Ok(id) => ids[ep][req.index()] = Some((req, id)),
                        Err(r) => backlog[ep].push_back(Event::Done {
                            req,
                            c: Completed {
                                buf: Buf::Send(r.buf),
                                // (a core closing as the engine stops)
                                result: Err(match r.error {
                                    SendError::Closed => Error::ShutDown,
                                    e => Error::Send(e),
                                }),
                            },
                        }),
                    },
                    Cmd::Recv {
                        req,
                        src,
                        bits,
                        mask,
                        buf,
                    } => match core.post_recv(now, src, bits, mask, buf, req.0) {
                        Ok(id) => ids[ep][req.index()] = Some((req, id)),
                        Err(r) => backlog[ep].push_back(recv_refused(req, r)),
                    },
                    Cmd::MRecv { req, msg, buf } => match core.post_mrecv(now, msg, buf, req.0) {
                        Ok(id) => ids[ep][req.index()] = Some((req, id)),
                        Err(r) => backlog[ep].push_back(recv_refused(req, r)),
                    },
                    Cmd::Cancel { req } => {
                        if let Some((r, id)) = ids[ep][req.index()] {
                            if r == req {
                                let _ = core.cancel(id);
                            }
                        }
                    }
                    Cmd::Probe { src, bits, mask } => {
                        backlog[ep].push_back(Event::Probe(probe(core, src, bits, mask)))
                    }
                    Cmd::MProbe { src, bits, mask } => {
                        backlog[ep].push_back(Event::MProbe(mprobe(core, src, bits, mask)))
                    }
                    Cmd::AddPeer { addr, mac } => {
                        let r = core
                            .add_peer(addr, MacAddr(mac))
                            .map(|_| ())
                            .map_err(Error::Peer);
                        backlog[ep].push_back(Event::AddPeer(r));
                    }
                    Cmd::Stats { addr } => {
                        let st = core.peer_id(addr).and_then(|p| core.peer_stats(p).copied());
                        backlog[ep].push_back(Event::Stats(Box::new((st, driver.io_stats()))));
                    }
                    Cmd::CoreStats => {
                        backlog[ep].push_back(Event::CoreStats(Box::new(*core.stats())))
                    }
                    Cmd::Peers => backlog[ep].push_back(Event::Peers(peer_status(core, now))),
                    Cmd::InProgress => backlog[ep].push_back(Event::InProgress(core.in_progress())),
                    Cmd::Reconnect { addr } => {
                        backlog[ep].push_back(Event::Reconnect(reconnect(core, now, addr)))
                    }
                    Cmd::Close => {
                        core.begin_close(now);
                        if closing[ep]
                            .replace((Instant::now(), Settling::default()))
                            .is_none()
                        {
                            n_closing += 1;
                        }
                    }
                }
            }
        }
        let p = driver.progress(now, &mut |ep, c| {
            file_completion(&mut ids, &mut backlog, ep, c);
        });
        if n_closing != 0 {
            for (ep, state) in closing.iter_mut().enumerate() {
                let Some((since, settling)) = state else {
                    continue;
                };
                // Closed once it has owed its peers nothing for a moment (its
                // last acknowledgements, the NOTIFYs of its aborted receives,
                // and an answer to a peer whose acknowledgement was lost), or
                // after CLOSE_MAX whatever it owes (a peer that went away).
                // (Frames it built that wait on a full link still go: the
                // driver runs on. The engine's stop, below, waits for them.)
                let core = driver.core(ep);
                if settling.settled(core.owes_nothing()) || since.elapsed() >= CLOSE_MAX {
                    core.close(now);
                    *state = None;
                    n_closing -= 1;
                }
            }
        }
        let mut delivered = false;
        let mut woke_here = false;
        for (ep, eps) in shared.eps.iter().enumerate() {
            // An endpoint dropped (looked at while it closes, or has events
            // waiting): what its ring holds (buffers, lent frames) goes now
            // with the ring, and what comes later as it comes (its aborted
            // requests), rather than at the engine's stop. A new ring of
            // one slot, once, stands in for it.
            if !gone[ep]
                && (closing[ep].is_some() || !backlog[ep].is_empty())
                && events[ep].is_abandoned()
            {
                gone[ep] = true;
                events[ep] = rtrb::RingBuffer::new(1).0;
            }
            if gone[ep] {
                backlog[ep].clear();
                continue;
            }
            if deliver(&mut events[ep], &mut backlog[ep]) {
                // An unpinned thread cannot tell where the woken one will
                // run: the kernel tends to put it on this CPU (see
                // `Shared::kick`).
                woke_here |= eps
                    .wake(false)
                    .is_some_and(|cpu| shared.poller_core.is_none_or(|c| c == cpu));
                delivered = true;
            }
            let left = !backlog[ep].is_empty();
            if left != backlogged[ep] {
                // SeqCst, as the endpoint's load of it: see `Endpoint::progress`.
                eps.backlogged.store(left, Ordering::SeqCst);
                backlogged[ep] = left;
            }
        }
        if woke_here {
            // The thread just woken parked on this CPU, or may run on it: let
            // it run now rather than when this thread's time slice ends.
            std::thread::yield_now();
        }
        if shared.state.load(Ordering::Acquire) != RUNNING {
            let until = shared
                .drain_until
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or_else(Instant::now);
            // Sends, and receives whose messages are arriving, may finish;
            // receives still waiting for a message end then (one that stands
            // for good would hold every stop for its whole deadline): the
            // cores then take no new message (`Core::begin_close`) and go on
            // for a moment after they owe their peers nothing (as an inline
            // close lingers): the acknowledgements of the last messages
            // received wait to be coalesced, and a peer that never got them
            // would fail sends that arrived.
            // (At most CLOSE_MAX for what they owe: a peer that went away
            // never acknowledges.)
            // Each core on its own: one that still drains a send to a slow
            // peer does not keep the others taking messages for nobody.
            // Not while its submission ring holds requests taken before the
            // stop: a closing core would refuse them, sends among them, which
            // the deadline lets finish. (Submissions end with the stop, so
            // the ring empties; one pushed as the stop lands may still find
            // the core closed, and is refused then, as it raced the stop.)
            if cores_closing.is_none() {
                for ep in 0..n_eps {
                    let core = driver.core(ep);
                    if !core.is_closing()
                        && core.in_progress() == 0
                        && shared.eps[ep].cmds.is_empty()
                    {
                        core.begin_close(now);
                    }
                }
                if (0..n_eps).all(|ep| driver.core(ep).is_closing()) {
                    cores_closing = Some(Instant::now());
                }
            }
            let owe_nothing = cores_closing.is_some()
                && driver.tx_backlog() == 0
                && (0..n_eps).all(|ep| driver.core(ep).owes_nothing());
            let quiet = stop_settling.settled(owe_nothing)
                || cores_closing.is_some_and(|t| t.elapsed() >= CLOSE_MAX);
            if quiet || Instant::now() >= until {
                // What is left is aborted: the cores complete every outstanding
                // request with its buffer, and each application learns it
                // through its ring.
                for ep in 0..n_eps {
                    driver.core(ep).abort_all(now);
                }
                let mut aborted = 0;
                driver.progress(now, &mut |ep, c| {
                    aborted += 1;
                    file_completion(&mut ids, &mut backlog, ep, c);
                });
                // Commands still queued will never reach a core: their
                // requests end too. What the rings cannot take waits for
                // each endpoint in its leftover list (it looks once it sees
                // the engine stopped), so nothing is dropped.
                for (ep, eps) in shared.eps.iter().enumerate() {
                    while let Some(cmd) = eps.cmds.pop() {
                        backlog[ep].extend(refused(cmd));
                    }
                    if gone[ep] {
                        backlog[ep].clear();
                        continue;
                    }
                    deliver(&mut events[ep], &mut backlog[ep]);
                    if !backlog[ep].is_empty() {
                        eps.leftover
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .extend(backlog[ep].drain(..));
                    }
                }
                tracing::debug!(aborted, "polling thread stopped");
                return;
            }
        }
        if work == 0 && p.idle() && !delivered {
            backoff.snooze(&shared, &backlog, &events);
        } else {
            backoff.reset();
        }
    }
}

/// A command that will never reach a core (the engine stopped): a send or a
/// receive completes with [`Error::ShutDown`] and its buffer; anything else
/// is dropped (a control call sees the engine stopped).
fn refused(cmd: Cmd) -> Option<Event> {
    let (req, buf) = match cmd {
        Cmd::Send { req, buf, .. } => (req, Buf::Send(buf)),
        Cmd::Recv { req, buf, .. } => (req, Buf::Recv(buf)),
        _ => return None,
    };
    Some(Event::Done {
        req,
        c: Completed {
            buf,
            result: Err(Error::ShutDown),
        },
    })
}

/// Files an event from the polling thread in the endpoint's tables.
fn take_event(requests: &mut Requests, reply: &mut Option<Event>, e: Event) {
    match e {
        Event::Finished(c) => requests.finish(c),
        Event::Done { req, c } => requests.complete(req, c),
        other => *reply = Some(other),
    }
}

/// The polling thread's record of each request's core id, per endpoint.
type CoreIds = Vec<Vec<Option<(Request, crate::proto::RequestId)>>>;

/// Files a completion for its endpoint: forgets the request's core id and
/// queues the event for the endpoint's ring.
fn file_completion(
    ids: &mut CoreIds,
    backlog: &mut [VecDeque<Event>],
    ep: usize,
    c: Completion<SendBuf, RecvBuf>,
) {
    if let Some(slot) = ids[ep].get_mut(request_of(&c).index()) {
        *slot = None;
    }
    backlog[ep].push_back(Event::Finished(c));
}

enum Mode {
    Inline(Box<dyn Drive>),
    /// A polling thread's endpoint, with its end of the completion ring.
    Thread(rtrb::Consumer<Event>),
}

/// Where an application sends and receives. Not `Sync`: one thread at a time
/// uses it (move it to another thread freely).
pub struct Endpoint {
    shared: Arc<Shared>,
    /// This endpoint's index among the engine's (its rings in `shared.eps`).
    ep: usize,
    /// Closed: no new requests.
    closed: bool,
    mode: Mode,
    requests: Requests,
    /// A control reply that arrived while another was awaited.
    reply: Option<Event>,
    clock: Clock,
    local: Addr,
    /// Idle polls the current wait makes on a polling thread's rings before
    /// it parks (see [`Endpoint::idle`]).
    eager_spins: u32,
    /// The core's eager threshold: sends longer than this are rendezvous
    /// ones, which a cancel may withdraw.
    eager_threshold: u64,
}

/// A refused request: why, and the buffer back.
#[derive(Debug)]
pub struct Refused<B> {
    /// Why it was refused.
    pub error: Error,
    /// The buffer, handed back.
    pub buf: B,
}

impl<B> std::fmt::Display for Refused<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<B: std::fmt::Debug> std::error::Error for Refused<B> {}

impl Drop for Endpoint {
    /// An endpoint dropped without [`close`](Endpoint::close) has its
    /// requests aborted: they would otherwise go on for nobody (sends sent
    /// again until their peer gave up, receives taking messages, a shutdown
    /// waiting for them). Its core then closes as with `close`: inline, the
    /// drop drives it until it owes its peers nothing (a few milliseconds;
    /// up to a second while a peer that went away is still owed something),
    /// so that what it received counts as delivered at the senders. (Not
    /// while a panic unwinds: the endpoint's state may be what panicked.)
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        self.send_close();
        if let Mode::Inline(d) = &mut self.mode {
            if !std::thread::panicking() {
                d.core(0).begin_close(self.clock.now());
                self.linger(after(CLOSE_MAX));
            }
        }
    }
}

impl Endpoint {
    /// Idle polls a wait makes on a polling thread's rings before it parks,
    /// unless it runs on the CPU the polling thread is pinned to: then it
    /// parks at once, since its spinning could only hold the polling thread
    /// off that CPU (on 2 CPUs, emx-bench's pinger shares its CPU with its
    /// polling thread, and an 8-byte round trip took 136-215 us, most of it
    /// the pinger spinning before it let the polling thread run).
    const THREAD_EAGER_SPINS: u32 = 2000;

    /// This endpoint's address.
    pub fn local(&self) -> Addr {
        self.local
    }

    /// Hands a command to the polling thread (waking it if it sleeps), or
    /// gives it back when the ring is full.
    #[inline]
    fn push_cmd(&self, cmd: Cmd) -> Result<(), Cmd> {
        self.shared.eps[self.ep].cmds.push(cmd)?;
        self.shared.kick();
        Ok(())
    }

    /// Tells a polling thread this endpoint is gone (`Cmd::Close`): it
    /// aborts what the core holds and closes the core. Not when the thread
    /// has stopped (or died): nothing would read it.
    /// Inline, after its core began to close: drives it until it has owed its
    /// peers nothing for a moment. An inline engine acts only while driven,
    /// and its last acknowledgements (delayed to be coalesced), the NOTIFYs of
    /// its aborted receives, or answers to a peer's late retransmissions would
    /// otherwise never leave, and the peer would end up declaring this
    /// endpoint unreachable with its last sends unfinished. (Its new messages
    /// are refused meanwhile, so they are not counted as activity.) Until
    /// `until` (but long enough for a delayed acknowledgement), and at most
    /// CLOSE_MAX for a peer that went away. A polling thread's core lingers
    /// there (see `Cmd::Close`).
    fn linger(&mut self, until: Instant) {
        let Mode::Inline(d) = &mut self.mode else {
            return;
        };
        let start = Instant::now();
        let ack_delay = d.core(0).config().ack_delay;
        let stop = until.min(start + CLOSE_MAX).max(start + LINGER + ack_delay);
        let mut settling = Settling::default();
        while Instant::now() < stop {
            self.progress();
            let owe_nothing = match &mut self.mode {
                Mode::Inline(d) => d.tx_backlog() == 0 && d.core(0).owes_nothing(),
                Mode::Thread(_) => true,
            };
            if settling.settled(owe_nothing) {
                break;
            }
        }
    }

    /// Inline, once [`Engine::shutdown`] stopped the engine: when the
    /// shutdown's deadline has passed, or only receives waiting for a
    /// message are left, the core stops taking messages and aborts what it
    /// holds (completed with [`Error::ShutDown`]), as [`close`](Self::close)
    /// would. Whether it did so now. Called on idle polls only ([`progress`](Self::progress)),
    /// so under steady traffic the deadline is kept at the first pause.
    fn stop_inline(&mut self) -> bool {
        let Mode::Inline(d) = &mut self.mode else {
            return false;
        };
        if self.closed || self.shared.state.load(Ordering::Acquire) == RUNNING {
            return false;
        }
        let core = d.core(0);
        if core.is_closing() {
            return false;
        }
        let until = *self
            .shared
            .drain_until
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if core.in_progress() == 0 || until.is_none_or(|u| Instant::now() >= u) {
            core.begin_close(self.clock.now());
            return true;
        }
        false
    }

    fn send_close(&mut self) {
        if !matches!(self.mode, Mode::Thread(_))
            || self.shared.state.load(Ordering::Acquire) == STOPPED
        {
            return;
        }
        let t = Instant::now();
        while self.push_cmd(Cmd::Close).is_err() {
            if t.elapsed() >= Duration::from_secs(1)
                || self.shared.state.load(Ordering::Acquire) == STOPPED
            {
                return;
            }
            // The ring is full: make room by taking events.
            if !self.progress() {
                std::thread::yield_now();
            }
        }
    }

    fn running(&self) -> bool {
        !self.closed && self.shared.state.load(Ordering::Acquire) == RUNNING
    }

    /// Why this endpoint takes no new work, if it does not: it was closed,
    /// or its engine is stopping or stopped.
    fn stopped(&self) -> Result<(), Error> {
        if self.running() {
            Ok(())
        } else if self.closed {
            Err(Error::ShutDown)
        } else {
            Err(self.shared.stopped_error())
        }
    }

    /// Starts sending `buf` to `dst` with `match_bits`. Registered buffers
    /// ([`SendBuf::Registered`]) go out without a copy (but for frames shorter
    /// than [`COPY_BELOW`](crate::io::COPY_BELOW), where a copy is cheaper);
    /// ordinary ones are copied into frames. The buffer comes back at completion, which happens
    /// once the receiver took what it wanted of the message (a shorter receive pulls a long
    /// one only that far) and acknowledged every frame. A registered one comes back writable
    /// ([`ExtBuf::as_mut_slice`](dpdk_ffi::ExtBuf::as_mut_slice)) unless other handles share
    /// it, or a copy of one of its frames sent again still waits on a full link: the link is
    /// made to let go of the frames it sent first ([`PacketIo::reclaim`]; a NIC frees them
    /// lazily).
    ///
    /// Inline, what the core refuses (an unknown peer, a message too long, a
    /// peer given up on) comes back here as [`Refused`]; with a polling thread
    /// only what this endpoint refuses does (a full submission ring, a closed
    /// engine, and in both modes as many sends or receives pending as the
    /// core takes, [`SendError::TooManySends`] and [`RecvError::TooManyRecvs`],
    /// or a request table full of completions not yet taken,
    /// [`Error::TooManyRequests`]), and the core's refusals come in the completion
    /// ([`Error::Send`]; [`Error::Recv`] for [`irecv`](Self::irecv), which is
    /// the same), as later failures do.
    ///
    /// Inline, a message with nothing in flight to its peer and nothing
    /// queued ahead of it leaves in this call; one that finds others in
    /// flight waits for the next progress call (`test`, `wait`, `progress`),
    /// where the messages queued by then leave together, small ones packed.
    /// In a one-way stream, the small message that fills a frame's pack
    /// leaves with the pack in this call
    /// ([`Core::send_leaves_now`](crate::proto::Core::send_leaves_now)).
    pub fn isend(
        &mut self,
        dst: Addr,
        match_bits: u64,
        buf: impl Into<SendBuf>,
    ) -> Result<Request, Refused<SendBuf>> {
        let buf = buf.into();
        // (What `cancel` may withdraw.)
        let rndv = buf.as_ref().len() as u64 > self.eager_threshold;
        self.submit(
            (Kind::Send, rndv),
            buf,
            |core, now, buf, ctx| {
                core.send(now, dst, match_bits, buf, ctx)
                    .map_err(|r| (Error::Send(r.error), r.buf))
            },
            |req, buf| Cmd::Send {
                req,
                dst,
                bits: match_bits,
                buf,
            },
            |cmd| match cmd {
                Cmd::Send { buf, .. } => buf,
                _ => unreachable!("the command pushed is the one handed back"),
            },
        )
    }

    /// Posts a receive for a message from `src` (any source when `None`) whose
    /// match bits equal `match_bits` where `mask` has ones. A longer message
    /// is truncated to the buffer (the completion says so and gives the real
    /// length). Received bytes are copied into the buffer.
    pub fn irecv(
        &mut self,
        src: Option<Addr>,
        match_bits: u64,
        mask: u64,
        buf: impl Into<RecvBuf>,
    ) -> Result<Request, Refused<RecvBuf>> {
        self.submit_recv(
            buf.into(),
            |core, now, buf, ctx| core.post_recv(now, src, match_bits, mask, buf, ctx),
            |req, buf| Cmd::Recv {
                req,
                src,
                bits: match_bits,
                mask,
                buf,
            },
        )
    }

    /// [`submit`](Self::submit) for a receive: its buffer must be writable.
    fn submit_recv(
        &mut self,
        mut buf: RecvBuf,
        to_core: impl FnOnce(
            &mut Core<SendBuf, RecvBuf>,
            &mut LazyNow<'_>,
            RecvBuf,
            u64,
        ) -> Result<crate::proto::RequestId, Rejected<RecvError, RecvBuf>>,
        to_cmd: impl FnOnce(Request, RecvBuf) -> Cmd,
    ) -> Result<Request, Refused<RecvBuf>> {
        if !buf.writable() {
            return Err(Refused {
                error: Error::BufferBusy,
                buf,
            });
        }
        self.submit(
            (Kind::Recv, false),
            buf,
            |core, now, buf, ctx| {
                to_core(core, now, buf, ctx).map_err(|r| (Error::Recv(r.error), r.buf))
            },
            to_cmd,
            |cmd| match cmd {
                Cmd::Recv { buf, .. } | Cmd::MRecv { buf, .. } => buf,
                _ => unreachable!("the command pushed is the one handed back"),
            },
        )
    }

    /// Posts a receive that borrows the frame instead of copying (see
    /// [`RecvBuf::Lending`]): a message that fits one frame and arrives after
    /// this call completes with [`RecvBuf::Lent`], read in place from the
    /// port's receive buffer, which goes back to the port when it is dropped.
    /// Other messages up to the eager threshold (those that came packed with
    /// others in one frame among them) come back copied
    /// ([`RecvBuf::Owned`]); longer ones are truncated to it.
    ///
    /// ```no_run
    /// # fn f(ep: &mut emx::runtime::Endpoint) -> Result<(), emx::runtime::Error> {
    /// let req = ep.irecv_lent(None, 0x42, u64::MAX).map_err(|r| r.error)?;
    /// let (msg, info) = ep.wait(req)?.into_recv()?;
    /// assert_eq!(msg.as_ref().len() as u64, info.copied);
    /// drop(msg); // the frame goes back to the port
    /// # Ok(()) }
    /// ```
    pub fn irecv_lent(
        &mut self,
        src: Option<Addr>,
        match_bits: u64,
        mask: u64,
    ) -> Result<Request, Refused<RecvBuf>> {
        self.irecv(src, match_bits, mask, RecvBuf::Lending)
    }

    /// Takes a request slot (of a kind, and whether it is a rendezvous send)
    /// and hands `buf` on: to the core at once (inline) or to the polling
    /// thread through the submission ring. On refusal the slot is given back
    /// and the buffer returned.
    fn submit<B>(
        &mut self,
        (kind, rndv): (Kind, bool),
        buf: B,
        to_core: impl FnOnce(
            &mut Core<SendBuf, RecvBuf>,
            &mut LazyNow<'_>,
            B,
            u64,
        ) -> Result<crate::proto::RequestId, (Error, B)>,
        to_cmd: impl FnOnce(Request, B) -> Cmd,
        from_cmd: impl FnOnce(Cmd) -> B,
    ) -> Result<Request, Refused<B>> {
        if let Err(error) = self.stopped() {
            return Err(Refused { error, buf });
        }
        let req = match self.requests.alloc(kind, rndv) {
            Ok(req) => req,
            Err(error) => return Err(Refused { error, buf }),
        };
        let taken = match &mut self.mode {
            Mode::Inline(d) => {
                // Read only if the core or the flush below needs it.
                let mut now = LazyNow::new(&self.clock);
                let core = d.core(0);
                match to_core(&mut *core, &mut now, buf, req.0) {
                    Ok(id) => {
                        // A message with nothing ahead of it and nothing in
                        // flight leaves now, not at the next progress call:
                        // computing after `isend` does not hold it back.
                        // Others wait for that call and leave together
                        // (packed), or a full frame at a time in a one-way
                        // stream.
                        if !id.is_recv() && core.send_leaves_now(id, &mut now) {
                            d.flush(now.now());
                        }
                        Ok(Some(id))
                    }
                    Err(e) => Err(e),
                }
            }
            Mode::Thread(_) => self
                .push_cmd(to_cmd(req, buf))
                .map(|()| None)
                .map_err(|c| (Error::WouldBlock, from_cmd(c))),
        };
        match taken {
            Ok(core_id) => {
                if let Some(id) = core_id {
                    self.requests.set_core(req, id);
                }
                Ok(req)
            }
            Err((error, buf)) => {
                self.requests.release(req);
                Err(Refused { error, buf })
            }
        }
    }

    /// Makes progress once (inline) or takes what the polling thread
    /// finished; returns whether anything happened.
    pub fn progress(&mut self) -> bool {
        match &mut self.mode {
            Mode::Inline(d) => {
                if !INLINE_CHECKED.with(std::cell::Cell::get) {
                    register_inline_thread(&**d);
                }
                if !d
                    .progress_inline(self.clock.now(), &mut self.requests)
                    .idle()
                {
                    return true;
                }
                // Idle: after `Engine::shutdown`, perhaps time to abort what
                // is left; its completions are taken at once (by a second
                // poll, whose own `stop_inline` finds the core closing).
                self.stop_inline() && {
                    self.progress();
                    true
                }
            }
            Mode::Thread(events) => {
                let eps = &self.shared.eps[self.ep];
                // Read first: once stopped, the polling thread pushes nothing
                // more, so the rings drained below hold all there is. A thread
                // that died pushes nothing either, and marks itself dead before
                // stopped: `test` and `take`, seeing it dead, must find here
                // what it left.
                let stopped = self.shared.died.load(Ordering::Acquire)
                    || self.shared.state.load(Ordering::Acquire) == STOPPED;
                // All that is there, taken as one chunk: one store of the
                // ring's head for the lot.
                let n = events.slots();
                let mut any = n != 0;
                // Not on an empty poll: a chunk stores the head when it is
                // dropped, even an empty one, and the polling thread would
                // lose that line at every look.
                if any {
                    if let Ok(chunk) = events.read_chunk(n) {
                        for e in chunk {
                            take_event(&mut self.requests, &mut self.reply, e);
                        }
                    }
                }
                // Room was made for events the polling thread holds back: wake
                // it if it sleeps. The fence orders the store of the ring's
                // head before this load of the flag, and pairs with the
                // poller's SeqCst store of the flag and its look at the ring
                // before it parks: one of the two sees the other.
                if any && !self.shared.poller_spins {
                    std::sync::atomic::fence(Ordering::SeqCst);
                    if eps.backlogged.load(Ordering::SeqCst) {
                        self.shared.kick();
                    }
                }
                if stopped {
                    // What the stopped thread had no ring room for, and the
                    // commands it never saw (pushed as it stopped).
                    let left = std::mem::take(
                        &mut *eps.leftover.lock().unwrap_or_else(|e| e.into_inner()),
                    );
                    let unseen = std::iter::from_fn(|| eps.cmds.pop()).filter_map(refused);
                    for e in left.into_iter().chain(unseen) {
                        any = true;
                        take_event(&mut self.requests, &mut self.reply, e);
                    }
                }
                any
            }
        }
    }

    /// Whether the request finished, as far as this endpoint knows, without
    /// making progress (as UCX's `ucp_request_check_status`). Inline, nothing
    /// finishes between polls; with a polling thread, what it finished since
    /// the last [`progress`](Self::progress), `test` or wait is seen at the
    /// next one. The handle stays valid.
    ///
    /// A caller that takes completions in order stops at the first that
    /// reads `false`, where [`test`](Self::test) would poll the link, and
    /// messages arriving then could find none of the receives it has yet to
    /// post again; [`take`](Self::take) takes a completion without a poll.
    ///
    /// A request that can no longer finish because the polling thread died
    /// reads as done: [`take`](Self::take) or [`test`](Self::test) then says
    /// how it ended ([`Error::Thread`] for one the thread never finished), so
    /// that a loop of `is_done` and `progress` ends.
    pub fn is_done(&self, req: Request) -> Result<bool, Error> {
        Ok(self.requests.is_done(req)? || self.shared.died.load(Ordering::Acquire))
    }

    /// The request's completion if this endpoint already has it (taking it:
    /// the handle is spent), `None` if not yet: [`test`](Self::test) without
    /// its poll.
    ///
    /// For a caller that serves many requests in turns: it drives the
    /// endpoint once a turn with [`progress`](Self::progress), then takes
    /// what finished. Inline, `test` polls the link on each request it finds
    /// unfinished, so a turn of `test`s over N waiting requests polls N
    /// times, with the receives the first poll finished not yet posted again
    /// (messages arriving meanwhile find none and are stored as unexpected).
    /// With a polling thread, what it finished since the last `progress` is
    /// seen at the next one. A request that can no longer finish because the
    /// polling thread died ends with [`Error::Thread`], as with `test`.
    ///
    /// ```no_run
    /// # fn f(ep: &mut emx::runtime::Endpoint, reqs: &mut Vec<emx::runtime::Request>) -> Result<(), emx::runtime::Error> {
    /// ep.progress();
    /// let mut waiting = Vec::new();
    /// for r in reqs.drain(..) {
    ///     match ep.take(r)? {
    ///         Some(done) => { /* handle it; post a receive again */ let _ = done; }
    ///         None => waiting.push(r),
    ///     }
    /// }
    /// *reqs = waiting;
    /// # Ok(()) }
    /// ```
    pub fn take(&mut self, req: Request) -> Result<Option<Completed>, Error> {
        if let Some(done) = self.requests.take(req)? {
            return Ok(Some(done));
        }
        if !self.shared.died.load(Ordering::Acquire) {
            return Ok(None);
        }
        // The polling thread died: `test`'s poll takes what it left, and
        // reports a request still pending after it as never to finish.
        self.test(req)
    }

    /// The request's completion if it finished (taking it: the handle is
    /// spent), `None` if not yet. Inline, a request not yet finished makes
    /// the endpoint poll the link once; see [`take`](Self::take) for taking
    /// from many requests with one poll.
    pub fn test(&mut self, req: Request) -> Result<Option<Completed>, Error> {
        if !self.requests.is_done(req)? {
            // Read before the rings are: the thread's last completions were
            // pushed before it was marked dead, so this drain takes them.
            let died = self.shared.died.load(Ordering::Acquire);
            self.progress();
            if !self.requests.is_done(req)? {
                if died {
                    // It will never finish: the thread that held it is gone.
                    return Err(self.shared.stopped_error());
                }
                return Ok(None);
            }
        }
        Ok(Some(self.requests.take_done(req)))
    }

    /// The first of `reqs` that finished, taken, with its index; `None` when
    /// none has, after one progress call (MPI's `Testany`). Every handle must
    /// be live, as for [`wait_any`](Self::wait_any); an empty list is `None`.
    pub fn test_any(&mut self, reqs: &[Request]) -> Result<Option<(usize, Completed)>, Error> {
        if let Some(done) = self.take_first_done(reqs)? {
            return Ok(Some(done));
        }
        // Read before the rings are, as in `test`.
        let died = self.shared.died.load(Ordering::Acquire);
        self.progress();
        match self.take_first_done(reqs)? {
            None if died && !reqs.is_empty() => Err(self.shared.stopped_error()),
            done => Ok(done),
        }
    }

    /// Waits for the request to finish (spinning on progress, then parking
    /// when a polling thread does the work).
    pub fn wait(&mut self, req: Request) -> Result<Completed, Error> {
        self.wait_any(std::slice::from_ref(&req)).map(|(_, c)| c)
    }

    /// Waits until one of `reqs` finishes; returns its index and completion.
    /// Every handle must be live: one already taken (or of another endpoint)
    /// is [`Error::UnknownRequest`] wherever it stands among them, and so is
    /// an empty list, which would wait for ever.
    pub fn wait_any(&mut self, reqs: &[Request]) -> Result<(usize, Completed), Error> {
        self.wait_until(reqs, None)
            .map(|c| c.expect("a wait without a timeout ends with a completion"))
    }

    /// Waits for the request to finish, or for `timeout`: `None` when it is
    /// still in flight then (the handle stays valid, to wait on again).
    ///
    /// A bounded wait lets a caller look elsewhere now and then (a control
    /// connection, a stop flag) while its peer is slow or gone, before the
    /// engine's own `peer_timeout` would end the request.
    ///
    /// ```no_run
    /// # fn f(ep: &mut emx::runtime::Endpoint, req: emx::runtime::Request) -> Result<(), emx::runtime::Error> {
    /// use std::time::Duration;
    /// let done = loop {
    ///     if let Some(c) = ep.wait_timeout(req, Duration::from_millis(500))? {
    ///         break c;
    ///     }
    ///     // Still waiting: check whatever else may end the wait.
    /// };
    /// # let _ = done; Ok(()) }
    /// ```
    pub fn wait_timeout(
        &mut self,
        req: Request,
        timeout: Duration,
    ) -> Result<Option<Completed>, Error> {
        let c = self.wait_until(std::slice::from_ref(&req), Some(timeout))?;
        Ok(c.map(|(_, c)| c))
    }

    /// Waits until one of `reqs` finishes, or for `timeout`: `None` when none
    /// has by then. Every handle must be live, as for
    /// [`wait_any`](Self::wait_any).
    pub fn wait_any_timeout(
        &mut self,
        reqs: &[Request],
        timeout: Duration,
    ) -> Result<Option<(usize, Completed)>, Error> {
        self.wait_until(reqs, Some(timeout))
    }

    /// The waits: until one of `reqs` finishes, or for at least `timeout`.
    fn wait_until(
        &mut self,
        reqs: &[Request],
        timeout: Option<Duration>,
    ) -> Result<Option<(usize, Completed)>, Error> {
        /// Loops between two reads of the clock in a bounded wait. The first
        /// read starts the timeout, so that a wait that ends within a few
        /// microseconds (the usual one) reads no clock at all.
        const CLOCK_EVERY: u32 = 256;
        let mut spins = 0u32;
        let mut polls = 0u32;
        let mut deadline = None;
        if reqs.is_empty() {
            // Nothing to wait for would never end.
            return Err(Error::UnknownRequest);
        }
        if timeout == Some(Duration::ZERO) {
            // A look, not a wait (it used to poll some 500 times first).
            return self.test_any(reqs);
        }
        loop {
            if let Some(done) = self.take_first_done(reqs)? {
                return Ok(Some(done));
            }
            if let Some(t) = timeout {
                polls = polls.wrapping_add(1);
                // A parked wait sleeps between polls: read the clock each time.
                let parks = matches!(self.mode, Mode::Thread(_)) && spins >= self.eager_spins;
                if polls % CLOCK_EVERY == 0 || parks {
                    let now = self.clock.now();
                    match deadline {
                        None => deadline = Some(now + t),
                        Some(d) if now >= d => return Ok(None),
                        Some(_) => {}
                    }
                }
            }
            if self.progress() {
                spins = 0;
                continue;
            }
            if matches!(self.mode, Mode::Thread(_))
                && self.shared.state.load(Ordering::Acquire) == STOPPED
            {
                // The polling thread is gone: this progress call takes all it
                // left. A request still pending after it died with the thread.
                self.progress();
                return match self.take_first_done(reqs)? {
                    Some(done) => Ok(Some(done)),
                    None => Err(self.shared.stopped_error()),
                };
            }
            self.idle(&mut spins);
        }
    }

    /// The first of `reqs` that finished, taken. Each is looked at, so that a
    /// spent handle is an error wherever it stands (not only before the
    /// first that finished).
    fn take_first_done(&mut self, reqs: &[Request]) -> Result<Option<(usize, Completed)>, Error> {
        let mut first = None;
        for (i, r) in reqs.iter().enumerate() {
            if self.requests.is_done(*r)? && first.is_none() {
                first = Some(i);
            }
        }
        Ok(first.map(|i| (i, self.requests.take_done(reqs[i]))))
    }

    fn idle(&mut self, spins: &mut u32) {
        /// Idle polls an inline wait makes back to back before it pauses
        /// between them (a few microseconds' worth).
        const INLINE_EAGER_SPINS: u32 = 128;
        *spins = spins.saturating_add(1);
        match &mut self.mode {
            // No pause while a reply may be a round trip away (a pause is
            // about 30 ns on the development VM, most of an idle poll): a
            // frame that lands just after a poll waits for the next one.
            Mode::Inline(_) if *spins < INLINE_EAGER_SPINS => {}
            Mode::Inline(_) => std::hint::spin_loop(),
            Mode::Thread(events) => {
                if *spins == 1 {
                    // The first idle poll of this wait, or since its last
                    // event: spin first, unless on the polling thread's CPU.
                    let here = dpdk_ffi::current_cpu();
                    self.eager_spins = if here.is_some() && here == self.shared.poller_core {
                        0
                    } else {
                        Self::THREAD_EAGER_SPINS
                    };
                }
                if *spins < self.eager_spins {
                    std::hint::spin_loop();
                    return;
                }
                *self.shared.eps[self.ep]
                    .waiter
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
                self.shared.eps[self.ep].waiter_cpu.store(
                    dpdk_ffi::current_cpu().unwrap_or(usize::MAX),
                    Ordering::Relaxed,
                );
                self.shared.eps[self.ep]
                    .waiting
                    .store(true, Ordering::SeqCst);
                // Pairs with the fence in `EpShared::wake`: either the poller
                // sees this waiting, or this sees its event (a release store
                // followed by a load may pass it, and both would miss).
                std::sync::atomic::fence(Ordering::SeqCst);
                if events.is_empty() && self.shared.state.load(Ordering::Acquire) != STOPPED {
                    std::thread::park_timeout(Duration::from_millis(1));
                }
                self.shared.eps[self.ep]
                    .waiting
                    .store(false, Ordering::Release);
            }
        }
    }

    /// Sends and waits for completion; the buffer comes back when the send
    /// succeeds. On an error it is dropped (a registered one's handle with
    /// it): to keep it, use [`isend`](Self::isend), whose [`Refused`] and
    /// completion hand it back either way.
    pub fn send(
        &mut self,
        dst: Addr,
        match_bits: u64,
        buf: impl Into<SendBuf>,
    ) -> Result<SendBuf, Error> {
        let req = self.isend(dst, match_bits, buf).map_err(|r| r.error)?;
        self.wait(req)?.into_send()
    }

    /// Receives and waits for completion; the buffer comes back when the
    /// receive succeeds (a truncated message counts: see
    /// [`RecvInfo::truncated`](crate::proto::RecvInfo)), and is dropped on an
    /// error, as with [`send`](Self::send).
    pub fn recv(
        &mut self,
        src: Option<Addr>,
        match_bits: u64,
        mask: u64,
        buf: impl Into<RecvBuf>,
    ) -> Result<(RecvBuf, crate::proto::RecvInfo), Error> {
        let req = self
            .irecv(src, match_bits, mask, buf)
            .map_err(|r| r.error)?;
        self.wait(req)?.into_recv()
    }

    /// Cancels a request its peer has not taken yet; it then completes with
    /// `Cancelled` ([`Error::is_cancelled`]). A posted receive that has not
    /// matched is cancelled at once. A rendezvous send (longer than the eager
    /// threshold) whose receiver has not started pulling it is withdrawn: its
    /// receiver drops the message if no receive took it yet, and says so, a
    /// round trip later; if a receive took it first, the send goes on and
    /// succeeds (see [`Core::cancel`](crate::proto::Core::cancel)). An eager
    /// send cannot be cancelled: it is its receiver's once it left.
    ///
    /// Returns whether it could still be cancelled (inline: `true` for a send
    /// means its withdrawal started) or the cancel was handed on (polling
    /// thread); `false` in both modes for an eager send and for a request
    /// that finished already, and inline for a receive that matched and a
    /// send that was pulled from or whose cancel was asked before. With a
    /// polling thread, `true` says only that the cancel was queued (the
    /// receive may match before the thread sees it, the send's receiver may
    /// pull it first, or the engine may stop); the completion says what came
    /// of it.
    pub fn cancel(&mut self, req: Request) -> Result<bool, Error> {
        if self.requests.is_done(req)? || self.requests.is_eager_send(req) {
            return Ok(false);
        }
        match &mut self.mode {
            Mode::Inline(d) => {
                let Some(id) = self.requests.core_id(req) else {
                    return Ok(false);
                };
                Ok(d.core(0).cancel(id))
            }
            Mode::Thread(_) => self
                .push_cmd(Cmd::Cancel { req })
                .map(|()| true)
                .map_err(|_| Error::WouldBlock),
        }
    }

    fn control(&mut self, cmd: Cmd) -> Result<Event, Error> {
        if self.shared.state.load(Ordering::Acquire) != RUNNING {
            // Nobody would answer (and a late reply to an earlier call must
            // not pass for this one's).
            return Err(self.shared.stopped_error());
        }
        self.push_cmd(cmd).map_err(|_| Error::WouldBlock)?;
        let mut spins = 0;
        loop {
            self.progress();
            if let Some(e) = self.reply.take() {
                return Ok(e);
            }
            if self.shared.state.load(Ordering::Acquire) == STOPPED {
                return Err(self.shared.stopped_error());
            }
            self.idle(&mut spins);
        }
    }

    /// The envelope of the first unexpected message that a receive with these
    /// arguments would match, without receiving it. It does not wait: `None`
    /// when no such message has arrived (MPI's `Iprobe`). A source that is not
    /// a peer is refused as [`irecv`](Self::irecv) refuses it
    /// ([`RecvError::UnknownPeer`]).
    pub fn probe(
        &mut self,
        src: Option<Addr>,
        match_bits: u64,
        mask: u64,
    ) -> Result<Option<ProbeInfo>, Error> {
        match &mut self.mode {
            Mode::Inline(_) => {
                // Frames waiting in the link may hold the message probed for.
                self.progress();
                let Mode::Inline(d) = &mut self.mode else {
                    unreachable!("matched above")
                };
                probe(d.core(0), src, match_bits, mask).map_err(Error::Recv)
            }
            Mode::Thread(_) => match self.control(Cmd::Probe {
                src,
                bits: match_bits,
                mask,
            })? {
                Event::Probe(p) => p.map_err(Error::Recv),
                _ => Err(Error::WrongKind),
            },
        }
    }

    /// [`probe`](Self::probe) until such a message has arrived, or for
    /// `timeout` (`Duration::MAX`: no limit, MPI's blocking `Probe`):
    /// `None` when none came by then. It takes nothing: a receive with the
    /// same arguments then takes this message, unless another takes it
    /// first (an earlier receive that matches it too).
    ///
    /// ```
    /// # use emx::io::{MemNetwork, PacketIo};
    /// # use emx::proto::Addr;
    /// # use emx::runtime::{Engine, EngineConfig, PeerConfig, ProgressMode};
    /// # use std::time::Duration;
    /// # let (link_a, link_b) = MemNetwork::pair(1500);
    /// # let peer = |node, mac| PeerConfig { node, endpoint: 0, mac };
    /// // The sender's engine on a polling thread: it goes on while this
    /// // thread waits in B's probe.
    /// let thread = ProgressMode::Thread { core: None, spin: false };
    /// # let cfg_a = EngineConfig { peers: vec![peer(2, link_b.mac())], progress: thread, ..EngineConfig::new(1) };
    /// # let cfg_b = EngineConfig { peers: vec![peer(1, link_a.mac())], ..EngineConfig::new(2) };
    /// # let (mut ea, mut eb) = (Engine::start(&cfg_a, link_a)?, Engine::start(&cfg_b, link_b)?);
    /// # let (mut a, mut b) = (ea.endpoint()?, eb.endpoint()?);
    /// a.isend(Addr::new(2, 0), 7, vec![1u8; 300]).map_err(|r| r.error)?;
    /// // A message of a size not known in advance: probe, then receive it whole.
    /// let p = b.probe_timeout(None, 7, !0, Duration::from_secs(5))?.expect("it came");
    /// let (buf, info) = b.recv(Some(p.src), p.match_bits, !0, vec![0u8; p.len as usize])?;
    /// assert!(!info.truncated && buf.as_ref() == &[1u8; 300][..]);
    /// # Ok::<(), emx::runtime::Error>(())
    /// ```
    pub fn probe_timeout(
        &mut self,
        src: Option<Addr>,
        match_bits: u64,
        mask: u64,
        timeout: Duration,
    ) -> Result<Option<ProbeInfo>, Error> {
        self.until_some(timeout, |ep| ep.probe(src, match_bits, mask))
    }

    /// Calls `look` until it finds something, or for `timeout`. (Inline,
    /// a probe polls the link; with a polling thread it asks the thread, and
    /// a park between asks is at most 1 ms.)
    fn until_some<T>(
        &mut self,
        timeout: Duration,
        mut look: impl FnMut(&mut Self) -> Result<Option<T>, Error>,
    ) -> Result<Option<T>, Error> {
        let until = after(timeout);
        let mut spins = 0;
        loop {
            if let Some(found) = look(self)? {
                return Ok(Some(found));
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            self.idle(&mut spins);
        }
    }

    /// A matched probe (MPI's `Improbe`): takes the first unexpected message
    /// that a receive with these arguments would match, so that no receive
    /// matches it any more, and gives its handle, which
    /// [`imrecv`](Self::imrecv) receives. It does not wait: `None` when no
    /// such message has arrived. Unlike [`probe`](Self::probe) then
    /// [`irecv`](Self::irecv), nothing can take the message in between (an
    /// earlier receive that matches it too, or another thread's), so a
    /// buffer sized by its length gets exactly it. A source that is not a
    /// peer is refused ([`RecvError::UnknownPeer`]).
    ///
    /// The message may still be arriving; its sender's failure before it
    /// came whole fails the receive posted for it. See [`Message`] for what
    /// it holds until then.
    pub fn mprobe(
        &mut self,
        src: Option<Addr>,
        match_bits: u64,
        mask: u64,
    ) -> Result<Option<Message>, Error> {
        self.stopped()?;
        let table = self.requests.table();
        let found = match &mut self.mode {
            Mode::Inline(_) => {
                // Frames waiting in the link may hold the message probed for.
                self.progress();
                let Mode::Inline(d) = &mut self.mode else {
                    unreachable!("matched above")
                };
                mprobe(d.core(0), src, match_bits, mask).map_err(Error::Recv)?
            }
            Mode::Thread(_) => match self.control(Cmd::MProbe {
                src,
                bits: match_bits,
                mask,
            })? {
                Event::MProbe(p) => p.map_err(Error::Recv)?,
                _ => return Err(Error::WrongKind),
            },
        };
        Ok(found.map(|(id, info)| Message { id, table, info }))
    }

    /// [`mprobe`](Self::mprobe) until such a message has arrived, or for
    /// `timeout` (`Duration::MAX`: no limit, MPI's blocking `Mprobe`):
    /// `None` when none came by then.
    ///
    /// ```
    /// # use emx::io::{MemNetwork, PacketIo};
    /// # use emx::proto::Addr;
    /// # use emx::runtime::{Engine, EngineConfig, PeerConfig, ProgressMode};
    /// # use std::time::Duration;
    /// # let (link_a, link_b) = MemNetwork::pair(1500);
    /// # let peer = |node, mac| PeerConfig { node, endpoint: 0, mac };
    /// # let thread = ProgressMode::Thread { core: None, spin: false };
    /// # let cfg_a = EngineConfig { peers: vec![peer(2, link_b.mac())], progress: thread, ..EngineConfig::new(1) };
    /// # let cfg_b = EngineConfig { peers: vec![peer(1, link_a.mac())], ..EngineConfig::new(2) };
    /// # let (mut ea, mut eb) = (Engine::start(&cfg_a, link_a)?, Engine::start(&cfg_b, link_b)?);
    /// # let (mut a, mut b) = (ea.endpoint()?, eb.endpoint()?);
    /// // (The sender's engine has a polling thread: it goes on while B waits.)
    /// a.isend(Addr::new(2, 0), 7, vec![1u8; 300]).map_err(|r| r.error)?;
    /// // A message of a size not known in advance, which no other receive
    /// // can take once it is probed: claim it, then receive it whole.
    /// let m = b.mprobe_timeout(None, 7, !0, Duration::from_secs(5))?.expect("it came");
    /// let (buf, info) = b.mrecv(m, vec![0u8; m.info.len as usize])?;
    /// assert!(!info.truncated && buf.as_ref() == &[1u8; 300][..]);
    /// # Ok::<(), emx::runtime::Error>(())
    /// ```
    pub fn mprobe_timeout(
        &mut self,
        src: Option<Addr>,
        match_bits: u64,
        mask: u64,
        timeout: Duration,
    ) -> Result<Option<Message>, Error> {
        self.until_some(timeout, |ep| ep.mprobe(src, match_bits, mask))
    }

    /// Posts a receive for the message a matched probe took
    /// ([`mprobe`](Self::mprobe)), MPI's `Imrecv`: it completes as an
    /// [`irecv`](Self::irecv) that matched the message would (a longer
    /// message is truncated to the buffer). If the message's sender failed
    /// before all of it came, the receive completes with that failure
    /// ([`Error::is_peer_unreachable`]); a message that had come whole is
    /// received whatever became of its sender.
    ///
    /// A handle received before, or another endpoint's, is refused with
    /// [`RecvError::UnknownMessage`]: another endpoint's in the call; a spent
    /// one inline in the call and with a polling thread in the completion,
    /// as the core's refusals of [`irecv`](Self::irecv) come. On any refusal
    /// the message stays claimed and its handle good.
    pub fn imrecv(
        &mut self,
        msg: Message,
        buf: impl Into<RecvBuf>,
    ) -> Result<Request, Refused<RecvBuf>> {
        let buf = buf.into();
        if msg.table != self.requests.table() {
            return Err(Refused {
                error: Error::Recv(RecvError::UnknownMessage),
                buf,
            });
        }
        self.submit_recv(
            buf,
            |core, now, buf, ctx| core.post_mrecv(now, msg.id, buf, ctx),
            |req, buf| Cmd::MRecv {
                req,
                msg: msg.id,
                buf,
            },
        )
    }

    /// [`imrecv`](Self::imrecv) and a wait for it (MPI's `Mrecv`): the
    /// buffer comes back when the receive succeeds, as with
    /// [`recv`](Self::recv).
    pub fn mrecv(
        &mut self,
        msg: Message,
        buf: impl Into<RecvBuf>,
    ) -> Result<(RecvBuf, crate::proto::RecvInfo), Error> {
        let req = self.imrecv(msg, buf).map_err(|r| r.error)?;
        self.wait(req)?.into_recv()
    }

    /// Adds a peer (its address and MAC). An endpoint of this node is
    /// refused ([`PeerError::SelfAddress`](crate::proto::PeerError)): the
    /// link does not bring frames to the node's own address back.
    pub fn add_peer(&mut self, addr: Addr, mac: [u8; 6]) -> Result<(), Error> {
        if addr.node == self.local.node {
            return Err(Error::Peer(crate::proto::PeerError::SelfAddress));
        }
        match &mut self.mode {
            Mode::Inline(d) => d
                .core(0)
                .add_peer(addr, MacAddr(mac))
                .map(|_| ())
                .map_err(Error::Peer),
            Mode::Thread(_) => match self.control(Cmd::AddPeer { addr, mac })? {
                Event::AddPeer(r) => r,
                _ => Err(Error::WrongKind),
            },
        }
    }

    /// The protocol counters of one peer, and the link's counters.
    pub fn stats(&mut self, peer: Addr) -> Result<(Option<PeerStats>, IoStats), Error> {
        match &mut self.mode {
            Mode::Inline(d) => {
                let core = d.core(0);
                let st = core.peer_id(peer).and_then(|p| core.peer_stats(p).copied());
                Ok((st, d.io_stats()))
            }
            Mode::Thread(_) => match self.control(Cmd::Stats { addr: peer })? {
                Event::Stats(s) => Ok(*s),
                _ => Err(Error::WrongKind),
            },
        }
    }

    /// This endpoint's own counters: its sends and receives completed, the
    /// messages that arrived before a receive was posted for them
    /// ([`unexpected`](CoreStats::unexpected): an eager one is copied into
    /// the unexpected store, and out again when its receive comes), the most
    /// the store held, and the frames dropped before they reached a peer.
    ///
    /// ```no_run
    /// # fn f(ep: &mut emx::runtime::Endpoint) -> Result<(), emx::runtime::Error> {
    /// let st = ep.core_stats()?;
    /// println!("{} of {} receives found their message waiting", st.unexpected, st.recvs_completed);
    /// # Ok(()) }
    /// ```
    pub fn core_stats(&mut self) -> Result<CoreStats, Error> {
        match &mut self.mode {
            Mode::Inline(d) => Ok(*d.core(0).stats()),
            Mode::Thread(_) => match self.control(Cmd::CoreStats)? {
                Event::CoreStats(s) => Ok(*s),
                _ => Err(Error::WrongKind),
            },
        }
    }

    /// Every peer of this endpoint, with its session state and counters.
    pub fn peers(&mut self) -> Result<Vec<PeerStatus>, Error> {
        match &mut self.mode {
            Mode::Inline(d) => Ok(peer_status(d.core(0), self.clock.now())),
            Mode::Thread(_) => match self.control(Cmd::Peers)? {
                Event::Peers(v) => Ok(v),
                _ => Err(Error::WrongKind),
            },
        }
    }

    /// Tries again with a peer declared unreachable (after a partition healed,
    /// say): requests naming it are accepted again and a HELLO goes out. Both
    /// sides start a new session: the peer fails what it still had in flight to
    /// this endpoint as if it had restarted. Post a receive naming the peer to
    /// keep greeting it until it answers; it is declared unreachable again if it
    /// stays silent past the liveness deadline. Returns whether it was
    /// unreachable (false for a live peer, or an address that is no peer here).
    pub fn reconnect(&mut self, peer: Addr) -> Result<bool, Error> {
        match &mut self.mode {
            Mode::Inline(d) => Ok(reconnect(d.core(0), self.clock.now(), peer)),
            Mode::Thread(_) => match self.control(Cmd::Reconnect { addr: peer })? {
                Event::Reconnect(r) => Ok(r),
                _ => Err(Error::WrongKind),
            },
        }
    }

    /// Closes the endpoint: no new requests; those under way (sends, and
    /// receives whose messages are arriving) get until `deadline` to finish;
    /// the rest (receives still waiting for a message among them) are aborted
    /// (they complete with [`Error::ShutDown`]). Every completion, with its
    /// buffer, is in the report, but for requests of a polling thread that
    /// does not answer within a second, or died ([`ShutdownReport::lost`]).
    /// Then the endpoint is gone to its peers, as if its process had ended:
    /// its core takes no new message ([`Core::begin_close`]) and goes on only
    /// until it has owed its peers nothing for a moment (acknowledgements,
    /// the NOTIFYs of aborted receives; at most a second), which an inline
    /// close waits for; a polling thread's core then answers nothing
    /// ([`Core::close`]). A peer's sends to it fail
    /// ([`RequestError::PeerUnreachable`](crate::proto::RequestError)) once
    /// the peer gives it up. Other endpoints of the engine are not affected.
    /// The link closes when the polling thread stops
    /// ([`Engine::shutdown`], or the engine dropped), or inline when the
    /// engine and its endpoint are gone.
    pub fn close(mut self, deadline: Duration) -> ShutdownReport {
        self.closed = true;
        // Finished ones not yet taken too: their buffers come back in the
        // report rather than go down with the endpoint.
        let pending: Vec<Request> = self.requests.live().collect();
        let mut spins = 0;
        let until = after(deadline);
        let drained = |r: &Requests| pending.iter().all(|&q| r.is_done(q).unwrap_or(true));
        let died = |sh: &Shared| sh.died.load(Ordering::Acquire);
        let mut asked_at = Instant::now();
        while Instant::now() < until && !drained(&self.requests) {
            // Only receives waiting for a message left: they may wait for good.
            let idle = match &mut self.mode {
                Mode::Inline(d) => d.core(0).in_progress() == 0,
                // (asked of the polling thread now and then, not every turn)
                Mode::Thread(_) if asked_at.elapsed() >= Duration::from_millis(1) => {
                    asked_at = Instant::now();
                    matches!(self.control(Cmd::InProgress), Ok(Event::InProgress(0)))
                }
                Mode::Thread(_) => false,
            };
            if idle {
                break;
            }
            if died(&self.shared) {
                // Nothing more will finish: take what the thread left.
                self.progress();
                break;
            }
            if !self.progress() {
                self.idle(&mut spins);
            }
        }
        // The core stops taking messages and aborts what is left; a polling
        // thread's closes once it owes its peers nothing, so that they find
        // the endpoint gone (see `Cmd::Close`).
        self.send_close();
        if let Mode::Inline(d) = &mut self.mode {
            d.core(0).begin_close(self.clock.now());
        }
        if !drained(&self.requests) && !died(&self.shared) {
            // Aborted requests complete at once (inline) or within a round of
            // the polling thread; bounded in case the thread is gone.
            let t = Instant::now();
            while !drained(&self.requests) && t.elapsed() < Duration::from_secs(1) {
                if !self.progress() {
                    self.idle(&mut spins);
                }
            }
        }
        self.linger(until);
        let mut report = ShutdownReport::default();
        for r in pending {
            match self.requests.take(r) {
                Ok(Some(c)) => {
                    if matches!(c.result, Err(Error::ShutDown)) {
                        report.aborted += 1;
                    } else {
                        report.drained += 1;
                    }
                    report.completed.push((r, c));
                }
                _ => report.lost += 1,
            }
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::{clock_epoch, deliver, fresh_epoch, Event};
    use crate::proto::core::epoch_after;
    use std::collections::VecDeque;
    use std::time::Duration;

    /// A node restarted after any life up to 24 days comes back with an
    /// epoch that reads as later than its last (in microseconds, one that
    /// lived 40 minutes came back older); two starts in a row in one process
    /// never share one.
    #[test]
    fn a_restart_reads_as_later() {
        let t = Duration::from_secs(1_790_000_000);
        for life in [1, 60, 40 * 60, 36 * 3600, 24 * 86_400] {
            let later = t + Duration::from_secs(life);
            assert!(epoch_after(clock_epoch(later), clock_epoch(t)), "{life} s");
        }
        let (a, b) = (fresh_epoch(), fresh_epoch());
        assert!(epoch_after(b, a) && a != 0 && b != 0, "{a} then {b}");
    }

    fn counts(c: &mut rtrb::Consumer<Event>) -> Vec<usize> {
        std::iter::from_fn(|| c.pop().ok())
            .map(|e| match e {
                Event::InProgress(n) => n,
                _ => unreachable!("only InProgress events were pushed"),
            })
            .collect()
    }

    /// Events go to the completion ring in order, as many as it has room
    /// for; the rest stay in the backlog, in order, for the next delivery,
    /// also when a delivery wraps around the ring's end.
    #[test]
    fn delivery_fills_the_ring_and_keeps_the_rest_in_order() {
        let (mut p, mut c) = rtrb::RingBuffer::new(4);
        let mut backlog: VecDeque<Event> = (0..6).map(Event::InProgress).collect();
        assert!(deliver(&mut p, &mut backlog));
        assert_eq!(backlog.len(), 2);
        assert!(!deliver(&mut p, &mut backlog), "a full ring takes nothing");
        assert_eq!(counts(&mut c), [0, 1, 2, 3]);
        assert!(deliver(&mut p, &mut backlog));
        assert!(backlog.is_empty());
        assert!(!deliver(&mut p, &mut backlog), "nothing to deliver");
        assert_eq!(counts(&mut c), [4, 5]);
        // Slots 2, 3, then 0: one chunk across the end.
        backlog.extend((6..9).map(Event::InProgress));
        assert!(deliver(&mut p, &mut backlog));
        assert!(backlog.is_empty());
        assert_eq!(counts(&mut c), [6, 7, 8]);
    }
}
