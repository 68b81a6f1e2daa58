//! The driver: protocol cores (one per local endpoint) joined to one packet
//! I/O link. One call of [`Driver::progress`] sends what the application
//! queued since the last call, receives a burst and feeds each frame to the
//! core it is for, runs due timers, then builds the cores' outgoing frames
//! in place and sends them as a burst. Whoever owns the driver (a polling
//! thread, or an application thread in inline mode) calls it; nothing else
//! touches the cores or the link.

use std::time::Instant;

use crate::io::{Frame, IoStats, Lent, PacketIo};
use crate::proto::{Completion, Core, Now, RequestId, Time};
use crate::wire::FRAME_HEADER_LEN;

use super::buffer::{RecvBuf, SendBuf};

/// Frames received or sent per burst.
pub const BURST: usize = 32;
/// Frames the driver keeps queued for a link that is full before it stops
/// asking the core for more.
const TX_BACKLOG: usize = 4 * BURST;

/// The core as the runtime instantiates it.
pub type RuntimeCore = Core<SendBuf, RecvBuf>;

/// A monotonic clock in the core's [`Time`], read once per poll.
///
/// It counts time-stamp-counter ticks, as DPDK programs do: reading the TSC
/// costs a few nanoseconds, `clock_gettime` several times that, and in an
/// inline loop the clock is read on every poll (it was the largest single
/// cost of an emx round trip in the profile). Ticks are converted with a
/// rate measured once per process against the system clock. Where the CPU
/// has no invariant TSC, it falls back to the system clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
    origin_tsc: u64,
    /// Nanoseconds per tick in 32.32 fixed point; 0: use `origin`.
    ns_per_tick: u64,
}

/// Nanoseconds per TSC tick (32.32 fixed point), or 0 without an invariant TSC.
fn tsc_rate() -> u64 {
    static RATE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *RATE.get_or_init(|| {
        let invariant = std::fs::read_to_string("/proc/cpuinfo")
            .map(|c| c.contains(" constant_tsc") && c.contains(" nonstop_tsc"))
            .unwrap_or(false);
        if !invariant {
            return 0;
        }
        let (t0, c0) = clock_and_tsc();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (t1, c1) = clock_and_tsc();
        let (ns, ticks) = ((t1 - t0).as_nanos() as u64, c1.wrapping_sub(c0));
        if ticks == 0 {
            return 0;
        }
        ((u128::from(ns) << 32) / u128::from(ticks)) as u64
    })
}

/// The system clock and the TSC read at one moment: the TSC read between
/// two clock reads, paired with their midpoint, from the tightest of a few
/// tries. (A thread preempted between two unbracketed reads skewed the rate
/// by the time it lost over the 5 ms measured: 1 ms made every timer of the
/// process 20% off.)
fn clock_and_tsc() -> (Instant, u64) {
    let mut best = (std::time::Duration::MAX, Instant::now(), 0);
    for _ in 0..100 {
        let a = Instant::now();
        let c = dpdk_ffi::rdtsc();
        let width = a.elapsed();
        if width < best.0 {
            best = (width, a + width / 2, c);
        }
        if width < std::time::Duration::from_micros(1) {
            break;
        }
    }
    (best.1, best.2)
}

impl Clock {
    /// A clock whose origin is now.
    pub fn new() -> Clock {
        Clock {
            origin: Instant::now(),
            origin_tsc: dpdk_ffi::rdtsc(),
            ns_per_tick: tsc_rate(),
        }
    }

    /// Now.
    #[inline]
    pub fn now(&self) -> Time {
        if self.ns_per_tick == 0 {
            return Time::from_nanos(self.origin.elapsed().as_nanos() as u64);
        }
        // A CPU whose counter lags the one that made the clock (VMs give
        // vCPUs offsets) may read just behind the origin: that is the
        // origin, not 2^64 ticks on (every timer due at once, and those set
        // then due in decades).
        let ticks = dpdk_ffi::rdtsc().saturating_sub(self.origin_tsc);
        Time::from_nanos(((u128::from(ticks) * u128::from(self.ns_per_tick)) >> 32) as u64)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// The time of one request, read from a [`Clock`] only if the core asks for
/// it (see [`Now`]): most sends and receives need none.
pub struct LazyNow<'a> {
    clock: &'a Clock,
    at: Option<Time>,
}

impl<'a> LazyNow<'a> {
    /// A time not read yet.
    pub fn new(clock: &'a Clock) -> LazyNow<'a> {
        LazyNow { clock, at: None }
    }
}

impl Now for LazyNow<'_> {
    #[inline]
    fn now(&mut self) -> Time {
        *self.at.get_or_insert_with(|| self.clock.now())
    }
}

/// What one [`Driver::progress`] call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Frames received and handed to the core.
    pub received: usize,
    /// Frames handed to the link.
    pub sent: usize,
    /// Completions produced.
    pub completed: usize,
}

