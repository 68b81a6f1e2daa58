//! The benchmark between two processes: `--role server` runs the echo side
//! of a link (memif, or a port from devargs such as a NIC) and takes its
//! orders over a TCP control connection from the `--role client` process,
//! which runs the pinger and prints the tables. The server keeps its port and
//! serves clients one after another, each with an echo thread of its own,
//! until it is stopped (or only the first with `--once`).
//!
//! The control protocol is one JSON object per line. The server speaks
//! first: `Ready` once it takes the client, or `Failed` when it is busy with
//! another (the client has opened no port yet, so a refused one leaves the
//! server's port alone). Then request and answer:
//! `Hello` (each side's MACs, the MTU and whether the channels share one
//! queue pair), `Command` (switch the echo thread;
//! answered once it runs the new command), `Stop` (end streams back),
//! `Counters` (what the echo side received, on its own clock) and `Bye`.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use core_affinity::CoreId;
use dpdk_ffi::{Eal, HugepageMode, Mempool};
use serde::{Deserialize, Serialize};

use crate::link::{End, Link, SideSpec, EMX_INLINE, RAW};
use crate::session::{await_switch, spawn_echo, start_eal, Cmd, Counters, Ctl, EchoThread};

/// A request from the client.
#[derive(Debug, Serialize, Deserialize)]
enum Request {
    Hello {
        macs: Vec<[u8; 6]>,
        mtu: u16,
        shared: bool,
    },
    Command(Cmd),
    Stop,
    Counters,
    Bye,
}

/// The server's answer.
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    /// The greeting: the server takes this client.
    Ready,
    Hello {
        macs: Vec<[u8; 6]>,
    },
    Running(u64),
    Done,
    Counters(Counters),
    Failed(String),
}

/// What a client says when its server is gone.
const CLOSED: &str = "the server closed the control connection";

/// The client's end of the control connection.
pub struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
    /// A request went unanswered: its answer may still come, and would be
    /// taken for the next one's, so none is sent.
    lost: bool,
    /// How long an answer may take.
    answer_within: Duration,
}

/// How long the client tries to reach its server.
const CONNECT_FOR: Duration = Duration::from_secs(10);

impl Client {
    /// Connects to the server at `addr`, retrying for a few seconds while it
    /// starts (it listens once its port is open), and waits for its greeting:
    /// an error if it is busy with another client.
    pub fn connect(addr: &str) -> Result<Client, String> {
        Client::connect_within(addr, CONNECT_FOR, Duration::from_secs(60))
    }

