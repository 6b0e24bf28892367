//! Hand-computed cases: the worked examples of docs/gimbal.md (§1.a–§1.e, Ex 1.x-n).

use super::*;
use crate::cc::{update_dir, DirCc};
use crate::sched::{GimbalScheduler, SchedConfig, SchedLimits, Scheduler, Submitted};
use trellis_units::IoDir;

#[test]
fn cc_threshold_follows_table_1a() {
    // §1.a examples: 128 KiB reads, ticks = µs, Thresh 250..1500.
    let mut cc = DirCc {
        ewma_us: 0,
        thresh_us: 1500,
        residue: 0,
    };
    let rows = [
        (800, 400, CcState::Avoidance, 1432, 12),
        (800, 600, CcState::Avoidance, 1380, 12),
        (3000, 1800, CcState::Overloaded, 1440, 0),
        (1400, 1600, CcState::Overloaded, 1470, 0),
        (1400, 1500, CcState::Congested, 1485, 0),
        (200, 850, CcState::Avoidance, 1446, 11),
    ];
    for (i, (lat, ewma, state, thresh, residue)) in rows.into_iter().enumerate() {
        let s = update_dir(&mut cc, lat, 250, 1500);
        assert_eq!(
            (s, cc.ewma_us, cc.thresh_us, cc.residue),
            (state, ewma, thresh, residue),
            "I/O {}",
            i + 1
        );
    }
}

#[test]
fn cc_rate_follows_example_1a1() {
    let mut cc = CongestionControl::new(&GimbalConfig::default());
    cc.on_complete(IoDir::Read, 131_072, 800_000, 1);
    assert_eq!(cc.target_rate(), 1_048_707_072);
    cc.on_complete(IoDir::Read, 131_072, 800_000, 2);
    cc.set_cpl_rate(838_860_800);
    let s = cc.on_complete(IoDir::Read, 131_072, 3_000_000, 3);
    assert_eq!(s, CcState::Overloaded);
    assert_eq!(cc.target_rate(), 838_729_728);
}

/// 129 reads of 128 KiB at `lat_ns` each over 100 ms (one 16 MiB
/// completion-rate sample, ~169 MB/s), the bucket holding a request back for the
/// first `limited_ms` of it, the rate starting at 10 MiB/s (so it stays under
/// twice the sample even after 129 × 8 × len). The rate after the sample, and
/// before its last completion.
fn rate_after_sample(limited_ms: u64, lat_ns: u64) -> (u64, u64, u64) {
    const SPAN_NS: u64 = 100_000_000;
    let cfg = GimbalConfig {
        rate_init_bytes_per_s: 10 << 20,
        rate_min_bytes_per_s: 1 << 20,
        ..GimbalConfig::default()
    };
    let mut cc = CongestionControl::new(&cfg);
    cc.rate_limited_from(0);
    let mut limited = true;
    let mut before = 0;
    for i in 1..=129u64 {
        let now = i * SPAN_NS / 129;
        if limited && now >= limited_ms * 1_000_000 {
            cc.rate_limit_ended(now);
            limited = false;
        }
        before = cc.target_rate();
        cc.on_complete(IoDir::Read, 131_072, lat_ns, now);
    }
    assert!(cc.cpl_rate() > 0, "one sample taken");
    (cc.target_rate(), before, cc.cpl_rate())
}

#[test]
fn a_rate_that_held_an_idle_drive_back_doubles_per_sample() {
    // Held back all along, every completion under-utilised (100 µs < 250 µs): the
    // rate becomes twice the completion rate.
    let (rate, before, cpl) = rate_after_sample(200, 100_000);
    assert!(before + 8 * 131_072 < 2 * cpl, "the test's premise");
    assert_eq!(rate, 2 * cpl);
    // Not if the bucket held requests back for under half of the sample...
    let (rate, before, _) = rate_after_sample(40, 100_000);
    assert_eq!(rate, before + 8 * 131_072, "only Gimbal's +8 × len");
    // ...nor if the drive was not under-utilised all along (300 µs: avoidance).
    let (rate, before, _) = rate_after_sample(200, 300_000);
    assert_eq!(rate, before + 131_072, "only Gimbal's +len");
}

