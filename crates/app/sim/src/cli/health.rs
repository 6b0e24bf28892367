//! `trellis sim health-fleet`: the flags checked, the fleet run, the table printed,
//! the JSON and the plot written.

use super::*;
use crate::health_fleet::{run_fleet, FleetConfig};
use trellis_health::{HealthConfig, NS_PER_HOUR};

/// Limits of the flags: memory is one record per drive and time is drives × samples.
pub const MAX_FLEET_DRIVES: u32 = 200_000;
pub const MAX_FLEET_DAYS: u32 = 3650;

#[derive(clap::Args, Debug)]
pub struct HealthFleetArgs {
    /// Drives in the fleet, 1 to 200000.
    #[arg(long, default_value_t = 10_000)]
    pub drives: u32,
    /// Simulated days, 1 to 3650.
    #[arg(long, default_value_t = 730)]
    pub days: u32,
    /// Hours between telemetry samples of a drive, 1 to 24.
    #[arg(long, default_value_t = 1)]
    pub sample_hours: u64,
    /// Random seed; equal seeds give equal fleets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Annual failure rate, % (default 1.5: [Schroeder16]'s 1–2 % replaced a year).
    #[arg(long, default_value_t = crate::health_fleet::ANNUAL_FAILURE_PCT)]
    pub afr_pct: f64,
    /// A flag is true when the drive fails within this many days of it, 1 to 365.
    #[arg(long, default_value_t = crate::health_fleet::WINDOW_DAYS)]
    pub window_days: u32,
    /// Predictor: distinct days with new media errors that predict a failure
    /// (default: trellis-health's).
    #[arg(long)]
    pub error_days: Option<u32>,
    /// Predictor: the window of those days, 1 to 32 (default: trellis-health's).
    #[arg(long)]
    pub error_window_days: Option<u32>,
    /// Where to write the JSON report.
    #[arg(long, default_value = "sim-out/health/health-fleet.json")]
    pub json: PathBuf,
    /// Where to write the SVG plot (share of failures flagged at least L days ahead).
    #[arg(long, default_value = "sim-out/health/health-fleet.svg")]
    pub svg: PathBuf,
}

pub(super) fn cmd_health_fleet(a: &HealthFleetArgs) -> Result<()> {
    if !(1..=MAX_FLEET_DRIVES).contains(&a.drives) {
        bail!("--drives {}: use 1 to {MAX_FLEET_DRIVES}", a.drives);
    }
    if !(1..=MAX_FLEET_DAYS).contains(&a.days) {
        bail!("--days {}: use 1 to {MAX_FLEET_DAYS}", a.days);
    }
    if !(1..=24).contains(&a.sample_hours) {
        bail!("--sample-hours {}: use 1 to 24", a.sample_hours);
    }
    if !(1..=365).contains(&a.window_days) {
        bail!("--window-days {}: use 1 to 365", a.window_days);
    }
    if !(0.0..=100.0).contains(&a.afr_pct) {
        bail!("--afr-pct {}: use 0 to 100", a.afr_pct);
    }
    let cfg = FleetConfig {
        drives: a.drives,
        days: a.days,
        sample_interval_ns: a.sample_hours * NS_PER_HOUR,
        seed: a.seed,
        annual_failure_pct: a.afr_pct,
        window_days: a.window_days,
        ..FleetConfig::default()
    };
    let mut hc = HealthConfig::default();
    if let Some(w) = a.error_window_days {
        if !(1..=trellis_health::ERROR_DAYS_MAX as u32).contains(&w) {
            bail!(
                "--error-window-days {w}: use 1 to {}",
                trellis_health::ERROR_DAYS_MAX
            );
        }
        hc.error_window_days = w;
    }
    if let Some(d) = a.error_days {
        if !(1..=hc.error_window_days).contains(&d) {
            bail!(
                "--error-days {d}: use 1 to the window ({} days)",
                hc.error_window_days
            );
        }
        hc.error_days_threshold = d;
    }
    let t0 = std::time::Instant::now();
    let rep = run_fleet(&cfg, &hc);
    print!("{}", rep.table());
    println!(
        "{} drives, {:.0} drive-years, {} failures; wall time {:.1} s",
        cfg.drives,
        rep.drive_years,
        rep.failures,
        t0.elapsed().as_secs_f64()
    );
    for (path, body) in [
        (&a.json, serde_json::to_string_pretty(&rep)?),
        (&a.svg, rep.svg()),
    ] {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        std::fs::write(path, body).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
