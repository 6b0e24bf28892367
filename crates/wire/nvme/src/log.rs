//! Log pages: Get Log Page command fields, discovery log, SMART / health,
//! error information, commands supported and effects.

use crate::{get_cstr, le16, le32, le64, put16, put32, put64, put_ascii_padded, put_cstr, Sqe};

pub mod lid {
    pub const SUPPORTED_LOGS: u8 = 0x00;
    pub const ERROR: u8 = 0x01;
    pub const SMART: u8 = 0x02;
    pub const FIRMWARE_SLOT: u8 = 0x03;
    pub const CHANGED_NS_LIST: u8 = 0x04;
    pub const COMMANDS_EFFECTS: u8 = 0x05;
    /// Asymmetric Namespace Access (see [`crate::ana`]).
    pub const ANA: u8 = 0x0C;
    pub const DISCOVERY: u8 = 0x70;
    /// Reservation Notification (NVMe Base 2.0 §5.16.1.25).
    pub const RESERVATION: u8 = 0x80;
}

/// Get Log Page command fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetLogPage {
    pub lid: u8,
    pub lsp: u8,
    /// Retain Asynchronous Event: when clear, reading the log clears the event.
    pub rae: bool,
    /// Length in bytes ((NUMD + 1) * 4).
    pub len_bytes: u64,
    /// Byte offset into the log.
    pub offset_bytes: u64,
}

impl GetLogPage {
    pub fn decode(s: &Sqe) -> GetLogPage {
        let numdl = (s.cdw10() >> 16) as u64;
        let numdu = (s.cdw11() & 0xffff) as u64;
        GetLogPage {
            lid: (s.cdw10() & 0xff) as u8,
            lsp: ((s.cdw10() >> 8) & 0x7f) as u8,
            rae: s.cdw10() & (1 << 15) != 0,
            len_bytes: ((numdu << 16 | numdl) + 1) * 4,
            offset_bytes: (s.cdw13() as u64) << 32 | s.cdw12() as u64,
        }
    }
    pub fn to_sqe(&self, cid: u16, nsid: u32) -> Sqe {
        debug_assert!(self.len_bytes >= 4 && self.len_bytes.is_multiple_of(4));
        let numd = self.len_bytes / 4 - 1;
        let mut s = Sqe::new(crate::sqe::admin::GET_LOG_PAGE, cid, nsid);
        // The SGL length is 32 bits: a read of 4 GiB or more (which no
        // caller makes: the buffer is a Vec it allocates) saturates.
        let sgl_len = u32::try_from(self.len_bytes).unwrap_or(u32::MAX);
        s.set_sgl(crate::Sgl::transport(sgl_len));
        s.set_cdw(
            10,
            self.lid as u32
                | (self.lsp as u32) << 8
                | (self.rae as u32) << 15
                | (lo32(numd) & 0xffff) << 16,
        );
        s.set_cdw(11, lo32(numd >> 16) & 0xffff);
        s.set_cdw(12, lo32(self.offset_bytes));
        s.set_cdw(13, lo32(self.offset_bytes >> 32));
        s
    }
}

/// The low 32 bits of `v`: NUMD and the log page offset are split into
/// dwords across CDW10..13, so truncation is the point.
fn lo32(v: u64) -> u32 {
    let [a, b, c, d, ..] = v.to_le_bytes();
    u32::from_le_bytes([a, b, c, d])
}

/// Copies `log[offset..offset+out.len()]` into `out`, zero-filling past the
/// end of the log (hosts read 4 KiB chunks beyond it).
pub fn copy_window(log: &[u8], offset_bytes: u64, out: &mut [u8]) {
    out.fill(0);
    // An offset at or past the end (LPO is the host's 64-bit choice) copies nothing.
    let tail = usize::try_from(offset_bytes)
        .ok()
        .and_then(|start| log.get(start..))
        .unwrap_or_default();
    crate::copy_prefix(out, tail);
}

pub const DISC_HDR_LEN: usize = 1024;
pub const DISC_ENTRY_LEN: usize = 1024;

pub mod subtype {
    pub const REFERRAL: u8 = 1;
    pub const NVME: u8 = 2;
    pub const CURRENT_DISCOVERY: u8 = 3;
}

/// One discovery log entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// 1 = IPv4, 2 = IPv6.
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub portid: u16,
    pub trsvcid: String,
    pub subnqn: String,
    pub traddr: String,
    /// TSAS byte 0 for TCP: SECTYPE (0 none, 1 TLS 1.2, 2 TLS 1.3; Linux's
    /// `NVMF_TCP_SECTYPE_*`).
    pub sectype: u8,
}

/// TSAS SECTYPE values (NVMe/TCP transport specification 1.0 §3.6.1.1).
pub mod sectype {
    pub const NONE: u8 = 0;
    pub const TLS13: u8 = 2;
}

