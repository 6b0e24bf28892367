//! Level 1: DRR over tenants with write-cost-weighted sizes and virtual slots (§1.c).
//!
//! Tenant weights are ours [R]: Gimbal gives every tenant the same quantum and the
//! same share of slots. A tenant of weight w gets `w × Q` per DRR visit and an
//! in-flight budget of weighted bytes: all S slots' worth alone, else its weight's
//! share `S × w / W_active` (S = slots per SSD, W_active = the active tenants'
//! weights), at least one slot; the tenants with a read latency split their part of it
//! by weight × read latency instead (`Shares`).
//!
//! [R] The latency factor (docs/gimbal.md, departures: "Budgets shared by weight ×
//! read latency"): bytes in flight give a rate of in-flight ÷ latency, so equal
//! budgets hand the tenant whose I/Os come back sooner the larger rate. Gimbal
//! evens tenants out only once its token bucket binds; below that its slot limits
//! act, and with them 4 KiB reads beside 64 KiB reads took 0.67 of the shares.
//! Writes are not sampled: write cost already prices them, and behind a full write
//! buffer their latency is the writer's own queue, which a budget would feed.
//!
//! [R] The budget counts bytes, not whole slots (docs/gimbal.md, departures: "An
//! in-flight budget in bytes"): Gimbal defers a tenant once `⌊S / N_active⌋` slots
//! are open and returns a slot only when *every* I/O in it has completed. A slot of
//! ten 4 KiB reads then stays held until the slowest of the ten is back, so on a
//! drive that completes out of order a small-I/O tenant keeps about half its
//! allowance in flight, and the floor leaves a slot of an odd S unused. Here each
//! completion returns its own weighted length, and the share is not floored to
//! whole slots. Slots remain the unit of the credit (I/Os per slot of the last
//! retired slot), as in Gimbal.

use crate::cc::WriteCost;
use crate::pool::{List, ListPool};
use crate::sched::SchedLimits;
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
pub struct SlotTag {
    pub slot: u8,
    pub weighted: u32,
}

/// Slot entries per tenant: up to 32 slots in use plus one being opened. Gimbal has
/// 8 + 1 ([G] DRR_NUM_VQE) for its 3.2 GB/s drive; [R] a calibrated faster drive needs
/// more bytes in flight (`GimbalConfig::calibrated`), hence room for 32.
const SLOT_ENTRIES: usize = 33;

/// Largest slots_per_ssd the slot table can hold (one entry stays free for opening).
pub const MAX_SLOTS_PER_SSD: u32 = SLOT_ENTRIES as u32 - 1;

/// [R] Weight of a new sample in a tenant's device-latency EWMA: 1/16, the
/// shift Gimbal's host-side port defines for its latency EWMA ([E], §1.a).
const LAT_EWMA_SHIFT: u32 = 4;
/// Read samples are capped at 10 s, so weight × latency stays far inside u128.
const MAX_READ_LAT_NS: u64 = 10_000_000_000;

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

#[derive(Debug)]
struct Tenant {
    queue: List,
    deficit: i64,
    backlog: u64,
    io_processing: u32,
    inflight_w: u64,
    slots: [Slot; SLOT_ENTRIES],
    cur_slot: Option<u8>,
    vqsize: i32,
    /// I/Os per weighted byte of the last retired slot, ×2³² ([G] `credit_per_vslot`
    /// divided by the slot's length): the credit is this times the byte budget.
    io_credits_per_byte_fp32: u64,
    /// The credit with no other tenant active (budget = all S slots), kept with the
    /// rate: `io_credits` runs once per I/O and a tenant alone is the common case.
    io_credits_alone: u32,
    place: Where,
    weight: u32,
    /// Counted in N_active / W_active (from first enqueue until idle with nothing in flight).
    counted: bool,
    /// EWMA of this tenant's read latency at the device, ns (0 until a read
    /// completes with a nonzero latency: the tenant is then "unsampled").
    lat_ns: u64,
}

