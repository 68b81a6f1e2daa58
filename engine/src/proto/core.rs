//! The protocol core of one endpoint: its peers, requests, frame records and queues, and
//! the driving surface the runtime calls.
//!
//! # Driving a core
//! The runtime owns the clock and the port. In its polling loop it:
//! 1. calls [`Core::handle_frame`] for every received frame,
//! 2. calls [`Core::handle_timeout`] once the time from [`Core::poll_timeout`] has come,
//! 3. drains [`Core::poll_transmit`] into the port (attaching each [`PayloadRef`] from
//!    [`Core::send_buffer`] as an external buffer, or copying it when small),
//! 4. drains [`Core::poll_completion`] into the application's completion queue,
//! 5. asks [`Core::poll_timeout`] again before it sleeps or spins.
//!
//! Application requests ([`Core::send`], [`Core::post_recv`], [`Core::cancel`],
//! [`Core::probe`]) may come at any point; after them, steps 3 and 5 are due again.
//! At shutdown, [`Core::abort_all`] hands every outstanding request back (step 4).
//!
//! # Sessions
//! A peer's session is identified by both sides' epochs. Every frame carries the sender's
//! epoch and the epoch it believes the receiver has. Reliable frames are only sent once
//! the peer's epoch is known (learnt from any frame; a HELLO asks for it), and they are
//! only accepted when they name this core's current epoch. A frame with a higher source
//! epoch than the one known means the peer restarted: every request of the old session
//! fails with [`RequestError::PeerRestarted`] and both halves of the stream start over.
//! Epochs must therefore grow across restarts of an endpoint, past every epoch it had,
//! those it moved to toward peers it gave up included (one more per give-up, below): the
//! start time in milliseconds does, as the runtime's default; a boot counter must be
//! spread out, `boot << 16` say (a plain counter would give a restart the epoch a peer
//! already knows from a give-up, and the restart would go unnoticed). They are compared
//! as serial numbers, so they may wrap, and after a
//! silence past the liveness deadline any new epoch counts as a restart. A peer silent for `peer_timeout` while something waits on it is declared
//! unreachable: its requests fail with [`RequestError::PeerUnreachable`] and its session
//! is over. Our epoch for that peer moves on at once, so whatever follows is a new
//! session on both sides: it comes back when it restarts (a new epoch), when it speaks
//! to us again in its old session (we answer with a HELLO: it fails what it still had in
//! flight to us, as for a restart, and starts over), or when we greet it again with
//! [`Core::reconnect`] (a healed partition where both sides gave up).
//!
//! # Credits
//! Each peer may have `unexpected_bytes / max_peers` bytes of charge against this core's
//! unexpected store. A sender charges an eager message [`eager_charge`] and a rendezvous
//! announcement [`rts_charge`] before it sends the first frame; the receiver releases the
//! charge when the message binds to a receive (at once when one was posted). The
//! receiver advertises the cumulative limit in every header. So a message that finds no
//! receive always has room in the store, unexpected bytes never exceed the store, and a
//! sender that ran out waits (counted as a credit stall) instead of being dropped.

use super::frags::Frags;
use super::matching::{eager_charge, matches, rts_charge, Store, MSG_OVERHEAD};
use super::peer::Peer;
use super::slab::{id_map, FreeList, IdMap, Links, List, MinTree, ZeroedLinks, NIL};
use super::stats::{CoreStats, PeerInfo, PeerStats};
use super::{
    Addr, ChecksumMode, ConfigError, CoreConfig, MessageId, Now, PeerError, PeerId, RecvError,
    Rejected, RequestError, RequestId, SendError, Time,
};
use super::{CoreOnly, RecvBuffer};
use crate::wire::{
    flags, write_pack_record, DropReason, Frame, FrameType, Header, MacAddr, FRAME_HEADER_LEN,
    MAX_MSG_LEN, PACK_RECORD_LEN,
};
use std::cell::Cell;
use std::collections::VecDeque;

pub(crate) const NO_PEER: u16 = u16::MAX;

/// A frame written by [`Core::poll_transmit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// The peer the frame goes to (its MAC is in the Ethernet header already).
    pub peer: PeerId,
    /// Bytes of `buf` written: Ethernet and emx headers and, in a PACK, the packed
    /// messages' records after them, or a payload copied in place (see
    /// [`Core::set_copy_below`]).
    pub header_len: usize,
    /// Payload to send right after the header, by reference into a send's buffer.
    pub payload: Option<PayloadRef>,
    /// Payload bytes of a send's buffer copied into `buf` behind the headers
    /// (included in `header_len`; 0 when the payload is by reference).
    pub copied: usize,
}

impl Transmit {
    /// Length of the whole frame on the wire.
    pub fn frame_len(&self) -> usize {
        self.header_len + self.payload.map_or(0, |p| p.len as usize)
    }
}

/// Payload of a data frame: `len` bytes at `offset` of the buffer of send `req`. The
/// buffer stays valid (owned by the core) until the send completes, and a send only
/// completes once every frame that referenced it was acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadRef {
    /// The send whose buffer holds the bytes.
    pub req: RequestId,
    /// Offset in the buffer.
    pub offset: u64,
    /// Length.
    pub len: u32,
}

/// What [`Core::probe`] found: an unexpected message's envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeInfo {
    /// Sender.
    pub src: Addr,
    /// Match bits.
    pub match_bits: u64,
    /// Message length.
    pub len: u64,
}

/// A completed receive's details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvInfo {
    /// Sender.
    pub src: Addr,
    /// The message's match bits.
    pub match_bits: u64,
    /// The message's real length.
    pub msg_len: u64,
    /// Bytes written into the buffer: `min(msg_len, buffer length)`.
    pub copied: u64,
    /// The message was longer than the buffer; only `copied` bytes were kept.
    pub truncated: bool,
}

/// A finished send.
#[derive(Debug)]
pub struct SendDone<S> {
    /// The request.
    pub req: RequestId,
    /// The caller's context value.
    pub ctx: u64,
    /// The buffer, handed back.
    pub buf: S,
    /// Success once the receiver has taken what it wanted of the message
    /// (all of it, unless its receive was shorter: a rendezvous message is
    /// pulled only as far as the receive holds) and acknowledged every frame.
    pub result: Result<(), RequestError>,
}

/// A finished receive.
#[derive(Debug)]
pub struct RecvDone<R> {
    /// The request.
    pub req: RequestId,
    /// The caller's context value.
    pub ctx: u64,
    /// The buffer, handed back.
    pub buf: R,
    /// What arrived, or why nothing did.
    pub result: Result<RecvInfo, RequestError>,
}

/// A finished request: its buffer comes back with it.
#[derive(Debug)]
pub enum Completion<S, R> {
    /// A send finished.
    Send(SendDone<S>),
    /// A receive finished.
    Recv(RecvDone<R>),
}

pub(crate) struct SendSlot<S> {
    pub(crate) gen: u32,
    pub(crate) buf: Option<S>,
    pub(crate) ctx: u64,
    pub(crate) peer: u16,
    pub(crate) msg_id: u32,
    pub(crate) len: u64,
    pub(crate) match_bits: u64,
    pub(crate) rndv: bool,
    pub(crate) started: bool,
    /// All frames of the first pass (eager fragments, or the RTS) were sent.
    pub(crate) first_pass_done: bool,
    /// Eager bytes sent in the first pass.
    pub(crate) emitted: u64,
    /// Frames in flight that reference this send.
    pub(crate) inflight: u32,
    /// Rendezvous: the receiver said it has all it wants.
    pub(crate) notified: bool,
    pub(crate) pull_limit: u64,
    pub(crate) sent_upto: u64,
    pub(crate) in_pulls: bool,
    /// Rendezvous: where a cancel (a WITHDRAW) stands.
    pub(crate) withdraw: Withdraw,
}

/// Where the cancel of a rendezvous send stands (see [`Core::cancel`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Withdraw {
    /// Not asked.
    No,
    /// Asked; its WITHDRAW leaves once the RTS is acknowledged (a WITHDRAW
    /// that overtook its RTS would find nothing to withdraw), and a frame is
    /// free for it (meanwhile it waits in `Core::starved_withdraws`).
    Wanted,
    /// Its WITHDRAW is queued or left: the receiver's NOTIFY says what came
    /// of it.
    Sent,
    /// The receiver dropped the message: the send ends cancelled.
    Done,
}

impl<S> SendSlot<S> {
    /// A rendezvous send whose RTS was acknowledged and nothing of which was
    /// pulled yet.
    #[inline]
    pub(crate) fn rts_acknowledged(&self) -> bool {
        self.rndv && self.first_pass_done && self.inflight == 0 && self.pull_limit == 0
    }

