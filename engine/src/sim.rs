//! A simulated Ethernet link in virtual time, driving several [`Core`]s against each other.
//!
//! The simulator owns the cores, a queue of frames in flight and the virtual clock. Each
//! [`step`](Sim::step) jumps to the next event (a frame arriving or a core's timer),
//! delivers, fires timers, and drains every core's transmissions onto the link. The link
//! models latency, per-sender serialization at a bandwidth, and seeded faults: loss,
//! duplication, reordering (an extra random delay), late frames (held long enough that
//! their retransmissions, and what follows them, arrive first: a frame stuck in a switch
//! buffer or a descheduled sender's queue) and corruption (flipped bytes or a truncated
//! frame). Frames are routed by destination MAC, like a switch; a broadcast reaches every
//! other node.
//!
//! It is test and measurement scaffolding: it allocates freely and copies payload (the
//! runtime attaches it zero-copy instead). It must not be used on a data path.

use crate::proto::{Core, RecvBuffer, Time};
use crate::wire::MacAddr;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// A small seeded PRNG (xorshift64*), so that every run of a seed is the same.
#[derive(Debug, Clone)]
pub struct SimRng(u64);

impl SimRng {
    /// Seeds the generator (any seed, zero included).
    pub fn new(seed: u64) -> Self {
        SimRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Link model.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// One-way propagation delay.
    pub latency: Duration,
    /// Bits per second each sender can put on the wire (0: unlimited).
    pub bandwidth_bps: u64,
    /// Probability a frame is lost.
    pub loss: f64,
    /// Probability a frame is delivered twice.
    pub duplicate: f64,
    /// Probability a frame is delayed by up to `reorder_delay` more (so others pass it).
    pub reorder: f64,
    /// Largest extra delay of a reordered frame.
    pub reorder_delay: Duration,
    /// Probability a frame (each copy of a duplicated one on its own) arrives late:
    /// between a quarter of `late_delay` and all of it after its time.
    pub late: f64,
    /// Largest delay of a late frame: beyond the retransmission timeout, so that a
    /// late frame comes after its own retransmission.
    pub late_delay: Duration,
    /// Probability a frame is corrupted (bytes flipped, or cut short).
    pub corrupt: f64,
    /// Seed of the fault generator.
    pub seed: u64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            latency: Duration::from_micros(5),
            bandwidth_bps: 10_000_000_000,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(20),
            late: 0.0,
            late_delay: Duration::from_millis(3),
            corrupt: 0.0,
            seed: 1,
        }
    }
}

/// What the link did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Frames put on the link.
    pub sent: u64,
    /// Frames handed to a core.
    pub delivered: u64,
    /// Frames lost on purpose.
    pub lost: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Frames delayed out of order.
    pub reordered: u64,
    /// Frames (or duplicate copies) delivered late.
    pub late: u64,
    /// Frames corrupted.
    pub corrupted: u64,
    /// Frames to or from a node that is down, or to no node at all.
    pub undeliverable: u64,
    /// Frames longer than the receiving node's MTU allows (its Ethernet
    /// header besides): a port drops them.
    pub oversize: u64,
    /// Frames that a core rejected.
    pub rejected: u64,
    /// Corrupted frames that a core accepted anyway (a checksum miss).
    pub corrupted_accepted: u64,
}

struct InFlight {
    at: Time,
    order: u64,
    dst: usize,
    corrupted: bool,
    bytes: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.order) == (o.at, o.order)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(o.at, o.order))
    }
}

struct Node<S: AsRef<[u8]>, R: RecvBuffer> {
    core: Core<S, R>,
    up: bool,
    /// Paused (a descheduled thread): frames for it wait in `held`.
    paused: bool,
    held: Vec<InFlight>,
    tx_free_at: Time,
}

/// Several cores on one simulated switch.
pub struct Sim<S: AsRef<[u8]>, R: RecvBuffer> {
    now: Time,
    nodes: Vec<Node<S, R>>,
    queue: BinaryHeap<Reverse<InFlight>>,
    order: u64,
    rng: SimRng,
    link: LinkConfig,
    scratch: Vec<u8>,
    stats: SimStats,
    /// Directed pairs (from, to) whose frames are dropped.
    blocked: Vec<(usize, usize)>,
}

impl<S: AsRef<[u8]>, R: RecvBuffer> Sim<S, R> {
    /// An empty switch with this link model, at time zero.
    pub fn new(link: LinkConfig) -> Self {
        Sim {
            now: Time::ZERO,
            nodes: Vec::new(),
            queue: BinaryHeap::new(),
            order: 0,
            rng: SimRng::new(link.seed),
            link,
            scratch: vec![0; crate::wire::FRAME_HEADER_LEN + 65535],
            stats: SimStats::default(),
            blocked: Vec::new(),
        }
    }

