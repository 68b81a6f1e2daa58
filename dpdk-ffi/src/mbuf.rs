//! Packet buffers: an owning [`Mbuf`] and a fixed-capacity [`Burst`] of them.

use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::mempool::Mempool;
use crate::sys;

/// Data not owned by this mbuf alone.
const SHARED_DATA_FLAGS: u64 = sys::RTE_MBUF_F_EXTERNAL | sys::RTE_MBUF_F_INDIRECT;

/// Whether segment `m`'s data belongs to its holder alone: a direct buffer
/// and no other reference to the mbuf. The count is read atomically: DPDK
/// changes it with atomics, on whatever thread frees a clone.
///
/// # Safety
/// `m` is a valid mbuf.
#[inline]
unsafe fn data_owned(m: *mut sys::rte_mbuf) -> bool {
    // SAFETY: m is valid (the caller's contract); refcnt is a u16 that DPDK
    // only changes atomically.
    let refcnt = unsafe { std::sync::atomic::AtomicU16::from_ptr(&raw mut (*m).refcnt) };
    // SAFETY: as above.
    let flags = unsafe { (*m).ol_flags };
    flags & SHARED_DATA_FLAGS == 0 && refcnt.load(std::sync::atomic::Ordering::Acquire) == 1
}

/// An owned packet buffer (`struct rte_mbuf`), possibly the head of a chain of
/// segments. It frees itself, and every segment after it, on drop.
///
/// `#[repr(transparent)]` over the raw pointer, so a slice of `Mbuf`s is an
/// array of `struct rte_mbuf *` and bursts cross the FFI without copying.
#[repr(transparent)]
pub struct Mbuf(NonNull<sys::rte_mbuf>);

// SAFETY: an Mbuf is uniquely owned; DPDK allows freeing an mbuf from any
// thread (the mempool is thread-safe).
unsafe impl Send for Mbuf {}

impl Mbuf {
    /// Takes an mbuf from the pool.
    pub fn alloc(pool: &Mempool) -> Result<Mbuf> {
        Mbuf::try_alloc(pool).ok_or_else(|| pool.exhausted())
    }

    /// [`Mbuf::alloc`] without the error: `None` when the pool is empty. For
    /// a fast path that meets an empty pool over and over (a poll loop under
    /// pressure), where the error's text would cost an allocation each time.
    #[inline]
    pub fn try_alloc(pool: &Mempool) -> Option<Mbuf> {
        // SAFETY: the pool is alive while `pool` is.
        let m = unsafe { sys::rte_pktmbuf_alloc(pool.as_ptr()) };
        NonNull::new(m).map(Mbuf)
    }

    /// Takes ownership of a raw mbuf.
    ///
    /// # Safety
    /// `raw` must be a valid mbuf (chain head) that nothing else owns or will free.
    pub unsafe fn from_raw(raw: NonNull<sys::rte_mbuf>) -> Mbuf {
        Mbuf(raw)
    }

    /// Gives up ownership; the caller must free the mbuf (or hand it to DPDK).
    pub fn into_raw(self) -> NonNull<sys::rte_mbuf> {
        let raw = self.0;
        std::mem::forget(self);
        raw
    }

