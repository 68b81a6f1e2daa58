//! Eager protocol: messages up to the eager threshold travel at once, fragmented at the
//! frame payload size, each fragment carrying the whole envelope (message id, match
//! bits, length, offset) so that fragments can be placed in any arrival order. A
//! fragment that overlaps bytes of its message that arrived already is refused
//! ([`Frags`](super::frags::Frags)).
//!
//! On arrival a fragment goes straight into the bound receive's buffer, or into the
//! unexpected store while its message waits for a receive or for earlier messages of the
//! same sender. A one-frame message that is matchable at once and finds a posted receive
//! takes a fast path with no envelope at all. This module copies payload (into the
//! store or the receive buffer) but never on the send side.
//!
//! A PACK is a run of whole one-frame messages: each of its records is taken as the
//! EAGER frame it stands for, in order, once all of them were checked.

use super::core::Lend;
use super::core::{msg_key, Core, MsgState, RecvState};
use super::frags::Frags;
use super::matching::eager_charge;
use super::slab::NIL;
use super::RecvBuffer;
use super::{RequestId, Time};
use crate::wire::{DropReason, Header, Packed};

/// What the eager path reads of a fragment's header: an EAGER frame's
/// [`Header`], or a [`PackedRecord`] of a PACK. (Building a whole `Header` for
/// each record of a PACK, twice, cost more than the checks; copying these
/// fields out of an EAGER frame's header cost its path a little too.)
pub(crate) trait Envelope: Copy {
    fn msg_id(&self) -> u32;
    fn match_bits(&self) -> u64;
    fn msg_len(&self) -> u64;
    fn frag_offset(&self) -> u64;
    fn frag_unit(&self) -> u16;
}

impl Envelope for &Header {
    #[inline]
    fn msg_id(&self) -> u32 {
        self.msg_id
    }
    #[inline]
    fn match_bits(&self) -> u64 {
        self.match_bits
    }
    #[inline]
    fn msg_len(&self) -> u64 {
        self.msg_len
    }
    #[inline]
    fn frag_offset(&self) -> u64 {
        self.frag_offset
    }
    #[inline]
    fn frag_unit(&self) -> u16 {
        self.frag_unit
    }
}

/// The EAGER fragment a PACK record stands for: a whole one-frame message.
#[derive(Clone, Copy, Debug)]
struct PackedRecord {
    msg_id: u32,
    match_bits: u64,
    len: u64,
}

impl PackedRecord {
    /// Record `k` (`match_bits`, `data`) of PACK `h`.
    #[inline]
    fn new(h: &Header, k: usize, match_bits: u64, data: &[u8]) -> PackedRecord {
        PackedRecord {
            msg_id: h.msg_id.wrapping_add(k as u32),
            match_bits,
            len: data.len() as u64,
        }
    }
}

impl Envelope for PackedRecord {
    #[inline]
    fn msg_id(&self) -> u32 {
        self.msg_id
    }
    #[inline]
    fn match_bits(&self) -> u64 {
        self.match_bits
    }
    #[inline]
    fn msg_len(&self) -> u64 {
        self.len
    }
    #[inline]
    fn frag_offset(&self) -> u64 {
        0
    }
    /// Whole: no unit.
    #[inline]
    fn frag_unit(&self) -> u16 {
        0
    }
}

