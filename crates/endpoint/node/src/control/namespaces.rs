//! Changes to a running target that keep every connection: namespaces
//! added and removed (`trellis ctl namespace add|remove`). The set is
//! swapped as a whole (`nsset`); each controller of the subsystem gets the
//! NSID in its Changed Namespace List and a Namespace Attribute Changed
//! notice (NVM Express Base Specification 2.0, §5.2.1 and §5.16.1.5), as
//! Linux nvmet's `nvmet_ns_changed` does, so hosts rescan on their own.

use crate::config::{Config, NamespaceConfig};
use crate::state::nsset::{NsSet, SubNs, MAX_NAMESPACE_UIDS};
use crate::state::subsystem::{open_namespace, Namespace, Registry, Subsystem};
use anyhow::{bail, ensure};

/// What a namespace change did.
/// Hosts one subsystem may list (`host add`).
pub const MAX_ALLOWED_HOSTS: usize = 4096;

pub struct Changed {
    pub nsid: u32,
    /// Controllers that were sent the notice (the others have it masked,
    /// disabled, or will read the log on their own).
    pub notified_controllers: usize,
}

impl Registry {
    /// Opens namespace `n` in `sub` and publishes it. The NSID is `n.nsid`,
    /// else the lowest free one.
    pub fn add_namespace(
        &self,
        sub: &Subsystem,
        mut n: NamespaceConfig,
    ) -> anyhow::Result<Changed> {
        let cur = self.ns().load();
        let nsid = match n.nsid {
            Some(id) => id,
            None => free_nsid(cur.sub(sub.idx), self.nn())?,
        };
        n.nsid = Some(nsid);
        self.check_new(&cur, sub, nsid, &n)?;
        let uid = self.alloc_uid();
        ensure!(
            uid < MAX_NAMESPACE_UIDS,
            "{MAX_NAMESPACE_UIDS} namespaces were added over this target's life (the limit): restart it to add more"
        );
        // Opened outside the set's lock: a large RAM namespace or a file
        // takes a while, and readers of the set need not wait.
        let i = nsid as usize - 1;
        let ns = open_namespace(
            self.node(),
            &sub.nqn,
            i,
            &n,
            uid,
            self.ana(),
            self.limits().max_registrants,
        )?;
        self.ns().update(|cur| {
            // Checked again: another change may have come in meanwhile.
            self.check_new(cur, sub, nsid, &n)?;
            check_unique(cur, &ns)?;
            let mut next = cur.clone();
            if next.by_uid.len() <= uid {
                next.by_uid.resize(uid + 1, None);
            }
            next.by_uid[uid] = Some(ns.clone());
            let mut nss = cur.sub(sub.idx).namespaces.clone();
            nss.push(ns.clone());
            set_sub(&mut next, sub.idx, SubNs::new(nss));
            anyhow::Ok((next, ()))
        })?;
        tracing::info!(subsystem = %sub.nqn, nsid, "namespace added: {}", ns.backend().describe());
        self.health().add(&ns.info().nguid);
        Ok(Changed {
            nsid,
            notified_controllers: notify(sub, nsid),
        })
    }

    /// Unpublishes namespace `nsid` of `sub`. Commands already submitted
    /// finish on it; later ones fail with Invalid Namespace. Its data is
    /// flushed once it is out of the set.
    pub fn remove_namespace(&self, sub: &Subsystem, nsid: u32) -> anyhow::Result<Changed> {
        let ns = self.ns().update(|cur| {
            let sns = cur.sub(sub.idx);
            let Some(ns) = sns.namespace(nsid).cloned() else {
                bail!(
                    "{} has no namespace {nsid}: its NSIDs are {}",
                    sub.nqn,
                    nsid_list(sns)
                );
            };
            let mut next = cur.clone();
            if let Some(slot) = next.by_uid.get_mut(ns.uid()) {
                *slot = None;
            }
            let nss = sns.namespaces.iter().filter(|n| n.nsid() != nsid);
            set_sub(&mut next, sub.idx, SubNs::new(nss.cloned().collect()));
            Ok((next, ns))
        })?;
        match ns.backend().sync_all() {
            // Closed in the health file only once flushed (`state::health`).
            Ok(()) => self.health().remove(&ns.info().nguid),
            Err(e) => {
                tracing::error!(subsystem = %sub.nqn, nsid, "flush of the removed namespace failed: {e}");
            }
        }
        tracing::info!(subsystem = %sub.nqn, nsid, "namespace removed");
        Ok(Changed {
            nsid,
            notified_controllers: notify(sub, nsid),
        })
    }

