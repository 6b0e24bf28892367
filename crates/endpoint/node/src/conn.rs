//! One NVMe/TCP connection (one queue), as a sans-IO state machine.
//!
//! The reactor moves bytes: it `recv`s into [`Conn::rx_space`], calls
//! [`Conn::process`], and `sendmsg`s what [`Conn::tx_iovecs`] lists. Everything
//! protocol-shaped happens here: PDU framing and validation, the ICReq
//! exchange, command slots, R2T/H2CData reassembly, responses, and fatal
//! errors (a C2HTermReq, then close of this connection only).

use crate::backend::BackendQueue;
use crate::buf::AlignedBuf;
use crate::config::ListenerKind;
use crate::subsystem::{Controller, Namespace, Registry};
use crate::tx::{Tx, NO_RELEASE};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use trellis_nvme::pdu::{
    self, fes, field, flags, CommonHeader, DataHdr, Digests, Fatal, IcReq, IcResp, Layout, PduType,
};
use trellis_nvme::status::generic;
use trellis_nvme::{sqe::sgl_id, Cqe, Sqe, Status};

/// In-capsule data accepted on admin queues and for Connect on any queue.
pub const ADMIN_ICD_BYTES: usize = 8192;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    AwaitIcReq,
    Ready,
    /// A fatal error was answered with a TermReq: stop reading, close once sent.
    Closing,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Free,
    /// Waiting for H2CData after an R2T.
    AwaitData,
    Executing,
    /// Held until an asynchronous event (AER).
    Held,
    /// Response queued or waiting for tx room.
    Done,
}

/// Per-command state, pre-allocated at Connect and reused.
pub struct Slot {
    pub sqe: Sqe,
    pub phase: Phase,
    pub buf: AlignedBuf,
    /// Transfer length from SGL1.
    pub xfer_len: u32,
    pub recv_len: u32,
    /// Data digest failure seen while receiving H2C data.
    pub h2c_error: bool,
    /// On success, `xfer_len` bytes of `buf` go to the host.
    pub to_host: bool,
    pub status: Status,
    pub dw0: u32,
    pub dw1: u32,
    /// Namespace uid and whether this is a write, for batched statistics.
    pub ns_uid: u32,
    pub is_write: bool,
    /// The read's data is all zeroes (null backend): sent from a shared zero
    /// buffer, so the slot buffer is neither cleared nor touched.
    pub zero_data: bool,
    /// Offset of in-capsule write data still in the receive buffer (or
    /// `NO_ICD`): a synchronous backend takes it from there without a copy.
    pub icd_at: u32,
}

pub const NO_ICD: u32 = u32::MAX;
/// `Tx` data source meaning "the shared zero buffer".
pub const ZERO_SRC: u16 = u16::MAX - 1;

/// Zeroes for null-backend reads: allocated zeroed, so the pages are the
/// kernel's shared zero page until written (never), costing no memory.
fn zeros() -> &'static [u8] {
    static Z: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    Z.get_or_init(|| vec![0u8; crate::config::MAX_IO_SIZE_LIMIT as usize])
}

