//! Property tests: random mixes of messages over a faulty simulated link. Every message
//! is delivered exactly once, byte-exact, in per-pair order; every request completes;
//! the unexpected store stays within its bound.

mod common;

use common::*;
use emx::proto::{ChecksumMode, Completion, CoreConfig, RequestError, Time};
use emx::sim::LinkConfig;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

const TAG_SHIFT: u32 = 32;
const DEAD_TAG: u64 = 0xdead;

#[derive(Debug, Clone)]
struct Msg {
    src: usize,
    dst: usize,
    len: usize,
    tag: u64,
    send_at_us: u64,
    /// Receive buffer shorter than the message (exact receives only).
    trunc: bool,
    /// Received through a matched probe (exact receives only): claimed with
    /// `mprobe` once it is there, then received with `post_mrecv`.
    mprobe: bool,
    /// Its send is cancelled this many microseconds after it was sent (only
    /// a rendezvous one with an exact receive: it is withdrawn if that
    /// receive did not take it first, and the receive is then cancelled).
    withdraw: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One receive per message, all 64 match bits.
    Exact,
    /// Receives match the tag only, from any source.
    WildAny,
    /// Receives match the tag only, from one source each.
    WildSrc,
}

#[derive(Debug, Clone)]
struct Scenario {
    n: usize,
    msgs: Vec<Msg>,
    modes: Vec<Mode>,
    /// Per receive: microseconds after start at which it is posted.
    recv_delays: Vec<u64>,
    cancels: usize,
    link: LinkConfig,
    mtu: usize,
    full_csum: bool,
    /// Send window in frames (every node).
    window: u32,
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        40 => 0usize..=64,
        30 => 65usize..=20_000,
        20 => 20_001usize..=200_000,
        3 => 200_001usize..=1 << 20,
        1 => (1usize << 20)..=8 << 20,
    ]
}

fn scenario(max_nodes: usize, max_msgs: usize, max_loss: f64) -> impl Strategy<Value = Scenario> {
    (2..=max_nodes).prop_flat_map(move |n| {
        let msg = (
            0..n,
            0..n - 1,
            size(),
            0u64..4,
            0u64..300,
            prop::bool::weighted(0.15),
            prop::bool::weighted(0.3),
            prop_oneof![3 => Just(None), 1 => (0u64..400).prop_map(Some)],
        )
            .prop_map(
                move |(src, d, len, tag, send_at_us, trunc, mprobe, withdraw)| Msg {
                    src,
                    dst: if d >= src { d + 1 } else { d },
                    len,
                    tag,
                    send_at_us,
                    trunc,
                    mprobe,
                    withdraw,
                },
            );
        let mode = prop_oneof![Just(Mode::Exact), Just(Mode::WildAny), Just(Mode::WildSrc)];
        let link = (
            0.0..=max_loss,
            0.0..0.05f64,
            0.0..0.2f64,
            prop::bool::weighted(0.3),
            // Late frames (past their retransmission) on a third of the links.
            prop_oneof![2 => Just(0.0), 1 => 0.0..0.03f64],
            any::<u64>(),
        )
            .prop_map(
                |(loss, duplicate, reorder, corrupt, late, seed)| LinkConfig {
                    loss,
                    duplicate,
                    reorder,
                    reorder_delay: Duration::from_micros(30),
                    late,
                    corrupt: if corrupt { 0.01 } else { 0.0 },
                    seed,
                    ..LinkConfig::default()
                },
            );
        (
            Just(n),
            prop::collection::vec(msg, 1..=max_msgs),
            prop::collection::vec(mode, n * 4),
            prop::collection::vec(prop_oneof![2 => Just(0u64), 3 => 0u64..600], 64 * 8 + 16),
            0usize..4,
            link,
            prop_oneof![4 => Just(1500usize), 1 => Just(9000usize)],
            // The default, the largest (beyond the ack's 64-bit selective
            // ack), and any.
            prop_oneof![2 => Just(64u32), 2 => Just(256u32), 1 => 1u32..=256],
        )
            .prop_map(
                |(n, msgs, modes, recv_delays, cancels, link, mtu, window)| {
                    let full_csum = link.corrupt > 0.0;
                    Scenario {
                        n,
                        msgs,
                        modes,
                        recv_delays,
                        cancels,
                        link,
                        mtu,
                        full_csum,
                        window,
                    }
                },
            )
    })
}

