//! The scheduler core through its public API, with expectations computed by hand
//! from the rules and worked examples of docs/gimbal.md §1 (examples cited per test).

use super::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::VecDeque;

const KIB: u32 = 1024;

fn cfg(policy: Policy) -> SchedConfig {
    SchedConfig {
        policy,
        ..SchedConfig::default()
    }
}

/// Make later submits queue: tenant 2 sends three 128 KiB reads at t = 0; the 256 KiB
/// read bucket passes two and the third blocks on tokens, and nothing passes it (§1.d).
fn block_on_tokens(s: &mut dyn Scheduler) {
    for _ in 0..3 {
        submit_tag(s, 2, IoDir::Read, 128 * KIB, 0);
    }
    assert_eq!((s.inflight(), s.queued()), (2, 1));
}

/// Poll with the clock stepping 1 µs until `n` requests of tenants other than 2 are
/// out; their tenants in dispatch order. Tokens decide when, DRR decides who. Each
/// request completes at once (100 µs device time), so virtual slots never bind.
fn drain(s: &mut dyn Scheduler, n: usize) -> Vec<TenantId> {
    let (mut out, mut now) = (Vec::new(), 0);
    while out.len() < n {
        now += 1_000;
        while let Some(d) = s.poll_dispatch(now) {
            if d.tenant != 2 {
                out.push(d.tenant);
            }
            s.complete(d.tag, 100_000, now).unwrap();
        }
    }
    out
}

fn submit_tag(s: &mut dyn Scheduler, tenant: TenantId, dir: IoDir, len: u32, now: u64) -> Tag {
    match s.submit(tenant, dir, len, now).unwrap() {
        Submitted::Dispatch(t) | Submitted::Queued(t) => t,
        Submitted::Busy => panic!("unexpected Busy"),
    }
}

/// Closed-loop tenants against a device model, driven through the [`Driver`] (the
/// glue the daemon and the simulators run) with the tenant as the payload.
struct Harness {
    d: Driver<TenantId>,
    now: u64,
    /// (completion time, slot), in completion order.
    device: VecDeque<(u64, usize)>,
    /// Per tenant: I/O size; completed bytes.
    len: Vec<u32>,
    bytes: Vec<u64>,
    /// Single-server device: each I/O occupies it for `service_ns` (0 = infinite
    /// parallelism with a fixed `latency_ns`).
    service_ns: u64,
    latency_ns: u64,
    busy_until: u64,
    /// Σ depth × time, for the time-averaged device depth.
    depth_ns: u128,
}

impl Harness {
    fn new(cfg: &SchedConfig, outstanding: &[(u32, u32)]) -> Self {
        let mut h = Harness {
            d: Driver::build(cfg, 0).unwrap(),
            now: 0,
            device: VecDeque::new(),
            len: outstanding.iter().map(|&(_, len)| len).collect(),
            bytes: vec![0; outstanding.len()],
            service_ns: 0,
            latency_ns: 100_000,
            busy_until: 0,
            depth_ns: 0,
        };
        for (t, &(n, len)) in outstanding.iter().enumerate() {
            for _ in 0..n {
                h.submit(t as TenantId, len);
            }
        }
        h
    }

    fn submit(&mut self, tenant: TenantId, len: u32) {
        let req = Request {
            tenant,
            dir: IoDir::Read,
            len_bytes: len,
            payload: tenant,
        };
        match self.d.submit(req, self.now).unwrap() {
            Submit::Run(slot) => self.send_to_device(slot),
            Submit::Held => {}
            Submit::Busy => panic!("harness sized below the limits"),
        }
    }

    fn send_to_device(&mut self, slot: usize) {
        let done = if self.service_ns == 0 {
            self.now + self.latency_ns
        } else {
            self.busy_until = self.busy_until.max(self.now) + self.service_ns;
            self.busy_until
        };
        self.device.push_back((done, slot));
    }

    /// Run until `end_ns`; bytes completed from `measure_from_ns` on are counted.
    fn run(&mut self, end_ns: u64, measure_from_ns: u64) {
        while self.now < end_ns {
            while let Some(r) = self.d.release(self.now) {
                self.send_to_device(r.slot);
            }
            let next = [self.device.front().map(|e| e.0), self.d.next_timeout()]
                .into_iter()
                .flatten()
                .min()
                .expect("closed loop never idles");
            assert!(next >= self.now, "time went backwards");
            self.depth_ns += self.device.len() as u128 * (next - self.now) as u128;
            self.now = next;
            while self.device.front().is_some_and(|e| e.0 <= self.now) {
                let (done_ns, slot) = self.device.pop_front().unwrap();
                let c = self.d.complete(slot, done_ns, self.now).unwrap();
                let tenant = c.req.tenant;
                assert_eq!(tenant, c.req.payload);
                if self.now >= measure_from_ns {
                    self.bytes[tenant as usize] += self.len[tenant as usize] as u64;
                }
                self.submit(tenant, self.len[tenant as usize]);
            }
        }
    }
}