impl Slot {
    fn new() -> Slot {
        Slot {
            sqe: Sqe::default(),
            phase: Phase::Free,
            buf: AlignedBuf::empty(),
            xfer_len: 0,
            recv_len: 0,
            h2c_error: false,
            to_host: false,
            status: Status::SUCCESS,
            dw0: 0,
            dw1: 0,
            ns_uid: u32::MAX,
            is_write: false,
            zero_data: false,
            icd_at: NO_ICD,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueKind {
    Admin,
    Io,
}

/// What Connect established.
pub struct QueueCtx {
    pub qid: u16,
    pub sqsize: u16,
    pub kind: QueueKind,
    pub ctrl: Arc<Controller>,
    pub sqflow_disabled: bool,
    pub sqhd: u16,
}

/// How a command handler finished.
pub enum Exec {
    Done(Status),
    /// Done with result dwords (Connect, Property Get, features).
    DoneWith(Status, u32, u32),
    /// Submitted to the backend; completes via `backend_done`.
    Pending,
    /// Parked (AER).
    Held,
}

/// Everything a connection borrows from its reactor while processing.
pub struct Ctx<'a> {
    pub now_ns: u64,
    pub queues: &'a mut Vec<Option<Box<dyn BackendQueue>>>,
    pub reg: &'a Registry,
    pub scratch: &'a mut Vec<u8>,
}

impl Ctx<'_> {
    /// The reactor's queue for namespace `ns`, opened on first use.
    pub fn queue(&mut self, ns: &Namespace) -> Option<&mut Box<dyn BackendQueue>> {
        if self.queues.len() <= ns.uid {
            self.queues.resize_with(ns.uid + 1, || None);
        }
        if self.queues[ns.uid].is_none() {
            match ns.backend.open_queue() {
                Ok(q) => self.queues[ns.uid] = Some(q),
                Err(e) => {
                    tracing::error!("cannot open backend queue for nsid {}: {e}", ns.nsid);
                    return None;
                }
            }
        }
        self.queues[ns.uid].as_mut()
    }
}

/// Statistics gathered per connection and added to the shared counters in
/// batches, so reactors do not bounce shared cache lines per I/O.
#[derive(Default)]
pub struct LocalStats {
    pub pending: Vec<(u32, u64, u64, u64, u64)>, // (ns uid, rd bytes, wr bytes, rd cmds, wr cmds)
}

pub struct Conn {
    pub idx: u32,
    pub reg: Arc<Registry>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub listener_kind: ListenerKind,
    pub portid: u16,
    pub state: State,
    pub digests: Digests,
    pub(crate) rx: Box<[u8]>,
    rx_head: usize,
    rx_tail: usize,
    max_plen: usize,
    pub tx: Tx,
    pub q: Option<QueueCtx>,
    pub slots: Vec<Slot>,
    free: Vec<u16>,
    backlog: std::collections::VecDeque<u16>,
    pub created_ns: u64,
    pub last_rx_ns: u64,
    pub close_reason: Option<String>,
    pub backend_in_flight: usize,
    stats: Vec<(u32, [u64; 4])>,
    /// Admin slots parked as AERs.
    pub aers: Vec<u16>,
    /// Scratch list of slots released by one `tx_advance` (kept to avoid allocating).
    released: Vec<u16>,
}

impl Conn {
    pub fn new(
        idx: u32,
        reg: Arc<Registry>,
        peer: SocketAddr,
        local: SocketAddr,
        listener_kind: ListenerKind,
        portid: u16,
        now_ns: u64,
    ) -> Conn {
        let l = &reg.limits;
        // The largest PDU we accept: an H2CData of MAXH2CDATA or a capsule
        // with the largest in-capsule data, plus header, digests and padding.
        let icd = (l.in_capsule_data.0 as usize).max(ADMIN_ICD_BYTES);
        let max_plen = (l.max_h2c_data.0 as usize).max(icd) + pdu::MAX_HDR_LEN + 128 + 8;
        // Admin queues start with 32 slots; Connect resizes for I/O queues.
        let slots: Vec<Slot> = (0..64).map(|_| Slot::new()).collect();
        let free = (0..slots.len() as u16).rev().collect();
        Conn {
            idx,
            reg,
            peer,
            local,
            listener_kind,
            portid,
            state: State::AwaitIcReq,
            digests: Digests::default(),
            rx: vec![0u8; max_plen + (64 << 10)].into_boxed_slice(),
            rx_head: 0,
            rx_tail: 0,
            max_plen,
            tx: Tx::default(),
            q: None,
            slots,
            free,
            backlog: Default::default(),
            created_ns: now_ns,
            last_rx_ns: now_ns,
            close_reason: None,
            backend_in_flight: 0,
            stats: Vec::new(),
            aers: Vec::new(),
            released: Vec::with_capacity(64),
        }
    }

    pub fn ctrl(&self) -> Option<&Arc<Controller>> {
        self.q.as_ref().map(|q| &q.ctrl)
    }