struct PlannedRecv {
    dst: usize,
    src: Option<usize>,
    bits: u64,
    mask: u64,
    buf_len: usize,
    at_us: u64,
    /// Posting rank within its (dst, tag) class, for the order check.
    class: (usize, u64),
    cancel: bool,
    /// Claimed by a matched probe, then received (see [`Msg::mprobe`]).
    mprobe: bool,
}

fn run(sc: Scenario) -> Result<(), TestCaseError> {
    let cfg = CoreConfig {
        mtu: sc.mtu,
        window: sc.window,
        max_peers: 8,
        eager_threshold: 16 * 1024,
        unexpected_bytes: 8 * 40 * 1024,
        pull_block: 32 * 1024,
        keepalive: Duration::from_millis(5),
        peer_timeout: Duration::from_secs(3),
        checksum: if sc.full_csum {
            ChecksumMode::Full
        } else {
            ChecksumMode::Header
        },
        ..CoreConfig::default()
    };
    let mut sim = make_sim(sc.n, sc.link.clone(), &cfg);
    // Half the nodes copy short payloads into the frame (as the runtime's
    // driver has them do), the others hand every payload by reference.
    for i in (0..sc.n).step_by(2) {
        sim.core(i).set_copy_below(1024);
    }

    // Plan the receives.
    let mode = |dst: usize, tag: u64| sc.modes[dst * 4 + tag as usize];
    let mut plan: Vec<PlannedRecv> = Vec::new();
    let mut delays = sc.recv_delays.iter().copied().cycle();
    let mut classes: BTreeMap<(usize, u64, Option<usize>), (usize, usize)> = BTreeMap::new();
    // Message id -> the plan index of its exact receive, and when its send
    // is cancelled.
    let mut exact_recv: HashMap<usize, usize> = HashMap::new();
    let mut withdraw_at: BTreeMap<usize, u64> = BTreeMap::new();
    for (id, m) in sc.msgs.iter().enumerate() {
        if mode(m.dst, m.tag) == Mode::Exact {
            exact_recv.insert(id, plan.len());
            if let Some(d) = m.withdraw.filter(|_| m.len as u64 > cfg.eager_threshold) {
                withdraw_at.insert(id, m.send_at_us + d);
            }
        }
        match mode(m.dst, m.tag) {
            Mode::Exact => plan.push(PlannedRecv {
                dst: m.dst,
                src: Some(m.src),
                bits: m.tag << TAG_SHIFT | id as u64,
                mask: !0,
                buf_len: if m.trunc { m.len / 2 } else { m.len },
                at_us: delays.next().unwrap(),
                class: (m.dst, u64::MAX),
                cancel: false,
                mprobe: m.mprobe,
            }),
            Mode::WildAny | Mode::WildSrc => {
                let src = (mode(m.dst, m.tag) == Mode::WildSrc).then_some(m.src);
                let e = classes.entry((m.dst, m.tag, src)).or_insert((0, 0));
                e.0 += 1;
                e.1 = e.1.max(m.len);
            }
        }
    }
    for (&(dst, tag, src), &(count, max_len)) in &classes {
        for k in 0..count {
            plan.push(PlannedRecv {
                dst,
                src,
                bits: tag << TAG_SHIFT,
                mask: !0 << TAG_SHIFT,
                // Now and then a short buffer: whichever message lands there is truncated.
                buf_len: if k % 5 == 4 { max_len / 3 } else { max_len },
                at_us: delays.next().unwrap(),
                class: (dst, tag),
                cancel: false,
                mprobe: false,
            });
        }
    }
    for k in 0..sc.cancels {
        plan.push(PlannedRecv {
            dst: k % sc.n,
            src: None,
            bits: DEAD_TAG << TAG_SHIFT,
            mask: !0,
            buf_len: 16,
            at_us: delays.next().unwrap(),
            class: (k % sc.n, DEAD_TAG),
            cancel: true,
            mprobe: false,
        });
    }
    // Posting order within a class is by time, then by plan order.
    let mut recv_order: Vec<usize> = (0..plan.len()).collect();
    recv_order.sort_by_key(|&i| (plan[i].at_us, i));
    let mut send_order: Vec<usize> = (0..sc.msgs.len()).collect();
    send_order.sort_by_key(|&i| (sc.msgs[i].send_at_us, i));

    let mut posted_rank: HashMap<usize, usize> = HashMap::new(); // plan index -> rank
    let mut recv_req = BTreeMap::new(); // ordered: cancels in plan order, as a seed replays
    let mut probing: Vec<usize> = Vec::new(); // matched-probe receives not claimed yet
    let mut send_req = HashMap::new(); // msg id -> its send's handle
    let mut withdrawn = HashSet::new(); // msg ids whose sends ended cancelled
    let mut unposted = HashSet::new(); // receives of withdrawn messages not posted
    let mut next_send = 0;
    let mut next_recv = 0;
    let mut delivered: HashMap<u64, usize> = HashMap::new(); // msg id -> plan index
    let mut sends_done = HashSet::new();
    let mut cancelled = 0;
    let mut cancel_asked = HashSet::new();
    let mut recvs_done = 0;
    let total_recvs = plan.len();
    let bound = cfg.unexpected_bytes;
    let mut failure: Option<String> = None;

    let deadline = Time(120_000_000_000);
    loop {
        let now = sim.now();
        // Requests due now.
        while next_recv < recv_order.len()
            && Time::from_micros(plan[recv_order[next_recv]].at_us) <= now
        {
            let i = recv_order[next_recv];
            let p = &plan[i];
            posted_rank.insert(i, next_recv);
            next_recv += 1;
            if unposted.contains(&i) {
                continue;
            }
            if p.mprobe {
                probing.push(i);
                continue;
            }
            let src = p.src.map(addr);
            let req = sim
                .core(p.dst)
                .post_recv(now, src, p.bits, p.mask, vec![0xEE; p.buf_len], i as u64)
                .map_err(|e| TestCaseError::fail(format!("post_recv: {:?}", e.error)))?;
            recv_req.insert(i, req);
        }
        // Matched probes: each claims its message once some of it is there
        // (it may still be arriving), and receives it.
        let mut claimed = Vec::new();
        for &i in &probing {
            let p = &plan[i];
            if let Some((m, info)) = sim.core(p.dst).mprobe(p.src.map(addr), p.bits, p.mask) {
                prop_assert_eq!(info.match_bits, p.bits);
                let msg = &sc.msgs[(p.bits & 0xffff_ffff) as usize];
                prop_assert_eq!((info.src, info.len), (addr(msg.src), msg.len as u64));
                let req = sim
                    .core(p.dst)
                    .post_mrecv(now, m, vec![0xEE; p.buf_len], i as u64)
                    .map_err(|e| TestCaseError::fail(format!("post_mrecv: {:?}", e.error)))?;
                recv_req.insert(i, req);
                claimed.push(i);
            }
        }
        probing.retain(|i| !claimed.contains(i));
        while next_send < send_order.len()
            && Time::from_micros(sc.msgs[send_order[next_send]].send_at_us) <= now
        {
            let id = send_order[next_send];
            let m = &sc.msgs[id];
            let req = sim
                .core(m.src)
                .send(
                    now,
                    addr(m.dst),
                    m.tag << TAG_SHIFT | id as u64,
                    pattern(id as u64, m.len),
                    id as u64,
                )
                .map_err(|e| TestCaseError::fail(format!("send: {:?}", e.error)))?;
            send_req.insert(id, req);
            next_send += 1;
        }
        // Cancel the sends due for it (it is the receiver's to grant).
        let due: Vec<usize> = withdraw_at
            .iter()
            .filter(|&(_, &at)| Time::from_micros(at) <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            withdraw_at.remove(&id);
            let _ = sim.core(sc.msgs[id].src).cancel(send_req[&id]);
        }
        // Cancel the dead-tag receives a while after they were posted, once:
        // no message can match them, so the cancel must be taken.
        for (&i, &req) in &recv_req {
            if plan[i].cancel
                && now >= Time::from_micros(plan[i].at_us + 50)
                && cancel_asked.insert(i)
            {
                let taken = sim.core(plan[i].dst).cancel(req);
                prop_assert!(taken, "the cancel of dead-tag receive {} was refused", i);
            }
        }
        for (core, c) in drain(&mut sim) {
            match c {
                Completion::Send(s) if s.result == Err(RequestError::Cancelled) => {
                    // Withdrawn: its receive never gets it, and is cancelled
                    // (it cannot have matched), or never posted.
                    let id = s.ctx as usize;
                    prop_assert!(sc.msgs[id].withdraw.is_some(), "send {} cancelled", id);
                    prop_assert!(sends_done.insert(id), "send {} completed twice", id);
                    withdrawn.insert(id);
                    let i = exact_recv[&id];
                    if let Some(&req) = recv_req.get(&i) {
                        let taken = sim.core(plan[i].dst).cancel(req);
                        prop_assert!(taken, "the receive of withdrawn message {} matched", id);
                    } else {
                        probing.retain(|&j| j != i);
                        unposted.insert(i);
                        cancelled += 1;
                    }
                }
                Completion::Send(s) => {
                    if let Err(e) = s.result {
                        failure.get_or_insert(format!("send {} failed: {e}", s.ctx));
                    }
                    let id = s.ctx as usize;
                    prop_assert_eq!(sc.msgs[id].src, core);
                    prop_assert!(sends_done.insert(id), "send {} completed twice", id);
                }
                Completion::Recv(r) => {
                    let i = r.ctx as usize;
                    let p = &plan[i];
                    prop_assert_eq!(p.dst, core);
                    recv_req.remove(&i);
                    let of_withdrawn = p.class.1 == u64::MAX
                        && withdrawn.contains(&((p.bits & 0xffff_ffff) as usize));
                    if p.cancel || of_withdrawn {
                        prop_assert_eq!(r.result, Err(RequestError::Cancelled));
                        cancelled += 1;
                        continue;
                    }
                    let info = r
                        .result
                        .map_err(|e| TestCaseError::fail(format!("recv {i} failed: {e}")))?;
                    let id = info.match_bits & 0xffff_ffff;
                    let m = &sc.msgs[id as usize];
                    prop_assert_eq!(info.src, addr(m.src));
                    // A message this receive may take: its source and bits.
                    prop_assert_eq!(m.dst, core);
                    prop_assert!(
                        p.src.is_none_or(|s| s == m.src),
                        "receive {} took {}",
                        i,
                        id
                    );
                    prop_assert_eq!(info.match_bits & p.mask, p.bits & p.mask);
                    prop_assert_eq!(info.msg_len as usize, m.len);
                    prop_assert!(info.match_bits >> TAG_SHIFT == m.tag);
                    let copied = m.len.min(p.buf_len);
                    prop_assert_eq!(info.copied as usize, copied);
                    prop_assert_eq!(info.truncated, m.len > p.buf_len);
                    prop_assert!(
                        r.buf[..copied] == pattern(id, m.len)[..copied],
                        "message {} bytes differ (link {:?})",
                        id,
                        sim.stats()
                    );
                    prop_assert!(
                        r.buf[copied..].iter().all(|&b| b == 0xEE),
                        "wrote past the message"
                    );
                    prop_assert!(
                        delivered.insert(id, i).is_none(),
                        "message {} delivered twice",
                        id
                    );
                    recvs_done += 1;
                }
            }
        }
        for k in 0..sim.len() {
            let held = sim.core_ref(k).unexpected_bytes();
            prop_assert!(
                held <= bound,
                "unexpected store {} over its bound {}",
                held,
                bound
            );
        }
        if let Some(f) = failure {
            return Err(TestCaseError::fail(f));
        }
        if sends_done.len() == sc.msgs.len() && recvs_done + cancelled == total_recvs {
            break;
        }
        let next_req = [
            recv_order
                .get(next_recv)
                .map(|&i| Time::from_micros(plan[i].at_us)),
            send_order
                .get(next_send)
                .map(|&i| Time::from_micros(sc.msgs[i].send_at_us)),
            recv_req
                .keys()
                .filter(|&&i| plan[i].cancel && !cancel_asked.contains(&i))
                .map(|&i| Time::from_micros(plan[i].at_us + 50))
                .min(),
            withdraw_at.values().min().map(|&t| Time::from_micros(t)),
        ]
        .into_iter()
        .flatten()
        .min();
        sim.flush();
        prop_assert!(
            sim.now() < deadline && (sim.next_event().is_some() || next_req.is_some()),
            "stuck at {:?}: sends {}/{} recvs {}/{} cancelled {}\n{}",
            sim.now(),
            sends_done.len(),
            sc.msgs.len(),
            recvs_done,
            total_recvs,
            cancelled,
            dump(&sim)
        );
        match (sim.next_event(), next_req) {
            (Some(t), Some(r)) if r < t => sim.run_until(r, |_| false),
            (Some(_), _) => sim.step(),
            (None, Some(r)) => sim.run_until(r, |_| false),
            (None, None) => false,
        };
    }

    // Per-pair order: within a wildcard class, receives posted earlier hold earlier
    // messages of each sender.
    let mut by_class: BTreeMap<(usize, u64), Vec<(usize, u64)>> = BTreeMap::new();
    for (&id, &i) in &delivered {
        if plan[i].class.1 != u64::MAX {
            by_class
                .entry(plan[i].class)
                .or_default()
                .push((posted_rank[&i], id));
        }
    }
    let mut send_rank = vec![0; sc.msgs.len()];
    for (rank, &id) in send_order.iter().enumerate() {
        send_rank[id] = rank;
    }
    for (class, mut v) in by_class {
        v.sort();
        let mut last: HashMap<usize, u64> = HashMap::new();
        for (_, id) in v {
            let src = sc.msgs[id as usize].src;
            if let Some(&prev) = last.get(&src) {
                prop_assert!(
                    send_rank[prev as usize] < send_rank[id as usize],
                    "class {:?}: message {} matched before {}",
                    class,
                    id,
                    prev
                );
            }
            last.insert(src, id);
        }
    }
    if sc.full_csum {
        prop_assert_eq!(sim.stats().corrupted_accepted, 0);
    }
    for k in 0..sim.len() {
        let c = sim.core_ref(k);
        for p in 0..sim.len() as u16 - 1 {
            let d = c.peer_stats(emx::proto::PeerId(p)).unwrap().dropped;
            // A frame refused after it passed the wire checks would stall the stream.
            prop_assert_eq!(d.get(emx::proto::DropReason::Protocol), 0);
            prop_assert_eq!(d.get(emx::proto::DropReason::Resources), 0);
        }
        prop_assert!(c.stats().unexpected_high_water <= bound);
        prop_assert_eq!(c.outstanding(), 0);
        prop_assert_eq!(c.unexpected_bytes(), 0);
    }
    Ok(())
}

