//! Wire format: Ethernet II framing and the emx header.
//!
//! This module owns the byte layout of every emx frame and nothing else: it parses
//! untrusted bytes into a checked view ([`Frame`]) and a typed [`Header`], and emits a
//! [`Header`] in place into a caller's buffer. It keeps no state, allocates nothing and
//! never panics on input bytes; every field that the protocol relies on (lengths, offsets,
//! version, frame type, reserved bits, checksum) is validated here, and a frame that fails
//! is reported with a [`DropReason`] so that the caller can count it.
//!
//! # Layout
//!
//! ```text
//! Ethernet II (14 bytes): dst MAC 6 | src MAC 6 | EtherType 2 (default 0x88B5)
//! emx header (76 bytes, big-endian):
//!  0 u8  version            1 u8  frame type        2 u8  flags        3 u8 reserved (0)
//!  4 u16 cluster id         6 u16 payload length
//!  8 u16 src node          10 u8  src endpoint     11 u8  dst endpoint
//! 12 u16 dst node          14 u16 fragment unit (EAGER, RTS, PULL_DATA; else 0)
//! 16 u32 src epoch (sender's session epoch)
//! 20 u32 dst epoch (the epoch the sender believes the receiver has; 0 = unknown)
//! 24 u32 sequence number (reliable frames only)
//! 28 u32 cumulative ack (next sequence number expected from the receiver of this frame)
//! 32 u64 selective-ack bitmap (bit i: sequence ack+1+i received)
//! 40 u32 credit limit (cumulative eager bytes the peer may have charged)
//! 44 u32 message id (per sender/receiver pair)
//! 48 u64 match bits
//! 56 u64 message length (for PULL: the length of the pulled block)
//! 64 u64 fragment offset (for PULL: the offset of the pulled block)
//! 72 u32 checksum (CRC-32C of the Ethernet source MAC and EtherType and header bytes
//!     0..72, then the payload in full mode; see the flags)
//! 76 payload (payload length bytes, EAGER, PULL_DATA and PACK only), then Ethernet padding
//! ```
//!
//! # Fragments
//!
//! A sender cuts a message into fragments of its frame payload, its *fragment unit*,
//! which every EAGER, RTS and PULL_DATA frame names: fragment `k` covers bytes
//! `[k * unit, (k + 1) * unit)`, the last one up to the message's end (for rendezvous
//! data, the end of what the receiver pulls, whose blocks are whole units). The
//! receiver keeps which fragments arrived by index, so a fragment that repeats bytes is
//! refused however it came, and a sender whose MTU is below its receiver's can send to
//! it (nothing negotiates an MTU: a larger frame would not fit the receiver's port). The
//! unit is at least [`MIN_FRAG_UNIT`].
//!
//! The header is fixed-size so that a frame's payload always starts at the same offset
//! and a polling core can attach a payload buffer behind it without computing anything.
//! Control frames carry no body: everything they say fits in the header.
//!
//! # Packs
//!
//! A PACK frame carries several whole small messages to one peer, so that a burst of
//! them costs one frame, one sequence number and one acknowledgement instead of one
//! each. Its header gives the first message's id in `message id` (the others follow in
//! order) and the number of messages in `message length`; match bits and fragment
//! offset are zero. The payload is one record per message, back to back:
//!
//! ```text
//!  0 u64 match bits        8 u16 message length    10 the message's bytes
//! ```
//!
//! The records are headers too: a PACK whose header is checksummed has its payload
//! checksummed as well.

use core::fmt;

/// Length of an Ethernet II header.
pub const ETH_HEADER_LEN: usize = 14;
/// Length of the emx header that follows the Ethernet header.
pub const EMX_HEADER_LEN: usize = 76;
/// Bytes in front of a payload: Ethernet plus emx header.
pub const FRAME_HEADER_LEN: usize = ETH_HEADER_LEN + EMX_HEADER_LEN;
/// The emx EtherType by default (IEEE 802 local experimental EtherType 1).
pub const DEFAULT_ETHERTYPE: u16 = 0x88B5;
/// The only header version this crate speaks (2: frames name their fragment unit;
/// 3: the checksum is CRC-32C; 4: it covers the source MAC and EtherType too; 5:
/// WITHDRAW, and NOTIFY's WITHDRAWN flag: a peer of version 4 would refuse a WITHDRAW
/// unacknowledged, and its sender's stream would stall on it).
pub const VERSION: u8 = 5;
/// The smallest fragment unit a frame may name: the payload of the smallest MTU taken.
pub const MIN_FRAG_UNIT: u16 = 64;
/// Largest message length the header may announce (1 TiB); anything larger is a lie.
pub const MAX_MSG_LEN: u64 = 1 << 40;

/// Byte offsets of the fields, relative to the start of the Ethernet frame.
mod field {
    use core::ops::Range;

    pub const ETH_DST: Range<usize> = 0..6;
    pub const ETH_SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;

    const B: usize = super::ETH_HEADER_LEN;
    pub const VERSION: usize = B;
    pub const TYPE: usize = B + 1;
    pub const FLAGS: usize = B + 2;
    pub const RESERVED0: usize = B + 3;
    pub const CLUSTER: Range<usize> = B + 4..B + 6;
    pub const PAYLOAD_LEN: Range<usize> = B + 6..B + 8;
    pub const SRC_NODE: Range<usize> = B + 8..B + 10;
    pub const SRC_EP: usize = B + 10;
    pub const DST_EP: usize = B + 11;
    pub const DST_NODE: Range<usize> = B + 12..B + 14;
    pub const FRAG_UNIT: Range<usize> = B + 14..B + 16;
    pub const SRC_EPOCH: Range<usize> = B + 16..B + 20;
    pub const DST_EPOCH: Range<usize> = B + 20..B + 24;
    pub const SEQ: Range<usize> = B + 24..B + 28;
    pub const ACK: Range<usize> = B + 28..B + 32;
    pub const SACK: Range<usize> = B + 32..B + 40;
    pub const CREDIT: Range<usize> = B + 40..B + 44;
    pub const MSG_ID: Range<usize> = B + 44..B + 48;
    pub const MATCH_BITS: Range<usize> = B + 48..B + 56;
    pub const MSG_LEN: Range<usize> = B + 56..B + 64;
    pub const FRAG_OFFSET: Range<usize> = B + 64..B + 72;
    pub const CHECKSUM: Range<usize> = B + 72..B + 76;
    pub const PAYLOAD: usize = B + 76;
}

