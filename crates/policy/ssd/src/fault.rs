//! Injected failure modes of one drive (issue 33), for the emulated backend's
//! fault-injected drives and any simulation that wants the same shapes.
//!
//! Sans-IO: a [`FaultPlan`] is a pure function of the drive's age (ns since it
//! started, on whatever clock the caller keeps); the drive model applies what it
//! returns ([`crate::Ssd::set_rber_floor`]). Two modes, as the fleet study's
//! (`trellis sim health-fleet`, docs/drive-health.md):
//!
//! - **Degrade**: a failing die or controller path whose raw bit-error rate rises
//!   for every page: from the ECC limit at `onset_ns` (reads begin to need
//!   read-retry steps, each one more tR, so reads slow down) log-linearly to past the
//!   last retry step at `onset_ns + ramp_ns` (every read uncorrectable). One more
//!   retry step every `ramp_ns / (read_retry_max + 1)`; the latency precursor comes
//!   first, uncorrectable reads only in the last steps (with the per-read variation,
//!   from about `read_retry_max - 1` of `read_retry_max + 1`). Meanwhile every
//!   command's service time stretches linearly to [`DEGRADE_END_LATENCY_FACTOR`]×
//!   (firmware error handling, a controller path slowing down), so that the tail
//!   grows even where reads wait mostly for programs. Then the drive stops
//!   answering. [R] the shape: field studies report that failing drives show rising
//!   uncorrectable errors and slow reads in the days before failure [Schroeder16],
//!   [Lu20]; the log-linear rise and the stretch are our choice, the stretch's end
//!   the fleet study's latency precursor (`trellis sim health-fleet`,
//!   `LATENCY_END_FACTOR`).
//! - **Silent**: at `onset_ns` the drive stops answering (an abrupt failure: no
//!   precursor, which field studies find in a large share of failures [Lu20]).

use crate::WearProfile;

/// [R] Service-time stretch at the end of a degrade ramp (as the fleet study's
/// latency precursor, docs/drive-health.md).
pub const DEGRADE_END_LATENCY_FACTOR: f64 = 10.0;

/// What a drive is made to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    Degrade,
    Silent,
}

/// One injected failure, on the drive's age clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultPlan {
    pub kind: FaultKind,
    /// Age at which the fault starts.
    pub onset_ns: u64,
    /// Degrade: how long from the first retry to every read failing (> 0).
    pub ramp_ns: u64,
}

/// The fault's effect at one age.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultEffect {
    /// Least raw bit-error rate of every read (0: no fault yet).
    pub rber_floor: f64,
    /// Every command's service time is multiplied by this (≥ 1).
    pub latency_factor: f64,
    /// The drive answers nothing.
    pub silent: bool,
}

impl FaultEffect {
    pub const NONE: FaultEffect = FaultEffect {
        rber_floor: 0.0,
        latency_factor: 1.0,
        silent: false,
    };
    const SILENT: FaultEffect = FaultEffect {
        silent: true,
        ..FaultEffect::NONE
    };
}

impl FaultPlan {
    /// The effect at `age_ns` on a drive of wear profile `w`.
    pub fn effect(&self, w: &WearProfile, age_ns: u64) -> FaultEffect {
        if age_ns < self.onset_ns {
            return FaultEffect::NONE;
        }
        let into = age_ns - self.onset_ns;
        match self.kind {
            FaultKind::Silent => FaultEffect::SILENT,
            FaultKind::Degrade if into >= self.ramp_ns => FaultEffect::SILENT,
            FaultKind::Degrade => {
                let progress = into as f64 / self.ramp_ns as f64;
                // Steps of the retry ladder climbed: 0 at onset, retry_max + 1 at the end.
                let steps = f64::from(w.read_retry_max + 1) * progress;
                FaultEffect {
                    rber_floor: w.ecc_rber_limit * w.retry_rber_gain.powf(steps),
                    latency_factor: 1.0 + (DEGRADE_END_LATENCY_FACTOR - 1.0) * progress,
                    silent: false,
                }
            }
        }
    }

    /// Age at which the drive stops answering.
    pub fn fails_at_ns(&self) -> u64 {
        match self.kind {
            FaultKind::Silent => self.onset_ns,
            FaultKind::Degrade => self.onset_ns.saturating_add(self.ramp_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400_000_000_000;

    fn degrade() -> FaultPlan {
        FaultPlan {
            kind: FaultKind::Degrade,
            onset_ns: 10 * DAY,
            ramp_ns: 27 * DAY,
        }
    }

    #[test]
    fn nothing_before_the_onset() {
        let w = WearProfile::default();
        assert_eq!(degrade().effect(&w, 10 * DAY - 1), FaultEffect::NONE);
    }

    /// Each ramp / (retry_max + 1) of the ramp is one more read-retry step; past the
    /// last step no read is correctable; at the end the drive goes silent.
    #[test]
    fn degrade_climbs_one_retry_step_per_slice_then_goes_silent() {
        let w = WearProfile::default();
        let p = degrade();
        let slice = p.ramp_ns / u64::from(w.read_retry_max + 1);
        let mut last = Some(0);
        for k in 0..=w.read_retry_max {
            // The middle of slice k: k + 1 steps needed once it is past the limit.
            let e = p.effect(&w, p.onset_ns + k as u64 * slice + slice / 2);
            assert!(!e.silent);
            let r = w.retries_for(e.rber_floor);
            if k < w.read_retry_max {
                assert_eq!(r, Some(k + 1), "slice {k}: {}", e.rber_floor);
            } else {
                assert_eq!(r, None, "the last slice is uncorrectable");
            }
            assert!(r.is_none() || r > last);
            last = r;
        }
        let half = p.effect(&w, p.onset_ns + p.ramp_ns / 2).latency_factor;
        assert!(
            (half - (1.0 + DEGRADE_END_LATENCY_FACTOR) / 2.0).abs() < 1e-9,
            "{half}"
        );
        assert!(p.effect(&w, p.fails_at_ns()).silent);
        assert_eq!(p.fails_at_ns(), 37 * DAY);
    }

    #[test]
    fn silent_stops_at_the_onset() {
        let w = WearProfile::default();
        let p = FaultPlan {
            kind: FaultKind::Silent,
            onset_ns: 5,
            ramp_ns: 0,
        };
        assert!(!p.effect(&w, 4).silent);
        assert!(p.effect(&w, 5).silent);
    }
}
