//! `emxctl`: asks a running emxd (over its control socket) for its status,
//! its peers, its counters, to check its links, or to stop.
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use emx_daemon::control::{
    self, default_control_path, CheckReport, PeerRef, Peers, Request, Stats, Status,
};

/// `println!` through [`out`].
macro_rules! outln {
    () => {
        out(format_args!(""))
    };
    ($($t:tt)*) => {
        out(format_args!($($t)*))
    };
}

/// Something was printed on stdout.
static PRINTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A reader of stdout went away: print nothing more.
static READER_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Prints a line to stdout. A reader that went away (`emxctl peers | head
/// -1`) ends the printing quietly, not with a panic (Rust ignores SIGPIPE,
/// and `println!` panics on the write's EPIPE); emxctl still exits with what
/// it asked came to (it used to exit 0, so `emxctl check | head` passed a
/// failed check).
fn out(line: std::fmt::Arguments) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    PRINTED.store(true, Ordering::Relaxed);
    if READER_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut o = std::io::stdout().lock();
    if let Err(e) = writeln!(o, "{line}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            READER_GONE.store(true, Ordering::Relaxed);
            return;
        }
        eprintln!("emxctl: cannot write the output: {e}");
        std::process::exit(1);
    }
}

/// Talks to a running emxd through its control socket.
#[derive(Parser, Debug)]
#[command(
    name = "emxctl",
    version,
    after_help = "Exit status: 0 done; 1 emxd answered that it failed (a check with a failed \
                  message, a refusal, wait's deadline); 2 a mistake in the command line, or \
                  several emxds to choose from; 3 no answer from emxd (none running, the socket \
                  another user's, no reply in time, a reply that is not emxd's)."
)]
struct Args {
    /// The control socket of the emxd to ask.
    #[arg(long, value_name = "PATH", conflicts_with = "node", global = true)]
    control: Option<PathBuf>,
    /// The node whose emxd to ask, by name (its socket is
    /// /run/emx/emxd-NAME.sock) or by id (the emxd in /run/emx that says it
    /// runs that node). Without this or --control: the only emxd that
    /// answers in /run/emx. ($EMX_CONTROL_DIR, when set, stands for
    /// /run/emx, as for emxd.)
    #[arg(long, value_name = "NAME|ID", global = true)]
    node: Option<String>,
    /// Print emxd's reply (JSON) instead of tables; when there is none to
    /// print, an object `{"ok": false, "error": ..., "answered": ...}`
    /// (`answered`: whether emxd answered at all). (A mistake in the
    /// command line gets clap's message only, on stderr.)
    #[arg(long, global = true)]
    json: bool,
    /// Give up on a reply after this many seconds (default 10, and 600 for
    /// check). shutdown then waits up to as long again for emxd to exit;
    /// for wait, this bounds each request, and --within the whole wait.
    #[arg(long, value_name = "SECONDS", global = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: Option<u64>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// The node: id, name, cluster, epoch, endpoints, uptime, link (up or
    /// down, MAC, MTU, speed), port, progress mode, the responder's message
    /// limit and counters, cluster file, pid.
    Status,
    /// Every peer of every local endpoint: state (up, down, unresolved,
    /// unknown), MAC, epoch, silence, smoothed round trip (SRTT_US) and
    /// retransmission timeout (RTO_MS), frames and bytes each way,
    /// retransmissions.
    Peers,
    /// Per endpoint: the link's counters, the responder's, the messages',
    /// and every peer's protocol counters (drops by reason among them).
    Stats,
    /// Echo messages of each size off every peer that is up (or --peer) and
    /// compare every byte; exits 1 when any fails.
    Check {
        /// Only this node (all its endpoints), by name or id.
        #[arg(long, value_name = "NAME|ID")]
        peer: Option<String>,
        /// Message sizes, comma-separated, with K, M or G (binary) allowed.
        /// Default: 1000,1M (one eager, one rendezvous with the default
        /// eager threshold), the larger cut to the smallest responder limit
        /// in the cluster (`status` shows this node's).
        #[arg(long, value_delimiter = ',', value_parser = parse_size)]
        sizes: Vec<u64>,
    },
    /// Stop emxd: it drains what is in flight and exits. Returns once it
    /// has (its control socket gone), or fails after --timeout.
    Shutdown,
    /// Wait until peers are in a state, for scripts: every peer (or those of
    /// --peer) up, or down. Prints how long it took; exits 1 at the deadline.
    Wait {
        /// The state to wait for.
        #[arg(long, value_enum, default_value_t = Want::Up)]
        state: Want,
        /// Only this node's endpoints, by name or id.
        #[arg(long, value_name = "NAME|ID")]
        peer: Option<String>,
        /// Give up after this many seconds. Until then an emxd that does not
        /// answer yet (not started, starting, restarting) is asked again.
        #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = parse_seconds)]
        within: f64,
    },
}

