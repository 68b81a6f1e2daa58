//! The measurements, all on one link in one run: a memif pair in one process,
//! port A driven by the main thread (the pinger), port B by an echo thread
//! pinned to another core. Three queue pairs carry independent channels on
//! the same link: pair 0 for raw DPDK and the safe types, pair 1 for emx with
//! inline progress, pair 2 for emx with a polling thread on the pinger's side.
//!
//! Latency: ping-pong round trips; the variants take turns round by round (in
//! a rotating order), so drift and noise hit all alike. Bandwidth: raw MTU
//! frames streamed one way against emx rendezvous messages from registered
//! memory, alternating rounds.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpdk_ffi::{
    Burst, Eal, ExtMem, HugepageMode, Mbuf, Mempool, Port, PortConfig, RxQueue, TxQueue,
    DEFAULT_DATA_ROOM,
};
use emx::io::DpdkIo;
use emx::proto::Addr;
use emx::runtime::{
    Endpoint, Engine, EngineConfig, PeerConfig, ProgressMode, ProtocolConfig, RecvBuf, Request,
    SendBuf,
};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::raw;

/// What to measure.
pub struct Config {
    /// Frame size of the raw and safe ping-pong (Ethernet header included).
    pub size: usize,
    /// emx message size for the latency rows.
    pub msg_size: usize,
    /// Measured time per round and variant.
    pub round: Duration,
    /// Rounds per variant.
    pub rounds: u32,
    /// Warm-up time per round.
    pub warmup: Duration,
    /// emx message size for bandwidth.
    pub bw_msg: usize,
    /// Bytes streamed per bandwidth round and variant.
    pub bw_bytes: usize,
    /// Skip the bandwidth section.
    pub no_bandwidth: bool,
    /// Hugepages or not.
    pub hugepages: HugepageMode,
    /// Link MTU (jumbo frames where given above 1500).
    pub mtu: u16,
}

// What the echo thread does.
const IDLE: u8 = 0;
const SAFE: u8 = 1;
const RAW: u8 = 2;
const EMX_INLINE: u8 = 3;
const EMX_THREAD: u8 = 4;
const BW_RAW: u8 = 5;
const BW_EMX: u8 = 6;
const STOP: u8 = 7;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Raw,
    Safe,
    EmxInline,
    EmxThread,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::Raw,
        Variant::Safe,
        Variant::EmxInline,
        Variant::EmxThread,
    ];
    fn name(self) -> &'static str {
        match self {
            Variant::Raw => "raw DPDK frames",
            Variant::Safe => "dpdk-ffi safe types",
            Variant::EmxInline => "emx, inline progress",
            Variant::EmxThread => "emx, polling thread",
        }
    }
    fn echo_mode(self) -> u8 {
        match self {
            Variant::Raw => RAW,
            Variant::Safe => SAFE,
            Variant::EmxInline => EMX_INLINE,
            Variant::EmxThread => EMX_THREAD,
        }
    }
}

/// One round's percentiles, in nanoseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Round {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub count: u64,
}

/// A latency variant over all rounds: medians of each percentile over
/// rounds, the spread of p50, and the ratio to raw (median of per-round
/// ratios).
#[derive(Debug, Serialize)]
pub struct LatencyReport {
    pub name: &'static str,
    pub bytes: usize,
    pub median: Round,
    pub p50_min: f64,
    pub p50_max: f64,
    pub ratio_p50: f64,
    pub ratio_p50_min: f64,
    pub ratio_p50_max: f64,
    pub rounds: Vec<Round>,
}

/// Bandwidth of one variant: median over rounds.
#[derive(Debug, Serialize)]
pub struct BandwidthReport {
    pub name: &'static str,
    pub unit_bytes: usize,
    pub gbit_s: f64,
    pub gbit_s_min: f64,
    pub gbit_s_max: f64,
    pub rounds: Vec<f64>,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    pub link: &'static str,
    pub hugepages: bool,
    pub rounds: u32,
    pub round_ms: u128,
    pub latency: Vec<LatencyReport>,
    pub bandwidth: Vec<BandwidthReport>,
    /// emx bandwidth / raw bandwidth, median of per-round ratios.
    pub bandwidth_ratio: Option<f64>,
}

