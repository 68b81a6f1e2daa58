//! The cluster file's tables as Rust types, reading them (the checks after
//! parsing are in `check`), and the mapping of one node onto the engine's
//! [`NodeConfig`].

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use emx::runtime::{
    parse_mac, EalConfig, EngineConfig, Hugepages, LinkConfig, NodeConfig, PeerConfig,
    ProgressMode, ProtocolConfig,
};
use serde::{Deserialize, Deserializer};

use crate::error::ConfigError;
use crate::identity::{Identity, Who};
use crate::locate::Locator;

/// A cluster file, read and checked: the cluster, its protocol settings,
/// memory, logging and nodes. Build one with [`ClusterConfig::load`] or
/// [`ClusterConfig::parse`]; turn one of its nodes into the engine's
/// configuration with [`ClusterConfig::node_config`].
#[derive(Clone)]
pub struct ClusterConfig {
    origin: String,
    cluster: ClusterSection,
    protocol: ProtocolConfig,
    memory: MemoryConfig,
    logging: LoggingConfig,
    nodes: Vec<NodeSpec>,
    /// Layout of the source, kept for errors found after parsing
    /// ([`ClusterConfig::check_cores`]).
    loc: Locator,
}

impl fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("origin", &self.origin)
            .field("cluster", &self.cluster)
            .field("protocol", &self.protocol)
            .field("memory", &self.memory)
            .field("logging", &self.logging)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

/// The file as serde reads it, before the checks.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    cluster: ClusterSection,
    #[serde(default)]
    protocol: ProtocolConfig,
    #[serde(default)]
    memory: MemoryConfig,
    #[serde(default)]
    logging: LoggingConfig,
    #[serde(default)]
    node: Vec<NodeSpec>,
}

/// `[cluster]`: what every frame of the cluster carries.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// Cluster id: frames of other clusters on the same wire are dropped.
    pub id: u16,
    /// EtherType of emx frames, at least 0x0600 (default 0x88B5, IEEE local
    /// experimental).
    #[serde(default = "default_ethertype")]
    pub ethertype: u16,
}

fn default_ethertype() -> u16 {
    emx::wire::DEFAULT_ETHERTYPE
}

/// `[memory]`: how the EAL gets its memory, and the registered region that
/// zero-copy sends come from.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// `"auto"` (hugepages when enough are free), `"require"` or `"never"`
    /// (`--no-huge`). Default auto.
    #[serde(default)]
    pub hugepages: Hugepages,
    /// EAL memory in MiB (default 512, the engine's).
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u32,
    /// Size of the memory region registered for zero-copy sends, in MiB
    /// (default 64).
    #[serde(default = "default_region_mb")]
    pub region_mb: u32,
}

fn default_memory_mb() -> u32 {
    EalConfig::default().memory_mb
}

fn default_region_mb() -> u32 {
    64
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            hugepages: Hugepages::default(),
            memory_mb: default_memory_mb(),
            region_mb: default_region_mb(),
        }
    }
}

impl MemoryConfig {
    /// The registered region's size in bytes, for
    /// [`emx::runtime::register_memory`].
    pub fn region_bytes(&self) -> usize {
        self.region_mb as usize * (1 << 20)
    }
}

/// `[logging]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LoggingConfig {
    /// The most verbose level written (default info).
    #[serde(default)]
    pub level: LogLevel,
    /// How lines are written (default text).
    #[serde(default)]
    pub format: LogFormat,
}

/// A log level, as `tracing` and `env_logger` name them.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Errors and warnings.
    Warn,
    /// And what happens once per start or per peer (the default).
    #[default]
    Info,
    /// And detail for finding faults.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// The level's name as a filter directive takes it (`"info"`).
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// A node's MAC address: given, or `auto` (its peers greet everyone on the
/// segment and learn the address from its answer, and again when it comes
/// back from a restart on another address).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mac {
    /// Not known before the port is up.
    Auto,
    /// A unicast address.
    Addr([u8; 6]),
}

impl Mac {
    /// The address, when the file gives one.
    pub fn addr(self) -> Option<[u8; 6]> {
        match self {
            Mac::Auto => None,
            Mac::Addr(a) => Some(a),
        }
    }
}

impl FromStr for Mac {
    type Err = String;

