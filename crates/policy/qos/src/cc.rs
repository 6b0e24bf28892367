//! Delay-based congestion control (§1.a) and write-cost estimation (§1.b).

use crate::GimbalConfig;
use trellis_units::{IoDir, Nanos};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CcState {
    Overloaded,
    Congested,
    Avoidance,
    UnderUtilised,
}

/// Per-direction latency state, in µs (Gimbal's ticks converted to µs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirCc {
    pub ewma_us: u64,
    pub thresh_us: u64,
    pub residue: u64,
}

#[derive(Debug)]
pub struct CongestionControl {
    pub read: DirCc,
    pub write: DirCc,
    /// State the last completion of each direction put the SSD in ([read, write]).
    last_state: [Option<CcState>; 2],
    target_rate: u64,
    rate_min: u64,
    rate_max: u64,
    thresh_min_us: u64,
    thresh_max_us: u64,
    cpl_rate: u64,
    cpl_bytes: u64,
    cpl_t0_ns: u64,
    cpl_sample_bytes: u64,
    /// Since when the token bucket has held a request back (None: it is not).
    limited_since_ns: Option<Nanos>,
    /// Time in the current sample during which the bucket held a request back.
    limited_ns: u64,
    /// Every completion of the current sample found the drive under-utilised.
    idle_drive_in_sample: bool,
    /// Some completion of the current sample found the drive OVERLOADED.
    overloaded_in_sample: bool,
    /// The last sample measured an overloaded drive: it began at or after the
    /// overload's first completion, some completion in it was OVERLOADED, and our
    /// bucket held requests back for less than half of it (else it measured our
    /// own pace). Only such a completion rate is what an overloaded drive
    /// delivers, the rate Gimbal cuts to (docs/gimbal.md).
    cpl_rate_overloaded: bool,
    /// An overload is under way: some completion was OVERLOADED, and no sample
    /// since has closed without one.
    overload_episode: bool,
}

impl CongestionControl {
    pub fn new(cfg: &GimbalConfig) -> Self {
        assert!(cfg.thresh_min_us < cfg.thresh_max_us);
        let dir = DirCc {
            ewma_us: 0,
            thresh_us: cfg.thresh_max_us,
            residue: 0,
        };
        CongestionControl {
            read: dir,
            write: dir,
            last_state: [None; 2],
            target_rate: cfg.rate_init_bytes_per_s,
            rate_min: cfg.rate_min_bytes_per_s,
            rate_max: cfg.rate_max_bytes_per_s,
            thresh_min_us: cfg.thresh_min_us,
            thresh_max_us: cfg.thresh_max_us,
            cpl_rate: 0,
            cpl_bytes: 0,
            cpl_t0_ns: 0,
            cpl_sample_bytes: cfg.cpl_sample_bytes,
            limited_since_ns: None,
            limited_ns: 0,
            idle_drive_in_sample: true,
            overloaded_in_sample: false,
            cpl_rate_overloaded: false,
            overload_episode: false,
        }
    }

    pub fn target_rate(&self) -> u64 {
        self.target_rate
    }

    /// Latency state of one direction (EWMA and dynamic threshold, µs).
    pub fn dir_cc(&self, dir: IoDir) -> &DirCc {
        match dir {
            IoDir::Read => &self.read,
            IoDir::Write => &self.write,
        }
    }

    /// State set by the last completion in `dir`; None before the first one.
    pub fn last_state(&self, dir: IoDir) -> Option<CcState> {
        self.last_state[dir.index()]
    }

    /// Measured completion rate, B/s (0 until the first 16 MiB sample).
    pub fn cpl_rate(&self) -> u64 {
        self.cpl_rate
    }