    /// [`Client::connect`], trying for `connect_for` and waiting at most
    /// `answer_within` for each answer.
    fn connect_within(
        addr: &str,
        connect_for: Duration,
        answer_within: Duration,
    ) -> Result<Client, String> {
        let t = Instant::now();
        let stream = loop {
            // Each attempt within what is left of the budget: a plain connect
            // to an address that drops its SYNs (a firewall, a host gone)
            // waits for the kernel's retries, about two minutes.
            let left = connect_for.saturating_sub(t.elapsed());
            let mut tried = None;
            for a in addr
                .to_socket_addrs()
                .map_err(|e| format!("bad --server address {addr}: {e}"))?
            {
                let r = TcpStream::connect_timeout(&a, left.max(Duration::from_millis(100)));
                let done = r.is_ok();
                tried = Some(r);
                if done {
                    break;
                }
            }
            match tried {
                Some(Ok(s)) => break s,
                None => return Err(format!("--server {addr} resolves to no address")),
                Some(Err(e)) if t.elapsed() < connect_for => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Some(Err(e)) if e.kind() == ErrorKind::TimedOut => {
                    return Err(format!(
                        "no answer from the emx-bench server at {addr} within {:.0} s: is the \
                         address right, and does a firewall let TCP through to it?",
                        connect_for.as_secs_f64()
                    ))
                }
                Some(Err(e)) => {
                    return Err(format!(
                        "cannot reach the emx-bench server at {addr}: {e} (start `emx-bench --role server` with the same --link first, or give --server)"
                    ))
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let mut client = Client {
            stream,
            buf: Vec::new(),
            lost: false,
            answer_within,
        };
        match client.answer(&mut || std::thread::sleep(Duration::from_millis(1)))? {
            Answer::Ready => Ok(client),
            a => Err(format!("unexpected greeting from the server: {a:?}")),
        }
    }

    /// Trades MACs, ours per channel in, the server's out, and checks that
    /// both sides run the same link.
    pub fn hello(
        &mut self,
        macs: &[[u8; 6]],
        mtu: u16,
        shared: bool,
    ) -> Result<Vec<[u8; 6]>, String> {
        match self.call(
            &Request::Hello {
                macs: macs.to_vec(),
                mtu,
                shared,
            },
            // Nothing to drive yet; the server may take seconds (its link).
            &mut || std::thread::sleep(Duration::from_millis(1)),
        )? {
            Answer::Hello { macs } if macs.len() == 3 => Ok(macs),
            a => Err(format!("unexpected answer to hello: {a:?}")),
        }
    }

    /// Sends `req` and waits for the answer, calling `idle` while it waits
    /// (the pinger's inline engines must keep answering).
    fn call(&mut self, req: &Request, idle: &mut dyn FnMut()) -> Result<Answer, String> {
        if self.lost {
            return Err("the server left an earlier request unanswered".into());
        }
        let mut line = serde_json::to_vec(req).map_err(|e| e.to_string())?;
        line.push(b'\n');
        self.stream
            .set_nonblocking(false)
            .and_then(|()| self.stream.write_all(&line))
            .map_err(|e| match e.kind() {
                ErrorKind::BrokenPipe | ErrorKind::ConnectionReset => CLOSED.to_string(),
                _ => format!("control connection: {e}"),
            })?;
        self.answer(idle)
    }

    /// Waits for the server's next line, calling `idle` while it waits.
    fn answer(&mut self, idle: &mut dyn FnMut()) -> Result<Answer, String> {
        self.stream
            .set_nonblocking(true)
            .map_err(|e| e.to_string())?;
        let t = Instant::now();
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let a: Answer = serde_json::from_slice(&line)
                    .map_err(|e| format!("bad answer from the server: {e}"))?;
                if let Answer::Failed(e) = a {
                    return Err(format!("server: {e}"));
                }
                return Ok(a);
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(CLOSED.into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    idle();
                    if t.elapsed() > self.answer_within {
                        self.lost = true;
                        return Err("the server does not answer".into());
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("control connection: {e}")),
            }
        }
    }

    /// An error if the server closed the control connection (its process
    /// ended, say); what it sent is left for the next answer.
    pub(crate) fn check(&mut self) -> Result<(), String> {
        let gone = || Err(CLOSED.to_string());
        self.stream
            .set_nonblocking(true)
            .map_err(|e| e.to_string())?;
        let mut one = [0u8; 1];
        match self.stream.peek(&mut one) {
            Ok(0) => gone(),
            Ok(_) => Ok(()),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(()),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => gone(),
            Err(e) => Err(format!("control connection: {e}")),
        }
    }

    /// Switches the echo side to `cmd`; returns its generation.
    pub(crate) fn command(&mut self, cmd: Cmd, idle: &mut dyn FnMut()) -> Result<u64, String> {
        match self.call(&Request::Command(cmd), idle)? {
            Answer::Running(g) => Ok(g),
            a => Err(format!("unexpected answer: {a:?}")),
        }
    }

    /// Ends the echo side's streams back.
    pub(crate) fn stop(&mut self) -> Result<(), String> {
        self.call(&Request::Stop, &mut || {}).map(|_| ())
    }

    /// What the echo side received.
    pub(crate) fn counters(&mut self) -> Result<Counters, String> {
        match self.call(&Request::Counters, &mut || {})? {
            Answer::Counters(c) => Ok(c),
            a => Err(format!("unexpected answer: {a:?}")),
        }
    }

    /// Tells the server we are done: it answers once it has stopped our
    /// echo thread and is free for its next client.
    pub(crate) fn bye(mut self) -> Result<(), String> {
        self.call(&Request::Bye, &mut || {}).map(|_| ())
    }
}

/// Runs the server side: its port (`side`) and the control connection on
/// `listen`, serving clients one after another (each with an echo thread of
/// its own on the same port) until the process is stopped, or only the first
/// one when `once`. A client that fails, or that asks for a link this server
/// does not run, is reported on stderr and the next one is served; with
/// `once`, its error is the result. A client that connects while another is
/// served is told that the server is busy (as iperf3 does), after a grace of
/// two seconds, rather than left waiting for the other's run to end. Each
/// echo thread runs on `echo_core`.
pub fn serve(
    hugepages: HugepageMode,
    mtu: u16,
    side: &SideSpec,
    listen: &str,
    once: bool,
    echo_core: Option<CoreId>,
) -> Result<(), String> {
    // The control address first: a second server on a busy one stops here,
    // before its port could take the first one's link (its memif socket).
    let listener = TcpListener::bind(listen)
        .map_err(|e| format!("cannot listen on {listen}: {e} (choose another with --listen)"))?;
    let (eal, pool) = start_eal(hugepages, mtu, &side.devargs())?;
    let link = Link::side(&eal, &pool, mtu, side, true)?;
    eprintln!(
        "emx-bench: serving {}, control on {listen}{}",
        link.name,
        if once {
            ", for one client"
        } else {
            ", for clients one after another until stopped"
        }
    );
    let serving = Arc::new(Mutex::new(None));
    let clients = accept_clients(listener, listen.to_string(), serving.clone());
    loop {
        let (n, peer, stream) = clients.recv().map_err(|_| "the listener stopped")??;
        eprintln!("emx-bench: client {n} ({peer}) connected");
        let r = serve_client(
            &eal,
            &pool,
            &link,
            mtu,
            stream,
            Released(&serving),
            echo_core,
        );
        if once {
            return r;
        }
        match r {
            Ok(()) => eprintln!("emx-bench: client {n} ({peer}) done"),
            Err(e) => eprintln!("emx-bench: client {n} ({peer}): {e}"),
        }
    }
}

/// The client being served, by number and address; `None` while the server
/// is free.
type Serving = Arc<Mutex<Option<(u64, SocketAddr)>>>;

/// Frees the server when dropped: the client's echo thread has stopped, so
/// the next client may be taken.
struct Released<'a>(&'a Serving);

impl Drop for Released<'_> {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Takes connections on a thread of its own: the first while the server is
/// free goes to the server (marked as served before it is handed over, so a
/// second one right behind it is not queued); any other waits a moment for
/// the server, then is told that it is busy (see [`wait_or_refuse`]). The
/// thread outlives the server's loop and ends with the process.
fn accept_clients(
    listener: TcpListener,
    listen: String,
    serving: Serving,
) -> mpsc::Receiver<Taken> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut n = 0u64;
        let waiting = Arc::new(AtomicUsize::new(0));
        loop {
            let (stream, peer) = match listener.accept() {
                Ok(c) => c,
                Err(e) if accept_error_passes(&e) => {
                    // Out of descriptors or memory for a moment, or a client
                    // that gave up: the server goes on.
                    eprintln!("emx-bench: cannot take a client on {listen} now: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                Err(e) => {
                    let _ = tx.send(Err(format!("cannot take a client on {listen}: {e}")));
                    return;
                }
            };
            n += 1;
            match take_or_busy(&serving, n, peer) {
                None => {
                    if tx.send(Ok((n, peer, stream))).is_err() {
                        return;
                    }
                }
                Some(other) if waiting.load(Ordering::Acquire) >= MAX_WAITING => {
                    // Enough wait already: no thread (and no grace) for more.
                    refuse(n, peer, &stream, other);
                }
                Some(_) => {
                    // Off this thread, which goes on taking connections.
                    let (serving, tx, waiting) = (serving.clone(), tx.clone(), waiting.clone());
                    waiting.fetch_add(1, Ordering::AcqRel);
                    std::thread::spawn(move || {
                        wait_or_refuse(n, peer, stream, &serving, &tx);
                        waiting.fetch_sub(1, Ordering::AcqRel);
                    });
                }
            }
        }
    });
    rx
}

