//! The transports of one side of a session, opened when first used: the raw
//! queue pair and two emx engines (inline progress, and the pinger's polling
//! thread), each on its channel of the link. On a link whose channels are one
//! queue pair ([`Link::shared`](crate::link::Link)), only one of them is open
//! at a time: the session closes the others on both sides first, and drains
//! what the closed ones left in flight, so that a new engine never sees
//! frames of an old one.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use dpdk_ffi::{Burst, ExtBuf, ExtMem, Mempool, RxQueue, TxQueue};
use emx::io::DpdkIo;
use emx::proto::Addr;
use emx::runtime::{
    Completed, Endpoint, Engine, EngineConfig, ProgressMode, ProtocolConfig, RecvBuf, Request,
    SendBuf,
};

use crate::link::{End, EMX_INLINE, EMX_THREAD, RAW};
use crate::session::{SendBuffers, Transport};

/// How long an emx wait goes between looks at the other side: a side that
/// is gone ends the measurement within about this, not after the engines'
/// 30 s `peer_timeout`.
pub(crate) const CHECK_PEER_EVERY: Duration = Duration::from_millis(500);

/// Waits on `ep` until one of `reqs` finishes, calling `check` after each
/// [`CHECK_PEER_EVERY`] of waiting: its error ends the wait.
pub(crate) fn wait_checked(
    ep: &mut Endpoint,
    reqs: &[Request],
    check: &mut dyn FnMut() -> Result<(), String>,
) -> Result<(usize, Completed), String> {
    loop {
        if let Some(done) = ep
            .wait_any_timeout(reqs, CHECK_PEER_EVERY)
            .map_err(|e| e.to_string())?
        {
            return Ok(done);
        }
        check()?;
    }
}

/// The channel a transport runs on.
pub(crate) fn channel(t: Transport) -> usize {
    match t {
        Transport::Emx => EMX_INLINE,
        Transport::EmxThread => EMX_THREAD,
        // ffi uses the raw queue pair's ids; udp and tcp use none.
        Transport::Raw | Transport::Ffi | Transport::Udp | Transport::Tcp => RAW,
    }
}

/// An open emx channel: the endpoint and its buffers, then the engine (dropped
/// after the endpoint).
struct EmxChan {
    side: EmxSide,
    _engine: Engine,
}

/// One side's transports.
pub(crate) struct Chans {
    /// This side's end of each channel.
    ends: Vec<End>,
    /// The other side's MAC on each channel.
    peer_macs: Vec<[u8; 6]>,
    pool: Mempool,
    region: ExtMem,
    node: u16,
    peer_node: u16,
    /// How the engine of each emx channel makes progress.
    modes: [ProgressMode; 2],
    /// Whether the channels are one queue pair.
    pub(crate) shared: bool,
    raw: Option<(RxQueue, TxQueue)>,
    emx: [Option<EmxChan>; 2],
}