    /// The raw mbuf, still owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::rte_mbuf {
        self.0.as_ptr()
    }

    fn raw(&self) -> &sys::rte_mbuf {
        // SAFETY: self owns a valid mbuf for its whole life.
        unsafe { self.0.as_ref() }
    }

    /// Bytes of data in this (first) segment.
    pub fn data_len(&self) -> usize {
        usize::from(self.raw().data_len)
    }

    /// Bytes of data in the whole chain.
    pub fn pkt_len(&self) -> usize {
        self.raw().pkt_len as usize
    }

    /// Number of segments in the chain.
    pub fn nb_segs(&self) -> u16 {
        self.raw().nb_segs
    }

    /// Free bytes before the data of this segment.
    pub fn headroom(&self) -> usize {
        usize::from(self.raw().data_off)
    }

    /// Free bytes after the data of the last segment.
    pub fn tailroom(&self) -> usize {
        let last = self.last_segment();
        // SAFETY: `last` is a valid segment of the chain self owns.
        let last = unsafe { &*last };
        usize::from(last.buf_len) - usize::from(last.data_off) - usize::from(last.data_len)
    }

    /// True when this segment's data lives in external memory
    /// ([`ExtBuf::attach`](crate::ExtBuf::attach)).
    pub fn is_external(&self) -> bool {
        self.raw().ol_flags & sys::RTE_MBUF_F_EXTERNAL != 0
    }

    /// True when this (first) segment's data is this handle's alone: a
    /// direct buffer (neither external nor another mbuf's) and no clone.
    pub(crate) fn owns_data(&self) -> bool {
        // SAFETY: self owns a valid mbuf.
        unsafe { data_owned(self.0.as_ptr()) }
    }

    /// The data of this (first) segment.
    pub fn data(&self) -> &[u8] {
        // SAFETY: data_off + data_len lies within the segment's buffer (DPDK's
        // invariant), which lives while self does.
        unsafe { segment_data(self.0.as_ptr()) }
    }

    /// The data of this (first) segment, to write. Refused when the data is
    /// shared with another owner (a clone, or an external buffer).
    pub fn data_mut(&mut self) -> Result<&mut [u8]> {
        // SAFETY: self owns a valid mbuf.
        if !unsafe { data_owned(self.0.as_ptr()) } {
            return Err(Error::SharedData);
        }
        let m = self.raw();
        let (off, len) = (usize::from(m.data_off), usize::from(m.data_len));
        // SAFETY: as in data(), and the data is owned by this mbuf alone
        // (checked above), so no other reference to it exists.
        Ok(unsafe { std::slice::from_raw_parts_mut((m.buf_addr as *mut u8).add(off), len) })
    }

    /// The data of every segment in order.
    pub fn segments(&self) -> Segments<'_> {
        Segments {
            next: self.0.as_ptr(),
            _owner: self,
        }
    }

    /// Copies `out.len()` bytes starting at `offset` of the packet (across
    /// segments) into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let oob = Error::OutOfBounds {
            offset,
            len: out.len(),
            limit: self.pkt_len(),
        };
        if offset
            .checked_add(out.len())
            .is_none_or(|end| end > self.pkt_len())
        {
            return Err(oob);
        }
        let (mut skip, mut done) = (offset, 0);
        for seg in self.segments() {
            if done == out.len() {
                break;
            }
            if skip >= seg.len() {
                skip -= seg.len();
                continue;
            }
            let n = (seg.len() - skip).min(out.len() - done);
            out[done..done + n].copy_from_slice(&seg[skip..skip + n]);
            done += n;
            skip = 0;
        }
        if done == out.len() {
            Ok(())
        } else {
            Err(oob)
        }
    }

    /// The whole packet, gathered from all segments.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.pkt_len());
        for seg in self.segments() {
            v.extend_from_slice(seg);
        }
        v
    }

    /// Grows the data of the last segment by `len` bytes and returns them.
    /// They hold whatever the buffer held before (an earlier packet's bytes):
    /// write all of them before the packet leaves.
    pub fn append(&mut self, len: usize) -> Result<&mut [u8]> {
        let last = self.last_segment();
        // SAFETY: last is a segment of the chain self owns.
        if !unsafe { data_owned(last) } {
            return Err(Error::SharedData);
        }
        let room = self.tailroom();
        let n = u16::try_from(len).ok().filter(|_| len <= room);
        let Some(n) = n else {
            return Err(Error::NoRoom {
                wanted: len,
                available: room,
            });
        };
        // SAFETY: self owns the chain; n fits the tailroom, so append cannot fail.
        let p = unsafe { sys::rte_pktmbuf_append(self.0.as_ptr(), n) };
        if p.is_null() {
            return Err(Error::NoRoom {
                wanted: len,
                available: room,
            });
        }
        // SAFETY: append returned the start of `n` new bytes inside the last
        // segment's buffer, owned by self alone (checked above).
        Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) })
    }

    /// Appends a copy of `bytes` to the packet.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) -> Result<()> {
        self.append(bytes.len())?.copy_from_slice(bytes);
        Ok(())
    }

    /// Grows the data of the first segment by `len` bytes at the front (into the
    /// headroom) and returns them: where a header is written in place. Like
    /// [`append`](Self::append)'s, they hold what the buffer held before.
    pub fn prepend(&mut self, len: usize) -> Result<&mut [u8]> {
        // SAFETY: self owns a valid mbuf.
        if !unsafe { data_owned(self.0.as_ptr()) } {
            return Err(Error::SharedData);
        }
        let room = self.headroom();
        let Some(n) = u16::try_from(len).ok().filter(|_| len <= room) else {
            return Err(Error::NoRoom {
                wanted: len,
                available: room,
            });
        };
        // SAFETY: self owns the mbuf; n fits the headroom.
        let p = unsafe { sys::rte_pktmbuf_prepend(self.0.as_ptr(), n) };
        if p.is_null() {
            return Err(Error::NoRoom {
                wanted: len,
                available: room,
            });
        }
        // SAFETY: prepend returned the start of `n` bytes in the first segment,
        // owned by self alone.
        Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) })
    }

    /// Removes `len` bytes from the front of the first segment.
    pub fn adj(&mut self, len: usize) -> Result<()> {
        let limit = self.data_len();
        let Some(n) = u16::try_from(len).ok().filter(|_| len <= limit) else {
            return Err(Error::OutOfBounds {
                offset: 0,
                len,
                limit,
            });
        };
        // SAFETY: self owns the mbuf; n is within the first segment.
        let p = unsafe { sys::rte_pktmbuf_adj(self.0.as_ptr(), n) };
        if p.is_null() {
            return Err(Error::OutOfBounds {
                offset: 0,
                len,
                limit,
            });
        }
        Ok(())
    }

    /// Removes `len` bytes from the end of the last segment.
    pub fn trim(&mut self, len: usize) -> Result<()> {
        // SAFETY: last is a segment of the chain self owns.
        let limit = usize::from(unsafe { (*self.last_segment()).data_len });
        let Some(n) = u16::try_from(len).ok().filter(|_| len <= limit) else {
            return Err(Error::OutOfBounds {
                offset: 0,
                len,
                limit,
            });
        };
        // SAFETY: self owns the chain; n is within the last segment.
        let r = unsafe { sys::rte_pktmbuf_trim(self.0.as_ptr(), n) };
        if r != 0 {
            return Err(Error::OutOfBounds {
                offset: 0,
                len,
                limit,
            });
        }
        Ok(())
    }

    /// Appends `tail` (and its segments) to this chain. On failure the tail is
    /// handed back untouched.
    pub fn chain(&mut self, tail: Mbuf) -> std::result::Result<(), (Error, Mbuf)> {
        let tail_segs = tail.nb_segs();
        if u32::from(self.nb_segs()) + u32::from(tail_segs) > u32::from(u16::MAX) {
            return Err((Error::ChainTooLong, tail));
        }
        // SAFETY: both chains are valid and owned; on success DPDK links tail
        // into self (ownership moves, so tail must not be freed again).
        let r = unsafe { sys::rte_pktmbuf_chain(self.0.as_ptr(), tail.0.as_ptr()) };
        if r != 0 {
            return Err((Error::ChainTooLong, tail));
        }
        std::mem::forget(tail);
        Ok(())
    }

    fn last_segment(&self) -> *mut sys::rte_mbuf {
        let mut m = self.0.as_ptr();
        // SAFETY: walks the `next` links of a valid chain owned by self.
        unsafe {
            while !(*m).next.is_null() {
                m = (*m).next;
            }
        }
        m
    }
}

