//! The five online detectors. Each owns a fixed-size state (no allocation after
//! construction) and sees every sample of one drive in time order.

use crate::{HealthConfig, Sample, NS_PER_DAY};

/// Slots of a [`Trend`] ring: one per `interval_ns` mark, so the slope spans
/// `TREND_SLOTS - 1` intervals.
pub const TREND_SLOTS: usize = 8;
/// Slots of the error detector's day ring (days with new media errors).
pub const ERROR_DAYS_MAX: usize = 32;

/// (a) Read tail latency against the drive's own baseline. The baseline is the
/// mean over a warm-up, then a slow EWMA fed only by samples that are not
/// elevated (so a slow creep does not teach the baseline that it is normal);
/// the recent level is a fast EWMA, so one GC burst does not count.
#[derive(Clone, Debug)]
pub struct LatencyDetector {
    first_ns: Option<u64>,
    last_ns: u64,
    warm_n: u32,
    baseline_us: f64,
    recent_us: f64,
    /// Since when `recent / baseline` has been above the degraded (resp. severe) ratio.
    above_since_ns: Option<u64>,
    severe_since_ns: Option<u64>,
    below_since_ns: Option<u64>,
    /// A day-smoothed level, and the stretch over which it has stayed within the
    /// re-baseline tolerance while degraded: (since, min, max).
    daily_us: f64,
    stretch: Option<(u64, f64, f64)>,
    pub degraded: bool,
    pub severe: bool,
}

impl LatencyDetector {
    pub fn new() -> Self {
        LatencyDetector {
            first_ns: None,
            last_ns: 0,
            warm_n: 0,
            baseline_us: 0.0,
            recent_us: 0.0,
            above_since_ns: None,
            severe_since_ns: None,
            below_since_ns: None,
            daily_us: 0.0,
            stretch: None,
            degraded: false,
            severe: false,
        }
    }

    /// Recent level over baseline (0 during warm-up).
    pub fn ratio(&self) -> f64 {
        if self.warm_n == 0 || self.baseline_us <= 0.0 {
            return 0.0;
        }
        self.recent_us / self.baseline_us
    }

    pub fn observe(&mut self, c: &HealthConfig, now_ns: u64, p99_us: f64) {
        let first = *self.first_ns.get_or_insert(now_ns);
        let dt_ns = now_ns.saturating_sub(self.last_ns).max(1) as f64;
        self.last_ns = now_ns;
        if now_ns - first < c.latency_warmup_ns {
            // Warm-up: plain running mean, both levels.
            self.warm_n += 1;
            self.baseline_us += (p99_us - self.baseline_us) / f64::from(self.warm_n);
            self.recent_us = self.baseline_us;
            self.daily_us = self.baseline_us;
            return;
        }
        let a_fast = (dt_ns / c.latency_recent_tau_ns as f64).min(1.0);
        self.recent_us += a_fast * (p99_us - self.recent_us);
        let a_day = (dt_ns / c.latency_stable_tau_ns as f64).min(1.0);
        self.daily_us += a_day * (p99_us - self.daily_us);
        let ratio = self.ratio();
        if ratio < c.latency_clear_ratio {
            let a_slow = (dt_ns / c.latency_baseline_tau_ns as f64).min(1.0);
            self.baseline_us += a_slow * (p99_us - self.baseline_us);
        }
        self.update_flags(c, now_ns, ratio);
        self.rebaseline(c, now_ns);
    }

    /// A degraded level that has held steady for `latency_rebaseline_ns` is a new
    /// normal (a heavier tenant, a new workload), not a drive getting worse: learn
    /// it. A creeping level never holds within the tolerance, so it is not learnt.
    fn rebaseline(&mut self, c: &HealthConfig, now_ns: u64) {
        if !self.degraded {
            self.stretch = None;
            return;
        }
        let d = self.daily_us;
        let (since, lo, hi) = self.stretch.get_or_insert((now_ns, d, d));
        let (lo, hi) = (lo.min(d), hi.max(d));
        if lo <= 0.0 || hi / lo > c.latency_rebaseline_tolerance {
            self.stretch = Some((now_ns, d, d));
            return;
        }
        if now_ns - *since < c.latency_rebaseline_ns {
            self.stretch = Some((*since, lo, hi));
            return;
        }
        self.baseline_us = d;
        self.recent_us = d;
        self.degraded = false;
        self.severe = false;
        self.above_since_ns = None;
        self.severe_since_ns = None;
        self.stretch = None;
    }

