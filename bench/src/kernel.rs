//! Kernel-socket baselines over a [`VethPair`]: UDP and TCP ping-pong latency,
//! one-way streaming bandwidth and bidirectional bandwidth between the pair's
//! two network namespaces.
//!
//! These are the numbers an application would get from the kernel's own stack
//! on the same kind of link that DPDK's `net_af_packet` and `net_af_xdp` ports
//! use, so emx can be compared with what it replaces. The benchmark gives them
//! a veth pair with no DPDK port on it: a packet socket on the pair would copy
//! every datagram into its ring on the baseline's clock. Every function joins
//! its threads and closes its sockets before it returns, on success and on
//! error; reads time out (2 s) so that nothing hangs on a lost datagram or a
//! dead peer.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use core_affinity::CoreId;
use hdrhistogram::Histogram;
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags};
use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::sys::socket::{setsockopt, sockopt};
use nix::unistd::Pid;

use crate::netns::VethPair;

/// Largest UDP payload over IPv4 (65535 − 20 IP − 8 UDP header bytes).
pub const UDP_MAX: usize = 65507;
/// Largest message accepted for TCP ping-pong and streaming: 8 MiB.
pub const TCP_MAX: usize = 8 << 20;
/// How long a read waits before a UDP datagram counts as lost or a TCP peer as dead.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a side waits for its peer to bind, connect or accept.
const SETUP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a ping-pong side busy-polls for a message before blocking in `poll(2)`.
const SPIN_BUDGET: Duration = Duration::from_micros(200);
/// How often a waiting echo or receiver thread checks whether it should stop.
const POLL: Duration = Duration::from_millis(20);

/// Kernel transport used by a baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// UDP datagrams, one per message.
    Udp,
    /// One TCP connection with `TCP_NODELAY`.
    Tcp,
}

/// Sets its flag when dropped, unwinding included.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Result of a ping-pong: its round trips, and the UDP datagrams lost on the way.
#[derive(Debug)]
pub struct PingPong {
    /// Round-trip times in nanoseconds, one per measured round trip.
    pub hist: Histogram<u64>,
    /// UDP datagrams (requests or replies) not answered within 2 s and sent
    /// again, warm-up included; always 0 for TCP.
    pub losses: u64,
}

/// What a streaming run ([`stream`], [`bibw`]) moved.
///
/// Measured at the receiver(s) as the DPDK streams are (see
/// [`Tally`](crate::session::Tally)): from the first arrival after the
/// warm-up, what came after it and over what time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StreamResult {
    /// Payload bytes measured.
    pub bytes: u64,
    /// Messages measured: UDP datagrams, or whole `msg`-sized units of the
    /// TCP byte stream.
    pub msgs: u64,
    /// Seconds measured (for [`bibw`], from the earliest start to the latest
    /// last arrival of the two directions).
    pub seconds: f64,
    /// Messages sent, warm-up included: UDP datagrams accepted by the
    /// kernel, or completed `msg`-sized TCP writes.
    pub sent: u64,
    /// Messages received, warm-up included. For UDP, `sent - received`
    /// datagrams were lost.
    pub received: u64,
}

/// Ping-pong of `size`-byte messages between namespace 0 (the pinger, on the
/// calling thread) and namespace 1 (an echo thread this spawns).
///
/// Runs warm-up round trips for `warmup`, then measures round trips for
/// `duration`, stopping earlier once `max_iters` were measured when it is
/// `Some`. Each measured round trip is recorded in nanoseconds in a histogram
/// made with `new_with_bounds(1, 100_000_000_000, 3)`. `cores` pins the pinger
/// (`.0`) and the echo thread (`.1`); the calling thread's namespace and CPU
/// affinity are restored before return.
///
/// `size` is 0 to 8 MiB for TCP (`TCP_NODELAY` on; a 0-byte message is sent
/// as 1 byte, since a byte stream cannot carry an empty one) and 0 to 65507
/// for UDP (larger is an error: UDP datagrams stop at 65507 bytes).
///
/// Both sides busy-poll non-blocking sockets (`recv` returning `EAGAIN` is
/// retried at once) for up to 200 µs per wait, then block in `poll(2)`; for
/// UDP and TCP alike. On a veth that measured well below blocking `recv`
/// (8 B p50, UDP 8.0 µs polling vs 18.9 µs blocking, TCP 10.0 µs vs 21.1 µs),
/// since a blocked thread pays a wake-up and a context switch per message; it
/// costs two busy cores for the run. When both `cores` are the same core the
/// sides block at once instead of spinning (about 16 µs for 8 B UDP, where
/// spinning for each other would cost a scheduler time slice per message).
/// A UDP round trip not answered within 2 s counts as a loss and the
/// request is sent again under a new sequence number, timed from there;
/// [`PingPong::losses`] counts them (the report lists them under its tables).
/// A UDP message carries its sequence number in its first 8 bytes (the low
/// bytes of it in a shorter one), so a late reply, to an earlier request or
/// to the one a resend replaced, is not taken for the awaited one.
pub fn pingpong(
    pair: &VethPair,
    proto: Proto,
    size: usize,
    warmup: Duration,
    duration: Duration,
    max_iters: Option<u64>,
    cores: (Option<CoreId>, Option<CoreId>),
) -> Result<PingPong, String> {
    check_size(proto, size)?;
    let wire_size = if proto == Proto::Tcp {
        size.max(1)
    } else {
        size
    };
    // Two threads pinned to one core must not busy-wait for each other.
    let spin = match cores {
        (Some(a), Some(b)) if a == b => Duration::ZERO,
        _ => SPIN_BUDGET,
    };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (port_tx, port_rx) = mpsc::channel();
        // Spawned before the caller is pinned or moved, so it inherits neither.
        let stop = &stop;
        let echo = s.spawn(move || {
            let r = echo_side(pair, proto, wire_size, cores.1, spin, stop, &port_tx);
            if let Err(e) = &r {
                let _ = port_tx.send(Err(e.clone()));
            }
            r
        });
        // Set however the pinger ends, a panic included: the scope waits
        // for the echo, which stops only then.
        let _stop_echo = SetOnDrop(stop);
        let result = (|| {
            let port = match port_rx.recv_timeout(SETUP_TIMEOUT) {
                Ok(r) => r?,
                Err(_) => return Err("echo thread did not bind within 5 s".to_string()),
            };
            let _ns = enter_guard(pair, 0)?;
            let _pin = pin_current(cores.0);
            let peer = SocketAddr::from((pair.ip[1], port));
            match proto {
                Proto::Tcp => ping_tcp(peer, spin, wire_size, warmup, duration, max_iters),
                Proto::Udp => ping_udp(
                    pair.ip[0], peer, spin, wire_size, warmup, duration, max_iters,
                ),
            }
        })();
        stop.store(true, Ordering::Release);
        let echo_result = echo
            .join()
            .unwrap_or_else(|_| Err("echo thread panicked".to_string()));
        match (result, echo_result) {
            // The echo's failure is often the cause of the pinger's (a
            // closed connection, no answer): both are told.
            (Err(e), Err(why)) => Err(format!("{e} (echo side: {why})")),
            (Err(e), Ok(())) => Err(e),
            (Ok(_), Err(e)) => Err(format!("echo side: {e}")),
            (Ok(r), Ok(())) => Ok(r),
        }
    })
}

