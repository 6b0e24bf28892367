//! One bench worker: a reactor thread that owns its queue pairs and drives
//! them run-to-completion. Each loop iteration polls every queue (one
//! gathered sendmsg + one recv each), completes what arrived, and immediately
//! refills the queue, so all new commands of an iteration leave together in
//! the next flush. Nothing on this path allocates: per-slot I/O contexts and
//! data buffers are set up before the first command.
//!
//! This file holds the worker's state, its phases and the completion path;
//! `draw.rs` draws each I/O, `submit.rs` sends it, `paths.rs` handles
//! multipath failures and re-opens, and `result.rs` is what it reports.

mod draw;
mod paths;
mod result;
mod submit;

pub use result::{empty_result, WorkerResult};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::SeedableRng;
use trellis_host::{Completion, Queue};

use crate::job::{JobSpec, ReplicaRead};
use crate::verify::check_block;
use paths::{ana_state_of, path_set};
use trellis_path::multipath::PathSet;
use trellis_path::replica::{ReadPolicy, ReplicaChooser};

/// Verification state per block: generation, with the top bit marking a
/// block that has an I/O in flight (no overlapping I/O while verifying).
const BUSY: u32 = 1 << 31;
/// A block whose content is unknown (a write to it failed): never checked.
const UNKNOWN: u32 = BUSY - 1;
/// Keep this many verify failures with full detail; count the rest.
const MAX_FAILURE_SAMPLES: usize = 16;
/// Time without a completion before the worker yields its CPU: ten times a
/// loopback round trip to a fast target, far below a scheduler time slice.
const IDLE_BEFORE_YIELD: Duration = Duration::from_micros(200);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Read,
    Write,
}

#[derive(Clone, Copy, Debug)]
struct Io {
    op: Op,
    lba: u64,
    nlb: u32,
    /// When the I/O was drawn (its latency counts from here, including any
    /// wait in the host for a path or a credit).
    t0: Instant,
    /// When its command went out on its path (round trips count from here).
    sent: Instant,
    /// A replicated write's entry in `Worker::writes`, or `NO_WRITE`.
    write: u32,
    /// The response rate this read reserved on its path, bytes/s
    /// (`--path-rate`; 0 otherwise).
    grant: u64,
}

const NO_WRITE: u32 = u32::MAX;

/// A write sent to every replica: done when the last part completes.
#[derive(Clone, Copy, Debug)]
struct ReplicatedWrite {
    parts_left: u32,
    ok: bool,
}

pub struct WorkerPlan {
    pub job: Arc<JobSpec>,
    pub index: u32,
    /// Queue pairs and the depth this worker keeps on each; with replicas,
    /// replica-major: queue `i` of replica `r` at `r * per_replica + i`.
    pub queues: Vec<(Queue, u32)>,
    /// Replicas of the volume (1: a plain namespace).
    pub replicas: u32,
    pub block_size: u32,
    pub first_lba: u64,
    pub nblocks: u64,
    pub progress: Arc<AtomicU64>,
    pub stop: Arc<AtomicBool>,
    pub cpu: Option<usize>,
    /// Multipath: how to re-open each path (one per path; empty otherwise).
    pub reconnect: Vec<Arc<crate::runner::PathConnector>>,
    /// Multipath: the paths' ANA states as the main thread reads them.
    pub ana: Option<Arc<crate::ana::AnaBoard>>,
}

/// First wait before re-opening a failed path, doubled after each failed
/// attempt up to [`RECONNECT_BACKOFF_MAX`]. Bench runs last seconds, so these
/// are far below Linux's nvme-tcp `reconnect_delay` of 10 s.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How often a re-opened path's own controller is given a chance to send a
/// Keep Alive (it sends one only every KATO/2).
const PATH_TICK: Duration = Duration::from_millis(100);

type Reopened = Result<crate::runner::Reopened, String>;

