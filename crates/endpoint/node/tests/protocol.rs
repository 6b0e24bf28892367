//! End-to-end protocol behaviour over real loopback sockets.

mod common;
use common::*;
use trellis_nvme::fabrics::{CNTLID_DYNAMIC, DISCOVERY_NQN};
use trellis_nvme::identify::{IdCtrl, IdNs};
use trellis_nvme::log::{self, GetLogPage, Smart};
use trellis_nvme::pdu::Digests;
use trellis_nvme::sqe::{admin, io};
use trellis_nvme::status::{generic, specific};
use trellis_nvme::{Sgl, Sqe};

const NO: Digests = Digests {
    header: false,
    data: false,
};
const BOTH: Digests = Digests {
    header: true,
    data: true,
};

fn identify(q: &mut Queue, cns: u8, nsid: u32) -> (trellis_nvme::Cqe, Vec<u8>) {
    let mut s = Sqe::new(admin::IDENTIFY, 0, nsid);
    s.set_cdw(10, cns as u32);
    q.cmd(s, &[], 4096, 0)
}

fn get_log(q: &mut Queue, lid: u8, nsid: u32, len: u64, off: u64) -> (trellis_nvme::Cqe, Vec<u8>) {
    let s = GetLogPage {
        lid,
        lsp: 0,
        rae: false,
        len_bytes: len,
        offset_bytes: off,
    }
    .to_sqe(0, nsid);
    q.cmd(s, &[], len as usize, 0)
}

#[test]
fn identify_reports_what_linux_checks() {
    let t = start_target();
    let mut c = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    let (cqe, d) = identify(&mut c.admin, 1, 0);
    assert!(cqe.status.is_success());
    let id = IdCtrl::decode(&d);
    assert_eq!(
        id.cntlid, c.cntlid,
        "Identify CNTLID equals the Connect result"
    );
    assert_eq!(id.subnqn, NQN);
    assert!(id.kas > 0 && id.ioccsz >= 4 && id.cntrltype == 1);
    let (cqe, d) = identify(&mut c.admin, 0, 1);
    assert!(cqe.status.is_success());
    let ns = IdNs::decode(&d);
    assert_eq!(
        (ns.nsze, ns.ncap, ns.block_size()),
        (16 << 20 >> 9, 16 << 20 >> 9, 512)
    );
    let (cqe, d) = identify(&mut c.admin, 2, 0);
    assert!(cqe.status.is_success());
    assert_eq!(trellis_nvme::le32(&d, 0), 1);
    assert_eq!(trellis_nvme::le32(&d, 4), 0);
    let (cqe, d) = identify(&mut c.admin, 3, 1);
    assert!(cqe.status.is_success());
    assert_eq!((d[0], d[1]), (1, 8), "EUI-64 descriptor first");
    assert_eq!((d[12], d[13]), (2, 16), "then the NGUID");
    assert_eq!((d[32], d[33]), (3, 16), "then the UUID");
    // An inactive NSID within NN (1024, fixed so namespaces may be added
    // live) reads as zeroes; beyond NN it is invalid.
    let (cqe, d) = identify(&mut c.admin, 0, 5);
    assert!(cqe.status.is_success() && d.iter().all(|&b| b == 0));
    let (cqe, _) = identify(&mut c.admin, 0, 1025);
    assert_eq!(cqe.status, generic::INVALID_NAMESPACE.dnr());
    t.stop().unwrap();
}

#[test]
fn write_read_verify_in_capsule_and_r2t_with_and_without_digests() {
    write_read_verify_on(trellis_node::config::SocketEngine::Epoll);
}

#[test]
fn write_read_verify_with_the_io_uring_socket_engine() {
    write_read_verify_on(trellis_node::config::SocketEngine::Uring);
}

