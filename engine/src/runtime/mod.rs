//! The runtime: the protocol core driven over a packet I/O link, by a polling
//! thread or inline by an application thread, behind the [`Engine`] and
//! [`Endpoint`] API.
//!
//! - [`buffer`]: the send and receive buffers handed to the core (registered
//!   memory for zero-copy sends, ordinary memory copied).
//! - [`driver`]: one core joined to one link, one burst at a time.
//! - [`engine`]: the engine, its endpoint, the rings between them, the
//!   polling thread.
//! - [`node`]: an engine started from one configuration value (EAL, port,
//!   engine).

pub mod buffer;
pub mod driver;
pub mod engine;
pub mod node;
mod request;

pub use buffer::{RecvBuf, SendBuf};
pub use driver::{Clock, Driver, Progress, RuntimeCore, BURST};
pub use engine::{
    parse_mac, Endpoint, Engine, EngineConfig, PeerConfig, PeerStatus, ProgressMode,
    ProtocolConfig, Refused, ShutdownReport, AUTO_MAC, DEFAULT_IDLE_SLEEP_US, IDLE_SLEEP_US,
    MAX_RING,
};
pub use node::{
    log_dpdk_to_tracing, register_memory, start_node, start_node_on, start_node_until, EalConfig,
    Hugepages, LinkConfig, Node, NodeConfig,
};
pub use request::{Buf, Completed, Message, Request};

use crate::proto::{ConfigError, PeerError, RecvError, RequestError, SendError};

/// What went wrong in the runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The submission ring is full: try again (the polling thread empties it
    /// as it goes, whether completions are taken or not).
    #[error("would block: the submission ring is full; retry once the polling thread took some")]
    WouldBlock,
    /// The engine is shutting down or stopped, or the endpoint was closed.
    #[error(
        "the engine is shut down or the endpoint closed (shutdown or close was called, or the \
         Engine of a polling thread was dropped: keep it alive while its endpoints are in use)"
    )]
    ShutDown,
    /// The handle names no outstanding request of this endpoint (never
    /// issued, its completion already taken, or another endpoint's), or a
    /// wait was given no handle at all.
    #[error("unknown request handle (never issued, or already completed and taken)")]
    UnknownRequest,
    /// As many requests are outstanding as the tables hold (max_sends +
    /// max_recvs); a finished request holds its slot until its completion is
    /// taken. (Sends and receives not finished are bounded apart, by
    /// `max_sends` and `max_recvs`: past them a call is refused with
    /// [`SendError::TooManySends`] or
    /// [`RecvError::TooManyRecvs`],
    /// in either progress mode.)
    #[error(
        "too many outstanding requests: take completions (test, wait) to free their handles, \
         or raise max_sends/max_recvs"
    )]
    TooManyRequests,
    /// A receive buffer that cannot be written now: a registered one that
    /// frames in flight or another handle ([`ExtBuf::share`](dpdk_ffi::ExtBuf::share))
    /// still refer to, or a lent message ([`RecvBuf::Lent`]).
    #[error(
        "the receive buffer cannot be written: a registered buffer still referenced by frames \
         in flight or shared with another handle (wait for them, or drop the other handle), or \
         a lent message (read it and drop it; post an owned or registered buffer)"
    )]
    BufferBusy,
    /// The engine cannot be set up as configured.
    #[error("engine setup: {0}")]
    Setup(String),
    /// The endpoint was already handed out.
    #[error("the engine's endpoint was already handed out")]
    EndpointTaken,
    /// A completion of another kind than asked for (a send taken as a receive).
    #[error("the completion is of another kind (a send taken as a receive or the reverse)")]
    WrongKind,
    /// The core refused the send.
    #[error("send refused: {0}")]
    Send(SendError),
    /// The core refused the receive.
    #[error("receive refused: {0}")]
    Recv(RecvError),
    /// The request failed (peer unreachable or restarted, or cancelled).
    #[error("request failed: {0}")]
    Request(RequestError),
    /// The protocol configuration cannot work.
    #[error("bad protocol configuration: {0}")]
    Config(ConfigError),
    /// A peer could not be added.
    #[error("cannot add peer: {0}")]
    Peer(PeerError),
    /// The link failed. (Boxed, as the pool's error below: an `IoError` is
    /// several times the size of the other variants, and every `Result` of
    /// the API, completions included, would carry its size.)
    #[error(transparent)]
    Io(Box<crate::io::IoError>),
    /// The EAL has no memory for the port's mbuf pool (too few free
    /// hugepages, or with `--no-huge` too small a `memory_mb`). Other
    /// failures to make the pool are [`Error::Io`].
    #[error(
        "cannot create the mbuf pool, {mbufs} mbufs of {room} bytes (about {mib} MiB of the \
         EAL's memory): {source}; {}",
        pool_fix(*.hugepages, *.mib)
    )]
    Pool {
        /// Mbufs asked for.
        mbufs: u32,
        /// Data room of each.
        room: u16,
        /// What they take at least, in MiB.
        mib: u64,
        /// Whether the EAL runs on hugepages (the fix differs).
        hugepages: bool,
        /// What DPDK said.
        #[source]
        source: Box<crate::io::IoError>,
    },
    /// The polling thread could not start or died. When it died, the
    /// requests it held and their buffers are lost.
    #[error("polling thread: {0}")]
    Thread(String),
    /// Asked to stop while starting (see [`start_node_until`]).
    #[error("stopped while starting, before the link came up")]
    Stopped,
}

