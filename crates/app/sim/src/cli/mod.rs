//! `trellis sim ...`: the CLI surface, wired into the `trellis` binary by crates/app/cli.
//! `fairness.rs` holds `sim fairness`.

use crate::config::*;
use crate::cost::{capex, Prices};
use crate::reproduce::{self, Scale};
use crate::run::{self, run as run_sim};
use crate::svg::{line_chart, Series};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use trellis_ssd::Precondition;

mod fairness;
mod health;

use fairness::cmd_fairness;

#[derive(clap::Args, Debug)]
pub struct SimArgs {
    #[command(subcommand)]
    pub cmd: SimCmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum SimCmd {
    /// Run one scenario from a TOML/JSON config or a built-in preset; writes JSON and SVGs.
    Run {
        /// Scenario file, TOML or JSON (`trellis sim config PRESET` prints one to start from).
        #[arg(long, value_name = "FILE", conflicts_with = "preset")]
        config: Option<PathBuf>,
        /// Built-in scenario: testbed-switched, testbed-switchless, rack27-tor,
        /// rack27-torus3d or torus1000.
        #[arg(long, value_name = "NAME")]
        preset: Option<String>,
        /// Directory for results.json, perf.json and the SVG plots.
        #[arg(long, default_value = "sim-out")]
        out: PathBuf,
        /// Random seed (default: the scenario's); equal seeds give equal runs.
        #[arg(long)]
        seed: Option<u64>,
        /// Simulated time in ms, 1 to 3600000 (default: the scenario's); the
        /// warm-up is cut to at most a tenth of it.
        #[arg(long, value_name = "MS")]
        duration_ms: Option<u64>,
        /// Never show the progress bar (shown only on a terminal anyway).
        #[arg(long)]
        no_progress: bool,
    },
    /// Print a preset's full configuration as TOML, as a starting point for your own.
    Config {
        /// testbed-switched, testbed-switchless, rack27-tor, rack27-torus3d or torus1000.
        preset: String,
    },
    /// Capex of switched vs switchless for N storage nodes, and a plot against scale.
    Cost {
        /// Storage nodes to price, 2 to 10000.
        #[arg(long, default_value_t = 20)]
        nodes: u32,
        /// Largest node count of the plot against scale, 4 to 10000.
        #[arg(long, default_value_t = 64)]
        max_nodes: u32,
        /// TOML file overriding any of the default prices.
        #[arg(long)]
        prices: Option<PathBuf>,
        /// Directory for capex.svg and capex.json.
        #[arg(long, default_value = "sim-out")]
        out: PathBuf,
    },
    /// Reproduce a paper's scenarios and print claim | paper | Trellis (only `nsdi26`).
    Reproduce {
        /// The paper: nsdi26 (the only one so far).
        which: String,
        /// Directory for the per-scenario results and plots.
        #[arg(long, default_value = "sim-out/nsdi26")]
        out: PathBuf,
        /// Shorter simulated times (for CI smoke runs); numbers are noisier.
        #[arg(long)]
        quick: bool,
        /// Seed every scenario with this (default: each config's own, 1), to see how much a
        /// row moves with the random draws alone.
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Open-loop load sweep: each preset at each offered load (a multiple of every client's
    /// link rate), past the knee; sweep.json, latency and throughput plots, and a table.
    Sweep {
        /// Presets to compare at equal offered load.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "testbed-switched,testbed-switchless"
        )]
        presets: Vec<String>,
        /// Offered loads, as multiples of one client port's link rate (the same absolute
        /// rate for every preset, whatever its client attachment).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "0.1,0.2,0.4,0.6,0.8,0.9,1.0,1.1,1.2"
        )]
        loads: Vec<f64>,
        /// Simulated time of every point (default: the preset's).
        #[arg(long)]
        duration_ms: Option<u64>,
        /// Directory for sweep.json, the plots and (with --emit-jobs) the points.
        #[arg(long, default_value = "sim-out/sweep")]
        out: PathBuf,
        /// Do not run: write one config per point under OUT/points and print the
        /// `trellis sim run` command of each (for GNU parallel or a Slurm array).
        #[arg(long, conflicts_with = "merge")]
        emit_jobs: bool,
        /// Do not run: collect OUT/runs/*/results.json of emitted points.
        #[arg(long)]
        merge: bool,
    },
    /// The Gimbal appendix's interference cases (bench/jobs/fairness) on one simulated
    /// drive with the daemon's scheduler core, QoS off vs Gimbal; fairness.json and a table.
    Fairness {
        /// Cases to run: intensity, size, pattern_rand, pattern_seq (default: all).
        #[arg(long = "case", value_name = "CASE")]
        cases: Vec<String>,
        /// A tenant's Gimbal weight, NAME=W (repeatable; default 1).
        #[arg(long = "weight", value_name = "NAME=W")]
        weights: Vec<String>,
        /// Measured device time per phase in ms, 10 to 600000 (default 250: an 8 s
        /// `bench/fairness.sh` run at time_scale 32).
        #[arg(long, default_value_t = 250)]
        runtime_ms: u64,
        /// Unmeasured device time at the start of each phase, ms (default 31: the
        /// bench's 1 s ramp at time_scale 32).
        #[arg(long, default_value_t = 31)]
        ramp_ms: u64,
        /// Drive precondition: clean or fragmented.
        #[arg(long, default_value = "clean")]
        precondition: String,
        /// Gimbal's drive-specific constants: auto (calibrated to the drive, the
        /// daemon's default) or off (the published constants).
        #[arg(long, default_value = "auto")]
        calibrate: String,
        /// Program suspend for host reads, µs (default: the profile's; 0 = off).
        #[arg(long, value_name = "US")]
        program_suspend_us: Option<u64>,
        /// Erase suspend for host reads, µs (default: the profile's; 0 = off).
        #[arg(long, value_name = "US")]
        erase_suspend_us: Option<u64>,
        /// Directory for fairness.json.
        #[arg(long, default_value = "sim-out/fairness")]
        out: PathBuf,
    },
    /// A fleet of drives with wear and injected failures over simulated months: the
    /// drive-health predictor vs a SMART critical-warning baseline; JSON, SVG and a table.
    HealthFleet(health::HealthFleetArgs),
    /// Engine benchmark: events/s per core and memory per node; writes JSON.
    Bench {
        /// Where to write the JSON results.
        #[arg(long, default_value = "sim-out/bench.json")]
        out: PathBuf,
        /// Simulated time of the 27-node 3D torus 600GbE preset.
        #[arg(long, default_value_t = 1000)]
        rack_ms: u64,
        /// Storage nodes of the large torus (memory check).
        #[arg(long, default_value_t = 1000)]
        big_nodes: u32,
        /// Simulated time of the large torus, in ms.
        #[arg(long, default_value_t = 2)]
        big_ms: u64,
    },
}

