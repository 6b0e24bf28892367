//! Reservations (NVMe Base Specification 2.0, §8.19; the commands in §7.2
//! "NVM command set" Reservation Register 0Dh, Report 0Eh, Acquire 11h and
//! Release 15h): command dwords, command data, the Reservation Status data
//! structure (Report) and the Reservation Notification log page (LID 80h).
//!
//! Sans-IO: every decoder takes a slice of any length and refuses one too
//! short with `None`; every encoder writes only within the slice it is given.

use crate::{le64, put16, put32, put64, Sqe};

/// Reservation types (RTYPE; §8.19, Figure "Reservation Type Encoding").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RType {
    WriteExclusive = 1,
    ExclusiveAccess = 2,
    WriteExclusiveRegistrantsOnly = 3,
    ExclusiveAccessRegistrantsOnly = 4,
    WriteExclusiveAllRegistrants = 5,
    ExclusiveAccessAllRegistrants = 6,
}

impl RType {
    pub const ALL: [RType; 6] = [
        RType::WriteExclusive,
        RType::ExclusiveAccess,
        RType::WriteExclusiveRegistrantsOnly,
        RType::ExclusiveAccessRegistrantsOnly,
        RType::WriteExclusiveAllRegistrants,
        RType::ExclusiveAccessAllRegistrants,
    ];
    pub fn from_u8(v: u8) -> Option<RType> {
        RType::ALL.get((v as usize).wrapping_sub(1)).copied()
    }
    /// Every registrant is a holder (the "All Registrants" types).
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            RType::WriteExclusiveAllRegistrants | RType::ExclusiveAccessAllRegistrants
        )
    }
    /// The "Registrants Only" and "All Registrants" types: registrants
    /// that do not hold the reservation still have access.
    pub fn registrants_have_access(self) -> bool {
        self as u8 >= 3
    }
    /// An Exclusive Access type: reads are restricted too.
    pub fn exclusive_access(self) -> bool {
        matches!(
            self,
            RType::ExclusiveAccess
                | RType::ExclusiveAccessRegistrantsOnly
                | RType::ExclusiveAccessAllRegistrants
        )
    }
}

/// Reservation Register action (RREGA, CDW10 bits 2:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterAction {
    Register,
    Unregister,
    Replace,
}

/// Change Persist Through Power Loss State (CPTPL, CDW10 bits 31:30).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cptpl {
    NoChange,
    Clear,
    Set,
}

/// A decoded Reservation Register command (its dwords).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisterCmd {
    pub action: RegisterAction,
    /// Ignore Existing Key: CRKEY is not checked.
    pub iekey: bool,
    pub cptpl: Cptpl,
}

impl RegisterCmd {
    /// None: a reserved RREGA or CPTPL value (Invalid Field in Command).
    pub fn decode(sqe: &Sqe) -> Option<RegisterCmd> {
        let d = sqe.cdw10();
        let action = match d & 0x7 {
            0 => RegisterAction::Register,
            1 => RegisterAction::Unregister,
            2 => RegisterAction::Replace,
            _ => return None,
        };
        let cptpl = match d >> 30 {
            0 => Cptpl::NoChange,
            2 => Cptpl::Clear,
            3 => Cptpl::Set,
            _ => return None,
        };
        Some(RegisterCmd {
            action,
            iekey: d & (1 << 3) != 0,
            cptpl,
        })
    }
    pub fn encode(&self, sqe: &mut Sqe) {
        let a = match self.action {
            RegisterAction::Register => 0,
            RegisterAction::Unregister => 1,
            RegisterAction::Replace => 2,
        };
        let c = match self.cptpl {
            Cptpl::NoChange => 0u32,
            Cptpl::Clear => 2,
            Cptpl::Set => 3,
        };
        sqe.set_cdw(10, a | (self.iekey as u32) << 3 | c << 30);
    }
}

/// Reservation Acquire action (RACQA, CDW10 bits 2:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireAction {
    Acquire,
    Preempt,
    PreemptAndAbort,
}

/// A decoded Reservation Acquire command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcquireCmd {
    pub action: AcquireAction,
    /// IEKEY: reserved since revision 1.3 (RESCAP bit 7), decoded for logs.
    pub iekey: bool,
    pub rtype: RType,
}