#[test]
fn drr_4k_and_64k_readers_get_equal_bytes_per_round() {
    // Ex 1.c-1: both backlogged, Q = 128 KiB: per round A sends 32 × 4 KiB and
    // B 2 × 64 KiB, 131,072 B each.
    let mut s = build(&cfg(Policy::Gimbal), 0).unwrap();
    block_on_tokens(s.as_mut());
    // Enough for three rounds and more: both stay backlogged throughout.
    for i in 0..100 {
        submit_tag(s.as_mut(), 0, IoDir::Read, 4 * KIB, 0);
        if i < 10 {
            submit_tag(s.as_mut(), 1, IoDir::Read, 64 * KIB, 0);
        }
    }
    let order = drain(s.as_mut(), 34 * 3);
    for round in order.chunks(34) {
        let n0 = round.iter().filter(|&&t| t == 0).count();
        assert_eq!((n0, 34 - n0), (32, 2), "one DRR round");
        assert_eq!(
            n0 as u32 * 4 * KIB,
            (34 - n0) as u32 * 64 * KIB,
            "equal bytes"
        );
    }
}

#[test]
fn intensity_2_to_1_is_equal_under_gimbal_and_2_to_1_under_fifo() {
    // Tenant 0 keeps 64 4 KiB reads outstanding, tenant 1 keeps 32 (the appendix's
    // intensity case, §1.g: vanilla gives 2.0×). Device: 100 µs per I/O, any depth.
    // FIFO (depth 8): the 96 requests circulate in a fixed order, each served once per
    // cycle, so bytes split 64:32 = 2:1 exactly per cycle.
    let mut fifo = cfg(Policy::Fifo);
    fifo.device_qd = 8;
    let mut h = Harness::new(&fifo, &[(64, 4 * KIB), (32, 4 * KIB)]);
    h.run(200_000_000, 10_000_000);
    let ratio = h.bytes[0] as f64 / h.bytes[1] as f64;
    assert!((ratio - 2.0).abs() < 0.03, "fifo ratio {ratio}");
    // Gimbal paced at a fixed 400 MiB/s (rate_min = rate_max): the scheduler is the
    // bottleneck, both tenants stay backlogged, and DRR gives each Q per round, so the
    // byte counts differ by at most one quantum plus one I/O.
    let mut g = cfg(Policy::Gimbal);
    let rate = 400 << 20;
    (
        g.gimbal.rate_init_bytes_per_s,
        g.gimbal.rate_min_bytes_per_s,
    ) = (rate, rate);
    g.gimbal.rate_max_bytes_per_s = rate;
    let mut h = Harness::new(&g, &[(64, 4 * KIB), (32, 4 * KIB)]);
    h.run(200_000_000, 10_000_000);
    let diff = h.bytes[0].abs_diff(h.bytes[1]);
    assert!(diff <= 131_072 + 4096, "gimbal bytes {:?}", h.bytes);
    // And the pacer holds the rate: 190 ms × 400 MiB/s, within one bucket (256 KiB).
    let total = h.bytes[0] + h.bytes[1];
    assert!(
        total.abs_diff(rate * 190 / 1000) <= 262_144 + 8192,
        "total {total}"
    );
}

#[test]
fn weights_split_bytes_in_proportion() {
    // [R] weighted DRR: weight 2 gets 2Q per visit, so one round is 64 + 32 I/Os.
    let mut s = build(&cfg(Policy::Gimbal), 0).unwrap();
    s.set_weight(0, 2).unwrap();
    block_on_tokens(s.as_mut());
    for _ in 0..200 {
        submit_tag(s.as_mut(), 0, IoDir::Read, 4 * KIB, 0);
        submit_tag(s.as_mut(), 1, IoDir::Read, 4 * KIB, 0);
    }
    let order = drain(s.as_mut(), 96 * 2);
    for round in order.chunks(96) {
        let n0 = round.iter().filter(|&&t| t == 0).count();
        assert_eq!((n0, 96 - n0), (64, 32));
    }
    assert_eq!(s.set_weight(0, 0), Err(SchedError::BadWeight));
    assert_eq!(s.set_weight(64, 1), Err(SchedError::BadTenant));
}

#[test]
fn congestion_control_lowers_the_dispatch_depth_when_latency_exceeds_the_threshold() {
    // A single-server device, 10 µs per 4 KiB read (400 MB/s); one tenant keeps 256
    // reads outstanding. FIFO (depth 256) keeps all 256 at the device: latency 2.56 ms,
    // above Thresh_max = 1.5 ms. Gimbal's slots allow 8 × 32 = 256 too (§1.c), so any
    // lower depth is the congestion control's doing: it holds the latency EWMA near
    // Thresh_cur ≤ 1.5 ms, i.e. (Little) at most 150 I/Os at the device.
    let run = |policy| {
        let mut c = cfg(policy);
        c.gimbal.rate_init_bytes_per_s = 3_000 << 20;
        let mut h = Harness::new(&c, &[(256, 4 * KIB)]);
        h.service_ns = 10_000;
        h.run(1_000_000_000, 0);
        (h.depth_ns / h.now as u128) as u64
    };
    assert_eq!(run(Policy::Fifo), 256);
    let gimbal_depth = run(Policy::Gimbal);
    assert!(gimbal_depth <= 150, "gimbal depth {gimbal_depth}");
}

