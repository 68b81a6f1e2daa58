//! The protocol state machines: reliability, eager and rendezvous protocols, matching.
//!
//! Everything here is sans-IO. The [`Core`] takes untrusted frames, the current time and
//! application requests in, and gives frames, wake-up times and completions out. It owns
//! no clock, no thread, no socket and no DPDK object, and it copies payload on the send
//! side only to pack small messages: data frames leave as a [`PayloadRef`] into the
//! send's buffer. It must not grow: every table is sized from [`CoreConfig`] when the
//! core is built.
//!
//! Submodules, bottom up:
//! - [`reliability`]: per-pair sequence numbers, cumulative + selective acks, RTT and
//!   retransmission timeout.
//! - [`matching`]: the MX match rule and the bounded unexpected-message store.
//! - [`peer`]: one remote endpoint's session state (epochs, credits, queues, timers).
//! - [`stats`]: per-peer and core-wide counters.
//! - [`core`]: the [`Core`] that ties them together and its driving surface; the eager
//!   and rendezvous protocols live beside it in `eager.rs` and `rendezvous.rs`.
//!
//! # Design in brief
//! - **Frames** ([`crate::wire`]): one fixed 76-byte header after Ethernet; control frames
//!   (HELLO, ACK, PULL, NOTIFY) have no body, data frames (EAGER, PULL_DATA) carry
//!   payload right after the header. Small eager messages queued together for one peer
//!   leave packed, up to `pack_max` per frame (PACK), each message a short record.
//! - **Reliability**, per ordered endpoint pair: 32-bit sequence numbers on reliable
//!   frames, selective repeat within a window of up to 256 frames (64 by default).
//!   Every header carries the cumulative ack and a 64-bit SACK bitmap (the receiver
//!   keeps 256 bits; frames past the first 64 are acked when the gap before them
//!   fills); pure ACKs go out after `ack_every` frames
//!   (a PACK counts as its messages, so that its sender gets its buffers back) or
//!   `ack_delay`, at once on a gap or duplicate. Loss is detected by three later SACKed
//!   frames (for a frame not sent again yet) or, RACK-style, by a later-sent frame being
//!   acked, and by the retransmission timeout (RFC 6298 estimate, exponential backoff).
//!   A timeout sends only the oldest waiting frame again (the peer may just be slow),
//!   unless the link lost frames lately; the probe's acknowledgement, alone, declares the
//!   frames sent before it lost.
//! - **Credits**: the unexpected store is split evenly among peers; a sender charges each
//!   message against its share before sending it, and the receiver returns the charge when
//!   the message binds to a receive. So the store can never overflow, and nothing that
//!   was sent is ever dropped for lack of room. A sender out of credit with nothing in
//!   flight probes for it (the update may have been lost) after a retransmission
//!   timeout, then twice as long each time up to `keepalive`, as TCP's persist timer.
//! - **Sessions**: HELLO handshake learns the peer's epoch; frames name both epochs; a
//!   higher epoch means a restart and fails the old session's requests; silence past
//!   `peer_timeout` while something waits on the peer declares it unreachable (our epoch
//!   for it moves on, so whatever follows is a new session on both sides); keepalive
//!   probes (ACKs asking for an ACK) keep a quiet but living peer alive.
//! - **Timers**: each peer's earliest deadline (delayed ack, retransmission, probe,
//!   death) sits in a tournament tree; an entry point marks the peers whose timer state
//!   it changed, and the next [`Core::poll_timeout`] recomputes only those, so a poll
//!   costs O(1) with nothing changed, however many peers there are.
//! - **Eager** up to `eager_threshold`, **rendezvous** above it: RTS, then
//!   receiver-paced pulls of `pull_block` bytes (rounded down to whole frames of
//!   the sender's),
//!   `pull_inflight` at a time, answered by zero-copy data frames, then NOTIFY. A
//!   rendezvous send nothing of which was pulled can be cancelled (WITHDRAW, answered
//!   by a NOTIFY that says whether the receiver dropped the message).
//!   The receiver copies each data frame into its buffer; while large receives of
//!   `stream_min` bytes or more are posted, with [`RecvBuffer::write_streaming`]
//!   (streaming stores in the runtime), fenced once per burst
//!   ([`Core::fence_streaming`]) and always before a buffer leaves.