/// # Safety
/// `m` must be a valid segment that outlives the returned slice.
unsafe fn segment_data<'a>(m: *const sys::rte_mbuf) -> &'a [u8] {
    let m = &*m;
    std::slice::from_raw_parts(
        (m.buf_addr as *const u8).add(usize::from(m.data_off)),
        usize::from(m.data_len),
    )
}

impl Mbuf {
    /// Frees every mbuf in `mbufs` (each with its chain) in one call, which
    /// returns them to their pools a burst at a time; `mbufs` is left empty
    /// with its capacity.
    pub fn free_all(mbufs: &mut Vec<Mbuf>) {
        let n = mbufs.len();
        if n == 0 {
            return;
        }
        // SAFETY: the length is 0 before DPDK frees them, so no Mbuf is
        // dropped again (if the call unwound, they would leak, not be freed
        // twice); the first n slots hold owned mbufs, and Mbuf is
        // `repr(transparent)` over the pointer, so the slots are the array of
        // `struct rte_mbuf *` that rte_pktmbuf_free_bulk takes.
        unsafe {
            mbufs.set_len(0);
            sys::rte_pktmbuf_free_bulk(mbufs.as_mut_ptr() as *mut *mut sys::rte_mbuf, n as u32);
        }
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: self owns the chain; rte_pktmbuf_free releases every segment.
        unsafe { sys::rte_pktmbuf_free(self.0.as_ptr()) }
    }
}

