//! DH-HMAC-CHAP computations (NVMe Base 2.0 §8.13.5), shared by the target
//! and the host library: the `DHHC-1` secret format nvme-cli's
//! `gen-dhchap-key` writes, the key transform, the responses and the
//! FFDHE exchange. Deterministic: randomness comes in as bytes. Behaviour
//! (not code) follows Linux's drivers/nvme/common/auth.c and target/auth.c.
//!
//! Primitives come from well-kept crates: RustCrypto's `hmac`/`sha2`,
//! `subtle` for constant-time comparison, and `num-bigint-dig` (the big-number
//! crate under RustCrypto's `rsa`) for the modular exponentiation. Its
//! exponentiation is not constant-time; the exponent is an ephemeral,
//! per-transaction private value, never a long-term key.

use hmac::{Hmac, Mac};
use num_bigint_dig::BigUint;
use sha2::{Digest, Sha256, Sha384, Sha512};

/// Hash function identifiers (HashID; also the DHHC-1 transform indicator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashId {
    Sha256 = 1,
    Sha384 = 2,
    Sha512 = 3,
}

impl HashId {
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];
    pub fn from_id(id: u8) -> Option<HashId> {
        HashId::ALL.into_iter().find(|h| *h as u8 == id)
    }
    /// Digest length in bytes (HL).
    pub fn len_bytes(self) -> usize {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            HashId::Sha256 => "sha256",
            HashId::Sha384 => "sha384",
            HashId::Sha512 => "sha512",
        }
    }
    pub fn from_name(s: &str) -> Option<HashId> {
        HashId::ALL.into_iter().find(|h| h.name() == s)
    }
}

/// Diffie-Hellman group identifiers (DHgIDs): NULL and RFC 7919's FFDHE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DhGroup {
    Null = 0,
    Ffdhe2048 = 1,
    Ffdhe3072 = 2,
    Ffdhe4096 = 3,
    Ffdhe6144 = 4,
    Ffdhe8192 = 5,
}

impl DhGroup {
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];
    pub fn from_id(id: u8) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| *g as u8 == id)
    }
    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }
    pub fn from_name(s: &str) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| g.name() == s)
    }
    fn prime_hex(self) -> Option<&'static str> {
        use crate::ffdhe::*;
        match self {
            DhGroup::Null => None,
            DhGroup::Ffdhe2048 => Some(FFDHE2048),
            DhGroup::Ffdhe3072 => Some(FFDHE3072),
            DhGroup::Ffdhe4096 => Some(FFDHE4096),
            DhGroup::Ffdhe6144 => Some(FFDHE6144),
            DhGroup::Ffdhe8192 => Some(FFDHE8192),
        }
    }
    /// The group's prime p (None for NULL).
    pub fn prime(self) -> Option<BigUint> {
        self.prime_hex()
            .and_then(|h| BigUint::parse_bytes(h.as_bytes(), 16))
    }
    /// Length of public values and shared secrets in bytes (0 for NULL).
    pub fn value_len_bytes(self) -> usize {
        self.prime_hex().map_or(0, |h| h.len() / 2)
    }
}

/// Private exponent length: 512 bits is above twice the security strength
/// of every group up to ffdhe8192 (~200 bits; RFC 7919 §5.2).
pub const PRIVATE_KEY_LEN: usize = 64;

/// Why a `DHHC-1` secret was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("does not start with \"DHHC-1:\" (write it as nvme gen-dhchap-key prints it: DHHC-1:00:<base64>:)")]
    Prefix,
    #[error("transform indicator {0:?} is not 00, 01, 02 or 03")]
    Transform(String),
    #[error("the key is not valid base64")]
    Base64,
    #[error(
        "decodes to {0} bytes: a key of 32, 48 or 64 bytes and its 4-byte CRC-32 are expected"
    )]
    Length(usize),
    #[error("its CRC-32 does not match the key (mistyped or truncated?)")]
    Crc,
}

/// A parsed `DHHC-1:XX:<base64(key || crc32_le(key))>:` secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    pub key: Vec<u8>,
    /// Transform hash; None (indicator 00): the key is used as is.
    pub transform: Option<HashId>,
}

