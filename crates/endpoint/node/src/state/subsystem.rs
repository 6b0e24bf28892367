//! Shared state: the registry of subsystems, namespaces and live
//! controllers. Reactors read it on the data path without locks; locks are
//! taken only on the control path (Connect, teardown, error log).

use crate::backend::{self, Backend};
use crate::config::{Config, ListenerConfig, ListenerKind, NamespaceConfig, TargetConfig};
pub use crate::state::controller::{
    Controller, ErrorLog, Features, NewController, QueueInfo, ERROR_LOG_ENTRIES,
};
use crate::state::identity::NodeId;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use trellis_nvme::ana::AnaState;
use trellis_nvme::identify::NamespaceInfo;

/// Per-namespace counters behind the SMART log. Reactors add to them in
/// batches (see `conn::LocalStats`), not once per I/O.
#[derive(Default)]
pub struct NsStats {
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub read_cmds: AtomicU64,
    pub write_cmds: AtomicU64,
    pub media_errors: AtomicU64,
    /// Commands the backend failed, whatever the status (media, capacity,
    /// internal): `trellis_namespace_backend_errors_total`.
    pub backend_errors: AtomicU64,
    /// Write Zeroes commands with the Deallocate bit (DEAC) set.
    pub write_zeroes_deac: AtomicU64,
    /// Writes sent to the backend with Force Unit Access because the host
    /// turned the volatile write cache off (Set Features 06h, WCE = 0).
    pub write_through: AtomicU64,
    /// Command latency on the target (capsule taken to completion), [read,
    /// write], in the buckets of [`crate::state::stats::lat_bucket`].
    pub latency: [[AtomicU64; crate::state::stats::LAT_BUCKETS]; 2],
}

/// A namespace: read by both planes, changed only through its methods
/// (the size grows live; everything else is fixed when it is opened).
pub struct Namespace {
    pub(in crate::state) nsid: u32,
    /// What it was made from (`trellis ctl save`), NSID filled in.
    pub(in crate::state) config: NamespaceConfig,
    /// Index into `Registry::namespaces`; reactors key their backend queues by it.
    pub(in crate::state) uid: usize,
    pub(in crate::state) backend: Arc<dyn Backend>,
    pub(in crate::state) block_size: u32,
    pub(in crate::state) lbads: u8,
    /// Grows live (`trellis ctl namespace resize`): one relaxed load per
    /// command's range check. Read it with [`Namespace::size_blocks`].
    pub(in crate::state) size_blocks: AtomicU64,
    pub(in crate::state) read_only: bool,
    pub(in crate::state) info: NamespaceInfo,
    pub(in crate::state) stats: NsStats,
    /// Traffic control; `Off` keeps the scheduler out of the I/O path.
    pub(in crate::state) qos: crate::config::qos::QosMode,
    /// The drive's capacities when the backend knows them and QoS is on
    /// (`Backend::device_model`, measured at startup).
    pub(in crate::state) device_model: Option<trellis_qos::DeviceModel>,
    /// Its Gimbal scheduler's published state, for `/metrics`.
    pub(in crate::state) qos_board: crate::state::tenants::QosBoard,
    /// Its one Gimbal scheduler (`qos = "gimbal"`), shared by every
    /// reactor, built when the first reactor opens the namespace.
    pub(in crate::state) gimbal: Mutex<Option<Arc<crate::state::gimbal::SharedGimbal>>>,
    /// The backend's `reads_zero()`, kept here so the I/O path makes no
    /// virtual call for it.
    pub(in crate::state) reads_zero: bool,
    /// Writes may hand the backend the receive buffer itself: the backend
    /// completes inside `submit` and no scheduler holds the request.
    pub(in crate::state) write_in_place: bool,
    /// ANA group (ANAGRPID) and its index in `Registry::ana`.
    pub(in crate::state) anagrpid: u32,
    pub(in crate::state) ana_idx: usize,
    /// Reservations (`resv`): checked on every I/O, one load while none is held.
    /// Shared with the namespace's schedulers, which check it again when
    /// they release a request they held (`data::qos`).
    pub(in crate::state) resv: Arc<crate::state::resv::Resv>,
}

