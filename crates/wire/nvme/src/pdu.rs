//! NVMe/TCP PDUs: the 8-byte common header, per-type header layouts, layout
//! validation with the right fatal error status (FES), and encoders.
//!
//! Validation is split in two so that both ends share it: [`check_layout`]
//! decides from the common header alone where the header, the optional digests
//! and the data lie (or which FES to send), before a single payload byte is
//! trusted; the typed decoders then read the PDU-specific fields.

use crate::{chunk, crc, le16, le32, put16, put32, put_bytes, Cqe, Sqe};

pub const CH_LEN: usize = 8;
pub const IC_LEN: usize = 128;
pub const CMD_HLEN: usize = 72;
pub const SMALL_HLEN: usize = 24;
pub const DIGEST_LEN: usize = 4;
/// A TermReq carries at most 128 bytes of the offending header (PLEN ≤ 152).
pub const TERM_MAX_PLEN: usize = 152;
/// IC_LEN as the header's HLEN (u8) and PLEN (u32) fields carry it.
const IC_HLEN: u8 = 128;
const IC_PLEN: u32 = 128;
const _: () = assert!(IC_HLEN as usize == IC_LEN && IC_PLEN as usize == IC_LEN);
/// SMALL_HLEN as the HLEN field carries it.
const SMALL_HLEN_U8: u8 = 24;
const _: () = assert!(SMALL_HLEN_U8 as usize == SMALL_HLEN);

/// Header-only encodings never exceed this (a CapsuleCmd with header digest).
pub const MAX_HDR_LEN: usize = CMD_HLEN + DIGEST_LEN;

/// In-capsule data every controller accepts for admin commands and for
/// Fabrics commands (Connect) on any queue, whatever IOCCSZ says (NVMe/TCP
/// transport spec): hosts send Connect data in the capsule.
pub const ADMIN_ICD_BYTES: usize = 8192;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PduType {
    IcReq = 0x00,
    IcResp = 0x01,
    H2CTermReq = 0x02,
    C2HTermReq = 0x03,
    CapsuleCmd = 0x04,
    CapsuleResp = 0x05,
    H2CData = 0x06,
    C2HData = 0x07,
    R2T = 0x09,
}

impl PduType {
    pub fn from_u8(v: u8) -> Option<PduType> {
        Some(match v {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2CTermReq,
            0x03 => PduType::C2HTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2CData,
            0x07 => PduType::C2HData,
            0x09 => PduType::R2T,
            _ => return None,
        })
    }
    /// The fixed HLEN of each type.
    pub fn hlen(self) -> usize {
        match self {
            PduType::IcReq | PduType::IcResp => IC_LEN,
            PduType::CapsuleCmd => CMD_HLEN,
            _ => SMALL_HLEN,
        }
    }
    /// Whether a header digest may follow the header of this type.
    fn hdgst_eligible(self) -> bool {
        !matches!(
            self,
            PduType::IcReq | PduType::IcResp | PduType::H2CTermReq | PduType::C2HTermReq
        )
    }
    /// Whether this type may carry data that a data digest covers.
    fn ddgst_eligible(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd | PduType::H2CData | PduType::C2HData
        )
    }
    /// Host-to-controller types (what a target accepts).
    pub fn is_h2c(self) -> bool {
        matches!(
            self,
            PduType::IcReq | PduType::H2CTermReq | PduType::CapsuleCmd | PduType::H2CData
        )
    }
}

pub mod flags {
    pub const HDGSTF: u8 = 0x01;
    pub const DDGSTF: u8 = 0x02;
    pub const LAST_PDU: u8 = 0x04;
    pub const SUCCESS: u8 = 0x08;
}

