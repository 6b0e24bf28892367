//! NVMe reservations from the host side (NVMe Base 2.0 §8.19): Reservation
//! Register, Acquire, Release and Report on an I/O queue, and the
//! controller's Reservation Notification log and features (82h, 83h).
//!
//! Not to be confused with `trellis_path::reserve` (bandwidth reservation).
//! A registration belongs to the host ID in [`crate::HostConfig::hostid`]:
//! every controller connected with it shares it.

use crate::engine::Xfer;
use crate::error::{Error, Result};
use crate::queue::Queue;
use crate::Controller;
use trellis_nvme::log::{lid, GetLogPage};
use trellis_nvme::resv::{
    self, AcquireAction, AcquireCmd, Cptpl, Notice, RType, RegisterAction, RegisterCmd, Registrant,
    ReleaseAction, ReleaseCmd, ReportHeader,
};
use trellis_nvme::sqe::{admin, io};
use trellis_nvme::Sqe;

/// Most registrants [`report`] reads (more than any target here allows).
pub const MAX_REPORT_ENTRIES: usize = 1024;

/// Reservation Register on namespace `nsid`: `action` with keys CRKEY
/// (checked unless `iekey`; ignored by Register) and NRKEY.
pub fn register(
    q: &mut Queue,
    nsid: u32,
    action: RegisterAction,
    iekey: bool,
    cptpl: Cptpl,
    crkey: u64,
    nrkey: u64,
) -> Result<()> {
    let mut sqe = Sqe::new(io::RESV_REGISTER, 0, nsid);
    RegisterCmd {
        action,
        iekey,
        cptpl,
    }
    .encode(&mut sqe);
    let data = resv::encode_keys(crkey, nrkey);
    q.exec_ok(sqe, Xfer::ToCtrl(data.len() as u32), &data, &mut [])?;
    Ok(())
}

/// Reservation Acquire (acquire, preempt, preempt and abort) of `rtype`.
pub fn acquire(
    q: &mut Queue,
    nsid: u32,
    action: AcquireAction,
    rtype: RType,
    crkey: u64,
    prkey: u64,
) -> Result<()> {
    let mut sqe = Sqe::new(io::RESV_ACQUIRE, 0, nsid);
    AcquireCmd {
        action,
        iekey: false,
        rtype,
    }
    .encode(&mut sqe);
    let data = resv::encode_keys(crkey, prkey);
    q.exec_ok(sqe, Xfer::ToCtrl(data.len() as u32), &data, &mut [])?;
    Ok(())
}

/// Reservation Release (release of `rtype`, or clear).
pub fn release(
    q: &mut Queue,
    nsid: u32,
    action: ReleaseAction,
    rtype: u8,
    crkey: u64,
) -> Result<()> {
    let mut sqe = Sqe::new(io::RESV_RELEASE, 0, nsid);
    ReleaseCmd {
        action,
        iekey: false,
        rtype,
    }
    .encode(&mut sqe);
    let data = crkey.to_le_bytes();
    q.exec_ok(sqe, Xfer::ToCtrl(data.len() as u32), &data, &mut [])?;
    Ok(())
}

/// Reservation Report with the extended data structure (128-bit host
/// IDs), room for `max_entries` registrants (the queue's buffers must hold
/// 64 + 64 × `max_entries` bytes). REGCTL in the header counts them all.
pub fn report(
    q: &mut Queue,
    nsid: u32,
    max_entries: usize,
) -> Result<(ReportHeader, Vec<Registrant>)> {
    let n = max_entries.min(MAX_REPORT_ENTRIES);
    let len = resv::REPORT_EXT_HDR_LEN + n * resv::REPORT_EXT_ENTRY_LEN;
    let mut out = vec![0u8; len];
    report_raw(q, nsid, true, &mut out)?;
    resv::decode_report_ext(&out).ok_or_else(|| Error::protocol("short reservation report"))
}

/// Reservation Report into `out` as the controller sends it (`eds`: the
/// extended data structure).
pub fn report_raw(q: &mut Queue, nsid: u32, eds: bool, out: &mut [u8]) -> Result<()> {
    let len = u32::try_from(out.len()).map_err(|_| Error::Usage("report too long".into()))?;
    let sqe = resv::report_sqe(nsid, len, eds);
    q.exec_ok(sqe, Xfer::FromCtrl(len), &[], out)?;
    Ok(())
}

/// Registers `key` for this host ID on `nsid`, whatever key it held
/// before: Register, and if the host is already registered with another
/// key (Reservation Conflict), Replace ignoring the old key (IEKEY).
pub fn register_key(q: &mut Queue, nsid: u32, key: u64) -> Result<()> {
    match register(
        q,
        nsid,
        RegisterAction::Register,
        false,
        Cptpl::NoChange,
        0,
        key,
    ) {
        Err(Error::Nvme(st)) if is_conflict(st) => register(
            q,
            nsid,
            RegisterAction::Replace,
            true,
            Cptpl::NoChange,
            0,
            key,
        ),
        r => r,
    }
}

