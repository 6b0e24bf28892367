//! NVMe/TCP TLS pre-shared keys (NVMe/TCP transport specification 1.0 §3.6.1,
//! TP 8011 and TP 8018): the PSK interchange format `nvme gen-tls-key` prints,
//! the retained PSK derived from a configured PSK, the PSK identity strings,
//! and the TLS PSK that the TLS 1.3 handshake uses. Sans-IO: bytes and strings
//! in, bytes and strings out; the TLS handshake itself is elsewhere.
//!
//! The chain, as the specification defines it and libnvme implements it
//! (`derive_nvme_keys` in libnvme's `src/nvme/linux.c`; the Linux kernel only
//! looks keys up by identity, `drivers/nvme/common/keyring.c`):
//!
//! ```text
//! configured PSK  (NVMeTLSkey-1:hh:<base64(key || crc32_le(key))>:)
//!   retained PSK  = hh == 00 ? configured
//!                 : HKDF-Expand-Label(HKDF-Extract(0, configured), "HostNQN", NQNh, len)
//!   identity v0   = "NVMe0R<cc> <NQNh> <NQNs>"
//!   identity v1   = "NVMe1R<cc> <NQNh> <NQNs> <digest>",
//!                   digest = base64(HMAC(retained, NQNh " " NQNs " NVMe-over-Fabrics"))
//!   TLS PSK       = HKDF-Expand-Label(HKDF-Extract(0, retained), "nvme-tls-psk",
//!                                     v0: identity | v1: "<cc> <digest>", len)
//! ```
//!
//! where `cc` (01 SHA-256, 02 SHA-384) is the hash of the cipher suite the PSK
//! is bound to: `hh` when it is not 00, else by key length (32 → 01, 48 → 02).
//!
//! HkdfLabel (RFC 8446 §7.1) is `u16 length (big-endian) || u8 len || "tls13 "
//! label || u8 len || context`. libnvme before its July 2025 fix (PR #1040)
//! built it as `u16 length (little-endian) || "tls13 " label || context`,
//! without the two length bytes; nvme-cli with such a libnvme (Debian 13's
//! nvme-cli 2.13 with libnvme 1.13, for one) puts keys derived that way into
//! the kernel keyring, and a target deriving by the letter of the spec (SPDK)
//! then fails the handshake (spdk#3838). [`Derivation`] names both.

use crate::dhchap::HashId;

/// The hash of a TLS PSK: the cipher suite it is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PskHash {
    /// TLS_AES_128_GCM_SHA256.
    Sha256 = 1,
    /// TLS_AES_256_GCM_SHA384.
    Sha384 = 2,
}

impl PskHash {
    pub fn from_id(id: u8) -> Option<PskHash> {
        match id {
            1 => Some(PskHash::Sha256),
            2 => Some(PskHash::Sha384),
            _ => None,
        }
    }
    /// Output length in bytes: also the length of the PSKs bound to it.
    pub fn len_bytes(self) -> usize {
        match self {
            PskHash::Sha256 => 32,
            PskHash::Sha384 => 48,
        }
    }
    fn hash_id(self) -> HashId {
        match self {
            PskHash::Sha256 => HashId::Sha256,
            PskHash::Sha384 => HashId::Sha384,
        }
    }
    /// The TLS 1.3 cipher suite (IANA name) this PSK is used with.
    pub fn cipher_suite(self) -> &'static str {
        match self {
            PskHash::Sha256 => "TLS_AES_128_GCM_SHA256",
            PskHash::Sha384 => "TLS_AES_256_GCM_SHA384",
        }
    }
    /// The cipher suite's two-byte code (RFC 8446 B.4).
    pub fn cipher_suite_code(self) -> [u8; 2] {
        match self {
            PskHash::Sha256 => [0x13, 0x01],
            PskHash::Sha384 => [0x13, 0x02],
        }
    }
}

/// How the HkdfLabel of the two HKDF-Expand-Label steps is built (see the
/// module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Derivation {
    /// RFC 8446 §7.1 HkdfLabel, as the NVMe/TCP specification says, SPDK
    /// derives and libnvme does since its 2025 fix.
    #[default]
    Spec,
    /// libnvme 1.7 up to its 2025 fix: little-endian length, label and
    /// context without their length bytes (what nvme-cli with Debian 13's
    /// libnvme 1.13 inserts into the kernel keyring).
    LibnvmeCompat,
}

