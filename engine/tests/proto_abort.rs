//! `Core::abort_all`: every outstanding request of the aborting core comes back exactly
//! once, with its buffer and `RequestError::Aborted`; its tables are empty afterwards;
//! nothing it transmits refers to an aborted send; its peers neither refuse its frames
//! nor declare it unreachable; and it keeps working for new requests.

mod common;

use common::*;
use emx::proto::{Completion, CoreConfig, DropReason, RequestError, Time};
use emx::sim::LinkConfig;
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

/// Match bits of the requests made after the abort: no old request takes them.
const NEW: u64 = 1 << 40;

#[derive(Clone, Copy, Debug)]
enum Req {
    Send { len: usize },
    Recv { len: usize },
}

/// Core 0's requests by context value, and how many times each came back.
#[derive(Default)]
struct Book {
    reqs: HashMap<u64, Req>,
    /// Core 0's request handles, by context value.
    ids: HashMap<u64, emx::proto::RequestId>,
    done: HashMap<u64, u32>,
    next: u64,
    /// Completions of the other cores: (core, context, result is ok, error).
    others: Vec<(usize, u64, Option<RequestError>)>,
}

impl Book {
    fn send(&mut self, sim: &mut TestSim, from: usize, to: usize, bits: u64, len: usize) -> u64 {
        self.next += 1;
        let ctx = self.next;
        let now = sim.now();
        let id = sim
            .core(from)
            .send(now, addr(to), bits, pattern(ctx, len), ctx)
            .unwrap();
        if from == 0 {
            self.reqs.insert(ctx, Req::Send { len });
            self.ids.insert(ctx, id);
        }
        ctx
    }

    fn recv(
        &mut self,
        sim: &mut TestSim,
        at: usize,
        src: Option<usize>,
        bits: u64,
        len: usize,
    ) -> u64 {
        self.next += 1;
        let ctx = self.next;
        let now = sim.now();
        sim.core(at)
            .post_recv(now, src.map(addr), bits, !0, vec![0xEE; len], ctx)
            .unwrap();
        if at == 0 {
            self.reqs.insert(ctx, Req::Recv { len });
        }
        ctx
    }

    /// Takes every completion; core 0's are checked against what was asked. Returns the
    /// receives that completed well: (core, context, bytes).
    fn take(&mut self, sim: &mut TestSim, aborted: bool) -> Vec<(usize, u64, Vec<u8>)> {
        let mut got = Vec::new();
        for (k, c) in drain(sim) {
            let (ctx, err) = match &c {
                Completion::Send(s) => (s.ctx, s.result.err()),
                Completion::Recv(r) => (r.ctx, r.result.err()),
            };
            if k == 0 && self.reqs.contains_key(&ctx) {
                let n = self.done.entry(ctx).or_default();
                *n += 1;
                // Once, whenever it comes: a late ACK or NOTIFY must not
                // complete an aborted request a second time.
                assert_eq!(*n, 1, "request {ctx} came back twice");
                if aborted {
                    assert_eq!(err, Some(RequestError::Aborted), "request {ctx}");
                }
                match (self.reqs[&ctx], c) {
                    (Req::Send { len }, Completion::Send(s)) => {
                        assert!(s.buf == pattern(ctx, len), "send buffer {ctx} changed")
                    }
                    (Req::Recv { len }, Completion::Recv(r)) => {
                        assert_eq!(r.buf.len(), len, "receive buffer {ctx}");
                        if r.result.is_ok() {
                            got.push((k, ctx, r.buf));
                        }
                    }
                    (r, _) => panic!("request {ctx} ({r:?}) completed as the other kind"),
                }
            } else {
                self.others.push((k, ctx, err));
                if let Completion::Recv(r) = c {
                    if r.result.is_ok() {
                        got.push((k, ctx, r.buf));
                    }
                }
            }
        }
        got
    }
}