impl AcquireCmd {
    /// None: a reserved RACQA or RTYPE value.
    pub fn decode(sqe: &Sqe) -> Option<AcquireCmd> {
        let d = sqe.cdw10();
        let action = match d & 0x7 {
            0 => AcquireAction::Acquire,
            1 => AcquireAction::Preempt,
            2 => AcquireAction::PreemptAndAbort,
            _ => return None,
        };
        Some(AcquireCmd {
            action,
            iekey: d & (1 << 3) != 0,
            // RTYPE: CDW10 bits 15:8.
            rtype: RType::from_u8(d.to_le_bytes()[1])?,
        })
    }
    pub fn encode(&self, sqe: &mut Sqe) {
        let a = match self.action {
            AcquireAction::Acquire => 0,
            AcquireAction::Preempt => 1,
            AcquireAction::PreemptAndAbort => 2,
        };
        sqe.set_cdw(10, a | (self.iekey as u32) << 3 | (self.rtype as u32) << 8);
    }
}

/// Reservation Release action (RRELA, CDW10 bits 2:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseAction {
    Release,
    Clear,
}

/// A decoded Reservation Release command. RTYPE is kept raw: a Clear, or a
/// Release by a host that holds nothing, ignores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReleaseCmd {
    pub action: ReleaseAction,
    pub iekey: bool,
    pub rtype: u8,
}

impl ReleaseCmd {
    /// None: a reserved RRELA value.
    pub fn decode(sqe: &Sqe) -> Option<ReleaseCmd> {
        let d = sqe.cdw10();
        let action = match d & 0x7 {
            0 => ReleaseAction::Release,
            1 => ReleaseAction::Clear,
            _ => return None,
        };
        Some(ReleaseCmd {
            action,
            iekey: d & (1 << 3) != 0,
            // RTYPE: CDW10 bits 15:8.
            rtype: d.to_le_bytes()[1],
        })
    }
    pub fn encode(&self, sqe: &mut Sqe) {
        let a = match self.action {
            ReleaseAction::Release => 0,
            ReleaseAction::Clear => 1,
        };
        sqe.set_cdw(10, a | (self.iekey as u32) << 3 | (self.rtype as u32) << 8);
    }
}

/// Register and Acquire carry two keys (16 bytes): CRKEY then NRKEY (or PRKEY).
pub const KEYS_LEN: usize = 16;
/// Release carries CRKEY alone (8 bytes).
pub const CRKEY_LEN: usize = 8;

/// The two keys of a Register (CRKEY, NRKEY) or Acquire (CRKEY, PRKEY) data.
pub fn decode_keys(b: &[u8]) -> Option<(u64, u64)> {
    (b.len() >= KEYS_LEN).then(|| (le64(b, 0), le64(b, 8)))
}

/// The CRKEY of a Release's data.
pub fn decode_crkey(b: &[u8]) -> Option<u64> {
    (b.len() >= CRKEY_LEN).then(|| le64(b, 0))
}

pub fn encode_keys(a: u64, b: u64) -> [u8; KEYS_LEN] {
    let mut d = [0u8; KEYS_LEN];
    put64(&mut d, 0, a);
    put64(&mut d, 8, b);
    d
}

/// Report CDW11 bit 0: Extended Data Structure (128-bit host identifiers).
pub const REPORT_EDS: u32 = 1;
/// Report's data, EDS = 1: 64-byte header, then 64 bytes per controller.
pub const REPORT_EXT_HDR_LEN: usize = 64;
pub const REPORT_EXT_ENTRY_LEN: usize = 64;

/// Reservation Report's dwords: the transfer (NUMD + 1 dwords) and EDS.
pub fn report_sqe(nsid: u32, len_bytes: u32, eds: bool) -> Sqe {
    let mut sqe = Sqe::new(crate::sqe::io::RESV_REPORT, 0, nsid);
    sqe.set_cdw(10, (len_bytes / 4).saturating_sub(1));
    sqe.set_cdw(11, if eds { REPORT_EDS } else { 0 });
    sqe
}

/// One registrant as the Report lists it (Registered Controller Extended
/// Data Structure, Figure "Reservation Status Extended Data Structure").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registrant {
    /// FFFFh: not associated with one controller (dynamic model).
    pub cntlid: u16,
    /// RCSTS bit 0: this host holds the reservation.
    pub holds: bool,
    pub hostid: [u8; 16],
    pub rkey: u64,
}

/// The Reservation Status (extended) header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReportHeader {
    pub gen: u32,
    /// RTYPE: 0 when no reservation is held.
    pub rtype: u8,
    /// REGCTL: number of registrants (the whole list, not what fit).
    pub regctl: u16,
    /// PTPLS: Persist Through Power Loss State.
    pub ptpls: bool,
}

