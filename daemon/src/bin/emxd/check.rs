//! `check`: messages of given sizes echoed off peers, every byte compared.
//!
//! A run goes through its peers side by side and through each peer's sizes
//! one at a time (so a run never holds more than one of a peer's ECHO slots).
//! Each message carries [`ops::check_bits`] (this node as origin, the run, a
//! sequence number unique across runs) and the pattern seeded by those bits;
//! its echo, op [`ops::CHECK_ANSWER`], is taken by a receive posted for it
//! before the message left, never by this node's ECHO slots (which may all
//! be busy echoing other nodes' checks), and handed here
//! ([`Checks::on_echo`]). A message is done when its send completed and its
//! echo came back byte-exact, or failed: the send failed, the echo differs or
//! is short, the peer went down, or nothing came back in [`ECHO_TIMEOUT`].
//! Its result is then reported, but the next size to that peer waits for the
//! send to complete: a run has at most one send in flight to each peer.
//! A failed message whose send has not completed (a rendezvous message the
//! peer never pulled: its responder takes no messages) is withdrawn and set
//! aside as lingering, and the run goes on without it: until its send ends
//! (cancelled, a round trip later, unless the peer took the message after
//! all), later messages to that peer fail at once rather than add sends
//! that would linger too, and no run waits for it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use emx::proto::{Addr, RecvInfo};
use emx_daemon::control::{reply_err, reply_ok, CheckReport, CheckResult};
use emx_daemon::ops;
use tracing::{debug, info, warn};

use crate::station::Station;

/// How long one message may take to come back.
pub const ECHO_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks a node runs at once; more are refused. A run's id (in every
/// message's match bits) is 8 bits: without a bound, 256 of them would leave
/// no id to take. A run whose client went away sends nothing more, and ends
/// once its messages in flight are done (counted against this bound until
/// then, so that checks abandoned one after another leave no sends behind;
/// a failed message's send that may never complete is set aside, at most one
/// per peer, as the module's docs say).
pub const MAX_RUNS: usize = 16;

/// One peer endpoint of a run, and the sizes still to send it.
struct Target {
    peer: Addr,
    name: Option<String>,
    sizes: VecDeque<u64>,
    current: Option<Item>,
}

/// One message in flight.
struct Item {
    seq: u32,
    bits: u64,
    size: u64,
    sent_at: Instant,
    /// The send's outcome, once it completed.
    sent: Option<Result<(), String>>,
    /// The echo's outcome (round trip in microseconds), once it came.
    echoed: Option<Result<f64, String>>,
    /// Its result is in the report; it stays until its send completed.
    reported: bool,
}

/// One `check` request being served.
struct Run {
    id: u8,
    reply: Sender<String>,
    targets: Vec<Target>,
    report: CheckReport,
    /// Set when the client that asked went away.
    left: Arc<AtomicBool>,
    /// Seen gone: it sends nothing more, and ends unanswered.
    abandoned: bool,
}

/// A failed message's send that has not completed (see the module's docs).
struct Lingering {
    peer: Addr,
    run: u8,
    seq: u32,
    sent_at: Instant,
}

/// The checks under way.
#[derive(Default)]
pub struct Checks {
    runs: Vec<Run>,
    /// At most one per peer endpoint: none is sent to a peer that has one.
    lingering: Vec<Lingering>,
    next_id: u8,
    /// The next message's sequence number, for every run: a late echo of an
    /// ended run's message is not taken for a later run's that reuses its
    /// id.
    next_seq: u32,
}