#[test]
fn io_credits_shrink_when_write_latency_raises_the_write_cost() {
    // §1.b/§1.e: one tenant of 4 KiB writes, write cost starting at 1.0.
    let mut c = cfg(Policy::Gimbal);
    c.gimbal.write_cost_init_fp10 = 1024;
    let mut s = build(&c, 0).unwrap();
    let lat = 2_000_000; // 2 ms: above Thresh_max, so the window counts as congested
    let mut tags: Vec<Tag> = (0..32)
        .map(|_| submit_tag(s.as_mut(), 0, IoDir::Write, 4 * KIB, 0))
        .collect();
    while s.poll_dispatch(0).is_some() {}
    assert_eq!(s.inflight(), 32, "32 × 4 KiB = one 128 KiB slot");
    let last = tags.pop().unwrap();
    for t in tags {
        s.complete(t, lat, 1_000_000).unwrap();
    }
    // The last completion ends the 100 ms window: writes averaged 2 ms > 1.5 ms, so
    // MI: wc = (1024 + 9216) / 2 = 5120 (Ex 1.b-2). It also retires slot 0, which held
    // 32 writes: credits = 8 slots × 32 = 256 (one tenant, §1.e).
    let done = s.complete(last, lat, 100_000_000).unwrap();
    assert_eq!(done.io_credits, 256);
    assert_eq!(s.view(0).unwrap().write_cost_fp10, 5120);
    // At wc = 5.0 a 4 KiB write weighs 20,480 B: the 7th crosses 128 KiB and closes the
    // slot (6 × 20,480 = 122,880 < 131,072 ≤ 143,360). Retired, it gives 7 I/Os per
    // 143,360 B: the 1 MiB budget admits ⌈1,048,576 × 7 / 143,360⌉ = 52 of them
    // (Gimbal's whole slots: 8 × 7 = 56, more than the bytes allow).
    let tags: Vec<Tag> = (0..7)
        .map(|_| submit_tag(s.as_mut(), 0, IoDir::Write, 4 * KIB, 100_000_000))
        .collect();
    while s.poll_dispatch(100_000_000).is_some() {}
    assert_eq!(s.inflight(), 7);
    let credits: Vec<u32> = tags
        .into_iter()
        .map(|t| s.complete(t, lat, 101_000_000).unwrap().io_credits)
        .collect();
    assert_eq!(credits.last(), Some(&52));
    assert_eq!(s.io_credits(0), Some(52));
}

#[test]
fn busy_when_a_tenant_queue_or_the_table_is_full() {
    // FIFO at device depth 1: the first request dispatches, the next 4 queue.
    let mut c = cfg(Policy::Fifo);
    c.device_qd = 1;
    c.limits = SchedLimits {
        max_tenants: 2,
        max_queued_per_tenant: 4,
        max_requests: 6,
        prealloc_requests: 6,
    };
    let mut s = build(&c, 0).unwrap();
    let r: Vec<_> = (0..6)
        .map(|_| s.submit(0, IoDir::Read, 4096, 0).unwrap())
        .collect();
    assert!(matches!(r[0], Submitted::Dispatch(_)));
    assert!(r[1..5].iter().all(|x| matches!(x, Submitted::Queued(_))));
    assert_eq!(r[5], Submitted::Busy, "tenant 0 has 4 queued");
    // Tenant 1 gets the sixth row; then the table (6 rows) is full.
    assert!(matches!(
        s.submit(1, IoDir::Read, 4096, 0),
        Ok(Submitted::Queued(_))
    ));
    assert_eq!(s.submit(1, IoDir::Read, 4096, 0), Ok(Submitted::Busy));
    assert_eq!(
        s.submit(2, IoDir::Read, 4096, 0),
        Err(SchedError::BadTenant)
    );
    // Gimbal, 128 KiB reads: the 256 KiB read bucket passes 2 (each alone, so sent at
    // once), the 3rd blocks on tokens (out of DRR), the next 4 fill the tenant's DRR
    // queue, the 8th is Busy.
    let mut c = cfg(Policy::Gimbal);
    c.limits.max_queued_per_tenant = 4;
    let mut s = build(&c, 0).unwrap();
    let r: Vec<_> = (0..8)
        .map(|_| s.submit(0, IoDir::Read, 128 * KIB, 0).unwrap())
        .collect();
    assert!(r[..2].iter().all(|x| matches!(x, Submitted::Dispatch(_))));
    assert!(r[2..7].iter().all(|x| matches!(x, Submitted::Queued(_))));
    assert_eq!(r[7], Submitted::Busy);
    assert_eq!((s.queued(), s.inflight()), (5, 2));
}