pub mod core;
mod eager;
mod frags;
pub mod matching;
pub mod peer;
pub mod reliability;
mod rendezvous;
mod slab;
pub mod stats;

pub use self::core::{
    Completion, Core, Lend, PayloadRef, ProbeInfo, RecvDone, RecvInfo, SendDone, Transmit,
};
pub use self::stats::{CoreStats, PeerInfo, PeerStats};
pub use crate::wire::{DropReason, MacAddr};

/// What the core needs of a receive buffer: room to copy a message into, and
/// optionally the wish to borrow the frame instead.
///
/// An ordinary buffer (`Vec<u8>`, a registered region) is written in place
/// and its length bounds what is received. A *lending* buffer
/// ([`lends`](RecvBuffer::lends) true) holds no room of its own: it takes
/// messages up to the eager threshold, and a one-frame eager message that
/// arrives for it after it was posted is not copied at all. The core reports
/// such a frame from [`Core::handle_frame_lending`], and the caller keeps the
/// frame and hands it to the application with the completion. Any other
/// message (it arrived before the receive, spans frames, or the caller could
/// not keep the frame) is copied after [`fit`](RecvBuffer::fit) made room for
/// it; a rendezvous message is truncated to the eager threshold.
pub trait RecvBuffer: AsMut<[u8]> {
    /// Whether this buffer would rather borrow the frame than have the
    /// message copied into it.
    fn lends(&self) -> bool {
        false
    }
    /// Called on a lending buffer before a message of `len` bytes (at most
    /// the eager threshold) is copied into it: after it, `as_mut()` must be
    /// exactly `len` bytes long.
    fn fit(&mut self, len: usize) {
        let _ = len;
    }
    /// Copies `data` to `offset..offset + data.len()` of the buffer, for
    /// rendezvous data while [`CoreConfig::stream_min`] bytes of large receives
    /// are posted. An implementation may write with streaming (non-temporal)
    /// stores, which bypass the caches; the default copies as usual.
    ///
    /// Only the core calls it, for only the core has a [`CoreOnly`], and it
    /// calls [`streaming_fence`](RecvBuffer::streaming_fence), on the thread
    /// that ran it, before any receive buffer leaves it.
    fn write_streaming(&mut self, offset: usize, data: &[u8], _: &CoreOnly) {
        self.as_mut()[offset..offset + data.len()].copy_from_slice(data);
    }
    /// Orders what [`write_streaming`](RecvBuffer::write_streaming) wrote
    /// before later stores (a store fence for streaming stores), so that a
    /// thread that synchronises with this one afterwards sees it.
    fn streaming_fence(_: &CoreOnly) {}
}

/// A token only the protocol core has: it keeps the [`RecvBuffer`] calls whose
/// safety rests on the core's rules ([`write_streaming`](RecvBuffer::write_streaming))
/// to the core. It cannot be made, cloned or kept outside the crate: an
/// implementation sees it only borrowed, for the length of a call.
#[derive(Debug)]
pub struct CoreOnly(());

impl CoreOnly {
    pub(crate) const TOKEN: CoreOnly = CoreOnly(());
}

impl RecvBuffer for Vec<u8> {}
impl RecvBuffer for Box<[u8]> {}

use ::core::fmt;
use ::core::ops::{Add, Sub};
use ::core::time::Duration;

/// A point in time, in nanoseconds since an origin the runtime chooses (monotonic).
///
/// The core never reads a clock: every entry point that needs the time takes one.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(pub u64);

