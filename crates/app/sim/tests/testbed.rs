//! The 4-node testbed that `trellis sim` simulates (`reproduce::testbed`, the
//! configurations of `reproduce nsdi26`) is the one `trellis san` emulates
//! (`san up switched|torus2d`): the same node kinds, the same link multiset,
//! the same client paths. Both are built from `trellis_topology::testbed`;
//! these tests compare what each side actually builds, so a change to either
//! (a torus wiring, a link count, a client attachment) fails here.

use std::collections::BTreeMap;

use trellis_san::topo as san;
use trellis_sim::config::{JobConfig, TopologyConfig};
use trellis_sim::reproduce;
use trellis_sim::topo::{self, Graph};
use trellis_ssd::Precondition;
use trellis_topology::{paths, testbed, NodeKind, Topology};

/// Each veth stands for one 100GbE port (`--rate 1gbit` at a bandwidth time scale of 100).
const PORT_BITS_PER_S: u64 = testbed::CLIENT_PORT_GBPS * 1_000_000_000;

/// Client paths by target: each path the node names it visits, from the client.
type ClientPaths = BTreeMap<String, Vec<Vec<String>>>;

fn sim_config(switched: bool) -> TopologyConfig {
    reproduce::testbed(switched, Precondition::Clean, JobConfig::default(), 1).topology
}

fn simulated(cfg: &TopologyConfig) -> (Graph, Topology) {
    let g = topo::build(cfg).expect("the testbed builds");
    let d = g.description();
    (g, d)
}

fn emulated(t: &san::Topology) -> Topology {
    t.description(PORT_BITS_PER_S, testbed::PROP_NS)
}

/// The shared path search over a description, from `h0` to every storage node.
fn description_paths(d: &Topology) -> ClientPaths {
    let h0 = d.find("h0").expect("a client h0");
    d.of_kind(NodeKind::Storage)
        .into_iter()
        .map(|s| {
            let ps = paths::disjoint(d, h0, s)
                .iter()
                .map(|p| names(d, &paths::nodes_of(d, h0, p)))
                .collect();
            (d.name(s).to_string(), ps)
        })
        .collect()
}

fn names(d: &Topology, nodes: &[u32]) -> Vec<String> {
    nodes.iter().map(|&n| d.name(n).to_string()).collect()
}

/// The paths `san` pins (its `Path` list), as node names.
fn san_paths(t: &san::Topology) -> ClientPaths {
    let mut m = ClientPaths::new();
    for p in &t.paths {
        let mut v = vec!["h0".to_string()];
        v.extend(p.hops.iter().map(|&h| t.hop_ends(h).2.to_string()));
        m.entry(p.target.clone()).or_default().push(v);
    }
    m
}

/// The simulated client's first hops toward each storage node (the ports its
/// ISR may choose from), as the neighbour names.
fn sim_first_hops(g: &Graph, d: &Topology) -> BTreeMap<String, Vec<String>> {
    let h0 = d.find("h0").expect("a client h0");
    let mut out = [0u32; 64];
    d.of_kind(NodeKind::Storage)
        .into_iter()
        .map(|s| {
            let k = g.host_candidates(h0, s, &mut out);
            let mut v = names(
                d,
                &out[..k].iter().map(|&p| g.peer_node(p)).collect::<Vec<_>>(),
            );
            v.sort();
            (d.name(s).to_string(), v)
        })
        .collect()
}

fn first_hops(p: &ClientPaths) -> BTreeMap<String, Vec<String>> {
    p.iter()
        .map(|(t, ps)| {
            let mut v: Vec<String> = ps.iter().map(|p| p[1].clone()).collect();
            v.sort();
            (t.clone(), v)
        })
        .collect()
}

