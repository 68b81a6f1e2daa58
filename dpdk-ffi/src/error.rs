//! Typed errors: each names the DPDK call that failed, its errno, and where the
//! cause is a user error (bad devargs, no hugepages, a missing driver) the fix.

use std::ffi::CStr;
use std::fmt;
use std::time::Duration;

use crate::sys;

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An errno value as DPDK reports it (negative returns and `rte_errno` are both
/// normalised to the positive code).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// The calling thread's `rte_errno`.
    pub fn last() -> Errno {
        // SAFETY: reads a thread-local int through the shim; no preconditions.
        Errno(unsafe { sys::rte_errno() })
    }

    /// From a negative DPDK return value (`-errno`).
    pub fn from_ret(ret: i32) -> Errno {
        Errno(ret.saturating_abs())
    }

    /// `ENOMEM`: the EAL had no memory for what was asked.
    pub fn is_out_of_memory(self) -> bool {
        self.0 == libc::ENOMEM
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            // A call that returned failure with `rte_errno` left at 0 (memif's
            // start when its client finds no server, for one): "Success"
            // would read as nonsense.
            return f.write_str(
                "no error code given (errno 0; DPDK's log lines above say what the driver \
                 refused)",
            );
        }
        // SAFETY: rte_strerror accepts any int and returns a pointer to a static
        // (or per-lcore) NUL-terminated string, valid until the next call on
        // this thread; it is copied out at once.
        let msg = unsafe { CStr::from_ptr(sys::rte_strerror(self.0)) };
        write!(f, "{} (errno {})", msg.to_string_lossy(), self.0)
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Errno({}: {})", self.0, self)
    }
}