    /// Virtual time now.
    pub fn now(&self) -> Time {
        self.now
    }

    /// What the link did so far.
    pub fn stats(&self) -> SimStats {
        self.stats
    }

    /// Changes the link model from now on (the fault generator keeps its state).
    pub fn set_link(&mut self, link: LinkConfig) {
        self.link = link;
    }

    /// Plugs a core in; returns its index. It is reached by its MAC address.
    pub fn add_core(&mut self, core: Core<S, R>) -> usize {
        self.nodes.push(Node {
            core,
            up: true,
            paused: false,
            held: Vec::new(),
            tx_free_at: Time::ZERO,
        });
        self.nodes.len() - 1
    }

    /// Number of cores.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there is no core.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The core at `i`, to make requests and take completions.
    pub fn core(&mut self, i: usize) -> &mut Core<S, R> {
        &mut self.nodes[i].core
    }

    /// The core at `i`, read-only.
    pub fn core_ref(&self, i: usize) -> &Core<S, R> {
        &self.nodes[i].core
    }

    /// Replaces the core at `i` (a restart: same MAC, new epoch) and returns the old one.
    pub fn replace_core(&mut self, i: usize, core: Core<S, R>) -> Core<S, R> {
        std::mem::replace(&mut self.nodes[i].core, core)
    }

    /// Takes a node off the link (`false`: it vanishes, sends and hears nothing, and its
    /// timers stop) or puts it back.
    pub fn set_up(&mut self, i: usize, up: bool) {
        self.nodes[i].up = up;
    }

    /// Pauses node `i` (`true`), as the OS does a descheduled thread: it
    /// sends nothing, its timers wait, and the frames that reach it wait for
    /// it, in order. Unpaused, it finds them all at once: they are handed to
    /// it 50 ns apart from now on, as a thread catching up reads its queue in
    /// bursts and answers between them.
    pub fn set_paused(&mut self, i: usize, paused: bool) {
        self.nodes[i].paused = paused;
        if !paused {
            let held = std::mem::take(&mut self.nodes[i].held);
            let mut at = self.now;
            for f in held {
                self.push(at, i, f.corrupted, f.bytes);
                at = at + Duration::from_nanos(50);
            }
        }
    }

    /// Drops (`true`) or passes again the frames from node `from` to node `to` only: a
    /// link that works one way.
    pub fn set_blocked(&mut self, from: usize, to: usize, blocked: bool) {
        self.blocked.retain(|&p| p != (from, to));
        if blocked {
            self.blocked.push((from, to));
        }
    }

    /// Time of the next event: a frame arriving or a timer of a node that is up.
    pub fn next_event(&self) -> Option<Time> {
        let mut t = self.queue.peek().map(|f| f.0.at);
        for n in self.nodes.iter().filter(|n| n.up && !n.paused) {
            if let Some(d) = n.core.poll_timeout() {
                t = Some(t.map_or(d, |t| t.min(d)));
            }
        }
        t
    }

    /// Puts every frame the cores have to send on the link (at the current time).
    pub fn flush(&mut self) {
        for i in 0..self.nodes.len() {
            self.flush_node(i);
        }
    }

    fn flush_node(&mut self, i: usize) {
        if self.nodes[i].paused {
            return;
        }
        let now = self.now;
        loop {
            let node = &mut self.nodes[i];
            let Some(tx) = node.core.poll_transmit(now, &mut self.scratch) else {
                break;
            };
            if !node.up {
                self.stats.undeliverable += 1;
                continue;
            }
            let mut bytes = Vec::with_capacity(tx.frame_len());
            bytes.extend_from_slice(&self.scratch[..tx.header_len]);
            if let Some(p) = tx.payload {
                let data = node.core.payload(&p).expect("payload ref resolves");
                bytes.extend_from_slice(data);
            }
            let bits = (bytes.len() as u64 + 24) * 8; // preamble, FCS, inter-frame gap
            let ser = (bits * 1_000_000_000)
                .checked_div(self.link.bandwidth_bps)
                .unwrap_or(0);
            let start = node.tx_free_at.max(now);
            node.tx_free_at = Time(start.0 + ser);
            let at = node.tx_free_at + self.link.latency;
            self.stats.sent += 1;
            self.enqueue(i, at, bytes);
        }
    }

