//! `trellis bench --stack blk-switch`: the jobs run as applications on a
//! host stack built like a switch (`trellis_path::switch`, blk-switch,
//! OSDI'21) instead of one thread per job.
//!
//! One reactor thread per core (`--cpus`, pinned; default every CPU the
//! process may use). Each core owns two I/O queue pairs to the target, one
//! per class, as a kernel host does with `nvme connect -W`: the latency
//! class's and the throughput class's. A job's `class` makes its workers
//! L-apps or T-apps; each app lives on a core (spread round-robin at start,
//! moved by application steering). Every loop a reactor polls its latency
//! queue first, and again after each throughput receive, so an L-app's
//! completion never waits behind a T-app's data; new requests go through the
//! switch core, which decides the carrying core and the caravans.
//!
//! The switch's state and the apps' generators are shared by the reactors
//! behind one mutex, taken once per loop iteration for the whole batch of
//! completions and submissions (not per I/O); with one core it is never
//! contended. docs/host.md "Class isolation (blk-switch)".

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use trellis_host::engine::rw_sqe;
use trellis_host::{Completion, Controller, Queue, Xfer};
use trellis_nvme::sqe::io;
use trellis_path::switch::{Class as SwClass, Level, Req, Switch, SwitchConfig};

use crate::job::{Class, JobSpec};
use crate::worker::{empty_result, pin_current_thread, WorkerResult};

/// Bytes of a command capsule on the wire (PDU header + SQE).
const CMD_WIRE_BYTES: u32 = 72;
/// Time without a completion before an idle reactor yields its CPU (as the
/// plain workers do).
const IDLE_BEFORE_YIELD: Duration = Duration::from_micros(200);

/// Most bytes one receive on a throughput queue takes (i10's 64 KiB caravan).
const T_RECV_MAX_BYTES: usize = 65_536;

/// The reactor threads and the state they share.
pub type Started = (
    Vec<std::thread::JoinHandle<WorkerResult>>,
    Arc<Mutex<Shared>>,
);

/// What `--stack blk-switch` runs with.
#[derive(Clone, Debug)]
pub struct SwitchOpts {
    pub level: Level,
    /// Doorbell delay of the throughput caravans, µs (i10: 50; below 25 off).
    pub doorbell_us: u64,
}

/// One I/O of an app, between its generation and its completion.
#[derive(Clone, Copy, Debug, Default)]
struct Io {
    write: bool,
    lba: u64,
    nlb: u32,
    t0_ns: u64,
}

/// An application: one worker of one job, generating a closed loop.
struct App {
    job: usize,
    id: u16,
    rng: SmallRng,
    first_lba: u64,
    nblocks: u64,
    cursor: u64,
    inflight: u32,
    /// Slab of I/O records (capacity iodepth) and its free list.
    ios: Vec<Io>,
    free: Vec<u32>,
    end_ns: u64,
    measure_from_ns: u64,
    res: WorkerResult,
}

/// The switch and the apps, shared by the reactors (opaque to callers).
pub struct Shared {
    sw: Switch,
    apps: Vec<App>,
    jobs: Vec<Arc<JobSpec>>,
    block_size: u32,
}

/// A reactor's queue pair of one class and what it carries.
struct ClassQueue {
    q: Queue,
    /// Per slot: the switch's request (tag = app << 32 | slab index).
    reqs: Vec<Req>,
}

