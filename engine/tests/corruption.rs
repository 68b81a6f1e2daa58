//! Garbage, truncated, lying and stale frames: each is counted and dropped, nothing
//! panics, and the protocol state does not move.

mod common;

use common::*;
use emx::proto::{ChecksumMode, Completion, CoreConfig, DropReason, PeerId, Time};
use emx::sim::{LinkConfig, SimRng};
use emx::wire::{FrameType, MAX_MSG_LEN};
use std::time::Duration;

#[derive(Debug, PartialEq)]
struct Snapshot {
    info: emx::proto::PeerInfo,
    outstanding: usize,
    unexpected: u64,
    probe: Option<emx::proto::ProbeInfo>,
    recvs_completed: u64,
}

fn snapshot(sim: &TestSim, i: usize) -> Snapshot {
    let c = sim.core_ref(i);
    Snapshot {
        info: c.peer_info(PeerId(0)).unwrap(),
        outstanding: c.outstanding(),
        unexpected: c.unexpected_bytes(),
        probe: c.probe(None, 0, 0),
        recvs_completed: c.stats().recvs_completed,
    }
}

#[test]
fn bad_frames_are_counted_and_change_nothing() {
    let cfg = CoreConfig {
        checksum: ChecksumMode::Full,
        ..CoreConfig::default()
    };
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    // Core 0 runs epoch 5, so that older epochs exist.
    sim.replace_core(0, make_core(&cfg, 0, 2, 5, Time::ZERO));
    let now = sim.now();
    // State worth protecting on core 1: an unexpected message and a posted receive.
    sim.core(0)
        .send(now, addr(1), 1, b"unexpected".to_vec(), 0)
        .unwrap();
    sim.core(1)
        .post_recv(now, Some(addr(0)), 2, !0, vec![0; 3000], 2)
        .unwrap();
    sim.run_until(now + Duration::from_millis(5), |_| false);
    drain(&mut sim);
    // A valid data frame, taken off the link by hand.
    let now = sim.now();
    sim.core(0)
        .send(now, addr(1), 2, pattern(2, 3000), 3)
        .unwrap();
    let good = take_frame(&mut sim, 0).expect("a data frame");
    let before = snapshot(&sim, 1);
    let drops_before = drops(&sim, 1);

    let mut bad: Vec<(Vec<u8>, Option<DropReason>)> = Vec::new();
    let mut rng = SimRng::new(99);
    for _ in 0..2000 {
        let n = rng.below(200) as usize;
        bad.push(((0..n).map(|_| rng.next_u64() as u8).collect(), None));
    }
    for n in 0..good.len() {
        bad.push((good[..n].to_vec(), Some(DropReason::Truncated)));
    }
    // Another protocol's frame, shorter than an emx header: not damage.
    let mut arp = good[..60].to_vec();
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    bad.push((arp, Some(DropReason::EtherType)));
    for bit in 0..good.len() * 8 {
        let mut f = good.clone();
        f[bit / 8] ^= 1 << (bit % 8);
        if bit >= 48 {
            // The destination MAC is the switch's business, the rest the core's.
            bad.push((f, None));
        }
    }
    use DropReason as D;
    let mut lie = |r: D, f: &dyn Fn(&mut emx::wire::Header)| bad.push((craft(&good, f), Some(r)));
    lie(D::Truncated, &|h| h.payload_len += 1);
    lie(D::BadLength, &|h| h.frag_offset = h.msg_len);
    lie(D::BadLength, &|h| h.msg_len = MAX_MSG_LEN + 1);
    lie(D::BadLength, &|h| h.frag_offset = u64::MAX - 3);
    lie(D::BadLength, &|h| h.frag_unit -= 1); // not a whole fragment of its unit
    lie(D::BadLength, &|h| h.frag_offset = 1000); // not on its unit's grid
    lie(D::WrongCluster, &|h| h.cluster = 77);
    lie(D::StaleEpoch, &|h| h.dst_epoch = 3);
    lie(D::StaleEpoch, &|h| h.src_epoch = 4);
    lie(D::UnknownPeer, &|h| h.src_node = 40);
    lie(D::NotForUs, &|h| h.dst_ep = 3);
    lie(D::NotForUs, &|h| h.src_mac.0[5] ^= 1);
    lie(D::OutOfWindow, &|h| h.seq += 1000);
    lie(D::Protocol, &|h| h.msg_len = 1 << 20); // eager beyond the threshold
    lie(D::Protocol, &|h| h.ack = h.ack.wrapping_add(50)); // acks frames never sent
    lie(D::Protocol, &|h| {
        h.frame_type = FrameType::PullData;
        h.msg_id = 9;
    });
    lie(D::Protocol, &|h| {
        h.frame_type = FrameType::Notify;
        h.frag_unit = 0;
        h.payload_len = 0;
        h.msg_len = 0;
        h.frag_offset = 0;
        h.msg_id = 1000;
    });
    lie(D::Malformed, &|h| h.flags |= 0x80);
    lie(D::Malformed, &|h| h.src_epoch = 0);
    lie(D::Malformed, &|h| {
        h.frame_type = FrameType::Ack;
    });
    for (k, (frame, want)) in bad.iter().enumerate() {
        let now = sim.now();
        let got = sim.core(1).handle_frame(now, frame);
        let err = got.expect_err(&format!("bad frame {k} accepted"));
        if let Some(w) = want {
            assert_eq!(err, *w, "frame {k}");
        }
        assert_eq!(
            snapshot(&sim, 1),
            before,
            "frame {k} ({err:?}) changed the state"
        );
    }
    assert_eq!(
        drops(&sim, 1) - drops_before,
        bad.len() as u64,
        "every drop counted"
    );

    // The real frame still goes through, and everything completes.
    let now = sim.now();
    sim.core(1).handle_frame(now, &good).unwrap();
    let mut n = 0;
    let ok = sim.run_until(now + Duration::from_millis(50), |sim| {
        for (_, c) in drain(sim) {
            match c {
                Completion::Recv(r) => assert!(r.buf == pattern(2, 3000)),
                Completion::Send(s) => s.result.unwrap(),
            }
            n += 1;
        }
        n == 2
    });
    assert!(ok);
}