/// Congestion control after one calm completion-rate sample: 129 reads of
/// 128 KiB at 100 µs (under-utilised) over 100 ms, ~169 MB/s.
fn after_a_calm_sample() -> CongestionControl {
    let mut cc = CongestionControl::new(&GimbalConfig::default());
    for i in 1..=129u64 {
        cc.on_complete(IoDir::Read, 131_072, 100_000, i * 100_000_000 / 129);
    }
    assert!(cc.cpl_rate() > 0, "one sample taken");
    cc
}

/// Gimbal cuts the rate to the last completion-rate sample on any OVERLOADED
/// completion; we cut only to a sample that itself saw the drive overloaded. A
/// lone stall after a calm sample (an erase, a phase change) takes CONGESTED's
/// step; once a sample closes with OVERLOADED completions in it, the next one cuts
/// to that sample's rate.
#[test]
fn an_overloaded_completion_cuts_only_to_a_rate_measured_under_overload() {
    const LEN: u32 = 131_072;
    let mut cc = after_a_calm_sample();
    let calm = cc.cpl_rate();
    let before = cc.target_rate();
    assert!(
        calm > 0 && calm < before,
        "the premise: a sample below the rate"
    );
    // One read stalls 10 ms: OVERLOADED, but the sample saw no overload.
    let t0 = 100_000_000;
    let s = cc.on_complete(IoDir::Read, LEN, 10_000_000, t0 + 1);
    assert_eq!(s, CcState::Overloaded);
    assert_eq!(
        cc.target_rate(),
        before - LEN as u64,
        "no cut to {calm} B/s"
    );
    // The overload goes on for a whole sample (16 MiB more, 1 ms apart)...
    let mut k = 1;
    let sampled = cc.cpl_rate();
    while cc.cpl_rate() == sampled {
        k += 1;
        let s = cc.on_complete(IoDir::Read, LEN, 10_000_000, t0 + k * 1_000_000);
        assert_eq!(s, CcState::Overloaded);
    }
    let overloaded = cc.cpl_rate();
    let before = cc.target_rate();
    assert!(
        overloaded < before,
        "the premise: the overloaded sample is below the rate"
    );
    // ...so the next OVERLOADED completion cuts to what the drive delivered then.
    cc.on_complete(IoDir::Read, LEN, 10_000_000, t0 + (k + 1) * 1_000_000);
    assert_eq!(cc.target_rate(), overloaded - LEN as u64);
}

/// An overload whose first completions close a sample begun before it (after idle
/// time or another load) is not cut to that sample: the sample starts again at the
/// overload's first completion.
#[test]
fn an_overload_is_measured_from_its_first_completion() {
    const LEN: u32 = 131_072;
    let mut cc = after_a_calm_sample();
    // 127 calm reads of the next sample: 16 MiB less one read, so the next two
    // completions would close it.
    for i in 1..=127u64 {
        cc.on_complete(
            IoDir::Read,
            LEN,
            100_000,
            100_000_000 + i * 100_000_000 / 129,
        );
    }
    let (calm, before) = (cc.cpl_rate(), cc.target_rate());
    let t0 = 200_000_000;
    for k in 1..=3u64 {
        let s = cc.on_complete(IoDir::Read, LEN, 10_000_000, t0 + k * 1_000_000);
        assert_eq!(s, CcState::Overloaded);
    }
    assert_eq!(
        cc.cpl_rate(),
        calm,
        "no sample closed: it began again at the overload"
    );
    assert_eq!(cc.target_rate(), before - 3 * LEN as u64, "no cut");
}

