//! Hand-computed cases: the worked examples Ex 4-n of docs/ssd-model.md (§4.2, Tests).

use super::*;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;

fn femu_small() -> Ssd {
    Ssd::new(SsdProfile::femu().with_blocks(16))
}

#[test]
fn femu_read_idle_lun_takes_t_r_and_queues_per_lun() {
    // Ex 4-1: 40 µs alone; two reads to the same LUN at t = 0 finish at 40 and 80 µs.
    let mut ssd = femu_small();
    assert_eq!(ssd.submit(IoDir::Read, 0, 4096, 0), 40_000);
    assert_eq!(ssd.submit(IoDir::Read, 0, 4096, 0), 80_000);
    // LPN 1 stripes onto channel 1: an idle LUN, so 40 µs again.
    assert_eq!(ssd.submit(IoDir::Read, 4096, 4096, 0), 40_000);
}

#[test]
fn femu_read_waits_for_program_on_same_lun() {
    // Ex 4-2: a 4 KiB write at t = 0 programs ch0/LUN0 until 200 µs; a read of that
    // page at 10 µs starts at 200 and ends at 240 (latency 230 µs).
    let mut ssd = femu_small();
    assert_eq!(ssd.submit(IoDir::Write, 0, 4096, 0), 200_000);
    let done = ssd.submit(IoDir::Read, 0, 4096, 10_000);
    assert_eq!(done, 240_000);
    assert_eq!(done - 10_000, 230_000);
}

#[test]
fn femu_read_under_concurrent_writes_follows_lun_busy_rule() {
    // Two 32 KiB writes at t = 0 on a fresh device: the write pointer stripes channels
    // first, so they busy LUN 0 and then LUN 1 of every channel until 200 µs.
    let mut ssd = femu_small();
    assert_eq!(ssd.submit(IoDir::Write, 0, 32768, 0), 200_000);
    assert_eq!(ssd.submit(IoDir::Write, 32768, 32768, 0), 200_000);
    // Reading LPN 9 (channel 1, LUN 1) at 50 µs waits for its program: 200 + 40.
    assert_eq!(ssd.submit(IoDir::Read, 9 * 4096, 4096, 50_000), 240_000);
    // LPN 1040 is unwritten; its home (1040 mod 16384) is channel 0, LUN 2: idle, 50 + 40.
    assert_eq!(ssd.submit(IoDir::Read, 1040 * 4096, 4096, 50_000), 90_000);
}

#[test]
fn femu_16k_write_stripes_over_four_channels() {
    // Ex 4-3: 4 LPNs land on channels 0-3, LUN 0; all program in parallel: 200 µs.
    let mut ssd = femu_small();
    assert_eq!(ssd.submit(IoDir::Write, 0, 16384, 0), 200_000);
    // A second 16 KiB write continues on channels 4-7: still parallel, 200 µs.
    assert_eq!(ssd.submit(IoDir::Write, 16384, 16384, 0), 200_000);
    // The third wraps to LUN 1 of channels 0-3: also idle, 200 µs.
    assert_eq!(ssd.submit(IoDir::Write, 32768, 16384, 0), 200_000);
}

#[test]
fn nvmevirt_read_and_write_match_hand_computation() {
    // Ex 4-5: 21,500 + 29,760 + 32 × 152 + 32 × 36 = 57,276 ns (LSB page).
    let mut ssd = Ssd::new(SsdProfile::nvmevirt_970pro());
    assert_eq!(xfer_ns(4096, 800), 32 * 152);
    assert_eq!(xfer_ns(4096, 3360), 32 * 36);
    assert_eq!(ssd.submit(IoDir::Read, 0, 4096, 0), 57_276);
    // Ex 4-6: a 4 KiB write with early completion: 4,000 + 460 + 1,152 = 5,612 ns.
    let mut ssd = Ssd::new(SsdProfile::nvmevirt_970pro());
    assert_eq!(ssd.submit(IoDir::Write, 0, 4096, 0), 5_612);
}

