//! Results: rows aggregated over rounds, the terminal table, JSON, and an
//! SVG chart of latency and bandwidth against message size.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::session::{Cores, SendBuffers, Stream, Transport};

/// A kind of test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Test {
    /// Ping-pong round trips.
    Latency,
    /// One-way streaming with a window of messages in flight.
    Bandwidth,
    /// Both directions at once.
    Bibw,
    /// Small messages with a window: messages per second.
    Msgrate,
    /// All of the above.
    Sweep,
}

/// Its name on the command line (`--test msgrate`), in messages and tables.
impl std::fmt::Display for Test {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use clap::ValueEnum;
        let v = self.to_possible_value().expect("no test is hidden");
        f.write_str(v.get_name())
    }
}

/// Latency figures of one (test, transport, size), in nanoseconds: medians
/// over rounds of each percentile, the largest maximum, and the spread of p50.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    pub p50_ns: f64,
    pub p90_ns: f64,
    pub p99_ns: f64,
    pub p999_ns: f64,
    pub max_ns: f64,
    /// Round trips measured, all rounds.
    pub count: u64,
    pub p50_min_ns: f64,
    pub p50_max_ns: f64,
    /// Each round's p50.
    pub rounds_p50_ns: Vec<f64>,
    /// Round trips lost, all rounds: raw and ffi send nothing again and
    /// leave them out of the percentiles; kernel UDP sends the datagram
    /// again, times the round trip from the resend, and counts the losses
    /// of its warm-up too. (emx sends frames again itself: its figures hold
    /// what that cost, and its `protocol` counts them.)
    pub lost: u64,
}

/// Streaming figures: totals over rounds (so that `gbit_s` is exactly
/// `bytes * 8 / seconds / 1e9` and `msgs_per_s` is `msgs / seconds`), and the
/// spread of the per-round rates.
#[derive(Clone, Debug, Serialize)]
pub struct Flow {
    pub bytes: u64,
    pub msgs: u64,
    pub seconds: f64,
    pub gbit_s: f64,
    pub msgs_per_s: f64,
    pub gbit_s_min: f64,
    pub gbit_s_max: f64,
    /// Each round's rate.
    pub rounds_gbit_s: Vec<f64>,
    /// Messages lost, all rounds, warm-up included: kernel UDP's datagrams
    /// that the kernel took and that never arrived, and raw's frames that
    /// the link took and the echo never got, in messages' worth (one way;
    /// nothing sends either again, and the figures count what arrived). 0
    /// for emx and TCP, which send again what was lost.
    pub lost: u64,
}

/// emx protocol counters of the measuring side (the pinger, the sender of a
/// one-way stream) toward its peer, summed over rounds, warm-up included: what
/// a rate or a tail costs in frames, retransmissions and stalls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Protocol {
    /// Frames sent (retransmissions and pure acks included).
    pub frames_sent: u64,
    /// Frames received and accepted.
    pub frames_received: u64,
    /// Reliable frames sent again (timeout or fast retransmit).
    pub retransmits: u64,
    /// Frames the retransmission timer declared lost.
    pub timeouts: u64,
    /// Frames received twice (dropped).
    pub duplicates: u64,
    /// Pure ack frames sent.
    pub acks_sent: u64,
    /// Times the send window filled up while frames waited.
    pub window_stalls: u64,
    /// Times a message waited for the peer's credits.
    pub credit_stalls: u64,
    /// Messages sent packed several to a frame.
    pub msgs_packed: u64,
    /// Of the frames this side sent, those the other side received twice
    /// (`None` where its echo does not count them). A frame sent again that
    /// also arrived the first time was not lost: its timeout ran out while its
    /// receiver was still working through the frames ahead of it, or was off
    /// its CPU, or while the acknowledgement was on its way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub echo_duplicates: Option<u64>,
    /// Streams with inline progress on the receiving side: what it received
    /// (the echo side's messages; both sides' in bibw).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arrivals: Option<Arrivals>,
}

/// The messages a stream's receiving side took, warm-up included, and how
/// many of them arrived before their receive was posted (an eager one waited
/// in the unexpected store, copied in and out again). The bench keeps
/// receives posted ahead of the sender's window, so that none should.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Arrivals {
    /// Messages received.
    pub messages: u64,
    /// Of those, arrived unexpected.
    pub unexpected: u64,
    /// Of `messages`, those the echo side received: all of them but in
    /// bibw, where the rest are the pinger's.
    pub echo_side: u64,
    /// The fewest messages a receiving side took in one round (in bibw,
    /// either side): a direction that stalled for a round shows as about a
    /// window's worth.
    pub fewest: u64,
}

impl Protocol {
    /// The counters that moved from `before` to `after`.
    pub fn between(before: &emx::proto::PeerStats, after: &emx::proto::PeerStats) -> Protocol {
        let d = |a: u64, b: u64| b.saturating_sub(a);
        Protocol {
            frames_sent: d(before.frames_sent, after.frames_sent),
            frames_received: d(before.frames_received, after.frames_received),
            retransmits: d(before.retransmits, after.retransmits),
            timeouts: d(before.timeouts, after.timeouts),
            duplicates: d(before.duplicates, after.duplicates),
            acks_sent: d(before.acks_sent, after.acks_sent),
            window_stalls: d(before.window_stalls, after.window_stalls),
            credit_stalls: d(before.credit_stalls, after.credit_stalls),
            msgs_packed: d(before.msgs_packed, after.msgs_packed),
            echo_duplicates: None,
            arrivals: None,
        }
    }