/// A peer state to wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Want {
    Up,
    Down,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&s[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("bad size {s:?} (want bytes, such as 1000, 64K or 1M)"))
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        // (A year at most: a Duration of 1e20 s would panic.)
        Ok(v) if v.is_finite() && (0.0..=MAX_WITHIN).contains(&v) => Ok(v),
        _ => Err(format!(
            "bad time {s:?} (want seconds, such as 30 or 0.5, up to {MAX_WITHIN})"
        )),
    }
}

/// The longest `wait --within`: a year.
const MAX_WITHIN: f64 = 365.0 * 86_400.0;

/// Why emxctl did not do what it was asked, and so its exit status (see
/// the help's "Exit status").
#[derive(Debug)]
enum Fail {
    /// emxd answered: it failed, or said no (1).
    Failed(String),
    /// The command line, or the socket to use, is for the user to fix (2).
    Usage(String),
    /// No answer from emxd (3); whether asking again later may get one
    /// (nothing listens yet, no reply in time) or cannot (the socket is
    /// another user's, what answers is not emxd).
    NoAnswer(String, bool),
}

impl Fail {
    fn code(&self) -> u8 {
        match self {
            Fail::Failed(_) => 1,
            Fail::Usage(_) => 2,
            Fail::NoAnswer(..) => 3,
        }
    }

    fn message(&self) -> &str {
        match self {
            Fail::Failed(m) | Fail::Usage(m) | Fail::NoAnswer(m, _) => m,
        }
    }
}

impl From<control::ClientError> for Fail {
    fn from(e: control::ClientError) -> Fail {
        let transient = e.is_transient();
        Fail::NoAnswer(e.to_string(), transient)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(f) => {
            eprintln!("emxctl: {}", f.message());
            // With --json, stdout holds an object whatever happened: a
            // script piping it to jq gets one, with the reason, unless an
            // answer was printed already, which stands (a shutdown's, say).
            if args.json && !PRINTED.load(std::sync::atomic::Ordering::Relaxed) {
                let answered = matches!(f, Fail::Failed(_));
                let v =
                    serde_json::json!({ "ok": false, "error": f.message(), "answered": answered });
                outln!("{v}");
            }
            ExitCode::from(f.code())
        }
    }
}

