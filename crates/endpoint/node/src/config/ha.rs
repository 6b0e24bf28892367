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

/// Which cluster store holds the lease.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// An `flock`ed file (`path`): nodes on one machine, no daemon.
    #[default]
    File,
    /// An etcd cluster (`endpoints`), through its JSON gateway.
    Etcd,
}

/// When a drive's failure predictor (issue 33, `control::drive_health`)
/// hands ownership to the other node: `drive_failover`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DriveFailover {
    /// Never: the node serves whatever its drives say.
    Off,
    /// When a drive stops answering through this node (an I/O path
    /// failure; the other node's path may still reach it).
    #[default]
    Failed,
    /// Also when a drive is predicted to fail: the other node serves while
    /// this one's path or drive is looked at.
    Predicted,
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
    /// etcd endpoints ("127.0.0.1:2379", "http://host:2379" or
    /// "https://host:2379"; without a scheme, https when a TLS option is set).
    pub endpoints: Vec<String>,
    /// etcd over TLS: the CA that signed etcd's server certificate (PEM).
    /// None: the system's trusted roots (for https endpoints).
    pub etcd_ca_file: Option<PathBuf>,
    /// etcd's `--client-cert-auth`: this node's certificate (PEM), with
    /// `etcd_key_file` (PEM; mode 0600, refused when group or others may read it).
    pub etcd_cert_file: Option<PathBuf>,
    pub etcd_key_file: Option<PathBuf>,
    /// etcd auth: the user, with its password in `etcd_password_file`
    /// (first line; mode 0600, refused when group or others may read it).
    pub etcd_user: Option<String>,
    pub etcd_password_file: Option<PathBuf>,
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
    /// Fencing at the device (docs/target.md, "HA pair: fencing at the
    /// device"): the owner holds a Write Exclusive reservation on every
    /// shared namespace and a new owner preempts the old one's key before it
    /// serves. None (default): on when every namespace's backend can do it
    /// (`nvme-tcp`); true: required (start fails otherwise); false: off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_fence: Option<bool>,
    /// Hand ownership over (as `trellis ctl drain` does) when a drive
    /// stops answering (`failed`, the default), also when one is predicted
    /// to fail (`predicted`), or never (`off`). docs/target.md, "Drive health".
    pub drive_failover: DriveFailover,
}

impl Default for HaConfig {
    fn default() -> HaConfig {
        HaConfig {
            store: StoreKind::File,
            endpoints: Vec::new(),
            etcd_ca_file: None,
            etcd_cert_file: None,
            etcd_key_file: None,
            etcd_user: None,
            etcd_password_file: None,
            key: String::new(),
            node: String::new(),
            path: None,
            lease_ttl_ms: 5_000,
            keepalive_ms: 1_000,
            fence_ms: 3_500,
            op_timeout_ms: 1_000,
            device_fence: None,
            drive_failover: DriveFailover::default(),
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

    fn has_etcd_options(&self) -> bool {
        self.etcd_ca_file.is_some()
            || self.etcd_cert_file.is_some()
            || self.etcd_key_file.is_some()
            || self.etcd_user.is_some()
            || self.etcd_password_file.is_some()
    }

    /// The TLS and auth options come in pairs.
    fn validate_etcd_security(&self) -> anyhow::Result<()> {
        ensure!(
            self.etcd_cert_file.is_some() == self.etcd_key_file.is_some(),
            "[ha] etcd_cert_file and etcd_key_file go together: set both (a client certificate) or neither"
        );
        ensure!(
            self.etcd_user.is_some() == self.etcd_password_file.is_some(),
            "[ha] etcd_user and etcd_password_file go together: set both or neither"
        );
        if let Some(u) = &self.etcd_user {
            ensure!(
                !u.is_empty() && u.len() <= MAX_NAME_LEN,
                "[ha] etcd_user is {} bytes: use 1..={MAX_NAME_LEN}",
                u.len()
            );
        }
        Ok(())
    }

    fn validate_store(&self) -> anyhow::Result<()> {
        match self.store {
            StoreKind::File => {
                ensure!(
                    self.endpoints.is_empty(),
                    "[ha] endpoints are for store = \"etcd\": remove them or set store = \"etcd\""
                );
                ensure!(
                    !self.has_etcd_options(),
                    "[ha] etcd_* options are for store = \"etcd\": remove them or set store = \"etcd\""
                );
                // No default: one in each node's own state directory gave
                // two nodes two lock files, and both owned the lease.
                ensure!(
                    self.path.is_some(),
                    "[ha] store = \"file\" needs a path both nodes share, e.g. path = \"/var/lib/trellis-pair/ha.lock\" (--ha-path): a lock file in each node's own state directory would let both own the lease (nodes on one machine or one shared file system; use store = \"etcd\" otherwise)"
                );
            }
            StoreKind::Etcd => {
                ensure!(
                    !self.endpoints.is_empty(),
                    "[ha] store = \"etcd\" needs endpoints, e.g. endpoints = [\"127.0.0.1:2379\"] (--ha-endpoints)"
                );
                ensure!(
                    self.endpoints.len() <= MAX_ENDPOINTS,
                    "[ha] {} endpoints: use at most {MAX_ENDPOINTS}",
                    self.endpoints.len()
                );
                let tls = self.etcd_ca_file.is_some() || self.etcd_cert_file.is_some();
                for e in &self.endpoints {
                    ensure!(
                        !e.is_empty() && !e.contains(char::is_whitespace),
                        "[ha] endpoint {e:?}: use HOST:PORT, http://HOST:PORT or https://HOST:PORT"
                    );
                    if let Some((scheme, _)) = e.split_once("://") {
                        ensure!(
                            scheme == "http" || scheme == "https",
                            "[ha] endpoint {e:?}: use http:// or https://"
                        );
                        ensure!(
                            !(tls && scheme == "http"),
                            "[ha] endpoint {e:?} is plain http but etcd_ca_file or etcd_cert_file is set: use https://"
                        );
                    }
                }
                self.validate_etcd_security()?;
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
        bad(&|c| c.store = StoreKind::Etcd, "needs endpoints");
        bad(
            &|c| c.etcd_user = Some("trellis".into()),
            "etcd_* options are for store = \"etcd\"",
        );
        let etcd = |f: &dyn Fn(&mut HaConfig), want: &str| {
            bad(
                &|c| {
                    c.store = StoreKind::Etcd;
                    c.path = None;
                    c.endpoints = vec!["127.0.0.1:2379".into()];
                    f(c)
                },
                want,
            )
        };
        etcd(
            &|c| c.etcd_user = Some("trellis".into()),
            "etcd_user and etcd_password_file go together",
        );
        etcd(
            &|c| c.etcd_key_file = Some("/k".into()),
            "etcd_cert_file and etcd_key_file go together",
        );
        etcd(
            &|c| {
                c.etcd_ca_file = Some("/ca".into());
                c.endpoints = vec!["http://e:2379".into()];
            },
            "is plain http but etcd_ca_file",
        );
        etcd(
            &|c| c.endpoints = vec!["grpc://e:2379".into()],
            "use http:// or https://",
        );
    }
}
