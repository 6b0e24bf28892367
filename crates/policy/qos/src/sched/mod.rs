//! The per-namespace scheduler core, shared by the storage node and the simulator.
//!
//! Sans-IO in the manner of quinn: the caller owns the clock, the device and the
//! network; the core owns the queues and the policy. Per I/O:
//!
//! ```text
//! submit(tenant, dir, len, now) -> Dispatch(tag) | Queued(tag) | Busy
//! poll_dispatch(now)            -> Some(Dispatch { tag, .. })   (repeat until None)
//! complete(tag, device_ns, now) -> Completed { tenant, io_credits }
//! next_timeout()                -> when to call poll_dispatch again if nothing else happens
//! ```
//!
//! Call `poll_dispatch` after every `submit`, `complete` and timeout until it returns
//! None. A [`Tag`] names a request from `submit` until its completion; `tag.index()`
//! is below [`SchedLimits::max_requests`], so the caller can keep its own per-request
//! state in a flat array.
//!
//! Bounded everywhere (no allocation per I/O; see [`SchedLimits`]): tenants are small
//! integer ids below `max_tenants`, each tenant's queue holds at most
//! `max_queued_per_tenant` requests, and all requests together at most `max_requests`.
//! A full bound answers [`Submitted::Busy`]: nothing is dropped silently.
//!
//! Callers drive the core through [`Driver`], which keeps the per-request rows
//! (payload, submit and device times) and turns completions into device latency
//! and credits, so the daemon and the simulators share that glue too.
//!
//! The policy sits behind the [`Scheduler`] trait (the shape of quinn's
//! `congestion::Controller`), with two implementations: [`FifoScheduler`] (no QoS)
//! and [`GimbalScheduler`] (docs/gimbal.md).

mod driver;
mod fifo;
mod gimbal;
mod table;

pub use driver::{Done, Driver, Released, Request, Submit};
pub use fifo::FifoScheduler;
pub use gimbal::GimbalScheduler;

use crate::{CcState, CongestionControl, GimbalConfig, WriteCost};
use serde::{Deserialize, Serialize};
use trellis_units::{IoDir, Nanos};

/// A tenant: a small integer below [`SchedLimits::max_tenants`]. The caller maps its
/// identities (host NQN, simulated host) onto these.
pub type TenantId = u16;

/// Default of [`SchedLimits::max_tenants`] [R]: the tenant table size Trellis has used
/// since its first Gimbal port; Gimbal itself has one tenant per NVMe-oF qpair (§1).
pub const DEFAULT_MAX_TENANTS: u16 = 64;
/// Default of [`SchedLimits::max_queued_per_tenant`] [R]: 8 I/O queues of the Linux
/// host's default 128 entries (Linux's Connect asks for sqsize = min(queue_size − 1,
/// CAP.MQES, MAXCMD − 1), queue_size 128 by default: [Linux nvme], docs/sources.md),
/// so a stock host's tenant never sees Busy.
pub const DEFAULT_MAX_QUEUED_PER_TENANT: u32 = 1024;
/// Default of [`SchedLimits::max_requests`] [R]: queued plus in flight per namespace.
pub const DEFAULT_MAX_REQUESTS: u32 = 4096;
/// Default device queue depth of the FIFO policy [R]: the simulator's FIFO depth
/// before the core was shared (enough for the PM9A3-like model to saturate, docs/ssd-model.md §4.1).
pub const DEFAULT_DEVICE_QD: u32 = 256;
/// Largest tenant weight [R]: keeps `weight × quantum` far from i64 overflow and any
/// one tenant's share of virtual slots meaningful.
pub const MAX_TENANT_WEIGHT: u32 = 1024;

/// Bounds of one scheduler instance. Every per-I/O structure is sized from these.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedLimits {
    /// Tenant ids are `0..max_tenants`.
    pub max_tenants: TenantId,
    /// Requests one tenant may have queued (not yet dispatched) before Busy.
    pub max_queued_per_tenant: u32,
    /// Requests queued or in flight over all tenants before Busy.
    pub max_requests: u32,
    /// Request rows allocated at construction. The default (`max_requests`) means no
    /// allocation ever after construction; a smaller value lets a simulator with
    /// thousands of SSDs grow each table to its peak instead (amortised doubling).
    pub prealloc_requests: u32,
}

impl Default for SchedLimits {
    fn default() -> Self {
        SchedLimits {
            max_tenants: DEFAULT_MAX_TENANTS,
            max_queued_per_tenant: DEFAULT_MAX_QUEUED_PER_TENANT,
            max_requests: DEFAULT_MAX_REQUESTS,
            prealloc_requests: DEFAULT_MAX_REQUESTS,
        }
    }
}