    /// `auto` or `aa:bb:cc:dd:ee:ff` (hex digits in either case).
    fn from_str(s: &str) -> Result<Mac, String> {
        if s == "auto" {
            return Ok(Mac::Auto);
        }
        parse_mac(s)
            .map(Mac::Addr)
            .ok_or_else(|| format!("bad MAC address {s:?} (want aa:bb:cc:dd:ee:ff or auto)"))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mac::Auto => f.write_str("auto"),
            Mac::Addr(a) => write!(
                f,
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                a[0], a[1], a[2], a[3], a[4], a[5]
            ),
        }
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Mac, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// `[[node]]`: one node of the cluster, one engine.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Node number, unique in the cluster; frames carry it.
    pub id: u16,
    /// Name, unique in the cluster: 1 to 64 ASCII letters, digits, `.`, `_`
    /// or `-`, not starting with `.` or `-`, and not a number (so that
    /// `--node` can take either a name or an id).
    pub name: String,
    /// MAC address of its port, or `auto`.
    pub mac: Mac,
    /// The DPDK port: a PCI address (`0000:03:00.0`) or vdev devargs
    /// (`net_memif0,role=server,socket=/run/emx/memif.sock`,
    /// `net_af_packet0,iface=eth0`, ...).
    pub port: String,
    /// Link MTU (default: the driver's, 1500 for most, which the checks take
    /// it for; every node must have the same).
    #[serde(default)]
    pub mtu: Option<u16>,
    /// CPUs this node polls on. With at least one, a polling thread pinned
    /// to the first drives the engine; with none, the application drives it
    /// inline. The engine runs one polling thread, so further cores are
    /// checked but not used yet.
    #[serde(default)]
    pub cores: Vec<usize>,
    /// Never back off when idle: for an isolated polling core (needs `cores`).
    #[serde(default)]
    pub spin: bool,
    /// The longest the polling thread sleeps at a time when idle, in
    /// microseconds (20 to 1,000,000; default 1000): longer takes less CPU,
    /// shorter answers sooner after a quiet spell. Needs `cores`, and not
    /// `spin` (which never sleeps).
    #[serde(default)]
    pub idle_sleep_us: Option<u64>,
    /// The node's endpoints (default `[0]`); more than one needs `cores`.
    #[serde(default = "default_endpoints")]
    pub endpoints: Vec<u8>,
    /// Further EAL arguments, passed as they are.
    #[serde(default)]
    pub eal_args: Vec<String>,
}

fn default_endpoints() -> Vec<u8> {
    vec![0]
}