impl Namespace {
    pub fn nsid(&self) -> u32 {
        self.nsid
    }
    /// What it was made from (`trellis ctl save`), NSID filled in.
    pub fn config(&self) -> &NamespaceConfig {
        &self.config
    }
    /// Index into `Registry::namespaces`; reactors key their backend queues by it.
    pub fn uid(&self) -> usize {
        self.uid
    }
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }
    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    /// log2 of the block size (Identify's LBADS).
    pub fn lbads(&self) -> u8 {
        self.lbads
    }
    /// Grows the namespace to `blocks` (`trellis ctl namespace resize`,
    /// after the backend grew): never shrinks, so a range checked against
    /// the old size stays inside.
    pub fn grow_to(&self, blocks: u64) {
        // fetch_max: two resizes racing never shrink it (the larger wins).
        self.size_blocks.fetch_max(blocks, Relaxed);
    }
    pub fn read_only(&self) -> bool {
        self.read_only
    }
    pub fn info(&self) -> &NamespaceInfo {
        &self.info
    }
    pub fn stats(&self) -> &NsStats {
        &self.stats
    }
    /// Traffic control; `Off` keeps the scheduler out of the I/O path.
    pub fn qos(&self) -> crate::config::qos::QosMode {
        self.qos
    }
    /// The drive's capacities when the backend knows them and QoS is on.
    pub fn device_model(&self) -> Option<trellis_qos::DeviceModel> {
        self.device_model
    }
    /// Its Gimbal scheduler's published state, for `/metrics`.
    pub fn qos_board(&self) -> &crate::state::tenants::QosBoard {
        &self.qos_board
    }
    /// Its one Gimbal scheduler, built by `build` on first use (cold: when a
    /// reactor opens the namespace's queue); every reactor gets the same.
    pub fn gimbal(
        &self,
        build: impl FnOnce() -> anyhow::Result<crate::state::gimbal::SharedGimbal>,
    ) -> anyhow::Result<Arc<crate::state::gimbal::SharedGimbal>> {
        let mut g = crate::sys::lock(&self.gimbal);
        if let Some(g) = g.as_ref() {
            return Ok(g.clone());
        }
        let made = Arc::new(build()?);
        crate::sys::lock(&self.qos_board).push(made.published.clone());
        *g = Some(made.clone());
        Ok(made)
    }
    /// The backend's `reads_zero()`, without a virtual call.
    #[inline]
    pub fn reads_zero(&self) -> bool {
        self.reads_zero
    }
    /// Writes may hand the backend the receive buffer itself.
    #[inline]
    pub fn write_in_place(&self) -> bool {
        self.write_in_place
    }
    /// ANA group (ANAGRPID) and its index in `Registry::ana`.
    pub fn anagrpid(&self) -> u32 {
        self.anagrpid
    }
    pub fn ana_idx(&self) -> usize {
        self.ana_idx
    }
    /// Reservations: checked on every I/O, one load while none is held.
    #[inline]
    pub fn resv(&self) -> &Arc<crate::state::resv::Resv> {
        &self.resv
    }
    #[inline]
    pub fn size_blocks(&self) -> u64 {
        self.size_blocks.load(Relaxed)
    }

    /// What Identify Namespace reports: `info` at the current size.
    pub fn identify_info(&self) -> NamespaceInfo {
        let mut i = self.info.clone();
        i.size_blocks = self.size_blocks();
        // One fstat per Identify (admin path): what a thin file holds now.
        i.used_blocks = self
            .backend
            .allocated_bytes()
            .map(|b| b / u64::from(self.block_size));
        i
    }
}

pub struct Subsystem {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub allow_any: bool,
    /// Changed live (`trellis ctl host add|remove`); read at Connect and
    /// for the discovery log, never on the I/O path.
    pub allowed_hosts: Mutex<HashSet<String>>,
    /// Index in `Registry::subsystems` and in every `NsSet::subs`: its
    /// namespaces live in the registry's namespace set, which changes.
    pub idx: usize,
    pub controllers: Mutex<HashMap<u16, Arc<Controller>>>,
    /// DH-HMAC-CHAP keys by host NQN (`[[subsystem.host]]`): a host here
    /// is allowed, and must authenticate every queue before using it.
    pub dhchap: HashMap<String, Arc<crate::config::keys::HostKeys>>,
    /// Configured TLS PSKs by host NQN (`[[subsystem.host]] tls_key`): a
    /// host here is allowed; TLS listeners accept its identity.
    pub tls: HashMap<String, crate::config::keys::HostPsk>,
    /// The listeners that carry it (`[[subsystem]] listeners`, by name or
    /// IP:PORT); None: the default rule of [`carried_by`](Self::carried_by).
    pub listeners: Option<Vec<String>>,
    /// A host of it has only a TLS PSK (`config::psk_only_host`).
    pub psk_only_host: bool,
}

/// The NSIDs a subsystem may hold, and Identify Controller's NN and MNAN
/// (unless the config uses a larger NSID): fixed for a controller's life,
/// so that namespaces added while a host is connected are within them.
/// 1024, as Linux nvmet's NVMET_MAX_NAMESPACES.
pub const MAX_NSID: u32 = 1024;

