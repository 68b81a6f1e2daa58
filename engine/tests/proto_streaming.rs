//! Rendezvous data is written with `RecvBuffer::write_streaming` while the large
//! receives posted reach `stream_min` bytes, and the core fences those writes before a
//! buffer comes back: a spy buffer records which writes streamed and whether a fence
//! followed them, on a link that loses, duplicates and reorders frames.

mod common;

use std::cell::Cell;
use std::time::Duration;

use common::{addr, make_sim, pattern};
use emx::proto::{Completion, CoreConfig, CoreOnly, RecvBuffer, Time};
use emx::sim::{LinkConfig, Sim};

thread_local! {
    /// Streaming writes since the last fence, on this thread.
    static UNFENCED: Cell<u64> = const { Cell::new(0) };
    static FENCES: Cell<u64> = const { Cell::new(0) };
}

/// A receive buffer that counts its streaming and ordinary writes.
#[derive(Debug)]
struct Spy {
    bytes: Vec<u8>,
    streamed: u64,
}

impl AsMut<[u8]> for Spy {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl RecvBuffer for Spy {
    fn write_streaming(&mut self, offset: usize, data: &[u8], _: &CoreOnly) {
        self.bytes[offset..offset + data.len()].copy_from_slice(data);
        self.streamed += data.len() as u64;
        UNFENCED.with(|u| u.set(u.get() + 1));
    }
    fn streaming_fence(_: &CoreOnly) {
        UNFENCED.with(|u| u.set(0));
        FENCES.with(|f| f.set(f.get() + 1));
    }
}

/// Sends messages of `lens` from core 0 to core 1 under `cfg` on `link`; returns,
/// per message, the bytes that were written by streaming.
fn transfer(cfg: &CoreConfig, link: LinkConfig, lens: &[usize]) -> Vec<u64> {
    let mut sim: Sim<Vec<u8>, Spy> = make_sim(2, link, cfg);
    for (k, &len) in lens.iter().enumerate() {
        let spy = Spy {
            bytes: vec![0; len],
            streamed: 0,
        };
        sim.core(1)
            .post_recv(Time::ZERO, Some(addr(0)), k as u64, !0, spy, k as u64)
            .unwrap();
        sim.core(0)
            .send(Time::ZERO, addr(1), k as u64, pattern(k as u64, len), 0)
            .unwrap();
    }
    let mut streamed = vec![u64::MAX; lens.len()];
    let mut sends = 0;
    let ok = sim.run_until(Time(10_000_000_000), |sim| {
        while let Some(c) = sim.core(0).poll_completion() {
            if let Completion::Send(s) = c {
                s.result.unwrap();
                sends += 1;
            }
        }
        while let Some(c) = sim.core(1).poll_completion() {
            // Whatever streamed into any buffer was fenced before this one came back.
            assert_eq!(
                UNFENCED.with(Cell::get),
                0,
                "a buffer left before the fence"
            );
            let Completion::Recv(r) = c else {
                panic!("a send completion on the receiver")
            };
            r.result.unwrap();
            let k = r.ctx as usize;
            assert!(r.buf.bytes == pattern(k as u64, lens[k]), "message {k}");
            streamed[k] = r.buf.streamed;
        }
        sends == lens.len() && streamed.iter().all(|&s| s != u64::MAX)
    });
    assert!(ok, "transfers did not finish");
    streamed
}

fn faulty() -> LinkConfig {
    LinkConfig {
        loss: 0.02,
        duplicate: 0.02,
        reorder: 0.05,
        reorder_delay: Duration::from_micros(50),
        late: 0.01,
        seed: 7,
        ..LinkConfig::default()
    }
}

#[test]
fn streams_while_large_receives_posted_reach_stream_min_and_fences_before_they_leave() {
    let cfg = CoreConfig {
        stream_min: 2 << 20,
        ..CoreConfig::default()
    };
    let fences = FENCES.with(Cell::get);
    for link in [LinkConfig::default(), faulty()] {
        // 1.2 MiB of large receives posted: below stream_min, ordinary copies.
        let few = [100, 200 * 1024, 1 << 20];
        assert_eq!(transfer(&cfg, link.clone(), &few), [0, 0, 0]);
        // 4 MiB posted: data streams until the receives still posted drop below
        // 2 MiB, so the first to finish streamed whole and the last did not. An
        // eager message (whose buffer is small) never streams.
        let lens = [1 << 20, (1 << 20) + 12345, 1 << 20, 1 << 20, 100];
        let streamed = transfer(&cfg, link, &lens);
        assert!(streamed.iter().zip(lens).any(|(&s, l)| s == l as u64));
        assert!(streamed.iter().zip(lens).any(|(&s, l)| s < l as u64));
        assert_eq!(streamed[4], 0);
    }
    assert!(FENCES.with(Cell::get) > fences, "no fence at all");
}

#[test]
fn stream_min_zero_never_streams() {
    let cfg = CoreConfig {
        stream_min: 0,
        ..CoreConfig::default()
    };
    assert_eq!(transfer(&cfg, faulty(), &[8 << 20, 8 << 20]), [0, 0]);
}
