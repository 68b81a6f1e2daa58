//! One thread at a time in DPDK's control path.

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard};

static LOCK: Mutex<()> = Mutex::new(());

thread_local! {
    static HELD: Cell<bool> = const { Cell::new(false) };
}

/// Held while this thread is in DPDK's control path: probing, configuring,
/// starting, stopping, closing and removing ports, registering and DMA-mapping
/// external memory. DPDK does not make these thread-safe, but `Eal`,
/// `Mempool`, `Port` and `ExtMem` are `Sync`, so safe code can reach them from
/// several threads at once: two memif ports on one socket dropped on two
/// threads would edit the socket's device list together. Reentrant on one
/// thread (a setup that fails drops its half-built port, which takes it again).
pub(crate) struct Control(Option<MutexGuard<'static, ()>>);

/// Enters the control path (see [`Control`]).
pub(crate) fn control() -> Control {
    if HELD.with(Cell::get) {
        return Control(None);
    }
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    HELD.with(|h| h.set(true));
    Control(Some(guard))
}

impl Drop for Control {
    fn drop(&mut self) {
        if self.0.is_some() {
            // (the lock itself is released after this, with the field)
            HELD.with(|h| h.set(false));
        }
    }
}