/// A sample during which our own bucket held requests back for at least half the
/// time measured our rate, not the drive (BBR's application-limited samples): an
/// overload is not cut to it, as cutting to it would feed on itself.
#[test]
fn an_overload_is_not_cut_to_a_sample_paced_by_our_own_bucket() {
    const LEN: u32 = 131_072;
    let mut cc = CongestionControl::new(&GimbalConfig::default());
    let t0 = 1_000_000;
    assert_eq!(
        cc.on_complete(IoDir::Read, LEN, 10_000_000, t0),
        CcState::Overloaded
    );
    // A whole sample of the overload, the bucket holding a request back throughout.
    cc.rate_limited_from(t0);
    let mut k = 0;
    while cc.cpl_rate() == 0 {
        k += 1;
        cc.on_complete(IoDir::Read, LEN, 10_000_000, t0 + k * 1_000_000);
    }
    let before = cc.target_rate();
    assert!(
        cc.cpl_rate() < before,
        "the premise: the sample is below the rate"
    );
    cc.on_complete(IoDir::Read, LEN, 10_000_000, t0 + (k + 1) * 1_000_000);
    assert_eq!(
        cc.target_rate(),
        before - LEN as u64,
        "no cut to our own pace"
    );
    // The next sample of the overload, the bucket no longer binding: cut to it.
    cc.rate_limit_ended(t0 + (k + 1) * 1_000_000);
    let paced = cc.cpl_rate();
    let mut j = k + 1;
    while cc.cpl_rate() == paced {
        j += 1;
        cc.on_complete(IoDir::Read, LEN, 10_000_000, t0 + j * 1_000_000);
    }
    let measured = cc.cpl_rate();
    cc.on_complete(IoDir::Read, LEN, 10_000_000, t0 + (j + 1) * 1_000_000);
    assert_eq!(
        cc.target_rate(),
        measured - LEN as u64,
        "cut to the drive-paced sample"
    );
}

#[test]
fn cc_underutilised_adds_eight_lengths() {
    // Ex 1.a-2: a 4 KiB read with ewma 200 µs raises the rate by 32,768 B/s.
    let mut cc = CongestionControl::new(&GimbalConfig::default());
    cc.read.ewma_us = 200;
    let before = cc.target_rate();
    assert_eq!(
        cc.on_complete(IoDir::Read, 4096, 200_000, 1),
        CcState::UnderUtilised
    );
    assert_eq!(cc.target_rate() - before, 32_768);
}

#[test]
fn write_cost_ad_mi_examples() {
    // Ex 1.b-1: sixteen calm windows take 9.0 to 1.0.
    let mut wc = WriteCost::new(9216, 100_000_000, 0);
    for _ in 0..16 {
        wc.end_window(250, 1500);
    }
    assert_eq!(wc.fp10(), 1024);
    // Ex 1.b-2: congested → 5120, congested → 7168, calm → 6656.
    let congested = |wc: &mut WriteCost| {
        wc.on_complete(IoDir::Read, 100_000, 1, 250, 1500);
        wc.on_complete(IoDir::Write, 900_000, 1, 250, 1500);
        wc.end_window(250, 1500);
    };
    congested(&mut wc);
    assert_eq!(wc.fp10(), 5120);
    congested(&mut wc);
    assert_eq!(wc.fp10(), 7168);
    wc.end_window(250, 1500);
    assert_eq!(wc.fp10(), 6656);
    // Ex 1.b-3: weighted 4 KiB write at 4.0.
    assert_eq!(WriteCost::weighted(IoDir::Write, 4096, 4096), 16_384);
    assert_eq!(WriteCost::weighted(IoDir::Read, 4096, 4096), 4096);
}

fn limits(max_tenants: u16) -> SchedLimits {
    SchedLimits {
        max_tenants,
        ..SchedLimits::default()
    }
}

/// Gimbal's DRR with the default constants and a 4-tenant table.
fn drr4() -> Drr {
    Drr::new(&GimbalConfig::default(), &limits(4))
}

fn req(dir: IoDir, size: u32) -> Request {
    Request {
        tag: 0,
        dir,
        size_bytes: size,
    }
}

/// Dequeue `n` I/Os, completing each at once (so slots never bind); bytes per tenant.
fn run_drr(drr: &mut Drr, n: usize, wc: u64, refill: &[(u16, IoDir, u32)]) -> [u64; 4] {
    let mut bytes = [0u64; 4];
    for _ in 0..n {
        let (t, r, slot) = drr.dequeue(wc).expect("backlogged tenants");
        bytes[t as usize] += r.size_bytes as u64;
        let (_, dir, size) = refill[t as usize];
        drr.enqueue(t, req(dir, size)).unwrap();
        drr.release(t, slot);
    }
    bytes
}