impl SchedLimits {
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.max_tenants == 0 {
            return Err("max_tenants must be positive");
        }
        if self.max_queued_per_tenant == 0 {
            return Err("max_queued_per_tenant must be positive");
        }
        if self.max_requests == 0 || self.max_requests == u32::MAX {
            return Err("max_requests must be in 1..u32::MAX");
        }
        Ok(())
    }
}

/// Which scheduler runs a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Arrival order with a device queue-depth limit: no QoS (`qos = "off"`).
    #[serde(alias = "off")]
    Fifo,
    /// Gimbal: DRR with virtual slots, delay-based congestion control, write cost,
    /// dual token bucket, I/O credits (docs/gimbal.md).
    Gimbal,
}

/// Everything needed to build a scheduler for one namespace.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedConfig {
    pub policy: Policy,
    pub limits: SchedLimits,
    /// FIFO policy: commands outstanding at the device at most.
    pub device_qd: u32,
    /// Gimbal's parameters (the FIFO policy uses its congestion-control constants to
    /// measure headroom and the view).
    pub gimbal: GimbalConfig,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            policy: Policy::Fifo,
            limits: SchedLimits::default(),
            device_qd: DEFAULT_DEVICE_QD,
            gimbal: GimbalConfig::default(),
        }
    }
}

/// Build the scheduler `cfg.policy` names, starting at `now_ns`.
pub fn build(cfg: &SchedConfig, now_ns: Nanos) -> Result<Box<dyn Scheduler>, &'static str> {
    Ok(match cfg.policy {
        Policy::Fifo => Box::new(FifoScheduler::new(cfg, now_ns)?),
        Policy::Gimbal => Box::new(GimbalScheduler::new(cfg, now_ns)?),
    })
}

/// Names one request from `submit` to its completion. Stale after that.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tag {
    index: u32,
    generation: u32,
}

impl Tag {
    /// Dense index below [`SchedLimits::max_requests`], for the caller's own tables.
    /// Two live requests never share an index.
    pub fn index(self) -> usize {
        self.index as usize
    }

    fn to_u64(self) -> u64 {
        (self.generation as u64) << 32 | self.index as u64
    }

    fn from_u64(v: u64) -> Self {
        Tag {
            index: v as u32,
            generation: (v >> 32) as u32,
        }
    }
}

/// The answer to `submit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submitted {
    /// Send it to the device now (nothing was queued ahead of it).
    Dispatch(Tag),
    /// Held; a later `poll_dispatch` returns it.
    Queued(Tag),
    /// A bound is full (the tenant's queue or the request table): not accepted.
    Busy,
}

/// A command the caller may now send to the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatch {
    pub tag: Tag,
    pub tenant: TenantId,
    pub dir: IoDir,
    pub len_bytes: u32,
}

/// The result of a completion, for the response to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completed {
    pub tenant: TenantId,
    /// The tenant's I/O credits after this completion, in I/Os (§1.e).
    pub io_credits: u32,
}

/// Caller errors (as opposed to Busy, which is flow control).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedError {
    /// Tenant id not below `max_tenants`.
    BadTenant,
    /// Weight outside `1..=MAX_TENANT_WEIGHT`.
    BadWeight,
    /// The tag is stale, never issued, or not in the state the call needs.
    BadTag,
}

/// Latency state of one direction of the device (§1.a).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirView {
    /// State set by the last completion; None before the first one.
    pub state: Option<CcState>,
    /// EWMA of the device latency, µs (Gimbal's tick).
    pub latency_ewma_us: u64,
    /// Dynamic latency threshold Thresh_cur, µs: the latency target.
    pub latency_target_us: u64,
}

/// One tenant's virtual view of the namespace (§1.f), for a log page and credits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantView {
    pub tenant: TenantId,
    pub weight: u32,
    /// I/O credits, in I/Os (§1.e).
    pub io_credits: u32,
    pub queued: u32,
    pub inflight: u32,
    pub read: DirView,
    pub write: DirView,
    /// Estimated write cost in FP10, 1024 = 1.0 (§1.b).
    pub write_cost_fp10: u64,
    /// Congestion control's target rate for the device, B/s (§1.a).
    pub target_rate_bytes_per_s: u64,
    /// max(0, target_rate − cpl_rate), B/s: the source of the NSDI'26 SSD credit (§3.3).
    pub headroom_bytes_per_s: u64,
}

/// A scheduler for one namespace. Object safe: the storage node and the simulator
/// hold a `Box<dyn Scheduler>` chosen by [`Policy`], built once by [`build`].
pub trait Scheduler: Send {
    fn policy(&self) -> Policy;

