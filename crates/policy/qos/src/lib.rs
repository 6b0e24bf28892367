//! Storage-side scheduling for one namespace (one SSD): Gimbal (SIGCOMM'21) and a
//! plain FIFO, behind one sans-IO scheduler core ([`sched`]).
//!
//! Sans-IO and allocation-free per I/O: the caller passes `now_ns` (u64 ns), submits
//! requests, pulls what may go to the device with `poll_dispatch`, and reports device
//! latency with `complete`. The Gimbal pieces are public so that their worked examples
//! can be tested one by one: congestion control ([`CongestionControl`]), write cost
//! ([`WriteCost`]), DRR with virtual slots ([`Drr`]), the dual token bucket
//! ([`DualTokenBucket`]). Rules, constants and worked examples are in docs/gimbal.md,
//! whose section labels (§1.a–§1.g, Ex 1.x-n) the comments below use; §3.3 is
//! docs/isr.md. Tags (docs/sources.md): [G] = Gimbal's public traffic-manager code,
//! [Gimbal] = the paper, [R] = our choice.
//!
//! Two units are called "credit" in Trellis; this crate deals only in the first:
//! - **I/O credits** (`io_credits`, unit: I/Os): Gimbal's per-tenant allowance of
//!   outstanding I/Os, `min(65535, slots × I/Os per slot)` (§1.e), carried in CQE DW1.
//! - **SSD credit** (`ssd_credit_mib_per_s` in `trellis-fabric`, unit: MiB/s): the
//!   NSDI'26 per-SSD bandwidth headroom (§3.3). This crate supplies the headroom, in
//!   B/s, as [`sched::Scheduler::headroom_bytes_per_s`].

mod cc;
mod drr;
mod pool;
pub mod sched;
mod token;

pub use cc::{CcState, CongestionControl, DirCc, WriteCost};
pub use drr::{Drr, Request, SlotTag, MAX_SLOTS_PER_SSD};
pub use token::DualTokenBucket;
pub use trellis_units::DeviceModel;

use serde::{Deserialize, Serialize};

/// Errors of the Gimbal building blocks; the scheduler never drops silently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QosError {
    /// The tenant's queue, or the shared request pool, is at its bound.
    QueueFull,
    /// Tenant id outside the tenant table.
    BadTenant,
    /// Weight 0 (a tenant that never gets a quantum would starve forever).
    BadWeight,
    /// A zero-length request (the scheduler charges these one byte instead).
    ZeroLength,
}

/// Gimbal's parameters for one SSD. Every default is the value of docs/gimbal.md §1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GimbalConfig {
    /// Thresh_min, µs (Gimbal's tick taken as 1 µs, §1.a examples) [G].
    pub thresh_min_us: u64,
    /// Thresh_max, µs: 1500 for the DCT983, 3000 tuned for the P3600 [G] (§1.a).
    pub thresh_max_us: u64,
    /// Initial target_rate, 1000 MiB/s [G] (§1.a).
    pub rate_init_bytes_per_s: u64,
    /// Rate clamp floor, 50 MiB/s [G] (§1.a).
    pub rate_min_bytes_per_s: u64,
    /// Rate clamp ceiling, 4 GiB/s [G] (§1.a).
    pub rate_max_bytes_per_s: u64,
    /// cpl_rate is resampled every 16 MiB completed [G] (§1.a step 8).
    pub cpl_sample_bytes: u64,
    /// DRR quantum Q, 128 KiB "the maximum I/O size" [Gimbal] appendix, [G] (§1.c).
    pub quantum_bytes: u64,
    /// Virtual slot capacity, 128 KiB of weighted length [G] (§1.c).
    pub slot_bytes: u64,
    /// Slots per SSD for one active tenant, 8 [G] `DRR_NUM_VQE − 1` (§1.c); at most
    /// [`MAX_SLOTS_PER_SSD`].
    pub slots_per_ssd: u32,
    /// Capacity of each token bucket, 256 KiB [Gimbal] Algorithm 4, [G] (§1.d).
    pub bucket_bytes: u64,
    /// Initial write cost in FP10, 9.0 = 9216 (pessimistic) [G] (§1.b).
    pub write_cost_init_fp10: u64,
    /// Write-cost AD/MI window, 100 ms [G] (§1.b).
    pub write_cost_window_ns: u64,
    /// Initial I/O credits per virtual slot, 32 [G] (§1.c per-tenant state, §1.e).
    pub io_credits_per_vslot_init: u32,
    /// [R] Cost of one I/O beyond its bytes, added to its length before the write-cost
    /// weighting (the fixed per-I/O term of Linux blk-iocost's linear cost model). 0 is
    /// Gimbal's cost (bytes only); [`GimbalConfig::calibrated`] derives it from a drive's
    /// capacities so that DRR shares drive time rather than bytes (docs/gimbal.md
    /// "Calibration"). At most [`MAX_IO_COST_BYTES`].
    pub io_cost_bytes: u64,
}

