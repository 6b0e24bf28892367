//! Namespaces added and removed while a host is connected (`ctl`
//! `namespace_add` / `namespace_remove`): the Namespace Attribute Changed
//! notice on the outstanding AER, the Changed Namespace List (log 04h),
//! Identify, I/O on the new namespace, Invalid Namespace once removed, and
//! the same connection throughout.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use trellis_node::config::{BackendKind, NamespaceConfig};
use trellis_nvme::log::{lid, GetLogPage};
use trellis_nvme::pdu::Digests;
use trellis_nvme::sqe::{admin, io};
use trellis_nvme::status::generic;
use trellis_nvme::{Cqe, Sgl, Sqe};

const NO: Digests = Digests {
    header: false,
    data: false,
};
/// Asynchronous Event Configuration bit 8: Namespace Attribute Notices.
const AEN_NS_ATTR: u32 = 1 << 8;
/// Notice, information 00h, log page 04h.
const NS_CHANGED_DW0: u32 = 0x0004_0002;

fn start(dir: &std::path::Path) -> trellis_node::Target {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.ctl.socket = Some(dir.join("ctl.sock"));
    trellis_node::Target::start(&cfg).unwrap()
}

fn rpc(dir: &std::path::Path, method: &str, params: Value) -> Value {
    let mut s = UnixStream::connect(dir.join("ctl.sock")).unwrap();
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    writeln!(s, "{req}").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

fn active_nsids(q: &mut Queue) -> Vec<u32> {
    let mut s = Sqe::new(admin::IDENTIFY, 0, 0);
    s.set_cdw(10, 2);
    let (cqe, page) = q.cmd(s, &[], 4096, 0);
    assert!(cqe.status.is_success());
    page.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .take_while(|&n| n != 0)
        .collect()
}

fn changed_log(q: &mut Queue, rae: bool) -> Vec<u32> {
    let s = GetLogPage {
        lid: lid::CHANGED_NS_LIST,
        lsp: 0,
        rae,
        len_bytes: 4096,
        offset_bytes: 0,
    }
    .to_sqe(0, 0xFFFF_FFFF);
    let (cqe, page) = q.cmd(s, &[], 4096, 0);
    assert!(cqe.status.is_success(), "{:?}", cqe.status);
    page.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .take_while(|&n| n != 0)
        .collect()
}

/// Enables the notice and leaves one AER outstanding; returns its CID.
fn arm(a: &mut Ctrl) -> u16 {
    let mut s = Sqe::new(admin::SET_FEATURES, 0, 0);
    s.set_cdw(10, 0x0B);
    s.set_cdw(11, AEN_NS_ATTR);
    assert!(a.admin.cmd(s, &[], 0, 0).0.status.is_success());
    send_aer(a)
}

fn send_aer(a: &mut Ctrl) -> u16 {
    let cid = a.admin.next_cid();
    let mut aer = Sqe::new(admin::ASYNC_EVENT_REQUEST, cid, 0);
    aer.set_sgl(Sgl::transport(0));
    a.admin.send_capsule(&aer, &[]);
    cid
}

fn aer_done(a: &mut Ctrl, cid: u16) {
    let p = a.admin.recv().expect("the AER completes");
    let cqe = Cqe::decode(&p.bytes[8..24]);
    assert_eq!((cqe.cid, cqe.dw0), (cid, NS_CHANGED_DW0));
    assert!(cqe.status.is_success());
}

fn rw(q: &mut Queue, op: u8, nsid: u32) -> Cqe {
    let data = pattern(0, 1, 9);
    match op {
        io::WRITE => {
            q.cmd(Sqe::rw(io::WRITE, 0, nsid, 0, 1, false), &data, 0, 8192)
                .0
        }
        _ => {
            q.cmd(Sqe::rw(io::READ, 0, nsid, 0, 1, false), &[], 512, 8192)
                .0
        }
    }
}

#[test]
fn a_namespace_added_and_removed_live_raises_the_notice_and_keeps_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path());
    let mut a = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    let cid = arm(&mut a);
    let r = rpc(
        dir.path(),
        "namespace_add",
        json!({"nqn": NQN, "backend": "ram", "size": "1MiB"}),
    );
    assert_eq!(r["result"]["nsid"], json!(2), "{r}");
    assert_eq!(r["result"]["notified_controllers"], json!(1), "{r}");
    aer_done(&mut a, cid);
    assert_eq!(active_nsids(&mut a.admin), vec![1, 2]);
    // RAE set: the list stays; RAE clear: read and cleared.
    assert_eq!(changed_log(&mut a.admin, true), vec![2]);
    assert_eq!(changed_log(&mut a.admin, false), vec![2]);
    assert_eq!(changed_log(&mut a.admin, false), Vec::<u32>::new());
    // The existing I/O queue serves the new namespace.
    assert!(rw(&mut a.io[0], io::WRITE, 2).status.is_success());
    assert!(rw(&mut a.io[0], io::READ, 2).status.is_success());
    let cid = send_aer(&mut a);
    let r = rpc(
        dir.path(),
        "namespace_remove",
        json!({"nqn": NQN, "nsid": 2}),
    );
    assert_eq!(r["result"]["notified_controllers"], json!(1), "{r}");
    aer_done(&mut a, cid);
    assert_eq!(active_nsids(&mut a.admin), vec![1]);
    assert_eq!(changed_log(&mut a.admin, false), vec![2]);
    let st = rw(&mut a.io[0], io::READ, 2).status;
    assert_eq!(st, generic::INVALID_NAMESPACE.dnr());
    assert!(
        rw(&mut a.io[0], io::READ, 1).status.is_success(),
        "same connection"
    );
    t.stop().unwrap();
}