fn write_read_verify_on(engine: trellis_node::config::SocketEngine) {
    let t = start_target_with(engine);
    for dg in [NO, BOTH] {
        let mut c = controller(t.local_addrs[0], NQN, 2, dg, 5000);
        for (q, blocks) in [(0usize, 8usize), (1, 256)] {
            // 4 KiB fits in-capsule (8 KiB ICD); 128 KiB goes by R2T/H2CData.
            let data = pattern(100, blocks, blocks as u64);
            let cqe = write(&mut c.io[q], 100, &data);
            assert!(
                cqe.status.is_success(),
                "write {blocks} blocks: {:?}",
                cqe.status
            );
            let (cqe, back) = read(&mut c.io[q], 100, blocks as u32);
            assert!(cqe.status.is_success());
            assert!(
                back == data,
                "read back what was written ({blocks} blocks, digests {dg:?})"
            );
        }
    }
    t.stop().unwrap();
}

#[test]
fn flush_write_zeroes_and_deallocate_zero_the_data() {
    let t = start_target();
    let mut c = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    let q = &mut c.io[0];
    assert!(write(q, 0, &pattern(0, 64, 1)).status.is_success());
    let (cqe, _) = q.cmd(Sqe::new(io::FLUSH, 0, 1), &[], 0, 8192);
    assert!(cqe.status.is_success());
    // Write Zeroes of blocks 0..8.
    let mut wz = Sqe::rw(io::WRITE_ZEROES, 0, 1, 0, 8, false);
    wz.set_sgl(Sgl::transport(0));
    assert!(q.cmd(wz, &[], 0, 8192).0.status.is_success());
    let (_, d) = read(q, 0, 8);
    assert!(d.iter().all(|&b| b == 0), "write zeroes cleared the range");
    // Deallocate blocks 16..48 with a 4 KiB range list, as Linux sends.
    let mut ranges = vec![0u8; 4096];
    trellis_nvme::put32(&mut ranges, 4, 32);
    trellis_nvme::put64(&mut ranges, 8, 16);
    let mut dsm = Sqe::new(io::DATASET_MANAGEMENT, 0, 1);
    dsm.set_cdw(10, 0);
    dsm.set_cdw(11, 1 << 2);
    assert!(q.cmd(dsm, &ranges, 0, 8192).0.status.is_success());
    let (_, d) = read(q, 16, 32);
    assert!(
        d.iter().all(|&b| b == 0),
        "deallocated blocks read as zeroes"
    );
    let (_, d) = read(q, 8, 8);
    assert_eq!(
        d,
        pattern(0, 64, 1)[8 * 512..16 * 512],
        "blocks outside the ranges are untouched"
    );
    t.stop().unwrap();
}

#[test]
fn smart_log_counts_host_commands_and_data_units() {
    let t = start_target();
    let mut c = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    for i in 0..10u64 {
        assert!(write(&mut c.io[0], i * 1000, &pattern(i, 200, 0))
            .status
            .is_success());
    }
    for i in 0..3u64 {
        read(&mut c.io[0], i * 1000, 200);
    }
    // Reactors publish their counters in batches (about every millisecond,
    // or every idle sleep): poll until they appear, failing after 5 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let s = loop {
        let (cqe, d) = get_log(&mut c.admin, log::lid::SMART, 0xFFFF_FFFF, 512, 0);
        assert!(cqe.status.is_success());
        let s = Smart::decode(&d);
        if s.host_read_commands == 3 || std::time::Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert_eq!(s.host_write_commands, 10);
    assert_eq!(s.host_read_commands, 3);
    assert_eq!(s.data_units_written, log::data_units(10 * 200 * 512));
    assert_eq!(s.data_units_read, log::data_units(3 * 200 * 512));
    t.stop().unwrap();
}