impl ClusterConfig {
    /// Reads and checks the cluster file at `path`. Errors name the path as
    /// given.
    pub fn load(path: impl AsRef<Path>) -> Result<ClusterConfig, ConfigError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        ClusterConfig::parse(&text, shown)
    }

    /// Parses and checks a cluster file's text; `origin` names it in errors
    /// (a path, or `<stdin>`).
    ///
    /// Checks everything that does not depend on the machine: the CPU count
    /// is checked for one node by [`ClusterConfig::check_cores`].
    pub fn parse(text: &str, origin: impl Into<String>) -> Result<ClusterConfig, ConfigError> {
        let origin = origin.into();
        let loc = Locator::new(text).map_err(|e| {
            let line = e.span().map_or(1, |s| line_of(text, s.start));
            ConfigError::Invalid {
                origin: origin.clone(),
                line,
                field: String::new(),
                problem: format!("not valid TOML: {}", one_line(e.message())),
            }
        })?;
        let raw: RawFile = toml::from_str(text).map_err(|e| serde_error(&origin, &loc, &e))?;
        let mut protocol = raw.protocol;
        // Where the file sets these in [protocol], the check below says to
        // move them; keep them out of the way of the [cluster] values.
        let (proto_ethertype, proto_cluster) = (protocol.ethertype, protocol.cluster);
        protocol.ethertype = Some(raw.cluster.ethertype);
        protocol.cluster = Some(raw.cluster.id);
        let cfg = ClusterConfig {
            origin,
            cluster: raw.cluster,
            protocol,
            memory: raw.memory,
            logging: raw.logging,
            nodes: raw.node,
            loc,
        };
        if proto_ethertype.is_some() {
            return Err(cfg.invalid(
                "protocol.ethertype",
                "the EtherType belongs in [cluster] (cluster.ethertype), not in [protocol]",
            ));
        }
        if proto_cluster.is_some() {
            return Err(cfg.invalid(
                "protocol.cluster",
                "the cluster id belongs in [cluster] (cluster.id), not in [protocol]",
            ));
        }
        cfg.check()?;
        Ok(cfg)
    }

    /// The name errors give the file.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// `[cluster]`.
    pub fn cluster(&self) -> &ClusterSection {
        &self.cluster
    }

    /// `[protocol]`, with the cluster id and EtherType of `[cluster]` filled
    /// in: what every node's engine gets.
    pub fn protocol(&self) -> &ProtocolConfig {
        &self.protocol
    }

    /// `[memory]`.
    pub fn memory(&self) -> &MemoryConfig {
        &self.memory
    }

    /// `[logging]`.
    pub fn logging(&self) -> &LoggingConfig {
        &self.logging
    }

    /// The nodes, in file order (the order launcher ranks count in).
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    /// The node with this id.
    pub fn node_by_id(&self, id: u16) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The node with this name.
    pub fn node_by_name(&self, name: &str) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The node an [`Identity`] names (by name, id, or launcher rank: the
    /// rank-th node in file order).
    pub fn node_for(&self, identity: &Identity) -> Result<&NodeSpec, ConfigError> {
        let found = match &identity.who {
            Who::Name(name) => self.node_by_name(name),
            Who::Id(id) => self.node_by_id(*id),
            Who::Rank(r) => self.nodes.get(*r),
        };
        found.ok_or_else(|| ConfigError::UnknownIdentity {
            origin: self.origin.clone(),
            who: identity.who.to_string(),
            from: identity.source.to_string(),
            known: self.known_nodes(),
        })
    }

    /// Checks that node `id`'s polling cores exist on a machine with `cpus`
    /// CPUs (numbered from 0). Run it on the machine the node runs on, with
    /// [`machine_cpus`]; a cluster file describes other machines too, so
    /// [`ClusterConfig::parse`] cannot.
    pub fn check_cores(&self, id: u16, cpus: usize) -> Result<(), ConfigError> {
        let (i, node) = self.index_of(id)?;
        for (j, &c) in node.cores.iter().enumerate() {
            if c >= cpus {
                let have = match cpus {
                    0 => "no CPUs".to_owned(),
                    1 => "1 CPU: core 0".to_owned(),
                    n => format!("{n} CPUs: cores 0..={}", n - 1),
                };
                return Err(self.invalid(
                    &format!("node[{i}].cores[{j}]"),
                    format!("core {c} is out of range: this machine has {have}"),
                ));
            }
        }
        Ok(())
    }

    /// Checks that node `id`'s `mac`, when the file gives one, is the address
    /// its port came up with (`actual`). Peers send to the configured address
    /// and drop frames from any other, so a wrong one leaves the node up but
    /// unreachable both ways. Run it once the port is up: a cluster file
    /// describes other machines too, and some ports (memif) make their address
    /// up at start.
    pub fn check_mac(&self, id: u16, actual: [u8; 6]) -> Result<(), ConfigError> {
        let (i, node) = self.index_of(id)?;
        match node.mac {
            Mac::Addr(want) if want != actual => {
                // Another node's address: this process took the wrong node
                // (a launcher's ranks in another order than the file's
                // nodes), and setting the address would hide it.
                let theirs = self
                    .nodes
                    .iter()
                    .enumerate()
                    .find(|(j, n)| *j != i && n.mac == Mac::Addr(actual));
                if let Some((j, other)) = theirs {
                    let (mine, port, at) = (&node.name, &node.port, Mac::Addr(actual));
                    let name = &other.name;
                    return Err(self.invalid(
                        &format!("node[{i}].mac"),
                        format!(
                            "this process took node {mine:?}, but its port {port:?} came up \
                             as {at}, node[{j}] {name:?}'s address (a launcher's ranks in \
                             another order than the [[node]] tables?): start it with --node \
                             {name} (or EMX_NODE={name}), or order the tables as the ranks"
                        ),
                    ));
                }
                let made_up = node.port.starts_with("net_memif")
                    && !node.port.split(',').any(|kv| kv.trim().starts_with("mac="));
                let fix = if made_up {
                    format!(
                        "memif makes its address up at each start unless told: add \
                         mac={} to the port's devargs, or set mac = \"auto\"",
                        node.mac
                    )
                } else {
                    format!(
                        "set mac = \"{}\", or mac = \"auto\" to learn it from the node's frames",
                        Mac::Addr(actual)
                    )
                };
                Err(self.invalid(
                    &format!("node[{i}].mac"),
                    format!(
                        "node {:?} is configured as {} but its port {:?} came up as {}, so its \
                         peers would drop its frames and it theirs; {fix}",
                        node.name,
                        node.mac,
                        node.port,
                        Mac::Addr(actual)
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// The engine's configuration for node `id`: its port as the link's
    /// devargs, `[memory]` for the EAL, its endpoints, a polling thread on its
    /// first core (inline progress when it has none), the protocol settings,
    /// and as peers every endpoint of every other node (a node with
    /// `mac = "auto"` gets [`emx::runtime::AUTO_MAC`]: its address is learnt
    /// at run time).
    pub fn node_config(&self, id: u16) -> Result<NodeConfig, ConfigError> {
        let (_, node) = self.index_of(id)?;
        let eal = EalConfig {
            hugepages: self.memory.hugepages,
            memory_mb: self.memory.memory_mb,
            args: node.eal_args.clone(),
        };
        let link = link_config(&node.port, node.mtu);
        let progress = match node.cores.first() {
            Some(&core) => ProgressMode::Thread {
                core: Some(core),
                spin: node.spin,
            },
            None => ProgressMode::Inline,
        };
        let peers = self
            .nodes
            .iter()
            .filter(|n| n.id != id)
            .map(|n| (n, n.mac.addr().unwrap_or(emx::runtime::AUTO_MAC)))
            .flat_map(|(n, mac)| {
                n.endpoints.iter().map(move |&endpoint| PeerConfig {
                    node: n.id,
                    endpoint,
                    mac,
                })
            })
            .collect();
        let engine = EngineConfig {
            endpoints: node.endpoints.clone(),
            progress,
            protocol: self.protocol.clone(),
            peers,
            idle_sleep_us: node
                .idle_sleep_us
                .unwrap_or(emx::runtime::DEFAULT_IDLE_SLEEP_US),
            ..EngineConfig::new(id)
        };
        Ok(NodeConfig { eal, link, engine })
    }

    /// [`ClusterConfig::node_config`] for the node `identity` names, after
    /// checking its cores against this machine's CPUs ([`machine_cpus`]).
    pub fn local_node_config(&self, identity: &Identity) -> Result<NodeConfig, ConfigError> {
        let id = self.node_for(identity)?.id;
        self.check_cores(id, machine_cpus())?;
        self.node_config(id)
    }

    fn index_of(&self, id: u16) -> Result<(usize, &NodeSpec), ConfigError> {
        self.nodes
            .iter()
            .enumerate()
            .find(|(_, n)| n.id == id)
            .ok_or_else(|| ConfigError::NoSuchNode {
                origin: self.origin.clone(),
                id,
                known: self.known_nodes(),
            })
    }

    fn known_nodes(&self) -> String {
        let all: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("{} (id {})", n.name, n.id))
            .collect();
        all.join(", ")
    }

    /// The line of `path` in the source, or of its table when the file
    /// leaves it to its default.
    pub(crate) fn line_of_path(&self, path: &str) -> usize {
        self.loc.line(path)
    }

    /// Whether the file sets `path` (a field left to its default is not).
    pub(crate) fn has_path(&self, path: &str) -> bool {
        self.loc.has(path)
    }

    /// An error at `path` (`protocol.max_recvs`, `node[1].mac`) found by
    /// the file's user, with the file and the line, as the crate's own
    /// checks give theirs: `cluster.toml:7: protocol.max_recvs: <problem>`.
    pub fn error_at(&self, path: &str, problem: impl Into<String>) -> ConfigError {
        self.invalid(path, problem)
    }

    /// An error at `path`, on its line (or its table's, when the file leaves
    /// it to its default).
    pub(crate) fn invalid(&self, path: &str, problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            origin: self.origin.clone(),
            line: self.line_of_path(path),
            field: path.to_owned(),
            problem: problem.into(),
        }
    }
}

/// The engine's link settings for `devargs`, with the engine's own defaults
/// for what the cluster file does not set (`LinkConfig` has no constructor,
/// and its defaults live in its serde attributes).
pub(crate) fn link_config(devargs: &str, mtu: Option<u16>) -> LinkConfig {
    let mut t = toml::Table::new();
    t.insert("devargs".into(), toml::Value::String(devargs.to_owned()));
    if let Some(mtu) = mtu {
        t.insert("mtu".into(), toml::Value::Integer(i64::from(mtu)));
    }
    let mut link: LinkConfig = toml::Value::Table(t)
        .try_into()
        .expect("a table with devargs and an in-range mtu is a LinkConfig");
    // Set again in case the engine's field ever changes representation.
    link.devargs = devargs.to_owned();
    link.mtu = mtu;
    link
}

/// How many CPUs this machine has: one past the highest number in
/// `/sys/devices/system/cpu/possible`, or the threads the process may use
/// when that cannot be read.
pub fn machine_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| parse_cpu_list(&s))
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
}

/// One past the highest CPU of a kernel CPU list (`0-3,8-11`).
fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut max = None;
    for part in s.trim().split(',') {
        let last = part.rsplit('-').next()?.trim().parse::<usize>().ok()?;
        max = max.max(Some(last));
    }
    max.map(|m| m + 1)
}

/// A message of several lines on one, the lines joined with "; ".
fn one_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines.join("; ")
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// A serde error from toml, located: toml gives a span and a message; the
/// span says the line and, through the layout, the field.
fn serde_error(origin: &str, loc: &Locator, e: &toml::de::Error) -> ConfigError {
    let message = &one_line(e.message());
    let span = e.span();
    let line = span.as_ref().map_or(1, |s| loc.line_of(s.start));
    let mut field = span
        .as_ref()
        .map_or("", |s| loc.path_at(s.start))
        .to_owned();
    let mut problem = message.to_owned();
    // toml reports a missing key with the span of its table (0..0 for the
    // top level): name the key itself.
    if let Some(key) = message
        .strip_prefix("missing field `")
        .and_then(|r| r.strip_suffix('`'))
    {
        let table = span.as_ref().map_or("", |s| loc.table_spanning(s));
        field = if table.is_empty() {
            key.to_owned()
        } else {
            format!("{table}.{key}")
        };
        problem = "missing (this key is required)".to_owned();
    }
    // toml's words for a number, a boolean or a list where a name belongs.
    if message == "wanted string or table" {
        if let Some(names) = names_of(&field) {
            problem = format!("want one of {names}, as a string in quotes");
        }
    }
    ConfigError::Invalid {
        origin: origin.to_owned(),
        line,
        field,
        problem: plain_numbers(&problem),
    }
}

/// The names a field that takes one of a set of names takes (`` `auto`,
/// `require`, `never` ``), from its type.
fn names_of(field: &str) -> Option<String> {
    fn names<T: serde::de::DeserializeOwned>() -> Option<String> {
        use serde::de::{value::Error, IntoDeserializer};
        // A name no type takes: serde's error lists the names it does.
        let e = T::deserialize(IntoDeserializer::<Error>::into_deserializer("\u{0}")).err()?;
        let e = e.to_string();
        let list = e.split_once(", expected ")?.1;
        Some(list.strip_prefix("one of ").unwrap_or(list).to_owned())
    }
    match field {
        "memory.hugepages" => names::<emx::runtime::Hugepages>(),
        "protocol.checksum" => names::<emx::proto::ChecksumMode>(),
        "logging.level" => names::<LogLevel>(),
        "logging.format" => names::<LogFormat>(),
        _ => None,
    }
}

/// serde's words for a number that does not fit, or is not one ("invalid
/// value: integer `300`, expected u8"), in a writer of cluster files'
/// terms: the range to give, and for a number in quotes, to drop them.
fn plain_numbers(problem: &str) -> String {
    // (The widest say nothing of a range: no count a file gives is near it.)
    const RANGES: [(&str, &str); 5] = [
        ("u8", "a whole number in 0..=255"),
        ("u16", "a whole number in 0..=65535"),
        ("u32", "a whole number in 0..=4294967295"),
        ("u64", "a whole number"),
        ("usize", "a whole number"),
    ];
    let Some((head, range)) = problem
        .rsplit_once(", expected ")
        .and_then(|(head, ty)| RANGES.iter().find(|r| r.0 == ty).map(|r| (head, r.1)))
    else {
        return problem.to_owned();
    };
    if let Some(n) = head
        .strip_prefix("invalid value: integer `")
        .and_then(|r| r.strip_suffix('`'))
    {
        return format!("{n} is out of range (want {range})");
    }
    if let Some(quoted) = head.strip_prefix("invalid type: string ") {
        let inner = quoted.trim_matches('"');
        let number = inner.parse::<u64>().is_ok()
            || inner
                .strip_prefix("0x")
                .is_some_and(|h| u64::from_str_radix(h, 16).is_ok());
        return if number {
            format!("{quoted} is in quotes: write the number without them ({inner})")
        } else {
            format!("{quoted} is not a number (want {range})")
        };
    }
    format!("{head} (want {range})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8-11"), Some(12));
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn macs() {
        assert_eq!("auto".parse::<Mac>(), Ok(Mac::Auto));
        let m: Mac = "02:00:0A:0b:0c:0d".parse().unwrap();
        assert_eq!(m, Mac::Addr([2, 0, 10, 11, 12, 13]));
        assert_eq!(m.to_string(), "02:00:0a:0b:0c:0d");
        assert!("02:00:0a:0b:0c".parse::<Mac>().is_err());
    }

    fn err(text: &str) -> String {
        ClusterConfig::parse(text, "f.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_missing_table_at_the_top_is_named() {
        let node = "[[node]]\nid = 1\nname = \"a\"\nmac = \"auto\"\nport = \"net_tap0\"\n";
        assert_eq!(
            err(node),
            "f.toml:1: cluster: missing (this key is required)"
        );
        let text = format!("# comment\n\n{node}");
        assert_eq!(
            err(&text),
            "f.toml:1: cluster: missing (this key is required)"
        );
        assert_eq!(err(""), "f.toml:1: cluster: missing (this key is required)");
        let text = "[cluster]\nethertype = 0x88B5\n\n[[node]]\n";
        assert_eq!(
            err(text),
            "f.toml:1: cluster.id: missing (this key is required)"
        );
        let text = "cluster = { ethertype = 0x88B5 }\n";
        assert_eq!(
            err(text),
            "f.toml:1: cluster.id: missing (this key is required)"
        );
    }

    /// A field that takes one of a set of names, given something else,
    /// lists the names (toml said "wanted string or table").
    #[test]
    fn a_name_field_given_another_type_lists_its_names() {
        let node = "[[node]]\nid = 1\nname = \"a\"\nmac = \"auto\"\nport = \"net_tap0\"\n";
        for (table, value, names) in [
            ("memory", "hugepages = false", "`auto`, `require`, `never`"),
            (
                "memory",
                "hugepages = [\"auto\"]",
                "`auto`, `require`, `never`",
            ),
            ("protocol", "checksum = 1", "`off`, `header`, `full`"),
            (
                "logging",
                "level = 3",
                "`error`, `warn`, `info`, `debug`, `trace`",
            ),
            ("logging", "format = true", "`text` or `json`"),
        ] {
            let text = format!("[cluster]\nid = 1\n\n[{table}]\n{value}\n\n{node}");
            let key = value.split_once(' ').unwrap().0;
            assert_eq!(
                err(&text),
                format!("f.toml:5: {table}.{key}: want one of {names}, as a string in quotes")
            );
        }
    }

    #[test]
    fn inline_tables_and_arrays_are_located() {
        let text = "cluster = { id = 1, ethertype = \"x\" }\n";
        assert_eq!(
            err(text),
            "f.toml:1: cluster.ethertype: \"x\" is not a number (want a whole number in 0..=65535)"
        );
        let text = "[cluster]\nid = 1\n[[node]]\nid = 1\nname = \"a\"\nmac = \"auto\"\n\
                    port = \"net_tap0\"\ncores = [\n  1,\n  \"two\",\n]\n";
        assert_eq!(
            err(text),
            "f.toml:10: node[0].cores[1]: \"two\" is not a number (want a whole number)"
        );
    }
}