impl Tenant {
    /// weight × read latency: this tenant's term of `Shares::wl_sampled`.
    fn wl(&self) -> u128 {
        self.weight as u128 * self.lat_ns as u128
    }

    /// A retired slot's I/Os per weighted byte (×2³²), and the credit it gives alone.
    fn set_credit_rate(&mut self, per_byte_fp32: u64, all_bytes: u64) {
        self.io_credits_per_byte_fp32 = per_byte_fp32;
        self.io_credits_alone = credits_of(all_bytes, per_byte_fp32);
    }
}

#[derive(Debug)]
pub struct Drr {
    tenants: Vec<Tenant>,
    pool: ListPool<Request>,
    active: VecDeque<u16>,
    n_active: u32,
    /// The counted tenants' weights, and the part of them with a read latency.
    shares: Shares,
    quantum: i64,
    slot_bytes: u64,
    slots_per_ssd: u32,
    queue_cap: u32,
    /// Per-I/O cost added to every length before weighting (`io_cost_bytes`).
    io_cost: u64,
}

/// The counted tenants' weights: all of them (W_active), and the part with a
/// read latency (W_sampled, Σ w·L). A tenant's budget is S × w / W_active if it
/// has no read latency yet, else S × (W_sampled / W_active) × w·L / Σ w·L.
#[derive(Clone, Copy, Debug, Default)]
struct Shares {
    w_active: u64,
    w_sampled: u64,
    wl_sampled: u128,
}

impl Shares {
    fn add(&mut self, t: &Tenant) {
        self.w_active += t.weight as u64;
        if t.lat_ns > 0 {
            self.w_sampled += t.weight as u64;
            self.wl_sampled += t.wl();
        }
    }

    fn remove(&mut self, t: &Tenant) {
        self.w_active -= t.weight as u64;
        if t.lat_ns > 0 {
            self.w_sampled -= t.weight as u64;
            self.wl_sampled -= t.wl();
        }
    }

    fn plus(mut self, t: &Tenant) -> Shares {
        self.add(t);
        self
    }
}

impl Drr {
    /// `cfg` must be valid ([`GimbalConfig::validate`]); the constructor asserts it.
    pub fn new(cfg: &GimbalConfig, limits: &SchedLimits) -> Self {
        assert!(cfg.slots_per_ssd >= 1 && cfg.slots_per_ssd <= MAX_SLOTS_PER_SSD);
        let mut tenants = (0..limits.max_tenants)
            .map(|_| Tenant {
                queue: List::new(),
                deficit: 0,
                backlog: 0,
                io_processing: 0,
                inflight_w: 0,
                slots: [Slot::default(); SLOT_ENTRIES],
                cur_slot: Some(0),
                vqsize: 1,
                io_credits_per_byte_fp32: 0,
                io_credits_alone: 0,
                place: Where::Idle,
                weight: 1,
                counted: false,
                lat_ns: 0,
            })
            .collect::<Vec<_>>();
        let all = cfg.slots_per_ssd as u64 * cfg.slot_bytes;
        let fp = per_byte_fp32(cfg.io_credits_per_vslot_init, cfg.slot_bytes);
        for t in tenants.iter_mut() {
            t.set_credit_rate(fp, all);
        }
        Drr {
            tenants,
            pool: ListPool::new(limits.max_requests, limits.prealloc_requests),
            active: VecDeque::with_capacity(limits.max_tenants as usize),
            n_active: 0,
            shares: Shares::default(),
            quantum: cfg.quantum_bytes as i64,
            slot_bytes: cfg.slot_bytes,
            slots_per_ssd: cfg.slots_per_ssd,
            queue_cap: limits.max_queued_per_tenant,
            io_cost: cfg.io_cost_bytes,
        }
    }

    /// Requests queued over all tenants.
    pub fn queued(&self) -> usize {
        self.pool.live() as usize
    }

    /// Weighted bytes `tenant` may have in flight now (its budget), or None
    /// outside the table. Counted as an active tenant, as `io_credits` does.
    pub fn budget_bytes(&self, tenant: u16) -> Option<u64> {
        let t = self.tenants.get(tenant as usize)?;
        Some(self.budget(t, &self.with(t)))
    }

