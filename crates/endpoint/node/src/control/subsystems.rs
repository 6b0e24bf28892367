//! Subsystems added and removed while the target runs (`trellis ctl
//! subsystem add|remove`), with no connection to another subsystem dropped.
//!
//! The registry's subsystems are an append-only table: a slot, once
//! filled, is never moved or refilled, so code holding `&Arc<Subsystem>`
//! from it (Connect, the discovery log, metrics) needs no lock, and the
//! slot index is the subsystem's `idx` into every `NsSet` for its life. A
//! removed subsystem's slot is marked removed and skipped by every lookup;
//! slots are not reused, like namespace uids, so the table bounds the
//! subsystems added over a target's life ([`MAX_SUBSYSTEMS_ADDED`]).
//!
//! Removal with hosts connected: refused unless `force`, which tears their
//! controllers down (every queue of theirs closes within 100 ms), as Linux
//! nvmet tears down the controllers of a subsystem unlinked from a port
//! (`nvmet_port_del_ctrls`). Either way hosts allowed to see it get a
//! Discovery Log Page Change notice.

use crate::config::{Config, SubsystemConfig};
use crate::state::nsset::{SubNs, MAX_NAMESPACE_UIDS};
use crate::state::subsystem::{open_namespace, Registry, Subsystem};
use crate::state::subsystems::MAX_SUBSYSTEMS_ADDED;
use anyhow::{bail, ensure};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// What a subsystem removal did.
pub struct Removed {
    /// Controllers torn down (`force`).
    pub torn_down: usize,
    pub notified_controllers: usize,
}

impl Registry {
    /// Adds subsystem `c` (a `[[subsystem]]` table, namespaces included)
    /// and tells discovery hosts allowed to see it. Returns its notified
    /// discovery controllers.
    pub fn add_subsystem(&self, c: SubsystemConfig) -> anyhow::Result<usize> {
        let mut one = Config::embedded_default();
        // Its `listeners` must name listeners this target has now.
        one.listeners = self.listeners().configs();
        one.subsystems = vec![c.clone()];
        one.validate()?;
        let t = &self.subsystems();
        let _g = crate::sys::lock(&t.change);
        ensure!(
            self.subsystem(&c.nqn).is_none(),
            "subsystem {} exists: pick another NQN, or remove it first",
            c.nqn
        );
        self.check_discovery_secrets(&c)?;
        let serial = self.node().serial(&c);
        if let Some(o) = t.iter().find(|s| s.serial == serial) {
            bail!("serial {serial} is {}'s already: give another", o.nqn);
        }
        let idx = t.len.load(Ordering::Acquire);
        ensure!(
            idx < t.slots.len(),
            "{MAX_SUBSYSTEMS_ADDED} subsystems were added over this target's life (the limit, MAX_SUBSYSTEMS_ADDED): restart it to add more"
        );
        let nss = self.open_all(&c)?;
        self.ns().update(|cur| {
            let mut next = cur.clone();
            for (k, ns) in nss.iter().enumerate() {
                crate::control::namespaces::check_unique(cur, ns)?;
                crate::control::namespaces::check_unique_among(&nss[..k], ns)?;
                if next.by_uid.len() <= ns.uid() {
                    next.by_uid.resize(ns.uid() + 1, None);
                }
                next.by_uid[ns.uid()] = Some(ns.clone());
            }
            crate::control::namespaces::set_sub(&mut next, idx, SubNs::new(nss.clone()));
            anyhow::Ok((next, ()))
        })?;
        let sub = Arc::new(Subsystem {
            nqn: c.nqn.clone(),
            serial,
            model: c.model.clone(),
            allow_any: c.allow_any(),
            allowed_hosts: Mutex::new(c.allowed_hosts.iter().cloned().collect()),
            idx,
            controllers: Mutex::new(HashMap::new()),
            dhchap: crate::config::keys::subsystem_keys(&c)?,
            tls: crate::config::keys::subsystem_psks(&c)?,
            listeners: c.listeners.clone(),
            psk_only_host: crate::config::psk_only_host(&c).is_some(),
        });
        let _ = t.slots[idx].sub.set(sub.clone());
        let _ = t.slots[idx].config.set(c);
        t.len.store(idx + 1, Ordering::Release);
        tracing::info!(subsystem = %sub.nqn, namespaces = nss.len(), "subsystem added");
        Ok(self.discovery_changed(Some(&sub)))
    }

