//! Rendezvous pulls ask for whole frame payloads: `pull_block` is an upper bound that
//! the receiver rounds down, so that only a message's last frame may be short.

mod common;

use common::*;
use emx::proto::{Completion, CoreConfig, PeerId, Time};
use emx::sim::LinkConfig;

#[test]
fn effective_pull_block_is_whole_frames() {
    let cfg = CoreConfig::default();
    assert_eq!(cfg.frame_payload(), 1424);
    assert_eq!(cfg.effective_pull_block(), 184 * 1424);
    let jumbo = CoreConfig {
        mtu: 9000,
        ..CoreConfig::default()
    };
    assert_eq!(jumbo.effective_pull_block(), 29 * 8924);
    // A bound that is whole frames already stays; one below a frame is raised to one.
    for (block, want) in [
        (3 * 1424, 3 * 1424),
        (1424, 1424),
        (1000, 1424),
        (2847, 1424),
    ] {
        let c = CoreConfig {
            pull_block: block,
            ..CoreConfig::default()
        };
        assert_eq!(c.effective_pull_block(), want, "pull_block {block}");
    }
}

/// By default one receive's pulls ask for at least a send window of frames, with
/// jumbo frames too: a lone message then streams as fast as many do. (With 64 KiB
/// blocks, 7 jumbo frames each, four pulls asked for 28 frames of a 64-frame window,
/// and a 4 MiB ping-pong on memif ran at half a stream's rate.)
#[test]
fn a_lone_receives_pulls_cover_the_send_window() {
    for mtu in [1500, 9000] {
        let cfg = CoreConfig {
            mtu,
            ..CoreConfig::default()
        };
        let per_block = cfg.effective_pull_block() as usize / cfg.frame_payload();
        let frames = per_block * usize::from(cfg.pull_inflight);
        assert!(
            frames >= cfg.window as usize,
            "MTU {mtu}: {frames} frames pulled at once, window {}",
            cfg.window
        );
    }
}

/// Sends one message by rendezvous on a clean link and returns the data frames the
/// sender sent (every reliable frame but the RTS).
fn data_frames(cfg: CoreConfig, len: usize) -> u64 {
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    sim.core(1)
        .post_recv(Time::ZERO, Some(addr(0)), 5, !0, vec![0; len], 0)
        .unwrap();
    sim.core(0)
        .send(Time::ZERO, addr(1), 5, pattern(9, len), 0)
        .unwrap();
    let mut done = 0;
    let ok = sim.run_until(Time(1_000_000_000), |sim| {
        for (_, c) in drain(sim) {
            if let Completion::Recv(r) = &c {
                r.result.unwrap();
                assert!(r.buf == pattern(9, len));
            }
            done += 1;
        }
        done == 2
    });
    assert!(ok);
    let s = sim.core_ref(0).peer_stats(PeerId(0)).unwrap();
    assert_eq!(s.retransmits, 0);
    s.frames_sent - s.acks_sent - s.hellos_sent - 1
}

#[test]
fn no_block_ends_in_a_short_frame() {
    // One pull at a time is the worst case: the sender catches up with every block.
    for (mtu, pull_inflight) in [(1500usize, 4u8), (9000, 4), (1500, 1), (9000, 1)] {
        let cfg = CoreConfig {
            mtu,
            pull_inflight,
            ..CoreConfig::default()
        };
        let fp = cfg.frame_payload();
        for len in [1usize << 20, 3 << 20 | 12345] {
            // As many frames as the message needs, not one more per block.
            assert_eq!(
                data_frames(cfg.clone(), len),
                len.div_ceil(fp) as u64,
                "mtu {mtu}, {pull_inflight} pulls in flight, {len} bytes"
            );
        }
    }
}

