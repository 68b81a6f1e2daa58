//! One thread at a time in DPDK's control path.

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard};

use crate::sys;

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

thread_local! {
    static HOLDING: Cell<bool> = const { Cell::new(false) };
}

/// How long a hold waits for the interrupt thread to park before it gives up
/// (see [`hold_interrupts`]).
const PARK_TIMEOUT_MS: u32 = 5_000;

/// The EAL interrupt thread held parked (see [`hold_interrupts`]) until this
/// is dropped.
pub(crate) struct InterruptsHeld(*mut sys::emx_intr_hold);

/// Parks the EAL interrupt thread until the value returned is dropped, so that
/// no driver handler runs there meanwhile. DPDK 22.11's memif driver edits its
/// control channels and its sockets' interface lists both in its message
/// handlers, on the interrupt thread, and in probe, stop, close and remove, on
/// the caller's, with no common lock: a port stopped while the handler for its
/// peer's disconnect runs has its control channel freed twice (see the C
/// shim). Holding the interrupt thread makes those edits take turns.
///
/// It takes `Control` as a witness: holds are taken inside the control path,
/// one at a time, and a hold taken on this thread while another is in force
/// does nothing. Nothing done under a hold may wait for the interrupt thread:
/// memif's probe and teardown do not, but some drivers' control operations
/// wait for their interrupt handlers, so hold only for memif. If the thread
/// does not park within 5 s (its handler is stuck), this warns and goes on
/// unheld, as emx did before.
pub(crate) fn hold_interrupts(_control: &Control) -> InterruptsHeld {
    if HOLDING.with(Cell::get) {
        return InterruptsHeld(std::ptr::null_mut());
    }
    let mut hold = std::ptr::null_mut();
    // SAFETY: `hold` is a writable pointer slot; the EAL is running (a
    // Control exists only for an operation on a live EAL object).
    let ret = unsafe { sys::emx_intr_hold(PARK_TIMEOUT_MS, &mut hold) };
    if ret < 0 {
        eprintln!(
            "emx: warning: the EAL interrupt thread could not be held ({}); memif set-up or \
             teardown goes on beside its handlers",
            std::io::Error::from_raw_os_error(-ret)
        );
    }
    if !hold.is_null() {
        HOLDING.with(|h| h.set(true));
    }
    InterruptsHeld(hold)
}

impl Drop for InterruptsHeld {
    fn drop(&mut self) {
        if !self.0.is_null() {
            HOLDING.with(|h| h.set(false));
            // SAFETY: a hold that emx_intr_hold returned, released once.
            unsafe { sys::emx_intr_release(self.0) };
        }
    }
}
