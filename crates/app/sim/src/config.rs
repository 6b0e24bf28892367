//! Scenario configuration (TOML or JSON). Every mechanism is a switch, so the
//! baselines are configurations, not hand-written numbers.

use serde::{Deserialize, Serialize};
use trellis_fabric::isr::IsrConfig;
use trellis_fabric::reserve::ReserveConfig;
use trellis_fabric::ssd_credit::LimiterConfig;
use trellis_qos::sched::SchedLimits;
use trellis_qos::GimbalConfig;
use trellis_ssd::{Precondition, SsdProfile};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    pub name: String,
    pub seed: u64,
    pub duration_ns: u64,
    pub warmup_ns: u64,
    /// Width of the throughput time-series bins.
    pub bin_ns: u64,
    pub topology: TopologyConfig,
    pub ssd: SsdConfig,
    pub mechanisms: Mechanisms,
    pub workload: WorkloadConfig,
    pub failures: Vec<FailureConfig>,
    pub isr: IsrConfig,
    pub reserve: ReserveConfig,
    pub limiter: LimiterConfig,
    pub gimbal: GimbalConfig,
    /// Derive Gimbal's drive-specific constants from the SSD model, as the daemon does
    /// on an emulated drive (`[qos] calibrate = "auto"`, docs/gimbal.md "Calibration").
    /// Off by default: the reproductions keep Gimbal's published constants.
    pub gimbal_calibrate: bool,
    /// Bounds of each SSD's scheduler (tenant table, queues, request table).
    pub sched: SchedLimits,
}

impl SimConfig {
    /// The Gimbal parameters every SSD's scheduler runs with: `gimbal`, calibrated to
    /// `profile` when `gimbal_calibrate` is set (the same code as the daemon's).
    pub fn gimbal_for(&self, profile: &SsdProfile) -> GimbalConfig {
        if self.gimbal_calibrate {
            self.gimbal.calibrated(&trellis_ssd::calibrate(profile))
        } else {
            self.gimbal.clone()
        }
    }
}

