//! The protocol core allocates nothing once built: eager, unexpected and rendezvous
//! traffic, acks and completions all run out of the tables sized at construction.
//!
//! A counting global allocator counts allocations made by this test's thread while a
//! flag is up.

use emx::proto::{Addr, Completion, Core, CoreConfig, MacAddr, Time};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter and the
// const-initialised thread-local flag neither allocate nor touch the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

type C = Core<Vec<u8>, Vec<u8>>;

/// What the link between the two cores does to frames: with `faults`, it
/// loses every 7th and delivers every 11th twice (counted per direction).
struct Link {
    faults: bool,
    sent: u64,
}

impl Link {
    fn pump(&mut self, now: Time, from: &mut C, to: &mut C, frame: &mut [u8]) {
        while let Some(tx) = from.poll_transmit(now, frame) {
            let mut len = tx.header_len;
            if let Some(p) = tx.payload {
                let data = from.payload(&p).unwrap();
                frame[len..len + data.len()].copy_from_slice(data);
                len += data.len();
            }
            self.sent += 1;
            if self.faults && self.sent % 7 == 0 {
                continue;
            }
            let _ = to.handle_frame(now, &frame[..len]);
            if self.faults && self.sent % 11 == 0 {
                let _ = to.handle_frame(now, &frame[..len]);
            }
        }
    }
}

#[test]
fn steady_state_allocates_nothing() {
    steady_state(false);
}

/// Loss recovery (selective acks, fast retransmits, timeouts, frames held
/// out of order, duplicates dropped) allocates nothing either. (The test
/// above ran a perfect link only.)
#[test]
fn loss_and_duplicates_allocate_nothing() {
    steady_state(true);
}

fn steady_state(faults: bool) {
    let cfg = CoreConfig::default();
    let (aa, ba) = (Addr::new(1, 0), Addr::new(2, 0));
    let (am, bm) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
    let mut a: C = Core::new(cfg.clone(), aa, am, 1, Time::ZERO).unwrap();
    let mut b: C = Core::new(cfg.clone(), ba, bm, 1, Time::ZERO).unwrap();
    a.add_peer(ba, bm).unwrap();
    b.add_peer(aa, am).unwrap();
    let mut frame = vec![0u8; cfg.mtu + 14];
    let mut now = Time::ZERO;
    let sizes = [8usize, 0, 3000, 20_000, 100_000];
    // Buffers for every round, made up front.
    let mut send_bufs: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; sizes[i % 5]]).collect();
    let mut recv_bufs: Vec<Vec<u8>> = (0..64).map(|_| vec![0; 100_000]).collect();
    let mut completions = 0u64;
    let (mut ab, mut ba_link) = (Link { faults, sent: 0 }, Link { faults, sent: 0 });

    for round in 0..40 {
        if round == 5 {
            // Handshake and first-use paths are done: count from here on.
            COUNTING.with(|c| c.set(true));
        }
        // Half the receives before the messages, half after (unexpected path).
        for k in 0..32 {
            let buf = recv_bufs.pop().unwrap();
            b.post_recv(now, Some(aa), k, !0, buf, k).unwrap();
        }
        for k in 0..64u64 {
            let buf = send_bufs.pop().unwrap();
            a.send(now, ba, k % 32 + 32 * (k / 32), buf, k).unwrap();
        }
        let mut posted_late = false;
        for _ in 0..40_000 {
            ab.pump(now, &mut a, &mut b, &mut frame);
            ba_link.pump(now, &mut b, &mut a, &mut frame);
            now = now + Duration::from_micros(5);
            a.handle_timeout(now);
            b.handle_timeout(now);
            if !posted_late {
                posted_late = true;
                for k in 32..64 {
                    let buf = recv_bufs.pop().unwrap();
                    b.post_recv(now, None, k, !0, buf, k).unwrap();
                }
            }
            while let Some(c) = a.poll_completion() {
                if let Completion::Send(s) = c {
                    s.result.unwrap();
                    send_bufs.push(s.buf);
                    completions += 1;
                }
            }
            while let Some(c) = b.poll_completion() {
                if let Completion::Recv(r) = c {
                    r.result.unwrap();
                    recv_bufs.push(r.buf);
                    completions += 1;
                }
            }
            if send_bufs.len() == 64 && recv_bufs.len() == 64 {
                break;
            }
        }
        assert_eq!(
            (send_bufs.len(), recv_bufs.len()),
            (64, 64),
            "round {round}: {:?}",
            b.peer_info(emx::proto::PeerId(0)),
        );
    }
    COUNTING.with(|c| c.set(false));
    assert_eq!(completions, 40 * 128);
    if faults {
        let (sa, sb) = (
            a.peer_stats(emx::proto::PeerId(0)).unwrap(),
            b.peer_stats(emx::proto::PeerId(0)).unwrap(),
        );
        assert!(sa.retransmits > 0 && sb.duplicates > 0, "{sa:?} {sb:?}");
    }
    assert_eq!(
        ALLOCS.load(Ordering::Relaxed),
        0,
        "allocations on the data path"
    );
}
