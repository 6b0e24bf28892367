//! One loop's work on the epoll engine and for both engines: receive and
//! parse, reap the DH workers and the backends, send what each connection
//! queued, and the connections' timers.

use super::*;

impl Reactor {
    /// One recv into the connection's buffer, then parse what arrived.
    pub(super) fn receive(&mut self, idx: usize, now: u64) {
        let Some(e) = self.conns.get_mut(idx).and_then(|e| e.as_mut()) else {
            return;
        };
        if e.zombie {
            return;
        }
        let fd = e.stream.as_raw_fd();
        if e.undecided.is_some() {
            let mut b = [0u8; 1];
            // SAFETY: the kernel writes at most 1 byte into the live local.
            let n = unsafe {
                libc::recv(
                    fd,
                    b.as_mut_ptr() as *mut _,
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                recv_failed(e, n as i32, std::io::Error::last_os_error());
                return;
            }
            decide(&mut self.tls_server, &self.shared.reg, e, b[0]);
        }
        if e.tls.is_some() {
            tls_receive(e, fd);
            let mut ctx = Self::ctx(
                &mut self.queues,
                &self.shared.reg,
                &mut self.scratch,
                self.auth.as_ref(),
                now,
            );
            tls_drive(e, &mut ctx);
            return;
        }
        let space = e.conn.rx_space();
        if space.is_empty() {
            return; // parsing is stalled on output room; the socket keeps the bytes
        }
        // SAFETY: the kernel writes at most space.len() bytes into the live,
        // exclusively borrowed slice; recv is synchronous.
        let n = unsafe {
            libc::recv(
                fd,
                space.as_mut_ptr() as *mut _,
                space.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            e.conn
                .close_as(CloseKind::PeerClosed, "peer closed the connection");
            return;
        }
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::WouldBlock {
                e.conn
                    .close_as(CloseKind::TransportError, &format!("recv: {err}"));
            }
            return;
        }
        e.conn.rx_commit(n as usize);
        // Borrow disjoint fields; no Arc clone (and no shared refcount traffic) per recv.
        let mut ctx = Self::ctx(
            &mut self.queues,
            &self.shared.reg,
            &mut self.scratch,
            self.auth.as_ref(),
            now,
        );
        e.conn.process(&mut ctx);
    }

    /// Hands the DH workers' results to their connections.
    pub(super) fn reap_auth(&mut self, now: u64) -> bool {
        let Some(port) = &self.auth else { return false };
        let mut done = std::mem::take(&mut self.auth_done);
        let any = port.mailbox.take(&mut done);
        for d in done.drain(..) {
            if let Some(e) = self.conns.get_mut(d.conn as usize).and_then(|e| e.as_mut()) {
                e.conn.auth_done(d.job, d.out, now);
            }
        }
        self.auth_done = done;
        any
    }

    pub(super) fn reap_backends(&mut self, now: u64) -> bool {
        self.done.clear();
        for q in self.queues.iter_mut().flatten() {
            q.kick();
            q.reap(&mut self.done);
        }
        for c in &self.done {
            // Every tag that reaches the reactor is a connection's: the
            // scheduler and the chunking queue keep theirs.
            let Some(t) = c.tag.io() else { continue };
            if let Some(e) = self
                .conns
                .get_mut(t.conn() as usize)
                .and_then(|e| e.as_mut())
            {
                e.conn.backend_done(t.slot(), c.status, c.credits, now);
            }
        }
        !self.done.is_empty()
    }

    /// Sends what each connection has queued (one sendmsg each), resumes
    /// parsing that stopped for lack of tx room, and closes finished ones.
    pub(super) fn flush_all(&mut self, now: u64) -> bool {
        let mut work = false;
        let budget = self.shared.reg.limits().send_budget.0 as usize;
        for idx in 0..self.conns.len() {
            let Some(e) = self.conns[idx].as_mut() else {
                continue;
            };
            if e.conn.has_resv_waits() {
                e.conn.poll_resv_waits(now);
            }
            // A connection's deadline can move earlier only through an event
            // that also queued output (a completion, Connect, Set Features)
            // or a parked Preempt and Abort, so only those are re-armed:
            // idle connections cost nothing here.
            let rearm = e.conn.has_output() || e.conn.has_resv_waits();
            let (sent, close_now) = if e.tls.is_some() {
                self.flush_tls(idx, now, budget)
            } else {
                self.flush_plain(idx, now, budget)
            };
            work |= sent;
            let Some(e) = self.conns[idx].as_mut() else {
                continue;
            };
            let stall_ns = self.shared.reg.limits().send_stall_timeout_ms * NS_PER_MS;
            let tls_done = tls_close_done(e, now, stall_ns);
            if close_now || (e.conn.wants_close() && tls_done) || e.zombie {
                self.close(idx);
            } else if rearm {
                self.arm_timer(idx);
            }
        }
        work
    }

    /// [`flush_all`](Self::flush_all) for a TLS connection: encrypt what it
    /// queued, decrypt and parse what waits for room, then send the
    /// ciphertext. Returns (did work, must close now).
    fn flush_tls(&mut self, idx: usize, now: u64, budget: usize) -> (bool, bool) {
        let Some(e) = self.conns[idx].as_mut() else {
            return (false, false);
        };
        let (mut work, mut close_now) = (false, false);
        tls_encrypt(e, &mut self.iov, budget);
        let has_input = e.tls.as_ref().is_some_and(|t| t.has_input());
        if has_input || e.conn.rx_pending() {
            let mut ctx = Self::ctx(
                &mut self.queues,
                &self.shared.reg,
                &mut self.scratch,
                self.auth.as_ref(),
                now,
            );
            if e.conn.rx_pending() {
                e.conn.process(&mut ctx);
            }
            tls_drive(e, &mut ctx);
            tls_encrypt(e, &mut self.iov, budget);
        }
        if let Some(u) = self.uring.as_mut() {
            if let Some(t) = e.tls.as_mut() {
                if t.has_output() && !e.zombie && !e.send_armed {
                    let b = t.send_buf();
                    e.iov.clear();
                    e.iov.push(libc::iovec {
                        iov_base: b.as_ptr() as *mut _,
                        iov_len: b.len(),
                    });
                    close_now |= !queue_send(u, self.id, idx, e);
                    work = true;
                }
            }
        } else if !e.zombie {
            work |= tls_send(e, self.epfd, idx);
        }
        (work, close_now)
    }

    /// [`flush_all`](Self::flush_all) for a plain TCP connection: queue the
    /// send on io_uring (its completion advances tx), or sendmsg now and
    /// parse what waited for room. Returns (did work, must close now).
    fn flush_plain(&mut self, idx: usize, now: u64, budget: usize) -> (bool, bool) {
        let Some(e) = self.conns[idx].as_mut() else {
            return (false, false);
        };
        let (mut work, mut close_now) = (false, false);
        if let Some(u) = self.uring.as_mut() {
            if e.conn.has_output() && !e.zombie && !e.send_armed {
                e.conn.tx_iovecs(&mut e.iov, MAX_IOV);
                cap_iovecs(&mut e.iov, budget);
                close_now |= !queue_send(u, self.id, idx, e);
                work = true;
            }
        } else if e.conn.has_output() && !e.zombie {
            work |= send(e, &mut self.iov, self.epfd, idx, budget);
            if e.conn.rx_pending() {
                let mut ctx = Self::ctx(
                    &mut self.queues,
                    &self.shared.reg,
                    &mut self.scratch,
                    self.auth.as_ref(),
                    now,
                );
                e.conn.process(&mut ctx);
                if e.conn.has_output() {
                    send(e, &mut self.iov, self.epfd, idx, budget);
                }
            }
        }
        (work, close_now)
    }

    /// Registers connection `idx`'s next deadline if it is earlier than the
    /// one already in the heap (a later one is found when the earlier pops).
    pub(super) fn arm_timer(&mut self, idx: usize) {
        let Some(e) = self.conns.get_mut(idx).and_then(|e| e.as_mut()) else {
            return;
        };
        if let Some(t) = e.conn.next_timeout() {
            if t < e.timer_at {
                e.timer_at = t;
                self.timers.push(Reverse((t, idx as u32, e.gen)));
            }
        }
    }

    /// Fires the connection timers that are due.
    pub(super) fn run_timers(&mut self, now: u64) {
        while let Some(&Reverse((t, idx, gen))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(e) = self.conns.get_mut(idx as usize).and_then(|e| e.as_mut()) else {
                continue;
            };
            if e.gen != gen {
                continue; // the connection this timer was for is gone
            }
            if e.timer_at == t {
                e.timer_at = u64::MAX;
            }
            e.conn.handle_timeout(now);
            if e.conn.has_pool_waiters() {
                let mut ctx = Self::ctx(
                    &mut self.queues,
                    &self.shared.reg,
                    &mut self.scratch,
                    self.auth.as_ref(),
                    now,
                );
                e.conn.pump_pool(&mut ctx);
            }
            self.arm_timer(idx as usize);
        }
    }
}

/// Whether a closing connection's TLS output is out: a TLS connection
/// closes once its ciphertext is out too (an alert, a TermReq): its queued
/// send completed (io_uring) or the socket took it (epoll); or when the peer
/// has taken none of it for `stall_ns`, as plain output is dropped.
fn tls_close_done(e: &mut Entry, now: u64, stall_ns: u64) -> bool {
    let tls_pending =
        e.tls.as_ref().is_some_and(|t| t.has_output()) || (e.tls.is_some() && e.send_armed);
    if !tls_pending {
        return true;
    }
    if e.close_wait_since_ns == u64::MAX && e.conn.wants_close() {
        e.close_wait_since_ns = now;
    }
    now.saturating_sub(e.close_wait_since_ns) > stall_ns && e.close_wait_since_ns != u64::MAX
}

/// A receive returned `n` <= 0: the peer closed, or the socket failed
/// (a would-block is nothing).
pub(super) fn recv_failed(e: &mut Entry, n: i32, err: std::io::Error) {
    if n == 0 {
        e.conn
            .close_as(CloseKind::PeerClosed, "peer closed the connection");
    } else if err.kind() != std::io::ErrorKind::WouldBlock
        && err.kind() != std::io::ErrorKind::Interrupted
    {
        e.conn
            .close_as(CloseKind::TransportError, &format!("recv: {err}"));
    }
}

/// The first byte of a connection on a TLS listener decides: a TLS
/// handshake record (0x16) starts TLS; anything else is plain NVMe/TCP,
/// refused where the listener requires TLS.
pub(super) fn decide(
    server: &mut Option<trellis_tls::ServerConfig>,
    reg: &Arc<Registry>,
    e: &mut Entry,
    first: u8,
) {
    let Some(mode) = e.undecided.take() else {
        return;
    };
    if first != 0x16 {
        if mode == SecureChannel::Required {
            if let Some(left_out) = e.conn.close_log() {
                tracing::warn!(peer = %e.conn.peer(), left_out, "plain NVMe/TCP on a listener with secure_channel = \"required\" (the host did not start TLS); closing");
            }
            e.conn.close_as(
                CloseKind::ProtocolError,
                "TLS required: the host did not start a TLS handshake",
            );
        } else {
            e.conn.tls_not_used();
        }
        return;
    }
    if server.is_none() {
        match crate::data::tcp::tls::server_config(reg) {
            Ok(c) => *server = Some(c),
            Err(err) => {
                tracing::error!(peer = %e.conn.peer(), "cannot set up TLS: {err}; closing");
                e.conn
                    .close_as(CloseKind::Other, &format!("TLS setup failed: {err}"));
                return;
            }
        }
    }
    let Some(cfg) = server.as_ref() else { return };
    match trellis_tls::Tls::server(cfg) {
        Ok(t) => e.tls = Some(Box::new(t)),
        Err(err) => {
            tracing::error!(peer = %e.conn.peer(), "cannot start TLS: {err}; closing");
            e.conn
                .close_as(CloseKind::Other, &format!("TLS setup failed: {err}"));
        }
    }
}