    /// Apply one successful completion (`latency_ns` = device time, converted to Gimbal's
    /// µs ticks); returns the state it put the SSD in. Inlined into each of
    /// its three callers: it runs once per I/O, and a caller that knows the
    /// latency (zero, in `run_now`) then folds half of it away.
    #[inline(always)]
    pub fn on_complete(
        &mut self,
        dir: IoDir,
        len: u32,
        latency_ns: Nanos,
        now_ns: Nanos,
    ) -> CcState {
        let (tmin, tmax) = (self.thresh_min_us, self.thresh_max_us);
        let cc = match dir {
            IoDir::Write => &mut self.write,
            IoDir::Read => &mut self.read,
        };
        let state = update_dir(cc, latency_ns / 1000, tmin, tmax);
        self.last_state[dir.index()] = Some(state);
        if state == CcState::Overloaded && !self.overload_episode {
            self.begin_overload(now_ns);
        }
        self.idle_drive_in_sample &= state == CcState::UnderUtilised;
        self.overloaded_in_sample |= state == CcState::Overloaded;
        let len = len as u64;
        self.target_rate = match state {
            CcState::Overloaded => {
                // [R] Gimbal cuts to the last sample's completion rate whatever the
                // drive did in it; we cut only to a sample that measured the
                // overloaded drive. Until one has closed (a lone stall, as an
                // erase, or the first 16 MiB of an overload) this is CONGESTED's
                // step, and the bucket is still emptied (docs/gimbal.md).
                let r = if self.cpl_rate > 0 && self.cpl_rate_overloaded {
                    self.target_rate.min(self.cpl_rate)
                } else {
                    self.target_rate
                };
                r.saturating_sub(len)
            }
            CcState::Congested => self.target_rate.saturating_sub(len),
            CcState::Avoidance => self.target_rate + len,
            CcState::UnderUtilised => self.target_rate + 8 * len,
        }
        .clamp(self.rate_min, self.rate_max);
        self.sample_cpl_rate(len, now_ns);
        state
    }

    /// `on_complete(dir, len, 0, now_ns)` where the direction's EWMA is at
    /// most Thresh_min (so the sample is UNDER-UTILISED, as it stays: a zero
    /// sample only halves the EWMA): the same state changes without the
    /// state dispatch. The scheduler's lane (docs/gimbal.md) calls it.
    #[inline]
    pub fn on_idle_complete(&mut self, dir: IoDir, len: u32, now_ns: Nanos) {
        let (tmin, tmax) = (self.thresh_min_us, self.thresh_max_us);
        let cc = match dir {
            IoDir::Write => &mut self.write,
            IoDir::Read => &mut self.read,
        };
        let state = update_dir(cc, 0, tmin, tmax);
        debug_assert_eq!(state, CcState::UnderUtilised);
        self.last_state[dir.index()] = Some(CcState::UnderUtilised);
        let len = len as u64;
        self.target_rate = (self.target_rate + 8 * len).clamp(self.rate_min, self.rate_max);
        self.sample_cpl_rate(len, now_ns);
    }

    /// How many `on_idle_complete(dir, len, now_ns)` calls in a row at this
    /// instant [`Self::on_idle_completes`] may apply at once: 0 unless the
    /// direction sits at its fixed point under zero-latency samples (EWMA 0
    /// or 1, threshold at Thresh_min: then only the threshold's 4-bit
    /// remainder, the rate and the completed bytes move); otherwise as many
    /// as close no completion-rate sample.
    pub fn idle_room(&self, dir: IoDir, len: u32, now_ns: Nanos) -> u64 {
        let cc = self.dir_cc(dir);
        if cc.ewma_us > 1 || cc.thresh_us != self.thresh_min_us || self.target_rate < self.rate_min
        {
            return 0;
        }
        if now_ns <= self.cpl_t0_ns {
            return u64::MAX; // no sample closes at this instant
        }
        self.cpl_sample_bytes.saturating_sub(self.cpl_bytes) / (len as u64).max(1)
    }