/// One-way streaming of `msg`-byte messages from namespace 0 to namespace 1
/// for about `duration`.
///
/// TCP: one connection, `write_all` of `msg`-byte buffers (1 to 8 MiB), the
/// receiver reading 1 MiB at a time. UDP: datagrams of `min(msg, 65507)`
/// bytes, sent as fast as the kernel takes them; the receiver counts what
/// arrives (loss is expected when the sender outruns it: compare
/// [`StreamResult::sent`] and [`StreamResult::received`]). Bytes and seconds
/// are measured at the receiver, from its first to its last byte. The sender
/// and receiver run on threads this spawns, pinned to `cores.0` (namespace 0)
/// and `cores.1` (namespace 1) when given; the calling thread only waits.
pub fn stream(
    pair: &VethPair,
    proto: Proto,
    msg: usize,
    pace: StreamPace,
    cores: (Option<CoreId>, Option<CoreId>),
) -> Result<StreamResult, String> {
    run_streams(pair, proto, msg, pace, cores, &[(0, 1)])
}

/// How long a kernel stream runs.
#[derive(Clone, Copy, Debug)]
pub struct StreamPace {
    /// Sent before the receivers start measuring.
    pub warmup: Duration,
    /// Measured time.
    pub duration: Duration,
    /// At most this many messages per direction (`--iters`): the stream
    /// then is measured whole, from the senders' start to the last arrival,
    /// as a short TCP stream arrives in too few reads to be timed by its
    /// arrivals.
    pub max_msgs: Option<u64>,
}

/// Both directions at once: namespace 0 streams to namespace 1 and 1 to 0,
/// each as in [`stream`] (two TCP connections, or two UDP flows), for about
/// `duration`. Returns the bytes and messages both receivers got together,
/// timed from the earliest first byte to the latest last byte. Each
/// namespace's sender and receiver threads share its core from `cores`.
pub fn bibw(
    pair: &VethPair,
    proto: Proto,
    msg: usize,
    pace: StreamPace,
    cores: (Option<CoreId>, Option<CoreId>),
) -> Result<StreamResult, String> {
    run_streams(pair, proto, msg, pace, cores, &[(0, 1), (1, 0)])
}

/// Rejects message sizes the transport cannot carry as one message.
fn check_size(proto: Proto, size: usize) -> Result<(), String> {
    match proto {
        Proto::Udp if size > UDP_MAX => Err(format!(
            "UDP datagrams stop at {UDP_MAX} bytes: {size} is too large (use TCP)"
        )),
        Proto::Tcp if size > TCP_MAX => Err(format!(
            "TCP messages are limited to {TCP_MAX} bytes (8 MiB): {size} is too large"
        )),
        _ => Ok(()),
    }
}

/// Moves the calling thread back to the starting namespace on drop.
struct NsGuard<'a>(&'a VethPair);

impl Drop for NsGuard<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.leave() {
            // (Never seen: the starting namespace is held open.)
            eprintln!("emx-bench: this thread stays in a test namespace: {e}");
        }
    }
}

/// Enters namespace `side` until the guard is dropped.
fn enter_guard(pair: &VethPair, side: usize) -> Result<NsGuard<'_>, String> {
    pair.enter(side)?;
    Ok(NsGuard(pair))
}

/// Restores the calling thread's CPU affinity on drop.
struct AffinityGuard(Option<CpuSet>);

impl Drop for AffinityGuard {
    fn drop(&mut self) {
        if let Some(set) = &self.0 {
            let _ = sched_setaffinity(Pid::from_raw(0), set);
        }
    }
}

/// Pins the calling thread to `core` (if any) until the guard is dropped.
fn pin_current(core: Option<CoreId>) -> AffinityGuard {
    let Some(core) = core else {
        return AffinityGuard(None);
    };
    let before = sched_getaffinity(Pid::from_raw(0)).ok();
    core_affinity::set_for_current(core);
    AffinityGuard(before)
}

