//! Interop fixes found with initiators we did not write (SPDK's perf and
//! identify, Linux nvme-cli): each test names the behaviour a peer relies on.

mod common;
use common::*;
use std::net::SocketAddr;
use trellis_node::config::{Config, ListenerConfig};
use trellis_nvme::fabrics::CNTLID_DYNAMIC;
use trellis_nvme::pdu::Digests;

const NO: Digests = Digests {
    header: false,
    data: false,
};

/// The embedded default configuration on an ephemeral loopback port.
fn default_config() -> Config {
    let mut cfg = Config::embedded_default();
    cfg.listeners = vec![ListenerConfig {
        name: None,
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: None,
        ana_state: None,
        secure_channel: None,
    }];
    cfg.subsystems[0].namespaces[0].size = Some(trellis_node::config::ByteSize(64 << 20));
    // The default's identity handling, in a directory of the tests' own.
    cfg.target.state_dir = Some(common::test_state_dir());
    cfg
}

/// Admin Connect, enable, and `ios` I/O queues, as host `hostnqn`.
fn controller_as(addr: SocketAddr, subnqn: &str, hostnqn: &str, ios: u16) -> Ctrl {
    common::controller_as(addr, subnqn, hostnqn, ios, NO, 5000)
}

// ---------------------------------------------------------------- 1. empty host NQN

use std::sync::{Mutex, OnceLock};
use trellis_nvme::status::specific;

#[test]
fn empty_host_nqn_connects_where_any_host_is_allowed() {
    let t = trellis_node::Target::start(&default_config()).unwrap();
    let nqn = trellis_node::config::DEFAULT_NQN;
    // SPDK's spdk_nvme_perf sends an all-zero host NQN unless given one.
    let mut c = controller_as(t.local_addrs[0], nqn, "", 1);
    let data = pattern(0, 16, 3);
    assert!(write(&mut c.io[0], 0, &data).status.is_success());
    assert_eq!(read(&mut c.io[0], 0, 16).1, data);
    t.stop().unwrap();
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
    t.stop().unwrap();
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
    // Refusals before the Connect handler runs are logged too: a command
    // before Connect, and Connect data offered through R2T.
    let mut q = Queue::open(addr, NO);
    let peer = q.s.local_addr().unwrap().to_string();
    let (c, _) = q.cmd(Sqe::new(admin::KEEP_ALIVE, 0, 0), &[], 0, 0);
    assert_eq!(c.status, generic::COMMAND_SEQUENCE_ERROR.dnr());
    let line = wait_for_line(&["connect refused", "only Connect may come first", &peer]);
    assert!(line.contains("INFO"), "logged at info: {line}");
    let mut q = Queue::open(addr, NO);
    let peer = q.s.local_addr().unwrap().to_string();
    let mut connect = trellis_nvme::fabrics::ConnectCmd {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    }
    .to_sqe(1);
    connect.set_sgl(Sgl::transport(1024));
    q.send_capsule(&connect, &[]);
    let p = q.recv().expect("a response, not an R2T");
    assert_eq!(p.bytes[0], trellis_nvme::pdu::PduType::CapsuleResp as u8);
    let c = Cqe::decode(&p.bytes[8..24]);
    assert_eq!(c.status, generic::COMMAND_SEQUENCE_ERROR.dnr());
    let line = wait_for_line(&["connect refused", "Connect data not in the capsule", &peer]);
    assert!(line.contains("INFO"), "logged at info: {line}");
    t.stop().unwrap();
}

