//! `trellis sim reproduce nsdi26`: the paper's scenarios as real configurations, run
//! switched vs switchless, printed as claim | paper | Trellis. Paper numbers are
//! second-hand (a third-party summary of the paper, unverified; docs/sources.md): quoted as such.
//!
//! This file runs the scenarios and holds the row type; `scenarios.rs` builds
//! the configurations, `table.rs` turns the runs into rows, and `outputs.rs`
//! writes the files.

mod outputs;
mod scenarios;
mod table;

pub use outputs::capex_svg;
use outputs::write_outputs;
pub use scenarios::{
    fast_ssds, rack27, synthetic, testbed, testbed_attached, warm_gimbal, TESTBED_NODES,
};
use scenarios::{fio, sensitivity_configs, TUNED_RTO_MIN_NS};
pub use table::format_table;
use table::table;

use crate::config::*;
use crate::run::{run, Results};
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

pub(super) fn reduction(base: f64, new: f64) -> f64 {
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

pub(super) fn find<'a>(runs: &'a [Results], name: &str) -> &'a Results {
    runs.iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no run named {name}"))
}
