//! `trellis sim health-fleet`: a fleet of drives with wear and injected failure modes
//! over simulated months, each watched by a [`trellis_health::DrivePredictor`] and by
//! the reactive baseline (a drive is flagged only once its SMART Critical Warning is
//! non-zero). Model, parameters and their sources: docs/drive-health.md. Tags: [R] our
//! choice, [D] derived, keys in docs/sources.md.
//!
//! Drives are independent, so each is simulated start to end on its own virtual clock
//! with its own seeded PRNG and only its outcome ([`DriveOutcome`]) is kept: memory is
//! one small record per drive, whatever the horizon.

use crate::engine::Rng;
use serde::Serialize;
use trellis_health::{DrivePredictor, HealthConfig, HealthState, Sample, NS_PER_DAY, NS_PER_HOUR};

/// [Schroeder16] ~1–2 % of drives replaced a year; [R] the midpoint.
pub const ANNUAL_FAILURE_PCT: f64 = 1.5;
/// [R] Share of failures per mode: abrupt, gradual wear-out, latency degradation.
pub const MODE_MIX: [f64; 3] = [0.4, 0.3, 0.3];
/// [R] Vendor threshold of Available Spare (as trellis-ssd's `AVAILABLE_SPARE_THRESHOLD_PCT`).
pub const SPARE_THRESHOLD_PCT: u8 = 10;
/// [R] Lifetime media errors at which the fleet's firmware sets Critical Warning bit 2
/// ("reliability degraded"; the spec leaves "significant" to the vendor). Not 1 as in
/// trellis-ssd's emulated drive: many healthy drives see an uncorrectable error
/// [Schroeder16], and a baseline that flagged each of them would be a straw man.
pub const MEDIA_ERRORS_DEGRADED: u64 = 10;
/// [R] Healthy drives: one day in 2,000 with an uncorrectable error [D] gives ~30 % of
/// drives at least one over two years, inside [Schroeder16]'s 20–63 % over four years.
pub const BACKGROUND_ERROR_DAYS: f64 = 2000.0;
/// Confounders on every drive, failing or not: clustered uncorrectable errors that
/// do not end in a failure, and lasting workload shifts. [R] 0.15 clusters a
/// drive-year of 7 days at one error day in two give, with the background, ~2 error
/// days per 1,000 drive-days [D], the low end of [Schroeder16]'s 2–6.
pub const ERROR_CLUSTERS_PER_DRIVE_YEAR: f64 = 0.15;
pub const ERROR_CLUSTER_DAYS: u64 = 7;
pub const ERROR_CLUSTER_DAY_P: f64 = 0.5;
/// [R] A lasting change of a drive's load (a new tenant): p99 ×1.5–3 from then on.
pub const LATENCY_SHIFTS_PER_DRIVE_YEAR: f64 = 0.05;
pub const LATENCY_SHIFT_FACTOR: (f64, f64) = (1.5, 3.0);
/// [R] Healthy drives: a bad block retires one point of spare every ~500 days.
pub const SPARE_STEP_DAYS: f64 = 500.0;
/// [D] 0.2–1 drive writes per day on a drive rated 1 DWPD for 5 years [PM9A3 endurance]:
/// 100 % / 1826 days × 0.2..1.
pub const HEALTHY_WEAR_PCT_PER_DAY: (f64, f64) = (0.011, 0.055);
/// [R] Drives already in service at the start, days (their wear so far).
pub const HEALTHY_AGE_DAYS: (f64, f64) = (0.0, 730.0);
/// [R] Wear-out drives: heavy writers, 2–5.5 DWPD.
pub const WEAROUT_WEAR_PCT_PER_DAY: (f64, f64) = (0.11, 0.3);
/// [R] Length of the wear-out precursor (spare falling to 0, errors growing), days.
pub const WEAROUT_PRECURSOR_DAYS: (f64, f64) = (20.0, 90.0);
/// [R] Length of the latency precursor, days; p99 grows linearly to `LATENCY_END_FACTOR`×.
pub const LATENCY_PRECURSOR_DAYS: (f64, f64) = (7.0, 60.0);
pub const LATENCY_END_FACTOR: f64 = 10.0;
/// [R] A healthy drive's p99 read latency, µs, and its sample-to-sample spread (σ of ln).
pub const BASE_P99_US: (f64, f64) = (200.0, 600.0);
pub const P99_SIGMA_LN: f64 = 0.15;
/// [R] Latency bursts (GC storms, a noisy neighbour): one every ~20 days, 1–4 h, ×2–3.
pub const BURST_EVERY_DAYS: f64 = 20.0;
pub const BURST_HOURS: (u64, u64) = (1, 4);
pub const BURST_FACTOR: (f64, f64) = (2.0, 3.0);

