//! The NSDI'26 study's 4-node testbed (docs/sources.md [NSDI'26]: four storage
//! nodes with 4 PM9A3 drives and 4×100GbE each; switched = one ToR and a single
//! client–ToR path; switchless = a 2D torus of the nodes' SmartNIC adapters, "4
//! disjoint paths"), as the one description that `trellis sim` simulates and
//! `trellis san` emulates:
//!
//! - **switched**: every storage node's 4 ports teamed to one ToR (`tor`),
//!   the client `h0` with one port to it;
//! - **torus2d**: the storage nodes `st(r·2 + c)` at (r, c) of a 2×2 torus,
//!   each node's link along a dimension to its next neighbour there (in a 2×2
//!   the next and the previous neighbour are the same node, so neighbours
//!   share two parallel links and every node has 4 torus ports), and the
//!   client's 4-port adapter with port k to storage node k.

use crate::gen::{self, Attach};
use crate::Topology;

/// Storage nodes of the testbed.
pub const STORAGE_NODES: u32 = 4;
/// Ports of a storage node's adapter (4×100GbE).
pub const NODE_PORTS: u32 = 4;
/// A storage node's adapter rate, Gbit/s, split over its ports.
pub const NODE_GBPS: u64 = 400;
/// Rate of each client port, Gbit/s.
pub const CLIENT_PORT_GBPS: u64 = 100;
/// Client ports of the paper's attachment: switched, the single client–ToR
/// path; switchless, one port to each storage node.
pub const SWITCHED_CLIENT_PORTS: u32 = 1;
pub const SWITCHLESS_CLIENT_PORTS: u32 = STORAGE_NODES;
/// Propagation delay of every link (the simulator's default, 100 ns: a few
/// metres of cable).
pub const PROP_NS: u64 = 100;
/// Torus dimensions.
pub const TORUS_DIMS: [u32; 2] = [2, 2];

/// The testbed's nodes and adapters with one client of `client_ports` ports.
pub fn attach(client_ports: u32) -> Attach {
    Attach {
        storage_nodes: STORAGE_NODES,
        uplinks: NODE_PORTS,
        node_gbps: NODE_GBPS,
        hosts: 1,
        host_ports: client_ports,
        host_gbps: CLIENT_PORT_GBPS,
        prop_ns: PROP_NS,
    }
}

/// Switched, the client on `client_ports` ports to the ToR.
pub fn switched_with(client_ports: u32) -> Topology {
    let mut t = Topology::new();
    gen::storage_nodes(&mut t, STORAGE_NODES);
    gen::planes(&mut t, &attach(client_ports), 1);
    t
}

/// Switchless, client port k to storage node k mod 4.
pub fn torus2d_with(client_ports: u32) -> Topology {
    let mut t = Topology::new();
    gen::storage_nodes(&mut t, STORAGE_NODES);
    gen::torus(&mut t, &attach(client_ports), &TORUS_DIMS);
    t
}

/// The paper's switched testbed.
pub fn switched() -> Topology {
    switched_with(SWITCHED_CLIENT_PORTS)
}

/// The paper's switchless testbed.
pub fn torus2d() -> Topology {
    torus2d_with(SWITCHLESS_CLIENT_PORTS)
}

/// The dimension along which torus link `a` → `b` runs (`b` is `a`'s next
/// neighbour there), for storage node ids; None if they are not neighbours.
pub fn torus2d_axis(a: u32, b: u32) -> Option<usize> {
    (0..TORUS_DIMS.len()).find(|&d| a < STORAGE_NODES && gen::torus_next(&TORUS_DIMS, a, d) == b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeKind;

    #[test]
    fn switched_teams_four_ports_per_node_and_the_client_has_one() {
        let t = switched();
        let tor = t.find("tor").unwrap();
        let h0 = t.find("h0").unwrap();
        assert_eq!(t.kind(tor), NodeKind::Switch);
        assert_eq!(t.kind(h0), NodeKind::Host);
        for s in t.of_kind(NodeKind::Storage) {
            let team = t.links_between(s, tor);
            assert_eq!(team.len(), 4);
            assert!(team
                .iter()
                .all(|&l| t.links[l].bits_per_s == 100_000_000_000));
        }
        assert_eq!(t.links_between(h0, tor).len(), 1);
        assert_eq!(t.links.len(), 17);
    }

    #[test]
    fn torus2d_wires_east_and_south_and_the_client_to_every_node() {
        let t = torus2d();
        assert_eq!(t.links.len(), 12);
        // st0 at (0,0): east neighbour st1 (dimension 0), south st2 (dimension 1).
        assert_eq!(torus2d_axis(0, 1), Some(0));
        assert_eq!(torus2d_axis(0, 2), Some(1));
        assert_eq!(torus2d_axis(3, 2), Some(0));
        assert_eq!(torus2d_axis(0, 3), None);
        let h0 = t.find("h0").unwrap();
        for s in 0..STORAGE_NODES {
            assert_eq!(t.links_between(h0, s).len(), 1);
            assert_eq!(t.port_count(s), 5);
        }
    }
}