impl Drop for Secret {
    fn drop(&mut self) {
        // Wipe the key (and its clones, each dropped in turn) from memory.
        zeroize::Zeroize::zeroize(&mut self.key);
    }
}

impl zeroize::ZeroizeOnDrop for Secret {}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        write!(f, "Secret({} bytes, {:?})", self.key.len(), self.transform)
    }
}

impl Secret {
    pub fn parse(s: &str) -> Result<Secret, SecretError> {
        use crate::keyfmt::{self, KeyText};
        let (ind, b64) = keyfmt::split(s, "DHHC-1:").map_err(|_| SecretError::Prefix)?;
        let transform = match ind {
            "00" => None,
            "01" => HashId::from_id(1),
            "02" => HashId::from_id(2),
            "03" => HashId::from_id(3),
            _ => return Err(SecretError::Transform(keyfmt::shown_indicator(ind))),
        };
        let key = keyfmt::decode(b64, &[36, 52, 68]).map_err(|e| match e {
            KeyText::Prefix => SecretError::Prefix,
            KeyText::Base64 => SecretError::Base64,
            KeyText::Length(n) => SecretError::Length(n),
            KeyText::Crc => SecretError::Crc,
        })?;
        Ok(Secret { key, transform })
    }

    /// The secret in `DHHC-1` form (what `nvme gen-dhchap-key` prints).
    pub fn format(&self) -> String {
        crate::keyfmt::format("DHHC-1:", self.transform.map_or(0, |h| h as u8), &self.key)
    }

    /// The key used in HMACs for `nqn` (host NQN for a host secret, subsystem
    /// NQN for a controller secret): HMAC(key, NQN || "NVMe-over-Fabrics").
    pub fn transformed(&self, nqn: &str) -> Vec<u8> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => hmac(h, &self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

/// HMAC over the concatenation of `parts`.
pub fn hmac(h: HashId, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        // HMAC takes keys of any length: new_from_slice cannot fail.
        let Ok(mut m) = <M as hmac::digest::KeyInit>::new_from_slice(key) else {
            return Vec::new();
        };
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().to_vec()
    }
    match h {
        HashId::Sha256 => run::<Hmac<Sha256>>(key, parts),
        HashId::Sha384 => run::<Hmac<Sha384>>(key, parts),
        HashId::Sha512 => run::<Hmac<Sha512>>(key, parts),
    }
}

pub fn digest(h: HashId, data: &[u8]) -> Vec<u8> {
    match h {
        HashId::Sha256 => Sha256::digest(data).to_vec(),
        HashId::Sha384 => Sha384::digest(data).to_vec(),
        HashId::Sha512 => Sha512::digest(data).to_vec(),
    }
}

/// Constant-time equality of two responses.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// The challenge a response is computed over: C itself with the NULL group,
/// else HMAC(H(session key), C) (the augmented challenge, §8.13.5.4).
pub fn challenge_for(h: HashId, c: &[u8], session_key: Option<&[u8]>) -> Vec<u8> {
    match session_key {
        None => c.to_vec(),
        Some(ks) => hmac(h, &digest(h, ks), &[c]),
    }
}

/// Who a response authenticates, and the exchange it belongs to.
pub struct ResponseInput<'a> {
    pub hash: HashId,
    /// The transformed key of the party that proves itself.
    pub key: &'a [u8],
    /// The (augmented) challenge.
    pub challenge: &'a [u8],
    pub seqnum: u32,
    pub t_id: u16,
    pub hostnqn: &'a str,
    pub subnqn: &'a str,
}

/// The host's response R1:
/// HMAC(Kh, C1 || S1 || T_ID || 00h || "HostHost" || NQNh || 00h || NQNc).
pub fn host_response(i: &ResponseInput) -> Vec<u8> {
    let (seq, tid) = (i.seqnum.to_le_bytes(), i.t_id.to_le_bytes());
    let parts: [&[u8]; 8] = [
        i.challenge,
        &seq,
        &tid,
        &[0],
        b"HostHost",
        i.hostnqn.as_bytes(),
        &[0],
        i.subnqn.as_bytes(),
    ];
    hmac(i.hash, i.key, &parts)
}

