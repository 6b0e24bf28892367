//! `trellis target`: flags for the common cases, `--config` for the rest.

use anyhow::Context;
use clap::Args;
use trellis_node::config::{
    resolve_host_port, BackendKind, ByteSize, Config, ListenerConfig, NamespaceConfig,
    SecureChannel, DEFAULT_NQN,
};

#[derive(Args, Debug)]
pub struct TargetArgs {
    /// TOML configuration file (see README "Configuration").
    #[arg(long, short = 'c')]
    config: Option<String>,
    /// Listen address HOST:PORT (repeatable), e.g. 127.0.0.1:4420 or
    /// localhost:4420; replaces the configured listeners, keeping their
    /// secure_channel (refused when they differ in it). Port 8009 serves
    /// discovery only, any other port I/O and discovery.
    #[arg(long, value_name = "HOST:PORT")]
    listen: Vec<String>,
    /// Subsystem NQN for namespaces given by flags (with --config, only
    /// together with a namespace flag).
    #[arg(long, default_value = DEFAULT_NQN)]
    nqn: String,
    /// Add a RAM namespace of this size (repeatable), e.g. 1G: a whole number
    /// of blocks. Without any namespace flag or --config: one 1 GiB RAM namespace.
    #[arg(long)]
    ram: Vec<ByteSize>,
    /// Add a null namespace of this size (repeatable): discards writes, reads zeroes.
    #[arg(long)]
    null: Vec<ByteSize>,
    /// Add a file or block-device namespace (repeatable).
    #[arg(long)]
    file: Vec<String>,
    /// Size to create --file paths with when they do not exist.
    #[arg(long, requires = "file")]
    file_size: Option<ByteSize>,
    /// Add an emulated SSD namespace of this size (repeatable): data in RAM,
    /// completions at the SSD model's time (docs/ssd-model.md).
    #[arg(long)]
    emulated: Vec<ByteSize>,
    /// SSD profile of --emulated namespaces: pm9a3-gen4 (default),
    /// nvmevirt-970pro or femu.
    #[arg(long, requires = "emulated")]
    profile: Option<String>,
    /// Precondition of --emulated namespaces: clean (default) or fragmented.
    #[arg(long, requires = "emulated")]
    precondition: Option<String>,
    /// Multiply every device time of --emulated namespaces (≥ 1, default 1).
    #[arg(long, requires = "emulated")]
    time_scale: Option<f64>,
    /// Logical block size of namespaces given by flags: 512 (default) or 4096.
    #[arg(long, value_parser = parse_block_size)]
    block_size: Option<u32>,
    /// Only these host NQNs may connect (repeatable) to the subsystem the
    /// flags describe; default: any host. With --config, only together with
    /// a namespace flag (the file's subsystems keep their own host lists).
    #[arg(long)]
    allow_host: Vec<String>,
    /// Reactor threads, 1 to 256 (default 1, or [target] reactors).
    #[arg(long)]
    reactors: Option<usize>,
    /// CPUs to pin reactors to, e.g. 0,1: each one this process may run on
    /// (sched_getaffinity, `taskset -pc $$`), else refused.
    #[arg(long, value_delimiter = ',')]
    cpus: Vec<usize>,
    /// Socket engine: epoll (syscalls, the default) or uring (io_uring).
    #[arg(long)]
    engine: Option<trellis_node::config::SocketEngine>,
    /// Directory of the node identity file (node-id). Default: [target]
    /// state_dir, else the --config file's directory, else $STATE_DIRECTORY,
    /// $XDG_STATE_HOME/trellis, ~/.local/state/trellis or /var/lib/trellis.
    #[arg(long)]
    state_dir: Option<std::path::PathBuf>,
    /// Traffic control for every namespace: off (the default) or gimbal
    /// (docs/gimbal.md); overrides each namespace's `qos`.
    #[arg(long)]
    qos: Option<trellis_node::config::qos::QosMode>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (e.g.
    /// 127.0.0.1:9464 or localhost:9464); overrides `[metrics] listen`.
    #[arg(long, value_name = "HOST:PORT")]
    metrics: Option<String>,
    /// Serve the management socket (JSON-RPC 2.0, `trellis ctl`) at this
    /// Unix socket path; overrides `[ctl] socket`. Off by default.
    #[arg(long, value_name = "PATH")]
    ctl_socket: Option<std::path::PathBuf>,
    /// HA pair: hold the ownership lease in this store: file (one machine,
    /// the default) or etcd. Any HA flag turns `[ha]` on with its defaults.
    #[arg(long, value_name = "file|etcd")]
    ha_store: Option<String>,
    /// HA: etcd endpoints, comma-separated (e.g. 127.0.0.1:2379).
    #[arg(long, value_name = "HOST:PORT,...", value_delimiter = ',')]
    ha_endpoints: Vec<String>,
    /// HA: this node's name in the store (default: the node UUID).
    #[arg(long, value_name = "NAME")]
    ha_node: Option<String>,
    /// HA: the lease key, the same on both nodes (default /trellis/ha/NQN).
    #[arg(long, value_name = "KEY")]
    ha_key: Option<String>,
    /// HA: file store's lock file (default: ha.lock in the state directory).
    #[arg(long, value_name = "PATH")]
    ha_path: Option<std::path::PathBuf>,
    /// HA: lease TTL in ms (default 5000; etcd: whole seconds).
    #[arg(long, value_name = "MS")]
    ha_lease_ttl_ms: Option<u64>,
    /// HA: serve at most this long after the last confirmed keepalive (default 3500).
    #[arg(long, value_name = "MS")]
    ha_fence_ms: Option<u64>,
    /// Check everything starting would (files included, without creating
    /// them), print the effective configuration as TOML (a valid --config
    /// file, except that keys show as "<redacted>") and the identities, and
    /// exit.
    #[arg(long)]
    check: bool,
    /// With --check: print nothing, only an error and the exit status (as
    /// the packaged systemd unit's ExecStartPre runs it).
    #[arg(long, requires = "check")]
    quiet: bool,
}

fn parse_block_size(s: &str) -> Result<u32, String> {
    match s {
        "512" => Ok(512),
        "4096" | "4k" | "4K" => Ok(4096),
        _ => Err(format!(
            "{s:?} is not a supported block size: use 512 or 4096"
        )),
    }
}

pub fn run(a: TargetArgs) -> anyhow::Result<()> {
    let cfg = build(a.config.as_deref(), &a)?;
    // The same checks, and messages, as --check before anything is opened.
    cfg.preflight()?;
    if a.check {
        if a.quiet {
            return Ok(());
        }
        // Keys are written as "<redacted>" (KeyText's Serialize): this
        // output goes to terminals and journals.
        print!("{}", cfg.to_toml()?);
        // Identities are derived, not configured: comments keep the output
        // a valid config file.
        for line in identities(&cfg)?.lines() {
            println!("# {line}");
        }
        return Ok(());
    }
    trellis_node::server::run(&cfg)
}

/// The configuration `trellis target` runs: the file (or the embedded
/// default), then each flag over it. Long (over 70 lines) on purpose: one
/// flag per step in the order `--help` lists them, each refusing what it
/// cannot apply, reads better as one list than scattered over helpers.
fn build(path: Option<&str>, a: &TargetArgs) -> anyhow::Result<Config> {
    let mut cfg = match path {
        Some(p) => read_config(p)?,
        None => Config::embedded_default(),
    };
    let mut nss: Vec<NamespaceConfig> = Vec::new();
    let block_size = a.block_size.unwrap_or(512);
    for s in &a.ram {
        nss.push(ns(BackendKind::Ram, Some(*s), None, block_size));
    }
    for s in &a.null {
        nss.push(ns(BackendKind::Null, Some(*s), None, block_size));
    }
    for p in &a.file {
        nss.push(ns(
            BackendKind::File,
            a.file_size,
            Some(p.clone()),
            block_size,
        ));
    }
    for s in &a.emulated {
        let mut n = ns(BackendKind::Emulated, Some(*s), None, block_size);
        n.profile = a.profile.clone();
        n.precondition = a.precondition.clone();
        n.time_scale = a.time_scale;
        nss.push(n);
    }
    if a.block_size.is_some() && nss.is_empty() {
        anyhow::bail!(
            "--block-size applies to namespaces given by flags: add --ram, --null, --file or --emulated (or set block_size in the config file)"
        );
    }
    if let (Some(p), true) = (path, nss.is_empty()) {
        // Without a namespace flag the flags describe no subsystem: these
        // two would be ignored, and the file's subsystems stay as open as
        // they are. Refused, not ignored.
        if let Some(h) = a.allow_host.first() {
            anyhow::bail!(
                "--allow-host {h} with --config {p} applies to no subsystem (the file's keep their own hosts): list it in allowed_hosts of the [[subsystem]] in {p}, or add a namespace flag (--ram, --null, --file, --emulated) for a subsystem of its own"
            );
        }
        if a.nqn != DEFAULT_NQN {
            anyhow::bail!(
                "--nqn {} with --config {p} names no subsystem (it only names the one namespace flags add): set nqn in the [[subsystem]] of {p}, or add a namespace flag (--ram, --null, --file, --emulated)",
                a.nqn
            );
        }
    }
    if !nss.is_empty() || !a.allow_host.is_empty() || a.nqn != DEFAULT_NQN {
        // Flags describe the subsystem: replace the default one (or add to the file's).
        if path.is_none() {
            cfg.subsystems.clear();
        }
        if nss.is_empty() && path.is_none() {
            nss.push(ns(
                BackendKind::Ram,
                Some(ByteSize(1 << 30)),
                None,
                block_size,
            ));
        }
        if !nss.is_empty() {
            cfg.subsystems.push(trellis_node::config::SubsystemConfig {
                nqn: a.nqn.clone(),
                serial: String::new(), // derived from the node identity
                model: "Trellis".into(),
                allow_any_host: Some(a.allow_host.is_empty()),
                allowed_hosts: a.allow_host.clone(),
                hosts: vec![],
                namespaces: nss,
                listeners: None,
            });
        }
    }
    if !a.listen.is_empty() {
        let secure_channel = listen_secure_channel(&cfg.listeners, path)?;
        cfg.listeners = a
            .listen
            .iter()
            .map(|s| {
                Ok(ListenerConfig {
                    name: None,
                    addr: resolve_host_port(s).map_err(|e| anyhow::anyhow!("--listen: {e}"))?,
                    kind: None,
                    ana_state: None,
                    secure_channel,
                })
            })
            .collect::<anyhow::Result<_>>()?;
    }
    if let Some(q) = a.qos {
        for n in cfg
            .subsystems
            .iter_mut()
            .flat_map(|s| s.namespaces.iter_mut())
        {
            n.qos = q;
        }
    }
    if let Some(r) = a.reactors {
        cfg.target.reactors = r;
    }
    if let Some(m) = &a.metrics {
        let addr = resolve_host_port(m).map_err(|e| anyhow::anyhow!("--metrics: {e}"))?;
        cfg.metrics.listen = Some(addr);
    }
    if let Some(p) = &a.ctl_socket {
        cfg.ctl.socket = Some(p.clone());
    }
    if let Some(e) = a.engine {
        cfg.target.socket_engine = e;
    }
    if !a.cpus.is_empty() {
        cfg.target.cpus = a.cpus.clone();
    }
    ha_flags(&mut cfg, a)?;
    cfg.target.state_dir = state_dir(path, cfg.target.state_dir.take(), a);
    cfg.validate()?;
    Ok(cfg)
}

/// A `--config` file: its keys (if any) readable by the owner only, then
/// parsed and checked.
fn read_config(p: &str) -> anyhow::Result<Config> {
    use std::io::Read;
    let mut f = std::fs::File::open(p).with_context(|| format!("reading {p}"))?;
    let mut text = String::new();
    f.read_to_string(&mut text)
        .with_context(|| format!("reading {p}"))?;
    // The key text is wiped when the config is dropped; the file's text too.
    let text = trellis_node::config::keys::KeyText::new(text);
    let cfg = Config::from_toml(text.expose()).with_context(|| format!("in {p}"))?;
    if cfg.has_keys() {
        let meta = f.metadata().with_context(|| format!("reading {p}"))?;
        trellis_node::config::keys::check_file_mode(p, &meta)?;
    }
    Ok(cfg)
}

/// The `secure_channel` of listeners given by `--listen`: the one every
/// configured listener has (so `--listen` never turns TLS off), refused
/// when they differ (which one a new address should get is not ours to guess).
fn listen_secure_channel(
    configured: &[ListenerConfig],
    path: Option<&str>,
) -> anyhow::Result<Option<SecureChannel>> {
    let name = |s: Option<SecureChannel>| match s {
        None => "none",
        Some(SecureChannel::Required) => "required",
        Some(SecureChannel::Optional) => "optional",
    };
    let Some(first) = configured.first() else {
        return Ok(None);
    };
    if configured
        .iter()
        .all(|l| l.secure_channel == first.secure_channel)
    {
        return Ok(first.secure_channel);
    }
    let each: Vec<String> = configured
        .iter()
        .map(|l| format!("{} {}", l.addr, name(l.secure_channel)))
        .collect();
    anyhow::bail!(
        "--listen replaces the configured listeners, whose secure_channel differ ({}): set the addresses in the [[listener]] tables of {} instead of --listen",
        each.join(", "),
        path.unwrap_or("the config file")
    )
}

/// The --ha-* flags over `[ha]` (creating it with its defaults).
fn ha_flags(cfg: &mut Config, a: &TargetArgs) -> anyhow::Result<()> {
    use trellis_node::config::ha::HaConfig;
    use trellis_node::control::ha::StoreKind;
    let any = a.ha_store.is_some()
        || !a.ha_endpoints.is_empty()
        || a.ha_node.is_some()
        || a.ha_key.is_some()
        || a.ha_path.is_some()
        || a.ha_lease_ttl_ms.is_some()
        || a.ha_fence_ms.is_some();
    if !any {
        return Ok(());
    }
    let ha = cfg.ha.get_or_insert_with(HaConfig::default);
    match a.ha_store.as_deref() {
        None => {}
        Some("file") => ha.store = StoreKind::File,
        Some("etcd") => ha.store = StoreKind::Etcd,
        Some(s) => anyhow::bail!("--ha-store {s:?}: use file or etcd"),
    }
    if !a.ha_endpoints.is_empty() {
        ha.endpoints = a.ha_endpoints.clone();
    }
    let set = |dst: &mut String, v: &Option<String>| {
        if let Some(v) = v {
            dst.clone_from(v);
        }
    };
    set(&mut ha.node, &a.ha_node);
    set(&mut ha.key, &a.ha_key);
    if a.ha_path.is_some() {
        ha.path.clone_from(&a.ha_path);
    }
    ha.lease_ttl_ms = a.ha_lease_ttl_ms.unwrap_or(ha.lease_ttl_ms);
    ha.fence_ms = a.ha_fence_ms.unwrap_or(ha.fence_ms);
    Ok(())
}

/// The flag, else the config's `state_dir` (relative to the config file),
/// else the config file's directory; None leaves the default chain.
fn state_dir(
    config: Option<&str>,
    configured: Option<std::path::PathBuf>,
    a: &TargetArgs,
) -> Option<std::path::PathBuf> {
    if let Some(d) = &a.state_dir {
        return Some(d.clone());
    }
    let path = std::path::Path::new(config?);
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    Some(match configured {
        Some(d) => dir.join(d), // an absolute `d` replaces `dir`
        None => dir,
    })
}

/// The identities a target started now would present. Reads the node
/// identity file without creating or locking anything; when there is none
/// yet, says so (the values shown are then placeholders from a fresh id).
fn identities(cfg: &Config) -> anyhow::Result<String> {
    use std::fmt::Write;
    use trellis_node::state::identity::NodeId;
    let dir = trellis_node::state::subsystem::state_dir(cfg);
    let Some(node) = NodeId::peek(&dir)? else {
        return Ok(format!(
            "node identity: none yet in {}; the first start creates one (serials, NGUIDs, EUI-64s and UUIDs derive from it)\n",
            dir.display()
        ));
    };
    let mut out = format!(
        "node identity {} ({})\n",
        node.uuid(),
        node.path().display()
    );
    for s in &cfg.subsystems {
        writeln!(out, "subsystem {}: serial {}", s.nqn, node.serial(s))?;
        for (i, n) in s.namespaces.iter().enumerate() {
            let nsid = n.nsid.unwrap_or(i as u32 + 1);
            writeln!(
                out,
                "  nsid {nsid}: {}",
                node.namespace_ids(&s.nqn, nsid, n)
            )?;
        }
    }
    Ok(out)
}

fn ns(
    backend: BackendKind,
    size: Option<ByteSize>,
    path: Option<String>,
    block_size: u32,
) -> NamespaceConfig {
    NamespaceConfig {
        size,
        path,
        block_size,
        // Everything else as the library's defaults for a namespace.
        ..NamespaceConfig::sized(backend, 0)
    }
}