/// Aborts core 0 and checks what it hands back and what it transmits right after.
fn abort_and_check(sim: &mut TestSim, book: &mut Book) {
    book.take(sim, false);
    let now = sim.now();
    sim.core(0).abort_all(now);
    book.take(sim, true);
    assert_eq!(sim.core_ref(0).outstanding(), 0);
    for ctx in book.reqs.keys() {
        assert_eq!(book.done.get(ctx), Some(&1), "request {ctx} came back once");
    }
    // Whatever core 0 has to send now carries no payload; hand it on by hand.
    let mut buf = [0u8; 128];
    while let Some(tx) = sim.core(0).poll_transmit(now, &mut buf) {
        assert!(tx.payload.is_none(), "payload after abort_all: {tx:?}");
        let frame = buf[..tx.header_len].to_vec();
        let dst = tx.peer.0 as usize + 1; // core 0's peers are cores 1.. in order
        let _ = sim.core(dst).handle_frame(now, &frame);
    }
}

/// New traffic after the abort, in the directions that must work: core 0 to core 1 and
/// every other core to core 0, eager and rendezvous. Then a long quiet spell: nobody may
/// declare anybody unreachable or refuse a frame as a protocol violation.
fn keeps_working(sim: &mut TestSim, book: &mut Book, others: &[usize]) {
    let sizes = [0usize, 8, 3000, 40_000, 150_000];
    let mut want: HashMap<u64, (usize, Vec<u8>)> = HashMap::new();
    let mut sends = Vec::new();
    for (k, &len) in sizes.iter().enumerate() {
        let bits = NEW | k as u64;
        let r = book.recv(sim, 1, Some(0), bits, len);
        let s = book.send(sim, 0, 1, bits, len);
        want.insert(r, (1, pattern(s, len)));
        sends.push(s);
        for &o in others {
            let bits = NEW | (o as u64) << 8 | k as u64;
            let r = book.recv(sim, 0, Some(o), bits, len);
            let s = book.send(sim, o, 0, bits, len);
            want.insert(r, (0, pattern(s, len)));
            sends.push(s);
        }
    }
    let mut recvd = 0;
    let mut sent = 0;
    let deadline = sim.now() + Duration::from_millis(200);
    let ok = sim.run_until(deadline, |sim| {
        for (k, ctx, bytes) in book.take(sim, false) {
            if let Some((at, data)) = want.get(&ctx) {
                assert_eq!(*at, k);
                assert!(bytes == *data, "new message {ctx} corrupted");
                recvd += 1;
            }
        }
        sent = sends
            .iter()
            .filter(|s| {
                book.done.get(s) == Some(&1)
                    || book.others.iter().any(|(_, c, e)| c == *s && e.is_none())
            })
            .count();
        recvd == want.len() && sent == sends.len()
    });
    assert!(
        ok,
        "after abort_all: {recvd}/{} receives, {sent}/{} sends",
        want.len(),
        sends.len()
    );
    let quiet = sim.now() + Duration::from_millis(1500);
    sim.run_until(quiet, |_| false);
    book.take(sim, false);
    for (k, ctx, e) in &book.others {
        assert_ne!(
            *e,
            Some(RequestError::PeerUnreachable),
            "core {k} request {ctx}"
        );
    }
    for k in 0..sim.len() {
        let d = &sim.core_ref(k).stats().dropped;
        let mut peers = 0;
        for p in 0..sim.len() - 1 {
            let s = sim
                .core_ref(k)
                .peer_stats(emx::proto::PeerId(p as u16))
                .unwrap();
            peers += s.dropped.get(DropReason::Protocol) + s.dropped.get(DropReason::DeadPeer);
        }
        assert_eq!(
            d.get(DropReason::Protocol) + peers,
            0,
            "core {k} refused frames"
        );
    }
}

