//! What the discovery controller serves beyond this node's own subsystems,
//! and how hosts learn that the discovery log changed.
//!
//! - **Change notices.** Every change to what a host's discovery log holds
//!   (a subsystem, listener, referral or allowed host added or removed; a
//!   remote node's entries merged or dropped by `trellis cdc`) bumps the
//!   log's generation counter (GENCTR, the Discovery Log Page header,
//!   LID 70h, in NVMe over Fabrics 1.1) and raises the Discovery Log
//!   Page Change notice (NVMe Base 2.0 §5.2.1: type Notice, information
//!   F0h, log page 70h) on every
//!   discovery controller whose host may see the change and enabled it
//!   (Set Features 0Bh bit 31), as Linux nvmet's `nvmet_port_disc_changed`.
//!   The notice is then masked until the host reads log 70h with RAE clear.
//! - **Referrals** (`[[referral]]`, `trellis ctl referral add|remove`):
//!   entries of SUBTYPE 1h ("referral to another discovery service",
//!   the Discovery Log Page Entry's SUBTYPE in NVMe-oF 1.1) naming another
//!   node's discovery controller.
//! - **Remote entries**: what a central discovery controller (`trellis
//!   cdc`) merged from the nodes it follows, listed after our own.

use crate::subsystem::{Registry, Subsystem};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use trellis_nvme::log::{subtype, DiscoveryEntry};

/// Referrals one node may list (config and `ctl referral add` together).
pub const MAX_REFERRALS: usize = 256;

/// Discovery log entries a node may list in all: the host library refuses
/// longer logs (its `MAX_DISCOVERY_ENTRIES`), as a host must bound memory.
pub const MAX_DISCOVERY_ENTRIES: usize = 1024;

/// `[[referral]]`: another node's discovery controller, listed in our
/// discovery log as a referral.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ReferralConfig {
    /// HOST:PORT of the other discovery controller (an IP address: hosts
    /// connect to what the entry says, so it must be routable for them).
    pub addr: SocketAddr,
    /// PORTID of the entry (Discovery Log Page Entry): the other node's port
    /// number for that address. Default: 1.
    #[serde(default = "default_portid")]
    pub portid: u16,
}

fn default_portid() -> u16 {
    1
}

/// Treq of every entry we list: secure channel not required (bits 1:0 =
/// 10b), SQ flow control disable supported (bit 2).
pub const TREQ: u8 = 0x2 | 0x4;

impl ReferralConfig {
    pub fn entry(&self) -> DiscoveryEntry {
        DiscoveryEntry {
            adrfam: if self.addr.is_ipv4() { 1 } else { 2 },
            subtype: subtype::REFERRAL,
            treq: TREQ,
            portid: self.portid,
            trsvcid: self.addr.port().to_string(),
            subnqn: trellis_nvme::fabrics::DISCOVERY_NQN.into(),
            traddr: self.addr.ip().to_string(),
            sectype: trellis_nvme::log::sectype::NONE,
        }
    }
}

/// Checks referrals as the config and `ctl referral add` give them.
pub fn check_referrals(rs: &[ReferralConfig]) -> anyhow::Result<()> {
    anyhow::ensure!(
        rs.len() <= MAX_REFERRALS,
        "{} [[referral]] entries: at most {MAX_REFERRALS} (MAX_REFERRALS)",
        rs.len()
    );
    for (i, r) in rs.iter().enumerate() {
        anyhow::ensure!(
            !r.addr.ip().is_unspecified() && r.addr.port() != 0,
            "referral {} is not an address a host can connect to: give HOST:PORT of the other node's discovery listener",
            r.addr
        );
        anyhow::ensure!(
            !rs[..i].iter().any(|x| x.addr == r.addr),
            "referral {} is listed twice: remove one",
            r.addr
        );
    }
    Ok(())
}

/// The discovery state beyond the registry's subsystems and listeners.
#[derive(Default)]
pub struct DiscoveryState {
    pub referrals: Mutex<Vec<ReferralConfig>>,
    /// Entries a central discovery controller merged, by source (the node's
    /// discovery address), each with the entries it last read there.
    pub remote: Mutex<Vec<(String, Vec<DiscoveryEntry>)>>,
}

impl DiscoveryState {
    pub fn new(referrals: &[ReferralConfig]) -> DiscoveryState {
        DiscoveryState {
            referrals: Mutex::new(referrals.to_vec()),
            remote: Mutex::new(Vec::new()),
        }
    }

