//! A wrapper that records every frame received and sent to a pcap file
//! (nanosecond timestamps, Ethernet link type), for Wireshark or tcpdump.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use super::{Frame, IoError, PacketIo};

/// pcap magic for nanosecond timestamps.
const MAGIC_NS: u32 = 0xa1b2_3c4d;
const LINKTYPE_ETHERNET: u32 = 1;
const SNAPLEN: u32 = 65535;

/// Wraps a link and writes its traffic to a pcap file. Recording is for
/// debugging: it copies every frame. A write error stops the recording (see
/// [`PcapRecorder::error`]), never the traffic.
pub struct PcapRecorder<L: PacketIo> {
    inner: L,
    out: Option<BufWriter<File>>,
    error: Option<std::io::Error>,
    /// Frames about to be sent, copied, with their end offsets.
    pending: Vec<u8>,
    ends: Vec<usize>,
    scratch: Vec<u8>,
    frames: u64,
}

impl<L: PacketIo> PcapRecorder<L> {
    /// Wraps `inner`, creating (or truncating) the capture file at `path`.
    pub fn new(inner: L, path: impl AsRef<Path>) -> Result<PcapRecorder<L>, IoError> {
        let mut out = BufWriter::new(File::create(path)?);
        for word in [MAGIC_NS, 0x0004_0002, 0, 0, SNAPLEN, LINKTYPE_ETHERNET] {
            // version 2.4 is two u16s: major 2, minor 4 (little-endian: 0x0004_0002).
            out.write_all(&word.to_le_bytes())?;
        }
        Ok(PcapRecorder {
            inner,
            out: Some(out),
            error: None,
            pending: Vec::new(),
            ends: Vec::new(),
            scratch: Vec::new(),
            frames: 0,
        })
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// The write error that stopped the recording, if any.
    pub fn error(&self) -> Option<&std::io::Error> {
        self.error.as_ref()
    }

    /// Flushes the capture file.
    pub fn flush(&mut self) -> Result<(), IoError> {
        if let Some(out) = self.out.as_mut() {
            out.flush()?;
        }
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) {
        let Some(out) = self.out.as_mut() else { return };
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let caplen = bytes.len().min(SNAPLEN as usize);
        let header = [
            t.as_secs() as u32,
            t.subsec_nanos(),
            caplen as u32,
            bytes.len() as u32,
        ];
        let r = header
            .iter()
            .try_for_each(|w| out.write_all(&w.to_le_bytes()))
            .and_then(|_| out.write_all(&bytes[..caplen]));
        match r {
            Ok(()) => self.frames += 1,
            Err(e) => {
                self.error = Some(e);
                self.out = None;
            }
        }
    }
}

impl<L: PacketIo> PacketIo for PcapRecorder<L> {
    type Frame = L::Frame;

    fn recv(&mut self, out: &mut Vec<L::Frame>, max: usize) -> usize {
        let start = out.len();
        let n = self.inner.recv(out, max);
        let mut scratch = std::mem::take(&mut self.scratch);
        for f in &out[start..] {
            f.copy_to(&mut scratch);
            self.write(&scratch);
        }
        self.scratch = scratch;
        n
    }

    fn send(&mut self, frames: &mut Vec<L::Frame>) -> usize {
        // Copy first: once sent, the frames belong to the link.
        self.pending.clear();
        self.ends.clear();
        let mut scratch = std::mem::take(&mut self.scratch);
        for f in frames.iter() {
            f.copy_to(&mut scratch);
            self.pending.extend_from_slice(&scratch);
            self.ends.push(self.pending.len());
        }
        self.scratch = scratch;
        let n = self.inner.send(frames);
        let (pending, ends) = (
            std::mem::take(&mut self.pending),
            std::mem::take(&mut self.ends),
        );
        let mut begin = 0;
        for &end in &ends[..n] {
            self.write(&pending[begin..end]);
            begin = end;
        }
        (self.pending, self.ends) = (pending, ends);
        n
    }

    crate::delegate_packet_io!();
}

impl<L: PacketIo> Drop for PcapRecorder<L> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}
