//! Fuzzing that runs in CI: the frame parser on arbitrary bytes, header round trips, and
//! arbitrary frame sequences (garbage and well-formed frames with arbitrary fields and
//! good checksums) fed into live cores, with restarts of the peer and its own frames held
//! back and replayed late among them, on a link that delivers a tenth of the frames late
//! (up to 150 ms, past the peer timeout). Nothing may panic, every frame refused is
//! counted as dropped (once), every frame a core sends parses, the unexpected store stays
//! bounded, and the cores can still talk afterwards (after a restart of the peer, when a
//! forged frame took one of its session's sequence numbers).

mod common;

use common::*;
use emx::proto::{Completion, CoreConfig, PeerId, Time};
use emx::sim::LinkConfig;
use emx::wire::{flags, DropReason, Frame, FrameType, Header, DEFAULT_ETHERTYPE, FRAME_HEADER_LEN};
use proptest::prelude::*;
use std::time::Duration;

fn parse(bytes: &[u8], require: bool) -> Result<Header, DropReason> {
    let f = Frame::new_checked(bytes)?;
    // Every accessor of a checked frame is safe to call.
    let _ = (f.dst_mac(), f.src_mac(), f.seq(), f.payload(), f.checksum());
    Header::parse(&f, DEFAULT_ETHERTYPE, require)
}

fn frame_type() -> impl Strategy<Value = FrameType> {
    prop_oneof![
        Just(FrameType::Hello),
        Just(FrameType::Ack),
        Just(FrameType::Eager),
        Just(FrameType::Rts),
        Just(FrameType::Pull),
        Just(FrameType::PullData),
        Just(FrameType::Notify),
        Just(FrameType::Pack),
        Just(FrameType::Withdraw),
    ]
}

/// Headers for the fuzzers: three in four shaped by their frame type as a live
/// session's are (the fields the type leaves unused zero, eager fragments on their
/// unit's grid, data within its message), so that most pass the wire checks and
/// reach the state machines; the rest with every field drawn freely, which the wire
/// checks mostly refuse. Either way the numbers (epochs, sequence numbers, message
/// ids, lengths, offsets) come from small domains around what a session uses, or
/// from anywhere. [`the_header_generator_reaches_every_frame_type`] checks the mix.
fn header() -> impl Strategy<Value = Header> {
    prop_oneof![3 => shaped_header(), 1 => free_header()]
}

fn shaped_header() -> impl Strategy<Value = Header> {
    let shape = (
        prop_oneof![Just(64u16), Just(1000), Just(1424), 64u16..1500],
        prop_oneof![Just(0u64), 1u64..70_000],
        any::<u64>(),
        1u16..1500,
    );
    (free_header(), shape).prop_map(|(mut h, (unit, len, k, plen))| {
        h.flags &= flags::ALL;
        if h.frame_type != FrameType::Notify {
            // (Only a NOTIFY may say its message was withdrawn.)
            h.flags &= !flags::WITHDRAWN;
        }
        h.frag_unit = 0;
        h.frag_offset = 0;
        h.payload_len = 0;
        match h.frame_type {
            FrameType::Hello | FrameType::Ack => {
                h.seq = 0;
                h.msg_len = 0;
            }
            FrameType::Notify | FrameType::Withdraw => h.msg_len = 0,
            FrameType::Eager => {
                // Fragment k of a message of `len` bytes in `unit`s.
                let unit64 = u64::from(unit);
                h.frag_unit = unit;
                h.msg_len = len;
                if len > 0 {
                    h.frag_offset = k % len.div_ceil(unit64) * unit64;
                    h.payload_len = (len - h.frag_offset).min(unit64) as u16;
                }
            }
            FrameType::PullData => {
                // Any bytes of the message, at most a unit of them.
                let len = len.max(1);
                h.frag_unit = unit;
                h.msg_len = len;
                h.frag_offset = k % len;
                h.payload_len = (len - h.frag_offset).min(u64::from(unit.min(plen))) as u16;
            }
            FrameType::Rts => {
                h.frag_unit = unit;
                h.msg_len = len;
            }
            FrameType::Pull => {
                h.msg_len = len.max(1);
                h.frag_offset = k % 70_000;
            }
            // A PACK's payload is its records: see `Op::Pack`.
            FrameType::Pack => {}
        }
        if h.frame_type.is_reliable() && h.dst_epoch == 0 {
            h.dst_epoch = 1;
        }
        if h.src_epoch == 0 {
            h.src_epoch = 1;
        }
        h
    })
}

