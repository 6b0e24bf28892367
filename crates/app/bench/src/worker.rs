//! One bench worker: a reactor thread that owns its queue pairs and drives
//! them run-to-completion. Each loop iteration polls every queue (one
//! gathered sendmsg + one recv each), completes what arrived, and immediately
//! refills the queue, so all new commands of an iteration leave together in
//! the next flush. Nothing on this path allocates: per-slot I/O contexts and
//! data buffers are set up before the first command.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use trellis_host::engine::rw_sqe;
use trellis_host::{Completion, Queue, Xfer};
use trellis_nvme::sqe::io;

use crate::job::{JobSpec, ReplicaRead, MAX_REPLICAS};
use crate::verify::{check_block, fill_block, VerifyFailure};
use trellis_nvme::ana::AnaState;
use trellis_path::multipath::{PathPolicy, PathSet};
use trellis_path::replica::{ReadPolicy, ReplicaChooser, ReplicaState};

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
/// Latency histogram range: 100 ns .. 60 s, 3 significant digits.
const HIST_MAX_NS: u64 = 60_000_000_000;

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

pub struct WorkerResult {
    pub read_hist: Histogram<u64>,
    pub write_hist: Histogram<u64>,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// The worker stopped early because a queue failed.
    pub fatal: bool,
    pub verify_failures: u64,
    pub verify_samples: Vec<VerifyFailure>,
    pub verified_blocks: u64,
    pub measured: Duration,
    pub polls: u64,
    pub idle_polls: u64,
    /// Times a queue below its depth held back because the target's I/O
    /// credits were all in use (`--credits`; "device busy", Algorithm 3).
    pub credit_busy: u64,
    /// The smallest and latest credit a queue of this worker was granted.
    pub io_credits_min: Option<u32>,
    pub io_credits_last: Option<u32>,
    /// Reads sent to each replica (one entry without replicas).
    pub replica_reads: Vec<u64>,
    /// The latest I/O credits each replica granted (None: it sent none).
    pub replica_credits_last: Vec<Option<u32>>,
    /// Multipath: paths that failed, commands re-sent, the first failure,
    /// and which paths (0-based) failed.
    pub path_failures: u64,
    pub path_retries: u64,
    /// `--path-rate`: reads that found no path with room (per try).
    pub reserve_waits: u64,
    /// Multipath: commands a path refused with an ANA status (inaccessible,
    /// persistent loss, transition) and that moved to another path.
    pub ana_moves: u64,
    pub first_path_error: Option<String>,
    pub failed_paths: Vec<u32>,
    /// Paths (0-based) re-opened and put back in use, once per re-open.
    pub path_reconnects: Vec<u32>,
    /// Per path: commands sent on it since its last re-open (all of them
    /// when it never failed).
    pub path_ios_since_reopen: Vec<u64>,
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

/// The ANA state a path-related completion status implies (SCT 3h), None for
/// any other status.
fn ana_state_of(st: trellis_nvme::Status) -> Option<AnaState> {
    use trellis_nvme::status::path;
    [
        (path::ANA_INACCESSIBLE, AnaState::Inaccessible),
        (path::ANA_PERSISTENT_LOSS, AnaState::PersistentLoss),
        (path::ANA_TRANSITION, AnaState::Change),
    ]
    .into_iter()
    .find(|(p, _)| (p.sct(), p.sc()) == (st.sct(), st.sc()))
    .map(|(_, a)| a)
}

/// A multipath volume's paths, as `--path-policy` and `--path-rate` say.
fn path_set(job: &JobSpec, paths: usize) -> PathSet {
    let policy = match job.replica_read {
        ReplicaRead::Isr => PathPolicy::Isr,
        ReplicaRead::QueueDepth => PathPolicy::QueueDepth,
        ReplicaRead::RoundRobin | ReplicaRead::Headroom => PathPolicy::RoundRobin,
    };
    let rate = (job.path_rate_bytes_per_s > 0).then_some(job.path_rate_bytes_per_s);
    PathSet::new(paths.min(trellis_path::replica::MAX_PATHS), policy, rate)
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

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(100, HIST_MAX_NS, 3).expect("valid histogram bounds")
}

pub fn empty_result() -> WorkerResult {
    WorkerResult {
        read_hist: hist(),
        write_hist: hist(),
        read_bytes: 0,
        write_bytes: 0,
        errors: 0,
        first_error: None,
        fatal: false,
        verify_failures: 0,
        verify_samples: Vec::new(),
        verified_blocks: 0,
        measured: Duration::ZERO,
        polls: 0,
        idle_polls: 0,
        credit_busy: 0,
        io_credits_min: None,
        io_credits_last: None,
        replica_reads: Vec::new(),
        replica_credits_last: Vec::new(),
        path_failures: 0,
        path_retries: 0,
        reserve_waits: 0,
        ana_moves: 0,
        first_path_error: None,
        failed_paths: Vec::new(),
        path_reconnects: Vec::new(),
        path_ios_since_reopen: Vec::new(),
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
        let groups: Vec<Group> = queues[..queues.len() / replicas]
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
            .collect();
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
            paths: p
                .reconnect
                .into_iter()
                .map(|connector| PathState {
                    down: connector.down_at_start,
                    connector,
                    ctrl: None,
                    backoff: RECONNECT_BACKOFF_MIN,
                    next_try: Instant::now(),
                    pending: None,
                    last_tick: Instant::now(),
                    ios_since_reopen: 0,
                })
                .collect(),
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

    /// A multipath command ended with a path-related status (NVMe Base 2.0
    /// §8.1.1: the namespace is not accessible through this controller now):
    /// the path takes the ANA state the status implies, and the command goes
    /// to another path, as Linux's `nvme_failover_req` does. Not an error: no
    /// data moved, and another path may serve it.
    fn move_off_path(&mut self, qi: usize, slot: u16, io: Io, state: AnaState) -> bool {
        let n = self.groups.len();
        if let Some(ps) = self.pathset.as_mut() {
            ps.set_ana(qi / n, state);
        }
        self.queues[qi].q.free(slot);
        self.retry.push((qi % n, Io { grant: 0, ..io }));
        self.res.ana_moves += 1;
        false
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

    fn rate_allows(&self, bytes: u64) -> bool {
        if self.rate_iops == 0.0 && self.rate_bytes == 0.0 {
            return true;
        }
        let t = self.rate_start.elapsed().as_secs_f64();
        (self.rate_iops == 0.0 || (self.issued_ios as f64) < self.rate_iops * t + 1.0)
            && (self.rate_bytes == 0.0
                || (self.issued_bytes as f64) < self.rate_bytes * t + bytes as f64)
    }

    /// Fills group `g` up to its depth.
    fn top_up(&mut self, g: usize, phase: Phase) -> Result<(), String> {
        if self.replicas > 1 {
            return self.top_up_replicated(g, phase);
        }
        let t0 = Instant::now();
        while self.groups[g].inflight < self.groups[g].depth {
            if !self.queues[g].q.engine().may_submit() {
                // Busy: retried after this queue's next completion.
                self.res.credit_busy += 1;
                return Ok(());
            }
            // Ask the limiter before picking, so a refused I/O reserves nothing.
            if phase == Phase::Main && !self.rate_allows(self.job.min_bs() as u64) {
                return Ok(());
            }
            let Some((op, lba, nlb)) = self.next_io(phase) else {
                return Ok(());
            };
            let io = Io {
                op,
                lba,
                nlb,
                t0,
                sent: t0,
                write: NO_WRITE,
                grant: 0,
            };
            self.issue(g, io)?;
            self.count_issued(g, nlb);
        }
        Ok(())
    }

    fn count_issued(&mut self, g: usize, nlb: u32) {
        self.groups[g].inflight += 1;
        self.issued_ios += 1;
        self.issued_bytes += nlb as u64 * self.block_size as u64;
    }

    /// A replicated group: a read goes to the replica `pick_replica` chooses,
    /// a write to every replica once each can take it. The operation is drawn
    /// before knowing whether a replica can take it, and kept until one can,
    /// so busy replicas do not bend the read/write mix.
    fn top_up_replicated(&mut self, g: usize, phase: Phase) -> Result<(), String> {
        let t0 = Instant::now();
        let n = self.groups.len();
        if self.multipath && !self.resend_moved(g)? {
            return Ok(());
        }
        while self.groups[g].inflight < self.groups[g].depth {
            if phase == Phase::Main && !self.rate_allows(self.job.min_bs() as u64) {
                return Ok(());
            }
            let (op, nlb, drawn) = match self.groups[g].next_op.take() {
                Some(held) => held,
                None => {
                    let op = self.phase_op(phase);
                    (op, self.draw_nlb(phase), t0)
                }
            };
            let target = match op {
                Op::Read => self.pick_replica(g, op, nlb),
                Op::Write if self.multipath => self.pick_replica(g, op, nlb),
                Op::Write => (0..self.replicas)
                    .all(|r| self.queues[r * n + g].q.engine().may_submit())
                    .then_some(g),
            };
            let Some(qi) = target else {
                self.groups[g].next_op = Some((op, nlb, drawn));
                self.res.credit_busy += 1;
                return Ok(());
            };
            let Some((op, lba, nlb)) = self.next_io_sized(phase, op, nlb) else {
                return Ok(());
            };
            let mut io = Io {
                op,
                lba,
                nlb,
                t0: drawn,
                sent: t0,
                write: NO_WRITE,
                grant: 0,
            };
            if op == Op::Read || self.multipath {
                self.res.replica_reads[qi / n] += 1;
                if let Some(p) = self.paths.get_mut(qi / n) {
                    p.ios_since_reopen += 1;
                }
                io.grant = self.reserve_for(qi / n, &io);
                self.issue(qi, io)?;
            } else {
                let id = self
                    .free_writes
                    .pop()
                    .ok_or("no free replicated-write entry below the depth")?;
                self.writes[id as usize] = ReplicatedWrite {
                    parts_left: self.replicas as u32,
                    ok: true,
                };
                io.write = id;
                for r in 0..self.replicas {
                    self.issue(r * n + g, io)?;
                }
            }
            self.count_issued(g, nlb);
        }
        Ok(())
    }

    /// The queue (of group `g`) a read goes to, None when no replica may take
    /// one now: the group's `ReplicaChooser` (trellis_path::replica) decides
    /// from each replica's credits, depth and commands in flight.
    fn pick_replica(&mut self, g: usize, op: Op, nlb: u32) -> Option<usize> {
        let n = self.groups.len();
        let mut states = [ReplicaState {
            may_submit: false,
            credit_limit: None,
            depth: 0,
            inflight: 0,
        }; MAX_REPLICAS];
        for (r, s) in states.iter_mut().enumerate().take(self.replicas) {
            let qc = &self.queues[r * n + g];
            let e = qc.q.engine();
            *s = ReplicaState {
                may_submit: !qc.down && e.may_submit(),
                credit_limit: e.credit_limit(),
                depth: qc.depth,
                inflight: qc.inflight,
            };
        }
        let read_len = (op == Op::Read).then_some(nlb * self.block_size);
        let now = ns_since(self.t_start);
        let r = match self.pathset.as_mut() {
            Some(ps) => ps.choose(&states[..self.replicas], read_len, now),
            None => self.groups[g].chooser.choose(&states[..self.replicas]),
        }?;
        Some(r * n + g)
    }

    /// Multipath: reserves a read's response rate on `path` (`--path-rate`;
    /// 0 otherwise). `pick_replica` checked that it fits.
    fn reserve_for(&mut self, path: usize, io: &Io) -> u64 {
        let read_len = (io.op == Op::Read).then_some(io.nlb * self.block_size);
        self.pathset
            .as_mut()
            .map_or(0, |ps| ps.reserve(path, read_len))
    }

    /// Path `qi` of a multipath volume failed (`why`): it is never used
    /// again, and its commands in flight wait in `retry` for a live path of
    /// their group. Re-sending is safe: a read has no effect, and a write's
    /// blocks stay reserved while it is out (no other command touches them),
    /// so writing the same data again leaves what a completed first attempt
    /// would have. Err only when no path of the group is left.
    fn fail_path(&mut self, qi: usize, why: String) -> Result<(), String> {
        let n = self.groups.len();
        let path = qi / n;
        // The path goes down as a whole: its other queues share its link.
        let mut moved = 0;
        for g in 0..n {
            let qc = &mut self.queues[path * n + g];
            // Reset the connection, dropping what the kernel has not sent:
            // a write re-sent below must not be overtaken later by its stale
            // original once the link is back.
            if !qc.down {
                qc.q.abort();
            }
            qc.down = true;
            for (slot, busy) in qc.busy.iter_mut().enumerate() {
                if std::mem::take(busy) {
                    // Its grant dies with the path; it reserves again where it goes.
                    self.retry.push((
                        g,
                        Io {
                            grant: 0,
                            ..qc.ios[slot]
                        },
                    ));
                    moved += 1;
                }
            }
            qc.inflight = 0;
        }
        if let Some(ps) = self.pathset.as_mut() {
            ps.set_down(path, true);
        }
        self.res.path_failures += 1;
        self.res.first_path_error.get_or_insert_with(|| {
            format!("path {} failed: {why}; {moved} commands moved", path + 1)
        });
        if !self.res.failed_paths.contains(&(path as u32)) {
            self.res.failed_paths.push(path as u32);
        }
        if let Some(p) = self.paths.get_mut(path) {
            p.down = true;
            p.ctrl = None;
            p.backoff = RECONNECT_BACKOFF_MIN;
            p.next_try = Instant::now() + RECONNECT_BACKOFF_MIN;
        }
        let live = (0..self.replicas).any(|r| !self.queues[r * n].down);
        if !live {
            return Err(format!("every path failed; the last: {why}"));
        }
        Ok(())
    }

    /// Paths that were down when the run started: their place-holder queues
    /// are never polled, and `tend_paths` opens them as soon as it can.
    fn mark_down_at_start(&mut self) {
        let n = self.groups.len();
        for r in 0..self.paths.len() {
            if self.paths[r].down {
                for g in 0..n {
                    self.queues[r * n + g].down = true;
                }
                if let Some(ps) = self.pathset.as_mut() {
                    ps.set_down(r, true);
                }
                if !self.res.failed_paths.contains(&(r as u32)) {
                    self.res.failed_paths.push(r as u32);
                }
            }
        }
    }

    /// Re-opens failed paths in the background (backoff from
    /// RECONNECT_BACKOFF_MIN doubling to RECONNECT_BACKOFF_MAX), puts a
    /// re-opened path back in use, and lets re-opened controllers send their
    /// Keep Alives. A Keep Alive failure takes the path down again.
    fn tend_paths(&mut self, now: Instant) -> Result<(), String> {
        self.sync_ana();
        let n = self.groups.len();
        for r in 0..self.paths.len() {
            let p = &mut self.paths[r];
            if !p.down {
                if now.saturating_duration_since(p.last_tick) >= PATH_TICK {
                    p.last_tick = now;
                    if let Some(Err(e)) = p.ctrl.as_mut().map(|c| c.tick()) {
                        self.fail_path(r * n, format!("keep alive: {e}"))?;
                    }
                }
                continue;
            }
            if let Some(rx) = &p.pending {
                match rx.try_recv() {
                    Err(std::sync::mpsc::TryRecvError::Empty) => continue,
                    Ok(Ok((ctrl, qs, ana))) if qs.len() == n => {
                        if let (Some(ps), Some(a)) = (self.pathset.as_mut(), ana) {
                            ps.set_ana(r, a);
                        }
                        p.pending = None;
                        p.down = false;
                        p.ctrl = Some(ctrl);
                        p.last_tick = now;
                        for (g, (q, depth)) in qs.into_iter().enumerate() {
                            self.queues[r * n + g] = QueueCtx::new(q, depth);
                        }
                        p.ios_since_reopen = 0;
                        if let Some(ps) = self.pathset.as_mut() {
                            ps.set_down(r, false);
                        }
                        self.res.path_reconnects.push(r as u32);
                        continue;
                    }
                    _ => {
                        // Failed (or the helper died): wait longer.
                        p.pending = None;
                        p.backoff = (p.backoff * 2).min(RECONNECT_BACKOFF_MAX);
                        p.next_try = now + p.backoff;
                        continue;
                    }
                }
            }
            if now >= p.next_try {
                let (tx, rx) = std::sync::mpsc::channel();
                let c = p.connector.clone();
                std::thread::spawn(move || {
                    let _ = tx.send(c.connect());
                });
                p.pending = Some(rx);
            }
        }
        Ok(())
    }

    /// Applies the main thread's latest reading of the paths' ANA states
    /// (known ones only: a path whose controller the main thread lost keeps
    /// the state this worker saw when it re-opened it).
    fn sync_ana(&mut self) {
        let (Some(board), Some(ps)) = (self.ana.as_ref(), self.pathset.as_mut()) else {
            return;
        };
        let seq = board.seq();
        if seq == self.ana_seq {
            return;
        }
        self.ana_seq = seq;
        for p in 0..board.paths().min(ps.paths()) {
            if let Some(a) = board.state(p) {
                ps.set_ana(p, a);
            }
        }
    }

    /// Re-sends the moved I/Os of group `g` on live paths; false while some
    /// still wait (then nothing new is issued before them).
    fn resend_moved(&mut self, g: usize) -> Result<bool, String> {
        let mut k = 0;
        let now = Instant::now();
        while k < self.retry.len() {
            if self.retry[k].0 != g {
                k += 1;
                continue;
            }
            let (op, nlb) = (self.retry[k].1.op, self.retry[k].1.nlb);
            let Some(qi) = self.pick_replica(g, op, nlb) else {
                return Ok(false);
            };
            let (_, mut io) = self.retry.swap_remove(k);
            self.res.path_retries += 1;
            io.sent = now;
            io.grant = self.reserve_for(qi / self.groups.len(), &io);
            self.issue(qi, io)?;
        }
        Ok(true)
    }

    fn issue(&mut self, qi: usize, io: Io) -> Result<(), String> {
        let bsz = self.block_size as usize;
        let seed = self.seed;
        let verify = self.job.verify;
        let qc = &mut self.queues[qi];
        let slot = qc.q.alloc().ok_or("no free slot below queue depth")?;
        let len = io.nlb * self.block_size;
        let (opc, x) = match io.op {
            Op::Read => (io::READ, Xfer::FromCtrl(len)),
            Op::Write => (io::WRITE, Xfer::ToCtrl(len)),
        };
        if verify && io.op == Op::Write {
            let buf = qc.q.buf_mut(slot);
            for i in 0..io.nlb as u64 {
                let idx = (io.lba + i - self.first_lba) as usize;
                let gen = self.gens[idx] & !BUSY;
                fill_block(&mut buf[i as usize * bsz..][..bsz], io.lba + i, gen, seed);
            }
        }
        qc.ios[slot as usize] = io;
        qc.busy[slot as usize] = true;
        qc.inflight += 1;
        qc.q.submit(slot, rw_sqe(opc, self.job.nsid, io.lba, io.nlb), x, io.sent)
            .map_err(|e| e.to_string())
    }

    /// Picks the next I/O and, with verify, reserves its blocks (marks them
    /// busy; writes also take their new generation). None when nothing can be
    /// issued now.
    fn next_io(&mut self, phase: Phase) -> Option<(Op, u64, u32)> {
        let op = self.phase_op(phase);
        self.next_io_as(phase, op)
    }

    fn phase_op(&mut self, phase: Phase) -> Op {
        match phase {
            Phase::Prefill => Op::Write,
            Phase::Readback => Op::Read,
            Phase::Main => self.pick_op(),
        }
    }

    /// `next_io` with the operation already drawn.
    fn next_io_as(&mut self, phase: Phase, op: Op) -> Option<(Op, u64, u32)> {
        let nlb = self.draw_nlb(phase);
        self.next_io_sized(phase, op, nlb)
    }

    /// The blocks of the next I/O of `phase`.
    fn draw_nlb(&mut self, phase: Phase) -> u32 {
        let nlb = match phase {
            Phase::Main => self.pick_nlb(),
            _ => self.chunk_blocks(),
        };
        nlb.min(self.nblocks as u32)
    }

    /// `next_io` with the operation and its size already drawn.
    fn next_io_sized(&mut self, phase: Phase, op: Op, nlb: u32) -> Option<(Op, u64, u32)> {
        let tries = if self.job.verify { 8 } else { 1 };
        for _ in 0..tries {
            let off = self.pick_offset(phase, nlb)?;
            if self.reserve(op, off, nlb) {
                return Some((op, self.first_lba + off, nlb));
            }
        }
        None
    }

    fn chunk_blocks(&self) -> u32 {
        let max = self.job.max_bs() / self.block_size;
        max.min((self.nblocks - self.cursor.min(self.nblocks)).max(1) as u32)
    }

    fn pick_op(&mut self) -> Op {
        match self.job.read_pct {
            100 => Op::Read,
            0 => Op::Write,
            p => {
                if self.rng.gen_range(0..100) < p {
                    Op::Read
                } else {
                    Op::Write
                }
            }
        }
    }

    fn pick_nlb(&mut self) -> u32 {
        let sizes = &self.job.sizes;
        if sizes.len() == 1 {
            return sizes[0].0 / self.block_size;
        }
        let mut r = self.rng.gen_range(0..100);
        for &(b, w) in sizes {
            if r < w {
                return b / self.block_size;
            }
            r -= w;
        }
        sizes[0].0 / self.block_size
    }

    /// Block offset within this worker's range.
    fn pick_offset(&mut self, phase: Phase, nlb: u32) -> Option<u64> {
        let span = self.nblocks.checked_sub(nlb as u64)? + 1;
        if phase == Phase::Main && self.job.random {
            let slots = span.div_ceil(self.align_blocks);
            let off = self.rng.gen_range(0..slots) * self.align_blocks;
            return Some(off.min(span - 1));
        }
        if phase != Phase::Main && self.cursor >= self.nblocks {
            return None;
        }
        let mut off = self.cursor;
        if off + nlb as u64 > self.nblocks {
            off = 0; // wrap (main phase) — prefill/readback chunks never cross the end
        }
        self.cursor = off + nlb as u64;
        Some(off)
    }

    fn reserve(&mut self, op: Op, off: u64, nlb: u32) -> bool {
        if !self.job.verify {
            return true;
        }
        let r = off as usize..off as usize + nlb as usize;
        if self.gens[r.clone()].iter().any(|g| g & BUSY != 0) {
            return false;
        }
        for g in &mut self.gens[r] {
            *g = match op {
                Op::Read => *g | BUSY,
                Op::Write if *g == UNKNOWN => 1 | BUSY,
                Op::Write => (*g + 1).min(UNKNOWN - 1) | BUSY,
            };
        }
        true
    }
}

/// Pins the calling thread to `cpu` (best effort: a CPU outside the
/// process's affinity mask leaves the thread where it was).
pub fn pin_current_thread(cpu: usize) {
    let _ = core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
}
