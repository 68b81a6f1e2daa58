//! Session lifecycle: restart (new epoch) mid-transfer, a peer that vanishes, a peer that
//! is idle but alive.

mod common;

use common::*;
use emx::proto::{
    Completion, Core, CoreConfig, DropReason, MacAddr, PeerId, RecvError, RequestError, SendError,
    Time,
};
use emx::sim::LinkConfig;
use std::time::Duration;

fn cfg() -> CoreConfig {
    CoreConfig {
        keepalive: Duration::from_millis(2),
        peer_timeout: Duration::from_millis(50),
        ..CoreConfig::default()
    }
}

/// Runs until `n` requests finished (by `deadline`): (node, ctx, error), sorted.
fn outcomes(
    sim: &mut TestSim,
    n: usize,
    deadline: emx::proto::Time,
) -> Vec<(usize, u64, Option<RequestError>)> {
    let mut done = Vec::new();
    let ok = sim.run_until(deadline, |sim| {
        for (k, c) in drain(sim) {
            match c {
                Completion::Send(s) => done.push((k, s.ctx, s.result.err())),
                Completion::Recv(r) => done.push((k, r.ctx, r.result.err())),
            }
        }
        done.len() >= n
    });
    assert!(ok, "only {done:?} of {n} requests finished");
    done.sort_by_key(|f| (f.0, f.1));
    done
}

#[test]
fn receiver_restarts_mid_transfer() {
    let cfg = cfg();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    transfer(&mut sim, 0, 1, 1000, 1);
    let now = sim.now();
    sim.core(1)
        .post_recv(now, Some(addr(0)), 7, !0, vec![0; 8 << 20], 70)
        .unwrap();
    sim.core(0)
        .send(now, addr(1), 7, pattern(7, 8 << 20), 7)
        .unwrap();
    // Part of the way in, node 1 restarts: same address and MAC, a higher epoch.
    sim.run_until(now + Duration::from_micros(300), |_| false);
    assert!(drain(&mut sim).is_empty(), "nothing finished yet");
    let now = sim.now();
    let old = sim.replace_core(1, make_core(&cfg, 1, 2, 2, now));
    drop(old);
    let mut failed = Vec::new();
    let ok = sim.run_until(now + Duration::from_millis(20), |sim| {
        for (k, c) in drain(sim) {
            match c {
                Completion::Send(s) => failed.push((k, s.ctx, s.result)),
                Completion::Recv(r) => panic!("unexpected receive {:?}", r.result),
            }
        }
        failed.len() == 1
    });
    assert!(ok, "old send did not fail: {failed:?}");
    for (k, _, r) in &failed {
        assert_eq!((*k, *r), (0, Err(RequestError::PeerRestarted)));
    }
    let info = sim.core_ref(0).peer_info(PeerId(0)).unwrap();
    assert_eq!(info.epoch, 2);
    assert!(
        sim.core_ref(1)
            .peer_stats(PeerId(0))
            .unwrap()
            .dropped
            .get(DropReason::StaleEpoch)
            > 0,
        "old-session frames were refused"
    );
    // The new session works both ways.
    transfer(&mut sim, 0, 1, 300_000, 9);
    transfer(&mut sim, 1, 0, 20, 10);
    transfer(&mut sim, 0, 1, 0, 11);
}

#[test]
fn sender_restarts_mid_rendezvous() {
    let cfg = cfg();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    let now = sim.now();
    sim.core(1)
        .post_recv(now, Some(addr(0)), 7, !0, vec![0; 4 << 20], 70)
        .unwrap();
    // A posted receive that the old session never satisfies: it stays for the new one.
    sim.core(1)
        .post_recv(now, Some(addr(0)), 99, !0, vec![0; 5], 99)
        .unwrap();
    sim.core(0)
        .send(now, addr(1), 7, pattern(7, 4 << 20), 7)
        .unwrap();
    sim.run_until(now + Duration::from_micros(300), |_| false);
    let now = sim.now();
    sim.replace_core(0, make_core(&cfg, 0, 2, 5, now));
    // The new incarnation only talks later; the receiver's pulls reach it first.
    let mut got = None;
    sim.run_until(now + Duration::from_millis(20), |sim| {
        for (k, c) in drain(sim) {
            match c {
                Completion::Recv(r) => got = Some((k, r.ctx, r.result.map(|_| ()))),
                Completion::Send(_) => panic!("no send is outstanding"),
            }
        }
        got.is_some()
    });
    assert_eq!(got, Some((1, 70, Err(RequestError::PeerRestarted))));
    let now = sim.now();
    sim.core(0)
        .send(now, addr(1), 99, b"fresh".to_vec(), 1)
        .unwrap();
    let mut n = 0;
    sim.run_until(now + Duration::from_millis(20), |sim| {
        for (_, c) in drain(sim) {
            match c {
                Completion::Recv(r) => {
                    assert_eq!(r.ctx, 99);
                    assert_eq!(r.buf, b"fresh");
                }
                Completion::Send(s) => s.result.unwrap(),
            }
            n += 1;
        }
        n == 2
    });
    assert_eq!(n, 2);
}

