//! Key material of `[[subsystem.host]]`, parsed and checked once: the
//! DH-HMAC-CHAP secrets and groups, and the TLS PSK.

use crate::config::HostConfig;
use std::collections::HashMap;
use std::sync::Arc;
use trellis_nvme::dhchap::{DhGroup, HashId, Secret};
use trellis_nvme::tls_psk::{ConfiguredPsk, Derivation};

/// What `--check`, `config_get` (`trellis ctl save`) and every `{:?}` show
/// in place of a key's text.
pub const REDACTED: &str = "<redacted>";

/// A key's text as configured (`dhchap_secret`, `dhchap_ctrl_secret`,
/// `tls_key`). It never leaves the process through the config: `Debug` and
/// `Serialize` write [`REDACTED`] (so `--check`, `config_get` and log lines
/// of a config cannot hold it), and the text is wiped from memory when the
/// value is dropped. [`KeyText::expose`] is the only way to the text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KeyText(zeroize::Zeroizing<String>);

impl KeyText {
    pub fn new(text: impl Into<String>) -> KeyText {
        KeyText(zeroize::Zeroizing::new(text.into()))
    }

    /// The key's text: for parsing it, and for `ctl save` to write it back.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `sha256:` and the first 8 hex digits of SHA-256 of the text: tells
    /// two keys apart (and which one a node has) without revealing either;
    /// 32 bits of a hash say nothing useful about a 256-bit key.
    pub fn fingerprint(&self) -> String {
        use sha2::Digest;
        let d = sha2::Sha256::digest(self.0.as_bytes());
        format!("sha256:{}", crate::sys::hex(&d[..4]))
    }

    /// Whether this is the placeholder `--check` and `config_get` write.
    pub fn is_redacted(&self) -> bool {
        self.0.trim() == REDACTED
    }
}

impl zeroize::ZeroizeOnDrop for KeyText {}

impl From<&str> for KeyText {
    fn from(s: &str) -> KeyText {
        KeyText::new(s)
    }
}

impl From<String> for KeyText {
    fn from(s: String) -> KeyText {
        KeyText::new(s)
    }
}

impl std::fmt::Debug for KeyText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

impl serde::Serialize for KeyText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(REDACTED)
    }
}

impl<'de> serde::Deserialize<'de> for KeyText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<KeyText, D::Error> {
        String::deserialize(d).map(KeyText::new)
    }
}

/// The text of key `name`, refusing the placeholder with what to do.
fn key_text<'a>(t: &'a KeyText, name: &str) -> anyhow::Result<&'a str> {
    anyhow::ensure!(
        !t.is_redacted(),
        "{name} is {REDACTED:?} (how --check and ctl save's source show a key): write the key itself, or save with `trellis ctl save --keys-from FILE`"
    );
    Ok(t.expose())
}

/// Every key a subsystem's hosts have: (host NQN, key name, text).
pub fn subsystem_key_texts(
    c: &crate::config::SubsystemConfig,
) -> impl Iterator<Item = (&str, &'static str, &KeyText)> {
    c.hosts.iter().flat_map(|h| {
        [
            ("dhchap_secret", &h.dhchap_secret),
            ("dhchap_ctrl_secret", &h.dhchap_ctrl_secret),
            ("tls_key", &h.tls_key),
        ]
        .into_iter()
        .filter_map(move |(name, k)| k.as_ref().map(|k| (h.nqn.as_str(), name, k)))
    })
}

/// A config file that holds keys must be its owner's alone, as ssh wants
/// of a private key: refused, naming the path and the fix, when its group
/// or others have any access (`meta`: the opened file's).
pub fn check_file_mode(path: &str, meta: &std::fs::Metadata) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o777;
    anyhow::ensure!(
        mode & 0o077 == 0,
        "{path} holds keys (tls_key, dhchap_secret) but its mode {mode:03o} lets its group or others at them: chmod 600 {path}"
    );
    Ok(())
}

/// A host's DH-HMAC-CHAP configuration in one subsystem.
#[derive(Clone, Debug)]
pub struct HostKeys {
    /// The host's secret (it proves itself with it).
    pub secret: Secret,
    /// The controller's secret, for bidirectional authentication.
    pub ctrl_secret: Option<Secret>,
    /// Hash functions the controller accepts, most preferred first.
    pub hashes: Vec<HashId>,
    /// DH groups the controller accepts, most preferred first.
    pub dhgroups: Vec<DhGroup>,
}

impl HostKeys {
    /// The default preferences: SHA-256 first (every host has it), and a DH
    /// exchange before the NULL group so a recorded exchange does not
    /// suffice to attack the secret offline.
    pub fn new(secret: Secret, ctrl_secret: Option<Secret>) -> HostKeys {
        HostKeys {
            secret,
            ctrl_secret,
            hashes: HashId::ALL.to_vec(),
            dhgroups: DEFAULT_DHGROUPS.to_vec(),
        }
    }
}