impl Time {
    /// The origin.
    pub const ZERO: Time = Time(0);
    /// Later than any real time; used for "no deadline".
    pub const NEVER: Time = Time(u64::MAX);
    /// From nanoseconds.
    pub const fn from_nanos(ns: u64) -> Time {
        Time(ns)
    }
    /// From microseconds.
    pub const fn from_micros(us: u64) -> Time {
        Time(us * 1_000)
    }
    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// Time elapsed since `earlier`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// The time, for an entry point that needs it only sometimes: a [`Time`]
/// already read, or a source that reads its clock when first asked (a
/// runtime's), so that a call which needs no time reads no clock. A send to a
/// peer that is already monitored, or a receive posted while one is, needs
/// none; reading the time-stamp counter costs 10-20 ns, as much as the rest
/// of the core's work on such a request.
///
/// A source gives one value however often it is asked within one entry
/// point, and values no earlier than the times the core was given before.
pub trait Now {
    /// The time.
    fn now(&mut self) -> Time;
}

impl Now for Time {
    #[inline]
    fn now(&mut self) -> Time {
        *self
    }
}

impl<N: Now + ?Sized> Now for &mut N {
    #[inline]
    fn now(&mut self) -> Time {
        (**self).now()
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Time::NEVER {
            write!(f, "never")
        } else {
            write!(f, "{}.{:03}us", self.0 / 1000, self.0 % 1000)
        }
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    #[inline]
    fn add(self, d: Duration) -> Time {
        Time(
            self.0
                .saturating_add(d.as_nanos().min(u64::MAX as u128) as u64),
        )
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    #[inline]
    fn sub(self, rhs: Time) -> Duration {
        self.saturating_since(rhs)
    }
}

/// An endpoint's address in the cluster: node number and endpoint on that node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    /// Node number.
    pub node: u16,
    /// Endpoint on the node.
    pub endpoint: u8,
}

impl Addr {
    /// Builds an address.
    pub const fn new(node: u16, endpoint: u8) -> Addr {
        Addr { node, endpoint }
    }
    #[inline]
    pub(crate) fn key(self) -> u32 {
        (self.node as u32) << 8 | self.endpoint as u32
    }
}

/// Index of a peer in a core's peer table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u16);

/// Handle of a send or receive request. Plain data; stale handles are detected by a
/// generation number, so using one after its completion is harmless.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl RequestId {
    const RECV_BIT: u64 = 1 << 63;
    /// The bits of a slot's generation that a handle carries: slots count
    /// their generations modulo this (see [`next_gen`](Self::next_gen)), so
    /// that a handle matches its slot for the slot's whole life, not only for
    /// its first 2^31 uses.
    pub(crate) const GEN_MASK: u32 = 0x7fff_ffff;
    /// The generation that follows `gen` in a slot.
    #[inline]
    pub(crate) fn next_gen(gen: u32) -> u32 {
        gen.wrapping_add(1) & Self::GEN_MASK
    }
    #[inline]
    pub(crate) fn send(idx: u32, gen: u32) -> Self {
        RequestId((u64::from(gen & Self::GEN_MASK) << 32) | idx as u64)
    }
    #[inline]
    pub(crate) fn recv(idx: u32, gen: u32) -> Self {
        RequestId(Self::RECV_BIT | (u64::from(gen & Self::GEN_MASK) << 32) | idx as u64)
    }
    /// Whether this is a receive request.
    #[inline]
    pub fn is_recv(self) -> bool {
        self.0 & Self::RECV_BIT != 0
    }
    #[inline]
    pub(crate) fn index(self) -> usize {
        (self.0 & 0xffff_ffff) as usize
    }
    #[inline]
    pub(crate) fn gen(self) -> u32 {
        ((self.0 >> 32) as u32) & Self::GEN_MASK
    }
}

/// Handle of a message taken by a matched probe ([`Core::mprobe`]): no
/// receive matches it any more, and [`Core::post_mrecv`] of the same core
/// receives it. Plain data: a handle used once is refused as
/// [`RecvError::UnknownMessage`]. Like a [`RequestId`], it names nothing in
/// another core (whose claims may be numbered alike): the runtime's
/// `Message` also names its endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MessageId {
    /// The message's envelope.
    pub(crate) msg: u32,
    /// The claim's number, in the envelope while it is claimed (never 0).
    pub(crate) claim: u32,
}

