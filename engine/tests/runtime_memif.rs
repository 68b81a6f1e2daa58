//! The driver over DPDK: two cores on the two ports of a memif pair in one
//! process, progressed inline, exchange messages up to 64 MiB byte-exact.
//! Sends from registered memory go out with no payload copy.
#![cfg(feature = "runtime")]

use std::time::{Duration, Instant};

use dpdk_ffi::{Eal, ExtMem, Mempool, Port, PortConfig, DEFAULT_DATA_ROOM, MEMIF_MAX_MTU};
use emx::io::{DpdkIo, PacketIo};
use emx::proto::{Addr, Completion, Core, CoreConfig, MacAddr};
use emx::runtime::{Clock, Driver, RecvBuf, SendBuf};

fn pattern(i: usize, j: usize) -> u8 {
    (j.wrapping_mul(131) ^ i.wrapping_mul(17) ^ (j >> 12)) as u8
}

#[test]
fn memif_pair_inline_zero_copy_up_to_64_mib() {
    exchange(None, DEFAULT_DATA_ROOM, DEFAULT_DATA_ROOM, 64 << 20);
}

/// Jumbo frames: memif claims 1518-byte frames but carries 9014-byte ones,
/// and the protocol fills them. Each pool's buffers hold a whole frame.
#[test]
fn memif_pair_jumbo_whole_frames() {
    exchange(Some(MEMIF_MAX_MTU), JUMBO_ROOM, JUMBO_ROOM, 16 << 20);
}

/// Jumbo frames into a receiver whose 2 KiB buffers cannot hold one: they
/// arrive as mbuf chains, which the driver reads through a copy.
#[test]
fn memif_pair_jumbo_chained_receive() {
    exchange(Some(MEMIF_MAX_MTU), JUMBO_ROOM, DEFAULT_DATA_ROOM, 16 << 20);
}

/// A driver holding the last handles on its port and pool frees the frames
/// it keeps (a spare one an idle poll prepared, a transmit backlog, the
/// frames of its last round) before them. Its link used to go first, so the
/// pool was dropped with an mbuf still out and leaked for good (its name
/// stayed taken, EAL cleanup was skipped).
#[test]
fn a_driver_frees_its_frames_before_its_link() {
    let eal = Eal::builder().memory_mb(256).init().unwrap();
    let pool = Mempool::new(&eal, "rt-own", 1023, 32, DEFAULT_DATA_ROOM).unwrap();
    let pool_b = Mempool::new(&eal, "rt-own-b", 1023, 32, DEFAULT_DATA_ROOM).unwrap();
    let (pa, pb, sock) = memif_ports(&eal, &PortConfig::default(), &pool, &pool_b, "own");
    pa.wait_link(Duration::from_secs(10)).unwrap();
    let clock = Clock::new();
    let io = DpdkIo::new(&pa, 0, &pool).unwrap();
    let mut core = Core::new(
        CoreConfig::default(),
        Addr::new(1, 0),
        MacAddr(io.mac()),
        1,
        clock.now(),
    )
    .unwrap();
    core.add_peer(Addr::new(2, 0), MacAddr(pb.mac())).unwrap();
    let mut d = Driver::new(core, io);
    for _ in 0..10 {
        d.progress(clock.now(), |_| {});
    }
    assert!(pool.in_use() > 0, "the driver keeps a frame ready");
    // Frames from the other port (not emx's: the core drops them), taken in
    // a round whose frames the driver keeps until its next one.
    pb.wait_link(Duration::from_secs(10)).unwrap();
    let mut iob = DpdkIo::new(&pb, 0, &pool_b).unwrap();
    let mut frames: Vec<_> = (0..4)
        .map(|_| {
            let mut f = iob.alloc().unwrap();
            iob.put(&mut f, 60).unwrap();
            f
        })
        .collect();
    assert_eq!(iob.send(&mut frames), 4);
    let ready = pool.in_use();
    let t0 = Instant::now();
    let (mut got, mut last) = (0, 0);
    while got < 4 {
        last = d.progress(clock.now(), |_| {}).received;
        got += last;
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the frames never came"
        );
    }
    assert!(
        pool.in_use() >= ready + last as u32,
        "the last round's frames are kept"
    );
    drop((pa, pool));
    drop(d);
    // Freed: the name can be taken again.
    Mempool::new(&eal, "rt-own", 1023, 32, DEFAULT_DATA_ROOM).unwrap();
    drop(pb);
    let _ = std::fs::remove_file(&sock);
}

