//! CPU cost of the scheduler core per I/O, without the daemon around it.
//!
//! `cargo run --release -p trellis-qos --example sched_cost [-- ROUNDS]`
//!
//! Two patterns, each for the FIFO and the Gimbal policy:
//! - `sync`: what the daemon does for a backend that completes inside
//!   submit (null, ram): `run_now`, else submit and complete at once with
//!   zero device time; the clock moves 1.6 µs per I/O (one reactor's pace
//!   at ~600 K IOPS).
//! - `batch`: the same, but 32 requests at each instant (the clock moves
//!   32 × 1.6 µs between them), as the daemon sees a receive batch of a
//!   QD32 host: Gimbal's lane defers all but the first of each batch.
//! - `qd32`: 32 requests in flight; each completion is followed by a
//!   submit, with a 20 µs device time.
//!
//! Rounds alternate FIFO and Gimbal (this VM's speed drifts between
//! processes and within one); the JSON line gives the median ns per I/O of
//! each. The daemon's overhead criterion (docs/gimbal.md "Overhead") is
//! judged end to end by bench/ab-simul.sh; this isolates the core's share.

use std::time::Instant;
use trellis_qos::sched::{self, Policy, SchedConfig, Scheduler, Submitted, Tag};
use trellis_units::IoDir;

const IOS_PER_ROUND: u64 = 2_000_000;
const SYNC_STEP_NS: u64 = 1_600;
const QD: usize = 32;
const DEVICE_NS: u64 = 20_000;

fn config(policy: Policy) -> SchedConfig {
    SchedConfig {
        policy,
        ..SchedConfig::default()
    }
}

/// The tag of a submitted request, released by polling later (moving
/// `now` on) if the token bucket held it, as the daemon's reap loop does.
fn dispatched(s: &mut dyn Scheduler, sub: Submitted, now: &mut u64) -> Tag {
    match sub {
        Submitted::Dispatch(t) => t,
        Submitted::Queued(t) => loop {
            *now += 1_000;
            if let Some(d) = s.poll_dispatch(*now) {
                assert_eq!(d.tag, t, "one request at a time is queued");
                break t;
            }
        },
        Submitted::Busy => panic!("busy: the bench stays far below every bound"),
    }
}

/// ns per I/O of the sync pattern, `batch` requests at each instant.
fn sync_round(policy: Policy, batch: u64) -> f64 {
    let mut s = sched::build(&config(policy), 0).expect("default config is valid");
    let mut now = 0u64;
    let t0 = Instant::now();
    for i in 0..IOS_PER_ROUND {
        if i % batch == 0 {
            now += SYNC_STEP_NS * batch;
        }
        // The daemon's way for a backend that completes inside submit.
        if let Some(c) = s.run_now(0, IoDir::Read, 4096, now) {
            std::hint::black_box(c.io_credits);
            continue;
        }
        let sub = s.submit(0, IoDir::Read, 4096, now).expect("tenant 0");
        let tag = dispatched(&mut *s, sub, &mut now);
        let c = s.complete(tag, 0, now).expect("tag is in flight");
        std::hint::black_box(c.io_credits);
    }
    t0.elapsed().as_nanos() as f64 / IOS_PER_ROUND as f64
}

/// ns per I/O of the QD32 pattern.
fn qd_round(policy: Policy) -> f64 {
    let mut s = sched::build(&config(policy), 0).expect("default config is valid");
    let mut ring: Vec<(Tag, u64)> = Vec::with_capacity(QD);
    let mut now = 0u64;
    for _ in 0..QD {
        let sub = s.submit(0, IoDir::Read, 4096, now).expect("tenant 0");
        let tag = dispatched(&mut *s, sub, &mut now);
        ring.push((tag, now));
    }
    let t0 = Instant::now();
    for i in 0..IOS_PER_ROUND as usize {
        let k = i % QD;
        let (tag, at) = ring[k];
        now = now.max(at + DEVICE_NS) + 50;
        let c = s.complete(tag, now - at, now).expect("tag is in flight");
        std::hint::black_box(c.io_credits);
        while s.poll_dispatch(now).is_some() {}
        let sub = s.submit(0, IoDir::Read, 4096, now).expect("tenant 0");
        let tag = dispatched(&mut *s, sub, &mut now);
        ring[k] = (tag, now);
    }
    t0.elapsed().as_nanos() as f64 / IOS_PER_ROUND as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = match std::env::args().nth(1) {
        None => 7,
        Some(a) => a.parse().unwrap_or_else(|_| {
            eprintln!("sched_cost: rounds {a:?} is not a number; give e.g. 7");
            std::process::exit(2)
        }),
    };
    let mut r: [[Vec<f64>; 3]; 2] = Default::default();
    for _ in 0..rounds {
        for (p, policy) in [Policy::Fifo, Policy::Gimbal].into_iter().enumerate() {
            r[p][0].push(sync_round(policy, 1));
            r[p][1].push(sync_round(policy, QD as u64));
            r[p][2].push(qd_round(policy));
        }
    }
    let [[fs, fb, fq], [gs, gb, gq]] = &mut r;
    println!(
        "{{\"rounds\":{rounds},\"ios_per_round\":{IOS_PER_ROUND},\
         \"fifo_sync_ns_per_io\":{:.1},\"gimbal_sync_ns_per_io\":{:.1},\
         \"fifo_batch_ns_per_io\":{:.1},\"gimbal_batch_ns_per_io\":{:.1},\
         \"fifo_qd32_ns_per_io\":{:.1},\"gimbal_qd32_ns_per_io\":{:.1}}}",
        median(fs),
        median(gs),
        median(fb),
        median(gb),
        median(fq),
        median(gq)
    );
}
