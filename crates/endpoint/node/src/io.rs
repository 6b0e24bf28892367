//! NVM command set I/O: Read, Write, Flush, Write Zeroes, Dataset Management.
//!
//! Each handler validates the namespace, the LBA range and the transfer
//! length against the namespace's block size, then hands one request to the
//! reactor's backend queue.

use crate::backend::{IoReq, Op};
use crate::conn::{Conn, Ctx, Exec, Slot};
use crate::subsystem::Namespace;
use trellis_nvme::sqe::io as op;
use trellis_nvme::status::generic;
use trellis_nvme::{Sqe, Status};

/// DSM range: context attributes u32, length in blocks u32 (1-based), SLBA u64.
const DSM_RANGE_BYTES: usize = 16;
/// Write Zeroes CDW12 bit 25: Deallocate (NVM Command Set spec, Write Zeroes).
const WZ_DEAC: u32 = 1 << 25;

/// Checks that `nlb` blocks from `slba` lie inside the namespace.
fn range_ok(ns: &Namespace, slba: u64, nlb: u64) -> bool {
    slba.checked_add(nlb)
        .is_some_and(|end| end <= ns.size_blocks)
}

/// Validation shared by Read and Write, before any data moves.
fn check_rw(ns: &Namespace, sqe: &Sqe, xfer_len: u32, write: bool) -> Result<IoReq, Status> {
    let nlb = sqe.nlb() as u64;
    if !range_ok(ns, sqe.slba(), nlb) {
        return Err(generic::LBA_OUT_OF_RANGE.dnr());
    }
    if write && ns.read_only {
        return Err(generic::NS_WRITE_PROTECTED.dnr());
    }
    let len = nlb * ns.block_size as u64;
    if len != xfer_len as u64 {
        return Err(generic::DATA_SGL_LENGTH_INVALID.dnr());
    }
    Ok(IoReq {
        op: if write { Op::Write } else { Op::Read },
        offset_bytes: sqe.slba() * ns.block_size as u64,
        len_bytes: len,
        buf: std::ptr::null_mut(),
        fua: sqe.fua(),
    })
}

/// Submits a request for slot `s` to the reactor's queue for `ns`.
fn submit(
    ctx: &mut Ctx,
    conn_idx: u32,
    ns: &Namespace,
    slot: &mut Slot,
    s: u16,
    mut req: IoReq,
) -> Exec {
    slot.ns_uid = ns.uid as u32;
    if matches!(req.op, Op::Read | Op::Write) && req.buf.is_null() {
        debug_assert!(slot.buf.capacity() as u64 >= req.len_bytes);
        req.buf = slot.buf.as_mut_ptr();
    }
    let tag = (conn_idx as u64) << 16 | s as u64;
    let Some(q) = ctx.queue(ns) else {
        return Exec::Done(generic::INTERNAL_ERROR);
    };
    // SAFETY: the slot's buffer is not touched until the request completes:
    // the slot stays Executing, and the reactor keeps the connection (and so
    // the buffer) alive while `backend_in_flight` > 0.
    match unsafe { q.submit(&req, tag) } {
        Some(st) => Exec::Done(st),
        None => Exec::Pending,
    }
}

impl Conn {
    /// I/O queue dispatch.
    pub(crate) fn exec_io(&mut self, ctx: &mut Ctx, s: u16, sqe: &Sqe) -> Exec {
        if sqe.opcode() == op::FABRICS {
            return self.exec_fabrics(ctx, sqe);
        }
        let q = self.q.as_ref().expect("connected");
        if !q.ctrl.ready() {
            return Exec::Done(generic::COMMAND_SEQUENCE_ERROR.dnr());
        }
        let sub = q
            .ctrl
            .subsys
            .as_ref()
            .expect("I/O queues belong to NVM subsystems");
        let Some(ns) = sub.namespace(sqe.nsid()) else {
            return Exec::Done(generic::INVALID_NAMESPACE.dnr());
        };
        let slot = &mut self.slots[s as usize];
        let idx = self.idx;
        let rx = &self.rx;
        let req = match sqe.opcode() {
            op::READ if ns.backend.reads_zero() => {
                // Null backend: no submit, no memset; the data comes from the shared zero buffer.
                return match check_rw(ns, sqe, slot.xfer_len, false) {
                    Ok(_) => {
                        slot.ns_uid = ns.uid as u32;
                        slot.zero_data = true;
                        Exec::Done(Status::SUCCESS)
                    }
                    Err(st) => Exec::Done(st),
                };
            }
            op::READ => check_rw(ns, sqe, slot.xfer_len, false),
            op::WRITE => {
                slot.is_write = true;
                check_rw(ns, sqe, slot.xfer_len, true).map(|mut r| {
                    if slot.icd_at != crate::conn::NO_ICD {
                        let data =
                            &rx[slot.icd_at as usize..slot.icd_at as usize + r.len_bytes as usize];
                        if ns.backend.synchronous() {
                            // SAFETY: a synchronous backend reads the data inside
                            // submit; the receive buffer is not touched until then.
                            r.buf = data.as_ptr() as *mut u8;
                        } else {
                            slot.buf.slice_mut(data.len()).copy_from_slice(data);
                        }
                    }
                    r
                })
            }
            op::FLUSH => Ok(IoReq {
                op: Op::Flush,
                offset_bytes: 0,
                len_bytes: 0,
                buf: std::ptr::null_mut(),
                fua: false,
            }),
            op::WRITE_ZEROES => write_zeroes_req(ns, sqe),
            op::DATASET_MANAGEMENT => return dataset_management(ctx, idx, ns, slot, s),
            _ => Err(generic::INVALID_OPCODE.dnr()),
        };
        match req {
            Ok(r) => submit(ctx, idx, ns, slot, s, r),
            Err(st) => Exec::Done(st),
        }
    }