    /// The credit this send costs its receiver's unexpected store.
    #[inline]
    pub(crate) fn charge(&self) -> u32 {
        if self.rndv {
            rts_charge() as u32
        } else {
            eager_charge(self.len) as u32
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecvState {
    Free,
    Posted,
    Active,
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Block {
    pub(crate) off: u64,
    pub(crate) len: u32,
    pub(crate) got: u32,
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PullState {
    pub(crate) wanted: u64,
    pub(crate) next_pull: u64,
    /// The end of the last PULL that left (pulls leave in offset order):
    /// data beyond it was never asked for.
    pub(crate) sent_mark: u64,
    pub(crate) received: u64,
    /// The sender's fragment unit (from its RTS): pulls are whole units.
    pub(crate) unit: u32,
    /// Which fragments arrived: one that comes again is refused.
    pub(crate) frags: Frags<4>,
    pub(crate) blocks: [Block; 8],
    pub(crate) nblocks: u8,
    /// In `Core::starved_pulls`: it wants data and has no pull in flight.
    pub(crate) starved: bool,
}

pub(crate) struct RecvSlot<R> {
    pub(crate) gen: u32,
    pub(crate) buf: Option<R>,
    pub(crate) buf_len: u64,
    pub(crate) ctx: u64,
    pub(crate) src: u16,
    pub(crate) match_bits: u64,
    pub(crate) mask: u64,
    pub(crate) state: RecvState,
    pub(crate) msg: u32,
    /// The peer this receive counts as involving (for liveness), or `NO_PEER`.
    pub(crate) inv_peer: u16,
    pub(crate) pull: PullState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MsgState {
    /// Arrived before an earlier message of the same sender: not matchable yet.
    Waiting,
    /// Matchable, no receive yet: in the unexpected queue.
    Unexpected,
    /// Bound to a receive.
    Bound,
    /// Taken by a matched probe ([`Core::mprobe`]), in no queue: waits for
    /// [`Core::post_mrecv`].
    Claimed,
    /// Claimed, and its sender's session ended before all of it came: the
    /// receive that [`Core::post_mrecv`] posts for it fails with this. It
    /// keeps its charge (as a kept message does) and no store.
    ClaimFailed(RequestError),
    /// A rendezvous message its sender withdrew while it waited for an
    /// earlier one (see `Core::on_withdraw`): passed by, and freed, when its
    /// turn to match comes. It keeps its charge until then.
    Withdrawn,
}

/// The envelope of an incoming message that is not finished yet.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InMsg {
    pub(crate) peer: u16,
    pub(crate) msg_id: u32,
    pub(crate) rndv: bool,
    pub(crate) match_bits: u64,
    pub(crate) len: u64,
    pub(crate) received: u64,
    /// The sender's fragment unit (0 for a message that came whole in a PACK).
    pub(crate) unit: u16,
    /// Which fragments of an eager message arrived: one that comes again is
    /// refused.
    pub(crate) frags: Frags<1>,
    pub(crate) state: MsgState,
    pub(crate) recv: u32,
    pub(crate) store: u32,
    /// Where the store's chain was last written.
    pub(crate) at: super::matching::Cursor,
    pub(crate) charge: u32,
    /// Left over from a session that ended; not in the id map any more.
    pub(crate) orphan: bool,
    /// The number of the matched probe that claimed it (0: not claimed):
    /// what its [`MessageId`] must carry.
    pub(crate) claim: u32,
    /// In the id map (`msg_map`), where its later fragments, pulls and
    /// matching find it. A whole eager message queued as unexpected on arrival
    /// is not: nothing looks it up by id, only the unexpected queue finds it.
    pub(crate) mapped: bool,
}

/// A reliable frame sent (or, for control frames, queued) and not yet acknowledged:
/// enough to emit it again.
///
/// A PACK refers to `len` sends, the first at `slot` and the rest after it in the
/// peer's send list (where they stay, side by side, until the PACK is acknowledged);
/// its `offset` is the bytes of its records.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TxFrame {
    pub(crate) seq: u32,
    pub(crate) kind: FrameType,
    pub(crate) lost: bool,
    pub(crate) retx: u16,
    pub(crate) sent_at: Time,
    pub(crate) slot: u32,
    pub(crate) msg_id: u32,
    pub(crate) offset: u64,
    pub(crate) len: u32,
}

impl TxFrame {
    const EMPTY: TxFrame = TxFrame {
        seq: 0,
        kind: FrameType::Ack,
        lost: false,
        retx: 0,
        sent_at: Time::ZERO,
        slot: NIL,
        msg_id: 0,
        offset: 0,
        len: 0,
    };
}

/// Whether epoch `a` comes after `b` (serial-number order: epochs wrap).
#[inline]
pub(crate) fn epoch_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

#[inline]
pub(crate) fn msg_key(peer: u16, msg_id: u32) -> u64 {
    (peer as u64) << 32 | msg_id as u64
}

/// One endpoint's protocol state, talking to many peers. See the module docs for how to
/// drive it.
///
/// `S` is a send buffer (registered memory the runtime can attach to a frame), `R` a
/// receive buffer. The core keeps both until the request completes and hands them back
/// in the [`Completion`].
///
/// ```
/// use emx::proto::{Addr, Core, CoreConfig, MacAddr, Time};
/// let mut a: Core<Vec<u8>, Vec<u8>> =
///     Core::new(CoreConfig::default(), Addr::new(1, 0), MacAddr([2, 0, 0, 0, 0, 1]), 1, Time::ZERO)
///         .unwrap();
/// let b = a.add_peer(Addr::new(2, 0), MacAddr([2, 0, 0, 0, 0, 2])).unwrap();
/// let req = a.send(Time::ZERO, Addr::new(2, 0), 0x42, b"hi".to_vec(), 7).unwrap();
/// // The first thing on the wire is the handshake that learns the peer's epoch.
/// let mut buf = [0u8; 128];
/// let tx = a.poll_transmit(Time::ZERO, &mut buf).unwrap();
/// assert_eq!(tx.peer, b);
/// assert!(tx.payload.is_none());
/// # let _ = req;
/// ```
pub struct Core<S: AsRef<[u8]>, R: RecvBuffer> {
    pub(crate) cfg: CoreConfig,
    pub(crate) local: Addr,
    pub(crate) mac: MacAddr,
    pub(crate) epoch: u32,
    pub(crate) peer_credit: u64,
    /// The most a retransmission timeout may back off to: `rto_max`, and no
    /// more than a quarter of `peer_timeout` (but at least `rto_min`).
    pub(crate) rto_cap: core::time::Duration,
    pub(crate) max_payload: usize,

    pub(crate) peers: Vec<Peer>,
    pub(crate) peer_map: IdMap<u32, u16>,
    /// The last address looked up and its peer: traffic comes in runs from one peer.
    pub(crate) last_peer: (u32, u16),
    pub(crate) ready: VecDeque<u16>,
    /// Each peer's earliest deadline, as of its last [`touch`](Self::touch).
    pub(crate) timers: MinTree,
    /// Peers touched since the tree was last brought up to date (each at most once).
    pub(crate) dirty: Vec<Cell<u16>>,
    pub(crate) dirty_len: Cell<usize>,

    pub(crate) sends: Vec<SendSlot<S>>,
    pub(crate) send_free: FreeList,
    /// Per-peer send lists.
    pub(crate) send_links: Links,
    /// Per-peer pull-reply lists.
    pub(crate) pull_links: Links,
    pub(crate) rndv_map: IdMap<u64, u32>,

    pub(crate) recvs: Vec<RecvSlot<R>>,
    pub(crate) recv_free: FreeList,
    pub(crate) recv_links: Links,
    pub(crate) posted: List,

    pub(crate) msgs: Vec<InMsg>,
    pub(crate) msg_free: FreeList,
    /// The unexpected queue.
    pub(crate) msg_links: ZeroedLinks,
    /// Per-peer envelope lists.
    pub(crate) msg_peer_links: ZeroedLinks,
    pub(crate) unexpected: List,
    /// A session's complete messages kept behind a lost one when it ends, in
    /// message-id order (see `fail_peer`); reserved like `msgs`, touched as
    /// far as messages were kept at once.
    pub(crate) kept: Vec<u32>,
    pub(crate) msg_map: IdMap<u64, u32>,
    pub(crate) store: Store,
    pub(crate) held_total: u64,
    /// The last matched probe's number (see [`InMsg::claim`]).
    pub(crate) last_claim: u32,

    pub(crate) frames: Vec<TxFrame>,
    pub(crate) frame_free: FreeList,
    pub(crate) frame_links: Links,
    /// Bound rendezvous receives that found the frame table full with no pull
    /// in flight (over `recv_links`): nothing else would pull for them again.
    /// [`poll_transmit`](Self::poll_transmit), or an acknowledgement that
    /// frees frames, issues their pulls.
    pub(crate) starved_pulls: List,
    /// NOTIFYs (peer, message id) that found the frame table full, queued the
    /// same way. While NOTIFYs or pulls wait, RTSes are refused, so this holds
    /// at most one NOTIFY per rendezvous envelope there was when it began.
    pub(crate) starved_notifies: VecDeque<(u16, u32, bool)>,
    /// Sends whose WITHDRAW found the frame table full, oldest first.
    pub(crate) starved_withdraws: VecDeque<u32>,
    /// Peers whose window had room for a new frame when the table had none
    /// (each once): put back on the transmit queue once frames are free, as
    /// only their own frames or timers would otherwise.
    pub(crate) starved_peers: VecDeque<u16>,

    pub(crate) completions: VecDeque<Completion<S, R>>,
    pub(crate) stats: CoreStats,

    /// Inside [`handle_frame_lending`](Self::handle_frame_lending): the
    /// frame's address, so that a lent payload's offset can be given.
    pub(crate) lend_base: Option<usize>,
    /// The frame's payload was lent to a receive.
    pub(crate) lent: Option<Lend>,
    /// A receive buffer was written with streaming stores since the last fence
    /// ([`fence_streaming`](Self::fence_streaming)).
    pub(crate) streamed: bool,
    /// Bytes of the buffers of live receives that can take a rendezvous message
    /// (longer than the eager threshold): compared with `stream_min`.
    pub(crate) large_posted: u64,
    /// Payloads shorter than this are copied into the frame buffer behind the
    /// headers (see [`set_copy_below`](Self::set_copy_below)).
    pub(crate) copy_below: usize,
    /// Closing ([`begin_close`](Self::begin_close)): no new request, no new
    /// message from a peer.
    pub(crate) closing: bool,
    /// Closed for good ([`close`](Self::close)).
    pub(crate) closed: bool,
}

impl<S: AsRef<[u8]>, R: RecvBuffer> Drop for Core<S, R> {
    /// Fences streaming stores into the buffers it frees.
    fn drop(&mut self) {
        self.fence_streaming();
    }
}

/// A frame's payload lent to a receive (see [`Core::handle_frame_lending`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lend {
    /// The receive that completed with this payload as its message.
    pub req: RequestId,
    /// Where the message starts in the frame.
    pub offset: usize,
    /// Its length.
    pub len: usize,
}

impl<S: AsRef<[u8]>, R: RecvBuffer> Core<S, R> {
    /// Creates a core for endpoint `local` with Ethernet address `mac`, in session epoch
    /// `epoch` (non-zero, and higher than any epoch this endpoint had before, those it
    /// moved to toward a peer it gave up included: one more per give-up). Every table
    /// is allocated here, sized by `cfg`; nothing is allocated afterwards. `now` is the
    /// creation time; the core starts idle, so nothing is scheduled from it yet.
    pub fn new(
        cfg: CoreConfig,
        local: Addr,
        mac: MacAddr,
        epoch: u32,
        now: Time,
    ) -> Result<Self, ConfigError> {
        cfg.validate()?;
        if epoch == 0 {
            return Err(ConfigError::Table("epoch must be non-zero"));
        }
        // The core starts idle: nothing is scheduled from `now` yet.
        let _ = now;
        let n_msgs = (cfg.unexpected_bytes / MSG_OVERHEAD) as usize + cfg.max_recvs + 16;
        // (One WITHDRAW per send at most: see `Core::cancel`.)
        let n_frames = cfg.max_peers * cfg.window as usize
            + cfg.max_recvs * (cfg.pull_inflight as usize + 2)
            + cfg.max_sends
            + 64;
        let sends = (0..cfg.max_sends)
            .map(|_| SendSlot {
                gen: 0,
                buf: None,
                ctx: 0,
                peer: NO_PEER,
                msg_id: 0,
                len: 0,
                match_bits: 0,
                rndv: false,
                started: false,
                first_pass_done: false,
                emitted: 0,
                inflight: 0,
                notified: false,
                pull_limit: 0,
                sent_upto: 0,
                in_pulls: false,
                withdraw: Withdraw::No,
            })
            .collect();
        let recvs = (0..cfg.max_recvs)
            .map(|_| RecvSlot {
                gen: 0,
                buf: None,
                buf_len: 0,
                ctx: 0,
                src: NO_PEER,
                match_bits: 0,
                mask: 0,
                state: RecvState::Free,
                msg: NIL,
                inv_peer: NO_PEER,
                pull: PullState::default(),
            })
            .collect();
        Ok(Core {
            peer_credit: cfg.peer_credit(),
            rto_cap: cfg.rto_max.min(cfg.peer_timeout / 4).max(cfg.rto_min),
            max_payload: cfg.frame_payload(),
            local,
            mac,
            epoch,
            peers: Vec::with_capacity(cfg.max_peers),
            peer_map: id_map(cfg.max_peers),
            last_peer: (u32::MAX, NO_PEER),
            ready: VecDeque::with_capacity(cfg.max_peers),
            timers: MinTree::new(1),
            dirty: vec![Cell::new(0); cfg.max_peers],
            dirty_len: Cell::new(0),
            sends,
            send_free: FreeList::new(cfg.max_sends),
            send_links: Links::new(cfg.max_sends),
            pull_links: Links::new(cfg.max_sends),
            rndv_map: id_map(cfg.max_sends),
            recvs,
            recv_free: FreeList::new(cfg.max_recvs),
            recv_links: Links::new(cfg.max_recvs),
            posted: List::default(),
            // Reserved, not written: an envelope is written when first taken
            // (`new_msg`), so the pages of the table (17 MiB at the default
            // store) are touched as far as messages have waited at once.
            msgs: Vec::with_capacity(n_msgs),
            msg_free: FreeList::new(n_msgs),
            msg_links: ZeroedLinks::new(n_msgs),
            msg_peer_links: ZeroedLinks::new(n_msgs),
            unexpected: List::default(),
            kept: Vec::with_capacity(n_msgs),
            msg_map: id_map(n_msgs),
            store: Store::new(cfg.unexpected_bytes),
            held_total: 0,
            last_claim: 0,
            frames: vec![TxFrame::EMPTY; n_frames],
            frame_free: FreeList::new(n_frames),
            frame_links: Links::new(n_frames),
            starved_pulls: List::default(),
            // (bounded by the envelopes: see `queue_notify`; its pages are
            // touched only as NOTIFYs wait)
            starved_notifies: VecDeque::with_capacity(n_msgs),
            starved_withdraws: VecDeque::with_capacity(cfg.max_sends),
            starved_peers: VecDeque::with_capacity(cfg.max_peers),
            lend_base: None,
            streamed: false,
            large_posted: 0,
            copy_below: 0,
            lent: None,
            completions: VecDeque::with_capacity(cfg.max_sends + cfg.max_recvs),
            closing: false,
            closed: false,
            stats: CoreStats::default(),
            cfg,
        })
    }

    /// This core's address.
    pub fn local(&self) -> Addr {
        self.local
    }

    /// This core's Ethernet address.
    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    /// This core's session epoch.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The configuration.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// Adds a peer reachable at Ethernet address `mac`. The table is bounded by
    /// `max_peers`; peers are never removed (an unreachable one stays, refusing its old
    /// epoch). With [`MacAddr::BROADCAST`] the address is learnt: HELLOs go to
    /// everyone, and the peer's first frame (and its first frame of each new epoch)
    /// tells its address.
    pub fn add_peer(&mut self, addr: Addr, mac: MacAddr) -> Result<PeerId, PeerError> {
        if addr == self.local {
            return Err(PeerError::SelfAddress);
        }
        if self.peer_map.contains_key(&addr.key()) {
            return Err(PeerError::Duplicate);
        }
        if self.peers.len() >= self.cfg.max_peers {
            return Err(PeerError::TableFull);
        }
        let id = self.peers.len() as u16;
        self.peers
            .push(Peer::new(addr, mac, self.cfg.initial_rto(), self.epoch));
        self.timers.grow(self.peers.len());
        self.peer_map.insert(addr.key(), id);
        Ok(PeerId(id))
    }

    #[inline]
    fn lookup_peer(&mut self, key: u32) -> Option<u16> {
        if self.last_peer.0 == key {
            return Some(self.last_peer.1);
        }
        let p = *self.peer_map.get(&key)?;
        self.last_peer = (key, p);
        Some(p)
    }

    /// The id of the peer at `addr`.
    pub fn peer_id(&self, addr: Addr) -> Option<PeerId> {
        self.peer_map.get(&addr.key()).map(|&p| PeerId(p))
    }

    /// Counters of one peer.
    pub fn peer_stats(&self, peer: PeerId) -> Option<&PeerStats> {
        self.peers.get(peer.0 as usize).map(|p| &p.stats)
    }

    /// Tries again with a peer declared unreachable (after a partition, say): requests
    /// naming it are accepted again and a HELLO leaves at once. Its old session stays
    /// over: our epoch for it has moved on, so when it answers it first fails what it
    /// still had in flight to us (as if we had restarted), and both sides start a new
    /// session. As with any peer, it is declared unreachable again if it stays silent
    /// past the liveness deadline while something waits on it (post a receive naming it
    /// to watch it: the HELLO is repeated until then). Returns whether it was
    /// unreachable; a live peer is left as it is.
    pub fn reconnect(&mut self, now: Time, peer: PeerId) -> bool {
        let p = peer.0;
        let Some(pe) = self.peers.get_mut(p as usize) else {
            return false;
        };
        if !pe.dead || self.closing {
            return false;
        }
        pe.dead = false;
        pe.hello_now = true;
        // It may have come back elsewhere.
        pe.greet_all = pe.auto_mac;
        pe.last_probe = now;
        pe.live_base = now;
        pe.rtt.reset_backoff();
        self.mark_ready(p);
        self.touch(p);
        true
    }

    /// A snapshot of one peer's session state.
    pub fn peer_info(&self, peer: PeerId) -> Option<PeerInfo> {
        let p = self.peers.get(peer.0 as usize)?;
        Some(PeerInfo {
            epoch: p.epoch,
            dead: p.dead,
            snd_next: p.snd_next,
            in_flight: p.inflight.len,
            rcv_next: p.rcv.next,
            rcv_sack: p.rcv.sack(),
            next_msg_id: p.next_msg_id,
            next_match: p.next_match,
            credit_limit: p.credit_limit,
            credit_used: p.credit_used,
            held: p.held,
            involved: p.involved,
            srtt: p.rtt.srtt(),
            rto: p.rtt.rto(self.rto_cap),
        })
    }

    /// Every peer: its id, address and Ethernet address, in the order added.
    pub fn peers(&self) -> impl Iterator<Item = (PeerId, Addr, MacAddr)> + '_ {
        self.peers
            .iter()
            .enumerate()
            .map(|(i, p)| (PeerId(i as u16), p.addr, p.mac))
    }

    /// When a frame of the peer was last accepted, in its current session
    /// or an earlier one (`None`: never): how long a peer given up has
    /// been silent.
    pub fn peer_last_heard(&self, peer: PeerId) -> Option<Time> {
        let p = self.peers.get(peer.0 as usize)?;
        (p.stats.frames_received > 0).then_some(p.last_heard)
    }

    /// Core-wide counters.
    pub fn stats(&self) -> &CoreStats {
        &self.stats
    }

    /// Bytes of the unexpected store in use now (credit charge of waiting messages).
    pub fn unexpected_bytes(&self) -> u64 {
        self.held_total
    }

    /// Bytes of state an idle peer costs: its session record and its address-map entry.
    pub fn idle_peer_state_bytes() -> usize {
        core::mem::size_of::<Peer>() + core::mem::size_of::<(u32, u16)>() + 1
    }

    /// Outstanding requests (sends plus receives) not completed yet.
    pub fn outstanding(&self) -> usize {
        (self.cfg.max_sends - self.send_free.available())
            + (self.cfg.max_recvs - self.recv_free.available())
    }

    /// Outstanding requests under way: sends, and receives that took a
    /// message (not those still waiting for one, which may wait for good).
    /// What a shutdown lets finish.
    pub fn in_progress(&self) -> usize {
        self.outstanding() - self.posted.len as usize
    }

    // ----------------------------------------------------------------- requests

    /// Sends `buf` to `dst` with `match_bits`. The buffer stays with the core (frames are
    /// sent by reference into it) until the send completes, which happens once the
    /// receiver took what it wanted of it (a shorter receive pulls a rendezvous
    /// message only that far) and acknowledged every frame; it comes back in a
    /// [`Completion::Send`].
    /// Messages up to `eager_threshold` go eager, longer ones by rendezvous.
    /// `now` is read only when the send starts `dst`'s monitoring (see [`Now`]).
    pub fn send(
        &mut self,
        now: impl Now,
        dst: Addr,
        match_bits: u64,
        buf: S,
        ctx: u64,
    ) -> Result<RequestId, Rejected<SendError, S>> {
        if self.closing {
            return Err(Rejected {
                error: SendError::Closed,
                buf,
            });
        }
        let Some(p) = self.lookup_peer(dst.key()) else {
            return Err(Rejected {
                error: SendError::UnknownPeer,
                buf,
            });
        };
        if self.peers[p as usize].dead {
            return Err(Rejected {
                error: SendError::PeerUnreachable,
                buf,
            });
        }
        let len = buf.as_ref().len() as u64;
        if len > MAX_MSG_LEN {
            return Err(Rejected {
                error: SendError::TooLong,
                buf,
            });
        }
        let Some(i) = self.send_free.alloc() else {
            return Err(Rejected {
                error: SendError::TooManySends,
                buf,
            });
        };
        let peer = &mut self.peers[p as usize];
        let msg_id = peer.next_msg_id;
        peer.next_msg_id = msg_id.wrapping_add(1);
        let rndv = len > self.cfg.eager_threshold;
        let s = &mut self.sends[i as usize];
        s.buf = Some(buf);
        s.ctx = ctx;
        s.peer = p;
        s.msg_id = msg_id;
        s.len = len;
        s.match_bits = match_bits;
        s.rndv = rndv;
        s.started = false;
        s.first_pass_done = false;
        s.emitted = 0;
        s.inflight = 0;
        s.notified = false;
        s.pull_limit = 0;
        s.sent_upto = 0;
        s.in_pulls = false;
        s.withdraw = Withdraw::No;
        let gen = s.gen;
        if rndv {
            self.rndv_map.insert(msg_key(p, msg_id), i);
        }
        self.engage(p, now);
        let peer = &mut self.peers[p as usize];
        self.send_links.push_back(&mut peer.sends, i);
        if peer.cursor == NIL {
            peer.cursor = i;
        }
        self.mark_ready(p);
        Ok(RequestId::send(i, gen))
    }

    /// Whether the send `id` is all this core has for its peer: no frame in
    /// flight to it, nothing queued ahead of the send, and no control frame
    /// waiting. A runtime that drives the core from the application's thread
    /// sends such a message at once, in the call that started it (the way an
    /// MPI eager send leaves in `MPI_Isend`), instead of at the next progress
    /// call; messages that find others in flight wait for that call, where
    /// they leave together (packed, when small). False for a stale or
    /// receive id.
    #[must_use]
    #[inline]
    pub fn send_goes_alone(&self, id: RequestId) -> bool {
        let Some(s) = self.live_send(id) else {
            return false;
        };
        let peer = &self.peers[s.peer as usize];
        peer.cursor == id.index() as u32 && peer.inflight.is_empty() && peer.ctrl.is_empty()
    }

    /// Whether the send `id` should leave now, in the call that started it,
    /// rather than at the next progress call: it goes alone
    /// ([`send_goes_alone`](Self::send_goes_alone)), or it is a small message
    /// that fills a PACK (`pack_max` of them, at least 16, queued for its peer
    /// behind others in flight) while the peer sends this core nothing (no
    /// message of its own within `ack_delay`). `now` is read only in that
    /// last case.
    ///
    /// A one-way stream then reaches its receiver a full frame at a time
    /// while its sender still queues the rest of its window: the receiver
    /// works on the first messages while the last are queued, where the two
    /// took turns a window at a time. Messages short of a full frame still
    /// wait for the next progress call, as TCP's Nagle rule holds back a
    /// segment that is not full. When the peer sends too, that call also
    /// carries the acknowledgements of what it sent: leaving early, the
    /// frames would leave them to go alone (in both directions at once, with
    /// 8-byte messages, half as many again acknowledgements went alone, and
    /// 8% fewer messages a second). False for a stale or receive id.
    #[must_use]
    #[inline(always)]
    pub fn send_leaves_now(&self, id: RequestId, now: impl Now) -> bool {
        let Some(s) = self.live_send(id) else {
            return false;
        };
        let peer = &self.peers[s.peer as usize];
        if peer.cursor == id.index() as u32 {
            // (The ping-pong's case, inline: the rest is a stream's.)
            return peer.inflight.is_empty() && peer.ctrl.is_empty();
        }
        // Messages from the cursor's to this one (numbered in order per
        // peer): those queued and not yet sent. Once a batch is, it leaves,
        // and the count starts again behind it; a batch that cannot leave
        // (window or credit) waits for the progress call.
        peer.cursor != NIL
            && s.msg_id
                .wrapping_sub(self.sends[peer.cursor as usize].msg_id)
                .wrapping_add(1)
                == u32::from(self.cfg.pack_max).max(16)
            && self.fills_pack(s, peer, now)
    }

    /// Whether send `s`, the last of a batch queued for `peer`, fills a PACK
    /// of a one-way stream (see [`send_leaves_now`](Self::send_leaves_now)).
    #[inline(never)]
    fn fills_pack(&self, s: &SendSlot<S>, peer: &Peer, mut now: impl Now) -> bool {
        self.packable(s) && now.now().saturating_since(peer.data_at) >= self.cfg.ack_delay
    }

    /// Posts a receive for a message from `src` (any peer when `None`) whose match bits
    /// equal `match_bits` where `mask` has ones. If an unexpected message matches, it is
    /// taken at once (the oldest first); otherwise the receive waits, behind the
    /// receives posted before it. A message longer than `buf` completes with
    /// `truncated` set and its real length. `now` is read only when the
    /// receive starts `src`'s monitoring or takes an unexpected message (see
    /// [`Now`]).
    pub fn post_recv(
        &mut self,
        mut now: impl Now,
        src: Option<Addr>,
        match_bits: u64,
        mask: u64,
        buf: R,
        ctx: u64,
    ) -> Result<RequestId, Rejected<RecvError, R>> {
        if self.closing {
            return Err(Rejected {
                error: RecvError::Closed,
                buf,
            });
        }
        let src_peer = match src {
            None => NO_PEER,
            Some(a) => match self.lookup_peer(a.key()) {
                // A peer declared unreachable sends nothing more, but what it
                // sent whole before is still here to take (as `probe` shows).
                Some(p)
                    if self.peers[p as usize].dead
                        && self.first_unexpected(p, match_bits, mask).is_none() =>
                {
                    return Err(Rejected {
                        error: RecvError::PeerUnreachable,
                        buf,
                    })
                }
                Some(p) => p,
                None => {
                    return Err(Rejected {
                        error: RecvError::UnknownPeer,
                        buf,
                    })
                }
            },
        };
        let (r, gen) = self.take_recv_slot(buf, src_peer, match_bits, mask, ctx)?;
        // (Not a dead one, whose kept message it takes below: engaging it
        // would greet it, a session only `reconnect` may start.)
        if src_peer != NO_PEER && !self.peers[src_peer as usize].dead {
            self.recvs[r as usize].inv_peer = src_peer;
            self.engage(src_peer, &mut now);
        }
        if let Some(m) = self.first_unexpected(src_peer, match_bits, mask) {
            self.msg_links.remove(&mut self.unexpected, m);
            self.bind(now.now(), m, r);
        } else {
            self.recv_links.push_back(&mut self.posted, r);
        }
        Ok(RequestId::recv(r, gen))
    }

    /// A receive slot for `buf`, filled in as posted (in no list yet), and
    /// its generation; refused when `max_recvs` are outstanding.
    #[inline]
    fn take_recv_slot(
        &mut self,
        mut buf: R,
        src_peer: u16,
        match_bits: u64,
        mask: u64,
        ctx: u64,
    ) -> Result<(u32, u32), Rejected<RecvError, R>> {
        let Some(r) = self.recv_free.alloc() else {
            return Err(Rejected {
                error: RecvError::TooManyRecvs,
                buf,
            });
        };
        let buf_len = if buf.lends() {
            self.cfg.eager_threshold
        } else {
            buf.as_mut().len() as u64
        };
        if buf_len > self.cfg.eager_threshold {
            self.large_posted += buf_len;
        }
        let slot = &mut self.recvs[r as usize];
        slot.buf = Some(buf);
        slot.buf_len = buf_len;
        slot.ctx = ctx;
        slot.src = src_peer;
        slot.match_bits = match_bits;
        slot.mask = mask;
        slot.state = RecvState::Posted;
        slot.msg = NIL;
        slot.inv_peer = NO_PEER;
        Ok((r, slot.gen))
    }

    /// A matched probe (MPI's `Improbe`): takes the first unexpected message
    /// that a receive with these arguments would take out of the unexpected
    /// queue, so that no receive matches it any more, and gives its handle
    /// and envelope. [`post_mrecv`](Self::post_mrecv) receives it. `None`
    /// when there is no such message, and while the core is closing (no
    /// receive could take it).
    ///
    /// The message may still be arriving (later fragments go on into the
    /// store). Until it is received it keeps its room in the unexpected store
    /// and its sender's credit, as an unexpected message does; a message
    /// claimed and never received holds them until the core closes.
    pub fn mprobe(
        &mut self,
        src: Option<Addr>,
        match_bits: u64,
        mask: u64,
    ) -> Option<(MessageId, ProbeInfo)> {
        if self.closing {
            return None;
        }
        let src_peer = match src {
            None => NO_PEER,
            Some(a) => *self.peer_map.get(&a.key())?,
        };
        let m = self.first_unexpected(src_peer, match_bits, mask)?;
        self.msg_links.remove(&mut self.unexpected, m);
        self.last_claim = match self.last_claim.wrapping_add(1) {
            0 => 1,
            c => c,
        };
        let msg = &mut self.msgs[m as usize];
        msg.state = MsgState::Claimed;
        msg.claim = self.last_claim;
        let info = ProbeInfo {
            src: self.peers[msg.peer as usize].addr,
            match_bits: msg.match_bits,
            len: msg.len,
        };
        let id = MessageId {
            msg: m,
            claim: self.last_claim,
        };
        Some((id, info))
    }

    /// Posts a receive for the message a matched probe took
    /// ([`mprobe`](Self::mprobe)), as [`post_recv`](Self::post_recv) would
    /// for a receive that matched it: copied into `buf` (truncated to it),
    /// or pulled if it is a rendezvous. If its sender's session ended before
    /// all of it came, the receive completes at once with that failure
    /// ([`RequestError::PeerUnreachable`] or
    /// [`RequestError::PeerRestarted`]); a message that had come whole is
    /// received whatever became of its sender. A handle used before is
    /// refused ([`RecvError::UnknownMessage`]).
    pub fn post_mrecv(
        &mut self,
        mut now: impl Now,
        msg: MessageId,
        buf: R,
        ctx: u64,
    ) -> Result<RequestId, Rejected<RecvError, R>> {
        if self.closing {
            return Err(Rejected {
                error: RecvError::Closed,
                buf,
            });
        }
        let m = msg.msg;
        // (An envelope carries a claim's number only while Claimed or ClaimFailed.)
        let failed = match self.msgs.get(m as usize) {
            Some(e) if e.claim == msg.claim => match e.state {
                MsgState::ClaimFailed(err) => Some(err),
                _ => None,
            },
            _ => {
                return Err(Rejected {
                    error: RecvError::UnknownMessage,
                    buf,
                })
            }
        };
        let (peer, bits) = (self.msgs[m as usize].peer, self.msgs[m as usize].match_bits);
        let (r, gen) = self.take_recv_slot(buf, peer, bits, !0, ctx)?;
        let now = now.now();
        self.msgs[m as usize].claim = 0;
        match failed {
            None => self.bind(now, m, r),
            Some(err) => {
                // Its charge goes back to the session that followed (which
                // started without it), and the envelope with the receive.
                self.release_charge(now, m);
                let slot = &mut self.recvs[r as usize];
                slot.state = RecvState::Active;
                slot.msg = m;
                self.complete_recv(r, Err(err));
            }
        }
        Ok(RequestId::recv(r, gen))
    }

    /// Looks for an unexpected message that a receive with these arguments would take,
    /// without taking it.
    #[must_use]
    pub fn probe(&self, src: Option<Addr>, match_bits: u64, mask: u64) -> Option<ProbeInfo> {
        let src_peer = match src {
            None => NO_PEER,
            Some(a) => *self.peer_map.get(&a.key())?,
        };
        let msg = &self.msgs[self.first_unexpected(src_peer, match_bits, mask)? as usize];
        Some(ProbeInfo {
            src: self.peers[msg.peer as usize].addr,
            match_bits: msg.match_bits,
            len: msg.len,
        })
    }

    /// The oldest unexpected message from `src_peer` (any with `NO_PEER`)
    /// whose match bits match.
    #[inline]
    fn first_unexpected(&self, src_peer: u16, match_bits: u64, mask: u64) -> Option<u32> {
        let mut m = self.unexpected.head;
        while m != NIL {
            let msg = &self.msgs[m as usize];
            if (src_peer == NO_PEER || msg.peer == src_peer)
                && matches(msg.match_bits, match_bits, mask)
            {
                return Some(m);
            }
            m = self.msg_links.next(m);
        }
        None
    }

    /// Cancels a request that its peer has not taken yet; it then completes with
    /// [`RequestError::Cancelled`].
    ///
    /// - A posted receive that has not matched completes at once.
    /// - A rendezvous send (longer than the eager threshold) that its receiver has not
    ///   pulled from is withdrawn: a WITHDRAW follows its RTS once the RTS is
    ///   acknowledged, and the receiver drops the message if no receive took it (nor a
    ///   matched probe), and says so. The send then completes with `Cancelled`; if a
    ///   receive took the message first, it is pulled and the send succeeds as usual.
    ///
    /// Returns false when the request cannot be cancelled: a receive already matched
    /// or completed, an eager send (it is the receiver's once it left), or a
    /// rendezvous send that was pulled from or whose cancel was asked already. (A
    /// WITHDRAW that finds the frame table full waits for a frame.)
    #[must_use]
    pub fn cancel(&mut self, req: RequestId) -> bool {
        if !req.is_recv() {
            return self.withdraw(req);
        }
        if req.index() >= self.recvs.len() {
            return false;
        }
        let r = req.index() as u32;
        let slot = &self.recvs[r as usize];
        if slot.gen != req.gen() || slot.state != RecvState::Posted {
            return false;
        }
        self.recv_links.remove(&mut self.posted, r);
        self.complete_recv(r, Err(RequestError::Cancelled));
        true
    }

    /// [`cancel`](Self::cancel) for a send.
    fn withdraw(&mut self, req: RequestId) -> bool {
        let i = req.index() as u32;
        let Some(s) = self.sends.get(i as usize) else {
            return false;
        };
        if s.gen != req.gen()
            || s.buf.is_none()
            || !s.rndv
            || s.notified
            || s.pull_limit != 0
            || s.withdraw != Withdraw::No
        {
            return false;
        }
        // Its WITHDRAW leaves once the RTS is acknowledged: now, if it is.
        let now = s.rts_acknowledged();
        self.sends[i as usize].withdraw = Withdraw::Wanted;
        if now {
            self.send_withdraw(i);
        }
        true
    }

    /// Queues the WITHDRAW of rendezvous send `i` (its cancel was asked and
    /// its RTS acknowledged), or, when the frame table is full, has it wait
    /// for a frame (see `feed_starved`).
    pub(crate) fn send_withdraw(&mut self, i: u32) {
        match self.frame_free.alloc() {
            Some(f) => self.push_withdraw(f, i),
            None => self.starved_withdraws.push_back(i),
        }
    }

    /// Queues the WITHDRAW of send `i` in frame `f`.
    pub(crate) fn push_withdraw(&mut self, f: u32, i: u32) {
        let s = &mut self.sends[i as usize];
        s.withdraw = Withdraw::Sent;
        let (p, msg_id) = (s.peer, s.msg_id);
        self.push_ctrl(f, p, FrameType::Withdraw, msg_id, 0);
    }

    /// Aborts every outstanding request, for shutdown. Every send and receive (posted,
    /// matched, in progress, rendezvous in either direction) completes with
    /// [`RequestError::Aborted`] and hands its buffer back through
    /// [`poll_completion`](Self::poll_completion); afterwards
    /// [`outstanding`](Self::outstanding) is zero and no frame that
    /// [`poll_transmit`](Self::poll_transmit) writes refers to an aborted send (it may
    /// still write control frames: acks, pulls in flight, notifies). Peers stay known and
    /// their sessions go on, so the core takes new requests afterwards (unless
    /// it is closing: [`begin_close`](Self::begin_close)). Unexpected
    /// messages are not requests: they stay for later receives.
    ///
    /// What the peers see (an abort withdraws nothing: a shutdown sends no more than
    /// it must, and [`cancel`](Self::cancel) is what withdraws a message; a WITHDRAW
    /// already queued still goes, and its answer is taken and ignored, while a cancel
    /// whose WITHDRAW had not left ends `Aborted` with its send):
    /// - a send nothing of which left yet is withdrawn for good (its message id is given
    ///   back, so the peer's in-order matching does not wait for it);
    /// - a rendezvous receive that was pulling sends NOTIFY, so that its sender stops and
    ///   its send completes; late data of an aborted receive is acknowledged and
    ///   discarded, and a late NOTIFY for an aborted send is acknowledged and ignored;
    /// - a message partly sent (an eager message with fragments still to go, or a
    ///   rendezvous announced and not yet pulled whole) stays incomplete at its
    ///   receiver, which learns of it only when this endpoint comes back with a new epoch
    ///   or goes silent. Frames of aborted sends that were in flight are not sent again,
    ///   so if one of them was lost the peer's stream has a hole that never fills: it
    ///   acknowledges nothing past it, and whichever side next has frames in flight
    ///   gives the other up at its progress deadline (this core, if it sends again
    ///   before closing, failing those later requests as unreachable). Both are the
    ///   ordinary end of a shutdown, which sends nothing more.
    ///
    /// `now` is the time of the call (aborting starts no timer).
    pub fn abort_all(&mut self, now: Time) {
        if self.closed {
            return;
        }
        let _ = now;
        for p in 0..self.peers.len() as u16 {
            // Frames first, so that nothing refers to a send once it is gone.
            self.abort_peer_frames(p);
            self.abort_peer_sends(p);
        }
        while let Some(r) = self.recv_links.pop_front(&mut self.posted) {
            self.complete_recv(r, Err(RequestError::Aborted));
        }
        for r in 0..self.recvs.len() as u32 {
            if self.recvs[r as usize].state != RecvState::Active {
                continue;
            }
            let m = self.recvs[r as usize].msg;
            if m != NIL {
                let msg = self.msgs[m as usize];
                let peer = &mut self.peers[msg.peer as usize];
                // Every matched message id is below `next_match`.
                peer.recvs_aborted_below = Some(peer.next_match);
                if msg.rndv {
                    // The sender completes its send on NOTIFY, not on data alone.
                    self.queue_notify(msg.peer, msg.msg_id, false);
                }
            }
            self.complete_recv(r, Err(RequestError::Aborted));
        }
        for p in 0..self.peers.len() as u16 {
            self.touch(p);
        }
        debug_assert_eq!(self.outstanding(), 0);
    }

    /// Starts closing the core, as its endpoint ends: every request is aborted
    /// ([`abort_all`](Self::abort_all)), new requests are refused
    /// ([`SendError::Closed`], [`RecvError::Closed`]), and so is every frame
    /// that starts a message (EAGER, PACK, RTS), unacknowledged and counted as
    /// [`DropReason::NotForUs`]. The rest goes on: the fragments of messages
    /// that were arriving, acknowledgements (of frames that came again too),
    /// the NOTIFYs of aborted receives, data pulled from us. Drive the core
    /// until it [`owes_nothing`](Self::owes_nothing) (and a moment more, for a
    /// peer whose acknowledgement was lost), then [`close`](Self::close) it.
    pub fn begin_close(&mut self, now: Time) {
        self.abort_all(now);
        self.closing = true;
    }

    /// Whether the core owes its peers nothing: no acknowledgement due, no
    /// frame of ours unacknowledged or waiting to leave, no greeting owed
    /// (or it is closed: it gave up what it owed). Costs a pass over the peers.
    pub fn owes_nothing(&self) -> bool {
        self.closed
            || (!self.starving()
                && self.peers.iter().all(|p| {
                    p.inflight.is_empty()
                        && p.ctrl.is_empty()
                        && p.pulls.is_empty()
                        && p.cursor == NIL
                        && p.ack_at == Time::NEVER
                        && !p.ack_now
                        && !p.hello_now
                        && !p.ping_now
                }))
    }

    /// Closes the core for good, as if its endpoint had ended (after
    /// [`begin_close`](Self::begin_close), which it implies): from now on
    /// every frame is dropped unanswered (counted as
    /// [`DropReason::NotForUs`]), nothing is sent, no timer runs, and new
    /// requests are refused. Its peers' sends to it end as they would if its
    /// process had gone: they fail with [`RequestError::PeerUnreachable`] once
    /// the peer gives it up, instead of being acknowledged into an unexpected
    /// store nobody reads. What it still owed (see
    /// [`owes_nothing`](Self::owes_nothing)) is dropped with it.
    pub fn close(&mut self, now: Time) {
        self.begin_close(now);
        self.closed = true;
        self.fence_streaming();
        while let Some(p) = self.ready.pop_front() {
            self.peers[p as usize].in_ready = false;
        }
        self.starved_notifies.clear();
        self.starved_withdraws.clear();
        while let Some(p) = self.starved_peers.pop_front() {
            self.peers[p as usize].frame_starved = false;
        }
        debug_assert!(self.starved_pulls.is_empty(), "aborted receives left it");
    }

    /// Whether [`close`](Self::close) was called (not merely
    /// [`begin_close`](Self::begin_close)).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Whether [`begin_close`](Self::begin_close) (or `close`) was called.
    pub fn is_closing(&self) -> bool {
        self.closing
    }

    /// Drops peer `p`'s frame records that refer to sends (EAGER, RTS, PULL_DATA in
    /// flight: a send's buffer is needed to send them again) and its pulls not sent
    /// yet (every pulling receive is being aborted). Pulls and notifies in flight stay:
    /// they refer to no request and keep their sequence numbers good.
    fn abort_peer_frames(&mut self, p: u16) {
        let peer = &mut self.peers[p as usize];
        let mut i = peer.inflight.head;
        while i != NIL {
            let next = self.frame_links.next(i);
            let f = self.frames[i as usize];
            if matches!(
                f.kind,
                FrameType::Eager | FrameType::Rts | FrameType::PullData | FrameType::Pack
            ) {
                if f.lost {
                    peer.lost -= 1;
                }
                self.frame_links.remove(&mut peer.inflight, i);
                self.frame_free.release(i);
            }
            i = next;
        }
        if peer.inflight.is_empty() {
            peer.rto_at = Time::NEVER;
        }
        let mut i = peer.ctrl.head;
        while i != NIL {
            let next = self.frame_links.next(i);
            if self.frames[i as usize].kind == FrameType::Pull {
                self.frame_links.remove(&mut peer.ctrl, i);
                self.frame_free.release(i);
            }
            i = next;
        }
    }

    /// Completes every send to peer `p` with [`RequestError::Aborted`] (after
    /// [`abort_peer_frames`](Self::abort_peer_frames)).
    fn abort_peer_sends(&mut self, p: u16) {
        // Sends leave in message order, so those nothing of which left are the tail of
        // the list: their ids (and any credit charged for them) are given back, and the
        // peer never learns they existed.
        let mut first_unsent = None;
        let mut any_sent = false;
        let mut i = self.peers[p as usize].sends.head;
        while i != NIL {
            let s = &self.sends[i as usize];
            if !s.first_pass_done && s.emitted == 0 {
                if first_unsent.is_none() {
                    first_unsent = Some(s.msg_id);
                }
                if s.started {
                    // Charged, then no frame record was free: refund the charge.
                    let charge = s.charge();
                    let peer = &mut self.peers[p as usize];
                    peer.credit_used = peer.credit_used.wrapping_sub(charge);
                }
            } else {
                debug_assert!(first_unsent.is_none(), "sends leave in message order");
                any_sent = true;
            }
            i = self.send_links.next(i);
        }
        let peer = &mut self.peers[p as usize];
        if let Some(id) = first_unsent {
            peer.next_msg_id = id;
        }
        if any_sent {
            peer.sends_aborted_below = Some(peer.next_msg_id);
        }
        while self.peers[p as usize].sends.head != NIL {
            let i = self.peers[p as usize].sends.head;
            self.sends[i as usize].inflight = 0;
            self.complete_send(i, Err(RequestError::Aborted));
        }
        debug_assert!(self.peers[p as usize].cursor == NIL);
        debug_assert!(self.peers[p as usize].pulls.is_empty());
    }

    /// The buffer of an outstanding send, to resolve a [`PayloadRef`].
    pub fn send_buffer(&self, req: RequestId) -> Option<&S> {
        self.live_send(req)?.buf.as_ref()
    }

    /// The slot of the outstanding send `id`: `None` for a receive id, a stale
    /// one, or a slot without its buffer.
    #[inline]
    fn live_send(&self, id: RequestId) -> Option<&SendSlot<S>> {
        if id.is_recv() {
            return None;
        }
        self.sends
            .get(id.index())
            .filter(|s| s.gen == id.gen() && s.buf.is_some())
    }

    /// Payloads shorter than `n` bytes are copied into the buffer given to
    /// [`poll_transmit`](Self::poll_transmit), behind the headers, when it has
    /// room ([`Transmit::copied`] says how many bytes); longer ones, and all
    /// when the buffer holds only headers, are given by reference
    /// ([`Transmit::payload`]). The caller that would copy a short payload
    /// anyway saves a lookup and a second pass over the frame. Default 0:
    /// every payload by reference.
    pub fn set_copy_below(&mut self, n: usize) {
        self.copy_below = n;
    }

    /// The bytes a [`PayloadRef`] names.
    pub fn payload(&self, p: &PayloadRef) -> Option<&[u8]> {
        let b = self.send_buffer(p.req)?.as_ref();
        let start = usize::try_from(p.offset).ok()?;
        b.get(start..start.checked_add(p.len as usize)?)
    }

    /// Takes the next finished request. Call after [`handle_frame`](Self::handle_frame),
    /// [`handle_timeout`](Self::handle_timeout) and [`cancel`](Self::cancel), until it
    /// returns `None`.
    #[must_use]
    pub fn poll_completion(&mut self) -> Option<Completion<S, R>> {
        if self.completions.is_empty() {
            return None;
        }
        self.fence_streaming();
        let c = self.completions.pop_front();
        if self.completions.is_empty() {
            // Back to the start: the next completions reuse the lines just
            // used, not the next ones of a walk through the whole queue.
            self.completions.clear();
        }
        c
    }

    /// Makes the streaming stores into receive buffers since the last call
    /// visible to other threads ([`RecvBuffer::streaming_fence`]); nothing when
    /// there were none. [`poll_completion`](Self::poll_completion) calls it
    /// before a buffer leaves; a caller that hands a burst of frames to the core
    /// may call it once after the burst, which is cheaper than a fence per frame.
    #[inline]
    pub fn fence_streaming(&mut self) {
        if self.streamed {
            self.streamed = false;
            R::streaming_fence(&CoreOnly::TOKEN);
        }
    }

    // ------------------------------------------------------------ bookkeeping

    /// Puts peer `p` in the transmit queue (it has something to send, or may have). The
    /// timers move when it sends, and [`poll_transmit`](Self::poll_transmit) touches it
    /// then.
    #[inline]
    pub(crate) fn mark_ready(&mut self, p: u16) {
        let peer = &mut self.peers[p as usize];
        if !peer.in_ready {
            peer.in_ready = true;
            self.ready.push_back(p);
        }
    }

    /// Arms the delayed ack (acks also carry credit updates).
    pub(crate) fn want_ack(&mut self, p: u16, now: Time) {
        self.touch(p);
        let peer = &mut self.peers[p as usize];
        if peer.ack_at == Time::NEVER && !peer.ack_now {
            peer.ack_at = now + self.cfg.ack_delay;
        }
    }

    pub(crate) fn complete_send(&mut self, i: u32, result: Result<(), RequestError>) {
        let s = &mut self.sends[i as usize];
        let p = s.peer;
        let req = RequestId::send(i, s.gen);
        let ctx = s.ctx;
        let buf = s.buf.take().expect("live send has its buffer");
        s.gen = RequestId::next_gen(s.gen);
        let (rndv, msg_id, in_pulls) = (s.rndv, s.msg_id, s.in_pulls);
        if s.withdraw == Withdraw::Wanted && !self.starved_withdraws.is_empty() {
            // (Rare: a cancel whose WITHDRAW waits for a frame.)
            self.starved_withdraws.retain(|&j| j != i);
        }
        let s = &mut self.sends[i as usize];
        s.in_pulls = false;
        s.peer = NO_PEER;
        let peer = &mut self.peers[p as usize];
        if peer.cursor == i {
            peer.cursor = self.send_links.next(i);
        }
        self.send_links.remove(&mut peer.sends, i);
        if in_pulls {
            self.pull_links.remove(&mut peer.pulls, i);
        }
        if rndv {
            self.rndv_map.remove(&msg_key(p, msg_id));
        }
        self.disengage(p);
        self.send_free.release(i);
        if result.is_ok() {
            self.stats.sends_completed += 1;
        }
        self.completions.push_back(Completion::Send(SendDone {
            req,
            ctx,
            buf,
            result,
        }));
    }

    /// A frame that referred to send `i` was acknowledged.
    #[inline]
    pub(crate) fn frame_acked(&mut self, i: u32) {
        let s = &mut self.sends[i as usize];
        s.inflight -= 1;
        if s.inflight == 0 {
            self.maybe_complete_send(i);
        }
    }

    #[inline]
    pub(crate) fn maybe_complete_send(&mut self, i: u32) {
        let s = &self.sends[i as usize];
        let done =
            s.inflight == 0 && s.first_pass_done && (!s.rndv || s.notified) && s.buf.is_some();
        if done {
            let result = if s.withdraw == Withdraw::Done {
                Err(RequestError::Cancelled)
            } else {
                Ok(())
            };
            self.complete_send(i, result);
        } else if s.withdraw == Withdraw::Wanted {
            self.withdraw_when_acknowledged(i);
        }
    }

    /// Sends the WITHDRAW a cancel asked for, once send `i`'s RTS is
    /// acknowledged (see [`Withdraw::Wanted`]).
    #[cold]
    fn withdraw_when_acknowledged(&mut self, i: u32) {
        if self.sends[i as usize].rts_acknowledged() {
            self.send_withdraw(i);
        }
    }

    /// Completes a receive (which must be out of the posted list) and frees its envelope.
    pub(crate) fn complete_recv(&mut self, r: u32, result: Result<RecvInfo, RequestError>) {
        let slot = &mut self.recvs[r as usize];
        let req = RequestId::recv(r, slot.gen);
        let ctx = slot.ctx;
        let buf = slot.buf.take().expect("live receive has its buffer");
        if slot.buf_len > self.cfg.eager_threshold {
            self.large_posted -= slot.buf_len;
        }
        slot.gen = RequestId::next_gen(slot.gen);
        slot.state = RecvState::Free;
        let (m, inv) = (slot.msg, slot.inv_peer);
        slot.msg = NIL;
        slot.inv_peer = NO_PEER;
        if slot.pull.starved {
            slot.pull.starved = false;
            self.recv_links.remove(&mut self.starved_pulls, r);
        }
        if m != NIL {
            self.free_msg(m);
        }
        self.disengage(inv);
        self.recv_free.release(r);
        if result.is_ok() {
            self.stats.recvs_completed += 1;
        }
        self.completions.push_back(Completion::Recv(RecvDone {
            req,
            ctx,
            buf,
            result,
        }));
    }

    pub(crate) fn recv_info(&self, m: &InMsg, r: u32) -> RecvInfo {
        let buf_len = self.recvs[r as usize].buf_len;
        RecvInfo {
            src: self.peers[m.peer as usize].addr,
            match_bits: m.match_bits,
            msg_len: m.len,
            copied: m.len.min(buf_len),
            truncated: m.len > buf_len,
        }
    }

    // --------------------------------------------------------------- frames in

    /// Processes one received Ethernet frame (untrusted bytes). Call for every frame the
    /// port delivers. A frame that is malformed, not ours, or stale is counted by reason
    /// and dropped (the reason is returned too); it never panics and leaves the protocol
    /// state as it was.
    pub fn handle_frame(&mut self, now: Time, frame: &[u8]) -> Result<(), DropReason> {
        self.handle_frame_inner(now, frame)
    }

    /// [`handle_frame`](Self::handle_frame) for a caller that can keep the
    /// frame: when it completes a lending receive (see [`RecvBuffer`]) with a
    /// one-frame eager message, the message is not copied and the answer says
    /// which receive it was and where its bytes lie in `frame`. The receive's
    /// completion is queued already, with the lending buffer; the caller
    /// keeps the frame and hands it over in that buffer's place.
    pub fn handle_frame_lending(
        &mut self,
        now: Time,
        frame: &[u8],
    ) -> Result<Option<Lend>, DropReason> {
        self.lend_base = Some(frame.as_ptr() as usize);
        let r = self.handle_frame_inner(now, frame);
        self.lend_base = None;
        let lent = self.lent.take();
        r.map(|()| lent)
    }

    #[inline]
    fn handle_frame_inner(&mut self, now: Time, frame: &[u8]) -> Result<(), DropReason> {
        if self.closed {
            // Gone, to the peers: nothing is acknowledged or answered.
            self.stats.dropped.count(DropReason::NotForUs);
            return Err(DropReason::NotForUs);
        }
        let f = match Frame::new_checked(frame) {
            Ok(f) => f,
            Err(r) => {
                // Another protocol's short frame (a 60-byte ARP) is not a
                // truncated emx frame: the truncated count is for damage.
                let r = match frame.get(12..14) {
                    Some(t) if *t != self.cfg.ethertype.to_be_bytes() => DropReason::EtherType,
                    _ => r,
                };
                self.stats.dropped.count(r);
                return Err(r);
            }
        };
        // Parsed in place: a header built and then moved would be read back
        // with wide loads that cannot forward from its narrow stores, and such
        // a load waits for every older store (the previous frame's payload
        // copy) to reach the cache.
        let mut h = Header::EMPTY;
        if let Err(r) = Header::parse_into(
            &f,
            self.cfg.ethertype,
            self.cfg.checksum != ChecksumMode::Off,
            &mut h,
        ) {
            self.stats.dropped.count(r);
            return Err(r);
        }
        if h.cluster != self.cfg.cluster {
            self.stats.dropped.count(DropReason::WrongCluster);
            return Err(DropReason::WrongCluster);
        }
        // A HELLO may be broadcast: its sender does not know our address yet.
        let to_us = h.dst_mac == self.mac
            || (h.dst_mac == MacAddr::BROADCAST && h.frame_type == FrameType::Hello);
        if h.dst_node != self.local.node || h.dst_ep != self.local.endpoint || !to_us {
            self.stats.dropped.count(DropReason::NotForUs);
            return Err(DropReason::NotForUs);
        }
        let key = Addr::new(h.src_node, h.src_ep).key();
        let Some(p) = self.lookup_peer(key) else {
            self.stats.dropped.count(DropReason::UnknownPeer);
            return Err(DropReason::UnknownPeer);
        };
        let peer = &mut self.peers[p as usize];
        let mut learnt_over = None;
        if h.src_mac != peer.mac {
            // Raw Ethernet has no other source authentication: the MAC must be the
            // peer's. A peer added without one learns it from its first frame, and
            // again when it comes back with a new epoch (a restarted container
            // may have a new address).
            // (A peer declared dead has no epoch any more: it comes back with any.)
            // The epoch rule is `handle_peer_frame`'s, silence clause included: a
            // restart whose epoch reads as earlier is taken after a silence
            // past the liveness deadline, from a frame that does not know ours.
            let silent = peer.silent_for(now, self.cfg.peer_timeout);
            let learn = peer.auto_mac
                && h.src_mac.is_unicast()
                && !peer.old_session(&h)
                && (peer.mac == MacAddr::BROADCAST
                    || peer.epoch == 0
                    || epoch_after(h.src_epoch, peer.epoch)
                    || (silent && h.dst_epoch == 0 && h.src_epoch != peer.epoch));
            if !learn {
                peer.stats.dropped.count(DropReason::NotForUs);
                return Err(DropReason::NotForUs);
            }
            learnt_over = Some(peer.mac);
            peer.mac = h.src_mac;
            peer.stats.macs_learned += 1;
        }
        let r = self.handle_peer_frame(now, p, &h, f.payload(), frame.len());
        // What the store holds once the frame is handled: a message that a
        // posted receive took at once was charged only for that moment.
        self.stats.unexpected_high_water = self.stats.unexpected_high_water.max(self.held_total);
        if let (Err(_), Some(old)) = (r, learnt_over) {
            // A frame refused before its session was taken up teaches nothing:
            // the peer keeps its address (and its answer, a HELLO, goes there).
            let peer = &mut self.peers[p as usize];
            if peer.epoch != h.src_epoch {
                peer.mac = old;
                peer.stats.macs_learned -= 1;
            }
        }
        // Whatever came in (an ack, a sign of life, a new epoch) may move p's timers.
        self.touch(p);
        if let Err(reason) = r {
            self.peers[p as usize].stats.dropped.count(reason);
        }
        if self.peers[p as usize].may_transmit() {
            self.mark_ready(p);
        }
        r
    }

    fn handle_peer_frame(
        &mut self,
        now: Time,
        p: u16,
        h: &Header,
        payload: &[u8],
        wire_len: usize,
    ) -> Result<(), DropReason> {
        let ft = h.frame_type;
        // Epochs first: nothing of a frame from another session may touch this one.
        {
            let peer = &mut self.peers[p as usize];
            // The session a peer declared dead was in is over. Answering with a HELLO
            // (our epoch for it moved on) tells it so: it starts over with us, failing
            // what it had in flight as if we had restarted, and comes back.
            if peer.old_session(h) {
                peer.hello_now = true;
                return Err(DropReason::DeadPeer);
            }
            if h.dst_epoch != 0 && h.dst_epoch != peer.my_epoch {
                // Meant for an earlier session of ours: tell the peer who we are.
                peer.hello_now = true;
                // From an epoch other than the one we know for it: ours for
                // it is likely stale too, and a HELLO naming it would be
                // refused in turn, each side answering the other's refusal
                // with another, a HELLO each way every round trip. Answer
                // naming none, asking for an answer: it is taken as a
                // greeting, and both learn the other's epoch.
                if h.src_epoch != peer.epoch {
                    peer.hello_blind = true;
                }
                return Err(DropReason::StaleEpoch);
            }
        }
        {
            let peer = &self.peers[p as usize];
            // Epochs are compared as serial numbers (they wrap). A peer declared
            // dead comes back with any other epoch, or with its old one once it
            // has started over with us; a live one with a later epoch, or with
            // any other after a silence past the liveness deadline (so long
            // that serial order says nothing) in a frame that does not know
            // our epoch: a fresh incarnation's first words. A frame that does
            // know it, with an earlier epoch, is a late one from an incarnation
            // that is gone (a switch buffer, a replay): taking it would reset the
            // live session and deliver what it carries.
            let silent = peer.silent_for(now, self.cfg.peer_timeout);
            if !peer.dead
                && peer.epoch != 0
                && h.src_epoch != peer.epoch
                && !epoch_after(h.src_epoch, peer.epoch)
                && (!silent || h.dst_epoch != 0)
            {
                return Err(DropReason::StaleEpoch);
            }
        }
        // Checks that need state but change none, so that a bad frame changes nothing.
        use super::reliability::Accept;
        let ours = h.dst_epoch == self.peers[p as usize].my_epoch;
        let known = self.peers[p as usize].epoch == h.src_epoch && !self.peers[p as usize].dead;
        if ours && known {
            self.check_ack(p, h)?;
        }
        let mut accept = None;
        if ft.is_reliable() && known {
            let a = self.peers[p as usize].rcv.check(h.seq);
            if a == Accept::OutOfWindow {
                return Err(DropReason::OutOfWindow);
            }
            if a != Accept::Duplicate {
                if let Err(e) = self.check_reliable(p, ft, h, payload) {
                    // Refused for want of room, or because this core is
                    // closing: a good frame of this session, only not taken
                    // (unacknowledged, it comes again). What it says of our
                    // frames still counts: a peer streaming to a closing core
                    // acknowledges its last frames (NOTIFYs) on frames it
                    // refuses.
                    if ours && matches!(e, DropReason::Resources | DropReason::NotForUs) {
                        self.peers[p as usize].last_heard = now;
                        self.on_ack(now, p, h);
                    }
                    return Err(e);
                }
            }
            accept = Some(a);
        }

        // A new session: learn the epoch, or start over when the peer restarted.
        if !known {
            let peer = &mut self.peers[p as usize];
            if peer.dead {
                peer.dead = false;
                peer.epoch = 0;
            }
            if peer.epoch == 0 {
                peer.epoch = h.src_epoch;
                peer.rtt.reset_backoff();
            } else {
                self.fail_peer(now, p, RequestError::PeerRestarted);
                self.reset_session(p);
                self.peers[p as usize].epoch = h.src_epoch;
            }
            if ft.is_reliable() {
                let a = self.peers[p as usize].rcv.check(h.seq);
                if a == Accept::OutOfWindow {
                    return Err(DropReason::OutOfWindow);
                }
                self.check_reliable(p, ft, h, payload)?;
                accept = Some(a);
            }
        }
        let peer = &mut self.peers[p as usize];
        peer.last_heard = now;
        peer.stats.frames_received += 1;
        peer.stats.bytes_received += wire_len as u64;
        if !ours {
            // The peer does not know our epoch yet: answer with a HELLO.
            peer.hello_now = true;
        }
        if ours {
            self.on_ack(now, p, h);
        }
        match ft {
            FrameType::Hello => {
                if h.flags & flags::ACK_REQ != 0 {
                    self.peers[p as usize].ack_now = true;
                }
                Ok(())
            }
            FrameType::Ack => {
                let peer = &mut self.peers[p as usize];
                peer.stats.acks_received += 1;
                if h.flags & flags::ACK_REQ != 0 {
                    peer.ack_now = true;
                }
                Ok(())
            }
            _ => {
                let peer = &mut self.peers[p as usize];
                match accept {
                    Some(Accept::New { in_order }) => {
                        peer.rcv.commit(h.seq);
                        peer.data_at = now;
                        if in_order && peer.rcv.no_gap() {
                            // A PACK counts as its messages: its sender waits for
                            // the ack to have their buffers back.
                            peer.unacked += if ft == FrameType::Pack {
                                h.msg_len as u32
                            } else {
                                1
                            };
                            if peer.unacked >= self.cfg.ack_every {
                                peer.ack_now = true;
                            } else if peer.ack_at == Time::NEVER {
                                peer.ack_at = now + self.cfg.ack_delay;
                            }
                        } else {
                            // A gap: tell the sender at once (fast retransmit).
                            peer.ack_now = true;
                        }
                        if h.flags & flags::ACK_REQ != 0 {
                            peer.ack_now = true;
                        }
                        self.apply_reliable(now, p, ft, h, payload);
                        Ok(())
                    }
                    _ => {
                        peer.stats.duplicates += 1;
                        peer.ack_now = true;
                        Ok(())
                    }
                }
            }
        }
    }

    /// Semantic checks of a new reliable frame in an established session.
    fn check_reliable(
        &self,
        p: u16,
        ft: FrameType,
        h: &Header,
        payload: &[u8],
    ) -> Result<(), DropReason> {
        match ft {
            // Closing: no new message is taken (see `begin_close`; an EAGER
            // frame that continues a message is, in `check_eager`).
            FrameType::Pack | FrameType::Rts if self.closing => Err(DropReason::NotForUs),
            FrameType::Eager => self.check_eager(p, h),
            FrameType::Pack => self.check_pack(p, h, payload),
            FrameType::Rts => self.check_rts(p, h),
            FrameType::Pull | FrameType::Notify => self.check_pull_or_notify(p, ft, h),
            FrameType::PullData => self.check_pull_data(p, h),
            FrameType::Withdraw => self.check_withdraw(p, h),
            FrameType::Hello | FrameType::Ack => Ok(()),
        }
    }

    fn apply_reliable(&mut self, now: Time, p: u16, ft: FrameType, h: &Header, payload: &[u8]) {
        match ft {
            FrameType::Eager => self.on_eager(now, p, h, payload),
            FrameType::Pack => self.on_pack(now, p, h, payload),
            FrameType::Rts => self.on_rts(now, p, h),
            FrameType::Pull => self.on_pull(p, h),
            FrameType::PullData => self.on_pull_data(p, h, payload),
            FrameType::Notify => self.on_notify(p, h),
            FrameType::Withdraw => self.on_withdraw(now, p, h),
            FrameType::Hello | FrameType::Ack => {}
        }
    }

    // --------------------------------------------------------------- timers

    /// The earliest time at which [`handle_timeout`](Self::handle_timeout) has work, or
    /// `None` when nothing is pending. Call after every other entry point; the answer is
    /// only valid until the next call into the core. It costs the peers whose timers
    /// changed since the last call (a deadline tree keeps the rest), so a polling loop
    /// may call it on every turn.
    #[must_use]
    #[inline]
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.closed {
            return None;
        }
        if self.dirty_len.get() != 0 {
            self.refresh_deadlines();
        }
        if cfg!(debug_assertions) {
            self.check_deadlines();
        }
        let t = self.timers.min();
        (t != Time::NEVER).then_some(t)
    }

    /// Runs the timers that are due: delayed acks, retransmission timeouts, keepalive
    /// probes and peer deadlines. Call when the time from
    /// [`poll_timeout`](Self::poll_timeout) has come (calling early is harmless).
    pub fn handle_timeout(&mut self, now: Time) {
        if self.closed {
            return;
        }
        self.refresh_deadlines();
        // Only the peers that are due, found through the tree (which the work below does
        // not change: it touches the peers, and the tree catches up at the next poll).
        let mut next = 0;
        while let Some(i) = self.timers.next_due(next, now) {
            if i >= self.peers.len() {
                break;
            }
            next = i + 1;
            let p = i as u16;
            let peer = &self.peers[p as usize];
            if self.peer_deadline(peer) > now {
                continue;
            }
            self.touch(p);
            let peer = &mut self.peers[p as usize];
            if peer.ack_at <= now {
                peer.ack_at = Time::NEVER;
                peer.ack_now = true;
            }
            if peer.rto_at <= now {
                self.on_rto(now, p);
                self.greet_all_if_learnt(now, p);
            }
            let peer = &self.peers[p as usize];
            if peer.monitored() && !peer.dead {
                if self.dead_at(peer) <= now {
                    self.declare_dead(now, p);
                    continue;
                }
                if self.probe_at(peer) <= now {
                    let peer = &mut self.peers[p as usize];
                    peer.last_probe = now;
                    if peer.epoch == 0 {
                        peer.hello_now = true;
                        peer.rtt.back_off();
                        // A peer given up and greeted again may have come
                        // back elsewhere: the first greeting went to every
                        // node, and went unanswered.
                        self.greet_all_if_learnt(now, p);
                    } else {
                        peer.ping_now = true;
                        if peer.credit_stalled && peer.inflight.is_empty() {
                            // A persist probe, as TCP's for a zero window: the
                            // receiver's store may stay full for long, so each
                            // one waits twice as long (up to `keepalive`).
                            peer.rtt.back_off();
                        }
                        self.greet_all_if_learnt(now, p);
                    }
                }
            }
            self.mark_ready(p);
        }
    }

    /// A peer whose address was learnt and that stopped answering may have
    /// come back on another one: greet everyone, so that it can answer.
    /// Stopped answering: silent for more than `keepalive`, so that a probe
    /// went unanswered. (The first probe of an idle peer, `keepalive` after
    /// its last frame, broadcast too: a HELLO to every node from every node
    /// for every peer, each `keepalive`, on a quiet cluster.)
    fn greet_all_if_learnt(&mut self, now: Time, p: u16) {
        let peer = &self.peers[p as usize];
        // (From when it was last heard, or first watched.)
        let silent = now.0.saturating_sub(peer.last_heard.max(peer.live_base).0)
            > self.cfg.keepalive.as_nanos() as u64;
        let peer = &mut self.peers[p as usize];
        if silent && peer.auto_mac && peer.mac != MacAddr::BROADCAST {
            peer.hello_now = true;
            peer.greet_all = true;
        }
    }

    // --------------------------------------------------------------- frames out

    /// Writes the next frame to send into `buf` (Ethernet and emx headers; at least
    /// [`FRAME_HEADER_LEN`] bytes) and says which payload, if any, follows it. Call
    /// until it returns `None` after every other entry point; the frames must go out in
    /// the order they come.
    ///
    /// Room in `buf` past the headers, up to one frame's payload, lets the core pack
    /// small messages queued together into one PACK frame, written whole into `buf`
    /// (then [`Transmit::header_len`] covers the records too). Give buffers of the
    /// same length every time: a lost PACK is rebuilt in the buffer of the call that
    /// sends it again.
    ///
    /// # Panics
    /// When `buf` is shorter than [`FRAME_HEADER_LEN`].
    #[must_use]
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        // (the runtime checks `may_transmit` first so as not to prepare a
        // frame buffer on every idle poll)
        assert!(buf.len() >= FRAME_HEADER_LEN, "transmit buffer too small");
        if self.closed {
            return None;
        }
        if self.may_feed() {
            self.feed_starved();
        }
        while let Some(&p) = self.ready.front() {
            // Sending arms timers; finding nothing to send may mark a stall, which
            // shortens the probe interval.
            self.touch(p);
            if let Some(t) = self.peer_transmit(now, p, buf) {
                if !self.peers[p as usize].may_transmit() {
                    // Certainly nothing more: leave the list now, so that the
                    // caller does not prepare a buffer only to learn that.
                    self.ready.pop_front();
                    self.peers[p as usize].in_ready = false;
                } else if self.ready.len() > 1 {
                    // Round robin between peers with work.
                    self.ready.pop_front();
                    self.ready.push_back(p);
                }
                return Some(t);
            }
            self.ready.pop_front();
            self.peers[p as usize].in_ready = false;
        }
        None
    }

