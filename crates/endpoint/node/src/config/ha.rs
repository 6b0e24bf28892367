//! `[ha]`: the ownership lease's store and timing, with named limits.

use anyhow::ensure;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Lease TTL bounds. etcd raises a TTL below about 1.5 s (its minimum,
/// from the election timeout) without telling the fence, so we start at 2 s.
pub const MIN_LEASE_TTL_MS: u64 = 2_000;
pub const MAX_LEASE_TTL_MS: u64 = 600_000;
/// The least time between the fence and the earliest lease expiry: commands
/// admitted before the fence must finish within it, and it absorbs the
/// difference in clock rate between this node and the store's leader.
pub const MIN_GUARD_MS: u64 = 500;
/// The shortest keepalive interval and store operation timeout.
pub const MIN_KEEPALIVE_MS: u64 = 50;
pub const MIN_OP_TIMEOUT_MS: u64 = 50;
/// Longest key and node name (they go into the store and logs).
pub const MAX_NAME_LEN: usize = 256;
/// The most etcd endpoints.
pub const MAX_ENDPOINTS: usize = 16;

pub(crate) const NO_ETCD: &str = "[ha] store = \"etcd\": this trellis was built without etcd support: rebuild with `--features etcd` (needs protoc: Debian protobuf-compiler), or use store = \"file\"";

/// Which cluster store holds the lease.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// An `flock`ed file (`path`): nodes on one machine, no daemon.
    #[default]
    File,
    /// An etcd cluster (`endpoints`), through etcd-client.
    Etcd,
}

impl StoreKind {
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::File => "file",
            StoreKind::Etcd => "etcd",
        }
    }
}

/// `[ha]`. Absent: no lease; ANA states come from the config and
/// `trellis ctl ana set` alone, as on a single node.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HaConfig {
    pub store: StoreKind,
    /// etcd endpoints ("127.0.0.1:2379" or "http://host:2379").
    pub endpoints: Vec<String>,
    /// The lease's key; both nodes of a pair use the same. Empty: derived
    /// from the first subsystem's NQN at start ("/trellis/ha/NQN").
    pub key: String,
    /// This node's name in the store; the two nodes must differ. Empty:
    /// the node UUID (the state directory's `node-id`).
    pub node: String,
    /// File store: the lock file both nodes open. None: `ha.lock` in the
    /// state directory.
    pub path: Option<PathBuf>,
    /// The lease's time to live: a dead owner's lease ends this long after
    /// its last keepalive reached the store.
    pub lease_ttl_ms: u64,
    /// Time between keepalives (and the standby's campaign period when the
    /// store cannot watch).
    pub keepalive_ms: u64,
    /// Serve only this long after sending the last keepalive the store
    /// confirmed; then go inaccessible (fencing). Below the TTL by at
    /// least `MIN_GUARD_MS`.
    pub fence_ms: u64,
    /// Bound of one store call (connect, grant, keepalive, txn, get).
    pub op_timeout_ms: u64,
}

impl Default for HaConfig {
    fn default() -> HaConfig {
        HaConfig {
            store: StoreKind::File,
            endpoints: Vec::new(),
            key: String::new(),
            node: String::new(),
            path: None,
            lease_ttl_ms: 5_000,
            keepalive_ms: 1_000,
            fence_ms: 3_500,
            op_timeout_ms: 1_000,
        }
    }
}

