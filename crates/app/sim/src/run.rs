//! Run one scenario and summarise it.

use crate::config::SimConfig;
use crate::metrics::{self, failure_stats, round3, FailureStats, OpStats};
use crate::model::Sim;
use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::time::Instant;

/// Deterministic results: same config and seed → bit-identical JSON.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Results {
    pub name: String,
    pub seed: u64,
    pub topology: String,
    /// What the topology is made of; for `tor`, the switching rule the cost
    /// model prices (`cost::SwitchPlan`).
    pub fabric: String,
    pub storage_nodes: u32,
    pub ssds: usize,
    pub mechanisms: crate::config::Mechanisms,
    pub simulated_ns: u64,
    pub measured_ns: u64,
    pub read: OpStats,
    pub write: OpStats,
    pub total_mb_s: f64,
    pub link_util_mean: f64,
    pub link_util_max: f64,
    /// Utilisation of every directed port, in port order (omitted above 512 ports).
    pub link_util: Vec<f64>,
    pub timeseries_bin_ns: u64,
    pub timeseries_mb_s: Vec<f64>,
    pub failure: Option<FailureStats>,
    pub ycsb: Option<YcsbStats>,
    pub drops: u64,
    pub lost_ios: u64,
    /// Lost I/Os resent after RACK found the loss, before their RTO.
    pub rack_recoveries: u64,
    pub failed_ios: u64,
    /// Commands refused by a full scheduler bound and resent by the host.
    pub sched_busy: u64,
    pub events: u64,
    pub gc_runs: u64,
    /// Little's law over the measured window, and the I/Os the window cut off.
    pub little: metrics::LittleStats,
}

