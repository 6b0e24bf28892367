//! The request table: one row per request the scheduler holds (queued or in flight),
//! named by a [`Tag`]. Rows are reused through a free list; a generation number in
//! each tag makes a stale or doubled completion an error instead of corrupting state.

use super::{Tag, TenantId};
use trellis_units::IoDir;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Free,
    /// Held by the scheduler, not yet sent to the device.
    Queued,
    /// Sent to the device; waiting for `complete` or `abort`.
    InFlight,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub tenant: TenantId,
    pub dir: IoDir,
    pub state: State,
    /// Gimbal's virtual slot while in flight (0 under the FIFO policy).
    pub vslot: u8,
    /// Gimbal's weighted length of the request while in flight (0 under FIFO).
    pub weighted: u32,
    pub len_bytes: u32,
    generation: u32,
    next_free: u32,
}

pub(crate) struct ReqTable {
    rows: Vec<Entry>,
    free: u32,
    capacity: u32,
    live: u32,
}

impl ReqTable {
    /// `prealloc` rows up front; more by amortised doubling up to `capacity` (see
    /// [`super::SchedLimits::prealloc_requests`]).
    pub fn new(capacity: u32, prealloc: u32) -> Self {
        assert!(capacity > 0 && capacity < NIL);
        ReqTable {
            rows: Vec::with_capacity(prealloc.min(capacity) as usize),
            free: NIL,
            capacity,
            live: 0,
        }
    }

    /// A new Queued row, or None when all `capacity` rows are taken.
    pub fn alloc(&mut self, tenant: TenantId, dir: IoDir, len_bytes: u32) -> Option<Tag> {
        let index = if self.free != NIL {
            let i = self.free;
            self.free = self.rows[i as usize].next_free;
            i
        } else if (self.rows.len() as u32) < self.capacity {
            self.rows.push(Entry {
                tenant: 0,
                dir: IoDir::Read,
                state: State::Free,
                vslot: 0,
                weighted: 0,
                len_bytes: 0,
                generation: 0,
                next_free: NIL,
            });
            self.rows.len() as u32 - 1
        } else {
            return None;
        };
        let row = &mut self.rows[index as usize];
        debug_assert_eq!(row.state, State::Free);
        row.tenant = tenant;
        row.dir = dir;
        row.state = State::Queued;
        row.vslot = 0;
        row.weighted = 0;
        row.len_bytes = len_bytes;
        self.live += 1;
        Some(Tag {
            index,
            generation: row.generation,
        })
    }

    /// The row of `tag` if the tag is current and the row is in state `want`.
    pub fn get(&self, tag: Tag, want: State) -> Option<&Entry> {
        let row = self.rows.get(tag.index as usize)?;
        (row.generation == tag.generation && row.state == want).then_some(row)
    }

    pub fn get_mut(&mut self, tag: Tag, want: State) -> Option<&mut Entry> {
        let row = self.rows.get_mut(tag.index as usize)?;
        (row.generation == tag.generation && row.state == want).then_some(row)
    }

    /// Return the row of a current tag to the free list; its tag becomes stale.
    pub fn free(&mut self, tag: Tag) {
        let row = &mut self.rows[tag.index as usize];
        assert!(
            row.generation == tag.generation && row.state != State::Free,
            "freeing a stale tag"
        );
        row.state = State::Free;
        row.generation = row.generation.wrapping_add(1);
        row.next_free = self.free;
        self.free = tag.index;
        self.live -= 1;
    }

    /// Every row is taken: `alloc` would answer None.
    pub fn is_full(&self) -> bool {
        self.live >= self.capacity
    }

    /// Rows in use (queued + in flight).
    pub fn live(&self) -> u32 {
        self.live
    }
}
