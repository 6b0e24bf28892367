//! Management socket methods that change what the discovery log lists:
//!
//! - `subsystem_add {nqn, serial?, model?, allow_any_host?, allowed_hosts?,
//!   namespace?}`: the keys of a `[[subsystem]]` table (`namespace` a list
//!   of `[[subsystem.namespace]]` tables); result `subsystem`,
//!   `namespaces`, `notified_controllers`;
//! - `subsystem_remove {nqn, force?}`: refused while controllers are
//!   connected unless `force`, which tears them down; result `subsystem`,
//!   `torn_down_controllers`, `notified_controllers`;
//! - `referral_add {addr, portid?}`, `referral_remove {addr}`: referral
//!   entries to other nodes' discovery controllers; result `referral`,
//!   `notified_controllers`.
//!
//! - `listener_add {addr, kind?}` (kind "both" or "discovery"; default as
//!   in the config: discovery on port 8009) and `listener_remove {addr}`:
//!   result `listener` (the address bound), `notified_controllers`.
//!
//! Each bumps the discovery log's GENCTR and raises the Discovery Log Page
//! Change notice (`discovery`). Errors are messages naming the value and
//! the fix; the socket answers them with -32602.

use crate::config::referral::ReferralConfig;
use crate::control::rpc::{invalid, Method};
use crate::state::subsystem::Registry;
use serde_json::{json, Value};

/// The methods of this file, as rows of the management socket's one table.
pub const METHODS: &[Method] = &[
    Method {
        name: "subsystem_add",
        run: |c, p| subsystem_add(&c.reg, p).map_err(invalid),
    },
    Method {
        name: "subsystem_remove",
        run: |c, p| subsystem_remove(&c.reg, p).map_err(invalid),
    },
    Method {
        name: "referral_add",
        run: |c, p| referral(&c.reg, p, true).map_err(invalid),
    },
    Method {
        name: "referral_remove",
        run: |c, p| referral(&c.reg, p, false).map_err(invalid),
    },
    Method {
        name: "listener_add",
        run: |c, p| listener_add(&c.reg, p, c.ha().is_some()).map_err(invalid),
    },
    Method {
        name: "listener_remove",
        run: |c, p| listener_remove(&c.reg, p).map_err(invalid),
    },
];

fn subsystem_add(reg: &Registry, p: &Value) -> Result<Value, String> {
    let c: crate::config::SubsystemConfig = serde_json::from_value(p.clone()).map_err(|e| {
        format!("bad subsystem: {e}: give the keys of a [[subsystem]] table, e.g. {{\"nqn\":\"nqn.2026-11.io.trellis:two\"}}")
    })?;
    let nqn = c.nqn.clone();
    let namespaces = c.namespaces.len();
    let n = reg.add_subsystem(c).map_err(|e| format!("{e:#}"))?;
    Ok(json!({"subsystem": nqn, "namespaces": namespaces, "notified_controllers": n}))
}

fn subsystem_remove(reg: &Registry, p: &Value) -> Result<Value, String> {
    let Some(nqn) = p.get("nqn").and_then(Value::as_str) else {
        return Err("missing \"nqn\": give the subsystem's NQN".into());
    };
    let force = match p.get("force") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(format!("bad \"force\" {v}: give true or false")),
    };
    let r = reg
        .remove_subsystem(nqn, force)
        .map_err(|e| format!("{e:#}"))?;
    Ok(json!({
        "subsystem": nqn,
        "torn_down_controllers": r.torn_down,
        "notified_controllers": r.notified_controllers,
    }))
}

fn referral(reg: &Registry, p: &Value, add: bool) -> Result<Value, String> {
    let addr = p.get("addr").and_then(Value::as_str);
    let Some(addr) = addr.and_then(|a| a.parse().ok()) else {
        return Err(format!(
            "bad \"addr\" {}: give the other node's discovery listener as IP:PORT, e.g. \"10.0.0.2:8009\"",
            p.get("addr").map_or("(missing)".to_string(), Value::to_string)
        ));
    };
    let portid = match p.get("portid") {
        None | Some(Value::Null) => 1,
        Some(v) => v
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| format!("bad \"portid\" {v}: give a number in 0..=65535"))?,
    };
    let r = ReferralConfig { addr, portid };
    let n = reg.set_referral(r, add).map_err(|e| format!("{e:#}"))?;
    Ok(json!({"referral": addr.to_string(), "notified_controllers": n}))
}

fn addr_param(p: &Value) -> Result<std::net::SocketAddr, String> {
    let a = p.get("addr").and_then(Value::as_str);
    a.and_then(|a| a.parse().ok()).ok_or_else(|| {
        format!(
            "bad \"addr\" {}: give IP:PORT, e.g. \"127.0.0.1:4421\"",
            p.get("addr")
                .map_or("(missing)".to_string(), Value::to_string)
        )
    })
}

fn listener_add(reg: &Registry, p: &Value, in_ha_pair: bool) -> Result<Value, String> {
    let addr = addr_param(p)?;
    let kind = crate::control::listeners::kind_param(p.get("kind").and_then(Value::as_str))
        .map_err(|e| format!("{e:#}"))?;
    let ana_state = match p.get("ana_state").and_then(Value::as_str) {
        Some(s) => Some(crate::config::parse_ana_state(s).map_err(|e| format!("{e:#}"))?),
        None => None,
    };
    // A value that is not a string (true, 1) is refused too, not taken as plain.
    let secure_channel = match p.get("secure_channel").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => match v.as_str() {
            Some("required") => Some(crate::config::SecureChannel::Required),
            Some("optional") => Some(crate::config::SecureChannel::Optional),
            _ => {
                return Err(format!(
                    "secure_channel {v}: use \"required\" or \"optional\" (or leave it out for plain TCP)"
                ))
            }
        },
    };
    let name = match p.get("name").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => Some(
            v.as_str()
                .ok_or_else(|| format!("name {v}: give a string, e.g. \"tls-a\""))?
                .to_string(),
        ),
    };
    let c = crate::config::ListenerConfig {
        name,
        addr,
        kind,
        ana_state,
        secure_channel,
    };
    let (bound, n) = reg
        .add_listener(c, in_ha_pair)
        .map_err(|e| format!("{e:#}"))?;
    Ok(json!({"listener": bound.to_string(), "notified_controllers": n}))
}

fn listener_remove(reg: &Registry, p: &Value) -> Result<Value, String> {
    let addr = addr_param(p)?;
    let n = reg.remove_listener(addr).map_err(|e| format!("{e:#}"))?;
    Ok(json!({"listener": addr.to_string(), "notified_controllers": n}))
}
