//! Gimbal in the I/O path (docs/gimbal.md "In the daemon").
//!
//! A namespace with `qos = "gimbal"` has one scheduler, whatever the number
//! of reactors ([`SharedGimbal`], `state::gimbal`: one drive, one congestion
//! state, one set of token buckets and DRR deficits). Each reactor drives it
//! through a [`QosQueue`]: the reactor's backend queue wrapped with the
//! shared scheduler. The wrapper is itself a [`BackendQueue`], so the
//! reactor's loop (`kick`, `reap`, `in_flight`) drives it unchanged: `reap`
//! completes finished requests into the scheduler and sends to the backend
//! what it then released for this reactor, so the release step runs every
//! loop. What stays here is the daemon's own: the backend, the
//! wall-to-device clock, the HA fence at release, credits on the
//! completions it returns ([`Completion::credits`]), and the /metrics
//! board. A namespace with `qos = "off"` never sees this module: its queue
//! is the bare backend queue.
//!
//! Tenants are host NQNs mapped to a dense [`TenantId`] at Connect
//! ([`Tenants`]); the I/O path carries the id, never the string.

use crate::backend::{BackendQueue, Completion, IoReq, Op, Tag};
use crate::config::qos::{QosConfig, QosMode};
use crate::state::tenants::Tenants;
use std::sync::Arc;
use trellis_nvme::Status;
use trellis_qos::sched::{self, Released, Request, Scheduler, Submit, TenantId};
use trellis_units::IoDir;

/// Status of a command the scheduler refused because a bound is full
/// (`Submitted::Busy`): Namespace Not Ready (generic 82h) with DNR clear.
/// Hosts retry it (Linux after its requeue delay; SPDK likewise), and it
/// needs nothing negotiated: Command Interrupted (21h) says "retry" more
/// exactly but may only be returned to hosts that enabled ACRE in Host
/// Behavior Support, which stock Linux does not. Not Internal Error (06h):
/// nothing failed, and an operator should not read a full queue as a fault.
pub const QOS_BUSY: Status = trellis_nvme::status::generic::NS_NOT_READY;

pub use crate::state::gimbal::ResvAccess;
use crate::state::gimbal::{state_byte, ConnIo, SharedGimbal};

/// Rounds of release → dispatch → complete one `reap` runs when the backend
/// finishes released requests at once (null, RAM): each round takes the
/// lock once; what is left waits for the next loop (`QosQueue::released`).
const MAX_RELEASE_ROUNDS: usize = 64;

/// One reactor's queue for one Gimbal namespace: its own backend queue, and
/// the namespace's one scheduler ([`SharedGimbal`], shared by the reactors).
pub struct QosQueue {
    inner: Box<dyn BackendQueue>,
    shared: Arc<SharedGimbal>,
    /// This reactor's id: the owner written into each request it submits.
    me: u16,
    /// This reactor's requests the scheduler holds, or released into this
    /// reactor's outbox and not yet taken: while any, it polls and reaps.
    held: usize,
    /// Completions reaped from `inner` (reused: no allocation per I/O).
    reaped: Vec<Completion>,
    /// When each of those fell due on the device (`reap_timed`), wall ns.
    due_ns: Vec<u64>,
    /// Released requests taken from the outbox, not yet sent.
    released: Vec<Released<ConnIo>>,
    /// Released requests that finished when dispatched (synchronous backend)
    /// or were refused (fence, reservation): (slot, status, tag, sent).
    over: Vec<(usize, Status, Tag, bool)>,
    /// The device's clock: wall ÷ `Backend::time_scale` (1 except on a
    /// time-scaled emulated SSD). The scheduler sees times and latencies on
    /// it, so Gimbal's thresholds (µs) and rates (B/s) apply to the drive
    /// the model emulates, exactly as they would on that drive in real time.
    clock: DeviceClock,
    /// This reactor changed the scheduler since it last saw it published.
    touched: bool,
    /// `inner.completes_in_submit()`: scheduling goes through `run_now`.
    inner_sync: bool,
    /// The reactor's clock at the latest `submit_for` since the last
    /// `reap` (0: none since). A busy reactor on a synchronous backend then
    /// checks its publish deadline against it and reads no clock per loop.
    submit_seen_ns: u64,
    /// Checked when a held request is released (`dispatch`): it may have
    /// waited in the scheduler past the HA fence.
    fence: Arc<crate::state::fence::Fence>,
    /// The namespace's reservations, checked at release too: its host may
    /// have been preempted while it waited (Preempt and Abort).
    resv: Arc<crate::state::resv::Resv>,
}

/// Converts wall-clock ns to the device's clock.
#[derive(Clone, Copy, Debug)]
struct DeviceClock {
    /// None: the device runs on the wall clock (every backend but a
    /// time-scaled emulated SSD), and converting is a no-op, decided by one
    /// branch rather than a float compare on every call.
    scale: Option<f64>,
}

impl DeviceClock {
    fn new(scale: f64) -> DeviceClock {
        DeviceClock {
            scale: (scale.is_finite() && scale > 1.0).then_some(scale),
        }
    }
    #[inline]
    fn ns(self, wall_ns: u64) -> u64 {
        match self.scale {
            None => wall_ns,
            Some(s) => (wall_ns as f64 / s) as u64,
        }
    }
}

