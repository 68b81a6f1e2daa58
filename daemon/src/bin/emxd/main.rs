//! `emxd`: the emx node daemon. What it does, its responder convention,
//! liveness design and control protocol are described in the `emx_daemon`
//! crate's documentation.
#![deny(unsafe_code)]

mod check;
mod daemon;
mod server;
mod station;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{Parser, ValueEnum};
use emx::runtime::{register_memory, start_node_until, Node};
use emx_config::{resolve_identity, ClusterConfig, LogFormat, LogLevel};
use emx_daemon::control::default_control_path;
use emx_daemon::ops;
use tracing::info;
use tracing::level_filters::LevelFilter;

use daemon::{Daemon, NodeInfo, Parts};
use station::Station;

/// The emx node daemon: runs one node of a cluster file, answers ECHO,
/// SINK and PING messages on its endpoints, watches its peers, and serves a
/// control socket (see emxctl).
#[derive(Parser, Debug)]
#[command(name = "emxd", version)]
struct Args {
    /// The cluster file.
    #[arg(long, env = "EMX_CONFIG", value_name = "FILE")]
    config: PathBuf,
    /// Which node of the file this is, by name or id. Default: EMX_NODE, or
    /// a launcher's rank (OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID).
    #[arg(long, value_name = "NAME|ID")]
    node: Option<String>,
    /// The control socket. Default: emxd-NAME.sock with the node's name, in
    /// $EMX_CONTROL_DIR when set, /run/emx otherwise (the directory is
    /// created; emxctl looks in the same one). It is made mode 0600: only
    /// the user emxd runs as may connect.
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// The most verbose level logged, instead of logging.level in the cluster file.
    #[arg(long, value_enum, value_name = "LEVEL")]
    log_level: Option<Level>,
    /// How log lines are written, instead of logging.format in the cluster file.
    #[arg(long, value_enum, value_name = "FORMAT")]
    log_format: Option<Format>,
    /// Check the cluster file as emxd would at start, for every node (or
    /// --node's), and exit: 0 when each would start, 2 with the first
    /// problem. Nothing is started. (A node's polling cores are checked on
    /// its own machine, when it starts.)
    #[arg(long)]
    check: bool,
}

/// A log level on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Level {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// A log format on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// Why emxd could not start: a bad configuration (exit 2) or anything else
/// (exit 1).
enum Failure {
    Config(String),
    Start(String),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (msg, code) = match run(args) {
        Ok(()) => return ExitCode::SUCCESS,
        Err(Failure::Config(msg)) => (msg, 2),
        Err(Failure::Start(msg)) => (msg, 1),
    };
    if JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
        // A collector of JSON lines takes the reason as it takes the rest.
        tracing::error!(exit = code, "{msg}");
    } else {
        eprintln!("emxd: {msg}");
    }
    ExitCode::from(code)
}

