//! Sans-IO host side of one NVMe/TCP queue pair.
//!
//! The engine owns everything one connection needs and allocates it once:
//! command slots (CID = slot index plus a 4-bit generation), one data buffer
//! per slot, a receive staging buffer ([`RxBuf`]), and the output queue
//! ([`TxQueue`]: a header arena plus references into the slot buffers, which
//! the socket layer turns into one gathered `sendmsg`). Both buffer types are
//! the ones the node uses, from `trellis_nvme::framing`. It never touches a socket or a clock: the caller passes the time (`now_ns`, u64 ns on any clock),
//! hands it received bytes and asks it what to send. That keeps the protocol
//! logic testable byte-for-byte and lets the socket layer stay a thin loop.
//!
//! Every peer-controlled value is checked before use; a violation makes the
//! queue fail with [`Error::Protocol`] and every later call reports the same
//! error, so a misbehaving target can never hang or panic the host.
//!
//! This file holds the queue pair's state, its slots and buffers, the output
//! queue and submission; `rx.rs` is the receive path.

use std::collections::VecDeque;
use std::time::Duration;

use trellis_nvme::framing::{RxBuf, TxQueue, NO_RELEASE};
use trellis_nvme::pdu::{
    self, check_layout, flags, verify_header_digest, DataHdr, Digests, IcReq, IcResp, Layout,
    PduType, R2t, TermReq, ADMIN_ICD_BYTES, DIGEST_LEN, IC_LEN, MAX_HDR_LEN, SMALL_HLEN,
};
use trellis_nvme::sqe::admin;
use trellis_nvme::{crc, put32, CommonHeader, Cqe, Sgl, Sqe, Status};

use crate::error::{Error, Result};

mod rx;

/// Bits of the CID that hold the slot index; the rest is a generation that
/// catches completions for a slot's previous use.
const SLOT_BITS: u16 = 12;
pub const MAX_QUEUE_SIZE: u16 = 1 << SLOT_BITS;
/// Smallest MAXH2CDATA the transport spec allows.
const MIN_MAXH2CDATA: u32 = 4096;

/// Fixed parameters of one queue pair.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub qid: u16,
    /// Command slots, i.e. the most commands outstanding at once.
    pub queue_size: u16,
    /// Requested digests; the controller must echo them exactly.
    pub digests: Digests,
    /// Data buffer per slot: the largest transfer one command may move.
    pub buf_bytes: usize,
    /// Receive staging buffer (one `recv` lands here, then PDUs are parsed in place).
    pub staging_bytes: usize,
    /// Largest PDU accepted from the controller (header + data + digests).
    pub max_pdu_bytes: usize,
    /// A command outstanding longer than this fails the queue with a timeout.
    pub command_timeout: Duration,
    /// Ask for the target's I/O credits (Gimbal's credit-based flow control,
    /// docs/gimbal.md §1.e): each command carries this token in CDW2[15:0],
    /// and a completion whose DW1[31:16] echoes it carries the tenant's
    /// credits in DW1[15:0]. None (the default) leaves CDW2 as the caller
    /// set it. A target without credits echoes nothing, and
    /// [`Engine::io_credits`] stays None.
    pub credit_token: Option<std::num::NonZeroU16>,
    /// How many of this host's queues share the tenant's credits on the
    /// namespace (the target grants them per tenant, not per queue): each
    /// queue keeps at most `credits / credit_share` commands outstanding,
    /// and at least one. Only with `credit_token`.
    pub credit_share: u16,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            qid: 0,
            queue_size: 32,
            digests: Digests::default(),
            buf_bytes: 128 << 10,
            staging_bytes: 256 << 10,
            max_pdu_bytes: (1 << 20) + 256,
            command_timeout: Duration::from_secs(10),
            credit_token: None,
            credit_share: 1,
        }
    }
}

/// Data movement of a command, from the host's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Xfer {
    None,
    /// Host to controller (Write, DSM, Connect): the slot buffer's first bytes.
    ToCtrl(u32),
    /// Controller to host (Read, Identify, Get Log Page): into the slot buffer.
    FromCtrl(u32),
}

/// A finished command. The slot stays with the caller (its buffer holds read
/// data) until it is submitted again or [`Engine::free`]d.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub slot: u16,
    pub status: Status,
    pub dw0: u32,
    pub dw1: u32,
    /// SQ head pointer reported by the controller (0xFFFF when SQ flow
    /// control is disabled; 0 for reads completed by a SUCCESS C2HData).
    pub sqhd: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Allocated to the caller, not on the wire.
    User,
    InFlight,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    state: SlotState,
    gen: u16,
    xfer: Xfer,
    /// Bytes received (reads) or handed to the output queue (writes).
    done: u32,
    /// When it was submitted, on the caller's clock (ns).
    submitted_ns: u64,
}

