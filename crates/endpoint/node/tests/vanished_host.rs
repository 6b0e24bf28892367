//! Finding (issue 32, high 2): "an I/O controller with KATO 0 is never
//! reaped". A host that vanishes (power loss, a partition) sends neither a
//! FIN nor keep-alives; with KATO 0 nothing on the NVMe side ends its
//! controller, which keeps its queues, buffers and connection slots until
//! the node stops. TCP keepalive on every accepted connection
//! (`target.tcp_keepalive_*`) ends it.
//!
//! The host's disappearance is real, not simulated in the target: an
//! nftables table of the test's own drops every packet to and from the
//! host's source address (127.0.0.3), so the target's probes go
//! unanswered, as with a host that lost power. Needs root and `nft`;
//! without them the test says so and passes, unless
//! TRELLIS_REQUIRE_PARTITIONS=1 (as in CI, whose .ci/run installs nftables).

mod common;
use common::*;
use std::time::{Duration, Instant};
use trellis_node::config::{BackendKind, NamespaceConfig};
use trellis_nvme::fabrics::CNTLID_DYNAMIC;
use trellis_nvme::pdu::Digests;

fn nft(args: &str) -> Result<(), String> {
    let out = std::process::Command::new("nft")
        .arg(args)
        .output()
        .map_err(|e| format!("nft: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "nft {args}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Drops everything to and from `ip` until dropped.
struct Blackhole(String);

impl Blackhole {
    fn new(ip: &str, tag: &str) -> Result<Blackhole, String> {
        let t = format!("trellis_vanish_{}_{tag}", std::process::id());
        nft(&format!("add table inet {t}"))?;
        let b = Blackhole(t);
        nft(&format!(
            "add chain inet {} out {{ type filter hook output priority 0 ; }}",
            b.0
        ))?;
        for dir in ["saddr", "daddr"] {
            nft(&format!("add rule inet {} out ip {dir} {ip} drop", b.0))?;
        }
        Ok(b)
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        let _ = nft(&format!("delete table inet {}", self.0));
    }
}

fn controllers(t: &trellis_node::Target) -> usize {
    let subs = t.reg.subsystems();
    subs.iter()
        .map(|s| s.controllers.lock().unwrap().len())
        .sum()
}

/// A host from `src` with an admin and an I/O queue, KATO 0; the queues
/// are returned so their sockets stay open (silent, not closed).
fn connect_kato0(addr: std::net::SocketAddr, src: std::net::Ipv4Addr) -> (Queue, Queue) {
    let mut admin = Queue::open_stream(connect_from(src, addr), Digests::default());
    let c = admin.fabrics_connect(0, 31, NQN, HOST, CNTLID_DYNAMIC, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
    assert!(admin.prop_set(0x14, 0x0046_0001).status.is_success());
    let mut io = Queue::open_stream(connect_from(src, addr), Digests::default());
    let ioc = io.fabrics_connect(1, 31, NQN, HOST, c.dw0 as u16, 0);
    assert!(ioc.status.is_success(), "{:?}", ioc.status);
    assert!(write(&mut io, 0, &pattern(0, 8, 1)).status.is_success());
    (admin, io)
}

/// Starts a target with keepalive `idle_s` (1 s interval, 2 probes; 0:
/// off), connects a KATO 0 host from `src`, makes it vanish, and returns
/// how long its connections and controller took to go (None: still there
/// after `wait`).
fn vanish(idle_s: u32, src: &str, wait: Duration) -> Option<Duration> {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.target.tcp_keepalive_idle_s = idle_s;
    cfg.target.tcp_keepalive_interval_s = 1;
    cfg.target.tcp_keepalive_probes = 2;
    let t = trellis_node::Target::start(&cfg).unwrap();
    let ip: std::net::Ipv4Addr = src.parse().unwrap();
    let _queues = connect_kato0(t.local_addrs[0], ip);
    assert_eq!(controllers(&t), 1);
    assert_eq!(t.reg.peer_budget().open_from(ip.into()), 2);
    let hole = Blackhole::new(src, &idle_s.to_string()).expect("nft");
    let t0 = Instant::now();
    let gone = loop {
        if controllers(&t) == 0 && t.reg.peer_budget().open_from(ip.into()) == 0 {
            break Some(t0.elapsed());
        }
        if t0.elapsed() > wait {
            let ss = std::process::Command::new("ss")
                .args(["-tnoi", "src", "127.0.0.1"])
                .output();
            eprintln!(
                "not gone: {} controllers, {} connections from {src}\n{}",
                controllers(&t),
                t.reg.peer_budget().open_from(ip.into()),
                ss.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default()
            );
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(hole);
    t.stop().unwrap();
    gone
}

#[test]
fn a_vanished_host_with_kato_0_is_reaped_by_tcp_keepalive() {
    if let Err(why) = Blackhole::new("127.0.0.254", "probe") {
        let required = std::env::var("TRELLIS_REQUIRE_PARTITIONS").is_ok_and(|v| v == "1");
        assert!(!required, "TRELLIS_REQUIRE_PARTITIONS=1 but {why}");
        eprintln!("vanished host: not run: {why} (needs root and nft)");
        return;
    }
    // Keepalive 1 s + 2 probes 1 s apart: dead after about 3 s.
    let reaped = vanish(1, "127.0.0.3", Duration::from_secs(10));
    let took = reaped.expect("the vanished host's controller was not reaped within 10 s");
    eprintln!("vanished host: connections and controller gone {took:?} after it vanished");
    assert!(
        took >= Duration::from_secs(2),
        "gone before the probes could fail: {took:?}"
    );
    // The control: without keepalive the same host's controller stays.
    let kept = vanish(0, "127.0.0.4", Duration::from_secs(5));
    assert_eq!(kept, None, "without keepalive the controller went anyway");
}
