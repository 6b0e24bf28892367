//! Unit tests and model-based property tests of the framing buffers.

use super::*;
use proptest::prelude::*;
use std::collections::VecDeque;

// ---- RxBuf -------------------------------------------------------------------

#[test]
fn rx_compacts_only_when_a_unit_might_not_fit() {
    let mut rx = RxBuf::new(100, 40);
    assert_eq!(rx.fill_from(&[1; 70]), 70);
    rx.consume(65);
    // 30 bytes free after the tail: less than a unit, so the 5 left move.
    assert_eq!(rx.space().len(), 95);
    assert_eq!(rx.head(), 0);
    assert_eq!(rx.pending(), &[1; 5]);
    rx.consume(5);
    // Empty: restarts at the front without copying.
    assert_eq!(rx.space().len(), 100);
}

#[test]
fn rx_positions_of_consumed_bytes_stay_valid_until_space() {
    let mut rx = RxBuf::new(64, 16);
    rx.fill_from(b"headerDATAnext");
    let at = rx.head();
    rx.consume(10);
    assert_eq!(&rx[at + 6..at + 10], b"DATA");
    assert_eq!(rx.pending(), b"next");
}

#[test]
fn rx_commit_and_consume_never_overrun() {
    let mut rx = RxBuf::new(8, 8);
    let n = rx.fill_from(&[7; 20]);
    assert_eq!(n, 8);
    assert!(rx.space().is_empty(), "full of unparsed bytes");
    rx.consume(8);
    assert_eq!(rx.space().len(), 8);
}

#[derive(Clone, Debug)]
enum RxOp {
    /// Receive up to this many bytes (bounded by the space).
    Recv(usize),
    /// Consume up to this many bytes (bounded by what is pending).
    Consume(usize),
}

fn rx_op() -> impl Strategy<Value = RxOp> {
    prop_oneof![
        (1usize..300).prop_map(RxOp::Recv),
        (0usize..300).prop_map(RxOp::Consume),
    ]
}

proptest! {
    /// Random receives and consumes against a plain byte queue: the pending
    /// bytes always match, consumed positions stay readable until the next
    /// `space`, and an incomplete unit always has room to complete.
    #[test]
    fn rx_matches_a_byte_queue(cap in 1usize..512, unit in 1usize..256, ops in proptest::collection::vec(rx_op(), 0..200)) {
        let mut rx = RxBuf::new(cap, unit);
        let mut model: VecDeque<u8> = VecDeque::new();
        let mut next = 0u8;
        for op in ops {
            match op {
                RxOp::Recv(want) => {
                    let space = rx.space();
                    let len_before = model.len();
                    if len_before < unit {
                        prop_assert!(space.len() >= unit - len_before, "a unit must fit");
                    }
                    let n = want.min(space.len());
                    for b in &mut space[..n] {
                        *b = next;
                        model.push_back(next);
                        next = next.wrapping_add(1);
                    }
                    rx.commit(n);
                }
                RxOp::Consume(want) => {
                    let n = want.min(rx.len());
                    let at = rx.head();
                    let taken: Vec<u8> = model.drain(..n).collect();
                    rx.consume(n);
                    prop_assert_eq!(&rx[at..at + n], &taken[..]);
                }
            }
            prop_assert!(rx.pending().iter().eq(model.iter()));
            prop_assert_eq!(rx.len(), model.len());
        }
    }
}

// ---- TxQueue -----------------------------------------------------------------

/// Payload buffers for tests: buffer `i` holds bytes `i, i+1, ...`.
fn bufs() -> Vec<Vec<u8>> {
    (0..4u8)
        .map(|i| (0..4096u32).map(|j| i.wrapping_add(j as u8)).collect())
        .collect()
}

fn all_unsent(tx: &TxQueue, b: &[Vec<u8>]) -> Vec<u8> {
    tx.unsent(|s| &b[s as usize][..])
        .flatten()
        .copied()
        .collect()
}