    fn add(&mut self, o: &Protocol) {
        self.frames_sent += o.frames_sent;
        self.frames_received += o.frames_received;
        self.retransmits += o.retransmits;
        self.timeouts += o.timeouts;
        self.duplicates += o.duplicates;
        self.acks_sent += o.acks_sent;
        self.window_stalls += o.window_stalls;
        self.credit_stalls += o.credit_stalls;
        self.msgs_packed += o.msgs_packed;
        self.echo_duplicates = match (self.echo_duplicates, o.echo_duplicates) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        self.arrivals = match (self.arrivals, o.arrivals) {
            (Some(a), Some(b)) => Some(Arrivals {
                messages: a.messages + b.messages,
                unexpected: a.unexpected + b.unexpected,
                echo_side: a.echo_side + b.echo_side,
                fewest: a.fewest.min(b.fewest),
            }),
            (a, b) => a.or(b),
        };
    }
}

/// One line of results.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub test: Test,
    pub transport: Transport,
    /// Message size in bytes.
    pub size: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency: Option<Latency>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow: Option<Flow>,
    /// Against `raw` on the same link, same size, same rounds: median of the
    /// per-round ratios of p50 (latency) or of the rate (streams).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_to_raw: Option<f64>,
    /// Latency only: p99 against raw's p99 (the median of per-round ratios).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_ratio_to_raw: Option<f64>,
    /// emx transports: protocol counters over the rounds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// emx streams: messages in flight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
}

/// How long each measurement ran: its warm-up, its time, and the bound on
/// its round trips or messages (`--iters`).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Paced {
    pub warmup_ms: u64,
    pub time_ms: u64,
    pub iters: Option<u64>,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    pub link: String,
    pub hugepages: bool,
    pub mtu: u16,
    pub cpus: usize,
    /// Where the pinger, the echo and the polling thread ran.
    pub cores: Cores,
    pub rounds: u32,
    /// Each measurement's pace.
    pub pace: Paced,
    /// Where emx streams sent from.
    pub send_buffers: SendBuffers,
    pub rows: Vec<Row>,
    /// Measurements that could not run, and why.
    pub skipped: Vec<Skipped>,
    /// What a reader of these figures should know (a machine too small for
    /// a transport to mean anything, for one).
    pub notes: Vec<String>,
}

/// A point that was not measured: what, why, and in how many rounds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Skipped {
    pub test: Test,
    pub transport: Transport,
    /// Message size in bytes.
    pub size: usize,
    /// Why, in words (the same reason in every round it was skipped).
    pub reason: String,
    /// The rounds it was not measured in: all of them, or the rounds whose
    /// measurement said so.
    pub rounds: u32,
}

impl Skipped {
    /// Its line in the table and in the error of a run that measured nothing;
    /// `of` is the run's rounds.
    pub fn line(&self, of: u32) -> String {
        let mut l = format!(
            "{} {} {} B: {}",
            self.test,
            self.transport.label(),
            self.size,
            self.reason
        );
        if self.rounds < of {
            let _ = write!(l, " (in {} of {of} rounds)", self.rounds);
        }
        l
    }
}

/// One round's measurement.
pub enum Sample {
    Latency(Histogram<u64>),
    Flow(Stream),
}

/// One round's sample: the round's number, the transport and the sample.
type Round = (u32, Transport, Sample);

/// Collects samples by (test, transport, size) and round. A transport's
/// ratio to raw pairs the two by round: a round one of them has no sample
/// for (not measured there) is left out, rather than shifting every later
/// pair onto another round.
#[derive(Default)]
pub struct Collector {
    samples: BTreeMap<(Test, usize, u8), Vec<Round>>,
    protocol: BTreeMap<(Test, usize, u8), Protocol>,
    lost: BTreeMap<(Test, usize, u8), u64>,
}

fn tkey(t: Transport) -> u8 {
    t as u8
}

impl Collector {
    /// Records round `round`'s sample.
    pub fn add(&mut self, test: Test, t: Transport, size: usize, round: u32, s: Sample) {
        self.samples
            .entry((test, size, tkey(t)))
            .or_default()
            .push((round, t, s));
    }

    /// Adds one round's protocol counters.
    pub fn count(&mut self, test: Test, t: Transport, size: usize, p: &Protocol) {
        self.protocol
            .entry((test, size, tkey(t)))
            .and_modify(|a| a.add(p))
            .or_insert(*p);
    }

    /// Adds one round's lost round trips.
    pub fn lost(&mut self, test: Test, t: Transport, size: usize, n: u64) {
        *self.lost.entry((test, size, tkey(t))).or_default() += n;
    }

