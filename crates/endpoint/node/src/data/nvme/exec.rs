//! What a command handler sees, independent of the transport: the
//! [`Request`] (one command, its data buffer and prepared backend request),
//! the [`Queue`] it arrived on (controller, port, held requests), the
//! reactor's [`Ctx`], and the shape of a command table row ([`Command`]).
//! The transport (`conn`) and the tables (`cmd`) build on these; handlers
//! (`admin`, `io`) use only these.
//!
//! Under `indexing_slicing` and `cast_possible_truncation` (issue 32 item
//! 8); each allowance names its proof.
#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use crate::backend::{BackendQueue, IoReq, Op};
use crate::config::ListenerKind;
use crate::state::buf::AlignedBuf;
use crate::state::stats::{lat_bucket, LAT_BUCKETS};
use crate::state::subsystem::{Controller, Namespace, Registry};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use trellis_nvme::{Sqe, Status};

/// Where a command may run: bits of [`Command::on`].
pub mod on {
    /// A queue before its Fabrics Connect.
    pub const UNCONNECTED: u8 = 1 << 0;
    /// The admin queue of an NVM subsystem's controller.
    pub const ADMIN: u8 = 1 << 1;
    /// An I/O queue.
    pub const IO: u8 = 1 << 2;
    /// The admin queue of a discovery controller.
    pub const DISCOVERY: u8 = 1 << 3;
}

/// Data direction (NVMe Base 2.0, Figure 88: opcode bits 1:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    None,
    ToCtrl,
    ToHost,
}

/// How long the transfer (SGL1 length) must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Len {
    /// No data (the direction check already refuses any).
    None,
    /// Anything up to MDTS; the handler zero-fills what it does not use.
    Any,
    /// Exactly this many bytes.
    Exact(u32),
    /// NLB x the namespace's block size (Read, Write).
    Blocks,
    /// (NR + 1) x 16 bytes of ranges, at least (Dataset Management).
    Ranges,
    /// NUMD + 1 dwords (Get Log Page).
    LogPage,
}

/// Commands Supported and Effects bits (NVMe Base 2.0, Figure 210).
pub mod effect {
    /// Command supported.
    pub const CSUPP: u32 = 1 << 0;
    /// Logical block content change.
    pub const LBCC: u32 = 1 << 1;
}

/// The reservation command group of an I/O command (§8.19, "Command
/// Behavior in the Presence of a Reservation"): which access a reservation
/// may deny it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Not checked (admin commands, the reservation commands themselves).
    None,
    Read,
    Write,
}

/// A transport-independent handler: the queue's state, the reactor's
/// context, and the request (its data buffer included).
pub type Handler = fn(&mut Queue, &mut Ctx, &mut Request) -> Exec;

/// A command-specific check that needs no data: runs at parse time, before
/// any R2T, and may prepare the backend request.
pub type Check = fn(&Namespace, &mut Request) -> Result<(), Status>;

/// One row of the command table.
pub struct Command {
    pub name: &'static str,
    pub opcode: u8,
    /// Fabrics command type (only for opcode 7Fh rows).
    pub fctype: u8,
    /// [`on`] bits: the queues this command runs on.
    pub on: u8,
    /// Status when the opcode is known but sent to a queue it does not run on.
    pub misplaced: Status,
    /// Requires CC.EN = 1 and CSTS.RDY = 1 on the controller.
    pub needs_ready: bool,
    pub dir: Dir,
    pub len: Len,
    /// Names an active namespace in NSID.
    pub needs_ns: bool,
    /// Changes namespace content: refused on a read-only namespace.
    pub media_write: bool,
    /// The handler takes in-capsule data from `Ctx::icd` where it lies (no
    /// copy); otherwise the transport copies it into the request's buffer.
    pub icd_in_place: bool,
    /// Commands Supported and Effects bits beyond CSUPP.
    pub effects: u32,
    /// Reservation command group.
    pub access: Access,
    pub check: Option<Check>,
    pub exec: Handler,
}

/// A command being executed, independent of the transport that carried it.
pub struct Request {
    pub sqe: Sqe,
    /// The table row, set by [`parse`].
    pub cmd: &'static Command,
    /// Transfer length from SGL1.
    pub xfer_len: u32,
    /// Data buffer (in: write data; out: read data), at least `xfer_len`.
    pub buf: AlignedBuf,
    /// Identifies the request to the backend (connection and slot).
    pub tag: crate::backend::IoTag,
    /// Namespace (registry uid), or `NO_NS`.
    pub ns_uid: u32,
    /// The backend request prepared by the command's check.
    pub io: IoReq,
    /// The read's data is all zeroes (null backend): sent from a shared zero
    /// buffer, so the data buffer is neither cleared nor touched.
    pub zero_data: bool,
    pub dw0: u32,
    pub dw1: u32,
    /// The tenant's I/O credits to return in CQE DW1 (`NO_CREDIT`: none).
    pub credit: u32,
    /// When its capsule was taken (the reactor loop's clock), for latency.
    pub arrived_ns: u64,
}

