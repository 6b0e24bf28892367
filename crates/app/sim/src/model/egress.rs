//! Egress port queues: admission against a port's private buffer or its
//! switch's shared pool, the priority class (SSD-credit rank, reserved
//! responses), eager bandwidth reservation, serialisation and propagation, and
//! the queueing each hop records in the ISR header.

use super::{Packet, PktKind, PortQ, Sim, EV_ARRIVE, EV_TXDONE, NO_POOL, NO_PORT};
use crate::config::SimConfig;
use crate::net::shared_buffer::SharedBuffer;
use crate::topo::{Graph, NodeKind};
use trellis_fabric::reserve::PortReservation;
use trellis_units::IoDir;

impl Sim {
    pub(super) fn qdelay_ns(&self, port: u32) -> u64 {
        let bytes = self.ports[port as usize].bytes;
        let backlog = self.ports[port as usize]
            .busy_until
            .saturating_sub(self.q.now);
        backlog + bytes * 8_000_000_000 / self.g.ports[port as usize].bits_per_s
    }

    pub(super) fn enqueue(&mut self, p: u32, port: u32) {
        let now = self.q.now;
        if self.link_dead[port as usize] {
            self.drop_packet(p);
            return;
        }
        let bytes = self.pkts.get(p).wire_bytes as u64;
        let class = self.classify(p, port);
        let pq = &mut self.ports[port as usize];
        let fits = match pq.pool {
            NO_POOL => pq.bytes + bytes <= self.cfg.topology.queue_bytes,
            i => self.pools[i as usize].admits(pq.bytes, bytes),
        };
        if !fits {
            self.metrics.drops += 1;
            self.drop_packet(p);
            return;
        }
        {
            let pk = self.pkts.get_mut(p);
            pk.enq_ns = now;
            pk.via = port;
            pk.class = class;
        }
        let idle = !pq.tx_pending && pq.busy_until <= now && pq.bytes == 0;
        if idle {
            self.start_tx(p, port);
            return;
        }
        pq.q[class as usize].push_back(p);
        pq.bytes += bytes;
        if pq.pool != NO_POOL {
            self.pools[pq.pool as usize].add(bytes);
        }
        if !pq.tx_pending {
            pq.tx_pending = true;
            let t = pq.busy_until.max(now);
            self.q.push(t, EV_TXDONE, port);
        }
    }

    pub(super) fn classify(&mut self, p: u32, port: u32) -> u8 {
        let now = self.q.now;
        let pk = *self.pkts.get(p);
        let rank = self.ios.get(pk.io).rank;
        let base = if self.cfg.mechanisms.credits {
            1 + rank
        } else {
            1
        };
        if !self.cfg.mechanisms.reservation || pk.kind != PktKind::Rev {
            return base;
        }
        let op = self.ios.get(pk.io).spec.op;
        // Write completions are tiny and always go first (Q_wcpl).
        if op == IoDir::Write {
            return 0;
        }
        if self.ports[port as usize]
            .resv
            .conform(pk.wire_bytes as u64, now)
        {
            0
        } else {
            base
        }
    }

    pub(super) fn start_tx(&mut self, p: u32, port: u32) {
        let now = self.q.now;
        let pk = *self.pkts.get(p);
        let info = &self.g.ports[port as usize];
        let ser = (pk.wire_bytes as u64 * 8_000_000_000).div_ceil(info.bits_per_s);
        let node = info.node;
        let fwd_ns = self.forwarding_ns(node, pk.io);
        let arrive = now + ser + info.prop_ns + fwd_ns;
        let pq = &mut self.ports[port as usize];
        pq.busy_until = now + ser;
        if now >= self.cfg.warmup_ns {
            pq.tx_bytes += pk.wire_bytes as u64;
        }
        self.record_qdelay(&pk, node, now.saturating_sub(pk.enq_ns), port);
        self.q.push(arrive, EV_ARRIVE, p);
    }

    /// Forwarding latency charged when `node` passes a packet on (not at its endpoints).
    pub(super) fn forwarding_ns(&self, node: u32, io: u32) -> u64 {
        match self.g.kinds[node as usize] {
            NodeKind::Switch => self.cfg.topology.switch_hop_ns,
            NodeKind::Host => 0,
            NodeKind::Storage => {
                // The paper's 2.9 µs ([NSDI'26], second-hand) is per extra hop of a whole
                // I/O (command and response), so each direction pays half.
                if self.ios.get(io).target_node == node {
                    0
                } else {
                    self.cfg.topology.adapter_hop_ns / 2
                }
            }
        }
    }

