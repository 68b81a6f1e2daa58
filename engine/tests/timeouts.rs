//! The retransmission timeout against a peer that is only slow (a descheduled
//! thread: nothing is lost, it answers late) and against a link that lost a
//! whole window: the first costs a probe per timeout, not a window; the second
//! recovers every frame one round trip after the probe gets through. On a link
//! that lost frames lately, a timeout sends the whole flight again at once.

mod common;

use common::*;
use emx::proto::{CoreConfig, PeerId, PeerStats, Time};
use emx::sim::LinkConfig;
use std::time::Duration;

/// Messages in the window: one full frame each (too long to be packed).
const N: u64 = 48;
const LEN: usize = 1400;

/// Two cores that have exchanged a message (so the sender has an RTT sample),
/// with `N` receives posted at core 1. Their timeout is at least 200 us (the
/// default is 1 ms), the figure the times below are written for.
fn ready() -> (TestSim, CoreConfig) {
    let cfg = CoreConfig {
        rto_min: Duration::from_micros(200),
        ..CoreConfig::default()
    };
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    transfer(&mut sim, 0, 1, 1000, 1);
    let now = sim.now();
    for k in 0..N {
        sim.core(1)
            .post_recv(now, Some(addr(0)), 100 + k, !0, vec![0; LEN], 100 + k)
            .unwrap();
    }
    (sim, cfg)
}

/// Sends the `N` messages from core 0.
fn send_all(sim: &mut TestSim) {
    let now = sim.now();
    for k in 0..N {
        sim.core(0)
            .send(now, addr(1), 100 + k, pattern(100 + k, LEN), 100 + k)
            .unwrap();
    }
}

/// Runs until all `N` sends and receives finished, byte-exact; returns when.
fn finish(sim: &mut TestSim, deadline: Time) -> Time {
    await_exchange(sim, deadline, N, |_, r| {
        r.result.unwrap();
        assert!(r.buf == pattern(r.ctx, LEN), "message {} intact", r.ctx);
    });
    sim.now()
}

fn sender_stats(sim: &TestSim) -> PeerStats {
    *sim.core_ref(0).peer_stats(PeerId(0)).unwrap()
}

#[test]
fn a_slow_peer_costs_one_probe_per_timeout_not_a_window() {
    let (mut sim, cfg) = ready();
    let before = sender_stats(&sim);
    // The receiver's thread is off its core for 3 ms: the sender's timer
    // fires three times (200, 400 and 800 us apart) while nothing is lost.
    sim.set_paused(1, true);
    send_all(&mut sim);
    let paused_at = sim.now();
    sim.run_until(paused_at + Duration::from_millis(3), |_| false);
    sim.set_paused(1, false);
    let deadline = sim.now() + Duration::from_millis(10);
    finish(&mut sim, deadline);
    let after = sender_stats(&sim);
    let timeouts = after.timeouts - before.timeouts;
    let retransmits = after.retransmits - before.retransmits;
    assert!(
        (2..=4).contains(&timeouts),
        "the timer fired {timeouts} times in 3 ms (rto_min {:?})",
        cfg.rto_min
    );
    // One frame a timeout; declaring the whole window lost each time sent
    // 48 frames a timeout again.
    assert!(
        retransmits <= timeouts,
        "{retransmits} frames sent again for {timeouts} timeouts"
    );
    // Nothing was lost: held while the receiver was off its core. (The link
    // loses nothing by itself here, so `lost` alone said nothing.)
    let s = sim.stats();
    assert_eq!((s.lost, s.undeliverable, s.oversize), (0, 0, 0), "{s:?}");
}

#[test]
fn a_lost_window_goes_again_once_the_probe_gets_through() {
    let (mut sim, _) = ready();
    let before = sender_stats(&sim);
    // Everything the sender sends for 1 ms is lost (acks still get back).
    sim.set_blocked(0, 1, true);
    send_all(&mut sim);
    let cut_at = sim.now();
    sim.run_until(cut_at + Duration::from_millis(1), |_| false);
    sim.set_blocked(0, 1, false);
    let healed = sim.now();
    let timeouts_cut = sender_stats(&sim).timeouts - before.timeouts;
    let done = finish(&mut sim, healed + Duration::from_millis(20));
    let after = sender_stats(&sim);
    let timeouts = after.timeouts - before.timeouts;
    let retransmits = after.retransmits - before.retransmits;
    // The next timeout's probe gets through; its acknowledgement, alone,
    // declares lost every frame sent before it, and they all go again at
    // once: one more timeout, not one per frame.
    assert_eq!(
        timeouts,
        timeouts_cut + 1,
        "timeouts: {timeouts_cut} during the cut, {timeouts} in all"
    );
    // Each frame went again once after the cut, plus the probes.
    assert!(
        retransmits <= N + timeouts,
        "{retransmits} frames sent again ({timeouts} timeouts)"
    );
    // The last timeout fired at most 1.6 ms (the backed-off timeout) after the
    // cut healed; after it, a round trip and the delayed ack.
    let took = done - healed;
    assert!(took < Duration::from_micros(1_800), "took {took:?}");
}

