//! One local endpoint as emxd runs it: the built-in responder's receives and
//! echoes, the per-peer liveness receives, the requests of checks, and the
//! table that says what each outstanding request is for.
//!
//! The station only ever touches its own endpoint; the daemon's main loop
//! calls [`Station::poll`] on every turn and [`Station::scan`] every 10 ms.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use dpdk_ffi::ExtMem;
use emx::proto::{Addr, RecvError, RequestError};
use emx::runtime::{Completed, Endpoint, Error, PeerStatus, RecvBuf, Request, SendBuf};
use emx_config::{ClusterConfig, Mac};
use emx_daemon::control::{PeerEntry, PeerState, PeerStatsEntry, ResponderCounters};
use emx_daemon::ops::{self, ECHO, OP_MASK, PING, PING_BYTES, PONG, SINK};
use tracing::{debug, info, trace, warn};

use crate::check::Checks;

/// The MAC of a peer whose address the engine is still to learn.
const UNLEARNT_MAC: [u8; 6] = [0xff; 6];

/// What an outstanding request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// An ECHO receive in slot `n` of the registered region.
    EchoRecv(usize),
    /// The echo of what slot `n` received, sent from it.
    EchoSend(usize),
    /// A SINK receive.
    Sink,
    /// The liveness receive on one peer (PING messages from it).
    Watch(Addr),
    /// The answer to a PING from this peer.
    Pong(Addr),
    /// A receive that takes a message nobody serves, to drop it.
    Discard,
    /// A check's message, sent to be echoed.
    CheckSend { run: u8, seq: u32 },
    /// The receive of a check message's echo ([`ops::CHECK_ANSWER`]).
    CheckAnswer { run: u8, seq: u32 },
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::EchoRecv(_) => "echo receive",
            Role::EchoSend(_) => "echo send",
            Role::Sink => "sink receive",
            Role::Watch(_) => "liveness receive",
            Role::Pong(_) => "pong send",
            Role::Discard => "discard receive",
            Role::CheckSend { .. } => "check send",
            Role::CheckAnswer { .. } => "check answer receive",
        }
    }

    /// A receive that holds nothing until a message matches it, and can be
    /// cancelled at shutdown with nothing lost.
    fn idle_receive(self) -> bool {
        matches!(
            self,
            Role::EchoRecv(_)
                | Role::Sink
                | Role::Watch(_)
                | Role::Discard
                | Role::CheckAnswer { .. }
        )
    }
}

/// An ECHO slot: a range of the registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// A receive is posted on it.
    Posted,
    /// Its echo is being sent.
    Echoing,
    /// To be posted again (its range may still be referenced by frames).
    Free,
}

/// A peer's liveness receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Watch {
    /// Not posted: the peer is declared down, or the post was refused (the
    /// scan posts it again).
    Idle,
    /// Posted.
    Posted,
    /// The PONG of the PING it took is in flight; posted again when that
    /// send is done. A peer that pings and takes none of its PONGs holds one
    /// send of this endpoint, not all of them: its further PINGs wait as
    /// unexpected messages, on its own credit.
    Answering,
}

/// The last state of a peer that was logged.
#[derive(Clone, Copy, Debug)]
struct View {
    state: PeerState,
    epoch: u32,
    /// When a peer given up was last greeted again ([`Endpoint::reconnect`]).
    greeted: Option<Instant>,
}

/// What closing a station found, by kind of request.
#[derive(Debug, Default)]
pub struct CloseSummary {
    /// Idle receives cancelled before closing (nothing lost).
    pub cancelled: usize,
    /// Requests carrying data that finished while draining.
    pub drained: usize,
    /// Requests carrying data aborted at the deadline.
    pub aborted: usize,
    /// `kind: count` of the drained ones.
    pub drained_kinds: BTreeMap<&'static str, usize>,
    /// `kind: count` of the aborted ones.
    pub aborted_kinds: BTreeMap<&'static str, usize>,
}