/// Where the receive parser stands.
#[derive(Clone, Copy, Debug)]
enum Rx {
    /// Waiting for (the rest of) a PDU header.
    Header,
    /// Skipping `pad` bytes, then moving `remaining` payload bytes to the slot
    /// buffer at `at`; `start..at+remaining` is this PDU's data.
    Payload {
        slot: u16,
        pad: usize,
        start: usize,
        at: usize,
        remaining: usize,
        flags: u8,
        ddgst: bool,
    },
}

pub struct Engine {
    cfg: EngineConfig,
    slots: Vec<Slot>,
    free: Vec<u16>,
    inflight: usize,
    data: Vec<u8>,
    done: VecDeque<Completion>,
    /// Output: headers in the arena, payloads referenced by slot.
    out: TxQueue,
    /// Input staging; PDU headers are parsed in place.
    rx: RxBuf,
    rx_state: Rx,
    direct: bool,
    // Connection parameters from ICResp / Identify.
    ic_done: bool,
    maxh2cdata: u32,
    icd_bytes: u32,
    failed: Option<Error>,
    /// The last I/O credits the target returned (see `credit_token`).
    io_credits: Option<u32>,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Engine {
        let n = cfg.queue_size.clamp(1, MAX_QUEUE_SIZE) as usize;
        let slot = Slot {
            state: SlotState::Free,
            gen: 0,
            xfer: Xfer::None,
            done: 0,
            submitted_ns: 0,
        };
        // The arena holds a capsule header and a data digest per slot, plus
        // the H2CData headers of the R2Ts being answered. The queue grows by
        // a chunk should that be exceeded (small MAXH2CDATA), then keeps it.
        let arena_cap = n * (MAX_HDR_LEN + 2 * DIGEST_LEN) + 4096;
        Engine {
            slots: vec![slot; n],
            free: (0..n as u16).rev().collect(),
            inflight: 0,
            data: vec![0; n * cfg.buf_bytes],
            done: VecDeque::with_capacity(n),
            out: TxQueue::new(arena_cap, 3 * n + 16),
            // Only headers (up to a whole TermReq) are parsed in place;
            // payloads are copied out piecewise, so that is the largest unit.
            rx: RxBuf::new(cfg.staging_bytes.max(4096), MAX_HDR_LEN + TERM_SPACE),
            rx_state: Rx::Header,
            direct: false,
            ic_done: false,
            maxh2cdata: MIN_MAXH2CDATA,
            icd_bytes: 0,
            failed: None,
            io_credits: None,
            cfg,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn queue_size(&self) -> u16 {
        self.slots.len() as u16
    }

    pub fn inflight(&self) -> usize {
        self.inflight
    }

    pub fn ic_done(&self) -> bool {
        self.ic_done
    }

    pub fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata
    }

    /// In-capsule data limit for I/O commands (IOCCSZ·16 − 64), set once the
    /// controller has been identified; 0 means always use R2T.
    pub fn set_icd_bytes(&mut self, n: u32) {
        self.icd_bytes = n;
    }

    /// The terminal error, if the queue has failed.
    pub fn check(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.duplicate()),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: Error) -> Error {
        if self.failed.is_none() {
            self.failed = Some(e.duplicate());
        }
        e
    }

    /// Marks the queue failed from outside (socket errors).
    pub fn fail_with(&mut self, e: Error) -> Error {
        self.fail(e)
    }

    // ---- slots and buffers -------------------------------------------------

    pub fn alloc(&mut self) -> Option<u16> {
        let s = self.free.pop()?;
        self.slots[s as usize].state = SlotState::User;
        Some(s)
    }

