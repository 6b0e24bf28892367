//! The io_uring socket engine: receives, gathered sends, the wake-up
//! eventfd and the idle timeout all go through one ring, so a loop iteration
//! costs one `io_uring_enter` however many connections are active.
//!
//! Buffers handed to the ring (a connection's receive space, its iovec array
//! and msghdr) must stay put until the completion arrives; the reactor keeps
//! a connection alive while any of its operations is armed.
//!
//! Submit failures: transient ones are retried (see [`crate::sys::ring`]). When a
//! submit fails for good the ring is retired: the entries it never consumed
//! are reported in [`UringNet::lost`] (the reactor closes the connections
//! they belonged to, with a log line), its running operations are still
//! reaped, and a new ring takes the new work.

use crate::sys::ring::Ring;
use io_uring::{opcode, types, IoUring};
use std::os::fd::RawFd;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Recv,
    Send,
    Wake,
    Timeout,
    /// The completion of an IORING_OP_ASYNC_CANCEL we issued.
    Cancel,
}

/// Marks the user data of cancel requests; the low bits keep the target's.
const CANCEL_BIT: u64 = 1 << 63;
/// Low user-data bits that hold the [`Kind`] of a socket operation.
const KIND_BITS: u32 = 2;
const KIND_MASK: u64 = (1 << KIND_BITS) - 1;

pub fn encode(idx: usize, k: Kind) -> u64 {
    let k = match k {
        Kind::Recv => 0,
        Kind::Send => 1,
        Kind::Wake => 2,
        Kind::Timeout | Kind::Cancel => 3,
    };
    (idx as u64) << KIND_BITS | k
}

pub fn decode(ud: u64) -> (usize, Kind) {
    if ud & CANCEL_BIT != 0 {
        return (0, Kind::Cancel);
    }
    let k = match ud & KIND_MASK {
        0 => Kind::Recv,
        1 => Kind::Send,
        2 => Kind::Wake,
        _ => Kind::Timeout,
    };
    ((ud >> KIND_BITS) as usize, k)
}

/// A socket operation could not be queued even after retiring the ring.
#[derive(Debug)]
pub struct NotQueued(pub std::io::Error);

pub struct UringNet {
    ring: Ring,
    /// Rings retired after a failed submit, reaped until their operations end.
    retired: Vec<Ring>,
    entries: u32,
    wake_buf: Box<u64>,
    pub wake_armed: bool,
    pub timeout_armed: bool,
    ts: Box<types::Timespec>,
    /// Completions not handled yet, as (user data, result). Filled by
    /// `enter` and by retries inside `push`; the reactor takes and clears it.
    pub cqes: Vec<(u64, i32)>,
    /// User data of operations that never reached the kernel (their ring was
    /// retired): they will never complete. The reactor takes and clears it.
    pub lost: Vec<u64>,
}

fn build(entries: u32) -> std::io::Result<IoUring> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_coop_taskrun()
        .build(entries)
}

impl UringNet {
    pub fn new(entries: u32) -> std::io::Result<UringNet> {
        Ok(UringNet {
            ring: Ring::new(build(entries)?),
            retired: Vec::new(),
            entries,
            wake_buf: Box::new(0),
            wake_armed: false,
            timeout_armed: false,
            ts: Box::new(types::Timespec::new()),
            cqes: Vec::with_capacity(entries as usize),
            lost: Vec::new(),
        })
    }

    /// Submits what is queued; on a lasting failure, retires the ring (its
    /// unconsumed entries go to `lost`) and opens a new one. Err only when no
    /// new ring can be opened: the engine cannot go on.
    fn submit(&mut self, want: usize) -> Result<(), String> {
        match self.ring.submit(want, &mut self.cqes) {
            Ok(_) => Ok(()),
            // Nothing was lost; a wait cut short by a signal is not a failure.
            Err(e) if self.ring.staged() == 0 && crate::sys::ring::is_transient(&e) => Ok(()),
            Err(e) => self.retire(e),
        }
    }

    fn retire(&mut self, e: std::io::Error) -> Result<(), String> {
        let fresh = build(self.entries).map_err(|e2| {
            format!("io_uring submit failed ({e}) and no new ring can be opened ({e2})")
        })?;
        let mut old = std::mem::replace(&mut self.ring, Ring::new(fresh));
        let lost = old.take_lost();
        tracing::error!(
            "socket io_uring submit failed after {} attempts ({e}); {} queued operations \
             never reached the kernel, retiring the ring",
            crate::sys::ring::SUBMIT_ATTEMPTS,
            lost.len()
        );
        // Waits happen on the new ring only: arm a wake-up read and a timeout
        // there too, or an idle wait could never end. A wake-up read still
        // running on the retired ring may take one wake-up; the new ring's
        // timeout bounds that delay to idle_sleep_ms.
        self.wake_armed = false;
        self.timeout_armed = false;
        self.lost.extend(lost);
        if old.in_flight() > 0 {
            self.retired.push(old);
        }
        Ok(())
    }

