//! emx: reliable, tag-matched messages over raw Ethernet frames.
//!
//! The crate is built in three parts that stay apart, and data flows one way
//! through them: port -> seam -> wire parse -> protocol -> matching ->
//! completion -> application, and back down for sends.
//!
//! The sans-IO protocol core (no clock, no thread, no socket, no DPDK):
//! - [`wire`]: the Ethernet II + emx header format (zero-copy checked view, typed header).
//! - [`proto`]: the state machines, driven through [`proto::Core`] with time passed in.
//! - [`sim`]: a simulated link in virtual time that drives several cores against each
//!   other (latency, MTU, bandwidth, seeded loss, duplication, reordering, corruption),
//!   for tests and for measuring the core's cost.
//!
//! With the `runtime` feature (on by default; without it the crate is the
//! protocol core alone and needs no DPDK):
//! - [`io`]: the packet I/O seam, a burst-in/burst-out trait with a DPDK port
//!   implementation, an in-memory network, and fault-injecting and pcap wrappers.
//! - [`runtime`]: the core driven over a link by a polling thread or inline,
//!   the lock-free rings to application threads, and the public API
//!   ([`runtime::Engine`], [`runtime::Endpoint`]).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod proto;
pub mod sim;
pub mod wire;

#[cfg(feature = "runtime")]
pub mod io;
#[cfg(feature = "runtime")]
pub mod runtime;
