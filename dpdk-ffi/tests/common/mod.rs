//! Shared helpers for the DPDK tests. Each test runs in its own process
//! (cargo-nextest), because the EAL starts once per process.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use dpdk_ffi::{Burst, Eal, HugepageMode, Mbuf, Mempool, Port, PortConfig, RxQueue, TxQueue};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub const ETHERTYPE: u16 = 0x88B5;
pub const FRAMES: usize = 10_000;

pub fn eal(mode: HugepageMode) -> Eal {
    Eal::builder()
        .hugepages(mode)
        .memory_mb(256)
        .init()
        .expect("EAL starts")
}

/// A socket path of this process's own, free of any leftover file.
pub fn socket(tag: &str) -> String {
    let path = format!("/tmp/emx-test-{}-{tag}.sock", std::process::id());
    let _ = std::fs::remove_file(&path);
    path
}

/// Two memif ports in this process, joined through one socket, link up.
pub fn memif_pair(eal: &Eal, pool: &Mempool, mtu: Option<u16>) -> (Port, Port) {
    let sock = socket("pair");
    let cfg = PortConfig {
        mtu,
        ..PortConfig::default()
    };
    let a = Port::from_devargs(
        eal,
        &format!("net_memif0,role=server,id=0,socket={sock}"),
        &cfg,
        pool,
    )
    .expect("memif server");
    let b = Port::from_devargs(
        eal,
        &format!("net_memif1,role=client,id=0,socket={sock}"),
        &cfg,
        pool,
    )
    .expect("memif client");
    a.wait_link(Duration::from_secs(10))
        .expect("server link up");
    b.wait_link(Duration::from_secs(10))
        .expect("client link up");
    (a, b)
}

/// Frame `i` of a seeded sequence: an Ethernet II header, the index, then
/// random bytes; sizes from 60 bytes to `max` (MTU + header).
pub struct Frames {
    rng: SmallRng,
    max: usize,
}

impl Frames {
    pub fn new(seed: u64, mtu: u16) -> Frames {
        Frames {
            rng: SmallRng::seed_from_u64(seed),
            max: usize::from(mtu) + 14,
        }
    }

    pub fn next_frame(&mut self, i: u32) -> Vec<u8> {
        let len = self.rng.gen_range(60..=self.max);
        let mut f = vec![0u8; len];
        f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        f[14..18].copy_from_slice(&i.to_be_bytes());
        self.rng.fill(&mut f[18..]);
        f
    }
}

pub fn mbuf_of(pool: &Mempool, bytes: &[u8]) -> Mbuf {
    let mut m = Mbuf::alloc(pool).expect("mbuf");
    m.extend_from_slice(bytes).expect("frame fits one mbuf");
    m
}

/// Sends `FRAMES` seeded frames from `tx` and checks that they arrive on `rx`
/// byte-exact and in order, keeping at most `window` in flight. Returns the
/// most segments a received frame came in.
pub fn exchange(tx: &mut TxQueue, rx: &mut RxQueue, pool: &Mempool, mtu: u16, seed: u64) -> u16 {
    let mut sent_gen = Frames::new(seed, mtu);
    let mut check_gen = Frames::new(seed, mtu);
    let (mut sent, mut got) = (0u32, 0u32);
    let mut most_segs = 0;
    let window = 256;
    let mut out: Burst = Burst::new();
    let mut inb: Burst = Burst::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while (got as usize) < FRAMES {
        assert!(
            Instant::now() < deadline,
            "stalled after {got} of {FRAMES} frames"
        );
        while out.room() > 0 && (sent as usize) < FRAMES && sent - got < window {
            let f = sent_gen.next_frame(sent);
            out.push(mbuf_of(pool, &f)).expect("room checked");
            sent += 1;
        }
        tx.tx_burst(&mut out);
        rx.rx_burst(&mut inb);
        for m in inb.drain() {
            let want = check_gen.next_frame(got);
            let have = m.to_vec();
            assert_eq!(have.len(), want.len(), "frame {got}: length");
            assert!(have == want, "frame {got}: content differs");
            most_segs = most_segs.max(m.nb_segs());
            got += 1;
        }
    }
    most_segs
}

/// Transmits `m` and returns it as received. memif's server can only transmit
/// into descriptors the client posted in its receive call, so the receiver is
/// polled while the transmitter is refused.
pub fn send_and_receive(tx: &mut TxQueue, rx: &mut RxQueue, mut m: Mbuf) -> Mbuf {
    let mut b: Burst<1> = Burst::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Err(back) = tx.tx_one(m) {
        assert!(Instant::now() < deadline, "transmit never accepted");
        assert_eq!(rx.rx_burst(&mut b), 0, "nothing else is in flight");
        m = back;
    }
    while rx.rx_burst(&mut b) == 0 {
        assert!(Instant::now() < deadline, "frame never arrived");
    }
    b.pop().unwrap()
}