    /// Free space to `recv` into. Compacts the buffer when the tail is near the end.
    pub fn rx_space(&mut self) -> &mut [u8] {
        if self.rx_head == self.rx_tail {
            self.rx_head = 0;
            self.rx_tail = 0;
        } else if self.rx.len() - self.rx_tail < self.max_plen {
            self.rx.copy_within(self.rx_head..self.rx_tail, 0);
            self.rx_tail -= self.rx_head;
            self.rx_head = 0;
        }
        &mut self.rx[self.rx_tail..]
    }

    pub fn rx_commit(&mut self, n: usize, now_ns: u64) {
        debug_assert!(self.rx_tail + n <= self.rx.len());
        self.rx_tail += n;
        self.last_rx_ns = now_ns;
    }

    /// Unparsed input is waiting (e.g. parsing stopped for lack of tx room).
    pub fn rx_pending(&self) -> bool {
        self.rx_tail - self.rx_head >= pdu::CH_LEN && self.state != State::Closing
    }

    pub fn wants_close(&self) -> bool {
        self.state == State::Closing && self.tx.is_empty()
    }

    /// Parses and handles every complete PDU in the receive buffer.
    pub fn process(&mut self, ctx: &mut Ctx) {
        while self.state != State::Closing && self.tx.has_room() {
            let avail = self.rx_tail - self.rx_head;
            let Some(ch) = CommonHeader::decode(&self.rx[self.rx_head..self.rx_tail]) else {
                break;
            };
            if self.state == State::AwaitIcReq && avail >= 1 && self.rx[self.rx_head] == 0x16 {
                // A TLS ClientHello on a plain port: close without parsing it.
                self.close_quietly("TLS handshake on a non-TLS listener");
                return;
            }
            let layout = match pdu::check_layout(
                &ch,
                true,
                self.state == State::AwaitIcReq,
                self.digests,
                self.max_plen,
            ) {
                Ok(l) => l,
                Err(f) => return self.fatal(f),
            };
            if avail < layout.plen {
                break;
            }
            let start = self.rx_head;
            self.rx_head += layout.plen;
            if let Err(f) = self.on_pdu(ctx, &layout, start) {
                // Report the offending header from where it was in the buffer.
                let hdr_end = start + layout.hlen.min(pdu::TERM_MAX_PLEN - pdu::SMALL_HLEN);
                let offending: Vec<u8> = self.rx[start..hdr_end].to_vec();
                return self.fatal_with(f, &offending);
            }
        }
    }

    fn on_pdu(&mut self, ctx: &mut Ctx, l: &Layout, start: usize) -> Result<(), Fatal> {
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
                self.close_quietly(&format!(
                    "host sent H2CTermReq FES {:#x} FEI {}",
                    t.fes, t.fei
                ));
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

    fn on_icreq(&mut self, start: usize) -> Result<(), Fatal> {
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
            maxh2cdata: self.reg.limits.max_h2c_data.0 as u32,
        };
        self.tx.push_bytes(NO_RELEASE, |b| {
            let mut a = [0u8; pdu::IC_LEN];
            resp.encode(&mut a);
            b[..pdu::IC_LEN].copy_from_slice(&a);
            pdu::IC_LEN
        });
        self.state = State::Ready;
        Ok(())
    }

    fn alloc_slot(&mut self) -> Result<u16, Fatal> {
        // A host that exceeds the queue size it connected with breaks the
        // protocol; there is no status to answer with, so end the connection.
        self.free
            .pop()
            .ok_or(Fatal::new(fes::PDU_SEQUENCE_ERROR, 0))
    }

    fn icd_limit(&self, sqe: &Sqe) -> usize {
        match &self.q {
            Some(q)
                if q.kind == QueueKind::Io && sqe.opcode() != trellis_nvme::sqe::io::FABRICS =>
            {
                self.reg.limits.in_capsule_data.0 as usize
            }
            _ => ADMIN_ICD_BYTES,
        }
    }

