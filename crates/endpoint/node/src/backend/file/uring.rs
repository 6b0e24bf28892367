//! The io_uring queue: reads, writes, flushes and fallocate pieces as
//! SQEs; completions reaped per loop; cancels and the delay faults.

use super::*;

/// Submission queue entries of one backend ring (one per reactor and file
/// namespace).
pub(super) const RING_ENTRIES: u32 = 256;
/// Requests a queue holds at once: twice the ring, because a request keeps
/// its slot from submit to reap while the ring holds it only until the
/// kernel consumes it.
pub(super) const SLOTS_PER_RING_ENTRY: usize = 2;
/// User data: the low 32 bits are a slot index; these bits mark our own
/// auxiliary operations so their completions are not taken for requests.
pub(super) const CANCEL_BIT: u64 = 1 << 62;
pub(super) const DELAY_BIT: u64 = 1 << 61;
pub(super) const SLOT_MASK: u64 = u32::MAX as u64;

/// One in-flight io_uring request; partial transfers are resubmitted.
#[derive(Clone, Copy)]
pub(super) struct Pending {
    pub(super) tag: Tag,
    pub(super) req: IoReq,
    pub(super) done_bytes: u64,
    /// The ring generation the request's current operation went to.
    pub(super) gen: u32,
    /// Fault injection: how long a hard-linked timeout holds the read back.
    /// Read by the kernel when the timeout is submitted, so it lives here.
    pub(super) delay: io_uring::types::Timespec,
    /// Write Zeroes and Discard: how the piece is being done.
    pub(super) step: ZeroStep,
}

/// Requests go to a per-reactor io_uring. When a submit fails for good the
/// ring is retired (see [`crate::sys::ring`]): requests it never consumed fail
/// with [`crate::backend::SUBMIT_FAILED`], its running requests are still reaped, and
/// the next request opens a new ring.
pub(super) struct UringQueue {
    pub(super) file: Arc<File>,
    pub(super) zero: Arc<ZeroSupport>,
    /// What zero fills write from, made at the first fill.
    pub(super) zero_buf: Option<ZeroBuf>,
    pub(super) ring: Option<Ring>,
    pub(super) gen: u32,
    pub(super) retired: Vec<(u32, Ring)>,
    pub(super) slots: Vec<Option<Pending>>,
    pub(super) free: Vec<u32>,
    /// Requests failed without the kernel, reported at the next `reap`.
    pub(super) failed: Vec<Completion>,
    /// Reused between reaps so the hot path does not allocate.
    pub(super) scratch: Vec<(u64, i32)>,
}

pub(super) fn build_ring() -> std::io::Result<Ring> {
    let ring = io_uring::IoUring::builder()
        .setup_single_issuer()
        .build(RING_ENTRIES)?;
    Ok(Ring::new(ring))
}

impl UringQueue {
    pub(super) fn new(file: Arc<File>, zero: Arc<ZeroSupport>) -> std::io::Result<UringQueue> {
        let ring = build_ring()?;
        let n = RING_ENTRIES as usize * SLOTS_PER_RING_ENTRY;
        Ok(UringQueue {
            file,
            zero,
            zero_buf: None,
            ring: Some(ring),
            gen: 0,
            retired: Vec::new(),
            slots: vec![None; n],
            free: (0..n as u32).rev().collect(),
            failed: Vec::new(),
            scratch: Vec::with_capacity(n),
        })
    }

    /// The current ring, opening a new one after a retirement.
    pub(super) fn ring(&mut self) -> Result<&mut Ring, Status> {
        if self.ring.is_none() {
            match build_ring() {
                Ok(r) => self.ring = Some(r),
                Err(e) => {
                    tracing::error!("cannot open a backend io_uring ({e}); failing the request");
                    return Err(crate::backend::SUBMIT_FAILED);
                }
            }
        }
        self.ring.as_mut().ok_or(crate::backend::SUBMIT_FAILED)
    }

