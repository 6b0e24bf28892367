//! The device a fio `filename` names: space-separated `key=value` pairs, as
//! SPDK's fio plugin does (`filename=trtype=tcp traddr=... trsvcid=... ns=1`).
//!
//! ```text
//! filename=traddr=127.0.0.1 trsvcid=4420 subnqn=nqn.2026-11.io.trellis\:default ns=1
//! ```
//!
//! fio splits `filename` at every unescaped `:` (several files), so the colons
//! of an NQN or an IPv6 address are written `\:`; fio removes the backslash
//! before the engine sees the name. The keys follow nvme-cli's and SPDK's
//! names for the same things.

use trellis_host::HostConfig;

/// Subsystem used when `subnqn` is absent: `trellis target`'s default.
pub const DEFAULT_SUBNQN: &str = "nqn.2026-11.io.trellis:default";
/// Host NQN used when `hostnqn` is absent: one fixed name per engine, so the
/// target sees a stable tenant.
pub const DEFAULT_HOSTNQN: &str = "nqn.2026-11.io.trellis:fio";
/// Port used when `trsvcid` is absent: the IANA NVMe/TCP I/O port.
pub const DEFAULT_PORT: u16 = 4420;

/// A parsed `filename`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// host:port, as the host library's connect takes it.
    pub addr: String,
    pub subnqn: String,
    pub hostnqn: String,
    pub nsid: u32,
}

impl Spec {
    /// Parses a `filename`; the error names the bad key or value and the fix.
    pub fn parse(s: &str) -> Result<Spec, String> {
        let (mut traddr, mut port, mut subnqn, mut hostnqn, mut nsid) = (
            None,
            DEFAULT_PORT,
            DEFAULT_SUBNQN.to_string(),
            DEFAULT_HOSTNQN.to_string(),
            1u32,
        );
        for kv in s.split_whitespace() {
            let Some((k, v)) = kv.split_once('=') else {
                return Err(format!(
                    "{kv:?} is not key=value: write e.g. traddr=127.0.0.1"
                ));
            };
            match k {
                "trtype" if v.eq_ignore_ascii_case("tcp") => {}
                "trtype" => return Err(format!("trtype={v}: only tcp is supported")),
                "adrfam" => {} // the address itself says IPv4 or IPv6
                "traddr" => traddr = Some(v.to_string()),
                "trsvcid" => {
                    port = v
                        .parse()
                        .map_err(|_| format!("trsvcid={v} is not a port number: use e.g. trsvcid=4420"))?
                }
                "subnqn" => subnqn = nqn(k, v)?,
                "hostnqn" => hostnqn = nqn(k, v)?,
                "ns" => {
                    nsid = v
                        .parse()
                        .ok()
                        .filter(|&n| n != 0 && n != u32::MAX)
                        .ok_or_else(|| format!("ns={v} is not a namespace ID: use e.g. ns=1"))?
                }
                _ => {
                    return Err(format!(
                        "unknown key {k:?}: use traddr, trsvcid, subnqn, hostnqn, ns (and trtype=tcp, adrfam)"
                    ))
                }
            }
        }
        let traddr = traddr.ok_or("no traddr: write e.g. traddr=127.0.0.1 trsvcid=4420")?;
        let addr = if traddr.contains(':') {
            format!("[{traddr}]:{port}")
        } else {
            format!("{traddr}:{port}")
        };
        Ok(Spec {
            addr,
            subnqn,
            hostnqn,
            nsid,
        })
    }

    /// The host library's settings for this device.
    pub fn host_config(&self) -> HostConfig {
        HostConfig {
            hostid: trellis_host::ctrl::hostid_from(&self.hostnqn),
            hostnqn: self.hostnqn.clone(),
            ..HostConfig::default()
        }
    }
}

/// NQNs are at most 223 bytes (NVMe base specification, "NVMe Qualified Names").
fn nqn(key: &str, v: &str) -> Result<String, String> {
    if v.is_empty() || v.len() > 223 {
        return Err(format!("{key} must be 1 to 223 bytes, got {}", v.len()));
    }
    Ok(v.to_string())
}
