//! The discovery controller as a persistent discovery connection sees it:
//! OAES bit 31, Asynchronous Event Configuration bit 31 only, KATO as
//! nvmet reports it, the Discovery Log Page Change notice (DW0 0070F002h)
//! on an outstanding AER when the log changes, GENCTR moving, the mask
//! until the log is read with RAE clear, and referral entries (SUBTYPE 1h).

mod common;

use common::*;
use trellis_node::config::referral::ReferralConfig;
use trellis_node::config::{BackendKind, NamespaceConfig};
use trellis_nvme::fabrics::{CNTLID_DYNAMIC, DISCOVERY_NQN};
use trellis_nvme::identify::IdCtrl;
use trellis_nvme::log::{self, lid, DiscoveryEntry, GetLogPage};
use trellis_nvme::pdu::Digests;
use trellis_nvme::sqe::admin;
use trellis_nvme::status::generic;
use trellis_nvme::{Cqe, Sgl, Sqe};

const NO: Digests = Digests {
    header: false,
    data: false,
};
const DISC_CHANGE_DW0: u32 = 0x0070_F002;

/// An enabled discovery controller connected with `kato_ms`.
fn disc(t: &trellis_node::Target, kato_ms: u32) -> Queue {
    let mut q = Queue::open(t.local_addrs[0], NO);
    let c = q.fabrics_connect(0, 31, DISCOVERY_NQN, HOST, CNTLID_DYNAMIC, kato_ms);
    assert!(c.status.is_success());
    assert!(q.prop_set(0x14, 1).status.is_success());
    q
}

fn feature(q: &mut Queue, set: bool, fid: u32, v: u32) -> Cqe {
    let op = if set {
        admin::SET_FEATURES
    } else {
        admin::GET_FEATURES
    };
    let mut s = Sqe::new(op, 0, 0);
    s.set_cdw(10, fid);
    s.set_cdw(11, v);
    q.cmd(s, &[], 0, 0).0
}

fn send_aer(q: &mut Queue) -> u16 {
    let cid = q.next_cid();
    let mut aer = Sqe::new(admin::ASYNC_EVENT_REQUEST, cid, 0);
    aer.set_sgl(Sgl::transport(0));
    q.send_capsule(&aer, &[]);
    cid
}

/// The discovery log (GENCTR, entries), read with `rae`.
fn disc_log(q: &mut Queue, rae: bool) -> (u64, Vec<DiscoveryEntry>) {
    let s = GetLogPage {
        lid: lid::DISCOVERY,
        lsp: 0,
        rae,
        len_bytes: 8192,
        offset_bytes: 0,
    }
    .to_sqe(0, 0);
    let (cqe, page) = q.cmd(s, &[], 8192, 0);
    assert!(cqe.status.is_success(), "{:?}", cqe.status);
    let (gen, n, _) = log::decode_discovery_header(&page);
    let es = (0..n as usize)
        .map(|i| DiscoveryEntry::decode(&page[1024 * (i + 1)..]))
        .collect();
    (gen, es)
}

fn referral(port: u16) -> ReferralConfig {
    ReferralConfig {
        addr: format!("127.0.0.9:{port}").parse().unwrap(),
        portid: 3,
    }
}

#[test]
fn identify_and_features_of_a_discovery_controller_promise_the_notice() {
    let t = start_target();
    let mut q = disc(&t, 0);
    let mut s = Sqe::new(admin::IDENTIFY, 0, 0);
    s.set_cdw(10, 1);
    let (cqe, page) = q.cmd(s, &[], 4096, 0);
    assert!(cqe.status.is_success());
    let oaes = u32::from_le_bytes(page[92..96].try_into().unwrap());
    assert_eq!(oaes, 1 << 31, "OAES: only Discovery Log Page Change");
    assert_eq!(IdCtrl::decode(&page).cntrltype, 2);
    // KATO 0 at Connect: nvmet's 120 s discovery default, reported back.
    let c = feature(&mut q, false, 0x0F, 0);
    assert_eq!(c.dw0, 120_000);
    let bad = feature(&mut q, true, 0x0B, 1 << 8).status;
    assert_eq!(bad, generic::INVALID_FIELD.dnr(), "bit 8 is not ours here");
    assert!(feature(&mut q, true, 0x0B, 1 << 31).status.is_success());
    assert_eq!(feature(&mut q, false, 0x0B, 0).dw0, 1 << 31);
    t.stop().unwrap();
}

