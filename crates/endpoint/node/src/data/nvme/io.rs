//! NVM command set I/O: Read, Write, Flush, Write Zeroes, Dataset Management,
//! and the reservation commands (their state machine is in `resv`).
//!
//! The command table (`cmd.rs`) has already found the namespace, refused
//! writes to a read-only one and checked the transfer length; the `check_*`
//! functions here run in that parse step (before any R2T) and prepare the
//! backend request. The handlers then only move data to the reactor's
//! backend queue.
//!
//! Under `indexing_slicing` and `cast_possible_truncation` (issue 32 item
//! 8); each allowance names its proof.
#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use crate::backend::{IoReq, Op};
use crate::config::qos::QosMode;
use crate::data::nvme::exec::Access;
use crate::data::nvme::exec::Request;
use crate::data::nvme::exec::{Ctx, Exec, Queue, ResvWait};
use crate::data::qos::ResvAccess;
use crate::state::resv::{HostId, Notices, State};
use crate::state::subsystem::Namespace;
use std::sync::atomic::Ordering::Relaxed;
use trellis_nvme::resv::{self, AcquireAction, AcquireCmd, RegisterCmd, ReleaseCmd};
use trellis_nvme::status::generic;
use trellis_nvme::{Sqe, Status};

/// DSM range: context attributes u32, length in blocks u32 (1-based), SLBA u64.
pub(crate) const DSM_RANGE_BYTES: usize = 16;
/// DSM attribute: deallocate the ranges (NVMe Base 2.0, Figure 373, AD bit).
const DSM_DEALLOCATE: u32 = 1 << 2;

/// Number of ranges a Dataset Management command names (NR is 0-based).
pub(crate) fn dsm_ranges(sqe: &Sqe) -> usize {
    (sqe.cdw10() & 0xff) as usize + 1
}
/// Write Zeroes CDW12 bit 25: Deallocate (NVM Command Set spec, Write Zeroes).
const WZ_DEAC: u32 = 1 << 25;

/// Checks that `nlb` blocks from `slba` lie inside the namespace.
fn range_ok(ns: &Namespace, slba: u64, nlb: u64) -> bool {
    slba.checked_add(nlb)
        .is_some_and(|end| end <= ns.size_blocks())
}

/// The LBA range of a Read, Write or Write Zeroes as a backend request.
fn block_req(ns: &Namespace, sqe: &Sqe, op: Op) -> Result<IoReq, Status> {
    let nlb = sqe.nlb() as u64;
    if !range_ok(ns, sqe.slba(), nlb) {
        return Err(generic::LBA_OUT_OF_RANGE.dnr());
    }
    let bs = ns.block_size() as u64;
    Ok(IoReq {
        op,
        offset_bytes: sqe.slba() * bs,
        len_bytes: nlb * bs,
        buf: std::ptr::null_mut(),
        fua: sqe.fua(),
    })
}

pub(crate) fn check_read(ns: &Namespace, req: &mut Request) -> Result<(), Status> {
    req.io = block_req(ns, &req.sqe, Op::Read)?;
    // Decided here, where the namespace is at hand, so the handler of a
    // null-backend read (the benchmark path) does not look it up again.
    req.zero_data = ns.reads_zero();
    Ok(())
}

pub(crate) fn check_write(ns: &Namespace, req: &mut Request) -> Result<(), Status> {
    req.io = block_req(ns, &req.sqe, Op::Write)?;
    Ok(())
}

pub(crate) fn check_write_zeroes(ns: &Namespace, req: &mut Request) -> Result<(), Status> {
    req.io = block_req(ns, &req.sqe, Op::WriteZeroes)?;
    Ok(())
}

/// The namespace the parse step resolved, if this queue's namespace set
/// still has it: one removed while its command waited for data (R2T) is
/// gone from the set the queue took since, and the command fails with
/// [`gone`].
#[inline]
fn ns_of<'a>(q: &'a Queue, req: &Request) -> Option<&'a Namespace> {
    q.ns.by_uid(req.ns_uid)
}

/// The completion of a command whose namespace was removed under it.
#[cold]
fn gone() -> Exec {
    Exec::Done(generic::INVALID_NAMESPACE.dnr())
}