#[test]
fn on_a_link_that_lost_frames_lately_a_timeout_sends_the_whole_flight_again() {
    let (mut sim, _) = ready();
    // A transfer over a bad link first: acknowledgements show frames lost.
    sim.set_link(LinkConfig {
        loss: 0.2,
        ..LinkConfig::default()
    });
    transfer(&mut sim, 0, 1, 64 << 10, 2);
    sim.set_link(LinkConfig::default());
    let before = sender_stats(&sim);
    assert!(before.retransmits > 0, "the bad link lost frames");
    sim.set_blocked(0, 1, true);
    send_all(&mut sim);
    let cut_at = sim.now();
    // Past the first timeout only (200 us, then 400 us backed off).
    sim.run_until(cut_at + Duration::from_micros(500), |_| false);
    let first = sender_stats(&sim).timeouts - before.timeouts;
    // Every frame in flight waited a whole timeout: all declared lost at
    // once (credit let through at least half the messages).
    assert!(
        first >= N / 2,
        "the first timeout declared {first} frames lost"
    );
    sim.set_blocked(0, 1, false);
    let deadline = sim.now() + Duration::from_millis(20);
    finish(&mut sim, deadline);
}

/// One frame lost in the middle of a window is sent again once, on the
/// acknowledgements of the frames behind it (fast retransmit), well before
/// the retransmission timeout: the window finishes within 150 us of a
/// 5 us link (the timeout is 200 us), with no timeout and no other frame
/// sent again. Before this no test bounded the fast path of loss recovery.
#[test]
fn one_frame_lost_mid_window_goes_again_once_before_the_timeout() {
    let (mut sim, _) = ready();
    let before = sender_stats(&sim);
    send_all(&mut sim);
    let start = sim.now();
    // The first ten frames by hand, the fifth lost; the rest by the link.
    for k in 0..10 {
        let f = take_frame(&mut sim, 0).expect("a frame of the window");
        if k != 4 {
            let _ = sim.core(1).handle_frame(start, &f);
        }
    }
    let end = finish(&mut sim, start + Duration::from_millis(100));
    let after = sender_stats(&sim);
    assert_eq!(after.timeouts - before.timeouts, 0, "{after:?}");
    assert_eq!(after.retransmits - before.retransmits, 1, "{after:?}");
    assert!(
        end - start < Duration::from_micros(150),
        "{:?}",
        end - start
    );
}

/// A window of full frames with nothing lost is acknowledged in batches: an
/// acknowledgement every `ack_every` (16) frames, and the delayed one for
/// the rest, not one a frame. (The bound leaves room for the acks that give
/// credit back and for a PACK's count.)
#[test]
fn a_window_without_loss_is_acknowledged_in_batches() {
    let (mut sim, cfg) = ready();
    let before = *sim.core_ref(1).peer_stats(PeerId(0)).unwrap();
    send_all(&mut sim);
    let start = sim.now();
    finish(&mut sim, start + Duration::from_millis(100));
    let acks = sim.core_ref(1).peer_stats(PeerId(0)).unwrap().acks_sent - before.acks_sent;
    let batches = N.div_ceil(u64::from(cfg.ack_every));
    assert!(
        (1..=batches + 3).contains(&acks),
        "{acks} acks for {N} frames (ack_every {})",
        cfg.ack_every
    );
}

/// With a window over 64, frames that arrived while an earlier one was lost
/// are acknowledged only once the loss is repaired, a timeout later: their
/// round-trip samples would measure the repair, not the link. Only frames
/// sent after the repair's retransmission give samples then (Karn's rule,
/// carried to the acknowledgement the retransmission brings); the smoothed
/// round trip stays what the link takes.
#[test]
fn frames_acknowledged_behind_a_repaired_loss_give_no_round_trip_samples() {
    const M: u64 = 160;
    let cfg = CoreConfig {
        window: 256,
        rto_min: Duration::from_micros(200),
        ..CoreConfig::default()
    };
    let mut sim = make_sim(2, LinkConfig::default(), &cfg);
    transfer(&mut sim, 0, 1, 1000, 1);
    let srtt = |sim: &TestSim| sim.core_ref(0).peer_info(PeerId(0)).unwrap().srtt;
    let before = srtt(&sim);
    let now = sim.now();
    for k in 0..M {
        sim.core(1)
            .post_recv(now, Some(addr(0)), 100 + k, !0, vec![0; LEN], 100 + k)
            .unwrap();
        sim.core(0)
            .send(now, addr(1), 100 + k, pattern(k, LEN), 100 + k)
            .unwrap();
    }
    // The first 65 frames are lost: what follows lies past the selective
    // acknowledgement's reach, so only a timeout finds the loss.
    for _ in 0..65 {
        assert!(take_frame(&mut sim, 0).is_some());
    }
    let done = sim.run_until(now + Duration::from_millis(50), |sim| {
        drain(sim);
        sim.core_ref(0).peer_info(PeerId(0)).unwrap().in_flight == 0
    });
    assert!(done, "the messages were not all acknowledged");
    let after = srtt(&sim);
    assert!(
        after < before * 3,
        "smoothed round trip {before:?} before, {after:?} after the repair"
    );
}