/// Fatal error status values carried in a TermReq.
pub mod fes {
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const DATA_LIMIT_EXCEEDED: u16 = 0x05;
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

/// Byte offsets of common-header fields, used as FEI for FES 0x01.
pub mod field {
    pub const TYPE: u32 = 0;
    pub const FLAGS: u32 = 1;
    pub const HLEN: u32 = 2;
    pub const PDO: u32 = 3;
    pub const PLEN: u32 = 4;
}

/// A fatal transport error: the connection must send a TermReq and close.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("fatal NVMe/TCP error: FES {fes:#04x} FEI {fei}")]
pub struct Fatal {
    pub fes: u16,
    pub fei: u32,
}

impl Fatal {
    pub const fn new(fes: u16, fei: u32) -> Fatal {
        Fatal { fes, fei }
    }
    pub fn name(&self) -> &'static str {
        match self.fes {
            fes::INVALID_HEADER_FIELD => "Invalid PDU Header Field",
            fes::PDU_SEQUENCE_ERROR => "PDU Sequence Error",
            fes::HEADER_DIGEST_ERROR => "Header Digest Error",
            fes::DATA_OUT_OF_RANGE => "Data Transfer Out of Range",
            fes::DATA_LIMIT_EXCEEDED => "Data Transfer Limit Exceeded",
            fes::UNSUPPORTED_PARAMETER => "Unsupported Parameter",
            _ => "Unknown FES",
        }
    }
}

/// The 8-byte common header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommonHeader {
    pub pdu_type: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

impl CommonHeader {
    /// Decodes the first 8 bytes; `None` if fewer are available.
    pub fn decode(b: &[u8]) -> Option<CommonHeader> {
        let b = b.first_chunk::<CH_LEN>()?;
        Some(CommonHeader {
            pdu_type: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        })
    }
    pub fn encode(&self, b: &mut [u8]) {
        put_bytes(b, 0, self.to_bytes());
    }
    /// The 8 header bytes as a value: one store instead of five
    /// bounds-checked ones on the per-I/O send path.
    #[inline]
    pub fn to_bytes(&self) -> [u8; CH_LEN] {
        let p = self.plen.to_le_bytes();
        [
            self.pdu_type,
            self.flags,
            self.hlen,
            self.pdo,
            p[0],
            p[1],
            p[2],
            p[3],
        ]
    }
}

/// Negotiated digests of one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

impl Digests {
    pub fn from_bits(v: u8) -> Digests {
        Digests {
            header: v & 1 != 0,
            data: v & 2 != 0,
        }
    }
    pub fn bits(self) -> u8 {
        self.header as u8 | (self.data as u8) << 1
    }
    /// Header digest length for digest-eligible PDUs.
    pub fn hd_len(self) -> usize {
        if self.header {
            DIGEST_LEN
        } else {
            0
        }
    }
}

/// Where the parts of a validated PDU lie, as offsets from its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub pdu_type: PduType,
    pub flags: u8,
    /// HLEN: common header plus PDU-specific header.
    pub hlen: usize,
    /// Whether a header digest follows the header (at offset `hlen`).
    pub hdgst: bool,
    /// Offset of the first data byte (meaningful when `data_len > 0`).
    pub data_off: usize,
    pub data_len: usize,
    /// Whether a data digest follows the data.
    pub ddgst: bool,
    pub plen: usize,
}

impl Layout {
    /// Bytes that must be buffered before the PDU-specific header can be read.
    pub fn header_total(&self) -> usize {
        self.hlen + if self.hdgst { DIGEST_LEN } else { 0 }
    }
}

/// The layout of an ICReq/ICResp (fixed length, no data offset) or a
/// TermReq (its data is the offending header, up to `TERM_MAX_PLEN`):
/// neither carries digests.
fn ic_or_term_layout(t: PduType, ch: &CommonHeader, plen: usize) -> Result<Layout, Fatal> {
    let bad = |fei| Err(Fatal::new(fes::INVALID_HEADER_FIELD, fei));
    let hlen = ch.hlen as usize;
    let ic = matches!(t, PduType::IcReq | PduType::IcResp);
    if (ic && plen != IC_LEN) || (!ic && !(SMALL_HLEN..=TERM_MAX_PLEN).contains(&plen)) {
        return bad(field::PLEN);
    }
    if ic && ch.pdo != 0 {
        return bad(field::PDO);
    }
    let (data_off, data_len) = if ic { (0, 0) } else { (hlen, plen - hlen) };
    Ok(Layout {
        pdu_type: t,
        flags: ch.flags,
        hlen,
        hdgst: false,
        data_off,
        data_len,
        ddgst: false,
        plen,
    })
}

