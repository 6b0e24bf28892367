//! NVMe in-band authentication wire formats (NVMe Base 2.0 §8.13, DH-HMAC-CHAP):
//! the Fabrics Authentication Send (05h) and Receive (06h) command fields and
//! the messages they carry (AUTH_Negotiate, DH-HMAC-CHAP_Challenge, _Reply,
//! _Success1, _Success2, AUTH_Failure1/2). Field offsets as in Linux's
//! `include/linux/nvme.h`; every length is checked before a field is read.

use crate::{le16, le32, put32, Sgl, Sqe};

/// Security protocol of NVMe in-band authentication (SECP).
pub const SECP: u8 = 0xE9;
/// SPSP0 and SPSP1 of the DH-HMAC-CHAP protocol.
pub const SPSP0: u8 = 0x01;
pub const SPSP1: u8 = 0x01;
/// The largest message either side accepts: an ffdhe8192 Reply is
/// 16 + 2 x 64 + 1024 bytes; Linux reads replies into 4 KiB.
pub const MAX_MSG_LEN: usize = 4096;

/// AUTH_TYPE.
pub mod auth_type {
    pub const COMMON: u8 = 0x00;
    pub const DHCHAP: u8 = 0x01;
}

/// AUTH_ID.
pub mod auth_id {
    pub const NEGOTIATE: u8 = 0x00;
    pub const CHALLENGE: u8 = 0x01;
    pub const REPLY: u8 = 0x02;
    pub const SUCCESS1: u8 = 0x03;
    pub const SUCCESS2: u8 = 0x04;
    pub const FAILURE2: u8 = 0xF0;
    pub const FAILURE1: u8 = 0xF1;
}

/// AUTH_Failure reason code (RC) and explanations (RCE).
pub mod failure {
    /// RC: authentication failure.
    pub const REASON_FAILED: u8 = 0x01;
    pub const FAILED: u8 = 0x01;
    pub const NOT_USABLE: u8 = 0x02;
    pub const CONCAT_MISMATCH: u8 = 0x03;
    pub const HASH_UNUSABLE: u8 = 0x04;
    pub const DHGROUP_UNUSABLE: u8 = 0x05;
    pub const INCORRECT_PAYLOAD: u8 = 0x06;
    pub const INCORRECT_MESSAGE: u8 = 0x07;
}

/// Connect response DW0 bit ATR (authentication required), as Linux's
/// `NVME_CONNECT_AUTHREQ_ATR`; bit 18 (ASCR, secure channel) is never set.
pub const CONNECT_AUTHREQ_ATR: u32 = 1 << 17;

/// The DH-HMAC-CHAP authentication protocol identifier in a descriptor.
pub const AUTHID_DHCHAP: u8 = 0x01;
/// Protocol descriptor size and its ID list halves (hash IDs in the first
/// 30 bytes, DH group IDs in the last 30).
pub const DESCRIPTOR_LEN: usize = 64;
pub const MAX_IDS: usize = 30;
/// Size of every header that precedes variable data.
pub const HEADER_LEN: usize = 16;
pub const NEGOTIATE_HEADER_LEN: usize = 8;
pub const FAILURE_LEN: usize = 8;
/// AUTH_Negotiate with its one descriptor.
const NEGOTIATE_LEN: usize = NEGOTIATE_HEADER_LEN + DESCRIPTOR_LEN;

/// Authentication Send/Receive SQE fields (CDW10: SPSP0 byte 1, SPSP1 byte 2,
/// SECP byte 3; CDW11: TL for Send, AL for Receive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthCmd {
    pub secp: u8,
    pub spsp0: u8,
    pub spsp1: u8,
    /// TL (Send) or AL (Receive) in bytes.
    pub len: u32,
}

impl AuthCmd {
    pub fn decode(s: &Sqe) -> AuthCmd {
        AuthCmd {
            spsp0: s.0[41],
            spsp1: s.0[42],
            secp: s.0[43],
            len: le32(&s.0, 44),
        }
    }
    /// Whether SECP/SPSP name DH-HMAC-CHAP.
    pub fn is_dhchap(&self) -> bool {
        self.secp == SECP && self.spsp0 == SPSP0 && self.spsp1 == SPSP1
    }
    /// A DH-HMAC-CHAP Send (`send`) or Receive SQE moving `len` bytes.
    pub fn dhchap_sqe(send: bool, cid: u16, len: u32) -> Sqe {
        let mut s = Sqe::new(crate::sqe::admin::FABRICS, cid, 0);
        s.0[4] = if send {
            crate::fabrics::fctype::AUTH_SEND
        } else {
            crate::fabrics::fctype::AUTH_RECV
        };
        s.set_sgl(if send {
            Sgl::in_capsule(len)
        } else {
            Sgl::transport(len)
        });
        s.0[41] = SPSP0;
        s.0[42] = SPSP1;
        s.0[43] = SECP;
        put32(&mut s.0, 44, len);
        s
    }
}