impl Report {
    /// The terminal table.
    pub fn print(&self) {
        println!(
            "emx-bench: {} ({}), {} rounds of {} ms per variant, variants alternating",
            self.link,
            if self.hugepages {
                "hugepages"
            } else {
                "no hugepages"
            },
            self.rounds,
            self.round_ms
        );
        println!();
        println!("round trip (ping-pong)");
        println!(
            "{:<24} {:>6} {:>9} {:>9} {:>9} {:>9}   {:>14}   {:>22}",
            "variant",
            "bytes",
            "p50 ns",
            "p90 ns",
            "p99 ns",
            "p99.9 ns",
            "p50 spread",
            "p50 / raw (spread)"
        );
        for v in &self.latency {
            let m = &v.median;
            println!(
                "{:<24} {:>6} {:>9.0} {:>9.0} {:>9.0} {:>9.0}   {:>6.0}..{:<7.0}   {:>6.2}x ({:.2}..{:.2})",
                v.name, v.bytes, m.p50, m.p90, m.p99, m.p999, v.p50_min, v.p50_max, v.ratio_p50, v.ratio_p50_min, v.ratio_p50_max
            );
        }
        if !self.bandwidth.is_empty() {
            println!();
            println!("one-way streaming");
            println!(
                "{:<24} {:>10} {:>10}   {:>14}",
                "variant", "unit", "Gbit/s", "spread"
            );
            for b in &self.bandwidth {
                println!(
                    "{:<24} {:>10} {:>10.2}   {:>6.2}..{:<6.2}",
                    b.name, b.unit_bytes, b.gbit_s, b.gbit_s_min, b.gbit_s_max
                );
            }
            if let Some(r) = self.bandwidth_ratio {
                println!("emx / raw bandwidth: {r:.2}x");
            }
        }
        println!();
        println!("(medians over rounds; ratios are medians of per-round ratios against raw in the same run)");
    }
}

const ECHO: Addr = Addr::new(2, 0);
const PINGER: Addr = Addr::new(1, 0);

fn emx_engine(
    port: &Port,
    queue: u16,
    pool: &Mempool,
    node: u16,
    peer: (u16, [u8; 6]),
    progress: ProgressMode,
) -> Result<(Engine, Endpoint), String> {
    let cfg = EngineConfig {
        progress,
        peers: vec![PeerConfig {
            node: peer.0,
            endpoint: 0,
            mac: peer.1,
        }],
        // Each side's engine sits undriven while other variants run; on two
        // cores a pinned spinner may also stall a peer for a while.
        protocol: ProtocolConfig {
            peer_timeout_us: Some(5_000_000),
            ..ProtocolConfig::default()
        },
        ..EngineConfig::new(node)
    };
    let io = DpdkIo::new(port, queue, pool).map_err(|e| e.to_string())?;
    let mut engine = Engine::start(&cfg, io).map_err(|e| e.to_string())?;
    let ep = engine.endpoint().map_err(|e| e.to_string())?;
    Ok((engine, ep))
}

