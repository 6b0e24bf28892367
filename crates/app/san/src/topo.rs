//! The emulated SAN's shape, as data: nodes, links with their addresses, and
//! for the switchless SAN the link-disjoint paths from the client to every
//! storage node. Pure: `plan` turns this into `ip`/`tc` commands.
//!
//! The topologies are the NSDI'26 study's 4-node testbed (seed 000, "Common
//! setup"): four storage nodes, and
//! - **switched**: every node, client included, has one link to a ToR (a
//!   Linux bridge in its own namespace): a single client–ToR path;
//! - **torus2d**: the storage nodes form a 2×2 torus (each node's E port to
//!   its east neighbour's W port, S to its south neighbour's N, wrapping, so
//!   in a 2×2 every neighbour pair has two parallel links and every node 4
//!   ports), and the client's 4-port adapter has one port to each storage
//!   node: 4 link-disjoint paths to each of them.

use serde::{Deserialize, Serialize};

/// Storage nodes of the testbed.
pub const STORAGE_NODES: usize = 4;
/// Client ports of the switchless adapter (one per storage node).
pub const CLIENT_PORTS: usize = 4;
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

fn storage(i: usize) -> String {
    format!("st{i}")
}

fn storage_addr(i: usize) -> String {
    format!("10.81.1.{}", i + 1)
}

pub fn switched() -> Topology {
    let mut nodes = vec!["tor".to_string(), "h0".to_string()];
    let mut links = vec![bridge_link("h0")];
    let mut primary = vec![("h0".to_string(), CLIENT_ADDR.to_string())];
    for i in 0..STORAGE_NODES {
        nodes.push(storage(i));
        links.push(bridge_link(&storage(i)));
        primary.push((storage(i), storage_addr(i)));
    }
    // One path to each storage node: through the ToR, to its primary.
    let paths = (0..STORAGE_NODES)
        .map(|i| Path {
            target: storage(i),
            index: 0,
            addr: storage_addr(i),
            hops: vec![(0, true), (i + 1, false)],
        })
        .collect();
    Topology {
        kind: Kind::Switched,
        nodes,
        links,
        primary,
        paths,
    }
}

fn bridge_link(node: &str) -> Link {
    Link {
        a: node.to_string(),
        a_dev: "eth0".to_string(),
        b: "tor".to_string(),
        b_dev: format!("v-{node}"),
        a_ip: None,
        b_ip: None,
    }
}

pub fn torus2d() -> Topology {
    let mut nodes = vec!["h0".to_string()];
    let mut primary = vec![("h0".to_string(), CLIENT_ADDR.to_string())];
    for i in 0..STORAGE_NODES {
        nodes.push(storage(i));
        primary.push((storage(i), storage_addr(i)));
    }
    let mut links = Vec::new();
    let p2p = |l: usize| (format!("10.82.{l}.1"), format!("10.82.{l}.2"));
    // 2×2 grid: st(r*2+c). E(r,c) -> W(r,c+1), S(r,c) -> N(r+1,c), wrapping.
    for r in 0..2 {
        for c in 0..2 {
            let me = r * 2 + c;
            for (dst, out, inp) in [
                (r * 2 + (c + 1) % 2, "pE", "pW"),
                (((r + 1) % 2) * 2 + c, "pS", "pN"),
            ] {
                let (a_ip, b_ip) = p2p(links.len());
                links.push(Link {
                    a: storage(me),
                    a_dev: out.to_string(),
                    b: storage(dst),
                    b_dev: inp.to_string(),
                    a_ip: Some(a_ip),
                    b_ip: Some(b_ip),
                });
            }
        }
    }
    for i in 0..CLIENT_PORTS {
        let (a_ip, b_ip) = p2p(links.len());
        links.push(Link {
            a: "h0".to_string(),
            a_dev: format!("p{i}"),
            b: storage(i),
            b_dev: "ph".to_string(),
            a_ip: Some(a_ip),
            b_ip: Some(b_ip),
        });
    }
    let mut paths = Vec::new();
    for t in 0..STORAGE_NODES {
        for (k, hops) in crate::paths::disjoint(&links, "h0", &storage(t))
            .into_iter()
            .enumerate()
        {
            paths.push(Path {
                target: storage(t),
                index: k,
                addr: format!("10.83.{k}.{}", t + 1),
                hops,
            });
        }
    }
    Topology {
        kind: Kind::Torus2d,
        nodes,
        links,
        primary,
        paths,
    }
}

impl Topology {
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