impl Derivation {
    pub fn name(self) -> &'static str {
        match self {
            Derivation::Spec => "spec",
            Derivation::LibnvmeCompat => "libnvme-compat",
        }
    }
    pub fn from_name(s: &str) -> Option<Derivation> {
        [Derivation::Spec, Derivation::LibnvmeCompat]
            .into_iter()
            .find(|d| d.name() == s)
    }
}

/// Why a PSK in interchange format was refused. Each message says what is
/// wrong and how the key should look.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PskError {
    #[error("does not start with \"NVMeTLSkey-1:\" (write it as nvme gen-tls-key prints it: NVMeTLSkey-1:01:<base64>:)")]
    Prefix,
    #[error("unknown hash {0:?}: use 00 (none), 01 (SHA-256) or 02 (SHA-384)")]
    Hash(String),
    #[error("the key is not valid base64")]
    Base64,
    #[error("decodes to {0} bytes: a key of 32 or 48 bytes and its 4-byte CRC-32 are expected")]
    Length(usize),
    #[error("hash {hash:02} takes a {want}-byte key, this one has {got} bytes (nvme gen-tls-key --hmac={hash} makes one)")]
    HashLength { hash: u8, want: usize, got: usize },
    #[error("its CRC-32 does not match the key (mistyped or truncated?)")]
    Crc,
}

/// A configured PSK: `NVMeTLSkey-1:hh:<base64(key || crc32_le(key))>:`.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfiguredPsk {
    pub key: Vec<u8>,
    /// The retained-PSK transform (hh): None for 00 (used as is).
    pub transform: Option<PskHash>,
}

impl Drop for ConfiguredPsk {
    fn drop(&mut self) {
        // Wipe the key (and its clones, each dropped in turn) from memory.
        zeroize::Zeroize::zeroize(&mut self.key);
    }
}

impl zeroize::ZeroizeOnDrop for ConfiguredPsk {}

impl std::fmt::Debug for ConfiguredPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        write!(
            f,
            "ConfiguredPsk({} bytes, {:?})",
            self.key.len(),
            self.transform
        )
    }
}

impl ConfiguredPsk {
    /// Parses the interchange format. The trailing ':' may be left out.
    pub fn parse(s: &str) -> Result<ConfiguredPsk, PskError> {
        use crate::keyfmt::{self, KeyText};
        let (ind, b64) = keyfmt::split(s, "NVMeTLSkey-1:").map_err(|_| PskError::Prefix)?;
        let transform = match ind {
            "00" => None,
            "01" => Some(PskHash::Sha256),
            "02" => Some(PskHash::Sha384),
            _ => return Err(PskError::Hash(keyfmt::shown_indicator(ind))),
        };
        let key = keyfmt::decode(b64, &[36, 52]).map_err(|e| match e {
            KeyText::Prefix => PskError::Prefix,
            KeyText::Base64 => PskError::Base64,
            KeyText::Length(n) => PskError::Length(n),
            KeyText::Crc => PskError::Crc,
        });
        // A key whose CRC is right but whose length is not its hash's is named as such.
        if let (Some(h), Ok(k)) = (transform, &key) {
            if k.len() != h.len_bytes() {
                return Err(PskError::HashLength {
                    hash: h as u8,
                    want: h.len_bytes(),
                    got: k.len(),
                });
            }
        }
        Ok(ConfiguredPsk {
            key: key?,
            transform,
        })
    }

    /// The key in interchange format (what `nvme gen-tls-key` prints).
    pub fn format(&self) -> String {
        crate::keyfmt::format(
            "NVMeTLSkey-1:",
            self.transform.map_or(0, |h| h as u8),
            &self.key,
        )
    }

    /// The hash of the cipher suite the derived TLS PSK is bound to: the
    /// transform, or by key length for 00.
    pub fn psk_hash(&self) -> PskHash {
        match self.transform {
            Some(h) => h,
            None if self.key.len() == 48 => PskHash::Sha384,
            None => PskHash::Sha256,
        }
    }