    /// Aggregates into rows.
    pub fn rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        for (&(test, size, _), samples) in &self.samples {
            let t = samples[0].1;
            let raw = self.samples.get(&(test, size, tkey(Transport::Raw)));
            let mut row = Row {
                test,
                transport: t,
                size,
                latency: None,
                flow: None,
                ratio_to_raw: None,
                p99_ratio_to_raw: None,
                protocol: self.protocol.get(&(test, size, tkey(t))).copied(),
                window: None,
            };
            let hists: Vec<(u32, &Histogram<u64>)> = samples
                .iter()
                .filter_map(|s| match &s.2 {
                    Sample::Latency(h) if !h.is_empty() => Some((s.0, h)),
                    _ => None,
                })
                .collect();
            if !hists.is_empty() {
                let q = |p: f64| -> Vec<f64> {
                    hists
                        .iter()
                        .map(|h| h.1.value_at_quantile(p) as f64)
                        .collect()
                };
                let p50 = q(0.5);
                let p99 = q(0.99);
                let (lo, hi) = min_max(&p50);
                row.latency = Some(Latency {
                    p50_ns: median(&p50),
                    p90_ns: median(&q(0.9)),
                    p99_ns: median(&p99),
                    p999_ns: median(&q(0.999)),
                    max_ns: hists.iter().map(|h| h.1.max()).max().unwrap_or(0) as f64,
                    count: hists.iter().map(|h| h.1.len()).sum(),
                    p50_min_ns: lo,
                    p50_max_ns: hi,
                    rounds_p50_ns: p50.clone(),
                    lost: self.lost.get(&(test, size, tkey(t))).copied().unwrap_or(0),
                });
                if let Some(raw) = raw {
                    // Raw's value at quantile `p` in round `r`.
                    let rq = |r: u32, p: f64| {
                        raw.iter().find_map(|s| match &s.2 {
                            Sample::Latency(h) if s.0 == r && !h.is_empty() => {
                                Some(h.value_at_quantile(p) as f64)
                            }
                            _ => None,
                        })
                    };
                    // Medians of per-round ratios, p50 and p99 alike.
                    let ratio = |mine: &[f64], p: f64| {
                        let ratios: Vec<f64> = mine
                            .iter()
                            .zip(&hists)
                            .filter_map(|(a, h)| rq(h.0, p).map(|b| a / b))
                            .collect();
                        (!ratios.is_empty()).then(|| median(&ratios))
                    };
                    row.ratio_to_raw = ratio(&p50, 0.5);
                    row.p99_ratio_to_raw = ratio(&p99, 0.99);
                }
            }
            let flows: Vec<(u32, &Stream)> = samples
                .iter()
                .filter_map(|s| match &s.2 {
                    Sample::Flow(f) => Some((s.0, f)),
                    _ => None,
                })
                .collect();
            if !flows.is_empty() {
                let rate = |f: &Stream| {
                    if f.secs > 0.0 {
                        f.bytes as f64 * 8.0 / f.secs / 1e9
                    } else {
                        0.0
                    }
                };
                let per: Vec<f64> = flows.iter().map(|f| rate(f.1)).collect();
                let (bytes, msgs, secs) = flows.iter().map(|f| f.1).fold((0, 0, 0.0), |a, f| {
                    (a.0 + f.bytes, a.1 + f.msgs, a.2 + f.secs)
                });
                let (lo, hi) = min_max(&per);
                let (gbit_s, msgs_per_s) = if secs > 0.0 {
                    (bytes as f64 * 8.0 / secs / 1e9, msgs as f64 / secs)
                } else {
                    (0.0, 0.0)
                };
                row.flow = Some(Flow {
                    bytes,
                    msgs,
                    seconds: secs,
                    gbit_s,
                    msgs_per_s,
                    gbit_s_min: lo,
                    gbit_s_max: hi,
                    rounds_gbit_s: per.clone(),
                    lost: self.lost.get(&(test, size, tkey(t))).copied().unwrap_or(0),
                });
                if let Some(raw) = raw {
                    // The figure compared: none for a stream with no span.
                    let by = |f: &Stream| {
                        let v = if test == Test::Msgrate {
                            f.msgs as f64 / f.secs
                        } else {
                            rate(f)
                        };
                        (f.secs > 0.0 && v > 0.0).then_some(v)
                    };
                    // Raw's figure in round `r`.
                    let raw_in = |r: u32| {
                        raw.iter().find_map(|s| match &s.2 {
                            Sample::Flow(f) if s.0 == r => by(f),
                            _ => None,
                        })
                    };
                    let ratios: Vec<f64> = flows
                        .iter()
                        .filter_map(|&(r, f)| Some(by(f)? / raw_in(r)?))
                        .collect();
                    row.ratio_to_raw = (!ratios.is_empty()).then(|| median(&ratios));
                }
            }
            if row.latency.is_some() || row.flow.is_some() {
                rows.push(row);
            }
        }
        rows
    }
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

/// `1.5 KiB`-style sizes.
pub fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{}M", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{}K", s >> 10),
        s => s.to_string(),
    }
}

/// A row's share of its frames sent again at or above which it is listed on
/// its own under the tables: such a row lost enough to move its figures. The
/// rest (a timeout's probe or two, when a receiver was late) are counted
/// together per test and transport.
const RESENT_LISTED: f64 = 0.01;

/// A row as the lists under the tables name it: `bandwidth emx 4K`.
fn row_name(r: &Row) -> String {
    format!("{} {} {}", r.test, r.transport.label(), human(r.size))
}

/// Writes the stream rows whose receiving side took messages that arrived
/// unexpected, a line each.
fn unexpected(o: &mut String, rows: &[Row]) {
    let mut any = false;
    for r in rows {
        let Some(a) = r.protocol.and_then(|p| p.arrivals) else {
            continue;
        };
        if a.unexpected == 0 {
            continue;
        }
        if !any {
            let _ = writeln!(
                o,
                "\nmessages that arrived before their receive (emx, receiving side):"
            );
            any = true;
        }
        let _ = writeln!(
            o,
            "  {}: {} of {} ({:.1}%)",
            row_name(r),
            a.unexpected,
            a.messages,
            100.0 * a.unexpected as f64 / a.messages.max(1) as f64
        );
    }
}