/// A sender whose MTU is below its receiver's cuts its messages at its own
/// frame payload, which its frames name, and the receiver pulls whole units
/// of it: eager and rendezvous, through loss and reordering. (The other way
/// round, the larger frames do not fit the receiver's port, in the sim as on
/// a wire: nothing negotiates an MTU, and cluster files require equal ones.)
#[test]
fn a_sender_with_a_smaller_mtu() {
    let small = CoreConfig::default();
    let big = CoreConfig {
        mtu: 9000,
        ..CoreConfig::default()
    };
    let link = LinkConfig {
        loss: 0.05,
        reorder: 0.05,
        late: 0.01,
        seed: 11,
        ..LinkConfig::default()
    };
    let mut sim: TestSim = emx::sim::Sim::new(link);
    sim.add_core(make_core(&small, 0, 2, 1, Time::ZERO));
    sim.add_core(make_core(&big, 1, 2, 1, Time::ZERO));
    for (tag, len) in [20_000, 1 << 20, 3 << 20 | 77].into_iter().enumerate() {
        transfer(&mut sim, 0, 1, len, tag as u64 + 1);
    }
    assert_eq!(sim.stats().oversize, 0);
}

/// Eager messages of more fragments than a message's record of them holds
/// past a gap (64): at MTU 300 a 32 KiB message is 147 fragments, and with
/// a window above 64 frames, through loss, some arrive too far ahead, are
/// refused for now and come again. Every message still arrives whole.
#[test]
fn eager_messages_of_many_fragments_through_loss() {
    let cfg = CoreConfig {
        mtu: 300,
        window: 256,
        ..CoreConfig::default()
    };
    let link = LinkConfig {
        loss: 0.1,
        reorder: 0.05,
        seed: 5,
        ..LinkConfig::default()
    };
    let mut sim: TestSim = make_sim(2, link, &cfg);
    for tag in 1..=6 {
        transfer(
            &mut sim,
            tag as usize % 2,
            1 - tag as usize % 2,
            32 << 10,
            tag,
        );
    }
    let refused: u64 = (0..2)
        .map(|i| {
            let s = sim.core_ref(i).peer_stats(PeerId(0)).unwrap();
            s.dropped.get(emx::proto::DropReason::Resources)
        })
        .sum();
    assert!(
        refused > 0,
        "no fragment came too far ahead: the test tests nothing"
    );
}

/// NOTIFYs waiting for a closed window fill the frame table: a receiver that
/// binds many announced messages to zero-length receives while its peer is
/// off its CPU. The NOTIFYs and pulls that then find no frame wait for one,
/// and every send and receive completes once the peer is back. (They used to
/// be dropped: those sends, and receives with no pull in flight, never
/// completed.)
#[test]
fn notifies_and_pulls_that_find_the_frame_table_full_wait_for_frames() {
    const N: u64 = 120;
    const FULL: u64 = 10;
    const LEN: usize = 100;
    let cfg = CoreConfig {
        max_peers: 2,
        max_recvs: 2,
        max_sends: 256,
        window: 4,
        pull_inflight: 1,
        eager_threshold: 64,
        ..CoreConfig::default()
    };
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    // The table holds 2 windows, 2 receives' pulls and NOTIFYs, and 64 more.
    let now = sim.now();
    for k in 0..N {
        sim.core(0)
            .send(now, addr(1), k, pattern(k, LEN), k)
            .unwrap();
    }
    let deadline = now + std::time::Duration::from_secs(1);
    assert!(
        sim.run_until(deadline, |sim| sim.core_ref(1).stats().unexpected >= N),
        "every RTS arrived"
    );
    // The sender is off its CPU: the receiver's NOTIFYs fill its window,
    // then the table, then wait.
    sim.set_paused(0, true);
    let now = sim.now();
    for k in 0..N {
        let buf = if k >= N - FULL {
            vec![0; LEN]
        } else {
            Vec::new()
        };
        // (one receive at a time fits `max_recvs`: the truncating ones
        // complete at once)
        let r = sim.core(1).post_recv(now, Some(addr(0)), k, !0, buf, k);
        assert!(r.is_ok(), "receive {k} posted");
        if k >= N - FULL {
            break;
        }
    }
    let mut posted = N - FULL + 1;
    let paused_at = sim.now();
    sim.run_until(paused_at + std::time::Duration::from_micros(500), |_| false);
    sim.set_paused(0, false);
    let (mut sends, mut recvs) = (0u64, 0u64);
    let deadline = sim.now() + std::time::Duration::from_secs(2);
    let ok = sim.run_until(deadline, |sim| {
        for (i, c) in drain(sim) {
            match c {
                Completion::Send(s) => {
                    assert!(s.result.is_ok(), "send {}: {:?}", s.ctx, s.result);
                    sends += 1;
                }
                Completion::Recv(r) => {
                    assert_eq!(i, 1);
                    assert!(r.result.is_ok(), "receive {}: {:?}", r.ctx, r.result);
                    if r.ctx >= N - FULL {
                        assert!(r.buf == pattern(r.ctx, LEN), "message {} intact", r.ctx);
                    }
                    recvs += 1;
                }
            }
        }
        // The full receives go one after another.
        while posted < N && recvs == posted {
            let now = sim.now();
            sim.core(1)
                .post_recv(now, Some(addr(0)), posted, !0, vec![0; LEN], posted)
                .unwrap();
            posted += 1;
        }
        sends == N && recvs == N
    });
    assert!(
        ok,
        "sends {sends}/{N}, receives {recvs}/{N} at {:?}",
        sim.now()
    );
}