#[test]
fn corrupting_link_with_full_checksums() {
    let cfg = CoreConfig {
        checksum: ChecksumMode::Full,
        ..CoreConfig::default()
    };
    let link = LinkConfig {
        corrupt: 0.2,
        loss: 0.05,
        seed: 5,
        ..LinkConfig::default()
    };
    let mut sim = make_sim(3, link, &cfg);
    let now = sim.now();
    let sizes = [0usize, 7, 1500, 20_000, 400_000];
    for (k, &len) in sizes.iter().enumerate() {
        for (a, b) in [(0, 1), (1, 2), (2, 0)] {
            sim.core(b)
                .post_recv(now, Some(addr(a)), k as u64, !0, vec![0; len], k as u64)
                .unwrap();
            sim.core(a)
                .send(now, addr(b), k as u64, pattern(k as u64, len), 0)
                .unwrap();
        }
    }
    let mut n = 0;
    let ok = sim.run_until(Time(10_000_000_000), |sim| {
        for (_, c) in drain(sim) {
            match c {
                Completion::Recv(r) => {
                    let k = r.ctx as usize;
                    let info = r.result.expect("every receive completes");
                    assert_eq!(info.msg_len as usize, sizes[k], "message {k}");
                    assert!(
                        r.buf == pattern(k as u64, sizes[k]),
                        "message {k} corrupted"
                    );
                }
                Completion::Send(d) => d.result.expect("every send completes"),
            }
            n += 1;
        }
        n == sizes.len() * 6
    });
    assert!(ok);
    let s = sim.stats();
    assert!(s.corrupted > 100, "{s:?}");
    assert_eq!(s.corrupted_accepted, 0, "{s:?}");
}