#[test]
fn next_timeout_is_the_token_refill_time() {
    // wc = 1.0 splits the 1,048,576,000 B/s evenly (Ex 1.d-3). Two 128 KiB reads empty
    // the 256 KiB read bucket; the third needs 131,072 B at 524,288,000 B/s: 250 µs.
    let mut c = cfg(Policy::Gimbal);
    c.gimbal.write_cost_init_fp10 = 1024;
    let mut s = build(&c, 0).unwrap();
    for _ in 0..3 {
        submit_tag(s.as_mut(), 0, IoDir::Read, 128 * KIB, 0);
    }
    while s.poll_dispatch(0).is_some() {}
    assert_eq!(s.inflight(), 2);
    assert_eq!(s.next_timeout(), Some(250_000));
    // The estimate is conservative: the write bucket is full, so its half overflows
    // into reads (Ex 1.d-4) and the read conforms after 125 µs already.
    assert!(s.poll_dispatch(124_999).is_none());
    assert!(s.poll_dispatch(125_000).is_some());
    assert_eq!(s.next_timeout(), None, "nothing blocked");
    // The FIFO never needs a timer: only completions free device depth.
    let mut f = build(&cfg(Policy::Fifo), 0).unwrap();
    submit_tag(f.as_mut(), 0, IoDir::Read, 4096, 0);
    assert_eq!(f.next_timeout(), None);
}

#[test]
fn fifo_dispatches_in_arrival_order_up_to_the_device_queue_depth() {
    let mut c = cfg(Policy::Fifo);
    c.device_qd = 2;
    let mut s = build(&c, 0).unwrap();
    let r: Vec<Submitted> = (0..5)
        .map(|i| s.submit(i % 2, IoDir::Read, 4096, 0).unwrap())
        .collect();
    let tags: Vec<Tag> = r
        .iter()
        .map(|x| match *x {
            Submitted::Dispatch(t) | Submitted::Queued(t) => t,
            Submitted::Busy => panic!("busy"),
        })
        .collect();
    assert!(r[..2].iter().all(|x| matches!(x, Submitted::Dispatch(_))));
    assert!(r[2..].iter().all(|x| matches!(x, Submitted::Queued(_))));
    assert_eq!(s.poll_dispatch(0), None, "depth 2 reached");
    s.complete(tags[0], 50_000, 50_000).unwrap();
    assert_eq!(s.poll_dispatch(50_000).map(|d| d.tag), Some(tags[2]));
    assert_eq!(s.io_credits(0), Some(2), "the FIFO grants the device depth");
}

#[test]
fn stale_or_repeated_tags_are_errors_not_panics() {
    for policy in [Policy::Fifo, Policy::Gimbal] {
        let mut s = build(&cfg(policy), 0).unwrap();
        let a = submit_tag(s.as_mut(), 0, IoDir::Read, 4096, 0);
        assert!(s.complete(a, 100_000, 100_000).is_ok());
        assert_eq!(s.complete(a, 100_000, 100_000), Err(SchedError::BadTag));
        assert_eq!(s.abort(a, 100_000), Err(SchedError::BadTag));
        // The row is reused with a new generation: the old tag still does not match.
        let b = submit_tag(s.as_mut(), 0, IoDir::Read, 4096, 100_000);
        assert_eq!(a.index(), b.index());
        assert_eq!(s.complete(a, 1, 100_001), Err(SchedError::BadTag));
        assert!(s.abort(b, 100_001).is_ok(), "{policy:?}");
        assert_eq!((s.queued(), s.inflight()), (0, 0));
    }
}

#[test]
fn zero_length_and_invalid_configs_are_handled() {
    // A Flush (0 bytes) is scheduled like a 1-byte read and completes normally.
    let mut s = build(&cfg(Policy::Gimbal), 0).unwrap();
    let t = submit_tag(s.as_mut(), 3, IoDir::Read, 0, 0);
    assert!(s.complete(t, 10_000, 10_000).is_ok());
    let mut bad = cfg(Policy::Gimbal);
    bad.gimbal.thresh_min_us = bad.gimbal.thresh_max_us;
    assert!(build(&bad, 0).is_err());
    let mut bad = cfg(Policy::Fifo);
    bad.limits.max_tenants = 0;
    assert!(build(&bad, 0).is_err());
    bad = cfg(Policy::Fifo);
    bad.gimbal.slots_per_ssd = 33;
    assert!(build(&bad, 0).is_err());
}

#[test]
fn view_reports_credits_congestion_target_and_write_cost() {
    let mut s = build(&cfg(Policy::Gimbal), 0).unwrap();
    let v = s.view(0).unwrap();
    assert_eq!(v.io_credits, 256, "8 slots × 32 for a fresh tenant (§1.e)");
    assert_eq!(v.read.state, None);
    assert_eq!(
        v.read.latency_target_us, 1500,
        "Thresh_cur starts at Thresh_max"
    );
    assert_eq!(v.write_cost_fp10, 9216, "write cost starts at 9.0 (§1.b)");
    // §1.a table row 1: an 800 µs read gives ewma 400, AVOIDANCE, threshold 1432.
    let t = submit_tag(s.as_mut(), 0, IoDir::Read, 128 * KIB, 0);
    s.complete(t, 800_000, 800_000).unwrap();
    let v = s.view(0).unwrap();
    assert_eq!(v.read.state, Some(CcState::Avoidance));
    assert_eq!(
        (v.read.latency_ewma_us, v.read.latency_target_us),
        (400, 1432)
    );
    assert_eq!(v.target_rate_bytes_per_s, 1_048_707_072, "Ex 1.a-1");
    assert_eq!(s.view(64), None);
}

