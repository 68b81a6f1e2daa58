//! The driver joins the protocol core to a link: two drivers progressed
//! inline by one thread exchange eager and rendezvous messages byte-exact,
//! over a clean in-memory link and a lossy, reordering one.
#![cfg(feature = "runtime")]

use std::time::{Duration, Instant};

use emx::io::{FaultConfig, Faulty, MemNetwork, PacketIo};
use emx::proto::{Addr, Completion, Core, CoreConfig, MacAddr, Time};
use emx::runtime::{Clock, Driver, RecvBuf, SendBuf};

fn driver<L: PacketIo>(io: L, node: u16, peer: (u16, [u8; 6]), clock: &Clock) -> Driver<L> {
    let mut core = Core::new(
        CoreConfig::default(),
        Addr::new(node, 0),
        MacAddr(io.mac()),
        1,
        clock.now(),
    )
    .unwrap();
    core.add_peer(Addr::new(peer.0, 0), MacAddr(peer.1))
        .unwrap();
    Driver::new(core, io)
}

fn message(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j.wrapping_mul(31) ^ i.wrapping_mul(7)) as u8)
        .collect()
}

/// Sends every size from a to b (receives posted half before, half after the
/// sends), progresses both until all complete, checks every byte.
fn exchange<L: PacketIo>(a: &mut Driver<L>, b: &mut Driver<L>, sizes: &[usize], clock: &Clock) {
    let (to_b, from_a) = (Addr::new(2, 0), Addr::new(1, 0));
    let post = |b: &mut Driver<L>, i: usize, len: usize| {
        b.core()
            .post_recv(
                clock.now(),
                Some(from_a),
                i as u64,
                u64::MAX,
                RecvBuf::Owned(vec![0; len]),
                i as u64,
            )
            .unwrap();
    };
    for (i, &len) in sizes.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        post(b, i, len);
    }
    for (i, &len) in sizes.iter().enumerate() {
        a.core()
            .send(
                clock.now(),
                to_b,
                i as u64,
                SendBuf::Owned(message(i, len)),
                i as u64,
            )
            .unwrap();
    }
    for (i, &len) in sizes.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        post(b, i, len);
    }
    let (mut sends, mut recvs) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while sends < sizes.len() || recvs < sizes.len() {
        assert!(
            Instant::now() < deadline,
            "stalled: {sends} sends and {recvs} receives done of {}",
            sizes.len()
        );
        a.progress(clock.now(), |c| match c {
            Completion::Send(s) => {
                s.result.expect("send succeeds");
                sends += 1;
            }
            Completion::Recv(_) => panic!("a posted no receive"),
        });
        b.progress(clock.now(), |c| match c {
            Completion::Recv(r) => {
                let info = r.result.expect("receive succeeds");
                let i = r.ctx as usize;
                assert_eq!(info.msg_len as usize, sizes[i]);
                assert!(!info.truncated);
                assert!(
                    r.buf.as_ref() == message(i, sizes[i]).as_slice(),
                    "message {i} differs"
                );
                recvs += 1;
            }
            Completion::Send(_) => panic!("b sent nothing"),
        });
    }
}

const SIZES: &[usize] = &[
    0,
    1,
    64,
    1400,
    1500,
    5000,
    32 << 10,
    (32 << 10) + 1,
    100_000,
    1 << 20,
    3 << 20,
];

#[test]
fn clean_link_eager_and_rendezvous() {
    let clock = Clock::new();
    let (ia, ib) = MemNetwork::pair(1500);
    let (ma, mb) = (ia.mac(), ib.mac());
    let mut a = driver(ia, 1, (2, mb), &clock);
    let mut b = driver(ib, 2, (1, ma), &clock);
    exchange(&mut a, &mut b, SIZES, &clock);
    let st = a.io_stats();
    assert!(
        st.tx_frames > 0 && st.payload_attached == 0,
        "ordinary memory is copied: {st:?}"
    );
    assert_eq!(a.build_failures(), 0);
}