#[test]
fn nvmevirt_one_shot_flush_keeps_lun_busy() {
    // Ex 4-6: after eight 4 KiB writes fill one 32 KiB one-shot page, the flush keeps
    // LUN 0 busy for 256 × 152 + 185,000 ns. A read of that page then waits for it.
    let mut ssd = Ssd::new(SsdProfile::nvmevirt_970pro());
    let mut t1 = 0;
    for i in 0..8 {
        t1 = ssd.submit(IoDir::Write, i * 4096, 4096, 0);
    }
    // The last write's early completion: fw + 8 PCIe transfers sharing 2 µs ledger slots
    // (between fully parallel and fully serialised).
    assert!((4_460 + 1_152..=4_460 + 8 * 1_152).contains(&t1), "{t1}");
    let flush_end = t1 + 256 * 152 + 185_000;
    let read_done = ssd.submit(IoDir::Read, 0, 4096, t1);
    assert_eq!(read_done, flush_end + 29_760 + 32 * 152 + 32 * 36);
}

#[test]
fn gc_keeps_mapping_consistent_and_runs_when_fragmented() {
    let mut ssd = femu_small();
    ssd.precondition(
        Precondition::Fragmented {
            overwrite_permille: 1000,
        },
        7,
    );
    ssd.check_invariants();
    assert!(ssd.free_lines() > 0);
    let mut t = 0;
    for i in 0..20_000u64 {
        let lpn = (i * 7919) % (ssd.logical_bytes() / 4096);
        t += 10_000;
        ssd.submit(IoDir::Write, lpn * 4096, 4096, t);
    }
    ssd.check_invariants();
    let s = ssd.stats();
    assert!(
        s.gc_runs > 0,
        "random overwrites of a full device must trigger GC"
    );
    assert!(s.gc_pages_moved > 0);
    assert_eq!(s.pages_written, 20_000 + s.gc_pages_moved);
}

#[test]
fn fragmented_device_writes_slower_than_clean() {
    // Same random-write stream; GC relocation and erases lengthen LUN busy time.
    let run = |state| {
        let mut ssd = femu_small();
        ssd.precondition(state, 1);
        let pages = ssd.logical_bytes() / 4096;
        let mut last = 0;
        for i in 0..5_000u64 {
            last =
                last.max(ssd.submit(IoDir::Write, (i * 104_729 % pages) * 4096, 4096, i * 1_000));
        }
        last
    };
    let clean = run(Precondition::Empty);
    let frag = run(Precondition::Fragmented {
        overwrite_permille: 1000,
    });
    assert!(
        frag > clean,
        "fragmented {frag} should exceed clean {clean}"
    );
}

#[test]
fn write_buffer_stalls_when_nand_is_slower_than_pcie() {
    // 64 MiB of 64 KiB writes at t = 0. PCIe alone would take 64 MiB × 36 ns / 128 B
    // = 18.87 ms, but NAND drains at 16 LUNs × 32 KiB / (38,912 + 185,000 ns) = 2.341 GB/s,
    // i.e. 28.66 ms; with a 1 MiB buffer the early completions must track the NAND rate.
    let mut ssd = Ssd::new(SsdProfile::nvmevirt_970pro());
    let mut last = 0;
    for i in 0..1024u64 {
        last = ssd.submit(IoDir::Write, i * 65536, 65536, 0);
    }
    assert!(ssd.stats().write_buffer_stalls > 0);
    let nand_bound_ns = (64u64 << 20) * 223_912 / (16 * 32768);
    assert!(
        last > nand_bound_ns - 1_000_000,
        "last {last} vs NAND bound {nand_bound_ns}"
    );
    assert!(
        last < nand_bound_ns + 1_000_000,
        "last {last} vs NAND bound {nand_bound_ns}"
    );
}

/// Preconditioned (fragmented) drives in recorded results depend on this
/// stream: rand_xoshiro's SplitMix64 must equal the standard splitmix64 that
/// was hand-written here before.
#[test]
fn splitmix64_from_rand_xoshiro_is_the_standard_stream() {
    use rand_xoshiro::rand_core::{RngCore, SeedableRng};
    fn former(s: &mut u64) -> u64 {
        *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    for seed in [0u64, 1, 7, 0x9E37_79B9_7F4A_7C15, u64::MAX] {
        let mut a = rand_xoshiro::SplitMix64::seed_from_u64(seed);
        let mut b = seed;
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), former(&mut b), "seed {seed:#x}");
        }
    }
}