/// A client that came while another is served: it is handed to the server
/// if the server is free within [`GRACE`] (the other client is ending; a
/// client that died leaves its echo thread a moment to stop), or told that
/// the server is busy.
fn wait_or_refuse(n: u64, peer: SocketAddr, stream: TcpStream, serving: &Serving, tx: &Clients) {
    let t = Instant::now();
    let other = loop {
        match take_or_busy(serving, n, peer) {
            None => {
                let _ = tx.send(Ok((n, peer, stream)));
                return;
            }
            Some(other) if t.elapsed() >= GRACE => break other,
            Some(_) => {}
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    refuse(n, peer, &stream, other);
}

/// Marks client `n` as the one served if the server is free (`None`);
/// otherwise the client being served.
fn take_or_busy(serving: &Serving, n: u64, peer: SocketAddr) -> Option<(u64, SocketAddr)> {
    let mut s = serving.lock().unwrap_or_else(|e| e.into_inner());
    let busy = *s;
    if busy.is_none() {
        *s = Some((n, peer));
    }
    busy
}

/// Tells a client that the server is busy with client `other`.
fn refuse(n: u64, peer: SocketAddr, stream: &TcpStream, other: (u64, SocketAddr)) {
    eprintln!(
        "emx-bench: client {n} ({peer}) refused: busy with client {}",
        other.0
    );
    let why = format!(
        "busy with another client ({}); try again when its run ends",
        other.1
    );
    // (a fresh connection's send buffer takes the line without waiting)
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = send_answer(&mut &*stream, &Answer::Failed(why));
}

/// Whether the acceptor goes on after `accept` failed with `e`: the process
/// or system ran out of descriptors or memory for now, or a connection was
/// aborted before it was taken. Anything else (the socket itself broken)
/// ends it.
fn accept_error_passes(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    matches!(
        e.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::Interrupted | ErrorKind::WouldBlock
    ) || e.raw_os_error().is_some_and(|c| {
        [
            Errno::EMFILE,
            Errno::ENFILE,
            Errno::ENOBUFS,
            Errno::ENOMEM,
            Errno::EPROTO,
            Errno::EPERM,
        ]
        .contains(&Errno::from_raw(c))
    })
}

/// Clients that wait (up to [`GRACE`]) for the one being served, each on a
/// thread; more are refused at once.
const MAX_WAITING: usize = 8;

/// How long a client that comes while another is served waits for the
/// server before it is refused.
const GRACE: Duration = Duration::from_secs(2);

/// A client taken (its number, address and connection), as the acceptor
/// hands it to the server, or why the acceptor stopped.
type Taken = Result<(u64, SocketAddr, TcpStream), String>;

/// Where the acceptor hands clients to the server.
type Clients = mpsc::Sender<Taken>;

/// How long a client may take from connecting to its hello.
const HELLO_WITHIN: Duration = Duration::from_secs(30);

/// The longest request line taken (a hello with its MACs is about 200 bytes).
const MAX_REQUEST: usize = 64 << 10;

/// [`read_request`]'s error when its deadline passed.
const TIMED_OUT: &str = "timed out";

/// Reads one request line of at most [`MAX_REQUEST`] bytes, all of it by
/// `deadline` when there is one. `None`: the client closed (or reset) the
/// connection between requests.
fn read_request(
    reader: &mut BufReader<TcpStream>,
    deadline: Option<Instant>,
) -> Result<Option<Request>, String> {
    let mut line = Vec::new();
    loop {
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TIMED_OUT.into());
            }
            let _ = reader.get_ref().set_read_timeout(Some(left));
        }
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            // Reset: closed with our greeting unread.
            Err(e) if e.kind() == ErrorKind::ConnectionReset && line.is_empty() => return Ok(None),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // The read's timeout: the loop checks the deadline.
            Err(e)
                if deadline.is_some()
                    && matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                continue
            }
            Err(e) => return Err(e.to_string()),
        };
        if buf.is_empty() {
            return match line.is_empty() {
                true => Ok(None),
                false => Err("the connection closed in the middle of a request".into()),
            };
        }
        let (take, end) = match buf.iter().position(|&c| c == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if line.len() > MAX_REQUEST {
            return Err(format!("a request longer than {MAX_REQUEST} bytes"));
        }
        if end {
            break;
        }
    }
    if deadline.is_some() {
        let _ = reader.get_ref().set_read_timeout(None);
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|e| format!("bad request: {e}"))
}

