//! Measurements and the JSON result schema: throughput, IOPS, latency percentiles from
//! an HDR histogram (≤ 1% error), time bins, failure drop and recovery (docs/sim.md,
//! "Outputs").

use crate::config::SimConfig;
use hdrhistogram::Histogram;
use serde::Serialize;
use trellis_units::IoDir;

pub struct Metrics {
    warmup_ns: u64,
    bin_ns: u64,
    pub hist: [Histogram<u64>; 2],
    pub ssd_hist: [Histogram<u64>; 2],
    pub ios: [u64; 2],
    pub bytes: [u64; 2],
    /// Exact latency sums (the histogram has ~1% buckets; averages should not).
    pub lat_sum_ns: [u128; 2],
    /// Bytes completed per time bin over the whole run (for time series and failures).
    pub bins: Vec<u64>,
    pub drops: u64,
    pub lost_ios: u64,
    /// Lost I/Os resent after RACK found the loss, before their RTO.
    pub rack_recoveries: u64,
    pub failed_ios: u64,
    /// Commands the SSD scheduler answered Busy (a bound was full); each is retried.
    pub sched_busy: u64,
    pub failure_at_ns: Option<u64>,
    /// I/Os the applications have outstanding now (submitted, not finished).
    pub in_flight: u64,
    /// ∫ in_flight dt over [warmup, last change], in I/O·ns (Little's law).
    in_flight_area: u128,
    in_flight_since_ns: u64,
    /// Σ submit times of the outstanding I/Os: their mean age at the end.
    in_flight_submit_sum_ns: u128,
}

/// Little's law over the measured window, and the I/Os it cut off.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct LittleStats {
    /// Time-averaged I/Os outstanding (submitted by the application, not finished).
    pub mean_in_flight: f64,
    /// Completions per second × their mean latency over the same window.
    pub throughput_x_latency: f64,
    /// |mean_in_flight − throughput_x_latency| / mean_in_flight.
    pub error: f64,
    /// I/Os still outstanding when the window closed (censored: no latency
    /// recorded), and their mean age so far.
    pub censored_ios: u64,
    pub censored_age_us_mean: f64,
}

/// Above this relative error a run warns that its latency figures and its
/// throughput disagree (issue: "fails by more than 5 %").
pub const LITTLE_ERROR_WARN: f64 = 0.05;

fn hist() -> Histogram<u64> {
    // 1 ns .. 100 s at 2 significant digits (≤ 1% relative error, [R]).
    Histogram::new_with_bounds(1, 100_000_000_000, 2).expect("histogram bounds")
}

impl Metrics {
    pub fn new(cfg: &SimConfig, _ports: usize) -> Self {
        let n_bins = cfg.duration_ns.div_ceil(cfg.bin_ns) as usize + 1;
        Metrics {
            warmup_ns: cfg.warmup_ns,
            bin_ns: cfg.bin_ns,
            hist: [hist(), hist()],
            ssd_hist: [hist(), hist()],
            ios: [0; 2],
            bytes: [0; 2],
            lat_sum_ns: [0; 2],
            bins: vec![0; n_bins],
            drops: 0,
            lost_ios: 0,
            rack_recoveries: 0,
            failed_ios: 0,
            sched_busy: 0,
            failure_at_ns: None,
            in_flight: 0,
            in_flight_area: 0,
            in_flight_since_ns: 0,
            in_flight_submit_sum_ns: 0,
        }
    }

    /// Area under in_flight from the last change (clipped to the window) to `now`.
    fn area_until(&self, now_ns: u64) -> u128 {
        let from = self.in_flight_since_ns.max(self.warmup_ns);
        self.in_flight as u128 * now_ns.saturating_sub(from) as u128
    }

    /// An application submitted an I/O at `now_ns`.
    pub fn on_start(&mut self, now_ns: u64) {
        self.in_flight_area += self.area_until(now_ns);
        self.in_flight_since_ns = now_ns;
        self.in_flight += 1;
        self.in_flight_submit_sum_ns += now_ns as u128;
    }

    /// An I/O submitted at `submit_ns` finished (completed, or failed) at `now_ns`.
    pub fn on_finish(&mut self, submit_ns: u64, now_ns: u64) {
        self.in_flight_area += self.area_until(now_ns);
        self.in_flight_since_ns = now_ns;
        self.in_flight = self.in_flight.saturating_sub(1);
        self.in_flight_submit_sum_ns = self
            .in_flight_submit_sum_ns
            .saturating_sub(submit_ns as u128);
    }

