//! Watches every namespace's drive health (`Backend::drive_smart`: the
//! emulated drive's wear model, an NVMe drive's own SMART page) and acts
//! when a SMART critical warning bit changes: one log line per change, and
//! a SMART / Health asynchronous event (spare below threshold, reliability
//! degraded, read only) to every controller of the namespace's subsystem
//! that enabled it (issue 33; NVMe Base 2.0 §5.2.1).
//!
//! Each drive that reports health (`drive_smart`) is also fed to a failure
//! predictor (`trellis_health`, the sans-IO core the simulator's fleet
//! study runs): its verdict goes to the extended health page (C1h) and
//! `/metrics`, and each change is one log line.
//!
//! Runs on the health thread (`server.rs`), every [`DRIVE_CHECK_INTERVAL_MS`].

use crate::state::aen::{AEN_SMART_READ_ONLY, AEN_SMART_RELIABILITY, AEN_SMART_SPARE};
use crate::state::subsystem::Registry;
use std::collections::HashMap;

/// How often the drives' critical warnings are looked at.
pub const DRIVE_CHECK_INTERVAL_MS: u64 = 1_000;

/// The warnings last seen, and the predictor, per namespace uid.
#[derive(Default)]
pub struct DriveWatch {
    last: HashMap<usize, u8>,
    predictors: HashMap<usize, Watched>,
    /// The HA pair this node is in, for `[ha] drive_failover`.
    ha: Option<std::sync::Arc<crate::control::ha::Ha>>,
}

/// One drive's predictor and the read-latency buckets of its last sample.
struct Watched {
    pred: trellis_health::DrivePredictor,
    reads: [u64; crate::state::stats::LAT_BUCKETS],
    p99_us: f64,
}

