//! Preallocated tables: free lists, intrusive doubly linked lists over slab indices, a
//! cheap hasher for the few integer-keyed maps, and the two operations of the bitmaps
//! that track what arrived past a gap. Nothing here allocates after construction.

use super::Time;
use std::cell::Cell;
use std::hash::{BuildHasherDefault, Hasher};

/// "No index".
pub(crate) const NIL: u32 = u32::MAX;

/// How many bits are set at the start of `bits` (bit 0 of word 0 first),
/// before the first clear one.
#[inline]
pub(crate) fn ones_at_start(bits: &[u64]) -> usize {
    let mut run = 0;
    for &w in bits {
        run += w.trailing_ones() as usize;
        if w != u64::MAX {
            break;
        }
    }
    run
}

/// Drops the first `n` bits of `bits` (all of them when `n` is as many or
/// more); the rest move down and zeros come in at the end.
pub(crate) fn shift_down(bits: &mut [u64], n: usize) {
    let (words, shift) = (n / 64, n % 64);
    for i in 0..bits.len() {
        let lo = bits.get(i + words).copied().unwrap_or(0);
        let hi = bits.get(i + words + 1).copied().unwrap_or(0);
        bits[i] = if shift == 0 {
            lo
        } else {
            (lo >> shift) | (hi << (64 - shift))
        };
    }
}

/// A stack of free indices over a table of `n`. Indices never handed out
/// are counted, not listed: they come in increasing order after the stack
/// is empty, so that a table sized for its worst case (the envelopes, about
/// 263,000 at the default store) is written only as far as it is used.
#[derive(Debug, Clone)]
pub(crate) struct FreeList {
    free: Vec<u32>,
    /// Indices from here to `n` were never handed out.
    fresh: u32,
    n: u32,
}

impl FreeList {
    pub(crate) fn new(n: usize) -> Self {
        let n = u32::try_from(n).expect("a table of fewer than 2^32 entries");
        FreeList {
            // (reserved, not written: its pages are touched as it fills)
            free: Vec::with_capacity(n as usize),
            fresh: 0,
            n,
        }
    }
    #[inline]
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        if let Some(i) = self.free.pop() {
            return Some(i);
        }
        (self.fresh < self.n).then(|| {
            self.fresh += 1;
            self.fresh - 1
        })
    }
    #[inline]
    pub(crate) fn release(&mut self, i: u32) {
        debug_assert!(i < self.fresh && self.free.len() < self.fresh as usize);
        self.free.push(i);
    }
    pub(crate) fn available(&self) -> usize {
        self.free.len() + (self.n - self.fresh) as usize
    }
    /// The table's size: every index it can hand out is below it.
    pub(crate) fn size(&self) -> usize {
        self.n as usize
    }
}

/// Links of one intrusive list family: each slab entry can sit in at most one list of
/// the family.
///
/// `ZEROED` links keep each index plus one, so that `NIL` is 0 and a new
/// table is zeroed memory, which the allocator hands over without writing
/// it: for the envelope tables, sized for their worst case (2 MiB of links
/// each at the default store) and used as far as messages wait at once. The
/// others keep indices as they are (one add fewer per link on the paths
/// every frame takes).
#[derive(Debug, Clone)]
pub(crate) struct Links<const ZEROED: bool = false> {
    prev: Vec<u32>,
    next: Vec<u32>,
}

/// Envelope links (see [`Links`]).
pub(crate) type ZeroedLinks = Links<true>;

/// The head of an intrusive list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct List {
    pub(crate) head: u32,
    pub(crate) tail: u32,
    pub(crate) len: u32,
}