    /// The shares with `t` counted (it is, or it is about to be).
    fn with(&self, t: &Tenant) -> Shares {
        if t.counted {
            self.shares
        } else {
            self.shares.plus(t)
        }
    }

    /// `t`'s budget given shares that count it.
    #[inline]
    fn budget(&self, t: &Tenant, shares: &Shares) -> u64 {
        budget_of(self.slots_per_ssd, self.slot_bytes, t, shares)
    }

    /// The device latency of one of `tenant`'s reads, before its release: the
    /// tenant's read-latency EWMA, which its budget is proportional to. Writes
    /// are not sampled (docs/gimbal.md: write cost already prices them, and
    /// their latency grows with the writer's own queue in the write buffer).
    pub fn observe_read_latency(&mut self, tenant: u16, lat_ns: u64) {
        let sample = lat_ns.min(MAX_READ_LAT_NS);
        let Some(t) = self.tenants.get_mut(tenant as usize) else {
            return;
        };
        if t.counted {
            self.shares.remove(t);
        }
        t.lat_ns = ewma_step(t.lat_ns, sample);
        if t.counted {
            self.shares.add(t);
        }
    }

    pub fn n_active(&self) -> u32 {
        self.n_active
    }

    fn count(&mut self, tenant: u16, on: bool) {
        let t = &mut self.tenants[tenant as usize];
        assert_ne!(t.counted, on, "tenant counted twice or released twice");
        t.counted = on;
        if on {
            self.n_active += 1;
            self.shares.add(t);
        } else {
            self.n_active -= 1;
            self.shares.remove(t);
        }
    }

    /// Set a tenant's weight (≥ 1); takes effect for its next quantum and slot limit.
    pub fn set_weight(&mut self, tenant: u16, weight: u32) -> Result<(), QosError> {
        let t = self
            .tenants
            .get_mut(tenant as usize)
            .ok_or(QosError::BadTenant)?;
        if weight == 0 {
            return Err(QosError::BadWeight);
        }
        if t.counted {
            self.shares.remove(t);
            t.weight = weight;
            self.shares.add(t);
        }
        t.weight = weight;
        Ok(())
    }

    pub fn enqueue(&mut self, tenant: u16, req: Request) -> Result<(), QosError> {
        let cap = self.queue_cap;
        let t = self
            .tenants
            .get_mut(tenant as usize)
            .ok_or(QosError::BadTenant)?;
        // A zero-length request would leave `backlog` at 0 and look idle while queued.
        if req.size_bytes == 0 {
            return Err(QosError::ZeroLength);
        }
        if t.queue.len() >= cap || !self.pool.push_back(&mut t.queue, req) {
            return Err(QosError::QueueFull);
        }
        let activate = t.backlog == 0 && t.place == Where::Idle;
        let first = t.io_processing == 0;
        t.backlog += req.size_bytes as u64;
        if activate {
            t.place = Where::Active;
            self.active.push_back(tenant);
            if first {
                self.count(tenant, true);
                // [R] deficit starts at 0, so each activation grants exactly one quantum.
                let t = &mut self.tenants[tenant as usize];
                t.deficit += self.quantum * t.weight as i64;
            }
        }
        Ok(())
    }

    /// One request by DRR order, or None if no tenant is active.
    pub fn dequeue(&mut self, wc_fp10: u64) -> Option<(u16, Request, SlotTag)> {
        loop {
            let tid = *self.active.front()?;
            let t = &mut self.tenants[tid as usize];
            let head = self
                .pool
                .front(&t.queue)
                .expect("active tenant with an empty queue");
            let w = WriteCost::weighted(head.dir, head.size_bytes as u64 + self.io_cost, wc_fp10)
                as i64;
            if t.deficit < w {
                t.deficit += self.quantum * t.weight as i64;
                self.active.rotate_left(1);
                continue;
            }
            self.pool.pop_front(&mut t.queue);
            return Some(self.serve(tid, head, w));
        }
    }