impl Checks {
    /// Starts a run against `targets` (peer, its node name, its responder's
    /// limit) with `sizes`; `reply` gets the report when it is done. Sizes
    /// above `max` (this node's responder's limit, which its answers' receives
    /// share) or above a peer's limit (its echo would come back cut to it)
    /// fail at once. With [`MAX_RUNS`] under way, the run
    /// is refused: `reply` says so at once.
    pub fn start(
        &mut self,
        targets: Vec<(Addr, Option<String>, usize)>,
        sizes: &[u64],
        max: usize,
        failed_early: Vec<CheckResult>,
        reply: Sender<String>,
        left: Arc<AtomicBool>,
    ) {
        if self.runs.len() >= MAX_RUNS {
            let _ = reply.send(reply_err::<()>(
                &format!(
                    "{} checks are running on this node, the most it takes at once; try \
                     again when one ends (each message is given {} s to come back)",
                    self.runs.len(),
                    ECHO_TIMEOUT.as_secs()
                ),
                None,
            ));
            return;
        }
        // Fewer runs than ids: this ends.
        let mut id = self.next_id;
        while self.runs.iter().any(|r| r.id == id) {
            id = id.wrapping_add(1);
        }
        self.next_id = id.wrapping_add(1);
        let mut report = CheckReport {
            results: failed_early,
            ..CheckReport::default()
        };
        let mut ts = Vec::new();
        for (peer, name, peer_max) in targets {
            let mut queue = VecDeque::new();
            for &size in sizes {
                let error = if size > max as u64 {
                    format!("larger than the responder's limit of {max} bytes")
                } else if size > peer_max as u64 {
                    format!(
                        "larger than the peer's responder limit of {peer_max} bytes (its \
                         share of memory.region_mb)"
                    )
                } else {
                    queue.push_back(size);
                    continue;
                };
                report.results.push(CheckResult {
                    node: peer.node,
                    name: name.clone(),
                    endpoint: peer.endpoint,
                    size,
                    ok: false,
                    rtt_us: None,
                    error: Some(error),
                });
            }
            ts.push(Target {
                peer,
                name,
                sizes: queue,
                current: None,
            });
        }
        info!(
            run = id,
            peers = ts.len(),
            sizes = sizes.len(),
            "check started"
        );
        self.runs.push(Run {
            id,
            reply,
            targets: ts,
            report,
            left,
            abandoned: false,
        });
    }

    /// Stops the runs whose clients went away from sending more; returns
    /// whether there were any new ones.
    fn stop_abandoned(&mut self) -> bool {
        let mut any = false;
        for r in &mut self.runs {
            if !r.abandoned && r.left.load(Ordering::Relaxed) {
                info!(run = r.id, "check abandoned: its client went away");
                r.abandoned = true;
                for t in &mut r.targets {
                    t.sizes.clear();
                }
                any = true;
            }
        }
        any
    }

    /// Whether any run is under way.
    pub fn active(&self) -> bool {
        !self.runs.is_empty()
    }

    /// Moves every run on: finishes messages that are done or late, sends
    /// the next size, and answers finished runs. Returns whether anything
    /// happened.
    pub fn advance(&mut self, st: &mut Station) -> bool {
        let mut busy = self.stop_abandoned();
        let now = Instant::now();
        for run in &mut self.runs {
            for t in &mut run.targets {
                if let Some(item) = &mut t.current {
                    let outcome = match (&item.sent, &item.echoed) {
                        _ if item.reported => None,
                        (Some(Err(e)), _) => Some(Err(e.clone())),
                        (_, Some(Err(e))) => Some(Err(e.clone())),
                        (Some(Ok(())), Some(Ok(rtt))) => Some(Ok(*rtt)),
                        _ if now.duration_since(item.sent_at) > ECHO_TIMEOUT => {
                            Some(Err(format!("no echo within {} s", ECHO_TIMEOUT.as_secs())))
                        }
                        _ => None,
                    };
                    if let Some(outcome) = outcome {
                        let (size, seq) = (item.size, item.seq);
                        item.reported = true;
                        push_result(&mut run.report, t, size, outcome);
                        // (Done already where the echo came.)
                        st.cancel_check_answer(run.id, seq);
                        busy = true;
                    }
                    match &t.current {
                        Some(i) if i.reported && i.sent.is_some() => {
                            t.current = None;
                            busy = true;
                        }
                        // Failed, and its send may never complete: no run
                        // waits for it, and it is withdrawn (a rendezvous
                        // message its peer did not take ends so).
                        Some(i) if i.reported => {
                            st.cancel_check_send(run.id, i.seq);
                            self.lingering.push(Lingering {
                                peer: t.peer,
                                run: run.id,
                                seq: i.seq,
                                sent_at: i.sent_at,
                            });
                            t.current = None;
                            busy = true;
                        }
                        _ => {}
                    }
                }
                while t.current.is_none() {
                    let Some(size) = t.sizes.pop_front() else {
                        break;
                    };
                    busy = true;
                    if let Some(l) = self.lingering.iter().find(|l| l.peer == t.peer) {
                        let why = format!(
                            "an earlier check message to this peer, sent {} s ago, is still \
                             not taken: its responder takes no messages",
                            l.sent_at.elapsed().as_secs()
                        );
                        push_result(&mut run.report, t, size, Err(why));
                        continue;
                    }
                    let seq = self.next_seq;
                    self.next_seq = self.next_seq.wrapping_add(1) & 0xff_ffff;
                    let bits = ops::check_bits(st.local.node, run.id, seq);
                    let mut bytes = vec![0u8; size as usize];
                    ops::fill_pattern(bits, &mut bytes);
                    match st.send_check(t.peer, bits, bytes, run.id, seq) {
                        Ok(()) => {
                            t.current = Some(Item {
                                seq,
                                bits,
                                size,
                                sent_at: Instant::now(),
                                sent: None,
                                echoed: None,
                                reported: false,
                            })
                        }
                        Err(e) => push_result(&mut run.report, t, size, Err(e)),
                    }
                }
            }
        }
        self.end_finished() || busy
    }