/// Validates a received common header against the receiver's role, the
/// negotiated digests and the largest PDU the receiver accepts.
///
/// `before_ic` is true until the initialize-connection exchange is done: only
/// ICReq (at the controller) or ICResp (at the host) is acceptable then.
pub fn check_layout(
    ch: &CommonHeader,
    controller: bool,
    before_ic: bool,
    digests: Digests,
    max_plen: usize,
) -> Result<Layout, Fatal> {
    let bad = |fei| Err(Fatal::new(fes::INVALID_HEADER_FIELD, fei));
    let Some(t) = PduType::from_u8(ch.pdu_type) else {
        return bad(field::TYPE);
    };
    if t.is_h2c() != controller {
        // A PDU only the other side may send: a sequence error, not a bad field.
        return Err(Fatal::new(fes::PDU_SEQUENCE_ERROR, 0));
    }
    let ic = matches!(t, PduType::IcReq | PduType::IcResp);
    let term = matches!(t, PduType::H2CTermReq | PduType::C2HTermReq);
    if before_ic != ic && !term {
        return Err(Fatal::new(fes::PDU_SEQUENCE_ERROR, 0));
    }
    let hlen = ch.hlen as usize;
    if hlen != t.hlen() {
        return bad(field::HLEN);
    }
    let plen = ch.plen as usize;
    if ic || term {
        return ic_or_term_layout(t, ch, plen);
    }
    check_digest_flags(t, ch.flags, digests)?;
    let hdgst = digests.header && t.hdgst_eligible();
    let hdr_total = hlen + if hdgst { DIGEST_LEN } else { 0 };
    if plen > max_plen {
        return Err(Fatal::new(fes::DATA_LIMIT_EXCEEDED, 0));
    }
    if plen < hdr_total {
        return bad(field::PLEN);
    }
    if plen == hdr_total {
        if matches!(t, PduType::H2CData | PduType::C2HData) {
            return bad(field::PLEN); // a data PDU without data
        }
        if ch.pdo != 0 {
            return bad(field::PDO);
        }
        return Ok(Layout {
            pdu_type: t,
            flags: ch.flags,
            hlen,
            hdgst,
            data_off: 0,
            data_len: 0,
            ddgst: false,
            plen,
        });
    }
    if !t.ddgst_eligible() {
        return bad(field::PLEN); // CapsuleResp and R2T have fixed lengths
    }
    let pdo = ch.pdo as usize;
    // PDO must leave room for the header and be dword aligned (CPDA = 0). A
    // bounded gap of padding is allowed; Linux and SPDK never pad.
    if pdo < hdr_total || !pdo.is_multiple_of(4) || pdo > hdr_total + 128 {
        return bad(field::PDO);
    }
    let ddgst = digests.data;
    let trailer = if ddgst { DIGEST_LEN } else { 0 };
    if plen < pdo + trailer + 1 {
        return bad(field::PLEN);
    }
    Ok(Layout {
        pdu_type: t,
        flags: ch.flags,
        hlen,
        hdgst,
        data_off: pdo,
        data_len: plen - pdo - trailer,
        ddgst,
        plen,
    })
}

/// Digest flags must match what was negotiated, in both directions.
fn check_digest_flags(t: PduType, f: u8, d: Digests) -> Result<(), Fatal> {
    let hd_set = f & flags::HDGSTF != 0;
    if t.hdgst_eligible() && hd_set != d.header {
        return Err(Fatal::new(fes::INVALID_HEADER_FIELD, field::FLAGS));
    }
    let dd_set = f & flags::DDGSTF != 0;
    if dd_set && !(d.data && t.ddgst_eligible()) {
        return Err(Fatal::new(fes::INVALID_HEADER_FIELD, field::FLAGS));
    }
    Ok(())
}

/// Checks the header digest of a PDU whose `header_total()` bytes are in `b`.
#[inline]
pub fn verify_header_digest(layout: &Layout, b: &[u8]) -> Result<(), Fatal> {
    if !layout.hdgst {
        return Ok(());
    }
    check_header_digest(layout, b)
}

#[cold]
fn check_header_digest(layout: &Layout, b: &[u8]) -> Result<(), Fatal> {
    let want = le32(b, layout.hlen);
    // check_layout put hlen + DIGEST_LEN within PLEN, and the caller holds
    // header_total() bytes; a shorter `b` (a caller's bug) fails the check.
    let Some(hdr) = b.get(..layout.hlen) else {
        return Err(Fatal::new(fes::HEADER_DIGEST_ERROR, 0));
    };
    if crc::digest(hdr) != want {
        return Err(Fatal::new(fes::HEADER_DIGEST_ERROR, 0));
    }
    Ok(())
}