    /// `enqueue` followed by `dequeue` for a request that arrives when
    /// nothing is queued and its tenant is idle (the common case below
    /// saturation): the same state changes, without the trip through the
    /// request list. None, with nothing changed, when those conditions do not
    /// hold; the caller then enqueues.
    pub fn serve_alone(&mut self, tenant: u16, req: Request, wc_fp10: u64) -> Option<SlotTag> {
        if self.pool.live() != 0 || req.size_bytes == 0 || self.queue_cap == 0 {
            return None;
        }
        let t = self.tenants.get_mut(tenant as usize)?;
        if t.place != Where::Idle || t.backlog != 0 {
            return None;
        }
        // Nothing queued means no tenant is active (an active one has a request).
        debug_assert!(self.active.is_empty());
        // enqueue: activation, and a quantum for a tenant with nothing in flight.
        let first = t.io_processing == 0;
        t.backlog = req.size_bytes as u64;
        t.place = Where::Active;
        self.active.push_back(tenant);
        if first {
            self.count(tenant, true);
        }
        let quantum = self.quantum * self.tenants[tenant as usize].weight as i64;
        let t = &mut self.tenants[tenant as usize];
        if first {
            t.deficit += quantum;
        }
        // dequeue: the only active tenant is visited until its deficit covers the head.
        let w = WriteCost::weighted(req.dir, req.size_bytes as u64 + self.io_cost, wc_fp10) as i64;
        while t.deficit < w {
            t.deficit += quantum;
        }
        Some(self.serve(tenant, req, w).2)
    }

    /// `serve_alone` followed at once by `release` of the same request, for a
    /// tenant with nothing else in flight: a device that finishes inside its
    /// submission (RAM, null). The same state changes in one pass: no trip
    /// through the active list, no counting in and out of W_active, and the
    /// slot limit computed only when the open slot fills. False, with nothing
    /// changed, when those conditions do not hold; the caller then goes the
    /// two-step way. Tested equal to the two steps in `sched::tests`.
    pub fn serve_and_release_alone(&mut self, tenant: u16, req: Request, wc_fp10: u64) -> bool {
        if self.pool.live() != 0 || req.size_bytes == 0 || self.queue_cap == 0 {
            return false;
        }
        let (slots_per_ssd, slot_bytes, quantum) =
            (self.slots_per_ssd, self.slot_bytes, self.quantum);
        let w = self.weighted(req.dir, req.size_bytes, wc_fp10);
        let Some(t) = self.tenants.get_mut(tenant as usize) else {
            return false;
        };
        // Idle with nothing in flight is also uncounted (released at its last
        // completion); an open slot exists unless it was Deferred.
        if t.place != Where::Idle || t.backlog != 0 || t.io_processing != 0 || t.counted {
            return false;
        }
        let Some(cur) = t.cur_slot else { return false };
        // The deficit: one quantum on activation, topped up until it covers w,
        // w taken, then reset as the tenant's backlog empties: 0 either way.
        // (The two-step loop cannot overflow for any w: quantum ≥ 1.)
        debug_assert!(quantum * t.weight as i64 >= 1);
        t.deficit = 0;
        // The completion's zero-latency read sample, applied after the budget
        // check below as in the two steps (uncounted: no shares to adjust).
        let lat_after = match req.dir {
            IoDir::Read => ewma_step(t.lat_ns, 0),
            IoDir::Write => t.lat_ns,
        };
        let s = &mut t.slots[cur as usize];
        s.length += w;
        s.submits += 1;
        s.completions += 1;
        if s.length < slot_bytes {
            t.lat_ns = lat_after;
            return true; // the slot stays open: nothing retires
        }
        // The slot filled. Serve defers the tenant if this one I/O covers its
        // budget (as both steps see it: with the tenant counted), else opens the
        // next slot; the release then retires this slot, whose I/Os are all
        // complete, and a deferred tenant, now with nothing in flight, opens a
        // fresh one. Either way: one new open slot, the tenant Idle.
        let (submits, length) = (s.submits, s.length);
        let with = self.shares.plus(t);
        if w < budget_of(slots_per_ssd, slot_bytes, t, &with) {
            t.cur_slot = Some(free_slot(&t.slots));
            t.slots[cur as usize] = Slot::default();
        } else {
            t.slots[cur as usize] = Slot::default();
            t.cur_slot = Some(free_slot(&t.slots));
        }
        t.set_credit_rate(
            per_byte_fp32(submits, length),
            slots_per_ssd as u64 * slot_bytes,
        );
        t.lat_ns = lat_after;
        true
    }

