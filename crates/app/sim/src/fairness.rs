//! The Gimbal appendix's interference cases on one simulated drive
//! (`trellis sim fairness`): the scheduler core, its driver and the SSD model
//! that `trellis target` runs (`trellis_qos::sched::Driver`, `trellis_ssd`),
//! driven on a virtual clock by closed-loop tenants shaped like
//! `bench/jobs/fairness/`.
//!
//! Why beside `bench/fairness.sh`: the daemon's runs take minutes of wall
//! time, a 2-core VM's CPU and network add their own noise, and a time-scaled
//! drive runs only a quarter of a second of device time in 8 s. Here the same
//! policy code runs for seconds of device time in milliseconds of CPU and
//! replays bit-identically, so a change to the policy or the model can be
//! judged on every case before a daemon run confirms it. What this leaves
//! out (on purpose): the network, the hosts' and the target's CPU; a
//! completion reaches the tenant at the instant the drive finishes it.
//!
//! Metrics are those of `bench/fairness.py` (docs/bench.md "Fairness").

use anyhow::{bail, Result};
use hdrhistogram::Histogram;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use trellis_qos::sched::{Driver, Policy, Request, SchedConfig, Submit, TenantId};
use trellis_qos::GimbalConfig;
use trellis_ssd::{Precondition, Ssd, SsdProfile};
use trellis_units::{IoDir, Nanos};

/// The cases of `bench/jobs/fairness/` (same tenants, sizes, iodepths and regions).
pub const CASES: [&str; 4] = ["intensity", "size", "pattern_rand", "pattern_seq"];
/// Largest phase length accepted (device time).
pub const MAX_RUNTIME_NS: Nanos = 600_000_000_000;
/// Latency histogram bound: 60 s of device time.
const LAT_MAX_NS: u64 = 60_000_000_000;
/// The bench's 2 GiB regions (`offset`, `size` of each job).
const REGION_BYTES: u64 = 2 << 30;

/// One tenant: a closed loop of `iodepth` I/Os of `bs` bytes.
#[derive(Clone, Debug, Serialize)]
pub struct TenantSpec {
    pub name: String,
    pub weight: u32,
    pub dir: IoDir,
    pub bs: u32,
    pub iodepth: u32,
    pub sequential: bool,
    pub offset_bytes: u64,
    pub size_bytes: u64,
}

fn tenant(name: &str, dir: IoDir, bs: u32, iodepth: u32, seq: bool, region: u64) -> TenantSpec {
    TenantSpec {
        name: name.into(),
        weight: 1,
        dir,
        bs,
        iodepth,
        sequential: seq,
        offset_bytes: region * REGION_BYTES,
        size_bytes: REGION_BYTES,
    }
}

/// The tenants of case `name` (as `bench/jobs/fairness/NAME.toml`).
pub fn case(name: &str) -> Result<Vec<TenantSpec>> {
    use IoDir::{Read, Write};
    Ok(match name {
        "intensity" => vec![
            tenant("deep", Read, 4096, 128, false, 0),
            tenant("shallow", Read, 4096, 64, false, 1),
        ],
        "size" => vec![
            tenant("small", Read, 4096, 128, false, 0),
            tenant("large", Read, 65536, 128, false, 1),
        ],
        "pattern_rand" => vec![
            tenant("reader", Read, 4096, 64, false, 0),
            tenant("writer", Write, 4096, 64, false, 1),
        ],
        "pattern_seq" => vec![
            tenant("reader", Read, 128 << 10, 16, true, 0),
            tenant("writer", Write, 128 << 10, 16, true, 1),
        ],
        _ => bail!("unknown case {name:?}: use one of {}", CASES.join(", ")),
    })
}

/// What one run measures per tenant (after the warm-up).
#[derive(Clone, Debug, Serialize)]
pub struct TenantRun {
    pub name: String,
    pub ios: u64,
    pub bytes: u64,
    pub mb_per_s: f64,
    pub lat_us_p50: f64,
    pub lat_us_p999: f64,
}

/// How the drive and the scheduler are set up, and how long each phase runs.
#[derive(Clone, Debug)]
pub struct Setup {
    pub profile: SsdProfile,
    pub precondition: Precondition,
    pub policy: Policy,
    pub gimbal: GimbalConfig,
    /// Measured part of a phase, device time.
    pub runtime_ns: Nanos,
    /// Leading part of a phase not measured (`trellis bench --ramp_time`).
    pub ramp_ns: Nanos,
    pub seed: u64,
}