/// Which bytes the checksum field covers on the frames a core sends, and the least it
/// accepts on the frames it receives.
///
/// In a configuration file (with the `runtime` feature): `"off"`, `"header"`
/// or `"full"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[cfg_attr(
    feature = "runtime",
    derive(serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum ChecksumMode {
    /// No checksum: rely on the Ethernet FCS (what Open-MX does).
    Off,
    /// The emx header only: garbage and corrupted headers are always caught, the
    /// payload is left to the Ethernet FCS, so zero-copy sends never touch it.
    Header,
    /// Header and payload: the core reads every payload byte on both sides. For links
    /// that may corrupt data past the FCS (and for the simulator's corruption tests).
    Full,
}

/// Configuration of a [`Core`]. Every table is sized from it once, at construction.
///
/// The protocol assumes that every core of a cluster runs the same configuration
/// (EtherType, cluster id, MTU, eager threshold, window, unexpected bytes, max peers).
#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// EtherType of emx frames.
    pub ethertype: u16,
    /// Cluster id: frames of other clusters on the same wire are dropped.
    pub cluster: u16,
    /// Link MTU (Ethernet payload bytes): frame payload is `mtu - 76`.
    pub mtu: usize,
    /// Most peers the table holds.
    pub max_peers: usize,
    /// Most outstanding sends.
    pub max_sends: usize,
    /// Most outstanding receives (posted or in progress).
    pub max_recvs: usize,
    /// Send window in frames per peer, 1..=[`MAX_WINDOW`](reliability::MAX_WINDOW)
    /// (256). An ack reports the first 64 frames beyond a gap selectively; the
    /// receiver keeps the ones behind them, but they are acknowledged only when the
    /// gap fills, so a second loss among them is found a round trip later than one
    /// within the first 64. The default, 64, is above what a memif
    /// pair or a veth needs (a larger window measured no faster on either); a link
    /// whose bandwidth times round trip exceeds 64 frames (at MTU 1500, 92 KiB: 100
    /// Gbit/s at a 7 us round trip) wants more.
    pub window: u32,
    /// Messages up to this many bytes go eager; longer ones use rendezvous.
    pub eager_threshold: u64,
    /// Bytes of the unexpected-message store, split evenly among peers as credits
    /// ([`peer_credit`](Self::peer_credit)). A peer's credit bounds the eager bytes it
    /// has in flight to this receiver, matched or not, until an ack gives them back, so
    /// it must cover the link's bandwidth times the time credit takes to come back. That
    /// time includes the receiver's work on a whole receive burst before its ack leaves
    /// (32 frames of 9 KiB at MTU 9000, 288 KiB). The default, 64 MiB, gives each of 64
    /// peers 1 MiB: 32 eager messages of the largest size. The store's memory, and
    /// that of the envelope table sized with it (an envelope per 256 bytes, with its
    /// links and id map: about 30 MiB reserved at the default), is touched only as
    /// unexpected messages fill them: a core that never holds more than a few at once
    /// keeps about 0.5 MiB of it resident (the id map's control bytes).
    pub unexpected_bytes: u64,
    /// Most bytes one rendezvous pull asks for. The receiver rounds it down to a whole
    /// number of the sender's frame payloads (its fragment unit, which its RTS names;
    /// [`effective_pull_block`](Self::effective_pull_block) for a sender of this MTU),
    /// so that a block does not end in a short frame; a bound below one frame payload is
    /// raised to one (the sender's fragments are whole frames).
    ///
    /// The default, 256 KiB, keeps a lone message's pulls (`pull_inflight` of them)
    /// ahead of the send window at an MTU of 9000 as well as 1500: 29 jumbo frames a
    /// block, 116 asked for at once (the window caps what is in flight). At 64 KiB
    /// (7 jumbo frames a block, 28 asked for) a lone
    /// message of 1 to 8 MiB crossed a memif pair at about half the rate a stream of
    /// them reached; at MTU 1500 (46 frames a block already) the block size made no
    /// difference.
    pub pull_block: u32,
    /// Pulls one rendezvous receive keeps in flight (1..=8).
    pub pull_inflight: u8,
    /// Longest an acknowledgement waits to be coalesced or piggybacked.
    pub ack_delay: Duration,
    /// Acknowledge at once after this many unacknowledged in-order frames (a PACK
    /// counts as the messages it carries).
    pub ack_every: u32,
    /// Retransmission timeout before the first RTT sample, taken within
    /// `rto_min..=rto_max` ([`initial_rto`](Self::initial_rto)).
    pub rto_initial: Duration,
    /// Lower bound of the retransmission timeout. The default, 1 ms, covers a
    /// receiver that works through a full window of jumbo frames before its
    /// acknowledgement leaves (64 frames of 9 KiB at 2-5 us each on a memif pair
    /// in a VM): at 200 us, round trips of 4 MiB messages there timed out about
    /// once each, every frame sent again arriving twice. The estimator cannot learn
    /// those waits, since Karn's rule drops the samples of the frames that timed
    /// out. A lost frame that nothing after it reveals (the last of a message)
    /// waits this long to go again.
    pub rto_min: Duration,
    /// Upper bound of the retransmission timeout (after backoff). The timeout
    /// also backs off to no more than a quarter of `peer_timeout` (but never
    /// below `rto_min`): a frame lost while the link was cut then goes again
    /// soon enough after the cut, before a peer that answers probes meanwhile
    /// is given up for making no progress.
    pub rto_max: Duration,
    /// Probe a peer that we wait on after this much silence.
    pub keepalive: Duration,
    /// Declare a peer we wait on unreachable after this much silence.
    pub peer_timeout: Duration,
    /// Checksum coverage.
    pub checksum: ChecksumMode,
    /// Most messages one PACK frame carries (see [`wire`](crate::wire)): eager messages
    /// of at most [`pack_below`](Self::pack_below) bytes queued together for one peer
    /// leave in one frame. 1 turns packing off. A message queued alone always leaves
    /// in a frame of its own at once: packing never waits for company.
    pub pack_max: u16,
    /// Messages up to this many bytes may be packed (copied into the frame); longer
    /// ones are sent by reference from their buffer.
    pub pack_below: u32,
    /// Rendezvous data is written into receive buffers with
    /// [`RecvBuffer::write_streaming`] (streaming stores in the runtime) while the
    /// buffers of the receives posted that can take a rendezvous message (longer than
    /// `eager_threshold`) add up to at least this many bytes. Buffers that many do not
    /// stay in the caches between uses, and an ordinary copy would first read every
    /// line of them from memory; a few buffers, reused, stay cached and are better
    /// written as usual (a ping-pong, whose echo reads the data at once). 0 turns it
    /// off.
    pub stream_min: u64,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            ethertype: crate::wire::DEFAULT_ETHERTYPE,
            cluster: 1,
            mtu: 1500,
            max_peers: 64,
            max_sends: 1024,
            max_recvs: 1024,
            window: 64,
            eager_threshold: 32 * 1024,
            unexpected_bytes: 64 << 20,
            pull_block: 256 * 1024,
            pull_inflight: 4,
            ack_delay: Duration::from_micros(20),
            ack_every: 16,
            rto_initial: Duration::from_millis(1),
            rto_min: Duration::from_millis(1),
            rto_max: Duration::from_millis(100),
            keepalive: Duration::from_millis(10),
            peer_timeout: Duration::from_secs(1),
            checksum: ChecksumMode::Header,
            pack_max: 16,
            pack_below: 256,
            stream_min: 8 << 20,
        }
    }
}

