//! Runs a set of jobs: connects one controller per (target, subsystem,
//! tenant, digests), gives every worker its own I/O queues, runs the workers
//! on their own threads, keeps the admin queues alive, and collects results.
//! `blk_switch.rs` is `--stack blk-switch`, which runs the jobs as apps on
//! the switch's per-core queues instead.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use trellis_host::{Controller, Digests, HostConfig};

use crate::job::JobSpec;
use crate::report::{cpu_delta, cpu_time, job_report, RunReport};
use crate::worker::{self, WorkerPlan};

mod blk_switch;

use blk_switch::run_switch;

/// Settings that apply to the whole run, not to one job.
#[derive(Clone, Debug)]
pub struct RunOpts {
    pub kato_ms: u32,
    pub command_timeout: Duration,
    pub connect_timeout: Duration,
    /// CPUs to pin worker threads to, round-robin (empty: no pinning).
    pub cpus: Vec<usize>,
    pub progress: bool,
    /// Set (by a SIGINT/SIGTERM handler) to stop the run early; the report
    /// then covers what was done and is marked partial.
    pub interrupted: Arc<AtomicBool>,
    /// `--stack blk-switch`: run the jobs as apps on the switch host stack
    /// (None: the plain stack, a thread per worker).
    pub stack: Option<crate::switch_run::SwitchOpts>,
    /// NVMe/TCP TLS on every queue (None: plain TCP).
    pub tls: Option<trellis_host::HostTls>,
    /// DH-HMAC-CHAP secret for every controller (None: no authentication).
    pub dhchap_secret: Option<trellis_nvme::dhchap::Secret>,
    /// The controller's DH-HMAC-CHAP secret (bidirectional authentication).
    pub dhchap_ctrl_secret: Option<trellis_nvme::dhchap::Secret>,
}

impl Default for RunOpts {
    fn default() -> Self {
        RunOpts {
            kato_ms: 10_000,
            command_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            cpus: Vec::new(),
            progress: std::io::stderr().is_terminal(),
            interrupted: Arc::new(AtomicBool::new(false)),
            stack: None,
            tls: None,
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
        }
    }
}

/// (addr, subsystem, host NQN, header digest, data digest, credits).
type CtrlKey = (String, String, String, bool, bool, bool);

/// The controllers a job uses: one per replica (or its one target).
fn keys(j: &JobSpec) -> Vec<CtrlKey> {
    if j.replicas.is_empty() {
        return vec![key_at(j, &j.addr)];
    }
    j.replicas
        .iter()
        .map(|r| {
            let (addr, nqn) = crate::job::replica_target(r, &j.nqn);
            key_for(j, addr, nqn)
        })
        .collect()
}

fn key_at(j: &JobSpec, addr: &str) -> CtrlKey {
    key_for(j, addr, &j.nqn)
}

fn key_for(j: &JobSpec, addr: &str, nqn: &str) -> CtrlKey {
    (
        addr.to_string(),
        nqn.to_string(),
        j.hostnqn.clone(),
        j.header_digest,
        j.data_digest,
        j.credits,
    )
}

/// CDW2[15:0] token of credit-asking commands; any non-zero value works
/// (the target echoes it), this one is easy to spot in a capture.
const CREDIT_TOKEN: u16 = 0x7e11;