    /// Returns a slot the caller owns. Freeing any other slot is a caller
    /// bug: caught in debug builds, ignored otherwise (the slot list stays
    /// consistent either way).
    pub fn free(&mut self, slot: u16) {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            debug_assert!(false, "free of slot {slot}, which does not exist");
            return;
        };
        if s.state != SlotState::User {
            debug_assert!(false, "free of slot {slot}, which the caller does not own");
            return;
        }
        s.state = SlotState::Free;
        self.free.push(slot);
    }

    pub fn buf(&self, slot: u16) -> &[u8] {
        let b = self.cfg.buf_bytes;
        &self.data[slot as usize * b..][..b]
    }

    pub fn buf_mut(&mut self, slot: u16) -> &mut [u8] {
        let b = self.cfg.buf_bytes;
        &mut self.data[slot as usize * b..][..b]
    }

    pub fn next_completion(&mut self) -> Option<Completion> {
        self.done.pop_front()
    }

    /// Puts a completion back at the end of the queue (synchronous helpers
    /// that wait for one command keep the others).
    pub fn push_completion(&mut self, c: Completion) {
        self.done.push_back(c);
    }

    pub fn completions_pending(&self) -> usize {
        self.done.len()
    }

    // ---- output ------------------------------------------------------------

    /// Queues the ICReq. Must be the first thing sent on the connection.
    pub fn start(&mut self) {
        let mut b = [0u8; IC_LEN];
        IcReq {
            pfv: 0,
            hpda: 0,
            digests: self.cfg.digests,
            maxr2t: 0, // one outstanding R2T per command, as Linux and SPDK hosts
        }
        .encode(&mut b);
        self.push_arena(&b);
    }

    fn push_arena(&mut self, bytes: &[u8]) {
        self.out.push_slice(bytes, NO_RELEASE);
    }

    /// Queues `len` bytes at `off` of the slot's buffer, and their digest.
    /// No release tag: a slot is reused only after its completion, which the
    /// controller sends only once it has all the data.
    fn push_data(&mut self, slot: u16, off: usize, len: usize) {
        self.out.push_data(slot, off as u32, len as u32, NO_RELEASE);
        if self.cfg.digests.data {
            let c = crc::digest(&self.buf(slot)[off..off + len]);
            self.push_arena(&c.to_le_bytes());
        }
    }

    /// Whether output is queued.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Fills `out` with up to `max` iovecs of unsent output, for one
    /// gathered `sendmsg`; then report what went with [`Engine::sent`].
    pub fn output_iovecs(&self, out: &mut Vec<libc::iovec>, max: usize) {
        let slots = slot_buffers(&self.data, self.cfg.buf_bytes);
        self.out.fill_iovecs(out, max, slots);
    }

    /// Calls `f(bytes)` for each unsent output piece in order, until `f`
    /// returns false (tests that send a few bytes at a time).
    pub fn for_each_output(&self, mut f: impl FnMut(&[u8]) -> bool) {
        let slots = slot_buffers(&self.data, self.cfg.buf_bytes);
        for piece in self.out.unsent(slots) {
            if !f(piece) {
                return;
            }
        }
    }

    /// Records that the transport accepted `n` more output bytes.
    pub fn sent(&mut self, n: usize) {
        self.out.advance(n, |_| {});
    }

    /// Test and tooling helper: takes all queued output as one byte vector.
    pub fn take_output(&mut self) -> Vec<u8> {
        let slots = slot_buffers(&self.data, self.cfg.buf_bytes);
        let v: Vec<u8> = self.out.unsent(slots).flatten().copied().collect();
        self.sent(v.len());
        v
    }

    // ---- submission --------------------------------------------------------

    /// Puts a command for `slot` (owned by the caller) on the output queue.
    /// The engine fills in CID and SGL; data for `ToCtrl` is the first bytes of
    /// the slot buffer, sent in the capsule when it fits, else on R2T.
    pub fn submit(&mut self, slot: u16, mut sqe: Sqe, xfer: Xfer, now_ns: u64) -> Result<()> {
        self.check()?;
        if !self.ic_done {
            return Err(Error::protocol("command submitted before ICResp"));
        }
        let len = match xfer {
            Xfer::None => 0,
            Xfer::ToCtrl(n) | Xfer::FromCtrl(n) => n,
        };
        if len as usize > self.cfg.buf_bytes {
            return Err(Error::Usage(format!(
                "transfer of {len} bytes is larger than the {}-byte slot buffer",
                self.cfg.buf_bytes
            )));
        }
        if let Some(limit) = self.credit_limit() {
            if self.inflight as u32 >= limit {
                return Err(Error::Busy(limit));
            }
        }
        let s = match self.slots.get_mut(slot as usize) {
            Some(s) if s.state == SlotState::User => s,
            _ => {
                return Err(Error::Usage(format!(
                    "submit of slot {slot}, which the caller does not own"
                )))
            }
        };
        s.gen = (s.gen + 1) & 0xf;
        s.state = SlotState::InFlight;
        s.xfer = xfer;
        s.done = 0;
        // An Asynchronous Event Request completes only when an event
        // occurs (NVMe Base 2.0 §5.2): no command timeout applies to it.
        let aer = self.cfg.qid == 0 && sqe.opcode() == admin::ASYNC_EVENT_REQUEST;
        s.submitted_ns = if aer { u64::MAX } else { now_ns };
        sqe.set_cid(slot | s.gen << SLOT_BITS);
        if let Some(t) = self.cfg.credit_token {
            let cdw2 = trellis_nvme::le32(&sqe.0, 8) & !0xFFFF | t.get() as u32;
            trellis_nvme::put32(&mut sqe.0, 8, cdw2);
        }
        self.inflight += 1;
        let icd = match xfer {
            Xfer::ToCtrl(n) if n <= self.icd_limit(&sqe) => n,
            _ => 0,
        };
        sqe.set_sgl(if icd > 0 {
            Sgl::in_capsule(icd)
        } else {
            Sgl::transport(len)
        });
        let mut hdr = [0u8; MAX_HDR_LEN];
        let n = pdu::encode_capsule_cmd(&mut hdr, &sqe, icd as usize, self.cfg.digests);
        self.push_arena(&hdr[..n]);
        if icd > 0 {
            self.slots[slot as usize].done = icd;
            self.push_data(slot, 0, icd as usize);
        }
        Ok(())
    }

    fn icd_limit(&self, sqe: &Sqe) -> u32 {
        if self.cfg.qid == 0 || sqe.opcode() == admin::FABRICS {
            ADMIN_ICD_BYTES as u32
        } else {
            self.icd_bytes
        }
    }

    /// The tenant's I/O credits from the target's latest credited completion
    /// (`EngineConfig::credit_token`): how many commands it may have
    /// outstanding on this namespace now. None until one arrives, and for
    /// targets that send none (Linux nvmet, SPDK): the caller then keeps its
    /// configured queue depth.
    pub fn io_credits(&self) -> Option<u32> {
        self.io_credits
    }

    /// Commands this queue may have outstanding under the target's credits
    /// (Algorithm 3, split over `credit_share` queues, at least 1); None
    /// while no credit has arrived or credits are not asked for: then only
    /// the queue size bounds it. `submit` refuses with [`Error::Busy`] at
    /// the limit.
    pub fn credit_limit(&self) -> Option<u32> {
        self.cfg.credit_token?;
        let c = self.io_credits?;
        Some((c / self.cfg.credit_share.max(1) as u32).max(1))
    }

    /// True when `submit` would not be refused for want of credits.
    pub fn may_submit(&self) -> bool {
        self.credit_limit()
            .is_none_or(|l| (self.inflight as u32) < l)
    }

    /// Fails the queue if any command has been outstanding too long.
    pub fn check_timeouts(&mut self, now_ns: u64) -> Result<()> {
        self.check()?;
        if self.inflight == 0 {
            return Ok(());
        }
        let limit = self.cfg.command_timeout;
        let late = self.slots.iter().enumerate().find(|(_, s)| {
            s.state == SlotState::InFlight
                && Duration::from_nanos(now_ns.saturating_sub(s.submitted_ns)) > limit
        });
        if let Some((i, s)) = late {
            let e = Error::Timeout(format!(
                "command {:#06x} on queue {} outstanding for more than {:?}",
                i as u16 | s.gen << SLOT_BITS,
                self.cfg.qid,
                limit
            ));
            return Err(self.fail(e));
        }
        Ok(())
    }

    /// Puts an in-flight slot's SQE bytes back in `out` (debug helper for tests).
    #[doc(hidden)]
    pub fn cid_of(&self, slot: u16) -> u16 {
        slot | self.slots[slot as usize].gen << SLOT_BITS
    }
}

