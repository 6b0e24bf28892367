//! The scenarios as configurations: the 4-node testbed (and its client's
//! attachment), the 27-node rack, the trace-like open-loop jobs, and the
//! one-knob-at-a-time sensitivity points.

use super::Precondition;
use crate::config::*;

/// Gimbal with a warm start [R]: simulated windows are tens of ms, but from Gimbal's cold
/// defaults (write cost 9.0, 1000 MiB/s) AD/MI needs ~1.6 s to converge. Start near the
/// converged region of the PM9A3-like model instead; both values stay adaptive.
pub fn warm_gimbal() -> trellis_qos::GimbalConfig {
    trellis_qos::GimbalConfig {
        write_cost_init_fp10: 2048,
        rate_init_bytes_per_s: 3_000 << 20,
        ..trellis_qos::GimbalConfig::default()
    }
}

pub(super) fn fio(
    name: &str,
    read_pct: u32,
    sizes: Vec<(u32, u32)>,
    pattern: Pattern,
    qd: u32,
) -> JobConfig {
    JobConfig {
        name: name.into(),
        read_pct,
        sizes,
        pattern,
        qd,
        ..JobConfig::default()
    }
}

/// The 4-node testbed of the paper's slides ([NSDI'26], docs/sources.md): 4 storage
/// nodes with 4 PM9A3-like SSDs, 4×100GbE each;
/// switched = one ToR with the 4 ports teamed, switchless = 2×2 torus (4 disjoint paths);
/// one client with the paper's attachment (see `testbed_attached`). All mechanisms on in both (the paper
/// co-designs both fabrics: Tofino for ISR/PIFO in the switched one).
pub fn testbed(switched: bool, pre: Precondition, job: JobConfig, ms: u64) -> SimConfig {
    testbed_attached(
        switched,
        if switched { 1 } else { TESTBED_NODES },
        pre,
        job,
        ms,
    )
}

/// A datacenter-tuned TCP RTO floor for the failure sensitivity row (`ip route ... rto_min`;
/// Vasudevan et al., SIGCOMM 2009, argue for sub-ms floors in datacenters; docs/sim.md).
pub(super) const TUNED_RTO_MIN_NS: u64 = 1_000_000;

/// Storage nodes of the 4-node testbed.
pub const TESTBED_NODES: u32 = 4;

/// The testbed with its one client attached by `client_ports` 100G ports. The paper's
/// attachment [NSDI'26, evaluation setup]: switched, a single client–ToR path (1 port);
/// switchless, the client on the torus with 4 disjoint paths (one port to each node).
/// The client runs the load of the four per-node clients of earlier versions (iodepth
/// and rate × 4), so the offered concurrency is unchanged.
pub fn testbed_attached(
    switched: bool,
    client_ports: u32,
    pre: Precondition,
    mut job: JobConfig,
    ms: u64,
) -> SimConfig {
    job.qd *= TESTBED_NODES;
    job.iops *= TESTBED_NODES as u64;
    let kind = if switched {
        TopologyKind::Tor
    } else {
        TopologyKind::Torus2d
    };
    SimConfig {
        name: format!(
            "testbed-{}-{}",
            if switched { "switched" } else { "switchless" },
            job.name
        ),
        duration_ns: ms * 1_000_000,
        warmup_ns: ms * 100_000,
        topology: TopologyConfig {
            kind,
            storage_nodes: TESTBED_NODES,
            node_gbps: 400,
            uplinks: 4,
            hosts: 1,
            host_gbps: 100,
            host_ports: client_ports,
            ..TopologyConfig::default()
        },
        ssd: SsdConfig {
            per_node: 4,
            blocks_per_lun: 16,
            precondition: pre,
            // A clean 960 GB drive would not start GC within a simulated window; our scaled-down
            // FTL would. So clean runs use the static map (no GC), fragmented runs the FTL.
            static_map: pre == Precondition::Clean,
            ..SsdConfig::default()
        },
        workload: WorkloadConfig { jobs: vec![job] },
        gimbal: warm_gimbal(),
        ..SimConfig::default()
    }
}

