//! `trellis cdc` with keys to the nodes it follows (issue 32 item 6): real
//! `trellis target` nodes and `trellis cdc` processes on loopback. Over a
//! TLS-required listener the right PSK merges the node's entries, a wrong
//! PSK or none does not and the CDC's log says why; a DH-HMAC-CHAP secret
//! is presented, and a controller secret the node cannot prove means the
//! node is not followed; bad key files are refused in one line; no key
//! appears in any CDC's stdout or stderr.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use trellis_host::HostConfig;

const CDC_NQN: &str = "nqn.2026-11.io.trellis:cdc-keys";
const SUB: &str = "nqn.2026-11.io.trellis:keyed-node";

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

fn psk(seed: u64) -> String {
    trellis_nvme::tls_psk::ConfiguredPsk {
        key: key_bytes(seed),
        transform: Some(trellis_nvme::tls_psk::PskHash::Sha256),
    }
    .format()
}

fn secret(seed: u64) -> String {
    trellis_nvme::dhchap::Secret {
        key: key_bytes(seed),
        transform: None,
    }
    .format()
}

/// A key file of `text` with `mode` in `dir`.
fn key_file(dir: &Path, name: &str, text: &str, mode: u32) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    write_private(&p, text);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p.to_str().unwrap().to_string()
}

/// A node with one RAM subsystem whose only host is the CDC's NQN with
/// `host_keys` (TOML lines), on a listener with `listener_extra`.
fn node(listener_extra: &str, host_keys: &str) -> LiveTarget {
    LiveTarget::start_config(&format!(
        "[[listener]]\naddr = \"127.0.0.1:0\"\n{listener_extra}\n\
         [[subsystem]]\nnqn = \"{SUB}\"\n\
         [[subsystem.namespace]]\nbackend = \"ram\"\nsize = \"16MiB\"\n\
         [[subsystem.host]]\nnqn = \"{CDC_NQN}\"\n{host_keys}\n"
    ))
}