/// The fence at execution (docs/target.md, "HA pair"): a command parsed
/// while this path served may have waited since (for its data, in a
/// scheduler, in a frozen process). Checked again as it is about to reach
/// the backend: the ANA state of its listener now, and the HA lease's serve
/// deadline on a fresh clock. A path error (ANA Inaccessible), so the host
/// retries on another path.
#[inline]
fn fenced(queue: &Queue, ns: &Namespace) -> Option<Status> {
    if let Some(st) = queue.reg.ana().io_status(queue.portid, ns.ana_idx()) {
        return Some(st);
    }
    (!queue.reg.fence().allows_now()).then_some(trellis_nvme::status::path::ANA_INACCESSIBLE)
}

/// Submits `io` for `req` to the reactor's queue for its namespace, through
/// its scheduler when the namespace has one.
fn submit(queue: &Queue, ctx: &mut Ctx, req: &mut Request, io: &IoReq) -> Exec {
    let Some(ns) = ns_of(queue, req) else {
        return gone();
    };
    if ns.qos() == QosMode::Off {
        return submit_direct(queue, ctx, req, io);
    }
    if let Some(st) = fenced(queue, ns) {
        return Exec::Done(st);
    }
    let access = resv_access(queue, req);
    if let Some(st) = access.and_then(|a| resv_denies(ns, a)) {
        return Exec::Done(st);
    }
    let tenant = queue.q.as_ref().map_or(0, |q| q.ctrl.tenant());
    let now = ctx.now_ns;
    let Some(qq) = ctx.queue(ns).and_then(|q| q.qos()) else {
        return Exec::Done(generic::INTERNAL_ERROR);
    };
    // SAFETY: as in `submit_direct`, except in-capsule data: `write` copies
    // it into the request's buffer for a scheduled namespace, since the
    // scheduler may hold the request past this call.
    match unsafe { qq.submit_for(tenant, io, req.tag.into(), access, now) } {
        Some((st, credits)) => {
            if st.is_success() {
                req.credit = u32::from(u16::try_from(credits).unwrap_or(u16::MAX));
            } else if st != crate::data::qos::QOS_BUSY {
                backend_failed(ns);
            }
            Exec::Done(st)
        }
        None => Exec::Pending,
    }
}

/// Submits `io` for `req` to the reactor's queue for its namespace.
fn submit_direct(queue: &Queue, ctx: &mut Ctx, req: &Request, io: &IoReq) -> Exec {
    let Some(ns) = ns_of(queue, req) else {
        return gone();
    };
    if let Some(st) = fenced(queue, ns) {
        return Exec::Done(st);
    }
    if let Some(st) = resv_access(queue, req).and_then(|a| resv_denies(ns, a)) {
        return Exec::Done(st);
    }
    crate::sys::fault::after_resv_check_point();
    let Some(q) = ctx.queue(ns) else {
        return Exec::Done(generic::INTERNAL_ERROR);
    };
    // SAFETY: `io.buf` is either null (no data), the request's own buffer,
    // which is not touched until the request completes (the slot stays
    // Executing and the reactor keeps the connection, and so the buffer,
    // alive while `backend_in_flight` > 0), or in-capsule data that a
    // synchronous backend reads inside this call.
    match unsafe { q.submit(io, req.tag.into()) } {
        Some(st) => {
            if !st.is_success() {
                backend_failed(ns);
            }
            Exec::Done(st)
        }
        None => Exec::Pending,
    }
}

/// The reservation access of `req` from this queue's host: None for a
/// command reservations do not gate (§8.19, the command table's `access`).
#[inline]
fn resv_access(queue: &Queue, req: &Request) -> Option<ResvAccess> {
    let write = match req.cmd.access {
        Access::None => return None,
        Access::Read => false,
        Access::Write => true,
    };
    let host = queue
        .q
        .as_ref()
        .map(|q| q.ctrl.resv_host())
        .unwrap_or_default();
    Some(ResvAccess { host, write })
}

/// Checked again when a command reaches the backend, as the fence is: a
/// write that waited for its data (R2T) while its host was preempted must
/// not land (Preempt and Abort, §8.19.7). One load while none is held.
#[inline]
fn resv_denies(ns: &Namespace, a: ResvAccess) -> Option<Status> {
    if !ns.resv().any_held() {
        return None;
    }
    ns.resv().check_io(&a.host, a.write).err()
}

