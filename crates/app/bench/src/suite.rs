//! The benchmark suite: fixed workloads against `trellis target` (null
//! backend), each next to the raw TCP baseline with the same bytes per I/O
//! and queue depth. Target and client are pinned to different cores; the
//! target's CPU time comes from /proc/<pid>/stat. Writes `suite.json` and
//! `summary.md` into the output directory.

use std::io::Write as _;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::baseline::{self, ClientOpts, ClientResult};
use crate::job::{resolve_jobs, JobOpts, JobSpec};
use crate::report::JobReport;
use crate::runner::{run_jobs, RunOpts};
use crate::worker::pin_current_thread;

#[derive(clap::Args, Debug, Clone)]
pub struct SuiteArgs {
    /// Command that starts the target (run under `taskset -c TARGET_CPU`).
    /// Empty: use an already running target (then pass --target-pid for CPU figures).
    #[arg(
        long = "target-cmd",
        alias = "target_cmd",
        default_value = "trellis target --null 1G"
    )]
    pub target_cmd: String,
    /// PID of an already running target (with --target-cmd "").
    #[arg(long = "target-pid", alias = "target_pid")]
    pub target_pid: Option<u32>,
    /// Target address HOST:PORT.
    #[arg(long, default_value = crate::job::DEFAULT_ADDR)]
    pub addr: String,
    /// Subsystem NQN.
    #[arg(long, default_value = crate::job::DEFAULT_NQN)]
    pub nqn: String,
    /// CPU the target (and the baseline server) is pinned to.
    #[arg(long = "target-cpu", alias = "target_cpu", default_value_t = 0)]
    pub target_cpu: usize,
    /// CPU the bench client is pinned to.
    #[arg(long = "client-cpu", alias = "client_cpu", default_value_t = 1)]
    pub client_cpu: usize,
    /// Measured seconds per workload.
    #[arg(long, default_value = "10")]
    pub runtime: String,
    /// Warm-up seconds per workload.
    #[arg(long = "ramp-time", alias = "ramp_time", default_value = "2")]
    pub ramp_time: String,
    /// A few seconds in total: short runs, same workloads (for CI).
    #[arg(long)]
    pub smoke: bool,
    /// Repetitions per workload: each runs the baseline in a fresh server
    /// process, then Trellis against a freshly started target; rows report
    /// medians. This VM flips between two performance regimes from one
    /// process to the next, so one run is not a measurement.
    /// Default: 3 (1 with --smoke).
    #[arg(long)]
    pub reps: Option<usize>,
    /// Port for the raw TCP baseline server.
    #[arg(
        long = "baseline-port",
        alias = "baseline_port",
        default_value_t = 4499
    )]
    pub baseline_port: u16,
    /// Output directory.
    #[arg(long, default_value = "bench/results/latest")]
    pub out: PathBuf,
}

struct Workload {
    name: &'static str,
    rw: &'static str,
    bs: u32,
    qd: u32,
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "4k randread QD1",
        rw: "randread",
        bs: 4096,
        qd: 1,
    },
    Workload {
        name: "4k randread QD32",
        rw: "randread",
        bs: 4096,
        qd: 32,
    },
    Workload {
        name: "4k randread QD128",
        rw: "randread",
        bs: 4096,
        qd: 128,
    },
    Workload {
        name: "4k randwrite QD32",
        rw: "randwrite",
        bs: 4096,
        qd: 32,
    },
    Workload {
        name: "128k read QD8",
        rw: "read",
        bs: 131072,
        qd: 8,
    },
    Workload {
        name: "128k write QD8",
        rw: "write",
        bs: 131072,
        qd: 8,
    },
];

#[derive(Serialize, Clone)]
struct Row {
    workload: String,
    rw: String,
    bs_bytes: u32,
    iodepth: u32,
    trellis: JobReport,
    baseline: ClientResult,
    /// Trellis / baseline: 1.0 = as fast as raw loopback TCP.
    iops_ratio: f64,
    /// Trellis p50 latency / baseline p50 latency (1.0 = no added latency).
    lat_p50_ratio: f64,
    lat_p99_ratio: f64,
    target_cpu_s_per_mio: Option<f64>,
    target_cpu_util_pct: Option<f64>,
    /// IOPS of every repetition (Trellis and baseline), for the spread.
    trellis_iops_reps: Vec<f64>,
    baseline_iops_reps: Vec<f64>,
}

