//! The emulated SAN's shape, as data: nodes, links with their devices and
//! addresses, and the paths from the client to every storage node. Pure:
//! `plan` turns this into `ip`/`tc` commands.
//!
//! The shape is not defined here: it is the shared description of the
//! NSDI'26 4-node testbed (`trellis_topology::testbed`, the same one
//! `trellis sim` simulates; crates/app/sim/tests/testbed.rs checks it), and
//! this module lays it out as namespaces and veth links:
//! - **switched**: a Linux bridge in the namespace `tor`, every other node's
//!   `eth0` on it. A storage node's team of ports to the ToR (4 in the
//!   description) is one veth here, shaped as one link: the one known
//!   difference between what is emulated and what is simulated (docs/san.md);
//! - **torus2d**: one veth per link; a storage node's link to its next
//!   neighbour along dimension 0 leaves by `pE` and arrives at `pW`, along
//!   dimension 1 by `pS` at `pN`; client port k is `p<k>`, a storage node's
//!   port to the client `ph`; a /30 per link, numbered in link order.
//!
//! The client's paths are the shared link-disjoint paths
//! (`trellis_topology::paths`) over the description's links.

use serde::{Deserialize, Serialize};
use trellis_topology::{paths, testbed, NodeKind};

/// The shared description (`trellis_topology::Topology`).
pub type Description = trellis_topology::Topology;

/// Storage nodes of the testbed.
pub const STORAGE_NODES: usize = testbed::STORAGE_NODES as usize;
/// Client ports of the switchless adapter (one per storage node).
pub const CLIENT_PORTS: usize = testbed::SWITCHLESS_CLIENT_PORTS as usize;
/// Every namespace we create starts with this, so nothing of ours can be
/// mistaken for someone else's.
pub const NS_PREFIX: &str = "tsan-";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Switched,
    Torus2d,
}

impl std::str::FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Kind, String> {
        match s {
            "switched" => Ok(Kind::Switched),
            "torus2d" | "switchless" => Ok(Kind::Torus2d),
            other => Err(format!(
                "unknown topology {other:?}: use switched or torus2d"
            )),
        }
    }
}

/// One veth link: `a:a_dev` ↔ `b:b_dev` (node names without the prefix).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub a: String,
    pub a_dev: String,
    pub b: String,
    pub b_dev: String,
    /// Point-to-point addresses (torus); None on bridge ports.
    pub a_ip: Option<String>,
    pub b_ip: Option<String>,
}

/// One path from the client to a storage node: the address that selects it
/// and the links it crosses, in order from the client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Path {
    pub target: String,
    pub index: usize,
    pub addr: String,
    /// (link index, whether the link is crossed from `a` to `b`).
    pub hops: Vec<(usize, bool)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub kind: Kind,
    /// Node names (without the prefix): `h0`, `st0`..`st3`, and `tor`.
    pub nodes: Vec<String>,
    pub links: Vec<Link>,
    /// Primary address of each node (on `lo` in the torus, on `eth0` when
    /// switched), by node name.
    pub primary: Vec<(String, String)>,
    pub paths: Vec<Path>,
}

/// The client's address: every path's traffic comes from it.
pub const CLIENT_ADDR: &str = "10.81.2.1";

/// The client's name in the description.
const CLIENT: &str = "h0";

fn storage_addr(i: usize) -> String {
    format!("10.81.1.{}", i + 1)
}

pub fn switched() -> Topology {
    emulate(Kind::Switched, &testbed::switched())
}

pub fn torus2d() -> Topology {
    emulate(Kind::Torus2d, &testbed::torus2d())
}

/// A node's kind from its name (the description's names: `tor`, `h<i>`, `st<i>`).
pub fn node_kind(name: &str) -> NodeKind {
    if name == "tor" {
        NodeKind::Switch
    } else if name.starts_with('h') {
        NodeKind::Host
    } else {
        NodeKind::Storage
    }
}

/// Namespaces in the order of earlier versions: the switch, the client,
/// the storage nodes.
fn kind_rank(k: NodeKind) -> u8 {
    match k {
        NodeKind::Switch => 0,
        NodeKind::Host => 1,
        NodeKind::Storage => 2,
    }
}