/// Why a message could not be read: the AUTH_Failure explanation to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadMessage(pub u8);

const PAYLOAD: BadMessage = BadMessage(failure::INCORRECT_PAYLOAD);
const MESSAGE: BadMessage = BadMessage(failure::INCORRECT_MESSAGE);

/// AUTH_Negotiate, reduced to its one DH-HMAC-CHAP descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiate {
    pub t_id: u16,
    /// Secure channel concatenation (SC_C); 0: none.
    pub sc_c: u8,
    pub hash_ids: Vec<u8>,
    pub dh_ids: Vec<u8>,
}

/// DH-HMAC-CHAP_Challenge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    pub t_id: u16,
    pub hash_id: u8,
    pub dh_id: u8,
    pub seqnum: u32,
    /// C1, HL bytes.
    pub c1: Vec<u8>,
    /// The controller's DH public value (empty for the NULL group).
    pub dhv: Vec<u8>,
}

/// DH-HMAC-CHAP_Reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub t_id: u16,
    /// R1, HL bytes.
    pub response: Vec<u8>,
    /// C2 when the host asks the controller to authenticate too (CVALID).
    pub c2: Option<Vec<u8>>,
    /// S2; 0 with no controller authentication.
    pub seqnum: u32,
    pub dhv: Vec<u8>,
}

/// DH-HMAC-CHAP_Success1 (R2 present for bidirectional authentication).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Success1 {
    pub t_id: u16,
    pub hl: u8,
    pub response: Option<Vec<u8>>,
}

/// AUTH_Failure1 (controller to host) or AUTH_Failure2 (host to controller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    pub t_id: u16,
    pub reason: u8,
    pub explanation: u8,
}

/// Any message, as decoded from Authentication Send or Receive data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Negotiate(Negotiate),
    Challenge(Challenge),
    Reply(Reply),
    Success1(Success1),
    Success2 { t_id: u16 },
    Failure1(Failure),
    Failure2(Failure),
}

impl Message {
    /// Reads one message. Trailing bytes past the message (a host may pad
    /// to its buffer size, as Linux's target pads to AL) are ignored.
    pub fn decode(b: &[u8]) -> Result<Message, BadMessage> {
        if b.len() > MAX_MSG_LEN {
            return Err(PAYLOAD);
        }
        let h: &[u8; FAILURE_LEN] = b.first_chunk().ok_or(PAYLOAD)?;
        let t_id = le16(h, 4);
        match (h[0], h[1]) {
            (auth_type::COMMON, auth_id::NEGOTIATE) => decode_negotiate(b).map(Message::Negotiate),
            (auth_type::COMMON, id @ (auth_id::FAILURE1 | auth_id::FAILURE2)) => {
                let f = Failure {
                    t_id,
                    reason: h[6],
                    explanation: h[7],
                };
                Ok(if id == auth_id::FAILURE1 {
                    Message::Failure1(f)
                } else {
                    Message::Failure2(f)
                })
            }
            (auth_type::DHCHAP, auth_id::CHALLENGE) => decode_challenge(b).map(Message::Challenge),
            (auth_type::DHCHAP, auth_id::REPLY) => decode_reply(b).map(Message::Reply),
            (auth_type::DHCHAP, auth_id::SUCCESS1) => decode_success1(b).map(Message::Success1),
            (auth_type::DHCHAP, auth_id::SUCCESS2) if b.len() >= HEADER_LEN => {
                Ok(Message::Success2 { t_id })
            }
            _ => Err(MESSAGE),
        }
    }

    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Message::Negotiate(n) => encode_negotiate(n),
            Message::Challenge(c) => {
                let mut h = header(auth_type::DHCHAP, auth_id::CHALLENGE, c.t_id);
                h[6] = len_u8(c.c1.len());
                h[8] = c.hash_id;
                h[9] = c.dh_id;
                h[10..12].copy_from_slice(&len_u16(c.dhv.len()).to_le_bytes());
                h[12..16].copy_from_slice(&c.seqnum.to_le_bytes());
                let mut b = h.to_vec();
                b.extend_from_slice(&c.c1);
                b.extend_from_slice(&c.dhv);
                b
            }
            Message::Reply(r) => encode_reply(r),
            Message::Success1(s) => {
                let mut h = header(auth_type::DHCHAP, auth_id::SUCCESS1, s.t_id);
                h[6] = s.hl;
                h[8] = u8::from(s.response.is_some());
                let mut b = h.to_vec();
                if let Some(r) = &s.response {
                    b.extend_from_slice(r);
                }
                b
            }
            Message::Success2 { t_id } => {
                header(auth_type::DHCHAP, auth_id::SUCCESS2, *t_id).to_vec()
            }
            Message::Failure1(f) | Message::Failure2(f) => {
                let id = if matches!(self, Message::Failure1(_)) {
                    auth_id::FAILURE1
                } else {
                    auth_id::FAILURE2
                };
                let h: [u8; HEADER_LEN] = header(auth_type::COMMON, id, f.t_id);
                let mut b = [0u8; FAILURE_LEN];
                b[..6].copy_from_slice(&h[..6]);
                b[6] = f.reason;
                b[7] = f.explanation;
                b.to_vec()
            }
        }
    }
}