/// Requests in every state at once: core 0 (A) with core 1 (B) and core 2 (C).
#[test]
fn abort_with_requests_in_every_state() {
    // 64 KiB of credit per peer, so that eager sends wait on it.
    let cfg = CoreConfig {
        unexpected_bytes: 64 * 64 * 1024,
        ..CoreConfig::default()
    };
    assert_eq!(cfg.peer_credit(), 64 * 1024);
    let mut sim = make_sim(3, LinkConfig::default(), &cfg);
    let mut book = Book::default();
    // B pulls a 1 MiB rendezvous from A and A pulls one from B: both in progress at the
    // abort (about 850 us each at 10 Gbit/s).
    book.recv(&mut sim, 1, Some(0), 1, 1 << 20);
    book.send(&mut sim, 0, 1, 1, 1 << 20);
    book.recv(&mut sim, 0, Some(1), 2, 1 << 20);
    book.send(&mut sim, 1, 0, 2, 1 << 20);
    // A rendezvous announced to C that C never matches, and one C announces to A that A
    // never matches (it stays unexpected at A: not a request).
    book.send(&mut sim, 0, 2, 3, 200_000);
    book.send(&mut sim, 2, 0, 4, 200_000);
    // Eager sends to B beyond A's credit (64 KiB per peer): two go, the rest wait.
    for _ in 0..6 {
        book.send(&mut sim, 0, 1, 5, 30_000);
    }
    // Receives that never match: from anyone, from B, from C.
    book.recv(&mut sim, 0, None, 6, 100);
    book.recv(&mut sim, 0, Some(1), 6, 100);
    book.recv(&mut sim, 0, Some(2), 6, 100);
    // An eager receive that C's message fills only partly before the abort.
    book.recv(&mut sim, 0, Some(2), 7, 30_000);
    sim.run_until(Time::from_micros(290), |_| false);
    book.send(&mut sim, 2, 0, 7, 30_000);
    sim.run_until(Time::from_micros(300), |_| false);

    // The states are the ones meant: the rendezvous transfers are under way.
    let a_to_b = sim.core_ref(0).peer_stats(emx::proto::PeerId(0)).unwrap();
    assert!(
        (100_000..1_000_000).contains(&a_to_b.bytes_sent),
        "{a_to_b:?}"
    );
    let b_to_a = sim.core_ref(1).peer_stats(emx::proto::PeerId(0)).unwrap();
    assert!(
        (100_000..1_000_000).contains(&b_to_a.bytes_sent),
        "{b_to_a:?}"
    );
    let outstanding = sim.core_ref(0).outstanding();
    assert_eq!(
        outstanding, 11,
        "A: 4 eager + 2 rendezvous sends, 5 receives"
    );

    abort_and_check(&mut sim, &mut book);
    keeps_working(&mut sim, &mut book, &[1, 2]);
    // B's rendezvous send, whose receive A aborted, completed: A told B it was done.
    assert!(book
        .others
        .iter()
        .any(|&(k, c, e)| k == 1 && c == 4 && e.is_none()));
}

/// Both ends of two rendezvous transfers abort while the data flows: each end's
/// NOTIFY reaches a sender whose send is gone, and late data a receiver whose receive
/// is gone.
#[test]
fn both_ends_abort_mid_rendezvous() {
    let cfg = CoreConfig::default();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    let mut book = Book::default();
    book.recv(&mut sim, 1, Some(0), 1, 1 << 20);
    book.send(&mut sim, 0, 1, 1, 1 << 20);
    book.recv(&mut sim, 0, Some(1), 2, 1 << 20);
    book.send(&mut sim, 1, 0, 2, 1 << 20);
    sim.run_until(Time::from_micros(300), |_| false);
    abort_and_check(&mut sim, &mut book);
    let now = sim.now();
    sim.core(1).abort_all(now);
    assert_eq!(sim.core_ref(1).outstanding(), 0);
    book.take(&mut sim, false);
    let aborted = book
        .others
        .iter()
        .filter(|o| o.0 == 1 && o.2 == Some(RequestError::Aborted))
        .count();
    assert_eq!(aborted, 2);
    keeps_working(&mut sim, &mut book, &[1]);
}

