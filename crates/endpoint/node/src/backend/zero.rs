//! Write Zeroes and Deallocate in bounded chunks (issue 32).
//!
//! A Dataset Management command names up to 256 ranges of up to 2³² blocks
//! each, a Write Zeroes up to 2¹⁶ blocks: done in one step on the reactor
//! thread, as they once were, one host's `mkfs` or `fstrim` stalled every
//! other host of that reactor for as long as the file system took (and
//! where it could not zero natively, for as long as writing the zeroes
//! took). [`Chunked`] wraps a reactor's backend queue: it turns each such
//! command into a job of byte ranges (merged, so overlapping ranges cost
//! nothing twice and a command never asks more than the namespace holds),
//! and sends the backend pieces of bounded size, a bounded number at a
//! time per queue ([`ZeroLimits`]), a few more each reactor loop (`kick`),
//! taking turns between commands so that a small one does not wait behind
//! a huge one. The command completes when its last piece
//! does; the first piece to fail gives its status and stops the rest.
//!
//! Below it, each backend does one piece without holding the reactor: the
//! file backend as an asynchronous io_uring fallocate (or, without io_uring,
//! on a worker thread), RAM and the emulated SSD inline (a piece of RAM is
//! one madvise of at most [`crate::backend::ram::RAM_ZERO_CHUNK_BYTES`]).
//! As nvmet queues the work of such commands on a workqueue rather than
//! running it in its receive path.

use super::{BackendQueue, Completion, IoReq, Op, Tag};
use std::collections::VecDeque;
use trellis_nvme::status::generic;
use trellis_nvme::Status;

/// How large the pieces are and how many go out at once: `target.zero_chunk`
/// and `target.zero_chunks_in_flight` (defaults 256 MiB and 4, in
/// docs/target.md). A piece is also at most what the backend takes in one
/// step ([`BackendQueue::zero_chunk_bytes`]: 16 MiB for RAM).
#[derive(Clone, Copy, Debug)]
pub struct ZeroLimits {
    pub chunk_bytes: u64,
    pub in_flight: usize,
}

impl ZeroLimits {
    pub fn of(t: &crate::config::TargetConfig) -> ZeroLimits {
        ZeroLimits {
            chunk_bytes: t.zero_chunk.0.max(1),
            in_flight: t.zero_chunks_in_flight.max(1),
        }
    }
}

impl Default for ZeroLimits {
    fn default() -> Self {
        ZeroLimits {
            chunk_bytes: crate::config::DEFAULT_ZERO_CHUNK,
            in_flight: crate::config::DEFAULT_ZERO_CHUNKS_IN_FLIGHT,
        }
    }
}

/// One command's zeroing or deallocation.
struct Job {
    /// The tag to complete with.
    tag: Tag,
    op: Op,
    fua: bool,
    /// (offset, length) in bytes, sorted and disjoint.
    ranges: Vec<(u64, u64)>,
    /// The range whose next piece goes out next, and how far into it.
    next: usize,
    done_in_range: u64,
    in_flight: usize,
    status: Status,
}

impl Job {
    fn issued_all(&self) -> bool {
        self.next >= self.ranges.len()
    }
    /// The next piece of at most `chunk` bytes, advancing past it.
    fn take_piece(&mut self, chunk: u64) -> Option<(u64, u64)> {
        let &(off, len) = self.ranges.get(self.next)?;
        let n = (len - self.done_in_range).min(chunk.max(1));
        let piece = (off + self.done_in_range, n);
        self.done_in_range += n;
        if self.done_in_range >= len {
            self.next += 1;
            self.done_in_range = 0;
        }
        Some(piece)
    }
    /// Records a piece's status: the first failure wins and stops the rest.
    fn piece_done(&mut self, st: Status) {
        if !st.is_success() && self.status.is_success() {
            self.status = st;
            self.next = self.ranges.len();
        }
    }
}

/// Sorts `ranges` and merges those that overlap or touch; drops empty ones.
pub fn merge_ranges(ranges: &mut Vec<(u64, u64)>) {
    ranges.retain(|r| r.1 > 0);
    ranges.sort_unstable_by_key(|r| r.0);
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for &(off, len) in ranges.iter() {
        let end = off.saturating_add(len);
        match out.last_mut() {
            Some((o, l)) if off <= *o + *l => *l = (*l).max(end - *o),
            _ => out.push((off, len)),
        }
    }
    *ranges = out;
}

