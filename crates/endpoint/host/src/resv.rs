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
