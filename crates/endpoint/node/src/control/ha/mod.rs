//! Failover without resync: two nodes export the same backing device under
//! the same subsystem and namespace identity, and only the holder of an
//! ownership lease in a cluster store reports ANA optimized; the other
//! reports inaccessible (docs/target.md, "HA pair").
//!
//! - [`LeaseStore`]: the store, one lease on one key. [`file::FileStore`]
//!   (an `flock`ed file: one machine, no daemon; the default) and
//!   [`etcd::EtcdStore`] (an etcd lease, a compare-and-swap on the key, a
//!   watch, over etcd's JSON gateway with optional TLS and auth).
//! - [`Ha`]: what the node serves, shared by the lease thread, the fence
//!   watchdog and the management socket (`ha_get`, `ha_drain`).
//! - Fencing: the owner serves only until `fence_ms` after the send time of
//!   its last confirmed keepalive, which is shorter than the lease TTL; a
//!   watchdog thread flips ANA to inaccessible at that deadline even while
//!   the lease thread is stuck in a store call.
//!
//! The I/O path sees none of this: it reads the ANA state byte it always
//! reads (`AnaTable::io_status`).

pub mod device;
pub mod etcd;
pub mod file;
pub mod shared;

pub use crate::config::ha::{self as config, HaConfig, StoreKind};

use crate::state::subsystem::Registry;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use trellis_nvme::ana::AnaState;

/// A lease on one key in a cluster store. Calls block; each is bounded by
/// the store's operation timeout (`op_timeout_ms`).
pub trait LeaseStore: Send {
    /// Takes the key for this node if nobody holds it, bound to a new
    /// lease. Ok(true): we hold it now (the lease counts from before the call).
    fn try_acquire(&mut self) -> anyhow::Result<bool>;
    /// Renews the lease we hold. Ok(false): it is gone (expired or revoked).
    fn renew(&mut self) -> anyhow::Result<bool>;
    /// Gives the lease up: the key goes at once.
    fn release(&mut self) -> anyhow::Result<()>;
    /// The node name holding the key, if any.
    fn holder(&mut self) -> anyhow::Result<Option<String>>;
    /// Returns when the key may have changed, or after `max`.
    fn wait_change(&mut self, max: Duration) -> anyhow::Result<()>;
}

/// How often the fence watchdog compares the clock with the deadline: the
/// most a fence can be late (besides scheduling), counted in the guard.
pub const FENCE_TICK: Duration = Duration::from_millis(10);

/// Events kept for `ha_get` (the failover timeline).
const MAX_EVENTS: usize = 64;

/// What the node serves, and the shared view of the lease.
pub struct Ha {
    pub cfg: HaConfig,
    /// Serialises ANA flips (lease thread, watchdog, shutdown).
    serve: Mutex<()>,
    /// We hold the lease and serve (ANA optimized).
    owner: AtomicBool,
    /// Serve until this many ns after `epoch` (the fence deadline).
    deadline_ns: AtomicU64,
    epoch: Instant,
    drain_requested: AtomicBool,
    /// Why the pending drain was asked for (logged in the timeline).
    drain_why: Mutex<String>,
    drains_done: AtomicU64,
    /// The last holder the lease thread saw (for `ha_get`).
    holder: Mutex<Option<String>>,
    events: Mutex<VecDeque<(u64, String)>>,
    /// Fencing at the device ([`device`]), decided at start.
    device_fence: AtomicBool,
    /// Stepped down with device fencing: the lease thread registers the
    /// key again (the next owner's preempt removes it), off the watchdog.
    reregister: AtomicBool,
}

impl Ha {
    pub fn new(cfg: HaConfig) -> Ha {
        Ha {
            cfg,
            serve: Mutex::new(()),
            owner: AtomicBool::new(false),
            deadline_ns: AtomicU64::new(0),
            epoch: Instant::now(),
            drain_requested: AtomicBool::new(false),
            drain_why: Mutex::new(String::new()),
            drains_done: AtomicU64::new(0),
            holder: Mutex::new(None),
            events: Mutex::new(VecDeque::new()),
            device_fence: AtomicBool::new(false),
            reregister: AtomicBool::new(false),
        }
    }

    /// This node's reservation key on device-fenced namespaces.
    pub fn device_key(&self) -> u64 {
        crate::backend::remote::node_key(&self.cfg.node)
    }

    pub fn is_owner(&self) -> bool {
        self.owner.load(SeqCst)
    }