#[test]
fn drr_4k_vs_64k_reads_share_bytes_equally() {
    // Ex 1.c-1: per round A sends 32 × 4 KiB, B 2 × 64 KiB: 50/50 bytes, 32/34 I/Os.
    let mut drr = drr4();
    let spec = [(0, IoDir::Read, 4096), (1, IoDir::Read, 65536)];
    for _ in 0..64 {
        drr.enqueue(0, req(IoDir::Read, 4096)).unwrap();
        drr.enqueue(1, req(IoDir::Read, 65536)).unwrap();
    }
    let mut counts = [0u32; 2];
    for _ in 0..34 {
        let (t, _, slot) = drr.dequeue(1024).unwrap();
        counts[t as usize] += 1;
        drr.release(t, slot);
        drr.enqueue(t, req(spec[t as usize].1, spec[t as usize].2))
            .unwrap();
    }
    assert_eq!(counts, [32, 2], "one DRR round");
    let b = run_drr(&mut drr, 34 * 50, 1024, &spec);
    assert_eq!(b[0], b[1], "50 rounds: equal bytes");
}

#[test]
fn drr_read_vs_write_split_by_write_cost() {
    // Ex 1.c-2: wc = 4.0; per round 32 reads vs 8 writes: raw bytes 80/20.
    let mut drr = drr4();
    let spec = [(0, IoDir::Read, 4096), (1, IoDir::Write, 4096)];
    for _ in 0..64 {
        drr.enqueue(0, req(IoDir::Read, 4096)).unwrap();
        drr.enqueue(1, req(IoDir::Write, 4096)).unwrap();
    }
    let b = run_drr(&mut drr, 40 * 25, 4096, &spec);
    assert_eq!(b[0], 4 * b[1]);
}

#[test]
fn drr_deficit_carries_between_rounds() {
    // Ex 1.c-3: 48 KiB reads against a 4 KiB tenant: 2, 3, 3 I/Os per round (3Q total).
    let mut drr = drr4();
    let spec = [(0, IoDir::Read, 49_152), (1, IoDir::Read, 4096)];
    for _ in 0..16 {
        drr.enqueue(0, req(IoDir::Read, 49_152)).unwrap();
        drr.enqueue(1, req(IoDir::Read, 4096)).unwrap();
    }
    let mut per_round = Vec::new();
    let mut run = 0;
    for _ in 0..(8 + 3 * 32) {
        let (t, r, slot) = drr.dequeue(1024).unwrap();
        if t == 0 {
            run += 1;
        } else if run > 0 {
            per_round.push(run);
            run = 0;
        }
        drr.release(t, slot);
        drr.enqueue(t, req(IoDir::Read, spec[t as usize].2))
            .unwrap();
        let _ = r;
    }
    assert_eq!(&per_round[..3], &[2, 3, 3]);
}

#[test]
fn the_budget_defers_after_sixteen_64k_ios_and_each_completion_returns_its_bytes() {
    // Ex 1.c-4: one tenant, 8 slots = 1 MiB: deferred after 16 × 64 KiB.
    let mut drr = drr4();
    for _ in 0..40 {
        drr.enqueue(0, req(IoDir::Read, 65536)).unwrap();
    }
    let mut out = Vec::new();
    while let Some(d) = drr.dequeue(1024) {
        out.push(d);
    }
    assert_eq!(out.len(), 16);
    // [R] One completion returns its 64 KiB at once: one more I/O, then deferred
    // again. (Gimbal waits for both I/Os of the first slot, then sends two.)
    drr.release(0, out[5].2);
    assert!(
        drr.dequeue(1024).is_some(),
        "half a slot back: one more I/O"
    );
    assert!(drr.dequeue(1024).is_none(), "1 MiB in flight again");
    drr.release(0, out[0].2);
    drr.release(0, out[1].2);
    assert!(drr.dequeue(1024).is_some());
    assert!(drr.dequeue(1024).is_some());
    assert!(drr.dequeue(1024).is_none());
}

