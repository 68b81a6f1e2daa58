//! One benchmark session: a link (see [`crate::link`]), the pinger on the
//! calling thread (side A) and an echo thread (side B), pinned to different
//! cores where there are two. The echo thread is told what to do through a
//! small control block: each command has a generation, which also serves as
//! the match bits of its emx messages, so that nothing of one measurement can
//! be mistaken for the next.
//!
//! Transports on the link:
//! - `raw`: DPDK frames with no protocol, through `dpdk-ffi`'s safe types. A
//!   message of n bytes is as many MTU-sized frames as it needs, each
//!   stamped with the iteration, so that a lost frame costs a retry, not a
//!   hang. The floor of the link.
//! - `ffi`: the one-frame raw ping-pong written against the bindings
//!   directly, to check what the safe types cost.
//! - `emx`: emx messages, inline progress on both sides; `emx-thread`: the
//!   pinger's engine runs a polling thread and is reached through its rings.
//!   emx buffers come from registered memory, so that sends are zero-copy.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dpdk_ffi::{Burst, Eal, ExtMem, HugepageMode, Mbuf, Mempool, RxQueue, TxQueue};
use emx::proto::{Addr, PeerStats};
use emx::runtime::{Completed, Endpoint, ProgressMode, Request};
use hdrhistogram::Histogram;

use crate::chans::{channel, Chans};
use crate::link::{End, Link, LinkKind, SideSpec, EMX_THREAD, RAW};
use crate::raw::{self, Patience};
use crate::report::{Arrivals, Protocol};

use crate::raw::RAW_ETHERTYPE;
/// Raw frame header: Ethernet, then iteration and frame index.
const RAW_HDR: usize = 14 + 8;
/// Bytes of registered memory per side.
pub(crate) const REGION: usize = 80 << 20;

/// Whether a stream of `depth` messages of `size` bytes in flight fits a
/// side's registered memory: a buffer each for the sends and the receives.
pub(crate) fn window_fits(depth: usize, size: usize) -> bool {
    depth.saturating_mul(size).saturating_mul(2) <= REGION
}
const PINGER: Addr = Addr::new(1, 0);
const ECHO: Addr = Addr::new(2, 0);
/// The echo thread's own word for "stopped while it waited".
const STOPPED: &str = "stopped";

/// A transport measured on the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// DPDK frames, no protocol: the floor of the link.
    Raw,
    /// One-frame raw ping-pong on the bindings directly (latency only).
    Ffi,
    /// emx, inline progress.
    Emx,
    /// emx, the pinger's engine on a polling thread, reached through rings.
    EmxThread,
    /// Kernel UDP sockets between the namespaces (veth link only).
    Udp,
    /// Kernel TCP sockets between the namespaces (veth link only).
    Tcp,
}

impl Transport {
    /// Its name in tables.
    pub fn label(self) -> &'static str {
        match self {
            Transport::Raw => "raw",
            Transport::Ffi => "ffi",
            Transport::Emx => "emx",
            Transport::EmxThread => "emx-thread",
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }

    /// Whether it is emx (inline or threaded).
    pub fn is_emx(self) -> bool {
        matches!(self, Transport::Emx | Transport::EmxThread)
    }
}

/// Where a stream's sends take their data from.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum SendBuffers {
    /// A registered buffer per message in flight: each send reads memory
    /// that the sends before it did not, as an application streaming fresh
    /// data does.
    #[default]
    Multiple,
    /// One registered buffer in every send in flight (a handle each, from
    /// `ExtBuf::share`): the data stays in cache, as raw's recycled frames
    /// do, and as OSU's `osu_bw` sends by default (`-b single`). Receives
    /// still take a buffer each.
    Single,
}

/// What the echo thread does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Cmd {
    /// Keep the emx endpoints answering (acknowledgements).
    Idle,
    /// Sleep, leaving the core to others (kernel baselines).
    Pause,
    Stop,
    /// Close every channel and drain the shared queue pair.
    Close,
    /// Open channel `chan` (see [`crate::link::RAW`]).
    Open {
        chan: usize,
    },
    /// Echo raw messages of `size` bytes, `per` bytes to a frame: each
    /// message back whole, in frames of the lengths it came in.
    RawPong {
        size: usize,
        per: usize,
    },
    /// Echo one frame at a time on the bindings.
    FfiPong,
    /// Echo emx messages of `size` bytes on endpoint `ep`.
    EmxPong {
        ep: usize,
        size: usize,
    },
    /// Count raw frames, measuring from `warmup_us` after the first; when
    /// `back` is given, stream messages of that size back, in frames of
    /// at most `per` bytes (see [`MsgFrames`]).
    RawSink {
        back: Option<(usize, usize)>,
        warmup_us: u64,
    },
    /// Count emx messages of `size`, measuring from `warmup_us` after the
    /// first; `depth` receives posted; when `back`, stream messages of `size`
    /// back with `depth` in flight, sent from `sends`.
    EmxSink {
        ep: usize,
        size: usize,
        depth: usize,
        back: bool,
        sends: SendBuffers,
        warmup_us: u64,
    },
}

/// `us` microseconds in TSC ticks, at `hz` ticks a second: the pinger's
/// and the echo's warm-up alike.
fn ticks(us: u64, hz: f64) -> u64 {
    (us as f64 * hz / 1e6) as u64
}

/// What a stream's receiver counts. A rate over n arrivals spans n - 1
/// gaps, so the arrival that starts the clock is timed, not counted. The
/// clock starts at the first arrival once the warm-up is over (`warmup`
/// after the very first), or at the very first when the stream ended within
/// its warm-up or so soon after it that what came later is under a quarter
/// of the arrivals (a stream cut short by `--iters`, or slowed down by a
/// busy machine): a burst or two after the warm-up times nothing, and of a
/// raw stream may not even hold one message's frames.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tally {
    /// Everything that arrived, warm-up included (a drain waits for it all),
    /// and its bytes.
    pub arrived: u64,
    pub arrived_bytes: u64,
    warm_at: u64,
    all: Span,
    warm: Span,
}

/// Arrivals after the one that started the clock, and when.
#[derive(Clone, Copy, Debug, Default)]
struct Span {
    started: bool,
    first: u64,
    last: u64,
    bytes: u64,
    msgs: u64,
}

impl Span {
    fn note(&mut self, now: u64, n: u64, bytes: u64) {
        if self.started {
            self.msgs += n;
            self.bytes += bytes;
        } else {
            self.started = true;
            self.first = now;
        }
        self.last = now;
    }
}

impl Tally {
    /// `n` messages (or frames) of `bytes` in all arrived at TSC `now`;
    /// measuring starts `warmup` ticks after the first arrival.
    pub(crate) fn note(&mut self, now: u64, n: u64, bytes: u64, warmup: u64) {
        if n == 0 {
            return;
        }
        if self.arrived == 0 {
            self.warm_at = now.saturating_add(warmup);
        }
        self.arrived += n;
        self.arrived_bytes += bytes;
        self.all.note(now, n, bytes);
        if now >= self.warm_at {
            self.warm.note(now, n, bytes);
        }
    }

    /// When the last arrival came (0: none came).
    pub(crate) fn last_arrival(&self) -> u64 {
        self.all.last
    }

    /// What is measured: bytes and messages after the clock started, and the
    /// TSC of its start and of the last arrival.
    pub(crate) fn measured(&self) -> (Stream, u64, u64) {
        let s = if self.warm.msgs > 0 && self.warm.msgs.saturating_mul(4) >= self.all.msgs {
            &self.warm
        } else {
            &self.all
        };
        let stream = Stream {
            bytes: s.bytes,
            msgs: s.msgs,
            secs: 0.0,
        };
        (stream, s.first, s.last)
    }
}

/// What the echo side counted in a stream, on its own clock.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Counters {
    /// Messages (or raw frames) that arrived, warm-up included.
    pub arrived: u64,
    /// What was measured (see [`Tally`]).
    pub bytes: u64,
    pub msgs: u64,
    /// Start of the measured span and last arrival, nanoseconds on the echo
    /// side's clock.
    pub first_ns: f64,
    pub last_ns: f64,
    /// emx messages sent back (bibw), and whether all are done.
    pub sent_back: u64,
    pub back_done: bool,
    /// Of the emx messages that arrived, those that came before their
    /// receive was posted (inline progress only: `None` otherwise).
    #[serde(default)]
    pub unexpected: Option<u64>,
    /// Reliable frames from the pinger that the echo side received twice in
    /// its last emx command, published when it switched to the present one
    /// (`None` when that command was not an emx one). A frame the pinger sent
    /// again that also arrived the first time was not lost.
    #[serde(default)]
    pub duplicates: Option<u64>,
}

/// The control block shared with the echo thread.
pub(crate) struct Ctl {
    gen: AtomicU64,
    cmd: Mutex<Cmd>,
    /// The generation the echo thread runs (it acknowledges a switch).
    running: AtomicU64,
    /// The echo thread, woken by a switch out of [`Cmd::Pause`].
    echo: std::sync::OnceLock<std::thread::Thread>,
    /// What the echo side received in a stream (see [`Tally`]): everything
    /// that arrived; measured bytes and messages, and the TSC of the start of
    /// the measured span and of the last arrival.
    arrived: AtomicU64,
    bytes: AtomicU64,
    msgs: AtomicU64,
    first: AtomicU64,
    last: AtomicU64,
    /// Streams back (bibw) stop when set.
    stop: AtomicBool,
    /// emx messages the echo side sent back in this command, and whether
    /// all of them are done (after `stop`).
    sent_back: AtomicU64,
    back_done: AtomicBool,
    /// Of the emx messages that arrived in this command, those that came
    /// before their receive was posted (`NOT_COUNTED`: not counted).
    unexpected: AtomicU64,
    /// See [`Counters::duplicates`] (`NOT_COUNTED`: none).
    duplicates: AtomicU64,
}

