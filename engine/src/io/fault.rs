//! Fault injection at the seam: seeded drop, duplication, reordering,
//! corruption and delay of received frames, adjustable while the engine runs.
//!
//! Faults apply to frames on their way in (each end that is wrapped sees a
//! lossy inbound link); wrap both ends to make both directions lossy. Frames
//! held back (delay, reordering) wait in a bounded queue, in the order they
//! are due: when it is full, the one due soonest leaves early (or is dropped,
//! and counted, when the receive has no room for it) rather than memory
//! growing.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{Frame, PacketIo};

/// Most frames held back at once.
const MAX_HELD: usize = 4096;

/// What to do to received frames. Probabilities are per frame, from 0 to 1.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultConfig {
    /// Drop the frame.
    pub drop: f64,
    /// Deliver the frame twice.
    pub duplicate: f64,
    /// Hold the frame back for a random time up to `reorder_window`, so that
    /// later frames overtake it.
    pub reorder: f64,
    /// How long a reordered frame may be held.
    pub reorder_window: Duration,
    /// Flip one random bit of the frame: anywhere in a one-segment frame,
    /// in the first segment of a chained one (a frame whose bytes cannot be
    /// written is counted in `not_corrupted` of [`Faulty::fault_stats`]).
    pub corrupt: f64,
    /// Deliver every frame this much later.
    pub delay: Duration,
}

impl FaultConfig {
    /// No faults.
    pub fn none() -> FaultConfig {
        FaultConfig::default()
    }

    /// Drop with probability `p`.
    pub fn lossy(p: f64) -> FaultConfig {
        FaultConfig {
            drop: p,
            ..FaultConfig::default()
        }
    }
}

/// Counts of the faults injected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Frames dropped.
    pub dropped: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Frames held back to be overtaken.
    pub reordered: u64,
    /// Frames with a flipped bit.
    pub corrupted: u64,
    /// Frames drawn for corruption whose bytes could not be written (data
    /// shared with another owner, or empty), delivered as they were.
    pub not_corrupted: u64,
    /// Frames delivered through the hold queue: delayed, reordered, or
    /// behind a frame that was.
    pub held: u64,
}

#[derive(Default)]
struct Shared {
    drop: AtomicU32,
    duplicate: AtomicU32,
    reorder: AtomicU32,
    corrupt: AtomicU32,
    reorder_window_ns: AtomicU64,
    delay_ns: AtomicU64,
}

fn threshold(p: f64) -> u32 {
    (p.clamp(0.0, 1.0) * f64::from(u32::MAX)) as u32
}

/// A duration in nanoseconds, saturating (past about 584 years).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Changes the faults of a running [`Faulty`] from any thread.
#[derive(Clone)]
pub struct FaultHandle(Arc<Shared>);

impl FaultHandle {
    /// Applies `cfg` from the next receive on.
    pub fn set(&self, cfg: FaultConfig) {
        let s = &self.0;
        s.drop.store(threshold(cfg.drop), Ordering::Relaxed);
        s.duplicate
            .store(threshold(cfg.duplicate), Ordering::Relaxed);
        s.reorder.store(threshold(cfg.reorder), Ordering::Relaxed);
        s.corrupt.store(threshold(cfg.corrupt), Ordering::Relaxed);
        s.reorder_window_ns
            .store(nanos(cfg.reorder_window), Ordering::Relaxed);
        s.delay_ns.store(nanos(cfg.delay), Ordering::Relaxed);
    }
}

/// Wraps a link and injects faults into what it receives.
pub struct Faulty<L: PacketIo> {
    shared: Arc<Shared>,
    rng: SmallRng,
    /// Frames held back, ordered by release time.
    held: VecDeque<(Instant, L::Frame)>,
    /// When the last frame in link order is due (a reordered one aside):
    /// later ones are due no earlier, so that a delay lowered while frames
    /// are held keeps them in order.
    in_order_at: Instant,
    incoming: Vec<L::Frame>,
    stats: FaultStats,
    /// The link, last: fields drop in order, and the frames above must go
    /// back to its pool before it (and perhaps the pool) goes.
    inner: L,
}

impl<L: PacketIo> Faulty<L> {
    /// Wraps `inner` with the faults of `cfg`, drawn from a generator seeded
    /// with `seed` (the same seed and traffic give the same faults; when
    /// held frames come out depends on the clock too).
    pub fn new(inner: L, cfg: FaultConfig, seed: u64) -> Faulty<L> {
        let handle = FaultHandle(Arc::new(Shared::default()));
        handle.set(cfg);
        Faulty {
            inner,
            shared: handle.0,
            rng: SmallRng::seed_from_u64(seed),
            held: VecDeque::with_capacity(MAX_HELD),
            in_order_at: Instant::now(),
            incoming: Vec::with_capacity(256),
            stats: FaultStats::default(),
        }
    }