/// What a reactor's queue shares with the rest of the node.
pub struct NodeShare {
    /// Checked when a held request is released.
    pub fence: Arc<crate::state::fence::Fence>,
    /// The namespace's reservations, checked when a held request is released.
    pub resv: Arc<crate::state::resv::Resv>,
    /// The reactor this queue belongs to.
    pub reactor: usize,
}

/// Builds a namespace's one Gimbal scheduler, configured by `cfg` with the
/// tenants' weights, for `reactors` reactors (for `Namespace::gimbal`).
pub fn build_shared(
    cfg: &QosConfig,
    tenants: &Tenants,
    now_ns: u64,
    time_scale: f64,
    model: Option<&trellis_qos::DeviceModel>,
    reactors: usize,
) -> anyhow::Result<SharedGimbal> {
    let sched_cfg = cfg.sched_for(model);
    let weights: Vec<(TenantId, u32)> = tenants.weights().into_iter().collect();
    let now = DeviceClock::new(time_scale).ns(now_ns);
    let max_tenants = cfg.limits.max_tenants as usize;
    SharedGimbal::build(&sched_cfg, &weights, now, reactors, max_tenants)
}

/// Wraps `inner`, one reactor's backend queue, with the namespace's shared
/// scheduler.
pub fn wrap(
    inner: Box<dyn BackendQueue>,
    shared: Arc<SharedGimbal>,
    node: NodeShare,
    time_scale: f64,
) -> Box<QosQueue> {
    // Ids past the outboxes (none outside tests) share the last one.
    let me = node
        .reactor
        .min(shared.reactors() - 1)
        .min(u16::MAX as usize) as u16;
    Box::new(QosQueue {
        inner_sync: inner.completes_in_submit(),
        inner,
        shared,
        me,
        held: 0,
        reaped: Vec::with_capacity(256),
        due_ns: Vec::with_capacity(256),
        released: Vec::with_capacity(256),
        over: Vec::with_capacity(256),
        clock: DeviceClock::new(time_scale),
        touched: false,
        submit_seen_ns: 0,
        fence: node.fence,
        resv: node.resv,
    })
}

/// The backend tag of the request in driver slot `slot`. Slots are below
/// the driver's `max_requests`, a `u32`, so the conversion never truncates.
#[inline]
fn scheduled_tag(slot: usize) -> Tag {
    Tag::scheduled(slot as u32)
}

fn dir_of(op: Op) -> IoDir {
    match op {
        Op::Write => IoDir::Write,
        _ => IoDir::Read,
    }
}

impl QosQueue {
    /// Submits `io` for `tenant`. `Some((status, credits))` when it finished
    /// now (a synchronous backend, or Busy); `None` when its completion will
    /// come from `reap`. `resv`: its reservation access, checked again if
    /// the scheduler holds it.
    ///
    /// # Safety
    /// As [`BackendQueue::submit`]; the buffer must also stay valid while
    /// the scheduler holds the request (it is submitted later).
    pub unsafe fn submit_for(
        &mut self,
        tenant: TenantId,
        io: &IoReq,
        tag: Tag,
        resv: Option<ResvAccess>,
        now_ns: u64,
    ) -> Option<(Status, u32)> {
        let (len, dir) = (io.len_bytes.min(u32::MAX as u64) as u32, dir_of(io.op));
        self.submit_seen_ns = now_ns;
        self.touched = true;
        let dev_ns = self.clock.ns(now_ns);
        let mut c = self.shared.lock();
        if self.inner_sync {
            if let Some(credits) = c.run_now(tenant, dir, len, dev_ns) {
                drop(c);
                // SAFETY: as `dispatch_now`; the backend finishes it inside
                // this call (`completes_in_submit`).
                let st = unsafe { self.inner.submit(io, tag) };
                // Not finished after all: its completion comes from `reap`
                // under the connection's own tag, as a bypassed request's.
                return st.map(|st| (st, credits));
            }
        }
        let payload = ConnIo {
            io: *io,
            tag,
            resv,
            reactor: self.me,
        };
        let req = Request {
            tenant,
            dir,
            len_bytes: len,
            payload,
        };
        let r = c.submit(req, dev_ns);
        let busy_credits = c.credits(tenant);
        drop(c);
        match r {
            Ok(Submit::Run(slot)) => self.dispatch_now(slot, io, dev_ns),
            Ok(Submit::Held) => {
                self.held += 1; // a later release (in some reactor's `reap`) frees it
                None
            }
            Ok(Submit::Busy) => Some((QOS_BUSY, busy_credits)),
            Err(e) => {
                tracing::error!(tenant, "qos submit refused: {e:?}");
                Some((trellis_nvme::status::generic::INTERNAL_ERROR, 0))
            }
        }
    }

    /// A read of `len_bytes` from a namespace that reads zeroes (null): the
    /// scheduler decides it and completes it at zero device time
    /// (`Scheduler::run_now`); nothing goes to the backend, whose read would
    /// do nothing (the data is the shared zero page, as with QoS off).
    /// Its credits, or None (nothing changed) when the scheduler would not
    /// run it at once: then `submit_for`.
    #[inline]
    pub fn run_zero_read(&mut self, tenant: TenantId, len_bytes: u64, now_ns: u64) -> Option<u32> {
        if !self.inner_sync {
            return None;
        }
        let len = len_bytes.min(u32::MAX as u64) as u32;
        let dev_ns = self.clock.ns(now_ns);
        let credits = self
            .shared
            .lock()
            .run_now(tenant, IoDir::Read, len, dev_ns)?;
        self.submit_seen_ns = now_ns;
        self.touched = true;
        Some(credits)
    }