#[test]
fn a_small_io_tenant_keeps_its_whole_budget_in_flight_whatever_the_completion_order() {
    // 4 KiB reads, 32 per slot, 8 slots: 256 in flight. Completing every other
    // one frees half of each slot's bytes; with whole-slot retirement (Gimbal)
    // no slot would retire and nothing more could be sent.
    let mut drr = drr4();
    for _ in 0..600 {
        drr.enqueue(0, req(IoDir::Read, 4096)).unwrap();
    }
    let mut out = Vec::new();
    while let Some(d) = drr.dequeue(1024) {
        out.push(d);
    }
    assert_eq!(out.len(), 256);
    for d in out.iter().step_by(2) {
        drr.release(0, d.2);
    }
    let mut more = 0;
    while drr.dequeue(1024).is_some() {
        more += 1;
    }
    assert_eq!(more, 128, "every byte returned is sent again");
}

#[test]
fn a_request_heavier_than_u32_gives_back_exactly_what_it_took() {
    // A 4 GiB write at write cost 9.0 weighs ~36 GiB: more than a request row holds.
    let mut drr = drr4();
    for _ in 0..2 {
        drr.enqueue(0, req(IoDir::Write, u32::MAX)).unwrap();
    }
    let (_, _, first) = drr.dequeue(9216).expect("one I/O always goes");
    assert!(drr.dequeue(9216).is_none(), "over budget: deferred");
    drr.release(0, first);
    assert!(drr.dequeue(9216).is_some(), "its whole weight came back");
}

#[test]
fn the_budget_divides_among_active_tenants_by_weight_not_floored_to_slots() {
    let mut drr = Drr::new(&GimbalConfig::default(), &limits(16));
    // 8 slots of 128 KiB: 1 MiB over N tenants, at least one slot each.
    let expect = [
        (1, 1 << 20),
        (2, 1 << 19),
        (3, 349_525),
        (5, 209_715),
        (9, 131_072),
    ];
    let mut active = 0;
    for (n, budget) in expect {
        while active < n {
            drr.enqueue(active as u16, req(IoDir::Read, 4096)).unwrap();
            active += 1;
        }
        assert_eq!(drr.budget_bytes(0), Some(budget), "{n} tenants");
    }
    drr.set_weight(0, 3).unwrap();
    assert_eq!(
        drr.budget_bytes(0),
        Some(3 * (1 << 20) / 11),
        "weight 3 of 11"
    );
}

#[test]
fn the_budget_is_proportional_to_weight_times_read_latency() {
    // 8 slots of 128 KiB = 1 MiB. Two tenants of weight 1: tenant 1's reads take
    // three times as long, so it needs three times the bytes in flight for the
    // same rate (Little's law): budgets 1/4 and 3/4 of the drive's.
    let mut drr = drr4();
    drr.enqueue(0, req(IoDir::Read, 4096)).unwrap();
    drr.enqueue(1, req(IoDir::Read, 65536)).unwrap();
    assert_eq!(drr.budget_bytes(0), Some(1 << 19), "no samples: by weight");
    drr.observe_read_latency(0, 300_000);
    assert_eq!(
        drr.budget_bytes(0),
        Some(1 << 19),
        "one sampled: still half each"
    );
    drr.observe_read_latency(1, 900_000);
    assert_eq!(drr.budget_bytes(0), Some((1 << 20) / 4));
    assert_eq!(drr.budget_bytes(1), Some(3 * (1 << 20) / 4));
    // The EWMA moves 1/16 of the gap per sample: 300 µs → 337.5 µs after 900 µs.
    drr.observe_read_latency(0, 900_000);
    assert_eq!(
        drr.budget_bytes(0),
        Some((1u64 << 20) * 337_500 / 1_237_500)
    );
    // Weight multiplies in: weight 2 at 337.5 µs against 900 µs.
    drr.set_weight(0, 2).unwrap();
    assert_eq!(
        drr.budget_bytes(0),
        Some((1u64 << 20) * 675_000 / 1_575_000)
    );
    // A tenant with no read latency (a writer) gets its weight's share, w / W_active
    // = 1/4; the sampled ones split the other 3/4 by w·L.
    drr.enqueue(2, req(IoDir::Write, 4096)).unwrap();
    assert_eq!(drr.budget_bytes(2), Some((1 << 20) / 4));
    assert_eq!(
        drr.budget_bytes(1),
        Some((1u64 << 20) * 3 * 900_000 / (4 * 1_575_000))
    );
    // A tenant alone gets all slots whatever its latency.
    let mut alone = drr4();
    alone.enqueue(3, req(IoDir::Read, 4096)).unwrap();
    alone.observe_read_latency(3, 900_000);
    assert_eq!(alone.budget_bytes(3), Some(1 << 20));
}

