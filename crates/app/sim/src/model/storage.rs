//! The targets: one SSD model and one scheduler (the daemon's core) per SSD,
//! commands offered to the scheduler and dispatched to the device, and the
//! completion (or R2T) sent back toward the host.

use super::{
    IoRef, Msg, Packet, PktKind, R2t, Sim, SsdSlot, DOWN, EV_RETRY, EV_SCHED_WAKE, EV_SSD_DONE,
    NO_PORT,
};
use crate::config::SimConfig;
use crate::topo::Graph;
use anyhow::Result;
use trellis_qos::sched::{Driver, Policy, Request, SchedConfig, Submit, TenantId};
use trellis_ssd::Ssd;

impl Sim {
    /// The scheduler tenant of a host: the host index, folded into the tenant table.
    pub(super) fn tenant_of(&self, host: u32) -> TenantId {
        (host % self.cfg.sched.max_tenants as u32) as TenantId
    }

    /// The command has fully arrived at its target: offer it to the SSD's scheduler.
    pub(super) fn ssd_enqueue(&mut self, io: u32) {
        let now = self.q.now;
        let (ssd, host, op, size, gen) = {
            let o = self.ios.get(io);
            (o.spec.ssd, o.host, o.spec.op, o.spec.size_bytes, o.gen)
        };
        let tenant = self.tenant_of(host);
        let req = Request {
            tenant,
            dir: op,
            len_bytes: size,
            payload: IoRef { io, gen },
        };
        match self.ssds[ssd as usize].drv.submit(req, now) {
            Ok(Submit::Run(slot)) => self.dispatch(ssd, slot, io),
            Ok(Submit::Held) => {}
            Ok(Submit::Busy) => {
                // A bound is full: the target answers "busy, retry" and the host resends
                // the command after the retry timeout [R].
                self.metrics.sched_busy += 1;
                self.ios.get_mut(io).retry_at_ns = now + self.retry_ns;
                self.q.push(now + self.retry_ns, EV_RETRY, io);
                return;
            }
            Err(e) => unreachable!("tenant {tenant} is inside the table: {e:?}"),
        }
        self.pump(ssd);
    }

    /// Send to the device what the scheduler releases; arm its timer if it holds back.
    pub(super) fn pump(&mut self, ssd: u32) {
        let now = self.q.now;
        while let Some(r) = self.ssds[ssd as usize].drv.release(now) {
            self.dispatch(ssd, r.slot, r.req.payload.io);
        }
        if let Some(t) = self.ssds[ssd as usize].drv.arm_timer() {
            self.q.push(t, EV_SCHED_WAKE, ssd);
        }
    }

    /// Send I/O `io`, in driver slot `slot`, to the SSD now.
    pub(super) fn dispatch(&mut self, ssd: u32, slot: usize, io: u32) {
        let now = self.q.now;
        let spec = self.ios.get(io).spec;
        let done =
            self.ssds[ssd as usize]
                .ssd
                .submit(spec.op, spec.offset_bytes, spec.size_bytes, now);
        self.q.push(done, EV_SSD_DONE, ssd << 20 | slot as u32);
    }

    pub(super) fn on_ssd_done(&mut self, a: u32) {
        let now = self.q.now;
        let (ssd, slot) = (a >> 20, (a & 0xF_FFFF) as usize);
        let s = &mut self.ssds[ssd as usize];
        let done = s
            .drv
            .complete(slot, now, now)
            .expect("the SSD completes each dispatched command once");
        let headroom = s.drv.scheduler().headroom_bytes_per_s();
        let (IoRef { io, gen }, lat) = (done.req.payload, done.device_latency_ns);
        let o = self.ios.get(io);
        if o.gen == gen && !o.lost {
            let o = self.ios.get_mut(io);
            o.headroom_bytes_per_s = headroom;
            o.ssd_latency_ns = lat;
            o.hdr.ssd_latency_ns = lat;
            self.tcp_send(io, Msg::Response);
        }
        self.pump(ssd);
    }

    pub(super) fn send_response(&mut self, io: u32) {
        // After an R2T, which went back on its own, the rest of the response.
        let total = self.msg_bytes(io, Msg::Response);
        self.send_rev(io, total);
    }

    /// Send `total` bytes target -> host: the completion (its last packet carries the
    /// marker), or an R2T, which travels the same way.
    pub(super) fn send_rev(&mut self, io: u32, total: u32) {
        let (gen, in_port, n_hops, rank) = {
            let o = self.ios.get(io);
            (o.gen, o.target_in_port, o.hdr.n_hops, o.rank)
        };
        let is_r2t = self.ios.get(io).r2t == R2t::Await;
        let n = total.div_ceil(self.payload_max);
        if !is_r2t {
            self.ios.get_mut(io).rev_expected = n as u16;
        }
        let symmetric = self.cfg.mechanisms.isr;
        let target = self.ios.get(io).target_node;
        let host_node = self.hosts[self.ios.get(io).host as usize].node;
        let out = if symmetric && self.g.port_up[in_port as usize] {
            Some(in_port)
        } else {
            self.route(target, host_node, io)
        };
        let mut left = total;
        for i in 0..n {
            let payload = left.min(self.payload_max);
            left -= payload;
            let Some(out) = out else {
                // No route back (a failure not yet converged): the host times out.
                self.lose_io(io, gen, DOWN);
                return;
            };
            let p = self.pkts.insert(Packet {
                io,
                gen,
                kind: PktKind::Rev,
                marker: i + 1 == n && !is_r2t,
                wire_bytes: payload + self.cfg.topology.frame_overhead_bytes,
                hop: if symmetric && out == in_port {
                    n_hops - 1
                } else {
                    NO_PORT
                },
                to: self.g.peer_node(out),
                via: out,
                enq_ns: 0,
                class: 1 + rank,
            });
            self.enqueue(p, out);
        }
    }
}

/// One SSD model and one scheduler (the shared core) per SSD of every storage node.
pub(super) fn build_ssds(cfg: &SimConfig, g: &Graph) -> Result<Vec<SsdSlot>> {
    let profile = cfg.ssd.profile()?;
    let sched_cfg = SchedConfig {
        policy: if cfg.mechanisms.gimbal {
            Policy::Gimbal
        } else {
            Policy::Fifo
        },
        limits: cfg.sched.clone(),
        device_qd: cfg.ssd.device_qd,
        gimbal: cfg.gimbal_for(&profile),
    };
    // Device events carry (SSD, tag index) in 12 + 20 bits.
    anyhow::ensure!(
        cfg.sched.max_requests <= 1 << 20,
        "sched.max_requests above 2^20"
    );
    let mut ssds = Vec::new();
    for (i, &node) in g.storage.iter().enumerate() {
        for k in 0..cfg.ssd.per_node {
            let mut ssd = Ssd::new(profile.clone());
            ssd.precondition(
                cfg.ssd.precondition,
                cfg.seed ^ ((i as u64) << 16 | k as u64),
            );
            ssds.push(SsdSlot {
                ssd,
                node,
                drv: Driver::build(&sched_cfg, 0).map_err(anyhow::Error::msg)?,
                alive: true,
            });
        }
    }
    anyhow::ensure!(!ssds.is_empty(), "need at least one SSD");
    anyhow::ensure!(
        ssds.len() <= 1 << 12,
        "device events index at most 4096 SSDs"
    );
    Ok(ssds)
}
