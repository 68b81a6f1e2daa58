//! Per-pair reliability: the receive-side sequence window with its cumulative and
//! selective acknowledgement, the RTT estimator that sets the retransmission timeout, and
//! the sender's half (acks in, loss detection, timeouts) as methods of the core, which
//! owns the in-flight frame records.
//!
//! The scheme is selective repeat. Each direction of an endpoint pair numbers its
//! reliable frames with a 32-bit sequence number. The receiver accepts any frame within
//! [`MAX_WINDOW`] sequence numbers of the next one it expects, processes it at once (the
//! eager and rendezvous layers are written so that frame order does not matter to them),
//! and reports `ack` (the next sequence number expected: everything below arrived) plus a
//! 64-bit bitmap of the first 64 above it. Acks ride on every frame; a pure ack is
//! sent only after `ack_every` frames, after `ack_delay`, or at once when a gap or a
//! duplicate shows that the sender needs to hear (fast retransmit). The sender marks a
//! frame lost when three later frames were selectively acked (a frame it has not sent
//! again), when a frame sent later than it (by more than a quarter RTT) was acked (RACK),
//! or when the retransmission timeout expires (exponential backoff); lost frames go out
//! again, with their original sequence number, before any new frame. This module does not
//! emit frames or decide what to send next: that is the core's transmit path.

use super::core::Core;
use super::slab::{ones_at_start, shift_down, NIL};
use super::Time;
use super::{RecvBuffer, MAX_PEER_CREDIT};
use crate::wire::{DropReason, FrameType, Header};
use core::time::Duration;

/// What to do with an arriving reliable frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    /// New: process it. `in_order` when it was the next one expected.
    New {
        /// Whether the frame filled the head of the window.
        in_order: bool,
    },
    /// Seen before: drop it, but ack promptly (the sender missed our ack).
    Duplicate,
    /// Beyond the window: drop it, the sender broke the window.
    OutOfWindow,
}

/// Sequence numbers a receiver accepts beyond the next one it expects, and so
/// the largest send window ([`CoreConfig::window`](super::CoreConfig)). Every
/// receiver accepts this span whatever its own window, so peers configured
/// with different windows work together.
pub const MAX_WINDOW: u32 = 256;

/// Words of the receive bitmap.
const SEEN_WORDS: usize = (MAX_WINDOW / 64) as usize;

/// The receive side of one direction of a pair: next expected sequence number and the
/// bitmap of frames received beyond it.
///
/// The bitmap spans [`MAX_WINDOW`] sequence numbers; an ack reports its first 64
/// ([`sack`](Self::sack)), the wire header's selective-ack field. A frame received
/// further beyond a gap is kept and counted when the gap fills, but its sender hears
/// of it only then: the ack's cumulative part jumps past it. (TCP's SACK blocks have
/// the same limit.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecvWindow {
    /// Next sequence number expected; every lower one has arrived.
    pub next: u32,
    /// Bit i (of word i / 64): sequence number `next + 1 + i` has arrived.
    seen: [u64; SEEN_WORDS],
}

impl RecvWindow {
    /// The selective-ack bitmap an ack carries: bit i set when sequence number
    /// `next + 1 + i` has arrived.
    #[inline]
    pub fn sack(&self) -> u64 {
        self.seen[0]
    }

    /// Whether nothing beyond `next` has arrived (no gap is open).
    #[inline]
    pub fn no_gap(&self) -> bool {
        self.seen.iter().all(|&w| w == 0)
    }

    /// Classifies `seq` without changing anything.
    #[inline]
    pub fn check(&self, seq: u32) -> Accept {
        let d = seq.wrapping_sub(self.next);
        if d == 0 {
            Accept::New { in_order: true }
        } else if (d as i32) < 0 {
            Accept::Duplicate
        } else if d <= MAX_WINDOW {
            let b = (d - 1) as usize;
            if self.seen[b / 64] & (1u64 << (b % 64)) != 0 {
                Accept::Duplicate
            } else {
                Accept::New { in_order: false }
            }
        } else {
            Accept::OutOfWindow
        }
    }

