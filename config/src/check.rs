//! The checks run on a cluster file after serde has read it: what the types
//! alone cannot say (uniqueness across nodes, ranges, combinations of keys)
//! and the engine's own validation of the protocol settings. Each error is
//! pinned on the field to change. The CPU count of the machine is not checked
//! here: it belongs to [`ClusterConfig::check_cores`].

use std::collections::HashMap;

use emx::io::dpdk_ffi::is_pci_address;
use emx::proto::ConfigError as ProtoConfigError;
use emx::proto::TimerRule;

use crate::cluster::{ClusterConfig, Mac, NodeSpec};
use crate::error::ConfigError;

/// The longest node name taken: it goes into socket paths, which are short.
const MAX_NAME: usize = 64;

/// The EAL memory a node needs at least beside its mbuf pool, for the EAL's
/// and the driver's own allocations: a memif node at MTU 9000, whose pool
/// is about 146 MiB, starts with `memory_mb = 150` and fails at 148. (A NIC's
/// driver may need more; emxd's start-up error then says to give more.)
const EAL_ROOM: u64 = 4 << 20;

impl ClusterConfig {
    /// The checks after parsing that do not depend on the machine.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.cluster().ethertype < 0x0600 {
            return Err(self.invalid(
                "cluster.ethertype",
                format!(
                    "{:#06x} is below 0x0600, where values are frame lengths, not EtherTypes \
                     (want 0x0600..=0xffff; default {:#06x})",
                    self.cluster().ethertype,
                    emx::wire::DEFAULT_ETHERTYPE
                ),
            ));
        }
        // Protocols that switches, NICs and kernels act on: emx frames under
        // one of these would be taken for them (VLAN tags stripped or
        // pushed, IP stacks and LLDP agents fed emx headers).
        // Some never leave the first port: a NIC's MAC takes PAUSE frames,
        // bonding drivers LACP, authenticators 802.1X.
        const TAKEN: [(u16, &str); 17] = [
            (0x0800, "IPv4"),
            (0x0806, "ARP"),
            (0x8035, "RARP"),
            (0x86DD, "IPv6"),
            (0x8100, "an 802.1Q VLAN tag"),
            (0x88A8, "an 802.1ad VLAN tag"),
            (0x9100, "a VLAN tag (QinQ)"),
            (0x88CC, "LLDP"),
            (0x8808, "Ethernet flow control (PAUSE)"),
            (0x8809, "LACP (slow protocols)"),
            (0x888E, "802.1X (EAPOL)"),
            (0x88E5, "MACsec"),
            (0x88F7, "PTP"),
            (0x8847, "MPLS"),
            (0x8848, "MPLS (multicast)"),
            (0x8863, "PPPoE discovery"),
            (0x8864, "PPPoE"),
        ];
        let et = self.cluster().ethertype;
        if let Some((_, what)) = TAKEN.iter().find(|(t, _)| *t == et) {
            return Err(self.invalid(
                "cluster.ethertype",
                format!(
                    "{et:#06x} is {what}'s EtherType: the network would take emx frames for \
                     its frames (give an unassigned or local one; default {:#06x}, IEEE local \
                     experimental)",
                    emx::wire::DEFAULT_ETHERTYPE
                ),
            ));
        }
        if self.memory().memory_mb == 0 {
            return Err(self.invalid("memory.memory_mb", "must be at least 1 (MiB)"));
        }
        if self.memory().region_mb == 0 {
            return Err(self.invalid("memory.region_mb", "must be at least 1 (MiB)"));
        }
        self.check_protocol_ranges()?;
        if self.nodes().is_empty() {
            return Err(self.invalid(
                "node",
                "no [[node]] tables: a cluster needs at least one node",
            ));
        }
        let mut ids = HashMap::new();
        let mut names = HashMap::new();
        let mut macs = HashMap::new();
        for (i, n) in self.nodes().iter().enumerate() {
            self.check_node(i, n)?;
            let earlier = |what: &str, j: usize| {
                let e = &self.nodes()[j];
                format!(
                    "{what} (node[{j}] \"{}\" at line {} has it too)",
                    e.name,
                    self.line_of_path(&format!("node[{j}]"))
                )
            };
            if let Some(&j) = ids.get(&n.id) {
                let what = format!("duplicate node id {}", n.id);
                return Err(self.invalid(&format!("node[{i}].id"), earlier(&what, j)));
            }
            ids.insert(n.id, i);
            if let Some(&j) = names.get(n.name.as_str()) {
                let what = format!("duplicate node name {:?}", n.name);
                return Err(self.invalid(&format!("node[{i}].name"), earlier(&what, j)));
            }
            names.insert(n.name.as_str(), i);
            if let Mac::Addr(a) = n.mac {
                if let Some(&j) = macs.get(&a) {
                    let what = format!("duplicate MAC address {}", n.mac);
                    return Err(self.invalid(&format!("node[{i}].mac"), earlier(&what, j)));
                }
                macs.insert(a, i);
            }
        }
        self.check_peer_table()?;
        self.check_protocol_whole()?;
        self.check_mtus_equal()
    }

    /// Every node has one MTU. After each node's is checked on its own
    /// (`check_protocol_whole`): a first node whose MTU is out of range is
    /// named for that, not the others for differing from it.
    fn check_mtus_equal(&self) -> Result<(), ConfigError> {
        for (i, n) in self.nodes().iter().enumerate() {
            // No MTU is negotiated: each node sizes its frames by its own, and
            // a peer's port drops what is longer than its MTU. A node that
            // sets none has DPDK's default, 1500.
            let m0 = self.nodes()[0].mtu;
            if n.mtu.unwrap_or(1500) != m0.unwrap_or(1500) {
                let e = &self.nodes()[0];
                let mtu = |m: Option<u16>| {
                    m.map_or("no mtu (the default, 1500)".to_owned(), |m| {
                        format!("mtu {m}")
                    })
                };
                return Err(self.invalid(
                    &format!("node[{i}].mtu"),
                    format!(
                        "{} differs from node[0] \"{}\" at line {} ({}): frames longer than a \
                         peer's MTU are dropped there (give every node the same mtu)",
                        mtu(n.mtu),
                        e.name,
                        self.line_of_path("node[0]"),
                        mtu(m0)
                    ),
                ));
            }
        }
        Ok(())
    }

    fn check_protocol_ranges(&self) -> Result<(), ConfigError> {
        let p = self.protocol();
        let max = emx::proto::reliability::MAX_WINDOW;
        if let Some(w) = p.window.filter(|w| !(1..=max).contains(w)) {
            return Err(self.invalid(
                "protocol.window",
                format!(
                    "{w} is out of range (want 1..={max} frames: a receiver keeps track of {max} beyond the next one it expects)"
                ),
            ));
        }
        // The engine would take a value outside the bounds as the bound it
        // crossed: the setting would do nothing.
        let d = emx::proto::CoreConfig::default();
        let us = |v: Option<u64>, dflt: std::time::Duration| v.unwrap_or(dflt.as_micros() as u64);
        let (lo, hi) = (us(p.rto_min_us, d.rto_min), us(p.rto_max_us, d.rto_max));
        // (Bounds the wrong way round are the engine's check's, below.)
        if let Some(v) = p
            .rto_initial_us
            .filter(|v| lo <= hi && !(lo..=hi).contains(v))
        {
            return Err(self.invalid(
                "protocol.rto_initial_us",
                format!(
                    "{v} is outside rto_min_us..=rto_max_us ({lo}..={hi}), and would be taken \
                     as the bound it crosses (give a value in it, or move rto_min_us or \
                     rto_max_us)"
                ),
            ));
        }
        if let Some(n) = p.pull_inflight.filter(|n| !(1..=8).contains(n)) {
            return Err(self.invalid(
                "protocol.pull_inflight",
                format!("{n} is out of range (want 1..=8 pulls in flight per rendezvous receive)"),
            ));
        }
        if p.pack_max == Some(0) {
            return Err(self.invalid(
                "protocol.pack_max",
                "0 is out of range (want at least 1 message per frame; 1 turns packing off)",
            ));
        }
        Ok(())
    }

    fn check_node(&self, i: usize, n: &NodeSpec) -> Result<(), ConfigError> {
        let at = |f: &str| format!("node[{i}].{f}");
        // The name goes into file names (emxd's control socket,
        // /run/emx/emxd-<name>.sock) and container names, and after `--node`
        // on command lines (where a leading '-' reads as an option).
        let name_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if n.name.is_empty()
            || n.name.len() > MAX_NAME
            || !n.name.chars().all(name_ok)
            || n.name.starts_with(['.', '-'])
        {
            return Err(self.invalid(
                &at("name"),
                format!(
                    "bad node name {:?} (want 1 to {MAX_NAME} letters, digits, '.', '_' or '-', \
                     not starting with '.' or '-')",
                    n.name
                ),
            ));
        }
        if n.name.bytes().all(|b| b.is_ascii_digit()) {
            return Err(self.invalid(
                &at("name"),
                format!(
                    "bad node name {:?}: a name must not be a number, which --node and EMX_NODE \
                     would read as a node id",
                    n.name
                ),
            ));
        }
        let memif_max = emx::io::dpdk_ffi::MEMIF_MAX_MTU;
        if let Some(m) = n
            .mtu
            .filter(|&m| m > memif_max && n.port.starts_with("net_memif"))
        {
            return Err(self.invalid(
                &at("mtu"),
                format!("{m} is more than memif takes (want at most {memif_max} on a memif port)"),
            ));
        }
        // The port's mbuf pool comes out of the EAL's memory, beside the
        // EAL's and the driver's own: a pool that leaves less than
        // `EAL_ROOM` fails at start with DPDK's "Cannot allocate memory".
        let pool = crate::cluster::link_config(&n.port, n.mtu).pool_bytes();
        let have = u64::from(self.memory().memory_mb) << 20;
        if pool + EAL_ROOM > have {
            let mib = pool.div_ceil(1 << 20);
            let at_mtu = n
                .mtu
                .map_or("the driver's MTU".to_owned(), |m| format!("mtu {m}"));
            let need = mib + 64;
            let memory_mb = self.memory().memory_mb;
            // Left to its default, memory_mb is on no line: the node whose
            // pool it cannot hold is.
            if !self.has_path("memory.memory_mb") {
                return Err(ConfigError::Invalid {
                    origin: self.origin().to_owned(),
                    line: self.line_of_path(&at("mtu")),
                    field: "memory.memory_mb".to_owned(),
                    problem: format!(
                        "not set, and the default, {memory_mb} MiB, cannot hold node {:?}'s mbuf \
                         pool, about {mib} MiB at {at_mtu}, beside the EAL's and the driver's \
                         own memory (add memory_mb = {need} or more under [memory])",
                        n.name
                    ),
                });
            }
            return Err(self.invalid(
                "memory.memory_mb",
                format!(
                    "{memory_mb} MiB cannot hold node {:?}'s mbuf pool, about {mib} MiB at \
                     {at_mtu}, beside the EAL's and the driver's own memory (give memory_mb \
                     more: {need} leaves room for the rest)",
                    n.name
                ),
            ));
        }
        if let Mac::Addr(a) = n.mac {
            if a[0] & 1 == 1 || a == [0; 6] {
                return Err(self.invalid(
                    &at("mac"),
                    format!(
                        "{} is not a unicast address (want aa:bb:cc:dd:ee:ff with the low bit of \
                         the first byte clear, not all zero, or auto)",
                        n.mac
                    ),
                ));
            }
        }
        if let Some(problem) = port_problem(&n.port) {
            return Err(self.invalid(&at("port"), problem));
        }
        for (j, c) in n.cores.iter().enumerate() {
            if n.cores[..j].contains(c) {
                return Err(self.invalid(
                    &format!("node[{i}].cores[{j}]"),
                    format!("core {c} is listed twice (want distinct CPU numbers)"),
                ));
            }
        }
        if n.spin && n.cores.is_empty() {
            return Err(self.invalid(
                &at("spin"),
                "spin needs a polling core to spin on (give cores = [N])",
            ));
        }
        if let Some(us) = n.idle_sleep_us {
            let range = emx::runtime::IDLE_SLEEP_US;
            let problem = if n.cores.is_empty() {
                Some(format!(
                    "idle_sleep_us = {us} is a polling thread's, and an inline node has none \
                     (give cores = [N], or drop idle_sleep_us)"
                ))
            } else if n.spin {
                Some(format!(
                    "idle_sleep_us = {us} with spin = true: a spinning polling thread never \
                     sleeps (drop one of the two)"
                ))
            } else if !range.contains(&us) {
                Some(format!(
                    "idle_sleep_us = {us} (want {} to {} microseconds)",
                    range.start(),
                    range.end()
                ))
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(self.invalid(&at("idle_sleep_us"), problem));
            }
        }
        if n.endpoints.is_empty() || n.endpoints.len() > 64 {
            return Err(self.invalid(
                &at("endpoints"),
                format!(
                    "{} endpoints (want 1 to 64 distinct endpoint numbers)",
                    n.endpoints.len()
                ),
            ));
        }
        for (j, e) in n.endpoints.iter().enumerate() {
            if n.endpoints[..j].contains(e) {
                return Err(self.invalid(
                    &format!("node[{i}].endpoints[{j}]"),
                    format!("endpoint {e} is listed twice (want distinct endpoint numbers)"),
                ));
            }
        }
        if n.endpoints.len() > 1 && n.cores.is_empty() {
            return Err(self.invalid(
                &at("endpoints"),
                format!(
                    "{} endpoints need a polling thread (give cores = [N]): without one the \
                     application drives the engine inline, through one endpoint",
                    n.endpoints.len()
                ),
            ));
        }
        Ok(())
    }

    /// Every node's protocol core must hold every remote endpoint as a peer.
    fn check_peer_table(&self) -> Result<(), ConfigError> {
        let max = self
            .protocol()
            .max_peers
            .unwrap_or(emx::proto::CoreConfig::default().max_peers);
        let total: usize = self.nodes().iter().map(|n| n.endpoints.len()).sum();
        for (i, n) in self.nodes().iter().enumerate() {
            let remote = total - n.endpoints.len();
            if remote > max {
                let field = if self.protocol().max_peers.is_some() {
                    "protocol.max_peers".to_owned()
                } else {
                    format!("node[{i}]")
                };
                return Err(self.invalid(
                    &field,
                    format!(
                        "node {:?} has {remote} remote endpoints but the peer table holds \
                         max_peers = {max} (raise protocol.max_peers)",
                        n.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The engine's own validation of the protocol settings, once per MTU in
    /// use (the driver's MTU is unknown here; 1500 stands for it), with its
    /// verdict pinned on the field to change.
    fn check_protocol_whole(&self) -> Result<(), ConfigError> {
        let p = self.protocol();
        let set = |f: &str, present: bool| present.then(|| format!("protocol.{f}"));
        for (i, n) in self.nodes().iter().enumerate() {
            let mtu = n.mtu.map_or(1500, usize::from);
            let core = p.core_config(mtu);
            let Err(e) = core.validate() else { continue };
            let (field, problem) = match e {
                ProtoConfigError::Mtu(m) => (
                    format!("node[{i}].mtu"),
                    format!(
                        "{m} is out of range (want {}..=65535 bytes)",
                        emx::wire::EMX_HEADER_LEN + 64
                    ),
                ),
                ProtoConfigError::Window(w) => (
                    "protocol.window".to_owned(),
                    format!(
                        "{w} is out of range (want 1..={})",
                        emx::proto::reliability::MAX_WINDOW
                    ),
                ),
                ProtoConfigError::Table(what) => {
                    let want = if what == "max_peers" {
                        "1..=65535"
                    } else {
                        "1..=16777216"
                    };
                    (
                        format!("protocol.{what}"),
                        format!("out of range (want {want})"),
                    )
                }
                ProtoConfigError::Pull => (
                    "protocol.pull_block".to_owned(),
                    format!(
                        "out of range (want 1..={} bytes)",
                        emx::proto::MAX_PULL_BLOCK
                    ),
                ),
                ProtoConfigError::Store(n) => (
                    "protocol.unexpected_bytes".to_owned(),
                    format!(
                        "{n} is out of range (want 1..={} bytes: the store, and a table of a \
                         message entry per 256 bytes of it, are allocated when the engine starts)",
                        emx::proto::MAX_UNEXPECTED_BYTES
                    ),
                ),
                ProtoConfigError::Credits { credit, need } => (
                    set("unexpected_bytes", p.unexpected_bytes.is_some())
                        .or_else(|| set("eager_threshold", p.eager_threshold.is_some()))
                        .or_else(|| set("max_peers", p.max_peers.is_some()))
                        .unwrap_or_else(|| "protocol".to_owned()),
                    format!(
                        "each peer's credit (unexpected_bytes / max_peers = {credit} bytes) must \
                         hold one eager message of eager_threshold bytes ({need} bytes with its \
                         framing) and be at most 1 GiB{}",
                        credit_fix(&core, credit, need)
                    ),
                ),
                ProtoConfigError::Timers(rule) => {
                    let us = |d: std::time::Duration| d.as_micros();
                    // Of the fields the rule ties, the first the file sets.
                    let named = |fields: [(&str, bool); 2]| {
                        fields
                            .iter()
                            .find_map(|&(f, given)| set(f, given))
                            .unwrap_or_else(|| "protocol".to_owned())
                    };
                    match rule {
                        TimerRule::Rto => (
                            named([
                                ("rto_min_us", p.rto_min_us.is_some()),
                                ("rto_max_us", p.rto_max_us.is_some()),
                            ]),
                            format!(
                                "rto_min_us ({} us) must be above 0 and at most rto_max_us ({} us)",
                                us(core.rto_min),
                                us(core.rto_max)
                            ),
                        ),
                        // Only a file can set it to 0 (the default is 16).
                        TimerRule::AckEvery => (
                            "protocol.ack_every".to_owned(),
                            "0 is out of range (want at least 1 frame between acknowledgements)"
                                .to_owned(),
                        ),
                        TimerRule::AckDelay => (
                            named([
                                ("ack_delay_us", p.ack_delay_us.is_some()),
                                ("rto_min_us", p.rto_min_us.is_some()),
                            ]),
                            format!(
                                "ack_delay_us ({} us) must be below rto_min_us ({} us): a delayed \
                                 acknowledgement must reach the sender before its retransmission \
                                 timer fires",
                                us(core.ack_delay),
                                us(core.rto_min)
                            ),
                        ),
                        TimerRule::Keepalive => (
                            named([
                                ("keepalive_us", p.keepalive_us.is_some()),
                                ("peer_timeout_us", p.peer_timeout_us.is_some()),
                            ]),
                            format!(
                                "keepalive_us ({} us) must be above 0 and below peer_timeout_us \
                                 ({} us): a silent peer is probed before it is declared dead",
                                us(core.keepalive),
                                us(core.peer_timeout)
                            ),
                        ),
                        TimerRule::TooLong(name) => (
                            format!("protocol.{name}_us"),
                            format!(
                                "out of range (want at most {} us, an hour)",
                                emx::proto::MAX_TIMER.as_micros()
                            ),
                        ),
                    }
                }
            };
            return Err(self.invalid(&field, problem));
        }
        // Valid for the engine, which caps the backed-off timeout at a
        // quarter of the liveness deadline, but never below rto_min: above
        // that quarter, a lost frame goes again a few times at most, or
        // never, before its peer is given up.
        let core = p.core_config(1500);
        if core.rto_min > core.peer_timeout / 4 {
            let field = set("rto_min_us", p.rto_min_us.is_some())
                .unwrap_or_else(|| "protocol.peer_timeout_us".to_owned());
            let us = |d: std::time::Duration| d.as_micros();
            return Err(self.invalid(
                &field,
                format!(
                    "rto_min_us ({} us) is above a quarter of peer_timeout_us ({} us): a lost \
                     frame would go again too seldom, or not at all, before its peer is given \
                     up (give rto_min_us {} at most, or peer_timeout_us {} at least)",
                    us(core.rto_min),
                    us(core.peer_timeout),
                    us(core.peer_timeout / 4),
                    us(core.rto_min * 4)
                ),
            ));
        }
        Ok(())
    }
}

/// Why `port` is neither a PCI address nor vdev devargs, if it is not.
fn port_problem(port: &str) -> Option<String> {
    let want = "want a PCI address such as 0000:03:00.0, or vdev devargs such as \
                net_memif0,role=server,socket=/run/emx/memif.sock";
    if port.is_empty() || port.chars().any(char::is_whitespace) {
        return Some(format!(
            "bad port {port:?} (empty or has whitespace; {want})"
        ));
    }
    let dev = port.split(',').next().unwrap_or("");
    if dev.starts_with("net_") || dev.starts_with("eth_") {
        return (dev.len() == 4).then(|| format!("bad port {port:?}: no driver name ({want})"));
    }
    if is_pci_address(dev) {
        return None;
    }
    Some(format!("bad port {port:?} ({want})"))
}

/// The values that would give each peer the credit it needs: `credit` is
/// `unexpected_bytes / max_peers`, `need` an eager message's charge. Each
/// is offered only when the engine's check passes with it (one field
/// changed, the others as they are).
fn credit_fix(core: &emx::proto::CoreConfig, credit: u64, need: u64) -> String {
    use emx::proto::matching::{CHUNK, MSG_OVERHEAD};
    use emx::proto::MAX_PEER_CREDIT;
    let peers = core.max_peers.max(1) as u64;
    let store = core.unexpected_bytes;
    // Credit is the store divided by the peers, rounded down.
    let (store_fix, peers_fix) = if credit > MAX_PEER_CREDIT {
        (
            ((MAX_PEER_CREDIT + 1) * peers - 1, "at most"),
            (store / (MAX_PEER_CREDIT + 1) + 1, "at least"),
        )
    } else {
        (
            (need.saturating_mul(peers), "at least"),
            (store / need.max(1), "at most"),
        )
    };
    // The largest message whose charge (its bytes in whole chunks, and its
    // envelope) the credit holds.
    let eager =
        credit.min(MAX_PEER_CREDIT).saturating_sub(MSG_OVERHEAD) / CHUNK as u64 * CHUNK as u64;
    let candidates = [
        ("unexpected_bytes", store_fix.0, store_fix.1),
        ("eager_threshold", eager, "at most"),
        ("max_peers", peers_fix.0, peers_fix.1),
    ];
    let fixes: Vec<String> = candidates
        .iter()
        .filter(|&&(field, value, _)| {
            let mut c = core.clone();
            match field {
                "unexpected_bytes" => c.unexpected_bytes = value,
                "eager_threshold" => c.eager_threshold = value,
                _ => match usize::try_from(value) {
                    Ok(v) => c.max_peers = v,
                    Err(_) => return false,
                },
            }
            value > 0 && c.validate().is_ok()
        })
        .map(|(field, value, how)| format!("{field} {value} {how}"))
        .collect();
    if fixes.is_empty() {
        return " (give more unexpected_bytes, a smaller eager_threshold, or both)".to_owned();
    }
    format!(" (give {})", fixes.join(", or "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports() {
        assert_eq!(port_problem("net_memif0,role=server"), None);
        assert_eq!(port_problem("0000:03:00.0"), None);
        assert!(port_problem("memif0").is_some());
        assert!(port_problem("net_").is_some());
        assert!(port_problem("net_tap0, iface=x").is_some());
    }
}
