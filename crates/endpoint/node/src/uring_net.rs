//! The io_uring socket engine: receives, gathered sends, the wake-up
//! eventfd and the idle timeout all go through one ring, so a loop iteration
//! costs one `io_uring_enter` however many connections are active.
//!
//! Buffers handed to the ring (a connection's receive space, its iovec array
//! and msghdr) must stay put until the completion arrives; the reactor keeps
//! a connection alive while any of its operations is armed.

use io_uring::{opcode, types, IoUring};
use std::os::fd::RawFd;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Recv,
    Send,
    Wake,
    Timeout,
}

fn encode(idx: usize, k: Kind) -> u64 {
    (idx as u64) << 2 | k as u64
}

pub fn decode(ud: u64) -> (usize, Kind) {
    let k = match ud & 3 {
        0 => Kind::Recv,
        1 => Kind::Send,
        2 => Kind::Wake,
        _ => Kind::Timeout,
    };
    ((ud >> 2) as usize, k)
}

pub struct UringNet {
    ring: IoUring,
    wake_buf: Box<u64>,
    pub wake_armed: bool,
    pub timeout_armed: bool,
    ts: Box<types::Timespec>,
    /// Completions of the last `enter`, reused so the loop does not allocate.
    pub cqes: Vec<(u64, i32)>,
}

impl UringNet {
    pub fn new(entries: u32) -> std::io::Result<UringNet> {
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_coop_taskrun()
            .build(entries)?;
        Ok(UringNet {
            ring,
            wake_buf: Box::new(0),
            wake_armed: false,
            timeout_armed: false,
            ts: Box::new(types::Timespec::new()),
            cqes: Vec::with_capacity(entries as usize),
        })
    }

    fn push(&mut self, e: io_uring::squeue::Entry) {
        // SAFETY (all callers): the buffers an entry points to outlive its
        // completion; see the module comment.
        unsafe {
            if self.ring.submission().push(&e).is_err() {
                let _ = self.ring.submit();
                self.ring
                    .submission()
                    .push(&e)
                    .expect("SQ has room after submit");
            }
        }
    }

    /// One receive into `buf` (the connection's free receive space).
    pub fn arm_recv(&mut self, idx: usize, fd: RawFd, buf: &mut [u8]) {
        let e = opcode::Recv::new(types::Fd(fd), buf.as_mut_ptr(), buf.len() as u32)
            .build()
            .user_data(encode(idx, Kind::Recv));
        self.push(e);
    }

    /// One gathered send of `msg` (whose iovecs stay valid until completion).
    pub fn arm_send(&mut self, idx: usize, fd: RawFd, msg: *const libc::msghdr) {
        let e = opcode::SendMsg::new(types::Fd(fd), msg)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build()
            .user_data(encode(idx, Kind::Send));
        self.push(e);
    }

    pub fn arm_wake(&mut self, fd: RawFd) {
        let p = &mut *self.wake_buf as *mut u64 as *mut u8;
        let e = opcode::Read::new(types::Fd(fd), p, 8)
            .build()
            .user_data(encode(0, Kind::Wake));
        self.push(e);
        self.wake_armed = true;
    }

    /// Bounds an idle wait: completes after `ms` unless something else does first.
    pub fn arm_timeout(&mut self, ms: u64) {
        *self.ts = types::Timespec::new()
            .sec(ms / 1000)
            .nsec((ms % 1000 * 1_000_000) as u32);
        let e = opcode::Timeout::new(&*self.ts as *const _)
            .build()
            .user_data(encode(0, Kind::Timeout));
        self.push(e);
        self.timeout_armed = true;
    }

    /// Submits everything queued, waits for one completion if `wait`, and
    /// collects all completions into `self.cqes`.
    pub fn enter(&mut self, wait: bool) {
        let _ = if wait {
            self.ring.submit_and_wait(1)
        } else {
            self.ring.submit()
        };
        self.cqes.clear();
        for c in self.ring.completion() {
            self.cqes.push((c.user_data(), c.result()));
        }
    }
}