/// A path of a multipath volume, as one worker sees it.
struct PathState {
    connector: Arc<crate::runner::PathConnector>,
    /// The controller this worker opened when it re-opened the path (the
    /// first one belongs to the runner).
    ctrl: Option<trellis_host::Controller>,
    down: bool,
    backoff: Duration,
    next_try: Instant,
    /// A re-open in progress on a helper thread: connecting may take up to
    /// the connect timeout, and the other paths must keep going meanwhile.
    pending: Option<std::sync::mpsc::Receiver<Reopened>>,
    last_tick: Instant,
    /// Commands sent on the path since it was last re-opened.
    ios_since_reopen: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Write every block once (verify with reads needs known content).
    Prefill,
    Main,
    /// Read every block back and check it (verify with writes).
    Readback,
}

struct Worker {
    job: Arc<JobSpec>,
    queues: Vec<QueueCtx>,
    /// Queue groups: group `g` is queue `g` of every replica (one queue
    /// without replicas); the job's depth applies to a group's I/Os.
    groups: Vec<Group>,
    replicas: usize,
    /// The "replicas" are paths to one namespace (`--paths`).
    multipath: bool,
    /// I/Os of a failed path waiting for a live one: (group, I/O).
    retry: Vec<(usize, Io)>,
    /// Multipath: each path's state (empty otherwise).
    paths: Vec<PathState>,
    /// Multipath: the paths' states (up, ANA, reservations) and the policy
    /// that picks each command's path (trellis_path::multipath).
    pathset: Option<PathSet>,
    /// The ANA board and the refresh of it last applied to `pathset`.
    ana: Option<Arc<crate::ana::AnaBoard>>,
    ana_seq: u64,
    /// Zero of the ns clock `isr` runs on.
    t_start: Instant,
    /// Replicated writes in flight, and the free entries.
    writes: Vec<ReplicatedWrite>,
    free_writes: Vec<u32>,
    block_size: u32,
    first_lba: u64,
    nblocks: u64,
    align_blocks: u64,
    gens: Vec<u32>,
    seed: u32,
    rng: SmallRng,
    cursor: u64,
    measuring: bool,
    res: WorkerResult,
    progress: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    // Rate limit state for the main phase.
    rate_start: Instant,
    issued_ios: u64,
    issued_bytes: u64,
    rate_iops: f64,
    rate_bytes: f64,
}

struct QueueCtx {
    q: Queue,
    depth: u32,
    inflight: u32,
    ios: Vec<Io>,
    /// Per slot: a command of ours is on the wire (its I/O moves if the
    /// path fails).
    busy: Vec<bool>,
    /// A multipath volume's path that failed: never polled or chosen again.
    down: bool,
}

impl QueueCtx {
    fn new(q: Queue, depth: u32) -> QueueCtx {
        let depth = depth.min(q.engine().queue_size() as u32).max(1);
        let n = q.engine().queue_size() as usize;
        let io = Io {
            op: Op::Read,
            lba: 0,
            nlb: 0,
            t0: Instant::now(),
            sent: Instant::now(),
            write: NO_WRITE,
            grant: 0,
        };
        QueueCtx {
            q,
            depth,
            inflight: 0,
            ios: vec![io; n],
            busy: vec![false; n],
            down: false,
        }
    }
}

/// One I/O stream over the replicas: reads go to one member, writes to all.
struct Group {
    depth: u32,
    /// I/Os in flight (a replicated write counts once).
    inflight: u32,
    /// Picks the replica of each read (round-robin or headroom).
    chooser: ReplicaChooser,
    /// An operation drawn while no replica could take it: (operation, its
    /// blocks, when it was drawn).
    next_op: Option<(Op, u32, Instant)>,
}

