//! The cluster file format against its examples, broken files and the ways a
//! process says which node it is.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use emx::runtime::{Hugepages, ProgressMode};
use emx_config::{
    resolve_identity, ClusterConfig, ConfigError, IdentitySource, LogFormat, LogLevel, Mac, Who,
};

fn dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(sub)
}

fn toml_files(sub: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir(sub))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_example_loads_and_maps_onto_the_engine() {
    let files = toml_files("examples");
    assert!(files.len() >= 4, "examples: {files:?}");
    for path in files {
        let cluster = ClusterConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(!cluster.nodes().is_empty());
        let n = cluster.nodes().len();
        for (rank, node) in cluster.nodes().iter().enumerate() {
            let cfg = cluster
                .node_config(node.id)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(cfg.engine.node, node.id);
            assert_eq!(cfg.engine.endpoints, node.endpoints);
            assert_eq!(cfg.link.devargs, node.port);
            assert_eq!(cfg.link.mtu, node.mtu);
            assert_eq!(cfg.eal.hugepages, cluster.memory().hugepages);
            assert_eq!(cfg.eal.memory_mb, cluster.memory().memory_mb);
            assert_eq!(cfg.engine.protocol.cluster, Some(cluster.cluster().id));
            assert_eq!(
                cfg.engine.protocol.ethertype,
                Some(cluster.cluster().ethertype)
            );
            match node.cores.first() {
                Some(&c) => assert_eq!(
                    cfg.engine.progress,
                    ProgressMode::Thread {
                        core: Some(c),
                        spin: node.spin
                    }
                ),
                None => assert_eq!(cfg.engine.progress, ProgressMode::Inline),
            }
            // Peers: every endpoint of every other node, `auto` ones learnt.
            let want: usize = cluster
                .nodes()
                .iter()
                .filter(|o| o.id != node.id)
                .map(|o| o.endpoints.len())
                .sum();
            assert_eq!(cfg.engine.peers.len(), want, "{}", path.display());
            assert!(cfg.engine.peers.iter().all(|p| p.node != node.id));
            for p in &cfg.engine.peers {
                let other = cluster.node_by_id(p.node).unwrap();
                assert_eq!(
                    p.mac,
                    other.mac.addr().unwrap_or(emx::runtime::AUTO_MAC),
                    "{}",
                    path.display()
                );
            }
            // The engine's own checks agree with the file's.
            let core = cfg
                .engine
                .protocol
                .core_config(node.mtu.map_or(1500, usize::from));
            core.validate().unwrap();
            // The node is found by name, id and rank alike.
            for who in [
                Who::Name(node.name.clone()),
                Who::Id(node.id),
                Who::Rank(rank),
            ] {
                let me = emx_config::Identity {
                    who,
                    source: IdentitySource::Flag,
                };
                assert_eq!(cluster.node_for(&me).unwrap().id, node.id);
            }
            // Cores checked against a machine big enough for any example.
            cluster.check_cores(node.id, 64).unwrap();
        }
        let past = emx_config::Identity {
            who: Who::Rank(n),
            source: IdentitySource::Env("PMI_RANK"),
        };
        let e = cluster.node_for(&past).unwrap_err().to_string();
        assert!(
            e.contains(&format!("rank {n} (from PMI_RANK) is not in the file")),
            "{e}"
        );
    }
}