/// Largest accepted `slot_bytes`: 64 MiB, 512 × Gimbal's 128 KiB. It keeps a tenant's
/// budget (at most 32 slots) below 2³², the range of an in-flight request's weighted
/// length, and `budget × weight` within a u64.
pub const MAX_SLOT_BYTES: u64 = 64 << 20;

/// Largest accepted `io_cost_bytes`: 1 MiB, far above any drive's per-I/O cost (a 4 KiB
/// read that cost more than a 1 MiB read would describe a drive that moves no data).
pub const MAX_IO_COST_BYTES: u64 = 1 << 20;

impl Default for GimbalConfig {
    fn default() -> Self {
        GimbalConfig {
            thresh_min_us: 250,
            thresh_max_us: 1500,
            rate_init_bytes_per_s: 1_048_576_000,
            rate_min_bytes_per_s: 52_428_800,
            rate_max_bytes_per_s: 4_294_967_296,
            cpl_sample_bytes: 16 << 20,
            quantum_bytes: 131_072,
            slot_bytes: 131_072,
            slots_per_ssd: 8,
            bucket_bytes: 262_144,
            write_cost_init_fp10: 9216,
            write_cost_window_ns: 100_000_000,
            io_credits_per_vslot_init: 32,
            io_cost_bytes: 0,
        }
    }
}

impl GimbalConfig {
    /// Reject configurations the algorithms cannot run with (instead of panicking later).
    pub fn validate(&self) -> Result<(), &'static str> {
        let checks = [
            (
                self.thresh_min_us < self.thresh_max_us,
                "thresh_min_us must be below thresh_max_us",
            ),
            (
                self.rate_min_bytes_per_s > 0
                    && self.rate_min_bytes_per_s <= self.rate_max_bytes_per_s,
                "need 0 < rate_min_bytes_per_s <= rate_max_bytes_per_s",
            ),
            (self.quantum_bytes > 0, "quantum_bytes must be positive"),
            (
                self.slot_bytes > 0 && self.slot_bytes <= MAX_SLOT_BYTES,
                "slot_bytes must be in 1..=67108864 (64 MiB)",
            ),
            (
                self.slots_per_ssd >= 1 && self.slots_per_ssd <= MAX_SLOTS_PER_SSD,
                "slots_per_ssd must be in 1..=32",
            ),
            (
                self.io_cost_bytes <= MAX_IO_COST_BYTES,
                "io_cost_bytes must be at most 1048576 (1 MiB)",
            ),
            (self.bucket_bytes > 0, "bucket_bytes must be positive"),
            (
                self.write_cost_window_ns > 0,
                "write_cost_window_ns must be positive",
            ),
            (
                self.io_credits_per_vslot_init > 0,
                "io_credits_per_vslot_init must be positive",
            ),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, why)) => Err(why),
            None => Ok(()),
        }
    }
}