/// Encodes the extended Reservation Status data structure into `out`
/// (the host's buffer, any length): as many entries as fit, REGCTL counts
/// all of them (a host with a short buffer asks again with a larger one).
pub fn encode_report_ext(h: &ReportHeader, regs: &[Registrant], out: &mut [u8]) {
    out.fill(0);
    let mut hdr = [0u8; REPORT_EXT_HDR_LEN];
    put32(&mut hdr, 0, h.gen);
    hdr[4] = h.rtype;
    put16(&mut hdr, 5, h.regctl);
    hdr[9] = h.ptpls as u8;
    crate::copy_prefix(out, &hdr);
    let body = out.get_mut(REPORT_EXT_HDR_LEN..).unwrap_or_default();
    for (e, r) in body.chunks_mut(REPORT_EXT_ENTRY_LEN).zip(regs) {
        let mut ent = [0u8; REPORT_EXT_ENTRY_LEN];
        put16(&mut ent, 0, r.cntlid);
        ent[2] = r.holds as u8;
        put64(&mut ent, 8, r.rkey);
        ent[16..32].copy_from_slice(&r.hostid);
        // The last entry may be cut short by the host's buffer.
        crate::copy_prefix(e, &ent);
    }
}

/// Decodes an extended Reservation Status: its header and the entries the
/// buffer holds (at most REGCTL).
pub fn decode_report_ext(b: &[u8]) -> Option<(ReportHeader, Vec<Registrant>)> {
    let (hdr, body) = b.split_first_chunk::<REPORT_EXT_HDR_LEN>()?;
    let h = ReportHeader {
        gen: crate::le32(hdr, 0),
        rtype: hdr[4],
        regctl: crate::le16(hdr, 5),
        ptpls: hdr[9] & 1 != 0,
    };
    let regs = body
        .chunks_exact(REPORT_EXT_ENTRY_LEN)
        .take(h.regctl as usize)
        .filter_map(|e| e.first_chunk::<REPORT_EXT_ENTRY_LEN>())
        .map(|e| {
            let mut hostid = [0u8; 16];
            hostid.copy_from_slice(&e[16..32]);
            Registrant {
                cntlid: crate::le16(e, 0),
                holds: e[2] & 1 != 0,
                hostid,
                rkey: le64(e, 8),
            }
        })
        .collect();
    Some((h, regs))
}

/// Reservation Notification log page (LID 80h): 64 bytes.
pub const LOG_LEN: usize = 64;

/// Reservation Notification Log Page Type (byte 8).
pub mod notice {
    pub const EMPTY: u8 = 0;
    pub const REGISTRATION_PREEMPTED: u8 = 1;
    pub const RESERVATION_RELEASED: u8 = 2;
    pub const RESERVATION_PREEMPTED: u8 = 3;
}

/// Reservation Notification Mask (Set Features 82h) bits, by notice type.
pub fn mask_bit(kind: u8) -> u32 {
    1u32 << kind
}

/// One Reservation Notification log page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Notice {
    /// Log Page Count: 64-bit, never 0 for a real entry (wraps to 1).
    pub count: u64,
    pub kind: u8,
    /// Number of Available Log Pages after this one (saturates at 255).
    pub available: u8,
    pub nsid: u32,
}

impl Notice {
    pub fn encode(&self, out: &mut [u8]) {
        let mut p = [0u8; LOG_LEN];
        put64(&mut p, 0, self.count);
        p[8] = self.kind;
        p[9] = self.available;
        put32(&mut p, 12, self.nsid);
        crate::copy_prefix(out, &p);
    }
    pub fn decode(b: &[u8]) -> Option<Notice> {
        let b = b.first_chunk::<16>()?;
        Some(Notice {
            count: le64(b, 0),
            kind: b[8],
            available: b[9],
            nsid: crate::le32(b, 12),
        })
    }
}

/// Completion DW0 of the "Reservation Log Page Available" event: type I/O
/// Command specific status (6h), information 00h, log page 80h (§5.2.1).
pub const AEN_DW0: u32 = 0x6 | (crate::log::lid::RESERVATION as u32) << 16;

