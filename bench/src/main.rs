//! `emx-bench`: how fast is emx on this link, how close to the link's floor,
//! and how much better than what one would use instead.
//!
//! Every run measures emx beside baselines on the same link, in alternating
//! rounds: `raw` DPDK frames (no protocol: the floor) and, on the veth link,
//! kernel `udp` and `tcp` sockets on a veth pair of their own between the
//! namespaces, with no DPDK port on it. Tests:
//! `latency` (ping-pong over a sweep of sizes, NetPIPE-style), `bandwidth`
//! (one-way streaming with a window), `bibw` (both ways at once) and
//! `msgrate` (small messages with a window); `sweep` runs them all.
#![deny(unsafe_code)]

mod chans;
mod kernel;
mod link;
mod netns;
mod raw;
mod remote;
mod report;
mod session;

use std::time::{Duration, Instant};

use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use dpdk_ffi::HugepageMode;
use indicatif::{ProgressBar, ProgressStyle};

use link::LinkKind;
use report::{Collector, Report, Sample, Test};
use session::{Cores, Pace, SendBuffers, Session, Transport};

/// Latency, bandwidth and message rate of emx against raw DPDK frames (and
/// kernel UDP/TCP on the veth link), measured on the same link in one run.
///
/// The default: the memif pair in this process (no NIC, no hugepages
/// needed), a latency and a bandwidth sweep of emx (inline progress and
/// polling thread) against raw, about a minute on two cores.
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Args {
    /// The link: `memif-pair` (two memif ports in this process), `veth`
    /// (veth pairs between network namespaces this program makes and
    /// removes, over net_af_packet or, with `--pmd af-xdp`, net_af_xdp;
    /// needs root), `memif` (between two
    /// processes: run one with `--role server`, then one with `--role
    /// client`), or `devargs` (ports given by --devargs: a NIC, or any PMD).
    #[arg(long, value_enum, default_value_t = LinkKind::MemifPair)]
    link: LinkKind,
    /// With `--link devargs`: a port as EAL devargs, such as a NIC's PCI
    /// address (`0000:3b:00.0`, bound to vfio-pci) or a virtual device
    /// (`net_memif0,role=server,socket=/tmp/m`). Twice for two ports in this
    /// process, joined outside it (say, by a cable); once in each of two
    /// processes with `--role`. The ports use one queue pair, so transports
    /// take turns on it.
    #[arg(long, value_name = "DEVARGS")]
    devargs: Vec<String>,
    /// With `--link veth`: the DPDK driver of its ports, `af-packet` or
    /// `af-xdp` (AF_XDP sockets, generic XDP on a veth).
    #[arg(long, value_enum, default_value_t = link::VethPmd::AfPacket)]
    pmd: link::VethPmd,
    /// With `--link memif` or `devargs` between two processes: `server` runs
    /// the echo side and takes orders from the client over TCP; `client` runs
    /// the tests and prints the results.
    #[arg(long, value_enum)]
    role: Option<Role>,
    /// With `--link memif`: the memif socket both processes use (a path
    /// without commas).
    #[arg(long, default_value = "/tmp/emx-bench.sock")]
    socket: String,
    /// Server role: where to listen for the client's control connection.
    #[arg(long, default_value = "127.0.0.1:7799")]
    listen: String,
    /// Server role: serve one client, then exit with its result. Without
    /// it, the server serves clients one after another until it is stopped
    /// (Ctrl-C), as iperf3 and netserver do.
    #[arg(long)]
    once: bool,
    /// Client role: where the server listens.
    #[arg(long, default_value = "127.0.0.1:7799")]
    server: String,
    /// Tests to run, comma-separated: latency, bandwidth, bibw, msgrate, or
    /// sweep for all four.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Test::Latency, Test::Bandwidth])]
    test: Vec<Test>,
    /// Transports, comma-separated: raw, ffi (one-frame raw ping-pong on the
    /// bindings), emx, emx-thread, udp, tcp (the last two on veth only).
    /// Default: raw, emx, emx-thread, plus udp and tcp on veth.
    #[arg(long, value_enum, value_delimiter = ',')]
    transports: Vec<Transport>,
    /// Message sizes in bytes, comma-separated (suffixes K and M allowed),
    /// instead of the default sweeps.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<usize>,
    /// Largest message of the default sweeps (at most 8M).
    #[arg(long, default_value = "8M", value_parser = parse_size, conflicts_with = "sizes")]
    max_size: usize,
    /// Latency sweep at powers of two only, without the NetPIPE points 3
    /// bytes either side of each.
    #[arg(long, conflicts_with = "sizes")]
    no_netpipe: bool,
    /// Message size of the msgrate test (default: the sizes of `--sizes`
    /// when given, else 8).
    #[arg(long, value_parser = parse_size)]
    msg_size: Option<usize>,
    /// Messages in flight in emx streams (raw and the kernel's sockets have
    /// no window; default: 64 for small messages, fewer for large ones, so
    /// that 16 MiB are in flight; at most 4096).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_WINDOW as u64))]
    window: Option<usize>,
    /// Where emx streams (bandwidth, bibw, msgrate) send from: `multiple`,
    /// a registered buffer per message in flight (each send reads memory the
    /// sends before it did not, as fresh data would), or `single`, one
    /// registered buffer shared by every send in flight, whose data stays in
    /// cache, as raw's recycled frames do (OSU's `osu_bw -b single`, its
    /// default). Receives take a buffer each either way.
    #[arg(long, value_enum, default_value_t = SendBuffers::Multiple)]
    send_buffers: SendBuffers,
    /// Rounds per point; transports alternate within each round.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
    /// Measured time per point, transport and round, in milliseconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    time_ms: u64,
    /// Warm-up before each measurement, in milliseconds.
    #[arg(long, default_value_t = 10)]
    warmup_ms: u64,
    /// At most this many iterations per measurement, for quick checks:
    /// round trips measured after the warm-up, or messages sent in a stream,
    /// warm-up included. A stream cut short within its warm-up, or so soon
    /// after it that less than a quarter came later, is measured whole; the
    /// kernel's (udp, tcp), whose short streams arrive in a read or two,
    /// from their senders' start.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    iters: Option<u64>,
    /// Link MTU, up to 9000 (jumbo frames) where the link allows. By default
    /// 9000 on the memif links (shared memory, with no wire MTU) and 1500 on
    /// the others.
    #[arg(long, value_parser = clap::value_parser!(u16).range(576..=9000))]
    mtu: Option<u16>,
    /// Hugepages: auto (when free ones exist, else ordinary pages), never
    /// (DPDK's --no-huge) or require (fail, saying how to reserve them,
    /// when none are free).
    #[arg(long, value_enum, default_value_t = Huge::Auto)]
    hugepages: Huge,
    /// CPUs (as the OS numbers them) for the pinger, the echo thread and the
    /// pinger's polling thread (emx-thread): PINGER,ECHO or PINGER,ECHO,POLLER.
    /// By default the pinger takes the first CPU this process may use and the
    /// echo the last; the polling thread takes the first other one, on a
    /// physical core neither of theirs is on where there is one (not their
    /// hyperthread siblings), and spins there as on a dedicated core; on 2
    /// CPUs it shares the pinger's and backs off when idle. The echo spins, and
    /// the pinger too on raw's round trips: ECHO must differ from the others.
    /// A server (`--role server`) runs only the echo: give it `--cores ECHO`.
    /// A client uses PINGER and POLLER (its ECHO is passed over).
    #[arg(long, value_name = "CPUS")]
    cores: Option<String>,
    /// Print the results as JSON on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write latency-vs-size and bandwidth-vs-size charts, all
    /// transports on each, to this SVG file.
    #[arg(long, value_name = "FILE")]
    plot: Option<std::path::PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    /// The echo side.
    Server,
    /// The side that measures.
    Client,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Huge {
    Auto,
    Never,
    Require,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (bytes, or with K or M)"))?;
    let n = n.saturating_mul(mul);
    if n > 8 << 20 {
        return Err(format!("{s} is above the largest message size, 8M"));
    }
    Ok(n)
}

/// Latency sizes: 0, then powers of two with NetPIPE's points 3 bytes
/// either side (from 16 up), to `max`, which ends the sweep also when it is
/// not a power of two.
fn latency_sizes(max: usize, netpipe: bool) -> Vec<usize> {
    let mut v = vec![0];
    let mut p = 1usize;
    while p <= max {
        if netpipe && p >= 16 {
            v.push(p - 3);
        }
        v.push(p);
        if netpipe && p >= 16 && p + 3 <= max {
            v.push(p + 3);
        }
        p *= 2;
    }
    // The point below the next power of two, and `max` itself.
    if netpipe && p >= 16 && p - 3 <= max && v.last() < Some(&(p - 3)) {
        v.push(p - 3);
    }
    if v.last() != Some(&max) {
        v.push(max);
    }
    v
}

/// Bandwidth sizes: powers of four from 64 bytes to `max`.
fn stream_sizes(max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut p = 64usize;
    while p <= max {
        v.push(p);
        p *= 4;
    }
    if v.last() != Some(&max) && max >= 64 {
        v.push(max);
    }
    v
}

fn main() {
    let matches = Args::command().get_matches();
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = ignored(&args, &matches).and_then(|()| run(&args)) {
        eprintln!("emx-bench: {e}");
        std::process::exit(1);
    }
}

/// Options given on the command line that this run would pass over: refused,
/// naming where they belong, rather than ignored in silence. (Whether an
/// option was given, not its value: those with defaults have one either way.)
fn ignored(args: &Args, m: &clap::ArgMatches) -> Result<(), String> {
    let given = |id: &str| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    if args.role == Some(Role::Server) {
        // The client runs the tests; the server only echoes.
        const CLIENTS: [&str; 14] = [
            "test",
            "transports",
            "sizes",
            "max_size",
            "no_netpipe",
            "msg_size",
            "window",
            "send_buffers",
            "rounds",
            "time_ms",
            "warmup_ms",
            "iters",
            "json",
            "plot",
        ];
        if let Some(id) = CLIENTS.iter().find(|id| given(id)) {
            return Err(format!(
                "--{} goes to the client (--role client): it decides what the server echoes",
                id.replace('_', "-")
            ));
        }
    }
    let only = |id: &str, applies: bool, with: &str| {
        if given(id) && !applies {
            Err(format!("--{} goes with {with}", id.replace('_', "-")))
        } else {
            Ok(())
        }
    };
    only("socket", args.link == LinkKind::Memif, "--link memif")?;
    only("devargs", args.link == LinkKind::Devargs, "--link devargs")?;
    only("pmd", args.link == LinkKind::Veth, "--link veth")?;
    only("listen", args.role == Some(Role::Server), "--role server")?;
    only("once", args.role == Some(Role::Server), "--role server")?;
    only("server", args.role == Some(Role::Client), "--role client")?;
    let runs = |t: Test| args.test.contains(&t) || args.test.contains(&Test::Sweep);
    let streams = args.test.iter().any(|&t| t != Test::Latency);
    let stream_tests = "--test bandwidth, bibw or msgrate (or sweep)";
    only("msg_size", runs(Test::Msgrate), "--test msgrate (or sweep)")?;
    only(
        "no_netpipe",
        runs(Test::Latency),
        "--test latency (or sweep)",
    )?;
    only("window", streams, stream_tests)?;
    only("send_buffers", streams, stream_tests)?;
    // Only emx's streams have a window and send buffers (an empty list is
    // the default set, emx among them).
    let emx = args.transports.is_empty()
        || args
            .transports
            .iter()
            .any(|t| matches!(t, Transport::Emx | Transport::EmxThread));
    only("window", emx, "the emx transports (emx, emx-thread)")?;
    only("send_buffers", emx, "the emx transports (emx, emx-thread)")
}

fn run(args: &Args) -> Result<(), String> {
    let mut tests: Vec<Test> = Vec::new();
    for &t in &args.test {
        let add: &[Test] = if t == Test::Sweep {
            &[Test::Latency, Test::Bandwidth, Test::Bibw, Test::Msgrate]
        } else {
            std::slice::from_ref(&t)
        };
        for a in add {
            if !tests.contains(a) {
                tests.push(*a);
            }
        }
    }
    let mut transports = args.transports.clone();
    if transports.is_empty() {
        transports = vec![Transport::Raw, Transport::Emx, Transport::EmxThread];
        if args.link == LinkKind::Veth {
            transports.extend([Transport::Udp, Transport::Tcp]);
        }
    }
    if args.link != LinkKind::Veth {
        if let Some(t) = transports
            .iter()
            .find(|t| matches!(t, Transport::Udp | Transport::Tcp))
        {
            return Err(format!(
                "the {} baseline runs between network namespaces: add --link veth (as root)",
                t.label()
            ));
        }
    }
    // Each once (a repeat would be measured twice a round under one name),
    // raw first: every ratio is against it.
    let mut seen = Vec::new();
    transports.retain(|t| {
        let new = !seen.contains(t);
        seen.push(*t);
        new
    });
    transports.sort_by_key(|t| *t != Transport::Raw);
    let max = args.max_size.min(8 << 20);
    // A size given twice is measured once: its rows would merge, with twice
    // the rounds the report says.
    let mut given = args.sizes.clone();
    let mut seen = std::collections::HashSet::new();
    given.retain(|s| seen.insert(*s));
    let sizes_for = |t: Test| -> Vec<usize> {
        if t == Test::Msgrate {
            return match args.msg_size {
                Some(size) => vec![size],
                None if !given.is_empty() => given.clone(),
                None => vec![8],
            };
        }
        if !given.is_empty() {
            return given.clone();
        }
        match t {
            Test::Latency => latency_sizes(max, !args.no_netpipe),
            _ => stream_sizes(max),
        }
    };
    let hugepages = match args.hugepages {
        Huge::Auto => HugepageMode::Auto,
        Huge::Never => HugepageMode::Never,
        Huge::Require => HugepageMode::Require,
    };
    let pace = Pace {
        warmup: Duration::from_millis(args.warmup_ms),
        time: Duration::from_millis(args.time_ms),
        max_iters: args.iters,
    };

    if let Some(path) = &args.plot {
        // Checked before the measurements, not after a minute of them.
        check_plot_path(path)?;
        if !tests
            .iter()
            .any(|t| matches!(t, Test::Latency | Test::Bandwidth))
        {
            return Err(
                "--plot draws latency and bandwidth against size: give --test latency or \
                 bandwidth (or sweep) with it"
                    .into(),
            );
        }
    }
    if let Some(t) = tests.iter().find(|&&t| sizes_for(t).is_empty()) {
        return Err(format!(
            "{t:?} has no sizes up to --max-size {max} (its sweep starts at 64 B): give a \
             larger --max-size, or --sizes"
        ));
    }
    check_windows(&tests, &sizes_for, args.window)?;
    // Before the session pins this thread to one core.
    let allowed = session::allowed_cpus();
    let cpus = allowed.len();
    let cores = match &args.cores {
        Some(spec) if args.role == Some(Role::Server) => Cores::parse_echo(spec, &allowed)?,
        Some(spec) => Cores::parse(spec, &allowed, &session::physical_core)?,
        None => Cores::default_for(&allowed, &session::physical_core),
    };
    if args.socket.contains(',') {
        // It goes into memif's devargs, where a comma starts another key.
        return Err(format!(
            "--socket {}: memif's socket path cannot hold a comma; choose another path",
            args.socket
        ));
    }
    let mtu = args.mtu.unwrap_or(args.link.default_mtu());
    let side = match (args.link, args.devargs.as_slice()) {
        (LinkKind::Memif, _) => Some(link::SideSpec::Memif(args.socket.clone())),
        (LinkKind::Devargs, [one]) => Some(link::SideSpec::Devargs(one.clone())),
        _ => None,
    };
    let mut session = match (args.link, args.role, side) {
        (_, Some(Role::Server), Some(side)) => {
            return remote::serve(hugepages, mtu, &side, &args.listen, args.once, cores.pair().1)
        }
        (_, Some(Role::Client), Some(side)) => {
            Session::connect(hugepages, mtu, &side, &args.server, cores)?
        }
        (LinkKind::Memif, None, _) => {
            return Err("--link memif joins two processes: start one with --role server, then one with --role client".into())
        }
        (LinkKind::Devargs, None, Some(_)) => {
            return Err("one --devargs port is one side of a link: give --devargs twice for two ports in this process, or run two processes with --role server and --role client".into())
        }
        (LinkKind::Devargs, Some(_), None) => {
            return Err("with --role, give this process's one port with --devargs".into())
        }
        (_, Some(_), _) => return Err("--role goes with --link memif or --link devargs".into()),
        (kind, None, _) => {
            Session::start(kind, hugepages, mtu, args.pmd, &args.devargs, cores)?
        }
    };
    let total: u64 = tests
        .iter()
        .map(|&t| sizes_for(t).len() as u64 * u64::from(args.rounds) * transports.len() as u64)
        .sum();
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("progress template")
            .progress_chars("=> "),
    );
    let mut col = Collector::default();
    // What was not measured, and in how many rounds.
    let mut skipped: Vec<report::Skipped> = Vec::new();
    let started = Instant::now();
    let mut result = Ok(());
    'all: for &test in &tests {
        for size in sizes_for(test) {
            for round in 0..args.rounds {
                for k in 0..transports.len() {
                    // Raw first in every round, the others in rotating order.
                    let t = if k == 0 {
                        transports[0]
                    } else {
                        let rest = transports.len() - 1;
                        transports[1 + (k - 1 + round as usize) % rest]
                    };
                    bar.set_message(format!("{test} {} {}", t.label(), report::human(size)));
                    let m = measure(&mut session, test, t, size, args, pace);
                    // Taken whatever came of it: what a measurement not kept
                    // counted must not go to the next one.
                    let (protocol, lost) = (session.take_protocol(), session.take_lost());
                    match m {
                        Ok(Some(s)) => {
                            col.add(test, t, size, round, s);
                            if let Some(p) = protocol {
                                col.count(test, t, size, &p);
                            }
                            if let Some(n) = lost {
                                col.lost(test, t, size, n);
                            }
                        }
                        Ok(None) => {}
                        Err(Skip::Not(why)) => {
                            let same = |s: &&mut report::Skipped| {
                                (s.test, s.transport, s.size) == (test, t, size) && s.reason == why
                            };
                            match skipped.iter_mut().find(same) {
                                Some(s) => s.rounds += 1,
                                None => skipped.push(report::Skipped {
                                    test,
                                    transport: t,
                                    size,
                                    reason: why,
                                    rounds: 1,
                                }),
                            }
                        }
                        Err(Skip::Fail(e)) => {
                            result = Err(format!("{test} {} {size} B: {e}", t.label()));
                            break 'all;
                        }
                    }
                    bar.inc(1);
                }
            }
        }
    }
    bar.finish_and_clear();
    let mut rows = col.rows();
    for r in rows.iter_mut().filter(|r| {
        r.test != Test::Latency && matches!(r.transport, Transport::Emx | Transport::EmxThread)
    }) {
        r.window = Some(window_for(args.window, r.size));
    }
    let mut notes = Vec::new();
    let threaded = rows.iter().any(|r| r.transport == Transport::EmxThread);
    let placement = session.placement();
    if threaded && placement.poller.is_some() && placement.poller == placement.pinger {
        notes.push(format!(
            "emx-thread's polling thread shared the pinger's CPU ({cpus} CPUs here): the pinger \
             parks while it waits, so each of its round trips includes two switches between \
             threads by the OS scheduler. Its engine was open only for its own turns, so that \
             its polling thread, idle, did not wake during the others'. On 3 CPUs or more the \
             polling thread gets one of its own (see --cores)."
        ));
    }
    let (link, hugepages, mtu) = (session.link_name.clone(), session.hugepages, session.mtu);
    // The run's own failure first: stopping the echo side after it may fail
    // for the same cause (a server that stopped answering), and would hide it.
    let failure = match (result, session.finish()) {
        (Err(e), Err(f)) => Some(format!("{e} (then, stopping the echo side: {f})")),
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Some(e),
        (Ok(()), Ok(())) => None,
    };
    if let Some(e) = &failure {
        notes.push(format!(
            "the run stopped early, at {e}: the rows are what it measured before"
        ));
    }
    let report = Report {
        link,
        hugepages,
        mtu,
        cpus,
        cores: placement,
        rounds: args.rounds,
        pace: report::Paced {
            warmup_ms: args.warmup_ms,
            time_ms: args.time_ms,
            iters: args.iters,
        },
        send_buffers: args.send_buffers,
        rows,
        skipped,
        notes,
    };
    // What was measured before a failure is printed all the same (a sweep
    // that failed at its last test used to print nothing but the error);
    // the exit says it failed.
    if failure.is_some() && report.rows.is_empty() {
        return Err(failure.unwrap_or_default());
    }
    let out = if args.json {
        serde_json::to_string_pretty(&report).map_err(|e| e.to_string())? + "\n"
    } else {
        format!(
            "{}({:.0} s)\n",
            report.table(&transports),
            started.elapsed().as_secs_f64()
        )
    };
    emit(&out)?;
    if let Some(path) = &args.plot {
        std::fs::write(path, report::svg(&report, &transports))
            .map_err(|e| format!("cannot write the plot to {}: {e}", path.display()))?;
    }
    match failure {
        Some(e) => Err(e),
        // A run that measured nothing is no success to a script.
        None if report.rows.is_empty() => Err(format!(
            "nothing was measured: {}",
            report
                .skipped
                .iter()
                .map(|s| s.line(report.rounds))
                .collect::<Vec<_>>()
                .join("; ")
        )),
        None => Ok(()),
    }
}