    fn on_capsule(
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
        slot.sqe = sqe;
        slot.phase = Phase::Executing;
        slot.xfer_len = 0;
        slot.recv_len = 0;
        slot.h2c_error = false;
        slot.to_host = false;
        slot.dw0 = 0;
        slot.dw1 = 0;
        slot.ns_uid = u32::MAX;
        slot.is_write = false;
        slot.zero_data = false;
        slot.icd_at = NO_ICD;
        if let Err(st) = self.check_data(s, icd_len) {
            self.finish(s, st);
            return Ok(());
        }
        if icd_len > 0 && !ddgst_ok {
            // A data digest error on received data is retryable (NVMe/TCP §7.4.6.1).
            self.finish(s, generic::TRANSIENT_TRANSPORT_ERROR);
            return Ok(());
        }
        let slot = &mut self.slots[s as usize];
        let len = slot.xfer_len as usize;
        if len > 0 && !slot.to_host {
            let io_write = sqe.opcode() == trellis_nvme::sqe::io::WRITE
                && self.q.as_ref().is_some_and(|q| q.kind == QueueKind::Io);
            if icd_len > 0 && io_write {
                // Left in the receive buffer (not compacted while we parse);
                // exec_io copies it only for an asynchronous backend.
                slot.icd_at = data.start as u32;
            } else if icd_len > 0 {
                slot.buf.slice_mut(len).copy_from_slice(&self.rx[data]);
            } else {
                return self.start_r2t(ctx, s);
            }
        }
        self.execute(ctx, s);
        Ok(())
    }

    /// Validates SGL1 against the opcode's data direction and the limits,
    /// and sizes the slot's buffer.
    fn check_data(&mut self, s: u16, icd_len: usize) -> Result<(), Status> {
        let mdts = self.reg.limits.max_io_size.0 as usize;
        let slot = &mut self.slots[s as usize];
        let sqe = slot.sqe;
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
        let dir = data_direction(&sqe);
        if len > 0 && !(dir == 1 || dir == 2) {
            return Err(generic::INVALID_FIELD.dnr());
        }
        if icd_len > 0 && dir != 1 {
            return Err(generic::INVALID_FIELD.dnr());
        }
        if len > mdts {
            return Err(generic::INVALID_FIELD.dnr());
        }
        slot.xfer_len = len as u32;
        slot.to_host = dir == 2 && len > 0;
        if len > 0 {
            slot.buf.ensure(len);
        }
        Ok(())
    }

    /// Asks for the write data. Commands are validated first so that no R2T
    /// goes out for a command that will fail anyway.
    fn start_r2t(&mut self, ctx: &mut Ctx, s: u16) -> Result<(), Fatal> {
        if let Err(st) = self.precheck_write(ctx, s) {
            self.finish(s, st);
            return Ok(());
        }
        let slot = &mut self.slots[s as usize];
        slot.phase = Phase::AwaitData;
        let r = pdu::R2t {
            cccid: slot.sqe.cid(),
            ttag: s,
            r2to: 0,
            r2tl: slot.xfer_len,
        };
        let d = self.digests;
        self.tx
            .push_bytes(NO_RELEASE, |b| pdu::encode_r2t(b, &r, d));
        Ok(())
    }

    fn on_h2c_data(
        &mut self,
        ctx: &mut Ctx,
        h: DataHdr,
        fl: u8,
        data: std::ops::Range<usize>,
        ddgst_ok: bool,
    ) -> Result<(), Fatal> {
        let s = h.ttag;
        let ok = (s as usize) < self.slots.len() && {
            let slot = &self.slots[s as usize];
            slot.phase == Phase::AwaitData && slot.sqe.cid() == h.cccid
        };
        if !ok {
            return Err(Fatal::new(fes::PDU_SEQUENCE_ERROR, 0));
        }
        if h.datal as usize != data.len() {
            return Err(Fatal::new(fes::INVALID_HEADER_FIELD, 16));
        }
        if h.datal as u64 > self.reg.limits.max_h2c_data.0 {
            return Err(Fatal::new(fes::DATA_LIMIT_EXCEEDED, 0));
        }
        let slot = &mut self.slots[s as usize];
        if h.datao != slot.recv_len || h.datao as u64 + h.datal as u64 > slot.xfer_len as u64 {
            return Err(Fatal::new(fes::DATA_OUT_OF_RANGE, 0));
        }
        let off = h.datao as usize;
        slot.buf.slice_mut(slot.xfer_len as usize)[off..off + data.len()]
            .copy_from_slice(&self.rx[data]);
        slot.recv_len += h.datal;
        slot.h2c_error |= !ddgst_ok;
        if slot.recv_len == slot.xfer_len {
            if fl & flags::LAST_PDU == 0 {
                tracing::debug!("last H2CData of cid {:#x} lacks LAST_PDU", h.cccid);
            }
            slot.phase = Phase::Executing;
            if slot.h2c_error {
                self.finish(s, generic::TRANSIENT_TRANSPORT_ERROR);
            } else {
                self.execute(ctx, s);
            }
        }
        Ok(())
    }

