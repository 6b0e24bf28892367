//! Wear and failure (docs/ssd-model.md, "Wear and failure"). Sources: [R] = our choice,
//! [D] = derived, UNVERIFIED = not confirmed in a primary source (docs/sources.md).
//!
//! P/E cycles per block (LUN × block index), counted at each GC erase; a block retires
//! when its count passes its own endurance (the rating ± a seeded spread) and a spare
//! block takes its place. The replacement is accounting only: the FTL's geometry and
//! line choice do not change, so a fresh drive's timing is the model's timing without
//! wear. Host reads see a raw bit-error rate that grows with the block's P/E count;
//! past the ECC limit a read takes read-retry steps (one more tR each) and, past the
//! retry limit, is uncorrectable (a media error).

use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;
use serde::{Deserialize, Serialize};

/// [R] Share of "Available Spare" below which NVMe SMART Critical Warning bit 0 sets.
/// The NVMe Base Specification leaves the threshold to the vendor (it is reported in the
/// SMART log's "Available Spare Threshold"); 10 % is a common vendor value (UNVERIFIED).
pub const AVAILABLE_SPARE_THRESHOLD_PCT: u8 = 10;
/// [R] Media errors at or above which Critical Warning bit 2 ("reliability degraded")
/// sets: any uncorrectable read. The spec leaves "excessive" to the vendor.
pub const MEDIA_ERRORS_DEGRADED: u64 = 1;
/// NVMe "Percentage Used" saturates at 255 ([NVMe Base] SMART log, byte 5).
const PERCENTAGE_USED_MAX: u64 = 255;

/// Wear parameters of a profile. Every default keeps the model's timing on a fresh
/// drive; `acceleration` > 1 wears a drive out in a test's lifetime.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WearProfile {
    /// P/E cycles a block is rated for. [D] 3,000 for 3D TLC: the PM9A3 960 GB is rated
    /// 1 DWPD for 5 years ([PM9A3 endurance], UNVERIFIED) = 1,825 drive writes; over ~1.1 TB
    /// of raw NAND at a write amplification of ~2 that is 1,825 × 0.96 / 1.1 × 2 ≈ 3,190
    /// P/E cycles, in line with the ~3,000 commonly quoted for 3D TLC (UNVERIFIED).
    pub rated_pe_cycles: u32,
    /// [R] Each block's endurance is uniform in rated × (1 ± this / 100), seeded.
    pub endurance_spread_pct: u32,
    /// [R] Spare blocks for bad-block replacement, per mille of all blocks (at least 1);
    /// held outside the FTL's geometry (its over-provisioning is separate).
    pub spare_blocks_permille: u32,
    /// P/E cycles counted per erase (1 = real wear; larger wears a test drive out fast).
    pub acceleration: u32,
    /// Seed of the endurance draws and of the per-read error variation.
    pub seed: u64,
    /// [R] RBER of a fresh block (power-law offset, see `rber`).
    pub rber_fresh: f64,
    /// [R] RBER at the rated P/E count: just under the ECC limit, so that reads of a
    /// block near its rating start to need retries (the per-read variation below).
    pub rber_rated: f64,
    /// [R] Exponent of the power law in P/E cycles ([Mielke 2008]: RBER grows with
    /// cycling; [Hetzler 2012]: close to a power law of the cycle count near the origin).
    pub rber_exponent: u32,
    /// [R] RBER the ECC corrects without retry (hard-decision LDPC, order 1e-3, UNVERIFIED).
    pub ecc_rber_limit: f64,
    /// [R] Each read-retry step (a re-read with shifted read reference voltages, [Cai read
    /// retry]) divides the effective RBER by this.
    pub retry_rber_gain: f64,
    /// [R] Read-retry steps before a read is declared uncorrectable.
    pub read_retry_max: u32,
    /// [R] A read's RBER varies around its block's by ± this / 100 (page-to-page and
    /// read-disturb variation), from a hash of (page, read count).
    pub read_variation_pct: u32,
}

impl Default for WearProfile {
    fn default() -> Self {
        WearProfile {
            rated_pe_cycles: 3_000,
            endurance_spread_pct: 10,
            spare_blocks_permille: 20,
            acceleration: 1,
            seed: 0,
            rber_fresh: 1e-7,
            rber_rated: 8e-4,
            rber_exponent: 2,
            ecc_rber_limit: 1e-3,
            retry_rber_gain: 2.0,
            read_retry_max: 8,
            read_variation_pct: 50,
        }
    }
}

