//! Emulated SSD backend: data in RAM (the ram backend's mapping), each read
//! or write completed on the wall clock when the SSD timing model
//! (`trellis-ssd`) says a real drive would.
//!
//! - Clock: the reactor clock [`crate::sys::now_ns`], read at submit
//!   and at reap. No thread sleeps: `submit` computes the due time and parks
//!   the command in a per-queue min-heap; `reap`, which the reactor calls
//!   every loop (and busy-polls while anything is in flight), returns those
//!   due.
//! - One drive per namespace: the model's state (LUN and channel busy time,
//!   FTL, write buffer) is shared by every reactor's queue of the namespace
//!   behind one `Mutex`, taken once per read/write for the model call only.
//!   Uncontended it costs tens of ns against a device time of tens of µs;
//!   see docs/ssd-model.md.
//! - `time_scale`: the model runs in dilated time. Its clock is wall / scale
//!   and each delay it returns is multiplied by scale, which is exactly a
//!   drive whose every time (NAND, firmware, transfers) is scale× longer.
//! - Data: writes are copied into RAM at submit (the modelled drive buffers
//!   them at once too); reads are copied out at completion, so a read
//!   returns what the medium holds when the drive would have returned it.

use super::{Backend, BackendQueue, Completion, IoReq, Op, Tag};
pub use crate::config::emulated::{
    EmulatedParams, DEFAULT_PROFILE, FRAGMENTED_OVERWRITE_PERMILLE, MAX_TIME_SCALE,
};
use crate::sys::latency::LAT_BUCKETS;
use hdrhistogram::Histogram;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use trellis_nvme::status::generic;
use trellis_nvme::Status;
use trellis_ssd::fault::FaultPlan;
use trellis_ssd::Ssd;
use trellis_units::IoDir;

/// Seed of the fragmented precondition (a fixed seed: reproducible runs).
pub const PRECONDITION_SEED: u64 = 1;
/// Pending completions each queue pre-allocates room for. Past it the heap
/// grows (a rare doubling, logged once), never per I/O.
pub const QUEUE_PREALLOC: usize = 4096;
/// Above this lateness p99 the shutdown log warns: completions did not follow
/// the model closely (the bound for a target that is not CPU-bound, 20 µs).
/// The warning names the two causes, told apart by the reactor's busy %.
pub const CPU_BOUND_LATENESS_P99_NS: u64 = 20_000;
/// Highest lateness the histograms track (larger values are clamped).
const LATENESS_MAX_NS: u64 = 60_000_000_000;

/// Lateness of completions vs model time, over the queues closed so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Lateness {
    pub completions: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Lateness {
    fn of(h: &Histogram<u64>) -> Lateness {
        let us = |ns: u64| ns as f64 / 1000.0;
        Lateness {
            completions: h.len(),
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            max_us: us(h.max()),
        }
    }
}

/// The model of one drive and its clock state.
struct Model {
    ssd: Ssd,
    /// Latest model time handed to the model: reactors read the clock
    /// before taking the lock, so a later holder may carry an earlier time,
    /// and the model refuses time going backwards.
    last_ns: u64,
}

/// What every queue of the namespace shares.
struct Drive {
    model: Mutex<Model>,
    scale: f64,
    name: String,
    /// Lateness of the queues already closed (merged in their Drop).
    lateness: Mutex<Histogram<u64>>,
    /// The injected failure, on the age clock ([`Drive::age_ns`]).
    fault: Option<FaultPlan>,
    /// Drive age per wall ns, and the wall time of age 0 (the backend's start).
    age_acceleration: f64,
    born_ns: u64,
    /// The fault made the drive stop answering (it never comes back).
    silent: AtomicBool,
    /// Reads by their service time on the drive (submit to model
    /// completion), in `stats::lat_bucket`s: what the drive's own latency
    /// log would say, without the target's queueing.
    read_lat: [AtomicU64; LAT_BUCKETS],
}

/// Due time of a command a silent drive never completes (until shutdown
/// drains the queue).
const NEVER_NS: u64 = u64::MAX;

