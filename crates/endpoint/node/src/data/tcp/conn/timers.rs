//! The connection's deadlines (ICReq, keep-alive, data wait, send stall)
//! as one `next_timeout`, what happens when one passes, and the events
//! queued for AER.

use super::*;

impl Conn {
    /// The earliest time `handle_timeout` has work to do: the connect
    /// timeout, the keep-alive deadline, the controller check of an I/O
    /// queue, or the flush of batched statistics. `None`: no timer.
    pub fn next_timeout(&self) -> Option<u64> {
        if self.state == State::Closing {
            return None;
        }
        let l = &self.queue.reg.limits();
        let stats = match self.stats_since_ns {
            u64::MAX => u64::MAX,
            t => t.saturating_add(STATS_FLUSH_NS),
        };
        let own = match &self.queue.q {
            None => self
                .created_ns
                .saturating_add(l.connect_timeout_ms * 1_000_000)
                .min(match self.state {
                    State::AwaitIcReq => self.icreq_by_ns,
                    _ => u64::MAX,
                }),
            Some(q) if q.kind == QueueKind::Io => self.now_ns.saturating_add(CTRL_CHECK_NS),
            Some(q) => {
                let kato = match self.kato_limit_ns(&q.ctrl) {
                    Some(limit) => q.ctrl.last_keepalive_ns().saturating_add(limit),
                    None => u64::MAX,
                };
                // The admin queue looks this often for raised events and
                // for its controller torn down (`livesub`, a subsystem
                // removed with force), as I/O queues do: the control path
                // sets a flag and never touches the reactor.
                kato.min(self.now_ns.saturating_add(CTRL_CHECK_NS))
            }
        };
        let waits = self.wait_deadline_ns();
        let resv = self.resv_poll_ns().unwrap_or(u64::MAX);
        Some(
            own.min(stats)
                .min(self.tls_deadline_ns)
                .min(waits)
                .min(resv),
        )
        .filter(|&t| t != u64::MAX)
    }

    /// How long an admin queue may stay silent. KAS is 1 s: KATO is rounded
    /// up to whole seconds, as hosts expect.
    pub(super) fn kato_limit_ns(&self, ctrl: &Controller) -> Option<u64> {
        let kato_ms = ctrl.kato_ms() as u64;
        if kato_ms > 0 {
            Some(kato_ms.div_ceil(1000) * 1_000_000_000)
        } else if ctrl.is_discovery() {
            Some(self.queue.reg.limits().discovery_idle_timeout_s * 1_000_000_000)
        } else {
            None
        }
    }

    /// Runs whatever timers are due at `now_ns`: statistics flush, connect
    /// timeout, controller teardown, keep-alive.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        // An idle connection lets go of a removed namespace too.
        self.queue.refresh_ns();
        if self.stats_since_ns != u64::MAX
            && now_ns >= self.stats_since_ns.saturating_add(STATS_FLUSH_NS)
        {
            self.flush_stats();
        }
        if self.state == State::Closing {
            return;
        }
        if now_ns >= self.tls_deadline_ns {
            if let Some(left_out) = self.close_log() {
                tracing::warn!(
                    peer = %self.queue.peer,
                    left_out,
                    "TLS handshake not finished within {} ms (target.tls_handshake_timeout_ms); closing",
                    self.queue.reg.limits().tls_handshake_timeout_ms
                );
            }
            self.close_as(CloseKind::Timeout, "TLS handshake timeout");
            return;
        }
        if self.state == State::AwaitIcReq && now_ns >= self.icreq_by_ns {
            self.close_as(
                CloseKind::Timeout,
                "no ICReq within target.icreq_timeout_ms",
            );
            return;
        }
        let connect_ns = self.queue.reg.limits().connect_timeout_ms * 1_000_000;
        let Some(q) = &self.queue.q else {
            if now_ns.saturating_sub(self.created_ns) > connect_ns {
                self.close_as(CloseKind::Timeout, "no Connect within the connect timeout");
            }
            return;
        };
        if q.ctrl.is_dead() {
            self.close_as(CloseKind::ControllerGone, "controller torn down");
            return;
        }
        if self.data_wait_expired(now_ns) {
            return;
        }
        if self.check_send_stall(now_ns) {
            return;
        }
        let Some(q) = &self.queue.q else { return };
        if q.kind != QueueKind::Admin {
            return;
        }
        self.deliver_event();
        let Some(q) = &self.queue.q else { return };
        let idle_ns = now_ns.saturating_sub(q.ctrl.last_keepalive_ns());
        if self
            .kato_limit_ns(&q.ctrl)
            .is_some_and(|limit| idle_ns > limit)
        {
            q.ctrl.kill("keep-alive timeout");
            self.close_as(CloseKind::Timeout, "keep-alive timeout");
        }
    }

    /// Completes the oldest held AER with a raised asynchronous event, if
    /// both exist.
    pub(super) fn deliver_event(&mut self) {
        let Some(&s) = self.queue.aers.first() else {
            return;
        };
        if self.slots.get(s as usize).map(|x| x.phase) != Some(Phase::Held) {
            self.queue.aers.remove(0); // not an AER any more (cannot happen)
            return;
        }
        let Some(dw0) = self.queue.take_event() else {
            return;
        };
        self.queue.aers.remove(0);
        #[allow(
            clippy::indexing_slicing,
            reason = "slots.get(s) was checked above, and slots never shrink"
        )]
        let slot = &mut self.slots[s as usize];
        slot.req.dw0 = dw0;
        slot.req.dw1 = 0;
        tracing::debug!(cid = slot.req.sqe.cid(), "AER completed: {dw0:#010x}");
        self.finish(s, Status::SUCCESS);
    }
}