// ---- no allocation on the hot path

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

/// Counts this thread's allocations, so parallel tests do not disturb the count.
struct CountingAlloc;

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[test]
fn submit_dispatch_complete_never_allocate() {
    for policy in [Policy::Fifo, Policy::Gimbal] {
        let mut s = build(&cfg(policy), 0).unwrap();
        let mut inflight: VecDeque<Tag> = VecDeque::with_capacity(8192);
        let before = ALLOCS.with(|c| c.get());
        let mut now = 0;
        for i in 0..100_000u64 {
            now += 20_000;
            let t = (i % 4) as TenantId;
            let dir = if i % 3 == 0 {
                IoDir::Write
            } else {
                IoDir::Read
            };
            if let Submitted::Dispatch(tag) = s.submit(t, dir, 4096 << (i % 5), now).unwrap() {
                inflight.push_back(tag);
            }
            while let Some(d) = s.poll_dispatch(now) {
                inflight.push_back(d.tag);
            }
            if let Some(tag) = inflight.pop_front() {
                // 0.1 to 1.9 ms: every congestion state, including OVERLOADED.
                s.complete(tag, 100_000 + (i % 7) * 300_000, now).unwrap();
            }
            let _ = (s.next_timeout(), s.view(t), s.headroom_bytes_per_s());
        }
        let after = ALLOCS.with(|c| c.get());
        assert_eq!(after - before, 0, "{policy:?} allocated on the hot path");
    }
}

/// xorshift64*: a fixed, dependency-free stream for the randomized test below.
fn next_rand(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Gimbal's submit fast path (nothing queued: skip DRR's list) must decide
/// exactly as the queued path: same answers to every call, same tags, same
/// tenant views, across random traffic from weighted tenants that saturates,
/// drains, defers on virtual slots and blocks on tokens.
#[test]
fn gimbal_fast_path_decides_like_the_queued_path() {
    const LENS: [u32; 6] = [512, 4 * KIB, 16 * KIB, 128 * KIB, 256 * KIB, 1024 * KIB];
    let c = cfg(Policy::Gimbal);
    for seed in 1..=40u64 {
        let mut fast = gimbal::GimbalScheduler::new(&c, 0).unwrap();
        let mut slow = gimbal::GimbalScheduler::new(&c, 0)
            .unwrap()
            .without_fast_path();
        for (t, w) in [(0, 1), (1, 2), (2, 1), (3, 3)] {
            fast.set_weight(t, w).unwrap();
            slow.set_weight(t, w).unwrap();
        }
        let (mut rng, mut now) = (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, 0u64);
        let mut inflight: Vec<Tag> = Vec::new();
        let mut fast_dispatches = 0;
        for _ in 0..3_000 {
            now += next_rand(&mut rng) % 40_000;
            let r = next_rand(&mut rng);
            if !r.is_multiple_of(3) || inflight.is_empty() {
                let (tenant, len) = ((r >> 8) as u16 % 4, LENS[(r >> 16) as usize % LENS.len()]);
                let dir = if (r >> 24).is_multiple_of(3) {
                    IoDir::Write
                } else {
                    IoDir::Read
                };
                let (a, b) = (
                    fast.submit(tenant, dir, len, now),
                    slow.submit(tenant, dir, len, now),
                );
                assert_eq!(a, b, "seed {seed}: submit differs");
                if let Ok(Submitted::Dispatch(t)) = a {
                    inflight.push(t);
                    fast_dispatches += 1;
                }
            } else {
                let t = inflight.swap_remove((r >> 8) as usize % inflight.len());
                let lat = 10_000 + (r >> 20) % 3_000_000;
                assert_eq!(
                    fast.complete(t, lat, now),
                    slow.complete(t, lat, now),
                    "seed {seed}"
                );
            }
            loop {
                let (a, b) = (fast.poll_dispatch(now), slow.poll_dispatch(now));
                assert_eq!(a, b, "seed {seed}: poll_dispatch differs");
                let Some(d) = a else { break };
                inflight.push(d.tag);
            }
            assert_eq!(
                (fast.queued(), fast.inflight()),
                (slow.queued(), slow.inflight())
            );
            assert_eq!(fast.tokens_bytes(), slow.tokens_bytes(), "seed {seed}");
            for t in 0..4 {
                assert_eq!(fast.view(t), slow.view(t), "seed {seed}: tenant {t}");
            }
        }
        assert!(
            fast_dispatches > 0,
            "seed {seed}: no direct dispatch exercised"
        );
    }
}

