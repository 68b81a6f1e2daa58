//! Application-side request table: a request handle is a plain id (slot
//! index and generation) into a table sized once at start, so submitting and
//! completing allocate nothing and a stale handle is detected, not misread.

use crate::proto::{Completion, RecvError, RecvInfo, RequestError, RequestId, SendError};

use super::buffer::{RecvBuf, SendBuf};
use super::Error;

/// Handle of a send or receive: a plain id, valid until its completion is
/// taken (by `test`, `test_any`, `take`, the waits, or `close`'s report). A spent handle is refused as
/// unknown, unless it is kept while its slot is used 2^32 - 1 more times
/// (about an hour of a ping-pong, which reuses one slot): its generation then
/// comes round again and it names the slot's request of the day.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request(pub(crate) u64);

/// Bits of a handle's slot index: a table holds at most `max_sends +
/// max_recvs`, 2^25 slots.
const INDEX_BITS: u32 = 25;

impl Request {
    /// Generation in the high 32 bits, then the table's tag (7 bits), then
    /// the slot index.
    pub(crate) fn new(tag: u32, index: u32, gen: u32) -> Request {
        debug_assert!(index < 1 << INDEX_BITS && tag < 1 << (32 - INDEX_BITS));
        Request(u64::from(gen) << 32 | u64::from(tag) << INDEX_BITS | u64::from(index))
    }
    pub(crate) fn index(self) -> usize {
        (self.0 & ((1 << INDEX_BITS) - 1)) as usize
    }
    fn tag(self) -> u32 {
        (self.0 as u32) >> INDEX_BITS
    }
    pub(crate) fn gen(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// A message taken by a matched probe
/// ([`Endpoint::mprobe`](super::Endpoint::mprobe)): no receive matches it any
/// more, and [`Endpoint::imrecv`](super::Endpoint::imrecv) (or
/// [`mrecv`](super::Endpoint::mrecv)) on the endpoint that probed it receives
/// it. Plain data, as a [`Request`] is: a handle used once is refused as
/// unknown ([`RecvError::UnknownMessage`]), and so is another endpoint's.
///
/// Until it is received, the message keeps its room in the unexpected store
/// and its sender's credit, as an unexpected message does: one claimed and
/// never received holds them until the endpoint closes (receive it into an
/// empty buffer to drop it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a claimed message holds its sender's credit until it is received"]
pub struct Message {
    pub(crate) id: crate::proto::MessageId,
    /// The number of the request table of the endpoint that claimed it.
    pub(crate) table: u32,
    /// Its envelope: sender, match bits and length.
    pub info: crate::proto::ProbeInfo,
}

/// The buffer a request carried, handed back at completion.
#[derive(Debug)]
pub enum Buf {
    /// A send's buffer.
    Send(SendBuf),
    /// A receive's buffer.
    Recv(RecvBuf),
}

/// A finished request: its buffer, and what happened.
#[derive(Debug)]
pub struct Completed {
    /// The buffer, handed back.
    pub buf: Buf,
    /// `Ok(None)` for a send, `Ok(Some(info))` for a receive, or the error.
    pub result: Result<Option<RecvInfo>, Error>,
}

impl Completed {
    /// A finished receive: the buffer and what arrived, or the error. With
    /// the error the buffer is dropped; to keep it (a registered buffer, say),
    /// take [`buf`](Completed::buf) and [`result`](Completed::result) apart
    /// instead. A message longer than the buffer is not an error here (MPI
    /// would say `MPI_ERR_TRUNCATE`): it filled the buffer, and
    /// [`RecvInfo::truncated`] says so, with its whole length in `msg_len`.
    pub fn into_recv(self) -> Result<(RecvBuf, RecvInfo), Error> {
        match (self.buf, self.result) {
            (Buf::Recv(b), Ok(Some(info))) => Ok((b, info)),
            (_, Err(e)) => Err(e),
            _ => Err(Error::WrongKind),
        }
    }

    /// A finished send: the buffer back, or the error. With the error the
    /// buffer is dropped; take [`buf`](Completed::buf) and
    /// [`result`](Completed::result) apart to keep it.
    pub fn into_send(self) -> Result<SendBuf, Error> {
        match (self.buf, self.result) {
            (Buf::Send(b), Ok(None)) => Ok(b),
            (_, Err(e)) => Err(e),
            _ => Err(Error::WrongKind),
        }
    }
}

/// A completion as the protocol core hands it over.
pub(crate) type CoreCompletion = Completion<SendBuf, RecvBuf>;

enum State {
    Free,
    Pending,
    /// Finished in the core: kept as the core handed it and turned into a
    /// [`Completed`] when taken. (Converting on the way in cost a second
    /// copy of a differently laid out value on every completion, and its
    /// reads stalled on the stores just made.)
    Finished(CoreCompletion),
    /// Finished otherwise (refused by the core on the polling thread).
    Done(Completed),
}

/// The caller's context value of a core completion: the request it finishes.
#[inline]
pub(crate) fn request_of(c: &CoreCompletion) -> Request {
    match c {
        Completion::Send(s) => Request(s.ctx),
        Completion::Recv(r) => Request(r.ctx),
    }
}

/// A core completion as the application sees it.
#[inline]
fn completed(c: CoreCompletion) -> Completed {
    match c {
        Completion::Send(s) => Completed {
            buf: Buf::Send(s.buf),
            result: s.result.map(|()| None).map_err(request_error),
        },
        Completion::Recv(r) => Completed {
            buf: Buf::Recv(r.buf),
            result: r.result.map(Some).map_err(request_error),
        },
    }
}

/// A request aborted by a shutdown ends with [`Error::ShutDown`].
fn request_error(e: RequestError) -> Error {
    match e {
        RequestError::Aborted => Error::ShutDown,
        e => Error::Request(e),
    }
}

/// What a request is: sends and receives are bounded apart, as in the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Send = 0,
    Recv = 1,
}

struct Slot {
    gen: u32,
    state: State,
    kind: Kind,
    /// The core's id for it, once the core took it (for cancel).
    core: Option<RequestId>,
    /// A rendezvous send (which a cancel may withdraw).
    rndv: bool,
}

pub(crate) struct Requests {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// This table's tag, in every handle it gives.
    tag: u32,
    /// This table's number (the tag is its low bits), in every [`Message`]
    /// of its endpoint.
    table: u32,
    /// Pending sends and receives, by [`Kind`]: submitted and not finished.
    pending: [usize; 2],
    /// The most of each that may be pending: the core's `max_sends` and
    /// `max_recvs`. Refused here, in the call: a polling thread that found
    /// the core full refused a request after the call had taken it, while
    /// later ones went in, so a later message overtook an earlier one.
    limit: [usize; 2],
}

/// The next table's tag (see [`Requests::new`]).
static NEXT_TABLE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Requests {
    /// A table for `max_sends` sends and `max_recvs` receives, pending or
    /// finished and not yet taken (one slot each until it is taken).
    pub(crate) fn new(max_sends: usize, max_recvs: usize) -> Requests {
        let n = max_sends + max_recvs;
        assert!(n <= 1 << INDEX_BITS, "at most 2^25 requests");
        // Each table tags its handles (128 tags, taken in turn), so that a
        // handle from another endpoint, or another engine, is refused as
        // unknown rather than taken for one of this table's, however often
        // either table's slots were reused. (Generations from distinct bases
        // alone did this until a slot had been reused 2^24 times, about 10 s
        // of a ping-pong, which reuses one slot.)
        // Tables 128 apart share a tag: their generations start 2^24 apart
        // too, so that aliasing needs both to line up.
        let table = NEXT_TABLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = table % (1 << (32 - INDEX_BITS));
        let base = (table >> (32 - INDEX_BITS)).wrapping_shl(24) | 1;
        Requests {
            slots: (0..n)
                .map(|_| Slot {
                    gen: base,
                    state: State::Free,
                    kind: Kind::Send,
                    core: None,
                    rndv: false,
                })
                .collect(),
            free: (0..n as u32).rev().collect(),
            tag,
            table,
            pending: [0; 2],
            limit: [max_sends, max_recvs],
        }
    }

    /// This table's number (see [`new`](Self::new)), which every
    /// [`Message`] of its endpoint carries.
    pub(crate) fn table(&self) -> u32 {
        self.table
    }

    /// The slot `r` names, if `r` is one of this table's handles.
    fn slot(&self, r: Request) -> Option<&Slot> {
        (r.tag() == self.tag)
            .then(|| self.slots.get(r.index()))
            .flatten()
    }

    /// A slot for a new request of `kind` (`rndv`: a rendezvous send, which
    /// a cancel may withdraw), or why there is none: as many of its kind
    /// pending as the core takes, or the table full of completions not yet
    /// taken.
    pub(crate) fn alloc(&mut self, kind: Kind, rndv: bool) -> Result<Request, Error> {
        if self.pending[kind as usize] >= self.limit[kind as usize] {
            return Err(match kind {
                Kind::Send => Error::Send(SendError::TooManySends),
                Kind::Recv => Error::Recv(RecvError::TooManyRecvs),
            });
        }
        let i = self.free.pop().ok_or(Error::TooManyRequests)?;
        let s = &mut self.slots[i as usize];
        let old = std::mem::replace(&mut s.state, State::Pending);
        // A free slot holds nothing: forgetting it spares the call to the
        // drop glue of `State` on every request.
        debug_assert!(matches!(old, State::Free), "a free slot");
        std::mem::forget(old);
        s.core = None;
        s.kind = kind;
        s.rndv = rndv;
        self.pending[kind as usize] += 1;
        Ok(Request::new(self.tag, i, s.gen))
    }

    /// Gives an allocated, never-submitted slot back.
    pub(crate) fn release(&mut self, r: Request) {
        let Some(s) = self.slot_mut(r) else { return };
        let was_pending = matches!(s.state, State::Pending);
        let k = s.kind as usize;
        s.state = State::Free;
        s.gen = s.gen.wrapping_add(1).max(1);
        self.free.push(r.index() as u32);
        if was_pending {
            self.pending[k] -= 1;
        }
    }

    fn slot_mut(&mut self, r: Request) -> Option<&mut Slot> {
        if r.tag() != self.tag {
            return None;
        }
        self.slots
            .get_mut(r.index())
            .filter(|s| s.gen == r.gen() && !matches!(s.state, State::Free))
    }

    /// Records the core's id of `r`, which [`alloc`](Self::alloc) just gave.
    pub(crate) fn set_core(&mut self, r: Request, id: RequestId) {
        debug_assert!(self.slots[r.index()].gen == r.gen(), "a live request");
        self.slots[r.index()].core = Some(id);
    }

    /// The core's id of `r` while it is pending. Not once it finished: the
    /// core may have given that slot to a newer request, whose id the old
    /// one matches again once the core's generations wrap (2^31 uses of a
    /// slot), and a cancel of the finished handle would cancel it.
    pub(crate) fn core_id(&self, r: Request) -> Option<RequestId> {
        self.slot(r)
            .filter(|s| s.gen == r.gen() && matches!(s.state, State::Pending))
            .and_then(|s| s.core)
    }

    /// Records a completion for the request `r` (one the core did not take).
    pub(crate) fn complete(&mut self, r: Request, c: Completed) {
        let Some(s) = self.slot_mut(r) else { return };
        let was_pending = matches!(s.state, State::Pending);
        let k = s.kind as usize;
        s.state = State::Done(c);
        if was_pending {
            self.pending[k] -= 1;
        }
    }

    /// Records a completion from the core, for the request its ctx names.
    #[inline]
    pub(crate) fn finish(&mut self, c: CoreCompletion) {
        let Some(s) = self.slot_mut(request_of(&c)) else {
            return;
        };
        // Only a pending request takes it; matching `Pending` first also
        // spares the assignment a drop of the old state.
        if matches!(s.state, State::Pending) {
            let k = s.kind as usize;
            s.state = State::Finished(c);
            self.pending[k] -= 1;
        }
    }

    /// Whether the live request `r` is an eager send (which no cancel takes
    /// back).
    pub(crate) fn is_eager_send(&self, r: Request) -> bool {
        self.slot(r)
            .filter(|s| s.gen == r.gen() && !matches!(s.state, State::Free))
            .is_some_and(|s| s.kind == Kind::Send && !s.rndv)
    }

    pub(crate) fn is_done(&self, r: Request) -> Result<bool, Error> {
        match self.slot(r) {
            Some(s) if s.gen == r.gen() => match s.state {
                State::Free => Err(Error::UnknownRequest),
                State::Pending => Ok(false),
                State::Finished(_) | State::Done(_) => Ok(true),
            },
            _ => Err(Error::UnknownRequest),
        }
    }

    /// Takes the completion out (freeing the slot) if there is one.
    pub(crate) fn take(&mut self, r: Request) -> Result<Option<Completed>, Error> {
        if !self.is_done(r)? {
            return Ok(None);
        }
        Ok(Some(self.take_done(r)))
    }

    /// Takes the completion out (freeing the slot) of a request that
    /// [`is_done`](Self::is_done) just called done.
    pub(crate) fn take_done(&mut self, r: Request) -> Completed {
        let s = &mut self.slots[r.index()];
        debug_assert!(s.gen == r.gen(), "a live request");
        s.gen = s.gen.wrapping_add(1).max(1);
        let state = std::mem::replace(&mut s.state, State::Free);
        self.free.push(r.index() as u32);
        // Converted last, straight into the value returned: built in a
        // temporary and then copied whole, its copy stalled on the stores
        // that had just built it.
        match state {
            State::Finished(c) => completed(c),
            State::Done(c) => c,
            State::Free | State::Pending => unreachable!("checked done"),
        }
    }

    /// Every request whose handle is live: pending, or finished and not
    /// yet taken.
    pub(crate) fn live(&self) -> impl Iterator<Item = Request> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !matches!(s.state, State::Free))
            .map(|(i, s)| Request::new(self.tag, i as u32, s.gen))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handle of one table stays unknown to another however often their
    /// slots were reused: a ping-pong reuses one slot, and 2^24 reuses used
    /// to carry a table's generations into the next table's.
    #[test]
    fn another_tables_handle_stays_unknown() {
        let mut a = Requests::new(2, 2);
        let mut b = Requests::new(2, 2);
        let kept = b.alloc(Kind::Send, false).unwrap();
        for _ in 0..(1u32 << 24) {
            let r = a.alloc(Kind::Send, false).unwrap();
            a.release(r);
        }
        let r = a.alloc(Kind::Recv, false).unwrap();
        assert!(matches!(b.is_done(r), Err(Error::UnknownRequest)));
        assert!(matches!(a.is_done(kept), Err(Error::UnknownRequest)));
        assert!(matches!(b.is_done(kept), Ok(false)));
        assert!(matches!(a.is_done(r), Ok(false)));
    }

    /// A finished request, not yet taken, has no core id any more: the
    /// core's slot may be a newer request's, which a cancel of the old
    /// handle would hit once the core's generations wrapped.
    #[test]
    fn a_finished_request_has_no_core_id() {
        let mut t = Requests::new(2, 2);
        let r = t.alloc(Kind::Recv, false).unwrap();
        t.set_core(r, RequestId::recv(0, 1));
        assert_eq!(t.core_id(r), Some(RequestId::recv(0, 1)));
        t.complete(
            r,
            Completed {
                buf: Buf::Recv(RecvBuf::Owned(Vec::new())),
                result: Err(Error::ShutDown),
            },
        );
        assert_eq!(t.core_id(r), None);
    }
}
