//! Interop fixes found with initiators we did not write (SPDK's perf and
//! identify, Linux nvme-cli): each test names the behaviour a peer relies on.

mod common;
use common::*;
use std::net::SocketAddr;
use trellis_nvme::fabrics::CNTLID_DYNAMIC;
use trellis_nvme::pdu::Digests;
use trellis_target::config::{Config, ListenerConfig};

const NO: Digests = Digests {
    header: false,
    data: false,
};

/// The embedded default configuration on an ephemeral loopback port.
fn default_config() -> Config {
    let mut cfg = Config::embedded_default();
    cfg.listeners = vec![ListenerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: None,
    }];
    cfg.subsystems[0].namespaces[0].size = Some(trellis_target::config::ByteSize(64 << 20));
    cfg
}

/// Admin Connect, enable, and `ios` I/O queues, as host `hostnqn`.
fn controller_as(addr: SocketAddr, subnqn: &str, hostnqn: &str, ios: u16) -> Ctrl {
    let mut admin = Queue::open(addr, NO);
    let c = admin.fabrics_connect(0, 31, subnqn, hostnqn, CNTLID_DYNAMIC, 5000);
    assert!(c.status.is_success(), "admin connect: {:?}", c.status);
    let cntlid = c.dw0 as u16;
    assert!(admin.prop_set(0x14, 0x0046_0001).status.is_success());
    let mut io = Vec::new();
    for qid in 1..=ios {
        let mut q = Queue::open(addr, NO);
        let c = q.fabrics_connect(qid, 127, subnqn, hostnqn, cntlid, 0);
        assert!(
            c.status.is_success(),
            "I/O connect qid {qid}: {:?}",
            c.status
        );
        io.push(q);
    }
    Ctrl { admin, io, cntlid }
}

// ---------------------------------------------------------------- 1. empty host NQN

use std::sync::{Mutex, OnceLock};
use trellis_nvme::status::specific;

#[test]
fn empty_host_nqn_connects_where_any_host_is_allowed() {
    let t = trellis_target::Target::start(&default_config()).unwrap();
    let nqn = trellis_target::config::DEFAULT_NQN;
    // SPDK's spdk_nvme_perf sends an all-zero host NQN unless given one.
    let mut c = controller_as(t.local_addrs[0], nqn, "", 1);
    let data = pattern(0, 16, 3);
    assert!(write(&mut c.io[0], 0, &data).status.is_success());
    assert_eq!(read(&mut c.io[0], 0, 16).1, data);
    t.stop();
}

#[test]
fn empty_host_nqn_is_refused_by_an_allow_list() {
    let t = start_target();
    let mut q = Queue::open(t.local_addrs[0], NO);
    let c = q.fabrics_connect(0, 31, NQN, "", CNTLID_DYNAMIC, 0);
    assert_eq!(
        c.status,
        specific::CONNECT_INVALID_HOST.dnr(),
        "an empty host NQN is never on an allow-list"
    );
    t.stop();
}

/// Log lines of this test binary, captured from every thread.
fn captured_log() -> &'static Mutex<Vec<u8>> {
    static LOG: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let log = LOG.get_or_init(|| Mutex::new(Vec::new()));
    INSTALLED.get_or_init(|| {
        struct W;
        impl std::io::Write for W {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                LOG.get().unwrap().lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(|| W)
            .init();
    });
    log
}

/// Waits (up to 5 s) for a log line containing every one of `parts`.
fn wait_for_line(parts: &[&str]) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let text = String::from_utf8_lossy(&captured_log().lock().unwrap()).into_owned();
        if let Some(l) = text.lines().find(|l| parts.iter().all(|p| l.contains(p))) {
            return l.to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no log line with {parts:?} in:\n{text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn every_connect_refusal_is_logged_at_info_with_reason_host_subsystem_and_peer() {
    captured_log();
    let t = start_target();
    let addr = t.local_addrs[0];
    let cases: [(&str, &str, u16, u16, &str); 4] = [
        (
            "nqn.2026-11.io.trellis:missing",
            "nqn.2014-08.org.example:r1",
            0,
            CNTLID_DYNAMIC,
            "no such subsystem",
        ),
        (
            NQN,
            "nqn.2014-08.org.example:r2",
            0,
            CNTLID_DYNAMIC,
            "host not allowed",
        ),
        (NQN, HOST, 1, 999, "no live controller"),
        (NQN, HOST, 0, 7, "static controller"),
    ];
    for (subnqn, host, qid, cntlid, why) in cases {
        let mut q = Queue::open(addr, NO);
        let peer = q.s.local_addr().unwrap().to_string();
        let c = q.fabrics_connect(qid, 31, subnqn, host, cntlid, 0);
        assert!(!c.status.is_success(), "{why}: refused");
        let line = wait_for_line(&["connect refused", why, host, subnqn, &peer]);
        assert!(line.contains("INFO"), "logged at info: {line}");
    }
    t.stop();
}

