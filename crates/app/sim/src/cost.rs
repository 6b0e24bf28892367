//! Capex model: switched (NICs + ToR/leaf-spine switches) vs switchless (multi-port adapters).
//! Default prices are rough public street prices, documented in docs/cost-model.md; every
//! one is configurable because they are the least certain numbers in this crate.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Prices {
    /// Switch with `switch_ports` ports of `port_gbps` (e.g. a 32×100GbE ToR).
    pub switch_usd: f64,
    pub switch_ports: u32,
    /// Plain NIC per storage node in the switched design (e.g. dual-port 100GbE).
    pub nic_usd: f64,
    pub nics_per_node: u32,
    pub nic_ports: u32,
    /// Multi-port SmartNIC storage adapter in the switchless design (e.g. 4-port 100GbE).
    pub adapter_usd: f64,
    pub adapters_per_node: u32,
    pub adapter_ports: u32,
    /// Direct-attach copper cable (node↔switch, node↔node in a rack).
    pub dac_usd: f64,
    /// Optical transceiver (one per end of a switch↔switch link) and the fibre between.
    pub optic_usd: f64,
    pub fibre_usd: f64,
}

impl Default for Prices {
    fn default() -> Self {
        Prices {
            switch_usd: 18_000.0,
            switch_ports: 32,
            nic_usd: 1_200.0,
            nics_per_node: 2,
            nic_ports: 2,
            adapter_usd: 2_400.0,
            adapters_per_node: 1,
            adapter_ports: 4,
            dac_usd: 120.0,
            optic_usd: 250.0,
            fibre_usd: 40.0,
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Capex {
    pub nodes: u32,
    pub switched_usd: f64,
    pub switches: u32,
    /// The switching rule's name (`SwitchPlan::describe`).
    pub switch_plan: String,
    pub switched_items: Vec<(String, u32, f64)>,
    pub switchless_usd: f64,
    pub switchless_items: Vec<(String, u32, f64)>,
    pub saving: f64,
}

/// How the switched design connects its endpoint ports: the ONE rule the cost model
/// prices and the simulator builds (`TopologyKind::Tor`), named in both outputs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum SwitchPlan {
    /// Every port fits one switch: a single ToR.
    SingleTor,
    /// `switches` = ⌈ports / switch_ports⌉ parallel switches (planes) with no
    /// inter-switch links; each node spreads its ports over the planes (port i on
    /// plane i mod planes) and each host sits on one plane, so every host reaches
    /// every node through its plane. This is how the NSDI'26 paper prices its
    /// switched design: 20 nodes × 4 ports = 80 ports → ⌈80/32⌉ = 3 switches
    /// ([NSDI'26], second-hand, unverified; docs/sources.md). It needs at least as many
    /// ports per node as planes.
    Planes { switches: u32 },
    /// More planes than a node has ports: a non-blocking leaf-spine, each leaf
    /// half down, half up, spines = ⌈uplinks / switch_ports⌉.
    LeafSpine {
        leaves: u32,
        spines: u32,
        uplinks: u32,
    },
}

impl SwitchPlan {
    /// The rule: a single ToR if the ports fit, else planes when each node has a
    /// port for every plane, else a non-blocking leaf-spine.
    pub fn for_ports(total_ports: u32, ports_per_node: u32, switch_ports: u32) -> SwitchPlan {
        let p = switch_ports.max(2);
        if total_ports <= p {
            return SwitchPlan::SingleTor;
        }
        let planes = total_ports.div_ceil(p);
        if planes <= ports_per_node {
            return SwitchPlan::Planes { switches: planes };
        }
        let down = p / 2;
        let leaves = total_ports.div_ceil(down);
        let uplinks = leaves * (p - down);
        SwitchPlan::LeafSpine {
            leaves,
            spines: uplinks.div_ceil(p),
            uplinks,
        }
    }

    pub fn switches(&self) -> u32 {
        match *self {
            SwitchPlan::SingleTor => 1,
            SwitchPlan::Planes { switches } => switches,
            SwitchPlan::LeafSpine { leaves, spines, .. } => leaves + spines,
        }
    }

    /// Switch-to-switch links (each needs two optics and a fibre).
    pub fn inter_switch_links(&self) -> u32 {
        match *self {
            SwitchPlan::LeafSpine { uplinks, .. } => uplinks,
            _ => 0,
        }
    }

    /// The rule's name for outputs.
    pub fn describe(&self, switch_ports: u32) -> String {
        match *self {
            SwitchPlan::SingleTor => format!("one {switch_ports}-port ToR"),
            SwitchPlan::Planes { switches } => format!(
                "{switches} parallel {switch_ports}-port switches (planes, no inter-switch links)"
            ),
            SwitchPlan::LeafSpine { leaves, spines, .. } => format!(
                "non-blocking leaf-spine: {leaves} leaves + {spines} spines of {switch_ports} ports"
            ),
        }
    }
}

pub fn capex(nodes: u32, pr: &Prices) -> Capex {
    let per_node = pr.nics_per_node * pr.nic_ports;
    let node_ports = nodes * per_node;
    let plan = SwitchPlan::for_ports(node_ports, per_node, pr.switch_ports);
    let (switches, isl) = (plan.switches(), plan.inter_switch_links());
    let sw_items = vec![
        ("NIC".to_string(), nodes * pr.nics_per_node, pr.nic_usd),
        ("switch".to_string(), switches, pr.switch_usd),
        ("DAC node-switch".to_string(), node_ports, pr.dac_usd),
        (
            "optic (switch-switch, per end)".to_string(),
            2 * isl,
            pr.optic_usd,
        ),
        ("fibre (switch-switch)".to_string(), isl, pr.fibre_usd),
    ];
    // Switchless: every adapter port is half of a node-to-node cable.
    let sl_ports = nodes * pr.adapters_per_node * pr.adapter_ports;
    let sl_items = vec![
        (
            "adapter".to_string(),
            nodes * pr.adapters_per_node,
            pr.adapter_usd,
        ),
        ("DAC node-node".to_string(), sl_ports / 2, pr.dac_usd),
    ];
    let sum = |v: &Vec<(String, u32, f64)>| v.iter().map(|(_, n, p)| *n as f64 * p).sum::<f64>();
    let (a, b) = (sum(&sw_items), sum(&sl_items));
    Capex {
        nodes,
        switched_usd: a,
        switches,
        switch_plan: plan.describe(pr.switch_ports),
        switched_items: sw_items,
        switchless_usd: b,
        switchless_items: sl_items,
        saving: 1.0 - b / a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_single_tor_then_planes_then_leaf_spine() {
        assert_eq!(SwitchPlan::for_ports(32, 4, 32), SwitchPlan::SingleTor);
        // The paper's 20 nodes × 4 ports: ⌈80/32⌉ = 3 planes, no inter-switch links.
        let p = SwitchPlan::for_ports(80, 4, 32);
        assert_eq!(p, SwitchPlan::Planes { switches: 3 });
        assert_eq!((p.switches(), p.inter_switch_links()), (3, 0));
        // 64 nodes × 4 ports need 8 planes but a node has 4 ports: leaf-spine,
        // 16 leaves of 16 down + 16 up = 256 uplinks → 8 spines.
        let p = SwitchPlan::for_ports(256, 4, 32);
        assert_eq!(
            p,
            SwitchPlan::LeafSpine {
                leaves: 16,
                spines: 8,
                uplinks: 256
            }
        );
        assert_eq!(p.switches(), 24);
    }

    #[test]
    fn capex_adds_up_by_hand() {
        let pr = Prices {
            switch_usd: 10_000.0,
            nic_usd: 1_000.0,
            adapter_usd: 2_000.0,
            dac_usd: 100.0,
            optic_usd: 0.0,
            fibre_usd: 0.0,
            ..Prices::default()
        };
        // 4 nodes × 2 dual-port NICs = 16 ports: one switch.
        let c = capex(4, &pr);
        assert_eq!(c.switched_usd, 8.0 * 1_000.0 + 10_000.0 + 16.0 * 100.0);
        // 4 adapters + 4 × 4 / 2 = 8 cables.
        assert_eq!(c.switchless_usd, 4.0 * 2_000.0 + 8.0 * 100.0);
        assert!((c.saving - (1.0 - 8_800.0 / 19_600.0)).abs() < 1e-12);
    }
}
