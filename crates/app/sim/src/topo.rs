//! The simulator's routing graph: nodes, directed ports (one per link end),
//! shortest-path tables; built from the shared description of the fabric
//! (`trellis_topology`, whose generators make every shape and whose
//! `testbed` is the 4-node testbed `trellis san` emulates).

use crate::config::{TopologyConfig, TopologyKind};
use crate::cost::SwitchPlan;
use anyhow::{bail, Result};
pub use trellis_topology::gen::balanced_dims;
use trellis_topology::gen::{self, Attach};
pub use trellis_topology::NodeKind;
use trellis_topology::Topology;

pub struct Port {
    pub node: u32,
    /// The port at the other end of the link (its egress goes back to `node`).
    pub peer: u32,
    pub bits_per_s: u64,
    pub prop_ns: u64,
}

pub struct Graph {
    pub kinds: Vec<NodeKind>,
    /// Ports of each node, in local order (local index = position).
    pub node_ports: Vec<Vec<u32>>,
    pub ports: Vec<Port>,
    pub storage: Vec<u32>,
    pub hosts: Vec<u32>,
    /// BFS hop distance, row = destination: dist[d * n + u]. u16::MAX = unreachable.
    pub dist: Vec<u16>,
    /// Only destinations (storage and host nodes) have rows; index into `dist` rows.
    pub dest_row: Vec<u32>,
    pub port_up: Vec<bool>,
    /// Node names from the description (`st0`, `tor`, `h0`, …).
    pub names: Vec<String>,
}

impl Graph {
    fn new() -> Self {
        Graph {
            kinds: vec![],
            node_ports: vec![],
            ports: vec![],
            storage: vec![],
            hosts: vec![],
            dist: vec![],
            dest_row: vec![],
            port_up: vec![],
            names: vec![],
        }
    }

    /// The graph of a description: node ids are its node indices, and link i
    /// is ports 2i (its `a` end) and 2i + 1, so a node's local port order is
    /// its port numbers there. All links up, routes computed.
    pub fn from_description(t: &Topology) -> Graph {
        let mut g = Graph::new();
        for n in &t.nodes {
            g.add_node(n.kind);
            g.names.push(n.name.clone());
        }
        for l in &t.links {
            g.link(l.a.node, l.b.node, l.bits_per_s, l.prop_ns);
        }
        g.port_up = vec![true; g.ports.len()];
        g.compute_routes();
        g
    }

    /// The description of this graph's links (both ends, rate, delay) and
    /// nodes: what the simulator runs on, to compare with what is emulated.
    pub fn description(&self) -> Topology {
        let mut t = Topology::new();
        for (k, name) in self.kinds.iter().zip(&self.names) {
            t.add_node(*k, name.clone());
        }
        for pair in self.ports.chunks_exact(2) {
            t.link(
                pair[0].node,
                pair[1].node,
                pair[0].bits_per_s,
                pair[0].prop_ns,
            );
        }
        t
    }

    fn add_node(&mut self, k: NodeKind) -> u32 {
        self.kinds.push(k);
        self.node_ports.push(Vec::new());
        let id = self.kinds.len() as u32 - 1;
        match k {
            NodeKind::Storage => self.storage.push(id),
            NodeKind::Host => self.hosts.push(id),
            NodeKind::Switch => {}
        }
        id
    }

    fn link(&mut self, a: u32, b: u32, bps: u64, prop_ns: u64) {
        let pa = self.ports.len() as u32;
        self.ports.push(Port {
            node: a,
            peer: pa + 1,
            bits_per_s: bps,
            prop_ns,
        });
        self.ports.push(Port {
            node: b,
            peer: pa,
            bits_per_s: bps,
            prop_ns,
        });
        self.node_ports[a as usize].push(pa);
        self.node_ports[b as usize].push(pa + 1);
    }

    pub fn n(&self) -> usize {
        self.kinds.len()
    }

    pub fn peer_node(&self, port: u32) -> u32 {
        self.ports[self.ports[port as usize].peer as usize].node
    }