#[test]
fn a_change_completes_the_aer_and_stays_masked_until_the_log_is_read() {
    let t = start_target();
    let mut q = disc(&t, 10_000);
    assert!(feature(&mut q, true, 0x0B, 1 << 31).status.is_success());
    let (gen0, es) = disc_log(&mut q, false);
    assert_eq!(es.len(), 2, "own entry and the subsystem");
    let cid = send_aer(&mut q);
    assert_eq!(t.reg.set_referral(referral(8009), true).unwrap(), 1);
    let p = q.recv().expect("the AER completes");
    let cqe = Cqe::decode(&p.bytes[8..24]);
    assert_eq!((cqe.cid, cqe.dw0), (cid, DISC_CHANGE_DW0));
    // Masked until read with RAE clear: a second change is not sent.
    assert_eq!(t.reg.set_referral(referral(8010), true).unwrap(), 0);
    let (gen1, es) = disc_log(&mut q, true);
    assert_eq!(gen1, gen0 + 2, "GENCTR moves with each change");
    let r: Vec<_> = es.iter().filter(|e| e.subtype == 1).collect();
    assert_eq!(r.len(), 2, "{es:?}");
    assert_eq!(
        (r[0].traddr.as_str(), r[0].trsvcid.as_str()),
        ("127.0.0.9", "8009")
    );
    assert_eq!((r[0].subnqn.as_str(), r[0].portid), (DISCOVERY_NQN, 3));
    // RAE set kept it masked; RAE clear re-arms it.
    assert_eq!(t.reg.set_referral(referral(8010), false).unwrap(), 0);
    disc_log(&mut q, false);
    let cid = send_aer(&mut q);
    assert_eq!(t.reg.set_referral(referral(8009), false).unwrap(), 1);
    let p = q.recv().expect("the AER completes");
    let cqe = Cqe::decode(&p.bytes[8..24]);
    assert_eq!((cqe.cid, cqe.dw0), (cid, DISC_CHANGE_DW0));
    assert!(disc_log(&mut q, false).1.iter().all(|e| e.subtype != 1));
    t.stop().unwrap();
}

#[test]
fn only_hosts_allowed_to_see_a_subsystem_are_told_it_changed() {
    let t = start_target();
    let other = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002";
    let mut q = Queue::open(t.local_addrs[0], NO);
    let c = q.fabrics_connect(0, 31, DISCOVERY_NQN, other, CNTLID_DYNAMIC, 0);
    assert!(c.status.is_success());
    assert!(q.prop_set(0x14, 1).status.is_success());
    assert!(feature(&mut q, true, 0x0B, 1 << 31).status.is_success());
    let other_cid = send_aer(&mut q);
    let mut mine = disc(&t, 0);
    assert!(feature(&mut mine, true, 0x0B, 1 << 31).status.is_success());
    let cid = send_aer(&mut mine);
    let sub = t.reg.subsystem(NQN).unwrap().clone();
    // As nvmet_port_disc_changed: hosts the subsystem does not allow are
    // skipped, since their log does not list it.
    assert_eq!(t.reg.discovery_changed(Some(&sub)), 1);
    let p = mine.recv().expect("HOST's AER completes");
    assert_eq!(Cqe::decode(&p.bytes[8..24]).cid, cid);
    // A referral changes every host's log; HOST's notice is masked now.
    assert_eq!(t.reg.set_referral(referral(8009), true).unwrap(), 1);
    let p = q.recv().expect("the other host's AER completes");
    let cqe = Cqe::decode(&p.bytes[8..24]);
    assert_eq!((cqe.cid, cqe.dw0), (other_cid, DISC_CHANGE_DW0));
    t.stop().unwrap();
}