/// [R] A flag counts as predicting a failure that follows within a quarter: longer
/// than every horizon the predictor reports (at most 30 days) and than the longest
/// precursor modelled (90 days), short enough that a chance flag long before an
/// abrupt death is not credited.
pub const WINDOW_DAYS: u32 = 90;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Fate {
    Healthy,
    Abrupt,
    WearOut,
    Latency,
}

pub const FAILURE_MODES: [Fate; 3] = [Fate::Abrupt, Fate::WearOut, Fate::Latency];

#[derive(Clone, Debug, Serialize)]
pub struct FleetConfig {
    pub drives: u32,
    pub days: u32,
    pub sample_interval_ns: u64,
    pub seed: u64,
    pub annual_failure_pct: f64,
    pub mode_mix: [f64; 3],
    /// A flag is true when the drive fails within this many days of it.
    pub window_days: u32,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            drives: 10_000,
            days: 730,
            sample_interval_ns: NS_PER_HOUR,
            seed: 1,
            annual_failure_pct: ANNUAL_FAILURE_PCT,
            mode_mix: MODE_MIX,
            window_days: WINDOW_DAYS,
        }
    }
}

/// One drive's lifetime as drawn: everything the sampler needs, fixed up front.
#[derive(Clone, Debug)]
struct Lifetime {
    fate: Fate,
    fail_ns: u64,
    precursor_ns: u64,
    base_p99_us: f64,
    wear0_pct: f64,
    wear_pct_per_day: f64,
    shift_ns: u64,
    shift_factor: f64,
}

impl Lifetime {
    fn draw(rng: &mut Rng, c: &FleetConfig) -> Lifetime {
        let horizon_ns = u64::from(c.days) * NS_PER_DAY;
        let years = f64::from(c.days) / 365.0;
        let p_fail = 1.0 - (-c.annual_failure_pct / 100.0 * years).exp();
        let fate = if rng.unit() >= p_fail {
            Fate::Healthy
        } else {
            let u = rng.unit() * c.mode_mix.iter().sum::<f64>();
            match u {
                u if u < c.mode_mix[0] => Fate::Abrupt,
                u if u < c.mode_mix[0] + c.mode_mix[1] => Fate::WearOut,
                _ => Fate::Latency,
            }
        };
        let fail_ns = if fate == Fate::Healthy {
            u64::MAX
        } else {
            rng.below(horizon_ns.max(1))
        };
        let days = |r: &mut Rng, (lo, hi): (f64, f64)| {
            ((lo + r.unit() * (hi - lo)) * NS_PER_DAY as f64) as u64
        };
        let precursor_ns = match fate {
            Fate::WearOut => days(rng, WEAROUT_PRECURSOR_DAYS),
            Fate::Latency => days(rng, LATENCY_PRECURSOR_DAYS),
            _ => 0,
        };
        let base_p99_us = uniform(rng, BASE_P99_US);
        let (wear0_pct, wear_pct_per_day) = if fate == Fate::WearOut {
            // Percentage Used reaches 100 as the precursor starts.
            let rate = uniform(rng, WEAROUT_WEAR_PCT_PER_DAY);
            let start_days = fail_ns.saturating_sub(precursor_ns) as f64 / NS_PER_DAY as f64;
            ((100.0 - rate * start_days).max(0.0), rate)
        } else {
            let rate = uniform(rng, HEALTHY_WEAR_PCT_PER_DAY);
            (rate * uniform(rng, HEALTHY_AGE_DAYS), rate)
        };
        let shift_ns = rng.exp_ns(365.0 / LATENCY_SHIFTS_PER_DRIVE_YEAR * NS_PER_DAY as f64);
        let shift_factor = uniform(rng, LATENCY_SHIFT_FACTOR);
        Lifetime {
            fate,
            fail_ns,
            precursor_ns,
            base_p99_us,
            wear0_pct,
            wear_pct_per_day,
            shift_ns,
            shift_factor,
        }
    }

