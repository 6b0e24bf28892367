//! One NVMe/TCP connection (one queue), as a sans-IO state machine.
//!
//! The reactor moves bytes: it `recv`s into [`Conn::rx_space`], calls
//! [`Conn::process`], and `sendmsg`s what [`Conn::tx_iovecs`] lists. Everything
//! protocol-shaped happens here: PDU framing and validation, the ICReq
//! exchange, command slots, R2T/H2CData reassembly, responses, and fatal
//! errors (a C2HTermReq, then close of this connection only).

use crate::config::ListenerKind;
use crate::data::nvme::cmd;
use crate::data::nvme::exec::{Ctx, Dir, Exec, Queue, QueueKind, Request, NO_CREDIT};
use crate::state::stats::CloseKind;
use crate::state::subsystem::{Controller, Registry};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use trellis_nvme::framing::{RxBuf, TxQueue, NO_RELEASE};
use trellis_nvme::pdu::{
    self, fes, field, flags, CommonHeader, DataHdr, Digests, Fatal, IcReq, IcResp, Layout, PduType,
};
use trellis_nvme::status::generic;
use trellis_nvme::{sqe::sgl_id, Cqe, Sqe, Status};

/// In-capsule data accepted on admin queues and for Connect on any queue.
pub use trellis_nvme::pdu::ADMIN_ICD_BYTES;

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
    /// Parsed, waiting for room in the node's transfer pool (no buffer yet,
    /// no R2T sent): `wait.rs`.
    AwaitBuffer,
    /// Waiting for H2CData after an R2T.
    AwaitData,
    Executing,
    /// Held until an asynchronous event (AER).
    Held,
    /// Response queued or waiting for tx room.
    Done,
}

/// Per-command transport state, pre-allocated at Connect and reused. The
/// command itself (what any transport would carry) is the [`Request`].
pub struct Slot {
    pub req: Request,
    pub phase: Phase,
    pub recv_len: u32,
    /// Data digest failure seen while receiving H2C data.
    pub h2c_error: bool,
    pub status: Status,
    /// Offset of in-capsule write data still in the receive buffer (or
    /// `NO_ICD`): a synchronous backend takes it from there without a copy.
    pub icd_at: u32,
    /// This command's bytes of the node's transfer pool (large transfers).
    pub grant: Option<crate::state::buf::PoolGrant>,
    /// When its R2T went out (`Phase::AwaitData`).
    pub data_since_ns: u64,
}

pub const NO_ICD: u32 = u32::MAX;
/// `TxQueue` data source meaning "the shared zero buffer".
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
            req: Request::new(),
            phase: Phase::Free,
            recv_len: 0,
            h2c_error: false,
            status: Status::SUCCESS,
            icd_at: NO_ICD,
            grant: None,
            data_since_ns: 0,
        }
    }
}

/// One NVMe/TCP connection: events in (`rx_commit`, `backend_done`,
/// `tx_advance`, `handle_timeout`), transmits out (`tx_iovecs`), and its next
/// deadline as data (`next_timeout`). The reactor uses only this API.
pub struct Conn {
    idx: u32,
    pub(crate) queue: Queue,
    state: State,
    digests: Digests,
    /// Received bytes; PDUs are parsed in place. Its largest unit is the
    /// largest PDU we accept, so every PDU is contiguous when parsed.
    pub(crate) rx: RxBuf,
    tx: TxQueue,
    slots: Vec<Slot>,
    free: Vec<u16>,
    backlog: std::collections::VecDeque<u16>,
    created_ns: u64,
    /// Since when queued output has waited with no byte accepted by the
    /// peer (`u64::MAX`: none waits). Set by `handle_timeout`, which runs
    /// at least every `CTRL_CHECK_NS` on a connected queue, and moved on
    /// by every `tx_advance` that sends something.
    tx_wait_since_ns: u64,
    /// Close without sending what is queued (the peer stopped reading).
    drop_output: bool,
    close_reason: Option<String>,
    /// What kind of reason `close_reason` is, for `/metrics`.
    close_kind: CloseKind,
    backend_in_flight: usize,
    /// When batched statistics were first left unflushed (`u64::MAX`: none).
    stats_since_ns: u64,
    /// Time of the latest event (input, completion or timeout).
    now_ns: u64,
    /// Set while an H2CData payload is received into its command's buffer.
    direct: Option<Direct>,
    /// Scratch list of slots released by one `tx_advance` (kept to avoid allocating).
    released: Vec<u16>,
    /// The I/O credits of the last CapsuleResp that carried them (`NO_CREDIT`:
    /// none yet): a read whose credit is unchanged may still end with the
    /// C2HData SUCCESS flag and no CapsuleResp.
    last_credit: u32,
    /// The TLS handshake must be done by then (`u64::MAX`: no handshake
    /// pending). Set and cleared by the reactor, which runs the handshake.
    tls_deadline_ns: u64,
    /// Commands waiting for transfer-pool room, oldest first, and the pool
    /// bytes this connection's commands hold (`wait.rs`).
    pool_wait: std::collections::VecDeque<u16>,
    pool_held_bytes: u64,
    /// The ICReq must have arrived by then (`target.icreq_timeout_ms` from
    /// the channel being ready; `u64::MAX` during a TLS handshake, which
    /// has its own deadline).
    icreq_by_ns: u64,
    /// Commands waiting for H2CData, and a time no later than the oldest
    /// one's R2T (`wait.rs`).
    await_data: u32,
    await_data_oldest_ns: u64,
}