    /// The ISR header records queueing per hop (command and completion packets only).
    pub(super) fn record_qdelay(&mut self, pk: &Packet, node: u32, qdelay: u64, port: u32) {
        if !pk.marker || pk.gen != self.ios.get(pk.io).gen {
            return;
        }
        let ecn = self.ports[port as usize].bytes > self.cfg.isr.ecn_threshold_bytes;
        let o = self.ios.get_mut(pk.io);
        let q = qdelay.min(u32::MAX as u64) as u32;
        match pk.kind {
            PktKind::Fwd => {
                let i = pk.hop as usize - 1;
                if i < o.hdr.n_hops as usize && o.hdr.hops[i].node == node {
                    o.hdr.hops[i].qdelay_ns = q;
                    o.hdr.hops[i].ecn |= ecn;
                }
            }
            PktKind::Rev => {
                let i = pk.hop as usize + 1;
                if pk.hop != NO_PORT && i < o.hdr.n_hops as usize && o.hdr.hops[i].node == node {
                    o.hdr.hops[i].rev_qdelay_ns = q;
                } else if pk.hop != NO_PORT && i == o.hdr.n_hops as usize && node == o.target_node {
                    // The target's own egress: no hop record of its own.
                    o.hdr.target_rev_qdelay_ns = q;
                }
            }
        }
    }

    pub(super) fn on_txdone(&mut self, port: u32) {
        let pq = &mut self.ports[port as usize];
        pq.tx_pending = false;
        let Some(p) = pq.q.iter_mut().find_map(|q| q.pop_front()) else {
            return;
        };
        let bytes = self.pkts.get(p).wire_bytes as u64;
        pq.bytes -= bytes;
        if pq.pool != NO_POOL {
            self.pools[pq.pool as usize].remove(bytes);
        }
        self.start_tx(p, port);
        let pq = &mut self.ports[port as usize];
        if pq.bytes > 0 {
            pq.tx_pending = true;
            let t = pq.busy_until;
            self.q.push(t, EV_TXDONE, port);
        }
    }

    /// Eager reservation: bandwidth for the response on the reverse egress (`in_port`).
    pub(super) fn reserve_at(&mut self, io: u32, in_port: u32) {
        if !self.cfg.mechanisms.reservation {
            return;
        }
        let (op, size, n) = {
            let o = self.ios.get(io);
            (o.spec.op, o.spec.size_bytes, o.n_grants)
        };
        if n as usize >= 8 || op == IoDir::Write {
            // Write completions are tiny: they use the priority queue, not a reservation.
            return;
        }
        let r = self.cfg.reserve.reservation_bytes_per_s(IoDir::Read, size);
        let granted = self.ports[in_port as usize].resv.reserve(r);
        let o = self.ios.get_mut(io);
        o.grants[n as usize] = (in_port, granted);
        o.n_grants += 1;
    }
}

/// One egress queue per port; one shared buffer per switch (adapters and hosts
/// keep private port buffers), indexed by `PortQ::pool`.
pub(super) fn build_ports(cfg: &SimConfig, g: &Graph) -> (Vec<PortQ>, Vec<SharedBuffer>) {
    let mut pool_of_node = vec![NO_POOL; g.n()];
    let mut pools = Vec::new();
    for (n, k) in g.kinds.iter().enumerate() {
        if *k == NodeKind::Switch {
            pool_of_node[n] = pools.len() as u32;
            pools.push(SharedBuffer::new(
                cfg.topology.switch_buffer_bytes,
                cfg.topology.switch_dt_alpha_log2,
            ));
        }
    }
    let ports = g
        .ports
        .iter()
        .map(|p| PortQ {
            pool: pool_of_node[p.node as usize],
            q: Default::default(),
            bytes: 0,
            busy_until: 0,
            tx_pending: false,
            tx_bytes: 0,
            resv: PortReservation::new(
                p.bits_per_s / 8,
                cfg.reserve.burst_bytes,
                cfg.reserve.max_reserved_permille,
            ),
        })
        .collect();
    (ports, pools)
}
