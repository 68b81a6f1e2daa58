//! The raw-DPDK baseline: the same ping-pong loops as the safe variant, written
//! directly against `dpdk_ffi::sys`.
//!
//! This module is why the bench crate allows `unsafe` at all: a baseline that
//! measures what the safe layer costs must bypass it. It touches only queues
//! its thread owns (taken through the safe `RxQueue`/`TxQueue` handles held by
//! the same thread) and mbufs it allocates and frees itself.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use dpdk_ffi::{sys, Mempool};

/// How long a raw pinger waits for its pong before it counts it lost.
pub const LOST_AFTER: Duration = Duration::from_millis(200);

/// How long a sender tries a link that takes no frames before it gives up:
/// a memif peer that went away, or a port that went down, would otherwise
/// hold it (and the process) forever. A live peer drains a full ring in
/// microseconds, or in milliseconds when its thread is off its CPU.
pub const STUCK_AFTER: Duration = Duration::from_secs(1);

/// What a link that takes no frames is told to the user.
pub const STUCK: &str = "the link took no frames for a second: is the other side still running?";

/// Bounds a loop that waits on the link, without raising the floor it
/// measures: the clock (dearer than an empty poll, a vDSO call that is slower
/// still in a VM) is read only every 1024 waits, and first after 1024 of them,
/// so a loop that waits less reads it never.
pub struct Patience {
    waits: u32,
    since: Option<Instant>,
    limit: Duration,
}

impl Patience {
    /// Patience for `limit` of waiting.
    #[inline]
    pub fn new(limit: Duration) -> Patience {
        Patience {
            waits: 0,
            since: None,
            limit,
        }
    }

    /// One more wait; `true` once the waits have lasted the limit (measured
    /// from about the 1024th).
    #[inline]
    pub fn exhausted(&mut self) -> bool {
        self.waits = self.waits.wrapping_add(1);
        if self.waits % 1024 != 0 {
            return false;
        }
        self.since.get_or_insert_with(Instant::now).elapsed() > self.limit
    }

    /// The link moved: start counting again.
    #[inline]
    pub fn reset(&mut self) {
        self.waits = 0;
        self.since = None;
    }
}

/// One ping numbered `iter`: allocate, fill (the number at bytes 14..18,
/// where the echo leaves it), transmit (retrying while the ring is full),
/// then spin until the pong with that number arrives, freeing what comes.
/// `Ok(false)` if it did not come within [`LOST_AFTER`]; an error if
/// allocation failed or the link took nothing for [`STUCK_AFTER`].
///
/// The number is what keeps a pong that came after its ping was counted
/// lost from being taken by the next ping as its own, a sample of nearly
/// nothing.
#[inline(never)]
pub fn ping(
    port: u16,
    queue: u16,
    pool: &Mempool,
    frame: &[u8],
    iter: u32,
) -> Result<bool, String> {
    if frame.len() < ITER_END {
        return Err(format!(
            "a ping frame of {} bytes has no room for its number",
            frame.len()
        ));
    }
    // SAFETY: the pool is alive; port/queue are owned by this thread (see the
    // module docs); every mbuf is either handed to the driver or freed here.
    unsafe {
        let m = sys::rte_pktmbuf_alloc(pool.as_ptr());
        let p = if m.is_null() {
            std::ptr::null_mut()
        } else {
            sys::rte_pktmbuf_append(m, frame.len() as u16)
        };
        if p.is_null() {
            sys::rte_pktmbuf_free(m);
            return Err(format!("mempool `{}` exhausted", pool.name()));
        }
        let p = p as *mut u8;
        std::ptr::copy_nonoverlapping(frame.as_ptr(), p, frame.len());
        std::ptr::copy_nonoverlapping(iter.to_le_bytes().as_ptr(), p.add(ITER_AT), 4);
        let mut out = m;
        let mut wait = Patience::new(STUCK_AFTER);
        while sys::rte_eth_tx_burst(port, queue, &mut out, 1) == 0 {
            if wait.exhausted() {
                sys::rte_pktmbuf_free(m);
                return Err(STUCK.into());
            }
        }
        let mut inb = [std::ptr::null_mut::<sys::rte_mbuf>(); 32];
        let mut wait = Patience::new(LOST_AFTER);
        loop {
            let n = sys::rte_eth_rx_burst(port, queue, inb.as_mut_ptr(), 32);
            if n > 0 {
                // The n mbufs just received are valid and ours until freed.
                let got = inb[..usize::from(n)]
                    .iter()
                    .any(|&m| iter_of(m) == Some(iter));
                sys::rte_pktmbuf_free_bulk(inb.as_mut_ptr(), u32::from(n));
                if got {
                    return Ok(true);
                }
            }
            if wait.exhausted() {
                return Ok(false);
            }
        }
    }
}

