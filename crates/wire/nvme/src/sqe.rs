//! The 64-byte submission queue entry, the SGL descriptor and the 16-byte
//! completion queue entry.

use crate::{le16, le32, le64, put16, put32, put64, Status};

pub const SQE_SIZE: usize = 64;
pub const CQE_SIZE: usize = 16;

/// Admin opcodes (NVMe Base 2.0, figure "Opcodes for Admin Commands").
pub mod admin {
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0A;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0C;
    pub const KEEP_ALIVE: u8 = 0x18;
    pub const FABRICS: u8 = 0x7F;
}

/// NVM command set I/O opcodes.
pub mod io {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    pub const RESV_REGISTER: u8 = 0x0D;
    pub const RESV_REPORT: u8 = 0x0E;
    pub const RESV_ACQUIRE: u8 = 0x11;
    pub const RESV_RELEASE: u8 = 0x15;
    pub const FABRICS: u8 = 0x7F;
}

/// SGL descriptor identifier byte (type << 4 | subtype).
pub mod sgl_id {
    /// Data Block, Offset subtype: in-capsule data.
    pub const DATA_BLOCK_OFFSET: u8 = 0x01;
    /// Transport SGL Data Block, transport-specific subtype: C2HData or R2T/H2CData.
    pub const TRANSPORT_DATA_BLOCK: u8 = 0x5A;
}

/// One SGL descriptor (16 bytes at SQE offset 24).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Sgl {
    pub address: u64,
    pub length: u32,
    pub id: u8,
}

impl Sgl {
    pub fn decode(b: &[u8]) -> Sgl {
        let a: [u8; 16] = crate::chunk(b, 0);
        Sgl {
            address: le64(&a, 0),
            length: le32(&a, 8),
            id: a[15],
        }
    }
    pub fn encode(&self, b: &mut [u8]) {
        let mut a = [0u8; 16];
        a[..8].copy_from_slice(&self.address.to_le_bytes());
        a[8..12].copy_from_slice(&self.length.to_le_bytes());
        a[15] = self.id;
        crate::put_bytes(b, 0, a);
    }
    /// In-capsule data descriptor (offset 0 within the capsule).
    pub fn in_capsule(length: u32) -> Sgl {
        Sgl {
            address: 0,
            length,
            id: sgl_id::DATA_BLOCK_OFFSET,
        }
    }
    /// Transport data block: the data moves in C2HData or R2T/H2CData PDUs.
    pub fn transport(length: u32) -> Sgl {
        Sgl {
            address: 0,
            length,
            id: sgl_id::TRANSPORT_DATA_BLOCK,
        }
    }
}

/// A 64-byte submission queue entry, kept as raw bytes with typed accessors:
/// copying 64 bytes is cheaper than decoding fields that are never read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_SIZE]);

impl Default for Sqe {
    fn default() -> Self {
        Sqe([0; SQE_SIZE])
    }
}

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Sqe{{opc {:#04x} cid {:#06x} nsid {} cdw10 {:#x} cdw11 {:#x} cdw12 {:#x} sgl {:?}}}",
            self.opcode(),
            self.cid(),
            self.nsid(),
            self.cdw10(),
            self.cdw11(),
            self.cdw12(),
            self.sgl()
        )
    }
}

