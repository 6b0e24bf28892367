//! `trellis cdc`: a central discovery controller (CDC). Hosts run `nvme
//! discover` against one address and see the subsystems of every storage
//! node it follows.
//!
//! Design (pull, as TP8010's CDC pulls from a DDC; docs/target.md
//! "Central discovery controller"): the CDC is given the nodes' discovery
//! addresses (`--node`, repeatable). For each it keeps one persistent
//! discovery connection through the host library: Connect with KATO
//! `--kato-ms`, Keep Alive every KATO/2, Discovery Log Page Change notices
//! enabled (Asynchronous Event Configuration bit 31) and one AER always
//! outstanding. It reads the node's log at connect and after each notice,
//! and serves the NVMe subsystem entries (SUBTYPE 2h) of every node it
//! reaches, after its own entry, on its own discovery listeners (a
//! `trellis target` with no subsystems). Entries are merged as the nodes
//! wrote them, with their own addresses and PORTIDs, after two checks a
//! rogue node (or a man in the middle) would otherwise get past: an entry
//! must point at the node's own address (the IP of its `--node`) or at one
//! `--allow-traddr` lists, so no node can steer hosts to other targets;
//! and a node contributes at most `--node-entries-max` entries, so none
//! can crowd the others out of the log. Dropped entries are logged.
//!
//! A node is dropped when its connection fails: at once when the socket
//! closes (the node stopped), or when a Keep Alive or log read gets no
//! answer within KATO (a hung node or a cut link), so at most 1.5 × KATO
//! after the node's last answer. The CDC retries every `--retry-ms`.
//! Each change to the merged log bumps GENCTR and raises the Discovery Log
//! Page Change notice on the CDC's persistent host connections.
//!
//! Keys (docs/target.md "Central discovery controller"): `--tls-key`,
//! `--dhchap-secret` and `--dhchap-ctrl-secret` name files (mode 0600)
//! used for every node, and `--node ADDR,tls-key=FILE,...` for one. A node
//! with a TLS key is reached over TLS only, never plain TCP; one with a
//! controller secret must authenticate itself or is not followed. Failures
//! are logged at most every `--log-interval-ms` per node.

use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use trellis_host::{ctrl::Controller, HostConfig};
use trellis_node::config::{Config, ListenerConfig, ListenerKind};
use trellis_node::state::subsystem::Registry;
use trellis_nvme::fabrics::DISCOVERY_NQN;
use trellis_nvme::log::{subtype, DiscoveryEntry};

/// Asynchronous Event Configuration bit 31: Discovery Log Page Change.
const AEN_DISC_CHANGE: u32 = 1 << 31;
/// Completion DW0 of that notice (Notice, F0h, log page 70h).
const AEN_DISC_CHANGE_DW0: u32 = 0x0070_F002;
/// How often a follower polls its node's connection for the AER.
const POLL: Duration = Duration::from_millis(20);
/// Nodes one CDC follows.
pub const MAX_NODES: usize = 64;
/// Default of `--node-entries-max`: entries one node may add to the log.
pub const DEFAULT_NODE_ENTRIES_MAX: usize = 256;
/// Upper bound of `--node-entries-max`.
pub const NODE_ENTRIES_MAX_LIMIT: usize = 4096;
/// Largest key file read (a key's text is under 200 bytes).
pub const KEY_FILE_MAX_BYTES: u64 = 4096;

