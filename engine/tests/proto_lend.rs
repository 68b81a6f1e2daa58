//! Lending receives at the core: a one-frame eager message is reported, not
//! copied, when the caller can keep the frame; everything else is copied into
//! a buffer fitted to it, and nothing longer than the eager threshold is taken.

use emx::proto::{Addr, Completion, Core, CoreConfig, MacAddr, RecvBuffer, RequestId, Time};

/// A receive buffer that lends, like the runtime's `RecvBuf::Lending`.
#[derive(Debug, PartialEq, Eq)]
enum Buf {
    Lending,
    Owned(Vec<u8>),
}

impl AsMut<[u8]> for Buf {
    fn as_mut(&mut self) -> &mut [u8] {
        match self {
            Buf::Lending => &mut [],
            Buf::Owned(v) => v,
        }
    }
}

impl RecvBuffer for Buf {
    fn lends(&self) -> bool {
        *self == Buf::Lending
    }
    fn fit(&mut self, len: usize) {
        if self.lends() {
            *self = Buf::Owned(vec![0; len]);
        }
    }
}

type C = Core<Vec<u8>, Buf>;

fn pair(cfg: &CoreConfig) -> (C, C) {
    let (ma, mb) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
    let mut a = C::new(cfg.clone(), Addr::new(1, 0), ma, 1, Time::ZERO).unwrap();
    let mut b = C::new(cfg.clone(), Addr::new(2, 0), mb, 1, Time::ZERO).unwrap();
    a.add_peer(Addr::new(2, 0), mb).unwrap();
    b.add_peer(Addr::new(1, 0), ma).unwrap();
    (a, b)
}

/// A received message: lent (the frame and the range in it) or copied.
#[derive(Debug)]
enum Got {
    Lent(Vec<u8>, usize, usize),
    Copied(Vec<u8>, bool),
}

/// Runs both cores until nothing moves; `lend` says whether b may keep frames.
/// Returns b's finished receives by request.
fn run(a: &mut C, b: &mut C, now: &mut Time, lend: bool) -> Vec<(RequestId, Got)> {
    let mut got = Vec::new();
    let mut lent: Vec<(RequestId, Vec<u8>, usize, usize)> = Vec::new();
    let mut hdr = [0u8; 256];
    for _ in 0..10_000 {
        let mut moved = false;
        for side in 0..2 {
            let (tx, rx) = if side == 0 {
                (&mut *a, &mut *b)
            } else {
                (&mut *b, &mut *a)
            };
            while let Some(t) = tx.poll_transmit(*now, &mut hdr) {
                let mut frame = hdr[..t.header_len].to_vec();
                if let Some(p) = t.payload {
                    frame.extend_from_slice(tx.payload(&p).unwrap());
                }
                // Ethernet pads short frames.
                frame.resize(frame.len().max(60), 0);
                moved = true;
                if side == 0 && lend {
                    if let Some(l) = rx.handle_frame_lending(*now, &frame).unwrap() {
                        lent.push((l.req, frame, l.offset, l.len));
                    }
                } else {
                    let _ = rx.handle_frame(*now, &frame);
                }
            }
        }
        while let Some(c) = b.poll_completion() {
            if let Completion::Recv(d) = c {
                let info = d.result.unwrap();
                match d.buf {
                    Buf::Lending => {
                        let k = lent.iter().position(|l| l.0 == d.req).expect("lent frame");
                        let (req, f, o, n) = lent.swap_remove(k);
                        assert_eq!(n as u64, info.copied);
                        got.push((req, Got::Lent(f, o, n)));
                    }
                    Buf::Owned(v) => {
                        assert_eq!(v.len() as u64, info.copied);
                        got.push((d.req, Got::Copied(v, info.truncated)));
                    }
                }
            }
        }
        while a.poll_completion().is_some() {}
        if !moved {
            match a.poll_timeout().into_iter().chain(b.poll_timeout()).min() {
                Some(t) if t.0 < now.0 + 1_000_000 => {
                    *now = t.max(*now);
                    a.handle_timeout(*now);
                    b.handle_timeout(*now);
                }
                _ => break,
            }
        }
    }
    assert!(lent.is_empty(), "every lent frame has its completion");
    got
}