impl Sqe {
    /// Decodes from the first 64 bytes of `b` (callers pass at least 64; see
    /// [`crate::le16`] for a shorter `b`).
    pub fn from_slice(b: &[u8]) -> Sqe {
        Sqe(crate::chunk(b, 0))
    }
    pub fn new(opcode: u8, cid: u16, nsid: u32) -> Sqe {
        let mut s = Sqe::default();
        s.0[0] = opcode;
        // PSDT = 01b: SGL for data, as both reference hosts send.
        s.0[1] = 0x40;
        put16(&mut s.0, 2, cid);
        put32(&mut s.0, 4, nsid);
        s
    }
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    /// FUSE bits 1:0 of byte 1.
    pub fn fuse(&self) -> u8 {
        self.0[1] & 0x3
    }
    /// PSDT bits 7:6 of byte 1 (01b = SGL, metadata contiguous).
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }
    pub fn cid(&self) -> u16 {
        le16(&self.0, 2)
    }
    pub fn set_cid(&mut self, cid: u16) {
        put16(&mut self.0, 2, cid)
    }
    pub fn nsid(&self) -> u32 {
        le32(&self.0, 4)
    }
    /// Fabrics command type (byte 4 of a 0x7F command).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }
    pub fn sgl(&self) -> Sgl {
        Sgl::decode(&self.0[24..40])
    }
    pub fn set_sgl(&mut self, sgl: Sgl) {
        sgl.encode(&mut self.0[24..40])
    }
    pub fn cdw(&self, n: usize) -> u32 {
        debug_assert!((10..=15).contains(&n));
        le32(&self.0, 40 + (n - 10) * 4)
    }
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        debug_assert!((10..=15).contains(&n));
        put32(&mut self.0, 40 + (n - 10) * 4, v)
    }
    pub fn cdw10(&self) -> u32 {
        self.cdw(10)
    }
    pub fn cdw11(&self) -> u32 {
        self.cdw(11)
    }
    pub fn cdw12(&self) -> u32 {
        self.cdw(12)
    }
    pub fn cdw13(&self) -> u32 {
        self.cdw(13)
    }
    pub fn cdw14(&self) -> u32 {
        self.cdw(14)
    }
    /// Starting LBA of Read/Write/Write Zeroes (CDW10-11).
    pub fn slba(&self) -> u64 {
        le64(&self.0, 40)
    }
    /// Number of logical blocks, converted from the 0-based field (CDW12 15:0).
    pub fn nlb(&self) -> u32 {
        (self.cdw12() & 0xffff) + 1
    }
    /// Force Unit Access (CDW12 bit 30).
    pub fn fua(&self) -> bool {
        self.cdw12() & (1 << 30) != 0
    }
    /// Builds a Read or Write (`nlb` is 1-based here and encoded 0-based).
    pub fn rw(opcode: u8, cid: u16, nsid: u32, slba: u64, nlb: u32, fua: bool) -> Sqe {
        debug_assert!((1..=65536).contains(&nlb));
        let mut s = Sqe::new(opcode, cid, nsid);
        put64(&mut s.0, 40, slba);
        s.set_cdw(12, (nlb - 1) | if fua { 1 << 30 } else { 0 });
        s
    }
}

/// A 16-byte completion queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cqe {
    pub dw0: u32,
    pub dw1: u32,
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    pub status: Status,
}

impl Cqe {
    pub fn decode(b: &[u8]) -> Cqe {
        debug_assert!(b.len() >= CQE_SIZE);
        Cqe {
            dw0: le32(b, 0),
            dw1: le32(b, 4),
            sqhd: le16(b, 8),
            sqid: le16(b, 10),
            cid: le16(b, 12),
            status: Status::from_wire(le16(b, 14)),
        }
    }
    pub fn encode(&self, b: &mut [u8]) {
        put32(b, 0, self.dw0);
        put32(b, 4, self.dw1);
        put16(b, 8, self.sqhd);
        put16(b, 10, self.sqid);
        put16(b, 12, self.cid);
        put16(b, 14, self.status.to_wire());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rw_fields_roundtrip_with_zero_based_nlb() {
        let s = Sqe::rw(io::WRITE, 0x1234, 7, 0x1_0000_0002, 8, true);
        assert_eq!(s.opcode(), io::WRITE);
        assert_eq!(s.cid(), 0x1234);
        assert_eq!(s.nsid(), 7);
        assert_eq!(s.slba(), 0x1_0000_0002);
        assert_eq!(s.cdw12() & 0xffff, 7, "NLB is 0-based on the wire");
        assert_eq!(s.nlb(), 8);
        assert!(s.fua());
        assert_eq!(s.psdt(), 1);
    }

    #[test]
    fn cqe_roundtrip() {
        let c = Cqe {
            dw0: 1,
            dw1: 2,
            sqhd: 3,
            sqid: 4,
            cid: 0xbeef,
            status: Status::new(0, 0x80).dnr(),
        };
        let mut b = [0u8; 16];
        c.encode(&mut b);
        assert_eq!(Cqe::decode(&b), c);
        assert_eq!(&b[12..14], &[0xef, 0xbe]);
    }
}