/// Headers with every field drawn freely (from small domains or anywhere).
fn free_header() -> impl Strategy<Value = Header> {
    (
        (
            frame_type(),
            prop_oneof![
                Just(flags::CSUM_HEADER),
                Just(flags::CSUM_HEADER | flags::ACK_REQ),
                any::<u8>()
            ],
        ),
        prop_oneof![Just(1u32), Just(2), Just(0), any::<u32>()],
        prop_oneof![Just(1u32), Just(0), any::<u32>()],
        prop_oneof![0u32..80, any::<u32>()],
        prop_oneof![0u32..80, any::<u32>()],
        any::<u64>(),
        any::<u32>(),
        0u32..8,
        0u64..4,
        prop_oneof![0u64..70_000, any::<u64>()],
        prop_oneof![0u64..70_000, any::<u64>()],
        (
            0u16..1500,
            prop_oneof![Just(0u16), Just(64), Just(1000), Just(1424), any::<u16>()],
        ),
    )
        .prop_map(
            |(
                (ft, fl),
                src_epoch,
                dst_epoch,
                seq,
                ack,
                sack,
                credit,
                msg_id,
                bits,
                msg_len,
                off,
                (plen, unit),
            )| Header {
                dst_mac: mac(1),
                src_mac: mac(0),
                frame_type: ft,
                flags: fl,
                cluster: 1,
                payload_len: plen,
                src_node: 1,
                src_ep: 0,
                dst_node: 2,
                dst_ep: 0,
                src_epoch,
                dst_epoch,
                seq,
                ack,
                sack,
                credit,
                msg_id,
                match_bits: bits,
                msg_len,
                frag_offset: off,
                frag_unit: unit,
            },
        )
}

#[derive(Debug, Clone)]
enum Op {
    Garbage(Vec<u8>),
    Frame(Header),
    /// A PACK of well-formed records (match bits, length) under an arbitrary header.
    Pack(Header, Vec<(u64, usize)>),
    Wait(u64),
    /// Core 0 restarts with this epoch (later, earlier or the same as before:
    /// epochs are serial numbers, and a clock may step back).
    Restart(u32),
    /// Core 0's next frame is held back (a switch buffer) instead of sent.
    Hold,
    /// A held frame (this index, modulo how many) reaches core 1, late.
    Replay(usize),
}

/// Emits `h` as a PACK of `records`, with a good checksum over them.
fn pack(h: &Header, records: &[(u64, usize)]) -> Vec<u8> {
    let mut payload = Vec::new();
    for &(bits, len) in records {
        let mut r = vec![0u8; emx::wire::PACK_RECORD_LEN + len];
        emx::wire::write_pack_record(&mut r, bits, &vec![0x3C; len]);
        payload.extend_from_slice(&r);
    }
    let mut h = *h;
    h.frame_type = FrameType::Pack;
    h.flags |= flags::CSUM_HEADER | flags::CSUM_PAYLOAD;
    h.match_bits = 0;
    h.frag_offset = 0;
    h.frag_unit = 0;
    h.msg_len = records.len() as u64;
    h.payload_len = payload.len() as u16;
    build(&h, &payload)
}

/// Hands `frame` to core 1: a frame refused is counted as dropped, once, and
/// one taken is not. Returns whether it was taken.
fn feed(sim: &mut TestSim, now: Time, frame: &[u8]) -> Result<bool, TestCaseError> {
    let before = drops(sim, 1);
    let r = sim.core(1).handle_frame(now, frame);
    let counted = drops(sim, 1) - before;
    prop_assert_eq!(counted, u64::from(r.is_err()), "{:?}", r);
    Ok(r.is_ok())
}

/// Frames core 1 took for duplicates of node 1's.
fn duplicates(sim: &TestSim) -> u64 {
    sim.core_ref(1).peer_stats(PeerId(0)).unwrap().duplicates
}

/// Whether the reliable frame of `epoch` that core 1 just took (with
/// `dups_before` duplicates counted before it) was taken as new in core 0's
/// current session: it then holds a sequence number core 0 has yet to send,
/// or has sent and is yet to arrive, and core 0's own frame of that number
/// will be a duplicate.
fn took_for_core_0(sim: &TestSim, epoch: u32, dups_before: u64) -> bool {
    let theirs = sim.core_ref(1).peer_info(PeerId(0)).map(|i| i.epoch);
    let current = sim.core_ref(0).epoch();
    epoch == current && theirs == Some(current) && duplicates(sim) == dups_before
}

