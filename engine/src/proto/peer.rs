//! One remote endpoint as a core sees it: session epochs, the send and receive halves of
//! the reliable stream, credits, the per-peer queues and the liveness timers, plus the
//! session lifecycle the core runs on it (involvement, probe and death deadlines, failing
//! a peer's requests, starting a session over).
//!
//! An idle peer costs `size_of::<Peer>()` bytes plus one entry in the address map, and
//! nothing else: frame records, requests and message envelopes live in shared,
//! preallocated tables and are only linked from here. This module must not emit frames.

use super::core::{Core, MsgState, NO_PEER};
use super::reliability::{RecvWindow, RttEstimator};
use super::slab::{List, NIL};
use super::stats::PeerStats;
use super::RecvBuffer;
use super::RequestError;
use super::{Addr, Now, Time};
use crate::wire::MacAddr;
use core::cell::Cell;
use core::time::Duration;

/// Session state of one peer.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    pub(crate) addr: Addr,
    pub(crate) mac: MacAddr,
    /// Added without an address: `mac` is learnt from the peer's frames.
    pub(crate) auto_mac: bool,
    /// The next HELLO goes to everyone (a learnt address may be stale).
    pub(crate) greet_all: bool,

    // Session.
    /// The peer's epoch (0: not known yet).
    pub(crate) epoch: u32,
    /// Declared unreachable; frames of `dead_epoch` to our old session are refused.
    pub(crate) dead: bool,
    pub(crate) dead_epoch: u32,
    /// Our epoch as this peer knows it: the core's own, moved on each time the peer is
    /// declared dead, so that the session that follows is new on both sides (the peer
    /// sees us restarted and fails what it had in flight to us).
    pub(crate) my_epoch: u32,

    // Send half.
    pub(crate) snd_next: u32,
    /// Reliable frames sent and not acknowledged, in sequence order.
    pub(crate) inflight: List,
    /// Control frames (pull, notify) waiting for a sequence number.
    pub(crate) ctrl: List,
    /// In-flight frames marked lost, waiting for retransmission.
    pub(crate) lost: u32,
    pub(crate) rtt: RttEstimator,
    pub(crate) rto_at: Time,
    /// Send time of the most recently sent frame that was acknowledged (loss detection).
    pub(crate) latest_acked_sent: Time,
    /// When acknowledgements last showed a frame lost (later frames arrived
    /// without it), if ever: the retransmission timeout treats a link that
    /// lost frames lately as lossy, and one that did not as slow.
    pub(crate) loss_seen_at: Option<Time>,
    /// When the oldest in-flight frame last moved: an ack made progress, or a frame went
    /// out with nothing in flight.
    pub(crate) progress_at: Time,
    pub(crate) credit_limit: u32,
    pub(crate) credit_used: u32,
    pub(crate) credit_known: bool,
    pub(crate) credit_stalled: bool,
    /// The send counted in `credit_stalls` last, until it is charged
    /// (`NIL`: none): each message counts once, however many credit
    /// updates it waits through.
    pub(crate) stalled_send: u32,
    pub(crate) window_stalled: bool,
    pub(crate) next_msg_id: u32,
    /// Sends to this peer in message order.
    pub(crate) sends: List,
    /// First send with frames still to send for the first time.
    pub(crate) cursor: u32,
    /// Rendezvous sends with pulled data to send.
    pub(crate) pulls: List,
    /// Set by [`Core::abort_all`]: our messages with ids below this one may have been
    /// abandoned in the middle of a rendezvous, so the peer's late NOTIFY for them is
    /// acknowledged and ignored instead of refused (a refused frame is sent forever).
    pub(crate) sends_aborted_below: Option<u32>,

    // Receive half.
    pub(crate) rcv: RecvWindow,
    /// When the peer's latest new reliable frame (not an ack) arrived: a peer
    /// that sends too makes this core's sends wait for the progress call
    /// that carries the acknowledgements (see `Core::send_leaves_now`).
    pub(crate) data_at: Time,
    pub(crate) unacked: u32,
    pub(crate) ack_at: Time,
    pub(crate) ack_now: bool,
    pub(crate) credit_released: u32,
    /// The credit limit in the last frame sent to the peer.
    pub(crate) credit_advertised: u32,
    /// Credit charge of this peer's messages held in the unexpected store.
    pub(crate) held: u64,
    pub(crate) next_match: u32,
    /// Message envelopes from this peer.
    pub(crate) msgs: List,
    /// How many of them are in the id map (see `InMsg::mapped`): while none
    /// is, an arriving fragment starts a message, with no lookup.
    pub(crate) mapped: u32,
    /// Set by [`Core::abort_all`]: the peer's messages with ids below this one may have
    /// lost their receive while data was still coming, so late EAGER and PULL_DATA frames
    /// of them are acknowledged and discarded instead of refused.
    pub(crate) recvs_aborted_below: Option<u32>,

    // Liveness.
    pub(crate) last_heard: Time,
    pub(crate) live_base: Time,
    pub(crate) last_probe: Time,
    pub(crate) involved: u32,
    pub(crate) hello_now: bool,
    /// The HELLO owed names no epoch of the peer's (dst 0) and asks for an
    /// answer: ours for it is stale (see `handle_peer_frame`).
    pub(crate) hello_blind: bool,
    pub(crate) ping_now: bool,
    pub(crate) in_ready: bool,
    /// In `Core::starved_peers`: it had a frame to send and the table none.
    pub(crate) frame_starved: bool,
    /// Its timers may have moved since its deadline was last put in the core's deadline
    /// tree (see [`Core::touch`]).
    pub(crate) deadline_dirty: Cell<bool>,
    /// Whose turn it is for the next new frame: messages or rendezvous data.
    pub(crate) msgs_turn: bool,

    pub(crate) stats: PeerStats,
}