/// A synchronous backend failed a request of `ns` (asynchronous failures
/// are counted as they are reaped, `Conn::backend_done`).
#[cold]
fn backend_failed(ns: &Namespace) {
    ns.stats()
        .backend_errors
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// A scheduled read of a null namespace that the scheduler completes at once
/// (`QosQueue::run_zero_read`): its I/O credits, or None to take the general
/// path. As with QoS off, no backend call: the data is the shared zero page.
#[inline]
fn run_zero_read(q: &Queue, ctx: &mut Ctx, ns: &Namespace, len_bytes: u64) -> Option<u32> {
    let tenant = q.q.as_ref().map_or(0, |q| q.ctrl.tenant());
    let now = ctx.now_ns;
    ctx.queue(ns)?.qos()?.run_zero_read(tenant, len_bytes, now)
}

pub(crate) fn read(q: &mut Queue, ctx: &mut Ctx, req: &mut Request) -> Exec {
    if req.zero_data {
        // Null backend: no submit, no memset; the data comes from the shared zero buffer.
        match ns_of(q, req) {
            Some(ns) if ns.qos() == QosMode::Off => return Exec::Done(Status::SUCCESS),
            Some(ns) => {
                if let Some(credits) = run_zero_read(q, ctx, ns, req.io.len_bytes) {
                    req.credit = credits.min(u16::MAX as u32);
                    return Exec::Done(Status::SUCCESS);
                }
            }
            None => return gone(),
        }
    }
    read_submit(q, ctx, req)
}

/// A read through the backend queue (and its scheduler, if any). Kept out of
/// `read`, so that the null reads above pay for no registers it needs.
#[inline(never)]
fn read_submit(q: &mut Queue, ctx: &mut Ctx, req: &mut Request) -> Exec {
    if req.zero_data {
        // Scheduled like any read of this length, but the backend has
        // nothing to write: a data-less request, the buffer left alone.
        let io = IoReq {
            op: Op::Flush,
            buf: std::ptr::null_mut(),
            ..req.io
        };
        return submit(q, ctx, req, &io);
    }
    let mut io = req.io;
    debug_assert!(req.buf.capacity() as u64 >= io.len_bytes);
    io.buf = req.buf.as_mut_ptr();
    submit(q, ctx, req, &io)
}

/// Force Unit Access when the host turned the volatile write cache off
/// (WCE = 0): it may then skip flushes, so the write must be durable when it
/// completes, as on a drive without a cache.
#[inline]
fn write_through(q: &Queue, req: &Request, io: &mut IoReq) {
    if !io.fua && q.q.as_ref().is_some_and(|q| q.ctrl.write_cache_off()) {
        io.fua = true;
        if let Some(ns) = ns_of(q, req) {
            ns.stats().write_through.fetch_add(1, Relaxed);
        }
    }
}

pub(crate) fn write(q: &mut Queue, ctx: &mut Ctx, req: &mut Request) -> Exec {
    let mut io = req.io;
    write_through(q, req, &mut io);
    let icd = ctx.icd;
    if icd.is_empty() {
        io.buf = req.buf.as_mut_ptr();
    } else if ns_of(q, req).is_some_and(|ns| ns.write_in_place()) {
        // The backend reads the data inside submit; the receive buffer stays
        // put until then, so no copy.
        io.buf = icd.as_ptr() as *mut u8;
    } else {
        req.buf.slice_mut(icd.len()).copy_from_slice(icd);
        io.buf = req.buf.as_mut_ptr();
    }
    submit(q, ctx, req, &io)
}

pub(crate) fn flush(q: &mut Queue, ctx: &mut Ctx, req: &mut Request) -> Exec {
    submit(q, ctx, req, &IoReq::NONE)
}

/// Write Zeroes: the request prepared by its check has no data.
pub(crate) fn write_zeroes(q: &mut Queue, ctx: &mut Ctx, req: &mut Request) -> Exec {
    if req.sqe.cdw12() & WZ_DEAC != 0 {
        // The blocks are zeroed either way (DEAC is a hint): counted and
        // logged so a test can tell the host used it (Linux sets DEAC when
        // DLFEAT says deallocated blocks read as zeroes).
        let Some(ns) = ns_of(q, req) else {
            return gone();
        };
        ns.stats().write_zeroes_deac.fetch_add(1, Relaxed);
        let (slba, nlb) = (req.sqe.slba(), req.sqe.nlb());
        tracing::debug!(
            nsid = ns.nsid(),
            slba,
            nlb,
            "write zeroes with deallocate (DEAC)"
        );
    }
    let mut io = req.io;
    write_through(q, req, &mut io);
    submit(q, ctx, req, &io)
}

/// Deallocate (AD) each range; other attributes are hints we may ignore.
/// Every range is checked before any is applied, so a bad range changes
/// nothing. The ranges go to the reactor's queue as one request, which
/// merges them (so at most the namespace's size is deallocated, however the
/// 256 ranges overlap) and deallocates them in bounded pieces off the
/// reactor's loop (`backend::zero`); the command completes when all have.
pub(crate) fn dataset_management(q: &mut Queue, ctx: &mut Ctx, req: &mut Request) -> Exec {
    let q = &*q;
    let Some(ns) = ns_of(q, req) else {
        return gone();
    };
    let nr = dsm_ranges(&req.sqe);
    let deallocate = req.sqe.cdw11() & DSM_DEALLOCATE != 0;
    let ranges = req.buf.slice(nr * DSM_RANGE_BYTES);
    #[allow(
        clippy::indexing_slicing,
        reason = "both callers iterate i in 0..nr, and ranges is nr * DSM_RANGE_BYTES \
                  long (cmd::parse refused a shorter transfer: Len::Ranges)"
    )]
    let range = |i: usize| {
        let r = &ranges[i * DSM_RANGE_BYTES..];
        (trellis_nvme::le32(r, 4) as u64, trellis_nvme::le64(r, 8))
    };
    if (0..nr).any(|i| {
        let (nlb, slba) = range(i);
        !range_ok(ns, slba, nlb)
    }) {
        return Exec::Done(generic::LBA_OUT_OF_RANGE.dnr());
    }
    if !deallocate {
        return Exec::Done(Status::SUCCESS);
    }
    let bs = ns.block_size() as u64;
    // range_ok: slba + nlb fits the namespace, so neither product overflows.
    let bytes: Vec<(u64, u64)> = (0..nr)
        .map(range)
        .filter(|&(nlb, _)| nlb > 0)
        .map(|(nlb, slba)| (slba * bs, nlb * bs))
        .collect();
    if let Some(st) = fenced(q, ns) {
        return Exec::Done(st);
    }
    // Checked again here as for every write-group command: range data that
    // waited for an R2T while its host was preempted must not deallocate.
    if let Some(st) = resv_access(q, req).and_then(|a| resv_denies(ns, a)) {
        return Exec::Done(st);
    }
    let Some(bq) = ctx.queue(ns) else {
        return Exec::Done(generic::INTERNAL_ERROR);
    };
    // Not scheduled: deallocation is metadata work, not a tenant's I/O.
    match bq.submit_ranges(Op::Discard, &bytes, false, req.tag.into()) {
        Some(st) => Exec::Done(st),
        None => Exec::Pending,
    }
}