/// `Request::credit` of a command that returns no credit.
pub const NO_CREDIT: u32 = u32::MAX;

/// `Request::ns_uid` when the command names no namespace.
pub const NO_NS: u32 = u32::MAX;

impl Command {
    /// The defaults a table row starts from (`..Command::NONE`): runs
    /// nowhere, moves no data, needs nothing, changes nothing.
    pub const NONE: Command = Command {
        name: "unknown",
        opcode: 0xFF,
        fctype: 0,
        on: 0,
        misplaced: trellis_nvme::status::generic::INVALID_OPCODE.dnr(),
        needs_ready: false,
        dir: Dir::None,
        len: Len::None,
        needs_ns: false,
        media_write: false,
        icd_in_place: false,
        effects: 0,
        access: Access::None,
        check: None,
        exec: |_, _, _| Exec::Done(trellis_nvme::status::generic::INVALID_OPCODE.dnr()),
    };
}

/// `Request::cmd` until the command table has found the row: never
/// executed, since parse refuses a command without a row.
pub static UNKNOWN: Command = Command::NONE;

impl Request {
    pub fn new() -> Request {
        Request {
            sqe: Sqe::default(),
            cmd: &UNKNOWN,
            xfer_len: 0,
            buf: AlignedBuf::empty(),
            tag: crate::backend::IoTag::new(0, 0),
            ns_uid: NO_NS,
            io: IoReq::NONE,
            zero_data: false,
            dw0: 0,
            dw1: 0,
            credit: NO_CREDIT,
            arrived_ns: 0,
        }
    }

    /// Resets per-command state for a new command in the same slot.
    pub fn reset(&mut self, sqe: Sqe, now_ns: u64) {
        self.sqe = sqe;
        self.arrived_ns = now_ns;
        self.cmd = &UNKNOWN;
        self.xfer_len = 0;
        self.ns_uid = NO_NS;
        self.io = IoReq::NONE;
        self.zero_data = false;
        self.dw0 = 0;
        self.dw1 = 0;
        self.credit = NO_CREDIT;
    }

    /// Whether the command's data goes to the host.
    pub fn to_host(&self) -> bool {
        self.cmd.dir == Dir::ToHost && self.xfer_len > 0
    }

    /// The command's slot in its connection.
    pub fn slot(&self) -> u16 {
        self.tag.slot()
    }

    /// Copies `data` into the data buffer, zero-filled to the transfer length.
    #[allow(
        clippy::indexing_slicing,
        reason = "n is the smaller of data.len() and out.len()"
    )]
    pub fn reply_data(&mut self, data: &[u8]) -> Exec {
        let len = self.xfer_len as usize;
        let out = self.buf.slice_mut(len);
        let n = data.len().min(len);
        out[..n].copy_from_slice(&data[..n]);
        out[n..].fill(0);
        Exec::Done(Status::SUCCESS)
    }
}

impl Default for Request {
    fn default() -> Self {
        Request::new()
    }
}

/// A backend request with no data yet (Flush, Write Zeroes) or whose buffer
/// the handler fills in (Read, Write).
impl IoReq {
    pub const NONE: IoReq = IoReq {
        op: Op::Flush,
        offset_bytes: 0,
        len_bytes: 0,
        buf: std::ptr::null_mut(),
        fua: false,
    };
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
    /// In-band authentication of this queue (None: the host has no key).
    pub auth: Option<Box<crate::data::nvme::auth::Session>>,
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
    pub queues: &'a mut Vec<Option<NsQueue>>,
    pub reg: &'a Registry,
    pub scratch: &'a mut Vec<u8>,
    /// In-capsule data of the command being executed; empty when its data
    /// came through R2T (then it is in the request's buffer) or there is none.
    pub icd: &'a [u8],
    /// The DH workers and this reactor's mailbox for their results (None:
    /// authentication computes inline, as the fuzz harness and sans-IO
    /// tests do).
    pub auth: Option<&'a crate::data::nvme::auth_work::AuthPort>,
}