#[test]
fn credits_follow_slot_sizes() {
    // Ex 1.e-1: N_active = 2, 4 KiB-read tenant → 4 × 32 = 128; 64 KiB → 4 × 2 = 8.
    let mut drr = drr4();
    for _ in 0..200 {
        drr.enqueue(0, req(IoDir::Read, 4096)).unwrap();
        drr.enqueue(1, req(IoDir::Read, 65536)).unwrap();
    }
    let mut held = Vec::new();
    for _ in 0..68 {
        held.push(drr.dequeue(1024).unwrap());
    }
    for (t, _, s) in held {
        drr.release(t, s);
    }
    assert_eq!(drr.io_credits(0), Some(128));
    assert_eq!(drr.io_credits(1), Some(8));
}

#[test]
fn a_tenants_credit_does_not_jump_when_its_last_io_completes() {
    // Tenant 1 keeps the drive busy; tenant 0 has one read. While it is in flight
    // N_active = 2 (vqmaxqd 4, credit 4 × 32); when it completes, tenant 0 is idle and
    // no longer counted, but its credit stays the allowance of an active tenant: the
    // credit it will hold when it sends again (docs/gimbal.md §1.e, departure [R]).
    let mut drr = drr4();
    for _ in 0..100 {
        drr.enqueue(1, req(IoDir::Read, 4096)).unwrap();
    }
    drr.enqueue(0, req(IoDir::Read, 4096)).unwrap();
    let mut mine = None;
    while mine.is_none() {
        let (t, _, s) = drr.dequeue(1024).unwrap();
        if t == 0 {
            mine = Some(s);
        }
    }
    assert_eq!(drr.n_active(), 2);
    let while_active = drr.io_credits(0).unwrap();
    assert_eq!(while_active, 4 * 32);
    drr.release(0, mine.unwrap());
    assert_eq!(
        drr.n_active(),
        1,
        "tenant 0 went idle with its last completion"
    );
    assert_eq!(drr.io_credits(0), Some(while_active));
    // A tenant idle from the start is offered the share it would get on arrival.
    assert_eq!(drr.io_credits(2), Some(4 * 32));
}

#[test]
fn token_split_and_overflow_examples() {
    // Ex 1.d-1: 100,000 B at wc = 4.0 → 80,000 read / 20,000 write.
    let mut b = DualTokenBucket::new(262_144, 0);
    b.zero();
    b.refill(1_000_000_000, 4096, 100_000);
    assert_eq!((b.read_tokens, b.write_tokens), (80_000, 20_000));
    // Ex 1.d-2: from 250,000 / 10,000 → read full, write 97,856.
    b.read_tokens = 250_000;
    b.write_tokens = 10_000;
    b.add(100_000, 4096);
    assert_eq!((b.read_tokens, b.write_tokens), (262_144, 97_856));
    // Ex 1.d-3: wc = 1.0 splits evenly.
    b.zero();
    b.add(100_000, 1024);
    assert_eq!((b.read_tokens, b.write_tokens), (50_000, 50_000));
    // Ex 1.d-4: write-only stream: read bucket full, writes receive all 100,000 B.
    b.read_tokens = 262_144;
    b.write_tokens = 0;
    b.add(100_000, 4096);
    assert_eq!((b.read_tokens, b.write_tokens), (262_144, 100_000));
}