/// Whether an I/O error is a read or write timeout.
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Accepts one connection on `listener`, giving up when `stop` is set or after 5 s.
fn accept_one(listener: &TcpListener, stop: &AtomicBool) -> Result<TcpStream, String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listener: {e}"))?;
    let deadline = Instant::now() + SETUP_TIMEOUT;
    loop {
        match listener.accept() {
            Ok((conn, _)) => {
                conn.set_nonblocking(false)
                    .map_err(|e| format!("accepted socket: {e}"))?;
                return Ok(conn);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                if stop.load(Ordering::Acquire) {
                    return Err("stopped before the peer connected".to_string());
                }
                if Instant::now() > deadline {
                    return Err("peer did not connect within 5 s".to_string());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
}

/// Connects to `peer` with `TCP_NODELAY`; the source address is the
/// namespace's only one on the peer's subnet.
fn connect(peer: SocketAddr) -> Result<TcpStream, String> {
    let conn = TcpStream::connect_timeout(&peer, SETUP_TIMEOUT)
        .map_err(|e| format!("TCP connect to {peer}: {e}"))?;
    conn.set_nodelay(true)
        .map_err(|e| format!("TCP_NODELAY: {e}"))?;
    Ok(conn)
}

/// The echo thread of a ping-pong: enters namespace 1, binds, reports its port
/// on `port_tx`, then returns every message to its sender until `stop`,
/// busy-polling a non-blocking socket.
fn echo_side(
    pair: &VethPair,
    proto: Proto,
    size: usize,
    core: Option<CoreId>,
    spin: Duration,
    stop: &AtomicBool,
    port_tx: &mpsc::Sender<Result<u16, String>>,
) -> Result<(), String> {
    pair.enter(1)?;
    if let Some(c) = core {
        core_affinity::set_for_current(c);
    }
    let stopped = |_: Duration| stop.load(Ordering::Acquire);
    let mut wait = Waiter::new(spin);
    match proto {
        Proto::Tcp => {
            let listener =
                TcpListener::bind((pair.ip[1], 0)).map_err(|e| format!("TCP bind: {e}"))?;
            let port = listener.local_addr().map_err(|e| e.to_string())?.port();
            let _ = port_tx.send(Ok(port));
            let mut conn = match accept_one(&listener, stop) {
                Ok(c) => c,
                // The pinger gave up first and reported why.
                Err(_) if stop.load(Ordering::Acquire) => return Ok(()),
                Err(e) => return Err(e),
            };
            drop(listener);
            conn.set_nodelay(true)
                .map_err(|e| format!("TCP_NODELAY: {e}"))?;
            conn.set_nonblocking(true).map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; size];
            loop {
                match read_exact_polled(&mut conn, &mut buf, &mut wait, &stopped) {
                    Ok(Polled::Done) => {}
                    // Pinger closed or stopped: done.
                    Ok(Polled::Eof | Polled::GaveUp) => return Ok(()),
                    Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(()),
                    Err(e) => return Err(format!("TCP echo read: {e}")),
                }
                match write_all_polled(&mut conn, &buf, &mut wait, &|idle| {
                    stopped(idle) || idle > READ_TIMEOUT
                }) {
                    Ok(_) => {}
                    Err(e)
                        if e.kind() == ErrorKind::ConnectionReset
                            || e.kind() == ErrorKind::BrokenPipe =>
                    {
                        return Ok(())
                    }
                    Err(e) => return Err(format!("TCP echo write: {e}")),
                }
            }
        }
        Proto::Udp => {
            let sock = UdpSocket::bind((pair.ip[1], 0)).map_err(|e| format!("UDP bind: {e}"))?;
            let port = sock.local_addr().map_err(|e| e.to_string())?.port();
            sock.set_nonblocking(true).map_err(|e| e.to_string())?;
            let _ = port_tx.send(Ok(port));
            let mut buf = vec![0u8; UDP_MAX + 1];
            while !stop.load(Ordering::Acquire) {
                match sock.recv_from(&mut buf) {
                    Ok((n, from)) => {
                        wait.reset();
                        // A send that fails (buffer full) is a loss the pinger resends.
                        let _ = sock.send_to(&buf[..n], from);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        wait.wait(&sock, PollFlags::POLLIN)
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                    Err(e) => return Err(format!("UDP echo recv: {e}")),
                }
            }
            Ok(())
        }
    }
}

/// Hybrid waiting on a non-blocking socket: after an empty poll, busy-wait
/// (a pause hint, then poll again) for up to `budget` since the last progress,
/// then block in `poll(2)` for at most [`POLL`] at a time, so that callers
/// still check their stop flags and deadlines. A zero budget always blocks.
struct Waiter {
    /// How long to busy-wait before blocking.
    budget: Duration,
    /// Start of the current run of empty polls.
    since: Option<Instant>,
}

impl Waiter {
    /// A waiter that busy-waits for up to `budget` before blocking.
    fn new(budget: Duration) -> Waiter {
        Waiter {
            budget,
            since: None,
        }
    }

    /// Called after a poll of `fd` found nothing to do for `events` (`POLLIN` or `POLLOUT`).
    fn wait(&mut self, fd: &impl AsFd, events: PollFlags) {
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() < self.budget {
            std::hint::spin_loop();
            return;
        }
        let mut pfd = [PollFd::new(fd.as_fd(), events)];
        // A failure (EINTR) just returns early.
        let ms = u16::try_from(POLL.as_millis()).unwrap_or(u16::MAX);
        let _ = poll(&mut pfd, ms);
    }

    /// Called after a poll that made progress.
    fn reset(&mut self) {
        self.since = None;
    }
}

/// How a busy-polled transfer ended.
#[derive(Debug, PartialEq, Eq)]
enum Polled {
    /// The whole buffer was transferred.
    Done,
    /// The peer closed the connection before the first byte of a read.
    Eof,
    /// `give_up` said so.
    GaveUp,
}

/// Reads exactly `buf.len()` bytes from a non-blocking stream, waiting with
/// `wait` between empty polls. After each empty poll `give_up` gets the time
/// since the last progress.
fn read_exact_polled(
    conn: &mut TcpStream,
    buf: &mut [u8],
    wait: &mut Waiter,
    give_up: &dyn Fn(Duration) -> bool,
) -> std::io::Result<Polled> {
    let mut got = 0;
    let mut progress = Instant::now();
    while got < buf.len() {
        match conn.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(Polled::Eof),
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                got += n;
                wait.reset();
                progress = Instant::now();
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if give_up(progress.elapsed()) {
                    return Ok(Polled::GaveUp);
                }
                wait.wait(conn, PollFlags::POLLIN);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Polled::Done)
}

/// Writes all of `buf` to a non-blocking stream, waiting with `wait` while
/// the send buffer is full. After each full poll `give_up` gets the time
/// since the last progress.
fn write_all_polled(
    conn: &mut TcpStream,
    buf: &[u8],
    wait: &mut Waiter,
    give_up: &dyn Fn(Duration) -> bool,
) -> std::io::Result<Polled> {
    let mut sent = 0;
    let mut progress = Instant::now();
    while sent < buf.len() {
        match conn.write(&buf[sent..]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => {
                sent += n;
                wait.reset();
                progress = Instant::now();
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if give_up(progress.elapsed()) {
                    return Ok(Polled::GaveUp);
                }
                wait.wait(conn, PollFlags::POLLOUT);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Polled::Done)
}

/// Runs warm-up and measured round trips with `round_trip` (which returns one
/// round trip's nanoseconds) and fills the histogram.
fn measure(
    warmup: Duration,
    duration: Duration,
    max_iters: Option<u64>,
    mut round_trip: impl FnMut() -> Result<u64, String>,
) -> Result<Histogram<u64>, String> {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 100_000_000_000, 3)
        .map_err(|e| format!("histogram: {e}"))?;
    let start = Instant::now();
    while start.elapsed() < warmup {
        round_trip()?;
    }
    let start = Instant::now();
    let limit = max_iters.unwrap_or(u64::MAX);
    let mut n = 0u64;
    // At least a few round trips even when one takes longer than
    // `duration`, as the DPDK transports measure (an empty histogram would
    // leave the row out of the report).
    while n < limit && (n < 3 || start.elapsed() < duration) {
        hist.saturating_record(round_trip()?.max(1));
        n += 1;
    }
    Ok(hist)
}

/// Nanoseconds since `t0`, saturating.
fn nanos_since(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The TCP pinger: sends `size` bytes and reads `size` bytes back per round
/// trip, busy-polling a non-blocking socket; no progress for 2 s is an error.
fn ping_tcp(
    peer: SocketAddr,
    spin: Duration,
    size: usize,
    warmup: Duration,
    duration: Duration,
    max_iters: Option<u64>,
) -> Result<PingPong, String> {
    let mut conn = connect(peer)?;
    conn.set_nonblocking(true).map_err(|e| e.to_string())?;
    let out = vec![0x5au8; size];
    let mut back = vec![0u8; size];
    let too_long = |idle: Duration| idle > READ_TIMEOUT;
    let mut wait = Waiter::new(spin);
    let hist = measure(warmup, duration, max_iters, || {
        let t0 = Instant::now();
        match write_all_polled(&mut conn, &out, &mut wait, &too_long) {
            Ok(Polled::Done) => {}
            Ok(_) => return Err("TCP echo took nothing for 2 s".to_string()),
            Err(e) => return Err(format!("TCP write: {e}")),
        }
        match read_exact_polled(&mut conn, &mut back, &mut wait, &too_long) {
            Ok(Polled::Done) => Ok(nanos_since(t0)),
            Ok(Polled::Eof) => Err("TCP echo closed the connection".to_string()),
            Ok(Polled::GaveUp) => Err("TCP echo did not answer within 2 s".to_string()),
            Err(e) => Err(format!("TCP read: {e}")),
        }
    })?;
    let _ = conn.shutdown(std::net::Shutdown::Both);
    Ok(PingPong { hist, losses: 0 })
}

/// The UDP pinger: one datagram out, one back per round trip, busy-polling a
/// non-blocking socket; a reply missing for 2 s counts a loss and the request
/// is sent again.
fn ping_udp(
    local: Ipv4Addr,
    peer: SocketAddr,
    spin: Duration,
    size: usize,
    warmup: Duration,
    duration: Duration,
    max_iters: Option<u64>,
) -> Result<PingPong, String> {
    let sock = UdpSocket::bind((local, 0)).map_err(|e| format!("UDP bind: {e}"))?;
    sock.connect(peer)
        .map_err(|e| format!("UDP connect: {e}"))?;
    sock.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut out = vec![0x5au8; size];
    let mut back = vec![0u8; UDP_MAX + 1];
    let mut seq = 0u64;
    let mut losses = 0u64;
    // Losses in a row: a link that carries no kernel traffic at all (an
    // AF_XDP program took the interface) must fail, not retry for ever.
    let mut streak = 0u32;
    let mut wait = Waiter::new(spin);
    // The sequence number's bytes that a message of `size` carries.
    let tag = size.min(8);
    let hist = measure(warmup, duration, max_iters, || {
        seq += 1;
        out[..tag].copy_from_slice(&seq.to_le_bytes()[..tag]);
        let mut t0 = Instant::now();
        send_udp(&sock, &out)?;
        wait.reset();
        loop {
            match sock.recv(&mut back) {
                Ok(n) => {
                    let ns = nanos_since(t0);
                    if n == size && back[..tag] == out[..tag] {
                        streak = 0;
                        return Ok(ns);
                    }
                    // A late reply to an earlier or a replaced request: skip it.
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if t0.elapsed() < READ_TIMEOUT {
                        wait.wait(&sock, PollFlags::POLLIN);
                        continue;
                    }
                    losses += 1;
                    streak += 1;
                    if losses > 1000 {
                        return Err("UDP ping-pong: over 1000 datagrams lost".to_string());
                    }
                    if streak >= 5 {
                        return Err(format!(
                            "UDP ping-pong: 5 datagrams in a row unanswered ({} s): \
                             the link carries no kernel traffic",
                            5 * READ_TIMEOUT.as_secs()
                        ));
                    }
                    // A new number: the lost one's reply may yet come, and
                    // taken for this one's it would time the resend short.
                    seq += 1;
                    out[..tag].copy_from_slice(&seq.to_le_bytes()[..tag]);
                    t0 = Instant::now();
                    send_udp(&sock, &out)?;
                    wait.reset();
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // ICMP port unreachable from a previous send: the echo is gone.
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    return Err("UDP echo is not listening (connection refused)".to_string())
                }
                Err(e) => return Err(format!("UDP recv: {e}")),
            }
        }
    })?;
    Ok(PingPong { hist, losses })
}

/// Sends one datagram; a full buffer (`ENOBUFS`) counts as sent and lost.
fn send_udp(sock: &UdpSocket, buf: &[u8]) -> Result<(), String> {
    match sock.send(buf) {
        Ok(_) => Ok(()),
        Err(e)
            if e.raw_os_error() == Some(Errno::ENOBUFS as i32)
                || e.kind() == ErrorKind::Interrupted =>
        {
            Ok(())
        }
        Err(e) => Err(format!("UDP send: {e}")),
    }
}

/// What one receiver of a streaming run counted: times in nanoseconds from
/// the run's start, one arrival per datagram or TCP read.
type Received = crate::session::Tally;

/// Shared flags of one streaming run.
struct StreamCtl {
    /// Set once every sender is connected: start sending.
    go: AtomicBool,
    /// Set when the run is abandoned: every thread returns as soon as it sees it.
    abort: AtomicBool,
    /// Per direction: its sender has finished (UDP receivers stop on it).
    sender_done: [AtomicBool; 2],
}

/// Runs one stream per `(from, to)` direction at once and adds up what the receivers got.
fn run_streams(
    pair: &VethPair,
    proto: Proto,
    msg: usize,
    pace: StreamPace,
    cores: (Option<CoreId>, Option<CoreId>),
    dirs: &[(usize, usize)],
) -> Result<StreamResult, String> {
    // Senders send through the warm-up and the measured time; receivers
    // measure from `warmup` after their first arrival, on one clock.
    let base = Instant::now();
    let StreamPace {
        warmup,
        duration,
        max_msgs,
    } = pace;
    let sending = warmup + duration;
    if msg == 0 {
        return Err("streaming needs messages of at least 1 byte".to_string());
    }
    if proto == Proto::Tcp {
        check_size(proto, msg)?;
    }
    let core = |side: usize| if side == 0 { cores.0 } else { cores.1 };
    let ctl = StreamCtl {
        go: AtomicBool::new(false),
        abort: AtomicBool::new(false),
        sender_done: [AtomicBool::new(false), AtomicBool::new(false)],
    };
    let ctl = &ctl;
    std::thread::scope(|s| {
        let mut receivers = Vec::new();
        let mut senders = Vec::new();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let mut setup: Result<(), String> = Ok(());
        for (d, &(from, to)) in dirs.iter().enumerate() {
            let (port_tx, port_rx) = mpsc::channel();
            receivers.push(s.spawn(move || {
                let r = stream_receiver(
                    pair,
                    proto,
                    to,
                    core(to),
                    d,
                    ctl,
                    &port_tx,
                    sending,
                    (base, warmup),
                );
                if let Err(e) = &r {
                    let _ = port_tx.send(Err(e.clone()));
                }
                r
            }));
            let port = match port_rx.recv_timeout(SETUP_TIMEOUT) {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => {
                    setup = Err(e);
                    break;
                }
                Err(_) => {
                    setup = Err("stream receiver did not bind within 5 s".to_string());
                    break;
                }
            };
            let peer = SocketAddr::from((pair.ip[to], port));
            let ready_tx = ready_tx.clone();
            senders.push(s.spawn(move || {
                stream_sender(
                    pair,
                    proto,
                    msg,
                    from,
                    core(from),
                    peer,
                    d,
                    ctl,
                    &ready_tx,
                    (sending, max_msgs),
                )
            }));
        }
        drop(ready_tx);
        if setup.is_ok() {
            for _ in 0..senders.len() {
                match ready_rx.recv_timeout(SETUP_TIMEOUT) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        setup = Err(e);
                        break;
                    }
                    Err(_) => {
                        setup = Err("stream sender did not connect within 5 s".to_string());
                        break;
                    }
                }
            }
        }
        // When the senders start, on the receivers' clock.
        let go_ns = base.elapsed().as_nanos() as u64;
        if setup.is_ok() {
            ctl.go.store(true, Ordering::Release);
        } else {
            ctl.abort.store(true, Ordering::Release);
        }
        let mut first_err = setup.err();
        let mut sent = 0u64;
        for h in senders {
            match h
                .join()
                .unwrap_or_else(|_| Err("stream sender panicked".to_string()))
            {
                Ok(n) => sent += n,
                Err(e) => {
                    ctl.abort.store(true, Ordering::Release);
                    first_err.get_or_insert(format!("sender: {e}"));
                }
            }
        }
        let mut total = StreamResult::default();
        let mut span: Option<(u64, u64)> = None;
        for h in receivers {
            match h
                .join()
                .unwrap_or_else(|_| Err("stream receiver panicked".to_string()))
            {
                Ok(r) => {
                    let (mut m, mut first, mut last) = r.measured();
                    if max_msgs.is_some() {
                        // Cut short by --iters: measured whole, from the
                        // senders' start.
                        m = crate::session::Stream {
                            bytes: r.arrived_bytes,
                            msgs: r.arrived,
                            secs: 0.0,
                        };
                        (first, last) = (go_ns, r.last_arrival());
                    }
                    // Messages measured and in all: a datagram each, or whole
                    // messages of the TCP byte stream.
                    let (measured, all) = match proto {
                        Proto::Udp => (m.msgs, r.arrived),
                        Proto::Tcp => (m.bytes / msg as u64, r.arrived_bytes / msg as u64),
                    };
                    total.bytes += m.bytes;
                    total.msgs += measured;
                    total.received += all;
                    if r.arrived > 0 {
                        span =
                            Some(span.map_or((first, last), |(f, l)| (f.min(first), l.max(last))));
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(format!("receiver: {e}"));
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if span.is_none() {
            return Err(format!("{proto:?} stream: the receiver got nothing"));
        }
        total.seconds = span.map_or(0.0, |(f, l)| (l - f) as f64 / 1e9);
        total.sent = sent;
        Ok(total)
    })
}

/// Receiving end of one stream direction `dir`: enters namespace `side`,
/// binds, reports its port, then counts what arrives until the sender is done.
#[allow(clippy::too_many_arguments)]
fn stream_receiver(
    pair: &VethPair,
    proto: Proto,
    side: usize,
    core: Option<CoreId>,
    dir: usize,
    ctl: &StreamCtl,
    port_tx: &mpsc::Sender<Result<u16, String>>,
    duration: Duration,
    (base, warmup): (Instant, Duration),
) -> Result<Received, String> {
    pair.enter(side)?;
    if let Some(c) = core {
        core_affinity::set_for_current(c);
    }
    // Nothing may keep a receiver beyond the run plus generous slack.
    let deadline = Instant::now() + duration + SETUP_TIMEOUT + Duration::from_secs(30);
    let mut r = Received::default();
    let warmup = warmup.as_nanos() as u64;
    let mut note = |n: usize| {
        let now = base.elapsed().as_nanos() as u64;
        r.note(now, 1, n as u64, warmup);
    };
    match proto {
        Proto::Tcp => {
            let listener =
                TcpListener::bind((pair.ip[side], 0)).map_err(|e| format!("TCP bind: {e}"))?;
            let port = listener.local_addr().map_err(|e| e.to_string())?.port();
            let _ = port_tx.send(Ok(port));
            let mut conn = match accept_one(&listener, &ctl.abort) {
                Ok(c) => c,
                Err(_) if ctl.abort.load(Ordering::Acquire) => return Ok(Received::default()),
                Err(e) => return Err(e),
            };
            drop(listener);
            conn.set_read_timeout(Some(POLL))
                .map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                match conn.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => note(n),
                    Err(e) if is_timeout(&e) || e.kind() == ErrorKind::Interrupted => {
                        if ctl.abort.load(Ordering::Acquire) {
                            break;
                        }
                        if Instant::now() > deadline {
                            return Err("TCP stream did not end in time".to_string());
                        }
                    }
                    Err(e) => return Err(format!("TCP stream read: {e}")),
                }
            }
        }
        Proto::Udp => {
            let sock = UdpSocket::bind((pair.ip[side], 0)).map_err(|e| format!("UDP bind: {e}"))?;
            set_rcvbuf(&sock, 8 << 20);
            let port = sock.local_addr().map_err(|e| e.to_string())?.port();
            sock.set_read_timeout(Some(POLL))
                .map_err(|e| e.to_string())?;
            let _ = port_tx.send(Ok(port));
            let mut buf = vec![0u8; UDP_MAX + 1];
            loop {
                match sock.recv(&mut buf) {
                    Ok(n) => note(n),
                    Err(e) if is_timeout(&e) || e.kind() == ErrorKind::Interrupted => {
                        // Idle for POLL after the sender finished: all that will come has.
                        if ctl.sender_done[dir].load(Ordering::Acquire)
                            || ctl.abort.load(Ordering::Acquire)
                        {
                            break;
                        }
                        if Instant::now() > deadline {
                            return Err("UDP stream did not end in time".to_string());
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                    Err(e) => return Err(format!("UDP stream recv: {e}")),
                }
            }
        }
    }
    Ok(r)
}

/// Sending end of stream direction `dir`: enters namespace `side`, connects,
/// reports ready, waits for `go`, then sends `msg`-byte messages for `duration`.
/// Returns the number of messages sent.
#[allow(clippy::too_many_arguments)]
fn stream_sender(
    pair: &VethPair,
    proto: Proto,
    msg: usize,
    side: usize,
    core: Option<CoreId>,
    peer: SocketAddr,
    dir: usize,
    ctl: &StreamCtl,
    ready_tx: &mpsc::Sender<Result<(), String>>,
    (duration, max_msgs): (Duration, Option<u64>),
) -> Result<u64, String> {
    /// Marks the direction's sender done however the sender returns.
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let _done = Done(&ctl.sender_done[dir]);
    let fail = |e: String| {
        let _ = ready_tx.send(Err(e.clone()));
        e
    };
    pair.enter(side).map_err(fail)?;
    if let Some(c) = core {
        core_affinity::set_for_current(c);
    }
    enum Sock {
        Tcp(TcpStream),
        Udp(UdpSocket),
    }
    let mut sock = match proto {
        Proto::Tcp => {
            let c = connect(peer).map_err(fail)?;
            c.set_write_timeout(Some(READ_TIMEOUT))
                .map_err(|e| fail(e.to_string()))?;
            Sock::Tcp(c)
        }
        Proto::Udp => {
            let u =
                UdpSocket::bind((pair.ip[side], 0)).map_err(|e| fail(format!("UDP bind: {e}")))?;
            u.connect(peer)
                .map_err(|e| fail(format!("UDP connect: {e}")))?;
            Sock::Udp(u)
        }
    };
    let _ = ready_tx.send(Ok(()));
    while !ctl.go.load(Ordering::Acquire) {
        if ctl.abort.load(Ordering::Acquire) {
            return Ok(0);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    let len = if proto == Proto::Udp {
        msg.min(UDP_MAX)
    } else {
        msg
    };
    let buf = vec![0xa5u8; len];
    let start = Instant::now();
    let mut sent = 0u64;
    let limit = max_msgs.unwrap_or(u64::MAX);
    while sent < limit && start.elapsed() < duration && !ctl.abort.load(Ordering::Relaxed) {
        match &mut sock {
            Sock::Tcp(c) => {
                c.write_all(&buf)
                    .map_err(|e| format!("TCP stream write: {e}"))?;
                sent += 1;
            }
            Sock::Udp(u) => match u.send(&buf) {
                Ok(_) => sent += 1,
                // Receiver queue full: the datagram is dropped, try the next.
                Err(e) if e.raw_os_error() == Some(Errno::ENOBUFS as i32) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(format!("UDP stream send: {e}")),
            },
        }
    }
    if let Sock::Tcp(c) = &sock {
        let _ = c.shutdown(std::net::Shutdown::Write);
    }
    Ok(sent)
}

/// Raises a UDP socket's receive buffer to `bytes` (`SO_RCVBUFFORCE` as root,
/// past `net.core.rmem_max`); failures leave the default.
fn set_rcvbuf(sock: &UdpSocket, bytes: usize) {
    if setsockopt(sock, sockopt::RcvBufForce, &bytes).is_err() {
        let _ = setsockopt(sock, sockopt::RcvBuf, &bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long enough duration that `max_iters` ends the measurement.
    const LONG: Duration = Duration::from_secs(30);

    /// Payload Gbit/s of a streaming result.
    fn gbit(r: &StreamResult) -> f64 {
        r.bytes as f64 * 8.0 / r.seconds / 1e9
    }

    fn pair() -> VethPair {
        VethPair::create(1500).expect("create veth pair")
    }

    #[test]
    fn udp_pingpong_8_bytes() {
        let pair = pair();
        let r = pingpong(
            &pair,
            Proto::Udp,
            8,
            Duration::from_millis(20),
            LONG,
            Some(1000),
            (None, None),
        )
        .expect("UDP ping-pong");
        assert_eq!(r.hist.len(), 1000);
        assert!(r.hist.value_at_quantile(0.5) > 0);
        eprintln!(
            "UDP 8 B RTT p50 {:.1} us p99 {:.1} us losses {}",
            r.hist.value_at_quantile(0.5) as f64 / 1e3,
            r.hist.value_at_quantile(0.99) as f64 / 1e3,
            r.losses
        );
    }

    #[test]
    fn tcp_pingpong_8_bytes() {
        let pair = pair();
        let h = pingpong(
            &pair,
            Proto::Tcp,
            8,
            Duration::from_millis(20),
            LONG,
            Some(1000),
            (None, None),
        )
        .expect("TCP ping-pong")
        .hist;
        assert_eq!(h.len(), 1000);
        assert!(h.value_at_quantile(0.5) > 0);
        eprintln!(
            "TCP 8 B RTT p50 {:.1} us",
            h.value_at_quantile(0.5) as f64 / 1e3
        );
    }

    #[test]
    fn pingpong_odd_sizes() {
        let pair = pair();
        for (proto, size) in [
            (Proto::Udp, 0),
            (Proto::Udp, 5),
            (Proto::Udp, UDP_MAX),
            (Proto::Tcp, 0),
            (Proto::Tcp, 1 << 20),
        ] {
            let h = pingpong(
                &pair,
                proto,
                size,
                Duration::ZERO,
                LONG,
                Some(20),
                (None, None),
            )
            .unwrap_or_else(|e| panic!("{proto:?} {size}: {e}"))
            .hist;
            assert_eq!(h.len(), 20, "{proto:?} {size}");
        }
    }

    #[test]
    fn pingpong_restores_namespace_and_affinity() {
        let pair = pair();
        let ino = || {
            let m = std::fs::metadata("/proc/thread-self/ns/net").unwrap();
            std::os::unix::fs::MetadataExt::ino(&m)
        };
        let mask = || {
            let set = sched_getaffinity(Pid::from_raw(0)).unwrap();
            (0..CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .count()
        };
        let (ns_before, cpus_before) = (ino(), mask());
        let ids = core_affinity::get_core_ids().unwrap_or_default();
        let cores = (ids.first().copied(), ids.last().copied());
        pingpong(&pair, Proto::Udp, 8, Duration::ZERO, LONG, Some(10), cores).unwrap();
        assert_eq!(ino(), ns_before);
        assert_eq!(mask(), cpus_before);
    }

    #[test]
    fn udp_too_large_is_refused() {
        let pair = pair();
        let e = pingpong(
            &pair,
            Proto::Udp,
            UDP_MAX + 1,
            Duration::ZERO,
            LONG,
            Some(1),
            (None, None),
        )
        .unwrap_err();
        assert!(e.contains("65507"), "{e}");
        let e = pingpong(
            &pair,
            Proto::Tcp,
            TCP_MAX + 1,
            Duration::ZERO,
            LONG,
            Some(1),
            (None, None),
        )
        .unwrap_err();
        assert!(e.contains("8 MiB"), "{e}");
    }

    #[test]
    fn udp_loss_is_counted_and_resent() {
        let pair = pair();
        let stop = AtomicBool::new(false);
        let r = std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            let (pair, stop) = (&pair, &stop);
            // An echo that drops the first datagram it gets.
            s.spawn(move || {
                pair.enter(1).unwrap();
                let sock = UdpSocket::bind((pair.ip[1], 0)).unwrap();
                sock.set_read_timeout(Some(POLL)).unwrap();
                tx.send(sock.local_addr().unwrap().port()).unwrap();
                let mut buf = [0u8; 64];
                let mut seen = 0;
                while !stop.load(Ordering::Acquire) {
                    if let Ok((n, from)) = sock.recv_from(&mut buf) {
                        seen += 1;
                        if seen > 1 {
                            sock.send_to(&buf[..n], from).unwrap();
                        }
                    }
                }
            });
            let port = rx.recv().unwrap();
            // Set however this side ends (a panic too): the echo then stops.
            let _stop = SetOnDrop(stop);
            let r = {
                let _ns = enter_guard(pair, 0).unwrap();
                ping_udp(
                    pair.ip[0],
                    SocketAddr::from((pair.ip[1], port)),
                    SPIN_BUDGET,
                    8,
                    Duration::ZERO,
                    LONG,
                    Some(3),
                )
            };
            r
        })
        .expect("UDP ping-pong with a lost datagram");
        assert_eq!(r.losses, 1);
        assert_eq!(r.hist.len(), 3);
    }

    /// A reply to a request that was given up arrives after its resend
    /// (held in a switch, say): it is not the resend's reply. The echo holds
    /// the first request until the resend comes, answers it at once, and the
    /// resend 50 ms later; the round trip must take the 50 ms. (Loopback: no
    /// namespace needed. 2 s: the wait before a resend.)
    #[test]
    fn udp_late_reply_to_a_resent_request_is_not_taken() {
        for size in [8, 3] {
            let echo = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            echo.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let at = echo.local_addr().unwrap();
            let r = std::thread::scope(|s| {
                s.spawn(|| {
                    let mut first = [0u8; 64];
                    let mut second = [0u8; 64];
                    let (n, from) = echo.recv_from(&mut first).unwrap();
                    let (m, _) = echo.recv_from(&mut second).unwrap();
                    echo.send_to(&first[..n], from).unwrap();
                    std::thread::sleep(Duration::from_millis(50));
                    echo.send_to(&second[..m], from).unwrap();
                });
                ping_udp(
                    Ipv4Addr::LOCALHOST,
                    at,
                    Duration::ZERO,
                    size,
                    Duration::ZERO,
                    LONG,
                    Some(1),
                )
            })
            .expect("UDP ping-pong with a resend");
            assert_eq!(r.losses, 1);
            assert!(
                r.hist.min() >= 50_000_000,
                "{size} B: timed {} ns: the late reply was taken",
                r.hist.min()
            );
        }
    }

    #[test]
    fn tcp_echo_dying_is_an_error_not_a_hang() {
        let pair = pair();
        let t0 = Instant::now();
        let stop = AtomicBool::new(false);
        let r = std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            let (pair, stop) = (&pair, &stop);
            // An echo that answers once, then closes. (Its accept gives up
            // when the pinger has: it waited for good on a pinger that
            // could not connect.)
            s.spawn(move || {
                pair.enter(1).unwrap();
                let l = TcpListener::bind((pair.ip[1], 0)).unwrap();
                tx.send(l.local_addr().unwrap().port()).unwrap();
                let Ok(mut c) = accept_one(&l, stop) else {
                    return;
                };
                let mut buf = [0u8; 8];
                c.read_exact(&mut buf).unwrap();
                c.write_all(&buf).unwrap();
            });
            let port = rx.recv().unwrap();
            let _stop = SetOnDrop(stop);
            let _ns = enter_guard(pair, 0).unwrap();
            ping_tcp(
                SocketAddr::from((pair.ip[1], port)),
                SPIN_BUDGET,
                8,
                Duration::ZERO,
                LONG,
                Some(100),
            )
        });
        let e = r.expect_err("ping-pong against a closed echo");
        assert!(
            e.contains("closed") || e.contains("reset") || e.contains("Broken pipe"),
            "{e}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "took {:?}",
            t0.elapsed()
        );
    }

    /// 20 ms of warm-up, 200 measured.
    const PACED: StreamPace = StreamPace {
        warmup: Duration::from_millis(20),
        duration: Duration::from_millis(200),
        max_msgs: None,
    };

    /// A stream cut short by a message count sends that many, and is
    /// measured whole from the senders' start: a 40-message TCP stream
    /// arrives in a read or two, which its arrivals alone cannot time.
    #[test]
    fn streams_of_a_few_messages() {
        let pair = pair();
        let few = StreamPace {
            max_msgs: Some(40),
            ..PACED
        };
        for (proto, size) in [(Proto::Tcp, 64), (Proto::Tcp, 64 << 10), (Proto::Udp, 1000)] {
            let r = stream(&pair, proto, size, few, (None, None)).expect("stream");
            assert_eq!(r.sent, 40, "{proto:?} {size}: {r:?}");
            assert!(
                r.received <= 40 && r.received > 0,
                "{proto:?} {size}: {r:?}"
            );
            assert_eq!(r.msgs, r.received, "{proto:?} {size}: {r:?}");
            assert_eq!(r.bytes, r.msgs * size as u64, "{proto:?} {size}: {r:?}");
            assert!(
                r.seconds > 0.0 && r.seconds < 1.0,
                "{proto:?} {size}: {r:?}"
            );
        }
        let b = bibw(&pair, Proto::Tcp, 4096, few, (None, None)).expect("bibw");
        assert_eq!((b.sent, b.received, b.msgs), (80, 80, 80), "{b:?}");
        assert!(b.seconds > 0.0, "{b:?}");
    }

    #[test]
    fn tcp_stream_200ms() {
        let pair = pair();
        let r = stream(&pair, Proto::Tcp, 64 << 10, PACED, (None, None)).expect("TCP stream");
        assert!(r.bytes > 0);
        assert!(r.seconds > 0.05 && r.seconds < 5.0, "{r:?}");
        assert!(r.sent > 0 && r.received <= r.sent, "{r:?}");
        // Every message written was received (TCP), give or take the last
        // partial one; what was measured is some of it.
        assert!(r.received + 1 >= r.sent, "{r:?}");
        assert!(
            r.msgs < r.received && r.bytes <= r.received * (64 << 10),
            "{r:?}"
        );
        let gbps = r.bytes as f64 * 8.0 / r.seconds / 1e9;
        eprintln!(
            "TCP stream 64 KiB: {gbps:.2} Gbit/s over {:.3} s",
            r.seconds
        );
    }

    #[test]
    fn udp_stream_and_bibw() {
        let pair = pair();
        let r = stream(&pair, Proto::Udp, 1472, PACED, (None, None)).expect("UDP stream");
        assert!(r.received > 0 && r.received <= r.sent, "{r:?}");
        assert!(r.msgs > 0 && r.msgs < r.received, "{r:?}");
        assert_eq!(r.bytes, r.msgs * 1472);
        eprintln!(
            "UDP stream 1472 B: {:.2} Gbit/s, lost {} of {}",
            gbit(&r),
            r.sent - r.received,
            r.sent
        );
        let b = bibw(&pair, Proto::Tcp, 64 << 10, PACED, (None, None)).expect("TCP bibw");
        assert!(b.bytes > 0 && b.seconds > 0.05, "{b:?}");
        eprintln!("TCP bibw 64 KiB: {:.2} Gbit/s", gbit(&b));
    }
}