/// One endpoint, its responder and its liveness receives.
pub struct Station {
    /// The endpoint.
    pub ep: Endpoint,
    /// Its address.
    pub local: Addr,
    region: ExtMem,
    /// Where this station's slots start in the region.
    base: usize,
    /// Bytes per ECHO slot (and per SINK buffer): the largest message taken
    /// whole.
    max: usize,
    slots: Vec<Slot>,
    /// SINK receives not posted (their buffers), to post again.
    sinks_free: Vec<Vec<u8>>,
    /// Every outstanding request and what it is for.
    reqs: Vec<(Request, Role)>,
    /// Check answers' receives to cancel that a full command ring refused
    /// (a polling thread's): asked again on each poll until it takes them,
    /// or they would stay posted for good, a receive slot and a buffer each.
    to_cancel: Vec<Request>,
    /// Per peer in the engine's table: its liveness receive.
    watches: BTreeMap<Addr, Watch>,
    /// Per peer: what was last logged.
    views: BTreeMap<Addr, View>,
    /// The responder's counters.
    pub counters: ResponderCounters,
    /// Stopping: nothing is posted or echoed any more.
    closing: bool,
    /// A repost failed and was logged (logged once until one succeeds).
    repost_warned: bool,
    /// How often a peer given up is greeted again: the liveness deadline, so
    /// that one attempt has run its course before the next.
    regreet: Duration,
    /// Why the engine under this station is gone for good (its polling
    /// thread died), once it is: emxd cannot serve on.
    pub dead: Option<String>,
}

impl Station {
    /// Takes `ep` over: posts the responder's receives ([`ops::ECHO_SLOTS`]
    /// ECHO slots of `max` bytes carved from `region` at `base`, and
    /// [`ops::SINK_SLOTS`] SINK buffers) and a liveness receive on every peer
    /// the engine knows. Peers declared unreachable are greeted again every
    /// `regreet`, so that a healed partition brings them back.
    pub fn new(
        mut ep: Endpoint,
        region: ExtMem,
        base: usize,
        max: usize,
        regreet: Duration,
    ) -> Station {
        let local = ep.local();
        let peers = ep.peers().unwrap_or_default();
        let mut st = Station {
            local,
            region,
            base,
            max,
            slots: vec![Slot::Free; ops::ECHO_SLOTS],
            sinks_free: (0..ops::SINK_SLOTS).map(|_| vec![0u8; max]).collect(),
            reqs: Vec::new(),
            to_cancel: Vec::new(),
            watches: peers.iter().map(|p| (p.addr, Watch::Idle)).collect(),
            views: peers
                .iter()
                .map(|p| {
                    let v = View {
                        state: PeerState::Unknown,
                        epoch: 0,
                        greeted: None,
                    };
                    (p.addr, v)
                })
                .collect(),
            counters: ResponderCounters::default(),
            closing: false,
            repost_warned: false,
            regreet,
            dead: None,
            ep,
        };
        st.repost();
        let addrs: Vec<Addr> = st.watches.keys().copied().collect();
        for a in addrs {
            st.post_watch(a);
        }
        st
    }

    /// Slot `n` is `region[base + n * max..][..max]`.
    fn slot_offset(&self, n: usize) -> usize {
        self.base + n * self.max
    }

    /// Posts what is not posted: free ECHO slots and SINK buffers.
    fn repost(&mut self) {
        if self.closing {
            return;
        }
        for n in 0..self.slots.len() {
            if self.slots[n] == Slot::Free {
                self.post_slot(n);
            }
        }
        while let Some(buf) = self.sinks_free.pop() {
            match self
                .ep
                .irecv(None, ops::with_op(SINK, 0), OP_MASK, RecvBuf::Owned(buf))
            {
                Ok(r) => self.reqs.push((r, Role::Sink)),
                Err(refused) => {
                    self.warn_repost("sink receive", &refused.error);
                    if let RecvBuf::Owned(b) = refused.buf {
                        self.sinks_free.push(b);
                    }
                    break;
                }
            }
        }
        // Warned again only once everything was posted: an echo receive
        // posted while sink receives kept failing re-armed it every turn.
        if !self.slots.contains(&Slot::Free) && self.sinks_free.is_empty() {
            self.repost_warned = false;
        }
    }

    fn warn_repost(&mut self, what: &str, e: &Error) {
        if !self.repost_warned {
            warn!(endpoint = self.local.endpoint, error = %e, "cannot post a {what}; retrying");
            self.repost_warned = true;
        }
    }

