//! The control protocol between `emxctl` (or any tool) and `emxd`: a Unix
//! stream socket, one JSON request per line, one JSON reply per line, in
//! order.
//!
//! Requests are objects with a `cmd` ([`Request`]). Every reply is an object
//! with `"ok": true|false`; a failed one has `"error"` with the reason. A
//! successful reply carries the command's fields beside `ok`: [`Status`],
//! [`Peers`], [`Stats`], [`CheckReport`] (a check that ran but failed has
//! `"ok": false`, an `error`, and its results too).
//!
//! ```text
//! > {"cmd":"peers"}
//! < {"ok":true,"peers":[{"local":0,"node":2,"name":"client","endpoint":0,"mac":"02:00:00:00:00:02","state":"up","epoch":123,"silent_ms":0.4,"srtt_us":21.5,"rto_ms":1.0,...}]}
//! > {"cmd":"check","sizes":[1000,1048576],"peer":"client"}
//! < {"ok":true,"results":[{"node":2,"name":"client","endpoint":0,"size":1000,"ok":true,"rtt_us":35.2},...],"passed":2,"failed":0}
//! > {"cmd":"bogus"}
//! < {"ok":false,"error":"bad request: unknown variant `bogus`, expected one of ..."}
//! ```

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The folder of emxd's control sockets when not told (`--control`):
/// `$EMX_CONTROL_DIR` when set (a user who cannot write `/run`, say; emxd
/// and emxctl both read it), else `/run/emx`.
pub fn control_dir() -> PathBuf {
    std::env::var_os("EMX_CONTROL_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("/run/emx"), PathBuf::from)
}

/// Where emxd listens when not told (`--control`): `emxd-<node>.sock` in
/// [`control_dir`], `/run/emx/emxd-<node>.sock` by default.
pub fn default_control_path(node_name: &str) -> PathBuf {
    control_dir().join(format!("emxd-{node_name}.sock"))
}

/// A control request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// The node: id, name, epoch, endpoints, uptime, port, progress mode.
    Status,
    /// Every peer with its state, epoch, silence and main counters.
    Peers,
    /// Every peer's protocol counters and the link's counters.
    Stats,
    /// Echo messages of each size off each peer that is up (or `peer`) and
    /// check every byte that comes back.
    Check {
        /// Message sizes in bytes (default [`DEFAULT_CHECK_SIZES`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sizes: Option<Vec<u64>>,
        /// Only this node (all its endpoints), by id or name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<PeerRef>,
    },
    /// Drain and stop, as on SIGTERM.
    Shutdown,
}

/// The sizes `check` sends when not told: one eager message and one that
/// goes by rendezvous (with the default eager threshold of 32 KiB). Where a
/// small `[memory] region_mb` leaves some node's responder a limit below
/// 1 MiB, the larger is that limit.
pub const DEFAULT_CHECK_SIZES: [u64; 2] = [1000, 1 << 20];

/// A node, by id or by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PeerRef {
    /// By node id.
    Id(u16),
    /// By node name (a string of digits is taken as an id).
    Name(String),
}

impl PeerRef {
    /// Parses a command-line value: digits are an id, anything else a name.
    pub fn parse(s: &str) -> PeerRef {
        match s.parse() {
            Ok(id) => PeerRef::Id(id),
            Err(_) => PeerRef::Name(s.to_owned()),
        }
    }

    /// Whether it names the node with this id and name.
    pub fn names(&self, id: u16, name: Option<&str>) -> bool {
        match self {
            PeerRef::Id(i) => *i == id,
            PeerRef::Name(n) => Some(n.as_str()) == name || n.parse() == Ok(id),
        }
    }
}

impl std::fmt::Display for PeerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerRef::Id(i) => write!(f, "node id {i}"),
            PeerRef::Name(n) => write!(f, "node {n:?}"),
        }
    }
}

/// The reply to `status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Node id.
    pub node: u16,
    /// Node name.
    pub name: String,
    /// Cluster id.
    pub cluster: u16,
    /// This start's session epoch (peers see a restart as a new one).
    pub epoch: u32,
    /// The node's endpoints.
    pub endpoints: Vec<u8>,
    /// Seconds since the node came up.
    pub uptime_s: f64,
    /// emxd's process id.
    pub pid: u32,
    /// The port.
    pub link: LinkInfo,
    /// `inline` (emxd's main loop drives the engine) or `thread` (a polling
    /// thread does).
    pub progress: String,
    /// The polling thread's core, in thread mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core: Option<usize>,
    /// The largest message the responder takes whole, in bytes.
    pub max_message: u64,
    /// The responder's counters, summed over the endpoints.
    pub responder: ResponderCounters,
    /// The cluster file emxd was started with.
    pub config: String,
}

