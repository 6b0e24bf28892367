//! Gimbal for one namespace (docs/gimbal.md): DRR with virtual slots (level 1), a
//! dual token bucket paced by delay-based congestion control (level 2), write-cost
//! estimation, and per-tenant I/O credits.

use super::table::{ReqTable, State};
use super::{
    check_config, check_weight, headroom, make_view, Completed, Dispatch, Policy, SchedConfig,
    SchedError, SchedLimits, Scheduler, Submitted, Tag, TenantFigures, TenantId, TenantView,
};
use crate::{CcState, CongestionControl, Drr, DualTokenBucket, GimbalConfig, QosError};
use crate::{Request, SlotTag, WriteCost};
use trellis_units::{IoDir, Nanos};

pub struct GimbalScheduler {
    cfg: GimbalConfig,
    limits: SchedLimits,
    table: ReqTable,
    cc: CongestionControl,
    wc: WriteCost,
    drr: Drr,
    bucket: DualTokenBucket,
    /// The dequeued request that did not conform: nothing passes it, so I/Os leave in
    /// DRR order ("Gimbal does not reorder I/Os when dequeued", Gimbal paper appendix,
    /// docs/gimbal.md §1.d).
    blocked: Option<(Tag, SlotTag)>,
    inflight: u32,
    /// `submit` skips DRR's queue when nothing waits ([`Drr::serve_alone`]);
    /// off only in the test that checks both paths decide alike.
    fast_path: bool,
    /// The last `run_now` left its tenant alone with a drive that stays
    /// under-utilised under zero-latency completions: the same call again
    /// takes [`Self::run_in_lane`]. Cleared by every other change of state.
    lane: Option<Lane>,
    /// Off only in the test that checks the lane decides like `run_now`.
    lane_enabled: bool,
    /// Lane passes answered but not yet applied: a streak at one instant.
    deferred: Option<Deferred>,
    /// Lane passes that answered, that left it for the full pass, and that
    /// were deferred.
    #[cfg(test)]
    lane_counts: (u64, u64, u64),
}

/// A repeated `run_now` (docs/gimbal.md, "The lane"): which one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lane {
    tenant: TenantId,
    dir: IoDir,
    len_bytes: u32,
}

/// Lane passes of `key` at `now_ns` answered with `done` and not yet applied
/// (`n`), and how many may be (`room`): while every state the pass touches is
/// at a fixed point or moves linearly, n passes are applied in one step.
#[derive(Clone, Copy, Debug)]
struct Deferred {
    key: Lane,
    now_ns: Nanos,
    n: u32,
    room: u32,
    done: Completed,
}

/// Length charged to DRR and the buckets: a zero-length command (Flush) costs one
/// byte [R], so that DRR's backlog (which detects idle tenants) counts it.
fn charged_bytes(len_bytes: u32) -> u32 {
    len_bytes.max(1)
}