impl WearProfile {
    /// RBER of a block with `pe` P/E cycles: rber_fresh + (rber_rated − rber_fresh) ×
    /// (pe / rated)^k. Integer exponent: plain multiplications, the same on every host.
    pub fn rber(&self, pe: u32) -> f64 {
        let w = pe as f64 / self.rated_pe_cycles as f64;
        let mut wk = 1.0;
        for _ in 0..self.rber_exponent {
            wk *= w;
        }
        self.rber_fresh + (self.rber_rated - self.rber_fresh) * wk
    }

    /// Read-retry steps a read at `rber` needs: the fewest n with rber / gain^n within
    /// the ECC limit; `None` past `read_retry_max` (uncorrectable).
    pub fn retries_for(&self, rber: f64) -> Option<u32> {
        let mut e = rber;
        for n in 0..=self.read_retry_max {
            if e <= self.ecc_rber_limit {
                return Some(n);
            }
            e /= self.retry_rber_gain;
        }
        None
    }

    pub(crate) fn validate(&self) {
        assert!(self.rated_pe_cycles > 0 && self.acceleration > 0);
        assert!(self.endurance_spread_pct < 100 && self.read_variation_pct < 100);
        assert!(self.retry_rber_gain > 1.0 && self.ecc_rber_limit > 0.0);
        // A fresh drive must never retry, so its timing is the model's without wear.
        let worst_fresh = self.rber_fresh * (100 + self.read_variation_pct) as f64 / 100.0;
        assert!(
            worst_fresh <= self.ecc_rber_limit,
            "a fresh block's RBER must be within the ECC limit"
        );
    }
}

/// NVMe SMART / Health snapshot of the drive.
///
/// `critical_warning` bits as in the NVMe Base Specification 2.0, SMART / Health
/// Information log (Log Identifier 02h), Critical Warning (byte 0):
/// - bit 0: available spare has fallen below the threshold
///   (`available_spare_pct < available_spare_threshold_pct`);
/// - bit 1: temperature (not modelled, always 0);
/// - bit 2: NVM subsystem reliability degraded due to excessive media or internal
///   errors; here: percentage used ≥ 100 or media errors ≥ `MEDIA_ERRORS_DEGRADED` [R];
/// - bit 3: media placed in read-only mode; here: a block failed with no spare left;
/// - bit 4: volatile memory backup failed (not modelled, always 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Health {
    pub critical_warning: u8,
    /// Lifetime P/E cycles per block slot / rated × 100, saturating at 255 (NVMe
    /// "Percentage Used": may exceed 100).
    pub percentage_used: u8,
    /// Spare blocks left / spare blocks at start × 100, rounded up (0 only when none left).
    pub available_spare_pct: u8,
    pub available_spare_threshold_pct: u8,
    /// Uncorrectable host reads.
    pub media_errors: u64,
    /// Read-retry steps taken by host reads.
    pub read_retries: u64,
    /// Blocks retired (replaced by a spare, or the one that found none).
    pub bad_blocks: u32,
    pub spare_blocks: u32,
    /// Lifetime P/E cycles per block slot (including those of retired blocks).
    pub pe_cycles_avg: u32,
    /// Most P/E cycles of any block in service.
    pub pe_cycles_max: u32,
    pub rated_pe_cycles: u32,
    pub read_only: bool,
}

/// Per-drive wear state; all tables sized at construction.
#[derive(Clone)]
pub(crate) struct Wear {
    /// P/E cycles of the block in service, per (LUN × lines + line).
    pub(crate) pe: Vec<u32>,
    /// Its endurance (P/E cycles it survives).
    endurance: Vec<u32>,
    rng: SplitMix64,
    total_pe: u64,
    spares_total: u32,
    spares_left: u32,
    bad_blocks: u32,
    read_only: bool,
    media_errors: u64,
    read_retries: u64,
    /// Host flash reads so far: with the page, the key of the per-read variation.
    reads: u64,
    /// Least RBER of every read: an injected fault's (`fault::FaultPlan`), else 0.
    pub(crate) rber_floor: f64,
}