    /// `n` calls of `on_idle_complete(dir, len, now_ns)` that
    /// [`Self::idle_room`] allowed: the same state in one step. The EWMA and
    /// the threshold stay; each call adds Thresh_min − EWMA to the remainder
    /// (kept mod 16), 8 × len to the rate (up to its ceiling) and len to the
    /// completed bytes.
    pub fn on_idle_completes(&mut self, dir: IoDir, len: u32, n: u64) {
        let tmin = self.thresh_min_us;
        let cc = match dir {
            IoDir::Write => &mut self.write,
            IoDir::Read => &mut self.read,
        };
        debug_assert!(cc.ewma_us <= 1 && cc.thresh_us == tmin);
        let step = (tmin - cc.ewma_us) & 15;
        cc.residue = (cc.residue + (step * (n & 15))) & 15;
        self.last_state[dir.index()] = Some(CcState::UnderUtilised);
        let len = len as u64;
        self.target_rate = self
            .target_rate
            .saturating_add((8 * len).saturating_mul(n))
            .clamp(self.rate_min, self.rate_max);
        self.cpl_bytes += len * n;
    }

    #[inline(always)]
    fn sample_cpl_rate(&mut self, len: u64, now_ns: Nanos) {
        self.cpl_bytes += len;
        if self.cpl_bytes > self.cpl_sample_bytes && now_ns > self.cpl_t0_ns {
            self.resample_cpl_rate(now_ns);
        }
    }

    /// Once per `cpl_sample_bytes` (16 MiB): kept out of line.
    #[cold]
    fn resample_cpl_rate(&mut self, now_ns: Nanos) {
        self.cpl_rate =
            (self.cpl_bytes as u128 * 1_000_000_000 / (now_ns - self.cpl_t0_ns) as u128) as u64;
        if let Some(since) = self.limited_since_ns.as_mut() {
            self.limited_ns += now_ns.saturating_sub(*since);
            *since = now_ns;
        }
        let window_ns = now_ns - self.cpl_t0_ns;
        // [R] Held back by our own bucket for most of the sample while every
        // completion found the drive under-utilised: the rate, not the drive, set
        // the pace, so grow it as a slow start would (docs/gimbal.md).
        if self.idle_drive_in_sample && self.limited_ns.saturating_mul(2) >= window_ns {
            self.target_rate = self
                .target_rate
                .max(self.cpl_rate.saturating_mul(2))
                .clamp(self.rate_min, self.rate_max);
        }
        self.cpl_rate_overloaded =
            self.overloaded_in_sample && self.limited_ns.saturating_mul(2) < window_ns;
        self.overload_episode = self.overloaded_in_sample;
        self.start_sample(now_ns);
    }

    /// A completion-rate sample begins at `now_ns`: nothing completed, limited or
    /// seen in it yet.
    fn start_sample(&mut self, now_ns: Nanos) {
        self.cpl_t0_ns = now_ns;
        self.cpl_bytes = 0;
        self.limited_ns = 0;
        if let Some(since) = self.limited_since_ns.as_mut() {
            *since = now_ns;
        }
        self.idle_drive_in_sample = true;
        self.overloaded_in_sample = false;
    }

    /// The first OVERLOADED completion of an overload: the sample under way began
    /// before it (and may span idle time or another load), so it starts again
    /// here, and the last rate is not one to cut to.
    #[cold]
    fn begin_overload(&mut self, now_ns: Nanos) {
        self.overload_episode = true;
        self.cpl_rate_overloaded = false;
        self.start_sample(now_ns);
    }

    /// The token bucket began holding a request back (no-op if it already was).
    #[inline]
    pub fn rate_limited_from(&mut self, now_ns: Nanos) {
        if self.limited_since_ns.is_none() {
            self.limited_since_ns = Some(now_ns);
        }
    }

    /// A request passed the bucket: whatever it held back has gone.
    #[inline]
    pub fn rate_limit_ended(&mut self, now_ns: Nanos) {
        if let Some(since) = self.limited_since_ns.take() {
            self.limited_ns += now_ns.saturating_sub(since);
        }
    }

    /// Test hook: set the measured completion rate directly, as a sample taken
    /// during an overload that is still under way.
    pub fn set_cpl_rate(&mut self, rate: u64) {
        self.cpl_rate = rate;
        self.cpl_rate_overloaded = true;
        self.overload_episode = true;
    }
}