    /// The entry for the next part of slot `idx`'s request.
    pub(super) fn entry(&self, idx: u32) -> Option<io_uring::squeue::Entry> {
        use io_uring::{opcode, types};
        let p = self.slots[idx as usize]?;
        let fd = types::Fd(self.file.as_raw_fd());
        let r = p.req;
        let rest = (r.len_bytes - p.done_bytes) as u32;
        let off = r.offset_bytes + p.done_bytes;
        // SAFETY: done_bytes < len_bytes, so the pointer stays inside the
        // request's buffer, which the submitter keeps valid (BackendQueue::submit).
        let buf = unsafe { r.buf.add(p.done_bytes as usize) };
        let e = match r.op {
            Op::Read => opcode::Read::new(fd, buf, rest).offset(off).build(),
            Op::Write => opcode::Write::new(fd, buf, rest)
                .offset(off)
                .rw_flags(if r.fua { libc::RWF_DSYNC } else { 0 })
                .build(),
            Op::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            Op::WriteZeroes | Op::Discard => self.zero_entry(&p, off)?,
        };
        Some(e.user_data(idx as u64))
    }

    /// The entry for the next part of a zeroing piece: an fallocate (the
    /// kernel runs it on its own worker, never on this thread), a write of
    /// at most [`ZERO_FILL_CHUNK`] zeroes, or the FUA fdatasync.
    pub(super) fn zero_entry(&self, p: &Pending, off: u64) -> Option<io_uring::squeue::Entry> {
        use io_uring::{opcode, types};
        let fd = types::Fd(self.file.as_raw_fd());
        let rest = p.req.len_bytes - p.done_bytes;
        let falloc = |mode| {
            opcode::Fallocate::new(fd, rest)
                .offset(off)
                .mode(mode)
                .build()
        };
        Some(match p.step {
            ZeroStep::ZeroRange => falloc(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE),
            ZeroStep::Punch => falloc(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE),
            ZeroStep::Fill => {
                let n = rest.min(ZERO_FILL_CHUNK as u64) as u32;
                opcode::Write::new(fd, self.zero_buf.as_ref()?.ptr, n)
                    .offset(off)
                    .build()
            }
            ZeroStep::Sync => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
        })
    }

    /// Moves a zeroing piece to `step` from its start and queues it; on
    /// Err the caller fails the slot.
    pub(super) fn restart_zero(&mut self, idx: u32, step: ZeroStep) -> Result<(), Status> {
        if step == ZeroStep::Fill && self.zero_buf.is_none() {
            self.zero_buf = Some(ZeroBuf::new().ok_or(generic::INTERNAL_ERROR)?);
        }
        let p = self.slots[idx as usize]
            .as_mut()
            .ok_or(crate::backend::SUBMIT_FAILED)?;
        p.step = step;
        if step != ZeroStep::Sync {
            p.done_bytes = 0;
        }
        self.push(idx)
    }

    /// Handles one completion of a zeroing piece: None while it goes on
    /// (the next fill write, a fallback after "unsupported", the FUA sync).
    pub(super) fn complete_zero(&mut self, idx: u32, mut p: Pending, res: i32) -> Option<Status> {
        let next = if res < 0 {
            if !self.zero.unsupported(p.step, -res) {
                return Some(io_error_status(p.req.op, Some(-res)));
            }
            match self.zero.next_step(p.req.op, p.step) {
                Some(step) => step,
                None => return Some(Status::SUCCESS), // Deallocate is advisory
            }
        } else {
            match p.step {
                ZeroStep::Sync => return Some(Status::SUCCESS),
                ZeroStep::Fill if res == 0 => return Some(io_error_status(p.req.op, None)),
                ZeroStep::Fill => p.done_bytes += res as u64,
                _ => p.done_bytes = p.req.len_bytes,
            }
            if p.done_bytes < p.req.len_bytes {
                self.slots[idx as usize] = Some(p);
                return self.push(idx).err();
            }
            if !p.req.fua {
                return Some(Status::SUCCESS);
            }
            ZeroStep::Sync
        };
        self.slots[idx as usize] = Some(p);
        self.restart_zero(idx, next).err()
    }

    /// Queues the next part of slot `idx`'s request. On Err the slot is
    /// still held: the caller frees it and reports the status.
    pub(super) fn push(&mut self, idx: u32) -> Result<(), Status> {
        let e = self.entry(idx).ok_or(crate::backend::SUBMIT_FAILED)?;
        let op = self.slots[idx as usize].map(|p| p.req.op);
        let delay = match op {
            Some(Op::Read) => crate::sys::fault::read_delay_ms(),
            Some(Op::Write) => crate::sys::fault::write_delay_ms(),
            _ => None,
        };
        if let Some(ms) = delay {
            return self.push_delayed(idx, e, ms);
        }
        for _ in 0..2 {
            let gen = self.gen;
            let ring = self.ring()?;
            // SAFETY: the request's buffer stays valid until it completes (the
            // BackendQueue::submit contract); if this entry is lost, the slot
            // is failed only once the ring is retired and can no longer run it.
            if unsafe { ring.push(&e) }.is_ok() {
                if let Some(p) = self.slots[idx as usize].as_mut() {
                    p.gen = gen;
                }
                return Ok(());
            }
            self.kick(); // full: submit what is queued (may retire the ring)
        }
        Err(crate::backend::SUBMIT_FAILED)
    }

