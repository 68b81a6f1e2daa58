//! MX matching semantics: masks, source filters, probe, cancel, truncation, ordering
//! under reordering, and the unexpected-queue bound with credit back-pressure.

mod common;

use common::*;
use emx::proto::{Completion, CoreConfig, PeerId, ProbeInfo, RequestError, Time};
use emx::sim::LinkConfig;
use std::time::Duration;

fn settle(sim: &mut TestSim, us: u64) -> Vec<(usize, TestCompletion)> {
    let until = sim.now() + Duration::from_micros(us);
    let mut out = Vec::new();
    sim.run_until(until, |sim| {
        out.extend(drain(sim));
        false
    });
    out.extend(drain(sim));
    out
}

fn recvs(c: Vec<(usize, TestCompletion)>) -> Vec<emx::proto::RecvDone<Vec<u8>>> {
    c.into_iter()
        .filter_map(|(_, c)| match c {
            Completion::Recv(r) => Some(r),
            Completion::Send(s) => {
                s.result.unwrap();
                None
            }
        })
        .collect()
}

#[test]
fn mask_source_probe_cancel() {
    let cfg = CoreConfig::default();
    let mut sim = make_sim(3, LinkConfig::default(), &cfg);
    let now = sim.now();
    sim.core(0)
        .send(now, addr(2), 0xAB_0001, b"from0".to_vec(), 0)
        .unwrap();
    sim.core(1)
        .send(now, addr(2), 0xAB_0002, b"from1!".to_vec(), 0)
        .unwrap();
    assert!(recvs(settle(&mut sim, 200)).is_empty());
    // Probe sees the unexpected envelopes without taking them.
    let now = sim.now();
    let c = sim.core(2);
    assert_eq!(
        c.probe(Some(addr(1)), 0xAB_0000, 0xFF_0000),
        Some(ProbeInfo {
            src: addr(1),
            match_bits: 0xAB_0002,
            len: 6
        })
    );
    assert_eq!(c.probe(None, 0xAC_0000, 0xFF_0000), None);
    assert!(
        c.probe(None, 0, 0).is_some(),
        "a zero mask matches anything"
    );
    // A receive for node 1 only skips node 0's older message.
    let r1 = c
        .post_recv(now, Some(addr(1)), 0xAB_0000, 0xFF_0000, vec![0; 16], 1)
        .unwrap();
    let got = recvs(settle(&mut sim, 10));
    assert_eq!(got.len(), 1);
    let info = got[0].result.unwrap();
    assert_eq!(
        (got[0].req, info.src, info.match_bits),
        (r1, addr(1), 0xAB_0002)
    );
    assert_eq!(&got[0].buf[..6], b"from1!");
    // Cancel: a posted receive comes back with its buffer; twice is a no-op.
    let now = sim.now();
    let c = sim.core(2);
    let r2 = c.post_recv(now, None, 0xCC, !0, vec![9; 3], 2).unwrap();
    assert!(c.cancel(r2));
    assert!(!c.cancel(r2));
    assert!(!c.cancel(r1), "a completed receive cannot be cancelled");
    match c.poll_completion() {
        Some(Completion::Recv(r)) => {
            assert_eq!(r.result, Err(RequestError::Cancelled));
            assert_eq!(r.buf, vec![9; 3]);
        }
        other => panic!("{other:?}"),
    }
    // The remaining unexpected message is still there for an any-source receive.
    let now = sim.now();
    sim.core(2)
        .post_recv(now, None, 0, 0, vec![0; 5], 3)
        .unwrap();
    let got = recvs(settle(&mut sim, 10));
    assert_eq!(got[0].result.unwrap().src, addr(0));
    assert_eq!(got[0].buf, b"from0");
    assert_eq!(sim.core(2).probe(None, 0, 0), None);
}

