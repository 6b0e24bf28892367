//! `/metrics`: a scrape parses as Prometheus text, its counters match the I/O
//! a test did, and the endpoint's failures are clear.
mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use trellis_node::config::{BackendKind, NamespaceConfig};
use trellis_nvme::pdu::Digests;

/// One HTTP/1.0 GET; (status code, body).
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let code = resp.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// The value of sample `name` whose labels include every (key, value) of `want`.
fn sample(scrape: &prometheus_parse::Scrape, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    scrape.samples.iter().find_map(|s| {
        let ok = s.metric == name && want.iter().all(|(k, v)| s.labels.get(k) == Some(*v));
        match (ok, &s.value) {
            (true, prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v)) => {
                Some(*v)
            }
            (true, prometheus_parse::Value::Untyped(v)) => Some(*v),
            _ => None,
        }
    })
}

/// The buckets of histogram `name` whose labels include every one of `want`.
fn histogram(
    scrape: &prometheus_parse::Scrape,
    name: &str,
    want: &[(&str, &str)],
) -> Vec<prometheus_parse::HistogramCount> {
    scrape
        .samples
        .iter()
        .find_map(|s| match &s.value {
            prometheus_parse::Value::Histogram(h)
                if s.metric == name && want.iter().all(|(k, v)| s.labels.get(k) == Some(*v)) =>
            {
                Some(h.clone())
            }
            _ => None,
        })
        .unwrap_or_default()
}

fn parse(body: &str) -> prometheus_parse::Scrape {
    let lines = body.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).expect("the scrape parses as Prometheus text")
}

#[test]
fn a_scrape_parses_and_its_counters_match_the_io_done() {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 16 << 20));
    cfg.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    let t = trellis_node::Target::start(&cfg).unwrap();
    let m = t.metrics_addr.expect("metrics address");
    let mut c = controller(t.local_addrs[0], NQN, 1, Digests::default(), 0);
    let q = &mut c.io[0];
    let (writes, reads, blocks) = (7u64, 5u64, 8usize);
    for i in 0..writes {
        assert!(write(q, i * 64, &pattern(i * 64, blocks, 1))
            .status
            .is_success());
    }
    for i in 0..reads {
        assert!(read(q, i * 64, blocks as u32).0.status.is_success());
    }
    // Reactors add their counts in batches, at most ~1 ms late: poll briefly.
    let ns = [("subsystem", NQN), ("nsid", "1")];
    let deadline = Instant::now() + Duration::from_secs(3);
    let scrape = loop {
        let (code, body) = get(m, "/metrics");
        assert_eq!(code, 200, "{body}");
        let s = parse(&body);
        let r = sample(&s, "trellis_namespace_read_commands_total", &ns);
        // The loop histogram is published about once a millisecond too.
        let loops = histogram(&s, "trellis_reactor_loop_seconds", &[("reactor", "0")]);
        let looped = loops
            .iter()
            .any(|b| b.less_than.is_infinite() && b.count >= (reads + writes) as f64);
        if (r == Some(reads as f64) && looped) || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let bytes = (blocks * 512) as f64;
    let want = [
        ("trellis_namespace_read_commands_total", reads as f64),
        ("trellis_namespace_write_commands_total", writes as f64),
        ("trellis_namespace_read_bytes_total", reads as f64 * bytes),
        ("trellis_namespace_write_bytes_total", writes as f64 * bytes),
        ("trellis_namespace_media_errors_total", 0.0),
        ("trellis_namespace_backend_errors_total", 0.0),
        ("trellis_namespace_size_bytes", (16 << 20) as f64),
    ];
    for (name, v) in want {
        assert_eq!(sample(&scrape, name, &ns), Some(v), "{name}");
    }
    // Every command lands in the latency histogram of its op: the +Inf
    // bucket (cumulative) counts them all, and all took under 10 s.
    for (op, n) in [("read", reads), ("write", writes)] {
        let labels = [("subsystem", NQN), ("nsid", "1"), ("op", op)];
        let h = histogram(&scrape, "trellis_namespace_latency_seconds", &labels);
        let all = h
            .iter()
            .find(|b| b.less_than.is_infinite())
            .map(|b| b.count);
        assert_eq!(all, Some(n as f64), "{op}: {h:?}");
        let under_10s = h
            .iter()
            .filter(|b| b.less_than <= 10.0)
            .map(|b| b.count)
            .fold(0.0, f64::max);
        assert_eq!(under_10s, n as f64, "{op}: {h:?}");
    }
    // The admin and I/O queues of this test's controller.
    assert_eq!(sample(&scrape, "trellis_connections", &[]), Some(2.0));
    let busy = sample(
        &scrape,
        "trellis_reactor_busy_seconds_total",
        &[("reactor", "0")],
    );
    assert!(busy.is_some_and(|b| b > 0.0), "reactor busy time {busy:?}");
    // Every loop that did work is in the loop-duration histogram.
    let loops = histogram(&scrape, "trellis_reactor_loop_seconds", &[("reactor", "0")]);
    let all = loops
        .iter()
        .find(|b| b.less_than.is_infinite())
        .map(|b| b.count);
    assert!(
        all.is_some_and(|n| n >= (reads + writes) as f64),
        "loops {loops:?}"
    );
    let rss = sample(&scrape, "trellis_process_resident_memory_bytes", &[]);
    assert!(rss.is_some_and(|r| r > 1e6), "rss {rss:?}");
    drop(c);
    t.stop().unwrap();
}

