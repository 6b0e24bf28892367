//! `trellis ctl`: the management socket's client (JSON-RPC 2.0 over a Unix
//! socket; the server is `trellis_node::control::rpc`, docs/target.md "Management
//! socket").

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Largest response read; `ana_get` of a large node is a few KiB.
const MAX_RESPONSE_BYTES: u64 = 4 << 20;
/// How long a call may take before `trellis ctl` gives up.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The target's management socket (`[ctl] socket` or `trellis target --ctl-socket`).
    #[arg(
        long,
        env = "TRELLIS_CTL_SOCKET",
        default_value = "/run/trellis/ctl.sock"
    )]
    socket: std::path::PathBuf,
    /// Print the JSON-RPC result as JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    cmd: CtlCmd,
}

#[derive(Subcommand, Debug)]
enum CtlCmd {
    /// Asymmetric Namespace Access: the state of each listener's ANA groups.
    Ana {
        #[command(subcommand)]
        cmd: AnaCmd,
    },
    /// A subsystem's allowed hosts: add or remove one (connected hosts stay).
    Host {
        #[command(subcommand)]
        cmd: HostCmd,
    },
    /// QoS tenants: set a DRR weight on every scheduler, live.
    Tenant {
        #[command(subcommand)]
        cmd: TenantCmd,
    },
    /// Write the live configuration (with the namespaces and tenant weights
    /// changed since the start) as TOML, for `trellis target --config`,
    /// mode 0600. The target never sends keys: each key it has is taken
    /// from --keys-from (default: PATH itself, when it exists) after its
    /// fingerprint is checked, else the save is refused.
    Save {
        /// Where to write it (replaced atomically).
        path: std::path::PathBuf,
        /// A config file holding the target's keys (tls_key, dhchap_secret,
        /// dhchap_ctrl_secret), e.g. the one it started with. Default: PATH.
        #[arg(long, value_name = "FILE")]
        keys_from: Option<std::path::PathBuf>,
    },
    /// State of the running target: controllers or namespaces.
    Get {
        #[arg(value_enum)]
        what: GetWhat,
    },
    #[command(flatten)]
    Disc(crate::ctl_disc_cmd::DiscCmd),
    /// Add or remove a namespace while hosts stay connected (they get a
    /// Namespace Attribute Changed notice and rescan).
    Namespace {
        #[command(subcommand)]
        cmd: NsCmd,
    },
    /// HA pair: hand the ownership lease to the other node without a
    /// host-visible error (ANA inaccessible, in-flight I/O finishes, the
    /// lease is released); the node stays up as the standby.
    Drain,
    /// HA pair: this node's role, the lease holder, timing and timeline.
    Ha,
}

#[derive(Subcommand, Debug)]
enum HostCmd {
    /// Allow a host NQN to connect.
    Add {
        #[arg(long)]
        nqn: String,
        #[arg(long)]
        host: String,
    },
    /// Stop allowing a host NQN (its live connections stay).
    Remove {
        #[arg(long)]
        nqn: String,
        #[arg(long)]
        host: String,
    },
}

