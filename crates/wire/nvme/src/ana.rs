//! Asymmetric Namespace Access (NVM Express Base Specification 2.0, §8.1.1
//! "Asymmetric Namespace Access Reporting"; the ANA log page, LID 0Ch).
//!
//! The log is a 16-byte header (change count, number of group descriptors)
//! followed by one 32-byte descriptor per ANA group, each followed by its
//! NSIDs (4 bytes each) unless the host asked for groups only (RGO, Get Log
//! Page CDW10 bit 8, i.e. LSP bit 0). The decoder checks every length
//! against the bytes it was given and never panics.

use crate::{le16, le32, le64, put16, put32, put64};

/// ANA log page header length.
pub const HDR_LEN: usize = 16;
/// ANA group descriptor length, without its NSID list.
pub const DESC_LEN: usize = 32;
/// LSP bit 0 of Get Log Page for LID 0Ch: Return Groups Only.
pub const LSP_RGO: u8 = 0x01;

/// Identify Controller fields for ANA (NVMe Base 2.0, Identify Controller data structure; the
/// offsets are those of Linux's `struct nvme_id_ctrl` and nvme-cli, which
/// the Linux VM test reads back: ANATT 342, ANACAP 343, ANAGRPMAX 347:344,
/// NANAGRPID 351:348, PELS 355:352).
pub mod id {
    /// CMIC bit 3: the controller reports ANA.
    pub const CMIC_ANA: u8 = 1 << 3;
    /// Byte offset of ANATT (ANA Transition Time, seconds).
    pub const ANATT: usize = 342;
    /// Byte offset of ANACAP (ANA Capabilities).
    pub const ANACAP: usize = 343;
    /// Byte offset of ANAGRPMAX (largest ANA group identifier), 4 bytes.
    pub const ANAGRPMAX: usize = 344;
    /// Byte offset of NANAGRPID (number of ANA group identifiers), 4 bytes.
    pub const NANAGRPID: usize = 348;
    /// Byte offset of MNAN (maximum number of allowed namespaces), 4 bytes:
    /// Linux refuses an ANA controller whose MNAN is 0 or above NN.
    pub const MNAN: usize = 540;
    /// Identify Namespace: byte offset of ANAGRPID, 4 bytes.
    pub const NS_ANAGRPID: usize = 92;
    /// ANACAP bits 0-4: the states a controller may report.
    pub const ANACAP_ALL_STATES: u8 = 0x1F;
    /// ANACAP bit 6: a namespace's ANAGRPID does not change while attached.
    pub const ANACAP_GRPID_STATIC: u8 = 1 << 6;
    /// OAES bit 11 and Asynchronous Event Configuration bit 11: ANA Change Notices.
    pub const AEN_ANA_CHANGE: u32 = 1 << 11;
}

/// Asynchronous event completion (DW0) for an ANA change: type Notice (2h),
/// information 03h "Asymmetric Namespace Access Change", log page 0Ch.
pub const AEN_ANA_CHANGE_DW0: u32 = 0x2 | 0x03 << 8 | (crate::log::lid::ANA as u32) << 16;

/// The ANA state of a group as seen through one controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AnaState {
    Optimized = 0x01,
    NonOptimized = 0x02,
    Inaccessible = 0x03,
    PersistentLoss = 0x04,
    Change = 0x0F,
}

impl AnaState {
    pub const ALL: [AnaState; 5] = [
        AnaState::Optimized,
        AnaState::NonOptimized,
        AnaState::Inaccessible,
        AnaState::PersistentLoss,
        AnaState::Change,
    ];

    /// The state for a descriptor's state byte (bits 3:0); None if reserved.
    pub fn from_u8(v: u8) -> Option<AnaState> {
        AnaState::ALL.into_iter().find(|s| *s as u8 == v & 0x0F)
    }