/// Has the kernel probe an idle client connection, so that a client whose
/// host died (no FIN ever comes) ends its session within about a minute
/// instead of holding the server, busy, forever. Best effort.
fn keep_alive(stream: &TcpStream) {
    use nix::sys::socket::{setsockopt, sockopt};
    let _ = setsockopt(stream, sockopt::KeepAlive, &true);
    let _ = setsockopt(stream, sockopt::TcpKeepIdle, &30);
    let _ = setsockopt(stream, sockopt::TcpKeepInterval, &10);
    let _ = setsockopt(stream, sockopt::TcpKeepCount, &3);
}

/// Writes one answer line.
fn send_answer(w: &mut impl Write, a: &Answer) -> Result<(), String> {
    let mut v = serde_json::to_vec(a).map_err(|e| e.to_string())?;
    v.push(b'\n');
    w.write_all(&v).map_err(|e| e.to_string())
}

/// Waits for this side's ports of `link` to come up (the client's are
/// open by the time it says hello) and starts the echo thread on them.
fn start_echo(
    eal: &Eal,
    pool: &Mempool,
    link: &Link,
    b: &[End],
    macs: &[[u8; 6]],
    core: Option<CoreId>,
) -> Result<(Arc<Ctl>, EchoThread), String> {
    const UP_WITHIN: Duration = Duration::from_secs(10);
    for c in &link.channels {
        c.b.port.wait_link(UP_WITHIN).map_err(|_| {
            format!(
                "this server's port {} did not come up within {} s: it does not see the \
                 client's (give both sides the same --link; memif ports the same socket, and \
                 for --link devargs the same id)",
                c.b.port.name(),
                UP_WITHIN.as_secs()
            )
        })?;
    }
    spawn_echo(eal, pool, link, b, macs, core)
}

