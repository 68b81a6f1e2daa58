//! The packet I/O seam: "receive a burst of frames, transmit a burst of
//! frames", and nothing else. The runtime drives the protocol core through it;
//! what is on the other side is a DPDK port queue ([`DpdkIo`]), an in-memory
//! network for tests ([`MemNetwork`]), or one of the wrappers that go around
//! either: [`Faulty`] (seeded drop, duplicate, reorder, corrupt, delay,
//! adjustable while running) and [`PcapRecorder`] (every frame to a pcap file).
//!
//! The seam owns frame memory: it hands out empty frames to build, takes them
//! back to send, and hands received frames out to be read and dropped. Headers
//! are written in place ([`PacketIo::put`]); payloads are attached
//! ([`PacketIo::attach`]), with no copy where the link can point a frame at
//! registered memory. Bursts live in `Vec`s the caller reserves once, so the
//! fast path never allocates.
//!
//! This module must not know the protocol: it moves bytes.

/// Writes the [`PacketIo`] methods that a link wrapper passes through
/// unchanged to its `inner` link. Bare, everything but `recv` and `send`,
/// which a wrapper exists to change; with a list of methods, only those, for
/// a wrapper that changes others too and writes them itself:
/// `delegate_packet_io!(put, truncate, duplicate, mac, max_frame, stats)`.
/// Use it inside `impl PacketIo for YourWrapper`.
#[macro_export]
macro_rules! delegate_packet_io {
    (@one alloc) => {
        fn alloc(&mut self) -> Result<Self::Frame, $crate::io::IoError> {
            self.inner.alloc()
        }
    };
    (@one put) => {
        fn put<'f>(
            &mut self,
            frame: &'f mut Self::Frame,
            len: usize,
        ) -> Result<&'f mut [u8], $crate::io::IoError> {
            self.inner.put(frame, len)
        }
    };
    (@one truncate) => {
        fn truncate(&mut self, frame: &mut Self::Frame, len: usize) {
            self.inner.truncate(frame, len)
        }
    };
    (@one attach) => {
        fn attach(
            &mut self,
            frame: &mut Self::Frame,
            payload: $crate::io::Payload<'_>,
        ) -> Result<(), $crate::io::IoError> {
            self.inner.attach(frame, payload)
        }
    };
    (@one duplicate) => {
        fn duplicate(&mut self, frame: &Self::Frame) -> Option<Self::Frame> {
            self.inner.duplicate(frame)
        }
    };
    (@one release) => {
        fn release(&mut self, frames: &mut Vec<Self::Frame>) {
            self.inner.release(frames)
        }
    };
    (@one reclaim) => {
        fn reclaim(&mut self) {
            self.inner.reclaim()
        }
    };
    (@one mac) => {
        fn mac(&self) -> $crate::io::Mac {
            self.inner.mac()
        }
    };
    (@one max_frame) => {
        fn max_frame(&self) -> usize {
            self.inner.max_frame()
        }
    };
    (@one copy_below) => {
        fn copy_below(&self) -> usize {
            self.inner.copy_below()
        }
    };
    (@one stats) => {
        fn stats(&self) -> $crate::io::IoStats {
            self.inner.stats()
        }
    };
    (@one enter_thread) => {
        fn enter_thread(
            &self,
        ) -> Result<Option<$crate::io::dpdk_ffi::ThreadRegistration>, $crate::io::IoError> {
            self.inner.enter_thread()
        }
    };
    () => {
        $crate::delegate_packet_io!(
            alloc,
            put,
            truncate,
            attach,
            duplicate,
            release,
            reclaim,
            mac,
            max_frame,
            copy_below,
            stats,
            enter_thread
        );
    };
    ($($method:ident),+ $(,)?) => {
        $($crate::delegate_packet_io!(@one $method);)+
    };
}

mod dpdk;
mod fault;
mod mem;
mod pcap;

pub use dpdk::{DpdkIo, COPY_BELOW};
pub use fault::{FaultConfig, FaultHandle, FaultStats, Faulty};
pub use mem::{MemFrame, MemIo, MemNetwork};
pub use pcap::PcapRecorder;

/// The DPDK layer this seam is built on, for the types its API names.
pub use dpdk_ffi;
use dpdk_ffi::ExtBuf;

/// Ethernet MAC address.
pub type Mac = [u8; 6];