impl Subsystem {
    /// Whether `hostnqn` may connect over a channel that has proven
    /// `tls_host` (the host NQN of the TLS PSK identity the connection's
    /// handshake used; None on a plain connection).
    ///
    /// A host NQN that has a key must prove it, whatever `allowed_hosts`
    /// and `allow_any_host` say (docs/security.md, "Who may connect"): a
    /// host whose only credential is a TLS PSK is admitted only over a TLS
    /// channel whose identity names it, so claiming its NQN over plain TCP
    /// gains nothing; a host with a DH-HMAC-CHAP secret is admitted on any
    /// channel and must then authenticate before any other command
    /// (`data::nvme::auth::refuses`).
    pub fn admits(&self, hostnqn: &str, tls_host: Option<&str>) -> bool {
        if self.dhchap.contains_key(hostnqn) {
            return true;
        }
        if self.tls.contains_key(hostnqn) {
            return tls_host == Some(hostnqn);
        }
        self.allow_any || crate::sys::lock(&self.allowed_hosts).contains(hostnqn)
    }

    /// Whether `hostnqn` can use a listener whose secure channel is
    /// `secure`: as [`admits`](Self::admits) for a connection that proves
    /// its PSK on a TLS listener. What the discovery log lists for a host.
    pub fn admits_on(&self, hostnqn: &str, secure: Option<crate::config::SecureChannel>) -> bool {
        let tls_host = secure.is_some().then_some(hostnqn);
        self.admits(hostnqn, tls_host)
    }
}

impl Subsystem {
    /// Whether listener `l` carries this subsystem: a Connect to it through
    /// another listener is refused and the discovery log lists it on no
    /// other (nvmet's `ports/*/subsystems`). Named listeners if configured,
    /// else every I/O listener, or only the TLS ones when a host has only
    /// a TLS PSK, so such a subsystem is never on a plain port by default.
    pub fn carried_by(&self, l: &ListenerInfo) -> bool {
        if l.kind != ListenerKind::Both {
            return false;
        }
        match &self.listeners {
            Some(names) => names
                .iter()
                .any(|n| crate::config::answers_to(l.name.as_deref(), l.addr, n)),
            None => !self.psk_only_host || l.secure.is_some(),
        }
    }
}

impl Registry {
    /// What Identify Controller advertises for ANA: fixed, whatever the
    /// namespaces, since Linux sizes its ANA log buffer from it at connect.
    pub fn ana_caps(&self) -> trellis_nvme::identify::AnaCaps {
        let (nanagrpid, anagrpmax) = self.ana.limits();
        trellis_nvme::identify::AnaCaps {
            anatt_s: crate::state::ana::ANATT_S,
            anacap: crate::state::ana::ANACAP,
            anagrpmax,
            nanagrpid,
        }
    }
}

pub struct ListenerInfo {
    /// `name` from its config: what subsystems' `listeners` may call it.
    pub name: Option<String>,
    pub addr: SocketAddr,
    pub kind: ListenerKind,
    pub portid: u16,
    /// TLS on this listener (None: plain TCP only).
    pub secure: Option<crate::config::SecureChannel>,
}

