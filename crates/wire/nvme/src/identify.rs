//! Identify data structures (4096 bytes each): controller, namespace, active
//! namespace list, namespace identification descriptors.

use crate::{get_cstr, le16, le32, le64, put16, put32, put64, put_ascii_padded, put_cstr};

pub const IDENTIFY_LEN: usize = 4096;

pub mod cns {
    pub const NAMESPACE: u8 = 0x00;
    pub const CONTROLLER: u8 = 0x01;
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    pub const NS_ID_DESCRIPTORS: u8 = 0x03;
    pub const CSI_NAMESPACE: u8 = 0x05;
    pub const CSI_CONTROLLER: u8 = 0x06;
    pub const CS_INDEPENDENT_NS: u8 = 0x08;
}

/// Controller type (CNTRLTYPE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControllerType {
    Io = 1,
    Discovery = 2,
}

/// What a target says about one controller in Identify Controller.
#[derive(Clone, Debug)]
pub struct ControllerInfo {
    pub kind: ControllerType,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    pub cntlid: u16,
    pub version: u32,
    /// Maximum data transfer size as a power of two of 4 KiB pages.
    pub mdts: u8,
    pub subnqn: String,
    /// Number of namespaces (highest NSID).
    pub nn: u32,
    /// In-capsule data bytes accepted on I/O queues.
    pub icd_bytes: u32,
    /// Maximum outstanding commands per queue.
    pub maxcmd: u16,
    /// Volatile write cache present: the host then sends Flush and FUA.
    pub vwc: bool,
    /// Keep-alive granularity in 100 ms units (0 = no keep-alive support).
    pub kas: u16,
    pub aerl: u8,
    /// Async event notices we may send (OAES).
    pub oaes: u32,
    /// Asymmetric Namespace Access reporting; None: CMIC bit 3 clear.
    pub ana: Option<AnaCaps>,
    /// Reservation commands are served (ONCS bit 5).
    pub reservations: bool,
}

/// What an ANA-reporting controller advertises (NVMe Base 2.0 §8.1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnaCaps {
    /// ANATT: longest time a group stays in ANA Change, seconds.
    pub anatt_s: u8,
    /// ANACAP bits.
    pub anacap: u8,
    /// Largest ANAGRPID of the subsystem's namespaces.
    pub anagrpmax: u32,
    /// Number of ANA groups.
    pub nanagrpid: u32,
}

