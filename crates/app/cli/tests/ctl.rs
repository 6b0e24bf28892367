//! `trellis ctl` against a running `trellis target --ctl-socket`: reads the
//! ANA states, changes one, and refuses bad input in one line that names
//! the value and the fix.

mod common;
use common::*;

#[test]
fn ctl_reads_and_changes_ana_state_of_a_running_target() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ctl.sock");
    let sock = sock.to_str().unwrap();
    let t = LiveTarget::start(&["--ram", "16M", "--ctl-socket", sock]);
    let addr = t.addr();
    let o = trellis(&["ctl", "--socket", sock, "ana", "get"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let line = stdout(&o)
        .lines()
        .find(|l| l.starts_with(&addr))
        .unwrap_or_else(|| panic!("no row for {addr}:\n{}", stdout(&o)))
        .to_string();
    assert!(
        line.contains("optimized") && line.contains("nsid 1"),
        "{line}"
    );
    let set = |state: &str| {
        trellis(&[
            "ctl",
            "--socket",
            sock,
            "ana",
            "set",
            "--listener",
            &addr,
            "--group",
            "all",
            "--state",
            state,
        ])
    };
    let o = set("inaccessible");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("changed ANA group(s) [1]"),
        "{}",
        stdout(&o)
    );
    let o = trellis(&["ctl", "--socket", sock, "--json", "ana", "get"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["groups"][0]["state"], "inaccessible", "{v}");
    let o = set("sideways");
    assert_refused(&o, &["\"sideways\"", "non-optimized"]);
    assert_one_line(&o);
    let o = trellis(&[
        "ctl",
        "--socket",
        sock,
        "ana",
        "set",
        "--listener",
        "10.0.0.9:1",
        "--group",
        "1",
        "--state",
        "optimized",
    ]);
    assert_refused(&o, &["10.0.0.9:1", &addr]);
    assert_one_line(&o);
}

#[test]
fn ctl_without_a_socket_says_how_to_get_one() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("none.sock");
    let o = trellis(&["ctl", "--socket", sock.to_str().unwrap(), "ana", "get"]);
    assert_refused(&o, &["none.sock", "--ctl-socket"]);
    assert_one_line(&o);
}

/// `ctl listener add --name --secure-channel` reach the node: the name is
/// taken (a second listener may not reuse it) and a TLS-required listener
/// added live refuses a plaintext host (issue 32: a listener added live
/// could not be named or made TLS from the command line).
#[test]
fn ctl_listener_add_takes_a_name_and_a_secure_channel() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ctl.sock");
    let sock = sock.to_str().unwrap();
    let _t = LiveTarget::start(&["--ram", "16M", "--ctl-socket", sock]);
    let add = |extra: &[&str]| {
        let mut a = vec!["ctl", "--socket", sock, "--json", "listener", "add"];
        a.extend_from_slice(&["--addr", "127.0.0.1:0"]);
        a.extend_from_slice(extra);
        trellis(&a)
    };
    let o = add(&["--name", "late", "--secure-channel", "required"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let tls_addr = v["listener"].as_str().unwrap().to_string();
    let o = add(&["--name", "late"]);
    assert_refused(&o, &["\"late\"", "twice"]);
    assert_one_line(&o);
    let o = add(&["--secure-channel", "mandatory"]);
    assert_refused(&o, &["secure_channel", "required"]);
    assert_one_line(&o);
    // Plain TCP to the TLS-only listener: no controller.
    let hostnqn = "nqn.2014-08.org.nvmexpress:uuid:ctl-plain".to_string();
    let cfg = trellis_host::HostConfig {
        hostid: trellis_host::ctrl::hostid_from(&hostnqn),
        hostnqn,
        connect_timeout: std::time::Duration::from_secs(2),
        command_timeout: std::time::Duration::from_secs(2),
        ..Default::default()
    };
    let r = trellis_host::Controller::connect(&tls_addr, "nqn.2026-11.io.trellis:default", &cfg);
    assert!(
        r.is_err(),
        "a plaintext host connected through the TLS-required listener {tls_addr}"
    );
}

/// Issue 33: `trellis ctl get health` shows each namespace's drive health,
/// as a table and as JSON: the emulated drive's own wear figures (source
/// "drive"), a plausible temperature, and the unsafe-shutdown count.
#[test]
fn ctl_get_health_shows_the_drives_wear_temperature_and_unsafe_shutdowns() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ctl.sock");
    let sock = sock.to_str().unwrap();
    let _t = LiveTarget::start(&[
        "--emulated",
        "64M",
        "--profile",
        "femu",
        "--ctl-socket",
        sock,
    ]);
    let o = trellis(&["ctl", "--socket", sock, "--json", "get", "health"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let n = &v["namespaces"][0];
    assert_eq!(n["source"], "drive", "{v}");
    assert_eq!(n["percentage_used"], 0, "{v}");
    assert_eq!(n["available_spare_pct"], 100, "{v}");
    assert_eq!(n["critical_warning"], 0, "{v}");
    assert_eq!(n["unsafe_shutdowns"], 0, "{v}");
    let k = n["temperature_k"].as_u64().unwrap();
    assert!((233..=473).contains(&k), "{k} K");
    let o = trellis(&["ctl", "--socket", sock, "get", "health"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    assert!(table.starts_with("subsystem"), "{table}");
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(row.contains("0x00") && row.ends_with("drive"), "{table}");
}