pub fn run(
    jobs: &[JobSpec],
    ctrl: &mut Controller,
    cpus: &[usize],
    sw_opts: &SwitchOpts,
    geometry: (u32, u64),
    stop: Arc<AtomicBool>,
    progress: Vec<Arc<AtomicU64>>,
) -> Result<Started> {
    let (bsz, nsze) = geometry;
    let cores = cpus.len().max(1);
    let mut cfg = SwitchConfig::new(cores);
    cfg.level = sw_opts.level;
    cfg.doorbell_delay_ns = sw_opts.doorbell_us * 1000;
    let mut sw = Switch::new(cfg).map_err(|e| anyhow::anyhow!("--stack blk-switch: {e}"))?;
    let t0 = Instant::now();
    let mut apps = Vec::new();
    let mut depth = [0u32; 2];
    let mut max_bs = 4096;
    for (ji, j) in jobs.iter().enumerate() {
        let class = sw_class(j.class);
        depth[class as usize] += j.iodepth * j.numjobs;
        max_bs = max_bs.max(j.max_bs());
        let (first, count) = crate::runner::range_blocks(j, nsze, bsz)?;
        let per = count / j.numjobs as u64;
        for w in 0..j.numjobs {
            let id = sw
                .add_app(class, apps.len() % cores)
                .map_err(|e| anyhow::anyhow!("--stack blk-switch: {e}"))?;
            let start = j.ramp.as_nanos() as u64;
            apps.push(App {
                job: ji,
                id,
                rng: SmallRng::seed_from_u64(j.seed ^ ((ji as u64) << 32 | w as u64)),
                first_lba: first + per * w as u64,
                nblocks: per,
                cursor: 0,
                inflight: 0,
                ios: vec![Io::default(); j.iodepth as usize],
                free: (0..j.iodepth).rev().collect(),
                end_ns: start + j.runtime.as_nanos() as u64,
                measure_from_ns: start,
                res: empty_result(),
            });
        }
    }
    let shared = Arc::new(Mutex::new(Shared {
        sw,
        apps,
        jobs: jobs.iter().cloned().map(Arc::new).collect(),
        block_size: bsz,
    }));
    let mut handles = Vec::new();
    for core in 0..cores {
        let (l, t) = core_queues(ctrl, &depth, max_bs)?;
        let r = Reactor {
            core,
            cpu: cpus.get(core).copied(),
            l,
            t,
            shared: shared.clone(),
            stop: stop.clone(),
            progress: progress.clone(),
            t0,
            done: Vec::with_capacity(depth[0] as usize + depth[1] as usize),
            res: empty_result(),
            stop_seen: None,
        };
        handles.push(
            std::thread::Builder::new()
                .name(format!("blk-switch-{core}"))
                .spawn(move || r.run())?,
        );
    }
    Ok((handles, shared))
}

/// One core's two queue pairs, latency then throughput, each deep enough for
/// every request of its class (`depth`), as (latency, throughput).
fn core_queues(
    ctrl: &mut Controller,
    depth: &[u32; 2],
    max_bs: u32,
) -> Result<(ClassQueue, ClassQueue)> {
    let mut qs = Vec::new();
    for (ci, &d) in depth.iter().enumerate() {
        // Any core may carry every request of a class (steering).
        let size = (d + 1).clamp(2, trellis_host::engine::MAX_QUEUE_SIZE as u32);
        let q = ctrl
            .connect_io_queue(size as u16, max_bs as usize)
            .context("connecting an I/O queue")?;
        let granted = q.engine().queue_size() as u32;
        if granted < d {
            bail!(
                "--stack blk-switch: the {} class needs {d} commands per queue (its jobs' iodepth × numjobs), the target allows {granted}: lower the iodepths",
                if ci == 0 { "latency" } else { "throughput" }
            );
        }
        let n = q.engine().queue_size() as usize;
        let mut q = q;
        if ci == 1 {
            // A throughput receive is one turn of bounded length, so the
            // latency queue is polled again within it (blk-switch bounds
            // T work per turn; i10's caravan size).
            q.set_recv_max(T_RECV_MAX_BYTES);
        }
        qs.push(ClassQueue {
            q,
            reqs: vec![dummy_req(); n],
        });
    }
    let t = qs.pop().expect("two queues");
    let l = qs.pop().expect("two queues");
    Ok((l, t))
}

/// Per-app results, in job order, and the switch's counters, once the
/// reactors have stopped.
pub fn results(
    shared: &Arc<Mutex<Shared>>,
    jobs: usize,
) -> (Vec<Vec<WorkerResult>>, crate::report::SwitchReport) {
    let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
    let mut out: Vec<Vec<WorkerResult>> = (0..jobs).map(|_| Vec::new()).collect();
    let st = s.sw.stats;
    let cfg = s.sw.config().clone();
    let app_cores = s.apps.iter().map(|a| s.sw.app_core(a.id)).collect();
    for a in s.apps.drain(..) {
        out[a.job].push(a.res);
    }
    let report = crate::report::SwitchReport {
        level: level_name(cfg.level).to_string(),
        cores: cfg.cores,
        doorbell_us: cfg.doorbell_delay_ns / 1000,
        caravans: st.caravans,
        doorbell_timeouts: st.doorbell_timeouts,
        steered_requests: st.steered_requests,
        app_moves: st.app_moves,
        app_cores,
    };
    (out, report)
}

pub fn level_name(l: Level) -> &'static str {
    match l {
        Level::Priority => "priority",
        Level::RequestSteering => "request-steering",
        Level::AppSteering => "app-steering",
    }
}

/// `--switch-level` values.
pub fn parse_level(s: &str) -> Result<Level> {
    Ok(match s {
        "priority" | "0" => Level::Priority,
        "request-steering" | "1" => Level::RequestSteering,
        "app-steering" | "2" => Level::AppSteering,
        other => bail!(
            "--switch-level {other:?} is not a level: use priority, request-steering or app-steering"
        ),
    })
}

fn sw_class(c: Class) -> SwClass {
    match c {
        Class::Latency => SwClass::Latency,
        Class::Throughput => SwClass::Throughput,
    }
}