/// Encodes Identify Controller (CNS 01h).
pub fn encode_controller(c: &ControllerInfo, b: &mut [u8]) {
    let Some(b) = crate::front_mut::<IDENTIFY_LEN>(b) else {
        return;
    };
    b.fill(0);
    // VID/SSVID 0: not a PCI device, and not Intel (hosts key quirks off it).
    put_ascii_padded(&mut b[4..24], &c.serial);
    put_ascii_padded(&mut b[24..64], &c.model);
    put_ascii_padded(&mut b[64..72], &c.firmware);
    b[72] = 6; // RAB
    let io = c.kind == ControllerType::Io;
    // CMIC: multi-port and multi-controller subsystem (several hosts/paths).
    b[76] = if io { 0x03 } else { 0 };
    if let (true, Some(a)) = (io, c.ana) {
        b[76] |= crate::ana::id::CMIC_ANA;
        b[crate::ana::id::ANATT] = a.anatt_s;
        b[crate::ana::id::ANACAP] = a.anacap;
        put32(b, crate::ana::id::ANAGRPMAX, a.anagrpmax);
        put32(b, crate::ana::id::NANAGRPID, a.nanagrpid);
        // MNAN = NN: Linux (multipath.c) refuses ANA with MNAN 0 or above NN.
        put32(b, crate::ana::id::MNAN, c.nn);
    }
    b[77] = c.mdts;
    put16(b, 78, c.cntlid);
    put32(b, 80, c.version);
    put32(b, 92, c.oaes);
    b[111] = c.kind as u8;
    b[259] = c.aerl;
    // A discovery controller serves only Identify CNS 01h, the discovery
    // log, KATO and Async Event Configuration, AER and Keep Alive (as Linux
    // nvmet's discovery.c): it promises nothing else, so these stay zero.
    if io {
        put32(b, 96, 0x1); // CTRATT: 128-bit host identifier (Get Features 81h)
        b[258] = 3; // ACL (0-based): Abort is accepted
        b[260] = 0x3; // FRMW: slot 1 read-only, one slot (Firmware Slot log)
        b[262] = 63; // ELPE: 64 error log entries (0-based)
    }
    // LPA bit 2: extended data (NUMDU, LPO) for Get Log Page, on both kinds;
    // bit 1: the Commands Supported and Effects log, on I/O controllers only.
    b[261] = if io { 0x02 | 0x04 } else { 0x04 };
    put16(b, 320, c.kas);
    if io {
        b[512] = 0x66; // SQES
        b[513] = 0x44; // CQES
    }
    put16(b, 514, c.maxcmd);
    put32(b, 516, c.nn);
    if io {
        // ONCS: Dataset Management, Write Zeroes, and Reservations when served.
        let resv = if c.reservations {
            crate::resv::ONCS_RESERVATIONS
        } else {
            0
        };
        put16(b, 520, 0x04 | 0x08 | resv);
        // VWC: bit 0 cache present; bits 2:1 = 10b, flush of NSID FFFFFFFFh not supported.
        b[525] = c.vwc as u8 | 0x04;
    }
    // SGLS: supported (byte aligned); keyed/offset bit 20: address may be an offset.
    put32(b, 536, 0x0010_0001);
    put_cstr(&mut b[768..1024], &c.subnqn);
    // IOCCSZ in 16-byte units (SQE + in-capsule data) and IORCSZ (the CQE).
    // Set for discovery controllers too, as nvmet does since Linux 6.8: hosts
    // of that release check them on every fabrics controller.
    put32(b, 1792, 4 + c.icd_bytes / 16);
    put32(b, 1796, 1);
    put16(b, 1800, 0); // ICDOFF
    b[1802] = 0; // FCATT: dynamic controller model
    b[1803] = 1; // MSDBD
}

/// The Identify Controller fields a host needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdCtrl {
    pub serial: String,
    pub model: String,
    pub cntlid: u16,
    pub mdts: u8,
    pub kas: u16,
    pub nn: u32,
    pub vwc: bool,
    pub oncs: u16,
    pub subnqn: String,
    pub ioccsz: u32,
    pub cntrltype: u8,
    pub maxcmd: u16,
    /// Controller Multi-Path I/O and Namespace Sharing Capabilities.
    pub cmic: u8,
    pub anatt_s: u8,
    pub anacap: u8,
    pub anagrpmax: u32,
    pub nanagrpid: u32,
    pub mnan: u32,
    /// Optional Asynchronous Events Supported (bytes 95:92).
    pub oaes: u32,
}

impl IdCtrl {
    /// Decodes an Identify Controller page; bytes past the end of a short
    /// `b` read as zero.
    pub fn decode(b: &[u8]) -> IdCtrl {
        let b = &crate::padded::<IDENTIFY_LEN>(b);
        let s = |f: &[u8]| String::from_utf8_lossy(f).trim_end().to_string();
        IdCtrl {
            serial: s(&b[4..24]),
            model: s(&b[24..64]),
            cntlid: le16(b, 78),
            mdts: b[77],
            kas: le16(b, 320),
            nn: le32(b, 516),
            vwc: b[525] & 1 != 0,
            oncs: le16(b, 520),
            subnqn: get_cstr(&b[768..1024]).unwrap_or("").to_string(),
            ioccsz: le32(b, 1792),
            cntrltype: b[111],
            maxcmd: le16(b, 514),
            cmic: b[76],
            anatt_s: b[crate::ana::id::ANATT],
            anacap: b[crate::ana::id::ANACAP],
            anagrpmax: le32(b, crate::ana::id::ANAGRPMAX),
            nanagrpid: le32(b, crate::ana::id::NANAGRPID),
            mnan: le32(b, crate::ana::id::MNAN),
            oaes: le32(b, 92),
        }
    }
    /// CMIC bit 3: the controller reports Asymmetric Namespace Access.
    pub fn reports_ana(&self) -> bool {
        self.cmic & crate::ana::id::CMIC_ANA != 0
    }
    /// Largest data transfer in bytes (None = no limit).
    pub fn max_transfer_bytes(&self) -> Option<u64> {
        if self.mdts == 0 {
            None
        } else {
            Some(4096u64 << self.mdts)
        }
    }
}

