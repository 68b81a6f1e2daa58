//! Ping-pong over a memif pair in one process: the main thread pings through
//! port A, an echo thread pinned to another core reflects through port B. The
//! safe and raw variants alternate round by round in the same run, so drift
//! and noise hit both alike.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dpdk_ffi::{
    Burst, Eal, HugepageMode, Mbuf, Mempool, Port, PortConfig, RxQueue, TxQueue, DEFAULT_DATA_ROOM,
};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::raw;

/// What to measure.
pub struct Config {
    pub size: usize,
    pub iters: u32,
    pub rounds: u32,
    pub warmup: u32,
    pub hugepages: HugepageMode,
}

const IDLE: u8 = 0;
const SAFE: u8 = 1;
const RAW: u8 = 2;
const STOP: u8 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Raw,
    Safe,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Raw => "raw DPDK (sys)",
            Variant::Safe => "dpdk-ffi safe types",
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
}

/// A variant over all rounds: the median of each percentile over rounds, and
/// the spread of p50.
#[derive(Debug, Serialize)]
pub struct VariantReport {
    pub name: &'static str,
    pub median: Round,
    pub p50_min: f64,
    pub p50_max: f64,
    pub rounds: Vec<Round>,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    pub link: &'static str,
    pub frame_bytes: usize,
    pub hugepages: bool,
    pub iters_per_round: u32,
    pub rounds: u32,
    pub raw: VariantReport,
    pub safe: VariantReport,
    /// safe p50 / raw p50, median over rounds (each round's pair compared).
    pub ratio_p50: f64,
    pub ratio_p50_min: f64,
    pub ratio_p50_max: f64,
    pub ratio_p99: f64,
}

impl Report {
    /// The terminal table.
    pub fn print(&self) {
        println!(
            "emx-bench: ping-pong round trip, {} B frames, {} ({}), {} rounds x {} round trips per variant",
            self.frame_bytes,
            self.link,
            if self.hugepages { "hugepages" } else { "no hugepages" },
            self.rounds,
            self.iters_per_round
        );
        println!();
        println!(
            "{:<22} {:>9} {:>9} {:>9} {:>9} {:>10}   p50 spread",
            "variant", "p50 ns", "p90 ns", "p99 ns", "p99.9 ns", "max ns"
        );
        for v in [&self.raw, &self.safe] {
            let m = &v.median;
            println!(
                "{:<22} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>10.0}   {:.0}..{:.0}",
                v.name, m.p50, m.p90, m.p99, m.p999, m.max, v.p50_min, v.p50_max
            );
        }
        println!();
        println!(
            "safe / raw at p50: {:.3}x (per-round spread {:.3}..{:.3}), at p99: {:.3}x",
            self.ratio_p50, self.ratio_p50_min, self.ratio_p50_max, self.ratio_p99
        );
        println!(
            "(medians over rounds; raw and safe rounds alternate in one run on the same ports)"
        );
    }
}