// ---- Time-driven incremental GC ----

fn pm9a3_small() -> SsdProfile {
    SsdProfile::pm9a3().with_blocks(16)
}

const FRAGMENTED: Precondition = Precondition::Fragmented {
    overwrite_permille: 1000,
};

/// Deterministic 4 KiB-aligned random offsets within the drive.
fn rand_lpn(rng: &mut SplitMix64, ssd: &Ssd) -> u64 {
    rng.next_u64() % (ssd.logical_bytes() / 4096)
}

/// The slowest 4 KiB read of an idle drive (MSB page, all transfers uncontended).
fn idle_read_max_ns(p: &SsdProfile) -> u64 {
    let mut worst = 0;
    for lpn in 0..2 * (p.channels * p.luns_per_channel * p.flash_page_bytes / p.page_bytes) as u64 {
        let mut ssd = Ssd::new(p.clone());
        worst = worst.max(ssd.submit(IoDir::Read, lpn * 4096, 4096, 0));
    }
    worst
}

/// Precondition fragmented and make the first submit (the end of preconditioning, model
/// time `epoch_int_ns`); returns when the LUNs are past what was queued then (at most
/// one GC operation each), so that later waits come from GC in the run.
fn fragmented_after_backlog(p: &SsdProfile) -> (Ssd, u64) {
    let mut ssd = Ssd::new(p.clone());
    ssd.precondition(FRAGMENTED, 1);
    let backlog_ns = ssd.lun_avail_ns.iter().max().unwrap() - ssd.epoch_int_ns;
    ssd.submit(IoDir::Read, 0, 4096, 0);
    (ssd, backlog_ns)
}

/// Open-loop 4 KiB random reads every `gap_ns` from `t0`; returns the latencies.
fn read_run(ssd: &mut Ssd, seed: u64, n: u64, gap_ns: u64, t0: u64) -> Vec<u64> {
    let mut rng = SplitMix64::seed_from_u64(seed);
    (1..=n)
        .map(|i| {
            let t = t0 + i * gap_ns;
            let lpn = rand_lpn(&mut rng, ssd);
            ssd.submit(IoDir::Read, lpn * 4096, 4096, t) - t
        })
        .collect()
}

/// The symptom: preconditioning reset the clocks and GC ran only inside writes,
/// so a read-only run on a fragmented drive never met GC.
#[test]
fn read_only_run_on_fragmented_drive_meets_gc() {
    let p = pm9a3_small();
    // Anything slower than an idle read plus one program waited behind GC, not behind
    // other reads (open loop at 20 µs over 32 LUNs keeps LUNs < 10 % busy with reads).
    let slow_ns = idle_read_max_ns(&p) + p.program_ns;
    let (mut frag, t0) = fragmented_after_backlog(&p);
    assert!(
        frag.free_lines() <= frag.gc_lo_lines,
        "precondition left no GC debt"
    );
    let lat = read_run(&mut frag, 3, 2_000, 20_000, t0);
    let s = frag.stats();
    assert_eq!(s.writes, 0);
    assert!(s.gc_background_steps > 0, "{s:?}");
    assert!(s.gc_pages_moved > 0, "{s:?}");
    let slow = lat.iter().filter(|&&l| l > slow_ns).count();
    assert!(slow > 0, "no read waited behind GC");
    frag.check_invariants();
    // The same reads on a clean drive meet no GC and no such wait.
    let mut clean = Ssd::new(p);
    clean.precondition(Precondition::Clean, 1);
    let lat = read_run(&mut clean, 3, 2_000, 20_000, 0);
    assert_eq!(clean.stats().gc_background_steps, 0);
    assert!(lat.iter().all(|&l| l <= slow_ns));
}