    pub fn distance(&self, u: u32, dest: u32) -> u16 {
        let row = self.dest_row[dest as usize];
        assert!(row != u32::MAX, "node {dest} is not a destination");
        self.dist[row as usize * self.n() + u as usize]
    }

    /// Live ports of `u` on a shortest path to `dest`, written into `out`; returns the count.
    pub fn candidates(&self, u: u32, dest: u32, out: &mut [u32; 64]) -> usize {
        let du = self.distance(u, dest);
        let mut k = 0;
        if du == u16::MAX || du == 0 {
            return 0;
        }
        for &p in &self.node_ports[u as usize] {
            if !self.port_up[p as usize] {
                continue;
            }
            let v = self.peer_node(p);
            // Hosts never forward: a path may only enter a host that is the destination.
            if self.kinds[v as usize] == NodeKind::Host && v != dest {
                continue;
            }
            if self.distance(v, dest) == du - 1 && k < out.len() {
                out[k] = p;
                k += 1;
            }
        }
        if k == 0 {
            k = self.loop_free_alternates(u, dest, du, out);
        }
        k
    }

    /// Every live port of host `u` that leads toward `dest`, shortest or not:
    /// a multi-port client attached to several storage nodes (the NSDI'26
    /// testbed's client on the torus, "4 disjoint paths") may send an I/O out
    /// of any port, and the nodes after it route by shortest paths. Only for a
    /// host that chooses its port by telemetry (ISR at the end host): ECMP
    /// spreads over equal-cost paths only, so it keeps [`Self::candidates`].
    pub fn host_candidates(&self, u: u32, dest: u32, out: &mut [u32; 64]) -> usize {
        if self.kinds[u as usize] != NodeKind::Host || u == dest {
            return 0;
        }
        let mut k = 0;
        for &p in &self.node_ports[u as usize] {
            let v = self.peer_node(p);
            // Hosts never forward: a path may only enter a host that is the destination.
            let via_host = self.kinds[v as usize] == NodeKind::Host && v != dest;
            if self.port_up[p as usize]
                && !via_host
                && self.distance(v, dest) != u16::MAX
                && k < out.len()
            {
                out[k] = p;
                k += 1;
            }
        }
        k
    }

    /// Local repair before the routes converge, when every shortest-path port of `u` is
    /// down: a neighbour `v` at the same distance is a loop-free alternate (RFC 5286:
    /// dist(v,D) < dist(v,u) + dist(u,D)) if it still has a live shortest-path port, so
    /// the distance falls at least every second hop and the detour cannot loop.
    fn loop_free_alternates(&self, u: u32, dest: u32, du: u16, out: &mut [u32; 64]) -> usize {
        let mut k = 0;
        for &p in &self.node_ports[u as usize] {
            let v = self.peer_node(p);
            let usable = self.port_up[p as usize]
                && self.kinds[v as usize] != NodeKind::Host
                && self.distance(v, dest) == du;
            if usable && k < out.len() && self.has_live_downhill(v, dest, du) {
                out[k] = p;
                k += 1;
            }
        }
        k
    }

    fn has_live_downhill(&self, v: u32, dest: u32, dv: u16) -> bool {
        self.node_ports[v as usize].iter().any(|&q| {
            let w = self.peer_node(q);
            self.port_up[q as usize]
                && (self.kinds[w as usize] != NodeKind::Host || w == dest)
                && self.distance(w, dest) == dv - 1
        })
    }

    /// Recompute distances (after a failure). BFS from every destination.
    pub fn compute_routes(&mut self) {
        let n = self.n();
        let dests: Vec<u32> = self
            .storage
            .iter()
            .chain(self.hosts.iter())
            .copied()
            .collect();
        self.dest_row = vec![u32::MAX; n];
        self.dist = vec![u16::MAX; dests.len() * n];
        let mut queue = std::collections::VecDeque::with_capacity(n);
        for (row, &d) in dests.iter().enumerate() {
            self.dest_row[d as usize] = row as u32;
            let base = row * n;
            self.dist[base + d as usize] = 0;
            queue.clear();
            queue.push_back(d);
            while let Some(v) = queue.pop_front() {
                let dv = self.dist[base + v as usize];
                // Do not route through hosts.
                if self.kinds[v as usize] == NodeKind::Host && v != d {
                    continue;
                }
                for &p in &self.node_ports[v as usize] {
                    // Distance toward d over the link u→v: the egress port of u is the peer of p.
                    if !self.port_up[self.ports[p as usize].peer as usize] {
                        continue;
                    }
                    let u = self.peer_node(p);
                    if self.dist[base + u as usize] == u16::MAX {
                        self.dist[base + u as usize] = dv + 1;
                        queue.push_back(u);
                    }
                }
            }
        }
    }