impl Chans {
    /// Nothing open yet.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        ends: Vec<End>,
        peer_macs: Vec<[u8; 6]>,
        pool: Mempool,
        region: ExtMem,
        node: u16,
        peer_node: u16,
        modes: [ProgressMode; 2],
        shared: bool,
    ) -> Chans {
        Chans {
            ends,
            peer_macs,
            pool,
            region,
            node,
            peer_node,
            modes,
            shared,
            raw: None,
            emx: [None, None],
        }
    }

    /// Whether channel `c` is open.
    pub(crate) fn is_open(&self, c: usize) -> bool {
        if c == RAW {
            self.raw.is_some()
        } else {
            self.emx[c - EMX_INLINE].is_some()
        }
    }

    /// Opens channel `c` (a no-op when open).
    pub(crate) fn open(&mut self, c: usize) -> Result<(), String> {
        if self.is_open(c) {
            return Ok(());
        }
        let end = &self.ends[c];
        if c == RAW {
            self.raw = Some((
                end.port.rx_queue(end.queue).map_err(|e| e.to_string())?,
                end.port.tx_queue(end.queue).map_err(|e| e.to_string())?,
            ));
            return Ok(());
        }
        let i = c - EMX_INLINE;
        // Sends go out from the region without a copy.
        self.region.dma_map(&end.port).map_err(|e| {
            format!(
                "cannot map registered memory for DMA by {}: {e}",
                end.port.name()
            )
        })?;
        let (engine, ep) = engine(
            end,
            &self.pool,
            self.node,
            (self.peer_node, self.peer_macs[c]),
            self.modes[i].clone(),
        )?;
        self.emx[i] = Some(EmxChan {
            side: EmxSide::new(
                ep,
                Addr::new(self.peer_node, 0),
                self.region.clone(),
                matches!(self.modes[i], ProgressMode::Inline),
            ),
            _engine: engine,
        });
        Ok(())
    }

    /// Closes every channel (their requests must be done: see [`EmxSide::quiesce`]).
    pub(crate) fn close_all(&mut self) {
        self.raw = None;
        self.emx = [None, None];
    }

    /// Drops what waits on the shared queue pair until it stays quiet for a
    /// millisecond: frames that closed transports left in flight.
    pub(crate) fn drain(&mut self) -> Result<(), String> {
        let opened = !self.is_open(RAW);
        self.open(RAW)?;
        let (rx, _) = self.raw.as_mut().expect("opened above");
        let mut inb: Burst = Burst::new();
        let mut quiet = Instant::now();
        let start = Instant::now();
        while quiet.elapsed() < Duration::from_millis(1) && start.elapsed() < Duration::from_secs(5)
        {
            if rx.rx_burst(&mut inb) > 0 {
                inb.clear();
                quiet = Instant::now();
            }
        }
        if opened {
            self.raw = None;
        }
        Ok(())
    }

    /// The raw queue pair (opened by the caller).
    pub(crate) fn raw(&mut self) -> &mut (RxQueue, TxQueue) {
        self.raw.as_mut().expect("the raw channel is opened first")
    }

    /// The raw queue pair, when open.
    pub(crate) fn raw_if_open(&mut self) -> Option<&mut (RxQueue, TxQueue)> {
        self.raw.as_mut()
    }

    /// The port and queue ids of the raw channel (for the bindings).
    pub(crate) fn raw_ids(&self) -> (u16, u16) {
        (self.ends[RAW].port.id(), self.ends[RAW].queue)
    }

    /// The emx side of endpoint `ep` (0: inline, 1: thread; opened by the caller).
    pub(crate) fn side(&mut self, ep: usize) -> &mut EmxSide {
        &mut self.emx[ep]
            .as_mut()
            .expect("the emx channel is opened first")
            .side
    }

    /// The emx side of endpoint `ep`, for a stream: the other emx channel's
    /// idle buffers go back to the region first. The two channels share the
    /// region, and each keeps its buffers for its next round, so a stream
    /// of a window of large messages on one found the region half taken by
    /// the other (bibw at 1 MiB with `--window 40`, which `check_windows`
    /// lets through, failed on emx-thread's buffers).
    pub(crate) fn stream_side(&mut self, ep: usize) -> &mut EmxSide {
        for (i, c) in self.emx.iter_mut().enumerate() {
            if let Some(c) = c.as_mut().filter(|_| i != ep) {
                c.side.release_idle();
            }
        }
        self.side(ep)
    }

    /// The open emx sides.
    pub(crate) fn sides(&mut self) -> impl Iterator<Item = &mut EmxSide> {
        self.emx.iter_mut().flatten().map(|c| &mut c.side)
    }

    /// Keeps the open emx engines answering.
    pub(crate) fn progress(&mut self) {
        for s in self.sides() {
            s.ep.progress();
        }
    }
}

