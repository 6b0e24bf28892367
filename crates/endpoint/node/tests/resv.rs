//! Persistent reservations end to end (NVMe Base 2.0 §8.19), driven by the
//! host library over TCP: 20 hosts with distinct host IDs register (more
//! than 16: SPDK's CVE-2025-57275 wrote past a 16-entry table), one
//! acquires, the others' I/O conflicts as the type says, a Report lists
//! every registrant, a preempt unregisters the holder and tells it (AEN and
//! log page 80h), a registrant past `target.max_registrants` is refused,
//! and with PTPL set the state survives a restart of the target.

mod common;

use common::*;
use std::time::{Duration, Instant};
use trellis_host::resv::{acquire, register, release, report, report_raw};
use trellis_host::{Controller, Error, HostConfig, Queue, Xfer};
use trellis_node::config::{BackendKind, NamespaceConfig};
use trellis_nvme::resv::{
    notice, AcquireAction, Cptpl, RType, RegisterAction, ReleaseAction, AEN_DW0,
};
use trellis_nvme::sqe::io;
use trellis_nvme::status::generic;
use trellis_nvme::{Sqe, Status};

/// Hosts that register: more than 16.
const REGISTERED: usize = 20;
const CONFLICT: Status = generic::RESERVATION_CONFLICT.dnr();

fn config(state: &std::path::Path) -> trellis_node::config::Config {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.subsystems[0].allow_any_host = Some(true);
    cfg.subsystems[0].allowed_hosts.clear();
    // Its own state directory, so a restart finds the same node identity
    // (and so the same namespace NGUID, which names the state file).
    cfg.target.state_dir = Some(state.into());
    cfg.target.max_registrants = REGISTERED;
    cfg
}

/// Host `i`: its own NQN and host ID.
fn host_cfg(i: usize) -> HostConfig {
    let hostnqn = format!("nqn.2014-08.org.nvmexpress:uuid:resv-test-host-{i:04}");
    HostConfig {
        hostid: trellis_host::ctrl::hostid_from(&hostnqn),
        hostnqn,
        kato_ms: 0,
        ..Default::default()
    }
}

struct Host {
    ctrl: Controller,
    q: Queue,
    id: [u8; 16],
}

fn connect(addr: &str, i: usize) -> Host {
    let cfg = host_cfg(i);
    let mut ctrl = Controller::connect(addr, NQN, &cfg).unwrap();
    assert_ne!(ctrl.id.oncs & (1 << 5), 0, "ONCS bit 5: Reservations");
    ctrl.set_num_queues(1).unwrap();
    let q = ctrl.connect_io_queue(8, 8192).unwrap();
    Host {
        ctrl,
        q,
        id: cfg.hostid,
    }
}

fn key(i: usize) -> u64 {
    0x1000 + i as u64
}

fn status<T: std::fmt::Debug>(r: trellis_host::Result<T>) -> Status {
    match r {
        Err(Error::Nvme(st)) => st,
        other => panic!("want an NVMe status, got {other:?}"),
    }
}

fn write(h: &mut Host) -> trellis_host::Result<()> {
    let data = vec![0x5Au8; 512];
    let sqe = Sqe::rw(io::WRITE, 0, 1, 8, 1, false);
    h.q.exec_ok(sqe, Xfer::ToCtrl(512), &data, &mut [])
        .map(drop)
}

fn read(h: &mut Host) -> trellis_host::Result<()> {
    let mut out = vec![0u8; 512];
    let sqe = Sqe::rw(io::READ, 0, 1, 8, 1, false);
    h.q.exec_ok(sqe, Xfer::FromCtrl(512), &[], &mut out)
        .map(drop)
}

fn flush(h: &mut Host) -> trellis_host::Result<()> {
    h.q.exec_ok(Sqe::new(io::FLUSH, 0, 1), Xfer::None, &[], &mut [])
        .map(drop)
}

/// The completion DW0 of the AER armed on `h`, waiting up to 5 s.
fn wait_event(h: &mut Host) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Some(dw0) = h.ctrl.poll_event().unwrap() {
            return dw0;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("no asynchronous event within 5 s");
}

