//! MX matching rule and the bounded store for unexpected messages.
//!
//! A receive matches a message when its source filter accepts the sender and
//! `(msg_bits & mask) == (recv_bits & mask)`. Messages from one sender become matchable
//! strictly in the order they were sent (their message ids), whatever order their frames
//! arrive in; a matchable message takes the first posted receive that accepts it, else
//! it joins the unexpected queue, which later receives search from its head. That gives
//! MX/MPI's non-overtaking rule per pair.
//!
//! The store owns the bytes of unexpected eager messages: a fixed arena cut into
//! [`CHUNK`]-byte chunks chained per message, so that variable-sized messages never
//! fragment it. Its size bounds memory; the per-peer credits (see [`eager_charge`])
//! guarantee that a sender never sends what the store could not hold. The matching
//! itself (envelopes, the posted and unexpected queues, binding a message to a receive)
//! is written as methods of the core, which owns those tables. This module copies bytes
//! in and out and allocates nothing after construction.

use super::core::{msg_key, Core, InMsg, MsgState, RecvState, NO_PEER};
use super::slab::{FreeList, NIL};
use super::RecvBuffer;
use super::Time;

/// Size of one store chunk.
pub const CHUNK: usize = 256;
/// Credit charged per message on top of its bytes, for its envelope (the record that
/// holds match bits and length while it waits).
pub const MSG_OVERHEAD: u64 = 256;

/// Credit bytes an eager message of `len` bytes costs its sender.
#[inline]
pub fn eager_charge(len: u64) -> u64 {
    MSG_OVERHEAD + len.div_ceil(CHUNK as u64) * CHUNK as u64
}

/// [`eager_charge`] for any length: `None` where it would overflow (a
/// threshold near `u64::MAX`, which only a configuration can give).
pub fn checked_eager_charge(len: u64) -> Option<u64> {
    len.checked_next_multiple_of(CHUNK as u64)?
        .checked_add(MSG_OVERHEAD)
}

/// Credit bytes a rendezvous announcement costs its sender.
#[inline]
pub fn rts_charge() -> u64 {
    MSG_OVERHEAD
}

/// The MX match rule.
#[inline]
pub fn matches(msg_bits: u64, recv_bits: u64, mask: u64) -> bool {
    (msg_bits ^ recv_bits) & mask == 0
}

/// A place in a message's chain of store chunks: a chunk and the message
/// byte its first byte holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cursor {
    chunk: u32,
    start: u64,
}

impl Cursor {
    /// Nowhere yet: a walk starts at the chain's head.
    pub(crate) const START: Cursor = Cursor {
        chunk: NIL,
        start: 0,
    };
}

/// Chunked byte arena for unexpected eager data.
#[derive(Debug)]
pub(crate) struct Store {
    bytes: Vec<u8>,
    next: Vec<u32>,
    free: FreeList,
}

impl Store {
    pub(crate) fn new(total: u64) -> Self {
        let n = (total as usize).div_ceil(CHUNK);
        Store {
            bytes: vec![0; n * CHUNK],
            // (each chunk's link is written when the chunk is taken: zeroed
            // memory, which the allocator need not write, will do)
            next: vec![0; n],
            free: FreeList::new(n),
        }
    }

    /// Chains enough chunks for `len` bytes; `NIL` for zero bytes, `None` when full.
    pub(crate) fn alloc(&mut self, len: u64) -> Option<u32> {
        let n = (len as usize).div_ceil(CHUNK);
        if self.free.available() < n {
            return None;
        }
        let mut head = NIL;
        for _ in 0..n {
            let c = self.free.alloc()?;
            self.next[c as usize] = head;
            head = c;
        }
        Some(head)
    }

    pub(crate) fn free(&mut self, mut head: u32) {
        while head != NIL {
            let n = self.next[head as usize];
            self.next[head as usize] = NIL;
            self.free.release(head);
            head = n;
        }
    }