#[test]
fn the_endpoint_serves_only_get_metrics_and_is_off_unless_configured() {
    let t = start_target();
    assert_eq!(t.metrics_addr, None, "no [metrics] listen: no endpoint");
    t.stop().unwrap();
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    let t = trellis_node::Target::start(&cfg).unwrap();
    let m = t.metrics_addr.unwrap();
    assert_eq!(get(m, "/").0, 404);
    assert_eq!(get(m, "/metrics?x=1").0, 200);
    let mut s = TcpStream::connect(m).unwrap();
    write!(s, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(
        resp.starts_with("HTTP/1.0 405") || resp.starts_with("HTTP/1.1 405"),
        "{resp}"
    );
    t.stop().unwrap();
}

#[test]
fn a_taken_metrics_port_fails_the_start_and_names_the_address() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap();
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.metrics.listen = Some(addr);
    let err = trellis_node::Target::start(&cfg)
        .err()
        .expect("start must fail");
    assert!(
        err.to_string()
            .contains(&format!("cannot serve metrics on {addr}")),
        "{err}"
    );
}

const BOB: &str = "nqn.2026-11.io.trellis:test:bob";

#[test]
fn gimbal_state_and_each_tenants_completions_are_scraped() {
    let mut ns = NamespaceConfig::sized(BackendKind::Ram, 16 << 20);
    ns.qos = trellis_node::config::qos::QosMode::Gimbal;
    let mut cfg = test_config(ns);
    cfg.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.subsystems[0].allowed_hosts.push(BOB.into());
    cfg.tenants = vec![trellis_node::config::qos::TenantConfig {
        host: HOST.to_string(),
        name: "alice".into(),
        weight: 2,
    }];
    let t = trellis_node::Target::start(&cfg).unwrap();
    let m = t.metrics_addr.expect("metrics address");
    let bob = BOB;
    let mut a = controller(t.local_addrs[0], NQN, 1, Digests::default(), 0);
    let mut b = controller_as(t.local_addrs[0], NQN, bob, 1, Digests::default(), 0);
    let (a_writes, b_reads, blocks) = (6u64, 3u64, 8usize);
    for i in 0..a_writes {
        let w = write(&mut a.io[0], i * 64, &pattern(i * 64, blocks, 1));
        assert!(w.status.is_success());
    }
    for i in 0..b_reads {
        assert!(read(&mut b.io[0], i * 64, blocks as u32)
            .0
            .status
            .is_success());
    }
    // Published when the queue goes idle (or every 100 ms): poll briefly.
    let tenant = |name| {
        [
            ("subsystem", NQN),
            ("nsid", "1"),
            ("reactor", "0"),
            ("tenant", name),
        ]
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    let scrape = loop {
        let (code, body) = get(m, "/metrics");
        assert_eq!(code, 200, "{body}");
        let s = parse(&body);
        let done = sample(
            &s,
            "trellis_qos_tenant_completed_commands_total",
            &tenant(bob),
        );
        if done == Some(b_reads as f64) || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let bytes = (blocks * 512) as f64;
    for (name, cmds) in [("alice", a_writes), (bob, b_reads)] {
        let l = tenant(name);
        let c = sample(&scrape, "trellis_qos_tenant_completed_commands_total", &l);
        assert_eq!(c, Some(cmds as f64), "{name}");
        let by = sample(&scrape, "trellis_qos_tenant_completed_bytes_total", &l);
        assert_eq!(by, Some(cmds as f64 * bytes), "{name}");
        assert_eq!(
            sample(&scrape, "trellis_qos_tenant_in_flight", &l),
            Some(0.0),
            "{name}"
        );
        assert_eq!(
            sample(&scrape, "trellis_qos_tenant_queued", &l),
            Some(0.0),
            "{name}"
        );
        let cr = sample(&scrape, "trellis_qos_tenant_io_credits", &l);
        assert!(cr.is_some_and(|c| c >= 1.0), "{name}: credits {cr:?}");
    }
    let ns = [("subsystem", NQN), ("nsid", "1"), ("reactor", "0")];
    let rate = sample(&scrape, "trellis_qos_target_rate_bytes_per_second", &ns);
    assert!(rate.is_some_and(|r| r >= 50.0 * 1048576.0), "rate {rate:?}");
    let wc = sample(&scrape, "trellis_qos_write_cost", &ns);
    assert!(
        wc.is_some_and(|w| (1.0..=9.0).contains(&w)),
        "write cost {wc:?}"
    );
    // Writes and reads completed, so both directions have a state (1..=4).
    for op in ["read", "write"] {
        let l = [
            ("subsystem", NQN),
            ("nsid", "1"),
            ("reactor", "0"),
            ("op", op),
        ];
        let st = sample(&scrape, "trellis_qos_congestion_state", &l);
        assert!(st.is_some_and(|s| (1.0..=4.0).contains(&s)), "{op}: {st:?}");
    }
    drop((a, b));
    t.stop().unwrap();
}

/// Every `trellis_*` name in the queries of deploy/grafana/trellis-target.json.
fn dashboard_metrics() -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../deploy/grafana/trellis-target.json"
    );
    let text = std::fs::read_to_string(path).expect("the dashboard is in deploy/grafana");
    let d: serde_json::Value = serde_json::from_str(&text).expect("the dashboard parses as JSON");
    let mut names = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("expr");
            for (i, _) in expr.match_indices("trellis_") {
                let name: String = expr[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                // A histogram's series are read as name_bucket.
                names.push(name.trim_end_matches("_bucket").to_string());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

#[test]
fn every_metric_the_grafana_dashboard_queries_is_served() {
    let names = dashboard_metrics();
    assert!(names.len() >= 15, "{names:?}");
    let mut ns = NamespaceConfig::sized(BackendKind::Ram, 16 << 20);
    ns.qos = trellis_node::config::qos::QosMode::Gimbal;
    let mut cfg = test_config(ns);
    // A drive with health figures of its own, for the drive-health panels.
    let mut drive = NamespaceConfig::sized(BackendKind::Emulated, 16 << 20);
    drive.profile = Some("femu".into());
    cfg.subsystems[0].namespaces.push(drive);
    cfg.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    let t = trellis_node::Target::start(&cfg).unwrap();
    let m = t.metrics_addr.expect("metrics address");
    let mut c = controller(t.local_addrs[0], NQN, 1, Digests::default(), 0);
    assert!(write(&mut c.io[0], 0, &pattern(0, 8, 1))
        .status
        .is_success());
    assert!(read(&mut c.io[0], 0, 8).0.status.is_success());
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (code, body) = get(m, "/metrics");
        assert_eq!(code, 200, "{body}");
        let s = parse(&body);
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !s.samples.iter().any(|x| &x.metric == *n))
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dashboard queries metrics the target does not serve: {missing:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(c);
    t.stop().unwrap();
}

#[test]
fn closed_connections_are_counted_by_reason() {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    let t = trellis_node::Target::start(&cfg).unwrap();
    let m = t.metrics_addr.expect("metrics address");
    // A PDU type no host may send: the target answers C2HTermReq and closes.
    let mut s = TcpStream::connect(t.local_addrs[0]).unwrap();
    s.write_all(&[0x7f, 0, 8, 0, 8, 0, 0, 0]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert_eq!(buf.first(), Some(&0x03), "C2HTermReq first: {buf:?}");
    // A host that connects and goes away.
    drop(TcpStream::connect(t.local_addrs[0]).unwrap());
    let reason = |r| [("reason", r)];
    let deadline = Instant::now() + Duration::from_secs(3);
    let scrape = loop {
        let s = parse(&get(m, "/metrics").1);
        let peer = sample(
            &s,
            "trellis_connections_closed_total",
            &reason("peer_closed"),
        );
        if peer == Some(1.0) || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let n = |r| sample(&scrape, "trellis_connections_closed_total", &reason(r));
    assert_eq!(n("protocol_error"), Some(1.0));
    assert_eq!(n("peer_closed"), Some(1.0));
    assert_eq!(n("timeout"), Some(0.0));
    assert_eq!(n("transport_error"), Some(0.0));
    t.stop().unwrap();
}

/// The threads of this process (the target runs in it).
fn threads() -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Issue 32: `/metrics` (tiny_http) started one OS thread per open
/// connection, with no cap and no header timeout: 300 idle connections made
/// 300 threads. Now 300 idle connections add no thread (one server thread
/// serves all, with at most `MAX_CONNECTIONS` open), a scrape still works
/// while they are held, and with `bearer_token_file` a scrape without the
/// token is refused with 401.
#[test]
fn idle_metrics_connections_add_no_thread_and_scrapes_still_work() {
    let d = tempfile::tempdir().unwrap();
    let token = d.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.metrics.bearer_token_file = Some(token);
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.metrics_addr.unwrap();
    let before = threads();
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let during = threads();
    assert!(
        during <= before + 1,
        "threads {before} -> {during} with 300 idle connections"
    );
    // A scrape with the token is served meanwhile; one without it is not.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-token\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(
        resp.starts_with("HTTP/1.1 200"),
        "{}",
        &resp[..resp.len().min(200)]
    );
    assert!(resp.contains("trellis_uptime_seconds"));
    let (code, _) = get(addr, "/metrics");
    assert_eq!(code, 401, "a scrape without the token");
    eprintln!("threads: {before} before, {during} with 300 idle /metrics connections");
    drop(idle);
    t.stop().unwrap();
}

/// Issue 32: a `/metrics` connection that never finishes its request header
/// is closed after `HEADER_TIMEOUT` (2 s), and scrapes are served meanwhile
/// (tiny_http, before, kept such a connection and its thread forever).
#[test]
fn a_half_sent_request_header_is_closed_after_the_header_timeout() {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.metrics_addr.unwrap();
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let sent = Instant::now();
    write!(slow, "GET /metrics HTTP/1.1\r\nHost: x\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (code, body) = get(addr, "/metrics");
    assert_eq!(code, 200, "a scrape is served while the slow one waits");
    assert!(body.contains("trellis_uptime_seconds"));
    let mut b = [0u8; 64];
    let n = slow
        .read(&mut b)
        .expect("closed, not timed out on our side");
    let held = sent.elapsed();
    assert_eq!(n, 0, "closed without a response: {:?}", &b[..n]);
    let timeout = trellis_node::control::metrics_http::HEADER_TIMEOUT;
    assert!(
        held >= timeout.mul_f64(0.75) && held <= timeout * 3,
        "closed after {held:?}: the header timeout is {timeout:?}"
    );
    eprintln!("half-sent header closed after {held:?}");
    t.stop().unwrap();
}
