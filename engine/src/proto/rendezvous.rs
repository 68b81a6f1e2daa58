//! Rendezvous protocol: above the eager threshold the sender announces the message with
//! an RTS (match bits, length) and keeps its buffer. The receiver matches the RTS like
//! any message; once bound it pulls the data in blocks of `pull_block` bytes rounded down
//! to whole fragment units of the sender (its frame payload, named in the RTS; see
//! [`CoreConfig::effective_pull_block`] for equal MTUs), at most `pull_inflight`
//! outstanding, so the receiver paces the transfer (Open-MX style). The sender answers
//! pulls with PULL_DATA frames, one unit each, whose payload is a [`PayloadRef`] into the
//! send buffer (zero copy), and the receiver places them at their offsets in any order,
//! refusing one that came already.
//! When it has what it wants (the message, or the buffer's length if shorter) the
//! receiver completes and sends NOTIFY; the send completes once NOTIFY came and every
//! frame it sent was acknowledged.
//!
//! A cancelled send that nothing was pulled from is withdrawn: once its RTS is
//! acknowledged (a WITHDRAW that overtook it would find nothing) the sender sends
//! WITHDRAW; a receiver that has not matched the message (nor claimed it with a matched
//! probe) drops it, or, if it waits behind a missing message, passes it by when its turn
//! comes, and answers with a NOTIFY flagged WITHDRAWN, which ends the send `Cancelled`.
//! One already matched is pulled as usual, and its NOTIFY completes the send.
//!
//! The sender keeps one high-water mark of what was pulled (`pull_limit`) instead of a
//! list of pulls, so a lost or reordered pull never stalls it: data below the mark is
//! always wanted.
//!
//! [`PayloadRef`]: super::PayloadRef
//! [`CoreConfig::effective_pull_block`]: super::CoreConfig::effective_pull_block

use super::core::{msg_key, Core, MsgState, TxFrame, Withdraw};
use super::matching::rts_charge;
use super::slab::NIL;
use super::Time;
use super::{CoreOnly, RecvBuffer};
use crate::wire::{flags, DropReason, FrameType, Header};

/// Frames an RTS leaves free in the table beyond its own pulls and NOTIFY:
/// the slack the table has on top of every window and receive (see
/// `Core::new`).
const FRAME_RESERVE: usize = 64;

impl<S: AsRef<[u8]>, R: RecvBuffer> Core<S, R> {
    pub(crate) fn check_rts(&self, p: u16, h: &Header) -> Result<(), DropReason> {
        let peer = &self.peers[p as usize];
        if self.msg_map.contains_key(&msg_key(p, h.msg_id))
            || (h.msg_id.wrapping_sub(peer.next_match) as i32) < 0
            || peer.held + rts_charge() > self.peer_credit
        {
            return Err(DropReason::Protocol);
        }
        // Room for this message's pulls and its NOTIFY. The frame table is
        // sized for them, but a NOTIFY outlives its receive (it waits for the
        // peer's window): refused here, unacknowledged, the RTS comes again
        // later, where a NOTIFY or pulls that found no frame would have to
        // wait for one. Nor while such NOTIFYs or pulls wait: that bounds the
        // NOTIFYs waiting by the envelopes there were.
        if self.msg_free.available() == 0
            || self.frame_free.available() < self.cfg.pull_inflight as usize + 1 + FRAME_RESERVE
            || !self.starved_pulls.is_empty()
            || !self.starved_notifies.is_empty()
        {
            return Err(DropReason::Resources);
        }
        Ok(())
    }

    pub(crate) fn on_rts(&mut self, now: Time, p: u16, h: &Header) {
        let new = self.new_msg(p, h.msg_id, true, h.match_bits, h.msg_len, h.frag_unit);
        let Some(m) = new else {
            self.stats.internal_errors += 1;
            debug_assert!(false, "envelope table exhausted despite check");
            return;
        };
        self.map_msg(m);
        if h.msg_id == self.peers[p as usize].next_match {
            self.advance_matching(now, p);
        }
    }

