//! The `ip`/`tc`/`sysctl` commands that build a topology, as data (tested
//! without root; run by `crate::exec`).
//!
//! Switchless routing, per path (the scheme of a source-routed fabric,
//! done with Linux policy routing): every path has its own destination
//! address on the target's `lo`; each node on the path has a rule "from the
//! client to this path address → the table of the port the path leaves by",
//! and each node on the way back "from this path address to the client → the
//! table of the port toward the client". A reply therefore retraces its
//! request's links, and the host picks a path just by the address it
//! connects to, as with any multipath NVMe/TCP target.

use crate::topo::{Kind, Topology, CLIENT_ADDR};

pub type Cmd = Vec<String>;

fn cmd(parts: &[&str]) -> Cmd {
    parts.iter().map(|s| s.to_string()).collect()
}

/// Link rate for `tc tbf`, or unshaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rate {
    pub bits_per_s: u64,
}

/// Parses "1gbit", "500mbit", "100kbit" or "off" (None).
pub fn parse_rate(s: &str) -> Result<Option<Rate>, String> {
    if s == "off" {
        return Ok(None);
    }
    let bits = trellis_units::parse_bit_rate(s).map_err(|e| format!("{e}, or off"))?;
    let bits = Some(bits).filter(|&b| (1_000_000..=100_000_000_000).contains(&b));
    bits.map(|bits_per_s| Some(Rate { bits_per_s }))
        .ok_or_else(|| format!("rate {s:?} is out of range: 1mbit to 100gbit"))
}

impl Rate {
    /// tbf's bucket: 1 ms at the rate, at least 100,000 B, so that one
    /// 64 KiB GSO segment passes whole (below that tbf segments in software).
    pub fn burst_bytes(&self) -> u64 {
        (self.bits_per_s / 8 / 1000).max(100_000)
    }
}

/// Route table of a node's `i`-th device.
pub fn table(i: usize) -> String {
    (100 + i).to_string()
}

/// A node's devices, in a fixed order (their tables follow it).
pub fn devices(t: &Topology, node: &str) -> Vec<String> {
    let mut v: Vec<String> = t
        .links
        .iter()
        .flat_map(|l| [(&l.a, &l.a_dev), (&l.b, &l.b_dev)])
        .filter(|(n, _)| *n == node)
        .map(|(_, d)| d.clone())
        .collect();
    v.sort();
    v
}

fn table_of(t: &Topology, node: &str, dev: &str) -> String {
    let i = devices(t, node).iter().position(|d| d == dev).unwrap_or(0);
    table(i)
}

/// Everything `up` runs, in order: namespaces, links, addresses, shaping,
/// routes. (Targets are started afterwards.)
pub fn up(t: &Topology, rate: Option<Rate>, host_rate: Option<Rate>) -> Vec<Cmd> {
    let mut out = Vec::new();
    namespaces(t, &mut out);
    for l in &t.links {
        let (na, nb) = (Topology::ns(&l.a), Topology::ns(&l.b));
        out.push(cmd(&[
            "ip", "-n", &na, "link", "add", &l.a_dev, "type", "veth", "peer", "name", &l.b_dev,
            "netns", &nb,
        ]));
        for (ns, dev, ip) in [(&na, &l.a_dev, &l.a_ip), (&nb, &l.b_dev, &l.b_ip)] {
            if let Some(ip) = ip {
                out.push(cmd(&[
                    "ip",
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{ip}/30"),
                    "dev",
                    dev,
                ]));
            }
            if t.kind == Kind::Switched && ns.ends_with("tor") {
                out.push(cmd(&["ip", "-n", ns, "link", "set", dev, "master", "br0"]));
            }
            out.push(cmd(&["ip", "-n", ns, "link", "set", dev, "up"]));
            let r = if l.a == "h0" || l.b == "h0" {
                host_rate
            } else {
                rate
            };
            if let Some(r) = r {
                out.push(cmd(&[
                    "tc",
                    "-n",
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    &format!("{}bit", r.bits_per_s),
                    "burst",
                    &r.burst_bytes().to_string(),
                    "latency",
                    "5ms",
                ]));
            }
        }
    }
    addresses(t, &mut out);
    if t.kind == Kind::Torus2d {
        for l in 0..t.links.len() {
            out.extend(link_routes(t, l));
        }
        path_rules(t, &mut out);
    }
    out
}

