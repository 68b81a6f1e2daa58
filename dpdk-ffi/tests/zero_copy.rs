//! Zero-copy: a frame whose payload is attached from external memory arrives
//! intact, and the buffer's release callback runs exactly once, after the
//! frame is transmitted and the owner has let go.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use dpdk_ffi::{ExtMem, HugepageMode, Mbuf, Mempool, DEFAULT_DATA_ROOM};

fn counter() -> (Arc<AtomicUsize>, impl FnOnce() + Send + 'static) {
    let c = Arc::new(AtomicUsize::new(0));
    let c2 = c.clone();
    (c, move || {
        c2.fetch_add(1, Ordering::SeqCst);
    })
}

#[test]
fn extbuf_payload_arrives_and_releases_once() {
    let eal = eal(HugepageMode::Auto);
    let pool = Mempool::new(&eal, "zc", 1023, 0, DEFAULT_DATA_ROOM).unwrap();
    let (a, b) = memif_pair(&eal, &pool, None);
    assert!(a.multi_seg_tx(), "memif transmits chained mbufs");
    let (mut tx, mut rx) = (a.tx_queue(0).unwrap(), b.rx_queue(0).unwrap());
    let region = ExtMem::new(&eal, 1 << 20).unwrap();
    assert_eq!(region.is_hugepages(), eal.uses_hugepages());
    // What a NIC behind VFIO needs; a virtual device takes it as a no-op,
    // and the region unmaps it when dropped.
    assert!(region.dma_map(&a).unwrap(), "the vdev bus maps");
    assert!(region.dma_map(&a).unwrap(), "twice is a no-op");

    let header = Frames::new(1, 1500).next_frame(0)[..14].to_vec();
    let (released, on_release) = counter();
    let mut buf = region.buffer_with(4096, 8192, on_release).unwrap();
    for (i, byte) in buf.as_mut_slice().unwrap().iter_mut().enumerate() {
        *byte = (i * 7 + 3) as u8;
    }
    // Overlapping ranges are refused while lent.
    assert!(region.buffer(8000, 100).is_err());

    // Two frames from one buffer: header mbuf + attached payload segment.
    let mut expect = Vec::new();
    for (off, len) in [(0usize, 1000usize), (1000, 1400)] {
        let mut head = mbuf_of(&pool, &header);
        let mut payload = Mbuf::alloc(&pool).unwrap();
        buf.attach(&mut payload, off, len).unwrap();
        assert!(payload.is_external());
        assert!(
            payload.data_mut().is_err(),
            "external data is not writable through the mbuf"
        );
        head.chain(payload).unwrap();
        assert_eq!(head.nb_segs(), 2);
        let mut frame = header.clone();
        frame.extend_from_slice(&buf.as_slice()[off..off + len]);
        expect.push((head, frame));
    }
    assert_eq!(buf.in_flight(), 2);
    assert!(
        buf.as_mut_slice().is_none(),
        "no writes while mbufs refer to the buffer"
    );

    for (head, frame) in expect {
        assert_eq!(released.load(Ordering::SeqCst), 0);
        assert_eq!(
            send_and_receive(&mut tx, &mut rx, head).to_vec(),
            frame,
            "payload arrives intact"
        );
    }
    // Transmitted and freed by the driver: only the owner's reference is left.
    assert_eq!(buf.in_flight(), 0);
    assert_eq!(
        released.load(Ordering::SeqCst),
        0,
        "not released while the owner holds it"
    );
    drop(buf);
    assert_eq!(released.load(Ordering::SeqCst), 1);
    // The range is free again.
    drop(region.buffer(8000, 100).unwrap());
    assert_eq!(released.load(Ordering::SeqCst), 1, "released exactly once");
}