/// Runs the benchmark.
pub fn run(cfg: &Config) -> Result<Report, dpdk_ffi::Error> {
    let eal = Eal::builder().hugepages(cfg.hugepages).init()?;
    let pool = Mempool::new(&eal, "bench", 8191, 256, DEFAULT_DATA_ROOM)?;
    let sock = format!("/tmp/emx-bench-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let pcfg = PortConfig::default();
    let a = Port::from_devargs(
        &eal,
        &format!("net_memif0,role=server,socket={sock}"),
        &pcfg,
        &pool,
    )?;
    let b = Port::from_devargs(
        &eal,
        &format!("net_memif1,role=client,socket={sock}"),
        &pcfg,
        &pool,
    )?;
    a.wait_link(Duration::from_secs(10))?;
    b.wait_link(Duration::from_secs(10))?;

    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let (ping_core, echo_core) = match cores.as_slice() {
        [] => (None, None),
        [only] => (Some(*only), Some(*only)),
        [first, .., last] => (Some(*first), Some(*last)),
    };
    let mode = Arc::new(AtomicU8::new(IDLE));
    let echo = {
        let (mode, eal) = (mode.clone(), eal.clone());
        let (rx, tx) = (b.rx_queue(0)?, b.tx_queue(0)?);
        std::thread::Builder::new()
            .name("echo".into())
            .spawn(move || echo_loop(&eal, echo_core, &mode, rx, tx))
            .expect("spawn echo thread")
    };
    if let Some(c) = ping_core {
        core_affinity::set_for_current(c);
    }
    let (mut rx, mut tx) = (a.rx_queue(0)?, a.tx_queue(0)?);
    let mut frame = vec![0u8; cfg.size];
    frame[0..6].copy_from_slice(&b.mac());
    frame[6..12].copy_from_slice(&a.mac());
    frame[12..14].copy_from_slice(&0x88B5u16.to_be_bytes());
    let hz = dpdk_ffi::tsc_hz(&eal) as f64;

    let mut results: Vec<(Variant, Round)> = Vec::new();
    for round in 0..cfg.rounds {
        // Alternate which variant goes first, so neither always runs warmer.
        let order = if round % 2 == 0 {
            [Variant::Raw, Variant::Safe]
        } else {
            [Variant::Safe, Variant::Raw]
        };
        for v in order {
            mode.store(
                if v == Variant::Raw { RAW } else { SAFE },
                Ordering::Release,
            );
            let mut hist =
                Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).expect("histogram bounds");
            for i in 0..cfg.warmup + cfg.iters {
                let t0 = dpdk_ffi::rdtsc();
                match v {
                    Variant::Raw => {
                        if !raw::ping(a.id(), 0, &pool, &frame) {
                            return Err(dpdk_ffi::Error::MempoolExhausted {
                                pool: pool.name().into(),
                                size: pool.size(),
                            });
                        }
                    }
                    Variant::Safe => safe_ping(&mut tx, &mut rx, &pool, &frame)?,
                }
                let dt = dpdk_ffi::rdtsc() - t0;
                if i >= cfg.warmup {
                    hist.saturating_record(dt.max(1));
                }
            }
            let ns = |q: f64| hist.value_at_quantile(q) as f64 * 1e9 / hz;
            results.push((
                v,
                Round {
                    p50: ns(0.5),
                    p90: ns(0.9),
                    p99: ns(0.99),
                    p999: ns(0.999),
                    max: hist.max() as f64 * 1e9 / hz,
                },
            ));
        }
    }
    mode.store(STOP, Ordering::Release);
    echo.join().expect("echo thread");

    let pick = |v: Variant| -> Vec<Round> {
        results
            .iter()
            .filter(|r| r.0 == v)
            .map(|r| r.1.clone())
            .collect()
    };
    let (raw_rounds, safe_rounds) = (pick(Variant::Raw), pick(Variant::Safe));
    let mut ratios: Vec<f64> = raw_rounds
        .iter()
        .zip(&safe_rounds)
        .map(|(r, s)| s.p50 / r.p50)
        .collect();
    let ratio_p50 = median(&mut ratios);
    let (rmin, rmax) = min_max(&ratios);
    let raw = summarize(Variant::Raw, raw_rounds);
    let safe = summarize(Variant::Safe, safe_rounds);
    Ok(Report {
        link: "memif pair, one process",
        frame_bytes: cfg.size,
        hugepages: eal.uses_hugepages(),
        iters_per_round: cfg.iters,
        rounds: cfg.rounds,
        ratio_p99: safe.median.p99 / raw.median.p99,
        raw,
        safe,
        ratio_p50,
        ratio_p50_min: rmin,
        ratio_p50_max: rmax,
    })
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

fn echo_loop(
    eal: &Eal,
    core: Option<core_affinity::CoreId>,
    mode: &AtomicU8,
    mut rx: RxQueue,
    mut tx: TxQueue,
) {
    if let Some(c) = core {
        core_affinity::set_for_current(c);
    }
    let _reg = dpdk_ffi::ThreadRegistration::register(eal).expect("register echo thread");
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
            STOP => return,
            _ => std::thread::sleep(Duration::from_micros(50)),
        }
    }
}

fn summarize(v: Variant, rounds: Vec<Round>) -> VariantReport {
    let col =
        |f: fn(&Round) -> f64| -> f64 { median(&mut rounds.iter().map(f).collect::<Vec<_>>()) };
    let median_round = Round {
        p50: col(|r| r.p50),
        p90: col(|r| r.p90),
        p99: col(|r| r.p99),
        p999: col(|r| r.p999),
        max: col(|r| r.max),
    };
    let (p50_min, p50_max) = min_max(&rounds.iter().map(|r| r.p50).collect::<Vec<_>>());
    VariantReport {
        name: v.name(),
        median: median_round,
        p50_min,
        p50_max,
        rounds,
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