/// The bench's phases at its default time_scale 32: `--ramp_time 1s`, 8 s runs.
pub const BENCH_TIME_SCALE: u64 = 32;
pub const DEFAULT_RAMP_NS: Nanos = 1_000_000_000 / BENCH_TIME_SCALE;
pub const DEFAULT_RUNTIME_NS: Nanos = 8_000_000_000 / BENCH_TIME_SCALE;
/// Idle device time between phases (the bench starts the next `trellis bench`
/// about 0.1 s of wall time later: 3 ms of device time at time_scale 32).
const PHASE_GAP_NS: Nanos = 3_000_000;

impl Setup {
    /// The daemon's defaults: pm9a3-gen4, clean, Gimbal calibrated to the drive
    /// (`[qos] calibrate = "auto"`), the bench's phase lengths.
    pub fn daemon_like(policy: Policy) -> Setup {
        let profile = SsdProfile::pm9a3();
        let gimbal = GimbalConfig::default().calibrated(&trellis_ssd::calibrate(&profile));
        Setup {
            profile,
            precondition: Precondition::Clean,
            policy,
            gimbal,
            runtime_ns: DEFAULT_RUNTIME_NS,
            ramp_ns: DEFAULT_RAMP_NS,
            seed: 1,
        }
    }
}

/// What the driver keeps of a request for us: its loop and where it reads or writes.
#[derive(Clone, Copy)]
struct Io {
    l: u16,
    offset: u64,
}

struct Loop {
    spec: TenantSpec,
    id: TenantId,
    rng: Xoshiro256PlusPlus,
    next_seq: u64,
    lat: Histogram<u64>,
    ios: u64,
    bytes: u64,
}

impl Loop {
    fn offset(&mut self) -> u64 {
        let s = &self.spec;
        let blocks = (s.size_bytes / s.bs as u64).max(1);
        let i = if s.sequential {
            let i = self.next_seq % blocks;
            self.next_seq += 1;
            i
        } else {
            self.rng.next_u64() % blocks
        };
        s.offset_bytes + i * s.bs as u64
    }
}

/// One drive and one scheduler, kept across phases as one `trellis target`
/// keeps them across the bench's runs (tenant `i` of the case has id `i`).
pub struct Session {
    ssd: Ssd,
    drv: Driver<Io>,
    now_ns: Nanos,
    setup: Setup,
    phases: u64,
}

impl Session {
    pub fn new(setup: &Setup, tenants: &[TenantSpec]) -> Result<Session> {
        let mut ssd = Ssd::new(setup.profile.clone());
        ssd.precondition(setup.precondition, 1);
        let cfg = SchedConfig {
            policy: setup.policy,
            gimbal: setup.gimbal.clone(),
            ..SchedConfig::default()
        };
        let mut drv = Driver::build(&cfg, 0).map_err(|e| anyhow::anyhow!("scheduler: {e}"))?;
        for (i, t) in tenants.iter().enumerate() {
            drv.set_weight(i as TenantId, t.weight)
                .map_err(|e| anyhow::anyhow!("tenant {}: weight {}: {e:?}", t.name, t.weight))?;
        }
        Ok(Session {
            ssd,
            drv,
            now_ns: 0,
            setup: setup.clone(),
            phases: 0,
        })
    }

    /// Runs the closed loops of `tenants` (index in the case, spec) for the
    /// ramp and the runtime, then lets what is in flight drain.
    pub fn phase(&mut self, tenants: &[(usize, &TenantSpec)]) -> Result<Vec<TenantRun>> {
        self.phases += 1;
        let mut loops = Vec::with_capacity(tenants.len());
        for &(i, t) in tenants {
            let seed = self.setup.seed ^ (self.phases << 32) ^ (i as u64 * 7919);
            loops.push(Loop {
                spec: t.clone(),
                id: i as TenantId,
                rng: Xoshiro256PlusPlus::seed_from_u64(seed),
                next_seq: 0,
                lat: Histogram::new_with_bounds(1, LAT_MAX_NS, 3)?,
                ios: 0,
                bytes: 0,
            });
        }
        let start = self.now_ns;
        let measure_from = start + self.setup.ramp_ns;
        let end = measure_from + self.setup.runtime_ns;
        let mut e = Engine {
            ssd: &mut self.ssd,
            drv: &mut self.drv,
            done: BinaryHeap::new(),
            loops,
            measure: (measure_from, end),
            issuing: true,
            trace_every_ns: std::env::var("TRELLIS_FAIR_TRACE")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map(|ms| ms.max(1) * 1_000_000),
            next_trace_ns: start,
        };
        for l in 0..e.loops.len() {
            for _ in 0..e.loops[l].spec.iodepth {
                e.issue(l, start)?;
            }
        }
        e.dispatch(start);
        let last = e.run(end)?;
        let runs = e.results(self.setup.runtime_ns);
        self.now_ns = last + PHASE_GAP_NS;
        Ok(runs)
    }
}

