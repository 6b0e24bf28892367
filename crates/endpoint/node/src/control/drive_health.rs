//! Watches every namespace's drive health (`Backend::drive_smart`: the
//! emulated drive's wear model, an NVMe drive's own SMART page) and acts
//! when a SMART critical warning bit changes: one log line per change, and
//! a SMART / Health asynchronous event (spare below threshold, reliability
//! degraded, read only) to every controller of the namespace's subsystem
//! that enabled it (issue 33; NVMe Base 2.0 §5.2.1).
//!
//! Runs on the health thread (`server.rs`), every [`DRIVE_CHECK_INTERVAL_MS`].

use crate::state::aen::{AEN_SMART_READ_ONLY, AEN_SMART_RELIABILITY, AEN_SMART_SPARE};
use crate::state::subsystem::Registry;
use std::collections::HashMap;

/// How often the drives' critical warnings are looked at.
pub const DRIVE_CHECK_INTERVAL_MS: u64 = 1_000;

/// The warnings last seen, per namespace uid.
#[derive(Default)]
pub struct DriveWatch {
    last: HashMap<usize, u8>,
}

/// What the critical warning bits mean (SMART / Health log, byte 0).
fn meaning(bits: u8) -> String {
    let names = [
        (0x01, "available spare below threshold"),
        (0x02, "temperature past a threshold"),
        (0x04, "reliability degraded (media errors or worn out)"),
        (0x08, "read only"),
        (0x10, "volatile memory backup failed"),
    ];
    let v: Vec<&str> = names
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

impl DriveWatch {
    /// One look at every namespace; returns how many events were raised.
    pub fn check(&mut self, reg: &Registry) -> usize {
        reg.refresh_health();
        let set = reg.ns().load();
        let mut raised = 0;
        for sub in reg.subsystems() {
            for ns in &set.sub(sub.idx).namespaces {
                let now = ns.backend().drive_smart().map_or(0, |s| s.critical_warning);
                let was = self.last.insert(ns.uid(), now).unwrap_or(0);
                if now == was {
                    continue;
                }
                let new = now & !was;
                if new != 0 {
                    tracing::warn!(subsystem = %sub.nqn, nsid = ns.nsid(), critical_warning = now, "drive health: {} (was: {})", meaning(now), meaning(was));
                } else {
                    tracing::info!(subsystem = %sub.nqn, nsid = ns.nsid(), critical_warning = now, "drive health: {} (cleared: {})", meaning(now), meaning(was & !now));
                }
                for (bit, event) in [
                    (0x01, AEN_SMART_SPARE),
                    (0x04, AEN_SMART_RELIABILITY),
                    (0x08, AEN_SMART_READ_ONLY),
                ] {
                    if new & bit == 0 {
                        continue;
                    }
                    for c in crate::sys::lock(&sub.controllers).values() {
                        raised += usize::from(c.raise_event(event));
                    }
                }
            }
        }
        // Namespaces removed live: forget them (uids are never reused).
        if self.last.len() > set.all().count() {
            let live: std::collections::HashSet<usize> = set.all().map(|n| n.uid()).collect();
            self.last.retain(|u, _| live.contains(u));
        }
        raised
    }
}

#[cfg(test)]
mod tests {
    use super::meaning;

    #[test]
    fn warning_bits_are_named() {
        assert_eq!(meaning(0), "none");
        assert_eq!(meaning(0x09), "available spare below threshold, read only");
    }
}
