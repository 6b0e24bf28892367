//! Raw NVMe/TCP PDUs over blocking sockets. Encoding goes through
//! `trellis-nvme`; what is appended after a header (data, digests) is under
//! the caller's control, so tests can forge exactly the bytes they need.

use std::io::{self, Read};

use trellis_nvme::pdu::{self, CommonHeader, DataHdr, Digests, PduType};
use trellis_nvme::{crc, Sqe};

/// One received PDU: its common header and all its bytes.
pub struct Pdu {
    pub ch: CommonHeader,
    pub bytes: Vec<u8>,
}

/// Reads one whole PDU whose PLEN is at most `max_plen`. Fails on EOF, on a
/// short PDU, and on a PLEN below the common header or above `max_plen`.
pub fn read_pdu(s: &mut impl Read, max_plen: usize) -> io::Result<Pdu> {
    let mut h = [0u8; pdu::CH_LEN];
    s.read_exact(&mut h)?;
    let ch = CommonHeader::decode(&h).ok_or_else(|| invalid("common header"))?;
    let plen = ch.plen as usize;
    if !(pdu::CH_LEN..=max_plen).contains(&plen) {
        return Err(invalid("PLEN out of range"));
    }
    let mut bytes = vec![0u8; plen];
    bytes[..pdu::CH_LEN].copy_from_slice(&h);
    s.read_exact(&mut bytes[pdu::CH_LEN..])?;
    Ok(Pdu { ch, bytes })
}

/// A CapsuleCmd with `icd` as in-capsule data (and its digest if negotiated).
pub fn capsule(sqe: &Sqe, icd: &[u8], dg: Digests) -> Vec<u8> {
    let mut b = vec![0u8; pdu::MAX_HDR_LEN];
    let n = pdu::encode_capsule_cmd(&mut b, sqe, icd.len(), dg);
    b.truncate(n);
    b.extend_from_slice(icd);
    if dg.data && !icd.is_empty() {
        b.extend_from_slice(&crc::digest(icd).to_le_bytes());
    }
    b
}

/// A C2HData or H2CData PDU carrying `data`. The data digest (if negotiated)
/// is XORed with `digest_xor`: 0 for a correct one, anything else to forge.
pub fn data_pdu(
    t: PduType,
    h: &DataHdr,
    flags: u8,
    dg: Digests,
    data: &[u8],
    digest_xor: u32,
) -> Vec<u8> {
    let mut b = vec![0u8; pdu::SMALL_HLEN + pdu::DIGEST_LEN];
    let n = pdu::encode_data_hdr(&mut b, t, h, flags, dg);
    b.truncate(n);
    b.extend_from_slice(data);
    if dg.data {
        b.extend_from_slice(&(crc::digest(data) ^ digest_xor).to_le_bytes());
    }
    b
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}
