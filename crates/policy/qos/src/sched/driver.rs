//! The one driver of a [`Scheduler`]: the glue every caller of the core needs,
//! kept here once so that the daemon, both simulators and the tests run the
//! same rules (docs/gimbal.md "In the daemon", docs/sim.md).
//!
//! A [`Driver`] owns the scheduler and a table of request rows indexed by
//! `Tag::index()` (a *slot*). A row holds what the caller needs back when the
//! request leaves the scheduler or the device — its payload `T` (the daemon's
//! `IoReq` and connection tag, a simulator's I/O handle), tenant, direction,
//! length, submit time — and the time it went to the device, from which the
//! driver takes the device latency at completion (§1.a's congestion signal).
//! Per I/O:
//!
//! ```text
//! submit(req, now)              -> Run(slot) | Held | Busy     (Run: send it to the device)
//! run_now(tenant, dir, len, now) -> Some(Completed)            (zero-time device: no row)
//! release(now)                  -> Some(Released { slot, .. }) (repeat until None; send each)
//! complete(slot, done, now)     -> Done { payload, io_credits, device_latency_ns, .. }
//! next_timeout() / arm_timer()  -> when to call release again if nothing else happens
//! ```
//!
//! Call `release` after every `submit` and `complete` and at each timeout
//! until it returns None. Times are the scheduler's clock (ns); a caller
//! whose device runs on another clock (the daemon's time-scaled emulated SSD)
//! converts before calling. The driver does no I/O and reads no clock.

use super::{Completed, SchedConfig, SchedError, SchedLimits, Scheduler, Submitted, TenantId};
use super::{Tag, TenantView};
use trellis_units::{IoDir, Nanos};

/// A request offered to the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<T> {
    pub tenant: TenantId,
    pub dir: IoDir,
    /// Data length (0 for Flush and the like).
    pub len_bytes: u32,
    /// The caller's own handle, handed back at release and completion.
    pub payload: T,
}

/// The answer to [`Driver::submit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submit {
    /// Send it to the device now; complete it later as `slot`.
    Run(usize),
    /// Held by the scheduler; a later [`Driver::release`] hands it out.
    Held,
    /// A bound is full: not accepted (answer "busy, retry").
    Busy,
}

/// A held request the scheduler let go: send it to the device now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released<T> {
    pub slot: usize,
    pub req: Request<T>,
    /// When it was submitted (so the caller can measure the whole wait).
    pub submitted_ns: Nanos,
}

/// A completed request, for the caller's response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Done<T> {
    pub req: Request<T>,
    pub submitted_ns: Nanos,
    /// From the device submit to `done_ns` (what the scheduler was told).
    pub device_latency_ns: Nanos,
    /// The tenant's I/O credits after this completion, in I/Os (§1.e).
    pub io_credits: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// In the scheduler's queue.
    Held,
    /// At the device since `dispatched_ns`.
    Running { dispatched_ns: Nanos },
}

#[derive(Clone, Copy, Debug)]
struct Row<T> {
    tag: Tag,
    stage: Stage,
    req: Request<T>,
    submitted_ns: Nanos,
}

/// A scheduler and the rows of the requests it has accepted (see the module
/// docs). `T` is the caller's per-request payload.
pub struct Driver<T: Copy> {
    sched: Box<dyn Scheduler>,
    /// Indexed by slot (`Tag::index()`); grown on demand, never past `capacity`.
    rows: Vec<Option<Row<T>>>,
    /// `SchedLimits::max_requests`: the scheduler never issues a slot at or above it.
    capacity: usize,
    /// Rows in use (held or running).
    occupied: usize,
    /// The timeout a caller armed through `arm_timer` and has not yet seen fire.
    armed_ns: Option<Nanos>,
}

impl<T: Copy> Driver<T> {
    /// Drives `sched`, built with `limits`; allocates `limits.prealloc_requests`
    /// rows now (the rest, up to `max_requests`, when a slot first needs them).
    pub fn new(sched: Box<dyn Scheduler>, limits: &SchedLimits) -> Driver<T> {
        let capacity = limits.max_requests as usize;
        let prealloc = (limits.prealloc_requests as usize).min(capacity);
        Driver {
            sched,
            rows: vec![None; prealloc],
            capacity,
            occupied: 0,
            armed_ns: None,
        }
    }

