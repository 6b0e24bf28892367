//! Target configuration: listeners, subsystems, namespaces and limits, read
//! from TOML (`trellis target --config FILE`) or built from flags.
//!
//! Every bound the daemon enforces lives here with a sane default, so an
//! operator can see and change all of them in one place.

pub mod emulated;
pub mod ha;
pub mod keys;
mod listener;
pub mod qos;
pub mod referral;
mod target;
pub use listener::*;
pub use target::*;

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

pub const DEFAULT_NQN: &str = "nqn.2026-11.io.trellis:default";
/// The largest controller ID (FFEFh; FFF0h and up are reserved).
pub const MAX_CNTLID: u16 = 0xFFEF;
/// Upper bound of `target.max_io_size`.
pub const MAX_IO_SIZE_LIMIT: u64 = 8 << 20;

// Serialize: `to_toml` (what `--check` prints). A new field needs a
// Serialize type here, so --check can never silently leave one out.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub target: TargetConfig,
    #[serde(default, rename = "listener")]
    pub listeners: Vec<ListenerConfig>,
    #[serde(default, rename = "subsystem")]
    pub subsystems: Vec<SubsystemConfig>,
    /// Bounds and parameters of `qos = "gimbal"` namespaces' schedulers.
    #[serde(default, serialize_with = "qos_table")]
    pub qos: crate::config::qos::QosConfig,
    /// Host NQN → tenant name and weight; other hosts are tenants of weight 1.
    #[serde(
        default,
        rename = "tenant",
        serialize_with = "tenant_tables",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tenants: Vec<crate::config::qos::TenantConfig>,
    /// Prometheus `/metrics` endpoint (off unless `listen` is set).
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Management socket (JSON-RPC 2.0; `trellis ctl`), off unless `socket` is set.
    #[serde(default)]
    pub ctl: CtlConfig,
    /// HA pair: the ownership lease (`[ha]`, run by the management plane's
    /// lease thread); absent: no lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ha: Option<crate::config::ha::HaConfig>,
    /// Other nodes' discovery controllers, listed as referrals (SUBTYPE 1h)
    /// in our discovery log.
    #[serde(default, rename = "referral", skip_serializing_if = "Vec::is_empty")]
    pub referrals: Vec<crate::config::referral::ReferralConfig>,
}

/// `[ctl]`: where the management socket (`trellis ctl`) listens.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CtlConfig {
    /// Unix socket path, e.g. "/run/trellis/ctl.sock". None: no socket.
    /// Off by default: no default path is writable by every user, and two
    /// targets on one machine (tests, `trellis san`) would fight over one.
    pub socket: Option<std::path::PathBuf>,
}

/// `[metrics]`: where to serve Prometheus text-format metrics over HTTP.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Address of the HTTP listener serving `GET /metrics` (for example
    /// "127.0.0.1:9464"; port 0 picks a free one). None: no endpoint. A
    /// wildcard address is served with a warning.
    pub listen: Option<std::net::SocketAddr>,
    /// A file holding a bearer token that scrapes must send
    /// (`Authorization: Bearer TOKEN`, Prometheus's `bearer_token_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<std::path::PathBuf>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemConfig {
    pub nqn: String,
    /// Serial number (SN); empty: derived from the node identity and NQN.
    #[serde(default)]
    pub serial: String,
    #[serde(default = "default_model")]
    pub model: String,
    /// Any host may connect (default true when no host list is given).
    pub allow_any_host: Option<bool>,
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Per-host settings (`[[subsystem.host]]`): DH-HMAC-CHAP keys. A host
    /// listed here is allowed, as if in `allowed_hosts`.
    #[serde(default, rename = "host", skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostConfig>,
    #[serde(default, rename = "namespace")]
    pub namespaces: Vec<NamespaceConfig>,
    /// The listeners that carry it, by `name` or IP:PORT (nvmet's
    /// `ports/*/subsystems`). Unset: every I/O listener, or only the TLS
    /// ones if a host of it has only a TLS PSK (docs/target.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listeners: Option<Vec<String>>,
}

impl SubsystemConfig {
    pub fn allow_any(&self) -> bool {
        self.allow_any_host
            .unwrap_or(self.allowed_hosts.is_empty() && self.hosts.is_empty())
    }
}

/// One host of a subsystem (`[[subsystem.host]]`): in-band authentication
/// (DH-HMAC-CHAP, NVMe Base 2.0 §8.13; docs/target.md "Authentication").
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    pub nqn: String,
    /// The host's secret, `DHHC-1:XX:<base64>:` as `nvme gen-dhchap-key`
    /// prints it: the host must prove it knows it before any other command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_secret: Option<crate::config::keys::KeyText>,
    /// The controller's secret: a host that asks (`--dhchap-ctrl-secret`)
    /// gets the controller's proof of it (bidirectional authentication).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrl_secret: Option<crate::config::keys::KeyText>,
    /// Hash functions accepted, preferred first (default all: sha256,
    /// sha384, sha512).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dhchap_hashes: Vec<String>,
    /// DH groups accepted for this host, preferred first: the target picks
    /// the first of these the host offers (default ffdhe2048, ffdhe3072,
    /// ffdhe4096, null: `config::keys::DEFAULT_DHGROUPS`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dhchap_dhgroups: Vec<String>,
    /// The host's configured TLS PSK, `NVMeTLSkey-1:XX:<base64>:` as `nvme
    /// gen-tls-key` prints it: what a TLS listener accepts from this host
    /// for this subsystem (docs/target.md "TLS").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<crate::config::keys::KeyText>,
    /// How the TLS PSK is derived from `tls_key`: "spec" (default; the
    /// NVMe/TCP specification, SPDK, libnvme since 2025) or
    /// "libnvme-compat" (libnvme 1.7 to 1.15, e.g. Debian 13's nvme-cli).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key_derivation: Option<String>,
}