/// Runs the benchmark.
pub fn run(cfg: &Config) -> Result<Report, String> {
    let eal = Eal::builder()
        .hugepages(cfg.hugepages)
        .init()
        .map_err(|e| e.to_string())?;
    let pool =
        Mempool::new(&eal, "bench", 16383, 256, data_room(cfg.mtu)).map_err(|e| e.to_string())?;
    let sock = format!("/tmp/emx-bench-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let pcfg = PortConfig {
        rx_queues: 3,
        tx_queues: 3,
        mtu: Some(cfg.mtu),
        ..PortConfig::default()
    };
    // memif's ring buffers hold 2048 bytes by default: size them for a
    // whole jumbo frame, so that a frame is one descriptor.
    let bsize = if cfg.mtu > 1500 {
        format!(",bsize={}", (usize::from(cfg.mtu) + 14).next_power_of_two())
    } else {
        String::new()
    };
    let port = |role: &str, n: u8| {
        Port::from_devargs(
            &eal,
            &format!("net_memif{n},role={role},socket={sock}{bsize}"),
            &pcfg,
            &pool,
        )
        .map_err(|e| e.to_string())
    };
    let a = port("server", 0)?;
    let b = port("client", 1)?;
    a.wait_link(Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    b.wait_link(Duration::from_secs(10))
        .map_err(|e| e.to_string())?;

    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let (ping_core, echo_core) = match cores.as_slice() {
        [] => (None, None),
        [only] => (Some(*only), Some(*only)),
        [first, .., last] => (Some(*first), Some(*last)),
    };
    let mode = Arc::new(AtomicU8::new(IDLE));
    let received = Arc::new(AtomicU64::new(0));
    // Engine handles live to the end: dropping one stops its polling thread.
    let mut engines: Vec<Engine> = Vec::new();
    let echo = {
        let (mode, received, eal) = (mode.clone(), received.clone(), eal.clone());
        let (rx, tx) = (
            b.rx_queue(0).map_err(|e| e.to_string())?,
            b.tx_queue(0).map_err(|e| e.to_string())?,
        );
        let (g1, e1) = emx_engine(&b, 1, &pool, 2, (1, a.mac()), ProgressMode::Inline)?;
        let (g2, e2) = emx_engine(&b, 2, &pool, 2, (1, a.mac()), ProgressMode::Inline)?;
        engines.extend([g1, g2]);
        let (msg, bw_msg) = (cfg.msg_size, cfg.bw_msg);
        std::thread::Builder::new()
            .name("echo".into())
            .spawn(move || {
                echo_loop(
                    &eal, echo_core, &mode, &received, rx, tx, e1, e2, msg, bw_msg,
                )
            })
            .map_err(|e| e.to_string())?
    };
    if let Some(c) = ping_core {
        core_affinity::set_for_current(c);
    }
    let _reg = dpdk_ffi::ThreadRegistration::register(&eal).map_err(|e| e.to_string())?;
    let (mut rx, mut tx) = (
        a.rx_queue(0).map_err(|e| e.to_string())?,
        a.tx_queue(0).map_err(|e| e.to_string())?,
    );
    let (g1, mut e1) = emx_engine(&a, 1, &pool, 1, (2, b.mac()), ProgressMode::Inline)?;
    // The polling thread shares the pinger's core: the echo thread spins
    // without yielding on the other one, and would leave a poller there only
    // scheduler time slices (milliseconds). The pinger parks while it waits.
    let thread_core = ping_core.map(|c| c.id);
    let (g2, mut e2) = emx_engine(
        &a,
        2,
        &pool,
        1,
        (2, b.mac()),
        ProgressMode::Thread {
            core: thread_core,
            spin: false,
        },
    )?;
    engines.extend([g1, g2]);
    let mut frame = vec![0u8; cfg.size];
    frame[0..6].copy_from_slice(&b.mac());
    frame[6..12].copy_from_slice(&a.mac());
    frame[12..14].copy_from_slice(&0x88B5u16.to_be_bytes());
    let hz = dpdk_ffi::tsc_hz(&eal) as f64;
    let mut sbuf = Some(SendBuf::Owned(vec![7u8; cfg.msg_size]));
    let mut rbuf = Some(RecvBuf::Owned(vec![0u8; cfg.msg_size]));

    let mut lat: Vec<(Variant, Round)> = Vec::new();
    for round in 0..cfg.rounds {
        for k in 0..Variant::ALL.len() {
            let v = Variant::ALL[(k + round as usize) % Variant::ALL.len()];
            mode.store(v.echo_mode(), Ordering::Release);
            let mut hist =
                Histogram::<u64>::new_with_bounds(1, 100_000_000_000, 3).expect("histogram bounds");
            let start = Instant::now();
            let end_warm = start + cfg.warmup;
            let end = end_warm + cfg.round;
            loop {
                let t0 = dpdk_ffi::rdtsc();
                match v {
                    Variant::Raw => {
                        if !raw::ping(a.id(), 0, &pool, &frame) {
                            return Err(format!("mempool `{}` exhausted", pool.name()));
                        }
                    }
                    Variant::Safe => {
                        safe_ping(&mut tx, &mut rx, &pool, &frame).map_err(|e| e.to_string())?
                    }
                    Variant::EmxInline => emx_ping(&mut e1, &mut sbuf, &mut rbuf)?,
                    Variant::EmxThread => emx_ping(&mut e2, &mut sbuf, &mut rbuf)?,
                }
                let dt = dpdk_ffi::rdtsc() - t0;
                let now = Instant::now();
                if now >= end_warm {
                    hist.saturating_record(dt.max(1));
                }
                if now >= end {
                    break;
                }
            }
            // An inline engine acknowledges only while driven: let the last
            // reply's delayed acknowledgement go out before the next variant.
            if v == Variant::EmxInline {
                flush(&mut e1);
            }
            let ns = |q: f64| hist.value_at_quantile(q) as f64 * 1e9 / hz;
            lat.push((
                v,
                Round {
                    p50: ns(0.5),
                    p90: ns(0.9),
                    p99: ns(0.99),
                    p999: ns(0.999),
                    max: hist.max() as f64 * 1e9 / hz,
                    count: hist.len(),
                },
            ));
        }
    }

    let mut bw: Vec<(bool, f64)> = Vec::new();
    if !cfg.no_bandwidth {
        let region = ExtMem::new(&eal, 8 * cfg.bw_msg).map_err(|e| e.to_string())?;
        for round in 0..cfg.rounds {
            for emx_first in [round % 2 == 0, round % 2 != 0] {
                received.store(0, Ordering::Release);
                let t0 = Instant::now();
                if emx_first {
                    mode.store(BW_EMX, Ordering::Release);
                    emx_stream(&mut e1, &region, cfg.bw_msg, cfg.bw_bytes)?;
                } else {
                    mode.store(BW_RAW, Ordering::Release);
                    raw_stream(
                        &mut tx,
                        &pool,
                        &frame_of(&a, &b, usize::from(cfg.mtu) + 14),
                        cfg.bw_bytes,
                    )?;
                }
                while received.load(Ordering::Acquire) < cfg.bw_bytes as u64 {
                    std::hint::spin_loop();
                    if t0.elapsed() > Duration::from_secs(60) {
                        return Err("bandwidth round stalled".into());
                    }
                }
                let secs = t0.elapsed().as_secs_f64();
                flush(&mut e1);
                bw.push((
                    emx_first,
                    received.load(Ordering::Acquire) as f64 * 8.0 / secs / 1e9,
                ));
                mode.store(IDLE, Ordering::Release);
            }
        }
    }
    mode.store(STOP, Ordering::Release);
    echo.join()
        .map_err(|_| "echo thread panicked".to_string())?;

    let rounds_of = |v: Variant| -> Vec<Round> {
        lat.iter()
            .filter(|r| r.0 == v)
            .map(|r| r.1.clone())
            .collect()
    };
    let raw_rounds = rounds_of(Variant::Raw);
    let latency = Variant::ALL
        .iter()
        .map(|&v| {
            let rounds = rounds_of(v);
            let mut ratios: Vec<f64> = rounds
                .iter()
                .zip(&raw_rounds)
                .map(|(r, raw)| r.p50 / raw.p50)
                .collect();
            let (rmin, rmax) = min_max(&ratios);
            let col = |f: fn(&Round) -> f64| median(&mut rounds.iter().map(f).collect::<Vec<_>>());
            let median_round = Round {
                p50: col(|r| r.p50),
                p90: col(|r| r.p90),
                p99: col(|r| r.p99),
                p999: col(|r| r.p999),
                max: col(|r| r.max),
                count: rounds.iter().map(|r| r.count).sum(),
            };
            let (p50_min, p50_max) = min_max(&rounds.iter().map(|r| r.p50).collect::<Vec<_>>());
            LatencyReport {
                name: v.name(),
                bytes: if matches!(v, Variant::Raw | Variant::Safe) {
                    cfg.size
                } else {
                    cfg.msg_size
                },
                median: median_round,
                p50_min,
                p50_max,
                ratio_p50: median(&mut ratios),
                ratio_p50_min: rmin,
                ratio_p50_max: rmax,
                rounds,
            }
        })
        .collect();
    let side = |emx: bool| -> Vec<f64> { bw.iter().filter(|b| b.0 == emx).map(|b| b.1).collect() };
    let (raw_bw, emx_bw) = (side(false), side(true));
    let bandwidth_ratio = (!bw.is_empty()).then(|| {
        median(
            &mut emx_bw
                .iter()
                .zip(&raw_bw)
                .map(|(e, r)| e / r)
                .collect::<Vec<_>>(),
        )
    });
    let bw_report = |name, unit, v: Vec<f64>| {
        let (lo, hi) = min_max(&v);
        BandwidthReport {
            name,
            unit_bytes: unit,
            gbit_s: median(&mut v.clone()),
            gbit_s_min: lo,
            gbit_s_max: hi,
            rounds: v,
        }
    };
    let bandwidth = if bw.is_empty() {
        Vec::new()
    } else {
        vec![
            bw_report("raw DPDK frames", usize::from(cfg.mtu) + 14, raw_bw),
            bw_report("emx rendezvous, 0-copy", cfg.bw_msg, emx_bw),
        ]
    };
    Ok(Report {
        link: "memif pair, one process",
        hugepages: eal.uses_hugepages(),
        rounds: cfg.rounds,
        round_ms: cfg.round.as_millis(),
        latency,
        bandwidth,
        bandwidth_ratio,
    })
}

/// An mbuf data room that holds a whole frame of this MTU in one segment.
fn data_room(mtu: u16) -> u16 {
    DEFAULT_DATA_ROOM.max(mtu.saturating_add(18 + 128))
}

fn frame_of(a: &Port, b: &Port, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&b.mac());
    f[6..12].copy_from_slice(&a.mac());
    f[12..14].copy_from_slice(&0x88B5u16.to_be_bytes());
    f
}