#[derive(Subcommand, Debug)]
enum TenantCmd {
    /// Set a tenant's weight (1..=1024) on every namespace's scheduler.
    SetWeight {
        /// A [[tenant]] name, or a host NQN.
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        weight: u32,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum GetWhat {
    /// cntlid, host, subsystem, listener, queues, KATO.
    Controllers,
    /// backend, size, block size, I/O counters.
    Namespaces,
    /// drive health: critical warning, wear, spare, temperature, unsafe shutdowns.
    Health,
}

#[derive(Subcommand, Debug)]
enum NsCmd {
    /// Add a namespace, as a [[subsystem.namespace]] table would.
    Add {
        /// The subsystem's NQN.
        #[arg(long)]
        nqn: String,
        /// NSID (default: the lowest free one).
        #[arg(long)]
        nsid: Option<u32>,
        /// null, ram, file or emulated.
        #[arg(long)]
        backend: String,
        /// Size (null, ram, emulated; a file's size if it is created), e.g. 64MiB.
        #[arg(long)]
        size: Option<String>,
        /// File or block device (file backend).
        #[arg(long)]
        path: Option<String>,
        /// Logical block size: 512 or 4096.
        #[arg(long)]
        block_size: Option<u32>,
        /// ANA group (default: the NSID).
        #[arg(long)]
        ana_group: Option<u32>,
        #[arg(long)]
        read_only: bool,
    },
    /// Grow a namespace (null or regular file); hosts get a notice and
    /// re-read its size.
    Resize {
        #[arg(long)]
        nqn: String,
        #[arg(long)]
        nsid: u32,
        /// The new size, e.g. 2GiB (larger than now).
        #[arg(long)]
        size: String,
    },
    /// Remove a namespace; commands already sent to it finish.
    Remove {
        #[arg(long)]
        nqn: String,
        #[arg(long)]
        nsid: u32,
    },
}

#[derive(Subcommand, Debug)]
enum AnaCmd {
    /// Every I/O listener × ANA group with its state and namespaces.
    Get,
    /// Change one listener's group (or all its groups) to a state; hosts
    /// connected through it get an ANA change event.
    Set {
        /// The listener, HOST:PORT as the target listens (see `ana get`).
        #[arg(long)]
        listener: String,
        /// An ANA group number (default: a namespace's NSID), or "all".
        #[arg(long)]
        group: String,
        /// optimized, non-optimized, inaccessible, persistent-loss or change.
        #[arg(long)]
        state: String,
    },
}

pub fn run(a: CtlArgs) -> anyhow::Result<()> {
    let (method, params) = match &a.cmd {
        CtlCmd::Save { path, keys_from } => return save(&a.socket, path, keys_from.as_deref()),
        CtlCmd::Drain => ("ha_drain", json!({})),
        CtlCmd::Ha => ("ha_get", json!({})),
        CtlCmd::Ana { cmd: AnaCmd::Get } => ("ana_get", json!({})),
        CtlCmd::Ana {
            cmd:
                AnaCmd::Set {
                    listener,
                    group,
                    state,
                },
        } => (
            "ana_set",
            json!({"listener": listener, "group": group_value(group)?, "state": state}),
        ),
        CtlCmd::Namespace { cmd } => ns_request(cmd),
        CtlCmd::Disc(c) => crate::ctl_disc_cmd::request(c),
        CtlCmd::Host {
            cmd: HostCmd::Add { nqn, host },
        } => ("host_add", json!({"nqn": nqn, "host": host})),
        CtlCmd::Host {
            cmd: HostCmd::Remove { nqn, host },
        } => ("host_remove", json!({"nqn": nqn, "host": host})),
        CtlCmd::Tenant {
            cmd: TenantCmd::SetWeight { tenant, weight },
        } => (
            "tenant_set_weight",
            json!({"tenant": tenant, "weight": weight}),
        ),
        CtlCmd::Get {
            what: GetWhat::Controllers,
        } => ("controllers_get", json!({})),
        CtlCmd::Get {
            what: GetWhat::Namespaces,
        } => ("namespaces_get", json!({})),
        CtlCmd::Get {
            what: GetWhat::Health,
        } => ("health_get", json!({})),
    };
    let result = call(&a.socket, method, params)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print_result(method, &result);
    }
    Ok(())
}

/// The result as a table or one line.
fn print_result(method: &str, result: &Value) {
    if method == "ana_get" {
        print!("{}", ana_table(result));
    } else if method == "controllers_get" {
        print!("{}", controllers_table(result));
    } else if method == "namespaces_get" {
        print!("{}", namespaces_table(result));
    } else if method == "health_get" {
        print!("{}", health_table(result));
    } else if method.starts_with("host_") {
        let what = match (method == "host_add", result["changed"] == json!(true)) {
            (true, true) => "now allowed",
            (true, false) => "was already allowed",
            (false, true) => "no longer allowed (connected controllers stay)",
            (false, false) => "was not allowed",
        };
        println!(
            "{}: {} {what}",
            str_of(&result["subsystem"]),
            str_of(&result["host"])
        );
    } else if method.starts_with("ha_") {
        print!("{}", ha_summary(method, result));
    } else if method == "tenant_set_weight" {
        println!(
            "tenant {} (id {}): weight {}",
            str_of(&result["tenant"]),
            result["id"],
            result["weight"]
        );
    } else if let Some(line) = crate::ctl_disc_cmd::summary(method, result) {
        println!("{line}");
    } else if method.starts_with("namespace_") {
        let verb = match method {
            "namespace_add" => "added",
            "namespace_resize" => "grown",
            _ => "removed",
        };
        println!(
            "{} nsid {} {verb}; {} controller(s) sent a namespace change notice",
            str_of(&result["subsystem"]),
            result["nsid"],
            result["notified_controllers"]
        );
    } else {
        println!("{}", set_summary(result));
    }
}

fn save(
    socket: &std::path::Path,
    path: &std::path::Path,
    keys_from: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let r = call(socket, "config_get", json!({}))?;
    let toml = r["toml"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("ctl config_get: the answer has no \"toml\""))?;
    let keys: Vec<LiveKey> = match r.get("keys") {
        None => Vec::new(),
        Some(k) => serde_json::from_value(k.clone())
            .map_err(|e| anyhow::anyhow!("ctl config_get: bad \"keys\": {e}"))?,
    };
    let text = if keys.is_empty() {
        trellis_node::config::keys::KeyText::new(toml)
    } else {
        let from = keys_from.unwrap_or(path);
        with_keys(toml, &keys, from, keys_from.is_none())?
    };
    write_private(path, text.expose().as_bytes())?;
    println!("wrote the live configuration to {}", path.display());
    Ok(())
}

/// One key the live configuration has, as `config_get` names it.
#[derive(serde::Deserialize)]
struct LiveKey {
    subsystem: String,
    host: String,
    key: String,
    fingerprint: String,
}

/// `toml` (keys "<redacted>") with each key put back from the config file
/// `from`, checked against the target's fingerprint of it; the result
/// reads back as a valid configuration.
fn with_keys(
    toml: &str,
    keys: &[LiveKey],
    from: &std::path::Path,
    defaulted: bool,
) -> anyhow::Result<trellis_node::config::keys::KeyText> {
    use trellis_node::config::keys::{subsystem_key_texts, KeyText};
    let first = &keys[0];
    let how = format!(
        "give --keys-from FILE, a config file holding the target's keys (the one it started with){}",
        if defaulted { ", or save over that file" } else { "" }
    );
    let source = std::fs::read_to_string(from).map(KeyText::new).map_err(|e| {
        anyhow::anyhow!(
            "ctl save: the target has keys (subsystem {} host {} {} {}), which its management socket never sends; reading {} for them: {e}: {how}",
            first.subsystem,
            first.host,
            first.key,
            first.fingerprint,
            from.display()
        )
    })?;
    let src = trellis_node::config::Config::from_toml(source.expose())
        .map_err(|e| anyhow::anyhow!("ctl save: {} (for the keys): {e:#}", from.display()))?;
    let find = |k: &LiveKey| {
        let s = src.subsystems.iter().find(|s| s.nqn == k.subsystem)?;
        subsystem_key_texts(s)
            .find(|(h, n, _)| *h == k.host && *n == k.key)
            .map(|(_, _, t)| t.clone())
    };
    let mut doc: ::toml::Table = ::toml::from_str(toml)
        .map_err(|e| anyhow::anyhow!("ctl config_get: the TOML does not parse: {e}"))?;
    for k in keys {
        let text = match find(k) {
            Some(t) if t.fingerprint() == k.fingerprint => t,
            Some(t) => anyhow::bail!(
                "ctl save: subsystem {} host {} {}: {} has another key ({}) than the target ({}): {how}",
                k.subsystem,
                k.host,
                k.key,
                from.display(),
                t.fingerprint(),
                k.fingerprint
            ),
            None => anyhow::bail!(
                "ctl save: subsystem {} host {} {} ({}): {} has no such key: {how}",
                k.subsystem,
                k.host,
                k.key,
                k.fingerprint,
                from.display()
            ),
        };
        let Some(slot) = redacted_slot(&mut doc, k) else {
            anyhow::bail!(
                "ctl config_get: subsystem {} host {} has no redacted {} in its TOML",
                k.subsystem,
                k.host,
                k.key
            );
        };
        *slot = ::toml::Value::String(text.expose().to_string());
    }
    let out = KeyText::new(
        ::toml::to_string_pretty(&doc)
            .map_err(|e| anyhow::anyhow!("ctl save: cannot write TOML: {e}"))?,
    );
    // What is written starts a target: every key in place and valid.
    trellis_node::config::Config::from_toml(out.expose()).map_err(|e| {
        anyhow::anyhow!("ctl save: the configuration with its keys does not check: {e:#}")
    })?;
    // Wipe the copies the TOML tree made.
    for (_, v) in doc.iter_mut() {
        wipe(v);
    }
    Ok(out)
}

/// Where key `k` sits in the TOML `config_get` returned, if it is there as
/// `"<redacted>"`: `[[subsystem]] nqn` → `[[subsystem.host]] nqn` → the key.
fn redacted_slot<'a>(doc: &'a mut ::toml::Table, k: &LiveKey) -> Option<&'a mut ::toml::Value> {
    let nqn_is =
        |v: &::toml::Value, want: &str| v.get("nqn").and_then(|n| n.as_str()) == Some(want);
    doc.get_mut("subsystem")?
        .as_array_mut()?
        .iter_mut()
        .find(|s| nqn_is(s, &k.subsystem))?
        .get_mut("host")?
        .as_array_mut()?
        .iter_mut()
        .find(|h| nqn_is(h, &k.host))?
        .get_mut(&k.key)
        .filter(|v| v.as_str() == Some(trellis_node::config::keys::REDACTED))
}