/// `left_out=N` of a log line (0 when the field is missing).
fn left_out(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("left_out="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no left_out in {line}"))
}

/// The captured lines that contain every one of `parts`.
fn lines_with(parts: &[&str]) -> Vec<String> {
    let text = String::from_utf8_lossy(&captured_log().lock().unwrap()).into_owned();
    text.lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .map(str::to_string)
        .collect()
}

/// Checks a limited log of `sent` events (issue 32: a peer must not be able
/// to flood the log): the first 20 lines whole (the burst, `left_out=0`),
/// then at most one a second over `window`, and every event written or
/// counted in a later line's `left_out`.
fn assert_limited(lines: &[String], sent: u64, window: std::time::Duration) {
    let burst = trellis_node::sys::loglimit::DEFAULT_LOG_BURST as usize;
    eprintln!("{} lines for {sent} events in {window:?}", lines.len());
    assert!(
        lines.len() > burst,
        "the burst and at least one line after it: {lines:#?}"
    );
    for l in &lines[..burst] {
        assert_eq!(left_out(l), 0, "the burst is written whole: {l}");
    }
    // One line a second after the burst, and one for a partly refilled second.
    let most = burst + window.as_secs() as usize + 2;
    assert!(
        lines.len() <= most,
        "{} lines for {sent} events in {window:?}: at most {most}",
        lines.len()
    );
    let last = lines.last().unwrap();
    assert!(
        left_out(last) > 0,
        "the last line counts the ones left out: {last}"
    );
    let counted: u64 = lines.iter().map(|l| left_out(l)).sum::<u64>() + lines.len() as u64;
    assert_eq!(counted, sent, "every event written or counted");
}

#[test]
fn a_flood_of_refused_connects_logs_a_burst_then_one_line_a_second() {
    use std::time::{Duration, Instant};
    const FLOOD_HOST: &str = "nqn.2014-08.org.example:flood";
    captured_log();
    let t = start_target();
    let addr = t.local_addrs[0];
    let refuse = || {
        let mut q = Queue::open(addr, NO);
        let c = q.fabrics_connect(0, 31, NQN, FLOOD_HOST, CNTLID_DYNAMIC, 0);
        assert_eq!(c.status, specific::CONNECT_INVALID_HOST.dnr(), "refused");
    };
    let started = Instant::now();
    let mut sent = 0u64;
    while started.elapsed() < Duration::from_millis(2_500) {
        refuse();
        sent += 1;
    }
    assert!(sent >= 100, "a flood: {sent} refused Connects in 2.5 s");
    // A line refills within a second: the next refusal is written, and it
    // counts what the flood left out.
    std::thread::sleep(Duration::from_millis(1_100));
    refuse();
    sent += 1;
    let window = started.elapsed();
    // Each line is written before its refusal is sent.
    let lines = lines_with(&["connect refused", FLOOD_HOST]);
    assert_limited(&lines, sent, window);
    t.stop().unwrap();
}

#[test]
fn a_flood_of_fatal_pdu_errors_logs_a_burst_then_one_line_a_second() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    captured_log();
    let t = start_target();
    let addr = t.local_addrs[0];
    let mut peers = Vec::new();
    let fatal = |peers: &mut Vec<String>| {
        let mut q = Queue::open(addr, NO);
        peers.push(format!("peer={}", q.s.local_addr().unwrap()));
        // A PDU type no one defines: a fatal error (C2HTermReq, close).
        q.s.write_all(&[0x7f, 0, 8, 0, 8, 0, 0, 0]).unwrap();
        let mut b = [0u8; 256];
        while matches!(std::io::Read::read(&mut q.s, &mut b), Ok(n) if n > 0) {}
    };
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2_500) {
        fatal(&mut peers);
    }
    assert!(
        peers.len() >= 100,
        "a flood: {} fatal errors in 2.5 s",
        peers.len()
    );
    std::thread::sleep(Duration::from_millis(1_100));
    fatal(&mut peers);
    let window = started.elapsed();
    // Ports are reused over a flood this long: count calls, match ports.
    let sent = peers.len() as u64;
    let peers: std::collections::HashSet<String> = peers.into_iter().collect();
    // The target logs before it closes, and the read above saw the close.
    let lines: Vec<String> = lines_with(&["terminating connection"])
        .into_iter()
        .filter(|l| l.split_whitespace().any(|w| peers.contains(w)))
        .collect();
    assert_limited(&lines, sent, window);
    t.stop().unwrap();
}

// ---------------------------------------------------------------- 2. discovery controllers

use trellis_nvme::fabrics::DISCOVERY_NQN;
use trellis_nvme::identify::IdCtrl;
use trellis_nvme::log;
use trellis_nvme::sqe::admin;
use trellis_nvme::status::generic;
use trellis_nvme::{Cqe, Sgl, Sqe};

