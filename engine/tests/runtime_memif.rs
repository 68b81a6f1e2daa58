//! The driver over DPDK: two cores on the two ports of a memif pair in one
//! process, progressed inline, exchange messages up to 64 MiB byte-exact.
//! Sends from registered memory go out with no payload copy.
#![cfg(feature = "runtime")]

use std::time::{Duration, Instant};

use dpdk_ffi::{Eal, ExtMem, Mempool, Port, PortConfig, DEFAULT_DATA_ROOM};
use emx::io::{DpdkIo, PacketIo};
use emx::proto::{Addr, Completion, Core, CoreConfig, MacAddr};
use emx::runtime::{Clock, Driver, RecvBuf, SendBuf};

fn pattern(i: usize, j: usize) -> u8 {
    (j.wrapping_mul(131) ^ i.wrapping_mul(17) ^ (j >> 12)) as u8
}

#[test]
fn memif_pair_inline_zero_copy_up_to_64_mib() {
    let eal = Eal::builder().memory_mb(512).init().unwrap();
    let pool = Mempool::new(&eal, "rt", 8191, 256, DEFAULT_DATA_ROOM).unwrap();
    let sock = format!("/tmp/emx-rt-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let cfg = PortConfig::default();
    let pa = Port::from_devargs(
        &eal,
        &format!("net_memif0,role=server,socket={sock}"),
        &cfg,
        &pool,
    )
    .unwrap();
    let pb = Port::from_devargs(
        &eal,
        &format!("net_memif1,role=client,socket={sock}"),
        &cfg,
        &pool,
    )
    .unwrap();
    pa.wait_link(Duration::from_secs(10)).unwrap();
    pb.wait_link(Duration::from_secs(10)).unwrap();
    let clock = Clock::new();
    let mk = |port: &Port, node: u16, peer: &Port, peer_node: u16| {
        let io = DpdkIo::new(port, 0, &pool).unwrap();
        let mut core = Core::new(
            CoreConfig::default(),
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
    let mut a = mk(&pa, 1, &pb, 2);
    let mut b = mk(&pb, 2, &pa, 1);

    let sizes = [0usize, 8, 1500, 40_000, 1 << 20, 64 << 20];
    let region = ExtMem::new(&eal, 66 << 20).unwrap();
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
        st.payload_attached as usize >= total - 1500 * 64,
        "payload attached, not copied: {st:?}"
    );
    assert!(
        (st.payload_copied as usize) < 1 << 20,
        "only short tails are copied: {st:?}"
    );
    drop((a, b));
    assert_eq!(
        region.lent_bytes(),
        0,
        "every send buffer went back to the region"
    );
}