/// The first owner of a volume (processor node A, docs/host.md
/// "Processor-node takeover"): registers `key` and acquires a reservation
/// of `rtype`, so that only its registration may write.
pub fn claim(q: &mut Queue, nsid: u32, key: u64, rtype: RType) -> Result<()> {
    register_key(q, nsid, key)?;
    acquire(q, nsid, AcquireAction::Acquire, rtype, key, 0)
}

/// Processor-node takeover (docs/host.md): this host registers `key` and
/// takes the reservation over from the registrant holding `victim_key`
/// with Preempt and Abort (NVMe Base 2.0 §8.19.7). When it returns Ok, the
/// victim's registration is gone and the target has finished or failed
/// every command the victim had outstanding: from then on nothing the
/// victim sent, or sends later, lands (its writes get Reservation Conflict).
///
/// Preempt and Abort also succeeds when the victim held no reservation (it
/// only unregisters the victim, and nobody then holds one), so this checks
/// with a Reservation Report that this host now holds `rtype`, acquires it
/// if nobody does, and fails if another host does: the caller must not
/// write believing it owns the volume.
pub fn take_over(q: &mut Queue, nsid: u32, key: u64, victim_key: u64, rtype: RType) -> Result<()> {
    register_key(q, nsid, key)?;
    let abort = AcquireAction::PreemptAndAbort;
    acquire(q, nsid, abort, rtype, key, victim_key)?;
    let (hdr, regs) = report(q, nsid, TAKEOVER_REPORT_ENTRIES)?;
    let mine = regs.iter().any(|r| r.holds && r.rkey == key);
    if mine && hdr.rtype == rtype as u8 {
        return Ok(());
    }
    if hdr.rtype == 0 {
        // Nobody held it (the victim had only registered): take it now.
        return acquire(q, nsid, AcquireAction::Acquire, rtype, key, 0);
    }
    Err(Error::protocol(format!(
        "after Preempt and Abort this host does not hold a type {} reservation: \
         type {} is held by {}",
        rtype as u8,
        hdr.rtype,
        if mine {
            "this host"
        } else {
            "another registrant"
        }
    )))
}

/// Registrants [`take_over`] reads back to find the holder: 64 + 62 × 64
/// bytes fit a 4 KiB queue buffer.
const TAKEOVER_REPORT_ENTRIES: usize = 62;

/// Whether `st` is Reservation Conflict (generic 83h, with or without
/// DNR): what a registration or an access the reservation does not allow gets.
pub fn is_conflict(st: trellis_nvme::Status) -> bool {
    let c = trellis_nvme::status::generic::RESERVATION_CONFLICT;
    (st.sct(), st.sc()) == (c.sct(), c.sc())
}

/// Feature identifiers: Reservation Notification Mask, Reservation Persistence.
const FID_RESV_MASK: u32 = 0x82;
const FID_RESV_PERSIST: u32 = 0x83;

impl Controller {
    /// Reads one Reservation Notification log page (LID 80h) with RAE
    /// clear: the oldest notice, which the controller then drops (an empty
    /// page, type 0, when there is none).
    pub fn resv_notice(&mut self) -> Result<Notice> {
        let mut page = [0u8; resv::LOG_LEN];
        let sqe = GetLogPage {
            lid: lid::RESERVATION,
            lsp: 0,
            rae: false,
            len_bytes: page.len() as u64,
            offset_bytes: 0,
        }
        .to_sqe(0, 0xFFFF_FFFF);
        self.admin_exec(sqe, Xfer::FromCtrl(page.len() as u32), &mut page)?;
        Notice::decode(&page).ok_or_else(|| Error::protocol("short reservation log"))
    }

    /// Set Features Reservation Notification Mask (82h): the notice types
    /// (bits 1..3) not to report for `nsid` (FFFFFFFFh: all namespaces).
    pub fn set_resv_mask(&mut self, nsid: u32, mask: u32) -> Result<()> {
        self.set_feature(nsid, FID_RESV_MASK, mask)
    }

    /// Set Features Reservation Persistence (83h): Persist Through Power Loss.
    pub fn set_ptpl(&mut self, nsid: u32, on: bool) -> Result<()> {
        self.set_feature(nsid, FID_RESV_PERSIST, on as u32)
    }

    /// Get Features Reservation Persistence (83h).
    pub fn ptpl(&mut self, nsid: u32) -> Result<bool> {
        let mut sqe = Sqe::new(admin::GET_FEATURES, 0, nsid);
        sqe.set_cdw(10, FID_RESV_PERSIST);
        let c = self.admin_exec(sqe, Xfer::None, &mut [])?;
        Ok(c.dw0 & 1 != 0)
    }

    fn set_feature(&mut self, nsid: u32, fid: u32, v: u32) -> Result<()> {
        let mut sqe = Sqe::new(admin::SET_FEATURES, 0, nsid);
        sqe.set_cdw(10, fid);
        sqe.set_cdw(11, v);
        self.admin_exec(sqe, Xfer::None, &mut [])?;
        Ok(())
    }
}