    /// False when [`poll_transmit`](Self::poll_transmit) certainly has no frame to
    /// give (no peer has work queued), so a caller can skip preparing a frame
    /// buffer for it. True may still yield nothing.
    #[must_use]
    #[inline]
    pub fn may_transmit(&self) -> bool {
        !self.ready.is_empty() || self.may_feed()
    }

    fn base_header(&self, p: &Peer, ft: FrameType) -> Header {
        Header {
            dst_mac: p.mac,
            src_mac: self.mac,
            frame_type: ft,
            flags: match self.cfg.checksum {
                ChecksumMode::Off => 0,
                ChecksumMode::Header => flags::CSUM_HEADER,
                ChecksumMode::Full => flags::CSUM_HEADER | flags::CSUM_PAYLOAD,
            },
            cluster: self.cfg.cluster,
            payload_len: 0,
            src_node: self.local.node,
            src_ep: self.local.endpoint,
            dst_node: p.addr.node,
            dst_ep: p.addr.endpoint,
            src_epoch: p.my_epoch,
            dst_epoch: p.epoch,
            seq: 0,
            ack: p.rcv.next,
            sack: p.rcv.sack(),
            credit: p.credit_released.wrapping_add(self.peer_credit as u32),
            msg_id: 0,
            match_bits: 0,
            msg_len: 0,
            frag_offset: 0,
            frag_unit: 0,
        }
    }