    /// Grows namespace `nsid` of `sub` to `bytes` (a whole number of its
    /// blocks, larger than now), then tells the hosts as for an add.
    pub fn resize_namespace(
        &self,
        sub: &Subsystem,
        nsid: u32,
        bytes: u64,
    ) -> anyhow::Result<Changed> {
        let set = self.ns().load();
        let sns = set.sub(sub.idx);
        let Some(ns) = sns.namespace(nsid) else {
            bail!(
                "{} has no namespace {nsid}: its NSIDs are {}",
                sub.nqn,
                nsid_list(sns)
            );
        };
        let bs = ns.block_size() as u64;
        let now = ns.size_blocks().saturating_mul(bs);
        ensure!(
            bytes.is_multiple_of(bs),
            "size {bytes} is not a whole number of {bs}-byte blocks: use {} or {}",
            bytes / bs * bs,
            (bytes / bs + 1) * bs
        );
        ensure!(
            bytes > now,
            "size {bytes} is not larger than the namespace's {now} bytes: only growing is supported (shrinking would cut off data hosts wrote)"
        );
        ns.backend().grow(bytes)?;
        ns.grow_to(bytes / bs);
        tracing::info!(subsystem = %sub.nqn, nsid, "namespace grown from {now} to {bytes} bytes");
        Ok(Changed {
            nsid,
            notified_controllers: notify(sub, nsid),
        })
    }

    /// Allows (`allow`) or stops allowing host `host` to connect to `sub`.
    /// Controllers already connected stay (no connection drops); the
    /// discovery log changes, so its generation counter moves. Returns
    /// whether the list changed.
    pub fn set_host_allowed(
        &self,
        sub: &Subsystem,
        host: &str,
        allow: bool,
    ) -> anyhow::Result<bool> {
        ensure!(
            !sub.allow_any,
            "{} allows any host (allow_any_host, or no allowed_hosts in the config): give it allow_any_host = false and an allowed_hosts list in the config to manage hosts live",
            sub.nqn
        );
        crate::config::check_nqn(host)?;
        let mut hosts = crate::sys::lock(&sub.allowed_hosts);
        let changed = if allow {
            ensure!(
                hosts.len() < MAX_ALLOWED_HOSTS || hosts.contains(host),
                "{} already allows {MAX_ALLOWED_HOSTS} hosts (the limit): remove one first",
                sub.nqn
            );
            hosts.insert(host.to_string())
        } else {
            ensure!(
                hosts.len() > 1 || !hosts.contains(host),
                "{host} is the last host {} allows: add another first (a subsystem that allows no host is refused in the config too)",
                sub.nqn
            );
            hosts.remove(host)
        };
        drop(hosts);
        if changed {
            self.discovery_changed(Some(sub));
            tracing::info!(subsystem = %sub.nqn, host, allow, "allowed hosts changed");
        }
        Ok(changed)
    }

    /// The configuration as it is now: the start's, with the listeners,
    /// subsystems, namespaces, hosts, referrals and tenant weights changed since
    /// (`trellis ctl save`).
    pub fn live_config(&self) -> Config {
        let mut c = self.config().clone();
        let set = self.ns().load();
        c.subsystems = self
            .subsystems()
            .iter()
            .filter_map(|s| Some((s.idx, self.subsystems().config_of(s.idx)?.clone())))
            .map(|(i, mut s)| {
                self.live_subsystem(&set, i, &mut s);
                s
            })
            .collect();
        c.referrals = crate::sys::lock(&self.disc().referrals).clone();
        c.listeners = self.listeners().configs();
        c.tenants = self.tenants().configs();
        c
    }