impl GimbalScheduler {
    pub fn new(cfg: &SchedConfig, now_ns: Nanos) -> Result<Self, &'static str> {
        check_config(cfg)?;
        let (g, l) = (&cfg.gimbal, &cfg.limits);
        Ok(GimbalScheduler {
            table: ReqTable::new(l.max_requests, l.prealloc_requests),
            cc: CongestionControl::new(g),
            wc: WriteCost::new(g.write_cost_init_fp10, g.write_cost_window_ns, now_ns),
            drr: Drr::new(g, l),
            bucket: DualTokenBucket::new(g.bucket_bytes, now_ns),
            blocked: None,
            inflight: 0,
            fast_path: true,
            lane: None,
            lane_enabled: true,
            deferred: None,
            #[cfg(test)]
            lane_counts: (0, 0, 0),
            cfg: g.clone(),
            limits: l.clone(),
        })
    }

    /// The same scheduler with `submit` always going through DRR's queue.
    #[cfg(test)]
    pub(crate) fn without_fast_path(mut self) -> Self {
        self.fast_path = false;
        self
    }

    /// The same scheduler without the lane (`run_now` always takes its full pass).
    #[cfg(test)]
    pub(crate) fn without_lane(mut self) -> Self {
        self.lane_enabled = false;
        self
    }

    /// (lane passes that answered, lane passes that fell back to the full
    /// pass, deferred passes): for tests that must exercise all three.
    #[cfg(test)]
    pub(crate) fn lane_counts(&self) -> (u64, u64, u64) {
        self.lane_counts
    }

    /// Everything the scheduler decides with, for tests comparing two of them.
    #[cfg(test)]
    pub(crate) fn state_dump(&self) -> String {
        format!(
            "{:?}\n{:?}\n{:?}\n{:?}\n{:?} {}",
            self.cc, self.wc, self.drr, self.bucket, self.blocked, self.inflight
        )
    }

    /// Congestion-control state, for tests and traces.
    pub fn congestion(&self) -> &CongestionControl {
        &self.cc
    }

    pub fn write_cost_fp10(&self) -> u64 {
        self.wc.fp10()
    }

    /// Token buckets (read, write), B.
    pub fn tokens_bytes(&self) -> (u64, u64) {
        (self.bucket.read_tokens, self.bucket.write_tokens)
    }

    /// The next request in DRR order, or the blocked one; without taking tokens.
    fn next_candidate(&mut self) -> Option<(Tag, SlotTag)> {
        if let Some(b) = self.blocked.take() {
            return Some(b);
        }
        let (_, req, slot) = self.drr.dequeue(self.wc.fp10())?;
        Some((Tag::from_u64(req.tag), slot))
    }

    /// Dispatches the DRR-chosen request `tag` if the buckets hold its
    /// tokens; otherwise it becomes the blocked request that nothing passes.
    fn admit(&mut self, tag: Tag, slot: SlotTag, now_ns: Nanos) -> Option<Dispatch> {
        let e = self
            .table
            .get_mut(tag, State::Queued)
            .expect("DRR returned a request the table does not hold");
        if !self.bucket.try_take(e.dir, charged_bytes(e.len_bytes)) {
            self.blocked = Some((tag, slot));
            self.cc.rate_limited_from(now_ns);
            return None;
        }
        self.cc.rate_limit_ended(now_ns);
        e.state = State::InFlight;
        e.vslot = slot.slot;
        e.weighted = slot.weighted;
        self.inflight += 1;
        Some(Dispatch {
            tag,
            tenant: e.tenant,
            dir: e.dir,
            len_bytes: e.len_bytes,
        })
    }

    /// Release a dispatched request's slot and row; the tenant's credits after it.
    fn release(&mut self, tag: Tag) -> Completed {
        let e = *self
            .table
            .get(tag, State::InFlight)
            .expect("release of a request not in flight");
        self.drr.release(
            e.tenant,
            SlotTag {
                slot: e.vslot,
                weighted: e.weighted,
            },
        );
        self.table.free(tag);
        self.inflight -= 1;
        debug_assert_eq!(self.table.live(), self.queued() + self.inflight);
        Completed {
            tenant: e.tenant,
            io_credits: self.drr.io_credits(e.tenant).unwrap_or(0),
        }
    }

    /// `run_now` that cannot be deferred: the lane pass, else the full one.
    /// Out of line, so that a deferred call (most of a streak) pays for no
    /// registers this needs.
    #[inline(never)]
    fn run_now_undeferred(&mut self, key: Lane, now_ns: Nanos) -> Option<Completed> {
        let Lane {
            tenant,
            dir,
            len_bytes,
        } = key;
        self.settle_lane();
        if self.lane == Some(key) {
            if let Some(done) = self.run_in_lane(key, now_ns) {
                #[cfg(test)]
                {
                    self.lane_counts.0 += 1;
                }
                self.defer_from(key, now_ns, done);
                return Some(done);
            }
            #[cfg(test)]
            {
                self.lane_counts.1 += 1;
            }
        }
        self.lane = None;
        let done = self.run_full(tenant, dir, len_bytes, now_ns)?;
        if self.lane_enabled && self.lane_holds(key) {
            self.lane = Some(key);
            self.defer_from(key, now_ns, done);
        }
        Some(done)
    }

    /// `run_now`'s full pass, with every check: `submit` that dispatches at
    /// once followed by `complete(tag, 0, now)`, as the trait describes.
    fn run_full(
        &mut self,
        tenant: TenantId,
        dir: IoDir,
        len_bytes: u32,
        now_ns: Nanos,
    ) -> Option<Completed> {
        if !self.fast_path
            || tenant >= self.limits.max_tenants
            || self.queued() != 0
            || self.table.is_full()
        {
            return None;
        }
        let charged = charged_bytes(len_bytes);
        // Refilling first is what `submit` does too (its own refill at the
        // same `now_ns` then adds nothing), so a None below changes nothing.
        self.bucket
            .refill(self.cc.target_rate(), self.wc.fp10(), now_ns);
        if !self.bucket.can_take(dir, charged) {
            return None;
        }
        let req = Request {
            tag: 0,
            dir,
            size_bytes: charged,
        };
        if !self
            .drr
            .serve_and_release_alone(tenant, req, self.wc.fp10())
        {
            return None;
        }
        let taken = self.bucket.try_take(dir, charged);
        debug_assert!(taken, "can_take said yes");
        if self.cc.on_complete(dir, len_bytes, 0, now_ns) == CcState::Overloaded {
            self.bucket.zero();
        }
        let (tmin, tmax) = (self.cfg.thresh_min_us, self.cfg.thresh_max_us);
        self.wc.on_complete(dir, 0, now_ns, tmin, tmax);
        Some(Completed {
            tenant,
            io_credits: self.drr.io_credits(tenant).unwrap_or(0),
        })
    }

    /// Whether the next `run_now` with `key` may take the lane, right after a
    /// full pass ran it: the tenant is the only one DRR counts or holds (so
    /// its credit is its `io_credits_alone`, fixed until its slot retires),
    /// and the direction's latency EWMA is at most Thresh_min, where
    /// zero-latency samples keep it (they only halve it): every completion
    /// in the lane is then UNDER-UTILISED.
    fn lane_holds(&self, key: Lane) -> bool {
        self.drr.is_alone(key.tenant) && self.cc.dir_cc(key.dir).ewma_us <= self.cfg.thresh_min_us
    }

    /// `run_full` for a request like the previous one, in a state
    /// `lane_holds` accepted and nothing has changed since but lane passes:
    /// the checks that cannot fail there are skipped, every state change is
    /// the same. None, with nothing changed, where the full pass has work the
    /// lane does not (a short bucket, a slot that fills); the caller then runs
    /// the full pass. `lane_decides_like_the_full_pass` holds the two equal.
    #[inline]
    fn run_in_lane(&mut self, key: Lane, now_ns: Nanos) -> Option<Completed> {
        let charged = charged_bytes(key.len_bytes);
        self.bucket
            .refill(self.cc.target_rate(), self.wc.fp10(), now_ns);
        if !self.bucket.can_take(key.dir, charged) {
            return None;
        }
        let req = Request {
            tag: 0,
            dir: key.dir,
            size_bytes: charged,
        };
        if !self
            .drr
            .serve_and_release_in_lane(key.tenant, req, self.wc.fp10())
        {
            return None;
        }
        let taken = self.bucket.try_take(key.dir, charged);
        debug_assert!(taken, "can_take said yes");
        self.cc.on_idle_complete(key.dir, key.len_bytes, now_ns);
        let (tmin, tmax) = (self.cfg.thresh_min_us, self.cfg.thresh_max_us);
        self.wc.on_complete(key.dir, 0, now_ns, tmin, tmax);
        Some(Completed {
            tenant: key.tenant,
            io_credits: self.drr.io_credits_alone(key.tenant),
        })
    }

    /// After a lane pass of `key` at `now_ns` answered `done`: how many more
    /// at the same instant may be deferred. At one instant the bucket gets no
    /// refill and the write-cost window cannot end again, so each further
    /// pass takes the same tokens and weighs the same; where congestion
    /// control and the tenant's read latency sit at their fixed points under
    /// zero-latency samples, only counters move, linearly. The room ends
    /// before the bucket runs short, the slot fills or a completion-rate
    /// sample closes (those passes take `run_in_lane`).
    fn defer_from(&mut self, key: Lane, now_ns: Nanos, done: Completed) {
        let need = self.bucket.need(charged_bytes(key.len_bytes));
        let w = self.lane_weight(key);
        let room = (self.bucket.tokens(key.dir) / need)
            .min(self.cc.idle_room(key.dir, key.len_bytes, now_ns))
            .min(self.drr.lane_room(key.tenant, key.dir, w))
            .min(u32::MAX as u64) as u32;
        self.deferred = (room > 0 && self.wc.window_open(now_ns)).then_some(Deferred {
            key,
            now_ns,
            n: 0,
            room,
            done,
        });
    }

    /// The weighted length DRR charges a request of `key` now.
    fn lane_weight(&self, key: Lane) -> u64 {
        self.drr
            .weighted(key.dir, charged_bytes(key.len_bytes), self.wc.fp10())
    }

    /// Applies the deferred lane passes: the state `n` lane passes leave.
    fn settle_lane(&mut self) {
        let Some(d) = self.deferred.take() else {
            return;
        };
        if d.n == 0 {
            return;
        }
        let n = d.n as u64;
        let (dir, len) = (d.key.dir, d.key.len_bytes);
        let need = self.bucket.need(charged_bytes(len));
        self.bucket.take_n(dir, need * n);
        let w = self.lane_weight(d.key);
        self.drr.release_lane_n(d.key.tenant, dir, w, n);
        self.cc.on_idle_completes(dir, len, n);
        self.wc.count_n(dir, n);
    }
}

