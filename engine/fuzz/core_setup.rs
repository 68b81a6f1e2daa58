// The core the `core_frames` fuzz target feeds, and how it feeds it: one
// definition, included (`include!`) by the target
// (`fuzz_targets/core_frames.rs`), by `examples/fuzz_seeds.rs`, which
// records the target's seeds against this core, and by
// `tests/fuzz_frames.rs`, which checks on stable that the seeds still reach
// it.

/// A core at node 2 endpoint 0 with one peer (node 1), checksums off (so
/// that arbitrary bytes reach the state machines), a receive from any source
/// (70,000 bytes), one from the peer for match bits 5 (10 bytes), and a
/// 50,000-byte send to the peer, all at time zero.
#[allow(dead_code)]
fn fuzz_target_core() -> emx::proto::Core<Vec<u8>, Vec<u8>> {
    use emx::proto::{Addr, ChecksumMode, Core, CoreConfig, MacAddr, Time};
    let cfg = CoreConfig {
        checksum: ChecksumMode::Off,
        max_peers: 4,
        unexpected_bytes: 4 * 40 * 1024,
        eager_threshold: 16 * 1024,
        ..CoreConfig::default()
    };
    let now = Time::ZERO;
    let mut core = Core::new(cfg, Addr::new(2, 0), MacAddr([2, 0, 0, 0, 0, 2]), 1, now).unwrap();
    core.add_peer(Addr::new(1, 0), MacAddr([2, 0, 0, 0, 0, 1]))
        .unwrap();
    core.post_recv(now, None, 0, 0, vec![0; 70_000], 0).unwrap();
    core.post_recv(now, Some(Addr::new(1, 0)), 5, !0, vec![0; 10], 1)
        .unwrap();
    core.send(now, Addr::new(1, 0), 3, vec![7; 50_000], 2)
        .unwrap();
    core
}

/// Feeds `data` to a [`fuzz_target_core`]: a series of records
/// `[op: u8][len: u16 LE][frame]`, op bit 0 advancing the clock by 100 us
/// (and running the core's timers) first. After each frame the core's
/// transmissions are taken (each payload it names must be one it holds) and
/// its completions handed to `done`. Nothing may panic, and the unexpected
/// store stays within its bound. Returns the core as the records left it.
#[allow(dead_code)]
fn fuzz_replay(
    data: &[u8],
    mut done: impl FnMut(emx::proto::Completion<Vec<u8>, Vec<u8>>),
) -> emx::proto::Core<Vec<u8>, Vec<u8>> {
    let mut core = fuzz_target_core();
    let bound = core.config().unexpected_bytes;
    let mut now = emx::proto::Time::ZERO;
    let mut buf = [0u8; 128];
    let mut rest = data;
    while rest.len() >= 3 {
        let op = rest[0];
        let len = (u16::from_le_bytes([rest[1], rest[2]]) as usize).min(rest.len() - 3);
        let frame = &rest[3..3 + len];
        rest = &rest[3 + len..];
        if op & 1 != 0 {
            now = now + std::time::Duration::from_micros(100);
            core.handle_timeout(now);
        }
        let _ = core.handle_frame(now, frame);
        while let Some(tx) = core.poll_transmit(now, &mut buf) {
            if let Some(p) = tx.payload {
                assert!(core.payload(&p).is_some());
            }
        }
        while let Some(c) = core.poll_completion() {
            done(c);
        }
        assert!(core.unexpected_bytes() <= bound);
    }
    core
}