/// Drives an endpoint for a moment, so that delayed acknowledgements leave.
fn flush(ep: &mut Endpoint) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_micros(500) {
        ep.progress();
    }
}

/// One ping through the safe types.
#[inline(never)]
fn safe_ping(
    tx: &mut TxQueue,
    rx: &mut RxQueue,
    pool: &Mempool,
    frame: &[u8],
) -> Result<(), dpdk_ffi::Error> {
    let mut m = Mbuf::alloc(pool)?;
    m.extend_from_slice(frame)?;
    while let Err(back) = tx.tx_one(m) {
        m = back;
    }
    let mut inb: Burst = Burst::new();
    while rx.rx_burst(&mut inb) == 0 {}
    Ok(())
}

/// One emx message round trip: post the reply's receive, send, wait for both.
#[inline(never)]
fn emx_ping(
    ep: &mut Endpoint,
    sbuf: &mut Option<SendBuf>,
    rbuf: &mut Option<RecvBuf>,
) -> Result<(), String> {
    let r = ep
        .irecv(Some(ECHO), 0, 0, rbuf.take().expect("buffer home"))
        .map_err(|e| e.to_string())?;
    let s = ep
        .isend(ECHO, 1, sbuf.take().expect("buffer home"))
        .map_err(|e| e.to_string())?;
    let (mut rdone, mut sdone) = (false, false);
    while !(rdone && sdone) {
        let (i, c) = match (rdone, sdone) {
            (false, false) => ep.wait_any(&[r, s]).map_err(|e| e.to_string())?,
            (false, true) => (0, ep.wait(r).map_err(|e| e.to_string())?),
            _ => (1, ep.wait(s).map_err(|e| e.to_string())?),
        };
        if i == 0 {
            *rbuf = Some(c.into_recv().map_err(|e| e.to_string())?.0);
            rdone = true;
        } else {
            *sbuf = Some(c.into_send().map_err(|e| e.to_string())?);
            sdone = true;
        }
    }
    Ok(())
}