/// A port that cannot transmit chained mbufs (net_null) takes a pool whose
/// buffers hold a whole frame, and refuses one whose buffers do not, with
/// what to change: frames built over several would leave cut short.
#[test]
fn a_port_without_chained_transmit_needs_whole_frame_buffers() {
    let eal = Eal::builder().memory_mb(256).init().unwrap();
    let small = Mempool::new(&eal, "rt-small", 255, 0, 1024).unwrap();
    let whole = Mempool::new(&eal, "rt-whole", 255, 0, DEFAULT_DATA_ROOM).unwrap();
    let port = Port::from_devargs(&eal, "net_null0", &PortConfig::default(), &whole).unwrap();
    assert!(!port.multi_seg_tx());
    let err = DpdkIo::new(&port, 0, &small).err().expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("cannot transmit chained mbufs") && text.contains("data room of at least"),
        "{text}"
    );
    DpdkIo::new(&port, 0, &whole).unwrap();
}

/// A memif pair in this process on a socket of its own (`tag`): the server
/// on `pool_a`, the client on `pool_b`; and the socket's path.
fn memif_ports(
    eal: &Eal,
    cfg: &PortConfig,
    pool_a: &Mempool,
    pool_b: &Mempool,
    tag: &str,
) -> (Port, Port, String) {
    let sock = format!("/tmp/emx-{tag}-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let port = |role: &str, i: u8, pool: &Mempool| {
        let devargs = format!("net_memif{i},role={role},socket={sock}");
        Port::from_devargs(eal, &devargs, cfg, pool).unwrap()
    };
    let pa = port("server", 0, pool_a);
    let pb = port("client", 1, pool_b);
    (pa, pb, sock)
}

/// An EAL, a memif pair (port `pa` on `pool_a`, `pb` on `pool_b`, both up)
/// and a clock; fields drop in order, ports before their pools and the EAL.
struct Rig {
    clock: Clock,
    pa: Port,
    pb: Port,
    pool_a: Mempool,
    pool_b: Mempool,
    _sock: String,
    eal: Eal,
}

impl Rig {
    /// `pool_a` holds `n` mbufs with a per-core cache of `cache`; `pool_b`
    /// 2047 with 32.
    fn new(tag: &str, n: u32, cache: u32) -> Rig {
        let eal = Eal::builder().memory_mb(256).init().unwrap();
        let pool_a =
            Mempool::new(&eal, &format!("rt-{tag}-a"), n, cache, DEFAULT_DATA_ROOM).unwrap();
        let pool_b =
            Mempool::new(&eal, &format!("rt-{tag}-b"), 2047, 32, DEFAULT_DATA_ROOM).unwrap();
        let (pa, pb, sock) = memif_ports(&eal, &PortConfig::default(), &pool_a, &pool_b, tag);
        pa.wait_link(Duration::from_secs(10)).unwrap();
        pb.wait_link(Duration::from_secs(10)).unwrap();
        Rig {
            clock: Clock::new(),
            pa,
            pb,
            pool_a,
            pool_b,
            _sock: sock,
            eal,
        }
    }

    /// A core of node `node` endpoint 0 on the port with `mac`, with node
    /// `peer_node` endpoint 0 on `peer` as its peer.
    fn core(&self, mac: [u8; 6], node: u16, peer: &Port, peer_node: u16) -> Core<SendBuf, RecvBuf> {
        let mut core = Core::new(
            CoreConfig::default(),
            Addr::new(node, 0),
            MacAddr(mac),
            1,
            self.clock.now(),
        )
        .unwrap();
        core.add_peer(Addr::new(peer_node, 0), MacAddr(peer.mac()))
            .unwrap();
        core
    }
}