    /// Subsystem `i`'s namespaces and allowed hosts as they are now.
    fn live_subsystem(&self, set: &NsSet, i: usize, s: &mut crate::config::SubsystemConfig) {
        s.namespaces = set
            .sub(i)
            .namespaces
            .iter()
            .map(|n| {
                // The size now (a resize may have grown it).
                let mut c = n.config().clone();
                let bytes = n.size_blocks().saturating_mul(n.block_size() as u64);
                c.size = Some(crate::config::ByteSize(bytes));
                c
            })
            .collect();
        if let Some(sub) = self.subsystems().get(i) {
            let mut hosts: Vec<String> = crate::sys::lock(&sub.allowed_hosts)
                .iter()
                .cloned()
                .collect();
            hosts.sort();
            s.allowed_hosts = hosts;
        }
    }

    /// The checks of a new namespace against the config rules and the
    /// namespaces of `cur`.
    fn check_new(
        &self,
        cur: &NsSet,
        sub: &Subsystem,
        nsid: u32,
        n: &NamespaceConfig,
    ) -> anyhow::Result<()> {
        ensure!(
            (1..=self.nn()).contains(&nsid),
            "nsid {nsid} is outside 1..={} (NN, which hosts read once at connect): pick one in that range",
            self.nn()
        );
        ensure!(
            !self.subsystems().is_removed(sub.idx),
            "subsystem {} was removed",
            sub.nqn
        );
        if cur.sub(sub.idx).namespace(nsid).is_some() {
            bail!(
                "{} already has namespace {nsid}: pick another nsid, or remove it first",
                sub.nqn
            );
        }
        // The config file's rules, on a config holding only this namespace.
        let mut one = Config::embedded_default();
        one.subsystems.truncate(1);
        one.subsystems[0].nqn = sub.nqn.clone();
        one.subsystems[0].namespaces = vec![n.clone()];
        one.validate()?;
        Ok(())
    }
}

/// Identifiers (UUID, NGUID, EUI-64) must be unique in the node: hosts
/// merge namespaces with equal ones. Checked once the namespace is open
/// (derived identifiers are known only then).
pub(crate) fn check_unique(cur: &NsSet, ns: &Namespace) -> anyhow::Result<()> {
    check_unique_among(cur.all(), ns)
}

/// As [`check_unique`], against `others`.
pub(crate) fn check_unique_among<'a>(
    others: impl IntoIterator<Item = &'a std::sync::Arc<Namespace>>,
    ns: &Namespace,
) -> anyhow::Result<()> {
    let hex = crate::sys::hex;
    for o in others {
        for (what, a, b) in [
            ("uuid", hex(&o.info().uuid), hex(&ns.info().uuid)),
            ("nguid", hex(&o.info().nguid), hex(&ns.info().nguid)),
            ("eui64", hex(&o.info().eui64), hex(&ns.info().eui64)),
        ] {
            if a == b {
                bail!("{what} {a} is namespace {}'s already: give another or leave it out to derive one", o.nsid());
            }
        }
    }
    Ok(())
}

pub(crate) fn set_sub(next: &mut NsSet, idx: usize, s: SubNs) {
    if next.subs.len() <= idx {
        next.subs.resize_with(idx + 1, SubNs::default);
    }
    next.subs[idx] = s;
}

/// The lowest NSID in 1..=nn that `s` does not use.
fn free_nsid(s: &SubNs, nn: u32) -> anyhow::Result<u32> {
    (1..=nn)
        .find(|&id| s.namespace(id).is_none())
        .ok_or_else(|| anyhow::anyhow!("every NSID 1..={nn} is in use: remove a namespace first"))
}

fn nsid_list(s: &SubNs) -> String {
    let v: Vec<String> = s.namespaces.iter().map(|n| n.nsid().to_string()).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// Adds `nsid` to every controller's Changed Namespace List and raises the
/// notice where enabled and not masked. Returns how many were notified.
fn notify(sub: &Subsystem, nsid: u32) -> usize {
    let mut n = 0;
    for c in crate::sys::lock(&sub.controllers).values() {
        c.changed_ns().add(nsid);
        if c.raise_event(crate::state::aen::AEN_NS_ATTR) {
            n += 1;
        }
    }
    n
}