/// Identify Namespace RESCAP (byte 31): PTPL (bit 0), the six types
/// (bits 6:1), and IEKEY as defined since revision 1.3 (bit 7: Acquire's
/// and Release's IEKEY are ignored).
pub const RESCAP_ALL: u8 = 0xFF;
/// Identify Controller ONCS bit 5: Reservations.
pub const ONCS_RESERVATIONS: u16 = 1 << 5;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_dwords_round_trip_and_reserved_values_are_refused() {
        let mut s = Sqe::new(crate::sqe::io::RESV_REGISTER, 1, 1);
        let r = RegisterCmd {
            action: RegisterAction::Replace,
            iekey: true,
            cptpl: Cptpl::Set,
        };
        r.encode(&mut s);
        assert_eq!(s.cdw10(), 0xC000_000A);
        assert_eq!(RegisterCmd::decode(&s), Some(r));
        s.set_cdw(10, 3);
        assert_eq!(RegisterCmd::decode(&s), None, "RREGA 3 is reserved");
        s.set_cdw(10, 1 << 30);
        assert_eq!(RegisterCmd::decode(&s), None, "CPTPL 01b is reserved");
        for t in RType::ALL {
            let a = AcquireCmd {
                action: AcquireAction::Preempt,
                iekey: false,
                rtype: t,
            };
            a.encode(&mut s);
            assert_eq!(AcquireCmd::decode(&s), Some(a));
        }
        s.set_cdw(10, 7 << 8);
        assert_eq!(AcquireCmd::decode(&s), None, "RTYPE 7 is reserved");
        s.set_cdw(10, 0);
        assert_eq!(AcquireCmd::decode(&s), None, "RTYPE 0 is reserved");
        let rel = ReleaseCmd {
            action: ReleaseAction::Clear,
            iekey: false,
            rtype: 0,
        };
        rel.encode(&mut s);
        assert_eq!(ReleaseCmd::decode(&s), Some(rel));
        s.set_cdw(10, 2);
        assert_eq!(ReleaseCmd::decode(&s), None);
    }

    #[test]
    fn short_data_is_refused_not_read_past() {
        assert_eq!(decode_keys(&[0; 15]), None);
        assert_eq!(decode_keys(&encode_keys(1, 2)), Some((1, 2)));
        assert_eq!(decode_crkey(&[0; 7]), None);
        assert_eq!(decode_report_ext(&[0; 63]), None);
        assert_eq!(Notice::decode(&[0; 15]), None);
    }

    #[test]
    fn report_fits_the_buffer_and_counts_every_registrant() {
        let regs: Vec<Registrant> = (0..20u8)
            .map(|i| Registrant {
                cntlid: 0xFFFF,
                holds: i == 3,
                hostid: [i; 16],
                rkey: 100 + i as u64,
            })
            .collect();
        let h = ReportHeader {
            gen: 7,
            rtype: 1,
            regctl: 20,
            ptpls: true,
        };
        let mut full = vec![0xAAu8; REPORT_EXT_HDR_LEN + 20 * REPORT_EXT_ENTRY_LEN];
        encode_report_ext(&h, &regs, &mut full);
        let (dh, dr) = decode_report_ext(&full).unwrap();
        assert_eq!((dh, dr), (h, regs.clone()));
        // A buffer that holds the header and 2.5 entries: no write past it.
        let mut short = vec![0xAAu8; REPORT_EXT_HDR_LEN + 160];
        encode_report_ext(&h, &regs, &mut short);
        let (dh, dr) = decode_report_ext(&short).unwrap();
        assert_eq!(dh.regctl, 20);
        assert_eq!(dr, regs[..2].to_vec());
        assert_eq!(&short[REPORT_EXT_HDR_LEN + 128..][..2], &[0xFF, 0xFF]);
        // Shorter than the header: the part that fits.
        let mut tiny = [0u8; 8];
        encode_report_ext(&h, &regs, &mut tiny);
        assert_eq!(tiny[0], 7);
    }

    #[test]
    fn notice_layout() {
        let n = Notice {
            count: 5,
            kind: notice::RESERVATION_RELEASED,
            available: 2,
            nsid: 9,
        };
        let mut p = [0u8; LOG_LEN];
        n.encode(&mut p);
        assert_eq!((p[0], p[8], p[9], p[12]), (5, 2, 2, 9));
        assert_eq!(Notice::decode(&p), Some(n));
        assert_eq!(AEN_DW0, 0x0080_0006);
        assert_eq!(mask_bit(notice::RESERVATION_PREEMPTED), 1 << 3);
    }

    #[test]
    fn access_classes() {
        use RType::*;
        assert!(!WriteExclusive.registrants_have_access());
        assert!(ExclusiveAccessRegistrantsOnly.registrants_have_access());
        assert!(ExclusiveAccessAllRegistrants.all_registrants());
        assert!(!WriteExclusiveRegistrantsOnly.exclusive_access());
        assert_eq!(RType::from_u8(6), Some(ExclusiveAccessAllRegistrants));
        assert_eq!(RType::from_u8(0), None);
    }
}
