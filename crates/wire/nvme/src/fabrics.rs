//! NVMe over Fabrics commands: Connect, Property Get/Set, and the controller
//! properties (CAP, VS, CC, CSTS) a fabrics host reads and writes.

use crate::{get_cstr, le16, le32, le64, put16, put32, put64, put_cstr, Sgl, Sqe};

pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTH_SEND: u8 = 0x05;
    pub const AUTH_RECV: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}

/// The well-known discovery subsystem NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
pub const CONNECT_DATA_LEN: usize = 1024;
pub const NQN_FIELD_LEN: usize = 256;
/// CONNECT_DATA_LEN as the SGL length field carries it.
const CONNECT_DATA_LEN_U32: u32 = 1024;
const _: () = assert!(CONNECT_DATA_LEN_U32 as usize == CONNECT_DATA_LEN);
/// NQNs are at most 223 bytes (NVMe Base 2.0 §4.5).
pub const NQN_MAX_LEN: usize = 223;
/// Dynamic controller model: the host asks for "any controller".
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;

/// Byte offsets inside the Connect SQE and data, reported as IPO in
/// "Connect Invalid Parameters" (with IATTR bit 0 set for data offsets).
pub mod ipo {
    pub const SQE_QID: u16 = 42;
    pub const SQE_SQSIZE: u16 = 44;
    pub const DATA_CNTLID: u16 = 16;
    pub const DATA_SUBNQN: u16 = 256;
    pub const DATA_HOSTNQN: u16 = 512;
}

/// DW0 of a "Connect Invalid Parameters" completion.
pub fn invalid_param_dw0(in_data: bool, offset: u16) -> u32 {
    offset as u32 | if in_data { 1 << 16 } else { 0 }
}

/// Connect SQE fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectCmd {
    pub recfmt: u16,
    pub qid: u16,
    /// 0-based queue size.
    pub sqsize: u16,
    pub cattr: u8,
    pub kato_ms: u32,
}

impl ConnectCmd {
    pub fn decode(s: &Sqe) -> ConnectCmd {
        let b = &s.0;
        ConnectCmd {
            recfmt: le16(b, 40),
            qid: le16(b, 42),
            sqsize: le16(b, 44),
            cattr: b[46],
            kato_ms: le32(b, 48),
        }
    }
    /// SQ flow control disabled (CATTR bit 2): SQHD is not kept, and the
    /// C2HData SUCCESS optimisation becomes available.
    pub fn disable_sqflow(&self) -> bool {
        self.cattr & 0x4 != 0
    }
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(crate::sqe::admin::FABRICS, cid, 0);
        s.0[4] = fctype::CONNECT;
        s.set_sgl(Sgl::in_capsule(CONNECT_DATA_LEN_U32));
        put16(&mut s.0, 40, self.recfmt);
        put16(&mut s.0, 42, self.qid);
        put16(&mut s.0, 44, self.sqsize);
        s.0[46] = self.cattr;
        put32(&mut s.0, 48, self.kato_ms);
        s
    }
}

/// Connect data (1024 bytes, in-capsule).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectData {
    pub hostid: [u8; 16],
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

/// Why Connect data could not be read, as the IPO of the offending field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadConnectField(pub u16);

impl ConnectData {
    pub fn decode(b: &[u8]) -> Result<ConnectData, BadConnectField> {
        let b: &[u8; CONNECT_DATA_LEN] = b.first_chunk().ok_or(BadConnectField(0))?;
        // The host NQN may be empty (SPDK's initiator sends none unless
        // told): whether that is acceptable is the subsystem's policy. An
        // NQN is UTF-8 (NVMe Base 2.0 §4.5); control characters (C0, DEL,
        // C1: an ANSI escape starts with ESC) have no place in one and would
        // reach terminals and logs that print NQNs, so they are refused here,
        // before anything stores or prints the name.
        let nqn = |f: &[u8], ipo, may_be_empty: bool| match get_cstr(f) {
            Some(s)
                if (may_be_empty || !s.is_empty())
                    && s.len() <= NQN_MAX_LEN
                    && !s.chars().any(char::is_control) =>
            {
                Ok(s.to_string())
            }
            _ => Err(BadConnectField(ipo)),
        };
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&b[0..16]);
        Ok(ConnectData {
            hostid,
            cntlid: le16(b, 16),
            subnqn: nqn(&b[256..512], ipo::DATA_SUBNQN, false)?,
            hostnqn: nqn(&b[512..768], ipo::DATA_HOSTNQN, true)?,
        })
    }
    /// Writes the 1024 bytes at the front of `b` (at least that long).
    pub fn encode(&self, b: &mut [u8]) {
        let Some(b) = crate::front_mut::<CONNECT_DATA_LEN>(b) else {
            return;
        };
        b.fill(0);
        b[0..16].copy_from_slice(&self.hostid);
        put16(b, 16, self.cntlid);
        put_cstr(&mut b[256..512], &self.subnqn);
        put_cstr(&mut b[512..768], &self.hostnqn);
    }
}