    /// Take a link down (both directions).
    pub fn fail_port(&mut self, port: u32) {
        let peer = self.ports[port as usize].peer;
        self.port_up[port as usize] = false;
        self.port_up[peer as usize] = false;
    }

    /// The port of `a` linking to `b`, if any.
    pub fn port_between(&self, a: u32, b: u32) -> Option<u32> {
        self.node_ports[a as usize]
            .iter()
            .copied()
            .find(|&p| self.peer_node(p) == b)
    }
}

/// The attachment every generator shares, from the configuration.
fn attach(cfg: &TopologyConfig) -> Attach {
    Attach {
        storage_nodes: cfg.storage_nodes,
        uplinks: cfg.uplinks,
        node_gbps: cfg.node_gbps,
        hosts: cfg.hosts,
        host_ports: cfg.host_ports,
        host_gbps: cfg.host_gbps,
        prop_ns: cfg.prop_ns,
    }
}

/// The plan `tor` builds for `cfg`: the cost model's rule over every storage
/// and host port (`cost::SwitchPlan::for_ports`).
pub fn switch_plan(cfg: &TopologyConfig) -> SwitchPlan {
    let up = cfg.uplinks.max(1);
    let host_ports = cfg.hosts * cfg.host_ports.max(1);
    SwitchPlan::for_ports(cfg.storage_nodes * up + host_ports, up, cfg.switch_ports)
}

/// `tor`: one switch while the ports fit, else what the cost model prices.
fn describe_switched(t: &mut Topology, cfg: &TopologyConfig) {
    let a = attach(cfg);
    match switch_plan(cfg) {
        SwitchPlan::SingleTor => gen::planes(t, &a, 1),
        SwitchPlan::Planes { switches } => gen::planes(t, &a, switches),
        SwitchPlan::LeafSpine { leaves, spines, .. } => {
            // Non-blocking: each leaf's half of uplinks spread evenly over the spines.
            let half = cfg.switch_ports.max(2) / 2;
            gen::leaf_spine(t, &a, leaves, spines, half.div_ceil(spines).max(1));
        }
    }
}

/// The routing graph of `cfg`'s fabric, built from its description.
pub fn build(cfg: &TopologyConfig) -> Result<Graph> {
    Ok(Graph::from_description(&describe(cfg)?))
}

/// `cfg`'s fabric as the shared description (`trellis_topology`): for the
/// 4-node testbed's configurations (`reproduce::testbed`) the same graph as
/// `trellis_topology::testbed`, which `trellis san` emulates.
pub fn describe(cfg: &TopologyConfig) -> Result<Topology> {
    let s = cfg.storage_nodes;
    if s == 0 {
        bail!("need at least one storage node");
    }
    let mut t = Topology::new();
    gen::storage_nodes(&mut t, s);
    let a = attach(cfg);
    match cfg.kind {
        TopologyKind::Tor => describe_switched(&mut t, cfg),
        TopologyKind::LeafSpine => {
            let up = cfg.leaf_uplinks.max(1);
            gen::leaf_spine(&mut t, &a, cfg.leaves.max(1), cfg.spines.max(1), up);
        }
        TopologyKind::Ring => {
            if s < 3 {
                bail!("a ring needs at least 3 nodes");
            }
            gen::ring(&mut t, &a);
        }
        TopologyKind::Torus2d | TopologyKind::Torus3d => {
            gen::torus(&mut t, &a, &torus_dims(cfg)?);
        }
        TopologyKind::Dragonfly => gen::dragonfly(&mut t, &a, cfg.group_size),
    }
    Ok(t)
}