/// What a target says about one namespace.
#[derive(Clone, Debug)]
pub struct NamespaceInfo {
    pub size_blocks: u64,
    /// log2 of the logical block size (9 or 12).
    pub lbads: u8,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    pub uuid: [u8; 16],
    pub read_only: bool,
    /// Deallocated blocks read back as zeroes (DLFEAT), enabling DEAC.
    pub deallocate_reads_zeroes: bool,
    /// ANA group (ANAGRPID); 0: the controller does not report ANA.
    pub anagrpid: u32,
    /// Reservation Capabilities (RESCAP); 0: no reservations.
    pub rescap: u8,
    /// Thin provisioning: the blocks the backing store has allocated, which
    /// Identify reports as NUSE with NSFEAT bit 0 (THINP) set (NVMe NVM
    /// Command Set 1.0, Figure 97). None: fully allocated, NUSE = NSZE.
    pub used_blocks: Option<u64>,
}

/// Encodes Identify Namespace (CNS 00h).
pub fn encode_namespace(n: &NamespaceInfo, b: &mut [u8]) {
    let Some(b) = crate::front_mut::<IDENTIFY_LEN>(b) else {
        return;
    };
    b.fill(0);
    put64(b, 0, n.size_blocks); // NSZE
    put64(b, 8, n.size_blocks); // NCAP: non-zero, or the host drops the namespace
                                // NUSE: allocated blocks where the store is thin, else every block.
    put64(
        b,
        16,
        n.used_blocks
            .map_or(n.size_blocks, |u| u.min(n.size_blocks)),
    );
    b[24] = n.used_blocks.is_some() as u8; // NSFEAT: bit 0 THINP; no other limits reported
    b[25] = 0; // NLBAF: one format
    b[26] = 0; // FLBAS: format 0, no metadata
    b[30] = 1; // NMIC: may be shared by several controllers (multipath)
    b[31] = n.rescap; // RESCAP: reservation types and PTPL (0: none)
    b[33] = if n.deallocate_reads_zeroes { 0x09 } else { 0 }; // DLFEAT: reads zeroes + WZ DEAC
    put32(b, crate::ana::id::NS_ANAGRPID, n.anagrpid);
    b[99] = n.read_only as u8; // NSATTR bit 0: write protected
    b[104..120].copy_from_slice(&n.nguid);
    b[120..128].copy_from_slice(&n.eui64);
    // LBAF0: MS 0, LBADS, RP 0 (best performance).
    b[128 + 2] = n.lbads;
}

/// Identify Namespace fields a host needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdNs {
    pub nsze: u64,
    pub ncap: u64,
    pub lbads: u8,
    pub read_only: bool,
    /// Namespace Globally Unique Identifier (bytes 104..120; zero: not reported).
    pub nguid: [u8; 16],
    /// IEEE Extended Unique Identifier (bytes 120..128; zero: not reported).
    pub eui64: [u8; 8],
    /// ANA group identifier (0: not reported).
    pub anagrpid: u32,
}

impl IdNs {
    /// Decodes an Identify Namespace page; bytes past the end of a short `b`
    /// read as zero.
    pub fn decode(b: &[u8]) -> IdNs {
        let b = &crate::padded::<IDENTIFY_LEN>(b);
        let fmt = usize::from(b[26] & 0xf);
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&b[104..120]);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&b[120..128]);
        IdNs {
            nsze: le64(b, 0),
            ncap: le64(b, 8),
            // LBAF0..15 are bytes 128..192: always inside the page.
            lbads: b.get(128 + fmt * 4 + 2).copied().unwrap_or(0),
            read_only: b[99] & 1 != 0,
            nguid,
            eui64,
            anagrpid: le32(b, crate::ana::id::NS_ANAGRPID),
        }
    }

    /// The namespace's identity for grouping paths (as Linux's native
    /// multipath does): its NGUID, else its EUI-64; None when it reports neither.
    pub fn identity(&self) -> Option<Vec<u8>> {
        if self.nguid != [0; 16] {
            Some(self.nguid.to_vec())
        } else if self.eui64 != [0; 8] {
            Some(self.eui64.to_vec())
        } else {
            None
        }
    }
    pub fn block_size(&self) -> u32 {
        1u32 << self.lbads.clamp(9, 20)
    }
}