fn dummy_req() -> Req {
    Req {
        app: 0,
        class: SwClass::Throughput,
        io_bytes: 0,
        wire_bytes: 0,
        tag: 0,
        home: 0,
        steered: false,
    }
}

struct Reactor {
    core: usize,
    cpu: Option<usize>,
    l: ClassQueue,
    t: ClassQueue,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    progress: Vec<Arc<AtomicU64>>,
    t0: Instant,
    /// Completions of this iteration: (class, completion, time).
    done: Vec<(SwClass, Completion, u64)>,
    /// This reactor's own counters (polls); the apps hold the I/O results.
    res: WorkerResult,
    /// When this reactor first saw the stop flag.
    stop_seen: Option<Instant>,
}

/// After a stop (a failed queue, a lost keep-alive, Ctrl-C), how long the
/// reactors wait for commands in flight before giving up on them: a failed
/// queue's commands never complete.
const STOP_DRAIN: Duration = Duration::from_secs(2);

impl Reactor {
    fn run(mut self) -> WorkerResult {
        if let Some(cpu) = self.cpu {
            pin_current_thread(cpu);
        }
        let mut idle_since: Option<Instant> = None;
        loop {
            match self.iterate() {
                Ok((n, finished)) => {
                    if finished {
                        break;
                    }
                    match (n, idle_since) {
                        (0, None) => idle_since = Some(Instant::now()),
                        (0, Some(t)) if t.elapsed() >= IDLE_BEFORE_YIELD => {
                            idle_since = None;
                            std::thread::yield_now();
                        }
                        (0, Some(_)) => {}
                        _ => idle_since = None,
                    }
                }
                Err(e) => {
                    self.res.fatal = true;
                    self.res.errors += 1;
                    self.res.first_error = Some(e);
                    self.stop.store(true, Ordering::Relaxed);
                    break;
                }
            }
        }
        for q in [&self.l, &self.t] {
            self.res.polls += q.q.stats.polls;
            self.res.idle_polls += q.q.stats.idle_polls;
        }
        self.res
    }