    /// With `target.discovery_dhchap`, `c`'s host secrets must match those
    /// the live subsystems give the same hosts (as `Config::validate`
    /// checks at start). Called under the table's change lock.
    fn check_discovery_secrets(&self, c: &SubsystemConfig) -> anyhow::Result<()> {
        if !self.limits().discovery_dhchap {
            return Ok(());
        }
        let t = self.subsystems();
        let live = t.iter().filter_map(|s| t.config_of(s.idx));
        crate::config::keys::check_discovery_secrets(live.chain([c]))
    }

    /// Opens every namespace of `c` under fresh uids, checking NSIDs.
    fn open_all(
        &self,
        c: &SubsystemConfig,
    ) -> anyhow::Result<Vec<Arc<crate::state::subsystem::Namespace>>> {
        let mut nss = Vec::new();
        for (i, n) in c.namespaces.iter().enumerate() {
            let nsid = n.nsid.unwrap_or(i as u32 + 1);
            ensure!(
                (1..=self.nn()).contains(&nsid),
                "nsid {nsid} is outside 1..={} (NN, which hosts read once at connect): pick one in that range",
                self.nn()
            );
            let uid = self.alloc_uid();
            ensure!(
                uid < MAX_NAMESPACE_UIDS,
                "{MAX_NAMESPACE_UIDS} namespaces were added over this target's life (the limit): restart it to add more"
            );
            nss.push(open_namespace(
                self.node(),
                &c.nqn,
                i,
                n,
                uid,
                self.ana(),
                self.limits().max_registrants,
            )?);
        }
        Ok(nss)
    }

    /// Removes subsystem `nqn`. With controllers connected: refused, or
    /// with `force` they are torn down. Its namespaces leave the set (their
    /// data flushed); hosts allowed to see it get the discovery notice.
    pub fn remove_subsystem(&self, nqn: &str, force: bool) -> anyhow::Result<Removed> {
        let t = &self.subsystems();
        let _g = crate::sys::lock(&t.change);
        let Some(sub) = self.subsystem(nqn).cloned() else {
            let v: Vec<&str> = t.iter().map(|s| s.nqn.as_str()).collect();
            bail!(
                "unknown subsystem {nqn:?}: the subsystems are {}",
                v.join(", ")
            );
        };
        let torn_down = {
            // Under the controllers lock, which Connect takes to add one
            // and where it checks `is_removed`: no controller slips in.
            let ctrls = crate::sys::lock(&sub.controllers);
            ensure!(
                ctrls.is_empty() || force,
                "{nqn} has {} connected controller(s) (trellis ctl get controllers): disconnect the hosts, or give --force to tear them down",
                ctrls.len()
            );
            t.slots[sub.idx].removed.store(true, Ordering::Release);
            for c in ctrls.values() {
                c.kill("its subsystem was removed (trellis ctl subsystem remove --force)");
            }
            ctrls.len()
        };
        let gone = self.ns().update(|cur| {
            let mut next = cur.clone();
            let nss = cur.sub(sub.idx).namespaces.clone();
            for ns in &nss {
                if let Some(slot) = next.by_uid.get_mut(ns.uid()) {
                    *slot = None;
                }
            }
            crate::control::namespaces::set_sub(&mut next, sub.idx, SubNs::default());
            anyhow::Ok((next, nss))
        })?;
        for ns in gone {
            if let Err(e) = ns.backend().sync_all() {
                tracing::error!(subsystem = %nqn, nsid = ns.nsid(), "flush of a removed namespace failed: {e}");
            }
        }
        tracing::info!(subsystem = %nqn, torn_down, "subsystem removed");
        Ok(Removed {
            torn_down,
            notified_controllers: self.discovery_changed(Some(&sub)),
        })
    }
}