/// The keys of a `[[subsystem.host]]` entry; None when it has no secret.
/// Errors name the key and the fix (the caller adds subsystem and host).
pub fn host_keys(h: &crate::config::HostConfig) -> anyhow::Result<Option<HostKeys>> {
    use anyhow::{bail, Context};
    let Some(text) = &h.dhchap_secret else {
        if h.dhchap_ctrl_secret.is_some() {
            bail!("dhchap_ctrl_secret needs a dhchap_secret too (the host authenticates first)");
        }
        return Ok(None);
    };
    let secret = Secret::parse(key_text(text, "dhchap_secret")?).context("dhchap_secret")?;
    let ctrl_secret = match &h.dhchap_ctrl_secret {
        Some(t) => {
            Some(Secret::parse(key_text(t, "dhchap_ctrl_secret")?).context("dhchap_ctrl_secret")?)
        }
        None => None,
    };
    let mut keys = HostKeys::new(secret, ctrl_secret);
    if !h.dhchap_hashes.is_empty() {
        keys.hashes = names(
            &h.dhchap_hashes,
            "dhchap_hashes",
            "sha256, sha384, sha512",
            HashId::from_name,
        )?;
    }
    if !h.dhchap_dhgroups.is_empty() {
        keys.dhgroups = names(
            &h.dhchap_dhgroups,
            "dhchap_dhgroups",
            "null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192",
            DhGroup::from_name,
        )?;
    }
    Ok(Some(keys))
}

fn names<T>(
    v: &[String],
    key: &str,
    valid: &str,
    f: fn(&str) -> Option<T>,
) -> anyhow::Result<Vec<T>> {
    v.iter()
        .map(|n| f(n).ok_or_else(|| anyhow::anyhow!("{key}: unknown {n:?}: use {valid}")))
        .collect()
}

/// The authentication keys of every host of a subsystem that has some.
pub fn subsystem_keys(
    c: &crate::config::SubsystemConfig,
) -> anyhow::Result<std::collections::HashMap<String, Arc<HostKeys>>> {
    let mut m = std::collections::HashMap::new();
    for h in &c.hosts {
        if let Some(k) = host_keys(h)
            .map_err(|e| anyhow::anyhow!("subsystem {} host {}: {e:#}", c.nqn, h.nqn))?
        {
            m.insert(h.nqn.clone(), Arc::new(k));
        }
    }
    Ok(m)
}

/// With `target.discovery_dhchap`, a host's discovery controllers take
/// its keys from the first subsystem that has them
/// (`Registry::discovery_keys`): a host NQN whose `dhchap_secret` or
/// `dhchap_ctrl_secret` differs between subsystems would authenticate
/// discovery with whichever comes first, so it is refused, naming the
/// host, the two subsystems and the fix. nvmet keeps one secret per host.
pub fn check_discovery_secrets<'a>(
    subs: impl IntoIterator<Item = &'a crate::config::SubsystemConfig>,
) -> anyhow::Result<()> {
    let mut seen: HashMap<&str, (&str, &HostConfig)> = HashMap::new();
    for s in subs {
        for h in s.hosts.iter().filter(|h| h.dhchap_secret.is_some()) {
            let Some((first, f)) = seen.get(h.nqn.as_str()) else {
                seen.insert(&h.nqn, (&s.nqn, h));
                continue;
            };
            anyhow::ensure!(
                f.dhchap_secret == h.dhchap_secret && f.dhchap_ctrl_secret == h.dhchap_ctrl_secret,
                "host {} has different DH-HMAC-CHAP secrets in subsystems {first} and {}, and target.discovery_dhchap = true authenticates its discovery controllers with one: give the host the same dhchap_secret (and dhchap_ctrl_secret) in every subsystem, one secret per host as nvmet keeps them, or set discovery_dhchap = false",
                h.nqn,
                s.nqn
            );
        }
    }
    Ok(())
}

/// The DH groups of a host without `dhchap_dhgroups`, preferred first.
/// Not ffdhe6144 and ffdhe8192: with the 512-bit exponent, an
/// exponentiation costs about the square of the prime's size (ffdhe8192
/// about 4 times ffdhe4096: docs/target.md "Cost"), paid by the node for
/// every transaction a peer claiming the host's NQN starts (issue 32); a
/// host that needs them gets them by naming them. NULL last, for hosts
/// that offer nothing else.
pub const DEFAULT_DHGROUPS: [DhGroup; 4] = [
    DhGroup::Ffdhe2048,
    DhGroup::Ffdhe3072,
    DhGroup::Ffdhe4096,
    DhGroup::Null,
];

/// A host's configured PSK for one subsystem.
#[derive(Clone, Debug)]
pub struct HostPsk {
    pub key: ConfiguredPsk,
    pub derivation: Derivation,
}

/// The host's `tls_key` (None without one), or a one-line error naming the
/// key and what is wrong.
pub fn host_psk(h: &HostConfig) -> anyhow::Result<Option<HostPsk>> {
    let derivation = match h.tls_key_derivation.as_deref() {
        None => Derivation::Spec,
        Some(s) => Derivation::from_name(s).ok_or_else(|| {
            anyhow::anyhow!(
                "tls_key_derivation {s:?}: use \"spec\" (the NVMe/TCP specification) or \"libnvme-compat\" (nvme-cli with libnvme 1.7 to 1.15)"
            )
        })?,
    };
    let Some(text) = &h.tls_key else {
        anyhow::ensure!(
            h.tls_key_derivation.is_none(),
            "tls_key_derivation needs a tls_key"
        );
        return Ok(None);
    };
    let key = ConfiguredPsk::parse(key_text(text, "tls_key")?)
        .map_err(|e| anyhow::anyhow!("tls_key: {e}"))?;
    Ok(Some(HostPsk { key, derivation }))
}

/// Every host's PSK of a subsystem, by host NQN.
pub fn subsystem_psks(
    c: &crate::config::SubsystemConfig,
) -> anyhow::Result<HashMap<String, HostPsk>> {
    let mut m = HashMap::new();
    for h in &c.hosts {
        let k = host_psk(h)
            .map_err(|e| anyhow::anyhow!("subsystem {} host {}: {e:#}", c.nqn, h.nqn))?;
        if let Some(k) = k {
            m.insert(h.nqn.clone(), k);
        }
    }
    Ok(m)
}
