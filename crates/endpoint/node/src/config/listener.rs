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