/// Maps an output-queue source id (a slot) to that slot's data buffer.
fn slot_buffers<'a>(data: &'a [u8], buf_bytes: usize) -> impl Fn(u16) -> &'a [u8] + 'a {
    move |s| &data[s as usize * buf_bytes..][..buf_bytes]
}

/// Room for the largest header we buffer whole (a TermReq is at most 152 bytes).
const TERM_SPACE: usize = pdu::TERM_MAX_PLEN;

/// Builds an NVMe Read/Write SQE (`nlb` 1-based).
pub fn rw_sqe(opcode: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
    Sqe::rw(opcode, 0, nsid, slba, nlb, false)
}

/// Builds a Write Zeroes SQE; `deallocate` sets DEAC.
pub fn write_zeroes_sqe(nsid: u32, slba: u64, nlb: u32, deallocate: bool) -> Sqe {
    let mut s = Sqe::rw(
        trellis_nvme::sqe::io::WRITE_ZEROES,
        0,
        nsid,
        slba,
        nlb,
        false,
    );
    if deallocate {
        s.set_cdw(12, s.cdw12() | 1 << 25);
    }
    s
}

/// Builds a Dataset Management (deallocate) SQE for one range and writes the
/// 16-byte range descriptor into `range` (the data the command carries).
pub fn deallocate_sqe(nsid: u32, slba: u64, nlb: u32, range: &mut [u8]) -> Sqe {
    let mut s = Sqe::new(trellis_nvme::sqe::io::DATASET_MANAGEMENT, 0, nsid);
    s.set_cdw(10, 0); // NR: one range (0-based)
    s.set_cdw(11, 1 << 2); // AD: deallocate
    range[..16].fill(0);
    put32(range, 4, nlb); // NLB is 1-based in ranges
    range[8..16].copy_from_slice(&slba.to_le_bytes());
    s
}

#[cfg(test)]
mod tests;
