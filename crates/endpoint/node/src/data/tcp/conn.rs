//! One NVMe/TCP connection (one queue), as a sans-IO state machine.
//!
//! The reactor moves bytes: it `recv`s into [`Conn::rx_space`], calls
//! [`Conn::process`], and `sendmsg`s what [`Conn::tx_iovecs`] lists. Everything
//! protocol-shaped happens here: PDU framing and validation, the ICReq
//! exchange, command slots, R2T/H2CData reassembly, responses, and fatal
//! errors (a C2HTermReq, then close of this connection only).
//!
//! This module and its submodules (`rx`, `tx`, `wait`, `drain`, `timers`)
//! are under `indexing_slicing` and `cast_possible_truncation` (issue 32
//! item 8); `rx.rs` states the two proofs the allowances lean on (a
//! received PDU's bounds, and where slot numbers come from).
#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

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
#[allow(
    clippy::cast_possible_truncation,
    reason = "MAX_IO_SIZE_LIMIT is the constant 8 MiB"
)]
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

mod drain;
mod rx;
mod timers;
mod tx;
mod wait;

/// Slots a connection starts with (`size_slots` adds more at Connect).
const FIRST_SLOTS: u16 = 64;

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
        let l = &reg.limits();
        // The largest PDU we accept: an H2CData of MAXH2CDATA or a capsule
        // with the largest in-capsule data, plus header, digests and padding.
        #[allow(
            clippy::cast_possible_truncation,
            reason = "TargetConfig::validate bounds in_capsule_data to 64 KiB \
                      and max_h2c_data to 1 MiB"
        )]
        let (icd, h2c) = (l.in_capsule_data.0 as usize, l.max_h2c_data.0 as usize);
        let icd = icd.max(ADMIN_ICD_BYTES);
        let max_plen = h2c.max(icd) + pdu::MAX_HDR_LEN + 128 + 8;
        let rx = match rx {
            Some(mut b) if b.reusable_as(max_plen + (64 << 10), max_plen) => {
                b.clear();
                b
            }
            // 64 KiB beyond one PDU so small PDUs arrive in batches.
            _ => RxBuf::new(max_plen + (64 << 10), max_plen),
        };
        // Queues start with 64 slots; Connect resizes for I/O queues.
        let slots: Vec<Slot> = (0..FIRST_SLOTS).map(|_| Slot::new()).collect();
        let free = (0..FIRST_SLOTS).rev().collect();
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
        now_ns.saturating_add(self.queue.reg.limits().icreq_timeout_ms * 1_000_000)
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
    #[allow(
        clippy::indexing_slicing,
        reason = "slot index (conn/rx.rs module doc): a Direct's slot; \
                  start_direct built next..end within xfer_len (check_h2c)"
    )]
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
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "n is what was received into rx_space's slice, \
                              end - next bytes, a u32"
                )]
                let n = n as u32;
                d.next += n;
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

    /// Whether a line about closing this connection for its peer's fault
    /// (a fatal error, a timeout, a TLS failure) may be written: the lines
    /// left out since the last, or None. Rate-limited node-wide
    /// (`sys::loglimit`): a peer decides how often it happens.
    pub(crate) fn close_log(&self) -> Option<u64> {
        self.queue.reg.log_limits().close.admit()
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
                // check_layout gave hlen <= plen, so this is received bytes.
                let offending: Vec<u8> = self.rx.get(start..hdr_end).unwrap_or_default().to_vec();
                return self.fatal_with(f, &offending);
            }
        }
    }

    /// A backend request of slot `s` finished; `credit`: the tenant's I/O
    /// credits when the namespace is scheduled (`backend::Completion::credits`).
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
        let Some(slot) = self.slots.get_mut(s as usize) else {
            return;
        };
        if slot.phase != Phase::Held {
            return;
        }
        let req = &mut slot.req;
        if let Exec::Done(st) = crate::data::nvme::auth::resume(&mut self.queue, req, job, out) {
            self.finish(s, st);
        }
    }

    /// Answers a fatal error: C2HTermReq with the offending header, then close.
    fn fatal_with(&mut self, f: Fatal, offending: &[u8]) {
        if let Some(left_out) = self.close_log() {
            tracing::warn!(peer = %self.queue.peer, left_out, "fatal: {} (FES {:#x}, FEI {}); terminating connection", f.name(), f.fes, f.fei);
        }
        self.close_reason = Some(format!("{} (FES {:#x})", f.name(), f.fes));
        self.close_kind = CloseKind::ProtocolError;
        self.state = State::Closing;
        self.tx.push_bytes(NO_RELEASE, |b| {
            pdu::encode_term_req(b, PduType::C2HTermReq, f, offending)
        });
    }

    fn fatal(&mut self, f: Fatal) {
        let n = self.rx.len().min(pdu::CMD_HLEN);
        let offending: Vec<u8> = self.rx.pending().get(..n).unwrap_or_default().to_vec();
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
        ctrl.queues().remove(&q.qid);
        if q.kind == QueueKind::Admin {
            // The controller lives as long as its admin queue. A host that
            // shut it down first (CC.SHN, as `trellis bench` does) left
            // cleanly: say so, rather than only that the socket closed.
            let shst = ctrl.csts() & (0x3 << 2);
            let why = if shst == trellis_nvme::fabrics::csts::SHST_COMPLETE {
                "clean shutdown by the host, then it closed the connection"
            } else {
                self.close_reason.as_deref().unwrap_or("admin queue closed")
            };
            ctrl.kill(why);
            match &ctrl.subsys() {
                Some(sub) => {
                    crate::sys::lock(&sub.controllers).remove(&ctrl.cntlid());
                }
                None => {
                    crate::sys::lock(self.queue.reg.discovery_controllers()).remove(&ctrl.cntlid());
                }
            }
        }
    }

    /// Grows the slot array for an I/O queue of `sqsize + 1` entries: twice
    /// that, because a host may reuse a CID as soon as it sees the response.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "Connect (connect.rs) refuses sqsize >= max_queue_depth, which \
                  TargetConfig::validate bounds to 4096: want <= 8192"
    )]
    pub fn size_slots(&mut self, sqsize: u16) {
        let want = (2 * (sqsize as usize + 1)).max(64);
        let had = self.slots.len();
        if want > had {
            self.slots.extend((had..want).map(|_| Slot::new()));
            self.free.splice(0..0, (had as u16..want as u16).rev());
        }
    }
}
