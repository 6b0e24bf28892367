//! Prometheus `/metrics` over HTTP (`[metrics] listen`).
//!
//! A scrape reads the counters the reactors already keep (per-namespace
//! command and byte counts, which they add in batches; their busy time,
//! published about once a millisecond) and encodes them with
//! `prometheus-client`: nothing is added to the I/O path. The HTTP server
//! is `metrics_http` (one thread, bounded connections).

use crate::state::subsystem::Registry;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry as Prom;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// The Prometheus text exposition format, version 0.0.4.
pub(super) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a scrape reads besides the registry.
pub struct Sources {
    pub reg: Arc<Registry>,
    pub connections: Arc<AtomicUsize>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NsLabels {
    subsystem: String,
    nsid: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    subsystem: String,
    nsid: u32,
    op: &'static str,
}

/// A histogram read from counters kept elsewhere (prometheus-client's own
/// type only observes one value at a time). Set once per scrape.
#[derive(Clone, Debug, Default)]
struct BucketCounts(Arc<std::sync::Mutex<Hist>>);

/// (sum in seconds, count, per-bucket (upper bound in seconds, count)).
type Hist = (f64, u64, Vec<(f64, u64)>);

impl TypedMetric for BucketCounts {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for BucketCounts {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let g = crate::sys::lock(&self.0);
        encoder.encode_histogram::<NoLabelSet>(g.0, g.1, &g.2, None)
    }
    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReactorLabels {
    reactor: u32,
}

/// The exposition text of one scrape.
pub fn render(src: &Sources) -> Result<String, std::fmt::Error> {
    let mut prom = Prom::with_prefix("trellis");
    register_namespaces(&mut prom, &src.reg);
    register_drive_health(&mut prom, &src.reg);
    register_qos(&mut prom, &src.reg);
    register_process(&mut prom, src);
    let mut out = String::new();
    encode(&mut out, &prom)?;
    Ok(out)
}

/// Per-namespace drive health, as the SMART log reports it (issue 33):
/// the drive's own figures where the backend has them (`drive_smart`),
/// and the node's persisted power-on hours and unsafe shutdowns.
fn register_drive_health(prom: &mut Prom, reg: &Registry) {
    let fam = |prom: &mut Prom, name: &str, help: &str| {
        let f = Family::<NsLabels, Gauge>::default();
        prom.register(name, help, f.clone());
        f
    };
    let warning = fam(
        prom,
        "namespace_drive_critical_warning",
        "SMART critical warning bits of the drive (0 healthy; 1 spare low, 4 reliability degraded, 8 read only)",
    );
    let used = fam(
        prom,
        "namespace_drive_percentage_used",
        "SMART percentage used: the drive's life used, 100 at its rated endurance",
    );
    let spare = fam(
        prom,
        "namespace_drive_available_spare_percent",
        "SMART available spare, percent of the drive's spare blocks left",
    );
    let prediction = fam(
        prom,
        "namespace_drive_prediction",
        "The failure predictor's verdict: 1 healthy, 2 degraded, 3 predicted failure, 4 failed (absent: not watched)",
    );
    let unsafe_shutdowns = fam(
        prom,
        "namespace_unsafe_shutdowns",
        "Stops without a flush (kill -9, crash, power loss), kept across restarts",
    );
    let nss = reg.ns().load();
    for sub in reg.subsystems() {
        for ns in &nss.sub(sub.idx).namespaces {
            let l = NsLabels {
                subsystem: sub.nqn.clone(),
                nsid: ns.nsid(),
            };
            let c = reg.health().counters(&ns.info().nguid);
            unsafe_shutdowns
                .get_or_create(&l)
                .set(c.unsafe_shutdowns.min(i64::MAX as u64) as i64);
            let predicted = reg.verdicts().warning_bits(ns.uid());
            if let Some((v, _)) = reg.verdicts().get(ns.uid()) {
                prediction.get_or_create(&l).set(v as i64);
                // A drive that stopped answering reports no page: the verdict's bit stands.
                warning.get_or_create(&l).set(i64::from(predicted));
            }
            if let Some(d) = ns.backend().drive_smart() {
                warning
                    .get_or_create(&l)
                    .set(i64::from(d.critical_warning | predicted));
                used.get_or_create(&l).set(i64::from(d.percent_used));
                spare
                    .get_or_create(&l)
                    .set(i64::from(d.available_spare_pct));
            }
        }
    }
}

/// Per-namespace counters (as in the SMART log, which reads the same ones).
fn register_namespaces(prom: &mut Prom, reg: &Registry) {
    let fam = |prom: &mut Prom, name: &str, help: &str| {
        let f = Family::<NsLabels, Counter>::default();
        prom.register(name, help, f.clone());
        f
    };
    let reads = fam(prom, "namespace_read_commands", "Read commands completed");
    let writes = fam(prom, "namespace_write_commands", "Write commands completed");
    let rbytes = fam(prom, "namespace_read_bytes", "Bytes read");
    let wbytes = fam(prom, "namespace_write_bytes", "Bytes written");
    let errors = fam(
        prom,
        "namespace_media_errors",
        "Commands failed with a media error (status code type 2h)",
    );
    let backend_errors = fam(
        prom,
        "namespace_backend_errors",
        "Commands the backend failed (media, capacity or internal errors)",
    );
    let lat = Family::<OpLabels, BucketCounts>::default();
    prom.register(
        "namespace_latency_seconds",
        "Command latency on the target, capsule taken to completion (log2 µs buckets)",
        lat.clone(),
    );
    let size = Family::<NsLabels, Gauge>::default();
    prom.register("namespace_size_bytes", "Namespace capacity", size.clone());
    let nss = reg.ns().load();
    for sub in reg.subsystems() {
        for ns in &nss.sub(sub.idx).namespaces {
            let l = NsLabels {
                subsystem: sub.nqn.clone(),
                nsid: ns.nsid(),
            };
            let s = &ns.stats();
            reads.get_or_create(&l).inc_by(s.read_cmds.load(Relaxed));
            writes.get_or_create(&l).inc_by(s.write_cmds.load(Relaxed));
            rbytes.get_or_create(&l).inc_by(s.read_bytes.load(Relaxed));
            wbytes.get_or_create(&l).inc_by(s.write_bytes.load(Relaxed));
            errors
                .get_or_create(&l)
                .inc_by(s.media_errors.load(Relaxed));
            backend_errors
                .get_or_create(&l)
                .inc_by(s.backend_errors.load(Relaxed));
            for (k, op) in ["read", "write"].into_iter().enumerate() {
                let ol = OpLabels {
                    subsystem: sub.nqn.clone(),
                    nsid: ns.nsid(),
                    op,
                };
                *crate::sys::lock(&lat.get_or_create(&ol).0) = histogram(&s.latency[k]);
            }
            let bytes = ns.size_blocks().saturating_mul(ns.block_size() as u64);
            size.get_or_create(&l)
                .set(bytes.min(i64::MAX as u64) as i64);
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CloseLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QosLabels {
    subsystem: String,
    nsid: u32,
    reactor: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QosDirLabels {
    subsystem: String,
    nsid: u32,
    reactor: u32,
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    subsystem: String,
    nsid: u32,
    reactor: u32,
    tenant: String,
}

type FGauge = Gauge<f64, AtomicU64>;

/// Gimbal's state per namespace and reactor (each reactor runs its own
/// scheduler; docs/gimbal.md), as the reactors last published it, and each
/// tenant's share: what the virtual-view log page shows, over time.
/// Long (over 70 lines) on purpose: a flat list of metric families and the
/// one pass that fills them, read side by side with docs/target.md's table.
fn register_qos(prom: &mut Prom, reg: &Registry) {
    let g = |prom: &mut Prom, name: &str, help: &str| {
        let f = Family::<QosLabels, FGauge>::default();
        prom.register(name, help, f.clone());
        f
    };
    let rate = g(
        prom,
        "qos_target_rate_bytes_per_second",
        "Gimbal's target rate (device clock)",
    );
    let head = g(
        prom,
        "qos_headroom_bytes_per_second",
        "Target rate minus completion rate",
    );
    let wc = g(
        prom,
        "qos_write_cost",
        "Estimated write cost relative to a read (1.0 to 9.0)",
    );
    let d = |prom: &mut Prom, name: &str, help: &str| {
        let f = Family::<QosDirLabels, FGauge>::default();
        prom.register(name, help, f.clone());
        f
    };
    let state = d(
        prom,
        "qos_congestion_state",
        "0 no sample, 1 under-utilised, 2 avoidance, 3 congested, 4 overloaded",
    );
    let ewma = d(
        prom,
        "qos_latency_ewma_seconds",
        "Device latency EWMA (device clock)",
    );
    let target = d(
        prom,
        "qos_latency_target_seconds",
        "Dynamic latency threshold (device clock)",
    );
    let t = |prom: &mut Prom, name: &str, help: &str| {
        let f = Family::<TenantLabels, FGauge>::default();
        prom.register(name, help, f.clone());
        f
    };
    let queued = t(
        prom,
        "qos_tenant_queued",
        "Commands the scheduler holds for the tenant",
    );
    let inflight = t(
        prom,
        "qos_tenant_in_flight",
        "Tenant's commands at the device",
    );
    let credits = t(
        prom,
        "qos_tenant_io_credits",
        "I/O credits the tenant is granted",
    );
    let tc = |prom: &mut Prom, name: &str, help: &str| {
        let f = Family::<TenantLabels, Counter>::default();
        prom.register(name, help, f.clone());
        f
    };
    let cmds = tc(
        prom,
        "qos_tenant_completed_commands",
        "Commands completed for the tenant",
    );
    let bytes = tc(
        prom,
        "qos_tenant_completed_bytes",
        "Bytes completed for the tenant",
    );
    let in_use = reg.tenants().in_use();
    let names: Vec<(usize, String)> = in_use
        .iter()
        .map(|&id| (id as usize, reg.tenants().name_of(id)))
        .collect();
    let nss = reg.ns().load();
    for sub in reg.subsystems() {
        for ns in &nss.sub(sub.idx).namespaces {
            let board = crate::sys::lock(ns.qos_board()).clone();
            for (r, p) in board.iter().enumerate() {
                let l = QosLabels {
                    subsystem: sub.nqn.clone(),
                    nsid: ns.nsid(),
                    reactor: r as u32,
                };
                rate.get_or_create(&l)
                    .set(p.target_rate_bytes_per_s.load(Relaxed) as f64);
                head.get_or_create(&l)
                    .set(p.headroom_bytes_per_s.load(Relaxed) as f64);
                wc.get_or_create(&l)
                    .set(p.write_cost_fp10.load(Relaxed) as f64 / 1024.0);
                for (k, op) in ["read", "write"].into_iter().enumerate() {
                    let dl = QosDirLabels {
                        subsystem: sub.nqn.clone(),
                        nsid: ns.nsid(),
                        reactor: r as u32,
                        op,
                    };
                    state
                        .get_or_create(&dl)
                        .set(p.state[k].load(Relaxed) as f64);
                    ewma.get_or_create(&dl)
                        .set(p.latency_ewma_us[k].load(Relaxed) as f64 / 1e6);
                    target
                        .get_or_create(&dl)
                        .set(p.latency_target_us[k].load(Relaxed) as f64 / 1e6);
                }
                for (id, name) in &names {
                    let Some(tp) = p.tenants.get(*id) else {
                        continue;
                    };
                    let tl = TenantLabels {
                        subsystem: sub.nqn.clone(),
                        nsid: ns.nsid(),
                        reactor: r as u32,
                        tenant: name.clone(),
                    };
                    queued
                        .get_or_create(&tl)
                        .set(tp.queued.load(Relaxed) as f64);
                    inflight
                        .get_or_create(&tl)
                        .set(tp.in_flight.load(Relaxed) as f64);
                    credits
                        .get_or_create(&tl)
                        .set(tp.io_credits.load(Relaxed) as f64);
                    cmds.get_or_create(&tl)
                        .inc_by(tp.completed_commands.load(Relaxed));
                    bytes
                        .get_or_create(&tl)
                        .inc_by(tp.completed_bytes.load(Relaxed));
                }
            }
        }
    }
}

/// (sum, count, per-bucket counts) of one latency histogram, in seconds.
/// Bucket i holds latencies below 2^i µs; the sum takes each bucket's
/// geometric midpoint (the counters keep no exact sum), so it is an
/// estimate within a factor of √2.
fn histogram(b: &[AtomicU64; crate::state::stats::LAT_BUCKETS]) -> Hist {
    let mut out = Vec::with_capacity(b.len());
    let (mut sum, mut count) = (0.0, 0u64);
    for (i, c) in b.iter().enumerate() {
        let n = c.load(Relaxed);
        let le = if i + 1 == b.len() {
            f64::INFINITY
        } else {
            (1u64 << i) as f64 * 1e-6
        };
        let mid = if i == 0 {
            0.5e-6
        } else {
            (1u64 << i) as f64 * 1e-6 / std::f64::consts::SQRT_2
        };
        sum += mid * n as f64;
        count += n;
        out.push((le, n));
    }
    (sum, count, out)
}

/// Connections, reactor busy time, uptime, memory.
fn register_process(prom: &mut Prom, src: &Sources) {
    let conns = Gauge::<i64>::default();
    conns.set(src.connections.load(Relaxed).min(i64::MAX as usize) as i64);
    prom.register("connections", "Open NVMe/TCP connections", conns);
    let closed = Family::<CloseLabels, Counter>::default();
    prom.register(
        "connections_closed",
        "NVMe/TCP connections closed, by reason",
        closed.clone(),
    );
    for k in crate::state::stats::CloseKind::ALL {
        let n = src.reg.conn_closed()[k as usize].load(Relaxed);
        closed
            .get_or_create(&CloseLabels { reason: k.label() })
            .inc_by(n);
    }
    let busy = Family::<ReactorLabels, Counter<f64, AtomicU64>>::default();
    prom.register(
        "reactor_busy_seconds",
        "Wall time each reactor spent in loops that did work (the rest it polled or slept)",
        busy.clone(),
    );
    for (i, c) in src.reg.reactor_busy_ns().iter().enumerate() {
        let l = ReactorLabels { reactor: i as u32 };
        busy.get_or_create(&l)
            .inc_by(c.0.load(Relaxed) as f64 / 1e9);
    }
    let loops = Family::<ReactorLabels, BucketCounts>::default();
    prom.register(
        "reactor_loop_seconds",
        "Duration of each reactor loop that did work (log2 µs buckets): a long loop delays what falls due during it",
        loops.clone(),
    );
    for (i, h) in src.reg.reactor_loop_hist().iter().enumerate() {
        let l = ReactorLabels { reactor: i as u32 };
        *crate::sys::lock(&loops.get_or_create(&l).0) = histogram(h);
    }
    let up = Gauge::<f64, AtomicU64>::default();
    up.set(src.reg.uptime().as_secs_f64());
    prom.register("uptime_seconds", "Seconds since the target started", up);
    let kept = Gauge::<i64>::default();
    kept.set(src.reg.buffer_budget().used().min(i64::MAX as u64) as i64);
    prom.register(
        "large_buffer_bytes",
        "Bytes of large command buffers kept for reuse (bounded by large_buffer_budget)",
        kept,
    );
    let pool = &src.reg.transfer_pool();
    let used = Gauge::<i64>::default();
    used.set(pool.used().min(i64::MAX as u64) as i64);
    prom.register(
        "transfer_pool_used_bytes",
        "Bytes large transfers hold in flight (bounded by target.transfer_pool)",
        used,
    );
    let waits = Counter::<u64>::default();
    waits.inc_by(pool.waits());
    prom.register(
        "transfer_pool_waits",
        "Commands that waited for transfer-pool room",
        waits,
    );
    if let Some(rss) = resident_bytes() {
        let g = Gauge::<i64>::default();
        g.set(rss.min(i64::MAX as u64) as i64);
        prom.register("process_resident_memory_bytes", "Resident set size", g);
    }
}

/// Resident set size from /proc/self/statm (pages × page size).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf takes no pointers and has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::stats::{lat_bucket, LAT_BUCKETS};

    #[test]
    fn a_latency_lands_in_the_first_bucket_whose_bound_exceeds_it() {
        let b: [AtomicU64; LAT_BUCKETS] = Default::default();
        for ns in [
            0,
            999,
            1_000,
            1_999,
            2_000,
            3_999,
            4_000,
            123_456,
            5_000_000_000,
            u64::MAX,
        ] {
            b[lat_bucket(ns)].fetch_add(1, Relaxed);
            let i = lat_bucket(ns);
            let (_, _, h) = histogram(&b);
            let le_s = h[i].0;
            assert!(
                (ns as f64) * 1e-9 < le_s,
                "{ns} ns in bucket {i} (le {le_s} s)"
            );
            if i > 0 && i + 1 < LAT_BUCKETS {
                assert!(
                    (ns as f64) * 1e-9 >= h[i - 1].0,
                    "{ns} ns belongs lower than {i}"
                );
            }
        }
        let (sum, count, h) = histogram(&b);
        assert_eq!(count, 10);
        assert_eq!(h.iter().map(|x| x.1).sum::<u64>(), 10);
        assert!(h.last().is_some_and(|x| x.0.is_infinite()));
        assert!(
            sum > 5.0,
            "the 5 s and the longest latencies dominate the sum: {sum}"
        );
    }
}