/// The 16-byte DH-HMAC-CHAP header with its common fields set (AUTH_Negotiate
/// and AUTH_Failure use its first 8 bytes).
fn header(ty: u8, id: u8, t_id: u16) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[0] = ty;
    b[1] = id;
    b[4..6].copy_from_slice(&t_id.to_le_bytes());
    b
}

/// HL and the hash/group counts are one byte: our values are hash lengths
/// (at most 64) and at most MAX_IDS (30) identifiers, so this never
/// saturates in practice; it does rather than wrap if a caller passes more.
fn len_u8(n: usize) -> u8 {
    debug_assert!(n <= usize::from(u8::MAX));
    u8::try_from(n).unwrap_or(u8::MAX)
}

/// DHVLEN is two bytes: the largest public value (ffdhe8192) is 1024.
fn len_u16(n: usize) -> u16 {
    debug_assert!(n <= usize::from(u16::MAX));
    u16::try_from(n).unwrap_or(u16::MAX)
}

/// `len` bytes of `b` at `start`, or PAYLOAD if they are not all there.
fn field(b: &[u8], start: usize, len: usize) -> Result<Vec<u8>, BadMessage> {
    let end = start.checked_add(len).ok_or(PAYLOAD)?;
    Ok(b.get(start..end).ok_or(PAYLOAD)?.to_vec())
}

fn decode_negotiate(b: &[u8]) -> Result<Negotiate, BadMessage> {
    let b: &[u8; NEGOTIATE_LEN] = b.first_chunk().ok_or(PAYLOAD)?;
    let (h, d) = b.split_at(NEGOTIATE_HEADER_LEN);
    // Only DH-HMAC-CHAP exists: one descriptor (NAPD = 1), as Linux requires.
    if b[7] != 1 {
        return Err(BadMessage(failure::HASH_UNUSABLE));
    }
    let (halen, dhlen) = (usize::from(b[10]), usize::from(b[11]));
    if b[8] != AUTHID_DHCHAP || halen > MAX_IDS || dhlen > MAX_IDS {
        return Err(PAYLOAD);
    }
    Ok(Negotiate {
        t_id: le16(h, 4),
        sc_c: b[6],
        hash_ids: field(d, 4, halen)?,
        dh_ids: field(d, 4 + MAX_IDS, dhlen)?,
    })
}

fn encode_negotiate(n: &Negotiate) -> Vec<u8> {
    let h = header(auth_type::COMMON, auth_id::NEGOTIATE, n.t_id);
    let mut b = [0u8; NEGOTIATE_LEN];
    b[..6].copy_from_slice(&h[..6]);
    b[6] = n.sc_c;
    b[7] = 1;
    let (_, d) = b.split_at_mut(NEGOTIATE_HEADER_LEN);
    let (desc, ids) = d.split_at_mut(4);
    let (hash_ids, dh_ids) = ids.split_at_mut(MAX_IDS);
    // At most MAX_IDS (30) of each fit; the counts say how many were kept.
    let h = crate::copy_prefix(hash_ids, &n.hash_ids);
    let g = crate::copy_prefix(dh_ids, &n.dh_ids);
    if let Some(desc) = desc.first_chunk_mut::<4>() {
        *desc = [AUTHID_DHCHAP, 0, len_u8(h), len_u8(g)];
    }
    b.to_vec()
}