#[test]
fn extbuf_released_after_transmission_when_owner_lets_go_first() {
    let eal = eal(HugepageMode::Auto);
    let pool = Mempool::new(&eal, "zc2", 1023, 0, DEFAULT_DATA_ROOM).unwrap();
    let (a, b) = memif_pair(&eal, &pool, None);
    let (mut tx, mut rx) = (a.tx_queue(0).unwrap(), b.rx_queue(0).unwrap());
    let region = ExtMem::with_pages(&eal, 64 << 10, false).unwrap();
    let (released, on_release) = counter();
    let mut buf = region.buffer_with(0, 1500, on_release).unwrap();
    buf.as_mut_slice().unwrap().fill(0xAB);
    let mut head = mbuf_of(&pool, &[0xFFu8; 14]);
    let mut payload = Mbuf::alloc(&pool).unwrap();
    buf.attach(&mut payload, 0, 1486).unwrap();
    head.chain(payload).unwrap();
    drop(buf);
    assert_eq!(
        released.load(Ordering::SeqCst),
        0,
        "the queued frame still refers to the buffer"
    );
    let got = send_and_receive(&mut tx, &mut rx, head).to_vec();
    assert_eq!(got.len(), 1500);
    assert!(got[14..].iter().all(|&b| b == 0xAB));
    assert_eq!(
        released.load(Ordering::SeqCst),
        1,
        "released once the driver freed the frame"
    );
}

#[test]
fn buffers_split_where_io_addresses_are_not_contiguous() {
    let eal = eal(HugepageMode::Auto);
    let pool = Mempool::new(&eal, "zc3", 1023, 0, DEFAULT_DATA_ROOM).unwrap();
    let region = ExtMem::new(&eal, 8 << 20).unwrap();
    // Allocation is first fit and aligned; lent ranges never overlap.
    let a = region.alloc(100, 64).unwrap();
    let b = region.alloc(5 << 20, 64).unwrap();
    assert_eq!((a.offset(), b.offset()), (0, 128));
    assert!(region.alloc(4 << 20, 64).is_err(), "no gap is that large");
    assert_eq!(region.lent_bytes(), 100 + (5 << 20));
    // Walking a buffer by contiguous runs covers it exactly, and each run can
    // be attached on its own (a run never crosses a discontinuity).
    let (mut at, mut runs) = (0, 0);
    while at < b.len() {
        let n = b.contiguous_len(at);
        assert!(n > 0);
        let n = n.min(60_000);
        let mut m = Mbuf::alloc(&pool).unwrap();
        b.attach(&mut m, at, n).unwrap();
        at += n;
        runs += 1;
    }
    assert_eq!(at, b.len());
    assert!(runs >= (5 << 20) / 60_000);
    assert_eq!(b.contiguous_len(b.len()), 0);
    // Nothing to attach at its end: refused, where a buffer that ended at its
    // region's end had the attach index past the region's page table.
    assert!(b
        .attach(&mut Mbuf::alloc(&pool).unwrap(), b.len(), 0)
        .is_err());
    if !eal.iova_is_va() && region.is_hugepages() {
        // Physical addresses: a run ends at a page boundary unless the next
        // page happens to follow it physically.
        let to_boundary = region.page_size() - (b.offset() % region.page_size());
        assert!(b.contiguous_len(0) >= to_boundary);
    } else if eal.iova_is_va() {
        assert_eq!(
            b.contiguous_len(0),
            b.len(),
            "virtual addresses are contiguous"
        );
    }
    drop((a, b));
    assert_eq!(region.lent_bytes(), 0);
}