/// Writes the latency rows that lost round trips, and the stream rows that
/// lost messages, a line each.
fn lost(o: &mut String, rows: &[Row]) {
    let streams: Vec<&Row> = rows
        .iter()
        .filter(|r| r.flow.as_ref().is_some_and(|f| f.lost > 0))
        .collect();
    if !streams.is_empty() {
        let _ = writeln!(o, "\nstream messages lost (no protocol sends them again):");
        for r in streams {
            let f = r.flow.as_ref().expect("a flow row");
            let _ = writeln!(o, "  {}: {} lost", row_name(r), f.lost);
        }
        let _ = writeln!(
            o,
            "  (kernel UDP datagrams the receiving socket did not take in time, warm-up \
             included; the figures count what arrived)"
        );
    }
    let lossy: Vec<(&Row, &Latency)> = rows
        .iter()
        .filter_map(|r| r.latency.as_ref().map(|l| (r, l)))
        .filter(|(_, l)| l.lost > 0)
        .collect();
    if lossy.is_empty() {
        return;
    }
    let _ = writeln!(o, "\nround trips lost (no protocol sends them again):");
    for (r, l) in lossy {
        let _ = writeln!(
            o,
            "  {}: {} lost, {} measured",
            row_name(r),
            l.lost,
            l.count
        );
    }
    let _ = writeln!(
        o,
        "  (raw and ffi leave a lost round trip out of their percentiles; kernel UDP sends \
         the datagram again and times the round trip from there, and counts its warm-up's \
         losses too)"
    );
}

/// What became of `resent` frames sent again, of which the receiving side
/// got `twice` twice (`None`: not counted): `; all arrived twice`.
fn arrived_twice(resent: u64, twice: Option<u64>) -> String {
    match twice {
        None => String::new(),
        Some(0) => "; none arrived twice".into(),
        Some(_) if resent == 1 => "; it arrived twice".into(),
        Some(d) if d >= resent => "; all arrived twice".into(),
        Some(d) => format!("; {d} of them arrived twice"),
    }
}

/// Writes where emx sent frames again: rows that resent a notable share on a
/// line each, the others summed up per test and transport, with how many of
/// them the receiving side got twice (not lost: sent again too soon).
fn resent(o: &mut String, rows: &[Row]) {
    let share = |p: &Protocol| p.retransmits as f64 / p.frames_sent.max(1) as f64;
    let line = |o: &mut String, r: &Row, p: &Protocol| {
        let _ = writeln!(
            o,
            "  {}: {} of {} frames ({:.3}%){}",
            row_name(r),
            p.retransmits,
            p.frames_sent,
            100.0 * share(p),
            arrived_twice(p.retransmits, p.echo_duplicates)
        );
    };
    // Per test and transport, in the order of the rows: how many sizes, and
    // the rows that sent frames again.
    type Group<'a> = ((Test, Transport), usize, Vec<(&'a Row, Protocol)>);
    let mut groups: Vec<Group> = Vec::new();
    for r in rows {
        let Some(p) = r.protocol else { continue };
        let key = (r.test, r.transport);
        let g = match groups.iter().position(|(k, _, _)| *k == key) {
            Some(i) => &mut groups[i],
            None => {
                groups.push((key, 0, Vec::new()));
                groups.last_mut().expect("pushed")
            }
        };
        g.1 += 1;
        if p.retransmits > 0 {
            g.2.push((r, p));
        }
    }
    groups.retain(|g| !g.2.is_empty());
    if groups.is_empty() {
        return;
    }
    let _ = writeln!(o, "\nframes sent again (emx, measuring side):");
    let any_twice = groups
        .iter()
        .flat_map(|g| &g.2)
        .any(|(_, p)| p.echo_duplicates.is_some_and(|d| d > 0));
    for ((test, transport), sizes, g) in groups {
        let (listed, few): (Vec<_>, Vec<_>) =
            g.into_iter().partition(|(_, p)| share(p) >= RESENT_LISTED);
        for (r, p) in &listed {
            line(o, r, p);
        }
        match few.as_slice() {
            [] => {}
            [(r, p)] => line(o, r, p),
            _ => {
                let counts = || few.iter().map(|(_, p)| p.retransmits);
                let most = few.iter().map(|(_, p)| share(p)).fold(0.0, f64::max);
                let twice = few
                    .iter()
                    .map(|(_, p)| p.echo_duplicates.map(|d| d.min(p.retransmits)))
                    .sum::<Option<u64>>();
                let _ = writeln!(
                    o,
                    "  {test} {}: {}-{} frames at {} of {} sizes (at most {:.3}% of a size's frames){}",
                    transport.label(),
                    counts().min().expect("two or more"),
                    counts().max().expect("two or more"),
                    few.len(),
                    sizes,
                    100.0 * most,
                    arrived_twice(counts().sum(), twice)
                );
            }
        }
    }
    if any_twice {
        let _ = writeln!(
            o,
            "  (a frame that arrived twice was not lost: it was sent again when its \
             retransmission timeout, `[protocol] rto_min_us` at least, ran out while its \
             receiver was still working through the frames ahead of it or was off its CPU, \
             or its acknowledgement was on the way)"
        );
    }
}

