//! Matched probes (MPI's `Improbe` and `Imrecv`): a message taken out of the
//! unexpected queue by `mprobe` is matched by no receive, and `post_mrecv`
//! receives it, whole or while it is still arriving, eager or rendezvous;
//! its sender's failure reaches the receive posted for it.

mod common;

use common::*;
use emx::proto::{Completion, CoreConfig, PeerId, ProbeInfo, RecvError, RequestError};
use emx::sim::LinkConfig;
use std::time::Duration;

fn cfg() -> CoreConfig {
    CoreConfig {
        keepalive: Duration::from_millis(2),
        peer_timeout: Duration::from_millis(50),
        ..CoreConfig::default()
    }
}

/// Runs until node `k` has a completion (at most `ms`), and returns them all.
fn completions(sim: &mut TestSim, ms: u64) -> Vec<(usize, TestCompletion)> {
    let mut out = Vec::new();
    sim.run_until(sim.now() + Duration::from_millis(ms), |sim| {
        out.extend(drain(sim));
        false
    });
    out.extend(drain(sim));
    out
}

/// A short digest of `bytes` (what the tests compare, so that a failure
/// prints no megabyte).
fn digest(bytes: &[u8]) -> (usize, u64) {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (bytes.len(), h)
}

/// What a receive got: the digest of its bytes, or its error.
type Got = (usize, u64, Result<(usize, u64), RequestError>);

/// The receives among `c`: (node, ctx, what it got). Sends must have
/// succeeded.
fn received(c: Vec<(usize, TestCompletion)>) -> Vec<Got> {
    c.into_iter()
        .filter_map(|(k, c)| match c {
            Completion::Recv(r) => Some((
                k,
                r.ctx,
                r.result.map(|i| digest(&r.buf[..i.copied as usize])),
            )),
            Completion::Send(s) => {
                assert_eq!(s.result, Ok(()), "send {} of node {k}", s.ctx);
                None
            }
        })
        .collect()
}

/// The message a matched probe takes is no receive's any more: a receive
/// that would have matched it takes the next, `probe` shows the next, and
/// the handle receives it once.
#[test]
fn a_matched_probe_takes_its_message_from_every_receive() {
    let mut sim = make_sim(2, LinkConfig::default(), &cfg());
    let now = sim.now();
    for (ctx, data) in [(1, &b"first"[..]), (2, b"second")] {
        sim.core(0)
            .send(now, addr(1), 5, data.to_vec(), ctx)
            .unwrap();
    }
    assert!(received(completions(&mut sim, 1)).is_empty());
    let c = sim.core(1);
    assert!(c.mprobe(None, 6, !0).is_none(), "no such message");
    let (m, info) = c.mprobe(Some(addr(0)), 5, !0).expect("the first message");
    assert_eq!(
        info,
        ProbeInfo {
            src: addr(0),
            match_bits: 5,
            len: 5
        }
    );
    assert_eq!(c.probe(None, 5, !0).map(|p| p.len), Some(6), "the next one");
    let now = sim.now();
    sim.core(1)
        .post_recv(now, None, 5, !0, vec![0; 16], 10)
        .unwrap();
    assert_eq!(
        received(drain(&mut sim)),
        vec![(1, 10, Ok(digest(b"second")))]
    );
    sim.core(1).post_mrecv(now, m, vec![0; 3], 11).unwrap();
    match &drain(&mut sim)[..] {
        [(1, Completion::Recv(r))] => {
            let info = r.result.unwrap();
            assert_eq!((r.ctx, &r.buf[..], info.msg_len), (11, &b"fir"[..], 5));
            assert!(info.truncated);
        }
        other => panic!("unexpected completions {other:?}"),
    }
    let again = sim.core(1).post_mrecv(now, m, vec![0; 8], 12).unwrap_err();
    assert_eq!(again.error, RecvError::UnknownMessage);
    assert_eq!(again.buf, vec![0; 8], "the buffer comes back");
    assert!(sim.core(1).mprobe(None, 5, !0).is_none());
    // The claimed message's credit went back: the stream goes on.
    transfer(&mut sim, 0, 1, 20_000, 7);
}

/// A rendezvous message claimed is pulled only once its receive is posted,
/// and then completes both sides.
#[test]
fn a_claimed_rendezvous_is_pulled_by_its_receive() {
    let mut sim = make_sim(2, LinkConfig::default(), &cfg());
    let now = sim.now();
    let data = pattern(3, 1 << 20);
    sim.core(0).send(now, addr(1), 3, data.clone(), 3).unwrap();
    assert!(completions(&mut sim, 1).is_empty());
    let (m, info) = sim.core(1).mprobe(None, 0, 0).expect("its RTS came");
    assert_eq!(info.len, 1 << 20);
    assert!(completions(&mut sim, 2).is_empty(), "nothing pulled yet");
    let now = sim.now();
    sim.core(1)
        .post_mrecv(now, m, vec![0; 1 << 20], 30)
        .unwrap();
    let got = completions(&mut sim, 5);
    assert!(
        got.iter()
            .any(|(k, c)| *k == 0 && matches!(c, Completion::Send(s) if s.ctx == 3)),
        "the send completed: {got:?}"
    );
    assert_eq!(received(got), vec![(1, 30, Ok(digest(&data)))]);
}

/// Runs until node 1 sees the first fragments of a message that spans
/// frames, and claims it while the rest are on their way.
fn claim_while_arriving(sim: &mut TestSim, data: &[u8]) -> emx::proto::MessageId {
    let now = sim.now();
    sim.core(0).send(now, addr(1), 8, data.to_vec(), 8).unwrap();
    let seen = sim.run_until(now + Duration::from_millis(1), |sim| {
        sim.core_ref(1).probe(None, 8, !0).is_some()
    });
    assert!(seen, "its first fragment came");
    let (m, info) = sim.core(1).mprobe(None, 8, !0).unwrap();
    assert_eq!(info.len, data.len() as u64);
    m
}