    /// A handle to change the faults while running.
    pub fn handle(&self) -> FaultHandle {
        FaultHandle(self.shared.clone())
    }

    /// Faults injected so far.
    pub fn fault_stats(&self) -> FaultStats {
        self.stats
    }

    /// The wrapped link.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    fn hit(&mut self, threshold: u32) -> bool {
        threshold != 0 && self.rng.gen::<u32>() <= threshold
    }

    /// Moves held frames due by `now` into `out`, in release order, while it
    /// has fewer than `max` past `start`.
    fn release_due(&mut self, now: Instant, out: &mut Vec<L::Frame>, start: usize, max: usize) {
        while out.len() - start < max {
            match self.held.front() {
                Some((t, _)) if *t <= now => {
                    let (_, f) = self.held.pop_front().expect("front exists");
                    self.stats.held += 1;
                    out.push(f);
                }
                _ => break,
            }
        }
    }

    /// Holds `frame` until `at`. The queue is bounded: when full, the frame
    /// due soonest leaves early, into `out` while it has `room`, or is
    /// dropped (and counted) when it has none, so that nothing overtakes
    /// held frames uncounted and nothing vanishes unseen.
    fn hold(&mut self, at: Instant, frame: L::Frame, out: &mut Vec<L::Frame>, room: bool) {
        if self.held.len() >= MAX_HELD {
            let (_, first) = self.held.pop_front().expect("the queue is full");
            if room && out.len() < out.capacity() {
                self.stats.held += 1;
                out.push(first);
            } else {
                self.stats.dropped += 1;
            }
        }
        let pos = self.held.partition_point(|(t, _)| *t <= at);
        self.held.insert(pos, (at, frame));
    }
}

impl<L: PacketIo> PacketIo for Faulty<L> {
    type Frame = L::Frame;

    fn recv(&mut self, out: &mut Vec<L::Frame>, max: usize) -> usize {
        let start = out.len();
        let max = max.min(out.capacity() - out.len());
        let s = &self.shared;
        let (drop, dup, reorder, corrupt) = (
            s.drop.load(Ordering::Relaxed),
            s.duplicate.load(Ordering::Relaxed),
            s.reorder.load(Ordering::Relaxed),
            s.corrupt.load(Ordering::Relaxed),
        );
        let window = s.reorder_window_ns.load(Ordering::Relaxed);
        let delay = Duration::from_nanos(s.delay_ns.load(Ordering::Relaxed));

        // What is due leaves first, and only the room left is taken from the
        // link: duplicates add frames, and a link that always has a burst
        // waiting would otherwise grow the queue until it overflowed, turning
        // duplication into loss. (What is not taken waits in the link, as in
        // a NIC's ring.)
        let now = Instant::now();
        self.release_due(now, out, start, max);
        let mut incoming = std::mem::take(&mut self.incoming);
        let want = (max - (out.len() - start)).min(incoming.capacity());
        if want > 0 {
            self.inner.recv(&mut incoming, want);
        }
        for mut f in incoming.drain(..) {
            if self.hit(drop) {
                self.stats.dropped += 1;
                continue;
            }
            if self.hit(corrupt) {
                if let Some(bytes) = f.first_segment_mut().filter(|b| !b.is_empty()) {
                    let bit = self.rng.gen_range(0..bytes.len() * 8);
                    bytes[bit / 8] ^= 1 << (bit % 8);
                    self.stats.corrupted += 1;
                } else {
                    self.stats.not_corrupted += 1;
                }
            }
            let copy = if self.hit(dup) {
                self.inner.duplicate(&f)
            } else {
                None
            };
            if copy.is_some() {
                self.stats.duplicated += 1;
            }
            for frame in std::iter::once(f).chain(copy) {
                let mut at = self.in_order_at.max(now + delay);
                self.in_order_at = at;
                if self.hit(reorder) && window > 0 {
                    at += Duration::from_nanos(self.rng.gen_range(0..window));
                    self.stats.reordered += 1;
                }
                let room = out.len() - start < max;
                if at <= now && self.held.is_empty() && room {
                    out.push(frame);
                } else {
                    self.hold(at, frame, out, room);
                }
            }
        }
        self.incoming = incoming;
        self.release_due(now, out, start, max);
        out.len() - start
    }

    fn send(&mut self, frames: &mut Vec<L::Frame>) -> usize {
        self.inner.send(frames)
    }
    crate::delegate_packet_io!();
}
