//! The io_uring socket engine: queued receives and sends, their
//! completions, and lost operations.

use super::*;

/// A socket operation could not be queued: close that connection only.
/// io_uring engine: queues one send of `e.iov` (plain: the connection's
/// iovecs; TLS: its ciphertext). False when it could not be queued: the
/// connection is then closing (`not_queued`).
pub(super) fn queue_send(
    u: &mut crate::data::tcp::uring_net::UringNet,
    reactor: usize,
    idx: usize,
    e: &mut Entry,
) -> bool {
    e.msg.msg_iov = e.iov.as_mut_ptr();
    e.msg.msg_iovlen = e.iov.len() as _;
    match u.arm_send(idx, e.stream.as_raw_fd(), &*e.msg) {
        Ok(()) => {
            e.send_armed = true;
            true
        }
        Err(err) => {
            not_queued(reactor, e, "send", &err.0);
            false
        }
    }
}

pub(super) fn not_queued(reactor: usize, e: &mut Entry, what: &str, err: &std::io::Error) {
    tracing::error!(reactor, peer = %e.conn.peer(), "closing connection: cannot queue its io_uring {what} ({err})");
    e.conn
        .close_quietly(&format!("io_uring {what} could not be submitted: {err}"));
}

pub(super) fn open_uring(
    id: usize,
    engine: crate::config::SocketEngine,
) -> Option<crate::data::tcp::uring_net::UringNet> {
    if engine != crate::config::SocketEngine::Uring {
        return None;
    }
    match crate::data::tcp::uring_net::UringNet::new(SOCKET_RING_ENTRIES) {
        Ok(u) => Some(u),
        Err(e) => {
            tracing::warn!(
                reactor = id,
                "io_uring socket engine unavailable ({e}); using epoll"
            );
            None
        }
    }
}

impl Reactor {
    /// io_uring engine: submit queued work, wait if idle, handle completions,
    /// and keep one receive armed per live connection. Err when the engine
    /// cannot go on (a submit failed for good and no new ring opens).
    pub(super) fn uring_step(&mut self, now: u64, shutting: bool) -> Result<bool, String> {
        let l = &self.shared.reg.limits();
        let spinning = now.saturating_sub(self.last_work_ns) < l.idle_spin_us * 1000;
        let in_flight = self.queues.iter().flatten().any(|q| q.in_flight() > 0);
        let sleep = !spinning && !in_flight;
        let idle_ms = l.idle_sleep_ms;
        let wake_fd = self.wake_fd;
        let Some(u) = self.uring.as_mut() else {
            return Ok(false);
        };
        if !u.wake_armed {
            u.arm_wake(wake_fd);
        }
        if sleep && !u.timeout_armed {
            u.arm_timeout(idle_ms);
        }
        u.enter(sleep)?;
        let mut cqes = std::mem::take(&mut u.cqes);
        let lost = std::mem::take(&mut u.lost);
        let mut work = !lost.is_empty();
        for &ud in &lost {
            self.on_lost(ud);
        }
        for &(ud, res) in &cqes {
            let (idx, kind) = crate::data::tcp::uring_net::decode(ud);
            match kind {
                Kind::Wake => {
                    if let Some(u) = self.uring.as_mut() {
                        u.wake_armed = false;
                    }
                    work = true;
                }
                Kind::Timeout => {
                    if let Some(u) = self.uring.as_mut() {
                        u.timeout_armed = false;
                    }
                }
                Kind::Cancel => {}
                Kind::Recv => work |= self.on_recv_done(idx, res, now),
                Kind::Send => work |= self.on_send_done(idx, res, now),
            }
        }
        if let Some(u) = self.uring.as_mut() {
            // Keep completions reaped meanwhile (by a retry inside a push).
            cqes.clear();
            cqes.append(&mut u.cqes);
            u.cqes = cqes;
        }
        if !shutting {
            self.arm_receives();
        }
        Ok(work)
    }