#[test]
fn vanished_peer_is_declared_unreachable() {
    let cfg = cfg();
    let mut sim = make_sim(3, LinkConfig::default(), &cfg);
    transfer(&mut sim, 0, 1, 10, 1);
    let now = sim.now();
    sim.core(0)
        .send(now, addr(1), 5, pattern(5, 2 << 20), 5)
        .unwrap();
    sim.core(0)
        .post_recv(now, Some(addr(1)), 6, !0, vec![0; 10], 6)
        .unwrap();
    sim.core(0)
        .post_recv(now, None, 7, !0, vec![0; 10], 7)
        .unwrap();
    sim.run_until(now + Duration::from_micros(100), |_| false);
    let gone_at = sim.now();
    sim.set_up(1, false);
    let failed = outcomes(&mut sim, 2, gone_at + Duration::from_secs(5));
    assert_eq!(
        failed,
        vec![
            (0, 5, Some(RequestError::PeerUnreachable)),
            (0, 6, Some(RequestError::PeerUnreachable))
        ]
    );
    // Declared within the deadline (plus the probe that noticed it).
    let took = sim.now() - gone_at;
    assert!(
        took <= cfg.peer_timeout + cfg.keepalive + Duration::from_millis(1),
        "took {took:?}"
    );
    assert!(sim.core_ref(0).peer_info(PeerId(0)).unwrap().dead);
    // New requests naming it are refused at once; the rest of the cluster still works.
    let now = sim.now();
    let e = sim.core(0).send(now, addr(1), 1, vec![], 0).unwrap_err();
    assert_eq!(e.error, SendError::PeerUnreachable);
    let e = sim
        .core(0)
        .post_recv(now, Some(addr(1)), 1, !0, vec![], 0)
        .unwrap_err();
    assert_eq!(e.error, RecvError::PeerUnreachable);
    sim.core(2)
        .send(now, addr(0), 7, b"hello".to_vec(), 0)
        .unwrap();
    let mut n = 0;
    sim.run_until(now + Duration::from_millis(10), |sim| {
        n += drain(sim).len();
        n == 2
    });
    assert_eq!(n, 2, "any-source receive was served by another peer");
    // Nothing keeps running: no timer is left for the dead peer.
    sim.run_until(sim.now() + Duration::from_secs(1), |_| false);
    assert_eq!(sim.next_event(), None);
    // It comes back with a new epoch: the session starts over.
    let now = sim.now();
    sim.replace_core(1, make_core(&cfg, 1, 3, 9, now));
    sim.set_up(1, true);
    sim.core(1)
        .send(now, addr(0), 3, b"back".to_vec(), 0)
        .unwrap();
    let mut sent = false;
    sim.run_until(now + Duration::from_millis(10), |sim| {
        sent |= !drain(sim).is_empty();
        sent
    });
    assert!(sent, "the first message of the new session was delivered");
    let info = sim.core_ref(0).peer_info(PeerId(0)).unwrap();
    assert!(!info.dead && info.epoch == 9);
    assert_eq!(
        sim.core(0).probe(Some(addr(1)), 3, !0).map(|p| p.len),
        Some(4)
    );
    transfer(&mut sim, 1, 0, 5000, 4);
    transfer(&mut sim, 0, 1, 50_000, 5);
}

#[test]
fn idle_but_alive_peer_is_kept() {
    let cfg = cfg();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    let now = sim.now();
    sim.core(0)
        .post_recv(now, Some(addr(1)), 1, !0, vec![0; 4], 1)
        .unwrap();
    // The sender stays quiet for ten deadlines; keepalives prove it alive.
    let later = now + cfg.peer_timeout * 10;
    sim.run_until(later, |sim| {
        assert!(drain(sim).is_empty());
        false
    });
    assert!(
        sim.core_ref(0)
            .peer_stats(PeerId(0))
            .unwrap()
            .keepalives_sent
            > 0
    );
    let now = sim.now();
    sim.core(1)
        .send(now, addr(0), 1, b"late".to_vec(), 0)
        .unwrap();
    let mut n = 0;
    sim.run_until(now + Duration::from_millis(10), |sim| {
        for (_, c) in drain(sim) {
            if let Completion::Recv(r) = c {
                assert_eq!(r.buf, b"late");
            }
            n += 1;
        }
        n == 2
    });
    assert_eq!(n, 2);
}

#[test]
fn one_way_link_fails_the_sender_in_time() {
    let cfg = cfg();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    transfer(&mut sim, 0, 1, 10, 1);
    // Node 1 streams to node 0, which hears it; node 0's frames no longer reach node 1.
    let now = sim.now();
    for k in 0..200u64 {
        sim.core(1)
            .send(now, addr(0), 100 + k, vec![k as u8; 5000], k)
            .unwrap();
    }
    sim.core(0)
        .send(now, addr(1), 5, pattern(5, 100_000), 5)
        .unwrap();
    sim.set_blocked(0, 1, true);
    let mut failed_at = None;
    let ok = sim.run_until(now + Duration::from_secs(2), |sim| {
        for (k, c) in drain(sim) {
            if let (0, Completion::Send(s)) = (k, c) {
                assert_eq!(s.result, Err(RequestError::PeerUnreachable));
                failed_at = Some(sim.now());
            }
        }
        failed_at.is_some()
    });
    assert!(ok, "the send on the broken direction never failed");
    let took = failed_at.unwrap() - now;
    assert!(
        took <= cfg.peer_timeout + Duration::from_millis(2),
        "took {took:?}"
    );
}

/// Runs until both nodes of a two-node sim see each other in session (or 1 s passes).
fn until_both_up(sim: &mut TestSim) -> bool {
    let deadline = sim.now() + Duration::from_secs(1);
    sim.run_until(deadline, |sim| {
        (0..2).all(|k| {
            let i = sim.core_ref(k).peer_info(PeerId(0)).unwrap();
            !i.dead && i.epoch != 0
        })
    })
}