    fn ns_since_epoch(&self, t: Instant) -> u64 {
        let d = t.saturating_duration_since(self.epoch).as_nanos();
        u64::try_from(d).unwrap_or(u64::MAX)
    }

    /// The store confirmed the lease for a request sent at `sent`: serve
    /// until `sent + fence`. The server's TTL runs from when it received
    /// the request, which is after `sent`, so the deadline is early, never late.
    pub fn confirm(&self, reg: &Registry, sent: Instant) {
        let _g = crate::sys::lock(&self.serve);
        let deadline = fence_deadline(sent, self.cfg.fence());
        self.deadline_ns
            .store(self.ns_since_epoch(deadline), SeqCst);
        if Instant::now() >= deadline {
            return; // confirmed too late to serve on it
        }
        // Before ANA says optimized: the data plane checks this at execution.
        reg.fence().serve_until(crate::sys::instant_ns(deadline));
        if !self.is_owner() && !self.claim_device(reg, deadline) {
            return;
        }
        if !self.is_owner() {
            // What the last owner acknowledged, before any host can use
            // this node (ANA is still inaccessible here).
            match reg.load_shared_resv() {
                Ok(n) if reg.shared_resv().is_some() => {
                    self.event(format!(
                        "reservations loaded from the store: {n} registrants"
                    ));
                }
                Ok(_) => {}
                Err(e) => {
                    reg.fence().stop();
                    self.event(format!("not serving: cannot load the reservations: {e:#}"));
                    return;
                }
            }
        }
        if !self.owner.swap(true, SeqCst) {
            let n = apply(reg, AnaState::Optimized);
            self.event(format!(
                "optimized: lease held, ANA optimized, {n} controllers notified"
            ));
        }
    }

    /// Before going optimized with device fencing: the reservation on every
    /// shared namespace, the former owner's key preempted. False: do not
    /// serve (logged why; the next confirmation tries again).
    fn claim_device(&self, reg: &Registry, deadline: Instant) -> bool {
        if !self.device_fence.load(SeqCst) {
            return true;
        }
        match device::claim_all(reg, self.device_key()) {
            Ok(did) if Instant::now() < deadline => {
                self.event(format!("device fence: {did}"));
                true
            }
            Ok(did) => {
                // The claims outlasted the confirmation: it no longer covers us.
                reg.fence().stop();
                self.event(format!("device fence: {did}, but past the fence deadline"));
                false
            }
            Err(e) => {
                reg.fence().stop();
                self.event(format!("not serving: device fence: {e:#}"));
                false
            }
        }
    }

    /// Stops serving at once (lease lost, drain, shutdown).
    pub fn step_down(&self, reg: &Registry, why: &str) {
        let _g = crate::sys::lock(&self.serve);
        self.step_down_locked(reg, why);
    }

    fn step_down_locked(&self, reg: &Registry, why: &str) {
        // First, whatever the ANA byte says: commands already parsed, waiting
        // for data or in a scheduler, fail at execution from here on.
        reg.fence().stop();
        if self.owner.swap(false, SeqCst) {
            self.reregister
                .store(self.device_fence.load(SeqCst), SeqCst);
            let n = apply(reg, AnaState::Inaccessible);
            self.event(format!("inaccessible: {why}, {n} controllers notified"));
        }
    }

    /// The watchdog's check: fences once the deadline has passed. The
    /// unlocked read keeps the common case (not due) free of the lock.
    pub fn fence_if_due(&self, reg: &Registry, now: Instant) {
        let due = |ha: &Ha| ha.is_owner() && ha.ns_since_epoch(now) >= ha.deadline_ns.load(SeqCst);
        if due(self) {
            let _g = crate::sys::lock(&self.serve);
            // Again under the lock: a confirmation may have moved it.
            if due(self) {
                self.step_down_locked(reg, "fenced: no keepalive confirmed within fence_ms");
            }
        }
    }

    /// Notes a timeline event (wall clock ms, for comparison with hosts' logs).
    pub fn event(&self, what: String) {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        tracing::info!(node = %self.cfg.node, "ha: {what}");
        let mut ev = crate::sys::lock(&self.events);
        if ev.len() == MAX_EVENTS {
            ev.pop_front();
        }
        ev.push_back((ms, what));
    }

    fn set_holder(&self, h: Option<String>) {
        *crate::sys::lock(&self.holder) = h;
    }