/// Case count, scaled by `EMX_PROPTEST_SCALE` for longer local runs.
fn cases(n: u32) -> u32 {
    let scale: u32 = std::env::var("EMX_PROPTEST_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    n * scale
}

fn dump(sim: &TestSim) -> String {
    let mut out = String::new();
    for k in 0..sim.len() {
        for p in 0..sim.len() - 1 {
            let id = emx::proto::PeerId(p as u16);
            out += &format!(
                "core {k} peer {p}: {:?}\n  {:?}\n",
                sim.core_ref(k).peer_info(id),
                sim.core_ref(k).peer_stats(id)
            );
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(1024), max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn mixes_on_a_lossy_link(sc in scenario(4, 24, 0.3)) {
        run(sc)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(128), max_shrink_iters: 50, ..ProptestConfig::default() })]

    #[test]
    fn eight_cores(sc in scenario(8, 40, 0.1)) {
        run(sc)?;
    }
}

/// A few large messages, up to 8 MiB, on a link that loses 30% of the frames, with
/// the default window and the largest.
#[test]
fn large_messages_heavy_loss() {
    for (mtu, window, seed) in [
        (1500, 64, 3u64),
        (9000, 64, 4),
        (1500, 256, 5),
        (9000, 256, 6),
    ] {
        let msgs = vec![
            Msg {
                src: 0,
                dst: 1,
                len: 8 << 20,
                tag: 1,
                send_at_us: 0,
                trunc: false,
                mprobe: false,
                withdraw: None,
            },
            Msg {
                src: 1,
                dst: 0,
                len: 3 << 20,
                tag: 1,
                send_at_us: 0,
                trunc: true,
                mprobe: false,
                withdraw: None,
            },
            Msg {
                src: 0,
                dst: 1,
                len: 12_345,
                tag: 1,
                send_at_us: 10,
                trunc: false,
                mprobe: false,
                withdraw: None,
            },
            Msg {
                src: 0,
                dst: 1,
                len: 0,
                tag: 2,
                send_at_us: 10,
                trunc: false,
                mprobe: false,
                withdraw: None,
            },
        ];
        let sc = Scenario {
            n: 2,
            msgs,
            modes: vec![
                Mode::Exact,
                Mode::WildSrc,
                Mode::WildAny,
                Mode::Exact,
                Mode::Exact,
                Mode::WildSrc,
                Mode::WildAny,
                Mode::Exact,
            ],
            recv_delays: vec![0, 500, 0, 40],
            cancels: 1,
            link: LinkConfig {
                loss: 0.3,
                duplicate: 0.02,
                reorder: 0.1,
                reorder_delay: Duration::from_micros(30),
                seed,
                ..LinkConfig::default()
            },
            mtu,
            full_csum: false,
            window,
        };
        run(sc).unwrap();
    }
}