pub fn preset(name: &str) -> Result<SimConfig> {
    let randread = JobConfig {
        name: "randread-4k".into(),
        qd: 32,
        ..JobConfig::default()
    };
    Ok(match name {
        "testbed-switched" => reproduce::testbed(true, Precondition::Clean, randread, 20),
        "testbed-switchless" => reproduce::testbed(false, Precondition::Clean, randread, 20),
        "rack27-tor" | "rack27-torus3d" => {
            // Systor-like mix at 10% of each client's 400GbE link (135 GB/s offered in total).
            let job = reproduce::synthetic("systor", 0.1, 400);
            reproduce::rack27(name == "rack27-tor", TopologyKind::Torus3d, job, 20)
        }
        "torus1000" => torus_big(1000, 2),
        _ => bail!("unknown preset {name:?}: use one of {}", PRESETS.join(", ")),
    })
}

/// Every name [`preset`] knows.
pub const PRESETS: &[&str] = &[
    "testbed-switched",
    "testbed-switchless",
    "rack27-tor",
    "rack27-torus3d",
    "torus1000",
];

/// Longest simulated time `--duration-ms` accepts (one simulated hour: far
/// beyond any preset, and small enough that the time in ns fits a u64).
pub const MAX_DURATION_MS: u64 = 3_600_000;
/// Node counts `sim cost` prices (a switchless fabric needs two nodes).
pub const COST_NODES: std::ops::RangeInclusive<u32> = 2..=10_000;