/// The node's port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkInfo {
    /// Device name (`net_memif0`, `0000:03:00.0`).
    pub name: String,
    /// The devargs it was opened with (the cluster file's `port`).
    pub devargs: String,
    /// Its MAC address.
    pub mac: String,
    /// MTU in force.
    pub mtu: u16,
    /// Link up now.
    pub up: bool,
    /// Speed in Mbit/s (0: unknown).
    pub speed_mbps: u32,
}

/// What the built-in responder did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponderCounters {
    /// ECHO messages sent back.
    pub echoed: u64,
    /// Bytes of them.
    pub echoed_bytes: u64,
    /// SINK messages received.
    pub sunk: u64,
    /// Bytes of them.
    pub sunk_bytes: u64,
    /// PING messages answered.
    pub pongs: u64,
    /// Messages longer than the limit, truncated to it.
    pub truncated: u64,
    /// Messages with an op the responder does not serve, discarded.
    pub discarded: u64,
    /// Answers to checks that no check waited for any more, dropped.
    pub stray: u64,
    /// Requests of the responder that failed (peer unreachable or restarted).
    pub failed: u64,
}

impl std::ops::AddAssign for ResponderCounters {
    fn add_assign(&mut self, o: ResponderCounters) {
        self.echoed += o.echoed;
        self.echoed_bytes += o.echoed_bytes;
        self.sunk += o.sunk;
        self.sunk_bytes += o.sunk_bytes;
        self.pongs += o.pongs;
        self.truncated += o.truncated;
        self.discarded += o.discarded;
        self.stray += o.stray;
        self.failed += o.failed;
    }
}

/// A peer's state as emxd reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerState {
    /// In session: its epoch is known and it answers.
    Up,
    /// Declared unreachable (silent past the liveness deadline); up again
    /// when it comes back with a new epoch.
    Down,
    /// Its MAC is `auto` in the cluster file and not learnt yet.
    Unresolved,
    /// Not heard from yet (the handshake is under way).
    Unknown,
}

impl PeerState {
    /// The name as the protocol spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerState::Up => "up",
            PeerState::Down => "down",
            PeerState::Unresolved => "unresolved",
            PeerState::Unknown => "unknown",
        }
    }
}

/// The reply to `peers`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Peers {
    /// One entry per remote endpoint per local endpoint.
    pub peers: Vec<PeerEntry>,
}

/// One remote endpoint as one local endpoint sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerEntry {
    /// The local endpoint whose view this is.
    pub local: u8,
    /// The peer's node id.
    pub node: u16,
    /// The peer's node name in the cluster file.
    pub name: Option<String>,
    /// The peer's endpoint.
    pub endpoint: u8,
    /// Its MAC address, or `auto` when not known.
    pub mac: String,
    /// Its state.
    pub state: PeerState,
    /// Its session epoch, once known.
    pub epoch: Option<u32>,
    /// Milliseconds since a frame of it was last accepted (`None`: never).
    pub silent_ms: Option<f64>,
    /// Its session's smoothed round-trip time in microseconds (`None`: no
    /// sample yet, or an emxd that does not report it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub srtt_us: Option<f64>,
    /// Its session's retransmission timeout now, backoff included, in
    /// milliseconds (`None` from an emxd that does not report it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rto_ms: Option<f64>,
    /// Frames sent to it.
    pub frames_sent: u64,
    /// Frames received from it.
    pub frames_received: u64,
    /// Bytes sent to it (headers included).
    pub bytes_sent: u64,
    /// Bytes received from it (headers included).
    pub bytes_received: u64,
    /// Frames sent to it again.
    pub retransmits: u64,
}

/// The reply to `stats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// One entry per local endpoint.
    pub endpoints: Vec<EndpointStats>,
}

/// One local endpoint's counters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndpointStats {
    /// The endpoint.
    pub endpoint: u8,
    /// The link's counters (shared by every endpoint of the node).
    pub link: LinkStats,
    /// Its responder's counters.
    pub responder: ResponderCounters,
    /// Its messages (the engine's `CoreStats`).
    #[serde(default)]
    pub messages: MessageStats,
    /// Each peer's protocol counters.
    pub peers: Vec<PeerStatsEntry>,
}