#[test]
fn twenty_hosts_register_acquire_conflict_preempt_and_persist() {
    let state = tempfile::tempdir().unwrap();
    let cfg = config(state.path());
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.local_addrs[0].to_string();
    let mut hosts: Vec<Host> = (0..=REGISTERED).map(|i| connect(&addr, i)).collect();
    let mut outsider = hosts.pop().unwrap();

    // Everyone registers; host 0 also sets Persist Through Power Loss.
    for (i, h) in hosts.iter_mut().enumerate() {
        let cptpl = if i == 0 { Cptpl::Set } else { Cptpl::NoChange };
        register(
            &mut h.q,
            1,
            RegisterAction::Register,
            false,
            cptpl,
            0,
            key(i),
        )
        .unwrap();
    }
    assert!(hosts[0].ctrl.ptpl(1).unwrap(), "Get Features 83h: PTPL set");
    // The bound: a registrant past target.max_registrants is refused.
    let r = register(
        &mut outsider.q,
        1,
        RegisterAction::Register,
        false,
        Cptpl::NoChange,
        0,
        7,
    );
    assert_eq!(status(r), generic::CAPACITY_EXCEEDED.dnr());
    // Wrong keys conflict.
    let h1 = &mut hosts[1];
    let r = acquire(
        &mut h1.q,
        1,
        AcquireAction::Acquire,
        RType::WriteExclusive,
        99,
        0,
    );
    assert_eq!(status(r), CONFLICT, "acquire with a wrong CRKEY");
    let r = register(
        &mut h1.q,
        1,
        RegisterAction::Replace,
        false,
        Cptpl::NoChange,
        99,
        5,
    );
    assert_eq!(status(r), CONFLICT, "replace with a wrong CRKEY");

    // Host 0 takes a Write Exclusive reservation.
    acquire(
        &mut hosts[0].q,
        1,
        AcquireAction::Acquire,
        RType::WriteExclusive,
        key(0),
        0,
    )
    .unwrap();
    write(&mut hosts[0]).expect("the holder writes");
    for h in hosts.iter_mut().skip(1).chain([&mut outsider]) {
        assert_eq!(status(write(h)), CONFLICT, "non-holders may not write");
        assert_eq!(status(flush(h)), CONFLICT, "Flush is in the write group");
        read(h).expect("Write Exclusive lets everyone read");
    }
    let r = acquire(
        &mut hosts[2].q,
        1,
        AcquireAction::Acquire,
        RType::WriteExclusive,
        key(2),
        0,
    );
    assert_eq!(status(r), CONFLICT, "held by host 0");

    // The Report lists all 20 registrants, host 0 as the holder.
    let (hdr, regs) = report(&mut hosts[5].q, 1, 64).unwrap();
    assert_eq!((hdr.regctl as usize, regs.len()), (REGISTERED, REGISTERED));
    assert_eq!(
        (hdr.rtype, hdr.ptpls, hdr.gen),
        (1, true, REGISTERED as u32)
    );
    for (i, h) in hosts.iter().enumerate() {
        let e = regs.iter().find(|r| r.hostid == h.id).expect("host listed");
        assert_eq!((e.rkey, e.holds), (key(i), i == 0), "host {i}");
    }
    // A buffer for fewer entries than there are: those that fit, REGCTL all.
    let (hdr, regs) = report(&mut hosts[5].q, 1, 3).unwrap();
    assert_eq!((hdr.regctl as usize, regs.len()), (REGISTERED, 3));
    let mut page = [0u8; 64];
    let r = report_raw(&mut hosts[5].q, 1, false, &mut page);
    assert_eq!(status(r), generic::HOST_ID_INCONSISTENT.dnr(), "EDS = 0");
    let mut short = [0u8; 32];
    let r = report_raw(&mut hosts[5].q, 1, true, &mut short);
    assert_eq!(
        status(r),
        generic::INVALID_FIELD.dnr(),
        "shorter than the header"
    );

    // Host 1 preempts host 0 into Exclusive Access; host 0 is told.
    hosts[0].ctrl.arm_event().unwrap();
    acquire(
        &mut hosts[1].q,
        1,
        AcquireAction::Preempt,
        RType::ExclusiveAccess,
        key(1),
        key(0),
    )
    .unwrap();
    assert_eq!(wait_event(&mut hosts[0]), AEN_DW0);
    let n = hosts[0].ctrl.resv_notice().unwrap();
    assert_eq!(
        (n.kind, n.nsid, n.available),
        (notice::REGISTRATION_PREEMPTED, 1, 0)
    );
    assert_eq!(hosts[0].ctrl.resv_notice().unwrap().kind, notice::EMPTY);
    assert_eq!(status(write(&mut hosts[0])), CONFLICT, "preempted");
    assert_eq!(
        status(read(&mut hosts[3])),
        CONFLICT,
        "Exclusive Access: no reads either"
    );
    write(&mut hosts[1]).expect("the new holder writes");
    let (hdr, regs) = report(&mut hosts[1].q, 1, 64).unwrap();
    assert_eq!((hdr.regctl, hdr.rtype, hdr.gen), (19, 2, 21));
    assert!(
        !regs.iter().any(|r| r.hostid == hosts[0].id),
        "host 0 unregistered"
    );
    let want: Vec<_> = regs.iter().map(|r| (r.hostid, r.rkey, r.holds)).collect();

    // Restart: with PTPL the reservation and its 19 registrants come back.
    drop(hosts);
    drop(outsider);
    t.stop().unwrap();
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.local_addrs[0].to_string();
    let mut h1 = connect(&addr, 1);
    let mut h2 = connect(&addr, 2);
    let (hdr, regs) = report(&mut h2.q, 1, 64).unwrap();
    assert_eq!(
        (hdr.regctl, hdr.rtype, hdr.gen, hdr.ptpls),
        (19, 2, 21, true)
    );
    let got: Vec<_> = regs.iter().map(|r| (r.hostid, r.rkey, r.holds)).collect();
    assert_eq!(got, want, "the same registrants, keys and holder");
    assert_eq!(
        status(write(&mut h2)),
        CONFLICT,
        "enforced after the restart"
    );
    write(&mut h1).expect("the holder still writes");
    // Clear ends it all and tells the others their reservation went.
    h2.ctrl.arm_event().unwrap();
    release(&mut h1.q, 1, ReleaseAction::Clear, 0, key(1)).unwrap();
    assert_eq!(wait_event(&mut h2), AEN_DW0);
    assert_eq!(
        h2.ctrl.resv_notice().unwrap().kind,
        notice::RESERVATION_PREEMPTED
    );
    write(&mut h2).expect("no reservation: anyone writes");
    let (hdr, regs) = report(&mut h2.q, 1, 64).unwrap();
    assert_eq!((hdr.regctl, hdr.rtype, regs.len()), (0, 0, 0));
    drop((h1, h2));
    t.stop().unwrap();
}