/// `trellis cdc` with stdout and stderr in files (both are searched for
/// keys), killed when dropped.
struct Cdc {
    child: Child,
    addr: String,
    out: PathBuf,
    err: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Cdc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Cdc {
    fn start(args: &[&str]) -> Cdc {
        let dir = tempfile::tempdir().unwrap();
        let (out, err) = (dir.path().join("out"), dir.path().join("err"));
        let child = Command::new(bin())
            .arg("cdc")
            .args(args)
            .args([
                "--hostnqn",
                CDC_NQN,
                "--kato-ms",
                "1000",
                "--retry-ms",
                "100",
            ])
            .args(["--listen", "127.0.0.1:0", "--state-dir"])
            .arg(dir.path())
            .env("TRELLIS_LOG", "debug")
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let mut c = Cdc {
            child,
            addr: String::new(),
            out,
            err,
            _dir: dir,
        };
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let log = c.log();
            let addr = log
                .lines()
                .filter_map(|l| l.split("listening on ").nth(1))
                .find_map(|r| r.split_whitespace().next());
            if let (Some(a), true) = (addr, log.contains("ready")) {
                c.addr = a.to_string();
                return c;
            }
            assert!(Instant::now() < end, "trellis cdc did not start:\n{log}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Everything the CDC wrote, stdout and stderr.
    fn output(&self) -> Vec<u8> {
        let mut v = std::fs::read(&self.out).unwrap_or_default();
        v.extend(std::fs::read(&self.err).unwrap_or_default());
        v
    }

    /// Whether the CDC's discovery log lists `SUB`.
    fn lists_sub(&self) -> bool {
        let log = trellis_host::discover(&self.addr, &HostConfig::default()).unwrap();
        log.iter().any(|e| e.subnqn == SUB)
    }

    /// Waits up to 10 s for the CDC to list `SUB`.
    fn wait_merged(&self) -> bool {
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if self.lists_sub() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Waits up to 10 s for a log line holding all of `what`.
    fn wait_log(&self, what: &[&str]) -> Result<(), String> {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if log.lines().any(|l| what.iter().all(|w| l.contains(w))) {
                return Ok(());
            }
            if Instant::now() > end {
                return Err(log);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// No form of `key` (its text, its base64 part, half of that, its bytes
/// in hex and raw) is in `out`.
fn assert_no_key(what: &str, out: &[u8], key: &str) {
    let b64 = key.split(':').nth(2).unwrap();
    let raw = match trellis_nvme::tls_psk::ConfiguredPsk::parse(key) {
        Ok(k) => k.key.clone(),
        Err(_) => trellis_nvme::dhchap::Secret::parse(key)
            .unwrap()
            .key
            .clone(),
    };
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    for n in [
        key.as_bytes(),
        b64.as_bytes(),
        &b64.as_bytes()[..b64.len() / 2],
        hex.as_bytes(),
        &raw[..16],
    ] {
        assert!(
            !contains(out, n),
            "{what} holds a key: {:?}",
            String::from_utf8_lossy(n)
        );
    }
}

#[test]
fn over_tls_the_right_psk_merges_and_a_wrong_psk_or_none_does_not_and_says_why() {
    let (right, wrong) = (psk(0x7115_ca11), psk(0xbad_5eed));
    let n = node(
        "secure_channel = \"required\"",
        &format!("tls_key = \"{right}\""),
    );
    let dir = tempfile::tempdir().unwrap();
    let right_f = key_file(dir.path(), "right.psk", &right, 0o600);
    let wrong_f = key_file(dir.path(), "wrong.psk", &wrong, 0o600);
    let good = Cdc::start(&["--node", &n.addr(), "--tls-key", &right_f]);
    // The per-node form, overriding a global key file.
    let bad = Cdc::start(&[
        "--node",
        &format!("{},tls-key={wrong_f}", n.addr()),
        "--tls-key",
        &right_f,
    ]);
    let plain = Cdc::start(&["--node", &n.addr()]);
    assert!(good.wait_merged(), "right PSK not merged:\n{}", good.log());
    good.wait_log(&["merged", "tls=true"]).unwrap();
    bad.wait_log(&["node not followed", "over TLS"])
        .unwrap_or_else(|l| panic!("wrong PSK: no reason logged:\n{l}"));
    plain
        .wait_log(&["node not followed", "requires TLS", "tls-key"])
        .unwrap_or_else(|l| panic!("no PSK: no reason logged:\n{l}"));
    // Both have retried for a while (every 100 ms) by now.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!bad.lists_sub(), "a wrong PSK merged the node");
    assert!(!plain.lists_sub(), "plain TCP merged a TLS-only node");
    // Rate-limited: ~10 retries so far, one line (--log-interval-ms 10 s).
    let lines = |c: &Cdc| c.log().matches("node not followed").count();
    assert_eq!((lines(&bad), lines(&plain)), (1, 1), "{}", bad.log());
    for (what, c) in [("right", &good), ("wrong", &bad), ("plain", &plain)] {
        for k in [&right, &wrong] {
            assert_no_key(&format!("the {what} CDC's output"), &c.output(), k);
        }
    }
    for c in [&bad, &plain] {
        let log = c.log();
        let why = log.lines().find(|l| l.contains("node not followed"));
        eprintln!("refusal logged: {}", why.unwrap_or_default());
    }
}

#[test]
fn a_dhchap_secret_is_presented_and_a_controller_secret_the_node_cannot_prove_is_refused() {
    let (host_s, ctrl_s) = (secret(0x00d4_c4a9), secret(0xc791));
    let n = node(
        "",
        &format!("dhchap_secret = \"{host_s}\"\ndhchap_ctrl_secret = \"{ctrl_s}\""),
    );
    let dir = tempfile::tempdir().unwrap();
    let host_f = key_file(dir.path(), "host.key", &host_s, 0o600);
    let ctrl_f = key_file(dir.path(), "ctrl.key", &ctrl_s, 0o600);
    let one_way = Cdc::start(&["--node", &format!("{},dhchap-secret={host_f}", n.addr())]);
    let two_way = Cdc::start(&[
        "--node",
        &n.addr(),
        "--dhchap-secret",
        &host_f,
        "--dhchap-ctrl-secret",
        &ctrl_f,
    ]);
    assert!(one_way.wait_merged(), "not merged:\n{}", one_way.log());
    // By default the node's discovery controller never asks for
    // DH-HMAC-CHAP (as nvmet; docs/target.md): with a controller secret
    // the CDC wants the node proven, so it does not follow it.
    two_way
        .wait_log(&["node not followed", "has not proven the dhchap-ctrl-secret"])
        .unwrap_or_else(|l| panic!("no refusal logged:\n{l}"));
    assert!(!two_way.lists_sub(), "an unproven node was merged");
    one_way
        .wait_log(&["merged", "authenticated=false"])
        .unwrap();
    for (what, c) in [("one-way", &one_way), ("two-way", &two_way)] {
        for k in [&host_s, &ctrl_s] {
            assert_no_key(&format!("the {what} CDC's output"), &c.output(), k);
        }
    }
}

/// With `target.discovery_dhchap = true` the node asks the CDC's keyed
/// NQN to authenticate its discovery connection (issue 32): the right
/// secrets follow it, both ways proven; a wrong secret, or none, is refused
/// there and the node's subsystem never reaches the CDC's log.
#[test]
fn with_discovery_dhchap_the_right_secret_follows_the_node_and_a_wrong_one_is_refused() {
    let (host_s, ctrl_s) = (secret(0xd15c_0001), secret(0xd15c_0002));
    let n = LiveTarget::start_config(&format!(
        "[target]\ndiscovery_dhchap = true\n\
         [[listener]]\naddr = \"127.0.0.1:0\"\n\
         [[subsystem]]\nnqn = \"{SUB}\"\n\
         [[subsystem.namespace]]\nbackend = \"ram\"\nsize = \"16MiB\"\n\
         [[subsystem.host]]\nnqn = \"{CDC_NQN}\"\n\
         dhchap_secret = \"{host_s}\"\ndhchap_ctrl_secret = \"{ctrl_s}\"\n"
    ));
    let dir = tempfile::tempdir().unwrap();
    let host_f = key_file(dir.path(), "host.key", &host_s, 0o600);
    let ctrl_f = key_file(dir.path(), "ctrl.key", &ctrl_s, 0o600);
    let wrong_f = key_file(dir.path(), "wrong.key", &secret(0xbad), 0o600);
    let right = Cdc::start(&[
        "--node",
        &n.addr(),
        "--dhchap-secret",
        &host_f,
        "--dhchap-ctrl-secret",
        &ctrl_f,
    ]);
    let wrong = Cdc::start(&["--node", &format!("{},dhchap-secret={wrong_f}", n.addr())]);
    let none = Cdc::start(&["--node", &n.addr()]);
    assert!(right.wait_merged(), "not merged:\n{}", right.log());
    right
        .wait_log(&["merged", "authenticated=true"])
        .unwrap_or_else(|l| panic!("not authenticated:\n{l}"));
    wrong
        .wait_log(&["node not followed", "the controller refused the host"])
        .unwrap_or_else(|l| panic!("no refusal logged:\n{l}"));
    none.wait_log(&["node not followed", "requires in-band authentication"])
        .unwrap_or_else(|l| panic!("no refusal logged:\n{l}"));
    assert!(!wrong.lists_sub(), "merged with a wrong secret");
    assert!(!none.lists_sub(), "merged without a secret");
    for c in [&right, &wrong, &none] {
        for k in [&host_s, &ctrl_s] {
            assert_no_key("a CDC's output", &c.output(), k);
        }
    }
}

#[test]
fn bad_key_files_are_refused_in_one_line_naming_the_file_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let key = psk(0x7115_ca11);
    let open = key_file(dir.path(), "open.psk", &key, 0o644);
    let o = trellis(&["cdc", "--node", "127.0.0.1:1", "--tls-key", &open]);
    assert_refused(&o, &[&open, "644", &format!("chmod 600 {open}")]);
    assert_one_line(&o);
    assert_no_key("the refusal", &o.stderr, &key);
    let garbage = key_file(dir.path(), "garbage.psk", "DHHC-1:00:AAAA:", 0o600);
    let o = trellis(&["cdc", "--node", &format!("127.0.0.1:1,tls-key={garbage}")]);
    assert_refused(&o, &["127.0.0.1:1", &garbage, "NVMeTLSkey-1"]);
    assert_one_line(&o);
    let s = key_file(dir.path(), "s.key", &secret(7), 0o600);
    let o = trellis(&["cdc", "--node", "127.0.0.1:1", "--dhchap-ctrl-secret", &s]);
    assert_refused(&o, &["dhchap-ctrl-secret needs a dhchap-secret"]);
    assert_one_line(&o);
    let o = trellis(&["cdc", "--node", "127.0.0.1:1,tls=x"]);
    assert_refused(&o, &["\"tls\"", "tls-key=FILE"]);
    assert_one_line(&o);
    let o = trellis(&[
        "cdc",
        "--node",
        "127.0.0.1:1",
        "--tls-key",
        "/nonexistent.psk",
    ]);
    assert_refused(&o, &["/nonexistent.psk"]);
    assert_one_line(&o);
}