/// Node 1 on `pa` over a [`LazyFree`] link (jammed while `jam` is up) and
/// node 2 on `pb`, with the region for, and a 16,000-byte registered buffer
/// of 7s: what node 1 sends.
fn lazy_pair(
    rig: &Rig,
    jam: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (Driver<LazyFree>, Driver<DpdkIo>, ExtMem, dpdk_ffi::ExtBuf) {
    let io_a = LazyFree {
        inner: DpdkIo::new(&rig.pa, 0, &rig.pool_a).unwrap(),
        built: Default::default(),
        held: Vec::new(),
        jam,
    };
    let io_b = DpdkIo::new(&rig.pb, 0, &rig.pool_b).unwrap();
    let a = Driver::new(rig.core(io_a.mac(), 1, &rig.pb, 2), io_a);
    let b = Driver::new(rig.core(io_b.mac(), 2, &rig.pa, 1), io_b);
    let region = ExtMem::new(&rig.eal, 1 << 20).unwrap();
    let mut x = region.alloc(LAZY_LEN, 64).unwrap();
    x.as_mut_slice().unwrap().fill(7);
    (a, b, region, x)
}

/// The length of [`lazy_pair`]'s buffer.
const LAZY_LEN: usize = 16_000;

/// Node 2 posts a receive for tag 1 from node 1, and node 1 sends `x` there.
fn post_and_send(
    a: &mut Driver<LazyFree>,
    b: &mut Driver<DpdkIo>,
    clock: &Clock,
    x: dpdk_ffi::ExtBuf,
) {
    b.core()
        .post_recv(
            clock.now(),
            Some(Addr::new(1, 0)),
            1,
            u64::MAX,
            RecvBuf::Owned(vec![0; LAZY_LEN]),
            0,
        )
        .unwrap();
    a.core()
        .send(clock.now(), Addr::new(2, 0), 1, SendBuf::Registered(x), 0)
        .unwrap();
}

/// A data room for a 9018-byte frame and the headroom.
const JUMBO_ROOM: u16 = 9216;

/// Sends messages of 0 B up to `largest` from a port whose pool has
/// `room_a`-byte buffers to one with `room_b`, at `mtu`, and checks them.
fn exchange(mtu: Option<u16>, room_a: u16, room_b: u16, largest: usize) {
    let eal = Eal::builder().memory_mb(512).init().unwrap();
    let pool_a = Mempool::new(&eal, "rt-a", 8191, 256, room_a).unwrap();
    let pool_b = Mempool::new(&eal, "rt-b", 8191, 256, room_b).unwrap();
    let cfg = PortConfig {
        mtu,
        ..PortConfig::default()
    };
    let (pa, pb, _sock) = memif_ports(&eal, &cfg, &pool_a, &pool_b, "rt");
    let mtu = usize::from(mtu.unwrap_or(1500));
    assert_eq!(usize::from(pa.mtu()), mtu);
    pa.wait_link(Duration::from_secs(10)).unwrap();
    pb.wait_link(Duration::from_secs(10)).unwrap();
    let clock = Clock::new();
    let mk = |port: &Port, pool: &Mempool, node: u16, peer: &Port, peer_node: u16| {
        let io = DpdkIo::new(port, 0, pool).unwrap();
        let mut core = Core::new(
            CoreConfig {
                mtu: io.max_frame() - 14,
                ..CoreConfig::default()
            },
            Addr::new(node, 0),
            MacAddr(io.mac()),
            1,
            clock.now(),
        )
        .unwrap();
        core.add_peer(Addr::new(peer_node, 0), MacAddr(peer.mac()))
            .unwrap();
        Driver::new(core, io)
    };
    let mut a = mk(&pa, &pool_a, 1, &pb, 2);
    let mut b = mk(&pb, &pool_b, 2, &pa, 1);

    let sizes = [0usize, 8, 1500, 8000, 40_000, 1 << 20, largest];
    let region = ExtMem::new(&eal, largest + (2 << 20)).unwrap();
    for (i, &len) in sizes.iter().enumerate() {
        b.core()
            .post_recv(
                clock.now(),
                Some(Addr::new(1, 0)),
                i as u64,
                u64::MAX,
                RecvBuf::Owned(vec![0; len]),
                i as u64,
            )
            .unwrap();
        let buf = if len == 0 {
            SendBuf::Owned(Vec::new())
        } else {
            let mut x = region.alloc(len, 64).unwrap();
            for (j, byte) in x.as_mut_slice().unwrap().iter_mut().enumerate() {
                *byte = pattern(i, j);
            }
            SendBuf::Registered(x)
        };
        a.core()
            .send(clock.now(), Addr::new(2, 0), i as u64, buf, i as u64)
            .unwrap();
    }
    let (mut sends, mut recvs) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(120);
    while sends < sizes.len() || recvs < sizes.len() {
        assert!(
            Instant::now() < deadline,
            "stalled at {sends} sends, {recvs} receives; iova as va: {}, build failures {}, {:?}",
            eal.iova_is_va(),
            a.build_failures(),
            a.io_stats()
        );
        a.progress(clock.now(), |c| {
            if let Completion::Send(s) = c {
                s.result.unwrap();
                sends += 1;
            }
        });
        b.progress(clock.now(), |c| {
            if let Completion::Recv(r) = c {
                let info = r.result.unwrap();
                let i = r.ctx as usize;
                assert_eq!(info.msg_len as usize, sizes[i]);
                let data = r.buf.as_ref();
                assert!(
                    data.iter().enumerate().all(|(j, &x)| x == pattern(i, j)),
                    "message {i} differs"
                );
                recvs += 1;
            }
        });
    }
    let st = a.io_stats();
    let total: usize = sizes.iter().sum();
    assert!(
        st.payload_attached as usize >= total - mtu * 64,
        "payload attached, not copied: {st:?}"
    );
    // Frames as long as the MTU allows: 1 MiB in about 1 MiB / (mtu - 76).
    let frames = st.tx_frames as usize;
    assert!(
        frames < total / (mtu - 200) + 1000,
        "{frames} frames for {total} bytes at MTU {mtu}"
    );
    assert!(
        (st.payload_copied as usize) < 1 << 20,
        "only short tails are copied: {st:?}"
    );
    // Frames longer than the receiver's buffers arrive chained, and only then.
    let chained = b.io_stats().rx_chained;
    if usize::from(room_b) < mtu + 14 + 128 {
        assert!(chained > 1000, "{chained} chained frames");
    } else {
        assert_eq!(chained, 0);
    }
    drop((a, b));
    assert_eq!(
        region.lent_bytes(),
        0,
        "every send buffer went back to the region"
    );
}

/// A link that keeps a hold on the registered memory of the frames it sent
/// until asked to let go ([`PacketIo::reclaim`]), as a NIC keeps transmitted
/// mbufs until later bursts need their ring slots.
struct LazyFree {
    inner: DpdkIo,
    /// References to registered payloads of frames built and not yet sent,
    /// in build order (one per frame with a payload attached: a chain).
    built: std::collections::VecDeque<dpdk_ffi::ExtBuf>,
    /// Those of frames sent, kept as a NIC keeps sent frames until reclaimed.
    held: Vec<dpdk_ffi::ExtBuf>,
    /// While set, the link takes nothing (full).
    jam: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl PacketIo for LazyFree {
    type Frame = dpdk_ffi::Mbuf;
    fn recv(&mut self, out: &mut Vec<Self::Frame>, max: usize) -> usize {
        self.inner.recv(out, max)
    }
    fn send(&mut self, frames: &mut Vec<Self::Frame>) -> usize {
        if self.jam.load(std::sync::atomic::Ordering::Relaxed) {
            return 0;
        }
        let chained: Vec<bool> = frames.iter().map(|f| f.nb_segs() > 1).collect();
        let n = self.inner.send(frames);
        for _ in chained[..n].iter().filter(|&&c| c) {
            self.held.extend(self.built.pop_front());
        }
        n
    }
    fn attach(
        &mut self,
        frame: &mut Self::Frame,
        payload: emx::io::Payload<'_>,
    ) -> Result<(), emx::io::IoError> {
        if let emx::io::Payload::Registered { buf, .. } = &payload {
            self.built.push_back(buf.share()?);
        }
        self.inner.attach(frame, payload)
    }
    fn reclaim(&mut self) {
        self.held.clear();
        self.inner.reclaim();
    }
    emx::delegate_packet_io!(
        alloc,
        put,
        truncate,
        duplicate,
        release,
        mac,
        max_frame,
        copy_below,
        stats,
        enter_thread,
    );
}

/// A registered send's buffer comes back writable, also from a link that
/// frees sent frames lazily (a NIC): before it is handed back, the driver
/// has the link let go of them. It used to come back unwritable until
/// later traffic made the NIC free its ring, and an application that sent
/// nothing more could wait for ever.
#[test]
fn a_registered_send_comes_back_writable_from_a_lazy_link() {
    let rig = Rig::new("lazy", 2047, 32);
    let clock = &rig.clock;
    let (mut a, mut b, _region, x) = lazy_pair(&rig, Default::default());
    post_and_send(&mut a, &mut b, clock, x);
    let mut back = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while back.is_none() {
        assert!(Instant::now() < deadline, "the send did not complete");
        a.progress(clock.now(), |c| {
            if let Completion::Send(s) = c {
                s.result.unwrap();
                back = Some(s.buf);
            }
        });
        b.progress(clock.now(), |_| {});
    }
    assert!(
        a.io_stats().payload_attached > 0,
        "frames refer to the buffer: {:?}",
        a.io_stats()
    );
    let Some(SendBuf::Registered(mut x)) = back else {
        panic!("the registered buffer comes back");
    };
    assert_eq!(x.in_flight(), 0, "frames still hold the buffer");
    assert!(x.as_mut_slice().is_some(), "the buffer is writable again");
}

/// A registered send's buffer comes back writable also when, as its send
/// completed, a copy of one of its frames still waited in the driver's
/// backlog (a retransmission that a full link held back): the driver has
/// the link let go of sent frames again once the backlog has left. It used
/// to reclaim only at the hand-back, which could not reach that copy, and
/// the buffer stayed unwritable until later traffic freed the NIC's ring.
#[test]
fn a_registered_send_comes_back_writable_after_a_held_back_retransmission() {
    use std::sync::atomic::Ordering;
    let rig = Rig::new("jam", 2047, 32);
    let clock = &rig.clock;
    let jam = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (mut a, mut b, _region, x) = lazy_pair(&rig, jam.clone());
    // A's time runs ahead of the clock by `skew` (past its retransmission
    // timeout), so that its frames go out again while the link is jammed.
    let mut skew = Duration::ZERO;
    let mut back = None;
    let poll_a = |a: &mut Driver<LazyFree>, skew: Duration, back: &mut Option<SendBuf>| {
        a.progress(clock.now() + skew, |c| {
            if let Completion::Send(s) = c {
                s.result.unwrap();
                *back = Some(s.buf);
            }
        });
    };
    // The session first: a message, sent and acknowledged.
    a.core()
        .send(
            clock.now(),
            Addr::new(2, 0),
            9,
            SendBuf::Owned(vec![1; 8]),
            0,
        )
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut greeted = false;
    while !greeted {
        assert!(Instant::now() < deadline, "no session");
        a.progress(clock.now(), |c| {
            if let Completion::Send(s) = c {
                s.result.unwrap();
                greeted = true;
            }
        });
        b.progress(clock.now(), |_| {});
    }
    post_and_send(&mut a, &mut b, clock, x);
    // Sent once, not yet taken by B.
    for _ in 0..4 {
        poll_a(&mut a, skew, &mut back);
    }
    assert!(a.io_stats().payload_attached > 0, "{:?}", a.io_stats());
    jam.store(true, Ordering::Relaxed);
    skew = Duration::from_millis(50);
    for _ in 0..4 {
        poll_a(&mut a, skew, &mut back);
    }
    // B takes the first copies and acknowledges them; A completes the send
    // with the copies made for the retransmission still in its backlog.
    let deadline = Instant::now() + Duration::from_secs(10);
    while back.is_none() {
        assert!(Instant::now() < deadline, "the send did not complete");
        b.progress(clock.now(), |_| {});
        poll_a(&mut a, skew, &mut back);
    }
    let Some(SendBuf::Registered(mut x)) = back.take() else {
        panic!("the registered buffer comes back");
    };
    assert!(x.in_flight() != 0, "the held-back copies refer to it");
    jam.store(false, Ordering::Relaxed);
    for _ in 0..20 {
        poll_a(&mut a, skew, &mut back);
        b.progress(clock.now(), |_| {});
    }
    assert_eq!(x.in_flight(), 0, "frames still hold the buffer");
    assert!(x.as_mut_slice().is_some(), "the buffer is writable again");
}

/// Counts allocations made by a thread while its flag is up.
struct Counting;

static ALLOCS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

thread_local! {
    static COUNTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counter and the const-initialised thread-local flag neither allocate nor
// touch the memory handed out.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if COUNTING.with(std::cell::Cell::get) {
            ALLOCS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(std::cell::Cell::get) {
            ALLOCS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A driver whose pool is empty keeps polling, and a send keeps waiting for
/// a buffer, with no allocation: each attempt used to build the pool's
/// "exhausted" error as text (two allocations), on every idle poll and every
/// transmit round, just when the process was under pressure.
#[test]
fn an_empty_pool_is_met_with_no_allocation() {
    let rig = Rig::new("dry", 511, 0);
    let Rig {
        eal: _,
        pool_a,
        pool_b,
        pa,
        pb,
        clock,
        ..
    } = &rig;
    let core = |io_mac, node, peer: &Port, peer_node| rig.core(io_mac, node, peer, peer_node);
    let io_a = DpdkIo::new(pa, 0, pool_a).unwrap();
    let io_b = DpdkIo::new(pb, 0, pool_b).unwrap();
    let mut a = Driver::new(core(io_a.mac(), 1, pb, 2), io_a);
    let mut b = Driver::new(core(io_b.mac(), 2, pa, 1), io_b);
    // Every buffer of A's pool taken.
    let mut taken = Vec::with_capacity(1024);
    while let Some(m) = dpdk_ffi::Mbuf::try_alloc(pool_a) {
        taken.push(m);
    }
    assert!(!taken.is_empty());
    a.core()
        .send(
            clock.now(),
            Addr::new(2, 0),
            1,
            SendBuf::Owned(vec![1; 64]),
            0,
        )
        .unwrap();
    let mut completions = 0;
    COUNTING.with(|c| c.set(true));
    for _ in 0..200 {
        a.progress(clock.now(), |_| completions += 1);
        b.progress(clock.now(), |_| {});
    }
    COUNTING.with(|c| c.set(false));
    let allocs = ALLOCS.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(completions, 0, "nothing could leave");
    assert!(a.io_stats().tx_no_buffer > 0, "{:?}", a.io_stats());
    assert_eq!(allocs, 0, "allocations while the pool was empty");
    // Buffers back: the send leaves.
    drop(taken);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut r = None;
    b.core()
        .post_recv(
            clock.now(),
            Some(Addr::new(1, 0)),
            1,
            u64::MAX,
            RecvBuf::Owned(vec![0; 64]),
            0,
        )
        .unwrap();
    while r.is_none() {
        assert!(Instant::now() < deadline, "the send never left");
        a.progress(clock.now(), |_| {});
        b.progress(clock.now(), |c| {
            if let Completion::Recv(d) = c {
                r = Some(d.result.is_ok());
            }
        });
    }
    assert_eq!(r, Some(true));
}
