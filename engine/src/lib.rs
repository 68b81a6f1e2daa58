//! emx: reliable, tag-matched messages over raw Ethernet frames.
//!
//! The crate is built in three parts that stay apart: the sans-IO protocol core
//! (wire format, reliability, eager and rendezvous protocols, matching), the packet
//! I/O seam, and the runtime with its public API.
#![deny(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "runtime")]
pub mod io;