/// The controller's response R2:
/// HMAC(Kc, C2 || S2 || T_ID || 00h || "Controller" || NQNc || 00h || NQNh).
pub fn ctrl_response(i: &ResponseInput) -> Vec<u8> {
    let (seq, tid) = (i.seqnum.to_le_bytes(), i.t_id.to_le_bytes());
    let parts: [&[u8]; 8] = [
        i.challenge,
        &seq,
        &tid,
        &[0],
        b"Controller",
        i.subnqn.as_bytes(),
        &[0],
        i.hostnqn.as_bytes(),
    ];
    hmac(i.hash, i.key, &parts)
}

/// base^exp mod m through OpenSSL's BN_mod_exp with a constant-time
/// exponent (feature "openssl"). Falls back to num-bigint-dig if OpenSSL
/// cannot allocate; the result is the same number either way (test
/// `openssl_and_num_bigint_exponentiation_agree`).
#[cfg(feature = "openssl")]
fn modexp(base: &BigUint, exp: &BigUint, m: &BigUint) -> BigUint {
    use openssl::bn::{BigNum, BigNumContext};
    let r = (|| -> Result<BigUint, openssl::error::ErrorStack> {
        let b = BigNum::from_slice(&base.to_bytes_be())?;
        let mut e = BigNum::from_slice(&exp.to_bytes_be())?;
        e.set_const_time();
        let p = BigNum::from_slice(&m.to_bytes_be())?;
        let mut ctx = BigNumContext::new()?;
        let mut r = BigNum::new()?;
        r.mod_exp(&b, &e, &p, &mut ctx)?;
        Ok(BigUint::from_bytes_be(&r.to_vec()))
    })();
    r.unwrap_or_else(|_| base.modpow(exp, m))
}

#[cfg(not(feature = "openssl"))]
fn modexp(base: &BigUint, exp: &BigUint, m: &BigUint) -> BigUint {
    base.modpow(exp, m)
}

/// One side's ephemeral Diffie-Hellman key in an FFDHE group.
pub struct DhKey {
    group: DhGroup,
    p: BigUint,
    x: BigUint,
}

/// A peer's public value that is not in the group (`1 < y < p-1` fails).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadPublicValue;