impl Report {
    /// The terminal tables: one per test, a line per size, a column per transport.
    pub fn table(&self, transports: &[Transport]) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "emx-bench: {} ({}, MTU {}, {} CPUs{}), {} round(s) per point, transports alternating",
            self.link,
            if self.hugepages {
                "hugepages"
            } else {
                "no hugepages"
            },
            self.mtu,
            self.cpus,
            self.cores.describe(),
            self.rounds
        );
        for test in [Test::Latency, Test::Bandwidth, Test::Bibw, Test::Msgrate] {
            let rows: Vec<&Row> = self.rows.iter().filter(|r| r.test == test).collect();
            if rows.is_empty() {
                continue;
            }
            let cols: Vec<Transport> = transports
                .iter()
                .copied()
                .filter(|t| rows.iter().any(|r| r.transport == *t))
                .collect();
            let title = match test {
                Test::Latency => "round trip, microseconds: p50 (p99)",
                Test::Bandwidth => "one-way streaming, Gbit/s of payload",
                Test::Bibw => "both directions at once, Gbit/s of payload (sum)",
                _ => "message rate, millions of messages per second",
            };
            // Ratios only where raw ran beside the others.
            let ratio = match test {
                _ if !cols.contains(&Transport::Raw) || cols.len() < 2 => "",
                Test::Latency => ", p50 ratio to raw",
                _ => ", ratio to raw",
            };
            let _ = writeln!(o, "\n{test}: {title}{ratio}");
            if test != Test::Latency && self.send_buffers == SendBuffers::Single {
                let _ = writeln!(
                    o,
                    "(emx sends from one shared buffer: --send-buffers single)"
                );
            }
            let _ = write!(o, "{:>8}", "size");
            for t in &cols {
                let _ = write!(o, " {:>24}", t.label());
            }
            o.push('\n');
            let mut sizes: Vec<usize> = rows.iter().map(|r| r.size).collect();
            sizes.dedup();
            for size in sizes {
                let _ = write!(o, "{:>8}", human(size));
                for t in &cols {
                    let cell = rows
                        .iter()
                        .find(|r| r.size == size && r.transport == *t)
                        .map(|r| cell(r))
                        .unwrap_or_else(|| "-".into());
                    let _ = write!(o, " {cell:>24}");
                }
                o.push('\n');
            }
        }
        // Retransmissions move figures: say where there were any. So do
        // messages that found no receive posted.
        resent(&mut o, &self.rows);
        lost(&mut o, &self.rows);
        unexpected(&mut o, &self.rows);
        if !self.skipped.is_empty() {
            let _ = writeln!(o, "\nnot measured:");
            for s in &self.skipped {
                let _ = writeln!(o, "  {}", s.line(self.rounds));
            }
        }
        for n in &self.notes {
            let _ = writeln!(o, "\nnote: {n}");
        }
        let _ = writeln!(
            o,
            "\n(latency: medians over rounds; bandwidth and rates: totals over rounds; ratios are \
             medians of per-round ratios against raw in the same run)"
        );
        o
    }
}

fn cell(r: &Row) -> String {
    let ratio = match (r.transport, r.ratio_to_raw) {
        (Transport::Raw, _) | (_, None) => String::new(),
        (_, Some(x)) => format!(" {x:.2}x"),
    };
    if let Some(l) = &r.latency {
        return format!("{:.2} ({:.2}){ratio}", l.p50_ns / 1e3, l.p99_ns / 1e3);
    }
    if let Some(f) = &r.flow {
        if r.test == Test::Msgrate {
            return format!("{:.2}{ratio}", f.msgs_per_s / 1e6);
        }
        return format!("{:.2}{ratio}", f.gbit_s);
    }
    "-".into()
}

/// A chart: its test, title, whether the y axis is logarithmic, and the value plotted.
type Chart = (Test, &'static str, bool, fn(&Row) -> Option<f64>);

/// A chart's points: transport, message size, value.
type Points = Vec<(Transport, f64, f64)>;

/// An SVG with a chart for each of latency p50 against size (log-log) and
/// bandwidth against size (log x) that the report has rows for, side by side,
/// one line per transport. A report with neither (msgrate, bibw alone) gets a
/// line saying so.
pub fn svg(report: &Report, transports: &[Transport]) -> String {
    const W: f64 = 560.0;
    const H: f64 = 380.0;
    let colors = [
        "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
    ];
    let charts: [Chart; 2] = [
        (Test::Latency, "round trip p50 (us)", true, |r| {
            r.latency.as_ref().map(|l| l.p50_ns / 1e3)
        }),
        (Test::Bandwidth, "one-way bandwidth (Gbit/s)", false, |r| {
            r.flow.as_ref().map(|f| f.gbit_s)
        }),
    ];
    // Each chart with its points (transport, size, value); those with none
    // are left out, rather than drawn as empty frames.
    let charts: Vec<(&Chart, Points)> = charts
        .iter()
        .map(|c| {
            let (test, _, _, value) = c;
            let pts = report
                .rows
                .iter()
                // A log axis has no 0: the 0-byte row is in the table and
                // the JSON only (drawn at 1, it read as the 1-byte point).
                .filter(|r| r.test == *test && r.size > 0)
                .filter_map(|r| value(r).map(|v| (r.transport, r.size as f64, v)))
                .filter(|p| p.2 > 0.0 && p.2.is_finite())
                .collect();
            (c, pts)
        })
        .filter(|(_, pts): &(_, Points)| !pts.is_empty())
        .collect();
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="12">"#,
        charts.len().max(1) as f64 * W,
        H + 40.0
    );
    let _ = writeln!(
        o,
        r#"<text x="10" y="20" font-size="14">emx-bench: {} (MTU {})</text>"#,
        xml(&report.link),
        report.mtu
    );
    if charts.is_empty() {
        let _ = writeln!(
            o,
            r#"<text x="10" y="60">no latency or bandwidth rows to plot (run --test latency or bandwidth)</text>"#
        );
    }
    for (k, ((_, label, log_y, _), pts)) in charts.iter().enumerate() {
        let x0 = k as f64 * W + 60.0;
        let (pw, ph, y0) = (W - 90.0, H - 70.0, 40.0);
        let _ = writeln!(
            o,
            r##"<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
        );
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}" text-anchor="middle">{label}</text>"#,
            x0 + pw / 2.0,
            y0 - 6.0
        );
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}" text-anchor="middle">message size (bytes)</text>"#,
            x0 + pw / 2.0,
            y0 + ph + 34.0
        );
        let lx = |x: f64| x.log2();
        let (xmin, xmax) = pts.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |a, p| {
            (a.0.min(lx(p.1)), a.1.max(lx(p.1)))
        });
        let ty = |v: f64| if *log_y { v.log10() } else { v };
        let (mut ymin, ymax) = pts.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |a, p| {
            (a.0.min(ty(p.2)), a.1.max(ty(p.2)))
        });
        if !*log_y {
            ymin = 0.0;
        }
        let (xspan, yspan) = ((xmax - xmin).max(1.0), (ymax - ymin).max(1e-9));
        let px = |x: f64| x0 + (lx(x) - xmin) / xspan * pw;
        let py = |v: f64| y0 + ph - (ty(v) - ymin) / yspan * ph;
        // Axis ticks: sizes at every other power of four, values at 5 levels.
        let mut e = xmin.ceil() as i32;
        while f64::from(e) <= xmax {
            let x = x0 + (f64::from(e) - xmin) / xspan * pw;
            let _ = writeln!(
                o,
                r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
                y0,
                y0 + ph,
                y0 + ph + 16.0,
                human(1usize << e)
            );
            e += 4;
        }
        for i in 0..=4 {
            let t = ymin + yspan * f64::from(i) / 4.0;
            let v = if *log_y { 10f64.powf(t) } else { t };
            let y = y0 + ph - f64::from(i) / 4.0 * ph;
            let _ = writeln!(
                o,
                r##"<line x1="{x0}" y1="{y}" x2="{}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
                x0 + pw,
                x0 - 4.0,
                y + 4.0,
                short(v)
            );
        }
        for (i, t) in transports.iter().enumerate() {
            let mut line: Vec<(f64, f64)> = pts
                .iter()
                .filter(|p| p.0 == *t)
                .map(|p| (px(p.1), py(p.2)))
                .collect();
            if line.is_empty() {
                continue;
            }
            line.sort_by(|a, b| a.0.total_cmp(&b.0));
            let c = colors[i % colors.len()];
            let path: Vec<String> = line.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            let _ = writeln!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"/>"#,
                path.join(" ")
            );
            // A mark at each point: a line of one size alone draws nothing.
            for (x, y) in &line {
                let _ = writeln!(o, r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{c}"/>"#);
            }
            let ly = y0 + 14.0 + 16.0 * i as f64;
            let _ = writeln!(
                o,
                r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{c}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
                x0 + 8.0,
                ly - 4.0,
                x0 + 28.0,
                ly - 4.0,
                x0 + 32.0,
                ly,
                t.label()
            );
        }
    }
    o.push_str("</svg>\n");
    o
}