    /// Starts pulling message `m` into receive `r` (just bound).
    pub(crate) fn start_pull(&mut self, m: u32, r: u32) {
        let msg = self.msgs[m as usize];
        let slot = &mut self.recvs[r as usize];
        slot.pull = Default::default();
        slot.pull.wanted = msg.len.min(slot.buf_len);
        slot.pull.unit = u32::from(msg.unit);
        if slot.pull.wanted == 0 {
            self.queue_notify(msg.peer, msg.msg_id, false);
            let info = self.recv_info(&msg, r);
            self.complete_recv(r, Ok(info));
            return;
        }
        self.issue_pulls(r);
    }

    fn issue_pulls(&mut self, r: u32) {
        let m = self.recvs[r as usize].msg;
        let msg = self.msgs[m as usize];
        let max_blocks = self.cfg.pull_inflight;
        // Whole frames per block: a block cut at the configured size would end in a short
        // frame, one more frame (and header) per block for a few bytes.
        let block = u64::from(whole_units(
            self.cfg.pull_block,
            self.recvs[r as usize].pull.unit,
        ));
        let mut issued = false;
        loop {
            let pull = &mut self.recvs[r as usize].pull;
            if pull.nblocks >= max_blocks || pull.next_pull >= pull.wanted {
                break;
            }
            let Some(i) = self.frame_free.alloc() else {
                break;
            };
            let len = block.min(pull.wanted - pull.next_pull) as u32;
            let off = pull.next_pull;
            pull.blocks[pull.nblocks as usize] = super::core::Block { off, len, got: 0 };
            pull.nblocks += 1;
            pull.next_pull += len as u64;
            self.frames[i as usize] = TxFrame {
                seq: 0,
                kind: FrameType::Pull,
                lost: false,
                retx: 0,
                sent_at: Time::ZERO,
                slot: NIL,
                msg_id: msg.msg_id,
                offset: off,
                len,
            };
            let peer = &mut self.peers[msg.peer as usize];
            self.frame_links.push_back(&mut peer.ctrl, i);
            issued = true;
        }
        if issued {
            // Control frames waiting make the peer monitored.
            self.touch(msg.peer);
            self.mark_ready(msg.peer);
        }
        let pull = &mut self.recvs[r as usize].pull;
        if pull.nblocks == 0 && pull.next_pull < pull.wanted && !pull.starved {
            // The frame table is full (NOTIFYs waiting for a closed window
            // can fill it) and no pull is in flight whose data would call
            // again: wait for a frame.
            pull.starved = true;
            self.recv_links.push_back(&mut self.starved_pulls, r);
        }
    }

    /// Whether some PULL, NOTIFY, WITHDRAW or peer's new frame waits for a
    /// frame of the table.
    #[inline]
    pub(crate) fn starving(&self) -> bool {
        !self.starved_pulls.is_empty()
            || !self.starved_notifies.is_empty()
            || !self.starved_peers.is_empty()
            || !self.starved_withdraws.is_empty()
    }

    /// Whether [`feed_starved`](Self::feed_starved) has work it can do now.
    #[inline]
    pub(crate) fn may_feed(&self) -> bool {
        self.starving() && self.frame_free.available() > 0
    }

    /// Puts the peers whose new frame found the table full back on the
    /// transmit queue, then gives free frames to the NOTIFYs, the WITHDRAWs
    /// and the pulls that found it full, oldest first.
    pub(crate) fn feed_starved(&mut self) {
        while let Some(p) = self.starved_peers.pop_front() {
            self.peers[p as usize].frame_starved = false;
            self.mark_ready(p);
        }
        while let Some(&(p, msg_id, withdrawn)) = self.starved_notifies.front() {
            let Some(i) = self.frame_free.alloc() else {
                return;
            };
            self.starved_notifies.pop_front();
            self.push_notify(i, p, msg_id, withdrawn);
        }
        while let Some(&s) = self.starved_withdraws.front() {
            let Some(i) = self.frame_free.alloc() else {
                return;
            };
            self.starved_withdraws.pop_front();
            self.push_withdraw(i, s);
        }
        while self.frame_free.available() > 0 {
            let Some(r) = self.recv_links.pop_front(&mut self.starved_pulls) else {
                return;
            };
            self.recvs[r as usize].pull.starved = false;
            self.issue_pulls(r);
        }
    }