    /// Answers the runs that have nothing left to send or wait for (those
    /// abandoned end unanswered); returns whether any ended.
    fn end_finished(&mut self) -> bool {
        let (done, running): (Vec<Run>, Vec<Run>) =
            std::mem::take(&mut self.runs).into_iter().partition(|r| {
                r.targets.iter().all(|t| {
                    t.sizes.is_empty()
                        && t.current
                            .as_ref()
                            .is_none_or(|i| i.reported && i.sent.is_some())
                })
            });
        self.runs = running;
        let ended = !done.is_empty();
        for run in done {
            if run.abandoned {
                info!(run = run.id, "abandoned check ended: its messages are done");
            } else {
                finish(run, None);
            }
        }
        ended
    }

    /// A check message's send completed (`cancelled`: it was withdrawn).
    pub fn on_send_done(&mut self, run: u8, seq: u32, result: Result<(), String>, cancelled: bool) {
        if let Some(at) = self
            .lingering
            .iter()
            .position(|l| l.run == run && l.seq == seq)
        {
            let l = self.lingering.swap_remove(at);
            let how = match &result {
                Ok(()) => "taken after all",
                Err(_) if cancelled => "withdrawn",
                Err(_) => "failed",
            };
            info!(
                peer.node = l.peer.node,
                peer.endpoint = l.peer.endpoint,
                seq,
                ?result,
                "the send of a check message that got no echo ended: {how}"
            );
        } else if let Some(item) = self.item(run, seq) {
            item.sent = Some(result.map_err(|e| format!("send failed: {e}")));
        }
    }

    /// An echo of one of this node's check messages arrived at `local` (in
    /// the receive posted for it, or, from an older emxd, in an ECHO slot):
    /// compares it. Returns whether a run waited for it.
    pub fn on_echo(&mut self, local: Addr, info: &RecvInfo, bytes: &[u8]) -> bool {
        // The request's bits: an answer comes with op CHECK_ANSWER (an old
        // emxd's with op ECHO).
        let bits = if ops::op_of(info.match_bits) == ops::CHECK_ANSWER {
            ops::with_op(ops::ECHO, info.match_bits)
        } else {
            info.match_bits
        };
        let Some((origin, run, seq)) = ops::check_parts(bits) else {
            return false;
        };
        if origin != local.node {
            return false;
        }
        let Some(run) = self.runs.iter_mut().find(|r| r.id == run) else {
            return false;
        };
        let Some(item) = run
            .targets
            .iter_mut()
            .filter(|t| t.peer == info.src)
            .find_map(|t| t.current.as_mut().filter(|i| i.seq == seq))
        else {
            return false;
        };
        if item.bits != bits || item.echoed.is_some() {
            return false;
        }
        let rtt = item.sent_at.elapsed().as_secs_f64() * 1e6;
        item.echoed = Some(if info.msg_len != item.size {
            Err(format!(
                "the echo is {} bytes long, {} were sent",
                info.msg_len, item.size
            ))
        } else if info.truncated {
            Err(format!(
                "the echo was truncated to {} bytes here (the responder's limit)",
                info.copied
            ))
        } else if let Some(k) = ops::pattern_mismatch(item.bits, bytes) {
            Err(format!("byte {k} of the echo differs from what was sent"))
        } else {
            Ok(rtt)
        });
        true
    }