/// `d` with every team (parallel links between a node and a switch) as one link.
fn fold_teams(d: &Topology) -> Topology {
    let mut t = Topology::new();
    for n in &d.nodes {
        t.add_node(n.kind, n.name.clone());
    }
    for l in &d.links {
        let on_switch =
            d.kind(l.a.node) == NodeKind::Switch || d.kind(l.b.node) == NodeKind::Switch;
        if !on_switch || t.links_between(l.a.node, l.b.node).is_empty() {
            t.link(l.a.node, l.b.node, l.bits_per_s, l.prop_ns);
        }
    }
    t
}

#[test]
fn the_simulated_torus_testbed_is_the_emulated_one() {
    let (g, sim) = simulated(&sim_config(false));
    let emu = san::torus2d();
    assert_eq!(testbed::torus2d().differences(&sim), Vec::<String>::new());
    assert_eq!(sim.differences(&emulated(&emu)), Vec::<String>::new());
    assert_eq!(sim.links.len(), 12);
    let paths = description_paths(&sim);
    assert_eq!(paths, san_paths(&emu));
    for (t, ps) in &paths {
        assert_eq!(ps.len(), 4, "{t}: 4 disjoint paths");
    }
    // The simulated client may send out of each of its 4 ports: the first hops
    // of the 4 paths san pins.
    assert_eq!(sim_first_hops(&g, &sim), first_hops(&paths));
}

#[test]
fn the_simulated_switched_testbed_is_the_emulated_one_but_for_the_teams() {
    let (g, sim) = simulated(&sim_config(true));
    let emu = san::switched();
    assert_eq!(testbed::switched().differences(&sim), Vec::<String>::new());
    // The one known difference: a storage node's 4 teamed ToR ports are one veth in san.
    let want: Vec<String> = (0..4)
        .map(|i| format!("links st{i}–tor at 100000000000 bit/s, 100 ns: 4 vs 1"))
        .collect();
    assert_eq!(sim.differences(&emulated(&emu)), want);
    assert_eq!(
        fold_teams(&sim).differences(&emulated(&emu)),
        Vec::<String>::new()
    );
    let paths = description_paths(&sim);
    assert_eq!(paths, san_paths(&emu));
    for (t, ps) in &paths {
        assert_eq!(
            ps,
            &vec![vec!["h0".to_string(), "tor".to_string(), t.clone()]]
        );
    }
    assert_eq!(sim_first_hops(&g, &sim), first_hops(&paths));
}

#[test]
fn a_testbed_wired_or_attached_differently_fails_the_comparison() {
    let (_, sim) = simulated(&sim_config(false));
    // Emulated side: one torus link rewired to the diagonal.
    let mut emu = san::torus2d();
    let l = emu.links_between("st0", "st1")[0];
    emu.links[l].b = "st3".to_string();
    let d = sim.differences(&emulated(&emu));
    assert!(
        d.iter()
            .any(|x| x.starts_with("links st0–st1") && x.ends_with("2 vs 1")),
        "{d:?}"
    );
    assert!(
        d.iter()
            .any(|x| x.starts_with("links st0–st3") && x.ends_with("0 vs 1")),
        "{d:?}"
    );
    assert_ne!(description_paths(&sim), description_paths(&emulated(&emu)));
    // Emulated side: the client node of another kind.
    let mut t = emulated(&san::torus2d());
    let h0 = t.find("h0").unwrap() as usize;
    t.nodes[h0].kind = NodeKind::Storage;
    assert_eq!(
        sim.differences(&t),
        vec!["node h0: Host vs Storage".to_string()]
    );
    // Simulated side: a client with 3 ports instead of 4 has other paths.
    let mut cfg = sim_config(false);
    cfg.host_ports = 3;
    let (_, three) = simulated(&cfg);
    assert!(!three.differences(&emulated(&san::torus2d())).is_empty());
    assert_ne!(description_paths(&three), san_paths(&san::torus2d()));
    // Simulated side: teams of 2 no longer match the known difference.
    let mut cfg = sim_config(true);
    cfg.uplinks = 2;
    let (_, two) = simulated(&cfg);
    assert_ne!(two.differences(&emulated(&san::switched())).len(), 0);
    assert!(two.differences(&simulated(&sim_config(true)).1).len() == 8);
}