    /// How far into its precursor the drive is at `now_ns`, 0 to 1.
    fn progress(&self, now_ns: u64) -> f64 {
        let start = self.fail_ns.saturating_sub(self.precursor_ns);
        if self.precursor_ns == 0 || now_ns < start {
            return 0.0;
        }
        ((now_ns - start) as f64 / self.precursor_ns as f64).min(1.0)
    }
}

fn uniform(rng: &mut Rng, (lo, hi): (f64, f64)) -> f64 {
    lo + rng.unit() * (hi - lo)
}

/// ~N(0, 1) from three uniforms (Irwin–Hall, scaled to unit variance): cheap, bounded.
fn approx_normal(rng: &mut Rng) -> f64 {
    (rng.unit() + rng.unit() + rng.unit() - 1.5) * 2.0
}

/// The drive's telemetry, one sample at a time; bounded state.
struct DriveSim {
    life: Lifetime,
    rng: Rng,
    media_errors: u64,
    spare_lost_pct: f64,
    burst_until_ns: u64,
    burst_factor: f64,
    cluster_until_ns: u64,
}

impl DriveSim {
    fn sample(&mut self, now_ns: u64, dt_ns: u64) -> Sample {
        if now_ns >= self.life.fail_ns {
            return Sample {
                now_ns,
                ..Sample::default()
            };
        }
        let dt_days = dt_ns as f64 / NS_PER_DAY as f64;
        let x = self.life.progress(now_ns);
        let wearout = self.life.fate == Fate::WearOut;
        // Media errors: background, plus a wear-out drive's growing rate (5 % → 95 % a day).
        let mut p_err = dt_days / BACKGROUND_ERROR_DAYS;
        if now_ns >= self.cluster_until_ns
            && self.rng.unit() < dt_days * ERROR_CLUSTERS_PER_DRIVE_YEAR / 365.0
        {
            self.cluster_until_ns = now_ns + ERROR_CLUSTER_DAYS * NS_PER_DAY;
        }
        if now_ns < self.cluster_until_ns {
            p_err += ERROR_CLUSTER_DAY_P * dt_days;
        }
        if wearout && x > 0.0 {
            p_err += (0.05 + 0.9 * x) * dt_days;
        }
        if self.rng.unit() < p_err {
            self.media_errors += 1;
        }
        if self.rng.unit() < dt_days / SPARE_STEP_DAYS {
            self.spare_lost_pct += 1.0;
        }
        let mut spare = (100.0 - self.spare_lost_pct).max(0.0);
        if wearout {
            spare *= 1.0 - x; // 0 at the failure
        }
        let days = now_ns as f64 / NS_PER_DAY as f64;
        let used = (self.life.wear0_pct + self.life.wear_pct_per_day * days).min(255.0);
        let spare_pct = spare.ceil() as u8;
        let mut cw = 0;
        if spare_pct < SPARE_THRESHOLD_PCT {
            cw |= 1 << 0;
        }
        if self.media_errors >= MEDIA_ERRORS_DEGRADED {
            cw |= 1 << 2;
        }
        Sample {
            now_ns,
            responded: true,
            read_latency_p99_us: self.p99_us(now_ns, dt_ns, x),
            media_errors_total: self.media_errors,
            percentage_used: used as u8,
            available_spare_pct: spare_pct,
            available_spare_threshold_pct: SPARE_THRESHOLD_PCT,
            critical_warning: cw,
        }
    }