/// Overwrites every string of a TOML tree in place.
fn wipe(v: &mut ::toml::Value) {
    match v {
        ::toml::Value::String(s) => zeroize::Zeroize::zeroize(s),
        ::toml::Value::Array(a) => a.iter_mut().for_each(wipe),
        ::toml::Value::Table(t) => t.iter_mut().for_each(|(_, v)| wipe(v)),
        _ => {}
    }
}

/// Writes `bytes` to `path` so that a reader (or a crash) sees the old file
/// or the new one, never half of one, and nobody but the owner can read
/// it: a temporary file created 0600, fsync, rename, fsync of the directory.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("toml.tmp");
    let fail = |e: std::io::Error| {
        anyhow::anyhow!(
            "cannot write {}: {e}: choose a writable path",
            path.display()
        )
    };
    // The configuration may hold TLS PSKs and DH-HMAC-CHAP secrets: readable
    // by the owner only, as nvme-cli keeps /etc/nvme's keys. `mode` applies
    // when the file is created, so a stale tmp of another mode goes first.
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(fail)?;
    f.write_all(bytes).map_err(fail)?;
    // The data is on disk before the name points at it...
    f.sync_all().map_err(fail)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(fail)?;
    // ...and the rename itself survives a crash.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail)?;
    Ok(())
}

