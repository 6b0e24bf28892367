//! Tenants: host NQNs mapped to dense scheduler ids at Connect, and what
//! each reactor's Gimbal scheduler publishes for `/metrics`. Read by the
//! data plane (`data::qos`) and the management plane alike.

use crate::config::qos::TenantConfig;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use trellis_qos::sched::{self, SchedLimits, TenantId};

/// Host NQN → tenant id, shared by every namespace's schedulers. Configured
/// tenants take ids 0.. in config order and keep them. Other hosts get an id
/// when their controller first sends I/O to a QoS namespace (never on a
/// subsystem without one), lowest free id first, up to `max_tenants − 1`;
/// later hosts share the last id (the catch-all). An id goes back to the
/// free set when the host's last controller goes (its [`TenantLease`]
/// drops), unless an operator named the host (`tenant_set_weight`): so
/// throw-away NQNs that come and go cannot use up the ids and push later
/// hosts into the catch-all (issue 32's finding).
pub struct Tenants {
    configured: Vec<TenantConfig>,
    max_tenants: TenantId,
    map: Mutex<TenantMap>,
    /// Weights set while running (`trellis ctl tenant set-weight`), over
    /// the configured ones; at most `max_tenants` entries.
    live: Mutex<HashMap<TenantId, u32>>,
    /// Bumped on every live weight change: reactors compare it about once
    /// a millisecond and re-apply the weights to their schedulers, so no
    /// lock is taken on the I/O path.
    weights_gen: std::sync::atomic::AtomicU64,
    /// "new qos tenant" lines: any peer can make them, with throw-away
    /// NQNs, so they are rate-limited (`target.log_burst`).
    log: crate::sys::loglimit::LogLimit,
}

/// A host's tenant and who holds it.
struct Assigned {
    id: TenantId,
    /// Live controllers' leases on it.
    leases: u32,
    /// Configured, or named by an operator: never released.
    pinned: bool,
}

struct TenantMap {
    ids: HashMap<String, Assigned>,
    /// Released ids below `next`, handed out again lowest first.
    free: std::collections::BTreeSet<TenantId>,
    next: TenantId,
    overflow_logged: bool,
}