    /// Records `seq` as received; it must have been classified [`Accept::New`].
    #[inline]
    pub fn commit(&mut self, seq: u32) {
        let d = seq.wrapping_sub(self.next);
        if d == 0 {
            if self.no_gap() {
                // The common case: in order, nothing beyond.
                self.next = self.next.wrapping_add(1);
                return;
            }
            // Slide past the new frame and every already-received one after it.
            let run = ones_at_start(&self.seen);
            self.next = self.next.wrapping_add(run as u32 + 1);
            shift_down(&mut self.seen, run + 1);
        } else {
            debug_assert!((1..=MAX_WINDOW).contains(&d));
            let b = (d - 1) as usize;
            self.seen[b / 64] |= 1u64 << (b % 64);
        }
    }
}

/// Smoothed RTT and retransmission timeout (RFC 6298 arithmetic, in nanoseconds).
#[derive(Debug, Clone, Copy)]
pub struct RttEstimator {
    srtt: u64,
    rttvar: u64,
    rto: u64,
    backoff: u8,
}

impl RttEstimator {
    /// A fresh estimator whose timeout is `initial`.
    pub fn new(initial: Duration) -> Self {
        RttEstimator {
            srtt: 0,
            rttvar: 0,
            rto: initial.as_nanos() as u64,
            backoff: 0,
        }
    }

    /// Feeds one sample (from a frame that was not retransmitted: Karn's rule).
    #[inline]
    pub fn sample(&mut self, rtt: Duration, min: Duration, max: Duration) {
        let r = rtt.as_nanos() as u64;
        if self.srtt == 0 {
            self.srtt = r.max(1);
            self.rttvar = r / 2;
        } else {
            let err = self.srtt.abs_diff(r);
            self.rttvar = (3 * self.rttvar + err) / 4;
            self.srtt = (7 * self.srtt + r) / 8;
        }
        let rto = self.srtt + (4 * self.rttvar).max(1000);
        self.rto = rto.clamp(min.as_nanos() as u64, max.as_nanos() as u64);
    }

    /// The smoothed RTT (zero before the first sample).
    #[inline]
    pub fn srtt(&self) -> Duration {
        Duration::from_nanos(self.srtt)
    }

    /// The retransmission timeout with the current backoff applied.
    #[inline]
    pub fn rto(&self, max: Duration) -> Duration {
        let r = self.rto.saturating_mul(1u64 << self.backoff.min(20));
        Duration::from_nanos(r.min(max.as_nanos() as u64))
    }

    /// Doubles the timeout after it expired.
    pub fn back_off(&mut self) {
        self.backoff = self.backoff.saturating_add(1).min(20);
    }

    /// Forgets the backoff after an ack made progress.
    #[inline]
    pub fn reset_backoff(&mut self) {
        self.backoff = 0;
    }
}

/// Half the 32-bit sequence space: serial order cannot say whether a number
/// this far from another comes before it or after.
const HALF_SEQ: u32 = 1 << 31;

/// Whether `a` comes before `b` in wrapping 32-bit sequence space.
#[inline]
pub fn seq_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

// The sender's half: acks in, loss detection, retransmission timeout. The frame
// records live in the core's tables, so this half is written against the core.
impl<S: AsRef<[u8]>, R: RecvBuffer> Core<S, R> {
    /// An ack that acknowledges frames never sent is a lie: a cumulative
    /// ack past the last frame sent (or exactly half the sequence space
    /// away, which serial order cannot place), a selective ack of a frame
    /// not sent yet, or a credit limit further ahead of what this side used
    /// than any receiver grants. (Such a frame comes only from a corrupted
    /// header that no checksum covered, or from a forger.)
    pub(crate) fn check_ack(&self, p: u16, h: &Header) -> Result<(), DropReason> {
        let peer = &self.peers[p as usize];
        let una = self.una(p);
        let ahead = h.ack.wrapping_sub(una);
        let span = peer.snd_next.wrapping_sub(una);
        if ahead > span && ahead <= HALF_SEQ {
            return Err(DropReason::Protocol);
        }
        if ahead <= span {
            // SACK bit i names frame ack + 1 + i, of the frames from `ack`
            // to the last sent.
            let named = (span - ahead).saturating_sub(1);
            if named < 64 && h.sack >> named != 0 {
                return Err(DropReason::Protocol);
            }
        }
        // A receiver grants at most `MAX_PEER_CREDIT` beyond what it released,
        // and it released no more than was used. (Taken, a larger limit
        // would stand for the rest of the session: later, honest ones would
        // read as older.)
        if h.credit.wrapping_sub(peer.credit_used) > MAX_PEER_CREDIT as u32
            && h.credit.wrapping_sub(peer.credit_used) <= HALF_SEQ
        {
            return Err(DropReason::Protocol);
        }
        Ok(())
    }

