//! The seam over DPDK: frames built through `DpdkIo` cross a memif pair
//! intact, and registered payloads are attached, not copied; the fault
//! injector corrupts the frames that arrive chained too.
#![cfg(feature = "runtime")]

use std::time::{Duration, Instant};

use dpdk_ffi::{Eal, ExtBuf, ExtMem, Mbuf, Mempool, Port, PortConfig, DEFAULT_DATA_ROOM};
use emx::io::{DpdkIo, FaultConfig, Faulty, Frame, PacketIo, Payload, COPY_BELOW};

fn pair() -> (Eal, Mempool, DpdkIo, DpdkIo) {
    pair_mtu(None)
}

/// Two memif ports of MTU `mtu` (the default's when `None`) on one pool of
/// buffers of the default size.
fn pair_mtu(mtu: Option<u16>) -> (Eal, Mempool, DpdkIo, DpdkIo) {
    let eal = Eal::builder().memory_mb(256).init().unwrap();
    let pool = Mempool::new(&eal, "io", 4095, 64, DEFAULT_DATA_ROOM).unwrap();
    let sock = format!("/tmp/emx-io-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let cfg = PortConfig {
        mtu,
        ..PortConfig::default()
    };
    let a = Port::from_devargs(
        &eal,
        &format!("net_memif0,role=server,socket={sock}"),
        &cfg,
        &pool,
    )
    .unwrap();
    let b = Port::from_devargs(
        &eal,
        &format!("net_memif1,role=client,socket={sock}"),
        &cfg,
        &pool,
    )
    .unwrap();
    a.wait_link(Duration::from_secs(10)).unwrap();
    b.wait_link(Duration::from_secs(10)).unwrap();
    let (ia, ib) = (
        DpdkIo::new(&a, 0, &pool).unwrap(),
        DpdkIo::new(&b, 0, &pool).unwrap(),
    );
    (eal, pool, ia, ib)
}

fn deliver(a: &mut DpdkIo, b: &mut DpdkIo, f: Mbuf) -> Vec<u8> {
    let mut out = vec![f];
    let mut inb = Vec::with_capacity(8);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !out.is_empty() {
        a.send(&mut out);
        b.recv(&mut inb, 8);
        assert!(Instant::now() < deadline);
    }
    while inb.is_empty() {
        b.recv(&mut inb, 8);
        assert!(Instant::now() < deadline);
    }
    let mut v = Vec::new();
    inb[0].copy_to(&mut v);
    v
}

/// A frame of `header` and `len` bytes of `buf` from `offset`, as
/// registered memory (attached or copied as `io` decides).
fn registered_frame(
    io: &mut DpdkIo,
    header: &[u8],
    buf: &ExtBuf,
    offset: usize,
    len: usize,
) -> Mbuf {
    let mut f = io.alloc().unwrap();
    io.put(&mut f, header.len())
        .unwrap()
        .copy_from_slice(header);
    io.attach(&mut f, Payload::Registered { buf, offset, len })
        .unwrap();
    f
}

#[test]
fn registered_payload_is_attached_not_copied() {
    let (eal, _pool, mut a, mut b) = pair();
    assert!(a.zero_copy());
    let region = ExtMem::new(&eal, 1 << 20).unwrap();
    let mut buf = region.buffer(0, 64 << 10).unwrap();
    for (i, x) in buf.as_mut_slice().unwrap().iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    let header = [0x5Au8; 14];

    let f = registered_frame(&mut a, &header, &buf, 1000, 1400);
    assert_eq!(buf.in_flight(), 1, "the frame refers to the buffer");
    let got = deliver(&mut a, &mut b, f);
    assert_eq!(&got[..14], &header);
    assert_eq!(&got[14..], &buf.as_slice()[1000..2400]);
    let st = a.stats();
    assert_eq!(
        (st.payload_attached, st.payload_copied),
        (1400, 0),
        "no payload byte copied"
    );
    assert_eq!(buf.in_flight(), 0, "released once the driver is done");

    // Small registered payloads are copied (below COPY_BELOW unless told
    // otherwise), plain bytes always.
    const { assert!(COPY_BELOW > 100 && COPY_BELOW <= 1400) };
    let mut f = registered_frame(&mut a, &header, &buf, 0, 100);
    a.attach(&mut f, Payload::Copy(&[7; 50])).unwrap();
    let got = deliver(&mut a, &mut b, f);
    assert_eq!(got.len(), 164);
    assert_eq!(a.stats().payload_copied, 150);
    assert_eq!(buf.in_flight(), 0, "a copied payload keeps no reference");
    // With copying turned off, even 100 bytes are attached.
    a.set_copy_below(0);
    let f = registered_frame(&mut a, &header, &buf, 0, 100);
    assert_eq!(buf.in_flight(), 1, "the frame refers to the buffer");
    let got = deliver(&mut a, &mut b, f);
    assert_eq!(&got[14..], &buf.as_slice()[..100]);
    assert_eq!(a.stats().payload_attached, 1500);
    let mut big = a.alloc().unwrap();
    assert!(
        a.attach(&mut big, Payload::Copy(&[0; 1515])).is_err(),
        "bounded by the MTU"
    );
    assert_eq!(a.stats().tx_frames, 3);
    assert_eq!(b.stats().rx_frames, 3);
}

/// Frames longer than the receiver's buffers arrive chained; the fault
/// injector flips a bit in their first segment (the header and the payload's
/// start), where a one-segment frame has all its bytes. It used to leave
/// them whole, and count nothing.
#[test]
fn the_fault_injector_corrupts_chained_frames() {
    let (eal, _pool, mut a, b) = pair_mtu(Some(9000));
    let mut b = Faulty::new(
        b,
        FaultConfig {
            corrupt: 1.0,
            ..FaultConfig::default()
        },
        7,
    );
    let region = ExtMem::new(&eal, 1 << 20).unwrap();
    let mut buf = region.buffer(0, 64 << 10).unwrap();
    for (i, x) in buf.as_mut_slice().unwrap().iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    let header = [0x5Au8; 14];
    let mut sent = header.to_vec();
    sent.extend_from_slice(&buf.as_slice()[..6000]);
    let n = 20;
    // (A receive takes as many frames as `got` has room for.)
    let mut got = Vec::with_capacity(n + 8);
    let deadline = Instant::now() + Duration::from_secs(5);
    for _ in 0..n {
        let mut out = vec![registered_frame(&mut a, &header, &buf, 0, 6000)];
        // (memif's server sends only into buffers its client's receive
        // posted.)
        while !out.is_empty() {
            a.send(&mut out);
            b.recv(&mut got, 8);
            assert!(Instant::now() < deadline);
        }
    }
    while got.len() < n {
        b.recv(&mut got, 8);
        assert!(Instant::now() < deadline, "{} of {n} frames", got.len());
    }
    for f in &got {
        assert!(f.nb_segs() > 1, "arrived chained");
        let mut v = Vec::new();
        f.copy_to(&mut v);
        assert_eq!(v.len(), sent.len());
        let flipped: Vec<usize> = (0..v.len()).filter(|&i| v[i] != sent[i]).collect();
        assert_eq!(flipped.len(), 1, "one byte differs: {flipped:?}");
        assert_eq!((v[flipped[0]] ^ sent[flipped[0]]).count_ones(), 1);
        assert!(flipped[0] < f.data().len(), "in the first segment");
    }
    let st = b.fault_stats();
    assert_eq!((st.corrupted, st.not_corrupted), (n as u64, 0), "{st:?}");
}