/// Starts an engine on `end` with one peer, and its endpoint.
fn engine(
    end: &End,
    pool: &Mempool,
    node: u16,
    peer: (u16, [u8; 6]),
    progress: ProgressMode,
) -> Result<(Engine, Endpoint), String> {
    let cfg = EngineConfig {
        progress,
        // Each side's engine sits undriven while other transports run.
        protocol: ProtocolConfig {
            peer_timeout_us: Some(30_000_000),
            ..ProtocolConfig::default()
        },
        ..EngineConfig::with_peer(node, peer.0, peer.1)
    };
    let io = DpdkIo::new(&end.port, end.queue, pool).map_err(|e| e.to_string())?;
    let mut engine = Engine::start(&cfg, io).map_err(|e| e.to_string())?;
    let ep = engine.endpoint().map_err(|e| e.to_string())?;
    Ok((engine, ep))
}

/// A message buffer of the benchmark: registered memory, or nothing for
/// zero-byte messages (registered ranges are never empty).
pub(crate) enum Mem {
    Ext(ExtBuf),
    Empty,
}

impl From<SendBuf> for Mem {
    fn from(b: SendBuf) -> Mem {
        match b {
            SendBuf::Registered(b) => Mem::Ext(b),
            SendBuf::Owned(_) => Mem::Empty,
        }
    }
}

impl From<RecvBuf> for Mem {
    fn from(b: RecvBuf) -> Mem {
        match b {
            RecvBuf::Registered(b) => Mem::Ext(b),
            _ => Mem::Empty,
        }
    }
}

impl Mem {
    pub(crate) fn send(self) -> SendBuf {
        match self {
            Mem::Ext(b) => SendBuf::Registered(b),
            Mem::Empty => SendBuf::Owned(Vec::new()),
        }
    }
    fn recv(self) -> RecvBuf {
        match self {
            Mem::Ext(b) => RecvBuf::Registered(b),
            Mem::Empty => RecvBuf::Owned(Vec::new()),
        }
    }
}

/// emx state of one side: an endpoint and its registered buffers.
pub(crate) struct EmxSide {
    pub(crate) ep: Endpoint,
    peer: Addr,
    region: ExtMem,
    size: usize,
    pub(crate) free: Vec<Mem>,
    /// With [`SendBuffers::Single`]: the buffer every send shares.
    one: Option<ExtBuf>,
    pub(crate) posted: VecDeque<Request>,
    pub(crate) sends: VecDeque<Request>,
    /// Whether its engine progresses inline (its counters are then read
    /// without a round trip to a polling thread).
    pub(crate) inline: bool,
}

impl EmxSide {
    fn new(ep: Endpoint, peer: Addr, region: ExtMem, inline: bool) -> EmxSide {
        EmxSide {
            ep,
            peer,
            region,
            inline,
            free: Vec::new(),
            one: None,
            size: usize::MAX,
            posted: VecDeque::new(),
            sends: VecDeque::new(),
        }
    }

    /// Lets the buffers go back to the region, when no request holds any
    /// (a range that frames still refer to goes back once they let go).
    fn release_idle(&mut self) {
        if self.posted.is_empty() && self.sends.is_empty() {
            self.free.clear();
            self.one = None;
            self.size = usize::MAX;
        }
    }

    /// Makes sure `n` free buffers of `size` bytes exist (all requests must
    /// be done), and that sends take theirs as `sends` says.
    pub(crate) fn buffers(
        &mut self,
        size: usize,
        n: usize,
        sends: SendBuffers,
    ) -> Result<(), String> {
        // A send still in flight would come back to the wrong place (`sent`).
        debug_assert!(self.sends.is_empty(), "buffers changed under sends");
        if self.size != size {
            self.free.clear();
            self.one = None;
            self.size = size;
        }
        if sends == SendBuffers::Multiple || size == 0 {
            self.one = None;
        } else if self.one.is_none() {
            let b = self
                .region
                .alloc(size, 64)
                .map_err(|e| format!("registered memory for one {size} B send buffer: {e}"))?;
            self.one = Some(b);
        }
        while self.free.len() < n {
            if size == 0 {
                self.free.push(Mem::Empty);
                continue;
            }
            let b = self
                .region
                .alloc(size, 64)
                .map_err(|e| format!("registered memory for {n} x {size} B: {e}"))?;
            self.free.push(Mem::Ext(b));
        }
        Ok(())
    }

