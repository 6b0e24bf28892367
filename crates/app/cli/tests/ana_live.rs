//! A multipath volume follows the ANA states its paths report (NVMe Base
//! 2.0 §8.1.1): `trellis bench --paths` against a `trellis target` whose
//! listeners report different states.

mod common;
use common::*;
use std::time::Duration;

/// A target with two listeners on free ports, the second reporting `second`
/// as the ANA state of every group behind it; both addresses.
fn two_listener_target(second: &str) -> (LiveTarget, String, String) {
    two_listener_target_with(second, "")
}

/// As [`two_listener_target`], with `extra` TOML first (e.g. a `[ctl]` table).
fn two_listener_target_with(second: &str, extra: &str) -> (LiveTarget, String, String) {
    let t = LiveTarget::start_config(&format!(
        "{extra}[[listener]]\naddr = \"127.0.0.1:0\"\n\n\
         [[listener]]\naddr = \"127.0.0.1:0\"\nana_state = \"{second}\"\n\n\
         [[subsystem]]\nnqn = \"nqn.2026-11.io.trellis:default\"\n\n\
         [[subsystem.namespace]]\nbackend = \"ram\"\nsize = \"64M\"\n"
    ));
    let l = t.listeners();
    assert_eq!(l.len(), 2, "two listeners: {l:?}");
    let (a, b) = (l[0].to_string(), l[1].to_string());
    (t, a, b)
}

fn bench_paths(paths: &str, policy: &str) -> serde_json::Value {
    let j = bench_json(&[
        "--paths",
        paths,
        "--path-policy",
        policy,
        "--rw",
        "randrw",
        "--bs",
        "4k",
        "--size",
        "8m",
        "--iodepth",
        "16",
        "--verify",
        "--runtime",
        "500ms",
    ]);
    assert_eq!(
        (j["errors"].as_u64(), j["verify_failures"].as_u64()),
        (Some(0), Some(0)),
        "{j}"
    );
    assert!(j["verified_blocks"].as_u64().unwrap() > 0, "{j}");
    j
}

#[test]
fn a_non_optimized_path_carries_nothing_while_an_optimized_one_is_up() {
    let (_t, a, b) = two_listener_target("non-optimized");
    for policy in ["round-robin", "queue-depth", "isr"] {
        let j = bench_paths(&format!("{a},{b}"), policy);
        assert_eq!(j["paths"][0]["ana_state"], "optimized", "{j}");
        assert_eq!(j["paths"][1]["ana_state"], "non-optimized", "{j}");
        assert!(
            j["paths"][0]["ios"].as_u64().unwrap() > 100,
            "{policy}: {j}"
        );
        assert_eq!(j["paths"][1]["ios"], 0, "{policy}: {j}");
    }
}

#[test]
fn an_inaccessible_path_is_never_used() {
    let (_t, a, b) = two_listener_target("inaccessible");
    // The inaccessible path listed first: everything goes to the other.
    let j = bench_paths(&format!("{b},{a}"), "round-robin");
    assert_eq!(j["paths"][0]["ana_state"], "inaccessible", "{j}");
    assert_eq!(j["paths"][0]["ios"], 0, "{j}");
    assert!(j["paths"][1]["ios"].as_u64().unwrap() > 100, "{j}");
    assert_eq!(
        j["ana_moves"], 0,
        "no command was sent where it would be refused: {j}"
    );
}

#[test]
fn a_path_made_inaccessible_under_verified_load_loses_nothing_and_serves_again_when_optimized() {
    // The target's management socket flips path A inaccessible mid-run, then
    // back: the commands A refuses move to B (no error, every block
    // verified), and A carries I/O again after it returns.
    let d = tempfile::tempdir().unwrap();
    let sock = d.path().join("ctl.sock");
    let sock_s = sock.to_str().unwrap().to_string();
    let (_t, a, b) =
        two_listener_target_with("optimized", &format!("[ctl]\nsocket = \"{sock_s}\"\n\n"));
    let json = d.path().join("r.json");
    let bench = std::process::Command::new(bin())
        .args([
            "bench",
            "--no-progress",
            "--paths",
            &format!("{a},{b}"),
            "--rw",
            "randrw",
            "--bs",
            "4k",
            "--size",
            "8m",
            "--iodepth",
            "16",
            "--verify",
            "--runtime",
            "3",
            "--json",
            json.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ctl = |state: &str| {
        let o = trellis(&[
            "ctl",
            "--socket",
            &sock_s,
            "ana",
            "set",
            "--listener",
            &a,
            "--group",
            "all",
            "--state",
            state,
        ]);
        assert!(o.status.success(), "ctl {state}: {}", stderr(&o));
    };
    std::thread::sleep(Duration::from_millis(800));
    ctl("inaccessible");
    std::thread::sleep(Duration::from_millis(1000));
    ctl("optimized");
    let out = bench.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let j = &j["jobs"][0];
    assert_eq!(
        (j["errors"].as_u64(), j["verify_failures"].as_u64()),
        (Some(0), Some(0)),
        "{j}"
    );
    assert!(
        j["ana_moves"].as_u64().unwrap() > 0,
        "A refused some commands: {j}"
    );
    assert_eq!(j["paths"][0]["ana_state"], "optimized", "{j}");
    assert_eq!(
        j["path_failures"], 0,
        "an ANA state is not a path failure: {j}"
    );
    // Round-robin over two paths: A would carry half. It carried clearly less
    // (out for a third of the run) but not nothing (used before and after).
    let ios: Vec<f64> = (0..2)
        .map(|i| j["paths"][i]["ios"].as_f64().unwrap())
        .collect();
    let share_a = ios[0] / (ios[0] + ios[1]);
    assert!(share_a > 0.1 && share_a < 0.45, "A's share {share_a}: {j}");
    eprintln!("A share {share_a:.3}, ana_moves {}", j["ana_moves"]);
}