impl Ctx<'_> {
    /// The reactor's queue for namespace `ns`, opened on first use.
    #[inline]
    #[allow(
        clippy::indexing_slicing,
        reason = "the get on the line before: a get_mut returned from here \
                  would keep self borrowed for open_queue (a borrow checker limit)"
    )]
    pub fn queue(&mut self, ns: &Namespace) -> Option<&mut NsQueue> {
        // The common case, a queue already open, without the opening code.
        if matches!(self.queues.get(ns.uid()), Some(Some(_))) {
            return self.queues[ns.uid()].as_mut();
        }
        self.open_queue(ns)
    }

    #[cold]
    #[allow(
        clippy::indexing_slicing,
        reason = "the resize_with at the top makes queues longer than ns.uid()"
    )]
    fn open_queue(&mut self, ns: &Namespace) -> Option<&mut NsQueue> {
        if self.queues.len() <= ns.uid() {
            self.queues.resize_with(ns.uid() + 1, || None);
        }
        if self.queues[ns.uid()].is_none() {
            // Write Zeroes and Deallocate go to the backend in bounded
            // pieces, a few per loop (backend::zero); a null backend, which
            // stores nothing, has nothing to zero.
            let limits = crate::backend::zero::ZeroLimits::of(self.reg.limits());
            let chunked = !ns.reads_zero();
            let q = ns.backend().open_queue().map(|q| match chunked {
                true => crate::backend::zero::Chunked::wrap(q, limits),
                false => q,
            });
            let q = q.and_then(|q| match ns.qos() {
                crate::config::qos::QosMode::Off => Ok(NsQueue::Plain(q)),
                crate::config::qos::QosMode::Gimbal => self.gimbal_queue(ns, q),
            });
            match q {
                Ok(q) => self.queues[ns.uid()] = Some(q),
                Err(e) => {
                    tracing::error!("cannot open backend queue for nsid {}: {e}", ns.nsid());
                    return None;
                }
            }
        }
        self.queues[ns.uid()].as_mut()
    }
}

thread_local! {
    /// The id of the reactor this thread runs (0 elsewhere: tests, fuzzing).
    static REACTOR_ID: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Names the reactor this thread runs (at its start), so a queue it opens
/// knows its owner without threading the id through every context.
pub fn set_reactor_id(id: usize) {
    REACTOR_ID.with(|r| r.set(id));
}

/// The id of the reactor this thread runs.
pub fn reactor_id() -> usize {
    REACTOR_ID.with(|r| r.get())
}

impl Ctx<'_> {
    /// `q` wrapped with namespace `ns`'s one Gimbal scheduler, which the
    /// first reactor to open it builds (`Namespace::gimbal`).
    #[cold]
    fn gimbal_queue(&self, ns: &Namespace, q: Box<dyn BackendQueue>) -> anyhow::Result<NsQueue> {
        let time_scale = ns.backend().time_scale();
        let shared = ns.gimbal(|| {
            crate::data::qos::build_shared(
                self.reg.qos(),
                self.reg.tenants(),
                self.now_ns,
                time_scale,
                ns.device_model().as_ref(),
                self.reg.limits().reactors,
            )
        })?;
        let node = crate::data::qos::NodeShare {
            fence: self.reg.fence().clone(),
            resv: ns.resv().clone(),
            reactor: reactor_id(),
        };
        let q = crate::data::qos::wrap(q, shared, node, time_scale);
        Ok(NsQueue::Gimbal(q))
    }
}

/// A parked Preempt and Abort: its slot, the drain generation it waits
/// for, and when it gives up (`target.preempt_abort_timeout_ms`).
#[derive(Clone, Copy, Debug)]
pub struct ResvWait {
    pub slot: u16,
    pub gen: u64,
    pub deadline_ns: u64,
}

/// What command handlers see of a queue: the controller it belongs to, the
/// port it arrived on, held requests and batched statistics. No transport
/// state: a second transport, or the simulator, could drive the handlers.
pub struct Queue {
    pub reg: Arc<Registry>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub listener_kind: ListenerKind,
    pub portid: u16,
    /// Set by Connect.
    pub q: Option<QueueCtx>,
    /// Requests (by slot) parked as AERs.
    pub aers: Vec<u16>,
    /// Reservation Acquires (Preempt and Abort) parked until the commands
    /// past their reservation check have drained (`state::drain`); at most
    /// one per slot.
    pub resv_waits: Vec<ResvWait>,
    /// The namespace set this queue resolves NSIDs and uids against,
    /// refreshed once per received batch ([`Queue::refresh_ns`]).
    pub ns: Arc<crate::state::nsset::NsSet>,
    /// Per-namespace (uid, [rd bytes, wr bytes, rd cmds, wr cmds]) not yet
    /// added to the shared counters.
    stats: Vec<(u32, [u64; 4])>,
    /// Per-namespace latency histograms not yet added (same order as `stats`).
    lat: Vec<[[u32; LAT_BUCKETS]; 2]>,
    /// (host NQN, subsystem NQN) of the PSK identity this connection's TLS
    /// handshake used: Connect must name the same (None: plain TCP).
    pub tls_peer: Option<(String, String)>,
}