/// Everything both planes share. Its fields are private to the state wing:
/// the others read them through the methods below and change them only
/// through named operations (`alloc_uid`, `alloc_cntlid`, the tables' own
/// methods).
pub struct Registry {
    /// The configuration the target started with (`live_config` adds the
    /// changes made since).
    pub(in crate::state) config: Config,
    pub(in crate::state) limits: TargetConfig,
    /// Held (locked) for the registry's life: see [`crate::state::identity`].
    pub(in crate::state) node: NodeId,
    /// Large command buffers kept across commands (`large_buffer_budget`).
    pub(in crate::state) buffer_budget: Arc<crate::state::buf::BufferBudget>,
    /// Whether commands may reach the backend now (the HA lease's serve
    /// deadline; always without `[ha]`). Checked at execution.
    pub(in crate::state) fence: Arc<crate::state::fence::Fence>,
    /// Connections per peer address (`target.max_connections_per_addr`).
    pub(in crate::state) peer_budget: Arc<crate::state::conns::PeerBudget>,
    /// Bytes that large transfers hold in flight (`target.transfer_pool`).
    pub(in crate::state) transfer_pool: Arc<crate::state::buf::TransferPool>,
    /// Schedulers' configuration and the host NQN → tenant map (`qos`).
    pub(in crate::state) qos: crate::config::qos::QosConfig,
    pub(in crate::state) tenants: Arc<crate::state::tenants::Tenants>,
    /// Live: added and removed while running (`livesub`).
    pub(in crate::state) subsystems: crate::state::subsystems::SubsystemTable,
    /// Every namespace, by uid and by subsystem; changes while running.
    pub(in crate::state) ns: crate::state::nsset::NsCell,
    /// NN and MNAN: `MAX_NSID`, or the config's largest NSID.
    pub(in crate::state) nn: u32,
    /// The next namespace uid (never reused).
    pub(in crate::state) next_uid: AtomicUsize,
    /// Live: added and removed while running (`livelisten`).
    pub(in crate::state) listeners: crate::state::listeners::ListenerTable,
    /// Discovery controllers live here (they belong to no subsystem).
    pub(in crate::state) discovery_controllers: Mutex<HashMap<u16, Arc<Controller>>>,
    pub(in crate::state) next_cntlid: Mutex<u16>,
    pub(in crate::state) discovery_genctr: AtomicU64,
    /// Referrals and entries merged from other nodes (`discovery`).
    pub(in crate::state) disc: crate::state::discovery::DiscoveryState,
    pub(in crate::state) started: std::time::Instant,
    /// Power-on time and unsafe shutdowns per namespace, kept across
    /// restarts (`state::health`).
    pub(in crate::state) health: crate::state::health::Health,
    /// The failure predictor's verdicts (`control::drive_health`).
    pub(in crate::state) verdicts: crate::state::health::Verdicts,
    /// The node's temperature sensors (`sys::thermal`), found at start,
    /// and their hottest last reading (K, 0: none), refreshed by the
    /// health thread.
    pub(in crate::state) node_sensors: Vec<std::path::PathBuf>,
    pub(in crate::state) node_temperature_k: std::sync::atomic::AtomicU16,
    /// Per reactor: wall time spent in loops that did work, ns (published
    /// about once a millisecond, for `/metrics`). Padded so that reactors on
    /// different cores never write one cache line.
    pub(in crate::state) reactor_busy_ns: Vec<crate::state::stats::PaddedCounter>,
    /// Preempt and Abort's wait for the commands past their reservation
    /// check on every reactor (`drain`).
    pub(in crate::state) drain: crate::state::drain::Drain,
    /// Per reactor: durations of its loops that did work, in the buckets of
    /// `exec::lat_bucket` (published with the busy time).
    pub(in crate::state) reactor_loop_hist: Vec<[AtomicU64; crate::state::stats::LAT_BUCKETS]>,
    /// Connections closed, by `CloseKind` (indexed by its discriminant).
    pub(in crate::state) conn_closed: [AtomicU64; crate::state::stats::CloseKind::ALL.len()],
    /// ANA state per (listener, group).
    pub(in crate::state) ana: crate::state::ana::AnaTable,
    /// An HA pair's shared reservation state (set when `[ha]` starts).
    pub(in crate::state) shared_resv: std::sync::OnceLock<Arc<dyn crate::state::resv::SharedResv>>,
    /// Rate limits of the log lines peers can trigger (`sys::loglimit`).
    pub(in crate::state) log_limits: crate::sys::loglimit::NodeLogLimits,
}

