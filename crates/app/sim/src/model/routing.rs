//! Routing: the next hop at each node (ISR's least congested port, a LAG's
//! per-flow member, or per-flow ECMP), the forwarding of arriving command and
//! completion packets along the recorded path, and ISR learning from the
//! telemetry completions carry home.

use super::{Msg, Packet, PktKind, R2t, Sim, DOWN, NO_PORT, UP};
use crate::config::SimConfig;
use crate::topo::Graph;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;
use trellis_fabric::isr::{HopRec, IsrTable};

impl Sim {
    pub(super) fn local_of(&self, node: u32, port: u32) -> u8 {
        self.g.node_ports[node as usize]
            .iter()
            .position(|&p| p == port)
            .expect("port not on node") as u8
    }

    /// Choose the egress of `node` toward `dest`: ISR (least congested) or per-flow ECMP.
    pub(super) fn route(&mut self, node: u32, dest: u32, io: u32) -> Option<u32> {
        let mut cand = self.cand;
        let k = self.g.candidates(node, dest, &mut cand);
        if k == 0 {
            return None;
        }
        if k == 1 {
            return Some(cand[0]);
        }
        let now = self.q.now;
        // ISR tables are kept per target storage node; routes toward hosts use ECMP.
        let to_storage = (dest as usize) < self.g.storage.len();
        // A team of parallel links to one switch is a LAG (NIC teaming, IEEE 802.1AX):
        // it hashes each flow onto one member, so no I/O of a flow picks its own link.
        let lag = self.switched && self.same_peer(&cand[..k]);
        if let (true, false, Some(t)) = (to_storage, lag, &self.isr[node as usize]) {
            let mut locals = [0u8; 64];
            for (i, &p) in cand[..k].iter().enumerate() {
                locals[i] = self.local_of(node, p);
            }
            let ports = &self.g.node_ports[node as usize];
            let tie = self.rng.next_u64();
            let pick = t.choose(
                dest,
                &locals[..k],
                |lp| self.qdelay_ns(ports[lp as usize]),
                now,
                tie,
            );
            return Some(ports[pick as usize]);
        }
        // ECMP: hash of the flow (host, SSD) and the node, fixed for the flow's life.
        let o = self.ios.get(io);
        let h = mix64((o.host as u64) << 32 | o.spec.ssd as u64 ^ (node as u64) << 48);
        Some(cand[(h % k as u64) as usize])
    }

    /// Do all these ports lead to the same node (parallel links, a team)?
    pub(super) fn same_peer(&self, ports: &[u32]) -> bool {
        let first = self.g.peer_node(ports[0]);
        ports[1..].iter().all(|&p| self.g.peer_node(p) == first)
    }

    pub(super) fn on_arrive(&mut self, p: u32) {
        let pk = *self.pkts.get(p);
        let stale = pk.gen != self.ios.get(pk.io).gen || self.ios.get(pk.io).lost;
        if stale {
            self.pkts.remove(p);
            return;
        }
        if self.link_dead[pk.via as usize] {
            // The link failed while the packet was on the wire.
            self.drop_packet(p);
            return;
        }
        match pk.kind {
            PktKind::Fwd => self.arrive_fwd(p, pk),
            PktKind::Rev => self.arrive_rev(p, pk),
        }
    }

    pub(super) fn arrive_fwd(&mut self, p: u32, pk: Packet) {
        let node = pk.to;
        let in_port = self.g.ports[pk.via as usize].peer;
        let target = self.ios.get(pk.io).target_node;
        if node == target {
            self.pkts.remove(p);
            let o = self.ios.get_mut(pk.io);
            o.target_in_port = in_port;
            o.fwd_arrived += 1;
            if o.fwd_arrived == o.fwd_expected {
                self.tcp_delivered(pk.io, UP);
                if pk.marker {
                    self.reserve_at(pk.io, in_port);
                }
                if self.ios.get(pk.io).r2t == R2t::Command {
                    self.ios.get_mut(pk.io).r2t = R2t::Await;
                    self.tcp_send(pk.io, Msg::R2t);
                } else {
                    self.ssd_enqueue(pk.io);
                }
            } else if pk.marker {
                self.reserve_at(pk.io, in_port);
            }
            return;
        }
        // Transit: the first packet of the I/O to reach hop `hop` decides; the rest follow.
        let hop = pk.hop as usize;
        let decided = self.ios.get(pk.io).hdr.n_hops as usize > hop;
        let out = if decided {
            let rec = self.ios.get(pk.io).hdr.hops[hop];
            if rec.node == node {
                Some(self.g.node_ports[node as usize][rec.out_port as usize])
            } else {
                self.route(node, target, pk.io)
            }
        } else {
            let out = self.route(node, target, pk.io);
            if let Some(o) = out {
                let rec = HopRec {
                    node,
                    in_port: self.local_of(node, in_port),
                    out_port: self.local_of(node, o),
                    ..Default::default()
                };
                self.ios.get_mut(pk.io).hdr.push(rec);
                if pk.marker {
                    self.reserve_at(pk.io, in_port);
                }
            }
            out
        };
        let Some(out) = out else {
            self.drop_packet(p);
            return;
        };
        let nxt = self.g.peer_node(out);
        let pkm = self.pkts.get_mut(p);
        pkm.hop += 1;
        pkm.to = nxt;
        self.enqueue(p, out);
    }