impl std::fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mbuf")
            .field("pkt_len", &self.pkt_len())
            .field("nb_segs", &self.nb_segs())
            .field("external", &self.is_external())
            .finish()
    }
}

/// Iterator over the data of each segment of an [`Mbuf`] chain.
pub struct Segments<'a> {
    next: *mut sys::rte_mbuf,
    _owner: &'a Mbuf,
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.next.is_null() {
            return None;
        }
        // SAFETY: `next` is a segment of the chain borrowed for 'a.
        unsafe {
            let data = segment_data(self.next);
            self.next = (*self.next).next;
            Some(data)
        }
    }
}

/// Default burst size.
pub const BURST: usize = 32;

/// A fixed-capacity burst of mbufs that lives on the stack or in a struct:
/// what `rx_burst` fills and `tx_burst` drains, with no allocation. Mbufs
/// left in it are freed on drop.
pub struct Burst<const N: usize = BURST> {
    len: usize,
    bufs: [MaybeUninit<Mbuf>; N],
}

impl<const N: usize> Default for Burst<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Burst<N> {
    /// DPDK's burst calls count in `u16`: a larger burst would ask for its
    /// room modulo 65536 (none, for 65536), for ever.
    const FITS_A_BURST_CALL: () = assert!(N <= u16::MAX as usize, "a Burst holds at most 65535");

    /// An empty burst. (`N` above 65535 does not compile.)
    pub fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::FITS_A_BURST_CALL;
        Burst {
            len: 0,
            bufs: [const { MaybeUninit::uninit() }; N],
        }
    }

    /// How many mbufs it can hold.
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Free slots.
    pub fn room(&self) -> usize {
        N - self.len
    }

    /// Adds an mbuf at the end, or hands it back when full.
    pub fn push(&mut self, m: Mbuf) -> std::result::Result<(), Mbuf> {
        if self.len == N {
            return Err(m);
        }
        self.bufs[self.len].write(m);
        self.len += 1;
        Ok(())
    }

    /// Removes the last mbuf.
    pub fn pop(&mut self) -> Option<Mbuf> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY: slots below the old len are initialised; len was lowered first,
        // so this one is read exactly once.
        Some(unsafe { self.bufs[self.len].assume_init_read() })
    }

    /// Fills every free slot from the pool in one bulk allocation, all or nothing.
    pub fn alloc_fill(&mut self, pool: &Mempool) -> Result<usize> {
        let n = self.room();
        if n == 0 {
            // Full: a bulk get of none fails on a pool without a cache for
            // this thread (the ring driver reads 0 taken as exhausted).
            return Ok(0);
        }
        let (ptr, _) = self.spare();
        // SAFETY: ptr points at `n` free slots; alloc_bulk writes n valid mbufs
        // or none.
        let r = unsafe { sys::rte_pktmbuf_alloc_bulk(pool.as_ptr(), ptr, n as u32) };
        if r != 0 {
            return Err(pool.exhausted());
        }
        self.len += n;
        Ok(n)
    }

    /// Moves the mbufs out in order; those the iterator has not given out
    /// when it is dropped (a loop left early) are freed.
    pub fn drain(&mut self) -> Drain<'_, N> {
        // The burst is empty from here on: the slots belong to the iterator.
        let end = std::mem::take(&mut self.len);
        Drain {
            bufs: &mut self.bufs,
            next: 0,
            end,
        }
    }

    /// Frees every mbuf in the burst.
    pub fn clear(&mut self) {
        if self.len > 0 {
            let ptr = self.bufs.as_mut_ptr() as *mut *mut sys::rte_mbuf;
            let n = std::mem::take(&mut self.len);
            // SAFETY: the first n slots hold owned mbufs; len is 0 now, so they
            // are freed exactly once.
            unsafe { sys::rte_pktmbuf_free_bulk(ptr, n as u32) };
        }
    }

    /// The free slots as a raw array, for a receive call to fill.
    pub(crate) fn spare(&mut self) -> (*mut *mut sys::rte_mbuf, usize) {
        // SAFETY: len <= N, so the offset stays within the array.
        let p = unsafe { self.bufs.as_mut_ptr().add(self.len) } as *mut *mut sys::rte_mbuf;
        (p, N - self.len)
    }

    /// Marks `n` more slots (after the current ones) as filled.
    ///
    /// # Safety
    /// Those slots must hold valid mbufs now owned by the burst.
    pub(crate) unsafe fn filled(&mut self, n: usize) {
        debug_assert!(self.len + n <= N);
        self.len += n;
    }

    /// The filled slots as a raw array, for a transmit call.
    pub(crate) fn raw(&mut self) -> (*mut *mut sys::rte_mbuf, usize) {
        (self.bufs.as_mut_ptr() as *mut *mut sys::rte_mbuf, self.len)
    }

    /// Forgets the first `n` mbufs (their ownership went to DPDK) and moves
    /// the rest to the front.
    ///
    /// # Safety
    /// The first `n` mbufs must no longer be owned by the burst.
    pub(crate) unsafe fn consumed(&mut self, n: usize) {
        debug_assert!(n <= self.len);
        let rest = self.len - n;
        let p = self.bufs.as_mut_ptr();
        std::ptr::copy(p.add(n), p, rest);
        self.len = rest;
    }
}

