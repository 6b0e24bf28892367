//! One Gimbal per namespace, whatever the number of reactors (issue 36).
//!
//! Gimbal's congestion state, write-cost estimate, token buckets and DRR
//! deficits describe one drive. With a scheduler per reactor, each reactor
//! saw only the requests of its own connections: each thought it owned the
//! drive (two reactors each admitted the drive's whole rate), DRR shared
//! only among the tenants that happened to land on one reactor, and the
//! credits hosts received counted half the load.
//!
//! So a namespace has one [`SharedGimbal`]: one `trellis_qos` driver behind
//! a mutex. A reactor takes the lock once per submitted command and once per
//! loop in which it has completions or requests held for it (`data::qos`);
//! never when idle. A request the scheduler holds belongs to the reactor
//! that received it: its buffer and its connection live there, and only that
//! reactor's backend queue may run it. So whichever reactor's completion or
//! token refill lets it go puts it in the owner's outbox ([`GimbalCore::
//! release`]); the owner takes its outbox at its next reap (it keeps polling
//! while it has any held) and sends it to its own backend queue.
//!
//! Times come from several reactors' clocks, read before they took the
//! lock, so one may arrive a little older than the last: the core clamps
//! them to never run backwards, which the scheduler's rates assume.

use crate::backend::{IoReq, Tag};
use crate::state::tenants::QosPublished;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};
use trellis_qos::sched::{Completed, Driver, Released, Request, SchedError, Scheduler, Submit};
use trellis_qos::sched::{SchedConfig, TenantId};
use trellis_units::IoDir;

/// A scheduled command's reservation access (§8.19): its host and whether
/// it is of the write group; None for a command reservations do not gate.
#[derive(Clone, Copy, Debug)]
pub struct ResvAccess {
    pub host: crate::state::resv::HostId,
    pub write: bool,
}

/// What the driver keeps of a scheduled request: what to submit to the
/// backend, whom to answer (the connection's tag), who sent it (for the
/// reservation check at release) and which reactor owns it.
#[derive(Clone, Copy, Debug)]
pub struct ConnIo {
    pub io: IoReq,
    pub tag: Tag,
    pub resv: Option<ResvAccess>,
    /// The reactor that received it: only its backend queue may run it.
    pub reactor: u16,
}

// SAFETY: `io.buf` points into a connection's buffer on reactor `reactor`.
// Other reactors move a ConnIo (under the core's lock, into that reactor's
// outbox) but never read or write through the pointer: only the owner
// submits it to its own backend queue (`data::qos`).
unsafe impl Send for ConnIo {}

/// The state behind the lock.
pub struct GimbalCore {
    drv: Driver<ConnIo>,
    /// Per reactor: requests released for it, not yet taken.
    outbox: Vec<Vec<Released<ConnIo>>>,
    /// Completed (commands, bytes) per tenant, copied out when publishing.
    completed: Vec<(u64, u64)>,
    /// Something changed since the last publish.
    dirty: bool,
    /// The latest time any reactor brought (device clock).
    last_ns: u64,
}

/// A namespace's one scheduler, shared by its reactors.
pub struct SharedGimbal {
    core: Mutex<GimbalCore>,
    /// Where `/metrics` reads its state.
    pub published: Arc<QosPublished>,
    /// When the state is next copied to `published` (wall ns): read without
    /// the lock by idle reactors, so only the one that publishes locks.
    next_publish_ns: AtomicU64,
}

impl SharedGimbal {
    /// Builds the scheduler `cfg` names at `now_ns` (device clock) with
    /// `weights`, for `reactors` reactors and `max_tenants` tenants.
    pub fn build(
        cfg: &SchedConfig,
        weights: &[(TenantId, u32)],
        now_ns: u64,
        reactors: usize,
        max_tenants: usize,
    ) -> anyhow::Result<SharedGimbal> {
        let mut drv = Driver::build(cfg, now_ns).map_err(|e| anyhow::anyhow!("{e}"))?;
        for &(t, w) in weights {
            drv.set_weight(t, w)
                .map_err(|e| anyhow::anyhow!("tenant {t} weight {w}: {e:?}"))?;
        }
        let per_reactor = cfg.limits.max_requests as usize;
        let outbox = (0..reactors.max(1))
            .map(|_| Vec::with_capacity(per_reactor.min(1024)))
            .collect();
        Ok(SharedGimbal {
            core: Mutex::new(GimbalCore {
                drv,
                outbox,
                completed: vec![(0, 0); max_tenants],
                dirty: false,
                last_ns: now_ns,
            }),
            published: Arc::new(QosPublished::new(max_tenants)),
            next_publish_ns: AtomicU64::new(0),
        })
    }

    /// Reactors the outboxes were built for (a reactor id at or past it is
    /// served by the last: there are none outside tests).
    pub fn reactors(&self) -> usize {
        crate::sys::lock(&self.core).outbox.len()
    }

    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, GimbalCore> {
        crate::sys::lock(&self.core)
    }

    /// Whether `/metrics` is due a copy at `now_ns` (wall); claims it.
    #[inline]
    pub fn publish_due(&self, now_ns: u64) -> bool {
        let next = self.next_publish_ns.load(Relaxed);
        if now_ns < next {
            return false;
        }
        let to = now_ns + crate::state::tenants::PUBLISH_INTERVAL_NS;
        self.next_publish_ns
            .compare_exchange(next, to, Relaxed, Relaxed)
            .is_ok()
    }
}

impl GimbalCore {
    /// `now_ns`, never earlier than a time already given to the scheduler.
    #[inline]
    fn clamp(&mut self, now_ns: u64) -> u64 {
        self.last_ns = self.last_ns.max(now_ns);
        self.last_ns
    }