    pub(super) fn arrive_rev(&mut self, p: u32, pk: Packet) {
        let node = pk.to;
        let (host_node, target, n_hops) = {
            let o = self.ios.get(pk.io);
            (
                self.hosts[o.host as usize].node,
                o.target_node,
                o.hdr.n_hops,
            )
        };
        if node == host_node {
            self.pkts.remove(p);
            if self.ios.get(pk.io).r2t == R2t::Await {
                self.tcp_delivered(pk.io, DOWN);
                self.tcp_send(pk.io, Msg::WriteData);
                return;
            }
            if pk.marker && n_hops > 0 && self.isr[node as usize].is_some() {
                // ISR at the end host: the completion's telemetry updates the client's table.
                self.isr_learn(pk.io, 0, target);
            }
            let o = self.ios.get_mut(pk.io);
            o.rev_arrived += 1;
            if o.rev_arrived == o.rev_expected {
                self.tcp_delivered(pk.io, DOWN);
                self.host_complete(pk.io);
            }
            return;
        }
        let symmetric = pk.hop != NO_PORT && (pk.hop as usize) < n_hops as usize;
        if self.trace_paths && pk.marker {
            self.check_symmetry(&pk, node);
        }
        let mut out = None;
        if symmetric {
            let rec = self.ios.get(pk.io).hdr.hops[pk.hop as usize];
            if rec.node == node && rec.in_port != NO_PORT {
                let port = self.g.node_ports[node as usize][rec.in_port as usize];
                if self.g.port_up[port as usize] {
                    out = Some(port);
                }
                if pk.marker {
                    self.isr_learn(pk.io, pk.hop as usize, target);
                }
            }
        }
        let routed = out.is_none();
        let out = match out {
            Some(o) => Some(o),
            None => self.route(node, host_node, pk.io),
        };
        let Some(out) = out else {
            self.drop_packet(p);
            return;
        };
        let nxt = self.g.peer_node(out);
        let pkm = self.pkts.get_mut(p);
        pkm.hop = if routed || pkm.hop == 0 {
            NO_PORT
        } else {
            pkm.hop - 1
        };
        pkm.to = nxt;
        self.enqueue(p, out);
    }

    pub(super) fn check_symmetry(&mut self, pk: &Packet, node: u32) {
        self.path_checks += 1;
        let o = self.ios.get(pk.io);
        if pk.hop == NO_PORT || pk.hop >= o.hdr.n_hops {
            self.path_mismatches += 1;
            return;
        }
        let rec = o.hdr.hops[pk.hop as usize];
        let entered_by = self.g.ports[pk.via as usize].peer;
        let left_by = self.g.node_ports[node as usize][rec.out_port as usize];
        if rec.node != node || entered_by != left_by {
            self.path_mismatches += 1;
        }
    }

    /// The completion passes hop `h`: update that node's telemetry toward the target.
    pub(super) fn isr_learn(&mut self, io: u32, h: usize, target: u32) {
        let now = self.q.now;
        let o = self.ios.get(io);
        let rec = o.hdr.hops[h];
        let (d, ecn) = o.hdr.downstream(h);
        if let Some(t) = self.isr[rec.node as usize].as_mut() {
            t.update(target, rec.out_port, d, ecn, now);
        }
    }
}

/// The splitmix64 output function applied to `z` (a stateless hash for
/// ECMP): SplitMix64 adds its increment before mixing, so start one below.
pub(super) fn mix64(z: u64) -> u64 {
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    SplitMix64::seed_from_u64(z.wrapping_sub(GOLDEN)).next_u64()
}

/// Per node: its ISR table toward every storage node, where ISR is on and the node
/// has ports to choose among (None elsewhere).
pub(super) fn build_isr(cfg: &SimConfig, g: &Graph, n_targets: usize) -> Vec<Option<IsrTable>> {
    (0..g.n())
        .map(|u| {
            // Multi-port clients choose their port per I/O like any node (ISR at the
            // end host); single-port ones have nothing to choose.
            let multi = g.node_ports[u].len() > 1;
            (cfg.mechanisms.isr && multi)
                .then(|| IsrTable::new(cfg.isr.clone(), n_targets, g.node_ports[u].len()))
        })
        .collect()
}