    fn peer_transmit(&mut self, now: Time, p: u16, buf: &mut [u8]) -> Option<Transmit> {
        let peer = &self.peers[p as usize];
        if peer.dead {
            // Only the HELLO that answers its old session's frames goes to a dead peer.
            return peer
                .hello_now
                .then(|| self.emit_control(p, FrameType::Hello, false, buf));
        }
        if peer.epoch == 0 || peer.hello_now {
            if peer.hello_now {
                return Some(self.emit_control(p, FrameType::Hello, false, buf));
            }
            return None;
        }
        // Retransmissions first: they hold the window back. (A PACK is rebuilt in `buf`:
        // one that does not fit a shorter buffer than it was built in waits.)
        let room = buf.len() - FRAME_HEADER_LEN;
        if peer.lost > 0 {
            let mut i = peer.inflight.head;
            while i != NIL
                && !(self.frames[i as usize].lost
                    && (self.frames[i as usize].kind != FrameType::Pack
                        || self.frames[i as usize].offset <= room as u64))
            {
                i = self.frame_links.next(i);
            }
            if i != NIL {
                let peer = &mut self.peers[p as usize];
                peer.lost -= 1;
                peer.stats.retransmits += 1;
                let f = &mut self.frames[i as usize];
                f.lost = false;
                f.retx = f.retx.saturating_add(1);
                f.sent_at = now;
                return Some(self.emit_reliable(now, p, i, buf));
            }
        }
        let una = if peer.inflight.is_empty() {
            peer.snd_next
        } else {
            self.frames[peer.inflight.head as usize].seq
        };
        let window_open = peer.snd_next.wrapping_sub(una) < self.cfg.window;
        let has_new = !peer.ctrl.is_empty() || !peer.pulls.is_empty() || peer.cursor != NIL;
        if window_open && has_new {
            if let Some(i) = self.next_new_frame(p, room) {
                let peer = &mut self.peers[p as usize];
                let f = &mut self.frames[i as usize];
                f.seq = peer.snd_next;
                f.sent_at = now;
                f.lost = false;
                f.retx = 0;
                peer.snd_next = peer.snd_next.wrapping_add(1);
                if peer.inflight.is_empty() {
                    peer.progress_at = now;
                    // Its timer starts from the estimate: with nothing in
                    // flight, any backoff is that of persist probes or
                    // HELLOs, which lost nothing of ours (a lone PULL to a
                    // peer we are stalled on waited `rto_max` once lost).
                    peer.rtt.reset_backoff();
                }
                peer.window_stalled = false;
                self.frame_links.push_back(&mut peer.inflight, i);
                return Some(self.emit_reliable(now, p, i, buf));
            }
            let peer = &mut self.peers[p as usize];
            if self.frame_free.available() == 0 && !peer.frame_starved {
                peer.frame_starved = true;
                self.starved_peers.push_back(p);
            }
        } else if has_new {
            // Count each stall once, not each time the transmit path finds it.
            let peer = &mut self.peers[p as usize];
            if !peer.window_stalled {
                peer.window_stalled = true;
                peer.stats.window_stalls += 1;
            }
        }
        let peer = &self.peers[p as usize];
        if peer.ack_now || peer.ping_now {
            let ping = peer.ping_now;
            return Some(self.emit_control(p, FrameType::Ack, ping, buf));
        }
        None
    }

