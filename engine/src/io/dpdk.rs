//! The seam over one DPDK port queue pair.

use dpdk_ffi::{Mbuf, Mempool, Port, RxQueue, TxQueue};

use super::{check_room, Frame, IoError, IoStats, Lent, LentFrame, Mac, PacketIo, Payload};

impl Frame for Mbuf {
    fn len(&self) -> usize {
        self.pkt_len()
    }
    fn contiguous(&self) -> Option<&[u8]> {
        (self.nb_segs() == 1).then(|| self.data())
    }
    fn copy_to(&self, out: &mut Vec<u8>) {
        out.clear();
        for seg in self.segments() {
            out.extend_from_slice(seg);
        }
    }
    fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        if self.nb_segs() != 1 {
            return None;
        }
        self.data_mut().ok()
    }
    fn first_segment_mut(&mut self) -> Option<&mut [u8]> {
        self.data_mut().ok()
    }
    fn into_lent(self, offset: usize, len: usize) -> Lent {
        Lent::new(LentFrame::Mbuf(self), offset, len)
    }
}

/// Registered payloads shorter than this are copied into the frame rather
/// than attached, by default ([`DpdkIo::set_copy_below`]). Attaching costs a
/// second mbuf, an external-buffer reference and a second descriptor, which
/// on memif took longer than copying up to about a kilobyte: 8-byte round
/// trips were 5% faster copied, 1000-byte ones 4%. Full frames of a large
/// message (rendezvous data) are still attached, never copied.
pub const COPY_BELOW: usize = 1024;

/// One rx/tx queue pair of a started [`Port`], with the pool that transmit
/// frames come from. Owned by the polling thread that drives it.
pub struct DpdkIo {
    rx: RxQueue,
    tx: TxQueue,
    pool: Mempool,
    mac: Mac,
    max_frame: usize,
    zero_copy: bool,
    copy_below: usize,
    stats: IoStats,
    /// What an empty pool says ([`IoError::NoBuffer`]), made once.
    exhausted: std::sync::Arc<str>,
}

impl DpdkIo {
    /// Takes queue `queue` (rx and tx) of `port`; transmit frames come from `pool`.
    ///
    /// A port whose driver cannot transmit chained mbufs needs buffers that
    /// hold a whole frame: a frame built over several would leave with its
    /// first segment only (simple transmit paths ignore the rest), and be
    /// sent again for ever.
    pub fn new(port: &Port, queue: u16, pool: &Mempool) -> Result<DpdkIo, IoError> {
        let whole = dpdk_ffi::data_room_for_mtu(port.mtu());
        if !port.multi_seg_tx() && pool.data_room() < whole {
            return Err(IoError::Setup(format!(
                "port {} ({})'s driver cannot transmit chained mbufs, and pool {}'s {}-byte \
                 buffers hold less than a frame at MTU {}: give the pool a data room of at least \
                 {whole} bytes (dpdk_ffi::data_room_for_mtu), or the port a smaller MTU",
                port.id(),
                port.name(),
                pool.name(),
                pool.data_room(),
                port.mtu()
            )));
        }
        Ok(DpdkIo {
            rx: port.rx_queue(queue)?,
            tx: port.tx_queue(queue)?,
            pool: pool.clone(),
            mac: port.mac(),
            max_frame: usize::from(port.mtu()) + 14,
            zero_copy: port.multi_seg_tx(),
            copy_below: COPY_BELOW,
            stats: IoStats::default(),
            exhausted: dpdk_ffi::Error::MempoolExhausted {
                pool: pool.name().to_owned(),
                size: pool.size(),
            }
            .to_string()
            .into(),
        })
    }

    /// Whether registered payloads are attached without a copy (the port
    /// transmits chained mbufs).
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// Copies registered payloads shorter than `n` bytes instead of attaching
    /// them (attaching costs a second mbuf and descriptor). Default
    /// [`COPY_BELOW`]; 0: registered memory is never copied.
    pub fn set_copy_below(&mut self, n: usize) {
        self.copy_below = n;
    }

    fn segment(&self) -> Result<Mbuf, IoError> {
        Mbuf::try_alloc(&self.pool).ok_or_else(|| IoError::NoBuffer(self.exhausted.clone()))
    }