/// An eager message claimed while it arrives: fragments that come after its
/// receive is posted go to the receive, those before it through the store.
#[test]
fn a_message_claimed_while_arriving_completes_on_its_receive() {
    let mut sim = make_sim(2, LinkConfig::default(), &cfg());
    let data = pattern(8, 30_000);
    // Received at once: most of it lands in the buffer directly.
    let m = claim_while_arriving(&mut sim, &data);
    let now = sim.now();
    sim.core(1).post_mrecv(now, m, vec![0; 30_000], 80).unwrap();
    assert_eq!(
        received(completions(&mut sim, 1)),
        vec![(1, 80, Ok(digest(&data)))]
    );
    // Received once it has all come: all of it through the store.
    let m = claim_while_arriving(&mut sim, &data);
    assert!(received(completions(&mut sim, 1)).is_empty());
    let now = sim.now();
    sim.core(1).post_mrecv(now, m, vec![0; 30_000], 81).unwrap();
    assert_eq!(received(drain(&mut sim)), vec![(1, 81, Ok(digest(&data)))]);
}

/// Node 0 restarts; node 1 learns it from the new incarnation's first
/// frame, and the old session ends.
fn restart_node_0(sim: &mut TestSim) {
    let now = sim.now();
    sim.replace_core(0, make_core(&cfg(), 0, 2, 2, now));
    transfer(sim, 0, 1, 10, 90);
}

/// A claimed message that its sender's session ended before it came whole
/// (a rendezvous, or an eager message with fragments missing) fails the
/// receive posted for it with that end; one that came whole is received.
/// Either way the next session streams at full credit once they are taken.
#[test]
fn a_claimed_message_outlives_its_session_only_if_it_came_whole() {
    let mut sim = make_sim(2, LinkConfig::default(), &cfg());
    transfer(&mut sim, 0, 1, 10, 1);
    let now = sim.now();
    sim.core(0)
        .send(now, addr(1), 2, b"whole".to_vec(), 2)
        .unwrap();
    sim.core(0)
        .send(now, addr(1), 3, pattern(3, 1 << 20), 3)
        .unwrap();
    completions(&mut sim, 1);
    let (whole, _) = sim.core(1).mprobe(None, 2, !0).unwrap();
    let (rndv, _) = sim.core(1).mprobe(None, 3, !0).unwrap();
    // An eager message cut short: only its first frame reaches node 1
    // before node 0 restarts.
    let now = sim.now();
    sim.core(0)
        .send(now, addr(1), 8, pattern(8, 30_000), 8)
        .unwrap();
    let first = take_frame(&mut sim, 0).expect("its first frame");
    sim.core(1).handle_frame(now, &first).unwrap();
    let (partial, info) = sim.core(1).mprobe(None, 8, !0).expect("it started");
    assert_eq!(info.len, 30_000);
    restart_node_0(&mut sim);
    assert_eq!(
        sim.core_ref(1).peer_info(PeerId(0)).unwrap().epoch,
        2,
        "node 1 knows the new incarnation"
    );
    let now = sim.now();
    for (m, ctx) in [(whole, 20), (rndv, 30), (partial, 80)] {
        sim.core(1)
            .post_mrecv(now, m, vec![0; 1 << 20], ctx)
            .unwrap();
    }
    assert_eq!(
        received(drain(&mut sim)),
        vec![
            (1, 20, Ok(digest(b"whole"))),
            (1, 30, Err(RequestError::PeerRestarted)),
            (1, 80, Err(RequestError::PeerRestarted)),
        ]
    );
    assert_eq!(sim.core_ref(1).unexpected_bytes(), 0, "nothing held");
    transfer(&mut sim, 0, 1, 30_000, 4);
    transfer(&mut sim, 0, 1, 200_000, 5);
}

/// Handles are checked: a claim's handle does not receive a later message
/// that reuses its envelope, and a closing core claims nothing.
#[test]
fn a_spent_handle_names_no_later_message() {
    let mut sim = make_sim(2, LinkConfig::default(), &cfg());
    let now = sim.now();
    sim.core(0).send(now, addr(1), 1, b"a".to_vec(), 1).unwrap();
    completions(&mut sim, 1);
    let (m, _) = sim.core(1).mprobe(None, 1, !0).unwrap();
    let now = sim.now();
    sim.core(1).post_mrecv(now, m, vec![0; 1], 10).unwrap();
    sim.core(0).send(now, addr(1), 1, b"b".to_vec(), 2).unwrap();
    let mut got = received(completions(&mut sim, 1));
    let (m2, _) = sim.core(1).mprobe(None, 1, !0).unwrap();
    assert_ne!(m, m2);
    let now = sim.now();
    let refused = sim.core(1).post_mrecv(now, m, vec![0; 1], 11).unwrap_err();
    assert_eq!(refused.error, RecvError::UnknownMessage);
    sim.core(1).post_mrecv(now, m2, vec![0; 1], 12).unwrap();
    got.extend(received(drain(&mut sim)));
    assert_eq!(
        got,
        vec![(1, 10, Ok(digest(b"a"))), (1, 12, Ok(digest(b"b")))]
    );
    // Closing: nothing is claimed that no receive could take.
    sim.core(0).send(now, addr(1), 1, b"c".to_vec(), 3).unwrap();
    completions(&mut sim, 1);
    let now = sim.now();
    sim.core(1).begin_close(now);
    assert!(sim.core(1).mprobe(None, 1, !0).is_none());
    assert!(sim.core(1).probe(None, 1, !0).is_some());
}
