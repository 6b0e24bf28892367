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

use crate::config::referral::{ReferralConfig, MAX_DISCOVERY_ENTRIES};
use crate::state::subsystem::{Registry, Subsystem};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use trellis_nvme::log::DiscoveryEntry;

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
        out.extend(crate::sys::lock(&self.referrals).iter().map(|r| r.entry()));
        for (_, es) in crate::sys::lock(&self.remote).iter() {
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
        for c in crate::sys::lock(&self.discovery_controllers).values() {
            let tls_host = c.tls_proven().then_some(c.hostnqn());
            if sub.is_some_and(|s| !s.admits(c.hostnqn(), tls_host)) {
                continue;
            }
            if c.raise_event(crate::state::aen::AEN_DISC_CHANGE) {
                n += 1;
            }
        }
        tracing::debug!(notified = n, "discovery log changed");
        n
    }
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
        crate::sys::lock(&d.remote).push(("a".into(), vec![e.clone()]));
        crate::sys::lock(&d.remote).push(("b".into(), vec![e.clone()]));
        let mut out = vec![e.clone()];
        d.extend_entries(&mut out);
        assert_eq!(out, vec![e]);
    }
}
