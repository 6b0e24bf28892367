//! The management socket's state queries (`controllers_get`,
//! `namespaces_get`): read from the registry on the control path, without
//! touching a reactor.

use crate::state::subsystem::{Controller, Registry};
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;

/// Every live controller: I/O controllers by subsystem, then discovery ones.
pub fn controllers_get(reg: &Registry) -> Value {
    let mut rows = Vec::new();
    for sub in reg.subsystems() {
        let ctrls = crate::sys::lock(&sub.controllers);
        let mut v: Vec<_> = ctrls.values().collect();
        v.sort_by_key(|c| c.cntlid());
        rows.extend(v.into_iter().map(|c| controller(reg, c, &sub.nqn)));
    }
    let disc = crate::sys::lock(reg.discovery_controllers());
    let mut v: Vec<_> = disc.values().collect();
    v.sort_by_key(|c| c.cntlid());
    let nqn = trellis_nvme::fabrics::DISCOVERY_NQN;
    rows.extend(v.into_iter().map(|c| controller(reg, c, nqn)));
    json!({ "controllers": rows })
}

fn controller(reg: &Registry, c: &Controller, subnqn: &str) -> Value {
    let listener = reg
        .listeners()
        .iter()
        .find(|l| l.portid == c.portid())
        .map_or_else(|| "?".to_string(), |l| l.addr.to_string());
    // The admin queue is qid 0; the others are I/O queues.
    let mut qs: Vec<_> = c.queues().iter().map(|(&qid, q)| (qid, *q)).collect();
    qs.sort_unstable_by_key(|q| q.0);
    let queue_rows: Vec<Value> = qs
        .iter()
        .map(|(qid, q)| json!({"qid": qid, "sqsize": q.sqsize, "peer": q.peer.to_string()}))
        .collect();
    let queues = qs.len();
    json!({
        "cntlid": c.cntlid(),
        "host": c.hostnqn(),
        "subsystem": subnqn,
        "listener": listener,
        "discovery": c.is_discovery(),
        "ready": c.ready(),
        "io_queues": queues.saturating_sub(1),
        "io_queues_granted": c.io_queues(),
        "kato_ms": c.kato_ms(),
        "queues": queue_rows,
        "tenant": c.tenant_assigned().map(|t| reg.tenants().name_of(t)),
    })
}

/// Every namespace by subsystem, with its I/O counters (the SMART log's;
/// connections add to them in batches, so they lag by up to a second).
pub fn namespaces_get(reg: &Registry) -> Value {
    let set = reg.ns().load();
    let mut rows = Vec::new();
    for sub in reg.subsystems() {
        for ns in &set.sub(sub.idx).namespaces {
            let s = &ns.stats();
            rows.push(json!({
                "subsystem": sub.nqn,
                "nsid": ns.nsid(),
                "backend": ns.backend().describe(),
                "size_bytes": ns.size_blocks().saturating_mul(ns.block_size() as u64),
                "block_size": ns.block_size(),
                "read_only": ns.read_only(),
                "ana_group": ns.anagrpid(),
                "qos": match ns.qos() {
                    crate::config::qos::QosMode::Off => "off",
                    crate::config::qos::QosMode::Gimbal => "gimbal",
                },
                "read_cmds": s.read_cmds.load(Relaxed),
                "write_cmds": s.write_cmds.load(Relaxed),
                "read_bytes": s.read_bytes.load(Relaxed),
                "write_bytes": s.write_bytes.load(Relaxed),
                "media_errors": s.media_errors.load(Relaxed),
            }));
        }
    }
    json!({ "namespaces": rows })
}

/// Every namespace's drive health, as its SMART log reports it (issue 33):
/// the drive's own figures where the backend has them (`source`:
/// "drive"), else what the node knows ("node": no wear figures), the
/// temperature, power-on hours and unsafe shutdowns, and the failure
/// predictor's verdict (`prediction`: null when no predictor watches it).
pub fn health_get(reg: &Registry) -> Value {
    let set = reg.ns().load();
    let mut rows = Vec::new();
    for sub in reg.subsystems() {
        for ns in &set.sub(sub.idx).namespaces {
            let c = reg.health().counters(&ns.info().nguid);
            let d = ns.backend().drive_smart();
            let temp = ns
                .backend()
                .temperature_k()
                .or(d.map(|d| d.temperature_k).filter(|&t| t != 0))
                .unwrap_or_else(|| reg.node_temperature_k());
            let (prediction, horizon_hours) = match reg.verdicts().get(ns.uid()) {
                Some((v, h)) => (
                    Some(v.name()),
                    (h != trellis_nvme::health::NOT_REPORTED).then_some(h),
                ),
                None => (None, None),
            };
            rows.push(json!({
                "subsystem": sub.nqn,
                "nsid": ns.nsid(),
                "source": if d.is_some() { "drive" } else { "node" },
                "critical_warning": d.map_or(0, |d| d.critical_warning)
                    | reg.verdicts().warning_bits(ns.uid()),
                "prediction": prediction,
                "horizon_hours": horizon_hours,
                "percentage_used": d.map(|d| d.percent_used),
                "available_spare_pct": d.map(|d| d.available_spare_pct),
                "media_errors": d.map_or(0, |d| d.media_errors as u64)
                    .max(ns.stats().media_errors.load(Relaxed)),
                "temperature_k": temp,
                "power_on_hours": c.power_on_hours,
                "unsafe_shutdowns": c.unsafe_shutdowns,
            }));
        }
    }
    json!({ "namespaces": rows })
}