/// Why the echo thread must not be given a client's command: it trusts its
/// commands, as its own process's pinger sends them (a frame of no bytes
/// divides by zero, an endpoint past the two indexes out of bounds, a
/// channel not opened is unwrapped, and a huge depth asks for buffers until
/// memory runs out). A client of another version, or no emx-bench at all,
/// gets an answer instead. `open` says which channels it opened.
fn refused(cmd: &Cmd, open: &[bool; 3], mtu: u16) -> Option<String> {
    const MAX_SIZE: usize = 8 << 20;
    let per_max = usize::from(mtu).saturating_sub(8);
    let raw = |size: usize, per: usize| {
        if !open[RAW] {
            Some("the raw channel is not open".to_owned())
        } else if per == 0 || per > per_max || size > MAX_SIZE {
            Some(format!(
                "raw messages of {size} B in frames of {per} B (at most 8 MiB, in frames of 1 to {per_max} B)"
            ))
        } else {
            None
        }
    };
    let emx = |ep: usize, size: usize| {
        if !(ep < 2 && open[EMX_INLINE + ep]) {
            Some(format!("endpoint {ep}'s channel is not open"))
        } else if size > MAX_SIZE {
            Some(format!("emx messages of {size} B (at most 8 MiB)"))
        } else {
            None
        }
    };
    match *cmd {
        Cmd::Open { chan } if chan >= open.len() => Some(format!("there is no channel {chan}")),
        Cmd::RawPong { size, per } => raw(size, per),
        Cmd::RawSink { back, .. } => raw(back.map_or(0, |b| b.0), back.map_or(1, |b| b.1)),
        Cmd::EmxPong { ep, size } => emx(ep, size),
        Cmd::EmxSink {
            ep, size, depth, ..
        } => emx(ep, size).or_else(|| {
            (depth == 0 || depth > crate::MAX_WINDOW || !crate::session::window_fits(depth, size))
                .then(|| format!("{depth} messages of {size} B in flight"))
        }),
        _ => None,
    }
}