impl Peer {
    pub(crate) fn new(addr: Addr, mac: MacAddr, rto_initial: Duration, my_epoch: u32) -> Self {
        Peer {
            addr,
            mac,
            auto_mac: mac == MacAddr::BROADCAST,
            greet_all: false,
            epoch: 0,
            dead: false,
            dead_epoch: 0,
            my_epoch,
            snd_next: 0,
            inflight: List::default(),
            ctrl: List::default(),
            lost: 0,
            rtt: RttEstimator::new(rto_initial),
            rto_at: Time::NEVER,
            latest_acked_sent: Time::ZERO,
            loss_seen_at: None,
            progress_at: Time::ZERO,
            credit_limit: 0,
            credit_used: 0,
            credit_known: false,
            credit_stalled: false,
            stalled_send: NIL,
            window_stalled: false,
            next_msg_id: 0,
            sends: List::default(),
            cursor: NIL,
            pulls: List::default(),
            sends_aborted_below: None,
            rcv: RecvWindow::default(),
            unacked: 0,
            ack_at: Time::NEVER,
            data_at: Time::ZERO,
            ack_now: false,
            credit_released: 0,
            credit_advertised: 0,
            held: 0,
            next_match: 0,
            msgs: List::default(),
            mapped: 0,
            recvs_aborted_below: None,
            last_heard: Time::ZERO,
            live_base: Time::ZERO,
            last_probe: Time::ZERO,
            involved: 0,
            hello_now: false,
            hello_blind: false,
            ping_now: false,
            in_ready: false,
            frame_starved: false,
            deadline_dirty: Cell::new(false),
            msgs_turn: false,
            stats: PeerStats::default(),
        }
    }

    /// Whether nothing from it was taken for longer than `d` before `now`.
    #[inline]
    pub(crate) fn silent_for(&self, now: Time, d: Duration) -> bool {
        now.0.saturating_sub(self.last_heard.0) > d.as_nanos() as u64
    }

    /// Whether something waits on this peer, so that its silence matters.
    #[inline]
    pub(crate) fn monitored(&self) -> bool {
        self.involved > 0 || !self.inflight.is_empty() || !self.ctrl.is_empty()
    }