fn identify(q: &mut Queue, cns: u8, nsid: u32) -> (Cqe, Vec<u8>) {
    let mut s = Sqe::new(admin::IDENTIFY, 0, nsid);
    s.set_cdw(10, cns as u32);
    q.cmd(s, &[], 4096, 0)
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
    // Each advertised log page feature must be served (NVMe Base 2.0, Identify Controller LPA).
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
    t.stop().unwrap();
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
    t.stop().unwrap();
}

// ---------------------------------------------------------------- 3. unique identities

/// Serial, and NGUID / EUI-64 / UUID of NSID 1, read over the wire.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Identity {
    serial: String,
    nguid: Vec<u8>,
    eui64: Vec<u8>,
    uuid: Vec<u8>,
}

fn identity_of(addr: SocketAddr, subnqn: &str) -> Identity {
    let mut c = controller_as(addr, subnqn, HOST, 0);
    let (cqe, id) = identify(&mut c.admin, 1, 0);
    assert!(cqe.status.is_success());
    let (cqe, ns) = identify(&mut c.admin, 0, 1);
    assert!(cqe.status.is_success());
    let (cqe, desc) = identify(&mut c.admin, 3, 1);
    assert!(cqe.status.is_success());
    let mut uuid = Vec::new();
    let mut off = 0;
    while off + 4 <= desc.len() && desc[off] != 0 {
        let (nidt, nidl) = (desc[off], desc[off + 1] as usize);
        if nidt == 3 {
            uuid = desc[off + 4..off + 4 + nidl].to_vec();
        }
        off += 4 + nidl;
    }
    Identity {
        serial: IdCtrl::decode(&id).serial,
        nguid: ns[104..120].to_vec(),
        eui64: ns[120..128].to_vec(),
        uuid,
    }
}

fn assert_all_differ(a: &Identity, b: &Identity) {
    assert_ne!(a.serial, b.serial, "serials differ");
    assert_ne!(a.nguid, b.nguid, "NGUIDs differ");
    assert_ne!(a.eui64, b.eui64, "EUI-64s differ");
    assert_ne!(a.uuid, b.uuid, "UUIDs differ");
    for id in [a, b] {
        assert!(id.nguid.iter().any(|&x| x != 0), "NGUID set");
        assert!(id.eui64.iter().any(|&x| x != 0), "EUI-64 set");
        assert_eq!(id.uuid.len(), 16, "UUID descriptor present");
    }
}

#[test]
fn two_targets_on_the_default_config_present_different_identities() {
    let nqn = trellis_node::config::DEFAULT_NQN;
    let a = trellis_node::Target::start(&default_config()).unwrap();
    let b = trellis_node::Target::start(&default_config()).unwrap();
    let ia = identity_of(a.local_addrs[0], nqn);
    let ib = identity_of(b.local_addrs[0], nqn);
    assert_all_differ(&ia, &ib);
    a.stop().unwrap();
    b.stop().unwrap();
}

fn config_in(dir: &std::path::Path) -> Config {
    let mut cfg = default_config();
    cfg.target.state_dir = Some(dir.to_path_buf());
    cfg
}

#[test]
fn identity_is_kept_across_restarts_and_differs_between_state_dirs() {
    let nqn = trellis_node::config::DEFAULT_NQN;
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let t = trellis_node::Target::start(&config_in(d1.path())).unwrap();
    let first = identity_of(t.local_addrs[0], nqn);
    t.stop().unwrap();
    let t = trellis_node::Target::start(&config_in(d1.path())).unwrap();
    assert_eq!(
        identity_of(t.local_addrs[0], nqn),
        first,
        "same state dir, same identity"
    );
    t.stop().unwrap();
    let t = trellis_node::Target::start(&config_in(d2.path())).unwrap();
    assert_all_differ(&first, &identity_of(t.local_addrs[0], nqn));
    t.stop().unwrap();
}