mod wait;

/// H2CData payloads at least this long are received straight into the
/// command's buffer; shorter ones are cheaper to copy from the receive buffer
/// than to spend extra `recv` calls on.
pub const DIRECT_MIN_BYTES: usize = 16 << 10;

/// An H2CData payload being received straight into a command's buffer.
#[derive(Clone, Copy, Debug)]
struct Direct {
    slot: u16,
    /// Payload range in the command's buffer, and the next byte expected.
    start: u32,
    next: u32,
    end: u32,
    flags: u8,
    ddgst: bool,
}

/// Longest time batched statistics wait before reaching the shared counters.
pub const STATS_FLUSH_NS: u64 = 1_000_000;
/// How often an I/O queue looks whether its controller was torn down by
/// another connection (its admin queue), which may live on another reactor.
pub const CTRL_CHECK_NS: u64 = 100_000_000;

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
        Self::with_rx(idx, reg, peer, local, listener_kind, portid, now_ns, None)
    }

    /// As [`Conn::new`], taking over `rx` (emptied) when it is the size this
    /// registry's limits give; else a new buffer. The fuzz harness hands the
    /// buffers of one input's connections to the next (the fuzz harness, `fuzzing.rs`):
    /// allocating and zeroing ~80 KiB per connection under AddressSanitizer
    /// was a large part of an input's time.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn with_rx(
        idx: u32,
        reg: Arc<Registry>,
        peer: SocketAddr,
        local: SocketAddr,
        listener_kind: ListenerKind,
        portid: u16,
        now_ns: u64,
        rx: Option<RxBuf>,
    ) -> Conn {
        let l = &reg.limits;
        // The largest PDU we accept: an H2CData of MAXH2CDATA or a capsule
        // with the largest in-capsule data, plus header, digests and padding.
        let icd = (l.in_capsule_data.0 as usize).max(ADMIN_ICD_BYTES);
        let max_plen = (l.max_h2c_data.0 as usize).max(icd) + pdu::MAX_HDR_LEN + 128 + 8;
        let rx = match rx {
            Some(mut b) if b.reusable_as(max_plen + (64 << 10), max_plen) => {
                b.clear();
                b
            }
            // 64 KiB beyond one PDU so small PDUs arrive in batches.
            _ => RxBuf::new(max_plen + (64 << 10), max_plen),
        };
        // Admin queues start with 32 slots; Connect resizes for I/O queues.
        let slots: Vec<Slot> = (0..64).map(|_| Slot::new()).collect();
        let free = (0..slots.len() as u16).rev().collect();
        let icreq_by_ns = now_ns.saturating_add(l.icreq_timeout_ms * 1_000_000);
        Conn {
            idx,
            queue: Queue::new(reg, peer, local, listener_kind, portid),
            state: State::AwaitIcReq,
            digests: Digests::default(),
            rx,
            tx: TxQueue::default(),
            slots,
            free,
            backlog: Default::default(),
            created_ns: now_ns,
            tx_wait_since_ns: u64::MAX,
            drop_output: false,
            close_reason: None,
            close_kind: CloseKind::Other,
            backend_in_flight: 0,
            stats_since_ns: u64::MAX,
            now_ns,
            direct: None,
            released: Vec::with_capacity(64),
            last_credit: NO_CREDIT,
            tls_deadline_ns: u64::MAX,
            icreq_by_ns,
            pool_wait: std::collections::VecDeque::new(),
            pool_held_bytes: 0,
            await_data: 0,
            await_data_oldest_ns: u64::MAX,
        }
    }

    fn icreq_deadline_from(&self, now_ns: u64) -> u64 {
        now_ns.saturating_add(self.queue.reg.limits.icreq_timeout_ms * 1_000_000)
    }

    /// The receive buffer, for a next connection ([`Conn::with_rx`]).
    pub(crate) fn into_rx(self) -> RxBuf {
        self.rx
    }

    /// A TLS handshake starts: it must end within `timeout_ns`.
    pub fn tls_handshake_started(&mut self, now_ns: u64, timeout_ns: u64) {
        self.tls_deadline_ns = now_ns.saturating_add(timeout_ns);
        self.icreq_by_ns = u64::MAX;
    }

    /// No TLS handshake is pending any more (plain on an optional listener).
    pub fn tls_not_used(&mut self) {
        self.tls_deadline_ns = u64::MAX;
    }

    /// The handshake finished with the PSK of (`hostnqn`, `subnqn`): Connect
    /// on this queue must name those.
    pub fn tls_established(&mut self, hostnqn: String, subnqn: String) {
        self.tls_deadline_ns = u64::MAX;
        self.icreq_by_ns = self.icreq_deadline_from(self.now_ns);
        self.queue.tls_peer = Some((hostnqn, subnqn));
    }

    pub fn ctrl(&self) -> Option<&Arc<Controller>> {
        self.queue.q.as_ref().map(|q| &q.ctrl)
    }

    /// Free space to `recv` into: the receive buffer (see
    /// [`RxBuf::space`]), or, while a large H2CData payload arrives, the
    /// rest of that payload's place in its command's buffer.
    pub fn rx_space(&mut self) -> &mut [u8] {
        match self.direct {
            Some(d) if d.next < d.end => {
                let slot = &mut self.slots[d.slot as usize];
                let len = slot.req.xfer_len as usize;
                &mut slot.req.buf.slice_mut(len)[d.next as usize..d.end as usize]
            }
            _ => self.rx.space(),
        }
    }

    pub fn rx_commit(&mut self, n: usize) {
        match &mut self.direct {
            Some(d) if d.next < d.end => {
                debug_assert!(n <= (d.end - d.next) as usize);
                d.next += n as u32;
            }
            _ => self.rx.commit(n),
        }
    }

    /// Unparsed input waits and there is output room to parse it (parsing
    /// stops when the output queue is full).
    pub fn rx_pending(&self) -> bool {
        self.rx.len() >= pdu::CH_LEN && self.state != State::Closing && self.tx.has_room()
    }

    /// Bytes are queued for the socket.
    pub fn has_output(&self) -> bool {
        !self.tx.is_empty()
    }

    /// Bytes queued and not yet handed to the socket.
    pub fn output_bytes(&self) -> usize {
        self.tx.pending_bytes()
    }

    pub fn is_closing(&self) -> bool {
        self.state == State::Closing
    }

    pub fn close_reason(&self) -> &str {
        self.close_reason.as_deref().unwrap_or("")
    }

    pub fn close_kind(&self) -> CloseKind {
        self.close_kind
    }

    pub fn peer(&self) -> SocketAddr {
        self.queue.peer
    }

    /// Backend requests submitted and not yet completed: their buffers
    /// belong to the device until then.
    pub fn backend_in_flight(&self) -> usize {
        self.backend_in_flight
    }

    /// The queue ID once connected.
    pub fn qid(&self) -> Option<u16> {
        self.queue.q.as_ref().map(|q| q.qid)
    }

    /// Closing, and nothing left to send: or what is left will never be
    /// taken (a send stall), so it is dropped rather than waited for.
    pub fn wants_close(&self) -> bool {
        self.state == State::Closing && (self.tx.is_empty() || self.drop_output)
    }

    /// Parses and handles every complete PDU in the receive buffer.
    pub fn process(&mut self, ctx: &mut Ctx) {
        self.now_ns = ctx.now_ns;
        // Once per batch, not per command: namespaces added or removed
        // since the last batch (`nsset`).
        self.queue.refresh_ns();
        if self.has_pool_waiters() {
            self.pump_pool(ctx);
        }
        while self.state != State::Closing && self.tx.has_room() {
            if self.direct.is_some() && !self.end_direct(ctx) {
                break;
            }
            let avail = self.rx.len();
            let Some(ch) = CommonHeader::decode(self.rx.pending()) else {
                break;
            };
            if self.state == State::AwaitIcReq && self.rx.pending().first() == Some(&0x16) {
                // A TLS ClientHello on a plain port: close without parsing it.
                self.close_as(
                    CloseKind::ProtocolError,
                    "TLS handshake on a non-TLS listener",
                );
                return;
            }
            let layout = match pdu::check_layout(
                &ch,
                true,
                self.state == State::AwaitIcReq,
                self.digests,
                self.rx.max_unit(),
            ) {
                Ok(l) => l,
                Err(f) => return self.fatal(f),
            };
            if avail < layout.plen {
                match self.start_direct(&layout) {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(f) => return self.fatal(f),
                }
            }
            // Consumed before handling; its bytes stay in place until the
            // next rx_space (in-capsule data is read from there).
            let start = self.rx.head();
            self.rx.consume(layout.plen);
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
            maxh2cdata: self.queue.reg.limits.max_h2c_data.0 as u32,
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
        match &self.queue.q {
            Some(q)
                if q.kind == QueueKind::Io && sqe.opcode() != trellis_nvme::sqe::io::FABRICS =>
            {
                self.queue.reg.limits.in_capsule_data.0 as usize
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
        slot.req.reset(sqe, self.now_ns);
        slot.req.tag = (self.idx as u64) << 16 | s as u64;
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
    /// cannot connect.
    fn refused_before_connect(&self, st: Status, why: &str) {
        if self.queue.q.is_none() {
            tracing::info!(peer = %self.queue.peer, "connect refused: {why} ({st})");
        }
    }

    /// Transport-level checks of SGL1 against the command's row (direction,
    /// in-capsule data, MDTS); sets the request's row and sizes its buffer.
    fn check_data(&mut self, s: u16, icd_len: usize) -> Result<(), Status> {
        let mdts = self.queue.reg.limits.max_io_size.0 as usize;
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
    fn start_r2t(&mut self, s: u16) {
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
    fn check_h2c(&self, h: &DataHdr, data_len: usize) -> Result<u16, Fatal> {
        let s = h.ttag;
        let ok = (s as usize) < self.slots.len() && {
            let slot = &self.slots[s as usize];
            slot.phase == Phase::AwaitData && slot.req.sqe.cid() == h.cccid
        };
        if !ok {
            return Err(Fatal::new(fes::PDU_SEQUENCE_ERROR, 0));
        }
        if h.datal as usize != data_len {
            return Err(Fatal::new(fes::INVALID_HEADER_FIELD, 16));
        }
        if h.datal as u64 > self.queue.reg.limits.max_h2c_data.0 {
            return Err(Fatal::new(fes::DATA_LIMIT_EXCEEDED, 0));
        }
        let slot = &self.slots[s as usize];
        if h.datao != slot.recv_len || h.datao as u64 + h.datal as u64 > slot.req.xfer_len as u64 {
            return Err(Fatal::new(fes::DATA_OUT_OF_RANGE, 0));
        }
        Ok(s)
    }

    fn on_h2c_data(
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
    fn h2c_received(&mut self, ctx: &mut Ctx, s: u16, n: u32, fl: u8, ddgst_ok: bool) {
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
    fn start_direct(&mut self, l: &Layout) -> Result<bool, Fatal> {
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
    fn end_direct(&mut self, ctx: &mut Ctx) -> bool {
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
    fn execute(&mut self, ctx: &mut Ctx, s: u16) {
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

    /// A backend request of slot `s` finished; `credit`: the tenant's I/O
    /// credits when the namespace is scheduled (`qos::split_tag`).
    pub fn backend_done(&mut self, s: u16, st: Status, credit: Option<u16>, now_ns: u64) {
        self.now_ns = now_ns;
        if let (Some(c), Some(slot)) = (credit, self.slots.get_mut(s as usize)) {
            // Gimbal's target returns credits on successful completions only.
            if st.is_success() {
                slot.req.credit = c as u32;
            }
        }
        debug_assert!(self.backend_in_flight > 0);
        self.backend_in_flight -= 1;
        // The scheduler's own refusals (Busy, the HA fence, a reservation
        // lost while held) come back this way too: not backend failures.
        let not_backend = st == crate::data::qos::QOS_BUSY
            || st == trellis_nvme::status::path::ANA_INACCESSIBLE
            || st == crate::state::resv::CONFLICT;
        if !st.is_success() && !not_backend {
            self.count_backend_error(s);
        }
        self.finish(s, st);
    }

    /// The DH workers finished job `job`: completes the Authentication
    /// Receive parked for it, if this connection still has one (a job
    /// of a closed connection finds none: job IDs are never reused).
    pub fn auth_done(&mut self, job: u64, out: crate::data::nvme::auth_work::Output, now_ns: u64) {
        self.now_ns = now_ns;
        let Some(s) = crate::data::nvme::auth::parked(&self.queue, job) else {
            return;
        };
        if self.slots.get(s as usize).map(|x| x.phase) != Some(Phase::Held) {
            return;
        }
        let req = &mut self.slots[s as usize].req;
        if let Exec::Done(st) = crate::data::nvme::auth::resume(&mut self.queue, req, job, out) {
            self.finish(s, st);
        }
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
    fn count_backend_error(&self, s: u16) {
        let uid = self.slots[s as usize].req.ns_uid;
        if let Some(ns) = self.queue.ns.by_uid(uid) {
            ns.stats.backend_errors.fetch_add(1, Relaxed);
        }
    }

    fn record_error(&mut self, s: u16, st: Status) {
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
                ns.stats.media_errors.fetch_add(1, Relaxed);
            }
        }
        tracing::debug!(qid = q.qid, "command {:?} failed: {st}", slot.req.sqe);
    }

    /// Adds batched statistics to the shared namespace counters.
    pub fn flush_stats(&mut self) {
        self.queue.flush_stats();
        self.stats_since_ns = u64::MAX;
    }

    fn next_sqhd(&mut self) -> u16 {
        match &mut self.queue.q {
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
        let keep = self.queue.reg.limits.slot_buffer_keep.0 as usize;
        if slot.req.buf.capacity() > keep {
            // Only large buffers are charged to the budget or freed; the
            // common small one is simply reused.
            slot.req.buf.shrink_to(keep, &self.queue.reg.buffer_budget);
        }
        self.free.push(s);
    }

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
    fn check_send_stall(&mut self, now_ns: u64) -> bool {
        if !self.has_output() {
            self.tx_wait_since_ns = u64::MAX;
            return false;
        }
        if self.tx_wait_since_ns == u64::MAX {
            self.tx_wait_since_ns = now_ns;
            return false;
        }
        let limit_ns = self.queue.reg.limits.send_stall_timeout_ms * 1_000_000;
        if now_ns.saturating_sub(self.tx_wait_since_ns) <= limit_ns {
            return false;
        }
        tracing::warn!(
            peer = %self.queue.peer,
            "peer accepted none of {} queued bytes for {} ms (target.send_stall_timeout_ms); closing",
            self.output_bytes(),
            self.queue.reg.limits.send_stall_timeout_ms
        );
        self.close_as(
            CloseKind::Timeout,
            "peer stopped reading (send stall timeout)",
        );
        self.drop_output = true;
        true
    }

    /// Answers a fatal error: C2HTermReq with the offending header, then close.
    fn fatal_with(&mut self, f: Fatal, offending: &[u8]) {
        tracing::warn!(peer = %self.queue.peer, "fatal: {} (FES {:#x}, FEI {}); terminating connection", f.name(), f.fes, f.fei);
        self.close_reason = Some(format!("{} (FES {:#x})", f.name(), f.fes));
        self.close_kind = CloseKind::ProtocolError;
        self.state = State::Closing;
        self.tx.push_bytes(NO_RELEASE, |b| {
            pdu::encode_term_req(b, PduType::C2HTermReq, f, offending)
        });
    }

    fn fatal(&mut self, f: Fatal) {
        let n = self.rx.len().min(pdu::CMD_HLEN);
        let offending: Vec<u8> = self.rx.pending()[..n].to_vec();
        self.fatal_with(f, &offending);
    }

    pub fn close_quietly(&mut self, why: &str) {
        self.close_as(CloseKind::Other, why);
    }

    /// Closes for a reason of kind `kind`; the first reason given stays.
    pub fn close_as(&mut self, kind: CloseKind, why: &str) {
        if self.close_reason.is_none() {
            self.close_reason = Some(why.to_string());
            self.close_kind = kind;
        }
        self.state = State::Closing;
    }

    /// The earliest time `handle_timeout` has work to do: the connect
    /// timeout, the keep-alive deadline, the controller check of an I/O
    /// queue, or the flush of batched statistics. `None`: no timer.
    pub fn next_timeout(&self) -> Option<u64> {
        if self.state == State::Closing {
            return None;
        }
        let l = &self.queue.reg.limits;
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
                    Some(limit) => q.ctrl.last_keepalive_ns.load(Relaxed).saturating_add(limit),
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
        Some(own.min(stats).min(self.tls_deadline_ns).min(waits)).filter(|&t| t != u64::MAX)
    }

    /// How long an admin queue may stay silent. KAS is 1 s: KATO is rounded
    /// up to whole seconds, as hosts expect.
    fn kato_limit_ns(&self, ctrl: &Controller) -> Option<u64> {
        let kato_ms = ctrl.kato_ms.load(Relaxed) as u64;
        if kato_ms > 0 {
            Some(kato_ms.div_ceil(1000) * 1_000_000_000)
        } else if ctrl.is_discovery() {
            Some(self.queue.reg.limits.discovery_idle_timeout_s * 1_000_000_000)
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
            tracing::warn!(
                peer = %self.queue.peer,
                "TLS handshake not finished within {} ms (target.tls_handshake_timeout_ms); closing",
                self.queue.reg.limits.tls_handshake_timeout_ms
            );
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
        let connect_ns = self.queue.reg.limits.connect_timeout_ms * 1_000_000;
        let Some(q) = &self.queue.q else {
            if now_ns.saturating_sub(self.created_ns) > connect_ns {
                self.close_as(CloseKind::Timeout, "no Connect within the connect timeout");
            }
            return;
        };
        if q.ctrl.dead.load(Relaxed) {
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
        let idle_ns = now_ns.saturating_sub(q.ctrl.last_keepalive_ns.load(Relaxed));
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
    fn deliver_event(&mut self) {
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
        let slot = &mut self.slots[s as usize];
        slot.req.dw0 = dw0;
        slot.req.dw1 = 0;
        tracing::debug!(cid = slot.req.sqe.cid(), "AER completed: {dw0:#010x}");
        self.finish(s, Status::SUCCESS);
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
        let Some(q) = &self.queue.q else { return };
        let ctrl = q.ctrl.clone();
        crate::sys::lock(&ctrl.connected_qids).remove(&q.qid);
        if q.kind == QueueKind::Admin {
            // The controller lives as long as its admin queue. A host that
            // shut it down first (CC.SHN, as `trellis bench` does) left
            // cleanly: say so, rather than only that the socket closed.
            let shst = ctrl.csts.load(Relaxed) & (0x3 << 2);
            let why = if shst == trellis_nvme::fabrics::csts::SHST_COMPLETE {
                "clean shutdown by the host, then it closed the connection"
            } else {
                self.close_reason.as_deref().unwrap_or("admin queue closed")
            };
            ctrl.kill(why);
            match &ctrl.subsys {
                Some(sub) => {
                    crate::sys::lock(&sub.controllers).remove(&ctrl.cntlid);
                }
                None => {
                    crate::sys::lock(&self.queue.reg.discovery_controllers).remove(&ctrl.cntlid);
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
