//! Completions and the send queue: a finished command's response (and
//! its C2HData), slot release, the iovecs the reactor sends, and the send
//! stall deadline.

use super::*;

impl Conn {
    /// Records the outcome of slot `s` and queues its response.
    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (conn/rx.rs module doc): finish takes slot numbers the connection made (alloc_slot, check_h2c, and the IoTag of a backend completion, which carries one)"
    )]
    pub fn finish(&mut self, s: u16, st: Status) {
        let slot = &mut self.slots[s as usize];
        debug_assert!(matches!(
            slot.phase,
            Phase::Executing | Phase::Held | Phase::AwaitData
        ));
        slot.status = st;
        slot.phase = Phase::Done;
        if st.is_success() {
            if self.queue.count(&slot.req, self.now_ns) && self.stats_since_ns == u64::MAX {
                self.stats_since_ns = self.now_ns;
            }
        } else {
            self.record_error(s, st);
        }
        if self.state == State::Closing {
            self.release(s);
        } else if self.tx.has_room() && self.backlog.is_empty() {
            self.queue_response(s);
        } else {
            self.backlog.push_back(s);
        }
    }

    /// Moves responses that waited for tx room into the queue.
    pub fn pump_backlog(&mut self) {
        while self.tx.has_room() {
            let Some(s) = self.backlog.pop_front() else {
                break;
            };
            self.queue_response(s);
        }
    }

    /// A backend failed slot `s`'s request: counted for `/metrics` (the log
    /// line is the backend's, rate-limited there).
    #[cold]
    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (conn/rx.rs module doc): a backend completion's slot"
    )]
    pub(super) fn count_backend_error(&self, s: u16) {
        let uid = self.slots[s as usize].req.ns_uid;
        if let Some(ns) = self.queue.ns.by_uid(uid) {
            ns.stats().backend_errors.fetch_add(1, Relaxed);
        }
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (conn/rx.rs module doc): finish's slot"
    )]
    pub(super) fn record_error(&mut self, s: u16, st: Status) {
        let Some(q) = &self.queue.q else { return };
        let slot = &self.slots[s as usize];
        q.ctrl.record_error(trellis_nvme::log::ErrorEntry {
            error_count: 0,
            sqid: q.qid,
            cid: slot.req.sqe.cid(),
            status: st.to_wire(),
            lba: slot.req.sqe.slba(),
            nsid: slot.req.sqe.nsid(),
        });
        if st.sct() == 2 {
            if let Some(ns) = self.queue.ns.by_uid(slot.req.ns_uid) {
                ns.stats().media_errors.fetch_add(1, Relaxed);
            }
        }
        tracing::debug!(qid = q.qid, "command {:?} failed: {st}", slot.req.sqe);
    }

    /// Adds batched statistics to the shared namespace counters.
    pub fn flush_stats(&mut self) {
        self.queue.flush_stats();
        self.stats_since_ns = u64::MAX;
    }

    pub(super) fn next_sqhd(&mut self) -> u16 {
        match &mut self.queue.q {
            Some(q) if q.sqflow_disabled => 0xFFFF,
            Some(q) => {
                q.sqhd = (q.sqhd + 1) % (q.sqsize + 1);
                q.sqhd
            }
            None => 0,
        }
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (conn/rx.rs module doc): finish's or the backlog's slot (pushed by finish); a zero_data read is at most mdts, below zeros() (MAX_IO_SIZE_LIMIT); push_bytes hands a PUSH_MAX (256) byte window"
    )]
    pub(super) fn queue_response(&mut self, s: u16) {
        let sqhd = self.next_sqhd();
        let sqid = self.queue.q.as_ref().map_or(0, |q| q.qid);
        let d = self.digests;
        let sqflow_disabled = self.queue.q.as_ref().is_some_and(|q| q.sqflow_disabled);
        let slot = &self.slots[s as usize];
        let credit = slot.req.credit;
        let cqe = Cqe {
            dw0: slot.req.dw0,
            dw1: match credit {
                NO_CREDIT => slot.req.dw1,
                // As Gimbal's target ([G], docs/gimbal.md §1.e): credits in DW1[15:0],
                // the command's CDW2[15:0] echoed in DW1[31:16].
                c => (trellis_nvme::le32(&slot.req.sqe.0, 8) & 0xFFFF) << 16 | c,
            },
            sqhd,
            sqid,
            cid: slot.req.sqe.cid(),
            status: slot.status,
        };
        if slot.req.to_host() && slot.status.is_success() {
            let len = slot.req.xfer_len;
            // SUCCESS saves the CapsuleResp, but only when the host disabled
            // SQ flow control and there is no result to return.
            // A credit the host already has needs no capsule either.
            let no_result = cqe.dw1 == 0 || (credit != NO_CREDIT && credit == self.last_credit);
            let success = sqflow_disabled && cqe.dw0 == 0 && no_result;
            let fl = flags::LAST_PDU | if success { flags::SUCCESS } else { 0 };
            let h = DataHdr {
                cccid: cqe.cid,
                ttag: 0,
                datao: 0,
                datal: len,
            };
            self.tx.push_bytes(NO_RELEASE, |b| {
                pdu::encode_data_hdr(b, PduType::C2HData, &h, fl, d)
            });
            let last_release = if success { s } else { NO_RELEASE };
            let src = if slot.req.zero_data { ZERO_SRC } else { s };
            if d.data {
                self.tx.push_data(src, 0, len, NO_RELEASE);
                let data = if slot.req.zero_data {
                    &zeros()[..len as usize]
                } else {
                    slot.req.buf.slice(len as usize)
                };
                let crc = trellis_nvme::crc::digest(data);
                self.tx.push_bytes(last_release, |b| {
                    b[..4].copy_from_slice(&crc.to_le_bytes());
                    4
                });
            } else {
                self.tx.push_data(src, 0, len, last_release);
            }
            if success {
                return;
            }
        }
        if credit != NO_CREDIT {
            self.last_credit = credit;
        }
        self.tx
            .push_bytes(s, |b| pdu::encode_capsule_resp(b, &cqe, d));
    }

    /// Frees a slot once its response has been sent.
    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (conn/rx.rs module doc): release tags are slot numbers queue_response pushed"
    )]
    pub fn release(&mut self, s: u16) {
        let slot = &mut self.slots[s as usize];
        debug_assert!(
            slot.phase == Phase::Done,
            "release of a slot in {:?}",
            slot.phase
        );
        slot.phase = Phase::Free;
        if let Some(g) = slot.grant.take() {
            self.pool_held_bytes -= g.bytes();
        }
        // Bounds what idle queues keep: `slot_buffer_keep`, `large_buffer_budget`.
        #[allow(
            clippy::cast_possible_truncation,
            reason = "TargetConfig::validate bounds slot_buffer_keep to 8 MiB"
        )]
        let keep = self.queue.reg.limits().slot_buffer_keep.0 as usize;
        if slot.req.buf.capacity() > keep {
            // Only large buffers are charged to the budget or freed; the
            // common small one is simply reused.
            slot.req.buf.shrink_to(keep, self.queue.reg.buffer_budget());
        }
        self.free.push(s);
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (conn/rx.rs module doc): source ids other than ZERO_SRC are slot numbers queue_response pushed"
    )]
    pub fn tx_iovecs(&self, out: &mut Vec<libc::iovec>, max: usize) {
        let slots = &self.slots;
        self.tx.fill_iovecs(out, max, |s| {
            if s == ZERO_SRC {
                zeros()
            } else {
                let b = &slots[s as usize].req.buf;
                b.slice(b.capacity())
            }
        });
    }

    pub fn tx_advance(&mut self, n: usize) {
        let mut done = std::mem::take(&mut self.released);
        self.tx.advance(n, |s| done.push(s));
        for &s in &done {
            self.release(s);
        }
        done.clear();
        self.released = done;
        self.pump_backlog();
        if n > 0 {
            // The peer reads: a stall, if any, starts over from here.
            self.tx_wait_since_ns = match self.has_output() {
                true => self.now_ns,
                false => u64::MAX,
            };
        }
    }

    /// Closes the connection once its queued output has waited
    /// `send_stall_timeout_ms` without the peer accepting a byte; starts
    /// that clock when output is found waiting. True when it closed.
    pub(super) fn check_send_stall(&mut self, now_ns: u64) -> bool {
        if !self.has_output() {
            self.tx_wait_since_ns = u64::MAX;
            return false;
        }
        if self.tx_wait_since_ns == u64::MAX {
            self.tx_wait_since_ns = now_ns;
            return false;
        }
        let limit_ns = self.queue.reg.limits().send_stall_timeout_ms * 1_000_000;
        if now_ns.saturating_sub(self.tx_wait_since_ns) <= limit_ns {
            return false;
        }
        if let Some(left_out) = self.close_log() {
            tracing::warn!(
                peer = %self.queue.peer,
                left_out,
                "peer accepted none of {} queued bytes for {} ms (target.send_stall_timeout_ms); closing",
                self.output_bytes(),
                self.queue.reg.limits().send_stall_timeout_ms
            );
        }
        self.close_as(
            CloseKind::Timeout,
            "peer stopped reading (send stall timeout)",
        );
        self.drop_output = true;
        true
    }
}
