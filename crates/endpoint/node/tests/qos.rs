//! Gimbal in the target (`qos = "gimbal"`): verified I/O with QoS off and
//! on, I/O credits in CQE DW1, the virtual-view log page (LID C0h), and the
//! status of a command the scheduler refuses (Busy).

mod common;

use common::*;
use trellis_node::config::qos::{QosMode, TenantConfig};
use trellis_node::config::{BackendKind, Config, NamespaceConfig};
use trellis_node::data::qos::{VIEW_ENTRY_BYTES, VIEW_HEADER_BYTES, VIEW_LID};
use trellis_nvme::pdu::{Digests, PduType};
use trellis_nvme::sqe::{io, Sgl};
use trellis_nvme::{le16, le32, le64, Cqe, Sqe};

const NO: Digests = Digests {
    header: false,
    data: false,
};

/// The common test target (one 16 MiB RAM namespace for `HOST`) with `qos`.
fn config(qos: QosMode) -> Config {
    let mut ns = NamespaceConfig::sized(BackendKind::Ram, 16 << 20);
    ns.qos = qos;
    test_config(ns)
}

/// One parsed entry of the virtual-view page.
#[derive(Debug)]
struct ViewEntry {
    nsid: u32,
    tenant: u16,
    weight: u16,
    io_credits: u32,
    read_state: u8,
    read_target_us: u32,
    write_cost_fp10: u32,
    target_rate: u64,
}

/// Parses the page: (the reader's tenant, entries).
fn parse_view(p: &[u8]) -> (u16, Vec<ViewEntry>) {
    assert_eq!(p[0], 1, "layout version");
    let n = le16(p, 2) as usize;
    assert_eq!(le16(p, 6) as usize, VIEW_ENTRY_BYTES);
    let entries = (0..n)
        .map(|i| {
            let e = &p[VIEW_HEADER_BYTES + i * VIEW_ENTRY_BYTES..];
            ViewEntry {
                nsid: le32(e, 0),
                tenant: le16(e, 4),
                weight: le16(e, 6),
                io_credits: le32(e, 8),
                read_state: e[20],
                read_target_us: le32(e, 24),
                write_cost_fp10: le32(e, 40),
                target_rate: le64(e, 48),
            }
        })
        .collect();
    (le16(p, 4), entries)
}

/// Pipelines `n` reads of `nlb` blocks on `q` and returns every response
/// capsule's (status, DW1), in arrival order.
fn pipelined_reads(q: &mut Queue, n: usize, nlb: u32) -> Vec<(trellis_nvme::Status, u32)> {
    let mut cids = std::collections::HashSet::new();
    for i in 0..n {
        let mut sqe = Sqe::rw(io::READ, 0, 1, (i as u64 * nlb as u64) % 16384, nlb, false);
        let cid = q.next_cid();
        cids.insert(cid);
        sqe.set_cid(cid);
        sqe.set_sgl(Sgl::transport(nlb * 512));
        q.send_capsule(&sqe, &[]);
    }
    let mut out = Vec::new();
    while !cids.is_empty() {
        let p = q.recv().expect("a PDU");
        if p.ch.pdu_type != PduType::CapsuleResp as u8 {
            continue; // C2HData
        }
        let cqe = Cqe::decode(&p.bytes[8..24]);
        assert!(cids.remove(&cqe.cid), "one response per command");
        out.push((cqe.status, cqe.dw1));
    }
    out
}

#[test]
fn qos_off_and_gimbal_both_serve_verified_io() {
    for mode in [QosMode::Off, QosMode::Gimbal] {
        let t = trellis_node::Target::start(&config(mode)).unwrap();
        let mut c = controller(t.local_addrs[0], NQN, 1, NO, 5000);
        let q = &mut c.io[0];
        for (i, blocks) in [(0u64, 8usize), (64, 256), (1024, 1)] {
            let data = pattern(i, blocks, 7);
            let w = write(q, i, &data);
            assert!(w.status.is_success(), "{mode:?} write");
            let (r, got) = read(q, i, blocks as u32);
            assert!(r.status.is_success(), "{mode:?} read");
            assert_eq!(got, data, "{mode:?}: data read back");
            match mode {
                // No credits: DW1 as before (zero for I/O).
                QosMode::Off => assert_eq!((w.dw1, r.dw1), (0, 0)),
                // Credits in DW1[15:0]; CDW2 (zero here) echoed in DW1[31:16].
                QosMode::Gimbal => {
                    assert!(w.dw1 > 0 && w.dw1 <= 0xFFFF, "credits {:#x}", w.dw1);
                    assert!(r.dw1 > 0 && r.dw1 <= 0xFFFF, "credits {:#x}", r.dw1);
                }
            }
        }
        t.stop().unwrap();
    }
}