/// Lost round trips in a row that end a latency point with an error: the
/// link, or the echo side, carries nothing back (each costs
/// [`raw::LOST_AFTER`]).
const LOST_IN_A_ROW: u32 = 10;

/// [`Ctl::unexpected`] for a stream whose receiving side is not counted.
const NOT_COUNTED: u64 = u64::MAX;

impl Ctl {
    fn new() -> Arc<Ctl> {
        Arc::new(Ctl {
            gen: AtomicU64::new(0),
            cmd: Mutex::new(Cmd::Idle),
            running: AtomicU64::new(0),
            echo: std::sync::OnceLock::new(),
            arrived: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            msgs: AtomicU64::new(0),
            first: AtomicU64::new(0),
            last: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            sent_back: AtomicU64::new(0),
            back_done: AtomicBool::new(false),
            unexpected: AtomicU64::new(NOT_COUNTED),
            duplicates: AtomicU64::new(NOT_COUNTED),
        })
    }

    /// Hands the echo thread its next command; returns its generation.
    pub(crate) fn switch(&self, cmd: Cmd) -> u64 {
        let gen = {
            let mut c = self.cmd.lock().expect("control lock");
            *c = cmd;
            // (`stop` is cleared by the echo thread as it takes the command:
            // clearing it here could let a stream that was told to stop send
            // again.)
            self.gen.fetch_add(1, Ordering::AcqRel) + 1
        };
        if let Some(t) = self.echo.get() {
            // Paused, it parks until this; woken once the lock it takes
            // first is free.
            t.unpark();
        }
        gen
    }

    /// Whether the echo thread runs command `gen`.
    pub(crate) fn switched(&self, gen: u64) -> bool {
        self.running.load(Ordering::Acquire) == gen
    }

    /// Stops streams back (bibw).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// The stream counters, with TSC ticks turned into nanoseconds.
    pub(crate) fn counters(&self, hz: f64) -> Counters {
        let ns = |t: &AtomicU64| t.load(Ordering::Acquire) as f64 * 1e9 / hz;
        Counters {
            arrived: self.arrived.load(Ordering::Acquire),
            bytes: self.bytes.load(Ordering::Acquire),
            msgs: self.msgs.load(Ordering::Acquire),
            first_ns: ns(&self.first),
            last_ns: ns(&self.last),
            sent_back: self.sent_back.load(Ordering::Acquire),
            back_done: self.back_done.load(Ordering::Acquire),
            unexpected: Some(self.unexpected.load(Ordering::Acquire)).filter(|&u| u != NOT_COUNTED),
            duplicates: Some(self.duplicates.load(Ordering::Acquire)).filter(|&d| d != NOT_COUNTED),
        }
    }

    /// Shows the echo thread's tally to the pinger (`arrived` last: once it
    /// has everything, the rest is final).
    fn publish(&self, t: &Tally) {
        let (m, first, last) = t.measured();
        self.bytes.store(m.bytes, Ordering::Relaxed);
        self.msgs.store(m.msgs, Ordering::Relaxed);
        self.first.store(first, Ordering::Relaxed);
        self.last.store(last, Ordering::Relaxed);
        self.arrived.store(t.arrived, Ordering::Release);
    }
}

/// One measured stream.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stream {
    /// Bytes received (both directions for bibw).
    pub bytes: u64,
    /// Messages received.
    pub msgs: u64,
    /// Seconds from the first to the last arrival.
    pub secs: f64,
}

/// Pacing of one measurement.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Warm-up, not measured.
    pub warmup: Duration,
    /// Measured time.
    pub time: Duration,
    /// At most this many measured iterations (ping-pongs or messages).
    pub max_iters: Option<u64>,
}

impl Pace {
    /// The warm-up in microseconds, as the sink commands carry it.
    fn warmup_us(&self) -> u64 {
        self.warmup.as_micros() as u64
    }

    fn enough(&self, start: Instant, iters: u64) -> bool {
        // At least a few iterations even when one takes longer than `time`.
        (start.elapsed() >= self.time && iters >= 3) || self.max_iters.is_some_and(|m| iters >= m)
    }
}

/// A running session.
pub struct Session {
    /// The link's name.
    pub link_name: String,
    /// Whether the EAL runs on hugepages.
    pub hugepages: bool,
    /// Frame payload limit.
    pub mtu: u16,
    hz: f64,
    cores: Cores,
    control: Control,
    pool: Mempool,
    raw_hdr: [u8; 14],
    chans: Chans,
    /// The last emx measurement's protocol counters (see `take_protocol`).
    protocol: Option<Protocol>,
    /// The last latency measurement's lost round trips (see `take_lost`).
    lost: Option<u64>,
    /// The last raw ping's number (see `next_raw_iter`).
    raw_iter: u32,
    // Dropped last: the namespaces of a veth link go after the ports.
    link: Link,
    _eal: Eal,
}

/// The echo side of the channels `b` (raw on the first, emx on the next
/// two), answering the pinger whose ports have the MACs `a_macs`: a thread
/// pinned to `core`, and the engines it drives.
pub(crate) fn spawn_echo(
    eal: &Eal,
    pool: &Mempool,
    link: &Link,
    b: &[End],
    a_macs: &[[u8; 6]],
    core: Option<core_affinity::CoreId>,
) -> Result<(Arc<Ctl>, EchoThread), String> {
    let ctl = Ctl::new();
    let region = ExtMem::new(eal, REGION).map_err(|e| e.to_string())?;
    let chans = Chans::new(
        b.to_vec(),
        a_macs.to_vec(),
        pool.clone(),
        region,
        ECHO.node,
        PINGER.node,
        [ProgressMode::Inline, ProgressMode::Inline],
        link.shared,
    );
    let (eal, pool, ctl2) = (eal.clone(), pool.clone(), ctl.clone());
    let mut hdr = [0u8; 14];
    hdr[0..6].copy_from_slice(&a_macs[RAW]);
    hdr[6..12].copy_from_slice(&b[RAW].port.mac());
    hdr[12..14].copy_from_slice(&RAW_ETHERTYPE.to_be_bytes());
    let thread = std::thread::Builder::new()
        .name("echo".into())
        .spawn(move || {
            if let Some(c) = core {
                core_affinity::set_for_current(c);
            }
            let _reg = dpdk_ffi::ThreadRegistration::register(&eal).map_err(|e| e.to_string())?;
            Echo {
                ctl: ctl2,
                pool,
                hdr,
                chans,
                hz: dpdk_ffi::tsc_hz(&eal) as f64,
            }
            .run()
        })
        .map_err(|e| e.to_string())?;
    Ok((ctl, thread))
}

/// Waits until the echo thread runs command `gen`, calling `drive` meanwhile.
/// When the thread has stopped, joins it (it is gone afterwards) and returns
/// why it stopped.
pub(crate) fn await_switch(
    ctl: &Ctl,
    gen: u64,
    thread: &mut Option<EchoThread>,
    drive: &mut dyn FnMut(),
) -> Result<(), String> {
    let t = Instant::now();
    while !ctl.switched(gen) {
        check_echo(thread)?;
        drive();
        if t.elapsed() > Duration::from_secs(60) {
            return Err("the echo thread does not answer".into());
        }
        std::thread::yield_now();
    }
    Ok(())
}

/// Whether the echo thread still runs: if it has stopped, joins it (it is
/// gone afterwards) and returns why it stopped.
fn check_echo(thread: &mut Option<EchoThread>) -> Result<(), String> {
    match thread.take() {
        Some(h) if h.is_finished() => Err(match h.join() {
            Ok(Err(e)) => format!("the echo thread stopped: {e}"),
            Ok(Ok(())) => "the echo thread stopped".into(),
            Err(_) => "the echo thread panicked".into(),
        }),
        None => Err("the echo thread stopped".into()),
        h => {
            *thread = h;
            Ok(())
        }
    }
}

/// Waits on the pinger's endpoint `ep` until one of `reqs` finishes,
/// checking now and then that the echo side (`control`) is still there.
fn wait_any(
    ep: &mut Endpoint,
    reqs: &[Request],
    control: &mut Control,
) -> Result<(usize, Completed), String> {
    crate::chans::wait_checked(ep, reqs, &mut || control.check())
}

/// The echo thread.
pub(crate) type EchoThread = std::thread::JoinHandle<Result<(), String>>;

/// Starts the EAL for ports to be opened from `devargs` (a NIC among them is
/// allowed on the PCI bus) and makes the pool their frames come from, for
/// frames of `mtu`: 32767 mbufs of the default size, fewer larger ones for
/// jumbo frames (8191 at MTU 9000), so that the pool's memory stays about
/// the same (71 MiB).
pub(crate) fn start_eal(
    hugepages: HugepageMode,
    mtu: u16,
    devargs: &[&str],
) -> Result<(Eal, Mempool), String> {
    let eal = devargs
        .iter()
        .fold(dpdk_ffi::Eal::builder().hugepages(hugepages), |b, d| {
            b.port(d)
        })
        .init()
        .map_err(|e| match e {
            // (Its settings, here, are an option.)
            dpdk_ffi::Error::NoHugepages(_) => format!("{e} (here: --hugepages auto or never)"),
            e => e.to_string(),
        })?;
    let room = dpdk_ffi::data_room_for_mtu(mtu);
    let mbufs = (32768 * usize::from(dpdk_ffi::DEFAULT_DATA_ROOM) / usize::from(room))
        .next_power_of_two()
        - 1;
    let pool = Mempool::new(&eal, "bench", mbufs as u32, 256, room).map_err(|e| e.to_string())?;
    Ok((eal, pool))
}

/// Where the benchmark's threads run, by the CPU numbers the OS gives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Cores {
    /// The pinger: the thread that measures, and drives its inline engines.
    pub pinger: Option<usize>,
    /// The echo thread (in a `--role server` process, the server's).
    pub echo: Option<usize>,
    /// The polling thread of the pinger's emx-thread engine.
    pub poller: Option<usize>,
}