    fn now_ns(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    /// One loop: latency receive, throughput receive, latency again, then
    /// one pass under the lock. Returns (completions, whether all is done).
    fn iterate(&mut self) -> Result<(usize, bool), String> {
        self.done.clear();
        poll(&mut self.l, SwClass::Latency, &mut self.done, self.t0)?;
        if self.done.is_empty() {
            poll(&mut self.t, SwClass::Throughput, &mut self.done, self.t0)?;
            // A latency completion that arrived meanwhile is handled in this
            // same pass, not after the next throughput receive.
            poll(&mut self.l, SwClass::Latency, &mut self.done, self.t0)?;
        }
        let n = self.done.len();
        let shared = self.shared.clone();
        let mut s = shared
            .lock()
            .map_err(|_| "a reactor panicked".to_string())?;
        let now = self.now_ns();
        for i in 0..n {
            let (class, c, at) = self.done[i];
            self.complete(&mut s, class, c, at);
        }
        s.sw.handle_timeout(now);
        let stopping = self.stop.load(Ordering::Relaxed);
        if stopping && self.stop_seen.is_none() {
            self.stop_seen = Some(Instant::now());
        }
        let gave_up = self.stop_seen.is_some_and(|t| t.elapsed() >= STOP_DRAIN);
        self.top_up(&mut s, now, stopping)?;
        self.send(&mut s, now)?;
        let finished = gave_up
            || s.apps
                .iter()
                .all(|a| a.inflight == 0 && (stopping || now >= a.end_ns))
                && s.sw.waiting(self.core, SwClass::Latency) == 0
                && s.sw.waiting(self.core, SwClass::Throughput) == 0;
        drop(s);
        self.l.q.flush().map_err(|e| e.to_string())?;
        self.t.q.flush().map_err(|e| e.to_string())?;
        Ok((n, finished))
    }

    fn complete(&mut self, s: &mut Shared, class: SwClass, c: Completion, at: u64) {
        let cq = match class {
            SwClass::Latency => &mut self.l,
            SwClass::Throughput => &mut self.t,
        };
        let req = cq.reqs[c.slot as usize];
        cq.q.free(c.slot);
        s.sw.complete(self.core, &req, at);
        let bsz = s.block_size as u64;
        let a = &mut s.apps[(req.tag >> 32) as usize];
        let idx = (req.tag & 0xffff_ffff) as u32;
        let io = a.ios[idx as usize];
        a.free.push(idx);
        a.inflight -= 1;
        if !c.status.is_success() {
            a.res.errors += 1;
            a.res.first_error.get_or_insert_with(|| {
                format!(
                    "{} of {} blocks at LBA {}: {}",
                    if io.write { "Write" } else { "Read" },
                    io.nlb,
                    io.lba,
                    c.status
                )
            });
            return;
        }
        if io.t0_ns < a.measure_from_ns || at > a.end_ns {
            return;
        }
        let ns = at.saturating_sub(io.t0_ns).max(100);
        let bytes = io.nlb as u64 * bsz;
        if io.write {
            a.res.write_hist.saturating_record(ns);
            a.res.write_bytes += bytes;
        } else {
            a.res.read_hist.saturating_record(ns);
            a.res.read_bytes += bytes;
        }
        a.res.measured = Duration::from_nanos(a.end_ns - a.measure_from_ns);
        self.progress[a.job].fetch_add(1, Ordering::Relaxed);
    }

    /// The apps living on this core fill their iodepth; their requests join
    /// the egress queue the switch picks.
    fn top_up(&mut self, s: &mut Shared, now: u64, stopping: bool) -> Result<(), String> {
        let Shared {
            sw,
            apps,
            jobs,
            block_size,
        } = s;
        for a in apps.iter_mut() {
            if stopping || now >= a.end_ns || sw.app_core(a.id) != self.core {
                continue;
            }
            let job = &jobs[a.job];
            while a.inflight < job.iodepth {
                let Some(idx) = a.free.pop() else { break };
                let io = next_io(a, job, *block_size, now);
                let bytes = io.nlb * *block_size;
                let wire = CMD_WIRE_BYTES + if io.write { bytes } else { 0 };
                let tag = (a.id as u64) << 32 | idx as u64;
                if sw.submit(a.id, bytes, wire, tag, now).is_err() {
                    a.free.push(idx);
                    break;
                }
                a.ios[idx as usize] = io;
                a.inflight += 1;
            }
        }
        Ok(())
    }

    /// Puts what the switch releases for this core on its queue pairs.
    fn send(&mut self, s: &mut Shared, now: u64) -> Result<(), String> {
        while let Some(x) = s.sw.next_send(self.core, now) {
            let a = &s.apps[(x.req.tag >> 32) as usize];
            let io = a.ios[(x.req.tag & 0xffff_ffff) as usize];
            let nsid = s.jobs[a.job].nsid;
            let cq = match x.req.class {
                SwClass::Latency => &mut self.l,
                SwClass::Throughput => &mut self.t,
            };
            // Queues are sized for every request of their class at once.
            let slot = cq.q.alloc().ok_or("no free slot in a class queue")?;
            let len = io.nlb * s.block_size;
            let (opc, xfer) = if io.write {
                (io::WRITE, Xfer::ToCtrl(len))
            } else {
                (io::READ, Xfer::FromCtrl(len))
            };
            cq.reqs[slot as usize] = x.req;
            cq.q.submit(
                slot,
                rw_sqe(opc, nsid, io.lba, io.nlb),
                xfer,
                self.t0 + Duration::from_nanos(io.t0_ns),
            )
            .map_err(|e| e.to_string())?;
            if x.flush {
                cq.q.flush().map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}

/// Flushes, receives once and collects completions of one class queue.
fn poll(
    cq: &mut ClassQueue,
    class: SwClass,
    out: &mut Vec<(SwClass, Completion, u64)>,
    t0: Instant,
) -> Result<(), String> {
    let n = cq.q.poll(Instant::now()).map_err(|e| e.to_string())?;
    if n == 0 {
        return Ok(());
    }
    let at = t0.elapsed().as_nanos() as u64;
    while let Some(c) = cq.q.next_completion() {
        out.push((class, c, at));
    }
    Ok(())
}

fn next_io(a: &mut App, job: &JobSpec, bsz: u32, now: u64) -> Io {
    let write = match job.read_pct {
        100 => false,
        0 => true,
        p => a.rng.gen_range(0..100) >= p,
    };
    let nlb = pick_nlb(&mut a.rng, job, bsz).min(a.nblocks as u32).max(1);
    let span = a.nblocks - nlb as u64 + 1;
    let off = if job.random {
        let align = (job.min_bs() / bsz).max(1) as u64;
        (a.rng.gen_range(0..span.div_ceil(align)) * align).min(span - 1)
    } else {
        if a.cursor + nlb as u64 > a.nblocks {
            a.cursor = 0;
        }
        let o = a.cursor;
        a.cursor += nlb as u64;
        o
    };
    Io {
        write,
        lba: a.first_lba + off,
        nlb,
        t0_ns: now,
    }
}

fn pick_nlb(rng: &mut SmallRng, job: &JobSpec, bsz: u32) -> u32 {
    let sizes = &job.sizes;
    if sizes.len() > 1 {
        let mut r = rng.gen_range(0..100);
        for &(b, w) in sizes {
            if r < w {
                return b / bsz;
            }
            r -= w;
        }
    }
    sizes[0].0 / bsz
}