pub fn run(plan: WorkerPlan) -> WorkerResult {
    if let Some(cpu) = plan.cpu {
        pin_current_thread(cpu);
    }
    let mut w = Worker::new(plan);
    w.mark_down_at_start();
    let phases: &[Phase] = match (w.job.verify, w.job.read_pct) {
        (false, _) => &[Phase::Main],
        (true, 0) => &[Phase::Main, Phase::Readback],
        (true, 100) => &[Phase::Prefill, Phase::Main],
        (true, _) => &[Phase::Prefill, Phase::Main, Phase::Readback],
    };
    for &p in phases {
        if let Err(e) = w.run_phase(p) {
            w.res.fatal = true;
            w.res.errors += 1;
            w.res.first_error.get_or_insert(e);
            w.stop.store(true, Ordering::Relaxed);
            break;
        }
        if w.stop.load(Ordering::Relaxed) && p != Phase::Main {
            break;
        }
    }
    for p in &mut w.paths {
        if let Some(c) = p.ctrl.take() {
            let _ = c.shutdown();
        }
    }
    w.res.path_ios_since_reopen = w.paths.iter().map(|p| p.ios_since_reopen).collect();
    w.res.reserve_waits = w.pathset.as_ref().map_or(0, |ps| ps.reserve_waits());
    let per_replica = w.groups.len().max(1);
    w.res.replica_credits_last = w
        .queues
        .chunks(per_replica)
        .map(|qs| qs.iter().rev().find_map(|qc| qc.q.engine().io_credits()))
        .collect();
    for qc in &w.queues {
        w.res.polls += qc.q.stats.polls;
        w.res.idle_polls += qc.q.stats.idle_polls;
        if let Some(c) = qc.q.engine().io_credits() {
            w.res.io_credits_last = Some(c);
        }
    }
    w.res
}

fn ns_since(t0: Instant) -> u64 {
    t0.elapsed().as_nanos() as u64
}

/// One group per queue of the first replica (or path), each with that queue's
/// depth and a read chooser for the job's policy.
fn groups(job: &JobSpec, queues: &[QueueCtx], replicas: usize) -> Vec<Group> {
    queues[..queues.len() / replicas]
        .iter()
        .map(|qc| Group {
            depth: qc.depth,
            inflight: 0,
            chooser: ReplicaChooser::new(match job.replica_read {
                ReplicaRead::RoundRobin => ReadPolicy::RoundRobin,
                ReplicaRead::Headroom => ReadPolicy::Headroom,
                ReplicaRead::QueueDepth => ReadPolicy::QueueDepth,
                // Chosen by `isr` below; the chooser is the fallback.
                ReplicaRead::Isr => ReadPolicy::QueueDepth,
            }),
            next_op: None,
        })
        .collect()
}

impl PathState {
    /// A path as the run starts: down if it could not be reached, the first
    /// re-open attempt due at once.
    fn new(connector: Arc<crate::runner::PathConnector>) -> PathState {
        PathState {
            down: connector.down_at_start,
            connector,
            ctrl: None,
            backoff: RECONNECT_BACKOFF_MIN,
            next_try: Instant::now(),
            pending: None,
            last_tick: Instant::now(),
            ios_since_reopen: 0,
        }
    }
}

impl Worker {
    fn new(p: WorkerPlan) -> Worker {
        let job = p.job;
        let bs_blocks = (job.min_bs() / p.block_size).max(1);
        let gens = if job.verify {
            vec![0u32; p.nblocks as usize]
        } else {
            Vec::new()
        };
        let queues = p
            .queues
            .into_iter()
            .map(|(q, depth)| QueueCtx::new(q, depth))
            .collect::<Vec<QueueCtx>>();
        let replicas = p.replicas.max(1) as usize;
        let groups = groups(&job, &queues, replicas);
        let write_slots: u32 = if replicas > 1 && !job.multipath {
            groups.iter().map(|g| g.depth).sum()
        } else {
            0
        };
        let mut res = empty_result();
        res.replica_reads = vec![0; replicas];
        let nj = job.numjobs as f64;
        Worker {
            groups,
            replicas,
            multipath: job.multipath,
            retry: Vec::new(),
            pathset: job.multipath.then(|| path_set(&job, replicas)),
            ana: p.ana,
            ana_seq: 0,
            t_start: Instant::now(),
            paths: p.reconnect.into_iter().map(PathState::new).collect(),
            writes: vec![
                ReplicatedWrite {
                    parts_left: 0,
                    ok: true
                };
                write_slots as usize
            ],
            free_writes: (0..write_slots).rev().collect(),
            rate_iops: job.rate_iops as f64 / nj,
            rate_bytes: job.rate_bytes as f64 / nj,
            seed: (job.seed as u32) ^ p.index.wrapping_mul(0x9E37_79B9),
            rng: SmallRng::seed_from_u64(job.seed ^ (p.index as u64) << 32),
            align_blocks: bs_blocks as u64,
            block_size: p.block_size,
            first_lba: p.first_lba,
            nblocks: p.nblocks,
            gens,
            cursor: 0,
            measuring: false,
            res,
            progress: p.progress,
            stop: p.stop,
            rate_start: Instant::now(),
            issued_ios: 0,
            issued_bytes: 0,
            queues,
            job,
        }
    }