impl Cores {
    /// The default placement on `allowed` (the CPUs this process may use,
    /// in order): the pinger on the first, the echo on the last, and the
    /// polling thread where [`Cores::poller_for`] puts it: on a CPU of its
    /// own where there are three or more, else beside the pinger.
    /// `core_of` names the physical core of a CPU (see [`physical_core`]).
    pub fn default_for(allowed: &[usize], core_of: &dyn Fn(usize) -> Option<(u32, u32)>) -> Cores {
        match allowed {
            [] => Cores::default(),
            [only] => Cores {
                pinger: Some(*only),
                echo: Some(*only),
                poller: Some(*only),
            },
            [first, .., last] => Cores {
                pinger: Some(*first),
                echo: Some(*last),
                poller: Some(Cores::poller_for(*first, *last, allowed, core_of)),
            },
        }
    }

    /// The polling thread's CPU beside a pinger on `pinger` and an echo on
    /// `echo`: the first of `allowed` on a physical core that neither of
    /// theirs is on (a thread spinning on a hyperthread sibling would take
    /// half of their core, baselines' measurements included), else the
    /// first that is neither of theirs, else the pinger's.
    fn poller_for(
        pinger: usize,
        echo: usize,
        allowed: &[usize],
        core_of: &dyn Fn(usize) -> Option<(u32, u32)>,
    ) -> usize {
        let mut others = allowed
            .iter()
            .copied()
            .filter(|&c| c != pinger && c != echo);
        let taken = [core_of(pinger), core_of(echo)];
        others
            .clone()
            .find(|&c| core_of(c).is_none_or(|k| !taken.contains(&Some(k))))
            .or_else(|| others.next())
            .unwrap_or(pinger)
    }

    /// `--cores PINGER,ECHO[,POLLER]`, each one of `allowed`; without
    /// POLLER, the polling thread goes where [`Cores::poller_for`] puts it.
    pub fn parse(
        spec: &str,
        allowed: &[usize],
        core_of: &dyn Fn(usize) -> Option<(u32, u32)>,
    ) -> Result<Cores, String> {
        let bad = |why: String| {
            format!(
                "--cores {spec}: {why}; give PINGER,ECHO or PINGER,ECHO,POLLER as CPU numbers \
                 this process may use ({})",
                list(allowed)
            )
        };
        let ids = cpu_ids(spec, allowed, &bad)?;
        let (pinger, echo, poller) = match ids[..] {
            [p, e] => (p, e, Cores::poller_for(p, e, allowed, core_of)),
            [p, e, q] => (p, e, q),
            _ => {
                return Err(bad(format!(
                    "{} CPU{} given",
                    ids.len(),
                    if ids.len() == 1 { "" } else { "s" }
                )))
            }
        };
        // The echo thread spins, and so does the pinger on raw's round
        // trips: beside either, a thread waits for the scheduler's time
        // slice. Only a machine of one CPU has no choice.
        if allowed.len() > 1 {
            if echo == pinger {
                return Err(bad(format!(
                    "the pinger and the echo would share CPU {echo}, and both spin"
                )));
            }
            if poller == echo {
                return Err(bad(format!(
                    "the polling thread would share CPU {echo} with the echo, which spins"
                )));
            }
        }
        Ok(Cores {
            pinger: Some(pinger),
            echo: Some(echo),
            poller: Some(poller),
        })
    }

    /// A server's `--cores ECHO`: it runs the echo thread alone (the pinger
    /// and the polling thread are the client's, placed by its `--cores`).
    pub fn parse_echo(spec: &str, allowed: &[usize]) -> Result<Cores, String> {
        let bad = |why: String| {
            format!(
                "--cores {spec}: {why}; a server runs only the echo thread: give its CPU \
                 (--cores ECHO), one this process may use ({}), and place the pinger and \
                 the polling thread with the client's --cores",
                list(allowed)
            )
        };
        match cpu_ids(spec, allowed, &bad)?[..] {
            [echo] => Ok(Cores {
                echo: Some(echo),
                ..Cores::default()
            }),
            ref ids => Err(bad(format!("{} CPUs given", ids.len()))),
        }
    }

    /// Whether the polling thread has a CPU that neither the pinger nor
    /// the echo runs on: it may spin there without taking time from them.
    pub fn poller_alone(&self) -> bool {
        self.poller.is_some() && self.poller != self.pinger && self.poller != self.echo
    }

    /// `: pinger on 0, echo on 15, polling thread on 1` for the table's
    /// first line; empty where nothing was pinned.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (who, cpu) in [
            ("pinger", self.pinger),
            ("echo", self.echo),
            ("polling thread", self.poller),
        ] {
            if let Some(c) = cpu {
                parts.push(format!("{who} on {c}"));
            }
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!(": {}", parts.join(", "))
        }
    }

    /// The pinger's and the echo's CPUs, as the kernel baselines pin them.
    pub fn pair(&self) -> (Option<core_affinity::CoreId>, Option<core_affinity::CoreId>) {
        let id = |c: Option<usize>| c.map(|id| core_affinity::CoreId { id });
        (id(self.pinger), id(self.echo))
    }
}