fn default_model() -> String {
    "Trellis".into()
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Discards writes and reads zeroes: for benchmarks.
    Null,
    /// Memory-backed, lost at exit.
    Ram,
    /// A regular file or a block device, through io_uring.
    File,
    /// Data in RAM, each command completed when the SSD timing model
    /// (`trellis-ssd`) says a real drive would (docs/ssd-model.md).
    Emulated,
    /// A namespace of a remote NVMe/TCP subsystem (another Trellis node, a
    /// JBOF), reached through `trellis-host` (`backend::remote`).
    #[serde(rename = "nvme-tcp")]
    NvmeTcp,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    /// Default: position in the list, from 1.
    pub nsid: Option<u32>,
    pub backend: BackendKind,
    /// Size for null/ram; for a file, the size to create it with if missing
    /// (an existing file or device keeps its own size).
    pub size: Option<ByteSize>,
    pub path: Option<String>,
    /// Logical block size: 512 or 4096.
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    #[serde(default)]
    pub read_only: bool,
    /// Traffic control: "off" (default) or "gimbal" (docs/gimbal.md).
    #[serde(default, serialize_with = "qos_mode_name")]
    pub qos: crate::config::qos::QosMode,
    /// Open files with O_DIRECT when the filesystem or device allows it.
    #[serde(default = "yes")]
    pub direct: bool,
    /// Emulated backend only: the SSD model profile (`pm9a3-gen4`,
    /// `nvmevirt-970pro`, `femu`; default pm9a3-gen4).
    #[serde(default)]
    pub profile: Option<String>,
    /// Emulated backend only: `clean` (default) or `fragmented`.
    #[serde(default)]
    pub precondition: Option<String>,
    /// Emulated backend only: every device time is multiplied by this
    /// (≥ 1, default 1), so a slow CPU keeps up with the emulated drive.
    #[serde(default)]
    pub time_scale: Option<f64>,
    /// Emulated backend only: P/E cycles each block erase counts (≥ 1,
    /// default 1), so a test wears the drive out in seconds (issue 33;
    /// docs/ssd-model.md, wear).
    #[serde(default)]
    pub wear_acceleration: Option<u32>,
    /// Emulated backend only: an injected failure (issue 33): `degrade`
    /// (reads need more and more read retries, then fail, then the drive
    /// stops answering) or `silent` (it stops answering at the onset).
    /// Default none. docs/target.md, "Drive health".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    /// Emulated backend only: the fault's onset, days of drive age.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault_onset_days: Option<f64>,
    /// Emulated backend only: `degrade`'s length from the first read retry
    /// to every read failing, days of drive age.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault_ramp_days: Option<f64>,
    /// Emulated backend only: the drive ages this many times faster than
    /// wall time (≥ 1, default 1): its fault schedule and the failure
    /// predictor watching it count drive time, so a test lives a drive's
    /// last month in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_acceleration: Option<f64>,
    /// Namespace UUID (8-4-4-4-12 hex digits); default: derived from the
    /// node identity, subsystem NQN and NSID. Likewise `nguid` (32 hex
    /// digits) and `eui64` (16 hex digits); `-` and `:` separators allowed.
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub nguid: Option<String>,
    #[serde(default)]
    pub eui64: Option<String>,
    /// ANA group (ANAGRPID, ≥ 1); default: the NSID. Namespaces of one
    /// group change ANA state together (docs/target.md "ANA").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ana_group: Option<u32>,
    /// `nvme-tcp` only: the remote subsystem's address ("IP:PORT").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// `nvme-tcp` only: the remote subsystem's NQN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnqn: Option<String>,
    /// `nvme-tcp` only: the remote namespace's NSID (default 1). Not
    /// `nsid`, which is the NSID this node exports it under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_nsid: Option<u32>,
    /// `nvme-tcp` only: the host NQN this node connects with. Default:
    /// derived from `[ha] node`, else from the node UUID, so the two nodes
    /// of a pair are distinct hosts (and registrants) to the remote target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostnqn: Option<String>,
}

/// The `[qos]` table, written from the qos module's fields (its types are
/// read-only there), in the layout `Deserialize` reads.
fn qos_table<S: serde::Serializer>(
    q: &crate::config::qos::QosConfig,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Qos<'a> {
        limits: &'a trellis_qos::sched::SchedLimits,
        device_qd: u32,
        calibrate: &'static str,
        gimbal: &'a trellis_qos::GimbalConfig,
    }
    Qos {
        limits: &q.limits,
        device_qd: q.device_qd,
        calibrate: match q.calibrate {
            crate::config::qos::Calibrate::Auto => "auto",
            crate::config::qos::Calibrate::Off => "off",
        },
        gimbal: &q.gimbal,
    }
    .serialize(s)
}

/// The `[[tenant]]` tables, as [`qos_table`].
fn tenant_tables<S: serde::Serializer>(
    t: &[crate::config::qos::TenantConfig],
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Tenant<'a> {
        host: &'a str,
        name: &'a str,
        weight: u32,
    }
    s.collect_seq(t.iter().map(|t| Tenant {
        host: &t.host,
        name: &t.name,
        weight: t.weight,
    }))
}