/// Shared handles ([`ExtBuf::share`]) read and send the same bytes; none
/// writes while another handle or an mbuf refers to them, and the range goes
/// back to the region once, after the last of them, whichever goes last.
#[test]
fn shared_handles_send_but_do_not_write() {
    let eal = eal(HugepageMode::Auto);
    let pool = Mempool::new(&eal, "zc-share", 1023, 0, DEFAULT_DATA_ROOM).unwrap();
    let (a, b) = memif_pair(&eal, &pool, None);
    let (mut tx, mut rx) = (a.tx_queue(0).unwrap(), b.rx_queue(0).unwrap());
    let region = ExtMem::with_pages(&eal, 64 << 10, false).unwrap();
    let (released, on_release) = counter();
    let mut first = region.buffer_with(0, 1500, on_release).unwrap();
    first.as_mut_slice().unwrap().fill(0x5A);
    let second = first.share().unwrap();
    let mut third = second.share().unwrap();
    assert_eq!((first.offset(), third.len()), (0, 1500));
    assert_eq!(second.as_slice(), first.as_slice());
    assert_eq!(first.in_flight(), 2, "two other handles");
    assert!(first.as_mut_slice().is_none() && third.as_mut_slice().is_none());

    // A frame from the second handle, which goes before the frame does.
    let mut head = mbuf_of(&pool, &[0xFFu8; 14]);
    let mut payload = Mbuf::alloc(&pool).unwrap();
    second.attach(&mut payload, 0, 1486).unwrap();
    head.chain(payload).unwrap();
    drop(second);
    drop(first);
    assert_eq!(third.in_flight(), 1, "the queued frame");
    assert!(third.as_mut_slice().is_none());
    let got = send_and_receive(&mut tx, &mut rx, head).to_vec();
    assert!(got[14..].iter().all(|&x| x == 0x5A));
    assert_eq!(released.load(Ordering::SeqCst), 0, "a handle is left");
    assert!(
        third.as_mut_slice().is_some(),
        "the last handle writes again"
    );
    drop(third);
    assert_eq!(released.load(Ordering::SeqCst), 1, "released once");
    assert_eq!(region.lent_bytes(), 0);

    // DPDK's count is 16 bits: sharing stops at half of it.
    let base = region.buffer(2048, 64).unwrap();
    let mut handles = Vec::new();
    while let Ok(h) = base.share() {
        handles.push(h);
    }
    assert_eq!(handles.len(), usize::from(dpdk_ffi::ExtBuf::MAX_SHARES));
    drop((base, handles));
    assert_eq!(region.lent_bytes(), 0);
}

/// The 16-bit count that handles and attached mbufs share never wraps: with
/// the most handles `share` gives, mbufs attach until the count is one short
/// of its limit, and the next attach fails (a wrapped count would let a
/// handle write, or free, bytes that frames still carry).
#[test]
fn attaching_stops_short_of_the_count_limit() {
    let eal = eal(HugepageMode::Auto);
    // Small mbufs: an attached one uses none of its own data room.
    let pool = Mempool::new(&eal, "zc-refs", 32767, 0, 192).unwrap();
    let region = ExtMem::with_pages(&eal, 64 << 10, false).unwrap();
    let base = region.buffer(4096, 64).unwrap();
    let handles: Vec<_> = (0..dpdk_ffi::ExtBuf::MAX_SHARES)
        .map(|_| base.share().unwrap())
        .collect();
    let mut attached = Vec::new();
    let refused = loop {
        let mut m = Mbuf::alloc(&pool).expect("the pool outlasts the count");
        match handles[attached.len() % handles.len()].attach(&mut m, 0, 64) {
            Ok(()) => attached.push(m),
            Err(e) => break e,
        }
    };
    assert!(
        refused.to_string().contains("too many references"),
        "{refused}"
    );
    assert_eq!(base.in_flight(), dpdk_ffi::ExtBuf::MAX_REFS - 1);
    assert_eq!(
        attached.len(),
        usize::from(dpdk_ffi::ExtBuf::MAX_REFS - 1 - dpdk_ffi::ExtBuf::MAX_SHARES)
    );
    assert!(base.share().is_err(), "no more handles either");
    drop(attached);
    assert_eq!(base.in_flight(), dpdk_ffi::ExtBuf::MAX_SHARES);
    drop((base, handles));
    assert_eq!(
        region.lent_bytes(),
        0,
        "back to the region once all are gone"
    );
}

/// Threads allocating from one region at once never fail while space is
/// free: the gap is found and claimed under one lock. (Two threads could
/// pick the same gap, and the loser got "overlaps a buffer still lent out".)
#[test]
fn allocations_on_several_threads_at_once() {
    let eal = eal(HugepageMode::Never);
    let region = ExtMem::new(&eal, 1 << 20).unwrap();
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for i in 0..2000 {
                    let b = region
                        .alloc(4096, 64)
                        .unwrap_or_else(|e| panic!("allocation {i}: {e}"));
                    drop(b);
                }
            });
        }
    });
    assert_eq!(region.lent_bytes(), 0);
}