impl CoreConfig {
    /// Payload bytes one frame carries.
    #[inline]
    pub fn frame_payload(&self) -> usize {
        self.mtu.saturating_sub(crate::wire::EMX_HEADER_LEN)
    }

    /// Bytes one rendezvous pull asks of a sender with this MTU: `pull_block` rounded
    /// down to a whole number of frame payloads, and at least one (256 KiB at MTU 1500
    /// gives 184 frames of 1424 bytes, 262016 bytes, where 256 KiB would end every block
    /// in a 128-byte frame). Only the last block of a message may be shorter. (A receiver
    /// rounds to the fragment unit its sender names in the RTS, which is the sender's
    /// frame payload.)
    #[inline]
    pub fn effective_pull_block(&self) -> u32 {
        let frame = self.frame_payload().min(u32::MAX as usize) as u32;
        rendezvous::whole_units(self.pull_block, frame)
    }

    /// The retransmission timeout a peer starts with: `rto_initial` within
    /// `rto_min..=rto_max`. (Below `rto_min`, and at 0 above all, a peer that
    /// does not answer was probed on every poll, and a lone frame was sent
    /// again before its delayed acknowledgement could come back.)
    #[inline]
    pub fn initial_rto(&self) -> Duration {
        self.rto_initial.max(self.rto_min).min(self.rto_max)
    }

    /// Credit bytes each peer may have charged against the unexpected store.
    pub fn peer_credit(&self) -> u64 {
        self.unexpected_bytes / self.max_peers.max(1) as u64
    }