/// EtherType of raw benchmark frames (emx uses 0x88B5).
pub const RAW_ETHERTYPE: u16 = 0x88B6;

/// Where a ping's number lies in its frame (behind the Ethernet header), and
/// where it ends.
const ITER_AT: usize = 14;
const ITER_END: usize = ITER_AT + 4;

/// Whether a received frame is a raw benchmark frame (its EtherType): on a
/// veth the kernel's own frames (IPv6 neighbour discovery, say) come too.
///
/// # Safety
/// `m` is a valid mbuf this thread holds.
#[inline]
unsafe fn ours(m: *mut sys::rte_mbuf) -> bool {
    // SAFETY: (the caller's) `m` is valid; only bytes below data_len of its
    // first segment are read.
    unsafe {
        let m = &*m;
        if usize::from(m.data_len) < ITER_AT {
            return false;
        }
        let d = (m.buf_addr as *const u8).add(usize::from(m.data_off) + 12);
        std::ptr::read_unaligned(d as *const [u8; 2]) == RAW_ETHERTYPE.to_be_bytes()
    }
}

/// The number a received frame carries, if it is a raw benchmark frame
/// whose first segment holds one (a foreign frame's bytes there used to be
/// taken for a pong's number).
///
/// # Safety
/// `m` is a valid mbuf this thread holds.
#[inline]
unsafe fn iter_of(m: *mut sys::rte_mbuf) -> Option<u32> {
    // SAFETY: (the caller's) `m` is valid; data_off + data_len lies within
    // its first segment's buffer, and only bytes below data_len are read.
    unsafe {
        if !ours(m) {
            return None;
        }
        let m = &*m;
        if usize::from(m.data_len) < ITER_END {
            return None;
        }
        let d = (m.buf_addr as *const u8).add(usize::from(m.data_off) + ITER_AT);
        Some(u32::from_le_bytes(std::ptr::read_unaligned(
            d as *const [u8; 4],
        )))
    }
}

/// One step of the echo side: receive a burst and send every raw benchmark
/// frame back to where it came from, its MAC addresses swapped (a NIC drops
/// frames for another's address), dropping what the link would not take for
/// [`STUCK_AFTER`]. Other frames (the kernel's, on a veth) are freed: they
/// were echoed too.
#[inline(never)]
pub fn echo_step(port: u16, queue: u16) {
    // SAFETY: as in ping(); received mbufs are all handed back to the driver
    // or freed.
    unsafe {
        let mut bufs = [std::ptr::null_mut::<sys::rte_mbuf>(); 32];
        let got = sys::rte_eth_rx_burst(port, queue, bufs.as_mut_ptr(), 32);
        let mut n = 0u16;
        for i in 0..usize::from(got) {
            let m = bufs[i];
            if ours(m) {
                bufs[usize::from(n)] = m;
                n += 1;
            } else {
                sys::rte_pktmbuf_free(m);
            }
        }
        for &m in &bufs[..usize::from(n)] {
            // SAFETY: `m` was just received and is ours; only its first
            // segment's bytes below data_len are touched.
            let m = &mut *m;
            if usize::from(m.data_len) >= 12 {
                let d = (m.buf_addr as *mut u8).add(usize::from(m.data_off));
                let macs = std::slice::from_raw_parts_mut(d, 12);
                let (dst, src) = macs.split_at_mut(6);
                dst.swap_with_slice(src);
            }
        }
        let mut sent = 0;
        let mut wait = Patience::new(STUCK_AFTER);
        while sent < n {
            let k = sys::rte_eth_tx_burst(
                port,
                queue,
                bufs.as_mut_ptr().add(usize::from(sent)),
                n - sent,
            );
            sent += k;
            if k == 0 && wait.exhausted() {
                sys::rte_pktmbuf_free_bulk(
                    bufs.as_mut_ptr().add(usize::from(sent)),
                    u32::from(n - sent),
                );
                return;
            }
        }
    }
}