/// Runs `tenants` together on a fresh drive and scheduler (one phase).
pub fn run(setup: &Setup, tenants: &[TenantSpec]) -> Result<Vec<TenantRun>> {
    let mut s = Session::new(setup, tenants)?;
    let all: Vec<(usize, &TenantSpec)> = tenants.iter().enumerate().collect();
    s.phase(&all)
}

struct Engine<'a> {
    ssd: &'a mut Ssd,
    drv: &'a mut Driver<Io>,
    /// Device completions: (time, driver slot).
    done: BinaryHeap<Reverse<(Nanos, usize)>>,
    loops: Vec<Loop>,
    /// Completions in [from, to) are measured.
    measure: (Nanos, Nanos),
    /// Cleared at the end of the phase: completions then issue nothing new.
    issuing: bool,
    /// `TRELLIS_FAIR_TRACE=MS`: print every tenant's view this often (device ms).
    trace_every_ns: Option<Nanos>,
    next_trace_ns: Nanos,
}

impl Engine<'_> {
    /// Loop `l` submits its next I/O at `now`.
    fn issue(&mut self, l: usize, now: Nanos) -> Result<()> {
        let (id, dir, bs) = (
            self.loops[l].id,
            self.loops[l].spec.dir,
            self.loops[l].spec.bs,
        );
        let offset = self.loops[l].offset();
        let req = Request {
            tenant: id,
            dir,
            len_bytes: bs,
            payload: Io {
                l: l as u16,
                offset,
            },
        };
        match self.drv.submit(req, now) {
            Ok(Submit::Run(slot)) => self.start(slot, req.payload, now),
            Ok(Submit::Held) => {}
            Ok(Submit::Busy) => bail!("scheduler bound reached: raise the limits"),
            Err(e) => bail!("submit: {e:?}"),
        }
        Ok(())
    }

    /// Sends the request in `slot` to the drive at `now`.
    fn start(&mut self, slot: usize, io: Io, now: Nanos) {
        let spec = &self.loops[io.l as usize].spec;
        let end = self.ssd.submit(spec.dir, io.offset, spec.bs, now);
        self.done.push(Reverse((end, slot)));
    }

    fn dispatch(&mut self, now: Nanos) {
        while let Some(r) = self.drv.release(now) {
            self.start(r.slot, r.req.payload, now);
        }
    }

    /// Runs to `end`, then stops issuing and drains; returns the time the last
    /// request completed.
    fn run(&mut self, end: Nanos) -> Result<Nanos> {
        let mut now = 0;
        loop {
            let next_done = self.done.peek().map(|Reverse((t, _))| *t);
            let timer = self.drv.next_timeout();
            now = match (next_done, timer) {
                (Some(d), Some(t)) => d.min(t).max(now),
                (Some(d), None) => d,
                // Held by the token bucket with nothing in flight: wait for the refill.
                (None, Some(t)) => t.max(now),
                (None, None) if !self.issuing => return Ok(now),
                (None, None) => bail!("nothing in flight and no timer: the loop stalled"),
            };
            if now >= end {
                self.issuing = false;
            }
            self.trace(now);
            if next_done == Some(now) {
                let Some(Reverse((_, i))) = self.done.pop() else {
                    unreachable!("peeked above")
                };
                self.complete(i, now)?;
            }
            self.dispatch(now);
        }
    }

    fn results(&self, runtime_ns: Nanos) -> Vec<TenantRun> {
        let secs = runtime_ns as f64 / 1e9;
        self.loops
            .iter()
            .map(|l| TenantRun {
                name: l.spec.name.clone(),
                ios: l.ios,
                bytes: l.bytes,
                mb_per_s: l.bytes as f64 / secs / 1e6,
                lat_us_p50: l.lat.value_at_quantile(0.5) as f64 / 1e3,
                lat_us_p999: l.lat.value_at_quantile(0.999) as f64 / 1e3,
            })
            .collect()
    }

    fn trace(&mut self, now: Nanos) {
        let Some(every) = self.trace_every_ns else {
            return;
        };
        if now < self.next_trace_ns {
            return;
        }
        self.next_trace_ns = now + every;
        for l in &self.loops {
            if let Some(v) = self.drv.view(l.id) {
                eprintln!(
                    "t={:>5}ms {:<8} cred {:>4} q {:>3} inf {:>3} | rd {:?} ewma {} thr {} | wr {:?} ewma {} thr {} | wc {:.2} rate {} MB/s",
                    now / 1_000_000, l.spec.name, v.io_credits, v.queued, v.inflight,
                    v.read.state, v.read.latency_ewma_us, v.read.latency_target_us,
                    v.write.state, v.write.latency_ewma_us, v.write.latency_target_us,
                    v.write_cost_fp10 as f64 / 1024.0, v.target_rate_bytes_per_s / 1_000_000
                );
            }
        }
    }

    fn complete(&mut self, slot: usize, now: Nanos) -> Result<()> {
        let done = self
            .drv
            .complete(slot, now, now)
            .map_err(|e| anyhow::anyhow!("complete of slot {slot}: {e:?}"))?;
        let l = done.req.payload.l as usize;
        let (from, to) = self.measure;
        if (from..to).contains(&now) {
            let lp = &mut self.loops[l];
            lp.ios += 1;
            lp.bytes += lp.spec.bs as u64;
            lp.lat.saturating_record((now - done.submitted_ns).max(1));
        }
        if self.issuing {
            self.issue(l, now)?;
        }
        Ok(())
    }
}