    /// Copies `bytes` to the end of the frame, adding segments when the last
    /// one is full.
    fn append_copy(&mut self, frame: &mut Mbuf, mut bytes: &[u8]) -> Result<(), IoError> {
        while !bytes.is_empty() {
            let room = frame.tailroom();
            if room == 0 {
                let seg = self.segment()?;
                frame.chain(seg).map_err(|(e, _)| e)?;
                continue;
            }
            let n = room.min(bytes.len());
            frame.append(n)?.copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        Ok(())
    }
}

impl PacketIo for DpdkIo {
    type Frame = Mbuf;

    #[inline]
    fn recv(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let start = out.len();
        let n = self.rx.rx_into(out, max);
        self.stats.rx_frames += n as u64;
        for m in &out[start..] {
            self.stats.rx_bytes += m.pkt_len() as u64;
            self.stats.rx_chained += u64::from(m.nb_segs() > 1);
        }
        n
    }

    #[inline]
    fn send(&mut self, frames: &mut Vec<Mbuf>) -> usize {
        let bytes: u64 = frames.iter().map(|m| m.pkt_len() as u64).sum();
        let total = frames.len();
        let n = self.tx.tx_from(frames);
        if n < total {
            self.stats.tx_full += 1;
        }
        // What is left in `frames` did not go.
        let left: u64 = frames.iter().map(|m| m.pkt_len() as u64).sum();
        self.stats.tx_frames += n as u64;
        self.stats.tx_bytes += bytes - left;
        n
    }

    fn alloc(&mut self) -> Result<Mbuf, IoError> {
        self.segment()
    }

    fn release(&mut self, frames: &mut Vec<Mbuf>) {
        Mbuf::free_all(frames);
    }

    fn reclaim(&mut self) {
        // (`None`: a driver that frees at transmit, with nothing held.)
        let _ = self.tx.reclaim();
    }

    fn put<'f>(&mut self, frame: &'f mut Mbuf, len: usize) -> Result<&'f mut [u8], IoError> {
        check_room(frame.pkt_len(), len, self.max_frame)?;
        Ok(frame.append(len)?)
    }

    fn truncate(&mut self, frame: &mut Mbuf, len: usize) {
        // Frames are built as one segment up to the header, so only the last
        // segment ever needs trimming here.
        let excess = frame.pkt_len().saturating_sub(len);
        if excess > 0 {
            let r = frame.trim(excess);
            debug_assert!(r.is_ok(), "truncate past the last segment: {r:?}");
        }
    }

    fn attach(&mut self, frame: &mut Mbuf, payload: Payload<'_>) -> Result<(), IoError> {
        check_room(frame.pkt_len(), payload.len(), self.max_frame)?;
        match payload {
            Payload::Registered { buf, offset, len }
                if self.zero_copy && len >= self.copy_below.max(1) =>
            {
                // One segment per run that is contiguous in IO address space
                // (with physical addresses a page boundary may split a payload).
                let (mut at, end) = (offset, offset + len);
                while at < end {
                    let n = buf.contiguous_len(at).min(end - at);
                    let mut seg = self.segment()?;
                    buf.attach(&mut seg, at, n)?;
                    frame.chain(seg).map_err(|(e, _)| e)?;
                    at += n;
                }
                self.stats.payload_attached += len as u64;
            }
            p => {
                self.append_copy(frame, p.bytes())?;
                self.stats.payload_copied += p.len() as u64;
            }
        }
        Ok(())
    }

    fn duplicate(&mut self, frame: &Mbuf) -> Option<Mbuf> {
        let mut copy = self.segment().ok()?;
        for seg in frame.segments() {
            self.append_copy(&mut copy, seg).ok()?;
        }
        Some(copy)
    }

    fn mac(&self) -> Mac {
        self.mac
    }

    fn max_frame(&self) -> usize {
        self.max_frame
    }

    fn copy_below(&self) -> usize {
        if self.zero_copy {
            self.copy_below
        } else {
            usize::MAX
        }
    }

    fn stats(&self) -> IoStats {
        self.stats
    }

    fn enter_thread(&self) -> Result<Option<dpdk_ffi::ThreadRegistration>, IoError> {
        Ok(Some(dpdk_ffi::ThreadRegistration::register(
            self.pool.eal(),
        )?))
    }
}