    /// Copies `data` to byte `offset` of the chain (which must be long enough).
    /// The walk to `offset` starts at `at`, where this chain was last written,
    /// when `offset` lies at or past it, and `at` moves to where this write
    /// ended: fragments in order cost no walk, and one that skips ahead only
    /// the chunks it skips. (From the head each time, a message of `L` bytes
    /// in fragments of 64 cost `L^2 / 16384` steps: 2^26 at a 1 MiB eager
    /// threshold. A fragment behind the last one written, a hole filled late,
    /// still walks from the head: at most the eager threshold / 256 steps.)
    pub(crate) fn write(&mut self, head: u32, at: &mut Cursor, offset: u64, mut data: &[u8]) {
        let (mut c, mut start) = match *at {
            Cursor { chunk, start } if chunk != NIL && offset >= start => (chunk, start),
            _ => (head, 0),
        };
        while offset - start >= CHUNK as u64 && c != NIL {
            c = self.next[c as usize];
            start += CHUNK as u64;
        }
        let mut skip = (offset - start) as usize;
        while !data.is_empty() && c != NIL {
            *at = Cursor { chunk: c, start };
            let n = (CHUNK - skip).min(data.len());
            let i = c as usize * CHUNK + skip;
            self.bytes[i..i + n].copy_from_slice(&data[..n]);
            data = &data[n..];
            skip = 0;
            c = self.next[c as usize];
            start += CHUNK as u64;
        }
    }

    /// Copies `out.len()` bytes of the chain, from byte `offset` on, into `out`.
    pub(crate) fn read(&self, head: u32, offset: u64, out: &mut [u8]) {
        let mut c = head;
        let mut skip = offset as usize;
        while skip >= CHUNK && c != NIL {
            c = self.next[c as usize];
            skip -= CHUNK;
        }
        let mut done = 0;
        while done < out.len() && c != NIL {
            let n = (CHUNK - skip).min(out.len() - done);
            let at = c as usize * CHUNK + skip;
            out[done..done + n].copy_from_slice(&self.bytes[at..at + n]);
            done += n;
            skip = 0;
            c = self.next[c as usize];
        }
    }
}

// Matching against the core's queues: envelopes, the posted and unexpected queues, binding.
impl<S: AsRef<[u8]>, R: RecvBuffer> Core<S, R> {
    /// Allocates an envelope for a new message from `p` (not matchable yet),
    /// not yet in the id map (see [`map_msg`](Self::map_msg)).
    pub(crate) fn new_msg(
        &mut self,
        p: u16,
        msg_id: u32,
        rndv: bool,
        match_bits: u64,
        len: u64,
        unit: u16,
    ) -> Option<u32> {
        let charge = if rndv {
            rts_charge()
        } else {
            eager_charge(len)
        };
        let store = if rndv { NIL } else { self.store.alloc(len)? };
        let Some(m) = self.msg_free.alloc() else {
            self.store.free(store);
            return None;
        };
        let msg = InMsg {
            peer: p,
            msg_id,
            rndv,
            match_bits,
            len,
            received: 0,
            unit,
            frags: Default::default(),
            state: MsgState::Waiting,
            recv: NIL,
            store,
            at: Cursor::START,
            charge: charge as u32,
            orphan: false,
            claim: 0,
            mapped: false,
        };
        if m as usize == self.msgs.len() {
            // First taken (see `FreeList`: fresh ones come in order).
            self.msgs.push(msg);
        } else {
            self.msgs[m as usize] = msg;
        }
        let peer = &mut self.peers[p as usize];
        peer.held += charge;
        self.held_total += charge;
        self.msg_peer_links.push_back(&mut peer.msgs, m);
        Some(m)
    }

    /// Enters envelope `m` in the id map, where its later fragments, pulls
    /// and matching find it (see [`InMsg::mapped`]).
    pub(crate) fn map_msg(&mut self, m: u32) {
        let msg = &mut self.msgs[m as usize];
        msg.mapped = true;
        let key = msg_key(msg.peer, msg.msg_id);
        self.peers[msg.peer as usize].mapped += 1;
        self.msg_map.insert(key, m);
    }

    /// Takes envelope `m` out of the id map, if it is there.
    pub(crate) fn unmap_msg(&mut self, m: u32) {
        let msg = &mut self.msgs[m as usize];
        if msg.mapped {
            msg.mapped = false;
            let key = msg_key(msg.peer, msg.msg_id);
            self.peers[msg.peer as usize].mapped -= 1;
            self.msg_map.remove(&key);
        }
    }

    /// Gives an envelope's credit back to its sender (it no longer occupies the store).
    pub(crate) fn release_charge(&mut self, now: Time, m: u32) {
        let msg = &mut self.msgs[m as usize];
        let c = msg.charge as u64;
        if c == 0 {
            return;
        }
        msg.charge = 0;
        let p = msg.peer;
        let peer = &mut self.peers[p as usize];
        peer.held -= c;
        self.held_total -= c;
        self.return_credit(now, p, c);
    }