#[test]
fn concurrent_targets_in_one_state_dir_differ_and_each_gets_its_own_back() {
    let nqn = trellis_node::config::DEFAULT_NQN;
    let d = tempfile::tempdir().unwrap();
    let a = trellis_node::Target::start(&config_in(d.path())).unwrap();
    let b = trellis_node::Target::start(&config_in(d.path())).unwrap();
    let (ia, ib) = (
        identity_of(a.local_addrs[0], nqn),
        identity_of(b.local_addrs[0], nqn),
    );
    assert_all_differ(&ia, &ib);
    assert!(
        d.path().join("node-id.1").exists(),
        "the second took node-id.1"
    );
    b.stop().unwrap();
    let b = trellis_node::Target::start(&config_in(d.path())).unwrap();
    assert_eq!(
        identity_of(b.local_addrs[0], nqn),
        ib,
        "restarted beside a, b is b again"
    );
    a.stop().unwrap();
    b.stop().unwrap();
}

#[test]
fn explicit_identity_values_are_served_as_given() {
    let nqn = trellis_node::config::DEFAULT_NQN;
    let d = tempfile::tempdir().unwrap();
    let mut cfg = config_in(d.path());
    cfg.subsystems[0].serial = "SN-EXPLICIT-1".into();
    let ns = &mut cfg.subsystems[0].namespaces[0];
    ns.uuid = Some("5472656c-6c69-4073-8000-00000000abcd".into());
    ns.nguid = Some("00112233-4455-6677-8899-aabbccddeeff".into());
    ns.eui64 = Some("02:11:22:33:44:55:66:77".into());
    let t = trellis_node::Target::start(&cfg).unwrap();
    let id = identity_of(t.local_addrs[0], nqn);
    assert_eq!(id.serial, "SN-EXPLICIT-1");
    assert_eq!(id.uuid[..2], [0x54, 0x72]);
    assert_eq!(id.uuid[14..], [0xab, 0xcd]);
    assert_eq!(id.nguid, (0..16).map(|i| i * 0x11).collect::<Vec<u8>>());
    assert_eq!(id.eui64, [0x02, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77]);
    t.stop().unwrap();
}

#[test]
fn bad_or_repeated_identity_values_are_refused_with_the_value_and_the_fix() {
    let text = |ns: &str| {
        format!(
            "[[listener]]\naddr = \"127.0.0.1:0\"\n[[subsystem]]\nnqn = \"nqn.2026-11.io.trellis:a\"\n{ns}"
        )
    };
    let one =
        |kv: &str| format!("[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1M\"\n{kv}\n");
    for (kv, want) in [
        ("uuid = \"not-a-uuid\"", "not-a-uuid"),
        ("nguid = \"0011\"", "32 hex digits"),
        ("eui64 = \"0000000000000000\"", "all zeroes"),
    ] {
        let e = Config::from_toml(&text(&one(kv))).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("leave it out"), "{e}");
        assert_eq!(e.lines().count(), 1, "one line: {e}");
    }
    let twice = one("eui64 = \"0211223344556677\"").repeat(2);
    let e = Config::from_toml(&text(&twice)).unwrap_err().to_string();
    assert!(
        e.contains("eui64 0211223344556677") && e.contains("different value"),
        "{e}"
    );
}

// ---------------------------------------------------------------- 4. write zeroes with deallocate

#[test]
fn write_zeroes_with_deallocate_zeroes_counts_and_is_advertised() {
    use trellis_nvme::sqe::io;
    use trellis_nvme::{Sgl, Sqe};
    let t = start_target();
    let mut c = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    let (cqe, id) = identify(&mut c.admin, 0, 1);
    assert!(cqe.status.is_success());
    // DLFEAT: deallocated blocks read as zeroes (bits 2:0 = 001b) and DEAC
    // is supported in Write Zeroes (bit 3): Linux then sets DEAC.
    assert_eq!(id[33], 0x09, "DLFEAT");
    let q = &mut c.io[0];
    assert!(write(q, 0, &pattern(0, 32, 4)).status.is_success());
    let mut wz = Sqe::rw(io::WRITE_ZEROES, 0, 1, 8, 16, false);
    wz.set_cdw(12, wz.cdw12() | 1 << 25);
    wz.set_sgl(Sgl::transport(0));
    assert!(q.cmd(wz, &[], 0, 8192).0.status.is_success());
    let (_, d) = read(q, 0, 32);
    assert!(d[8 * 512..24 * 512].iter().all(|&b| b == 0), "range zeroed");
    assert_eq!(d[..8 * 512], pattern(0, 32, 4)[..8 * 512], "before intact");
    assert_eq!(d[24 * 512..], pattern(0, 32, 4)[24 * 512..], "after intact");
    let set = t.reg.ns().load();
    let n = &set.by_uid[0].as_ref().unwrap().stats().write_zeroes_deac;
    assert_eq!(
        n.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "DEAC counted"
    );
    t.stop().unwrap();
}