/// One tenant of a case in one mode, with the yardsticks of `bench/fairness.py`.
#[derive(Clone, Debug, Serialize)]
pub struct CaseTenant {
    pub name: String,
    pub weight: u32,
    pub mb_per_s: f64,
    pub lat_us_p999: f64,
    pub standalone_mb_per_s: f64,
    /// `mb_per_s / standalone_mb_per_s`.
    pub keep: f64,
    /// Weighted f-Util: BW / (BW alone × w / Σw).
    pub f: f64,
    /// `keep / Σ keep` and its fair value `w / Σw`.
    pub share: f64,
    pub fair_share: f64,
    pub fair_share_dev: f64,
}

/// One case in one mode.
#[derive(Clone, Debug, Serialize)]
pub struct CaseMode {
    pub case: String,
    pub mode: String,
    pub tenants: Vec<CaseTenant>,
    pub f_util_min: f64,
    pub f_util_mean: f64,
    /// Σ BW / BW alone (QoS off): drive time used, the same yardstick in both modes.
    pub utilisation: f64,
}

/// Runs case `name` in both modes (off, gimbal): each tenant alone, then together.
/// `weights` overrides tenant weights by name.
pub fn run_case(name: &str, weights: &[(String, u32)], base: &Setup) -> Result<Vec<CaseMode>> {
    let mut tenants = case(name)?;
    for (who, w) in weights {
        if let Some(t) = tenants.iter_mut().find(|t| &t.name == who) {
            t.weight = *w;
        }
    }
    let mut out = Vec::new();
    let mut alone_off = Vec::new();
    for (mode, policy) in [("off", Policy::Fifo), ("gimbal", Policy::Gimbal)] {
        let setup = Setup {
            policy,
            ..base.clone()
        };
        // As bench/fairness.py: one target per mode; each tenant alone, then together.
        let mut session = Session::new(&setup, &tenants)?;
        let mut alone = Vec::with_capacity(tenants.len());
        for (i, t) in tenants.iter().enumerate() {
            alone.push(session.phase(&[(i, t)])?[0].mb_per_s);
        }
        if policy == Policy::Fifo {
            alone_off = alone.clone();
        }
        let all: Vec<(usize, &TenantSpec)> = tenants.iter().enumerate().collect();
        let together = session.phase(&all)?;
        out.push(score(name, mode, &tenants, &together, &alone, &alone_off));
    }
    Ok(out)
}

