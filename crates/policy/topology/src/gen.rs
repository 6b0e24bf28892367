//! The generators of every shape the simulator builds, as descriptions. The
//! arithmetic is the simulator's (rates in whole Gbit/s, an adapter's rate
//! split over its ports by integer division) so that its graphs, and with
//! them its outputs, are unchanged by building through this crate.
//!
//! Names: storage nodes `st<i>`, clients `h<i>`, the single ToR `tor`,
//! parallel switches `plane<i>`, leaf-spine switches `leaf<i>` and `spine<i>`.

use crate::{NodeKind, Topology};

const BITS_PER_GBIT: u64 = 1_000_000_000;

/// What every shape shares: the storage nodes and their adapters, the
/// clients and theirs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attach {
    pub storage_nodes: u32,
    /// Switched: ports per storage node to the switches (teamed); 0 counts as 1.
    pub uplinks: u32,
    /// A storage node's adapter rate, split over its ports.
    pub node_gbps: u64,
    pub hosts: u32,
    /// Ports per client; 0 counts as 1.
    pub host_ports: u32,
    /// Rate of each client port.
    pub host_gbps: u64,
    pub prop_ns: u64,
}

fn link(t: &mut Topology, a: u32, b: u32, gbps: u64, prop_ns: u64) {
    t.link(a, b, gbps * BITS_PER_GBIT, prop_ns);
}

/// The storage nodes, ids 0..s (every shape starts with them).
pub fn storage_nodes(t: &mut Topology, s: u32) {
    for i in 0..s {
        t.add_node(NodeKind::Storage, format!("st{i}"));
    }
}

/// `n` parallel switches without inter-switch links (`n` = 1: one ToR):
/// storage port u on switch u mod n, port k of host h on switch (h + k) mod n.
pub fn planes(t: &mut Topology, a: &Attach, n: u32) {
    let up = a.uplinks.max(1);
    let per = a.node_gbps / up as u64;
    let n = n.max(1);
    let sws: Vec<u32> = (0..n)
        .map(|i| {
            let name = if n == 1 {
                "tor".to_string()
            } else {
                format!("plane{i}")
            };
            t.add_node(NodeKind::Switch, name)
        })
        .collect();
    for node in 0..a.storage_nodes {
        for u in 0..up {
            link(t, node, sws[u as usize % sws.len()], per, a.prop_ns);
        }
    }
    for h in 0..a.hosts {
        let host = t.add_node(NodeKind::Host, format!("h{h}"));
        for k in 0..a.host_ports.max(1) {
            let sw = sws[(h + k) as usize % sws.len()];
            link(t, host, sw, a.host_gbps, a.prop_ns);
        }
    }
}

/// Leaf-spine: storage node n (all its ports) and host h on leaf n / h mod
/// leaves; `leaf_uplinks` links from every leaf to every spine.
pub fn leaf_spine(t: &mut Topology, a: &Attach, leaves: u32, spines: u32, leaf_uplinks: u32) {
    let p = a.prop_ns;
    let up = a.uplinks.max(1);
    let per = a.node_gbps / up as u64;
    let leaves: Vec<u32> = (0..leaves.max(1))
        .map(|i| t.add_node(NodeKind::Switch, format!("leaf{i}")))
        .collect();
    let spines: Vec<u32> = (0..spines.max(1))
        .map(|i| t.add_node(NodeKind::Switch, format!("spine{i}")))
        .collect();
    for n in 0..a.storage_nodes {
        let leaf = leaves[(n as usize) % leaves.len()];
        for _ in 0..up {
            link(t, n, leaf, per, p);
        }
    }
    for &l in &leaves {
        for &sp in &spines {
            for _ in 0..leaf_uplinks {
                link(t, l, sp, per, p);
            }
        }
    }
    for i in 0..a.hosts {
        let h = t.add_node(NodeKind::Host, format!("h{i}"));
        for _ in 0..a.host_ports.max(1) {
            link(t, h, leaves[i as usize % leaves.len()], a.host_gbps, p);
        }
    }
}

/// A ring of the storage nodes (each adapter's rate over its 2 ports); hosts attached.
pub fn ring(t: &mut Topology, a: &Attach) {
    let s = a.storage_nodes;
    for n in 0..s {
        link(t, n, (n + 1) % s, a.node_gbps / 2, a.prop_ns);
    }
    attach_hosts(t, a);
}

/// A torus of the storage nodes with `dims` (their product must be the node
/// count; the caller checks), each adapter's rate split over its 2k links;
/// hosts attached.
pub fn torus(t: &mut Topology, a: &Attach, dims: &[u32]) {
    let per = a.node_gbps / (2 * dims.len() as u64);
    torus_links(t, dims, per, a.prop_ns);
    attach_hosts(t, a);
}

