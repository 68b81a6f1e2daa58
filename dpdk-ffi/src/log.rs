//! DPDK's log messages, less two warnings that the EAL options of
//! [`EalBuilder`](crate::EalBuilder) make certain.
//!
//! Started through the builder, the EAL runs without multi-process support
//! (`--in-memory` or `--no-shconf`) and, on hugepages, only after the builder
//! has found enough of them free. Two of DPDK's warnings then say nothing,
//! yet they are the first lines anyone running emx sees, and read like
//! failures:
//! - `EAL: No free 1048576 kB hugepages reported on node 0`: printed for every
//!   hugepage size with none free, also when pages of another size are there
//!   and are the ones used;
//! - `rte_pmd_memif_probe(): Failed to register mp action callback: Operation
//!   not supported`: net_memif offering its regions to secondary processes,
//!   which cannot exist without multi-process support.
//!
//! Every other message goes to stderr as DPDK wrote it. An EAL started from a
//! raw argument list ([`Eal::init`](crate::Eal::init)) logs as DPDK does.

use std::io::Write;
use std::os::raw::{c_char, c_void};

use crate::sys;

/// Whether `msg`, one message as DPDK wrote it, is one of the two warnings.
pub(crate) fn expected(msg: &[u8]) -> bool {
    let has = |needle: &[u8]| msg.windows(needle.len()).any(|w| w == needle);
    (msg.starts_with(b"EAL: No free ") && has(b" kB hugepages reported on node "))
        || has(b"Failed to register mp action callback: Operation not supported")
}

/// The lines of `chunk` to keep: all but the two warnings, each line judged
/// on its own. A chunk may hold several messages: DPDK formats a message and
/// flushes it in two stdio calls, and another thread's message can land in
/// the stream's buffer between them (filtered as a whole, the warning took
/// the other message with it).
fn kept(chunk: &[u8]) -> impl Iterator<Item = &[u8]> {
    chunk
        .split_inclusive(|&b| b == b'\n')
        .filter(|line| !expected(line))
}

/// The log stream's write function: DPDK calls it once a message, or more.
unsafe extern "C" fn write(_cookie: *mut c_void, buf: *const c_char, size: usize) -> isize {
    if size == 0 {
        return 0;
    }
    // SAFETY: stdio hands over `size` readable bytes at `buf` for this call.
    let chunk = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), size) };
    let mut err = std::io::stderr().lock();
    for line in kept(chunk) {
        // Nowhere to report a failed write to stderr; stdio is told all went.
        let _ = err.write_all(line);
    }
    size as isize
}

/// Sends DPDK's log messages through [`expected`] to stderr. Call before
/// `rte_eal_init`, so that its own messages go the same way.
pub(crate) fn filter() {
    // SAFETY: `write` has the signature fopencookie(3) expects, never unwinds
    // (it ignores write errors and cannot panic), and reads only the buffer
    // it is handed. DPDK keeps the stream for the life of the process.
    let ret = unsafe { sys::emx_log_through(Some(write)) };
    debug_assert_eq!(ret, 0, "fopencookie failed");
}

#[cfg(test)]
mod tests {
    use super::{expected, kept};

    /// A warning and another thread's message in one chunk: the other stays.
    #[test]
    fn another_message_in_the_warnings_chunk_is_kept() {
        let chunk = b"rte_pmd_memif_probe(): Failed to register mp action callback: Operation not supported\nmemif_rx(): real error\nEAL: No free 2048 kB hugepages reported on node 1\npartial";
        let out: Vec<u8> = kept(chunk).flatten().copied().collect();
        assert_eq!(out, b"memif_rx(): real error\npartial");
    }

    #[test]
    fn the_two_warnings_are_expected() {
        assert!(expected(
            b"EAL: No free 1048576 kB hugepages reported on node 0\n"
        ));
        assert!(expected(
            b"EAL: No free 2048 kB hugepages reported on node 1\n"
        ));
        assert!(expected(
            b"rte_pmd_memif_probe(): Failed to register mp action callback: Operation not supported\n"
        ));
    }

    #[test]
    fn other_messages_are_not() {
        for m in [
            &b"EAL: Cannot get hugepage information.\n"[..],
            b"EAL: No available 1048576 kB hugepages reported\n",
            b"rte_pmd_memif_probe(): Failed to register mp action callback: Permission denied\n",
            b"memif_connect_client(): Failed to connect socket: /tmp/x.sock.\n",
            b"",
        ] {
            assert!(!expected(m), "{}", String::from_utf8_lossy(m));
        }
    }
}
