//! Issue 32: flags never silently weaken a configuration, and keys stay
//! secret: `--check`, `config_get` (`trellis ctl save`), the log and the
//! files the target writes never hold a TLS PSK or a DH-HMAC-CHAP secret;
//! files holding keys are the owner's only. Each test failed on the code
//! before the fix.

mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

const HOST: &str = "nqn.2026-11.io.trellis:secret-host";
const SUB: &str = "nqn.2026-11.io.trellis:secret";
const LIMIT: Duration = Duration::from_secs(30);

/// Key bytes that look random (no run a disk image could hold by chance).
fn key_bytes(seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..32)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

struct Keys {
    tls: String,
    dhchap: String,
    ctrl: String,
    /// Every form a key could leak in: its text, its base64 part, half of
    /// that, its bytes in hex and raw.
    needles: Vec<(String, Vec<u8>)>,
}

fn keys() -> Keys {
    let tls = trellis_nvme::tls_psk::ConfiguredPsk {
        key: key_bytes(0x7115_ca11),
        transform: Some(trellis_nvme::tls_psk::PskHash::Sha256),
    };
    let dhchap = trellis_nvme::dhchap::Secret {
        key: key_bytes(0x00d4_c4a9),
        transform: None,
    };
    let ctrl = trellis_nvme::dhchap::Secret {
        key: key_bytes(0xc791),
        transform: None,
    };
    let mut needles = Vec::new();
    for (name, text, raw) in [
        ("tls_key", tls.format(), tls.key.clone()),
        ("dhchap_secret", dhchap.format(), dhchap.key.clone()),
        ("dhchap_ctrl_secret", ctrl.format(), ctrl.key.clone()),
    ] {
        let b64 = text.split(':').nth(2).unwrap().to_string();
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        needles.push((format!("{name} text"), text.clone().into_bytes()));
        needles.push((format!("{name} base64"), b64.clone().into_bytes()));
        needles.push((format!("{name} half"), b64[..b64.len() / 2].into()));
        needles.push((format!("{name} hex"), hex.into_bytes()));
        needles.push((format!("{name} bytes"), raw[..16].to_vec()));
    }
    Keys {
        tls: tls.format(),
        dhchap: dhchap.format(),
        ctrl: ctrl.format(),
        needles,
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `what` holds none of the keys in any form.
fn assert_no_key(k: &Keys, what: &str, bytes: &[u8]) {
    for (name, n) in &k.needles {
        assert!(!contains(bytes, n), "{what} holds the {name}");
    }
}

/// A config with a TLS-required listener and a host with all three keys.
fn keyed_config(k: &Keys, listen: &str, extra: &str) -> String {
    format!(
        r#"[[listener]]
addr = "{listen}"
secure_channel = "required"

[[subsystem]]
nqn = "{SUB}"

[[subsystem.host]]
nqn = "{HOST}"
tls_key = "{}"
dhchap_secret = "{}"
dhchap_ctrl_secret = "{}"
{extra}
"#,
        k.tls, k.dhchap, k.ctrl
    )
}

/// `keyed_config` on 127.0.0.1:4420 written as a private t.toml in `dir`.
fn keyed_file(dir: &Path, k: &Keys) -> String {
    write(dir, "t.toml", &keyed_config(k, "127.0.0.1:4420", ""), 0o600)
}

fn write(dir: &Path, name: &str, text: &str, mode: u32) -> String {
    let p = dir.join(name);
    write_private(&p, text);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p.to_str().unwrap().to_string()
}

fn check(state: &Path, args: &[&str]) -> std::process::Output {
    let mut a = vec!["target", "--check", "--state-dir", state.to_str().unwrap()];
    a.extend_from_slice(args);
    trellis_within(&a, LIMIT)
}

const RAM_SUB: &str = "[[listener]]\naddr = \"127.0.0.1:4420\"\n[[subsystem]]\nnqn = \"nqn.2026-11.io.trellis:file\"\n[[subsystem.namespace]]\nbackend = \"ram\"\nsize = \"16MiB\"\n";

#[test]
fn allow_host_and_nqn_with_config_are_refused_not_ignored() {
    let d = tempfile::tempdir().unwrap();
    let cfg = write(d.path(), "t.toml", RAM_SUB, 0o600);
    let o = check(d.path(), &["--config", &cfg, "--allow-host", HOST]);
    assert_refused(&o, &["--allow-host", HOST, "allowed_hosts", &cfg]);
    assert_one_line(&o);
    let o = check(d.path(), &["--config", &cfg, "--nqn", SUB]);
    assert_refused(&o, &["--nqn", SUB, "namespace flag"]);
    assert_one_line(&o);
    // With a namespace flag they describe a subsystem of their own: applied.
    let o = check(
        d.path(),
        &[
            "--config",
            &cfg,
            "--ram",
            "16M",
            "--nqn",
            SUB,
            "--allow-host",
            HOST,
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let own = text
        .split("[[subsystem]]")
        .find(|s| s.contains(SUB))
        .unwrap();
    assert!(own.contains("allow_any_host = false"), "{text}");
    assert!(own.contains(HOST), "{text}");
}

#[test]
fn listen_keeps_the_configured_secure_channel_or_is_refused() {
    let k = keys();
    let d = tempfile::tempdir().unwrap();
    let cfg = keyed_file(d.path(), &k);
    let o = check(d.path(), &["--config", &cfg, "--listen", "127.0.0.1:4999"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let l = text.split("[[listener]]").nth(1).unwrap();
    assert!(
        l.contains("127.0.0.1:4999") && l.contains("secure_channel = \"required\""),
        "--listen dropped secure_channel:\n{text}"
    );
    // Listeners that differ: which one --listen means is not guessed.
    let mixed = format!(
        "{}[[listener]]\naddr = \"127.0.0.1:8009\"\n",
        keyed_config(&k, "127.0.0.1:4420", "")
    );
    let cfg = write(d.path(), "mixed.toml", &mixed, 0o600);
    let o = check(d.path(), &["--config", &cfg, "--listen", "127.0.0.1:4999"]);
    assert_refused(
        &o,
        &[
            "--listen",
            "secure_channel",
            "127.0.0.1:4420 required",
            &cfg,
        ],
    );
    assert_one_line(&o);
}

#[test]
fn cpus_that_do_not_exist_are_refused_naming_the_usable_ones() {
    let d = tempfile::tempdir().unwrap();
    for cpu in ["97", "4096", "100000"] {
        let o = check(d.path(), &["--cpus", cpu]);
        assert_refused(&o, &[&format!("CPU {cpu}"), "--cpus", "use CPUs"]);
        assert_one_line(&o);
        // Starting refuses it too, before listening.
        let o = trellis_within(
            &[
                "target",
                "--cpus",
                cpu,
                "--listen",
                "127.0.0.1:0",
                "--state-dir",
                d.path().to_str().unwrap(),
            ],
            LIMIT,
        );
        assert_refused(&o, &[&format!("CPU {cpu}")]);
    }
    let o = check(d.path(), &["--cpus", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn check_shows_keys_as_redacted() {
    let k = keys();
    let d = tempfile::tempdir().unwrap();
    let cfg = keyed_file(d.path(), &k);
    let o = check(d.path(), &["--config", &cfg]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_no_key(&k, "--check stdout", &o.stdout);
    assert_no_key(&k, "--check stderr", &o.stderr);
    let text = stdout(&o);
    for key in ["tls_key", "dhchap_secret", "dhchap_ctrl_secret"] {
        assert!(
            text.contains(&format!("{key} = \"<redacted>\"")),
            "{key}:\n{text}"
        );
    }
    // --quiet (the packaged unit's ExecStartPre) prints nothing at all.
    let o = check(d.path(), &["--config", &cfg, "--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "{}", stdout(&o));
    // A key from a bad config is not echoed by its error either.
    let bad = keyed_config(&k, "127.0.0.1:4420", "").replace("DHHC-1:00:", "DHHC-1:");
    let cfg = write(d.path(), "bad.toml", &bad, 0o600);
    let o = check(d.path(), &["--config", &cfg]);
    assert_refused(&o, &["dhchap_secret"]);
    assert_no_key(&k, "the error", &o.stderr);
}

#[test]
fn a_config_file_with_keys_that_others_may_read_is_refused() {
    let k = keys();
    let d = tempfile::tempdir().unwrap();
    let text = keyed_config(&k, "127.0.0.1:4420", "");
    for mode in [0o644, 0o640, 0o604, 0o660] {
        let cfg = write(d.path(), "t.toml", &text, mode);
        let o = check(d.path(), &["--config", &cfg]);
        assert_refused(&o, &[&cfg, &format!("chmod 600 {cfg}")]);
        assert_one_line(&o);
        assert_no_key(&k, "the error", &o.stderr);
        let o = trellis_within(
            &[
                "target",
                "--config",
                &cfg,
                "--state-dir",
                d.path().to_str().unwrap(),
            ],
            LIMIT,
        );
        assert_refused(&o, &[&format!("chmod 600 {cfg}")]);
    }
    let cfg = write(d.path(), "t.toml", &text, 0o600);
    let o = check(d.path(), &["--config", &cfg]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Without keys the mode is the operator's business.
    let cfg = write(d.path(), "nokeys.toml", RAM_SUB, 0o644);
    let o = check(d.path(), &["--config", &cfg]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn packaged_config_is_private_and_the_unit_does_not_print_it() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let asset = manifest
        .lines()
        .find(|l| l.contains("\"etc/trellis/target.toml\""))
        .expect("the packaged config is an asset");
    assert!(asset.contains("\"600\""), "installed mode: {asset}");
    let unit = std::fs::read_to_string(dir.join("../../../deploy/systemd/trellis-target.service"))
        .unwrap();
    for l in unit.lines().filter(|l| l.contains("--check")) {
        if l.starts_with('#') {
            continue;
        }
        assert!(l.contains("--quiet"), "the unit prints the config: {l}");
    }
}

/// A target started from `cfg` with `--log debug`, its stdout and stderr in
/// `dir`'s target.out and target.err, once it logs "ready"; killed on drop.
struct Running {
    child: std::process::Child,
    addr: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_target(dir: &Path, cfg: &str, sock: &str) -> Running {
    let (out, err) = (dir.join("target.out"), dir.join("target.err"));
    let mut t = Running {
        child: std::process::Command::new(bin())
            .args([
                "--log",
                "debug",
                "target",
                "--config",
                cfg,
                "--ctl-socket",
                sock,
            ])
            .arg("--state-dir")
            .arg(dir.join("state"))
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap(),
        addr: String::new(),
    };
    let end = Instant::now() + LIMIT;
    loop {
        let log = std::fs::read_to_string(&err).unwrap_or_default();
        if log.contains("ready") {
            t.addr = log
                .lines()
                .filter_map(|l| l.split("listening on ").nth(1))
                .filter_map(|r| r.split_whitespace().next())
                .next()
                .unwrap_or_else(|| panic!("no listener:\n{log}"))
                .to_string();
            return t;
        }
        assert!(Instant::now() < end, "target did not start:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn bench(addr: &str, k: &Keys, dhchap: &str) -> std::process::Output {
    trellis_within(
        &[
            "bench",
            "--addr",
            addr,
            "--no-progress",
            "--nqn",
            SUB,
            "--hostnqn",
            HOST,
            "--tls-key",
            &k.tls,
            "--dhchap-secret",
            dhchap,
            "--dhchap-ctrl-secret",
            &k.ctrl,
            "--rw",
            "randrw",
            "--bs",
            "4k",
            "--iodepth",
            "4",
            "--size",
            "4m",
            "--runtime",
            "300ms",
            "--verify",
        ],
        LIMIT,
    )
}

fn config_get_raw(sock: &str) -> Vec<u8> {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    writeln!(s, r#"{{"jsonrpc":"2.0","id":1,"method":"config_get"}}"#).unwrap();
    let mut line = Vec::new();
    std::io::BufReader::new(s)
        .read_until(b'\n', &mut line)
        .unwrap();
    line
}

/// Every regular file under `dir`, recursively.
fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.is_file() {
            out.push(p);
        }
    }
}

#[test]
fn no_output_of_a_target_with_keys_holds_them() {
    let k = keys();
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let img = data.join("disk.img");
    let ns = format!(
        "[[subsystem.namespace]]\nbackend = \"file\"\npath = {:?}\nsize = \"16MiB\"\n",
        img.to_str().unwrap()
    );
    let cfg = write(
        d.path(),
        "t.toml",
        &keyed_config(&k, "127.0.0.1:0", &ns),
        0o600,
    );
    let sock = d.path().join("ctl.sock");
    let sock = sock.to_str().unwrap();
    // --check, as the packaged unit runs it first.
    let state = d.path().join("state");
    let o = check(&state, &["--config", &cfg]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_no_key(&k, "--check stdout", &o.stdout);
    assert_no_key(&k, "--check stderr", &o.stderr);
    let t = run_target(d.path(), &cfg, sock);
    // A host with the keys does verified I/O over TLS with both-way
    // DH-HMAC-CHAP; one with a wrong secret is refused (its failure is
    // logged too).
    let o = bench(&t.addr, &k, &k.dhchap);
    assert!(o.status.success(), "{}", stderr(&o));
    let wrong = trellis_nvme::dhchap::Secret {
        key: key_bytes(0xbad),
        transform: None,
    }
    .format();
    let o = bench(&t.addr, &k, &wrong);
    assert!(!o.status.success(), "a wrong secret authenticated");
    // config_get: presence and fingerprints, never the keys.
    let reply = config_get_raw(sock);
    assert_no_key(&k, "config_get's reply", &reply);
    let v: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    let listed = v["result"]["keys"].as_array().unwrap();
    assert_eq!(listed.len(), 3, "{v}");
    for e in listed {
        assert_eq!(e["subsystem"], SUB, "{e}");
        assert_eq!(e["host"], HOST, "{e}");
        assert!(
            e["fingerprint"].as_str().unwrap().starts_with("sha256:"),
            "{e}"
        );
    }
    let toml = v["result"]["toml"].as_str().unwrap();
    assert_eq!(toml.matches("\"<redacted>\"").count(), 3, "{toml}");
    // ctl --json of other methods carry no keys either.
    for m in [
        &["get", "controllers"][..],
        &["get", "namespaces"],
        &["ana", "get"],
    ] {
        let mut a = vec!["ctl", "--socket", sock, "--json"];
        a.extend_from_slice(m);
        let o = trellis_within(&a, LIMIT);
        assert!(o.status.success(), "{m:?}: {}", stderr(&o));
        assert_no_key(&k, &format!("ctl {m:?}"), &o.stdout);
    }
    drop(t); // SIGKILL: whatever it wrote stays
             // Its log lines (debug level), its stdout, and every file it wrote.
    let t_out = std::fs::read(d.path().join("target.out")).unwrap();
    let t_err = std::fs::read(d.path().join("target.err")).unwrap();
    assert!(
        String::from_utf8_lossy(&t_err).contains("TLS 1.3 established"),
        "{}",
        String::from_utf8_lossy(&t_err)
    );
    assert_no_key(&k, "the target's stdout", &t_out);
    assert_no_key(&k, "the target's log", &t_err);
    let mut written = Vec::new();
    files(&state, &mut written);
    files(&data, &mut written);
    assert!(written.contains(&img), "{written:?}");
    for f in &written {
        assert_no_key(&k, &f.display().to_string(), &std::fs::read(f).unwrap());
    }
    let mode = std::fs::metadata(&img).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the created backing file's mode {mode:o}");
}

#[test]
fn ctl_save_writes_the_keys_back_from_a_file_after_checking_them() {
    let k = keys();
    let d = tempfile::tempdir().unwrap();
    let ns = "[[subsystem.namespace]]\nbackend = \"ram\"\nsize = \"16MiB\"\n";
    let cfg = write(
        d.path(),
        "t.toml",
        &keyed_config(&k, "127.0.0.1:0", ns),
        0o600,
    );
    let sock = d.path().join("ctl.sock");
    let sock = sock.to_str().unwrap();
    let t = run_target(d.path(), &cfg, sock);
    let save = |args: &[&str]| {
        let mut a = vec!["ctl", "--socket", sock, "save"];
        a.extend_from_slice(args);
        trellis_within(&a, LIMIT)
    };
    // Elsewhere without the keys' source: refused, saying how.
    let other = d.path().join("other.toml");
    let other_s = other.to_str().unwrap();
    let o = save(&[other_s]);
    assert_refused(&o, &["--keys-from", HOST, "sha256:"]);
    assert_one_line(&o);
    assert!(!other.exists());
    // A source whose key differs: refused, naming the fingerprints.
    let k2 = Keys {
        tls: trellis_nvme::tls_psk::ConfiguredPsk {
            key: key_bytes(0x5eed),
            transform: Some(trellis_nvme::tls_psk::PskHash::Sha256),
        }
        .format(),
        ..keys()
    };
    let stale = write(
        d.path(),
        "stale.toml",
        &keyed_config(&k2, "127.0.0.1:0", ns),
        0o600,
    );
    let o = save(&[other_s, "--keys-from", &stale]);
    assert_refused(&o, &["tls_key", "another key", "sha256:"]);
    assert!(!other.exists());
    // With the file the target started with: written, 0600, the keys in place.
    let o = save(&[other_s, "--keys-from", &cfg]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_no_key(&k, "ctl save's stdout", &o.stdout);
    let mode = std::fs::metadata(&other).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "saved config mode {mode:o}");
    let text = std::fs::read_to_string(&other).unwrap();
    for key in [&k.tls, &k.dhchap, &k.ctrl] {
        assert!(
            text.contains(key.as_str()),
            "a key is missing:\n{}",
            text.len()
        );
    }
    assert!(!text.contains("<redacted>"));
    // Over the file itself (the default source): works too.
    let o = save(&[&cfg]);
    assert!(o.status.success(), "{}", stderr(&o));
    drop(t);
    // The saved file starts a target that serves the same host with the same keys.
    let saved = std::fs::read_to_string(&other)
        .unwrap()
        .replace(&t_addr_placeholder(&text), "127.0.0.1:0");
    let again = write(d.path(), "again.toml", &saved, 0o600);
    let d2 = tempfile::tempdir().unwrap();
    let t = run_target(
        d2.path(),
        &again,
        d2.path().join("c.sock").to_str().unwrap(),
    );
    let o = bench(&t.addr, &k, &k.dhchap);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// The listener address a saved config holds (the port the first target got).
fn t_addr_placeholder(text: &str) -> String {
    let l = text.split("[[listener]]").nth(1).unwrap();
    let a = l.split("addr = \"").nth(1).unwrap();
    a.split('"').next().unwrap().to_string()
}