    /// No tenant but `tenant` is counted, none is queued, and `tenant` is
    /// idle with an open slot: the state `serve_and_release_alone` leaves
    /// when no other tenant has I/O (the scheduler's lane, docs/gimbal.md).
    pub fn is_alone(&self, tenant: u16) -> bool {
        self.shares.w_active == 0
            && self.pool.live() == 0
            && self.tenants.get(tenant as usize).is_some_and(|t| {
                t.place == Where::Idle
                    && t.backlog == 0
                    && t.io_processing == 0
                    && !t.counted
                    && t.cur_slot.is_some()
            })
    }

    /// `serve_and_release_alone` for a tenant [`Self::is_alone`] accepted
    /// with nothing changed since but calls of this: the same state changes
    /// where the request leaves its slot open; false, with nothing changed,
    /// where it would fill the slot (the full call retires it).
    #[inline]
    pub fn serve_and_release_in_lane(&mut self, tenant: u16, req: Request, wc_fp10: u64) -> bool {
        let slot_bytes = self.slot_bytes;
        let w = self.weighted(req.dir, req.size_bytes, wc_fp10);
        let Some(t) = self.tenants.get_mut(tenant as usize) else {
            return false;
        };
        let Some(cur) = t.cur_slot else { return false };
        let s = &mut t.slots[cur as usize];
        if s.length + w >= slot_bytes {
            return false;
        }
        debug_assert!(t.place == Where::Idle && t.backlog == 0 && !t.counted);
        t.deficit = 0;
        s.length += w;
        s.submits += 1;
        s.completions += 1;
        if req.dir == IoDir::Read {
            t.lat_ns = ewma_step(t.lat_ns, 0);
        }
        true
    }

    /// The weighted length DRR charges a request of `size_bytes` in `dir`.
    #[inline]
    pub fn weighted(&self, dir: IoDir, size_bytes: u32, wc_fp10: u64) -> u64 {
        WriteCost::weighted(dir, size_bytes as u64 + self.io_cost, wc_fp10)
    }

    /// How many `serve_and_release_in_lane` calls of weighted length `w`
    /// [`Self::release_lane_n`] may apply at once: as many as keep the open
    /// slot open, and none while the tenant's read latency still moves under
    /// zero samples (an EWMA step of 1/16 leaves only values below 16).
    pub fn lane_room(&self, tenant: u16, dir: IoDir, w: u64) -> u64 {
        let Some(t) = self.tenants.get(tenant as usize) else {
            return 0;
        };
        let Some(cur) = t.cur_slot else { return 0 };
        if dir == IoDir::Read && ewma_step(t.lat_ns, 0) != t.lat_ns {
            return 0;
        }
        let length = t.slots[cur as usize].length;
        self.slot_bytes.saturating_sub(length + 1) / w.max(1)
    }

    /// `n` calls of `serve_and_release_in_lane` that [`Self::lane_room`]
    /// allowed, in one step.
    pub fn release_lane_n(&mut self, tenant: u16, dir: IoDir, w: u64, n: u64) {
        let Some(t) = self.tenants.get_mut(tenant as usize) else {
            return;
        };
        let Some(cur) = t.cur_slot else { return };
        debug_assert!(dir == IoDir::Write || ewma_step(t.lat_ns, 0) == t.lat_ns);
        t.deficit = 0;
        let s = &mut t.slots[cur as usize];
        s.length += w * n;
        s.submits += n as u32;
        s.completions += n as u32;
        debug_assert!(s.length < self.slot_bytes);
    }