    fn p99_us(&mut self, now_ns: u64, dt_ns: u64, x: f64) -> f64 {
        let dt_days = dt_ns as f64 / NS_PER_DAY as f64;
        if now_ns >= self.burst_until_ns && self.rng.unit() < dt_days / BURST_EVERY_DAYS {
            let hours = BURST_HOURS.0 + self.rng.below(BURST_HOURS.1 - BURST_HOURS.0 + 1);
            self.burst_until_ns = now_ns + hours * NS_PER_HOUR;
            self.burst_factor = uniform(&mut self.rng, BURST_FACTOR);
        }
        let burst = if now_ns < self.burst_until_ns {
            self.burst_factor
        } else {
            1.0
        };
        let creep = if self.life.fate == Fate::Latency {
            1.0 + (LATENCY_END_FACTOR - 1.0) * x
        } else {
            1.0
        };
        let shift = if now_ns >= self.life.shift_ns {
            self.life.shift_factor
        } else {
            1.0
        };
        let noise = (P99_SIGMA_LN * approx_normal(&mut self.rng)).exp();
        self.life.base_p99_us * noise * burst * creep * shift
    }
}

/// The three watchers compared: the predictor's failure predictions, any of its
/// flags (Degraded counts), and the reactive SMART baseline.
pub const METHODS: [&str; 3] = ["predictor", "predictor-any", "baseline"];

/// One watcher's flags on one drive, scored against the drive's known fate: a flag
/// is true when the drive fails within the window after it is raised.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Tally {
    /// Failure time minus the start of the first true flag.
    pub lead_ns: Option<u64>,
    pub true_flags: u32,
    pub false_flags: u32,
}

impl Tally {
    fn raise(&mut self, now_ns: u64, fail_ns: Option<u64>, window_ns: u64) {
        match fail_ns {
            Some(f) if f > now_ns && f - now_ns <= window_ns => {
                self.true_flags += 1;
                self.lead_ns.get_or_insert(f - now_ns);
            }
            _ => self.false_flags += 1,
        }
    }
}

/// What became of one drive, and how each watcher did on it (in [`METHODS`] order).
#[derive(Clone, Debug, Serialize)]
pub struct DriveOutcome {
    pub fate: Fate,
    pub fail_ns: Option<u64>,
    pub tallies: [Tally; 3],
    /// When the predictor declared the drive Failed (silence).
    pub detected_failed_ns: Option<u64>,
    pub observed_ns: u64,
}

/// Simulate drive `id` of the fleet from its first sample to its end.
pub fn run_drive(c: &FleetConfig, hc: &HealthConfig, id: u32) -> DriveOutcome {
    let mut rng = Rng::new(c.seed ^ u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let life = Lifetime::draw(&mut rng, c);
    let fate = life.fate;
    let fail_ns = (fate != Fate::Healthy).then_some(life.fail_ns);
    let mut sim = DriveSim {
        life,
        rng,
        media_errors: 0,
        spare_lost_pct: 0.0,
        burst_until_ns: 0,
        burst_factor: 1.0,
        cluster_until_ns: 0,
    };
    let mut p = DrivePredictor::new(hc.clone());
    let mut o = DriveOutcome {
        fate,
        fail_ns,
        tallies: [Tally::default(); 3],
        detected_failed_ns: None,
        observed_ns: 0,
    };
    let window_ns = u64::from(c.window_days) * NS_PER_DAY;
    let dt = c.sample_interval_ns.max(1);
    let end_ns = (u64::from(c.days) * NS_PER_DAY)
        .min(fail_ns.map_or(u64::MAX, |f| f.saturating_add(NS_PER_DAY)));
    let mut baseline_on = false;
    let mut now = 0;
    while now < end_ns {
        let s = sim.sample(now, dt);
        // Critical Warning bits of this model never clear: one flag per drive.
        if s.responded && s.critical_warning != 0 && !baseline_on {
            baseline_on = true;
            o.tallies[2].raise(now, fail_ns, window_ns);
        }
        if let Some(t) = p.observe(&s) {
            let flag = |s: HealthState| {
                matches!(
                    s,
                    HealthState::Degraded | HealthState::PredictedFailure { .. }
                )
            };
            if matches!(t.to, HealthState::PredictedFailure { .. }) {
                o.tallies[0].raise(now, fail_ns, window_ns);
            }
            if flag(t.to) && !flag(t.from) {
                o.tallies[1].raise(now, fail_ns, window_ns);
            }
            if t.to == HealthState::Failed {
                o.detected_failed_ns = Some(now);
                break;
            }
        }
        now += dt;
    }
    o.observed_ns = now.min(fail_ns.unwrap_or(u64::MAX));
    o
}

pub fn mode_name(f: Fate) -> &'static str {
    match f {
        Fate::Healthy => "healthy",
        Fate::Abrupt => "abrupt",
        Fate::WearOut => "wear-out",
        Fate::Latency => "latency",
    }
}

