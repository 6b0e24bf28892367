//! No QoS: requests go to the device in arrival order, at most `device_qd` at a time.
//! This is what a plain NVMe-oF target does, and the baseline Gimbal is measured
//! against (the interference of the Gimbal appendix, §1.g).
//!
//! Congestion control still runs on every completion, but only to measure: it gives
//! the device headroom (the NSDI'26 SSD credit, §3.3) and the view; it never holds a
//! request back.

use super::table::{ReqTable, State};
use super::{
    check_config, check_weight, headroom, make_view, Completed, Dispatch, Policy, SchedConfig,
    SchedError, SchedLimits, Scheduler, Submitted, Tag, TenantFigures, TenantId, TenantView,
};
use crate::pool::{List, ListPool};
use crate::{CongestionControl, GimbalConfig, WriteCost};
use trellis_units::{IoDir, Nanos};

#[derive(Clone, Copy, Debug)]
struct TenantCounts {
    queued: u32,
    inflight: u32,
    weight: u32,
}

pub struct FifoScheduler {
    cfg: GimbalConfig,
    limits: SchedLimits,
    device_qd: u32,
    table: ReqTable,
    pool: ListPool<Tag>,
    queue: List,
    tenants: Vec<TenantCounts>,
    inflight: u32,
    cc: CongestionControl,
    wc: WriteCost,
}

impl FifoScheduler {
    pub fn new(cfg: &SchedConfig, now_ns: Nanos) -> Result<Self, &'static str> {
        check_config(cfg)?;
        let (g, l) = (&cfg.gimbal, &cfg.limits);
        let zero = TenantCounts {
            queued: 0,
            inflight: 0,
            weight: 1,
        };
        Ok(FifoScheduler {
            table: ReqTable::new(l.max_requests, l.prealloc_requests),
            pool: ListPool::new(l.max_requests, l.prealloc_requests),
            queue: List::new(),
            tenants: vec![zero; l.max_tenants as usize],
            inflight: 0,
            cc: CongestionControl::new(g),
            wc: WriteCost::new(g.write_cost_init_fp10, g.write_cost_window_ns, now_ns),
            device_qd: cfg.device_qd,
            cfg: g.clone(),
            limits: l.clone(),
        })
    }

    fn release(&mut self, tag: Tag) -> Completed {
        let e = *self
            .table
            .get(tag, State::InFlight)
            .expect("release of a request not in flight");
        self.table.free(tag);
        self.inflight -= 1;
        debug_assert_eq!(self.table.live(), self.queued() + self.inflight);
        self.tenants[e.tenant as usize].inflight -= 1;
        Completed {
            tenant: e.tenant,
            io_credits: self.fifo_io_credits(),
        }
    }

    /// Every tenant may use the whole device queue: no isolation, the FIFO's nature.
    fn fifo_io_credits(&self) -> u32 {
        self.device_qd.min(65535)
    }
}

impl Scheduler for FifoScheduler {
    fn policy(&self) -> Policy {
        Policy::Fifo
    }

    fn submit(
        &mut self,
        tenant: TenantId,
        dir: IoDir,
        len_bytes: u32,
        now_ns: Nanos,
    ) -> Result<Submitted, SchedError> {
        let Some(counts) = self.tenants.get(tenant as usize) else {
            return Err(SchedError::BadTenant);
        };
        if counts.queued >= self.limits.max_queued_per_tenant {
            return Ok(Submitted::Busy);
        }
        let Some(tag) = self.table.alloc(tenant, dir, len_bytes) else {
            return Ok(Submitted::Busy);
        };
        // The pool has the table's capacity, so a row always finds a node.
        let pushed = self.pool.push_back(&mut self.queue, tag);
        assert!(pushed, "FIFO pool smaller than the request table");
        self.tenants[tenant as usize].queued += 1;
        if self.queue.len() == 1 {
            if let Some(d) = self.poll_dispatch(now_ns) {
                return Ok(Submitted::Dispatch(d.tag));
            }
        }
        Ok(Submitted::Queued(tag))
    }

    fn poll_dispatch(&mut self, _now_ns: Nanos) -> Option<Dispatch> {
        if self.inflight >= self.device_qd {
            return None;
        }
        let tag = self.pool.pop_front(&mut self.queue)?;
        let e = self
            .table
            .get_mut(tag, State::Queued)
            .expect("FIFO holds a request the table does not");
        e.state = State::InFlight;
        let d = Dispatch {
            tag,
            tenant: e.tenant,
            dir: e.dir,
            len_bytes: e.len_bytes,
        };
        let t = &mut self.tenants[d.tenant as usize];
        t.queued -= 1;
        t.inflight += 1;
        self.inflight += 1;
        Some(d)
    }

    fn complete(
        &mut self,
        tag: Tag,
        device_latency_ns: Nanos,
        now_ns: Nanos,
    ) -> Result<Completed, SchedError> {
        let e = *self
            .table
            .get(tag, State::InFlight)
            .ok_or(SchedError::BadTag)?;
        self.cc
            .on_complete(e.dir, e.len_bytes, device_latency_ns, now_ns);
        let (tmin, tmax) = (self.cfg.thresh_min_us, self.cfg.thresh_max_us);
        self.wc
            .on_complete(e.dir, device_latency_ns, now_ns, tmin, tmax);
        Ok(self.release(tag))
    }

    fn abort(&mut self, tag: Tag, _now_ns: Nanos) -> Result<Completed, SchedError> {
        self.table
            .get(tag, State::InFlight)
            .ok_or(SchedError::BadTag)?;
        Ok(self.release(tag))
    }

    /// Only a completion frees device queue depth: no timer is ever needed.
    fn next_timeout(&self) -> Option<Nanos> {
        None
    }

    /// Recorded for the view; the FIFO serves in arrival order regardless.
    fn set_weight(&mut self, tenant: TenantId, weight: u32) -> Result<(), SchedError> {
        check_weight(weight)?;
        let t = self
            .tenants
            .get_mut(tenant as usize)
            .ok_or(SchedError::BadTenant)?;
        t.weight = weight;
        Ok(())
    }

    fn io_credits(&self, tenant: TenantId) -> Option<u32> {
        self.tenants
            .get(tenant as usize)
            .map(|_| self.fifo_io_credits())
    }

    fn view(&self, tenant: TenantId) -> Option<TenantView> {
        let t = self.tenants.get(tenant as usize)?;
        let figures = TenantFigures {
            tenant,
            weight: t.weight,
            io_credits: self.fifo_io_credits(),
            queued: t.queued,
            inflight: t.inflight,
        };
        Some(make_view(figures, &self.cc, &self.wc))
    }

    fn headroom_bytes_per_s(&self) -> u64 {
        headroom(&self.cc)
    }

    fn queued(&self) -> u32 {
        self.queue.len()
    }

    fn inflight(&self) -> u32 {
        self.inflight
    }
}
