//! Processor-node takeover (issue 37 item 5; Samsung JBOF's "zero downtime
//! for processor node failure"): under a verified workload host A is killed,
//! or frozen and later thawed, and host B takes the namespace over with
//! Preempt and Abort. `trellis bench takeover` checks the history: no
//! acknowledged write of A lost, no write of A landing after the takeover,
//! and, frozen, every write A sends after its thaw refused.

mod common;
use common::*;
use std::time::Duration;

fn takeover(t: &LiveTarget, nsid: &str, fault: &str) -> serde_json::Value {
    let d = tempfile::tempdir().unwrap();
    let json = d.path().join("r.json");
    let addr = t.addr();
    let args = [
        "bench",
        "takeover",
        "--addr",
        &addr,
        "--nsid",
        nsid,
        "--fault",
        fault,
        "--run-time",
        "700ms",
        "--thaw-time",
        "500ms",
        "--iodepth",
        "16",
        "--json",
        json.to_str().unwrap(),
    ];
    let o = trellis_within(&args, Duration::from_secs(60));
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

fn assert_safe(r: &serde_json::Value, fault: &str) {
    assert_eq!(r["fault"], fault);
    assert!(r["a_writes_acked"].as_u64().unwrap() > 0, "{r}");
    for k in [
        "a_acked_writes_lost",
        "a_writes_acked_after_takeover",
        "a_writes_landed_after_takeover",
    ] {
        assert_eq!(r[k], 0, "{k}: {r}");
    }
    assert!(r["violations"].as_array().unwrap().is_empty(), "{r}");
    assert!(r["takeover_ms"].as_f64().unwrap() > 0.0, "{r}");
}

#[test]
fn a_killed_or_frozen_host_loses_nothing_acknowledged_and_lands_nothing_after_the_takeover() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("vol.img");
    // nsid 1: a file through io_uring (commands sit in the kernel when A
    // fails); nsid 2: RAM.
    let t = LiveTarget::start(&[
        "--file",
        img.to_str().unwrap(),
        "--file-size",
        "16M",
        "--ram",
        "16M",
    ]);
    for nsid in ["1", "2"] {
        let killed = takeover(&t, nsid, "kill");
        assert_safe(&killed, "kill");
        let frozen = takeover(&t, nsid, "freeze");
        assert_safe(&frozen, "freeze");
        // Thawed, A went on writing: every one of those was refused.
        assert!(frozen["a_writes_refused"].as_u64().unwrap() > 0, "{frozen}");
        assert_eq!(frozen["a_writes_failed_other"], 0, "{frozen}");
    }
}

#[test]
fn bad_takeover_flags_are_refused_with_the_fix() {
    let o = trellis(&[
        "bench",
        "takeover",
        "--addr",
        "127.0.0.1:1",
        "--fault",
        "reboot",
    ]);
    assert_refused(&o, &["--fault \"reboot\"", "kill or freeze"]);
    let o = trellis(&[
        "bench",
        "takeover",
        "--addr",
        "127.0.0.1:1",
        "--iodepth",
        "16",
        "--blocks",
        "8",
    ]);
    assert_refused(&o, &["--blocks 8", "use 32 to"]);
}