#[test]
fn the_notice_stays_masked_until_the_log_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path());
    let mut a = controller(t.local_addrs[0], NQN, 0, NO, 5000);
    let cid = arm(&mut a);
    let add = |nsid: u32| {
        rpc(
            dir.path(),
            "namespace_add",
            json!({"nqn": NQN, "nsid": nsid, "backend": "null", "size": "1MiB"}),
        )
    };
    assert_eq!(add(5)["result"]["notified_controllers"], json!(1));
    aer_done(&mut a, cid);
    // Masked: the second change is listed but not sent.
    assert_eq!(add(7)["result"]["notified_controllers"], json!(0));
    assert_eq!(changed_log(&mut a.admin, false), vec![5, 7]);
    let cid = send_aer(&mut a);
    assert_eq!(add(3)["result"]["notified_controllers"], json!(1));
    aer_done(&mut a, cid);
    t.stop().unwrap();
}

#[test]
fn bad_namespace_requests_name_the_value_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path());
    let msg = |m: &str, p: Value| {
        let r = rpc(dir.path(), m, p);
        assert_eq!(r["error"]["code"], json!(-32602), "{r}");
        r["error"]["message"].as_str().unwrap().to_string()
    };
    let e = msg(
        "namespace_add",
        json!({"nqn": "nqn.x:nope", "backend": "ram"}),
    );
    assert!(e.contains("nqn.x:nope") && e.contains(NQN), "{e}");
    let e = msg(
        "namespace_add",
        json!({"nqn": NQN, "nsid": 1, "backend": "ram", "size": "1MiB"}),
    );
    assert!(e.contains("already has namespace 1"), "{e}");
    let e = msg(
        "namespace_add",
        json!({"nqn": NQN, "nsid": 5000, "backend": "ram", "size": "1MiB"}),
    );
    assert!(e.contains("1..=1024"), "{e}");
    let e = msg("namespace_add", json!({"nqn": NQN, "backend": "ram"}));
    assert!(e.contains("needs a size"), "{e}");
    let e = msg(
        "namespace_add",
        json!({"nqn": NQN, "backend": "tape", "size": "1MiB"}),
    );
    assert!(e.contains("tape"), "{e}");
    let e = msg(
        "namespace_add",
        json!({"nqn": NQN, "backend": "ram", "size": "1MiB", "block_size": 1000}),
    );
    assert!(e.contains("1000"), "{e}");
    let e = msg("namespace_remove", json!({"nqn": NQN, "nsid": 9}));
    assert!(e.contains("no namespace 9") && e.contains("are 1"), "{e}");
    let e = msg("namespace_remove", json!({"nqn": NQN, "nsid": "x"}));
    assert!(e.contains("\"x\""), "{e}");
    t.stop().unwrap();
}

#[test]
fn state_queries_list_controllers_and_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path());
    let mut a = controller(t.local_addrs[0], NQN, 2, NO, 5000);
    let r = rpc(dir.path(), "controllers_get", json!({}));
    let c = &r["result"]["controllers"][0];
    assert_eq!(c["subsystem"], json!(NQN), "{r}");
    assert_eq!(c["listener"], json!(t.local_addrs[0].to_string()));
    assert_eq!(
        (c["io_queues"].clone(), c["kato_ms"].clone()),
        (json!(2), json!(5000))
    );
    assert_eq!(c["ready"], json!(true));
    let qids: Vec<Value> = c["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["qid"].clone())
        .collect();
    assert_eq!(qids, vec![json!(0), json!(1), json!(2)], "{c}");
    assert_eq!(c["queues"][1]["sqsize"], json!(127), "{c}");
    assert!(c["host"].as_str().unwrap().starts_with("nqn."), "{c}");
    assert!(rw(&mut a.io[0], io::WRITE, 1).status.is_success());
    let add = json!({"nqn": NQN, "backend": "null", "size": "2MiB", "block_size": 4096});
    assert!(rpc(dir.path(), "namespace_add", add)["result"].is_object());
    let r = rpc(dir.path(), "namespaces_get", json!({}));
    let nss = r["result"]["namespaces"].as_array().unwrap();
    assert_eq!(nss.len(), 2, "{r}");
    assert_eq!(
        (nss[0]["nsid"].clone(), nss[0]["size_bytes"].clone()),
        (json!(1), json!(1 << 20))
    );
    assert!(
        nss[0]["backend"].as_str().unwrap().starts_with("ram"),
        "{r}"
    );
    assert_eq!(
        (nss[1]["nsid"].clone(), nss[1]["block_size"].clone()),
        (json!(2), json!(4096))
    );
    t.stop().unwrap();
}

