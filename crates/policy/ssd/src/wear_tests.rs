//! Wear and failure (docs/ssd-model.md, "Wear and failure"): expected figures are
//! computed from the model's rules, not recorded from runs.

use super::*;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;

const RATED: u32 = 3_000;
const SPREAD_PCT: u32 = 10;

/// A tiny FTL drive (2 LUNs × 16 lines × 64 pages: 32 blocks) that wears out fast:
/// 300 P/E cycles per erase, so a block retires after 9–12 erases, and 16 spares.
fn wearing_profile(seed: u64) -> SsdProfile {
    let mut p = SsdProfile::femu().with_blocks(16);
    p.channels = 2;
    p.luns_per_channel = 1;
    p.pages_per_block = 64;
    p.wear = WearProfile {
        rated_pe_cycles: RATED,
        endurance_spread_pct: SPREAD_PCT,
        spare_blocks_permille: 500,
        acceleration: 300,
        seed,
        ..WearProfile::default()
    };
    p
}

const BLOCKS: u64 = 32;
const SPARES: u32 = 16;

/// The health rules, checked against the counters they derive from.
fn check_rules(ssd: &Ssd, h: &Health) {
    let w = &ssd.profile().wear;
    let total_pe = ssd.stats().erases * w.acceleration as u64;
    assert_eq!(h.pe_cycles_avg as u64, total_pe / BLOCKS);
    let used = (total_pe * 100 / (BLOCKS * RATED as u64)).min(255);
    assert_eq!(h.percentage_used as u64, used);
    assert_eq!(h.spare_blocks, SPARES);
    let left = SPARES - h.bad_blocks.min(SPARES);
    assert_eq!(h.available_spare_pct as u32, (left * 100).div_ceil(SPARES));
    // Each retired block had passed its endurance, at least rated × (1 − spread): their
    // cycles are disjoint parts of the drive's lifetime total.
    let min_endurance = (RATED * (100 - SPREAD_PCT) / 100) as u64;
    assert!(h.bad_blocks as u64 * min_endurance < total_pe.max(1));
    if !h.read_only {
        // No block in service outlives the top of the spread.
        assert!(h.pe_cycles_max <= RATED * (100 + SPREAD_PCT) / 100);
    }
    assert_eq!(h.read_only, h.bad_blocks > SPARES);
    let bit = |b: u8| h.critical_warning & (1 << b) != 0;
    assert_eq!(
        bit(0),
        h.available_spare_pct < AVAILABLE_SPARE_THRESHOLD_PCT
    );
    assert_eq!(bit(2), h.percentage_used >= 100 || h.media_errors >= 1);
    assert_eq!(bit(3), h.read_only);
    assert_eq!(
        h.critical_warning & !0b1101,
        0,
        "only bits 0, 2, 3 are modelled"
    );
}

#[test]
fn fresh_drive_is_healthy() {
    for p in [
        SsdProfile::femu(),
        SsdProfile::nvmevirt_970pro(),
        SsdProfile::pm9a3(),
    ] {
        let h = Ssd::new(p.with_blocks(16)).health();
        assert_eq!(h.percentage_used, 0);
        assert_eq!(h.available_spare_pct, 100);
        assert_eq!(h.critical_warning, 0);
        assert_eq!((h.bad_blocks, h.media_errors, h.read_retries), (0, 0, 0));
        assert_eq!(
            (h.pe_cycles_avg, h.pe_cycles_max, h.rated_pe_cycles),
            (0, 0, RATED)
        );
        assert_eq!(h.available_spare_threshold_pct, 10);
    }
}

#[test]
fn default_wear_never_retries_on_a_fragmented_drive() {
    // Real wear (1 cycle per erase) after a full fragmenting overwrite and a mixed run:
    // erases happened, but far below the rating, so no read retried (timing unchanged).
    let mut ssd = Ssd::new(SsdProfile::pm9a3().with_blocks(16));
    ssd.precondition(
        Precondition::Fragmented {
            overwrite_permille: 1000,
        },
        3,
    );
    let mut rng = SplitMix64::seed_from_u64(5);
    let pages = ssd.logical_bytes() / 4096;
    for i in 1..=5_000u64 {
        let dir = if i % 4 == 0 {
            IoDir::Write
        } else {
            IoDir::Read
        };
        let c = ssd.submit_checked(dir, (rng.next_u64() % pages) * 4096, 4096, i * 20_000);
        assert!(!c.media_error && !c.read_only);
    }
    let h = ssd.health();
    assert!(h.pe_cycles_max > 0, "GC erased blocks");
    assert_eq!((h.read_retries, h.media_errors, h.bad_blocks), (0, 0, 0));
    assert_eq!(h.critical_warning, 0);
    assert_eq!(h.available_spare_pct, 100);
}