/// The description laid out as namespaces, veths, addresses and paths.
fn emulate(kind: Kind, d: &Description) -> Topology {
    let mut order: Vec<u32> = (0..d.nodes.len() as u32).collect();
    order.sort_by_key(|&n| kind_rank(d.kind(n)));
    let nodes: Vec<String> = order.iter().map(|&n| d.name(n).to_string()).collect();
    let (links, veth_of) = veths(d);
    let mut primary = vec![(CLIENT.to_string(), CLIENT_ADDR.to_string())];
    let storage = d.of_kind(NodeKind::Storage);
    for (i, &s) in storage.iter().enumerate() {
        primary.push((d.name(s).to_string(), storage_addr(i)));
    }
    let mut t = Topology {
        kind,
        nodes,
        links,
        primary,
        paths: Vec::new(),
    };
    let Some(h0) = d.find(CLIENT) else {
        return t;
    };
    for (i, &s) in storage.iter().enumerate() {
        for (k, hops) in paths::disjoint(d, h0, s).into_iter().enumerate() {
            let hops = emulated_hops(d, &t, &veth_of, h0, &hops);
            let addr = match kind {
                // One path, to the target's primary, through the bridge.
                Kind::Switched => storage_addr(i),
                Kind::Torus2d => format!("10.83.{k}.{}", i + 1),
            };
            let target = d.name(s).to_string();
            t.paths.push(Path {
                target,
                index: k,
                addr,
                hops,
            });
        }
    }
    t
}

/// A description path's hops as hops over the veths.
fn emulated_hops(
    d: &Description,
    t: &Topology,
    veth_of: &[usize],
    src: u32,
    hops: &[paths::Hop],
) -> Vec<(usize, bool)> {
    let at = paths::nodes_of(d, src, hops);
    hops.iter()
        .zip(&at)
        .map(|(&(l, _), &from)| {
            let v = veth_of[l];
            (v, t.links[v].a == d.name(from))
        })
        .collect()
}

/// One veth per description link, except that a node's team of parallel
/// links to a switch is one veth; returned with the veth of every
/// description link. Bridge ports first, the client's before the storage
/// nodes' (the link numbers of earlier versions, which `status`, `link
/// --nth` and state files use), then the rest in description order.
fn veths(d: &Description) -> (Vec<Link>, Vec<usize>) {
    let on_switch = |l: &trellis_topology::Link| {
        [l.a.node, l.b.node]
            .iter()
            .any(|&n| d.kind(n) == NodeKind::Switch)
    };
    let rank = |i: usize| {
        let l = &d.links[i];
        match (on_switch(l), [l.a.node, l.b.node].map(|n| d.kind(n))) {
            (true, k) if k.contains(&NodeKind::Host) => 0,
            (true, _) => 1,
            (false, _) => 2,
        }
    };
    let mut order: Vec<usize> = (0..d.links.len()).collect();
    order.sort_by_key(|&i| rank(i));
    let mut links: Vec<Link> = Vec::new();
    let mut veth_of = vec![0; d.links.len()];
    let mut teams: Vec<((u32, u32), usize)> = Vec::new();
    for i in order {
        let l = &d.links[i];
        let pair = (l.a.node, l.b.node);
        if on_switch(l) {
            if let Some(&(_, v)) = teams.iter().find(|(p, _)| *p == pair) {
                veth_of[i] = v;
                continue;
            }
            teams.push((pair, links.len()));
        }
        veth_of[i] = links.len();
        let n = links.len();
        links.push(veth(d, l, n));
    }
    (links, veth_of)
}

/// The veth of description link `l`, the `n`-th veth.
fn veth(d: &Description, l: &trellis_topology::Link, n: usize) -> Link {
    let (a, b) = (d.name(l.a.node).to_string(), d.name(l.b.node).to_string());
    let (ka, kb) = (d.kind(l.a.node), d.kind(l.b.node));
    let p2p = || (Some(format!("10.82.{n}.1")), Some(format!("10.82.{n}.2")));
    let (a_dev, b_dev, (a_ip, b_ip)) = match (ka, kb) {
        (_, NodeKind::Switch) => ("eth0".to_string(), format!("v-{a}"), (None, None)),
        (NodeKind::Switch, _) => (format!("v-{b}"), "eth0".to_string(), (None, None)),
        (NodeKind::Host, _) => (format!("p{}", l.a.port), "ph".to_string(), p2p()),
        (_, NodeKind::Host) => ("ph".to_string(), format!("p{}", l.b.port), p2p()),
        _ => {
            let (out, inp) = match testbed::torus2d_axis(l.a.node, l.b.node) {
                Some(0) => ("pE".to_string(), "pW".to_string()),
                Some(_) => ("pS".to_string(), "pN".to_string()),
                // Not a testbed torus link: name the ports by number.
                None => (format!("p{}", l.a.port), format!("p{}", l.b.port)),
            };
            (out, inp, p2p())
        }
    };
    Link {
        a,
        a_dev,
        b,
        b_dev,
        a_ip,
        b_ip,
    }
}

