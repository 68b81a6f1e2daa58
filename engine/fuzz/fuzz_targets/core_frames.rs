//! Arbitrary frame sequences into a live core. The input is a series of records:
//! `[op: u8][len: u16 LE][bytes]`; op bit 0 advances time by 100 us first. Checksums are
//! off, so that the fuzzer reaches the state machines. Nothing may panic, and the
//! unexpected store stays within its bound (`../core_setup.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("../core_setup.rs");

fuzz_target!(|data: &[u8]| {
    let _ = fuzz_replay(data, |_| {});
});
