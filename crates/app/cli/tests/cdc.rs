//! `trellis cdc` in front of two `trellis target` nodes on loopback, with
//! the host library as a persistent discovery host: the merged log lists
//! both nodes' subsystems; stopping one (SIGKILL) drops its entries and the
//! host's outstanding AER completes with the Discovery Log Page Change
//! notice; a node that comes back is merged again. Also `trellis ctl
//! subsystem|referral` against a live target, and bad `cdc` flags.

mod common;
use common::*;
use std::process::Child;
use std::time::{Duration, Instant};
use trellis_host::{Controller, HostConfig};
use trellis_nvme::fabrics::DISCOVERY_NQN;

const A: &str = "nqn.2026-11.io.trellis:node-a";
const B: &str = "nqn.2026-11.io.trellis:node-b";
const DISC_CHANGE_DW0: u32 = 0x0070_F002;

/// `trellis cdc ARGS --listen 127.0.0.1:0`, killed when dropped; its port.
struct Cdc {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Cdc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cdc(args: &[&str]) -> Cdc {
    let (child, addr, _log, dir) = spawn_logged("cdc", args, &["--listen", "127.0.0.1:0"]);
    Cdc {
        child,
        addr: addr.to_string(),
        _dir: dir,
    }
}

/// The NVMe subsystems (SUBTYPE 2h) of the log `c` reads.
fn subsystems(c: &mut Controller) -> Vec<(String, String)> {
    let mut v: Vec<_> = c
        .discovery_log()
        .unwrap()
        .into_iter()
        .filter(|e| e.subtype == 2)
        .map(|e| (e.subnqn, format!("{}:{}", e.traddr, e.trsvcid)))
        .collect();
    v.sort();
    v
}

/// Polls until the AER completes (its DW0) or `limit` passes.
fn wait_event(c: &mut Controller, limit: Duration) -> Option<u32> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        c.tick().unwrap();
        if let Some(dw0) = c.poll_event().unwrap() {
            return Some(dw0);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// Takes a notice raised while the CDC merged (sent at once to a new
/// AER), reads the log (re-arming notices) and leaves one AER outstanding.
fn settle(c: &mut Controller) {
    c.arm_event().unwrap();
    if wait_event(c, Duration::from_millis(300)).is_some() {
        subsystems(c);
        c.arm_event().unwrap();
    }
}

fn host() -> HostConfig {
    HostConfig {
        kato_ms: 5000,
        ..HostConfig::default()
    }
}

#[test]
fn the_cdc_merges_two_nodes_and_tells_a_persistent_host_when_one_stops() {
    let a = LiveTarget::start(&["--ram", "16M", "--nqn", A]);
    let mut b = LiveTarget::start(&["--ram", "16M", "--nqn", B]);
    let (aa, ba) = (a.addr(), b.addr());
    let c = cdc(&[
        "--node",
        &aa,
        "--node",
        &ba,
        "--kato-ms",
        "1000",
        "--retry-ms",
        "100",
    ]);
    let mut h = Controller::connect(&c.addr, DISCOVERY_NQN, &host()).unwrap();
    assert_ne!(h.id.oaes & 1 << 31, 0, "the CDC offers change notices");
    h.enable_events(1 << 31).unwrap();
    // The CDC merges both nodes right after it starts.
    let want = vec![(A.to_string(), aa.clone()), (B.to_string(), ba.clone())];
    let end = Instant::now() + Duration::from_secs(5);
    while subsystems(&mut h) != want {
        assert!(Instant::now() < end, "not merged: {:?}", subsystems(&mut h));
        std::thread::sleep(Duration::from_millis(20));
    }
    settle(&mut h);
    let t0 = Instant::now();
    b.child.kill().unwrap();
    let dw0 = wait_event(&mut h, Duration::from_secs(5));
    let took = t0.elapsed();
    assert_eq!(dw0, Some(DISC_CHANGE_DW0), "no notice within 5 s");
    eprintln!("node stop to the host's AEN: {took:?}");
    assert_eq!(subsystems(&mut h), vec![(A.to_string(), aa)]);
}

#[test]
fn a_hung_node_is_dropped_within_the_keep_alive_bound() {
    let a = LiveTarget::start(&["--ram", "16M", "--nqn", A]);
    let b = LiveTarget::start(&["--ram", "16M", "--nqn", B]);
    let c = cdc(&[
        "--node",
        &a.addr(),
        "--node",
        &b.addr(),
        "--kato-ms",
        "1000",
        "--retry-ms",
        "100",
    ]);
    let mut h = Controller::connect(&c.addr, DISCOVERY_NQN, &host()).unwrap();
    h.enable_events(1 << 31).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while subsystems(&mut h).len() < 2 {
        assert!(Instant::now() < end, "not merged");
        std::thread::sleep(Duration::from_millis(20));
    }
    settle(&mut h);
    // SIGSTOP: the node's sockets stay open but nothing answers.
    let pid = b.child.id() as i32;
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let t0 = Instant::now();
    let dw0 = wait_event(&mut h, Duration::from_secs(5));
    let took = t0.elapsed();
    assert_eq!(dw0, Some(DISC_CHANGE_DW0), "hung node not dropped in 5 s");
    eprintln!("hung node to the host's AEN: {took:?} (KATO 1 s)");
    assert!(
        took >= Duration::from_millis(400),
        "{took:?}: dropped too soon"
    );
    // Read while the node is still stopped: the CDC retries every 100 ms,
    // and a retry waiting on the stopped node completes the instant it is
    // continued, so a read after SIGCONT could already see it merged back.
    assert_eq!(subsystems(&mut h).len(), 1);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    // SIGCONT: it answers again and is merged back.
    h.arm_event().unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while subsystems(&mut h).len() < 2 {
        assert!(Instant::now() < end, "not merged back");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn bad_cdc_flags_are_one_line_naming_the_value() {
    let o = trellis(&["cdc", "--node", "127.0.0.1:1", "--kato-ms", "5"]);
    assert_refused(&o, &["--kato-ms 5", "1000"]);
    assert_one_line(&o);
    let o = trellis(&["cdc", "--node", "nowhere"]);
    assert_refused(&o, &["\"nowhere\"", "HOST:PORT"]);
    assert_one_line(&o);
}

#[test]
fn ctl_adds_and_removes_a_subsystem_a_referral_and_a_listener() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ctl.sock");
    let sock = sock.to_str().unwrap();
    let t = LiveTarget::start(&["--ram", "16M", "--ctl-socket", sock]);
    let ctl = |args: &[&str]| {
        let mut a = vec!["ctl", "--socket", sock];
        a.extend_from_slice(args);
        trellis(&a)
    };
    let o = ctl(&["subsystem", "add", "--nqn", B]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("added"), "{}", stdout(&o));
    let o = ctl(&[
        "namespace",
        "add",
        "--nqn",
        B,
        "--backend",
        "null",
        "--size",
        "1MiB",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = ctl(&["referral", "add", "--addr", "10.0.0.2:8009"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let log = trellis_host::discover(&t.addr(), &HostConfig::default()).unwrap();
    assert!(log.iter().any(|e| e.subnqn == B), "{log:?}");
    assert!(
        log.iter().any(|e| e.subtype == 1 && e.traddr == "10.0.0.2"),
        "{log:?}"
    );
    let saved = dir.path().join("saved.toml");
    let o = ctl(&["save", saved.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&saved).unwrap();
    assert!(text.contains(B) && text.contains("[[referral]]"), "{text}");
    // It may hold secrets: owner-only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&saved).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "saved config mode {mode:o}");
    let o = ctl(&[
        "subsystem",
        "remove",
        "--nqn",
        "nqn.2026-11.io.trellis:none",
    ]);
    assert_refused(&o, &["nqn.2026-11.io.trellis:none", B]);
    assert_one_line(&o);
    let o = ctl(&["subsystem", "remove", "--nqn", B]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = ctl(&["listener", "add", "--addr", "127.0.0.1:0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let line = stdout(&o);
    let new = line
        .split_whitespace()
        .nth(2)
        .unwrap()
        .trim_end_matches(';')
        .to_string();
    let log = trellis_host::discover(&new, &HostConfig::default()).unwrap();
    assert!(
        log.iter()
            .any(|e| e.trsvcid == new.rsplit(':').next().unwrap()),
        "{log:?}"
    );
    let o = ctl(&["listener", "remove", "--addr", &t.addr()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = ctl(&["listener", "remove", "--addr", &new]);
    assert_refused(&o, &["last listener"]);
    assert_one_line(&o);
    let log = trellis_host::discover(&new, &HostConfig::default()).unwrap();
    assert!(log.iter().all(|e| e.subnqn != B), "{log:?}");
}