    /// Picks the next new reliable frame of peer `p`: control frames first, then
    /// rendezvous data and the next message's first-pass frames (credit permitting) in
    /// turn. `room` is the payload a frame built now can hold in place (for a PACK).
    fn next_new_frame(&mut self, p: u16, room: usize) -> Option<u32> {
        let peer = &mut self.peers[p as usize];
        if let Some(i) = self.frame_links.pop_front(&mut peer.ctrl) {
            let f = self.frames[i as usize];
            if f.kind == FrameType::Pull {
                self.pull_leaves(p, &f);
            }
            return Some(i);
        }
        // Rendezvous data and new messages take turns, so that a long transfer does not
        // hold back the small messages queued behind it.
        peer.msgs_turn = !peer.msgs_turn;
        if peer.msgs_turn {
            if let Some(i) = self.next_message_frame(p, room) {
                return Some(i);
            }
            self.rndv_next_data_frame(p)
        } else {
            if let Some(i) = self.rndv_next_data_frame(p) {
                return Some(i);
            }
            self.next_message_frame(p, room)
        }
    }

    /// Charges send `s_idx` to peer `p` against the peer's credit, when it can be.
    fn charge(&mut self, p: u16, s_idx: u32) -> bool {
        let charge = self.sends[s_idx as usize].charge();
        let peer = &mut self.peers[p as usize];
        let avail = peer.credit_limit.wrapping_sub(peer.credit_used) as i32;
        if !peer.credit_known || avail < charge as i32 {
            peer.credit_stalled = true;
            if peer.stalled_send != s_idx {
                peer.stalled_send = s_idx;
                peer.stats.credit_stalls += 1;
            }
            return false;
        }
        peer.stalled_send = NIL;
        peer.credit_used = peer.credit_used.wrapping_add(charge);
        self.sends[s_idx as usize].started = true;
        true
    }