fn ns_request(cmd: &NsCmd) -> (&'static str, Value) {
    match cmd {
        NsCmd::Add {
            nqn,
            nsid,
            backend,
            size,
            path,
            block_size,
            ana_group,
            read_only,
        } => {
            let mut p = json!({"nqn": nqn, "backend": backend, "read_only": read_only});
            for (k, v) in [
                ("nsid", nsid.map(Value::from)),
                ("size", size.clone().map(Value::from)),
                ("path", path.clone().map(Value::from)),
                ("block_size", block_size.map(Value::from)),
                ("ana_group", ana_group.map(Value::from)),
            ] {
                if let Some(v) = v {
                    p[k] = v;
                }
            }
            ("namespace_add", p)
        }
        NsCmd::Resize { nqn, nsid, size } => (
            "namespace_resize",
            json!({"nqn": nqn, "nsid": nsid, "size": size}),
        ),
        NsCmd::Remove { nqn, nsid } => ("namespace_remove", json!({"nqn": nqn, "nsid": nsid})),
    }
}

fn group_value(g: &str) -> anyhow::Result<Value> {
    if g == "all" {
        return Ok(json!("all"));
    }
    let n: u32 = g
        .parse()
        .map_err(|_| anyhow::anyhow!("--group {g:?}: give an ANA group number or \"all\""))?;
    Ok(json!(n))
}

/// One request, one response line; a JSON-RPC error becomes an Err with
/// its message.
fn call(socket: &std::path::Path, method: &str, params: Value) -> anyhow::Result<Value> {
    let mut s = UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot reach the management socket {}: start the target with --ctl-socket PATH (or [ctl] socket), then give the same path with --socket",
            socket.display()
        )
    })?;
    s.set_read_timeout(Some(CALL_TIMEOUT))?;
    s.set_write_timeout(Some(CALL_TIMEOUT))?;
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    writeln!(s, "{req}")?;
    let mut line = String::new();
    BufReader::new(s)
        .take(MAX_RESPONSE_BYTES)
        .read_line(&mut line)
        .context("reading the target's answer")?;
    let resp: Value = serde_json::from_str(&line)
        .with_context(|| format!("the target's answer is not JSON: {line:?}"))?;
    if let Some(e) = resp.get("error") {
        let msg = e.get("message").and_then(Value::as_str).unwrap_or("?");
        anyhow::bail!("ctl {method}: {msg}");
    }
    resp.get("result")
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("ctl {method}: the answer has neither result nor error"))
}