    /// Drops the NOTIFYs for peer `p` that wait for a frame: its session
    /// starts over, and a new session's message ids are not the old ones.
    pub(crate) fn drop_starved_notifies(&mut self, p: u16) {
        if !self.starved_notifies.is_empty() {
            self.starved_notifies.retain(|&(q, _, _)| q != p);
        }
    }

    /// Queues NOTIFY for message `msg_id` of peer `p`: the receiver has what
    /// it wants of it, or (`withdrawn`) dropped it as a WITHDRAW asked.
    pub(crate) fn queue_notify(&mut self, p: u16, msg_id: u32, withdrawn: bool) {
        let Some(i) = self.frame_free.alloc() else {
            // Every NOTIFY waiting is for an envelope that was there when the
            // table filled (RTSes are refused meanwhile): fewer than the
            // envelope table holds.
            if self.starved_notifies.len() < self.msg_free.size() {
                self.starved_notifies.push_back((p, msg_id, withdrawn));
            } else {
                self.stats.internal_errors += 1;
                debug_assert!(false, "more NOTIFYs waiting than envelopes");
            }
            return;
        };
        self.push_notify(i, p, msg_id, withdrawn);
    }

    /// Queues NOTIFY for message `msg_id` of peer `p` in frame `i` (its `len`
    /// is 1 for one that says `withdrawn`).
    fn push_notify(&mut self, i: u32, p: u16, msg_id: u32, withdrawn: bool) {
        self.push_ctrl(i, p, FrameType::Notify, msg_id, u32::from(withdrawn));
    }

    /// Queues control frame `i` (a NOTIFY or a WITHDRAW: one that names a
    /// message and refers to no request) of `kind` for message `msg_id` to
    /// peer `p`.
    pub(crate) fn push_ctrl(&mut self, i: u32, p: u16, kind: FrameType, msg_id: u32, len: u32) {
        self.frames[i as usize] = TxFrame {
            seq: 0,
            kind,
            lost: false,
            retx: 0,
            sent_at: Time::ZERO,
            slot: NIL,
            msg_id,
            offset: 0,
            len,
        };
        let peer = &mut self.peers[p as usize];
        self.frame_links.push_back(&mut peer.ctrl, i);
        self.touch(p);
        self.mark_ready(p);
    }

    /// PULL frame `f` to peer `p` leaves for the first time: its receive may
    /// now take the data it asks for.
    pub(crate) fn pull_leaves(&mut self, p: u16, f: &TxFrame) {
        let Some(&m) = self.msg_map.get(&msg_key(p, f.msg_id)) else {
            return;
        };
        let msg = &self.msgs[m as usize];
        if msg.rndv && msg.state == MsgState::Bound {
            let pull = &mut self.recvs[msg.recv as usize].pull;
            pull.sent_mark = pull.sent_mark.max(f.offset + u64::from(f.len));
        }
    }

    pub(crate) fn check_pull_data(&self, p: u16, h: &Header) -> Result<(), DropReason> {
        let Some(&m) = self.msg_map.get(&msg_key(p, h.msg_id)) else {
            // Data pulled for a receive that `abort_all` took away is still due.
            if self.peers[p as usize].recv_aborted(h.msg_id) {
                return Ok(());
            }
            return Err(DropReason::Protocol);
        };
        let msg = &self.msgs[m as usize];
        if !msg.rndv || msg.state != MsgState::Bound || msg.len != h.msg_len {
            return Err(DropReason::Protocol);
        }
        let pull = &self.recvs[msg.recv as usize].pull;
        let end = h.frag_offset + h.payload_len as u64;
        // Only what a PULL that left asked for: data ahead of the pulls would
        // complete blocks whose PULLs still wait, and each completed block
        // queues another PULL (frames without bound, from the table every
        // peer shares).
        if end > pull.sent_mark || pull.received + h.payload_len as u64 > pull.wanted {
            return Err(DropReason::Protocol);
        }
        // A whole fragment of the sender's unit (but the last), on its grid,
        // and not one that came already: each block counts its bytes to know
        // when it is done.
        let unit = u64::from(pull.unit);
        if u32::from(h.frag_unit) != pull.unit
            || u64::from(h.payload_len) != unit.min(pull.wanted - h.frag_offset)
        {
            return Err(DropReason::Protocol);
        }
        pull.frags.check(h.frag_offset, pull.unit)
    }

