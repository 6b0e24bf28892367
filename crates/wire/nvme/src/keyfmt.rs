//! The text form both NVMe key kinds share: `<PREFIX>:<hh>:<base64(key ||
//! CRC-32(key) little endian)>:`, as nvme-cli prints DH-HMAC-CHAP secrets
//! (`DHHC-1`, `gen-dhchap-key`) and TLS PSKs (`NVMeTLSkey-1`, `gen-tls-key`).
//! What the indicator `hh` means and which lengths are valid is each kind's
//! business ([`crate::dhchap::Secret`], [`crate::tls_psk::ConfiguredPsk`]).

use base64::Engine;

/// Why a key's text is malformed, before its kind checks indicator and length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyText {
    /// Not `PREFIX:hh:...`.
    Prefix,
    Base64,
    /// The decoded bytes (key and CRC) were this long: none of `lens`.
    Length(usize),
    Crc,
}

/// Splits `s` into its indicator and its base64 part, checking the prefix.
/// The trailing ':' is optional, as in Linux.
pub(crate) fn split<'a>(s: &'a str, prefix: &str) -> Result<(&'a str, &'a str), KeyText> {
    let rest = s.trim().strip_prefix(prefix).ok_or(KeyText::Prefix)?;
    let (ind, b64) = rest.split_once(':').ok_or(KeyText::Prefix)?;
    Ok((ind, b64.strip_suffix(':').unwrap_or(b64)))
}

/// The key of a base64 part, checking that key and CRC together are one of
/// `lens` bytes long and the CRC.
pub(crate) fn decode(b64: &str, lens: &[usize]) -> Result<Vec<u8>, KeyText> {
    // Key and CRC decoded: wiped when this returns, as the key's copy is
    // by its owner's Drop.
    let raw = zeroize::Zeroizing::new(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| KeyText::Base64)?,
    );
    if !lens.contains(&raw.len()) {
        return Err(KeyText::Length(raw.len()));
    }
    let (key, crc) = raw.split_at(raw.len() - 4);
    if crc32fast::hash(key).to_le_bytes() != crc {
        return Err(KeyText::Crc);
    }
    Ok(key.to_vec())
}

/// An unknown indicator as an error message may show it: as is when it has
/// the two characters of one, else only its length (text without the `hh:`
/// puts the key itself where the indicator goes, and errors reach logs).
pub(crate) fn shown_indicator(ind: &str) -> String {
    if ind.len() <= 2 {
        ind.to_string()
    } else {
        format!("<{} characters>", ind.chars().count())
    }
}

/// `PREFIX:hh:base64(key || CRC-32):` with indicator `ind`.
pub(crate) fn format(prefix: &str, ind: u8, key: &[u8]) -> String {
    let mut raw = zeroize::Zeroizing::new(key.to_vec());
    raw.extend_from_slice(&crc32fast::hash(key).to_le_bytes());
    let b64 = base64::engine::general_purpose::STANDARD.encode(&*raw);
    format!("{prefix}{ind:02}:{b64}:")
}