    /// Gives `c` bytes of credit back to peer `p`. A sender may be waiting on it: tell
    /// it at once when half its credit came back since the last frame that carried a
    /// limit, otherwise with the next (delayed) ack. Without the first, a sender whose
    /// credit runs out before the receiver's `ack_every` frames waits `ack_delay` for
    /// every credit's worth of messages.
    pub(crate) fn return_credit(&mut self, now: Time, p: u16, c: u64) {
        let peer = &mut self.peers[p as usize];
        peer.credit_released = peer.credit_released.wrapping_add(c as u32);
        if peer.dead || peer.epoch == 0 {
            // A message kept from a session that is over: nobody to tell
            // (an ack owed to a dead peer, or to one reconnected that has
            // not answered yet, cannot be sent, and would keep
            // `owes_nothing` false for good; the next session's frames
            // carry the credit).
            return;
        }
        let limit = peer.credit_released.wrapping_add(self.peer_credit as u32);
        if limit.wrapping_sub(peer.credit_advertised) as u64 >= self.peer_credit / 2 {
            peer.ack_now = true;
            self.mark_ready(p);
        } else {
            self.want_ack(p, now);
        }
    }

    /// Frees an envelope (not in the unexpected queue any more).
    pub(crate) fn free_msg(&mut self, m: u32) {
        let msg = self.msgs[m as usize];
        if msg.charge != 0 {
            // Dropped without binding: the charge simply disappears with the session.
            let peer = &mut self.peers[msg.peer as usize];
            peer.held -= msg.charge as u64;
            self.held_total -= msg.charge as u64;
        }
        self.store.free(msg.store);
        self.msgs[m as usize].store = NIL;
        self.msgs[m as usize].charge = 0;
        let peer = &mut self.peers[msg.peer as usize];
        self.msg_peer_links.remove(&mut peer.msgs, m);
        self.unmap_msg(m);
        self.msg_free.release(m);
    }

    /// Binds message `m` (out of any queue) to receive `r` (out of the posted list).
    pub(crate) fn bind(&mut self, now: Time, m: u32, r: u32) {
        let msg = self.msgs[m as usize];
        let slot = &mut self.recvs[r as usize];
        let buf = slot.buf.as_mut().expect("live receive");
        if buf.lends() {
            // No frame to lend (the message is stored, spans frames, or is a
            // rendezvous): room for what it can take, which is bounded.
            let len = msg.len.min(self.cfg.eager_threshold);
            buf.fit(len as usize);
            slot.buf_len = len;
        }
        slot.state = RecvState::Active;
        slot.msg = m;
        // An orphan (kept, complete, from a session that is over) completes
        // now and needs nothing of its peer: engaging a dead one would greet
        // it and start a session that only `reconnect` may start.
        let engage = slot.inv_peer == NO_PEER && !msg.orphan;
        if engage {
            slot.inv_peer = msg.peer;
            self.engage(msg.peer, now);
        }
        self.msgs[m as usize].state = MsgState::Bound;
        self.msgs[m as usize].recv = r;
        self.release_charge(now, m);
        if msg.rndv {
            self.start_pull(m, r);
        } else {
            // Copy what already arrived; later fragments go straight to the buffer.
            let slot = &mut self.recvs[r as usize];
            let n = msg.len.min(slot.buf_len) as usize;
            if msg.received > 0 && n > 0 {
                let buf = slot.buf.as_mut().expect("live receive").as_mut();
                if msg.received == msg.len {
                    self.store.read(msg.store, 0, &mut buf[..n]);
                } else {
                    // Only the fragments that arrived: the store's other bytes
                    // are what earlier messages (of any peer) left there, and a
                    // receive that fails before the rest comes hands its buffer
                    // back as it is.
                    let store = &self.store;
                    msg.frags.arrived(n as u64, u32::from(msg.unit), |s, e| {
                        store.read(msg.store, s, &mut buf[s as usize..e as usize]);
                    });
                }
            }
            self.store.free(msg.store);
            self.msgs[m as usize].store = NIL;
            if msg.received == msg.len {
                let info = self.recv_info(&msg, r);
                self.complete_recv(r, Ok(info));
            }
        }
    }

