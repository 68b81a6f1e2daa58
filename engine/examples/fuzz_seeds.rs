//! Writes seed inputs for the `core_frames` fuzz target (`engine/fuzz`):
//! what a peer sends a core set up exactly as the target sets up its own,
//! recorded in the target's format (`[op: u8][len: u16 LE][frame]`, op bit 0
//! advancing the target's clock by 100 us first). The target's core is
//! replayed here call for call, so each recorded frame meets the state it
//! met when it was recorded: the fuzzer starts from whole sessions (hello,
//! eager and rendezvous messages both ways, acknowledgements, pulls,
//! retransmissions) instead of having to find their headers by chance.
//!
//! `cargo run -p emx --example fuzz_seeds -- engine/fuzz/seeds/sequences`
//!
//! It also writes the `frame_parser` target's seeds beside them
//! (`../frames/type_XX`): the first frame of each type that either side
//! sent, checksummed in full.
//!
//! The target's core and its replay are `fuzz/core_setup.rs`, included here
//! as there.

use std::collections::BTreeMap;
use std::time::Duration;

use emx::proto::{Addr, Core, MacAddr, Time};
use emx::wire::{flags, Frame, Header, DEFAULT_ETHERTYPE, FRAME_HEADER_LEN};

type TestCore = Core<Vec<u8>, Vec<u8>>;

const STEP: Duration = Duration::from_micros(100);

include!("../fuzz/core_setup.rs");

/// The next frame `core` sends, whole.
fn frame(core: &mut TestCore, now: Time) -> Option<Vec<u8>> {
    // Room for what a core writes behind the header (short payloads, PACK
    // records) in a 1500-byte MTU's frame: a header's room alone packed
    // nothing, and no seed held a PACK.
    let mut hdr = [0u8; 1514];
    let tx = core.poll_transmit(now, &mut hdr)?;
    let mut v = hdr[..tx.header_len].to_vec();
    if let Some(p) = tx.payload {
        v.extend_from_slice(core.payload(&p).expect("a payload the core holds"));
    }
    Some(v)
}

/// The first frame of each type seen, by type byte.
type FirstOfEach = BTreeMap<u8, Vec<u8>>;

fn keep_first(seen: &mut FirstOfEach, f: &[u8]) {
    if let Some(&t) = f.get(15) {
        seen.entry(t).or_insert_with(|| f.to_vec());
    }
}

/// `f` with its header and payload checksummed (the target's core sends
/// none: its checksums are off).
fn checksummed(f: &[u8]) -> Vec<u8> {
    let fr = Frame::new_checked(f).expect("a whole frame");
    let mut h = Header::parse(&fr, DEFAULT_ETHERTYPE, false).expect("a frame a core sent");
    h.flags |= flags::CSUM_HEADER | flags::CSUM_PAYLOAD;
    let payload = fr.payload();
    let mut v = vec![0u8; FRAME_HEADER_LEN + payload.len()];
    h.emit(&mut v, DEFAULT_ETHERTYPE);
    v[FRAME_HEADER_LEN..].copy_from_slice(payload);
    Frame::new_unchecked(&mut v[..]).fill_checksum(payload);
    v
}