    /// Builds the scheduler `cfg` names (as [`super::build`]) and drives it.
    pub fn build(cfg: &SchedConfig, now_ns: Nanos) -> Result<Driver<T>, &'static str> {
        Ok(Driver::new(super::build(cfg, now_ns)?, &cfg.limits))
    }

    /// Offers `req`. On `Run` the caller sends it to the device at `now_ns`.
    pub fn submit(&mut self, req: Request<T>, now_ns: Nanos) -> Result<Submit, SchedError> {
        let r = self
            .sched
            .submit(req.tenant, req.dir, req.len_bytes, now_ns)?;
        let (tag, stage) = match r {
            Submitted::Dispatch(tag) => (
                tag,
                Stage::Running {
                    dispatched_ns: now_ns,
                },
            ),
            Submitted::Queued(tag) => (tag, Stage::Held),
            Submitted::Busy => return Ok(Submit::Busy),
        };
        let slot = tag.index();
        self.insert(
            slot,
            Row {
                tag,
                stage,
                req,
                submitted_ns: now_ns,
            },
        );
        Ok(match stage {
            Stage::Held => Submit::Held,
            Stage::Running { .. } => Submit::Run(slot),
        })
    }

    /// A request the device finishes inside its submission at zero device time
    /// (a RAM or null backend), decided and completed in one pass without a row
    /// ([`Scheduler::run_now`]); None, nothing changed, when it would not run at
    /// once: then `submit`.
    #[inline]
    pub fn run_now(
        &mut self,
        tenant: TenantId,
        dir: IoDir,
        len_bytes: u32,
        now_ns: Nanos,
    ) -> Option<Completed> {
        self.sched.run_now(tenant, dir, len_bytes, now_ns)
    }

    /// The next held request the scheduler lets go at `now_ns`, now counted as
    /// at the device from `now_ns`. Call until None.
    pub fn release(&mut self, now_ns: Nanos) -> Option<Released<T>> {
        let d = self.sched.poll_dispatch(now_ns)?;
        let slot = d.tag.index();
        let row = self
            .rows
            .get_mut(slot)
            .and_then(|r| r.as_mut())
            .filter(|r| r.tag == d.tag && r.stage == Stage::Held)
            .expect("the scheduler released a request the driver does not hold");
        row.stage = Stage::Running {
            dispatched_ns: now_ns,
        };
        Some(Released {
            slot,
            req: row.req,
            submitted_ns: row.submitted_ns,
        })
    }

    /// The device finished `slot` at `done_ns` (≤ `now_ns`; the latency runs
    /// from the device submit to it). Frees the slot. A slot not at the device
    /// (free, stale, or still held) is refused with `BadTag`, nothing changed.
    pub fn complete(
        &mut self,
        slot: usize,
        done_ns: Nanos,
        now_ns: Nanos,
    ) -> Result<Done<T>, SchedError> {
        let (row, dispatched_ns) = self.running(slot)?;
        let device_latency_ns = done_ns.saturating_sub(dispatched_ns);
        let c = self.sched.complete(row.tag, device_latency_ns, now_ns)?;
        debug_assert_eq!(c.tenant, row.req.tenant, "slot {slot} changed tenant");
        self.free(slot);
        Ok(Done {
            req: row.req,
            submitted_ns: row.submitted_ns,
            device_latency_ns,
            io_credits: c.io_credits,
        })
    }

    /// The device failed `slot`: release it without a latency sample (§1.a).
    pub fn abort(&mut self, slot: usize, now_ns: Nanos) -> Result<Done<T>, SchedError> {
        let (row, _) = self.running(slot)?;
        let c = self.sched.abort(row.tag, now_ns)?;
        self.free(slot);
        Ok(Done {
            req: row.req,
            submitted_ns: row.submitted_ns,
            device_latency_ns: 0,
            io_credits: c.io_credits,
        })
    }

    /// When `release` may next return something if no submit or completion
    /// happens first ([`Scheduler::next_timeout`]).
    #[inline]
    pub fn next_timeout(&self) -> Option<Nanos> {
        self.sched.next_timeout()
    }

    /// For a caller with one-shot timers (an event queue): the time to arm a
    /// new wake-up at, when `next_timeout` is earlier than the one armed
    /// already (or none is). Call [`Driver::timer_fired`] when it fires.
    pub fn arm_timer(&mut self) -> Option<Nanos> {
        let t = self.sched.next_timeout()?;
        if self.armed_ns.is_some_and(|armed| armed <= t) {
            return None;
        }
        self.armed_ns = Some(t);
        Some(t)
    }

    /// The timer `arm_timer` asked for fired: the next one may be armed. Then
    /// call `release`.
    pub fn timer_fired(&mut self) {
        self.armed_ns = None;
    }

    /// Applies what `run_now` deferred ([`Scheduler::settle`]).
    pub fn settle(&mut self) {
        self.sched.settle();
    }

    /// The scheduler, settled first: its views count every request so far
    /// (for the virtual-view log page and /metrics).
    pub fn settled(&mut self) -> &dyn Scheduler {
        self.sched.settle();
        &*self.sched
    }

    /// The scheduler as it is, for figures that are always current after a
    /// `submit`, `complete` or `release` (queued, in flight, credits,
    /// headroom when no `run_now` preceded).
    pub fn scheduler(&self) -> &dyn Scheduler {
        &*self.sched
    }

    /// A tenant's view, settled first.
    pub fn view(&mut self, tenant: TenantId) -> Option<TenantView> {
        self.settled().view(tenant)
    }

    /// Sets a tenant's weight ([`Scheduler::set_weight`]).
    pub fn set_weight(&mut self, tenant: TenantId, weight: u32) -> Result<(), SchedError> {
        self.sched.set_weight(tenant, weight)
    }

    /// Requests the driver holds a row for (held or at the device).
    pub fn occupied(&self) -> usize {
        self.occupied
    }

    /// Slots the table may grow to (`SchedLimits::max_requests`).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn insert(&mut self, slot: usize, row: Row<T>) {
        assert!(
            slot < self.capacity,
            "slot {slot} at or past max_requests {}",
            self.capacity
        );
        if slot >= self.rows.len() {
            self.rows.resize(slot + 1, None);
        }
        let old = self.rows[slot].replace(row);
        assert!(old.is_none(), "the scheduler reissued live slot {slot}");
        self.occupied += 1;
        debug_assert!(self.occupied <= self.capacity);
    }

    /// The row at the device in `slot`, and since when.
    fn running(&self, slot: usize) -> Result<(Row<T>, Nanos), SchedError> {
        match self.rows.get(slot).copied().flatten() {
            Some(row) => match row.stage {
                Stage::Running { dispatched_ns } => Ok((row, dispatched_ns)),
                Stage::Held => Err(SchedError::BadTag),
            },
            None => Err(SchedError::BadTag),
        }
    }

    fn free(&mut self, slot: usize) {
        self.rows[slot] = None;
        self.occupied -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Policy, SchedConfig};
    use super::*;

    fn driver(policy: Policy, max_requests: u32) -> Driver<u32> {
        let mut cfg = SchedConfig {
            policy,
            device_qd: 2,
            ..SchedConfig::default()
        };
        cfg.limits.max_requests = max_requests;
        cfg.limits.prealloc_requests = 0;
        Driver::build(&cfg, 0).unwrap()
    }

    fn read(tenant: TenantId, payload: u32) -> Request<u32> {
        Request {
            tenant,
            dir: IoDir::Read,
            len_bytes: 4096,
            payload,
        }
    }

    #[test]
    fn the_table_never_grows_past_max_requests_and_a_full_table_is_busy() {
        let mut d = driver(Policy::Fifo, 4);
        let r: Vec<Submit> = (0..5).map(|i| d.submit(read(0, i), 0).unwrap()).collect();
        assert_eq!(
            r,
            [
                Submit::Run(0),
                Submit::Run(1),
                Submit::Held,
                Submit::Held,
                Submit::Busy
            ]
        );
        assert_eq!((d.occupied(), d.capacity()), (4, 4));
        assert!(d.rows.len() <= 4, "rows {}", d.rows.len());
        // Completing frees the slot for the next submit.
        d.complete(0, 10, 10).unwrap();
        assert_eq!(d.occupied(), 3);
        assert!(d.release(10).is_some());
        assert!(matches!(d.submit(read(0, 9), 10), Ok(Submit::Held)));
        assert_eq!(d.occupied(), 4);
    }

    #[test]
    fn held_requests_are_released_in_the_scheduler_s_order_with_their_payload() {
        let mut d = driver(Policy::Fifo, 16);
        for i in 0..6 {
            d.submit(read(i as TenantId % 2, 100 + i), i as u64)
                .unwrap();
        }
        assert!(d.release(10).is_none(), "device depth 2 reached");
        let mut order = Vec::new();
        for k in 0..4u64 {
            let slot = k as usize;
            d.complete(slot, 20 + k, 20 + k).unwrap();
            let r = d.release(20 + k).expect("one slot freed, one released");
            assert_eq!(r.submitted_ns, r.req.payload as u64 - 100);
            order.push(r.req.payload);
        }
        assert_eq!(order, [102, 103, 104, 105], "arrival order (FIFO)");
    }

    #[test]
    fn completion_reports_device_latency_from_the_device_submit_and_credits() {
        let mut d = driver(Policy::Gimbal, 64);
        let Submit::Run(slot) = d.submit(read(3, 7), 1_000).unwrap() else {
            panic!("an idle Gimbal runs the first read at once")
        };
        let done = d.complete(slot, 51_000, 60_000).unwrap();
        assert_eq!(done.req, read(3, 7));
        assert_eq!((done.submitted_ns, done.device_latency_ns), (1_000, 50_000));
        assert_eq!(Some(done.io_credits), d.scheduler().io_credits(3));
        assert!(done.io_credits > 0);
        let v = d.view(3).unwrap();
        assert_eq!(v.read.latency_ewma_us, 25, "α = 1/2 from 0 of 50 µs");
        assert_eq!(d.occupied(), 0);
    }

    #[test]
    fn a_stale_free_or_held_slot_is_refused_and_changes_nothing() {
        let mut d = driver(Policy::Fifo, 8);
        for i in 0..3 {
            d.submit(read(0, i), 0).unwrap();
        }
        assert_eq!(d.complete(2, 5, 5), Err(SchedError::BadTag), "still held");
        assert_eq!(d.complete(7, 5, 5), Err(SchedError::BadTag), "never issued");
        assert_eq!(
            d.complete(100, 5, 5),
            Err(SchedError::BadTag),
            "out of table"
        );
        d.complete(0, 5, 5).unwrap();
        assert_eq!(
            d.complete(0, 6, 6),
            Err(SchedError::BadTag),
            "completed twice"
        );
        assert_eq!(d.abort(0, 6), Err(SchedError::BadTag));
        assert_eq!((d.occupied(), d.scheduler().inflight()), (2, 1));
        assert_eq!(d.release(6).map(|r| r.slot), Some(2));
        assert_eq!(d.abort(2, 7).unwrap().device_latency_ns, 0);
    }

    #[test]
    fn arm_timer_asks_once_per_earlier_timeout() {
        let mut d = driver(Policy::Gimbal, 64);
        assert_eq!(d.arm_timer(), None, "nothing held: no timer");
        // Three 128 KiB reads: the 256 KiB read bucket passes two, the third waits.
        for i in 0..3 {
            let r = Request {
                len_bytes: 128 << 10,
                ..read(0, i)
            };
            d.submit(r, 0).unwrap();
        }
        let t = d.next_timeout().expect("a token refill");
        assert_eq!(d.arm_timer(), Some(t));
        assert_eq!(d.arm_timer(), None, "already armed for {t}");
        d.timer_fired();
        assert_eq!(d.arm_timer(), Some(t), "re-armed after it fired");
    }
}
