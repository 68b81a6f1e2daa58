//! `emxd`, the emx node daemon, and `emxctl`, its command-line client: what
//! the two share.
//!
//! # emxd
//!
//! ```text
//! emxd --config cluster.toml [--node NAME|ID] [--control PATH]
//!      [--log-level error|warn|info|debug|trace] [--log-format text|json]
//! ```
//!
//! One emxd runs one node of a cluster file (`emx_config`): it works out
//! which node it is (`--node`, else `EMX_NODE`, else a launcher's rank:
//! `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID`), starts the node's
//! engine on its port ([`emx::runtime::start_node`]), opens one endpoint per
//! endpoint of the node, and then serves three things until told to stop:
//!
//! - **A built-in responder** on every endpoint, so that a peer or a
//!   benchmark can measure against the node: the top byte of the match bits
//!   is the operation (ECHO, SINK, PING; see [`ops`] for the convention).
//!   [`ops::ECHO_SLOTS`] any-source ECHO receives stay posted, each with a
//!   buffer of [`ops::max_message`] bytes (16 MiB, or less when the cluster
//!   file's `[memory] region_mb` is small for the node's endpoints: a
//!   quarter of each endpoint's share) in the node's registered region;
//!   an echo goes back from the buffer it arrived in, with no copy (the
//!   prefix the message filled is lent out again as the send's buffer), and
//!   the receive is posted again when the send is done. Longer messages are
//!   truncated to the limit.
//! - **Peer liveness.** The engine declares a peer unreachable only while
//!   something of the endpoint waits on that peer, and it probes a silent
//!   peer (keepalive) only then. So emxd keeps one receive posted per peer,
//!   from that peer only, for PING messages: the peer is always "waited on",
//!   the engine greets it (learning its epoch), probes it every
//!   `protocol.keepalive_us` when it is silent, and declares it down once it
//!   has been silent for `protocol.peer_timeout_us`. No message needs to
//!   flow: the probes are the engine's own frames, answered by the peer's
//!   engine (so a silent peer costs one probe and its answer per keepalive
//!   interval). emxd reads every peer's state every 10 ms
//!   ([`emx::runtime::Endpoint::peers`]) and logs the changes: `peer up`
//!   (epoch learnt), `peer down` (with how long it was silent), `peer
//!   restarted` (a new epoch). A stopped node is therefore reported down
//!   within the liveness deadline, whether or not traffic was flowing; a
//!   restarted one is reported up again with its new epoch as soon as its
//!   first frame arrives. A peer given up is greeted again once per
//!   liveness deadline ([`emx::runtime::Endpoint::reconnect`]) and stays
//!   "down" until it answers, so a healed partition brings both sides back
//!   without a restart (each side's epoch for the other moves on when it
//!   gives it up, and the new session starts clean on both).
//!   A peer is "up" only once its epoch is known.
//!   Peers whose MAC is `auto` in the cluster file are greeted on
//!   broadcast and reported as `unresolved` until their address is learnt
//!   from their first frame (and learnt again when they come back from a
//!   restart on another address).
//! - **A control socket** ([`control`]): a Unix stream socket (default
//!   [`control::default_control_path`], `/run/emx/emxd-<node>.sock`, or
//!   in `$EMX_CONTROL_DIR` when set), one
//!   JSON request per line, one JSON reply per line: `status`, `peers`,
//!   `stats`, `check` (echo messages of given sizes off each peer that is up
//!   and compare every byte) and `shutdown`. It is made mode 0600, so only
//!   emxd's own user may connect.
//!
//! When the node has no polling cores (inline progress), emxd's main loop
//! drives the engine; idle, it spins for 50 us and then sleeps between polls
//! (50 us, growing to 200 us while nothing happens), so that several daemons
//! share a small machine (an idle daemon takes about 2-4% of a core). With a
//! polling core the engine runs on its own thread and the main loop only
//! takes completions.
//!
//! On SIGTERM, SIGINT or SIGHUP (or `shutdown`), emxd stops taking work: it answers
//! running checks with an error, cancels the receives that hold nothing yet,
//! gives every request that carries data (an echo being sent, a message
//! being received) up to two seconds to finish
//! ([`emx::runtime::Endpoint::close`]), logs how many were drained and how
//! many aborted, shuts the engine down, removes the control socket and
//! exits 0.
//!
//! Exit codes: 0 after a clean stop, 2 for a bad configuration (an
//! unreadable or invalid cluster file, an unknown node, cores this machine
//! does not have, a `max_recvs` too small for the responder; the message
//! names the file, line and field), 1 for any other failure to start (the
//! port cannot be opened, the control socket is taken), for an engine that
//! dies under it (its polling thread panicked), and for a second signal
//! during the drain.
//!
//! # emxctl
//!
//! ```text
//! emxctl [--control PATH | --node NAME|ID] status|peers|stats|check|shutdown [--json]
//! emxctl check [--peer NAME|ID] [--sizes 1000,1M,...]
//! emxctl wait [--state up|down] [--peer NAME|ID] [--within SECONDS]
//! ```
//!
//! Prints tables, or emxd's reply with `--json`. Exits 0 when done, 1 when
//! emxd answered that it failed (a check with a failed message, a refusal,
//! `wait`'s deadline), 2 for a mistake in the command line (or several
//! emxds to choose from), 3 when no emxd answered (none running, the socket
//! another user's, no reply in time, a reply that is not emxd's).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod control;
pub mod ops;

pub use control::{default_control_path, Request};