/// The longest single NAND operation a GC step puts on one LUN: an erase, a flash-page
/// read, or a GC program (channel transfer + tPROG).
fn gc_op_max_ns(p: &SsdProfile) -> u64 {
    let prog = xfer_ns(p.flash_page_bytes as u64, p.channel_mb_s.max(1)) + p.program_ns;
    p.erase_ns.max(prog).max(p.read_full_msb_ns)
}

/// While GC works only in the background, a read finds at most one GC operation ahead
/// of it on its LUN, never a whole block's relocation.
#[test]
fn read_waits_behind_at_most_one_gc_step() {
    let p = pm9a3_small();
    let (mut ssd, t0) = fragmented_after_backlog(&p);
    let lat = read_run(&mut ssd, 5, 5_000, 20_000, t0);
    let s = ssd.stats();
    assert!(s.gc_background_steps > 100, "{s:?}");
    assert_eq!(s.gc_foreground_steps, 0);
    // Slack for other reads queued on the same LUN or channel at 20 µs arrivals.
    let bound = idle_read_max_ns(&p) + gc_op_max_ns(&p) + 4 * p.read_full_msb_ns;
    let max = *lat.iter().max().unwrap();
    assert!(max <= bound, "max read {max} ns > bound {bound} ns");
}

/// Random 4 KiB reads and writes (3:1) on a fragmented pm9a3: the old model relocated a
/// whole victim line inside one write, keeping each LUN busy for its block's valid pages
/// (tR each, the programs spread over all LUNs) plus an erase. The slowest read now stays
/// far below that, computed here from the geometry and the run's own victims.
#[test]
fn mixed_load_read_latency_is_far_below_whole_line_stall() {
    let p = pm9a3_small();
    let (mut ssd, t0) = fragmented_after_backlog(&p);
    let mut rng = SplitMix64::seed_from_u64(9);
    let mut max_read = 0;
    for i in 1..=40_000u64 {
        let t = t0 + i * 25_000;
        let lpn = rand_lpn(&mut rng, &ssd);
        let dir = if i % 4 == 0 {
            IoDir::Write
        } else {
            IoDir::Read
        };
        let done = ssd.submit(dir, lpn * 4096, 4096, t);
        if dir == IoDir::Read {
            max_read = max_read.max(done - t);
        }
    }
    ssd.check_invariants();
    let s = ssd.stats();
    assert!(s.gc_runs >= 2, "{s:?}");
    // Valid share of the victims collected in this run.
    let ppl = (p.channels * p.luns_per_channel * p.pages_per_block) as u64;
    let valid_per_block = s.gc_pages_moved * p.pages_per_block as u64 / (s.gc_runs * ppl);
    let sub = (p.flash_page_bytes / p.page_bytes) as u64;
    let old_stall_ns =
        valid_per_block * p.read_lsb_ns + valid_per_block / sub * p.program_ns + p.erase_ns;
    assert!(
        max_read * 4 < old_stall_ns,
        "max read {max_read} ns vs whole-line stall {old_stall_ns} ns ({s:?})"
    );
}

/// Replays `precondition`'s fragmenting overwrites through the public `submit`: the same
/// random stream at the same queue depth. Returns the model time the run then starts
/// (the overwrites all on flash).
fn replay_overwrites(ssd: &mut Ssd, overwrite_permille: u32, seed: u64) -> u64 {
    let n = ssd.logical_pages as u64 * overwrite_permille as u64 / 1000;
    let mut rng = SplitMix64::seed_from_u64(seed ^ 0x9E37_79B9_7F4A_7C15);
    let mut done = [0u64; PRECONDITION_QD];
    let mut t = 0;
    for i in 0..n {
        let lpn = rng.next_u64() % ssd.logical_pages as u64;
        let slot = (i % PRECONDITION_QD as u64) as usize;
        t = t.max(done[slot]);
        done[slot] = ssd.submit(IoDir::Write, lpn * 4096, 4096, t);
    }
    t.max(done[(n % PRECONDITION_QD as u64) as usize])
        .max(ssd.flash_idle_ns())
}