#[test]
fn a_config_with_referrals_reads_back_and_bad_ones_are_named() {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Null, 1 << 20));
    cfg.referrals = vec![referral(8009)];
    let text = cfg.to_toml().unwrap();
    assert!(text.contains("[[referral]]"), "{text}");
    let back = trellis_node::Config::from_toml(&text).unwrap();
    assert_eq!(back.referrals, cfg.referrals);
    let bad = text.replace("127.0.0.9:8009", "0.0.0.0:8009");
    let e = trellis_node::Config::from_toml(&bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("0.0.0.0:8009"), "{e}");
}

fn start_ctl(dir: &std::path::Path) -> trellis_node::Target {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.ctl.socket = Some(dir.join("ctl.sock"));
    trellis_node::Target::start(&cfg).unwrap()
}

fn rpc(dir: &std::path::Path, method: &str, params: serde_json::Value) -> serde_json::Value {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(dir.join("ctl.sock")).unwrap();
    let req = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    writeln!(s, "{req}").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

const TWO: &str = "nqn.2026-11.io.trellis:two";

fn aer_done(q: &mut Queue, cid: u16) {
    let p = q.recv().expect("the AER completes");
    let cqe = Cqe::decode(&p.bytes[8..24]);
    assert_eq!((cqe.cid, cqe.dw0), (cid, DISC_CHANGE_DW0));
}

#[test]
fn a_subsystem_added_and_removed_live_keeps_other_connections_and_notifies() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let t = start_ctl(dir.path());
    let mut d = disc(&t, 10_000);
    assert!(feature(&mut d, true, 0x0B, 1 << 31).status.is_success());
    let mut one = controller(t.local_addrs[0], NQN, 1, NO, 10_000);
    let cid = send_aer(&mut d);
    let ns = json!([{"backend": "ram", "size": "1MiB"}]);
    let params = json!({"nqn": TWO, "allowed_hosts": [HOST], "namespace": ns});
    let r = rpc(dir.path(), "subsystem_add", params.clone());
    assert_eq!(r["result"]["notified_controllers"], json!(1), "{r}");
    aer_done(&mut d, cid);
    let (_, es) = disc_log(&mut d, false);
    assert!(es.iter().any(|e| e.subnqn == TWO), "{es:?}");
    let again = rpc(dir.path(), "subsystem_add", params);
    let msg = again["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("exists"), "{msg}");
    // A host uses the new subsystem; the old one's I/O queue is untouched.
    let mut two = controller(t.local_addrs[0], TWO, 1, NO, 10_000);
    assert!(write(&mut two.io[0], 0, &pattern(0, 1, 2))
        .status
        .is_success());
    let r = rpc(dir.path(), "subsystem_remove", json!({"nqn": TWO}));
    let msg = r["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("--force"), "{msg}");
    let cid = send_aer(&mut d);
    let r = rpc(
        dir.path(),
        "subsystem_remove",
        json!({"nqn": TWO, "force": true}),
    );
    assert_eq!(r["result"]["torn_down_controllers"], json!(1), "{r}");
    aer_done(&mut d, cid);
    let t0 = std::time::Instant::now();
    assert!(two.admin.closed(), "torn down");
    assert!(two.io[0].closed(), "torn down");
    let took = t0.elapsed();
    assert!(
        took < std::time::Duration::from_secs(2),
        "{took:?}: not within the 100 ms check"
    );
    let (_, es) = disc_log(&mut d, false);
    assert!(es.iter().all(|e| e.subnqn != TWO), "{es:?}");
    let data = pattern(3, 1, 7);
    assert!(write(&mut one.io[0], 3, &data).status.is_success());
    assert_eq!(
        read(&mut one.io[0], 3, 1).1,
        data,
        "other subsystem unaffected"
    );
    let mut q = Queue::open(t.local_addrs[0], NO);
    let c = q.fabrics_connect(0, 31, TWO, HOST, CNTLID_DYNAMIC, 0);
    assert!(
        !c.status.is_success(),
        "a removed subsystem refuses Connect"
    );
    t.stop().unwrap();
}

#[test]
fn ctl_save_keeps_added_subsystems_and_referrals_and_bad_params_are_named() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let t = start_ctl(dir.path());
    let ns = json!([{"backend": "null", "size": "1MiB"}]);
    let r = rpc(
        dir.path(),
        "subsystem_add",
        json!({"nqn": TWO, "namespace": ns}),
    );
    assert!(r.get("result").is_some(), "{r}");
    let r = rpc(
        dir.path(),
        "referral_add",
        json!({"addr": "10.0.0.2:8009", "portid": 4}),
    );
    assert_eq!(r["result"]["referral"], json!("10.0.0.2:8009"), "{r}");
    let toml = rpc(dir.path(), "config_get", json!({}))["result"]["toml"]
        .as_str()
        .unwrap()
        .to_string();
    let back = trellis_node::Config::from_toml(&toml).unwrap();
    let nqns: Vec<_> = back.subsystems.iter().map(|s| s.nqn.as_str()).collect();
    assert_eq!(nqns, [NQN, TWO]);
    assert_eq!(back.subsystems[1].namespaces.len(), 1);
    assert_eq!(back.referrals.len(), 1);
    assert_eq!(back.referrals[0].portid, 4);
    for (method, params, want) in [
        ("subsystem_add", json!({"nqn": "bogus"}), "bogus"),
        ("subsystem_add", json!({"nqn": TWO, "colour": 1}), "colour"),
        (
            "subsystem_remove",
            json!({"nqn": "nqn.x:none"}),
            "nqn.x:none",
        ),
        (
            "subsystem_remove",
            json!({"nqn": TWO, "force": "yes"}),
            "\"yes\"",
        ),
        ("referral_add", json!({"addr": "nowhere"}), "nowhere"),
        (
            "referral_add",
            json!({"addr": "10.0.0.2:8009"}),
            "listed twice",
        ),
        (
            "referral_remove",
            json!({"addr": "10.0.0.3:8009"}),
            "10.0.0.2:8009",
        ),
    ] {
        let r = rpc(dir.path(), method, params);
        assert_eq!(r["error"]["code"], json!(-32602), "{method}: {r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{method}: {msg}");
    }
    let r = rpc(dir.path(), "subsystem_remove", json!({"nqn": TWO}));
    assert_eq!(r["result"]["torn_down_controllers"], json!(0), "{r}");
    t.stop().unwrap();
}

/// Connects to `addr`, retrying while the acceptor has not picked the
/// listener up yet (it does within 100 ms).
fn open_retry(addr: std::net::SocketAddr) -> Queue {
    for _ in 0..50 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Queue::open(addr, NO);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("nothing listens on {addr}");
}

#[test]
fn a_listener_added_and_removed_live_keeps_every_connection() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let t = start_ctl(dir.path());
    let old = t.local_addrs[0];
    let mut one = controller(old, NQN, 1, NO, 10_000);
    let mut d = disc(&t, 10_000);
    assert!(feature(&mut d, true, 0x0B, 1 << 31).status.is_success());
    // A group inaccessible on the I/O listener stays so on a new path.
    let ana = |l: &str, st: &str| {
        let p = json!({"listener": l, "group": "all", "state": st});
        assert!(rpc(dir.path(), "ana_set", p).get("result").is_some());
    };
    ana(&old.to_string(), "inaccessible");
    let cid = send_aer(&mut d);
    let r = rpc(dir.path(), "listener_add", json!({"addr": "127.0.0.1:0"}));
    let new: std::net::SocketAddr = r["result"]["listener"].as_str().unwrap().parse().unwrap();
    aer_done(&mut d, cid);
    let state_on = |l: std::net::SocketAddr| {
        let g = rpc(dir.path(), "ana_get", json!({}))["result"]["groups"].clone();
        let row = g
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["listener"] == json!(l.to_string()))
            .cloned();
        row.map(|r| r["state"].as_str().unwrap().to_string())
    };
    assert_eq!(state_on(new).as_deref(), Some("inaccessible"));
    ana(&new.to_string(), "optimized");
    ana(&old.to_string(), "optimized");
    let r = rpc(
        dir.path(),
        "listener_add",
        json!({"addr": "127.0.0.1:0", "ana_state": "non-optimized"}),
    );
    let third: std::net::SocketAddr = r["result"]["listener"].as_str().unwrap().parse().unwrap();
    assert_eq!(state_on(third).as_deref(), Some("non-optimized"));
    let r = rpc(
        dir.path(),
        "listener_remove",
        json!({"addr": third.to_string()}),
    );
    assert!(r.get("result").is_some(), "{r}");
    let (_, es) = disc_log(&mut d, false);
    let ports: Vec<_> = es
        .iter()
        .filter(|e| e.subnqn == NQN)
        .map(|e| e.trsvcid.clone())
        .collect();
    assert_eq!(
        ports,
        [old.port().to_string(), new.port().to_string()],
        "{es:?}"
    );
    // A host connects through the new listener and does I/O.
    drop(open_retry(new));
    let mut two = controller(new, NQN, 1, NO, 10_000);
    let data = pattern(5, 1, 3);
    assert!(write(&mut two.io[0], 5, &data).status.is_success());
    // Removing the original listener keeps its connections.
    let cid = send_aer(&mut d);
    let r = rpc(
        dir.path(),
        "listener_remove",
        json!({"addr": old.to_string()}),
    );
    assert_eq!(r["result"]["listener"], json!(old.to_string()), "{r}");
    aer_done(&mut d, cid);
    assert_eq!(
        read(&mut one.io[0], 5, 1).1,
        data,
        "old listener's connection serves"
    );
    let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::net::TcpStream::connect(old).is_ok() {
        assert!(std::time::Instant::now() < end, "{old} still accepts");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (_, es) = disc_log(&mut d, false);
    assert!(
        es.iter()
            .all(|e| e.trsvcid != old.port().to_string() || e.subtype == 3),
        "{es:?}"
    );
    let toml = rpc(dir.path(), "config_get", json!({}))["result"]["toml"]
        .as_str()
        .unwrap()
        .to_string();
    let back = trellis_node::Config::from_toml(&toml).unwrap();
    assert_eq!(
        back.listeners.iter().map(|l| l.addr).collect::<Vec<_>>(),
        [new]
    );
    for (method, params, want) in [
        (
            "listener_remove",
            json!({"addr": new.to_string()}),
            "last listener",
        ),
        (
            "listener_add",
            json!({"addr": new.to_string()}),
            "already listening",
        ),
        (
            "listener_add",
            json!({"addr": "127.0.0.1:0", "kind": "io"}),
            "\"io\"",
        ),
        (
            "listener_remove",
            json!({"addr": old.to_string()}),
            "not listening",
        ),
        ("listener_add", json!({"addr": "localhost"}), "localhost"),
    ] {
        let r = rpc(dir.path(), method, params);
        let msg = r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(msg.contains(want), "{method}: {r}");
    }
    t.stop().unwrap();
}

