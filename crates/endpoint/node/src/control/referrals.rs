//! Referrals and merged remote entries changed while the target runs
//! (`trellis ctl referral add|remove`, `trellis cdc`): the live mutations
//! of the discovery state (`crate::state::discovery`).

use crate::config::referral::{check_referrals, ReferralConfig};
use crate::state::subsystem::Registry;
use trellis_nvme::log::DiscoveryEntry;

impl Registry {
    /// Adds (`add`) or removes a referral; Err names what is wrong.
    pub fn set_referral(&self, r: ReferralConfig, add: bool) -> anyhow::Result<usize> {
        let mut rs = crate::sys::lock(&self.disc().referrals);
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
        let mut remote = crate::sys::lock(&self.disc().remote);
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