fn qos_mode_name<S: serde::Serializer>(
    m: &crate::config::qos::QosMode,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(match m {
        crate::config::qos::QosMode::Off => "off",
        crate::config::qos::QosMode::Gimbal => "gimbal",
    })
}

fn default_block_size() -> u32 {
    512
}
fn yes() -> bool {
    true
}

/// A byte count written as an integer or a string like "1GiB", "512M", "4k".
///
/// Grammar (the `parse-size` crate in binary mode, the same parser
/// `trellis bench` uses): a number, optionally fractional, then an optional
/// unit k, M, G, T, P or E, any case, with or without "B" or "iB"; every unit
/// is a power of 1024, as in fio ("4k" = "4KB" = "4KiB" = 4096).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl std::str::FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_size::Config::new()
            .with_binary()
            .parse_size(s.trim())
            .map(ByteSize)
            .map_err(|e| format!("bad size {s:?}: {e} (use e.g. 4096, 4k, 512M, 1GiB)"))
    }
}

/// Written back as the largest binary unit that divides it ("1GiB", "4KiB"),
/// which [`ByteSize::from_str`] reads back to the same number.
impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let n = self.0;
        for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
            if n >= 1 << shift && n.is_multiple_of(1 << shift) {
                return s.serialize_str(&format!("{}{unit}", n >> shift));
            }
        }
        s.serialize_u64(n)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl Config {
    pub fn from_toml(text: &str) -> anyhow::Result<Config> {
        let c: Config = toml::from_str(text)?;
        c.validate()?;
        Ok(c)
    }

    /// The embedded default: one subsystem with a 1 GiB RAM namespace, I/O on
    /// 127.0.0.1:4420 and discovery on 4420 and 8009.
    pub fn embedded_default() -> Config {
        let c = Config {
            target: TargetConfig::default(),
            listeners: vec![
                ListenerConfig {
                    name: None,
                    addr: std::net::SocketAddr::from(([127, 0, 0, 1], 4420)),
                    kind: None,
                    ana_state: None,
                    secure_channel: None,
                },
                ListenerConfig {
                    name: None,
                    addr: std::net::SocketAddr::from(([127, 0, 0, 1], 8009)),
                    kind: None,
                    ana_state: None,
                    secure_channel: None,
                },
            ],
            subsystems: vec![SubsystemConfig {
                nqn: DEFAULT_NQN.into(),
                serial: String::new(),
                model: default_model(),
                allow_any_host: Some(true),
                allowed_hosts: vec![],
                hosts: vec![],
                namespaces: vec![NamespaceConfig::sized(BackendKind::Ram, 1 << 30)],
                listeners: None,
            }],
            qos: Default::default(),
            tenants: Vec::new(),
            metrics: MetricsConfig::default(),
            ctl: CtlConfig::default(),
            ha: None,
            referrals: Vec::new(),
        };
        // Checked by a unit test; `Target::start` validates again anyway.
        debug_assert!(c.validate().is_ok(), "embedded default is valid");
        c
    }

    /// The configuration as TOML that [`Config::from_toml`] reads back to
    /// the same values (what `trellis target --check` prints).
    pub fn to_toml(&self) -> anyhow::Result<String> {
        Ok(toml::to_string_pretty(self)?)
    }

    /// What starting would find wrong beyond [`Config::validate`], checked
    /// without creating, locking or binding anything: every file namespace
    /// can be opened, or created where it does not exist.
    pub fn preflight(&self) -> anyhow::Result<()> {
        self.preflight_cpus()?;
        for s in &self.subsystems {
            for (i, n) in s.namespaces.iter().enumerate() {
                if n.backend != BackendKind::File {
                    continue;
                }
                let id = n.nsid.unwrap_or(i as u32 + 1);
                let path = n.path.as_deref().unwrap_or_default();
                preflight_file(path, n)
                    .map_err(|e| anyhow::anyhow!("file namespace {id} of {}: {e}", s.nqn))?;
            }
        }
        Ok(())
    }

    /// Every CPU of `target.cpus` exists and this process may run on it:
    /// pinning to another fails, which would leave the reactor unpinned.
    fn preflight_cpus(&self) -> anyhow::Result<()> {
        if self.target.cpus.is_empty() {
            return Ok(());
        }
        let Some(ok) = crate::sys::allowed_cpus() else {
            return Ok(()); // the kernel does not say: pinning will tell
        };
        for &c in &self.target.cpus {
            anyhow::ensure!(
                ok.contains(&c),
                "--cpus / target.cpus: CPU {c} does not exist or this process may not use it (sched_getaffinity): use CPUs {} (e.g. --cpus {})",
                crate::sys::cpu_list(&ok),
                ok[0]
            );
        }
        Ok(())
    }

    /// Whether any `[[subsystem.host]]` has a key (`tls_key`,
    /// `dhchap_secret`, `dhchap_ctrl_secret`).
    pub fn has_keys(&self) -> bool {
        self.subsystems
            .iter()
            .any(|s| crate::config::keys::subsystem_key_texts(s).next().is_some())
    }

    /// Checks every bound and name before anything is opened.
    pub fn validate(&self) -> anyhow::Result<()> {
        use anyhow::{bail, ensure};
        self.target.validate()?;
        self.qos.validate(&self.tenants)?;
        if let Some(ha) = &self.ha {
            ha.validate()?;
        }
        crate::config::referral::check_referrals(&self.referrals)?;
        ensure!(
            !self.listeners.is_empty(),
            "at least one [[listener]] is needed"
        );
        check_listener_names(&self.listeners)?;
        let mut nqns = std::collections::HashSet::new();
        for s in &self.subsystems {
            check_nqn(&s.nqn)?;
            ensure!(
                s.nqn != trellis_nvme::fabrics::DISCOVERY_NQN,
                "the discovery NQN is reserved"
            );
            ensure!(nqns.insert(s.nqn.clone()), "duplicate subsystem {}", s.nqn);
            ensure!(
                s.serial.len() <= 20 && s.serial.bytes().all(|c| c.is_ascii_graphic() || c == b' '),
                "serial {:?} of {} must be at most 20 printable ASCII characters (or leave it out to derive one)",
                s.serial,
                s.nqn
            );
            ensure!(
                s.model.len() <= 40 && s.model.is_ascii(),
                "model of {} must be ≤ 40 ASCII chars",
                s.nqn
            );
            for h in &s.allowed_hosts {
                check_nqn(h)?;
            }
            let mut hosts = std::collections::HashSet::new();
            for h in &s.hosts {
                check_nqn(&h.nqn)?;
                ensure!(
                    hosts.insert(&h.nqn),
                    "subsystem {}: host {} is listed twice in [[subsystem.host]]",
                    s.nqn,
                    h.nqn
                );
                crate::config::keys::host_psk(h)
                    .map_err(|e| anyhow::anyhow!("subsystem {} host {}: {e:#}", s.nqn, h.nqn))?;
                crate::config::keys::host_keys(h)
                    .map_err(|e| anyhow::anyhow!("subsystem {} host {}: {e:#}", s.nqn, h.nqn))?;
            }
            if s.allow_any_host == Some(false) && s.allowed_hosts.is_empty() && s.hosts.is_empty() {
                bail!("subsystem {} allows no host at all", s.nqn);
            }
            validate_namespaces(s)?;
            check_binding(s, &self.listeners)?;
        }
        if self.target.discovery_dhchap {
            crate::config::keys::check_discovery_secrets(&self.subsystems)?;
        }
        self.validate_identities()
    }

    /// Explicit serials and namespace identifiers: well formed, and unique
    /// within the node (hosts merge namespaces with equal identifiers).
    fn validate_identities(&self) -> anyhow::Result<()> {
        use anyhow::bail;
        let mut seen = std::collections::HashMap::new();
        let mut once = |what: String, key: String| -> anyhow::Result<()> {
            if let Some(first) = seen.insert(key.clone(), what.clone()) {
                bail!("{what} repeats {first} ({key}): give each a different value, or leave it out to derive one");
            }
            Ok(())
        };
        for s in &self.subsystems {
            if !s.serial.is_empty() {
                once(
                    format!("serial of {}", s.nqn),
                    format!("serial {:?}", s.serial),
                )?;
            }
            for (i, n) in s.namespaces.iter().enumerate() {
                let at = format!("namespace {} of {}", n.nsid.unwrap_or(i as u32 + 1), s.nqn);
                if let Some(u) = &n.uuid {
                    let id = uuid::Uuid::parse_str(u).ok().filter(|u| !u.is_nil()).ok_or_else(|| {
                        anyhow::anyhow!(
                            "{at}: uuid {u:?} is not a UUID (write 8-4-4-4-12 hex digits, not all zero, or leave it out to derive one)"
                        )
                    })?;
                    once(format!("uuid of {at}"), format!("uuid {id}"))?;
                }
                for (name, v, len) in [("nguid", &n.nguid, 16), ("eui64", &n.eui64, 8)] {
                    let Some(v) = v else { continue };
                    let b = crate::sys::parse_hex_id(v, len).map_err(|why| {
                        anyhow::anyhow!("{at}: {name} {v:?} {why} (or leave it out to derive one)")
                    })?;
                    once(
                        format!("{name} of {at}"),
                        format!("{name} {}", crate::sys::hex(&b)),
                    )?;
                }
            }
        }
        Ok(())
    }
}