#[test]
fn without_ptpl_a_restart_forgets_the_reservation() {
    let state = tempfile::tempdir().unwrap();
    let cfg = config(state.path());
    let t = trellis_node::Target::start(&cfg).unwrap();
    let mut h = connect(&t.local_addrs[0].to_string(), 0);
    register(
        &mut h.q,
        1,
        RegisterAction::Register,
        false,
        Cptpl::NoChange,
        0,
        1,
    )
    .unwrap();
    acquire(
        &mut h.q,
        1,
        AcquireAction::Acquire,
        RType::ExclusiveAccess,
        1,
        0,
    )
    .unwrap();
    assert!(!h.ctrl.ptpl(1).unwrap());
    drop(h);
    t.stop().unwrap();
    let t = trellis_node::Target::start(&cfg).unwrap();
    let mut h = connect(&t.local_addrs[0].to_string(), 3);
    let (hdr, _) = report(&mut h.q, 1, 4).unwrap();
    assert_eq!((hdr.regctl, hdr.rtype), (0, 0));
    write(&mut h).expect("nothing held");
    drop(h);
    t.stop().unwrap();
}

/// Malformed reservation commands from a peer fail with the status that
/// names what is wrong, and the connection stays usable.
#[test]
fn malformed_reservation_commands_fail_with_their_status() {
    use trellis_nvme::log::lid;
    use trellis_nvme::pdu::Digests;
    use trellis_nvme::sqe::admin;
    let t = start_target();
    let mut c = controller(t.local_addrs[0], NQN, 1, Digests::default(), 0);
    let q = &mut c.io[0];
    let mut run = |op: u8, nsid: u32, cdw10: u32, data: &[u8]| {
        let mut s = Sqe::new(op, 0, nsid);
        s.set_cdw(10, cdw10);
        q.cmd(s, data, 0, 8192).0.status
    };
    let keys = [0u8; 16];
    let invalid = generic::INVALID_FIELD.dnr();
    assert_eq!(
        run(io::RESV_REGISTER, 1, 0, &keys[..8]),
        generic::DATA_SGL_LENGTH_INVALID.dnr(),
        "Register carries 16 bytes"
    );
    assert_eq!(run(io::RESV_REGISTER, 1, 3, &keys), invalid, "RREGA 3");
    assert_eq!(
        run(io::RESV_REGISTER, 1, 1 << 30, &keys),
        invalid,
        "CPTPL 01b"
    );
    assert_eq!(
        run(io::RESV_REGISTER, 99, 0, &keys),
        generic::INVALID_NAMESPACE.dnr()
    );
    assert_eq!(run(io::RESV_ACQUIRE, 1, 0, &keys), invalid, "RTYPE 0");
    assert_eq!(run(io::RESV_ACQUIRE, 1, 7 << 8, &keys), invalid, "RTYPE 7");
    assert_eq!(
        run(io::RESV_ACQUIRE, 1, 3 | 1 << 8, &keys),
        invalid,
        "RACQA 3"
    );
    assert_eq!(run(io::RESV_RELEASE, 1, 2, &keys[..8]), invalid, "RRELA 2");
    assert_eq!(
        run(io::RESV_RELEASE, 1, 0, &keys[..8]),
        CONFLICT,
        "not registered"
    );
    // Still serving: a register and a report work on the same queue.
    assert!(run(io::RESV_REGISTER, 1, 0, &keys).is_success());
    let a = &mut c.admin;
    let mut s = Sqe::new(admin::SET_FEATURES, 0, 1);
    s.set_cdw(10, 0x82);
    s.set_cdw(11, 1);
    assert_eq!(
        a.cmd(s, &[], 0, 0).0.status,
        invalid,
        "mask bit 0 is reserved"
    );
    let mut s = Sqe::new(admin::GET_FEATURES, 0, 0);
    s.set_cdw(10, 0x83);
    assert_eq!(
        a.cmd(s, &[], 0, 0).0.status,
        generic::INVALID_NAMESPACE.dnr(),
        "PTPL of NSID 0"
    );
    // No notice queued: an empty log page, not an error.
    let (cqe, page) = get_log(a, lid::RESERVATION, 0xFFFF_FFFF, 64);
    assert!(cqe.status.is_success(), "{:?}", cqe.status);
    assert!(page.iter().all(|&b| b == 0));
    let (cqe, page) = get_log(a, lid::SUPPORTED_LOGS, 0, 1024);
    assert!(cqe.status.is_success());
    assert_ne!(page[lid::RESERVATION as usize * 4], 0, "log 80h is listed");
    drop(c);
    t.stop().unwrap();
}

