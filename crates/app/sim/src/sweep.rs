//! `trellis sim sweep`: open-loop offered load raised step by step past the
//! knee of min(network, storage), for several presets (typically the switched
//! and the switchless design of one setup), so the fabrics are compared at
//! equal offered load. Each point is an independent run: `--emit-jobs` writes
//! one config per point and prints the command that runs it (GNU parallel, a
//! Slurm array), `--merge` collects their results.

use crate::config::{JobKind, SimConfig};
use crate::run::Results;
use crate::svg::{line_chart, Series};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::Path;

/// Highest offered load accepted, as a multiple of each client's link rate.
pub const MAX_LOAD: f64 = 10.0;
/// Most points one sweep may have (presets × loads).
pub const MAX_POINTS: usize = 1000;
/// Separates preset and load in a point's run name (parsed back by `--merge`).
const NAME_SEP: &str = "@load=";

/// One point: `preset` at `load` × the rate of one client port (`host_gbps`), open
/// loop; the same absolute offered rate whatever the client's attachment.
pub struct Point {
    pub preset: String,
    pub load: f64,
    pub cfg: SimConfig,
}

/// Mean I/O size in bytes of a preset's first job.
fn mean_io_bytes(cfg: &SimConfig) -> Result<f64> {
    let job = cfg.workload.jobs.first().context("the preset has no job")?;
    let sizes = match &job.job {
        JobKind::Fio => job.sizes.clone(),
        JobKind::Synthetic { model } => crate::workload::synthetic_model(model)?.1,
        _ => bail!("sweep needs an fio-like or synthetic job (its offered rate is set per point)"),
    };
    Ok(crate::workload::SizeMix::new(&sizes)?.mean())
}

/// Every point of the sweep, from presets (by name) and loads.
pub fn points(
    presets: &[String],
    loads: &[f64],
    preset: impl Fn(&str) -> Result<SimConfig>,
    duration_ms: Option<u64>,
) -> Result<Vec<Point>> {
    if presets.is_empty() || loads.is_empty() {
        bail!("give at least one preset and one load");
    }
    if presets.len() * loads.len() > MAX_POINTS {
        bail!(
            "{} points: at most {MAX_POINTS}",
            presets.len() * loads.len()
        );
    }
    let mut out = Vec::new();
    for p in presets {
        let base = preset(p)?;
        let mean = mean_io_bytes(&base)?;
        for &load in loads {
            if !(load.is_finite() && load > 0.0 && load <= MAX_LOAD) {
                bail!("load {load}: use a multiple of the client link rate in (0, {MAX_LOAD}]");
            }
            let mut cfg = base.clone();
            let host_bytes_per_s = cfg.topology.host_gbps as f64 * 1e9 / 8.0;
            let job = &mut cfg.workload.jobs[0];
            job.qd = 0;
            job.iops = ((load * host_bytes_per_s / mean) as u64).max(1);
            cfg.name = format!("{p}{NAME_SEP}{load}");
            if let Some(ms) = duration_ms {
                cfg.duration_ns = ms * 1_000_000;
                cfg.warmup_ns = cfg.warmup_ns.min(cfg.duration_ns / 10);
            }
            out.push(Point {
                preset: p.clone(),
                load,
                cfg,
            });
        }
    }
    Ok(out)
}

/// One row of `sweep.json`.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub preset: String,
    /// Offered load as a multiple of each client's link rate.
    pub load: f64,
    pub fabric: String,
    pub achieved_mb_s: f64,
    pub read_lat_avg_us: f64,
    pub read_lat_p99_us: f64,
    pub read_lat_p999_us: f64,
    pub write_lat_avg_us: f64,
    /// Little's law error and I/Os cut off at the end (see docs/sim.md).
    pub little_error: f64,
    pub censored_ios: u64,
}

/// A row from a point's results (`results.json` as written by `trellis sim
/// run`); the preset and load come from its run name.
pub fn row(r: &Results) -> Result<Row> {
    row_from_json(&serde_json::to_value(r)?)
}

/// The same from the JSON of `results.json` (`--merge`).
pub fn row_from_json(v: &serde_json::Value) -> Result<Row> {
    let name = v["name"].as_str().context("results without a name")?;
    let (preset, load) = name
        .split_once(NAME_SEP)
        .with_context(|| format!("run {name:?} is not a sweep point"))?;
    let f = |path: &[&str]| -> Result<f64> {
        let mut x = v;
        for k in path {
            x = &x[*k];
        }
        x.as_f64()
            .with_context(|| format!("{name}: no number at {}", path.join(".")))
    };
    Ok(Row {
        preset: preset.into(),
        load: load.parse().with_context(|| format!("load in {name:?}"))?,
        fabric: v["fabric"].as_str().unwrap_or("").into(),
        achieved_mb_s: f(&["total_mb_s"])?,
        read_lat_avg_us: f(&["read", "lat_avg_us"])?,
        read_lat_p99_us: f(&["read", "lat_p99_us"])?,
        read_lat_p999_us: f(&["read", "lat_p999_us"])?,
        write_lat_avg_us: f(&["write", "lat_avg_us"])?,
        little_error: f(&["little", "error"])?,
        censored_ios: f(&["little", "censored_ios"])? as u64,
    })
}

/// Writes sweep.json, the two plots, and returns the table as text.
pub fn write_outputs(dir: &Path, rows: &mut [Row]) -> Result<String> {
    rows.sort_by(|a, b| {
        (&a.preset, a.load)
            .partial_cmp(&(&b.preset, b.load))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("sweep.json"), serde_json::to_string_pretty(&rows)?)?;
    let mut presets: Vec<&str> = rows.iter().map(|r| r.preset.as_str()).collect();
    presets.dedup();
    for (file, title, ylabel, y) in [
        (
            "sweep-latency.svg",
            "avg read latency vs offered load",
            "us",
            0,
        ),
        (
            "sweep-throughput.svg",
            "throughput vs offered load",
            "MB/s",
            1,
        ),
    ] {
        let series: Vec<Series> = presets
            .iter()
            .map(|p| Series {
                name: p,
                points: rows
                    .iter()
                    .filter(|r| r.preset == *p)
                    .map(|r| {
                        (
                            r.load,
                            if y == 0 {
                                r.read_lat_avg_us
                            } else {
                                r.achieved_mb_s
                            },
                        )
                    })
                    .collect(),
            })
            .collect();
        let svg = line_chart(
            title,
            "offered load (x client link rate)",
            ylabel,
            &series,
            false,
        );
        std::fs::write(dir.join(file), svg)?;
    }
    let mut t = String::from(
        "preset | load | MB/s | read avg us | read p99 us | read p99.9 us | Little err | censored\n",
    );
    for r in rows.iter() {
        t += &format!(
            "{} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1}% | {}\n",
            r.preset,
            r.load,
            r.achieved_mb_s,
            r.read_lat_avg_us,
            r.read_lat_p99_us,
            r.read_lat_p999_us,
            r.little_error * 100.0,
            r.censored_ios
        );
    }
    Ok(t)
}