    /// Checks the configuration for contradictions.
    pub fn validate(&self) -> Result<(), ConfigError> {
        use ConfigError as E;
        if self.mtu < crate::wire::EMX_HEADER_LEN + 64 || self.mtu > 65535 {
            return Err(E::Mtu(self.mtu));
        }
        if self.window == 0 || self.window > reliability::MAX_WINDOW {
            return Err(E::Window(self.window));
        }
        if self.max_peers == 0 || self.max_peers > u16::MAX as usize {
            return Err(E::Table("max_peers"));
        }
        if self.max_sends == 0 || self.max_sends > (1 << 24) {
            return Err(E::Table("max_sends"));
        }
        if self.max_recvs == 0 || self.max_recvs > (1 << 24) {
            return Err(E::Table("max_recvs"));
        }
        if self.unexpected_bytes == 0 || self.unexpected_bytes > MAX_UNEXPECTED_BYTES {
            return Err(E::Store(self.unexpected_bytes));
        }
        if self.pull_inflight == 0
            || self.pull_inflight > 8
            || self.pull_block == 0
            || self.pull_block > MAX_PULL_BLOCK
        {
            return Err(E::Pull);
        }
        if self.pack_max == 0 {
            return Err(E::Table("pack_max"));
        }
        let need = matching::checked_eager_charge(self.eager_threshold).unwrap_or(u64::MAX);
        if self.peer_credit() > MAX_PEER_CREDIT || self.peer_credit() < need {
            return Err(E::Credits {
                credit: self.peer_credit(),
                need,
            });
        }
        // A delayed ack must come back before the sender's timer fires, and a peer must
        // get probed before it is declared dead.
        // The clock counts nanoseconds in a u64: longer timers wrapped.
        let timers = [
            ("rto_initial", self.rto_initial),
            ("rto_min", self.rto_min),
            ("rto_max", self.rto_max),
            ("ack_delay", self.ack_delay),
            ("keepalive", self.keepalive),
            ("peer_timeout", self.peer_timeout),
        ];
        let too_long = timers.iter().find(|(_, d)| *d > MAX_TIMER);
        let broken = if let Some(&(name, _)) = too_long {
            Some(TimerRule::TooLong(name))
        } else if self.rto_min > self.rto_max || self.rto_min.is_zero() {
            Some(TimerRule::Rto)
        } else if self.ack_every == 0 {
            Some(TimerRule::AckEvery)
        } else if self.ack_delay >= self.rto_min {
            Some(TimerRule::AckDelay)
        } else if self.keepalive.is_zero() || self.keepalive >= self.peer_timeout {
            Some(TimerRule::Keepalive)
        } else {
            None
        };
        match broken {
            Some(rule) => Err(E::Timers(rule)),
            None => Ok(()),
        }
    }
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// MTU too small for a header and some payload, or too large for the length field.
    #[error("mtu {0} out of range")]
    Mtu(usize),
    /// Window outside 1..=256.
    #[error("window {0} out of range 1..=256 frames in flight per peer")]
    Window(u32),
    /// A table size out of range.
    #[error("{0} out of range")]
    Table(&'static str),
    /// Pull parameters out of range.
    #[error("pull_block must be in 1..=64 MiB and pull_inflight in 1..=8")]
    Pull,
    /// The unexpected store's size is out of range.
    #[error(
        "unexpected_bytes {0} out of range 1..=4 GiB (the store and its message table are \
         allocated when the engine starts)"
    )]
    Store(u64),
    /// The per-peer share of the unexpected store cannot hold one eager message.
    #[error("per-peer credit {credit} bytes cannot hold one eager message ({need} bytes)")]
    Credits {
        /// Credit per peer.
        credit: u64,
        /// Credit one eager message of threshold size needs.
        need: u64,
    },
    /// Timer bounds contradict each other: the rule they break.
    #[error("timer settings contradict each other: {0}")]
    Timers(TimerRule),
}

/// The largest unexpected store taken: it is allocated, with a table of a
/// message entry per 256 bytes of it, when the engine starts.
pub const MAX_UNEXPECTED_BYTES: u64 = 4 << 30;

/// The largest pull block taken (a block's length and count are 32 bits).
pub const MAX_PULL_BLOCK: u32 = 64 << 20;

/// The most credit a core grants one peer ([`CoreConfig::peer_credit`]):
/// credit limits travel as 32-bit serial numbers, and a frame whose limit
/// lies further ahead of what its receiver used is refused as a lie.
pub const MAX_PEER_CREDIT: u64 = 1 << 30;

/// The timer rule a [`ConfigError::Timers`] configuration breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TimerRule {
    /// `rto_min` is zero or above `rto_max`.
    #[error("rto_min must be above 0 and at most rto_max")]
    Rto,
    /// `ack_every` is zero.
    #[error("ack_every must be at least 1")]
    AckEvery,
    /// `ack_delay` is not below `rto_min`: a delayed ack would come after the
    /// sender's timer fired.
    #[error("ack_delay must be below rto_min")]
    AckDelay,
    /// `keepalive` is zero or not below `peer_timeout`.
    #[error("keepalive must be above 0 and below peer_timeout")]
    Keepalive,
    /// The named timer is longer than [`MAX_TIMER`].
    #[error("{0} must be at most an hour")]
    TooLong(&'static str),
}