/// A registration belongs to a host: every controller it connects with
/// the same host ID shares it, and a notice goes to each of them unless
/// that controller masked it (Set Features 82h).
#[test]
fn a_host_is_all_its_controllers_and_masks_are_per_controller() {
    let state = tempfile::tempdir().unwrap();
    let t = trellis_node::Target::start(&config(state.path())).unwrap();
    let addr = t.local_addrs[0].to_string();
    let (mut a1, mut a2, mut a3) = (connect(&addr, 0), connect(&addr, 0), connect(&addr, 0));
    let mut b = connect(&addr, 1);
    register(
        &mut a1.q,
        1,
        RegisterAction::Register,
        false,
        Cptpl::NoChange,
        0,
        1,
    )
    .unwrap();
    let r = register(
        &mut a2.q,
        1,
        RegisterAction::Register,
        false,
        Cptpl::NoChange,
        0,
        2,
    );
    assert_eq!(status(r), CONFLICT, "already registered, with key 1");
    acquire(
        &mut a2.q,
        1,
        AcquireAction::Acquire,
        RType::ExclusiveAccess,
        1,
        0,
    )
    .unwrap();
    write(&mut a1).expect("the holder's other controller writes");
    assert_eq!(status(read(&mut b)), CONFLICT);
    let (hdr, regs) = report(&mut b.q, 1, 8).unwrap();
    assert_eq!(
        (hdr.regctl, regs[0].hostid, regs[0].holds),
        (1, a1.id, true)
    );
    // a3 masks Registration Preempted; a1 and a2 do not.
    a3.ctrl
        .set_resv_mask(1, 1 << notice::REGISTRATION_PREEMPTED)
        .unwrap();
    a1.ctrl.arm_event().unwrap();
    a2.ctrl.arm_event().unwrap();
    register(
        &mut b.q,
        1,
        RegisterAction::Register,
        false,
        Cptpl::NoChange,
        0,
        2,
    )
    .unwrap();
    acquire(
        &mut b.q,
        1,
        AcquireAction::Preempt,
        RType::ExclusiveAccess,
        2,
        1,
    )
    .unwrap();
    for h in [&mut a1, &mut a2] {
        assert_eq!(wait_event(h), AEN_DW0);
        let n = h.ctrl.resv_notice().unwrap();
        assert_eq!(n.kind, notice::REGISTRATION_PREEMPTED);
    }
    // Queued (or not) before the preempt completed: nothing for a3.
    assert_eq!(a3.ctrl.resv_notice().unwrap().kind, notice::EMPTY);
    assert_eq!(status(write(&mut a3)), CONFLICT, "a3's host was preempted");
    drop((a1, a2, a3, b));
    t.stop().unwrap();
}

