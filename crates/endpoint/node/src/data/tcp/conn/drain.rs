//! This connection's part in Preempt and Abort (`state::drain`): which of
//! its commands are past their reservation check and not finished (the
//! reactor notes them when a drain is requested), and its parked
//! Reservation Acquires, completed once the drain is done or failed at
//! `target.preempt_abort_timeout_ms`.

use super::*;
use crate::data::nvme::exec::Access;

/// How often a connection with a parked Preempt and Abort looks whether
/// the drain is done while its reactor is idle (a busy reactor looks
/// every loop).
pub const RESV_POLL_NS: u64 = 1_000_000;

/// The status of a Preempt and Abort whose drain did not finish within
/// `target.preempt_abort_timeout_ms`: the reservation has moved (Report
/// shows it), but commands of the preempted hosts may still complete, so
/// the host must not take the preempt as done. Internal Error with DNR:
/// the preempt cannot be repeated (its hosts are gone), and a cluster
/// manager that sees it failing falls back to fencing of its own.
pub const ABORT_NOT_CONFIRMED: Status = generic::INTERNAL_ERROR.dnr();

impl Conn {
    /// Calls `f(slot, cid, arrived_ns)` for each command executing past its
    /// reservation check: at the backend, or held by a scheduler.
    /// `scope` limits it to the namespaces the new drain requests name.
    pub fn gated_executing(
        &self,
        scope: &crate::state::drain::Scope,
        mut f: impl FnMut(u16, u16, u64),
    ) {
        for (s, slot) in self.slots.iter().enumerate() {
            if slot.phase == Phase::Executing
                && slot.req.cmd.access != Access::None
                && scope.includes(slot.req.ns_uid)
            {
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "slots holds at most 8192 entries (size_slots)"
                )]
                let s = s as u16;
                f(s, slot.req.sqe.cid(), slot.req.arrived_ns);
            }
        }
    }

    /// Whether slot `s` still executes the command noted as (`cid`,
    /// `arrived_ns`). A slot reused by a later command with the same pair
    /// only makes the drain wait longer, never shorter.
    pub fn still_executing(&self, s: u16, cid: u16, arrived_ns: u64) -> bool {
        self.slots.get(s as usize).is_some_and(|slot| {
            slot.phase == Phase::Executing
                && slot.req.sqe.cid() == cid
                && slot.req.arrived_ns == arrived_ns
        })
    }

    /// A Preempt and Abort is parked on this connection.
    #[inline]
    pub fn has_resv_waits(&self) -> bool {
        !self.queue.resv_waits.is_empty()
    }

    /// Completes each parked Preempt and Abort whose drain is done (with
    /// success) or whose time is up (with [`ABORT_NOT_CONFIRMED`]).
    pub fn poll_resv_waits(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        let mut i = 0;
        while let Some(&w) = self.queue.resv_waits.get(i) {
            let st = if self.queue.reg.drain().is_done(w.gen) {
                Status::SUCCESS
            } else if now_ns >= w.deadline_ns {
                tracing::error!(
                    peer = %self.queue.peer,
                    "Preempt and Abort: commands past their reservation check did not finish \
                     within {} ms (target.preempt_abort_timeout_ms); the reservation has moved, \
                     the Acquire fails with Internal Error",
                    self.queue.reg.limits().preempt_abort_timeout_ms
                );
                ABORT_NOT_CONFIRMED
            } else {
                i += 1;
                continue;
            };
            self.queue.resv_waits.swap_remove(i);
            if self.slots.get(w.slot as usize).map(|x| x.phase) == Some(Phase::Held) {
                self.finish(w.slot, st);
            }
        }
    }

    /// When a parked Preempt and Abort should be looked at next (None:
    /// none is parked).
    pub(super) fn resv_poll_ns(&self) -> Option<u64> {
        self.has_resv_waits()
            .then(|| self.now_ns.saturating_add(RESV_POLL_NS))
    }
}