    /// False when the transmit path certainly has no frame for this peer now:
    /// no greeting, ack or probe owed, nothing lost, and nothing new queued.
    #[inline]
    pub(crate) fn may_transmit(&self) -> bool {
        self.hello_now
            || self.ack_now
            || self.ping_now
            || self.lost > 0
            || self.cursor != NIL
            || !self.ctrl.is_empty()
            || !self.pulls.is_empty()
    }

    /// Whether `h` belongs to the session this peer was in when it was declared dead:
    /// its old epoch, and not yet addressed to our new one.
    #[inline]
    pub(crate) fn old_session(&self, h: &crate::wire::Header) -> bool {
        self.dead && h.src_epoch == self.dead_epoch && h.dst_epoch != self.my_epoch
    }

    /// Whether our message `msg_id` may have been abandoned by [`Core::abort_all`].
    #[inline]
    pub(crate) fn send_aborted(&self, msg_id: u32) -> bool {
        self.sends_aborted_below
            .is_some_and(|b| (msg_id.wrapping_sub(b) as i32) < 0)
    }

    /// Whether the peer's message `msg_id` may have lost its receive to
    /// [`Core::abort_all`] (only ids already matched qualify).
    #[inline]
    pub(crate) fn recv_aborted(&self, msg_id: u32) -> bool {
        self.recvs_aborted_below
            .is_some_and(|b| (msg_id.wrapping_sub(b) as i32) < 0)
    }
}
// Session lifecycle and liveness, driven by the core: involvement, deadlines, failing a
// peer's requests and starting its session over.
impl<S: AsRef<[u8]>, R: RecvBuffer> Core<S, R> {
    /// Counts one more request that involves peer `p` (its silence now matters).
    // Always inlined: the common case is two loads and an add, on every send.
    #[inline(always)]
    pub(crate) fn engage(&mut self, p: u16, mut now: impl Now) {
        let peer = &mut self.peers[p as usize];
        if peer.involved > 0 && peer.epoch != 0 {
            // Monitored already and in session: one more request changes no
            // deadline (and needs no time).
            peer.involved += 1;
            return;
        }
        self.engage_first(p, now.now());
    }

    /// [`engage`](Self::engage) when the peer may start being monitored or need a HELLO.
    #[inline(never)]
    fn engage_first(&mut self, p: u16, now: Time) {
        let peer = &mut self.peers[p as usize];
        let watched = peer.monitored();
        if !watched {
            peer.live_base = now;
        }
        peer.involved += 1;
        // The first request greets a peer whose epoch is not known; while
        // it goes unanswered, the probe timer greets it again, backing off
        // (one HELLO for each request followed the application's rate).
        if peer.epoch == 0 && !peer.hello_now && !watched {
            peer.hello_now = true;
            peer.last_probe = now;
            self.mark_ready(p);
        }
        // Its liveness deadlines may start now, or its probe time moved.
        self.touch(p);
    }

    #[inline]
    pub(crate) fn disengage(&mut self, p: u16) {
        if p != NO_PEER {
            let peer = &mut self.peers[p as usize];
            peer.involved = peer.involved.saturating_sub(1);
            if peer.involved == 0 {
                // It may stop being monitored (its deadlines only change then).
                self.touch(p);
            }
        }
    }

    /// Notes that peer `p`'s timer state (ack, retransmission and liveness times, what
    /// it is involved in) may have changed, so that its deadline is computed again
    /// before [`poll_timeout`](Core::poll_timeout) next answers. Every entry point calls
    /// it, directly or through [`engage`](Core::engage), [`disengage`](Core::disengage)
    /// and the like, for each peer whose timer state it changes; debug builds check that
    /// none was missed. So a poll costs the peers that changed, not the whole table.
    // Always inlined: it runs on every frame in and out, and is a load and a branch when
    // the peer was touched already.
    #[inline(always)]
    pub(crate) fn touch(&self, p: u16) {
        let peer = &self.peers[p as usize];
        if !peer.deadline_dirty.get() {
            peer.deadline_dirty.set(true);
            let n = self.dirty_len.get();
            self.dirty[n].set(p);
            self.dirty_len.set(n + 1);
        }
    }