#[test]
fn discovery_log_lists_allowed_subsystem_and_zero_fills() {
    let t = start_target();
    let mut q = Queue::open(t.local_addrs[0], NO);
    let c = q.fabrics_connect(0, 31, DISCOVERY_NQN, HOST, CNTLID_DYNAMIC, 0);
    assert!(c.status.is_success());
    assert!(q.prop_set(0x14, 1).status.is_success());
    let (cqe, d) = identify(&mut q, 1, 0);
    assert!(cqe.status.is_success());
    assert_eq!(
        IdCtrl::decode(&d).cntrltype,
        2,
        "a discovery controller says so"
    );
    let (cqe, hdr) = get_log(&mut q, log::lid::DISCOVERY, 0, 20, 0);
    assert!(cqe.status.is_success());
    let (_, numrec, recfmt) = log::decode_discovery_header(&hdr);
    assert_eq!((numrec, recfmt), (2, 0), "self entry plus the subsystem");
    let (cqe, e) = get_log(&mut q, log::lid::DISCOVERY, 0, 4096, 1024);
    assert!(cqe.status.is_success());
    let me = log::DiscoveryEntry::decode(&e[0..1024]);
    assert_eq!(me.subtype, log::subtype::CURRENT_DISCOVERY);
    let sub = log::DiscoveryEntry::decode(&e[1024..2048]);
    assert_eq!(sub.subnqn, NQN);
    assert_eq!(sub.traddr, "127.0.0.1");
    assert_eq!(sub.trsvcid, t.local_addrs[0].port().to_string());
    assert!(
        e[2048..].iter().all(|&b| b == 0),
        "past the end reads zeroes"
    );
    t.stop().unwrap();
}

#[test]
fn connect_refuses_unknown_host_and_subsystem_with_dnr() {
    let t = start_target();
    let mut q = Queue::open(t.local_addrs[0], NO);
    let c = q.fabrics_connect(
        0,
        31,
        NQN,
        "nqn.2014-08.org.example:intruder",
        CNTLID_DYNAMIC,
        0,
    );
    assert_eq!(c.status, specific::CONNECT_INVALID_HOST.dnr());
    let c = q.fabrics_connect(
        0,
        31,
        "nqn.2026-11.io.trellis:nope",
        HOST,
        CNTLID_DYNAMIC,
        0,
    );
    assert_eq!(c.status, specific::CONNECT_INVALID_PARAMS.dnr());
    assert_eq!(c.dw0, (1 << 16) | 256, "IATTR data, IPO = SUBNQN offset");
    // An I/O queue for a controller that does not exist.
    let mut q2 = Queue::open(t.local_addrs[0], NO);
    let c = q2.fabrics_connect(1, 31, NQN, HOST, 999, 0);
    assert_eq!(c.status, specific::CONNECT_INVALID_PARAMS.dnr());
    // The allowed host still gets a working controller after the refusals.
    let mut ok = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    assert!(write(&mut ok.io[0], 0, &pattern(0, 8, 1))
        .status
        .is_success());
    t.stop().unwrap();
}

#[test]
fn keep_alive_timeout_tears_down_the_controller_and_its_queues() {
    let t = start_target();
    let mut c = controller(t.local_addrs[0], NQN, 1, NO, 1000);
    let (cqe, _) = c.admin.cmd(Sqe::new(admin::KEEP_ALIVE, 0, 0), &[], 0, 0);
    assert!(cqe.status.is_success());
    // No keep-alive for longer than KATO (1 s): both queues are closed.
    std::thread::sleep(std::time::Duration::from_millis(1600));
    assert!(c.admin.closed(), "admin queue closed after KATO");
    assert!(c.io[0].closed(), "I/O queue closed with its controller");
    t.stop().unwrap();
}

#[test]
fn set_features_number_of_queues_bounds_io_queue_connects() {
    let t = start_target();
    let mut c = controller(t.local_addrs[0], NQN, 0, NO, 5000);
    let mut s = Sqe::new(admin::SET_FEATURES, 0, 0);
    s.set_cdw(10, 0x07);
    s.set_cdw(11, 1 | 1 << 16); // 2 queues, 0-based
    let (cqe, _) = c.admin.cmd(s, &[], 0, 0);
    assert!(cqe.status.is_success());
    assert_eq!(cqe.dw0, 1 | 1 << 16);
    let mut q3 = Queue::open(t.local_addrs[0], NO);
    let r = q3.fabrics_connect(3, 31, NQN, HOST, c.cntlid, 0);
    assert_eq!(
        r.status,
        specific::CONNECT_INVALID_PARAMS.dnr(),
        "qid beyond the granted count"
    );
    let mut q2 = Queue::open(t.local_addrs[0], NO);
    assert!(q2
        .fabrics_connect(2, 31, NQN, HOST, c.cntlid, 0)
        .status
        .is_success());
    let mut again = Queue::open(t.local_addrs[0], NO);
    let r = again.fabrics_connect(2, 31, NQN, HOST, c.cntlid, 0);
    assert_eq!(
        r.status,
        generic::COMMAND_SEQUENCE_ERROR.dnr(),
        "a qid connects once"
    );
    t.stop().unwrap();
}

