//! Where a command may wait on a connection, and the bound on each wait
//! (docs/security.md, "What memory a peer can pin"):
//!
//! - **For transfer-pool room** (`Phase::AwaitBuffer`): a command moving
//!   more than `slot_buffer_keep` takes its bytes from the node's
//!   `target.transfer_pool` before its buffer is allocated and before its
//!   R2T goes out; one connection holds at most 1/`TRANSFER_POOL_SHARE_DIV`
//!   of it. Commands that find no room wait in arrival order and are
//!   retried every `POOL_RETRY_NS` (and on new input) until room frees.
//! - **For write data** (`Phase::AwaitData`): from the R2T, at most
//!   `target.data_wait_timeout_ms`; then the connection closes, which
//!   returns every buffer and pool byte it held. Safety against a stale
//!   write does not rest on this timeout: the fence at execution
//!   (`data::nvme::io::fenced`) refuses a command whose data arrives after
//!   this node stopped owning the namespace.

use super::{Conn, Phase};
use crate::config::TRANSFER_POOL_SHARE_DIV;
use crate::data::nvme::exec::{Ctx, Dir};
use crate::state::stats::CloseKind;

/// How often a connection with commands waiting for pool room retries.
pub const POOL_RETRY_NS: u64 = 1_000_000;

impl Conn {
    /// Whether a transfer of `len` bytes draws on the node's transfer pool.
    #[inline]
    pub(super) fn needs_pool(&self, len: u32) -> bool {
        len as u64 > self.queue.reg.limits().slot_buffer_keep.0
    }

    /// Takes pool bytes and the buffer for parsed command `s`; false (and
    /// `s` parked in arrival order) when there is no room yet. Commands
    /// already waiting go first.
    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (conn/rx.rs module doc): on_capsule's alloc_slot s"
    )]
    pub(super) fn admit_transfer(&mut self, s: u16) -> bool {
        if self.pool_wait.is_empty() && self.try_grant(s) {
            return true;
        }
        self.slots[s as usize].phase = Phase::AwaitBuffer;
        self.pool_wait.push_back(s);
        false
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (conn/rx.rs module doc): admit_transfer's s or pool_wait's, which it pushed"
    )]
    #[allow(clippy::cast_possible_truncation, reason = "len is xfer_len, a u32")]
    fn try_grant(&mut self, s: u16) -> bool {
        let pool = &self.queue.reg.transfer_pool();
        let len = self.slots[s as usize].req.xfer_len as u64;
        if self.pool_held_bytes + len > pool.limit() / TRANSFER_POOL_SHARE_DIV {
            return false; // this connection's share is taken
        }
        let Some(g) = pool.try_take(len) else {
            return false;
        };
        self.pool_held_bytes += len;
        let slot = &mut self.slots[s as usize];
        slot.grant = Some(g);
        slot.req.buf.ensure(len as usize);
        true
    }

    /// Resumes the commands that were waiting for pool room, in order, as
    /// far as room allows: a write gets its R2T, a read runs.
    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (conn/rx.rs module doc): pool_wait holds admit_transfer's slots"
    )]
    pub fn pump_pool(&mut self, ctx: &mut Ctx) {
        while let Some(&s) = self.pool_wait.front() {
            if !self.try_grant(s) {
                return;
            }
            self.pool_wait.pop_front();
            let slot = &mut self.slots[s as usize];
            slot.phase = Phase::Executing;
            if slot.req.cmd.dir == Dir::ToCtrl {
                self.start_r2t(s);
            } else {
                self.execute(ctx, s);
            }
        }
    }

    /// Whether commands wait for pool room (the reactor then calls
    /// `pump_pool` when this connection's timer fires).
    pub fn has_pool_waiters(&self) -> bool {
        !self.pool_wait.is_empty()
    }

    /// Slot `s` sent its R2T: its write data is due within the timeout.
    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (conn/rx.rs module doc): start_r2t's s"
    )]
    pub(super) fn data_wait_started(&mut self, s: u16) {
        self.slots[s as usize].data_since_ns = self.now_ns;
        if self.await_data == 0 {
            self.await_data_oldest_ns = self.now_ns;
        }
        self.await_data += 1;
    }

    /// A command's write data is all in.
    pub(super) fn data_wait_ended(&mut self) {
        debug_assert!(self.await_data > 0, "data wait ended without one started");
        self.await_data = self.await_data.saturating_sub(1);
        if self.await_data == 0 {
            self.await_data_oldest_ns = u64::MAX;
        }
    }

    /// The earliest time a wait needs `handle_timeout` (or `pump_pool`).
    pub(super) fn wait_deadline_ns(&self) -> u64 {
        let data = match self.await_data {
            0 => u64::MAX,
            _ => self
                .await_data_oldest_ns
                .saturating_add(self.queue.reg.limits().data_wait_timeout_ms * 1_000_000),
        };
        let pool = match self.pool_wait.is_empty() {
            true => u64::MAX,
            false => self.now_ns.saturating_add(POOL_RETRY_NS),
        };
        data.min(pool)
    }

    /// Closes the connection when a command has waited for its write data
    /// past `target.data_wait_timeout_ms`; true if it did. The oldest wait
    /// is found by a scan only when the (possibly stale, so early) oldest
    /// time says one may be due: a scan of at most the queue depth, once
    /// per timeout, never per I/O.
    pub(super) fn data_wait_expired(&mut self, now_ns: u64) -> bool {
        let timeout_ns = self.queue.reg.limits().data_wait_timeout_ms * 1_000_000;
        if self.await_data == 0 || now_ns < self.await_data_oldest_ns.saturating_add(timeout_ns) {
            return false;
        }
        let oldest = self
            .slots
            .iter()
            .filter(|s| s.phase == Phase::AwaitData)
            .map(|s| s.data_since_ns)
            .min()
            .unwrap_or(u64::MAX);
        if oldest.saturating_add(timeout_ns) > now_ns {
            self.await_data_oldest_ns = oldest;
            return false;
        }
        if let Some(left_out) = self.close_log() {
            tracing::warn!(
                peer = %self.queue.peer,
                waiting = self.await_data,
                left_out,
                "write data not received within {} ms of its R2T (target.data_wait_timeout_ms); closing",
                self.queue.reg.limits().data_wait_timeout_ms
            );
        }
        self.close_as(
            CloseKind::Timeout,
            "write data not received in time after R2T",
        );
        true
    }
}