/// A mixed stream of 4 KiB reads and writes (3:1) over `lpns`, one every 40 µs from
/// `t0`; returns the latencies.
fn mixed_run(ssd: &mut Ssd, seed: u64, n: u64, lpns: std::ops::Range<u64>, t0: u64) -> Vec<u64> {
    let mut rng = SplitMix64::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let r = rng.next_u64();
            let t = t0 + i * 40_000;
            let lpn = lpns.start + (r >> 8) % (lpns.end - lpns.start);
            let dir = if r % 4 == 0 {
                IoDir::Write
            } else {
                IoDir::Read
            };
            ssd.submit(dir, lpn * 4096, 4096, t) - t
        })
        .collect()
}

/// Clean and fragmented are one FTL: a fragmented drive is exactly a clean drive given
/// the fragmenting writes. Run the same mixed stream on both afterwards (the fragmented
/// one from its first submit, the clean one from when its writes ended): every latency,
/// the GC work and the free lines agree.
#[test]
fn fragmented_drive_is_a_clean_drive_after_the_same_writes() {
    let p = pm9a3_small();
    let mut frag = Ssd::new(p.clone());
    frag.precondition(
        Precondition::Fragmented {
            overwrite_permille: 600,
        },
        4,
    );
    let mut clean = Ssd::new(p);
    clean.precondition(Precondition::Clean, 4);
    let t_end = replay_overwrites(&mut clean, 600, 4);
    assert!(clean.stats().gc_runs > 0, "the writes must have needed GC");
    let before = clean.stats();
    let all = 0..frag.logical_pages as u64;
    let a = mixed_run(&mut frag, 8, 20_000, all.clone(), 0);
    let b = mixed_run(&mut clean, 8, 20_000, all, t_end);
    if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
        panic!("latency {i} differs: {} vs {}", a[i], b[i]);
    }
    let (sa, sb) = (frag.stats(), clean.stats());
    assert_eq!(sa.gc_pages_moved, sb.gc_pages_moved - before.gc_pages_moved);
    assert_eq!(
        sa.gc_background_steps,
        sb.gc_background_steps - before.gc_background_steps
    );
    assert_eq!(sa.erases, sb.erases - before.erases);
    assert!(sa.gc_pages_moved > 0);
    assert_eq!(frag.free_lines(), clean.free_lines());
}

/// The static map (no tables, for simulations too large for them) is a clean FTL drive
/// whose GC has not started: writes and reads of data not rewritten in the window take
/// exactly the FTL's time. (A rewritten page is read from its home LUN rather than from
/// where the write pointer put it; both are uniform over LUNs.)
#[test]
fn static_map_matches_a_clean_ftl_drive_until_gc() {
    let p = pm9a3_small();
    let run = |static_map| {
        let mut ssd = Ssd::new(SsdProfile {
            static_map,
            ..p.clone()
        });
        ssd.precondition(Precondition::Clean, 1);
        let half = ssd.logical_pages as u64 / 2;
        // Writes to the first half, reads of the second: no read of rewritten data.
        let mut rng = SplitMix64::seed_from_u64(6);
        let mut lat = Vec::new();
        for i in 1..=20_000u64 {
            let r = rng.next_u64();
            let t = i * 10_000;
            let (dir, lpn) = if r % 4 == 0 {
                (IoDir::Write, (r >> 8) % half)
            } else {
                (IoDir::Read, half + (r >> 8) % half)
            };
            lat.push(ssd.submit(dir, lpn * 4096, 4096, t) - t);
        }
        (lat, ssd.stats())
    };
    let (ftl, s) = run(false);
    assert_eq!(
        s.gc_runs, 0,
        "the window must end before the FTL's first GC"
    );
    assert!(s.writes > 4_000);
    let (stat, _) = run(true);
    assert_eq!(ftl, stat);
}

/// Same profile, precondition, seed and stream: same completions, same state.
#[test]
fn gc_is_deterministic() {
    let run = || {
        let mut ssd = Ssd::new(pm9a3_small());
        ssd.precondition(FRAGMENTED, 2);
        let all = 0..ssd.logical_pages as u64;
        let lat = mixed_run(&mut ssd, 11, 30_000, all, 5_000);
        (lat, ssd.stats(), ssd.free_lines(), ssd.map.clone())
    };
    let (a, b) = (run(), run());
    assert!(a.1.gc_pages_moved > 0);
    assert_eq!(a.0, b.0);
    assert_eq!(a.1, b.1);
    assert_eq!(a.2, b.2);
    assert!(a.3 == b.3, "mappings differ");
}