/// ICReq fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct IcReq {
    pub pfv: u16,
    pub hpda: u8,
    pub digests: Digests,
    pub maxr2t: u32,
}

impl IcReq {
    pub fn decode(b: &[u8]) -> IcReq {
        let (pfv, hpda, digests, maxr2t) = decode_ic(b);
        IcReq {
            pfv,
            hpda,
            digests,
            maxr2t,
        }
    }
    pub fn encode(&self, b: &mut [u8; IC_LEN]) {
        encode_ic(
            b,
            PduType::IcReq,
            self.pfv,
            self.hpda,
            self.digests,
            self.maxr2t,
        );
    }
}

/// ICResp fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct IcResp {
    pub pfv: u16,
    pub cpda: u8,
    pub digests: Digests,
    pub maxh2cdata: u32,
}

impl IcResp {
    pub fn decode(b: &[u8]) -> IcResp {
        let (pfv, cpda, digests, maxh2cdata) = decode_ic(b);
        IcResp {
            pfv,
            cpda,
            digests,
            maxh2cdata,
        }
    }
    pub fn encode(&self, b: &mut [u8; IC_LEN]) {
        encode_ic(
            b,
            PduType::IcResp,
            self.pfv,
            self.cpda,
            self.digests,
            self.maxh2cdata,
        );
    }
}

/// ICReq and ICResp share one layout: PFV, a PDU alignment byte, the digest
/// bits and one 32-bit limit (MAXR2T or MAXH2CDATA).
fn decode_ic(b: &[u8]) -> (u16, u8, Digests, u32) {
    let [_, _, _, _, _, _, _, _, p0, p1, pda, dgst, l0, l1, l2, l3] = chunk::<16>(b, 0);
    (
        u16::from_le_bytes([p0, p1]),
        pda,
        Digests::from_bits(dgst),
        u32::from_le_bytes([l0, l1, l2, l3]),
    )
}

fn encode_ic(b: &mut [u8; IC_LEN], t: PduType, pfv: u16, pda: u8, d: Digests, limit: u32) {
    b.fill(0);
    CommonHeader {
        pdu_type: t as u8,
        flags: 0,
        hlen: IC_HLEN,
        pdo: 0,
        plen: IC_PLEN,
    }
    .encode(b);
    put16(b, 8, pfv);
    b[10] = pda;
    b[11] = d.bits();
    put32(b, 12, limit);
}

/// H2CData / C2HData specific header (bytes 8..24).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DataHdr {
    pub cccid: u16,
    /// Echo of R2T.TTAG in H2CData; reserved (0) in C2HData.
    pub ttag: u16,
    pub datao: u32,
    pub datal: u32,
}

impl DataHdr {
    pub fn decode(b: &[u8]) -> DataHdr {
        DataHdr {
            cccid: le16(b, 8),
            ttag: le16(b, 10),
            datao: le32(b, 12),
            datal: le32(b, 16),
        }
    }
}

/// R2T specific header (bytes 8..24).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct R2t {
    pub cccid: u16,
    pub ttag: u16,
    pub r2to: u32,
    pub r2tl: u32,
}

impl R2t {
    pub fn decode(b: &[u8]) -> R2t {
        R2t {
            cccid: le16(b, 8),
            ttag: le16(b, 10),
            r2to: le32(b, 12),
            r2tl: le32(b, 16),
        }
    }
}

/// TermReq specific header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TermReq {
    pub fes: u16,
    pub fei: u32,
}

impl TermReq {
    /// Decodes FES and FEI; a header shorter than the 24 bytes a TermReq
    /// has reads as zeroes past its end (a peer's short PDU, never a panic).
    pub fn decode(b: &[u8]) -> TermReq {
        let b = &crate::padded::<24>(b);
        TermReq {
            fes: le16(b, 8),
            fei: le32(b, 10),
        }
    }
}

