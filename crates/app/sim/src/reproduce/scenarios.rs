//! The scenarios as configurations: the 4-node testbed (and its client's
//! attachment), the 27-node rack, the trace-like open-loop jobs, and the
//! one-knob-at-a-time sensitivity points.

use super::Precondition;
use crate::config::*;
use trellis_topology::testbed;

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

fn fio(name: &str, read_pct: u32, sizes: Vec<(u32, u32)>, pattern: Pattern, qd: u32) -> JobConfig {
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
        if switched {
            testbed::SWITCHED_CLIENT_PORTS
        } else {
            testbed::SWITCHLESS_CLIENT_PORTS
        },
        pre,
        job,
        ms,
    )
}

/// A datacenter-tuned TCP RTO floor for the failure sensitivity row (`ip route ... rto_min`;
/// Vasudevan et al., SIGCOMM 2009, argue for sub-ms floors in datacenters; docs/sim.md).
const TUNED_RTO_MIN_NS: u64 = 1_000_000;

/// Storage nodes of the 4-node testbed (`trellis_topology::testbed`, which
/// `trellis san` emulates; tests/testbed.rs checks both are one graph).
pub const TESTBED_NODES: u32 = testbed::STORAGE_NODES;

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
            node_gbps: testbed::NODE_GBPS,
            uplinks: testbed::NODE_PORTS,
            hosts: 1,
            host_gbps: testbed::CLIENT_PORT_GBPS,
            host_ports: client_ports,
            prop_ns: testbed::PROP_NS,
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