/// Long random mixes of sizes, directions and bursts on every profile: the FTL's
/// invariants hold throughout and the drive never runs out of lines.
#[test]
fn invariants_hold_after_long_random_mixes() {
    let mut suspending = pm9a3_small();
    suspending.program_suspend_ns = 100_000;
    suspending.erase_suspend_ns = 700_000;
    let profiles = [
        SsdProfile::femu().with_blocks(16),
        pm9a3_small(),
        SsdProfile::nvmevirt_970pro().with_blocks(16),
        suspending,
    ];
    for p in profiles {
        let mut ssd = Ssd::new(p.clone());
        ssd.precondition(FRAGMENTED, 3);
        ssd.check_invariants();
        let mut rng = SplitMix64::seed_from_u64(12);
        let mut t = 0;
        for i in 0..30_000u64 {
            let r = rng.next_u64();
            // Bursts: a quarter of the I/Os arrive together with the previous one.
            t += if r % 4 == 0 { 0 } else { (r >> 40) % 60_000 };
            let size = [4096, 4096, 16384, 131072][(r >> 2) as usize % 4];
            let dir = if (r >> 4) % 2 == 0 {
                IoDir::Write
            } else {
                IoDir::Read
            };
            let off = (r >> 8) % ssd.logical_bytes();
            let done = ssd.submit(dir, off, size, t);
            assert!(done >= t);
            assert!(ssd.free_lines() >= 1, "{}: no free line", p.name);
            if i % 5_000 == 0 {
                ssd.check_invariants();
            }
        }
        ssd.check_invariants();
        let s = ssd.stats();
        assert!(s.gc_pages_moved > 0 && s.erases > 0, "{}: {s:?}", p.name);
    }
}

#[test]
fn a_page_holds_the_write_buffer_until_its_flash_page_is_programmed() {
    // pm9a3 with a buffer of two 16 KiB flash pages (8 × 4 KiB) and an empty drive.
    // 4 KiB writes at QD 1: pages 0–3 close flash page 0 (program ends ≈ 350 µs after
    // the fourth write), pages 4–7 close flash page 1. The ninth write needs space that
    // only the end of flash page 0's program frees, so it completes after it. A model
    // that released a page that leaves its flash page open at once (only the closing
    // write waited) would take eight programs' worth of 4 KiB before stalling.
    let mut p = SsdProfile::pm9a3().with_blocks(16);
    p.write_buffer_bytes = 2 * p.flash_page_bytes as u64;
    let mut ssd = Ssd::new(p.clone());
    let mut t = 0;
    let mut done = Vec::new();
    for i in 0..9u64 {
        t = ssd.submit(IoDir::Write, i * 4096, 4096, t);
        done.push(t);
    }
    let first_program_end_ns = done[3] + p.program_ns;
    assert!(
        done[8] > first_program_end_ns,
        "9th write done at {} ns, before flash page 0 could be programmed ({} ns)",
        done[8],
        first_program_end_ns
    );
    // Before the buffer fills, writes complete at firmware + PCIe speed.
    assert!(done[7] < p.program_ns, "8th write {} ns", done[7]);
    assert_eq!(ssd.stats().write_buffer_stalls, 1);
}

