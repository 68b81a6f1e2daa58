//! `emx-bench`: how fast is this link, and what do emx's layers cost on it.
//!
//! For now (until the full benchmark lands) it measures the ping-pong round
//! trip of 64-byte frames between two ports of a `net_memif` pair in one
//! process, once through `dpdk-ffi`'s safe types and once through the raw
//! bindings, in alternating rounds of the same run, and reports both with
//! their ratio. No NIC and no hugepages are needed.
#![deny(unsafe_code)]

mod pingpong;
mod raw;

use clap::{Parser, ValueEnum};
use dpdk_ffi::HugepageMode;

/// Ping-pong over a memif pair: dpdk-ffi's safe types against raw DPDK.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Frame size in bytes, Ethernet header included (60 to 1514).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(60..=1514))]
    size: u16,
    /// Round trips measured per round.
    #[arg(long, default_value_t = 200_000)]
    iters: u32,
    /// Rounds per variant; the variants alternate, and medians over rounds are reported.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Round trips before measuring, per round.
    #[arg(long, default_value_t = 20_000)]
    warmup: u32,
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
        iters: args.iters,
        rounds: args.rounds,
        warmup: args.warmup,
        hugepages: mode,
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