/// A session between the peer (driven by `peer_setup`, called at each step
/// with the peer's clock and the step's number) and the target's
/// core, `drop_every`-th peer frame lost (0: none), until `steps` clock
/// steps passed: the peer's frames as the target's records. The first frame
/// of each type either side sent goes to `seen`.
fn record(
    mut peer_setup: impl FnMut(&mut TestCore, Time, usize),
    drop_every: usize,
    steps: usize,
    seen: &mut FirstOfEach,
) -> Vec<u8> {
    let mut target = fuzz_target_core();
    let mut peer: TestCore = Core::new(
        target.config().clone(),
        Addr::new(1, 0),
        MacAddr([2, 0, 0, 0, 0, 1]),
        7,
        Time::ZERO,
    )
    .unwrap();
    peer.add_peer(Addr::new(2, 0), MacAddr([2, 0, 0, 0, 0, 2]))
        .unwrap();
    // The peer's clock runs freely; the target's moves only with a record
    // whose op says so, as in the fuzz target.
    let (mut now, mut target_now) = (Time::ZERO, Time::ZERO);
    let mut out = Vec::new();
    let mut sent = 0usize;
    for step in 0..steps {
        peer_setup(&mut peer, now, step);
        // The target's clock catches up with a record of its own (an empty
        // frame, dropped as too short) when the peer has nothing to send.
        let mut frames = Vec::new();
        while let Some(f) = frame(&mut peer, now) {
            frames.push(f);
        }
        if frames.is_empty() && target_now < now {
            frames.push(Vec::new());
        }
        for f in frames {
            keep_first(seen, &f);
            sent += 1;
            if drop_every != 0 && sent % drop_every == 0 && !f.is_empty() {
                continue;
            }
            let advance = target_now < now;
            out.push(u8::from(advance));
            out.extend_from_slice(&(f.len() as u16).to_le_bytes());
            out.extend_from_slice(&f);
            // The target's calls, as the fuzz target makes them.
            if advance {
                target_now = target_now + STEP;
                target.handle_timeout(target_now);
            }
            let _ = target.handle_frame(target_now, &f);
            while let Some(back) = frame(&mut target, target_now) {
                keep_first(seen, &back);
                let _ = peer.handle_frame(now, &back);
            }
            while target.poll_completion().is_some() {}
        }
        while peer.poll_completion().is_some() {}
        now = now + STEP;
        peer.handle_timeout(now);
    }
    out
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "engine/fuzz/seeds/sequences".to_owned());
    std::fs::create_dir_all(&dir).unwrap();
    let to = Addr::new(2, 0);
    let mut seen = FirstOfEach::new();
    let seeds: [(&str, Vec<u8>); 5] = [
        (
            // A rendezvous message that the target's any-source receive
            // pulls, eager ones to its other receive and to its unexpected
            // store, another rendezvous one left there, and the target's
            // 50,000 bytes pulled by the peer.
            "session",
            record(
                |p, now, step| {
                    if step != 0 {
                        return;
                    }
                    p.send(now, to, 11, vec![4; 17_000], 0).unwrap();
                    p.send(now, to, 9, vec![2; 1000], 1).unwrap();
                    p.send(now, to, 5, vec![3; 6], 2).unwrap();
                    p.send(now, to, 12, vec![1; 20_000], 3).unwrap();
                    p.post_recv(now, Some(to), 3, !0, vec![0; 50_000], 4)
                        .unwrap();
                },
                0,
                200,
                &mut seen,
            ),
        ),
        (
            // Small messages packed several to a frame: one first, for the
            // greeting, then forty queued together once it is done (before
            // it, each leaves alone).
            "packed",
            record(
                |p, now, step| {
                    let batch = match step {
                        0 => 0..1,
                        10 => 1..41u8,
                        _ => return,
                    };
                    for i in batch {
                        p.send(now, to, 20 + u64::from(i), vec![i; 24], 0).unwrap();
                    }
                },
                0,
                60,
                &mut seen,
            ),
        ),
        (
            // The session with every fifth frame lost: retransmissions,
            // selective acknowledgements, fragments out of order.
            "lossy",
            record(
                |p, now, step| {
                    if step != 0 {
                        return;
                    }
                    p.send(now, to, 9, vec![5; 3_000], 0).unwrap();
                    p.send(now, to, 11, vec![6; 17_000], 1).unwrap();
                    p.post_recv(now, Some(to), 3, !0, vec![0; 50_000], 2)
                        .unwrap();
                },
                5,
                400,
                &mut seen,
            ),
        ),
        (
            // A peer that says nothing after its greeting: keepalives and the
            // liveness deadline.
            "silent",
            record(|_, _, _| {}, 0, 3000, &mut seen),
        ),
        (
            // A rendezvous message left unexpected at the target (its
            // any-source receive took an eager one first), then withdrawn
            // by the peer: WITHDRAW, and the NOTIFY that says the target
            // dropped it.
            "withdrawn",
            {
                let mut big = None;
                record(
                    |p, now, step| match step {
                        0 => {
                            p.send(now, to, 9, vec![2; 1000], 0).unwrap();
                            big = Some(p.send(now, to, 12, vec![1; 20_000], 1).unwrap());
                        }
                        20 => assert!(p.cancel(big.expect("sent")), "a rendezvous send"),
                        _ => {}
                    },
                    0,
                    60,
                    &mut seen,
                )
            },
        ),
    ];
    for (name, bytes) in seeds {
        let path = format!("{dir}/{name}");
        std::fs::write(&path, &bytes).unwrap();
        println!("{path}: {} bytes", bytes.len());
    }
    let frames = std::path::Path::new(&dir)
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join("frames");
    std::fs::create_dir_all(&frames).unwrap();
    for (t, f) in &seen {
        let path = frames.join(format!("type_{t:02x}"));
        std::fs::write(&path, checksummed(f)).unwrap();
        println!("{}: {} bytes", path.display(), f.len());
    }
}