#[test]
fn partition_where_both_sides_gave_up_heals_on_reconnect() {
    let cfg = cfg();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    transfer(&mut sim, 0, 1, 1000, 1);
    transfer(&mut sim, 1, 0, 1000, 2);
    let (e0, e1) = (sim.core_ref(0).epoch(), sim.core_ref(1).epoch());
    // Each waits on the other; then the link breaks both ways.
    let now = sim.now();
    for k in 0..2 {
        sim.core(k)
            .post_recv(now, Some(addr(1 - k)), 9, !0, vec![0; 8], 90)
            .unwrap();
    }
    sim.core(0)
        .send(now, addr(1), 5, pattern(5, 100_000), 5)
        .unwrap();
    sim.set_blocked(0, 1, true);
    sim.set_blocked(1, 0, true);
    let failed = outcomes(&mut sim, 3, now + Duration::from_secs(2));
    assert_eq!(
        failed,
        vec![
            (0, 5, Some(RequestError::PeerUnreachable)),
            (0, 90, Some(RequestError::PeerUnreachable)),
            (1, 90, Some(RequestError::PeerUnreachable)),
        ]
    );
    // The link heals, but each side has given the other up: nothing moves.
    sim.set_blocked(0, 1, false);
    sim.set_blocked(1, 0, false);
    sim.run_until(sim.now() + Duration::from_secs(1), |_| false);
    assert_eq!(sim.next_event(), None);
    for k in 0..2 {
        assert!(sim.core_ref(k).peer_info(PeerId(0)).unwrap().dead);
    }
    // One side tries again: both start a new session, whose epochs are new to the
    // other side (each moved its own on when it gave the other up).
    let now = sim.now();
    assert!(sim.core(0).reconnect(now, PeerId(0)));
    assert!(!sim.core(0).reconnect(now, PeerId(0)), "only a dead peer");
    sim.core(0)
        .post_recv(now, Some(addr(1)), 99, !0, vec![0; 8], 91)
        .unwrap();
    assert!(until_both_up(&mut sim), "the sessions did not come back");
    assert_eq!(
        sim.core_ref(0).peer_info(PeerId(0)).unwrap().epoch,
        e1.wrapping_add(1)
    );
    assert_eq!(
        sim.core_ref(1).peer_info(PeerId(0)).unwrap().epoch,
        e0.wrapping_add(1)
    );
    transfer(&mut sim, 1, 0, 50_000, 9);
    transfer(&mut sim, 0, 1, 50_000, 3);
    transfer(&mut sim, 1, 0, 10, 4);
}

/// Node 0 waits on node 1 and no longer hears it (node 1 still hears node
/// 0, but waits on nothing, so it does not give node 0 up), until node 0
/// declares node 1 unreachable.
fn node_0_gives_node_1_up(sim: &mut TestSim) -> Vec<(usize, TestCompletion)> {
    let now = sim.now();
    sim.core(0)
        .post_recv(now, Some(addr(1)), 9, !0, vec![0; 8], 90)
        .unwrap();
    sim.set_blocked(1, 0, true);
    let mut done = Vec::new();
    sim.run_until(now + Duration::from_secs(1), |sim| {
        done.extend(drain(sim));
        sim.core_ref(0).peer_info(PeerId(0)).unwrap().dead
    });
    assert!(sim.core_ref(0).peer_info(PeerId(0)).unwrap().dead);
    done.extend(drain(sim));
    done
}

#[test]
fn peer_given_up_one_sided_comes_back_when_it_speaks() {
    let cfg = cfg();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    transfer(&mut sim, 0, 1, 1000, 1);
    node_0_gives_node_1_up(&mut sim);
    assert!(!sim.core_ref(1).peer_info(PeerId(0)).unwrap().dead);
    sim.set_blocked(1, 0, false);
    // Node 1 sends in its old session: node 0 refuses it and answers with its new
    // epoch, so node 1's send fails as if node 0 had restarted, and the new session
    // starts on both sides.
    let now = sim.now();
    sim.core(1)
        .send(now, addr(0), 6, b"old".to_vec(), 6)
        .unwrap();
    let mut got = Vec::new();
    let ok = sim.run_until(now + Duration::from_millis(100), |sim| {
        got.extend(drain(sim));
        !got.is_empty()
    });
    assert!(ok, "the old session's send did not finish");
    match &got[..] {
        [(1, Completion::Send(s))] => assert_eq!(s.result, Err(RequestError::PeerRestarted)),
        other => panic!("unexpected completions {other:?}"),
    }
    assert!(
        sim.core_ref(0)
            .peer_stats(PeerId(0))
            .unwrap()
            .dropped
            .get(DropReason::DeadPeer)
            > 0
    );
    assert!(until_both_up(&mut sim), "the sessions did not come back");
    transfer(&mut sim, 1, 0, 5000, 7);
    transfer(&mut sim, 0, 1, 5000, 8);
}