impl Registry {
    pub fn config(&self) -> &Config {
        &self.config
    }
    pub fn limits(&self) -> &TargetConfig {
        &self.limits
    }
    pub fn node(&self) -> &NodeId {
        &self.node
    }
    pub fn buffer_budget(&self) -> &Arc<crate::state::buf::BufferBudget> {
        &self.buffer_budget
    }
    pub fn fence(&self) -> &Arc<crate::state::fence::Fence> {
        &self.fence
    }
    /// Where reservation commands also save (an HA pair); None: nowhere.
    pub fn shared_resv(&self) -> Option<&dyn crate::state::resv::SharedResv> {
        self.shared_resv.get().map(|s| &**s)
    }
    /// Once, when `[ha]` starts (before the node can serve).
    pub fn set_shared_resv(&self, s: Arc<dyn crate::state::resv::SharedResv>) {
        if self.shared_resv.set(s).is_err() {
            tracing::warn!("shared reservation state set twice: the first one stays");
        }
    }
    /// Before this node of an HA pair serves: every namespace's
    /// reservations from the pair's shared copy. Returns the registrants loaded.
    pub fn load_shared_resv(&self) -> anyhow::Result<usize> {
        let Some(sh) = self.shared_resv() else {
            return Ok(0);
        };
        let mut n = 0;
        for ns in self.ns.load().all() {
            n += ns
                .resv
                .load_shared(sh)
                .map_err(|e| anyhow::anyhow!("namespace {}: {e:#}", ns.nsid))?;
        }
        Ok(n)
    }
    /// Preempt and Abort's wait for the commands past their reservation check.
    pub fn drain(&self) -> &crate::state::drain::Drain {
        &self.drain
    }
    pub fn log_limits(&self) -> &crate::sys::loglimit::NodeLogLimits {
        &self.log_limits
    }
    pub fn peer_budget(&self) -> &Arc<crate::state::conns::PeerBudget> {
        &self.peer_budget
    }
    pub fn transfer_pool(&self) -> &Arc<crate::state::buf::TransferPool> {
        &self.transfer_pool
    }
    pub fn qos(&self) -> &crate::config::qos::QosConfig {
        &self.qos
    }
    pub fn tenants(&self) -> &Arc<crate::state::tenants::Tenants> {
        &self.tenants
    }
    pub fn subsystems(&self) -> &crate::state::subsystems::SubsystemTable {
        &self.subsystems
    }
    pub fn ns(&self) -> &crate::state::nsset::NsCell {
        &self.ns
    }
    pub fn listeners(&self) -> &crate::state::listeners::ListenerTable {
        &self.listeners
    }
    pub fn discovery_controllers(&self) -> &Mutex<HashMap<u16, Arc<Controller>>> {
        &self.discovery_controllers
    }
    pub fn disc(&self) -> &crate::state::discovery::DiscoveryState {
        &self.disc
    }
    pub fn reactor_busy_ns(&self) -> &Vec<crate::state::stats::PaddedCounter> {
        &self.reactor_busy_ns
    }
    pub fn reactor_loop_hist(&self) -> &Vec<[AtomicU64; crate::state::stats::LAT_BUCKETS]> {
        &self.reactor_loop_hist
    }
    pub fn conn_closed(&self) -> &[AtomicU64; crate::state::stats::CloseKind::ALL.len()] {
        &self.conn_closed
    }
    pub fn ana(&self) -> &crate::state::ana::AnaTable {
        &self.ana
    }
    /// NN and MNAN: `MAX_NSID`, or the config's largest NSID.
    pub fn nn(&self) -> u32 {
        self.nn
    }
    /// A fresh namespace uid (never reused).
    pub fn alloc_uid(&self) -> usize {
        self.next_uid.fetch_add(1, Relaxed)
    }
    /// The discovery log's generation counter (GENCTR).
    pub fn discovery_genctr(&self) -> u64 {
        self.discovery_genctr.load(Relaxed)
    }
    /// Power-on time and unsafe shutdowns per namespace (SMART log).
    pub fn health(&self) -> &crate::state::health::Health {
        &self.health
    }
    pub fn verdicts(&self) -> &crate::state::health::Verdicts {
        &self.verdicts
    }
    /// The node's hottest sensor as last read, else the nominal value
    /// (`sys::thermal::NO_SENSOR_TEMPERATURE_K`).
    pub fn node_temperature_k(&self) -> u16 {
        match self.node_temperature_k.load(Relaxed) {
            0 => crate::sys::thermal::NO_SENSOR_TEMPERATURE_K,
            k => k,
        }
    }
    /// Reads the node's sensors and every namespace's drive health again
    /// (the health thread's, every second; never a reactor's).
    pub fn refresh_health(&self) {
        let k = crate::sys::thermal::hottest_k(&self.node_sensors).unwrap_or(0);
        self.node_temperature_k.store(k, Relaxed);
        for ns in self.ns().load().all() {
            ns.backend().refresh_health();
        }
    }
    /// Time since the registry was built.
    pub fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }
    /// The controller ID the next Connect tries first.
    pub fn next_cntlid(&self) -> u16 {
        *crate::sys::lock(&self.next_cntlid)
    }
    /// Starts controller IDs again from `target.cntlid_min` (the fuzzer's
    /// reset between inputs, so every run sees the same IDs).
    pub fn reset_cntlids(&self) {
        *crate::sys::lock(&self.next_cntlid) = self.limits.cntlid_min;
    }
}

impl Registry {
    /// Takes the node identity, then opens every backend the config names.
    pub fn build(cfg: &Config) -> anyhow::Result<Registry> {
        let node = NodeId::acquire(&state_dir(cfg))?;
        tracing::info!("node identity {} ({})", node.uuid(), node.path().display());
        Registry::build_with(cfg, node)
    }

