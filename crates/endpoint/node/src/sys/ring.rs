//! One io_uring with the bookkeeping both users (the socket engine and the
//! file backend) need to survive a failing `io_uring_enter`.
//!
//! An entry pushed into the submission queue is published to the kernel: it
//! cannot be taken back, and the next successful submit runs it. So when a
//! submit fails for good, the entries still queued are *lost* only if the
//! ring is never submitted again. That is what retiring does: the owner
//! fails the lost entries' commands (their buffers may then be reused, which
//! is safe because the kernel will never read those entries), keeps reaping
//! the retired ring's already-running operations without ever submitting to
//! it, and opens a fresh ring for new work.
//!
//! Each entry here yields exactly one completion (no multishot, no
//! CQE_SKIP), so "consumed minus reaped" counts the operations the kernel
//! still owns.

use io_uring::{squeue, IoUring};
use std::collections::VecDeque;
use std::io;

/// Most attempts at one submission, the first included. EBUSY means the
/// completion queue overflowed and EAGAIN that the kernel briefly lacked
/// request memory: reaping completions between attempts clears the first,
/// and a few immediate retries ride out the second. Each attempt is one
/// syscall and never sleeps, so giving up costs the reactor microseconds.
pub const SUBMIT_ATTEMPTS: u32 = 8;

/// `IORING_ENTER_GETEVENTS` from <linux/io_uring.h> (libc does not export it).
const IORING_ENTER_GETEVENTS: u32 = 1;

/// A failure worth retrying (see [`SUBMIT_ATTEMPTS`]); anything else (EBADF,
/// EFAULT, EINVAL, ENXIO...) will not clear by itself.
pub fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EBUSY | libc::EAGAIN | libc::EINTR)
    )
}

/// The submission queue has no free entry.
#[derive(Debug)]
pub struct Full;

pub struct Ring {
    ring: IoUring,
    /// User data of entries pushed but not yet consumed by the kernel, oldest first.
    staged: VecDeque<u64>,
    /// Entries consumed by the kernel whose completion is not reaped yet.
    in_flight: usize,
}

impl Ring {
    pub fn new(ring: IoUring) -> Ring {
        let cap = ring.params().sq_entries() as usize;
        Ring {
            ring,
            staged: VecDeque::with_capacity(cap),
            in_flight: 0,
        }
    }

    /// Queues one entry; `Err(Full)` when the submission queue is full.
    ///
    /// # Safety
    /// Whatever the entry points to (buffers, iovecs, msghdr, timespec) must
    /// stay valid until its completion is reaped, or until the entry is
    /// returned by [`Ring::take_lost`].
    pub unsafe fn push(&mut self, e: &squeue::Entry) -> Result<(), Full> {
        // SAFETY: the caller upholds the buffer lifetime contract above.
        let r = unsafe { self.ring.submission().push(e) };
        if r.is_err() {
            return Err(Full);
        }
        self.staged.push_back(e.get_user_data());
        Ok(())
    }

    /// Free submission queue entries.
    pub fn room(&mut self) -> usize {
        let sq = self.ring.submission();
        sq.capacity() - sq.len()
    }

    /// Entries queued but not consumed by the kernel yet.
    pub fn staged(&self) -> usize {
        self.staged.len()
    }

    /// Operations the kernel owns (consumed, completion not reaped).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Submits everything staged and, if `want` > 0, waits for that many
    /// completions. Transient failures are retried up to [`SUBMIT_ATTEMPTS`]
    /// times, reaping completions into `sink` in between (that is what
    /// clears EBUSY). On `Err`, what stays staged is for the owner to retire.
    pub fn submit(&mut self, want: usize, sink: &mut Vec<(u64, i32)>) -> io::Result<usize> {
        let mut attempt = 1;
        loop {
            let injected = if self.staged.is_empty() {
                None
            } else {
                crate::sys::fault::submit_error()
            };
            let r = match injected {
                Some(e) => Err(e),
                None => self.ring.submit_and_wait(want),
            };
            self.settle();
            match r {
                Ok(n) => return Ok(n),
                Err(e) if is_transient(&e) && attempt < SUBMIT_ATTEMPTS => {
                    attempt += 1;
                    self.reap(sink);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Moves entries the kernel consumed from `staged` to `in_flight`.
    fn settle(&mut self) {
        let left = self.ring.submission().len();
        while self.staged.len() > left {
            self.staged.pop_front();
            self.in_flight += 1;
        }
    }

    /// Appends every available completion to `sink`.
    pub fn reap(&mut self, sink: &mut Vec<(u64, i32)>) {
        for c in self.ring.completion() {
            sink.push((c.user_data(), c.result()));
            self.in_flight = self.in_flight.saturating_sub(1);
        }
    }

    /// Reaps a retired ring: enters the kernel to run pending task work and
    /// flush overflowed completions, but never submits (to_submit is 0), so
    /// lost entries can never run.
    pub fn reap_retired(&mut self, sink: &mut Vec<(u64, i32)>) {
        // SAFETY: io_uring_enter with to_submit = 0, no wait and no argument
        // reads no user memory; it only posts completions already due.
        let _ = unsafe {
            self.ring
                .submitter()
                .enter::<libc::sigset_t>(0, 0, IORING_ENTER_GETEVENTS, None)
        };
        self.reap(sink);
    }

    /// The entries that never reached the kernel. Call only when retiring
    /// the ring: from then on it must never be submitted again.
    pub fn take_lost(&mut self) -> Vec<u64> {
        self.staged.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use io_uring::opcode;

    fn nop(ud: u64) -> squeue::Entry {
        opcode::Nop::new().build().user_data(ud)
    }

    #[test]
    fn staged_entries_are_counted_until_consumed_and_reaped() {
        let mut r = Ring::new(IoUring::new(8).unwrap());
        let mut sink = Vec::new();
        // SAFETY: a Nop points to no memory.
        unsafe {
            r.push(&nop(1)).unwrap();
            r.push(&nop(2)).unwrap();
        }
        assert_eq!((r.staged(), r.in_flight()), (2, 0));
        assert_eq!(r.submit(2, &mut sink).unwrap(), 2);
        assert_eq!(r.staged(), 0);
        r.reap(&mut sink);
        let mut uds: Vec<u64> = sink.iter().map(|c| c.0).collect();
        uds.sort();
        assert_eq!(uds, [1, 2]);
        assert_eq!(r.in_flight(), 0);
    }

    #[test]
    fn full_queue_refuses_push_and_lost_entries_are_returned() {
        let mut r = Ring::new(IoUring::new(2).unwrap());
        // SAFETY: a Nop points to no memory.
        unsafe {
            r.push(&nop(1)).unwrap();
            r.push(&nop(2)).unwrap();
            assert!(r.push(&nop(3)).is_err());
        }
        assert_eq!(r.room(), 0);
        assert_eq!(r.take_lost(), [1, 2]);
    }

    #[test]
    fn only_ebusy_eagain_and_eintr_are_transient() {
        for (errno, t) in [
            (libc::EBUSY, true),
            (libc::EAGAIN, true),
            (libc::EINTR, true),
            (libc::EIO, false),
            (libc::EBADF, false),
        ] {
            assert_eq!(is_transient(&io::Error::from_raw_os_error(errno)), t);
        }
    }
}
