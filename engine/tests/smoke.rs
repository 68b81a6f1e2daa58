//! Basic end-to-end flows over a clean simulated link.

mod common;

use common::*;
use emx::proto::{Completion, CoreConfig, Time};
use emx::sim::LinkConfig;
use std::time::Duration;

fn exchange(cfg: CoreConfig, link: LinkConfig, sizes: &[usize], recv_first: bool) -> TestSim {
    let mut sim = make_sim(2, link, &cfg);
    let n = sizes.len();
    let post = |sim: &mut TestSim| {
        for (k, &len) in sizes.iter().enumerate() {
            let now = sim.now();
            sim.core(1)
                .post_recv(now, Some(addr(0)), k as u64, !0, vec![0; len], k as u64)
                .unwrap();
        }
    };
    if recv_first {
        post(&mut sim);
    }
    for (k, &len) in sizes.iter().enumerate() {
        let now = sim.now();
        sim.core(0)
            .send(now, addr(1), k as u64, pattern(k as u64, len), k as u64)
            .unwrap();
    }
    if !recv_first {
        sim.run_until(Time::from_micros(200), |_| false);
        post(&mut sim);
    }
    await_exchange(&mut sim, Time(10_000_000_000), n as u64, |_, r| {
        let info = r.result.unwrap();
        let k = r.ctx;
        assert_eq!(info.match_bits, k);
        assert_eq!(info.msg_len as usize, sizes[k as usize]);
        assert!(!info.truncated);
        assert!(
            r.buf == pattern(k, sizes[k as usize]),
            "message {k} corrupted"
        );
    });
    sim
}

#[test]
fn eager_and_rendezvous_clean_link() {
    let sizes = [
        0,
        1,
        8,
        1424,
        1425,
        5000,
        32 * 1024,
        32 * 1024 + 1,
        200_000,
        1 << 20,
    ];
    exchange(CoreConfig::default(), LinkConfig::default(), &sizes, true);
    exchange(CoreConfig::default(), LinkConfig::default(), &sizes, false);
}

#[test]
fn jumbo_frames() {
    let cfg = CoreConfig {
        mtu: 9000,
        ..CoreConfig::default()
    };
    let sizes = [0, 8924, 8925, 32 * 1024, 3 << 20];
    exchange(cfg, LinkConfig::default(), &sizes, true);
}

#[test]
fn lossy_link() {
    let link = LinkConfig {
        loss: 0.2,
        duplicate: 0.05,
        reorder: 0.1,
        reorder_delay: Duration::from_micros(30),
        seed: 7,
        ..LinkConfig::default()
    };
    let sizes = [0, 8, 3000, 40_000, 300_000, 1 << 20];
    exchange(CoreConfig::default(), link.clone(), &sizes, true);
    exchange(CoreConfig::default(), link, &sizes, false);
}

/// Frames that arrive after their own retransmissions (held back beyond the
/// retransmission timeout, as in a switch buffer or a descheduled sender's
/// queue): each message still arrives once, and nothing comes of the late
/// ones. (`delivery_prop` mixes late frames with every other fault.)
#[test]
fn frames_later_than_their_retransmissions() {
    let link = LinkConfig {
        loss: 0.05,
        late: 0.3,
        late_delay: Duration::from_millis(4),
        seed: 3,
        ..LinkConfig::default()
    };
    let sizes = [0, 8, 3000, 40_000, 300_000, 1 << 20];
    for recv_first in [true, false] {
        let mut sim = exchange(CoreConfig::default(), link.clone(), &sizes, recv_first);
        // Let the last late frames land: nothing may come of them.
        let end = Time(sim.now().0 + 10_000_000);
        sim.run_until(end, |_| false);
        assert!(
            drain(&mut sim).is_empty(),
            "a late frame completed something"
        );
        let late = sim.stats().late;
        let (a, b) = (
            sim.core_ref(0).peer_stats(emx::proto::PeerId(0)).unwrap(),
            sim.core_ref(1).peer_stats(emx::proto::PeerId(0)).unwrap(),
        );
        assert!(late > 20 && a.retransmits > 0, "{late} late, {a:?}");
        // The link duplicates nothing: copies that came after one was taken
        // are late frames that came after their retransmissions.
        assert!(a.duplicates + b.duplicates > 0, "{a:?} {b:?}");
        for st in [a, b] {
            assert_eq!(
                st.dropped.get(emx::proto::DropReason::Protocol),
                0,
                "{st:?}"
            );
        }
    }
}