impl<S: AsRef<[u8]>, R: RecvBuffer> Core<S, R> {
    /// Checks a new EAGER fragment against the state, changing nothing.
    pub(crate) fn check_eager(&self, p: u16, h: impl Envelope) -> Result<(), DropReason> {
        if h.msg_len() > self.cfg.eager_threshold {
            return Err(DropReason::Protocol);
        }
        let open = self.peers[p as usize].mapped != 0;
        if let Some(&m) = open
            .then(|| self.msg_map.get(&msg_key(p, h.msg_id())))
            .flatten()
        {
            let msg = &self.msgs[m as usize];
            if msg.rndv
                || msg.len != h.msg_len()
                || msg.match_bits != h.match_bits()
                || msg.unit != h.frag_unit()
            {
                return Err(DropReason::Protocol);
            }
            // (The header's checks made it a whole fragment within the message.)
            return msg.frags.check(h.frag_offset(), u32::from(msg.unit));
        }
        let peer = &self.peers[p as usize];
        if (h.msg_id().wrapping_sub(peer.next_match) as i32) < 0 {
            // A message that was matched already cannot start again, unless its receive
            // was aborted while fragments were still coming: those are still due.
            if peer.recv_aborted(h.msg_id()) {
                return Ok(());
            }
            return Err(DropReason::Protocol);
        }
        if self.closing {
            // No new message (see `Core::begin_close`); the rest of one that
            // was arriving is still taken, so its sender's send completes.
            return Err(DropReason::NotForUs);
        }
        let charge = eager_charge(h.msg_len());
        if peer.held + charge > self.peer_credit {
            // The sender overran its credits.
            return Err(DropReason::Protocol);
        }
        // The first fragment to arrive starts the message's record of them: it
        // must lie within it (one further on comes again later).
        Frags::<1>::default().check(h.frag_offset(), u32::from(h.frag_unit()))?;
        if self.msg_free.available() == 0 {
            // Not acknowledged: the sender will try again.
            return Err(DropReason::Resources);
        }
        Ok(())
    }

    /// Checks a new PACK against the state, changing nothing: every message as an
    /// EAGER frame, and their credit and envelopes together. (That the records add
    /// up to the count, [`Header::parse`](crate::wire::Header::parse) checked.)
    pub(crate) fn check_pack(&self, p: u16, h: &Header, payload: &[u8]) -> Result<(), DropReason> {
        let mut charge = 0;
        for (k, (bits, data)) in Packed::unchecked(payload).enumerate() {
            let m = PackedRecord::new(h, k, bits, data);
            self.check_eager(p, m)?;
            charge += eager_charge(m.len);
        }
        if self.peers[p as usize].held + charge > self.peer_credit {
            return Err(DropReason::Protocol);
        }
        if (self.msg_free.available() as u64) < h.msg_len {
            return Err(DropReason::Resources);
        }
        Ok(())
    }

    /// Applies a new PACK (checked by [`check_pack`](Self::check_pack)): its messages
    /// one by one, as EAGER frames. None is lent: one frame cannot go to several
    /// receives, so lending receives get copies.
    pub(crate) fn on_pack(&mut self, now: Time, p: u16, h: &Header, payload: &[u8]) {
        let lend = self.lend_base.take();
        for (k, (bits, data)) in Packed::unchecked(payload).enumerate() {
            self.on_eager(now, p, PackedRecord::new(h, k, bits, data), data);
        }
        self.lend_base = lend;
    }