/// Node 1 sends node 0 "kept" (match bits 3), which waits unexpected, and
/// node 0 then gives node 1 up.
fn kept_from_a_dead_peer() -> TestSim {
    let mut sim = make_sim(2, LinkConfig::default(), &cfg());
    transfer(&mut sim, 0, 1, 1000, 1);
    let now = sim.now();
    sim.core(1)
        .send(now, addr(0), 3, b"kept".to_vec(), 3)
        .unwrap();
    sim.run_until(now + Duration::from_millis(1), |_| false);
    assert!(drain(&mut sim).iter().any(|(k, _)| *k == 1), "acknowledged");
    node_0_gives_node_1_up(&mut sim);
    sim
}

/// A complete message kept from a peer that was then declared unreachable is
/// still delivered, to an any-source receive, but taking it does not speak to
/// that peer: its session is over, and only `reconnect` (or the peer speaking
/// first) starts another. Binding it used to engage the peer like a live one,
/// which sent a HELLO and revived it behind the application's back.
#[test]
fn a_message_kept_from_a_dead_peer_does_not_revive_it() {
    let mut sim = kept_from_a_dead_peer();
    sim.set_blocked(1, 0, false);
    let sent_before = sim.core_ref(0).peer_stats(PeerId(0)).unwrap().frames_sent;
    let now = sim.now();
    sim.core(0)
        .post_recv(now, None, 3, !0, vec![0; 8], 30)
        .unwrap();
    let got = drain(&mut sim);
    match &got[..] {
        [(0, Completion::Recv(r))] => {
            let info = r.result.unwrap();
            assert_eq!(
                (info.src, &r.buf[..info.copied as usize]),
                (addr(1), &b"kept"[..])
            );
        }
        other => panic!("unexpected completions {other:?}"),
    }
    sim.run_until(now + Duration::from_millis(100), |_| false);
    assert!(
        sim.core_ref(0).peer_info(PeerId(0)).unwrap().dead,
        "taking the message revived the peer"
    );
    assert_eq!(
        sim.core_ref(0).peer_stats(PeerId(0)).unwrap().frames_sent,
        sent_before,
        "a frame went to the dead peer"
    );
    // `reconnect` still brings it back.
    let now = sim.now();
    assert!(sim.core(0).reconnect(now, PeerId(0)));
    assert!(until_both_up(&mut sim), "the sessions did not come back");
    transfer(&mut sim, 0, 1, 5000, 8);
}

/// What `probe` shows from a peer declared unreachable, a receive naming
/// that peer takes: the message kept whole from it. Such a receive used to
/// be refused with `PeerUnreachable`, so the message could be reached only
/// from any source. A receive naming it that would take nothing is still
/// refused (it could never finish), and taking the message sends the peer
/// nothing.
#[test]
fn a_receive_naming_a_dead_peer_takes_what_it_sent_before() {
    let mut sim = kept_from_a_dead_peer();
    let sent_before = sim.core_ref(0).peer_stats(PeerId(0)).unwrap().frames_sent;
    let now = sim.now();
    let probed = sim
        .core(0)
        .probe(Some(addr(1)), 3, !0)
        .expect("probe shows it");
    assert_eq!(probed.len, 4);
    let refused = sim
        .core(0)
        .post_recv(now, Some(addr(1)), 4, !0, vec![0; 8], 40)
        .unwrap_err();
    assert_eq!(refused.error, RecvError::PeerUnreachable);
    sim.core(0)
        .post_recv(now, Some(addr(1)), 3, !0, vec![0; 8], 30)
        .expect("the receive takes what probe showed");
    match &drain(&mut sim)[..] {
        [(0, Completion::Recv(r))] => {
            let info = r.result.unwrap();
            assert_eq!(
                (r.ctx, info.src, &r.buf[..info.copied as usize]),
                (30, addr(1), &b"kept"[..])
            );
        }
        other => panic!("unexpected completions {other:?}"),
    }
    assert!(sim.core(0).probe(Some(addr(1)), 3, !0).is_none());
    sim.run_until(now + Duration::from_millis(100), |_| false);
    assert!(sim.core_ref(0).peer_info(PeerId(0)).unwrap().dead);
    // Its credit back owes the dead peer no acknowledgement (one owed for
    // ever kept a closing endpoint lingering its whole second).
    assert!(
        sim.core_ref(0).owes_nothing(),
        "an acknowledgement owed to a dead peer"
    );
    assert_eq!(
        sim.core_ref(0).peer_stats(PeerId(0)).unwrap().frames_sent,
        sent_before,
        "a frame went to the dead peer"
    );
}

/// A frame of a peer's earlier incarnation that comes after the peer
/// restarted, and after a silence past the liveness deadline (a switch
/// buffer, a replay), is refused: it knows this node's epoch, so it is no
/// fresh incarnation's. It used to be taken for another restart: the live
/// session was reset (its requests failed) and its message delivered.
#[test]
fn a_late_frame_of_an_earlier_incarnation_is_refused_after_a_silence() {
    let cfg = cfg();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    transfer(&mut sim, 1, 0, 1000, 1);
    // A message of node 1's first incarnation, kept off the link.
    let now = sim.now();
    sim.core(1)
        .send(now, addr(0), 5, b"stale".to_vec(), 5)
        .unwrap();
    let stale = take_frame(&mut sim, 1).expect("node 1's EAGER frame");
    // Node 1 restarts (a later epoch); the sessions come back.
    sim.replace_core(1, make_core(&cfg, 1, 2, 2, now));
    transfer(&mut sim, 1, 0, 1000, 2);
    transfer(&mut sim, 0, 1, 1000, 3);
    // Silence, longer than the liveness deadline, with nothing under way.
    let now = sim.now();
    sim.run_until(now + cfg.peer_timeout * 3, |_| false);
    let now = sim.now();
    sim.core(0)
        .post_recv(now, None, 5, !0, vec![0; 16], 50)
        .unwrap();
    // A request under way in the live session, which a reset would fail.
    sim.core(0)
        .post_recv(now, Some(addr(1)), 6, !0, vec![0; 16], 60)
        .unwrap();
    assert_eq!(
        sim.core(0).handle_frame(now, &stale),
        Err(DropReason::StaleEpoch)
    );
    assert!(
        drain(&mut sim).is_empty(),
        "the stale frame completed something"
    );
    assert_eq!(sim.core_ref(0).peer_info(PeerId(0)).unwrap().epoch, 2);
    // The live session goes on.
    let now = sim.now();
    sim.core(1)
        .send(now, addr(0), 6, b"fresh".to_vec(), 6)
        .unwrap();
    let got = outcomes(&mut sim, 2, now + Duration::from_millis(20));
    assert_eq!(got, vec![(0, 60, None), (1, 6, None)]);
}