/// One namespace per node (loopback up, forwarding on, no reverse-path
/// filter), and the ToR's bridge when switched.
fn namespaces(t: &Topology, out: &mut Vec<Cmd>) {
    for n in &t.nodes {
        let ns = Topology::ns(n);
        out.push(cmd(&["ip", "netns", "add", &ns]));
        out.push(cmd(&["ip", "-n", &ns, "link", "set", "lo", "up"]));
        for k in [
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ] {
            out.push(cmd(&["ip", "netns", "exec", &ns, "sysctl", "-qw", k]));
        }
    }
    if t.kind == Kind::Switched {
        let tor = Topology::ns("tor");
        out.push(cmd(&[
            "ip",
            "-n",
            &tor,
            "link",
            "add",
            "br0",
            "type",
            "bridge",
            "stp_state",
            "0",
        ]));
        out.push(cmd(&["ip", "-n", &tor, "link", "set", "br0", "up"]));
    }
}

fn addresses(t: &Topology, out: &mut Vec<Cmd>) {
    for (node, addr) in &t.primary {
        let ns = Topology::ns(node);
        let (a, dev) = match t.kind {
            Kind::Switched => (format!("{addr}/16"), "eth0"),
            Kind::Torus2d => (format!("{addr}/32"), "lo"),
        };
        out.push(cmd(&["ip", "-n", &ns, "addr", "add", &a, "dev", dev]));
    }
    if t.kind == Kind::Torus2d {
        for p in &t.paths {
            let ns = Topology::ns(&p.target);
            out.push(cmd(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/32", p.addr),
                "dev",
                "lo",
            ]));
        }
    }
}

/// The routes that go through link `l` (both ends' per-port tables, and the
/// direct routes between the client and a storage node's primary). The
/// kernel drops them when the link goes down; `link up` adds them again.
pub fn link_routes(t: &Topology, l: usize) -> Vec<Cmd> {
    let mut out = Vec::new();
    let link = &t.links[l];
    for (node, dev, peer) in [
        (&link.a, &link.a_dev, &link.b_ip),
        (&link.b, &link.b_dev, &link.a_ip),
    ] {
        let Some(peer) = peer else { continue };
        let ns = Topology::ns(node);
        let tb = table_of(t, node, dev);
        let mut c = cmd(&[
            "ip", "-n", &ns, "route", "replace", "default", "via", peer, "dev", dev, "table", &tb,
        ]);
        if node == "h0" {
            c.extend(["src".to_string(), CLIENT_ADDR.to_string()]);
        }
        out.push(c);
    }
    // Client <-> storage node primaries over their direct link.
    if link.a == "h0" {
        let st = &link.b;
        let st_addr = t
            .primary
            .iter()
            .find(|(n, _)| n == st)
            .map(|(_, a)| a.clone());
        if let (Some(sa), Some(bip), Some(aip)) = (st_addr, &link.b_ip, &link.a_ip) {
            out.push(cmd(&[
                "ip",
                "-n",
                &Topology::ns("h0"),
                "route",
                "replace",
                &format!("{sa}/32"),
                "via",
                bip,
                "dev",
                &link.a_dev,
                "src",
                CLIENT_ADDR,
            ]));
            out.push(cmd(&[
                "ip",
                "-n",
                &Topology::ns(st),
                "route",
                "replace",
                &format!("{CLIENT_ADDR}/32"),
                "via",
                aip,
                "dev",
                &link.b_dev,
            ]));
        }
    }
    out
}

fn path_rules(t: &Topology, out: &mut Vec<Cmd>) {
    for p in &t.paths {
        let dst = format!("{}/32", p.addr);
        let client = format!("{CLIENT_ADDR}/32");
        for &h in &p.hops {
            let (from, from_dev, to, to_dev) = t.hop_ends(h);
            // Forward: the node the hop leaves sends the path's packets out of it.
            let fwd_tb = table_of(t, from, from_dev);
            let ns = Topology::ns(from);
            if from == "h0" {
                out.push(cmd(&[
                    "ip", "-n", &ns, "rule", "add", "to", &dst, "lookup", &fwd_tb, "pref", "100",
                ]));
            } else {
                out.push(cmd(&[
                    "ip", "-n", &ns, "rule", "add", "from", &client, "to", &dst, "lookup", &fwd_tb,
                    "pref", "100",
                ]));
            }
            // Back: the node the hop arrives at returns replies over it.
            if to != "h0" {
                let back_tb = table_of(t, to, to_dev);
                out.push(cmd(&[
                    "ip",
                    "-n",
                    &Topology::ns(to),
                    "rule",
                    "add",
                    "from",
                    &dst,
                    "to",
                    &client,
                    "lookup",
                    &back_tb,
                    "pref",
                    "100",
                ]));
            }
        }
    }
}