/// An epoch for a restart of core 0: never one it had, or one core 1 took for
/// node 1's (the core's contract: a restart must change it, and one the peer
/// still knows would be taken for the old session).
fn fresh_epoch(used: &mut std::collections::BTreeSet<u32>, mut epoch: u32) -> u32 {
    while epoch == 0 || !used.insert(epoch) {
        epoch = epoch.wrapping_add(1);
    }
    epoch
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..160).prop_map(Op::Garbage),
        6 => header().prop_map(Op::Frame),
        2 => (header(), prop::collection::vec((0u64..4, 0usize..80), 1..20))
            .prop_map(|(h, r)| Op::Pack(h, r)),
        1 => (0u64..5_000).prop_map(Op::Wait),
        1 => prop_oneof![Just(1u32), Just(2), Just(0x8000_0001), 1u32..].prop_map(Op::Restart),
        1 => Just(Op::Hold),
        1 => (0usize..8).prop_map(Op::Replay),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn parser_never_panics(bytes in frame_bytes(), require in any::<bool>()) {
        if let Ok(h) = parse(&bytes, require) {
            // What parses re-emits to the same header.
            let plen = h.payload_len as usize;
            let v = build(&h, &bytes[FRAME_HEADER_LEN..FRAME_HEADER_LEN + plen]);
            if h.flags & flags::CSUM_HEADER != 0 {
                prop_assert_eq!(parse(&v, require), Ok(h));
            }
        }
    }

    #[test]
    fn header_round_trip(h in header()) {
        let payload = vec![0x5a; h.payload_len as usize];
        let v = build(&h, &payload);
        match parse(&v, true) {
            Ok(p) => prop_assert_eq!(p, h),
            Err(r) => prop_assert!(
                r != DropReason::Truncated
                    && (r != DropReason::Checksum || h.flags & flags::CSUM_HEADER == 0),
                "{:?} for a well-built frame", r),
        }
    }
}

/// Bytes for the parser: anything at all, or a well-built frame (of [`header`])
/// with a few bytes flipped, cut short or left whole, so that the parser's
/// every check, and the success path, are reached.
fn frame_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..300),
        3 => (
            header(),
            prop_oneof![
                2 => Just(Vec::new()),
                1 => prop::collection::vec((any::<usize>(), any::<u8>()), 1..3),
            ],
            prop_oneof![3 => Just(None), 1 => any::<usize>().prop_map(Some)],
        )
            .prop_map(|(h, flips, cut)| {
                let mut v = build(&h, &vec![0x5a; h.payload_len as usize]);
                for (at, x) in flips {
                    let n = v.len();
                    v[at % n] ^= x;
                }
                if let Some(c) = cut {
                    v.truncate(c % (v.len() + 1));
                }
                v
            }),
    ]
}