    /// The name used in configuration files and `trellis ctl`.
    pub fn name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non-optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent-loss",
            AnaState::Change => "change",
        }
    }

    pub fn from_name(s: &str) -> Option<AnaState> {
        AnaState::ALL.into_iter().find(|a| a.name() == s)
    }

    /// What an I/O command gets on a namespace in this state (NVMe Base 2.0
    /// §8.1.1): None where I/O is served. DNR stays clear on all three, as
    /// Linux nvmet's `nvmet_check_ana_state` returns them: another path may
    /// serve the command.
    pub fn io_status(self) -> Option<crate::Status> {
        use crate::status::path;
        match self {
            AnaState::Optimized | AnaState::NonOptimized => None,
            AnaState::Inaccessible => Some(path::ANA_INACCESSIBLE),
            AnaState::PersistentLoss => Some(path::ANA_PERSISTENT_LOSS),
            AnaState::Change => Some(path::ANA_TRANSITION),
        }
    }
}

/// One ANA group descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnaGroup {
    pub grpid: u32,
    pub chgcnt: u64,
    pub state: AnaState,
    /// Empty when the log was read with RGO set.
    pub nsids: Vec<u32>,
}

/// A decoded ANA log page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnaLog {
    pub chgcnt: u64,
    pub groups: Vec<AnaGroup>,
}

/// Why an ANA log did not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnaLogError {
    #[error("ANA log shorter than its {HDR_LEN}-byte header ({0} bytes)")]
    ShortHeader(usize),
    #[error("ANA group descriptor {index} does not fit in the {len} bytes read")]
    ShortDescriptor { index: usize, len: usize },
    #[error("ANA group descriptor {index} has reserved state {state:#04x}")]
    BadState { index: usize, state: u8 },
    #[error("ANA group descriptor {index} has ANAGRPID 0 (reserved)")]
    ZeroGroup { index: usize },
}

impl AnaLog {
    /// Bytes the encoded log takes (`rgo`: without NSID lists).
    pub fn encoded_len(&self, rgo: bool) -> usize {
        let nsids: usize = if rgo {
            0
        } else {
            self.groups.iter().map(|g| g.nsids.len()).sum()
        };
        HDR_LEN + self.groups.len() * DESC_LEN + nsids * 4
    }

    /// Appends the log to `out` (cleared first). With `rgo`, NNSIDs is 0 and
    /// no NSID lists follow (NVMe Base 2.0, ANA log page).
    pub fn encode(&self, rgo: bool, out: &mut Vec<u8>) {
        out.clear();
        out.resize(self.encoded_len(rgo), 0);
        put64(out, 0, self.chgcnt);
        // NUMANAGRPD saturates; groups are bounded far below that by config.
        put16(out, 8, u16::try_from(self.groups.len()).unwrap_or(u16::MAX));
        let mut off = HDR_LEN;
        for g in &self.groups {
            let n = if rgo { 0 } else { g.nsids.len() };
            let mut d = [0u8; DESC_LEN];
            d[..4].copy_from_slice(&g.grpid.to_le_bytes());
            // NNSIDS: a Vec of u32 cannot hold more than u32::MAX NSIDs anyway.
            let nn = u32::try_from(n).unwrap_or(u32::MAX);
            d[4..8].copy_from_slice(&nn.to_le_bytes());
            d[8..16].copy_from_slice(&g.chgcnt.to_le_bytes());
            d[16] = g.state as u8;
            crate::put_bytes(out, off, d);
            off += DESC_LEN;
            for &id in g.nsids.iter().take(n) {
                put32(out, off, id);
                off += 4;
            }
        }
    }

