//! Cancelling a rendezvous send: the sender withdraws a message its receiver has
//! not taken (WITHDRAW after the RTS is acknowledged), the receiver drops it and
//! says so (NOTIFY, withdrawn), and the send ends `Cancelled`. A message that a
//! receive took first is pulled as usual; one waiting behind a missing message is
//! passed by when its turn comes.

mod common;

use common::*;
use emx::proto::{Completion, CoreConfig, RequestError, RequestId};
use emx::sim::LinkConfig;
use emx::wire::FrameType;
use std::time::Duration;

const BIG: usize = 1 << 20;

/// Runs `us` microseconds and returns what completed: (node, ctx, result).
fn run(sim: &mut TestSim, us: u64) -> Vec<(usize, u64, Result<(), RequestError>)> {
    let mut out = Vec::new();
    sim.run_until(sim.now() + Duration::from_micros(us), |sim| {
        for (k, c) in drain(sim) {
            out.push(match c {
                Completion::Send(s) => (k, s.ctx, s.result),
                Completion::Recv(r) => (k, r.ctx, r.result.map(|_| ())),
            });
        }
        false
    });
    out
}

/// Node 0 sends node 1 a rendezvous message (match bits 5) nobody receives.
fn unreceived(sim: &mut TestSim) -> RequestId {
    transfer(sim, 0, 1, 10, 1);
    let now = sim.now();
    sim.core(0)
        .send(now, addr(1), 5, pattern(5, BIG), 50)
        .unwrap()
}

/// The type of frame `f` (as `take_frame` gives it).
fn frame_type(f: &[u8]) -> Option<FrameType> {
    FrameType::from_u8(f[emx::wire::ETH_HEADER_LEN + 1])
}

#[test]
fn an_unreceived_rendezvous_is_withdrawn() {
    let mut sim = make_sim(2, LinkConfig::default(), &CoreConfig::default());
    let s = unreceived(&mut sim);
    assert!(run(&mut sim, 100).is_empty());
    assert!(sim.core_ref(1).probe(None, 5, !0).is_some());
    assert!(sim.core(0).cancel(s), "withdrawal started");
    assert!(!sim.core(0).cancel(s), "once");
    assert_eq!(
        run(&mut sim, 100),
        vec![(0, 50, Err(RequestError::Cancelled))]
    );
    let rx = sim.core_ref(1);
    assert!(rx.probe(None, 5, !0).is_none(), "dropped at the receiver");
    assert_eq!(rx.unexpected_bytes(), 0, "its credit went back");
    assert_eq!(rx.stats().withdrawn, 1);
    assert!(sim.core_ref(0).owes_nothing() && sim.core_ref(1).owes_nothing());
    // The stream goes on: the next message with those bits is the one
    // a receive gets.
    transfer(&mut sim, 0, 1, BIG, 5);
}

/// A cancel asked before the RTS is acknowledged waits for the ack: a
/// WITHDRAW that overtook its RTS would find nothing to withdraw.
#[test]
fn a_cancel_before_the_rts_is_acknowledged_waits_for_it() {
    let mut sim = make_sim(2, LinkConfig::default(), &CoreConfig::default());
    let s = unreceived(&mut sim);
    assert!(sim.core(0).cancel(s), "asked before the RTS even left");
    let mut sent = Vec::new();
    while let Some(f) = take_frame(&mut sim, 0) {
        sent.push(frame_type(&f));
    }
    assert_eq!(sent, vec![Some(FrameType::Rts)], "no WITHDRAW yet");
    // (The RTS taken by hand never arrived: it goes again.)
    assert_eq!(
        run(&mut sim, 20_000),
        vec![(0, 50, Err(RequestError::Cancelled))]
    );
    assert_eq!(sim.core_ref(1).stats().withdrawn, 1);
    assert_eq!(sim.core_ref(1).unexpected_bytes(), 0);
}