/// Node `id`'s next neighbour along dimension `d` of a torus with `dims`
/// (dimension 0 has stride 1): the `b` end of the link whose `a` end is `id`.
pub fn torus_next(dims: &[u32], id: u32, d: usize) -> u32 {
    let st = dims[..d].iter().product::<u32>();
    let size = dims[d];
    let c = (id / st) % size;
    id - c * st + ((c + 1) % size) * st
}

fn torus_links(t: &mut Topology, dims: &[u32], gbps: u64, p: u64) {
    let n: u32 = dims.iter().product();
    for id in 0..n {
        for (d, &size) in dims.iter().enumerate() {
            if size == 1 {
                continue;
            }
            // Dimension of size 2: +1 and −1 reach the same neighbour; keep both links
            // (a 2×2 torus has 4 ports per node and parallel links, as in the testbed).
            link(t, id, torus_next(dims, id, d), gbps, p);
        }
    }
}

/// A dragonfly: groups of `group_size` fully connected, one global link
/// between every two groups; hosts attached.
pub fn dragonfly(t: &mut Topology, a: &Attach, group_size: u32) {
    let (s, p) = (a.storage_nodes, a.prop_ns);
    let g = group_size.max(2);
    let groups = s.div_ceil(g);
    let group = |i: u32| (i * g..((i + 1) * g).min(s)).collect::<Vec<u32>>();
    let local_ports = (g - 1).max(1) as u64;
    let global_per_node = (groups.saturating_sub(1)).div_ceil(g).max(1) as u64;
    let per = a.node_gbps / (local_ports + global_per_node);
    for gi in 0..groups {
        let m = group(gi);
        for x in 0..m.len() {
            for y in x + 1..m.len() {
                link(t, m[x], m[y], per, p);
            }
        }
    }
    for gi in 0..groups {
        for gj in gi + 1..groups {
            let (mi, mj) = (group(gi), group(gj));
            link(
                t,
                mi[gj as usize % mi.len()],
                mj[gi as usize % mj.len()],
                per,
                p,
            );
        }
    }
    attach_hosts(t, a);
}

/// Switchless: port k of host i to storage node (i + k) mod S.
pub fn attach_hosts(t: &mut Topology, a: &Attach) {
    let s = a.storage_nodes;
    for i in 0..a.hosts {
        let h = t.add_node(NodeKind::Host, format!("h{i}"));
        for k in 0..a.host_ports.max(1) {
            link(t, h, (i + k) % s, a.host_gbps, a.prop_ns);
        }
    }
}

/// Most balanced factorisation of n into `k` dimensions (largest first);
/// empty if there is none (n = 0).
pub fn balanced_dims(n: u32, k: usize) -> Vec<u32> {
    let mut best: Vec<u32> = vec![];
    let mut best_score = u32::MAX;
    let mut cur = vec![];
    fn rec(n: u32, k: usize, min: u32, cur: &mut Vec<u32>, best: &mut Vec<u32>, score: &mut u32) {
        if k == 1 {
            if n >= min {
                cur.push(n);
                let hi = cur.iter().max().copied().unwrap_or(0);
                let lo = cur.iter().min().copied().unwrap_or(0);
                if hi - lo < *score {
                    *score = hi - lo;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_are_balanced() {
        assert_eq!(balanced_dims(27, 3), vec![3, 3, 3]);
        assert_eq!(balanced_dims(1000, 3), vec![10, 10, 10]);
        assert_eq!(balanced_dims(4, 2), vec![2, 2]);
    }

    #[test]
    fn a_2x2_torus_has_two_parallel_links_per_neighbour_pair_and_none_diagonal() {
        let mut t = Topology::new();
        storage_nodes(&mut t, 4);
        let a = Attach {
            storage_nodes: 4,
            uplinks: 4,
            node_gbps: 400,
            hosts: 0,
            host_ports: 1,
            host_gbps: 100,
            prop_ns: 100,
        };
        torus(&mut t, &a, &[2, 2]);
        assert_eq!(t.links.len(), 8);
        assert_eq!(t.links_between(0, 1).len(), 2);
        assert_eq!(t.links_between(0, 2).len(), 2);
        assert!(t.links_between(0, 3).is_empty());
        assert!((0..4).all(|n| t.port_count(n) == 4));
        assert!(t.links.iter().all(|l| l.bits_per_s == 100 * BITS_PER_GBIT));
    }
}