/// What the header checksum covers: the source MAC and the EtherType as well
/// as the emx header, because a core takes the peer's address from the source
/// MAC (and learns it, for a peer added without one), and a link without a
/// frame check sequence (memif, a fault injector) would otherwise hand it a
/// damaged one. Ten 8-byte words. The destination MAC is the link's business:
/// a frame that reaches the wrong endpoint is refused by the header's node and
/// endpoint, which are covered.
const CHECKSUMMED: core::ops::Range<usize> = field::ETH_SRC.start..field::CHECKSUM.start;

/// A 48-bit Ethernet MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// `ff:ff:ff:ff:ff:ff`. Given as a peer's address it means "not known
    /// yet": the core says HELLO to everyone on the segment and learns the
    /// address from the peer's first frame.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// Whether this is one station's address (not group, not all zeros).
    pub fn is_unicast(&self) -> bool {
        self.0[0] & 1 == 0 && self.0 != [0; 6]
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// What a frame is for. Reliable frames occupy the per-pair sequence space; the others
/// are never retransmitted and carry no sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameType {
    /// Session handshake: announces the sender's epoch (unreliable).
    Hello = 0x01,
    /// Acknowledgement and credit update with nothing else to say; with
    /// [`flags::ACK_REQ`] it is a keepalive probe that asks for an immediate ack.
    Ack = 0x02,
    /// One fragment of an eager message (reliable, carries payload).
    Eager = 0x10,
    /// Rendezvous request-to-send: match bits and length of a large message (reliable).
    Rts = 0x11,
    /// Rendezvous pull: the receiver asks for a block of a message (reliable).
    Pull = 0x12,
    /// Rendezvous data answering a pull (reliable, carries payload).
    PullData = 0x13,
    /// Rendezvous notify: the receiver has all the data it wants (reliable);
    /// with [`flags::WITHDRAWN`], it dropped the message unmatched, as a
    /// WITHDRAW asked.
    Notify = 0x14,
    /// Several whole eager messages in one frame (reliable, carries their records; see
    /// the module docs).
    Pack = 0x15,
    /// Rendezvous withdraw: the sender asks the receiver to drop message `message id`
    /// (announced, acknowledged, never pulled) if no receive took it yet (reliable). The
    /// receiver answers with a NOTIFY, [`flags::WITHDRAWN`] if it dropped the message;
    /// one that a receive took already is pulled as usual.
    Withdraw = 0x16,
}

impl FrameType {
    /// Decodes a frame type byte.
    #[inline]
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x01 => Self::Hello,
            0x02 => Self::Ack,
            0x10 => Self::Eager,
            0x11 => Self::Rts,
            0x12 => Self::Pull,
            0x13 => Self::PullData,
            0x14 => Self::Notify,
            0x15 => Self::Pack,
            0x16 => Self::Withdraw,
            _ => return None,
        })
    }

    /// Whether frames of this type occupy the sequence space and are retransmitted.
    #[inline]
    pub fn is_reliable(self) -> bool {
        !matches!(self, Self::Hello | Self::Ack)
    }

    /// Whether frames of this type may carry payload bytes.
    #[inline]
    pub fn has_payload(self) -> bool {
        matches!(self, Self::Eager | Self::PullData | Self::Pack)
    }
}

/// Bytes in front of each message in a PACK frame: match bits (8) and length (2).
pub const PACK_RECORD_LEN: usize = 10;

/// The messages of a PACK frame's payload, in order, as `(match bits, bytes)`.
///
/// [`Packed::new`] checks the records against the count the header gives;
/// [`Header::parse`] does so for every PACK, so a parsed frame's records can be walked
/// without checks. Walking never panics, whatever the bytes: it stops at the first
/// record that does not fit.
///
/// ```
/// use emx::wire::{write_pack_record, Packed};
/// let mut buf = [0u8; 64];
/// let mut n = write_pack_record(&mut buf, 7, b"ab");
/// n += write_pack_record(&mut buf[n..], 9, b"");
/// let recs: Vec<_> = Packed::new(&buf[..n], 2).unwrap().collect();
/// assert_eq!(recs, [(7, &b"ab"[..]), (9, &b""[..])]);
/// assert!(Packed::new(&buf[..n], 3).is_err());
/// ```
#[derive(Clone, Debug)]
pub struct Packed<'a> {
    rest: &'a [u8],
}