impl Tenants {
    pub fn new(configured: &[TenantConfig], limits: &SchedLimits) -> Tenants {
        let ids = configured
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let a = Assigned {
                    id: i as TenantId,
                    leases: 0,
                    pinned: true,
                };
                (t.host.clone(), a)
            })
            .collect();
        Tenants {
            configured: configured.to_vec(),
            max_tenants: limits.max_tenants.max(1),
            map: Mutex::new(TenantMap {
                ids,
                free: Default::default(),
                next: configured.len() as TenantId,
                overflow_logged: false,
            }),
            live: Mutex::new(HashMap::new()),
            weights_gen: std::sync::atomic::AtomicU64::new(0),
            log: crate::sys::loglimit::LogLimit::default(),
        }
    }

    /// Sets the rate limit of "new qos tenant" lines (`target.log_burst`,
    /// `target.log_lines_per_sec`).
    pub fn with_log_limit(mut self, burst: u32, per_sec: u32) -> Tenants {
        self.log = crate::sys::loglimit::LogLimit::new(burst, per_sec);
        self
    }

    /// Forgets the tenants hosts were given at Connect, keeping the
    /// configured ones: the fuzz harness (`fuzzing.rs`) reuses one
    /// registry across inputs, and an input must not see another's hosts.
    pub(crate) fn forget_assigned(&self) {
        let mut m = crate::sys::lock(&self.map);
        m.ids.retain(|_, a| (a.id as usize) < self.configured.len());
        m.free.clear();
        m.next = self.configured.len() as TenantId;
        m.overflow_logged = false;
    }

    /// The catch-all tenant hosts share once every id is taken.
    pub fn catch_all(&self) -> TenantId {
        self.max_tenants - 1
    }

    /// The tenant of `hostnqn`, assigning a new id on first sight and
    /// pinning it (an operator or a test names the host: the id stays).
    pub fn tenant_of(&self, hostnqn: &str) -> TenantId {
        self.take(hostnqn, true)
    }

    /// A controller's hold on its host's tenant id, released on drop.
    pub fn lease(self: &Arc<Self>, hostnqn: &str) -> TenantLease {
        let id = self.take(hostnqn, false);
        TenantLease {
            tenants: self.clone(),
            hostnqn: hostnqn.to_string(),
            id,
            // The catch-all is given without an entry: nothing to give back.
            counted: id != self.catch_all(),
        }
    }

    fn take(&self, hostnqn: &str, pin: bool) -> TenantId {
        let mut m = crate::sys::lock(&self.map);
        if let Some(a) = m.ids.get_mut(hostnqn) {
            a.pinned |= pin;
            a.leases += u32::from(!pin);
            return a.id;
        }
        let id = match m.free.pop_first() {
            Some(id) => Some(id),
            None if m.next < self.catch_all() => {
                m.next += 1;
                Some(m.next - 1)
            }
            None => None,
        };
        if let Some(id) = id {
            debug_assert!(id < self.catch_all() && id as usize >= self.configured.len());
            // Bounded: at most max_tenants − 1 entries besides configured ones.
            let a = Assigned {
                id,
                leases: u32::from(!pin),
                pinned: pin,
            };
            m.ids.insert(hostnqn.to_string(), a);
            drop(m);
            if let Some(left_out) = self.log.admit() {
                tracing::info!(host = %hostnqn.escape_debug(), tenant = id, left_out, "new qos tenant");
            }
            return id;
        }
        if !m.overflow_logged {
            m.overflow_logged = true;
            tracing::warn!(
                host = %hostnqn.escape_debug(),
                tenant = self.catch_all(),
                "qos tenant limit (qos.limits.max_tenants) reached: further hosts share the catch-all tenant"
            );
        }
        self.catch_all()
    }

    /// A lease of `id` dropped: the id is freed with the host's last lease
    /// unless pinned.
    fn release(&self, hostnqn: &str, id: TenantId) {
        let mut m = crate::sys::lock(&self.map);
        let Some(a) = m.ids.get_mut(hostnqn).filter(|a| a.id == id) else {
            return; // forgotten by the fuzz harness since
        };
        a.leases = a.leases.saturating_sub(1);
        if a.leases > 0 || a.pinned {
            return;
        }
        let id = a.id;
        m.ids.remove(hostnqn);
        m.free.insert(id);
        drop(m);
        tracing::debug!(host = %hostnqn.escape_debug(), tenant = id, "qos tenant released");
    }

    /// Configured weights with the live ones over them, applied to each
    /// new scheduler and, after a change, to every scheduler.
    pub fn weights(&self) -> Vec<(TenantId, u32)> {
        let live = crate::sys::lock(&self.live);
        let mut v: Vec<(TenantId, u32)> = self
            .configured
            .iter()
            .enumerate()
            .map(|(i, t)| (i as TenantId, t.weight))
            .filter(|(i, _)| !live.contains_key(i))
            .collect();
        v.extend(live.iter().map(|(&t, &w)| (t, w)));
        v
    }

    /// The `[[tenant]]` tables as they are now: the configured ones with
    /// live weights, then hosts given a weight live (named by their NQN).
    pub fn configs(&self) -> Vec<TenantConfig> {
        let live = crate::sys::lock(&self.live).clone();
        let mut v = self.configured.clone();
        for (i, t) in v.iter_mut().enumerate() {
            if let Some(&w) = live.get(&(i as TenantId)) {
                t.weight = w;
            }
        }
        let mut extra: Vec<_> = live
            .iter()
            .filter(|(&id, _)| id as usize >= self.configured.len())
            .map(|(&id, &w)| (id, w))
            .collect();
        extra.sort_unstable();
        for (id, w) in extra {
            let host = self.name_of(id);
            if host.starts_with("nqn.") {
                v.push(TenantConfig {
                    name: host.clone(),
                    host,
                    weight: w,
                });
            }
        }
        v
    }

    /// The generation of the weights (see `weights_gen`).
    #[inline]
    pub fn weights_gen(&self) -> u64 {
        self.weights_gen.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The tenant `who` names: a `[[tenant]]` name, or a host NQN (given a
    /// tenant id now if it has none, so the weight holds when it connects).
    pub fn resolve(&self, who: &str) -> Option<TenantId> {
        if let Some(i) = self.configured.iter().position(|t| t.name == who) {
            return Some(i as TenantId);
        }
        who.starts_with("nqn.").then(|| self.tenant_of(who))
    }

    /// Sets `tenant`'s weight on every scheduler (applied by the reactors
    /// within about a millisecond). The weight must be in 1..=MAX_TENANT_WEIGHT.
    pub fn set_weight(&self, tenant: TenantId, weight: u32) -> Result<(), String> {
        if !(1..=sched::MAX_TENANT_WEIGHT).contains(&weight) {
            return Err(format!(
                "weight {weight} is out of range: use 1..={}",
                sched::MAX_TENANT_WEIGHT
            ));
        }
        crate::sys::lock(&self.live).insert(tenant, weight);
        self.weights_gen
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// A tenant's name for `/metrics`: its `[[tenant]]` name, else the host
    /// NQN it was given to, else "catch-all" or its id.
    pub fn name_of(&self, id: TenantId) -> String {
        if let Some(t) = self.configured.get(id as usize) {
            return t.name.clone();
        }
        if id == self.catch_all() {
            return "catch-all".into();
        }
        let m = crate::sys::lock(&self.map);
        m.ids
            .iter()
            .find(|(_, a)| a.id == id)
            .map_or_else(|| format!("tenant-{id}"), |(h, _)| h.clone())
    }

    /// Every tenant id in use, in order (for the log page).
    pub fn in_use(&self) -> Vec<TenantId> {
        let m = crate::sys::lock(&self.map);
        let mut v: Vec<TenantId> = m.ids.values().map(|a| a.id).collect();
        if m.overflow_logged {
            v.push(self.catch_all());
        }
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// A controller's tenant: taken on its first I/O to a QoS namespace
/// (`Controller::tenant`), given back when the controller goes.
pub struct TenantLease {
    tenants: Arc<Tenants>,
    hostnqn: String,
    id: TenantId,
    /// Whether `take` counted this lease on the host's entry (not for the
    /// catch-all), so only counted leases are given back.
    counted: bool,
}

impl TenantLease {
    #[inline]
    pub fn id(&self) -> TenantId {
        self.id
    }
}

impl Drop for TenantLease {
    fn drop(&mut self) {
        if self.counted {
            self.tenants.release(&self.hostnqn, self.id);
        }
    }
}

/// A controller's tenant slot: empty until its first I/O to a QoS
/// namespace asks for the id, so hosts of subsystems without QoS never take
/// one. One atomic load per scheduled I/O once set.
pub struct TenantSlot {
    tenants: Arc<Tenants>,
    lease: std::sync::OnceLock<TenantLease>,
}

impl TenantSlot {
    pub fn new(tenants: Arc<Tenants>) -> TenantSlot {
        TenantSlot {
            tenants,
            lease: std::sync::OnceLock::new(),
        }
    }

    /// The tenant of `hostnqn` (the controller's host), leased on first use.
    #[inline]
    pub fn get(&self, hostnqn: &str) -> TenantId {
        self.lease.get_or_init(|| self.tenants.lease(hostnqn)).id()
    }

    /// The tenant, if the controller has sent QoS I/O yet.
    pub fn assigned(&self) -> Option<TenantId> {
        self.lease.get().map(TenantLease::id)
    }
}

/// How often a reactor's scheduler publishes its state for `/metrics`.
pub const PUBLISH_INTERVAL_NS: u64 = 100_000_000;

/// One reactor's Gimbal state for one namespace, as `/metrics` shows it:
/// written by the reactor at most every [`PUBLISH_INTERVAL_NS`] while
/// something changed (so at most that late after it goes idle), read by
/// scrapes. Nothing per I/O.
pub struct QosPublished {
    pub target_rate_bytes_per_s: AtomicU64,
    pub headroom_bytes_per_s: AtomicU64,
    pub write_cost_fp10: AtomicU64,
    /// [read, write]: congestion state code (as the log page: 0 no sample,
    /// 1 under-utilised, 2 avoidance, 3 congested, 4 overloaded), latency
    /// EWMA and target (µs).
    pub state: [AtomicU64; 2],
    pub latency_ewma_us: [AtomicU64; 2],
    pub latency_target_us: [AtomicU64; 2],
    /// Per tenant id (`qos.limits.max_tenants` entries).
    pub tenants: Box<[TenantPublished]>,
}

#[derive(Default)]
pub struct TenantPublished {
    pub queued: AtomicU64,
    pub in_flight: AtomicU64,
    pub io_credits: AtomicU64,
    /// Commands and bytes the scheduler completed for the tenant.
    pub completed_commands: AtomicU64,
    pub completed_bytes: AtomicU64,
}

impl QosPublished {
    pub(crate) fn new(max_tenants: usize) -> QosPublished {
        QosPublished {
            target_rate_bytes_per_s: AtomicU64::new(0),
            headroom_bytes_per_s: AtomicU64::new(0),
            write_cost_fp10: AtomicU64::new(0),
            state: Default::default(),
            latency_ewma_us: Default::default(),
            latency_target_us: Default::default(),
            tenants: (0..max_tenants)
                .map(|_| TenantPublished::default())
                .collect(),
        }
    }
}

/// Every reactor's [`QosPublished`] of one namespace (a reactor adds its own
/// when it opens the namespace's queue).
pub type QosBoard = Mutex<Vec<Arc<QosPublished>>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn tenants(configured: &[&str], max: TenantId) -> Arc<Tenants> {
        let cfg: Vec<TenantConfig> = configured
            .iter()
            .map(|h| TenantConfig {
                name: h.to_string(),
                host: h.to_string(),
                weight: 1,
            })
            .collect();
        let limits = SchedLimits {
            max_tenants: max,
            ..SchedLimits::default()
        };
        Arc::new(Tenants::new(&cfg, &limits))
    }

    #[test]
    fn a_lease_frees_its_id_with_the_hosts_last_controller() {
        let t = tenants(&["nqn.a"], 4);
        let b1 = t.lease("nqn.b");
        let b2 = t.lease("nqn.b");
        assert_eq!(
            (b1.id(), b2.id()),
            (1, 1),
            "one id per host, after the configured"
        );
        let c = t.lease("nqn.c");
        assert_eq!(c.id(), 2);
        assert_eq!(t.lease("nqn.d").id(), 3, "ids 1 and 2 taken: the catch-all");
        drop(b1);
        assert_eq!(t.in_use(), vec![0, 1, 2, 3], "b still has a controller");
        drop(b2);
        let e = t.lease("nqn.e");
        assert_eq!(e.id(), 1, "b's id, freed with its last lease");
        drop(c);
        assert_eq!(t.lease("nqn.f").id(), 2, "c's id; e still holds 1");
    }

    #[test]
    fn a_catch_all_lease_gives_back_nothing_another_controller_holds() {
        let t = tenants(&[], 3); // ids 0 and 1, then the catch-all 2
        let (x0, y) = (t.lease("nqn.x0"), t.lease("nqn.y"));
        let x_catch_all = t.lease("nqn.x");
        assert_eq!(x_catch_all.id(), 2);
        drop(x0);
        let x_real = t.lease("nqn.x");
        assert_eq!(x_real.id(), 0, "a freed id for x's second controller");
        drop(x_catch_all);
        let z = t.lease("nqn.z");
        assert_ne!(z.id(), x_real.id(), "x's id was freed while x held it");
        drop(y);
    }

    #[test]
    fn configured_and_named_tenants_are_never_released() {
        let t = tenants(&["nqn.a"], 8);
        drop(t.lease("nqn.a"));
        assert_eq!(t.name_of(0), "nqn.a");
        let named = t.tenant_of("nqn.op"); // as `tenant_set_weight` names a host
        let l = t.lease("nqn.op");
        assert_eq!(l.id(), named);
        drop(l);
        assert_eq!(
            t.lease("nqn.other").id(),
            named + 1,
            "the named host kept its id"
        );
        assert_eq!(t.name_of(named), "nqn.op");
    }

    #[test]
    fn a_slot_leases_only_when_asked_and_releases_on_drop() {
        let t = tenants(&[], 4);
        let s = TenantSlot::new(t.clone());
        assert_eq!(s.assigned(), None);
        assert!(t.in_use().is_empty(), "no id before the first QoS I/O");
        assert_eq!(s.get("nqn.h"), 0);
        assert_eq!(s.get("nqn.h"), 0, "one lease per slot");
        assert_eq!(t.in_use(), vec![0]);
        drop(s);
        assert!(t.in_use().is_empty());
    }
}