pub fn run_jobs(jobs: &[JobSpec], opts: &RunOpts) -> Result<RunReport> {
    if let Some(sw) = &opts.stack {
        return run_switch(jobs, opts, sw);
    }
    let cpu0 = cpu_time();
    let (mut ctrls, down) = connect_all(jobs, opts)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let mut progress = Vec::new();
    let mut wi = 0usize;
    let mut boards: Vec<AnaWatch> = Vec::new();
    for (ji, job) in jobs.iter().enumerate() {
        let job = Arc::new(job.clone());
        let job_keys = keys(&job);
        let ana = job
            .multipath
            .then(|| ana_board(ji, &job, &job_keys, &mut ctrls, &mut boards));
        let live = live_keys(&job, &job_keys, &down)?;
        let (bsz, nsze, identity) = volume_geometry(&job, &live, &mut ctrls)?;
        let (first, count) = range_blocks(&job, nsze, bsz)?;
        let per = count / job.numjobs as u64;
        let counter = Arc::new(AtomicU64::new(0));
        progress.push(counter.clone());
        for w in 0..job.numjobs {
            let mut queues = Vec::new();
            for k in &job_keys {
                match ctrls.get_mut(k) {
                    Some(ctrl) => queues.extend(open_queues(ctrl, &job)?),
                    // A path down at the start: place holders the worker
                    // replaces when it opens the path.
                    None => queues.extend(dead_queues(&job)?),
                }
            }
            let reconnect = path_connectors(&job, &job_keys, &identity, &down, opts);
            let plan = WorkerPlan {
                reconnect,
                ana: ana.clone(),
                job: job.clone(),
                index: w,
                queues,
                replicas: job_keys.len() as u32,
                block_size: bsz,
                first_lba: first + per * w as u64,
                nblocks: per,
                progress: counter.clone(),
                stop: stop.clone(),
                cpu: (!opts.cpus.is_empty()).then(|| opts.cpus[wi % opts.cpus.len()]),
            };
            wi += 1;
            let h = std::thread::Builder::new()
                .name(format!("bench-{}-{w}", job.name))
                .spawn(move || worker::run(plan))?;
            handles.push((ji, h));
        }
    }
    let timelines = watch(jobs, &handles, &progress, &mut ctrls, &boards, opts, &stop)?;
    let mut per_job: Vec<Vec<_>> = jobs.iter().map(|_| Vec::new()).collect();
    for (ji, h) in handles {
        per_job[ji].push(h.join().map_err(|_| anyhow::anyhow!("worker panicked"))?);
    }
    for (_, c) in ctrls {
        let _ = c.shutdown();
    }
    let mut reports = reports_with_timelines(jobs, per_job, timelines);
    for w in &boards {
        for (i, p) in reports[w.job].paths.iter_mut().enumerate() {
            p.ana_state = w.board.state(i).map(|a| a.name());
        }
    }
    Ok(run_report(reports, opts, &cpu0, "plain", None))
}

/// A multipath job's ANA board, read once now and then by `watch` (`boards`).
fn ana_board(
    ji: usize,
    job: &JobSpec,
    job_keys: &[CtrlKey],
    ctrls: &mut BTreeMap<CtrlKey, Controller>,
    boards: &mut Vec<AnaWatch>,
) -> Arc<crate::ana::AnaBoard> {
    let b = Arc::new(crate::ana::AnaBoard::new(job_keys.len()));
    let w = AnaWatch {
        job: ji,
        keys: job_keys.to_vec(),
        nsid: job.nsid,
        board: b.clone(),
    };
    w.refresh(ctrls, &Default::default());
    boards.push(w);
    b
}

/// The job's paths that were reached at the start; an error when none was.
fn live_keys(
    job: &JobSpec,
    job_keys: &[CtrlKey],
    down: &BTreeMap<CtrlKey, String>,
) -> Result<Vec<CtrlKey>> {
    let live: Vec<CtrlKey> = job_keys
        .iter()
        .filter(|k| !down.contains_key(*k))
        .cloned()
        .collect();
    if live.is_empty() {
        let (k, why) = down.iter().next().expect("only down keys are missing");
        bail!("every path of job {} is down: {} ({why})", job.name, k.0);
    }
    Ok(live)
}

/// How each worker of a multipath job re-opens each path (empty otherwise).
fn path_connectors(
    job: &Arc<JobSpec>,
    job_keys: &[CtrlKey],
    identity: &Option<Vec<u8>>,
    down: &BTreeMap<CtrlKey, String>,
    opts: &RunOpts,
) -> Vec<Arc<PathConnector>> {
    if job.multipath {
        job_keys
            .iter()
            .map(|k| {
                Arc::new(PathConnector {
                    key: k.clone(),
                    cfg: host_config(k, job.queues, opts),
                    job: job.clone(),
                    identity: identity.clone(),
                    down_at_start: down.contains_key(k),
                })
            })
            .collect()
    } else {
        Vec::new()
    }
}

/// The run's report from its job reports: overall ok, partial, bench CPU.
fn run_report(
    reports: Vec<crate::report::JobReport>,
    opts: &RunOpts,
    cpu0: &crate::report::CpuTime,
    stack: &'static str,
    switch: Option<crate::report::SwitchReport>,
) -> RunReport {
    let ok = reports
        .iter()
        .all(|r| r.errors == 0 && r.verify_failures == 0);
    let interrupted = opts.interrupted.load(Ordering::Relaxed);
    RunReport {
        partial: interrupted || reports.iter().any(|r| r.partial),
        interrupted,
        jobs: reports,
        bench_cpu: cpu_delta(cpu0, &cpu_time()),
        ok,
        stack,
        switch,
    }
}