#[test]
fn examples_say_what_they_promise() {
    let memif = ClusterConfig::load(dir("examples/memif-pair.toml")).unwrap();
    assert_eq!(memif.nodes().len(), 2);
    assert_eq!(memif.memory().hugepages, Hugepages::Never);
    assert!(memif
        .nodes()
        .iter()
        .all(|n| n.port.starts_with("net_memif")));

    for f in ["examples/netns.toml", "examples/docker.toml"] {
        let c = ClusterConfig::load(dir(f)).unwrap();
        assert_eq!(c.nodes().len(), 3, "{f}");
        assert!(c.nodes().iter().all(|n| n.mac == Mac::Auto), "{f}");
        // Every MAC is learnt at run time: each node starts with the other
        // two as peers of unknown address.
        for n in c.nodes() {
            let peers = c.node_config(n.id).unwrap().engine.peers;
            assert_eq!(peers.len(), 2, "{f}");
            assert!(peers.iter().all(|p| p.mac == emx::runtime::AUTO_MAC));
        }
    }
    let docker = ClusterConfig::load(dir("examples/docker.toml")).unwrap();
    assert_eq!(docker.logging().format, LogFormat::Json);

    let nic = ClusterConfig::load(dir("examples/nic-cluster.toml")).unwrap();
    assert_eq!(nic.nodes().len(), 4);
    assert_eq!(nic.memory().hugepages, Hugepages::Require);
    assert_eq!(nic.logging().level, LogLevel::Warn);
    assert_eq!(nic.memory().region_bytes(), 512 << 20);
    let n4 = nic.node_config(4).unwrap();
    assert_eq!(n4.link.devargs, "0000:af:00.0");
    assert_eq!(n4.eal.args, ["-a", "0000:af:00.0"]);
    assert_eq!(
        n4.engine.progress,
        ProgressMode::Thread {
            core: Some(2),
            spin: true
        }
    );
    // Three other nodes, two endpoints each, all with known MACs.
    assert_eq!(n4.engine.peers.len(), 6);
    let p = &n4.engine.peers[0];
    assert_eq!(
        (p.node, p.endpoint, p.mac),
        (1, 0, [0xb8, 0xce, 0xf6, 0x10, 0, 1])
    );
    // A 2-CPU machine cannot host a node that polls on cores 2 and 3.
    let e = nic.check_cores(1, 2).unwrap_err().to_string();
    assert!(e.contains("nic-cluster.toml:"), "{e}");
    assert!(
        e.contains("node[0].cores[0]: core 2 is out of range"),
        "{e}"
    );
    // A port that came up with another address than the file's: named, with
    // the address to set.
    nic.check_mac(1, [0xb8, 0xce, 0xf6, 0x10, 0, 1]).unwrap();
    let e = nic
        .check_mac(1, [0xb8, 0xce, 0xf6, 0x10, 0, 9])
        .unwrap_err()
        .to_string();
    assert!(e.contains("nic-cluster.toml:44: node[0].mac:"), "{e}");
    assert!(e.contains("came up as b8:ce:f6:10:00:09"), "{e}");
    assert!(e.contains("set mac = \"b8:ce:f6:10:00:09\""), "{e}");
    // Another node's address: the process took the wrong node (launcher
    // ranks in another order than the tables), and setting the address would
    // only hide it; it says which node this is.
    let e = nic
        .check_mac(1, [0xb8, 0xce, 0xf6, 0x10, 0, 2])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("node[0].mac: this process took node \"n01\""),
        "{e}"
    );
    assert!(e.contains("node[1] \"n02\"'s address"), "{e}");
    assert!(e.contains("--node n02") && !e.contains("set mac"), "{e}");
}