/// Encodes the active namespace list: NSIDs greater than `after`, ascending.
pub fn encode_ns_list(nsids: impl Iterator<Item = u32>, after: u32, b: &mut [u8]) {
    let Some(b) = crate::front_mut::<IDENTIFY_LEN>(b) else {
        return;
    };
    b.fill(0);
    for (i, id) in nsids
        .filter(|&id| id > after)
        .take(IDENTIFY_LEN / 4)
        .enumerate()
    {
        put32(b, i * 4, id);
    }
}

/// Encodes the namespace identification descriptor list (CNS 03h). All-zero
/// identifiers are skipped, as the spec requires.
pub fn encode_ns_descriptors(n: &NamespaceInfo, b: &mut [u8]) {
    let Some(b) = crate::front_mut::<IDENTIFY_LEN>(b) else {
        return;
    };
    b.fill(0);
    // Three descriptors of at most 20 bytes each: always inside the page.
    let mut off = 0;
    off = put_descriptor(b, off, 1, &n.eui64);
    off = put_descriptor(b, off, 2, &n.nguid);
    put_descriptor(b, off, 3, &n.uuid);
}

/// Writes one namespace identification descriptor (NIDT, NIDL, two reserved
/// bytes, the identifier) at `off` unless the identifier is all zero;
/// returns the offset after it.
fn put_descriptor<const N: usize>(b: &mut [u8], off: usize, nidt: u8, id: &[u8; N]) -> usize {
    if id.iter().all(|&x| x == 0) {
        return off;
    }
    // NIDL: the identifiers are 8 and 16 bytes long.
    let nidl = u8::try_from(N).unwrap_or(u8::MAX);
    crate::put_bytes(b, off, [nidt, nidl, 0, 0]);
    crate::put_bytes(b, off + 4, *id);
    off + 4 + N
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctrl() -> ControllerInfo {
        ControllerInfo {
            kind: ControllerType::Io,
            serial: "SN1".into(),
            model: "Trellis".into(),
            firmware: "0.1".into(),
            cntlid: 5,
            version: crate::fabrics::VS_1_4,
            mdts: 5,
            subnqn: "nqn.2026-11.io.trellis:x".into(),
            nn: 2,
            icd_bytes: 8192,
            maxcmd: 128,
            vwc: true,
            kas: 10,
            aerl: 3,
            oaes: 0x100,
            ana: None,
            reservations: false,
        }
    }

    #[test]
    fn controller_fields_linux_checks_are_set() {
        let mut b = vec![0u8; IDENTIFY_LEN];
        encode_controller(&ctrl(), &mut b);
        let d = IdCtrl::decode(&b);
        assert_eq!(d.cntlid, 5);
        assert_eq!(
            d.ioccsz,
            4 + 8192 / 16,
            "IOCCSZ covers the 64-byte SQE plus ICD"
        );
        assert!(
            d.kas > 0,
            "Linux rejects an I/O controller without keep-alive"
        );
        assert_eq!(le32(&b, 536) & 0x3, 1, "SGLS bits 1:0 must not be 0");
        assert_eq!(le16(&b, 1800), 0, "ICDOFF must be 0");
        assert_eq!(d.subnqn, "nqn.2026-11.io.trellis:x");
        assert_eq!(d.serial, "SN1");
        assert_eq!(d.max_transfer_bytes(), Some(128 << 10));
    }

    #[test]
    fn discovery_controllers_promise_no_io_controller_services() {
        let mut b = vec![0u8; IDENTIFY_LEN];
        let d = ControllerInfo {
            kind: ControllerType::Discovery,
            icd_bytes: 0,
            vwc: false,
            ..ctrl()
        };
        encode_controller(&d, &mut b);
        assert_eq!(b[261], 0x04, "LPA: extended data only, no effects log");
        assert_eq!(le32(&b, 96), 0, "CTRATT: no Host Identifier feature");
        assert_eq!((b[258], b[260], b[262]), (0, 0, 0), "ACL, FRMW, ELPE");
        assert_eq!((le16(&b, 520), b[525]), (0, 0), "ONCS, VWC");
        assert_eq!((le32(&b, 1792), le32(&b, 1796)), (4, 1), "IOCCSZ, IORCSZ");
        encode_controller(&ctrl(), &mut b);
        assert_eq!(b[261], 0x06, "I/O controllers serve the effects log");
    }

    #[test]
    fn reservations_are_advertised_only_when_served() {
        let mut b = vec![0u8; IDENTIFY_LEN];
        encode_controller(&ctrl(), &mut b);
        assert_eq!(le16(&b, 520), 0x0C, "ONCS without reservations");
        let r = ControllerInfo {
            reservations: true,
            ..ctrl()
        };
        encode_controller(&r, &mut b);
        assert_eq!(le16(&b, 520), 0x0C | 0x20, "ONCS bit 5: Reservations");
        assert_eq!(
            IdCtrl::decode(&b).oncs & crate::resv::ONCS_RESERVATIONS,
            0x20
        );
        let ns = NamespaceInfo {
            size_blocks: 8,
            lbads: 9,
            nguid: [1; 16],
            eui64: [0; 8],
            uuid: [0; 16],
            read_only: false,
            deallocate_reads_zeroes: false,
            anagrpid: 0,
            rescap: crate::resv::RESCAP_ALL,
            used_blocks: None,
        };
        encode_namespace(&ns, &mut b);
        assert_eq!(b[31], 0xFF, "RESCAP: PTPL, six types, IEKEY (1.3)");
    }

    #[test]
    fn ns_list_is_strictly_after_and_descriptors_skip_zero_ids() {
        let mut b = vec![0u8; IDENTIFY_LEN];
        encode_ns_list([1u32, 2, 5].into_iter(), 1, &mut b);
        assert_eq!((le32(&b, 0), le32(&b, 4), le32(&b, 8)), (2, 5, 0));
        let ns = NamespaceInfo {
            size_blocks: 100,
            lbads: 9,
            nguid: [7; 16],
            eui64: [0; 8],
            uuid: [9; 16],
            read_only: false,
            deallocate_reads_zeroes: true,
            anagrpid: 4,
            rescap: 0,
            used_blocks: None,
        };
        encode_ns_descriptors(&ns, &mut b);
        assert_eq!(
            (b[0], b[1]),
            (2, 16),
            "EUI64 of zeroes is skipped, NGUID first"
        );
        assert_eq!((b[20], b[21]), (3, 16));
        assert_eq!(b[40], 0, "terminated");
        encode_namespace(&ns, &mut b);
        let n = IdNs::decode(&b);
        assert_eq!((n.nsze, n.ncap, n.block_size()), (100, 100, 512));
        assert_eq!(n.anagrpid, 4);
    }

    #[test]
    fn ana_fields_are_advertised_only_when_reported() {
        let mut b = vec![0u8; IDENTIFY_LEN];
        encode_controller(&ctrl(), &mut b);
        let d = IdCtrl::decode(&b);
        assert!(!d.reports_ana());
        assert_eq!((d.anagrpmax, d.nanagrpid, d.mnan), (0, 0, 0));
        let a = AnaCaps {
            anatt_s: 10,
            anacap: 0x5F,
            anagrpmax: 7,
            nanagrpid: 2,
        };
        encode_controller(
            &ControllerInfo {
                ana: Some(a),
                ..ctrl()
            },
            &mut b,
        );
        let d = IdCtrl::decode(&b);
        assert!(d.reports_ana());
        assert_eq!(d.cmic, 0x0B);
        assert_eq!(
            (d.anatt_s, d.anacap, d.anagrpmax, d.nanagrpid),
            (10, 0x5F, 7, 2)
        );
        assert_eq!(d.mnan, d.nn, "Linux needs 0 < MNAN <= NN");
        // Where Linux's struct nvme_id_ctrl (and nvme-cli) reads them.
        assert_eq!((b[342], b[343]), (10, 0x5F), "ANATT, ANACAP");
        assert_eq!(
            (le32(&b, 344), le32(&b, 348)),
            (7, 2),
            "ANAGRPMAX, NANAGRPID"
        );
        assert_eq!(le32(&b, 540), 2, "MNAN");
    }
}
