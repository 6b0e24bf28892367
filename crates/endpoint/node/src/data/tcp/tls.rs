//! TLS on NVMe/TCP listeners (`secure_channel`; docs/target.md "TLS"):
//! the configured PSKs of `[[subsystem.host]]` and the lookup a TLS
//! handshake makes with the identity the host offers. The record layer and
//! the OpenSSL callbacks are in `trellis-tls`; the reactor moves the bytes.
//!
//! Under `indexing_slicing` and `cast_possible_truncation` (issue 32 item
//! 8).
#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use crate::state::subsystem::Registry;
use std::sync::Arc;
use trellis_nvme::tls_psk::Identity;

/// The TLS PSK for the identity a ClientHello offers, or why there is none
/// (the text goes into the log line of the failed handshake).
///
/// The identity names the host and the subsystem; the subsystem's
/// `[[subsystem.host]]` entry gives the configured key. A host connecting
/// to the discovery subsystem (`nvme discover --tls`) offers the discovery
/// NQN: its key is the first `tls_key` the host has in config order.
pub fn lookup(reg: &Registry, raw: &[u8]) -> Result<(Identity, Vec<u8>), String> {
    let Some(id) = Identity::parse(raw) else {
        return Err(format!(
            "PSK identity {:?} is not an NVMe/TCP identity (NVMe0R01 <hostnqn> <subnqn>)",
            String::from_utf8_lossy(raw.get(..300).unwrap_or(raw))
        ));
    };
    if id.generated {
        return Err(format!(
            "PSK identity {:?} is a generated PSK (secure channel concatenation), which this target does not support",
            id.format()
        ));
    }
    let psk = if id.subnqn == trellis_nvme::fabrics::DISCOVERY_NQN {
        reg.subsystems()
            .iter()
            .find_map(|s| s.tls.get(&id.hostnqn).cloned())
    } else {
        match reg.subsystem(&id.subnqn) {
            None => {
                return Err(format!(
                    "no subsystem {} (PSK identity {:?})",
                    id.subnqn,
                    id.format()
                ))
            }
            Some(s) => s.tls.get(&id.hostnqn).cloned(),
        }
    };
    let Some(p) = psk else {
        return Err(format!(
            "no tls_key for host {} in subsystem {} (PSK identity {:?})",
            id.hostnqn,
            id.subnqn,
            id.format()
        ));
    };
    match p.key.tls_psk(&id, p.derivation) {
        Ok(k) => Ok((id, k)),
        Err(e) => Err(format!("PSK identity {:?}: {e}", id.format())),
    }
}

/// The TLS context of a target: identities resolved against `reg`.
pub fn server_config(
    reg: &Arc<Registry>,
) -> Result<trellis_tls::ServerConfig, trellis_tls::TlsError> {
    // Weak: the reactors own the context; the registry must not be kept
    // alive by it (nor own it: it holds no TLS state).
    let weak = Arc::downgrade(reg);
    trellis_tls::ServerConfig::new(Arc::new(move |raw: &[u8]| match weak.upgrade() {
        Some(reg) => lookup(&reg, raw),
        None => Err("the target is shutting down".into()),
    }))
}
