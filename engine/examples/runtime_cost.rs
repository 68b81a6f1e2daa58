//! The CPU cost of an emx message round trip through the whole runtime
//! (API, request table, driver, protocol core, link seam): two inline
//! engines driven by one thread, on an in-memory network, or with `memif` on
//! a DPDK memif pair in this process (the real mbuf path, no hugepages
//! needed, none used). Compare with `proto_cost` (the core alone) to see what the
//! runtime adds; under `valgrind --tool=callgrind` it counts instructions.
//!
//! With `thread`, `a` (the pinger, or the stream's sender) runs on a
//! polling thread that spins on the last CPU, and this thread, pinned to
//! the first, is its application and drives `b` inline: what a polling
//! thread's hand-off (its rings) costs, measurable on two CPUs.
//!
//! `cargo run --release -p emx --example runtime_cost [round trips per run] [memif [stream|rate] [thread]]`

use std::time::{Duration, Instant};

use dpdk_ffi::{HugepageMode, Mempool, Port, PortConfig};
use emx::io::{DpdkIo, MemNetwork, PacketIo};
use emx::proto::Addr;
use emx::runtime::{Endpoint, Engine, EngineConfig, RecvBuf, SendBuf};

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let thread = std::env::args().any(|a| a == "thread");
    if std::env::args().nth(2).as_deref() == Some("memif") {
        let eal = dpdk_ffi::Eal::builder()
            .hugepages(HugepageMode::Never)
            .init()
            .unwrap();
        let pool = Mempool::new(&eal, "cost", 8191, 256, dpdk_ffi::DEFAULT_DATA_ROOM).unwrap();
        let sock = format!("/tmp/emx-cost-{}.sock", std::process::id());
        let port = |i: u8, role: &str| {
            let devargs = format!("net_memif{i},role={role},socket={sock}");
            Port::from_devargs(&eal, &devargs, &PortConfig::default(), &pool).unwrap()
        };
        let (pa, pb) = (port(0, "server"), port(1, "client"));
        for p in [&pa, &pb] {
            p.wait_link(Duration::from_secs(10)).unwrap();
        }
        let mut ca = EngineConfig::with_peer(1, 2, pb.mac());
        let mut how = "both sides on one thread";
        if thread {
            how = "a on a spinning polling thread, its application and b on this one";
            let cpus = core_affinity::get_core_ids().unwrap_or_default();
            let (Some(first), Some(last)) = (cpus.first(), cpus.last()) else {
                panic!("no CPU to pin to");
            };
            assert!(first.id != last.id, "`thread` needs two CPUs");
            assert!(
                core_affinity::set_for_current(*first),
                "cannot pin to CPU {}",
                first.id
            );
            ca.progress = emx::runtime::ProgressMode::Thread {
                core: Some(last.id),
                spin: true,
            };
        }
        let mut ea = Engine::start(&ca, DpdkIo::new(&pa, 0, &pool).unwrap()).unwrap();
        let mut eb = Engine::start(
            &EngineConfig::with_peer(2, 1, pa.mac()),
            DpdkIo::new(&pb, 0, &pool).unwrap(),
        )
        .unwrap();
        let (mut a, mut b) = (ea.endpoint().unwrap(), eb.endpoint().unwrap());
        let streams = [("stream", 1 << 20, 4), ("rate", 8, 64), ("late", 8, 64)];
        if let Some(&(name, size, window)) = streams
            .iter()
            .find(|s| std::env::args().nth(3).as_deref() == Some(s.0))
        {
            let region = dpdk_ffi::ExtMem::with_pages(&eal, 64 << 20, false).unwrap();
            region.dma_map(&pa).unwrap();
            let late = name == "late";
            stream(&mut a, &mut b, &region, n, (size, window, late), how);
            return;
        }
        report(&format!("memif pair, {how}"), &measure(&mut a, &mut b, n));
        if !thread {
            // (With a polling thread it would time a look at its rings.)
            report_idle(&mut a, n);
        }
    } else {
        assert!(!thread, "`thread` runs on the memif pair: give `memif` too");
        let (ia, ib) = MemNetwork::pair(1500);
        let (ma, mb) = (ia.mac(), ib.mac());
        let mut ea = Engine::start(&EngineConfig::with_peer(1, 2, mb), ia).unwrap();
        let mut eb = Engine::start(&EngineConfig::with_peer(2, 1, ma), ib).unwrap();
        let (mut a, mut b) = (ea.endpoint().unwrap(), eb.endpoint().unwrap());
        report(
            "in-memory link, both sides on one thread",
            &measure(&mut a, &mut b, n),
        );
        report_idle(&mut a, n);
    }
}

fn report(link: &str, results: &[f64]) {
    println!("emx runtime cost: one 8-byte round trip (2 messages, both sides, {link})");
    println!(
        "best {:.0} ns, median {:.0} ns per round trip ({} runs)",
        results[0],
        results[results.len() / 2],
        results.len()
    );
}