/// A memif port makes its address up unless its devargs give one: the check
/// says so, and "auto" never fails it.
#[test]
fn check_mac_on_memif() {
    let text = |mac: &str, port: &str| {
        format!(
            "[cluster]\nid = 1\n\n[[node]]\nid = 1\nname = \"a\"\nmac = \"{mac}\"\nport = \"{port}\"\n\n\
             [[node]]\nid = 2\nname = \"b\"\nmac = \"auto\"\n\
             port = \"net_memif0,role=client\"\n"
        )
    };
    let c = ClusterConfig::parse(
        &text("02:00:00:00:00:01", "net_memif0,role=server"),
        "m.toml",
    )
    .unwrap();
    let e = c
        .check_mac(1, [0x6a, 1, 2, 3, 4, 5])
        .unwrap_err()
        .to_string();
    assert!(e.contains("m.toml:7: node[0].mac:"), "{e}");
    assert!(
        e.contains("add mac=02:00:00:00:00:01 to the port's devargs"),
        "{e}"
    );
    let c = ClusterConfig::parse(
        &text(
            "02:00:00:00:00:01",
            "net_memif0,role=server,mac=02:00:00:00:00:01",
        ),
        "m.toml",
    )
    .unwrap();
    assert!(c.check_mac(1, [0x6a, 1, 2, 3, 4, 5]).is_err());
    c.check_mac(1, [2, 0, 0, 0, 0, 1]).unwrap();
    c.check_mac(2, [0x6a, 1, 2, 3, 4, 5]).unwrap();
    assert!(c.check_mac(3, [2, 0, 0, 0, 0, 1]).is_err());
}

