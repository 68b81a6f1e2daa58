//! The main loop: drives the endpoints (inline progress) or takes their
//! completions (polling thread), serves control requests, moves checks on,
//! watches the peers, and at the end drains and stops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpdk_ffi::{Eal, ExtMem, Mempool, Port};
use emx::proto::Addr;
use emx::runtime::{Engine, ProgressMode};
use emx_config::{ClusterConfig, Mac};
use emx_daemon::control::{
    reply_err, reply_ok, CheckResult, EndpointStats, LinkInfo, LinkStats, MessageStats, PeerRef,
    PeerState, Peers, Request, ResponderCounters, Stats, Status, DEFAULT_CHECK_SIZES,
};
use tracing::{info, warn};

use crate::check::Checks;
use crate::server::Control;
use crate::station::Station;

/// How long requests that carry data get to finish at shutdown.
pub const DRAIN: Duration = Duration::from_secs(2);
/// Idle, the loop spins this long before it starts sleeping.
const SPIN: Duration = Duration::from_micros(50);
/// Idle, the loop sleeps between polls: this long at first, twice as long
/// each time after, up to [`NAP_MAX`].
const NAP_MIN: Duration = Duration::from_micros(50);
/// The longest sleep between polls when idle: what a frame that arrives
/// during a long idle period may wait (well below any protocol timer).
const NAP_MAX: Duration = Duration::from_micros(200);
/// How often the peers' states are read and their changes logged.
const SCAN_EVERY: Duration = Duration::from_millis(10);
/// How often the port's link is read, and a change logged.
const LINK_EVERY: Duration = Duration::from_secs(1);
/// The most sizes one check takes.
const MAX_CHECK_SIZES: usize = 4096;

/// What `status` reports that does not change.
pub struct NodeInfo {
    /// Node id.
    pub node: u16,
    /// Node name.
    pub name: String,
    /// Session epoch of this start.
    pub epoch: u32,
    /// The port's devargs.
    pub devargs: String,
    /// Progress mode.
    pub progress: ProgressMode,
    /// The cluster file, as given.
    pub config: String,
}

/// The running node and everything emxd keeps for it. Fields drop in order:
/// endpoints, engine, port, pool, memory, EAL.
pub struct Daemon {
    stations: Vec<Station>,
    checks: Checks,
    engine: Option<Engine>,
    port: Port,
    _pool: Mempool,
    _region: ExtMem,
    _eal: Eal,
    cluster: ClusterConfig,
    info: NodeInfo,
    started: Instant,
    max: usize,
    ctl: Receiver<Control>,
    stop: Arc<AtomicBool>,
    /// The number of the signal that raised `stop`.
    signal: Arc<std::sync::atomic::AtomicUsize>,
    /// A `shutdown` asked over the control socket while emxd started.
    asked_early: Arc<AtomicBool>,
}

/// The parts of a started node the daemon takes over.
pub struct Parts {
    /// The engine, its endpoints taken.
    pub engine: Engine,
    /// One station per endpoint.
    pub stations: Vec<Station>,
    /// The port.
    pub port: Port,
    /// The port's pool.
    pub pool: Mempool,
    /// The registered region the responder's buffers come from.
    pub region: ExtMem,
    /// The EAL.
    pub eal: Eal,
    /// The responder's limit.
    pub max: usize,
}

impl Daemon {
    /// A daemon over a started node; `stop` is raised by the signal
    /// handlers, which leave their signal's number in `signal`,
    /// `asked_early` by a `shutdown` asked while emxd started.
    pub fn new(
        parts: Parts,
        cluster: ClusterConfig,
        info: NodeInfo,
        ctl: Receiver<Control>,
        (stop, signal, asked_early): (
            Arc<AtomicBool>,
            Arc<std::sync::atomic::AtomicUsize>,
            Arc<AtomicBool>,
        ),
    ) -> Daemon {
        Daemon {
            stations: parts.stations,
            checks: Checks::default(),
            engine: Some(parts.engine),
            port: parts.port,
            _pool: parts.pool,
            _region: parts.region,
            _eal: parts.eal,
            cluster,
            info,
            started: Instant::now(),
            max: parts.max,
            ctl,
            stop,
            signal,
            asked_early,
        }
    }

