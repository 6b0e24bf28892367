//! SSD anomaly detection and failure prediction for one drive, from the telemetry the
//! target already has: its SMART / Health log (Percentage Used, Available Spare, Media
//! Errors, Critical Warning) and read tail latency from its per-namespace histograms.
//!
//! Sans-IO and deterministic: the caller passes each [`Sample`] with its time (u64 ns);
//! no clock, no threads, no randomness, no allocation after [`DrivePredictor::new`]
//! (every detector's state is a fixed-size array or a few scalars). The simulator
//! (`trellis sim health-fleet`) runs one predictor per simulated drive on a virtual clock.
//!
//! Five detectors (detect.rs; thresholds and their sources in docs/drive-health.md):
//! (a) read p99 latency vs the drive's own learned baseline, (b) days with new media
//! errors, (c) Percentage Used slope → time to 100 %, (d) Available Spare slope → time
//! to the spare threshold, (e) a drive that stops answering. Tags: [R] our choice,
//! [D] derived, other keys in docs/sources.md.

mod detect;
#[cfg(test)]
mod tests;

pub use detect::{ErrorDetector, LatencyDetector, SmartTrends, Trend, ERROR_DAYS_MAX, TREND_SLOTS};
use serde::Serialize;

pub const NS_PER_HOUR: u64 = 3_600_000_000_000;
pub const NS_PER_DAY: u64 = 24 * NS_PER_HOUR;

/// One telemetry sample of one drive. When `responded` is false the other fields
/// are ignored (a poll that timed out has no data).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    pub now_ns: u64,
    pub responded: bool,
    /// Read latency p99 over the sampling interval, µs (the namespace histogram);
    /// 0 when the interval had no read: no latency evidence (a standby node's drive
    /// learns its baseline only once it serves).
    pub read_latency_p99_us: f64,
    /// SMART Media and Data Integrity Errors (lifetime count).
    pub media_errors_total: u64,
    /// SMART Percentage Used (may exceed 100).
    pub percentage_used: u8,
    pub available_spare_pct: u8,
    pub available_spare_threshold_pct: u8,
    /// SMART Critical Warning bits (not used by the predictor: the reactive baseline's input).
    pub critical_warning: u8,
}

/// The predictor's verdict on one drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum HealthState {
    Healthy,
    /// An anomaly without a failure trend (latency above baseline, wear near its rating).
    Degraded,
    /// Likely to fail within `horizon_ns` at the current trend.
    PredictedFailure {
        horizon_ns: u64,
    },
    /// Stopped answering.
    Failed,
}

impl HealthState {
    /// Same kind, whatever the horizon: a changed horizon is not a transition.
    pub fn same_kind(&self, o: &HealthState) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(o)
    }
}

/// Which detector drove the new state (the strongest one firing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Cause {
    None,
    Latency,
    MediaErrors,
    Wear,
    Spare,
    Silent,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Transition {
    pub at_ns: u64,
    pub from: HealthState,
    pub to: HealthState,
    pub cause: Cause,
}