fn check_duration_ms(ms: u64) -> Result<u64> {
    if !(1..=MAX_DURATION_MS).contains(&ms) {
        bail!("--duration-ms {ms}: simulated time must be 1 to {MAX_DURATION_MS} ms: use e.g. --duration-ms 20");
    }
    Ok(ms * 1_000_000)
}

/// What the engine needs of any scenario, from a file or a preset.
fn check_times(cfg: &SimConfig, from: &str) -> Result<()> {
    if cfg.duration_ns == 0 || cfg.duration_ns > MAX_DURATION_MS * 1_000_000 {
        bail!(
            "{from}: duration_ns {} must be 1 to {} (a simulated hour)",
            cfg.duration_ns,
            MAX_DURATION_MS * 1_000_000
        );
    }
    if cfg.warmup_ns >= cfg.duration_ns {
        bail!(
            "{from}: warmup_ns {} must be less than duration_ns {}: nothing would be measured",
            cfg.warmup_ns,
            cfg.duration_ns
        );
    }
    Ok(())
}

/// A large 3D torus for the memory target: static-mapped SSDs (no FTL tables).
pub fn torus_big(nodes: u32, ms: u64) -> SimConfig {
    SimConfig {
        name: format!("torus{nodes}"),
        duration_ns: ms * 1_000_000,
        warmup_ns: ms * 100_000,
        topology: TopologyConfig {
            kind: TopologyKind::Torus3d,
            storage_nodes: nodes,
            node_gbps: 600,
            hosts: nodes,
            host_gbps: 200,
            ..TopologyConfig::default()
        },
        ssd: SsdConfig {
            per_node: 4,
            static_map: true,
            blocks_per_lun: 8,
            ..SsdConfig::default()
        },
        workload: WorkloadConfig {
            jobs: vec![JobConfig {
                name: "uniform-4k".into(),
                qd: 8,
                read_pct: 95,
                ..JobConfig::default()
            }],
        },
        gimbal: reproduce::warm_gimbal(),
        ..SimConfig::default()
    }
}

/// Job fields only `kind = "fio"` jobs read: the synthetic, trace and YCSB
/// generators take their mix from their model, trace or workload.
const FIO_ONLY_FIELDS: &[&str] = &["read_pct", "sizes"];

/// A scenario as TOML, without the fields its jobs ignore (a user editing
/// `read_pct` of a `systor` job would see no effect), with a note saying so.
pub fn config_toml(cfg: &SimConfig) -> Result<String> {
    let mut v = toml::Value::try_from(cfg)?;
    let mut dropped = false;
    let jobs = v
        .get_mut("workload")
        .and_then(|w| w.get_mut("jobs"))
        .and_then(|j| j.as_array_mut());
    for job in jobs.into_iter().flatten() {
        let fio = job
            .get("job")
            .and_then(|k| k.get("kind"))
            .and_then(|k| k.as_str())
            == Some("fio");
        if let (false, Some(t)) = (fio, job.as_table_mut()) {
            for f in FIO_ONLY_FIELDS {
                dropped |= t.remove(*f).is_some();
            }
        }
    }
    let mut out = String::new();
    if dropped {
        out.push_str("# read_pct and sizes are left out of jobs that are not kind = \"fio\":\n# their model, trace or YCSB workload sets the mix.\n");
    }
    out.push_str(&toml::to_string_pretty(&v)?);
    Ok(out)
}

fn load_config(path: &Path) -> Result<SimConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let at = || format!("in {}", path.display());
    // Typed first, so that errors name the field and line; then the raw
    // tree, for fields that parse but would be ignored.
    let (cfg, raw): (SimConfig, serde_json::Value) =
        if path.extension().is_some_and(|e| e == "json") {
            let cfg = serde_json::from_str(&text).with_context(at)?;
            (cfg, serde_json::from_str(&text).with_context(at)?)
        } else {
            let cfg = toml::from_str(&text).with_context(at)?;
            let v: toml::Value = toml::from_str(&text).with_context(at)?;
            (cfg, serde_json::to_value(v).with_context(at)?)
        };
    refuse_ignored_job_fields(&raw).with_context(at)?;
    Ok(cfg)
}