    fn execute(&mut self, ctx: &mut Ctx, s: u16) {
        let sqe = self.slots[s as usize].sqe;
        let r = match self.q.as_ref().map(|q| q.kind) {
            None => self.exec_unconnected(ctx, s, &sqe),
            Some(QueueKind::Admin) => self.exec_admin(ctx, s, &sqe),
            Some(QueueKind::Io) => self.exec_io(ctx, s, &sqe),
        };
        match r {
            Exec::Done(st) => self.finish(s, st),
            Exec::DoneWith(st, dw0, dw1) => {
                let slot = &mut self.slots[s as usize];
                slot.dw0 = dw0;
                slot.dw1 = dw1;
                self.finish(s, st);
            }
            Exec::Pending => self.backend_in_flight += 1,
            Exec::Held => self.slots[s as usize].phase = Phase::Held,
        }
    }

    /// Only Connect may come first on a queue.
    fn exec_unconnected(&mut self, ctx: &mut Ctx, s: u16, sqe: &Sqe) -> Exec {
        use trellis_nvme::fabrics::fctype;
        if sqe.opcode() == trellis_nvme::sqe::admin::FABRICS && sqe.fctype() == fctype::CONNECT {
            return self.connect(ctx, s, sqe);
        }
        Exec::Done(generic::COMMAND_SEQUENCE_ERROR.dnr())
    }

    /// A backend request of slot `s` finished.
    pub fn backend_done(&mut self, s: u16, st: Status) {
        debug_assert!(self.backend_in_flight > 0);
        self.backend_in_flight -= 1;
        self.finish(s, st);
    }