/// A receive that takes the message before the WITHDRAW arrives keeps it:
/// it is pulled, and the send succeeds. A send that was pulled from is not
/// cancelled, nor is an eager one.
#[test]
fn a_message_received_first_is_not_withdrawn() {
    let mut sim = make_sim(2, LinkConfig::default(), &CoreConfig::default());
    let s = unreceived(&mut sim);
    assert!(run(&mut sim, 100).is_empty());
    let now = sim.now();
    sim.core(1)
        .post_recv(now, None, 5, !0, vec![0; BIG], 51)
        .unwrap();
    assert!(sim.core(0).cancel(s), "the receiver decides");
    let mut done = run(&mut sim, 5_000);
    done.sort_by_key(|d| (d.0, d.1));
    assert_eq!(done, vec![(0, 50, Ok(())), (1, 51, Ok(()))]);
    assert_eq!(sim.core_ref(1).stats().withdrawn, 0);
    // Pulled from already: too late.
    let now = sim.now();
    sim.core(1)
        .post_recv(now, None, 6, !0, vec![0; BIG], 61)
        .unwrap();
    let s = sim
        .core(0)
        .send(now, addr(1), 6, pattern(6, BIG), 60)
        .unwrap();
    // (1 MiB takes some 840 us at 10 Gbit/s: 100 us in, it is being pulled.)
    assert!(run(&mut sim, 100).is_empty());
    assert!(!sim.core(0).cancel(s));
    let mut done = run(&mut sim, 5_000);
    done.sort_by_key(|d| (d.0, d.1));
    assert_eq!(done, vec![(0, 60, Ok(())), (1, 61, Ok(()))]);
    // Eager: it is the receiver's once it left.
    let now = sim.now();
    let e = sim.core(0).send(now, addr(1), 7, vec![1; 100], 70).unwrap();
    assert!(!sim.core(0).cancel(e));
}

/// A message withdrawn while it waits for an earlier one (lost, to come
/// again) is passed by when its turn comes; the earlier one and the later
/// ones match as they should.
#[test]
fn a_message_withdrawn_behind_a_missing_one_is_passed_by() {
    let mut sim = make_sim(2, LinkConfig::default(), &CoreConfig::default());
    transfer(&mut sim, 0, 1, 10, 1);
    let now = sim.now();
    sim.core(0)
        .send(now, addr(1), 4, b"first".to_vec(), 40)
        .unwrap();
    let s = sim
        .core(0)
        .send(now, addr(1), 5, pattern(5, BIG), 50)
        .unwrap();
    // The first message's frame is lost; the RTS behind it arrives.
    let lost = take_frame(&mut sim, 0).unwrap();
    let rts = take_frame(&mut sim, 0).unwrap();
    assert_eq!(frame_type(&rts), Some(FrameType::Rts));
    assert_ne!(frame_type(&lost), Some(FrameType::Rts));
    sim.set_blocked(0, 1, true);
    sim.core(1).handle_frame(now, &rts).unwrap();
    assert!(
        sim.core_ref(1).probe(None, 5, !0).is_none(),
        "waiting for its turn"
    );
    // Node 1's ack reaches node 0, whose cancel sends the WITHDRAW at once.
    run(&mut sim, 50);
    assert!(sim.core(0).cancel(s));
    let withdraw = take_frame(&mut sim, 0).unwrap();
    assert_eq!(frame_type(&withdraw), Some(FrameType::Withdraw));
    let now = sim.now();
    let held = sim.core_ref(1).unexpected_bytes();
    sim.core(1).handle_frame(now, &withdraw).unwrap();
    assert_eq!(sim.core_ref(1).stats().withdrawn, 1);
    // Its charge stays until its turn comes: credits still bound the
    // envelopes that wait.
    assert_eq!(sim.core_ref(1).unexpected_bytes(), held);
    assert!(held > 0);
    assert_eq!(
        run(&mut sim, 100),
        vec![(0, 50, Err(RequestError::Cancelled))]
    );
    // The first message comes again; then the rest flows.
    sim.set_blocked(0, 1, false);
    let now = sim.now();
    sim.core(1)
        .post_recv(now, None, 0, 0, vec![0; BIG], 41)
        .unwrap();
    let mut done = run(&mut sim, 20_000);
    done.sort_by_key(|d| (d.0, d.1));
    assert_eq!(done, vec![(0, 40, Ok(())), (1, 41, Ok(()))]);
    assert!(sim.core_ref(1).probe(None, 0, 0).is_none(), "nothing else");
    assert_eq!(sim.core_ref(1).unexpected_bytes(), 0);
    transfer(&mut sim, 0, 1, BIG, 9);
}