impl<'a> Packed<'a> {
    /// Checks that `payload` is exactly `count` whole records.
    pub fn new(payload: &'a [u8], count: u64) -> Result<Packed<'a>, DropReason> {
        let mut walk = Packed { rest: payload };
        let mut n = 0u64;
        while !walk.rest.is_empty() {
            if walk.next().is_none() {
                return Err(DropReason::BadLength);
            }
            n += 1;
        }
        if n != count {
            return Err(DropReason::BadLength);
        }
        Ok(Packed { rest: payload })
    }

    /// The records of a payload taken as they are (one that [`Header::parse`] checked
    /// already); a walk stops at the first record that does not fit.
    pub fn unchecked(payload: &'a [u8]) -> Packed<'a> {
        Packed { rest: payload }
    }
}

impl<'a> Iterator for Packed<'a> {
    type Item = (u64, &'a [u8]);

    #[inline]
    fn next(&mut self) -> Option<(u64, &'a [u8])> {
        let head = self.rest.get(..PACK_RECORD_LEN)?;
        let len = usize::from(be16(head, 8..10));
        let data = self.rest.get(PACK_RECORD_LEN..PACK_RECORD_LEN + len)?;
        let bits = be64(head, 0..8);
        self.rest = &self.rest[PACK_RECORD_LEN + len..];
        Some((bits, data))
    }
}

/// Writes one PACK record (`match_bits`, then `data`'s length and bytes) at the start
/// of `buf` and returns the bytes written, [`PACK_RECORD_LEN`] + `data.len()`.
///
/// # Panics
/// When `buf` is too short or `data` longer than 65535 bytes (a caller bug).
#[inline]
pub fn write_pack_record(buf: &mut [u8], match_bits: u64, data: &[u8]) -> usize {
    let len = u16::try_from(data.len()).expect("a packed message fits a frame");
    let end = PACK_RECORD_LEN + data.len();
    let b = &mut buf[..end];
    b[..8].copy_from_slice(&match_bits.to_be_bytes());
    b[8..10].copy_from_slice(&len.to_be_bytes());
    b[PACK_RECORD_LEN..].copy_from_slice(data);
    end
}

/// Header flag bits.
pub mod flags {
    /// The checksum field covers the header.
    pub const CSUM_HEADER: u8 = 0x01;
    /// The checksum field also covers the payload.
    pub const CSUM_PAYLOAD: u8 = 0x02;
    /// The sender asks for an immediate acknowledgement (keepalive probe, handshake).
    pub const ACK_REQ: u8 = 0x04;
    /// On a NOTIFY only: the receiver dropped the message unmatched, as its sender's
    /// WITHDRAW asked (the send ends cancelled).
    pub const WITHDRAWN: u8 = 0x08;
    /// All flag bits this version defines.
    pub const ALL: u8 = CSUM_HEADER | CSUM_PAYLOAD | ACK_REQ | WITHDRAWN;
}

/// Why a received frame was dropped (a frame-level protocol violation or a frame that is
/// not for this core). Used as an index into [`DropCounters`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[repr(u8)]
pub enum DropReason {
    /// Shorter than an Ethernet + emx header, or than its payload length says.
    #[error("truncated frame")]
    Truncated = 0,
    /// Not our EtherType.
    #[error("not an emx EtherType")]
    EtherType,
    /// Unknown header version.
    #[error("unknown header version")]
    Version,
    /// Unknown frame type.
    #[error("unknown frame type")]
    FrameType,
    /// Reserved bits or bytes not zero, or fields that contradict each other.
    #[error("malformed header")]
    Malformed,
    /// A length or offset that lies (past the message, or a message too large).
    #[error("length or offset out of bounds")]
    BadLength,
    /// The checksum does not match, or a checksum that the receiver requires is absent.
    #[error("bad or missing checksum")]
    Checksum,
    /// Another cluster's frame.
    #[error("frame of another cluster")]
    WrongCluster,
    /// Addressed to another node, endpoint or MAC, or from a MAC that is not the
    /// sending peer's.
    #[error("frame for another endpoint, or from the wrong MAC")]
    NotForUs,
    /// From a node/endpoint that is not in the peer table.
    #[error("frame from an unknown peer")]
    UnknownPeer,
    /// From, or addressed to, a session epoch that is not the current one.
    #[error("frame of another session epoch")]
    StaleEpoch,
    /// A sequence number beyond the receive window.
    #[error("sequence number beyond the window")]
    OutOfWindow,
    /// Well-formed but meaningless in the current protocol state (data for a message
    /// that does not exist, credits overrun, an ack for frames never sent).
    #[error("frame contradicts the protocol state")]
    Protocol,
    /// From a peer that was declared unreachable (its session is over).
    #[error("frame from a peer declared unreachable")]
    DeadPeer,
    /// No table entry free to take the frame; it is not acknowledged, so the sender
    /// sends it again later.
    #[error("no resources to take the frame")]
    Resources,
}

impl DropReason {
    /// Number of reasons (the length of a counter array).
    pub const COUNT: usize = 15;
    /// Every reason, in index order.
    pub const ALL: [DropReason; Self::COUNT] = [
        Self::Truncated,
        Self::EtherType,
        Self::Version,
        Self::FrameType,
        Self::Malformed,
        Self::BadLength,
        Self::Checksum,
        Self::WrongCluster,
        Self::NotForUs,
        Self::UnknownPeer,
        Self::StaleEpoch,
        Self::OutOfWindow,
        Self::Protocol,
        Self::DeadPeer,
        Self::Resources,
    ];
}

/// Frames dropped, counted by [`DropReason`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropCounters(pub [u64; DropReason::COUNT]);

impl DropCounters {
    /// Counts one drop.
    #[inline]
    pub fn count(&mut self, r: DropReason) {
        self.0[r as usize] += 1;
    }
    /// Drops counted for one reason.
    pub fn get(&self, r: DropReason) -> u64 {
        self.0[r as usize]
    }
    /// All drops.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

#[inline]
fn be16(b: &[u8], r: core::ops::Range<usize>) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[r]);
    u16::from_be_bytes(a)
}
#[inline]
fn be32(b: &[u8], r: core::ops::Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    u32::from_be_bytes(a)
}
#[inline]
fn be64(b: &[u8], r: core::ops::Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_be_bytes(a)
}

/// The frame checksum: CRC-32C (Castagnoli), with the CPU's CRC instruction
/// where it has one. It catches every error of up to three bits and every
/// burst of up to 32 bits in what it covers, wherever they fall; the sums it
/// replaced (a Fletcher-style pair over 64-bit words, wrapping at 2^64) let
/// the top bits of two words changed in opposite directions cancel, and the
/// same lane stuck in every word of some lengths. Feed the header first,
/// then the payload, in pieces of any length.
#[derive(Debug, Clone, Copy, Default)]
pub struct Checksum {
    crc: u32,
}

impl Checksum {
    /// An empty checksum.
    #[inline]
    pub fn new() -> Self {
        Checksum::default()
    }

    /// Adds bytes.
    #[inline]
    pub fn add(&mut self, data: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        if data.len() <= SHORT && std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU has SSE4.2, which is all `crc_short` needs.
            #[allow(unsafe_code)]
            {
                self.crc = unsafe { crc_short(self.crc, data) };
            }
            return;
        }
        self.crc = crc32c::crc32c_append(self.crc, data);
    }

    /// The 32-bit value.
    #[inline]
    pub fn finish(self) -> u32 {
        self.crc
    }
}

/// Up to this many bytes (a header), [`Checksum::add`] runs the CPU's CRC
/// instruction over them word by word, in line: the crate's general routine,
/// built for long buffers in three interleaved streams, costs several times
/// as much on a 72-byte header that starts off an 8-byte boundary.
const SHORT: usize = 256;

/// CRC-32C of `data` continued from `crc` (as [`crc32c::crc32c_append`]
/// computes it), one 8-byte word at a time, unaligned loads.
///
/// # Safety
/// The CPU must have SSE4.2.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "sse4.2")]
unsafe fn crc_short(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut s = u64::from(!crc);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        s = _mm_crc32_u64(s, w);
    }
    let mut s = s as u32;
    for &b in words.remainder() {
        s = _mm_crc32_u8(s, b);
    }
    !s
}