/// Controllers of every key, and the multipath paths that could not be
/// reached (a path down at the start: its job starts on the others and keeps
/// trying it, as Linux's native multipath does).
type Connected = (BTreeMap<CtrlKey, Controller>, BTreeMap<CtrlKey, String>);

fn connect_all(jobs: &[JobSpec], opts: &RunOpts) -> Result<Connected> {
    let mut need: BTreeMap<CtrlKey, u32> = BTreeMap::new();
    // Keys only multipath jobs use may be down at the start.
    let mut may_be_down: BTreeMap<CtrlKey, bool> = BTreeMap::new();
    for j in jobs {
        for k in keys(j) {
            *need.entry(k.clone()).or_default() += j.numjobs * j.queues;
            let e = may_be_down.entry(k).or_insert(true);
            *e &= j.multipath;
        }
    }
    let mut out = BTreeMap::new();
    let mut down = BTreeMap::new();
    for (k, nq) in need {
        let cfg = host_config(&k, nq, opts);
        let mut c = match Controller::connect(&k.0, &k.1, &cfg) {
            Ok(c) => c,
            Err(e) if may_be_down[&k] => {
                eprintln!("path {} is down at the start ({e}): the run starts on the other paths and keeps trying it", k.0);
                down.insert(k, e.to_string());
                continue;
            }
            Err(e) => {
                let hint = connect_hint(&e, &k.0, &k.2);
                return Err(anyhow::Error::new(e)
                    .context(format!("connecting to {} at {} as {}{hint}", k.1, k.0, k.2)));
            }
        };
        let granted = c.set_num_queues(nq.min(u16::MAX as u32) as u16)?;
        if (granted as u32) < nq {
            bail!(
                "the controller at {} granted {granted} I/O queues, the jobs need {nq} (--numjobs × --queues of every job on it): use fewer, or raise the target's max_io_queues",
                k.0
            );
        }
        out.insert(k, c);
    }
    Ok((out, down))
}

/// The host settings of controller `k`, which `nq` I/O queues will share.
fn host_config(k: &CtrlKey, nq: u32, opts: &RunOpts) -> HostConfig {
    HostConfig {
        hostnqn: k.2.clone(),
        hostid: trellis_host::ctrl::hostid_from(&k.2),
        digests: Digests {
            header: k.3,
            data: k.4,
        },
        kato_ms: opts.kato_ms,
        command_timeout: opts.command_timeout,
        connect_timeout: opts.connect_timeout,
        credit_token: k
            .5
            .then(|| std::num::NonZeroU16::new(CREDIT_TOKEN))
            .flatten(),
        // Every queue of this tenant to this subsystem shares its credits.
        credit_share: nq.min(u16::MAX as u32) as u16,
        tls: opts.tls.clone(),
        dhchap_secret: opts.dhchap_secret.clone(),
        dhchap_ctrl_secret: opts.dhchap_ctrl_secret.clone(),
        ..Default::default()
    }
}

/// Re-opens one path of a multipath volume for one worker: a controller of
/// its own and the worker's queues on it (the worker keeps both).
pub struct PathConnector {
    key: CtrlKey,
    cfg: HostConfig,
    job: Arc<JobSpec>,
    /// The namespace identity the live paths reported at the start: a path
    /// opened later must reach the same namespace.
    identity: Option<Vec<u8>>,
    /// The path could not be reached when the run started.
    pub down_at_start: bool,
}

impl PathConnector {
    pub fn addr(&self) -> &str {
        &self.key.0
    }