    /// `peer` went down: its messages in flight and its sizes still to send
    /// fail.
    pub fn peer_down(&mut self, peer: Addr) {
        for run in &mut self.runs {
            for t in run.targets.iter_mut().filter(|t| t.peer == peer) {
                if let Some(item) = &mut t.current {
                    if item.echoed.is_none() {
                        item.echoed = Some(Err("the peer went down".into()));
                    }
                }
                while let Some(size) = t.sizes.pop_front() {
                    push_result(&mut run.report, t, size, Err("the peer is down".into()));
                }
            }
        }
    }

    /// Answers every run with what it has so far and `why` it stopped.
    pub fn abort_all(&mut self, why: &str) {
        for run in std::mem::take(&mut self.runs) {
            finish(run, Some(why));
        }
    }

    fn item(&mut self, run: u8, seq: u32) -> Option<&mut Item> {
        self.runs
            .iter_mut()
            .find(|r| r.id == run)?
            .targets
            .iter_mut()
            .find_map(|t| t.current.as_mut().filter(|i| i.seq == seq))
    }
}

fn push_result(report: &mut CheckReport, t: &Target, size: u64, outcome: Result<f64, String>) {
    let (ok, rtt_us, error) = match outcome {
        Ok(rtt) => (true, Some(rtt), None),
        Err(e) => (false, None, Some(e)),
    };
    debug!(
        peer.node = t.peer.node,
        peer.endpoint = t.peer.endpoint,
        size,
        ok,
        error = error.as_deref(),
        "check message done"
    );
    report.results.push(CheckResult {
        node: t.peer.node,
        name: t.name.clone(),
        endpoint: t.peer.endpoint,
        size,
        ok,
        rtt_us,
        error,
    });
}

