//! CRC-32C (Castagnoli) as NVMe/TCP uses it for header and data digests.
//!
//! The `crc32c` crate picks the SSE4.2/PCLMUL path at run time. The project
//! measured a 3-lane hardware CRC-32C at ~135 ns per 4 KiB on its 2-vCPU VM
//! (one lane: ~400 ns) [M].

/// Digest of one contiguous buffer, in the form stored on the wire (LE u32).
#[inline]
pub fn digest(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Continues a digest over a second buffer (data split across iovecs).
#[inline]
pub fn digest_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn check_value_matches_iscsi_crc32c() {
        // Standard check value for CRC-32C; the wire bytes are 83 92 06 E3.
        assert_eq!(super::digest(b"123456789"), 0xE306_9283);
        assert_eq!(
            super::digest(b"123456789").to_le_bytes(),
            [0x83, 0x92, 0x06, 0xE3]
        );
    }

    #[test]
    fn append_equals_one_shot() {
        let a = super::digest_append(super::digest(b"12345"), b"6789");
        assert_eq!(a, super::digest(b"123456789"));
    }
}