/// Writes the report to stdout. A reader that went away (`emx-bench | head`)
/// is no failure of the run: what it did not read is dropped (printing used
/// to panic there, with exit 101, after minutes of measuring).
fn emit(out: &str) -> Result<(), String> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("cannot write the report: {e}"))
        }
        _ => Ok(()),
    }
}

/// Refuses a `--plot` file that could not be written, or whose name says
/// another image format: the chart is SVG.
fn check_plot_path(path: &std::path::Path) -> Result<(), String> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    const OTHER_FORMATS: [&str; 10] = [
        "png", "jpg", "jpeg", "gif", "webp", "bmp", "tif", "tiff", "pdf", "eps",
    ];
    if let Some(ext) = ext.filter(|e| OTHER_FORMATS.contains(&e.as_str())) {
        return Err(format!(
            "--plot writes SVG, not .{ext}: name the file .svg (`rsvg-convert -o plot.png plot.svg` makes a PNG of it)"
        ));
    }
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("cannot write the plot to {}: {e}", path.display()))?;
    if !existed {
        // Only a probe: the file is written when the results are in.
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// The largest `--window`: four times the largest measured for a gain
/// (1024, the message rate's), where a run's set-up grows with the window's
/// square: 16,384 took 0.8 s more for a 20 ms run, 65,536 more than 12 s,
/// with nothing said.
const MAX_WINDOW: usize = 4096;

/// Messages in flight in a stream of `size`-byte messages: `--window`, or
/// 64 for small messages and fewer for large ones, so that 16 MiB are in
/// flight. (msgrate's default was 64 whatever the size: `--msg-size 2M` asked
/// for 128 MiB of buffers, and failed after the other tests had run.)
fn window_for(given: Option<usize>, size: usize) -> usize {
    given
        .unwrap_or_else(|| ((16usize << 20) / size.max(1)).clamp(2, 64))
        .max(1)
}

/// Refuses, before anything runs, a stream whose buffers (a send and a
/// receive buffer per message in flight, for bibw on each side) outgrow the
/// registered memory of a side.
fn check_windows(
    tests: &[Test],
    sizes_for: &dyn Fn(Test) -> Vec<usize>,
    window: Option<usize>,
) -> Result<(), String> {
    for &test in tests.iter().filter(|&&t| t != Test::Latency) {
        for size in sizes_for(test) {
            let w = window_for(window, size);
            if !session::window_fits(w, size) {
                let need = w.saturating_mul(size).saturating_mul(2);
                let most = (session::REGION / 2 / size.max(1)).max(1);
                return Err(format!(
                    "{test} at {} B: {w} messages in flight need {} MiB of registered memory \
                     a side, which has {} MiB: give --window {most} or less at this size",
                    size,
                    need >> 20,
                    session::REGION >> 20
                ));
            }
        }
    }
    Ok(())
}

enum Skip {
    /// This transport cannot do this measurement (said once in the report).
    Not(String),
    /// A measurement failed.
    Fail(String),
}

fn measure(
    s: &mut Session,
    test: Test,
    t: Transport,
    size: usize,
    args: &Args,
    pace: Pace,
) -> Result<Option<Sample>, Skip> {
    let window = window_for(args.window, size);
    if matches!(t, Transport::Udp | Transport::Tcp) {
        let proto = if t == Transport::Udp {
            kernel::Proto::Udp
        } else {
            kernel::Proto::Tcp
        };
        if proto == kernel::Proto::Udp && size > kernel::UDP_MAX {
            return Err(Skip::Not(format!(
                "UDP datagrams stop at {} bytes",
                kernel::UDP_MAX
            )));
        }
        if s.veth().is_none() {
            return Err(Skip::Not("kernel baselines run on the veth link".into()));
        }
        if test != Test::Latency && size == 0 {
            return Err(Skip::Not(
                "kernel streams need messages of at least 1 byte".into(),
            ));
        }
        let r = s
            .paused(|s| {
                let pair = s.veth().expect("checked above");
                let cores = s.placement().pair();
                match test {
                    Test::Latency => kernel::pingpong(
                        pair,
                        proto,
                        size,
                        pace.warmup,
                        pace.time,
                        pace.max_iters,
                        cores,
                    )
                    .map(|r| (Sample::Latency(r.hist), Some(r.losses))),
                    _ => {
                        let kp = kernel::StreamPace {
                            warmup: pace.warmup,
                            duration: pace.time,
                            max_msgs: pace.max_iters,
                        };
                        if test == Test::Bibw {
                            kernel::bibw(pair, proto, size, kp, cores)
                        } else {
                            kernel::stream(pair, proto, size, kp, cores)
                        }
                    }
                    .map(|r| {
                        let f = Sample::Flow(session::Stream {
                            bytes: r.bytes,
                            msgs: r.msgs,
                            secs: r.seconds,
                        });
                        // UDP's datagrams that never arrived (TCP loses none).
                        let lost = (proto == kernel::Proto::Udp)
                            .then(|| r.sent.saturating_sub(r.received));
                        (f, lost)
                    }),
                }
            })
            .map_err(Skip::Fail)?;
        let (sample, lost) = r.map_err(Skip::Fail)?;
        if let Some(n) = lost {
            s.note_lost(n);
        }
        return match sample {
            Sample::Flow(f) => timed(f),
            latency => Ok(Some(latency)),
        };
    }
    match test {
        Test::Latency => {
            if t == Transport::Ffi && size + 8 > usize::from(s.mtu) {
                return Err(Skip::Not("ffi measures one-frame messages only".into()));
            }
            s.latency(t, size, pace)
                .map(|h| Some(Sample::Latency(h)))
                .map_err(Skip::Fail)
        }
        _ => {
            if t == Transport::Ffi {
                return Err(Skip::Not("ffi measures latency only".into()));
            }
            let f = s
                .stream(t, size, window, test == Test::Bibw, args.send_buffers, pace)
                .map_err(Skip::Fail)?;
            timed(f)
        }
    }
}

/// A stream's sample, or not measured when it has no rate: everything in
/// the first receive burst (which only starts the clock), a rate of 0 and no
/// ratio otherwise.
fn timed(f: session::Stream) -> Result<Option<Sample>, Skip> {
    if f.msgs == 0 || f.secs <= 0.0 {
        return Err(Skip::Not(
            "everything arrived at once, too fast to time: give more --iters or --time-ms".into(),
        ));
    }
    Ok(Some(Sample::Flow(f)))
}

#[cfg(test)]
mod tests {
    use super::{latency_sizes, stream_sizes};

    #[test]
    fn latency_sweeps_end_at_their_largest_size() {
        assert_eq!(latency_sizes(8 << 20, true).last(), Some(&(8 << 20)));
        assert_eq!(latency_sizes(8 << 20, true)[..6], [0, 1, 2, 4, 8, 13]);
        // Not a power of two: the point below the next one, and the end.
        let v = latency_sizes(1022, true);
        assert_eq!(v[v.len() - 4..], [512, 515, 1021, 1022]);
        assert_eq!(latency_sizes(20, false), [0, 1, 2, 4, 8, 16, 20]);
        assert_eq!(latency_sizes(13, true), [0, 1, 2, 4, 8, 13]);
        assert_eq!(latency_sizes(0, true), [0]);
        for max in [1, 7, 100, 4096, 5000, 1 << 20] {
            let v = latency_sizes(max, true);
            assert!(v.windows(2).all(|w| w[0] < w[1]), "{max}: {v:?}");
            assert_eq!(v.last(), Some(&max));
        }
        assert_eq!(stream_sizes(1000), [64, 256, 1000]);
    }
}