    /// The oldest sequence number of `p` not acknowledged yet.
    fn una(&self, p: u16) -> u32 {
        let peer = &self.peers[p as usize];
        if peer.inflight.is_empty() {
            peer.snd_next
        } else {
            self.frames[peer.inflight.head as usize].seq
        }
    }

    /// Applies the ack fields of a frame of the current session.
    pub(crate) fn on_ack(&mut self, now: Time, p: u16, h: &Header) {
        let peer = &mut self.peers[p as usize];
        // Credit: the newest limit wins (frames may arrive out of order).
        if !peer.credit_known || (h.credit.wrapping_sub(peer.credit_limit) as i32) > 0 {
            peer.credit_limit = h.credit;
            peer.credit_known = true;
            if peer.credit_stalled {
                peer.credit_stalled = false;
                if peer.inflight.is_empty() {
                    // The persist probes' backoff (nothing else backed off).
                    peer.rtt.reset_backoff();
                }
            }
        }
        if peer.inflight.is_empty() {
            return;
        }
        let mut progress = false;
        let una = self.frames[peer.inflight.head as usize].seq;
        // Frames before `ack` are acknowledged: `cum` of them from `una`, or
        // none when the ack is an older one (frames may arrive out of
        // order), which serial order alone would read as acknowledging
        // frames far ahead once it is half the sequence space away.
        let cum = {
            let c = h.ack.wrapping_sub(una);
            if c <= peer.snd_next.wrapping_sub(una) {
                c
            } else {
                0
            }
        };
        let mut i = peer.inflight.head;
        let mut latest = peer.latest_acked_sent;
        // The newest retransmission this ack covers, and whether it covers a
        // frame sent only once (see below).
        let mut latest_retx = Time::ZERO;
        let mut first_acked = false;
        // Karn: sample only frames sent once; one sample per ack, from the newest.
        let mut sample_from = Time::ZERO;
        let mut sampled = false;
        while i != NIL {
            let next = self.frame_links.next(i);
            let f = self.frames[i as usize];
            let before_ack = f.seq.wrapping_sub(una) < cum;
            let d = f.seq.wrapping_sub(h.ack) as i32;
            if d > 64 && !before_ack {
                break;
            }
            let acked = before_ack || (d > 0 && d <= 64 && h.sack & (1u64 << (d - 1)) != 0);
            if acked {
                let peer = &mut self.peers[p as usize];
                if f.retx == 0 {
                    first_acked = true;
                    if f.sent_at >= sample_from {
                        sample_from = f.sent_at;
                        sampled = true;
                    }
                    if f.sent_at > latest {
                        latest = f.sent_at;
                    }
                } else if f.sent_at > latest_retx {
                    latest_retx = f.sent_at;
                }
                if f.lost {
                    peer.lost -= 1;
                }
                self.frame_links.remove(&mut peer.inflight, i);
                self.frame_free.release(i);
                progress = true;
                match f.kind {
                    FrameType::Eager | FrameType::Rts | FrameType::PullData => {
                        self.frame_acked(f.slot)
                    }
                    FrameType::Pack => {
                        let mut j = f.slot;
                        for _ in 0..f.len {
                            // (taken first: the send may complete and leave the list)
                            let next = self.send_links.next(j);
                            self.frame_acked(j);
                            j = next;
                        }
                    }
                    _ => {}
                }
            }
            i = next;
        }
        // An ack of a retransmitted frame is ambiguous: it may answer the first
        // transmission. When the same ack also covers frames sent only once,
        // the receiver is getting first transmissions (a timeout that fired
        // because the peer was slow, say a descheduled thread, not because the
        // link lost anything), and only those date it: dating it by the
        // retransmission would declare lost every frame sent before it. An ack
        // that covers retransmissions alone dates them: the frames sent before
        // the timeout's probe and still unacknowledged are lost.
        let probe_answered = !first_acked && latest_retx > latest;
        if probe_answered {
            latest = latest_retx;
        }
        let peer = &mut self.peers[p as usize];
        peer.latest_acked_sent = latest;
        // Frames sent once but before a retransmission that this ack also
        // covers waited for it at the receiver (past the selective ack's
        // reach, with a window over 64, they are acknowledged only once the
        // gap fills): their sample would measure the repair, a timeout long,
        // not the link. Only frames sent after it date this ack.
        if sampled && sample_from > latest_retx {
            peer.rtt
                .sample(now - sample_from, self.cfg.rto_min, self.rto_cap);
        }
        if progress && self.may_feed() {
            // Frames just freed go to the work that waits for them now, so
            // that the rest of this burst sees the table as it is (an RTS is
            // refused while NOTIFYs or pulls wait).
            self.feed_starved();
        }
        let peer = &mut self.peers[p as usize];
        if progress {
            peer.progress_at = now;
            peer.rtt.reset_backoff();
            peer.rto_at = if peer.inflight.is_empty() {
                Time::NEVER
            } else {
                now + peer.rtt.rto(self.rto_cap)
            };
        }
        if (h.sack != 0 || probe_answered) && !peer.inflight.is_empty() {
            // Loss detection: three later frames arrived (for a frame not sent again), or a
            // frame sent later than this one by more than the reordering window was acked.
            let reo = peer.rtt.srtt() / 4 + core::time::Duration::from_micros(1);
            let mut i = peer.inflight.head;
            while i != NIL {
                let f = &mut self.frames[i as usize];
                if !f.lost {
                    let d = f.seq.wrapping_sub(h.ack);
                    let above = if d >= 64 {
                        0
                    } else {
                        (h.sack >> d).count_ones()
                    };
                    if (f.retx == 0 && above >= 3) || f.sent_at + reo < latest {
                        f.lost = true;
                        peer.lost += 1;
                        peer.loss_seen_at = Some(now);
                    }
                }
                i = self.frame_links.next(i);
            }
        }
    }

