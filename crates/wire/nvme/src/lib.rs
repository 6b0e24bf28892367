//! Sans-IO NVMe, NVMe over Fabrics and NVMe/TCP wire formats.
//!
//! Every function here takes bytes and returns typed values (or the reverse);
//! none of them touches a socket, a clock or a thread. Each length and offset is
//! checked before it is used, so the decoders can be fed arbitrary input (they
//! are fuzzed: see `fuzz/` and `tests/arbitrary_bytes.rs`). Outside tests the
//! crate denies indexing, slicing and truncating casts (below), so a panic on
//! an out-of-range field cannot be written by accident. Both the target daemon and the host library build
//! on this crate, which keeps the two ends byte-compatible by construction.
//!
//! Layout references are the NVMe Base 2.0, NVMe-oF 1.1 and NVMe/TCP transport
//! specifications; which fields the Linux and SPDK peers actually check was read
//! in their source ([Linux nvme], [SPDK] in docs/sources.md; docs/target.md).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::cast_possible_truncation)
)]

pub mod ana;
pub mod auth;
pub mod crc;
pub mod dhchap;
pub mod dhchap_host;
pub mod fabrics;
mod ffdhe;
pub mod framing;
pub mod health;
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

/// Little-endian field readers over a slice. Callers check every structure's
/// size at its entry point, so the range is always in bounds; were it not (a
/// bug, never peer input), a debug build asserts and a release build reads 0
/// rather than panicking. One bounds check, as indexing had.
#[inline]
pub fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(chunk(b, off))
}
#[inline]
pub fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(chunk(b, off))
}
#[inline]
pub fn le64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(chunk(b, off))
}
#[inline]
pub fn le128(b: &[u8], off: usize) -> u128 {
    u128::from_le_bytes(chunk(b, off))
}
/// The N bytes of `b` at `off` as an array (zeros when out of range, see
/// [`le16`]).
#[inline]
pub(crate) fn chunk<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    match b.get(off..).and_then(<[u8]>::first_chunk::<N>) {
        Some(a) => *a,
        None => {
            debug_assert!(false, "read of {N} bytes at {off} past {}", b.len());
            [0; N]
        }
    }
}
/// The first N bytes of `b` as an array, for an encoder that writes a
/// fixed-size structure with constant offsets. `None` (and a debug
/// assertion: every caller passes a buffer of at least N) when `b` is shorter.
#[inline]
pub(crate) fn front_mut<const N: usize>(b: &mut [u8]) -> Option<&mut [u8; N]> {
    let len = b.len();
    let a = b.first_chunk_mut::<N>();
    debug_assert!(a.is_some(), "{N}-byte structure into {len} bytes");
    a
}
/// `b` as an N-byte array, zero-padded if shorter: a decoder of a fixed-size
/// page or entry reads every field at a constant offset inside it, and a
/// short page from a peer reads as zeroes past its end instead of panicking.
/// For pages read once per controller, namespace or log entry.
#[inline]
pub(crate) fn padded<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut p = [0u8; N];
    copy_prefix(&mut p, b);
    p
}
/// Little-endian field writers; the same contract as the readers: the range
/// is in bounds at every call site, and a write past the end (a bug) asserts
/// in a debug build and is dropped in a release build.
#[inline]
pub fn put16(b: &mut [u8], off: usize, v: u16) {
    put_bytes(b, off, v.to_le_bytes());
}
#[inline]
pub fn put32(b: &mut [u8], off: usize, v: u32) {
    put_bytes(b, off, v.to_le_bytes());
}
#[inline]
pub fn put64(b: &mut [u8], off: usize, v: u64) {
    put_bytes(b, off, v.to_le_bytes());
}
#[inline]
pub(crate) fn put_bytes<const N: usize>(b: &mut [u8], off: usize, v: [u8; N]) {
    let len = b.len();
    match b.get_mut(off..).and_then(<[u8]>::first_chunk_mut::<N>) {
        Some(a) => *a = v,
        None => debug_assert!(false, "write of {N} bytes at {off} past {len}"),
    }
}

/// Copies `s` into `dst` and pads the rest with ASCII spaces, as Identify
/// requires for SN, MN and FR. Longer strings are truncated.
pub fn put_ascii_padded(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    copy_prefix(dst, s.as_bytes());
}

/// Copies `s` into `dst` NUL-terminated and zero-padded (NQN fields). The
/// caller guarantees `s.len() < dst.len()`; NQNs are validated at config time.
pub fn put_cstr(dst: &mut [u8], s: &str) {
    dst.fill(0);
    // Leaves the last byte as the NUL (an empty `dst` stays empty).
    let room = dst.len().saturating_sub(1);
    if let Some(d) = dst.get_mut(..room) {
        copy_prefix(d, s.as_bytes());
    }
}

/// Reads a NUL-terminated string field. Returns `None` when the bytes up to the
/// first NUL are not UTF-8 (NQNs are ASCII/UTF-8 by definition).
pub fn get_cstr(src: &[u8]) -> Option<&str> {
    let s = src.split(|&c| c == 0).next().unwrap_or_default();
    std::str::from_utf8(s).ok()
}

/// Copies as much of `src` as fits into the front of `dst`; returns how many
/// bytes that was (the shorter length).
pub fn copy_prefix(dst: &mut [u8], src: &[u8]) -> usize {
    let n = src.len().min(dst.len());
    if let (Some(d), Some(s)) = (dst.get_mut(..n), src.get(..n)) {
        d.copy_from_slice(s);
    }
    n
}