/// The generators reach what they are for: most headers parse, of every frame
/// type but PACK (whose payload is its records, built by [`pack`]), and a fair
/// share of the parser's inputs parse whole. (Of headers with every field drawn
/// freely, as all were once, 11 in 4,000 parsed.)
#[test]
fn the_header_generator_reaches_every_frame_type() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let n = 4000;
    let mut parsed = std::collections::BTreeMap::<String, u32>::new();
    let mut ok = 0;
    for _ in 0..n {
        let h = header().new_tree(&mut runner).unwrap().current();
        let v = build(&h, &vec![0x5a; h.payload_len as usize]);
        if parse(&v, true).is_ok() {
            ok += 1;
            *parsed.entry(format!("{:?}", h.frame_type)).or_default() += 1;
        }
    }
    assert!(ok * 2 > n, "{ok} of {n} headers parse: {parsed:?}");
    for ft in [
        "Hello", "Ack", "Eager", "Rts", "Pull", "PullData", "Notify", "Withdraw",
    ] {
        let got = parsed.get(ft).copied().unwrap_or(0);
        assert!(got >= n / 40, "{got} {ft} headers of {n} parse: {parsed:?}");
    }
    let mut whole = 0;
    for _ in 0..n {
        let bytes = frame_bytes().new_tree(&mut runner).unwrap().current();
        if parse(&bytes, true).is_ok() {
            whole += 1;
        }
    }
    assert!(whole * 8 > n, "{whole} of {n} parser inputs parse");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_frame_sequences_into_a_core(
        ops in prop::collection::vec(op(), 0..120),
        seed in any::<u64>(),
    ) {
        let cfg = CoreConfig {
            unexpected_bytes: 64 * 40 * 1024,
            keepalive: Duration::from_millis(1),
            peer_timeout: Duration::from_millis(100),
            ..CoreConfig::default()
        };
        // Some genuine frames arrive late, past the peer timeout: after the
        // session they belonged to was given up, or its sender restarted.
        let link = LinkConfig {
            late: 0.1,
            late_delay: Duration::from_millis(150),
            seed,
            ..LinkConfig::default()
        };
        let mut sim = make_sim(2, link, &cfg);
        // A live session with a little of everything in flight on core 1.
        let now = sim.now();
        let any = sim.core(1).post_recv(now, None, 0, 0, vec![0; 100_000], 1).unwrap();
        sim.core(1).post_recv(now, Some(addr(0)), 1, !0, vec![0; 10], 2).unwrap();
        sim.core(1).send(now, addr(0), 3, vec![7; 200_000], 3).unwrap();
        sim.core(1).send(now, addr(0), 4, vec![8; 100], 4).unwrap();
        sim.run_until(Time::from_micros(40), |_| false);

        let mut count = 0u64;
        let mut hdr = [0u8; 128];
        let mut used = std::collections::BTreeSet::from([1u32]);
        let mut held: Vec<Vec<u8>> = Vec::new();
        let mut impersonated = false;
        for op in ops {
            let now = sim.now();
            match op {
                Op::Garbage(b) => {
                    feed(&mut sim, now, &b)?;
                }
                Op::Frame(h) => {
                    let payload = vec![0xA5; h.payload_len as usize];
                    let dups = duplicates(&sim);
                    if feed(&mut sim, now, &build(&h, &payload))?
                        && h.frame_type.is_reliable()
                        && took_for_core_0(&sim, h.src_epoch, dups)
                    {
                        impersonated = true;
                    }
                }
                Op::Pack(h, records) => {
                    let dups = duplicates(&sim);
                    if feed(&mut sim, now, &pack(&h, &records))?
                        && took_for_core_0(&sim, h.src_epoch, dups)
                    {
                        impersonated = true;
                    }
                }
                Op::Wait(us) => {
                    let t = now + Duration::from_micros(us);
                    sim.run_until(t, |_| false);
                }
                Op::Hold => {
                    if let Some(f) = take_frame(&mut sim, 0) {
                        held.push(f);
                    }
                }
                Op::Replay(i) => {
                    if !held.is_empty() {
                        let f = held[i % held.len()].clone();
                        feed(&mut sim, now, &f)?;
                    }
                }
                Op::Restart(epoch) => {
                    let epoch = fresh_epoch(&mut used, epoch);
                    sim.replace_core(0, make_core(&cfg, 0, 2, epoch, now));
                    // A new session, which no forged frame touched yet.
                    impersonated = false;
                }
            }
            // Core 1 answers whatever it wants; those frames are checked and dropped.
            let core = sim.core(1);
            while let Some(tx) = core.poll_transmit(now, &mut hdr) {
                count += 1;
                prop_assert!(count < 1_000_000, "transmit loop");
                let mut frame = hdr[..tx.header_len].to_vec();
                if let Some(p) = tx.payload {
                    let bytes = core.payload(&p);
                    prop_assert!(bytes.is_some());
                    frame.extend_from_slice(bytes.unwrap());
                }
                let h = parse(&frame, true);
                prop_assert!(
                    h.is_ok_and(|h| (h.src_node, h.dst_node) == (2, 1)),
                    "core 1 sent {:?}", h
                );
            }
            while core.poll_completion().is_some() {}
            prop_assert!(core.unexpected_bytes() <= cfg.unexpected_bytes);
            // An epoch that core 1 took for node 1's, from a forged frame
            // as from a genuine one, is one node 1 has had as far as core 1
            // knows: a restart must not come back with it (a forged PACK of
            // epoch 2, then a restart at epoch 2, had the restarted core's
            // first message taken for a duplicate of a forged one).
            if let Some(info) = core.peer_info(PeerId(0)).filter(|i| i.epoch != 0) {
                used.insert(info.epoch);
            }
        }
        // Afterwards the pair still talks, or has given up on the session and talks
        // once told to try again (forged frames may end a session: raw Ethernet has
        // no authentication, and a forged ack of a frame the peer never got stalls
        // it until the progress deadline gives up on it).
        let end = sim.now() + Duration::from_secs(1);
        sim.run_until(end, |sim| {
            drain(sim);
            false
        });
        // (The any-source receive would take the messages below.)
        let _ = sim.core(1).cancel(any);
        if let Err(e) = talks_again(&mut sim) {
            // Unless core 1 took a forged frame for one of core 0's current
            // session: core 0's own frame of that sequence number was then a
            // duplicate, and its message was lost with nothing failing, as it
            // must be without authentication. A new session heals that.
            prop_assert!(impersonated, "{}", e);
            let now = sim.now();
            let epoch = fresh_epoch(&mut used, 0x4000_0000);
            sim.replace_core(0, make_core(&cfg, 0, 2, epoch, now));
            if let Err(again) = talks_again(&mut sim) {
                prop_assert!(false, "{}; and after core 0 restarted: {}", e, again);
            }
        }
    }
}