impl Progress {
    /// True when nothing happened (the caller may back off).
    pub fn idle(&self) -> bool {
        self.received == 0 && self.sent == 0 && self.completed == 0
    }
}

/// Protocol cores (one per endpoint) and the one link they share.
///
/// Received frames go to the core of their destination endpoint, found with
/// [`peek_dst`](crate::wire::peek_dst) (a few loads; the core still validates the whole frame);
/// frames for no local endpoint go to the first core, which counts and drops
/// them. Cores take turns building frames: each transmit round starts with
/// the next one.
pub struct Driver<L: PacketIo> {
    cores: Vec<RuntimeCore>,
    /// Endpoint id -> index in `cores` (`NO_CORE` where none).
    route: [u8; 256],
    ethertype: u16,
    rx: Vec<L::Frame>,
    tx: Vec<L::Frame>,
    /// A frame ready to build in (allocated, `room` bytes put): one the cores
    /// had nothing for, or one an idle poll prepared, so that the next
    /// message's way out skips the allocation.
    spare: Option<L::Frame>,
    /// For frames that arrive in several segments (jumbo frames on small mbufs).
    linear: Vec<u8>,
    /// Frames lent to receives in this round, until their completions leave.
    lent: Vec<(usize, RequestId, Lent)>,
    /// The last round's frames, handled and kept until the next round gives
    /// them back (at most a burst).
    spent: Vec<L::Frame>,
    /// Frames that could not be built (no buffer, payload refused).
    build_failures: u64,
    /// Transmit rounds that found no buffer (`IoStats::tx_no_buffer`).
    no_buffer: u64,
    /// Payload bytes the cores copied into frames (the link counts the rest).
    copied: u64,
    /// Bytes a frame is built in: headers plus one frame's payload, so that the
    /// cores can pack small messages in place.
    room: usize,
    /// A registered buffer went back while frames waiting in `tx` may refer
    /// to it: the link is asked to let go of sent frames again once `tx`
    /// has left (the one reclaim at the hand-back could not reach them).
    reclaim_owed: bool,
    /// The core that builds first in the next transmit round: they take
    /// turns, so that one with a full window cannot keep a full link (and
    /// the backlog) to itself round after round.
    first: usize,
    /// The link, last: fields drop in order, and the frames above must go
    /// back to its pool before it (and perhaps the pool) goes.
    io: L,
}

const NO_CORE: u8 = u8::MAX;

impl<L: PacketIo> Driver<L> {
    /// Joins `core` to `io`.
    pub fn new(core: RuntimeCore, io: L) -> Driver<L> {
        Self::with_cores(vec![core], io)
    }

    /// Joins several cores (one per local endpoint, each with its own
    /// endpoint id and at most 254 of them) to one link.
    ///
    /// # Panics
    /// When `cores` is empty, holds more than 254 cores, or two cores share an
    /// endpoint id: a configuration the engine refuses before it gets here.
    pub fn with_cores(mut cores: Vec<RuntimeCore>, io: L) -> Driver<L> {
        assert!(
            !cores.is_empty() && cores.len() < usize::from(NO_CORE),
            "1 to 254 cores"
        );
        let mut route = [NO_CORE; 256];
        for (i, c) in cores.iter().enumerate() {
            let slot = &mut route[usize::from(c.local().endpoint)];
            assert_eq!(
                *slot,
                NO_CORE,
                "two cores with endpoint {}",
                c.local().endpoint
            );
            *slot = i as u8;
        }
        // Payloads the link would copy anyway, the cores copy while they
        // write the header: no second pass over the frame, no buffer lookup.
        for c in &mut cores {
            c.set_copy_below(io.copy_below());
        }
        let ethertype = cores[0].config().ethertype;
        let payload = cores.iter().map(|c| c.config().frame_payload()).max();
        let room = (FRAME_HEADER_LEN + payload.unwrap_or(0))
            .min(io.max_frame())
            .max(FRAME_HEADER_LEN);
        let linear = io.max_frame();
        Driver {
            room,
            cores,
            route,
            ethertype,
            io,
            rx: Vec::with_capacity(BURST),
            tx: Vec::with_capacity(TX_BACKLOG + BURST),
            spare: None,
            // A chained frame is copied here: its room is taken now, not in
            // the poll loop when the first one arrives.
            linear: Vec::with_capacity(linear),
            lent: Vec::with_capacity(BURST),
            spent: Vec::with_capacity(BURST),
            build_failures: 0,
            no_buffer: 0,
            copied: 0,
            reclaim_owed: false,
            first: 0,
        }
    }