/// Serves one client on `link`: checks its hello, starts an echo thread for
/// it, obeys its requests until it says goodbye or goes away, then stops the
/// thread and frees the server (`release`), before it answers the goodbye so
/// that a client started right after this one finds the server free.
fn serve_client(
    eal: &Eal,
    pool: &Mempool,
    link: &Link,
    mtu: u16,
    stream: TcpStream,
    release: Released,
    echo_core: Option<CoreId>,
) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    keep_alive(&stream);
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let mut writer = stream;
    send_answer(&mut writer, &Answer::Ready)?;
    // A connection that never says hello (or says it a byte at a time) would
    // hold the server forever.
    let hello = read_request(&mut reader, Some(Instant::now() + HELLO_WITHIN)).map_err(|e| {
        if e == TIMED_OUT {
            format!("no hello within {} s; dropped", HELLO_WITHIN.as_secs())
        } else {
            e
        }
    });
    let (macs, theirs, shared) = match hello? {
        Some(Request::Hello {
            macs,
            mtu: theirs,
            shared,
        }) => (macs, theirs, shared),
        Some(other) => return Err(format!("the client began with {other:?}, not a hello")),
        None => return Err("the client went away before its hello".into()),
    };
    if theirs != mtu || macs.len() != 3 || shared != link.shared {
        let queues = |s: bool| {
            if s {
                "one shared queue pair"
            } else {
                "a queue pair per channel"
            }
        };
        let why = format!(
            "the client runs MTU {theirs} with {} channels on {}; this server MTU {mtu} with 3 on {} (give both the same --link and --mtu)",
            macs.len(),
            queues(shared),
            queues(link.shared),
        );
        // (the mismatch, not a failure to say it, is the error)
        let _ = send_answer(&mut writer, &Answer::Failed(why.clone()));
        return Err(why);
    }
    let b: Vec<End> = link.channels.iter().map(|c| c.b.clone()).collect();
    // What fails from here to the hello's answer is the client's answer too:
    // it would otherwise see only the connection close.
    let (ctl, thread) = match start_echo(eal, pool, link, &b, &macs, echo_core) {
        Ok(started) => started,
        Err(why) => {
            let _ = send_answer(&mut writer, &Answer::Failed(why.clone()));
            return Err(why);
        }
    };
    let mut thread = Some(thread);
    let ours: Vec<[u8; 6]> = b.iter().map(|e| e.port.mac()).collect();
    // (Not `?`: the echo thread is stopped and joined below, whatever happens.)
    let greeted = send_answer(&mut writer, &Answer::Hello { macs: ours });
    let hz = dpdk_ffi::tsc_hz(eal) as f64;
    let mut bye = false;
    // The channels the client opened (the echo thread's, by number).
    let mut open = [false; 3];
    let result = loop {
        if let Err(e) = &greeted {
            break Err(e.clone());
        }
        let req = match read_request(&mut reader, None) {
            Ok(Some(r)) => r,
            Ok(None) => break Err("the client went away before its goodbye".into()),
            Err(e) => break Err(e),
        };
        let a = match req {
            Request::Command(cmd) => match refused(&cmd, &open, mtu) {
                Some(why) => Answer::Failed(format!("command refused: {why}")),
                None => {
                    let gen = ctl.switch(cmd);
                    match await_switch(&ctl, gen, &mut thread, &mut || {}) {
                        Ok(()) => {
                            match cmd {
                                Cmd::Open { chan } => open[chan] = true,
                                Cmd::Close => open = [false; 3],
                                _ => {}
                            }
                            Answer::Running(gen)
                        }
                        Err(e) => Answer::Failed(e),
                    }
                }
            },
            Request::Stop => {
                ctl.stop();
                Answer::Done
            }
            Request::Counters => Answer::Counters(ctl.counters(hz)),
            Request::Bye => {
                bye = true;
                break Ok(());
            }
            Request::Hello { .. } => Answer::Failed("hello twice".into()),
        };
        if let Err(e) = send_answer(&mut writer, &a) {
            break Err(e);
        }
    };
    ctl.switch(Cmd::Stop);
    let echo = match thread {
        Some(t) => t.join().map_err(|_| "the echo thread panicked")?,
        // Failed earlier, and said so to the client.
        None => Ok(()),
    };
    drop(release);
    if bye {
        let _ = send_answer(&mut writer, &Answer::Done);
    }
    result.and(echo)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair: the server's reader and the client's end.
    fn pair() -> (BufReader<TcpStream>, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (BufReader::new(s), c)
    }

    /// Commands the echo thread would panic on, or run out of memory for,
    /// are answered instead; its own pinger's pass.
    #[test]
    fn commands_the_echo_cannot_carry_out_are_refused() {
        use crate::session::Cmd;
        let none = [false; 3];
        let all = [true; 3];
        let sink = |ep, size, depth| Cmd::EmxSink {
            ep,
            size,
            depth,
            back: false,
            sends: crate::session::SendBuffers::Multiple,
            warmup_us: 0,
        };
        let bad = [
            (Cmd::Open { chan: 3 }, all),
            (Cmd::RawPong { size: 8, per: 0 }, all),
            (Cmd::RawPong { size: 8, per: 9000 }, all),
            (
                Cmd::RawPong {
                    size: 9 << 20,
                    per: 8000,
                },
                all,
            ),
            (Cmd::RawPong { size: 8, per: 100 }, none),
            (
                Cmd::RawSink {
                    back: Some((8, 0)),
                    warmup_us: 0,
                },
                all,
            ),
            (
                Cmd::RawSink {
                    back: None,
                    warmup_us: 0,
                },
                none,
            ),
            (Cmd::EmxPong { ep: 7, size: 8 }, all),
            (Cmd::EmxPong { ep: 1, size: 8 }, [true, true, false]),
            (sink(0, 0, usize::MAX), all),
            (sink(0, 1 << 20, 41), all),
            (sink(0, 8, 0), all),
        ];
        for (cmd, open) in bad {
            assert!(
                refused(&cmd, &open, 9000).is_some(),
                "{cmd:?} with {open:?}"
            );
        }
        let good = [
            Cmd::Open { chan: 2 },
            Cmd::RawPong { size: 0, per: 8992 },
            Cmd::RawPong {
                size: 8 << 20,
                per: 8992,
            },
            Cmd::EmxPong {
                ep: 1,
                size: 8 << 20,
            },
            sink(1, 1 << 20, 40),
            sink(0, 8, crate::MAX_WINDOW),
            Cmd::Close,
            Cmd::FfiPong,
        ];
        for cmd in good {
            assert_eq!(refused(&cmd, &all, 9000), None, "{cmd:?}");
        }
    }

    /// Requests are read a line each; a line that does not end is refused
    /// past the limit rather than kept growing; a closed connection is the
    /// end of the requests.
    #[test]
    fn requests_are_lines_of_bounded_length() {
        let (mut r, mut c) = pair();
        c.write_all(b"\"Stop\"\n\"Bye\"\n").unwrap();
        assert!(matches!(
            read_request(&mut r, None),
            Ok(Some(Request::Stop))
        ));
        assert!(matches!(read_request(&mut r, None), Ok(Some(Request::Bye))));
        c.write_all(&vec![b' '; MAX_REQUEST + 10]).unwrap();
        let e = read_request(&mut r, None).unwrap_err();
        assert!(e.contains("longer than"), "{e}");
        let (mut r, c) = pair();
        drop(c);
        assert!(matches!(read_request(&mut r, None), Ok(None)));
    }

    /// A client that sends its hello a byte at a time, each byte well
    /// within a read's timeout, is still held to the hello's deadline.
    #[test]
    fn a_dripping_hello_meets_its_deadline() {
        let (mut r, mut c) = pair();
        let drip = std::thread::spawn(move || {
            for _ in 0..40 {
                if c.write_all(b" ").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let start = Instant::now();
        let e = read_request(&mut r, Some(start + Duration::from_millis(300))).unwrap_err();
        assert_eq!(e, TIMED_OUT);
        assert!(
            start.elapsed() < Duration::from_millis(1500),
            "{:?}",
            start.elapsed()
        );
        drop(r);
        drip.join().unwrap();
    }

    /// While a client is served, [`MAX_WAITING`] later ones wait their
    /// grace, each on a thread; the ones after them are refused at once,
    /// with no thread of their own.
    #[test]
    fn clients_beyond_the_waiting_ones_are_refused_at_once() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let serving: Serving = Arc::new(Mutex::new(Some((0, at))));
        let _clients = accept_clients(l, at.to_string(), serving);
        let conns: Vec<TcpStream> = (0..MAX_WAITING + 2)
            .map(|_| {
                let c = TcpStream::connect(at).unwrap();
                c.set_read_timeout(Some(Duration::from_millis(1000)))
                    .unwrap();
                c
            })
            .collect();
        let answer = |c: &TcpStream| {
            let mut line = String::new();
            BufReader::new(c).read_line(&mut line).map(|_| line)
        };
        let start = Instant::now();
        for c in &conns[MAX_WAITING..] {
            let a = answer(c).expect("refused at once");
            assert!(a.contains("busy with another client"), "{a}");
        }
        assert!(start.elapsed() < GRACE / 2, "{:?}", start.elapsed());
        let e = answer(&conns[0]).expect_err("a waiting client is answered after its grace");
        assert!(
            matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "{e}"
        );
    }

    #[test]
    fn the_acceptor_outlives_a_lack_of_descriptors() {
        use nix::errno::Errno;
        let e = |c: Errno| std::io::Error::from_raw_os_error(c as i32);
        assert!(accept_error_passes(&e(Errno::EMFILE)));
        assert!(accept_error_passes(&e(Errno::ECONNABORTED)));
        assert!(!accept_error_passes(&e(Errno::EBADF)));
        assert!(!accept_error_passes(&e(Errno::EINVAL)));
    }

    /// A server whose SYNs are dropped (here its accept queue is full, as a
    /// firewall's DROP would do) is given up on within the budget, and the
    /// error says what to check: a plain connect waited for the kernel's SYN
    /// retries, about two minutes, before the budget was even looked at.
    #[test]
    fn a_server_that_drops_syns_is_given_up_on_in_time() {
        use nix::sys::socket::{
            bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, SockaddrIn,
        };
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::empty(),
            None,
        )
        .unwrap();
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrIn::new(127, 0, 0, 1, 0),
        )
        .unwrap();
        listen(&fd, Backlog::new(0).unwrap()).unwrap();
        let listener = TcpListener::from(fd);
        let addr = listener.local_addr().unwrap();
        // Fill the accept queue; nothing accepts.
        let _held: Vec<_> = (0..2)
            .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok())
            .collect();
        let t = Instant::now();
        let e = Client::connect_within(
            &addr.to_string(),
            Duration::from_millis(1500),
            Duration::from_secs(60),
        )
        .err()
        .expect("no server answers");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(
            e.contains("no answer from the emx-bench server") && e.contains("firewall"),
            "{e}"
        );
    }

    /// A request whose answer came too late: its answer is not taken for the
    /// next request's. (`bye` took the late answer to `counters` as its own,
    /// and the client left as if its server had stopped its echo thread.)
    #[test]
    fn a_late_answer_is_not_taken_for_the_next_ones() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let send = |s: &mut TcpStream, a: &Answer| {
                let mut line = serde_json::to_vec(a).unwrap();
                line.push(b'\n');
                s.write_all(&line).unwrap();
            };
            send(&mut s, &Answer::Ready);
            let mut lines = BufReader::new(s.try_clone().unwrap()).lines();
            let first = lines.next().unwrap().unwrap();
            std::thread::sleep(Duration::from_millis(400));
            send(&mut s, &Answer::Counters(Counters::default()));
            // Whatever comes next, if anything, before the client hangs up.
            let next = lines.next().and_then(Result::ok);
            (first, next)
        });
        // Connected with time to spare (a loaded machine's server thread may
        // take more than 100 ms to say it is ready), then impatient.
        let mut c = Client::connect_within(
            &addr.to_string(),
            Duration::from_secs(5),
            Duration::from_secs(5),
        )
        .unwrap();
        c.answer_within = Duration::from_millis(100);
        let e = c.counters().unwrap_err();
        assert_eq!(e, "the server does not answer");
        let e = c.bye().unwrap_err();
        assert!(e.contains("earlier request unanswered"), "{e}");
        let (first, next) = server.join().unwrap();
        assert!(first.contains("Counters"), "{first}");
        assert_eq!(next, None, "nothing sent after the unanswered request");
    }
}
