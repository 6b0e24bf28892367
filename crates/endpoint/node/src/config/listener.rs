//! `[[listener]]`: an address the node accepts NVMe/TCP on, its kind
//! (I/O or discovery), ANA state and secure-channel requirement.

use super::*;

/// TLS on a listener (`secure_channel`; absent: plain TCP only, and a TLS
/// ClientHello is closed at once).
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SecureChannel {
    /// Every connection must start with a TLS 1.3 handshake (TREQ: required).
    Required,
    /// TLS or plain, as the host starts (TREQ: not required).
    Optional,
}

/// What a listener serves.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ListenerKind {
    /// I/O controllers and the discovery controller.
    Both,
    /// Only the discovery subsystem (the 8009 convention).
    Discovery,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// What a subsystem's `listeners` may call it besides its address
    /// (stable across restarts and live removal and re-adding, unlike the
    /// PORTID, which is its place in the table): 1 to
    /// [`MAX_LISTENER_NAME_LEN`] of `A-Z a-z 0-9 . _ -`, unique.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// HOST:PORT: an IP address, or a host name resolved when the
    /// configuration is read (as `--listen` and `bench --addr`).
    #[serde(deserialize_with = "host_port")]
    pub addr: SocketAddr,
    /// Default: discovery-only on port 8009, both elsewhere.
    pub kind: Option<ListenerKind>,
    /// ANA state of every ANA group reached through this listener at start
    /// ("optimized", "non-optimized", "inaccessible", "persistent-loss";
    /// default optimized). `trellis ctl ana set` changes it while running.
    #[serde(
        default,
        deserialize_with = "ana_state_name",
        serialize_with = "ana_state_write",
        skip_serializing_if = "Option::is_none"
    )]
    pub ana_state: Option<trellis_nvme::ana::AnaState>,
    /// NVMe/TCP TLS 1.3 with a PSK: "required" or "optional"; absent: none
    /// (docs/target.md "TLS").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_channel: Option<SecureChannel>,
}

/// The configurable ANA states: ANA Change is transient, for `trellis ctl` only.
pub const ANA_CONFIG_STATES: &str =
    "\"optimized\", \"non-optimized\", \"inaccessible\" or \"persistent-loss\"";

/// An ANA state by name, as the config and `trellis ctl` write it.
pub fn parse_ana_state(s: &str) -> anyhow::Result<trellis_nvme::ana::AnaState> {
    use trellis_nvme::ana::AnaState;
    match AnaState::from_name(s) {
        Some(AnaState::Change) | None => {
            anyhow::bail!("unknown ANA state {s:?}: use {ANA_CONFIG_STATES}")
        }
        Some(st) => Ok(st),
    }
}