/// The other side of the rule above: a peer that restarts with an epoch
/// that reads as earlier (epochs wrap) is taken up after a silence past the
/// liveness deadline, from its first frame, which does not know this node's
/// epoch yet.
#[test]
fn a_restart_with_an_earlier_epoch_is_taken_after_a_silence() {
    let cfg = cfg();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    let now = sim.now();
    sim.replace_core(1, make_core(&cfg, 1, 2, 1000, now));
    transfer(&mut sim, 1, 0, 1000, 1);
    assert_eq!(sim.core_ref(0).peer_info(PeerId(0)).unwrap().epoch, 1000);
    let now = sim.now();
    sim.replace_core(1, make_core(&cfg, 1, 2, 900, now));
    sim.run_until(now + cfg.peer_timeout * 3, |_| false);
    transfer(&mut sim, 1, 0, 1000, 2);
    transfer(&mut sim, 0, 1, 1000, 3);
    assert_eq!(sim.core_ref(0).peer_info(PeerId(0)).unwrap().epoch, 900);
}

/// A message that arrived whole behind a lost one was acknowledged, and its
/// send completed: when its peer is then declared unreachable before the
/// lost one came again, the message is kept, as those kept unexpected are. A
/// receive already posted for it takes it, and one more waits for `probe`
/// and a receive. Such messages were dropped with the session, while their
/// senders had been told they were delivered.
#[test]
fn messages_acknowledged_behind_a_lost_one_are_kept_when_their_peer_is_given_up() {
    let mut sim = make_sim(2, LinkConfig::default(), &cfg());
    transfer(&mut sim, 0, 1, 1000, 1);
    let now = sim.now();
    // Taken by any-source receives, so that giving up on node 1 (which
    // fails receives naming it) leaves this one to take its message.
    sim.core(0)
        .post_recv(now, None, 3, !0, vec![0; 8], 30)
        .unwrap();
    sim.core(1)
        .send(now, addr(0), 2, b"lost".to_vec(), 2)
        .unwrap();
    let lost = take_frame(&mut sim, 1).expect("the first message's frame");
    assert!(!lost.is_empty());
    for (tag, data) in [(3, &b"second"[..]), (4, b"third")] {
        sim.core(1)
            .send(now, addr(0), tag, data.to_vec(), tag)
            .unwrap();
    }
    // Both acknowledged (selectively) before the lost one's timeout.
    let mut sent = Vec::new();
    sim.run_until(now + Duration::from_micros(500), |sim| {
        for (k, c) in drain(sim) {
            match (k, c) {
                (1, Completion::Send(s)) => {
                    s.result.unwrap();
                    sent.push(s.ctx);
                }
                other => panic!("unexpected completion {other:?}"),
            }
        }
        sent.len() == 2
    });
    assert_eq!(sent, [3, 4], "acknowledged behind the lost one");
    // Node 0 gives node 1 up (a receive naming it, and a link that stays
    // cut from node 1) before the lost frame comes again.
    let got = node_0_gives_node_1_up(&mut sim);
    let mut recvs: Vec<_> = got
        .into_iter()
        .filter(|(k, _)| *k == 0)
        .map(|(_, c)| match c {
            Completion::Recv(r) => (r.ctx, r.result.map(|i| r.buf[..i.copied as usize].to_vec())),
            other => panic!("unexpected completion {other:?}"),
        })
        .collect();
    recvs.sort_by_key(|r| r.0);
    assert_eq!(
        recvs,
        [
            (30, Ok(b"second".to_vec())),
            (90, Err(RequestError::PeerUnreachable))
        ]
    );
    let kept = sim.core(0).probe(Some(addr(1)), 4, !0).expect("kept");
    assert_eq!(kept.len, 5);
    assert!(sim.core(0).probe(None, 2, !0).is_none(), "never arrived");
    let now = sim.now();
    sim.core(0)
        .post_recv(now, Some(addr(1)), 4, !0, vec![0; 8], 40)
        .unwrap();
    match &drain(&mut sim)[..] {
        [(0, Completion::Recv(r))] => {
            let info = r.result.unwrap();
            assert_eq!((r.ctx, &r.buf[..info.copied as usize]), (40, &b"third"[..]));
        }
        other => panic!("unexpected completions {other:?}"),
    }
    assert!(sim.core_ref(0).owes_nothing());
    assert_eq!(sim.core_ref(0).outstanding(), 0);
}