impl GimbalConfig {
    /// These parameters with the drive-specific ones derived from `m`
    /// (docs/gimbal.md "Calibration"); the others are kept.
    /// - `io_cost_bytes` = `read_bytes_per_s / read_4k_iops − 4096`: with it a 4 KiB read
    ///   and its bytes' share of a large read cost the drive time they take (blk-iocost's
    ///   linear model, Linux Documentation/admin-guide/cgroup-v2.rst `io.cost.model`).
    /// - `slots_per_ssd` = the saturating queue of 128 KiB reads, in slots of
    ///   `slot_bytes` of cost: Gimbal's own rule, "the minimum number of slots that reaches
    ///   the device's maximum bandwidth" (§1.c); clamped to 1..=[`MAX_SLOTS_PER_SSD`].
    /// - `rate_max_bytes_per_s` = at least the drive's link and read bandwidth. Gimbal's
    ///   4 GiB/s ceiling is PCIe 3.0 ×4 (3.94 GB/s), its drives' link; on a faster link
    ///   it would cap the drive below what it can do.
    /// - `rate_init_bytes_per_s` = at least the drive's read bandwidth. Gimbal starts at
    ///   1000 MiB/s, under a third of its 3.2 GB/s drive, and while under-utilised adds
    ///   8 × len per completion: with the bucket binding, completions come at rate / len,
    ///   so the rate grows as e^(8t) and takes ln(7.03 / 1.05) / 8 ≈ 0.24 s to reach a
    ///   7 GB/s drive, the whole of a time-scaled bench phase. Starting at the measured
    ///   bandwidth costs nothing when the drive is congested: the first OVERLOADED
    ///   completion drops the rate to the completion rate (§1.a).
    pub fn calibrated(&self, m: &DeviceModel) -> GimbalConfig {
        let mut c = self.clone();
        if let Some(per_io) = m.read_bytes_per_s.checked_div(m.read_4k_iops) {
            c.io_cost_bytes = per_io.saturating_sub(4096).min(MAX_IO_COST_BYTES);
        }
        if m.read_128k_saturation_qd > 0 {
            let cost = m.read_128k_saturation_qd as u64 * ((128 << 10) + c.io_cost_bytes);
            c.slots_per_ssd = cost
                .div_ceil(c.slot_bytes.max(1))
                .clamp(1, MAX_SLOTS_PER_SSD as u64) as u32;
        }
        c.rate_max_bytes_per_s = c
            .rate_max_bytes_per_s
            .max(m.link_bytes_per_s)
            .max(m.read_bytes_per_s);
        c.rate_init_bytes_per_s = c
            .rate_init_bytes_per_s
            .max(m.read_bytes_per_s)
            .min(c.rate_max_bytes_per_s);
        c
    }
}

/// Client side of Algorithm 3: admit while `io_credits_total > inflight_ios` [Gimbal].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoCreditWindow {
    /// Latest I/O credits granted by the target (Algorithm 3's `credit_tot`), in I/Os.
    pub io_credits_total: u32,
    /// I/Os sent and not yet completed.
    pub inflight_ios: u32,
}

impl IoCreditWindow {
    /// [R] 256 = 8 slots × 32, a fresh tenant's value at the target (§1.e).
    pub fn new() -> Self {
        IoCreditWindow {
            io_credits_total: 256,
            inflight_ios: 0,
        }
    }

    /// True if the I/O may be sent now (and counts it), false = device busy.
    pub fn try_submit(&mut self) -> bool {
        if self.io_credits_total > self.inflight_ios {
            self.inflight_ios += 1;
            true
        } else {
            false
        }
    }

    /// Completion: overwrite the credit with the latest value, release one in-flight slot.
    /// [R] Also on error completions, so that a failed I/O does not leak a credit.
    /// A completion with nothing in flight (a confused or hostile peer) is ignored.
    pub fn on_complete(&mut self, io_credits: u32) {
        if self.inflight_ios == 0 {
            return;
        }
        self.io_credits_total = io_credits;
        self.inflight_ios -= 1;
    }
}

impl Default for IoCreditWindow {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests;