#[test]
fn shutdown_notification_reports_complete() {
    let t = start_target();
    let mut c = controller(t.local_addrs[0], NQN, 0, NO, 5000);
    assert!(c.admin.prop_set(0x14, 0x0046_4001).status.is_success());
    assert_eq!(
        c.admin.prop_get(0x1c, false) & 0xc,
        0x8,
        "CSTS.SHST = shutdown complete"
    );
    t.stop().unwrap();
}

/// A target over a file backend, for durability and read-only checks.
fn file_target(path: &std::path::Path, read_only: bool) -> trellis_node::Target {
    use trellis_node::config::*;
    let mut cfg = Config::embedded_default();
    cfg.listeners = vec![ListenerConfig {
        name: None,
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: None,
        ana_state: None,
        secure_channel: None,
    }];
    let mut ns = NamespaceConfig::sized(BackendKind::File, 8 << 20);
    ns.path = Some(path.to_str().unwrap().into());
    ns.read_only = read_only;
    cfg.subsystems = vec![SubsystemConfig {
        nqn: NQN.into(),
        serial: "FILE1".into(),
        model: "Trellis file".into(),
        allow_any_host: Some(true),
        allowed_hosts: vec![],
        hosts: vec![],
        namespaces: vec![ns],
        listeners: None,
    }];
    trellis_node::Target::start(&cfg).unwrap()
}

#[test]
fn file_backend_keeps_acknowledged_writes_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ns1.img");
    let data = pattern(7, 256, 42);
    {
        let t = file_target(&path, false);
        let mut c = controller(t.local_addrs[0], NQN, 1, NO, 5000);
        // One FUA write (durable at completion) and one plain write + Flush.
        let mut fua = Sqe::rw(io::WRITE, 0, 1, 7, 256, true);
        fua.set_sgl(Sgl::transport(256 * 512));
        assert!(c.io[0].cmd(fua, &data, 0, 8192).0.status.is_success());
        assert!(write(&mut c.io[0], 1000, &data[..8 * 512])
            .status
            .is_success());
        assert!(c.io[0]
            .cmd(Sqe::new(io::FLUSH, 0, 1), &[], 0, 8192)
            .0
            .status
            .is_success());
        t.stop().unwrap();
    }
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(
        &on_disk[7 * 512..(7 + 256) * 512],
        &data[..],
        "FUA write is in the file"
    );
    assert_eq!(
        &on_disk[1000 * 512..1008 * 512],
        &data[..8 * 512],
        "flushed write is in the file"
    );
    let t = file_target(&path, false);
    let mut c = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    let (cqe, back) = read(&mut c.io[0], 7, 256);
    assert!(cqe.status.is_success());
    assert!(
        back == data,
        "a restarted target serves the data written before"
    );
    t.stop().unwrap();
}

#[test]
fn read_only_namespace_refuses_writes_and_serves_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.img");
    std::fs::write(&path, vec![0x5Au8; 1 << 20]).unwrap();
    let t = file_target(&path, true);
    let mut c = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    assert_eq!(
        write(&mut c.io[0], 0, &pattern(0, 8, 0)).status,
        generic::NS_WRITE_PROTECTED.dnr()
    );
    // 128 KiB: the refusal must come before any R2T.
    assert_eq!(
        write(&mut c.io[0], 0, &pattern(0, 256, 0)).status,
        generic::NS_WRITE_PROTECTED.dnr()
    );
    let (cqe, d) = read(&mut c.io[0], 0, 8);
    assert!(cqe.status.is_success());
    assert!(d.iter().all(|&b| b == 0x5A));
    let (cqe, d) = identify(&mut c.admin, 0, 1);
    assert!(cqe.status.is_success());
    assert!(
        IdNs::decode(&d).read_only,
        "Identify Namespace reports write protection"
    );
    t.stop().unwrap();
}

