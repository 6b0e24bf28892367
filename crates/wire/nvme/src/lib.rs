//! Sans-IO NVMe, NVMe over Fabrics and NVMe/TCP wire formats.
//!
//! Every function here takes bytes and returns typed values (or the reverse);
//! none of them touches a socket, a clock or a thread. Each length and offset is
//! checked before it is used, so the decoders can be fed arbitrary input (they
//! are fuzzed: see `fuzz/`). Both the target daemon and the host library build
//! on this crate, which keeps the two ends byte-compatible by construction.
//!
//! Layout references are the NVMe Base 2.0, NVMe-oF 1.1 and NVMe/TCP transport
//! specifications; which fields the Linux and SPDK peers actually check was read
//! in their source ([Linux nvme], [SPDK] in docs/sources.md; docs/target.md).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod ana;
pub mod auth;
pub mod crc;
pub mod dhchap;
pub mod dhchap_host;
pub mod fabrics;
mod ffdhe;
pub mod framing;
pub mod identify;
mod keyfmt;
pub mod log;
pub mod pdu;
pub mod resv;
pub mod sqe;
pub mod status;
pub mod tls_psk;

pub use pdu::{CommonHeader, Fatal, PduType};
pub use sqe::{Cqe, Sgl, Sqe};
pub use status::Status;

/// Little-endian field readers over a slice. Callers guarantee the range is in
/// bounds (all structure sizes are fixed and checked at the entry points).
#[inline]
pub fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
#[inline]
pub fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(array(&b[off..off + 4]))
}
#[inline]
pub fn le64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(array(&b[off..off + 8]))
}
#[inline]
pub fn le128(b: &[u8], off: usize) -> u128 {
    u128::from_le_bytes(array(&b[off..off + 16]))
}
/// The first N bytes of `b` as an array (`b` is exactly N long at every
/// call site; indexing panics like a slice would otherwise).
#[inline]
fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}
#[inline]
pub fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Copies `s` into `dst` and pads the rest with ASCII spaces, as Identify
/// requires for SN, MN and FR. Longer strings are truncated.
pub fn put_ascii_padded(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    let n = s.len().min(dst.len());
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Copies `s` into `dst` NUL-terminated and zero-padded (NQN fields). The
/// caller guarantees `s.len() < dst.len()`; NQNs are validated at config time.
pub fn put_cstr(dst: &mut [u8], s: &str) {
    dst.fill(0);
    let n = s.len().min(dst.len() - 1);
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Reads a NUL-terminated string field. Returns `None` when the bytes up to the
/// first NUL are not UTF-8 (NQNs are ASCII/UTF-8 by definition).
pub fn get_cstr(src: &[u8]) -> Option<&str> {
    let end = src.iter().position(|&c| c == 0).unwrap_or(src.len());
    std::str::from_utf8(&src[..end]).ok()
}