impl Scheduler for GimbalScheduler {
    fn policy(&self) -> Policy {
        Policy::Gimbal
    }

    fn submit(
        &mut self,
        tenant: TenantId,
        dir: IoDir,
        len_bytes: u32,
        now_ns: Nanos,
    ) -> Result<Submitted, SchedError> {
        self.settle_lane();
        self.lane = None;
        if tenant >= self.limits.max_tenants {
            return Err(SchedError::BadTenant);
        }
        let Some(tag) = self.table.alloc(tenant, dir, len_bytes) else {
            return Ok(Submitted::Busy);
        };
        let req = Request {
            tag: tag.to_u64(),
            dir,
            size_bytes: charged_bytes(len_bytes),
        };
        if self.fast_path && self.queued() == 0 {
            // Nothing waits, so DRR would hand this request straight back:
            // the same decisions as the path below, without its queue.
            if let Some(slot) = self.drr.serve_alone(tenant, req, self.wc.fp10()) {
                self.bucket
                    .refill(self.cc.target_rate(), self.wc.fp10(), now_ns);
                return Ok(match self.admit(tag, slot, now_ns) {
                    Some(_) => Submitted::Dispatch(tag),
                    None => Submitted::Queued(tag),
                });
            }
        }
        match self.drr.enqueue(tenant, req) {
            Ok(()) => {}
            Err(QosError::QueueFull) => {
                self.table.free(tag);
                return Ok(Submitted::Busy);
            }
            Err(e) => unreachable!("tenant and length were checked: {e:?}"),
        }
        // Alone in the scheduler: whatever poll_dispatch returns now is this request,
        // so handing it back directly cannot reorder anything.
        if self.queued() == 1 {
            if let Some(d) = self.poll_dispatch(now_ns) {
                assert_eq!(
                    d.tag, tag,
                    "the only queued request was not the one dispatched"
                );
                return Ok(Submitted::Dispatch(tag));
            }
        }
        Ok(Submitted::Queued(tag))
    }