impl DhKey {
    /// A key from `PRIVATE_KEY_LEN` random bytes; None for the NULL group.
    pub fn new(group: DhGroup, random: &[u8; PRIVATE_KEY_LEN]) -> Option<DhKey> {
        let p = group.prime()?;
        let mut x = BigUint::from_bytes_be(random);
        // x in [2, 2^512): a zero or one exponent would give a constant.
        if x < BigUint::from(2u32) {
            x = BigUint::from(2u32);
        }
        Some(DhKey { group, p, x })
    }
    pub fn group(&self) -> DhGroup {
        self.group
    }
    /// g^x mod p, big-endian, left-padded to the prime's length.
    pub fn public_value(&self) -> Vec<u8> {
        let y = modexp(&BigUint::from(2u32), &self.x, &self.p);
        self.padded(&y)
    }
    /// The shared secret (session key) y^x mod p, padded like the public value.
    pub fn shared_secret(&self, peer: &[u8]) -> Result<Vec<u8>, BadPublicValue> {
        if peer.len() != self.group.value_len_bytes() {
            return Err(BadPublicValue);
        }
        let y = BigUint::from_bytes_be(peer);
        let one = BigUint::from(1u32);
        if y <= one || y >= &self.p - &one {
            return Err(BadPublicValue);
        }
        Ok(self.padded(&modexp(&y, &self.x, &self.p)))
    }
    fn padded(&self, v: &BigUint) -> Vec<u8> {
        let b = v.to_bytes_be();
        let n = self.group.value_len_bytes();
        let mut out = vec![0u8; n.saturating_sub(b.len())];
        out.extend_from_slice(&b);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn secret_roundtrip_and_errors() {
        let s = Secret {
            key: (0..32).collect(),
            transform: Some(HashId::Sha256),
        };
        let text = s.format();
        assert!(text.starts_with("DHHC-1:01:") && text.ends_with(':'));
        assert_eq!(Secret::parse(&text), Ok(s.clone()));
        // Without the trailing colon too.
        assert_eq!(Secret::parse(text.trim_end_matches(':')), Ok(s));
        assert_eq!(Secret::parse("DHHC-2:00:AAAA:"), Err(SecretError::Prefix));
        assert_eq!(
            Secret::parse("DHHC-1:04:AAAA:"),
            Err(SecretError::Transform("04".into()))
        );
        // A key written without its indicator is not echoed by the error.
        let e = Secret::parse("DHHC-1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:")
            .unwrap_err()
            .to_string();
        assert!(
            !e.contains("AAECAw") && e.contains("<48 characters>"),
            "{e}"
        );
        assert_eq!(Secret::parse("DHHC-1:00:!!:"), Err(SecretError::Base64));
        assert_eq!(
            Secret::parse("DHHC-1:00:AAAA:"),
            Err(SecretError::Length(3))
        );
        // One flipped key bit fails the CRC.
        let mut bad = Secret {
            key: vec![7; 48],
            transform: None,
        }
        .format()
        .into_bytes();
        bad[12] ^= 1;
        let bad = String::from_utf8(bad).unwrap();
        assert!(matches!(
            Secret::parse(&bad),
            Err(SecretError::Crc | SecretError::Base64)
        ));
    }

    /// Secrets printed by nvme-cli 2.3 `gen-dhchap-key -s <hex> -m M -n nqn.x`:
    /// with M > 0 it writes the key already transformed for that NQN, which
    /// cross-checks our transform against nvme-cli's.
    #[test]
    fn nvme_cli_gen_dhchap_key_vectors() {
        let raw: Vec<u8> = (0..32).collect();
        let k0 =
            Secret::parse("DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:").unwrap();
        assert_eq!((k0.key.clone(), k0.transform), (raw.clone(), None));
        let k1 =
            Secret::parse("DHHC-1:01:s58riWX0tutyq+sZhUpTGydCrEosXGCydo5TV2d3t32YRnW5:").unwrap();
        assert_eq!(k1.transform, Some(HashId::Sha256));
        let mine = Secret {
            key: raw,
            transform: Some(HashId::Sha256),
        };
        assert_eq!(mine.transformed("nqn.x"), k1.key);
        let k2 = Secret::parse(
            "DHHC-1:02:OwgUt3VXOP/YxMovmF8xAc4TOGJIOleayMGOV9zDv0EtslaHTsUjMpddNCYWB5zxcycPSQ==:",
        )
        .unwrap();
        let mine = Secret {
            key: (0..48).collect(),
            transform: Some(HashId::Sha384),
        };
        assert_eq!(mine.transformed("nqn.x"), k2.key);
    }

    /// HMAC-SHA-256 against RFC 4231 test case 2, so the wiring (key, parts
    /// concatenated) is the standard one.
    #[test]
    fn hmac_matches_rfc4231() {
        let out = hmac(
            HashId::Sha256,
            b"Jefe",
            &[b"what do ya want ", b"for nothing?"],
        );
        assert_eq!(
            out,
            hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        );
        let out = hmac(HashId::Sha512, b"Jefe", &[b"what do ya want for nothing?"]);
        assert_eq!(&out[..8], &hex("164b7a7bfcf819e2"));
    }

    /// The transform is HMAC(key, NQN || "NVMe-over-Fabrics"); indicator 00
    /// leaves the key alone.
    #[test]
    fn transform() {
        let key: Vec<u8> = vec![0x11; 32];
        let plain = Secret {
            key: key.clone(),
            transform: None,
        };
        assert_eq!(plain.transformed("nqn.x"), key);
        let t = Secret {
            key: key.clone(),
            transform: Some(HashId::Sha384),
        };
        let want = hmac(HashId::Sha384, &key, &[b"nqn.xNVMe-over-Fabrics"]);
        assert_eq!(t.transformed("nqn.x"), want);
        assert_eq!(want.len(), 48);
    }

    #[test]
    fn responses_differ_by_direction_and_bind_every_field() {
        let base = ResponseInput {
            hash: HashId::Sha256,
            key: &[1; 32],
            challenge: &[2; 32],
            seqnum: 5,
            t_id: 1,
            hostnqn: "nqn.h",
            subnqn: "nqn.s",
        };
        let r = host_response(&base);
        assert_eq!(
            r,
            hmac(
                HashId::Sha256,
                &[1; 32],
                &[&[2; 32], &[5, 0, 0, 0, 1, 0, 0], b"HostHostnqn.h\0nqn.s"]
            )
        );
        assert_ne!(r, ctrl_response(&base));
        assert_ne!(r, host_response(&ResponseInput { seqnum: 6, ..base }));
        assert_ne!(r, host_response(&ResponseInput { t_id: 2, ..base }));
        assert_ne!(
            r,
            host_response(&ResponseInput {
                subnqn: "nqn.t",
                ..base
            })
        );
    }

    #[test]
    fn ffdhe_primes_are_rfc7919_shaped() {
        for g in &DhGroup::ALL[1..] {
            let p = g.prime().unwrap();
            let b = p.to_bytes_be();
            assert_eq!(b.len(), g.value_len_bytes(), "{}", g.name());
            assert!(b[..8].iter().chain(&b[b.len() - 8..]).all(|&x| x == 0xFF));
            // Fermat check of p with base 3 (the generation script checked
            // p and (p-1)/2 with several bases).
            let one = BigUint::from(1u32);
            assert_eq!(BigUint::from(3u32).modpow(&(&p - &one), &p), one);
        }
        assert_eq!(DhGroup::Ffdhe2048.value_len_bytes(), 256);
        assert_eq!(DhGroup::Ffdhe8192.value_len_bytes(), 1024);
        assert!(DhGroup::Null.prime().is_none());
    }

    #[test]
    #[cfg(feature = "openssl")]
    fn openssl_and_num_bigint_exponentiation_agree() {
        for g in [DhGroup::Ffdhe2048, DhGroup::Ffdhe3072] {
            let p = g.prime().unwrap();
            for seed in 1u8..4 {
                let x = BigUint::from_bytes_be(&[seed.wrapping_mul(97); PRIVATE_KEY_LEN]);
                let y = BigUint::from_bytes_be(&vec![seed; g.value_len_bytes() - 1]);
                assert_eq!(modexp(&y, &x, &p), y.modpow(&x, &p), "{g:?} seed {seed}");
            }
        }
    }

    #[test]
    fn dh_both_sides_agree_and_bad_values_are_refused() {
        let a = DhKey::new(DhGroup::Ffdhe2048, &[0x5A; PRIVATE_KEY_LEN]).unwrap();
        let b = DhKey::new(DhGroup::Ffdhe2048, &[0xC3; PRIVATE_KEY_LEN]).unwrap();
        let (ya, yb) = (a.public_value(), b.public_value());
        assert_eq!(ya.len(), 256);
        let (ka, kb) = (a.shared_secret(&yb).unwrap(), b.shared_secret(&ya).unwrap());
        assert_eq!(ka, kb);
        assert_eq!(ka.len(), 256);
        let mut one = vec![0u8; 256];
        one[255] = 1;
        assert_eq!(a.shared_secret(&one), Err(BadPublicValue));
        assert_eq!(a.shared_secret(&[0xFF; 256]), Err(BadPublicValue));
        assert_eq!(a.shared_secret(&yb[1..]), Err(BadPublicValue));
        assert!(DhKey::new(DhGroup::Null, &[1; PRIVATE_KEY_LEN]).is_none());
    }

    #[test]
    fn augmented_challenge() {
        let c = [9u8; 32];
        assert_eq!(challenge_for(HashId::Sha256, &c, None), c);
        let ks = [4u8; 256];
        let want = hmac(HashId::Sha256, &digest(HashId::Sha256, &ks), &[&c]);
        assert_eq!(challenge_for(HashId::Sha256, &c, Some(&ks)), want);
    }
}
