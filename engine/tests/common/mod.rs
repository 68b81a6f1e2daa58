//! Shared scaffolding for the integration tests: cores on a simulated switch.
#![allow(dead_code)]

use emx::proto::{Addr, Completion, Core, CoreConfig, MacAddr, RecvBuffer, RecvDone, Time};
use emx::sim::{LinkConfig, Sim};

pub type TestCore = Core<Vec<u8>, Vec<u8>>;
pub type TestSim = Sim<Vec<u8>, Vec<u8>>;
pub type TestCompletion = Completion<Vec<u8>, Vec<u8>>;

pub fn addr(i: usize) -> Addr {
    Addr::new(i as u16 + 1, 0)
}

pub fn mac(i: usize) -> MacAddr {
    MacAddr([2, 0, 0, 0, 0, i as u8 + 1])
}

/// Core `i` of `n`, each knowing all the others as peers. Receive buffers are
/// `Vec<u8>` unless a test brings its own kind.
pub fn make_core<R: RecvBuffer>(
    cfg: &CoreConfig,
    i: usize,
    n: usize,
    epoch: u32,
    now: Time,
) -> Core<Vec<u8>, R> {
    let mut c = Core::new(cfg.clone(), addr(i), mac(i), epoch, now).unwrap();
    for j in (0..n).filter(|&j| j != i) {
        c.add_peer(addr(j), mac(j)).unwrap();
    }
    c
}

pub fn make_sim<R: RecvBuffer>(n: usize, link: LinkConfig, cfg: &CoreConfig) -> Sim<Vec<u8>, R> {
    let mut sim = Sim::new(link);
    for i in 0..n {
        sim.add_core(make_core(cfg, i, n, 1, Time::ZERO));
    }
    sim
}

/// Takes every completion of every core.
pub fn drain(sim: &mut TestSim) -> Vec<(usize, TestCompletion)> {
    let mut out = Vec::new();
    for i in 0..sim.len() {
        while let Some(c) = sim.core(i).poll_completion() {
            out.push((i, c));
        }
    }
    out
}

/// Deterministic content of message `id`.
pub fn pattern(id: u64, len: usize) -> Vec<u8> {
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

use emx::wire::{Frame, Header, DEFAULT_ETHERTYPE, FRAME_HEADER_LEN};

/// Parses a valid frame, lets `f` change its header, and re-emits it with a good checksum
/// (so that only the change under test can make it wrong).
pub fn craft(frame: &[u8], f: impl FnOnce(&mut Header)) -> Vec<u8> {
    let fr = Frame::new_checked(frame).unwrap();
    let mut h = Header::parse(&fr, DEFAULT_ETHERTYPE, false).unwrap();
    let mut payload = fr.payload().to_vec();
    f(&mut h);
    payload.resize((h.payload_len as usize).min(payload.len()), 0);
    build(&h, &payload)
}

/// Emits `h` with `payload` and a good checksum.
pub fn build(h: &Header, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; FRAME_HEADER_LEN + payload.len()];
    h.emit(&mut v, DEFAULT_ETHERTYPE);
    v[FRAME_HEADER_LEN..].copy_from_slice(payload);
    Frame::new_unchecked(&mut v[..]).fill_checksum(payload);
    v
}

/// Takes core `i`'s next frame off the simulated link by hand (it is not delivered).
pub fn take_frame(sim: &mut TestSim, i: usize) -> Option<Vec<u8>> {
    let now = sim.now();
    let mut hdr = [0u8; 128];
    let core = sim.core(i);
    let tx = core.poll_transmit(now, &mut hdr)?;
    let mut v = hdr[..tx.header_len].to_vec();
    if let Some(p) = tx.payload {
        v.extend_from_slice(core.payload(&p).unwrap());
    }
    Some(v)
}

/// Sends `len` bytes from `a` to `b` (receive posted first) and runs until both finish.
pub fn transfer(sim: &mut TestSim, a: usize, b: usize, len: usize, tag: u64) {
    let now = sim.now();
    sim.core(b)
        .post_recv(now, Some(addr(a)), tag, !0, vec![0; len], 1)
        .unwrap();
    sim.core(a)
        .send(now, addr(b), tag, pattern(tag, len), 2)
        .unwrap();
    let mut done = 0;
    let deadline = sim.now() + std::time::Duration::from_secs(1);
    let ok = sim.run_until(deadline, |sim| {
        for (_, c) in drain(sim) {
            match c {
                Completion::Send(s) => s.result.unwrap(),
                Completion::Recv(r) => {
                    r.result.unwrap();
                    assert!(r.buf == pattern(tag, len));
                }
            }
            done += 1;
        }
        done == 2
    });
    assert!(ok, "transfer {a}->{b} of {len} bytes did not finish");
}

/// Runs until `n` sends and `n` receives have completed (by `deadline`), every
/// one successfully; each receive goes to `check` with how many came before it.
pub fn await_exchange(
    sim: &mut TestSim,
    deadline: Time,
    n: u64,
    mut check: impl FnMut(u64, RecvDone<Vec<u8>>),
) {
    let (mut sends, mut recvs) = (0u64, 0u64);
    let ok = sim.run_until(deadline, |sim| {
        for (_, c) in drain(sim) {
            match c {
                Completion::Send(s) => {
                    s.result.unwrap();
                    sends += 1;
                }
                Completion::Recv(r) => {
                    check(recvs, r);
                    recvs += 1;
                }
            }
        }
        sends == n && recvs == n
    });
    assert!(
        ok,
        "sends {sends}/{n}, receives {recvs}/{n} at {:?}",
        sim.now()
    );
}

/// Frames core `i` counted as dropped: its own count and its first peer's
/// (every drop is counted in one or the other).
pub fn drops(sim: &TestSim, i: usize) -> u64 {
    let c = sim.core_ref(i);
    c.stats().dropped.total() + c.peer_stats(emx::proto::PeerId(0)).unwrap().dropped.total()
}