    /// The retained PSK for host `hostnqn`.
    pub fn retained(&self, hostnqn: &str, d: Derivation) -> Vec<u8> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => {
                let prk = hkdf_extract(h, &self.key);
                expand_label(h, &prk, "HostNQN", hostnqn.as_bytes(), self.key.len(), d)
            }
        }
    }

    /// The PSK identity this key gives for (`hostnqn`, `subnqn`) in
    /// identity format `version` (0 or 1).
    pub fn identity(&self, version: u8, hostnqn: &str, subnqn: &str, d: Derivation) -> Identity {
        let hash = self.psk_hash();
        let digest = (version == 1).then(|| {
            let retained = zeroize::Zeroizing::new(self.retained(hostnqn, d));
            psk_digest(hash, &retained, hostnqn, subnqn)
        });
        Identity {
            generated: false,
            hash,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            digest,
        }
    }

    /// The TLS PSK for `id` (whose NQNs and hash the caller matched to this
    /// key): what goes into the TLS 1.3 handshake as the external PSK.
    /// Err when a version-1 identity's digest is not this key's.
    pub fn tls_psk(&self, id: &Identity, d: Derivation) -> Result<Vec<u8>, TlsPskError> {
        if id.hash != self.psk_hash() {
            return Err(TlsPskError::HashMismatch {
                identity: id.hash,
                key: self.psk_hash(),
            });
        }
        let retained = zeroize::Zeroizing::new(self.retained(&id.hostnqn, d));
        tls_psk_from_retained(id, &retained, d)
    }
}

/// Why no TLS PSK could be derived for an identity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TlsPskError {
    #[error("the identity asks for a {} PSK but the configured key gives a {} one", .identity.cipher_suite(), .key.cipher_suite())]
    HashMismatch { identity: PskHash, key: PskHash },
    #[error("the identity's PSK digest is not the configured key's (another key, or another derivation)")]
    DigestMismatch,
}

/// The TLS PSK from a retained PSK (checks a version-1 identity's digest).
pub fn tls_psk_from_retained(
    id: &Identity,
    retained: &[u8],
    d: Derivation,
) -> Result<Vec<u8>, TlsPskError> {
    let h = id.hash;
    let context = match &id.digest {
        None => id.format().into_bytes(),
        Some(digest) => {
            let want = psk_digest(h, retained, &id.hostnqn, &id.subnqn);
            if !bool::from(subtle::ConstantTimeEq::ct_eq(
                want.as_bytes(),
                digest.as_bytes(),
            )) {
                return Err(TlsPskError::DigestMismatch);
            }
            format!("{:02} {digest}", h as u8).into_bytes()
        }
    };
    let prk = hkdf_extract(h, retained);
    Ok(expand_label(
        h,
        &prk,
        "nvme-tls-psk",
        &context,
        retained.len(),
        d,
    ))
}

/// The PSK digest of a version-1 identity: base64 of
/// HMAC(retained, NQNh || " " || NQNs || " " || "NVMe-over-Fabrics").
pub fn psk_digest(h: PskHash, retained: &[u8], hostnqn: &str, subnqn: &str) -> String {
    use base64::Engine;
    let mac = crate::dhchap::hmac(
        h.hash_id(),
        retained,
        &[
            hostnqn.as_bytes(),
            b" ",
            subnqn.as_bytes(),
            b" ",
            b"NVMe-over-Fabrics",
        ],
    );
    base64::engine::general_purpose::STANDARD.encode(mac)
}

/// A PSK identity: `NVMe<v><R|G><cc> <NQNh> <NQNs>[ <digest>]` (version 1
/// carries the digest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// G: a PSK generated by DH-HMAC-CHAP secure channel concatenation; R: a
    /// retained (configured) one.
    pub generated: bool,
    pub hash: PskHash,
    pub hostnqn: String,
    pub subnqn: String,
    /// Version 1 only.
    pub digest: Option<String>,
}

/// Longest identity accepted: two 223-byte NQNs, the prefix, spaces and a
/// SHA-384 digest in base64 (64 characters).
pub const MAX_IDENTITY_LEN: usize = 9 + 223 + 1 + 223 + 1 + 64;

impl Identity {
    pub fn version(&self) -> u8 {
        u8::from(self.digest.is_some())
    }

    pub fn format(&self) -> String {
        let kind = if self.generated { 'G' } else { 'R' };
        let base = format!(
            "NVMe{}{kind}{:02} {} {}",
            self.version(),
            self.hash as u8,
            self.hostnqn,
            self.subnqn
        );
        match &self.digest {
            Some(d) => format!("{base} {d}"),
            None => base,
        }
    }

