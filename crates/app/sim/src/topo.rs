//! Topology construction: nodes, directed ports (one per link end), shortest-path tables.

use crate::config::{TopologyConfig, TopologyKind};
use crate::cost::SwitchPlan;
use anyhow::{bail, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    Storage,
    Switch,
    Host,
}

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
        }
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

    fn link(&mut self, a: u32, b: u32, gbps: u64, prop_ns: u64) {
        let pa = self.ports.len() as u32;
        let bps = gbps * 1_000_000_000;
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

/// Most balanced factorisation of n into `k` dimensions (largest first).
pub fn balanced_dims(n: u32, k: usize) -> Vec<u32> {
    let mut best: Vec<u32> = vec![];
    let mut best_score = u32::MAX;
    let mut cur = vec![];
    fn rec(n: u32, k: usize, min: u32, cur: &mut Vec<u32>, best: &mut Vec<u32>, score: &mut u32) {
        if k == 1 {
            if n >= min {
                cur.push(n);
                let s = cur.iter().max().unwrap() - cur.iter().min().unwrap();
                if s < *score {
                    *score = s;
                    *best = cur.clone();
                }
                cur.pop();
            }
            return;
        }
        let mut d = min;
        while d * d <= n {
            if n.is_multiple_of(d) {
                cur.push(d);
                rec(n / d, k - 1, d, cur, best, score);
                cur.pop();
            }
            d += 1;
        }
    }
    rec(n, k, 1, &mut cur, &mut best, &mut best_score);
    best.reverse();
    best
}

/// The plan `tor` builds for `cfg`: the cost model's rule over every storage
/// and host port (`cost::SwitchPlan::for_ports`).
pub fn switch_plan(cfg: &TopologyConfig) -> SwitchPlan {
    let up = cfg.uplinks.max(1);
    let host_ports = cfg.hosts * cfg.host_ports.max(1);
    SwitchPlan::for_ports(cfg.storage_nodes * up + host_ports, up, cfg.switch_ports)
}

/// `tor`: one switch while the ports fit, else what the cost model prices.
fn build_switched(g: &mut Graph, cfg: &TopologyConfig) {
    match switch_plan(cfg) {
        SwitchPlan::SingleTor => planes(g, cfg, 1),
        SwitchPlan::Planes { switches } => planes(g, cfg, switches),
        SwitchPlan::LeafSpine { leaves, spines, .. } => {
            // Non-blocking: each leaf's half of uplinks spread evenly over the spines.
            let half = cfg.switch_ports.max(2) / 2;
            leaf_spine(g, cfg, leaves, spines, half.div_ceil(spines).max(1));
        }
    }
}

/// `n` parallel switches without inter-switch links: storage port u on plane
/// u mod n, host h on plane h mod n.
fn planes(g: &mut Graph, cfg: &TopologyConfig, n: u32) {
    let up = cfg.uplinks.max(1);
    let per = cfg.node_gbps / up as u64;
    let sws: Vec<u32> = (0..n.max(1))
        .map(|_| g.add_node(NodeKind::Switch))
        .collect();
    for node in 0..cfg.storage_nodes {
        for u in 0..up {
            g.link(node, sws[u as usize % sws.len()], per, cfg.prop_ns);
        }
    }
    for h in 0..cfg.hosts {
        let host = g.add_node(NodeKind::Host);
        for k in 0..cfg.host_ports.max(1) {
            let sw = sws[(h + k) as usize % sws.len()];
            g.link(host, sw, cfg.host_gbps, cfg.prop_ns);
        }
    }
}

/// Leaf-spine: storage node n (all its ports) and host h on leaf n / h mod
/// leaves; `leaf_uplinks` links from every leaf to every spine.
fn leaf_spine(g: &mut Graph, cfg: &TopologyConfig, leaves: u32, spines: u32, leaf_uplinks: u32) {
    let p = cfg.prop_ns;
    let up = cfg.uplinks.max(1);
    let per = cfg.node_gbps / up as u64;
    let leaves: Vec<u32> = (0..leaves).map(|_| g.add_node(NodeKind::Switch)).collect();
    let spines: Vec<u32> = (0..spines).map(|_| g.add_node(NodeKind::Switch)).collect();
    for n in 0..cfg.storage_nodes {
        let leaf = leaves[(n as usize) % leaves.len()];
        for _ in 0..up {
            g.link(n, leaf, per, p);
        }
    }
    for &l in &leaves {
        for &sp in &spines {
            for _ in 0..leaf_uplinks {
                g.link(l, sp, per, p);
            }
        }
    }
    for i in 0..cfg.hosts {
        let h = g.add_node(NodeKind::Host);
        for _ in 0..cfg.host_ports.max(1) {
            g.link(h, leaves[i as usize % leaves.len()], cfg.host_gbps, p);
        }
    }
}

pub fn build(cfg: &TopologyConfig) -> Result<Graph> {
    let s = cfg.storage_nodes;
    if s == 0 {
        bail!("need at least one storage node");
    }
    let mut g = Graph::new();
    for _ in 0..s {
        g.add_node(NodeKind::Storage);
    }
    let p = cfg.prop_ns;
    match cfg.kind {
        TopologyKind::Tor => build_switched(&mut g, cfg),
        TopologyKind::LeafSpine => {
            let up = cfg.leaf_uplinks.max(1);
            leaf_spine(&mut g, cfg, cfg.leaves.max(1), cfg.spines.max(1), up);
        }
        TopologyKind::Ring => {
            if s < 3 {
                bail!("a ring needs at least 3 nodes");
            }
            for n in 0..s {
                g.link(n, (n + 1) % s, cfg.node_gbps / 2, p);
            }
            attach_hosts(&mut g, cfg);
        }
        TopologyKind::Torus2d | TopologyKind::Torus3d => build_torus(&mut g, cfg)?,
        TopologyKind::Dragonfly => build_dragonfly(&mut g, cfg),
    }
    g.port_up = vec![true; g.ports.len()];
    g.compute_routes();
    Ok(g)
}

/// A 2D or 3D torus of the storage nodes (`dims`, or the most balanced ones),
/// each adapter's bandwidth split over its 2k links; hosts attached.
fn build_torus(g: &mut Graph, cfg: &TopologyConfig) -> Result<()> {
    let (s, p) = (cfg.storage_nodes, cfg.prop_ns);
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
    let per = cfg.node_gbps / (2 * k as u64);
    torus_links(g, &dims, per, p);
    attach_hosts(g, cfg);
    Ok(())
}

/// A dragonfly: groups of `group_size` fully connected, one global link
/// between every two groups; hosts attached.
fn build_dragonfly(g: &mut Graph, cfg: &TopologyConfig) {
    let (s, p) = (cfg.storage_nodes, cfg.prop_ns);
    let a = cfg.group_size.max(2);
    let groups = s.div_ceil(a);
    let group = |i: u32| (i * a..((i + 1) * a).min(s)).collect::<Vec<u32>>();
    let local_ports = (a - 1).max(1) as u64;
    let global_per_node = (groups - 1).div_ceil(a).max(1) as u64;
    let per = cfg.node_gbps / (local_ports + global_per_node);
    for gi in 0..groups {
        let m = group(gi);
        for x in 0..m.len() {
            for y in x + 1..m.len() {
                g.link(m[x], m[y], per, p);
            }
        }
    }
    for gi in 0..groups {
        for gj in gi + 1..groups {
            let (mi, mj) = (group(gi), group(gj));
            g.link(
                mi[gj as usize % mi.len()],
                mj[gi as usize % mj.len()],
                per,
                p,
            );
        }
    }
    attach_hosts(g, cfg);
}

/// Switchless: host i attaches to storage node i mod S through its own adapter port.
fn attach_hosts(g: &mut Graph, cfg: &TopologyConfig) {
    let s = cfg.storage_nodes;
    for i in 0..cfg.hosts {
        let h = g.add_node(NodeKind::Host);
        for k in 0..cfg.host_ports.max(1) {
            g.link(h, (i + k) % s, cfg.host_gbps, cfg.prop_ns);
        }
    }
}

fn torus_links(g: &mut Graph, dims: &[u32], gbps: u64, p: u64) {
    let n: u32 = dims.iter().product();
    let stride = |d: usize| dims[..d].iter().product::<u32>();
    for id in 0..n {
        for (d, &size) in dims.iter().enumerate() {
            if size == 1 {
                continue;
            }
            let st = stride(d);
            let c = (id / st) % size;
            let next = id - c * st + ((c + 1) % size) * st;
            // Dimension of size 2: +1 and −1 reach the same neighbour; keep both links
            // (a 2×2 torus has 4 ports per node and parallel links, as in the testbed).
            g.link(id, next, gbps, p);
        }
    }
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

    #[test]
    fn dims_are_balanced() {
        assert_eq!(balanced_dims(27, 3), vec![3, 3, 3]);
        assert_eq!(balanced_dims(1000, 3), vec![10, 10, 10]);
        assert_eq!(balanced_dims(4, 2), vec![2, 2]);
    }
}
