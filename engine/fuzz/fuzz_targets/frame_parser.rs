//! The frame parser on arbitrary bytes: never panics, and what parses re-emits to the
//! same header.
#![no_main]

use emx::wire::{Frame, Header, DEFAULT_ETHERTYPE, FRAME_HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for require in [false, true] {
        let Ok(f) = Frame::new_checked(data) else { continue };
        let _ = (f.dst_mac(), f.src_mac(), f.seq(), f.payload(), f.checksum());
        if let Ok(h) = Header::parse(&f, DEFAULT_ETHERTYPE, require) {
            let payload = f.payload();
            let mut v = vec![0u8; FRAME_HEADER_LEN + payload.len()];
            h.emit(&mut v, DEFAULT_ETHERTYPE);
            v[FRAME_HEADER_LEN..].copy_from_slice(payload);
            Frame::new_unchecked(&mut v[..]).fill_checksum(payload);
            let g = Frame::new_checked(&v[..]).expect("re-emitted frame is whole");
            assert_eq!(Header::parse(&g, DEFAULT_ETHERTYPE, require), Ok(h));
        }
    }
});