#[test]
fn aers_are_held_and_limited_and_errors_are_logged() {
    let t = start_target();
    let mut c = controller(t.local_addrs[0], NQN, 1, NO, 5000);
    // Four AERs are held (no completion); a fifth is refused at once.
    for _ in 0..4 {
        let mut s = Sqe::new(admin::ASYNC_EVENT_REQUEST, c.admin.next_cid(), 0);
        s.set_sgl(Sgl::transport(0));
        c.admin.send_capsule(&s, &[]);
    }
    let (cqe, _) = c
        .admin
        .cmd(Sqe::new(admin::ASYNC_EVENT_REQUEST, 0, 0), &[], 0, 0);
    assert_eq!(
        cqe.status,
        specific::AER_LIMIT_EXCEEDED,
        "only the fifth AER completes"
    );
    // A failed I/O command lands in the error log with its CID and status.
    let mut bad = Sqe::rw(io::READ, 0, 1, 1 << 40, 1, false);
    bad.set_sgl(Sgl::transport(512));
    let (cqe, _) = c.io[0].cmd(bad, &[], 512, 8192);
    assert_eq!(cqe.status, generic::LBA_OUT_OF_RANGE.dnr());
    let (cqe, log_page) = get_log(&mut c.admin, log::lid::ERROR, 0, 4096, 0);
    assert!(cqe.status.is_success());
    let count = trellis_nvme::le64(&log_page, 0);
    assert!(count >= 1, "error count recorded");
    assert_eq!(
        trellis_nvme::le16(&log_page, 8),
        1,
        "SQID of the failed command"
    );
    assert_eq!(
        trellis_nvme::Status::from_wire(trellis_nvme::le16(&log_page, 12)),
        generic::LBA_OUT_OF_RANGE.dnr()
    );
    t.stop().unwrap();
}

#[test]
fn features_round_trip_and_unknown_ones_are_refused() {
    let t = start_target();
    let mut c = controller(t.local_addrs[0], NQN, 0, NO, 5000);
    let feat = |q: &mut Queue, set: bool, fid: u32, v: u32| {
        let mut s = Sqe::new(
            if set {
                admin::SET_FEATURES
            } else {
                admin::GET_FEATURES
            },
            0,
            0,
        );
        s.set_cdw(10, fid);
        s.set_cdw(11, v);
        q.cmd(s, &[], 0, 0).0
    };
    assert!(feat(&mut c.admin, true, 0x0F, 7000).status.is_success());
    assert_eq!(
        feat(&mut c.admin, false, 0x0F, 0).dw0,
        7000,
        "KATO reads back in ms"
    );
    assert!(feat(&mut c.admin, true, 0x04, 0x160).status.is_success());
    assert_eq!(feat(&mut c.admin, false, 0x04, 0).dw0, 0x160);
    assert!(feat(&mut c.admin, true, 0x0B, 0x100).status.is_success());
    assert_eq!(
        feat(&mut c.admin, true, 0x0B, 1 << 20).status,
        generic::INVALID_FIELD.dnr(),
        "unknown AEC bits"
    );
    assert_eq!(
        feat(&mut c.admin, true, 0x7E, 0).status,
        generic::INVALID_FIELD.dnr(),
        "unknown feature"
    );
    assert_eq!(
        feat(&mut c.admin, true, 0x0F | 1 << 31, 1).status,
        specific::FEATURE_NOT_SAVEABLE.dnr()
    );
    // CAP as one 8-byte read equals its two 4-byte halves.
    let cap = c.admin.prop_get(0, true);
    let lo = c.admin.prop_get(0, false);
    let hi = c.admin.prop_get(4, false);
    assert_eq!(cap, lo | hi << 32);
    assert_eq!(c.admin.prop_get(0x08, false), 0x0001_0400, "VS 1.4");
    t.stop().unwrap();
}