    fn enqueue(&mut self, src: usize, at: Time, bytes: Vec<u8>) {
        if self.rng.chance(self.link.loss) {
            self.stats.lost += 1;
            return;
        }
        let mut dst_mac = [0u8; 6];
        dst_mac.copy_from_slice(&bytes[..6]);
        if MacAddr(dst_mac) == MacAddr::BROADCAST {
            // A switch floods it: every other node gets its copy.
            for dst in (0..self.nodes.len()).filter(|&d| d != src) {
                self.enqueue_to(src, dst, at, bytes.clone());
            }
            return;
        }
        let Some(dst) = self
            .nodes
            .iter()
            .position(|n| n.core.mac() == MacAddr(dst_mac))
        else {
            self.stats.undeliverable += 1;
            return;
        };
        self.enqueue_to(src, dst, at, bytes);
    }

    fn enqueue_to(&mut self, src: usize, dst: usize, at: Time, mut bytes: Vec<u8>) {
        if self.blocked.contains(&(src, dst)) {
            self.stats.undeliverable += 1;
            return;
        }
        if bytes.len() > self.nodes[dst].core.config().mtu + crate::wire::ETH_HEADER_LEN {
            self.stats.oversize += 1;
            return;
        }
        let corrupted = self.rng.chance(self.link.corrupt);
        if corrupted {
            self.stats.corrupted += 1;
            if self.rng.chance(0.2) {
                let keep = self.rng.below(bytes.len() as u64) as usize;
                bytes.truncate(keep);
            } else {
                let before = bytes.clone();
                for _ in 0..1 + self.rng.below(4) {
                    let i = self.rng.below(bytes.len() as u64) as usize;
                    bytes[i] ^= 1 + self.rng.below(255) as u8;
                }
                if bytes == before {
                    // Two flips cancelled out: a corrupted frame must differ.
                    bytes[0] ^= 1;
                }
            }
        }
        let mut at = at;
        if self.rng.chance(self.link.reorder) {
            self.stats.reordered += 1;
            at = at
                + Duration::from_nanos(
                    self.rng
                        .below(self.link.reorder_delay.as_nanos() as u64 + 1),
                );
        }
        if self.rng.chance(self.link.duplicate) {
            self.stats.duplicated += 1;
            let later = at + Duration::from_nanos(self.rng.below(2_000));
            let later = self.maybe_late(later);
            self.push(later, dst, corrupted, bytes.clone());
        }
        let at = self.maybe_late(at);
        self.push(at, dst, corrupted, bytes);
    }

    /// `at`, or a late frame's time after it (see [`LinkConfig::late`]).
    fn maybe_late(&mut self, at: Time) -> Time {
        if !self.rng.chance(self.link.late) {
            return at;
        }
        self.stats.late += 1;
        let most = self.link.late_delay.as_nanos() as u64;
        at + Duration::from_nanos(most / 4 + self.rng.below(most - most / 4 + 1))
    }

    fn push(&mut self, at: Time, dst: usize, corrupted: bool, bytes: Vec<u8>) {
        self.order += 1;
        self.queue.push(Reverse(InFlight {
            at,
            order: self.order,
            dst,
            corrupted,
            bytes,
        }));
    }

    /// Flushes, jumps to the next event, handles it, and flushes again. Returns false when
    /// nothing at all is pending (every core idle, no frame in flight).
    pub fn step(&mut self) -> bool {
        self.flush();
        let Some(t) = self.next_event() else {
            return false;
        };
        self.now = self.now.max(t);
        let now = self.now;
        while self.queue.peek().is_some_and(|f| f.0.at <= now) {
            let Reverse(f) = self.queue.pop().expect("peeked");
            let node = &mut self.nodes[f.dst];
            if !node.up {
                self.stats.undeliverable += 1;
                continue;
            }
            if node.paused {
                node.held.push(f);
                continue;
            }
            self.stats.delivered += 1;
            if node.core.handle_frame(now, &f.bytes).is_err() {
                self.stats.rejected += 1;
            } else if f.corrupted {
                self.stats.corrupted_accepted += 1;
            }
        }
        for n in self.nodes.iter_mut().filter(|n| n.up && !n.paused) {
            if n.core.poll_timeout().is_some_and(|d| d <= now) {
                n.core.handle_timeout(now);
            }
        }
        self.flush();
        true
    }

    /// Steps until `done` says so or virtual time passes `deadline`. Returns whether
    /// `done` held. `done` runs after every step and may take completions.
    pub fn run_until(&mut self, deadline: Time, mut done: impl FnMut(&mut Self) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            match self.next_event() {
                Some(t) if t <= deadline => {
                    self.step();
                }
                _ => {
                    // Nothing more before the deadline: let time run out.
                    self.flush();
                    if none_or_after(self.next_event(), deadline) {
                        self.now = self.now.max(deadline);
                        return done(self);
                    }
                }
            }
        }
    }
}

fn none_or_after(t: Option<Time>, deadline: Time) -> bool {
    match t {
        None => true,
        Some(x) => x > deadline,
    }
}