/// TREQ bits 1:0, the secure channel requirement.
pub mod treq {
    pub const NOT_SPECIFIED: u8 = 0;
    pub const REQUIRED: u8 = 1;
    pub const NOT_REQUIRED: u8 = 2;
    /// Bit 2: SQ flow control disable supported.
    pub const SQFLOW_DISABLE: u8 = 4;
}

impl DiscoveryEntry {
    /// Writes the 1024-byte entry at the front of `b` (at least that long).
    pub fn encode(&self, b: &mut [u8]) {
        let Some(b) = crate::front_mut::<DISC_ENTRY_LEN>(b) else {
            return;
        };
        b.fill(0);
        b[0] = 3; // TRTYPE: TCP
        b[1] = self.adrfam;
        b[2] = self.subtype;
        b[3] = self.treq;
        put16(b, 4, self.portid);
        put16(b, 6, 0xFFFF); // CNTLID: dynamic model
        put16(b, 8, 32); // ASQSZ
                         // EFLAGS for our own entry: duplicate returned info, explicit persistent connections.
        put16(
            b,
            10,
            if self.subtype == subtype::CURRENT_DISCOVERY {
                0x3
            } else {
                0
            },
        );
        // TRSVCID and TRADDR are space padded (libnvme trims them).
        put_ascii_padded(&mut b[32..64], &self.trsvcid);
        put_cstr(&mut b[256..512], &self.subnqn);
        put_ascii_padded(&mut b[512..768], &self.traddr);
        b[768] = self.sectype; // TSAS (TCP): SECTYPE, the rest zero
    }
    /// Decodes one entry; bytes past the end of a short `b` read as zero.
    pub fn decode(b: &[u8]) -> DiscoveryEntry {
        let b = &crate::padded::<DISC_ENTRY_LEN>(b);
        let txt = |f: &[u8]| get_cstr(f).unwrap_or("").trim_end().to_string();
        DiscoveryEntry {
            adrfam: b[1],
            subtype: b[2],
            treq: b[3],
            portid: le16(b, 4),
            trsvcid: txt(&b[32..64]),
            subnqn: txt(&b[256..512]),
            traddr: txt(&b[512..768]),
            sectype: b[768],
        }
    }
}

/// Builds the whole discovery log page into `out` (header + entries).
pub fn encode_discovery_log(genctr: u64, entries: &[DiscoveryEntry], out: &mut Vec<u8>) {
    out.clear();
    out.resize(DISC_HDR_LEN + entries.len() * DISC_ENTRY_LEN, 0);
    put64(out, 0, genctr);
    put64(out, 8, entries.len() as u64);
    put16(out, 16, 0); // RECFMT
                       // TDLPL: entries are bounded by the config far below 4 GiB of them.
    let total = u32::try_from(out.len()).unwrap_or(u32::MAX);
    put32(out, 20, total);
    let body = out.get_mut(DISC_HDR_LEN..).unwrap_or_default();
    for (e, b) in entries.iter().zip(body.chunks_exact_mut(DISC_ENTRY_LEN)) {
        e.encode(b);
    }
}

/// Discovery log header fields.
pub fn decode_discovery_header(b: &[u8]) -> (u64, u64, u16) {
    (le64(b, 0), le64(b, 8), le16(b, 16))
}

/// SMART / Health Information counters (LID 02h), the fields we keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Smart {
    pub critical_warning: u8,
    pub temperature_k: u16,
    pub available_spare_pct: u8,
    pub percent_used: u8,
    /// In units of 1000 × 512 bytes, rounded up (as the spec defines).
    pub data_units_read: u128,
    pub data_units_written: u128,
    pub host_read_commands: u128,
    pub host_write_commands: u128,
    pub power_on_hours: u128,
    pub unsafe_shutdowns: u128,
    pub media_errors: u128,
    pub error_log_entries: u128,
}

pub const SMART_LEN: usize = 512;
/// The Available Spare Threshold the target's SMART page reports, percent.
pub const AVAILABLE_SPARE_THRESHOLD_PCT: u8 = 10;