#[test]
fn with_read_priority_a_read_waits_for_the_running_program_only() {
    // pm9a3 (32 LUNs, 16 KiB flash pages): one 1.5 MiB write at t = 0 fills 96 flash
    // pages, three per LUN, all in the write buffer when it completes. A read of LPN 0
    // (LUN 0) just after finds LUN 0's first program running. With read priority it
    // goes next (done within one program and a read); in arrival order it waits for
    // all three programs.
    let read_latency_ns = |read_priority: bool| {
        let mut p = SsdProfile::pm9a3().with_blocks(16);
        p.read_priority = read_priority;
        let program_ns = p.program_ns;
        let mut ssd = Ssd::new(p);
        let written = ssd.submit(IoDir::Write, 0, 384 * 4096, 0);
        let at = written + 1_000;
        (ssd.submit(IoDir::Read, 0, 4096, at) - at, program_ns)
    };
    let (first, program_ns) = read_latency_ns(true);
    let (last, _) = read_latency_ns(false);
    assert!(
        first < 2 * program_ns,
        "read priority: read took {first} ns (one program is {program_ns} ns)"
    );
    assert!(
        last > 3 * program_ns,
        "arrival order: read took {last} ns, expected behind three programs"
    );
}

/// pm9a3 with read priority, `program_suspend_ns` as given, after one 1.5 MiB write
/// at t = 0 (three programs per LUN, all in the buffer): (drive, time the write
/// completed, the profile).
fn programs_running(program_suspend_ns: u64) -> (Ssd, u64, SsdProfile) {
    let mut p = SsdProfile::pm9a3().with_blocks(16);
    p.program_suspend_ns = program_suspend_ns;
    let mut ssd = Ssd::new(p.clone());
    let written = ssd.submit(IoDir::Write, 0, 384 * 4096, 0);
    (ssd, written, p)
}

#[test]
fn a_read_suspends_the_running_program_and_the_program_ends_later() {
    // LUN 0's first program starts when the write completes; a read of LPN 0 (LUN 0)
    // 1 µs later finds ~349 µs of it left. Without suspend it waits for all of it;
    // with a 100 µs suspend it starts 100 µs after arriving (MQSim's rule: the read
    // pays the suspend latency), and the program's end moves by 100 µs + the read.
    let (mut plain, written, p) = programs_running(0);
    let at = written + 1_000;
    let waited = plain.submit(IoDir::Read, 0, 4096, at) - at;
    let (mut ssd, written2, _) = programs_running(100_000);
    assert_eq!(written, written2);
    let suspended = ssd.submit(IoDir::Read, 0, 4096, at) - at;
    assert!(
        waited > p.program_ns,
        "without suspend the read took {waited} ns"
    );
    assert!(
        (100_000..100_000 + 2 * p.read_lsb_ns).contains(&suspended),
        "with suspend the read took {suspended} ns"
    );
    assert_eq!(ssd.stats().suspends, 1);
    // The program resumed after the read: a read arriving once the suspension's read
    // is done (the program runs again, and suspends once) ends after the program's
    // moved end, later than the unsuspended program would have ended.
    let after = at + suspended + 1_000;
    let done = ssd.submit(IoDir::Read, 0, 4096, after);
    let program_end_unsuspended = written + p.program_ns;
    assert!(
        done > program_end_unsuspended + 100_000,
        "second read done at {done}, program would have ended at {program_end_unsuspended}"
    );
    assert_eq!(ssd.stats().suspends, 1, "one suspend per program");
    ssd.check_invariants();
}

#[test]
fn reads_that_arrive_during_a_suspension_run_in_it_back_to_back() {
    // Two reads of LUN 0 one µs apart: the first suspends the program, the second
    // follows the first inside the same suspension (no second suspend, no wait for
    // the program), so it ends one read time after the first.
    let (mut ssd, written, p) = programs_running(100_000);
    let at = written + 1_000;
    let first = ssd.submit(IoDir::Read, 0, 4096, at);
    let second = ssd.submit(IoDir::Read, 0, 4096, at + 1_000);
    assert!(
        second > first && second - first <= 2 * p.read_lsb_ns,
        "{first} {second}"
    );
    assert!(second < written + p.program_ns, "{second}");
    assert_eq!(ssd.stats().suspends, 1);
}

#[test]
fn a_program_nearly_done_is_not_suspended() {
    // 60 µs before the program ends, finishing it is quicker than a 100 µs suspend:
    // the read waits, and nothing is suspended.
    let (mut ssd, written, p) = programs_running(100_000);
    let at = written + p.program_ns - 60_000;
    let done = ssd.submit(IoDir::Read, 0, 4096, at);
    assert!(done >= written + p.program_ns, "{done}");
    assert_eq!(ssd.stats().suspends, 0);
}