    /// A new controller, the worker's queues on it, and its ANA state for
    /// the namespace (None when it reports none).
    pub fn connect(&self) -> Result<Reopened, String> {
        let mut c =
            Controller::connect(&self.key.0, &self.key.1, &self.cfg).map_err(|e| e.to_string())?;
        c.set_num_queues(self.job.queues.min(u16::MAX as u32) as u16)
            .map_err(|e| e.to_string())?;
        if let Some(want) = &self.identity {
            let ns = c.identify_ns(self.job.nsid).map_err(|e| e.to_string())?;
            if ns.identity().as_ref() != Some(want) {
                return Err(format!(
                    "path {} now reaches a different namespace {} than the volume's ({}): not used",
                    self.key.0,
                    self.job.nsid,
                    hex(want)
                ));
            }
        }
        let qs = open_queues(&mut c, &self.job).map_err(|e| format!("{e:#}"))?;
        let ana = crate::ana::read_state(&mut c, self.job.nsid);
        Ok((c, qs, ana))
    }
}

/// What [`PathConnector::connect`] gives a worker.
pub type Reopened = (
    Controller,
    Vec<(trellis_host::Queue, u32)>,
    Option<trellis_nvme::ana::AnaState>,
);

/// What a refused Connect most likely means, as the fix to try: the status
/// alone ("Connect Invalid Parameters") does not say.
fn connect_hint(e: &trellis_host::Error, addr: &str, hostnqn: &str) -> String {
    use trellis_nvme::status::specific;
    let trellis_host::Error::Nvme(s) = e else {
        return String::new();
    };
    let code = (s.sct(), s.sc());
    if code
        == (
            specific::CONNECT_INVALID_PARAMS.sct(),
            specific::CONNECT_INVALID_PARAMS.sc(),
        )
    {
        format!(" (the target at {addr} serves no such subsystem on this port: check --nqn against the target's log or `nvme discover`; a discovery-only port such as 8009 serves none)")
    } else if code
        == (
            specific::CONNECT_INVALID_HOST.sct(),
            specific::CONNECT_INVALID_HOST.sc(),
        )
    {
        format!(" (the subsystem does not allow host {hostnqn}: add it to the target's allowed_hosts / --allow-host, or use --hostnqn)")
    } else {
        String::new()
    }
}

/// (LBA size, usable blocks) of the job's namespace; for a replicated volume
/// every replica must have the same LBA size, and the smallest sets the size.
/// Block size, usable blocks, and (multipath) the namespace identity.
type Geometry = (u32, u64, Option<Vec<u8>>);

fn volume_geometry(
    job: &JobSpec,
    keys: &[CtrlKey],
    ctrls: &mut BTreeMap<CtrlKey, Controller>,
) -> Result<Geometry> {
    let mut geometry: Option<(u32, u64)> = None;
    let mut identity: Option<(String, Vec<u8>)> = None;
    for k in keys {
        let ctrl = ctrls.get_mut(k).expect("connected above");
        let ns = ctrl
            .identify_ns(job.nsid)
            .with_context(|| format!("identify namespace {} at {}", job.nsid, k.0))?;
        check_transfer(job, ctrl.id.max_transfer_bytes())?;
        let (bsz, nsze) = (ns.block_size(), ns.nsze);
        if job.multipath {
            check_same_namespace(job, k, &ns, &mut identity)?;
        }
        geometry = match geometry {
            None => Some((bsz, nsze)),
            Some((b, _)) if b != bsz => bail!(
                "replica {} formats namespace {} with {bsz}-byte blocks, the first replica with {b}: replicas must match",
                k.0,
                job.nsid
            ),
            Some((b, n)) => Some((b, n.min(nsze))),
        };
    }
    let (bsz, nsze) = geometry.context("a job with no target")?;
    Ok((bsz, nsze, identity.map(|(_, id)| id)))
}

