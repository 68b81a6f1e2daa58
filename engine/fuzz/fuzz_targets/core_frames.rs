//! Arbitrary frame sequences into a live core. The input is a series of records:
//! `[op: u8][len: u16 LE][bytes]`; op bit 0 advances time by 100 us first. Checksums are
//! off, so that the fuzzer reaches the state machines. Nothing may panic, and the
//! unexpected store stays within its bound.
#![no_main]

use emx::proto::{Addr, ChecksumMode, Core, CoreConfig, MacAddr, Time};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fuzz_target!(|data: &[u8]| {
    let cfg = CoreConfig {
        checksum: ChecksumMode::Off,
        max_peers: 4,
        unexpected_bytes: 4 * 40 * 1024,
        eager_threshold: 16 * 1024,
        ..CoreConfig::default()
    };
    let bound = cfg.unexpected_bytes;
    let mut core: Core<Vec<u8>, Vec<u8>> =
        Core::new(cfg, Addr::new(2, 0), MacAddr([2, 0, 0, 0, 0, 2]), 1, Time::ZERO).unwrap();
    core.add_peer(Addr::new(1, 0), MacAddr([2, 0, 0, 0, 0, 1])).unwrap();
    let mut now = Time::ZERO;
    core.post_recv(now, None, 0, 0, vec![0; 70_000], 0).unwrap();
    core.post_recv(now, Some(Addr::new(1, 0)), 5, !0, vec![0; 10], 1).unwrap();
    core.send(now, Addr::new(1, 0), 3, vec![7; 50_000], 2).unwrap();
    let mut buf = [0u8; 128];
    let mut rest = data;
    while rest.len() >= 3 {
        let op = rest[0];
        let len = (u16::from_le_bytes([rest[1], rest[2]]) as usize).min(rest.len() - 3);
        let frame = &rest[3..3 + len];
        rest = &rest[3 + len..];
        if op & 1 != 0 {
            now = now + Duration::from_micros(100);
            core.handle_timeout(now);
        }
        let _ = core.handle_frame(now, frame);
        while let Some(tx) = core.poll_transmit(now, &mut buf) {
            if let Some(p) = tx.payload {
                assert!(core.payload(&p).is_some());
            }
        }
        while core.poll_completion().is_some() {}
        assert!(core.unexpected_bytes() <= bound);
    }
});