/// The socket to talk to: --control, --node (a name, or an id asked of
/// every emxd there), or the only one that answers in the control folder
/// (`/run/emx`).
fn socket(args: &Args) -> Result<PathBuf, Fail> {
    if let Some(p) = &args.control {
        return Ok(p.clone());
    }
    let dir = control::control_dir();
    if let Some(n) = &args.node {
        let path = default_control_path(n);
        // Names are never numbers (the cluster file's rule): a number is an id.
        if n.bytes().all(|b| b.is_ascii_digit()) && n.parse::<u16>().is_err() {
            return Err(Fail::Usage(format!(
                "--node {n}: not a node id (want 0..=65535), and a node's name is never a number"
            )));
        }
        return match n.parse::<u16>() {
            Ok(id) if !path.exists() => by_id(id, &dir),
            _ if !path.exists() => {
                // A mistyped name: say which emxds there are.
                let here = sockets(&dir)?;
                Err(Fail::NoAnswer(
                    format!(
                        "no emxd of node {n:?}: {} does not exist; {}",
                        path.display(),
                        here.listing(&dir)
                    ),
                    true,
                ))
            }
            _ => Ok(path),
        };
    }
    let here = sockets(&dir)?;
    match (here.live.as_slice(), here.denied.first()) {
        ([one], _) => Ok(one.clone()),
        ([], Some(theirs)) => {
            // Served, but not to this user: asking says whose it is.
            Err(
                control::request(theirs, &Request::Status, Duration::from_secs(2))
                    .err()
                    .map_or_else(
                        || {
                            Fail::NoAnswer(
                                format!("{}: permission denied", theirs.display()),
                                false,
                            )
                        },
                        Fail::from,
                    ),
            )
        }
        ([], None) => Err(Fail::NoAnswer(
            format!(
                "no emxd control socket answers in {}: is emxd running? start it with \
                 emxd --config FILE --node NAME, or pass --control PATH (an emxd started \
                 with another EMX_CONTROL_DIR listens there: set the same here)",
                dir.display()
            ),
            true,
        )),
        (many, _) => {
            let names: Vec<String> = many.iter().map(|p| p.display().to_string()).collect();
            Err(Fail::Usage(format!(
                "several emxd control sockets: {}; pick one with --node NAME or --control PATH",
                names.join(", ")
            )))
        }
    }
}

/// The control sockets of a folder, by whether this user may use them.
struct Sockets {
    /// Something listens there and lets this user in.
    live: Vec<PathBuf>,
    /// Something listens there, but the socket is another user's.
    denied: Vec<PathBuf>,
}

impl Sockets {
    /// `emxds here: a, b` (or that there are none), for a message.
    fn listing(&self, dir: &std::path::Path) -> String {
        let names: Vec<String> = self
            .live
            .iter()
            .chain(&self.denied)
            .filter_map(|p| p.file_name()?.to_str().map(node_of))
            .collect();
        if names.is_empty() {
            format!("no emxd answers in {}", dir.display())
        } else {
            format!("emxds in {}: {}", dir.display(), names.join(", "))
        }
    }
}

/// The node a socket's file name names (`emxd-NAME.sock`), or the name.
fn node_of(file: &str) -> String {
    file.strip_prefix("emxd-")
        .and_then(|n| n.strip_suffix(".sock"))
        .unwrap_or(file)
        .to_owned()
}

/// The emxd sockets in `dir` (`emxd-NAME.sock`, and `emxd.sock` as the
/// Docker testbed names its one) that something listens on: one left by an
/// emxd that was killed refuses connections, and is no emxd to choose. A
/// socket another user's emxd serves is kept apart (it used to be passed
/// over, and that emxd reported as not running). A folder that cannot be
/// read is an error, not an empty one.
fn sockets(dir: &std::path::Path) -> Result<Sockets, Fail> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        // (A folder not made yet may be by an emxd starting.)
        let missing = e.kind() == std::io::ErrorKind::NotFound;
        let why = if missing {
            format!(
                "{} does not exist: no emxd started here (an emxd started with another \
                 EMX_CONTROL_DIR listens there: set the same here, or pass --control PATH)",
                dir.display()
            )
        } else {
            format!("cannot read the control folder {}: {e}", dir.display())
        };
        Fail::NoAnswer(why, missing)
    })?;
    let mut found = Sockets {
        live: Vec::new(),
        denied: Vec::new(),
    };
    for p in entries.filter_map(Result::ok).map(|e| e.path()) {
        let ours = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n == "emxd.sock" || (n.starts_with("emxd-") && n.ends_with(".sock")));
        if !ours {
            continue;
        }
        // (Not waiting: one whose queue of connections is full listens.)
        match control::connect_by(&p, std::time::Instant::now()) {
            Ok(_) => found.live.push(p),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => found.live.push(p),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => found.denied.push(p),
            Err(_) => {}
        }
    }
    found.live.sort();
    found.denied.sort();
    Ok(found)
}