    /// Little's law (L = λW) over [warmup, end_ns], with the censored I/Os.
    pub fn little(&self, end_ns: u64) -> LittleStats {
        let window = end_ns.saturating_sub(self.warmup_ns).max(1) as f64;
        let l = (self.in_flight_area + self.area_until(end_ns)) as f64 / window;
        let ios = (self.ios[0] + self.ios[1]) as f64;
        let lat_ns = (self.lat_sum_ns[0] + self.lat_sum_ns[1]) as f64 / ios.max(1.0);
        let xw = ios / window * lat_ns;
        let age_ns = if self.in_flight > 0 {
            end_ns as f64 - self.in_flight_submit_sum_ns as f64 / self.in_flight as f64
        } else {
            0.0
        };
        LittleStats {
            mean_in_flight: round3(l),
            throughput_x_latency: round3(xw),
            error: round3((l - xw).abs() / l.max(1e-9)),
            censored_ios: self.in_flight,
            censored_age_us_mean: round3(age_ns / 1000.0),
        }
    }

    pub fn on_complete(
        &mut self,
        op: IoDir,
        size: u32,
        e2e_ns: u64,
        ssd_ns: u64,
        _submit_ns: u64,
        now_ns: u64,
    ) {
        let b = (now_ns / self.bin_ns) as usize;
        if b < self.bins.len() {
            self.bins[b] += size as u64;
        }
        if now_ns < self.warmup_ns {
            return;
        }
        let i = (op == IoDir::Write) as usize;
        self.ios[i] += 1;
        self.bytes[i] += size as u64;
        self.lat_sum_ns[i] += e2e_ns as u128;
        self.hist[i].saturating_record(e2e_ns.max(1));
        self.ssd_hist[i].saturating_record(ssd_ns.max(1));
    }
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct OpStats {
    pub ios: u64,
    pub mb_s: f64,
    pub kiops: f64,
    pub lat_avg_us: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_p999_us: f64,
    pub ssd_lat_avg_us: f64,
    /// (latency µs, cumulative fraction) points of the latency CDF.
    pub cdf: Vec<(f64, f64)>,
}

pub fn op_stats(m: &Metrics, i: usize, measured_ns: u64) -> OpStats {
    let h = &m.hist[i];
    if h.is_empty() {
        return OpStats::default();
    }
    let secs = measured_ns as f64 / 1e9;
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    let mut cdf = Vec::new();
    for p in [
        0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.995, 0.999,
        0.9999, 1.0,
    ] {
        cdf.push((round3(q(p)), p));
    }
    OpStats {
        ios: m.ios[i],
        mb_s: round3(m.bytes[i] as f64 / secs / 1e6),
        kiops: round3(m.ios[i] as f64 / secs / 1e3),
        lat_avg_us: round3(m.lat_sum_ns[i] as f64 / m.ios[i].max(1) as f64 / 1000.0),
        lat_p50_us: round3(q(0.5)),
        lat_p99_us: round3(q(0.99)),
        lat_p999_us: round3(q(0.999)),
        ssd_lat_avg_us: round3(m.ssd_hist[i].mean() / 1000.0),
        cdf,
    }
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct FailureStats {
    pub at_ns: u64,
    pub mb_s_before: f64,
    pub mb_s_after: f64,
    /// 1 − BW_after / BW_before over the rest of the run.
    pub throughput_drop: f64,
    /// Whether any 5-bin moving average after the failure fell below 99 % of before.
    pub dipped: bool,
    /// After a dip: the first time after the failure at which the 5-bin moving average is
    /// back at ≥ 99 % of before. None when there was no measurable dip (then there is
    /// nothing to recover from: reporting the window length would be a floor, not a
    /// recovery time) or when it did not recover within the run.
    pub recovery_ns: Option<u64>,
    pub lost_ios: u64,
    /// Of those, resent after RACK found the loss (the rest waited for their RTO).
    pub rack_recoveries: u64,
}

/// Resilience metrics (§5): compare throughput before and after the failure.
pub fn failure_stats(m: &Metrics, at_ns: u64, warmup_ns: u64, end_ns: u64) -> FailureStats {
    let bin = m.bin_ns;
    let rate = |from: u64, to: u64| {
        let (a, b) = (
            (from / bin) as usize,
            ((to / bin) as usize).min(m.bins.len()),
        );
        if b <= a {
            return 0.0;
        }
        m.bins[a..b].iter().sum::<u64>() as f64 / ((b - a) as f64 * bin as f64 / 1e9) / 1e6
    };
    let before = rate(warmup_ns, at_ns);
    let after = rate(at_ns, end_ns);
    let fb = (at_ns / bin) as usize;
    let last = ((end_ns / bin) as usize).min(m.bins.len());
    let mut recovery = None;
    let w = 5usize;
    let mut dipped = false;
    let mb_s = |bins: &[u64]| {
        bins.iter().sum::<u64>() as f64 / (bins.len() as f64 * bin as f64 / 1e9) / 1e6
    };
    for i in fb..last.saturating_sub(w) {
        let avg = mb_s(&m.bins[i..i + w]);
        if avg < 0.99 * before {
            dipped = true;
        } else if dipped && mb_s(&m.bins[i..last]) >= 0.99 * before {
            // Recovered only if the rest of the run holds the rate too: one noisy window
            // of large completions above it is not a recovery.
            recovery = Some(((i + w) as u64 * bin).saturating_sub(at_ns));
            break;
        }
    }
    FailureStats {
        at_ns,
        mb_s_before: round3(before),
        mb_s_after: round3(after),
        throughput_drop: round3((1.0 - after / before.max(1e-9)).max(0.0) * 1000.0) / 1000.0,
        dipped,
        recovery_ns: recovery,
        lost_ios: m.lost_ios,
        rack_recoveries: m.rack_recoveries,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn littles_law_holds_for_a_steady_closed_loop_and_reports_the_censored() {
        // One I/O at a time, each 10 µs, back to back from t = 0; window from
        // 100 µs (warmup) to 1 ms: exactly one outstanding, λ = 1/10 µs, W = 10 µs.
        let cfg = SimConfig {
            duration_ns: 1_000_000,
            warmup_ns: 100_000,
            bin_ns: 100_000,
            ..SimConfig::default()
        };
        let mut m = Metrics::new(&cfg, 0);
        let mut t = 0;
        while t < 1_000_000 {
            m.on_start(t);
            if t + 10_000 > 1_000_000 {
                break; // still outstanding at the end: censored
            }
            m.on_complete(IoDir::Read, 4096, 10_000, 5_000, t, t + 10_000);
            m.on_finish(t, t + 10_000);
            t += 10_000;
        }
        let l = m.little(1_000_000);
        assert!((l.mean_in_flight - 1.0).abs() < 1e-9, "{l:?}");
        assert!(l.error < 0.02, "{l:?}");
        assert_eq!(l.censored_ios, 0, "the last I/O ended exactly at the end");
        // Now an I/O that never finishes from 500 µs: L grows, λW does not.
        let mut m2 = Metrics::new(&cfg, 0);
        m2.on_start(500_000);
        let l2 = m2.little(1_000_000);
        assert_eq!(l2.censored_ios, 1);
        assert!((l2.censored_age_us_mean - 500.0).abs() < 1e-9);
        assert!((l2.mean_in_flight - 500.0 / 900.0).abs() < 1e-3, "{l2:?}");
        assert!(
            l2.error > LITTLE_ERROR_WARN,
            "a censored I/O breaks L = λW: {l2:?}"
        );
    }

    #[test]
    fn failure_stats_find_drop_and_recovery() {
        let cfg = SimConfig {
            duration_ns: 2_000_000,
            warmup_ns: 0,
            bin_ns: 100_000,
            ..SimConfig::default()
        };
        let mut m = Metrics::new(&cfg, 0);
        // 100 MB/s (10,000 B per 100 µs) before t = 1 ms; 5,000 B for 3 bins; back after.
        for (i, b) in m.bins.iter_mut().enumerate() {
            *b = if (10..13).contains(&i) { 5_000 } else { 10_000 };
        }
        let f = failure_stats(&m, 1_000_000, 0, 2_000_000);
        assert_eq!(f.mb_s_before, 100.0);
        // After: (3 × 5,000 + 7 × 10,000) / 1 ms = 85 MB/s → drop 15%.
        assert_eq!(f.mb_s_after, 85.0);
        assert!((f.throughput_drop - 0.15).abs() < 1e-9);
        // The 5-bin average first reaches 100 MB/s for bins 13..18: recovery at 1.8 ms − 1 ms.
        assert_eq!(f.recovery_ns, Some(800_000));
        assert!(f.dipped);
        // A dip, one burst window back at the rate, then a lasting loss: not recovered.
        for (i, b) in m.bins.iter_mut().enumerate() {
            *b = match i {
                10..13 => 5_000,
                13..18 => 10_000,
                18.. => 5_000,
                _ => 10_000,
            };
        }
        let f = failure_stats(&m, 1_000_000, 0, 2_000_000);
        assert!(f.dipped);
        assert_eq!(f.recovery_ns, None, "a burst is not a recovery");
        // No dip at all: no recovery time (not the 5-bin floor of 0.5 ms).
        for b in m.bins.iter_mut() {
            *b = 10_000;
        }
        let f = failure_stats(&m, 1_000_000, 0, 2_000_000);
        assert!(!f.dipped);
        assert_eq!(f.recovery_ns, None);
    }
}