/// The longest any protocol timer may be: an hour. (Far longer ones wrapped
/// in the core's nanosecond arithmetic, and a retransmission timeout of more
/// than an hour is no timeout.)
pub const MAX_TIMER: Duration = Duration::from_secs(3600);

/// Why a peer could not be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// The table holds `max_peers` already.
    #[error("peer table full")]
    TableFull,
    /// The address is in the table already.
    #[error("peer already known")]
    Duplicate,
    /// The address is the core's own.
    #[error("cannot add self as a peer")]
    SelfAddress,
}

/// Why a send was refused at once (its buffer comes back in [`Rejected`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// No such peer in the table.
    #[error("unknown peer")]
    UnknownPeer,
    /// `max_sends` sends are outstanding.
    #[error("too many outstanding sends")]
    TooManySends,
    /// Longer than the wire format allows.
    #[error("message too long")]
    TooLong,
    /// The peer was declared unreachable and has not come back (a new session).
    #[error("peer unreachable")]
    PeerUnreachable,
    /// This core was closed ([`Core::close`]).
    #[error("the endpoint is closed")]
    Closed,
}

/// Why a receive was refused at once (its buffer comes back in [`Rejected`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// The source is not in the peer table.
    #[error("unknown peer")]
    UnknownPeer,
    /// `max_recvs` receives are outstanding.
    #[error("too many outstanding receives")]
    TooManyRecvs,
    /// The source was declared unreachable.
    #[error("peer unreachable")]
    PeerUnreachable,
    /// This core was closed ([`Core::close`]).
    #[error("the endpoint is closed")]
    Closed,
    /// The handle of a matched probe ([`MessageId`]) names no message
    /// waiting to be received here: it was received already, or (refused by
    /// the runtime's endpoints; a core cannot tell) is another endpoint's.
    #[error("unknown message handle (already received, or another endpoint's)")]
    UnknownMessage,
}

/// A refused request: the error and the caller's buffer, handed back.
pub struct Rejected<E, B> {
    /// Why.
    pub error: E,
    /// The buffer the request carried.
    pub buf: B,
}

impl<E: fmt::Debug, B> fmt::Debug for Rejected<E, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The buffer may be large: leave it out.
        f.debug_struct("Rejected")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<E: fmt::Display, B> fmt::Display for Rejected<E, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<E: std::error::Error + 'static, B> std::error::Error for Rejected<E, B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// How an accepted request ended other than by success (a lifecycle outcome, not a
/// frame-level protocol violation: those are [`DropReason`]s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Cancelled ([`Core::cancel`]): a receive before it matched, or a
    /// rendezvous send that its receiver dropped unmatched when withdrawn.
    #[error("cancelled")]
    Cancelled,
    /// The peer stayed silent past the deadline.
    #[error("peer unreachable")]
    PeerUnreachable,
    /// The peer restarted (came back with a new epoch); its old session is gone.
    #[error("peer restarted")]
    PeerRestarted,
    /// The engine shut down before the request finished ([`Core::abort_all`]). A send
    /// that ends so may still have reached its receiver, in part or whole.
    #[error("aborted: the engine shut down before the request finished")]
    Aborted,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_past_an_hour_and_unchargeable_thresholds_are_refused() {
        let mut c = CoreConfig::default();
        assert_eq!(c.validate(), Ok(()));
        c.rto_max = MAX_TIMER;
        assert_eq!(c.validate(), Ok(()));
        // In nanoseconds this wraps to 384: below rto_min, and `clamp` with
        // min above max panics.
        c.rto_max = Duration::from_micros(18_446_744_073_709_552);
        assert_eq!(
            c.validate(),
            Err(ConfigError::Timers(TimerRule::TooLong("rto_max")))
        );
        let c = CoreConfig {
            eager_threshold: u64::MAX,
            ..CoreConfig::default()
        };
        assert!(
            matches!(
                c.validate(),
                Err(ConfigError::Credits { need: u64::MAX, .. })
            ),
            "{:?}",
            c.validate()
        );
    }
}
