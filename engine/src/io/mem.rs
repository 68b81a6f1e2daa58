//! An in-memory Ethernet network for tests: any number of ports on one
//! switch that forwards by destination MAC (broadcast to all others), with
//! bounded per-port queues. Ports may live on different threads.

use std::sync::{Arc, RwLock};

use crossbeam_queue::ArrayQueue;

use super::{check_room, Frame, IoError, IoStats, Lent, LentFrame, Mac, PacketIo, Payload};

/// A frame of the in-memory network.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemFrame(pub Vec<u8>);

impl Frame for MemFrame {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn contiguous(&self) -> Option<&[u8]> {
        Some(&self.0)
    }
    fn copy_to(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.0);
    }
    fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        Some(&mut self.0)
    }
    fn into_lent(self, offset: usize, len: usize) -> Lent {
        Lent::new(LentFrame::Bytes(self.0.into_boxed_slice()), offset, len)
    }
}

struct Switch {
    ports: RwLock<Vec<Station>>,
    depth: usize,
}

/// A port as the switch sees it.
struct Station {
    mac: Mac,
    /// The largest frame the port takes: a larger one is dropped on the way
    /// to it, as a NIC drops a frame past its MTU.
    max_frame: usize,
    rx: Arc<ArrayQueue<MemFrame>>,
}

impl Station {
    /// Queues `f` for this port; false when its queue is full. A frame too
    /// large for the port is taken and lost (`dropped`).
    fn take(&self, f: &MemFrame, dropped: &mut u64) -> bool {
        if f.0.len() > self.max_frame {
            *dropped += 1;
            return true;
        }
        self.rx.push(f.clone()).is_ok()
    }
}

/// The switch. Clones share it.
#[derive(Clone)]
pub struct MemNetwork(Arc<Switch>);

impl MemNetwork {
    /// A switch whose ports each queue up to `depth` frames.
    pub fn new(depth: usize) -> MemNetwork {
        MemNetwork(Arc::new(Switch {
            ports: RwLock::new(Vec::new()),
            depth,
        }))
    }

    /// Adds a port with this MAC and MTU. Frames larger than its MTU allows
    /// do not reach it.
    pub fn port(&self, mac: Mac, mtu: usize) -> MemIo {
        let rx = Arc::new(ArrayQueue::new(self.0.depth));
        let max_frame = mtu + 14;
        self.0
            .ports
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(Station {
                mac,
                max_frame,
                rx: rx.clone(),
            });
        MemIo {
            net: self.clone(),
            mac,
            max_frame,
            rx,
            stats: IoStats::default(),
            dropped: 0,
        }
    }

    /// Two ports joined by this switch: the simplest link.
    pub fn pair(mtu: usize) -> (MemIo, MemIo) {
        let net = MemNetwork::new(4096);
        (
            net.port([2, 0, 0, 0, 0, 1], mtu),
            net.port([2, 0, 0, 0, 0, 2], mtu),
        )
    }
}

/// One port of a [`MemNetwork`].
pub struct MemIo {
    net: MemNetwork,
    mac: Mac,
    max_frame: usize,
    rx: Arc<ArrayQueue<MemFrame>>,
    stats: IoStats,
    dropped: u64,
}

impl Drop for MemIo {
    /// Unplugs the port: frames for its MAC are dropped from now on, as a
    /// switch drops frames for a station that left (none waits in a queue
    /// nobody reads, holding the sender back).
    fn drop(&mut self) {
        self.net
            .0
            .ports
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|s| !Arc::ptr_eq(&s.rx, &self.rx));
    }
}

impl MemIo {
    /// Frames this port sent that no port could take (unknown MAC, larger
    /// than the receiving port's MTU, or a full queue on the way to a
    /// broadcast's other receivers).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

impl PacketIo for MemIo {
    type Frame = MemFrame;

    fn recv(&mut self, out: &mut Vec<MemFrame>, max: usize) -> usize {
        let room = (out.capacity() - out.len()).min(max);
        let mut n = 0;
        while n < room {
            let Some(f) = self.rx.pop() else { break };
            self.stats.rx_bytes += f.0.len() as u64;
            out.push(f);
            n += 1;
        }
        self.stats.rx_frames += n as u64;
        n
    }

    fn send(&mut self, frames: &mut Vec<MemFrame>) -> usize {
        let ports = self.net.0.ports.read().unwrap_or_else(|e| e.into_inner());
        let mut taken = 0;
        for f in frames.iter() {
            let dst: Mac =
                f.0.get(..6)
                    .and_then(|d| d.try_into().ok())
                    .unwrap_or([0; 6]);
            if dst == [0xff; 6] {
                for s in ports.iter().filter(|s| s.mac != self.mac) {
                    if !s.take(f, &mut self.dropped) {
                        self.dropped += 1;
                    }
                }
            } else if let Some(s) = ports.iter().find(|s| s.mac == dst) {
                // Full (other senders may fill it too): back-pressure, as a
                // NIC queue gives. The frame stays for a later call.
                if !s.take(f, &mut self.dropped) {
                    self.stats.tx_full += 1;
                    break;
                }
            } else {
                self.dropped += 1;
            }
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += f.0.len() as u64;
            taken += 1;
        }
        drop(ports);
        frames.drain(..taken);
        taken
    }

    fn alloc(&mut self) -> Result<MemFrame, IoError> {
        Ok(MemFrame(Vec::with_capacity(self.max_frame)))
    }

    fn put<'f>(&mut self, frame: &'f mut MemFrame, len: usize) -> Result<&'f mut [u8], IoError> {
        let at = frame.0.len();
        check_room(at, len, self.max_frame)?;
        frame.0.resize(at + len, 0);
        Ok(&mut frame.0[at..])
    }

    fn truncate(&mut self, frame: &mut MemFrame, len: usize) {
        frame.0.truncate(len);
    }

    fn attach(&mut self, frame: &mut MemFrame, payload: Payload<'_>) -> Result<(), IoError> {
        check_room(frame.0.len(), payload.len(), self.max_frame)?;
        frame.0.extend_from_slice(payload.bytes());
        self.stats.payload_copied += payload.len() as u64;
        Ok(())
    }

    fn duplicate(&mut self, frame: &MemFrame) -> Option<MemFrame> {
        Some(frame.clone())
    }

    fn mac(&self) -> Mac {
        self.mac
    }

    fn max_frame(&self) -> usize {
        self.max_frame
    }

    fn stats(&self) -> IoStats {
        self.stats
    }
}