#[test]
fn lossy_reordering_link_delivers_exactly_once() {
    let clock = Clock::new();
    let (ia, ib) = MemNetwork::pair(1500);
    let (ma, mb) = (ia.mac(), ib.mac());
    let faults = FaultConfig {
        drop: 0.10,
        reorder: 0.10,
        reorder_window: Duration::from_micros(200),
        duplicate: 0.02,
        ..FaultConfig::default()
    };
    let (fa, fb) = (Faulty::new(ia, faults, 1), Faulty::new(ib, faults, 2));
    let mut a = driver(fa, 1, (2, mb), &clock);
    let mut b = driver(fb, 2, (1, ma), &clock);
    exchange(&mut a, &mut b, SIZES, &clock);
    let dropped = a.io().fault_stats().dropped + b.io().fault_stats().dropped;
    assert!(dropped > 100, "the link really was lossy: {dropped} drops");
    let core = a.core_ref();
    let retrans = core
        .peer_stats(core.peer_id(Addr::new(2, 0)).unwrap())
        .unwrap()
        .retransmits;
    assert!(retrans > 0, "losses were repaired by retransmission");
}

/// A payload that cannot be attached costs its frame (the core sends it
/// again), and the driver stops building for the round: it used to go on
/// taking every frame the core had ready, each dropped the same way and
/// left to wait out a retransmission timeout.
#[test]
fn a_failed_attach_ends_the_round() {
    let clock = Clock::new();
    let (ia, ib) = MemNetwork::pair(1500);
    let (ma, mb) = (ia.mac(), ib.mac());
    let mut a = driver(Starved::no_attach(ia), 1, (2, mb), &clock);
    let mut b = driver(ib, 2, (1, ma), &clock);
    // The sessions start (HELLOs carry no payload).
    for _ in 0..10 {
        a.progress(clock.now(), |_| {});
        b.progress(clock.now(), |_| {});
    }
    assert_eq!(a.build_failures(), 0);
    // Six frames of payload, each to be attached.
    a.core()
        .send(
            clock.now(),
            Addr::new(2, 0),
            1,
            SendBuf::Owned(message(0, 8000)),
            0,
        )
        .unwrap();
    for _ in 0..20 {
        a.progress(clock.now(), |_| {});
        if a.build_failures() > 0 {
            break;
        }
        b.progress(clock.now(), |_| {});
    }
    assert_eq!(
        a.build_failures(),
        1,
        "one frame lost for the round, not six"
    );
}

/// A link short of buffers: with `no_attach`, payloads never attach (as a
/// DPDK port out of mbufs for the payload's segment) and nothing is copied
/// instead; while `dry` is set, no frame can be allocated (as a DPDK port
/// whose pool ran dry, with the application holding lent receives).
struct Starved {
    inner: emx::io::MemIo,
    no_attach: bool,
    dry: std::rc::Rc<std::cell::Cell<bool>>,
}

impl Starved {
    fn no_attach(inner: emx::io::MemIo) -> Starved {
        Starved {
            inner,
            no_attach: true,
            dry: Default::default(),
        }
    }
}

impl PacketIo for Starved {
    type Frame = <emx::io::MemIo as PacketIo>::Frame;
    fn recv(&mut self, out: &mut Vec<Self::Frame>, max: usize) -> usize {
        self.inner.recv(out, max)
    }
    fn send(&mut self, f: &mut Vec<Self::Frame>) -> usize {
        self.inner.send(f)
    }
    fn alloc(&mut self) -> Result<Self::Frame, emx::io::IoError> {
        if self.dry.get() {
            return Err(emx::io::IoError::NoBuffer("the pool is empty".into()));
        }
        self.inner.alloc()
    }
    fn attach(
        &mut self,
        frame: &mut Self::Frame,
        payload: emx::io::Payload<'_>,
    ) -> Result<(), emx::io::IoError> {
        if self.no_attach {
            return Err(emx::io::IoError::NoBuffer("no mbuf for the payload".into()));
        }
        self.inner.attach(frame, payload)
    }
    fn copy_below(&self) -> usize {
        if self.no_attach {
            0
        } else {
            self.inner.copy_below()
        }
    }
    emx::delegate_packet_io!(put, truncate, duplicate, mac, max_frame, stats);
}