/// What went wrong at the seam.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// No frame buffer is free (the mempool is exhausted). Shared text: a
    /// link meets this over and over under pressure, and says it with no
    /// allocation.
    #[error("no free frame buffer: {0}")]
    NoBuffer(std::sync::Arc<str>),
    /// The frame would exceed the link's maximum frame size.
    #[error("frame of {wanted} bytes exceeds the link's maximum of {max}")]
    TooLong {
        /// Bytes the frame would have.
        wanted: usize,
        /// The link's maximum frame size.
        max: usize,
    },
    /// The port and pool cannot make a link (what is wrong and the fix).
    #[error("{0}")]
    Setup(String),
    /// A DPDK call failed.
    #[error(transparent)]
    Dpdk(#[from] dpdk_ffi::Error),
    /// Writing a capture failed.
    #[error("pcap capture: {0}")]
    Capture(#[from] std::io::Error),
}

/// Checks that a frame of `len` bytes growing by `add` stays within `max`.
#[inline]
pub(crate) fn check_room(len: usize, add: usize, max: usize) -> Result<(), IoError> {
    match len.checked_add(add) {
        Some(wanted) if wanted <= max => Ok(()),
        wanted => Err(IoError::TooLong {
            wanted: wanted.unwrap_or(usize::MAX),
            max,
        }),
    }
}

/// Where a frame's payload comes from.
#[derive(Clone, Copy, Debug)]
pub enum Payload<'a> {
    /// Bytes copied into the frame.
    Copy(&'a [u8]),
    /// A slice of registered memory: attached without a copy where the link
    /// can (DPDK external buffers) and the slice is long enough to be worth
    /// it ([`COPY_BELOW`]), copied otherwise. The buffer cannot be
    /// written while frames refer to it.
    Registered {
        /// The registered buffer.
        buf: &'a ExtBuf,
        /// Start of the slice in the buffer.
        offset: usize,
        /// Length of the slice.
        len: usize,
    },
}

impl Payload<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Payload::Copy(b) => b.len(),
            Payload::Registered { len, .. } => *len,
        }
    }

    /// True for an empty payload.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, wherever they live.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Payload::Copy(b) => b,
            Payload::Registered { buf, offset, len } => &buf.as_slice()[*offset..*offset + *len],
        }
    }
}

/// A frame the seam handed out: received, or being built to send.
pub trait Frame {
    /// Bytes in the whole frame.
    fn len(&self) -> usize;
    /// True for an empty frame.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The frame's bytes when they are contiguous (one segment), which is what
    /// received frames normally are.
    fn contiguous(&self) -> Option<&[u8]>;
    /// Copies the whole frame into `out` (cleared first), across segments.
    fn copy_to(&self, out: &mut Vec<u8>);
    /// The bytes to modify in place, when the frame owns them (one direct
    /// segment): where the driver writes each header (and the fault
    /// injector corrupts frames).
    fn bytes_mut(&mut self) -> Option<&mut [u8]>;
    /// The first segment's bytes to modify in place, when the frame owns
    /// them: all of a one-segment frame, the head (the header, and the
    /// payload's start) of a chained one. Where the fault injector flips
    /// bits.
    fn first_segment_mut(&mut self) -> Option<&mut [u8]> {
        self.bytes_mut()
    }
    /// Keeps this (contiguous) frame for the application, which reads bytes
    /// `offset..offset + len` of it in place.
    ///
    /// # Panics
    /// When the range is not within [`contiguous`](Frame::contiguous).
    fn into_lent(self, offset: usize, len: usize) -> Lent;
}

/// A message lent to the application in the frame it arrived in: no byte was
/// copied. The frame goes back to its link's pool when this is dropped, so a
/// lent message should not be kept long: each holds one of the port's receive
/// buffers.
pub struct Lent {
    frame: LentFrame,
    // u32: a frame is far shorter; and it keeps RecvBuf as small as before.
    offset: u32,
    len: u32,
}

enum LentFrame {
    Mbuf(dpdk_ffi::Mbuf),
    // A boxed slice, so that a lent message is 24 bytes and a RecvBuf stays
    // 32: receive buffers are moved on every completion.
    Bytes(Box<[u8]>),
}

impl Lent {
    fn new(frame: LentFrame, offset: usize, len: usize) -> Lent {
        let l = Lent {
            frame,
            offset: u32::try_from(offset).expect("frame offsets fit in u32"),
            len: u32::try_from(len).expect("frame lengths fit in u32"),
        };
        assert!(
            offset + len <= l.frame_bytes().len(),
            "lent range {offset}+{len} beyond the frame"
        );
        l
    }

    fn frame_bytes(&self) -> &[u8] {
        match &self.frame {
            LentFrame::Mbuf(m) => m.data(),
            LentFrame::Bytes(b) => b,
        }
    }

