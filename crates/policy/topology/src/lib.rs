//! A fabric's shape as data, shared by the simulator (`trellis-sim` builds its
//! routing graph from it) and the emulated SAN (`trellis-san` builds its
//! namespaces, veth links and addresses from it), so that what is simulated and
//! what is emulated cannot drift apart unnoticed.
//!
//! - [`Topology`]: nodes (kind and name) and undirected links (two ends, each a
//!   node and its port number, a rate in bits/s and a propagation delay in ns);
//!   no sockets, no addresses, no device names: those are each user's concern;
//! - [`gen`]: the generators of every shape the simulator builds (single ToR
//!   and parallel planes, leaf-spine, ring, 2D/3D torus, dragonfly, attached
//!   clients);
//! - [`testbed`]: the NSDI'26 study's 4-node testbed, switched and switchless;
//! - [`paths`]: link-disjoint paths between two nodes;
//! - [`Topology::differences`]: what makes two descriptions different graphs.
//!
//! docs/architecture.md ("Topology"), docs/glossary.md.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod gen;
pub mod paths;
pub mod testbed;

use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeKind {
    Storage,
    Switch,
    Host,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub kind: NodeKind,
    pub name: String,
}

/// One end of a link: a node and the number of its port there (a node's
/// ports are numbered 0, 1, … in the order its links were added).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct End {
    pub node: u32,
    pub port: u32,
}

/// An undirected link; `a` and `b` only say which end was named first (a
/// torus link's `a` is the node whose next neighbour along the dimension is `b`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub a: End,
    pub b: End,
    pub bits_per_s: u64,
    pub prop_ns: u64,
}