    /// Opens every backend the config names, under the identity `node`.
    /// Long (over 70 lines) on purpose: it fills the registry's fields in
    /// declaration order, and splitting it would pass half-built state
    /// between helpers.
    pub fn build_with(cfg: &Config, node: NodeId) -> anyhow::Result<Registry> {
        let mut all_ns = Vec::new();
        let mut subsystems = Vec::new();
        let mut seen = HashMap::new();
        let ana = crate::state::ana::AnaTable::new(
            cfg.subsystems
                .iter()
                .flat_map(|s| s.namespaces.iter().enumerate().map(|(i, n)| anagrpid(n, i))),
            &cfg.listeners
                .iter()
                .map(|l| l.ana_state.unwrap_or(AnaState::Optimized))
                // Slots for listeners added live, which copy their states
                // before they accept (`livelisten`); inaccessible until then.
                .chain(std::iter::repeat_n(
                    AnaState::Inaccessible,
                    crate::state::listeners::MAX_LISTENERS_ADDED,
                ))
                .collect::<Vec<_>>(),
        );
        let mut subs_ns = Vec::new();
        for (idx, s) in cfg.subsystems.iter().enumerate() {
            let serial = node.serial(s);
            tracing::info!(subsystem = %s.nqn, "serial {serial}");
            unique(&mut seen, format!("serial {serial}"), &s.nqn)?;
            let mut nss = Vec::new();
            for (i, n) in s.namespaces.iter().enumerate() {
                let max_regs = cfg.target.max_registrants;
                let ns = open_namespace(&node, &s.nqn, i, n, all_ns.len(), &ana, max_regs)?;
                let hex = crate::sys::hex;
                for key in [
                    format!("uuid {}", hex(&ns.info.uuid)),
                    format!("nguid {}", hex(&ns.info.nguid)),
                    format!("eui64 {}", hex(&ns.info.eui64)),
                ] {
                    unique(&mut seen, key, &format!("nsid {} of {}", ns.nsid, s.nqn))?;
                }
                all_ns.push(ns.clone());
                nss.push(ns);
            }
            subs_ns.push(crate::state::nsset::SubNs::new(nss));
            subsystems.push(Arc::new(Subsystem {
                nqn: s.nqn.clone(),
                serial,
                model: s.model.clone(),
                allow_any: s.allow_any(),
                allowed_hosts: Mutex::new(s.allowed_hosts.iter().cloned().collect()),
                idx,
                controllers: Mutex::new(HashMap::new()),
                dhchap: crate::config::keys::subsystem_keys(s)?,
                tls: crate::config::keys::subsystem_psks(s)?,
                listeners: s.listeners.clone(),
                psk_only_host: crate::config::psk_only_host(s).is_some(),
            }));
        }
        let health_file = node.path().file_name().and_then(|n| {
            node.state_file(&format!(
                "{}{}",
                n.to_string_lossy(),
                crate::state::health::HEALTH_FILE_SUFFIX
            ))
        });
        let nguids: Vec<[u8; 16]> = all_ns.iter().map(|n| n.info.nguid).collect();
        let health = crate::state::health::Health::open(health_file, &nguids);
        let node_sensors = crate::sys::thermal::node_sensors();
        if node_sensors.is_empty() {
            tracing::info!(
                "no temperature sensor on this node: SMART reports {} K (nominal) for namespaces without a drive sensor of their own",
                crate::sys::thermal::NO_SENSOR_TEMPERATURE_K
            );
        }
        let nn = cfg
            .subsystems
            .iter()
            .flat_map(|s| s.namespaces.iter().enumerate())
            .map(|(i, n)| n.nsid.unwrap_or(i as u32 + 1))
            .fold(MAX_NSID, u32::max);
        let listeners = cfg
            .listeners
            .iter()
            .enumerate()
            .map(|(i, l): (usize, &ListenerConfig)| ListenerInfo {
                name: l.name.clone(),
                addr: l.addr,
                kind: l.kind(),
                portid: i as u16 + 1,
                secure: l.secure_channel,
            })
            .collect();
        Ok(Registry {
            config: cfg.clone(),
            limits: cfg.target.clone(),
            node,
            buffer_budget: Arc::new(crate::state::buf::BufferBudget::new(
                cfg.target.large_buffer_budget.0,
            )),
            peer_budget: Arc::new(crate::state::conns::PeerBudget::new(
                cfg.target.connections_per_addr(),
            )),
            transfer_pool: Arc::new(crate::state::buf::TransferPool::new(
                cfg.target.transfer_pool.0,
            )),
            fence: Arc::new(match cfg.ha {
                Some(_) => crate::state::fence::Fence::stopped(),
                None => crate::state::fence::Fence::always(),
            }),
            qos: cfg.qos.clone(),
            tenants: Arc::new(
                crate::state::tenants::Tenants::new(&cfg.tenants, &cfg.qos.limits)
                    .with_log_limit(cfg.target.log_burst, cfg.target.log_lines_per_sec),
            ),
            log_limits: crate::sys::loglimit::NodeLogLimits::new(
                cfg.target.log_burst,
                cfg.target.log_lines_per_sec,
            ),
            subsystems: crate::state::subsystems::SubsystemTable::new(subsystems, &cfg.subsystems),
            next_uid: AtomicUsize::new(all_ns.len()),
            ns: crate::state::nsset::NsCell::new(crate::state::nsset::NsSet {
                gen: 1,
                by_uid: all_ns.into_iter().map(Some).collect(),
                subs: subs_ns,
            }),
            nn,
            listeners: crate::state::listeners::ListenerTable::new(listeners, &cfg.listeners),
            discovery_controllers: Mutex::new(HashMap::new()),
            next_cntlid: Mutex::new(cfg.target.cntlid_min),
            discovery_genctr: AtomicU64::new(1),
            disc: crate::state::discovery::DiscoveryState::new(&cfg.referrals),
            started: std::time::Instant::now(),
            health,
            verdicts: Default::default(),
            node_temperature_k: crate::sys::thermal::hottest_k(&node_sensors)
                .unwrap_or(0)
                .into(),
            node_sensors,
            drain: crate::state::drain::Drain::new(cfg.target.reactors),
            reactor_busy_ns: (0..cfg.target.reactors)
                .map(|_| Default::default())
                .collect(),
            conn_closed: Default::default(),
            reactor_loop_hist: (0..cfg.target.reactors)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            shared_resv: std::sync::OnceLock::new(),
            ana,
        })
    }