impl Queue {
    pub fn new(
        reg: Arc<Registry>,
        peer: SocketAddr,
        local: SocketAddr,
        listener_kind: ListenerKind,
        portid: u16,
    ) -> Queue {
        Queue {
            ns: reg.ns().load(),
            reg,
            peer,
            local,
            listener_kind,
            portid,
            q: None,
            aers: Vec::new(),
            resv_waits: Vec::new(),
            stats: Vec::new(),
            lat: Vec::new(),
            tls_peer: None,
        }
    }

    /// Takes the registry's namespace set if it changed since this queue
    /// took one: one relaxed-cost load per call when it did not.
    #[inline]
    pub fn refresh_ns(&mut self) {
        if self.reg.ns().gen() != self.ns.gen {
            self.ns = self.reg.ns().load();
        }
    }

    /// This queue's subsystem's namespaces (none before Connect or on a
    /// discovery controller).
    pub fn sub_ns(&self) -> &crate::state::nsset::SubNs {
        let idx = self.q.as_ref().and_then(|q| q.ctrl.subsys());
        self.ns.sub(idx.map_or(usize::MAX, |s| s.idx))
    }

    /// The active namespace `nsid` of this queue's subsystem.
    pub fn namespace(&self, nsid: u32) -> Option<&Namespace> {
        self.sub_ns().namespace(nsid).map(|n| &**n)
    }

    /// Counts a successful Read or Write in the batched statistics; false
    /// when the command is not one that counts.
    #[allow(
        clippy::indexing_slicing,
        reason = "i is a position in stats, or its new last entry; lat grows \
                  with it; k is 0 or 1 of [_; 2] (and 2 + k of [_; 4]); \
                  lat_bucket clamps to LAT_BUCKETS - 1"
    )]
    pub(crate) fn count(&mut self, req: &Request, now_ns: u64) -> bool {
        let rw = matches!(
            req.sqe.opcode(),
            trellis_nvme::sqe::io::READ | trellis_nvme::sqe::io::WRITE
        );
        if req.ns_uid == NO_NS || !rw || self.q.as_ref().is_some_and(|q| q.qid == 0) {
            return false;
        }
        let (uid, len) = (req.ns_uid, req.xfer_len as u64);
        let w = req.sqe.opcode() == trellis_nvme::sqe::io::WRITE;
        let i = match self.stats.iter().position(|e| e.0 == uid) {
            Some(i) => i,
            None => {
                self.stats.push((uid, [0; 4]));
                self.lat.push([[0; LAT_BUCKETS]; 2]);
                self.stats.len() - 1
            }
        };
        let e = &mut self.stats[i].1;
        let k = w as usize;
        e[k] += len;
        e[2 + k] += 1;
        let b = lat_bucket(now_ns.saturating_sub(req.arrived_ns));
        self.lat[i][k][b] += 1;
        true
    }

    /// Adds batched statistics to the shared namespace counters.
    pub fn flush_stats(&mut self) {
        for ((uid, v), lat) in self.stats.drain(..).zip(self.lat.drain(..)) {
            // A namespace removed since: its counters went with it.
            let Some(ns) = self.ns.by_uid(uid) else {
                continue;
            };
            let st = &ns.stats();
            st.read_bytes.fetch_add(v[0], Relaxed);
            st.write_bytes.fetch_add(v[1], Relaxed);
            st.read_cmds.fetch_add(v[2], Relaxed);
            st.write_cmds.fetch_add(v[3], Relaxed);
            for (shared, local) in st.latency.iter().zip(lat.iter()) {
                for (a, &n) in shared.iter().zip(local.iter()) {
                    if n > 0 {
                        a.fetch_add(n as u64, Relaxed);
                    }
                }
            }
        }
    }
}

/// One namespace's queue on one reactor: the backend's own queue, or the
/// same wrapped in Gimbal's scheduler (`qos = "gimbal"`). The reactor drives
/// either through `BackendQueue` (`kick`, `reap`, `in_flight`); the I/O
/// handlers that schedule ask for the wrapper with [`NsQueue::qos`], so the
/// backend trait knows nothing of QoS.
pub enum NsQueue {
    Plain(Box<dyn BackendQueue>),
    Gimbal(Box<crate::data::qos::QosQueue>),
}

impl NsQueue {
    /// The Gimbal wrapper, for a `qos = "gimbal"` namespace.
    pub fn qos(&mut self) -> Option<&mut crate::data::qos::QosQueue> {
        match self {
            NsQueue::Plain(_) => None,
            NsQueue::Gimbal(q) => Some(q),
        }
    }
}

impl std::ops::Deref for NsQueue {
    type Target = dyn BackendQueue;
    fn deref(&self) -> &Self::Target {
        match self {
            NsQueue::Plain(q) => &**q,
            NsQueue::Gimbal(q) => &**q,
        }
    }
}

impl std::ops::DerefMut for NsQueue {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            NsQueue::Plain(q) => &mut **q,
            NsQueue::Gimbal(q) => &mut **q,
        }
    }
}