    /// Records the outcome of slot `s` and queues its response.
    pub fn finish(&mut self, s: u16, st: Status) {
        let slot = &mut self.slots[s as usize];
        debug_assert!(matches!(
            slot.phase,
            Phase::Executing | Phase::Held | Phase::AwaitData
        ));
        slot.status = st;
        slot.phase = Phase::Done;
        if st.is_success() {
            self.count(s);
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

    fn record_error(&mut self, s: u16, st: Status) {
        let Some(q) = &self.q else { return };
        let slot = &self.slots[s as usize];
        q.ctrl.record_error(trellis_nvme::log::ErrorEntry {
            error_count: 0,
            sqid: q.qid,
            cid: slot.sqe.cid(),
            status: st.to_wire(),
            lba: slot.sqe.slba(),
            nsid: slot.sqe.nsid(),
        });
        if st.sct() == 2 && slot.ns_uid != u32::MAX {
            let ns = &self.reg.namespaces[slot.ns_uid as usize];
            ns.stats.media_errors.fetch_add(1, Relaxed);
        }
        tracing::debug!(qid = q.qid, "command {:?} failed: {st}", slot.sqe);
    }

    fn count(&mut self, s: u16) {
        let slot = &self.slots[s as usize];
        let rw = matches!(
            slot.sqe.opcode(),
            trellis_nvme::sqe::io::READ | trellis_nvme::sqe::io::WRITE
        );
        if slot.ns_uid == u32::MAX || !rw || self.q.as_ref().is_some_and(|q| q.qid == 0) {
            return;
        }
        let (uid, len, w) = (slot.ns_uid, slot.xfer_len as u64, slot.is_write);
        let e = match self.stats.iter_mut().find(|e| e.0 == uid) {
            Some(e) => e,
            None => {
                self.stats.push((uid, [0; 4]));
                self.stats.last_mut().unwrap()
            }
        };
        if w {
            e.1[1] += len;
            e.1[3] += 1;
        } else {
            e.1[0] += len;
            e.1[2] += 1;
        }
    }

    /// Adds batched statistics to the shared namespace counters.
    pub fn flush_stats(&mut self) {
        for (uid, v) in self.stats.drain(..) {
            let st = &self.reg.namespaces[uid as usize].stats;
            st.read_bytes.fetch_add(v[0], Relaxed);
            st.write_bytes.fetch_add(v[1], Relaxed);
            st.read_cmds.fetch_add(v[2], Relaxed);
            st.write_cmds.fetch_add(v[3], Relaxed);
        }
    }

    fn next_sqhd(&mut self) -> u16 {
        match &mut self.q {
            Some(q) if q.sqflow_disabled => 0xFFFF,
            Some(q) => {
                q.sqhd = (q.sqhd + 1) % (q.sqsize + 1);
                q.sqhd
            }
            None => 0,
        }
    }

    fn queue_response(&mut self, s: u16) {
        let sqhd = self.next_sqhd();
        let sqid = self.q.as_ref().map_or(0, |q| q.qid);
        let d = self.digests;
        let sqflow_disabled = self.q.as_ref().is_some_and(|q| q.sqflow_disabled);
        let slot = &self.slots[s as usize];
        let cqe = Cqe {
            dw0: slot.dw0,
            dw1: slot.dw1,
            sqhd,
            sqid,
            cid: slot.sqe.cid(),
            status: slot.status,
        };
        if slot.to_host && slot.status.is_success() {
            let len = slot.xfer_len;
            // SUCCESS saves the CapsuleResp, but only when the host disabled
            // SQ flow control and there is no result to return.
            let success = sqflow_disabled && cqe.dw0 == 0 && cqe.dw1 == 0;
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
            let src = if slot.zero_data { ZERO_SRC } else { s };
            if d.data {
                self.tx.push_slot_data(src, len, NO_RELEASE);
                let data = if slot.zero_data {
                    &zeros()[..len as usize]
                } else {
                    slot.buf.slice(len as usize)
                };
                let crc = trellis_nvme::crc::digest(data);
                self.tx.push_bytes(last_release, |b| {
                    b[..4].copy_from_slice(&crc.to_le_bytes());
                    4
                });
            } else {
                self.tx.push_slot_data(src, len, last_release);
            }
            if success {
                return;
            }
        }
        self.tx
            .push_bytes(s, |b| pdu::encode_capsule_resp(b, &cqe, d));
    }

    /// Frees a slot once its response has been sent.
    pub fn release(&mut self, s: u16) {
        let slot = &mut self.slots[s as usize];
        debug_assert!(
            slot.phase == Phase::Done,
            "release of a slot in {:?}",
            slot.phase
        );
        slot.phase = Phase::Free;
        // Bounds what idle queues keep: `slot_buffer_keep`, `large_buffer_budget`.
        let keep = self.reg.limits.slot_buffer_keep.0 as usize;
        slot.buf.shrink_to(keep, &self.reg.buffer_budget);
        self.free.push(s);
    }

    pub fn tx_iovecs(&self, out: &mut Vec<libc::iovec>, max: usize) {
        let slots = &self.slots;
        self.tx.iovecs(out, max, |s| {
            if s == ZERO_SRC {
                zeros().as_ptr()
            } else {
                slots[s as usize].buf.as_ptr()
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
    }

    /// Answers a fatal error: C2HTermReq with the offending header, then close.
    fn fatal_with(&mut self, f: Fatal, offending: &[u8]) {
        tracing::warn!(peer = %self.peer, "fatal: {} (FES {:#x}, FEI {}); terminating connection", f.name(), f.fes, f.fei);
        self.close_reason = Some(format!("{} (FES {:#x})", f.name(), f.fes));
        self.state = State::Closing;
        self.tx.push_bytes(NO_RELEASE, |b| {
            pdu::encode_term_req(b, PduType::C2HTermReq, f, offending)
        });
    }

    fn fatal(&mut self, f: Fatal) {
        let n = (self.rx_tail - self.rx_head).min(pdu::CMD_HLEN);
        let offending: Vec<u8> = self.rx[self.rx_head..self.rx_head + n].to_vec();
        self.fatal_with(f, &offending);
    }

    pub fn close_quietly(&mut self, why: &str) {
        if self.close_reason.is_none() {
            self.close_reason = Some(why.to_string());
        }
        self.state = State::Closing;
    }

    /// Periodic checks (about every millisecond): keep-alive, controller
    /// teardown, and the connect timeout.
    pub fn tick(&mut self, now_ns: u64) {
        if self.state == State::Closing {
            return;
        }
        let l = &self.reg.limits;
        match &self.q {
            None => {
                if now_ns.saturating_sub(self.created_ns) > l.connect_timeout_ms * 1_000_000 {
                    self.close_quietly("no Connect within the connect timeout");
                }
            }
            Some(q) => {
                if q.ctrl.dead.load(Relaxed) {
                    self.close_quietly("controller torn down");
                    return;
                }
                if q.kind != QueueKind::Admin {
                    return;
                }
                let kato_ms = q.ctrl.kato_ms.load(Relaxed) as u64;
                let last = q.ctrl.last_keepalive_ns.load(Relaxed);
                let idle_ns = now_ns.saturating_sub(last);
                // KAS is 1 s: round KATO up to whole seconds, as hosts expect.
                let limit_ns = if kato_ms > 0 {
                    kato_ms.div_ceil(1000) * 1_000_000_000
                } else if q.ctrl.is_discovery() {
                    l.discovery_idle_timeout_s * 1_000_000_000
                } else {
                    u64::MAX
                };
                if idle_ns > limit_ns {
                    q.ctrl.kill("keep-alive timeout");
                    self.close_quietly("keep-alive timeout");
                }
            }
        }
    }

    /// The socket failed: nothing queued will be sent, so free its slots now.
    pub fn on_send_failure(&mut self) {
        let mut v = std::mem::take(&mut self.released);
        self.tx.drain_releases(|s| v.push(s));
        for &s in &v {
            self.release(s);
        }
        v.clear();
        self.released = v;
    }

    /// Called when the connection is gone: detaches it from its controller.
    pub fn on_close(&mut self) {
        self.on_send_failure();
        self.flush_stats();
        let Some(q) = &self.q else { return };
        let ctrl = q.ctrl.clone();
        ctrl.connected_qids.lock().unwrap().remove(&q.qid);
        if q.kind == QueueKind::Admin {
            // The controller lives as long as its admin queue.
            ctrl.kill(self.close_reason.as_deref().unwrap_or("admin queue closed"));
            match &ctrl.subsys {
                Some(sub) => {
                    sub.controllers.lock().unwrap().remove(&ctrl.cntlid);
                }
                None => {
                    self.reg
                        .discovery_controllers
                        .lock()
                        .unwrap()
                        .remove(&ctrl.cntlid);
                }
            }
        }
    }

    /// Grows the slot array for an I/O queue of `sqsize + 1` entries: twice
    /// that, because a host may reuse a CID as soon as it sees the response.
    pub fn size_slots(&mut self, sqsize: u16) {
        let want = (2 * (sqsize as usize + 1)).max(64);
        let had = self.slots.len();
        if want > had {
            self.slots.extend((had..want).map(|_| Slot::new()));
            self.free.splice(0..0, (had as u16..want as u16).rev());
        }
    }
}

/// Data direction of a command: 0 none, 1 host to controller, 2 controller to host, 3 both.
fn data_direction(sqe: &Sqe) -> u8 {
    if sqe.opcode() == trellis_nvme::sqe::admin::FABRICS {
        sqe.fctype() & 0x3
    } else {
        sqe.opcode() & 0x3
    }
}