/// What the critical warning bits mean (SMART / Health log, byte 0).
fn meaning(bits: u8) -> String {
    let names = [
        (0x01, "available spare below threshold"),
        (0x02, "temperature past a threshold"),
        (0x04, "reliability degraded (media errors or worn out)"),
        (0x08, "read only"),
        (0x10, "volatile memory backup failed"),
    ];
    let v: Vec<&str> = names
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

impl DriveWatch {
    /// A watch that hands ownership of `ha`'s pair over as its
    /// `drive_failover` says (None: no HA pair).
    pub fn new(ha: Option<std::sync::Arc<crate::control::ha::Ha>>) -> DriveWatch {
        DriveWatch {
            ha,
            ..DriveWatch::default()
        }
    }

    /// One look at every namespace now; returns how many events were raised.
    pub fn check(&mut self, reg: &Registry) -> usize {
        reg.refresh_health();
        self.check_at(reg, crate::sys::now_ns())
    }

    /// [`DriveWatch::check`] at `now_ns` (tests run it on a virtual clock).
    pub fn check_at(&mut self, reg: &Registry, now_ns: u64) -> usize {
        let set = reg.ns().load();
        let mut raised = 0;
        for sub in reg.subsystems() {
            for ns in &set.sub(sub.idx).namespaces {
                let smart = ns.backend().drive_smart();
                let clock_ns = ns.backend().health_clock_ns(now_ns);
                self.predict(reg, &sub.nqn, ns, smart.as_ref(), clock_ns);
                // What hosts are told: the drive's own bits, and "reliability
                // degraded" while the predictor expects it to fail.
                let now =
                    smart.map_or(0, |s| s.critical_warning) | reg.verdicts().warning_bits(ns.uid());
                let was = self.last.insert(ns.uid(), now).unwrap_or(0);
                if now == was {
                    continue;
                }
                let new = now & !was;
                if new != 0 {
                    tracing::warn!(subsystem = %sub.nqn, nsid = ns.nsid(), critical_warning = now, "drive health: {} (was: {})", meaning(now), meaning(was));
                } else {
                    tracing::info!(subsystem = %sub.nqn, nsid = ns.nsid(), critical_warning = now, "drive health: {} (cleared: {})", meaning(now), meaning(was & !now));
                }
                for (bit, event) in [
                    (0x01, AEN_SMART_SPARE),
                    (0x04, AEN_SMART_RELIABILITY),
                    (0x08, AEN_SMART_READ_ONLY),
                ] {
                    if new & bit == 0 {
                        continue;
                    }
                    for c in crate::sys::lock(&sub.controllers).values() {
                        raised += usize::from(c.raise_event(event));
                    }
                }
            }
        }
        // Namespaces removed live: forget them (uids are never reused).
        if self.last.len() > set.all().count() {
            let live: std::collections::HashSet<usize> = set.all().map(|n| n.uid()).collect();
            self.last.retain(|u, _| live.contains(u));
            self.predictors.retain(|u, _| live.contains(u));
            reg.verdicts().retain(&live);
        }
        raised
    }

    /// Feeds one sample to the namespace's predictor (`smart` None: the
    /// drive did not answer its health poll, which counts only once it has
    /// answered one); publishes its verdict, logs a change of it and acts.
    fn predict(
        &mut self,
        reg: &Registry,
        nqn: &str,
        ns: &crate::state::subsystem::Namespace,
        smart: Option<&trellis_nvme::log::Smart>,
        now_ns: u64,
    ) {
        let Some(s) = smart else {
            if let Some(w) = self.predictors.get_mut(&ns.uid()) {
                let tr = w.pred.observe(&trellis_health::Sample {
                    now_ns,
                    responded: false,
                    ..Default::default()
                });
                self.publish(reg, nqn, ns, tr);
            }
            return;
        };
        let w = self.predictors.entry(ns.uid()).or_insert_with(|| Watched {
            pred: trellis_health::DrivePredictor::new(Default::default()),
            reads: [0; crate::state::stats::LAT_BUCKETS],
            p99_us: 0.0,
        });
        // The drive's own service times where it reports them, else the
        // target's command latency (which includes its queueing).
        let now: Vec<u64> = match ns.backend().drive_read_latency() {
            Some(b) => b.to_vec(),
            None => ns.stats().latency[0]
                .iter()
                .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
                .collect(),
        };
        let mut delta = [0u64; crate::state::stats::LAT_BUCKETS];
        for (i, d) in delta.iter_mut().enumerate() {
            *d = now.get(i).copied().unwrap_or(0).saturating_sub(w.reads[i]);
            w.reads[i] = now.get(i).copied().unwrap_or(0);
        }
        // No read since the last sample: no latency evidence (0).
        w.p99_us = p99_us(&delta).unwrap_or(0.0);
        let sample = trellis_health::Sample {
            now_ns,
            responded: true,
            read_latency_p99_us: w.p99_us,
            media_errors_total: u64::try_from(s.media_errors).unwrap_or(u64::MAX),
            percentage_used: s.percent_used,
            available_spare_pct: s.available_spare_pct,
            available_spare_threshold_pct: trellis_nvme::log::AVAILABLE_SPARE_THRESHOLD_PCT,
            critical_warning: s.critical_warning,
        };
        let tr = w.pred.observe(&sample);
        self.publish(reg, nqn, ns, tr);
    }

    /// Publishes the predictor's verdict (extended health page, `/metrics`,
    /// the SMART page's warning bit); a transition is one log line and, in
    /// an HA pair, may hand ownership over.
    fn publish(
        &self,
        reg: &Registry,
        nqn: &str,
        ns: &crate::state::subsystem::Namespace,
        tr: Option<trellis_health::Transition>,
    ) {
        let Some(w) = self.predictors.get(&ns.uid()) else {
            return;
        };
        let (v, horizon_h) = verdict(w.pred.state());
        reg.verdicts().set(ns.uid(), v, horizon_h);
        let Some(t) = tr else {
            return;
        };
        if matches!(v, Verdict::Healthy) {
            tracing::info!(subsystem = %nqn, nsid = ns.nsid(), cause = ?t.cause, "drive prediction: healthy again (was {:?})", t.from);
            return;
        }
        tracing::warn!(subsystem = %nqn, nsid = ns.nsid(), cause = ?t.cause, horizon_hours = horizon_h, "drive prediction: {:?} (was {:?})", t.to, t.from);
        self.fail_over(nqn, ns.nsid(), v, t.cause);
    }

    /// `[ha] drive_failover`: the owner hands the pair to the other node
    /// when a drive stops answering (`failed`) or also when one is
    /// predicted to fail (`predicted`). Once per transition, so two nodes
    /// whose drives both look bad do not pass ownership back and forth.
    fn fail_over(&self, nqn: &str, nsid: u32, v: Verdict, cause: trellis_health::Cause) {
        use crate::config::ha::DriveFailover as F;
        let Some(ha) = &self.ha else {
            return;
        };
        let act = match ha.cfg.drive_failover {
            F::Off => false,
            F::Failed => v == Verdict::Failed,
            F::Predicted => matches!(v, Verdict::Failed | Verdict::PredictedFailure),
        };
        if act
            && ha.request_drain(&format!(
                "drive failover: {nqn} nsid {nsid} {v:?} ({cause:?})"
            ))
        {
            tracing::warn!(subsystem = %nqn, nsid, "drive prediction: {v:?}: handing the HA pair to the other node (drive_failover = {:?})", ha.cfg.drive_failover);
        }
    }
}

use trellis_nvme::health::Verdict;

/// The predictor's state as the page's verdict and horizon (hours).
fn verdict(s: trellis_health::HealthState) -> (Verdict, u32) {
    use trellis_health::HealthState as H;
    let none = trellis_nvme::health::NOT_REPORTED;
    match s {
        H::Healthy => (Verdict::Healthy, none),
        H::Degraded => (Verdict::Degraded, none),
        H::PredictedFailure { horizon_ns } => (
            Verdict::PredictedFailure,
            u32::try_from(horizon_ns / 3_600_000_000_000).unwrap_or(u32::MAX - 1),
        ),
        H::Failed => (Verdict::Failed, none),
    }
}

/// The p99 of one interval's read-latency bucket counts, µs; None with no
/// read in the interval. Bucket i holds [2^(i-1), 2^i) µs (bucket 0 below
/// 1 µs); the rank is placed within its bucket linearly, so a latency that
/// grows 1.5× moves the estimate by about that, not by 0 or 2×.
fn p99_us(delta: &[u64]) -> Option<f64> {
    let total: u64 = delta.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (total * 99).div_ceil(100);
    let mut seen = 0;
    for (i, &n) in delta.iter().enumerate() {
        if seen + n >= rank {
            let hi = (1u64 << i.min(40)) as f64;
            let lo = if i == 0 { 0.0 } else { hi / 2.0 };
            let within = (rank - seen) as f64 / n as f64;
            return Some(lo + (hi - lo) * within);
        }
        seen += n;
    }
    None
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::backend::{Completion, IoReq, Op};
    use crate::config::{BackendKind, Config, NamespaceConfig};
    use trellis_nvme::health::Verdict;

    const NS_PER_DAY: u64 = 86_400_000_000_000;

    fn registry() -> Registry {
        let mut cfg = Config::embedded_default();
        let mut n = NamespaceConfig::sized(BackendKind::Emulated, 64 << 20);
        n.profile = Some("femu".into());
        n.wear_acceleration = Some(1_000);
        cfg.subsystems[0].namespaces = vec![n];
        let node = crate::state::identity::NodeId::in_memory(uuid::Uuid::from_u128(0x33));
        Registry::build_with(&cfg, node).unwrap()
    }

    /// `n` 128 KiB writes from block `start` on, 32 at a time.
    fn writes(q: &mut dyn crate::backend::BackendQueue, n: u64, start: u64) {
        const BS: usize = 128 << 10;
        let mut bufs: Vec<Vec<u8>> = (0..32).map(|i| vec![i as u8; BS]).collect();
        let mut i = start;
        while i < start + n {
            let mut out = Vec::new();
            for (k, b) in bufs.iter_mut().enumerate() {
                let r = IoReq {
                    op: Op::Write,
                    offset_bytes: (i + k as u64) * BS as u64 % (64 << 20),
                    len_bytes: BS as u64,
                    buf: b.as_mut_ptr(),
                    fua: false,
                };
                let tag = crate::backend::tag::test_tag(k as u16);
                // SAFETY: b lives until every request of the batch is reaped.
                if let Some(st) = unsafe { q.submit(&r, tag) } {
                    out.push(Completion::new(tag, st));
                }
            }
            while out.len() < 32 {
                q.reap(&mut out);
            }
            i += 32;
        }
    }

    /// Issue 33: a drive whose spares drain day after day is predicted to
    /// fail (the spare-slope detector) days before it goes read-only; the
    /// verdict is published for the extended health page and `/metrics`. A virtual day is 1,024
    /// writes of 128 KiB on a femu drive at `wear_acceleration` 1,000.
    #[test]
    fn a_drive_whose_spares_drain_is_predicted_to_fail_before_it_goes_read_only() {
        let reg = registry();
        let ns = reg.ns().load().all().next().unwrap().clone();
        let mut q = ns.backend().open_queue().unwrap();
        let mut watch = DriveWatch::default();
        let (mut predicted, mut read_only) = (None, None);
        for day in 1..400u64 {
            writes(q.as_mut(), 1024, day * 1024);
            watch.check_at(&reg, day * NS_PER_DAY);
            let (v, _) = reg.verdicts().get(ns.uid()).unwrap();
            if v == Verdict::PredictedFailure && predicted.is_none() {
                predicted = Some(day);
            }
            let warning = ns.backend().drive_smart().unwrap().critical_warning;
            if warning & 0x08 != 0 {
                read_only = Some(day);
                break;
            }
        }
        let (p, r) = (predicted.expect("predicted"), read_only.expect("worn out"));
        eprintln!("predicted failure on day {p}, read only on day {r}");
        assert!(p < r, "predicted on day {p}, read only on day {r}");
        // What the extended health page and `/metrics` publish.
        let (v, horizon_hours) = reg.verdicts().get(ns.uid()).unwrap();
        assert_eq!(v, Verdict::PredictedFailure);
        assert!(horizon_hours <= 30 * 24, "{horizon_hours} h");
    }

    #[test]
    fn warning_bits_are_named() {
        assert_eq!(meaning(0), "none");
        assert_eq!(meaning(0x09), "available spare below threshold, read only");
    }
}