#[test]
fn refill_in_small_steps_loses_no_bytes() {
    let mut a = DualTokenBucket::new(1 << 30, 0);
    a.zero();
    for t in 1..=1000 {
        a.refill(52_428_800, 1024, t * 7_000);
    }
    // 1000 steps of 7 µs at 52,428,800 B/s = 367,001.6 B: nothing lost to truncation.
    assert_eq!(a.read_tokens + a.write_tokens, 367_001);
}

#[test]
fn gimbal_paces_writes_by_tokens_and_never_reorders() {
    let cfg = SchedConfig {
        limits: limits(2),
        gimbal: GimbalConfig {
            write_cost_init_fp10: 4096,
            // A 4 MiB budget: the token bucket, not the budget, holds the writes back.
            slots_per_ssd: 32,
            ..GimbalConfig::default()
        },
        ..SchedConfig::default()
    };
    let mut g = GimbalScheduler::new(&cfg, 0).unwrap();
    // Drain the initial buckets with 4 × 64 KiB writes (write bucket holds 256 KiB).
    let mut tags = Vec::new();
    let mut sent = Vec::new();
    for i in 0..6 {
        match g.submit(0, IoDir::Write, 65536, 0).unwrap() {
            Submitted::Dispatch(t) => {
                tags.push(t);
                sent.push(i);
            }
            Submitted::Queued(t) => tags.push(t),
            Submitted::Busy => panic!("busy"),
        }
    }
    let label = |tags: &[_], t| tags.iter().position(|&x| x == t).unwrap();
    while let Some(d) = g.poll_dispatch(0) {
        sent.push(label(&tags, d.tag));
    }
    assert_eq!(sent, vec![0, 1, 2, 3]);
    // The 5th write blocks on tokens; a read (with a full read bucket) must wait behind it.
    let Submitted::Queued(read) = g.submit(1, IoDir::Read, 4096, 0).unwrap() else {
        panic!("the read must queue behind the blocked write");
    };
    assert!(g.poll_dispatch(0).is_none());
    // The read bucket is full, so its share overflows to writes (Ex 1.d-4): the write
    // gets the whole 1,048,576,000 B/s and has 64 KiB after 62.5 µs.
    assert!(g.poll_dispatch(62_499).is_none());
    assert_eq!(g.poll_dispatch(62_500).map(|d| d.tag), Some(tags[4]));
    // The read, queued behind, goes next; the timer estimate ignores overflow (conservative).
    assert_eq!(g.poll_dispatch(62_500).map(|d| d.tag), Some(read));
    g.submit(0, IoDir::Write, 65536, 62_500).unwrap();
    let _ = g.poll_dispatch(62_500);
    if let Some(w) = g.next_timeout() {
        assert!(
            w >= 62_500 + 62_500,
            "estimate {w} earlier than the fastest refill"
        );
    }
}

#[test]
fn credit_window_example_1e2() {
    let mut w = IoCreditWindow {
        io_credits_total: 8,
        inflight_ios: 8,
    };
    assert!(!w.try_submit());
    w.on_complete(16);
    assert_eq!((w.io_credits_total, w.inflight_ios), (16, 7));
    let admitted = (0..20).filter(|_| w.try_submit()).count();
    assert_eq!(admitted, 9);
}

/// pm9a3-gen4's model as `trellis_ssd::calibrate` measures it (rounded): 4 KiB random
/// reads 548,811/s, reads 7.025 GB/s, 99 % of it at 14 × 128 KiB, PCIe 6,700 MiB/s.
fn pm9a3_model() -> DeviceModel {
    DeviceModel {
        read_4k_iops: 548_811,
        read_bytes_per_s: 7_025_000_000,
        read_128k_saturation_qd: 14,
        link_bytes_per_s: 6_700 << 20,
    }
}