fn short(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(test: Test, transport: Transport, size: usize, resent: u64, sent: u64) -> Row {
        Row {
            test,
            transport,
            size,
            latency: None,
            flow: None,
            ratio_to_raw: None,
            p99_ratio_to_raw: None,
            protocol: Some(Protocol {
                frames_sent: sent,
                retransmits: resent,
                ..Protocol::default()
            }),
            window: None,
        }
    }

    /// A probe or two per row is summed up per test and transport; a row
    /// that resent a notable share of its frames gets a line of its own.
    #[test]
    fn frames_sent_again_are_summed_up_unless_notable() {
        use Test::*;
        use Transport::*;
        let mut o = String::new();
        resent(
            &mut o,
            &[
                row(Latency, Emx, 8, 1, 90_000),
                row(Latency, Emx, 16, 0, 90_000),
                row(Latency, Emx, 32, 5, 80_000),
                row(Latency, EmxThread, 8, 2, 1_300),
                row(Bandwidth, Emx, 1 << 20, 812, 20_000),
                row(Bandwidth, Emx, 8 << 20, 3, 300_000),
            ],
        );
        assert_eq!(
            o,
            "\nframes sent again (emx, measuring side):\n\
             \x20 latency emx: 1-5 frames at 2 of 3 sizes (at most 0.006% of a size's frames)\n\
             \x20 latency emx-thread 8: 2 of 1300 frames (0.154%)\n\
             \x20 bandwidth emx 1M: 812 of 20000 frames (4.060%)\n\
             \x20 bandwidth emx 8M: 3 of 300000 frames (0.001%)\n"
        );
        let mut o = String::new();
        resent(&mut o, &[row(Latency, Emx, 8, 0, 90_000)]);
        assert_eq!(o, "", "nothing sent again, nothing said");
    }

    /// Where the echo counted the frames it got twice, each line says how
    /// many of those sent again were not lost, and a note says what that means.
    #[test]
    fn frames_sent_again_say_how_many_arrived_twice() {
        use Test::*;
        use Transport::*;
        let twice = |mut r: Row, d| {
            r.protocol.as_mut().expect("a protocol").echo_duplicates = Some(d);
            r
        };
        let mut o = String::new();
        resent(
            &mut o,
            &[
                twice(row(Latency, Emx, 8, 1, 90_000), 1),
                twice(row(Latency, Emx, 32, 5, 80_000), 5),
                twice(row(Latency, EmxThread, 8, 3, 90_000), 2),
                twice(row(Latency, EmxThread, 16, 4, 90_000), 2),
                twice(row(Bandwidth, Emx, 1 << 20, 812, 20_000), 0),
                row(Bandwidth, Emx, 8 << 20, 3, 300_000),
            ],
        );
        assert_eq!(
            o,
            "\nframes sent again (emx, measuring side):\n\
             \x20 latency emx: 1-5 frames at 2 of 2 sizes (at most 0.006% of a size's frames); all arrived twice\n\
             \x20 latency emx-thread: 3-4 frames at 2 of 2 sizes (at most 0.004% of a size's frames); 4 of them arrived twice\n\
             \x20 bandwidth emx 1M: 812 of 20000 frames (4.060%); none arrived twice\n\
             \x20 bandwidth emx 8M: 3 of 300000 frames (0.001%)\n\
             \x20 (a frame that arrived twice was not lost: it was sent again when its \
             retransmission timeout, `[protocol] rto_min_us` at least, ran out while its \
             receiver was still working through the frames ahead of it or was off its CPU, \
             or its acknowledgement was on the way)\n"
        );
        // Summed over rounds, a round not counted leaves the row not counted.
        let mut c = Collector::default();
        let p = |d| Protocol {
            retransmits: 1,
            echo_duplicates: d,
            ..Protocol::default()
        };
        c.count(Latency, Emx, 8, &p(Some(1)));
        c.count(Latency, Emx, 8, &p(Some(1)));
        c.count(Latency, Emx, 16, &p(Some(1)));
        c.count(Latency, Emx, 16, &p(None));
        let sum = |size| c.protocol[&(Latency, size, tkey(Emx))];
        assert_eq!((sum(8).retransmits, sum(8).echo_duplicates), (2, Some(2)));
        assert_eq!(sum(16).echo_duplicates, None);
    }

    /// Latency rows that lost round trips are listed under the tables with
    /// what became of them; the others are not. The count sums the rounds.
    #[test]
    fn lost_round_trips_are_listed_under_the_tables() {
        use Test::*;
        use Transport::*;
        let mut c = Collector::default();
        for (t, size, lost) in [(Raw, 8, 0), (Raw, 64 << 10, 2), (Udp, 8, 1), (Emx, 8, 0)] {
            for round in 0..2 {
                let mut h = Histogram::<u64>::new(3).unwrap();
                h.record(1000).unwrap();
                h.record(2000).unwrap();
                c.add(Latency, t, size, round, Sample::Latency(h));
                c.lost(Latency, t, size, lost);
            }
        }
        let rows = c.rows();
        let lost_of = |t, size| {
            let r = rows.iter().find(|r| r.transport == t && r.size == size);
            r.and_then(|r| r.latency.as_ref())
                .map(|l| (l.lost, l.count))
        };
        assert_eq!(lost_of(Raw, 64 << 10), Some((4, 4)));
        assert_eq!(lost_of(Raw, 8), Some((0, 4)));
        let mut o = String::new();
        lost(&mut o, &rows);
        assert_eq!(
            o,
            "\nround trips lost (no protocol sends them again):\n\
             \x20 latency udp 8: 2 lost, 4 measured\n\
             \x20 latency raw 64K: 4 lost, 4 measured\n\
             \x20 (raw and ffi leave a lost round trip out of their percentiles; kernel UDP \
             sends the datagram again and times the round trip from there, and counts its \
             warm-up's losses too)\n"
        );
        let mut none = String::new();
        lost(&mut none, &rows[..0]);
        assert!(none.is_empty());
    }

    /// A transport's ratio to raw pairs the two by round: a round raw was
    /// not measured in is left out (it shifted every later pair onto the
    /// next round), and so is a stream with no span (its ratio read 1e12).
    #[test]
    fn ratios_pair_rounds_by_number() {
        use Test::*;
        use Transport::*;
        let mut c = Collector::default();
        let flow = |gbit: f64| {
            Sample::Flow(Stream {
                bytes: (gbit * 1e9 / 8.0 * 0.01) as u64,
                msgs: 10,
                secs: 0.01,
            })
        };
        let hist = |ns: u64| {
            let mut h = Histogram::<u64>::new(3).unwrap();
            h.record(ns).unwrap();
            Sample::Latency(h)
        };
        // Raw measured in rounds 1 and 2 only; emx in all three.
        for (round, raw, emx) in [(1, 10.0, 5.0), (2, 20.0, 8.0)] {
            c.add(Bandwidth, Raw, 1 << 20, round, flow(raw));
            c.add(Bandwidth, Emx, 1 << 20, round, flow(emx));
            c.add(Latency, Raw, 8, round, hist(1000 * u64::from(round)));
        }
        c.add(Bandwidth, Emx, 1 << 20, 0, flow(1.0));
        for (round, ns) in [(0, 900), (1, 1500), (2, 2600)] {
            c.add(Latency, Emx, 8, round, hist(ns));
        }
        // A message rate with no span: no ratio rather than a huge one.
        c.add(Msgrate, Raw, 8, 0, flow(1.0));
        c.add(
            Msgrate,
            Emx,
            8,
            0,
            Sample::Flow(Stream {
                bytes: 80,
                msgs: 10,
                secs: 0.0,
            }),
        );
        let rows = c.rows();
        let ratio = |test, size| {
            rows.iter()
                .find(|r| r.test == test && r.transport == Emx && r.size == size)
                .unwrap()
                .ratio_to_raw
        };
        // Rounds 1 and 2: 5/10 and 8/20, median 0.45 (by position: 1/10,
        // 5/20).
        let bw = ratio(Bandwidth, 1 << 20).unwrap();
        assert!((bw - 0.45).abs() < 1e-3, "{bw}");
        // 1500/1000 and 2600/2000, median 1.4.
        let lat = ratio(Latency, 8).unwrap();
        assert!((lat - 1.4).abs() < 1e-2, "{lat}");
        assert_eq!(ratio(Msgrate, 8), None);
    }

    /// Streams that lost messages (kernel UDP) say so in the JSON and under
    /// the tables; the others do not.
    #[test]
    fn lost_stream_messages_are_listed_under_the_tables() {
        use Test::*;
        use Transport::*;
        let mut c = Collector::default();
        for (t, lost) in [(Raw, 0), (Udp, 7), (Tcp, 0)] {
            for round in 0..2 {
                let f = Stream {
                    bytes: 64_000,
                    msgs: 1000,
                    secs: 0.001,
                };
                c.add(Bandwidth, t, 64, round, Sample::Flow(f));
                c.lost(Bandwidth, t, 64, lost);
            }
        }
        let rows = c.rows();
        let lost_of = |t| {
            let r = rows.iter().find(|r| r.transport == t).unwrap();
            r.flow.as_ref().unwrap().lost
        };
        assert_eq!((lost_of(Raw), lost_of(Udp), lost_of(Tcp)), (0, 14, 0));
        let mut o = String::new();
        lost(&mut o, &rows);
        assert!(
            o.starts_with(
                "\nstream messages lost (no protocol sends them again):\n\
                 \x20 bandwidth udp 64: 14 lost\n"
            ),
            "{o}"
        );
        assert_eq!(o.lines().count(), 4, "{o}");
    }

    /// The plot draws a chart for each of latency and bandwidth the report
    /// has rows for, and says so when it has neither: a latency run used to
    /// get an empty bandwidth frame beside its chart.
    #[test]
    fn the_plot_draws_the_charts_it_has_rows_for() {
        use Test::*;
        use Transport::*;
        let lat = |t, size, p50_ns| Row {
            latency: Some(super::Latency {
                p50_ns,
                p90_ns: p50_ns,
                p99_ns: p50_ns,
                p999_ns: p50_ns,
                max_ns: p50_ns,
                count: 1,
                p50_min_ns: p50_ns,
                p50_max_ns: p50_ns,
                rounds_p50_ns: vec![p50_ns],
                lost: 0,
            }),
            ..row(Latency, t, size, 0, 1)
        };
        let report = |rows| Report {
            link: "memif pair".into(),
            hugepages: false,
            mtu: 9000,
            cpus: 2,
            cores: Cores::default_for(&[0, 1], &|_| None),
            rounds: 1,
            pace: Paced {
                warmup_ms: 0,
                time_ms: 1,
                iters: None,
            },
            send_buffers: SendBuffers::Multiple,
            rows,
            skipped: vec![],
            notes: vec![],
        };
        let chart = svg(
            &report(vec![
                lat(Raw, 8, 500.0),
                lat(Emx, 8, 900.0),
                lat(Emx, 64, 950.0),
            ]),
            &[Raw, Emx],
        );
        assert!(chart.contains(r#"width="560""#), "one chart wide: {chart}");
        assert!(chart.contains("round trip p50"));
        assert!(!chart.contains("bandwidth"), "no empty bandwidth chart");
        assert_eq!(
            chart.matches("<polyline").count(),
            2,
            "a line per transport"
        );
        // The 0-byte row is left off the log axis; it used to be drawn at 1,
        // where it read as the 1-byte point.
        let chart = svg(
            &report(vec![
                lat(Emx, 0, 800.0),
                lat(Emx, 1, 850.0),
                lat(Emx, 2, 860.0),
            ]),
            &[Emx],
        );
        let points = chart
            .split(r#"<polyline points=""#)
            .nth(1)
            .and_then(|p| p.split('"').next())
            .expect("a line");
        assert_eq!(points.split_whitespace().count(), 2, "{points}");
        assert_eq!(chart.matches("<circle").count(), 2, "a mark at each point");
        let chart = svg(&report(vec![row(Msgrate, Emx, 8, 0, 1)]), &[Emx]);
        assert!(chart.contains("no latency or bandwidth rows to plot"));
        assert!(!chart.contains("<polyline") && !chart.contains("<rect"));
        // The table's titles promise ratios only where raw ran beside.
        let both = report(vec![lat(Raw, 8, 500.0), lat(Emx, 8, 900.0)]).table(&[Raw, Emx]);
        assert!(both.contains("p50 (p99), p50 ratio to raw\n"), "{both}");
        let alone = report(vec![lat(Emx, 8, 900.0)]).table(&[Emx]);
        assert!(alone.contains("p50 (p99)\n"), "{alone}");
        assert!(!alone.contains("ratio to raw"), "{alone}");
    }

    /// Stream rows whose messages arrived unexpected get a line each; rows
    /// with none, or not counted (latency; bibw with a polling thread), get
    /// nothing.
    #[test]
    fn unexpected_arrivals_are_listed() {
        use Test::*;
        use Transport::*;
        let with = |test, t, size, messages, unexpected| {
            let mut r = row(test, t, size, 0, 1);
            r.protocol.as_mut().unwrap().arrivals = Some(Arrivals {
                messages,
                unexpected,
                echo_side: messages,
                fewest: messages,
            });
            r
        };
        let mut o = String::new();
        unexpected(
            &mut o,
            &[
                row(Latency, Emx, 8, 0, 90_000),
                with(Bandwidth, Emx, 4 << 10, 200_000, 0),
                with(Bandwidth, Emx, 16 << 10, 100_000, 18_000),
                with(Msgrate, Emx, 8, 1_000_000, 3),
                row(Msgrate, EmxThread, 8, 0, 1),
            ],
        );
        assert_eq!(
            o,
            "\nmessages that arrived before their receive (emx, receiving side):\n\
             \x20 bandwidth emx 16K: 18000 of 100000 (18.0%)\n\
             \x20 msgrate emx 8: 3 of 1000000 (0.0%)\n"
        );
        let mut o = String::new();
        unexpected(&mut o, &[with(Bandwidth, Emx, 4 << 10, 200_000, 0)]);
        assert_eq!(o, "", "none unexpected, nothing said");
    }
}
