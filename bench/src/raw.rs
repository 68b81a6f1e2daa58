//! The raw-DPDK baseline: the same ping-pong loops as the safe variant, written
//! directly against `dpdk_ffi::sys`.
//!
//! This module is why the bench crate allows `unsafe` at all: a baseline that
//! measures what the safe layer costs must bypass it. It touches only queues
//! its thread owns (taken through the safe `RxQueue`/`TxQueue` handles held by
//! the same thread) and mbufs it allocates and frees itself.
#![allow(unsafe_code)]

use dpdk_ffi::{sys, Mempool};

/// One ping: allocate, fill, transmit (retrying while the ring is full),
/// then spin until the pong arrives and free it. `false` if allocation failed.
#[inline(never)]
pub fn ping(port: u16, queue: u16, pool: &Mempool, frame: &[u8]) -> bool {
    // SAFETY: the pool is alive; port/queue are owned by this thread (see the
    // module docs); every mbuf is either handed to the driver or freed here.
    unsafe {
        let m = sys::rte_pktmbuf_alloc(pool.as_ptr());
        if m.is_null() {
            return false;
        }
        let p = sys::rte_pktmbuf_append(m, frame.len() as u16);
        if p.is_null() {
            sys::rte_pktmbuf_free(m);
            return false;
        }
        std::ptr::copy_nonoverlapping(frame.as_ptr(), p as *mut u8, frame.len());
        let mut out = m;
        while sys::rte_eth_tx_burst(port, queue, &mut out, 1) == 0 {}
        let mut inb = [std::ptr::null_mut::<sys::rte_mbuf>(); 32];
        loop {
            let n = sys::rte_eth_rx_burst(port, queue, inb.as_mut_ptr(), 32);
            if n > 0 {
                sys::rte_pktmbuf_free_bulk(inb.as_mut_ptr(), u32::from(n));
                return true;
            }
        }
    }
}

/// One step of the echo side: receive a burst and send every frame back.
#[inline(never)]
pub fn echo_step(port: u16, queue: u16) {
    // SAFETY: as in ping(); received mbufs are all handed back to the driver.
    unsafe {
        let mut bufs = [std::ptr::null_mut::<sys::rte_mbuf>(); 32];
        let n = sys::rte_eth_rx_burst(port, queue, bufs.as_mut_ptr(), 32);
        let mut sent = 0;
        while sent < n {
            sent += sys::rte_eth_tx_burst(
                port,
                queue,
                bufs.as_mut_ptr().add(usize::from(sent)),
                n - sent,
            );
        }
    }
}
