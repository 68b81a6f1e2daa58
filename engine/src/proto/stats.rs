//! Counters: per peer and core-wide. Plain integers, bumped on the fast path, read by
//! the runtime whenever it likes.

use crate::wire::DropCounters;

/// Counters kept for each peer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Frames sent to the peer (retransmissions and pure acks included).
    pub frames_sent: u64,
    /// Bytes sent to the peer (Ethernet and emx headers included).
    pub bytes_sent: u64,
    /// Frames received from the peer and accepted for processing,
    /// acknowledgements and duplicates among them (a duplicate's
    /// acknowledgement still counts; `duplicates` says how many were).
    pub frames_received: u64,
    /// Bytes received from the peer in accepted frames.
    pub bytes_received: u64,
    /// Reliable frames sent again (timeout or fast retransmit).
    pub retransmits: u64,
    /// Frames the retransmission timer declared lost (one acknowledged
    /// before it went out again counts here, not in `retransmits`).
    pub timeouts: u64,
    /// Reliable frames received twice (dropped).
    pub duplicates: u64,
    /// Pure ack frames sent.
    pub acks_sent: u64,
    /// Pure ack frames received.
    pub acks_received: u64,
    /// Times a message had to wait for the peer's credits.
    pub credit_stalls: u64,
    /// Times the send window filled up while frames waited (once per stall).
    pub window_stalls: u64,
    /// Messages sent packed with others, several to a PACK frame (first
    /// transmissions).
    pub msgs_packed: u64,
    /// Keepalive probes sent.
    pub keepalives_sent: u64,
    /// Handshake frames sent.
    pub hellos_sent: u64,
    /// Times its Ethernet address was learnt (peers added without one).
    pub macs_learned: u64,
    /// Frames from this peer that were dropped, by reason.
    pub dropped: DropCounters,
}

/// Core-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// Frames dropped before they could be attributed to a peer, by reason.
    pub dropped: DropCounters,
    /// Messages completed as sends.
    pub sends_completed: u64,
    /// Receives completed.
    pub recvs_completed: u64,
    /// Messages that arrived before a matching receive was posted.
    pub unexpected: u64,
    /// Highest number of bytes the unexpected store ever held between
    /// frames (the credit charge of messages waiting for a receive, or
    /// for their turn): a message a posted receive takes as it comes
    /// counts none.
    pub unexpected_high_water: u64,
    /// Rendezvous messages dropped unmatched because their sender withdrew
    /// them (a cancelled send).
    pub withdrawn: u64,
    /// Times the core found a state its own checks rule out (a table full
    /// that its accounting said had room) and dropped the frame or request
    /// at hand. Always 0 unless the core has a bug: a debug build panics
    /// there instead, and a release build counts it here, to be reported.
    pub internal_errors: u64,
}

/// A snapshot of one peer's session state, for tests and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's epoch as known here (0: not yet known).
    pub epoch: u32,
    /// Whether the peer was declared unreachable.
    pub dead: bool,
    /// Next sequence number this side sends.
    pub snd_next: u32,
    /// Reliable frames sent and not yet acknowledged.
    pub in_flight: u32,
    /// Next sequence number expected from the peer.
    pub rcv_next: u32,
    /// Selective-ack bitmap of frames received from the peer.
    pub rcv_sack: u64,
    /// Next message id this side gives a message to the peer.
    pub next_msg_id: u32,
    /// Next message id from the peer to be matched.
    pub next_match: u32,
    /// Credit bytes the peer granted (cumulative limit).
    pub credit_limit: u32,
    /// Credit bytes this side charged (cumulative).
    pub credit_used: u32,
    /// Unexpected-store bytes held for this peer's messages.
    pub held: u64,
    /// Requests that involve the peer.
    pub involved: u32,
    /// Smoothed round-trip time (zero before the first sample).
    pub srtt: core::time::Duration,
    /// The retransmission timeout now, backoff included.
    pub rto: core::time::Duration,
}