#[test]
fn truncation_reports_the_real_length() {
    let cfg = CoreConfig::default();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    for (k, (len, buf)) in [
        (100usize, 10usize),
        (5000, 2000),
        (300_000, 70_000),
        (100_000, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let now = sim.now();
        // Alternate receive before and after arrival.
        if k % 2 == 0 {
            sim.core(1)
                .post_recv(
                    now,
                    Some(addr(0)),
                    k as u64,
                    !0,
                    vec![0xEE; buf + 8][..buf].to_vec(),
                    0,
                )
                .unwrap();
        }
        sim.core(0)
            .send(now, addr(1), k as u64, pattern(k as u64, len), 0)
            .unwrap();
        let mut got = recvs(settle(&mut sim, 300));
        if k % 2 == 1 {
            let now = sim.now();
            sim.core(1)
                .post_recv(now, Some(addr(0)), k as u64, !0, vec![0xEE; buf], 0)
                .unwrap();
        }
        got.extend(recvs(settle(&mut sim, 2000)));
        assert_eq!(got.len(), 1, "message {k}");
        let info = got[0].result.unwrap();
        assert!(info.truncated);
        assert_eq!((info.msg_len, info.copied), (len as u64, buf as u64));
        assert_eq!(got[0].buf, pattern(k as u64, len)[..buf]);
    }
}

#[test]
fn pair_order_holds_under_reordering() {
    let cfg = CoreConfig::default();
    let link = LinkConfig {
        reorder: 0.5,
        reorder_delay: Duration::from_micros(50),
        duplicate: 0.1,
        loss: 0.1,
        // Some frames (originals or copies) after their retransmissions.
        late: 0.02,
        seed: 11,
        ..LinkConfig::default()
    };
    let mut sim = make_sim(3, link, &cfg);
    let now = sim.now();
    // Mixed sizes: eager, fragmented eager and rendezvous overtake each other on the wire.
    let sizes: Vec<usize> = (0..60).map(|i| [3, 9000, 40_000, 0, 1500][i % 5]).collect();
    for (i, &len) in sizes.iter().enumerate() {
        sim.core(0)
            .send(now, addr(2), 5 << 32 | i as u64, pattern(i as u64, len), 0)
            .unwrap();
        sim.core(1)
            .send(
                now,
                addr(2),
                5 << 32 | (100 + i) as u64,
                pattern(100 + i as u64, len),
                0,
            )
            .unwrap();
    }
    // Half the receives before arrival, half after; all any-source, tag only.
    // The context is the posting rank: receives take messages in that order.
    let post = |sim: &mut TestSim, ranks: std::ops::Range<u64>| {
        let now = sim.now();
        for rank in ranks {
            sim.core(2)
                .post_recv(now, None, 5 << 32, !0 << 32, vec![0; 40_000], rank)
                .unwrap();
        }
    };
    post(&mut sim, 0..60);
    let mut got = recvs(settle(&mut sim, 300));
    post(&mut sim, 60..120);
    let ok = sim.run_until(Time(5_000_000_000), |sim| {
        got.extend(recvs(drain(sim)));
        got.len() == 120
    });
    assert!(ok);
    got.sort_by_key(|r| r.ctx);
    let mut last = [None, None];
    for r in &got {
        let info = r.result.unwrap();
        let id = info.match_bits & 0xffff_ffff;
        let src = if info.src == addr(0) { 0 } else { 1 };
        if let Some(prev) = last[src] {
            assert!(id > prev, "from {src}: {id} after {prev}");
        }
        last[src] = Some(id);
        assert_eq!(
            r.buf[..info.copied as usize],
            pattern(id, info.msg_len as usize)[..]
        );
    }
    assert!(sim.core_ref(2).peer_stats(PeerId(0)).unwrap().duplicates > 0);
}

#[test]
fn unexpected_store_is_bounded_and_senders_wait_on_credits() {
    let cfg = CoreConfig {
        max_peers: 4,
        unexpected_bytes: 4 * 40 * 1024,
        eager_threshold: 16 * 1024,
        ..CoreConfig::default()
    };
    let mut sim = make_sim(3, LinkConfig::default(), &cfg);
    let now = sim.now();
    // Two senders flood 300 KiB each of eager messages that nobody receives yet.
    for i in 0..30u64 {
        for s in 0..2 {
            sim.core(s)
                .send(now, addr(2), i, pattern(i + 100 * s as u64, 10_000), 0)
                .unwrap();
        }
    }
    let bound = cfg.unexpected_bytes;
    let until = sim.now() + Duration::from_millis(50);
    let mut sends = 0;
    sim.run_until(until, |sim| {
        assert!(sim.core_ref(2).unexpected_bytes() <= bound);
        for (_, c) in drain(sim) {
            match c {
                // Delivered into the store: the send is done.
                Completion::Send(s) => {
                    s.result.unwrap();
                    sends += 1;
                }
                Completion::Recv(_) => panic!("nothing was posted"),
            }
        }
        false
    });
    assert!(sends > 0 && sends < 60, "{sends}");
    let held = sim.core_ref(2).unexpected_bytes();
    assert!(
        held > 0 && held <= bound / 2,
        "each sender has its share: {held}"
    );
    for s in 0..2 {
        let st = sim.core_ref(s).peer_stats(PeerId(1)).unwrap();
        assert!(st.credit_stalls > 0, "sender {s} was held back");
        assert_eq!(st.retransmits, 0, "held back, not dropped");
    }
    // Receives drain the store and the rest flows, in order per sender.
    let now = sim.now();
    for s in 0..2 {
        for _ in 0..30 {
            sim.core(2)
                .post_recv(now, Some(addr(s)), 0, 0, vec![0; 10_000], s as u64)
                .unwrap();
        }
    }
    let mut got: Vec<_> = Vec::new();
    let ok = sim.run_until(Time(5_000_000_000), |sim| {
        for (_, c) in drain(sim) {
            match c {
                Completion::Recv(r) => got.push(r),
                Completion::Send(s) => {
                    s.result.unwrap();
                    sends += 1;
                }
            }
        }
        assert!(sim.core_ref(2).unexpected_bytes() <= bound);
        got.len() == 60 && sends == 60
    });
    assert!(ok, "{} receives, {sends} sends", got.len());
    for s in 0..2u64 {
        let ids: Vec<u64> = got
            .iter()
            .filter(|r| r.ctx == s)
            .map(|r| r.result.unwrap().match_bits)
            .collect();
        assert_eq!(ids, (0..30).collect::<Vec<_>>());
        for r in got.iter().filter(|r| r.ctx == s) {
            let i = r.result.unwrap().match_bits;
            assert!(r.buf == pattern(i + 100 * s, 10_000));
        }
    }
    assert_eq!(sim.core_ref(2).unexpected_bytes(), 0);
    assert!(sim.core_ref(2).stats().unexpected_high_water <= bound);
}

/// Two nodes at MTU 9000 with 64 KiB of credit per peer: about 15 eager
/// messages of 4000 bytes.
fn small_credit() -> CoreConfig {
    CoreConfig {
        mtu: 9000,
        max_peers: 4,
        unexpected_bytes: 4 * 64 * 1024,
        eager_threshold: 16 * 1024,
        ..CoreConfig::default()
    }
}

/// A link of 5 us each way and no bandwidth limit.
fn near_link() -> LinkConfig {
    LinkConfig {
        latency: Duration::from_micros(5),
        bandwidth_bps: 0,
        ..LinkConfig::default()
    }
}

/// A stream of eager messages into posted receives is held only by the link, not by
/// the receiver's delayed ack: a receiver gives the credit of a message that matched
/// on arrival back at once when half the sender's credit has come back. (Before, the
/// credit waited for `ack_every` frames or `ack_delay`, so a sender whose credit
/// covered fewer frames than `ack_every` waited `ack_delay` per credit's worth.)
#[test]
fn matched_messages_give_their_credit_back_without_waiting_for_the_delayed_ack() {
    const N: u64 = 160;
    const LEN: usize = 4000;
    let cfg = CoreConfig {
        // Delayed acks that would hold each credit's worth back 150 us.
        ack_delay: Duration::from_micros(150),
        ack_every: 64,
        ..small_credit()
    };
    assert!(
        (cfg.peer_credit() / emx::proto::matching::eager_charge(LEN as u64)) < N / 8,
        "the stream needs the credit back several times"
    );
    let mut sim = make_sim(2, near_link(), &cfg);
    let now = sim.now();
    for i in 0..N {
        sim.core(1)
            .post_recv(now, Some(addr(0)), i, !0, vec![0; LEN], i)
            .unwrap();
    }
    for i in 0..N {
        sim.core(0)
            .send(now, addr(1), i, pattern(i, LEN), i)
            .unwrap();
    }
    let start = sim.now();
    await_exchange(&mut sim, start + Duration::from_secs(1), N, |k, r| {
        let info = r.result.unwrap();
        assert_eq!(info.match_bits, k, "in order");
        assert!(r.buf == pattern(k, LEN));
    });
    let took = sim.now().0 - start.0;
    let c = sim.core_ref(0);
    let st = c.peer_stats(c.peer_id(addr(1)).unwrap()).unwrap();
    assert!(st.credit_stalls > 0, "credit bounded the stream");
    // About one round trip (10 us) per half credit: 160 messages in 20 of them.
    // Waiting for delayed acks instead takes 11 x 160 us.
    assert!(
        took < 500_000,
        "{N} messages took {took} ns with {} credit stalls",
        st.credit_stalls
    );
}

/// How many messages of how many bytes [`credit_stall`] sends.
const STALL_N: u64 = 40;
const STALL_LEN: usize = 4000;

/// A stream that stalls on credit: core 0 sends `STALL_N` messages of
/// `STALL_LEN` bytes to core 1, which posts no receive; returns the
/// simulation and when they were sent.
fn credit_stall() -> (TestSim, Time) {
    let mut sim = make_sim(2, near_link(), &small_credit());
    let now = sim.now();
    for i in 0..STALL_N {
        sim.core(0)
            .send(now, addr(1), i, pattern(i, STALL_LEN), i)
            .unwrap();
    }
    (sim, now)
}

/// A sender held back by a receiver whose store stays full probes it (its
/// credit update may have been lost) less and less often, as TCP's persist
/// timer does, down to one probe per `keepalive`; it probed every `rto_min`
/// (200 us) for as long as the store stayed full. Once the receiver takes the
/// messages, the stream goes on at once.
#[test]
fn a_sender_stalled_on_credit_backs_off_its_probes() {
    let (mut sim, now) = credit_stall();
    let sent = |sim: &TestSim| {
        let c = sim.core_ref(0);
        c.peer_stats(c.peer_id(addr(1)).unwrap())
            .unwrap()
            .frames_sent
    };
    // The store fills, and the sender stalls.
    sim.run_until(now + Duration::from_millis(1), |_| false);
    let c = sim.core_ref(0);
    assert!(
        c.peer_stats(c.peer_id(addr(1)).unwrap())
            .unwrap()
            .credit_stalls
            > 0
    );
    let before = sent(&sim);
    let stalled = sim.now();
    sim.run_until(stalled + Duration::from_millis(200), |_| false);
    let probes = sent(&sim) - before;
    // 200 us, 400 us, ... up to 10 ms: about 25 in 200 ms (it was 1,000).
    assert!(probes <= 30, "{probes} probes in 200 ms");
    assert!(
        probes >= 15,
        "{probes} probes in 200 ms: it stopped probing"
    );
    // The receiver takes everything; the stream resumes without waiting for
    // a probe.
    let now = sim.now();
    for i in 0..STALL_N {
        sim.core(1)
            .post_recv(now, Some(addr(0)), i, !0, vec![0; STALL_LEN], i)
            .unwrap();
    }
    await_exchange(&mut sim, now + Duration::from_millis(2), STALL_N, |k, r| {
        assert_eq!(r.result.unwrap().match_bits, k);
        assert!(r.buf == pattern(k, STALL_LEN));
    });
}

/// The persist probes' backoff is theirs alone: a PULL sent to the peer a
/// sender is stalled on, and lost, goes again after about one timeout, not
/// after `rto_max` (100 ms), to which the probes had backed the timer off.
#[test]
fn a_lost_pull_to_a_peer_stalled_on_credit_goes_again_soon() {
    const BIG: usize = 64 * 1024;
    let (mut sim, now) = credit_stall();
    // Stalled, and probing less and less often.
    sim.run_until(now + Duration::from_millis(100), |_| false);
    // The other way, a rendezvous message whose first PULL is lost.
    let now = sim.now();
    sim.core(1)
        .send(now, addr(0), 1 << 40, pattern(1, BIG), 1 << 40)
        .unwrap();
    sim.core(0)
        .post_recv(now, Some(addr(1)), 1 << 40, !0, vec![0; BIG], 1 << 40)
        .unwrap();
    sim.set_blocked(0, 1, true);
    sim.run_until(now + Duration::from_micros(50), |_| false);
    sim.set_blocked(0, 1, false);
    let got = sim.run_until(now + Duration::from_millis(20), |sim| {
        drain(sim).iter().any(|(i, c)| {
            *i == 0 && matches!(c, Completion::Recv(r) if r.ctx == 1 << 40 && r.result.is_ok())
        })
    });
    assert!(
        got,
        "the message came {:?} after it was sent",
        sim.now() - now
    );
    let c = sim.core_ref(0);
    let st = c.peer_stats(c.peer_id(addr(1)).unwrap()).unwrap();
    assert!(st.retransmits > 0, "the PULL was lost: {st:?}");
}

/// A whole message that arrives unexpected is matched at once (queued for the
/// receive to come) and kept out of the id map: a frame that repeats its id
/// is refused as the one after a matched message always was, and the message
/// is delivered once.
#[test]
fn a_repeated_unexpected_message_is_refused() {
    let cfg = CoreConfig::default();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    let now = sim.now();
    sim.core(0)
        .send(now, addr(1), 1, b"first".to_vec(), 0)
        .unwrap();
    assert!(recvs(settle(&mut sim, 200)).is_empty());
    // The next one by hand, delivered unexpected too.
    let now = sim.now();
    sim.core(0)
        .send(now, addr(1), 2, b"second".to_vec(), 0)
        .unwrap();
    let good = take_frame(&mut sim, 0).expect("a data frame");
    sim.core(1).handle_frame(now, &good).unwrap();
    assert_eq!(sim.core_ref(1).stats().unexpected, 2);
    // The same message again in a new frame (the next sequence number).
    let again = craft(&good, |h| h.seq = h.seq.wrapping_add(1));
    assert_eq!(
        sim.core(1).handle_frame(now, &again),
        Err(emx::wire::DropReason::Protocol)
    );
    for (tag, want) in [(1, &b"first"[..]), (2, &b"second"[..])] {
        let now = sim.now();
        sim.core(1)
            .post_recv(now, Some(addr(0)), tag, !0, vec![0; 8], tag)
            .unwrap();
        let got = recvs(settle(&mut sim, 10));
        assert_eq!(got.len(), 1);
        assert_eq!(&got[0].buf[..got[0].result.unwrap().copied as usize], want);
    }
    assert_eq!(sim.core(1).probe(None, 0, 0), None);
    assert_eq!(sim.core_ref(1).unexpected_bytes(), 0);
}

/// `unexpected_high_water` is what the store held between frames: messages
/// that posted receives took as they came (several frames eager, and a
/// rendezvous) held none of it, and used to count their charge for the
/// moment before matching (3,328 bytes for the eager one, 256 for the
/// rendezvous request). One that waits unexpected counts.
#[test]
fn messages_taken_at_once_leave_no_unexpected_high_water() {
    let cfg = CoreConfig::default();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    for (i, len) in [(1u64, 3000usize), (2, 40_000)] {
        let now = sim.now();
        sim.core(1)
            .post_recv(now, Some(addr(0)), i, !0, vec![0; len], 0)
            .unwrap();
        sim.core(0)
            .send(now, addr(1), i, pattern(i, len), 0)
            .unwrap();
        let got = recvs(settle(&mut sim, 20_000));
        assert_eq!(got.len(), 1, "message {i}");
        assert!(got[0].buf == pattern(i, len));
        assert_eq!(sim.core_ref(1).stats().unexpected_high_water, 0, "{len} B");
    }
    let now = sim.now();
    sim.core(0)
        .send(now, addr(1), 3, pattern(3, 3000), 0)
        .unwrap();
    assert!(recvs(settle(&mut sim, 20_000)).is_empty());
    assert!(sim.core_ref(1).stats().unexpected_high_water >= 3000);
}

/// `credit_stalls` counts messages that had to wait, once each: a large
/// eager message waiting while the receiver takes the store's messages
/// one by one, each giving back less credit than it needs, is one stall.
/// Each partial credit update used to count another.
#[test]
fn a_message_waiting_through_several_credit_updates_is_one_stall() {
    use emx::proto::matching::eager_charge;
    const SMALL: usize = 4000;
    const BIG: usize = 16 * 1024;
    let cfg = small_credit();
    let credit = cfg.peer_credit();
    // Small messages that fit the credit, then one that does not.
    let n = credit / eager_charge(SMALL as u64);
    let left = credit - n * eager_charge(SMALL as u64);
    assert!(eager_charge(BIG as u64) > left + 2 * eager_charge(SMALL as u64));
    let mut sim = make_sim(2, near_link(), &cfg);
    let now = sim.now();
    for i in 0..n {
        sim.core(0)
            .send(now, addr(1), i, pattern(i, SMALL), i)
            .unwrap();
    }
    sim.core(0)
        .send(now, addr(1), n, pattern(n, BIG), n)
        .unwrap();
    let stalls = |sim: &TestSim| {
        let c = sim.core_ref(0);
        c.peer_stats(c.peer_id(addr(1)).unwrap())
            .unwrap()
            .credit_stalls
    };
    sim.run_until(now + Duration::from_millis(1), |_| false);
    assert_eq!(stalls(&sim), 1, "the large message waits");
    // One receive a millisecond: the large message waits through several
    // credit updates, then goes.
    for i in 0..=n {
        let now = sim.now();
        let len = if i == n { BIG } else { SMALL };
        sim.core(1)
            .post_recv(now, Some(addr(0)), i, !0, vec![0; len], i)
            .unwrap();
        sim.run_until(now + Duration::from_millis(1), |_| false);
    }
    let got = recvs(settle(&mut sim, 5_000));
    assert_eq!(got.len() as u64, n + 1);
    assert_eq!(stalls(&sim), 1, "one message waited");
}