    fn update_flags(&mut self, c: &HealthConfig, now_ns: u64, ratio: f64) {
        let since = |s: &mut Option<u64>, cond: bool| {
            if cond {
                now_ns - *s.get_or_insert(now_ns)
            } else {
                *s = None;
                0
            }
        };
        let above_ns = since(&mut self.above_since_ns, ratio > c.latency_degraded_ratio);
        let severe_ns = since(&mut self.severe_since_ns, ratio > c.latency_severe_ratio);
        let below_ns = since(&mut self.below_since_ns, ratio < c.latency_clear_ratio);
        if self.above_since_ns.is_some() && above_ns >= c.latency_sustain_ns {
            self.degraded = true;
        }
        if self.severe_since_ns.is_some() && severe_ns >= c.latency_severe_sustain_ns {
            self.severe = true;
        }
        // Hysteresis: clear only after a sustained stretch below the lower ratio.
        if self.below_since_ns.is_some() && below_ns >= c.latency_sustain_ns {
            self.degraded = false;
            self.severe = false;
        }
    }
}

impl Default for LatencyDetector {
    fn default() -> Self {
        Self::new()
    }
}

/// (b) Media-error trend: on how many of the last `error_window_days` days the
/// lifetime media-error count grew. A single uncorrectable error is common on
/// healthy drives [Schroeder16]; errors on several distinct days are the
/// "prior errors predict later ones" pattern.
#[derive(Clone, Debug)]
pub struct ErrorDetector {
    last_total: Option<u64>,
    /// Day number (since the drive's first sample) of each slot's last error.
    error_day: [u64; ERROR_DAYS_MAX],
    first_ns: Option<u64>,
    pub error_days: u32,
    pub firing: bool,
}

impl ErrorDetector {
    pub fn new() -> Self {
        ErrorDetector {
            last_total: None,
            error_day: [u64::MAX; ERROR_DAYS_MAX],
            first_ns: None,
            error_days: 0,
            firing: false,
        }
    }

    pub fn observe(&mut self, c: &HealthConfig, now_ns: u64, media_errors_total: u64) {
        let first = *self.first_ns.get_or_insert(now_ns);
        let day = (now_ns - first) / NS_PER_DAY;
        let window = u64::from(c.error_window_days.clamp(1, ERROR_DAYS_MAX as u32));
        let grew = self
            .last_total
            .is_some_and(|prev| media_errors_total > prev);
        self.last_total = Some(media_errors_total);
        let slot = (day % window) as usize;
        if grew {
            self.error_day[slot] = day;
        }
        self.error_days = self.error_day[..window as usize]
            .iter()
            .filter(|&&d| d != u64::MAX && d + window > day)
            .count() as u32;
        // Enter at the threshold, leave only when no error day is left in the window.
        if self.error_days >= c.error_days_threshold {
            self.firing = true;
        } else if self.error_days == 0 {
            self.firing = false;
        }
    }
}

impl Default for ErrorDetector {
    fn default() -> Self {
        Self::new()
    }
}

/// (c, d) A SMART percentage sampled at fixed marks; the slope over the ring
/// gives the time until the value reaches a target. Integer percentages
/// quantise the slope, so a change under `min_change` points is not a trend.
#[derive(Clone, Debug)]
pub struct Trend {
    interval_ns: u64,
    next_mark_ns: Option<u64>,
    ring: [i32; TREND_SLOTS],
    head: usize,
    filled: usize,
}