impl PartialEq for crate::config::Mechanisms {
    fn eq(&self, o: &Self) -> bool {
        (self.isr, self.reservation, self.credits, self.gimbal)
            == (o.isr, o.reservation, o.credits, o.gimbal)
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct YcsbStats {
    pub kops_s: f64,
    pub read_lat_avg_us: f64,
    pub read_lat_p999_us: f64,
}

/// Wall-clock performance of the engine (not deterministic, kept apart from Results).
#[derive(Clone, Debug, Serialize)]
pub struct Perf {
    pub wall_s: f64,
    pub events: u64,
    pub events_per_s: f64,
    pub peak_rss_bytes: u64,
    pub simulated_nodes: usize,
    pub rss_per_node_bytes: u64,
}

pub struct RunOutput {
    pub results: Results,
    pub perf: Perf,
}

pub fn run(cfg: SimConfig, progress: bool) -> Result<RunOutput> {
    let t0 = Instant::now();
    let mut sim = Sim::new(cfg.clone())?;
    sim.start();
    let bar = if progress {
        let b = ProgressBar::new(cfg.duration_ns / 1000);
        b.set_style(
            ProgressStyle::with_template("{msg:>24} [{bar:30}] {pos}/{len} µs simulated ({eta})")
                .unwrap(),
        );
        b.set_message(cfg.name.clone());
        b
    } else {
        ProgressBar::hidden()
    };
    sim.run_until(cfg.duration_ns, |t| bar.set_position(t / 1000));
    bar.finish_and_clear();
    let wall = t0.elapsed().as_secs_f64();
    let results = summarise(&sim, &cfg);
    let l = &results.little;
    if l.error > metrics::LITTLE_ERROR_WARN {
        eprintln!(
            "warning: {}: Little's law off by {:.1} % (mean in flight {:.2} vs throughput × latency {:.2}); {} I/Os censored at the end, mean age {:.1} µs",
            results.name,
            l.error * 100.0,
            l.mean_in_flight,
            l.throughput_x_latency,
            l.censored_ios,
            l.censored_age_us_mean
        );
    }
    let events = sim.q.processed;
    let rss = peak_rss_bytes();
    let nodes = sim.g.n();
    Ok(RunOutput {
        results,
        perf: Perf {
            wall_s: wall,
            events,
            events_per_s: events as f64 / wall.max(1e-9),
            peak_rss_bytes: rss,
            simulated_nodes: nodes,
            rss_per_node_bytes: rss / nodes.max(1) as u64,
        },
    })
}

fn summarise(sim: &Sim, cfg: &SimConfig) -> Results {
    let m = &sim.metrics;
    let measured = cfg.duration_ns.saturating_sub(cfg.warmup_ns).max(1);
    let read = metrics::op_stats(m, 0, measured);
    let write = metrics::op_stats(m, 1, measured);
    let secs = measured as f64 / 1e9;
    let util: Vec<f64> = sim
        .port_tx_bytes()
        .iter()
        .zip(sim.g.ports.iter())
        .map(|(&b, p)| round3(b as f64 * 8.0 / (p.bits_per_s as f64 * secs)))
        .collect();
    let failure = m
        .failure_at_ns
        .map(|at| failure_stats(m, at, cfg.warmup_ns, cfg.duration_ns));
    let ycsb = ycsb_summary(sim, secs);
    let ts: Vec<f64> = m
        .bins
        .iter()
        .map(|&b| round3(b as f64 / (cfg.bin_ns as f64 / 1e9) / 1e6))
        .collect();
    let n = util.len().max(1) as f64;
    Results {
        name: cfg.name.clone(),
        seed: cfg.seed,
        topology: format!("{:?}", cfg.topology.kind).to_lowercase(),
        fabric: format!(
            "{}; clients: {} x {} port(s) of {}G",
            match cfg.topology.kind {
                crate::config::TopologyKind::Tor => {
                    crate::topo::switch_plan(&cfg.topology).describe(cfg.topology.switch_ports)
                }
                k => format!("{k:?}").to_lowercase(),
            },
            cfg.topology.hosts,
            cfg.topology.host_ports.max(1),
            cfg.topology.host_gbps
        ),
        storage_nodes: cfg.topology.storage_nodes,
        ssds: sim.n_ssds(),
        mechanisms: cfg.mechanisms.clone(),
        simulated_ns: cfg.duration_ns,
        measured_ns: measured,
        total_mb_s: round3(read.mb_s + write.mb_s),
        read,
        write,
        link_util_mean: round3(util.iter().sum::<f64>() / n),
        link_util_max: util.iter().cloned().fold(0.0, f64::max),
        link_util: if util.len() <= 512 { util } else { Vec::new() },
        timeseries_bin_ns: cfg.bin_ns,
        timeseries_mb_s: ts,
        failure,
        ycsb,
        drops: m.drops,
        lost_ios: m.lost_ios,
        rack_recoveries: m.rack_recoveries,
        failed_ios: m.failed_ios,
        sched_busy: m.sched_busy,
        events: sim.q.processed,
        gc_runs: sim.ssd_stats().iter().map(|s| s.gc_runs).sum(),
        little: m.little(cfg.duration_ns),
    }
}

/// The YCSB figures of the application ops measured (None without YCSB jobs).
fn ycsb_summary(sim: &Sim, secs: f64) -> Option<YcsbStats> {
    let (kv_ops, mut kv_lat) = sim.ycsb_stats();
    (kv_ops > 0).then(|| {
        kv_lat.sort_unstable();
        let avg = kv_lat.iter().sum::<u64>() as f64 / kv_lat.len().max(1) as f64;
        // Nearest rank (§5): x_(⌈p·n⌉).
        let p999 = if kv_lat.is_empty() {
            0
        } else {
            kv_lat[((0.999 * kv_lat.len() as f64).ceil() as usize).clamp(1, kv_lat.len()) - 1]
        };
        YcsbStats {
            kops_s: round3(kv_ops as f64 / secs / 1e3),
            read_lat_avg_us: round3(avg / 1e3),
            read_lat_p999_us: round3(p999 as f64 / 1e3),
        }
    })
}

/// Peak resident set size of this process (Linux VmHWM), 0 elsewhere.
pub fn peak_rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Current resident set size (VmRSS).
pub fn rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}
