//! Mbuf data access is bounds-checked; chains read back in order; threads that
//! DPDK did not start can register, use mempool caches and unregister cleanly;
//! a pool is never freed under a put in progress.

mod common;

use common::*;
use dpdk_ffi::{Burst, Error, HugepageMode, Mbuf, Mempool, ThreadRegistration, DEFAULT_DATA_ROOM};

#[test]
fn bounds_and_chains() {
    let eal = eal(HugepageMode::Never);
    let pool = Mempool::new(&eal, "mb", 255, 0, DEFAULT_DATA_ROOM).unwrap();
    let mut m = Mbuf::alloc(&pool).unwrap();
    let room = m.tailroom();
    assert!(matches!(m.append(room + 1), Err(Error::NoRoom { .. })));
    m.extend_from_slice(b"world").unwrap();
    m.prepend(6).unwrap().copy_from_slice(b"hello ");
    assert_eq!(m.data(), b"hello world");
    assert!(matches!(m.prepend(1 << 20), Err(Error::NoRoom { .. })));
    let mut tail = Mbuf::alloc(&pool).unwrap();
    tail.extend_from_slice(b", again").unwrap();
    m.chain(tail).unwrap();
    assert_eq!((m.nb_segs(), m.pkt_len()), (2, 18));
    assert_eq!(m.to_vec(), b"hello world, again");
    let mut out = [0u8; 8];
    m.read(9, &mut out).unwrap();
    assert_eq!(&out, b"ld, agai");
    assert!(matches!(
        m.read(11, &mut out),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        m.read(usize::MAX, &mut out),
        Err(Error::OutOfBounds { .. })
    ));
    m.adj(6).unwrap();
    m.trim(2).unwrap();
    assert_eq!(m.to_vec(), b"world, aga");
    assert!(m.adj(100).is_err());
    drop(m);
    assert_eq!(pool.in_use(), 0, "a chain frees every segment");

    let mut burst: Burst<8> = Burst::new();
    assert_eq!(burst.alloc_fill(&pool).unwrap(), 8);
    assert_eq!(pool.in_use(), 8);
    assert!(
        burst.push(Mbuf::alloc(&pool).unwrap()).is_err(),
        "full burst hands the mbuf back"
    );
    drop(burst);
    assert_eq!(pool.in_use(), 0, "a burst frees what it holds");

    // A drain left early frees what it did not give out.
    let mut burst: Burst<8> = Burst::new();
    burst.alloc_fill(&pool).unwrap();
    let mut taken = Vec::new();
    for (i, m) in burst.drain().enumerate() {
        taken.push(m);
        if i == 2 {
            break;
        }
    }
    assert!(burst.is_empty());
    assert_eq!(pool.in_use(), 3, "only the three taken are left");
    drop(taken);
    assert_eq!(pool.in_use(), 0);

    // Freed together, chains whole; the vector keeps its room.
    let mut v: Vec<Mbuf> = (0..5).map(|_| Mbuf::alloc(&pool).unwrap()).collect();
    v[1].chain(Mbuf::alloc(&pool).unwrap()).unwrap();
    assert_eq!(pool.in_use(), 6);
    let room = v.capacity();
    Mbuf::free_all(&mut v);
    assert!(v.is_empty() && v.capacity() == room);
    assert_eq!(pool.in_use(), 0, "every mbuf and segment freed");
    Mbuf::free_all(&mut v);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn registered_threads_get_caches_and_flush_them() {
    let eal = eal(HugepageMode::Never);
    let pool = Mempool::new(&eal, "thr", 1023, 64, DEFAULT_DATA_ROOM).unwrap();
    let lcores: Vec<u32> = std::thread::scope(|s| {
        (0..2)
            .map(|_| {
                s.spawn(|| {
                    let reg = ThreadRegistration::register(&eal).unwrap();
                    assert_ne!(reg.lcore_id(), u32::MAX);
                    // Churn through the per-lcore cache.
                    for _ in 0..1000 {
                        let burst: Vec<Mbuf> =
                            (0..16).map(|_| Mbuf::alloc(&pool).unwrap()).collect();
                        drop(burst);
                    }
                    let id = reg.lcore_id();
                    drop(reg);
                    id
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect()
    });
    assert!(
        lcores.iter().all(|&l| l != 0),
        "worker threads get their own lcore ids: {lcores:?}"
    );
    // Unregistering flushed the caches: every mbuf is back in the pool proper,
    // so the pool can be emptied in one go from this thread.
    assert_eq!(pool.in_use(), 0);
    let all: Vec<Mbuf> = (0..1023).map(|_| Mbuf::alloc(&pool).unwrap()).collect();
    assert_eq!(all.len(), 1023);
}

/// The pool named `name`, if it exists (not freed).
fn pool_named(name: &str) -> *mut dpdk_ffi::sys::rte_mempool {
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: a NUL-terminated name; the EAL is running.
    unsafe { dpdk_ffi::sys::rte_mempool_lookup(name.as_ptr()) }
}

/// The count says an mbuf is back while the thread that put it back may still
/// be inside the put, using the pool. A pool whose last handle goes then is
/// not freed under it: it waits, and the next pool made frees it once the put
/// is over, and may take its name.
#[test]
fn a_pool_outlives_a_put_in_progress() {
    use std::sync::mpsc::channel;

    let eal = eal(HugepageMode::Never);
    let pool = Mempool::new(&eal, "put-race", 255, 0, DEFAULT_DATA_ROOM).unwrap();
    drop(Mbuf::alloc(&pool).unwrap());
    assert_eq!(pool.in_use(), 0);
    let (inside_tx, inside) = channel();
    let (leave, leave_rx) = channel::<()>();
    let putter = std::thread::spawn(move || {
        // SAFETY: marks this thread inside a put, as a free does, and leaves.
        unsafe { dpdk_ffi::sys::emx_burst_hold(1) };
        inside_tx.send(()).unwrap();
        let _ = leave_rx.recv();
        // SAFETY: as above.
        unsafe { dpdk_ffi::sys::emx_burst_hold(0) };
    });
    inside.recv().unwrap();
    drop(pool);
    assert!(
        !pool_named("put-race").is_null(),
        "the pool was freed while a put was in progress"
    );
    // The wait gave up and let the others go on: frees do not wait.
    let other = Mempool::new(&eal, "other", 255, 0, DEFAULT_DATA_ROOM);
    drop(Mbuf::alloc(&other.unwrap()).unwrap());
    leave.send(()).unwrap();
    putter.join().unwrap();
    let again = Mempool::new(&eal, "put-race", 255, 0, DEFAULT_DATA_ROOM)
        .expect("the waiting pool is freed and its name free again");
    assert_eq!(pool_named("put-race"), again.as_ptr());
}

/// A pool dropped with an mbuf out is not freed under it, and its name stays
/// taken, with a message that says why; once the mbuf is back, the next pool
/// made frees it and may take the name.
#[test]
fn a_pool_dropped_with_an_mbuf_out_is_freed_once_it_is_back() {
    let eal = eal(HugepageMode::Never);
    let pool = Mempool::new(&eal, "late", 255, 0, DEFAULT_DATA_ROOM).unwrap();
    let mut m = Mbuf::alloc(&pool).unwrap();
    drop(pool);
    assert!(!pool_named("late").is_null(), "freed under an mbuf");
    m.extend_from_slice(b"still mine").unwrap();
    let err = Mempool::new(&eal, "late", 255, 0, DEFAULT_DATA_ROOM).unwrap_err();
    assert!(err.to_string().contains("not freed yet"), "{err}");
    drop(m);
    let again = Mempool::new(&eal, "late", 255, 0, DEFAULT_DATA_ROOM).unwrap();
    assert_eq!(pool_named("late"), again.as_ptr());
}

/// A thread polling without pause (bursts back to back, and frees) does not
/// keep a dropped pool from being freed: its bursts and frees wait at their
/// start while the pool is counted.
#[test]
fn a_pool_is_freed_beside_a_busy_thread() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let eal = eal(HugepageMode::Never);
    let busy_pool = Mempool::new(&eal, "busy", 255, 0, DEFAULT_DATA_ROOM).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                // Inside a burst nearly all the time: 20 us in, out for as
                // long as it takes to go in again.
                // SAFETY: a burst's marks, in and out, with no burst.
                unsafe { dpdk_ffi::sys::emx_burst_hold(1) };
                let t0 = std::time::Instant::now();
                while t0.elapsed() < std::time::Duration::from_micros(20) {
                    std::hint::spin_loop();
                }
                // SAFETY: as above.
                unsafe { dpdk_ffi::sys::emx_burst_hold(0) };
                drop(Mbuf::alloc(&busy_pool).unwrap());
            }
        });
        let not_freed = (0..20).find(|_| {
            let pool = Mempool::new(&eal, "dropped", 255, 0, DEFAULT_DATA_ROOM).unwrap();
            drop(Mbuf::alloc(&pool).unwrap());
            drop(pool);
            !pool_named("dropped").is_null()
        });
        stop.store(true, Ordering::Relaxed);
        assert_eq!(not_freed, None, "a round whose pool was not freed");
    });
}