/// The socket of the emxd in `dir` that runs node `id`: each that answers
/// is asked its status.
fn by_id(id: u16, dir: &std::path::Path) -> Result<PathBuf, Fail> {
    let here = sockets(dir)?;
    for p in &here.live {
        let status = control::request(p, &Request::Status, Duration::from_secs(2));
        if status.is_ok_and(|v| v["node"].as_u64() == Some(u64::from(id))) {
            return Ok(p.clone());
        }
    }
    let denied = if here.denied.is_empty() {
        String::new()
    } else {
        format!(
            ", and {} another user's (run emxctl as that user)",
            here.denied.len()
        )
    };
    Err(Fail::NoAnswer(
        format!(
            "no emxd of node id {id} answers in {} ({} asked{denied}); give --node NAME or \
             --control PATH",
            dir.display(),
            here.live.len()
        ),
        true,
    ))
}

/// `emxctl wait`: polls `peers` until the chosen ones are all in `want`,
/// asking again, until `within` seconds are up, an emxd that does not answer
/// yet or says no (starting, restarting); each request waits at most
/// `timeout` for its reply. The socket is found again on every turn: an
/// emxd started just before the wait has none yet (the wait used to give
/// up at once), and one found by id answers only once started.
fn wait(
    args: &Args,
    (want, peer, within): (Want, Option<&str>, f64),
    timeout: Duration,
) -> Result<ExitCode, Fail> {
    let json = args.json;
    let t = std::time::Instant::now();
    let deadline = Duration::from_secs_f64(within);
    // As `check --peer` reads a peer: by id, or by name.
    let wanted = peer.map(PeerRef::parse);
    let chosen = |e: &control::PeerEntry| {
        wanted
            .as_ref()
            .is_none_or(|p| p.names(e.node, e.name.as_deref()))
    };
    let label = |e: &control::PeerEntry| {
        format!(
            "{}:{}",
            e.name.clone().unwrap_or(e.node.to_string()),
            e.endpoint
        )
    };
    let target = match want {
        Want::Up => control::PeerState::Up,
        Want::Down => control::PeerState::Down,
    };
    // Whether any emxd answered: a wait that never got an answer ends as
    // one (exit 3), not as a wait whose peers did not come (exit 1).
    let mut answered = false;
    loop {
        let left = deadline.saturating_sub(t.elapsed());
        let asked = socket(args).and_then(|path| {
            control::request(&path, &Request::Peers, timeout.min(left).max(MIN_ASK))
                .map_err(Fail::from)
        });
        // Why not yet, for the message at the deadline.
        let why = match asked {
            // Asking again cannot help: say so now, not at the deadline.
            Err(f @ (Fail::NoAnswer(_, false) | Fail::Usage(_))) => return Err(f),
            Err(f) => f.message().to_owned(),
            Ok(reply) if reply["ok"].as_bool() != Some(true) => {
                answered = true;
                format!("emxd said: {}", reply["error"].as_str().unwrap_or("no"))
            }
            Ok(reply) => {
                answered = true;
                let peers: Peers =
                    serde_json::from_value(reply.clone()).map_err(|e| unexpected("peers", &e))?;
                let mine: Vec<&control::PeerEntry> =
                    peers.peers.iter().filter(|e| chosen(e)).collect();
                if mine.is_empty() {
                    let known: Vec<String> = peers.peers.iter().map(label).collect();
                    return Err(Fail::Failed(format!(
                        "{} (peers: {})",
                        peer.map_or("this node has no peers".to_owned(), |p| format!(
                            "{p} is not a peer of this node"
                        )),
                        if known.is_empty() {
                            "none".to_owned()
                        } else {
                            known.join(", ")
                        }
                    )));
                }
                if mine.iter().all(|e| e.state == target) {
                    if json {
                        let mut reply = reply;
                        reply["elapsed_s"] = t.elapsed().as_secs_f64().into();
                        outln!("{reply}");
                    } else {
                        outln!(
                            "{} {} after {:.3} s",
                            peer.map_or("every peer".to_owned(), |p| format!("peer {p}")),
                            target.as_str(),
                            t.elapsed().as_secs_f64()
                        );
                    }
                    return Ok(ExitCode::SUCCESS);
                }
                let states: Vec<String> = mine
                    .iter()
                    .map(|e| format!("{}: {}", label(e), e.state.as_str()))
                    .collect();
                states.join(", ")
            }
        };
        if t.elapsed() >= deadline {
            let why = format!("not all {} within {within} s: {why}", target.as_str());
            return Err(if answered {
                Fail::Failed(why)
            } else {
                Fail::NoAnswer(why, true)
            });
        }
        std::thread::sleep(Duration::from_millis(20).min(deadline.saturating_sub(t.elapsed())));
    }
}