/// A job that sets a field its kind never reads (`read_pct` on a `systor`
/// model) would run as if the field were not there: refuse it instead.
fn refuse_ignored_job_fields(raw: &serde_json::Value) -> Result<()> {
    let jobs = raw
        .pointer("/workload/jobs")
        .and_then(|j| j.as_array())
        .map_or(&[][..], |j| j.as_slice());
    for (i, job) in jobs.iter().enumerate() {
        let kind = job
            .pointer("/job/kind")
            .and_then(|k| k.as_str())
            .unwrap_or("fio");
        if kind == "fio" {
            continue;
        }
        if let Some(f) = FIO_ONLY_FIELDS.iter().find(|f| job.get(**f).is_some()) {
            let name = job.get("name").and_then(|n| n.as_str()).unwrap_or("");
            anyhow::bail!(
                "job {} ({name:?}): {f} does nothing for kind = \"{kind}\" (its model, trace or YCSB workload sets the mix): remove it, or use kind = \"fio\"",
                i + 1
            );
        }
    }
    Ok(())
}

pub fn run(args: SimArgs) -> Result<()> {
    match args.cmd {
        SimCmd::Run {
            config,
            preset: p,
            out,
            seed,
            duration_ms,
            no_progress,
        } => {
            let cfg = run_config(config, p, seed, duration_ms)?;
            cmd_run(cfg, &out, !no_progress)
        }
        SimCmd::Config { preset: p } => {
            print!("{}", config_toml(&preset(&p)?)?);
            Ok(())
        }
        SimCmd::Cost {
            nodes,
            max_nodes,
            prices,
            out,
        } => cmd_cost(nodes, max_nodes, prices, &out),
        SimCmd::Reproduce {
            which,
            out,
            quick,
            seed,
        } => cmd_reproduce(&which, &out, quick, seed),
        SimCmd::Fairness {
            cases,
            weights,
            runtime_ms,
            ramp_ms,
            precondition,
            calibrate,
            program_suspend_us,
            erase_suspend_us,
            out,
        } => cmd_fairness(
            &cases,
            &weights,
            (runtime_ms, ramp_ms),
            &precondition,
            &calibrate,
            (program_suspend_us, erase_suspend_us),
            &out,
        ),
        SimCmd::HealthFleet(a) => health::cmd_health_fleet(&a),
        SimCmd::Bench {
            out,
            rack_ms,
            big_nodes,
            big_ms,
        } => cmd_bench(&out, rack_ms, big_nodes, big_ms),
        SimCmd::Sweep {
            presets,
            loads,
            duration_ms,
            out,
            emit_jobs,
            merge,
        } => {
            if let Some(ms) = duration_ms {
                check_duration_ms(ms)?;
            }
            cmd_sweep(&presets, &loads, duration_ms, &out, emit_jobs, merge)
        }
    }
}

/// `sim run`'s configuration: the file or the preset, with `--seed` and
/// `--duration-ms` applied, its times checked.
fn run_config(
    config: Option<PathBuf>,
    p: Option<String>,
    seed: Option<u64>,
    duration_ms: Option<u64>,
) -> Result<SimConfig> {
    let (mut cfg, from) = match (config, p) {
        (Some(c), _) => (load_config(&c)?, c.display().to_string()),
        (None, Some(p)) => (preset(&p)?, format!("preset {p}")),
        (None, None) => bail!("give --config FILE or --preset NAME"),
    };
    if let Some(s) = seed {
        cfg.seed = s;
    }
    if let Some(ms) = duration_ms {
        cfg.duration_ns = check_duration_ms(ms)?;
        cfg.warmup_ns = cfg.warmup_ns.min(cfg.duration_ns / 10);
    }
    check_times(&cfg, &from)?;
    Ok(cfg)
}