    /// `submit` + `complete(tag, 0, now)` in one pass (the trait's contract).
    /// Same decisions: the bucket is refilled and charged, DRR serves and
    /// releases, congestion control and write cost see a zero-latency
    /// completion. What it skips is bookkeeping both steps undo: the request
    /// row, the active list, counting the tenant in and out of W_active.
    fn run_now(
        &mut self,
        tenant: TenantId,
        dir: IoDir,
        len_bytes: u32,
        now_ns: Nanos,
    ) -> Option<Completed> {
        let key = Lane {
            tenant,
            dir,
            len_bytes,
        };
        if let Some(d) = self.deferred.as_mut() {
            if d.key == key && d.now_ns == now_ns && d.n < d.room {
                d.n += 1;
                #[cfg(test)]
                {
                    self.lane_counts.2 += 1;
                }
                return Some(d.done);
            }
        }
        self.run_now_undeferred(key, now_ns)
    }

    /// §1.d Dispatch: refill, then the blocked request or DRR's next, if it conforms.
    fn poll_dispatch(&mut self, now_ns: Nanos) -> Option<Dispatch> {
        self.settle_lane();
        self.bucket
            .refill(self.cc.target_rate(), self.wc.fp10(), now_ns);
        // With nothing queued it changed only the bucket, which the lane
        // refills and checks itself: the lane stays (the daemon polls every loop).
        let (tag, slot) = self.next_candidate()?;
        self.lane = None;
        self.admit(tag, slot, now_ns)
    }

