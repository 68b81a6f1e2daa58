//! The control socket: a thread accepts connections, one thread per
//! connection reads requests (one JSON object per line) and hands each to
//! the main loop over a channel, with a channel for its reply. The endpoints
//! stay on the main loop's thread.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

use emx_daemon::control::{reply_err, Request};
use nix::fcntl::{Flock, FlockArg};
use tracing::{debug, warn};

/// A request for the main loop, and where its reply (one JSON line, without
/// the newline) goes.
pub struct Control {
    /// The request.
    pub req: Request,
    /// Where the reply goes.
    pub reply: Sender<String>,
}

/// The socket file, removed when this is dropped, and the lock on it.
pub struct SocketFile {
    path: PathBuf,
    /// Held while this emxd serves the socket; released after the file is
    /// removed. (The lock file stays: removing it would let two emxds lock
    /// two different files by the same name.)
    _lock: Flock<std::fs::File>,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Permissions of the control socket: its owner and group may connect
/// (connecting needs write permission), whatever the umask.
pub const SOCKET_MODE: u32 = 0o660;

/// Binds the control socket at `path`, creating its directory, with
/// [`SOCKET_MODE`]. A socket file left by an emxd that is gone is replaced;
/// one that answers is not. An exclusive lock on `path` + `.lock`, held for
/// the returned file's lifetime, keeps two emxds that start at once from
/// both taking the path for stale and replacing each other's socket.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile), String> {
    let shown = path.display();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| {
            format!(
                "cannot create {} for the control socket: {e}",
                dir.display()
            )
        })?;
    }
    // Whatever is there and is not a socket (a file given as --control by
    // mistake) is left alone, and no lock file is made beside it.
    let is_socket = |p: &Path| std::fs::symlink_metadata(p).map(|m| m.file_type().is_socket());
    if matches!(is_socket(path), Ok(false)) {
        return Err(format!(
            "control socket {shown}: something that is not a socket is there (give --control \
             another path)"
        ));
    }
    let lock = lock_beside(path)?;
    let listener = match listen_at(path) {
        Ok(l) => l,
        Err(nix::errno::Errno::EADDRINUSE) => {
            if !is_socket(path).unwrap_or(false) {
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
                Err(e) => {
                    return Err(format!(
                        "control socket {shown}: there is a socket there, and connecting to it \
                         to see whether an emxd serves it failed: {e}"
                    ))
                }
            }
            std::fs::remove_file(path).map_err(|e| {
                format!("control socket {shown}: cannot remove the stale socket: {e}")
            })?;
            listen_at(path).map_err(|e| format!("control socket {shown}: {e}"))?
        }
        Err(e) => return Err(format!("control socket {shown}: {e}")),
    };
    Ok((
        listener,
        SocketFile {
            path: path.to_owned(),
            _lock: lock,
        },
    ))
}

/// Takes the exclusive lock on `path` + `.lock`, or says who holds it.
fn lock_beside(path: &Path) -> Result<Flock<std::fs::File>, String> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| {
            format!(
                "cannot open the control socket's lock {}: {e}",
                lock_path.display()
            )
        })?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        if e == nix::errno::Errno::EWOULDBLOCK {
            format!(
                "control socket {}: another emxd holds its lock {} (it serves the socket or is \
                 starting on it: stop it first, or give --control another path)",
                path.display(),
                lock_path.display()
            )
        } else {
            format!("cannot lock {}: {e}", lock_path.display())
        }
    })
}

/// A listening socket bound at `path` with [`SOCKET_MODE`]: the mode is set
/// between bind and listen, so that no client connects under the umask's.
fn listen_at(path: &Path) -> Result<UnixListener, nix::errno::Errno> {
    use nix::sys::socket::{self, AddressFamily, Backlog, SockFlag, SockType, UnixAddr};
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    socket::bind(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    let listening = std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(|e| {
            nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(nix::errno::Errno::EIO as i32))
        })
        .and_then(|()| socket::listen(&fd, Backlog::new(128)?));
    if let Err(e) = listening {
        // Bound by us: nobody else's file.
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(UnixListener::from(fd))
}

/// The longest request line taken (a `check` with its most sizes is a few
/// kilobytes); a longer one is answered with an error and the connection
/// closed.
pub const MAX_LINE: usize = 64 * 1024;

/// Connections served at once; more are answered with an error and closed.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a connection may stay silent before it is closed.
pub const IDLE: Duration = Duration::from_secs(30);

/// Serves `listener` on its own threads, handing requests to `tx`.
pub fn serve(listener: UnixListener, tx: Sender<Control>) -> Result<(), String> {
    let live = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("emxd-control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(stream) if live.load(Ordering::Relaxed) >= MAX_CONNECTIONS => {
                        refuse(stream, "too many control connections at once; try again");
                    }
                    Ok(stream) => {
                        let tx = tx.clone();
                        live.fetch_add(1, Ordering::Relaxed);
                        let done = Live(live.clone());
                        let spawned =
                            std::thread::Builder::new()
                                .name("emxd-conn".into())
                                .spawn(move || {
                                    let _done = done;
                                    connection(stream, tx)
                                });
                        if let Err(e) = spawned {
                            warn!(error = %e, "cannot serve a control connection");
                        }
                    }
                    Err(e) => {
                        // Out of descriptors, say: do not spin on the error.
                        warn!(error = %e, "control socket: accept failed");
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

fn connection(stream: UnixStream, tx: Sender<Control>) {
    if stream.set_read_timeout(Some(IDLE)).is_err() || stream.set_write_timeout(Some(IDLE)).is_err()
    {
        return;
    }
    let mut reader = BufReader::new(&stream);
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
            Ok(req) => {
                debug!(?req, "control request");
                let (rtx, rrx) = mpsc::channel();
                let gone = || reply_err::<()>("emxd is shutting down", None);
                if tx.send(Control { req, reply: rtx }).is_err() {
                    gone()
                } else {
                    rrx.recv().unwrap_or_else(|_| gone())
                }
            }
        };
        let mut out = reply.into_bytes();
        out.push(b'\n');
        if (&stream).write_all(&out).is_err() {
            break;
        }
    }
}