/// A backend queue whose Write Zeroes and Deallocate go out in bounded
/// pieces; everything else passes straight through.
pub struct Chunked {
    inner: Box<dyn BackendQueue>,
    limits: ZeroLimits,
    /// Jobs by id (their pieces' tags are [`Tag::piece`] of it, which no
    /// tag this queue is given is); None: a free id.
    jobs: Vec<Option<Job>>,
    free: Vec<u32>,
    /// Jobs with pieces still to send, oldest first.
    waiting: VecDeque<u32>,
    /// Pieces at the backend now.
    pieces_in_flight: usize,
    /// Finished commands and passed-through completions not yet reaped.
    done: Vec<Completion>,
    /// Reused between reaps.
    scratch: Vec<Completion>,
    scratch_due: Vec<u64>,
}

impl Chunked {
    pub fn wrap(inner: Box<dyn BackendQueue>, limits: ZeroLimits) -> Box<dyn BackendQueue> {
        Box::new(Chunked {
            inner,
            limits,
            jobs: Vec::new(),
            free: Vec::new(),
            waiting: VecDeque::new(),
            pieces_in_flight: 0,
            done: Vec::new(),
            scratch: Vec::new(),
            scratch_due: Vec::new(),
        })
    }

    fn add_job(
        &mut self,
        tag: Tag,
        op: Op,
        fua: bool,
        mut ranges: Vec<(u64, u64)>,
    ) -> Option<Status> {
        merge_ranges(&mut ranges);
        if ranges.is_empty() {
            return Some(Status::SUCCESS);
        }
        let job = Job {
            tag,
            op,
            fua,
            ranges,
            next: 0,
            done_in_range: 0,
            in_flight: 0,
            status: Status::SUCCESS,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.jobs[id as usize] = Some(job);
                id
            }
            None => {
                self.jobs.push(Some(job));
                (self.jobs.len() - 1) as u32
            }
        };
        self.waiting.push_back(id);
        None
    }

    /// Sends pieces of waiting jobs, one per job in turn, while the bound
    /// allows: at most `limits.in_flight` submissions per call, whether the
    /// backend finishes them inside `submit` or later.
    fn pump(&mut self) {
        let max = self.limits.in_flight;
        let chunk = self.limits.chunk_bytes.min(self.inner.zero_chunk_bytes());
        let mut budget = max;
        while budget > 0 && self.pieces_in_flight < max {
            let Some(id) = self.waiting.pop_front() else {
                return;
            };
            let Some(job) = self.jobs.get_mut(id as usize).and_then(Option::as_mut) else {
                continue;
            };
            let Some((off, len)) = job.take_piece(chunk) else {
                continue;
            };
            if !job.issued_all() {
                self.waiting.push_back(id); // its next turn after the others
            }
            let req = IoReq {
                op: job.op,
                offset_bytes: off,
                len_bytes: len,
                buf: std::ptr::null_mut(),
                fua: job.fua,
            };
            job.in_flight += 1;
            self.pieces_in_flight += 1;
            budget -= 1;
            // SAFETY: Write Zeroes and Discard carry no buffer.
            if let Some(st) = unsafe { self.inner.submit(&req, Tag::piece(id)) } {
                self.piece_done(id, st);
            }
        }
    }

    /// A piece of job `id` finished with `st`; completes the job after its last.
    fn piece_done(&mut self, id: u32, st: Status) {
        self.pieces_in_flight = self.pieces_in_flight.saturating_sub(1);
        let Some(job) = self.jobs.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        job.in_flight = job.in_flight.saturating_sub(1);
        job.piece_done(st);
        if job.issued_all() && job.in_flight == 0 {
            self.done.push(Completion::new(job.tag, job.status));
            self.jobs[id as usize] = None;
            self.free.push(id);
            self.waiting.retain(|&w| w != id);
        }
    }
}

impl BackendQueue for Chunked {
    unsafe fn submit(&mut self, req: &IoReq, tag: Tag) -> Option<Status> {
        match req.op {
            Op::WriteZeroes | Op::Discard => self.add_job(
                tag,
                req.op,
                req.fua,
                vec![(req.offset_bytes, req.len_bytes)],
            ),
            // SAFETY: forwarded under the caller's guarantee.
            _ => unsafe { self.inner.submit(req, tag) },
        }
    }

    fn submit_ranges(
        &mut self,
        op: Op,
        ranges: &[(u64, u64)],
        fua: bool,
        tag: Tag,
    ) -> Option<Status> {
        if !matches!(op, Op::WriteZeroes | Op::Discard) {
            return Some(generic::INTERNAL_ERROR);
        }
        self.add_job(tag, op, fua, ranges.to_vec())
    }

    fn completes_in_submit(&self) -> bool {
        self.inner.completes_in_submit()
    }

    fn zero_chunk_bytes(&self) -> u64 {
        self.inner.zero_chunk_bytes()
    }