    /// Decodes a log read into `b` (which may hold trailing zeroes). NSID
    /// lists longer than the bytes present are an error, not a panic.
    pub fn decode(b: &[u8]) -> Result<AnaLog, AnaLogError> {
        if b.len() < HDR_LEN {
            return Err(AnaLogError::ShortHeader(b.len()));
        }
        let chgcnt = le64(b, 0);
        let ngrps = le16(b, 8) as usize;
        let mut groups = Vec::with_capacity(ngrps.min(b.len() / DESC_LEN));
        let mut off = HDR_LEN;
        for index in 0..ngrps {
            let short = AnaLogError::ShortDescriptor {
                index,
                len: b.len(),
            };
            let d: &[u8; DESC_LEN] = b
                .get(off..)
                .and_then(<[u8]>::first_chunk::<DESC_LEN>)
                .ok_or(short.clone())?;
            let n = le32(d, 4) as usize;
            let list_end = n
                .checked_mul(4)
                .and_then(|l| (off + DESC_LEN).checked_add(l))
                .ok_or(short.clone())?;
            let list = b.get(off + DESC_LEN..list_end).ok_or(short)?;
            let state = AnaState::from_u8(d[16]).ok_or(AnaLogError::BadState {
                index,
                state: d[16],
            })?;
            let grpid = le32(d, 0);
            if grpid == 0 {
                return Err(AnaLogError::ZeroGroup { index });
            }
            groups.push(AnaGroup {
                grpid,
                chgcnt: le64(d, 8),
                state,
                nsids: list.chunks_exact(4).map(|c| le32(c, 0)).collect(),
            });
            off = list_end;
        }
        Ok(AnaLog { chgcnt, groups })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AnaLog {
        AnaLog {
            chgcnt: 9,
            groups: vec![
                AnaGroup {
                    grpid: 1,
                    chgcnt: 9,
                    state: AnaState::Optimized,
                    nsids: vec![1, 3],
                },
                AnaGroup {
                    grpid: 7,
                    chgcnt: 9,
                    state: AnaState::Inaccessible,
                    nsids: vec![2],
                },
            ],
        }
    }

    #[test]
    fn log_roundtrips_with_and_without_nsid_lists() {
        let mut b = Vec::new();
        sample().encode(false, &mut b);
        assert_eq!(b.len(), 16 + 2 * 32 + 3 * 4);
        assert_eq!((le32(&b, 16 + 4), b[16 + 16]), (2, 0x01));
        assert_eq!(AnaLog::decode(&b).unwrap(), sample());
        sample().encode(true, &mut b);
        assert_eq!(b.len(), 16 + 2 * 32);
        let d = AnaLog::decode(&b).unwrap();
        assert!(d.groups.iter().all(|g| g.nsids.is_empty()));
        assert_eq!(d.groups[1].state, AnaState::Inaccessible);
        // Trailing zeroes (a host reads a larger buffer) are ignored.
        b.resize(4096, 0);
        assert_eq!(AnaLog::decode(&b).unwrap().groups.len(), 2);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let mut b = Vec::new();
        sample().encode(false, &mut b);
        for n in 0..b.len() {
            assert!(AnaLog::decode(&b[..n]).is_err(), "{n} bytes");
        }
        // NNSIDs near u32::MAX must not overflow the bounds arithmetic.
        put32(&mut b, 16 + 4, u32::MAX);
        assert!(matches!(
            AnaLog::decode(&b),
            Err(AnaLogError::ShortDescriptor { index: 0, .. })
        ));
    }

    #[test]
    fn reserved_state_and_group_zero_are_refused() {
        let mut b = Vec::new();
        sample().encode(true, &mut b);
        b[16 + 16] = 0x05;
        assert!(matches!(
            AnaLog::decode(&b),
            Err(AnaLogError::BadState { index: 0, .. })
        ));
        sample().encode(true, &mut b);
        put32(&mut b, 16 + 32, 0);
        assert_eq!(AnaLog::decode(&b), Err(AnaLogError::ZeroGroup { index: 1 }));
    }

    #[test]
    fn states_map_to_names_and_path_statuses() {
        for s in AnaState::ALL {
            assert_eq!(AnaState::from_name(s.name()), Some(s));
            assert_eq!(AnaState::from_u8(s as u8), Some(s));
        }
        let st = AnaState::Inaccessible.io_status().unwrap();
        assert_eq!((st.sct(), st.sc(), st.is_dnr()), (3, 0x02, false));
        assert_eq!(AnaState::Change.io_status().unwrap().sc(), 0x03);
        assert_eq!(AnaState::PersistentLoss.io_status().unwrap().sc(), 0x01);
        assert_eq!(AnaState::NonOptimized.io_status(), None);
        assert_eq!(AEN_ANA_CHANGE_DW0, 0x000C_0302);
    }
}