/// Every threshold, with its default's origin; docs/drive-health.md has the table.
#[derive(Clone, Debug, Serialize)]
pub struct HealthConfig {
    /// [R] Time the latency baseline is learned before any verdict: a week covers
    /// daily load cycles.
    pub latency_warmup_ns: u64,
    /// [R] Time constant of the recent (fast) latency EWMA.
    pub latency_recent_tau_ns: u64,
    /// [R] Time constant of the baseline EWMA after warm-up (a month: slower than any
    /// degradation it should notice).
    pub latency_baseline_tau_ns: u64,
    /// [R] Recent/baseline ratio above which latency is degraded.
    pub latency_degraded_ratio: f64,
    /// [R] Ratio above which degradation is taken as a failure precursor.
    pub latency_severe_ratio: f64,
    /// [R] Ratio below which a degraded drive may clear (hysteresis) and the baseline learns.
    pub latency_clear_ratio: f64,
    /// [R] How long a ratio must hold before it counts, either way.
    pub latency_sustain_ns: u64,
    /// [R] How long the severe ratio must hold before failure is predicted: a day,
    /// so that a burst on top of a degraded drive is not a prediction.
    pub latency_severe_sustain_ns: u64,
    /// [R] Time constant of the day-smoothed level the re-baseline watches.
    pub latency_stable_tau_ns: u64,
    /// [R] A degraded level steady (within the tolerance) this long becomes the baseline.
    pub latency_rebaseline_ns: u64,
    /// [R] Largest max/min of the day-smoothed level over that stretch that is "steady".
    pub latency_rebaseline_tolerance: f64,
    /// [R] Horizon reported for a severe latency precursor.
    pub latency_horizon_ns: u64,
    /// [R] Window of the media-error detector, days (at most [`ERROR_DAYS_MAX`]).
    pub error_window_days: u32,
    /// [R] Distinct days with new media errors in the window that predict failure.
    pub error_days_threshold: u32,
    /// [R] Horizon reported for the media-error trend.
    pub error_horizon_ns: u64,
    /// [R] Mark spacing of the Percentage Used trend (ring of [`TREND_SLOTS`] marks).
    pub wear_interval_ns: u64,
    /// [R] Time to 100 % used below which the drive is Degraded (plan a replacement):
    /// reaching the rated endurance is not a failure in field data [Schroeder16].
    pub wear_horizon_ns: u64,
    /// [R] Mark spacing of the Available Spare trend.
    pub spare_interval_ns: u64,
    /// [R] Time to the spare threshold below which failure is predicted.
    pub spare_horizon_ns: u64,
    /// [R] Smallest change, percentage points over a ring, that is a trend.
    pub trend_min_change_pct: i32,
    /// [R] No answer for this long = Failed (three missed hourly polls).
    pub silent_failed_ns: u64,
    /// [R] Least time a PredictedFailure is held once entered (no flapping).
    pub predicted_hold_ns: u64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            latency_warmup_ns: 7 * NS_PER_DAY,
            latency_recent_tau_ns: 4 * NS_PER_HOUR,
            latency_baseline_tau_ns: 30 * NS_PER_DAY,
            latency_degraded_ratio: 2.0,
            latency_severe_ratio: 4.0,
            latency_clear_ratio: 1.5,
            latency_sustain_ns: 6 * NS_PER_HOUR,
            latency_severe_sustain_ns: NS_PER_DAY,
            latency_stable_tau_ns: NS_PER_DAY,
            latency_rebaseline_ns: 14 * NS_PER_DAY,
            latency_rebaseline_tolerance: 1.5,
            latency_horizon_ns: 14 * NS_PER_DAY,
            error_window_days: 7,
            error_days_threshold: 3,
            error_horizon_ns: 30 * NS_PER_DAY,
            wear_interval_ns: 4 * NS_PER_DAY,
            wear_horizon_ns: 90 * NS_PER_DAY,
            spare_interval_ns: NS_PER_DAY,
            spare_horizon_ns: 30 * NS_PER_DAY,
            trend_min_change_pct: 2,
            silent_failed_ns: 3 * NS_PER_HOUR,
            predicted_hold_ns: 7 * NS_PER_DAY,
        }
    }
}

/// One drive's predictor: the five detectors and the combined state.
#[derive(Clone, Debug)]
pub struct DrivePredictor {
    cfg: HealthConfig,
    latency: LatencyDetector,
    errors: ErrorDetector,
    trends: SmartTrends,
    state: HealthState,
    last_response_ns: Option<u64>,
    /// When the current PredictedFailure was entered (for the hold).
    predicted_at_ns: u64,
}

impl DrivePredictor {
    pub fn new(cfg: HealthConfig) -> Self {
        DrivePredictor {
            latency: LatencyDetector::new(),
            errors: ErrorDetector::new(),
            trends: SmartTrends::new(&cfg),
            cfg,
            state: HealthState::Healthy,
            last_response_ns: None,
            predicted_at_ns: 0,
        }
    }