#[test]
fn config_get_returns_the_live_config_as_toml_that_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path());
    let add = json!({"nqn": NQN, "nsid": 4, "backend": "ram", "size": "2MiB"});
    assert!(rpc(dir.path(), "namespace_add", add)["result"].is_object());
    let r = rpc(dir.path(), "config_get", json!({}));
    let text = r["result"]["toml"].as_str().unwrap();
    let cfg = trellis_node::Config::from_toml(text).unwrap();
    let nss = &cfg.subsystems[0].namespaces;
    assert_eq!(
        nss.iter().map(|n| n.nsid).collect::<Vec<_>>(),
        vec![Some(1), Some(4)],
        "{text}"
    );
    assert_eq!(nss[1].size.map(|s| s.0), Some(2 << 20));
    assert_eq!(cfg.ctl.socket, Some(dir.path().join("ctl.sock")));
    t.stop().unwrap();
}

#[test]
fn hosts_added_and_removed_live_gate_new_connects_only() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path());
    let addr = t.local_addrs[0];
    let other = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002";
    let connect = |host: &str| {
        let mut q = Queue::open(addr, NO);
        let c = q.fabrics_connect(0, 31, NQN, host, 0xFFFF, 5000);
        c.status
    };
    assert!(!connect(other).is_success(), "not allowed yet");
    let r = rpc(dir.path(), "host_add", json!({"nqn": NQN, "host": other}));
    assert_eq!(r["result"]["changed"], json!(true), "{r}");
    let mut b = controller_as(addr, NQN, other, 1, NO, 5000);
    let r = rpc(
        dir.path(),
        "host_remove",
        json!({"nqn": NQN, "host": other}),
    );
    assert_eq!(r["result"]["changed"], json!(true), "{r}");
    // Connected: stays; a new Connect: refused.
    assert!(rw(&mut b.io[0], io::READ, 1).status.is_success());
    assert!(!connect(other).is_success());
    let r = rpc(dir.path(), "host_remove", json!({"nqn": NQN, "host": HOST}));
    let e = r["error"]["message"].as_str().unwrap();
    assert!(e.contains("last host"), "{r}");
    let r = rpc(dir.path(), "host_add", json!({"nqn": NQN, "host": "bad"}));
    assert_eq!(r["error"]["code"], json!(-32602), "{r}");
    t.stop().unwrap();
}

#[test]
fn a_namespace_grown_live_raises_the_notice_and_serves_the_new_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path());
    let mut a = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    let add = json!({"nqn": NQN, "nsid": 2, "backend": "null", "size": "1MiB"});
    assert!(rpc(dir.path(), "namespace_add", add)["result"].is_object());
    let cid = arm(&mut a);
    let beyond = |q: &mut Queue| {
        q.cmd(Sqe::rw(io::READ, 0, 2, 4096, 1, false), &[], 512, 8192)
            .0
            .status
    };
    assert_eq!(beyond(&mut a.io[0]), generic::LBA_OUT_OF_RANGE.dnr());
    let r = rpc(
        dir.path(),
        "namespace_resize",
        json!({"nqn": NQN, "nsid": 2, "size": "4MiB"}),
    );
    assert_eq!(r["result"]["notified_controllers"], json!(1), "{r}");
    aer_done(&mut a, cid);
    assert_eq!(changed_log(&mut a.admin, false), vec![2]);
    let mut s = Sqe::new(admin::IDENTIFY, 0, 2);
    s.set_cdw(10, 0);
    let (_, page) = a.admin.cmd(s, &[], 4096, 0);
    assert_eq!(trellis_nvme::le64(&page, 0), 4 << 20 >> 9, "NSZE");
    assert!(beyond(&mut a.io[0]).is_success());
    let msg = |p: Value| rpc(dir.path(), "namespace_resize", p)["error"]["message"].clone();
    let e = msg(json!({"nqn": NQN, "nsid": 2, "size": "2MiB"}));
    assert!(e.as_str().unwrap().contains("only growing"), "{e}");
    let e = msg(json!({"nqn": NQN, "nsid": 1, "size": "8MiB"}));
    assert!(e.as_str().unwrap().contains("cannot grow"), "{e}");
    let e = msg(json!({"nqn": NQN, "nsid": 2, "size": 5000000}));
    assert!(e.as_str().unwrap().contains("whole number"), "{e}");
    t.stop().unwrap();
}