/// `sim reproduce nsdi26`: run it, print the table and the wall time.
fn cmd_reproduce(which: &str, out: &Path, quick: bool, seed: Option<u64>) -> Result<()> {
    if which != "nsdi26" {
        bail!("only `reproduce nsdi26` exists");
    }
    let t0 = std::time::Instant::now();
    let scale = Scale {
        seed,
        ..if quick { Scale::quick() } else { Scale::full() }
    };
    let rep = reproduce::nsdi26(scale, out, true)?;
    println!("{}", reproduce::format_table(&rep.rows));
    println!(
        "wall time {:.1} s; outputs in {}",
        t0.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}

fn cmd_sweep(
    presets: &[String],
    loads: &[f64],
    duration_ms: Option<u64>,
    out: &Path,
    emit_jobs: bool,
    merge: bool,
) -> Result<()> {
    use crate::sweep;
    let mut rows = Vec::new();
    if merge {
        let runs = out.join("runs");
        let dirs =
            std::fs::read_dir(&runs).with_context(|| format!("reading {}", runs.display()))?;
        for d in dirs {
            let f = d?.path().join("results.json");
            let text =
                std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
            let v: serde_json::Value = serde_json::from_str(&text)?;
            rows.push(sweep::row_from_json(&v)?);
        }
    } else {
        let pts = sweep::points(presets, loads, preset, duration_ms)?;
        if emit_jobs {
            let dir = out.join("points");
            std::fs::create_dir_all(&dir)?;
            for (i, p) in pts.iter().enumerate() {
                let f = dir.join(format!("{i:04}.toml"));
                std::fs::write(&f, toml::to_string_pretty(&p.cfg)?)?;
                println!(
                    "trellis sim run --no-progress --config {} --out {}",
                    f.display(),
                    out.join("runs").join(format!("{i:04}")).display()
                );
            }
            eprintln!("then: trellis sim sweep --merge --out {}", out.display());
            return Ok(());
        }
        let cfgs: Vec<SimConfig> = pts.into_iter().map(|p| p.cfg).collect();
        for r in reproduce::run_all(cfgs, true)? {
            rows.push(sweep::row(&r)?);
        }
    }
    print!("{}", sweep::write_outputs(out, &mut rows)?);
    println!("outputs in {}", out.display());
    Ok(())
}

fn cmd_run(cfg: SimConfig, out: &Path, progress: bool) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let o = run_sim(cfg.clone(), progress)?;
    let r = &o.results;
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(r)?)?;
    std::fs::write(
        out.join("perf.json"),
        serde_json::to_string_pretty(&o.perf)?,
    )?;
    write_run_plots(out, r)?;
    println!(
        "{}: {} storage nodes, {} SSDs, {:?}",
        r.name, r.storage_nodes, r.ssds, r.mechanisms
    );
    for (op, s) in [("read", &r.read), ("write", &r.write)] {
        println!("  {op:5}: {:>10.1} MB/s {:>9.1} kIOPS  avg {:>8.1} us  p99 {:>8.1} us  p99.9 {:>8.1} us", s.mb_s, s.kiops, s.lat_avg_us, s.lat_p99_us, s.lat_p999_us);
    }
    if let Some(y) = &r.ycsb {
        println!(
            "  ycsb : {:.1} kops/s, read avg {:.1} us, p99.9 {:.1} us",
            y.kops_s, y.read_lat_avg_us, y.read_lat_p999_us
        );
    }
    if let Some(f) = &r.failure {
        let recovery = match (f.dipped, f.recovery_ns) {
            (false, _) => "none needed (no measurable dip)".to_string(),
            (true, Some(ns)) => format!("{:.2} ms", ns as f64 / 1e6),
            (true, None) => "not within the run".to_string(),
        };
        println!(
            "  failure at {} ns: drop {:.1}%, recovery {recovery}",
            f.at_ns,
            f.throughput_drop * 100.0,
        );
    }
    println!(
        "  links: mean util {:.3}, max {:.3}; events {}, {:.2} M events/s, peak RSS {} MiB",
        r.link_util_mean,
        r.link_util_max,
        o.perf.events,
        o.perf.events_per_s / 1e6,
        o.perf.peak_rss_bytes >> 20
    );
    println!("  wrote {}", out.display());
    Ok(())
}

/// `sim run`'s plots: the latency CDFs and the throughput over time.
fn write_run_plots(out: &Path, r: &run::Results) -> Result<()> {
    let cdf = [
        Series {
            name: "read",
            points: r.read.cdf.clone(),
        },
        Series {
            name: "write",
            points: r.write.cdf.clone(),
        },
    ];
    std::fs::write(
        out.join("latency-cdf.svg"),
        line_chart(
            &format!("{}: latency CDF", r.name),
            "latency (us, log)",
            "fraction",
            &cdf,
            true,
        ),
    )?;
    let ts: Vec<(f64, f64)> = r
        .timeseries_mb_s
        .iter()
        .enumerate()
        .map(|(i, &y)| (i as f64 * r.timeseries_bin_ns as f64 / 1e6, y))
        .collect();
    std::fs::write(
        out.join("throughput.svg"),
        line_chart(
            &format!("{}: throughput", r.name),
            "time (ms)",
            "MB/s",
            &[Series {
                name: "total",
                points: ts,
            }],
            false,
        ),
    )?;
    Ok(())
}