#[test]
fn suspended_programs_release_the_write_buffer_when_they_really_end() {
    // Eight 4 KiB writes fill flash pages 0 and 1; page 0's program (LUN 0) is
    // running when a read of LPN 0 suspends it. Just after the program's original
    // end, its 16 KiB are still held in the buffer with suspend (the program now ends
    // 100 µs + a read later), and already free without.
    let held_after_original_end = |program_suspend_ns: u64| {
        let mut p = SsdProfile::pm9a3().with_blocks(16);
        p.program_suspend_ns = program_suspend_ns;
        let mut ssd = Ssd::new(p);
        let mut t = 0;
        for i in 0..8u64 {
            t = ssd.submit(IoDir::Write, i * 4096, 4096, t);
        }
        let _ = ssd.submit(IoDir::Read, 12 * 4096, 4096, t); // starts what is ready
        let l0 = ssd.suspendable[0].map(|s| s.end_ns);
        let original_end = ssd.lun_avail_ns[0];
        let _ = ssd.submit(IoDir::Read, 0, 4096, t + 1_000);
        ssd.wbuf_release_until(original_end + 1);
        ssd.check_invariants();
        (ssd.wbuf_used_bytes, ssd.stats().suspends, l0)
    };
    let (plain, n0, _) = held_after_original_end(0);
    let (held, n1, running) = held_after_original_end(100_000);
    assert!(running.is_some(), "LUN 0 should be programming");
    assert_eq!((n0, n1), (0, 1));
    assert_eq!(
        held,
        plain + 16384,
        "bytes held: {plain} without suspend, {held} with"
    );
}

#[test]
fn suspends_never_free_the_write_buffer_twice() {
    // 4 KiB random reads and writes, 64 each in a closed loop, on a clean pm9a3 with
    // suspend on: the writes keep the buffer full, so writes are admitted on program
    // ends that reads then try to move. A program whose release a write already
    // counted must not move (it would be freed twice and admit writes the NAND never
    // programmed): host pages programmed can never outrun the NAND's capacity.
    let mut p = SsdProfile::pm9a3();
    p.program_suspend_ns = 100_000;
    p.erase_suspend_ns = 700_000;
    let mut ssd = Ssd::new(p.clone());
    ssd.precondition(Precondition::Clean, 1);
    let mut rng = SplitMix64::seed_from_u64(5);
    let region = (2u64 << 30) / 4096;
    let next = |dir: IoDir, rng: &mut SplitMix64| {
        let base = if dir == IoDir::Write { region } else { 0 };
        (base + rng.next_u64() % region) * 4096
    };
    let mut heap = std::collections::BinaryHeap::new();
    for i in 0..128u64 {
        let dir = if i % 2 == 0 {
            IoDir::Read
        } else {
            IoDir::Write
        };
        let off = next(dir, &mut rng);
        heap.push(std::cmp::Reverse((
            ssd.submit(dir, off, 4096, 0),
            dir == IoDir::Write,
        )));
    }
    let end_ns = 50_000_000u64;
    let mut writes = 0u64;
    while let Some(std::cmp::Reverse((t, w))) = heap.pop() {
        if t > end_ns {
            break;
        }
        writes += w as u64;
        let dir = if w { IoDir::Write } else { IoDir::Read };
        let off = next(dir, &mut rng);
        heap.push(std::cmp::Reverse((ssd.submit(dir, off, 4096, t), w)));
    }
    ssd.check_invariants();
    let flash_pages = writes * 4096 / p.flash_page_bytes as u64;
    let luns = (p.channels * p.luns_per_channel) as u64;
    // What 32 LUNs can program in the window, plus the write buffer's worth.
    let capacity = luns * end_ns / p.program_ns + p.write_buffer_bytes / p.flash_page_bytes as u64;
    assert!(
        flash_pages <= capacity,
        "{writes} writes = {flash_pages} flash pages in {end_ns} ns; the NAND programs at most {capacity}"
    );
    assert!(ssd.stats().suspends > 0, "{:?}", ssd.stats());
}