    fn kick(&mut self) {
        self.pump();
        self.inner.kick();
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let before = out.len();
        let mut mine = std::mem::take(&mut self.scratch);
        self.inner.reap(&mut mine);
        for &c in &mine {
            match c.tag.as_piece() {
                Some(id) => self.piece_done(id, c.status),
                None => out.push(c),
            }
        }
        mine.clear();
        self.scratch = mine;
        out.append(&mut self.done);
        out.len() - before
    }

    /// Passes the backend's own completion times through (an emulated SSD
    /// knows them, and Gimbal's latency signal needs them); a finished
    /// zeroing command is due now.
    fn reap_timed(&mut self, out: &mut Vec<Completion>, due_ns: &mut Vec<u64>) -> usize {
        let before = out.len();
        let mut mine = std::mem::take(&mut self.scratch);
        let mut mine_due = std::mem::take(&mut self.scratch_due);
        self.inner.reap_timed(&mut mine, &mut mine_due);
        for (k, &c) in mine.iter().enumerate() {
            if let Some(id) = c.tag.as_piece() {
                self.piece_done(id, c.status);
            } else {
                out.push(c);
                due_ns.push(mine_due.get(k).copied().unwrap_or_else(crate::sys::now_ns));
            }
        }
        mine.clear();
        mine_due.clear();
        (self.scratch, self.scratch_due) = (mine, mine_due);
        if !self.done.is_empty() {
            let now = crate::sys::now_ns();
            due_ns.extend(std::iter::repeat_n(now, self.done.len()));
            out.append(&mut self.done);
        }
        out.len() - before
    }

    fn in_flight(&self) -> usize {
        let jobs = self.jobs.iter().filter(|j| j.is_some()).count();
        self.inner.in_flight() + jobs + self.done.len()
    }