    fn run_phase(&mut self, phase: Phase) -> Result<(), String> {
        let start = Instant::now();
        let measure_from = start + self.job.ramp;
        let end = measure_from + self.job.runtime;
        self.cursor = 0;
        self.rate_start = start;
        self.issued_ios = 0;
        self.issued_bytes = 0;
        let mut measure_start = start;
        let r = self.phase_loop(phase, measure_from, end, &mut measure_start);
        // Also when a queue failed: the I/O counted so far was done in this
        // time, and dividing it by zero would report absurd rates.
        if phase == Phase::Main && self.measuring {
            self.res.measured = Instant::now()
                .min(end)
                .saturating_duration_since(measure_start);
            self.measuring = false;
        }
        r
    }

    fn phase_loop(
        &mut self,
        phase: Phase,
        measure_from: Instant,
        end: Instant,
        measure_start: &mut Instant,
    ) -> Result<(), String> {
        let mut idle_since: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if phase == Phase::Main && !self.measuring && now >= measure_from {
                self.measuring = true;
                *measure_start = now;
            }
            if self.multipath {
                self.tend_paths(now)?;
            }
            let issuing = !self.stop.load(Ordering::Relaxed)
                && match phase {
                    Phase::Main => now < end,
                    _ => self.cursor < self.nblocks,
                };
            let mut done = 0u64;
            let mut inflight = 0;
            let n = self.groups.len();
            for g in 0..n {
                for r in 0..self.replicas {
                    let qi = r * n + g;
                    if self.queues[qi].down {
                        continue;
                    }
                    match self.poll_queue(qi, phase, now) {
                        Ok(k) => done += k,
                        Err(e) if self.multipath => self.fail_path(qi, e)?,
                        Err(e) => return Err(e),
                    }
                }
                if issuing {
                    self.top_up(g, phase)?;
                } else if self.multipath {
                    // Winding down: I/Os moved off a failed path still go out.
                    self.resend_moved(g)?;
                }
                inflight += self.groups[g].inflight;
            }
            if done > 0 && self.measuring {
                self.progress.fetch_add(done, Ordering::Relaxed);
            }
            // Idle backoff: a worker sharing its CPU (tenants pinned
            // together, as bench/fairness.sh does) would otherwise spin
            // through its whole time slice while the other's completions
            // wait, and both would measure the scheduler's slices as I/O
            // latency. Only after a while without a completion, so a fast
            // target (tens of µs per round trip) never pays for the yield.
            match (done, idle_since) {
                (0, None) => idle_since = Some(now),
                (0, Some(t)) if now.saturating_duration_since(t) >= IDLE_BEFORE_YIELD => {
                    idle_since = None;
                    std::thread::yield_now();
                }
                (0, Some(_)) => {}
                _ => idle_since = None,
            }
            if !issuing && inflight == 0 {
                return Ok(());
            }
        }
    }

    /// Polls one queue and handles its completions. Returns how many completed.
    fn poll_queue(&mut self, qi: usize, phase: Phase, now: Instant) -> Result<u64, String> {
        let pending = self.queues[qi].q.poll(now).map_err(|e| e.to_string())?;
        if pending == 0 {
            return Ok(0);
        }
        // Stamp completions after the recv that delivered them: `now` was
        // taken before this poll's flush, so using it would under-report
        // latency by a whole sendmsg + recv (one clock read per batch).
        let done_at = Instant::now();
        if let Some(c) = self.queues[qi].q.engine().io_credits() {
            self.res.io_credits_min = Some(self.res.io_credits_min.map_or(c, |m| m.min(c)));
        }
        let mut n = 0;
        while let Some(c) = self.queues[qi].q.next_completion() {
            n += self.complete(qi, c, phase, done_at) as u64;
        }
        Ok(n)
    }

    /// Handles one command's completion; true when it finished an I/O (a
    /// replicated write finishes with its last part).
    fn complete(&mut self, qi: usize, c: Completion, phase: Phase, now: Instant) -> bool {
        let qc = &mut self.queues[qi];
        let io = qc.ios[c.slot as usize];
        qc.inflight -= 1;
        qc.busy[c.slot as usize] = false;
        if let Some(ps) = self.pathset.as_mut() {
            let rtt = now.saturating_duration_since(io.sent).as_nanos() as u64;
            let read_len = (io.op == Op::Read).then_some(io.nlb * self.block_size);
            let t = ns_since(self.t_start);
            ps.on_completion(qi / self.groups.len(), read_len, io.grant, rtt, t);
            if let Some(state) = ana_state_of(c.status) {
                return self.move_off_path(qi, c.slot, io, state);
            }
        }
        let part_ok = c.status.is_success();
        if !part_ok {
            self.res.errors += 1;
            self.res.first_error.get_or_insert_with(|| {
                format!(
                    "{:?} of {} blocks at LBA {}: {}",
                    io.op, io.nlb, io.lba, c.status
                )
            });
        }
        let Some(ok) = self.finish_part(&io, part_ok) else {
            self.queues[qi].q.free(c.slot);
            return false;
        };
        let g = qi % self.groups.len();
        self.groups[g].inflight -= 1;
        if self.job.verify {
            self.settle_verify(qi, c.slot, &io, ok);
        }
        if ok && self.measuring && phase == Phase::Main {
            let ns = now.saturating_duration_since(io.t0).as_nanos() as u64;
            let bytes = io.nlb as u64 * self.block_size as u64;
            match io.op {
                Op::Read => {
                    self.res.read_hist.saturating_record(ns.max(100));
                    self.res.read_bytes += bytes;
                }
                Op::Write => {
                    self.res.write_hist.saturating_record(ns.max(100));
                    self.res.write_bytes += bytes;
                }
            }
        }
        self.queues[qi].q.free(c.slot);
        true
    }

    /// A command of `io` completed: its I/O's outcome, or None while parts of
    /// a replicated write are still out (it fails if any part failed).
    fn finish_part(&mut self, io: &Io, ok: bool) -> Option<bool> {
        if io.write == NO_WRITE {
            return Some(ok);
        }
        let w = &mut self.writes[io.write as usize];
        w.parts_left -= 1;
        w.ok &= ok;
        if w.parts_left > 0 {
            return None;
        }
        let all_ok = w.ok;
        self.free_writes.push(io.write);
        Some(all_ok)
    }

    /// After an I/O: check read blocks, commit or poison written ones, and
    /// release the in-flight marks.
    fn settle_verify(&mut self, qi: usize, slot: u16, io: &Io, ok: bool) {
        let bsz = self.block_size as usize;
        for i in 0..io.nlb as u64 {
            let idx = (io.lba + i - self.first_lba) as usize;
            let gen = self.gens[idx] & !BUSY;
            self.gens[idx] = match (io.op, ok) {
                (Op::Write, false) => UNKNOWN,
                _ => gen,
            };
            if io.op != Op::Read || !ok || gen == 0 || gen == UNKNOWN {
                continue;
            }
            let b = &self.queues[qi].q.buf(slot)[i as usize * bsz..][..bsz];
            self.res.verified_blocks += 1;
            if let Err(f) = check_block(b, io.lba + i, gen, self.seed) {
                self.res.verify_failures += 1;
                if self.res.verify_samples.len() < MAX_FAILURE_SAMPLES {
                    self.res.verify_samples.push(f);
                }
            }
        }
    }
}

/// Pins the calling thread to `cpu` (best effort: a CPU outside the
/// process's affinity mask leaves the thread where it was).
pub fn pin_current_thread(cpu: usize) {
    let _ = core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
}