    /// The first core, to submit requests and read statistics.
    pub fn core(&mut self) -> &mut RuntimeCore {
        &mut self.cores[0]
    }

    /// The first core, read-only.
    pub fn core_ref(&self) -> &RuntimeCore {
        &self.cores[0]
    }

    /// Core `i` (in the order given to [`Driver::with_cores`]).
    pub fn core_at(&mut self, i: usize) -> Option<&mut RuntimeCore> {
        self.cores.get_mut(i)
    }

    /// How many cores (local endpoints) the driver holds.
    pub fn cores(&self) -> usize {
        self.cores.len()
    }

    /// The link.
    pub fn io(&self) -> &L {
        &self.io
    }

    /// The link's counters.
    pub fn io_stats(&self) -> IoStats {
        let mut s = self.io.stats();
        s.payload_copied += self.copied;
        s.tx_no_buffer += self.no_buffer;
        s
    }

    /// Frames that could not be built: no room for a header in a new
    /// buffer (nothing was taken from the core then), or no segment to
    /// attach a payload with (a frame taken from the core and dropped,
    /// which it retransmits). (Frames that wait for want of a buffer to start
    /// them are not lost: [`IoStats::tx_no_buffer`] counts those rounds.)
    pub fn build_failures(&self) -> u64 {
        self.build_failures
    }

    /// Frames queued for a full link.
    pub fn tx_backlog(&self) -> usize {
        self.tx.len()
    }

    /// Hands the link what the cores have ready at `now`, without polling
    /// it or running timers; returns how many frames it took. An inline
    /// runtime calls it for a send that goes alone, or that fills a frame of
    /// a one-way stream (see
    /// [`Core::send_leaves_now`](crate::proto::Core::send_leaves_now)), so
    /// that the message leaves in the call that started it.
    pub fn flush(&mut self, now: Time) -> usize {
        self.transmit(now)
    }

    /// One round of work at time `now`; completions go to `on_completion`.
    #[inline]
    pub fn progress(
        &mut self,
        now: Time,
        mut on_completion: impl FnMut(Completion<SendBuf, RecvBuf>),
    ) -> Progress {
        self.progress_all(now, |_, c| on_completion(c))
    }