    /// The message.
    pub fn as_slice(&self) -> &[u8] {
        let o = self.offset as usize;
        &self.frame_bytes()[o..o + self.len as usize]
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True for an empty message.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::ops::Deref for Lent {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.frame {
            LentFrame::Mbuf(_) => "mbuf",
            LentFrame::Bytes(_) => "bytes",
        };
        f.debug_struct("Lent")
            .field("frame", &kind)
            .field("len", &self.len)
            .finish()
    }
}

/// Counters kept by every seam implementation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Frames received.
    pub rx_frames: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Frames received in several segments (a jumbo frame on buffers smaller
    /// than it), which the driver reads through a copy: a larger pool data
    /// room avoids it.
    pub rx_chained: u64,
    /// Frames the link accepted for transmission.
    pub tx_frames: u64,
    /// Bytes the link accepted for transmission.
    pub tx_bytes: u64,
    /// Transmit attempts that found the link full (frames left for a retry).
    pub tx_full: u64,
    /// Transmit rounds that found no buffer to build a frame in (the frames
    /// waited): the pool is too small for the traffic, or the application
    /// holds many lent receives, whose frames stay out of the pool.
    pub tx_no_buffer: u64,
    /// Payload bytes copied into frames.
    pub payload_copied: u64,
    /// Payload bytes attached from registered memory without a copy.
    pub payload_attached: u64,
}

/// Burst-oriented packet I/O: the one seam between the engine and a link.
pub trait PacketIo {
    /// The frame type of this link.
    type Frame: Frame;

    /// Receives up to `max` frames, appended to `out` (never growing it past
    /// its capacity). Returns how many arrived.
    fn recv(&mut self, out: &mut Vec<Self::Frame>, max: usize) -> usize;

    /// Transmits from the front of `frames`. Frames the link took are removed;
    /// the rest stay at the front for a later call. Returns how many it took.
    fn send(&mut self, frames: &mut Vec<Self::Frame>) -> usize;

    /// A new, empty frame to build.
    fn alloc(&mut self) -> Result<Self::Frame, IoError>;

    /// Gives frames back to the link, emptying `frames` (they would go
    /// one by one when dropped; a link may free a burst at once).
    fn release(&mut self, frames: &mut Vec<Self::Frame>) {
        frames.clear();
    }

    /// Lets go of frames the link transmitted but still holds (a NIC frees
    /// them lazily, when it needs their ring slots), with what they refer
    /// to: registered memory attached to them is writable again once every
    /// frame lets go of it. The driver calls it before it hands back a
    /// registered send's buffer that frames still refer to.
    fn reclaim(&mut self) {}

    /// Appends `len` writable bytes to the frame (where a header is written in
    /// place) and returns them.
    fn put<'f>(&mut self, frame: &'f mut Self::Frame, len: usize) -> Result<&'f mut [u8], IoError>;

    /// Shortens the frame to `len` bytes (no-op when it is not longer). Only
    /// bytes of its last segment may go: call it before [`attach`](Self::attach)
    /// chains a payload behind the header.
    fn truncate(&mut self, frame: &mut Self::Frame, len: usize);

    /// Appends a payload to the frame: attached with no copy where the link
    /// can, copied otherwise.
    fn attach(&mut self, frame: &mut Self::Frame, payload: Payload<'_>) -> Result<(), IoError>;

    /// A copy of a frame (for duplication on purpose), or `None` when no
    /// buffer is free.
    fn duplicate(&mut self, frame: &Self::Frame) -> Option<Self::Frame>;

    /// The link's MAC address.
    fn mac(&self) -> Mac;

    /// Largest frame in bytes, Ethernet header included (MTU + 14).
    fn max_frame(&self) -> usize;

    /// Payloads shorter than this are copied into the frame by
    /// [`attach`](Self::attach) whatever memory they are in, so the builder
    /// of a frame may as well copy them itself, behind the header
    /// ([`Core::set_copy_below`](crate::proto::Core::set_copy_below)). The
    /// default, for links that copy every payload: no limit.
    fn copy_below(&self) -> usize {
        usize::MAX
    }

    /// The counters.
    fn stats(&self) -> IoStats;

    /// Called on a thread that will drive this link (a polling thread), before
    /// any other call there; what it returns lives as long as the thread
    /// drives the link. DPDK links register the thread, giving it mempool
    /// caches.
    fn enter_thread(&self) -> Result<Option<dpdk_ffi::ThreadRegistration>, IoError> {
        Ok(None)
    }
}