    /// Serves until a signal or a `shutdown` request, then drains and stops.
    /// Fails when the engine died under it (its polling thread panicked).
    pub fn run(mut self) -> Result<(), String> {
        let mut idle_since: Option<Instant> = None;
        let mut nap = NAP_MIN;
        let mut next_scan = Instant::now();
        // (Up: emxd serves once its link came up.)
        let mut link_up = true;
        let mut next_link = Instant::now() + LINK_EVERY;
        let mut asked = false;
        // (Asked early: a request that found emxd starting, answered just
        // before the loop took over, is looked for on every turn.)
        while !asked && !self.stop.load(Ordering::Acquire) {
            if self.asked_early.load(Ordering::Relaxed) {
                asked = true;
                break;
            }
            let mut busy = false;
            for st in &mut self.stations {
                busy |= st.poll(&mut self.checks);
            }
            if let Some(why) = self.stations.iter().find_map(|st| st.dead.clone()) {
                // (Said once, by main, as emxd exits with it.)
                self.checks.abort_all("the engine stopped");
                return Err(format!("the engine stopped: {why}"));
            }
            while let Ok(c) = self.ctl.try_recv() {
                busy = true;
                if self.handle(c) {
                    asked = true;
                }
            }
            if self.checks.active() {
                busy |= self.checks.advance(&mut self.stations[0]);
            }
            let now = Instant::now();
            if now >= next_scan {
                // Checks run on the first endpoint, through its sessions:
                // only its view of a peer fails them (another endpoint's
                // may lag, down for up to two liveness deadlines after a
                // partition heals).
                for (i, st) in self.stations.iter_mut().enumerate() {
                    st.scan((i == 0).then_some(&mut self.checks));
                }
                next_scan = now + SCAN_EVERY;
            }
            if now >= next_link {
                // The cause of the peers' going down, when it is the link's
                // (a cable pulled): said once a change.
                let link = self.port.link();
                if link.up != link_up {
                    link_up = link.up;
                    if link.up {
                        info!(
                            port = self.port.name(),
                            speed_mbps = link.speed_mbps,
                            "link up"
                        );
                    } else {
                        warn!(port = self.port.name(), "link down");
                    }
                }
                next_link = now + LINK_EVERY;
            }
            if busy {
                idle_since = None;
                nap = NAP_MIN;
            } else if now.duration_since(*idle_since.get_or_insert(now)) < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(nap);
                nap = (nap * 2).min(NAP_MAX);
            }
        }
        if asked {
            info!("shutdown requested over the control socket");
        } else {
            let signal = crate::signal_name(self.signal.load(Ordering::Relaxed));
            info!(signal, "signal received");
        }
        self.shutdown()
    }

    /// Serves one control request; true when it asks emxd to stop.
    fn handle(&mut self, c: Control) -> bool {
        let reply = match c.req {
            Request::Status => reply_ok(&self.status()),
            Request::Peers => self.peers(),
            Request::Stats => self.stats(),
            Request::Check { sizes, peer } => {
                self.start_check(sizes, peer, c.reply, c.left);
                return false;
            }
            // Asked by a client that left before its turn: not done.
            Request::Shutdown if c.left.load(std::sync::atomic::Ordering::Relaxed) => {
                info!("a shutdown request whose client left before its turn is ignored");
                return false;
            }
            Request::Shutdown => {
                let _ = c
                    .reply
                    .send(reply_ok(&serde_json::json!({ "stopping": true })));
                return true;
            }
        };
        let _ = c.reply.send(reply);
        false
    }

    fn status(&mut self) -> Status {
        let mut responder = ResponderCounters::default();
        for st in &self.stations {
            responder += st.counters;
        }
        let link = self.port.link();
        let (progress, core) = match self.info.progress {
            ProgressMode::Inline => ("inline", None),
            ProgressMode::Thread { core, .. } => ("thread", core),
        };
        Status {
            node: self.info.node,
            name: self.info.name.clone(),
            cluster: self.cluster.cluster().id,
            epoch: self.info.epoch,
            endpoints: self.stations.iter().map(|s| s.local.endpoint).collect(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            pid: std::process::id(),
            link: LinkInfo {
                name: self.port.name().to_owned(),
                devargs: self.info.devargs.clone(),
                mac: Mac::Addr(self.port.mac()).to_string(),
                mtu: self.port.mtu(),
                up: link.up,
                speed_mbps: link.speed_mbps,
            },
            progress: progress.to_owned(),
            core,
            max_message: self.max as u64,
            responder,
            config: self.info.config.clone(),
        }
    }

    fn peers(&mut self) -> String {
        let mut peers = Vec::new();
        for st in &mut self.stations {
            match st.peer_entries(&self.cluster) {
                Ok(p) => peers.extend(p),
                Err(e) => return reply_err::<()>(&format!("cannot read the peers: {e}"), None),
            }
        }
        reply_ok(&Peers { peers })
    }

    fn stats(&mut self) -> String {
        let mut endpoints = Vec::new();
        for st in &mut self.stations {
            let local = st.local;
            let io = match st.ep.stats(local) {
                Ok((_, io)) => io,
                Err(e) => return reply_err::<()>(&format!("cannot read the counters: {e}"), None),
            };
            let peers = match st.peer_stats(&self.cluster) {
                Ok(p) => p,
                Err(e) => return reply_err::<()>(&format!("cannot read the counters: {e}"), None),
            };
            let core = match st.ep.core_stats() {
                Ok(c) => c,
                Err(e) => return reply_err::<()>(&format!("cannot read the counters: {e}"), None),
            };
            endpoints.push(EndpointStats {
                endpoint: local.endpoint,
                link: LinkStats {
                    rx_frames: io.rx_frames,
                    rx_bytes: io.rx_bytes,
                    rx_chained: io.rx_chained,
                    tx_frames: io.tx_frames,
                    tx_bytes: io.tx_bytes,
                    tx_full: io.tx_full,
                    tx_no_buffer: io.tx_no_buffer,
                    payload_copied: io.payload_copied,
                    payload_attached: io.payload_attached,
                },
                responder: st.counters,
                messages: MessageStats {
                    sends_completed: core.sends_completed,
                    recvs_completed: core.recvs_completed,
                    unexpected: core.unexpected,
                    unexpected_high_water: core.unexpected_high_water,
                    withdrawn: core.withdrawn,
                    dropped: core.dropped.total(),
                    internal_errors: core.internal_errors,
                },
                peers,
            });
        }
        reply_ok(&Stats { endpoints })
    }

    /// Starts a check from the first endpoint; its reply comes when it ends.
    fn start_check(
        &mut self,
        sizes: Option<Vec<u64>>,
        peer: Option<PeerRef>,
        reply: std::sync::mpsc::Sender<String>,
        left: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) {
        let refuse = |why: String| {
            let _ = reply.send(reply_err::<()>(&why, None));
        };
        let cluster = &self.cluster;
        // A peer's responder takes what its share of the region holds, as
        // this node's does (main.rs): cluster-wide region_mb over its own
        // endpoints.
        let limit_of = |node: u16| {
            cluster.node_by_id(node).map_or(usize::MAX, |n| {
                emx_daemon::ops::max_message(
                    cluster.memory().region_bytes() / n.endpoints.len().max(1),
                )
            })
        };
        // The default sizes, within every responder's limit: a small
        // region_mb would have failed every default check otherwise.
        let sizes = sizes.unwrap_or_else(|| {
            let least = cluster.nodes().iter().map(|n| limit_of(n.id)).min();
            let mut v: Vec<u64> = DEFAULT_CHECK_SIZES
                .iter()
                .map(|&s| least.map_or(s, |l| s.min(l as u64)))
                .filter(|&s| s > 0)
                .collect();
            v.dedup();
            v
        });
        if sizes.is_empty() || sizes.len() > MAX_CHECK_SIZES {
            return refuse(format!(
                "give 1 to {MAX_CHECK_SIZES} sizes to check ({} given)",
                sizes.len()
            ));
        }
        let name_of = |node: u16| cluster.node_by_id(node).map(|n| n.name.clone());
        let states = match self.stations[0].peer_states() {
            Ok(s) => s,
            Err(e) => return refuse(format!("cannot read the peers: {e}; try again")),
        };
        let describe = |states: &[(Addr, PeerState)]| {
            let all: Vec<String> = states
                .iter()
                .map(|(a, s)| {
                    let name = name_of(a.node).unwrap_or_else(|| a.node.to_string());
                    format!("{name}:{} {}", a.endpoint, s.as_str())
                })
                .collect();
            if all.is_empty() {
                "none".to_owned()
            } else {
                all.join(", ")
            }
        };
        let mut targets = Vec::new();
        let mut early = Vec::new();
        match &peer {
            Some(p) => {
                let chosen: Vec<(Addr, PeerState)> = states
                    .iter()
                    .copied()
                    .filter(|(a, _)| p.names(a.node, name_of(a.node).as_deref()))
                    .collect();
                if chosen.is_empty() {
                    let auto = cluster
                        .nodes()
                        .iter()
                        .any(|n| n.mac == Mac::Auto && p.names(n.id, Some(&n.name)));
                    return refuse(if auto {
                        format!(
                            "{p} is unresolved: its MAC is auto in the cluster file and the \
                             engine does not know it yet"
                        )
                    } else {
                        format!(
                            "{p} is not a peer of this node (peers: {})",
                            describe(&states)
                        )
                    });
                }
                for (a, s) in chosen {
                    if s == PeerState::Up {
                        targets.push((a, name_of(a.node), limit_of(a.node)));
                    } else {
                        early.extend(sizes.iter().map(|&size| CheckResult {
                            node: a.node,
                            name: name_of(a.node),
                            endpoint: a.endpoint,
                            size,
                            ok: false,
                            rtt_us: None,
                            error: Some(format!("the peer is {}", s.as_str())),
                        }));
                    }
                }
            }
            None => {
                targets = states
                    .iter()
                    .filter(|(_, s)| *s == PeerState::Up)
                    .map(|(a, _)| (*a, name_of(a.node), limit_of(a.node)))
                    .collect();
                if targets.is_empty() {
                    return refuse(format!(
                        "no peer is up to check against (peers: {})",
                        describe(&states)
                    ));
                }
            }
        }
        self.checks
            .start(targets, &sizes, self.max, early, reply, left);
    }

    /// Stops: no new work, checks answered, idle receives cancelled, data
    /// requests drained until [`DRAIN`] (the rest aborted), the engine shut
    /// down. Logs what was drained and what aborted. Fails when the engine
    /// died meanwhile (its polling thread panicked), as `run` does when it
    /// dies before: the stop was not clean. (It used to exit 0.)
    fn shutdown(mut self) -> Result<(), String> {
        info!(
            deadline_ms = DRAIN.as_millis() as u64,
            "stopping: draining requests"
        );
        // Requests queued for the main loop, and any that come while
        // draining, are answered "shutting down" once the channel is gone.
        let (_, closed) = std::sync::mpsc::channel();
        drop(std::mem::replace(&mut self.ctl, closed));
        self.checks.abort_all("emxd is shutting down");
        // One deadline for everything, however many endpoints: a container
        // runtime's grace period (10 s in compose) must not run out first.
        let until = std::time::Instant::now() + DRAIN;
        let left = || until.saturating_duration_since(std::time::Instant::now());
        let (mut drained, mut aborted) = (0, 0);
        let mut died = None;
        let stations = std::mem::take(&mut self.stations);
        for mut st in stations {
            let endpoint = st.local.endpoint;
            let cancelled = st.quiesce(&mut self.checks, left().min(Duration::from_millis(200)));
            died = died.or_else(|| st.dead.clone());
            let sum = st.close(left(), cancelled);
            drained += sum.drained;
            aborted += sum.aborted;
            let kinds = |m: &std::collections::BTreeMap<&str, usize>| {
                let v: Vec<String> = m.iter().map(|(k, n)| format!("{n} {k}")).collect();
                if v.is_empty() {
                    "none".to_owned()
                } else {
                    v.join(", ")
                }
            };
            info!(
                endpoint,
                drained = sum.drained,
                aborted = sum.aborted,
                idle_receives_cancelled = sum.cancelled,
                "endpoint closed: drained {}; aborted {}",
                kinds(&sum.drained_kinds),
                kinds(&sum.aborted_kinds)
            );
        }
        if let Some(engine) = self.engine.take() {
            if let Err(e) = engine.shutdown(left()) {
                died = died.or(Some(e.to_string()));
            }
        }
        if let Some(why) = died {
            tracing::error!(
                drained,
                aborted,
                "the engine stopped while emxd was stopping: {why}"
            );
            return Err(format!("the engine stopped while emxd was stopping: {why}"));
        }
        if aborted == 0 {
            info!(
                drained,
                aborted, "emxd stopped: every request in flight finished, nothing half-sent"
            );
        } else {
            warn!(
                drained,
                aborted, "emxd stopped: {aborted} requests in flight were aborted at the deadline"
            );
        }
        Ok(())
    }
}
