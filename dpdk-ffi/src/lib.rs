//! DPDK for emx: the only crate with FFI `unsafe`.
//!
//! Three layers, bottom up:
//! - [`sys`]: bindgen bindings for an explicit allowlist of DPDK symbols, plus the
//!   `static inline` fast-path functions and per-thread values exported by a
//!   small C shim and re-exported under DPDK's own names.
//! - Thin safe types, each owning what it frees: [`Eal`], [`Mempool`], [`Mbuf`]
//!   and [`Burst`], [`Port`] with its owned [`RxQueue`]/[`TxQueue`], [`ExtMem`]
//!   and [`ExtBuf`] (the zero-copy primitive), and [`ThreadRegistration`].
//! - Typed errors ([`Error`]) carrying the failing call and its errno.
//! - CPU helpers beside DPDK's own: [`rdtsc`], and [`copy_streaming`] with
//!   [`store_fence`] for copies that bypass the caches.
//!
//! Lifetimes follow DPDK's rules rather than Rust scopes: ports keep their
//! mempools alive, everything keeps the EAL alive, and the EAL is cleaned up
//! only when the last handle goes. Memory that may still be referenced (a
//! mempool with mbufs outstanding) is leaked rather than freed under a live
//! pointer.
//!
//! ```no_run
//! use dpdk_ffi::{Burst, Eal, Mbuf, Mempool, Port, PortConfig};
//! use std::time::Duration;
//!
//! let eal = Eal::builder().init()?;
//! let pool = Mempool::new(&eal, "pool", 4095, 256, dpdk_ffi::DEFAULT_DATA_ROOM)?;
//! let a = Port::from_devargs(&eal, "net_memif0,role=server,socket=/tmp/doc.sock", &PortConfig::default(), &pool)?;
//! let b = Port::from_devargs(&eal, "net_memif1,role=client,socket=/tmp/doc.sock", &PortConfig::default(), &pool)?;
//! a.wait_link(Duration::from_secs(5))?;
//! let (mut tx, mut rx) = (a.tx_queue(0)?, b.rx_queue(0)?);
//! let mut m = Mbuf::alloc(&pool)?;
//! m.extend_from_slice(&[0u8; 60])?;
//! tx.tx_one(m).ok();
//! let mut burst: Burst = Burst::new();
//! while rx.rx_burst(&mut burst) == 0 {}
//! assert_eq!(burst[0].data().len(), 60);
//! # Ok::<(), dpdk_ffi::Error>(())
//! ```
#![warn(missing_docs)]

pub mod sys;

mod control;
mod cpu;
mod eal;
mod error;
mod extmem;
mod guard;
mod log;
mod mbuf;
mod mempool;
mod port;
mod thread;

pub use cpu::{copy_streaming, current_cpu, store_fence};
pub use eal::{is_pci_address, pci_canonical, Eal, EalBuilder, HugepageMode};
pub use error::{Errno, Error, Result};
pub use extmem::{ExtBuf, ExtMem};
pub use guard::unmap_guarded;
pub use log::{log_to, LogLevel, LogSink};
pub use mbuf::{Burst, Drain, Mbuf, BURST};
pub use mempool::{data_room_for_mtu, Mempool, DEFAULT_DATA_ROOM};
pub use port::{
    memif_listening, LinkStatus, Port, PortConfig, PortStats, RxQueue, TxQueue, MEMIF_MAX_MTU,
};
pub use thread::ThreadRegistration;

/// The time-stamp counter, for timing fast paths (`rte_rdtsc`). On x86_64 it
/// is the instruction itself, inlined; elsewhere DPDK's function.
#[inline]
pub fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `rdtsc` has no preconditions and touches no memory.
    return unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: reads the time counter; no memory is touched.
    return unsafe { sys::rte_rdtsc() };
}

/// Time-stamp counter ticks per second, as the EAL measured it at start.
pub fn tsc_hz(_eal: &Eal) -> u64 {
    // SAFETY: the EAL is running (a handle is held); a plain query.
    unsafe { sys::rte_get_tsc_hz() }
}