impl HaConfig {
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }
    pub fn keepalive(&self) -> Duration {
        Duration::from_millis(self.keepalive_ms)
    }
    pub fn fence(&self) -> Duration {
        Duration::from_millis(self.fence_ms)
    }
    pub fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.op_timeout_ms)
    }
    /// TTL - fence: what in-flight commands and clock-rate error may use.
    pub fn guard(&self) -> Duration {
        self.ttl().saturating_sub(self.fence())
    }
    /// After a drain, how long this node leaves the key to the other one
    /// before campaigning again (two TTLs: the other had time to see it).
    pub fn drain_hold(&self) -> Duration {
        self.ttl() * 2
    }

    /// Checks every bound; each error names the value and the fix.
    pub fn validate(&self) -> anyhow::Result<()> {
        let (t, k, f, o) = (
            self.lease_ttl_ms,
            self.keepalive_ms,
            self.fence_ms,
            self.op_timeout_ms,
        );
        ensure!(
            (MIN_LEASE_TTL_MS..=MAX_LEASE_TTL_MS).contains(&t),
            "[ha] lease_ttl_ms = {t}: use {MIN_LEASE_TTL_MS}..={MAX_LEASE_TTL_MS}"
        );
        ensure!(
            k >= MIN_KEEPALIVE_MS,
            "[ha] keepalive_ms = {k}: use at least {MIN_KEEPALIVE_MS}"
        );
        ensure!(
            o >= MIN_OP_TIMEOUT_MS,
            "[ha] op_timeout_ms = {o}: use at least {MIN_OP_TIMEOUT_MS}"
        );
        ensure!(
            f.saturating_add(MIN_GUARD_MS) <= t,
            "[ha] fence_ms = {f}: must be at most lease_ttl_ms - {MIN_GUARD_MS} = {} (commands admitted before the fence finish before the lease can expire)",
            t.saturating_sub(MIN_GUARD_MS)
        );
        ensure!(
            k.saturating_add(o) < f,
            "[ha] fence_ms = {f}: must exceed keepalive_ms + op_timeout_ms = {} (or a healthy owner fences itself between keepalives)",
            k.saturating_add(o)
        );
        ensure!(
            self.key.len() <= MAX_NAME_LEN,
            "[ha] key is {} bytes: use at most {MAX_NAME_LEN}",
            self.key.len()
        );
        ensure!(
            self.node.len() <= MAX_NAME_LEN,
            "[ha] node is {} bytes: use at most {MAX_NAME_LEN}",
            self.node.len()
        );
        self.validate_store()
    }

    fn validate_store(&self) -> anyhow::Result<()> {
        match self.store {
            StoreKind::File => {
                ensure!(
                    self.endpoints.is_empty(),
                    "[ha] endpoints are for store = \"etcd\": remove them or set store = \"etcd\""
                );
                // No default: one in each node's own state directory gave
                // two nodes two lock files, and both owned the lease.
                ensure!(
                    self.path.is_some(),
                    "[ha] store = \"file\" needs a path both nodes share, e.g. path = \"/var/lib/trellis-pair/ha.lock\" (--ha-path): a lock file in each node's own state directory would let both own the lease (nodes on one machine or one shared file system; use store = \"etcd\" otherwise)"
                );
            }
            StoreKind::Etcd => {
                ensure!(cfg!(feature = "etcd"), "{NO_ETCD}");
                ensure!(
                    !self.endpoints.is_empty(),
                    "[ha] store = \"etcd\" needs endpoints, e.g. endpoints = [\"127.0.0.1:2379\"] (--ha-endpoints)"
                );
                ensure!(
                    self.endpoints.len() <= MAX_ENDPOINTS,
                    "[ha] {} endpoints: use at most {MAX_ENDPOINTS}",
                    self.endpoints.len()
                );
                for e in &self.endpoints {
                    ensure!(
                        !e.is_empty() && !e.contains(char::is_whitespace),
                        "[ha] endpoint {e:?}: use HOST:PORT or http://HOST:PORT"
                    );
                }
                ensure!(
                    self.path.is_none(),
                    "[ha] path is for store = \"file\": remove it"
                );
                // etcd leases are whole seconds: a rounded TTL would outrun the fence.
                ensure!(
                    self.lease_ttl_ms.is_multiple_of(1000),
                    "[ha] lease_ttl_ms = {}: etcd leases are whole seconds: use a multiple of 1000",
                    self.lease_ttl_ms
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_each_bound_is_refused_with_its_fix() {
        let ok = || HaConfig {
            path: Some("/run/trellis-pair/ha.lock".into()),
            ..HaConfig::default()
        };
        ok().validate().unwrap();
        // The file store has no default path: each node would have its own.
        let e = HaConfig::default().validate().unwrap_err().to_string();
        assert!(e.contains("needs a path both nodes share"), "{e}");
        let bad = |f: &dyn Fn(&mut HaConfig), want: &str| {
            let mut c = ok();
            f(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        };
        bad(&|c| c.lease_ttl_ms = 100, "lease_ttl_ms = 100: use 2000");
        bad(&|c| c.fence_ms = 4_800, "at most lease_ttl_ms - 500 = 4500");
        bad(
            &|c| c.keepalive_ms = 3_000,
            "must exceed keepalive_ms + op_timeout_ms = 4000",
        );
        bad(&|c| c.keepalive_ms = 0, "keepalive_ms = 0");
        bad(
            &|c| c.endpoints = vec!["x:1".into()],
            "endpoints are for store = \"etcd\"",
        );
        bad(
            &|c| c.store = StoreKind::Etcd,
            if cfg!(feature = "etcd") {
                "needs endpoints"
            } else {
                "built without etcd"
            },
        );
    }
}
