//! Asymmetric Namespace Access: Identify fields, the ANA log per listener,
//! live changes over the management socket (`ana_set`), the path status of
//! I/O on an inaccessible group, and the ANA change AEN.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use trellis_node::config::{BackendKind, ListenerConfig, NamespaceConfig};
use trellis_nvme::ana::{self, AnaLog, AnaState};
use trellis_nvme::identify::{IdCtrl, IdNs};
use trellis_nvme::log::{lid, GetLogPage};
use trellis_nvme::pdu::Digests;
use trellis_nvme::sqe::{admin, io};
use trellis_nvme::status::path;
use trellis_nvme::{Cqe, Sgl, Sqe};

const NO: Digests = Digests {
    header: false,
    data: false,
};

/// Two I/O listeners (the second starts non-optimized), namespaces 1 (ANA
/// group 1) and 2 (`ana_group = 5`), and a management socket.
fn start(dir: &std::path::Path) -> trellis_node::Target {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    let mut ns2 = NamespaceConfig::sized(BackendKind::Ram, 1 << 20);
    ns2.ana_group = Some(5);
    cfg.subsystems[0].namespaces.push(ns2);
    let mut second = ListenerConfig {
        name: None,
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: None,
        ana_state: None,
        secure_channel: None,
    };
    second.ana_state = Some(AnaState::NonOptimized);
    cfg.listeners.push(second);
    cfg.ctl.socket = Some(dir.join("ctl.sock"));
    trellis_node::Target::start(&cfg).unwrap()
}

fn identify(q: &mut Queue, cns: u8, nsid: u32) -> Vec<u8> {
    let mut s = Sqe::new(admin::IDENTIFY, 0, nsid);
    s.set_cdw(10, cns as u32);
    let (cqe, page) = q.cmd(s, &[], 4096, 0);
    assert!(cqe.status.is_success(), "{:?}", cqe.status);
    page
}

fn ana_log(q: &mut Queue, rgo: bool, rae: bool) -> AnaLog {
    let s = GetLogPage {
        lid: lid::ANA,
        lsp: if rgo { ana::LSP_RGO } else { 0 },
        rae,
        len_bytes: 4096,
        offset_bytes: 0,
    }
    .to_sqe(0, 0xFFFF_FFFF);
    let (cqe, page) = q.cmd(s, &[], 4096, 0);
    assert!(cqe.status.is_success(), "{:?}", cqe.status);
    AnaLog::decode(&page).unwrap()
}

fn read_ns(q: &mut Queue, nsid: u32) -> Cqe {
    q.cmd(Sqe::rw(io::READ, 0, nsid, 0, 1, false), &[], 512, 8192)
        .0
}

/// One JSON-RPC call over the management socket.
fn rpc(dir: &std::path::Path, method: &str, params: Value) -> Value {
    let mut s = UnixStream::connect(dir.join("ctl.sock")).unwrap();
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    writeln!(s, "{req}").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

fn states(log: &AnaLog) -> Vec<(u32, AnaState, Vec<u32>)> {
    log.groups
        .iter()
        .map(|g| (g.grpid, g.state, g.nsids.clone()))
        .collect()
}

#[test]
fn identify_reports_ana_and_the_log_lists_groups_per_listener() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path());
    let mut a = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    let id = IdCtrl::decode(&identify(&mut a.admin, 1, 0));
    assert!(id.reports_ana(), "CMIC bit 3");
    assert_eq!((id.anatt_s, id.anacap & 0x1F), (10, 0x1F));
    // Fixed for the controller's life, so namespaces added later fit
    // (as Linux nvmet: 1024 NSIDs, 1024 groups).
    assert_eq!((id.anagrpmax, id.nanagrpid), (1024, 1024));
    assert_eq!((id.nn, id.mnan), (1024, 1024), "Linux needs 0 < MNAN <= NN");
    let ns2 = IdNs::decode(&identify(&mut a.admin, 0, 2));
    assert_eq!(ns2.anagrpid, 5);
    assert_eq!(IdNs::decode(&identify(&mut a.admin, 0, 1)).anagrpid, 1);
    let (cqe, logs) = get_log(&mut a.admin, lid::SUPPORTED_LOGS, 0, 1024);
    assert!(cqe.status.is_success());
    assert_eq!(logs[lid::ANA as usize * 4], 1, "LID 0Ch is listed");
    let log = ana_log(&mut a.admin, false, true);
    assert_eq!(
        states(&log),
        vec![
            (1, AnaState::Optimized, vec![1]),
            (5, AnaState::Optimized, vec![2])
        ]
    );
    let rgo = ana_log(&mut a.admin, true, true);
    assert!(rgo.groups.iter().all(|g| g.nsids.is_empty()), "RGO");
    // The second listener starts non-optimized (config), and still serves I/O.
    let mut b = controller(t.local_addrs[1], NQN, 1, NO, 5000);
    let log = ana_log(&mut b.admin, false, true);
    assert!(log.groups.iter().all(|g| g.state == AnaState::NonOptimized));
    assert!(read_ns(&mut b.io[0], 1).status.is_success());
    t.stop().unwrap();
}