// Reservation commands (NVMe Base 2.0 §8.19). They run on the reactor that
// received them: each takes the namespace's reservation command lock, and
// writes the state file (fsync) when Persist Through Power Loss is set; they
// are rare control-path commands, so that reactor's brief wait is accepted
// (other reactors' I/O checks do not wait for it).

const INVALID_FIELD: Status = generic::INVALID_FIELD.dnr();

pub(crate) fn resv_register(q: &mut Queue, _ctx: &mut Ctx, req: &mut Request) -> Exec {
    let Some(cmd) = RegisterCmd::decode(&req.sqe) else {
        return Exec::Done(INVALID_FIELD);
    };
    let Some((crkey, nrkey)) = resv::decode_keys(req.buf.slice(resv::KEYS_LEN)) else {
        return Exec::Done(INVALID_FIELD);
    };
    resv_apply(q, req, |s, h, max| s.register(h, &cmd, crkey, nrkey, max))
}

pub(crate) fn resv_acquire(q: &mut Queue, ctx: &mut Ctx, req: &mut Request) -> Exec {
    let Some(cmd) = AcquireCmd::decode(&req.sqe) else {
        return Exec::Done(INVALID_FIELD);
    };
    let Some((crkey, prkey)) = resv::decode_keys(req.buf.slice(resv::KEYS_LEN)) else {
        return Exec::Done(INVALID_FIELD);
    };
    let done = resv_apply(q, req, |s, h, _| s.acquire(h, &cmd, crkey, prkey));
    match done {
        Exec::Done(st) if st.is_success() && cmd.action == AcquireAction::PreemptAndAbort => {
            abort_wait(q, ctx, req)
        }
        other => other,
    }
}