/// What went wrong in a DPDK call, and where it helps, how to fix it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The EAL starts once per process: a second start is refused.
    #[error(
        "the DPDK EAL was already {0} in this process; it starts once per process \
         (run each DPDK test in its own process, e.g. with cargo-nextest)"
    )]
    EalAlreadyStarted(&'static str),
    /// `rte_eal_init` failed.
    #[error("rte_eal_init failed: {errno}{hint}")]
    EalInit {
        /// `rte_errno` after the call.
        errno: Errno,
        /// A hint at the usual cause, or empty.
        hint: &'static str,
    },
    /// An EAL argument contains a NUL byte or is otherwise unusable.
    #[error("invalid EAL argument `{arg}`: {why}")]
    EalArgument {
        /// The argument as given.
        arg: String,
        /// Why it was refused.
        why: &'static str,
    },
    /// Hugepages were required but none can be used.
    #[error(
        "hugepages were required but {0}; as root, reserve more 2 MiB pages (`echo N > \
         /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages`, N counting those in use) \
         and mount hugetlbfs on /dev/hugepages (`sudo bash scripts/setup.sh` does both for \
         512 pages), or let the program run without them (hugepages \"auto\" or \"never\" in \
         its settings; DPDK's --no-huge)"
    )]
    NoHugepages(String),
    /// No poll-mode driver matches the device name in the devargs.
    #[error(
        "no DPDK driver for device `{devargs}`: driver `{driver}` is not available; check \
         the spelling (net_memif, net_af_packet, net_tap, net_ring, ...) and that its package \
         is installed (Debian: librte-net-<name>23, pulled in by `dpdk`)"
    )]
    NoDriver {
        /// The devargs as given.
        devargs: String,
        /// The driver name they asked for.
        driver: String,
    },
    /// The driver refused the device arguments.
    #[error(
        "bad device arguments `{devargs}`: rte_dev_probe failed{} (the driver's log line \
         above says which key or value it refused, or which resource was busy)",
        errno.map(|e| format!(" with {e}")).unwrap_or_default()
    )]
    Devargs {
        /// The devargs as given.
        devargs: String,
        /// The error the probe returned, when it gave one.
        errno: Option<Errno>,
    },
    /// The MTU asked for is above what the port's frames can carry.
    #[error(
        "port {port} takes frames up to {max_frame} bytes, so an MTU of at most {max_mtu}; \
         asked for {asked} (set the MTU to {max_mtu} or less)"
    )]
    MtuTooLarge {
        /// The port: its id and name.
        port: String,
        /// The longest frame it takes, Ethernet header and CRC included.
        max_frame: u32,
        /// The largest MTU that fits.
        max_mtu: u32,
        /// The MTU asked for.
        asked: u16,
    },
    /// A port id that names no port.
    #[error("unknown port id {port}: {available} port(s) are available (ids from 0)")]
    UnknownPort {
        /// The id asked for.
        port: u16,
        /// How many ports DPDK has.
        available: u16,
    },
    /// A queue id out of range, or a queue already handed out.
    #[error("queue {queue} of port {port}: {why}")]
    Queue {
        /// Port id.
        port: u16,
        /// Queue id.
        queue: u16,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Every mbuf of the pool is in use.
    #[error(
        "mempool `{pool}` is exhausted: all {size} mbufs are in use (free mbufs sooner or \
         create a larger pool)"
    )]
    MempoolExhausted {
        /// Pool name.
        pool: String,
        /// Its size in mbufs.
        size: u32,
    },
    /// The link stayed down past the deadline.
    #[error("link of port {port} did not come up within {timeout:?} (is the peer running?)")]
    LinkTimeout {
        /// Port id.
        port: u16,
        /// How long we waited.
        timeout: Duration,
    },
    /// A read or write past the data of an mbuf.
    #[error("mbuf access out of bounds: offset {offset} + length {len} exceeds {limit} bytes")]
    OutOfBounds {
        /// Start of the access.
        offset: usize,
        /// Length of the access.
        len: usize,
        /// The length that bounds it.
        limit: usize,
    },
    /// Not enough head- or tailroom, or a segment too long for DPDK's 16-bit lengths.
    #[error("not enough room: {wanted} bytes wanted, {available} available")]
    NoRoom {
        /// Bytes asked for.
        wanted: usize,
        /// Bytes there are.
        available: usize,
    },
    /// An mbuf whose data is shared (cloned, or an external buffer) cannot be written.
    #[error(
        "mbuf data is shared (external buffer or reference count above 1) and cannot be written"
    )]
    SharedData,
    /// A chain would exceed DPDK's segment limit.
    #[error("cannot chain mbufs: the chain would exceed the segment limit")]
    ChainTooLong,
    /// The requested part of an external-memory region is out of range or in use.
    #[error("external memory: {0}")]
    ExtMem(&'static str),
    /// `mmap` of a memory region failed.
    #[error("mapping {len} bytes of {kind} failed: {source}")]
    Mmap {
        /// Bytes asked for.
        len: usize,
        /// "hugepages" or "ordinary pages".
        kind: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A configuration value DPDK cannot use.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// No lcore id left for a thread to register (`rte_thread_register`'s
    /// ENOMEM, which is not about memory).
    #[error(
        "no lcore id left for this thread: DPDK has RTE_MAX_LCORE of them (128 in Debian's \
         build), all held by its lcores and by registered threads; drop the registrations of \
         threads that no longer poll (an engine's inline endpoint holds its thread's until that \
         thread ends)"
    )]
    LcoresExhausted,
    /// Any other DPDK call that failed.
    #[error("{call} failed: {errno}")]
    Call {
        /// The DPDK function.
        call: &'static str,
        /// Its error.
        errno: Errno,
    },
}

/// Turns DPDK's return conventions into `Result`s (capsule's `ToResult`).
pub(crate) trait ToResult: Sized {
    /// The success value.
    type Ok;
    /// `Err(Error::Call)` naming `call` when the value means failure.
    fn check(self, call: &'static str) -> Result<Self::Ok>;
}

impl ToResult for i32 {
    type Ok = i32;
    /// Negative is failure: `-errno`, or `-1` with `rte_errno` set.
    fn check(self, call: &'static str) -> Result<i32> {
        match self {
            r if r >= 0 => Ok(r),
            -1 => Err(Error::Call {
                call,
                errno: Errno::last(),
            }),
            r => Err(Error::Call {
                call,
                errno: Errno::from_ret(r),
            }),
        }
    }
}

impl<T> ToResult for *mut T {
    type Ok = std::ptr::NonNull<T>;
    /// Null is failure, with `rte_errno` set.
    fn check(self, call: &'static str) -> Result<std::ptr::NonNull<T>> {
        std::ptr::NonNull::new(self).ok_or_else(|| Error::Call {
            call,
            errno: Errno::last(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure that left `rte_errno` at 0 does not read "Success".
    #[test]
    fn a_failure_without_an_error_code_says_so() {
        let e = Error::Call {
            call: "rte_eth_dev_start",
            errno: Errno(0),
        };
        let text = e.to_string();
        assert!(!text.contains("Success"), "{text}");
        assert!(text.contains("no error code given"), "{text}");
    }
}
