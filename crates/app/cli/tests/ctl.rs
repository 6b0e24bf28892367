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