impl Drive {
    /// Runs one read or write through the model at the current wall time;
    /// returns its wall-clock due time in ns and, when the worn drive
    /// fails it, the status it completes with: an uncorrectable read
    /// (Unrecovered Read Error, retryable: a read retry may succeed), a
    /// write to a drive out of spares (Namespace is Write Protected, DNR).
    fn schedule(&self, dir: IoDir, offset: u64, len: u32) -> (u64, Option<Status>) {
        let wall = crate::sys::now_ns();
        let mut m = self.model.lock().unwrap_or_else(PoisonError::into_inner);
        let mut stretch = 1.0;
        if let Some(f) = &self.fault {
            let e = f.effect(&m.ssd.profile().wear, self.age_ns(wall));
            m.ssd.set_rber_floor(e.rber_floor);
            stretch = e.latency_factor;
        }
        let model_now = ((wall as f64 / self.scale) as u64).max(m.last_ns);
        m.last_ns = model_now;
        let c = m.ssd.submit_checked(dir, offset, len, model_now);
        drop(m);
        let failed = if c.media_error {
            Some(trellis_nvme::status::media::UNRECOVERED_READ_ERROR)
        } else if c.read_only {
            Some(generic::NS_WRITE_PROTECTED.dnr())
        } else {
            None
        };
        let service_ns = (c.done_ns.saturating_sub(model_now) as f64 * self.scale * stretch) as u64;
        if dir == IoDir::Read {
            self.read_lat[crate::sys::latency::lat_bucket(service_ns)].fetch_add(1, Relaxed);
        }
        (wall + service_ns, failed)
    }

    /// The drive's age at wall time `wall_ns` (its life runs
    /// `age_acceleration` times faster).
    fn age_ns(&self, wall_ns: u64) -> u64 {
        let a = wall_ns.saturating_sub(self.born_ns) as f64 * self.age_acceleration;
        a.min(u64::MAX as f64) as u64
    }

    /// Whether the injected fault has made the drive stop answering by
    /// `wall_ns`; latched, so the check is one relaxed load afterwards.
    fn stopped_answering(&self, wall_ns: u64) -> bool {
        if self.silent.load(Relaxed) {
            return true;
        }
        let Some(f) = &self.fault else {
            return false;
        };
        if self.age_ns(wall_ns) < f.fails_at_ns() {
            return false;
        }
        if !self.silent.swap(true, Relaxed) {
            tracing::warn!(
                "emulated {}: the injected {:?} fault stops the drive answering (age {:.1} days)",
                self.name,
                f.kind,
                self.age_ns(wall_ns) as f64 / 86_400e9
            );
        }
        true
    }

    /// Whether the worn drive refuses every change of data.
    fn read_only(&self) -> bool {
        self.model
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .ssd
            .read_only()
    }

    /// The model's wear as a SMART page (no temperature: it has no
    /// thermal model, so the node's reading stands).
    fn smart(&self) -> trellis_nvme::log::Smart {
        let h = self
            .model
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .ssd
            .health();
        trellis_nvme::log::Smart {
            critical_warning: h.critical_warning,
            available_spare_pct: h.available_spare_pct,
            percent_used: h.percentage_used,
            media_errors: u128::from(h.media_errors),
            ..Default::default()
        }
    }