/// Streams `n` messages of `size` bytes from registered memory, `window`
/// in flight, from `a` into registered receive buffers at `b`: the CPU cost
/// of both sides of a bandwidth (`stream`: 1 MiB, 4 in flight) or message
/// rate (`rate`: 8 B, 64 in flight) test on one core. With `late` (`late`:
/// 8 B, 64 in flight) `b` posts each receive only once its message's send
/// completed, so that every message arrives unexpected: the cost of the
/// unexpected store against `rate`'s. (Never inlined, so
/// that `valgrind --tool=callgrind --toggle-collect=runtime_cost::stream`
/// counts it alone.)
#[inline(never)]
fn stream(
    a: &mut Endpoint,
    b: &mut Endpoint,
    region: &dpdk_ffi::ExtMem,
    n: u32,
    (size, window, late): (usize, usize, bool),
    how: &str,
) {
    let (to_b, to_a) = (Addr::new(2, 0), Addr::new(1, 0));
    let mut sbufs: Vec<_> = (0..window)
        .map(|_| SendBuf::Registered(region.alloc(size, 64).unwrap()))
        .collect();
    let mut rbufs: Vec<_> = (0..window)
        .map(|_| RecvBuf::Registered(region.alloc(size, 64).unwrap()))
        .collect();
    let (mut sends, mut recvs) = (
        std::collections::VecDeque::new(),
        std::collections::VecDeque::new(),
    );
    let t0 = Instant::now();
    let (mut sent, mut got) = (0u32, 0u32);
    // Receives posted, and sends completed (`late` posts no more than those).
    let (mut posted, mut done) = (0u32, 0u32);
    while got < n {
        while sent < n && !sbufs.is_empty() {
            sends.push_back(a.isend(to_b, 1, sbufs.pop().unwrap()).unwrap());
            sent += 1;
        }
        while !late || posted < done {
            let Some(r) = rbufs.pop() else { break };
            recvs.push_back(b.irecv(Some(to_a), 1, u64::MAX, r).unwrap());
            posted += 1;
        }
        if recvs.is_empty() {
            // Nothing for `b` to look at: drive it (its acks finish the sends).
            b.progress();
        }
        while let Some(&s) = sends.front() {
            let Some(c) = a.test(s).unwrap() else { break };
            sends.pop_front();
            sbufs.push(c.into_send().unwrap());
            done += 1;
        }
        while let Some(&r) = recvs.front() {
            let Some(c) = b.test(r).unwrap() else { break };
            recvs.pop_front();
            rbufs.push(c.into_recv().unwrap().0);
            got += 1;
        }
    }
    let ns = t0.elapsed().as_nanos() as f64 / f64::from(n);
    println!(
        "emx stream, {size} B messages, {window} in flight, {how}: \
         {ns:.0} ns per message, {:.1} Gbit/s",
        (size * 8) as f64 / ns
    );
    for (name, e, peer) in [("sender", a, to_b), ("receiver", b, to_a)] {
        let (st, _) = e.stats(peer).unwrap();
        let st = st.unwrap_or_default();
        println!(
            "{name}: {} frames sent, {} received, {} retransmitted, {} timed out, {} duplicates, \
             {} window stalls",
            st.frames_sent,
            st.frames_received,
            st.retransmits,
            st.timeouts,
            st.duplicates,
            st.window_stalls
        );
    }
}

/// An idle progress call (nothing queued, nothing arriving): how long a
/// waiting application takes, at most, to notice a frame that lands just
/// after its poll.
fn report_idle(a: &mut Endpoint, n: u32) {
    let calls = 10 * n;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t0 = Instant::now();
        for _ in 0..calls {
            std::hint::black_box(a.progress());
        }
        best = best.min(t0.elapsed().as_nanos() as f64 / f64::from(calls));
    }
    println!("idle progress call: best {best:.1} ns ({calls} calls per run, 5 runs)");
}

/// Five runs of `n` round trips from `a` to `b` and back; sorted
/// nanoseconds per round trip.
#[inline(never)]
fn measure(a: &mut Endpoint, b: &mut Endpoint, n: u32) -> Vec<f64> {
    let (to_b, to_a) = (Addr::new(2, 0), Addr::new(1, 0));
    let mut results = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        let mut sbuf = Some(SendBuf::Owned(vec![1u8; 8]));
        let mut rbuf = Some(RecvBuf::Owned(vec![0u8; 8]));
        let mut b_rbuf = Some(RecvBuf::Owned(vec![0u8; 8]));
        let mut b_pending = None;
        for _ in 0..n {
            let br = b.irecv(Some(to_a), 0, 0, b_rbuf.take().unwrap()).unwrap();
            let r = a.irecv(Some(to_b), 0, 0, rbuf.take().unwrap()).unwrap();
            let s = a.isend(to_b, 1, sbuf.take().unwrap()).unwrap();
            // b: wait for the ping, echo it.
            let (v, _) = loop {
                a.progress();
                if let Some(c) = b.test(br).unwrap() {
                    break c.into_recv().unwrap();
                }
            };
            if let Some(p) = b_pending.take() {
                // The previous echo's send: its acknowledgement rode on this ping.
                let back = loop {
                    if let Some(c) = b.test(p).unwrap() {
                        break c.into_send().unwrap();
                    }
                    a.progress();
                };
                let SendBuf::Owned(v) = back else {
                    unreachable!()
                };
                b_rbuf = Some(RecvBuf::Owned(v));
            } else {
                b_rbuf = Some(RecvBuf::Owned(vec![0u8; 8]));
            }
            let RecvBuf::Owned(v) = v else { unreachable!() };
            b_pending = Some(b.isend(to_a, 1, v).unwrap());
            // a: wait for the echo and for its own send's completion.
            let (mut got, mut sent) = (None, None);
            while got.is_none() || sent.is_none() {
                b.progress();
                if got.is_none() {
                    got = a.test(r).unwrap();
                }
                if sent.is_none() {
                    sent = a.test(s).unwrap();
                }
            }
            rbuf = Some(got.unwrap().into_recv().unwrap().0);
            sbuf = Some(sent.unwrap().into_send().unwrap());
        }
        let ns = t0.elapsed().as_nanos() as f64 / f64::from(n);
        results.push(ns);
        // Let the last echo complete before the next run.
        if let Some(p) = b_pending.take() {
            while b.test(p).unwrap().is_none() {
                a.progress();
            }
        }
    }
    results.sort_by(f64::total_cmp);
    results
}