impl Trend {
    pub fn new(interval_ns: u64) -> Self {
        Trend {
            interval_ns: interval_ns.max(1),
            next_mark_ns: None,
            ring: [0; TREND_SLOTS],
            head: 0,
            filled: 0,
        }
    }

    pub fn observe(&mut self, now_ns: u64, value: i32) {
        let mark = *self.next_mark_ns.get_or_insert(now_ns);
        if now_ns < mark {
            return;
        }
        self.head = (self.head + 1) % TREND_SLOTS;
        self.ring[self.head] = value;
        self.filled = (self.filled + 1).min(TREND_SLOTS);
        // Marks are fixed in time, not per sample, so a late sample does not stretch them.
        let behind = (now_ns - mark) / self.interval_ns + 1;
        self.next_mark_ns = Some(mark + behind * self.interval_ns);
    }

    /// Change per day over the ring (positive = rising), once it spans at least
    /// two marks and the value moved at least `min_change`.
    pub fn slope_per_day(&self, min_change: i32) -> Option<f64> {
        if self.filled < 2 {
            return None;
        }
        let oldest = (self.head + TREND_SLOTS + 1 - self.filled) % TREND_SLOTS;
        let change = self.ring[self.head] - self.ring[oldest];
        if change.abs() < min_change.max(1) {
            return None;
        }
        let span_days = ((self.filled - 1) as u64 * self.interval_ns) as f64 / NS_PER_DAY as f64;
        Some(f64::from(change) / span_days)
    }

    /// Time until `current` reaches `target` at the ring's slope, if it is heading there.
    pub fn eta_ns(&self, current: i32, target: i32, min_change: i32) -> Option<u64> {
        let slope = self.slope_per_day(min_change)?;
        let gap = f64::from(target - current);
        if gap == 0.0 {
            return Some(0);
        }
        if slope == 0.0 || gap.signum() != slope.signum() {
            return None;
        }
        Some(((gap / slope) * NS_PER_DAY as f64) as u64)
    }
}

/// Both SMART slope detectors and their hysteresis (enter at the horizon,
/// leave beyond twice it).
#[derive(Clone, Debug)]
pub struct SmartTrends {
    pub wear: Trend,
    pub spare: Trend,
    pub wear_eta_ns: Option<u64>,
    pub spare_eta_ns: Option<u64>,
    pub wear_firing: bool,
    pub spare_firing: bool,
}

impl SmartTrends {
    pub fn new(c: &HealthConfig) -> Self {
        SmartTrends {
            wear: Trend::new(c.wear_interval_ns),
            spare: Trend::new(c.spare_interval_ns),
            wear_eta_ns: None,
            spare_eta_ns: None,
            wear_firing: false,
            spare_firing: false,
        }
    }

    pub fn observe(&mut self, c: &HealthConfig, s: &Sample) {
        self.wear.observe(s.now_ns, i32::from(s.percentage_used));
        self.spare
            .observe(s.now_ns, i32::from(s.available_spare_pct));
        let used = i32::from(s.percentage_used);
        self.wear_eta_ns = if used >= 100 {
            Some(0)
        } else {
            self.wear.eta_ns(used, 100, c.trend_min_change_pct)
        };
        let spare = i32::from(s.available_spare_pct);
        let floor = i32::from(s.available_spare_threshold_pct);
        self.spare_eta_ns = if spare < floor {
            Some(0)
        } else {
            self.spare.eta_ns(spare, floor, c.trend_min_change_pct)
        };
        self.wear_firing = hysteresis(self.wear_firing, self.wear_eta_ns, c.wear_horizon_ns);
        self.spare_firing = hysteresis(self.spare_firing, self.spare_eta_ns, c.spare_horizon_ns);
    }
}

fn hysteresis(firing: bool, eta_ns: Option<u64>, horizon_ns: u64) -> bool {
    match eta_ns {
        Some(eta) if eta <= horizon_ns => true,
        Some(eta) if firing => eta <= horizon_ns.saturating_mul(2),
        // No trend any more (the value stopped moving): the predictor's hold
        // keeps its state for a while; the detector itself lets go.
        _ => false,
    }
}