    /// Fault injection: queues `e` behind a hard-linked timeout of `ms`, so
    /// the read (or write) starts late but is real kernel I/O meanwhile.
    pub(super) fn push_delayed(
        &mut self,
        idx: u32,
        e: io_uring::squeue::Entry,
        ms: u64,
    ) -> Result<(), Status> {
        if self.ring()?.room() < 2 {
            self.kick();
        }
        let gen = self.gen;
        let Some(p) = self.slots[idx as usize].as_mut() else {
            return Err(crate::backend::SUBMIT_FAILED);
        };
        p.gen = gen;
        p.delay = std::time::Duration::from_millis(ms).into();
        let ts = &p.delay as *const io_uring::types::Timespec;
        let ring = self.ring()?;
        if ring.room() < 2 {
            return Err(crate::backend::SUBMIT_FAILED);
        }
        let t = io_uring::opcode::Timeout::new(ts)
            .build()
            .flags(io_uring::squeue::Flags::IO_HARDLINK)
            .user_data(DELAY_BIT | idx as u64);
        // SAFETY: the timespec lives in the slot, which stays put until the
        // request completes or is failed as lost; the read is as in `push`.
        unsafe {
            ring.push(&t).map_err(|_| crate::backend::SUBMIT_FAILED)?;
            ring.push(&e).map_err(|_| crate::backend::SUBMIT_FAILED)
        }
    }

    /// A submit failed for good: every entry the ring never consumed will
    /// never run, so its request fails now; running ones are still reaped.
    pub(super) fn retire(&mut self, e: std::io::Error) {
        let Some(mut old) = self.ring.take() else {
            return;
        };
        let lost = old.take_lost();
        tracing::error!(
            "backend io_uring submit failed after {} attempts ({e}); failing {} queued \
             requests with {} and opening a new ring",
            crate::sys::ring::SUBMIT_ATTEMPTS,
            lost.iter()
                .filter(|&&ud| ud & (CANCEL_BIT | DELAY_BIT) == 0)
                .count(),
            crate::backend::SUBMIT_FAILED
        );
        for ud in lost {
            if ud & (CANCEL_BIT | DELAY_BIT) == 0 {
                self.fail(ud as u32, crate::backend::SUBMIT_FAILED);
            }
        }
        if old.in_flight() > 0 {
            self.retired.push((self.gen, old));
        }
        self.gen = self.gen.wrapping_add(1);
    }

    /// Frees slot `idx` and reports `st` for its request at the next reap.
    pub(super) fn fail(&mut self, idx: u32, st: Status) {
        if let Some(p) = self.slots.get_mut(idx as usize).and_then(Option::take) {
            self.free.push(idx);
            self.failed.push(Completion::new(p.tag, st));
        }
    }

    /// Handles one completion of a request operation; returns the request's
    /// final status, or None while parts remain (resubmitted here).
    /// A failed request, in the log at most every 10 s with a count.
    pub(super) fn log_failure(&self, p: &Pending, res: i32) {
        if let Some(quiet) = io_error_log_allowed() {
            tracing::warn!(
                not_logged_since_last = quiet,
                "{:?} at {} failed: {}",
                p.req.op,
                p.req.offset_bytes,
                if res < 0 {
                    std::io::Error::from_raw_os_error(-res).to_string()
                } else {
                    "short transfer".into()
                }
            );
        }
    }