/// Processor-node takeover (`trellis_host::resv::take_over`, docs/host.md)
/// ends with the caller holding the reservation, whatever the victim held:
/// Preempt and Abort of a victim that had only registered unregisters it
/// and leaves nobody holding one, so `take_over` acquires it then; and
/// from then on the victim's writes conflict. A third host holding it
/// makes `take_over` fail instead of returning as if it owned the volume.
#[test]
fn take_over_leaves_the_caller_holding_the_reservation() {
    use trellis_host::resv::{claim, take_over};
    let state = tempfile::tempdir().unwrap();
    let t = trellis_node::Target::start(&config(state.path())).unwrap();
    let addr = t.local_addrs[0].to_string();
    let (mut a, mut b, mut c) = (connect(&addr, 0), connect(&addr, 1), connect(&addr, 2));
    let we = RType::WriteExclusive;
    // A only registered; B takes over.
    register(
        &mut a.q,
        1,
        RegisterAction::Register,
        false,
        Cptpl::NoChange,
        0,
        key(0),
    )
    .unwrap();
    take_over(&mut b.q, 1, key(1), key(0), we).unwrap();
    let (hdr, regs) = report(&mut b.q, 1, 8).unwrap();
    assert_eq!(hdr.rtype, we as u8, "B holds a Write Exclusive reservation");
    assert!(regs.iter().any(|r| r.holds && r.rkey == key(1)), "{regs:?}");
    assert!(
        regs.iter().all(|r| r.rkey != key(0)),
        "A is unregistered: {regs:?}"
    );
    assert_eq!(status(write(&mut a)), CONFLICT, "A may no longer write");
    write(&mut b).unwrap();
    // B holds it: C's claim conflicts, and C's take-over naming a key that
    // holds nothing leaves B the holder, so it fails.
    assert_eq!(status(claim(&mut c.q, 1, key(2), we)), CONFLICT);
    let e = take_over(&mut c.q, 1, key(2), key(0), we);
    assert!(e.is_err(), "C does not hold the reservation: {e:?}");
    drop((a, b, c));
    t.stop().unwrap();
}
