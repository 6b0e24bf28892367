//! One controller of the dynamic model (created by an admin Connect): its
//! registers, features, error log, asynchronous events and queues. Split
//! from `subsystem.rs`, which re-exports these types.

use crate::state::subsystem::Subsystem;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use trellis_nvme::log::ErrorEntry;

/// Per-controller error log: a ring of the last 64 failed commands.
#[derive(Default)]
pub struct ErrorLog {
    pub count: u64,
    pub entries: std::collections::VecDeque<ErrorEntry>,
}

pub const ERROR_LOG_ENTRIES: usize = 64;

/// Feature values a host may set and read back.
#[derive(Clone, Debug)]
pub struct Features {
    pub arbitration: u32,
    pub power_mgmt: u32,
    pub temp_threshold: u32,
    pub error_recovery: u32,
    pub write_cache: u32,
    pub irq_coalescing: u32,
    pub irq_config: u32,
    pub write_atomicity: u32,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            arbitration: 0,
            power_mgmt: 0,
            temp_threshold: 0x157, // 343 K, the common default over-temperature threshold
            error_recovery: 0,
            write_cache: 1,
            irq_coalescing: 0,
            irq_config: 0,
            write_atomicity: 0,
        }
    }
}

/// What the control path may report of a connected queue.
#[derive(Clone, Copy, Debug)]
pub struct QueueInfo {
    /// SQSIZE from Connect (0's based).
    pub sqsize: u16,
    pub peer: SocketAddr,
}

/// One controller (dynamic model: created by an admin Connect).
///
/// Its fields are private: the data plane (Connect, admin commands, the
/// keep-alive timer) and the control plane (`ctl get controllers`, AENs)
/// reach it only through the methods below, so every change of a register
/// or a mask is one named operation here, not an atomic poked elsewhere.
pub struct Controller {
    pub(in crate::state) cntlid: u16,
    /// None for a discovery controller.
    pub(in crate::state) subsys: Option<Arc<Subsystem>>,
    pub(in crate::state) hostnqn: String,
    pub(in crate::state) hostid: [u8; 16],
    /// The reservation host: `hostid` bound to `hostnqn` (`resv::HostId`).
    pub(in crate::state) resv_host: crate::state::resv::HostId,
    pub(in crate::state) kato_ms: AtomicU32,
    pub(in crate::state) last_keepalive_ns: AtomicU64,
    pub(in crate::state) cc: AtomicU32,
    pub(in crate::state) csts: AtomicU32,
    /// I/O queues granted by Set Features Number of Queues.
    pub(in crate::state) io_queues: AtomicU16,
    /// Connected queues by QID (0: the admin queue), for `controllers_get`.
    pub(in crate::state) connected_qids: Mutex<HashMap<u16, QueueInfo>>,
    /// Set once: every queue of the controller must close.
    pub(in crate::state) dead: AtomicBool,
    pub(in crate::state) async_event_config: AtomicU32,
    /// Listener (portid) the admin queue connected through: ANA states
    /// and ANA change events are per listener.
    pub(in crate::state) portid: u16,
    /// Asynchronous events (by Asynchronous Event Configuration bit) to
    /// complete on the next AER; set by the control path.
    pub(in crate::state) aen_pending: AtomicU32,
    /// Events sent and not yet acknowledged by reading their log page with
    /// RAE clear: masked, as the spec requires (and nvmet's `aen_masked`).
    pub(in crate::state) aen_masked: AtomicU32,
    pub(in crate::state) features: Mutex<Features>,
    pub(in crate::state) errors: Mutex<ErrorLog>,
    /// The host's QoS tenant (`Registry::tenants`), taken on the first I/O
    /// to a QoS namespace and released with the controller: read it with
    /// [`Controller::tenant`].
    pub(in crate::state) tenant: crate::state::tenants::TenantSlot,
    /// The admin queue came over TLS with a PSK identity naming this
    /// controller's host: what the discovery log and its change notices
    /// may reveal to it of PSK-only hosts' subsystems.
    pub(in crate::state) tls_proven: bool,
    /// The host turned the volatile write cache off (Set Features 06h,
    /// WCE = 0): every write goes through with FUA. An atomic the I/O path
    /// reads, beside the feature value in `features`.
    pub(in crate::state) write_cache_off: AtomicBool,
    /// The Changed Namespace List (log page 04h) not yet read.
    pub(in crate::state) changed_ns: Mutex<crate::state::aen::ChangedNs>,
    /// Reservation notices (log page 80h) and their mask (feature 82h).
    pub(in crate::state) resv_log: Mutex<crate::state::resv::NoticeLog>,
}