fn msg(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn one_frame_messages_are_lent_not_copied() {
    let cfg = CoreConfig::default();
    let (mut a, mut b) = pair(&cfg);
    let mut now = Time::ZERO;
    // Learn epochs first, so that messages go out at once.
    run(&mut a, &mut b, &mut now, true);
    for (k, len) in [0usize, 1, 8, 100, 1400].into_iter().enumerate() {
        let r = b
            .post_recv(now, None, 7, u64::MAX, Buf::Lending, 0)
            .unwrap();
        let m = msg(len, k as u8);
        a.send(now, Addr::new(2, 0), 7, m.clone(), 0).unwrap();
        let got = run(&mut a, &mut b, &mut now, true);
        assert_eq!(got.len(), 1);
        match &got[0] {
            (req, Got::Lent(f, o, n)) => {
                assert_eq!(*req, r);
                assert_eq!(&f[*o..*o + *n], &m[..], "len {len}");
            }
            other => panic!("len {len}: not lent: {other:?}"),
        }
    }
}

#[test]
fn lending_receives_copy_what_cannot_be_lent() {
    let cfg = CoreConfig::default();
    let eager = cfg.eager_threshold as usize;
    let (mut a, mut b) = pair(&cfg);
    let mut now = Time::ZERO;
    run(&mut a, &mut b, &mut now, true);

    // The caller cannot keep frames: copied into a buffer of the message's size.
    let m = msg(300, 1);
    b.post_recv(now, None, 1, u64::MAX, Buf::Lending, 0)
        .unwrap();
    a.send(now, Addr::new(2, 0), 1, m.clone(), 0).unwrap();
    let got = run(&mut a, &mut b, &mut now, false);
    assert!(matches!(&got[..], [(_, Got::Copied(v, false))] if *v == m));

    // Arrived before the receive: copied out of the unexpected store.
    let m = msg(500, 2);
    a.send(now, Addr::new(2, 0), 2, m.clone(), 0).unwrap();
    assert!(run(&mut a, &mut b, &mut now, true).is_empty());
    b.post_recv(now, None, 2, u64::MAX, Buf::Lending, 0)
        .unwrap();
    let got = run(&mut a, &mut b, &mut now, true);
    assert!(matches!(&got[..], [(_, Got::Copied(v, false))] if *v == m));

    // Spans frames (eager, longer than one frame): copied.
    let m = msg(eager.min(4000), 3);
    b.post_recv(now, None, 3, u64::MAX, Buf::Lending, 0)
        .unwrap();
    a.send(now, Addr::new(2, 0), 3, m.clone(), 0).unwrap();
    let got = run(&mut a, &mut b, &mut now, true);
    assert!(matches!(&got[..], [(_, Got::Copied(v, false))] if *v == m));

    // Rendezvous: truncated to the eager threshold.
    let m = msg(eager * 3 + 17, 4);
    b.post_recv(now, None, 4, u64::MAX, Buf::Lending, 0)
        .unwrap();
    a.send(now, Addr::new(2, 0), 4, m.clone(), 0).unwrap();
    let got = run(&mut a, &mut b, &mut now, true);
    match &got[..] {
        [(_, Got::Copied(v, true))] => assert_eq!(&v[..], &m[..eager]),
        other => panic!("rendezvous to a lending receive: {other:?}"),
    }
}

#[test]
fn packed_messages_are_copied_into_lending_receives() {
    // Messages queued together leave in one PACK frame, which cannot be lent to
    // several receives: each comes back copied, whole and in order.
    let cfg = CoreConfig::default();
    let (mut a, mut b) = pair(&cfg);
    let mut now = Time::ZERO;
    run(&mut a, &mut b, &mut now, true);
    let msgs: Vec<Vec<u8>> = (0..5).map(|k| msg(3 + 10 * k, k as u8)).collect();
    let reqs: Vec<RequestId> = msgs
        .iter()
        .map(|_| {
            b.post_recv(now, None, 9, u64::MAX, Buf::Lending, 0)
                .unwrap()
        })
        .collect();
    for m in &msgs {
        a.send(now, Addr::new(2, 0), 9, m.clone(), 0).unwrap();
    }
    let got = run(&mut a, &mut b, &mut now, true);
    assert_eq!(got.len(), msgs.len());
    for ((req, got), (r, m)) in got.iter().zip(reqs.iter().zip(&msgs)) {
        assert_eq!(req, r);
        assert!(matches!(got, Got::Copied(v, false) if v == m), "{got:?}");
    }
    assert!(b.stats().dropped.total() == 0);
}
