//! Aggregation of worker results per job, the human table and the JSON.

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::job::{Class, JobSpec, ReplicaRead};
use crate::verify::VerifyFailure;
use crate::worker::{empty_result, WorkerResult};

/// Latency summary in microseconds (completion latency as the application sees it).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    pub lat_us_mean: f64,
    pub lat_us_p50: f64,
    pub lat_us_p99: f64,
    pub lat_us_p99_9: f64,
    pub lat_us_p99_99: f64,
    pub lat_us_max: f64,
    /// The latency CDF as (quantile, µs) points, for plots: every 5 % up
    /// to 95 %, then the tail (99, 99.5, 99.9, 99.95, 99.99 %) and the max.
    pub lat_us_cdf: Vec<(f64, f64)>,
}

/// Quantiles of [`Latency::lat_us_cdf`].
const CDF_QUANTILES: [f64; 25] = [
    0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60, 0.65, 0.70, 0.75,
    0.80, 0.85, 0.90, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999,
];

impl Latency {
    pub fn from_hist(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            lat_us_mean: h.mean() / 1000.0,
            lat_us_p50: us(h.value_at_quantile(0.50)),
            lat_us_p99: us(h.value_at_quantile(0.99)),
            lat_us_p99_9: us(h.value_at_quantile(0.999)),
            lat_us_p99_99: us(h.value_at_quantile(0.9999)),
            lat_us_max: us(h.max()),
            lat_us_cdf: CDF_QUANTILES
                .iter()
                .map(|&q| (q, us(h.value_at_quantile(q))))
                .chain(std::iter::once((1.0, us(h.max()))))
                .collect(),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct DirStats {
    pub ios: u64,
    pub bytes: u64,
    pub iops: f64,
    pub mib_per_s: f64,
    #[serde(flatten)]
    pub lat: Latency,
}

#[derive(Clone, Debug, Serialize)]
pub struct JobReport {
    pub name: String,
    pub class: Class,
    pub tenant: String,
    pub hostnqn: String,
    pub rw: String,
    pub bs: String,
    pub iodepth: u32,
    pub numjobs: u32,
    pub queues: u32,
    pub digest: String,
    pub verify: bool,
    /// A queue failed (e.g. the target went away): the figures cover the
    /// I/O done up to then, over the time measured up to then.
    pub partial: bool,
    pub runtime_s: f64,
    pub ios: u64,
    pub iops: f64,
    pub mib_per_s: f64,
    #[serde(flatten)]
    pub lat: Latency,
    pub read: DirStats,
    pub write: DirStats,
    pub errors: u64,
    pub first_error: Option<String>,
    pub verify_failures: u64,
    pub verified_blocks: u64,
    pub verify_failure_samples: Vec<VerifyFailure>,
    /// Polls in which the client neither sent nor received: < 40 % at the
    /// target's peak means the measurement may be client-bound.
    pub client_idle_poll_pct: f64,
    /// `--credits`: whether the job honoured the target's I/O credits, how
    /// often a queue held back for want of them, and the smallest and last
    /// credit seen (None: the target sent none, --iodepth applied).
    pub credits: bool,
    pub credit_busy: u64,
    pub io_credits_min: Option<u32>,
    pub io_credits_last: Option<u32>,
    /// A replicated volume (`--replicas`): how reads chose a replica, and
    /// each replica with the reads it served. Absent for a plain namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_read: Option<ReplicaRead>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaReport>,
    /// A multipath volume (`--paths`): the policy, each path with the
    /// commands it carried and whether it failed, and the failover counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_policy: Option<ReplicaRead>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathReport>,
    /// Paths that failed during the run, commands re-sent on another path,
    /// and the first failure's reason.
    pub path_failures: u64,
    pub path_retries: u64,
    /// `--path-rate`: each path's rate (bytes/s) reads reserved their
    /// responses on, and how often a read found no path with room and
    /// waited in the host. Absent without `--path-rate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_rate_bytes_per_s: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserve_waits: Option<u64>,
    /// Multipath: commands a path refused with an ANA (path-related) status
    /// and that went to another path instead. Absent without `--paths`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ana_moves: Option<u64>,
    /// (ms since the workers started, I/Os completed in the measured window
    /// so far), sampled about every 100 ms by the main thread: throughput over
    /// time, e.g. around a path failure. At most `TIMELINE_SAMPLES_MAX` points.
    pub ios_timeline: Vec<(u64, u64)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_path_error: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PathReport {
    pub addr: String,
    /// Commands first sent on it (every phase; re-sent ones count again).
    pub ios: u64,
    /// It failed during the run (a worker saw its queue fail).
    pub failed: bool,
    /// Times a worker re-opened it after a failure and put it back in use,
    /// and the commands it carried since the last re-open (after a failure
    /// with no re-open: 0).
    pub reconnects: u64,
    pub ios_since_reconnect: u64,
    /// The path's ANA state for the namespace as last read (absent when its
    /// controller reports no ANA or was lost).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ana_state: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReplicaReport {
    pub addr: String,
    /// Reads sent to it (every phase, measured or not).
    pub reads: u64,
    /// The latest I/O credits it granted this tenant (None: it sent none).
    pub io_credits_last: Option<u32>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CpuTime {
    pub user_s: f64,
    pub sys_s: f64,
    pub total_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub jobs: Vec<JobReport>,
    /// CPU time of the bench process over the whole run (setup included).
    pub bench_cpu: CpuTime,
    pub ok: bool,
    /// The run did not finish as asked (interrupted by SIGINT/SIGTERM, or a
    /// job lost its target): the results are what was measured until then.
    pub partial: bool,
    /// Stopped by SIGINT or SIGTERM.
    pub interrupted: bool,
    /// The host stack the jobs ran on: "plain" (a thread per worker) or
    /// "blk-switch" (`--stack`).
    pub stack: &'static str,
    /// With `--stack blk-switch`: what the switch did.
    pub switch: Option<SwitchReport>,
}

/// The blk-switch host stack's counters over the run.
#[derive(Clone, Debug, Serialize)]
pub struct SwitchReport {
    pub level: String,
    pub cores: usize,
    pub doorbell_us: u64,
    pub caravans: u64,
    pub doorbell_timeouts: u64,
    pub steered_requests: u64,
    pub app_moves: u64,
    /// Per app (job order, then worker): the core it lived on at the end.
    pub app_cores: Vec<usize>,
}

/// `x` per second over `secs`; 0 when nothing was measured (a run stopped
/// during its ramp), never a division by a near-zero time.
fn per_s(x: f64, secs: f64) -> f64 {
    if secs > 0.0 {
        x / secs
    } else {
        0.0
    }
}

fn dir_stats(h: &Histogram<u64>, bytes: u64, secs: f64) -> DirStats {
    let ios = h.len();
    DirStats {
        ios,
        bytes,
        iops: per_s(ios as f64, secs),
        mib_per_s: per_s(bytes as f64, secs) / (1 << 20) as f64,
        lat: Latency::from_hist(h),
    }
}

/// Merges the workers of one job.
pub fn job_report(job: &JobSpec, results: Vec<WorkerResult>) -> JobReport {
    let mut acc = empty_result();
    let mut measured = 0f64;
    for r in results {
        measured = measured.max(r.measured.as_secs_f64());
        merge_worker(&mut acc, r);
    }
    let secs = measured;
    let mut all = acc.read_hist.clone();
    all.add(&acc.write_hist).expect("same bounds");
    let bytes = acc.read_bytes + acc.write_bytes;
    let (paths, replicas) = (path_reports(job, &acc), replica_reports(job, &acc));
    JobReport {
        name: job.name.clone(),
        class: job.class,
        tenant: job.tenant.clone(),
        hostnqn: job.hostnqn.clone(),
        rw: job.rw.clone(),
        bs: job.bs_label(),
        iodepth: job.iodepth,
        numjobs: job.numjobs,
        queues: job.queues,
        digest: job.digest_label().into(),
        verify: job.verify,
        partial: acc.fatal,
        runtime_s: measured,
        ios: all.len(),
        iops: per_s(all.len() as f64, secs),
        mib_per_s: per_s(bytes as f64, secs) / (1 << 20) as f64,
        lat: Latency::from_hist(&all),
        read: dir_stats(&acc.read_hist, acc.read_bytes, secs),
        write: dir_stats(&acc.write_hist, acc.write_bytes, secs),
        errors: acc.errors,
        first_error: acc.first_error,
        verify_failures: acc.verify_failures,
        verified_blocks: acc.verified_blocks,
        verify_failure_samples: acc.verify_samples,
        client_idle_poll_pct: if acc.polls > 0 {
            100.0 * acc.idle_polls as f64 / acc.polls as f64
        } else {
            0.0
        },
        credits: job.credits,
        credit_busy: acc.credit_busy,
        io_credits_min: acc.io_credits_min,
        io_credits_last: acc.io_credits_last,
        replica_read: (!job.replicas.is_empty() && !job.multipath).then_some(job.replica_read),
        path_policy: job.multipath.then_some(job.replica_read),
        paths,
        ios_timeline: Vec::new(),
        path_failures: acc.path_failures,
        path_retries: acc.path_retries,
        path_rate_bytes_per_s: (job.path_rate_bytes_per_s > 0).then_some(job.path_rate_bytes_per_s),
        reserve_waits: (job.path_rate_bytes_per_s > 0).then_some(acc.reserve_waits),
        ana_moves: job.multipath.then_some(acc.ana_moves),
        first_path_error: acc.first_path_error,
        replicas,
    }
}

/// Adds one worker's counters, histograms and samples into `acc`.
fn merge_worker(acc: &mut WorkerResult, r: WorkerResult) {
    acc.fatal |= r.fatal;
    acc.read_hist
        .add(&r.read_hist)
        .expect("same histogram bounds");
    acc.write_hist
        .add(&r.write_hist)
        .expect("same histogram bounds");
    acc.read_bytes += r.read_bytes;
    acc.write_bytes += r.write_bytes;
    acc.errors += r.errors;
    if acc.first_error.is_none() {
        acc.first_error = r.first_error;
    }
    acc.verify_failures += r.verify_failures;
    acc.verified_blocks += r.verified_blocks;
    for s in r.verify_samples {
        if acc.verify_samples.len() < 16 {
            acc.verify_samples.push(s);
        }
    }
    acc.polls += r.polls;
    acc.idle_polls += r.idle_polls;
    acc.credit_busy += r.credit_busy;
    acc.io_credits_min = match (acc.io_credits_min, r.io_credits_min) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    acc.io_credits_last = r.io_credits_last.or(acc.io_credits_last);
    acc.path_failures += r.path_failures;
    acc.path_retries += r.path_retries;
    acc.reserve_waits += r.reserve_waits;
    acc.ana_moves += r.ana_moves;
    if acc.first_path_error.is_none() {
        acc.first_path_error = r.first_path_error;
    }
    acc.failed_paths.extend(r.failed_paths);
    acc.path_reconnects.extend(r.path_reconnects);
    acc.path_ios_since_reopen.resize(
        acc.path_ios_since_reopen
            .len()
            .max(r.path_ios_since_reopen.len()),
        0,
    );
    for (a, n) in acc
        .path_ios_since_reopen
        .iter_mut()
        .zip(&r.path_ios_since_reopen)
    {
        *a += n;
    }
    acc.replica_reads
        .resize(acc.replica_reads.len().max(r.replica_reads.len()), 0);
    for (a, n) in acc.replica_reads.iter_mut().zip(&r.replica_reads) {
        *a += n;
    }
    if !r.replica_credits_last.is_empty() {
        acc.replica_credits_last = r.replica_credits_last;
    }
}

/// A multipath job's paths: commands sent, failures and re-opens (empty otherwise).
fn path_reports(job: &JobSpec, acc: &WorkerResult) -> Vec<PathReport> {
    if job.multipath {
        job.replicas
            .iter()
            .enumerate()
            .map(|(i, addr)| PathReport {
                addr: addr.clone(),
                ios: acc.replica_reads.get(i).copied().unwrap_or(0),
                failed: acc.failed_paths.contains(&(i as u32)),
                reconnects: acc
                    .path_reconnects
                    .iter()
                    .filter(|&&p| p == i as u32)
                    .count() as u64,
                ios_since_reconnect: acc.path_ios_since_reopen.get(i).copied().unwrap_or(0),
                ana_state: None,
            })
            .collect()
    } else {
        Vec::new()
    }
}

/// A replicated job's replicas: reads sent and the latest credits (empty otherwise).
fn replica_reports(job: &JobSpec, acc: &WorkerResult) -> Vec<ReplicaReport> {
    if job.multipath {
        &[][..]
    } else {
        &job.replicas[..]
    }
    .iter()
    .enumerate()
    .map(|(i, addr)| ReplicaReport {
        addr: addr.clone(),
        reads: acc.replica_reads.get(i).copied().unwrap_or(0),
        io_credits_last: acc.replica_credits_last.get(i).copied().flatten(),
    })
    .collect()
}

pub fn cpu_time() -> CpuTime {
    // SAFETY: getrusage fills a plain struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let user_s = tv(ru.ru_utime);
    let sys_s = tv(ru.ru_stime);
    CpuTime {
        user_s,
        sys_s,
        total_s: user_s + sys_s,
    }
}

pub fn cpu_delta(a: &CpuTime, b: &CpuTime) -> CpuTime {
    CpuTime {
        user_s: b.user_s - a.user_s,
        sys_s: b.sys_s - a.sys_s,
        total_s: b.total_s - a.total_s,
    }
}

/// The table printed at the end of a run.
pub fn human_table(r: &RunReport) -> String {
    let mut s = job_rows(&r.jobs);
    s.push_str("latency columns in microseconds (completion latency seen by the application)\n");
    if let Some(w) = &r.switch {
        s.push_str(&format!(
            "stack blk-switch ({}, {} core(s), doorbell {} us): {} caravans ({} on the timer), {} requests steered, {} app moves, apps end on cores {:?}\n",
            w.level, w.cores, w.doorbell_us, w.caravans, w.doorbell_timeouts,
            w.steered_requests, w.app_moves, w.app_cores
        ));
    }
    if r.interrupted {
        s.push_str("PARTIAL: interrupted; figures cover the I/O done until then\n");
    }
    for j in r.jobs.iter().filter(|j| j.partial) {
        s.push_str(&format!(
            "PARTIAL: {} stopped early after {:.2} s; figures cover the I/O done until then\n",
            j.name, j.runtime_s
        ));
    }
    s.push_str(&format!(
        "bench CPU: {:.2} s user + {:.2} s sys\n",
        r.bench_cpu.user_s, r.bench_cpu.sys_s
    ));
    for j in r.jobs.iter().filter(|j| j.credits) {
        s.push_str(&match (j.io_credits_min, j.io_credits_last) {
            (Some(min), Some(last)) => format!(
                "{}: I/O credits from the target: last {last}, lowest {min}; polls that found them used up: {}\n",
                j.name, j.credit_busy
            ),
            _ => format!(
                "{}: the target sent no I/O credits (no Gimbal on it): --iodepth applied\n",
                j.name
            ),
        });
    }
    for j in r.jobs.iter().filter(|j| !j.paths.is_empty()) {
        path_lines(&mut s, j);
    }
    for j in r.jobs.iter().filter(|j| !j.replicas.is_empty()) {
        let served: Vec<String> = j
            .replicas
            .iter()
            .map(|x| format!("{} {} reads", x.addr, x.reads))
            .collect();
        s.push_str(&format!(
            "{}: replicas ({} reads): {}\n",
            j.name,
            j.replica_read.unwrap_or(ReplicaRead::RoundRobin).label(),
            served.join(", ")
        ));
    }
    for j in &r.jobs {
        if let Some(e) = &j.first_error {
            s.push_str(&format!(
                "{}: {} error(s), first: {}\n",
                j.name, j.errors, e
            ));
        }
        for f in &j.verify_failure_samples {
            s.push_str(&format!("{}: {}\n", j.name, f));
        }
    }
    s
}

/// The header and one row per job.
fn job_rows(jobs: &[JobReport]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{:<12} {:<10} {:<9} {:>7} {:>4} {:>10} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>6} {:>7} {:>6}\n",
        "job", "class", "rw", "bs", "qd", "IOPS", "MiB/s", "mean", "p50", "p99", "p99.9", "p99.99",
        "max", "errors", "verify", "idle%"
    ));
    for j in jobs {
        s.push_str(&format!(
            "{:<12} {:<10} {:<9} {:>7} {:>4} {:>10.0} {:>9.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>9.1} {:>9.1} {:>6} {:>7} {:>6.1}\n",
            trunc(&j.name, 12),
            format!("{:?}", j.class).to_lowercase(),
            j.rw,
            j.bs,
            j.iodepth,
            j.iops,
            j.mib_per_s,
            j.lat.lat_us_mean,
            j.lat.lat_us_p50,
            j.lat.lat_us_p99,
            j.lat.lat_us_p99_9,
            j.lat.lat_us_p99_99,
            j.lat.lat_us_max,
            j.errors,
            if j.verify {
                if j.verify_failures == 0 {
                    "ok".to_string()
                } else {
                    format!("{}!", j.verify_failures)
                }
            } else {
                "-".to_string()
            },
            j.client_idle_poll_pct,
        ));
    }
    s
}

/// A multipath job's lines: I/Os per path, ANA moves, reservations and failures.
fn path_lines(s: &mut String, j: &JobReport) {
    let carried: Vec<String> = j
        .paths
        .iter()
        .map(|p| {
            let state = match (p.failed, p.reconnects) {
                (false, _) => String::new(),
                (true, 0) => " (failed)".into(),
                (true, k) => format!(
                    " (failed, re-opened {k}×, {} I/Os since)",
                    p.ios_since_reconnect
                ),
            };
            format!("{} {} I/Os{state}", p.addr, p.ios)
        })
        .collect();
    s.push_str(&format!(
        "{}: paths ({}): {}\n",
        j.name,
        j.path_policy.unwrap_or(ReplicaRead::RoundRobin).label(),
        carried.join(", ")
    ));
    if let Some(k @ 1..) = j.ana_moves {
        s.push_str(&format!(
            "{}: {k} command(s) refused by a path's ANA state (inaccessible, persistent loss or transition) went to another path\n",
            j.name
        ));
    }
    if let (Some(rate), Some(waits)) = (j.path_rate_bytes_per_s, j.reserve_waits) {
        s.push_str(&format!(
            "{}: responses reserved at {:.0} Mbit/s per path; reads that waited for room: {waits}\n",
            j.name,
            rate as f64 * 8.0 / 1e6
        ));
    }
    if let Some(e) = &j.first_path_error {
        s.push_str(&format!(
            "{}: {} path failure(s), {} command(s) re-sent on another path; first: {}\n",
            j.name, j.path_failures, j.path_retries, e
        ));
    }
}

fn trunc(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}