#[test]
fn discovery_only_listener_refuses_io_subsystems() {
    use trellis_node::config::*;
    let mut cfg = Config::embedded_default();
    cfg.listeners = vec![ListenerConfig {
        name: None,
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: Some(ListenerKind::Discovery),
        ana_state: None,
        secure_channel: None,
    }];
    let t = trellis_node::Target::start(&cfg).unwrap();
    let mut q = Queue::open(t.local_addrs[0], NO);
    let c = q.fabrics_connect(0, 31, DEFAULT_NQN, HOST, CNTLID_DYNAMIC, 0);
    assert_eq!(c.status, specific::CONNECT_INVALID_PARAMS.dnr());
    let mut d = Queue::open(t.local_addrs[0], NO);
    assert!(d
        .fabrics_connect(0, 31, DISCOVERY_NQN, HOST, CNTLID_DYNAMIC, 0)
        .status
        .is_success());
    t.stop().unwrap();
}

#[test]
fn null_namespace_discards_writes_and_reads_zeroes_with_digests() {
    use trellis_node::config::*;
    let mut cfg = Config::embedded_default();
    cfg.listeners = vec![ListenerConfig {
        name: None,
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: None,
        ana_state: None,
        secure_channel: None,
    }];
    cfg.subsystems[0].nqn = NQN.into();
    cfg.subsystems[0].namespaces = vec![NamespaceConfig::sized(BackendKind::Null, 64 << 20)];
    let t = trellis_node::Target::start(&cfg).unwrap();
    for dg in [NO, BOTH] {
        let mut c = controller(t.local_addrs[0], NQN, 1, dg, 5000);
        // Dirty the slot buffers with a write first: reads must still be zeroes.
        assert!(write(&mut c.io[0], 0, &pattern(0, 8, 9))
            .status
            .is_success());
        assert!(write(&mut c.io[0], 0, &pattern(0, 256, 9))
            .status
            .is_success());
        for blocks in [8u32, 256] {
            let (cqe, d) = read(&mut c.io[0], 0, blocks);
            assert!(cqe.status.is_success());
            assert_eq!(d.len(), blocks as usize * 512);
            assert!(
                d.iter().all(|&b| b == 0),
                "null reads are zeroes ({blocks} blocks, {dg:?})"
            );
        }
    }
    t.stop().unwrap();
}

/// With SQ flow control disabled (what `nvme connect-all` asks for when the
/// discovery log says it is supported), SQHD is 0xFFFF and successful reads
/// end with a C2HData carrying SUCCESS and no CapsuleResp.
#[test]
fn sq_flow_control_disabled_uses_success_flag_reads() {
    let t = start_target();
    let mut c = controller(t.local_addrs[0], NQN, 0, NO, 5000);
    let mut q = Queue::open(t.local_addrs[0], NO);
    let r = q.fabrics_connect_attr(1, 127, NQN, HOST, c.cntlid, 0, 0x4);
    assert!(r.status.is_success());
    assert_eq!(r.sqhd, 0xFFFF, "SQHD is not maintained");
    assert!(write(&mut q, 0, &pattern(0, 8, 3)).status.is_success());
    let mut sqe = Sqe::rw(io::READ, 0, 1, 0, 8, false);
    let cid = q.next_cid();
    sqe.set_cid(cid);
    sqe.set_sgl(Sgl::transport(4096));
    q.send_capsule(&sqe, &[]);
    let p = q.recv().unwrap();
    assert_eq!(p.ch.pdu_type, trellis_nvme::pdu::PduType::C2HData as u8);
    let fl = trellis_nvme::pdu::flags::SUCCESS | trellis_nvme::pdu::flags::LAST_PDU;
    assert_eq!(p.ch.flags & fl, fl, "SUCCESS with LAST_PDU");
    assert_eq!(&p.bytes[24..24 + 4096], &pattern(0, 8, 3)[..]);
    // No CapsuleResp follows: the next PDU is the answer to the next command.
    let (cqe, _) = c.admin.cmd(Sqe::new(admin::KEEP_ALIVE, 0, 0), &[], 0, 0);
    assert!(cqe.status.is_success());
    assert!(
        write(&mut q, 8, &pattern(8, 8, 3)).status.is_success(),
        "the next PDU on the queue is the write's CapsuleResp"
    );
    t.stop().unwrap();
}