    /// Validates a host-to-controller command before its R2T goes out.
    pub(crate) fn precheck_write(&mut self, _ctx: &mut Ctx, s: u16) -> Result<(), Status> {
        let sqe = self.slots[s as usize].sqe;
        let Some(q) = self.q.as_ref() else {
            // Connect carries its data in the capsule: anything else is out of order.
            return Err(generic::COMMAND_SEQUENCE_ERROR.dnr());
        };
        let Some(sub) = q.ctrl.subsys.as_ref() else {
            return Ok(());
        };
        if q.qid == 0 || sqe.opcode() == op::FABRICS {
            return Ok(());
        }
        if !q.ctrl.ready() {
            return Err(generic::COMMAND_SEQUENCE_ERROR.dnr());
        }
        let ns = sub
            .namespace(sqe.nsid())
            .ok_or(generic::INVALID_NAMESPACE.dnr())?;
        match sqe.opcode() {
            op::WRITE => check_rw(ns, &sqe, self.slots[s as usize].xfer_len, true).map(|_| ()),
            op::DATASET_MANAGEMENT if ns.read_only => Err(generic::NS_WRITE_PROTECTED.dnr()),
            op::DATASET_MANAGEMENT => Ok(()),
            _ => Err(generic::INVALID_OPCODE.dnr()),
        }
    }
}

fn write_zeroes_req(ns: &Namespace, sqe: &Sqe) -> Result<IoReq, Status> {
    let nlb = sqe.nlb() as u64;
    if !range_ok(ns, sqe.slba(), nlb) {
        return Err(generic::LBA_OUT_OF_RANGE.dnr());
    }
    if ns.read_only {
        return Err(generic::NS_WRITE_PROTECTED.dnr());
    }
    if sqe.cdw12() & WZ_DEAC != 0 {
        // The blocks are zeroed either way (DEAC is a hint): counted and
        // logged so a test can tell the host used it (Linux sets DEAC when
        // DLFEAT says deallocated blocks read as zeroes).
        ns.stats
            .write_zeroes_deac
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(
            nsid = ns.nsid,
            slba = sqe.slba(),
            nlb,
            "write zeroes with deallocate (DEAC)"
        );
    }
    let bs = ns.block_size as u64;
    Ok(IoReq {
        op: Op::WriteZeroes,
        offset_bytes: sqe.slba() * bs,
        len_bytes: nlb * bs,
        buf: std::ptr::null_mut(),
        fua: sqe.fua(),
    })
}

/// Deallocate (AD) each range; other attributes are hints we may ignore.
/// Every range is checked before any is applied, so a bad range changes nothing.
fn dataset_management(ctx: &mut Ctx, idx: u32, ns: &Namespace, slot: &mut Slot, s: u16) -> Exec {
    let sqe = slot.sqe;
    let nr = (sqe.cdw10() & 0xff) as usize + 1;
    let deallocate = sqe.cdw11() & (1 << 2) != 0;
    if (slot.xfer_len as usize) < nr * DSM_RANGE_BYTES {
        return Exec::Done(generic::DATA_SGL_LENGTH_INVALID.dnr());
    }
    if ns.read_only {
        return Exec::Done(generic::NS_WRITE_PROTECTED.dnr());
    }
    let ranges = slot.buf.slice(nr * DSM_RANGE_BYTES).to_vec();
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
    let bs = ns.block_size as u64;
    for i in 0..nr {
        let (nlb, slba) = range(i);
        if nlb == 0 {
            continue;
        }
        let req = IoReq {
            op: Op::Discard,
            offset_bytes: slba * bs,
            len_bytes: nlb * bs,
            buf: std::ptr::null_mut(),
            fua: false,
        };
        match submit(ctx, idx, ns, slot, s, req) {
            Exec::Done(st) if st.is_success() => {}
            Exec::Done(st) => return Exec::Done(st),
            // Discard is synchronous in every backend; see backend::file.
            _ => return Exec::Done(generic::INTERNAL_ERROR),
        }
    }
    Exec::Done(Status::SUCCESS)
}