/// What an admin Connect establishes of a new controller.
pub struct NewController {
    pub cntlid: u16,
    pub subsys: Option<Arc<Subsystem>>,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    /// KATO granted (after the node's floor and ceiling).
    pub kato_ms: u32,
    pub now_ns: u64,
    /// I/O queues granted until Set Features Number of Queues says less.
    pub io_queues: u16,
    pub portid: u16,
    /// The admin queue: its SQSIZE and peer.
    pub admin: QueueInfo,
    pub tenants: Arc<crate::state::tenants::Tenants>,
    pub tls_proven: bool,
}

impl Controller {
    pub fn new(n: NewController) -> Controller {
        Controller {
            cntlid: n.cntlid,
            resv_host: crate::state::resv::HostId::new(n.hostid, &n.hostnqn),
            subsys: n.subsys,
            hostnqn: n.hostnqn,
            hostid: n.hostid,
            kato_ms: AtomicU32::new(n.kato_ms),
            last_keepalive_ns: AtomicU64::new(n.now_ns),
            cc: AtomicU32::new(0),
            csts: AtomicU32::new(0),
            io_queues: AtomicU16::new(n.io_queues),
            connected_qids: Mutex::new(HashMap::from([(0, n.admin)])),
            dead: AtomicBool::new(false),
            async_event_config: AtomicU32::new(0),
            portid: n.portid,
            aen_pending: AtomicU32::new(0),
            aen_masked: AtomicU32::new(0),
            features: Mutex::new(Features::default()),
            errors: Mutex::new(ErrorLog::default()),
            tenant: crate::state::tenants::TenantSlot::new(n.tenants),
            tls_proven: n.tls_proven,
            write_cache_off: AtomicBool::new(false),
            changed_ns: Mutex::new(Default::default()),
            resv_log: Mutex::new(Default::default()),
        }
    }
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }
    /// The subsystem it serves; None for a discovery controller.
    pub fn subsys(&self) -> Option<&Arc<Subsystem>> {
        self.subsys.as_ref()
    }
    pub fn hostnqn(&self) -> &str {
        &self.hostnqn
    }
    pub fn hostid(&self) -> [u8; 16] {
        self.hostid
    }
    /// The reservation host: the Host ID bound to the host NQN.
    pub fn resv_host(&self) -> crate::state::resv::HostId {
        self.resv_host
    }
    /// The listener its admin queue came through.
    pub fn portid(&self) -> u16 {
        self.portid
    }
    /// Whether its admin queue proved the host's TLS PSK identity.
    pub fn tls_proven(&self) -> bool {
        self.tls_proven
    }
    pub fn is_discovery(&self) -> bool {
        self.subsys.is_none()
    }
    /// The host's QoS tenant, leased now if this is its first QoS I/O.
    #[inline]
    pub fn tenant(&self) -> trellis_qos::sched::TenantId {
        self.tenant.get(&self.hostnqn)
    }
    /// The tenant leased to it, if any I/O to a QoS namespace took one.
    pub fn tenant_assigned(&self) -> Option<trellis_qos::sched::TenantId> {
        self.tenant.assigned()
    }
    pub fn ready(&self) -> bool {
        self.csts.load(Relaxed) & trellis_nvme::fabrics::csts::RDY != 0
    }
    pub fn is_dead(&self) -> bool {
        self.dead.load(Relaxed)
    }
    pub fn kill(&self, why: &str) {
        if !self.dead.swap(true, Relaxed) {
            // Process-wide (a controller does not know its node): any peer
            // can loop connects on an open discovery controller.
            static TEARDOWN_LOG: std::sync::LazyLock<crate::sys::loglimit::LogLimit> =
                std::sync::LazyLock::new(crate::sys::loglimit::LogLimit::default);
            if let Some(left_out) = TEARDOWN_LOG.admit() {
                tracing::info!(cntlid = self.cntlid, host = %self.hostnqn.escape_debug(), left_out, "controller torn down: {why}");
            }
            self.csts
                .fetch_or(trellis_nvme::fabrics::csts::CFS, Relaxed);
        }
    }
    /// Controller Configuration (property 14h).
    pub fn cc(&self) -> u32 {
        self.cc.load(Relaxed)
    }
    /// Writes CC; returns the value it replaced.
    pub fn swap_cc(&self, new: u32) -> u32 {
        self.cc.swap(new, Relaxed)
    }
    /// Controller Status (property 1Ch).
    pub fn csts(&self) -> u32 {
        self.csts.load(Relaxed)
    }
    pub fn set_csts(&self, bits: u32) {
        self.csts.fetch_or(bits, Relaxed);
    }
    pub fn clear_csts(&self, bits: u32) {
        self.csts.fetch_and(!bits, Relaxed);
    }
    /// Keep Alive Timeout (feature 0Fh), 0 = none.
    pub fn kato_ms(&self) -> u32 {
        self.kato_ms.load(Relaxed)
    }
    /// Sets KATO; the timer restarts from `now_ns`.
    pub fn set_kato_ms(&self, kato_ms: u32, now_ns: u64) {
        self.kato_ms.store(kato_ms, Relaxed);
        self.keep_alive(now_ns);
    }
    /// The host showed it is alive (Keep Alive, or enabling the controller).
    pub fn keep_alive(&self, now_ns: u64) {
        self.last_keepalive_ns.store(now_ns, Relaxed);
    }
    pub fn last_keepalive_ns(&self) -> u64 {
        self.last_keepalive_ns.load(Relaxed)
    }
    /// I/O queues granted (Set Features Number of Queues).
    pub fn io_queues(&self) -> u16 {
        self.io_queues.load(Relaxed)
    }
    pub fn set_io_queues(&self, n: u16) {
        self.io_queues.store(n, Relaxed);
    }
    /// The connected queues by QID (0: the admin queue).
    pub fn queues(&self) -> std::sync::MutexGuard<'_, HashMap<u16, QueueInfo>> {
        crate::sys::lock(&self.connected_qids)
    }
    /// Asynchronous Event Configuration (feature 0Bh).
    pub fn async_event_config(&self) -> u32 {
        self.async_event_config.load(Relaxed)
    }
    pub fn set_async_event_config(&self, v: u32) {
        self.async_event_config.store(v, Relaxed);
    }
    /// The host turned the volatile write cache off: writes go through with FUA.
    #[inline]
    pub fn write_cache_off(&self) -> bool {
        self.write_cache_off.load(Relaxed)
    }
    pub fn set_write_cache_off(&self, off: bool) {
        self.write_cache_off.store(off, Relaxed);
    }
    /// Feature values the host set.
    pub fn features(&self) -> std::sync::MutexGuard<'_, Features> {
        crate::sys::lock(&self.features)
    }
    /// The error log (log page 01h).
    pub fn errors(&self) -> std::sync::MutexGuard<'_, ErrorLog> {
        crate::sys::lock(&self.errors)
    }
    /// The Changed Namespace List (log page 04h) not yet read.
    pub fn changed_ns(&self) -> std::sync::MutexGuard<'_, crate::state::aen::ChangedNs> {
        crate::sys::lock(&self.changed_ns)
    }
    /// Reservation notices (log page 80h) and their mask (feature 82h).
    pub fn resv_log(&self) -> std::sync::MutexGuard<'_, crate::state::resv::NoticeLog> {
        crate::sys::lock(&self.resv_log)
    }
    /// Raises an event that no Asynchronous Event Configuration bit gates
    /// (`aen::RESV_LOG`), unless sent and not yet acknowledged.
    pub fn raise_ungated(&self, bit: u32) -> bool {
        if self.aen_masked.fetch_or(bit, Relaxed) & bit != 0 {
            return false;
        }
        self.aen_pending.fetch_or(bit, Relaxed);
        true
    }
    /// Raises asynchronous event `bit` (an Asynchronous Event Configuration
    /// bit) if the host enabled it and has not yet been told: the admin
    /// queue completes an AER with it within its next check.
    pub fn raise_event(&self, bit: u32) -> bool {
        if self.async_event_config.load(Relaxed) & bit == 0
            || self.aen_masked.fetch_or(bit, Relaxed) & bit != 0
        {
            return false;
        }
        self.aen_pending.fetch_or(bit, Relaxed);
        true
    }
    pub fn record_error(&self, e: ErrorEntry) {
        let mut log = self.errors();
        log.count += 1;
        let mut e = e;
        e.error_count = log.count;
        if log.entries.len() == ERROR_LOG_ENTRIES {
            log.entries.pop_back();
        }
        log.entries.push_front(e);
    }
}