/// A message of more than 1 GiB, rendezvous over jumbo frames.
#[test]
fn one_gibibyte_message() {
    let cfg = CoreConfig {
        mtu: 9000,
        ..CoreConfig::default()
    };
    let link = LinkConfig {
        bandwidth_bps: 0,
        latency: Duration::from_micros(2),
        ..LinkConfig::default()
    };
    let mut sim = make_sim(2, link, &cfg);
    let len = (1usize << 30) + 12_345;
    let mut data = vec![0u8; len];
    for (i, chunk) in data.chunks_mut(4096).enumerate() {
        let n = chunk.len().min(8);
        chunk[..n].copy_from_slice(&(i as u64).to_le_bytes()[..n]);
        chunk[n..].fill(i as u8);
    }
    let now = sim.now();
    sim.core(1)
        .post_recv(now, Some(addr(0)), 1, !0, vec![0; len], 0)
        .unwrap();
    sim.core(0).send(now, addr(1), 1, data, 0).unwrap();
    let mut got = None;
    let mut sent = None;
    sim.run_until(Time(100_000_000_000), |sim| {
        for (_, c) in drain(sim) {
            match c {
                Completion::Recv(r) => got = Some(r),
                Completion::Send(s) => sent = Some(s),
            }
        }
        got.is_some() && sent.is_some()
    });
    let (r, s) = (got.unwrap(), sent.unwrap());
    s.result.unwrap();
    let info = r.result.unwrap();
    assert_eq!(
        (info.msg_len, info.copied, info.truncated),
        (len as u64, len as u64, false)
    );
    assert!(r.buf == s.buf, "1 GiB arrived byte-exact");
}

/// Small messages queued behind a large rendezvous to the same peer are not held back
/// until it ends.
#[test]
fn small_messages_overtake_a_long_transfer() {
    let cfg = CoreConfig::default();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    let big = 16 << 20;
    let now = sim.now();
    sim.core(1)
        .post_recv(now, Some(addr(0)), 1, !0, vec![0; big], 1)
        .unwrap();
    sim.core(1)
        .post_recv(now, Some(addr(0)), 2, !0, vec![0; 8], 2)
        .unwrap();
    sim.core(0)
        .send(now, addr(1), 1, pattern(1, big), 1)
        .unwrap();
    // Well into the transfer, a small message joins the queue.
    sim.run_until(now + Duration::from_millis(2), |_| false);
    let now = sim.now();
    sim.core(0)
        .send(now, addr(1), 2, b"urgent!!".to_vec(), 2)
        .unwrap();
    let mut order = Vec::new();
    sim.run_until(Time(10_000_000_000), |sim| {
        for (_, c) in drain(sim) {
            if let Completion::Recv(r) = c {
                order.push((r.ctx, sim.now()));
            }
        }
        order.len() == 2
    });
    assert_eq!(order.len(), 2);
    assert_eq!(order[0].0, 2, "the small message finished first");
    assert!(
        order[0].1 < now + Duration::from_micros(200),
        "{:?}",
        order[0].1
    );
}

/// A peer leaves the transmit list with the frame that empties it, so the
/// runtime does not prepare a frame buffer only to learn there is nothing
/// more; a peer with more to send stays on it.
#[test]
fn may_transmit_turns_false_with_the_last_frame() {
    let cfg = CoreConfig::default();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    // A first message sets the session up (epochs, credit); then all goes quiet.
    transfer(&mut sim, 0, 1, 8, 1);
    sim.run_until(sim.now() + Duration::from_millis(1), |_| false);
    assert!(
        !sim.core(0).may_transmit(),
        "nothing should be left to send"
    );

    let now = sim.now();
    sim.core(0).send(now, addr(1), 2, pattern(2, 8), 2).unwrap();
    assert!(sim.core(0).may_transmit());
    assert!(take_frame(&mut sim, 0).is_some());
    assert!(
        !sim.core(0).may_transmit(),
        "the peer's only frame is out, yet it is still on the transmit list"
    );

    // Two messages too long to share a frame: the first frame leaves the peer listed.
    let now = sim.now();
    for k in 3..5 {
        sim.core(0)
            .send(now, addr(1), k, pattern(k, 1000), k)
            .unwrap();
    }
    assert!(take_frame(&mut sim, 0).is_some());
    assert!(sim.core(0).may_transmit());
    assert!(take_frame(&mut sim, 0).is_some());
    assert!(!sim.core(0).may_transmit());
}