/// One method on one failure mode ("all" = every drive; precision and false
/// flags only there, as a false flag has no failure mode).
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub method: &'static str,
    pub mode: &'static str,
    pub failures: u32,
    pub detected: u32,
    pub recall: f64,
    /// True flags / all flags raised.
    pub precision: Option<f64>,
    pub lead_days_median: Option<f64>,
    pub lead_days_p10: Option<f64>,
    pub false_flags: Option<u32>,
    pub false_flags_per_1000_drive_years: Option<f64>,
    /// Every lead time, days, ascending (for the plot).
    #[serde(skip)]
    pub leads_days: Vec<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FleetReport {
    pub config: FleetConfig,
    pub health: HealthConfig,
    pub drive_years: f64,
    pub failures: u32,
    pub rows: Vec<Row>,
}

/// Run the whole fleet and score every method.
pub fn run_fleet(c: &FleetConfig, hc: &HealthConfig) -> FleetReport {
    let outcomes: Vec<DriveOutcome> = (0..c.drives).map(|id| run_drive(c, hc, id)).collect();
    score(c, hc, &outcomes)
}

pub fn score(c: &FleetConfig, hc: &HealthConfig, outcomes: &[DriveOutcome]) -> FleetReport {
    let drive_years =
        outcomes.iter().map(|o| o.observed_ns as f64).sum::<f64>() / (365.0 * NS_PER_DAY as f64);
    let mut rows = Vec::new();
    for (i, m) in METHODS.into_iter().enumerate() {
        for mode in FAILURE_MODES {
            rows.push(row(
                m,
                i,
                mode_name(mode),
                outcomes.iter().filter(|o| o.fate == mode),
            ));
        }
        let mut all = row(
            m,
            i,
            "all",
            outcomes.iter().filter(|o| o.fate != Fate::Healthy),
        );
        let (t, f) = outcomes.iter().fold((0u32, 0u32), |(t, f), o| {
            (t + o.tallies[i].true_flags, f + o.tallies[i].false_flags)
        });
        all.precision = (t + f > 0).then(|| f64::from(t) / f64::from(t + f));
        all.false_flags = Some(f);
        all.false_flags_per_1000_drive_years =
            (drive_years > 0.0).then(|| f64::from(f) / drive_years * 1000.0);
        rows.push(all);
    }
    let failures = outcomes.iter().filter(|o| o.fate != Fate::Healthy).count() as u32;
    FleetReport {
        config: c.clone(),
        health: hc.clone(),
        drive_years,
        failures,
        rows,
    }
}

fn row<'a>(
    method: &'static str,
    i: usize,
    mode: &'static str,
    drives: impl Iterator<Item = &'a DriveOutcome>,
) -> Row {
    let mut failures = 0;
    let mut leads = Vec::new();
    for o in drives {
        failures += 1;
        if let Some(l) = o.tallies[i].lead_ns {
            leads.push(l as f64 / NS_PER_DAY as f64);
        }
    }
    leads.sort_by(f64::total_cmp);
    Row {
        method,
        mode,
        failures,
        detected: leads.len() as u32,
        recall: if failures == 0 {
            0.0
        } else {
            leads.len() as f64 / f64::from(failures)
        },
        precision: None,
        lead_days_median: quantile(&leads, 0.5),
        lead_days_p10: quantile(&leads, 0.1),
        false_flags: None,
        false_flags_per_1000_drive_years: None,
        leads_days: leads,
    }
}