/// Set once the logs are JSON lines: the reason emxd stops goes there too
/// (a plain line among them was dropped, or choked on, by collectors).
static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn run(args: Args) -> Result<(), Failure> {
    let config = |e: emx_config::ConfigError| Failure::Config(e.to_string());
    let cluster = ClusterConfig::load(&args.config).map_err(config)?;
    if args.check {
        let nodes: Vec<&emx_config::NodeSpec> = match args.node.as_deref() {
            Some(n) => {
                let me = resolve_identity(Some(n), |_| None).map_err(config)?;
                vec![cluster.node_for(&me).map_err(config)?]
            }
            None => cluster.nodes().iter().collect(),
        };
        for spec in &nodes {
            let node_cfg = cluster.node_config(spec.id).map_err(config)?;
            responder_limits(&cluster, spec, &node_cfg)?;
        }
        println!(
            "{}: {} node(s) checked ({}): emxd would start on each",
            args.config.display(),
            nodes.len(),
            nodes
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        return Ok(());
    }
    let me = resolve_identity(args.node.as_deref(), |k| std::env::var(k).ok()).map_err(config)?;
    let spec = cluster.node_for(&me).map_err(config)?.clone();
    let node_cfg = cluster.local_node_config(&me).map_err(config)?;
    init_logging(
        args.log_level
            .map(level_filter)
            .unwrap_or_else(|| file_level(cluster.logging().level)),
        match args.log_format {
            Some(Format::Json) => true,
            Some(Format::Text) => false,
            None => cluster.logging().format == LogFormat::Json,
        },
    );
    // Every line of the main thread says which node wrote it: `srun`, a
    // launcher or a log collector merges many nodes' output into one.
    let _node = tracing::info_span!("emxd", node = %spec.name, node_id = spec.id).entered();

    let max = responder_limits(&cluster, &spec, &node_cfg)?;
    let n_eps = node_cfg.engine.endpoints.len();
    let region_bytes = cluster.memory().region_bytes();

    let stop = Arc::new(AtomicBool::new(false));
    // The last signal's number, for the log.
    let signal = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // SIGHUP too: a terminal that closes under `emxd ... &` would otherwise
    // kill it outright, with no drain and its socket file left behind.
    // But SIGHUP and SIGINT ignored at start stay ignored, as shells expect
    // of the programs they start: `nohup emxd` is meant to outlive its
    // terminal, and a script's background job not to stop on the Ctrl-C
    // meant for the script (whose own clean-up then stops it).
    let ignored = ignored_at_start();
    for sig in [
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ] {
        if sig != signal_hook::consts::SIGTERM && ignored(sig) {
            info!(
                signal = signal_name(sig as usize),
                "signal ignored at start: left ignored"
            );
            continue;
        }
        // A second signal while draining ends emxd at once (exit 1).
        signal_hook::flag::register_conditional_shutdown(sig, 1, stop.clone())
            .map_err(|e| Failure::Start(format!("cannot handle signal {sig}: {e}")))?;
        // The number first: whoever sees `stop` finds it.
        signal_hook::flag::register_usize(sig, signal.clone(), sig as usize)
            .and_then(|_| signal_hook::flag::register(sig, stop.clone()))
            .map_err(|e| {
                Failure::Start(format!("cannot handle {}: {e}", signal_name(sig as usize)))
            })?;
    }
    let control = args
        .control
        .clone()
        .unwrap_or_else(|| default_control_path(&spec.name));
    let (listener, socket_file) = server::bind(&control).map_err(Failure::Start)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let asked = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(server::Gate {
        up: AtomicBool::new(false),
        asked: asked.clone(),
    });
    server::serve(listener, tx, gate.clone()).map_err(Failure::Start)?;

    info!(
        node = spec.id,
        name = %spec.name,
        port = %spec.port,
        config = %args.config.display(),
        control = %control.display(),
        "starting"
    );
    // A signal while the link is awaited (up to `link_wait_ms`) stops emxd
    // then, as one after the start drains it: exit 0.
    // (Acquire: whoever sees `stop` sees the signal's number stored before.)
    let started = start_node_until(&node_cfg, &|| {
        stop.load(Ordering::Acquire) || asked.load(Ordering::Relaxed)
    });
    if let Err(emx::runtime::Error::Stopped) = started {
        let by = match signal.load(Ordering::Relaxed) {
            _ if asked.load(Ordering::Relaxed) => "a shutdown request",
            n => signal_name(n),
        };
        info!(by, "stopped while starting, before the link came up");
        return Ok(());
    }
    let Node {
        mut engine,
        port,
        pool,
        eal,
    } = started.map_err(|e| {
        Failure::Start(format!(
            "cannot start node {:?} on port {}: {e}",
            spec.name, spec.port
        ))
    })?;
    // Peers send to the file's address and take frames only from it: a port
    // that came up with another is a node nobody can reach.
    cluster.check_mac(spec.id, port.mac()).map_err(config)?;
    // Chosen by the engine from the clock: a restart comes back with a later one.
    let epoch = engine.epoch();
    let region = register_memory(&eal, region_bytes).map_err(|e| {
        Failure::Start(format!(
            "cannot register {} MiB of memory: {e}",
            cluster.memory().region_mb
        ))
    })?;
    // A NIC behind VFIO reaches only memory mapped for it.
    region.dma_map(&port).map_err(|e| {
        Failure::Start(format!(
            "cannot map the registered memory for DMA by {}: {e}",
            port.name()
        ))
    })?;
    let mut stations = Vec::with_capacity(n_eps);
    for (i, &id) in node_cfg.engine.endpoints.iter().enumerate() {
        let ep = engine
            .endpoint_id(id)
            .map_err(|e| Failure::Start(format!("endpoint {id}: {e}")))?;
        stations.push(Station::new(
            ep,
            region.clone(),
            i * ops::ECHO_SLOTS * max,
            max,
            // (the liveness deadline does not depend on the MTU)
            node_cfg.engine.protocol.core_config(1500).peer_timeout,
        ));
    }
    info!(
        node = spec.id,
        name = %spec.name,
        epoch,
        link = port.name(),
        mac = %emx_config::Mac::Addr(port.mac()),
        mtu = port.mtu(),
        endpoints = ?node_cfg.engine.endpoints,
        progress = ?node_cfg.engine.progress,
        max_message = max,
        "node up"
    );
    let info = NodeInfo {
        node: spec.id,
        name: spec.name.clone(),
        epoch,
        devargs: spec.port.clone(),
        progress: node_cfg.engine.progress.clone(),
        config: args.config.display().to_string(),
    };
    let parts = Parts {
        engine,
        stations,
        port,
        pool,
        region,
        eal,
        max,
    };
    gate.up.store(true, Ordering::Release);
    let served = Daemon::new(parts, cluster, info, rx, (stop, signal, asked)).run();
    drop(socket_file);
    served.map_err(Failure::Start)
}

fn level_filter(l: Level) -> LevelFilter {
    match l {
        Level::Error => LevelFilter::ERROR,
        Level::Warn => LevelFilter::WARN,
        Level::Info => LevelFilter::INFO,
        Level::Debug => LevelFilter::DEBUG,
        Level::Trace => LevelFilter::TRACE,
    }
}

fn file_level(l: LogLevel) -> LevelFilter {
    match l {
        LogLevel::Error => LevelFilter::ERROR,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Trace => LevelFilter::TRACE,
    }
}

/// What emxd needs of a node's settings beyond the cluster file's own
/// checks; the responder's message limit when they hold.
fn responder_limits(
    cluster: &ClusterConfig,
    spec: &emx_config::NodeSpec,
    node_cfg: &emx::runtime::NodeConfig,
) -> Result<usize, Failure> {
    // The responder's buffers: ECHO_SLOTS per endpoint in the region.
    let n_eps = node_cfg.engine.endpoints.len();
    let region_bytes = cluster.memory().region_bytes();
    let max = ops::max_message(region_bytes / n_eps);
    if max == 0 {
        let problem = format!(
            "{} MiB is too small for {n_eps} endpoints' responders",
            cluster.memory().region_mb
        );
        return Err(Failure::Config(
            cluster.error_at("memory.region_mb", problem).to_string(),
        ));
    }

    // Each endpoint's responder keeps its ECHO and SINK receives posted, and
    // one liveness receive per remote endpoint: with fewer receive slots,
    // peers would go unwatched (never reported down). A check takes one
    // more per peer for its answers, and a message nobody serves one to be
    // drained: with none left for those, every check failed, and such
    // messages held their sender's credit.
    let peers = node_cfg.engine.peers.len();
    let need = ops::ECHO_SLOTS + ops::SINK_SLOTS + 2 * peers + 1;
    let max_recvs = node_cfg
        .engine
        .protocol
        .max_recvs
        .unwrap_or(emx::proto::CoreConfig::default().max_recvs);
    if max_recvs < need {
        let problem = format!(
            "{max_recvs} is too few for emxd on node {:?}: its responder keeps {} receives \
             posted and one for each of its {peers} peer endpoints, a check takes one more \
             for each, and a message nobody serves one to be drained (want at least {need})",
            spec.name,
            ops::ECHO_SLOTS + ops::SINK_SLOTS,
        );
        return Err(Failure::Config(
            cluster.error_at("protocol.max_recvs", problem).to_string(),
        ));
    }

    Ok(max)
}

/// Log lines to stderr, text (coloured on a terminal) or JSON.
fn init_logging(level: LevelFilter, json: bool) {
    let b = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false);
    if json {
        b.json().init();
        JSON_LOGS.store(true, std::sync::atomic::Ordering::Relaxed);
    } else {
        b.with_ansi(std::io::stderr().is_terminal()).init();
    }
    // DPDK's lines too: in the same format (plain lines among JSON ones were
    // dropped, or choked on, by collectors), under the same level.
    emx::runtime::log_dpdk_to_tracing();
}

/// A signal's name for the log (`SIGTERM`); signal numbers differ between
/// architectures.
pub(crate) fn signal_name(n: usize) -> &'static str {
    i32::try_from(n)
        .ok()
        .and_then(signal_hook::low_level::signal_name)
        .unwrap_or("a signal")
}

/// Which signals this process started with ignored: the `SigIgn` mask of
/// /proc/self/status, read before emxd installs a handler (none, if it
/// cannot be read), as a test of one signal number.
fn ignored_at_start() -> impl Fn(i32) -> bool {
    let mask = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("SigIgn:"))
                .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        })
        .unwrap_or(0);
    move |sig| (1..=64).contains(&sig) && mask & (1 << (sig - 1)) != 0
}