// ---------------------------------------------------------------- 5. largest transfer

use trellis_nvme::pdu::{self, PduType};
use trellis_nvme::sqe::io;

/// Writes `data` at LBA 0 through R2T, H2CData in `chunk`-byte PDUs, then
/// reads it back; returns the write and read statuses.
fn write_read_chunked(q: &mut Queue, data: &[u8], chunk: usize) -> (Cqe, Vec<u8>) {
    let nlb = (data.len() / 512) as u32;
    let cid = q.next_cid();
    let mut sqe = Sqe::rw(io::WRITE, cid, 1, 0, nlb, false);
    sqe.set_sgl(Sgl::transport(data.len() as u32));
    q.send_capsule(&sqe, &[]);
    let p = q.recv().expect("a response to the write");
    if p.ch.pdu_type == PduType::CapsuleResp as u8 {
        return (Cqe::decode(&p.bytes[8..24]), Vec::new());
    }
    assert_eq!(p.ch.pdu_type, PduType::R2T as u8);
    let r = pdu::R2t::decode(&p.bytes);
    assert_eq!(
        (r.r2to, r.r2tl as usize),
        (0, data.len()),
        "one R2T for all"
    );
    q.send_h2c(r.ttag, cid, data, 0, chunk);
    let p = q.recv().expect("write completion");
    assert_eq!(p.ch.pdu_type, PduType::CapsuleResp as u8);
    let w = Cqe::decode(&p.bytes[8..24]);
    if !w.status.is_success() {
        return (w, Vec::new());
    }
    let (cqe, back) = read(q, 0, nlb);
    assert!(cqe.status.is_success(), "read back: {:?}", cqe.status);
    (w, back)
}

#[test]
fn one_mib_transfers_work_at_the_default_mdts_with_several_h2c_pdus() {
    let t = trellis_node::Target::start(&default_config()).unwrap();
    let nqn = trellis_node::config::DEFAULT_NQN;
    let mut c = controller_as(t.local_addrs[0], nqn, HOST, 1);
    let (cqe, id) = identify(&mut c.admin, 1, 0);
    assert!(cqe.status.is_success());
    let mdts = IdCtrl::decode(&id).max_transfer_bytes();
    assert!(
        mdts.is_some_and(|m| m >= 1 << 20),
        "MDTS ≥ 1 MiB, got {mdts:?}"
    );
    let data = pattern(0, 2048, 9);
    // H2CData of 128 KiB (the default MAXH2CDATA): 8 PDUs per command.
    let (w, back) = write_read_chunked(&mut c.io[0], &data, 128 << 10);
    assert!(w.status.is_success(), "1 MiB write: {:?}", w.status);
    assert!(back == data, "1 MiB read back equals the write");
    t.stop().unwrap();
}

#[test]
fn transfers_at_the_configured_maximum_work_and_one_block_more_is_refused() {
    let mut cfg = default_config();
    cfg.target.max_io_size = trellis_node::config::ByteSize(8 << 20);
    cfg.target.max_h2c_data = trellis_node::config::ByteSize(64 << 10);
    let t = trellis_node::Target::start(&cfg).unwrap();
    let nqn = trellis_node::config::DEFAULT_NQN;
    let mut c = controller_as(t.local_addrs[0], nqn, HOST, 1);
    let data = pattern(0, 16384, 5);
    // 8 MiB in 128 H2CData PDUs of MAXH2CDATA each.
    let (w, back) = write_read_chunked(&mut c.io[0], &data, 64 << 10);
    assert!(w.status.is_success(), "8 MiB write: {:?}", w.status);
    assert!(back == data, "8 MiB read back equals the write");
    let over = Sqe::rw(io::READ, 0, 1, 0, 16385, false);
    let (cqe, _) = c.io[0].cmd(over, &[], 16385 * 512, 0);
    assert_eq!(cqe.status, generic::INVALID_FIELD.dnr(), "above MDTS");
    t.stop().unwrap();
}
