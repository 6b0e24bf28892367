//! Each detector fires on its pattern and not on a healthy drive's noise;
//! hysteresis, bounded memory and determinism.

use super::*;

const H: u64 = NS_PER_HOUR;

/// A healthy drive's sample at hour `h`: latency with a deterministic ±20 %
/// wobble and a 3× burst every 50 hours (GC, a noisy neighbour).
fn healthy(h: u64) -> Sample {
    let wobble = 1.0 + 0.2 * (((h * 2_654_435_761) % 1000) as f64 / 500.0 - 1.0);
    let burst = if h.is_multiple_of(50) { 3.0 } else { 1.0 };
    Sample {
        now_ns: h * H,
        responded: true,
        read_latency_p99_us: 400.0 * wobble * burst,
        media_errors_total: h / (24 * 40), // one error every 40 days
        percentage_used: (10 + h / (24 * 50)) as u8, // 1 % per 50 days
        available_spare_pct: 100 - (h / (24 * 200)) as u8,
        available_spare_threshold_pct: 10,
        critical_warning: 0,
    }
}

fn run(
    p: &mut DrivePredictor,
    hours: std::ops::Range<u64>,
    f: impl Fn(u64) -> Sample,
) -> Vec<Transition> {
    hours.filter_map(|h| p.observe(&f(h))).collect()
}

#[test]
fn healthy_drive_stays_healthy_for_two_years() {
    let mut p = DrivePredictor::default();
    let t = run(&mut p, 0..2 * 365 * 24, healthy);
    assert!(t.is_empty(), "{t:?}");
}

#[test]
fn latency_creep_degrades_then_predicts() {
    let mut p = DrivePredictor::default();
    run(&mut p, 0..30 * 24, healthy);
    // From day 30 latency grows 10 % a day (×2 by ~day 37, ×4 by ~day 45).
    let creep = |h: u64| {
        let mut s = healthy(h);
        s.read_latency_p99_us *= 1.1f64.powf((h - 30 * 24) as f64 / 24.0);
        s
    };
    let t = run(&mut p, 30 * 24..60 * 24, creep);
    assert_eq!(t[0].to, HealthState::Degraded);
    assert_eq!(t[0].cause, Cause::Latency);
    assert!(matches!(t[1].to, HealthState::PredictedFailure { .. }));
    assert!(t[0].at_ns < t[1].at_ns);
    assert_eq!(t.len(), 2, "no flapping: {t:?}");
}

#[test]
fn latency_step_clears_with_hysteresis() {
    let mut p = DrivePredictor::default();
    run(&mut p, 0..30 * 24, healthy);
    let step = |h: u64| {
        let mut s = healthy(h);
        if (30 * 24..33 * 24).contains(&h) {
            s.read_latency_p99_us *= 2.6;
        }
        s
    };
    let t = run(&mut p, 30 * 24..60 * 24, step);
    let kinds: Vec<_> = t.iter().map(|t| t.to).collect();
    assert_eq!(
        kinds,
        vec![HealthState::Degraded, HealthState::Healthy],
        "{t:?}"
    );
}

#[test]
fn lasting_level_shift_is_learnt_not_predicted() {
    let mut p = DrivePredictor::default();
    run(&mut p, 0..30 * 24, healthy);
    // A heavier tenant from day 30: p99 ×3 for good (bursts on top reach ×9).
    let shift = |h: u64| {
        let mut s = healthy(h);
        s.read_latency_p99_us *= 3.0;
        s
    };
    let t = run(&mut p, 30 * 24..120 * 24, shift);
    let kinds: Vec<_> = t.iter().map(|t| t.to).collect();
    assert_eq!(
        kinds,
        vec![HealthState::Degraded, HealthState::Healthy],
        "{t:?}"
    );
    let healthy_day = t[1].at_ns / NS_PER_DAY;
    assert!((44..=50).contains(&healthy_day), "day {healthy_day}");
}

#[test]
fn media_errors_on_several_days_predict_failure() {
    let mut p = DrivePredictor::default();
    run(&mut p, 0..30 * 24, healthy);
    // One new error every second day from day 30.
    let errs = |h: u64| {
        let mut s = healthy(h);
        s.media_errors_total += h.saturating_sub(30 * 24) / 48 + 100;
        s
    };
    let t = run(&mut p, 30 * 24..40 * 24, errs);
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(t[0].cause, Cause::MediaErrors);
    assert!(
        matches!(t[0].to, HealthState::PredictedFailure { horizon_ns } if horizon_ns == 30 * NS_PER_DAY)
    );
}

#[test]
fn one_burst_of_errors_on_one_day_is_not_a_trend() {
    let mut p = DrivePredictor::default();
    let burst = |h: u64| {
        let mut s = healthy(h);
        if h >= 100 * 24 {
            s.media_errors_total += 50;
        }
        s
    };
    assert!(run(&mut p, 0..200 * 24, burst).is_empty());
}