/// `run_now` (a device that completes inside submit) must decide exactly as
/// `submit` + `complete(tag, 0, now)`: same credits, same tenant views, same
/// tokens, across random traffic where zero-time requests mix with other
/// tenants' slow ones (so slots fill, defer and reopen, buckets run dry and
/// requests queue). Tags may differ in generation (run_now takes no row), so
/// in-flight requests are matched by position.
#[test]
fn gimbal_run_now_decides_like_submit_then_complete() {
    const LENS: [u32; 5] = [512, 4 * KIB, 16 * KIB, 128 * KIB, 256 * KIB];
    const TENANTS: u16 = 10;
    let c = cfg(Policy::Gimbal);
    let (mut ran_now, mut ran_now_shared, mut zero_queued) = (0u32, 0u32, 0u32);
    for seed in 1..=30u64 {
        let mut fused = gimbal::GimbalScheduler::new(&c, 0).unwrap();
        let mut steps = gimbal::GimbalScheduler::new(&c, 0).unwrap();
        for t in 0..TENANTS {
            let w = 1 + (t as u32 % 3);
            fused.set_weight(t, w).unwrap();
            steps.set_weight(t, w).unwrap();
        }
        let (mut rng, mut now) = (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, 0u64);
        // Slow requests in flight on both: (fused tag, steps tag).
        let mut slow: Vec<(Tag, Tag)> = Vec::new();
        // Zero-time requests that queued: (fused tag, steps tag), completed
        // at once when dispatched, as the daemon does.
        let mut zero_waiting: Vec<(Tag, Tag)> = Vec::new();
        for step in 0..4_000 {
            // Bursts of slow traffic (queues build), then calm (they drain
            // while slow requests are still in flight).
            let burst = (step / 250) % 2 == 0;
            now += next_rand(&mut rng) % 100_000;
            let r = next_rand(&mut rng);
            let (tenant, len) = (
                (r >> 8) as u16 % TENANTS,
                LENS[(r >> 16) as usize % LENS.len()],
            );
            let dir = if (r >> 24).is_multiple_of(4) {
                IoDir::Write
            } else {
                IoDir::Read
            };
            // Half zero-time requests; slow ones arrive only in bursts and
            // complete three times as often as they arrive then.
            match r % 8 {
                0..=3 => {
                    // A zero-time request (tenants 0..5; 3 and 4 also send
                    // slow ones): run_now, or the two steps.
                    let tenant = tenant % 5;
                    let others = steps.inflight();
                    let a = fused.run_now(tenant, dir, len, now);
                    let (b, b_queued) = match steps.submit(tenant, dir, len, now).unwrap() {
                        Submitted::Dispatch(t) => (Some(steps.complete(t, 0, now).unwrap()), None),
                        Submitted::Queued(t) => (None, Some(t)),
                        Submitted::Busy => (None, None),
                    };
                    match a {
                        Some(done) => {
                            assert_eq!(Some(done), b, "seed {seed}: run_now differs");
                            assert!(b_queued.is_none());
                            ran_now += 1;
                            ran_now_shared += (others > 0) as u32;
                        }
                        None => {
                            // Not eligible: the fused side goes the two-step way too.
                            let a = match fused.submit(tenant, dir, len, now).unwrap() {
                                Submitted::Dispatch(t) => Some(fused.complete(t, 0, now).unwrap()),
                                Submitted::Queued(x) => {
                                    let y = b_queued.expect("steps side queued too");
                                    zero_waiting.push((x, y));
                                    zero_queued += 1;
                                    None
                                }
                                Submitted::Busy => None,
                            };
                            assert_eq!(a, b, "seed {seed}: fallback differs");
                        }
                    }
                }
                4 if burst => {
                    let tenant = 3 + tenant % (TENANTS - 3);
                    let (a, b) = (
                        fused.submit(tenant, dir, len, now).unwrap(),
                        steps.submit(tenant, dir, len, now).unwrap(),
                    );
                    match (a, b) {
                        (Submitted::Dispatch(x), Submitted::Dispatch(y)) => slow.push((x, y)),
                        (Submitted::Queued(_), Submitted::Queued(_)) => {}
                        (Submitted::Busy, Submitted::Busy) => {}
                        other => panic!("seed {seed}: submit differs: {other:?}"),
                    }
                }
                _ if !slow.is_empty() => {
                    let (x, y) = slow.swap_remove((r >> 8) as usize % slow.len());
                    let lat = 10_000 + (r >> 20) % 600_000;
                    assert_eq!(
                        fused.complete(x, lat, now),
                        steps.complete(y, lat, now),
                        "seed {seed}: complete differs"
                    );
                }
                _ => {}
            }
            // Released requests: both sides keep them in flight as slow ones
            // (a queued zero-time one then just completes later, slowly).
            loop {
                let (a, b) = (fused.poll_dispatch(now), steps.poll_dispatch(now));
                match (a, b) {
                    (None, None) => break,
                    (Some(x), Some(y)) => {
                        assert_eq!(
                            (x.tenant, x.dir, x.len_bytes),
                            (y.tenant, y.dir, y.len_bytes),
                            "seed {seed}: poll_dispatch differs"
                        );
                        match zero_waiting.iter().position(|&(_, w)| w == y.tag) {
                            Some(k) => {
                                let (zx, zy) = zero_waiting.swap_remove(k);
                                assert_eq!(x.tag, zx, "seed {seed}: a different request");
                                assert_eq!(
                                    fused.complete(zx, 0, now),
                                    steps.complete(zy, 0, now),
                                    "seed {seed}: zero-time completion differs"
                                );
                            }
                            None => slow.push((x.tag, y.tag)),
                        }
                    }
                    other => panic!("seed {seed}: poll_dispatch differs: {other:?}"),
                }
            }
            assert_eq!(
                (fused.queued(), fused.inflight()),
                (steps.queued(), steps.inflight()),
                "seed {seed}"
            );
            // The lane may defer a streak's bookkeeping (the trait's contract).
            fused.settle();
            assert_eq!(fused.tokens_bytes(), steps.tokens_bytes(), "seed {seed}");
            for t in 0..TENANTS {
                assert_eq!(fused.view(t), steps.view(t), "seed {seed}: tenant {t}");
            }
        }
    }
    assert!(ran_now > 10_000, "run_now taken only {ran_now} times");
    assert!(
        ran_now_shared > 1_000,
        "run_now beside other tenants' I/O only {ran_now_shared} times"
    );
    assert!(
        zero_queued > 1_000,
        "the two-step fallback was taken only {zero_queued} times"
    );
}