/// The mbufs of a [`Burst`], moved out in order ([`Burst::drain`]). Dropping
/// it frees the ones not taken, so a loop that ends early (`break`, `?`)
/// leaks nothing.
pub struct Drain<'a, const N: usize> {
    bufs: &'a mut [MaybeUninit<Mbuf>; N],
    /// The next slot to give out; slots `next..end` are still owned here.
    next: usize,
    end: usize,
}

impl<const N: usize> Iterator for Drain<'_, N> {
    type Item = Mbuf;

    fn next(&mut self) -> Option<Mbuf> {
        if self.next == self.end {
            return None;
        }
        let i = self.next;
        self.next += 1;
        // SAFETY: slots below `end` were initialised when the drain began and
        // are owned by it alone; `next` moved past this one, so it is read once.
        Some(unsafe { self.bufs[i].assume_init_read() })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end - self.next;
        (n, Some(n))
    }
}

impl<const N: usize> ExactSizeIterator for Drain<'_, N> {}

impl<const N: usize> Drop for Drain<'_, N> {
    fn drop(&mut self) {
        let n = self.end - self.next;
        if n > 0 {
            // SAFETY: slots next..end hold owned mbufs that were never given
            // out (MaybeUninit<Mbuf> has the layout of an mbuf pointer); the
            // drain ends here, so they are freed exactly once.
            unsafe {
                let p = self.bufs.as_mut_ptr().add(self.next) as *mut *mut sys::rte_mbuf;
                sys::rte_pktmbuf_free_bulk(p, n as u32);
            }
            self.next = self.end;
        }
    }
}

impl<const N: usize> Deref for Burst<N> {
    type Target = [Mbuf];
    fn deref(&self) -> &[Mbuf] {
        // SAFETY: the first len slots are initialised, and MaybeUninit<Mbuf> has
        // the layout of Mbuf.
        unsafe { std::slice::from_raw_parts(self.bufs.as_ptr() as *const Mbuf, self.len) }
    }
}

impl<const N: usize> DerefMut for Burst<N> {
    fn deref_mut(&mut self) -> &mut [Mbuf] {
        // SAFETY: as in deref, borrowed uniquely.
        unsafe { std::slice::from_raw_parts_mut(self.bufs.as_mut_ptr() as *mut Mbuf, self.len) }
    }
}

impl<const N: usize> Drop for Burst<N> {
    fn drop(&mut self) {
        self.clear();
    }
}

impl<const N: usize> std::fmt::Debug for Burst<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}