    /// §1.a rate update (OVERLOADED empties the buckets), §1.b write-cost sample,
    /// §1.c slot release, then the tenant's credits (§1.e: release before the credit).
    fn complete(
        &mut self,
        tag: Tag,
        device_latency_ns: Nanos,
        now_ns: Nanos,
    ) -> Result<Completed, SchedError> {
        self.settle_lane();
        self.lane = None;
        let e = *self
            .table
            .get(tag, State::InFlight)
            .ok_or(SchedError::BadTag)?;
        let state = self
            .cc
            .on_complete(e.dir, e.len_bytes, device_latency_ns, now_ns);
        if state == CcState::Overloaded {
            self.bucket.zero();
        }
        let (tmin, tmax) = (self.cfg.thresh_min_us, self.cfg.thresh_max_us);
        self.wc
            .on_complete(e.dir, device_latency_ns, now_ns, tmin, tmax);
        if e.dir == IoDir::Read {
            self.drr.observe_read_latency(e.tenant, device_latency_ns);
        }
        Ok(self.release(tag))
    }

    fn settle(&mut self) {
        self.settle_lane();
    }

    fn abort(&mut self, tag: Tag, _now_ns: Nanos) -> Result<Completed, SchedError> {
        self.settle_lane();
        self.lane = None;
        self.table
            .get(tag, State::InFlight)
            .ok_or(SchedError::BadTag)?;
        Ok(self.release(tag))
    }

    /// When the buckets will hold enough for the blocked request. Conservative: the
    /// estimate ignores overflow from the other bucket, so it may be late, never early.
    fn next_timeout(&self) -> Option<Nanos> {
        let (tag, _) = self.blocked?;
        let e = self.table.get(tag, State::Queued)?;
        let wait_ns = self.bucket.wait_ns(
            e.dir,
            charged_bytes(e.len_bytes),
            self.cc.target_rate(),
            self.wc.fp10(),
        );
        Some(self.bucket.last_refill_ns().saturating_add(wait_ns))
    }

    fn set_weight(&mut self, tenant: TenantId, weight: u32) -> Result<(), SchedError> {
        check_weight(weight)?;
        self.settle_lane();
        self.lane = None;
        self.drr
            .set_weight(tenant, weight)
            .map_err(|_| SchedError::BadTenant)
    }

    fn io_credits(&self, tenant: TenantId) -> Option<u32> {
        self.drr.io_credits(tenant)
    }

    fn view(&self, tenant: TenantId) -> Option<TenantView> {
        let (queued, inflight, weight) = self.drr.tenant_counts(tenant)?;
        let blocked = self
            .blocked
            .and_then(|(tag, _)| self.table.get(tag, State::Queued))
            .is_some_and(|e| e.tenant == tenant);
        let figures = TenantFigures {
            tenant,
            weight,
            io_credits: self.drr.io_credits(tenant)?,
            // DRR counts the blocked request as dispatched; the view counts it queued.
            queued: queued + blocked as u32,
            inflight: inflight - blocked as u32,
        };
        Some(make_view(figures, &self.cc, &self.wc))
    }

    fn headroom_bytes_per_s(&self) -> u64 {
        headroom(&self.cc)
    }

    fn queued(&self) -> u32 {
        self.drr.queued() as u32 + self.blocked.is_some() as u32
    }

    fn inflight(&self) -> u32 {
        self.inflight
    }
}
