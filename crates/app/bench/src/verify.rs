//! Per-block verification data.
//!
//! Every logical block written with verify on starts with a 32-byte header:
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `TRLSVFY1` |
//! | 8 | 8 | LBA |
//! | 16 | 4 | generation (per block, counts writes by this run) |
//! | 20 | 4 | seed of the writing job |
//! | 24 | 4 | CRC-32C of the whole block with this field zeroed |
//! | 28 | 4 | reserved (0) |
//!
//! and the rest is a pattern derived from (LBA, generation, seed), so a block
//! written for another LBA, an older generation, or with flipped bits is told
//! apart on read. The bench keeps the expected generation of every block.

pub const MAGIC: &[u8; 8] = b"TRLSVFY1";
const HDR_LEN: usize = 32;

/// What a read block held when it was not what we expected.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VerifyFailure {
    pub lba: u64,
    pub expected_generation: u32,
    /// None when the block carries no readable header (never written, or garbage).
    pub found_generation: Option<u32>,
    pub reason: String,
}

impl std::fmt::Display for VerifyFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let found = match self.found_generation {
            Some(g) => g.to_string(),
            None => "none".into(),
        };
        write!(
            f,
            "verify failed at LBA {}: expected generation {}, found {} ({})",
            self.lba, self.expected_generation, found, self.reason
        )
    }
}

/// Fills one block for (lba, generation, seed).
pub fn fill_block(b: &mut [u8], lba: u64, gen: u32, seed: u32) {
    b[0..8].copy_from_slice(MAGIC);
    b[8..16].copy_from_slice(&lba.to_le_bytes());
    b[16..20].copy_from_slice(&gen.to_le_bytes());
    b[20..24].copy_from_slice(&seed.to_le_bytes());
    b[24..32].fill(0);
    // Cheap per-word pattern: distinct for every (lba, gen, seed) and position.
    let mut x = lba ^ (gen as u64) << 40 ^ (seed as u64) << 20 ^ 0x9E37_79B9_7F4A_7C15;
    for w in b[HDR_LEN..].chunks_exact_mut(8) {
        x = x
            .wrapping_mul(0x5851_F42D_4C95_7F2D)
            .wrapping_add(0x1405_7B7E_F767_814F);
        w.copy_from_slice(&x.to_le_bytes());
    }
    let c = crc32c::crc32c(b);
    b[24..28].copy_from_slice(&c.to_le_bytes());
}

/// Checks one block; `Ok` when it holds exactly (lba, gen, seed).
pub fn check_block(b: &[u8], lba: u64, gen: u32, seed: u32) -> Result<(), VerifyFailure> {
    let fail = |found: Option<u32>, reason: &str| VerifyFailure {
        lba,
        expected_generation: gen,
        found_generation: found,
        reason: reason.to_string(),
    };
    if &b[0..8] != MAGIC {
        return Err(fail(None, "no verify header"));
    }
    let found_lba = u64::from_le_bytes(b[8..16].try_into().unwrap());
    let found_gen = u32::from_le_bytes(b[16..20].try_into().unwrap());
    let found_seed = u32::from_le_bytes(b[20..24].try_into().unwrap());
    let want_crc = u32::from_le_bytes(b[24..28].try_into().unwrap());
    let crc = crc32c::crc32c_append(
        crc32c::crc32c_append(crc32c::crc32c(&b[..24]), &[0; 4]),
        &b[28..],
    );
    if crc != want_crc {
        return Err(fail(Some(found_gen), "checksum mismatch"));
    }
    if found_lba != lba {
        return Err(fail(
            Some(found_gen),
            &format!("block was written for LBA {found_lba}"),
        ));
    }
    if found_seed != seed {
        return Err(fail(Some(found_gen), "block was written by another job"));
    }
    if found_gen != gen {
        return Err(fail(Some(found_gen), "stale or lost write"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_each_kind_of_damage_is_caught() {
        let mut b = vec![0u8; 512];
        fill_block(&mut b, 42, 3, 7);
        check_block(&b, 42, 3, 7).unwrap();
        let e = check_block(&b, 42, 4, 7).unwrap_err();
        assert_eq!((e.expected_generation, e.found_generation), (4, Some(3)));
        let e = check_block(&b, 43, 3, 7).unwrap_err();
        assert!(e.reason.contains("LBA 42"), "{e}");
        let mut flipped = b.clone();
        flipped[300] ^= 1;
        assert!(check_block(&flipped, 42, 3, 7)
            .unwrap_err()
            .reason
            .contains("checksum"));
        let zero = vec![0u8; 512];
        assert_eq!(
            check_block(&zero, 42, 3, 7).unwrap_err().found_generation,
            None
        );
        let e = check_block(&b, 42, 3, 8).unwrap_err();
        assert!(
            e.to_string().contains("LBA 42") && e.to_string().contains("expected generation 3")
        );
    }

    #[test]
    fn patterns_differ_between_generations() {
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        fill_block(&mut a, 1, 1, 0);
        fill_block(&mut b, 1, 2, 0);
        assert_ne!(a[32..], b[32..]);
    }
}