/// Fills in the common header of `h` (the PDU header, built in a fixed-size
/// array), stores it at the front of `b` with a header digest over it if
/// negotiated, and returns the bytes written (H, +4 with the digest). A PDU
/// carries data exactly when its PDO is non-zero (the data digest flag
/// follows from it).
#[inline]
fn finish_header<const H: usize>(
    b: &mut [u8],
    mut h: [u8; H],
    t: PduType,
    mut fl: u8,
    pdo: usize,
    plen: usize,
    d: Digests,
) -> usize {
    if d.header {
        fl |= flags::HDGSTF;
    }
    if d.data && pdo != 0 {
        fl |= flags::DDGSTF;
    }
    // Every header here is at most CMD_HLEN (72) long and its PDU at most a
    // MAXH2CDATA/MDTS-bounded data length plus 80 bytes, so the fields fit;
    // were one not to, it saturates (and a debug build asserts).
    debug_assert!(plen <= u32::MAX as usize && pdo <= u8::MAX as usize);
    let ch = CommonHeader {
        pdu_type: t as u8,
        flags: fl,
        hlen: u8::try_from(H).unwrap_or(u8::MAX),
        pdo: u8::try_from(pdo).unwrap_or(u8::MAX),
        plen: u32::try_from(plen).unwrap_or(u32::MAX),
    };
    if let Some(c) = h.first_chunk_mut::<CH_LEN>() {
        *c = ch.to_bytes();
    }
    put_bytes(b, 0, h);
    if d.header {
        finish_digest(b, &h)
    } else {
        H
    }
}

/// Appends the header digest over `h` (already stored at the front of `b`);
/// kept out of line, since the common case negotiates none.
#[cold]
fn finish_digest<const H: usize>(b: &mut [u8], h: &[u8; H]) -> usize {
    put32(b, H, crc::digest(h));
    H + DIGEST_LEN
}

/// Length on the wire of a data PDU carrying `datal` bytes.
pub fn data_pdu_plen(hlen: usize, datal: usize, d: Digests) -> usize {
    hlen + d.hd_len() + datal + if d.data && datal > 0 { DIGEST_LEN } else { 0 }
}

/// CapsuleResp (24 bytes, +4 with header digest). Returns the bytes written.
pub fn encode_capsule_resp(b: &mut [u8], cqe: &Cqe, d: Digests) -> usize {
    let d = Digests {
        header: d.header,
        data: false,
    };
    let plen = SMALL_HLEN + d.hd_len();
    // Built in a fixed-size array (constant offsets, no bounds checks),
    // then stored once: this runs once per command.
    let mut h = [0u8; SMALL_HLEN];
    h[8..12].copy_from_slice(&cqe.dw0.to_le_bytes());
    h[12..16].copy_from_slice(&cqe.dw1.to_le_bytes());
    h[16..18].copy_from_slice(&cqe.sqhd.to_le_bytes());
    h[18..20].copy_from_slice(&cqe.sqid.to_le_bytes());
    h[20..22].copy_from_slice(&cqe.cid.to_le_bytes());
    h[22..24].copy_from_slice(&cqe.status.to_wire().to_le_bytes());
    finish_header(b, h, PduType::CapsuleResp, 0, 0, plen, d)
}

/// C2HData or H2CData header (data and data digest follow, written by the caller).
pub fn encode_data_hdr(
    b: &mut [u8],
    t: PduType,
    h: &DataHdr,
    extra_flags: u8,
    d: Digests,
) -> usize {
    debug_assert!(matches!(t, PduType::C2HData | PduType::H2CData));
    debug_assert!(h.datal > 0);
    let pdo = SMALL_HLEN + d.hd_len();
    let plen = data_pdu_plen(SMALL_HLEN, h.datal as usize, d);
    let mut a = [0u8; SMALL_HLEN];
    a[8..10].copy_from_slice(&h.cccid.to_le_bytes());
    a[10..12].copy_from_slice(&h.ttag.to_le_bytes());
    a[12..16].copy_from_slice(&h.datao.to_le_bytes());
    a[16..20].copy_from_slice(&h.datal.to_le_bytes());
    finish_header(b, a, t, extra_flags, pdo, plen, d)
}

/// R2T header.
pub fn encode_r2t(b: &mut [u8], r: &R2t, d: Digests) -> usize {
    let d = Digests {
        header: d.header,
        data: false,
    };
    let mut h = [0u8; SMALL_HLEN];
    h[8..10].copy_from_slice(&r.cccid.to_le_bytes());
    h[10..12].copy_from_slice(&r.ttag.to_le_bytes());
    h[12..16].copy_from_slice(&r.r2to.to_le_bytes());
    h[16..20].copy_from_slice(&r.r2tl.to_le_bytes());
    let plen = SMALL_HLEN + d.hd_len();
    finish_header(b, h, PduType::R2T, 0, 0, plen, d)
}

