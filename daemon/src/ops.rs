//! The match-bits convention of emxd's built-in responder, the byte pattern
//! that `check` sends, and the responder's message size limit.
//!
//! The top byte of a message's 64-bit match bits is the operation
//! ([`op_of`]); the other 56 bits are the sender's own (a sequence number, a
//! tag) and are handed back unchanged:
//!
//! | op | name | what emxd does with the message |
//! |---|---|---|
//! | `0x01` | [`ECHO`] | sends the same bytes back to the source, with the same match bits (a `check` message's with op [`CHECK_ANSWER`]) |
//! | `0x02` | [`SINK`] | counts it and drops it |
//! | `0x03` | [`PING`] | answers with the same bytes (up to [`PING_BYTES`]) and low bits, op [`PONG`]; a liveness probe for tools. One PONG per peer endpoint is in flight at a time: the next PING is taken when it is done, so a prober that takes no PONGs holds one of emxd's sends, and its further PINGs wait in emxd's unexpected queue, on its own credit |
//! | `0x04` | [`PONG`] | not received by emxd: the answer to a PING, for the prober to receive |
//! | `0x05` | [`CHECK_ANSWER`] | the echo of a `check` message ([`check_bits`]): received only by the check that sent it |
//!
//! Messages with any other op byte are received and discarded (counted), so
//! that they do not sit in the unexpected queue, held against their sender's
//! credits.
//!
//! An echo comes back with the very match bits it went out with, so a prober
//! receives it with a receive for those bits from the responder. emxd itself
//! runs the responder too, and its own any-source ECHO receives would take
//! such answers first. So `check` marks its requests ([`check_bits`]) with
//! [`CHECK_MARK`] and its own node id, and emxd echoes a marked message back
//! with op [`CHECK_ANSWER`] ([`answer_bits`]), which only the receive the
//! check posted before it sent takes. (Taken by the ECHO receives, answers
//! had to wait for one that was free, while each was busy echoing a message
//! of another node's check: a rendezvous echo ends only when its origin
//! pulls it, so nodes checking each other at once could hold all of each
//! other's ECHO receives for good. An old emxd's answer, with op ECHO, that
//! reaches its origin's ECHO receives is still handed to the check, never
//! echoed again.)

/// Bits of the operation byte in the match bits.
pub const OP_MASK: u64 = 0xff << OP_SHIFT;
/// Where the operation byte starts.
pub const OP_SHIFT: u32 = 56;

/// Echo: the same bytes go back to the source with the same match bits.
pub const ECHO: u8 = 0x01;
/// Sink: counted and dropped.
pub const SINK: u8 = 0x02;
/// Ping: answered with a [`PONG`] carrying the same bytes and low 56 bits.
pub const PING: u8 = 0x03;
/// The answer to a [`PING`].
pub const PONG: u8 = 0x04;
/// The echo of a `check` message: see [`answer_bits`].
pub const CHECK_ANSWER: u8 = 0x05;

/// The largest message the responder takes whole, whatever the registered
/// region: 16 MiB.
pub const MAX_MESSAGE: usize = 16 << 20;
/// ECHO receives kept posted at once, each with its own buffer in the
/// registered region.
pub const ECHO_SLOTS: usize = 4;
/// SINK receives kept posted at once, each with an ordinary buffer of the
/// same size as an ECHO slot.
pub const SINK_SLOTS: usize = 2;

/// The longest PING payload answered whole (longer ones are answered with
/// their first `PING_BYTES` bytes).
pub const PING_BYTES: usize = 4096;

/// Byte 6 of the match bits of a `check` request (see [`check_bits`]).
pub const CHECK_MARK: u8 = 0xc7;

/// The operation byte of `bits`.
pub const fn op_of(bits: u64) -> u8 {
    (bits >> OP_SHIFT) as u8
}

/// Match bits with operation `op` and the low 56 bits of `low`.
pub const fn with_op(op: u8, low: u64) -> u64 {
    (op as u64) << OP_SHIFT | (low & !OP_MASK)
}

