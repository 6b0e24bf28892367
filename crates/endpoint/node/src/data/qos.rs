//! Gimbal in the I/O path (docs/gimbal.md "In the daemon").
//!
//! A namespace with `qos = "gimbal"` gets, on each reactor, a [`QosQueue`]:
//! its backend queue wrapped with one `trellis_qos::sched::Driver` (the
//! scheduler and its request rows, the glue the simulators run too). The
//! wrapper is itself a [`BackendQueue`], so the reactor's loop (`kick`,
//! `reap`, `in_flight`) drives it unchanged: `reap` completes finished
//! requests into the driver and sends to the backend what it then releases,
//! so the release step runs every loop. What stays here is the daemon's own:
//! the backend, the wall-to-device clock, the HA fence at release, credits
//! on the completions it returns ([`Completion::credits`]), and the
//! /metrics board. A namespace with `qos = "off"` never sees this module:
//! its queue is the bare backend queue.
//!
//! Tenants are host NQNs mapped to a dense [`TenantId`] at Connect
//! ([`Tenants`]); the I/O path carries the id, never the string.

use crate::backend::{BackendQueue, Completion, IoReq, Op, Tag};
use crate::config::qos::{QosConfig, QosMode};
use crate::state::tenants::{QosBoard, QosPublished, Tenants, PUBLISH_INTERVAL_NS};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use trellis_nvme::Status;
use trellis_qos::sched::{self, Driver, Released, Request, Scheduler, Submit, TenantId};
use trellis_units::IoDir;

/// Status of a command the scheduler refused because a bound is full
/// (`Submitted::Busy`): Namespace Not Ready (generic 82h) with DNR clear.
/// Hosts retry it (Linux after its requeue delay; SPDK likewise), and it
/// needs nothing negotiated: Command Interrupted (21h) says "retry" more
/// exactly but may only be returned to hosts that enabled ACRE in Host
/// Behavior Support, which stock Linux does not. Not Internal Error (06h):
/// nothing failed, and an operator should not read a full queue as a fault.
pub const QOS_BUSY: Status = trellis_nvme::status::generic::NS_NOT_READY;

/// What the driver keeps of a scheduled request: what to submit to the
/// backend, and whom to answer (the connection's tag). The backend is sent
/// [`Tag::scheduled`] of the request's driver slot instead, so `reap` knows
/// its completions from those of requests that bypassed the scheduler (DSM
/// Discard), which keep the connection's tag.
#[derive(Clone, Copy, Debug)]
struct ConnIo {
    io: IoReq,
    tag: Tag,
    /// Who sent it, for the reservation check at release.
    resv: Option<ResvAccess>,
}

/// A scheduled command's reservation access (§8.19): its host and whether
/// it is of the write group; None for a command reservations do not gate.
#[derive(Clone, Copy, Debug)]
pub struct ResvAccess {
    pub host: crate::state::resv::HostId,
    pub write: bool,
}

/// One reactor's queue for one Gimbal namespace.
pub struct QosQueue {
    inner: Box<dyn BackendQueue>,
    /// The scheduler and the rows of the requests it holds or the backend
    /// runs (slot: of the request's [`Tag::scheduled`]).
    drv: Driver<ConnIo>,
    /// Completions reaped from `inner` (reused: no allocation per I/O).
    reaped: Vec<Completion>,
    /// When each of those fell due on the device (`reap_timed`), wall ns.
    due_ns: Vec<u64>,
    /// The device's clock: wall ÷ `Backend::time_scale` (1 except on a
    /// time-scaled emulated SSD). The scheduler sees times and latencies on
    /// it, so Gimbal's thresholds (µs) and rates (B/s) apply to the drive
    /// the model emulates, exactly as they would on that drive in real time.
    clock: DeviceClock,
    published: Arc<QosPublished>,
    /// Completed (commands, bytes) per tenant, kept here and copied out
    /// when publishing, so the I/O path writes no shared cache line.
    completed: Vec<(u64, u64)>,
    next_publish_ns: u64,
    /// Something changed since the last publish.
    dirty: bool,
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

/// What a namespace's scheduler shares with the rest of the node.
pub struct NodeShare<'a> {
    pub tenants: &'a Tenants,
    /// Where `/metrics` reads this scheduler's state (None: nowhere).
    pub board: Option<&'a QosBoard>,
    /// Checked when a held request is released.
    pub fence: Arc<crate::state::fence::Fence>,
    /// The namespace's reservations, checked when a held request is released.
    pub resv: Arc<crate::state::resv::Resv>,
}