fn decode_challenge(b: &[u8]) -> Result<Challenge, BadMessage> {
    let h: &[u8; HEADER_LEN] = b.first_chunk().ok_or(PAYLOAD)?;
    let hl = usize::from(h[6]);
    let dhvlen = usize::from(le16(h, 10));
    // Both lengths are checked before either is copied.
    if HEADER_LEN + hl + dhvlen > b.len() {
        return Err(PAYLOAD);
    }
    Ok(Challenge {
        t_id: le16(h, 4),
        hash_id: h[8],
        dh_id: h[9],
        seqnum: le32(h, 12),
        c1: field(b, HEADER_LEN, hl)?,
        dhv: field(b, HEADER_LEN + hl, dhvlen)?,
    })
}

fn decode_reply(b: &[u8]) -> Result<Reply, BadMessage> {
    let h: &[u8; HEADER_LEN] = b.first_chunk().ok_or(PAYLOAD)?;
    let hl = usize::from(h[6]);
    let dhvlen = usize::from(le16(h, 10));
    // R1 and a C2 slot are always there (Linux sends both, CVALID or not).
    if HEADER_LEN + 2 * hl + dhvlen > b.len() {
        return Err(PAYLOAD);
    }
    let r = HEADER_LEN;
    let c2 = field(b, r + hl, hl)?;
    Ok(Reply {
        t_id: le16(h, 4),
        response: field(b, r, hl)?,
        c2: (h[8] & 1 != 0).then_some(c2),
        seqnum: le32(h, 12),
        dhv: field(b, r + 2 * hl, dhvlen)?,
    })
}

fn encode_reply(r: &Reply) -> Vec<u8> {
    let hl = r.response.len();
    let mut h = header(auth_type::DHCHAP, auth_id::REPLY, r.t_id);
    h[6] = len_u8(hl);
    h[8] = u8::from(r.c2.is_some());
    h[10..12].copy_from_slice(&len_u16(r.dhv.len()).to_le_bytes());
    h[12..16].copy_from_slice(&r.seqnum.to_le_bytes());
    let mut b = h.to_vec();
    b.extend_from_slice(&r.response);
    match &r.c2 {
        Some(c) => b.extend_from_slice(c),
        None => b.resize(b.len() + hl, 0),
    }
    b.extend_from_slice(&r.dhv);
    b
}