/// The release callback of an external buffer runs outside the marks of the
/// free that calls it: one that drops the last handle of a pool has the pool
/// freed at once (inside the marks, it could not be counted there, and a
/// pool freed from there once waited for itself).
#[test]
fn a_release_callback_may_drop_a_pool() {
    let eal = eal(HugepageMode::Never);
    let pool = Mempool::new(&eal, "carrier", 255, 0, DEFAULT_DATA_ROOM).unwrap();
    let held = Mempool::new(&eal, "held", 255, 0, DEFAULT_DATA_ROOM).unwrap();
    let region = dpdk_ffi::ExtMem::new(&eal, 1 << 16).unwrap();
    let buf = region.buffer_with(0, 4096, move || drop(held)).unwrap();
    let mut m = Mbuf::alloc(&pool).unwrap();
    buf.attach(&mut m, 0, 100).unwrap();
    drop(buf);
    assert!(!pool_named("held").is_null());
    drop(m);
    assert!(pool_named("held").is_null(), "not freed from the callback");

    // A callback that a burst runs (a driver freeing what it sent) is inside
    // the burst's marks: the pool it drops cannot be counted there, and waits
    // for the next try.
    let held = Mempool::new(&eal, "held", 255, 0, DEFAULT_DATA_ROOM).unwrap();
    let buf = region.buffer_with(0, 4096, move || drop(held)).unwrap();
    let mut m = Mbuf::alloc(&pool).unwrap();
    buf.attach(&mut m, 0, 100).unwrap();
    drop(buf);
    // SAFETY: marks this thread inside a burst around the free, and out.
    unsafe { dpdk_ffi::sys::emx_burst_hold(1) };
    drop(m);
    // SAFETY: as above.
    unsafe { dpdk_ffi::sys::emx_burst_hold(0) };
    assert!(!pool_named("held").is_null(), "counted inside a burst");
    let _next = Mempool::new(&eal, "held", 255, 0, DEFAULT_DATA_ROOM).unwrap();
}