fn score(
    case: &str,
    mode: &str,
    specs: &[TenantSpec],
    runs: &[TenantRun],
    alone: &[f64],
    alone_off: &[f64],
) -> CaseMode {
    let w_sum: f64 = specs.iter().map(|t| t.weight as f64).sum();
    let keeps: Vec<f64> = runs
        .iter()
        .zip(alone)
        .map(|(r, &a)| if a > 0.0 { r.mb_per_s / a } else { 0.0 })
        .collect();
    let keep_sum: f64 = keeps.iter().sum();
    let tenants: Vec<CaseTenant> = specs
        .iter()
        .zip(runs)
        .zip(alone)
        .zip(&keeps)
        .map(|(((s, r), &a), &keep)| {
            let fair = s.weight as f64 / w_sum;
            let share = if keep_sum > 0.0 { keep / keep_sum } else { 0.0 };
            CaseTenant {
                name: s.name.clone(),
                weight: s.weight,
                mb_per_s: r.mb_per_s,
                lat_us_p999: r.lat_us_p999,
                standalone_mb_per_s: a,
                keep,
                f: keep / fair,
                share,
                fair_share: fair,
                fair_share_dev: share / fair - 1.0,
            }
        })
        .collect();
    let fs: Vec<f64> = tenants.iter().map(|t| t.f).collect();
    let utilisation = runs
        .iter()
        .zip(alone_off)
        .map(|(r, &a)| if a > 0.0 { r.mb_per_s / a } else { 0.0 })
        .sum();
    CaseMode {
        case: case.into(),
        mode: mode.into(),
        f_util_min: fs.iter().copied().fold(f64::INFINITY, f64::min),
        f_util_mean: fs.iter().sum::<f64>() / fs.len().max(1) as f64,
        utilisation,
        tenants,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short runs: enough device time for the closed loops to settle.
    fn short(policy: Policy) -> Setup {
        Setup {
            runtime_ns: 40_000_000,
            ramp_ns: 20_000_000,
            ..Setup::daemon_like(policy)
        }
    }

    fn mb(runs: &[TenantRun], name: &str) -> f64 {
        runs.iter().find(|r| r.name == name).unwrap().mb_per_s
    }

    #[test]
    fn without_qos_the_drive_shows_the_appendix_interference() {
        let off = short(Policy::Fifo);
        // Intensity: twice the iodepth takes more of the drive (Gimbal App. D: 2.0x).
        let r = run(&off, &case("intensity").unwrap()).unwrap();
        assert!(mb(&r, "deep") > 1.6 * mb(&r, "shallow"), "{r:?}");
        // Size: the 64 KiB reader takes far more bytes (App. D: 16x).
        let r = run(&off, &case("size").unwrap()).unwrap();
        assert!(mb(&r, "large") > 5.0 * mb(&r, "small"), "{r:?}");
        // Pattern: reads beside writes keep well under their standalone bandwidth.
        let t = case("pattern_rand").unwrap();
        let alone = run(&off, &t[..1]).unwrap()[0].mb_per_s;
        let together = run(&off, &t).unwrap();
        assert!(
            mb(&together, "reader") < 0.6 * alone,
            "{together:?} vs {alone}"
        );
    }

    #[test]
    fn gimbal_evens_out_the_intensity_case_and_weights_move_the_split() {
        // bench/fairness.sh's acceptance metric: each tenant's bandwidth over its
        // standalone bandwidth, as a share of the sum, within ±15 % of its fair share.
        // (Raw MB/s are not equal under Gimbal: the iodepth-64 tenant's reads fit in
        // its half of the in-flight budget, so it never waits in the scheduler.)
        let share = |modes: &[CaseMode], mode: &str, name: &str| {
            let m = modes.iter().find(|m| m.mode == mode).unwrap();
            m.tenants.iter().find(|t| t.name == name).unwrap().share
        };
        let base = short(Policy::Gimbal);
        let even = run_case("intensity", &[], &base).unwrap();
        assert!(share(&even, "off", "deep") > 0.575, "{even:?}");
        for who in ["deep", "shallow"] {
            let s = share(&even, "gimbal", who);
            assert!((0.425..=0.575).contains(&s), "{who} {s}: {even:?}");
        }
        let weighted = run_case("intensity", &[("shallow".into(), 2)], &base).unwrap();
        let s = share(&weighted, "gimbal", "shallow");
        assert!(
            (2.0 / 3.0 * 0.85..=2.0 / 3.0 * 1.15).contains(&s),
            "{weighted:?}"
        );
    }

    #[test]
    fn gimbal_keeps_small_reads_using_the_drive_in_the_intensity_case() {
        // Utilisation (Σ BW / BW alone with QoS off) at least 85 % of QoS off. With
        // Gimbal's whole-slot retirement a slot of ten 4 KiB reads stayed held until
        // its slowest read was back: 0.84 of off here; the byte budget gives ~0.98.
        let modes = run_case("intensity", &[], &Setup::daemon_like(Policy::Gimbal)).unwrap();
        let util = |mode: &str| modes.iter().find(|m| m.mode == mode).unwrap().utilisation;
        assert!(util("gimbal") >= 0.85 * util("off"), "{modes:?}");
    }

    #[test]
    fn gimbal_shares_the_drive_between_small_and_large_reads() {
        // The size case: each tenant's share within ±15 % of 0.50 and utilisation at
        // least 85 % of QoS off. With budgets by weight alone (equal weighted bytes
        // in flight) the 4 KiB reader, whose reads come back sooner, got 0.67 / 0.33:
        // equal bytes in flight are not an equal rate when latencies differ (Little's
        // law), so each budget is also proportional to its tenant's device latency.
        let modes = run_case("size", &[], &Setup::daemon_like(Policy::Gimbal)).unwrap();
        let m = |mode: &str| modes.iter().find(|m| m.mode == mode).unwrap();
        for t in &m("gimbal").tenants {
            assert!((0.425..=0.575).contains(&t.share), "{}: {modes:?}", t.name);
        }
        assert!(
            m("gimbal").utilisation >= 0.85 * m("off").utilisation,
            "{modes:?}"
        );
    }

    #[test]
    fn a_calibrated_gimbal_lets_a_lone_reader_use_the_whole_drive_from_the_start() {
        // The 128 KiB reader of pattern_seq, alone, in the bench's phase lengths: with
        // the target rate starting at Gimbal's 1000 MiB/s it reached ~58 % of the
        // QoS-off bandwidth (the rate's slow start fills the phase); calibrated, it
        // starts at the drive's read bandwidth.
        let t = case("pattern_seq").unwrap();
        let off = run(&Setup::daemon_like(Policy::Fifo), &t[..1]).unwrap()[0].mb_per_s;
        let g = run(&Setup::daemon_like(Policy::Gimbal), &t[..1]).unwrap()[0].mb_per_s;
        assert!(g > 0.95 * off, "gimbal {g} vs off {off} MB/s");
    }

    #[test]
    fn a_run_replays_bit_identically_and_the_seed_matters() {
        let g = short(Policy::Gimbal);
        let t = case("pattern_rand").unwrap();
        let a = serde_json::to_string(&run(&g, &t).unwrap()).unwrap();
        assert_eq!(a, serde_json::to_string(&run(&g, &t).unwrap()).unwrap());
        let other = Setup { seed: 2, ..g };
        assert_ne!(a, serde_json::to_string(&run(&other, &t).unwrap()).unwrap());
    }

    #[test]
    fn the_cases_are_the_bench_job_files() {
        // `bench/jobs/fairness/NAME.toml` and `case(NAME)` must describe the same
        // tenants, or the simulator and the daemon run different experiments.
        fn bytes(v: &toml::Value) -> u64 {
            let s = v.as_str().unwrap();
            let (n, mul) = match s.as_bytes().last() {
                Some(b'k') => (&s[..s.len() - 1], 1 << 10),
                Some(b'm') => (&s[..s.len() - 1], 1 << 20),
                Some(b'g') => (&s[..s.len() - 1], 1 << 30),
                _ => (s, 1),
            };
            n.parse::<u64>().unwrap() * mul
        }
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../bench/jobs/fairness");
        for name in CASES {
            let text = std::fs::read_to_string(format!("{dir}/{name}.toml")).unwrap();
            let file: toml::Value = toml::from_str(&text).unwrap();
            let jobs = file["job"].as_array().unwrap();
            let sim = case(name).unwrap();
            assert_eq!(jobs.len(), sim.len(), "{name}");
            for (j, t) in jobs.iter().zip(&sim) {
                let rw = j["rw"].as_str().unwrap();
                assert_eq!(j["tenant"].as_str(), Some(t.name.as_str()), "{name}");
                assert_eq!(rw.contains("write"), t.dir == IoDir::Write, "{name} {rw}");
                assert_eq!(!rw.starts_with("rand"), t.sequential, "{name} {rw}");
                assert_eq!(bytes(&j["bs"]), t.bs as u64, "{name}");
                assert_eq!(j["iodepth"].as_integer(), Some(t.iodepth as i64), "{name}");
                assert_eq!(bytes(&j["offset"]), t.offset_bytes, "{name}");
                assert_eq!(bytes(&j["size"]), t.size_bytes, "{name}");
            }
        }
    }

    #[test]
    fn unknown_cases_are_refused_by_name() {
        let e = case("noisy").unwrap_err().to_string();
        assert!(e.contains("noisy") && e.contains("pattern_seq"), "{e}");
    }
}