#[test]
fn gimbal_credits_in_dw1_change_under_load_and_match_the_log_page() {
    let mut cfg = config(QosMode::Gimbal);
    cfg.tenants = vec![TenantConfig {
        host: HOST.into(),
        name: "test-host".into(),
        weight: 3,
    }];
    let t = trellis_node::Target::start(&cfg).unwrap();
    let mut c = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    // Before any I/O: a fresh tenant's 8 slots × 32 (docs/gimbal.md §1.e).
    let r = read(&mut c.io[0], 0, 8).0;
    let first = r.dw1 & 0xFFFF;
    // 64 KiB reads: two per 128 KiB virtual slot, so the credit falls.
    let resps = pipelined_reads(&mut c.io[0], 64, 128);
    assert!(resps.iter().all(|(st, _)| st.is_success()));
    let credits: Vec<u32> = resps.iter().map(|&(_, dw1)| dw1 & 0xFFFF).collect();
    let last = *credits.last().unwrap();
    assert!(
        credits.iter().any(|&c| c != first),
        "credits stay {first} under load: {credits:?}"
    );
    assert!(
        last < first,
        "64 KiB reads earn fewer credits: {first} → {last}"
    );
    // The virtual view agrees with the last credit sent.
    let (cqe, page) = get_log(&mut c.admin, VIEW_LID, 0xFFFF_FFFF, 4096);
    assert!(cqe.status.is_success(), "{:?}", cqe.status);
    let (me, entries) = parse_view(&page);
    assert_eq!(me, 0, "the first configured tenant");
    let e = entries.iter().find(|e| e.tenant == me).expect("own entry");
    assert_eq!((e.nsid, e.weight), (1, 3));
    assert_eq!(e.io_credits, last, "log page credit = last DW1 credit");
    assert!((1..=4).contains(&e.read_state), "a read state was measured");
    assert!((250..=1500).contains(&e.read_target_us), "{e:?}");
    assert!((1024..=9216).contains(&e.write_cost_fp10), "{e:?}");
    assert!(e.target_rate > 0);
    // The page names the LID among the supported logs.
    let (_, sup) = get_log(&mut c.admin, 0x00, 0, 1024);
    assert_ne!(le32(&sup, VIEW_LID as usize * 4) & 1, 0, "LSUPP for C0h");
    t.stop().unwrap();
}

#[test]
fn qos_off_namespace_has_an_empty_view_page() {
    let t = trellis_node::Target::start(&config(QosMode::Off)).unwrap();
    let mut c = controller(t.local_addrs[0], NQN, 0, NO, 5000);
    let (cqe, page) = get_log(&mut c.admin, VIEW_LID, 0, 512);
    assert!(cqe.status.is_success());
    assert_eq!(parse_view(&page).1.len(), 0);
    t.stop().unwrap();
}

#[test]
fn gimbal_busy_answers_namespace_not_ready_without_dnr() {
    let mut cfg = config(QosMode::Gimbal);
    cfg.qos.limits.max_queued_per_tenant = 1;
    let t = trellis_node::Target::start(&cfg).unwrap();
    let mut c = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    // 128 KiB reads drain the 256 KiB token bucket after two: the rest
    // queue (one allowed) or are refused.
    let resps = pipelined_reads(&mut c.io[0], 96, 256);
    let busy: Vec<_> = resps.iter().filter(|(st, _)| !st.is_success()).collect();
    assert!(!busy.is_empty(), "some reads refused as busy");
    for (st, _) in &busy {
        assert_eq!((st.sct(), st.sc()), (0, 0x82), "Namespace Not Ready");
        assert!(!st.is_dnr(), "retryable: DNR clear");
    }
    // The queue still works afterwards.
    let data = pattern(0, 8, 9);
    assert!(write(&mut c.io[0], 0, &data).status.is_success());
    assert_eq!(read(&mut c.io[0], 0, 8).1, data);
    t.stop().unwrap();
}

/// `tenant_set_weight` over the management socket reaches a scheduler that
/// already exists (the reactor re-applies the weights after the change).
#[test]
fn a_tenant_weight_set_live_reaches_the_running_scheduler() {
    use std::io::{BufRead, BufReader, Write};
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(QosMode::Gimbal);
    cfg.tenants = vec![TenantConfig {
        host: HOST.into(),
        name: "test-host".into(),
        weight: 3,
    }];
    cfg.ctl.socket = Some(dir.path().join("ctl.sock"));
    let t = trellis_node::Target::start(&cfg).unwrap();
    let mut c = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    assert!(read(&mut c.io[0], 0, 8).0.status.is_success());
    let weight = |c: &mut Ctrl| {
        let (cqe, page) = get_log(&mut c.admin, VIEW_LID, 0xFFFF_FFFF, 4096);
        assert!(cqe.status.is_success());
        let (me, entries) = parse_view(&page);
        entries.iter().find(|e| e.tenant == me).map(|e| e.weight)
    };
    assert_eq!(weight(&mut c), Some(3));
    let rpc = |params: serde_json::Value| {
        let mut s = std::os::unix::net::UnixStream::connect(dir.path().join("ctl.sock")).unwrap();
        let req = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tenant_set_weight", "params": params});
        writeln!(s, "{req}").unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        serde_json::from_str::<serde_json::Value>(&line).unwrap()
    };
    let r = rpc(serde_json::json!({"tenant": "test-host", "weight": 7}));
    assert_eq!(r["result"]["weight"], serde_json::json!(7), "{r}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while weight(&mut c) != Some(7) {
        assert!(std::time::Instant::now() < deadline, "weight not applied");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let r = rpc(serde_json::json!({"tenant": "test-host", "weight": 0}));
    assert!(
        r["error"]["message"].as_str().unwrap().contains("1..=1024"),
        "{r}"
    );
    let r = rpc(serde_json::json!({"tenant": "nobody", "weight": 2}));
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"nobody\""),
        "{r}"
    );
    t.stop().unwrap();
}