#[test]
fn calibration_derives_cost_slots_and_ceiling_from_the_drive() {
    let c = GimbalConfig::default().calibrated(&pm9a3_model());
    // 7,025,000,000 / 548,811 = 12,800 B of drive time per 4 KiB read; 4,096 of it bytes.
    assert_eq!(c.io_cost_bytes, 12_800 - 4096);
    // 14 × (128 KiB + 8,704) = 1,956,864 B of cost in flight = 14.9 slots of 128 KiB.
    assert_eq!(c.slots_per_ssd, 15);
    // The 4 GiB/s ceiling (PCIe 3.0 ×4) rises to the drive's PCIe 4.0 link.
    assert_eq!(c.rate_max_bytes_per_s, 7_025_459_200);
    // The target rate starts at the drive's read bandwidth, not at 1000 MiB/s.
    assert_eq!(c.rate_init_bytes_per_s, 7_025_000_000);
    assert!(c.validate().is_ok());
    // Everything else keeps Gimbal's value.
    let d = GimbalConfig::default();
    assert_eq!(
        (c.quantum_bytes, c.slot_bytes, c.thresh_max_us),
        (d.quantum_bytes, d.slot_bytes, d.thresh_max_us)
    );
}

#[test]
fn calibration_clamps_what_the_slot_table_cannot_hold() {
    let mut m = pm9a3_model();
    m.read_128k_saturation_qd = 1000;
    assert_eq!(
        GimbalConfig::default().calibrated(&m).slots_per_ssd,
        MAX_SLOTS_PER_SSD
    );
    m.read_128k_saturation_qd = 0;
    m.read_4k_iops = 0;
    let c = GimbalConfig::default().calibrated(&m);
    // Unknown figures leave Gimbal's constants alone.
    assert_eq!((c.io_cost_bytes, c.slots_per_ssd), (0, 8));
    // A drive so slow per I/O that the cost passes the bound is clamped to it.
    m.read_4k_iops = 1;
    assert_eq!(
        GimbalConfig::default().calibrated(&m).io_cost_bytes,
        MAX_IO_COST_BYTES
    );
    // No read bandwidth: the target rate starts where Gimbal starts it.
    m.read_bytes_per_s = 0;
    assert_eq!(
        GimbalConfig::default().calibrated(&m).rate_init_bytes_per_s,
        GimbalConfig::default().rate_init_bytes_per_s
    );
}

#[test]
fn drr_with_a_per_io_cost_shares_drive_time_not_bytes() {
    // Same drive as above: a 4 KiB read takes 1/548,811 s, a 64 KiB read 64 KiB of the
    // 7.025 GB/s plus the per-I/O part, i.e. the time its calibrated cost says.
    let cfg = GimbalConfig::default().calibrated(&pm9a3_model());
    let mut drr = Drr::new(&cfg, &limits(4));
    let spec = [(0, IoDir::Read, 4096), (1, IoDir::Read, 65536)];
    for _ in 0..64 {
        drr.enqueue(0, req(IoDir::Read, 4096)).unwrap();
        drr.enqueue(1, req(IoDir::Read, 65536)).unwrap();
    }
    let b = run_drr(&mut drr, 20_000, 1024, &spec);
    let m = pm9a3_model();
    let secs = |bytes: u64, size: u64| {
        let ios = (bytes / size) as f64;
        ios * (1.0 / m.read_4k_iops as f64 + (size - 4096) as f64 / m.read_bytes_per_s as f64)
    };
    let (t_small, t_large) = (secs(b[0], 4096), secs(b[1], 65536));
    let ratio = t_small / t_large;
    assert!(
        (0.98..1.02).contains(&ratio),
        "drive time small/large {ratio}"
    );
    // Gimbal's byte cost, for contrast, hands the 4 KiB tenant ~3× the drive time.
    let mut drr = drr4();
    for _ in 0..64 {
        drr.enqueue(0, req(IoDir::Read, 4096)).unwrap();
        drr.enqueue(1, req(IoDir::Read, 65536)).unwrap();
    }
    let b = run_drr(&mut drr, 20_000, 1024, &spec);
    assert!(secs(b[0], 4096) / secs(b[1], 65536) > 2.5);
}

#[test]
fn io_cost_is_bounded_by_validation() {
    let mut c = GimbalConfig {
        io_cost_bytes: MAX_IO_COST_BYTES + 1,
        ..GimbalConfig::default()
    };
    assert!(c.validate().is_err());
    c.io_cost_bytes = MAX_IO_COST_BYTES;
    c.slots_per_ssd = MAX_SLOTS_PER_SSD;
    assert!(c.validate().is_ok());
}
