//! The packet I/O seam: the in-memory network, the fault injector and the
//! pcap recorder (no DPDK needed).
#![cfg(feature = "runtime")]

use std::time::{Duration, Instant};

use emx::io::{FaultConfig, Faulty, MemFrame, MemIo, MemNetwork, PacketIo, Payload, PcapRecorder};

/// A frame to `dst` carrying sequence number `seq` and `len` payload bytes.
fn frame(io: &mut MemIo, dst: [u8; 6], seq: u32, len: usize) -> MemFrame {
    let mut f = io.alloc().unwrap();
    let src = io.mac();
    let h = io.put(&mut f, 18).unwrap();
    h[..6].copy_from_slice(&dst);
    h[6..12].copy_from_slice(&src);
    h[12..14].copy_from_slice(&0x88B5u16.to_be_bytes());
    h[14..18].copy_from_slice(&seq.to_be_bytes());
    let payload: Vec<u8> = (0..len).map(|i| (i as u32 ^ seq) as u8).collect();
    io.attach(&mut f, Payload::Copy(&payload)).unwrap();
    f
}

fn seq(f: &MemFrame) -> u32 {
    u32::from_be_bytes(f.0[14..18].try_into().unwrap())
}

/// Sends `n` frames from a to b in bursts, receiving through `rx` until
/// `settle` after the last was sent; returns the sequence numbers in arrival
/// order.
fn pump<R: PacketIo<Frame = MemFrame>>(
    a: &mut MemIo,
    dst: [u8; 6],
    rx: &mut R,
    n: u32,
    settle: Duration,
) -> Vec<u32> {
    let mut got = Vec::new();
    let mut inb = Vec::with_capacity(64);
    let mut out = Vec::with_capacity(64);
    let mut next = 0;
    // From when the last frame left: a deadline from the start passed while
    // a loaded machine still sent, and frames held back then were not
    // waited for.
    let mut sent_at = None;
    loop {
        while next < n && out.len() < 32 {
            out.push(frame(a, dst, next, 100));
            next += 1;
        }
        a.send(&mut out);
        rx.recv(&mut inb, 64);
        got.extend(inb.drain(..).map(|f| seq(&f)));
        if next == n && out.is_empty() {
            let at = *sent_at.get_or_insert_with(Instant::now);
            if at.elapsed() > settle {
                break;
            }
        }
    }
    got
}

#[test]
fn mem_pair_delivers_in_order_and_pushes_back() {
    let net = MemNetwork::new(16);
    let (mut a, mut b) = (
        net.port([2, 0, 0, 0, 0, 1], 1500),
        net.port([2, 0, 0, 0, 0, 2], 1500),
    );
    let mut out: Vec<MemFrame> = (0..20).map(|i| frame(&mut a, b.mac(), i, 10)).collect();
    assert_eq!(a.send(&mut out), 16, "a full queue pushes back");
    assert_eq!(out.len(), 4);
    assert_eq!(seq(&out[0]), 16, "the frames not taken stay in order");
    let mut inb = Vec::with_capacity(8);
    assert_eq!(
        b.recv(&mut inb, 100),
        8,
        "recv never grows the burst past its capacity"
    );
    assert_eq!(
        inb.iter().map(seq).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    let mut big = frame(&mut a, b.mac(), 0, 0);
    assert!(
        a.put(&mut big, 2000).is_err(),
        "frames are bounded by the MTU"
    );

    // Broadcast reaches every other port; unknown MACs are counted, not delivered.
    let mut c = net.port([2, 0, 0, 0, 0, 3], 1500);
    let mut out = vec![
        frame(&mut c, [0xff; 6], 99, 1),
        frame(&mut c, [2, 9, 9, 9, 9, 9], 98, 1),
    ];
    assert_eq!(c.send(&mut out), 2);
    assert_eq!(c.dropped(), 1);
    let mut inb = Vec::with_capacity(64);
    a.recv(&mut inb, 64);
    assert_eq!(inb.iter().map(seq).collect::<Vec<_>>(), vec![99]);
}

/// A frame larger than the receiving port's MTU does not reach it, as a NIC
/// drops it: a sender with a larger MTU cannot pass it in tests only.
#[test]
fn a_frame_past_the_receivers_mtu_is_dropped() {
    let net = MemNetwork::new(16);
    let (mut big, mut small) = (
        net.port([2, 0, 0, 0, 0, 1], 9000),
        net.port([2, 0, 0, 0, 0, 2], 1500),
    );
    let mut out = vec![
        frame(&mut big, small.mac(), 1, 2000),
        frame(&mut big, small.mac(), 2, 1500 - 18),
        frame(&mut big, [0xff; 6], 3, 2000),
    ];
    assert_eq!(big.send(&mut out), 3, "taken, and lost on the way");
    assert_eq!(big.dropped(), 2);
    let mut inb = Vec::with_capacity(8);
    small.recv(&mut inb, 8);
    assert_eq!(inb.iter().map(seq).collect::<Vec<_>>(), vec![2]);
}

#[test]
fn fault_drop_rate_is_seeded_and_adjustable() {
    let run = |seed| {
        let (mut a, b) = MemNetwork::pair(1500);
        let dst = b.mac();
        let mut b = Faulty::new(b, FaultConfig::lossy(0.10), seed);
        let got = pump(&mut a, dst, &mut b, 5000, Duration::ZERO);
        (got, b.fault_stats())
    };
    let (got, stats) = run(1);
    assert_eq!(got.len() as u64 + stats.dropped, 5000);
    assert!(
        (400..600).contains(&stats.dropped),
        "about 10% dropped: {}",
        stats.dropped
    );
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "drops alone keep order"
    );
    assert_eq!(run(1).0, got, "the same seed drops the same frames");
    assert_ne!(run(2).0, got, "another seed drops others");

    // Adjusted while running: lossless from now on.
    let (mut a, b) = MemNetwork::pair(1500);
    let dst = b.mac();
    let mut b = Faulty::new(b, FaultConfig::lossy(1.0), 3);
    assert!(pump(&mut a, dst, &mut b, 100, Duration::ZERO).is_empty());
    b.handle().set(FaultConfig::none());
    assert_eq!(pump(&mut a, dst, &mut b, 100, Duration::ZERO).len(), 100);
}