    /// Offer a request. `len_bytes` is its data length (0 for Flush and the like).
    fn submit(
        &mut self,
        tenant: TenantId,
        dir: IoDir,
        len_bytes: u32,
        now_ns: Nanos,
    ) -> Result<Submitted, SchedError>;

    /// The next request to send to the device now, if any.
    fn poll_dispatch(&mut self, now_ns: Nanos) -> Option<Dispatch>;

    /// A request the device will finish inside its submission, at zero device
    /// time (a RAM or null backend): `submit` that dispatches it at once
    /// followed by `complete(tag, 0, now_ns)`, in one pass and with the same
    /// decisions. None, with nothing changed, when it would not dispatch at
    /// once (something waits, a bound is full, the bucket is short) or the
    /// policy has no such pass: then use `submit`. The caller must then not
    /// have sent it to the device: a request run here is already complete.
    ///
    /// A policy may defer the bookkeeping of a streak of equal calls at one
    /// instant (Gimbal's lane, docs/gimbal.md): every `&mut` call applies it
    /// first, and [`Scheduler::settle`] does so alone. Until then the
    /// read-only accessors may show the state before the streak, except
    /// `io_credits`, `queued` and `inflight`, which are always current.
    fn run_now(
        &mut self,
        _tenant: TenantId,
        _dir: IoDir,
        _len_bytes: u32,
        _now_ns: Nanos,
    ) -> Option<Completed> {
        None
    }

    /// Applies whatever `run_now` deferred, so that `view`,
    /// `headroom_bytes_per_s` and the like show every call made so far.
    fn settle(&mut self) {}

    /// A dispatched request completed successfully. `device_latency_ns` is from device
    /// submission to device completion (the congestion signal, §1.a).
    fn complete(
        &mut self,
        tag: Tag,
        device_latency_ns: Nanos,
        now_ns: Nanos,
    ) -> Result<Completed, SchedError>;

    /// A dispatched request failed at the device: release it without a latency
    /// sample ("I/Os that fail do not update the state", §1.a).
    fn abort(&mut self, tag: Tag, now_ns: Nanos) -> Result<Completed, SchedError>;

    /// When `poll_dispatch` may next return something if no submit or completion
    /// happens first (a token refill); None when only those events can help.
    fn next_timeout(&self) -> Option<Nanos>;

    /// Set a tenant's weight (default 1) in `1..=MAX_TENANT_WEIGHT`.
    fn set_weight(&mut self, tenant: TenantId, weight: u32) -> Result<(), SchedError>;

    /// A tenant's I/O credits, in I/Os; None for an id outside the table.
    fn io_credits(&self, tenant: TenantId) -> Option<u32>;

    /// A tenant's virtual view; None for an id outside the table.
    fn view(&self, tenant: TenantId) -> Option<TenantView>;

    /// Bandwidth headroom of the device, B/s (the NSDI'26 SSD credit, §3.3).
    fn headroom_bytes_per_s(&self) -> u64;

    /// Requests accepted and not yet dispatched.
    fn queued(&self) -> u32;

    /// Requests dispatched and not yet completed.
    fn inflight(&self) -> u32;
}

/// Per-tenant figures of a view; the device half comes from the congestion control.
struct TenantFigures {
    tenant: TenantId,
    weight: u32,
    io_credits: u32,
    queued: u32,
    inflight: u32,
}

fn make_view(t: TenantFigures, cc: &CongestionControl, wc: &WriteCost) -> TenantView {
    let dir = |d: IoDir| DirView {
        state: cc.last_state(d),
        latency_ewma_us: cc.dir_cc(d).ewma_us,
        latency_target_us: cc.dir_cc(d).thresh_us,
    };
    TenantView {
        tenant: t.tenant,
        weight: t.weight,
        io_credits: t.io_credits,
        queued: t.queued,
        inflight: t.inflight,
        read: dir(IoDir::Read),
        write: dir(IoDir::Write),
        write_cost_fp10: wc.fp10(),
        target_rate_bytes_per_s: cc.target_rate(),
        headroom_bytes_per_s: headroom(cc),
    }
}

/// max(0, target_rate − cpl_rate), B/s [R §3.3].
fn headroom(cc: &CongestionControl) -> u64 {
    cc.target_rate().saturating_sub(cc.cpl_rate())
}

fn check_weight(weight: u32) -> Result<(), SchedError> {
    if weight == 0 || weight > MAX_TENANT_WEIGHT {
        return Err(SchedError::BadWeight);
    }
    Ok(())
}

fn check_config(cfg: &SchedConfig) -> Result<(), &'static str> {
    cfg.limits.validate()?;
    cfg.gimbal.validate()?;
    if cfg.device_qd == 0 {
        return Err("device_qd must be positive");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
