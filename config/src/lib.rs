//! emx cluster files: one TOML file that describes every node of a cluster,
//! read, checked and turned into each node's engine configuration
//! ([`emx::runtime::NodeConfig`], which [`emx::runtime::start_node`] starts).
//!
//! The crate owns the file format and its checks. It starts nothing: no EAL,
//! no port, no thread.
//!
//! # The file
//!
//! Five tables. `[cluster]` says what every frame of the cluster carries.
//! `[protocol]` holds the protocol thresholds, the engine's
//! [`ProtocolConfig`](emx::runtime::ProtocolConfig) field for field (but
//! for `ethertype` and `cluster`, which belong in `[cluster]`): every key
//! optional, times in microseconds; all nodes of a cluster must agree on
//! them, which one shared file ensures. `[memory]` and `[logging]` are
//! optional too. Then one `[[node]]` table per node, in rank order: a
//! launcher's rank r runs the r-th, and errors count them from 0 (`node[0]`,
//! `node[1]`, ...). Defaults are in brackets.
//!
//! ```
//! # use emx::runtime::{Hugepages, ProgressMode};
//! # use emx_config::{ClusterConfig, LogLevel, Mac};
//! let text = r#"
//! [cluster]
//! id = 7                  # cluster id, u16 (required): frames of other clusters are dropped
//! ethertype = 0x88B5      # EtherType, >= 0x0600, not one the network uses (below) [0x88B5, IEEE local experimental]
//!
//! [protocol]
//! eager_threshold = 32768     # messages up to this many bytes go eager, longer ones rendezvous [32768]
//! unexpected_bytes = 67108864 # unexpected-message store, split among peers as credits [64 MiB: 1 MiB each of 64 peers]
//! window = 64                 # send window per peer in frames, 1..=256 [64]
//! pull_block = 262144         # bytes per rendezvous pull, rounded down to whole frames [256 KiB]
//! pull_inflight = 4           # pulls in flight per rendezvous receive, 1..=8 [4]
//! pack_max = 16               # small messages queued together leave up to this many to a frame; 1: never [16]
//! pack_below = 256            # messages up to this many bytes may be packed (copied into the frame) [256]
//! stream_min = 8388608        # rendezvous data goes in with streaming stores while large receives posted hold this many bytes; 0: never [8 MiB]
//! max_peers = 64              # peer table: at least every remote endpoint [64]
//! max_sends = 1024            # outstanding sends [1024]
//! max_recvs = 1024            # outstanding receives [1024]
//! rto_initial_us = 2000       # retransmission timeout before the first RTT sample (must lie within rto_min_us..=rto_max_us) [1000]
//! rto_min_us = 2000           # least retransmission timeout; raise it where receivers stall (VMs, slow links); a quarter of peer_timeout_us at most [1000]
//! rto_max_us = 100000         # most retransmission timeout, after backoff (and a quarter of peer_timeout_us at most) [100000]
//! ack_delay_us = 20           # an ack waits this long for a reply to ride on, below rto_min_us [20]
//! ack_every = 16              # acknowledge at once after this many in-order frames [16]
//! checksum = "full"           # "off" (Ethernet FCS alone) | "header" | "full" (payload too) ["header"]
//! keepalive_us = 10000        # probe a silent peer we wait on after this long [10000]
//! peer_timeout_us = 1000000   # liveness deadline: then the peer is unreachable [1000000]
//!
//! [memory]
//! hugepages = "never"     # "auto" | "require" | "never" (--no-huge) ["auto"]
//! memory_mb = 256         # EAL memory, MiB; on hugepages, what must be free to use them [512]
//! region_mb = 64          # memory registered for zero-copy sends, MiB [64]
//!
//! [logging]
//! level = "debug"         # "error" | "warn" | "info" | "debug" | "trace" ["info"]
//! format = "text"         # "text" | "json" ["text"]; emxd's lines and DPDK's alike
//!
//! [[node]]
//! id = 1                          # node number, unique (required)
//! name = "alpha"                  # unique, 1-64 of A-Z a-z 0-9 . _ -, not starting with '.' or '-', not a number (required)
//! mac = "02:00:00:00:00:01"       # its port's MAC (emxd checks it), or "auto" (required)
//! port = "net_memif0,role=server,socket=/tmp/emx-memif.sock,mac=02:00:00:00:00:01"  # PCI address or vdev devargs (required)
//! mtu = 1500                      # link MTU [the driver's]; memif takes up to 9000
//! cores = [1]                     # polling cores: a polling thread on the first; none: inline [[]]
//! spin = false                    # never back off when idle (isolated core; needs cores) [false]
//! idle_sleep_us = 2000            # longest idle sleep of the polling thread, 20-1000000 us (needs cores, not spin) [1000]
//! endpoints = [0, 1]              # endpoint numbers; more than one needs cores [[0]]
//! eal_args = []                   # further EAL arguments, as they are [[]]
//!
//! [[node]]
//! id = 2
//! name = "beta"
//! mac = "auto"                    # learnt at run time from its frames
//! port = "net_memif0,role=client,socket=/tmp/emx-memif.sock"
//! "#;
//! let cluster = ClusterConfig::parse(text, "cluster.toml")?;
//! assert_eq!(cluster.cluster().ethertype, 0x88B5);
//! assert_eq!(cluster.memory().hugepages, Hugepages::Never);
//! assert_eq!(cluster.logging().level, LogLevel::Debug);
//! assert_eq!(cluster.node_by_name("beta").unwrap().mac, Mac::Auto);
//!
//! // Node beta's engine: inline, with both of alpha's endpoints as peers.
//! let beta = cluster.node_config(2)?;
//! assert_eq!(beta.link.devargs, "net_memif0,role=client,socket=/tmp/emx-memif.sock");
//! assert_eq!(beta.engine.progress, ProgressMode::Inline);
//! assert_eq!(beta.engine.protocol.cluster, Some(7));
//! let core = beta.engine.protocol.core_config(1500);
//! assert_eq!(core.checksum, emx::proto::ChecksumMode::Full);
//! assert_eq!(core.rto_min, std::time::Duration::from_micros(2000));
//! assert_eq!(beta.engine.peers.len(), 2);
//! // Node alpha's: a polling thread on core 1; beta's MAC is learnt at run time.
//! let alpha = cluster.node_config(1)?;
//! assert_eq!(alpha.engine.progress, ProgressMode::Thread { core: Some(1), spin: false });
//! assert_eq!(alpha.engine.idle_sleep_us, 2000);
//! assert_eq!(alpha.engine.peers.len(), 1);
//! assert_eq!(alpha.engine.peers[0].mac, emx::runtime::AUTO_MAC);
//! # Ok::<(), emx_config::ConfigError>(())
//! ```
//!
//! Keys that the format does not know are errors, in every table. So are
//! duplicate node ids, names and MACs, a multicast or zero MAC, duplicate
//! cores or endpoints within a node, `spin` without `cores`, `idle_sleep_us`
//! without `cores`, with `spin` or outside 20..=1000000, thresholds out of
//! range (`rto_initial_us` outside `rto_min_us..=rto_max_us` among them),
//! nodes whose MTUs differ, a `memory_mb` too small for a node's mbuf pool,
//! an EtherType below 0x0600 or one the network takes for its own (IP, ARP,
//! VLAN tags, LLDP, PAUSE, ...), and a file without nodes. Whether a node's cores exist is a property of the machine it runs
//! on: [`ClusterConfig::check_cores`] checks that there.
//!
//! Every error names the file, the line and the field, and says what was
//! expected:
//!
//! ```text
//! cluster.toml:12: node[1].mac: bad MAC address "zz" (want aa:bb:cc:dd:ee:ff or auto)
//! ```
//!
//! # Which node am I
//!
//! A process finds its node with [`resolve_identity`]: from a `--node NAME|ID`
//! flag, the `EMX_NODE` variable, or a launcher's rank (`OMPI_COMM_WORLD_RANK`,
//! `PMI_RANK`, `SLURM_PROCID`, in that order), then
//! [`ClusterConfig::local_node_config`] gives its engine configuration:
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cluster = emx_config::ClusterConfig::load("cluster.toml")?;
//! let me = emx_config::resolve_identity(None, |k| std::env::var(k).ok())?;
//! let node = emx::runtime::start_node(&cluster.local_node_config(&me)?)?;
//! # Ok(()) }
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod check;
mod cluster;
mod error;
mod identity;
mod locate;

pub use cluster::{
    machine_cpus, ClusterConfig, ClusterSection, LogFormat, LogLevel, LoggingConfig, Mac,
    MemoryConfig, NodeSpec,
};
pub use error::ConfigError;
pub use identity::{
    resolve_identity, Identity, IdentitySource, Who, NODE_VARIABLE, RANK_VARIABLES,
};