    /// Offers `req` at `now_ns` (device clock): as [`Driver::submit`].
    pub fn submit(&mut self, req: Request<ConnIo>, now_ns: u64) -> Result<Submit, SchedError> {
        let now = self.clamp(now_ns);
        self.drv.submit(req, now)
    }

    /// As [`Driver::run_now`], counted; the tenant's credits.
    #[inline]
    pub fn run_now(&mut self, tenant: TenantId, dir: IoDir, len: u32, now_ns: u64) -> Option<u32> {
        let now = self.clamp(now_ns);
        let c: Completed = self.drv.run_now(tenant, dir, len, now)?;
        Some(self.count(c.tenant, len as u64, c.io_credits))
    }

    /// Completes `slot`: the device finished it at `done_ns` (≤ now).
    /// Its connection tag and credits; None for a stale slot (logged).
    pub fn finish(&mut self, slot: usize, done_ns: u64, now_ns: u64) -> Option<(Tag, u32)> {
        let now = self.clamp(now_ns);
        match self.drv.complete(slot, done_ns.min(now), now) {
            Ok(d) => {
                let c = self.count(d.req.tenant, d.req.payload.io.len_bytes, d.io_credits);
                Some((d.req.payload.tag, c))
            }
            Err(e) => {
                tracing::error!(slot, "qos complete of a stale slot: {e:?}");
                None
            }
        }
    }

    /// Releases `slot` without a latency sample: it never reached the
    /// device (the HA fence or a reservation refused it at release).
    pub fn abort(&mut self, slot: usize, now_ns: u64) -> Option<(Tag, u32)> {
        let now = self.clamp(now_ns);
        match self.drv.abort(slot, now) {
            Ok(d) => {
                self.dirty = true;
                Some((d.req.payload.tag, d.io_credits))
            }
            Err(e) => {
                tracing::error!(slot, "qos abort of a stale slot: {e:?}");
                None
            }
        }
    }

    /// Everything the scheduler lets go at `now_ns`, into its owners' outboxes.
    pub fn release(&mut self, now_ns: u64) {
        let now = self.clamp(now_ns);
        let last = self.outbox.len() - 1;
        while let Some(r) = self.drv.release(now) {
            let owner = (r.req.payload.reactor as usize).min(last);
            if let Some(o) = self.outbox.get_mut(owner) {
                o.push(r);
            }
        }
    }

    /// Moves what was released for `reactor` to `out`; how many.
    pub fn take(&mut self, reactor: usize, out: &mut Vec<Released<ConnIo>>) -> usize {
        let last = self.outbox.len() - 1;
        match self.outbox.get_mut(reactor.min(last)) {
            Some(o) => {
                let n = o.len();
                out.append(o);
                n
            }
            None => 0,
        }
    }

    /// The tenant's I/O credits now.
    pub fn credits(&self, tenant: TenantId) -> u32 {
        self.drv.scheduler().io_credits(tenant).unwrap_or(0)
    }

    /// The scheduler, settled (its views count every request so far).
    pub fn scheduler(&mut self) -> &dyn Scheduler {
        self.drv.settled()
    }

    /// Applies a tenant's weight.
    pub fn set_weight(&mut self, tenant: TenantId, weight: u32) -> Result<(), SchedError> {
        self.drv.set_weight(tenant, weight)
    }

    /// Counts a completion for `/metrics`; returns its I/O credits.
    #[inline]
    fn count(&mut self, tenant: TenantId, len_bytes: u64, io_credits: u32) -> u32 {
        if let Some(n) = self.completed.get_mut(tenant as usize) {
            n.0 += 1;
            n.1 += len_bytes;
        }
        self.dirty = true;
        io_credits
    }

    /// Copies the scheduler's state to `p` if anything changed (cold: at
    /// most every `PUBLISH_INTERVAL_NS`).
    #[cold]
    pub fn publish(&mut self, p: &QosPublished) {
        if !std::mem::take(&mut self.dirty) {
            return;
        }
        let s = self.drv.settled();
        p.headroom_bytes_per_s
            .store(s.headroom_bytes_per_s(), Relaxed);
        for (t, tp) in p.tenants.iter().enumerate() {
            if let Some(&(cmds, bytes)) = self.completed.get(t) {
                tp.completed_commands.store(cmds, Relaxed);
                tp.completed_bytes.store(bytes, Relaxed);
            }
            let Some(v) = s.view(t as TenantId) else {
                continue;
            };
            tp.queued.store(v.queued as u64, Relaxed);
            tp.in_flight.store(v.inflight as u64, Relaxed);
            tp.io_credits.store(v.io_credits as u64, Relaxed);
            if t == 0 {
                p.target_rate_bytes_per_s
                    .store(v.target_rate_bytes_per_s, Relaxed);
                p.write_cost_fp10.store(v.write_cost_fp10, Relaxed);
                for (k, d) in [v.read, v.write].iter().enumerate() {
                    p.state[k].store(state_byte(d.state) as u64, Relaxed);
                    p.latency_ewma_us[k].store(d.latency_ewma_us, Relaxed);
                    p.latency_target_us[k].store(d.latency_target_us, Relaxed);
                }
            }
        }
    }
}

/// Congestion state as one byte: 0 no sample yet, then the four states of
/// docs/gimbal.md §1.a from calm to overloaded.
pub fn state_byte(s: Option<trellis_qos::CcState>) -> u8 {
    use trellis_qos::CcState::*;
    match s {
        None => 0,
        Some(UnderUtilised) => 1,
        Some(Avoidance) => 2,
        Some(Congested) => 3,
        Some(Overloaded) => 4,
    }
}