    /// Sends `io`, which the driver let run at once in `slot`, to the backend
    /// at `dev_ns` (device clock).
    fn dispatch_now(&mut self, slot: usize, io: &IoReq, dev_ns: u64) -> Option<(Status, u32)> {
        // SAFETY: the buffer is the request's own (or none), valid until it
        // completes: the caller of `submit_for` promised so.
        let st = unsafe { self.inner.submit(io, scheduled_tag(slot)) }?;
        let done = self.shared.lock().finish(slot, dev_ns, dev_ns);
        Some((st, done.map_or(0, |(_, c)| c)))
    }

    /// Sends a released request of this reactor to its backend; returns
    /// (slot, status, connection tag, sent) when it is over now: the
    /// backend finished it synchronously (sent), or the fence or its
    /// reservation refused it (never sent).
    fn dispatch(&mut self, r: Released<ConnIo>) -> Option<(usize, Status, Tag, bool)> {
        let ConnIo { io, tag, resv, .. } = r.req.payload;
        if !self.fence.allows_now() {
            // Held past the fence (docs/target.md, "HA pair"): never sent,
            // failed with a path error so the host retries elsewhere.
            let st = trellis_nvme::status::path::ANA_INACCESSIBLE;
            return Some((r.slot, st, tag, false));
        }
        if let Some(st) = resv.and_then(|a| self.resv_denies(a)) {
            // Its host lost access while it waited (Preempt and Abort).
            return Some((r.slot, st, tag, false));
        }
        // SAFETY: the buffer is the request's own (or none), valid until it
        // completes: the caller of `submit_for` promised so, and only this
        // reactor (its owner) sends it.
        let st = unsafe { self.inner.submit(&io, scheduled_tag(r.slot)) }?;
        Some((r.slot, st, tag, true))
    }

    /// The status a released request fails with because its host may no
    /// longer run it (one load while no reservation is held).
    #[inline]
    fn resv_denies(&self, a: ResvAccess) -> Option<Status> {
        if !self.resv.any_held() {
            return None;
        }
        self.resv.check_io(&a.host, a.write).err()
    }

    /// Sends what was released for this reactor; what finishes or is refused
    /// at once is completed into the scheduler (one lock per round), which
    /// may release more: at most [`MAX_RELEASE_ROUNDS`] rounds per call.
    fn run_released(&mut self, dev_now: u64, out: &mut Vec<Completion>) {
        for _ in 0..MAX_RELEASE_ROUNDS {
            if self.released.is_empty() {
                return;
            }
            let mut batch = std::mem::take(&mut self.released);
            for r in batch.drain(..) {
                if let Some(over) = self.dispatch(r) {
                    self.over.push(over);
                }
            }
            self.released = batch;
            if self.over.is_empty() {
                return;
            }
            let mut c = self.shared.lock();
            for &(slot, st, tag, sent) in &self.over {
                let done = match sent {
                    true => c.finish(slot, dev_now, dev_now),
                    false => c.abort(slot, dev_now),
                };
                out.push(Completion::with_credits(
                    tag,
                    st,
                    done.map_or(0, |(_, k)| k),
                ));
            }
            self.over.clear();
            c.release(dev_now);
            self.held -= c.take(self.me as usize, &mut self.released);
        }
    }

    /// Runs `f` on the scheduler, settled first, so its view counts every
    /// request run so far (`Scheduler::settle`): for the virtual-view log
    /// page and tests.
    pub fn with_scheduler<R>(&self, f: impl FnOnce(&dyn Scheduler) -> R) -> R {
        let mut c = self.shared.lock();
        f(c.scheduler())
    }

    /// Applies `weights` (the reactor, after a live change).
    pub fn set_weights(&mut self, weights: &[(TenantId, u32)]) {
        let mut c = self.shared.lock();
        for &(t, w) in weights {
            if let Err(e) = c.set_weight(t, w) {
                tracing::warn!("tenant {t} weight {w} not applied: {e:?}");
            }
        }
    }

    /// Publishes for `/metrics` if this reactor changed something and the
    /// namespace's interval is up (cold: at most every interval).
    fn maybe_publish(&mut self, now_ns: u64) {
        if self.touched && self.shared.publish_due(now_ns) {
            self.touched = false;
            self.shared.lock().publish(&self.shared.published);
        }
    }

    /// Completes what this reactor's backend finished (`mine`, due times
    /// `due`) into the scheduler and takes what it released for this
    /// reactor: one lock.
    fn complete_batch(
        &mut self,
        mine: &[Completion],
        due: &[u64],
        now: u64,
        out: &mut Vec<Completion>,
    ) {
        let dev_now = self.clock.ns(now);
        let mut c = self.shared.lock();
        for (k, &comp) in mine.iter().enumerate() {
            let Some(slot) = comp.tag.as_scheduled() else {
                out.push(comp); // bypassed the scheduler: the connection's own
                continue;
            };
            // The device's completion time where the backend knows it
            // (emulated SSD), else now.
            let done_ns = self.clock.ns(due.get(k).copied().unwrap_or(now).min(now));
            if let Some((conn_tag, credits)) = c.finish(slot as usize, done_ns, dev_now) {
                out.push(Completion::with_credits(conn_tag, comp.status, credits));
            }
        }
        // The release step: completions and token refills let held requests go.
        c.release(dev_now);
        self.held -= c.take(self.me as usize, &mut self.released);
        self.touched |= !mine.is_empty();
        if self.touched && self.shared.publish_due(now) {
            self.touched = false;
            c.publish(&self.shared.published);
        }
    }
}