    /// A socket operation never reached the kernel (its ring was retired):
    /// it will never complete, so its connection is closed.
    pub(super) fn on_lost(&mut self, ud: u64) {
        let (idx, kind) = crate::data::tcp::uring_net::decode(ud);
        let Some(e) = self.conns.get_mut(idx).and_then(|e| e.as_mut()) else {
            return;
        };
        let what = match kind {
            Kind::Recv => {
                e.recv_armed = false;
                "receive"
            }
            Kind::Send => {
                e.send_armed = false;
                "send"
            }
            _ => return,
        };
        if !e.zombie {
            let err = std::io::Error::other("submit failed, ring retired");
            not_queued(self.id, e, what, &err);
        }
        self.close(idx);
    }

    pub(super) fn on_recv_done(&mut self, idx: usize, res: i32, now: u64) -> bool {
        let Some(e) = self.conns.get_mut(idx).and_then(|e| e.as_mut()) else {
            return false;
        };
        e.recv_armed = false;
        if e.zombie {
            return false;
        }
        if res == 0 {
            e.conn
                .close_as(CloseKind::PeerClosed, "peer closed the connection");
        } else if res < 0 {
            if res != -libc::EAGAIN && res != -libc::EINTR && res != -libc::ECANCELED {
                e.conn.close_as(
                    CloseKind::TransportError,
                    &format!("recv: {}", std::io::Error::from_raw_os_error(-res)),
                );
            }
        } else if e.undecided.is_some() {
            // The peeked first byte: the bytes stay in the socket.
            let first = e.peek.as_ref().map_or(0, |b| b[0]);
            decide(&mut self.tls_server, &self.shared.reg, e, first);
        } else if let Some(t) = e.tls.as_mut() {
            t.cipher_in_commit(res as usize);
            let mut ctx = Self::ctx(
                &mut self.queues,
                &self.shared.reg,
                &mut self.scratch,
                self.auth.as_ref(),
                now,
            );
            tls_drive(e, &mut ctx);
        } else {
            e.conn.rx_commit(res as usize);
            let mut ctx = Self::ctx(
                &mut self.queues,
                &self.shared.reg,
                &mut self.scratch,
                self.auth.as_ref(),
                now,
            );
            e.conn.process(&mut ctx);
        }
        true
    }

    pub(super) fn on_send_done(&mut self, idx: usize, res: i32, now: u64) -> bool {
        let Some(e) = self.conns.get_mut(idx).and_then(|e| e.as_mut()) else {
            return false;
        };
        e.send_armed = false;
        if e.zombie {
            return false;
        }
        if res < 0 {
            e.conn.close_as(
                CloseKind::TransportError,
                &format!("send: {}", std::io::Error::from_raw_os_error(-res)),
            );
            e.conn.on_send_failure();
            return false;
        }
        match e.tls.as_mut() {
            Some(t) => t.sent(res as usize),
            None => e.conn.tx_advance(res as usize),
        }
        // Parsing may have stopped for lack of output room: resume it.
        if e.conn.rx_pending() {
            let mut ctx = Self::ctx(
                &mut self.queues,
                &self.shared.reg,
                &mut self.scratch,
                self.auth.as_ref(),
                now,
            );
            e.conn.process(&mut ctx);
        }
        true
    }

    pub(super) fn arm_receives(&mut self) {
        let Some(u) = self.uring.as_mut() else {
            return;
        };
        let mut failed = Vec::new(); // allocates only on failure
        for (idx, slot) in self.conns.iter_mut().enumerate() {
            let Some(e) = slot.as_mut() else { continue };
            if e.recv_armed || e.zombie || e.conn.is_closing() {
                continue;
            }
            let fd = e.stream.as_raw_fd();
            let (space, flags) = if e.undecided.is_some() {
                match e.peek.as_mut() {
                    Some(b) => (&mut b[..], libc::MSG_PEEK),
                    None => continue,
                }
            } else if let Some(t) = e.tls.as_mut() {
                (t.cipher_in_space(), 0)
            } else {
                (e.conn.rx_space(), 0)
            };
            if space.is_empty() {
                continue; // a zero-length receive would read as EOF
            }
            match u.arm_recv_flags(idx, fd, space, flags) {
                Ok(()) => e.recv_armed = true,
                Err(err) => {
                    not_queued(self.id, e, "receive", &err.0);
                    failed.push(idx);
                }
            }
        }
        for idx in failed {
            self.close(idx);
        }
    }
}
