//! The control socket: a thread accepts connections, one thread per
//! connection reads requests (one JSON object per line) and hands each to
//! the main loop over a channel, with a channel for its reply. The endpoints
//! stay on the main loop's thread.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};

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
            if UnixStream::connect(path).is_ok() {
                return Err(format!(
                    "control socket {shown}: another emxd is serving it (stop it first, or give \
                     --control another path)"
                ));
            }
            std::fs::remove_file(path).map_err(|e| {
                format!("control socket {shown}: cannot remove the stale file: {e}")
            })?;
            UnixListener::bind(path).map_err(|e| format!("control socket {shown}: {e}"))?
        }
        Err(e) => return Err(format!("control socket {shown}: {e}")),
    };
    Ok((listener, SocketFile(path.to_owned())))
}

/// Serves `listener` on its own threads, handing requests to `tx`.
pub fn serve(listener: UnixListener, tx: Sender<Control>) -> Result<(), String> {
    std::thread::Builder::new()
        .name("emxd-control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(stream) => {
                        let tx = tx.clone();
                        let spawned = std::thread::Builder::new()
                            .name("emxd-conn".into())
                            .spawn(move || connection(stream, tx));
                        if let Err(e) = spawned {
                            warn!(error = %e, "cannot serve a control connection");
                        }
                    }
                    Err(e) => warn!(error = %e, "control socket: accept failed"),
                }
            }
        })
        .map(|_| ())
        .map_err(|e| format!("cannot start the control thread: {e}"))
}

fn connection(stream: UnixStream, tx: Sender<Control>) {
    let reader = BufReader::new(&stream);
    for line in reader.lines() {
        let Ok(line) = line else { break };
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