#[derive(Args, Debug)]
pub struct CdcArgs {
    /// Where hosts discover: a discovery listener, HOST:PORT (repeatable).
    #[arg(long, default_values_t = ["127.0.0.1:8009".to_string()])]
    listen: Vec<String>,
    /// A storage node's discovery controller, HOST:PORT (repeatable; at
    /// least one, at most 64), optionally with its own key files:
    /// HOST:PORT[,tls-key=FILE][,dhchap-secret=FILE][,dhchap-ctrl-secret=FILE].
    #[arg(long = "node", required = true)]
    nodes: Vec<String>,
    /// TLS PSK file (NVMe TLS PSK interchange format, `NVMeTLSkey-1:..`,
    /// mode 0600) for every node without its own: those nodes are reached
    /// over TLS only.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// DH-HMAC-CHAP host secret file (`DHHC-1:..`, mode 0600) for every
    /// node without its own.
    #[arg(long)]
    dhchap_secret: Option<PathBuf>,
    /// DH-HMAC-CHAP controller secret file (mode 0600): nodes must prove
    /// it (bidirectional), or are not followed.
    #[arg(long)]
    dhchap_ctrl_secret: Option<PathBuf>,
    /// A failing node is logged at most once per this many ms (100..=3600000).
    #[arg(long, default_value_t = 10_000)]
    log_interval_ms: u64,
    /// Keep Alive Timeout of each node connection, ms (1000..=600000): a
    /// node silent this long (plus half of it) is dropped from the log.
    #[arg(long, default_value_t = 5000)]
    kato_ms: u32,
    /// Wait between attempts to reach a node that is down, ms (10..=600000).
    #[arg(long, default_value_t = 1000)]
    retry_ms: u64,
    /// Host NQN the CDC connects to the nodes as.
    #[arg(long, default_value = "nqn.2026-11.io.trellis:cdc")]
    hostnqn: String,
    /// Where the node identity file lives (as `trellis target --state-dir`).
    #[arg(long)]
    state_dir: Option<std::path::PathBuf>,
    /// Management socket (JSON-RPC 2.0; `trellis ctl referral ...`).
    #[arg(long)]
    ctl_socket: Option<std::path::PathBuf>,
    /// An address besides each node's own (the IP of its --node) that its
    /// entries may point at, e.g. a node's second port (repeatable).
    #[arg(long = "allow-traddr")]
    allow_traddr: Vec<std::net::IpAddr>,
    /// Entries one node may add to the merged log (1..=4096).
    #[arg(long, default_value_t = DEFAULT_NODE_ENTRIES_MAX)]
    node_entries_max: usize,
}

/// The follower settings of every node.
#[derive(Clone)]
struct Follow {
    host: HostConfig,
    retry: Duration,
    /// Addresses any node's entries may point at besides its own.
    allow: Vec<std::net::IpAddr>,
    entries_max: usize,
    log_interval: Duration,
}

/// Key files of one node (its own, else the global flags').
#[derive(Clone, Debug, Default)]
struct KeyFiles {
    tls: Option<PathBuf>,
    dhchap: Option<PathBuf>,
    dhchap_ctrl: Option<PathBuf>,
}

pub fn run(a: CdcArgs) -> anyhow::Result<()> {
    let (cfg, follows) = config(&a)?;
    let mut t = trellis_node::Target::start(&cfg)?;
    let stop = t.shutdown_flag();
    signal_hook_register(&stop)?;
    let mut threads = Vec::new();
    for (node, f) in follows {
        let (reg, stop) = (t.reg.clone(), stop.clone());
        let th = std::thread::Builder::new()
            .name(format!("cdc {node}"))
            .spawn(move || follow_node(&reg, &node, &f, &stop))?;
        threads.push(th);
    }
    tracing::info!(nodes = a.nodes.len(), "trellis cdc ready");
    let r = t.wait();
    for th in threads {
        let _ = th.join();
    }
    r
}

fn signal_hook_register(stop: &Arc<AtomicBool>) -> anyhow::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    Ok(())
}

/// The CDC's target configuration (discovery listeners, no subsystems)
/// and follower settings, with every flag checked.
fn config(a: &CdcArgs) -> anyhow::Result<(Config, Vec<(String, Follow)>)> {
    use anyhow::ensure;
    ensure!(
        a.nodes.len() <= MAX_NODES,
        "{} --node flags: a CDC follows at most {MAX_NODES} nodes (MAX_NODES)",
        a.nodes.len()
    );
    ensure!(
        (1000..=600_000).contains(&a.kato_ms),
        "--kato-ms {}: give 1000..=600000 (a node is dropped after 1.5 x this without an answer)",
        a.kato_ms
    );
    ensure!(
        (10..=600_000).contains(&a.retry_ms),
        "--retry-ms {}: give 10..=600000",
        a.retry_ms
    );
    ensure!(
        (1..=NODE_ENTRIES_MAX_LIMIT).contains(&a.node_entries_max),
        "--node-entries-max {}: give 1..={NODE_ENTRIES_MAX_LIMIT}",
        a.node_entries_max
    );
    ensure!(
        (100..=3_600_000).contains(&a.log_interval_ms),
        "--log-interval-ms {}: give 100..=3600000",
        a.log_interval_ms
    );
    let mut cfg = Config::embedded_default();
    cfg.subsystems.clear();
    cfg.listeners = Vec::new();
    for l in &a.listen {
        let addr = l
            .parse()
            .map_err(|_| anyhow::anyhow!("--listen {l:?}: give IP:PORT, e.g. 127.0.0.1:8009"))?;
        cfg.listeners.push(ListenerConfig {
            name: None,
            addr,
            kind: Some(ListenerKind::Discovery),
            ana_state: None,
            secure_channel: None,
        });
    }
    cfg.target.state_dir = a.state_dir.clone();
    cfg.ctl.socket = a.ctl_socket.clone();
    trellis_node::config::check_nqn(&a.hostnqn).map_err(|e| anyhow::anyhow!("--hostnqn: {e}"))?;
    let host = HostConfig {
        hostid: trellis_host::ctrl::hostid_from(&a.hostnqn),
        hostnqn: a.hostnqn.clone(),
        kato_ms: a.kato_ms,
        // A Keep Alive or log read unanswered within KATO drops the node.
        command_timeout: Duration::from_millis(a.kato_ms as u64),
        connect_timeout: Duration::from_millis(a.kato_ms as u64),
        ..HostConfig::default()
    };
    let follow = Follow {
        host,
        retry: Duration::from_millis(a.retry_ms),
        allow: a.allow_traddr.clone(),
        entries_max: a.node_entries_max,
        log_interval: Duration::from_millis(a.log_interval_ms),
    };
    Ok((cfg, follows(a, &follow)?))
}

