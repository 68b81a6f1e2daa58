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

/// How long a hold, its release and the final stop wait for the interrupt
/// thread before they give up (see [`hold_interrupts`]).
pub(crate) const INTERRUPT_WAIT_MS: u32 = 5_000;

/// What `ret`, a negative errno from the shim's interrupt-thread calls, means.
pub(crate) fn interrupt_wait_error(ret: i32) -> String {
    match -ret {
        libc::ETIMEDOUT => format!("it did not answer within {INTERRUPT_WAIT_MS} ms"),
        libc::EDEADLK => "this is that thread".to_string(),
        errno => std::io::Error::from_raw_os_error(errno).to_string(),
    }
}

/// The EAL interrupt thread held parked (see [`hold_interrupts`]) until this
/// is dropped, inside the control path it was taken in, on its thread (not
/// `Send`: the hold is the thread's, and its drop releases that thread's).
pub(crate) struct InterruptsHeld<'a> {
    held: bool,
    _control: std::marker::PhantomData<&'a Control>,
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Parks the EAL interrupt thread until the value returned is dropped, so that
/// no driver handler runs there meanwhile. DPDK 22.11's memif driver edits its
/// control channels, regions and sockets' interface lists both in its message
/// handlers, on the interrupt thread, and in probe, stop, close and remove, on
/// the caller's, with no common lock (see the C shim). Holding the interrupt
/// thread makes those edits take turns. The drop also waits for the thread to
/// finish the events it had gathered before it parked, some perhaps for file
/// descriptors closed under the hold, before the control path goes on.
///
/// It takes `Control` as a witness: holds are taken inside the control path,
/// one at a time, and a hold taken on this thread while another is in force
/// does nothing. Nothing done under a hold may wait for the interrupt thread:
/// memif's probe and teardown do not, but some drivers' control operations
/// wait for their interrupt handlers, so hold only for memif.
///
/// If the thread does not park within 5 s, this warns and goes on unheld.
/// That happens when the interrupt thread is in the unmap guard, waiting for
/// a burst whose release callback waits for the control lock this thread
/// holds (a region's last handle dropped in a callback while a memif peer
/// disconnects): the timeout ends the wait.
pub(crate) fn hold_interrupts(_control: &Control) -> InterruptsHeld<'_> {
    let mut held = false;
    if !HOLDING.with(Cell::get) {
        // SAFETY: the EAL is running (a Control exists only for an operation
        // on a live EAL object); callers take turns under the control lock.
        let ret = unsafe { sys::emx_intr_hold(INTERRUPT_WAIT_MS) };
        if ret == 0 {
            held = true;
            HOLDING.with(|h| h.set(true));
        } else if ret != -libc::EDEADLK {
            eprintln!(
                "dpdk-ffi: warning: the EAL interrupt thread could not be held ({}); memif set-up \
                 or teardown goes on beside its handlers",
                interrupt_wait_error(ret)
            );
        }
    }
    InterruptsHeld {
        held,
        _control: std::marker::PhantomData,
        _not_send: std::marker::PhantomData,
    }
}

impl Drop for InterruptsHeld<'_> {
    fn drop(&mut self) {
        if self.held {
            HOLDING.with(|h| h.set(false));
            // SAFETY: this thread's hold, released once, in the control path.
            let ret = unsafe { sys::emx_intr_release(INTERRUPT_WAIT_MS) };
            if ret != 0 {
                eprintln!(
                    "dpdk-ffi: warning: the EAL interrupt thread, released, did not come round ({})",
                    interrupt_wait_error(ret)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Eal, HugepageMode, Mempool, Port, PortConfig, DEFAULT_DATA_ROOM};

    /// While held, the interrupt thread handles nothing: a memif pair started
    /// under a hold cannot connect (memif's handshake runs in its handlers),
    /// and connects once the hold is released.
    #[test]
    fn a_held_interrupt_thread_handles_nothing_until_released() {
        let eal = Eal::builder()
            .hugepages(HugepageMode::Never)
            .memory_mb(256)
            .init()
            .unwrap();
        let pool = Mempool::new(&eal, "hold", 1023, 0, DEFAULT_DATA_ROOM).unwrap();
        let sock = format!("/tmp/emx-test-{}-hold.sock", std::process::id());
        let _ = std::fs::remove_file(&sock);
        let port = |name: &str, role: &str| {
            Port::from_devargs(
                &eal,
                &format!("{name},role={role},id=0,socket={sock}"),
                &PortConfig::default(),
                &pool,
            )
            .unwrap()
        };
        let control = super::control();
        let held = super::hold_interrupts(&control);
        assert!(held.held, "the interrupt thread parks");
        let (a, b) = (port("net_memif0", "server"), port("net_memif1", "client"));
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !a.link().up && !b.link().up,
            "a link came up under the hold"
        );
        drop(held);
        drop(control);
        for p in [&a, &b] {
            p.wait_link(Duration::from_secs(10)).unwrap();
        }
    }
}