/// The lane (a lone tenant's repeated zero-time request, docs/gimbal.md) makes
/// exactly the full pass's decisions and state changes, including the passes
/// it defers and applies in one step. A scheduler with it and one without get
/// the same calls, shaped like the daemon's loop: a poll, then a receive
/// batch of calls at one instant, mostly one tenant's streaks of equal
/// requests, mixed with other tenants' slow I/O (latencies up to 3 ms, so
/// congestion states other than UNDER-UTILISED occur and the lane must not
/// open), weight changes and time jumps past write-cost windows. Every answer
/// must match at once, and the whole internal state (congestion control,
/// write cost, DRR, buckets) once the lane side has settled, at random points.
#[test]
fn lane_decides_like_the_full_pass() {
    const LENS: [u32; 4] = [512, 4 * KIB, 64 * KIB, 128 * KIB];
    // Small tables keep the state dump short.
    let mut c = cfg(Policy::Gimbal);
    c.limits = SchedLimits {
        max_tenants: 6,
        max_queued_per_tenant: 16,
        max_requests: 64,
        prealloc_requests: 64,
    };
    // Starting at the ceiling, as a null namespace's rate soon is: the
    // bucket then passes the streaks (else it, not the lane, decides most).
    c.gimbal.rate_init_bytes_per_s = c.gimbal.rate_max_bytes_per_s;
    let mut counts = (0u64, 0u64, 0u64);
    for seed in 1..=40u64 {
        let mut lane = gimbal::GimbalScheduler::new(&c, 0).unwrap();
        let mut full = gimbal::GimbalScheduler::new(&c, 0).unwrap().without_lane();
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut now = 0u64;
        let mut key = (0u16, IoDir::Read, 4 * KIB);
        // Requests in flight on both sides: (lane tag, full tag).
        let mut slow: Vec<(Tag, Tag)> = Vec::new();
        // Zero-time requests that queued: completed when dispatched, as the daemon does.
        let mut zero_waiting: Vec<(Tag, Tag)> = Vec::new();
        for step in 0..1_500 {
            let r = next_rand(&mut rng);
            now += match r % 16 {
                0..=3 => 0,
                4..=14 => (r >> 8) % 200_000,
                _ => (r >> 8) % 120_000_000,
            };
            poll_both(&mut lane, &mut full, &mut slow, &mut zero_waiting, now);
            // Other tenants' I/O comes in bursts and drains between them, so the
            // lone tenant is sometimes alone (the lane may open) and sometimes not.
            let burst = (step / 80) % 2 == 0;
            for _ in 0..1 + (r >> 40) % 32 {
                let r = next_rand(&mut rng);
                if r.is_multiple_of(64) {
                    let dir = if (r >> 8).is_multiple_of(3) {
                        IoDir::Write
                    } else {
                        IoDir::Read
                    };
                    // Mostly small requests (long runs in one slot), as the daemon's
                    // 4 KiB benchmark; the large ones fill a slot every one or two.
                    let len = match (r >> 16) % 8 {
                        0 => LENS[2],
                        1 => LENS[3],
                        2 => LENS[0],
                        _ => LENS[1],
                    };
                    key = ((r >> 12) as u16 % 2, dir, len);
                }
                lane_step(
                    &mut lane,
                    &mut full,
                    r,
                    key,
                    burst,
                    now,
                    &mut slow,
                    &mut zero_waiting,
                );
            }
            assert_eq!(
                (lane.queued(), lane.inflight()),
                (full.queued(), full.inflight())
            );
            if r.is_multiple_of(8) {
                lane.settle();
                assert_eq!(
                    lane.state_dump(),
                    full.state_dump(),
                    "seed {seed} step {step}: state differs"
                );
            }
        }
        lane.settle();
        assert_eq!(
            lane.state_dump(),
            full.state_dump(),
            "seed {seed}: at the end"
        );
        assert_eq!(full.lane_counts(), (0, 0, 0), "the reference took the lane");
        let (h, m, d) = lane.lane_counts();
        counts = (counts.0 + h, counts.1 + m, counts.2 + d);
    }
    let (hits, misses, deferred) = counts;
    eprintln!("lane: {hits} answered, {misses} fell back, {deferred} deferred");
    assert!(hits > 5_000, "the lane answered only {hits} times");
    assert!(
        misses > 200,
        "the lane fell back to the full pass only {misses} times"
    );
    assert!(
        deferred > 20_000,
        "the lane deferred only {deferred} passes"
    );
}