    /// Parses an identity as a TLS ClientHello carries it. None when it is
    /// not of this form (another application's PSK, garbage).
    pub fn parse(b: &[u8]) -> Option<Identity> {
        if b.len() > MAX_IDENTITY_LEN {
            return None;
        }
        let s = std::str::from_utf8(b).ok()?;
        let mut parts = s.split(' ');
        let head: &[u8; 8] = parts.next()?.as_bytes().try_into().ok()?;
        if &head[..4] != b"NVMe" {
            return None;
        }
        let version = match head[4] {
            b'0' => 0,
            b'1' => 1,
            _ => return None,
        };
        let generated = match head[5] {
            b'R' => false,
            b'G' => true,
            _ => return None,
        };
        if head[6] != b'0' {
            return None;
        }
        let hash = PskHash::from_id(head[7].wrapping_sub(b'0'))?;
        let hostnqn = parts.next().filter(|p| !p.is_empty())?.to_string();
        let subnqn = parts.next().filter(|p| !p.is_empty())?.to_string();
        let digest = match version {
            0 => None,
            _ => Some(parts.next().filter(|p| !p.is_empty())?.to_string()),
        };
        if parts.next().is_some() {
            return None;
        }
        Some(Identity {
            generated,
            hash,
            hostnqn,
            subnqn,
            digest,
        })
    }
}

/// HKDF-Extract with a zero salt (RFC 5869: HashLen zero bytes).
fn hkdf_extract(h: PskHash, ikm: &[u8]) -> Vec<u8> {
    let zeros = vec![0u8; h.len_bytes()];
    crate::dhchap::hmac(h.hash_id(), &zeros, &[ikm])
}

/// HKDF-Expand (RFC 5869 §2.3) of `len` bytes (at most 255 × HashLen).
fn hkdf_expand(h: PskHash, prk: &[u8], info: &[u8], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut t: Vec<u8> = Vec::new();
    let mut i = 1u8;
    while out.len() < len {
        t = crate::dhchap::hmac(h.hash_id(), prk, &[&t, info, &[i]]);
        let want = len - out.len();
        out.extend(t.iter().take(want));
        i = i.wrapping_add(1);
    }
    out
}

/// The `info` of HKDF-Expand-Label (see the module comment for the two forms).
fn hkdf_label(label: &str, context: &[u8], len: usize, d: Derivation) -> Vec<u8> {
    let full = format!("tls13 {label}");
    let mut info = Vec::with_capacity(4 + full.len() + context.len());
    // HkdfLabel (RFC 8446 §7.1): a 2-byte length, 1-byte label and context
    // lengths. Our labels and contexts are short constants and digests, and
    // the length at most a hash length, so none of these saturates.
    debug_assert!(len <= 0xffff && full.len() <= 0xff && context.len() <= 0xff);
    let len16 = u16::try_from(len).unwrap_or(u16::MAX);
    let len8 = |n: usize| u8::try_from(n).unwrap_or(u8::MAX);
    match d {
        Derivation::Spec => {
            info.extend_from_slice(&len16.to_be_bytes());
            info.push(len8(full.len()));
            info.extend_from_slice(full.as_bytes());
            info.push(len8(context.len()));
            info.extend_from_slice(context);
        }
        Derivation::LibnvmeCompat => {
            info.extend_from_slice(&len16.to_le_bytes());
            info.extend_from_slice(full.as_bytes());
            info.extend_from_slice(context);
        }
    }
    info
}