/// The CPU numbers of a `--cores` list, each one of `allowed`; `bad` words
/// the error.
fn cpu_ids(
    spec: &str,
    allowed: &[usize],
    bad: &dyn Fn(String) -> String,
) -> Result<Vec<usize>, String> {
    let mut ids = Vec::new();
    for part in spec.split(',') {
        let id: usize = part
            .trim()
            .parse()
            .map_err(|_| bad(format!("`{part}` is not a CPU number")))?;
        if !allowed.contains(&id) {
            return Err(bad(format!("CPU {id} is not one this process may use")));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// The physical core of CPU `cpu` (its package and core ids, from sysfs):
/// CPUs that share one are hyperthread siblings. `None` where Linux does
/// not say.
pub fn physical_core(cpu: usize) -> Option<(u32, u32)> {
    let read = |what: &str| -> Option<u32> {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some((read("physical_package_id")?, read("core_id")?))
}

/// The CPUs this process may use, in order.
pub fn allowed_cpus() -> Vec<usize> {
    let mut ids: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort_unstable();
    ids
}

/// `0-3,8` for 0, 1, 2, 3, 8.
fn list(ids: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        out.push(if j == i {
            ids[i].to_string()
        } else {
            format!("{}-{}", ids[i], ids[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// Who runs the echo side.
enum Control {
    /// A thread of this process.
    Local {
        ctl: Arc<Ctl>,
        thread: Option<EchoThread>,
    },
    /// Another process (`--role server`), reached over TCP.
    Remote(crate::remote::Client),
}

impl Control {
    /// An error if the echo side is gone: its thread stopped, or its process
    /// closed the control connection.
    fn check(&mut self) -> Result<(), String> {
        match self {
            Control::Local { thread, .. } => check_echo(thread),
            Control::Remote(c) => c.check(),
        }
    }
}

impl Session {
    /// Starts the EAL, opens the link and starts the echo thread.
    pub fn start(
        kind: LinkKind,
        hugepages: HugepageMode,
        mtu: u16,
        pmd: crate::link::VethPmd,
        devargs: &[String],
        cores: Cores,
    ) -> Result<Session, String> {
        let named: Vec<&str> = devargs.iter().map(String::as_str).collect();
        let (eal, pool) = start_eal(hugepages, mtu, &named)?;
        let link = Link::open(kind, &eal, &pool, mtu, pmd, devargs)?;
        let b: Vec<End> = link.channels.iter().map(|c| c.b.clone()).collect();
        let a_macs: Vec<[u8; 6]> = link.channels.iter().map(|c| c.a.port.mac()).collect();
        let (ctl, thread) = spawn_echo(&eal, &pool, &link, &b, &a_macs, cores.pair().1)?;
        let b_macs: Vec<[u8; 6]> = b.iter().map(|e| e.port.mac()).collect();
        Session::pinger(
            eal,
            pool,
            link,
            &b_macs,
            Control::Local {
                ctl,
                thread: Some(thread),
            },
            cores,
        )
    }

    /// The pinger's side of a link whose other side runs in a `--role
    /// server` process: `link` holds this side's port only.
    pub fn connect(
        hugepages: HugepageMode,
        mtu: u16,
        side: &SideSpec,
        server: &str,
        cores: Cores,
    ) -> Result<Session, String> {
        let (eal, pool) = start_eal(hugepages, mtu, &side.devargs())?;
        // The server opens its port before it listens, so that ours (a
        // memif client, say) finds it.
        let mut client = crate::remote::Client::connect(server)?;
        let link = Link::side(&eal, &pool, mtu, side, false)?;
        let a_macs: Vec<[u8; 6]> = link.channels.iter().map(|c| c.a.port.mac()).collect();
        let b_macs = client.hello(&a_macs, mtu, link.shared)?;
        link.channels[RAW]
            .a
            .port
            .wait_link(Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        // The echo runs in the server's process, where its own --cores say.
        let cores = Cores {
            echo: None,
            ..cores
        };
        Session::pinger(eal, pool, link, &b_macs, Control::Remote(client), cores)
    }

    fn pinger(
        eal: Eal,
        pool: Mempool,
        link: Link,
        b_macs: &[[u8; 6]],
        control: Control,
        cores: Cores,
    ) -> Result<Session, String> {
        if let Some(c) = cores.pair().0 {
            core_affinity::set_for_current(c);
        }
        // The pinger's end of each channel.
        let a: Vec<End> = link.channels.iter().map(|c| c.a.clone()).collect();
        let mut raw_hdr = [0u8; 14];
        raw_hdr[0..6].copy_from_slice(&b_macs[RAW]);
        raw_hdr[6..12].copy_from_slice(&a[RAW].port.mac());
        raw_hdr[12..14].copy_from_slice(&RAW_ETHERTYPE.to_be_bytes());
        let region = ExtMem::new(&eal, REGION).map_err(|e| e.to_string())?;
        // A polling thread with a CPU of its own spins there, as on a
        // dedicated core. One that shares the pinger's (on two CPUs, where
        // the echo thread spins on the other) backs off when idle, and the
        // pinger parks while it waits.
        let thread = ProgressMode::Thread {
            core: cores.poller,
            spin: cores.poller_alone(),
        };
        let chans = Chans::new(
            a,
            b_macs.to_vec(),
            pool.clone(),
            region,
            PINGER.node,
            ECHO.node,
            [ProgressMode::Inline, thread],
            link.shared,
        );
        Ok(Session {
            link_name: link.name.clone(),
            hugepages: eal.uses_hugepages(),
            mtu: link.mtu,
            hz: dpdk_ffi::tsc_hz(&eal) as f64,
            cores,
            control,
            pool,
            raw_hdr,
            chans,
            protocol: None,
            lost: None,
            raw_iter: 0,
            link,
            _eal: eal,
        })
    }

    /// Opens the channel of transport `t` on both sides. On a shared link,
    /// first closes the others on both sides and drains what they left.
    ///
    /// emx-thread's engine is open only for its own turns where its polling
    /// thread has no CPU of its own (see [`Session::close_polling_thread`]).
    fn open(&mut self, t: Transport) -> Result<(), String> {
        let c = channel(t);
        if c != EMX_THREAD {
            self.close_polling_thread()?;
        }
        if self.chans.is_open(c) {
            return Ok(());
        }
        if self.chans.shared {
            self.close_all()?;
        }
        self.command(Cmd::Open { chan: c })?;
        self.chans.open(c)
    }

    /// Closes every channel on both sides, and drains what they left.
    fn close_all(&mut self) -> Result<(), String> {
        self.chans.close_all();
        self.command(Cmd::Close)?;
        // The echo side's closed engines sent their last frames before
        // it answered.
        self.chans.drain()
    }

    /// Closes emx-thread's engine (with the other channels: both sides
    /// close all of theirs) where its polling thread shares a CPU with the
    /// pinger or the echo. Idle between its turns, it woke there up to
    /// 1,000 times a second (its back-off sleeps 1 ms at most) and preempted
    /// the other transports' measurements: on 2 CPUs, inline emx's 8 B round
    /// trip p99.9 read 16-22 us with emx-thread in the run and 2-4.6 us
    /// without (4 alternating pairs; p50 and p99 unmoved).
    fn close_polling_thread(&mut self) -> Result<(), String> {
        if self.cores.poller_alone() || !self.chans.is_open(EMX_THREAD) {
            return Ok(());
        }
        self.close_all()
    }

    /// The veth pair of the kernel baselines (one no DPDK port is on).
    pub fn veth(&self) -> Option<&crate::netns::VethPair> {
        self.link.veth.get(crate::link::KERNEL)
    }

    /// Where the pinger, the echo and the polling thread run.
    pub fn placement(&self) -> Cores {
        self.cores
    }

    /// Runs `f` with the echo thread asleep, so that it leaves its core to
    /// what `f` runs there (the kernel baselines).
    pub fn paused<T>(&mut self, f: impl FnOnce(&Session) -> T) -> Result<T, String> {
        self.close_polling_thread()?;
        self.command(Cmd::Pause)?;
        let r = f(self);
        self.command(Cmd::Idle)?;
        Ok(r)
    }

    /// Tells the echo side what to do next and waits until it does.
    fn command(&mut self, cmd: Cmd) -> Result<u64, String> {
        let chans = &mut self.chans;
        // Keep our engines answering while the echo side finishes the last
        // command (its sends wait for our acknowledgements).
        let mut drive = || chans.progress();
        match &mut self.control {
            Control::Remote(c) => c.command(cmd, &mut drive),
            Control::Local { ctl, thread } => {
                let gen = ctl.switch(cmd);
                await_switch(ctl, gen, thread, &mut drive)?;
                Ok(gen)
            }
        }
    }

    /// Stops the echo side's streams back.
    fn stop_back(&mut self) -> Result<(), String> {
        match &mut self.control {
            Control::Local { ctl, .. } => {
                ctl.stop();
                Ok(())
            }
            Control::Remote(c) => c.stop(),
        }
    }

    /// What the echo side counted.
    fn counters(&mut self) -> Result<Counters, String> {
        match &mut self.control {
            Control::Local { ctl, .. } => Ok(ctl.counters(self.hz)),
            Control::Remote(c) => c.counters(),
        }
    }

    /// Whether the echo side runs on this machine's clock.
    fn same_clock(&self) -> bool {
        matches!(self.control, Control::Local { .. })
    }

    fn ns(&self, ticks: u64) -> f64 {
        ticks as f64 * 1e9 / self.hz
    }

    /// Payload bytes of a raw frame on this link.
    fn raw_per(&self) -> usize {
        usize::from(self.mtu) - 8
    }

    /// Round trips of `size`-byte messages; nanoseconds in a histogram.
    pub fn latency(
        &mut self,
        t: Transport,
        size: usize,
        pace: Pace,
    ) -> Result<Histogram<u64>, String> {
        let mut hist =
            Histogram::<u64>::new_with_bounds(1, 100_000_000_000, 3).map_err(|e| e.to_string())?;
        self.open(t)?;
        match t {
            Transport::Raw => {
                let per = self.raw_per();
                let frames = raw_frames(size, per);
                // What a whole message's frames come to, for the echo's check.
                let whole: usize = (0..frames)
                    .map(|i| raw_wire_len(raw_len(size, per, i)))
                    .sum();
                self.command(Cmd::RawPong { size, per })?;
                self.measure(pace, &mut hist, |s| {
                    let iter = s.next_raw_iter();
                    s.raw_ping(iter, size, frames, whole)
                })?;
            }
            Transport::Ffi => {
                if size + RAW_HDR > usize::from(self.mtu) + 14 {
                    return Err("ffi measures one-frame messages only".into());
                }
                self.command(Cmd::FfiPong)?;
                let mut frame = vec![0u8; (RAW_HDR + size).max(60)];
                frame[..14].copy_from_slice(&self.raw_hdr);
                let (port, queue) = self.chans.raw_ids();
                let pool = self.pool.clone();
                self.measure(pace, &mut hist, |s| {
                    let iter = s.next_raw_iter();
                    raw::ping(port, queue, &pool, &frame, iter)
                })?;
            }
            Transport::Emx | Transport::EmxThread => {
                let ep = usize::from(t == Transport::EmxThread);
                let gen = self.command(Cmd::EmxPong { ep, size })?;
                self.chans
                    .side(ep)
                    .buffers(size, 2, SendBuffers::Multiple)?;
                let before = self.chans.side(ep).peer_stats()?;
                self.measure(pace, &mut hist, |s| s.emx_ping(ep, gen))?;
                let control = &mut self.control;
                self.chans.side(ep).quiesce(&mut || control.check())?;
                self.count_protocol(ep, &before)?;
            }
            Transport::Udp | Transport::Tcp => {
                return Err("kernel transports are measured by crate::kernel".into())
            }
        }
        self.command(Cmd::Idle)?;
        if t.is_emx() {
            self.count_echo_duplicates()?;
        }
        Ok(hist)
    }

    /// Adds to the last emx measurement's counters the pinger's frames that
    /// its echo received twice, which the echo publishes as it leaves the
    /// command (call after the switch to the next).
    fn count_echo_duplicates(&mut self) -> Result<(), String> {
        let d = self.counters()?.duplicates;
        if let Some(p) = self.protocol.as_mut() {
            p.echo_duplicates = d;
        }
        Ok(())
    }

    fn count_protocol(&mut self, ep: usize, before: &PeerStats) -> Result<(), String> {
        let after = self.chans.side(ep).peer_stats()?;
        self.protocol = Some(Protocol::between(before, &after));
        Ok(())
    }

    /// The protocol counters of the last emx measurement, once.
    pub fn take_protocol(&mut self) -> Option<Protocol> {
        self.protocol.take()
    }

    /// Runs `once` (one round trip; `Ok(false)`: lost, not recorded) until
    /// the pace says enough, recording after the warm-up.
    fn measure(
        &mut self,
        pace: Pace,
        hist: &mut Histogram<u64>,
        mut once: impl FnMut(&mut Session) -> Result<bool, String>,
    ) -> Result<(), String> {
        let start = Instant::now();
        while start.elapsed() < pace.warmup {
            once(self)?;
        }
        let start = Instant::now();
        let (mut lost, mut streak) = (0u64, 0u32);
        // A lost round trip is one of the point's iterations: one that takes
        // longer than its time (`raw::LOST_AFTER`) ends the point when time
        // is up, as a recorded one would, however few were recorded.
        while !pace.enough(start, hist.len() + lost) {
            let t0 = dpdk_ffi::rdtsc();
            let ok = once(self)?;
            let dt = dpdk_ffi::rdtsc().wrapping_sub(t0);
            if ok {
                hist.saturating_record((self.ns(dt) as u64).max(1));
                streak = 0;
            } else {
                lost += 1;
                streak += 1;
                // An echo side that went away answers nothing.
                self.control.check()?;
                if streak >= LOST_IN_A_ROW {
                    return Err(format!(
                        "{streak} round trips in a row lost (nothing came back within {:?} \
                         each): the link carries nothing back",
                        raw::LOST_AFTER
                    ));
                }
            }
        }
        if hist.is_empty() {
            return Err(format!("every round trip was lost ({lost})"));
        }
        self.lost = Some(lost);
        Ok(())
    }

    /// Round trips the last latency measurement lost (raw and ffi, which
    /// send nothing again, leave them out of the percentiles; kernel UDP
    /// sends the datagram again and times the round trip from there), taken
    /// once.
    pub fn take_lost(&mut self) -> Option<u64> {
        self.lost.take()
    }

    /// Records what a latency measurement made outside the session (the
    /// kernel's) lost, for [`take_lost`](Self::take_lost).
    pub fn note_lost(&mut self, n: u64) {
        self.lost = Some(n);
    }

    /// The next raw ping's number: counted over the whole session, so that a
    /// late frame of a ping given up in one measurement is not taken for one
    /// of the next (each counted from 1, and a frame of another size failed
    /// the run).
    fn next_raw_iter(&mut self) -> u32 {
        self.raw_iter = self.raw_iter.wrapping_add(1);
        self.raw_iter
    }

    /// One raw round trip of `frames` frames, `whole` bytes of them; `false`
    /// when a frame was lost.
    fn raw_ping(
        &mut self,
        iter: u32,
        size: usize,
        frames: u32,
        whole: usize,
    ) -> Result<bool, String> {
        let per = self.raw_per();
        let (rx, tx) = self.chans.raw();
        let mut burst: Burst = Burst::new();
        send_raw(tx, &mut burst, &self.pool, &self.raw_hdr, iter, size, per)?;
        let (mut got, mut bytes) = (0u32, 0usize);
        let mut inb: Burst = Burst::new();
        let mut wait = Patience::new(raw::LOST_AFTER);
        while got < frames {
            if rx.rx_burst(&mut inb) == 0 {
                if wait.exhausted() {
                    return Ok(false);
                }
                continue;
            }
            for m in inb.drain() {
                if frame_iter(&m) == Some(iter) {
                    got += 1;
                    bytes += m.pkt_len();
                    // Waiting counts from the last frame of the reply, not
                    // from the ping: a long reply on a slow link is not lost.
                    wait.reset();
                }
            }
        }
        // The floor is a ping-pong only if the echo sent the whole message back.
        if bytes != whole {
            return Err(format!(
                "the raw echo sent {bytes} bytes of frames back for a {size}-byte message \
                 ({whole} expected)"
            ));
        }
        Ok(true)
    }

    /// One emx round trip: send, post the reply's receive, wait for both.
    fn emx_ping(&mut self, ep: usize, tag: u64) -> Result<bool, String> {
        let control = &mut self.control;
        let s = self.chans.side(ep);
        // isend, irecv, wait for both: a lone inline send leaves in isend,
        // and the receive for its echo is posted while it travels (the echo
        // cannot be taken before the next progress call, so it finds it).
        if !s.send(tag) || !s.post(tag) {
            return Err("emx refused a request".into());
        }
        let (r, x) = (s.posted[0], s.sends[0]);
        let (mut rdone, mut sdone) = (false, false);
        while !(rdone && sdone) {
            let (i, c) = match (rdone, sdone) {
                (false, false) => wait_any(&mut s.ep, &[r, x], control)?,
                (false, true) => (0, wait_any(&mut s.ep, &[r], control)?.1),
                _ => (1, wait_any(&mut s.ep, &[x], control)?.1),
            };
            if i == 0 {
                s.posted.pop_front();
                let (b, _) = c.into_recv().map_err(|e| e.to_string())?;
                s.free.push(b.into());
                rdone = true;
            } else {
                s.sends.pop_front();
                s.sent(c.into_send().map_err(|e| e.to_string())?);
                sdone = true;
            }
        }
        Ok(true)
    }

    /// Streams `size`-byte messages to the echo side (and, when `bidir`,
    /// back at the same time) for the pace's time, `window` in flight, emx's
    /// sent from `sends`.
    pub fn stream(
        &mut self,
        t: Transport,
        size: usize,
        window: usize,
        bidir: bool,
        sends: SendBuffers,
        pace: Pace,
    ) -> Result<Stream, String> {
        self.open(t)?;
        // What this side received in bibw, and of it unexpected: counted
        // where it progresses inline, as the echo side does (`None`: not
        // counted, nor then the stream's arrivals).
        let mut own = Some((0, 0));
        let mine = match t {
            Transport::Raw => self.raw_stream(size, bidir, pace)?,
            Transport::Emx | Transport::EmxThread => {
                let ep = usize::from(t == Transport::EmxThread);
                let before = self.chans.side(ep).peer_stats()?;
                let (got, at) = self.emx_stream(ep, size, window, bidir, sends, pace)?;
                self.count_protocol(ep, &before)?;
                if let Some((at, took)) = at {
                    let now = self.chans.side(ep).core_stats()?;
                    own = Some((took, now.unexpected - at));
                } else if bidir {
                    own = None;
                }
                got
            }
            _ => return Err(format!("{} does not stream here", t.label())),
        };
        let c = self.counters()?;
        if let (Some(p), Some(u), Some(own)) = (self.protocol.as_mut(), c.unexpected, own) {
            if t != Transport::Raw {
                p.arrivals = Some(Arrivals {
                    messages: c.arrived + own.0,
                    unexpected: u + own.1,
                    echo_side: c.arrived,
                    fewest: if bidir {
                        c.arrived.min(own.0)
                    } else {
                        c.arrived
                    },
                });
            }
        }
        let theirs = Stream {
            bytes: c.bytes,
            msgs: c.msgs,
            secs: (c.last_ns - c.first_ns).max(0.0) / 1e9,
        };
        self.command(Cmd::Idle)?;
        if t.is_emx() {
            self.count_echo_duplicates()?;
        }
        if !bidir {
            return Ok(self.raw_msgs(t, theirs, size));
        }
        // Both directions: everything received, over the span of both (the
        // longer span when the two sides have different clocks).
        let (f, l) = (self.ns(mine.1), self.ns(mine.2));
        // A side that got nothing has no span (its times read 0, which no
        // TSC reading is): the other's alone.
        let secs = if mine.2 == 0 {
            theirs.secs
        } else if c.arrived == 0 {
            (l - f) / 1e9
        } else if self.same_clock() {
            (l.max(c.last_ns) - f.min(c.first_ns)) / 1e9
        } else {
            ((l - f) / 1e9).max(theirs.secs)
        };
        let both = Stream {
            bytes: theirs.bytes + mine.0.bytes,
            msgs: theirs.msgs + mine.0.msgs,
            secs,
        };
        Ok(self.raw_msgs(t, both, size))
    }

    /// Raw streams frames of at most [`Self::raw_per`] bytes: what arrived
    /// of a larger message size counts in messages' worth of bytes, so that
    /// `msgs` means messages for every transport (and a message rate is
    /// compared with raw's rate of such messages, not of frames).
    fn raw_msgs(&self, t: Transport, s: Stream, size: usize) -> Stream {
        if t != Transport::Raw || size <= self.raw_per() {
            return s;
        }
        Stream {
            msgs: s.bytes / size as u64,
            ..s
        }
    }

    /// Returns what this side received (bibw) and its first and last TSC.
    fn raw_stream(
        &mut self,
        size: usize,
        bidir: bool,
        pace: Pace,
    ) -> Result<(Stream, u64, u64), String> {
        let per = self.raw_per();
        let mut frames = MsgFrames::new(size, per);
        self.command(Cmd::RawSink {
            back: bidir.then_some((size, per)),
            warmup_us: pace.warmup_us(),
        })?;
        let warm = ticks(pace.warmup_us(), self.hz);
        let mut got = Tally::default();
        let mut burst: Burst = Burst::new();
        let mut inb: Burst = Burst::new();
        let end = Instant::now() + pace.warmup + pace.time;
        // `--iters` counts messages: that many messages' frames.
        let limit = pace
            .max_iters
            .map(|m| m.saturating_mul(u64::from(frames.per_msg())));
        let mut n = 0u64;
        let mut wait = Patience::new(raw::STUCK_AFTER);
        while Instant::now() < end && limit.is_none_or(|l| n < l) {
            while burst.room() > 0 && limit.is_none_or(|l| n + (burst.len() as u64) < l) {
                // A stream frame's index field holds its payload length, so
                // that the receiver counts payload, not Ethernet padding.
                let len = frames.next_len();
                let m = raw_frame(&self.pool, &self.raw_hdr, 0, len as u32, len)?;
                let _ = burst.push(m);
            }
            let (rx, tx) = self.chans.raw();
            match tx.tx_burst(&mut burst) {
                0 if wait.exhausted() => return Err(raw::STUCK.into()),
                0 => {}
                sent => {
                    n += sent as u64;
                    wait.reset();
                }
            }
            if bidir {
                count_raw(rx, &mut inb, &mut got, warm);
            }
        }
        drop(burst);
        self.stop_back()?;
        let (mut err, mut theirs) = (None, 0);
        settle(|| {
            if bidir {
                count_raw(&mut self.chans.raw().0, &mut inb, &mut got, warm);
            }
            theirs = self.counters().map_or_else(
                |e| {
                    err = Some(e);
                    0
                },
                |c| c.arrived,
            );
            theirs + got.arrived
        });
        if let Some(e) = err {
            return Err(e);
        }
        // Frames the link took that never reached the echo (a veth's or a
        // NIC's receive ring overflowing; memif pushes back instead), in
        // messages' worth, as the kernel's UDP streams report theirs.
        let lost = n.saturating_sub(theirs);
        if lost > 0 {
            self.note_lost(lost.div_ceil(u64::from(frames.per_msg())));
        }
        Ok(got.measured())
    }

    fn emx_stream(
        &mut self,
        ep: usize,
        size: usize,
        window: usize,
        bidir: bool,
        sends: SendBuffers,
        pace: Pace,
    ) -> Result<(Received, Option<(u64, u64)>), String> {
        let gen = self.command(Cmd::EmxSink {
            ep,
            size,
            depth: window,
            back: bidir,
            sends,
            warmup_us: pace.warmup_us(),
        })?;
        let warm = ticks(pace.warmup_us(), self.hz);
        let control = &mut self.control;
        let s = self.chans.stream_side(ep);
        s.stream_buffers(size, window, true, bidir, sends)?;
        // In bibw, where this side progresses inline, its counters once its
        // receives are posted: what came back while the echo took the
        // command (this engine was driven meanwhile, with none posted) is
        // left out of what it counts as unexpected.
        let own_at = if bidir && s.inline {
            while s.posted.len() < window && s.post(gen) {}
            Some(s.core_stats()?.unexpected)
        } else {
            None
        };
        let mut got = Tally::default();
        let end = Instant::now() + pace.warmup + pace.time;
        let mut n = 0u64;
        loop {
            let more = Instant::now() < end && pace.max_iters.is_none_or(|m| n < m);
            if more {
                while s.sends.len() < window && pace.max_iters.is_none_or(|m| n < m) && s.send(gen)
                {
                    n += 1;
                }
            }
            if bidir {
                while s.posted.len() < window && s.post(gen) {}
                take_stream(s, &mut got, warm, (gen, window), true)?;
            }
            let sent = s.sends_done(bidir)?;
            if bidir {
                // What the poll of its look at an unfinished send finished:
                // posted again before the next poll.
                take_stream(s, &mut got, warm, (gen, window), true)?;
            }
            if sent == 0 {
                if let Some(&front) = s.sends.front() {
                    if s.sends.len() >= window || !more {
                        // Full window: wait for the oldest (a polling thread
                        // may need this core, so wait parks), or in bibw for
                        // the oldest receive, whose buffer goes to a new
                        // receive at once: the wait finishes receives, and
                        // with none posted the echo's messages would arrive
                        // unexpected.
                        let recv = s.posted.front().copied().filter(|_| bidir);
                        let both = [front, recv.unwrap_or(front)];
                        let reqs = if recv.is_some() {
                            &both[..]
                        } else {
                            &both[..1]
                        };
                        let (k, c) = wait_any(&mut s.ep, reqs, control)?;
                        if k == 0 {
                            s.sends.pop_front();
                            s.sent(c.into_send().map_err(|e| e.to_string())?);
                        } else {
                            s.posted.pop_front();
                            let (b, info) = c.into_recv().map_err(|e| e.to_string())?;
                            took(s, &mut got, warm, (gen, window), b.into(), info.msg_len);
                        }
                    }
                } else {
                    s.ep.progress();
                }
            }
            if !more && s.sends.is_empty() {
                break;
            }
        }
        self.stop_back()?;
        // emx loses nothing: wait for every message, counted, so that none is
        // left unmatched for a later measurement.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let c = self.counters()?;
            let (theirs, back_done, back) = (c.arrived, c.back_done, c.sent_back);
            let s = self.chans.side(ep);
            if theirs >= n && (!bidir || (back_done && got.arrived >= back)) {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "stream did not drain: echo got {theirs} of {n}, we got {} of {back}",
                    got.arrived
                ));
            }
            if bidir {
                // The receives the last poll finished are posted again
                // before the next: the echo's window may have refilled.
                take_stream(s, &mut got, warm, (gen, window), true)?;
                while s.posted.len() < window && s.post(gen) {}
                s.ep.progress();
            } else {
                s.ep.progress();
                std::thread::yield_now();
            }
        }
        let control = &mut self.control;
        self.chans.side(ep).quiesce(&mut || control.check())?;
        // Its own arrivals: every message it took (those its first receives
        // found waiting included, which its measured span may count), and
        // its unexpected count when its receives were posted.
        Ok((got.measured(), own_at.map(|at| (at, got.arrived))))
    }

    /// Stops the echo side.
    pub fn finish(mut self) -> Result<(), String> {
        match std::mem::replace(
            &mut self.control,
            Control::Local {
                ctl: Ctl::new(),
                thread: None,
            },
        ) {
            Control::Local { ctl, thread } => {
                ctl.switch(Cmd::Stop);
                if let Some(h) = thread {
                    h.join().map_err(|_| "the echo thread panicked")??;
                }
                Ok(())
            }
            Control::Remote(c) => c.bye(),
        }
    }
}

/// Waits until `count()` stops moving for 20 ms (what was in flight arrived).
fn settle(mut count: impl FnMut() -> u64) {
    let mut last = count();
    let mut still = Instant::now();
    let start = Instant::now();
    while still.elapsed() < Duration::from_millis(20) && start.elapsed() < Duration::from_secs(10) {
        let n = count();
        if n != last {
            last = n;
            still = Instant::now();
        }
    }
}

fn count_raw(rx: &mut RxQueue, inb: &mut Burst, got: &mut Tally, warmup: u64) {
    if rx.rx_burst(inb) == 0 {
        return;
    }
    // Raw stream frames only: a NIC's link also brings its switch's (LLDP),
    // and a veth the kernel's (IPv6 neighbour discovery).
    let (mut n, mut bytes) = (0u64, 0u64);
    for m in inb.drain() {
        if frame_iter(&m).is_some() {
            n += 1;
            bytes += u64::from(stream_len(&m));
        }
    }
    if n != 0 {
        got.note(dpdk_ffi::rdtsc(), n, bytes, warmup);
    }
}

/// The most stream messages [`take_stream`] times with one clock read: about
/// a burst of raw's (32 frames), a few microseconds.
const TIME_EVERY: u64 = 32;

/// Takes the emx stream messages that arrived at side `s` into `got`, and
/// posts a receive (tag `tag`) with each buffer taken back, keeping `depth`
/// posted.
///
/// Posting as it takes, not after: while messages keep arriving this loop
/// does not end (each look at an unfinished receive polls, and the poll
/// finishes more), and a receiver that posted only afterwards ran out of
/// posted receives within it. Its messages then arrived unexpected (copied
/// into the store, and out again once a receive came), 5-28% of a 4 KiB
/// stream's, which slowed it further.
///
/// A side that also sends (`both`: bibw) takes at most `depth` at a time, so
/// that it goes back to its sends after a window's worth. Taking until none
/// was left, a pinger whose echo sent faster than it took (between two
/// processes, 8 B) could stay in this loop for the rest of a round: once
/// every receive it posted found a message waiting, none was ever left
/// unfinished. It had sent one window, and the round measured one way, with
/// nearly all of its arrivals unexpected. A side that only receives takes
/// all there is: bounded, the 8 B message rate's receiving side, its bound,
/// made about 5% fewer messages a second (8 runs alternating the builds).
/// Past its bound it still takes what is already finished, polling no more:
/// left for later, those receives were not posted again before the side's
/// next poll (its look at a send), while their acknowledgements had let the
/// peer send as many more, which could then arrive unexpected (bibw, 4 KiB:
/// in about 1 of 10 runs, 16-30 of 100-170 thousand messages).
///
/// The messages taken are timed together, up to [`TIME_EVERY`] at a time, as
/// raw's receiver times a burst: a clock read per message cost the emx
/// receiver, the message rate's bound, 10-20 ns of its 150-250 a message,
/// which raw's does not pay. The stream's first message is timed alone, so
/// that a short stream that comes in one batch still spans a time.
fn take_stream(
    s: &mut crate::chans::EmxSide,
    got: &mut Tally,
    warmup: u64,
    (tag, depth): (u64, usize),
    both: bool,
) -> Result<(), String> {
    let most = if both { depth.max(1) } else { usize::MAX };
    let (mut n, mut bytes) = (0, 0);
    let mut taken = 0;
    loop {
        // Past its bound it takes only what the last poll finished: a poll
        // with those not yet posted again could let the peer's window,
        // refilled by their acknowledgements, outrun the receives.
        if taken >= most && !s.recv_ready() {
            break;
        }
        taken += 1;
        let Some((b, len)) = s.recv_done()? else {
            break;
        };
        if got.arrived == 0 {
            took(s, got, warmup, (tag, depth), b, len);
        } else {
            repost(s, (tag, depth), b);
            n += 1;
            bytes += len;
            if n == TIME_EVERY {
                // A receiver that only takes may stay here for a round.
                got.note(dpdk_ffi::rdtsc(), n, bytes, warmup);
                (n, bytes) = (0, 0);
            }
        }
    }
    if n > 0 {
        got.note(dpdk_ffi::rdtsc(), n, bytes, warmup);
    }
    Ok(())
}

/// Notes a stream message of `len` bytes taken at side `s`, and posts a
/// receive (tag `tag`, keeping `depth` posted) with its buffer `b`.
fn took(
    s: &mut crate::chans::EmxSide,
    got: &mut Tally,
    warmup: u64,
    (tag, depth): (u64, usize),
    b: crate::chans::Mem,
    len: u64,
) {
    repost(s, (tag, depth), b);
    got.note(dpdk_ffi::rdtsc(), 1, len, warmup);
}

/// Posts a receive at side `s` (tag `tag`, keeping `depth` posted) with the
/// buffer `b` of a message taken.
fn repost(s: &mut crate::chans::EmxSide, (tag, depth): (u64, usize), b: crate::chans::Mem) {
    s.free.push(b);
    while s.posted.len() < depth && s.post(tag) {}
}

/// What one side of a stream received (see [`Tally::measured`]): the
/// measured stream, and the TSC of its start and of its last arrival.
type Received = (Stream, u64, u64);

/// Frames of a raw message of `size` bytes, `per` bytes to a frame.
fn raw_frames(size: usize, per: usize) -> u32 {
    size.div_ceil(per).max(1) as u32
}

/// The frames of a stream of raw messages of `size` bytes, `per` to a frame,
/// one message after another: each message is whole frames of its own, as a
/// message transport sends it. (Raw streamed full frames regardless, which
/// for messages a little over a frame, 16 KiB at MTU 9000, say, is up to
/// 10% fewer frames than any message transport needs.) An empty message
/// goes as a frame with no payload, and counts no bytes.
struct MsgFrames {
    size: usize,
    per: usize,
    k: u32,
}

impl MsgFrames {
    fn new(size: usize, per: usize) -> MsgFrames {
        MsgFrames { size, per, k: 0 }
    }

    /// Frames a message takes.
    fn per_msg(&self) -> u32 {
        raw_frames(self.size, self.per)
    }

    /// The payload of the next frame, not taken.
    fn peek_len(&self) -> usize {
        raw_len(self.size, self.per, self.k)
    }

    /// The payload of the next frame, taken.
    fn next_len(&mut self) -> usize {
        let len = self.peek_len();
        self.k = (self.k + 1) % self.per_msg();
        len
    }
}

/// Payload bytes of frame `i` of a raw message of `size` bytes, `per` to a frame.
fn raw_len(size: usize, per: usize, i: u32) -> usize {
    (size - (i as usize * per).min(size)).min(per)
}

/// Bytes of a raw frame carrying `len` bytes of payload (at least Ethernet's 60).
fn raw_wire_len(len: usize) -> usize {
    (RAW_HDR + len).max(60)
}

/// Sends raw message `iter` of `size` bytes, `per` to a frame, in bursts
/// through `burst` (left empty).
fn send_raw(
    tx: &mut TxQueue,
    burst: &mut Burst,
    pool: &Mempool,
    hdr: &[u8; 14],
    iter: u32,
    size: usize,
    per: usize,
) -> Result<(), String> {
    let frames = raw_frames(size, per);
    let mut sent = 0u32;
    let mut wait = Patience::new(raw::STUCK_AFTER);
    while sent < frames {
        while burst.room() > 0 && sent + (burst.len() as u32) < frames {
            let i = sent + burst.len() as u32;
            let _ = burst.push(raw_frame(pool, hdr, iter, i, raw_len(size, per, i))?);
        }
        match tx.tx_burst(burst) {
            0 if wait.exhausted() => {
                burst.clear();
                return Err(raw::STUCK.into());
            }
            0 => {}
            n => {
                sent += n as u32;
                wait.reset();
            }
        }
    }
    Ok(())
}

/// A raw frame: header, iteration, index, then `len` bytes.
fn raw_frame(
    pool: &Mempool,
    hdr: &[u8; 14],
    iter: u32,
    i: u32,
    len: usize,
) -> Result<Mbuf, String> {
    let mut m = Mbuf::alloc(pool).map_err(|e| e.to_string())?;
    let total = raw_wire_len(len);
    let d = m.append(total).map_err(|e| e.to_string())?;
    d[..14].copy_from_slice(hdr);
    d[14..18].copy_from_slice(&iter.to_le_bytes());
    d[18..22].copy_from_slice(&i.to_le_bytes());
    Ok(m)
}

/// The payload length a stream frame carries in its index field (bounded by
/// what the frame holds).
fn stream_len(m: &Mbuf) -> u32 {
    let d = m.data();
    if d.len() < RAW_HDR {
        return 0;
    }
    let len = u32::from_le_bytes(d[18..22].try_into().expect("4 bytes"));
    len.min((m.pkt_len() - RAW_HDR) as u32)
}

fn frame_iter(m: &Mbuf) -> Option<u32> {
    let d = m.data();
    (d.len() >= RAW_HDR && d[12..14] == RAW_ETHERTYPE.to_be_bytes())
        .then(|| u32::from_le_bytes(d[14..18].try_into().expect("4 bytes")))
}

/// The echo thread's state.
struct Echo {
    ctl: Arc<Ctl>,
    pool: Mempool,
    hdr: [u8; 14],
    chans: Chans,
    /// TSC ticks a second.
    hz: f64,
}

impl Echo {
    fn run(mut self) -> Result<(), String> {
        let _ = self.ctl.echo.set(std::thread::current());
        let mut seen = u64::MAX;
        let mut cmd = Cmd::Idle;
        let mut gen = 0;
        // Raw pong state: the iteration being gathered and its frames.
        let mut cur = (0u32, 0u32);
        let mut inb: Burst = Burst::new();
        let mut out: Burst = Burst::new();
        // A raw sink's stream back (bibw): the frames of its messages.
        let mut back_frames: Option<MsgFrames> = None;
        // A sink's count, and its warm-up in ticks.
        let mut tally = Tally::default();
        let mut warm = 0u64;
        // A stream's receiving side, counted (inline): its endpoint's
        // unexpected arrivals when the stream started.
        let mut unexpected_at: Option<u64> = None;
        // An emx command's side and its duplicates when the command started.
        let mut duplicates_at: Option<(usize, u64)> = None;
        loop {
            let g = self.ctl.gen.load(Ordering::Acquire);
            if g != seen {
                // Finish the previous command, then take the next. Not when
                // the next is to stop: the engines go with the thread, and a
                // pinger that went away (a client killed mid-run) would hold
                // the sends' acknowledgements, and the thread, for 30 s.
                let next = *self.ctl.cmd.lock().expect("control lock");
                if next != Cmd::Stop {
                    // Nor when a stop comes while it waits (the pinger went
                    // away in the switch).
                    let ctl = &self.ctl;
                    let mut not_stopped = || match *ctl.cmd.lock().expect("control lock") {
                        Cmd::Stop => Err(STOPPED.to_string()),
                        _ => Ok(()),
                    };
                    for s in self.chans.sides() {
                        match s.quiesce(&mut not_stopped) {
                            Err(e) if e == STOPPED => return Ok(()),
                            r => r?,
                        }
                    }
                }
                // Counted once the previous command's frames have all come
                // in (the quiesce above), before a close takes its engine.
                let duplicates = duplicates_at.take().map_or(NOT_COUNTED, |(ep, at)| {
                    let now = self.chans.side(ep).peer_stats();
                    now.map_or(NOT_COUNTED, |s| s.duplicates.saturating_sub(at))
                });
                seen = g;
                gen = g;
                cmd = next;
                cur = (0, 0);
                tally = Tally::default();
                back_frames = match cmd {
                    Cmd::RawSink {
                        back: Some((size, per)),
                        ..
                    } => Some(MsgFrames::new(size, per)),
                    _ => None,
                };
                warm = match cmd {
                    Cmd::RawSink { warmup_us, .. } | Cmd::EmxSink { warmup_us, .. } => {
                        ticks(warmup_us, self.hz)
                    }
                    _ => 0,
                };
                for a in [
                    &self.ctl.arrived,
                    &self.ctl.bytes,
                    &self.ctl.msgs,
                    &self.ctl.first,
                    &self.ctl.last,
                    &self.ctl.sent_back,
                ] {
                    a.store(0, Ordering::Relaxed);
                }
                self.ctl.back_done.store(false, Ordering::Relaxed);
                self.ctl.stop.store(false, Ordering::Relaxed);
                self.ctl.unexpected.store(NOT_COUNTED, Ordering::Relaxed);
                self.ctl.duplicates.store(duplicates, Ordering::Relaxed);
                unexpected_at = None;
                match cmd {
                    Cmd::Close => {
                        self.chans.close_all();
                        // The pinger closed first: what it sent is here.
                        self.chans.drain()?;
                    }
                    Cmd::Open { chan } => self.chans.open(chan)?,
                    Cmd::EmxPong { ep, size } => {
                        self.chans
                            .side(ep)
                            .buffers(size, 4, SendBuffers::Multiple)?
                    }
                    Cmd::EmxSink {
                        ep,
                        size,
                        depth,
                        back,
                        sends,
                        ..
                    } => {
                        let s = self.chans.stream_side(ep);
                        s.stream_buffers(size, depth, back, true, sends)?;
                        if s.inline {
                            unexpected_at = Some(s.core_stats()?.unexpected);
                            self.ctl.unexpected.store(0, Ordering::Relaxed);
                        }
                    }
                    _ => {}
                }
                if let Cmd::EmxPong { ep, .. } | Cmd::EmxSink { ep, .. } = cmd {
                    duplicates_at = Some((ep, self.chans.side(ep).peer_stats()?.duplicates));
                }
                self.ctl.running.store(g, Ordering::Release);
            }
            match cmd {
                Cmd::Stop => return Ok(()),
                // Parked until the next command (which unparks it), so that
                // the kernel baselines' threads have its CPU to themselves:
                // woken every 200 us, it preempted them 5,000 times a second.
                // (The timeout only bounds a wake-up this thread misses.)
                Cmd::Pause => std::thread::park_timeout(Duration::from_millis(100)),
                Cmd::Idle | Cmd::Close | Cmd::Open { .. } => {
                    self.chans.progress();
                    // Drop stray raw frames.
                    if let Some((rx, _)) = self.chans.raw_if_open() {
                        rx.rx_burst(&mut inb);
                        inb.clear();
                    }
                }
                Cmd::FfiPong => {
                    let (port, queue) = self.chans.raw_ids();
                    raw::echo_step(port, queue);
                }
                Cmd::RawPong { size, per } => {
                    let (rx, tx) = self.chans.raw();
                    if rx.rx_burst(&mut inb) == 0 {
                        continue;
                    }
                    // Not on an empty poll: the floor's echo spins on those.
                    let frames = raw_frames(size, per);
                    for m in inb.drain() {
                        let Some(it) = frame_iter(&m) else { continue };
                        if it != cur.0 {
                            cur = (it, 0);
                        }
                        cur.1 += 1;
                        if frames == 1 {
                            // One frame: send it straight back.
                            let mut m = m;
                            let d = m.data_mut().map_err(|e| e.to_string())?;
                            d[..14].copy_from_slice(&self.hdr);
                            let mut wait = Patience::new(raw::STUCK_AFTER);
                            while let Err(back) = tx.tx_one(m) {
                                if wait.exhausted() {
                                    return Err(raw::STUCK.into());
                                }
                                m = back;
                            }
                            cur.1 = 0;
                        }
                    }
                    if frames > 1 && cur.1 == frames {
                        // The whole message back, as every other transport's
                        // echo sends it: a ping-pong moves it both ways.
                        send_raw(tx, &mut out, &self.pool, &self.hdr, cur.0, size, per)?;
                        cur.1 = 0;
                    }
                }
                Cmd::EmxPong { ep, .. } => {
                    let s = self.chans.side(ep);
                    if s.posted.is_empty() {
                        s.post(gen);
                    }
                    // One poll per turn, inside the test of the receive (as
                    // raw's echo polls the link once per turn): a ping that
                    // arrives in it is echoed at once, not after another poll.
                    if let Some((b, _)) = s.recv_done()? {
                        // A lone inline send: the echo leaves in this call.
                        // Refused, the echo ends with the error: ignored, the
                        // pinger waited for its answer for good (its peer
                        // answers acknowledgements, so no timeout ends it).
                        s.send_buf(gen, b)
                            .map_err(|e| format!("the echo's answer was refused: {e}"))?;
                        // The previous echo, acknowledged by this ping, comes
                        // back; the new one's test polls (it is not done), which
                        // sends it where it could not leave alone.
                        s.sends_done(true)?;
                        // The next receive is posted while the echo is on its
                        // way (the next ping cannot come before it arrives),
                        // as an MPI ping-pong posts its receive after the send.
                        s.post(gen);
                    }
                }
                Cmd::RawSink { .. } => {
                    let (rx, tx) = self.chans.raw();
                    let before = tally.arrived;
                    count_raw(rx, &mut inb, &mut tally, warm);
                    if tally.arrived != before {
                        self.ctl.publish(&tally);
                    }
                    if let Some(frames) = back_frames.as_mut() {
                        if !self.ctl.stop.load(Ordering::Acquire) {
                            while out.room() > 0 {
                                let len = frames.peek_len();
                                let Ok(m) = raw_frame(&self.pool, &self.hdr, 0, len as u32, len)
                                else {
                                    break;
                                };
                                frames.next_len();
                                let _ = out.push(m);
                            }
                            tx.tx_burst(&mut out);
                        } else {
                            out.clear();
                        }
                    }
                }
                Cmd::EmxSink {
                    ep, depth, back, ..
                } => {
                    let s = self.chans.side(ep);
                    while s.posted.len() < depth && s.post(gen) {}
                    if back && !self.ctl.stop.load(Ordering::Acquire) {
                        while s.sends.len() < depth && s.send(gen) {
                            self.ctl.sent_back.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                    s.ep.progress();
                    let before = tally.arrived;
                    take_stream(s, &mut tally, warm, (gen, depth), back)?;
                    if back {
                        // Its look at an unfinished send polls, once: the
                        // receives that poll finishes are taken, and posted
                        // again, before the next poll.
                        s.sends_done(true)?;
                        take_stream(s, &mut tally, warm, (gen, depth), back)?;
                    }
                    if tally.arrived != before {
                        // Before `arrived` is published: once the pinger sees
                        // every message arrived, every count is final.
                        if let Some(at) = unexpected_at {
                            let u = s.core_stats()?.unexpected.saturating_sub(at);
                            self.ctl.unexpected.store(u, Ordering::Relaxed);
                        }
                        self.ctl.publish(&tally);
                    }
                    if back && s.sends.is_empty() && self.ctl.stop.load(Ordering::Acquire) {
                        self.ctl.back_done.store(true, Ordering::Release);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Cores, Tally};

    fn cores(pinger: usize, echo: usize, poller: usize) -> Cores {
        Cores {
            pinger: Some(pinger),
            echo: Some(echo),
            poller: Some(poller),
        }
    }

    /// No topology known: every CPU a core of its own.
    fn flat(_: usize) -> Option<(u32, u32)> {
        None
    }

    /// On two CPUs the polling thread shares the pinger's; on more it takes
    /// one that neither the pinger nor the echo runs on, and spins there.
    #[test]
    fn the_polling_thread_gets_a_cpu_of_its_own_on_three_or_more() {
        assert_eq!(Cores::default_for(&[], &flat), Cores::default());
        assert_eq!(Cores::default_for(&[3], &flat), cores(3, 3, 3));
        let two = Cores::default_for(&[0, 1], &flat);
        assert_eq!(two, cores(0, 1, 0));
        assert!(!two.poller_alone());
        let many = Cores::default_for(&[2, 4, 5, 9], &flat);
        assert_eq!(many, cores(2, 9, 4));
        assert!(many.poller_alone());
        assert_eq!(
            many.describe(),
            ": pinger on 2, echo on 9, polling thread on 4"
        );
        assert_eq!(Cores::default().describe(), "");
    }

    /// A spinning polling thread keeps off the pinger's and the echo's
    /// physical cores where it can: on their hyperthread siblings it would
    /// take half of their core.
    #[test]
    fn the_polling_thread_keeps_off_their_hyperthread_siblings() {
        // Siblings numbered side by side (0 and 1 share a core), and half
        // the CPUs apart (0 and 4), as Linux numbers them on most machines.
        let side_by_side = |c: usize| Some((0, (c / 2) as u32));
        let apart = |c: usize| Some((0, (c % 4) as u32));
        let eight: Vec<usize> = (0..8).collect();
        assert_eq!(Cores::default_for(&eight, &side_by_side), cores(0, 7, 2));
        assert_eq!(Cores::default_for(&eight, &apart), cores(0, 7, 1));
        // Two cores of two threads: no core is free, so the first other CPU.
        assert_eq!(
            Cores::default_for(&[0, 1, 2, 3], &side_by_side),
            cores(0, 3, 1)
        );
        assert_eq!(
            Cores::parse("2,5", &eight, &side_by_side),
            Ok(cores(2, 5, 0))
        );
    }

    #[test]
    fn cores_are_parsed_and_checked_against_the_allowed_cpus() {
        let allowed = [0, 1, 2, 3, 8];
        let parse = |spec| Cores::parse(spec, &allowed, &flat);
        assert_eq!(parse("3,1"), Ok(cores(3, 1, 0)));
        assert_eq!(parse("0,1"), Ok(cores(0, 1, 2)));
        assert_eq!(parse("0, 8, 0"), Ok(cores(0, 8, 0)));
        assert_eq!(Cores::parse("0,1", &[0, 1], &flat), Ok(cores(0, 1, 0)));
        let e = parse("0,7").unwrap_err();
        assert!(
            e.contains("CPU 7 is not one") && e.ends_with("(0-3,8)"),
            "{e}"
        );
        let e = parse("0,a").unwrap_err();
        assert!(e.contains("`a` is not a CPU number"), "{e}");
        let e = parse("3,3").unwrap_err();
        assert!(
            e.contains("the pinger and the echo would share CPU 3"),
            "{e}"
        );
        let e = parse("0,1,1").unwrap_err();
        assert!(
            e.contains("the polling thread would share CPU 1 with the echo"),
            "{e}"
        );
        assert_eq!(Cores::parse("5,5", &[5], &flat), Ok(cores(5, 5, 5)));
        for bad in ["0", "0,1,2,3", ""] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    /// A server runs the echo alone: one CPU, and a list is refused with
    /// the fix (it used to take the second of two or three and pass over
    /// the rest).
    #[test]
    fn a_server_takes_its_echo_cpu_alone() {
        let allowed = [0, 1, 2, 3, 8];
        let echo = |cpu| Cores {
            echo: Some(cpu),
            ..Cores::default()
        };
        assert_eq!(Cores::parse_echo("8", &allowed), Ok(echo(8)));
        assert_eq!(Cores::parse_echo(" 2", &allowed), Ok(echo(2)));
        for (spec, why) in [
            ("0,1", "2 CPUs given"),
            ("0,1,2", "3 CPUs given"),
            ("7", "CPU 7 is not one this process may use"),
            ("x", "`x` is not a CPU number"),
        ] {
            let e = Cores::parse_echo(spec, &allowed).unwrap_err();
            assert!(
                e.contains(why) && e.contains("--cores ECHO") && e.contains("(0-3,8)"),
                "{spec}: {e}"
            );
        }
    }

    const MIB: u64 = 1 << 20;

    /// A rate over n arrivals spans n - 1 gaps: the first is timed, not
    /// counted (it used to be counted, a third too much over three).
    #[test]
    fn the_arrival_that_starts_the_clock_is_not_counted() {
        let mut t = Tally::default();
        for at in [0, 10, 20] {
            t.note(1_000 + at, 1, MIB, 0);
        }
        let (m, first, last) = t.measured();
        assert_eq!((m.bytes, m.msgs), (2 * MIB, 2));
        assert_eq!((first, last), (1_000, 1_020));
        assert_eq!((t.arrived, t.arrived_bytes), (3, 3 * MIB));
    }

    /// What arrives in the warm-up (from the first arrival on) is left out.
    #[test]
    fn the_warm_up_is_left_out() {
        let mut t = Tally::default();
        for at in [0, 10, 20, 30, 40] {
            t.note(at, 1, MIB, 15);
        }
        let (m, first, last) = t.measured();
        assert_eq!((m.bytes, first, last), (2 * MIB, 20, 40));
        assert_eq!(t.arrived, 5, "the drain still sees everything");
    }

    /// A stream that ended within its warm-up is measured whole.
    #[test]
    fn a_stream_within_its_warm_up_is_measured_whole() {
        let mut t = Tally::default();
        for at in [0, 10, 20] {
            t.note(at, 4, 4 * MIB, 1_000);
        }
        let (m, first, last) = t.measured();
        assert_eq!((m.bytes, m.msgs, first, last), (8 * MIB, 8, 0, 20));
        // Nothing arrived: nothing measured, no span.
        let (m, first, last) = Tally::default().measured();
        assert_eq!((m.bytes, m.msgs, first, last), (0, 0, 0, 0));
    }

    /// A stream that ended just after its warm-up is measured whole too: the
    /// one burst after it would time nothing (a raw stream of 100 KiB
    /// messages in 32-frame bursts held no message there, and was not
    /// measured at all).
    #[test]
    fn a_stream_that_ended_just_after_its_warm_up_is_measured_whole() {
        let mut t = Tally::default();
        for at in [0, 10, 20, 30, 40, 50, 60] {
            t.note(at, 32, 32 * 1_500, 45);
        }
        let (m, first, last) = t.measured();
        assert_eq!((m.msgs, first, last), (6 * 32, 0, 60));
        // A quarter after the warm-up is measured.
        let mut t = Tally::default();
        for at in [0, 10, 20, 30, 40, 50, 60] {
            t.note(at, 32, 32 * 1_500, 35);
        }
        let (m, first, last) = t.measured();
        assert_eq!((m.msgs, first, last), (64, 40, 60));
    }
}
