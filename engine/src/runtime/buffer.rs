//! Message buffers as the runtime hands them to the protocol core.
//!
//! A send is either from registered memory ([`SendBuf::Registered`]: frames
//! point into it, no byte is copied) or from ordinary memory
//! ([`SendBuf::Owned`]: each frame's payload is copied into the frame, because
//! a NIC can only reach registered memory). A receive copies into its
//! buffer, which may be either kind, or ([`RecvBuf::Lending`]) takes a small
//! message without a copy, in the frame it arrived in ([`RecvBuf::Lent`]).

use dpdk_ffi::ExtBuf;

use crate::io::{Lent, Payload};
use crate::proto::{CoreOnly, RecvBuffer};

/// The buffer of a send.
#[derive(Debug)]
pub enum SendBuf {
    /// Ordinary memory: payloads are copied into frames.
    Owned(Vec<u8>),
    /// Registered memory: payloads are attached to frames without a copy
    /// (those shorter than [`COPY_BELOW`](crate::io::COPY_BELOW) are copied:
    /// cheaper than a second segment). One buffer goes in several sends at
    /// once (to several peers, say) with a handle each, from
    /// [`ExtBuf::share`](dpdk_ffi::ExtBuf::share).
    Registered(ExtBuf),
}

impl SendBuf {
    /// The slice `offset..offset + len` as a frame payload (the driver's,
    /// for ranges the core took from this buffer's length).
    pub(crate) fn payload(&self, offset: usize, len: usize) -> Payload<'_> {
        match self {
            SendBuf::Owned(v) => Payload::Copy(&v[offset..offset + len]),
            SendBuf::Registered(buf) => Payload::Registered { buf, offset, len },
        }
    }
}

impl AsRef<[u8]> for SendBuf {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        match self {
            SendBuf::Owned(v) => v,
            SendBuf::Registered(b) => b.as_slice(),
        }
    }
}

impl From<Vec<u8>> for SendBuf {
    fn from(v: Vec<u8>) -> SendBuf {
        SendBuf::Owned(v)
    }
}

impl From<ExtBuf> for SendBuf {
    fn from(b: ExtBuf) -> SendBuf {
        SendBuf::Registered(b)
    }
}

/// The buffer of a receive.
#[derive(Debug)]
pub enum RecvBuf {
    /// Ordinary memory.
    Owned(Vec<u8>),
    /// Registered memory (no frame may refer to it while it receives).
    Registered(ExtBuf),
    /// No memory: a receive that borrows the frame. It takes messages up to
    /// the eager threshold (a longer one is truncated to it). A one-frame
    /// message comes back as [`RecvBuf::Lent`], with no copy; any other (one
    /// that arrived before the receive was posted, spans frames, came packed
    /// with others, or in a frame of several segments) comes back copied
    /// into a [`RecvBuf::Owned`] of its length, allocated then.
    Lending,
    /// A message in the frame it arrived in (see [`Lent`]). Read it with
    /// `as_ref()`; dropping it gives the frame back to the port.
    Lent(Lent),
}

impl RecvBuf {
    /// Whether the buffer can be posted to receive now (a registered buffer
    /// that frames still refer to cannot, nor can a lent message).
    pub fn writable(&mut self) -> bool {
        match self {
            RecvBuf::Owned(_) | RecvBuf::Lending => true,
            RecvBuf::Registered(b) => b.as_mut_slice().is_some(),
            RecvBuf::Lent(_) => false,
        }
    }
}

impl RecvBuffer for RecvBuf {
    #[inline]
    fn lends(&self) -> bool {
        matches!(self, RecvBuf::Lending)
    }

    fn fit(&mut self, len: usize) {
        if self.lends() {
            *self = RecvBuf::Owned(vec![0; len]);
        }
    }

    /// Streaming stores ([`dpdk_ffi::copy_streaming`]): receive buffers too
    /// many to stay cached are written straight to memory, not read into the
    /// cache first.
    #[inline]
    fn write_streaming(&mut self, offset: usize, data: &[u8], _: &CoreOnly) {
        let dst = &mut self.as_mut()[offset..offset + data.len()];
        // SAFETY: only the protocol core can call this (it alone has a
        // `CoreOnly`), while it holds the buffer: no other thread can reach it.
        // The core calls `streaming_fence` below, on its own thread, before
        // any receive buffer leaves it (`Core::poll_completion`, and its drop),
        // and the driver after each burst it hands the core.
        #[allow(unsafe_code)]
        unsafe {
            dpdk_ffi::copy_streaming(dst, data)
        };
    }

    #[inline]
    fn streaming_fence(_: &CoreOnly) {
        dpdk_ffi::store_fence();
    }
}

impl AsMut<[u8]> for RecvBuf {
    /// The buffer's bytes to write (none for [`RecvBuf::Lending`] and
    /// [`RecvBuf::Lent`]).
    ///
    /// # Panics
    /// On a registered buffer that is shared (another handle from
    /// [`ExtBuf::share`] is alive, or a frame still refers to it): check
    /// [`writable`](RecvBuf::writable) first. A receive is posted only with a
    /// writable buffer, and hands back the only handle.
    #[inline]
    fn as_mut(&mut self) -> &mut [u8] {
        match self {
            RecvBuf::Owned(v) => v,
            RecvBuf::Registered(b) => b
                .as_mut_slice()
                .expect("a registered receive buffer is checked writable when posted, and only the receive writes it"),
            RecvBuf::Lending | RecvBuf::Lent(_) => &mut [],
        }
    }
}

impl AsRef<[u8]> for RecvBuf {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        match self {
            RecvBuf::Owned(v) => v,
            RecvBuf::Registered(b) => b.as_slice(),
            RecvBuf::Lending => &[],
            RecvBuf::Lent(l) => l,
        }
    }
}

impl From<Vec<u8>> for RecvBuf {
    fn from(v: Vec<u8>) -> RecvBuf {
        RecvBuf::Owned(v)
    }
}

impl From<ExtBuf> for RecvBuf {
    fn from(b: ExtBuf) -> RecvBuf {
        RecvBuf::Registered(b)
    }
}