/// One local endpoint's message counters (the engine's `CoreStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageStats {
    /// Sends completed.
    pub sends_completed: u64,
    /// Receives completed.
    pub recvs_completed: u64,
    /// Messages that arrived before a receive was posted for them (an eager
    /// one waits in the unexpected store, copied, until its receive comes).
    pub unexpected: u64,
    /// The most bytes the unexpected store held at once.
    pub unexpected_high_water: u64,
    /// Rendezvous messages dropped unmatched because their senders
    /// withdrew them (cancelled sends).
    #[serde(default)]
    pub withdrawn: u64,
    /// Frames dropped before they could be told apart by peer (bad
    /// headers, other clusters, unknown senders).
    pub dropped: u64,
    /// States the protocol core's checks rule out, met and survived: 0
    /// unless emx has a bug (report it).
    #[serde(default)]
    pub internal_errors: u64,
}

/// The link's counters (the engine's `IoStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkStats {
    /// Frames received.
    pub rx_frames: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Frames received in several segments (the pool's buffers are smaller
    /// than the MTU's frames), read through a copy.
    #[serde(default)]
    pub rx_chained: u64,
    /// Frames the link took for transmission.
    pub tx_frames: u64,
    /// Bytes the link took for transmission.
    pub tx_bytes: u64,
    /// Transmit attempts that found the link full.
    pub tx_full: u64,
    /// Transmit rounds that found the mbuf pool empty (frames waited).
    #[serde(default)]
    pub tx_no_buffer: u64,
    /// Payload bytes copied into frames.
    pub payload_copied: u64,
    /// Payload bytes attached from registered memory without a copy.
    pub payload_attached: u64,
}

/// One peer's protocol counters (the engine's `PeerStats`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatsEntry {
    /// The peer's node id.
    pub node: u16,
    /// Its name in the cluster file (absent from an older emxd's reply).
    #[serde(default)]
    pub name: Option<String>,
    /// The peer's endpoint.
    pub endpoint: u8,
    /// Frames sent (retransmissions and pure acks included).
    pub frames_sent: u64,
    /// Bytes sent (headers included).
    pub bytes_sent: u64,
    /// Frames received and accepted.
    pub frames_received: u64,
    /// Bytes received in accepted frames.
    pub bytes_received: u64,
    /// Reliable frames sent again.
    pub retransmits: u64,
    /// Of those, after a timeout.
    pub timeouts: u64,
    /// Reliable frames received twice.
    pub duplicates: u64,
    /// Pure acks sent.
    pub acks_sent: u64,
    /// Pure acks received.
    pub acks_received: u64,
    /// Times a message waited for the peer's credits.
    pub credit_stalls: u64,
    /// Times the send window filled up.
    pub window_stalls: u64,
    /// Messages sent several to a frame.
    #[serde(default)]
    pub msgs_packed: u64,
    /// Keepalive probes sent.
    pub keepalives_sent: u64,
    /// Handshake frames sent.
    pub hellos_sent: u64,
    /// Frames from it dropped, all reasons.
    pub dropped: u64,
    /// Frames from it dropped, by reason (only reasons that occurred).
    pub dropped_by_reason: std::collections::BTreeMap<String, u64>,
}

/// The reply to `check`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    /// One entry per peer endpoint and size, in the order they ran.
    pub results: Vec<CheckResult>,
    /// Results that passed.
    pub passed: usize,
    /// Results that failed.
    pub failed: usize,
}

/// One message echoed off one peer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    /// The peer's node id.
    pub node: u16,
    /// The peer's node name.
    pub name: Option<String>,
    /// The peer's endpoint.
    pub endpoint: u8,
    /// Message size in bytes.
    pub size: u64,
    /// The echo came back whole and byte-exact.
    pub ok: bool,
    /// Send to echo received, in microseconds (when it came back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_us: Option<f64>,
    /// What went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A reply as it is sent: `{"ok":true, ...body}` or `{"ok":false,"error":..}`.
pub fn reply_ok<T: Serialize>(body: &T) -> String {
    let mut v = serde_json::to_value(body).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(o) = v.as_object_mut() {
        o.insert("ok".into(), true.into());
    }
    v.to_string()
}

/// A failed reply, with the body's fields beside the error when there is
/// one (a check that ran and failed).
pub fn reply_err<T: Serialize>(error: &str, body: Option<&T>) -> String {
    let mut v = body
        .and_then(|b| serde_json::to_value(b).ok())
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({}));
    if let Some(o) = v.as_object_mut() {
        o.insert("ok".into(), false.into());
        o.insert("error".into(), error.into());
    }
    v.to_string()
}

