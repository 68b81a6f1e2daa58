//! emxd and emxctl as their users run them: bad configurations refused with
//! a message that names the file and field, and two daemons over a memif
//! pair (inline progress) that see each other, echo byte-exact both ways,
//! drain on SIGTERM, notice a stopped peer within the liveness deadline and
//! a restarted one with its new epoch.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use emx_config::{ClusterConfig, Mac};
use emx_daemon::control::{reply_ok, PeerEntry, PeerState, Peers};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

const EMXD: &str = env!("CARGO_BIN_EXE_emxd");
const EMXCTL: &str = env!("CARGO_BIN_EXE_emxctl");
const EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../config/examples/memif-pair.toml"
);

/// The liveness deadline the test cluster file sets, and its keepalive.
const PEER_TIMEOUT: Duration = Duration::from_millis(300);
const KEEPALIVE_US: u64 = 50_000;

/// A directory of its own for one test, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("emxd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// emxd with `args`, in an environment that says nothing about which node
/// it is.
fn emxd(args: &[&str]) -> Output {
    let mut c = Command::new(EMXD);
    c.args(args);
    for v in emx_config::RANK_VARIABLES
        .iter()
        .chain(&[emx_config::NODE_VARIABLE, "EMX_CONFIG"])
    {
        c.env_remove(v);
    }
    c.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_missing_file_is_a_configuration_error() {
    let dir = TempDir::new("missing");
    let file = dir.path("nope.toml");
    let o = emxd(&["--config", file.to_str().unwrap(), "--node", "server"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(&format!(
            "emxd: {}: cannot read the cluster file",
            file.display()
        )),
        "{err}"
    );
}

#[test]
fn a_broken_file_names_its_line_and_field() {
    let dir = TempDir::new("broken");
    let file = dir.path("broken.toml");
    let text = std::fs::read_to_string(EXAMPLE).unwrap();
    // The second node's MAC, broken.
    let at = text.rfind("mac = \"auto\"").unwrap();
    let text = format!("{}mac = \"02:00:zz\"{}", &text[..at], &text[at + 12..]);
    let line = text[..at].lines().count() + 1;
    std::fs::write(&file, &text).unwrap();
    let o = emxd(&["--config", file.to_str().unwrap(), "--node", "server"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let want = format!(
        "emxd: {}:{line}: node[1].mac: bad MAC address",
        file.display()
    );
    assert!(err.starts_with(&want), "want {want:?}, got {err:?}");
}

#[test]
fn an_unknown_node_or_core_is_a_configuration_error() {
    let o = emxd(&["--config", EXAMPLE, "--node", "nosuch"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("memif-pair.toml"), "{err}");
    assert!(
        err.contains("node \"nosuch\" (from --node) is not in the file"),
        "{err}"
    );
    assert!(err.contains("server (id 1), client (id 2)"), "{err}");

    // No flag and no variable: which node is meant cannot be told.
    let o = emxd(&["--config", EXAMPLE]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("cannot tell which node"),
        "{}",
        stderr(&o)
    );

    // A polling core this machine does not have.
    let dir = TempDir::new("cores");
    let file = dir.path("cores.toml");
    let text = std::fs::read_to_string(EXAMPLE).unwrap().replacen(
        "endpoints = [0]",
        "endpoints = [0]\ncores = [4096]",
        1,
    );
    std::fs::write(&file, text).unwrap();
    let o = emxd(&["--config", file.to_str().unwrap(), "--node", "1"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("node[0].cores[0]: core 4096 is out of range"),
        "{err}"
    );
}

/// `emxd --check` checks a file for every node as emxd would at start, and
/// starts nothing.
#[test]
fn check_a_cluster_file_without_starting() {
    let o = emxd(&["--check", "--config", EXAMPLE]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(
        out.contains("2 node(s) checked (server, client): emxd would start on each"),
        "{out}"
    );
    assert!(!stderr(&o).contains("EAL"), "{}", stderr(&o));
    let o = emxd(&["--check", "--config", EXAMPLE, "--node", "nosuch"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn too_few_receive_slots_for_the_responder_is_a_configuration_error() {
    let dir = TempDir::new("fewrecvs");
    let file = dir.path("few.toml");
    let text = std::fs::read_to_string(EXAMPLE).unwrap();
    let text = if text.contains("[protocol]") {
        text.replacen("[protocol]", "[protocol]\nmax_recvs = 4", 1)
    } else {
        format!("{text}\n[protocol]\nmax_recvs = 4\n")
    };
    std::fs::write(&file, &text).unwrap();
    let o = emxd(&["--config", file.to_str().unwrap(), "--node", "server"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    // On its line, as the file's own checks say theirs.
    let line = 1 + text.lines().position(|l| l == "max_recvs = 4").unwrap();
    assert!(
        err.contains(&format!(
            "few.toml:{line}: protocol.max_recvs: 4 is too few"
        )),
        "{err}"
    );
    // `--check` says the same without starting anything, for every node
    // (or --node's).
    for node in [&[][..], &["--node", "client"][..]] {
        let mut args = vec!["--check", "--config", file.to_str().unwrap()];
        args.extend(node);
        let o = emxd(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("protocol.max_recvs: 4 is too few"), "{err}");
        assert!(!err.contains("EAL"), "started DPDK: {err}");
    }
    // Enough for the responder and the liveness receive (7 here), but none
    // left for a check's answers: every check failed.
    let text = text.replace("max_recvs = 4", "max_recvs = 7");
    std::fs::write(&file, &text).unwrap();
    let o = emxd(&["--config", file.to_str().unwrap(), "--node", "server"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("7 is too few") && err.contains("(want at least 9)"),
        "{err}"
    );
}

/// The example cluster with the server's port on a driver that does not
/// exist (and an EAL file prefix of its own): emxd binds its control
/// socket, then fails to start the node.
fn noport_config(dir: &TempDir) -> PathBuf {
    let file = dir.path("noport.toml");
    let text = std::fs::read_to_string(EXAMPLE)
        .unwrap()
        .replace(
            "net_memif0,role=server,id=0,socket=/tmp/emx-memif.sock",
            "net_nosuchdriver0",
        )
        .replacen(
            "endpoints = [0]",
            &format!(
                "endpoints = [0]\neal_args = [\"--file-prefix=emxd-noport-{}\"]",
                std::process::id()
            ),
            1,
        );
    std::fs::write(&file, text).unwrap();
    file
}

#[test]
fn a_port_that_cannot_be_opened_exits_1() {
    let dir = TempDir::new("noport");
    let file = noport_config(&dir);
    let control = dir.path("s.sock");
    let run = |more: &[&str]| {
        let base = [
            "--config",
            file.to_str().unwrap(),
            "--node",
            "server",
            "--control",
            control.to_str().unwrap(),
        ];
        emxd(&[&base[..], more].concat())
    };
    let o = run(&[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("emxd: cannot start node \"server\" on port net_nosuchdriver0"),
        "{err}"
    );
    assert!(!control.exists(), "the control socket is removed");
    // DPDK's own lines go through emxd's log: in text, in the node's span;
    // with JSON logs, as JSON lines (they used to be plain text among them).
    assert!(
        err.lines()
            .any(|l| l.contains("ERROR emxd{node=server") && l.contains("EAL: ")),
        "{err}"
    );
    let (err, lines) = json_lines(&run(&["--log-format", "json"]));
    assert!(
        lines.iter().any(|l| l["level"] == "ERROR"
            && l["span"]["node"] == "server"
            && l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("EAL: "))),
        "{err}"
    );
}

/// `--control` naming a file that is not a socket (the cluster file, given
/// in the wrong place) is refused and the file left alone.
#[test]
fn a_control_path_that_is_not_a_socket_is_left_alone() {
    let dir = TempDir::new("notsock");
    let file = dir.path("precious.toml");
    std::fs::write(&file, "keep me\n").unwrap();
    let o = emxd(&[
        "--config",
        EXAMPLE,
        "--node",
        "server",
        "--control",
        file.to_str().unwrap(),
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me\n");
}

/// The stderr of an emxd that exited 1 with JSON logs, and its lines, each
/// of which must be a JSON object.
fn json_lines(o: &std::process::Output) -> (String, Vec<Value>) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let lines = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l}")))
        .collect();
    (err, lines)
}

/// With JSON logs, the reason emxd stops is a JSON line too: every line of
/// its stderr is one object (a plain `emxd: ...` line among them was
/// dropped, or choked on, by collectors of JSON lines).
#[test]
fn json_logs_carry_the_reason_emxd_stops() {
    let o = emxd(&[
        "--config",
        EXAMPLE,
        "--node",
        "server",
        "--log-format",
        "json",
        "--control",
        "/proc/no-such-dir/emxd.sock",
    ]);
    let (err, lines) = json_lines(&o);
    let last = lines.last().expect("a line");
    assert_eq!(last["level"], "ERROR", "{err}");
    assert_eq!(last["fields"]["exit"], 1, "{err}");
    let msg = last["fields"]["message"].as_str().unwrap();
    assert!(msg.contains("cannot create /proc/no-such-dir"), "{err}");
}

/// emxd looks at what is on its control path and binds under a lock on the
/// directory: one that another emxd (here, the test) holds while it binds
/// is waited for, and an emxd starting beside it does not bind meanwhile.
/// Two emxds that start at once on one path used to both take it for stale,
/// the second replacing the first's socket.
#[test]
fn a_control_socket_is_bound_under_a_lock_on_its_directory() {
    let dir = TempDir::new("locked");
    let file = noport_config(&dir);
    let held = nix::fcntl::Flock::lock(
        std::fs::File::open(&dir.0).unwrap(),
        nix::fcntl::FlockArg::LockExclusiveNonblock,
    )
    .map_err(|(_, e)| e)
    .unwrap();
    let mut d = Daemon::start(&file, "server", &dir, "server.log");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        d.child.try_wait().unwrap().is_none(),
        "emxd did not wait for the lock"
    );
    assert!(!d.control.exists(), "emxd bound beside the lock");
    drop(held);
    // Once the lock is free it binds, and goes on to its port (which fails).
    let status = d.wait(Duration::from_secs(10));
    let err = d.log();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("cannot start node"), "{err}");
}

#[test]
fn emxctl_without_emxd_says_how_to_start_it() {
    let dir = TempDir::new("noctl");
    let sock = dir.path("none.sock");
    let control = sock.to_str().unwrap();
    // emxctl with `args`, its control folder this test's: its exit code,
    // what it said on stderr, and its stdout.
    let ctl = |args: &[&str]| {
        let o = Command::new(EMXCTL)
            .env("EMX_CONTROL_DIR", &dir.0)
            .args(args)
            .output()
            .unwrap();
        (o.status.code(), stderr(&o), o.stdout)
    };
    let (code, err, _) = ctl(&["--control", control, "status"]);
    // 3: no emxd answered (1 says emxd answered that something failed).
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("is emxd running?"), "{err}");
    assert!(err.contains("emxd --config"), "{err}");
    // Looking in a control folder where none answers: an emxd started
    // with another EMX_CONTROL_DIR is the likely cause.
    let (code, err, _) = ctl(&["status"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("EMX_CONTROL_DIR"), "{err}");
    // A node's name mistyped: the emxds that are there are named.
    fake_emxd_up(&dir.path("emxd-server.sock"), peers_reply(1, PeerState::Up));
    let (code, err, _) = ctl(&["--node", "sever", "status"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("no emxd of node \"sever\"") && err.contains(": server"),
        "{err}"
    );
    // A number past any node id is refused as emxd refuses it.
    let (code, err, _) = ctl(&["--node", "70000", "status"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a node id (want 0..=65535)"), "{err}");
    // With --json, an object on stdout all the same.
    let (code, _, out) = ctl(&["--control", control, "status", "--json"]);
    assert_eq!(code, Some(3));
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        (&v["ok"], &v["answered"]),
        (&false.into(), &false.into()),
        "{v}"
    );
    assert!(v["error"].as_str().unwrap().contains("no emxd at"), "{v}");
    // A path that is no socket is not a reason to start emxd.
    let (_, err, _) = ctl(&["--control", dir.0.to_str().unwrap(), "status"]);
    assert!(
        err.contains("it is not a socket") && !err.contains("is emxd running"),
        "{err}"
    );
}

/// A fake emxd at `sock` that serves each connection with `answer` (on a
/// thread of its own), without reading what was asked.
fn fake_answering(sock: &Path, answer: fn(&UnixStream)) {
    let l = std::os::unix::net::UnixListener::bind(sock).unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            std::thread::spawn(move || answer(&c));
        }
    });
}

#[test]
fn emxctl_says_when_no_reply_came() {
    let dir = TempDir::new("noreply");
    // `emxctl --timeout T status` at `sock`: its exit code, what it said,
    // and how long it took.
    let status = |sock: &Path, timeout: &str| {
        let t = Instant::now();
        let o = Command::new(EMXCTL)
            .arg("--control")
            .arg(sock)
            .args(["--timeout", timeout, "status"])
            .output()
            .unwrap();
        (o.status.code(), stderr(&o), t.elapsed())
    };
    let sock = dir.path("mute.sock");
    // Takes the connection and never answers.
    let _mute = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let (code, err, _) = status(&sock, "1");
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no reply from emxd within 1 s"), "{err}");

    // One that answers a byte at a time: --timeout bounds the whole reply
    // (each byte used to start the timeout again, for ever).
    let slow = dir.path("slow.sock");
    fake_answering(&slow, |mut c| {
        while c.write_all(b" ").is_ok() {
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let (code, err, took) = status(&slow, "1");
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no reply from emxd within 1 s"), "{err}");
    assert!(took < Duration::from_secs(3), "{took:?}");

    // One whose queue of connections is full (it takes none): --timeout
    // bounds the connect too (a blocking connect waited for ever).
    let full = dir.path("full.sock");
    let _full = std::os::unix::net::UnixListener::bind(&full).unwrap();
    let mut held = Vec::new();
    loop {
        use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
        let fd = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK,
            None,
        )
        .unwrap();
        match connect(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &UnixAddr::new(&full).unwrap(),
        ) {
            Ok(()) => held.push(fd),
            Err(nix::errno::Errno::EAGAIN) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(held.len() < 100_000, "the queue never filled");
    }
    let mut child = Command::new(EMXCTL)
        .arg("--control")
        .arg(&full)
        .args(["--timeout", "1", "status"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("emxctl still connecting after 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = stderr(&child.wait_with_output().unwrap());
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no reply from emxd within 1 s"), "{err}");
    drop(held);

    // One that answers without end: refused past 64 MiB, and quoted short
    // (emxctl gathered it all, and printed it all).
    let huge = dir.path("huge.sock");
    fake_answering(&huge, |mut c| {
        let chunk = vec![b'x'; 1 << 20];
        while c.write_all(&chunk).is_ok() {}
    });
    // (The size ends it, not the clock: time enough for 64 MiB on a busy
    // machine.)
    let (code, err, _) = status(&huge, "60");
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("more than 64 MiB"), "{err}");
    assert!(err.len() < 2000, "{} bytes of error", err.len());
}

/// The example memif pair made private to this test: its own socket (a
/// file, not an abstract one, so that the test can see the server is up),
/// an EAL file prefix per node, a short liveness deadline, and with `macs`
/// the ports' MACs given (in the file and to memif) instead of `auto`.
fn cluster_file(dir: &TempDir, macs: bool) -> PathBuf {
    let sock = dir.path("memif.sock");
    let tag = std::process::id();
    let mut text = std::fs::read_to_string(EXAMPLE).unwrap();
    for (role, mac, n) in [
        ("server", "02:e4:00:00:00:01", 1),
        ("client", "02:e4:00:00:00:02", 2),
    ] {
        let mut port = format!(
            "role={role},id=0,socket={},socket-abstract=no",
            sock.display()
        );
        if macs {
            text = text.replacen("mac = \"auto\"", &format!("mac = \"{mac}\""), 1);
            port.push_str(&format!(",mac={mac}"));
        }
        text = text.replace(
            &format!("role={role},id=0,socket=/tmp/emx-memif.sock"),
            &port,
        );
        // The first `endpoints = [0]` not followed by eal_args yet.
        let at = text
            .match_indices("endpoints = [0]\n")
            .nth(n - 1)
            .expect("two nodes")
            .0;
        let end = at + "endpoints = [0]\n".len();
        text.insert_str(
            end,
            &format!("eal_args = [\"--file-prefix=emxd-test-{tag}-{role}\"]\n"),
        );
    }
    text = text
        .replace(
            "peer_timeout_us = 200000",
            &format!("peer_timeout_us = {}", PEER_TIMEOUT.as_micros()),
        )
        .replace(
            "keepalive_us = 10000",
            &format!("keepalive_us = {KEEPALIVE_US}"),
        );
    let path = dir.path("cluster.toml");
    std::fs::write(&path, &text).unwrap();
    // What the test relies on.
    let c = ClusterConfig::parse(&text, path.display().to_string()).unwrap();
    assert_eq!(c.memory().hugepages, emx::runtime::Hugepages::Never);
    assert_eq!(
        c.protocol().peer_timeout_us,
        Some(PEER_TIMEOUT.as_micros() as u64)
    );
    for n in c.nodes() {
        assert_eq!(matches!(n.mac, Mac::Addr(_)), macs, "{n:?}");
        assert!(n.port.contains(sock.to_str().unwrap()), "{n:?}");
        assert_eq!(n.eal_args.len(), 1, "{n:?}");
        assert!(n.cores.is_empty(), "inline progress: {n:?}");
    }
    path
}

/// One emxd, its log in a file; killed if the test ends with it running.
struct Daemon {
    child: Child,
    log: PathBuf,
    control: PathBuf,
}

impl Daemon {
    fn start(config: &Path, node: &str, dir: &TempDir, log: &str) -> Daemon {
        Daemon::spawn(config, node, dir, log, false, None)
    }

    /// Started by `wrapper` (`nohup`), which runs emxd in its place.
    fn start_under(wrapper: &str, config: &Path, node: &str, dir: &TempDir, log: &str) -> Daemon {
        Daemon::spawn(config, node, dir, log, false, Some(wrapper))
    }

    /// Started with no --control, in `EMX_CONTROL_DIR` = `dir`: its socket
    /// is `emxd-<node>.sock` there.
    fn start_default(config: &Path, node: &str, dir: &TempDir, log: &str) -> Daemon {
        Daemon::spawn(config, node, dir, log, true, None)
    }

    fn spawn(
        config: &Path,
        node: &str,
        dir: &TempDir,
        log: &str,
        default: bool,
        wrapper: Option<&str>,
    ) -> Daemon {
        let log = dir.path(log);
        let control = if default {
            dir.path(&format!("emxd-{node}.sock"))
        } else {
            dir.path(&format!("{node}.sock"))
        };
        let mut cmd = match wrapper {
            Some(w) => {
                let mut c = Command::new(w);
                c.arg(EMXD);
                c
            }
            None => Command::new(EMXD),
        };
        cmd.args(["--config", config.to_str().unwrap(), "--node", node]);
        if default {
            cmd.env("EMX_CONTROL_DIR", &dir.0);
        } else {
            cmd.arg("--control").arg(&control);
        }
        let child = cmd
            .env_remove("EMX_NODE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Daemon {
            child,
            log,
            control,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn ctl(&self, args: &[&str]) -> Output {
        Command::new(EMXCTL)
            .arg("--control")
            .arg(&self.control)
            .args(args)
            .output()
            .unwrap()
    }

    /// `emxctl <args> --json`, parsed.
    fn json(&self, args: &[&str]) -> Value {
        let o = self.ctl(&[args, &["--json"]].concat());
        let out = String::from_utf8_lossy(&o.stdout);
        serde_json::from_str(&out).unwrap_or_else(|_| {
            panic!(
                "emxctl {args:?}: {out:?} {}\nlog:\n{}",
                stderr(&o),
                self.log()
            )
        })
    }

    /// The state and epoch of `node` as this daemon reports it.
    fn peer(&self, node: u64) -> Option<(String, Option<u64>)> {
        let v = self.json(&["peers"]);
        v["peers"].as_array()?.iter().find_map(|p| {
            (p["node"] == node)
                .then(|| (p["state"].as_str().unwrap().to_owned(), p["epoch"].as_u64()))
        })
    }

    fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                t.elapsed() < limit,
                "emxd still running after {limit:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls `f` until it gives a value, or fails after `limit` saying `what`.
fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn check_passes(from: &Daemon, sizes: &str, want: usize) {
    let v = from.json(&["check", "--sizes", sizes]);
    assert_eq!(v["ok"], true, "check failed: {v}\nlog:\n{}", from.log());
    assert_eq!(v["passed"], want as u64, "{v}");
    assert_eq!(v["failed"], 0, "{v}");
}

/// A request line past the limit is answered with an error; connections
/// past the limit are refused; the daemon serves on afterwards.
fn control_socket_bounds(d: &Daemon) {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    let reply = |s: &UnixStream| {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        line
    };
    let long = UnixStream::connect(&d.control).unwrap();
    // Written on its own thread: emxd stops reading at the limit.
    let mut w = long.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&vec![b'x'; 1 << 20]);
    });
    let r = reply(&long);
    assert!(r.contains("longer than"), "{r}");
    drop(long);
    writer.join().unwrap();
    let idle: Vec<UnixStream> = (0..64)
        .map(|_| UnixStream::connect(&d.control).unwrap())
        .collect();
    let extra = UnixStream::connect(&d.control).unwrap();
    let r = reply(&extra);
    assert!(r.contains("too many control connections"), "{r}");
    drop(idle);
    wait_for(Duration::from_secs(10), "emxd to serve again", || {
        d.ctl(&["status"]).status.success().then_some(())
    });
}

/// Checks whose clients went away (emxctl interrupted) end: they do not
/// hold the node's 16 check slots until all their messages went, so a check
/// asked for afterwards is taken at once.
fn abandoned_checks_end(d: &Daemon) {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    // Each of seconds of echoes: 4096 messages of 1 MiB.
    let sizes = vec!["1048576"; 4096].join(",");
    let req = format!("{{\"cmd\":\"check\",\"sizes\":[{sizes}]}}\n");
    let started = d.log().matches("check started").count();
    let clients: Vec<UnixStream> = (0..16)
        .map(|_| {
            let mut c = UnixStream::connect(&d.control).unwrap();
            c.write_all(req.as_bytes()).unwrap();
            c
        })
        .collect();
    wait_for(Duration::from_secs(10), "16 checks under way", || {
        (d.log().matches("check started").count() >= started + 16).then_some(())
    });
    drop(clients);
    let v = wait_for(Duration::from_secs(10), "a check taken", || {
        let v = d.json(&["check", "--sizes", "1000"]);
        (v["ok"] == true).then_some(v)
    });
    assert_eq!(v["passed"], 1, "{v}");
    assert!(d.log().contains("check abandoned"), "{}", d.log());
    // A client that only shut its writing side (`nc -N`) has not left: it
    // gets its answer, however long the check takes.
    use std::io::{BufRead, BufReader};
    let sizes = vec!["1048576"; 200].join(",");
    let mut c = UnixStream::connect(&d.control).unwrap();
    c.write_all(format!("{{\"cmd\":\"check\",\"sizes\":[{sizes}]}}\n").as_bytes())
        .unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut line = String::new();
    BufReader::new(&c).read_line(&mut line).unwrap();
    assert!(line.contains("\"passed\":200"), "{line}");
}

/// The memif server's emxd of a pair in `dir`, started with no client: it
/// has said it is starting, and waits for its link.
fn starting_server(dir: &TempDir) -> Daemon {
    let config = cluster_file(dir, true);
    let a = Daemon::start(&config, "server", dir, "server.log");
    wait_for(Duration::from_secs(10), "emxd starting", || {
        a.log().contains("starting").then_some(())
    });
    a
}

/// SIGHUP and SIGINT ignored at start (`nohup emxd`, a script's background
/// job) stay ignored, as shells expect of the programs they start: `nohup
/// emxd` used to stop when its terminal closed.
#[test]
fn a_hang_up_ignored_at_start_stays_ignored() {
    let dir = TempDir::new("hup-ignored");
    let config = cluster_file(&dir, true);
    let mut a = Daemon::start_under("nohup", &config, "server", &dir, "server.log");
    wait_for(Duration::from_secs(10), "emxd starting", || {
        a.log().contains("starting").then_some(())
    });
    std::thread::sleep(Duration::from_millis(300));
    a.signal(Signal::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        a.child.try_wait().unwrap().is_none(),
        "emxd under nohup stopped on a hang-up: {}",
        a.log()
    );
    a.signal(Signal::SIGTERM);
    let status = a.wait(Duration::from_secs(3));
    assert!(status.success(), "{status}: {}", a.log());
    let log = a.log();
    assert!(log.contains("stopped while starting"), "{log}");
    assert!(
        log.contains("signal=\"SIGHUP\"") && log.contains("signal ignored at start"),
        "{log}"
    );
}

/// A signal while emxd waits for its link (a memif server with no client
/// yet) stops it at once, exit 0, as one after the start does: it used to be
/// heeded only when the wait ended (`link_wait_ms`, 10 s by default), and
/// then emxd exited 1 for a link that never came up.
#[test]
fn a_signal_during_start_up_stops_emxd() {
    // SIGHUP as well (a terminal closed under `emxd &`): it used to kill
    // emxd outright, its socket file left behind.
    for (tag, sig) in [("term", Signal::SIGTERM), ("hup", Signal::SIGHUP)] {
        let dir = TempDir::new(&format!("startstop-{tag}"));
        let mut a = starting_server(&dir);
        // Past the port's start, into the wait for a client that never comes.
        std::thread::sleep(Duration::from_millis(300));
        a.signal(sig);
        let status = a.wait(Duration::from_secs(3));
        assert!(status.success(), "{sig}: {status}: {}", a.log());
        let log = a.log();
        assert!(log.contains("stopped while starting"), "{log}");
        // Named, not numbered (numbers differ between architectures).
        assert!(log.contains(&format!("by=\"{sig}\"")), "{log}");
        assert!(!a.control.exists(), "the control socket is removed");
    }
}

/// emxd answers its control socket while it starts: requests are told it
/// is starting, `emxctl wait` asks again until its deadline, and `shutdown`
/// stops it then. (Requests used to wait unanswered in the socket's queue
/// until the link came up: emxctl gave up on them, and a `shutdown` it
/// reported failed stopped emxd once the link came up.)
#[test]
fn control_requests_while_starting() {
    let dir = TempDir::new("startctl");
    let mut a = starting_server(&dir);
    wait_for(Duration::from_secs(10), "the control socket", || {
        a.control.exists().then_some(())
    });
    let t = Instant::now();
    let o = a.ctl(&["--timeout", "2", "status"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("emxd is starting"), "{}", stderr(&o));
    let o = a.ctl(&["wait", "--within", "0.5"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("within 0.5 s") && err.contains("starting"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let o = a.ctl(&["shutdown"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A SIGTERM on top (a service manager's stop) is a first signal, not a
    // second: the shutdown used to raise the signals' flag, and emxd exited
    // 1 at once.
    a.signal(Signal::SIGTERM);
    let status = a.wait(Duration::from_secs(3));
    assert!(status.success(), "{status}: {}", a.log());
    let log = a.log();
    assert!(log.contains("stopped while starting"), "{log}");
    assert!(log.contains("by=\"a shutdown request\""), "{log}");
    // Logged by the connection's thread, in the node's span as the main
    // thread's lines are (its threads used to log outside it).
    let line = log.lines().find(|l| l.contains("shutdown requested"));
    assert!(
        line.is_some_and(|l| l.contains("emxd{node=server")),
        "{log}"
    );
}

/// A fake emxd at `sock` that answers every request line with `reply`
/// (after `delay`), for as long as the test runs.
fn fake_emxd(sock: &Path, delay: Duration, reply: String) {
    let sock = sock.to_owned();
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        for c in l.incoming() {
            let Ok(c) = c else { return };
            let reply = reply.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(&c);
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if (&c).write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                    line.clear();
                }
            });
        }
    });
}

/// [`fake_emxd`] at once, its socket there on return.
fn fake_emxd_up(sock: &Path, reply: String) {
    fake_emxd(sock, Duration::ZERO, reply);
    wait_for(Duration::from_secs(5), "the fake socket", || {
        sock.exists().then_some(())
    });
}

/// emxd's reply to `peers` (a line) with `n` peers in `state`.
fn peers_reply(n: u16, state: PeerState) -> String {
    let peers = (0..n)
        .map(|node| PeerEntry {
            local: 0,
            node: node + 2,
            name: None,
            endpoint: 0,
            mac: "auto".into(),
            state,
            epoch: Some(1),
            silent_ms: Some(1.0),
            srtt_us: Some(20.0),
            rto_ms: Some(1.0),
            frames_sent: 0,
            frames_received: 0,
            bytes_sent: 0,
            bytes_received: 0,
            retransmits: 0,
        })
        .collect();
    reply_ok(&Peers { peers }) + "\n"
}

/// `emxctl wait` asks again until its deadline, and says what emxd said.
#[test]
fn emxctl_wait_asks_again_and_says_why_not() {
    let dir = TempDir::new("ctlwait");
    let peers = |state: PeerState| peers_reply(1, state);
    // An emxd that is not there yet (starting, or restarting).
    let late = dir.path("late.sock");
    fake_emxd(&late, Duration::from_millis(500), peers(PeerState::Up));
    let ctl = |sock: &Path, args: &[&str]| {
        Command::new(EMXCTL)
            .arg("--control")
            .arg(sock)
            .args(args)
            .output()
            .unwrap()
    };
    let o = ctl(&late, &["wait", "--within", "10"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("every peer up"));
    let o = ctl(&late, &["wait", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["peers"][0]["state"], "up", "{v}");
    assert!(v["elapsed_s"].as_f64().is_some(), "{v}");
    // A peer named as check --peer names it (02 is node 2); one that is
    // no peer is refused at once, with the peers there are (exit 1: emxd
    // answered).
    let o = ctl(&late, &["wait", "--peer", "02", "--within", "5"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = ctl(&late, &["wait", "--peer", "bogus", "--within", "5"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("bogus is not a peer of this node (peers: 2:0)"),
        "{err}"
    );
    // One that says no.
    let no = dir.path("no.sock");
    fake_emxd_up(
        &no,
        "{\"ok\":false,\"error\":\"emxd is shutting down\"}\n".into(),
    );
    let o = ctl(&no, &["wait", "--within", "0.3"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("emxd is shutting down"),
        "{}",
        stderr(&o)
    );
    // One that never answers: each request waits no longer than the deadline.
    let mute = dir.path("mute.sock");
    let _mute = std::os::unix::net::UnixListener::bind(&mute).unwrap();
    let t = Instant::now();
    let o = ctl(&mute, &["wait", "--within", "1"]);
    // No emxd answered in all that time: 3, not 1.
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(stderr(&o).contains("no reply"), "{}", stderr(&o));
    for bad in ["nan", "inf", "-1", "1e20"] {
        let o = ctl(&mute, &["wait", &format!("--within={bad}")]);
        assert!(!o.status.success());
        assert!(stderr(&o).contains("want seconds"), "{}", stderr(&o));
    }
    // Found without --control, in a control folder where its socket is not
    // yet: an emxd started just before the wait (it used to fail at once).
    let folder = dir.path("run");
    std::fs::create_dir_all(&folder).unwrap();
    fake_emxd(
        &folder.join("emxd-late.sock"),
        Duration::from_millis(500),
        peers(PeerState::Up),
    );
    let o = Command::new(EMXCTL)
        .env("EMX_CONTROL_DIR", &folder)
        .args(["wait", "--within", "10"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

/// emxctl run by a user that may not use the socket (its mode lets only its
/// owner in) says whose it is and what to do, not "is emxd running?".
#[test]
fn emxctl_on_another_users_socket_says_whose() {
    use std::os::unix::process::CommandExt;
    let dir = TempDir::new("ctlperm");
    let sock = dir.path("root.sock");
    fake_emxd_up(&sock, peers_reply(1, PeerState::Up));
    std::fs::set_permissions(&sock, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // (As root the test can be anyone: here nobody, 65534.)
    let o = Command::new(EMXCTL)
        .arg("--control")
        .arg(&sock)
        .arg("peers")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("belongs to uid 0") && err.contains("run emxctl as that user"),
        "{err}"
    );
    // Found in the control folder, not named: the same answer (such a
    // socket used to be passed over, and emxd reported not running), and
    // `wait` gives it at once rather than at its deadline.
    let folder = dir.path("run");
    std::fs::create_dir_all(&folder).unwrap();
    let theirs = folder.join("emxd-root.sock");
    fake_emxd_up(&theirs, peers_reply(1, PeerState::Up));
    std::fs::set_permissions(&theirs, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    for args in [&["peers"][..], &["wait", "--within", "20"]] {
        let t = Instant::now();
        let o = Command::new(EMXCTL)
            .env("EMX_CONTROL_DIR", &folder)
            .args(args)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {err}");
        assert!(err.contains("belongs to uid 0"), "{args:?}: {err}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{args:?}: {:?}",
            t.elapsed()
        );
    }
}

/// emxctl whose reader went away (`emxctl peers | head -1`) ends quietly,
/// not with a panic (exit 101).
#[test]
fn emxctl_into_a_closed_pipe() {
    let dir = TempDir::new("ctlpipe");
    // emxctl with `args` at a fake emxd that answers `reply`, its stdout
    // closed before it writes: how it exits, and what it said.
    let closed = |name: &str, reply: String, args: &[&str]| {
        let sock = dir.path(name);
        fake_emxd_up(&sock, reply);
        let mut child = Command::new(EMXCTL)
            .arg("--control")
            .arg(&sock)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        (o.status.code(), stderr(&o))
    };
    let (code, err) = closed("many.sock", peers_reply(2000, PeerState::Up), &["peers"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // What it asked still decides the exit: a refusal printed into a closed
    // pipe is a failure (it exited 0, so `emxctl check | head` passed).
    let no = "{\"ok\":false,\"error\":\"no\"}\n".to_owned();
    let (code, err) = closed("no.sock", no, &["--json", "peers"]);
    assert_eq!(code, Some(1), "{err}");
}

/// Nodes that check each other at once all get their answers: each check's
/// answer goes to a receive posted for it. Answers used to take the ECHO
/// receives, and a rendezvous echo (1 MiB) ends only when its origin pulls
/// it: with both nodes' four ECHO receives busy echoing the other's checks,
/// every answer waited for one and none came free (each check failed "no
/// echo", and the responders stayed stuck).
fn concurrent_checks_both_ways(a: &Daemon, b: &Daemon) {
    const RUNS: usize = 8;
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..RUNS)
            .flat_map(|_| [a, b])
            .map(|d| s.spawn(move || d.json(&["check", "--sizes", "1M,1M"])))
            .collect();
        for r in runs {
            let v = r.join().unwrap();
            assert_eq!(v["ok"], true, "{v}\nA:\n{}\nB:\n{}", a.log(), b.log());
            assert_eq!(v["passed"], 2, "{v}");
        }
    });
    // The responders are free again.
    check_passes(a, "1M", 1);
    check_passes(b, "1M", 1);
}

#[test]
fn two_daemons_over_memif() {
    let dir = TempDir::new("pair");
    let config = cluster_file(&dir, true);
    let begun = Instant::now();

    // The memif server first: a client cannot start before its socket.
    let a = Daemon::start(&config, "server", &dir, "server.log");
    let memif = dir.path("memif.sock");
    wait_for(Duration::from_secs(10), "the memif socket", || {
        memif.exists().then_some(())
    });
    let mut b = Daemon::start(&config, "client", &dir, "client.log");

    // Each sees the other up.
    let up = |d: &Daemon, node| {
        wait_for(Duration::from_secs(15), "peer up", || {
            d.peer(node)
                .filter(|(s, e)| s == "up" && e.is_some())
                .map(|(_, e)| e.unwrap())
        })
    };
    let b_epoch = up(&a, 2);
    up(&b, 1);
    // Only its owner may connect, whatever the umask.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&a.control).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "control socket mode {mode:o}");
    let status = b.json(&["status"]);
    assert_eq!(status["ok"], true, "{status}");
    assert_eq!(status["name"], "client");
    assert_eq!(status["node"], 2);
    assert_eq!(status["epoch"], b_epoch, "A knows B by the epoch B reports");
    assert_eq!(status["progress"], "inline");
    assert_eq!(status["link"]["up"], true);
    assert_eq!(status["link"]["mac"], "02:e4:00:00:00:02");
    let max = status["max_message"].as_u64().unwrap();
    assert_eq!(max, 8 << 20, "region_mb = 32: four 8 MiB echo slots");

    // The readable table.
    let o = a.ctl(&["peers"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out} {}", stderr(&o));
    let row = out.lines().find(|l| l.contains("client")).expect(&out);
    assert!(row.split_whitespace().any(|w| w == "up"), "{out}");
    assert!(
        out.contains(" SRTT_US ") && out.contains(" RTO_MS "),
        "{out}"
    );

    // Byte-exact echoes both ways, eager (up to 32 KiB) and rendezvous.
    let sizes = "0,1,1000,32768,32769,1M,4M,8M";
    check_passes(&a, sizes, 8);
    check_passes(&b, sizes, 8);
    // Each side has timed the other's answers: a smoothed round trip, and a
    // timeout within the protocol's defaults (rto_min 1 ms; rto_max 100 ms,
    // capped at a quarter of the 300 ms liveness deadline).
    for d in [&a, &b] {
        let v = d.json(&["peers"]);
        let p = &v["peers"][0];
        let srtt = p["srtt_us"].as_f64().unwrap_or_else(|| panic!("{v}"));
        assert!(srtt > 0.0 && srtt < 1e6, "{v}");
        let rto = p["rto_ms"].as_f64().unwrap_or_else(|| panic!("{v}"));
        assert!((1.0..=75.0).contains(&rto), "{v}");
    }
    let o = b.ctl(&["check"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("2 of 2 messages came back byte-exact"),
        "{out}"
    );
    // Sizes as `--sizes` takes them: 1000 B, and 1 MiB as 1M (not 1048576).
    // (Rows: "server (1)", the endpoint, the size, ...)
    let sizes: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("server (1)"))
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    assert_eq!(sizes[..2], ["1000", "1M"], "{out}");
    // Too large for the responder, and a peer that does not exist: failures
    // that say why.
    let v = a.json(&["check", "--sizes", "9M"]);
    assert_eq!(v["ok"], false);
    assert!(
        v["results"][0]["error"].as_str().unwrap().contains("limit"),
        "{v}"
    );
    let o = a.ctl(&["check", "--peer", "nosuch"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("not a peer of this node"),
        "{}",
        stderr(&o)
    );
    control_socket_bounds(&a);
    concurrent_checks_both_ways(&a, &b);
    abandoned_checks_end(&a);
    // The responder's counters: B echoed A's check, and the other way.
    let stats = b.json(&["stats"]);
    assert!(
        stats["endpoints"][0]["responder"]["echoed"]
            .as_u64()
            .unwrap()
            >= 8,
        "{stats}"
    );
    assert!(
        stats["endpoints"][0]["link"]["rx_bytes"].as_u64().unwrap() > 16 << 20,
        "{stats}"
    );
    let messages = &stats["endpoints"][0]["messages"];
    assert!(
        messages["recvs_completed"].as_u64().unwrap() >= 8
            && messages["sends_completed"].as_u64().unwrap() >= 8,
        "{stats}"
    );
    assert_eq!(messages["internal_errors"].as_u64(), Some(0), "{stats}");
    // Peers named as `peers` names them.
    assert_eq!(
        stats["endpoints"][0]["peers"][0]["name"], "server",
        "{stats}"
    );
    let o = b.ctl(&["stats"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("  messages: sent "), "{out}");
    assert!(out.contains("\n  server (1):0 "), "{out}");
    let o = b.ctl(&["status"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(", stray 0, "), "{out}");
    // A request that is not one.
    let mut s = UnixStream::connect(&a.control).unwrap();
    s.write_all(b"{\"cmd\":\"bogus\"}\n").unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["ok"], false);
    assert!(v["error"].as_str().unwrap().contains("bad request"), "{v}");

    // SIGTERM to B while it runs a long check against A: B answers the
    // check "interrupted", drains, logs what it drained and aborted, and
    // exits 0.
    let many = vec!["4M"; 100].join(",");
    let check = Command::new(EMXCTL)
        .arg("--control")
        .arg(&b.control)
        .args(["check", "--sizes", &many])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(10), "the long check to start", || {
        b.log().contains("sizes=100").then_some(())
    });
    std::thread::sleep(Duration::from_millis(300));
    b.signal(Signal::SIGTERM);
    let sent = Instant::now();
    let status = b.wait(Duration::from_secs(8));
    let exited = Instant::now();
    assert!(status.success(), "emxd exited {status}; log:\n{}", b.log());
    let took = exited - sent;
    assert!(took < Duration::from_secs(5), "emxd took {took:?} to stop");
    let log = b.log();
    let closed = log
        .lines()
        .find(|l| l.contains("endpoint closed"))
        .unwrap_or_else(|| panic!("no drain report in the log:\n{log}"));
    assert!(
        closed.contains("drained=") && closed.contains("aborted="),
        "{closed}"
    );
    assert!(log.contains("emxd stopped"), "{log}");
    eprintln!("B stopped in {took:?}: {closed}");
    let o = check.wait_with_output().unwrap();
    assert!(!o.status.success(), "the check was cut short");
    assert!(stderr(&o).contains("shutting down"), "{}", stderr(&o));
    assert!(!b.control.exists(), "the control socket is removed");

    // A reports B down within the liveness deadline.
    let down = wait_for(Duration::from_secs(3), "B reported down", || {
        a.peer(2)
            .filter(|(s, _)| s == "down")
            .map(|_| Instant::now())
    });
    let late = down.saturating_duration_since(exited);
    assert!(
        late < PEER_TIMEOUT + Duration::from_millis(700),
        "B was reported down {late:?} after it exited"
    );
    // Logged by the peer scan, a moment after `peers` shows it.
    let line = wait_for(Duration::from_secs(1), "'peer down' in A's log", || {
        a.log()
            .lines()
            .find(|l| l.contains("peer down"))
            .map(str::to_owned)
    });
    let silent: f64 = line
        .split("silent_ms=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        silent >= PEER_TIMEOUT.as_millis() as f64
            && silent < PEER_TIMEOUT.as_millis() as f64 + 300.0,
        "declared down after {silent} ms of silence: {line}"
    );
    eprintln!("A saw B down {late:?} after B exited: {line}");
    // The cause, A's memif link gone with its client, is logged too (the
    // link is read once a second).
    wait_for(Duration::from_secs(3), "'link down' in A's log", || {
        a.log().contains("link down").then_some(())
    });

    // B again: A reports it up with a new epoch, and echoes work again.
    let mut b = Daemon::start(&config, "client", &dir, "client2.log");
    let epoch = wait_for(Duration::from_secs(15), "B up again", || {
        a.peer(2)
            .filter(|(s, e)| s == "up" && e.is_some_and(|e| e != b_epoch))
            .map(|(_, e)| e.unwrap())
    });
    assert_ne!(epoch, b_epoch);
    wait_for(Duration::from_secs(2), "the log of B's return", || {
        a.log()
            .contains("peer up again with a new epoch")
            .then_some(())
    });
    wait_for(Duration::from_secs(3), "'link up' in A's log", || {
        a.log().contains("link up").then_some(())
    });
    up(&b, 1);
    check_passes(&a, "1000,1M", 2);
    check_passes(&b, "1000,1M", 2);

    // Stopped by request and by SIGINT: both exit 0 and remove their socket.
    // emxctl's shutdown returns once emxd is gone (it used to return at
    // once, emxd still draining).
    let o = b.ctl(&["shutdown"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        !b.control.exists(),
        "emxctl shutdown returned, emxd still there"
    );
    assert!(b.wait(Duration::from_secs(8)).success(), "{}", b.log());
    let mut a = a;
    a.signal(Signal::SIGINT);
    assert!(a.wait(Duration::from_secs(8)).success(), "{}", a.log());
    assert!(!a.control.exists());
    let log = a.log();
    let line = log.lines().find(|l| l.contains("signal received"));
    assert!(
        line.is_some_and(|l| l.contains("signal=\"SIGINT\"")),
        "{log}"
    );
    eprintln!("two daemons: {:?}", begun.elapsed());
}

/// The example as it is, MACs `auto`: each daemon reports the other
/// unresolved or unknown until the engine learns its address, then up, and
/// echoes are byte-exact both ways. Its region is 2 MiB, so that each
/// responder takes 512 KiB: a check without sizes stays within that (it
/// used to send 1 MiB, and fail).
#[test]
fn two_daemons_with_learnt_macs() {
    let dir = TempDir::new("auto");
    let config = cluster_file(&dir, false);
    let text = std::fs::read_to_string(&config).unwrap();
    let small = text.replacen("region_mb = 32 ", "region_mb = 2 ", 1);
    assert_ne!(small, text, "the example's region_mb");
    std::fs::write(&config, small).unwrap();
    let a = Daemon::start(&config, "server", &dir, "server.log");
    let memif = dir.path("memif.sock");
    wait_for(Duration::from_secs(10), "the memif socket", || {
        memif.exists().then_some(())
    });
    let b = Daemon::start(&config, "client", &dir, "client.log");
    for (d, other, of) in [(&a, 2, &b), (&b, 1, &a)] {
        let mac = wait_for(Duration::from_secs(15), "peer up", || {
            let v = d.json(&["peers"]);
            let p = v["peers"]
                .as_array()?
                .iter()
                .find(|p| p["node"] == other)?
                .clone();
            (p["state"] == "up").then(|| p["mac"].as_str().unwrap().to_owned())
        });
        assert_eq!(Some(mac), port_mac(of), "learnt");
    }
    for d in [&a, &b] {
        let v = d.json(&["check"]);
        assert_eq!(v["ok"], true, "{v}");
        let sizes: Vec<u64> = v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["size"].as_u64().unwrap())
            .collect();
        assert_eq!(sizes, [1000, 512 << 10], "{v}");
        assert_eq!(d.json(&["status"])["max_message"], 512 << 10);
    }

    // B stops and comes back (its port's MAC may change): A learns it
    // again.
    let old = a.peer(2).unwrap().1.unwrap();
    let mut b = b;
    b.signal(Signal::SIGTERM);
    assert!(b.wait(Duration::from_secs(8)).success(), "{}", b.log());
    wait_for(Duration::from_secs(3), "B reported down", || {
        a.peer(2).filter(|(s, _)| s == "down")
    });
    let b = Daemon::start(&config, "client", &dir, "client2.log");
    wait_for(Duration::from_secs(15), "B up again", || {
        a.peer(2)
            .filter(|(s, e)| s == "up" && e.is_some_and(|e| e != old))
    });
    let learnt = a.json(&["peers"])["peers"][0]["mac"]
        .as_str()
        .map(str::to_owned);
    assert_eq!(learnt, port_mac(&b));
    check_passes(&a, "1000,512K", 2);
    for mut d in [a, b] {
        d.signal(Signal::SIGTERM);
        assert!(d.wait(Duration::from_secs(8)).success(), "{}", d.log());
    }
}

/// A node whose port comes up with another address than its `mac` in the
/// file (here a memif port whose devargs give none, so DPDK makes one up)
/// would be up but unreachable: peers send to the file's address, and drop
/// frames from any other. emxd refuses to run it (exit 2), naming the field
/// and the fix; it used to say "node up" and let its peers time out.
#[test]
fn a_port_that_came_up_with_another_mac_is_a_configuration_error() {
    let dir = TempDir::new("wrongmac");
    let config = cluster_file(&dir, true);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replacen(",mac=02:e4:00:00:00:01", "", 1)).unwrap();
    let mut a = Daemon::start(&config, "server", &dir, "server.log");
    let memif = dir.path("memif.sock");
    wait_for(Duration::from_secs(10), "the memif socket", || {
        memif.exists().then_some(())
    });
    let mut b = Daemon::start(&config, "client", &dir, "client.log");
    let status = a.wait(Duration::from_secs(15));
    let log = a.log();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("node[0].mac: node \"server\" is configured as 02:e4:00:00:00:01"),
        "{log}"
    );
    assert!(
        log.contains("add mac=02:e4:00:00:00:01 to the port's devargs"),
        "{log}"
    );
    assert!(!log.contains("node up"), "{log}");
    b.signal(Signal::SIGTERM);
    b.wait(Duration::from_secs(8));
}

/// emxd as node 1 (the server) and, as node 2, an engine of this test's own
/// (inline, endpoint 0), which the test drives: once A sees it up.
fn emxd_and_a_bare_node(dir: &TempDir) -> (Daemon, emx::runtime::Node, emx::runtime::Endpoint) {
    let config = cluster_file(dir, true);
    let a = Daemon::start(&config, "server", dir, "server.log");
    let memif = dir.path("memif.sock");
    wait_for(Duration::from_secs(10), "the memif socket", || {
        memif.exists().then_some(())
    });
    let cluster = ClusterConfig::load(&config).unwrap();
    let mut node = emx::runtime::start_node(&cluster.node_config(2).unwrap()).unwrap();
    let mut b = node.engine.endpoint_id(0).unwrap();
    let t = Instant::now();
    loop {
        b.progress();
        if a.peer(2).is_some_and(|(s, _)| s == "up") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "B never up");
    }
    (a, node, b)
}

/// A check of a peer that is alive but takes no messages (here an engine
/// that posts no receive) ends when its messages time out: the rendezvous
/// message it sent is never pulled, so the run used to wait for its send
/// for good, and its client got no report at all. The send is then
/// withdrawn: the peer drops the message, and the send ends cancelled (it
/// used to linger for good, and every later message to that peer failed at
/// once).
#[test]
fn a_check_of_a_peer_that_takes_nothing_ends() {
    let dir = TempDir::new("takesnothing");
    let (a, _node, mut b) = emxd_and_a_bare_node(&dir);
    // Driven (so that it answers and acknowledges), but with no receive.
    let mut drive_until = |child: &mut Child, limit: Duration| {
        let t = Instant::now();
        loop {
            b.progress();
            if let Some(status) = child.try_wait().unwrap() {
                return (status, t.elapsed());
            }
            assert!(
                t.elapsed() < limit,
                "no reply within {limit:?}; log:\n{}",
                a.log()
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    let check = |sizes: &str| {
        Command::new(EMXCTL)
            .arg("--control")
            .arg(&a.control)
            .args(["check", "--json", "--sizes", sizes])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let report = |child: Child| {
        let out = child.wait_with_output().unwrap();
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let mut first = check("64K");
    let (status, took) = drive_until(&mut first, Duration::from_secs(30));
    assert!(!status.success());
    assert!(took < Duration::from_secs(15), "{took:?}");
    let v = report(first);
    assert_eq!(
        (v["passed"].as_u64(), v["failed"].as_u64()),
        (Some(0), Some(1)),
        "{v}"
    );
    let error = v["results"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("no echo within 10 s"), "{v}");
    let t = Instant::now();
    while b.core_stats().unwrap().withdrawn == 0 {
        b.progress();
        assert!(t.elapsed() < Duration::from_secs(3), "never withdrawn");
    }
    assert!(b.probe(None, 0, 0).unwrap().is_none(), "B dropped it");
    wait_for(Duration::from_secs(3), "the send's end", || {
        b.progress();
        a.log()
            .contains("got no echo ended: withdrawn")
            .then_some(())
    });
    assert!(a.log().contains("request failed: cancelled"), "{}", a.log());
}

/// emxctl finds an emxd by node id as well as by name (emxd takes either;
/// a node's socket bears its name), and its search of the control folder
/// passes over sockets nothing listens on (left by an emxd that was killed),
/// which it used to count, refusing to choose. `EMX_CONTROL_DIR` moves the
/// folder for both.
#[test]
fn emxctl_finds_emxd_by_id_and_passes_over_dead_sockets() {
    let dir = TempDir::new("byid");
    let config = cluster_file(&dir, true);
    // A socket file of an emxd that was killed.
    drop(std::os::unix::net::UnixListener::bind(dir.path("emxd-ghost.sock")).unwrap());
    let a = Daemon::start_default(&config, "server", &dir, "server.log");
    let memif = dir.path("memif.sock");
    wait_for(Duration::from_secs(10), "the memif socket", || {
        memif.exists().then_some(())
    });
    let mut b = Daemon::start_default(&config, "client", &dir, "client.log");
    wait_for(Duration::from_secs(15), "both up", || {
        (a.peer(2)?.0 == "up" && b.peer(1)?.0 == "up").then_some(())
    });
    let ctl = |args: &[&str]| {
        Command::new(EMXCTL)
            .args(args)
            .env("EMX_CONTROL_DIR", &dir.0)
            .output()
            .unwrap()
    };
    for (node, name) in [("1", "server"), ("2", "client"), ("client", "client")] {
        let o = ctl(&["--node", node, "status", "--json"]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        assert_eq!(v["name"], name, "--node {node}: {v} {}", stderr(&o));
    }
    let o = ctl(&["--node", "9", "status"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no emxd of node id 9 answers in"),
        "{}",
        stderr(&o)
    );
    // Two answer: emxctl names them, and not the dead one.
    let o = ctl(&["status"]);
    let err = stderr(&o);
    assert!(err.contains("several emxd control sockets"), "{err}");
    assert!(
        err.contains("emxd-server.sock") && !err.contains("ghost"),
        "{err}"
    );
    b.signal(Signal::SIGTERM);
    assert!(b.wait(Duration::from_secs(8)).success(), "{}", b.log());
    let o = ctl(&["status", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(v["name"], "server", "{v} {}", stderr(&o));
}

/// A check compares every byte of what comes back: an echo with one byte
/// changed fails it, and so does a short one. (Every other test, and both
/// testbeds, saw correct echoes only: a comparison that passed anything
/// would have passed them all.) Node 2 is this test: it answers each check
/// message itself, altered.
#[test]
fn a_check_fails_on_an_echo_that_differs() {
    let dir = TempDir::new("badecho");
    let (a, _node, mut b) = emxd_and_a_bare_node(&dir);
    let server = emx::proto::Addr::new(1, 0);
    for (alter, says) in [
        (
            (|m: &mut Vec<u8>| m[500] ^= 1) as fn(&mut Vec<u8>),
            "byte 500 of the echo differs",
        ),
        (
            |m: &mut Vec<u8>| m.truncate(999),
            "the echo is 999 bytes long, 1000 were sent",
        ),
    ] {
        let mut check = Command::new(EMXCTL)
            .arg("--control")
            .arg(&a.control)
            .args(["check", "--json", "--sizes", "1000"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Take the check message (any bits), answer it altered.
        let r = b.irecv(Some(server), 0, 0, vec![0u8; 2000]).unwrap();
        let t = Instant::now();
        let (mut msg, info) = loop {
            if let Some(c) = b.test(r).unwrap() {
                let (buf, info) = c.into_recv().unwrap();
                break (buf.as_ref()[..info.copied as usize].to_vec(), info);
            }
            assert!(t.elapsed() < Duration::from_secs(10), "no check message");
        };
        assert_eq!(msg.len(), 1000);
        alter(&mut msg);
        let s = b
            .isend(server, emx_daemon::ops::answer_bits(info.match_bits), msg)
            .unwrap();
        let t = Instant::now();
        let status = loop {
            b.progress();
            if let Some(st) = check.try_wait().unwrap() {
                break st;
            }
            assert!(t.elapsed() < Duration::from_secs(15), "no report");
        };
        b.wait(s).unwrap().into_send().unwrap();
        let out = check.wait_with_output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(!status.success(), "{v}");
        assert_eq!(
            (v["passed"].as_u64(), v["failed"].as_u64()),
            (Some(0), Some(1)),
            "{v}"
        );
        let error = v["results"][0]["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{v}");
    }
}

/// The MAC of a daemon's port, from its status.
fn port_mac(d: &Daemon) -> Option<String> {
    d.json(&["status"])["link"]["mac"]
        .as_str()
        .map(str::to_owned)
}

/// emxd as the memif pair's server (node 1) of the cluster file `config`,
/// and node 2 started in this process, for the test to drive.
fn server_and_bare_client(dir: &TempDir, config: &Path) -> (Daemon, emx::runtime::Node) {
    let a = Daemon::start(config, "server", dir, "server.log");
    let memif = dir.path("memif.sock");
    wait_for(Duration::from_secs(10), "the memif socket", || {
        memif.exists().then_some(())
    });
    let cluster = ClusterConfig::load(config).unwrap();
    let node = emx::runtime::start_node(&cluster.node_config(2).unwrap()).unwrap();
    (a, node)
}

/// A tool's PINGs come back as PONGs (the same low bits, the payload up to
/// `PING_BYTES`), one PONG in flight per peer: a pinger that takes none of
/// its PONGs ties up one of emxd's sends, not all of them (its further PINGs
/// wait unexpected, on its own credit), so emxd still echoes for others, and
/// every PING is answered once the PONGs are taken. This test is the client
/// node: a pinger and a bystander endpoint on a polling thread.
#[test]
fn a_pinger_that_takes_no_pongs_ties_up_one_send() {
    use emx::proto::Addr;
    use emx_daemon::ops::{with_op, ECHO, OP_MASK, PING, PING_BYTES, PONG};

    let dir = TempDir::new("pinger");
    let config = cluster_file(&dir, true);
    let mut text = std::fs::read_to_string(&config).unwrap();
    let at = text.match_indices("endpoints = [0]\n").nth(1).unwrap().0;
    text.replace_range(at..at + 16, "endpoints = [0, 1]\ncores = [1]\n");
    std::fs::write(&config, &text).unwrap();
    let (a, node) = server_and_bare_client(&dir, &config);
    let mut engine = node.engine;
    let mut pinger = engine.endpoint_id(0).unwrap();
    let mut bystander = engine.endpoint_id(1).unwrap();
    let server = Addr::new(1, 0);
    let limit = Duration::from_secs(10);
    let log = || a.log();

    // Answered, cut to PING_BYTES.
    let long: Vec<u8> = (0..PING_BYTES + 100).map(|i| i as u8).collect();
    let r = pinger
        .irecv(
            Some(server),
            with_op(PONG, 7),
            u64::MAX,
            vec![0u8; 2 * PING_BYTES],
        )
        .unwrap();
    let s = pinger
        .isend(server, with_op(PING, 7), long.clone())
        .unwrap();
    let (buf, info) = pinger
        .wait_timeout(r, limit)
        .unwrap()
        .unwrap_or_else(|| panic!("no PONG; log:\n{}", log()))
        .into_recv()
        .unwrap();
    assert_eq!(info.match_bits, with_op(PONG, 7));
    assert_eq!(&buf.as_ref()[..info.copied as usize], &long[..PING_BYTES]);
    pinger.wait(s).unwrap().into_send().unwrap();

    // PINGs whose PONGs nobody takes: past the pinger's credit (2,048 8-byte
    // messages of its 1 MiB), and past emxd's 1,024 sends. The pinger's own
    // sends stall once its PINGs fill its credit at emxd.
    const FLOOD: u64 = 6000;
    let mut in_flight = std::collections::VecDeque::new();
    let mut sent = 0u64;
    let mut moved = Instant::now();
    // (Done when nothing moved for 3 s: a stall of this machine is shorter.)
    while sent < FLOOD && moved.elapsed() < Duration::from_secs(3) {
        while in_flight.len() < 256 && sent < FLOOD {
            let bits = with_op(PING, 1000 + sent);
            in_flight.push_back(
                pinger
                    .isend(server, bits, sent.to_le_bytes().to_vec())
                    .unwrap(),
            );
            sent += 1;
        }
        pinger.progress();
        while let Some(&r) = in_flight.front() {
            let Some(c) = pinger.take(r).unwrap() else {
                break;
            };
            c.into_send().unwrap();
            in_flight.pop_front();
            moved = Instant::now();
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    assert!(sent > 3500, "only {sent} PINGs left");

    // Another endpoint of the same node is still echoed.
    let r = bystander
        .irecv(Some(server), with_op(ECHO, 5), u64::MAX, vec![0u8; 64])
        .unwrap();
    bystander
        .isend(server, with_op(ECHO, 5), b"still served".to_vec())
        .unwrap();
    let echoed = bystander
        .wait_timeout(r, limit)
        .unwrap()
        .unwrap_or_else(|| panic!("no echo while a pinger takes no PONGs; log:\n{}", log()));
    let (buf, info) = echoed.into_recv().unwrap();
    assert_eq!(&buf.as_ref()[..info.copied as usize], b"still served");
    // A message nobody serves, from the bystander, is discarded though the
    // pinger's PINGs wait ahead of it (the scan stopped at the first).
    let junk = bystander
        .isend(server, with_op(0x42, 1), b"junk".to_vec())
        .unwrap();
    bystander
        .wait_timeout(junk, limit)
        .unwrap()
        .expect("the junk was taken")
        .into_send()
        .unwrap();
    wait_for(limit, "the bystander's junk discarded", || {
        (a.json(&["status"])["responder"]["discarded"] == 1).then_some(())
    });

    // Every PING is answered once, with its own bytes, once the PONGs are taken.
    let mut answered = vec![false; sent as usize];
    let mut left = sent;
    while left > 0 {
        let r = pinger
            .irecv(Some(server), with_op(PONG, 0), OP_MASK, vec![0u8; 64])
            .unwrap();
        let Some(c) = pinger.wait_timeout(r, limit).unwrap() else {
            panic!("{left} of {sent} PINGs unanswered; log:\n{}", log());
        };
        let (buf, info) = c.into_recv().unwrap();
        let i = (info.match_bits & !OP_MASK) - 1000;
        assert_eq!(info.match_bits, with_op(PONG, 1000 + i));
        assert_eq!(buf.as_ref()[..info.copied as usize], i.to_le_bytes());
        assert!(
            !std::mem::replace(&mut answered[i as usize], true),
            "PING {i} answered twice"
        );
        left -= 1;
    }
    for s in in_flight {
        let c = pinger.wait_timeout(s, limit).unwrap().expect("PING sent");
        c.into_send().unwrap();
    }
    let stats = a.json(&["status"]);
    assert_eq!(stats["responder"]["pongs"], sent + 1, "{stats}");
    drop((pinger, bystander));
    engine.shutdown(Duration::from_secs(1)).unwrap();
    let mut a = a;
    a.signal(Signal::SIGTERM);
    assert!(a.wait(Duration::from_secs(8)).success(), "{}", a.log());
}

/// With a polling thread, a receive is refused after `irecv` returned (its
/// completion says so), not by `irecv`: emxd's liveness receive for a
/// peer given up, posted again on every refusal, went round in a busy loop
/// until the peer was greeted again, each turn one more failure. Here a
/// pinger goes silent right after its PONG arrives (its acknowledgement
/// never leaves), so emxd's PONG fails once the pinger is given up: that
/// one failure is counted, and nothing more.
#[test]
fn a_refused_liveness_receive_is_not_posted_again_at_once() {
    use emx::proto::Addr;
    use emx_daemon::ops::{with_op, PING, PING_BYTES, PONG};

    let dir = TempDir::new("refused-watch");
    let config = cluster_file(&dir, true);
    let mut text = std::fs::read_to_string(&config).unwrap();
    // emxd (node 1, the first node) polls on a thread of its own.
    let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    let at = text.find("endpoints = [0]\n").unwrap();
    text.insert_str(at, &format!("cores = [{cpu}]\n"));
    std::fs::write(&config, &text).unwrap();
    let (a, node) = server_and_bare_client(&dir, &config);
    let status = wait_for(Duration::from_secs(10), "emxd's status", || {
        let s = a.json(&["status"]);
        (s["ok"] == true).then_some(s)
    });
    assert_eq!(status["progress"], "thread", "{status}");
    let mut engine = node.engine;
    let mut pinger = engine.endpoint().unwrap();
    let server = Addr::new(1, 0);
    let r = pinger
        .irecv(
            Some(server),
            with_op(PONG, 7),
            u64::MAX,
            vec![0u8; PING_BYTES],
        )
        .unwrap();
    pinger
        .isend(server, with_op(PING, 7), vec![7u8; 8])
        .unwrap();
    pinger
        .wait_timeout(r, Duration::from_secs(10))
        .unwrap()
        .unwrap_or_else(|| panic!("no PONG; log:\n{}", a.log()))
        .into_recv()
        .unwrap();
    // Silent from here: inline, nothing polls the pinger's link.
    wait_for(Duration::from_secs(10), "the pinger given up", || {
        (a.peer(2).is_some_and(|(state, _)| state == "down")).then_some(())
    });
    // A few liveness deadlines, and a greeting of the silent pinger.
    std::thread::sleep(4 * PEER_TIMEOUT);
    let stats = a.json(&["status"]);
    assert_eq!(
        stats["responder"]["failed"],
        1,
        "the PONG failed once, and nothing else should: {stats}\n{}",
        a.log()
    );
    drop(pinger);
    drop(engine);
    let mut a = a;
    a.signal(Signal::SIGTERM);
    assert!(a.wait(Duration::from_secs(8)).success(), "{}", a.log());
}
