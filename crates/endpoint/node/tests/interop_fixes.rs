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

// ---------------------------------------------------------------- 2. discovery controllers

use trellis_nvme::fabrics::DISCOVERY_NQN;
use trellis_nvme::identify::IdCtrl;
use trellis_nvme::log::{self, GetLogPage};
use trellis_nvme::sqe::admin;
use trellis_nvme::status::generic;
use trellis_nvme::{Cqe, Sgl, Sqe};

fn identify(q: &mut Queue, cns: u8, nsid: u32) -> (Cqe, Vec<u8>) {
    let mut s = Sqe::new(admin::IDENTIFY, 0, nsid);
    s.set_cdw(10, cns as u32);
    q.cmd(s, &[], 4096, 0)
}

fn get_log(q: &mut Queue, lid: u8, nsid: u32, len: u64) -> (Cqe, Vec<u8>) {
    let s = GetLogPage {
        lid,
        lsp: 0,
        rae: false,
        len_bytes: len,
        offset_bytes: 0,
    }
    .to_sqe(0, nsid);
    q.cmd(s, &[], len as usize, 0)
}

fn features(q: &mut Queue, opcode: u8, fid: u8, value: u32) -> Cqe {
    let mut s = Sqe::new(opcode, 0, 0);
    s.set_cdw(10, fid as u32);
    s.set_cdw(11, value);
    q.cmd(s, &[], 0, 0).0
}

/// A ready discovery controller.
fn discovery(addr: SocketAddr) -> Queue {
    let mut q = Queue::open(addr, NO);
    let c = q.fabrics_connect(0, 31, DISCOVERY_NQN, HOST, CNTLID_DYNAMIC, 5000);
    assert!(c.status.is_success());
    assert!(q.prop_set(0x14, 1).status.is_success());
    q
}

#[test]
fn discovery_identify_promises_only_what_the_controller_serves() {
    let t = start_target();
    let mut q = discovery(t.local_addrs[0]);
    let (cqe, id) = identify(&mut q, 1, 0);
    assert!(cqe.status.is_success());
    let lpa = id[261];
    // Each advertised log page feature must be served (NVMe Base 2.0 §5.17.2).
    if lpa & 0x02 != 0 {
        let (cqe, _) = get_log(&mut q, log::lid::COMMANDS_EFFECTS, 0, 4096);
        assert!(
            cqe.status.is_success(),
            "LPA says Commands Supported and Effects is supported, but Get Log Page 05h fails: {:?}",
            cqe.status
        );
    }
    if lpa & 0x01 != 0 {
        let (cqe, _) = get_log(&mut q, log::lid::SMART, 1, 512);
        assert!(
            cqe.status.is_success(),
            "LPA bit 0 promises per-namespace SMART"
        );
    }
    if lpa & 0x20 != 0 {
        let (cqe, _) = get_log(&mut q, log::lid::SUPPORTED_LOGS, 0, 1024);
        assert!(cqe.status.is_success(), "LPA bit 5 promises LID 00h");
    }
    if trellis_nvme::le32(&id, 96) & 1 != 0 {
        let mut s = Sqe::new(admin::GET_FEATURES, 0, 0);
        s.set_cdw(10, 0x81);
        s.set_cdw(11, 1);
        let (cqe, _) = q.cmd(s, &[], 16, 0);
        assert!(
            cqe.status.is_success(),
            "CTRATT bit 0 promises the Host Identifier feature"
        );
    }
    // Fields that promise I/O-controller services nvmet's discovery controller
    // leaves zero: optional admin commands, firmware slots, error log entries,
    // NVM commands, write cache, abort.
    assert_eq!(trellis_nvme::le16(&id, 256), 0, "OACS");
    assert_eq!(id[258], 0, "ACL (Abort is not served)");
    assert_eq!(id[260], 0, "FRMW (no firmware slot log)");
    assert_eq!(id[262], 0, "ELPE");
    assert_eq!(trellis_nvme::le16(&id, 520), 0, "ONCS");
    assert_eq!(id[525], 0, "VWC");
    assert_eq!(IdCtrl::decode(&id).cntrltype, 2);
    t.stop();
}

#[test]
fn discovery_controller_serves_the_commands_nvmet_serves_and_refuses_the_rest() {
    let t = start_target();
    let mut q = discovery(t.local_addrs[0]);
    // Served by nvmet's discovery controller (drivers/nvme/target/discovery.c).
    assert!(
        identify(&mut q, 1, 0).0.status.is_success(),
        "Identify CNS 01h"
    );
    assert!(get_log(&mut q, log::lid::DISCOVERY, 0, 1024)
        .0
        .status
        .is_success());
    assert!(
        features(&mut q, admin::SET_FEATURES, 0x0F, 4000)
            .status
            .is_success(),
        "KATO"
    );
    let kato = features(&mut q, admin::GET_FEATURES, 0x0F, 0);
    assert!(kato.status.is_success());
    assert_eq!(kato.dw0, 4000);
    assert!(
        features(&mut q, admin::SET_FEATURES, 0x0B, 1 << 31)
            .status
            .is_success(),
        "AEC"
    );
    assert!(features(&mut q, admin::GET_FEATURES, 0x0B, 0)
        .status
        .is_success());
    assert!(q
        .cmd(Sqe::new(admin::KEEP_ALIVE, 0, 0), &[], 0, 0)
        .0
        .status
        .is_success());
    // Not served: I/O-controller identify, logs, features and commands.
    assert_eq!(
        identify(&mut q, 0, 1).0.status,
        generic::INVALID_FIELD.dnr()
    );
    assert_eq!(
        identify(&mut q, 2, 0).0.status,
        generic::INVALID_FIELD.dnr()
    );
    for lid in [0x00, 0x01, 0x02, 0x03, 0x05] {
        let st = get_log(&mut q, lid, 0, 512).0.status;
        assert_eq!(st, generic::INVALID_FIELD.dnr(), "log {lid:#x}");
    }
    let st = features(&mut q, admin::SET_FEATURES, 0x07, 0).status;
    assert_eq!(st, generic::INVALID_FIELD.dnr(), "Number of Queues");
    let st = q.cmd(Sqe::new(admin::ABORT, 0, 0), &[], 0, 0).0.status;
    assert_eq!(st, generic::INVALID_OPCODE.dnr(), "Abort");
    // An AER is held, not completed: the next command's completion comes first.
    let mut aer = Sqe::new(admin::ASYNC_EVENT_REQUEST, 0, 0);
    aer.set_cid(0x7777);
    aer.set_sgl(Sgl::transport(0));
    q.send_capsule(&aer, &[]);
    assert!(q
        .cmd(Sqe::new(admin::KEEP_ALIVE, 0, 0), &[], 0, 0)
        .0
        .status
        .is_success());
    t.stop();
}