    /// Shutdown, grace expired: no further pieces go out (their commands
    /// fail with Command Aborted due to SQ Deletion once their pieces in
    /// flight are back), and the backend cancels what it runs.
    fn cancel_all(&mut self) -> usize {
        for job in self.jobs.iter_mut().flatten() {
            job.piece_done(generic::ABORTED_SQ_DELETION);
        }
        self.waiting.clear();
        let ids: Vec<u32> = (0..self.jobs.len() as u32)
            .filter(|&i| matches!(&self.jobs[i as usize], Some(j) if j.in_flight == 0))
            .collect();
        for id in ids {
            if let Some(job) = self.jobs[id as usize].take() {
                self.done.push(Completion::new(job.tag, job.status));
                self.free.push(id);
            }
        }
        self.inner.cancel_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tag::test_tag;

    #[test]
    fn overlapping_and_touching_ranges_merge_and_empty_ones_go() {
        let mut r = vec![(100, 50), (0, 10), (10, 5), (120, 100), (500, 0), (300, 1)];
        merge_ranges(&mut r);
        assert_eq!(r, vec![(0, 15), (100, 120), (300, 1)]);
        // 256 copies of the whole namespace are one range.
        let mut r = vec![(0, 1 << 42); 256];
        merge_ranges(&mut r);
        assert_eq!(r, vec![(0, 1 << 42)]);
    }

    /// A synchronous backend that records each piece it was given.
    struct Recorder {
        pieces: std::rc::Rc<std::cell::RefCell<Vec<(Op, u64, u64)>>>,
        fail_at: Option<u64>,
    }

    impl BackendQueue for Recorder {
        unsafe fn submit(&mut self, req: &IoReq, _tag: Tag) -> Option<Status> {
            self.pieces
                .borrow_mut()
                .push((req.op, req.offset_bytes, req.len_bytes));
            if self.fail_at == Some(req.offset_bytes) {
                return Some(trellis_nvme::status::media::WRITE_FAULT);
            }
            Some(Status::SUCCESS)
        }
        fn zero_chunk_bytes(&self) -> u64 {
            1 << 20
        }
    }

    fn steps_until_done(q: &mut dyn BackendQueue, max_steps: usize) -> (usize, Vec<Completion>) {
        let mut out = Vec::new();
        for step in 1..=max_steps {
            q.kick();
            q.reap(&mut out);
            if !out.is_empty() {
                return (step, out);
            }
        }
        (max_steps, out)
    }

    #[test]
    fn a_huge_write_zeroes_goes_out_in_bounded_pieces_a_few_per_loop() {
        let pieces = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut q = Chunked::wrap(
            Box::new(Recorder {
                pieces: pieces.clone(),
                fail_at: None,
            }),
            ZeroLimits::default(),
        );
        let req = IoReq {
            op: Op::WriteZeroes,
            offset_bytes: 4096,
            len_bytes: 64 << 20,
            buf: std::ptr::null_mut(),
            fua: false,
        };
        // SAFETY: no buffer.
        let st = unsafe { q.submit(&req, test_tag(7)) };
        assert_eq!(st, None, "never done inside submit");
        assert!(
            pieces.borrow().is_empty(),
            "nothing went to the backend in submit"
        );
        q.kick();
        assert_eq!(pieces.borrow().len(), 4, "one loop's share");
        let (steps, out) = steps_until_done(&mut *q, 100);
        assert_eq!(out, vec![Completion::new(test_tag(7), Status::SUCCESS)]);
        assert_eq!(steps, 64 / 4 - 1);
        let p = pieces.borrow();
        assert_eq!(p.len(), 64);
        assert!(p
            .iter()
            .all(|&(op, _, len)| op == Op::WriteZeroes && len == 1 << 20));
        assert_eq!(p[0].1, 4096);
        assert_eq!(p[63].1, 4096 + (63 << 20));
        assert_eq!(q.in_flight(), 0);
    }

    #[test]
    fn the_first_failed_piece_gives_the_status_and_stops_the_rest() {
        let pieces = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut q = Chunked::wrap(
            Box::new(Recorder {
                pieces: pieces.clone(),
                fail_at: Some(5 << 20),
            }),
            ZeroLimits::default(),
        );
        assert_eq!(
            q.submit_ranges(
                Op::Discard,
                &[(0, 32 << 20), (1 << 30, 1 << 20)],
                false,
                test_tag(9)
            ),
            None
        );
        let (_, out) = steps_until_done(&mut *q, 100);
        assert_eq!(
            out,
            vec![Completion::new(
                test_tag(9),
                trellis_nvme::status::media::WRITE_FAULT
            )]
        );
        assert!(pieces.borrow().len() <= 5 + 4, "stopped early");
        assert_eq!(q.in_flight(), 0);
    }

    /// A small Write Zeroes sent after a huge Deallocate takes turns with it
    /// and finishes first: one host's `fstrim` does not hold up another's
    /// zeroing on the same reactor and namespace.
    #[test]
    fn a_small_command_takes_turns_with_a_huge_one() {
        let pieces = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut q = Chunked::wrap(
            Box::new(Recorder {
                pieces: pieces.clone(),
                fail_at: None,
            }),
            ZeroLimits::default(),
        );
        assert_eq!(
            q.submit_ranges(Op::Discard, &[(0, 1 << 40)], false, test_tag(1)),
            None
        );
        let small = IoReq {
            op: Op::WriteZeroes,
            offset_bytes: 1 << 41,
            len_bytes: 2 << 20,
            buf: std::ptr::null_mut(),
            fua: false,
        };
        // SAFETY: no buffer.
        assert_eq!(unsafe { q.submit(&small, test_tag(2)) }, None);
        let (steps, out) = steps_until_done(&mut *q, 10);
        assert_eq!(
            out,
            vec![Completion::new(test_tag(2), Status::SUCCESS)],
            "the small one, first"
        );
        assert_eq!(steps, 1, "within the first loop");
        assert!(q.in_flight() > 0, "the huge one goes on");
    }

    /// An emulated SSD's completion times reach the scheduler above
    /// unchanged through the chunking queue (Gimbal's latency signal).
    #[test]
    fn the_backend_s_completion_times_pass_through() {
        struct Timed(bool);
        impl BackendQueue for Timed {
            unsafe fn submit(&mut self, _req: &IoReq, _tag: Tag) -> Option<Status> {
                self.0 = true;
                None
            }
            fn reap(&mut self, _out: &mut Vec<Completion>) -> usize {
                unreachable!("reap_timed is the one called")
            }
            fn reap_timed(&mut self, out: &mut Vec<Completion>, due_ns: &mut Vec<u64>) -> usize {
                if std::mem::take(&mut self.0) {
                    out.push(Completion::new(test_tag(5), Status::SUCCESS));
                    due_ns.push(1234);
                    return 1;
                }
                0
            }
        }
        let mut q = Chunked::wrap(Box::new(Timed(false)), ZeroLimits::default());
        let read = IoReq {
            op: Op::Read,
            ..crate::backend::IoReq::NONE
        };
        // SAFETY: the mock touches no buffer.
        assert_eq!(unsafe { q.submit(&read, test_tag(5)) }, None);
        let (mut out, mut due) = (Vec::new(), Vec::new());
        assert_eq!(q.reap_timed(&mut out, &mut due), 1);
        assert_eq!(
            (out, due),
            (
                vec![Completion::new(test_tag(5), Status::SUCCESS)],
                vec![1234]
            )
        );
    }
}