impl NamespaceConfig {
    pub fn sized(backend: BackendKind, size_bytes: u64) -> NamespaceConfig {
        NamespaceConfig {
            nsid: None,
            backend,
            size: Some(ByteSize(size_bytes)),
            path: None,
            block_size: 512,
            read_only: false,
            qos: crate::config::qos::QosMode::Off,
            direct: true,
            profile: None,
            precondition: None,
            time_scale: None,
            wear_acceleration: None,
            fault: None,
            fault_onset_days: None,
            fault_ramp_days: None,
            age_acceleration: None,
            uuid: None,
            nguid: None,
            eui64: None,
            ana_group: None,
            addr: None,
            subnqn: None,
            remote_nsid: None,
            hostnqn: None,
        }
    }
}

fn preflight_file(path: &str, n: &NamespaceConfig) -> anyhow::Result<()> {
    use anyhow::{bail, Context};
    let p = std::path::Path::new(path);
    if !p.exists() {
        if n.size.is_none() {
            bail!("{path} does not exist and no size was given to create it: add --file-size SIZE (or `size` in the config), or fix the path");
        }
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        if !dir.is_dir() {
            bail!(
                "cannot create {path}: directory {} does not exist",
                dir.display()
            );
        }
        return Ok(());
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(!n.read_only)
        .open(p)
        .with_context(|| format!("cannot open {path}"))?;
    let meta = f.metadata()?;
    if meta.is_file() && meta.len() < n.block_size as u64 {
        bail!(
            "{path} is {} bytes, smaller than one {}-byte block",
            meta.len(),
            n.block_size
        );
    }
    Ok(())
}

/// A subsystem's namespaces: NSIDs in range and unique, ANA groups, block
/// sizes, sizes and emulated-drive parameters.
fn validate_namespaces(s: &SubsystemConfig) -> anyhow::Result<()> {
    use anyhow::ensure;
    let mut ids = std::collections::HashSet::new();
    for (i, n) in s.namespaces.iter().enumerate() {
        let id = n.nsid.unwrap_or(i as u32 + 1);
        ensure!((1..0xFFFF_FFFE).contains(&id), "nsid {id} out of range");
        ensure!(
            n.ana_group != Some(0),
            "namespace {id} of {}: ana_group 0 is reserved: use 1 or more, or leave it out (the NSID)",
            s.nqn
        );
        ensure!(ids.insert(id), "duplicate nsid {id} in {}", s.nqn);
        ensure!(
            n.block_size == 512 || n.block_size == 4096,
            "namespace {id} of {}: block_size {} is not supported: use 512 or 4096",
            s.nqn,
            n.block_size
        );
        check_ns_size(n, id, &s.nqn)?;
        emulated::EmulatedParams::from_config(n)
            .map_err(|e| anyhow::anyhow!("namespace {id} of {}: {e}", s.nqn))?;
    }
    Ok(())
}

/// A namespace's size: given where needed, at least one block and a whole
/// number of blocks (a file's `size` is what it is created with).
fn check_ns_size(n: &NamespaceConfig, id: u32, nqn: &str) -> anyhow::Result<()> {
    use anyhow::{bail, ensure};
    let bs = n.block_size as u64;
    let what = format!("{} namespace {id} of {nqn}", backend_name(n.backend));
    match (n.backend, n.size) {
        (BackendKind::File, _) => ensure!(
            n.path.is_some(),
            "{what} needs a path (`path = \"...\"`, or --file PATH)"
        ),
        // The size is the remote namespace's (Identify, at open).
        (BackendKind::NvmeTcp, _) => return check_remote(n, &what),
        (_, None) => bail!("{what} needs a size (`size = \"1GiB\"`, or e.g. --ram 1G)"),
        (BackendKind::Null | BackendKind::Ram, _) if n.path.is_some() => bail!(
            "{what}: path applies only to file and emulated namespaces: remove it, or use backend = \"file\""
        ),
        _ => {}
    }
    let Some(ByteSize(size)) = n.size else {
        return Ok(());
    };
    ensure!(
        size >= bs,
        "{what}: size {size} is less than one {bs}-byte block: give at least {bs} bytes, e.g. 64M"
    );
    ensure!(
        size.is_multiple_of(bs),
        "{what}: size {size} is not a whole number of {bs}-byte blocks: use {} or {}",
        size / bs * bs,
        (size / bs + 1) * bs
    );
    Ok(())
}

/// An `nvme-tcp` namespace: where it is, and no keys of other backends.
fn check_remote(n: &NamespaceConfig, what: &str) -> anyhow::Result<()> {
    use anyhow::ensure;
    ensure!(
        n.addr.is_some() && n.subnqn.is_some(),
        "{what} needs addr = \"IP:PORT\" and subnqn = \"nqn...\" (the remote subsystem)"
    );
    if let Some(s) = &n.subnqn {
        check_nqn(s)?;
    }
    if let Some(h) = &n.hostnqn {
        check_nqn(h)?;
    }
    ensure!(
        n.size.is_none() && n.path.is_none(),
        "{what}: size and path do not apply (the remote namespace has its own size): remove them"
    );
    ensure!(
        n.remote_nsid
            .is_none_or(|id| (1..0xFFFF_FFFF).contains(&id)),
        "{what}: remote_nsid must be 1..=FFFFFFFEh"
    );
    Ok(())
}

fn backend_name(b: BackendKind) -> &'static str {
    match b {
        BackendKind::Null => "null",
        BackendKind::Ram => "ram",
        BackendKind::File => "file",
        BackendKind::Emulated => "emulated",
        BackendKind::NvmeTcp => "nvme-tcp",
    }
}