    /// Whether send `s` is a small eager message nothing of which left yet.
    #[inline]
    fn packable(&self, s: &SendSlot<S>) -> bool {
        !s.rndv && s.emitted == 0 && s.len <= u64::from(self.cfg.pack_below)
    }

    /// How many messages go in one PACK, starting with the charged send `first` at
    /// peer `p`'s cursor, in `room` bytes of payload: the queued messages that follow
    /// it while they are packable, fit, and can be charged (they are charged here).
    /// Below 2, `first` leaves in a frame of its own. Returns the count and the bytes.
    fn pack_run(&mut self, p: u16, first: u32, room: usize) -> (u32, usize) {
        let s = &self.sends[first as usize];
        let room = room.min(self.max_payload);
        if self.cfg.pack_max < 2 || !self.packable(s) {
            return (1, 0);
        }
        let mut used = PACK_RECORD_LEN + s.len as usize;
        if used > room {
            return (1, 0);
        }
        let (mut n, mut j) = (1u32, first);
        while n < u32::from(self.cfg.pack_max) {
            let k = self.send_links.next(j);
            if k == NIL {
                break;
            }
            let t = &self.sends[k as usize];
            let need = PACK_RECORD_LEN + t.len as usize;
            if t.started || !self.packable(t) || used + need > room || !self.charge(p, k) {
                break;
            }
            used += need;
            n += 1;
            j = k;
        }
        (n, used)
    }

    fn next_message_frame(&mut self, p: u16, room: usize) -> Option<u32> {
        let s_idx = self.peers[p as usize].cursor;
        if s_idx == NIL {
            return None;
        }
        if !self.sends[s_idx as usize].started && !self.charge(p, s_idx) {
            return None;
        }
        let i = self.frame_free.alloc()?;
        let (n, bytes) = self.pack_run(p, s_idx, room);
        if n > 1 {
            // Every message of the run leaves whole in this frame.
            let mut j = s_idx;
            for _ in 0..n {
                let s = &mut self.sends[j as usize];
                s.emitted = s.len;
                s.first_pass_done = true;
                s.inflight += 1;
                j = self.send_links.next(j);
            }
            self.frames[i as usize] = TxFrame {
                seq: 0,
                kind: FrameType::Pack,
                lost: false,
                retx: 0,
                sent_at: Time::ZERO,
                slot: s_idx,
                msg_id: self.sends[s_idx as usize].msg_id,
                offset: bytes as u64,
                len: n,
            };
            let peer = &mut self.peers[p as usize];
            peer.cursor = j;
            peer.stats.msgs_packed += u64::from(n);
            return Some(i);
        }
        let max_payload = self.max_payload as u64;
        let s = &mut self.sends[s_idx as usize];
        let (kind, offset, len) = if s.rndv {
            s.first_pass_done = true;
            (FrameType::Rts, 0, 0)
        } else {
            let off = s.emitted;
            let len = (s.len - off).min(max_payload);
            s.emitted += len;
            if s.emitted == s.len {
                s.first_pass_done = true;
            }
            (FrameType::Eager, off, len as u32)
        };
        s.inflight += 1;
        let done = s.first_pass_done;
        self.frames[i as usize] = TxFrame {
            seq: 0,
            kind,
            lost: false,
            retx: 0,
            sent_at: Time::ZERO,
            slot: s_idx,
            msg_id: s.msg_id,
            offset,
            len,
        };
        if done {
            self.peers[p as usize].cursor = self.send_links.next(s_idx);
        }
        Some(i)
    }

    /// Writes reliable frame `i` (new or retransmitted) to `buf`.
    fn emit_reliable(&mut self, now: Time, p: u16, i: u32, buf: &mut [u8]) -> Transmit {
        let f = self.frames[i as usize];
        let peer = &self.peers[p as usize];
        let mut h = self.base_header(peer, f.kind);
        h.seq = f.seq;
        h.msg_id = f.msg_id;
        let mut payload = None;
        // Bytes written behind the header: PACK records, or a short payload.
        let mut inline = 0;
        match f.kind {
            FrameType::Eager | FrameType::Rts | FrameType::PullData => {
                let s = &self.sends[f.slot as usize];
                h.match_bits = s.match_bits;
                h.msg_len = s.len;
                h.frag_offset = f.offset;
                h.frag_unit = self.max_payload as u16;
                h.payload_len = f.len as u16;
                let len = f.len as usize;
                if f.kind != FrameType::Rts {
                    if len < self.copy_below && FRAME_HEADER_LEN + len <= buf.len() {
                        // Short: copied in place, behind the header.
                        let data = s.buf.as_ref().expect("a send in flight is live").as_ref();
                        let at = f.offset as usize;
                        buf[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len]
                            .copy_from_slice(&data[at..at + len]);
                        inline = len;
                    } else {
                        payload = Some(PayloadRef {
                            req: RequestId::send(f.slot, s.gen),
                            offset: f.offset,
                            len: f.len,
                        });
                    }
                }
            }
            FrameType::Pull => {
                h.frag_offset = f.offset;
                h.msg_len = f.len as u64;
            }
            FrameType::Notify if f.len != 0 => h.flags |= flags::WITHDRAWN,
            FrameType::Pack => {
                // The records, written in place behind the header (the messages
                // are still queued, side by side, from `slot` on).
                let out = &mut buf[FRAME_HEADER_LEN..];
                let mut j = f.slot;
                for _ in 0..f.len {
                    let s = &self.sends[j as usize];
                    let data = s.buf.as_ref().expect("a packed send is live").as_ref();
                    inline += write_pack_record(&mut out[inline..], s.match_bits, data);
                    j = self.send_links.next(j);
                }
                debug_assert_eq!(inline as u64, f.offset);
                h.msg_len = u64::from(f.len);
                h.payload_len = inline as u16;
                if h.flags & flags::CSUM_HEADER != 0 {
                    // The records are headers too.
                    h.flags |= flags::CSUM_PAYLOAD;
                }
            }
            _ => {}
        }
        if self.peers[p as usize].rto_at == Time::NEVER {
            let rto = self.peers[p as usize].rtt.rto(self.rto_cap);
            self.peers[p as usize].rto_at = now + rto;
        }
        let mut t = self.finish_emit(p, &h, buf, payload, inline);
        // The messages' bytes: a PACK's records, their headers besides.
        t.copied = if f.kind == FrameType::Pack {
            inline - f.len as usize * PACK_RECORD_LEN
        } else {
            inline
        };
        t
    }

    fn emit_control(&mut self, p: u16, ft: FrameType, ping: bool, buf: &mut [u8]) -> Transmit {
        let peer = &mut self.peers[p as usize];
        match ft {
            FrameType::Hello => {
                peer.hello_now = false;
                peer.stats.hellos_sent += 1;
            }
            _ => {
                peer.stats.acks_sent += 1;
                if ping {
                    peer.ping_now = false;
                    peer.stats.keepalives_sent += 1;
                }
            }
        }
        let peer = &self.peers[p as usize];
        let mut h = self.base_header(peer, ft);
        // A HELLO asks for an answer while it lacks what only a frame naming
        // our epoch gives: the peer's epoch, or its credit (learnt from its
        // greeting, which did not know ours, we would otherwise wait for a
        // persist probe before our first message).
        if ping || (ft == FrameType::Hello && (peer.epoch == 0 || !peer.credit_known)) {
            h.flags |= flags::ACK_REQ;
        }
        if ft == FrameType::Hello && peer.hello_blind {
            h.dst_epoch = 0;
            h.flags |= flags::ACK_REQ;
            self.peers[p as usize].hello_blind = false;
        }
        let peer = &self.peers[p as usize];
        if ft == FrameType::Hello && peer.greet_all {
            // The learnt address may be stale (the peer came back elsewhere).
            h.dst_mac = MacAddr::BROADCAST;
            self.peers[p as usize].greet_all = false;
        }
        self.finish_emit(p, &h, buf, None, 0)
    }