    /// `io_credits` of a tenant alone (no other counted): its kept credit.
    #[inline]
    pub fn io_credits_alone(&self, tenant: u16) -> u32 {
        debug_assert_eq!(self.shares.w_active, 0);
        self.tenants
            .get(tenant as usize)
            .map_or(0, |t| t.io_credits_alone)
    }

    fn serve(&mut self, tid: u16, req: Request, w: i64) -> (u16, Request, SlotTag) {
        let (slots_per_ssd, shares) = (self.slots_per_ssd, self.shares);
        let slot_bytes = self.slot_bytes;
        let t = &mut self.tenants[tid as usize];
        let cur = t.cur_slot.expect("active tenant without an open slot");
        let s = &mut t.slots[cur as usize];
        s.length += w as u64;
        s.submits += 1;
        t.deficit -= w;
        t.backlog -= req.size_bytes as u64;
        t.io_processing += 1;
        // Held as a u32 in the request's row: saturate, and count the same value in
        // flight, so that the release gives back exactly what was taken. (A
        // saturated length is still above any budget: slot_bytes ≤ 64 MiB.)
        let w_held = (w as u64).min(u32::MAX as u64) as u32;
        t.inflight_w += w_held as u64;
        let tag = SlotTag {
            slot: cur,
            weighted: w_held,
        };
        // Out of budget (the I/O that crosses it stays, as in a slot), or out of
        // slot entries: defer until completions bring it back ([Gimbal] §3; §1.c).
        let full = s.length >= slot_bytes;
        let budget = budget_of(slots_per_ssd, slot_bytes, t, &shares);
        if t.inflight_w >= budget || (full && t.vqsize >= MAX_SLOTS_PER_SSD as i32) {
            t.place = Where::Deferred;
            t.deficit = 0;
            t.cur_slot = None;
            self.active.pop_front();
            return (tid, req, tag);
        }
        if full {
            t.vqsize += 1;
            t.cur_slot = Some(free_slot(&t.slots));
        }
        if t.backlog == 0 {
            t.deficit = 0;
            t.place = Where::Idle;
            self.active.pop_front();
        }
        (tid, req, tag)
    }

    /// Completion of an I/O charged to `slot` (before its credit is read) [G].
    /// The caller guarantees that (tenant, slot) came from `dequeue` and completes once.
    pub fn release(&mut self, tenant: u16, slot: SlotTag) {
        let (slots_per_ssd, shares) = (self.slots_per_ssd, self.shares);
        let slot_bytes = self.slot_bytes;
        let t = &mut self.tenants[tenant as usize];
        let s = &mut t.slots[slot.slot as usize];
        s.completions += 1;
        assert!(
            s.completions <= s.submits,
            "slot completed more I/Os than it held"
        );
        t.inflight_w -= slot.weighted as u64;
        if s.submits == s.completions && t.cur_slot != Some(slot.slot) {
            t.vqsize -= 1;
            let fp = per_byte_fp32(s.submits, s.length);
            *s = Slot::default();
            t.set_credit_rate(fp, slots_per_ssd as u64 * slot_bytes);
        }
        let budget = budget_of(slots_per_ssd, slot_bytes, t, &shares);
        if t.place == Where::Deferred
            && t.inflight_w < budget
            && t.vqsize < MAX_SLOTS_PER_SSD as i32
        {
            t.cur_slot = Some(free_slot(&t.slots));
            t.vqsize += 1;
            if t.backlog > 0 {
                t.place = Where::Active;
                self.active.push_back(tenant);
            } else {
                t.place = Where::Idle;
            }
        }
        let t = &mut self.tenants[tenant as usize];
        t.io_processing -= 1;
        if t.backlog == 0 && t.io_processing == 0 && t.place != Where::Deferred {
            self.count(tenant, false);
        }
    }