/// As above, for a peer whose address is learnt, and that comes back on
/// another one: its first frames teach its new address after the silence as
/// they teach its epoch. (The address was learnt only from a later epoch, so
/// such a peer was refused as not ours however long the silence, for good.)
#[test]
fn a_restart_on_a_new_address_with_an_earlier_epoch_is_taken_after_a_silence() {
    let cfg = cfg();
    let mut sim = node_1_learnt_at_epoch_1000(&cfg);
    let now = sim.now();
    let mut c1: TestCore = Core::new(cfg.clone(), addr(1), mac(5), 900, now).unwrap();
    c1.add_peer(addr(0), mac(0)).unwrap();
    sim.replace_core(1, c1);
    sim.run_until(now + cfg.peer_timeout * 3, |_| false);
    transfer(&mut sim, 1, 0, 1000, 2);
    transfer(&mut sim, 0, 1, 1000, 3);
    let info = sim.core_ref(0).peer_info(PeerId(0)).unwrap();
    assert_eq!(info.epoch, 900);
}

/// Node 0 knows node 1 without its MAC (to be learnt) and learns it, and
/// its epoch (1000), from a message node 1 sends.
fn node_1_learnt_at_epoch_1000(cfg: &CoreConfig) -> TestSim {
    let mut sim: TestSim = emx::sim::Sim::new(LinkConfig::default());
    let mut c0: TestCore = Core::new(cfg.clone(), addr(0), mac(0), 1, Time::ZERO).unwrap();
    c0.add_peer(addr(1), MacAddr::BROADCAST).unwrap();
    sim.add_core(c0);
    sim.add_core(make_core(cfg, 1, 2, 1000, Time::ZERO));
    transfer(&mut sim, 1, 0, 1000, 1);
    assert_eq!(sim.core_ref(0).peer_info(PeerId(0)).unwrap().epoch, 1000);
    sim
}

/// Messages kept behind a lost one, arrived in reverse order, are matched in
/// message-id order when their peer is given up: receives for any tag take
/// them as they were sent. (They are sorted once at the session's end; the
/// search for each next one it replaced was quadratic in them.)
#[test]
fn messages_kept_behind_a_lost_one_keep_their_order_whatever_order_they_came_in() {
    let mut sim = make_sim(2, LinkConfig::default(), &cfg());
    transfer(&mut sim, 0, 1, 1000, 1);
    let now = sim.now();
    sim.core(1)
        .send(now, addr(0), 2, b"lost".to_vec(), 2)
        .unwrap();
    assert!(take_frame(&mut sim, 1).is_some(), "the lost one's frame");
    let mut frames = Vec::new();
    for tag in 3..=8u64 {
        sim.core(1)
            .send(now, addr(0), tag, vec![tag as u8; 10], tag)
            .unwrap();
        frames.push(take_frame(&mut sim, 1).expect("its frame"));
    }
    for f in frames.iter().rev() {
        sim.core(0).handle_frame(now, f).expect("taken");
    }
    node_0_gives_node_1_up(&mut sim);
    let now = sim.now();
    for k in 0..6 {
        sim.core(0)
            .post_recv(now, Some(addr(1)), 0, 0, vec![0; 10], 100 + k)
            .unwrap();
    }
    let mut got = Vec::new();
    for (k, c) in drain(&mut sim) {
        if let (0, Completion::Recv(r)) = (k, c) {
            let info = r.result.unwrap();
            assert_eq!(r.buf, vec![info.match_bits as u8; 10]);
            got.push((r.ctx, info.match_bits));
        }
    }
    got.sort();
    assert_eq!(got, (0..6).map(|k| (100 + k, 3 + k)).collect::<Vec<_>>());
}

/// A message kept from a peer given up, taken after `reconnect` while the
/// peer has not answered (its session not started): giving its credit back
/// owes the peer no acknowledgement, which nothing could send before the
/// session starts (and the session's first frames carry the credit anyway).
/// One was owed for ever when the peer never answered, and an endpoint's
/// close lingered its whole second.
#[test]
fn a_kept_message_taken_before_a_reconnected_peer_answers_owes_it_nothing() {
    let mut sim = kept_from_a_dead_peer();
    // Node 0's greeting is lost, and node 1 stays silent.
    sim.set_blocked(0, 1, true);
    let now = sim.now();
    assert!(sim.core(0).reconnect(now, PeerId(0)));
    sim.core(0)
        .post_recv(now, None, 3, !0, vec![0; 8], 30)
        .unwrap();
    match &drain(&mut sim)[..] {
        [(0, Completion::Recv(r))] => assert_eq!(r.ctx, 30),
        other => panic!("unexpected completions {other:?}"),
    }
    sim.run_until(now + Duration::from_millis(100), |_| false);
    assert!(
        sim.core_ref(0).owes_nothing(),
        "an acknowledgement owed to a peer with no session"
    );
    // The session still comes up once the peer answers, and carries
    // messages both ways.
    sim.set_blocked(0, 1, false);
    sim.set_blocked(1, 0, false);
    transfer(&mut sim, 0, 1, 3000, 7);
    assert!(until_both_up(&mut sim), "the sessions did not come back");
    transfer(&mut sim, 1, 0, 3000, 8);
}