/// Each `--node`'s address and follower settings, its keys read.
fn follows(a: &CdcArgs, follow: &Follow) -> anyhow::Result<Vec<(String, Follow)>> {
    let global = KeyFiles {
        tls: a.tls_key.clone(),
        dhchap: a.dhchap_secret.clone(),
        dhchap_ctrl: a.dhchap_ctrl_secret.clone(),
    };
    let mut follows = Vec::new();
    for n in &a.nodes {
        let (addr, files) = parse_node(n, &global)?;
        trellis_host::queue::resolve(&addr).map_err(|e| {
            anyhow::anyhow!("--node {n:?}: {e}: give HOST:PORT of a node's discovery listener")
        })?;
        let mut f = follow.clone();
        with_keys(&mut f.host, &files).map_err(|e| anyhow::anyhow!("--node {addr}: {e}"))?;
        follows.push((addr, f));
    }
    Ok(follows)
}

/// `HOST:PORT[,tls-key=FILE][,dhchap-secret=FILE][,dhchap-ctrl-secret=FILE]`:
/// the address and the node's key files, each defaulting to the global flag.
fn parse_node(spec: &str, global: &KeyFiles) -> anyhow::Result<(String, KeyFiles)> {
    let mut parts = spec.split(',');
    let addr = parts.next().unwrap_or_default().to_string();
    let mut own = KeyFiles::default();
    for p in parts {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        let slot = match k {
            "tls-key" => &mut own.tls,
            "dhchap-secret" => &mut own.dhchap,
            "dhchap-ctrl-secret" => &mut own.dhchap_ctrl,
            _ => anyhow::bail!("--node {spec:?}: unknown option {k:?}: give HOST:PORT[,tls-key=FILE][,dhchap-secret=FILE][,dhchap-ctrl-secret=FILE]"),
        };
        anyhow::ensure!(
            !v.is_empty(),
            "--node {spec:?}: {k}= needs a file: {k}=FILE"
        );
        *slot = Some(PathBuf::from(v));
    }
    let files = KeyFiles {
        tls: own.tls.or_else(|| global.tls.clone()),
        dhchap: own.dhchap.or_else(|| global.dhchap.clone()),
        dhchap_ctrl: own.dhchap_ctrl.or_else(|| global.dhchap_ctrl.clone()),
    };
    Ok((addr, files))
}

/// The keys of `files` read into `host`; errors name the file and the fix.
fn with_keys(host: &mut HostConfig, files: &KeyFiles) -> anyhow::Result<()> {
    use trellis_nvme::{dhchap::Secret, tls_psk::ConfiguredPsk};
    if let Some(p) = &files.tls {
        let text = read_key_file("tls-key", p)?;
        let key = ConfiguredPsk::parse(text.trim()).map_err(|e| {
            anyhow::anyhow!("tls-key {}: {e} (nvme gen-tls-key makes one)", p.display())
        })?;
        host.tls = Some(trellis_host::HostTls::new(key));
    }
    let secret = |name: &str, p: &Path| -> anyhow::Result<Secret> {
        let text = read_key_file(name, p)?;
        Secret::parse(text.trim()).map_err(|e| {
            anyhow::anyhow!(
                "{name} {}: {e} (nvme gen-dhchap-key makes one)",
                p.display()
            )
        })
    };
    host.dhchap_secret = files
        .dhchap
        .as_deref()
        .map(|p| secret("dhchap-secret", p))
        .transpose()?;
    host.dhchap_ctrl_secret = files
        .dhchap_ctrl
        .as_deref()
        .map(|p| secret("dhchap-ctrl-secret", p))
        .transpose()?;
    anyhow::ensure!(
        host.dhchap_ctrl_secret.is_none() || host.dhchap_secret.is_some(),
        "dhchap-ctrl-secret needs a dhchap-secret too (the host authenticates first)"
    );
    Ok(())
}