impl BackendQueue for QosQueue {
    /// Requests without a tenant bypass the scheduler.
    unsafe fn submit(&mut self, req: &IoReq, tag: Tag) -> Option<Status> {
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { self.inner.submit(req, tag) }
    }

    /// Dataset Management: bypasses the scheduler, as `submit` does.
    fn submit_ranges(
        &mut self,
        op: Op,
        ranges: &[(u64, u64)],
        fua: bool,
        tag: Tag,
    ) -> Option<Status> {
        self.inner.submit_ranges(op, ranges, fua, tag)
    }

    fn zero_chunk_bytes(&self) -> u64 {
        self.inner.zero_chunk_bytes()
    }

    fn kick(&mut self) {
        self.inner.kick();
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let before = out.len();
        out.append(&mut self.reaped);
        let mut mine = std::mem::take(&mut self.reaped);
        let mut due = std::mem::take(&mut self.due_ns);
        self.inner.reap_timed(&mut mine, &mut due);
        if mine.is_empty() && self.held == 0 && self.released.is_empty() {
            // Nothing finished and nothing waits: no lock, no clock read.
            (self.reaped, self.due_ns) = (mine, due);
            // Publish what changed since, at most once per interval: a
            // synchronous backend (null, ram) completes inside submit, so
            // this path runs every loop while it is busy, and then the
            // submit's clock serves; an idle queue reads the clock.
            let seen = std::mem::take(&mut self.submit_seen_ns);
            if self.touched {
                let now = if seen != 0 {
                    seen
                } else {
                    crate::sys::now_ns()
                };
                self.maybe_publish(now);
            }
            return out.len() - before;
        }
        let now = crate::sys::now_ns();
        self.complete_batch(&mine, &due, now, out);
        mine.clear();
        due.clear();
        (self.reaped, self.due_ns) = (mine, due);
        self.run_released(self.clock.ns(now), out);
        self.inner.kick();
        out.len() - before
    }

    /// Requests the scheduler holds for this reactor count as in flight:
    /// the reactor then keeps polling (never sleeps) until they are
    /// released, which is how it honours `Driver::next_timeout` without
    /// asking it: token refills come every 250 µs, finer than epoll's
    /// millisecond timeout, so a reactor sleeping until the refill would
    /// oversleep it.
    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.held + self.released.len() + self.reaped.len()
    }

    fn cancel_all(&mut self) -> usize {
        self.inner.cancel_all()
    }
}

/// Vendor-specific log page (C0h–FFh) serving the virtual view, §1.f.
pub const VIEW_LID: u8 = 0xC0;
/// Layout version in byte 0 of the header.
pub const VIEW_VERSION: u8 = 1;
pub const VIEW_HEADER_BYTES: usize = 16;
pub const VIEW_ENTRY_BYTES: usize = 64;

fn encode_view(nsid: u32, v: &sched::TenantView, e: &mut [u8]) {
    let u32c = |x: u64| x.min(u32::MAX as u64) as u32;
    e[0..4].copy_from_slice(&nsid.to_le_bytes());
    e[4..6].copy_from_slice(&v.tenant.to_le_bytes());
    e[6..8].copy_from_slice(&(v.weight.min(u16::MAX as u32) as u16).to_le_bytes());
    e[8..12].copy_from_slice(&v.io_credits.to_le_bytes());
    e[12..16].copy_from_slice(&v.queued.to_le_bytes());
    e[16..20].copy_from_slice(&v.inflight.to_le_bytes());
    e[20] = state_byte(v.read.state);
    e[21] = state_byte(v.write.state);
    e[24..28].copy_from_slice(&u32c(v.read.latency_target_us).to_le_bytes());
    e[28..32].copy_from_slice(&u32c(v.write.latency_target_us).to_le_bytes());
    e[32..36].copy_from_slice(&u32c(v.read.latency_ewma_us).to_le_bytes());
    e[36..40].copy_from_slice(&u32c(v.write.latency_ewma_us).to_le_bytes());
    e[40..44].copy_from_slice(&u32c(v.write_cost_fp10).to_le_bytes());
    e[48..56].copy_from_slice(&v.target_rate_bytes_per_s.to_le_bytes());
    e[56..64].copy_from_slice(&v.headroom_bytes_per_s.to_le_bytes());
}