impl From<crate::io::IoError> for Error {
    fn from(e: crate::io::IoError) -> Error {
        Error::Io(Box::new(e))
    }
}

impl From<dpdk_ffi::Error> for Error {
    fn from(e: dpdk_ffi::Error) -> Error {
        crate::io::IoError::from(e).into()
    }
}

impl Error {
    /// Whether the peer was declared unreachable: the same failure arrives as
    /// [`Error::Send`], [`Error::Recv`] or [`Error::Request`] depending on when
    /// it was found (refused in the call, or failing a request under way).
    pub fn is_peer_unreachable(&self) -> bool {
        matches!(
            self,
            Error::Send(SendError::PeerUnreachable)
                | Error::Recv(RecvError::PeerUnreachable)
                | Error::Request(RequestError::PeerUnreachable)
        )
    }

    /// Whether the request was cancelled ([`Endpoint::cancel`]): MPI's
    /// `MPI_Test_cancelled`.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Error::Request(RequestError::Cancelled))
    }
}

/// What to change when the mbuf pool does not fit: on hugepages the EAL takes
/// its memory from the free hugepages as it goes (its `memory_mb` is only
/// what `auto` and `require` look for at start), with `--no-huge` from the
/// `memory_mb` it was given.
fn pool_fix(hugepages: bool, mib: u64) -> String {
    if hugepages {
        format!(
            "the EAL runs on hugepages and too few are free (the pool alone takes about {pages} \
             of 2 MiB): reserve more (EMX_HUGEPAGES=N scripts/setup.sh, or echo N | sudo tee \
             /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages, with N above the {pages} \
             and what else runs on them), run without them with memory_mb at least {need} \
             (hugepages = \"never\" and memory_mb in a node file's [eal], a cluster file's \
             [memory], or an EalConfig), or use fewer mbufs or a smaller MTU",
            pages = mib.div_ceil(2),
            need = mib + 64
        )
    } else {
        format!(
            "give the EAL more memory: memory_mb at least {need} (memory.memory_mb in a \
             cluster file, EalConfig::memory_mb), or use fewer mbufs or a smaller MTU",
            need = mib + 64
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `Result` of the API, each completion's among them, carries the
    /// error's size, and moves it on every message: a variant that grows it
    /// is boxed. (An unboxed `IoError` made it 64 bytes, and completions
    /// 104; boxed, a one-thread 8-byte stream took 4.5% fewer instructions
    /// a message.)
    #[test]
    fn the_error_stays_small() {
        assert!(std::mem::size_of::<Error>() <= 32);
        assert!(std::mem::size_of::<Completed>() <= 80);
    }

    fn pool_error(hugepages: bool) -> String {
        Error::Pool {
            mbufs: 65535,
            room: 10368,
            mib: 655,
            hugepages,
            source: Box::new(crate::io::IoError::Setup("Cannot allocate memory".into())),
        }
        .to_string()
    }

    /// On hugepages the EAL's `memory_mb` bounds nothing: the fix is more
    /// free hugepages (or none), not more `memory_mb`.
    #[test]
    fn a_pool_that_does_not_fit_names_the_fix_for_its_memory() {
        let huge = pool_error(true);
        assert!(huge.contains("about 655 MiB") && huge.contains("Cannot allocate memory"));
        assert!(huge.contains("about 328 of 2 MiB"), "{huge}");
        assert!(huge.contains("EMX_HUGEPAGES=N scripts/setup.sh"), "{huge}");
        assert!(huge.contains("hugepages = \"never\""), "{huge}");
        // Without hugepages the pool must fit memory_mb, with room for the rest.
        assert!(huge.contains("memory_mb at least 719"), "{huge}");
        assert!(!huge.contains("give the EAL more memory"), "{huge}");
        let small = pool_error(false);
        assert!(small.contains("memory.memory_mb"), "{small}");
        assert!(small.contains("memory_mb at least 719"), "{small}");
        assert!(!small.contains("hugepages"), "{small}");
    }
}