/// A key file's text, wiped when dropped. Like `trellis target`'s config
/// files with keys, it must be its owner's alone (mode 0600).
fn read_key_file(name: &str, p: &Path) -> anyhow::Result<zeroize::Zeroizing<String>> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let shown = p.display();
    let f = std::fs::File::open(p).map_err(|e| anyhow::anyhow!("{name} {shown}: {e}"))?;
    let meta = f
        .metadata()
        .map_err(|e| anyhow::anyhow!("{name} {shown}: {e}"))?;
    let mode = meta.permissions().mode() & 0o777;
    anyhow::ensure!(
        mode & 0o077 == 0,
        "{name} {shown}: its mode {mode:03o} lets its group or others read the key: chmod 600 {shown}"
    );
    let mut text = zeroize::Zeroizing::new(String::new());
    f.take(KEY_FILE_MAX_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| anyhow::anyhow!("{name} {shown}: {e} (a key file holds one key as text)"))?;
    anyhow::ensure!(
        text.len() as u64 <= KEY_FILE_MAX_BYTES,
        "{name} {shown}: longer than {KEY_FILE_MAX_BYTES} bytes: a key file holds one key"
    );
    Ok(text)
}

/// Follows one node until `stop`: connect, merge its log, wait for
/// notices; on any failure drop its entries and retry.
fn follow_node(reg: &Registry, node: &str, f: &Follow, stop: &AtomicBool) {
    let mut was_up = false;
    // When a failure was last logged, and how many since were not.
    let (mut logged, mut unlogged) = (None::<Instant>, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let r = session(reg, node, f, stop, &mut was_up);
        reg.set_remote_entries(node, Vec::new());
        match r {
            Ok(()) => break, // stopping
            Err(e) if was_up => {
                tracing::warn!(node, "node dropped from the discovery log: {e}");
                (logged, unlogged) = (Some(Instant::now()), 0);
            }
            Err(e) if logged.is_none_or(|t| t.elapsed() >= f.log_interval) => {
                let hint = hint(f, &e);
                tracing::warn!(node, unlogged, "node not followed: {e}{hint}");
                (logged, unlogged) = (Some(Instant::now()), 0);
            }
            Err(_) => unlogged += 1,
        }
        was_up = false;
        sleep_unless(stop, f.retry);
    }
}

/// What a failure may mean where the error alone does not say.
fn hint(f: &Follow, e: &trellis_host::Error) -> &'static str {
    match (e, f.host.tls.is_some()) {
        (trellis_host::Error::Transport(io), false)
            if io.kind() != std::io::ErrorKind::ConnectionRefused =>
        {
            " (a node whose listener requires TLS closes plain connections: give its tls-key)"
        }
        (trellis_host::Error::Transport(_) | trellis_host::Error::Protocol(_), true) => {
            " (over TLS: a node that has no tls_key for this --hostnqn, or another key, ends the handshake)"
        }
        _ => "",
    }
}

/// One persistent discovery connection to `node`, until it fails (Err)
/// or `stop` (Ok).
fn session(
    reg: &Registry,
    node: &str,
    f: &Follow,
    stop: &AtomicBool,
    was_up: &mut bool,
) -> trellis_host::Result<()> {
    let mut c = Controller::connect(node, DISCOVERY_NQN, &f.host)?;
    if f.host.dhchap_ctrl_secret.is_some() && !c.authenticated {
        let _ = c.shutdown();
        return Err(trellis_host::Error::Auth(
            "the node did not ask for DH-HMAC-CHAP, so it has not proven the dhchap-ctrl-secret: not followed".into(),
        ));
    }
    if c.id.oaes & AEN_DISC_CHANGE == 0 {
        tracing::warn!(node, "the node's discovery controller has no change notices (OAES bit 31): its log is read at connect only");
    } else {
        c.enable_events(AEN_DISC_CHANGE)?;
    }
    let mut read_log = true;
    loop {
        if read_log {
            // Armed before the read: a change after it is not missed.
            c.arm_event()?;
            let entries = checked(node, f, merged(c.discovery_log()?));
            if reg.set_remote_entries(node, entries.clone()) || !*was_up {
                tracing::info!(
                    node,
                    subsystems = entries.len(),
                    tls = f.host.tls.is_some(),
                    authenticated = c.authenticated,
                    "node's discovery log merged"
                );
            }
            *was_up = true;
            read_log = false;
        }
        if stop.load(Ordering::Relaxed) {
            let _ = c.shutdown();
            return Ok(());
        }
        c.tick()?;
        match c.poll_event()? {
            Some(AEN_DISC_CHANGE_DW0) => read_log = true,
            Some(dw0) => {
                tracing::debug!(node, "asynchronous event {dw0:#010x} ignored");
                c.arm_event()?;
            }
            None => std::thread::sleep(POLL),
        }
    }
}