    pub(super) fn complete(&mut self, idx: u32, res: i32) -> Option<Completion> {
        let mut p = self.slots.get(idx as usize).copied().flatten()?;
        let status = if matches!(p.req.op, Op::WriteZeroes | Op::Discard) {
            let st = self.complete_zero(idx, p, res)?;
            if !st.is_success() {
                self.log_failure(&p, res);
            }
            st
        } else if res < 0 {
            self.log_failure(&p, res);
            io_error_status(p.req.op, Some(-res))
        } else if p.req.op == Op::Flush {
            Status::SUCCESS
        } else if res == 0 {
            io_error_status(p.req.op, None) // EOF inside the namespace
        } else {
            p.done_bytes += res as u64;
            if p.done_bytes < p.req.len_bytes {
                self.slots[idx as usize] = Some(p);
                match self.push(idx) {
                    Ok(()) => return None,
                    Err(st) => st,
                }
            } else {
                Status::SUCCESS
            }
        };
        self.slots[idx as usize] = None;
        self.free.push(idx);
        Some(Completion::new(p.tag, status))
    }
}

impl BackendQueue for UringQueue {
    unsafe fn submit(&mut self, req: &IoReq, tag: Tag) -> Option<Status> {
        crate::sys::fault::io_panic_point();
        let zeroing = matches!(req.op, Op::WriteZeroes | Op::Discard);
        let step = if zeroing {
            match self.zero.first_step(req.op) {
                Some(s) => s,
                None => return Some(Status::SUCCESS), // Deallocate is advisory
            }
        } else {
            ZeroStep::ZeroRange // unused
        };
        if step == ZeroStep::Fill && self.zero_buf.is_none() {
            self.zero_buf = ZeroBuf::new();
            if self.zero_buf.is_none() {
                return Some(generic::INTERNAL_ERROR);
            }
        }
        let Some(idx) = self.free.pop() else {
            // More requests than slots: the reactor bounds queue depth, so
            // this means a bug elsewhere; fail the command rather than block.
            return Some(generic::INTERNAL_ERROR);
        };
        self.slots[idx as usize] = Some(Pending {
            tag,
            req: *req,
            done_bytes: 0,
            gen: self.gen,
            delay: io_uring::types::Timespec::new(),
            step,
        });
        match self.push(idx) {
            Ok(()) => None,
            Err(st) => {
                self.slots[idx as usize] = None;
                self.free.push(idx);
                Some(st)
            }
        }
    }

    fn kick(&mut self) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        if ring.staged() == 0 {
            return;
        }
        if let Err(e) = ring.submit(0, &mut self.scratch) {
            self.retire(e);
        }
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let before = out.len();
        out.append(&mut self.failed);
        let mut cqes = std::mem::take(&mut self.scratch);
        if let Some(r) = self.ring.as_mut() {
            r.reap(&mut cqes);
        }
        for (_, r) in &mut self.retired {
            r.reap_retired(&mut cqes);
        }
        self.retired.retain(|(_, r)| r.in_flight() > 0);
        for &(ud, res) in &cqes {
            if ud & (CANCEL_BIT | DELAY_BIT) != 0 {
                continue; // our cancel or fault-delay operations
            }
            if let Some(done) = self.complete((ud & SLOT_MASK) as u32, res) {
                out.push(done);
            }
        }
        cqes.clear();
        self.scratch = cqes;
        // Resubmissions inside `complete` may have failed as lost.
        out.append(&mut self.failed);
        out.len() - before
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len() + self.failed.len()
    }

    fn cancel_all(&mut self) -> usize {
        if crate::sys::fault::cancels_ignored() {
            return 0;
        }
        self.kick();
        let gen = self.gen;
        let targets: Vec<u64> = (0..self.slots.len() as u64)
            .filter(|&i| matches!(self.slots[i as usize], Some(p) if p.gen == gen))
            .flat_map(|i| [i, DELAY_BIT | i])
            .collect();
        // Requests on retired rings cannot be cancelled: cancelling means
        // submitting, and a retired ring is never submitted again.
        let Some(ring) = self.ring.as_mut() else {
            return 0;
        };
        let mut issued = 0;
        for t in targets {
            if ring.room() == 0 && ring.submit(0, &mut self.scratch).is_err() {
                break;
            }
            let e = io_uring::opcode::AsyncCancel::new(t)
                .build()
                .user_data(CANCEL_BIT | t);
            // SAFETY: a cancel request points to no memory.
            if unsafe { ring.push(&e) }.is_ok() {
                issued += 1;
            }
        }
        if let Err(e) = ring.submit(0, &mut self.scratch) {
            tracing::error!("cannot submit cancellations: {e}");
            return 0;
        }
        // Completions reaped during retries belong to the next reap.
        issued
    }
}
