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
    pub switched_items: Vec<(String, u32, f64)>,
    pub switchless_usd: f64,
    pub switchless_items: Vec<(String, u32, f64)>,
    pub saving: f64,
}

/// Switched: every NIC port goes to a switch. Up to one switch's ports: a single ToR.
/// Beyond: leaf-spine with half of each leaf's ports down, half up (non-blocking).
pub fn switch_count(node_ports: u32, p: u32) -> (u32, u32, u32) {
    if node_ports <= p {
        return (1, 0, 0);
    }
    let down = p / 2;
    let leaves = node_ports.div_ceil(down);
    let uplinks = leaves * (p - down);
    let spines = uplinks.div_ceil(p);
    (leaves + spines, leaves, uplinks)
}

pub fn capex(nodes: u32, pr: &Prices) -> Capex {
    let node_ports = nodes * pr.nics_per_node * pr.nic_ports;
    let (switches, _leaves, isl) = switch_count(node_ports, pr.switch_ports);
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
    fn switch_count_single_tor_then_leaf_spine() {
        assert_eq!(switch_count(32, 32), (1, 0, 0));
        // 80 ports: 5 leaves of 16 down + 16 up = 80 uplinks → 3 spines: 8 switches.
        assert_eq!(switch_count(80, 32), (8, 5, 80));
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
