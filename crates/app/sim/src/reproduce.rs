//! `trellis sim reproduce nsdi26`: the paper's scenarios as real configurations, run
//! switched vs switchless, printed as claim | paper | Trellis. Paper numbers are
//! second-hand (a third-party summary of the paper, unverified; docs/sources.md): quoted as such.

use crate::config::*;
use crate::cost::{capex, Prices};
use crate::run::{run, Results};
use crate::svg::{line_chart, Series};
use anyhow::Result;
use serde::Serialize;
use std::path::Path;
use trellis_ssd::Precondition;

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Stable identifier (`t4.randread4k.clean`, `capex20.saving`, ...).
    pub id: String,
    pub claim: String,
    /// The paper's figure as a number in `unit` (None where it gives none).
    pub paper: Option<f64>,
    /// Ours, in the same unit.
    pub trellis: Option<f64>,
    /// `%` (a signed change, negative = switchless lower), `x` (a ratio),
    /// `USD` or `us`.
    pub unit: String,
    /// The human table's columns.
    pub paper_text: String,
    pub trellis_text: String,
    pub note: String,
}

/// The first number in a paper figure as printed ("-32.3%" → -32.3,
/// "~$105,000" → 105000, "1.6% / 0.5 ms" → 1.6, "n/a" → None).
pub fn leading_number(text: &str) -> Option<f64> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let sign = if text[..start].ends_with('-') {
        -1.0
    } else {
        1.0
    };
    let digits: String = text[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ',')
        .filter(|c| *c != ',')
        .collect();
    digits.parse::<f64>().ok().map(|v| sign * v)
}

/// Knobs that trade fidelity for run time (the full preset must fit in 15 min on 2 cores).
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    pub small_ms: u64,
    pub large_ms: u64,
    /// Seed every scenario with this instead of the configs' own (1): how much a row
    /// moves with the random draws alone.
    pub seed: Option<u64>,
}

impl Scale {
    pub fn full() -> Self {
        Scale {
            small_ms: 20,
            large_ms: 20,
            seed: None,
        }
    }
    pub fn quick() -> Self {
        Scale {
            small_ms: 4,
            large_ms: 3,
            seed: None,
        }
    }
}

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
        if switched { 1 } else { TESTBED_NODES },
        pre,
        job,
        ms,
    )
}

/// A datacenter-tuned TCP RTO floor for the failure sensitivity row (`ip route ... rto_min`;
/// Vasudevan et al., SIGCOMM 2009, argue for sub-ms floors in datacenters; docs/sim.md).
const TUNED_RTO_MIN_NS: u64 = 1_000_000;

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

fn reduction(base: f64, new: f64) -> f64 {
    if base <= 0.0 {
        return 0.0;
    }
    (base - new) / base
}

/// Run configurations two at a time (this machine has 2 cores); order is preserved.
pub fn run_all(cfgs: Vec<SimConfig>, progress: bool) -> Result<Vec<Results>> {
    let n = cfgs.len();
    let threads = std::thread::available_parallelism()
        .map(|p| p.get())
        .unwrap_or(1)
        .clamp(1, 2);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out: std::sync::Mutex<Vec<Option<Results>>> = std::sync::Mutex::new(vec![None; n]);
    let err: std::sync::Mutex<Option<anyhow::Error>> = std::sync::Mutex::new(None);
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= n {
                    break;
                }
                match run(cfgs[i].clone(), false) {
                    Ok(r) => out.lock().unwrap()[i] = Some(r.results),
                    Err(e) => *err.lock().unwrap() = Some(e),
                }
                let d = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                if progress {
                    eprintln!("  [{d}/{n}] {}", cfgs[i].name);
                }
            });
        }
    });
    if let Some(e) = err.into_inner().unwrap() {
        return Err(e);
    }
    Ok(out
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|r| r.expect("result"))
        .collect())
}

pub struct Report {
    pub rows: Vec<Row>,
    pub runs: Vec<Results>,
}

/// Offered load of the trace-like runs, as a fraction of each client's 400GbE link.
pub const TRACE_LOAD: f64 = 0.5;