/// A receiver that posts first (its receive naming the sender greets it) and
/// a sender that sends once greeted: the first message goes at once. The
/// sender learnt the receiver's epoch from that greeting, but not its
/// credit (a frame that does not know our epoch acknowledges nothing), and
/// its answer asked for no acknowledgement: the message waited for a persist
/// probe, a retransmission timeout (1 ms) later.
#[test]
fn a_sender_greeted_first_sends_at_once() {
    let cfg = cfg();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    let now = sim.now();
    sim.core(0)
        .post_recv(now, Some(addr(1)), 5, !0, vec![0; 8], 50)
        .unwrap();
    // Core 1 hears the greeting (and answers it) within a few microseconds.
    sim.run_until(now + Duration::from_micros(50), |_| false);
    assert_ne!(sim.core_ref(1).peer_info(PeerId(0)).unwrap().epoch, 0);
    let sent = sim.now();
    sim.core(1)
        .send(sent, addr(0), 5, b"greeted".to_vec(), 5)
        .unwrap();
    let got = outcomes(&mut sim, 2, sent + Duration::from_millis(20));
    assert_eq!(got, vec![(0, 50, None), (1, 5, None)]);
    assert!(
        sim.now() - sent < Duration::from_micros(100),
        "took {:?}",
        sim.now() - sent
    );
}

/// A quiet peer whose address was learnt, probed once a `keepalive`, is
/// probed at its address: everyone is greeted (a broadcast HELLO) only once
/// a probe went unanswered. Every probe used to broadcast: on a quiet
/// cluster of auto-MAC nodes, a HELLO from each node for each peer to every
/// node, each `keepalive`.
#[test]
fn a_quiet_learnt_peer_is_probed_without_greeting_everyone() {
    let cfg = cfg();
    let mut sim: TestSim = emx::sim::Sim::new(LinkConfig::default());
    for i in 0..2 {
        let mut c: TestCore = Core::new(cfg.clone(), addr(i), mac(i), 1, Time::ZERO).unwrap();
        c.add_peer(addr(1 - i), MacAddr::BROADCAST).unwrap();
        sim.add_core(c);
    }
    transfer(&mut sim, 0, 1, 100, 1);
    // Both watch the other (a receive naming it), so both probe it.
    let now = sim.now();
    for i in 0..2 {
        sim.core(i)
            .post_recv(now, Some(addr(1 - i)), 9, !0, vec![0; 8], 9)
            .unwrap();
    }
    let hellos = |sim: &TestSim| -> u64 {
        (0..2)
            .map(|i| sim.core_ref(i).peer_stats(PeerId(0)).unwrap().hellos_sent)
            .sum()
    };
    let (before, probes) = (hellos(&sim), |sim: &TestSim| -> u64 {
        (0..2)
            .map(|i| {
                sim.core_ref(i)
                    .peer_stats(PeerId(0))
                    .unwrap()
                    .keepalives_sent
            })
            .sum()
    });
    let pings = probes(&sim);
    sim.run_until(now + cfg.keepalive * 20, |_| false);
    let (hellos, pings) = (hellos(&sim) - before, probes(&sim) - pings);
    assert!(pings >= 5, "{pings} probes");
    assert_eq!(hellos, 0, "{hellos} HELLOs for {pings} probes");
    assert!(!sim.core_ref(0).peer_info(PeerId(0)).unwrap().dead);
}

/// Both sides holding a stale epoch for the other (each moved its own on
/// when it gave the other up, and learnt the other's from a frame that the
/// other has since moved past) talk again within a few round trips. Each
/// used to answer the other's HELLO, refused for its stale destination
/// epoch, with a HELLO naming a stale one in turn: a HELLO each way every
/// round trip, for as long as neither watched the other. The state is made
/// here as it can come about: node 0 gives node 1 up and greets it again;
/// node 1 gives node 0 up; then node 0's first HELLO, held in the network
/// since the start, reaches node 1.
#[test]
fn two_stale_beliefs_do_not_greet_each_other_for_ever() {
    use emx::wire::{flags, FrameType};
    let cfg = cfg();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    let now = sim.now();
    // Node 0's first greeting (epoch 1, ours unknown), kept aside.
    sim.core(0)
        .post_recv(now, Some(addr(1)), 7, !0, vec![0; 8], 70)
        .unwrap();
    let first = take_frame(&mut sim, 0).expect("node 0's first HELLO");
    let old_hello = craft(&first, |h| {
        h.frame_type = FrameType::Hello;
        h.flags = flags::CSUM_HEADER;
        h.dst_epoch = 0;
        h.payload_len = 0;
    });
    transfer(&mut sim, 1, 0, 8, 7);
    // Node 0 gives node 1 up (its epoch for it moves on), then greets it
    // again: node 1 takes that for a restart, and both talk.
    node_0_gives_node_1_up(&mut sim);
    sim.set_blocked(1, 0, false);
    let now = sim.now();
    assert!(sim.core(0).reconnect(now, PeerId(0)));
    transfer(&mut sim, 0, 1, 8, 8);
    // Node 1 gives node 0 up (its epoch for it moves on).
    let now = sim.now();
    sim.core(1)
        .post_recv(now, Some(addr(0)), 9, !0, vec![0; 8], 90)
        .unwrap();
    sim.set_blocked(0, 1, true);
    sim.run_until(now + Duration::from_secs(1), |sim| {
        drain(sim);
        sim.core_ref(1).peer_info(PeerId(0)).unwrap().dead
    });
    assert!(sim.core_ref(1).peer_info(PeerId(0)).unwrap().dead);
    drain(&mut sim);
    // The held greeting reaches node 1, which takes node 0 back with that
    // stale epoch; node 0 still takes node 1 for the one it knew.
    let now = sim.now();
    let _ = sim.core(1).handle_frame(now, &old_hello);
    sim.set_blocked(0, 1, false);
    let hellos = |sim: &TestSim| -> u64 {
        (0..2)
            .map(|i| sim.core_ref(i).peer_stats(PeerId(0)).unwrap().hellos_sent)
            .sum()
    };
    let before = hellos(&sim);
    sim.run_until(now + Duration::from_millis(20), |sim| {
        drain(sim);
        false
    });
    let greeted = hellos(&sim) - before;
    assert!(greeted <= 6, "{greeted} HELLOs in 20 ms");
    transfer(&mut sim, 0, 1, 8, 10);
    transfer(&mut sim, 1, 0, 8, 11);
}