/// A receive bound to a message that arrived in part (a fragment missing)
/// and then aborted comes back with its own bytes where nothing arrived: not
/// what an earlier message left in the unexpected store, which its chunks
/// held (another peer's bytes, say). Binding used to copy the store whole.
#[test]
fn a_receive_failed_part_way_hands_back_no_earlier_message() {
    let cfg = CoreConfig::default();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    transfer(&mut sim, 0, 1, 10, 9);
    const LEN: usize = 4000;
    let now = sim.now();
    // An earlier message, unexpected, through the store, then taken.
    sim.core(0)
        .send(now, addr(1), 1, vec![0xAB; LEN], 1)
        .unwrap();
    sim.run_until(now + Duration::from_millis(1), |_| false);
    let now = sim.now();
    sim.core(1)
        .post_recv(now, Some(addr(0)), 1, !0, vec![0; LEN], 1)
        .unwrap();
    sim.run_until(now + Duration::from_millis(1), |_| false);
    assert_eq!(drain(&mut sim).len(), 2, "the earlier message went through");
    // A message of three fragments of which the middle one never comes.
    let now = sim.now();
    let data = pattern(2, LEN);
    sim.core(0).send(now, addr(1), 2, data.clone(), 2).unwrap();
    let frames: Vec<_> = std::iter::from_fn(|| take_frame(&mut sim, 0)).collect();
    assert_eq!(frames.len(), 3, "three fragments");
    for f in [&frames[0], &frames[2]] {
        sim.core(1).handle_frame(now, f).unwrap();
    }
    sim.core(1)
        .post_recv(now, Some(addr(0)), 2, !0, vec![0xEE; LEN], 2)
        .unwrap();
    sim.core(1).abort_all(now);
    let got = drain(&mut sim);
    let [(1, Completion::Recv(r))] = &got[..] else {
        panic!("{got:?}")
    };
    assert_eq!(r.result, Err(RequestError::Aborted));
    let unit = cfg.frame_payload();
    assert_eq!(r.buf[..unit], data[..unit], "the first fragment arrived");
    assert!(
        r.buf[unit..2 * unit].iter().all(|&b| b == 0xEE),
        "where nothing arrived: {:x?}",
        &r.buf[unit..unit + 16]
    );
    assert_eq!(
        r.buf[2 * unit..],
        data[2 * unit..],
        "the last fragment arrived"
    );
}

/// Aborting twice, and aborting an idle core, is harmless.
#[test]
fn abort_idle_and_twice() {
    let cfg = CoreConfig::default();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    let mut book = Book::default();
    abort_and_check(&mut sim, &mut book);
    book.send(&mut sim, 0, 1, 1, 50_000);
    book.recv(&mut sim, 0, Some(1), 2, 10);
    sim.run_until(Time::from_micros(20), |_| false);
    abort_and_check(&mut sim, &mut book);
    abort_and_check(&mut sim, &mut book);
    keeps_working(&mut sim, &mut book, &[1]);
}

#[derive(Debug, Clone)]
enum Op {
    /// Core 0 sends to core 1 (whole-frame eager or rendezvous: a message partly sent
    /// would stay incomplete at core 1, see `abort_all`).
    Send01 { len: usize, bits: u64 },
    /// Core 0 sends to core 2, any size.
    Send02 { len: usize, bits: u64 },
    /// Core `from` (1 or 2) sends to core 0.
    SendTo0 { from: usize, len: usize, bits: u64 },
    /// Core 0 posts a receive (source 0: any).
    Recv0 { src: usize, len: usize, bits: u64 },
    /// Core `at` (1 or 2) posts a receive for core 0's messages.
    RecvFrom0 { at: usize, len: usize, bits: u64 },
    /// Core 0 cancels one of its sends so far (`which` modulo their number):
    /// a rendezvous one nothing was pulled from is withdrawn.
    Cancel0 { which: usize },
}

