//! Preallocated tables: free lists, intrusive doubly linked lists over slab indices, and
//! a cheap hasher for the few integer-keyed maps. Nothing here allocates after
//! construction.

use std::hash::{BuildHasherDefault, Hasher};

/// "No index".
pub(crate) const NIL: u32 = u32::MAX;

/// A stack of free indices.
#[derive(Debug, Clone)]
pub(crate) struct FreeList {
    free: Vec<u32>,
}

impl FreeList {
    pub(crate) fn new(n: usize) -> Self {
        FreeList {
            free: (0..n as u32).rev().collect(),
        }
    }
    #[inline]
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        self.free.pop()
    }
    #[inline]
    pub(crate) fn release(&mut self, i: u32) {
        debug_assert!(self.free.len() < self.free.capacity() || !self.free.is_empty());
        self.free.push(i);
    }
    pub(crate) fn available(&self) -> usize {
        self.free.len()
    }
}

/// Links of one intrusive list family: each slab entry can sit in at most one list of
/// the family.
#[derive(Debug, Clone)]
pub(crate) struct Links {
    prev: Vec<u32>,
    next: Vec<u32>,
}

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

impl Links {
    pub(crate) fn new(n: usize) -> Self {
        Links {
            prev: vec![NIL; n],
            next: vec![NIL; n],
        }
    }
    #[inline]
    pub(crate) fn next(&self, i: u32) -> u32 {
        self.next[i as usize]
    }
    #[inline]
    pub(crate) fn push_back(&mut self, l: &mut List, i: u32) {
        self.prev[i as usize] = l.tail;
        self.next[i as usize] = NIL;
        if l.tail == NIL {
            l.head = i;
        } else {
            self.next[l.tail as usize] = i;
        }
        l.tail = i;
        l.len += 1;
    }
    #[inline]
    pub(crate) fn remove(&mut self, l: &mut List, i: u32) {
        let (p, n) = (self.prev[i as usize], self.next[i as usize]);
        if p == NIL {
            l.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            l.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i as usize] = NIL;
        self.next[i as usize] = NIL;
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

/// Multiplicative hasher for integer keys (the keys are ids, not attacker-chosen
/// strings, and every map is bounded by configuration).
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

    #[test]
    fn list_ops() {
        let mut links = Links::new(8);
        let mut l = List::default();
        for i in 0..5 {
            links.push_back(&mut l, i);
        }
        links.remove(&mut l, 2);
        links.remove(&mut l, 0);
        links.remove(&mut l, 4);
        assert_eq!(l.len, 2);
        assert_eq!(links.pop_front(&mut l), Some(1));
        assert_eq!(links.pop_front(&mut l), Some(3));
        assert_eq!(links.pop_front(&mut l), None);
        assert!(l.is_empty());
    }
}