    /// Referrals then remote entries, appended to `out` (a host's log).
    /// An entry listed twice (two CDCs following each other, or a node
    /// given twice) is kept once, so merged logs cannot grow in a loop.
    pub fn extend_entries(&self, out: &mut Vec<DiscoveryEntry>) {
        out.extend(crate::lock(&self.referrals).iter().map(|r| r.entry()));
        for (_, es) in crate::lock(&self.remote).iter() {
            out.extend(es.iter().cloned());
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|e| {
            seen.insert((
                e.subtype,
                e.subnqn.clone(),
                e.traddr.clone(),
                e.trsvcid.clone(),
            ))
        });
        out.truncate(MAX_DISCOVERY_ENTRIES);
    }
}

impl Registry {
    /// The discovery log changed for hosts allowed to see `sub` (None:
    /// for every host). Bumps GENCTR and raises the change notice where
    /// enabled and not masked. Returns how many controllers were notified.
    pub fn discovery_changed(&self, sub: Option<&Subsystem>) -> usize {
        self.discovery_genctr.fetch_add(1, Relaxed);
        let mut n = 0;
        for c in crate::lock(&self.discovery_controllers).values() {
            if sub.is_some_and(|s| !s.host_allowed(&c.hostnqn)) {
                continue;
            }
            if c.raise_event(crate::aen::AEN_DISC_CHANGE) {
                n += 1;
            }
        }
        tracing::debug!(notified = n, "discovery log changed");
        n
    }

    /// Adds (`add`) or removes a referral; Err names what is wrong.
    pub fn set_referral(&self, r: ReferralConfig, add: bool) -> anyhow::Result<usize> {
        let mut rs = crate::lock(&self.disc.referrals);
        if add {
            let mut next = rs.clone();
            next.push(r.clone());
            check_referrals(&next)?;
            *rs = next;
        } else {
            let before = rs.len();
            rs.retain(|x| x.addr != r.addr);
            anyhow::ensure!(
                rs.len() < before,
                "no referral to {}: the referrals are {}",
                r.addr,
                addr_list(&rs)
            );
        }
        drop(rs);
        tracing::info!(addr = %r.addr, add, "referral changed");
        Ok(self.discovery_changed(None))
    }

    /// Replaces the remote entries merged from `source` (`trellis cdc`);
    /// an empty list drops the source. Notifies only when they differ.
    pub fn set_remote_entries(&self, source: &str, entries: Vec<DiscoveryEntry>) -> bool {
        let mut remote = crate::lock(&self.disc.remote);
        let i = remote.iter().position(|(s, _)| s == source);
        let changed = match (i, entries.is_empty()) {
            (Some(i), true) => {
                remote.remove(i);
                true
            }
            (Some(i), false) if remote[i].1 != entries => {
                remote[i].1 = entries;
                true
            }
            (None, false) => {
                remote.push((source.to_string(), entries));
                true
            }
            _ => false,
        };
        drop(remote);
        if changed {
            self.discovery_changed(None);
        }
        changed
    }
}

fn addr_list(rs: &[ReferralConfig]) -> String {
    if rs.is_empty() {
        return "none".into();
    }
    let v: Vec<String> = rs.iter().map(|r| r.addr.to_string()).collect();
    v.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_merged_twice_are_listed_once() {
        let d = DiscoveryState::new(&[]);
        let e = ReferralConfig {
            addr: "10.0.0.2:4420".parse().unwrap(),
            portid: 1,
        }
        .entry();
        crate::lock(&d.remote).push(("a".into(), vec![e.clone()]));
        crate::lock(&d.remote).push(("b".into(), vec![e.clone()]));
        let mut out = vec![e.clone()];
        d.extend_entries(&mut out);
        assert_eq!(out, vec![e]);
    }

    #[test]
    fn referral_entry_is_subtype_1_to_the_discovery_nqn() {
        let r = ReferralConfig {
            addr: "10.0.0.2:8009".parse().unwrap(),
            portid: 7,
        };
        let e = r.entry();
        assert_eq!((e.subtype, e.portid, e.adrfam), (1, 7, 1));
        assert_eq!(
            (e.traddr.as_str(), e.trsvcid.as_str()),
            ("10.0.0.2", "8009")
        );
        assert_eq!(e.subnqn, trellis_nvme::fabrics::DISCOVERY_NQN);
        assert!(check_referrals(std::slice::from_ref(&r)).is_ok());
        let e = check_referrals(&[r.clone(), r]).unwrap_err().to_string();
        assert!(e.contains("listed twice"), "{e}");
        let bad = ReferralConfig {
            addr: "0.0.0.0:8009".parse().unwrap(),
            portid: 1,
        };
        assert!(check_referrals(&[bad]).is_err());
    }
}