/// A multipath volume's paths must reach one namespace: the same NGUID (or
/// EUI-64), as Linux's native multipath groups paths. A namespace that reports
/// neither cannot be told apart from another, so it is refused too.
fn check_same_namespace(
    job: &JobSpec,
    k: &CtrlKey,
    ns: &trellis_nvme::identify::IdNs,
    first: &mut Option<(String, Vec<u8>)>,
) -> Result<()> {
    let Some(id) = ns.identity() else {
        bail!(
            "path {} reports no NGUID or EUI-64 for namespace {}: paths to it cannot be verified to reach one namespace",
            k.0,
            job.nsid
        );
    };
    match first {
        None => *first = Some((k.0.clone(), id)),
        Some((a, f)) if *f != id => bail!(
            "path {} reaches a different namespace {} (identity {}) than path {a} ({}): --paths must name addresses of one namespace",
            k.0,
            job.nsid,
            hex(&id),
            hex(f)
        ),
        Some(_) => {}
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Refuses, before any I/O, a block size the controller would fail on every
/// command (above its MDTS).
fn check_transfer(job: &JobSpec, mdts: Option<u64>) -> Result<()> {
    match mdts {
        Some(max) if job.max_bs() as u64 > max => bail!(
            "block size {} is above the target's largest transfer (MDTS) of {}: use --bs {} or less",
            crate::job::fmt_size(job.max_bs() as u64),
            crate::job::fmt_size(max),
            crate::job::fmt_size(max)
        ),
        _ => Ok(()),
    }
}

/// The job's LBA range: [offset, offset + size), aligned to the largest I/O
/// so workers split it evenly. A range past the namespace's end is refused,
/// not clipped: the report would describe a different run than the one asked.
pub(crate) fn range_blocks(job: &JobSpec, nsze: u64, bsz: u32) -> Result<(u64, u64)> {
    let align = (job.max_bs() / bsz).max(1) as u64;
    let first = job.offset_bytes / bsz as u64;
    let ns_bytes = nsze.saturating_mul(bsz as u64);
    if first >= nsze {
        bail!(
            "--offset {} is beyond the end of namespace {} ({ns_bytes} bytes): use an offset below {ns_bytes}",
            job.offset_bytes,
            job.nsid
        );
    }
    let count = match job.size_bytes {
        Some(s) if s > (nsze - first) * bsz as u64 => bail!(
            "--size {s} from offset {} runs past the end of namespace {} ({ns_bytes} bytes): use --size {} or less",
            job.offset_bytes,
            job.nsid,
            (nsze - first) * bsz as u64
        ),
        Some(s) => s / bsz as u64,
        None => nsze - first,
    };
    let per = count / job.numjobs as u64 / align * align;
    if per == 0 {
        bail!(
            "the range ({} bytes) is too small for {} worker(s) of {}-byte I/Os: use a larger --size or fewer --numjobs",
            count * bsz as u64,
            job.numjobs,
            job.max_bs()
        );
    }
    if !job.min_bs().is_multiple_of(bsz) {
        bail!(
            "block size {} is not a multiple of the LBA size {bsz}",
            job.min_bs()
        );
    }
    Ok((first, per * job.numjobs as u64))
}

/// The worker's queues: depth split evenly, largest transfer = largest bs.
fn open_queues(c: &mut Controller, job: &JobSpec) -> Result<Vec<(trellis_host::Queue, u32)>> {
    let mut v = Vec::new();
    for i in 0..job.queues {
        let depth = job.iodepth / job.queues + u32::from(i < job.iodepth % job.queues);
        let size = depth.min(trellis_host::engine::MAX_QUEUE_SIZE as u32) as u16;
        let q = c
            .connect_io_queue(size, job.max_bs() as usize)
            .context("connecting an I/O queue")?;
        // The controller may grant a smaller queue than asked (CAP.MQES,
        // MAXCMD): refuse rather than run at a depth the report would not show.
        let granted = q.engine().queue_size() as u32;
        if granted < depth {
            bail!(
                "--iodepth {} needs {depth} commands per queue, but the target allows {granted}: use --iodepth {} or less, or more --queues",
                job.iodepth,
                granted * job.queues
            );
        }
        v.push((q, depth));
    }
    Ok(v)
}

/// Job reports from the workers' results, each with its I/O timeline.
fn reports_with_timelines(
    jobs: &[JobSpec],
    per_job: Vec<Vec<worker::WorkerResult>>,
    timelines: Vec<Vec<(u64, u64)>>,
) -> Vec<crate::report::JobReport> {
    jobs.iter()
        .zip(per_job)
        .zip(timelines)
        .map(|((j, r), t)| {
            let mut rep = job_report(j, r);
            rep.ios_timeline = t;
            rep
        })
        .collect()
}

/// Most points of a job's `ios_timeline` (100 ms apart: 2.8 hours).
const TIMELINE_SAMPLES_MAX: usize = 100_000;

/// Place-holder queues for a path down at the start, one per queue the job
/// would open, at the depth it would keep on each.
fn dead_queues(job: &JobSpec) -> Result<Vec<(trellis_host::Queue, u32)>> {
    (0..job.queues)
        .map(|i| {
            let depth = job.iodepth / job.queues + u32::from(i < job.iodepth % job.queues);
            let size = depth.min(trellis_host::engine::MAX_QUEUE_SIZE as u32) as u16;
            Ok((trellis_host::Queue::dead(size)?, depth))
        })
        .collect()
}

/// Main thread while workers run: Keep Alive, live progress, Ctrl-C-free stop
/// on worker failure, and each job's I/O timeline (returned).
/// A multipath job's ANA board and the controllers that feed it.
struct AnaWatch {
    job: usize,
    keys: Vec<CtrlKey>,
    nsid: u32,
    board: Arc<crate::ana::AnaBoard>,
}

impl AnaWatch {
    /// Re-reads every live path's ANA state and publishes them; a path
    /// without a live controller here is published as not known.
    fn refresh(
        &self,
        ctrls: &mut BTreeMap<CtrlKey, Controller>,
        dead: &std::collections::BTreeSet<CtrlKey>,
    ) {
        for (i, k) in self.keys.iter().enumerate() {
            let st = match ctrls.get_mut(k) {
                Some(c) if !dead.contains(k) => crate::ana::read_state(c, self.nsid),
                _ => None,
            };
            self.board.set(i, st);
        }
        self.board.publish();
    }
}

#[allow(clippy::too_many_arguments)]
fn watch(
    jobs: &[JobSpec],
    handles: &[(usize, std::thread::JoinHandle<worker::WorkerResult>)],
    progress: &[Arc<AtomicU64>],
    ctrls: &mut BTreeMap<CtrlKey, Controller>,
    boards: &[AnaWatch],
    opts: &RunOpts,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<Vec<(u64, u64)>>> {
    let mut timelines: Vec<Vec<(u64, u64)>> = jobs.iter().map(|_| Vec::new()).collect();
    let total = jobs
        .iter()
        .map(|j| j.ramp + j.runtime)
        .max()
        .unwrap_or_default();
    let bar = opts.progress.then(|| {
        let b = indicatif::ProgressBar::new(total.as_millis() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {msg}")
                .expect("valid template"),
        );
        b
    });
    let start = Instant::now();
    let mut last = (Instant::now(), vec![0u64; progress.len()]);
    // Controllers that are paths of a multipath volume, and those that failed.
    let path_keys: std::collections::BTreeSet<CtrlKey> =
        jobs.iter().filter(|j| j.multipath).flat_map(keys).collect();
    let mut dead = std::collections::BTreeSet::new();
    let mut ana_at = Instant::now();
    while !handles.iter().all(|(_, h)| h.is_finished()) {
        if ana_at.elapsed() >= crate::ana::ANA_REFRESH {
            ana_at = Instant::now();
            boards.iter().for_each(|w| w.refresh(ctrls, &dead));
        }
        std::thread::sleep(Duration::from_millis(100));
        let t_ms = start.elapsed().as_millis() as u64;
        for (t, p) in timelines.iter_mut().zip(progress) {
            if t.len() < TIMELINE_SAMPLES_MAX {
                t.push((t_ms, p.load(Ordering::Relaxed)));
            }
        }
        if opts.interrupted.load(Ordering::Relaxed) {
            stop.store(true, Ordering::Relaxed);
        }
        for (k, c) in ctrls.iter_mut() {
            if dead.contains(k) {
                continue;
            }
            if let Err(e) = c.tick() {
                // A path of a multipath volume may die: its workers move its
                // I/O to the other paths. Any other controller ends the run.
                if path_keys.contains(k) {
                    eprintln!(
                        "path {}: keep alive failed: {e}; its I/O moves to the other paths",
                        k.0
                    );
                    dead.insert(k.clone());
                } else {
                    stop.store(true, Ordering::Relaxed);
                    eprintln!("keep alive failed: {e}");
                }
            }
        }
        if let Some(b) = &bar {
            let dt = last.0.elapsed().as_secs_f64();
            let now: Vec<u64> = progress.iter().map(|p| p.load(Ordering::Relaxed)).collect();
            let msg: Vec<String> = jobs
                .iter()
                .zip(now.iter().zip(&last.1))
                .map(|(j, (n, l))| format!("{}: {:.0} IOPS", j.name, (n - l) as f64 / dt))
                .collect();
            b.set_position(start.elapsed().as_millis() as u64);
            b.set_message(msg.join("  "));
            last = (Instant::now(), now);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(timelines)
}