    /// Queues one entry, submitting first if the queue is full.
    fn push(&mut self, e: io_uring::squeue::Entry) -> Result<(), NotQueued> {
        for _ in 0..2 {
            // SAFETY: for every caller, the buffers an entry points to outlive
            // its completion (the reactor keeps the connection while it is
            // armed; wake_buf and ts live in self), or it is reported in `lost`.
            if unsafe { self.ring.push(&e) }.is_ok() {
                return Ok(());
            }
            self.submit(0)
                .map_err(|why| NotQueued(std::io::Error::other(why)))?;
        }
        Err(NotQueued(std::io::Error::from_raw_os_error(libc::EBUSY)))
    }

    /// One receive into `buf` (the connection's free receive space).
    pub fn arm_recv(&mut self, idx: usize, fd: RawFd, buf: &mut [u8]) -> Result<(), NotQueued> {
        self.arm_recv_flags(idx, fd, buf, 0)
    }

    /// One receive with `flags` (MSG_PEEK: look at the first byte of a
    /// connection on a TLS listener without taking it).
    pub fn arm_recv_flags(
        &mut self,
        idx: usize,
        fd: RawFd,
        buf: &mut [u8],
        flags: i32,
    ) -> Result<(), NotQueued> {
        let e = opcode::Recv::new(types::Fd(fd), buf.as_mut_ptr(), buf.len() as u32)
            .flags(flags)
            .build()
            .user_data(encode(idx, Kind::Recv));
        self.push(e)
    }

    /// One gathered send of `msg` (whose iovecs stay valid until completion).
    pub fn arm_send(
        &mut self,
        idx: usize,
        fd: RawFd,
        msg: *const libc::msghdr,
    ) -> Result<(), NotQueued> {
        let e = opcode::SendMsg::new(types::Fd(fd), msg)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build()
            .user_data(encode(idx, Kind::Send));
        self.push(e)
    }

    /// Cancels one armed operation (shutdown, when a socket operation does
    /// not end after the socket was shut down).
    pub fn cancel(&mut self, idx: usize, k: Kind) -> Result<(), NotQueued> {
        let target = encode(idx, k);
        let e = opcode::AsyncCancel::new(target)
            .build()
            .user_data(CANCEL_BIT | target);
        self.push(e)
    }

    pub fn arm_wake(&mut self, fd: RawFd) {
        let p = &mut *self.wake_buf as *mut u64 as *mut u8;
        let e = opcode::Read::new(types::Fd(fd), p, 8)
            .build()
            .user_data(encode(0, Kind::Wake));
        // Not armed: the loop busy-polls this round and tries again.
        self.wake_armed = self.push(e).is_ok();
    }

    /// Bounds an idle wait: completes after `ms` unless something else does first.
    pub fn arm_timeout(&mut self, ms: u64) {
        *self.ts = types::Timespec::new()
            .sec(ms / 1000)
            .nsec((ms % 1000 * 1_000_000) as u32);
        let e = opcode::Timeout::new(&*self.ts as *const _)
            .build()
            .user_data(encode(0, Kind::Timeout));
        self.timeout_armed = self.push(e).is_ok();
    }

    /// Submits everything queued, waits for one completion if `wait`, and
    /// appends all completions to `self.cqes`. Err: the engine cannot go on
    /// (a submit failed for good and no new ring could be opened).
    pub fn enter(&mut self, wait: bool) -> Result<(), String> {
        // Only sleep when something is sure to wake us: completions already
        // collected must be handled first, and without an armed wake-up read
        // and timeout the wait could last forever.
        let want =
            usize::from(wait && self.cqes.is_empty() && self.wake_armed && self.timeout_armed);
        self.submit(want)?;
        self.ring.reap(&mut self.cqes);
        for r in &mut self.retired {
            r.reap_retired(&mut self.cqes);
        }
        self.retired.retain(|r| r.in_flight() > 0);
        Ok(())
    }

    /// Operations the kernel owns, on every ring.
    pub fn in_flight(&self) -> usize {
        self.ring.in_flight() + self.retired.iter().map(Ring::in_flight).sum::<usize>()
    }
}

impl Drop for UringNet {
    fn drop(&mut self) {
        if self.wake_armed {
            // The eventfd read may still complete while the kernel tears the
            // ring down, writing 8 bytes into wake_buf: never free it then.
            std::mem::forget(std::mem::replace(&mut self.wake_buf, Box::new(0)));
        }
    }
}
