//! The control socket: a thread accepts connections, one thread per
//! connection reads requests (one JSON object per line) and hands each to
//! the main loop over a channel, with a channel for its reply. The endpoints
//! stay on the main loop's thread.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emx_daemon::control::{reply_err, reply_ok, Request};
use nix::fcntl::{Flock, FlockArg};
use tracing::{debug, info, warn};

/// A request for the main loop, and where its reply (one JSON line, without
/// the newline) goes.
pub struct Control {
    /// The request.
    pub req: Request,
    /// Where the reply goes.
    pub reply: Sender<String>,
    /// Set when the client that asked has gone (closed its connection)
    /// before the reply: work still under way for it (a check) may stop.
    pub left: Arc<AtomicBool>,
}

/// Where emxd stands, as its control connections see it: the socket is
/// served from the start, and until the main loop serves requests they are
/// answered here (a request queued then would be served once the link came
/// up, seconds later, for a client that may have given up on it long
/// before: a `shutdown` that emxctl reported failed stopped emxd later).
#[derive(Debug)]
pub struct Gate {
    /// Set once the main loop serves requests.
    pub up: AtomicBool,
    /// Raised by a `shutdown` asked while emxd starts. Not the signals' stop
    /// flag, which it used to raise: a SIGTERM after it then counted as a
    /// second signal and ended emxd at once, with no drain.
    pub asked: Arc<AtomicBool>,
}

/// The reply to a request other than `shutdown` while emxd starts.
pub const STARTING: &str = "emxd is starting: its link is not up yet; try again \
                            (emxctl wait waits for it)";

/// How often a connection waiting for its reply looks whether its client
/// is still there.
const LEFT_EVERY: Duration = Duration::from_millis(200);

/// The socket file, removed when this is dropped.
pub struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Permissions of the control socket: only its owner may connect
/// (connecting needs write permission), whatever the umask. (Under the
/// usual umask, 022, that is what it was before it was set explicitly.)
pub const SOCKET_MODE: u32 = 0o600;

/// How long [`bind`] waits for another emxd binding in the same directory.
const DIR_LOCK_WAIT: Duration = Duration::from_secs(5);

/// Binds the control socket at `path`, creating its directory, with
/// [`SOCKET_MODE`]. A socket file left by an emxd that is gone is replaced;
/// one that answers is not. The look at what is there and the bind run
/// under an exclusive lock on the directory, so that two emxds starting at
/// once on one path cannot both take it for stale: the second finds the
/// first's socket listening.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile), String> {
    let shown = path.display();
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| {
                format!(
                    "cannot create {} for the control socket: {e}{}",
                    dir.display(),
                    fix(&e)
                )
            })?;
            dir
        }
        None => Path::new("."),
    };
    // (std says so for a path too long for a socket address, where nix
    // would say only ENAMETOOLONG)
    std::os::unix::net::SocketAddr::from_pathname(path)
        .map_err(|e| format!("control socket {shown}: {e} (give a shorter --control)"))?;
    let _locked = lock_dir(dir)?;
    let listener = match listen_at(path) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            // Only a socket nobody serves is replaced: whatever else is
            // there (a file given as --control by mistake) is left alone.
            let is_socket = std::fs::symlink_metadata(path)
                .map(|m| m.file_type().is_socket())
                .unwrap_or(false);
            if !is_socket {
                return Err(format!(
                    "control socket {shown}: something that is not a socket is there (give \
                     --control another path)"
                ));
            }
            match UnixStream::connect(path) {
                Ok(_) => {
                    return Err(format!(
                        "control socket {shown}: another emxd is serving it (stop it first, or \
                         give --control another path)"
                    ))
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    return Err(format!(
                        "control socket {shown}: another user's socket is there{} (give \
                         --control a path in a folder only you can write, such as \
                         $XDG_RUNTIME_DIR, and the same to emxctl)",
                        owner(path)
                    ))
                }
                Err(e) => {
                    return Err(format!(
                        "control socket {shown}: there is a socket there, and connecting to it \
                         to see whether an emxd serves it failed: {e}"
                    ))
                }
            }
            std::fs::remove_file(path).map_err(|e| {
                format!(
                    "control socket {shown}: cannot remove the stale socket{}: {e}{}",
                    owner(path),
                    fix(&e)
                )
            })?;
            listen_at(path).map_err(|e| format!("control socket {shown}: {e}"))?
        }
        Err(e) => return Err(format!("control socket {shown}: {e}{}", fix(&e))),
    };
    Ok((listener, SocketFile(path.to_owned())))
}

/// ", owned by uid N" for the file at `path`, when it can be read.
fn owner(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .map(|m| format!(", owned by uid {}", m.uid()))
        .unwrap_or_default()
}

/// What to do about a control socket that cannot be made, where it is plain.
fn fix(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
            " (run emxd as root, or give --control a path in a directory you may write, and \
             the same --control to emxctl)"
        }
        _ => "",
    }
}