/// A zero-copy view of an emx frame (Ethernet header included).
///
/// Build it with [`Frame::new_checked`]: once that succeeds, every accessor is in bounds
/// and none can panic, whatever the bytes are.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checking it. Accessors may panic until
    /// [`check_len`](Self::check_len) has succeeded.
    pub fn new_unchecked(buffer: T) -> Self {
        Frame { buffer }
    }

    /// Wraps a buffer and checks that the header and the announced payload fit in it.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, DropReason> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// Checks that the buffer holds the headers and the payload length it announces.
    #[inline]
    pub fn check_len(&self) -> Result<(), DropReason> {
        let b = self.buffer.as_ref();
        if b.len() < field::PAYLOAD {
            return Err(DropReason::Truncated);
        }
        if b.len() < field::PAYLOAD + self.payload_len() as usize {
            return Err(DropReason::Truncated);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination MAC address.
    pub fn dst_mac(&self) -> MacAddr {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.buffer.as_ref()[field::ETH_DST]);
        MacAddr(m)
    }
    /// Source MAC address.
    pub fn src_mac(&self) -> MacAddr {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.buffer.as_ref()[field::ETH_SRC]);
        MacAddr(m)
    }
    /// EtherType.
    pub fn ethertype(&self) -> u16 {
        be16(self.buffer.as_ref(), field::ETHERTYPE)
    }
    /// Header version.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }
    /// Raw frame type byte.
    pub fn frame_type_raw(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }
    /// Flag bits.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// Cluster id.
    pub fn cluster(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CLUSTER)
    }
    /// Payload length.
    pub fn payload_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::PAYLOAD_LEN)
    }
    /// Sequence number.
    pub fn seq(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SEQ)
    }
    /// Checksum field.
    pub fn checksum(&self) -> u32 {
        be32(self.buffer.as_ref(), field::CHECKSUM)
    }
    /// The payload bytes (exactly payload length, Ethernet padding excluded).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let n = self.payload_len() as usize;
        &self.buffer.as_ref()[field::PAYLOAD..field::PAYLOAD + n]
    }

    /// Computes the checksum the frame should carry, covering the payload when its flags
    /// say so.
    #[inline]
    pub fn compute_checksum(&self) -> u32 {
        let b = self.buffer.as_ref();
        let mut c = Checksum::new();
        c.add(&b[CHECKSUMMED]);
        if self.flags() & flags::CSUM_PAYLOAD != 0 {
            c.add(self.payload());
        }
        c.finish()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Writes the checksum field over the header and, when the flags ask for it,
    /// `payload` (which may live elsewhere: zero-copy sends keep it in the send buffer).
    #[inline]
    pub fn fill_checksum(&mut self, payload: &[u8]) {
        let b = self.buffer.as_mut();
        let mut c = Checksum::new();
        c.add(&b[CHECKSUMMED]);
        if b[field::FLAGS] & flags::CSUM_PAYLOAD != 0 {
            c.add(payload);
        }
        b[field::CHECKSUM].copy_from_slice(&c.finish().to_be_bytes());
    }
}

/// Reads the destination node and endpoint of a frame without parsing it, for a
/// demultiplexer that hands each frame to the core owning that endpoint.
///
/// Checks only that `frame` holds a whole Ethernet + emx header ([`FRAME_HEADER_LEN`]
/// bytes) and that its EtherType is `ethertype`; `None` otherwise. Nothing else is
/// validated (version, checksum, lengths): the owning core's [`Header::parse`] still
/// judges the frame, so a peek is only a routing hint and costs a few loads.
#[inline]
pub fn peek_dst(frame: &[u8], ethertype: u16) -> Option<(u16, u8)> {
    // One length check up front lets the compiler drop the bounds checks below.
    let b = frame.get(..FRAME_HEADER_LEN)?;
    if be16(b, field::ETHERTYPE) != ethertype {
        return None;
    }
    Some((be16(b, field::DST_NODE), b[field::DST_EP]))
}