/// The simulator's scheduler bounds: the library defaults (64 tenants, 1024 queued per
/// tenant), except that request tables start empty and grow to their peak (presets
/// have up to 4,000 SSDs, most of them idle at any time) and hold up to 2^20 requests
/// (device events carry the tag index in 20 bits), so that only a tenant's own queue
/// bound, not its neighbours' load, makes its commands bounce.
pub fn sim_sched_limits() -> SchedLimits {
    SchedLimits {
        max_requests: 1 << 20,
        prealloc_requests: 0,
        ..SchedLimits::default()
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            name: "default".into(),
            seed: 1,
            duration_ns: 20_000_000,
            warmup_ns: 2_000_000,
            bin_ns: 100_000,
            topology: TopologyConfig::default(),
            ssd: SsdConfig::default(),
            mechanisms: Mechanisms::all_on(),
            workload: WorkloadConfig::default(),
            failures: Vec::new(),
            isr: IsrConfig::default(),
            reserve: ReserveConfig::default(),
            limiter: LimiterConfig::default(),
            gimbal: GimbalConfig::default(),
            gimbal_calibrate: false,
            sched: sim_sched_limits(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopologyKind {
    /// Single top-of-rack switch; each storage node has `uplinks` ports to it.
    Tor,
    /// Leaf-spine: `leaves` leaves, `spines` spines, `leaf_uplinks` links leaf→each spine.
    LeafSpine,
    Ring,
    Torus2d,
    Torus3d,
    /// Groups of `group_size` fully connected nodes, one global link per group pair.
    Dragonfly,
}

impl TopologyKind {
    pub fn is_switched(self) -> bool {
        matches!(self, TopologyKind::Tor | TopologyKind::LeafSpine)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopologyConfig {
    pub kind: TopologyKind,
    pub storage_nodes: u32,
    /// Torus dimensions; empty = as cubic/square as possible for `storage_nodes`.
    pub dims: Vec<u32>,
    /// Total network bandwidth of one storage node, split over its ports.
    pub node_gbps: u64,
    /// Switched: ports per storage node (teamed, per-flow hashing). Ignored for switchless.
    pub uplinks: u32,
    /// Switched (`tor`): ports per switch. Storage and host ports beyond one
    /// switch are connected by the rule the cost model prices
    /// (`cost::SwitchPlan`): parallel planes, or a leaf-spine (default 32, the
    /// 32-port switches of the paper's bill and of docs/cost-model.md).
    pub switch_ports: u32,
    pub leaves: u32,
    pub spines: u32,
    pub leaf_uplinks: u32,
    pub group_size: u32,
    pub hosts: u32,
    /// Link rate of each client port.
    pub host_gbps: u64,
    /// Ports per client (default 1). Switched: each port to a switch (a team on one ToR,
    /// spread over planes); switchless: port k of client i to storage node (i + k) mod
    /// nodes, so a client reaches k nodes over disjoint first hops. The client picks a
    /// port per I/O as any node does (ISR, or per-flow ECMP).
    pub host_ports: u32,
    pub prop_ns: u64,
    /// Extra latency of one more adapter hop for a whole I/O (2.9 µs measured for a 4 KiB
    /// read: [NSDI'26], second-hand, unverified; docs/sources.md); half is charged to each
    /// direction. Wire time is extra.
    pub adapter_hop_ns: u64,
    pub switch_hop_ns: u64,
    /// Largest write whose data ride in the command capsule; larger writes take an R2T
    /// round trip (16 KiB: Linux nvmet-tcp's default inline data size; docs/sim.md).
    pub inline_data_bytes: u32,
    /// Floor of the NVMe/TCP connections' retransmission timeout (Linux TCP_RTO_MIN,
    /// 200 ms; docs/sim.md). A lost packet's I/O is resent after the connection's RTO.
    pub tcp_rto_min_ns: u64,
    /// Each connection direction sends within an ACK-clocked congestion window
    /// (`crate::net::tcp_window`; docs/sim.md). Off: PDUs leave at once, as before.
    pub tcp_window: bool,
    /// With windows on: a loss is found from later deliveries on the same connection
    /// (RACK, RFC 8985, Linux's default with SACK) and the I/O resent then; off, or
    /// with nothing delivered after it, it waits for the RTO (docs/sim.md).
    pub tcp_rack: bool,
    /// Initial congestion window, segments (10: RFC 6928, Linux TCP_INIT_CWND).
    pub tcp_init_cwnd_segments: u32,
    /// The receiver's advertised window, the cap of the congestion window (3 MiB: half
    /// of Linux's default tcp_rmem maximum of 6 MiB, tcp_adv_win_scale = 1; docs/sim.md).
    pub tcp_rwnd_bytes: u64,
    /// Private drop-tail buffer of each adapter and host egress port.
    pub queue_bytes: u64,
    /// Each switch's shared buffer (Tomahawk-class, 16 MB) and its dynamic-threshold
    /// alpha as log2 (3: alpha = 8, SONiC's lossy default); docs/sim.md.
    pub switch_buffer_bytes: u64,
    pub switch_dt_alpha_log2: i8,
    pub mtu_bytes: u32,
    /// Ethernet + IP + TCP framing per packet.
    pub frame_overhead_bytes: u32,
}

impl Default for TopologyConfig {
    fn default() -> Self {
        TopologyConfig {
            kind: TopologyKind::Torus2d,
            storage_nodes: 4,
            dims: Vec::new(),
            node_gbps: 400,
            uplinks: 4,
            switch_ports: 32,
            leaves: 2,
            spines: 1,
            leaf_uplinks: 4,
            group_size: 4,
            hosts: 4,
            host_gbps: 100,
            host_ports: 1,
            prop_ns: 100,
            adapter_hop_ns: 2_900,
            switch_hop_ns: 800,
            inline_data_bytes: 16 << 10,
            tcp_rto_min_ns: 200_000_000,
            tcp_window: true,
            tcp_rack: true,
            tcp_init_cwnd_segments: 10,
            tcp_rwnd_bytes: 3 << 20,
            queue_bytes: 4 << 20,
            switch_buffer_bytes: 16 << 20,
            switch_dt_alpha_log2: 3,
            mtu_bytes: 9000,
            frame_overhead_bytes: 78,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SsdConfig {
    /// Built-in profile name (femu, nvmevirt-970pro, pm9a3-gen4) unless `custom` is set.
    pub profile: String,
    pub custom: Option<SsdProfile>,
    pub per_node: u32,
    /// Override of blocks per LUN (lines) to keep FTL tables small; 0 = profile's value.
    pub blocks_per_lun: u32,
    pub static_map: bool,
    pub precondition: Precondition,
    /// Device queue depth when Gimbal is off (FIFO in front of the SSD).
    pub device_qd: u32,
}

impl Default for SsdConfig {
    fn default() -> Self {
        SsdConfig {
            profile: "pm9a3-gen4".into(),
            custom: None,
            per_node: 4,
            blocks_per_lun: 16,
            static_map: false,
            precondition: Precondition::Clean,
            device_qd: 256,
        }
    }
}

impl SsdConfig {
    pub fn profile(&self) -> anyhow::Result<SsdProfile> {
        let mut p = match &self.custom {
            Some(p) => p.clone(),
            None => SsdProfile::by_name(&self.profile)
                .ok_or_else(|| anyhow::anyhow!("unknown SSD profile {}", self.profile))?,
        };
        if self.blocks_per_lun > 0 {
            p.blocks_per_lun = self.blocks_per_lun;
        }
        p.static_map |= self.static_map;
        Ok(p)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Mechanisms {
    /// INT-assisted symmetric routing; off = per-flow ECMP over shortest paths.
    pub isr: bool,
    /// Eager bandwidth reservation for responses; off = FIFO for responses.
    pub reservation: bool,
    /// Storage-driven scheduling (NSDI'26, docs/isr.md §3.3): SSD credits (headroom) in completions,
    /// host limiter, rank queues. Not Gimbal's per-tenant I/O credits (see `gimbal`).
    pub credits: bool,
    /// Gimbal at each SSD; off = FIFO to the device.
    pub gimbal: bool,
}

impl Mechanisms {
    pub fn all_on() -> Self {
        Mechanisms {
            isr: true,
            reservation: true,
            credits: true,
            gimbal: true,
        }
    }
    pub fn all_off() -> Self {
        Mechanisms {
            isr: false,
            reservation: false,
            credits: false,
            gimbal: false,
        }
    }
}

impl Default for Mechanisms {
    fn default() -> Self {
        Self::all_on()
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadConfig {
    pub jobs: Vec<JobConfig>,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            jobs: vec![JobConfig::default()],
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    Random,
    Sequential,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Targets {
    /// Every SSD in the cluster, uniformly.
    All,
    /// Incast: every I/O to one global SSD index.
    One(u32),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum JobKind {
    /// fio-like: size mix and read ratio; closed loop at `qd`, or open loop at `iops`.
    Fio,
    /// Synthetic generator approximating a published trace by its statistics.
    Synthetic { model: String },
    /// Replay a block trace file (mqsim, spc or msr format); `builtin:tpcc` / `builtin:wsrch` ship a sample.
    Trace {
        path: String,
        format: String,
        time_scale: f64,
    },
    /// YCSB A–F over an LSM-style block-I/O generator; each KV op also needs
    /// `cpu_ns_per_op` of client CPU on one of `cores` cores (0 = one per thread).
    Ycsb {
        workload: char,
        record_bytes: u32,
        #[serde(default)]
        cores: u32,
        #[serde(default = "ycsb_cpu_ns_per_op")]
        cpu_ns_per_op: u64,
    },
}

/// RocksDB `Get` served from the block cache, one thread: 202,243 ops/s, i.e. 4.94 µs of
/// CPU per op (facebook/rocksdb PR #5473, db_bench readrandom; docs/sim.md).
pub fn ycsb_cpu_ns_per_op() -> u64 {
    4_940
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobConfig {
    pub name: String,
    pub job: JobKind,
    /// Percent of I/Os that are reads (fio-like jobs).
    pub read_pct: u32,
    /// (size_bytes, weight) pairs.
    pub sizes: Vec<(u32, u32)>,
    pub pattern: Pattern,
    /// Closed-loop outstanding I/Os per host (0 = open loop).
    pub qd: u32,
    /// Open-loop I/O rate per host (Poisson).
    pub iops: u64,
    pub targets: Targets,
    /// Which hosts run this job: empty = all.
    pub hosts: Vec<u32>,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            name: "randread-4k".into(),
            job: JobKind::Fio,
            read_pct: 100,
            sizes: vec![(4096, 1)],
            pattern: Pattern::Random,
            qd: 32,
            iops: 0,
            targets: Targets::All,
            hosts: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureConfig {
    pub at_ns: u64,
    /// "link" (between storage nodes `a` and `b`, or the busiest storage-to-storage link of
    /// node `a` at `at_ns` if b is absent) or "node".
    pub what: String,
    pub a: u32,
    pub b: Option<u32>,
    /// Until then the link is dead but still routed to (BFD-style detection, docs/sim.md).
    #[serde(default = "failure_detect_ns")]
    pub detect_ns: u64,
    /// After detection, until global routes are recomputed (SPF delay, docs/sim.md).
    #[serde(default = "failure_converge_ns")]
    pub converge_ns: u64,
}

/// BFD detection time = multiplier × interval (RFC 5880 §6.8.4), at the fastest hardware
/// setting of 3 ms × 3 (docs/sim.md).
pub fn failure_detect_ns() -> u64 {
    9_000_000
}

/// The shortest configurable SPF delay after a detected change, 50 ms (docs/sim.md).
pub fn failure_converge_ns() -> u64 {
    50_000_000
}