    /// `ha_get`: the role, the lease's holder, the timing, the timeline.
    pub fn status(&self) -> Value {
        let c = &self.cfg;
        let events: Vec<Value> = crate::sys::lock(&self.events)
            .iter()
            .map(|(ms, what)| json!({"unix_ms": ms, "event": what}))
            .collect();
        json!({
            "node": c.node,
            "store": c.store.name(),
            "key": c.key,
            "role": if self.is_owner() { "owner" } else { "standby" },
            "holder": *crate::sys::lock(&self.holder),
            "lease_ttl_ms": c.lease_ttl_ms,
            "keepalive_ms": c.keepalive_ms,
            "fence_ms": c.fence_ms,
            "device_fence": self.device_fence.load(SeqCst),
            "device_key": format!("{:#018x}", self.device_key()),
            "drive_failover": c.drive_failover,
            "events": events,
        })
    }

    /// Asks the lease thread to hand ownership over (a drain), without
    /// waiting: the drive watch's failover. False when not the owner.
    pub fn request_drain(&self, why: &str) -> bool {
        if !self.is_owner() {
            return false;
        }
        *crate::sys::lock(&self.drain_why) = why.to_string();
        self.drain_requested.store(true, SeqCst);
        true
    }

    /// `ha_drain`: asks the lease thread to hand ownership over and waits
    /// until it has released the lease (or `max`).
    pub fn drain(&self, max: Duration) -> Result<Value, String> {
        if !self.is_owner() {
            return Err(format!(
                "node {} does not hold the lease (holder: {}): drain the node that does",
                self.cfg.node,
                crate::sys::lock(&self.holder).as_deref().unwrap_or("none")
            ));
        }
        let before = self.drains_done.load(SeqCst);
        self.request_drain("drain");
        let until = Instant::now() + max;
        while self.drains_done.load(SeqCst) == before {
            if Instant::now() >= until {
                return Err(format!("drain did not finish within {max:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(json!({"node": self.cfg.node, "released": true}))
    }
}

/// How long `ha_drain` waits for the lease thread: a keepalive in progress,
/// the guard, the release, and slack for a slow store.
fn drain_wait(c: &HaConfig) -> Duration {
    c.keepalive() + c.op_timeout() * 2 + c.guard() + Duration::from_secs(5)
}

/// The management socket's `ha_get` and `ha_drain`.
pub fn rpc(ha: Option<&Arc<Ha>>, method: &str) -> Result<Value, (i64, String)> {
    /// JSON-RPC "invalid params"-style refusals use the server error range.
    const HA_ERROR: i64 = -32001;
    let Some(ha) = ha else {
        return Err((
            HA_ERROR,
            "this target has no [ha] section (start it with --ha-store or [ha] in the config)"
                .into(),
        ));
    };
    match method {
        "ha_drain" => ha.drain(drain_wait(&ha.cfg)).map_err(|e| (HA_ERROR, e)),
        _ => Ok(ha.status()),
    }
}

/// The fence deadline for a confirmation of a request sent at `sent`.
pub fn fence_deadline(sent: Instant, fence: Duration) -> Instant {
    sent + fence
}

/// Sets every ANA group slot of every I/O listener to `st` and raises the
/// ANA change event where a group in use changed. Returns how many
/// controllers were notified. Every slot, not only the groups in use: a
/// group added later (`namespace_add`) starts in its slot's state.
fn apply(reg: &Registry, st: AnaState) -> usize {
    let (cap, _) = reg.ana().limits();
    let in_use = reg.ana().groups();
    let mut n = 0;
    for l in reg.listeners() {
        if l.kind == crate::config::ListenerKind::Discovery {
            continue;
        }
        let mut changed = Vec::new();
        for g in 0..cap as usize {
            if reg.ana().set(l.portid, g, st) {
                if let Some(&grpid) = in_use.get(g) {
                    changed.push(grpid);
                }
            }
        }
        n += crate::control::rpc::notify(reg, l.portid, &changed);
    }
    n
}

/// The lease thread and the fence watchdog of a running target.
pub struct Threads {
    lease: std::thread::JoinHandle<()>,
    watchdog: std::thread::JoinHandle<()>,
}

impl Threads {
    /// Joins both (after the shutdown flag is raised): the lease thread
    /// steps down, waits the guard and releases first.
    pub fn join(self) -> Result<(), String> {
        let a = self.lease.join().is_ok();
        let b = self.watchdog.join().is_ok();
        (a && b)
            .then_some(())
            .ok_or_else(|| "an HA thread panicked".into())
    }
}

/// `cfg` with the defaults that depend on the node filled in: the key
/// from the first subsystem's NQN, the node name from the node UUID, the
/// file store's lock file in the state directory.
pub fn resolve(cfg: &HaConfig, reg: &Registry) -> HaConfig {
    let mut c = cfg.clone();
    if c.key.is_empty() {
        let nqn = reg.subsystems().first().map_or("none", |s| s.nqn.as_str());
        c.key = format!("/trellis/ha/{nqn}");
    }
    if c.node.is_empty() {
        c.node = reg.node().uuid().to_string();
    }
    c
}

/// At start, when `[ha]` is set: every group inaccessible until the lease
/// is held, then the threads. None without `[ha]`.
pub fn start(
    cfg: &crate::config::Config,
    ctl: &crate::control::Control,
    shutdown: &Arc<AtomicBool>,
) -> anyhow::Result<Option<Threads>> {
    let reg = &ctl.reg;
    let Some(c) = &cfg.ha else {
        return Ok(None);
    };
    apply(reg, AnaState::Inaccessible);
    let ha = Arc::new(Ha::new(resolve(c, reg)));
    if device::enabled(&ha.cfg, reg)? {
        ha.device_fence.store(true, SeqCst);
        let key = ha.device_key();
        let did = device::register_all(reg, key);
        ha.event(format!("device fence on, key {key:#018x}: {did}"));
    } else {
        ha.event("device fence off: namespaces are fenced in software only".into());
    }
    reg.set_shared_resv(shared::open(&ha.cfg, reg.fence().clone())?);
    ctl.set_ha(ha.clone());
    spawn(reg.clone(), ha, shutdown.clone()).map(Some)
}

/// Opens the store and starts the lease thread and the watchdog.
pub fn spawn(
    reg: Arc<Registry>,
    ha: Arc<Ha>,
    shutdown: Arc<AtomicBool>,
) -> anyhow::Result<Threads> {
    let store = open_store(&ha.cfg)?;
    ha.event(format!(
        "standby: store {}, key {}, TTL {} ms, fence {} ms",
        ha.cfg.store.name(),
        ha.cfg.key,
        ha.cfg.lease_ttl_ms,
        ha.cfg.fence_ms
    ));
    let watchdog = {
        let (reg, ha, shutdown) = (reg.clone(), ha.clone(), shutdown.clone());
        std::thread::Builder::new()
            .name("ha-fence".into())
            .spawn(move || {
                while !shutdown.load(SeqCst) {
                    ha.fence_if_due(&reg, Instant::now());
                    std::thread::sleep(FENCE_TICK);
                }
            })?
    };
    let lease = std::thread::Builder::new()
        .name("ha-lease".into())
        .spawn(move || LeaseLoop::new(&reg, &ha, store).run(&shutdown))?;
    Ok(Threads { lease, watchdog })
}

fn open_store(cfg: &HaConfig) -> anyhow::Result<Box<dyn LeaseStore>> {
    Ok(match cfg.store {
        StoreKind::File => Box::new(file::FileStore::open(cfg)?),
        StoreKind::Etcd => Box::new(etcd::EtcdStore::connect(cfg)?),
    })
}

/// The lease thread's loop: campaign while standby, renew while owner,
/// hand over on a drain, release at shutdown.
struct LeaseLoop<'a> {
    reg: &'a Registry,
    ha: &'a Ha,
    store: Box<dyn LeaseStore>,
    /// After a drain: do not campaign until another node holds the key,
    /// or until this passes (nobody took it: serve again rather than never).
    hold_until: Option<Instant>,
    last_error: Option<String>,
}

impl<'a> LeaseLoop<'a> {
    fn new(reg: &'a Registry, ha: &'a Ha, store: Box<dyn LeaseStore>) -> Self {
        LeaseLoop {
            reg,
            ha,
            store,
            hold_until: None,
            last_error: None,
        }
    }

    fn run(mut self, shutdown: &AtomicBool) {
        while !shutdown.load(SeqCst) {
            if self.ha.is_owner() {
                self.owner_tick(shutdown);
            } else {
                self.ha.drain_requested.store(false, SeqCst);
                self.standby_tick();
            }
        }
        if self.ha.is_owner() {
            self.hand_over("shutdown");
        }
    }

    fn owner_tick(&mut self, shutdown: &AtomicBool) {
        let sent = Instant::now();
        match self.store.renew() {
            Ok(true) => {
                self.ok();
                self.ha.confirm(self.reg, sent);
            }
            Ok(false) => self
                .ha
                .step_down(self.reg, "lease lost (expired or revoked)"),
            // The watchdog fences if this lasts past the deadline.
            Err(e) => self.failed("keepalive", &e),
        }
        let next = sent + self.ha.cfg.keepalive();
        while Instant::now() < next && !shutdown.load(SeqCst) {
            if self.ha.drain_requested.swap(false, SeqCst) && self.ha.is_owner() {
                let why = std::mem::take(&mut *crate::sys::lock(&self.ha.drain_why));
                self.hand_over(if why.is_empty() { "drain" } else { &why });
                self.hold_until = Some(Instant::now() + self.ha.cfg.drain_hold());
                self.ha.drains_done.fetch_add(1, SeqCst);
                return;
            }
            std::thread::sleep(FENCE_TICK);
        }
    }

    fn standby_tick(&mut self) {
        if self.ha.reregister.swap(false, SeqCst) {
            // A standby stays a registrant, ready to acquire later.
            let did = device::register_all(self.reg, self.ha.device_key());
            self.ha.event(format!("device fence: standby: {did}"));
        }
        let holder = match self.store.holder() {
            Ok(h) => {
                self.ok();
                h
            }
            Err(e) => {
                self.failed("read the holder", &e);
                std::thread::sleep(self.ha.cfg.keepalive());
                return;
            }
        };
        self.ha.set_holder(holder.clone());
        if let Some(until) = self.hold_until {
            let other = holder.as_ref().is_some_and(|h| *h != self.ha.cfg.node);
            if !other && Instant::now() < until {
                self.wait(self.ha.cfg.keepalive());
                return;
            }
            self.hold_until = None;
        }
        if holder.as_deref() == Some(self.ha.cfg.node.as_str()) {
            // Our own lease, fenced after a store outage: serve again if it
            // is still alive, else it expires and we campaign afresh.
            let sent = Instant::now();
            if let Ok(true) = self.store.renew() {
                self.ha.confirm(self.reg, sent);
                return;
            }
        }
        if holder.is_some() {
            self.wait(self.ha.cfg.keepalive());
            return;
        }
        let sent = Instant::now();
        match self.store.try_acquire() {
            Ok(true) => {
                self.ha
                    .event(format!("lease acquired on {}", self.ha.cfg.key));
                self.ha.set_holder(Some(self.ha.cfg.node.clone()));
                self.ha.confirm(self.reg, sent);
            }
            Ok(false) => self.wait(self.ha.cfg.keepalive()),
            Err(e) => {
                self.failed("campaign", &e);
                std::thread::sleep(self.ha.cfg.keepalive());
            }
        }
    }

    fn wait(&mut self, max: Duration) {
        if let Err(e) = self.store.wait_change(max) {
            self.failed("watch", &e);
            std::thread::sleep(max);
        }
    }

    /// Stops serving, lets commands admitted before the flip finish (the
    /// guard, the same bound fencing relies on), then releases the lease so
    /// the other node takes it at once instead of after the TTL.
    fn hand_over(&mut self, why: &str) {
        self.ha.step_down(self.reg, why);
        std::thread::sleep(self.ha.cfg.guard());
        match self.store.release() {
            Ok(()) => self.ha.event(format!("lease released ({why})")),
            Err(e) => self.failed("release (the lease expires after its TTL)", &e),
        }
        self.ha.set_holder(None);
    }

    /// Logs a store error once per run of identical errors.
    fn failed(&mut self, what: &str, e: &anyhow::Error) {
        let msg = format!("{what}: {e:#}");
        if self.last_error.as_deref() != Some(msg.as_str()) {
            tracing::warn!(node = %self.ha.cfg.node, "ha: store error: {msg}");
            self.last_error = Some(msg);
        }
    }

    fn ok(&mut self) {
        if self.last_error.take().is_some() {
            tracing::info!(node = %self.ha.cfg.node, "ha: store reachable again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_deadline_comes_before_the_lease_can_expire() {
        let c = HaConfig::default();
        let t0 = Instant::now();
        let d = fence_deadline(t0, c.fence());
        // The server's TTL starts at receipt (>= t0): expiry >= t0 + TTL.
        assert!(d + c.guard() <= t0 + c.ttl());
        assert!(c.guard() >= Duration::from_millis(config::MIN_GUARD_MS));
    }
}