    fn post_slot(&mut self, n: usize) {
        let off = self.slot_offset(n);
        let Ok(buf) = self.region.buffer(off, self.max) else {
            // Frames of the last echo still refer to the range: next turn.
            self.slots[n] = Slot::Free;
            return;
        };
        match self.ep.irecv(
            None,
            ops::with_op(ECHO, 0),
            OP_MASK,
            RecvBuf::Registered(buf),
        ) {
            Ok(r) => {
                self.reqs.push((r, Role::EchoRecv(n)));
                self.slots[n] = Slot::Posted;
            }
            Err(refused) => {
                self.warn_repost("echo receive", &refused.error);
                self.slots[n] = Slot::Free;
            }
        }
    }

    /// Whether `peer`'s PINGs are served: its liveness receive is posted,
    /// or will be once its last PONG is sent.
    fn watched(&self, peer: Addr) -> bool {
        self.watches.get(&peer).is_some_and(|w| *w != Watch::Idle)
    }

    fn post_watch(&mut self, peer: Addr) {
        if self.closing || self.watched(peer) {
            return;
        }
        match self.ep.irecv(
            Some(peer),
            ops::with_op(PING, 0),
            OP_MASK,
            vec![0u8; PING_BYTES],
        ) {
            Ok(r) => {
                self.reqs.push((r, Role::Watch(peer)));
                self.watches.insert(peer, Watch::Posted);
            }
            // Declared down: posted again once it is back.
            Err(refused) => {
                debug!(peer.node = peer.node, peer.endpoint = peer.endpoint, error = %refused.error, "liveness receive not posted");
                self.watches.insert(peer, Watch::Idle);
            }
        }
    }

    /// Drives the endpoint once and handles every request that finished.
    /// Returns whether anything happened.
    pub fn poll(&mut self, checks: &mut Checks) -> bool {
        let mut busy = self.ep.progress();
        // (Those that finished meanwhile need no cancel.)
        for r in std::mem::take(&mut self.to_cancel) {
            if self.reqs.iter().any(|&(q, _)| q == r) {
                self.cancel_or_later(r);
            }
        }
        let reqs = std::mem::take(&mut self.reqs);
        for (req, role) in reqs {
            // `take`, not `test`: inline, `test` polls the link on each
            // request still waiting, with the receives the first poll
            // finished not yet posted again (messages arriving then find
            // none). The next call polls.
            match self.ep.take(req) {
                Ok(Some(c)) => {
                    busy = true;
                    self.finished(role, c, checks);
                }
                Ok(None) => self.reqs.push((req, role)),
                Err(emx::runtime::Error::Thread(why)) => {
                    // The engine is gone: nothing more will complete.
                    self.dead.get_or_insert(why);
                }
                Err(e) => {
                    // A handle the endpoint does not know: never expected.
                    warn!(endpoint = self.local.endpoint, error = %e, role = role.name(), "request lost");
                    self.lost(role, checks);
                }
            }
        }
        if self.slots.contains(&Slot::Free) || !self.sinks_free.is_empty() {
            self.repost();
        }
        busy
    }

    /// A request whose handle went bad: put its slot back in service.
    fn lost(&mut self, role: Role, checks: &mut Checks) {
        match role {
            Role::EchoRecv(n) | Role::EchoSend(n) => self.slots[n] = Slot::Free,
            Role::Sink => self.sinks_free.push(vec![0u8; self.max]),
            Role::Watch(p) | Role::Pong(p) => {
                self.watches.insert(p, Watch::Idle);
            }
            Role::CheckSend { run, seq } => {
                checks.on_send_done(run, seq, Err("the request was lost".into()), false)
            }
            Role::Discard | Role::CheckAnswer { .. } => {}
        }
    }