    /// The first posted receive that takes a message from `p` with `bits`.
    pub(crate) fn find_posted(&self, p: u16, bits: u64) -> u32 {
        let mut r = self.posted.head;
        while r != NIL {
            let s = &self.recvs[r as usize];
            if (s.src == NO_PEER || s.src == p) && matches(bits, s.match_bits, s.mask) {
                return r;
            }
            r = self.recv_links.next(r);
        }
        NIL
    }

    /// Matches this peer's messages that became matchable, in message-id order.
    pub(crate) fn advance_matching(&mut self, now: Time, p: u16) {
        loop {
            let next = self.peers[p as usize].next_match;
            let Some(&m) = self.msg_map.get(&msg_key(p, next)) else {
                break;
            };
            let state = self.msgs[m as usize].state;
            if state != MsgState::Waiting && state != MsgState::Withdrawn {
                break;
            }
            self.peers[p as usize].next_match = next.wrapping_add(1);
            if state == MsgState::Withdrawn {
                // Its sender withdrew it (and was told): nothing takes it.
                self.release_charge(now, m);
                self.free_msg(m);
            } else {
                self.match_in_turn(now, p, m);
            }
        }
    }

    /// Message `m` of `p`, its peer's next in turn: bound to the first
    /// posted receive that takes it, or queued as unexpected.
    pub(crate) fn match_in_turn(&mut self, now: Time, p: u16, m: u32) {
        let r = self.find_posted(p, self.msgs[m as usize].match_bits);
        if r != NIL {
            self.recv_links.remove(&mut self.posted, r);
            self.bind(now, m, r);
        } else {
            self.queue_unexpected(m);
        }
    }

    /// Queues message `m`, its peer's next to match (already counted past),
    /// which no posted receive takes, as unexpected: the receive posted for
    /// it will find it there.
    pub(crate) fn queue_unexpected(&mut self, m: u32) {
        self.msgs[m as usize].state = MsgState::Unexpected;
        self.msg_links.push_back(&mut self.unexpected, m);
        self.stats.unexpected += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fragments written in any order land where they belong, whichever way
    /// the write cursor has to go: on, ahead, or back to the head.
    #[test]
    fn store_fragments_in_any_order() {
        let len = 5000usize;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let frags: Vec<usize> = (0..len.div_ceil(64)).collect();
        let mut shuffled = frags.clone();
        let mut x = 0x9E37_79B9u64;
        for i in (1..shuffled.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            shuffled.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let orders = [
            frags.clone(),
            frags.iter().rev().copied().collect(),
            frags
                .iter()
                .copied()
                .filter(|f| f % 2 == 1)
                .chain(frags.iter().copied().filter(|f| f % 2 == 0))
                .collect(),
            shuffled,
        ];
        let mut s = Store::new(32 * CHUNK as u64);
        for order in orders {
            let h = s.alloc(len as u64).unwrap();
            let mut at = Cursor::START;
            for f in order {
                let (a, b) = (f * 64, (f * 64 + 64).min(len));
                s.write(h, &mut at, a as u64, &data[a..b]);
            }
            let mut out = vec![0; len];
            s.read(h, 0, &mut out);
            assert!(out == data);
            s.free(h);
        }
    }

    #[test]
    fn store_roundtrip_and_bound() {
        let mut s = Store::new(4 * CHUNK as u64);
        let h = s.alloc(3 * CHUNK as u64 - 10).unwrap();
        assert!(s.alloc(2 * CHUNK as u64).is_none());
        let data: Vec<u8> = (0..3 * CHUNK - 10).map(|i| i as u8).collect();
        let mut at = Cursor::START;
        s.write(h, &mut at, 300, &data[300..]);
        s.write(h, &mut at, 0, &data[..300]);
        let mut out = vec![0; data.len()];
        s.read(h, 0, &mut out);
        assert_eq!(out, data);
        // From an offset, across chunks.
        let mut part = vec![0; CHUNK + 20];
        s.read(h, CHUNK as u64 - 10, &mut part);
        assert_eq!(part, data[CHUNK - 10..2 * CHUNK + 10]);
        s.free(h);
        assert!(s.alloc(4 * CHUNK as u64).is_some());
    }

    #[test]
    fn match_rule() {
        assert!(matches(0xab, 0xa0, 0xf0));
        assert!(!matches(0xab, 0xa0, 0xff));
        assert!(matches(1, 2, 0));
    }
}
