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
//! Every other message goes to stderr as DPDK wrote it, or, once
//! [`log_to`] has named a function, to it, a line at a time with its level
//! (an application whose own log is JSON lines keeps DPDK's lines among
//! them that way). An EAL started from a raw argument list
//! ([`Eal::init`](crate::Eal::init)) logs as DPDK does.

use std::io::Write;
use std::os::raw::{c_char, c_void};
use std::sync::OnceLock;

use crate::sys;

/// The severity DPDK gave a message, its eight levels folded to five.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// `RTE_LOG_EMERG` to `RTE_LOG_ERR`.
    Error,
    /// `RTE_LOG_WARNING`.
    Warning,
    /// `RTE_LOG_NOTICE`.
    Notice,
    /// `RTE_LOG_INFO`.
    Info,
    /// `RTE_LOG_DEBUG` (and anything past it).
    Debug,
}

impl LogLevel {
    fn from_rte(level: i32) -> LogLevel {
        match level {
            // 0: written straight to DPDK's stream, not through its log
            // call (which sets the level first).
            0 => LogLevel::Info,
            ..=4 => LogLevel::Error,
            5 => LogLevel::Warning,
            6 => LogLevel::Notice,
            7 => LogLevel::Info,
            _ => LogLevel::Debug,
        }
    }
}

/// A function that takes DPDK's messages: the level, and one line without
/// its newline.
pub type LogSink = fn(LogLevel, &str);

static SINK: OnceLock<LogSink> = OnceLock::new();

/// Sends DPDK's messages to `sink` from now on, for the life of the process,
/// instead of to stderr: each line of a message on its own, with the
/// message's level (the two warnings of this module's list are left out as
/// before). Only where the EAL was started through
/// [`EalBuilder`](crate::EalBuilder), which routes DPDK's log through this
/// module. The first sink named stays: `false` when one was named already.
///
/// `sink` runs on whichever thread DPDK logs from (an interrupt thread's
/// driver messages among them); a panic in it is caught and the line lost.
///
/// ```
/// fn to_stdout(level: dpdk_ffi::LogLevel, line: &str) {
///     println!("dpdk {level:?}: {line}");
/// }
/// assert!(dpdk_ffi::log_to(to_stdout));
/// assert!(!dpdk_ffi::log_to(to_stdout), "the first stays");
/// ```
pub fn log_to(sink: LogSink) -> bool {
    SINK.set(sink).is_ok()
}

/// Whether `msg`, one message as DPDK wrote it, is one of the two warnings.
pub(crate) fn expected(msg: &[u8]) -> bool {
    let has = |needle: &[u8]| msg.windows(needle.len()).any(|w| w == needle);
    (msg.starts_with(b"EAL: No free ") && has(b" kB hugepages reported on node "))
        || has(b"Failed to register mp action callback: Operation not supported")
}

/// The lines of `chunk` to keep: all but the two warnings, each line judged
/// on its own. A chunk may hold several lines, and could hold several
/// messages while the stream was buffered (another thread's message landed
/// in the buffer between DPDK's write and its flush; filtered as a whole,
/// the warning took the other message with it).
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
    if let Some(&sink) = SINK.get() {
        // SAFETY: a plain call, reading this thread's level of its current
        // message (set by DPDK's log call before it writes; the stream is
        // unbuffered, so this write is that message).
        let level = LogLevel::from_rte(unsafe { sys::emx_log_level() });
        to_sink(sink, level, chunk);
        return size as isize;
    }
    let mut err = std::io::stderr().lock();
    for line in kept(chunk) {
        // Nowhere to report a failed write to stderr; stdio is told all went.
        let _ = err.write_all(line);
    }
    size as isize
}

/// Hands the kept lines of `chunk` to `sink`, without their newlines (and
/// without blank ones). A panic stops here: it must not unwind into C.
fn to_sink(sink: LogSink, level: LogLevel, chunk: &[u8]) {
    for line in kept(chunk) {
        let line = String::from_utf8_lossy(line);
        let line = line.trim_end();
        if !line.is_empty() {
            // The payload is forgotten, not dropped: its drop could panic
            // in turn, outside the catch.
            if let Err(payload) = std::panic::catch_unwind(|| sink(level, line)) {
                std::mem::forget(payload);
            }
        }
    }
}

/// Sends DPDK's log messages through [`expected`] to stderr. Call before
/// `rte_eal_init`, so that its own messages go the same way.
pub(crate) fn filter() {
    // SAFETY: `write` has the signature fopencookie(3) expects and reads
    // only the buffer it is handed. It does not unwind into C: it ignores
    // write errors, a sink's panic is caught there, and anything else that
    // escaped an `extern "C"` function would abort the process (Rust 1.81
    // and later), not unwind. DPDK keeps the stream for the life of the
    // process.
    let ret = unsafe { sys::emx_log_through(Some(write)) };
    debug_assert_eq!(ret, 0, "fopencookie failed");
}

#[cfg(test)]
mod tests {
    use super::{expected, kept, to_sink, LogLevel};
    use std::sync::Mutex;

    static GOT: Mutex<Vec<(LogLevel, String)>> = Mutex::new(Vec::new());

    fn record(level: LogLevel, line: &str) {
        GOT.lock().unwrap().push((level, line.to_owned()));
    }

    fn panics(_: LogLevel, line: &str) {
        panic!("{line}");
    }

    /// A sink gets each line alone, without its newline, the warnings and
    /// blank lines left out; a panic in it goes no further.
    #[test]
    fn a_sink_gets_lines() {
        let chunk = b"EAL: Detected lcores: 2\n\nEAL: No free 2048 kB hugepages reported on node 1\nmemif_rx(): real error \r\npartial";
        to_sink(record, LogLevel::Notice, chunk);
        to_sink(panics, LogLevel::Error, b"boom\n");
        assert_eq!(
            *GOT.lock().unwrap(),
            [
                (LogLevel::Notice, "EAL: Detected lcores: 2".to_owned()),
                (LogLevel::Notice, "memif_rx(): real error".to_owned()),
                (LogLevel::Notice, "partial".to_owned()),
            ]
        );
        assert_eq!(LogLevel::from_rte(0), LogLevel::Info);
        assert_eq!(LogLevel::from_rte(1), LogLevel::Error);
        assert_eq!(LogLevel::from_rte(4), LogLevel::Error);
        assert_eq!(LogLevel::from_rte(5), LogLevel::Warning);
        assert_eq!(LogLevel::from_rte(8), LogLevel::Debug);
    }

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