    pub fn subsystem(&self, nqn: &str) -> Option<&Arc<Subsystem>> {
        self.subsystems.iter().find(|s| s.nqn == nqn)
    }

    /// The DH-HMAC-CHAP keys a discovery controller of `hostnqn` must
    /// authenticate with: with `target.discovery_dhchap`, those of the
    /// first live subsystem (live-added ones included) that has a secret
    /// for the host, which validation makes the same secret in every
    /// subsystem (`config::keys::check_discovery_secrets`); else None, as
    /// nvmet never authenticates discovery.
    pub fn discovery_keys(&self, hostnqn: &str) -> Option<Arc<crate::config::keys::HostKeys>> {
        if !self.limits.discovery_dhchap {
            return None;
        }
        self.subsystems
            .iter()
            .find_map(|s| s.dhchap.get(hostnqn))
            .cloned()
    }

    /// Allocates a controller ID in `cntlid_min..=cntlid_max` (default
    /// 1..=0xFFEF) unique among live controllers, advancing round-robin so a
    /// just-freed ID is not handed out again at once.
    pub fn alloc_cntlid(&self, in_use: &dyn Fn(u16) -> bool) -> Option<u16> {
        let (lo, hi) = (self.limits.cntlid_min.max(1), self.limits.cntlid_max);
        let mut next = crate::sys::lock(&self.next_cntlid);
        for _ in lo..=hi {
            let id = (*next).clamp(lo, hi);
            *next = if id >= hi { lo } else { id + 1 };
            if !in_use(id) {
                return Some(id);
            }
        }
        None
    }

    pub fn uptime_hours(&self) -> u64 {
        self.started.elapsed().as_secs() / 3600
    }
}

/// The state directory of `cfg`: configured, else the default chain.
pub fn state_dir(cfg: &Config) -> std::path::PathBuf {
    cfg.target
        .state_dir
        .clone()
        .unwrap_or_else(crate::config::default_state_dir)
}

/// Refuses a second namespace or subsystem with the same identifier (an
/// explicit value equal to another one, explicit or derived).
fn unique(seen: &mut HashMap<String, String>, key: String, owner: &str) -> anyhow::Result<()> {
    if let Some(first) = seen.insert(key.clone(), owner.to_string()) {
        anyhow::bail!(
            "{owner} has the same {key} as {first}: give one of them another value in the config"
        );
    }
    Ok(())
}

/// Says at start what Gimbal will be calibrated to: the measured drive,
/// a namespace without a drive, or only a PCIe link.
fn log_device_model(s: &str, nsid: u32, m: &trellis_qos::DeviceModel, describe: String) {
    if m.read_4k_iops > 0 {
        tracing::info!(
            subsystem = %s,
            nsid,
            "drive model: 4 KiB random read {} IOPS, read {} MB/s, {} % of it at {} × 128 KiB in flight, link {} MB/s",
            m.read_4k_iops,
            m.read_bytes_per_s / 1_000_000,
            trellis_ssd::SATURATION_PERMILLE / 10,
            m.read_128k_saturation_qd,
            m.link_bytes_per_s / 1_000_000
        );
    } else if m.link_bytes_per_s == crate::backend::NO_DRIVE_LINK_BYTES_PER_S {
        tracing::info!(
            subsystem = %s,
            nsid,
            "no drive ({}): Gimbal's rate ceiling rises to {} MB/s, so only the reactor's CPU bounds it",
            describe,
            m.link_bytes_per_s / 1_000_000
        );
    } else {
        tracing::info!(
            subsystem = %s,
            nsid,
            "drive: PCIe link {} MB/s (sysfs); Gimbal's per-I/O cost and slots stay as configured",
            m.link_bytes_per_s / 1_000_000
        );
    }
}

