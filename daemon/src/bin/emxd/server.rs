//! The control socket: a thread accepts connections, one thread per
//! connection reads requests (one JSON object per line) and hands each to
//! the main loop over a channel, with a channel for its reply. The endpoints
//! stay on the main loop's thread.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

use emx_daemon::control::{reply_err, Request};
use tracing::{debug, warn};

/// A request for the main loop, and where its reply (one JSON line, without
/// the newline) goes.
pub struct Control {
    /// The request.
    pub req: Request,
    /// Where the reply goes.
    pub reply: Sender<String>,
}

/// The socket file, removed when this is dropped.
pub struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Binds the control socket at `path`, creating its directory. A socket
/// file left by an emxd that is gone is replaced; one that answers is not.
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
    let listener = match UnixListener::bind(path) {
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
            UnixListener::bind(path).map_err(|e| format!("control socket {shown}: {e}"))?
        }
        Err(e) => return Err(format!("control socket {shown}: {e}")),
    };
    Ok((listener, SocketFile(path.to_owned())))
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