/// Each broken file: the line, the field, and words of the expectation.
const BROKEN: &[(&str, usize, &str, &str)] = &[
    ("ack-delay.toml", 7, "protocol.ack_delay_us", "ack_delay_us (1500 us) must be below rto_min_us (1000 us)"),
    ("ack-every-zero.toml", 6, "protocol.ack_every", "0 is out of range (want at least 1 frame"),
    ("bad-checksum.toml", 6, "protocol.checksum", "unknown variant `crc32`, expected one of `off`, `header`, `full`"),
    ("bad-hugepages.toml", 6, "memory.hugepages", "unknown variant `sometimes`, expected one of `auto`, `require`, `never`"),
    ("bad-log-level.toml", 6, "logging.level", "unknown variant `verbose`, expected one of `error`, `warn`, `info`, `debug`, `trace`"),
    ("bad-mac.toml", 14, "node[1].mac", "bad MAC address \"zz\" (want aa:bb:cc:dd:ee:ff or auto)"),
    ("bad-port.toml", 9, "node[0].port", "bad port \"eth0\" (want a PCI address such as 0000:03:00.0, or vdev devargs"),
    ("core-out-of-range.toml", 10, "node[0].cores[1]", "core 7 is out of range: this machine has 4 CPUs: cores 0..=3"),
    ("duplicate-endpoint.toml", 11, "node[0].endpoints[2]", "endpoint 1 is listed twice (want distinct endpoint numbers)"),
    ("duplicate-id.toml", 18, "node[2].id", "duplicate node id 1 (node[0] \"n1\" at line 5 has it too)"),
    ("duplicate-mac.toml", 14, "node[1].mac", "duplicate MAC address 02:00:00:00:00:01 (node[0] \"n1\" at line 5 has it too)"),
    ("duplicate-name.toml", 13, "node[1].name", "duplicate node name \"alpha\" (node[0] \"alpha\" at line 5 has it too)"),
    ("idle-sleep-inline.toml", 10, "node[0].idle_sleep_us", "idle_sleep_us = 5000 is a polling thread's, and an inline node has none (give cores = [N], or drop idle_sleep_us)"),
    ("idle-sleep-range.toml", 11, "node[0].idle_sleep_us", "idle_sleep_us = 5 (want 20 to 1000000 microseconds)"),
    ("idle-sleep-spin.toml", 12, "node[0].idle_sleep_us", "idle_sleep_us = 5000 with spin = true: a spinning polling thread never sleeps"),
    ("endpoints-inline.toml", 10, "node[0].endpoints", "2 endpoints need a polling thread (give cores = [N])"),
    ("eager-huge.toml", 7, "protocol.eager_threshold", "must hold one eager message of eager_threshold bytes (9223372036854776064 bytes with its framing)"),
    ("ethertype-vlan.toml", 4, "cluster.ethertype", "0x8100 is an 802.1Q VLAN tag's EtherType"),
    ("ethertype-pause.toml", 4, "cluster.ethertype", "0x8808 is Ethernet flow control (PAUSE)'s EtherType"),
    ("ethertype-low.toml", 4, "cluster.ethertype", "0x0500 is below 0x0600, where values are frame lengths, not EtherTypes (want 0x0600..=0xffff"),
    ("memory-for-pool.toml", 6, "memory.memory_mb", "128 MiB cannot hold node \"n1\"'s mbuf pool, about 146 MiB at mtu 9000, beside the EAL's and the driver's own memory (give memory_mb more: 210 leaves room for the rest)"),
    ("memory-default.toml", 9, "memory.memory_mb", "not set, and the default, 512 MiB, cannot hold node \"n1\"'s mbuf pool, about 1027 MiB at mtu 65535, beside the EAL's and the driver's own memory (add memory_mb = 1091 or more under [memory])"),
    ("memory-no-room.toml", 7, "memory.memory_mb", "148 MiB cannot hold node \"n1\"'s mbuf pool, about 146 MiB at mtu 9000, beside"),
    ("missing-port.toml", 11, "node[1].port", "missing (this key is required)"),
    ("mtu-mismatch.toml", 16, "node[1].mtu", "mtu 1500 differs from node[0] \"n1\" at line 5 (mtu 9000): frames longer than a peer's MTU are dropped there (give every node the same mtu)"),
    ("mtu-memif.toml", 13, "node[0].mtu", "16000 is more than memif takes (want at most 9000 on a memif port)"),
    ("mtu-first-bad.toml", 9, "node[0].mtu", "50 is out of range (want 140..=65535 bytes)"),
    ("mtu-unset.toml", 12, "node[1].mtu", "no mtu (the default, 1500) differs from node[0] \"n1\" at line 5 (mtu 9000): frames longer than a peer's MTU are dropped there"),
    ("name-dash.toml", 7, "node[0].name", "bad node name \"-n1\" (want 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-')"),
    ("name-slash.toml", 7, "node[0].name", "bad node name \"rack1/n1\" (want 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-')"),
    ("no-nodes.toml", 1, "node", "no [[node]] tables: a cluster needs at least one node"),
    ("numeric-name.toml", 7, "node[0].name", "a name must not be a number"),
    ("pack-max-zero.toml", 6, "protocol.pack_max", "0 is out of range (want at least 1 message per frame"),
    ("protocol-ethertype.toml", 6, "protocol.ethertype", "the EtherType belongs in [cluster] (cluster.ethertype), not in [protocol]"),
    ("pull-inflight-range.toml", 6, "protocol.pull_inflight", "9 is out of range (want 1..=8"),
    ("rto-max-huge.toml", 7, "protocol.rto_max_us", "out of range (want at most 3600000000 us, an hour)"),
    ("rto-initial-below-min.toml", 6, "protocol.rto_initial_us", "500 is outside rto_min_us..=rto_max_us (1000..=100000)"),
    ("rto-order.toml", 7, "protocol.rto_min_us", "rto_min_us (5000 us) must be above 0 and at most rto_max_us (1000 us)"),
    ("rto-min-above-deadline.toml", 7, "protocol.rto_min_us", "rto_min_us (400000 us) is above a quarter of peer_timeout_us (1000000 us): a lost frame would go again too seldom, or not at all, before its peer is given up (give rto_min_us 250000 at most, or peer_timeout_us 1600000 at least)"),
    ("syntax.toml", 10, "", "not valid TOML: invalid string; expected `\"`, `'`"),
    ("timers.toml", 7, "protocol.keepalive_us", "keepalive_us (200000 us) must be above 0 and below peer_timeout_us (100000 us)"),
    ("unexpected-too-large.toml", 6, "protocol.unexpected_bytes", "8589934592 is out of range (want 1..=4294967296 bytes"),
    ("unknown-key.toml", 16, "node[1].colour", "unknown field `colour`, expected one of `id`, `name`, `mac`, `port`"),
    ("unknown-table.toml", 5, "logs", "unknown field `logs`, expected one of `cluster`, `protocol`, `memory`, `logging`, `node`"),
    ("window-range.toml", 6, "protocol.window", "300 is out of range (want 1..=256 frames"),
    ("window-type.toml", 6, "protocol.window", "\"ten\" is not a number (want a whole number in 0..=4294967295)"),
    ("endpoint-too-large.toml", 10, "node[0].endpoints[1]", "300 is out of range (want a whole number in 0..=255)"),
    ("ethertype-quoted.toml", 4, "cluster.ethertype", "\"0x88B5\" is in quotes: write the number without them (0x88B5)"),
    ("credit-small.toml", 6, "protocol.unexpected_bytes", "(unexpected_bytes / max_peers = 15625 bytes) must hold one eager message of eager_threshold bytes (33024 bytes with its framing) and be at most 1 GiB (give unexpected_bytes 2113536 at least, or eager_threshold 15360 at most, or max_peers 30 at most)"),
    ("credit-large.toml", 6, "protocol.unexpected_bytes", "(unexpected_bytes / max_peers = 2147483648 bytes) must hold one eager message of eager_threshold bytes (33024 bytes with its framing) and be at most 1 GiB (give unexpected_bytes 2147483649 at most, or max_peers 4 at least)"),
];