/// A pair whose second port delays what it receives by `delay`: the
/// first port, the second's MAC, and the second behind its injector.
fn delayed(delay: Duration, seed: u64) -> (MemIo, [u8; 6], Faulty<MemIo>) {
    let (a, b) = MemNetwork::pair(1500);
    let dst = b.mac();
    let cfg = FaultConfig {
        delay,
        ..FaultConfig::default()
    };
    (a, dst, Faulty::new(b, cfg, seed))
}

/// A delay lowered while frames are held keeps the link in order: frames
/// taken after the change wait behind those held under the old delay. They
/// used to be due at once and overtake every held frame, a reordering
/// nobody asked for and `reordered` did not count.
#[test]
fn a_delay_lowered_while_frames_are_held_keeps_order() {
    let (mut a, dst, mut b) = delayed(Duration::from_millis(20), 11);
    let mut out: Vec<MemFrame> = (0..10).map(|i| frame(&mut a, dst, i, 100)).collect();
    a.send(&mut out);
    let mut inb = Vec::with_capacity(64);
    assert_eq!(b.recv(&mut inb, 64), 0, "held for 20 ms");
    b.handle().set(FaultConfig::none());
    let mut out: Vec<MemFrame> = (10..20).map(|i| frame(&mut a, dst, i, 100)).collect();
    a.send(&mut out);
    let t0 = Instant::now();
    let mut got = Vec::new();
    while got.len() < 20 && t0.elapsed() < Duration::from_secs(5) {
        b.recv(&mut inb, 64);
        got.extend(inb.drain(..).map(|f| seq(&f)));
    }
    assert_eq!(got, (0..20).collect::<Vec<_>>());
    assert_eq!(b.fault_stats().reordered, 0);
}

#[test]
fn fault_duplicate_reorder_corrupt_delay() {
    let (mut a, b) = MemNetwork::pair(1500);
    let dst = b.mac();
    let cfg = FaultConfig {
        duplicate: 0.2,
        reorder: 0.2,
        reorder_window: Duration::from_micros(300),
        ..FaultConfig::default()
    };
    let mut b = Faulty::new(b, cfg, 7);
    let got = pump(&mut a, dst, &mut b, 3000, Duration::from_millis(5));
    let st = b.fault_stats();
    assert_eq!(
        got.len() as u64,
        3000 + st.duplicated,
        "every frame arrives, plus the copies"
    );
    assert!(st.duplicated > 300 && st.reordered > 300, "{st:?}");
    let mut sorted = got.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted, (0..3000).collect::<Vec<_>>(), "nothing lost");
    assert!(
        got.windows(2).any(|w| w[0] > w[1]),
        "some frames were overtaken"
    );

    // Corruption flips one bit per hit frame.
    let (mut a, b) = MemNetwork::pair(1500);
    let dst = b.mac();
    let mut b = Faulty::new(
        b,
        FaultConfig {
            corrupt: 1.0,
            ..FaultConfig::default()
        },
        9,
    );
    let sent = frame(&mut a, dst, 5, 200);
    a.send(&mut vec![sent.clone()]);
    let mut inb = Vec::with_capacity(4);
    b.recv(&mut inb, 4);
    let diff: u32 = sent
        .0
        .iter()
        .zip(&inb[0].0)
        .map(|(x, y)| (x ^ y).count_ones())
        .sum();
    assert_eq!(diff, 1);

    // Delay holds every frame for at least the delay.
    let (mut a, b) = MemNetwork::pair(1500);
    let dst = b.mac();
    let mut b = Faulty::new(
        b,
        FaultConfig {
            delay: Duration::from_millis(20),
            ..FaultConfig::default()
        },
        1,
    );
    let t0 = Instant::now();
    let f = frame(&mut a, dst, 1, 1);
    a.send(&mut vec![f]);
    let mut inb = Vec::with_capacity(4);
    while b.recv(&mut inb, 4) == 0 {
        std::thread::yield_now();
    }
    assert!(t0.elapsed() >= Duration::from_millis(20));
}

