//! Level 1: DRR over tenants with write-cost-weighted sizes and virtual slots (§1.c).

use crate::cc::WriteCost;
use crate::{GimbalConfig, QosError};
use std::collections::VecDeque;
use trellis_units::IoDir;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub tag: u64,
    pub dir: IoDir,
    pub size_bytes: u32,
}

/// Which virtual slot an I/O was charged to; hand it back on completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotTag(pub u8);

/// 8 slots in use at most plus one being opened [G] DRR_NUM_VQE = 8 + 1.
const SLOT_ENTRIES: usize = 9;

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    submits: u32,
    completions: u32,
    length: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    Idle,
    Active,
    Deferred,
}

struct Tenant {
    queue: VecDeque<Request>,
    deficit: i64,
    backlog: u64,
    io_processing: u32,
    slots: [Slot; SLOT_ENTRIES],
    cur_slot: Option<u8>,
    vqsize: i32,
    credit_per_vslot: u32,
    place: Where,
}

pub struct Drr {
    tenants: Vec<Tenant>,
    active: VecDeque<u16>,
    n_active: u32,
    vqmaxqd: i32,
    quantum: i64,
    slot_bytes: u64,
    slots_per_ssd: u32,
    queue_cap: usize,
    queued: usize,
}

impl Drr {
    pub fn new(cfg: &GimbalConfig) -> Self {
        assert!(cfg.slots_per_ssd as usize <= SLOT_ENTRIES - 1);
        let tenants = (0..cfg.max_tenants)
            .map(|_| Tenant {
                // Grows on demand up to the bound; no allocation once warm.
                queue: VecDeque::new(),
                deficit: 0,
                backlog: 0,
                io_processing: 0,
                slots: [Slot::default(); SLOT_ENTRIES],
                cur_slot: Some(0),
                vqsize: 1,
                credit_per_vslot: cfg.credit_per_vslot_init,
                place: Where::Idle,
            })
            .collect();
        Drr {
            tenants,
            active: VecDeque::with_capacity(cfg.max_tenants),
            n_active: 0,
            vqmaxqd: cfg.slots_per_ssd as i32,
            quantum: cfg.quantum_bytes as i64,
            slot_bytes: cfg.slot_bytes,
            slots_per_ssd: cfg.slots_per_ssd,
            queue_cap: cfg.queue_capacity_per_tenant,
            queued: 0,
        }
    }

    pub fn queued(&self) -> usize {
        self.queued
    }

    pub fn vqmaxqd(&self) -> i32 {
        self.vqmaxqd
    }

    pub fn n_active(&self) -> u32 {
        self.n_active
    }

    fn recompute_vqmaxqd(&mut self) {
        let s = self.slots_per_ssd;
        self.vqmaxqd = if self.n_active == 0 {
            s as i32
        } else {
            (s / self.n_active).max(1) as i32
        };
    }

    pub fn enqueue(&mut self, tenant: u16, req: Request) -> Result<(), QosError> {
        let cap = self.queue_cap;
        let t = self
            .tenants
            .get_mut(tenant as usize)
            .ok_or(QosError::BadTenant)?;
        if t.queue.len() >= cap {
            return Err(QosError::QueueFull);
        }
        t.queue.push_back(req);
        let activate = t.backlog == 0 && t.place == Where::Idle;
        let first = t.io_processing == 0;
        t.backlog += req.size_bytes as u64;
        self.queued += 1;
        if activate {
            self.tenants[tenant as usize].place = Where::Active;
            self.active.push_back(tenant);
            if first {
                self.n_active += 1;
                self.recompute_vqmaxqd();
                // [R] deficit starts at 0, so each activation grants exactly one quantum.
                self.tenants[tenant as usize].deficit += self.quantum;
            }
        }
        Ok(())
    }

    /// One request by DRR order, or None if no tenant is active.
    pub fn dequeue(&mut self, wc_fp10: u64) -> Option<(u16, Request, SlotTag)> {
        loop {
            let tid = *self.active.front()?;
            let t = &mut self.tenants[tid as usize];
            let head = *t.queue.front().expect("active tenant with an empty queue");
            let w = WriteCost::weighted(head.dir, head.size_bytes, wc_fp10) as i64;
            if t.deficit < w {
                t.deficit += self.quantum;
                self.active.rotate_left(1);
                continue;
            }
            t.queue.pop_front();
            self.queued -= 1;
            return Some(self.serve(tid, head, w));
        }
    }

    fn serve(&mut self, tid: u16, req: Request, w: i64) -> (u16, Request, SlotTag) {
        let vqmaxqd = self.vqmaxqd;
        let slot_bytes = self.slot_bytes;
        let t = &mut self.tenants[tid as usize];
        let cur = t.cur_slot.expect("active tenant without an open slot");
        let s = &mut t.slots[cur as usize];
        s.length += w as u64;
        s.submits += 1;
        t.deficit -= w;
        t.backlog -= req.size_bytes as u64;
        t.io_processing += 1;
        if s.length >= slot_bytes {
            if vqmaxqd - t.vqsize <= 0 {
                // Out of slots: defer until one retires [A B.2].
                t.place = Where::Deferred;
                t.deficit = 0;
                t.cur_slot = None;
                self.active.pop_front();
                return (tid, req, SlotTag(cur));
            }
            t.vqsize += 1;
            t.cur_slot = Some(free_slot(&t.slots, None));
        }
        if t.backlog == 0 {
            t.deficit = 0;
            t.place = Where::Idle;
            self.active.pop_front();
        }
        (tid, req, SlotTag(cur))
    }

    /// Completion of an I/O charged to `slot` (before its credit is read) [G].
    pub fn release(&mut self, tenant: u16, slot: SlotTag) {
        let vqmaxqd = self.vqmaxqd;
        let t = &mut self.tenants[tenant as usize];
        let s = &mut t.slots[slot.0 as usize];
        s.completions += 1;
        assert!(
            s.completions <= s.submits,
            "slot completed more I/Os than it held"
        );
        if s.submits == s.completions && t.cur_slot != Some(slot.0) {
            t.vqsize -= 1;
            t.credit_per_vslot = s.submits;
            *s = Slot::default();
            if t.place == Where::Deferred && vqmaxqd - t.vqsize > 0 {
                t.cur_slot = Some(free_slot(&t.slots, None));
                t.vqsize += 1;
                if t.backlog > 0 {
                    t.place = Where::Active;
                    self.active.push_back(tenant);
                } else {
                    t.place = Where::Idle;
                }
            }
        }
        let t = &mut self.tenants[tenant as usize];
        t.io_processing -= 1;
        if t.backlog == 0 && t.io_processing == 0 && t.place != Where::Deferred {
            self.n_active -= 1;
            self.recompute_vqmaxqd();
        }
    }

    pub fn credits(&self, tenant: u16) -> u32 {
        let t = &self.tenants[tenant as usize];
        (self.vqmaxqd.max(1) as u32 * t.credit_per_vslot).min(65535)
    }
}

/// An unused slot entry: 9 entries and at most 8 in use, so one always exists.
fn free_slot(slots: &[Slot; SLOT_ENTRIES], skip: Option<u8>) -> u8 {
    for (i, s) in slots.iter().enumerate() {
        if s.submits == 0 && Some(i as u8) != skip {
            return i as u8;
        }
    }
    panic!("no free virtual slot entry");
}