fn any_len() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..=64,
        65usize..=1424,
        1425usize..=32_768,
        32_769usize..=300_000
    ]
}

fn whole_len() -> impl Strategy<Value = usize> {
    prop_oneof![0usize..=1424, 32_769usize..=300_000]
}

fn op() -> impl Strategy<Value = Op> {
    let bits = 0u64..3;
    prop_oneof![
        (whole_len(), bits.clone()).prop_map(|(len, bits)| Op::Send01 { len, bits }),
        (any_len(), bits.clone()).prop_map(|(len, bits)| Op::Send02 { len, bits }),
        (1usize..=2, any_len(), bits.clone()).prop_map(|(from, len, bits)| Op::SendTo0 {
            from,
            len,
            bits
        }),
        (0usize..=2, any_len(), bits.clone()).prop_map(|(src, len, bits)| Op::Recv0 {
            src,
            len,
            bits
        }),
        (1usize..=2, any_len(), bits).prop_map(|(at, len, bits)| Op::RecvFrom0 { at, len, bits }),
        // (Twice as likely: most sends are eager or pulled already.)
        any::<usize>().prop_map(|which| Op::Cancel0 { which }),
        any::<usize>().prop_map(|which| Op::Cancel0 { which }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 100, ..ProptestConfig::default() })]

    /// Random requests, started at random times, aborted at a random time.
    #[test]
    fn abort_at_random_times(
        ops in prop::collection::vec((0u64..300, op()), 1..12),
        abort_us in 0u64..700,
    ) {
        let cfg = CoreConfig::default();
        let mut sim = make_sim(3, LinkConfig::default(), &cfg);
        let mut book = Book::default();
        let mut ops = ops;
        ops.sort_by_key(|o| o.0);
        let mut sends_to_0 = 0;
        let mut sent_by_0 = Vec::new();
        for (at, op) in ops {
            if at >= abort_us {
                break;
            }
            if matches!(op, Op::SendTo0 { .. }) {
                sends_to_0 += 1;
            }
            sim.run_until(Time::from_micros(at), |_| false);
            let s = &mut sim;
            match op {
                Op::Send01 { len, bits } => sent_by_0.push(book.send(s, 0, 1, bits, len)),
                Op::Send02 { len, bits } => sent_by_0.push(book.send(s, 0, 2, bits, len)),
                Op::Cancel0 { which } if !sent_by_0.is_empty() => {
                    let _ = s.core(0).cancel(book.ids[&sent_by_0[which % sent_by_0.len()]]);
                }
                Op::Cancel0 { .. } => {}
                Op::SendTo0 { from, len, bits } => { book.send(s, from, 0, bits, len); }
                Op::Recv0 { src, len, bits } => {
                    book.recv(s, 0, (src > 0).then_some(src), bits, len);
                }
                Op::RecvFrom0 { at, len, bits } => { book.recv(s, at, Some(0), bits, len); }
            }
        }
        sim.run_until(Time::from_micros(abort_us), |_| false);
        abort_and_check(&mut sim, &mut book);
        // Messages to core 0 that no receive took wait in its unexpected store
        // and hold its credit for their sender (up to 64 KiB): take them, as
        // an application would (a receive per message sent to core 0 from
        // each sender bounds them), so that the new traffic below has credit.
        for from in 1..=2 {
            for _ in 0..sends_to_0 {
                let now = sim.now();
                let ctx = 1 << 50 | book.next;
                book.next += 1;
                sim.core(0)
                    .post_recv(now, Some(addr(from)), 0, NEW, vec![0; 300_000], ctx)
                    .unwrap();
            }
        }
        // Core 0 to core 2 may have had an eager message cut in the middle.
        keeps_working(&mut sim, &mut book, &[1, 2]);
    }
}