/// The virtual-view log page of `sub` for the host of tenant `me`: one
/// entry per (Gimbal namespace, tenant in use), from each namespace's one
/// scheduler. NSID 0 or FFFFFFFFh: every namespace; else the one named.
/// Layout: docs/gimbal.md "Virtual view log page".
pub fn view_log(
    ctx: &mut crate::data::nvme::exec::Ctx,
    sub: &crate::state::nsset::SubNs,
    me: TenantId,
    nsid: u32,
    page: &mut Vec<u8>,
) -> Result<(), Status> {
    let all = nsid == 0 || nsid == 0xFFFF_FFFF;
    if !all && sub.namespace(nsid).is_none() {
        return Err(trellis_nvme::status::generic::INVALID_NAMESPACE.dnr());
    }
    let tenants = ctx.reg.tenants().in_use();
    page.resize(VIEW_HEADER_BYTES, 0);
    let mut n: u16 = 0;
    for ns in sub.namespaces.iter() {
        if ns.qos() != QosMode::Gimbal || !(all || ns.nsid() == nsid) {
            continue;
        }
        let Some(qq) = ctx.queue(ns).and_then(|q| q.qos()) else {
            continue;
        };
        qq.with_scheduler(|s| {
            for v in tenants.iter().filter_map(|&t| s.view(t)) {
                let at = page.len();
                page.resize(at + VIEW_ENTRY_BYTES, 0);
                encode_view(ns.nsid(), &v, &mut page[at..]);
                n = n.saturating_add(1);
            }
        });
    }
    page[0] = VIEW_VERSION;
    page[2..4].copy_from_slice(&n.to_le_bytes());
    page[4..6].copy_from_slice(&me.to_le_bytes());
    page[6..8].copy_from_slice(&(VIEW_ENTRY_BYTES as u16).to_le_bytes());
    Ok(())
}

/// A namespace's scheduler for one reactor, as a test builds it.
#[cfg(test)]
fn one_reactor(cfg: &QosConfig, tenants: &Tenants) -> Arc<SharedGimbal> {
    let now = crate::sys::now_ns();
    Arc::new(build_shared(cfg, tenants, now, 1.0, None, 1).unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tag::test_tag;
    use crate::backend::IoReq;

    /// An asynchronous device that finishes every request `device_ns` after
    /// its submit, however late it is reaped.
    struct SlowPoller {
        device_ns: u64,
        pending: Vec<(Tag, u64)>,
    }

    impl BackendQueue for SlowPoller {
        unsafe fn submit(&mut self, _req: &IoReq, tag: Tag) -> Option<Status> {
            let due = crate::sys::now_ns() + self.device_ns;
            self.pending.push((tag, due));
            None
        }
        fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
            let n = self.pending.len();
            out.extend(
                self.pending
                    .drain(..)
                    .map(|(t, _)| Completion::new(t, Status::SUCCESS)),
            );
            n
        }
        fn reap_timed(&mut self, out: &mut Vec<Completion>, due_ns: &mut Vec<u64>) -> usize {
            due_ns.extend(self.pending.iter().map(|&(_, d)| d));
            self.reap(out)
        }
        fn in_flight(&self) -> usize {
            self.pending.len()
        }
    }

    #[test]
    fn gimbal_sees_the_device_s_completion_time_not_a_late_reap() {
        // 100 µs on the device, reaped 20 ms later: with the reap time, the
        // read EWMA (α = 1/2, from 0) would be 10 ms; with the device's, 50 µs.
        let cfg = QosConfig::default();
        let tenants = Tenants::new(&[], &cfg.limits);
        let inner = Box::new(SlowPoller {
            device_ns: 100_000,
            pending: Vec::new(),
        });
        let node = NodeShare {
            fence: Arc::new(crate::state::fence::Fence::always()),
            resv: Arc::new(crate::state::resv::Resv::open(None, 4).unwrap()),
            reactor: 0,
        };
        let mut q = wrap(inner, one_reactor(&cfg, &tenants), node, 1.0);
        let io = IoReq {
            op: Op::Read,
            offset_bytes: 0,
            len_bytes: 4096,
            buf: std::ptr::null_mut(),
            fua: false,
        };
        let qq = &mut *q;
        // SAFETY: no buffer: the fake device never touches it.
        let r = unsafe { qq.submit_for(0, &io, test_tag(42), None, crate::sys::now_ns()) };
        assert!(r.is_none(), "an asynchronous device completes later");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut out = Vec::new();
        assert_eq!(q.reap(&mut out), 1);
        assert_eq!(
            out[0].tag,
            test_tag(42),
            "answered under the connection's tag"
        );
        assert!(
            out[0].credits.is_some(),
            "a scheduled completion carries credits"
        );
        let v = q.with_scheduler(|s| s.view(0)).unwrap();
        let ewma = v.read.latency_ewma_us;
        assert!((40..1_000).contains(&ewma), "read EWMA {ewma} µs");
    }
}

#[cfg(test)]
mod fence_tests {
    use super::*;
    use crate::backend::tag::test_tag;
    use std::sync::atomic::AtomicUsize;
    use std::sync::atomic::Ordering::Relaxed;

    /// A device that counts what reaches it and finishes all of it at the
    /// next reap.
    struct Counting {
        submitted: Arc<AtomicUsize>,
        pending: Vec<Tag>,
    }