/// Property offsets.
pub mod prop {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1C;
    pub const NSSR: u32 = 0x20;
}

/// Property Get/Set SQE fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PropertyCmd {
    /// true for an 8-byte access (ATTRIB.SIZE = 1).
    pub size8: bool,
    pub offset: u32,
    pub value: u64,
}

impl PropertyCmd {
    pub fn decode(s: &Sqe) -> PropertyCmd {
        PropertyCmd {
            size8: s.0[40] & 0x7 == 1,
            offset: le32(&s.0, 44),
            value: le64(&s.0, 48),
        }
    }
    pub fn to_sqe(&self, cid: u16, set: bool) -> Sqe {
        let mut s = Sqe::new(crate::sqe::admin::FABRICS, cid, 0);
        s.0[4] = if set {
            fctype::PROPERTY_SET
        } else {
            fctype::PROPERTY_GET
        };
        s.set_sgl(Sgl::transport(0));
        s.0[40] = self.size8 as u8;
        put32(&mut s.0, 44, self.offset);
        put64(&mut s.0, 48, self.value);
        s
    }
}

/// Controller Capabilities, built from the fields a target chooses.
pub fn cap(mqes: u16, timeout_500ms: u8) -> u64 {
    let mut v = mqes as u64; // MQES, 0-based
    v |= 1 << 16; // CQR: contiguous queues required (fabrics)
    v |= (timeout_500ms as u64) << 24; // TO
    v |= 1 << 37; // CSS: NVM command set only (keeps the Linux host off multi-CSS rules)
                  // MPSMIN = MPSMAX = 0 (4 KiB); DSTRD = 0; no NSSR, no CRMS.
    v
}

/// NVMe version 1.4.0: Linux then needs CNS 0/1/2/3, which we implement.
pub const VS_1_4: u32 = 0x0001_0400;

pub mod cc {
    pub const EN: u32 = 1;
    pub const SHN_SHIFT: u32 = 14;
    pub const SHN_MASK: u32 = 0x3 << 14;
}
pub mod csts {
    pub const RDY: u32 = 1;
    pub const CFS: u32 = 1 << 1;
    pub const SHST_COMPLETE: u32 = 0x2 << 2;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_roundtrip_and_nqn_checks() {
        let c = ConnectCmd {
            recfmt: 0,
            qid: 3,
            sqsize: 127,
            cattr: 4,
            kato_ms: 5000,
        };
        let s = c.to_sqe(7);
        assert_eq!(ConnectCmd::decode(&s), c);
        assert!(c.disable_sqflow());
        assert_eq!(s.fctype(), fctype::CONNECT);
        let d = ConnectData {
            hostid: [1; 16],
            cntlid: 0xFFFF,
            subnqn: "nqn.a".into(),
            hostnqn: "nqn.b".into(),
        };
        let mut b = [0u8; 1024];
        d.encode(&mut b);
        assert_eq!(ConnectData::decode(&b).unwrap(), d);
        b[512] = 0; // empty host NQN: decoded, policy decides
        assert_eq!(ConnectData::decode(&b).unwrap().hostnqn, "");
        // Control characters in an NQN (terminal and log injection).
        for bad in [
            "nqn.x\u{1b}[31mred",
            "nqn.x\nline",
            "nqn.x\u{9b}31m",
            "nqn.x\u{7f}",
        ] {
            let d = ConnectData {
                hostid: [1; 16],
                cntlid: 0xFFFF,
                subnqn: "nqn.a".into(),
                hostnqn: bad.into(),
            };
            d.encode(&mut b);
            assert_eq!(
                ConnectData::decode(&b).map(|d| d.hostnqn),
                Err(BadConnectField(ipo::DATA_HOSTNQN)),
                "{bad:?}"
            );
        }
        b[256] = 0; // empty subsystem NQN: nothing to connect to
        assert_eq!(
            ConnectData::decode(&b).unwrap_err(),
            BadConnectField(ipo::DATA_SUBNQN)
        );
    }

    #[test]
    fn cap_has_mpsmin_zero_and_nvm_css() {
        let c = cap(127, 15);
        assert_eq!(c & 0xffff, 127);
        assert_eq!((c >> 48) & 0xf, 0);
        assert_eq!((c >> 37) & 0xff, 1);
        assert_eq!((c >> 24) & 0xff, 15);
    }
}