impl Topology {
    /// The graph this SAN emulates, as the shared description: nodes with
    /// their kinds, one link per veth, each at `bits_per_s` (the rate a veth
    /// stands for: `--rate` 1gbit stands for 100GbE) and `prop_ns`. To be
    /// compared with what the simulator runs (`Topology::differences`).
    pub fn description(&self, bits_per_s: u64, prop_ns: u64) -> Description {
        let mut d = Description::new();
        for n in &self.nodes {
            d.add_node(node_kind(n), n.clone());
        }
        for l in &self.links {
            if let (Some(a), Some(b)) = (d.find(&l.a), d.find(&l.b)) {
                d.link(a, b, bits_per_s, prop_ns);
            }
        }
        d
    }

    pub fn ns(node: &str) -> String {
        format!("{NS_PREFIX}{node}")
    }

    /// The node a path's hop leaves from and arrives at, with the devices.
    pub fn hop_ends(&self, hop: (usize, bool)) -> (&str, &str, &str, &str) {
        let l = &self.links[hop.0];
        if hop.1 {
            (&l.a, &l.a_dev, &l.b, &l.b_dev)
        } else {
            (&l.b, &l.b_dev, &l.a, &l.a_dev)
        }
    }

    /// Where the far end of `hop` answers (its point-to-point address).
    pub fn hop_peer_ip(&self, hop: (usize, bool)) -> Option<&str> {
        let l = &self.links[hop.0];
        if hop.1 {
            l.b_ip.as_deref()
        } else {
            l.a_ip.as_deref()
        }
    }

    /// The near end's address of `hop`.
    pub fn hop_near_ip(&self, hop: (usize, bool)) -> Option<&str> {
        let l = &self.links[hop.0];
        if hop.1 {
            l.a_ip.as_deref()
        } else {
            l.b_ip.as_deref()
        }
    }

    /// Links between nodes `a` and `b` (either order), in link order.
    pub fn links_between(&self, a: &str, b: &str) -> Vec<usize> {
        (0..self.links.len())
            .filter(|&i| {
                let l = &self.links[i];
                (l.a == a && l.b == b) || (l.a == b && l.b == a)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn storage(i: usize) -> String {
        format!("st{i}")
    }

    #[test]
    fn the_torus_gives_every_node_four_storage_ports_and_the_client_one_each() {
        let t = torus2d();
        for i in 0..STORAGE_NODES {
            let n = storage(i);
            let ports: Vec<_> = t
                .links
                .iter()
                .flat_map(|l| [(&l.a, &l.a_dev), (&l.b, &l.b_dev)])
                .filter(|(node, _)| **node == n)
                .map(|(_, d)| d.clone())
                .collect();
            let set: BTreeSet<_> = ports.iter().cloned().collect();
            assert_eq!(
                set,
                ["pE", "pN", "pS", "pW", "ph"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
            );
            assert_eq!(ports.len(), 5, "{n}: {ports:?}");
        }
        // Neighbours share two parallel links in a 2x2 torus; diagonals none.
        assert_eq!(t.links_between("st0", "st1").len(), 2);
        assert_eq!(t.links_between("st0", "st2").len(), 2);
        assert_eq!(t.links_between("st0", "st3").len(), 0);
    }

    #[test]
    fn the_client_reaches_every_storage_node_over_four_link_disjoint_paths() {
        let t = torus2d();
        for i in 0..STORAGE_NODES {
            let ps: Vec<_> = t.paths.iter().filter(|p| p.target == storage(i)).collect();
            assert_eq!(ps.len(), 4, "st{i}");
            let mut used = BTreeSet::new();
            for p in &ps {
                // Consecutive hops chain from h0 to the target.
                let mut at = "h0".to_string();
                for &h in &p.hops {
                    let (from, _, to, _) = t.hop_ends(h);
                    assert_eq!(from, at);
                    at = to.to_string();
                    assert!(used.insert(h.0), "link {} used twice", h.0);
                }
                assert_eq!(at, storage(i));
            }
            // Shortest first: one direct link, then two of 2 hops, one of 3.
            let lens: Vec<usize> = ps.iter().map(|p| p.hops.len()).collect();
            assert_eq!(lens, vec![1, 2, 2, 3], "st{i}");
            let addrs: BTreeSet<_> = ps.iter().map(|p| p.addr.clone()).collect();
            assert_eq!(addrs.len(), 4);
        }
    }

    #[test]
    fn switched_has_one_path_per_node_through_the_tor() {
        let t = switched();
        assert_eq!(t.paths.len(), STORAGE_NODES);
        for p in &t.paths {
            let (a, _, b, _) = t.hop_ends(p.hops[0]);
            assert_eq!((a, b), ("h0", "tor"));
            let (a, _, b, _) = t.hop_ends(p.hops[1]);
            assert_eq!((a, b.to_string()), ("tor", p.target.clone()));
        }
        assert!("mesh".parse::<Kind>().is_err());
    }
}