    /// Writes the header; `inline` bytes written after it already (a PACK's records)
    /// belong to the frame.
    fn finish_emit(
        &mut self,
        p: u16,
        h: &Header,
        buf: &mut [u8],
        payload: Option<PayloadRef>,
        inline: usize,
    ) -> Transmit {
        let n = h.emit(buf, self.cfg.ethertype);
        if h.flags & flags::CSUM_HEADER != 0 {
            let (head, rest) = buf.split_at_mut(n);
            let data = match payload {
                _ if h.flags & flags::CSUM_PAYLOAD == 0 => &[][..],
                Some(pr) => self.payload(&pr).expect("payload of a live send"),
                None => &rest[..inline],
            };
            Frame::new_unchecked(head).fill_checksum(data);
        }
        let n = n + inline;
        let peer = &mut self.peers[p as usize];
        if h.dst_epoch != 0 {
            peer.credit_advertised = h.credit;
            // Every frame carries the ack: nothing more is owed.
            peer.ack_now = false;
            peer.ack_at = Time::NEVER;
            peer.unacked = 0;
        }
        peer.stats.frames_sent += 1;
        peer.stats.bytes_sent += (n + payload.map_or(0, |p| p.len as usize)) as u64;
        Transmit {
            peer: PeerId(p),
            header_len: n,
            payload,
            copied: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{LinkConfig, Sim};
    use std::time::Duration;

    fn addr(i: u16) -> Addr {
        Addr::new(i + 1, 0)
    }

    fn mac(i: u8) -> MacAddr {
        MacAddr([2, 0, 0, 0, 0, i + 1])
    }

    /// A frame that claims a peer from a new address and a new epoch, but is
    /// refused (its epoch for us is not ours), leaves the peer's learnt
    /// address alone: it used to move the peer to the sender's address, so
    /// the peer's own frames were then dropped and the session died.
    #[test]
    fn a_refused_frame_teaches_no_address() {
        let cfg = unchecked();
        let mut sim: Sim<Vec<u8>, Vec<u8>> = Sim::new(LinkConfig::default());
        let mut a = Core::new(cfg.clone(), addr(0), mac(0), 1, Time::ZERO).unwrap();
        a.add_peer(addr(1), MacAddr::BROADCAST).unwrap();
        sim.add_core(a);
        let mut b = Core::new(cfg.clone(), addr(1), mac(1), 1, Time::ZERO).unwrap();
        b.add_peer(addr(0), mac(0)).unwrap();
        sim.add_core(b);
        let now = sim.now();
        sim.core(1).send(now, addr(0), 7, vec![1u8; 8], 0).unwrap();
        let r = sim
            .core(0)
            .post_recv(now, Some(addr(1)), 7, !0, vec![0; 8], 0)
            .unwrap();
        let mut got = false;
        assert!(sim.run_until(Time::from_micros(100_000), |sim| {
            while let Some(c) = sim.core(0).poll_completion() {
                got |= matches!(c, Completion::Recv(d) if d.req == r);
            }
            got
        }));
        let peer_mac = |sim: &mut Sim<Vec<u8>, Vec<u8>>| {
            sim.core_ref(0)
                .peers()
                .find(|&(_, a, _)| a == addr(1))
                .map(|(_, _, m)| m)
        };
        assert_eq!(peer_mac(&mut sim), Some(mac(1)), "learnt from its frames");
        let buf = hand_frame(&cfg, 1, FrameType::Ack, 0, &[], &|h| {
            h.src_mac = MacAddr([2, 0, 0, 0, 0, 99]);
            h.src_epoch = 2;
            h.dst_epoch = 12345;
            h.msg_len = 0;
            h.match_bits = 0;
        });
        let now = sim.now();
        assert_eq!(
            sim.core(0).handle_frame(now, &buf),
            Err(DropReason::StaleEpoch)
        );
        assert_eq!(
            peer_mac(&mut sim),
            Some(mac(1)),
            "the forged address is not kept"
        );
    }

    /// The envelope table is sized for a full store (about 263,000 entries
    /// at the default 64 MiB) but written only as far as messages have
    /// waited at once: a core that never held an unexpected message holds
    /// no envelope, and one that held a few holds that many, however many
    /// came and went.
    #[test]
    fn envelopes_are_written_as_far_as_messages_wait() {
        let cfg = CoreConfig::default();
        let mut sim: Sim<Vec<u8>, Vec<u8>> = Sim::new(LinkConfig::default());
        for i in 0..2u16 {
            let mut c = Core::new(cfg.clone(), addr(i), mac(i as u8), 1, Time::ZERO).unwrap();
            c.add_peer(addr(1 - i), mac(1 - i as u8)).unwrap();
            sim.add_core(c);
        }
        assert!(sim.core_ref(1).msg_free.size() > 200_000);
        assert_eq!(sim.core_ref(1).msgs.len(), 0);
        let mut taken = 0;
        for round in 0..5u64 {
            // Three messages arrive before their receives.
            let now = sim.now();
            for k in 0..3 {
                sim.core(0)
                    .send(now, addr(1), round * 3 + k, vec![k as u8; 8], 0)
                    .unwrap();
            }
            assert!(sim.run_until(sim.now() + Duration::from_millis(50), |sim| {
                sim.core_ref(1).unexpected.len == 3
            }));
            let now = sim.now();
            for k in 0..3 {
                sim.core(1)
                    .post_recv(now, None, round * 3 + k, !0, vec![0; 8], 0)
                    .unwrap();
            }
            while let Some(c) = sim.core(1).poll_completion() {
                taken += usize::from(matches!(c, Completion::Recv(d) if d.result.is_ok()));
            }
            assert_eq!(sim.core_ref(1).msgs.len(), 3, "round {round}");
        }
        assert_eq!(taken, 15);
    }

    /// The default configuration without checksums, for frames built by hand.
    fn unchecked() -> CoreConfig {
        CoreConfig {
            checksum: ChecksumMode::Off,
            ..CoreConfig::default()
        }
    }

    /// A frame from core `from` (0 or 1) to the other, built by hand: epoch 5
    /// to epoch 1, message 0, bits 7, 1 MiB, in fragments of 1000 bytes,
    /// changed by `f`.
    fn hand_frame(
        cfg: &CoreConfig,
        from: u8,
        frame_type: FrameType,
        seq: u32,
        payload: &[u8],
        f: &dyn Fn(&mut Header),
    ) -> Vec<u8> {
        let (a, b) = (u16::from(from), 1 - u16::from(from));
        let mut h = Header {
            dst_mac: mac(1 - from),
            src_mac: mac(from),
            frame_type,
            cluster: cfg.cluster,
            payload_len: payload.len() as u16,
            src_node: addr(a).node,
            src_ep: addr(a).endpoint,
            dst_node: addr(b).node,
            dst_ep: addr(b).endpoint,
            src_epoch: 5,
            // B's (its epoch, 1): data flows once A knows it.
            dst_epoch: 1,
            seq,
            msg_id: 0,
            match_bits: 7,
            msg_len: 1 << 20,
            frag_unit: match frame_type {
                FrameType::Eager | FrameType::Rts | FrameType::PullData => 1000,
                _ => 0,
            },
            ..Header::EMPTY
        };
        f(&mut h);
        let mut buf = vec![0u8; crate::wire::FRAME_HEADER_LEN + payload.len()];
        h.emit(&mut buf, cfg.ethertype);
        buf[crate::wire::FRAME_HEADER_LEN..].copy_from_slice(payload);
        buf
    }

    /// B, with checksums off, greeted by A's HELLO.
    fn greeted_b(cfg: &CoreConfig, now: Time) -> Core<Vec<u8>, Vec<u8>> {
        let mut b: Core<Vec<u8>, Vec<u8>> =
            Core::new(cfg.clone(), addr(1), mac(1), 1, Time::ZERO).unwrap();
        b.add_peer(addr(0), mac(0)).unwrap();
        let hello = hand_frame(cfg, 0, FrameType::Hello, 0, &[], &|h| {
            h.msg_len = 0;
            h.match_bits = 0;
            h.dst_epoch = 0;
        });
        assert_eq!(b.handle_frame(now, &hello), Ok(()));
        b
    }

    /// Acks that acknowledge frames never sent are refused, and change
    /// nothing: a cumulative ack half the sequence space ahead (serial order
    /// took it for an old one, and every frame in flight for acknowledged:
    /// their sends completed though the receiver never got them), a
    /// selective ack of a frame not sent yet, and a credit limit beyond any
    /// a receiver grants (it would have stood for the rest of the session).
    #[test]
    fn acks_of_frames_never_sent_are_refused() {
        let cfg = unchecked();
        let now = Time::from_micros(10);
        let mut b: Core<Vec<u8>, Vec<u8>> =
            Core::new(cfg.clone(), addr(1), mac(1), 1, Time::ZERO).unwrap();
        b.add_peer(addr(0), mac(0)).unwrap();
        let hello = hand_frame(&cfg, 0, FrameType::Hello, 0, &[], &|h| {
            h.msg_len = 0;
            h.match_bits = 0;
            h.dst_epoch = 0;
            h.credit = 1 << 20;
        });
        assert_eq!(b.handle_frame(now, &hello), Ok(()));
        let ack = |ack: u32, sack: u64, credit: u32| {
            hand_frame(&cfg, 0, FrameType::Ack, 0, &[], &move |h| {
                h.msg_len = 0;
                h.match_bits = 0;
                h.ack = ack;
                h.sack = sack;
                h.credit = credit;
            })
        };
        // A's first frame to B's epoch grants the credit.
        let credit = 1 << 20;
        assert_eq!(b.handle_frame(now, &ack(0, 0, credit)), Ok(()));
        // Three frames in flight, seq 0 to 2 (too long to be packed), after
        // B's HELLO.
        for i in 0..3u8 {
            b.send(now, addr(0), 7, vec![i; 1000], u64::from(i))
                .unwrap();
        }
        let mut buf = vec![0u8; 9216];
        let mut sent = Vec::new();
        while let Some(t) = b.poll_transmit(now, &mut buf) {
            // (the payload is attached, not in `buf`)
            let f = crate::wire::Frame::new_unchecked(&buf[..t.header_len]);
            sent.push(FrameType::from_u8(f.frame_type_raw()).unwrap());
        }
        assert_eq!(
            sent,
            [
                FrameType::Hello,
                FrameType::Eager,
                FrameType::Eager,
                FrameType::Eager
            ]
        );
        let used = b.peers[0].credit_used;
        let lie = Err(DropReason::Protocol);
        for (what, frame, taken) in [
            ("half the space ahead", ack(1 << 31, 0, credit), lie),
            // By serial order an old ack (frames come out of order): taken,
            // it acknowledges nothing.
            ("just past half", ack((1 << 31) + 1, 0, credit), Ok(())),
            ("past the last sent", ack(4, 0, credit), lie),
            ("a selective ack of seq 3", ack(0, 0b100, credit), lie),
            ("one of seq 4 after all sent", ack(3, 0b1, credit), lie),
            (
                "a credit beyond any grant",
                ack(0, 0, used.wrapping_add((1 << 30) + 1)),
                lie,
            ),
        ] {
            assert_eq!(b.handle_frame(now, &frame), taken, "{what}");
            assert!(b.poll_completion().is_none(), "{what}: a send completed");
        }
        // The truth is taken: seq 0 cumulatively, seq 2 selectively.
        assert_eq!(b.handle_frame(now, &ack(1, 0b1, credit)), Ok(()));
        let mut done = Vec::new();
        while let Some(c) = b.poll_completion() {
            match c {
                Completion::Send(s) => done.push(s.ctx),
                Completion::Recv(_) => panic!("no receive was posted"),
            }
        }
        done.sort();
        assert_eq!(done, [0, 2]);
    }

    /// An RTS is taken only while the frame table has room for its pulls
    /// and NOTIFY beyond the slack: refused (unacknowledged) it comes again,
    /// where a NOTIFY that found no frame was lost for good.
    #[test]
    fn an_rts_waits_for_room_in_the_frame_table() {
        let cfg = unchecked();
        let now = Time::from_micros(10);
        let mut b = greeted_b(&cfg, now);
        let need = cfg.pull_inflight as usize + 1 + 64;
        let mut taken = Vec::new();
        while b.frame_free.available() >= need {
            taken.push(b.frame_free.alloc().unwrap());
        }
        let rts = hand_frame(&cfg, 0, FrameType::Rts, 0, &[], &|_| {});
        assert_eq!(b.handle_frame(now, &rts), Err(DropReason::Resources));
        b.frame_free.release(taken.pop().unwrap());
        assert_eq!(b.handle_frame(now, &rts), Ok(()));
    }

    /// A closed core is gone to its peers: it answers no frame, sends
    /// nothing, runs no timer and takes no request.
    #[test]
    fn a_closed_core_answers_nothing() {
        let cfg = unchecked();
        let now = Time::from_micros(10);
        let mut b = greeted_b(&cfg, now);
        let eager = hand_frame(&cfg, 0, FrameType::Eager, 0, &[1; 8], &|h| h.msg_len = 8);
        let r = b.post_recv(now, None, 9, !0, vec![0u8; 8], 0).unwrap();
        b.close(now);
        assert!(b.is_closed());
        assert!(
            matches!(b.poll_completion(), Some(Completion::Recv(d)) if d.req == r && d.result == Err(RequestError::Aborted)),
            "what it held is aborted"
        );
        assert_eq!(b.handle_frame(now, &eager), Err(DropReason::NotForUs));
        assert_eq!(b.poll_timeout(), None);
        b.handle_timeout(now + Duration::from_secs(100));
        assert!(!b.may_transmit(), "no timer ran");
        assert!(b.poll_transmit(now, &mut [0u8; 9216]).is_none());
        let e = b.post_recv(now, None, 7, !0, vec![0u8; 8], 0).unwrap_err();
        assert_eq!(e.error, RecvError::Closed);
        let e = b.send(now, addr(0), 7, vec![0u8; 8], 0).unwrap_err();
        assert_eq!(e.error, SendError::Closed);
        assert_eq!(b.stats().dropped.get(DropReason::NotForUs), 1);
    }

    /// A closing core takes no new message (unacknowledged, the sender
    /// keeps it) but acknowledges what it took, a frame that comes again
    /// included, and says when it owes nothing more.
    #[test]
    fn a_closing_core_takes_no_new_message_and_acknowledges_the_rest() {
        let cfg = unchecked();
        let now = Time::from_micros(10);
        let mut b = greeted_b(&cfg, now);
        // Frame `seq`: message `id` of `len` bytes, the fragment at `off`.
        let eager = |seq: u32, id: u32, len: u64, off: u64| {
            let n = (len - off).min(1000) as usize;
            hand_frame(&cfg, 0, FrameType::Eager, seq, &vec![1; n], &move |h| {
                h.msg_len = len;
                h.msg_id = id;
                h.frag_offset = off;
            })
        };
        let mut buf = vec![0u8; 9216];
        while b.poll_transmit(now, &mut buf).is_some() {}
        assert_eq!(b.handle_frame(now, &eager(0, 0, 8, 0)), Ok(()));
        assert_eq!(b.handle_frame(now, &eager(1, 1, 2000, 0)), Ok(()));
        assert!(!b.is_closing());
        b.begin_close(now);
        assert!(b.is_closing() && !b.is_closed());
        assert!(!b.owes_nothing(), "the acknowledgements of frames 0 and 1");
        assert_eq!(
            b.handle_frame(now, &eager(2, 2, 8, 0)),
            Err(DropReason::NotForUs),
            "a new message"
        );
        assert_eq!(
            b.handle_frame(now, &eager(3, 1, 2000, 1000)),
            Ok(()),
            "the rest of a message that was arriving"
        );
        assert_eq!(
            b.handle_frame(now, &eager(0, 0, 8, 0)),
            Ok(()),
            "a duplicate"
        );
        let e = b.send(now, addr(0), 7, vec![0u8; 8], 0).unwrap_err();
        assert_eq!(e.error, SendError::Closed);
        // The acknowledgement leaves (now, or with the delayed-ack timer).
        let later = now + cfg.ack_delay;
        if b.poll_timeout().is_some_and(|t| t <= later) {
            b.handle_timeout(later);
        }
        let mut acked = None;
        while let Some(t) = b.poll_transmit(later, &mut buf) {
            let f = crate::wire::Frame::new_checked(&buf[..t.header_len]).unwrap();
            let h = Header::parse(&f, cfg.ethertype, false).unwrap();
            acked = Some((h.ack, h.sack));
        }
        assert_eq!(acked, Some((2, 1)), "frames 0, 1 and 3 acknowledged, not 2");
        assert!(b.owes_nothing());
    }

    /// A frame a closing core refuses still acknowledges the core's own
    /// frames: a peer streaming to it acknowledges its NOTIFYs on nothing else.
    #[test]
    fn a_closing_core_takes_the_acks_of_frames_it_refuses() {
        let cfg = unchecked();
        let now = Time::from_micros(10);
        let mut b = greeted_b(&cfg, now);
        let mut buf = vec![0u8; 9216];
        let rts = hand_frame(&cfg, 0, FrameType::Rts, 0, &[], &|_| {});
        assert_eq!(b.handle_frame(now, &rts), Ok(()));
        b.post_recv(now, Some(addr(0)), 7, !0, vec![0u8; 1 << 20], 0)
            .unwrap();
        // Its PULLs leave, then the close aborts the receive: its NOTIFY too.
        while b.poll_transmit(now, &mut buf).is_some() {}
        b.begin_close(now);
        while b.poll_transmit(now, &mut buf).is_some() {}
        let sent = b.peer_info(PeerId(0)).unwrap().snd_next;
        assert!(sent >= 2, "PULLs and the NOTIFY left");
        assert!(!b.owes_nothing(), "its frames are unacknowledged");
        // A's next message, refused, acknowledges them all.
        let eager = hand_frame(&cfg, 0, FrameType::Eager, 1, &[1; 8], &move |h| {
            h.msg_len = 8;
            h.msg_id = 1;
            h.ack = sent;
        });
        assert_eq!(b.handle_frame(now, &eager), Err(DropReason::NotForUs));
        assert_eq!(b.peer_info(PeerId(0)).unwrap().in_flight, 0);
        while b.poll_transmit(now, &mut buf).is_some() {}
        assert!(b.owes_nothing());
    }

    /// B (greeted) with A's messages 0 and 1 announced (RTS) and its frame
    /// table taken (the frames are returned): a truncating receive took
    /// message 0 (done, its NOTIFY waiting) and a whole one message 1 (its
    /// pull waiting; the receive's id is returned).
    fn starved_b(cfg: &CoreConfig, now: Time) -> (Core<Vec<u8>, Vec<u8>>, Vec<u32>, RequestId) {
        let mut b = greeted_b(cfg, now);
        for id in 0..2 {
            let rts = hand_frame(cfg, 0, FrameType::Rts, id, &[], &move |h| h.msg_id = id);
            assert_eq!(b.handle_frame(now, &rts), Ok(()));
        }
        let mut taken = Vec::new();
        while let Some(i) = b.frame_free.alloc() {
            taken.push(i);
        }
        b.post_recv(now, Some(addr(0)), 7, !0, Vec::new(), 0)
            .unwrap();
        let r = b
            .post_recv(now, Some(addr(0)), 7, !0, vec![0u8; 1 << 20], 0)
            .unwrap();
        (b, taken, r)
    }

    /// A rendezvous receive bound while the frame table is full (NOTIFYs
    /// waiting for a closed window can fill it) used to lose its NOTIFY, so
    /// that the sender's send never completed, or to issue no pull at all,
    /// so that the receive never completed. Both now wait for frames, and
    /// RTSes are refused meanwhile (which bounds the NOTIFYs waiting).
    #[test]
    fn work_that_finds_the_frame_table_full_waits_for_frames() {
        let cfg = unchecked();
        let now = Time::from_micros(10);
        let (mut b, taken, _) = starved_b(&cfg, now);
        assert!(
            matches!(b.poll_completion(), Some(Completion::Recv(d)) if d.result.is_ok()),
            "the truncating receive is done"
        );
        let rts = |id: u32| hand_frame(&cfg, 0, FrameType::Rts, id, &[], &move |h| h.msg_id = id);
        for i in taken {
            b.frame_free.release(i);
        }
        assert_eq!(
            b.handle_frame(now, &rts(2)),
            Err(DropReason::Resources),
            "no RTS while work waits for frames"
        );
        let mut buf = vec![0u8; 9216];
        let mut sent = Vec::new();
        while let Some(t) = b.poll_transmit(now, &mut buf) {
            let f = crate::wire::Frame::new_checked(&buf[..t.header_len]).unwrap();
            let h = Header::parse(&f, cfg.ethertype, false).unwrap();
            sent.push((h.frame_type, h.msg_id));
        }
        assert!(sent.contains(&(FrameType::Notify, 0)), "sent {sent:?}");
        assert!(sent.contains(&(FrameType::Pull, 1)), "sent {sent:?}");
        assert!(!b.starving());
        assert_eq!(b.handle_frame(now, &rts(2)), Ok(()));
    }

    /// Work waiting for frames goes with what it was for: a receive aborted
    /// leaves the pull list, and a peer that restarts takes its NOTIFYs
    /// (the new session's message ids are not the old ones).
    #[test]
    fn waiting_work_goes_with_its_receive_and_its_session() {
        let cfg = unchecked();
        let now = Time::from_micros(10);
        let (mut b, taken, r) = starved_b(&cfg, now);
        assert!(!b.starved_pulls.is_empty() && !b.starved_notifies.is_empty());
        b.abort_all(now);
        assert!(b.starved_pulls.is_empty(), "the aborted receive left");
        let mut aborted = false;
        while let Some(c) = b.poll_completion() {
            aborted |= matches!(c, Completion::Recv(d) if d.req == r && d.result == Err(RequestError::Aborted));
        }
        assert!(aborted);
        // Its NOTIFY and the truncated one wait; A restarts (a later epoch).
        assert_eq!(b.starved_notifies.len(), 2);
        let hello = hand_frame(&cfg, 0, FrameType::Hello, 0, &[], &|h| {
            h.src_epoch = 6;
            h.dst_epoch = 0;
            h.msg_len = 0;
            h.match_bits = 0;
        });
        assert_eq!(b.handle_frame(now, &hello), Ok(()));
        assert!(
            b.starved_notifies.is_empty(),
            "the old session's NOTIFYs went"
        );
        for i in taken {
            b.frame_free.release(i);
        }
        let mut buf = vec![0u8; 9216];
        while let Some(t) = b.poll_transmit(now, &mut buf) {
            let f = crate::wire::Frame::new_checked(&buf[..t.header_len]).unwrap();
            let h = Header::parse(&f, cfg.ethertype, false).unwrap();
            assert_ne!(h.frame_type, FrameType::Notify);
        }
    }

    /// A message that finds the frame table full leaves once frames are
    /// free. Its peer used to leave the transmit queue then, and came back
    /// only with a frame from the peer or a timer (a keepalive away).
    #[test]
    fn a_message_that_finds_the_frame_table_full_leaves_when_frames_free() {
        let cfg = unchecked();
        let now = Time::from_micros(10);
        let mut b = greeted_b(&cfg, now);
        let credit = hand_frame(&cfg, 0, FrameType::Ack, 0, &[], &|h| {
            h.credit = 1 << 20;
            h.msg_len = 0;
            h.match_bits = 0;
        });
        assert_eq!(b.handle_frame(now, &credit), Ok(()));
        let mut buf = vec![0u8; 9216];
        while b.poll_transmit(now, &mut buf).is_some() {}
        let mut taken = Vec::new();
        while let Some(i) = b.frame_free.alloc() {
            taken.push(i);
        }
        b.send(now, addr(0), 7, vec![3u8; 100], 0).unwrap();
        while b.poll_transmit(now, &mut buf).is_some() {}
        b.frame_free.release(taken.pop().unwrap());
        assert!(b.may_transmit());
        let t = b.poll_transmit(now, &mut buf).expect("the message");
        assert_eq!(t.payload.map(|p| p.len), Some(100));
        let f = crate::wire::Frame::new_unchecked(&buf[..t.header_len]);
        assert_eq!(f.frame_type_raw(), FrameType::Eager as u8);
    }

    /// PULL_DATA is taken only for what a PULL that left asked for. Data
    /// sent ahead of the pulls (by a peer that did not wait for them) used
    /// to complete blocks whose PULLs were still queued, and every completed
    /// block queued another PULL: frames without bound from the table all
    /// peers share.
    #[test]
    fn pull_data_ahead_of_the_pulls_is_refused() {
        let cfg = unchecked();
        let now = Time::from_micros(10);
        let mut b = greeted_b(&cfg, now);
        let from_a = |frame_type, seq, payload: &[u8], f: &dyn Fn(&mut Header)| {
            hand_frame(&cfg, 0, frame_type, seq, payload, f)
        };
        b.post_recv(now, Some(addr(0)), 7, !0, vec![0u8; 1 << 20], 0)
            .unwrap();
        assert_eq!(
            b.handle_frame(now, &from_a(FrameType::Rts, 0, &[], &|_| {})),
            Ok(())
        );
        // B's PULLs are queued, none has left: no data is due yet.
        let free = b.frame_free.available();
        let data = vec![9u8; 1000];
        let at = |off: u64| move |h: &mut Header| h.frag_offset = off;
        assert_eq!(
            b.handle_frame(now, &from_a(FrameType::PullData, 1, &data, &at(0))),
            Err(DropReason::Protocol)
        );
        assert_eq!(b.frame_free.available(), free, "no frame taken");
        // Once the PULLs left, the data they ask for is taken.
        let mut buf = vec![0u8; 9216];
        while b.poll_transmit(now, &mut buf).is_some() {}
        assert_eq!(
            b.handle_frame(now, &from_a(FrameType::PullData, 1, &data, &at(0))),
            Ok(())
        );
    }

    /// A fragment that repeats bytes of its message that arrived already (a
    /// new sequence number, an old offset) is refused. Counted in bytes
    /// alone, it completed the message with a hole that kept what the receive
    /// buffer held before, or, for a message in the unexpected store, what an
    /// earlier message there (another peer's) left.
    #[test]
    fn an_eager_fragment_that_overlaps_its_message_is_refused() {
        let cfg = unchecked();
        let now = Time::from_micros(10);
        for posted_first in [true, false] {
            let mut b = greeted_b(&cfg, now);
            // Fragment `k` of a 3000-byte message, every byte k + 1.
            let frag = |seq: u32, k: u64| {
                let at = move |h: &mut Header| {
                    h.msg_len = 3000;
                    h.frag_offset = k * 1000;
                };
                hand_frame(&cfg, 0, FrameType::Eager, seq, &[k as u8 + 1; 1000], &at)
            };
            let post = |b: &mut Core<Vec<u8>, Vec<u8>>| {
                b.post_recv(now, Some(addr(0)), 7, !0, vec![0u8; 3000], 0)
                    .unwrap();
            };
            if posted_first {
                post(&mut b);
            }
            assert_eq!(b.handle_frame(now, &frag(0, 0)), Ok(()));
            assert_eq!(
                b.handle_frame(now, &frag(1, 0)),
                Err(DropReason::Protocol),
                "posted first: {posted_first}"
            );
            assert_eq!(b.handle_frame(now, &frag(2, 2)), Ok(()));
            if !posted_first {
                post(&mut b);
            }
            assert!(b.poll_completion().is_none(), "a message with a hole");
            assert_eq!(b.handle_frame(now, &frag(1, 1)), Ok(()));
            let Some(Completion::Recv(d)) = b.poll_completion() else {
                panic!("the message is whole");
            };
            assert_eq!(d.result.map(|i| i.copied), Ok(3000));
            assert!(d
                .buf
                .chunks(1000)
                .zip(1u8..)
                .all(|(c, v)| c.iter().all(|&x| x == v)));
        }
    }

    /// The first fragment to arrive of an eager message, beyond what the
    /// message's record of fragments holds, is refused for now (it comes
    /// again). It was taken, and noting it indexed past the record: a panic
    /// any peer could cause with one frame.
    #[test]
    fn an_eager_message_that_starts_far_ahead_waits() {
        let cfg = unchecked();
        let now = Time::from_micros(10);
        let mut b = greeted_b(&cfg, now);
        let frag = |k: u64| {
            let at = move |h: &mut Header| {
                h.msg_len = 8192;
                h.frag_unit = 64;
                h.frag_offset = k * 64;
            };
            hand_frame(&cfg, 0, FrameType::Eager, 0, &[k as u8; 64], &at)
        };
        assert_eq!(b.handle_frame(now, &frag(64)), Err(DropReason::Resources));
        assert_eq!(b.handle_frame(now, &frag(63)), Ok(()));
    }

    /// A peer that does not answer is probed every `rto_min` at most, even
    /// with `rto_initial` 0: the timer used to be due again at once, and a
    /// HELLO left on every poll until the peer was given up.
    #[test]
    fn an_initial_rto_below_rto_min_is_taken_as_rto_min() {
        let cfg = CoreConfig {
            rto_initial: Duration::ZERO,
            ..unchecked()
        };
        let mut a: Core<Vec<u8>, Vec<u8>> = Core::new(cfg, addr(0), mac(0), 1, Time::ZERO).unwrap();
        a.add_peer(addr(1), mac(1)).unwrap();
        a.send(Time::ZERO, addr(1), 7, vec![1; 8], 0).unwrap();
        let mut buf = vec![0u8; 9216];
        let (mut now, mut sent) = (Time::ZERO, 0);
        let end = Time::from_micros(2000);
        while sent < 1000 {
            while a.poll_transmit(now, &mut buf).is_some() {
                sent += 1;
            }
            match a.poll_timeout() {
                Some(t) if t < end => {
                    now = now.max(t);
                    a.handle_timeout(now);
                }
                _ => break,
            }
        }
        // 200 us apart, backing off: a handful in 2 ms.
        assert!(sent <= 11, "{sent} frames in 2 ms");
    }

    /// Rendezvous data that repeats bytes that arrived already is refused:
    /// each block counts its bytes to know when it is done.
    #[test]
    fn pull_data_that_overlaps_is_refused() {
        let cfg = unchecked();
        let now = Time::from_micros(10);
        let mut b = greeted_b(&cfg, now);
        b.post_recv(now, Some(addr(0)), 7, !0, vec![0u8; 1 << 20], 0)
            .unwrap();
        let rts = hand_frame(&cfg, 0, FrameType::Rts, 0, &[], &|_| {});
        assert_eq!(b.handle_frame(now, &rts), Ok(()));
        let mut buf = vec![0u8; 9216];
        while b.poll_transmit(now, &mut buf).is_some() {}
        let data = |seq: u32, off: u64, len: usize| {
            let at = move |h: &mut Header| h.frag_offset = off;
            hand_frame(&cfg, 0, FrameType::PullData, seq, &vec![1; len], &at)
        };
        assert_eq!(b.handle_frame(now, &data(1, 0, 1000)), Ok(()));
        assert_eq!(
            b.handle_frame(now, &data(2, 0, 1000)),
            Err(DropReason::Protocol)
        );
        // Off the sender's grid, or short before the end.
        assert_eq!(
            b.handle_frame(now, &data(2, 500, 1000)),
            Err(DropReason::Protocol)
        );
        assert_eq!(
            b.handle_frame(now, &data(2, 2000, 500)),
            Err(DropReason::Protocol)
        );
        assert_eq!(b.handle_frame(now, &data(2, 3000, 1000)), Ok(()));
        assert_eq!(
            b.handle_frame(now, &data(3, 3000, 1000)),
            Err(DropReason::Protocol)
        );
        assert_eq!(b.handle_frame(now, &data(3, 1000, 1000)), Ok(()));
    }

    /// A request slot used more than 2^31 times still answers to its
    /// handles: handles carry 31 bits of the slot's generation, so the slot
    /// must count modulo 2^31 too. They counted all 32 bits: a ping-pong at
    /// a million round trips a second, which reuses one slot, would have
    /// got there in about 36 minutes, after which the frames of a send by
    /// reference find no buffer behind its handle and cancel refuses live
    /// receives.
    #[test]
    fn slot_generations_wrap_with_their_handles() {
        let mut sim: Sim<Vec<u8>, Vec<u8>> = Sim::new(LinkConfig::default());
        for i in 0..2u16 {
            let mut c =
                Core::new(CoreConfig::default(), addr(i), mac(i as u8), 1, Time::ZERO).unwrap();
            c.add_peer(addr(1 - i), mac(1 - i as u8)).unwrap();
            // The last generations before the handle's bits wrap.
            for s in &mut c.sends {
                s.gen = RequestId::GEN_MASK - 1;
            }
            for r in &mut c.recvs {
                r.gen = RequestId::GEN_MASK - 1;
            }
            sim.add_core(c);
        }
        // Messages sent by reference (several frames) and copied (one).
        for (round, len) in [4000usize, 8, 4000, 8].into_iter().enumerate() {
            let now = sim.now();
            let r = sim
                .core(1)
                .post_recv(now, Some(addr(0)), 7, !0, vec![0; len], 0)
                .unwrap();
            let msg: Vec<u8> = (0..len).map(|b| (b + round) as u8).collect();
            let s = sim.core(0).send(now, addr(1), 7, msg.clone(), 0).unwrap();
            assert!(sim.core_ref(0).send_buffer(s).is_some(), "round {round}");
            let (mut sent, mut got) = (false, None);
            assert!(
                sim.run_until(Time::from_micros(100_000 * (round as u64 + 1)), |sim| {
                    while let Some(c) = sim.core(0).poll_completion() {
                        if let Completion::Send(d) = c {
                            assert_eq!(d.req, s);
                            sent = d.result.is_ok();
                        }
                    }
                    while let Some(c) = sim.core(1).poll_completion() {
                        if let Completion::Recv(d) = c {
                            assert_eq!(d.req, r);
                            got = Some(d.buf);
                        }
                    }
                    sent && got.is_some()
                })
            );
            assert_eq!(got.as_ref(), Some(&msg), "round {round}");
            // A receive posted in a wrapped generation can be cancelled.
            let c = sim
                .core(1)
                .post_recv(now, Some(addr(0)), 8, !0, vec![0; 8], 0)
                .unwrap();
            assert!(sim.core(1).cancel(c), "round {round}");
            assert!(matches!(
                sim.core(1).poll_completion(),
                Some(Completion::Recv(RecvDone { req, .. })) if req == c
            ));
        }
    }

    /// A request toward a peer that is monitored already, in a session, reads
    /// no time: the runtime's clock costs about as much as the rest of such a
    /// request. The first request toward a peer starts its monitoring, and a
    /// receive that takes an unexpected message returns credit: those read it,
    /// once each.
    #[test]
    fn requests_to_a_monitored_peer_read_no_time() {
        struct Counted(Time, u32);
        impl Now for Counted {
            fn now(&mut self) -> Time {
                self.1 += 1;
                self.0
            }
        }
        let mut sim: Sim<Vec<u8>, Vec<u8>> = Sim::new(LinkConfig::default());
        for i in 0..2u16 {
            let mut c =
                Core::new(CoreConfig::default(), addr(i), mac(i as u8), 1, Time::ZERO).unwrap();
            c.add_peer(addr(1 - i), mac(1 - i as u8)).unwrap();
            sim.add_core(c);
        }
        let mut clock = Counted(sim.now(), 0);
        // Core 1 posts toward an unmonitored peer: read once.
        let first = sim
            .core(1)
            .post_recv(&mut clock, Some(addr(0)), 1, !0, vec![0; 8], 0)
            .unwrap();
        assert_eq!(clock.1, 1, "the first request reads the time");
        // A message from core 0 opens the session.
        let now = sim.now();
        sim.core(0).send(now, addr(1), 1, vec![1; 8], 0).unwrap();
        assert!(sim.run_until(Time::from_micros(100_000), |sim| {
            matches!(sim.core(1).poll_completion(), Some(Completion::Recv(d)) if d.req == first)
        }));
        // A receive posted while another is: monitored, in session.
        let mut clock = Counted(sim.now(), 0);
        let held = sim
            .core(1)
            .post_recv(&mut clock, Some(addr(0)), 2, !0, vec![0; 8], 0)
            .unwrap();
        let before = clock.1;
        sim.core(1)
            .post_recv(&mut clock, Some(addr(0)), 3, !0, vec![0; 8], 0)
            .unwrap();
        sim.core(1)
            .send(&mut clock, addr(0), 4, vec![2; 8], 0)
            .unwrap();
        assert_eq!(clock.1, before, "no time read toward a monitored peer");
        // An unexpected message taken at the post returns credit: read once.
        let now = sim.now();
        sim.core(0).send(now, addr(1), 5, vec![3; 8], 0).unwrap();
        assert!(
            sim.run_until(sim.now() + std::time::Duration::from_millis(10), |sim| {
                sim.core_ref(1).stats().unexpected > 0
            })
        );
        let mut clock = Counted(sim.now(), 0);
        sim.core(1)
            .post_recv(&mut clock, Some(addr(0)), 5, !0, vec![0; 8], 0)
            .unwrap();
        assert_eq!(clock.1, 1, "a receive that takes a message reads the time");
        assert!(sim.core(1).cancel(held));
    }

    /// A cancel that finds the frame table full waits for a frame: its
    /// WITHDRAW leaves when one frees, and the send ends cancelled. (It used
    /// to be dropped, with `cancel` answering false, so that a polling
    /// thread's cancel, already reported as queued, was lost.)
    #[test]
    fn a_withdraw_that_finds_the_frame_table_full_waits_for_a_frame() {
        let cfg = CoreConfig::default();
        let mut sim: Sim<Vec<u8>, Vec<u8>> = Sim::new(LinkConfig::default());
        for (i, j) in [(0u16, 1u16), (1, 0)] {
            let mut c = Core::new(cfg.clone(), addr(i), mac(i as u8), 1, Time::ZERO).unwrap();
            c.add_peer(addr(j), mac(j as u8)).unwrap();
            sim.add_core(c);
        }
        let now = sim.now();
        let s = sim
            .core(0)
            .send(now, addr(1), 5, vec![7u8; 1 << 20], 50)
            .unwrap();
        sim.run_until(now + Duration::from_micros(200), |_| false);
        assert!(sim.core_ref(1).probe(None, 5, !0).is_some(), "its RTS came");
        let a = sim.core(0);
        let mut taken = Vec::new();
        while let Some(f) = a.frame_free.alloc() {
            taken.push(f);
        }
        assert!(a.cancel(s), "taken, to wait for a frame");
        assert!(!a.cancel(s), "once");
        assert_eq!(a.starved_withdraws.len(), 1);
        for f in taken {
            a.frame_free.release(f);
        }
        let mut done = None;
        sim.run_until(sim.now() + Duration::from_millis(5), |sim| {
            while let Some(c) = sim.core(0).poll_completion() {
                done = Some(c);
            }
            done.is_some()
        });
        match done {
            Some(Completion::Send(d)) => assert_eq!(d.result, Err(RequestError::Cancelled)),
            other => panic!("{other:?}"),
        }
        assert!(sim.core_ref(0).starved_withdraws.is_empty());
        assert!(sim.core_ref(1).probe(None, 5, !0).is_none());
        assert_eq!(sim.core_ref(1).unexpected_bytes(), 0);
    }
}