/// Nearest-rank quantile of an ascending slice.
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i])
}

impl FleetReport {
    pub fn row(&self, method: &str, mode: &str) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.method == method && r.mode == mode)
    }

    /// A Markdown table of every row.
    pub fn table(&self) -> String {
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let mut s = String::from("| method | mode | failures | detected | recall | precision | lead median (d) | lead p10 (d) | false flags / 1000 drive-years |\n|---|---|---|---|---|---|---|---|---|\n");
        for r in &self.rows {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {:.2} | {} | {} | {} | {} |\n",
                r.method,
                r.mode,
                r.failures,
                r.detected,
                r.recall,
                r.precision.map_or("-".into(), |p| format!("{p:.2}")),
                f(r.lead_days_median),
                f(r.lead_days_p10),
                f(r.false_flags_per_1000_drive_years)
            ));
        }
        s
    }

    /// Recall against lead time: the share of a mode's failures flagged at least
    /// L days ahead, for the predictor and the baseline.
    pub fn svg(&self) -> String {
        use crate::svg::{line_chart, Series};
        let mut names = Vec::new();
        for m in ["predictor", "baseline"] {
            for mode in ["wear-out", "latency", "all"] {
                names.push((m, mode, format!("{m} {mode}")));
            }
        }
        let series: Vec<Series> = names
            .iter()
            .filter_map(|(m, mode, name)| {
                let r = self.row(m, mode)?;
                let n = f64::from(r.failures.max(1));
                let points = (0..=60)
                    .map(|l| {
                        let l = f64::from(l);
                        (
                            l,
                            r.leads_days.iter().filter(|&&d| d >= l).count() as f64 / n,
                        )
                    })
                    .collect();
                Some(Series { name, points })
            })
            .collect();
        line_chart(
            &format!(
                "{} drives, {} days: failures flagged at least L days ahead",
                self.config.drives, self.config.days
            ),
            "lead time L (days)",
            "fraction of failures",
            &series,
            false,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small fleet with failures made common (test only: enough of each mode to
    /// compare), sampled every two hours.
    fn small() -> FleetReport {
        let c = FleetConfig {
            drives: 1000,
            days: 365,
            sample_interval_ns: 2 * NS_PER_HOUR,
            seed: 7,
            annual_failure_pct: 25.0,
            ..FleetConfig::default()
        };
        run_fleet(&c, &HealthConfig::default())
    }

    fn get<'a>(r: &'a FleetReport, m: &str, mode: &str) -> &'a Row {
        r.row(m, mode).unwrap()
    }

    #[test]
    fn fleet_properties_the_model_makes_true() {
        let r = small();
        for mode in ["abrupt", "wear-out", "latency"] {
            assert!(get(&r, "predictor", mode).failures >= 30, "{}", r.table());
        }
        // No precursor, so neither watcher predicts an abrupt death but by chance.
        for m in ["predictor", "baseline"] {
            assert!(get(&r, m, "abrupt").recall < 0.1, "{}", r.table());
        }
        // Latency degradation never reaches SMART: the baseline misses it.
        assert!(get(&r, "baseline", "latency").recall < 0.1, "{}", r.table());
        assert!(
            get(&r, "predictor", "latency").recall > 0.8,
            "{}",
            r.table()
        );
        // Wear-out: the spare slope is seen before the spare crosses its threshold.
        let (p, b) = (
            get(&r, "predictor", "wear-out"),
            get(&r, "baseline", "wear-out"),
        );
        assert!(p.recall >= b.recall, "{}", r.table());
        assert!(p.lead_days_median >= b.lead_days_median, "{}", r.table());
        // Leads are bounded by the window.
        let w = f64::from(r.config.window_days);
        assert!(r
            .rows
            .iter()
            .flat_map(|r| &r.leads_days)
            .all(|&l| l > 0.0 && l <= w));
    }

    #[test]
    fn equal_seeds_give_equal_fleets() {
        let a = serde_json::to_string(&small()).unwrap();
        let b = serde_json::to_string(&small()).unwrap();
        assert_eq!(a, b);
    }
}