    /// One round of work at time `now`; completions go to `on_completion`
    /// with the index of the core (endpoint) they belong to.
    #[inline]
    pub fn progress_all(
        &mut self,
        now: Time,
        mut on_completion: impl FnMut(usize, Completion<SendBuf, RecvBuf>),
    ) -> Progress {
        // Out first: what the application queued since the last call (an
        // inline isend) leaves before the link is polled, not after an empty
        // receive and the timers: one poll less on every message's way out.
        // Only when a core has something: a backlog left by a full link
        // alone waits for the pass below.
        let mut p = Progress::default();
        if self.cores.iter().any(|c| c.may_transmit()) {
            p.sent = self.transmit(now);
        }

        // Timers are checked before the burst, not between it and its
        // completions: a message received waits for no timer check on its way
        // to the application, and the check runs while the frame just sent
        // is on the wire. A timer that is due is handled after the burst: the
        // acks that came in while this thread was not running (descheduled,
        // or busy in the application) count before the retransmission timer
        // declares their frames lost and sends them again.
        let due = self
            .cores
            .iter()
            .any(|c| c.poll_timeout().is_some_and(|t| t <= now));

        // The previous call's frames go back to the link now, a burst at
        // once. Freed one by one as they were handled, they held up that
        // call's completions on their way to the application, and so its
        // answer: now the answer leaves first, and the frees come after.
        if !self.spent.is_empty() {
            self.io.release(&mut self.spent);
        }

        // In: a burst from the link into the cores. Bad frames are counted by
        // a core and dropped; there is nothing more to do about them here.
        p.received = self.io.recv(&mut self.rx, BURST);
        for f in self.rx.drain(..) {
            let Some(bytes) = f.contiguous() else {
                // Several segments: the core reads a copy, and nothing is lent.
                f.copy_to(&mut self.linear);
                let i = route(&self.route, &self.linear, self.ethertype);
                let _ = self.cores[i].handle_frame(now, &self.linear);
                self.spent.push(f);
                continue;
            };
            let i = route(&self.route, bytes, self.ethertype);
            if let Ok(Some(lend)) = self.cores[i].handle_frame_lending(now, bytes) {
                // A lending receive took the message: it leaves in the frame.
                self.lent
                    .push((i, lend.req, f.into_lent(lend.offset, lend.len)));
            } else {
                self.spent.push(f);
            }
        }

        if p.received != 0 {
            // One fence for the burst's streaming stores, not one per frame.
            for core in &mut self.cores {
                core.fence_streaming();
            }
        }

        if due {
            for core in &mut self.cores {
                if core.poll_timeout().is_some_and(|t| t <= now) {
                    core.handle_timeout(now);
                }
            }
        }

        // Out: what the burst and the timers made due. On an idle poll
        // (nothing in, no timer) that is nothing: only a backlog left by a
        // full link is tried again.
        if p.received != 0 || due || !self.tx.is_empty() {
            p.sent += self.transmit(now);
        } else if p.sent == 0 && self.spare.is_none() {
            // Idle: get the next frame ready while nothing waits for it.
            self.spare = self.ready_frame().ok();
        }

        let mut reclaimed = false;
        for (i, core) in self.cores.iter_mut().enumerate() {
            while let Some(mut c) = core.poll_completion() {
                p.completed += 1;
                if !self.lent.is_empty() {
                    give_lent(&mut self.lent, i, &mut c);
                }
                if held_by_frames(&c) {
                    // A NIC still holding the sent frames would keep the
                    // buffer unwritable until later bursts needed their
                    // ring slots: none may come. Frames still in the
                    // backlog (a retransmission that a full link held back)
                    // are reached by a reclaim once they left.
                    if !reclaimed {
                        self.io.reclaim();
                        reclaimed = true;
                    }
                    self.reclaim_owed |= !self.tx.is_empty();
                }
                on_completion(i, c);
            }
        }
        debug_assert!(self.lent.is_empty(), "a lent frame without its completion");
        p
    }

    /// Builds the cores' outgoing frames in place and hands them to the link;
    /// returns how many it took.
    #[inline]
    fn transmit(&mut self, now: Time) -> usize {
        // Build frames in place, core by core (starting from each in turn),
        // until none has more or the backlog for a full link is reached.
        let n = self.cores.len();
        if n == 1 {
            self.build(0, now);
        } else {
            let first = self.first;
            self.first = if first + 1 == n { 0 } else { first + 1 };
            let go_on = (first..n).all(|i| self.build(i, now));
            if go_on {
                let _ = (0..first).all(|i| self.build(i, now));
            }
        }
        if self.tx.is_empty() {
            return 0;
        }
        let sent = self.io.send(&mut self.tx);
        if self.reclaim_owed && self.tx.is_empty() {
            // The backlog has left (only here does it): what it held of a
            // buffer already handed back can be let go of now.
            self.io.reclaim();
            self.reclaim_owed = false;
        }
        sent
    }