/// Frames that wait for a buffer are counted (a dry pool stalled the link
/// with every counter still), lost none, and leave once buffers are back.
#[test]
fn a_dry_pool_is_counted_and_outlived() {
    let clock = Clock::new();
    let (ia, ib) = MemNetwork::pair(1500);
    let (ma, mb) = (ia.mac(), ib.mac());
    let dry = std::rc::Rc::new(std::cell::Cell::new(false));
    let io = Starved {
        inner: ia,
        no_attach: false,
        dry: dry.clone(),
    };
    let mut a = driver(io, 1, (2, mb), &clock);
    let mut b = driver(ib, 2, (1, ma), &clock);
    for _ in 0..10 {
        a.progress(clock.now(), |_| {});
        b.progress(clock.now(), |_| {});
    }
    assert_eq!(a.io_stats().tx_no_buffer, 0);
    dry.set(true);
    let sent = message(3, 6000);
    b.core()
        .post_recv(
            clock.now(),
            Some(Addr::new(1, 0)),
            5,
            u64::MAX,
            RecvBuf::Owned(vec![0; 6000]),
            9,
        )
        .unwrap();
    a.core()
        .send(
            clock.now(),
            Addr::new(2, 0),
            5,
            SendBuf::Owned(sent.clone()),
            1,
        )
        .unwrap();
    for _ in 0..20 {
        a.progress(clock.now(), |_| {});
        b.progress(clock.now(), |_| {});
    }
    assert!(
        a.io_stats().tx_no_buffer > 0,
        "the rounds without a buffer were not counted"
    );
    dry.set(false);
    let mut got = None;
    for _ in 0..100 {
        a.progress(clock.now(), |_| {});
        b.progress(clock.now(), |c| {
            if let Completion::Recv(r) = c {
                r.result.expect("received whole");
                got = Some(r.buf);
            }
        });
        if got.is_some() {
            break;
        }
    }
    let buf = got.expect("the message arrived once buffers were back");
    assert!(buf.as_ref() == sent.as_slice(), "the message differs");
    assert_eq!(a.build_failures(), 0, "frames waited; none was lost");
}

/// Payload copied into frames counts the bytes of packed messages too (it
/// counted none of a PACK's: 20 small messages read as a few bytes copied).
#[test]
fn packed_messages_count_as_copied() {
    let clock = Clock::new();
    let (ia, ib) = MemNetwork::pair(1500);
    let (ma, mb) = (ia.mac(), ib.mac());
    let mut a = driver(ia, 1, (2, mb), &clock);
    let mut b = driver(ib, 2, (1, ma), &clock);
    exchange(&mut a, &mut b, &[1], &clock);
    fn peer<L: PacketIo>(a: &mut Driver<L>) -> emx::proto::PeerStats {
        let core = a.core();
        let id = core.peer_id(Addr::new(2, 0)).unwrap();
        *core.peer_stats(id).unwrap()
    }
    let (copied, before) = (a.io_stats().payload_copied, peer(&mut a));
    exchange(&mut a, &mut b, &[8; 20], &clock);
    let after = peer(&mut a);
    assert!(after.msgs_packed > before.msgs_packed, "{after:?}");
    let resent = after.retransmits - before.retransmits;
    let n = a.io_stats().payload_copied - copied;
    assert!(
        n >= 160 && n <= 160 + resent * 20 * 8,
        "{n} bytes copied for 160"
    );
}

#[test]
fn idle_drivers_make_no_progress() {
    let clock = Clock::new();
    let (ia, ib) = MemNetwork::pair(1500);
    let mb = ib.mac();
    let mut a = driver(ia, 1, (2, mb), &clock);
    let p = a.progress(Time::ZERO, |_| panic!("no completion"));
    assert!(p.received == 0 && p.completed == 0);
}