    pub(crate) fn on_pull_data(&mut self, p: u16, h: &Header, data: &[u8]) {
        let Some(&m) = self.msg_map.get(&msg_key(p, h.msg_id)) else {
            return; // late data of an aborted receive: acknowledged, discarded
        };
        let msg = self.msgs[m as usize];
        let r = msg.recv;
        let slot = &mut self.recvs[r as usize];
        let off = h.frag_offset;
        let o = off as usize;
        let buf = slot.buf.as_mut().expect("bound receive");
        if self.cfg.stream_min != 0 && self.large_posted >= self.cfg.stream_min {
            buf.write_streaming(o, data, &CoreOnly::TOKEN);
            self.streamed = true;
        } else {
            buf.as_mut()[o..o + data.len()].copy_from_slice(data);
        }
        let pull = &mut slot.pull;
        pull.received += data.len() as u64;
        pull.frags.add(off, pull.unit);
        let end = off + data.len() as u64;
        let mut k = 0;
        while k < pull.nblocks as usize {
            let b = &mut pull.blocks[k];
            let lo = off.max(b.off);
            let hi = end.min(b.off + b.len as u64);
            if lo < hi {
                b.got += (hi - lo) as u32;
            }
            if b.got >= b.len {
                pull.nblocks -= 1;
                pull.blocks[k] = pull.blocks[pull.nblocks as usize];
            } else {
                k += 1;
            }
        }
        let (received, wanted) = (pull.received, pull.wanted);
        if received >= wanted {
            self.queue_notify(p, msg.msg_id, false);
            self.msgs[m as usize].received = received;
            let info = self.recv_info(&msg, r);
            self.complete_recv(r, Ok(info));
        } else {
            self.issue_pulls(r);
        }
    }

    pub(crate) fn check_pull_or_notify(
        &self,
        p: u16,
        ft: FrameType,
        h: &Header,
    ) -> Result<(), DropReason> {
        let Some(&s) = self.rndv_map.get(&msg_key(p, h.msg_id)) else {
            // A pull may arrive after the send finished: later pulls raised the mark past
            // its block, the data went out and the receiver notified. Such a pull names a
            // message id already used; one never used is a lie.
            let next = self.peers[p as usize].next_msg_id;
            if ft == FrameType::Pull && (h.msg_id.wrapping_sub(next) as i32) < 0 {
                return Ok(());
            }
            // The receiver's NOTIFY for a send that `abort_all` took away.
            if ft == FrameType::Notify && self.peers[p as usize].send_aborted(h.msg_id) {
                return Ok(());
            }
            return Err(DropReason::Protocol);
        };
        let s = &self.sends[s as usize];
        if !s.first_pass_done || (ft == FrameType::Pull && h.frag_offset + h.msg_len > s.len) {
            return Err(DropReason::Protocol);
        }
        // Withdrawn only as asked, and never after a pull.
        if h.flags & flags::WITHDRAWN != 0 && (s.withdraw != Withdraw::Sent || s.pull_limit != 0) {
            return Err(DropReason::Protocol);
        }
        Ok(())
    }

    pub(crate) fn on_pull(&mut self, p: u16, h: &Header) {
        let Some(&i) = self.rndv_map.get(&msg_key(p, h.msg_id)) else {
            return; // late pull of a finished send
        };
        let s = &mut self.sends[i as usize];
        let end = h.frag_offset + h.msg_len;
        if end > s.pull_limit {
            s.pull_limit = end;
        }
        if s.sent_upto < s.pull_limit && !s.in_pulls && !s.notified {
            s.in_pulls = true;
            let peer = &mut self.peers[p as usize];
            self.pull_links.push_back(&mut peer.pulls, i);
        }
    }