    fn lateness(&self) -> Lateness {
        Lateness::of(&self.lateness.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Drop for Drive {
    /// Shutdown report: the last queue and the backend are gone.
    fn drop(&mut self) {
        let l = self.lateness();
        if l.completions == 0 {
            return;
        }
        tracing::info!(
            "emulated {}: {} completions, lateness vs model time p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
            self.name,
            l.completions,
            l.p50_us,
            l.p99_us,
            l.max_us
        );
        if l.p99_us * 1000.0 > CPU_BOUND_LATENESS_P99_NS as f64 {
            tracing::warn!(
                "emulated {}: completions ran late (lateness p99 {:.1} µs > {} µs): the reactor noticed them late. With the reactor's busy % (its own line) near 100 %, the target CPU, not the drive, set those times: raise time_scale (now {}) or lower the load; at a low busy % the delay is other work on the reactor's CPU (its line counts the preemptions), its long loops (sends) and host stalls (docs/ssd-model.md, Lateness)",
                self.name,
                l.p99_us,
                CPU_BOUND_LATENESS_P99_NS / 1000,
                self.scale
            );
        }
    }
}

pub struct EmulatedBackend {
    ram: super::ram::RamBackend,
    drive: Arc<Drive>,
    /// The model's capacities, measured on first use ([`Backend::device_model`]).
    calibration: std::sync::OnceLock<trellis_ssd::Calibration>,
}

impl EmulatedBackend {
    /// Builds the model and brings it to its precondition (a sequential
    /// fill; when fragmented, random overwrites on the model clock whose GC
    /// debt carries into the run: docs/ssd-model.md). The run starts at the
    /// model moment those writes are on flash; computing them takes a few
    /// seconds of startup for a fragmented pm9a3-gen4.
    pub fn new(size_bytes: u64, p: EmulatedParams) -> anyhow::Result<EmulatedBackend> {
        let ram = match &p.path {
            Some(path) => super::ram::RamBackend::shared_file(path, size_bytes)?,
            None => super::ram::RamBackend::new(size_bytes)?,
        };
        let t0 = std::time::Instant::now();
        let name = p.profile.name.clone();
        let mut ssd = Ssd::new(p.profile);
        ssd.precondition(p.precondition, PRECONDITION_SEED);
        tracing::info!(
            "emulated {name}: {:?} precondition in {:?}, time_scale {}",
            p.precondition,
            t0.elapsed(),
            p.time_scale
        );
        let lateness = Histogram::new_with_bounds(1, LATENESS_MAX_NS, 3)?;
        Ok(EmulatedBackend {
            ram,
            drive: Arc::new(Drive {
                model: Mutex::new(Model { ssd, last_ns: 0 }),
                scale: p.time_scale,
                name,
                lateness: Mutex::new(lateness),
                fault: p.fault,
                age_acceleration: p.age_acceleration,
                born_ns: crate::sys::now_ns(),
                silent: AtomicBool::new(false),
                read_lat: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
            calibration: std::sync::OnceLock::new(),
        })
    }

    /// Lateness over the queues closed so far (all of them after shutdown).
    pub fn lateness(&self) -> Lateness {
        self.drive.lateness()
    }
}

impl Backend for EmulatedBackend {
    fn size_bytes(&self) -> u64 {
        self.ram.size_bytes()
    }
    fn time_scale(&self) -> f64 {
        self.drive.scale
    }
    /// Measured on a clean copy of the model (`trellis_ssd::calibrate`), once.
    fn device_model(&self) -> Option<trellis_qos::DeviceModel> {
        Some(*self.calibration.get_or_init(|| {
            let m = self
                .drive
                .model
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            trellis_ssd::calibrate(m.ssd.profile())
        }))
    }
    fn open_queue(&self) -> anyhow::Result<Box<dyn BackendQueue>> {
        Ok(Box::new(EmulatedQueue {
            drive: self.drive.clone(),
            ram: self.ram.open_queue()?,
            size_bytes: self.ram.size_bytes(),
            pending: BinaryHeap::with_capacity(QUEUE_PREALLOC),
            seq: 0,
            draining: false,
            grew_logged: false,
            lateness: Histogram::new_with_bounds(1, LATENESS_MAX_NS, 3)?,
        }))
    }
    /// None once an injected fault silenced the drive: it answers no
    /// health poll either.
    fn drive_smart(&self) -> Option<trellis_nvme::log::Smart> {
        if self.drive.stopped_answering(crate::sys::now_ns()) {
            return None;
        }
        Some(self.drive.smart())
    }
    fn health_clock_ns(&self, now_ns: u64) -> u64 {
        self.drive.age_ns(now_ns)
    }
    fn drive_read_latency(&self) -> Option<[u64; LAT_BUCKETS]> {
        Some(std::array::from_fn(|i| {
            self.drive.read_lat[i].load(Relaxed)
        }))
    }
    fn drive_wear(&self) -> Option<super::DriveWear> {
        let m = self
            .drive
            .model
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (h, st) = (m.ssd.health(), m.ssd.stats());
        Some(super::DriveWear {
            read_retries: h.read_retries,
            uncorrectable_reads: h.media_errors,
            gc_runs: st.gc_runs,
            gc_pages_moved: st.gc_pages_moved,
            erases: st.erases,
            gc_foreground_stalls: st.gc_foreground_stalls,
            pe_cycles_avg: h.pe_cycles_avg,
            pe_cycles_max: h.pe_cycles_max,
            rated_pe_cycles: h.rated_pe_cycles,
            bad_blocks: h.bad_blocks,
            spare_blocks: h.spare_blocks,
        })
    }
    fn describe(&self) -> String {
        format!(
            "emulated {} ({} bytes, time_scale {})",
            self.drive.name,
            self.ram.size_bytes(),
            self.drive.scale
        )
    }
}

/// A command waiting for its model completion time.
struct Pending {
    due_ns: u64,
    /// Submission order: equal due times complete first in, first out.
    seq: u64,
    tag: Tag,
    /// A read's request, copied out at completion; None for a write.
    read: Option<IoReq>,
    /// The worn drive failed it (`Drive::schedule`): completes with this,
    /// nothing copied.
    failed: Option<Status>,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.due_ns, self.seq) == (o.due_ns, o.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due_ns, self.seq).cmp(&(o.due_ns, o.seq))
    }
}

struct EmulatedQueue {
    drive: Arc<Drive>,
    /// The ram backend's queue: does the data copies.
    ram: Box<dyn BackendQueue>,
    size_bytes: u64,
    pending: BinaryHeap<Reverse<Pending>>,
    seq: u64,
    /// Shutdown grace expired: complete everything now, ignoring model time.
    draining: bool,
    grew_logged: bool,
    lateness: Histogram<u64>,
}

impl EmulatedQueue {
    fn push(&mut self, due_ns: u64, tag: Tag, read: Option<IoReq>, failed: Option<Status>) {
        if self.pending.len() == self.pending.capacity() && !self.grew_logged {
            self.grew_logged = true;
            tracing::warn!(
                "emulated {}: more than {} commands in flight on one reactor; the completion heap grows",
                self.drive.name,
                self.pending.len()
            );
        }
        self.seq += 1;
        self.pending.push(Reverse(Pending {
            due_ns,
            seq: self.seq,
            tag,
            read,
            failed,
        }));
    }
}

impl BackendQueue for EmulatedQueue {
    /// Zeroing is done on the RAM: its bound.
    fn zero_chunk_bytes(&self) -> u64 {
        self.ram.zero_chunk_bytes()
    }
    unsafe fn submit(&mut self, req: &IoReq, tag: Tag) -> Option<Status> {
        if self.drive.stopped_answering(crate::sys::now_ns()) {
            // Nothing completes; shutdown's drain hands it back untouched.
            self.push(NEVER_NS, tag, None, Some(generic::ABORTED_SQ_DELETION));
            return None;
        }
        let dir = match req.op {
            Op::Read => IoDir::Read,
            Op::Write => IoDir::Write,
            // Flush, Write Zeroes and Deallocate are not in the model: they
            // complete at once on the RAM, except that a read-only drive
            // changes no data.
            Op::WriteZeroes | Op::Discard if self.drive.read_only() => {
                return Some(generic::NS_WRITE_PROTECTED.dnr())
            }
            // SAFETY: this function's own contract, passed on.
            Op::Flush | Op::WriteZeroes | Op::Discard => return self.ram.submit(req, tag),
        };
        // MDTS (at most 8 MiB) keeps transfers far below 4 GiB; the model
        // takes u32 lengths and refuses zero-length I/O.
        let Ok(len @ 1..) = u32::try_from(req.len_bytes) else {
            return Some(generic::INVALID_FIELD.dnr());
        };
        if req
            .offset_bytes
            .checked_add(req.len_bytes)
            .is_none_or(|e| e > self.size_bytes)
        {
            return Some(generic::LBA_OUT_OF_RANGE.dnr());
        }
        // The model first: a worn-out drive writes nothing.
        let (due, failed) = self.drive.schedule(dir, req.offset_bytes, len);
        let read = if dir == IoDir::Write {
            if failed.is_none() {
                // SAFETY: this function's contract covers req.buf; the ram
                // queue copies synchronously and keeps no pointer.
                match unsafe { self.ram.submit(req, tag) } {
                    Some(st) if st == Status::SUCCESS => {}
                    other => return other,
                }
            }
            None
        } else {
            Some(*req)
        };
        self.push(due, tag, read, failed);
        None
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        self.reap_due(out, None)
    }

    fn reap_timed(&mut self, out: &mut Vec<Completion>, due_ns: &mut Vec<u64>) -> usize {
        self.reap_due(out, Some(due_ns))
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// No kernel to cancel in: the pending commands complete at the next
    /// reap, with their data, ahead of model time.
    fn cancel_all(&mut self) -> usize {
        self.draining = true;
        self.pending.len()
    }
}

impl EmulatedQueue {
    /// Completes what fell due by now; with `due`, also reports when each
    /// fell due in model time (the drive's own completion time, scaled).
    fn reap_due(&mut self, out: &mut Vec<Completion>, mut due: Option<&mut Vec<u64>>) -> usize {
        let now = crate::sys::now_ns();
        let mut n = 0;
        while let Some(Reverse(p)) = self.pending.peek() {
            if p.due_ns > now && !self.draining {
                break;
            }
            let Some(Reverse(p)) = self.pending.pop() else {
                break;
            };
            let st = match (&p.read, p.failed) {
                (_, Some(st)) => st,
                (Some(req), None) => {
                    // SAFETY: submit's contract keeps req.buf valid and ours
                    // until this completion is reported, which is below.
                    unsafe { self.ram.submit(req, p.tag) }.unwrap_or(Status::SUCCESS)
                }
                (None, None) => Status::SUCCESS,
            };
            self.lateness
                .saturating_record(now.saturating_sub(p.due_ns));
            out.push(Completion::new(p.tag, st));
            if let Some(d) = due.as_deref_mut() {
                // Drained early at shutdown: it completes now, not later.
                d.push(p.due_ns.min(now));
            }
            n += 1;
        }
        n
    }
}

impl Drop for EmulatedQueue {
    fn drop(&mut self) {
        let mut all = self
            .drive
            .lateness
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Same bounds on both sides, so adding cannot fail; ignored if it did.
        let _ = all.add(&self.lateness);
    }
}

#[cfg(test)]
mod tests;