/// Why a control request got no reply.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens at the path.
    #[error("no emxd at {path}: {reason}{}", start_hint(.reason))]
    NotRunning {
        /// The socket path.
        path: String,
        /// What connecting said.
        reason: String,
    },
    /// The socket is another user's: its mode (0600) lets only its owner in.
    #[error(
        "{path}: permission denied: the socket belongs to uid {owner}, and only its owner may \
         use it: run emxctl as that user (or as root)"
    )]
    NotYours {
        /// The socket path.
        path: String,
        /// The socket file's owner.
        owner: u32,
    },
    /// What listens there is another user's process, not ours or root's: in a
    /// folder others may write (`/tmp`) anyone can bind the name first.
    #[error(
        "{path}: served by a process of uid {uid}, neither you nor root: not your emxd; \
         give emxd and emxctl a control folder only you can write (EMX_CONTROL_DIR, such as \
         $XDG_RUNTIME_DIR)"
    )]
    Foreign {
        /// The socket path.
        path: String,
        /// The listener's user.
        uid: u32,
    },
    /// The connection failed midway.
    #[error(
        "{path}: {source} (if that is not emxd's control socket, give --control the one it is)"
    )]
    Io {
        /// The socket path.
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// No reply came in time.
    #[error(
        "{path}: no reply from emxd within {} s (it is busy or hung; a check may take longer: \
         give --timeout more)", timeout.as_secs_f64()
    )]
    NoReply {
        /// The socket path.
        path: String,
        /// How long the client waited.
        timeout: Duration,
    },
    /// The reply is not a JSON object with `ok`.
    #[error(
        "{path}: the reply is not emxd's (a JSON object with `ok`): {reply}; is this emxd's \
         control socket? (give --control the one it is)"
    )]
    BadReply {
        /// The socket path.
        path: String,
        /// What came (its start, quoted).
        reply: String,
    },
}

impl ClientError {
    /// Whether asking again later may work: nothing listens yet (emxd not
    /// started, or restarting), or it did not answer in time. A socket
    /// that is another user's, a file that is no socket, or a reply that is
    /// not emxd's stays so.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::NotRunning { reason, .. } => reason != NOT_A_SOCKET,
            ClientError::NoReply { .. } | ClientError::Io { .. } => true,
            ClientError::NotYours { .. }
            | ClientError::Foreign { .. }
            | ClientError::BadReply { .. } => false,
        }
    }
}

/// What to do about [`ClientError::NotRunning`]: start emxd, unless the path
/// is no socket (then the reason says what to give).
fn start_hint(reason: &str) -> &'static str {
    if reason == NOT_A_SOCKET {
        ""
    } else {
        "; is emxd running? start it with emxd --config FILE --node NAME (or pass --control PATH)"
    }
}

/// [`ClientError::NotRunning`]'s reason for a path that is no socket.
const NOT_A_SOCKET: &str = "it is not a socket: give the socket emxd listens on";

/// Sends one request to the emxd at `path` and returns its reply, or fails
/// after `timeout` without one.
pub fn request(
    path: &Path,
    req: &Request,
    timeout: Duration,
) -> Result<serde_json::Value, ClientError> {
    let shown = path.display().to_string();
    let io = |source| ClientError::Io {
        path: shown.clone(),
        source,
    };
    // (A timeout too long for an Instant is a year: no reply takes that.)
    let now = std::time::Instant::now();
    let until = now
        .checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 86_400));
    let stream = connect_by(path, until).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            // Its queue of connections stayed full: emxd takes none.
            return ClientError::NoReply {
                path: shown.clone(),
                timeout,
            };
        }
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let meta = std::fs::metadata(path);
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            if let Ok(m) = &meta {
                return ClientError::NotYours {
                    path: shown.clone(),
                    owner: m.uid(),
                };
            }
        }
        // Connecting to a file that is no socket reads "connection refused".
        let reason = match meta {
            Ok(m) if !m.file_type().is_socket() => NOT_A_SOCKET.to_owned(),
            _ => e.to_string(),
        };
        ClientError::NotRunning {
            path: shown.clone(),
            reason,
        }
    })?;
    // emxd's own socket lets only its owner in, but the name is anyone's to
    // take first in a folder others may write: a reply from another user's
    // process would be believed (a forged check passed, say).
    // (A peer whose credentials cannot be read is not believed either.)
    let cred = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| io(std::io::Error::from(e)))?;
    let me = nix::unistd::geteuid().as_raw();
    let uid = cred.uid();
    if uid != me && uid != 0 && me != 0 {
        return Err(ClientError::Foreign { path: shown, uid });
    }
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut line = serde_json::to_string(req).expect("a request serializes");
    line.push('\n');
    // A request that emxd refuses (too long, too many connections) may meet
    // a closed socket before it is all written: the reply that says why is
    // read all the same.
    let wrote = (&stream).write_all(line.as_bytes());
    let read = read_reply(&stream, until);
    let reply = match (wrote, read) {
        (Err(e), Ok(r)) if r.is_empty() => return Err(io(e)),
        (_, Ok(r)) => r,
        (_, Err(e)) => {
            return Err(match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    ClientError::NoReply {
                        path: shown.clone(),
                        timeout,
                    }
                }
                std::io::ErrorKind::InvalidData => ClientError::BadReply {
                    path: shown.clone(),
                    reply: e.to_string(),
                },
                _ => io(e),
            })
        }
    };
    if reply.is_empty() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "emxd closed the connection without a reply",
        )));
    }
    match serde_json::from_slice::<serde_json::Value>(&reply) {
        Ok(v) if v.get("ok").is_some_and(serde_json::Value::is_boolean) => Ok(v),
        _ => Err(ClientError::BadReply {
            path: shown,
            reply: quoted(&reply),
        }),
    }
}