    /// Puts the deadlines of the touched peers into the deadline tree.
    #[inline]
    pub(crate) fn refresh_deadlines(&self) {
        let n = self.dirty_len.get();
        for k in 0..n {
            let p = self.dirty[k].get();
            let peer = &self.peers[p as usize];
            peer.deadline_dirty.set(false);
            self.timers.set(p as usize, self.peer_deadline(peer));
        }
        self.dirty_len.set(0);
    }

    /// Debug builds: every peer's deadline in the tree is its current one.
    pub(crate) fn check_deadlines(&self) {
        for (p, peer) in self.peers.iter().enumerate() {
            debug_assert_eq!(
                self.timers.get(p),
                self.peer_deadline(peer),
                "peer {p}'s timers changed without a touch"
            );
        }
    }

    pub(crate) fn peer_deadline(&self, p: &Peer) -> Time {
        let mut t = p.ack_at.min(p.rto_at);
        if p.monitored() && !p.dead {
            t = t.min(self.probe_at(p)).min(self.dead_at(p));
        }
        t
    }

    pub(crate) fn probe_interval(&self, p: &Peer) -> core::time::Duration {
        if p.epoch == 0 || (p.credit_stalled && p.inflight.is_empty()) {
            p.rtt.rto(self.rto_cap).min(self.cfg.keepalive)
        } else {
            self.cfg.keepalive
        }
    }

    pub(crate) fn probe_at(&self, p: &Peer) -> Time {
        p.last_heard.max(p.last_probe).max(p.live_base) + self.probe_interval(p)
    }

    pub(crate) fn dead_at(&self, p: &Peer) -> Time {
        let silent = p.last_heard.max(p.live_base) + self.cfg.peer_timeout;
        if p.inflight.is_empty() {
            return silent;
        }
        // A peer that answers but never acknowledges what we send is no better than a
        // silent one (a link that works one way only, a peer that refuses our frames).
        silent.min(p.progress_at + self.cfg.peer_timeout)
    }

    pub(crate) fn declare_dead(&mut self, now: Time, p: u16) {
        self.fail_peer(now, p, RequestError::PeerUnreachable);
        self.reset_session(p);
        let peer = &mut self.peers[p as usize];
        peer.dead = true;
        peer.dead_epoch = peer.epoch;
        peer.epoch = 0;
        // A later epoch (0 means "not known"): to the peer, we have restarted.
        peer.my_epoch = match peer.my_epoch.wrapping_add(1) {
            0 => 1,
            e => e,
        };
    }