    /// [`buffers`](Self::buffers) for one side of a stream with `depth`
    /// messages in flight each way it goes: a buffer per receive when it
    /// `recvs`, and per send when it `sends` from multiple buffers (single
    /// sends share one).
    pub(crate) fn stream_buffers(
        &mut self,
        size: usize,
        depth: usize,
        sends: bool,
        recvs: bool,
        from: SendBuffers,
    ) -> Result<(), String> {
        let from = if sends { from } else { SendBuffers::Multiple };
        // Empty messages have no buffer to share (`buffers` keeps no single
        // one at size 0): each send takes an empty one of its own.
        let per_send = usize::from(sends && (from == SendBuffers::Multiple || size == 0));
        self.buffers(size, depth * (per_send + usize::from(recvs)), from)
    }

    pub(crate) fn post(&mut self, tag: u64) -> bool {
        // A buffer that frames still refer to (a driver that lets go of
        // sent frames late) is refused as busy: it goes to the bottom and
        // the next is tried. (It went back on top, to be tried again, and
        // refused again, on every call while others were writable.)
        for _ in 0..self.free.len() {
            let Some(b) = self.free.pop() else {
                return false;
            };
            match self.ep.irecv(Some(self.peer), tag, u64::MAX, b.recv()) {
                Ok(r) => {
                    self.posted.push_back(r);
                    return true;
                }
                Err(r) if matches!(r.error, emx::runtime::Error::BufferBusy) => {
                    self.free.insert(0, r.buf.into());
                }
                Err(r) => {
                    self.free.push(r.buf.into());
                    return false;
                }
            }
        }
        false
    }

    /// The endpoint's own counters (its messages: completed, and those that
    /// arrived before their receive was posted).
    pub(crate) fn core_stats(&mut self) -> Result<emx::proto::CoreStats, String> {
        self.ep.core_stats().map_err(|e| e.to_string())
    }

    /// The endpoint's protocol counters toward its peer.
    pub(crate) fn peer_stats(&mut self) -> Result<emx::proto::PeerStats, String> {
        let (peer, _) = self.ep.stats(self.peer).map_err(|e| e.to_string())?;
        Ok(peer.unwrap_or_default())
    }

    /// Sends a message from a free buffer, or from the shared one (see
    /// [`SendBuffers::Single`]); false when there is none or emx refused it.
    pub(crate) fn send(&mut self, tag: u64) -> bool {
        let b = match &self.one {
            Some(one) => match one.share() {
                Ok(b) => Mem::Ext(b),
                Err(_) => return false,
            },
            None => match self.free.pop() {
                Some(b) => b,
                None => return false,
            },
        };
        self.send_buf(tag, b).is_ok()
    }

    /// Sends `b`; emx's refusal (the buffer taken back) as an error.
    pub(crate) fn send_buf(&mut self, tag: u64, b: Mem) -> Result<(), String> {
        match self.ep.isend(self.peer, tag, b.send()) {
            Ok(s) => {
                self.sends.push_back(s);
                Ok(())
            }
            Err(r) => {
                let e = r.error.to_string();
                self.sent(r.buf);
                Err(e)
            }
        }
    }

    /// Takes back a send's buffer: free again, or, when it was a handle on
    /// the shared one, dropped.
    pub(crate) fn sent(&mut self, b: SendBuf) {
        if self.one.is_none() {
            self.free.push(b.into());
        }
    }

    /// Whether the oldest receive finished at the last poll (polling
    /// nothing).
    pub(crate) fn recv_ready(&self) -> bool {
        self.posted
            .front()
            .is_some_and(|&r| self.ep.is_done(r).unwrap_or(false))
    }

    /// The oldest receive, if finished: its buffer and length.
    pub(crate) fn recv_done(&mut self) -> Result<Option<(Mem, u64)>, String> {
        let Some(&r) = self.posted.front() else {
            return Ok(None);
        };
        let Some(c) = self.ep.test(r).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        self.posted.pop_front();
        let (b, info) = c.into_recv().map_err(|e| e.to_string())?;
        Ok(Some((b.into(), info.msg_len)))
    }