/// NQNs: "nqn." prefix, at most 223 bytes, printable ASCII.
pub fn check_nqn(n: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        n.starts_with("nqn.")
            && n.len() <= trellis_nvme::fabrics::NQN_MAX_LEN
            && n.bytes().all(|c| c.is_ascii_graphic()),
        "bad NQN {n:?}: must start with \"nqn.\", be ≤ 223 printable ASCII bytes"
    );
    Ok(())
}

/// The state directory when none is configured: systemd's
/// `$STATE_DIRECTORY`, else `$XDG_STATE_HOME/trellis`, else
/// `$HOME/.local/state/trellis`, else `/var/lib/trellis`.
pub fn default_state_dir() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = var("STATE_DIRECTORY") {
        // systemd passes a colon-separated list when several are configured.
        let first = d
            .to_string_lossy()
            .split(':')
            .next()
            .unwrap_or("")
            .to_string();
        if !first.is_empty() {
            return PathBuf::from(first);
        }
    }
    // The XDG spec ignores relative paths in these variables.
    if let Some(d) = var("XDG_STATE_HOME").map(PathBuf::from) {
        if d.is_absolute() {
            return d.join("trellis");
        }
    }
    if let Some(h) = var("HOME") {
        return PathBuf::from(h).join(".local/state/trellis");
    }
    PathBuf::from("/var/lib/trellis")
}