    impl BackendQueue for Counting {
        unsafe fn submit(&mut self, _req: &IoReq, tag: Tag) -> Option<Status> {
            self.submitted.fetch_add(1, Relaxed);
            self.pending.push(tag);
            None
        }
        fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
            let n = self.pending.len();
            out.extend(
                self.pending
                    .drain(..)
                    .map(|t| Completion::new(t, Status::SUCCESS)),
            );
            n
        }
        fn in_flight(&self) -> usize {
            self.pending.len()
        }
    }

    /// Issue 37: a command held in the Gimbal scheduler when ownership
    /// moves must not reach the device when the scheduler lets it go: it
    /// fails with ANA Inaccessible, while the ones already at the device
    /// finish as they were.
    /// Reaps until `n` requests completed (or about 300 ms passed): how
    /// many succeeded and how many failed with `refused`; any other status
    /// fails the test.
    fn reap_all(q: &mut QosQueue, n: usize, refused: Status) -> (usize, usize) {
        let (mut ok, mut no, mut out) = (0, 0, Vec::new());
        for _ in 0..1_000 {
            out.clear();
            q.reap(&mut out);
            for c in &out {
                match c.status {
                    Status::SUCCESS => ok += 1,
                    s if s == refused => no += 1,
                    s => panic!("unexpected status {s:?}"),
                }
            }
            if ok + no == n {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
        (ok, no)
    }

    #[test]
    fn requests_held_in_the_scheduler_past_the_fence_never_reach_the_device() {
        let cfg = QosConfig::default();
        let tenants = Tenants::new(&[], &cfg.limits);
        let submitted = Arc::new(AtomicUsize::new(0));
        let fence = Arc::new(crate::state::fence::Fence::stopped());
        fence.serve_until(crate::sys::now_ns() + 60_000_000_000);
        let node = NodeShare {
            fence: fence.clone(),
            resv: Arc::new(crate::state::resv::Resv::open(None, 4).unwrap()),
            reactor: 0,
        };
        let inner = Box::new(Counting {
            submitted: submitted.clone(),
            pending: Vec::new(),
        });
        let mut q = wrap(inner, one_reactor(&cfg, &tenants), node, 1.0);
        const N: u64 = 200;
        for tag in 0..N {
            let io = IoReq {
                op: Op::Read,
                offset_bytes: tag * 4096,
                len_bytes: 4096,
                buf: std::ptr::null_mut(),
                fua: false,
            };
            // SAFETY: no buffer: the fake device never touches it.
            let r =
                unsafe { q.submit_for(0, &io, test_tag(tag as u16), None, crate::sys::now_ns()) };
            assert!(r.is_none(), "nothing finishes at submit");
        }
        let at_device = submitted.load(Relaxed);
        assert!(
            at_device > 0 && (at_device as u64) < N,
            "{at_device} of {N} sent: some must be held"
        );
        fence.stop(); // ownership moved while the rest wait in the scheduler
        let (ok, fenced) = reap_all(
            &mut q,
            N as usize,
            trellis_nvme::status::path::ANA_INACCESSIBLE,
        );
        assert_eq!(
            submitted.load(Relaxed),
            at_device,
            "a held request reached the device after the fence"
        );
        assert_eq!((ok, fenced), (at_device, N as usize - at_device));
    }

    /// Issue 37 item 4: a write held in the scheduler when its host is
    /// preempted (Preempt and Abort) must not reach the device when the
    /// scheduler lets it go: it fails with Reservation Conflict.
    #[test]
    fn writes_held_in_the_scheduler_of_a_preempted_host_never_reach_the_device() {
        use crate::state::resv::{HostId, Resv};
        use trellis_nvme::resv::{AcquireAction, AcquireCmd, Cptpl, RType};
        use trellis_nvme::resv::{RegisterAction, RegisterCmd};
        let cfg = QosConfig::default();
        let tenants = Tenants::new(&[], &cfg.limits);
        let submitted = Arc::new(AtomicUsize::new(0));
        let resv = Arc::new(Resv::open(None, 4).unwrap());
        let (a, b) = (HostId::new([1; 16], "nqn.a"), HostId::new([2; 16], "nqn.b"));
        let reg = RegisterCmd {
            action: RegisterAction::Register,
            iekey: false,
            cptpl: Cptpl::NoChange,
        };
        let acq = |action| AcquireCmd {
            action,
            iekey: false,
            rtype: RType::WriteExclusive,
        };
        resv.apply(|s, max| s.register(&a, &reg, 0, 5, max))
            .unwrap();
        resv.apply(|s, _| s.acquire(&a, &acq(AcquireAction::Acquire), 5, 0))
            .unwrap();
        let node = NodeShare {
            fence: Arc::new(crate::state::fence::Fence::always()),
            resv: resv.clone(),
            reactor: 0,
        };
        let inner = Box::new(Counting {
            submitted: submitted.clone(),
            pending: Vec::new(),
        });
        let mut q = wrap(inner, one_reactor(&cfg, &tenants), node, 1.0);
        const N: u64 = 200;
        let who = Some(ResvAccess {
            host: a,
            write: true,
        });
        for tag in 0..N {
            let io = IoReq {
                op: Op::Write,
                offset_bytes: tag * 4096,
                len_bytes: 4096,
                buf: std::ptr::null_mut(),
                fua: false,
            };
            // SAFETY: no buffer: the fake device never touches it.
            let r =
                unsafe { q.submit_for(0, &io, test_tag(tag as u16), who, crate::sys::now_ns()) };
            assert!(r.is_none(), "nothing finishes at submit");
        }
        let at_device = submitted.load(Relaxed);
        assert!(
            at_device > 0 && (at_device as u64) < N,
            "{at_device} of {N} sent"
        );
        resv.apply(|s, max| s.register(&b, &reg, 0, 9, max))
            .unwrap();
        resv.apply(|s, _| s.acquire(&b, &acq(AcquireAction::PreemptAndAbort), 9, 5))
            .unwrap();
        let (ok, refused) = reap_all(&mut q, N as usize, crate::state::resv::CONFLICT);
        assert_eq!(
            submitted.load(Relaxed),
            at_device,
            "a preempted host's held write reached the device"
        );
        assert_eq!((ok, refused), (at_device, N as usize - at_device));
    }
}

#[cfg(test)]
mod calibrate_tests {
    use super::*;
    use crate::backend::Backend;
    use crate::config::qos::Calibrate;

    fn emulated() -> crate::backend::emulated::EmulatedBackend {
        let p = crate::backend::emulated::EmulatedParams {
            profile: trellis_ssd::SsdProfile::pm9a3(),
            precondition: trellis_ssd::Precondition::Empty,
            time_scale: 1.0,
            fault: None,
            age_acceleration: 1.0,
            path: None,
        };
        crate::backend::emulated::EmulatedBackend::new(64 << 20, p).unwrap()
    }

    #[test]
    fn an_emulated_drive_calibrates_gimbal_unless_told_not_to() {
        let b = emulated();
        let m = b.device_model().expect("the emulated SSD knows its model");
        assert_eq!(
            m,
            b.device_model().unwrap(),
            "measured once, the same after"
        );
        let mut cfg = QosConfig::default();
        let auto = cfg.sched_for(Some(&m)).gimbal;
        assert!(auto.io_cost_bytes > 0 && auto.slots_per_ssd > 8, "{auto:?}");
        assert_eq!(auto, cfg.gimbal.calibrated(&m));
        cfg.calibrate = Calibrate::Off;
        assert_eq!(cfg.sched_for(Some(&m)).gimbal, cfg.gimbal);
        // Backends that know nothing of their drive keep [qos.gimbal] as written.
        assert_eq!(QosConfig::default().sched_for(None).gimbal, cfg.gimbal);
    }

    /// Share of a lone tenant's zero-time 4 KiB reads, offered at 1.5 M a
    /// second in batches of 32 per instant, that Gimbal runs at once over the
    /// last 200 ms of `secs` s (virtual time), on a scheduler for `model`.
    fn served_share(model: Option<&trellis_qos::DeviceModel>, secs: u64) -> f64 {
        let cfg = QosConfig::default().sched_for(model);
        let mut s = sched::build(&cfg, 0).unwrap();
        let (step_ns, end_ns) = (32 * 1_000_000_000 / 1_500_000, secs * 1_000_000_000);
        let (mut offered, mut served, mut now) = (0u64, 0u64, 0u64);
        while now < end_ns {
            now += step_ns;
            for _ in 0..32 {
                let ok = s.run_now(0, IoDir::Read, 4096, now).is_some();
                if now > end_ns - 200_000_000 {
                    offered += 1;
                    served += ok as u64;
                }
            }
        }
        served as f64 / offered as f64
    }

    #[test]
    fn a_namespace_without_a_drive_lifts_only_gimbals_rate_ceiling() {
        let null = crate::backend::null::NullBackend::new(1 << 30);
        let ram = crate::backend::ram::RamBackend::new(1 << 20).unwrap();
        for m in [null.device_model(), ram.device_model()] {
            let m = m.expect("null and RAM report a drive-less model");
            let cfg = QosConfig::default();
            let g = cfg.sched_for(Some(&m)).gimbal;
            assert_eq!(
                g.rate_max_bytes_per_s,
                crate::backend::NO_DRIVE_LINK_BYTES_PER_S
            );
            assert_eq!(
                (g.io_cost_bytes, g.slots_per_ssd, g.rate_init_bytes_per_s),
                (
                    cfg.gimbal.io_cost_bytes,
                    cfg.gimbal.slots_per_ssd,
                    cfg.gimbal.rate_init_bytes_per_s
                ),
                "only the ceiling moves"
            );
        }
        // What the ceiling did: 1.5 M reads/s of 4 KiB (6.1 GB/s) against
        // Gimbal's 4 GiB/s, which passes 1.05 M of them (0.70).
        let m = null.device_model();
        let (capped, lifted) = (served_share(None, 1), served_share(m.as_ref(), 1));
        assert!(capped < 0.75, "Gimbal's own ceiling served {capped:.3}");
        assert!(
            lifted > 0.99,
            "without a drive's ceiling it served {lifted:.3}"
        );
    }

    #[test]
    fn calibrate_is_read_from_the_qos_table() {
        let c: QosConfig =
            toml::from_str("calibrate = \"off\"\n[gimbal]\nio_cost_bytes = 4096\n").unwrap();
        assert_eq!(
            (c.calibrate, c.gimbal.io_cost_bytes),
            (Calibrate::Off, 4096)
        );
        assert_eq!(
            c.gimbal.slots_per_ssd, 8,
            "unset fields keep Gimbal's values"
        );
        assert!(toml::from_str::<QosConfig>("calibrate = \"maybe\"").is_err());
    }
}

#[cfg(test)]
mod shared_tests {
    use super::*;
    use crate::backend::tag::test_tag;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    /// A device that finishes every request `device_ns` after its submit
    /// (its due time), counting what reaches it.
    struct Timed {
        device_ns: u64,
        submitted: Arc<AtomicUsize>,
        pending: Vec<(Tag, u64)>,
    }

    impl BackendQueue for Timed {
        unsafe fn submit(&mut self, _req: &IoReq, tag: Tag) -> Option<Status> {
            self.submitted.fetch_add(1, Relaxed);
            self.pending
                .push((tag, crate::sys::now_ns() + self.device_ns));
            None
        }
        fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
            let n = self.pending.len();
            out.extend(
                self.pending
                    .drain(..)
                    .map(|(t, _)| Completion::new(t, Status::SUCCESS)),
            );
            n
        }
        fn reap_timed(&mut self, out: &mut Vec<Completion>, due_ns: &mut Vec<u64>) -> usize {
            due_ns.extend(self.pending.iter().map(|&(_, d)| d));
            self.reap(out)
        }
        fn in_flight(&self) -> usize {
            self.pending.len()
        }
    }

    /// Two reactors' queues over one namespace's scheduler, each with its
    /// own device (100 µs per request) and submit counter.
    fn two_reactors() -> (Box<QosQueue>, Box<QosQueue>, [Arc<AtomicUsize>; 2]) {
        let cfg = QosConfig::default();
        let tenants = Tenants::new(&[], &cfg.limits);
        let now = crate::sys::now_ns();
        let shared = Arc::new(build_shared(&cfg, &tenants, now, 1.0, None, 2).unwrap());
        let counts = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
        let q = |r: usize| {
            let inner = Box::new(Timed {
                device_ns: 100_000,
                submitted: counts[r].clone(),
                pending: Vec::new(),
            });
            let node = NodeShare {
                fence: Arc::new(crate::state::fence::Fence::always()),
                resv: Arc::new(crate::state::resv::Resv::open(None, 4).unwrap()),
                reactor: r,
            };
            wrap(inner, shared.clone(), node, 1.0)
        };
        let (q0, q1) = (q(0), q(1));
        (q0, q1, counts)
    }

    fn read(op: Op, at: u64, len_bytes: u64) -> IoReq {
        IoReq {
            op,
            offset_bytes: at,
            len_bytes,
            buf: std::ptr::null_mut(),
            fua: false,
        }
    }

    /// Issue 36 item 4: one congestion state per drive. A read completed on
    /// each reactor's device moves one latency EWMA twice (α = 1/2 from 0 of
    /// 100 µs: 50, then 75 µs); schedulers per reactor would each show 50.
    #[test]
    fn two_reactors_completions_update_one_congestion_state() {
        let (mut q0, mut q1, _) = two_reactors();
        let io = read(Op::Read, 0, 4096);
        // SAFETY: no buffer: the fake device never touches it.
        let r0 = unsafe { q0.submit_for(0, &io, test_tag(1), None, crate::sys::now_ns()) };
        assert!(r0.is_none(), "an asynchronous device completes later");
        assert_eq!(
            q1.with_scheduler(|s| s.inflight()),
            1,
            "reactor 1 sees reactor 0's read in flight on the drive"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mut out = Vec::new();
        assert_eq!(q0.reap(&mut out), 1);
        // SAFETY: as above.
        let r1 = unsafe { q1.submit_for(0, &io, test_tag(2), None, crate::sys::now_ns()) };
        assert!(r1.is_none());
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(q1.reap(&mut out), 1);
        assert!(out.iter().all(|c| c.credits.is_some()));
        let ewma = |q: &QosQueue| q.with_scheduler(|s| s.view(0).unwrap().read.latency_ewma_us);
        let (e0, e1) = (ewma(&q0), ewma(&q1));
        assert_eq!(e0, e1, "both reactors read one state");
        assert!(
            (65..=90).contains(&e0),
            "read EWMA {e0} µs after two samples"
        );
        assert_eq!(q0.with_scheduler(|s| s.inflight()), 0);
    }

    /// A request one reactor's submit left held is let go by the other
    /// reactor's completion, yet reaches only its own reactor's device
    /// (its buffer and connection live there), and completes there.
    #[test]
    fn a_held_request_runs_on_its_own_reactors_device_whoever_releases_it() {
        let (mut q0, mut q1, counts) = two_reactors();
        // 128 KiB reads: Gimbal's 256 KiB read bucket passes two at once.
        let big = |i: u64| read(Op::Read, i << 17, 128 << 10);
        // SAFETY: no buffer: the fake device never touches it.
        let r = unsafe { q1.submit_for(0, &big(0), test_tag(900), None, crate::sys::now_ns()) };
        assert!(r.is_none());
        const N: u64 = 32;
        for i in 1..=N {
            // SAFETY: as above.
            let r = unsafe {
                q0.submit_for(0, &big(i), test_tag(i as u16), None, crate::sys::now_ns())
            };
            assert!(r.is_none(), "nothing finishes at submit");
        }
        let sent0 = counts[0].load(Relaxed);
        assert!((sent0 as u64) < N, "{sent0} of {N} sent: some must be held");
        assert!(
            q0.in_flight() >= N as usize,
            "held requests keep reactor 0 polling"
        );
        // Reactor 1 completes its read, and keeps reaping through refills.
        let (mut out1, mut out0) = (Vec::new(), Vec::new());
        for _ in 0..200 {
            std::thread::sleep(std::time::Duration::from_micros(500));
            q1.reap(&mut out1);
        }
        assert_eq!(out1.len(), 1, "reactor 1 answers only its own read");
        assert_eq!(out1[0].tag, test_tag(900));
        assert_eq!(
            counts[1].load(Relaxed),
            1,
            "nothing of reactor 0 ran on reactor 1's device"
        );
        for _ in 0..2_000 {
            q0.reap(&mut out0);
            if out0.len() as u64 == N {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
        assert_eq!(
            out0.len() as u64,
            N,
            "every held read completed on reactor 0"
        );
        assert!(out0.iter().all(|c| c.status == Status::SUCCESS));
        assert_eq!(counts[0].load(Relaxed) as u64, N);
        assert_eq!(q0.in_flight(), 0);
    }
}