/// CapsuleCmd header; `icd_len` bytes of in-capsule data follow (then a data
/// digest if negotiated and `icd_len > 0`).
pub fn encode_capsule_cmd(b: &mut [u8], sqe: &Sqe, icd_len: usize, d: Digests) -> usize {
    let hdr = CMD_HLEN + d.hd_len();
    let (pdo, plen) = if icd_len == 0 {
        (0, hdr)
    } else {
        (hdr, data_pdu_plen(CMD_HLEN, icd_len, d))
    };
    let mut h = [0u8; CMD_HLEN];
    h[8..CMD_HLEN].copy_from_slice(&sqe.0);
    finish_header(b, h, PduType::CapsuleCmd, 0, pdo, plen, d)
}

/// TermReq carrying up to 128 bytes of the offending header.
pub fn encode_term_req(b: &mut [u8], t: PduType, f: Fatal, offending: &[u8]) -> usize {
    debug_assert!(matches!(t, PduType::H2CTermReq | PduType::C2HTermReq));
    let mut h = [0u8; TERM_MAX_PLEN];
    h[8..10].copy_from_slice(&f.fes.to_le_bytes());
    h[10..14].copy_from_slice(&f.fei.to_le_bytes());
    let (_, rest) = h.split_at_mut(SMALL_HLEN);
    let plen = SMALL_HLEN + crate::copy_prefix(rest, offending);
    CommonHeader {
        pdu_type: t as u8,
        flags: 0,
        hlen: SMALL_HLEN_U8,
        pdo: 0,
        // At most TERM_MAX_PLEN (152).
        plen: u32::try_from(plen).unwrap_or(u32::MAX),
    }
    .encode(&mut h);
    let stored = b.get_mut(..plen).zip(h.get(..plen));
    if let Some((dst, src)) = stored {
        dst.copy_from_slice(src);
    }
    debug_assert!(b.len() >= plen, "TermReq of {plen} bytes into {}", b.len());
    plen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;

    const NO: Digests = Digests {
        header: false,
        data: false,
    };
    const BOTH: Digests = Digests {
        header: true,
        data: true,
    };

    fn ch(t: u8, fl: u8, hlen: u8, pdo: u8, plen: u32) -> CommonHeader {
        CommonHeader {
            pdu_type: t,
            flags: fl,
            hlen,
            pdo,
            plen,
        }
    }

    #[test]
    fn icreq_is_the_only_pdu_accepted_first() {
        let l = check_layout(&ch(0, 0, 128, 0, 128), true, true, NO, 1 << 20).unwrap();
        assert_eq!(l.pdu_type, PduType::IcReq);
        let e = check_layout(&ch(4, 0, 72, 0, 72), true, true, NO, 1 << 20).unwrap_err();
        assert_eq!(e.fes, fes::PDU_SEQUENCE_ERROR);
        let e = check_layout(&ch(0, 0, 128, 0, 128), true, false, NO, 1 << 20).unwrap_err();
        assert_eq!(
            e.fes,
            fes::PDU_SEQUENCE_ERROR,
            "a second ICReq is a sequence error"
        );
    }

    #[test]
    fn wrong_hlen_plen_pdo_report_offset_of_the_field() {
        let e = check_layout(&ch(4, 0, 70, 0, 72), true, false, NO, 1 << 20).unwrap_err();
        assert_eq!((e.fes, e.fei), (fes::INVALID_HEADER_FIELD, field::HLEN));
        let e = check_layout(&ch(4, 0, 72, 0, 60), true, false, NO, 1 << 20).unwrap_err();
        assert_eq!((e.fes, e.fei), (fes::INVALID_HEADER_FIELD, field::PLEN));
        let e = check_layout(&ch(4, 0, 72, 40, 72 + 512), true, false, NO, 1 << 20).unwrap_err();
        assert_eq!((e.fes, e.fei), (fes::INVALID_HEADER_FIELD, field::PDO));
        let e = check_layout(&ch(0x42, 0, 72, 0, 72), true, false, NO, 1 << 20).unwrap_err();
        assert_eq!((e.fes, e.fei), (fes::INVALID_HEADER_FIELD, field::TYPE));
    }

    #[test]
    fn capsule_with_data_and_both_digests_has_expected_layout() {
        let fl = flags::HDGSTF | flags::DDGSTF;
        let plen = 76 + 4096 + 4;
        let l = check_layout(&ch(4, fl, 72, 76, plen), true, false, BOTH, 1 << 20).unwrap();
        assert_eq!(
            (l.data_off, l.data_len, l.ddgst, l.hdgst),
            (76, 4096, true, true)
        );
        // Missing HDGSTF when negotiated is a bad flags field.
        let e = check_layout(
            &ch(4, flags::DDGSTF, 72, 76, plen),
            true,
            false,
            BOTH,
            1 << 20,
        )
        .unwrap_err();
        assert_eq!(e.fei, field::FLAGS);
    }

    #[test]
    fn oversize_pdu_is_a_limit_error() {
        let e = check_layout(
            &ch(6, 0, 24, 24, 24 + (1 << 20)),
            true,
            false,
            NO,
            256 << 10,
        )
        .unwrap_err();
        assert_eq!(e.fes, fes::DATA_LIMIT_EXCEEDED);
    }

    #[test]
    fn encoded_headers_validate_and_digest_checks() {
        let mut b = [0u8; 64];
        let cqe = Cqe {
            cid: 9,
            status: Status::SUCCESS,
            ..Default::default()
        };
        let n = encode_capsule_resp(&mut b, &cqe, BOTH);
        assert_eq!(n, 28);
        let h = CommonHeader::decode(&b).unwrap();
        let l = check_layout(&h, false, false, BOTH, 1 << 20).unwrap();
        assert_eq!(l.plen, 28);
        verify_header_digest(&l, &b).unwrap();
        b[12] ^= 1; // corrupt the CID
        assert_eq!(
            verify_header_digest(&l, &b).unwrap_err().fes,
            fes::HEADER_DIGEST_ERROR
        );

        let n = encode_data_hdr(
            &mut b,
            PduType::C2HData,
            &DataHdr {
                cccid: 1,
                ttag: 0,
                datao: 0,
                datal: 4096,
            },
            flags::LAST_PDU,
            BOTH,
        );
        assert_eq!(n, 28);
        let h = CommonHeader::decode(&b).unwrap();
        let l = check_layout(&h, false, false, BOTH, 1 << 20).unwrap();
        assert_eq!((l.data_off, l.data_len, l.plen), (28, 4096, 28 + 4096 + 4));
    }

    #[test]
    fn term_req_truncates_offending_header() {
        let mut b = [0u8; 200];
        let n = encode_term_req(&mut b, PduType::C2HTermReq, Fatal::new(1, 2), &[0xAA; 200]);
        assert_eq!(n, TERM_MAX_PLEN);
        let t = TermReq::decode(&b);
        assert_eq!((t.fes, t.fei), (1, 2));
    }

    /// Found by `tests/arbitrary_bytes.rs`: a 12-byte TermReq from a peer
    /// read FEI past its end (a debug assertion; zeroes in release).
    #[test]
    fn a_short_term_req_reads_zeroes_past_its_end() {
        let mut b = [0u8; 12];
        b[8] = 3; // FES, whole
        b[10] = 0x7f; // the first half of FEI
        let t = TermReq::decode(&b);
        assert_eq!((t.fes, t.fei), (3, 0x7f));
        assert_eq!(TermReq::decode(&[]).fei, 0);
    }

    proptest::proptest! {
        /// Any common header either fails with a FES or yields a layout whose
        /// parts lie inside PLEN in order.
        #[test]
        fn layout_is_always_inside_plen(t in 0u8..12, fl in 0u8..16, hlen in 0u8..=255, pdo in 0u8..=255,
                                        plen in 0u32..70000, ctl: bool, bic: bool, hd: bool, dd: bool) {
            let d = Digests { header: hd, data: dd };
            if let Ok(l) = check_layout(&ch(t, fl, hlen, pdo, plen), ctl, bic, d, 65536) {
                proptest::prop_assert!(l.header_total() <= l.plen);
                if l.data_len > 0 {
                    proptest::prop_assert!(l.data_off >= l.header_total());
                    let trailer = if l.ddgst { 4 } else { 0 };
                    proptest::prop_assert_eq!(l.data_off + l.data_len + trailer, l.plen);
                }
            }
        }
    }
}