/// Default bound on registrants per namespace (`target.max_registrants`).
pub const DEFAULT_MAX_REGISTRANTS: usize = 128;
/// The largest `target.max_registrants` accepted: REGCTL is 16 bits, and
/// a Report of every registrant (64 bytes each) fits in 64 KiB plus header.
pub const MAX_REGISTRANTS_LIMIT: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use trellis_nvme::dhchap::DhGroup;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!("1GiB".parse::<ByteSize>().unwrap().0, 1 << 30);
        assert_eq!("512M".parse::<ByteSize>().unwrap().0, 512 << 20);
        assert_eq!("4096".parse::<ByteSize>().unwrap().0, 4096);
        assert!("12 parsecs".parse::<ByteSize>().is_err());
        // Everything the two former parsers (node and bench) accepted.
        for (text, want) in [
            ("4k", 4096),
            ("4K", 4096),
            ("4kb", 4096),
            ("4KiB", 4096),
            ("128K", 128 << 10),
            ("1m", 1 << 20),
            ("2MB", 2 << 20),
            ("1g", 1 << 30),
            ("1t", 1 << 40),
            ("1TiB", 1 << 40),
            ("512b", 512),
            ("512", 512),
            (" 8k ", 8192),
        ] {
            assert_eq!(text.parse::<ByteSize>().unwrap().0, want, "{text}");
        }
        assert!("99999999999T".parse::<ByteSize>().is_err(), "overflow");
    }

    #[test]
    fn toml_config_reads_listeners_subsystems_namespaces() {
        let c = Config::from_toml(
            r#"
            [target]
            reactors = 2
            [[listener]]
            addr = "127.0.0.1:4420"
            [[listener]]
            addr = "127.0.0.1:8009"
            [[subsystem]]
            nqn = "nqn.2026-11.io.trellis:a"
            allowed_hosts = ["nqn.2014-08.org.nvmexpress:uuid:1"]
            [[subsystem.namespace]]
            backend = "ram"
            size = "64MiB"
            [[subsystem.namespace]]
            backend = "null"
            size = 1073741824
            nsid = 7
            "#,
        )
        .unwrap();
        assert_eq!(c.target.reactors, 2);
        assert_eq!(c.listeners[1].kind(), ListenerKind::Discovery);
        let named = Config::from_toml("[[listener]]\naddr = \"localhost:4420\"\n").unwrap();
        assert!(
            named.listeners[0].addr.ip().is_loopback(),
            "host names resolve"
        );
        assert_eq!(c.listeners[0].kind(), ListenerKind::Both);
        let s = &c.subsystems[0];
        assert!(
            !s.allow_any(),
            "a host list without allow_any_host means only those hosts"
        );
        assert_eq!(s.namespaces[0].size, Some(ByteSize(64 << 20)));
        assert_eq!(s.namespaces[1].nsid, Some(7));
    }

    /// The two zeroing limits (issue 32): defaults as documented, bad
    /// values refused naming the key and the range.
    #[test]
    fn zero_limits_default_and_refuse_out_of_range_values() {
        let base = "[[listener]]\naddr = \"127.0.0.1:1\"\n";
        let c = Config::from_toml(base).unwrap();
        assert_eq!(c.target.zero_chunk.0, 256 << 20);
        assert_eq!(c.target.zero_chunks_in_flight, 4);
        let set = |t: &str| Config::from_toml(&format!("[target]\n{t}\n{base}"));
        let c = set("zero_chunk = \"1GiB\"\nzero_chunks_in_flight = 64").unwrap();
        assert_eq!(
            (c.target.zero_chunk.0, c.target.zero_chunks_in_flight),
            (1 << 30, 64)
        );
        for (bad, want) in [
            (
                "zero_chunk = \"64KiB\"",
                "target.zero_chunk 65536 is out of range",
            ),
            ("zero_chunk = \"2GiB\"", "1MiB..=1GiB"),
            ("zero_chunk = 1050000", "a multiple of 4KiB"),
            (
                "zero_chunks_in_flight = 0",
                "target.zero_chunks_in_flight 0",
            ),
            ("zero_chunks_in_flight = 65", "1..=64"),
        ] {
            let e = format!("{:#}", set(bad).unwrap_err());
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn dhchap_host_keys_are_read_and_bad_ones_named() {
        let base = |host: &str| {
            format!(
                "[[listener]]\naddr = \"127.0.0.1:1\"\n[[subsystem]]\nnqn = \"nqn.2026-11.io.trellis:a\"\n[[subsystem.host]]\nnqn = \"nqn.2014-08.org.nvmexpress:uuid:1\"\n{host}"
            )
        };
        let good = "dhchap_secret = \"DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\"\ndhchap_dhgroups = [\"null\", \"ffdhe3072\"]\n";
        let c = Config::from_toml(&base(good)).unwrap();
        let s = &c.subsystems[0];
        assert!(
            !s.allow_any(),
            "a [[subsystem.host]] list restricts the subsystem"
        );
        let keys = crate::config::keys::subsystem_keys(s).unwrap();
        let k = &keys["nqn.2014-08.org.nvmexpress:uuid:1"];
        assert_eq!(k.dhgroups, [DhGroup::Null, DhGroup::Ffdhe3072]);
        assert_eq!(k.hashes.len(), 3);
        for (bad, want) in [
            ("dhchap_secret = \"DHHC-1:00:AAAA:\"\n", "dhchap_secret: decodes to 3 bytes"),
            ("dhchap_secret = \"secret\"\n", "dhchap_secret: does not start with"),
            (
                "dhchap_secret = \"DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaS:\"\n",
                "CRC-32 does not match",
            ),
            ("dhchap_ctrl_secret = \"DHHC-1:00:AAAA:\"\n", "needs a dhchap_secret"),
            (
                "dhchap_secret = \"DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\"\ndhchap_hashes = [\"md5\"]\n",
                "dhchap_hashes: unknown \"md5\": use sha256, sha384, sha512",
            ),
        ] {
            let e = Config::from_toml(&base(bad)).unwrap_err();
            let msg = format!("{e:#}");
            assert!(msg.contains(want), "{msg}");
            assert!(msg.contains("host nqn.2014-08.org.nvmexpress:uuid:1"), "{msg}");
        }
    }

    /// Keys are per subsystem here, per host in nvmet: with
    /// `discovery_dhchap` a host's discovery controllers take one secret,
    /// so a host NQN with two is refused with a line that names it, both
    /// subsystems and the fix; without it, or with equal secrets, it loads.
    #[test]
    fn discovery_dhchap_refuses_a_host_with_different_secrets() {
        let other = trellis_nvme::dhchap::Secret {
            key: vec![7; 32],
            transform: None,
        }
        .format();
        let toml = |on: bool, second: &str| {
            let sub = |n: &str, k: &str| {
                format!("[[subsystem]]\nnqn = \"nqn.2026-11.io.trellis:{n}\"\n[[subsystem.host]]\nnqn = \"nqn.2014-08.org.nvmexpress:uuid:1\"\ndhchap_secret = \"{k}\"\n")
            };
            format!(
                "[target]\ndiscovery_dhchap = {on}\n[[listener]]\naddr = \"127.0.0.1:1\"\n{}{}",
                sub("a", DHCHAP),
                sub("b", second)
            )
        };
        let e = format!("{:#}", Config::from_toml(&toml(true, &other)).unwrap_err());
        for want in [
            "host nqn.2014-08.org.nvmexpress:uuid:1",
            "subsystems nqn.2026-11.io.trellis:a and nqn.2026-11.io.trellis:b",
            "discovery_dhchap = false",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
        assert!(
            !e.contains(&other) && !e.contains(DHCHAP),
            "no key text: {e}"
        );
        Config::from_toml(&toml(false, &other)).expect("off: per-subsystem keys");
        Config::from_toml(&toml(true, DHCHAP)).expect("on: the same secret");
        assert!(
            !Config::embedded_default().target.discovery_dhchap,
            "off by default"
        );
    }

    const TLS_KEY: &str = "NVMeTLSkey-1:01:Ggh0ZeTr4gtcM5ttLtzjFKTkCEGwn/dvDUPXq4L9i7yv4BH+:";
    const DHCHAP: &str = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

    fn keyed() -> String {
        format!(
            "[[listener]]\naddr = \"127.0.0.1:1\"\n[[subsystem]]\nnqn = \"nqn.2026-11.io.trellis:a\"\n[[subsystem.host]]\nnqn = \"nqn.2014-08.org.nvmexpress:uuid:1\"\ntls_key = \"{TLS_KEY}\"\ndhchap_secret = \"{DHCHAP}\"\ndhchap_ctrl_secret = \"{DHCHAP}\"\n"
        )
    }

    #[test]
    fn keys_are_redacted_in_toml_and_debug_and_the_placeholder_is_refused() {
        let c = Config::from_toml(&keyed()).unwrap();
        assert!(c.has_keys());
        let text = c.to_toml().unwrap();
        let debug = format!("{c:?}");
        for out in [&text, &debug] {
            assert!(
                !out.contains("Ggh0ZeTr4gtc") && !out.contains("AAECAwQF"),
                "{out}"
            );
        }
        assert_eq!(text.matches("\"<redacted>\"").count(), 3, "{text}");
        let e = format!("{:#}", Config::from_toml(&text).unwrap_err());
        assert!(e.contains("<redacted>") && e.contains("--keys-from"), "{e}");
        let h = &c.subsystems[0].hosts[0];
        let fp = h.tls_key.as_ref().unwrap().fingerprint();
        assert!(fp.starts_with("sha256:") && fp.len() == 15, "{fp}");
        assert_ne!(fp, h.dhchap_secret.as_ref().unwrap().fingerprint());
        assert!(!Config::embedded_default().has_keys());
    }

    #[test]
    fn key_types_wipe_themselves_on_drop() {
        // Compiles only while each type holding key material zeroizes on drop.
        fn wipes<T: zeroize::ZeroizeOnDrop>() {}
        wipes::<crate::config::keys::KeyText>();
        wipes::<trellis_nvme::dhchap::Secret>();
        wipes::<trellis_nvme::tls_psk::ConfiguredPsk>();
    }

    #[test]
    fn cpus_the_process_may_not_use_are_refused_by_preflight() {
        let ok = crate::sys::allowed_cpus().unwrap();
        let mut c = Config::embedded_default();
        c.target.cpus = vec![ok[0]];
        c.preflight().unwrap();
        c.target.cpus = vec![ok[0], 100_000];
        let e = c.preflight().unwrap_err().to_string();
        assert!(e.contains("CPU 100000") && e.contains("use CPUs"), "{e}");
        assert_eq!(crate::sys::cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8,9");
    }

    #[test]
    fn invalid_configs_are_refused_with_a_reason() {
        let bad = Config::from_toml(
            "[[listener]]\naddr = \"127.0.0.1:1\"\n[[subsystem]]\nnqn = \"bogus\"\n",
        );
        assert!(bad.unwrap_err().to_string().contains("bad NQN"));
        let bad = Config::from_toml("[[listener]]\naddr = \"4420\"\n");
        assert!(bad.unwrap_err().to_string().contains("HOST:PORT"));
        let bad = Config::from_toml(
            "[target]\nmax_io_size = \"3k\"\n[[listener]]\naddr = \"127.0.0.1:1\"\n",
        );
        assert!(bad.unwrap_err().to_string().contains("max_io_size"));
        assert!(
            Config::from_toml("[target]\nnonsense = 1\n").is_err(),
            "unknown keys are errors"
        );
    }

    fn one_ns(extra: &str) -> anyhow::Result<Config> {
        Config::from_toml(&format!(
            "[[listener]]\naddr = \"127.0.0.1:1\"\n[[subsystem]]\nnqn = \"nqn.x:a\"\n[[subsystem.namespace]]\n{extra}\n"
        ))
    }

    #[test]
    fn an_nvme_tcp_namespace_needs_where_and_refuses_a_size() {
        let e = one_ns("backend = \"nvme-tcp\"").unwrap_err().to_string();
        assert!(e.contains("needs addr = \"IP:PORT\" and subnqn"), "{e}");
        let at = "backend = \"nvme-tcp\"\naddr = \"127.0.0.1:4420\"\nsubnqn = \"nqn.x:jbof\"";
        let c = one_ns(at).unwrap();
        let n = &c.subsystems[0].namespaces[0];
        assert_eq!(n.backend, BackendKind::NvmeTcp);
        assert_eq!(n.remote_nsid, None); // 1 at open
        let e = one_ns(&format!("{at}\nsize = \"1M\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("size and path do not apply"), "{e}");
        let e = one_ns(&format!("{at}\nremote_nsid = 0"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("remote_nsid must be"), "{e}");
        // Round trip through `trellis target --check`'s TOML.
        let back = Config::from_toml(&c.to_toml().unwrap()).unwrap();
        assert_eq!(
            back.subsystems[0].namespaces[0].subnqn.as_deref(),
            Some("nqn.x:jbof")
        );
    }

    #[test]
    fn namespace_sizes_are_whole_blocks_and_errors_say_which_fix() {
        let e = one_ns("backend = \"ram\"\nsize = 1000")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("size 1000 is not a whole number of 512-byte blocks: use 512 or 1024"),
            "{e}"
        );
        let e = one_ns("backend = \"ram\"\nsize = 0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("size 0 is less than one 512-byte block"), "{e}");
        assert!(!e.contains("needs a size"), "a size was given: {e}");
        let e = one_ns("backend = \"null\"").unwrap_err().to_string();
        assert!(e.contains("needs a size"), "{e}");
        let e = one_ns("backend = \"ram\"\nsize = 8192\nblock_size = 1024")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("block_size 1024") && e.contains("512 or 4096"),
            "{e}"
        );
        one_ns("backend = \"ram\"\nsize = \"1M\"\nblock_size = 4096").unwrap();
    }

    #[test]
    fn to_toml_reads_back_to_the_same_config() {
        let mut c = one_ns("backend = \"null\"\nsize = \"3MiB\"\nqos = \"gimbal\"").unwrap();
        c.target.reactors = 3;
        c.target.state_dir = Some("/tmp/x".into());
        c.metrics.listen = Some(([127, 0, 0, 1], 9464).into());
        c.tenants.push(crate::config::qos::TenantConfig {
            host: "nqn.2026-11.io.x:h".into(),
            name: "alice".into(),
            weight: 2,
        });
        let text = c.to_toml().unwrap();
        assert!(text.contains("size = \"3MiB\""), "{text}");
        let back = Config::from_toml(&text).unwrap();
        assert_eq!(back.to_toml().unwrap(), text);
        assert_eq!(back.target.reactors, 3);
        assert_eq!(back.metrics.listen, c.metrics.listen);
        assert_eq!(back.tenants[0].weight, 2);
        assert_eq!(
            back.subsystems[0].namespaces[0].qos,
            crate::config::qos::QosMode::Gimbal
        );
        let d = Config::embedded_default();
        assert_eq!(
            Config::from_toml(&d.to_toml().unwrap())
                .unwrap()
                .to_toml()
                .unwrap(),
            d.to_toml().unwrap()
        );
    }

    #[test]
    fn preflight_finds_files_that_cannot_be_opened_or_created() {
        let missing =
            one_ns("backend = \"file\"\npath = \"/nonexistent/x\"\nsize = \"1M\"").unwrap();
        let e = missing.preflight().unwrap_err().to_string();
        assert!(e.contains("directory /nonexistent does not exist"), "{e}");
        let nosize = one_ns("backend = \"file\"\npath = \"/nonexistent/x\"").unwrap();
        let e = nosize.preflight().unwrap_err().to_string();
        assert!(e.contains("--file-size"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        let ok = one_ns(&format!(
            "backend = \"file\"\npath = {:?}\nsize = \"1M\"",
            p
        ))
        .unwrap();
        ok.preflight().unwrap();
        assert!(!p.exists(), "preflight creates nothing");
    }
}