/// The typed emx header (the part after Ethernet, plus both MAC addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Destination MAC.
    pub dst_mac: MacAddr,
    /// Source MAC.
    pub src_mac: MacAddr,
    /// Frame type.
    pub frame_type: FrameType,
    /// Flag bits ([`flags`]).
    pub flags: u8,
    /// Cluster id: frames of other clusters sharing the wire are dropped.
    pub cluster: u16,
    /// Payload bytes following the header.
    pub payload_len: u16,
    /// Source node.
    pub src_node: u16,
    /// Source endpoint.
    pub src_ep: u8,
    /// Destination node.
    pub dst_node: u16,
    /// Destination endpoint.
    pub dst_ep: u8,
    /// Sender's session epoch.
    pub src_epoch: u32,
    /// The epoch the sender believes the receiver has (0: not known yet).
    pub dst_epoch: u32,
    /// Sequence number (reliable frames).
    pub seq: u32,
    /// Cumulative ack: the next sequence number expected from the frame's receiver.
    pub ack: u32,
    /// Selective ack: bit i set when sequence `ack + 1 + i` was received.
    pub sack: u64,
    /// Cumulative eager credit limit granted to the frame's receiver, in bytes.
    pub credit: u32,
    /// Message id (per ordered pair of endpoints).
    pub msg_id: u32,
    /// Match bits.
    pub match_bits: u64,
    /// Message length (PULL: block length).
    pub msg_len: u64,
    /// Fragment offset (PULL: block offset).
    pub frag_offset: u64,
    /// EAGER, RTS, PULL_DATA: the sender's fragment unit (see [Fragments](self#fragments)).
    pub frag_unit: u16,
}

impl Header {
    /// Parses and validates a checked frame. `ethertype` is the one configured.
    ///
    /// Validates everything that can be judged from the frame alone: EtherType, version,
    /// type, flags and reserved bits, lengths and offsets, and the checksum when present
    /// (`require_csum` makes an absent header checksum an error).
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(
        frame: &Frame<T>,
        ethertype: u16,
        require_csum: bool,
    ) -> Result<Header, DropReason> {
        let mut h = Header::EMPTY;
        Header::parse_into(frame, ethertype, require_csum, &mut h)?;
        Ok(h)
    }

    /// A header with every field zero (a HELLO type), to parse into.
    pub const EMPTY: Header = Header {
        dst_mac: MacAddr([0; 6]),
        src_mac: MacAddr([0; 6]),
        frame_type: FrameType::Hello,
        flags: 0,
        cluster: 0,
        payload_len: 0,
        src_node: 0,
        src_ep: 0,
        dst_node: 0,
        dst_ep: 0,
        src_epoch: 0,
        dst_epoch: 0,
        seq: 0,
        ack: 0,
        sack: 0,
        credit: 0,
        msg_id: 0,
        match_bits: 0,
        msg_len: 0,
        frag_offset: 0,
        frag_unit: 0,
    };

    /// [`parse`](Self::parse) into `h`, field by field. On the receive path
    /// this is the form to use: the header is written where it will be read,
    /// with stores each later read forwards from, rather than built and then
    /// moved with wide loads that cannot (a stall that waits for every older
    /// store, such as the previous frame's payload copy, to reach the cache).
    /// After an error, `h` holds whatever had been read.
    #[inline]
    pub fn parse_into<T: AsRef<[u8]>>(
        frame: &Frame<T>,
        ethertype: u16,
        require_csum: bool,
        h: &mut Header,
    ) -> Result<(), DropReason> {
        let b = frame.buffer.as_ref();
        if frame.ethertype() != ethertype {
            return Err(DropReason::EtherType);
        }
        if frame.version() != VERSION {
            return Err(DropReason::Version);
        }
        let ft = FrameType::from_u8(frame.frame_type_raw()).ok_or(DropReason::FrameType)?;
        let fl = frame.flags();
        if fl & !flags::ALL != 0
            || b[field::RESERVED0] != 0
            || (fl & flags::CSUM_PAYLOAD != 0 && fl & flags::CSUM_HEADER == 0)
        {
            return Err(DropReason::Malformed);
        }
        if fl & flags::CSUM_HEADER != 0 {
            if frame.compute_checksum() != frame.checksum() {
                return Err(DropReason::Checksum);
            }
        } else if require_csum {
            return Err(DropReason::Checksum);
        }
        h.dst_mac = frame.dst_mac();
        h.src_mac = frame.src_mac();
        h.frame_type = ft;
        h.flags = fl;
        h.cluster = frame.cluster();
        h.payload_len = frame.payload_len();
        h.src_node = be16(b, field::SRC_NODE);
        h.src_ep = b[field::SRC_EP];
        h.dst_node = be16(b, field::DST_NODE);
        h.dst_ep = b[field::DST_EP];
        h.src_epoch = be32(b, field::SRC_EPOCH);
        h.dst_epoch = be32(b, field::DST_EPOCH);
        h.seq = be32(b, field::SEQ);
        h.ack = be32(b, field::ACK);
        h.sack = be64(b, field::SACK);
        h.credit = be32(b, field::CREDIT);
        h.msg_id = be32(b, field::MSG_ID);
        h.match_bits = be64(b, field::MATCH_BITS);
        h.msg_len = be64(b, field::MSG_LEN);
        h.frag_offset = be64(b, field::FRAG_OFFSET);
        h.frag_unit = be16(b, field::FRAG_UNIT);
        h.validate(ft)?;
        if ft == FrameType::Pack {
            Packed::new(frame.payload(), h.msg_len)?;
        }
        Ok(())
    }