/// The largest message the responder of a node whose registered region has
/// `region_bytes` takes whole: [`MAX_MESSAGE`], or a [`ECHO_SLOTS`]-th of the
/// region when that is less (rounded down to 4 KiB). Longer ones are
/// truncated to it (and an echo of one comes back short).
pub const fn max_message(region_bytes: usize) -> usize {
    let share = region_bytes / ECHO_SLOTS / 4096 * 4096;
    if share < MAX_MESSAGE {
        share
    } else {
        MAX_MESSAGE
    }
}

/// The match bits of a `check` request: op [`ECHO`], byte 6 [`CHECK_MARK`],
/// bytes 4-5 the checking node (`origin`), byte 3 the check run, bytes 0-2 a
/// sequence number (`seq` modulo 2^24).
pub const fn check_bits(origin: u16, run: u8, seq: u32) -> u64 {
    with_op(
        ECHO,
        (CHECK_MARK as u64) << 48
            | (origin as u64) << 32
            | (run as u64) << 24
            | (seq & 0xff_ffff) as u64,
    )
}

/// The match bits of the echo of the check request `bits`: op
/// [`CHECK_ANSWER`], the rest as they were.
pub const fn answer_bits(bits: u64) -> u64 {
    with_op(CHECK_ANSWER, bits)
}

/// The parts of [`check_bits`]: `(origin, run, seq)`, when `bits` are those of
/// a check request.
pub const fn check_parts(bits: u64) -> Option<(u16, u8, u32)> {
    if op_of(bits) != ECHO || (bits >> 48) as u8 != CHECK_MARK {
        return None;
    }
    Some((
        (bits >> 32) as u16,
        (bits >> 24) as u8,
        (bits & 0xff_ffff) as u32,
    ))
}

/// splitmix64: a cheap, well-mixed function of one word.
const fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `i`-th 8-byte word of the pattern seeded by `seed`.
fn word(seed: u64, i: usize) -> [u8; 8] {
    mix(seed ^ mix(i as u64)).to_le_bytes()
}

/// Fills `buf` with the deterministic pattern of `seed` (`check` seeds it
/// with the message's match bits, so that a message swapped with another
/// shows).
pub fn fill_pattern(seed: u64, buf: &mut [u8]) {
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let w = word(seed, i);
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// The offset of the first byte of `buf` that differs from the pattern of
/// `seed`, if any.
pub fn pattern_mismatch(seed: u64, buf: &[u8]) -> Option<usize> {
    buf.chunks(8).enumerate().find_map(|(i, chunk)| {
        let w = word(seed, i);
        chunk
            .iter()
            .zip(w.iter())
            .position(|(a, b)| a != b)
            .map(|j| i * 8 + j)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_and_check_bits() {
        let b = check_bits(7, 3, 0x0123_4567);
        assert_eq!(op_of(b), ECHO);
        assert_eq!(check_parts(b), Some((7, 3, 0x23_4567)));
        assert_eq!(check_parts(with_op(ECHO, 42)), None);
        assert_eq!(check_parts(with_op(SINK, b)), None);
        assert_eq!(with_op(PONG, with_op(PING, 99)), with_op(PONG, 99));
        let a = answer_bits(b);
        assert_eq!(op_of(a), CHECK_ANSWER);
        assert_eq!(check_parts(a), None, "an answer is not a request");
        assert_eq!(with_op(ECHO, a), b);
    }

    #[test]
    fn pattern_round_trip() {
        for len in [0, 1, 7, 8, 9, 1000, 4099] {
            let mut v = vec![0u8; len];
            fill_pattern(5, &mut v);
            assert_eq!(pattern_mismatch(5, &v), None, "{len}");
            if len > 0 {
                v[len / 2] ^= 1;
                assert_eq!(pattern_mismatch(5, &v), Some(len / 2));
                assert!(pattern_mismatch(6, &v).is_some());
            }
        }
    }

    #[test]
    fn limits() {
        assert_eq!(max_message(64 << 20), 16 << 20);
        assert_eq!(max_message(1 << 30), MAX_MESSAGE);
        assert_eq!(max_message(32 << 20), 8 << 20);
        assert_eq!(max_message(10_000), 0);
    }
}