fn ana_table(r: &Value) -> String {
    let mut out = format!(
        "{:<24} {:>6}  {:<16} namespaces\n",
        "listener", "group", "state"
    );
    for g in r["groups"].as_array().into_iter().flatten() {
        let nss: Vec<String> = g["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| format!("{} nsid {}", str_of(&n["subsystem"]), n["nsid"]))
            .collect();
        out.push_str(&format!(
            "{:<24} {:>6}  {:<16} {}\n",
            str_of(&g["listener"]),
            g["group"].to_string(),
            str_of(&g["state"]),
            nss.join(", ")
        ));
    }
    out
}

fn controllers_table(r: &Value) -> String {
    let mut out = format!(
        "{:>6}  {:<24} {:<8} {:>4} {:>7}  {:<32} host\n",
        "cntlid", "listener", "state", "ioq", "kato_ms", "subsystem"
    );
    for c in r["controllers"].as_array().into_iter().flatten() {
        let state = if c["ready"] == json!(true) {
            "ready"
        } else {
            "-"
        };
        out.push_str(&format!(
            "{:>6}  {:<24} {:<8} {:>4} {:>7}  {:<32} {}\n",
            c["cntlid"].to_string(),
            str_of(&c["listener"]),
            state,
            c["io_queues"].to_string(),
            c["kato_ms"].to_string(),
            str_of(&c["subsystem"]),
            str_of(&c["host"])
        ));
    }
    out
}

fn namespaces_table(r: &Value) -> String {
    let mut out = format!(
        "{:<32} {:>5} {:>12} {:>5} {:>12} {:>12}  backend\n",
        "subsystem", "nsid", "size", "bs", "reads", "writes"
    );
    for n in r["namespaces"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:<32} {:>5} {:>12} {:>5} {:>12} {:>12}  {}\n",
            str_of(&n["subsystem"]),
            n["nsid"].to_string(),
            n["size_bytes"].to_string(),
            n["block_size"].to_string(),
            n["read_cmds"].to_string(),
            n["write_cmds"].to_string(),
            str_of(&n["backend"])
        ));
    }
    out
}

/// `health_get` as a table; "-" where the drive reports no wear figure.
fn health_table(r: &Value) -> String {
    let mut out = format!(
        "{:<32} {:>5} {:>7} {:>6} {:>6} {:>7} {:>6} {:>8} {:>7}  {:<18} source\n",
        "subsystem",
        "nsid",
        "warning",
        "used%",
        "spare%",
        "errors",
        "temp_C",
        "power_h",
        "unsafe",
        "prediction"
    );
    let opt = |v: &Value| v.as_u64().map_or("-".to_string(), |n| n.to_string());
    for n in r["namespaces"].as_array().into_iter().flatten() {
        let temp_c = n["temperature_k"]
            .as_i64()
            .map_or("-".into(), |k| (k - 273).to_string());
        out.push_str(&format!(
            "{:<32} {:>5} {:>7} {:>6} {:>6} {:>7} {:>6} {:>8} {:>7}  {:<18} {}\n",
            str_of(&n["subsystem"]),
            n["nsid"].to_string(),
            format!("{:#04x}", n["critical_warning"].as_u64().unwrap_or(0)),
            opt(&n["percentage_used"]),
            opt(&n["available_spare_pct"]),
            n["media_errors"].to_string(),
            temp_c,
            n["power_on_hours"].to_string(),
            n["unsafe_shutdowns"].to_string(),
            prediction(n),
            str_of(&n["source"])
        ));
    }
    out
}

/// The predictor's verdict, with its horizon in days when it has one.
fn prediction(n: &Value) -> String {
    let Some(v) = n["prediction"].as_str() else {
        return "-".into();
    };
    match n["horizon_hours"].as_u64() {
        Some(h) => format!("{v} ({}d)", h / 24),
        None => v.into(),
    }
}

fn set_summary(r: &Value) -> String {
    let changed = r["changed"].as_array().map_or(0, Vec::len);
    if changed == 0 {
        return "no change (already in that state)".into();
    }
    format!(
        "changed ANA group(s) {}; {} controller(s) sent an ANA change event",
        r["changed"], r["notified_controllers"]
    )
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or("?")
}

/// `ha_get` as lines (the timeline last), `ha_drain` as one line.
fn ha_summary(method: &str, r: &Value) -> String {
    if method == "ha_drain" {
        return format!("{}: lease released; now the standby\n", str_of(&r["node"]));
    }
    let mut s = format!(
        "node {} ({}), holder {}, store {} key {}\nlease TTL {} ms, keepalive {} ms, fence {} ms\n",
        str_of(&r["node"]),
        str_of(&r["role"]),
        r["holder"].as_str().unwrap_or("none"),
        str_of(&r["store"]),
        str_of(&r["key"]),
        r["lease_ttl_ms"],
        r["keepalive_ms"],
        r["fence_ms"]
    );
    for e in r["events"].as_array().into_iter().flatten() {
        s += &format!("  {} {}\n", e["unix_ms"], str_of(&e["event"]));
    }
    s
}