    #[inline]
    fn validate(&self, ft: FrameType) -> Result<(), DropReason> {
        if self.src_epoch == 0 || (self.flags & flags::WITHDRAWN != 0 && ft != FrameType::Notify) {
            return Err(DropReason::Malformed);
        }
        if !ft.has_payload() && self.payload_len != 0 {
            return Err(DropReason::Malformed);
        }
        if !ft.is_reliable() && self.seq != 0 {
            return Err(DropReason::Malformed);
        }
        if ft.is_reliable() && self.dst_epoch == 0 {
            // Data may only flow once the sender knows which incarnation it talks to.
            return Err(DropReason::Malformed);
        }
        if self.frag_unit != 0
            && !matches!(ft, FrameType::Eager | FrameType::PullData | FrameType::Rts)
        {
            return Err(DropReason::Malformed);
        }
        match ft {
            FrameType::Eager | FrameType::PullData => {
                if self.msg_len > MAX_MSG_LEN {
                    return Err(DropReason::BadLength);
                }
                let end = self
                    .frag_offset
                    .checked_add(self.payload_len as u64)
                    .ok_or(DropReason::BadLength)?;
                if end > self.msg_len {
                    return Err(DropReason::BadLength);
                }
                // Only a zero-length message travels as an empty fragment.
                if self.payload_len == 0 && (self.msg_len != 0 || ft == FrameType::PullData) {
                    return Err(DropReason::BadLength);
                }
                // One whole fragment of the sender's unit: eager fragments are
                // whole up to the message's end, on the unit's grid; rendezvous
                // data is whole up to the end of what the receiver pulled, and
                // the receiver, which knows where its pulls start, checks the
                // rest (without a division per frame).
                let unit = u64::from(self.frag_unit);
                let eager = ft == FrameType::Eager;
                if self.frag_unit < MIN_FRAG_UNIT
                    || u64::from(self.payload_len) > unit
                    || (eager && end != self.msg_len && u64::from(self.payload_len) != unit)
                    || (eager && self.frag_offset != 0 && self.frag_offset % unit != 0)
                {
                    return Err(DropReason::BadLength);
                }
            }
            FrameType::Rts => {
                if self.msg_len > MAX_MSG_LEN || self.frag_offset != 0 {
                    return Err(DropReason::BadLength);
                }
                if self.frag_unit < MIN_FRAG_UNIT {
                    return Err(DropReason::BadLength);
                }
            }
            FrameType::Pull => {
                if self.msg_len == 0
                    || self.msg_len > u32::MAX as u64
                    || !matches!(self.frag_offset.checked_add(self.msg_len), Some(e) if e <= MAX_MSG_LEN)
                {
                    return Err(DropReason::BadLength);
                }
            }
            FrameType::Hello | FrameType::Ack | FrameType::Notify | FrameType::Withdraw => {
                if self.frag_offset != 0 || self.msg_len != 0 {
                    return Err(DropReason::Malformed);
                }
            }
            FrameType::Pack => {
                if self.frag_offset != 0
                    || self.match_bits != 0
                    || (self.flags & flags::CSUM_HEADER != 0
                        && self.flags & flags::CSUM_PAYLOAD == 0)
                {
                    return Err(DropReason::Malformed);
                }
                if self.msg_len == 0
                    || self.msg_len > (self.payload_len as usize / PACK_RECORD_LEN) as u64
                {
                    return Err(DropReason::BadLength);
                }
            }
        }
        Ok(())
    }

    /// Writes Ethernet and emx headers into the start of `buf` (which must hold at least
    /// [`FRAME_HEADER_LEN`] bytes) and returns the number of bytes written. The checksum
    /// field is written as zero: call [`Frame::fill_checksum`] afterwards when the flags
    /// ask for one.
    ///
    /// # Panics
    /// When `buf` is shorter than [`FRAME_HEADER_LEN`] (a caller bug, not input data).
    #[inline]
    pub fn emit(&self, buf: &mut [u8], ethertype: u16) -> usize {
        let b = &mut buf[..FRAME_HEADER_LEN];
        b[field::ETH_DST].copy_from_slice(&self.dst_mac.0);
        b[field::ETH_SRC].copy_from_slice(&self.src_mac.0);
        b[field::ETHERTYPE].copy_from_slice(&ethertype.to_be_bytes());
        b[field::VERSION] = VERSION;
        b[field::TYPE] = self.frame_type as u8;
        b[field::FLAGS] = self.flags;
        b[field::RESERVED0] = 0;
        b[field::CLUSTER].copy_from_slice(&self.cluster.to_be_bytes());
        b[field::PAYLOAD_LEN].copy_from_slice(&self.payload_len.to_be_bytes());
        b[field::SRC_NODE].copy_from_slice(&self.src_node.to_be_bytes());
        b[field::SRC_EP] = self.src_ep;
        b[field::DST_EP] = self.dst_ep;
        b[field::DST_NODE].copy_from_slice(&self.dst_node.to_be_bytes());
        b[field::FRAG_UNIT].copy_from_slice(&self.frag_unit.to_be_bytes());
        b[field::SRC_EPOCH].copy_from_slice(&self.src_epoch.to_be_bytes());
        b[field::DST_EPOCH].copy_from_slice(&self.dst_epoch.to_be_bytes());
        b[field::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        b[field::ACK].copy_from_slice(&self.ack.to_be_bytes());
        b[field::SACK].copy_from_slice(&self.sack.to_be_bytes());
        b[field::CREDIT].copy_from_slice(&self.credit.to_be_bytes());
        b[field::MSG_ID].copy_from_slice(&self.msg_id.to_be_bytes());
        b[field::MATCH_BITS].copy_from_slice(&self.match_bits.to_be_bytes());
        b[field::MSG_LEN].copy_from_slice(&self.msg_len.to_be_bytes());
        b[field::FRAG_OFFSET].copy_from_slice(&self.frag_offset.to_be_bytes());
        b[field::CHECKSUM].fill(0);
        FRAME_HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            dst_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            src_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            frame_type: FrameType::Eager,
            flags: flags::CSUM_HEADER | flags::CSUM_PAYLOAD,
            cluster: 7,
            payload_len: 5,
            src_node: 2,
            src_ep: 1,
            dst_node: 1,
            dst_ep: 0,
            src_epoch: 9,
            dst_epoch: 4,
            seq: 100,
            ack: 55,
            sack: 0b101,
            credit: 65536,
            msg_id: 3,
            match_bits: 0xdead_beef_0000_0001,
            msg_len: 133,
            frag_offset: 128,
            frag_unit: 64,
        }
    }