#[test]
fn clock_tracks_the_system_clock() {
    let clock = Clock::new();
    // Each reading is bracketed by two of the system clock's (the tightest
    // of a few tries): a thread preempted between two unbracketed reads
    // would skew the rate by the time it lost, 2% for 1 ms.
    let read = || {
        (0..20)
            .map(|_| {
                let before = std::time::Instant::now();
                let t = clock.now();
                (t, before, before.elapsed())
            })
            .min_by_key(|r| r.2)
            .unwrap()
    };
    let (t0, s0, w0) = read();
    std::thread::sleep(Duration::from_millis(50));
    let (t1, s1, w1) = read();
    let dt = (t1 - t0).as_secs_f64();
    // The system clock's span lies within these two.
    let (least, most) = ((s1 - (s0 + w0)).as_secs_f64(), (s1 + w1 - s0).as_secs_f64());
    assert!(
        dt >= least * 0.98 && dt <= most * 1.02,
        "clock rate off: {dt} s against {least}..{most} s"
    );
    let mut last = clock.now();
    for _ in 0..10_000 {
        let t = clock.now();
        assert!(t >= last, "monotonic");
        last = t;
    }
}

/// A link that takes at most two frames a call: full, as a busy NIC is.
struct Trickle {
    inner: emx::io::MemIo,
}

impl PacketIo for Trickle {
    type Frame = <emx::io::MemIo as PacketIo>::Frame;
    fn recv(&mut self, out: &mut Vec<Self::Frame>, max: usize) -> usize {
        self.inner.recv(out, max)
    }
    fn send(&mut self, frames: &mut Vec<Self::Frame>) -> usize {
        let rest = frames.split_off(frames.len().min(2));
        let n = self.inner.send(frames);
        frames.extend(rest);
        n
    }
    emx::delegate_packet_io!();
}

/// Endpoints sharing a full link take turns building frames: one whose
/// window holds more than the transmit backlog used to refill it ahead of
/// the others every round (endpoint 0 built first), and a message of
/// endpoint 1 waited until endpoint 0 had nothing left to send.
#[test]
fn endpoints_on_a_full_link_take_turns() {
    let clock = Clock::new();
    let (ia, ib) = MemNetwork::pair(1500);
    let (ma, mb) = (ia.mac(), ib.mac());
    let cfg = CoreConfig {
        window: 256,
        ..CoreConfig::default()
    };
    let cores_a = (0..2u8)
        .map(|ep| {
            let mut c =
                Core::new(cfg.clone(), Addr::new(1, ep), MacAddr(ma), 1, clock.now()).unwrap();
            c.add_peer(Addr::new(2, 0), MacAddr(mb)).unwrap();
            c
        })
        .collect();
    let mut a = Driver::with_cores(cores_a, Trickle { inner: ia });
    let mut b_core = Core::new(cfg, Addr::new(2, 0), MacAddr(mb), 1, clock.now()).unwrap();
    for ep in 0..2 {
        b_core.add_peer(Addr::new(1, ep), MacAddr(ma)).unwrap();
    }
    let mut b = Driver::new(b_core, ib);
    // Endpoint 0 streams 1 KiB messages (one frame each), more than its
    // window; endpoint 1 has one message.
    for i in 0..600u64 {
        a.core()
            .send(
                clock.now(),
                Addr::new(2, 0),
                i,
                SendBuf::Owned(vec![0; 1024]),
                0,
            )
            .unwrap();
    }
    a.core_at(1)
        .unwrap()
        .send(
            clock.now(),
            Addr::new(2, 0),
            7,
            SendBuf::Owned(vec![1; 8]),
            0,
        )
        .unwrap();
    let r = b
        .core()
        .post_recv(
            clock.now(),
            Some(Addr::new(1, 1)),
            7,
            u64::MAX,
            RecvBuf::Owned(vec![0; 8]),
            0,
        )
        .unwrap();
    let mut streamed = 0;
    let mut arrived_after = None;
    for _ in 0..400 {
        a.progress(clock.now(), |_| {});
        b.progress(clock.now(), |c| {
            if let Completion::Recv(d) = c {
                if d.req == r {
                    arrived_after.get_or_insert(streamed);
                }
            }
        });
        // Endpoint 0's messages wait unexpected at B (no receive posted):
        // count them through B's counter.
        streamed = b.core_ref().stats().unexpected;
        if arrived_after.is_some() {
            break;
        }
    }
    let after = arrived_after.expect("endpoint 1's message never left");
    assert!(
        after < 300,
        "endpoint 1's message waited for {after} of endpoint 0's"
    );
}