#[derive(Serialize)]
struct SuiteReport {
    smoke: bool,
    reps: usize,
    runtime_s: f64,
    target_cmd: String,
    target_cpu: usize,
    client_cpu: usize,
    rows: Vec<Row>,
    /// The target idle, then woken (`wakeup`): idle CPU per reactor and
    /// the first read after an idle gap against a warm one.
    idle: Option<crate::wakeup::WakeupReport>,
}

/// `prefix` is how to invoke this same program's bench command (so the
/// baseline server can be started as a child pinned to the target core).
pub fn run(a: &SuiteArgs, prefix: &[String]) -> Result<()> {
    let (runtime, ramp) = if a.smoke {
        ("0.5".to_string(), "0.1".to_string())
    } else {
        (a.runtime.clone(), a.ramp_time.clone())
    };
    std::fs::create_dir_all(&a.out)?;
    pin_current_thread(a.client_cpu);
    let reps = a.reps.unwrap_or(if a.smoke { 1 } else { 3 }).max(1);
    let mut rows = Vec::new();
    for w in WORKLOADS {
        let mut runs = Vec::new();
        for rep in 0..reps {
            eprintln!("suite: {} (pass {}/{reps})", w.name, rep + 1);
            runs.push(run_pair(a, prefix, w, &runtime, &ramp)?);
        }
        rows.push(median_row(runs.iter()));
    }
    let idle = run_idle(a)?;
    let report = SuiteReport {
        smoke: a.smoke,
        reps,
        runtime_s: crate::job::parse_duration(&runtime)?.as_secs_f64(),
        target_cmd: a.target_cmd.clone(),
        target_cpu: a.target_cpu,
        client_cpu: a.client_cpu,
        rows,
        idle,
    };
    let json = a.out.join("suite.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    let md = markdown(&report);
    std::fs::write(a.out.join("summary.md"), &md)?;
    println!("{md}");
    println!(
        "wrote {} and {}",
        json.display(),
        a.out.join("summary.md").display()
    );
    let bad: Vec<_> = report
        .rows
        .iter()
        .filter(|r| r.trellis.errors > 0 || r.trellis.ios == 0)
        .map(|r| r.workload.clone())
        .collect();
    if !bad.is_empty() {
        bail!("workloads with errors or no completed I/O: {bad:?}");
    }
    Ok(())
}

/// One measurement of one workload: the raw TCP baseline in a fresh server
/// process, then Trellis against a freshly started target. Fresh processes
/// per workload keep one unlucky process (this VM's slow regime sticks to a
/// process for its life) from skewing every workload of a pass.
fn run_pair(
    a: &SuiteArgs,
    prefix: &[String],
    w: &Workload,
    runtime: &str,
    ramp: &str,
) -> Result<Row> {
    let b = run_baseline(a, prefix, w, runtime, ramp)?;
    let mut target = match a.target_cmd.trim() {
        "" => None,
        cmd => Some(spawn_pinned(cmd, a.target_cpu)?),
    };
    let pid = target.as_ref().map(|c| c.id()).or(a.target_pid);
    let row = wait_port(&a.addr, Duration::from_secs(30))
        .and_then(|_| run_trellis(a, w, b, pid, runtime, ramp));
    if let Some(t) = target.as_mut() {
        stop_child(t);
    }
    row
}

/// Idle gap of the wake-up row (the "first read after 10 s idle"),
/// and how many gaps; --smoke: one gap of 1 s.
pub const IDLE_GAP_S: u64 = 10;
pub const IDLE_GAPS: usize = 3;
/// Back-to-back reads for the warm figure, before and after each gap.
pub const IDLE_WARM_READS: usize = 2_000;

/// The idle row against a freshly started target (none with an external
/// target whose PID is unknown).
fn run_idle(a: &SuiteArgs) -> Result<Option<crate::wakeup::WakeupReport>> {
    let (gap, gaps) = match a.smoke {
        true => (Duration::from_secs(1), 1),
        false => (Duration::from_secs(IDLE_GAP_S), IDLE_GAPS),
    };
    let mut target = match a.target_cmd.trim() {
        "" => None,
        cmd => Some(spawn_pinned(cmd, a.target_cpu)?),
    };
    let Some(pid) = target.as_ref().map(|c| c.id()).or(a.target_pid) else {
        return Ok(None);
    };
    eprintln!(
        "suite: idle and wake-up ({gaps} gaps of {} s)",
        gap.as_secs()
    );
    let r = wait_port(&a.addr, Duration::from_secs(30))
        .and_then(|_| crate::wakeup::run(&a.addr, &a.nqn, pid, gap, gaps, IDLE_WARM_READS));
    if let Some(t) = target.as_mut() {
        stop_child(t);
    }
    r.map(Some)
}

/// The row whose Trellis IOPS is the median, with the median baseline run
/// of the same workload; ratios are recomputed from those two medians.
fn median_row<'a>(runs: impl Iterator<Item = &'a Row>) -> Row {
    let runs: Vec<&Row> = runs.collect();
    let pick = |key: &dyn Fn(&Row) -> f64| {
        let mut v: Vec<&Row> = runs.clone();
        v.sort_by(|x, y| key(x).total_cmp(&key(y)));
        v[v.len() / 2]
    };
    let t = pick(&|r| r.trellis.iops);
    let b = pick(&|r| r.baseline.iops);
    let mut row = t.clone();
    row.baseline = b.baseline.clone();
    row.iops_ratio = row.trellis.iops / row.baseline.iops.max(1e-9);
    row.lat_p50_ratio = row.trellis.lat.lat_us_p50 / row.baseline.lat.lat_us_p50.max(1e-9);
    row.lat_p99_ratio = row.trellis.lat.lat_us_p99 / row.baseline.lat.lat_us_p99.max(1e-9);
    row.trellis_iops_reps = runs.iter().map(|r| r.trellis.iops).collect();
    row.baseline_iops_reps = runs.iter().map(|r| r.baseline.iops).collect();
    row
}