/// Connects to the socket at `path`, trying again while its queue of
/// connections is full (`WouldBlock` once `until` has passed): a blocking
/// connect would wait there for as long as emxd takes none, whatever the
/// timeout.
pub fn connect_by(path: &Path, until: std::time::Instant) -> std::io::Result<UnixStream> {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let addr = UnixAddr::new(path).map_err(std::io::Error::from)?;
    loop {
        let fd = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(std::io::Error::from)?;
        match connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
            Ok(()) => {
                let stream = UnixStream::from(fd);
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            Err(nix::errno::Errno::EAGAIN) if std::time::Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The longest reply taken (a `stats` of tens of thousands of peers fits).
pub const MAX_REPLY: usize = 64 << 20;

/// Reads one reply line (newline included), or what came before the
/// connection closed, by `until` at the latest: a reply that trickles in
/// ends there, not at a silence (a read timeout alone restarts with each
/// byte), and one past [`MAX_REPLY`] is refused (`InvalidData`), not
/// gathered until memory runs out.
fn read_reply(stream: &UnixStream, until: std::time::Instant) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        let n = match (&*stream).read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(reply);
        }
        if let Some(end) = chunk[..n].iter().position(|&b| b == b'\n') {
            reply.extend_from_slice(&chunk[..=end]);
            return Ok(reply);
        }
        reply.extend_from_slice(&chunk[..n]);
        if reply.len() > MAX_REPLY {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a reply of more than {} MiB without a line's end, starting {}",
                    MAX_REPLY >> 20,
                    quoted(&reply)
                ),
            ));
        }
    }
}

/// The start of a reply, for a message (a reply that is not emxd's may be
/// anything, of any length).
fn quoted(reply: &[u8]) -> String {
    const SHOWN: usize = 200;
    let text = String::from_utf8_lossy(&reply[..reply.len().min(SHOWN)]);
    let more = if reply.len() > SHOWN { "..." } else { "" };
    format!("{:?}{more}", text.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_in_json() {
        let r: Request = serde_json::from_str(r#"{"cmd":"status"}"#).unwrap();
        assert_eq!(r, Request::Status);
        let r: Request =
            serde_json::from_str(r#"{"cmd":"check","sizes":[1,2],"peer":"b"}"#).unwrap();
        assert_eq!(
            r,
            Request::Check {
                sizes: Some(vec![1, 2]),
                peer: Some(PeerRef::Name("b".into()))
            }
        );
        let r: Request = serde_json::from_str(r#"{"cmd":"check","peer":2}"#).unwrap();
        assert_eq!(
            r,
            Request::Check {
                sizes: None,
                peer: Some(PeerRef::Id(2))
            }
        );
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"nope"}"#).is_err());
        assert_eq!(
            serde_json::to_string(&Request::Shutdown).unwrap(),
            r#"{"cmd":"shutdown"}"#
        );
    }

    #[test]
    fn replies() {
        let v: serde_json::Value =
            serde_json::from_str(&reply_ok(&Peers { peers: vec![] })).unwrap();
        assert_eq!(v["ok"], true);
        assert!(v["peers"].is_array());
        let v: serde_json::Value = serde_json::from_str(&reply_err::<Peers>("boom", None)).unwrap();
        assert_eq!(
            (v["ok"].clone(), v["error"].clone()),
            (false.into(), "boom".into())
        );
    }

    #[test]
    fn peer_refs() {
        assert_eq!(PeerRef::parse("12"), PeerRef::Id(12));
        assert!(PeerRef::parse("b").names(2, Some("b")));
        assert!(!PeerRef::parse("b").names(2, Some("c")));
        assert!(PeerRef::Name("2".into()).names(2, None));
    }
}