    pub fn state(&self) -> HealthState {
        self.state
    }

    pub fn config(&self) -> &HealthConfig {
        &self.cfg
    }

    pub fn latency(&self) -> &LatencyDetector {
        &self.latency
    }

    pub fn errors(&self) -> &ErrorDetector {
        &self.errors
    }

    pub fn trends(&self) -> &SmartTrends {
        &self.trends
    }

    /// When [`Self::tick`] should next be called if no sample arrives: the time at
    /// which silence makes the drive Failed (None before the first answer or once Failed).
    pub fn next_timeout(&self) -> Option<u64> {
        if self.state == HealthState::Failed {
            return None;
        }
        self.last_response_ns
            .map(|t| t.saturating_add(self.cfg.silent_failed_ns))
    }

    /// Feed one sample; returns a transition only when the state's kind changes.
    pub fn observe(&mut self, s: &Sample) -> Option<Transition> {
        if !s.responded {
            return self.tick(s.now_ns);
        }
        self.last_response_ns = Some(s.now_ns);
        if s.read_latency_p99_us > 0.0 {
            self.latency
                .observe(&self.cfg, s.now_ns, s.read_latency_p99_us);
        }
        self.errors
            .observe(&self.cfg, s.now_ns, s.media_errors_total);
        self.trends.observe(&self.cfg, s);
        let (next, cause) = self.verdict();
        self.apply(s.now_ns, next, cause)
    }

    /// Time passing without an answer: Failed once silent for `silent_failed_ns`.
    pub fn tick(&mut self, now_ns: u64) -> Option<Transition> {
        let due = self.next_timeout()?;
        if now_ns < due {
            return None;
        }
        self.apply(now_ns, HealthState::Failed, Cause::Silent)
    }

    /// The detectors' combined verdict: a failure trend beats an anomaly; among
    /// trends the shortest horizon wins (it is the most urgent).
    fn verdict(&self) -> (HealthState, Cause) {
        let c = &self.cfg;
        let t = &self.trends;
        let mut best: Option<(u64, Cause)> = None;
        let mut consider = |on: bool, horizon_ns: u64, cause: Cause| {
            if on && best.is_none_or(|(h, _)| horizon_ns < h) {
                best = Some((horizon_ns, cause));
            }
        };
        consider(
            t.spare_firing,
            t.spare_eta_ns.unwrap_or(c.spare_horizon_ns),
            Cause::Spare,
        );
        consider(self.errors.firing, c.error_horizon_ns, Cause::MediaErrors);
        consider(self.latency.severe, c.latency_horizon_ns, Cause::Latency);
        if let Some((horizon_ns, cause)) = best {
            return (HealthState::PredictedFailure { horizon_ns }, cause);
        }
        if self.latency.degraded {
            return (HealthState::Degraded, Cause::Latency);
        }
        if t.wear_firing {
            return (HealthState::Degraded, Cause::Wear);
        }
        (HealthState::Healthy, Cause::None)
    }

    /// Move to `next` unless a held PredictedFailure may not leave yet.
    fn apply(&mut self, now_ns: u64, next: HealthState, cause: Cause) -> Option<Transition> {
        let from = self.state;
        let held = matches!(from, HealthState::PredictedFailure { .. })
            && next != HealthState::Failed
            && now_ns
                < self
                    .predicted_at_ns
                    .saturating_add(self.cfg.predicted_hold_ns);
        if held && !matches!(next, HealthState::PredictedFailure { .. }) {
            return None;
        }
        if from.same_kind(&next) {
            self.state = next; // a new horizon, same kind: not a transition
            return None;
        }
        if matches!(next, HealthState::PredictedFailure { .. }) {
            self.predicted_at_ns = now_ns;
        }
        self.state = next;
        Some(Transition {
            at_ns: now_ns,
            from,
            to: next,
            cause,
        })
    }
}

impl Default for DrivePredictor {
    fn default() -> Self {
        Self::new(HealthConfig::default())
    }
}