    /// Fails every request that involves `p`.
    pub(crate) fn fail_peer(&mut self, now: Time, p: u16, err: RequestError) {
        // Frames first, so that no send is still referenced.
        self.free_frames(p);
        while self.peers[p as usize].sends.head != NIL {
            let i = self.peers[p as usize].sends.head;
            self.sends[i as usize].inflight = 0;
            self.complete_send(i, Err(err));
        }
        // Envelopes: bound ones fail their receive, complete eager messages stay (they
        // were delivered and acknowledged: their sends completed), the rest are dropped,
        // or, claimed by a matched probe, fail the receive to be posted for them.
        let mut kept = std::mem::take(&mut self.kept);
        kept.clear();
        let mut m = self.peers[p as usize].msgs.head;
        while m != NIL {
            let next = self.msg_peer_links.next(m);
            let msg = self.msgs[m as usize];
            match msg.state {
                MsgState::Bound => self.complete_recv(msg.recv, Err(err)),
                MsgState::Waiting if msg.rndv || msg.received < msg.len => self.free_msg(m),
                MsgState::Waiting => kept.push(m),
                MsgState::Unexpected | MsgState::Claimed if msg.rndv || msg.received < msg.len => {
                    if msg.state == MsgState::Unexpected {
                        self.msg_links.remove(&mut self.unexpected, m);
                        self.free_msg(m);
                    } else {
                        // Its handle is out: the receive posted for it fails.
                        // (It keeps its charge, as a kept message does, so
                        // that the credits still bound the envelopes.)
                        self.unmap_msg(m);
                        self.store.free(msg.store);
                        let msg = &mut self.msgs[m as usize];
                        msg.store = NIL;
                        msg.state = MsgState::ClaimFailed(err);
                    }
                }
                MsgState::Unexpected | MsgState::Claimed => {
                    if !msg.orphan {
                        self.unmap_msg(m);
                        self.msgs[m as usize].orphan = true;
                    }
                }
                MsgState::ClaimFailed(_) => {}
                MsgState::Withdrawn => self.free_msg(m),
            }
            m = next;
        }
        // Those complete behind one that never came (lost, and not sent again before the
        // session ended) are matched now, in order, as if it had been: to a receive
        // posted for them, or kept with the unexpected ones. (Sorted once: a peer
        // may have left thousands there, and a search for each next one was
        // quadratic in them, on the core's one thread.)
        let from = self.peers[p as usize].next_match;
        kept.sort_unstable_by_key(|&m| self.msgs[m as usize].msg_id.wrapping_sub(from));
        for &m in &kept {
            self.unmap_msg(m);
            self.msgs[m as usize].orphan = true;
            self.match_in_turn(now, p, m);
        }
        kept.clear();
        self.kept = kept;
        // Posted receives that name this peer: a restarted peer may still send them a
        // message in its new session, an unreachable one cannot.
        if err != RequestError::PeerUnreachable {
            return;
        }
        let mut r = self.posted.head;
        while r != NIL {
            let next = self.recv_links.next(r);
            if self.recvs[r as usize].src == p {
                self.recv_links.remove(&mut self.posted, r);
                self.complete_recv(r, Err(err));
            }
            r = next;
        }
    }

    pub(crate) fn free_frames(&mut self, p: u16) {
        let peer = &mut self.peers[p as usize];
        while let Some(i) = self.frame_links.pop_front(&mut peer.inflight) {
            self.frame_free.release(i);
        }
        while let Some(i) = self.frame_links.pop_front(&mut peer.ctrl) {
            self.frame_free.release(i);
        }
        peer.lost = 0;
        // As the NOTIFYs queued in frames just dropped.
        self.drop_starved_notifies(p);
    }

    /// Starts both halves of the stream over (after `fail_peer`).
    pub(crate) fn reset_session(&mut self, p: u16) {
        self.touch(p);
        self.free_frames(p);
        let rto = self.cfg.initial_rto();
        let peer = &mut self.peers[p as usize];
        debug_assert!(peer.sends.is_empty() && peer.pulls.is_empty());
        peer.snd_next = 0;
        peer.rtt = RttEstimator::new(rto);
        peer.rto_at = Time::NEVER;
        peer.latest_acked_sent = Time::ZERO;
        peer.loss_seen_at = None;
        peer.credit_limit = 0;
        peer.credit_used = 0;
        peer.credit_known = false;
        peer.credit_stalled = false;
        peer.stalled_send = NIL;
        peer.window_stalled = false;
        peer.next_msg_id = 0;
        peer.cursor = NIL;
        peer.pulls = List::default();
        peer.sends_aborted_below = None;
        peer.recvs_aborted_below = None;
        peer.rcv = Default::default();
        peer.unacked = 0;
        peer.ack_at = Time::NEVER;
        peer.ack_now = false;
        // Messages kept from the old session still hold their charge: the new session's
        // window starts that much smaller and grows back as they are taken.
        peer.credit_released = 0u32.wrapping_sub(peer.held as u32);
        // As the new session's first frame will advertise it (the old
        // session's figure would time `return_credit`'s acks until then).
        peer.credit_advertised = peer.credit_released.wrapping_add(self.peer_credit as u32);
        peer.next_match = 0;
        peer.hello_now = false;
        peer.ping_now = false;
    }
}