    fn build(h: &Header, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; FRAME_HEADER_LEN + payload.len()];
        h.emit(&mut v, DEFAULT_ETHERTYPE);
        v[FRAME_HEADER_LEN..].copy_from_slice(payload);
        let mut f = Frame::new_unchecked(&mut v[..]);
        f.fill_checksum(payload);
        v
    }

    #[test]
    fn roundtrip() {
        let h = sample();
        let v = build(&h, b"hello");
        let f = Frame::new_checked(&v[..]).unwrap();
        assert_eq!(Header::parse(&f, DEFAULT_ETHERTYPE, true), Ok(h));
        assert_eq!(f.payload(), b"hello");
    }

    #[test]
    fn every_single_bit_flip_is_caught() {
        let v = build(&sample(), b"hello");
        // From the source MAC on: a core learns a peer's address from it
        // (the destination's is the link's business: see CHECKSUMMED).
        for i in field::ETH_SRC.start * 8..v.len() * 8 {
            let mut w = v.clone();
            w[i / 8] ^= 1 << (i % 8);
            let r =
                Frame::new_checked(&w[..]).and_then(|f| Header::parse(&f, DEFAULT_ETHERTYPE, true));
            assert!(r.is_err(), "bit {i} flip undetected");
        }
    }

    /// A frame whose header and 64-byte payload are both checksummed, and a
    /// parse of any bytes as one.
    fn full_frame() -> Vec<u8> {
        let mut h = sample();
        h.payload_len = 64;
        h.frag_offset = 0;
        build(&h, &[0x10; 64])
    }

    fn parse(v: &[u8]) -> Result<Header, DropReason> {
        Frame::new_checked(v).and_then(|f| Header::parse(&f, DEFAULT_ETHERTYPE, true))
    }

    #[test]
    fn same_lane_cancellation_is_caught() {
        // +1 in one word and -1 in the same byte lane of another: a plain sum misses it.
        let v = full_frame();
        assert!(parse(&v).is_ok(), "the frame as sent");
        let mut w = v.clone();
        w[FRAME_HEADER_LEN] += 1;
        w[FRAME_HEADER_LEN + 8] -= 1;
        assert_eq!(parse(&w), Err(DropReason::Checksum));
    }

    /// Changes in the top bits of two words that the sums this checksum
    /// replaced let cancel (they wrapped at 2^64): bit 63 of two payload
    /// words an even number of words apart, the same in the header (the low
    /// bytes of the ack and the message id), and a lane stuck at 1 in every
    /// word of a payload whose word count is a multiple of 4.
    #[test]
    fn top_bit_changes_that_cancel_in_sums_are_caught() {
        let v = full_frame();
        assert!(parse(&v).is_ok(), "the frame as sent");
        let mut w = v.clone();
        w[FRAME_HEADER_LEN + 7] ^= 0x80;
        w[FRAME_HEADER_LEN + 23] ^= 0x80;
        assert_eq!(parse(&w), Err(DropReason::Checksum));
        let mut w = v.clone();
        w[31] ^= 0x80;
        w[47] ^= 0x80;
        assert_eq!(parse(&w), Err(DropReason::Checksum));
        let mut w = v.clone();
        for k in 0..8 {
            w[FRAME_HEADER_LEN + 8 * k + 7] |= 0x80;
        }
        assert_eq!(parse(&w), Err(DropReason::Checksum));
    }

    /// The short path (the CPU's instruction, in line) computes what the
    /// crate does, for every length up to past its limit and any start.
    #[test]
    fn the_short_path_is_crc32c() {
        let data: Vec<u8> = (0..400u32).map(|i| ((i * 37) ^ (i >> 3)) as u8).collect();
        for start in [0usize, 1, 3, 7, 14] {
            for len in 0..(SHORT + 40).min(data.len() - start) {
                let bytes = &data[start..start + len];
                let mut c = Checksum::new();
                c.add(&bytes[..len / 3]);
                c.add(&bytes[len / 3..]);
                assert_eq!(
                    c.finish(),
                    crc32c::crc32c(bytes),
                    "start {start}, {len} bytes"
                );
            }
        }
        // The standard check value.
        let mut c = Checksum::new();
        c.add(b"123456789");
        assert_eq!(c.finish(), 0xE306_9283);
    }

    /// Every error of two bits in the header and a 64-byte payload is caught.
    #[test]
    fn every_two_bit_error_is_caught() {
        let v = full_frame();
        let bits = field::ETH_SRC.start * 8..v.len() * 8;
        for i in bits.clone() {
            for j in bits.clone().filter(|&j| j > i) {
                let mut w = v.clone();
                w[i / 8] ^= 1 << (i % 8);
                w[j / 8] ^= 1 << (j % 8);
                assert!(parse(&w).is_err(), "bits {i} and {j} flipped undetected");
            }
        }
    }

    #[test]
    fn peek_dst_reads_an_emitted_header() {
        let mut h = sample();
        h.dst_node = 0xBEEF;
        h.dst_ep = 0xA5;
        h.src_node = 0x1234;
        h.src_ep = 0x5A;
        let v = build(&h, b"hello");
        assert_eq!(peek_dst(&v, DEFAULT_ETHERTYPE), Some((0xBEEF, 0xA5)));
        // A bare header (a control frame) is long enough.
        assert_eq!(
            peek_dst(&v[..FRAME_HEADER_LEN], DEFAULT_ETHERTYPE),
            Some((0xBEEF, 0xA5))
        );
        // The peek agrees with the full parse.
        let f = Frame::new_checked(&v[..]).unwrap();
        let p = Header::parse(&f, DEFAULT_ETHERTYPE, true).unwrap();
        assert_eq!(
            peek_dst(&v, DEFAULT_ETHERTYPE),
            Some((p.dst_node, p.dst_ep))
        );
    }

    #[test]
    fn peek_dst_refuses_short_frames_and_other_ethertypes() {
        let v = build(&sample(), b"hello");
        for n in 0..FRAME_HEADER_LEN {
            assert_eq!(peek_dst(&v[..n], DEFAULT_ETHERTYPE), None, "length {n}");
        }
        assert_eq!(peek_dst(&v, 0x0800), None);
        let mut w = v.clone();
        w[12] ^= 0x01;
        assert_eq!(peek_dst(&w, DEFAULT_ETHERTYPE), None);
        // A configured EtherType other than the default is honoured.
        let mut x = vec![0u8; FRAME_HEADER_LEN];
        sample().emit(&mut x, 0x88B6);
        assert_eq!(peek_dst(&x, 0x88B6), Some((1, 0)));
        assert_eq!(peek_dst(&x, DEFAULT_ETHERTYPE), None);
    }

    fn pack_header(count: u64, payload: &[u8]) -> Header {
        Header {
            frame_type: FrameType::Pack,
            match_bits: 0,
            frag_offset: 0,
            frag_unit: 0,
            msg_len: count,
            payload_len: payload.len() as u16,
            ..sample()
        }
    }

    #[test]
    fn packs_parse_only_when_their_records_add_up() {
        let mut p = vec![0u8; 64];
        let mut n = write_pack_record(&mut p, 1, b"abc");
        n += write_pack_record(&mut p[n..], 2, b"");
        n += write_pack_record(&mut p[n..], u64::MAX, b"z");
        p.truncate(n);
        let v = build(&pack_header(3, &p), &p);
        let f = Frame::new_checked(&v[..]).unwrap();
        assert_eq!(
            Header::parse(&f, DEFAULT_ETHERTYPE, true),
            Ok(pack_header(3, &p))
        );
        let recs: Vec<_> = Packed::new(f.payload(), 3).unwrap().collect();
        assert_eq!(
            recs,
            [(1, &b"abc"[..]), (2, &b""[..]), (u64::MAX, &b"z"[..])]
        );
        for (count, why) in [
            (2, DropReason::BadLength),
            (4, DropReason::BadLength),
            (0, DropReason::BadLength),
        ] {
            let v = build(&pack_header(count, &p), &p);
            let f = Frame::new_checked(&v[..]).unwrap();
            assert_eq!(
                Header::parse(&f, DEFAULT_ETHERTYPE, true),
                Err(why),
                "{count}"
            );
        }
        // Every cut through the records, with the header telling the same lie.
        for cut in 0..p.len() {
            let q = &p[..cut];
            let v = build(&pack_header(3, q), q);
            let f = Frame::new_checked(&v[..]).unwrap();
            assert!(
                Header::parse(&f, DEFAULT_ETHERTYPE, true).is_err(),
                "cut {cut}"
            );
            // Walking unchecked records stops short, never panics.
            assert!(Packed::unchecked(q).count() < 3);
        }
        // Checksummed header, unchecksummed records.
        let mut h = pack_header(3, &p);
        h.flags = flags::CSUM_HEADER;
        let v = build(&h, &p);
        let f = Frame::new_checked(&v[..]).unwrap();
        assert_eq!(
            Header::parse(&f, DEFAULT_ETHERTYPE, true),
            Err(DropReason::Malformed)
        );
    }

    /// Fragments are whole units of the sender's fragment size (the last
    /// one up to the end), named by every frame that carries one.
    #[test]
    fn fragments_are_whole_units() {
        let check = |f: &dyn Fn(&mut Header), payload: &[u8]| {
            let mut h = sample();
            h.payload_len = payload.len() as u16;
            f(&mut h);
            let v = build(&h, payload);
            Header::parse(
                &Frame::new_checked(&v[..]).unwrap(),
                DEFAULT_ETHERTYPE,
                true,
            )
            .map(|_| ())
        };
        let mid = |h: &mut Header| h.frag_offset = 64;
        assert_eq!(check(&mid, &[1; 64]), Ok(()));
        // Short before the end, off the grid, more than a unit, no unit.
        assert_eq!(check(&mid, &[1; 63]), Err(DropReason::BadLength));
        let off = |h: &mut Header| h.frag_offset = 65;
        assert_eq!(check(&off, &[1; 64]), Err(DropReason::BadLength));
        let long = |h: &mut Header| h.frag_offset = 0;
        assert_eq!(check(&long, &[1; 65]), Err(DropReason::BadLength));
        let small = |h: &mut Header| {
            h.frag_unit = MIN_FRAG_UNIT - 1;
            h.frag_offset = 0;
        };
        assert_eq!(check(&small, &[1; 5]), Err(DropReason::BadLength));
        // Rendezvous data may end short where the receiver's pull ended.
        let data = |h: &mut Header| {
            h.frame_type = FrameType::PullData;
            h.frag_offset = 64;
        };
        assert_eq!(check(&data, &[1; 10]), Ok(()));
        // An RTS names its unit; a control frame has none.
        let rts = |unit| {
            move |h: &mut Header| {
                h.frame_type = FrameType::Rts;
                h.frag_offset = 0;
                h.frag_unit = unit;
            }
        };
        assert_eq!(check(&rts(64), &[]), Ok(()));
        assert_eq!(check(&rts(0), &[]), Err(DropReason::BadLength));
        let ack = |h: &mut Header| {
            h.frame_type = FrameType::Ack;
            h.frag_offset = 0;
            h.msg_len = 0;
        };
        assert_eq!(check(&ack, &[]), Err(DropReason::Malformed));
    }

    #[test]
    fn lying_lengths() {
        let mut h = sample();
        h.frag_offset = 192; // 192 + 5 > 133
        let v = build(&h, b"hello");
        let f = Frame::new_checked(&v[..]).unwrap();
        assert_eq!(
            Header::parse(&f, DEFAULT_ETHERTYPE, true),
            Err(DropReason::BadLength)
        );
        let mut h = sample();
        h.payload_len = 500; // more than the frame holds
        let v = build(&h, b"hello");
        assert_eq!(
            Frame::new_checked(&v[..]).err(),
            Some(DropReason::Truncated)
        );
    }
}