fn cmd_cost(nodes: u32, max_nodes: u32, prices: Option<PathBuf>, out: &Path) -> Result<()> {
    for (flag, n, range) in [
        ("--nodes", nodes, COST_NODES),
        ("--max-nodes", max_nodes, 4..=*COST_NODES.end()),
    ] {
        if !range.contains(&n) {
            bail!(
                "{flag} {n}: must be {} to {}: a switchless fabric needs at least two nodes to cable together",
                range.start(),
                range.end()
            );
        }
    }
    let pr: Prices = match prices {
        Some(p) => {
            let text =
                std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            toml::from_str(&text).with_context(|| format!("in {}", p.display()))?
        }
        None => Prices::default(),
    };
    let c = capex(nodes, &pr);
    println!("capex for {nodes} storage nodes");
    println!(
        "  switched   ${:>10.0}  ({})",
        c.switched_usd, c.switch_plan
    );
    for (what, n, p) in &c.switched_items {
        println!("      {n:>5} x {what:<32} ${p:>8.0}");
    }
    println!("  switchless ${:>10.0}", c.switchless_usd);
    for (what, n, p) in &c.switchless_items {
        println!("      {n:>5} x {what:<32} ${p:>8.0}");
    }
    println!(
        "  saving     {:.1}%  (paper, second-hand: ~$105k vs ~$52k, 50.5% at 20 nodes)",
        c.saving * 100.0
    );
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("capex.svg"),
        reproduce::capex_svg(&pr, 2, max_nodes),
    )?;
    let curve: Vec<_> = (2..=max_nodes).map(|n| capex(n, &pr)).collect();
    std::fs::write(
        out.join("capex.json"),
        serde_json::to_string_pretty(
            &serde_json::json!({ "prices": pr, "at": c, "curve": curve }),
        )?,
    )?;
    println!("  wrote {}/capex.svg and capex.json", out.display());
    Ok(())
}

fn cmd_bench(out: &Path, rack_ms: u64, big_nodes: u32, big_ms: u64) -> Result<()> {
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d)?;
    }
    // The large torus first, so that the process's peak RSS is its own.
    let rss0 = run::rss_bytes();
    let big = run_sim(torus_big(big_nodes, big_ms), true)?;
    let big_peak = run::peak_rss_bytes();
    println!(
        "torus{big_nodes}: {} simulated nodes, peak RSS {} MiB ({} KiB/node), {:.2} M events/s",
        big.perf.simulated_nodes,
        big_peak >> 20,
        (big_peak - rss0) / big.perf.simulated_nodes as u64 / 1024,
        big.perf.events_per_s / 1e6
    );
    let rack = run_sim(
        preset("rack27-torus3d").map(|c| SimConfig {
            duration_ns: rack_ms * 1_000_000,
            warmup_ns: rack_ms * 100_000,
            ..c
        })?,
        true,
    )?;
    println!(
        "rack27 3D torus 600GbE, {rack_ms} ms simulated: {:.1} s wall, {} events, {:.2} M events/s (one core)",
        rack.perf.wall_s,
        rack.perf.events,
        rack.perf.events_per_s / 1e6
    );
    let j = serde_json::json!({
        "rack27_torus3d_600g": { "simulated_ms": rack_ms, "perf": rack.perf, "read_kiops": rack.results.read.kiops, "write_kiops": rack.results.write.kiops },
        "large_torus": { "storage_nodes": big_nodes, "simulated_ms": big_ms, "perf": big.perf, "peak_rss_bytes": big_peak, "rss_per_simulated_node_bytes": (big_peak - rss0) / big.perf.simulated_nodes as u64 },
        "cores_used": 1,
    });
    std::fs::write(out, serde_json::to_string_pretty(&j)?)?;
    println!("wrote {}", out.display());
    Ok(())
}