fn expand_label(
    h: PskHash,
    prk: &[u8],
    label: &str,
    context: &[u8],
    len: usize,
    d: Derivation,
) -> Vec<u8> {
    hkdf_expand(h, prk, &hkdf_label(label, context, len, d), len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn hkdf_matches_rfc5869_test_case_3() {
        // Our extract takes a zero salt: RFC 5869 A.3 (no salt, no info).
        let ikm = [0x0bu8; 22];
        // A.3: salt empty (= HashLen zeros), info empty, L = 42.
        let prk = hkdf_extract(PskHash::Sha256, &ikm);
        assert_eq!(
            hex(&prk),
            "19ef24a32c717b167f33a91d6f648bdf96596776afdb6377ac434c1c293ccb04"
        );
        let okm = hkdf_expand(PskHash::Sha256, &prk, &[], 42);
        assert_eq!(
            hex(&okm),
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"
        );
    }

    #[test]
    fn interchange_format_round_trips_and_names_each_error() {
        let k = ConfiguredPsk {
            key: (0..32).collect(),
            transform: Some(PskHash::Sha256),
        };
        let s = k.format();
        assert!(s.starts_with("NVMeTLSkey-1:01:"));
        assert!(s.ends_with(':'));
        assert_eq!(ConfiguredPsk::parse(&s).unwrap(), k);
        // Without the trailing colon, and with white space around it.
        assert_eq!(
            ConfiguredPsk::parse(&format!(" {} ", &s[..s.len() - 1])).unwrap(),
            k
        );
        let k48 = ConfiguredPsk {
            key: vec![7; 48],
            transform: None,
        };
        assert_eq!(ConfiguredPsk::parse(&k48.format()).unwrap(), k48);
        assert_eq!(k48.psk_hash(), PskHash::Sha384);
        assert_eq!(
            ConfiguredPsk::parse("DHHC-1:00:AAAA:"),
            Err(PskError::Prefix)
        );
        assert_eq!(
            ConfiguredPsk::parse("NVMeTLSkey-1:03:AAAA:"),
            Err(PskError::Hash("03".into()))
        );
        assert_eq!(
            ConfiguredPsk::parse("NVMeTLSkey-1:01:!!!!:"),
            Err(PskError::Base64)
        );
        assert_eq!(
            ConfiguredPsk::parse("NVMeTLSkey-1:01:AAAA:"),
            Err(PskError::Length(3))
        );
        // A 48-byte key under hash 01.
        let bad = k48.format().replace(":00:", ":01:");
        assert_eq!(
            ConfiguredPsk::parse(&bad),
            Err(PskError::HashLength {
                hash: 1,
                want: 32,
                got: 48
            })
        );
        // One changed character of the base64 breaks the CRC.
        let mut b = s.into_bytes();
        b[20] = if b[20] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            ConfiguredPsk::parse(std::str::from_utf8(&b).unwrap()),
            Err(PskError::Crc)
        );
    }

    #[test]
    fn identities_parse_and_format() {
        let v0 = "NVMe0R01 nqn.2014-08.org.nvmexpress:uuid:1 nqn.2026-11.io.trellis:tls";
        let id = Identity::parse(v0.as_bytes()).unwrap();
        assert_eq!(id.hash, PskHash::Sha256);
        assert_eq!(id.version(), 0);
        assert!(!id.generated);
        assert_eq!(id.hostnqn, "nqn.2014-08.org.nvmexpress:uuid:1");
        assert_eq!(id.subnqn, "nqn.2026-11.io.trellis:tls");
        assert_eq!(id.format(), v0);
        let v1 = "NVMe1G02 h s abc+/=";
        let id = Identity::parse(v1.as_bytes()).unwrap();
        assert_eq!(
            (id.version(), id.generated, id.hash),
            (1, true, PskHash::Sha384)
        );
        assert_eq!(id.digest.as_deref(), Some("abc+/="));
        assert_eq!(id.format(), v1);
        for bad in [
            "NVMe0R03 h s",
            "NVMe2R01 h s",
            "NVMe0X01 h s",
            "NVMe0R01 h",
            "NVMe0R01 h s extra",
            "NVMe1R01 h s",
            "NVMe0R01  s",
            "nvme0R01 h s",
            "client1",
        ] {
            assert_eq!(Identity::parse(bad.as_bytes()), None, "{bad}");
        }
        assert_eq!(Identity::parse(&[b'N'; MAX_IDENTITY_LEN + 1]), None);
    }

    #[test]
    fn derivations_differ_and_bind_nqns() {
        let k = ConfiguredPsk {
            key: (0..32).collect(),
            transform: Some(PskHash::Sha256),
        };
        let r1 = k.retained("host-a", Derivation::Spec);
        assert_ne!(r1, k.retained("host-b", Derivation::Spec));
        assert_ne!(r1, k.retained("host-a", Derivation::LibnvmeCompat));
        assert_eq!(r1.len(), 32);
        let id = k.identity(0, "host-a", "sub", Derivation::Spec);
        assert_eq!(id.format(), "NVMe0R01 host-a sub");
        let p = k.tls_psk(&id, Derivation::Spec).unwrap();
        assert_eq!(p.len(), 32);
        assert_ne!(p, k.tls_psk(&id, Derivation::LibnvmeCompat).unwrap());
        // Version 1: the digest is checked.
        let id1 = k.identity(1, "host-a", "sub", Derivation::Spec);
        assert!(id1.format().starts_with("NVMe1R01 host-a sub "));
        assert!(k.tls_psk(&id1, Derivation::Spec).is_ok());
        let mut wrong = id1.clone();
        wrong.digest = Some("AAAA".into());
        assert_eq!(
            k.tls_psk(&wrong, Derivation::Spec),
            Err(TlsPskError::DigestMismatch)
        );
        let mut other = id.clone();
        other.hash = PskHash::Sha384;
        assert!(matches!(
            k.tls_psk(&other, Derivation::Spec),
            Err(TlsPskError::HashMismatch { .. })
        ));
        // 00: the configured key is the retained one.
        let raw = ConfiguredPsk {
            key: vec![9; 48],
            transform: None,
        };
        assert_eq!(raw.retained("h", Derivation::Spec), vec![9; 48]);
        assert_eq!(
            raw.identity(0, "h", "s", Derivation::Spec).format(),
            "NVMe0R02 h s"
        );
    }

    /// Vectors from Debian 13's nvme-cli 2.13 with libnvme 1.13, in the VM
    /// (tests/linux-vm, TRELLIS_VM_SUITE=trixie): `nvme gen-tls-key` of a
    /// fixed secret, `nvme check-tls-key --insert` for the VM's host NQN and
    /// a subsystem, and `nvme tls-key --export` of what it put into the
    /// kernel keyring (identity and the TLS PSK, in interchange format).
    #[test]
    fn nvme_cli_2_13_vectors_match_the_libnvme_compat_derivation() {
        let host = "nqn.2014-08.org.nvmexpress:uuid:5472656c-6c69-4073-8000-000000000001";
        let sub = "nqn.2026-11.io.trellis:tls";
        // gen-tls-key --hmac=1 --secret=000102..1f
        let k1 = ConfiguredPsk::parse(
            "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
        )
        .unwrap();
        assert_eq!(k1.key, (0..32).collect::<Vec<u8>>());
        assert_eq!(
            k1.format(),
            "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"
        );
        let id = k1.identity(0, host, sub, Derivation::LibnvmeCompat);
        assert_eq!(id.format(), format!("NVMe0R01 {host} {sub}"));
        let want = ConfiguredPsk::parse(
            "NVMeTLSkey-1:01:car+hl80k7tV2kVqGVUWHcupp/2jkvA5CPKYIkbEvPqFDsWe:",
        )
        .unwrap()
        .key
        .clone();
        assert_eq!(k1.tls_psk(&id, Derivation::LibnvmeCompat).unwrap(), want);
        assert_ne!(k1.tls_psk(&id, Derivation::Spec).unwrap(), want);
        // gen-tls-key --hmac=2 --secret=000102..2f, check-tls-key --identity=1
        let k2 = ConfiguredPsk::parse(
            "NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:",
        )
        .unwrap();
        let id = k2.identity(1, host, sub, Derivation::LibnvmeCompat);
        assert_eq!(
            id.format(),
            format!("NVMe1R02 {host} {sub} wWRYHHqE/D27N10QAXKPy4AOW+CGWMqVIqcBWLU9w6IUbOw6H4vGfOAzfFlxWYhF")
        );
        let want = ConfiguredPsk::parse(
            "NVMeTLSkey-1:02:KUfuIoNBrBCLXja5+5NxUTGqNPywfCdzyUki+LrS4L5RHXxkpmAMs2HWvUeHBNZtHnvMgg==:",
        )
        .unwrap()
        .key
        .clone();
        assert_eq!(k2.tls_psk(&id, Derivation::LibnvmeCompat).unwrap(), want);
    }

    #[test]
    fn hkdf_labels_have_both_layouts() {
        assert_eq!(
            hkdf_label("HostNQN", b"h", 32, Derivation::Spec),
            b"\x00\x20\x0dtls13 HostNQN\x01h".to_vec()
        );
        assert_eq!(
            hkdf_label("HostNQN", b"h", 32, Derivation::LibnvmeCompat),
            b"\x20\x00tls13 HostNQNh".to_vec()
        );
    }
}