    fn finished(&mut self, role: Role, c: Completed, checks: &mut Checks) {
        match role {
            Role::EchoRecv(n) => match c.into_recv() {
                Ok((buf, info)) => self.on_echo_message(n, buf, info, checks),
                Err(e) => {
                    self.count_failure(role, &e);
                    self.slots[n] = Slot::Free;
                }
            },
            Role::EchoSend(n) => {
                match c.into_send() {
                    Ok(buf) => {
                        self.counters.echoed += 1;
                        self.counters.echoed_bytes += buf.as_ref().len() as u64;
                    }
                    Err(e) => self.count_failure(role, &e),
                }
                // The send's buffer is dropped above; its range is lent again.
                self.slots[n] = Slot::Free;
            }
            Role::Sink => match c.into_recv() {
                Ok((buf, info)) => {
                    self.counters.sunk += 1;
                    self.counters.sunk_bytes += info.msg_len;
                    self.note_truncated(&info);
                    if let RecvBuf::Owned(b) = buf {
                        self.sinks_free.push(b);
                    }
                }
                Err(e) => {
                    self.count_failure(role, &e);
                    self.sinks_free.push(vec![0u8; self.max]);
                }
            },
            Role::Watch(peer) => {
                self.watches.insert(peer, Watch::Idle);
                match c.into_recv() {
                    Ok((buf, info)) => {
                        let n = info.copied as usize;
                        let answer = buf.as_ref()[..n].to_vec();
                        let bits = ops::with_op(PONG, info.match_bits);
                        match self.ep.isend(info.src, bits, answer) {
                            Ok(r) => {
                                self.counters.pongs += 1;
                                self.reqs.push((r, Role::Pong(peer)));
                                self.watches.insert(peer, Watch::Answering);
                            }
                            Err(refused) => {
                                debug!(peer.node = info.src.node, peer.endpoint = info.src.endpoint, error = %refused.error, "PING not answered");
                                self.post_watch(peer);
                            }
                        }
                    }
                    // Declared unreachable: the scan logs it and posts the
                    // receive again when the peer is back. (With a polling
                    // thread, a receive posted for a peer already given up
                    // is refused so after `irecv` returned; posted again at
                    // once, it went round in a busy loop.)
                    Err(
                        Error::Request(RequestError::PeerUnreachable)
                        | Error::Recv(RecvError::PeerUnreachable),
                    ) => {}
                    Err(e) => {
                        self.count_failure(role, &e);
                        self.post_watch(peer);
                    }
                }
            }
            Role::Pong(peer) => {
                if let Err(e) = c.result {
                    self.count_failure(role, &e);
                }
                // Declared down meanwhile: refused, and posted by the scan
                // once the peer is back.
                self.watches.insert(peer, Watch::Idle);
                self.post_watch(peer);
            }
            Role::Discard => {
                if let Err(e) = c.result {
                    self.count_failure(role, &e);
                }
            }
            Role::CheckSend { run, seq } => {
                let cancelled = c.result.as_ref().is_err_and(|e| e.is_cancelled());
                let r = c.result.map(|_| ()).map_err(|e| e.to_string());
                checks.on_send_done(run, seq, r, cancelled);
            }
            Role::CheckAnswer { .. } => match c.into_recv() {
                Ok((buf, info)) => {
                    let copied = info.copied as usize;
                    if !checks.on_echo(self.local, &info, &buf.as_ref()[..copied]) {
                        self.counters.stray += 1;
                        debug!(
                            peer.node = info.src.node,
                            peer.endpoint = info.src.endpoint,
                            bits = info.match_bits,
                            "stray check answer dropped"
                        );
                    }
                }
                // Cancelled when its check gave up on it, or the peer went.
                Err(e) => self.count_failure(role, &e),
            },
        }
    }

    fn count_failure(&mut self, role: Role, e: &Error) {
        match e {
            Error::ShutDown | Error::Request(RequestError::Cancelled) => {}
            e => {
                self.counters.failed += 1;
                debug!(endpoint = self.local.endpoint, role = role.name(), error = %e, "request failed");
            }
        }
    }

    fn note_truncated(&mut self, info: &emx::proto::RecvInfo) {
        if info.truncated {
            self.counters.truncated += 1;
            if self.counters.truncated == 1 {
                warn!(
                    peer.node = info.src.node,
                    peer.endpoint = info.src.endpoint,
                    len = info.msg_len,
                    limit = self.max,
                    "message longer than the responder's limit, truncated (logged once)"
                );
            }
        }
    }