impl Wear {
    pub(crate) fn new(w: &WearProfile, blocks: u32) -> Self {
        let mut rng = SplitMix64::seed_from_u64(w.seed ^ 0x5EED_0F3E_A8A8);
        let endurance = (0..blocks).map(|_| draw_endurance(w, &mut rng)).collect();
        let spares_total = (blocks as u64 * w.spare_blocks_permille as u64 / 1000).max(1) as u32;
        Wear {
            pe: vec![0; blocks as usize],
            endurance,
            rng,
            total_pe: 0,
            spares_total,
            spares_left: spares_total,
            bad_blocks: 0,
            read_only: false,
            media_errors: 0,
            read_retries: 0,
            reads: 0,
            rber_floor: 0.0,
        }
    }

    pub(crate) fn read_only(&self) -> bool {
        self.read_only
    }

    /// One erase of block `b`: count its cycles; retire it past its endurance.
    pub(crate) fn on_erase(&mut self, w: &WearProfile, b: usize) {
        self.pe[b] = self.pe[b].saturating_add(w.acceleration);
        self.total_pe += w.acceleration as u64;
        if self.pe[b] <= self.endurance[b] {
            return;
        }
        self.bad_blocks += 1;
        if self.spares_left == 0 {
            // Accounting only: the block stays in the geometry, the drive goes read-only.
            self.read_only = true;
            return;
        }
        self.spares_left -= 1;
        // A never-erased spare takes the block's place.
        self.pe[b] = 0;
        self.endurance[b] = draw_endurance(w, &mut self.rng);
    }

    /// A host read of a flash page of block `b` at `ppa`: the retry steps it takes, or
    /// `None` if uncorrectable (it then took `read_retry_max` steps). Counts both.
    pub(crate) fn on_read(&mut self, w: &WearProfile, b: usize, ppa: u32) -> Option<u32> {
        self.reads += 1;
        let pe = self.pe[b];
        if pe == 0 && self.rber_floor <= 0.0 {
            return Some(0);
        }
        let h = mix64(((ppa as u64) << 32) ^ self.reads ^ w.seed);
        // u in [0, 1): the read's place in ± read_variation_pct.
        let u = (h >> 11) as f64 / (1u64 << 53) as f64;
        let v = w.read_variation_pct as f64 / 100.0;
        let rber = w.rber(pe).max(self.rber_floor) * (1.0 + v * (2.0 * u - 1.0));
        let r = w.retries_for(rber);
        self.read_retries += r.unwrap_or(w.read_retry_max) as u64;
        self.media_errors += r.is_none() as u64;
        r
    }

    pub(crate) fn health(&self, w: &WearProfile) -> Health {
        let slots = self.pe.len() as u64;
        let avg = self.total_pe / slots;
        let used = (self.total_pe * 100 / (slots * w.rated_pe_cycles as u64))
            .min(PERCENTAGE_USED_MAX) as u8;
        let spare = (self.spares_left as u64 * 100).div_ceil(self.spares_total as u64) as u8;
        let mut cw = 0;
        if spare < AVAILABLE_SPARE_THRESHOLD_PCT {
            cw |= 1 << 0;
        }
        if used >= 100 || self.media_errors >= MEDIA_ERRORS_DEGRADED {
            cw |= 1 << 2;
        }
        if self.read_only {
            cw |= 1 << 3;
        }
        Health {
            critical_warning: cw,
            percentage_used: used,
            available_spare_pct: spare,
            available_spare_threshold_pct: AVAILABLE_SPARE_THRESHOLD_PCT,
            media_errors: self.media_errors,
            read_retries: self.read_retries,
            bad_blocks: self.bad_blocks,
            spare_blocks: self.spares_total,
            pe_cycles_avg: avg.min(u32::MAX as u64) as u32,
            pe_cycles_max: self.pe.iter().copied().max().unwrap_or(0),
            rated_pe_cycles: w.rated_pe_cycles,
            read_only: self.read_only,
        }
    }
}

/// Endurance uniform in rated × (100 ± spread) / 100.
fn draw_endurance(w: &WearProfile, rng: &mut SplitMix64) -> u32 {
    let s = w.endurance_spread_pct as u64;
    let pct = 100 - s + rng.next_u64() % (2 * s + 1);
    (w.rated_pe_cycles as u64 * pct / 100) as u32
}

/// The splitmix64 finaliser: a stateless hash for the per-read variation.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