impl Smart {
    /// Writes the 512-byte page at the front of `b` (at least that long).
    pub fn encode(&self, b: &mut [u8]) {
        let Some(b) = crate::front_mut::<SMART_LEN>(b) else {
            return;
        };
        b.fill(0);
        b[0] = self.critical_warning;
        put16(b, 1, self.temperature_k);
        b[3] = self.available_spare_pct;
        b[4] = AVAILABLE_SPARE_THRESHOLD_PCT;
        b[5] = self.percent_used;
        let put128 = |b: &mut [u8], off: usize, v: u128| crate::put_bytes(b, off, v.to_le_bytes());
        put128(b, 32, self.data_units_read);
        put128(b, 48, self.data_units_written);
        put128(b, 64, self.host_read_commands);
        put128(b, 80, self.host_write_commands);
        put128(b, 112, 0); // power cycles
        put128(b, 128, self.power_on_hours);
        put128(b, 144, self.unsafe_shutdowns);
        put128(b, 160, self.media_errors);
        put128(b, 176, self.error_log_entries);
    }
    /// Decodes the page; bytes past the end of a short `b` read as zero.
    pub fn decode(b: &[u8]) -> Smart {
        let b = &crate::padded::<SMART_LEN>(b);
        let g = |off: usize| crate::le128(b, off);
        Smart {
            critical_warning: b[0],
            temperature_k: le16(b, 1),
            available_spare_pct: b[3],
            percent_used: b[5],
            data_units_read: g(32),
            data_units_written: g(48),
            host_read_commands: g(64),
            host_write_commands: g(80),
            power_on_hours: g(128),
            unsafe_shutdowns: g(144),
            media_errors: g(160),
            error_log_entries: g(176),
        }
    }
}

/// Data units as SMART counts them: thousands of 512-byte units, rounded up.
pub fn data_units(bytes: u64) -> u128 {
    (bytes as u128).div_ceil(512_000)
}

/// One error information log entry (64 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorEntry {
    pub error_count: u64,
    pub sqid: u16,
    pub cid: u16,
    pub status: u16,
    pub lba: u64,
    pub nsid: u32,
}

impl ErrorEntry {
    /// Writes the 64-byte entry at the front of `b` (at least that long).
    pub fn encode(&self, b: &mut [u8]) {
        let Some(b) = crate::front_mut::<64>(b) else {
            return;
        };
        b.fill(0);
        put64(b, 0, self.error_count);
        put16(b, 8, self.sqid);
        put16(b, 10, self.cid);
        put16(b, 12, self.status);
        put16(b, 14, 0xFFFF); // parameter error location: not specific
        put64(b, 16, self.lba);
        put32(b, 24, self.nsid);
    }
}

/// Commands Supported and Effects (LID 05h): one (opcode, effects dword) per
/// admin and I/O command served; the dword carries CSUPP (bit 0) and the
/// effect bits (LBCC bit 1, ...).
pub fn encode_commands_effects(admin: &[(u8, u32)], io: &[(u8, u32)], b: &mut [u8]) {
    let Some(b) = crate::front_mut::<4096>(b) else {
        return;
    };
    b.fill(0);
    for &(op, e) in admin {
        put32(b, op as usize * 4, e);
    }
    for &(op, e) in io {
        put32(b, 1024 + op as usize * 4, e);
    }
}

/// Supported Log Pages (LID 00h).
pub fn encode_supported_logs(lids: &[u8], b: &mut [u8]) {
    let Some(b) = crate::front_mut::<1024>(b) else {
        return;
    };
    b.fill(0);
    for &l in lids {
        put32(b, l as usize * 4, 1);
    }
}

/// Reads an LE32 array entry (changed namespace list etc.).
pub fn entry32(b: &[u8], i: usize) -> u32 {
    le32(b, i * 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_log_page_roundtrip_with_large_numd() {
        let g = GetLogPage {
            lid: lid::DISCOVERY,
            lsp: 0,
            rae: true,
            len_bytes: 1 << 20,
            offset_bytes: 5120,
        };
        let s = g.to_sqe(1, 0);
        assert_eq!(GetLogPage::decode(&s), g);
    }

    #[test]
    fn discovery_log_header_and_entries_roundtrip() {
        let e = DiscoveryEntry {
            adrfam: 1,
            subtype: subtype::NVME,
            treq: 0,
            portid: 1,
            trsvcid: "4420".into(),
            subnqn: "nqn.2026-11.io.trellis:default".into(),
            traddr: "127.0.0.1".into(),
            sectype: sectype::TLS13,
        };
        let mut log = Vec::new();
        encode_discovery_log(7, &[e.clone(), e.clone()], &mut log);
        assert_eq!(decode_discovery_header(&log), (7, 2, 0));
        assert_eq!(DiscoveryEntry::decode(&log[1024..2048]), e);
        // A 4 KiB read at offset 1024 gets both entries then zeroes.
        let mut w = vec![0xAAu8; 4096];
        copy_window(&log, 1024, &mut w);
        assert_eq!(&w[..2048], &log[1024..]);
        assert!(w[2048..].iter().all(|&x| x == 0));
    }

    #[test]
    fn smart_roundtrip_and_data_units_round_up() {
        let s = Smart {
            data_units_read: data_units(1),
            host_read_commands: 3,
            temperature_k: 300,
            ..Default::default()
        };
        assert_eq!(s.data_units_read, 1);
        assert_eq!(data_units(512_000), 1);
        assert_eq!(data_units(512_001), 2);
        let mut b = [0u8; 512];
        s.encode(&mut b);
        assert_eq!(Smart::decode(&b), s);
    }
}