impl Default for List {
    fn default() -> Self {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl List {
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<const ZEROED: bool> Links<ZEROED> {
    pub(crate) fn new(n: usize) -> Self {
        Links {
            prev: vec![Self::enc(NIL); n],
            next: vec![Self::enc(NIL); n],
        }
    }
    /// Index `i` as a link stores it.
    #[inline]
    fn enc(i: u32) -> u32 {
        if ZEROED {
            i.wrapping_add(1)
        } else {
            i
        }
    }
    /// A stored link as an index.
    #[inline]
    fn dec(v: u32) -> u32 {
        if ZEROED {
            v.wrapping_sub(1)
        } else {
            v
        }
    }
    #[inline]
    pub(crate) fn next(&self, i: u32) -> u32 {
        Self::dec(self.next[i as usize])
    }
    #[inline]
    pub(crate) fn push_back(&mut self, l: &mut List, i: u32) {
        self.prev[i as usize] = Self::enc(l.tail);
        self.next[i as usize] = Self::enc(NIL);
        if l.tail == NIL {
            l.head = i;
        } else {
            self.next[l.tail as usize] = Self::enc(i);
        }
        l.tail = i;
        l.len += 1;
    }
    #[inline]
    pub(crate) fn remove(&mut self, l: &mut List, i: u32) {
        let (p, n) = (
            Self::dec(self.prev[i as usize]),
            Self::dec(self.next[i as usize]),
        );
        if p == NIL {
            l.head = n;
        } else {
            self.next[p as usize] = Self::enc(n);
        }
        if n == NIL {
            l.tail = p;
        } else {
            self.prev[n as usize] = Self::enc(p);
        }
        self.prev[i as usize] = Self::enc(NIL);
        self.next[i as usize] = Self::enc(NIL);
        l.len -= 1;
    }
    #[inline]
    pub(crate) fn pop_front(&mut self, l: &mut List) -> Option<u32> {
        let h = l.head;
        if h == NIL {
            return None;
        }
        self.remove(l, h);
        Some(h)
    }
}

/// A tournament tree of times over a number of slots: the earliest in O(1), one slot
/// changed in O(log n), the due slots found in O(log n) each. Its nodes are cells so
/// that a `&self` query ([`Core::poll_timeout`](super::Core::poll_timeout)) can apply
/// the updates that were put off until it. It grows with the slots in use
/// ([`MinTree::grow`]), so that a change climbs as many levels as the peers need, not
/// as many as the largest table could.
#[derive(Debug)]
pub(crate) struct MinTree {
    leaves: usize,
    /// Node 1 is the root, node k has children 2k and 2k+1, slot i is node `leaves + i`.
    node: Vec<Cell<Time>>,
}

impl MinTree {
    pub(crate) fn new(n: usize) -> Self {
        let leaves = n.max(1).next_power_of_two();
        MinTree {
            leaves,
            node: vec![Cell::new(Time::NEVER); 2 * leaves],
        }
    }

    /// Makes room for `n` slots (the new ones unset). Allocates when the tree
    /// doubles: call it where slots are added, not on a fast path.
    pub(crate) fn grow(&mut self, n: usize) {
        if n <= self.leaves {
            return;
        }
        let t = MinTree::new(n);
        for i in 0..self.leaves {
            t.set(i, self.get(i));
        }
        *self = t;
    }

    /// The earliest time of any slot (`Time::NEVER` when none is set).
    #[inline]
    pub(crate) fn min(&self) -> Time {
        self.node[1].get()
    }

    /// The time of slot `i`.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Time {
        self.node[self.leaves + i].get()
    }

    /// Sets slot `i`.
    #[inline]
    pub(crate) fn set(&self, i: usize, t: Time) {
        let mut k = self.leaves + i;
        if self.node[k].get() == t {
            return;
        }
        self.node[k].set(t);
        while k > 1 {
            k /= 2;
            let m = self.node[2 * k].get().min(self.node[2 * k + 1].get());
            if self.node[k].get() == m {
                break; // the ancestors hold the same minimum already
            }
            self.node[k].set(m);
        }
    }

    /// The first slot at or after `from` whose time is at or before `t`.
    pub(crate) fn next_due(&self, from: usize, t: Time) -> Option<usize> {
        if from >= self.leaves {
            return None;
        }
        let mut k = self.leaves + from;
        while self.node[k].get() > t {
            // Climb past the right children: their right neighbours lie beyond the parent.
            while k & 1 == 1 {
                k >>= 1;
                if k <= 1 {
                    return None;
                }
            }
            k += 1;
        }
        while k < self.leaves {
            k = if self.node[2 * k].get() <= t {
                2 * k
            } else {
                2 * k + 1
            };
        }
        Some(k - self.leaves)
    }
}

/// Multiplicative hasher for integer keys. A peer picks its messages' ids, so
/// it can aim keys at one bucket; every map is bounded by configuration (a
/// peer's entries by its credit, a few thousand), so that costs lookups CPU
/// time, never memory. A keyed hasher would take that away at some cost on
/// every frame.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // Fold the well-mixed high bits down: the table indexes with the low ones.
        self.0 ^ (self.0 >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub(crate) type IdMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<IdHasher>>;

pub(crate) fn id_map<K, V>(cap: usize) -> IdMap<K, V> {
    IdMap::with_capacity_and_hasher(cap, Default::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list_ops_on<const Z: bool>() {
        let mut links = Links::<Z>::new(8);
        let mut l = List::default();
        for i in 0..5 {
            links.push_back(&mut l, i);
        }
        assert_eq!(links.next(4), NIL);
        assert_eq!(links.next(0), 1);
        links.remove(&mut l, 2);
        assert_eq!(links.next(1), 3);
        links.remove(&mut l, 0);
        links.remove(&mut l, 4);
        assert_eq!(l.len, 2);
        assert_eq!(links.next(3), NIL);
        assert_eq!(links.pop_front(&mut l), Some(1));
        assert_eq!(links.pop_front(&mut l), Some(3));
        assert_eq!(links.pop_front(&mut l), None);
        assert!(l.is_empty());
        // An entry taken out is unlinked, as one never linked.
        assert_eq!(links.next(2), NIL);
        assert_eq!(links.next(7), NIL);
    }

    #[test]
    fn list_ops() {
        list_ops_on::<false>();
    }

    #[test]
    fn zeroed_list_ops() {
        list_ops_on::<true>();
        // Index 0 and the last index survive the shift by one.
        let mut links = ZeroedLinks::new(3);
        let mut l = List::default();
        links.push_back(&mut l, 2);
        links.push_back(&mut l, 0);
        assert_eq!(
            (l.head, l.tail, links.next(2), links.next(0)),
            (2, 0, 0, NIL)
        );
    }

    #[test]
    fn free_list_hands_out_in_order_and_reuses_last_freed_first() {
        let mut f = FreeList::new(4);
        assert_eq!((f.available(), f.size()), (4, 4));
        assert_eq!((f.alloc(), f.alloc()), (Some(0), Some(1)));
        f.release(0);
        assert_eq!(f.available(), 3);
        // What was given back goes out again before an index never used.
        assert_eq!(f.alloc(), Some(0));
        assert_eq!((f.alloc(), f.alloc()), (Some(2), Some(3)));
        assert_eq!((f.alloc(), f.available()), (None, 0));
        f.release(3);
        f.release(1);
        assert_eq!((f.alloc(), f.alloc(), f.alloc()), (Some(1), Some(3), None));
    }

    #[test]
    fn min_tree() {
        for n in [1usize, 2, 5, 64] {
            let t = MinTree::new(n);
            assert_eq!(t.min(), Time::NEVER);
            assert_eq!(t.next_due(0, Time(u64::MAX - 1)), None);
            let mut want = vec![Time::NEVER; n];
            let mut x = 7u64;
            for _ in 0..500 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let i = (x >> 33) as usize % n;
                let v = if x & 7 == 0 {
                    Time::NEVER
                } else {
                    Time((x >> 40) % 100)
                };
                t.set(i, v);
                want[i] = v;
                assert_eq!(t.min(), *want.iter().min().unwrap());
                assert_eq!(t.get(i), v);
                let due = Time((x >> 20) % 100);
                let mut got = Vec::new();
                let mut from = 0;
                while let Some(j) = t.next_due(from, due) {
                    got.push(j);
                    from = j + 1;
                }
                let exp: Vec<usize> = (0..n).filter(|&j| want[j] <= due).collect();
                assert_eq!(got, exp);
            }
        }
    }

    #[test]
    fn min_tree_grows_keeping_its_times() {
        let mut t = MinTree::new(1);
        t.set(0, Time(50));
        for n in 2..=9usize {
            t.grow(n);
            assert_eq!(t.get(n - 1), Time::NEVER);
            t.set(n - 1, Time(100 - n as u64));
        }
        assert_eq!(t.get(0), Time(50));
        assert_eq!(t.min(), Time(50));
        t.set(0, Time::NEVER);
        assert_eq!(t.min(), Time(91));
        assert_eq!(t.next_due(0, Time(93)), Some(6));
        t.grow(3); // smaller: nothing changes
        assert_eq!(t.get(8), Time(91));
    }
}