    /// Builds core `i`'s frames into the backlog until it has no more or
    /// the backlog is full; false when the round should end (no buffer, a
    /// frame that could not be built).
    #[inline(always)]
    fn build(&mut self, i: usize, now: Time) -> bool {
        // Preparing a frame costs an allocation and a header's room:
        // skip it on the (common) idle poll.
        while self.tx.len() < TX_BACKLOG && self.cores[i].may_transmit() {
            let mut f = match self.spare.take() {
                Some(f) => f,
                None => match self.ready_frame() {
                    Ok(f) => f,
                    Err(NotReady::NoBuffer) => {
                        self.no_buffer += 1;
                        return false;
                    }
                    Err(NotReady::NoRoom) => {
                        self.build_failures += 1;
                        return false;
                    }
                },
            };
            // (a ready frame holds just what was put)
            let Some(hdr) = f.bytes_mut() else {
                self.build_failures += 1;
                return false;
            };
            let core = &mut self.cores[i];
            let Some(t) = core.poll_transmit(now, hdr) else {
                // Kept as it is, ready for the next frame.
                self.spare = Some(f);
                return true;
            };
            self.io.truncate(&mut f, t.header_len);
            self.copied += t.copied as u64;
            if let Some(pr) = t.payload {
                let buf = core
                    .send_buffer(pr.req)
                    .expect("the core keeps a send's buffer while frames refer to it");
                if self
                    .io
                    .attach(&mut f, buf.payload(pr.offset as usize, pr.len as usize))
                    .is_err()
                {
                    // Treated as lost on the wire: the core retransmits it.
                    // No more this round: the next would most likely fail
                    // the same way (the link is out of buffers), and each
                    // frame taken from the core and dropped waits out a
                    // retransmission timeout.
                    self.build_failures += 1;
                    return false;
                }
            }
            self.tx.push(f);
        }
        true
    }
}

/// Why no frame could be made ready.
enum NotReady {
    /// The link has no buffer free.
    NoBuffer,
    /// A buffer does not hold even a header.
    NoRoom,
}

impl<L: PacketIo> Driver<L> {
    /// A new frame with `room` bytes put, to build a frame in.
    fn ready_frame(&mut self) -> Result<L::Frame, NotReady> {
        let mut f = self.io.alloc().map_err(|_| NotReady::NoBuffer)?;
        let mut put = self.io.put(&mut f, self.room).is_ok();
        if !put && self.room > FRAME_HEADER_LEN {
            // This link's buffers hold less than a frame (jumbo frames in
            // segments): headers only from now on, nothing packed.
            self.room = FRAME_HEADER_LEN;
            put = self.io.put(&mut f, FRAME_HEADER_LEN).is_ok();
        }
        if put {
            Ok(f)
        } else {
            Err(NotReady::NoRoom)
        }
    }
}

/// Puts the frame lent to a receive in the place of its lending buffer.
fn give_lent(
    lent: &mut Vec<(usize, RequestId, Lent)>,
    core: usize,
    c: &mut Completion<SendBuf, RecvBuf>,
) {
    let Completion::Recv(d) = c else { return };
    if !matches!(d.buf, RecvBuf::Lending) {
        return;
    }
    if let Some(k) = lent
        .iter()
        .position(|(i, req, _)| *i == core && *req == d.req)
    {
        d.buf = RecvBuf::Lent(lent.swap_remove(k).2);
    }
}

/// The core a frame goes to: its destination endpoint's, or the first.
#[inline]
fn route(route: &[u8; 256], frame: &[u8], ethertype: u16) -> usize {
    match crate::wire::peek_dst(frame, ethertype) {
        Some((_, ep)) if route[usize::from(ep)] != NO_CORE => usize::from(route[usize::from(ep)]),
        _ => 0,
    }
}

/// Whether a completion hands back a registered buffer that something else
/// still refers to (frames the link holds, or other handles).
#[inline]
fn held_by_frames(c: &Completion<SendBuf, RecvBuf>) -> bool {
    match c {
        Completion::Send(s) => match &s.buf {
            SendBuf::Registered(b) => b.in_flight() != 0,
            SendBuf::Owned(_) => false,
        },
        Completion::Recv(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter read behind the clock's origin (another CPU's, lagging)
    /// reads as the origin: it used to wrap to about 195 years on.
    #[test]
    fn a_counter_behind_the_origin_reads_as_the_origin() {
        let mut clock = Clock::new();
        if clock.ns_per_tick == 0 {
            return; // no invariant TSC here: the clock reads `Instant`
        }
        clock.origin_tsc = dpdk_ffi::rdtsc() + 1_000_000_000;
        assert_eq!(clock.now(), Time::ZERO);
    }
}
