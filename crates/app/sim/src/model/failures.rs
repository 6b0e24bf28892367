//! Failures: a link or a storage node dies at its configured time, the nodes
//! next to it notice after the detection delay, and global routes follow after
//! convergence.

use super::{Sim, EV_FAIL_CONVERGE, EV_FAIL_DETECT, NO_POOL};
use crate::topo::NodeKind;

impl Sim {
    /// The link (or node) dies now; the nodes next to it notice only after the
    /// detection delay, and the other nodes after convergence on top of that.
    pub(super) fn on_fail(&mut self, i: usize) {
        let f = self.cfg.failures[i].clone();
        let mut down = Vec::new();
        match f.what.as_str() {
            "node" => {
                let node = self.g.storage[f.a as usize];
                down.extend(self.g.node_ports[node as usize].iter().copied());
                for s in self.ssds.iter_mut().filter(|s| s.node == node) {
                    s.alive = false;
                }
            }
            _ => {
                let a = self.g.storage[f.a as usize];
                let port = match f.b {
                    Some(b) => self.g.port_between(a, self.g.storage[b as usize]),
                    None => self.busiest_fabric_port(a),
                };
                down.extend(port);
            }
        }
        for &p in &down {
            let peer = self.g.ports[p as usize].peer;
            for port in [p, peer] {
                self.link_dead[port as usize] = true;
                let pq = &mut self.ports[port as usize];
                if pq.pool != NO_POOL {
                    self.pools[pq.pool as usize].remove(pq.bytes);
                }
                pq.bytes = 0;
                let queued: Vec<u32> = pq.q.iter_mut().flat_map(|q| q.drain(..)).collect();
                for pk in queued {
                    self.drop_packet(pk);
                }
            }
        }
        self.failed_ports[i] = down;
        self.q.push(f.at_ns + f.detect_ns, EV_FAIL_DETECT, i as u32);
        self.metrics.failure_at_ns = Some(f.at_ns);
    }

    /// Detection: the two ends stop offering the port as a next hop (local repair: ISR
    /// and ECMP choose among the remaining productive ports); global tables follow later.
    pub(super) fn on_fail_detected(&mut self, i: usize) {
        for p in std::mem::take(&mut self.failed_ports[i]) {
            self.g.fail_port(p);
        }
        let f = &self.cfg.failures[i];
        let t = f.at_ns + f.detect_ns + f.converge_ns;
        self.q.push(t, EV_FAIL_CONVERGE, i as u32);
    }

    /// The storage-to-storage port of `node` that has sent the most bytes so far (lowest
    /// index on ties): failing it hits the traffic a real failure would, not an idle link.
    pub(super) fn busiest_fabric_port(&self, node: u32) -> Option<u32> {
        self.g.node_ports[node as usize]
            .iter()
            .copied()
            .filter(|&p| self.g.kinds[self.g.peer_node(p) as usize] == NodeKind::Storage)
            .max_by_key(|&p| (self.ports[p as usize].tx_bytes, std::cmp::Reverse(p)))
    }
}