    /// I/O credits of `tenant`, in I/Os: min(65535, slot limit × I/Os per slot) [G] (§1.e),
    /// with the slot limit of the tenant *as an active tenant*. None for an id outside
    /// the table.
    ///
    /// [R] Departure from [G], whose credit is read after the slot release: when that
    /// release was the tenant's last I/O, the tenant is no longer counted in W_active,
    /// so the credit is the allowance of a drive it does not share. A host with little
    /// in flight then sees its credit flip with its own activity (77 while it had reads
    /// in flight at a shared drive, 165 whenever its last one completed, in the replica
    /// run of docs/bench.md), and a replica balancer keeps returning to the busy
    /// replica. The credit is an allowance for I/Os the host will have in flight, and
    /// while it has them it is counted, so we count it here too.
    pub fn io_credits(&self, tenant: u16) -> Option<u32> {
        let t = self.tenants.get(tenant as usize)?;
        let shares = self.with(t);
        if shares.w_active == t.weight as u64 {
            return Some(t.io_credits_alone);
        }
        let budget = self.budget(t, &shares);
        Some(credits_of(budget, t.io_credits_per_byte_fp32))
    }

    /// (queued, in flight, weight) of `tenant`, or None outside the table.
    pub fn tenant_counts(&self, tenant: u16) -> Option<(u32, u32, u32)> {
        let t = self.tenants.get(tenant as usize)?;
        Some((t.queue.len(), t.io_processing, t.weight))
    }
}

/// `S × slot_bytes × w / W_active` for a tenant with no read latency, else
/// `S × slot_bytes × (W_sampled / W_active) × w·L / Σ w·L`; at least one slot
/// and at most S; all S slots when no other tenant is active.
///
/// A tenant alone (`w_active` is its own weight, or 0) gets S without a
/// division: on a busy reactor this runs up to three times per I/O, and a
/// 64-bit division is the largest single cost of the scheduler's I/O path
/// (examples/sched_cost.rs).
#[inline]
fn budget_of(slots_per_ssd: u32, slot_bytes: u64, t: &Tenant, shares: &Shares) -> u64 {
    let all = slots_per_ssd as u64 * slot_bytes;
    let w_active = shares.w_active;
    if w_active == 0 || w_active == t.weight as u64 {
        return all;
    }
    let share = if t.lat_ns == 0 {
        // Unsampled: its weight's share, as if its latency were the mean.
        all as u128 * t.weight as u128 / w_active as u128
    } else {
        // Sampled: the sampled tenants' part (w_sampled / W_active), split by w·L.
        debug_assert!(shares.wl_sampled >= t.wl() && t.wl() > 0);
        all as u128 * t.wl() * shares.w_sampled as u128 / (shares.wl_sampled * w_active as u128)
    };
    (share as u64).clamp(slot_bytes, all)
}

/// One EWMA step toward `sample` (the first sample is taken whole): 1/16 of the
/// gap, rounded toward the old value both ways.
fn ewma_step(old: u64, sample: u64) -> u64 {
    if old == 0 {
        sample
    } else if sample >= old {
        old + ((sample - old) >> LAT_EWMA_SHIFT)
    } else {
        old - ((old - sample) >> LAT_EWMA_SHIFT)
    }
}

/// ⌈budget × I/Os per byte⌉: the I/Os of the last slot's mean weighted size that the
/// budget admits (the one that crosses it included), in 1..=65535.
fn credits_of(budget: u64, per_byte_fp32: u64) -> u32 {
    let ios = match budget.checked_mul(per_byte_fp32) {
        Some(p) => p.div_ceil(1 << 32),
        None => (budget as u128 * per_byte_fp32 as u128).div_ceil(1 << 32) as u64,
    };
    ios.clamp(1, 65535) as u32
}

/// I/Os per weighted byte of a slot that held `submits` I/Os in `length` bytes, ×2³².
fn per_byte_fp32(submits: u32, length: u64) -> u64 {
    ((submits as u64) << 32) / length.max(1)
}

/// An unused slot entry: one more entry than slots in use, so one always exists.
fn free_slot(slots: &[Slot; SLOT_ENTRIES]) -> u8 {
    for (i, s) in slots.iter().enumerate() {
        if s.submits == 0 {
            return i as u8;
        }
    }
    panic!("no free virtual slot entry");
}