/// Sends a rendezvous message from core 0 to core 1 and an eager one back, each
/// into a receive posted for it, in rounds of at most a second of virtual time (the
/// tests' peer timeout is 100 ms). A round where a request fails (the session was
/// given up or restarted) is followed by another, after cancelling its receives and
/// reconnecting whichever side declared the other unreachable; the messages keep
/// their tags, so one that the last round's receive missed is taken by the next.
/// Within three rounds both receives must get their bytes, and then every send must
/// finish. A round in which nothing fails and nothing arrives is a stall.
fn talks_again(sim: &mut TestSim) -> Result<(), String> {
    let mut t = Tally::default();
    for round in 0..3u64 {
        let now = sim.now();
        for i in 0..2 {
            sim.core(i).reconnect(now, PeerId(0));
        }
        t.got = 0;
        t.failed.clear();
        t.recvs.clear();
        for (from, len) in SIZES.iter().copied().enumerate() {
            let to = 1 - from;
            let id = sim
                .core(to)
                .post_recv(now, Some(addr(from)), TAG, !0, vec![0; len], from as u64)
                .map_err(|e| format!("round {round}: receive refused: {:?}", e.error))?;
            t.recvs.push((to, id));
            sim.core(from)
                .send(now, addr(to), TAG, pattern(TAG, len), SEND)
                .map_err(|e| format!("round {round}: send refused: {:?}", e.error))?;
            t.sends += 1;
        }
        let deadline = now + Duration::from_secs(1);
        if sim.run_until(deadline, |sim| t.take(sim) && t.got == 2) {
            // Both arrived: every send still out (this round's, and any of an earlier
            // one that a receive here took) finishes.
            let deadline = sim.now() + Duration::from_secs(1);
            return match sim.run_until(deadline, |sim| t.take(sim) && t.sends == 0) {
                true => Ok(()),
                false => Err(format!("{} sends never finished", t.sends)),
            };
        }
        if t.failed.is_empty() {
            // (Its receives go, so that a later call's messages find its own.)
            for &(core, id) in &t.recvs {
                let _ = sim.core(core).cancel(id);
            }
            t.take(sim);
            return Err(format!(
                "round {round}: {} of 2 messages arrived in 1 s and nothing failed; \
                 core 0 sees {:?}, core 1 sees {:?}",
                t.got,
                sim.core_ref(0).peer_info(PeerId(0)),
                sim.core_ref(1).peer_info(PeerId(0))
            ));
        }
        for &(core, id) in &t.recvs {
            let _ = sim.core(core).cancel(id);
        }
        t.take(sim);
    }
    Err("three rounds failed".into())
}

const SIZES: [usize; 2] = [70_000, 100];
const TAG: u64 = 1000;
const SEND: u64 = 20;

/// What [`talks_again`]'s requests came to.
#[derive(Default)]
struct Tally {
    /// Its sends not finished yet (they finish in any round).
    sends: usize,
    /// This round's receives.
    recvs: Vec<(usize, emx::proto::RequestId)>,
    /// How many of them got their bytes.
    got: usize,
    /// What failed this round.
    failed: Vec<String>,
}

impl Tally {
    /// Takes every completion; other requests' are dropped. Always true.
    fn take(&mut self, sim: &mut TestSim) -> bool {
        for (core, c) in drain(sim) {
            match c {
                Completion::Send(s) if s.ctx == SEND => {
                    self.sends -= 1;
                    if let Err(e) = s.result {
                        self.failed.push(format!("core {core} send: {e}"));
                    }
                }
                Completion::Recv(r) if self.recvs.contains(&(core, r.req)) => match r.result {
                    Ok(_) => {
                        assert!(r.buf == pattern(TAG, SIZES[r.ctx as usize]));
                        self.got += 1;
                    }
                    Err(e) => self.failed.push(format!("core {core} receive: {e}")),
                },
                _ => {}
            }
        }
        true
    }
}