fn run_baseline(
    a: &SuiteArgs,
    prefix: &[String],
    w: &Workload,
    runtime: &str,
    ramp: &str,
) -> Result<ClientResult> {
    let addr = format!("127.0.0.1:{}", a.baseline_port);
    let mut cmd = Command::new("taskset");
    cmd.arg("-c").arg(a.target_cpu.to_string());
    cmd.args(prefix)
        .arg("baseline-server")
        .arg("--listen")
        .arg(&addr);
    let mut server = cmd
        .stdout(Stdio::null())
        .spawn()
        .context("starting the baseline server (is taskset installed?)")?;
    let r = (|| {
        wait_port(&addr, Duration::from_secs(10))?;
        let r = baseline::run_client(&ClientOpts {
            addr: addr.clone(),
            bs: w.bs,
            iodepth: w.qd,
            write: w.rw.contains("write"),
            runtime: crate::job::parse_duration(runtime)?,
            ramp: crate::job::parse_duration(ramp)?,
        })?;
        eprintln!("  baseline {:<20} {:>10.0} IOPS", w.name, r.iops);
        Ok(r)
    })();
    stop_child(&mut server);
    r
}

fn run_trellis(
    a: &SuiteArgs,
    w: &Workload,
    b: ClientResult,
    pid: Option<u32>,
    runtime: &str,
    ramp: &str,
) -> Result<Row> {
    let flags = JobOpts {
        name: Some(w.name.replace(' ', "-")),
        rw: Some(w.rw.into()),
        bs: Some(w.bs.to_string()),
        iodepth: Some(w.qd),
        runtime: Some(runtime.into()),
        ramp_time: Some(ramp.into()),
        addr: Some(a.addr.clone()),
        nqn: Some(a.nqn.clone()),
        tenant: Some("suite".into()),
        ..Default::default()
    };
    let jobs: Vec<JobSpec> = resolve_jobs(None, &flags)?;
    let opts = RunOpts {
        cpus: vec![a.client_cpu],
        progress: false,
        ..Default::default()
    };
    let cpu0 = pid.map(proc_cpu_s).transpose()?;
    let t0 = Instant::now();
    let mut r = run_jobs(&jobs, &opts)?;
    let wall = t0.elapsed().as_secs_f64();
    let cpu1 = pid.map(proc_cpu_s).transpose()?;
    let t = r.jobs.remove(0);
    let util = cpu0.zip(cpu1).map(|(x, y)| (y - x) / wall);
    // CPU over the whole call includes connect and ramp; scale the rate to
    // the measured window so the figure is per measured I/O.
    let per_mio = util.map(|u| u * t.runtime_s / (t.ios.max(1) as f64) * 1e6);
    eprintln!("  {:<20} {:>10.0} IOPS", w.name, t.iops);
    Ok(Row {
        workload: w.name.into(),
        rw: w.rw.into(),
        bs_bytes: w.bs,
        iodepth: w.qd,
        iops_ratio: t.iops / b.iops.max(1e-9),
        lat_p50_ratio: t.lat.lat_us_p50 / b.lat.lat_us_p50.max(1e-9),
        lat_p99_ratio: t.lat.lat_us_p99 / b.lat.lat_us_p99.max(1e-9),
        target_cpu_s_per_mio: per_mio,
        target_cpu_util_pct: util.map(|u| u * 100.0),
        trellis_iops_reps: vec![t.iops],
        baseline_iops_reps: vec![b.iops],
        trellis: t,
        baseline: b,
    })
}

