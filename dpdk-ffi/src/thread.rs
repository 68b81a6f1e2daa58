//! Registering threads that DPDK did not start, so that they get an lcore id
//! and mempool caches.

use std::marker::PhantomData;

use crate::eal::Eal;
use crate::error::{Errno, Error, Result};
use crate::sys;

/// This thread's registration with DPDK (`rte_thread_register`). Dropping it
/// flushes the thread's mempool caches back to their pools and unregisters the
/// thread. Not `Send`: it belongs to the thread that made it.
pub struct ThreadRegistration {
    lcore: u32,
    owned: bool,
    _eal: Eal,
    _not_send: PhantomData<*const ()>,
}

impl ThreadRegistration {
    /// Registers the calling thread. On a thread that already has an lcore id
    /// (the main lcore, or a thread registered before) this changes nothing
    /// and the drop will not unregister it.
    pub fn register(eal: &Eal) -> Result<ThreadRegistration> {
        // SAFETY: reads a thread-local through the shim.
        let lcore = unsafe { sys::rte_lcore_id() };
        if lcore != u32::MAX {
            return Ok(ThreadRegistration {
                lcore,
                owned: false,
                _eal: eal.clone(),
                _not_send: PhantomData,
            });
        }
        // SAFETY: the EAL is running (we hold a handle).
        if unsafe { sys::rte_thread_register() } != 0 {
            let errno = Errno::last();
            return Err(match errno.0 {
                libc::ENOMEM => Error::LcoresExhausted,
                libc::EINVAL => Error::Config(
                    "rte_thread_register refused: the EAL runs with multi-process support, \
                     where DPDK registers no thread; start it with --in-memory or --no-shconf \
                     (EalBuilder does)"
                        .into(),
                ),
                _ => Error::Call {
                    call: "rte_thread_register",
                    errno,
                },
            });
        }
        // SAFETY: as above.
        let lcore = unsafe { sys::rte_lcore_id() };
        Ok(ThreadRegistration {
            lcore,
            owned: true,
            _eal: eal.clone(),
            _not_send: PhantomData,
        })
    }

    /// The lcore id DPDK gave this thread.
    pub fn lcore_id(&self) -> u32 {
        self.lcore
    }

    /// Whether this registration made the thread an lcore (false: it was one
    /// already, and dropping this changes nothing).
    pub fn is_new(&self) -> bool {
        self.owned
    }
}

impl Drop for ThreadRegistration {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: on the registered thread (not Send); mbufs cached for this
            // lcore go back to their pools before the id is given up.
            unsafe {
                sys::emx_flush_mempool_caches();
                sys::rte_thread_unregister();
            }
        }
    }
}

impl std::fmt::Debug for ThreadRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadRegistration")
            .field("lcore", &self.lcore)
            .finish()
    }
}