/// A full burst's fill takes nothing and says so: it asked the pool for
/// none, which a pool with no cache for this thread answered as exhausted.
/// An mbuf another reference holds (as a clone does) is neither written nor
/// given external memory: DPDK attaches only a direct mbuf of one holder.
#[test]
fn a_full_burst_fills_nothing_and_a_shared_mbuf_is_left_alone() {
    let eal = eal(HugepageMode::Never);
    let pool = Mempool::new(&eal, "fb", 255, 0, DEFAULT_DATA_ROOM).unwrap();
    let mut b: Burst<8> = Burst::new();
    assert_eq!(b.alloc_fill(&pool).unwrap(), 8);
    assert_eq!(b.alloc_fill(&pool).unwrap(), 0, "full: none taken");
    drop(b);
    let region = dpdk_ffi::ExtMem::new(&eal, 1 << 20).unwrap();
    let buf = region.alloc(4096, 64).unwrap();
    let mut m = Mbuf::alloc(&pool).unwrap();
    // SAFETY: m is a valid mbuf this test owns; a second reference is
    // counted as rte_pktmbuf_clone counts it, and dropped below.
    unsafe { (*m.as_ptr()).refcnt = 2 };
    assert!(matches!(m.append(4), Err(Error::SharedData)));
    assert!(matches!(m.prepend(4), Err(Error::SharedData)));
    assert!(matches!(m.data_mut(), Err(Error::SharedData)));
    assert!(buf.attach(&mut m, 0, 64).is_err(), "a shared mbuf attached");
    // SAFETY: as above: the count the test added goes.
    unsafe { (*m.as_ptr()).refcnt = 1 };
    buf.attach(&mut m, 0, 64).unwrap();
}

/// Threads past DPDK's lcore ids are told so, not that memory ran out (its
/// ENOMEM); the ids come back when the threads drop their registrations, as
/// many times as threads come and go.
#[test]
fn lcore_ids_run_out_with_a_clear_error_and_come_back() {
    let eal = eal(HugepageMode::Never);
    const N: usize = 140;
    let barrier = std::sync::Barrier::new(N);
    let results: Vec<Result<bool, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..N)
            .map(|_| {
                s.spawn(|| {
                    let r = ThreadRegistration::register(&eal);
                    // All at once: every registration held here.
                    barrier.wait();
                    match r {
                        Ok(reg) => Ok(reg.is_new()),
                        Err(Error::LcoresExhausted) => Err(Error::LcoresExhausted.to_string()),
                        Err(e) => panic!("not the lcore ids: {e}"),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let refused: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(!refused.is_empty(), "140 threads all registered");
    assert!(refused[0].contains("RTE_MAX_LCORE"), "{}", refused[0]);
    // Given back: threads coming and going one at a time all register.
    for _ in 0..300 {
        std::thread::scope(|s| {
            s.spawn(|| ThreadRegistration::register(&eal).map(|_| ()).unwrap());
        });
    }
}
