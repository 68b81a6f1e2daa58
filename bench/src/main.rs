//! `emx-bench`: how fast is this link, and what do emx's layers cost on it.
//!
//! On a `net_memif` pair in one process (no NIC, no hugepages needed) it
//! measures, in alternating rounds of one run: the ping-pong round trip of raw
//! DPDK frames (the floor of the link), of the same loop through `dpdk-ffi`'s
//! safe types, and of emx messages with inline progress and with a polling
//! thread; then one-way bandwidth of raw MTU frames against emx rendezvous
//! messages sent from registered memory. Every row carries its ratio to raw.
#![deny(unsafe_code)]

mod pingpong;
mod raw;

use clap::{Parser, ValueEnum};
use std::time::Duration;

use dpdk_ffi::HugepageMode;

/// Latency and bandwidth over a memif pair in one process: raw DPDK, the safe
/// DPDK types and emx (inline and with a polling thread), all in one run.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Frame size of the raw and safe ping-pong, Ethernet header included (60 to 1514).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(60..=1514))]
    size: u16,
    /// emx message size for the latency rows, in bytes.
    #[arg(long, default_value_t = 8)]
    msg_size: usize,
    /// Measured time per round and variant, in milliseconds.
    #[arg(long, default_value_t = 300)]
    round_ms: u64,
    /// Rounds per variant; variants alternate, medians over rounds are reported.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Warm-up per round, in milliseconds.
    #[arg(long, default_value_t = 50)]
    warmup_ms: u64,
    /// emx message size for bandwidth, in bytes (rendezvous above 32 KiB).
    #[arg(long, default_value_t = 1 << 20)]
    bw_msg: usize,
    /// Bytes streamed per bandwidth round and variant, in MiB.
    #[arg(long, default_value_t = 128)]
    bw_mib: usize,
    /// Link MTU: 1500, or up to 9000 for jumbo frames (fewer frames per
    /// message, less protocol work per byte).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u16).range(576..=9000))]
    mtu: u16,
    /// Skip the bandwidth section.
    #[arg(long)]
    no_bandwidth: bool,
    /// Hugepages: auto (when free ones exist), never (--no-huge) or require.
    #[arg(long, value_enum, default_value_t = Huge::Auto)]
    hugepages: Huge,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Huge {
    Auto,
    Never,
    Require,
}

fn main() {
    let args = Args::parse();
    let mode = match args.hugepages {
        Huge::Auto => HugepageMode::Auto,
        Huge::Never => HugepageMode::Never,
        Huge::Require => HugepageMode::Require,
    };
    let cfg = pingpong::Config {
        size: usize::from(args.size),
        msg_size: args.msg_size,
        round: Duration::from_millis(args.round_ms),
        rounds: args.rounds.max(1),
        warmup: Duration::from_millis(args.warmup_ms),
        bw_msg: args.bw_msg.max(1),
        bw_bytes: args.bw_mib.max(1) << 20,
        no_bandwidth: args.no_bandwidth,
        hugepages: mode,
        mtu: args.mtu,
    };
    match pingpong::run(&cfg) {
        Ok(report) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("report serialises")
                );
            } else {
                report.print();
            }
        }
        Err(e) => {
            eprintln!("emx-bench: {e}");
            std::process::exit(1);
        }
    }
}
