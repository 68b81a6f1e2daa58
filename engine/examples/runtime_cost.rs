//! The CPU cost of an emx message round trip through the whole runtime
//! (API, request table, driver, protocol core, link seam), with no real link:
//! two inline engines on an in-memory network, driven by one thread. Compare
//! with `proto_cost` (the core alone) to see what the runtime adds.
//!
//! `cargo run --release -p emx --example runtime_cost [round trips per run]`

use std::time::Instant;

use emx::io::{MemNetwork, PacketIo};
use emx::proto::Addr;
use emx::runtime::{Engine, EngineConfig, PeerConfig, RecvBuf, SendBuf};

fn main() {
    let (ia, ib) = MemNetwork::pair(1500);
    let (ma, mb) = (ia.mac(), ib.mac());
    let peer = |node, mac| PeerConfig {
        node,
        endpoint: 0,
        mac,
    };
    let mut ea = Engine::start(
        &EngineConfig {
            peers: vec![peer(2, mb)],
            ..EngineConfig::new(1)
        },
        ia,
    )
    .unwrap();
    let mut eb = Engine::start(
        &EngineConfig {
            peers: vec![peer(1, ma)],
            ..EngineConfig::new(2)
        },
        ib,
    )
    .unwrap();
    let (mut a, mut b) = (ea.endpoint().unwrap(), eb.endpoint().unwrap());
    let (to_b, to_a) = (Addr::new(2, 0), Addr::new(1, 0));

    let mut results = Vec::new();
    for _ in 0..5 {
        let n: u32 = std::env::args()
            .nth(1)
            .and_then(|a| a.parse().ok())
            .unwrap_or(200_000);
        let t0 = Instant::now();
        let mut sbuf = Some(SendBuf::Owned(vec![1u8; 8]));
        let mut rbuf = Some(RecvBuf::Owned(vec![0u8; 8]));
        let mut b_rbuf = Some(RecvBuf::Owned(vec![0u8; 8]));
        let mut b_pending = None;
        for _ in 0..n {
            let br = b.irecv(Some(to_a), 0, 0, b_rbuf.take().unwrap()).unwrap();
            let r = a.irecv(Some(to_b), 0, 0, rbuf.take().unwrap()).unwrap();
            let s = a.isend(to_b, 1, sbuf.take().unwrap()).unwrap();
            // b: wait for the ping, echo it.
            let (v, _) = loop {
                a.progress();
                if let Some(c) = b.test(br).unwrap() {
                    break c.into_recv().unwrap();
                }
            };
            if let Some(p) = b_pending.take() {
                // The previous echo's send: its acknowledgement rode on this ping.
                let back = loop {
                    if let Some(c) = b.test(p).unwrap() {
                        break c.into_send().unwrap();
                    }
                    a.progress();
                };
                let SendBuf::Owned(v) = back else {
                    unreachable!()
                };
                b_rbuf = Some(RecvBuf::Owned(v));
            } else {
                b_rbuf = Some(RecvBuf::Owned(vec![0u8; 8]));
            }
            let RecvBuf::Owned(v) = v else { unreachable!() };
            b_pending = Some(b.isend(to_a, 1, v).unwrap());
            // a: wait for the echo and for its own send's completion.
            let (mut got, mut sent) = (None, None);
            while got.is_none() || sent.is_none() {
                b.progress();
                if got.is_none() {
                    got = a.test(r).unwrap();
                }
                if sent.is_none() {
                    sent = a.test(s).unwrap();
                }
            }
            rbuf = Some(got.unwrap().into_recv().unwrap().0);
            sbuf = Some(sent.unwrap().into_send().unwrap());
        }
        let ns = t0.elapsed().as_nanos() as f64 / f64::from(n);
        results.push(ns);
        // Let the last echo complete before the next run.
        if let Some(p) = b_pending.take() {
            while b.test(p).unwrap().is_none() {
                a.progress();
            }
        }
    }
    results.sort_by(f64::total_cmp);
    println!("emx runtime cost: one 8-byte round trip (2 messages, both sides, one thread, in-memory link)");
    println!(
        "best {:.0} ns, median {:.0} ns per round trip (5 runs)",
        results[0], results[2]
    );
}