/// Wraps `inner` with a Gimbal scheduler configured by `cfg`.
pub fn wrap(
    inner: Box<dyn BackendQueue>,
    cfg: &QosConfig,
    node: NodeShare<'_>,
    now_ns: u64,
    time_scale: f64,
    model: Option<&trellis_qos::DeviceModel>,
) -> anyhow::Result<Box<QosQueue>> {
    let NodeShare {
        tenants,
        board,
        fence,
        resv,
    } = node;
    let clock = DeviceClock::new(time_scale);
    let sched_cfg = cfg.sched_for(model);
    let mut drv =
        Driver::build(&sched_cfg, clock.ns(now_ns)).map_err(|e| anyhow::anyhow!("{e}"))?;
    for (t, w) in tenants.weights() {
        drv.set_weight(t, w)
            .map_err(|e| anyhow::anyhow!("tenant {t} weight {w}: {e:?}"))?;
    }
    let n = sched_cfg.limits.max_requests as usize;
    let max_tenants = cfg.limits.max_tenants as usize;
    let published = Arc::new(QosPublished::new(max_tenants));
    if let Some(b) = board {
        crate::sys::lock(b).push(published.clone());
    }
    Ok(Box::new(QosQueue {
        inner_sync: inner.completes_in_submit(),
        inner,
        drv,
        reaped: Vec::with_capacity(n),
        due_ns: Vec::with_capacity(n),
        clock,
        published,
        completed: vec![(0, 0); max_tenants],
        next_publish_ns: 0,
        dirty: false,
        submit_seen_ns: 0,
        fence,
        resv,
    }))
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
        let dev_ns = self.clock.ns(now_ns);
        if self.inner_sync {
            if let Some(c) = self.drv.run_now(tenant, dir, len, dev_ns) {
                // SAFETY: as `dispatch_now`; the backend finishes it inside
                // this call (`completes_in_submit`).
                let st = unsafe { self.inner.submit(io, tag) };
                let credits = self.count(c.tenant, io.len_bytes, c.io_credits);
                // Not finished after all: its completion comes from `reap`
                // under the connection's own tag, as a bypassed request's.
                return st.map(|st| (st, credits));
            }
        }
        let req = Request {
            tenant,
            dir,
            len_bytes: len,
            payload: ConnIo { io: *io, tag, resv },
        };
        match self.drv.submit(req, dev_ns) {
            Ok(Submit::Run(slot)) => self.dispatch_now(slot, io, dev_ns),
            Ok(Submit::Held) => None, // a later release (in `reap`) sends it
            Ok(Submit::Busy) => Some((QOS_BUSY, self.credits(tenant))),
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
        let c = self
            .drv
            .run_now(tenant, IoDir::Read, len, self.clock.ns(now_ns))?;
        self.submit_seen_ns = now_ns;
        Some(self.count(c.tenant, len_bytes, c.io_credits))
    }

    fn credits(&self, tenant: TenantId) -> u32 {
        self.drv.scheduler().io_credits(tenant).unwrap_or(0)
    }

    /// Sends `io`, which the driver let run at once in `slot`, to the backend
    /// at `dev_ns` (device clock).
    fn dispatch_now(&mut self, slot: usize, io: &IoReq, dev_ns: u64) -> Option<(Status, u32)> {
        // SAFETY: the buffer is the request's own (or none), valid until it
        // completes: the caller of `submit_for` promised so.
        let st = unsafe { self.inner.submit(io, scheduled_tag(slot)) }?;
        Some((st, self.finish(slot, dev_ns, dev_ns).map_or(0, |(_, c)| c)))
    }

    /// Sends the request the driver released to the backend at `dev_ns`;
    /// returns (status, its connection tag, credits) when it is over now:
    /// the backend finished it synchronously, or the fence failed it.
    fn dispatch(&mut self, r: Released<ConnIo>, dev_ns: u64) -> Option<(Status, Tag, u32)> {
        let ConnIo { io, tag, resv } = r.req.payload;
        if !self.fence.allows_now() {
            // Held past the fence (docs/target.md, "HA pair"): never sent,
            // failed with a path error so the host retries elsewhere.
            let credits = self.finish(r.slot, dev_ns, dev_ns).map_or(0, |(_, c)| c);
            return Some((trellis_nvme::status::path::ANA_INACCESSIBLE, tag, credits));
        }
        if let Some(st) = resv.and_then(|a| self.resv_denies(a)) {
            // Its host lost access while it waited (Preempt and Abort).
            let credits = self.finish(r.slot, dev_ns, dev_ns).map_or(0, |(_, c)| c);
            return Some((st, tag, credits));
        }
        // SAFETY: the buffer is the request's own (or none), valid until it
        // completes: the caller of `submit_for` promised so.
        let st = unsafe { self.inner.submit(&io, scheduled_tag(r.slot)) }?;
        let credits = self.finish(r.slot, dev_ns, dev_ns).map_or(0, |(_, c)| c);
        Some((st, tag, credits))
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

    /// Completes `slot` into the driver: the device finished it at `done_ns`
    /// (device clock; its submit time for a backend that finishes inside
    /// `submit`, which is then charged zero device time: its only time is the
    /// reactor's CPU time, and reading the clock would also count any
    /// preemption of the reactor mid-batch as a device stall, which Gimbal
    /// would take for congestion). Its connection tag and credits.
    fn finish(&mut self, slot: usize, done_ns: u64, now_ns: u64) -> Option<(Tag, u32)> {
        match self.drv.complete(slot, done_ns, now_ns) {
            Ok(d) => {
                let credits = self.count(d.req.tenant, d.req.payload.io.len_bytes, d.io_credits);
                Some((d.req.payload.tag, credits))
            }
            Err(e) => {
                tracing::error!(slot, "qos complete of a stale slot: {e:?}");
                None
            }
        }
    }

    /// The scheduler, for the virtual-view log page: settled first, so its
    /// view counts every request run so far (`Scheduler::settle`).
    pub fn scheduler(&mut self) -> &dyn Scheduler {
        self.drv.settled()
    }

    /// Applies `weights` (the reactor, after a live change).
    pub fn set_weights(&mut self, weights: &[(TenantId, u32)]) {
        for &(t, w) in weights {
            if let Err(e) = self.drv.set_weight(t, w) {
                tracing::warn!("tenant {t} weight {w} not applied: {e:?}");
            }
        }
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

    /// Copies the scheduler's state out for `/metrics` (cold: at most every
    /// [`PUBLISH_INTERVAL_NS`]).
    #[cold]
    fn publish(&mut self) {
        self.dirty = false;
        let s = self.drv.settled();
        let p = &self.published;
        p.headroom_bytes_per_s
            .store(s.headroom_bytes_per_s(), Relaxed);
        for (t, tp) in p.tenants.iter().enumerate() {
            let (cmds, bytes) = self.completed[t];
            tp.completed_commands.store(cmds, Relaxed);
            tp.completed_bytes.store(bytes, Relaxed);
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
        if mine.is_empty() && self.drv.scheduler().queued() == 0 {
            // Nothing finished and nothing waits: no clock read, no poll.
            (self.reaped, self.due_ns) = (mine, due);
            // Publish what changed since, at most once per interval: a
            // synchronous backend (null, ram) completes inside submit, so
            // this path runs every loop while it is busy, and then the
            // submit's clock serves; an idle queue reads the clock.
            let seen = std::mem::take(&mut self.submit_seen_ns);
            if self.dirty {
                let now = if seen != 0 {
                    seen
                } else {
                    crate::sys::now_ns()
                };
                if now >= self.next_publish_ns {
                    self.next_publish_ns = now + PUBLISH_INTERVAL_NS;
                    self.publish();
                }
            }
            return out.len() - before;
        }
        let now = crate::sys::now_ns();
        if now >= self.next_publish_ns {
            self.next_publish_ns = now + PUBLISH_INTERVAL_NS;
            self.publish();
        }
        let dev_now = self.clock.ns(now);
        for (k, &c) in mine.iter().enumerate() {
            let Some(slot) = c.tag.as_scheduled() else {
                out.push(c); // bypassed the scheduler: the connection's own
                continue;
            };
            // The device's completion time where the backend knows it
            // (emulated SSD), else now.
            let done_ns = due.get(k).copied().unwrap_or(now).min(now);
            let done_ns = self.clock.ns(done_ns);
            if let Some((conn_tag, credits)) = self.finish(slot as usize, done_ns, dev_now) {
                out.push(Completion::with_credits(conn_tag, c.status, credits));
            }
        }
        mine.clear();
        due.clear();
        (self.reaped, self.due_ns) = (mine, due);
        // The release step: completions and token refills let held requests go.
        while let Some(r) = self.drv.release(dev_now) {
            if let Some((st, tg, credits)) = self.dispatch(r, dev_now) {
                out.push(Completion::with_credits(tg, st, credits));
            }
        }
        self.inner.kick();
        out.len() - before
    }

    /// Requests the scheduler holds count as in flight: the reactor then
    /// keeps polling (never sleeps) until they are released, which is how
    /// it honours `Driver::next_timeout` without asking it: token refills
    /// come every 250 µs, finer than epoll's millisecond timeout, so a
    /// reactor sleeping until the refill would oversleep it.
    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.drv.scheduler().queued() as usize + self.reaped.len()
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

/// Congestion state as one byte: 0 no sample yet, then the four states of
/// docs/gimbal.md §1.a from calm to overloaded.
fn state_byte(s: Option<trellis_qos::CcState>) -> u8 {
    use trellis_qos::CcState::*;
    match s {
        None => 0,
        Some(UnderUtilised) => 1,
        Some(Avoidance) => 2,
        Some(Congested) => 3,
        Some(Overloaded) => 4,
    }
}

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
/// entry per (Gimbal namespace, tenant in use), from this reactor's
/// schedulers. NSID 0 or FFFFFFFFh: every namespace; else the one named.
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
        for v in tenants.iter().filter_map(|&t| qq.scheduler().view(t)) {
            let at = page.len();
            page.resize(at + VIEW_ENTRY_BYTES, 0);
            encode_view(ns.nsid(), &v, &mut page[at..]);
            n = n.saturating_add(1);
        }
    }
    page[0] = VIEW_VERSION;
    page[2..4].copy_from_slice(&n.to_le_bytes());
    page[4..6].copy_from_slice(&me.to_le_bytes());
    page[6..8].copy_from_slice(&(VIEW_ENTRY_BYTES as u16).to_le_bytes());
    Ok(())
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
            tenants: &tenants,
            board: None,
            fence: Arc::new(crate::state::fence::Fence::always()),
            resv: Arc::new(crate::state::resv::Resv::open(None, 4).unwrap()),
        };
        let mut q = wrap(inner, &cfg, node, crate::sys::now_ns(), 1.0, None).unwrap();
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
        let v = q.scheduler().view(0).unwrap();
        let ewma = v.read.latency_ewma_us;
        assert!((40..1_000).contains(&ewma), "read EWMA {ewma} µs");
    }
}

#[cfg(test)]
mod fence_tests {
    use super::*;
    use crate::backend::tag::test_tag;
    use std::sync::atomic::AtomicUsize;

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
            tenants: &tenants,
            board: None,
            fence: fence.clone(),
            resv: Arc::new(crate::state::resv::Resv::open(None, 4).unwrap()),
        };
        let inner = Box::new(Counting {
            submitted: submitted.clone(),
            pending: Vec::new(),
        });
        let mut q = wrap(inner, &cfg, node, crate::sys::now_ns(), 1.0, None).unwrap();
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
            tenants: &tenants,
            board: None,
            fence: Arc::new(crate::state::fence::Fence::always()),
            resv: resv.clone(),
        };
        let inner = Box::new(Counting {
            submitted: submitted.clone(),
            pending: Vec::new(),
        });
        let mut q = wrap(inner, &cfg, node, crate::sys::now_ns(), 1.0, None).unwrap();
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