    /// The retransmission timer fired: the frames that waited a whole timeout
    /// are declared lost and the timer backs off. On a link that has not lost
    /// a frame lately (see [`LOSSY_FOR`]), only the oldest of them goes again,
    /// alone (RFC 6298 5.4).
    ///
    /// A timeout says that the peer has been silent, not which frames it
    /// misses. A peer that was slow (a descheduled thread) acknowledges the
    /// rest when it answers, so declaring them all lost would send a window
    /// again for nothing, once per backed-off timeout while it stays silent. A
    /// link that lost them all shows it when the probe's acknowledgement comes
    /// back alone: [`on_ack`](Self::on_ack) then declares lost the frames sent
    /// before the probe, and they go again together. On a link that has been
    /// losing frames, what waited a whole timeout is most likely lost too, and
    /// going again at once saves that round trip.
    pub(crate) fn on_rto(&mut self, now: Time, p: u16) {
        let peer = &mut self.peers[p as usize];
        let rto = peer.rtt.rto(self.rto_cap);
        let lossy = peer.loss_seen_at.is_some_and(|t| now < t + LOSSY_FOR);
        let mut marked = false;
        let mut i = peer.inflight.head;
        while i != NIL {
            let f = &mut self.frames[i as usize];
            if !f.lost && f.sent_at + rto <= now {
                f.lost = true;
                peer.lost += 1;
                peer.stats.timeouts += 1;
                marked = true;
                if !lossy {
                    break;
                }
            }
            i = self.frame_links.next(i);
        }
        if marked {
            peer.rtt.back_off();
        }
        peer.rto_at = if peer.inflight.is_empty() {
            Time::NEVER
        } else {
            now + peer.rtt.rto(self.rto_cap)
        };
    }
}

