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
use scenarios::nsdi26_configs;
pub use scenarios::{
    fast_ssds, rack27, synthetic, testbed, testbed_attached, warm_gimbal, TESTBED_NODES, TRACE_LOAD,
};
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

pub fn nsdi26(scale: Scale, out_dir: &Path, progress: bool) -> Result<Report> {
    std::fs::create_dir_all(out_dir)?;
    let (sm, lg) = (scale.small_ms, scale.large_ms);
    let mut cfgs = nsdi26_configs(sm, lg);
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