/// The injector's hold queue is bounded (4096 frames): past it, the frame
/// held longest leaves early, so frames still arrive in order and none is
/// lost uncounted. (The newest used to leave at once, overtaking all the
/// held ones, with nothing counted.)
#[test]
fn a_full_hold_queue_lets_the_oldest_go_first() {
    let (mut a, dst, mut b) = delayed(Duration::from_secs(60), 5);
    let got = pump(&mut a, dst, &mut b, 6000, Duration::from_millis(5));
    let st = b.fault_stats();
    assert_eq!(got, (0..6000 - 4096).collect::<Vec<_>>(), "oldest first");
    assert_eq!((st.held, st.dropped), (got.len() as u64, 0), "{st:?}");
}

/// Duplication on a link that always has a burst waiting loses nothing: the
/// injector lets its due copies out before it takes more from the link. It
/// used to take a whole burst every time, so each call held back the copies
/// it had no room for, the queue grew to its bound, and from there frames
/// were dropped that no fault asked for.
#[test]
fn duplication_on_a_busy_link_loses_nothing() {
    let (mut a, b) = MemNetwork::pair(1500);
    let dst = b.mac();
    let mut b = Faulty::new(
        b,
        FaultConfig {
            duplicate: 0.5,
            ..FaultConfig::default()
        },
        11,
    );
    let n = 20_000u32;
    let (mut next, mut out) = (0, Vec::with_capacity(64));
    let (mut got, mut inb) = (Vec::new(), Vec::with_capacity(32));
    loop {
        // The link's queue stays full (it pushes back) until all are sent.
        while next < n && out.len() < 64 {
            out.push(frame(&mut a, dst, next, 16));
            next += 1;
        }
        a.send(&mut out);
        if b.recv(&mut inb, 32) == 0 && next == n && out.is_empty() {
            break;
        }
        got.extend(inb.drain(..).map(|f| seq(&f)));
    }
    let st = b.fault_stats();
    assert_eq!(st.dropped, 0, "{st:?}");
    assert!(st.duplicated > 8_000, "{st:?}");
    assert_eq!(got.len() as u64, u64::from(n) + st.duplicated);
    let mut sorted = got.clone();
    sorted.dedup();
    assert_eq!(
        sorted,
        (0..n).collect::<Vec<_>>(),
        "in order, each once or twice"
    );
}

#[test]
fn pcap_records_both_directions() {
    let dir = std::env::temp_dir().join(format!("emx-pcap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cap.pcap");
    let (a, mut b) = MemNetwork::pair(1500);
    let dst = b.mac();
    let mut a = PcapRecorder::new(a, &path).unwrap();
    let mut out = Vec::new();
    for i in 0u32..3 {
        let mut f = a.alloc().unwrap();
        let h = a.put(&mut f, 18).unwrap();
        h[..6].copy_from_slice(&dst);
        h[14..18].copy_from_slice(&i.to_be_bytes());
        out.push(f);
    }
    assert_eq!(a.send(&mut out), 3);
    let mut back = vec![MemFrame(vec![0xAA; 60])];
    back[0].0[..6].copy_from_slice(&a.mac());
    b.send(&mut back);
    let mut inb = Vec::with_capacity(4);
    a.recv(&mut inb, 4);
    assert_eq!(a.frames(), 4);
    drop(a);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        u32::from_le_bytes(bytes[0..4].try_into().unwrap()),
        0xa1b2_3c4d
    );
    assert_eq!(
        u32::from_le_bytes(bytes[20..24].try_into().unwrap()),
        1,
        "Ethernet link type"
    );
    // Walk the records: 3 frames of 18 bytes, then one of 60.
    let (mut at, mut lens) = (24, Vec::new());
    while at < bytes.len() {
        let caplen = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        lens.push(caplen);
        at += 16 + caplen;
    }
    assert_eq!(at, bytes.len());
    assert_eq!(lens, vec![18, 18, 18, 60]);
    std::fs::remove_dir_all(&dir).unwrap();
}
