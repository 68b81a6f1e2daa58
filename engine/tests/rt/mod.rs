//! Helpers for the runtime tests over DPDK: a memif pair in one process and a
//! windowed, seeded, byte-checked exchange between two endpoints.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use dpdk_ffi::{Eal, ExtMem, Mempool, Port, PortConfig, DEFAULT_DATA_ROOM};
use emx::io::DpdkIo;
use emx::proto::Addr;
use emx::runtime::{Endpoint, Engine, EngineConfig, ProgressMode, SendBuf};

pub fn eal() -> Eal {
    Eal::builder().memory_mb(512).init().expect("EAL")
}

pub fn pool(eal: &Eal, name: &str) -> Mempool {
    Mempool::new(eal, name, 16383, 256, DEFAULT_DATA_ROOM).expect("mempool")
}

pub fn memif_pair(eal: &Eal, pool: &Mempool) -> (Port, Port) {
    let sock = format!("/tmp/emx-rt-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let cfg = PortConfig::default();
    let a = Port::from_devargs(
        eal,
        &format!("net_memif0,role=server,socket={sock}"),
        &cfg,
        pool,
    )
    .unwrap();
    let b = Port::from_devargs(
        eal,
        &format!("net_memif1,role=client,socket={sock}"),
        &cfg,
        pool,
    )
    .unwrap();
    a.wait_link(Duration::from_secs(10)).unwrap();
    b.wait_link(Duration::from_secs(10)).unwrap();
    (a, b)
}

pub fn config(node: u16, peer: u16, peer_mac: [u8; 6], progress: ProgressMode) -> EngineConfig {
    EngineConfig {
        progress,
        ..EngineConfig::with_peer(node, peer, peer_mac)
    }
}

/// Node 1 on port `pa` and node 2 on port `pb` (queue 0 each), peers of
/// each other.
pub fn engines(pa: &Port, pb: &Port, pool: &Mempool, progress: ProgressMode) -> (Engine, Engine) {
    let ea = Engine::start(
        &config(1, 2, pb.mac(), progress.clone()),
        DpdkIo::new(pa, 0, pool).unwrap(),
    )
    .unwrap();
    let eb = Engine::start(
        &config(2, 1, pa.mac(), progress),
        DpdkIo::new(pb, 0, pool).unwrap(),
    )
    .unwrap();
    (ea, eb)
}

pub fn byte(i: u64, j: usize) -> u8 {
    (j.wrapping_mul(0x9E37) ^ (i as usize).wrapping_mul(131) ^ (j >> 11)) as u8
}

/// Seeded message sizes: every size in `fixed`, then a mix (mostly small,
/// some large up to 8 MiB) until `total` bytes.
pub fn sizes(fixed: &[usize], total: usize, seed: u64) -> Vec<usize> {
    let mut v = fixed.to_vec();
    let mut x = seed | 1;
    let mut sum: usize = v.iter().sum();
    while sum < total {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = match x % 10 {
            0..=5 => (x >> 8) as usize % 2048,
            6..=7 => (x >> 8) as usize % (256 << 10),
            _ => (x >> 8) as usize % (8 << 20),
        };
        sum += len;
        v.push(len);
    }
    v
}

/// Receives every message (any source, matched on its index), checking
/// bytes; up to `window` receives posted at once.
pub fn receive_all(ep: &mut Endpoint, sizes: &[usize], window: usize) {
    let mut posted = std::collections::VecDeque::new();
    let mut next = 0;
    let deadline = Instant::now() + Duration::from_secs(240);
    while next < sizes.len() || !posted.is_empty() {
        while next < sizes.len() && posted.len() < window {
            posted.push_back((
                next,
                ep.irecv(None, next as u64, u64::MAX, vec![0u8; sizes[next]])
                    .unwrap(),
            ));
            next += 1;
        }
        let (i, r) = posted.pop_front().unwrap();
        let (buf, info) = ep.wait(r).unwrap().into_recv().unwrap();
        assert_eq!(info.msg_len as usize, sizes[i], "message {i}");
        let bytes = buf.as_ref();
        if let Some(j) = (0..bytes.len()).find(|&j| bytes[j] != byte(i as u64, j)) {
            panic!("message {i} ({} bytes) differs at byte {j}", sizes[i]);
        }
        assert!(Instant::now() < deadline, "receiver too slow");
    }
}

/// Keeps driving `ep` until `done` is set: an inline engine acknowledges
/// only while driven, and the sender's last sends complete only when their
/// (delayed) acknowledgements have left.
pub fn drive_until(ep: &mut Endpoint, done: &std::sync::atomic::AtomicBool) {
    while !done.load(std::sync::atomic::Ordering::Acquire) {
        ep.progress();
    }
}

/// Sends `sizes` from `a` to node 2 endpoint 0 (up to `in_flight` at once,
/// registered buffers from `region` when given) while another thread
/// receives them on `b` (up to `posted` receives) and checks their bytes,
/// driving `b` until every send completed. Returns `b` and how long the
/// exchange took.
pub fn exchange(
    a: &mut Endpoint,
    mut b: Endpoint,
    sizes: &[usize],
    in_flight: usize,
    posted: usize,
    region: Option<&ExtMem>,
) -> (Endpoint, Duration) {
    let t0 = Instant::now();
    let recv_sizes = sizes.to_vec();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done2 = done.clone();
    let receiver = std::thread::spawn(move || {
        receive_all(&mut b, &recv_sizes, posted);
        drive_until(&mut b, &done2);
        b
    });
    send_all(a, Addr::new(2, 0), sizes, in_flight, region);
    done.store(true, std::sync::atomic::Ordering::Release);
    let b = receiver.join().unwrap();
    (b, t0.elapsed())
}

/// Sends every message to `dst` with up to `window` in flight; registered
/// buffers from `region` when given.
pub fn send_all(
    ep: &mut Endpoint,
    dst: Addr,
    sizes: &[usize],
    window: usize,
    region: Option<&ExtMem>,
) {
    let mut inflight = std::collections::VecDeque::new();
    for (i, &len) in sizes.iter().enumerate() {
        if inflight.len() == window {
            ep.wait(inflight.pop_front().unwrap())
                .unwrap()
                .into_send()
                .unwrap();
        }
        let buf = match region {
            Some(r) if len > 0 => {
                let mut b = loop {
                    match r.alloc(len, 64) {
                        Ok(b) => break b,
                        // Region full: wait for an earlier send to give its buffer back.
                        Err(_) => drop(
                            ep.wait(inflight.pop_front().expect("region fits one message"))
                                .unwrap()
                                .into_send()
                                .unwrap(),
                        ),
                    }
                };
                for (j, x) in b.as_mut_slice().unwrap().iter_mut().enumerate() {
                    *x = byte(i as u64, j);
                }
                SendBuf::Registered(b)
            }
            _ => SendBuf::Owned((0..len).map(|j| byte(i as u64, j)).collect()),
        };
        inflight.push_back(ep.isend(dst, i as u64, buf).unwrap());
    }
    for r in inflight {
        ep.wait(r).unwrap().into_send().unwrap();
    }
}