/// A rendezvous message into a smaller receive: the receiver pulls only what
/// it keeps, in whole units but the last, and both sides complete, through
/// loss, duplication and reordering too. Buffers below one unit, of whole
/// units and of none at all.
#[test]
fn truncating_receives_pull_only_what_they_keep() {
    let cfg = CoreConfig::default();
    let unit = cfg.frame_payload();
    let len = 1 << 20;
    let clean = LinkConfig::default();
    let lossy = LinkConfig {
        loss: 0.05,
        reorder: 0.05,
        duplicate: 0.02,
        late: 0.01,
        seed: 17,
        ..LinkConfig::default()
    };
    for (li, link) in [clean, lossy].into_iter().enumerate() {
        let mut sim = make_sim(2, link, &cfg);
        for (tag, buf_len) in [0, 100, unit, 3 * unit, 3 * unit + 1, len - 1]
            .into_iter()
            .enumerate()
        {
            let tag = tag as u64 + 1;
            let before = reliable_sent(&sim);
            let now = sim.now();
            sim.core(1)
                .post_recv(now, Some(addr(0)), tag, !0, vec![0xEE; buf_len], 0)
                .unwrap();
            sim.core(0)
                .send(now, addr(1), tag, pattern(tag, len), 0)
                .unwrap();
            let mut done = 0;
            let deadline = sim.now() + std::time::Duration::from_secs(2);
            let ok = sim.run_until(deadline, |sim| {
                for (_, c) in drain(sim) {
                    match c {
                        Completion::Send(s) => s.result.unwrap(),
                        Completion::Recv(r) => {
                            let info = r.result.unwrap();
                            assert_eq!(info.msg_len, len as u64);
                            assert_eq!(info.copied, buf_len as u64);
                            assert!(info.truncated);
                            assert!(r.buf == pattern(tag, len)[..buf_len]);
                        }
                    }
                    done += 1;
                }
                done == 2
            });
            assert!(ok, "link {li}: {buf_len} of {len} bytes did not finish");
            if li == 0 {
                // The RTS, then the data frames the receive keeps.
                let data = reliable_sent(&sim) - before - 1;
                assert_eq!(data, buf_len.div_ceil(unit) as u64, "{buf_len} bytes kept");
            }
        }
        if li == 1 {
            let st = sim.stats();
            assert!(
                st.lost > 0 && st.duplicated > 0 && st.reordered > 0,
                "{st:?}"
            );
        }
        // Nothing left behind on either side.
        for i in 0..2 {
            assert_eq!(sim.core_ref(i).outstanding(), 0, "link {li}, core {i}");
        }
    }
}

/// Reliable frames core 0 sent its peer: all but acknowledgements and HELLOs.
fn reliable_sent(sim: &TestSim) -> u64 {
    let s = sim.core_ref(0).peer_stats(PeerId(0)).unwrap();
    s.frames_sent - s.acks_sent - s.hellos_sent
}