fn markdown(r: &SuiteReport) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "Trellis suite ({}; {} s per workload; median of {} interleaved baseline/Trellis pairs, fresh processes each; target on CPU {}, client on CPU {}; target: `{}`)\n\n",
        if r.smoke { "smoke" } else { "full" },
        r.runtime_s,
        r.reps,
        r.target_cpu,
        r.client_cpu,
        r.target_cmd
    ));
    s.push_str("| workload | IOPS | MiB/s | p50 µs | p99 µs | p99.9 µs | max µs | target CPU s / M I/O | baseline IOPS | baseline p50 µs | IOPS ratio | p50 ratio | client idle % | Trellis IOPS range | baseline IOPS range |\n");
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for row in &r.rows {
        let t = &row.trellis;
        s.push_str(&format!(
            "| {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {:.0} | {:.1} | {:.2} | {:.2} | {:.0} | {} | {} |\n",
            row.workload,
            t.iops,
            t.mib_per_s,
            t.lat.lat_us_p50,
            t.lat.lat_us_p99,
            t.lat.lat_us_p99_9,
            t.lat.lat_us_max,
            row.target_cpu_s_per_mio
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "n/a".into()),
            row.baseline.iops,
            row.baseline.lat.lat_us_p50,
            row.iops_ratio,
            row.lat_p50_ratio,
            t.client_idle_poll_pct,
            range(&row.trellis_iops_reps),
            range(&row.baseline_iops_reps),
        ));
    }
    s.push_str("\nRatios are Trellis / raw TCP baseline with the same bytes per I/O and queue depth (IOPS ratio 1.0 = loopback speed; p50 ratio 1.0 = no added latency). Client idle % below 40 means the figure may be client-bound. Ranges list every pass: this VM switches between two performance regimes between processes.\n");
    if let Some(i) = &r.idle {
        let cpu: Vec<String> = i
            .idle_cpu_pct_per_reactor
            .iter()
            .map(|c| format!("{c:.2}"))
            .collect();
        s.push_str(&format!(
            "\nIdle and wake-up ({} gaps of {} s, 4 KiB QD1 reads): idle CPU per reactor {} %; warm read p50 {:.1} µs; first read after the gap {:.1} µs (median; each: {}), {:.2}x warm.\n",
            i.gaps,
            i.gap_s,
            cpu.join(" / "),
            i.warm_lat_us_p50,
            i.wake_lat_us_median,
            i.wake_lat_us.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>().join(", "),
            i.wake_over_warm
        ));
    }
    s
}

/// "min–max" of a set of IOPS figures.
fn range(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    format!("{lo:.0}–{hi:.0}")
}

/// utime + stime of a process, in seconds.
pub fn proc_cpu_s(pid: u32) -> Result<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces) start at ") ".
    let rest = &s[s.rfind(')').context("malformed stat")? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    // SAFETY: sysconf is always safe to call.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

fn spawn_pinned(cmd: &str, cpu: usize) -> Result<Child> {
    // `exec` twice so the child PID is the target itself (for /proc).
    let line = format!("exec taskset -c {cpu} {cmd}");
    // One log per suite process: two suites at once must not share it.
    let name = format!("trellis-suite-target.{}.log", std::process::id());
    let log = std::fs::File::create(std::env::temp_dir().join(name))?;
    Command::new("sh")
        .arg("-c")
        .arg(&line)
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting target: {line}"))
}

fn wait_port(addr: &str, limit: Duration) -> Result<()> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("nothing listening on {addr} after {limit:?}")
}

fn stop_child(c: &mut Child) {
    // SAFETY: kill on our own child's PID.
    unsafe {
        libc::kill(c.id() as i32, libc::SIGTERM);
    }
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
    let _ = std::io::stderr().flush();
}