/// Streams `total` bytes of MTU frames on queue 0, as fast as the link takes them.
fn raw_stream(tx: &mut TxQueue, pool: &Mempool, frame: &[u8], total: usize) -> Result<(), String> {
    let n = total.div_ceil(frame.len());
    let mut burst: Burst = Burst::new();
    let mut sent = 0;
    while sent < n {
        while burst.room() > 0 && sent + burst.len() < n {
            let Ok(m) = Mbuf::alloc(pool) else { break };
            let mut m = m;
            m.extend_from_slice(frame).map_err(|e| e.to_string())?;
            let _ = burst.push(m);
        }
        sent += tx.tx_burst(&mut burst);
    }
    Ok(())
}

/// Streams `total` bytes as messages of `msg` bytes from registered memory,
/// up to 8 in flight.
fn emx_stream(ep: &mut Endpoint, region: &ExtMem, msg: usize, total: usize) -> Result<(), String> {
    let mut inflight: VecDeque<Request> = VecDeque::new();
    let mut free: Vec<SendBuf> = Vec::new();
    for _ in 0..8 {
        let mut b = region.alloc(msg, 64).map_err(|e| e.to_string())?;
        b.as_mut_slice().expect("fresh buffer").fill(0x5a);
        free.push(SendBuf::Registered(b));
    }
    let mut left = total.div_ceil(msg);
    while left > 0 || !inflight.is_empty() {
        if left > 0 {
            if let Some(b) = free.pop() {
                inflight.push_back(ep.isend(ECHO, 2, b).map_err(|e| e.to_string())?);
                left -= 1;
                continue;
            }
        }
        let r = inflight.pop_front().expect("something in flight");
        free.push(
            ep.wait(r)
                .map_err(|e| e.to_string())?
                .into_send()
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(())
}

/// The echo side of an emx ping-pong or stream, one step at a time.
struct EmxEcho {
    ep: Endpoint,
    posted: VecDeque<Request>,
    sends: VecDeque<Request>,
    spare: Vec<Vec<u8>>,
}

impl EmxEcho {
    fn new(ep: Endpoint) -> EmxEcho {
        EmxEcho {
            ep,
            posted: VecDeque::new(),
            sends: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    /// Keeps `depth` receives of `len` bytes posted; echoes (when `reply`) or
    /// counts what arrives.
    fn step(&mut self, len: usize, depth: usize, reply: bool, received: &AtomicU64) {
        while self.posted.len() < depth {
            let buf = self
                .spare
                .pop()
                .filter(|b| b.len() == len)
                .unwrap_or_else(|| vec![0u8; len]);
            match self.ep.irecv(Some(PINGER), 0, 0, buf) {
                Ok(r) => self.posted.push_back(r),
                Err(_) => break,
            }
        }
        if let Some(&r) = self.posted.front() {
            if let Ok(Some(c)) = self.ep.test(r) {
                self.posted.pop_front();
                if let Ok((RecvBuf::Owned(v), info)) = c.into_recv() {
                    received.fetch_add(info.msg_len, Ordering::AcqRel);
                    if reply {
                        if let Ok(s) = self.ep.isend(PINGER, 1, v) {
                            self.sends.push_back(s);
                        }
                    } else {
                        self.spare.push(v);
                    }
                }
            }
        }
        while let Some(&s) = self.sends.front() {
            match self.ep.test(s) {
                Ok(Some(c)) => {
                    self.sends.pop_front();
                    if let Ok(SendBuf::Owned(v)) = c.into_send() {
                        self.spare.push(v);
                    }
                }
                _ => break,
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn echo_loop(
    eal: &Eal,
    core: Option<core_affinity::CoreId>,
    mode: &AtomicU8,
    received: &AtomicU64,
    mut rx: RxQueue,
    mut tx: TxQueue,
    e1: Endpoint,
    e2: Endpoint,
    msg: usize,
    bw_msg: usize,
) {
    if let Some(c) = core {
        core_affinity::set_for_current(c);
    }
    let _reg = dpdk_ffi::ThreadRegistration::register(eal).expect("register echo thread");
    let (mut e1, mut e2) = (EmxEcho::new(e1), EmxEcho::new(e2));
    let mut burst: Burst = Burst::new();
    loop {
        match mode.load(Ordering::Acquire) {
            SAFE => {
                rx.rx_burst(&mut burst);
                while !burst.is_empty() {
                    tx.tx_burst(&mut burst);
                }
            }
            RAW => raw::echo_step(rx.port_id(), rx.queue_id()),
            EMX_INLINE => e1.step(msg, 1, true, received),
            EMX_THREAD => e2.step(msg, 1, true, received),
            BW_RAW => {
                rx.rx_burst(&mut burst);
                let bytes: usize = burst.iter().map(|m| m.pkt_len()).sum();
                received.fetch_add(bytes as u64, Ordering::AcqRel);
                burst.clear();
            }
            BW_EMX => e1.step(bw_msg, 8, false, received),
            STOP => return,
            _ => {
                // Between rounds keep both emx endpoints answering (acks).
                e1.ep.progress();
                e2.ep.progress();
            }
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}
