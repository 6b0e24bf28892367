//! Issue 10: `trellis bench` against a live `trellis target`, as a user runs
//! them: bad requests are refused before any I/O, results are never lost.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

fn bench(t: &LiveTarget, args: &[&str]) -> std::process::Output {
    let addr = t.addr();
    let mut a = vec!["bench", "--addr", &addr, "--no-progress"];
    a.extend_from_slice(args);
    trellis(&a)
}

#[test]
fn json_path_is_checked_before_the_run() {
    // No target at all: the path is refused before anything connects.
    let t0 = std::time::Instant::now();
    let o = trellis(&[
        "bench",
        "--addr",
        "127.0.0.1:1",
        "--json",
        "/nonexistent/out.json",
    ]);
    assert_refused(&o, &["/nonexistent/out.json", "--json"]);
    assert!(!stderr(&o).contains("connect"), "{}", stderr(&o));
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn block_size_512_runs() {
    let t = LiveTarget::start(&["--ram", "64M"]);
    let o = bench(&t, &["--bs", "512", "--runtime", "300ms", "--verify"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(" 512 "), "{}", stdout(&o));
}

#[test]
fn block_size_above_mdts_is_refused_up_front() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("t.toml");
    std::fs::write(
        &f,
        "[target]\nmax_io_size = \"64KiB\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let t = LiveTarget::start(&["--config", f.to_str().unwrap(), "--null", "64M"]);
    let o = bench(&t, &["--bs", "1M", "--runtime", "1"]);
    assert_refused(&o, &["block size 1m", "MDTS", "64k", "--bs 64k or less"]);
    assert!(!stderr(&o).contains("I/O error"), "{}", stderr(&o));
}

#[test]
fn size_past_the_namespace_and_oversized_iodepth_are_refused() {
    let t = LiveTarget::start(&["--null", "64M"]);
    let o = bench(&t, &["--size", "1G", "--runtime", "1"]);
    assert_refused(&o, &["--size 1073741824", "use --size 67108864 or less"]);
    let o = bench(&t, &["--iodepth", "1000", "--runtime", "1"]);
    assert_refused(&o, &["--iodepth 1000", "or less"]);
    // The target grants 16 I/O queues by default.
    let o = bench(&t, &["--numjobs", "9", "--queues", "2", "--iodepth", "2"]);
    assert_refused(&o, &["granted 16 I/O queues", "need 18", "max_io_queues"]);
}

#[test]
fn verify_against_null_hints_that_null_discards_writes() {
    let t = LiveTarget::start(&["--null", "64M"]);
    let o = bench(
        &t,
        &[
            "--rw",
            "randrw",
            "--verify",
            "--runtime",
            "300ms",
            "--size",
            "1M",
        ],
    );
    assert_refused(
        &o,
        &["data integrity failure", "null namespace discards writes"],
    );
}

#[test]
fn hyphenated_and_fio_underscore_spellings_both_work() {
    let t = LiveTarget::start(&["--null", "64M"]);
    for ramp in ["--ramp-time", "--ramp_time"] {
        let o = bench(
            &t,
            &[ramp, "100ms", "--runtime", "200ms", "--kato_ms", "5000"],
        );
        assert!(o.status.success(), "{ramp}: {}", stderr(&o));
    }
    let help = stdout(&trellis(&["bench", "--help"]));
    assert!(
        help.contains("--ramp-time") && help.contains("--rate-iops"),
        "{help}"
    );
}

fn spawn_bench(t: &LiveTarget, json: &std::path::Path, runtime: &str) -> std::process::Child {
    Command::new(bin())
        .args([
            "bench",
            "--no-progress",
            "--addr",
            &t.addr(),
            "--runtime",
            runtime,
        ])
        .arg("--json")
        .arg(json)
        .env("TRELLIS_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn json_of(p: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).expect("results written")).unwrap()
}

#[test]
fn sigint_prints_and_writes_partial_results() {
    let t = LiveTarget::start(&["--null", "64M"]);
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("out.json");
    let child = spawn_bench(&t, &p, "60s");
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    assert_refused(&o, &["interrupted", "partial"]);
    assert!(stdout(&o).contains("PARTIAL"), "{}", stdout(&o));
    let j = json_of(&p);
    assert_eq!(j["partial"], true);
    assert!(j["jobs"][0]["ios"].as_u64().unwrap() > 0);
    assert!(j["jobs"][0]["runtime_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn losing_the_target_gives_sane_partial_figures_and_fails() {
    let mut t = LiveTarget::start(&["--null", "64M"]);
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("out.json");
    let child = spawn_bench(&t, &p, "20s");
    std::thread::sleep(Duration::from_millis(1500));
    t.child.kill().unwrap();
    let o = child.wait_with_output().unwrap();
    assert_refused(
        &o,
        &["job job0 stopped after", "transport error", "partial"],
    );
    let j = json_of(&p);
    let job = &j["jobs"][0];
    let (ios, secs) = (
        job["ios"].as_f64().unwrap(),
        job["runtime_s"].as_f64().unwrap(),
    );
    assert!(ios > 0.0 && secs > 0.5 && secs < 20.0, "{job}");
    let iops = job["iops"].as_f64().unwrap();
    assert!((iops - ios / secs).abs() <= 1e-6 * iops, "{job}");
    assert_eq!(j["partial"], true);
}

#[test]
fn target_logs_a_clean_shutdown_and_why_it_refused_a_connect() {
    let t = LiveTarget::start(&["--null", "64M"]);
    let o = bench(&t, &["--runtime", "200ms"]);
    assert!(o.status.success(), "{}", stderr(&o));
    if let Err(log) = t.wait_log("controller torn down: clean shutdown by the host") {
        panic!("no clean-shutdown line:\n{log}");
    }
    let o = bench(
        &t,
        &["--runtime", "200ms", "--nqn", "nqn.2026-11.io.x:nosuch"],
    );
    assert_refused(
        &o,
        &[
            "nqn.2026-11.io.x:nosuch",
            "no such subsystem",
            "check --nqn",
        ],
    );
    if let Err(log) = t.wait_log("connect refused: no such subsystem") {
        panic!("no refusal line:\n{log}");
    }
}

#[test]
fn an_io_connect_to_a_discovery_only_port_is_explained_on_both_sides() {
    let t = LiveTarget::start_config(
        "[[listener]]\naddr = \"127.0.0.1:0\"\nkind = \"discovery\"\n\n\
         [[subsystem]]\nnqn = \"nqn.2026-11.io.trellis:default\"\n\n\
         [[subsystem.namespace]]\nbackend = \"null\"\nsize = \"64M\"\n",
    );
    let o = bench(&t, &["--runtime", "200ms"]);
    assert_refused(
        &o,
        &["no such subsystem on this port", "discovery-only port"],
    );
    if let Err(log) = t.wait_log("subsystem not exposed on a discovery-only port") {
        panic!("no refusal line:\n{log}");
    }
}

/// Issue 32: `/metrics` on a wildcard address serves anyone who reaches
/// the port, so the target warns at start and names the fix; on loopback
/// it only says where it serves.
#[test]
fn metrics_on_a_wildcard_address_warns_and_names_the_fix() {
    const WARNING: &str =
        "a wildcard address serves anyone who reaches this port; bind 127.0.0.1, or set [metrics] bearer_token_file";
    let t = LiveTarget::start(&["--ram", "16M", "--metrics", "0.0.0.0:0"]);
    if let Err(log) = t.wait_log(WARNING) {
        panic!("no wildcard warning:\n{log}");
    }
    let line = t
        .log()
        .lines()
        .find(|l| l.contains(WARNING))
        .unwrap()
        .to_string();
    assert!(line.contains("WARN"), "a warning: {line}");
    assert!(
        line.contains("http://0.0.0.0:"),
        "it names the address: {line}"
    );
    let t = LiveTarget::start(&["--ram", "16M", "--metrics", "127.0.0.1:0"]);
    if let Err(log) = t.wait_log("metrics on http://127.0.0.1:") {
        panic!("no metrics line:\n{log}");
    }
    assert!(
        !t.log().contains("wildcard"),
        "no warning on loopback:\n{}",
        t.log()
    );
}

#[test]
fn a_host_not_on_the_allow_list_is_told_how_to_fix_it() {
    let t = LiveTarget::start(&["--null", "64M", "--allow-host", "nqn.2026-11.io.x:only"]);
    let o = bench(&t, &["--runtime", "200ms"]);
    assert_refused(&o, &["does not allow host", "--allow-host"]);
    if let Err(log) = t.wait_log("connect refused: host not allowed") {
        panic!("no refusal line:\n{log}");
    }
}

#[test]
fn bench_help_lists_values_and_defaults() {
    let help = stdout(&trellis(&["bench", "--help"]));
    for want in [
        "randread (default)",
        "4k (default)",
        "default 1",
        "default 127.0.0.1:4420",
    ] {
        assert!(help.contains(want), "{want:?} missing:\n{help}");
    }
}

#[test]
fn with_credits_the_bench_keeps_to_the_targets_io_credits() {
    // Gimbal alone on a null namespace (no drive: only its rate ceiling is
    // lifted): 8 slots of 128 KiB, so a 64 KiB reader is granted 8 × 2 = 16
    // credits (docs/gimbal.md §1.e).
    let t = LiveTarget::start(&["--null", "64M", "--qos", "gimbal"]);
    let d = tempfile::tempdir().unwrap();
    let json = d.path().join("c.json");
    let run = |extra: &[&str]| {
        let mut a = vec![
            "--rw",
            "randread",
            "--bs",
            "64k",
            "--iodepth",
            "64",
            "--runtime",
            "300ms",
            "--json",
            json.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        let o = bench(&t, &a);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        (v["jobs"][0].clone(), stdout(&o))
    };
    let (j, out) = run(&["--credits"]);
    assert!(
        out.contains("I/O credits from the target: last 16, lowest 16"),
        "{out}"
    );
    assert_eq!(j["credits"], true);
    assert_eq!(j["io_credits_last"], 16, "{j}");
    assert!(
        j["credit_busy"].as_u64().unwrap() > 0,
        "iodepth 64 > 16 credits: {j}"
    );
    assert!(j["ios"].as_u64().unwrap() > 0);
    // Without --credits nothing is asked: no credit seen, never held back.
    let (j, out) = run(&[]);
    assert!(!out.contains("I/O credits"), "{out}");
    assert_eq!(j["credits"], false);
    assert!(j["io_credits_last"].is_null(), "{j}");
    assert_eq!(j["credit_busy"], 0);
}

#[test]
fn with_credits_against_a_target_without_qos_iodepth_applies() {
    let t = LiveTarget::start(&["--null", "64M"]);
    let d = tempfile::tempdir().unwrap();
    let json = d.path().join("c.json");
    let o = bench(
        &t,
        &[
            "--credits",
            "--iodepth",
            "8",
            "--runtime",
            "200ms",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["jobs"][0]["io_credits_last"].is_null(), "{v}");
    assert_eq!(v["jobs"][0]["credit_busy"], 0);
}

/// Runs `trellis bench ARGS --json` (no target address: `--replicas` names
/// them) and returns its first job's JSON.
#[test]
fn a_replicated_volume_writes_every_replica_and_verifies_reads_from_each() {
    // Two targets, each a file: after a replicated write-and-verify run both
    // files hold the same bytes (every write reached both), and the
    // verifying read-back drew from both replicas.
    let d = tempfile::tempdir().unwrap();
    let (fa, fb) = (d.path().join("a.img"), d.path().join("b.img"));
    let start = |f: &std::path::Path| {
        LiveTarget::start(&["--file", f.to_str().unwrap(), "--file-size", "4M"])
    };
    let (a, b) = (start(&fa), start(&fb));
    let replicas = format!("{},{}", a.addr(), b.addr());
    let j = bench_json(&[
        "--replicas",
        &replicas,
        "--replica-read",
        "round-robin",
        "--rw",
        "write",
        "--bs",
        "16k",
        "--size",
        "2m",
        "--iodepth",
        "8",
        "--verify",
        "--runtime",
        "300ms",
    ]);
    assert_eq!(j["verify_failures"], 0, "{j}");
    assert!(j["verified_blocks"].as_u64().unwrap() > 0, "{j}");
    let reads: Vec<u64> = (0..2)
        .map(|i| j["replicas"][i]["reads"].as_u64().unwrap())
        .collect();
    assert!(
        reads[0] > 0 && reads[1] > 0,
        "read-back used one replica: {j}"
    );
    assert_eq!(j["replica_read"], "round-robin");
    drop((a, b));
    let (x, y) = (std::fs::read(&fa).unwrap(), std::fs::read(&fb).unwrap());
    assert!(x[..2 << 20].iter().any(|&v| v != 0), "nothing was written");
    assert!(x[..2 << 20] == y[..2 << 20], "the replicas differ");
}

#[test]
fn headroom_reads_go_to_the_replica_with_room_and_round_robin_alternates() {
    // Replica A answers at once (null); replica B is an emulated drive
    // slowed 64× (a 64 KiB read takes ~6 ms), so B's commands stay in
    // flight and its room (queue depth − in flight; neither sends credits)
    // shrinks: headroom keeps the two replicas' commands in flight level, so
    // each serves reads in proportion to its speed. Round-robin alternates.
    let a = LiveTarget::start(&["--null", "64M"]);
    let b = LiveTarget::start(&["--emulated", "64M", "--time-scale", "64"]);
    let replicas = format!("{},{}", a.addr(), b.addr());
    let run = |policy: &str| {
        let j = bench_json(&[
            "--replicas",
            &replicas,
            "--replica-read",
            policy,
            "--bs",
            "64k",
            "--iodepth",
            "32",
            "--runtime",
            "300ms",
        ]);
        let r: Vec<u64> = (0..2)
            .map(|i| j["replicas"][i]["reads"].as_u64().unwrap())
            .collect();
        (r[0], r[1], j)
    };
    let (ra, rb, j) = run("headroom");
    assert_eq!(j["credits"], true, "headroom asks for credits: {j}");
    // About 10:1 on a quiet machine; with two test runs at once on two vCPUs
    // the null replica is CPU-starved too and it fell to 3.97:1 once, so the
    // bound is 2:1, still far from round-robin's exact alternation below.
    assert!(ra > 2 * rb && rb > 0, "headroom: A {ra} vs B {rb}: {j}");
    let (ra, rb, j) = run("round-robin");
    assert!(ra.abs_diff(rb) <= 1, "round-robin: A {ra} vs B {rb}: {j}");
}

/// A TCP forwarder standing in for one network path to a target: every
/// connection to `addr` is relayed to `upstream` until [`PathProxy::cut`],
/// which closes every relayed connection and refuses new ones (a pulled
/// cable, as the host sees it).
struct PathProxy {
    addr: std::net::SocketAddr,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl PathProxy {
    fn start(upstream: std::net::SocketAddr) -> PathProxy {
        Self::start_delayed(upstream, Duration::ZERO)
    }

    /// As `start`, with every chunk of the target's responses held for
    /// `delay` (a longer or busier path).
    fn start_delayed(upstream: std::net::SocketAddr, delay: Duration) -> PathProxy {
        use std::sync::atomic::Ordering;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c2, k2) = (cut.clone(), conns.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(down) = s else { continue };
                if c2.load(Ordering::SeqCst) {
                    continue; // dropped: the connection is refused
                }
                let Ok(up) = std::net::TcpStream::connect(upstream) else {
                    continue;
                };
                let _ = (down.set_nodelay(true), up.set_nodelay(true));
                let mut k = k2.lock().unwrap();
                k.push(down.try_clone().unwrap());
                k.push(up.try_clone().unwrap());
                drop(k);
                for (mut a, mut b, d) in [
                    (
                        down.try_clone().unwrap(),
                        up.try_clone().unwrap(),
                        Duration::ZERO,
                    ),
                    (up, down, delay),
                ] {
                    std::thread::spawn(move || {
                        use std::io::{Read, Write};
                        let mut buf = vec![0u8; 1 << 16];
                        while let Ok(n @ 1..) = a.read(&mut buf) {
                            if !d.is_zero() {
                                std::thread::sleep(d);
                            }
                            if b.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = b.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        PathProxy { addr, cut, conns }
    }

    fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// The cable is back: new connections are relayed again.
    fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_multipath_volume_spreads_commands_over_its_paths_and_verifies() {
    let t = LiveTarget::start(&["--ram", "64M"]);
    let (p1, p2) = (PathProxy::start(t.addr), PathProxy::start(t.addr));
    let paths = format!("{},{}", p1.addr, p2.addr);
    for policy in ["round-robin", "queue-depth"] {
        let j = bench_json(&[
            "--paths",
            &paths,
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
        assert_eq!(j["path_policy"], policy, "{j}");
        let ios: Vec<u64> = (0..2)
            .map(|i| j["paths"][i]["ios"].as_u64().unwrap())
            .collect();
        assert!(
            ios[0] > 100 && ios[1] > 100,
            "{policy}: a path carried nothing: {j}"
        );
        assert_eq!(j["path_failures"], 0, "{j}");
        assert!(j.get("replicas").is_none(), "paths are not replicas: {j}");
    }
}

#[test]
fn losing_a_path_under_verified_load_moves_its_commands_loses_nothing_and_reopens_it() {
    let t = LiveTarget::start(&["--ram", "64M"]);
    let (p1, p2) = (PathProxy::start(t.addr), PathProxy::start(t.addr));
    let d = tempfile::tempdir().unwrap();
    let json = d.path().join("r.json");
    let paths = format!("{},{}", p1.addr, p2.addr);
    let child = Command::new(bin())
        .args([
            "bench",
            "--no-progress",
            "--json",
            json.to_str().unwrap(),
            "--paths",
            &paths,
            "--rw",
            "randrw",
            "--bs",
            "4k",
            "--size",
            "8m",
            "--iodepth",
            "32",
            "--verify",
            "--runtime",
            "3",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    p2.cut();
    std::thread::sleep(Duration::from_millis(600));
    p2.restore();
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "the run failed although a path lived: {}",
        stderr(&o)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let j = &v["jobs"][0];
    assert_eq!(
        (j["errors"].as_u64(), j["verify_failures"].as_u64()),
        (Some(0), Some(0)),
        "{j}"
    );
    assert!(j["verified_blocks"].as_u64().unwrap() > 0, "{j}");
    assert_eq!(j["paths"][1]["failed"], true, "{j}");
    assert_eq!(j["paths"][0]["failed"], false, "{j}");
    assert!(j["path_failures"].as_u64().unwrap() >= 1, "{j}");
    // QD32 over two paths: the cut path had commands out, and they were re-sent.
    assert!(j["path_retries"].as_u64().unwrap() > 0, "{j}");
    assert!(
        stdout(&o).contains("re-sent on another path"),
        "{}",
        stdout(&o)
    );
    // The restored path was re-opened in the background and carried I/O again.
    assert!(j["paths"][1]["reconnects"].as_u64().unwrap() >= 1, "{j}");
    assert!(
        j["paths"][1]["ios_since_reconnect"].as_u64().unwrap() > 100,
        "{j}"
    );
    assert!(stdout(&o).contains("re-opened"), "{}", stdout(&o));
    p2.cut();
    // A path down at the start: the run starts on the other one (as Linux
    // does) and keeps trying it; nothing fails.
    let d = tempfile::tempdir().unwrap();
    let json = d.path().join("start.json");
    let o = trellis_within(
        &[
            "bench",
            "--no-progress",
            "--paths",
            &format!("{},{}", p1.addr, p2.addr),
            "--runtime",
            "1",
            "--verify",
            "--json",
            json.to_str().unwrap(),
        ],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is down at the start"),
        "{}",
        stderr(&o)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let j = &v["jobs"][0];
    assert_eq!(j["errors"], 0, "{j}");
    assert_eq!(j["paths"][1]["failed"], true, "{j}");
    assert_eq!(j["paths"][1]["ios"], 0, "{j}");
    assert!(j["paths"][0]["ios"].as_u64().unwrap() > 100, "{j}");
    // Every path down at the start: refused at once, not a hang.
    p1.cut();
    let o = trellis_within(
        &[
            "bench",
            "--no-progress",
            "--paths",
            &format!("{},{}", p1.addr, p2.addr),
            "--runtime",
            "1",
        ],
        Duration::from_secs(30),
    );
    assert_refused(&o, &["every path of job", "is down"]);
}

#[test]
fn paths_to_different_namespaces_are_refused_before_any_io() {
    let (a, b) = (
        LiveTarget::start(&["--ram", "64M"]),
        LiveTarget::start(&["--ram", "64M"]),
    );
    let o = trellis(&[
        "bench",
        "--paths",
        &format!("{},{}", a.addr(), b.addr()),
        "--runtime",
        "1",
    ]);
    assert_refused(
        &o,
        &[
            "reaches a different namespace",
            "--paths must name addresses of one namespace",
        ],
    );
    for (args, want) in [
        (vec!["--paths", "127.0.0.1:1"], "give 2 to 8"),
        (
            vec!["--paths", "127.0.0.1:1,127.0.0.1:1"],
            "names 127.0.0.1:1 twice",
        ),
        (
            vec!["--paths", "127.0.0.1:1,127.0.0.1:2/nqn.x"],
            "names a subsystem",
        ),
        (
            vec![
                "--paths",
                "127.0.0.1:1,127.0.0.1:2",
                "--path-policy",
                "fastest",
            ],
            "--path-policy \"fastest\"",
        ),
        (vec!["--path-policy", "queue-depth"], "needs --paths"),
        (vec!["--path-rate", "1gbit"], "give --paths"),
        (
            vec!["--paths", "127.0.0.1:1,127.0.0.1:2", "--path-rate", "1g"],
            "kbit, mbit or gbit",
        ),
        (
            vec![
                "--paths",
                "127.0.0.1:1,127.0.0.1:2",
                "--path-rate",
                "500kbit",
            ],
            "give 1mbit to 400gbit",
        ),
        (
            vec![
                "--paths",
                "127.0.0.1:1,127.0.0.1:2",
                "--addr",
                "127.0.0.1:3",
            ],
            "--paths with --addr",
        ),
    ] {
        let mut a = vec!["bench"];
        a.extend(args.iter().copied());
        assert_refused(&trellis(&a), &[want]);
    }
}

#[test]
fn isr_path_choice_sends_less_to_the_slower_path_than_round_robin() {
    // Path 2's relay holds each chunk of responses 2 ms: round-robin still
    // splits commands evenly, ISR (shortest expected delay from measured round
    // trips) sends most of them to the fast path, and both verify clean. With
    // two test runs at once a 300 µs hold gave 0.35 once: the starved relays
    // slowed the fast path too; 2 ms keeps the paths apart on a loaded machine.
    let t = LiveTarget::start(&["--ram", "64M"]);
    let fast = PathProxy::start(t.addr);
    let slow = PathProxy::start_delayed(t.addr, Duration::from_millis(2));
    let paths = format!("{},{}", fast.addr, slow.addr);
    let share = |policy: &str| {
        let j = bench_json(&[
            "--paths",
            &paths,
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
            "1",
        ]);
        assert_eq!(
            (j["errors"].as_u64(), j["verify_failures"].as_u64()),
            (Some(0), Some(0)),
            "{j}"
        );
        let ios: Vec<f64> = (0..2)
            .map(|i| j["paths"][i]["ios"].as_f64().unwrap())
            .collect();
        (ios[1] / (ios[0] + ios[1]), j)
    };
    let (rr, j) = share("round-robin");
    assert!(
        (rr - 0.5).abs() < 0.02,
        "round-robin share of the slow path {rr}: {j}"
    );
    let (isr, j) = share("isr");
    assert!(
        isr < 0.3 && isr > 0.0,
        "isr share of the slow path {isr}: {j}"
    );
    assert_eq!(j["path_policy"], "isr", "{j}");
    eprintln!("slow-path share: round-robin {rr:.3}, isr {isr:.3}");
}

#[test]
fn path_rate_reserves_read_responses_and_holds_reads_only_when_the_paths_are_full() {
    // Two 10 Mbit/s paths admit about one 4 KiB read each at a time (its
    // response needs 3.3 ms of the path), so at depth 32 reads wait in the
    // host; at 400 Gbit/s the same load always finds room. Either way every
    // read is verified and both paths carry reads.
    let t = LiveTarget::start(&["--ram", "64M"]);
    let (p1, p2) = (PathProxy::start(t.addr), PathProxy::start(t.addr));
    let paths = format!("{},{}", p1.addr, p2.addr);
    let run = |rate: &str| {
        let j = bench_json(&[
            "--paths",
            &paths,
            "--path-policy",
            "isr",
            "--path-rate",
            rate,
            "--rw",
            "randrw",
            "--bs",
            "4k",
            "--size",
            "8m",
            "--iodepth",
            "32",
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
        for i in 0..2 {
            assert!(
                j["paths"][i]["ios"].as_u64().unwrap() > 0,
                "path {i} idle: {j}"
            );
        }
        j
    };
    let slow = run("10mbit");
    assert_eq!(slow["path_rate_bytes_per_s"], 1_250_000, "{slow}");
    assert!(slow["reserve_waits"].as_u64().unwrap() > 0, "{slow}");
    let fast = run("400gbit");
    assert_eq!(fast["reserve_waits"], 0, "{fast}");
    let plain = bench_json(&[
        "--paths",
        &paths,
        "--bs",
        "4k",
        "--size",
        "8m",
        "--runtime",
        "200ms",
    ]);
    assert!(plain.get("reserve_waits").is_none(), "{plain}");
}

/// A target whose only listener requires TLS, and whose one allowed host has a
/// TLS key and a DH-HMAC-CHAP secret.
const SECURE_TARGET: &str = r#"
[[listener]]
addr = "127.0.0.1:0"
secure_channel = "required"

[[subsystem]]
nqn = "nqn.2026-11.io.trellis:secure"

[[subsystem.host]]
nqn = "nqn.2026-11.io.trellis:bench-host"
tls_key = "NVMeTLSkey-1:01:Ggh0ZeTr4gtcM5ttLtzjFKTkCEGwn/dvDUPXq4L9i7yv4BH+:"
dhchap_secret = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"

[[subsystem.namespace]]
backend = "ram"
size = "64MiB"
"#;

#[test]
fn tls_key_and_dhchap_secret_run_verified_io_over_a_secure_channel() {
    let t = LiveTarget::start_config(SECURE_TARGET);
    let common = [
        "--nqn",
        "nqn.2026-11.io.trellis:secure",
        "--hostnqn",
        "nqn.2026-11.io.trellis:bench-host",
        "--rw",
        "randrw",
        "--bs",
        "16k",
        "--iodepth",
        "8",
        "--runtime",
        "500ms",
        "--verify",
    ];
    let mut a = common.to_vec();
    a.extend([
        "--tls-key",
        "NVMeTLSkey-1:01:Ggh0ZeTr4gtcM5ttLtzjFKTkCEGwn/dvDUPXq4L9i7yv4BH+:",
        "--dhchap-secret",
        "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
    ]);
    let o = bench(&t, &a);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("ok"), "{}", stdout(&o));
    t.wait_log("TLS 1.3 established").unwrap();
    // Without the key the required listener closes the connection.
    let o = bench(&t, &common);
    assert!(
        !o.status.success(),
        "a plain bench ran on a TLS-required listener"
    );
}

const BIDIRECTIONAL_TARGET: &str = r#"
[[listener]]
addr = "127.0.0.1:0"

[[subsystem]]
nqn = "nqn.2026-11.io.trellis:secure"

[[subsystem.host]]
nqn = "nqn.2026-11.io.trellis:bench-host"
dhchap_secret = "DHHC-1:01:NR5My74p5ZqEnJGSMmuiPqAJFFgTb7QjxYtSk7OcR6NnZKX+:"
dhchap_ctrl_secret = "DHHC-1:02:GdMihILgYzDrUyM1H1sKPffNn6d7ktv5X087UjJ3+e/U5vYU014/D09KPicROBVhTFn6dQ==:"

[[subsystem.namespace]]
backend = "ram"
size = "64MiB"
"#;

#[test]
fn dhchap_ctrl_secret_authenticates_the_controller_and_refuses_a_wrong_one() {
    let t = LiveTarget::start_config(BIDIRECTIONAL_TARGET);
    let host_secret = "DHHC-1:01:NR5My74p5ZqEnJGSMmuiPqAJFFgTb7QjxYtSk7OcR6NnZKX+:";
    let run = |ctrl_secret: &str| {
        bench(
            &t,
            &[
                "--nqn",
                "nqn.2026-11.io.trellis:secure",
                "--hostnqn",
                "nqn.2026-11.io.trellis:bench-host",
                "--rw",
                "randrw",
                "--bs",
                "4k",
                "--iodepth",
                "4",
                "--runtime",
                "300ms",
                "--verify",
                "--dhchap-secret",
                host_secret,
                "--dhchap-ctrl-secret",
                ctrl_secret,
            ],
        )
    };
    let o =
        run("DHHC-1:02:GdMihILgYzDrUyM1H1sKPffNn6d7ktv5X087UjJ3+e/U5vYU014/D09KPicROBVhTFn6dQ==:");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("ok"), "{}", stdout(&o));
    t.wait_log("queue authenticated (DH-HMAC-CHAP)").unwrap();
    // The target proves a secret it does not have: the host refuses it
    // (AUTH_Failure2), so the flag really reaches every queue's exchange.
    let o = run("DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:");
    assert!(
        !o.status.success(),
        "a wrong controller secret was accepted"
    );
    assert!(
        stderr(&o).contains("the host refused the controller"),
        "{}",
        stderr(&o)
    );
    t.wait_log("host reported authentication failure").unwrap();
}

#[test]
fn malformed_tls_keys_and_secrets_are_refused_before_connecting() {
    for (args, needles) in [
        (
            &["--tls-key", "bogus"][..],
            &["--tls-key", "NVMeTLSkey-1"][..],
        ),
        (
            &["--dhchap-secret", "DHHC-1:00:xx:"],
            &["--dhchap-secret", "DHHC-1"],
        ),
        (
            &["--dhchap-ctrl-secret", "DHHC-1:00:xx:"],
            &["--dhchap-ctrl-secret", "DHHC-1"],
        ),
        (
            &[
                "--dhchap-ctrl-secret",
                "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
            ],
            &["--dhchap-ctrl-secret needs --dhchap-secret"],
        ),
        (
            &["--tls-derivation", "x"],
            &["--tls-derivation", "libnvme-compat"],
        ),
    ] {
        let mut a = vec!["bench", "--addr", "127.0.0.1:1"];
        a.extend_from_slice(args);
        let o = trellis(&a);
        assert_refused(&o, needles);
        assert_one_line(&o);
    }
}