    /// A message in ECHO slot `n`: an answer to one of our checks, or a
    /// request to echo.
    fn on_echo_message(
        &mut self,
        n: usize,
        buf: RecvBuf,
        info: emx::proto::RecvInfo,
        checks: &mut Checks,
    ) {
        let copied = info.copied as usize;
        if ops::check_parts(info.match_bits).is_some_and(|(origin, _, _)| origin == self.local.node)
        {
            // Our own check's message, come back: never echoed again.
            if !checks.on_echo(self.local, &info, &buf.as_ref()[..copied]) {
                self.counters.stray += 1;
                debug!(
                    peer.node = info.src.node,
                    peer.endpoint = info.src.endpoint,
                    bits = info.match_bits,
                    "stray check answer dropped"
                );
            }
            self.repost_with(n, buf);
            return;
        }
        self.note_truncated(&info);
        if self.closing {
            self.slots[n] = Slot::Free;
            return;
        }
        // The prefix the message filled goes back out as it lies: the slot's
        // buffer is given up and that range lent again, with no copy.
        drop(buf);
        let send = if copied == 0 {
            Ok(SendBuf::Owned(Vec::new()))
        } else {
            self.region
                .buffer(self.slot_offset(n), copied)
                .map(SendBuf::Registered)
        };
        let send = match send {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "cannot lend the echo's bytes; not echoed");
                self.slots[n] = Slot::Free;
                return;
            }
        };
        trace!(
            peer.node = info.src.node,
            peer.endpoint = info.src.endpoint,
            len = copied,
            "echo"
        );
        // Another node's check: its answer goes to the receive that check
        // posted for it, not to the ECHO receives there (see `ops`).
        let bits = if ops::check_parts(info.match_bits).is_some() {
            ops::answer_bits(info.match_bits)
        } else {
            info.match_bits
        };
        match self.ep.isend(info.src, bits, send) {
            Ok(r) => {
                self.reqs.push((r, Role::EchoSend(n)));
                self.slots[n] = Slot::Echoing;
            }
            Err(refused) => {
                self.counters.failed += 1;
                debug!(peer.node = info.src.node, peer.endpoint = info.src.endpoint, error = %refused.error, "echo refused");
                self.slots[n] = Slot::Free;
            }
        }
    }

    /// Posts slot `n` again with the buffer it had.
    fn repost_with(&mut self, n: usize, buf: RecvBuf) {
        if self.closing {
            self.slots[n] = Slot::Free;
            return;
        }
        match self.ep.irecv(None, ops::with_op(ECHO, 0), OP_MASK, buf) {
            Ok(r) => {
                self.reqs.push((r, Role::EchoRecv(n)));
                self.slots[n] = Slot::Posted;
            }
            Err(refused) => {
                self.warn_repost("echo receive", &refused.error);
                self.slots[n] = Slot::Free;
            }
        }
    }

    /// Sends a check's message (to be echoed by `peer`).
    pub fn send_check(
        &mut self,
        peer: Addr,
        bits: u64,
        bytes: Vec<u8>,
        run: u8,
        seq: u32,
    ) -> Result<(), String> {
        // Its answer's receive first, so that the answer finds it whenever
        // it comes (and never waits for an ECHO receive here).
        let answer = self
            .ep
            .irecv(
                Some(peer),
                ops::answer_bits(bits),
                u64::MAX,
                vec![0u8; bytes.len()],
            )
            .map_err(|refused| format!("answer's receive refused: {}", refused.error))?;
        match self.ep.isend(peer, bits, bytes) {
            Ok(r) => {
                self.reqs.push((answer, Role::CheckAnswer { run, seq }));
                self.reqs.push((r, Role::CheckSend { run, seq }));
                Ok(())
            }
            Err(refused) => {
                // Nothing will answer: its receive ends, cancelled, and its
                // completion comes through the request list.
                self.reqs.push((answer, Role::CheckAnswer { run, seq }));
                self.cancel_or_later(answer);
                Err(format!("send refused: {}", refused.error))
            }
        }
    }

    /// Gives up the receive of a check message's answer (the check ended
    /// without it: no echo in time, the send failed, the peer went down).
    pub fn cancel_check_answer(&mut self, run: u8, seq: u32) {
        self.cancel_role(Role::CheckAnswer { run, seq });
    }

    /// Withdraws the send of a check message that failed before its send
    /// completed (a rendezvous message its peer never took: its responder
    /// takes no messages). Its completion, cancelled or (if the peer took it
    /// after all) done, comes through the request list.
    pub fn cancel_check_send(&mut self, run: u8, seq: u32) {
        self.cancel_role(Role::CheckSend { run, seq });
    }

    /// Cancels the request in `role`, if there is one; its completion
    /// (cancelled, or what it came to after all) comes through the request
    /// list as any other.
    fn cancel_role(&mut self, role: Role) {
        let found = self.reqs.iter().find(|(_, r)| *r == role);
        if let Some(&(r, _)) = found {
            self.cancel_or_later(r);
        }
    }

    /// Cancels request `r`, or notes it to be cancelled on a later poll
    /// when the command ring is full; whether it was handed over (or needs
    /// no cancel: it finished, is unknown, or cannot be cancelled).
    fn cancel_or_later(&mut self, r: Request) -> bool {
        match self.ep.cancel(r) {
            Err(emx::runtime::Error::WouldBlock) => {
                if !self.to_cancel.contains(&r) {
                    self.to_cancel.push(r);
                }
                false
            }
            _ => true,
        }
    }

    /// Reads every peer's state, logs what changed, tells `checks` (when
    /// this endpoint runs them) about peers that went down, greets peers given up again now and then, posts
    /// liveness receives on peers that are back or being greeted, and drops
    /// messages that nobody serves.
    pub fn scan(&mut self, mut checks: Option<&mut Checks>) {
        let Ok(peers) = self.ep.peers() else { return };
        for p in &peers {
            let state = self.shown_state(p);
            let view = self.views.entry(p.addr).or_insert(View {
                state: PeerState::Unknown,
                epoch: 0,
                greeted: None,
            });
            let was = *view;
            if p.down && was.state != PeerState::Down {
                // Just given up: the first new greeting one deadline later.
                view.greeted = Some(Instant::now());
            } else if p.down
                && !self.closing
                && was.greeted.is_none_or(|t| t.elapsed() >= self.regreet)
                && self.ep.reconnect(p.addr).unwrap_or(false)
            {
                // The partition may have healed: start a new session. The
                // liveness receive posted below watches the attempt.
                debug!(
                    peer.node = p.addr.node,
                    peer.endpoint = p.addr.endpoint,
                    "greeting a peer given up again"
                );
                view.greeted = Some(Instant::now());
            }
            let silent_ms = p.silent_for.map(millis);
            match (was.state, state) {
                (PeerState::Up, PeerState::Up) if p.epoch != was.epoch => {
                    info!(
                        endpoint = self.local.endpoint,
                        peer.node = p.addr.node,
                        peer.endpoint = p.addr.endpoint,
                        old_epoch = was.epoch,
                        epoch = p.epoch,
                        "peer restarted (new epoch)"
                    );
                }
                (s, PeerState::Up) if s != PeerState::Up => {
                    if was.epoch != 0 && was.epoch != p.epoch {
                        info!(
                            endpoint = self.local.endpoint,
                            peer.node = p.addr.node,
                            peer.endpoint = p.addr.endpoint,
                            old_epoch = was.epoch,
                            epoch = p.epoch,
                            "peer up again with a new epoch"
                        );
                    } else {
                        info!(
                            endpoint = self.local.endpoint,
                            peer.node = p.addr.node,
                            peer.endpoint = p.addr.endpoint,
                            epoch = p.epoch,
                            "peer up"
                        );
                    }
                }
                (PeerState::Up, PeerState::Down) => {
                    warn!(
                        endpoint = self.local.endpoint,
                        peer.node = p.addr.node,
                        peer.endpoint = p.addr.endpoint,
                        epoch = was.epoch,
                        silent_ms,
                        "peer down: silent past the liveness deadline"
                    );
                }
                (PeerState::Unknown | PeerState::Unresolved, PeerState::Down) => {
                    warn!(
                        endpoint = self.local.endpoint,
                        peer.node = p.addr.node,
                        peer.endpoint = p.addr.endpoint,
                        "peer down: never answered within the liveness deadline"
                    );
                }
                _ => {}
            }
            view.state = state;
            if p.epoch != 0 {
                view.epoch = p.epoch;
            }
            if state == PeerState::Down {
                if let Some(c) = checks.as_deref_mut() {
                    c.peer_down(p.addr);
                }
            }
            // (A peer being greeted again is watched too, though shown down.)
            if !p.down && !self.closing && !self.watched(p.addr) {
                self.post_watch(p.addr);
            }
        }
        self.discard_unserved();
    }

    /// Receives (and drops) each peer's oldest unexpected messages while
    /// their op is not one the responder serves: they would hold their
    /// sender's credits forever. Peer by peer: a message that waits to be
    /// served (a PING behind its sender's PONG, an ECHO for a free slot)
    /// holds up only its own sender's. (64 discards a scan at most.)
    fn discard_unserved(&mut self) {
        if self.closing {
            return;
        }
        let peers: Vec<Addr> = self.watches.keys().copied().collect();
        let mut budget = 64;
        for peer in peers {
            while budget > 0 {
                let Ok(Some(m)) = self.ep.probe(Some(peer), 0, 0) else {
                    break;
                };
                let served = match ops::op_of(m.match_bits) {
                    ECHO | SINK => true,
                    PING => self.watched(m.src),
                    _ => false,
                };
                if served {
                    break;
                }
                budget -= 1;
                match self
                    .ep
                    .irecv(Some(m.src), m.match_bits, u64::MAX, Vec::new())
                {
                    Ok(r) => {
                        // An answer that came after its check gave up on it
                        // (its receive cancelled) is a stray answer, not an
                        // unknown op.
                        if ops::op_of(m.match_bits) == ops::CHECK_ANSWER {
                            self.counters.stray += 1;
                            debug!(
                                peer.node = m.src.node,
                                peer.endpoint = m.src.endpoint,
                                bits = m.match_bits,
                                "late check answer dropped"
                            );
                        } else {
                            self.counters.discarded += 1;
                            debug!(
                                peer.node = m.src.node,
                                peer.endpoint = m.src.endpoint,
                                bits = m.match_bits,
                                len = m.len,
                                "message with an unserved op discarded"
                            );
                        }
                        self.reqs.push((r, Role::Discard));
                        // Inline, the receive matched at once; let it finish so
                        // that the next probe sees the next message.
                        self.ep.progress();
                    }
                    Err(_) => break,
                }
            }
        }
    }

    /// This endpoint's view of its peers, and the cluster file's nodes whose
    /// MAC is `auto` and whose address is not learnt yet as unresolved.
    pub fn peer_entries(&mut self, cluster: &ClusterConfig) -> Result<Vec<PeerEntry>, Error> {
        let peers = self.ep.peers()?;
        let mut out: Vec<PeerEntry> = peers
            .iter()
            .map(|p| PeerEntry {
                local: self.local.endpoint,
                node: p.addr.node,
                name: cluster.node_by_id(p.addr.node).map(|n| n.name.clone()),
                endpoint: p.addr.endpoint,
                mac: if p.mac == UNLEARNT_MAC {
                    "auto".into()
                } else {
                    Mac::Addr(p.mac).to_string()
                },
                state: self.shown_state(p),
                epoch: (p.epoch != 0).then_some(p.epoch),
                silent_ms: p.silent_for.map(millis),
                srtt_us: p.srtt.map(micros),
                rto_ms: Some(millis(p.rto)),
                frames_sent: p.stats.frames_sent,
                frames_received: p.stats.frames_received,
                bytes_sent: p.stats.bytes_sent,
                bytes_received: p.stats.bytes_received,
                retransmits: p.stats.retransmits,
            })
            .collect();
        for n in cluster.nodes() {
            if n.id == self.local.node || n.mac != Mac::Auto {
                continue;
            }
            for &e in &n.endpoints {
                if peers.iter().any(|p| p.addr == Addr::new(n.id, e)) {
                    continue;
                }
                out.push(PeerEntry {
                    local: self.local.endpoint,
                    node: n.id,
                    name: Some(n.name.clone()),
                    endpoint: e,
                    mac: "auto".into(),
                    state: PeerState::Unresolved,
                    epoch: None,
                    silent_ms: None,
                    srtt_us: None,
                    rto_ms: None,
                    frames_sent: 0,
                    frames_received: 0,
                    bytes_sent: 0,
                    bytes_received: 0,
                    retransmits: 0,
                });
            }
        }
        out.sort_by_key(|p| (p.local, p.node, p.endpoint));
        Ok(out)
    }

    /// Every peer's full protocol counters, named as the cluster file names
    /// its node.
    pub fn peer_stats(&mut self, cluster: &ClusterConfig) -> Result<Vec<PeerStatsEntry>, Error> {
        Ok(self
            .ep
            .peers()?
            .iter()
            .map(|p| {
                let s = &p.stats;
                PeerStatsEntry {
                    node: p.addr.node,
                    name: cluster.node_by_id(p.addr.node).map(|n| n.name.clone()),
                    endpoint: p.addr.endpoint,
                    frames_sent: s.frames_sent,
                    bytes_sent: s.bytes_sent,
                    frames_received: s.frames_received,
                    bytes_received: s.bytes_received,
                    retransmits: s.retransmits,
                    timeouts: s.timeouts,
                    duplicates: s.duplicates,
                    acks_sent: s.acks_sent,
                    acks_received: s.acks_received,
                    credit_stalls: s.credit_stalls,
                    window_stalls: s.window_stalls,
                    msgs_packed: s.msgs_packed,
                    keepalives_sent: s.keepalives_sent,
                    hellos_sent: s.hellos_sent,
                    dropped: s.dropped.total(),
                    dropped_by_reason: emx::wire::DropReason::ALL
                        .iter()
                        .filter(|&&r| s.dropped.get(r) > 0)
                        .map(|&r| (format!("{r:?}"), s.dropped.get(r)))
                        .collect(),
                }
            })
            .collect())
    }

    /// The peers' states, for choosing what to check. (A polling thread's
    /// full command ring, or its end, is an error: it read as no peers,
    /// and a check said none was up.)
    pub fn peer_states(&mut self) -> Result<Vec<(Addr, PeerState)>, Error> {
        Ok(self
            .ep
            .peers()?
            .iter()
            .map(|p| (p.addr, self.shown_state(p)))
            .collect())
    }

    /// A peer's state as logged and reported: one given up stays down while it
    /// is greeted again, until it answers.
    fn shown_state(&self, p: &PeerStatus) -> PeerState {
        match state_of(p) {
            PeerState::Up => PeerState::Up,
            _ if self
                .views
                .get(&p.addr)
                .is_some_and(|v| v.state == PeerState::Down) =>
            {
                PeerState::Down
            }
            s => s,
        }
    }

    /// Stops taking work: receives that hold nothing yet are cancelled (and
    /// their completions taken, for up to `wait`), nothing is posted or
    /// echoed any more. Returns how many were cancelled.
    pub fn quiesce(&mut self, checks: &mut Checks, wait: Duration) -> usize {
        self.closing = true;
        let mut cancelled = 0;
        let idle: Vec<Request> = self
            .reqs
            .iter()
            .filter(|(_, role)| role.idle_receive())
            .map(|&(r, _)| r)
            .collect();
        for r in &idle {
            if let Ok(true) = self.ep.cancel(*r) {
                cancelled += 1;
            }
        }
        // Take the cancellations (and anything else that finished meanwhile).
        let until = std::time::Instant::now() + wait;
        while std::time::Instant::now() < until {
            self.poll(checks);
            if !self.reqs.iter().any(|(r, _)| idle.contains(r)) {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        cancelled
    }

    /// Closes the endpoint: what still carries data gets until `deadline` to
    /// finish, the rest is aborted. Call [`Station::quiesce`] first.
    pub fn close(self, deadline: Duration, cancelled: usize) -> CloseSummary {
        let roles: HashMap<Request, Role> = self.reqs.iter().copied().collect();
        let report = self.ep.close(deadline);
        let mut sum = CloseSummary {
            cancelled,
            drained: report.drained,
            // (lost: aborted with no completion, the polling thread gone)
            aborted: report.aborted + report.lost,
            ..CloseSummary::default()
        };
        for (r, c) in &report.completed {
            let kind = roles.get(r).map_or("request", |r| r.name());
            let aborted = matches!(c.result, Err(Error::ShutDown));
            let kinds = if aborted {
                &mut sum.aborted_kinds
            } else {
                &mut sum.drained_kinds
            };
            *kinds.entry(kind).or_default() += 1;
        }
        sum
    }
}

/// A peer's state from the engine's view of it.
pub fn state_of(p: &PeerStatus) -> PeerState {
    if p.down {
        PeerState::Down
    } else if p.epoch != 0 {
        PeerState::Up
    } else if p.mac == UNLEARNT_MAC {
        PeerState::Unresolved
    } else {
        PeerState::Unknown
    }
}

/// A duration in milliseconds, to a microsecond.
fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// A duration in microseconds, to a tenth.
fn micros(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e7).round() / 10.0
}
