//! Measurements and the JSON result schema (algorithms.md §5).

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
    pub failed_ios: u64,
    /// Commands the SSD scheduler answered Busy (a bound was full); each is retried.
    pub sched_busy: u64,
    pub failure_at_ns: Option<u64>,
}

fn hist() -> Histogram<u64> {
    // 1 ns .. 100 s at 2 significant digits (≤ 1% error, algorithms.md §5).
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
            failed_ios: 0,
            sched_busy: 0,
            failure_at_ns: None,
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
    /// First time after the failure at which a 5-bin moving average is back at ≥ 99% of before.
    pub recovery_ns: Option<u64>,
    pub lost_ios: u64,
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
    for i in fb..last.saturating_sub(w) {
        let avg = m.bins[i..i + w].iter().sum::<u64>() as f64 / (w as f64 * bin as f64 / 1e9) / 1e6;
        if avg < 0.99 * before {
            dipped = true;
        } else if dipped || i == fb {
            recovery = Some(((i + w) as u64 * bin).saturating_sub(at_ns));
            break;
        }
    }
    FailureStats {
        at_ns,
        mb_s_before: round3(before),
        mb_s_after: round3(after),
        throughput_drop: round3((1.0 - after / before.max(1e-9)).max(0.0) * 1000.0) / 1000.0,
        recovery_ns: recovery,
        lost_ios: m.lost_ios,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