#[test]
fn rber_follows_the_power_law_and_retries_halve_it() {
    let w = WearProfile::default();
    // rber(pe) = 1e-7 + (8e-4 − 1e-7) × (pe / 3000)².
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1e-30);
    assert!(close(w.rber(0), 1e-7));
    assert!(close(w.rber(1_500), 1e-7 + 7.999e-4 / 4.0));
    assert!(close(w.rber(3_000), 8e-4));
    assert!(close(w.rber(6_000), 1e-7 + 4.0 * 7.999e-4));
    // Doubling the cycles quadruples the wear term (exponent 2).
    let term = |pe| w.rber(pe) - w.rber_fresh;
    assert!(close(term(2_000), 4.0 * term(1_000)));
    // ECC limit 1e-3, each retry halves, at most 8 retries.
    assert_eq!(w.retries_for(w.rber(3_000)), Some(0));
    assert_eq!(w.retries_for(1.5e-3), Some(1));
    assert_eq!(w.retries_for(w.rber(6_000)), Some(2)); // 3.2e-3 → 1.6e-3 → 8e-4
    assert_eq!(w.retries_for(255e-3), Some(8));
    assert_eq!(w.retries_for(257e-3), None);
}

#[test]
#[should_panic(expected = "fresh block's RBER")]
fn a_profile_whose_fresh_reads_would_retry_is_rejected() {
    let mut p = SsdProfile::femu();
    p.wear.rber_fresh = 2e-3;
    Ssd::new(p);
}

/// Random 4 KiB overwrites (and a read every `read_every`-th I/O, 0 = none) until the
/// drive goes read-only or `max_ios` ran; checks the rules and monotonicity every 64.
fn wear_out(ssd: &mut Ssd, seed: u64, max_ios: u64, read_every: u64) -> Vec<Health> {
    let mut rng = SplitMix64::seed_from_u64(seed);
    let pages = ssd.logical_bytes() / 4096;
    let mut seen = vec![ssd.health()];
    for i in 1..=max_ios {
        let dir = if read_every > 0 && i % read_every == 0 {
            IoDir::Read
        } else {
            IoDir::Write
        };
        let c = ssd.submit_checked(dir, (rng.next_u64() % pages) * 4096, 4096, i * 250_000);
        if i % 64 == 0 || c.read_only {
            let h = ssd.health();
            check_rules(ssd, &h);
            let last = seen.last().unwrap();
            assert!(h.percentage_used >= last.percentage_used);
            assert!(h.available_spare_pct <= last.available_spare_pct);
            assert!(h.bad_blocks >= last.bad_blocks);
            seen.push(h);
        }
        if c.read_only {
            break;
        }
    }
    seen
}

#[test]
fn accelerated_wear_consumes_spares_then_goes_read_only() {
    let mut ssd = Ssd::new(wearing_profile(11));
    let seen = wear_out(&mut ssd, 1, 2_000_000, 0);
    let h = *seen.last().unwrap();
    assert!(h.read_only, "the drive wore out: {h:?}");
    // The order of events: wear first, then bad blocks, then low spare, then read-only.
    let first = |f: &dyn Fn(&Health) -> bool| seen.iter().position(f).unwrap();
    let t_used = first(&|h| h.percentage_used > 0);
    let t_bad = first(&|h| h.bad_blocks > 0);
    let t_low = first(&|h| h.critical_warning & 1 != 0);
    let t_ro = first(&|h| h.critical_warning & 8 != 0);
    assert!(
        t_used < t_bad && t_bad < t_low && t_low <= t_ro,
        "{t_used} {t_bad} {t_low} {t_ro}"
    );
    // Spare pcts of 16 spares are ⌈100 k / 16⌉: below 10 % means k ≤ 1 (7 % or 0 %).
    assert!(seen[t_low].available_spare_pct <= 7);
    assert_eq!(h.available_spare_pct, 0);
    assert_eq!(h.bad_blocks, SPARES + 1);
    check_rules(&ssd, &h);
    // Read-only: a write is refused after its firmware time and writes nothing; reads work.
    let writes = ssd.stats().writes;
    let t = 1u64 << 50;
    let c = ssd.submit_checked(IoDir::Write, 0, 4096, t);
    assert!(c.read_only && !c.media_error);
    assert_eq!(c.done_ns, t + ssd.profile().fw_write_ns);
    assert_eq!(ssd.stats().writes, writes);
    let r = ssd.submit_checked(IoDir::Read, 0, 4096, t);
    assert!(!r.read_only && r.done_ns > t);
    ssd.check_invariants();
}

#[test]
fn same_seed_and_workload_give_the_same_health() {
    let run = |seed| {
        let mut ssd = Ssd::new(wearing_profile(seed));
        let seen = wear_out(&mut ssd, 2, 60_000, 3);
        (*seen.last().unwrap(), ssd.stats())
    };
    let (a, sa) = run(7);
    let (b, sb) = run(7);
    assert_eq!(a, b);
    assert_eq!(sa, sb);
    // Reads of blocks near their rating (RBER 8e-4 × (1 ± 50 %) straddles the 1e-3 ECC
    // limit) retried.
    assert!(a.read_retries > 0, "{a:?}");
}