fn ana_state_name<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<trellis_nvme::ana::AnaState>, D::Error> {
    let s = String::deserialize(d)?;
    parse_ana_state(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn ana_state_write<S: serde::Serializer>(
    st: &Option<trellis_nvme::ana::AnaState>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match st {
        Some(st) => s.serialize_str(st.name()),
        None => s.serialize_none(),
    }
}

fn host_port<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let s = String::deserialize(d)?;
    resolve_host_port(&s).map_err(serde::de::Error::custom)
}

/// HOST:PORT to one socket address: an IP literal as is, a host name to its
/// first IPv4 address (else its first address), as `bench --addr` resolves.
pub fn resolve_host_port(s: &str) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    let fix = "use HOST:PORT, e.g. 127.0.0.1:4420, [::1]:4420 or localhost:4420";
    let addrs: Vec<_> = s
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("address {s:?}: {e}: {fix}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| anyhow::anyhow!("address {s:?}: the name has no address: {fix}"))
}

impl ListenerConfig {
    pub fn kind(&self) -> ListenerKind {
        self.kind.unwrap_or(if self.addr.port() == 8009 {
            ListenerKind::Discovery
        } else {
            ListenerKind::Both
        })
    }
}

/// The longest listener `name`.
pub const MAX_LISTENER_NAME_LEN: usize = 64;

/// Whether `entry` of a subsystem's `listeners` names the listener called
/// `name` at `addr`: its name, or its address written as IP:PORT.
pub fn answers_to(name: Option<&str>, addr: SocketAddr, entry: &str) -> bool {
    name == Some(entry) || entry.parse::<SocketAddr>().is_ok_and(|a| a == addr)
}

/// Listener names: well formed, never an address (so an entry of
/// `listeners` means one thing), and unique.
pub(crate) fn check_listener_names(ls: &[ListenerConfig]) -> anyhow::Result<()> {
    let mut seen = std::collections::HashSet::new();
    for n in ls.iter().filter_map(|l| l.name.as_deref()) {
        anyhow::ensure!(
            (1..=MAX_LISTENER_NAME_LEN).contains(&n.len())
                && n.bytes().all(|b| b.is_ascii_alphanumeric() || b".-_".contains(&b))
                && n.parse::<SocketAddr>().is_err(),
            "listener name {n:?}: use 1 to {MAX_LISTENER_NAME_LEN} of A-Z a-z 0-9 . _ - (not an address)"
        );
        anyhow::ensure!(
            seen.insert(n),
            "listener name {n:?} is given twice: give each [[listener]] its own"
        );
    }
    Ok(())
}

/// The I/O listeners of `ls` that carry subsystem `s`, by index, and
/// whether that set came from the default rule (docs/target.md
/// "Listeners of a subsystem"). Refuses an entry of `s.listeners` that
/// names no listener, or names a discovery-only one.
pub fn carrying_listeners(
    s: &SubsystemConfig,
    ls: &[ListenerConfig],
) -> anyhow::Result<Vec<usize>> {
    let io = |i: &usize| ls[*i].kind() == ListenerKind::Both;
    let Some(names) = &s.listeners else {
        let tls_only = psk_only_host(s).is_some();
        return Ok((0..ls.len())
            .filter(io)
            .filter(|&i| !tls_only || ls[i].secure_channel.is_some())
            .collect());
    };
    anyhow::ensure!(
        !names.is_empty(),
        "subsystem {}: listeners = [] carries it nowhere: name a [[listener]], or leave listeners out for the default",
        s.nqn
    );
    let mut out = Vec::new();
    for e in names {
        let hit: Vec<usize> = (0..ls.len())
            .filter(|&i| answers_to(ls[i].name.as_deref(), ls[i].addr, e))
            .collect();
        if hit.is_empty() {
            let known: Vec<String> = ls
                .iter()
                .map(|l| l.name.clone().unwrap_or_else(|| l.addr.to_string()))
                .collect();
            anyhow::bail!(
                "subsystem {}: listeners entry {e:?} names no [[listener]] (by name or IP:PORT): use one of {}, or add that listener",
                s.nqn,
                known.join(", ")
            );
        }
        anyhow::ensure!(
            hit.iter().all(io),
            "subsystem {}: listeners entry {e:?} is a discovery-only listener (kind = \"discovery\"), which carries no I/O subsystem: name an I/O listener",
            s.nqn
        );
        out.extend(hit);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// A host of `s` whose only credential is a TLS PSK (`tls_key` without
/// `dhchap_secret`): such a host can prove itself only over TLS.
pub fn psk_only_host(s: &SubsystemConfig) -> Option<&str> {
    s.hosts
        .iter()
        .find(|h| h.tls_key.is_some() && h.dhchap_secret.is_none())
        .map(|h| h.nqn.as_str())
}

/// Whether every host `s` admits is PSK-only: then only a TLS listener
/// can serve it at all.
fn only_psk_hosts(s: &SubsystemConfig) -> bool {
    let psk_only = |n: &str| {
        s.hosts
            .iter()
            .any(|h| h.nqn == n && h.tls_key.is_some() && h.dhchap_secret.is_none())
    };
    !s.allow_any()
        && s.hosts.iter().all(|h| psk_only(&h.nqn))
        && s.allowed_hosts.iter().all(|n| psk_only(n))
        && !s.hosts.is_empty()
}

/// Subsystem `s`'s listeners among `ls`: every entry names an I/O
/// listener, and a subsystem with a PSK-only host is carried by at least
/// one TLS listener where the default rule or its hosts require it.
pub fn check_binding(s: &SubsystemConfig, ls: &[ListenerConfig]) -> anyhow::Result<()> {
    let carried = carrying_listeners(s, ls)?;
    let secure = carried.iter().any(|&i| ls[i].secure_channel.is_some());
    if s.listeners.is_none() {
        if let Some(h) = psk_only_host(s).filter(|_| carried.is_empty()) {
            anyhow::bail!(
                "subsystem {}: host {h} has only a TLS PSK, so by default only TLS listeners carry the subsystem, and no I/O [[listener]] has secure_channel: add secure_channel = \"required\" to one, or name the listeners in listeners = [...]",
                s.nqn
            );
        }
    } else if only_psk_hosts(s) && !secure {
        anyhow::bail!(
            "subsystem {}: every host of it has only a TLS PSK, and listeners = {:?} names no listener with secure_channel: name a TLS listener (or give the hosts a dhchap_secret)",
            s.nqn,
            s.listeners.as_deref().unwrap_or_default()
        );
    }
    Ok(())
}