/// A 2D or 3D torus's dimensions: `dims`, or the most balanced ones.
fn torus_dims(cfg: &TopologyConfig) -> Result<Vec<u32>> {
    let s = cfg.storage_nodes;
    let k = if cfg.kind == TopologyKind::Torus2d {
        2
    } else {
        3
    };
    let dims = if cfg.dims.is_empty() {
        balanced_dims(s, k)
    } else {
        cfg.dims.clone()
    };
    if dims.len() != k || dims.iter().product::<u32>() != s {
        bail!(
            "torus dims {:?} do not multiply to {} nodes in {}D",
            dims,
            s,
            k
        );
    }
    Ok(dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_convergence_a_failed_shortest_path_falls_back_to_a_loop_free_alternate() {
        // 3x3 torus: 0's only shortest path to its neighbour 1 is their direct link. With it
        // down and routes not yet recomputed, 0 detours via 2 (also one hop from 1).
        let cfg = TopologyConfig {
            kind: TopologyKind::Torus2d,
            storage_nodes: 9,
            hosts: 0,
            ..Default::default()
        };
        let mut g = build(&cfg).unwrap();
        let mut out = [0u32; 64];
        assert_eq!(g.candidates(0, 1, &mut out), 1);
        g.fail_port(g.port_between(0, 1).unwrap());
        let k = g.candidates(0, 1, &mut out);
        let via: Vec<u32> = out[..k].iter().map(|&p| g.peer_node(p)).collect();
        assert_eq!(
            via,
            vec![2],
            "the equal-distance neighbour with a live way down"
        );
        // Nodes with a live shortest path keep it: no detour for 3 -> 1 (via 4 or 0).
        let k3 = g.candidates(3, 1, &mut out);
        assert!(out[..k3]
            .iter()
            .all(|&p| g.distance(g.peer_node(p), 1) == 1));
    }

    #[test]
    fn torus3d_27_has_six_ports_and_diameter_three() {
        let cfg = TopologyConfig {
            kind: TopologyKind::Torus3d,
            storage_nodes: 27,
            hosts: 0,
            node_gbps: 600,
            ..Default::default()
        };
        let g = build(&cfg).unwrap();
        for n in 0..27 {
            assert_eq!(g.node_ports[n].len(), 6);
            assert_eq!(
                g.ports[g.node_ports[n][0] as usize].bits_per_s,
                100_000_000_000
            );
        }
        let max = (0..27)
            .flat_map(|a| (0..27).map(move |b| (a, b)))
            .map(|(a, b)| g.distance(a, b))
            .max()
            .unwrap();
        assert_eq!(max, 3);
        let mut c = [0u32; 64];
        // Node 0 to node 13 (1,1,1): three productive directions.
        assert_eq!(g.candidates(0, 13, &mut c), 3);
    }

    #[test]
    fn torus2d_four_nodes_has_parallel_links() {
        let cfg = TopologyConfig {
            kind: TopologyKind::Torus2d,
            storage_nodes: 4,
            hosts: 4,
            ..Default::default()
        };
        let g = build(&cfg).unwrap();
        // 4 torus ports + 1 host port per node.
        assert_eq!(g.node_ports[0].len(), 5);
        let mut c = [0u32; 64];
        assert_eq!(
            g.candidates(0, 1, &mut c),
            2,
            "two parallel links to the x neighbour"
        );
        assert_eq!(
            g.candidates(0, 3, &mut c),
            4,
            "diagonal: 4 disjoint first hops"
        );
    }

    #[test]
    fn failure_reroutes() {
        let cfg = TopologyConfig {
            kind: TopologyKind::Ring,
            storage_nodes: 5,
            hosts: 0,
            ..Default::default()
        };
        let mut g = build(&cfg).unwrap();
        assert_eq!(g.distance(0, 1), 1);
        let p = g.port_between(0, 1).unwrap();
        g.fail_port(p);
        g.compute_routes();
        assert_eq!(g.distance(0, 1), 4);
    }
}