/// Both schedulers' dispatches at `now`: queued zero-time requests complete at
/// once, others stay in flight as slow ones.
fn poll_both(
    lane: &mut gimbal::GimbalScheduler,
    full: &mut gimbal::GimbalScheduler,
    slow: &mut Vec<(Tag, Tag)>,
    zero_waiting: &mut Vec<(Tag, Tag)>,
    now: u64,
) {
    loop {
        match (lane.poll_dispatch(now), full.poll_dispatch(now)) {
            (None, None) => break,
            (Some(x), Some(y)) => {
                assert_eq!(
                    (x.tenant, x.dir, x.len_bytes),
                    (y.tenant, y.dir, y.len_bytes)
                );
                match zero_waiting.iter().position(|&(_, w)| w == y.tag) {
                    Some(k) => {
                        let (zx, zy) = zero_waiting.swap_remove(k);
                        assert_eq!(x.tag, zx, "a different request");
                        assert_eq!(lane.complete(zx, 0, now), full.complete(zy, 0, now));
                    }
                    None => slow.push((x.tag, y.tag)),
                }
            }
            other => panic!("poll_dispatch differs: {other:?}"),
        }
    }
}

/// One call on both sides: mostly `key`'s zero-time request (the two steps
/// where `run_now` declines), else another tenant's slow read (in bursts), a
/// slow completion, or a weight change.
#[allow(clippy::too_many_arguments)]
fn lane_step(
    lane: &mut gimbal::GimbalScheduler,
    full: &mut gimbal::GimbalScheduler,
    r: u64,
    key: (TenantId, IoDir, u32),
    burst: bool,
    now: u64,
    slow: &mut Vec<(Tag, Tag)>,
    zero_waiting: &mut Vec<(Tag, Tag)>,
) {
    match (r >> 24) % 100 {
        0..=84 => {
            let (t, dir, len) = key;
            let a = lane.run_now(t, dir, len, now);
            assert_eq!(a, full.run_now(t, dir, len, now), "run_now differs");
            if a.is_none() {
                match (lane.submit(t, dir, len, now), full.submit(t, dir, len, now)) {
                    (Ok(Submitted::Dispatch(x)), Ok(Submitted::Dispatch(y))) => {
                        assert_eq!(lane.complete(x, 0, now), full.complete(y, 0, now));
                    }
                    (Ok(Submitted::Queued(x)), Ok(Submitted::Queued(y))) => {
                        zero_waiting.push((x, y))
                    }
                    (Ok(Submitted::Busy), Ok(Submitted::Busy)) => {}
                    other => panic!("submit differs: {other:?}"),
                }
            }
        }
        85..=89 if burst => {
            // Tenants 2-4, and sometimes 0 or 1: a slow read gives them a
            // read latency (the lane then decays it).
            let t = (r >> 8) as u16 % 5;
            let len = [512, 4 * KIB, 64 * KIB, 128 * KIB][(r >> 16) as usize % 4];
            match (
                lane.submit(t, IoDir::Read, len, now),
                full.submit(t, IoDir::Read, len, now),
            ) {
                (Ok(Submitted::Dispatch(x)), Ok(Submitted::Dispatch(y))) => slow.push((x, y)),
                (Ok(Submitted::Queued(_)), Ok(Submitted::Queued(_))) => {}
                (Ok(Submitted::Busy), Ok(Submitted::Busy)) => {}
                other => panic!("submit differs: {other:?}"),
            }
        }
        90..=98 if !slow.is_empty() => {
            let (x, y) = slow.swap_remove((r >> 8) as usize % slow.len());
            // Mostly under Thresh_max (1.5 ms); one in 16 up to 3 ms (OVERLOADED).
            let lat = 10_000
                + (r >> 20)
                    % if r.is_multiple_of(16) {
                        3_000_000
                    } else {
                        1_200_000
                    };
            assert_eq!(lane.complete(x, lat, now), full.complete(y, lat, now));
        }
        99 => {
            let (t, w) = ((r >> 8) as u16 % 5, 1 + (r >> 16) as u32 % 4);
            assert_eq!(lane.set_weight(t, w), full.set_weight(t, w));
        }
        _ => {}
    }
}
