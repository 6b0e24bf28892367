//! The tag a backend request carries back, and the completion it comes back
//! in (issue 31 item 2, "typed, not bit-packed").
//!
//! A backend treats a [`Tag`] as opaque: it keeps it beside the request and
//! returns it in a [`Completion`]. Three layers hand tags down, and each
//! must know its own completions from the ones it passes up:
//!
//! * a connection: [`IoTag`], its index on the reactor and the command's slot;
//! * the Gimbal scheduler (`data::qos`): the driver slot of a request it
//!   scheduled ([`Tag::scheduled`]);
//! * the chunking queue ([`super::zero::Chunked`]): the job id of a piece of
//!   a Write Zeroes or Deallocate ([`Tag::piece`]).
//!
//! This module is the one place that lays those out in the `u64` (two kind
//! bits above a payload); everyone else builds and reads tags through it.
//! A tag stays a `u64` and a completion the 16 bytes a `(u64, Status)` was:
//! the reactor reaps them into one reused `Vec` on every loop.

use trellis_nvme::Status;

/// Layout of a tag (private: nothing outside this module shifts or masks).
/// Bit 63: a request the scheduler sent; bit 62: a chunking queue's piece;
/// neither: a connection's command, connection index in bits 16..48 and
/// slot in bits 0..16.
const SCHEDULED: u64 = 1 << 63;
const PIECE: u64 = 1 << 62;
const KIND: u64 = SCHEDULED | PIECE;
const SLOT_BITS: u32 = u16::BITS;

// A connection's tag never reaches the kind bits, whatever its index.
const _: () = assert!(((IoTag::CONN_MAX as u64) << SLOT_BITS | u16::MAX as u64) < PIECE);
// Every connection a node admits has an index a tag holds (indexes run
// from 0 to max_connections - 1).
const _: () = assert!(crate::config::MAX_CONNECTIONS_CEILING - 1 <= IoTag::CONN_MAX as usize);
// As small as what they replace: the reaped Vec and the slots stay as they were.
const _: () = assert!(size_of::<Tag>() == size_of::<u64>());
const _: () = assert!(size_of::<IoTag>() <= size_of::<u64>());
const _: () = assert!(size_of::<Completion>() <= size_of::<(u64, Status)>());

/// The opaque tag a backend request carries back to whoever submitted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct Tag(u64);

/// A connection's command: the connection's index on its reactor and the
/// command's slot in that connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct IoTag {
    conn: u32,
    slot: u16,
}

impl IoTag {
    /// The highest connection index a tag holds: the index is a `u32`, and
    /// `target.max_connections` is held below it
    /// (`config::MAX_CONNECTIONS_CEILING`).
    pub const CONN_MAX: u32 = u32::MAX;

    pub const fn new(conn: u32, slot: u16) -> IoTag {
        IoTag { conn, slot }
    }
    /// The connection's index on its reactor.
    pub const fn conn(self) -> u32 {
        self.conn
    }
    /// The command's slot in its connection.
    pub const fn slot(self) -> u16 {
        self.slot
    }
}

impl From<IoTag> for Tag {
    #[inline]
    fn from(t: IoTag) -> Tag {
        Tag((t.conn as u64) << SLOT_BITS | t.slot as u64)
    }
}

impl Tag {
    /// A request the scheduler sent to the backend from its driver slot
    /// `slot` (below `qos.max_requests`, a `u32`).
    #[inline]
    pub const fn scheduled(slot: u32) -> Tag {
        Tag(SCHEDULED | slot as u64)
    }
    /// A piece of the chunking queue's job `job`.
    #[inline]
    pub const fn piece(job: u32) -> Tag {
        Tag(PIECE | job as u64)
    }
    /// The connection's command, when this is a connection's tag.
    #[inline]
    pub const fn io(self) -> Option<IoTag> {
        if self.0 & KIND != 0 {
            return None;
        }
        Some(IoTag {
            conn: (self.0 >> SLOT_BITS) as u32,
            slot: self.0 as u16,
        })
    }
    /// The driver slot, when the scheduler sent this request.
    #[inline]
    pub const fn as_scheduled(self) -> Option<u32> {
        match self.0 & KIND {
            SCHEDULED => Some(self.0 as u32),
            _ => None,
        }
    }
    /// The job id, when this is a chunking queue's piece.
    #[inline]
    pub const fn as_piece(self) -> Option<u32> {
        match self.0 & KIND {
            PIECE => Some(self.0 as u32),
            _ => None,
        }
    }
}