/// A reply that does not read as emxctl expects: emxd's own JSON (a wrong
/// version of one of them, most likely), with serde's words for where.
fn unexpected(what: &str, e: &serde_json::Error) -> Fail {
    Fail::NoAnswer(
        format!(
            "emxd's reply to {what} is not what emxctl expects ({e}); do emxctl and emxd \
             come from one build? (--version; --json prints the reply as it came)"
        ),
        false,
    )
}

/// The least time `wait` gives a request near its deadline.
const MIN_ASK: Duration = Duration::from_millis(100);

fn run(args: &Args) -> Result<ExitCode, Fail> {
    if let Cmd::Wait {
        state,
        peer,
        within,
    } = &args.cmd
    {
        let timeout = Duration::from_secs(args.timeout.unwrap_or(10));
        return wait(args, (*state, peer.as_deref(), *within), timeout);
    }
    let path = socket(args)?;
    let req = match &args.cmd {
        Cmd::Wait { .. } => unreachable!("handled above"),
        Cmd::Status => Request::Status,
        Cmd::Peers => Request::Peers,
        Cmd::Stats => Request::Stats,
        Cmd::Check { peer, sizes } => Request::Check {
            sizes: (!sizes.is_empty()).then(|| sizes.clone()),
            peer: peer.as_deref().map(PeerRef::parse),
        },
        Cmd::Shutdown => Request::Shutdown,
    };
    let default_timeout = if matches!(req, Request::Check { .. }) {
        600
    } else {
        10
    };
    let timeout = Duration::from_secs(args.timeout.unwrap_or(default_timeout));
    let reply = control::request(&path, &req, timeout)?;
    let ok = reply["ok"].as_bool() == Some(true);
    if args.json {
        // The reply first: a shutdown's stands whether emxd then exits in
        // time or not.
        outln!("{reply}");
    }
    if ok && matches!(args.cmd, Cmd::Shutdown) {
        gone(&path, timeout).map_err(Fail::Failed)?;
    }
    if args.json {
        return Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let error = match &reply["error"] {
        serde_json::Value::String(e) => e.clone(),
        serde_json::Value::Null => "emxd said no".to_owned(),
        other => format!("emxd said no: {other}"),
    };
    let parse = |what: &'static str| move |e: serde_json::Error| unexpected(what, &e);
    match &args.cmd {
        Cmd::Status if ok => print_status(&serde_json::from_value(reply).map_err(parse("status"))?),
        Cmd::Peers if ok => print_peers(&serde_json::from_value(reply).map_err(parse("peers"))?),
        Cmd::Stats if ok => print_stats(&serde_json::from_value(reply).map_err(parse("stats"))?),
        Cmd::Check { .. } => {
            // A check that ran has results even when it failed.
            match serde_json::from_value::<CheckReport>(reply) {
                Ok(report) => print_check(&report),
                Err(e) if ok => return Err(parse("check")(e)),
                Err(_) => {}
            }
        }
        Cmd::Shutdown if ok => outln!("emxd stopped"),
        _ => {}
    }
    if ok {
        Ok(ExitCode::SUCCESS)
    } else {
        Err(Fail::Failed(error))
    }
}

/// Waits until the emxd at `path`, told to stop, is gone (its socket refuses
/// or is removed), for up to `timeout`: a script that starts the next one
/// right after `emxctl shutdown` used to find this one still serving.
fn gone(path: &std::path::Path, timeout: Duration) -> Result<(), String> {
    let t = std::time::Instant::now();
    while std::os::unix::net::UnixStream::connect(path).is_ok() {
        if t.elapsed() >= timeout {
            return Err(format!(
                "emxd said it stops, but still answers at {} after {} s",
                path.display(),
                timeout.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Prints rows as columns, the first row as the header.
fn table(rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, s)| format!("{s:<w$}", w = widths[c]))
            .collect();
        outln!("{}", line.join("  ").trim_end());
    }
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// A message size as `--sizes` takes it: `64K` or `1M` where that is exact,
/// bytes otherwise (`1000`).
fn size_label(n: u64) -> String {
    match n {
        0 => "0".to_owned(),
        n if n % (1 << 30) == 0 => format!("{}G", n >> 30),
        n if n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn print_status(s: &Status) {
    let r = &s.responder;
    let progress = match s.core {
        Some(c) => format!("{} (core {c})", s.progress),
        None => s.progress.clone(),
    };
    let rows = vec![
        vec![
            "node".into(),
            format!("{} (id {}), cluster {}", s.name, s.node, s.cluster),
        ],
        vec!["epoch".into(), s.epoch.to_string()],
        vec![
            "endpoints".into(),
            s.endpoints
                .iter()
                .map(u8::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        ],
        vec!["uptime".into(), format!("{:.1} s", s.uptime_s)],
        vec![
            "link".into(),
            format!(
                "{} {}, mac {}, mtu {}{}",
                s.link.name,
                if s.link.up { "up" } else { "DOWN" },
                s.link.mac,
                s.link.mtu,
                if s.link.speed_mbps > 0 {
                    format!(", {} Mbit/s", s.link.speed_mbps)
                } else {
                    String::new()
                }
            ),
        ],
        vec!["port".into(), s.link.devargs.clone()],
        vec!["progress".into(), progress],
        vec![
            "max message".into(),
            format!("{} ({})", s.max_message, bytes(s.max_message)),
        ],
        vec![
            "responder".into(),
            format!(
                "echoed {} ({}), sunk {} ({}), pongs {}, truncated {}, discarded {}, stray {}, \
                 failed {}",
                r.echoed,
                bytes(r.echoed_bytes),
                r.sunk,
                bytes(r.sunk_bytes),
                r.pongs,
                r.truncated,
                r.discarded,
                r.stray,
                r.failed
            ),
        ],
        vec!["config".into(), s.config.clone()],
        vec!["pid".into(), s.pid.to_string()],
    ];
    table(&rows);
}

fn print_peers(p: &Peers) {
    let mut rows = vec![[
        "LOCAL",
        "NODE",
        "NAME",
        "EP",
        "STATE",
        "EPOCH",
        "MAC",
        "SILENT_MS",
        "SRTT_US",
        "RTO_MS",
        "FRAMES_TX",
        "FRAMES_RX",
        "BYTES_TX",
        "BYTES_RX",
        "RETX",
    ]
    .map(String::from)
    .to_vec()];
    for e in &p.peers {
        rows.push(vec![
            e.local.to_string(),
            e.node.to_string(),
            opt(e.name.clone()),
            e.endpoint.to_string(),
            e.state.as_str().to_owned(),
            opt(e.epoch),
            e.mac.clone(),
            opt(e.silent_ms.map(|m| format!("{m:.1}"))),
            opt(e.srtt_us.map(|u| format!("{u:.1}"))),
            opt(e.rto_ms.map(|m| format!("{m:.3}"))),
            e.frames_sent.to_string(),
            e.frames_received.to_string(),
            bytes(e.bytes_sent),
            bytes(e.bytes_received),
            e.retransmits.to_string(),
        ]);
    }
    if p.peers.is_empty() {
        outln!("no peers");
    } else {
        table(&rows);
    }
}

fn print_stats(s: &Stats) {
    for (i, e) in s.endpoints.iter().enumerate() {
        if i > 0 {
            outln!();
        }
        let l = &e.link;
        outln!("endpoint {}", e.endpoint);
        outln!(
            "  link: rx {} frames ({}, {} chained), tx {} frames ({}), tx full {}, no buffer {}, payload copied {}, attached {}",
            l.rx_frames,
            bytes(l.rx_bytes),
            l.rx_chained,
            l.tx_frames,
            bytes(l.tx_bytes),
            l.tx_full,
            l.tx_no_buffer,
            bytes(l.payload_copied),
            bytes(l.payload_attached)
        );
        let r = &e.responder;
        outln!(
            "  responder: echoed {} ({}), sunk {} ({}), pongs {}, truncated {}, discarded {}, stray {}, failed {}",
            r.echoed,
            bytes(r.echoed_bytes),
            r.sunk,
            bytes(r.sunk_bytes),
            r.pongs,
            r.truncated,
            r.discarded,
            r.stray,
            r.failed
        );
        let m = &e.messages;
        outln!(
            "  messages: sent {}, received {}, arrived unexpected {} (store high water {}), withdrawn by their senders {}, dropped before a peer {}",
            m.sends_completed,
            m.recvs_completed,
            m.unexpected,
            bytes(m.unexpected_high_water),
            m.withdrawn,
            m.dropped
        );
        if m.internal_errors != 0 {
            outln!(
                "  INTERNAL ERRORS: {} (states emx's protocol core rules out: a bug; please report it with this node's log)",
                m.internal_errors
            );
        }
        let mut rows = vec![[
            "  PEER",
            "FRAMES_TX",
            "FRAMES_RX",
            "BYTES_TX",
            "BYTES_RX",
            "RETX",
            "TIMEOUTS",
            "DUPS",
            "ACKS_TX",
            "ACKS_RX",
            "CREDIT_STALLS",
            "WINDOW_STALLS",
            "PACKED",
            "KEEPALIVES",
            "HELLOS",
            "DROPPED",
        ]
        .map(String::from)
        .to_vec()];
        for p in &e.peers {
            let dropped = if p.dropped_by_reason.is_empty() {
                p.dropped.to_string()
            } else {
                let why: Vec<String> = p
                    .dropped_by_reason
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                format!("{} ({})", p.dropped, why.join(", "))
            };
            rows.push(vec![
                format!(
                    "  {}:{}",
                    p.name
                        .as_ref()
                        .map_or(p.node.to_string(), |n| format!("{n} ({})", p.node)),
                    p.endpoint
                ),
                p.frames_sent.to_string(),
                p.frames_received.to_string(),
                bytes(p.bytes_sent),
                bytes(p.bytes_received),
                p.retransmits.to_string(),
                p.timeouts.to_string(),
                p.duplicates.to_string(),
                p.acks_sent.to_string(),
                p.acks_received.to_string(),
                p.credit_stalls.to_string(),
                p.window_stalls.to_string(),
                p.msgs_packed.to_string(),
                p.keepalives_sent.to_string(),
                p.hellos_sent.to_string(),
                dropped,
            ]);
        }
        table(&rows);
    }
}

fn print_check(r: &CheckReport) {
    let mut rows = vec![["PEER", "EP", "SIZE", "RESULT", "RTT_US"]
        .map(String::from)
        .to_vec()];
    for c in &r.results {
        let peer = match &c.name {
            Some(n) => format!("{n} ({})", c.node),
            None => c.node.to_string(),
        };
        rows.push(vec![
            peer,
            c.endpoint.to_string(),
            size_label(c.size),
            if c.ok {
                "ok".into()
            } else {
                format!("FAILED: {}", c.error.as_deref().unwrap_or("?"))
            },
            opt(c.rtt_us.map(|t| format!("{t:.1}"))),
        ]);
    }
    if !r.results.is_empty() {
        table(&rows);
    }
    outln!(
        "{} of {} messages came back byte-exact",
        r.passed,
        r.passed.saturating_add(r.failed)
    );
}

#[cfg(test)]
mod tests {
    use super::{parse_size, size_label};

    /// The check table names a size as `--sizes` takes it back.
    #[test]
    fn size_labels_read_back_as_sizes() {
        for (n, label) in [
            (0, "0"),
            (1000, "1000"),
            (1024, "1K"),
            (64 << 10, "64K"),
            (1 << 20, "1M"),
            ((1 << 20) + 1, "1048577"),
            (12 << 20, "12M"),
            (3 << 30, "3G"),
        ] {
            assert_eq!(size_label(n), label);
            assert_eq!(parse_size(label), Ok(n));
        }
    }
}