/// How long after acknowledgements last showed a frame lost the link counts
/// as lossy for [`Core::on_rto`](Core): a timeout then declares every frame
/// that waited a whole timeout lost, not only the oldest.
pub(crate) const LOSSY_FOR: core::time::Duration = core::time::Duration::from_millis(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_slides_over_filled_gaps() {
        let mut w = RecvWindow::default();
        assert_eq!(w.check(1), Accept::New { in_order: false });
        w.commit(1);
        w.commit(3);
        assert_eq!(w.sack(), 0b101);
        assert_eq!(w.check(1), Accept::Duplicate);
        w.commit(0);
        assert_eq!(w.next, 2);
        assert_eq!(w.sack(), 0b1);
        w.commit(2);
        assert_eq!((w.next, w.sack()), (4, 0));
        assert!(w.no_gap());
        assert_eq!(w.check(3), Accept::Duplicate);
        assert_eq!(w.check(4 + MAX_WINDOW + 1), Accept::OutOfWindow);
        w.commit(4 + 64);
        assert_eq!(w.sack(), 1 << 63);
        // Beyond the ack's 64 bits: kept, not reported.
        w.commit(4 + MAX_WINDOW);
        assert_eq!(w.check(4 + MAX_WINDOW), Accept::Duplicate);
        assert_eq!(w.sack(), 1 << 63);
    }

    #[test]
    fn window_wraps() {
        let mut w = RecvWindow {
            next: u32::MAX,
            ..RecvWindow::default()
        };
        w.commit(0);
        w.commit(u32::MAX);
        assert_eq!((w.next, w.sack()), (1, 0));
        assert!(w.no_gap());
    }

    #[test]
    fn full_bitmap_slide() {
        let mut w = RecvWindow::default();
        for s in 1..=MAX_WINDOW {
            w.commit(s);
        }
        assert_eq!(w.sack(), u64::MAX);
        w.commit(0);
        assert_eq!(w.next, MAX_WINDOW + 1);
        assert!(w.no_gap());
    }

    /// The bitmap against a plain set of received numbers, for every gap
    /// pattern a few hundred random commits make.
    #[test]
    fn window_matches_a_set() {
        let mut w = RecvWindow {
            next: u32::MAX - 300,
            ..RecvWindow::default()
        };
        let mut got = std::collections::BTreeSet::new();
        let mut next = w.next;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let seq = next.wrapping_add((x % u64::from(MAX_WINDOW + 8)) as u32);
            let d = seq.wrapping_sub(next);
            let expect = if d > MAX_WINDOW {
                Accept::OutOfWindow
            } else if got.contains(&d) {
                Accept::Duplicate
            } else {
                Accept::New { in_order: d == 0 }
            };
            assert_eq!(w.check(seq), expect);
            if let Accept::New { .. } = expect {
                w.commit(seq);
                got.insert(d);
                // Slide the model.
                let mut k = 0;
                while got.contains(&k) {
                    k += 1;
                }
                got = got.into_iter().filter(|&e| e >= k).map(|e| e - k).collect();
                next = next.wrapping_add(k);
            }
            assert_eq!(w.next, next);
            let sack = (0..64)
                .filter(|&i| got.contains(&(i + 1)))
                .fold(0u64, |a, i| a | 1 << i);
            assert_eq!(w.sack(), sack);
            assert_eq!(w.no_gap(), got.is_empty());
        }
    }

    #[test]
    fn rto_backs_off_and_clamps() {
        let mut r = RttEstimator::new(Duration::from_millis(1));
        let (min, max) = (Duration::from_micros(100), Duration::from_millis(10));
        r.sample(Duration::from_micros(10), min, max);
        assert_eq!(r.rto(max), min);
        for _ in 0..10 {
            r.back_off();
        }
        assert_eq!(r.rto(max), max);
        r.reset_backoff();
        assert_eq!(r.rto(max), min);
    }
}