/// A drive with LPN 0 written and its programs done; returns (drive, block of LPN 0).
fn drive_with_page(wear: WearProfile) -> (Ssd, usize) {
    let mut p = SsdProfile::femu().with_blocks(16);
    p.wear = wear;
    let mut ssd = Ssd::new(p);
    ssd.submit(IoDir::Write, 0, 4096, 0);
    let ppa = ssd.map[0];
    let (_, lun, _) = ssd.locate(ppa);
    let block = (lun * ssd.lines.len() as u32 + ppa / ssd.pages_per_line) as usize;
    (ssd, block)
}

const T_READ_NS: u64 = 40_000; // femu tR
const T_IDLE_NS: u64 = 1_000_000; // after the 200 µs program

#[test]
fn worn_block_reads_take_whole_t_r_retry_steps() {
    let exact = WearProfile {
        read_variation_pct: 0,
        ..WearProfile::default()
    };
    let (mut fresh, _) = drive_with_page(exact.clone());
    let f = fresh.submit_checked(IoDir::Read, 0, 4096, T_IDLE_NS);
    assert_eq!(f.done_ns - T_IDLE_NS, T_READ_NS);
    // 6,000 P/E = 2 × rated: RBER 3.2e-3 needs 2 halvings to reach 1e-3.
    let (mut worn, b) = drive_with_page(exact);
    worn.wear.pe[b] = 2 * RATED;
    let w = worn.submit_checked(IoDir::Read, 0, 4096, T_IDLE_NS);
    assert!(!w.media_error);
    assert_eq!(w.done_ns - T_IDLE_NS, (1 + 2) * T_READ_NS);
    assert_eq!(w.done_ns - f.done_ns, 2 * T_READ_NS);
    let h = worn.health();
    assert_eq!((h.read_retries, h.media_errors), (2, 0));
    // The retries held the LUN: a second read queues behind the first's three tR.
    let w2 = worn.submit(IoDir::Read, 0, 4096, T_IDLE_NS);
    assert_eq!(w2 - T_IDLE_NS, 2 * 3 * T_READ_NS);
}

#[test]
fn past_the_retry_limit_a_read_is_a_media_error() {
    let (mut ssd, b) = drive_with_page(WearProfile {
        read_variation_pct: 0,
        read_retry_max: 1,
        ..WearProfile::default()
    });
    ssd.wear.pe[b] = 2 * RATED; // needs 2 retries, 1 allowed
    let c = ssd.submit_checked(IoDir::Read, 0, 4096, T_IDLE_NS);
    assert!(c.media_error && !c.read_only);
    // It gave up after its one retry: tR + 1 retry.
    assert_eq!(c.done_ns - T_IDLE_NS, 2 * T_READ_NS);
    let h = ssd.health();
    assert_eq!((h.media_errors, h.read_retries), (1, 1));
    assert_eq!(h.critical_warning, 1 << 2, "reliability degraded only");
    // A read of an unworn block of the same drive is clean.
    let ok = ssd.submit_checked(IoDir::Read, 4096 * 3, 4096, T_IDLE_NS);
    assert!(!ok.media_error);
}

/// An injected fault's RBER floor (fault.rs) reaches fresh blocks too: one retry
/// step per doubling past the ECC limit, each one more tR on the LUN, so an idle
/// drive's read takes (1 + steps) × tR plus its transfers; past the last step the
/// read is a media error; a floor of 0 gives the fresh drive's timing back.
#[test]
fn an_rber_floor_slows_reads_of_fresh_blocks_then_makes_them_uncorrectable() {
    let p = wearing_profile(7);
    let w = p.wear.clone();
    let mut ssd = Ssd::new(p);
    ssd.precondition(Precondition::Clean, 1);
    let mut t = 1_000_000_000u64;
    let mut read = |ssd: &mut Ssd| {
        t += 1_000_000_000; // idle in between: no queueing, GC done
        let c = ssd.submit_checked(IoDir::Read, 0, 4096, t);
        (c.done_ns - t, c.media_error)
    };
    let (fresh, err) = read(&mut ssd);
    assert!(!err);
    let t_r = ssd.profile().read_lsb_ns;
    for steps in 1..=w.read_retry_max {
        // Mid-step; the per-read variation (x0.5 to x1.5) moves a read by at most
        // one step either way.
        let floor = w.ecc_rber_limit * w.retry_rber_gain.powf(f64::from(steps) - 0.5);
        ssd.set_rber_floor(floor);
        let (took, err) = read(&mut ssd);
        assert!(!err, "{steps} steps");
        let extra = took - fresh;
        assert_eq!(extra % t_r, 0, "{steps} steps: whole tRs");
        let r = extra / t_r;
        assert!(
            r.abs_diff(u64::from(steps)) <= 1,
            "{steps} steps: {r} retries"
        );
    }
    ssd.set_rber_floor(
        w.ecc_rber_limit * w.retry_rber_gain.powf(f64::from(w.read_retry_max) + 1.5),
    );
    assert!(read(&mut ssd).1, "past the last step: uncorrectable");
    assert_eq!(ssd.health().media_errors, 1);
    ssd.set_rber_floor(0.0);
    assert_eq!(read(&mut ssd), (fresh, false));
}
