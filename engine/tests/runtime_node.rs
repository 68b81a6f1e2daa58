//! Nodes started from configuration values (as TOML): EAL, port and engine.
#![cfg(feature = "runtime")]

use std::time::Duration;

use emx::proto::Addr;
use emx::runtime::{start_node_on, EalConfig, NodeConfig, ProgressMode};

fn node(toml_text: &str) -> NodeConfig {
    toml::from_str(toml_text).expect("valid node config")
}

/// Jumbo frames, as memif takes them: the node sizes its pool for them.
#[test]
fn two_nodes_from_toml_over_memif() {
    let sock = format!("/tmp/emx-node-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    let a = node(&format!(
        r#"
        [eal]
        hugepages = "auto"
        memory_mb = 256
        [link]
        devargs = "net_memif0,role=server,socket={sock},mac=02:aa:00:00:00:01"
        mtu = 9000
        [engine]
        node = 1
        progress = {{ mode = "thread" }}
        peers = [{{ node = 2, mac = "02:aa:00:00:00:02" }}]
        [engine.protocol]
        eager_threshold = 16384
        peer_timeout_us = 2000000
        "#
    ));
    let b = node(&format!(
        r#"
        [link]
        devargs = "net_memif1,role=client,socket={sock},mac=02:aa:00:00:00:02"
        mtu = 9000
        [engine]
        node = 2
        peers = [{{ node = 1, mac = "02:aa:00:00:00:01" }}]
        "#
    ));
    assert_eq!(b.eal, EalConfig::default());
    assert!(matches!(
        a.engine.progress,
        ProgressMode::Thread {
            core: None,
            spin: false
        }
    ));
    let eal = a.eal.start().unwrap();
    // Server first: a memif client cannot start before the server's socket
    // exists; each waits for its link, so start the client from a thread,
    // once the server listens.
    let (eal2, lb, eb) = (eal.clone(), b.link.clone(), b.engine.clone());
    let listening = sock.clone();
    let tb = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        while !dpdk_ffi::memif_listening(&listening) {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the memif server never listened on {listening}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        start_node_on(&eal2, &lb, &eb).unwrap()
    });
    let mut na = start_node_on(&eal, &a.link, &a.engine).unwrap();
    let mut nb = tb.join().unwrap();
    assert_eq!((na.port.mtu(), nb.port.mtu()), (9000, 9000));
    assert!(na.pool.data_room() >= 9000 + 18 + 128);
    let (mut ea, mut eb) = (na.engine.endpoint().unwrap(), nb.engine.endpoint().unwrap());
    let r = eb.irecv(None, 5, u64::MAX, vec![0u8; 100_000]).unwrap();
    let s = ea.isend(Addr::new(2, 0), 5, vec![3u8; 100_000]).unwrap();
    let (buf, info) = eb.wait(r).unwrap().into_recv().unwrap();
    assert_eq!((info.src, info.msg_len), (Addr::new(1, 0), 100_000));
    assert!(buf.as_ref().iter().all(|&x| x == 3));
    // b is inline: keep driving it until a's send is acknowledged.
    loop {
        if let Some(c) = ea.test(s).unwrap() {
            c.into_send().unwrap();
            break;
        }
        eb.progress();
    }
    // 100 kB in frames of 8.9 kB, each whole in one mbuf.
    let (_, st) = eb.stats(Addr::new(1, 0)).unwrap();
    assert!(st.rx_frames < 40, "{st:?}");
    assert_eq!(st.rx_chained, 0);
    drop((ea, eb, na, nb));
}

#[test]
fn unknown_keys_and_bad_values_are_rejected() {
    let err = toml::from_str::<NodeConfig>(
        "[link]\ndevargs = \"x\"\n[engine]\nnode = 1\neager_treshold = 5\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("eager_treshold"),
        "names the unknown key: {err}"
    );
    let err = toml::from_str::<NodeConfig>(
        "[link]\ndevargs = \"x\"\n[engine]\nnode = 1\npeers = [{ node = 2, mac = \"02:00:zz:00:00:01\" }]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("bad MAC address"), "says what is wrong: {err}");
    let err = toml::from_str::<NodeConfig>("[link]\ndevargs = \"x\"\n[engine]\nnode = \"one\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("node"), "{err}");
}

/// A pool larger than the EAL's memory fails with the pool's size and the
/// fix for the memory the EAL runs on (here `--no-huge`: its `memory_mb`).
#[test]
fn a_pool_larger_than_the_eal_memory_says_what_to_give() {
    let cfg = node(
        r#"
        [eal]
        hugepages = "never"
        memory_mb = 64
        [link]
        devargs = "net_memif0,role=server,socket=/tmp/emx-node-never-made.sock"
        mtu = 9000
        mbufs = 65535
        [engine]
        node = 1
        "#,
    );
    let eal = cfg.eal.start().unwrap();
    assert!(!eal.uses_hugepages());
    let Err(e) = start_node_on(&eal, &cfg.link, &cfg.engine) else {
        panic!("a pool of 65535 jumbo mbufs fits in 64 MiB")
    };
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            emx::runtime::Error::Pool {
                mbufs: 65535,
                hugepages: false,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("cannot create the mbuf pool, 65535 mbufs"),
        "{msg}"
    );
    assert!(
        msg.contains("give the EAL more memory: memory_mb at least"),
        "{msg}"
    );
}

/// Two nodes with the same number in one process (two clusters, or a node
/// restarted while its old pool still waits for mbufs out): each pool gets
/// a name of its own. Both used to be `emx1`, and the second start failed
/// with DPDK's bare EEXIST. A pool of 255 mbufs, below DPDK's 384 for a
/// cache of 256, gets a cache that fits.
#[test]
fn two_nodes_of_one_number_in_one_process() {
    let nodes: Vec<NodeConfig> = (0..2)
        .map(|i| {
            node(&format!(
                r#"
                [eal]
                hugepages = "never"
                memory_mb = 256
                [link]
                devargs = "net_null{i}"
                mbufs = {}
                [engine]
                node = 1
                progress = {{ mode = "inline" }}
                "#,
                [4095, 255][i]
            ))
        })
        .collect();
    let eal = nodes[0].eal.start().unwrap();
    let a = start_node_on(&eal, &nodes[0].link, &nodes[0].engine).unwrap();
    let b = start_node_on(&eal, &nodes[1].link, &nodes[1].engine).unwrap();
    assert_ne!(a.pool.name(), b.pool.name());
}

/// Memory registered under an EAL started without hugepages is on ordinary
/// pages, free hugepages or not: `hugepages = "never"` keeps the node off
/// them. The region used to take free hugepages regardless.
#[test]
fn registered_memory_follows_an_eal_without_hugepages() {
    let cfg = EalConfig {
        hugepages: emx::runtime::Hugepages::Never,
        memory_mb: 128,
        ..EalConfig::default()
    };
    let eal = cfg.start().unwrap();
    assert!(!eal.uses_hugepages());
    let region = emx::runtime::register_memory(&eal, 4 << 20).unwrap();
    assert!(!region.is_hugepages());
}
