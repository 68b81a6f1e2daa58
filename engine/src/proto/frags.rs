//! Which fragments of a message arrived.
//!
//! A sender sends each byte of a message once: a retransmission keeps its
//! sequence number, and the reliability layer drops it as a duplicate before a
//! protocol looks at it. A fragment that repeats bytes that arrived already
//! therefore comes from a broken or hostile peer. Counted in bytes alone, two
//! fragments at one offset would complete the message with a hole that holds
//! whatever its buffer held before (for a message in the unexpected store,
//! another peer's earlier bytes, which an echo would send back).
//!
//! Fragments are whole units of the sender's fragment size, which every frame
//! names and the wire checks ([`crate::wire`], "Fragments"), so a fragment is an
//! index. [`Frags`] keeps the index below which every fragment arrived and a
//! bitmap of the `64 * W` fragments after it, and refuses an index it holds
//! already. A legitimate sender's fragments of one message leave in index
//! order, so while fragment `k` is missing, those that arrive lie within one
//! window of frames after it: at most 256
//! ([`MAX_WINDOW`](super::reliability::MAX_WINDOW)), which `W = 4` covers
//! (rendezvous data). An eager message keeps `W = 1`, 64 fragments: as many as
//! the default window lets arrive past a gap, and as many as one of 32 KiB
//! (the default threshold) has at an MTU of 600 or above. One further ahead
//! (with a larger window), the first fragment of a message included, is
//! refused as a lack of resources, not acknowledged, and sent again later.

use super::slab::{ones_at_start, shift_down};
use crate::wire::DropReason;

/// The fragments of one message that arrived: see the [module](self). `W`
/// words of bitmap track `64 * W` fragments past the first gap. Fragments
/// are named by their offsets, and `unit` is the message's fragment unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Frags<const W: usize> {
    /// Where the first fragment that did not arrive starts: all before it
    /// did.
    next: u64,
    /// Bit `j` (of word `j / 64`): the fragment `j` units past `next`
    /// arrived. Bit 0 is clear.
    bits: [u64; W],
}

impl<const W: usize> Default for Frags<W> {
    fn default() -> Self {
        Frags {
            next: 0,
            bits: [0; W],
        }
    }
}

impl<const W: usize> Frags<W> {
    /// Whether the fragment at `off` is new ([`DropReason::Protocol`] if it
    /// arrived already, or does not start on a unit) and can be noted
    /// ([`DropReason::Resources`] if it lies `64 * W` units or more past the
    /// first missing one). Changes nothing. In order, nothing is divided.
    #[inline]
    pub(crate) fn check(&self, off: u64, unit: u32) -> Result<(), DropReason> {
        if off == self.next {
            return Ok(());
        }
        if off < self.next || unit == 0 {
            return Err(DropReason::Protocol);
        }
        let d = off - self.next;
        let unit = u64::from(unit);
        if d % unit != 0 {
            return Err(DropReason::Protocol);
        }
        let j = d / unit;
        if j >= 64 * W as u64 {
            return Err(DropReason::Resources);
        }
        if self.bits[j as usize / 64] & (1 << (j % 64)) != 0 {
            return Err(DropReason::Protocol);
        }
        Ok(())
    }

    /// Notes the fragment at `off`, which [`check`](Self::check) took. (After
    /// a message's last fragment, shorter than a unit, the mark lies past the
    /// message's end: nothing more is due. A message that came whole has unit
    /// 0, and its one fragment moves the mark past it too.)
    #[inline]
    pub(crate) fn add(&mut self, off: u64, unit: u32) {
        debug_assert_eq!(self.check(off, unit), Ok(()));
        let unit = u64::from(unit.max(1));
        if off == self.next && self.bits == [0; W] {
            self.next += unit;
            return;
        }
        let j = ((off - self.next) / unit) as usize;
        self.bits[j / 64] |= 1 << (j % 64);
        // Move past the run that now starts at `next`.
        let run = ones_at_start(&self.bits);
        if run > 0 {
            shift_down(&mut self.bits, run);
            self.next += run as u64 * unit;
        }
    }

    /// Where the first fragment that did not arrive starts.
    #[cfg(test)]
    pub(crate) fn done(&self) -> u64 {
        self.next
    }