/// An exclusive lock on directory `dir`, waited for up to [`DIR_LOCK_WAIT`];
/// `None` (and a warning) where its file system takes no locks.
fn lock_dir(dir: &Path) -> Result<Option<Flock<std::fs::File>>, String> {
    let shown = dir.display();
    let mut file = std::fs::File::open(dir)
        .map_err(|e| format!("cannot open {shown} to lock it for the control socket: {e}"))?;
    let t = std::time::Instant::now();
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(held) => return Ok(Some(held)),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if t.elapsed() < DIR_LOCK_WAIT => {
                file = f;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(format!(
                    "{shown} stayed locked for {} s: another emxd binds its control socket there \
                     (or something else holds a lock on the directory)",
                    DIR_LOCK_WAIT.as_secs()
                ))
            }
            Err((_, e)) => {
                warn!(dir = %shown, error = %e, "cannot lock the control socket's directory; \
                      binding without the lock");
                return Ok(None);
            }
        }
    }
}

/// A listening socket bound at `path` with [`SOCKET_MODE`]: the mode is set
/// between bind and listen, so that no client connects under the umask's.
/// Where the file system refuses the mode, it says so and goes on, as it
/// was before the mode was set.
fn listen_at(path: &Path) -> std::io::Result<UnixListener> {
    use nix::sys::socket::{self, AddressFamily, Backlog, SockFlag, SockType, UnixAddr};
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    socket::bind(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE)) {
        warn!(socket = %path.display(), error = %e,
              "cannot set the control socket's mode to {SOCKET_MODE:o}; it keeps the umask's");
    }
    if let Err(e) = socket::listen(&fd, Backlog::MAXCONN) {
        // Bound by us: nobody else's file.
        let _ = std::fs::remove_file(path);
        return Err(e.into());
    }
    Ok(UnixListener::from(fd))
}

/// The longest request line taken (a `check` with its most sizes is a few
/// kilobytes); a longer one is answered with an error and the connection
/// closed.
pub const MAX_LINE: usize = 64 * 1024;

/// Connections served at once; more are answered with an error and closed.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a connection may take to send a whole request line, from its
/// connection or its last reply, before it is closed: silent, or sending a
/// byte now and then.
pub const IDLE: Duration = Duration::from_secs(30);

/// Reads from a stream with every read bounded by one deadline: however the
/// bytes come, none is read after `until` (the read fails `TimedOut`).
struct Deadline<'a> {
    stream: &'a UnixStream,
    until: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        (&*self.stream).read(buf)
    }
}