#[test]
fn an_ha_node_refuses_an_io_listener_added_live() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.ctl.socket = Some(dir.path().join("ctl.sock"));
    cfg.ha = Some(trellis_node::config::ha::HaConfig {
        path: Some(dir.path().join("lease")),
        node: "node-a".into(),
        key: "pair-1".into(),
        ..Default::default()
    });
    let t = trellis_node::Target::start(&cfg).unwrap();
    let r = rpc(dir.path(), "listener_add", json!({"addr": "127.0.0.1:0"}));
    let msg = r["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(msg.contains("HA pair") && msg.contains("discovery"), "{r}");
    let p = json!({"addr": "127.0.0.1:0", "kind": "discovery"});
    let r = rpc(dir.path(), "listener_add", p);
    assert!(r.get("result").is_some(), "{r}");
    t.stop().unwrap();
}

#[test]
fn listener_add_refuses_a_secure_channel_it_cannot_read() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let _t = start_ctl(dir.path());
    for bad in [json!(true), json!(1), json!("mandatory")] {
        let r = rpc(
            dir.path(),
            "listener_add",
            json!({"addr": "127.0.0.1:0", "secure_channel": bad}),
        );
        let msg = r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            msg.contains("secure_channel") && msg.contains("required"),
            "{bad}: {r}"
        );
    }
}