#[test]
fn ana_set_makes_one_listeners_group_inaccessible_and_keeps_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path());
    let (la, lb) = (t.local_addrs[0], t.local_addrs[1]);
    let mut a = controller(la, NQN, 1, NO, 5000);
    let mut b = controller(lb, NQN, 1, NO, 5000);
    let r = rpc(
        dir.path(),
        "ana_set",
        json!({"listener": la.to_string(), "group": 1, "state": "inaccessible"}),
    );
    assert_eq!(r["result"]["changed"], json!([1]), "{r}");
    // Path status, DNR clear (another path may serve it), and no I/O done.
    let st = read_ns(&mut a.io[0], 1).status;
    assert_eq!(st, path::ANA_INACCESSIBLE, "{st:?}");
    assert!(!st.is_dnr());
    let w = write(&mut a.io[0], 0, &pattern(0, 1, 1)).status;
    assert_eq!(w, path::ANA_INACCESSIBLE);
    // Group 5 on the same connection, and group 1 on the other listener, serve.
    assert!(read_ns(&mut a.io[0], 2).status.is_success());
    assert!(read_ns(&mut b.io[0], 1).status.is_success());
    let log = ana_log(&mut a.admin, false, true);
    assert_eq!(log.groups[0].state, AnaState::Inaccessible);
    assert_eq!(
        ana_log(&mut b.admin, false, true).groups[0].state,
        AnaState::NonOptimized
    );
    let got = rpc(dir.path(), "ana_get", json!({}));
    let rows = got["result"]["groups"].as_array().unwrap();
    let row = |l: std::net::SocketAddr, g: u32| {
        rows.iter()
            .find(|r| r["listener"] == json!(l.to_string()) && r["group"] == json!(g))
            .map(|r| r["state"].clone())
    };
    assert_eq!(row(la, 1), Some(json!("inaccessible")));
    assert_eq!(row(lb, 1), Some(json!("non-optimized")));
    // Back to optimized: the same connection serves group 1 again.
    let r = rpc(
        dir.path(),
        "ana_set",
        json!({"listener": la.to_string(), "group": "all", "state": "optimized"}),
    );
    assert_eq!(r["result"]["changed"], json!([1]), "{r}");
    assert!(read_ns(&mut a.io[0], 1).status.is_success());
    assert!(log.chgcnt < ana_log(&mut a.admin, true, true).chgcnt);
    t.stop().unwrap();
}

#[test]
fn an_ana_change_completes_the_outstanding_aer_when_enabled() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path());
    let la = t.local_addrs[0];
    let mut a = controller(la, NQN, 0, NO, 5000);
    let mut s = Sqe::new(admin::SET_FEATURES, 0, 0);
    s.set_cdw(10, 0x0B);
    s.set_cdw(11, ana::id::AEN_ANA_CHANGE);
    assert!(a.admin.cmd(s, &[], 0, 0).0.status.is_success());
    let cid = a.admin.next_cid();
    let mut aer = Sqe::new(admin::ASYNC_EVENT_REQUEST, cid, 0);
    aer.set_sgl(Sgl::transport(0));
    a.admin.send_capsule(&aer, &[]);
    let r = rpc(
        dir.path(),
        "ana_set",
        json!({"listener": la.to_string(), "group": 5, "state": "change"}),
    );
    assert_eq!(r["result"]["notified_controllers"], json!(1), "{r}");
    let p = a.admin.recv().expect("the AER completes");
    let cqe = Cqe::decode(&p.bytes[8..24]);
    assert_eq!((cqe.cid, cqe.dw0), (cid, ana::AEN_ANA_CHANGE_DW0));
    assert!(cqe.status.is_success());
    // The host reads the log (RAE clear), which re-arms the event.
    let log = ana_log(&mut a.admin, false, false);
    assert_eq!(log.groups[1].state, AnaState::Change);
    t.stop().unwrap();
}

#[test]
fn bad_ana_set_requests_name_the_value_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path());
    let la = t.local_addrs[0].to_string();
    let msg = |r: Value| {
        assert_eq!(r["error"]["code"], json!(-32602), "{r}");
        r["error"]["message"].as_str().unwrap().to_string()
    };
    let m = msg(rpc(
        dir.path(),
        "ana_set",
        json!({"listener": la, "group": 1, "state": "sideways"}),
    ));
    assert!(m.contains("sideways") && m.contains("non-optimized"), "{m}");
    let m = msg(rpc(
        dir.path(),
        "ana_set",
        json!({"listener": "10.9.9.9:1", "group": 1, "state": "optimized"}),
    ));
    assert!(m.contains("10.9.9.9:1") && m.contains(&la), "{m}");
    let m = msg(rpc(
        dir.path(),
        "ana_set",
        json!({"listener": la, "group": 3, "state": "optimized"}),
    ));
    assert!(m.contains("group 3") && m.contains("1, 5"), "{m}");
    let r = rpc(dir.path(), "nope", json!({}));
    assert_eq!(r["error"]["code"], json!(-32601));
    t.stop().unwrap();
    assert!(!dir.path().join("ctl.sock").exists(), "removed at stop");
}

#[test]
fn the_host_library_reads_ana_state_per_path() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path());
    let cfg = trellis_host::HostConfig {
        hostnqn: HOST.into(),
        kato_ms: 0,
        ..Default::default()
    };
    let (la, lb) = (t.local_addrs[0], t.local_addrs[1]);
    let mut a = trellis_host::Controller::connect(&la.to_string(), NQN, &cfg).unwrap();
    let mut b = trellis_host::Controller::connect(&lb.to_string(), NQN, &cfg).unwrap();
    assert!(a.reports_ana());
    assert_eq!(a.ana_state(2).unwrap(), Some(AnaState::Optimized));
    assert_eq!(b.ana_state(2).unwrap(), Some(AnaState::NonOptimized));
    assert_eq!(a.ana_state(9).unwrap(), None, "no group lists NSID 9");
    rpc(
        dir.path(),
        "ana_set",
        json!({"listener": la.to_string(), "group": 5, "state": "persistent-loss"}),
    );
    assert_eq!(a.ana_state(2).unwrap(), Some(AnaState::PersistentLoss));
    let groups = a.ana_log(true).unwrap().groups;
    assert_eq!(groups.len(), 2);
    assert!(groups.iter().all(|g| g.nsids.is_empty()), "groups only");
    drop((a, b));
    t.stop().unwrap();
}