/// The entries of a node's log the CDC lists: its NVM subsystems. Its own
/// discovery entries and referrals are not passed on (hosts discover
/// through the CDC, and referrals could loop).
fn merged(log: Vec<DiscoveryEntry>) -> Vec<DiscoveryEntry> {
    log.into_iter()
        .filter(|e| e.subtype == subtype::NVME)
        .collect()
}

/// The entries of `node` the CDC serves: those pointing at the node's own
/// address or an allowed one, at most `f.entries_max` (see the module doc).
fn checked(node: &str, f: &Follow, log: Vec<DiscoveryEntry>) -> Vec<DiscoveryEntry> {
    let own = trellis_host::queue::resolve(node).ok().map(|a| a.ip());
    let ok = |e: &DiscoveryEntry| {
        let ip = e.traddr.trim().parse::<std::net::IpAddr>().ok();
        ip.is_some_and(|ip| Some(ip) == own || f.allow.contains(&ip))
    };
    let n = log.len();
    let (mine, foreign): (Vec<_>, Vec<_>) = log.into_iter().partition(|e| ok(e));
    if let Some(e) = foreign.first() {
        let example = format!("{} at {}:{}", e.subnqn, e.traddr, e.trsvcid);
        tracing::warn!(node, dropped = foreign.len(), %example, "entries pointing away from the node were dropped (--allow-traddr allows an address)");
    }
    if mine.len() > f.entries_max {
        tracing::warn!(
            node,
            entries = n,
            kept = f.entries_max,
            "the node lists more entries than --node-entries-max: the rest are dropped"
        );
    }
    mine.into_iter().take(f.entries_max).collect()
}

fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let end = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        std::thread::sleep(POLL.min(end.saturating_duration_since(Instant::now())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(nqn: &str, traddr: &str) -> DiscoveryEntry {
        DiscoveryEntry {
            adrfam: 1,
            subtype: subtype::NVME,
            treq: 0,
            portid: 1,
            trsvcid: "4420".into(),
            subnqn: nqn.into(),
            traddr: traddr.into(),
            sectype: 0,
        }
    }

    fn follow(allow: &[&str], max: usize) -> Follow {
        Follow {
            host: HostConfig::default(),
            retry: Duration::from_millis(100),
            allow: allow.iter().map(|a| a.parse().unwrap()).collect(),
            entries_max: max,
            log_interval: Duration::from_secs(10),
        }
    }

    /// A rogue node cannot steer hosts to another address, nor crowd the
    /// log: its entries pointing away are dropped unless allowed, and at
    /// most `--node-entries-max` are kept.
    #[test]
    fn a_nodes_entries_must_point_at_it_and_are_bounded() {
        let log = vec![
            entry("nqn.x:own", "10.0.0.1"),
            entry("nqn.x:elsewhere", "10.9.9.9"),
            entry("nqn.x:second-port", "10.0.1.1"),
            entry("nqn.x:garbage", "not-an-address"),
        ];
        let names = |v: Vec<DiscoveryEntry>| v.into_iter().map(|e| e.subnqn).collect::<Vec<_>>();
        let kept = checked("10.0.0.1:8009", &follow(&[], 16), log.clone());
        assert_eq!(names(kept), ["nqn.x:own"]);
        let kept = checked("10.0.0.1:8009", &follow(&["10.0.1.1"], 16), log);
        assert_eq!(names(kept), ["nqn.x:own", "nqn.x:second-port"]);
        let many: Vec<_> = (0..10)
            .map(|i| entry(&format!("nqn.x:{i}"), "10.0.0.1"))
            .collect();
        assert_eq!(checked("10.0.0.1:8009", &follow(&[], 3), many).len(), 3);
    }
}