/// 27 dense storage nodes at 600GbE (16 PM9A3-like SSDs each, ~100 GB/s of flash vs
/// 75 GB/s of network: the paper's premise): 3×3×3 torus of 6×100GbE adapters vs one ToR
/// with 6 teamed 100GbE ports per node. One client per storage node at 400GbE.
pub fn rack27(switched: bool, kind: TopologyKind, job: JobConfig, ms: u64) -> SimConfig {
    let kind = if switched { TopologyKind::Tor } else { kind };
    SimConfig {
        name: format!("rack27-{:?}-{}", kind, job.name).to_lowercase(),
        duration_ns: ms * 1_000_000,
        warmup_ns: ms * 100_000,
        topology: TopologyConfig {
            kind,
            storage_nodes: 27,
            node_gbps: 600,
            uplinks: 6,
            group_size: 3,
            hosts: 27,
            host_gbps: 400,
            ..TopologyConfig::default()
        },
        ssd: SsdConfig {
            per_node: 16,
            blocks_per_lun: 8,
            static_map: true,
            ..SsdConfig::default()
        },
        workload: WorkloadConfig { jobs: vec![job] },
        gimbal: warm_gimbal(),
        ..SimConfig::default()
    }
}

/// Open-loop trace-like job offering `load` × the client's link rate (by mean I/O size).
pub fn synthetic(model: &str, load: f64, host_gbps: u64) -> JobConfig {
    let (_, sizes) = crate::workload::synthetic_model(model).expect("known model");
    let mean = crate::workload::SizeMix::new(&sizes).expect("sizes").mean();
    let iops = (load * host_gbps as f64 * 1e9 / 8.0 / mean) as u64;
    JobConfig {
        name: model.into(),
        job: JobKind::Synthetic {
            model: model.into(),
        },
        qd: 0,
        iops,
        ..JobConfig::default()
    }
}

/// SSDs 4× faster in every device time than the pm9a3-gen4 profile [R] (NAND, firmware,
/// channel and PCIe): a drive where the network, not the flash, binds.
pub fn fast_ssds(c: &mut SimConfig) {
    let mut p = trellis_ssd::SsdProfile::pm9a3();
    for t in [
        &mut p.read_lsb_ns,
        &mut p.read_msb_ns,
        &mut p.read_full_lsb_ns,
        &mut p.read_full_msb_ns,
        &mut p.program_ns,
        &mut p.erase_ns,
        &mut p.fw_read_small_ns,
        &mut p.fw_read_large_ns,
        &mut p.fw_write_ns,
        &mut p.fw_write_per_4k_ns,
    ] {
        *t /= 4;
    }
    p.channel_mb_s *= 4;
    p.pcie_mb_s *= 4;
    c.ssd.custom = Some(p);
}

/// One knob of the sensitivity section: (id suffix, claim, how it changes a testbed config).
type Knob = (&'static str, &'static str, fn(&mut SimConfig));

/// The sensitivity and "where switchless loses" points [R]: the clean 4-node testbed,
/// 4 KiB randread QD32, switched vs switchless, with one parameter changed.
pub(super) fn knobs() -> Vec<Knob> {
    vec![
        (
            "hop_ns.1450",
            "adapter hop 1.45 us (half the measured 2.9)",
            |c| c.topology.adapter_hop_ns = 1_450,
        ),
        ("hop_ns.5800", "slow adapters: hop 5.8 us (2x)", |c| {
            c.topology.adapter_hop_ns = 5_800
        }),
        ("hop_ns.11600", "slow adapters: hop 11.6 us (4x)", |c| {
            c.topology.adapter_hop_ns = 11_600
        }),
        ("client_gbps.25", "client link 25G", |c| {
            c.topology.host_gbps = 25
        }),
        ("client_gbps.400", "client link 400G", |c| {
            c.topology.host_gbps = 400
        }),
        (
            "ssd.fast4x",
            "SSDs 4x faster in every device time",
            fast_ssds,
        ),
        (
            "ring",
            "switchless as a 4-node ring (2 links per node)",
            |c| {
                if c.topology.kind == TopologyKind::Torus2d {
                    c.topology.kind = TopologyKind::Ring;
                }
            },
        ),
    ]
}

pub(super) fn sensitivity_configs(ms: u64) -> Vec<SimConfig> {
    let mut out = Vec::new();
    for (id, _, f) in knobs() {
        for sw in [true, false] {
            let job = fio("randread-4k", 100, vec![(4096, 1)], Pattern::Random, 32);
            let mut c = testbed(sw, Precondition::Clean, job, ms);
            f(&mut c);
            c.name = format!("{}-sens-{id}", c.name);
            out.push(c);
        }
    }
    out
}
