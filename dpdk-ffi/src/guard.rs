//! The unmap guard (in the C shim): an unmap on the EAL's interrupt thread
//! waits for the bursts in progress, because DPDK 22.11's memif driver
//! unmaps a port's shared memory there when its peer goes away, under bursts
//! that may still be reading it.

use crate::sys;

/// Whether DPDK's drivers unmap memory through emx's unmap guard, which
/// makes an unmap on the EAL's interrupt thread wait for the bursts in
/// progress. Without it, a memif port whose peer dies mid-burst can crash
/// the process: DPDK 22.11's memif driver unmaps the shared memory under a
/// running burst.
///
/// It holds when the executable exports `munmap` to the drivers' shared
/// libraries, as GNU ld does by itself: it exports an executable's
/// definition of any symbol that a shared library on its link line uses, and
/// every program on this crate links `librte_eal`, which uses `munmap`. A
/// linker that does not (or a build that hides the symbol) can be told with
/// `-Wl,--export-dynamic-symbol=munmap`. A static build links the drivers to
/// the guard directly.
pub fn unmap_guarded() -> bool {
    // SAFETY: a symbol lookup; no preconditions.
    unsafe { sys::emx_unmap_guarded() != 0 }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use crate::sys;

    /// This crate's test binary is linked as every emx executable is: with
    /// `munmap` exported to DPDK's drivers.
    #[test]
    fn the_unmap_guard_is_live() {
        assert!(
            super::unmap_guarded(),
            "DPDK's drivers reach libc's munmap: link with -Wl,--export-dynamic-symbol=munmap"
        );
    }

    /// Starts the guard's wait on a thread of its own and gives it 100 ms:
    /// the thread, and whether the wait has ended.
    fn wait_for_bursts_behind() -> (std::thread::JoinHandle<()>, Arc<AtomicBool>) {
        let done = Arc::new(AtomicBool::new(false));
        let done2 = done.clone();
        let waiter = std::thread::spawn(move || {
            // SAFETY: reads the slots and waits; no preconditions.
            unsafe { sys::emx_wait_for_bursts() };
            done2.store(true, Ordering::Release);
        });
        std::thread::sleep(Duration::from_millis(100));
        (waiter, done)
    }

    /// The guard's wait ends only when the burst in progress has ended.
    #[test]
    fn the_wait_outlasts_a_burst_in_progress() {
        let (entered, wait_entered) = mpsc::channel();
        let (release, wait_release) = mpsc::channel::<()>();
        let burst = std::thread::spawn(move || {
            // SAFETY: marks this thread's slot; no burst runs.
            unsafe { sys::emx_burst_hold(1) };
            entered.send(()).unwrap();
            wait_release.recv().unwrap();
            // SAFETY: as above, the matching leave.
            unsafe { sys::emx_burst_hold(0) };
        });
        wait_entered.recv().unwrap();
        let (waiter, done) = wait_for_bursts_behind();
        assert!(
            !done.load(Ordering::Acquire),
            "the wait ended during a burst"
        );
        release.send(()).unwrap();
        burst.join().unwrap();
        waiter.join().unwrap();
        assert!(done.load(Ordering::Acquire));
        // With no burst in progress it returns at once.
        // SAFETY: as above.
        unsafe { sys::emx_wait_for_bursts() };
    }

    /// A burst inside another (run from a release callback that a burst
    /// called) leaves its thread inside until the outer one ends. Counted as
    /// odd and even, the inner one's start made the thread look outside.
    #[test]
    fn a_nested_burst_keeps_its_thread_inside() {
        let (step, wait_step) = mpsc::channel();
        let (next, wait_next) = mpsc::channel::<()>();
        let burst = std::thread::spawn(move || {
            // SAFETY: marks this thread's slot, nested; no burst runs.
            unsafe {
                sys::emx_burst_hold(1);
                sys::emx_burst_hold(1);
            }
            step.send(()).unwrap();
            wait_next.recv().unwrap();
            // SAFETY: the inner leave.
            unsafe { sys::emx_burst_hold(0) };
            step.send(()).unwrap();
            wait_next.recv().unwrap();
            // SAFETY: the outer leave.
            unsafe { sys::emx_burst_hold(0) };
        });
        wait_step.recv().unwrap();
        let (w1, d1) = wait_for_bursts_behind();
        assert!(
            !d1.load(Ordering::Acquire),
            "the inner start looked like an end"
        );
        next.send(()).unwrap();
        wait_step.recv().unwrap();
        let (w2, d2) = wait_for_bursts_behind();
        assert!(
            !d2.load(Ordering::Acquire),
            "the inner end ended the outer burst"
        );
        next.send(()).unwrap();
        burst.join().unwrap();
        w1.join().unwrap();
        w2.join().unwrap();
    }
}