    /// Calls `f` with each run of bytes below `len` that arrived, as
    /// `(start, end)`, in order (a message whose fragments are of `unit`).
    pub(crate) fn arrived(&self, len: u64, unit: u32, mut f: impl FnMut(u64, u64)) {
        let unit = u64::from(unit.max(1));
        let mut run: Option<(u64, u64)> = (self.next > 0).then_some((0, self.next.min(len)));
        for j in 1..64 * W as u64 {
            let start = self.next + j * unit;
            if start >= len {
                break;
            }
            if self.bits[j as usize / 64] & (1 << (j % 64)) == 0 {
                continue;
            }
            let end = (start + unit).min(len);
            run = match run {
                Some((s, e)) if e == start => Some((s, end)),
                Some((s, e)) => {
                    f(s, e);
                    Some((start, end))
                }
                None => Some((start, end)),
            };
        }
        if let Some((s, e)) = run.filter(|&(s, e)| s < e) {
            f(s, e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Fragment `k` of unit 10.
    fn take<const W: usize>(f: &mut Frags<W>, k: u64) -> Result<(), DropReason> {
        f.check(k * 10, 10)?;
        f.add(k * 10, 10);
        Ok(())
    }

    fn check<const W: usize>(f: &Frags<W>, k: u64) -> Result<(), DropReason> {
        f.check(k * 10, 10)
    }

    #[test]
    fn in_order_fragments_move_the_mark() {
        let mut f = Frags::<4>::default();
        for k in 0..1000 {
            assert_eq!(take(&mut f, k), Ok(()));
        }
        assert_eq!(f.done(), 10_000);
        assert_eq!(f.bits, [0; 4]);
    }

    #[test]
    fn repeats_are_refused() {
        let mut f = Frags::<1>::default();
        assert_eq!(take(&mut f, 0), Ok(()));
        assert_eq!(take(&mut f, 3), Ok(()));
        assert_eq!(check(&f, 0), Err(DropReason::Protocol));
        assert_eq!(check(&f, 3), Err(DropReason::Protocol));
        assert_eq!(take(&mut f, 2), Ok(()));
        assert_eq!(take(&mut f, 1), Ok(()));
        assert_eq!((f.done(), f.bits), (40, [0]));
        assert_eq!(check(&f, 2), Err(DropReason::Protocol));
    }

    #[test]
    fn off_the_grid_is_refused() {
        let mut f = Frags::<1>::default();
        assert_eq!(take(&mut f, 0), Ok(()));
        assert_eq!(f.check(15, 10), Err(DropReason::Protocol));
        assert_eq!(f.check(5, 10), Err(DropReason::Protocol));
        assert_eq!(f.check(20, 0), Err(DropReason::Protocol));
    }

    #[test]
    fn too_far_ahead_waits_and_the_mark_always_moves() {
        let mut f = Frags::<2>::default();
        assert_eq!(check(&f, 128), Err(DropReason::Resources));
        assert_eq!(take(&mut f, 127), Ok(()));
        for k in 1..127 {
            assert_eq!(take(&mut f, k), Ok(()));
        }
        assert_eq!(check(&f, 128), Err(DropReason::Resources));
        assert_eq!(take(&mut f, 0), Ok(()));
        assert_eq!((f.done(), f.bits), (1280, [0, 0]));
        assert_eq!(take(&mut f, 128), Ok(()));
    }

    /// The runs that arrived: below the mark, and past it one by one, joined
    /// where they touch; nothing past the message's end.
    #[test]
    fn arrived_runs() {
        let runs = |f: &Frags<1>, len| {
            let mut v = Vec::new();
            f.arrived(len, 10, |s, e| v.push((s, e)));
            v
        };
        let mut f = Frags::<1>::default();
        assert_eq!(runs(&f, 95), []);
        for k in [0, 1, 3, 4, 6, 9] {
            take(&mut f, k).unwrap();
        }
        assert_eq!(runs(&f, 95), [(0, 20), (30, 50), (60, 70), (90, 95)]);
        assert_eq!(runs(&f, 65), [(0, 20), (30, 50), (60, 65)]);
        assert_eq!(runs(&f, 15), [(0, 15)]);
    }

    proptest! {
        /// Fragments delivered in a random order with random repeats, then
        /// the missing ones in order (a sender resending): every repeat is
        /// refused, every fragment is taken once.
        #[test]
        fn any_order_takes_each_fragment_once(
            n in 1usize..600,
            order in proptest::collection::vec(any::<prop::sample::Index>(), 0..1500),
        ) {
            let mut f = Frags::<4>::default();
            let mut got = vec![false; n];
            let mut try_one = |k: usize, f: &mut Frags<4>| {
                match take(f, k as u64) {
                    Ok(()) => {
                        prop_assert!(!got[k], "a repeat was taken");
                        got[k] = true;
                    }
                    Err(DropReason::Protocol) => prop_assert!(got[k], "a new fragment was refused"),
                    Err(DropReason::Resources) => prop_assert!(!got[k]),
                    Err(e) => prop_assert!(false, "{e:?}"),
                }
                Ok(())
            };
            for ix in &order {
                try_one(ix.index(n), &mut f)?;
            }
            for k in 0..n {
                if check(&f, k as u64) != Err(DropReason::Protocol) {
                    try_one(k, &mut f)?;
                }
            }
            prop_assert_eq!(f.done(), n as u64 * 10);
            prop_assert_eq!(f.bits, [0; 4]);
        }
    }
}