#[test]
fn spare_depletion_predicts_with_horizon() {
    let mut p = DrivePredictor::default();
    run(&mut p, 0..30 * 24, healthy);
    // Spare falls 2 points a day from day 30: threshold 10 reached on day ~74.
    let deplete = |h: u64| {
        let mut s = healthy(h);
        s.available_spare_pct = 100u64.saturating_sub(2 * (h - 30 * 24) / 24) as u8;
        s
    };
    let t = run(&mut p, 30 * 24..80 * 24, deplete);
    let first = t
        .iter()
        .find(|t| matches!(t.to, HealthState::PredictedFailure { .. }))
        .unwrap();
    assert_eq!(first.cause, Cause::Spare);
    let day = first.at_ns / NS_PER_DAY;
    // Predicted within the 30-day horizon of the crossing, not before.
    assert!((44..=50).contains(&day), "day {day}");
}

#[test]
fn wear_near_rating_is_degraded_not_predicted() {
    let mut p = DrivePredictor::default();
    let wear = |h: u64| {
        let mut s = healthy(h);
        s.percentage_used = (60 + h / (24 * 3)).min(255) as u8; // 1 % per 3 days
        s
    };
    let t = run(&mut p, 0..60 * 24, wear);
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!((t[0].to, t[0].cause), (HealthState::Degraded, Cause::Wear));
}

#[test]
fn silent_drive_fails_after_timeout() {
    let mut p = DrivePredictor::default();
    run(&mut p, 0..10 * 24, healthy);
    let last = (10 * 24 - 1) * H;
    assert_eq!(p.next_timeout(), Some(last + p.config().silent_failed_ns));
    assert_eq!(p.tick(last + 2 * H), None);
    let t = p.tick(last + 3 * H).unwrap();
    assert_eq!((t.to, t.cause), (HealthState::Failed, Cause::Silent));
    assert_eq!(p.next_timeout(), None);
    // Silence reported through observe works the same (and only once).
    let mut q = DrivePredictor::default();
    run(&mut q, 0..10 * 24, healthy);
    let silent = |h: u64| Sample {
        now_ns: h * H,
        ..Sample::default()
    };
    let t = run(&mut q, 10 * 24..11 * 24, silent);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].at_ns, last + 3 * H);
}

#[test]
fn predicted_failure_is_held() {
    let mut p = DrivePredictor::default();
    run(&mut p, 0..30 * 24, healthy);
    // Three error days, then none: the prediction stays for the hold, then clears once.
    let errs = |h: u64| {
        let mut s = healthy(h);
        let d = h / 24;
        s.media_errors_total += [31, 32, 33].iter().filter(|&&e| d >= e).count() as u64;
        s
    };
    let t = run(&mut p, 30 * 24..60 * 24, errs);
    assert_eq!(t.len(), 2, "{t:?}");
    assert!(t[1].at_ns - t[0].at_ns >= p.config().predicted_hold_ns);
    assert_eq!(t[1].to, HealthState::Healthy);
}

#[test]
fn memory_is_bounded_and_runs_are_deterministic() {
    // Fixed-size state: the predictor's size does not depend on how long it runs.
    assert!(std::mem::size_of::<DrivePredictor>() < 1024);
    let noisy = |h: u64| {
        let mut s = healthy(h);
        s.read_latency_p99_us *= 1.0 + (h % 97) as f64 / 40.0;
        s.media_errors_total = h * h / 100_000;
        s
    };
    let mut a = DrivePredictor::default();
    let mut b = DrivePredictor::default();
    let ta = run(&mut a, 0..400 * 24, noisy);
    let tb = run(&mut b, 0..400 * 24, noisy);
    assert_eq!(ta, tb);
    assert_eq!(a.state(), b.state());
}

#[test]
fn trend_marks_and_eta() {
    let mut t = Trend::new(NS_PER_DAY);
    for d in 0..10u64 {
        t.observe(d * NS_PER_DAY, 100 - 3 * d as i32);
    }
    let slope = t.slope_per_day(2).unwrap();
    assert!((slope + 3.0).abs() < 1e-9, "{slope}");
    // From 73 down to 10 at 3/day: 21 days.
    assert_eq!(t.eta_ns(73, 10, 2), Some(21 * NS_PER_DAY));
    assert_eq!(t.eta_ns(73, 100, 2), None);
}

/// An interval without reads (p99 0) is no latency evidence: a drive idle
/// through its warm-up (a standby) learns no baseline of 0, so its first reads
/// are not a latency anomaly of infinite ratio.
#[test]
fn intervals_without_reads_teach_no_baseline() {
    let mut p = DrivePredictor::default();
    let mut s = Sample {
        responded: true,
        available_spare_pct: 100,
        available_spare_threshold_pct: 10,
        ..Default::default()
    };
    for h in 0..(30 * 24) {
        s.now_ns = h * NS_PER_HOUR;
        p.observe(&s);
    }
    assert_eq!(p.latency().ratio(), 0.0);
    s.read_latency_p99_us = 300.0;
    for h in (30 * 24)..(32 * 24) {
        s.now_ns = h * NS_PER_HOUR;
        p.observe(&s);
    }
    assert_eq!(p.state(), HealthState::Healthy, "{:?}", p.latency());
}