impl Link {
    /// The node at the other end from `node`, if `node` is an end.
    pub fn other(&self, node: u32) -> Option<u32> {
        if self.a.node == node {
            Some(self.b.node)
        } else if self.b.node == node {
            Some(self.a.node)
        } else {
            None
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    pub nodes: Vec<Node>,
    pub links: Vec<Link>,
    /// Ports each node has so far (the next link's port number there).
    ports: Vec<u32>,
}

/// A link as [`Topology::differences`] compares it: the two end names in
/// order, the rate and the delay (port numbers are local labels, not shape).
type LinkKey = (String, String, u64, u64);

impl Topology {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a node; its id is its position in `nodes`.
    pub fn add_node(&mut self, kind: NodeKind, name: impl Into<String>) -> u32 {
        self.nodes.push(Node {
            kind,
            name: name.into(),
        });
        self.ports.push(0);
        self.nodes.len() as u32 - 1
    }

    /// Adds a link between existing nodes `a` and `b`, each on its next port;
    /// returns the link's index.
    pub fn link(&mut self, a: u32, b: u32, bits_per_s: u64, prop_ns: u64) -> usize {
        let a = End {
            node: a,
            port: self.next_port(a),
        };
        let b = End {
            node: b,
            port: self.next_port(b),
        };
        self.links.push(Link {
            a,
            b,
            bits_per_s,
            prop_ns,
        });
        self.links.len() - 1
    }

    fn next_port(&mut self, node: u32) -> u32 {
        let slot = &mut self.ports[node as usize];
        *slot += 1;
        *slot - 1
    }

    /// Ports of `node` (the number of its link ends).
    pub fn port_count(&self, node: u32) -> u32 {
        self.ports.get(node as usize).copied().unwrap_or(0)
    }

    pub fn kind(&self, node: u32) -> NodeKind {
        self.nodes[node as usize].kind
    }

    pub fn name(&self, node: u32) -> &str {
        &self.nodes[node as usize].name
    }

    /// The id of the node called `name`.
    pub fn find(&self, name: &str) -> Option<u32> {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .map(|i| i as u32)
    }

    /// Ids of the nodes of `kind`, in id order.
    pub fn of_kind(&self, kind: NodeKind) -> Vec<u32> {
        (0..self.nodes.len() as u32)
            .filter(|&n| self.kind(n) == kind)
            .collect()
    }

    /// Links between `a` and `b` (either order), in link order.
    pub fn links_between(&self, a: u32, b: u32) -> Vec<usize> {
        (0..self.links.len())
            .filter(|&i| self.links[i].other(a) == Some(b) && (a != b))
            .collect()
    }

    /// Every way `self` and `other` are different graphs, in words (empty:
    /// the same graph): nodes matched by name must have the same kind, and
    /// the multisets of links (end names, unordered; rate; delay) must be
    /// equal. Node and link order and port numbers do not count.
    pub fn differences(&self, other: &Topology) -> Vec<String> {
        let mut out = Vec::new();
        let kinds = |t: &Topology| -> BTreeMap<String, NodeKind> {
            t.nodes.iter().map(|n| (n.name.clone(), n.kind)).collect()
        };
        let (ka, kb) = (kinds(self), kinds(other));
        for (name, k) in &ka {
            match kb.get(name) {
                None => out.push(format!("node {name} ({k:?}) only in the first")),
                Some(k2) if k2 != k => out.push(format!("node {name}: {k:?} vs {k2:?}")),
                Some(_) => {}
            }
        }
        for (name, k) in kb.iter().filter(|(n, _)| !ka.contains_key(*n)) {
            out.push(format!("node {name} ({k:?}) only in the second"));
        }
        let (la, lb) = (self.link_counts(), other.link_counts());
        for key in la.keys().chain(lb.keys().filter(|k| !la.contains_key(*k))) {
            let (x, y) = (la.get(key).copied(), lb.get(key).copied());
            if x != y {
                let (a, b, rate, prop) = key;
                out.push(format!(
                    "links {a}–{b} at {rate} bit/s, {prop} ns: {} vs {}",
                    x.unwrap_or(0),
                    y.unwrap_or(0)
                ));
            }
        }
        out
    }

    fn link_counts(&self) -> BTreeMap<LinkKey, usize> {
        let mut m = BTreeMap::new();
        for l in &self.links {
            let (x, y) = (self.name(l.a.node), self.name(l.b.node));
            let (x, y) = if x <= y { (x, y) } else { (y, x) };
            *m.entry((x.to_string(), y.to_string(), l.bits_per_s, l.prop_ns))
                .or_insert(0) += 1;
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_numbered_per_node_in_link_order() {
        let mut t = Topology::new();
        let (a, b, c) = (
            t.add_node(NodeKind::Storage, "a"),
            t.add_node(NodeKind::Storage, "b"),
            t.add_node(NodeKind::Switch, "c"),
        );
        t.link(a, b, 1, 1);
        t.link(b, c, 1, 1);
        t.link(a, c, 1, 1);
        assert_eq!((t.links[0].a.port, t.links[0].b.port), (0, 0));
        assert_eq!((t.links[1].a.port, t.links[1].b.port), (1, 0));
        assert_eq!((t.links[2].a.port, t.links[2].b.port), (1, 1));
        assert_eq!(
            [t.port_count(a), t.port_count(b), t.port_count(c)],
            [2, 2, 2]
        );
        assert_eq!(t.links_between(c, a), vec![2]);
    }

    #[test]
    fn differences_ignore_order_and_name_every_change() {
        let mut t = Topology::new();
        let (a, b) = (
            t.add_node(NodeKind::Storage, "a"),
            t.add_node(NodeKind::Host, "b"),
        );
        t.link(a, b, 10, 5);
        t.link(a, b, 10, 5);
        // Same graph, other order and orientation.
        let mut u = Topology::new();
        let (b2, a2) = (
            u.add_node(NodeKind::Host, "b"),
            u.add_node(NodeKind::Storage, "a"),
        );
        u.link(b2, a2, 10, 5);
        u.link(a2, b2, 10, 5);
        assert!(t.differences(&u).is_empty(), "{:?}", t.differences(&u));
        // One parallel link fewer, another rate, another kind: each named.
        let mut v = Topology::new();
        let (a3, b3) = (
            v.add_node(NodeKind::Switch, "a"),
            v.add_node(NodeKind::Host, "b"),
        );
        v.link(a3, b3, 10, 5);
        v.link(a3, b3, 20, 5);
        let d = t.differences(&v);
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d[0].contains("node a: Storage vs Switch"), "{d:?}");
        assert!(d[1].contains("10 bit/s, 5 ns: 2 vs 1"), "{d:?}");
        assert!(d[2].contains("20 bit/s, 5 ns: 0 vs 1"), "{d:?}");
    }
}
