//! The receive path: each PDU in, the ICReq exchange, command capsules and
//! their slots, R2T and H2CData (copied or received straight into the
//! command's buffer), and execution through the command table.
//!
//! Under `indexing_slicing` and `cast_possible_truncation` (issue 32 item
//! 8). This is the per-PDU path, so the bounds are proven rather than
//! checked again; each allowance names its proof. The two that recur:
//! - *received PDU*: `process` calls `on_pdu` only once `avail >= plen`,
//!   with `start` the head, so `start..start + plen` is received bytes, and
//!   `check_layout` gave `data_off + data_len (+ digest) <= plen` and
//!   `hlen == t.hlen()`, `plen >= hlen`.
//! - *slot index*: a slot number comes from `alloc_slot` (the free list,
//!   which holds only indices below `slots.len()`: `with_rx` and
//!   `size_slots` fill it from the range they add, and slots never shrink),
//!   from `check_h2c` (which checks it against `slots.len()`), or from a
//!   `Direct` that `start_direct` built from `check_h2c`'s answer. The
//!   slot numbers kept elsewhere (the backlog, `pool_wait`, the output
//!   queue's release tags and source ids, a backend request's `IoTag`, the
//!   held AERs) are copies of these.
#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use super::*;

impl Conn {
    #[allow(
        clippy::indexing_slicing,
        reason = "received PDU (module doc): process checked avail >= plen; \
                  check_layout bounded data_off + data_len + digest by plen and \
                  gave a CapsuleCmd hlen == 72 <= plen"
    )]
    pub(super) fn on_pdu(&mut self, ctx: &mut Ctx, l: &Layout, start: usize) -> Result<(), Fatal> {
        let pdu_bytes = &self.rx[start..start + l.plen];
        pdu::verify_header_digest(l, pdu_bytes)?;
        let ddgst_ok = !l.ddgst || {
            let data = &pdu_bytes[l.data_off..l.data_off + l.data_len];
            let want = trellis_nvme::le32(pdu_bytes, l.data_off + l.data_len);
            trellis_nvme::crc::digest(data) == want
        };
        let data = start + l.data_off..start + l.data_off + l.data_len;
        match l.pdu_type {
            PduType::IcReq => self.on_icreq(start),
            PduType::H2CTermReq => {
                let t = pdu::TermReq::decode(pdu_bytes);
                self.close_as(
                    CloseKind::ProtocolError,
                    &format!("host sent H2CTermReq FES {:#x} FEI {}", t.fes, t.fei),
                );
                Ok(())
            }
            PduType::CapsuleCmd => {
                let sqe = Sqe::from_slice(&pdu_bytes[8..72]);
                self.on_capsule(ctx, sqe, data, ddgst_ok)
            }
            PduType::H2CData => {
                let h = DataHdr::decode(pdu_bytes);
                self.on_h2c_data(ctx, h, l.flags, data, ddgst_ok)
            }
            _ => unreachable!("check_layout admits only host-to-controller types"),
        }
    }

    pub(super) fn on_icreq(&mut self, start: usize) -> Result<(), Fatal> {
        #[allow(
            clippy::indexing_slicing,
            reason = "received PDU: check_layout (ic_or_term_layout) admits an ICReq \
                      only with plen == IC_LEN, and process checked avail >= plen"
        )]
        let r = IcReq::decode(&self.rx[start..start + pdu::IC_LEN]);
        if r.pfv != 0 {
            return Err(Fatal::new(fes::INVALID_HEADER_FIELD, 8));
        }
        if r.hpda > 31 {
            return Err(Fatal::new(fes::INVALID_HEADER_FIELD, 10));
        }
        // Echo exactly the digests asked for: Linux fails on any mismatch.
        self.digests = r.digests;
        let resp = IcResp {
            pfv: 0,
            cpda: 0,
            digests: r.digests,
            #[allow(
                clippy::cast_possible_truncation,
                reason = "TargetConfig::validate bounds max_h2c_data to 1 MiB"
            )]
            maxh2cdata: self.queue.reg.limits().max_h2c_data.0 as u32,
        };
        self.tx.push_bytes(NO_RELEASE, |b| {
            let mut a = [0u8; pdu::IC_LEN];
            resp.encode(&mut a);
            #[allow(
                clippy::indexing_slicing,
                reason = "push_bytes hands a PUSH_MAX (256) byte window; IC_LEN is 128"
            )]
            b[..pdu::IC_LEN].copy_from_slice(&a);
            pdu::IC_LEN
        });
        self.state = State::Ready;
        Ok(())
    }

    pub(super) fn alloc_slot(&mut self) -> Result<u16, Fatal> {
        // A host that exceeds the queue size it connected with breaks the
        // protocol; there is no status to answer with, so end the connection.
        self.free
            .pop()
            .ok_or(Fatal::new(fes::PDU_SEQUENCE_ERROR, 0))
    }

    pub(super) fn icd_limit(&self, sqe: &Sqe) -> usize {
        match &self.queue.q {
            Some(q)
                if q.kind == QueueKind::Io && sqe.opcode() != trellis_nvme::sqe::io::FABRICS =>
            {
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "TargetConfig::validate bounds in_capsule_data to 64 KiB"
                )]
                let icd = self.queue.reg.limits().in_capsule_data.0 as usize;
                icd
            }
            _ => ADMIN_ICD_BYTES,
        }
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (module doc): s is alloc_slot's; self.rx[data] is \
                  received PDU, data being on_pdu's range"
    )]
    #[allow(
        clippy::cast_possible_truncation,
        reason = "data.start is a position in the receive buffer, whose capacity \
                  (with_rx) is under 2 MiB by TargetConfig::validate's limits"
    )]
    pub(super) fn on_capsule(
        &mut self,
        ctx: &mut Ctx,
        sqe: Sqe,
        data: std::ops::Range<usize>,
        ddgst_ok: bool,
    ) -> Result<(), Fatal> {
        let icd_len = data.len();
        if icd_len > self.icd_limit(&sqe) {
            return Err(Fatal::new(fes::DATA_LIMIT_EXCEEDED, 0));
        }
        let sgl = sqe.sgl();
        // Check the framing before taking a slot: these are fatal.
        match sgl.id {
            sgl_id::DATA_BLOCK_OFFSET if sgl.length as usize != icd_len => {
                return Err(Fatal::new(fes::INVALID_HEADER_FIELD, field::PLEN));
            }
            sgl_id::TRANSPORT_DATA_BLOCK if icd_len > 0 => {
                // Data in the capsule but a descriptor that says otherwise.
                return Err(Fatal::new(fes::UNSUPPORTED_PARAMETER, 8 + 24 + 15));
            }
            _ => {}
        }
        let s = self.alloc_slot()?;
        let slot = &mut self.slots[s as usize];
        slot.req.reset(sqe, self.now_ns);
        slot.req.tag = crate::backend::IoTag::new(self.idx, s);
        slot.phase = Phase::Executing;
        slot.recv_len = 0;
        slot.h2c_error = false;
        slot.icd_at = NO_ICD;
        if let Err(st) = self.check_data(s, icd_len) {
            let why = if st == generic::COMMAND_SEQUENCE_ERROR.dnr() {
                "only Connect may come first on a queue"
            } else {
                "malformed data descriptor"
            };
            self.refused_before_connect(st, why);
            self.finish(s, st);
            return Ok(());
        }
        if icd_len > 0 && !ddgst_ok {
            // A data digest error on received data is retryable (NVMe/TCP §7.4.6.1).
            self.finish(s, generic::TRANSIENT_TRANSPORT_ERROR);
            return Ok(());
        }
        // Parse once, before any data moves: no R2T goes out for a command
        // that will fail anyway, and the handler does not check again.
        if let Err(st) = cmd::parse(&self.queue, &mut self.slots[s as usize].req) {
            self.refused_before_connect(st, "command refused before its handler");
            self.finish(s, st);
            return Ok(());
        }
        if self.needs_pool(self.slots[s as usize].req.xfer_len) && !self.admit_transfer(s) {
            return Ok(()); // waits for pool room; `pump_pool` resumes it
        }
        let slot = &mut self.slots[s as usize];
        if slot.req.xfer_len > 0 && slot.req.cmd.dir == Dir::ToCtrl {
            if icd_len > 0 && slot.req.cmd.icd_in_place {
                // Left in the receive buffer (not compacted while we parse);
                // the handler copies it only for an asynchronous backend.
                slot.icd_at = data.start as u32;
            } else if icd_len > 0 {
                slot.req
                    .buf
                    .slice_mut(icd_len)
                    .copy_from_slice(&self.rx[data]);
            } else if self.queue.q.is_none() {
                // Connect carries its data in the capsule (the admin queue's
                // in-capsule data size covers it): anything else is out of order.
                let st = generic::COMMAND_SEQUENCE_ERROR.dnr();
                self.refused_before_connect(st, "Connect data not in the capsule");
                self.finish(s, st);
                return Ok(());
            } else {
                self.start_r2t(s);
                return Ok(());
            }
        }
        self.execute(ctx, s);
        Ok(())
    }

    /// On a queue not yet connected, every failed command is a refused
    /// Connect (or a command before Connect): logged at info like the
    /// refusals the Connect handler makes, so an operator sees why a host
    /// cannot connect, and limited by the same bucket.
    pub(super) fn refused_before_connect(&self, st: Status, why: &str) {
        if self.queue.q.is_none() {
            if let Some(left_out) = self.queue.reg.log_limits().connect.admit() {
                tracing::info!(peer = %self.queue.peer, left_out, "connect refused: {why} ({st})");
            }
        }
    }

    /// Transport-level checks of SGL1 against the command's row (direction,
    /// in-capsule data, MDTS); sets the request's row and sizes its buffer.
    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (module doc): on_capsule passes alloc_slot's s"
    )]
    #[allow(
        clippy::cast_possible_truncation,
        reason = "max_io_size is at most MAX_IO_SIZE_LIMIT (8 MiB, \
                  TargetConfig::validate), and len <= mdts is checked before \
                  len is cast"
    )]
    pub(super) fn check_data(&mut self, s: u16, icd_len: usize) -> Result<(), Status> {
        let mdts = self.queue.reg.limits().max_io_size.0 as usize;
        let sqe = self.slots[s as usize].req.sqe;
        let sgl = sqe.sgl();
        let len = match sgl.id {
            sgl_id::DATA_BLOCK_OFFSET => {
                if sgl.address != 0 {
                    return Err(generic::SGL_OFFSET_INVALID.dnr());
                }
                icd_len
            }
            sgl_id::TRANSPORT_DATA_BLOCK => sgl.length as usize,
            // An all-zero descriptor is a harmless "no data".
            0 if sgl.length == 0 => 0,
            _ => return Err(generic::SGL_TYPE_INVALID.dnr()),
        };
        if sqe.fuse() != 0 || sqe.psdt() != 1 {
            return Err(generic::INVALID_FIELD.dnr());
        }
        let row = cmd::find(&self.queue, &sqe);
        let dir = row.map_or_else(|_| cmd::opcode_dir(&sqe), |c| c.dir);
        if (len > 0 && dir == Dir::None) || (icd_len > 0 && dir != Dir::ToCtrl) || len > mdts {
            return Err(generic::INVALID_FIELD.dnr());
        }
        let pooled = self.needs_pool(len as u32);
        let req = &mut self.slots[s as usize].req;
        req.cmd = row?;
        req.xfer_len = len as u32;
        // Large transfers get their buffer once the pool admits them (`wait.rs`).
        if len > 0 && !pooled {
            req.buf.ensure(len);
        }
        Ok(())
    }

    /// Asks for the write data of a parsed command.
    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (module doc): callers pass alloc_slot's s"
    )]
    pub(super) fn start_r2t(&mut self, s: u16) {
        self.data_wait_started(s);
        let slot = &mut self.slots[s as usize];
        slot.phase = Phase::AwaitData;
        let r = pdu::R2t {
            cccid: slot.req.sqe.cid(),
            ttag: s,
            r2to: 0,
            r2tl: slot.req.xfer_len,
        };
        let d = self.digests;
        self.tx
            .push_bytes(NO_RELEASE, |b| pdu::encode_r2t(b, &r, d));
    }

    /// Checks an H2CData header against the command it answers; returns
    /// the slot. `data_len` is the payload length its PDU carries.
    pub(super) fn check_h2c(&self, h: &DataHdr, data_len: usize) -> Result<u16, Fatal> {
        let s = h.ttag;
        let slot = match self.slots.get(s as usize) {
            Some(slot) if slot.phase == Phase::AwaitData && slot.req.sqe.cid() == h.cccid => slot,
            _ => return Err(Fatal::new(fes::PDU_SEQUENCE_ERROR, 0)),
        };
        if h.datal as usize != data_len {
            return Err(Fatal::new(fes::INVALID_HEADER_FIELD, 16));
        }
        if h.datal as u64 > self.queue.reg.limits().max_h2c_data.0 {
            return Err(Fatal::new(fes::DATA_LIMIT_EXCEEDED, 0));
        }
        if h.datao != slot.recv_len || h.datao as u64 + h.datal as u64 > slot.req.xfer_len as u64 {
            return Err(Fatal::new(fes::DATA_OUT_OF_RANGE, 0));
        }
        Ok(s)
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (module doc): check_h2c's s; check_h2c proved \
                  datao + datal <= xfer_len with datal == data.len(), and \
                  self.rx[data] is received PDU"
    )]
    pub(super) fn on_h2c_data(
        &mut self,
        ctx: &mut Ctx,
        h: DataHdr,
        fl: u8,
        data: std::ops::Range<usize>,
        ddgst_ok: bool,
    ) -> Result<(), Fatal> {
        let s = self.check_h2c(&h, data.len())?;
        let slot = &mut self.slots[s as usize];
        let (off, xfer_len) = (h.datao as usize, slot.req.xfer_len as usize);
        slot.req.buf.slice_mut(xfer_len)[off..off + data.len()].copy_from_slice(&self.rx[data]);
        self.h2c_received(ctx, s, h.datal, fl, ddgst_ok);
        Ok(())
    }

    /// `n` more bytes of slot `s`'s write data have arrived.
    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (module doc): check_h2c's s, or a Direct's"
    )]
    pub(super) fn h2c_received(&mut self, ctx: &mut Ctx, s: u16, n: u32, fl: u8, ddgst_ok: bool) {
        let slot = &mut self.slots[s as usize];
        slot.recv_len += n;
        slot.h2c_error |= !ddgst_ok;
        if slot.recv_len == slot.req.xfer_len {
            self.data_wait_ended();
            let slot = &mut self.slots[s as usize];
            if fl & flags::LAST_PDU == 0 {
                tracing::debug!(
                    "last H2CData of cid {:#x} lacks LAST_PDU",
                    slot.req.sqe.cid()
                );
            }
            slot.phase = Phase::Executing;
            if slot.h2c_error {
                self.finish(s, generic::TRANSIENT_TRANSPORT_ERROR);
            } else {
                self.execute(ctx, s);
            }
        }
    }

    /// An H2CData PDU whose header has arrived but whose payload has not:
    /// checks the header, takes the payload bytes already received, and
    /// points `rx_space` at the command's buffer for the rest, so large
    /// write data is received straight into place (no copy through the
    /// receive buffer). `false`: not eligible, wait for the whole PDU.
    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (module doc): check_h2c's s; check_h2c proved \
                  datao + data_len <= xfer_len, and have <= data_len, \
                  have <= rx.len()"
    )]
    #[allow(
        clippy::cast_possible_truncation,
        reason = "start <= next <= end <= xfer_len, a u32 (check_h2c)"
    )]
    pub(super) fn start_direct(&mut self, l: &Layout) -> Result<bool, Fatal> {
        if l.pdu_type != PduType::H2CData
            || l.data_len < DIRECT_MIN_BYTES
            || self.rx.len() < l.data_off
        {
            return Ok(false);
        }
        let hdr = self.rx.pending();
        pdu::verify_header_digest(l, hdr)?;
        let h = DataHdr::decode(hdr);
        let s = self.check_h2c(&h, l.data_len)?;
        self.rx.consume(l.data_off);
        let slot = &mut self.slots[s as usize];
        let (start, end) = (h.datao as usize, h.datao as usize + l.data_len);
        let have = self.rx.len().min(l.data_len);
        let out = &mut slot.req.buf.slice_mut(slot.req.xfer_len as usize)[start..start + have];
        out.copy_from_slice(&self.rx.pending()[..have]);
        self.rx.consume(have);
        self.direct = Some(Direct {
            slot: s,
            start: start as u32,
            next: (start + have) as u32,
            end: end as u32,
            flags: l.flags,
            ddgst: l.ddgst,
        });
        Ok(true)
    }

    /// Finishes a direct H2CData once its payload (and data digest) is in.
    /// `false`: still waiting for bytes.
    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (module doc): a Direct's slot; start_direct built \
                  start..end within xfer_len from check_h2c"
    )]
    pub(super) fn end_direct(&mut self, ctx: &mut Ctx) -> bool {
        let Some(d) = self.direct else { return true };
        if d.next < d.end || (d.ddgst && self.rx.len() < pdu::DIGEST_LEN) {
            return false;
        }
        self.direct = None;
        let slot = &self.slots[d.slot as usize];
        let data =
            &slot.req.buf.slice(slot.req.xfer_len as usize)[d.start as usize..d.end as usize];
        let ok = !d.ddgst || {
            let want = trellis_nvme::le32(self.rx.pending(), 0);
            self.rx.consume(pdu::DIGEST_LEN);
            trellis_nvme::crc::digest(data) == want
        };
        self.h2c_received(ctx, d.slot, d.end - d.start, d.flags, ok);
        true
    }

    /// Runs the request's handler from the command table.
    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (module doc); icd_at is set only by on_capsule, \
                  to a received PDU's data range of icd_len == xfer_len bytes \
                  (check_data: DATA_BLOCK_OFFSET), left in place until the \
                  next rx_space, and execute runs before that returns"
    )]
    pub(super) fn execute(&mut self, ctx: &mut Ctx, s: u16) {
        let slot = &mut self.slots[s as usize];
        let icd: &[u8] = match slot.icd_at {
            NO_ICD => &[],
            at => &self.rx[at as usize..at as usize + slot.req.xfer_len as usize],
        };
        // A context for this command only: the same reactor state plus the
        // command's in-capsule data, which stays put until the handler returns.
        let mut c = Ctx {
            now_ns: ctx.now_ns,
            queues: &mut *ctx.queues,
            reg: ctx.reg,
            scratch: &mut *ctx.scratch,
            icd,
            auth: ctx.auth,
        };
        let req = &mut slot.req;
        let connect = req.cmd.opcode == trellis_nvme::sqe::admin::FABRICS;
        let r = (req.cmd.exec)(&mut self.queue, &mut c, req);
        match r {
            Exec::Done(st) => self.finish(s, st),
            Exec::DoneWith(st, dw0, dw1) => {
                let req = &mut self.slots[s as usize].req;
                req.dw0 = dw0;
                req.dw1 = dw1;
                self.finish(s, st);
            }
            Exec::Pending => self.backend_in_flight += 1,
            Exec::Held => self.slots[s as usize].phase = Phase::Held,
        }
        if let (true, Some(q)) = (connect, &self.queue.q) {
            // Connect fixed the queue size: a host may use every entry.
            let sqsize = q.sqsize;
            self.size_slots(sqsize);
        }
    }
}
