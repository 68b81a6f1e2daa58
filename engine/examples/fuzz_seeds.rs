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
//! The target's core and its replay are `fuzz/core_setup.rs`, included here
//! as there.

use std::time::Duration;

use emx::proto::{Addr, Core, MacAddr, Time};

type TestCore = Core<Vec<u8>, Vec<u8>>;

const STEP: Duration = Duration::from_micros(100);

include!("../fuzz/core_setup.rs");

/// The next frame `core` sends, whole.
fn frame(core: &mut TestCore, now: Time) -> Option<Vec<u8>> {
    let mut hdr = [0u8; 128];
    let tx = core.poll_transmit(now, &mut hdr)?;
    let mut v = hdr[..tx.header_len].to_vec();
    if let Some(p) = tx.payload {
        v.extend_from_slice(core.payload(&p).expect("a payload the core holds"));
    }
    Some(v)
}

/// A session between the peer (set up by `peer_setup`) and the target's
/// core, `drop_every`-th peer frame lost (0: none), until `steps` clock
/// steps passed: the peer's frames as the target's records.
fn record(peer_setup: impl FnOnce(&mut TestCore), drop_every: usize, steps: usize) -> Vec<u8> {
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
    peer_setup(&mut peer);
    // The peer's clock runs freely; the target's moves only with a record
    // whose op says so, as in the fuzz target.
    let (mut now, mut target_now) = (Time::ZERO, Time::ZERO);
    let mut out = Vec::new();
    let mut sent = 0usize;
    for _ in 0..steps {
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
    let seeds: [(&str, Vec<u8>); 4] = [
        (
            // A rendezvous message that the target's any-source receive
            // pulls, eager ones to its other receive and to its unexpected
            // store, another rendezvous one left there, and the target's
            // 50,000 bytes pulled by the peer.
            "session",
            record(
                |p| {
                    let now = Time::ZERO;
                    p.send(now, to, 11, vec![4; 17_000], 0).unwrap();
                    p.send(now, to, 9, vec![2; 1000], 1).unwrap();
                    p.send(now, to, 5, vec![3; 6], 2).unwrap();
                    p.send(now, to, 12, vec![1; 20_000], 3).unwrap();
                    p.post_recv(now, Some(to), 3, !0, vec![0; 50_000], 4)
                        .unwrap();
                },
                0,
                200,
            ),
        ),
        (
            // Small messages packed several to a frame.
            "packed",
            record(
                |p| {
                    for i in 0..40u8 {
                        p.send(Time::ZERO, to, 20 + u64::from(i), vec![i; 24], 0)
                            .unwrap();
                    }
                },
                0,
                60,
            ),
        ),
        (
            // The session with every fifth frame lost: retransmissions,
            // selective acknowledgements, fragments out of order.
            "lossy",
            record(
                |p| {
                    let now = Time::ZERO;
                    p.send(now, to, 9, vec![5; 3_000], 0).unwrap();
                    p.send(now, to, 11, vec![6; 17_000], 1).unwrap();
                    p.post_recv(now, Some(to), 3, !0, vec![0; 50_000], 2)
                        .unwrap();
                },
                5,
                400,
            ),
        ),
        (
            // A peer that says nothing after its greeting: keepalives and the
            // liveness deadline.
            "silent",
            record(|_| {}, 0, 3000),
        ),
    ];
    for (name, bytes) in seeds {
        let path = format!("{dir}/{name}");
        std::fs::write(&path, &bytes).unwrap();
        println!("{path}: {} bytes", bytes.len());
    }
}