    pub(crate) fn on_notify(&mut self, p: u16, h: &Header) {
        let Some(&i) = self.rndv_map.get(&msg_key(p, h.msg_id)) else {
            return; // for a send that was aborted
        };
        let s = &mut self.sends[i as usize];
        s.notified = true;
        if h.flags & flags::WITHDRAWN != 0 {
            s.withdraw = Withdraw::Done;
        }
        if s.in_pulls {
            s.in_pulls = false;
            let peer = &mut self.peers[p as usize];
            self.pull_links.remove(&mut peer.pulls, i);
        }
        self.maybe_complete_send(i);
    }

    /// Checks a WITHDRAW from `p`: for a rendezvous message it announced, or one
    /// already done with (matched and finished, or its receive aborted). Its
    /// sender sends it only once its RTS was acknowledged, so a message it names
    /// that was never announced is a lie.
    pub(crate) fn check_withdraw(&self, p: u16, h: &Header) -> Result<(), DropReason> {
        match self.msg_map.get(&msg_key(p, h.msg_id)) {
            Some(&m) if !self.msgs[m as usize].rndv => Err(DropReason::Protocol),
            Some(_) => Ok(()),
            None if (h.msg_id.wrapping_sub(self.peers[p as usize].next_match) as i32) < 0 => Ok(()),
            None => Err(DropReason::Protocol),
        }
    }

    /// A WITHDRAW from `p`: its message is dropped, and NOTIFY says so, if no
    /// receive (nor a matched probe) took it; otherwise it goes on as it was
    /// (the receive pulls it, and its NOTIFY completes the send).
    pub(crate) fn on_withdraw(&mut self, now: Time, p: u16, h: &Header) {
        let Some(&m) = self.msg_map.get(&msg_key(p, h.msg_id)) else {
            return; // done with already: its NOTIFY went
        };
        match self.msgs[m as usize].state {
            MsgState::Unexpected => {
                self.msg_links.remove(&mut self.unexpected, m);
                self.release_charge(now, m);
                self.free_msg(m);
            }
            MsgState::Waiting => {
                // Behind a message still missing: its turn to match comes,
                // and passes it by (see `advance_matching`). It keeps its
                // charge until then, so that credits still bound the
                // envelopes a peer holds (a peer that withdrew every message
                // behind one it never sent would take them all).
                self.msgs[m as usize].state = MsgState::Withdrawn;
            }
            MsgState::Bound
            | MsgState::Claimed
            | MsgState::ClaimFailed(_)
            | MsgState::Withdrawn => return,
        }
        self.stats.withdrawn += 1;
        self.queue_notify(p, h.msg_id, true);
    }

    /// The next PULL_DATA frame of peer `p`, if some send has pulled data to send.
    pub(crate) fn rndv_next_data_frame(&mut self, p: u16) -> Option<u32> {
        let peer = &self.peers[p as usize];
        let s_idx = peer.pulls.head;
        if s_idx == NIL {
            return None;
        }
        let i = self.frame_free.alloc()?;
        let max_payload = self.max_payload as u64;
        let s = &mut self.sends[s_idx as usize];
        let off = s.sent_upto;
        let len = (s.pull_limit - off).min(max_payload);
        s.sent_upto += len;
        s.inflight += 1;
        let msg_id = s.msg_id;
        if s.sent_upto >= s.pull_limit {
            s.in_pulls = false;
            let peer = &mut self.peers[p as usize];
            self.pull_links.remove(&mut peer.pulls, s_idx);
        }
        self.frames[i as usize] = TxFrame {
            seq: 0,
            kind: FrameType::PullData,
            lost: false,
            retx: 0,
            sent_at: Time::ZERO,
            slot: s_idx,
            msg_id,
            offset: off,
            len: len as u32,
        };
        Some(i)
    }
}

/// `pull_block` rounded down to whole fragments of `unit` bytes, and at least
/// one: the sender cuts its data at its unit, and the receiver refuses a
/// fragment that is not whole (but the last).
#[inline]
pub(crate) fn whole_units(pull_block: u32, unit: u32) -> u32 {
    if unit == 0 {
        pull_block
    } else if pull_block < unit {
        unit
    } else {
        pull_block - pull_block % unit
    }
}