/// Garbage and duplicates interleaved with a real transfer never break it.
#[test]
fn garbage_interleaved_with_traffic() {
    let cfg = CoreConfig::default();
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    let now = sim.now();
    sim.core(1)
        .post_recv(now, Some(addr(0)), 1, !0, vec![0; 500_000], 1)
        .unwrap();
    sim.core(0)
        .send(now, addr(1), 1, pattern(1, 500_000), 1)
        .unwrap();
    let mut rng = emx::sim::SimRng::new(3);
    let mut n = 0;
    let ok = sim.run_until(Time(1_000_000_000), |sim| {
        let now = sim.now();
        for _ in 0..3 {
            let len = rng.below(120) as usize;
            let mut g: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            if g.len() >= 14 {
                g[12..14].copy_from_slice(&DEFAULT_ETHERTYPE.to_be_bytes());
            }
            assert!(sim.core(1).handle_frame(now, &g).is_err());
        }
        for (_, c) in drain(sim) {
            match c {
                Completion::Recv(r) => assert!(r.buf == pattern(1, 500_000)),
                Completion::Send(s) => s.result.unwrap(),
            }
            n += 1;
        }
        n == 2
    });
    assert!(ok);
}

include!("../fuzz/core_setup.rs");

/// The `core_frames` fuzz target's seeds (`cargo run -p emx --example
/// fuzz_seeds` writes them) still reach the state machines: replayed as the
/// target replays them, they complete its receives and its send. Seeds that
/// stopped at the first header checks (a wire change since they were
/// recorded) fail here: record them again.
#[test]
fn the_fuzz_seeds_reach_the_state_machines() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/seeds/sequences");
    let mut completed = std::collections::BTreeMap::new();
    let mut unexpected = std::collections::BTreeMap::new();
    let mut packs = 0;
    let mut withdrawn = std::collections::BTreeMap::new();
    for name in ["session", "packed", "lossy", "silent", "withdrawn"] {
        let data = std::fs::read(format!("{dir}/{name}")).expect("the seed is there");
        // Records: [op][len: u16 LE][frame]; a frame's type is its byte 15.
        let mut at = 0;
        while let Some(len) = data.get(at + 1..at + 3) {
            let len = usize::from(u16::from_le_bytes([len[0], len[1]]));
            let pack = len > 15 && data[at + 3 + 15] == FrameType::Pack as u8;
            packs += usize::from(name == "packed" && pack);
            at += 3 + len;
        }
        let mut ok = Vec::new();
        let core = fuzz_replay(&data, |c| match c {
            Completion::Send(s) if s.result.is_ok() => ok.push(s.ctx),
            Completion::Recv(r) if r.result.is_ok() => ok.push(r.ctx),
            _ => {}
        });
        ok.sort();
        completed.insert(name, ok);
        unexpected.insert(name, core.stats().unexpected);
        withdrawn.insert(name, core.stats().withdrawn);
        // Every seed's peer answers to the end: silent but for its engine's
        // answers to keepalives, the last one's peer is still alive.
        let peer = core.peer_info(PeerId(0)).unwrap();
        assert!(!peer.dead, "{name}: the peer was given up");
    }
    // session: the rendezvous message pulled into the any-source receive,
    // the 6 B one into the other, the target's 50,000 B pulled by the peer.
    assert_eq!(completed["session"], [0, 1, 2], "{completed:?}");
    assert!(completed["packed"].contains(&0), "{completed:?}");
    // packed: the forty messages after the first arrive in PACKs, and wait
    // unexpected (the seed held no PACK while its recorder had room for a
    // header only).
    assert!(packs > 0, "no PACK in the packed seed");
    assert!(unexpected["packed"] >= 40, "{unexpected:?}");
    assert!(completed["lossy"].contains(&0), "{completed:?}");
    // withdrawn: the eager message into the any-source receive; the
    // rendezvous one left unexpected, then dropped as its sender asked.
    assert_eq!(completed["withdrawn"], [0], "{completed:?}");
    assert_eq!(withdrawn["withdrawn"], 1, "{withdrawn:?}");
}