pub fn nsdi26(scale: Scale, out_dir: &Path, progress: bool) -> Result<Report> {
    std::fs::create_dir_all(out_dir)?;
    let (sm, lg) = (scale.small_ms, scale.large_ms);
    let mut cfgs = Vec::new();
    // 1. Testbed fio: (randread 4K, seqwrite 128K) × (clean, fragmented) × (switched, switchless).
    let frag = Precondition::Fragmented {
        overwrite_permille: 1000,
    };
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
        for pre in [Precondition::Clean, frag] {
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
    // 2. YCSB A-F on the testbed.
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
    // 3. 27 nodes at 600GbE with trace-like workloads (open loop).
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
    // 4. Scalability: uniform 4 KiB and mixed 4/32/128 KiB; incast to one drive.
    let uni = fio("uniform-4k", 100, vec![(4096, 1)], Pattern::Random, 16);
    let mixed = fio(
        "mixed-50-50",
        50,
        vec![(4096, 1), (32768, 1), (131072, 1)],
        Pattern::Random,
        8,
    );
    let incast = JobConfig {
        targets: Targets::One(0),
        ..fio("incast-4k", 100, vec![(4096, 1)], Pattern::Random, 8)
    };
    for job in [&uni, &mixed, &incast] {
        for sw in [true, false] {
            cfgs.push(rack27(sw, TopologyKind::Torus3d, job.clone(), lg));
        }
    }
    // 5. Link failure at mid-run: 3D torus and dragonfly, two workloads.
    let f_uni = fio("fail-4k-95-5", 95, vec![(4096, 1)], Pattern::Random, 16);
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
    // 6. Per-hop cost: QD1 4 KiB reads one vs two adapter hops away on a ring.
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
    // 7. Drill-down: the same testbed without any of the mechanisms (plain ECMP, FIFO).
    for sw in [true, false] {
        let mut c = testbed(
            sw,
            frag,
            fio("randread-4k", 100, vec![(4096, 1)], Pattern::Random, 32),
            sm,
        );
        c.name = format!("{}-baseline-frag", c.name);
        c.mechanisms = Mechanisms::all_off();
        cfgs.push(c);
    }
    // 8. Beyond the paper: one parameter at a time on the clean 4-node testbed.
    cfgs.extend(sensitivity_configs(sm));
    if progress {
        eprintln!(
            "running {} simulations ({} ms / {} ms simulated each)",
            cfgs.len(),
            sm,
            lg
        );
    }
    if let Some(seed) = scale.seed {
        for c in &mut cfgs {
            c.seed = seed;
        }
    }
    let runs = run_all(cfgs, progress)?;
    let rows = table(&runs);
    write_outputs(out_dir, &rows, &runs)?;
    Ok(Report { rows, runs })
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
fn knobs() -> Vec<Knob> {
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

fn find<'a>(runs: &'a [Results], name: &str) -> &'a Results {
    runs.iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no run named {name}"))
}

fn table(runs: &[Results]) -> Vec<Row> {
    let mut rows = Vec::new();
    // (id, claim, paper as printed, (ours as a number, its unit), note)
    let mut row = |id: &str, claim: &str, paper: &str, ours: (f64, &str), note: &str| {
        let (value, unit) = ours;
        let trellis_text = match unit {
            "%" => format!("{value:+.1}%"),
            "x" => format!("{value:.2}x"),
            "USD" => format!("${value:.0}"),
            "us" => format!("{value:+.2} us"),
            _ => format!("{value}"),
        };
        rows.push(Row {
            id: id.into(),
            claim: claim.into(),
            paper: leading_number(paper),
            trellis: Some(value),
            unit: unit.into(),
            paper_text: paper.into(),
            trellis_text,
            note: note.into(),
        })
    };
    // A reduction as the table prints it: negative = switchless lower.
    let pc = |x: f64| (-x * 100.0, "%");
    for (job, op, papers) in [
        ("randread-4k", 0, ["-32.3%", "-43.1%"]),
        ("seqwrite-128k", 1, ["-18.0%", "-20.3%"]),
    ] {
        for (state, paper) in ["clean", "frag"].iter().zip(papers) {
            let sw = find(runs, &format!("testbed-switched-{job}-{state}"));
            let sl = find(runs, &format!("testbed-switchless-{job}-{state}"));
            let (a, b) = if op == 0 {
                (&sw.read, &sl.read)
            } else {
                (&sw.write, &sl.write)
            };
            let id = format!("t4.{}.{state}", job.replace('-', ""));
            row(
                &id,
                &format!("4-node 2D torus vs switched: {job} avg latency, {state}"),
                paper,
                pc(reduction(a.lat_avg_us, b.lat_avg_us)),
                &format!("{:.1} vs {:.1} us", a.lat_avg_us, b.lat_avg_us),
            );
        }
    }
    let (mut tput, mut avg, mut tail) = (vec![], vec![], vec![]);
    for w in ['A', 'B', 'C', 'D', 'E', 'F'] {
        let sw = find(runs, &format!("testbed-switched-ycsb-{w}"))
            .ycsb
            .clone()
            .unwrap();
        let sl = find(runs, &format!("testbed-switchless-ycsb-{w}"))
            .ycsb
            .clone()
            .unwrap();
        tput.push(sl.kops_s / sw.kops_s);
        avg.push(reduction(sw.read_lat_avg_us, sl.read_lat_avg_us));
        tail.push(reduction(sw.read_lat_p999_us, sl.read_lat_p999_us));
    }
    let mean = |v: &Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
    row(
        "ycsb.thpt_ratio",
        "YCSB A-F throughput, switchless / switched",
        "~1.00x",
        (mean(&tput), "x"),
        "mean over A-F",
    );
    row(
        "ycsb.read_avg",
        "YCSB avg read latency",
        "-28.3%",
        pc(mean(&avg)),
        "mean over A-F",
    );
    row(
        "ycsb.read_p999",
        "YCSB p99.9 read latency",
        "-25.0%",
        pc(mean(&tail)),
        "mean over A-F",
    );
    for (m, paper) in [
        ("oltp", "-50.0%"),
        ("systor", "-19.5%"),
        ("websearch", "-15.9%"),
    ] {
        let sw = find(runs, &format!("rack27-tor-{m}"));
        let sl = find(runs, &format!("rack27-torus3d-{m}"));
        row(
            &format!("r27.{m}.read_avg"),
            &format!("27 nodes 600GbE 3D torus, {m}-like: avg read latency"),
            paper,
            pc(reduction(sw.read.lat_avg_us, sl.read.lat_avg_us)),
            &format!("{:.1} vs {:.1} us", sw.read.lat_avg_us, sl.read.lat_avg_us),
        );
    }
    let pair = |j: &str| {
        (
            find(runs, &format!("rack27-tor-{j}")),
            find(runs, &format!("rack27-torus3d-{j}")),
        )
    };
    let (sw, sl) = pair("uniform-4k");
    row(
        "r27.uniform4k.read_avg",
        "27 nodes, uniform 4 KiB: avg read latency",
        "-39.7%",
        pc(reduction(sw.read.lat_avg_us, sl.read.lat_avg_us)),
        &format!("{:.1} vs {:.1} us", sw.read.lat_avg_us, sl.read.lat_avg_us),
    );
    let (sw, sl) = pair("mixed-50-50");
    row(
        "r27.mixed.read_avg",
        "27 nodes, mixed 4/32/128 KiB: avg read latency",
        "-85.4%",
        pc(reduction(sw.read.lat_avg_us, sl.read.lat_avg_us)),
        &format!("{:.1} vs {:.1} us", sw.read.lat_avg_us, sl.read.lat_avg_us),
    );
    row(
        "r27.mixed.write_avg",
        "27 nodes, mixed 4/32/128 KiB: avg write latency",
        "-91.2%",
        pc(reduction(sw.write.lat_avg_us, sl.write.lat_avg_us)),
        &format!(
            "{:.1} vs {:.1} us",
            sw.write.lat_avg_us, sl.write.lat_avg_us
        ),
    );
    let (sw, sl) = pair("incast-4k");
    row(
        "r27.incast4k.read_avg",
        "Incast to one drive: avg read latency",
        "~0 (drive-bound)",
        pc(reduction(sw.read.lat_avg_us, sl.read.lat_avg_us)),
        &format!("{:.1} vs {:.1} us", sw.read.lat_avg_us, sl.read.lat_avg_us),
    );
    for (job, kind, drop, rec, short) in [
        ("fail-4k-95-5", "torus3d", "1.6%", "0.5 ms", "4k"),
        ("fail-4k-95-5", "dragonfly", "2.1%", "0.75 ms", "4k"),
        ("mixed-50-50", "torus3d", "6.8%", "2 ms", "mixed"),
        ("mixed-50-50", "dragonfly", "4.5%", "1.8 ms", "mixed"),
    ] {
        let r = find(runs, &format!("rack27-{kind}-{job}-failure"));
        let f = r.failure.clone().unwrap();
        let recov = match (f.dipped, f.recovery_ns) {
            (false, _) => "none needed (no measurable dip)".to_string(),
            (true, Some(n)) => format!("{:.2} ms", n as f64 / 1e6),
            (true, None) => "not within run".into(),
        };
        row(
            &format!("fail.{kind}.{short}.drop"),
            &format!("Link failure, {kind}, {job}: throughput drop (recovery in the note)"),
            &format!("{drop} / {rec}"),
            (f.throughput_drop * 100.0, "%"),
            &format!(
                "recovery {recov}; {} I/Os lost ({} resent once RACK found the loss, the rest after the TCP RTO); detection {} ms, convergence {} ms",
                f.lost_ios,
                f.rack_recoveries,
                failure_detect_ns() / 1_000_000,
                failure_converge_ns() / 1_000_000
            ),
        );
    }
    let f = find(runs, "rack27-torus3d-fail-4k-95-5-failure-rto1ms")
        .failure
        .clone()
        .unwrap();
    row(
        "sens.fail.torus3d.4k.rto1ms",
        "Sensitivity, link failure torus3d 4k: TCP RTO floor 1 ms instead of 200 ms",
        "n/a",
        (f.throughput_drop * 100.0, "%"),
        &format!(
            "{} I/Os lost, {} found by RACK; throughput drop over the run after the failure",
            f.lost_ios, f.rack_recoveries
        ),
    );
    let f = find(runs, "rack27-torus3d-fail-4k-95-5-failure-norack")
        .failure
        .clone()
        .unwrap();
    row(
        "sens.fail.torus3d.4k.norack",
        "Sensitivity, link failure torus3d 4k: no RACK (every loss waits for the RTO)",
        "n/a",
        (f.throughput_drop * 100.0, "%"),
        &format!(
            "{} I/Os lost; throughput drop over the run after the failure",
            f.lost_ios
        ),
    );
    let h1 = find(runs, "hop-cost-1").read.lat_avg_us;
    let h2 = find(runs, "hop-cost-2").read.lat_avg_us;
    row(
        "hop.extra_adapter.read_lat",
        "Extra adapter hop, 4 KiB read (QD1)",
        "+2.9 us",
        (h2 - h1, "us"),
        "input 2.9 us + wire time",
    );
    let sw = find(runs, "testbed-switched-randread-4k-baseline-frag");
    let sl = find(runs, "testbed-switchless-randread-4k-baseline-frag");
    row(
        "t4.randread4k.frag.mechanisms_off",
        "Drill-down: 4-node randread frag, all mechanisms off",
        "n/a",
        pc(reduction(sw.read.lat_avg_us, sl.read.lat_avg_us)),
        &format!(
            "{:.1} vs {:.1} us (ECMP, FIFO)",
            sw.read.lat_avg_us, sl.read.lat_avg_us
        ),
    );
    for (id, what, _) in knobs() {
        let sw = find(runs, &format!("testbed-switched-randread-4k-sens-{id}"));
        let sl = find(runs, &format!("testbed-switchless-randread-4k-sens-{id}"));
        row(
            &format!("sens.{id}"),
            &format!("Sensitivity, 4-node randread clean: {what}"),
            "n/a",
            pc(reduction(sw.read.lat_avg_us, sl.read.lat_avg_us)),
            &format!("{:.1} vs {:.1} us", sw.read.lat_avg_us, sl.read.lat_avg_us),
        );
    }
    let c = capex(20, &Prices::default());
    row(
        "capex20.switched",
        "Capex, 20 storage nodes: switched",
        "~$105,000",
        (c.switched_usd, "USD"),
        &format!("{}; default prices", c.switch_plan),
    );
    row(
        "capex20.switchless",
        "Capex, 20 storage nodes: switchless",
        "~$52,000",
        (c.switchless_usd, "USD"),
        "4-port adapters",
    );
    row(
        "capex20.saving",
        "Capex saving",
        "50.5%",
        (c.saving * 100.0, "%"),
        "see docs/cost-model.md",
    );
    rows
}

pub fn format_table(rows: &[Row]) -> String {
    let w0 = rows.iter().map(|r| r.claim.len()).max().unwrap_or(5).max(5);
    let w1 = rows
        .iter()
        .map(|r| r.paper_text.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let w2 = rows
        .iter()
        .map(|r| r.trellis_text.len())
        .max()
        .unwrap_or(7)
        .max(7);
    let mut s = format!(
        "{:w0$} | {:w1$} | {:w2$} | note\n",
        "claim", "paper", "Trellis"
    );
    s += &format!(
        "{}-|-{}-|-{}-|-----\n",
        "-".repeat(w0),
        "-".repeat(w1),
        "-".repeat(w2)
    );
    for r in rows {
        s += &format!(
            "{:w0$} | {:w1$} | {:w2$} | {}\n",
            r.claim, r.paper_text, r.trellis_text, r.note
        );
    }
    s += "paper column: second-hand figures from a third-party summary of the NSDI'26 paper (docs/sources.md), not verified against the paper.\n";
    s
}

fn write_outputs(dir: &Path, rows: &[Row], runs: &[Results]) -> Result<()> {
    std::fs::write(dir.join("table.txt"), format_table(rows))?;
    std::fs::write(
        dir.join("nsdi26.json"),
        serde_json::to_string_pretty(&serde_json::json!({ "rows": rows, "runs": runs }))?,
    )?;
    // Latency CDFs of the 27-node OLTP-like run.
    let cdf = |r: &Results| r.read.cdf.iter().map(|&(x, p)| (x, p)).collect::<Vec<_>>();
    let sw = find(runs, "rack27-tor-oltp");
    let sl = find(runs, "rack27-torus3d-oltp");
    let svg = line_chart(
        "27 nodes, OLTP-like: read latency CDF",
        "latency (us, log)",
        "fraction",
        &[
            Series {
                name: "switched",
                points: cdf(sw),
            },
            Series {
                name: "3D torus",
                points: cdf(sl),
            },
        ],
        true,
    );
    std::fs::write(dir.join("latency-cdf-oltp.svg"), svg)?;
    let mut series = Vec::new();
    for kind in ["torus3d", "dragonfly"] {
        let r = find(runs, &format!("rack27-{kind}-mixed-50-50-failure"));
        let pts = r
            .timeseries_mb_s
            .iter()
            .enumerate()
            .map(|(i, &y)| (i as f64 * r.timeseries_bin_ns as f64 / 1e6, y))
            .collect();
        series.push(Series {
            name: if kind == "torus3d" {
                "3D torus"
            } else {
                "dragonfly"
            },
            points: pts,
        });
    }
    std::fs::write(
        dir.join("failure-throughput.svg"),
        line_chart(
            "Link failure (mixed 50/50): throughput",
            "time (ms)",
            "MB/s",
            &series,
            false,
        ),
    )?;
    std::fs::write(dir.join("capex.svg"), capex_svg(&Prices::default(), 4, 64))?;
    Ok(())
}

pub fn capex_svg(pr: &Prices, from: u32, to: u32) -> String {
    let pts = |f: fn(&crate::cost::Capex) -> f64| {
        (from..=to)
            .step_by(2)
            .map(|n| (n as f64, f(&capex(n, pr))))
            .collect::<Vec<_>>()
    };
    line_chart(
        "Capex vs storage nodes",
        "storage nodes",
        "USD",
        &[
            Series {
                name: "switched",
                points: pts(|c| c.switched_usd),
            },
            Series {
                name: "switchless",
                points: pts(|c| c.switchless_usd),
            },
        ],
        false,
    )
}