    /// Takes finished sends (in order); returns how many. Each look at an
    /// unfinished send polls; with `once`, only the first.
    ///
    /// A side that also receives (bibw) polls once: the receives a poll
    /// finishes are still to be posted again. Polling on while each poll
    /// finished the send it looked at, the echo took three bursts (94
    /// messages, 30 of them unexpected) against its 64 posted receives, in
    /// about 1 run of 150. A side that only sends polls on while its sends
    /// finish, as it always did.
    pub(crate) fn sends_done(&mut self, once: bool) -> Result<usize, String> {
        let mut n = 0;
        let mut polled = false;
        while let Some(&s) = self.sends.front() {
            if once && !self.ep.is_done(s).map_err(|e| e.to_string())? {
                if polled {
                    break;
                }
                polled = true;
            }
            let Some(c) = self.ep.test(s).map_err(|e| e.to_string())? else {
                break;
            };
            self.sends.pop_front();
            self.sent(c.into_send().map_err(|e| e.to_string())?);
            n += 1;
        }
        Ok(n)
    }

    /// Ends a measurement: cancels the receives still posted and waits for
    /// every send (the peer is still answering).
    ///
    /// Every [`CHECK_PEER_EVERY`] of waiting it calls `peer_there`, which
    /// ends the wait with its error when the other side is known to be gone;
    /// a peer that is there but does not answer ends it after 30 s.
    pub(crate) fn quiesce(
        &mut self,
        peer_there: &mut dyn FnMut() -> Result<(), String>,
    ) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let peer = self.peer;
        // One request at a time, `left` of them still to finish.
        let mut wait = |ep: &mut Endpoint, r: Request, left: usize| {
            wait_checked(ep, &[r], &mut || {
                if Instant::now() > deadline {
                    return Err(format!(
                        "{left} emx requests with {peer:?} did not finish within 30 s"
                    ));
                }
                peer_there()
            })
        };
        let posted = std::mem::take(&mut self.posted);
        for (i, &r) in posted.iter().enumerate() {
            // Done at once unless it already matched a message that is
            // still arriving.
            let _ = self.ep.cancel(r);
            let (_, c) = wait(&mut self.ep, r, posted.len() - i + self.sends.len())?;
            if let emx::runtime::Buf::Recv(b) = c.buf {
                self.free.push(b.into());
            }
        }
        while let Some(&s) = self.sends.front() {
            let (_, c) = wait(&mut self.ep, s, self.sends.len())?;
            self.sends.pop_front();
            self.sent(c.into_send().map_err(|e| e.to_string())?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer that something still refers to (as frames a driver has not
    /// let go of yet) does not keep the free ones from being posted: it was
    /// tried first on every call, refused as busy every time.
    #[test]
    fn a_busy_buffer_does_not_block_the_free_ones() {
        let eal = dpdk_ffi::Eal::builder()
            .hugepages(dpdk_ffi::HugepageMode::Never)
            .init()
            .unwrap();
        let region = ExtMem::with_pages(&eal, 1 << 20, false).unwrap();
        use emx::io::PacketIo;
        let (ia, ib) = emx::io::MemNetwork::pair(1500);
        let mut engine = Engine::start(&EngineConfig::with_peer(1, 2, ib.mac()), ia).unwrap();
        let mut s = EmxSide::new(engine.endpoint().unwrap(), Addr::new(2, 0), region, true);
        s.buffers(4096, 2, SendBuffers::Multiple).unwrap();
        let Some(Mem::Ext(top)) = s.free.last() else {
            panic!("two registered buffers")
        };
        let held = top.share().unwrap();
        assert!(s.post(1), "the other buffer is writable");
        assert!(!s.post(2), "none left but the busy one");
        assert_eq!(s.free.len(), 1);
        drop(held);
        assert!(s.post(3), "writable again");
    }
}