/// Steps 2-6 of §1.a for one direction.
#[inline]
pub fn update_dir(cc: &mut DirCc, lat_us: u64, tmin: u64, tmax: u64) -> CcState {
    cc.ewma_us = (lat_us >> 1) + cc.ewma_us - (cc.ewma_us >> 1);
    let state = if cc.ewma_us > tmax {
        CcState::Overloaded
    } else if cc.ewma_us > cc.thresh_us {
        CcState::Congested
    } else if cc.ewma_us > tmin {
        CcState::Avoidance
    } else {
        CcState::UnderUtilised
    };
    match state {
        CcState::Overloaded | CcState::Congested => {
            cc.thresh_us = (cc.thresh_us + tmax) / 2;
            cc.residue = 0;
        }
        _ => {
            // Decay toward the observed latency by 1/16, carrying the 4-bit remainder.
            cc.residue += cc.thresh_us - cc.ewma_us;
            cc.thresh_us -= cc.residue >> 4;
            cc.residue &= 15;
        }
    }
    cc.thresh_us = cc.thresh_us.clamp(tmin, tmax);
    state
}

/// Write cost in FP10 (1024 = 1.0), AD/MI every window [G], range [1.0, 9.0].
#[derive(Debug)]
pub struct WriteCost {
    fp10: u64,
    window_ns: Nanos,
    window_start_ns: u64,
    reads: u64,
    writes: u64,
    write_lat_sum_us: u64,
}

pub const WC_ONE: u64 = 1024;
pub const WC_MAX: u64 = 9216;
pub const WC_DESC: u64 = 512;

impl WriteCost {
    pub fn new(init_fp10: u64, window_ns: Nanos, now_ns: Nanos) -> Self {
        WriteCost {
            fp10: init_fp10.clamp(WC_ONE, WC_MAX),
            window_ns,
            window_start_ns: now_ns,
            reads: 0,
            writes: 0,
            write_lat_sum_us: 0,
        }
    }

    pub fn fp10(&self) -> u64 {
        self.fp10
    }

    /// Weighted length used by DRR and slots: writes cost (wc × len) >> 10 [G].
    /// `len` may include the per-I/O cost (`io_cost_bytes`); it stays far below 2^40,
    /// so the product fits (wc ≤ 9216 < 2^14).
    pub fn weighted(dir: IoDir, len: u64, wc_fp10: u64) -> u64 {
        match dir {
            IoDir::Write => (wc_fp10 * len) >> 10,
            IoDir::Read => len,
        }
    }

    #[inline]
    pub fn on_complete(
        &mut self,
        dir: IoDir,
        latency_ns: Nanos,
        now_ns: Nanos,
        tmin_us: u64,
        tmax_us: u64,
    ) {
        if now_ns >= self.window_start_ns.saturating_add(self.window_ns) {
            self.end_window(tmin_us, tmax_us);
            self.window_start_ns = now_ns;
        }
        match dir {
            IoDir::Read => self.reads += 1,
            IoDir::Write => {
                self.writes += 1;
                self.write_lat_sum_us += latency_ns / 1000;
            }
        }
    }

    /// One 100 ms window: MI toward 9.0 when writes look slow, else AD by 0.5.
    /// [G] divides a count by a count here (a bug); we use the latency sum (§1.b).
    /// Whether a completion at `now_ns` stays in the current window.
    pub fn window_open(&self, now_ns: Nanos) -> bool {
        now_ns < self.window_start_ns.saturating_add(self.window_ns)
    }

    /// `n` zero-latency completions in `dir` inside the current window.
    pub fn count_n(&mut self, dir: IoDir, n: u64) {
        match dir {
            IoDir::Read => self.reads += n,
            IoDir::Write => self.writes += n,
        }
    }

    pub fn end_window(&mut self, tmin_us: u64, tmax_us: u64) {
        let w_avg = self.write_lat_sum_us.checked_div(self.writes).unwrap_or(0);
        if (self.reads > 0 && w_avg > tmin_us) || w_avg > tmax_us {
            self.fp10 = (self.fp10 + WC_MAX) / 2;
        } else {
            self.fp10 = self.fp10.saturating_sub(WC_DESC);
        }
        self.fp10 = self.fp10.clamp(WC_ONE, WC_MAX);
        self.reads = 0;
        self.writes = 0;
        self.write_lat_sum_us = 0;
    }
}