/// Opens namespace `i` of subsystem `s` with its backend and identifiers.
pub(crate) fn open_namespace(
    node: &NodeId,
    s: &str,
    i: usize,
    n: &NamespaceConfig,
    uid: usize,
    ana: &crate::state::ana::AnaTable,
    max_registrants: usize,
) -> anyhow::Result<Arc<Namespace>> {
    let nsid = n.nsid.unwrap_or(i as u32 + 1);
    let grpid = anagrpid(n, i);
    let ana_idx = ana.add_group(grpid).ok_or_else(|| {
        let (slots, max) = ana.limits();
        anyhow::anyhow!("ANA group {grpid}: use 1..={max}, with at most {slots} groups on the node")
    })?;
    let backend = if n.backend == crate::config::BackendKind::NvmeTcp && n.hostnqn.is_none() {
        // Distinct nodes are distinct hosts (and registrants) to the remote.
        let mut n = n.clone();
        n.hostnqn = Some(backend::remote::default_hostnqn(&node.uuid().to_string()));
        backend::open(&n)?
    } else {
        backend::open(n)?
    };
    let bs = n.block_size;
    let size_blocks = backend.size_bytes() / bs as u64;
    anyhow::ensure!(
        size_blocks > 0,
        "namespace {nsid} of {} is smaller than a block",
        s
    );
    let ids = node.namespace_ids(s, nsid, n);
    let info = NamespaceInfo {
        size_blocks,
        lbads: bs.trailing_zeros() as u8,
        nguid: ids.nguid,
        eui64: ids.eui64,
        uuid: ids.uuid,
        read_only: n.read_only,
        deallocate_reads_zeroes: backend.deallocate_reads_zeroes(),
        anagrpid: grpid,
        rescap: trellis_nvme::resv::RESCAP_ALL,
        used_blocks: None,
    };
    tracing::info!(subsystem = %s, nsid, "namespace: {}; {ids}", backend.describe());
    // Keyed by NGUID: unique per namespace on the node and stable across
    // restarts (derived from the node identity, or configured).
    let resv_file = node.state_file(&format!("resv-{}.json", crate::sys::hex(&ids.nguid)));
    let resv = crate::state::resv::Resv::open(resv_file, max_registrants)?
        .named(crate::sys::hex(&ids.nguid));
    // Measured here, at startup, not on a reactor's first I/O.
    let device_model = (n.qos == crate::config::qos::QosMode::Gimbal)
        .then(|| backend.device_model())
        .flatten();
    if let Some(m) = &device_model {
        log_device_model(s, nsid, m, backend.describe());
    }
    let mut config = n.clone();
    config.nsid = Some(nsid);
    Ok(Arc::new(Namespace {
        nsid,
        config,
        uid,
        reads_zero: backend.reads_zero(),
        write_in_place: backend.synchronous() && n.qos == crate::config::qos::QosMode::Off,
        backend,
        block_size: bs,
        lbads: bs.trailing_zeros() as u8,
        size_blocks: AtomicU64::new(size_blocks),
        read_only: n.read_only,
        info,
        stats: NsStats::default(),
        qos: n.qos,
        device_model,
        qos_board: Default::default(),
        gimbal: Mutex::new(None),
        anagrpid: grpid,
        ana_idx,
        resv: Arc::new(resv),
    }))
}

/// The ANA group of namespace `i` of a subsystem: `ana_group`, else its NSID.
pub(crate) fn anagrpid(n: &NamespaceConfig, i: usize) -> u32 {
    n.ana_group.unwrap_or(n.nsid.unwrap_or(i as u32 + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_identifiers_equal_to_another_namespace_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::embedded_default();
        cfg.target.state_dir = Some(dir.path().into());
        let mut n =
            crate::config::NamespaceConfig::sized(crate::config::BackendKind::Null, 1 << 20);
        n.eui64 = Some("02:00:00:00:00:00:00:01".into());
        cfg.subsystems[0].namespaces = vec![n.clone(), n];
        let e = Registry::build(&cfg).err().unwrap().to_string();
        assert!(
            e.contains("eui64 0200000000000001") && e.contains("nsid 2"),
            "{e}"
        );
    }

    #[test]
    fn cntlid_allocation_skips_live_ids() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::embedded_default();
        cfg.target.state_dir = Some(dir.path().into());
        let r = Registry::build(&cfg).unwrap();
        let a = r.alloc_cntlid(&|_| false).unwrap();
        let b = r.alloc_cntlid(&|id| id == a + 1).unwrap();
        assert_eq!(b, a + 2);
        // A configured range (one node of an HA pair): only IDs in it, and
        // none once all of them are live.
        cfg.target.cntlid_min = 0x8000;
        cfg.target.cntlid_max = 0x8001;
        let r = Registry::build(&cfg).unwrap();
        assert_eq!(r.alloc_cntlid(&|_| false), Some(0x8000));
        assert_eq!(r.alloc_cntlid(&|_| false), Some(0x8001));
        assert_eq!(
            r.alloc_cntlid(&|_| false),
            Some(0x8000),
            "wraps within the range"
        );
        assert_eq!(r.alloc_cntlid(&|_| true), None);
        cfg.target.cntlid_min = 0;
        let e = cfg.validate().unwrap_err().to_string();
        assert!(e.contains("cntlid_min = 0"), "{e}");
    }
}