/// A finished backend request, as the reactor reaps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub tag: Tag,
    pub status: Status,
    /// The tenant's I/O credits, when a scheduler ran the request (Gimbal's
    /// target returns them in the CQE, docs/gimbal.md §1.e); None from a
    /// bare backend.
    pub credits: Option<u16>,
}

impl Completion {
    /// A backend's completion: no credits.
    #[inline]
    pub const fn new(tag: Tag, status: Status) -> Completion {
        Completion {
            tag,
            status,
            credits: None,
        }
    }
    /// A scheduler's completion, with `credits` (saturated at the 16 bits
    /// the CQE has for them).
    #[inline]
    pub fn with_credits(tag: Tag, status: Status, credits: u32) -> Completion {
        Completion {
            tag,
            status,
            credits: Some(credits.min(u16::MAX as u32) as u16),
        }
    }
}

/// A connection tag for unit tests of backends, which treat it as opaque.
#[cfg(test)]
pub fn test_tag(slot: u16) -> Tag {
    IoTag::new(0, slot).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_tag_round_trips_at_its_bounds() {
        for (conn, slot) in [
            (0, 0),
            (1, 2),
            (IoTag::CONN_MAX, u16::MAX),
            (IoTag::CONN_MAX, 0),
            (0, u16::MAX),
        ] {
            let t = IoTag::new(conn, slot);
            let tag = Tag::from(t);
            assert_eq!(tag.io(), Some(t), "conn {conn} slot {slot}");
            assert_eq!((t.conn(), t.slot()), (conn, slot));
            assert_eq!(tag.as_scheduled(), None, "conn {conn} slot {slot}");
            assert_eq!(tag.as_piece(), None, "conn {conn} slot {slot}");
        }
        // Distinct commands, distinct tags: the index does not spill into the slot.
        assert_ne!(
            Tag::from(IoTag::new(1, 0)),
            Tag::from(IoTag::new(0, u16::MAX))
        );
    }

    #[test]
    fn scheduler_and_piece_tags_are_never_taken_for_a_connection_s() {
        for n in [0, 1, 0xFFFF, 0x1_0000, u32::MAX] {
            let s = Tag::scheduled(n);
            assert_eq!(
                (s.io(), s.as_scheduled(), s.as_piece()),
                (None, Some(n), None)
            );
            let p = Tag::piece(n);
            assert_eq!(
                (p.io(), p.as_scheduled(), p.as_piece()),
                (None, None, Some(n))
            );
        }
    }

    #[test]
    fn credits_are_a_field_saturated_at_16_bits() {
        let tag = Tag::from(IoTag::new(IoTag::CONN_MAX, u16::MAX));
        let st = trellis_nvme::status::generic::INTERNAL_ERROR;
        assert_eq!(Completion::new(tag, st).credits, None);
        let c = Completion::with_credits(tag, st, 300);
        assert_eq!((c.tag, c.status, c.credits), (tag, st, Some(300)));
        assert_eq!(
            Completion::with_credits(tag, st, 1 << 20).credits,
            Some(u16::MAX)
        );
        assert_eq!(Completion::with_credits(tag, st, 0).credits, Some(0));
    }

    #[test]
    fn the_types_are_no_larger_than_the_packed_u64_they_replace() {
        assert_eq!(size_of::<Tag>(), 8);
        assert_eq!(size_of::<IoTag>(), 8);
        assert_eq!(size_of::<Completion>(), size_of::<(u64, Status)>());
        assert_eq!(size_of::<Completion>(), 16);
    }
}