    /// Applies a new EAGER fragment (checked by [`check_eager`](Self::check_eager)).
    pub(crate) fn on_eager(&mut self, now: Time, p: u16, h: impl Envelope, payload: &[u8]) {
        // No open message from this peer: no need to look one up (the common case).
        let open = self.peers[p as usize].mapped != 0;
        if let Some(&m) = open
            .then(|| self.msg_map.get(&msg_key(p, h.msg_id())))
            .flatten()
        {
            self.deliver_eager(m, h.frag_offset(), payload);
            return;
        }
        let peer = &self.peers[p as usize];
        if h.msg_id() == peer.next_match && payload.len() as u64 == h.msg_len() {
            // Fast path: the whole message, matchable now.
            let r = self.find_posted(p, h.match_bits());
            if r != NIL {
                self.recv_links.remove(&mut self.posted, r);
                let slot = &mut self.recvs[r as usize];
                let buf = slot.buf.as_mut().expect("posted receive");
                let n = if !buf.lends() {
                    let n = (slot.buf_len as usize).min(payload.len());
                    buf.as_mut()[..n].copy_from_slice(&payload[..n]);
                    n
                } else if let Some(base) = self.lend_base {
                    // The caller keeps the frame: no copy.
                    self.lent = Some(Lend {
                        req: RequestId::recv(r, slot.gen),
                        offset: payload.as_ptr() as usize - base,
                        len: payload.len(),
                    });
                    payload.len()
                } else {
                    buf.fit(payload.len());
                    buf.as_mut().copy_from_slice(payload);
                    slot.buf_len = payload.len() as u64;
                    payload.len()
                };
                slot.state = RecvState::Active;
                let info = super::RecvInfo {
                    src: self.peers[p as usize].addr,
                    match_bits: h.match_bits(),
                    msg_len: h.msg_len(),
                    copied: n as u64,
                    truncated: h.msg_len() > slot.buf_len,
                };
                let peer = &mut self.peers[p as usize];
                peer.next_match = peer.next_match.wrapping_add(1);
                self.return_credit(now, p, eager_charge(h.msg_len()));
                self.complete_recv(r, Ok(info));
                if open {
                    self.advance_matching(now, p);
                }
                return;
            }
        }
        if (h.msg_id().wrapping_sub(self.peers[p as usize].next_match) as i32) < 0 {
            // A late fragment of an aborted receive (check_eager let nothing else by).
            return;
        }
        let matchable = h.msg_id() == self.peers[p as usize].next_match;
        // A whole message that could be matched now found no receive above:
        // it is unexpected, and needs no entry in the id map (no fragment of
        // it is to come, and it is matched already).
        let whole_unexpected = matchable && payload.len() as u64 == h.msg_len();
        let new = self.new_msg(
            p,
            h.msg_id(),
            false,
            h.match_bits(),
            h.msg_len(),
            h.frag_unit(),
        );
        let Some(m) = new else {
            // Cannot happen: check_eager saw room and credits bound the store.
            self.stats.internal_errors += 1;
            debug_assert!(false, "unexpected store exhausted despite credits");
            return;
        };
        if whole_unexpected {
            self.deliver_eager(m, h.frag_offset(), payload);
            let peer = &mut self.peers[p as usize];
            peer.next_match = peer.next_match.wrapping_add(1);
            self.queue_unexpected(m);
            if self.peers[p as usize].mapped != 0 {
                // Messages that arrived ahead of this one may be matchable now.
                self.advance_matching(now, p);
            }
            return;
        }
        self.map_msg(m);
        if matchable && (payload.len() as u64) < h.msg_len() {
            // The first fragment of a message that spans frames: match it before its
            // data lands, so that a posted receive gets the data straight away rather
            // than through the store. (Nothing completes here: fragments are missing.)
            self.advance_matching(now, p);
            self.deliver_eager(m, h.frag_offset(), payload);
        } else {
            self.deliver_eager(m, h.frag_offset(), payload);
            if matchable {
                self.advance_matching(now, p);
            }
        }
    }

    fn deliver_eager(&mut self, m: u32, offset: u64, data: &[u8]) {
        let msg = &mut self.msgs[m as usize];
        msg.received += data.len() as u64;
        msg.frags.add(offset, u32::from(msg.unit));
        if msg.state == MsgState::Bound {
            let msg = *msg;
            let r = msg.recv;
            let slot = &mut self.recvs[r as usize];
            if offset < slot.buf_len {
                let n = ((slot.buf_len - offset) as usize).min(data.len());
                let buf = slot.buf.as_mut().expect("bound receive").as_mut();
                let o = offset as usize;
                buf[o..o + n].copy_from_slice(&data[..n]);
            }
            if msg.received == msg.len {
                let info = self.recv_info(&msg, r);
                self.complete_recv(r, Ok(info));
            }
        } else {
            self.store.write(msg.store, &mut msg.at, offset, data);
        }
    }
}