fn decode_success1(b: &[u8]) -> Result<Success1, BadMessage> {
    let h: &[u8; HEADER_LEN] = b.first_chunk().ok_or(PAYLOAD)?;
    let hl = h[6];
    let response = if h[8] & 1 != 0 {
        Some(field(b, HEADER_LEN, usize::from(hl))?)
    } else {
        None
    };
    Ok(Success1 {
        t_id: le16(h, 4),
        hl,
        response,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_sqe_fields() {
        let s = AuthCmd::dhchap_sqe(true, 7, 72);
        assert_eq!(s.opcode(), 0x7F);
        assert_eq!(s.0[4], 0x05);
        // CDW10 = SECP << 24 | SPSP1 << 16 | SPSP0 << 8; CDW11 = TL.
        assert_eq!(s.cdw10(), 0xE901_0100);
        assert_eq!(s.cdw11(), 72);
        let c = AuthCmd::decode(&s);
        assert!(c.is_dhchap());
        assert_eq!(c.len, 72);
        let r = AuthCmd::dhchap_sqe(false, 8, 4096);
        assert_eq!(r.0[4], 0x06);
        assert_eq!(r.cdw11(), 4096);
    }

    /// The negotiate message Linux's host sends (all hashes, all groups).
    #[test]
    fn negotiate_bytes() {
        let n = Negotiate {
            t_id: 0x0102,
            sc_c: 0,
            hash_ids: vec![1, 2, 3],
            dh_ids: vec![0, 1, 2, 3, 4, 5],
        };
        let b = Message::Negotiate(n.clone()).encode();
        assert_eq!(b.len(), 72);
        assert_eq!(&b[..8], &[0x00, 0x00, 0, 0, 0x02, 0x01, 0x00, 0x01]);
        assert_eq!(&b[8..15], &[0x01, 0x00, 3, 6, 1, 2, 3]);
        assert_eq!(&b[42..48], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(Message::decode(&b), Ok(Message::Negotiate(n)));
        // Too short for its descriptor; two descriptors; too many IDs.
        assert_eq!(Message::decode(&b[..71]), Err(PAYLOAD));
        let mut two = b.clone();
        two[7] = 2;
        assert_eq!(
            Message::decode(&two),
            Err(BadMessage(failure::HASH_UNUSABLE))
        );
        let mut many = b.clone();
        many[10] = 31;
        assert_eq!(Message::decode(&many), Err(PAYLOAD));
    }

    #[test]
    fn challenge_bytes() {
        let c = Challenge {
            t_id: 3,
            hash_id: 1,
            dh_id: 0,
            seqnum: 0x1122_3344,
            c1: vec![0xAA; 32],
            dhv: vec![],
        };
        let b = Message::Challenge(c.clone()).encode();
        assert_eq!(b.len(), 48);
        assert_eq!(
            &b[..16],
            &[1, 1, 0, 0, 3, 0, 32, 0, 1, 0, 0, 0, 0x44, 0x33, 0x22, 0x11]
        );
        assert_eq!(Message::decode(&b), Ok(Message::Challenge(c)));
        assert_eq!(Message::decode(&b[..47]), Err(PAYLOAD));
    }

    #[test]
    fn reply_bytes_and_lengths() {
        let r = Reply {
            t_id: 3,
            response: vec![0x55; 48],
            c2: Some(vec![0x66; 48]),
            seqnum: 9,
            dhv: vec![7; 256],
        };
        let b = Message::Reply(r.clone()).encode();
        assert_eq!(b.len(), 16 + 96 + 256);
        assert_eq!(&b[..16], &[1, 2, 0, 0, 3, 0, 48, 0, 1, 0, 0, 1, 9, 0, 0, 0]);
        assert_eq!(Message::decode(&b), Ok(Message::Reply(r.clone())));
        assert_eq!(Message::decode(&b[..b.len() - 1]), Err(PAYLOAD));
        // Without CVALID the C2 slot is still there, zeroed, and ignored.
        let one = Reply { c2: None, ..r };
        let b = Message::Reply(one.clone()).encode();
        assert_eq!(b.len(), 16 + 96 + 256);
        assert_eq!(Message::decode(&b), Ok(Message::Reply(one)));
    }

    #[test]
    fn success_and_failure_bytes() {
        let s = Success1 {
            t_id: 1,
            hl: 32,
            response: Some(vec![1; 32]),
        };
        let b = Message::Success1(s.clone()).encode();
        assert_eq!(&b[..16], &[1, 3, 0, 0, 1, 0, 32, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Message::decode(&b), Ok(Message::Success1(s)));
        assert_eq!(Message::decode(&b[..40]), Err(PAYLOAD));
        let b = Message::Success2 { t_id: 1 }.encode();
        assert_eq!(b, [1, 4, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let f = Failure {
            t_id: 2,
            reason: failure::REASON_FAILED,
            explanation: failure::FAILED,
        };
        let b = Message::Failure1(f).encode();
        assert_eq!(b, [0, 0xF1, 0, 0, 2, 0, 1, 1]);
        assert_eq!(Message::decode(&b), Ok(Message::Failure1(f)));
        let b = Message::Failure2(f).encode();
        assert_eq!(Message::decode(&b), Ok(Message::Failure2(f)));
    }

    #[test]
    fn unknown_and_short_messages_are_refused() {
        assert_eq!(Message::decode(&[1, 9, 0, 0, 0, 0, 0, 0]), Err(MESSAGE));
        assert_eq!(Message::decode(&[0; 7]), Err(PAYLOAD));
        assert_eq!(Message::decode(&vec![0; MAX_MSG_LEN + 1]), Err(PAYLOAD));
        // A Success2 shorter than its 16 bytes.
        assert_eq!(Message::decode(&[1, 4, 0, 0, 0, 0, 0, 0]), Err(MESSAGE));
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics() {
        let mut x = 0x1234_5678u32;
        for len in 0..600 {
            let b: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    (x % 7) as u8
                })
                .collect();
            let _ = Message::decode(&b);
        }
    }
}