/// Loads a broken file the way a node would on a 4-CPU machine: parse, then
/// check every node's cores.
fn load_on_4_cpus(path: &Path) -> Result<ClusterConfig, ConfigError> {
    let c = ClusterConfig::load(path)?;
    for n in c.nodes() {
        c.check_cores(n.id, 4)?;
    }
    Ok(c)
}

#[test]
fn broken_files_fail_with_file_line_field_and_expectation() {
    let files = toml_files("tests/broken");
    let listed: Vec<&str> = BROKEN.iter().map(|b| b.0).collect();
    for f in &files {
        let name = f.file_name().unwrap().to_str().unwrap();
        assert!(
            listed.contains(&name),
            "tests/broken/{name} has no expectation in BROKEN"
        );
    }
    let mut failures = Vec::new();
    for &(name, line, field, want) in BROKEN {
        let path = dir("tests/broken").join(name);
        let shown = path.display().to_string();
        let err = match load_on_4_cpus(&path) {
            Ok(_) => {
                failures.push(format!("{name}: loaded, want an error"));
                continue;
            }
            Err(e) => e,
        };
        let text = err.to_string();
        let prefix = if field.is_empty() {
            format!("{shown}:{line}: ")
        } else {
            format!("{shown}:{line}: {field}: ")
        };
        if !text.starts_with(&prefix)
            || !text.contains(want)
            || err.line() != Some(line)
            || err.field() != Some(field)
        {
            failures.push(format!(
                "{name}:\n  got  {text}\n  want {prefix}...{want}..."
            ));
        }
        if std::env::var_os("EMX_SHOW_ERRORS").is_some() {
            println!("{text}");
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// The values a credit error offers are the bounds: each loads, and one
/// step past it fails.
#[test]
fn credit_errors_give_the_exact_bounds() {
    let file = |protocol: &str| {
        format!(
            "[cluster]\nid = 1\n\n[protocol]\n{protocol}\n\n[[node]]\nid = 1\nname = \"n1\"\n\
             mac = \"auto\"\nport = \"net_af_packet0,iface=eth1\"\n"
        )
    };
    let loads = |protocol: &str| ClusterConfig::parse(&file(protocol), "t.toml").is_ok();
    for (protocol, fixes) in [
        (
            "unexpected_bytes = 1000000",
            &[
                ("unexpected_bytes = 2113536", "unexpected_bytes = 2113535"),
                (
                    "unexpected_bytes = 1000000\neager_threshold = 15360",
                    "unexpected_bytes = 1000000\neager_threshold = 15361",
                ),
                (
                    "unexpected_bytes = 1000000\nmax_peers = 30",
                    "unexpected_bytes = 1000000\nmax_peers = 31",
                ),
            ][..],
        ),
        (
            "unexpected_bytes = 4294967296\nmax_peers = 2",
            &[
                (
                    "unexpected_bytes = 2147483649\nmax_peers = 2",
                    "unexpected_bytes = 2147483650\nmax_peers = 2",
                ),
                (
                    "unexpected_bytes = 4294967296\nmax_peers = 4",
                    "unexpected_bytes = 4294967296\nmax_peers = 3",
                ),
            ][..],
        ),
        // A message no credit holds (over 1 GiB): only a smaller one fits.
        (
            "eager_threshold = 1610612736\nmax_peers = 2\nunexpected_bytes = 1073741824",
            &[(
                "eager_threshold = 536870656\nmax_peers = 2\nunexpected_bytes = 1073741824",
                "eager_threshold = 536870657\nmax_peers = 2\nunexpected_bytes = 1073741824",
            )][..],
        ),
    ] {
        let e = ClusterConfig::parse(&file(protocol), "t.toml")
            .unwrap_err()
            .to_string();
        for (fixed, past) in fixes {
            // The line the fix changes.
            let line = fixed.lines().find(|l| !protocol.contains(l)).unwrap();
            let (key, value) = line.split_once(" = ").unwrap();
            assert!(
                e.contains(&format!("{key} {value}")),
                "{e} offers no {fixed}"
            );
            assert!(loads(fixed), "{fixed}");
            assert!(!loads(past), "{past}");
        }
    }
}

#[test]
fn a_missing_file_is_named() {
    let e = ClusterConfig::load("no/such/cluster.toml").unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    assert!(
        e.to_string()
            .starts_with("no/such/cluster.toml: cannot read the cluster file: "),
        "{e}"
    );
}

#[test]
fn unknown_node_id_is_an_error_naming_the_nodes() {
    let c = ClusterConfig::load(dir("examples/memif-pair.toml")).unwrap();
    let e = c.node_config(9).unwrap_err().to_string();
    assert!(
        e.ends_with("no node has id 9; the file's nodes are server (id 1), client (id 2)"),
        "{e}"
    );
    assert!(c.node_by_id(2).is_some() && c.node_by_name("server").is_some());
    assert!(c.node_by_name("nobody").is_none());
}

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

#[test]
fn identity_from_the_flag_first() {
    let all = env(&[("EMX_NODE", "client"), ("SLURM_PROCID", "1")]);
    let me = resolve_identity(Some("server"), &all).unwrap();
    assert_eq!(me.who, Who::Name("server".into()));
    assert_eq!(me.source, IdentitySource::Flag);
    let me = resolve_identity(Some("2"), &all).unwrap();
    assert_eq!(me.who, Who::Id(2));

    let c = ClusterConfig::load(dir("examples/memif-pair.toml")).unwrap();
    assert_eq!(c.node_for(&me).unwrap().name, "client");
    let nobody = resolve_identity(Some("nobody"), &all).unwrap();
    let e = c.node_for(&nobody).unwrap_err().to_string();
    assert!(e.contains("node \"nobody\" (from --node) is not in the file; its nodes are server (id 1), client (id 2)"), "{e}");

    let e = resolve_identity(Some("70000"), &all)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("--node=\"70000\": not a node id (want 0..=65535)"),
        "{e}"
    );
    let e = resolve_identity(Some(""), &all).unwrap_err().to_string();
    assert!(e.contains("empty (want a node name or id)"), "{e}");
}

#[test]
fn identity_from_emx_node() {
    let me = resolve_identity(None, env(&[("EMX_NODE", "client"), ("PMI_RANK", "0")])).unwrap();
    assert_eq!(me.who, Who::Name("client".into()));
    assert_eq!(me.source, IdentitySource::Env("EMX_NODE"));
    let me = resolve_identity(None, env(&[("EMX_NODE", " 1 ")])).unwrap();
    assert_eq!(me.who, Who::Id(1));
    // Empty counts as unset: the rank decides.
    let me = resolve_identity(None, env(&[("EMX_NODE", ""), ("PMI_RANK", "1")])).unwrap();
    assert_eq!(me.source, IdentitySource::Env("PMI_RANK"));
}

#[test]
fn identity_from_each_launcher_rank() {
    let c = ClusterConfig::load(dir("examples/docker.toml")).unwrap();
    for var in ["SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"] {
        let me = resolve_identity(None, env(&[(var, "2")])).unwrap();
        assert_eq!(me.who, Who::Rank(2), "{var}");
        assert_eq!(me.source, IdentitySource::Env(var));
        // Rank r is the r-th node in file order.
        assert_eq!(c.node_for(&me).unwrap().name, "c3", "{var}");
        let e = resolve_identity(None, env(&[(var, "two")]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!("{var}=\"two\": not a rank (want a number: 0, 1, ...)")
        );
    }
    // In the order Open MPI, PMI, Slurm: under mpirun in a Slurm job, every
    // process on a host has the host's SLURM_PROCID.
    let me = resolve_identity(
        None,
        env(&[("OMPI_COMM_WORLD_RANK", "0"), ("PMI_RANK", "1")]),
    )
    .unwrap();
    assert_eq!(me.source, IdentitySource::Env("OMPI_COMM_WORLD_RANK"));
    let me = resolve_identity(None, env(&[("PMI_RANK", "3"), ("SLURM_PROCID", "1")])).unwrap();
    assert_eq!(me.source, IdentitySource::Env("PMI_RANK"));
    assert_eq!(me.who, Who::Rank(3));
}

#[test]
fn no_identity_lists_every_way_to_give_one() {
    let e = resolve_identity(None, env(&[("HOME", "/root")])).unwrap_err();
    assert!(matches!(e, ConfigError::NoIdentity));
    let text = e.to_string();
    for way in [
        "--node",
        "EMX_NODE",
        "SLURM_PROCID",
        "PMI_RANK",
        "OMPI_COMM_WORLD_RANK",
    ] {
        assert!(text.contains(way), "{text} does not mention {way}");
    }
}

#[test]
fn the_documented_defaults() {
    let c = ClusterConfig::parse(
        "[cluster]\nid = 5\n[[node]]\nid = 0\nname = \"solo\"\nmac = \"auto\"\nport = \"net_tap0\"\n",
        "<test>",
    )
    .unwrap();
    assert_eq!(c.cluster().ethertype, 0x88B5);
    assert_eq!(c.memory().hugepages, Hugepages::Auto);
    assert_eq!((c.memory().memory_mb, c.memory().region_mb), (512, 64));
    assert_eq!(
        (c.logging().level, c.logging().format),
        (LogLevel::Info, LogFormat::Text)
    );
    let n = &c.nodes()[0];
    assert_eq!(n.endpoints, [0]);
    assert!(n.cores.is_empty() && !n.spin && n.mtu.is_none() && n.eal_args.is_empty());
    let cfg = c.node_config(0).unwrap();
    assert_eq!(cfg.engine.progress, ProgressMode::Inline);
    assert_eq!(cfg.link.mbufs, 16383);
    // The timer and checksum defaults the crate documentation gives.
    let core = c.protocol().core_config(1500);
    assert_eq!(
        (
            core.rto_initial.as_micros(),
            core.rto_min.as_micros(),
            core.rto_max.as_micros(),
            core.ack_delay.as_micros(),
            core.ack_every,
            core.keepalive.as_micros(),
            core.peer_timeout.as_micros(),
        ),
        (1000, 1000, 100_000, 20, 16, 10_000, 1_000_000)
    );
    assert_eq!(core.checksum, emx::proto::ChecksumMode::Header);
}