/// A peer given up and greeted again (`reconnect`) while it is still down,
/// that comes back at another address with a new epoch and says nothing:
/// the greetings repeated after the first (broadcast, lost) go to every
/// node once the peer has been silent a keepalive, and find it. They went
/// to the address learnt before, where nobody was, until the peer was given
/// up again.
#[test]
fn greetings_after_a_reconnect_find_a_peer_that_moved() {
    let cfg = cfg();
    let mut sim = node_1_learnt_at_epoch_1000(&cfg);
    // Node 1 goes down; node 0, waiting on it, gives it up.
    sim.set_up(1, false);
    let now = sim.now();
    sim.core(0)
        .post_recv(now, Some(addr(1)), 9, !0, vec![0; 8], 90)
        .unwrap();
    sim.run_until(now + cfg.peer_timeout * 3, |sim| {
        sim.core_ref(0).peer_info(PeerId(0)).unwrap().dead
    });
    assert!(sim.core_ref(0).peer_info(PeerId(0)).unwrap().dead);
    drain(&mut sim);
    // Greeted again while still down: the first, broadcast HELLO is lost.
    let now = sim.now();
    assert!(sim.core(0).reconnect(now, PeerId(0)));
    sim.core(0)
        .post_recv(now, Some(addr(1)), 9, !0, vec![0; 8], 91)
        .unwrap();
    sim.run_until(now + Duration::from_micros(200), |_| false);
    // Back at another MAC, with a new epoch, silent.
    let now = sim.now();
    let mut c1: TestCore = Core::new(cfg.clone(), addr(1), mac(5), 2000, now).unwrap();
    c1.add_peer(addr(0), mac(0)).unwrap();
    sim.replace_core(1, c1);
    sim.set_up(1, true);
    let learnt = sim.run_until(now + cfg.peer_timeout, |sim| {
        sim.core_ref(0).peer_info(PeerId(0)).unwrap().epoch == 2000
    });
    assert!(learnt, "{:?}", sim.core_ref(0).peer_info(PeerId(0)));
    assert!(!sim.core_ref(0).peer_info(PeerId(0)).unwrap().dead);
}

/// Requests to a peer whose epoch is not known yet greet it once: further
/// greetings come from its probe timer, which backs off. Each request used
/// to send a HELLO of its own (asking for an answer) as soon as the one
/// before had left: a loop of 100 sends to a peer that does not answer
/// sent 100.
#[test]
fn requests_to_an_unknown_peer_greet_it_once() {
    let cfg = cfg();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    sim.set_blocked(1, 0, true);
    for i in 0..100u64 {
        let now = sim.now();
        sim.core(0).send(now, addr(1), i, vec![1u8; 8], i).unwrap();
        sim.flush();
        sim.run_until(now + Duration::from_micros(10), |_| false);
    }
    let hellos = sim.core_ref(0).peer_stats(PeerId(0)).unwrap().hellos_sent;
    // 1 ms of sends: the first HELLO and the probe timer's (1 ms, then 2).
    assert!(hellos <= 3, "{hellos} HELLOs for 100 sends");
    sim.set_blocked(1, 0, false);
    let deadline = sim.now() + Duration::from_millis(100);
    let done = outcomes(&mut sim, 100, deadline);
    assert!(done.iter().all(|d| d.2.is_none()), "{done:?}");
}

/// A link cut for 32 ms under a frame, with a liveness deadline (50 ms)
/// below `rto_max` (100 ms): the backed-off retransmission timer stops at
/// a quarter of the deadline, so the frame goes again after the cut and
/// the send completes. The timer used to double to 32 ms, the next
/// retransmission came after the deadline, and the peer, answering every
/// probe meanwhile, was given up for making no progress.
#[test]
fn retransmissions_back_off_no_further_than_the_liveness_deadline_allows() {
    let cfg = cfg();
    assert!(cfg.rto_max > cfg.peer_timeout);
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    transfer(&mut sim, 0, 1, 1000, 1);
    sim.set_blocked(0, 1, true);
    sim.set_blocked(1, 0, true);
    let now = sim.now();
    sim.core(1)
        .post_recv(now, Some(addr(0)), 2, !0, vec![0; 8], 20)
        .unwrap();
    sim.core(0).send(now, addr(1), 2, vec![2u8; 8], 2).unwrap();
    sim.run_until(now + Duration::from_millis(32), |_| false);
    sim.set_blocked(0, 1, false);
    sim.set_blocked(1, 0, false);
    let done = outcomes(&mut sim, 2, now + Duration::from_millis(200));
    assert_eq!(done, vec![(0, 2, None), (1, 20, None)]);
}
