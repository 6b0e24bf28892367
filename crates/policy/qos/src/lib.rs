//! Gimbal storage-side scheduling (SIGCOMM'21), one instance per SSD.
//!
//! Sans-IO and allocation-free per I/O: the caller passes `now_ns`, submits
//! requests with `submit`, pulls what may go to the device with
//! `poll_dispatch`, and reports device latency with `complete`. Rules and
//! constants follow algorithms.md §1 (tags [G], [S:004], [R]).

mod cc;
mod drr;
mod token;

pub use cc::{CcState, CongestionControl, WriteCost};
pub use drr::{Drr, Request, SlotTag};
pub use token::DualTokenBucket;

use serde::{Deserialize, Serialize};
use trellis_units::IoDir;

/// Errors visible to callers; the scheduler never drops silently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QosError {
    QueueFull,
    BadTenant,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GimbalConfig {
    pub thresh_min_us: u64,
    pub thresh_max_us: u64,
    pub rate_init_bytes_per_s: u64,
    pub rate_min_bytes_per_s: u64,
    pub rate_max_bytes_per_s: u64,
    pub cpl_sample_bytes: u64,
    pub quantum_bytes: u64,
    pub slot_bytes: u64,
    pub slots_per_ssd: u32,
    pub bucket_bytes: u64,
    pub write_cost_init_fp10: u64,
    pub write_cost_window_ns: u64,
    pub max_tenants: usize,
    pub queue_capacity_per_tenant: usize,
    pub credit_per_vslot_init: u32,
}

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
            max_tenants: 64,
            queue_capacity_per_tenant: 1024,
            credit_per_vslot_init: 32,
        }
    }
}

/// An I/O the caller may now send to the SSD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatch {
    pub tenant: u16,
    pub req: Request,
    pub slot: SlotTag,
}

/// Gimbal for one SSD: DRR with virtual slots (level 1), dual token bucket paced by
/// delay-based congestion control (level 2), credits for clients.
pub struct Gimbal {
    cfg: GimbalConfig,
    pub cc: CongestionControl,
    pub wc: WriteCost,
    pub drr: Drr,
    pub bucket: DualTokenBucket,
    /// The dequeued I/O that did not conform; nothing passes it (no reordering [S:004]).
    blocked: Option<Dispatch>,
}

impl Gimbal {
    pub fn new(cfg: GimbalConfig, now_ns: u64) -> Self {
        Gimbal {
            cc: CongestionControl::new(&cfg),
            wc: WriteCost::new(cfg.write_cost_init_fp10, cfg.write_cost_window_ns, now_ns),
            drr: Drr::new(&cfg),
            bucket: DualTokenBucket::new(cfg.bucket_bytes, now_ns),
            blocked: None,
            cfg,
        }
    }

    pub fn config(&self) -> &GimbalConfig {
        &self.cfg
    }

    /// Queue one request of `tenant`. `tag` is the caller's handle, returned on dispatch.
    pub fn submit(
        &mut self,
        tenant: u16,
        dir: IoDir,
        size_bytes: u32,
        tag: u64,
    ) -> Result<(), QosError> {
        let req = Request {
            tag,
            dir,
            size_bytes,
        };
        self.drr.enqueue(tenant, req)
    }

    /// Next I/O allowed to go to the device now, if any.
    pub fn poll_dispatch(&mut self, now_ns: u64) -> Option<Dispatch> {
        self.bucket
            .refill(self.cc.target_rate(), self.wc.fp10(), now_ns);
        if let Some(d) = self.blocked {
            if !self.bucket.try_take(d.req.dir, d.req.size_bytes) {
                return None;
            }
            self.blocked = None;
            return Some(d);
        }
        let (tenant, req, slot) = self.drr.dequeue(self.wc.fp10())?;
        let d = Dispatch { tenant, req, slot };
        if self.bucket.try_take(req.dir, req.size_bytes) {
            return Some(d);
        }
        self.blocked = Some(d);
        None
    }

    /// When tokens will next allow the blocked I/O (for the caller's timer), if one is blocked.
    pub fn next_wakeup_ns(&self, now_ns: u64) -> Option<u64> {
        let d = self.blocked?;
        Some(
            now_ns
                + self.bucket.wait_ns(
                    d.req.dir,
                    d.req.size_bytes,
                    self.cc.target_rate(),
                    self.wc.fp10(),
                ),
        )
    }

    /// Report a device completion: `latency_ns` is from device submit to device completion.
    pub fn complete(&mut self, d: &Dispatch, latency_ns: u64, now_ns: u64) {
        let state = self
            .cc
            .on_complete(d.req.dir, d.req.size_bytes, latency_ns, now_ns);
        if state == CcState::Overloaded {
            self.bucket.zero();
        }
        self.wc.on_complete(
            d.req.dir,
            latency_ns,
            now_ns,
            self.cfg.thresh_min_us,
            self.cfg.thresh_max_us,
        );
        self.drr.release(d.tenant, d.slot);
    }

    /// Credits for `tenant`, in I/Os: vqmaxqd × credit_per_vslot, capped at 65535 [G].
    pub fn credits(&self, tenant: u16) -> u32 {
        self.drr.credits(tenant)
    }

    /// Bandwidth headroom of this SSD, B/s: max(0, target_rate − cpl_rate) [R §3.3].
    pub fn headroom_bytes_per_s(&self) -> u64 {
        self.cc.target_rate().saturating_sub(self.cc.cpl_rate())
    }

    pub fn queued(&self) -> usize {
        self.drr.queued() + self.blocked.is_some() as usize
    }
}

/// Client side of Algorithm 3: admit while `credit_tot > inflight` [S:004].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreditWindow {
    pub credit_tot: u32,
    pub inflight: u32,
}

impl CreditWindow {
    /// [R] 256 = 8 slots × 32, a fresh tenant's value at the target.
    pub fn new() -> Self {
        CreditWindow {
            credit_tot: 256,
            inflight: 0,
        }
    }

    /// True if the I/O may be sent now (and counts it), false = device busy.
    pub fn try_submit(&mut self) -> bool {
        if self.credit_tot > self.inflight {
            self.inflight += 1;
            true
        } else {
            false
        }
    }

    /// Completion: overwrite the credit with the latest value, release one in-flight slot.
    /// [R] Also on error completions, so that a failed I/O does not leak a credit.
    pub fn on_complete(&mut self, credit: u32) {
        assert!(self.inflight > 0, "completion without an I/O in flight");
        self.credit_tot = credit;
        self.inflight -= 1;
    }
}

impl Default for CreditWindow {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests;
