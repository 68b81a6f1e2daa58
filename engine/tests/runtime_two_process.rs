//! Two processes, one engine each, over `net_memif`: every size from 0 to
//! 64 MiB and a mixed set, byte-exact, with a polling thread on each side.
//! The child process is this test binary running `child_peer`.
#![cfg(feature = "runtime")]

mod rt;

use std::process::Command;
use std::time::Duration;

use dpdk_ffi::{Port, PortConfig};
use emx::io::DpdkIo;
use emx::proto::Addr;
use emx::runtime::{Engine, ProgressMode};
use rt::*;

const SOCKET: &str = "EMX_TEST_SOCKET";
const SERVER_MAC: [u8; 6] = [0x02, 0xe3, 0, 0, 0, 1];
const CLIENT_MAC: [u8; 6] = [0x02, 0xe3, 0, 0, 0, 2];

fn sizes_for_test() -> Vec<usize> {
    sizes(
        &[
            0,
            1,
            1424,
            1425,
            32 << 10,
            (32 << 10) + 1,
            1 << 20,
            64 << 20,
        ],
        96 << 20,
        3,
    )
}

/// Creates the port, runs `then` (the server spawns its client there: a memif
/// client cannot start before the server's socket exists), waits for the
/// link and starts the engine.
fn engine_on(
    devargs: &str,
    node: u16,
    peer: u16,
    peer_mac: [u8; 6],
    then: impl FnOnce(),
) -> (Engine, dpdk_ffi::Eal) {
    let eal = eal();
    let pool = pool(&eal, "p");
    let port = Port::from_devargs(&eal, devargs, &PortConfig::default(), &pool).unwrap();
    then();
    port.wait_link(Duration::from_secs(20)).unwrap();
    let progress = ProgressMode::Thread {
        core: None,
        spin: false,
    };
    let engine = Engine::start(
        &config(node, peer, peer_mac, progress),
        DpdkIo::new(&port, 0, &pool).unwrap(),
    )
    .unwrap();
    (engine, eal)
}

#[test]
fn two_processes_over_memif() {
    let sock = format!("/tmp/emx-2p-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let mac = SERVER_MAC
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let mut child = None;
    let (mut engine, _eal) = engine_on(
        &format!("net_memif0,role=server,socket={sock},mac={mac}"),
        1,
        2,
        CLIENT_MAC,
        || {
            child = Some(
                Command::new(std::env::current_exe().unwrap())
                    .args([
                        "--exact",
                        "child_peer",
                        "--ignored",
                        "--nocapture",
                        "--test-threads=1",
                    ])
                    .env(SOCKET, &sock)
                    .spawn()
                    .unwrap(),
            );
        },
    );
    let mut child = child.unwrap();
    let mut ep = engine.endpoint().unwrap();
    let sizes = sizes_for_test();
    send_all(&mut ep, Addr::new(2, 0), &sizes, 8, None);
    // And the child's answer: the same set back.
    receive_all(&mut ep, &sizes, 8);
    let status = child.wait().unwrap();
    assert!(status.success(), "child failed: {status}");
}

#[test]
#[ignore = "run by two_processes_over_memif in a child process"]
fn child_peer() {
    let sock = std::env::var(SOCKET).expect("started by two_processes_over_memif");
    let mac = CLIENT_MAC
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let (mut engine, _eal) = engine_on(
        &format!("net_memif0,role=client,socket={sock},mac={mac}"),
        2,
        1,
        SERVER_MAC,
        || {},
    );
    let mut ep = engine.endpoint().unwrap();
    let sizes = sizes_for_test();
    receive_all(&mut ep, &sizes, 8);
    send_all(&mut ep, Addr::new(1, 0), &sizes, 8, None);
    let report = ep.close(Duration::from_secs(5));
    assert_eq!((report.aborted, report.lost), (0, 0));
}
