//! Tenants: host NQNs mapped to dense scheduler ids at Connect, and what
//! each reactor's Gimbal scheduler publishes for `/metrics`. Read by the
//! data plane (`data::qos`) and the management plane alike.

use crate::config::qos::TenantConfig;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use trellis_qos::sched::{self, SchedLimits, TenantId};

/// Host NQN → tenant id, shared by every namespace's schedulers. Configured
/// tenants take ids 0.. in config order; other hosts get the next id, first
/// come first served, up to `max_tenants − 1`; later hosts share the last id
/// (the catch-all). Consulted only at Connect.
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
}

struct TenantMap {
    ids: HashMap<String, TenantId>,
    next: TenantId,
    overflow_logged: bool,
}

impl Tenants {
    pub fn new(configured: &[TenantConfig], limits: &SchedLimits) -> Tenants {
        let ids = configured
            .iter()
            .enumerate()
            .map(|(i, t)| (t.host.clone(), i as TenantId))
            .collect();
        Tenants {
            configured: configured.to_vec(),
            max_tenants: limits.max_tenants.max(1),
            map: Mutex::new(TenantMap {
                ids,
                next: configured.len() as TenantId,
                overflow_logged: false,
            }),
            live: Mutex::new(HashMap::new()),
            weights_gen: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Forgets the tenants hosts were given at Connect, keeping the
    /// configured ones: the fuzz harness (`fuzzing.rs`) reuses one
    /// registry across inputs, and an input must not see another's hosts.
    pub(crate) fn forget_assigned(&self) {
        let mut m = crate::sys::lock(&self.map);
        m.ids.retain(|_, id| (*id as usize) < self.configured.len());
        m.next = self.configured.len() as TenantId;
        m.overflow_logged = false;
    }

    /// The catch-all tenant hosts share once every id is taken.
    pub fn catch_all(&self) -> TenantId {
        self.max_tenants - 1
    }

    /// The tenant of `hostnqn`, assigning a new id on first sight.
    pub fn tenant_of(&self, hostnqn: &str) -> TenantId {
        let mut m = crate::sys::lock(&self.map);
        if let Some(&id) = m.ids.get(hostnqn) {
            return id;
        }
        if m.next < self.catch_all() {
            let id = m.next;
            m.next += 1;
            // Bounded: at most max_tenants − 1 entries besides configured ones.
            m.ids.insert(hostnqn.to_string(), id);
            tracing::info!(host = hostnqn, tenant = id, "new qos tenant");
            return id;
        }
        if !m.overflow_logged {
            m.overflow_logged = true;
            tracing::warn!(
                host = hostnqn,
                tenant = self.catch_all(),
                "qos tenant limit (qos.limits.max_tenants) reached: further hosts share the catch-all tenant"
            );
        }
        self.catch_all()
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
            .find(|(_, &v)| v == id)
            .map_or_else(|| format!("tenant-{id}"), |(h, _)| h.clone())
    }

    /// Every tenant id in use, in order (for the log page).
    pub fn in_use(&self) -> Vec<TenantId> {
        let m = crate::sys::lock(&self.map);
        let mut v: Vec<TenantId> = m.ids.values().copied().collect();
        if m.overflow_logged {
            v.push(self.catch_all());
        }
        v.sort_unstable();
        v.dedup();
        v
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