fn sensitivity_configs(ms: u64) -> Vec<SimConfig> {
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

/// Offered load of the trace-like runs, as a fraction of each client's 400GbE link.
pub const TRACE_LOAD: f64 = 0.5;

/// The fragmented precondition of the testbed runs: the whole logical space overwritten once.
const FRAGMENTED: Precondition = Precondition::Fragmented {
    overwrite_permille: 1000,
};

/// The mixed 4/32/128 KiB job of the scalability and link-failure scenarios.
fn mixed_job() -> JobConfig {
    fio(
        "mixed-50-50",
        50,
        vec![(4096, 1), (32768, 1), (131072, 1)],
        Pattern::Random,
        8,
    )
}

/// Every scenario of `nsdi26`, in the order its runs are reported; `sm` and `lg` are
/// the simulated ms of the small (testbed) and large (27-node) runs.
pub(super) fn nsdi26_configs(sm: u64, lg: u64) -> Vec<SimConfig> {
    let mut cfgs = testbed_fio_configs(sm);
    cfgs.extend(ycsb_configs(sm));
    cfgs.extend(trace_configs(lg));
    cfgs.extend(scale_configs(lg));
    cfgs.extend(failure_configs(lg));
    cfgs.extend(hop_cost_configs(sm));
    cfgs.extend(drill_down_configs(sm));
    // Beyond the paper: one parameter at a time on the clean 4-node testbed.
    cfgs.extend(sensitivity_configs(sm));
    cfgs
}

/// Testbed fio: (randread 4K, seqwrite 128K) × (clean, fragmented) × (switched, switchless).
fn testbed_fio_configs(sm: u64) -> Vec<SimConfig> {
    let mut cfgs = Vec::new();
    let fio_jobs = [
        fio("randread-4k", 100, vec![(4096, 1)], Pattern::Random, 32),
        fio(
            "seqwrite-128k",
            0,
            vec![(131072, 1)],
            Pattern::Sequential,
            8,
        ),
    ];
    for job in &fio_jobs {
        for pre in [Precondition::Clean, FRAGMENTED] {
            for sw in [true, false] {
                let mut c = testbed(sw, pre, job.clone(), sm);
                c.name = format!(
                    "{}-{}",
                    c.name,
                    if pre == Precondition::Clean {
                        "clean"
                    } else {
                        "frag"
                    }
                );
                cfgs.push(c);
            }
        }
    }
    cfgs
}

/// YCSB A-F on the testbed.
fn ycsb_configs(sm: u64) -> Vec<SimConfig> {
    let mut cfgs = Vec::new();
    for w in ['A', 'B', 'C', 'D', 'E', 'F'] {
        for sw in [true, false] {
            let job = JobConfig {
                name: format!("ycsb-{w}"),
                job: JobKind::Ycsb {
                    workload: w,
                    record_bytes: 1024,
                    cores: 0,
                    cpu_ns_per_op: crate::config::ycsb_cpu_ns_per_op(),
                },
                qd: 16,
                ..JobConfig::default()
            };
            cfgs.push(testbed(sw, Precondition::Clean, job, sm));
        }
    }
    cfgs
}

/// 27 nodes at 600GbE with trace-like workloads (open loop).
fn trace_configs(lg: u64) -> Vec<SimConfig> {
    let mut cfgs = Vec::new();
    for m in ["oltp", "systor", "websearch"] {
        for sw in [true, false] {
            cfgs.push(rack27(
                sw,
                TopologyKind::Torus3d,
                synthetic(m, TRACE_LOAD, 400),
                lg,
            ));
        }
    }
    cfgs
}

/// Scalability: uniform 4 KiB and mixed 4/32/128 KiB; incast to one drive.
fn scale_configs(lg: u64) -> Vec<SimConfig> {
    let mut cfgs = Vec::new();
    let uni = fio("uniform-4k", 100, vec![(4096, 1)], Pattern::Random, 16);
    let mixed = mixed_job();
    let incast = JobConfig {
        targets: Targets::One(0),
        ..fio("incast-4k", 100, vec![(4096, 1)], Pattern::Random, 8)
    };
    for job in [&uni, &mixed, &incast] {
        for sw in [true, false] {
            cfgs.push(rack27(sw, TopologyKind::Torus3d, job.clone(), lg));
        }
    }
    cfgs
}

/// Link failure at mid-run: 3D torus and dragonfly, two workloads.
fn failure_configs(lg: u64) -> Vec<SimConfig> {
    let mut cfgs = Vec::new();
    let f_uni = fio("fail-4k-95-5", 95, vec![(4096, 1)], Pattern::Random, 16);
    let mixed = mixed_job();
    for job in [&f_uni, &mixed] {
        for kind in [TopologyKind::Torus3d, TopologyKind::Dragonfly] {
            // The run covers detection, convergence and `lg` ms after it, so the drop
            // averages the whole failure cycle rather than stopping mid-blackhole.
            let (detect_ns, converge_ns) = (failure_detect_ns(), failure_converge_ns());
            let after_ms = (detect_ns + converge_ns).div_ceil(1_000_000) + lg;
            let mut c = rack27(false, kind, job.clone(), lg + after_ms);
            c.name = format!("{}-failure", c.name);
            // Warm up over the first tenth before the failure, not of the longer run.
            c.warmup_ns = lg * 100_000;
            c.bin_ns = 50_000;
            c.failures = vec![FailureConfig {
                at_ns: lg * 1_000_000,
                what: "link".into(),
                a: 0,
                b: None,
                detect_ns,
                converge_ns,
            }];
            if kind == TopologyKind::Torus3d && job.name == f_uni.name {
                // Sensitivity: the same failure with a datacenter-tuned 1 ms RTO floor.
                let mut tuned = c.clone();
                tuned.name = format!("{}-rto1ms", c.name);
                tuned.topology.tcp_rto_min_ns = TUNED_RTO_MIN_NS;
                cfgs.push(tuned);
                // Sensitivity: without RACK every loss waits for its RTO (the model
                // before 2026-11-29).
                let mut no_rack = c.clone();
                no_rack.name = format!("{}-norack", c.name);
                no_rack.topology.tcp_rack = false;
                cfgs.push(no_rack);
            }
            cfgs.push(c);
        }
    }
    cfgs
}

/// Per-hop cost: QD1 4 KiB reads one vs two adapter hops away on a ring.
fn hop_cost_configs(sm: u64) -> Vec<SimConfig> {
    let mut cfgs = Vec::new();
    for target in [1u32, 2] {
        let mut c = testbed(
            false,
            Precondition::Clean,
            JobConfig {
                targets: Targets::One(target * 4),
                hosts: vec![0],
                ..fio("qd1-read", 100, vec![(4096, 1)], Pattern::Random, 1)
            },
            sm,
        );
        c.name = format!("hop-cost-{target}");
        c.topology.kind = TopologyKind::Ring;
        c.topology.storage_nodes = 6;
        c.topology.hosts = 1;
        // One port on node 0 and one I/O at a time: the hops are the only difference.
        c.topology.host_ports = 1;
        c.workload.jobs[0].qd = 1;
        c.mechanisms = Mechanisms::all_off();
        cfgs.push(c);
    }
    cfgs
}

/// Drill-down: the same testbed without any of the mechanisms (plain ECMP, FIFO).
fn drill_down_configs(sm: u64) -> Vec<SimConfig> {
    let mut cfgs = Vec::new();
    for sw in [true, false] {
        let mut c = testbed(
            sw,
            FRAGMENTED,
            fio("randread-4k", 100, vec![(4096, 1)], Pattern::Random, 32),
            sm,
        );
        c.name = format!("{}-baseline-frag", c.name);
        c.mechanisms = Mechanisms::all_off();
        cfgs.push(c);
    }
    cfgs
}
