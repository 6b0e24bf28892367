//! Shutdown: close every connection, wait for in-flight backend I/O (then
//! cancel it and wait again), and leak what the kernel may still write.

use super::*;

impl Reactor {
    pub(super) fn drained(&self) -> bool {
        self.conns
            .iter()
            .flatten()
            .all(|e| e.conn.backend_in_flight() == 0 && (!e.has_output() || e.zombie))
    }

    /// Backend requests and connection socket operations the kernel still
    /// owns (the wake-up read and idle timeout do not count: they touch no
    /// connection memory).
    pub(super) fn kernel_in_flight(&self) -> (usize, usize) {
        let queued: usize = self.queues.iter().flatten().map(|q| q.in_flight()).sum();
        let (mut backend, mut socket) = (0, 0);
        for e in self.conns.iter().flatten() {
            backend += e.conn.backend_in_flight();
            socket += usize::from(e.recv_armed) + usize::from(e.send_armed);
        }
        (backend.max(queued), socket)
    }

    /// Closes every connection. Memory the kernel may still write (slot
    /// buffers under backend I/O, receive buffers and msghdrs under socket
    /// operations) is freed only once its operation completed: in-flight
    /// backend I/O gets until `grace_deadline`, armed socket operations
    /// [`SOCKET_CLOSE_WAIT_NS`]; then both are cancelled and get
    /// [`CANCEL_WAIT_NS`]; what is still running then is leaked.
    pub(super) fn close_all(&mut self, grace_deadline: u64) {
        self.refuse_new("the target is shutting down");
        for idx in 0..self.conns.len() {
            self.close(idx);
        }
        let settle = now_ns() + SOCKET_CLOSE_WAIT_NS;
        self.wait_in_flight(grace_deadline.max(settle));
        let (backend, socket) = self.kernel_in_flight();
        if backend + socket > 0 {
            let cancelled = self.cancel_in_flight();
            tracing::warn!(
                reactor = self.id,
                "shutdown grace expired with {backend} backend requests and {socket} socket \
                 operations in flight; {cancelled} cancellations issued"
            );
            self.wait_in_flight(now_ns() + CANCEL_WAIT_NS);
        }
        self.leak_stuck();
        // SAFETY: epfd is ours and no longer used by anything.
        unsafe { libc::close(self.epfd) };
    }

    /// Reaps completions (closing connections as they finish) until nothing
    /// is in flight or `deadline` passes.
    pub(super) fn wait_in_flight(&mut self, deadline: u64) {
        loop {
            let (backend, socket) = self.kernel_in_flight();
            if backend + socket == 0 || now_ns() >= deadline {
                return;
            }
            let mut work = self.reap_backends(now_ns());
            if self.uring.is_some() {
                // A failing engine only means fewer completions seen here;
                // what stays in flight is leaked below.
                work |= self.uring_step(now_ns(), true).unwrap_or(false);
            }
            for idx in 0..self.conns.len() {
                self.close(idx);
            }
            if !work {
                std::thread::sleep(SHUTDOWN_POLL);
            }
        }
    }

    /// Issues IORING_OP_ASYNC_CANCEL for every backend request and armed
    /// socket operation; returns how many.
    pub(super) fn cancel_in_flight(&mut self) -> usize {
        let mut n: usize = self
            .queues
            .iter_mut()
            .flatten()
            .map(|q| q.cancel_all())
            .sum();
        if let Some(u) = self.uring.as_mut() {
            for (idx, e) in self.conns.iter().enumerate() {
                let Some(e) = e else { continue };
                for (armed, k) in [(e.recv_armed, Kind::Recv), (e.send_armed, Kind::Send)] {
                    if armed && u.cancel(idx, k).is_ok() {
                        n += 1;
                    }
                }
            }
            let _ = u.enter(false);
        }
        n
    }

    /// Leaks the buffers of connections the kernel may still write into:
    /// freeing them would let a late completion corrupt reused memory.
    pub(super) fn leak_stuck(&mut self) {
        for idx in 0..self.conns.len() {
            let Some(e) = self.conns[idx].as_ref() else {
                continue;
            };
            if e.kernel_owned() {
                tracing::error!(
                    reactor = self.id,
                    peer = %e.conn.peer(),
                    backend_requests = e.conn.backend_in_flight(),
                    recv_armed = e.recv_armed,
                    send_armed = e.send_armed,
                    "operations still in flight after cancellation: leaking this connection's \
                     buffers rather than freeing memory the kernel may write"
                );
                std::mem::forget(self.conns[idx].take());
                self.shared.connections.fetch_sub(1, Ordering::Relaxed);
            } else {
                self.close(idx);
            }
        }
    }
}