/// Answers a run: `ok` when every message came back byte-exact.
fn finish(mut run: Run, interrupted: Option<&str>) {
    let not_run: usize = run
        .targets
        .iter()
        .map(|t| t.sizes.len() + usize::from(t.current.as_ref().is_some_and(|i| !i.reported)))
        .sum();
    run.report.passed = run.report.results.iter().filter(|r| r.ok).count();
    run.report.failed = run.report.results.len() - run.report.passed;
    let r = &run.report;
    let reply = match interrupted {
        Some(why) => {
            info!(
                run = run.id,
                passed = r.passed,
                failed = r.failed,
                not_run,
                "check interrupted: {why}"
            );
            reply_err(
                &format!(
                    "{why}: check interrupted ({} passed, {} failed, {not_run} not done)",
                    r.passed, r.failed
                ),
                Some(r),
            )
        }
        None if r.failed > 0 || r.results.is_empty() => {
            // Which peer failed, and how, for the operator reading the log
            // (each message's outcome is logged at debug only).
            let first = r.results.iter().find(|x| !x.ok);
            warn!(
                run = run.id,
                passed = r.passed,
                failed = r.failed,
                first.node = first.map(|x| x.node),
                first.name = first.and_then(|x| x.name.as_deref()),
                first.size = first.map(|x| x.size),
                first.error = first.and_then(|x| x.error.as_deref()),
                "check failed"
            );
            let why = if r.results.is_empty() {
                "nothing was checked".to_owned()
            } else {
                format!(
                    "check failed: {} of {} messages did not come back byte-exact",
                    r.failed,
                    r.results.len()
                )
            };
            reply_err(&why, Some(r))
        }
        None => {
            info!(run = run.id, passed = r.passed, "check passed");
            reply_ok(r)
        }
    };
    // The client may have gone; nothing to do then.
    let _ = run.reply.send(reply);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A size past a peer's responder limit (its share of the region, which
    /// differs from this node's when it has more endpoints) fails at once,
    /// saying so: its echo would come back cut to that limit, and was
    /// reported as a wrong length, as if data had been lost.
    #[test]
    fn sizes_past_a_peers_limit_fail_at_once() {
        let mut checks = Checks::default();
        let (small, big) = (Addr::new(2, 0), Addr::new(3, 0));
        let (tx, _rx) = std::sync::mpsc::channel();
        checks.start(
            vec![(small, None, 8 << 20), (big, None, usize::MAX)],
            &[1000, 12 << 20],
            16 << 20,
            Vec::new(),
            tx,
            left(),
        );
        let run = &checks.runs[0];
        let failed: Vec<_> = run
            .report
            .results
            .iter()
            .map(|r| (r.node, r.size))
            .collect();
        assert_eq!(failed, [(2, 12 << 20)]);
        let error = run.report.results[0].error.as_deref().unwrap();
        assert!(
            error.contains("the peer's responder limit of 8388608 bytes"),
            "{error}"
        );
        assert_eq!(run.targets[0].sizes, [1000]);
        assert_eq!(run.targets[1].sizes, [1000, 12 << 20]);
    }

    /// Runs whose clients left still count; past the bound a check is
    /// refused at once, never waited on for an id.
    #[test]
    fn runs_past_the_bound_are_refused() {
        let mut checks = Checks::default();
        let peer = Addr::new(2, 0);
        let mut replies = Vec::new();
        for _ in 0..300 {
            let rx = start_one(&mut checks, peer, left());
            replies.push(rx);
        }
        assert_eq!(checks.runs.len(), MAX_RUNS);
        let mut ids: Vec<u8> = checks.runs.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), MAX_RUNS, "each run has an id of its own");
        for (i, rx) in replies.iter().enumerate() {
            match rx.try_recv() {
                Ok(r) => {
                    assert!(i >= MAX_RUNS, "run {i} was refused: {r}");
                    assert!(r.contains("checks are running"), "{r}");
                }
                Err(_) => assert!(i < MAX_RUNS, "run {i} got no answer"),
            }
        }
    }

    fn left() -> Arc<AtomicBool> {
        Arc::new(AtomicBool::new(false))
    }

    /// Starts a check of 1000 B off `peer` whose client's flag is `gone`;
    /// the receiver of its answer.
    fn start_one(
        checks: &mut Checks,
        peer: Addr,
        gone: Arc<AtomicBool>,
    ) -> std::sync::mpsc::Receiver<String> {
        let (tx, rx) = std::sync::mpsc::channel();
        checks.start(
            vec![(peer, None, usize::MAX)],
            &[1000],
            1 << 20,
            Vec::new(),
            tx,
            gone,
        );
        rx
    }

    /// A run whose client went away sends nothing more and ends, unanswered,
    /// once its message in flight is done, and makes room for another: runs
    /// do not pile up behind clients that were interrupted, nor do their
    /// sends (it used to end at once, its message left in flight).
    #[test]
    fn a_run_whose_client_left_ends() {
        let mut checks = Checks::default();
        let peer = Addr::new(2, 0);
        let flags: Vec<_> = (0..MAX_RUNS).map(|_| left()).collect();
        let mut replies = Vec::new();
        for f in &flags {
            let rx = start_one(&mut checks, peer, f.clone());
            replies.push(rx);
        }
        assert!(!checks.stop_abandoned());
        // Run 3's first message is in flight, its result reported.
        let id = checks.runs[3].id;
        checks.runs[3].targets[0].current = Some(Item {
            seq: 7,
            bits: ops::check_bits(1, id, 7),
            size: 1000,
            sent_at: Instant::now(),
            sent: None,
            echoed: None,
            reported: true,
        });
        flags[3].store(true, Ordering::Relaxed);
        assert!(checks.stop_abandoned());
        assert!(!checks.stop_abandoned(), "seen once");
        assert!(checks.runs[3].targets[0].sizes.is_empty(), "sends no more");
        assert!(!checks.end_finished(), "its send is in flight");
        assert_eq!(checks.runs.len(), MAX_RUNS);
        checks.on_send_done(id, 7, Ok(()), false);
        assert!(checks.end_finished());
        assert_eq!(checks.runs.len(), MAX_RUNS - 1);
        assert!(replies[3].try_recv().is_err(), "nobody to answer");
        let rx = start_one(&mut checks, peer, left());
        assert!(rx.try_recv().is_err(), "a new run is taken, not refused");
        assert_eq!(checks.runs.len(), MAX_RUNS);
    }
}