/// Serves `listener` on its own threads, handing requests to `tx`.
pub fn serve(listener: UnixListener, tx: Sender<Control>, gate: Arc<Gate>) -> Result<(), String> {
    let live = Arc::new(AtomicUsize::new(0));
    // The caller's span (the node's) goes with the threads: their lines name
    // the node as the main thread's do.
    let span = tracing::Span::current();
    std::thread::Builder::new()
        .name("emxd-control".into())
        .spawn(move || {
            let _node = span.clone().entered();
            // An accept that keeps failing is logged once, until one works.
            let mut failing = false;
            for conn in listener.incoming() {
                if conn.is_ok() && failing {
                    info!("control socket: accepting again");
                    failing = false;
                }
                match conn {
                    Ok(stream) if live.load(Ordering::Relaxed) >= MAX_CONNECTIONS => {
                        refuse(stream, "too many control connections at once; try again");
                    }
                    Ok(stream) => {
                        let (tx, gate) = (tx.clone(), gate.clone());
                        live.fetch_add(1, Ordering::Relaxed);
                        let done = Live(live.clone());
                        let span = span.clone();
                        let spawned =
                            std::thread::Builder::new()
                                .name("emxd-conn".into())
                                .spawn(move || {
                                    let _node = span.entered();
                                    let _done = done;
                                    connection(stream, tx, &gate)
                                });
                        if let Err(e) = spawned {
                            warn!(error = %e, "cannot serve a control connection");
                        }
                    }
                    Err(e) => {
                        // Out of descriptors, say: do not spin on the error.
                        if !failing {
                            warn!(error = %e, "control socket: accept failed; retrying every 100 ms");
                            failing = true;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })
        .map(|_| ())
        .map_err(|e| format!("cannot start the control thread: {e}"))
}

/// Counts a connection served until dropped.
struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Answers `why` and closes.
fn refuse(stream: UnixStream, why: &str) {
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let mut out = reply_err::<()>(why, None).into_bytes();
    out.push(b'\n');
    let _ = (&stream).write_all(&out);
}

/// Whether the client at the other end of `stream` is gone: it closed its
/// socket (a hang-up), or the socket failed. One that only shut its writing
/// side (`nc -N`, a script that closed its input) still waits to read, and
/// has not left.
fn client_left(stream: &UnixStream) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(stream.as_fd(), PollFlags::empty())];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
        Err(_) => false,
    }
}

fn connection(stream: UnixStream, tx: Sender<Control>, gate: &Gate) {
    if stream.set_read_timeout(Some(IDLE)).is_err() || stream.set_write_timeout(Some(IDLE)).is_err()
    {
        return;
    }
    // A whole request line within IDLE of the connection or of the last
    // reply: a client that sends a byte (or an empty line) now and then
    // holds a connection no longer than a silent one (each read's own
    // timeout let one keep it for good, and 64 such locked emxctl out).
    let mut reader = BufReader::new(Deadline {
        stream: &stream,
        until: Instant::now() + IDLE,
    });
    let mut raw = Vec::new();
    loop {
        raw.clear();
        match (&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut raw)
        {
            Ok(0) | Err(_) => break, // closed, silent too long, or failed
            Ok(_) => {}
        }
        if raw.last() != Some(&b'\n') && raw.len() > MAX_LINE {
            refuse(
                stream,
                &format!(
                    "bad request: longer than {MAX_LINE} bytes (want one JSON object per line)"
                ),
            );
            return;
        }
        let line = String::from_utf8_lossy(&raw);
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Request>(&line) {
            Err(e) => reply_err::<()>(
                &format!(
                    "bad request: {e} (want one JSON object per line, such as \
                     {{\"cmd\":\"status\"}}; commands: status, peers, stats, check, shutdown)"
                ),
                None,
            ),
            // The client that asked is gone already (a request accepted
            // late): nothing is done for it.
            Ok(_) if client_left(&stream) => return,
            Ok(Request::Shutdown) if !gate.up.load(Ordering::Acquire) => {
                info!("shutdown requested over the control socket while starting");
                gate.asked.store(true, Ordering::Relaxed);
                reply_ok(&serde_json::json!({ "stopping": true }))
            }
            Ok(_) if !gate.up.load(Ordering::Acquire) => reply_err::<()>(STARTING, None),
            Ok(req) => {
                debug!(?req, "control request");
                let (rtx, rrx) = mpsc::channel();
                let left = Arc::new(AtomicBool::new(false));
                let gone = || reply_err::<()>("emxd is shutting down", None);
                let control = Control {
                    req,
                    reply: rtx,
                    left: left.clone(),
                };
                if tx.send(control).is_err() {
                    gone()
                } else {
                    // A long reply (a check) is waited for while the client
                    // stays: one that leaves (emxctl interrupted) ends the work.
                    loop {
                        match rrx.recv_timeout(LEFT_EVERY) {
                            Ok(r) => break r,
                            Err(RecvTimeoutError::Disconnected) => break gone(),
                            Err(RecvTimeoutError::Timeout) if client_left(&stream) => {
                                left.store(true, Ordering::Relaxed);
                                return;
                            }
                            Err(RecvTimeoutError::Timeout) => {}
                        }
                    }
                }
            }
        };
        let mut out = reply.into_bytes();
        out.push(b'\n');
        if write_by(&stream, &out, Instant::now() + IDLE).is_err() {
            break;
        }
        reader.get_mut().until = Instant::now() + IDLE;
    }
}

/// Writes all of `out` by `until`: waits for room with `poll`, and writes
/// what fits without blocking. (A blocking write's timeout restarts at every
/// chunk the kernel finds room for: a client that read a little now and then
/// held its connection, one of 64, for as long as it liked, as a trickled
/// request once did. One write of 8 MiB so took 3 s under a 300 ms timeout.)
fn write_by(stream: &UnixStream, out: &[u8], until: Instant) -> std::io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use nix::sys::socket::{send, MsgFlags};
    use std::os::fd::{AsFd, AsRawFd};
    let mut done = 0;
    while done < out.len() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLOUT)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        match send(stream.as_raw_fd(), &out[done..], flags) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `e` is a timeout, which came within a second of `t`.
    fn timed_out(e: &std::io::Error, t: Instant) {
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ),
            "{e}"
        );
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }

    /// A reply that a client reads a little at a time ends at its deadline.
    #[test]
    fn a_reply_read_slowly_meets_its_deadline() {
        let (a, b) = UnixStream::pair().unwrap();
        // A little now and then, well within each write's own timeout.
        let reader = std::thread::spawn(move || {
            let mut some = [0u8; 16 << 10];
            for _ in 0..30 {
                if std::io::Read::read(&mut (&b), &mut some).unwrap_or(0) == 0 {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let t = Instant::now();
        // More than the socket buffers hold.
        let out = vec![b'x'; 8 << 20];
        let e = write_by(&a, &out, t + Duration::from_millis(300)).unwrap_err();
        timed_out(&e, t);
        drop(a);
        reader.join().unwrap();
    }

    /// A line that trickles in ends at its deadline, not at a silence.
    #[test]
    fn a_trickled_line_meets_its_deadline() {
        let (a, b) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || {
            for _ in 0..100 {
                if (&b).write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let t = Instant::now();
        let mut reader = BufReader::new(Deadline {
            stream: &a,
            until: t + Duration::from_millis(200),
        });
        let mut line = Vec::new();
        let e = reader.read_until(b'\n', &mut line).unwrap_err();
        timed_out(&e, t);
        assert!(!line.is_empty(), "bytes came meanwhile");
        drop(reader);
        drop(a);
        writer.join().unwrap();
    }
}