/// `link A B down|up`: both ends of one link.
pub fn link_state(t: &Topology, l: usize, up: bool) -> Vec<Cmd> {
    let link = &t.links[l];
    let state = if up { "up" } else { "down" };
    let mut out = vec![
        cmd(&[
            "ip",
            "-n",
            &Topology::ns(&link.a),
            "link",
            "set",
            &link.a_dev,
            state,
        ]),
        cmd(&[
            "ip",
            "-n",
            &Topology::ns(&link.b),
            "link",
            "set",
            &link.b_dev,
            state,
        ]),
    ];
    if up && t.kind == Kind::Torus2d {
        out.extend(link_routes(t, l));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::{switched, torus2d};

    fn has(cmds: &[Cmd], s: &str) -> bool {
        cmds.iter().any(|c| c.join(" ") == s)
    }

    #[test]
    fn rates_parse_and_bad_ones_say_how() {
        assert_eq!(
            parse_rate("1gbit").unwrap(),
            Some(Rate {
                bits_per_s: 1_000_000_000
            })
        );
        assert_eq!(parse_rate("off").unwrap(), None);
        assert_eq!(parse_rate("1gbit").unwrap().unwrap().burst_bytes(), 125_000);
        assert_eq!(
            parse_rate("100mbit").unwrap().unwrap().burst_bytes(),
            100_000
        );
        assert!(parse_rate("1G").unwrap_err().contains("kbit, mbit or gbit"));
        assert!(parse_rate("0mbit")
            .unwrap_err()
            .contains("1mbit to 100gbit"));
        assert!(parse_rate("1.5gbit").unwrap_err().contains("whole number"));
    }

    #[test]
    fn a_torus_path_is_pinned_at_every_hop_both_ways() {
        let t = torus2d();
        let c = up(&t, parse_rate("1gbit").unwrap(), None);
        // st0's 3-hop path: every forwarding node has its forward rule, and
        // every node after the client its reverse rule.
        let p = t
            .paths
            .iter()
            .find(|p| p.target == "st0" && p.hops.len() == 3)
            .unwrap();
        let dst = format!("{}/32", p.addr);
        let mut rules = 0;
        for &h in &p.hops {
            let (from, _, to, _) = t.hop_ends(h);
            let f = format!("-n {} rule add", Topology::ns(from));
            assert!(
                c.iter()
                    .any(|x| x.join(" ").contains(&f) && x.contains(&dst)),
                "{from}"
            );
            if to != "h0" {
                let b = format!("-n {} rule add from {dst}", Topology::ns(to));
                assert!(c.iter().any(|x| x.join(" ").contains(&b)), "{to}");
            }
            rules += 1;
        }
        assert_eq!(rules, 3);
        // Shaping on both ends of storage links, none on the client's (off).
        assert!(has(
            &c,
            "tc -n tsan-st0 qdisc add dev pE root tbf rate 1000000000bit burst 125000 latency 5ms"
        ));
        assert!(!c
            .iter()
            .any(|x| x[0] == "tc" && x.contains(&"p0".to_string())));
        assert!(has(&c, &format!("ip -n tsan-st0 addr add {dst} dev lo")));
    }

    #[test]
    fn switched_bridges_every_node_and_bringing_a_link_up_restores_its_routes() {
        let t = switched();
        let c = up(&t, None, None);
        assert!(has(&c, "ip -n tsan-tor link set v-st2 master br0"));
        assert!(has(&c, "ip -n tsan-h0 addr add 10.81.2.1/16 dev eth0"));
        let t = torus2d();
        let l = t.links_between("h0", "st1")[0];
        let back = link_state(&t, l, true);
        assert!(back.iter().any(|x| x
            .join(" ")
            .starts_with("ip -n tsan-h0 route replace default via")));
        assert_eq!(link_state(&t, l, false).len(), 2);
    }
}
