//! Fencing at the device (docs/target.md, "HA pair: fencing at the
//! device"): when the shared namespaces' backends can fence (`nvme-tcp`:
//! NVMe reservations on the remote namespace), every node registers its
//! own key on each ([`crate::backend::remote::node_key`]), and a node about
//! to serve holds a Write Exclusive reservation on each, preempting (with
//! abort) the key of whoever held it. From then on the remote device fails
//! the old owner's writes with Reservation Conflict, whatever that node
//! believes: frozen past its lease, partitioned, or with writes already
//! admitted past its own fence.

use super::HaConfig;
use crate::state::subsystem::{Namespace, Registry};
use std::sync::Arc;

/// Every namespace of the node, and whether its backend can fence.
fn namespaces(reg: &Registry) -> Vec<(Arc<Namespace>, bool)> {
    let set = reg.ns().load();
    set.all()
        .map(|n| (n.clone(), n.backend().device_fence().is_some()))
        .collect()
}

/// `[ha] device_fence`: whether this node fences at the device. Unset: when
/// every namespace's backend can; true: required (an error names the
/// namespaces that cannot); false: off.
pub fn enabled(cfg: &HaConfig, reg: &Registry) -> anyhow::Result<bool> {
    let all = namespaces(reg);
    let cannot: Vec<String> = all
        .iter()
        .filter(|(_, can)| !can)
        .map(|(n, _)| n.nsid().to_string())
        .collect();
    let every = !all.is_empty() && cannot.is_empty();
    match cfg.device_fence {
        Some(false) => Ok(false),
        None => Ok(every),
        Some(true) if every => Ok(true),
        Some(true) => anyhow::bail!(
            "[ha] device_fence = true, but the backends of namespaces {} cannot fence \
             (only backend = \"nvme-tcp\" can): use nvme-tcp namespaces or device_fence = false",
            if cannot.is_empty() {
                "(none configured)".to_string()
            } else {
                cannot.join(", ")
            }
        ),
    }
}

/// At start: registers `key` on every namespace that can fence, so a
/// standby is a registrant. Returns what to log: the fenced namespaces, or
/// a failure (not fatal: the claim before serving registers again).
pub fn register_all(reg: &Registry, key: u64) -> String {
    let mut out = Vec::new();
    for (n, _) in namespaces(reg).into_iter().filter(|(_, can)| *can) {
        let Some(f) = n.backend().device_fence() else {
            continue;
        };
        match f.register(key) {
            Ok(()) => out.push(format!("nsid {} registered", n.nsid())),
            Err(e) => out.push(format!("nsid {} not registered yet: {e:#}", n.nsid())),
        }
    }
    out.join(", ")
}

/// Before serving: holds the reservation on every namespace that can
/// fence. Ok: what was done on each; Err: the first that failed, named.
pub fn claim_all(reg: &Registry, key: u64) -> anyhow::Result<String> {
    let mut out = Vec::new();
    for (n, can) in namespaces(reg) {
        let Some(f) = n.backend().device_fence() else {
            // Added at run time on a backend that cannot: said, not hidden.
            debug_assert!(!can);
            out.push(format!("nsid {} not fenced (backend cannot)", n.nsid()));
            continue;
        };
        let did = f
            .claim(key)
            .map_err(|e| anyhow::anyhow!("nsid {}: {e:#}", n.nsid()))?;
        out.push(format!("nsid {} {did}", n.nsid()));
    }
    Ok(out.join(", "))
}