#[test]
fn partial_sends_release_only_when_fully_sent() {
    let b = bufs();
    let mut tx = TxQueue::default();
    tx.push_bytes(NO_RELEASE, |w| {
        w[..24].fill(1);
        24
    });
    tx.push_data(3, 0, 100, NO_RELEASE);
    tx.push_bytes(3, |w| {
        w[..24].fill(2);
        24
    });
    let mut released = vec![];
    tx.advance(24 + 99, |s| released.push(s));
    assert!(released.is_empty());
    let mut iov = vec![];
    tx.fill_iovecs(&mut iov, 64, |s| &b[s as usize][..]);
    assert_eq!(iov.len(), 2);
    assert_eq!(iov[0].iov_len, 1, "one byte of the payload is left");
    tx.advance(1 + 24, |s| released.push(s));
    assert_eq!(released, vec![3]);
    assert!(tx.is_empty());
    assert!(tx.has_room(), "arena is recycled once drained");
}

#[test]
fn has_room_guarantees_one_response_without_a_new_chunk() {
    let mut tx = TxQueue::new(4096, 4096);
    while tx.has_room() {
        for _ in 0..3 {
            tx.push_bytes(NO_RELEASE, |w| {
                w[..PUSH_MAX].fill(9);
                PUSH_MAX
            });
        }
    }
    assert!(tx.more.is_empty(), "no chunk beyond the first was needed");
    // Past the limit, pushes still succeed (in a new chunk) instead of failing.
    for _ in 0..3 {
        tx.push_bytes(NO_RELEASE, |w| {
            w[..PUSH_MAX].fill(9);
            PUSH_MAX
        });
    }
    assert_eq!(tx.more.len(), 1);
    assert!(all_unsent(&tx, &[]).iter().all(|&x| x == 9));
}

#[test]
fn drain_releases_reports_every_tag_and_empties() {
    let mut tx = TxQueue::new(1024, 64);
    tx.push_slice(b"abc", 1);
    tx.push_data(0, 0, 10, 2);
    tx.advance(1, |_| panic!("nothing is complete"));
    let mut tags = vec![];
    tx.drain_releases(|t| tags.push(t));
    assert_eq!(tags, vec![1, 2]);
    assert!(tx.is_empty());
    assert_eq!(tx.pending_bytes(), 0);
}

#[derive(Clone, Debug)]
enum TxOp {
    /// Header bytes through the closure window, with a release tag.
    Bytes(usize, Option<u16>),
    /// A copied slice (may exceed one chunk).
    Slice(usize, Option<u16>),
    /// A payload reference: buffer, offset, length, tag.
    Data(u16, u32, u32, Option<u16>),
    /// The socket took up to this many bytes.
    Advance(usize),
    /// Take iovecs, push more, and check the old pointers still read right.
    Iovecs,
}

fn tag() -> impl Strategy<Value = Option<u16>> {
    proptest::option::of(0u16..100)
}

fn tx_op() -> impl Strategy<Value = TxOp> {
    prop_oneof![
        (1usize..=PUSH_MAX, tag()).prop_map(|(n, t)| TxOp::Bytes(n, t)),
        (1usize..1500, tag()).prop_map(|(n, t)| TxOp::Slice(n, t)),
        (0u16..4, 0u32..2048, 1u32..2048, tag()).prop_map(|(s, o, l, t)| TxOp::Data(s, o, l, t)),
        (0usize..3000).prop_map(TxOp::Advance),
        Just(TxOp::Iovecs),
    ]
}

/// The model: the expected stream as (bytes, tag) pieces, front first.
struct Model {
    pieces: VecDeque<(Vec<u8>, u16)>,
    sent_in_front: usize,
}