/// Preempt and Abort changed the reservation: its completion waits until
/// every reactor has finished the commands already past their reservation
/// check (at the backend, in a scheduler), so none of the preempted hosts'
/// commands completes after it (`state::drain`). Parked, not waited for:
/// the connection polls it (`Conn::poll_resv_waits`).
fn abort_wait(q: &mut Queue, ctx: &Ctx, req: &Request) -> Exec {
    let gen = q.reg.drain().request(req.ns_uid);
    if q.reg.drain().is_done(gen) {
        return Exec::Done(Status::SUCCESS);
    }
    let timeout_ns = q
        .reg
        .limits()
        .preempt_abort_timeout_ms
        .saturating_mul(1_000_000);
    q.resv_waits.push(ResvWait {
        slot: req.slot(),
        gen,
        deadline_ns: ctx.now_ns.saturating_add(timeout_ns),
    });
    Exec::Held
}

pub(crate) fn resv_release(q: &mut Queue, _ctx: &mut Ctx, req: &mut Request) -> Exec {
    let Some(cmd) = ReleaseCmd::decode(&req.sqe) else {
        return Exec::Done(INVALID_FIELD);
    };
    let Some(crkey) = resv::decode_crkey(req.buf.slice(resv::CRKEY_LEN)) else {
        return Exec::Done(INVALID_FIELD);
    };
    resv_apply(q, req, |s, h, _| s.release(h, &cmd, crkey))
}

/// Runs a reservation command for this queue's host on the namespace's
/// state, then leaves its notices with the hosts they concern.
fn resv_apply(
    q: &Queue,
    req: &Request,
    f: impl FnOnce(&mut State, &HostId, usize) -> Result<Notices, Status>,
) -> Exec {
    let Some(ns) = ns_of(q, req) else {
        return gone();
    };
    let Some(ctrl) = q.q.as_ref().map(|c| &c.ctrl) else {
        return Exec::Done(generic::COMMAND_SEQUENCE_ERROR.dnr());
    };
    let host = ctrl.resv_host();
    // Every host with a zero ID would share one registration: refused.
    if host.is_zero() {
        return Exec::Done(generic::HOST_ID_INCONSISTENT.dnr());
    }
    // At execution, as for commands that reach the backend: a command
    // parsed while this node served may have waited past the fence.
    if let Some(st) = fenced(q, ns) {
        return Exec::Done(st);
    }
    match ns
        .resv()
        .apply_with(q.reg.shared_resv(), |s, max| f(s, &host, max))
    {
        Ok(notes) => {
            resv_notify(ctrl, ns.nsid(), &notes);
            Exec::Done(Status::SUCCESS)
        }
        Err(st) => Exec::Done(st),
    }
}

/// Queues each notice on every controller of its host in this subsystem
/// (unless masked there, feature 82h) and raises the Reservation Log Page
/// Available event.
fn resv_notify(ctrl: &crate::state::subsystem::Controller, nsid: u32, notes: &Notices) {
    let Some(sub) = ctrl.subsys().filter(|_| !notes.is_empty()) else {
        return;
    };
    let ctrls: Vec<_> = crate::sys::lock(&sub.controllers)
        .values()
        .cloned()
        .collect();
    for (host, kind) in notes {
        for c in ctrls.iter().filter(|c| host.names(&c.resv_host())) {
            if c.resv_log().push(nsid, *kind) {
                c.raise_ungated(crate::state::aen::RESV_LOG);
            }
        }
    }
}

/// Reservation Report: the extended data structure (EDS = 1) only, since
/// this target identifies hosts by 128-bit host IDs; EDS = 0 fails with
/// Host Identifier Inconsistent Format, as the spec requires (Linux asks
/// with EDS = 1 first, and only falls back to EDS = 0 on that status).
pub(crate) fn resv_report(q: &mut Queue, _ctx: &mut Ctx, req: &mut Request) -> Exec {
    let Some(ns) = ns_of(q, req) else {
        return gone();
    };
    if req.sqe.cdw11() & resv::REPORT_EDS == 0 {
        return Exec::Done(generic::HOST_ID_INCONSISTENT.dnr());
    }
    // NUMD (0-based dwords) and the transfer should agree; the smaller wins.
    let numd_bytes = (req.sqe.cdw10() as u64 + 1) * 4;
    let len = (req.xfer_len as usize).min(usize::try_from(numd_bytes).unwrap_or(usize::MAX));
    // Not even the header fits: refused, as nvmet does.
    if len < resv::REPORT_EXT_HDR_LEN {
        return Exec::Done(INVALID_FIELD);
    }
    let (h, regs) = ns.resv().snapshot().report();
    let out = req.buf.slice_mut(req.xfer_len as usize);
    let (data, rest) = out.split_at_mut(len);
    resv::encode_report_ext(&h, &regs, data);
    rest.fill(0);
    Exec::Done(Status::SUCCESS)
}