impl Model {
    fn stream(&self) -> Vec<u8> {
        let mut v: Vec<u8> = self.pieces.iter().flat_map(|p| p.0.clone()).collect();
        v.drain(..self.sent_in_front);
        v
    }
    /// Sends `n` bytes; returns the tags of pieces completed.
    fn advance(&mut self, mut n: usize) -> Vec<u16> {
        let mut tags = vec![];
        while n > 0 {
            let Some((b, t)) = self.pieces.front() else {
                break;
            };
            let left = b.len() - self.sent_in_front;
            if n < left {
                self.sent_in_front += n;
                break;
            }
            n -= left;
            if *t != NO_RELEASE {
                tags.push(*t);
            }
            self.pieces.pop_front();
            self.sent_in_front = 0;
        }
        tags
    }
}

proptest! {
    /// Random pushes and advances against a plain list of pieces: the unsent
    /// stream, the released tags and their order always match, and iovecs
    /// taken earlier stay valid while more is pushed.
    #[test]
    fn tx_matches_a_list_of_pieces(arena in 256usize..3000, ops in proptest::collection::vec(tx_op(), 0..120)) {
        let b = bufs();
        let mut tx = TxQueue::new(arena, 1024);
        let mut m = Model { pieces: VecDeque::new(), sent_in_front: 0 };
        let mut fill = 0u8;
        for op in ops {
            match op {
                TxOp::Bytes(n, t) => {
                    fill = fill.wrapping_add(1);
                    let t = t.unwrap_or(NO_RELEASE);
                    tx.push_bytes(t, |w| { w[..n].fill(fill); n });
                    m.pieces.push_back((vec![fill; n], t));
                }
                TxOp::Slice(n, t) => {
                    fill = fill.wrapping_add(1);
                    let t = t.unwrap_or(NO_RELEASE);
                    let v: Vec<u8> = (0..n).map(|i| fill ^ i as u8).collect();
                    tx.push_slice(&v, t);
                    m.pieces.push_back((v, t));
                }
                TxOp::Data(s, off, len, t) => {
                    let t = t.unwrap_or(NO_RELEASE);
                    tx.push_data(s, off, len, t);
                    let (o, l) = (off as usize, len as usize);
                    m.pieces.push_back((b[s as usize][o..o + l].to_vec(), t));
                }
                TxOp::Advance(want) => {
                    let n = want.min(tx.pending_bytes());
                    let mut got = vec![];
                    tx.advance(n, |t| got.push(t));
                    prop_assert_eq!(got, m.advance(n));
                }
                TxOp::Iovecs => {
                    let mut iov = vec![];
                    tx.fill_iovecs(&mut iov, usize::MAX, |s| &b[s as usize][..]);
                    let before = m.stream();
                    tx.push_slice(&[0xEE; 700], NO_RELEASE);
                    m.pieces.push_back((vec![0xEE; 700], NO_RELEASE));
                    let mut seen = vec![];
                    for v in &iov {
                        // SAFETY: the pointers came from fill_iovecs; nothing was
                        // advanced since, and arena chunks never move or free.
                        seen.extend_from_slice(unsafe {
                            std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
                        });
                    }
                    prop_assert_eq!(seen, before);
                }
            }
            prop_assert_eq!(all_unsent(&tx, &b), m.stream());
            prop_assert_eq!(tx.pending_bytes(), m.stream().len());
            prop_assert_eq!(tx.is_empty(), m.pieces.is_empty());
        }
    }
}

#[test]
fn a_cleared_buffer_is_reusable_as_the_one_new_would_make() {
    let mut b = RxBuf::new(1000, 100);
    b.space()[..10].copy_from_slice(&[7; 10]);
    b.commit(10);
    assert!(!b.is_empty());
    b.clear();
    assert!(b.is_empty());
    assert_eq!(b.space().len(), 1000, "all of it free again");
    assert!(b.reusable_as(1000, 100));
    assert!(!b.reusable_as(2000, 100) && !b.reusable_as(1000, 200));
    // A capacity below the unit is raised to the unit, as new() does.
    assert!(RxBuf::new(10, 100).reusable_as(10, 100));
}
