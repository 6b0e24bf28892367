//! Fault injection through the real I/O path (feature `fault-injection`):
//! failing io_uring submits, a panicking command handler, and backend I/O
//! still in flight at shutdown. Each test drives a real target over TCP and
//! checks what a host sees and what the log says.
//!
//! The injector is process-global, so the tests here run one at a time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};
use trellis_node::config::*;
use trellis_node::sys::fault;
use trellis_node::sys::ring::SUBMIT_ATTEMPTS;
use trellis_nvme::pdu::Digests;
use trellis_nvme::sqe::io;
use trellis_nvme::status::generic;
use trellis_nvme::{Sgl, Sqe};

const NO: Digests = Digests {
    header: false,
    data: false,
};

static SERIAL: Mutex<()> = Mutex::new(());
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Sends the target's log (info and up) to LOG as well as to stderr.
struct Capture;
impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        LOG.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(b);
        std::io::stderr().write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Takes the test lock, disarms every fault and clears the captured log.
fn serial() -> MutexGuard<'static, ()> {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        tracing_subscriber::fmt()
            .with_writer(|| Capture)
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
    });
    let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    fault::reset();
    LOG.lock().unwrap_or_else(|e| e.into_inner()).clear();
    g
}

fn log() -> String {
    String::from_utf8_lossy(&LOG.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

struct Setup {
    backend: BackendKind,
    engine: SocketEngine,
    reactors: usize,
    grace_ms: u64,
    /// Never sleep: only our own traffic stages socket operations.
    spin_forever: bool,
    idle_sleep_ms: Option<u64>,
    preempt_abort_timeout_ms: Option<u64>,
    /// Namespaces of 8 MiB (NSID 1, 2, ...).
    namespaces: usize,
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            backend: BackendKind::Ram,
            engine: SocketEngine::Epoll,
            reactors: 1,
            grace_ms: 5_000,
            spin_forever: false,
            idle_sleep_ms: None,
            preempt_abort_timeout_ms: None,
            namespaces: 1,
        }
    }
}

/// A target on an ephemeral port with one 8 MiB namespace any host may use.
fn target(s: Setup) -> (trellis_node::Target, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::embedded_default();
    cfg.target.socket_engine = s.engine;
    cfg.target.reactors = s.reactors;
    cfg.target.shutdown_grace_ms = s.grace_ms;
    if s.spin_forever {
        cfg.target.idle_spin_us = 3_600_000_000;
    }
    if let Some(ms) = s.idle_sleep_ms {
        cfg.target.idle_sleep_ms = ms;
    }
    if let Some(ms) = s.preempt_abort_timeout_ms {
        cfg.target.preempt_abort_timeout_ms = ms;
    }
    cfg.listeners = vec![ListenerConfig {
        name: None,
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: None,
        ana_state: None,
        secure_channel: None,
    }];
    let namespaces = (0..s.namespaces.max(1))
        .map(|i| {
            let mut ns = NamespaceConfig::sized(s.backend, 8 << 20);
            if s.backend == BackendKind::File {
                let name = if i == 0 {
                    "ns.img".into()
                } else {
                    format!("ns{i}.img")
                };
                ns.path = Some(dir.path().join(name).to_str().unwrap().into());
            }
            ns
        })
        .collect();
    cfg.subsystems = vec![SubsystemConfig {
        nqn: NQN.into(),
        serial: "FAULT1".into(),
        model: "Trellis faults".into(),
        allow_any_host: Some(true),
        allowed_hosts: vec![],
        hosts: vec![],
        namespaces,
        listeners: None,
    }];
    cfg.target.state_dir = Some(dir.path().to_path_buf());
    (trellis_node::Target::start(&cfg).unwrap(), dir)
}

/// Writes a pattern at `slba` and reads it back.
fn round_trip(q: &mut Queue, slba: u64, gen: u64) {
    let data = pattern(slba, 8, gen);
    let w = write(q, slba, &data);
    assert!(w.status.is_success(), "write: {:?}", w.status);
    let (r, back) = read(q, slba, 8);
    assert!(r.status.is_success(), "read: {:?}", r.status);
    assert!(back == data, "read back what was written");
}

/// Sends a read of 8 blocks at `slba` without waiting for its completion.
fn send_read(q: &mut Queue, slba: u64) {
    let mut sqe = Sqe::rw(io::READ, 0, 1, slba, 8, false);
    let cid = q.next_cid();
    sqe.set_cid(cid);
    sqe.set_sgl(Sgl::transport(8 * 512));
    q.send_capsule(&sqe, &[]);
}

/// The target closes `s` within `limit` (EOF or reset), rather than
/// leaving the host hanging until its own timeout.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue, // responses queued before the close
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// Internal Error (generic 06h), the status of a request that could not be
/// submitted; DNR clear so the host retries.
fn is_retryable_internal_error(st: trellis_nvme::Status) -> bool {
    (st.sct(), st.sc()) == (0, generic::INTERNAL_ERROR.sc()) && !st.is_dnr()
}

#[test]
fn backend_submit_failures_become_command_errors_and_the_queue_recovers() {
    let _g = serial();
    let (t, _dir) = target(Setup {
        backend: BackendKind::File,
        ..Setup::default()
    });
    let mut c = controller(t.local_addrs[0], NQN, 1, NO, 0);
    let q = &mut c.io[0];
    round_trip(q, 0, 1);

    // Transient failures, one fewer than the attempts: retried, unseen by the host.
    fault::fail_submits(SUBMIT_ATTEMPTS - 1, libc::EBUSY);
    let (r, back) = read(q, 0, 8);
    assert!(r.status.is_success(), "retried read: {:?}", r.status);
    assert!(back == pattern(0, 8, 1));
    assert_eq!(
        fault::pending_submit_failures(),
        0,
        "the retries used every injected failure"
    );

    // As many transient failures as attempts: the command fails, with a
    // retryable Internal Error in its completion.
    fault::fail_submits(SUBMIT_ATTEMPTS, libc::EBUSY);
    let (r, _) = read(q, 0, 8);
    assert!(is_retryable_internal_error(r.status), "{:?}", r.status);
    assert_eq!(fault::pending_submit_failures(), 0);

    // A non-transient failure is not retried: one failure, one failed command.
    fault::fail_submits(1, libc::EIO);
    let w = write(q, 64, &pattern(64, 8, 2));
    assert!(is_retryable_internal_error(w.status), "{:?}", w.status);

    // The queue keeps serving on a fresh ring, on the same connection.
    round_trip(q, 128, 3);
    let (r, back) = read(q, 0, 8);
    assert!(r.status.is_success() && back == pattern(0, 8, 1));
    let l = log();
    assert!(l.contains("backend io_uring submit failed"), "log:\n{l}");
    assert!(!l.contains("panicked"), "log:\n{l}");
    // Both failed commands are counted for /metrics, the retried one not.
    let ns = t.reg.ns().load().by_uid[0].clone().expect("the namespace");
    let failed = ns
        .stats()
        .backend_errors
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(failed, 2, "trellis_namespace_backend_errors_total");
    t.stop().expect("the target ran without a reactor failure");
}

#[test]
fn socket_submit_failure_closes_only_the_affected_connection() {
    let _g = serial();
    let (t, _dir) = target(Setup {
        engine: SocketEngine::Uring,
        spin_forever: true,
        ..Setup::default()
    });
    let addr = t.local_addrs[0];
    let mut a = controller(addr, NQN, 1, NO, 0);
    let mut b = controller(addr, NQN, 1, NO, 0);
    round_trip(&mut a.io[0], 0, 1);
    round_trip(&mut b.io[0], 64, 1);

    // Transient failures within the retry budget change nothing.
    fault::fail_submits(SUBMIT_ATTEMPTS - 1, libc::EBUSY);
    round_trip(&mut b.io[0], 64, 2);
    assert_eq!(fault::pending_submit_failures(), 0);

    // The next submit (the reply to this read) fails for good: that
    // connection is closed, promptly and with a log line.
    fault::fail_submits(1, libc::EIO);
    send_read(&mut a.io[0], 0);
    assert!(closed_within(&mut a.io[0].s, Duration::from_secs(5)));
    assert_eq!(fault::pending_submit_failures(), 0);

    // The other connections, whose receives were running on the retired
    // ring, keep working, and new ones are served.
    round_trip(&mut b.io[0], 64, 3);
    let mut n = controller(addr, NQN, 1, NO, 0);
    round_trip(&mut n.io[0], 128, 1);
    let l = log();
    assert!(l.contains("socket io_uring submit failed"), "log:\n{l}");
    assert!(
        l.contains("closing connection: cannot queue its io_uring"),
        "log:\n{l}"
    );
    t.stop().expect("the target ran without a reactor failure");
}

#[test]
fn socket_ring_retired_while_idle_still_wakes_for_new_connections() {
    let _g = serial();
    // Long idle sleeps: the only submits with entries come from our traffic.
    let (t, _dir) = target(Setup {
        engine: SocketEngine::Uring,
        idle_sleep_ms: Some(2_000),
        ..Setup::default()
    });
    let addr = t.local_addrs[0];
    let mut a = controller(addr, NQN, 1, NO, 0);
    round_trip(&mut a.io[0], 0, 1);
    std::thread::sleep(Duration::from_millis(50)); // the reactor sleeps, wake-up and timeout armed
    fault::fail_submits(1, libc::EIO);
    send_read(&mut a.io[0], 0);
    assert!(closed_within(&mut a.io[0].s, Duration::from_secs(5)));
    std::thread::sleep(Duration::from_millis(50)); // asleep again, on the new ring
                                                   // A new connection must wake the reactor: its wake-up read and timeout
                                                   // from the retired ring cannot end a wait on the new one.
    let t0 = Instant::now();
    let mut b = controller(addr, NQN, 1, NO, 0);
    round_trip(&mut b.io[0], 64, 1);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "served in {:?}",
        t0.elapsed()
    );
    t.stop().expect("the target ran without a reactor failure");
}

fn panicking_handler(engine: SocketEngine) {
    let _g = serial();
    let (t, _dir) = target(Setup {
        engine,
        ..Setup::default()
    });
    let addr = t.local_addrs[0];
    let mut c = controller(addr, NQN, 1, NO, 0);
    round_trip(&mut c.io[0], 0, 1);

    fault::panic_next_io();
    send_read(&mut c.io[0], 0);
    // Both queues of the controller end at once: the host is not left hanging.
    assert!(closed_within(&mut c.io[0].s, Duration::from_secs(5)));
    assert!(closed_within(&mut c.admin.s, Duration::from_secs(5)));

    // New connections are refused or closed, never swallowed.
    let t0 = Instant::now();
    while let Ok(mut s) = TcpStream::connect(addr) {
        assert!(
            closed_within(&mut s, Duration::from_secs(5)),
            "a connection accepted after the failure is closed"
        );
        assert!(t0.elapsed() < Duration::from_secs(5), "the listener closes");
        std::thread::sleep(Duration::from_millis(20));
    }

    let err = t
        .stop()
        .expect_err("a reactor failure makes stop/wait fail");
    assert!(err.to_string().contains("panicked"), "{err}");
    let l = log();
    assert!(
        l.contains("reactor failed: panicked: injected fault"),
        "log:\n{l}"
    );
    assert!(
        l.contains("closing connection: its reactor failed"),
        "log:\n{l}"
    );
}

#[test]
fn panicking_handler_closes_its_connections_and_fails_the_target_epoll() {
    panicking_handler(SocketEngine::Epoll);
}

#[test]
fn panicking_handler_closes_its_connections_and_fails_the_target_uring() {
    panicking_handler(SocketEngine::Uring);
}

/// A file target with one connected controller and a pattern at LBA 0.
fn file_target_with_data(grace_ms: u64) -> (trellis_node::Target, tempfile::TempDir, Ctrl) {
    let (t, dir) = target(Setup {
        backend: BackendKind::File,
        grace_ms,
        ..Setup::default()
    });
    let mut c = controller(t.local_addrs[0], NQN, 1, NO, 0);
    round_trip(&mut c.io[0], 0, 7);
    (t, dir, c)
}

#[test]
fn shutdown_waits_for_in_flight_file_reads() {
    let _g = serial();
    let (t, _dir, mut c) = file_target_with_data(5_000);
    fault::delay_reads(1, 700);
    send_read(&mut c.io[0], 0);
    std::thread::sleep(Duration::from_millis(100)); // the read is in the kernel
    let t0 = Instant::now();
    t.stop().unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(400),
        "stop waited for the read"
    );
    // The read completed before the connection closed, with the right data.
    let mut d = Vec::new();
    loop {
        let p = c.io[0]
            .recv()
            .expect("the read's response arrives before the close");
        match trellis_nvme::pdu::PduType::from_u8(p.ch.pdu_type) {
            Some(trellis_nvme::pdu::PduType::C2HData) => d.extend_from_slice(&p.bytes[24..]),
            Some(trellis_nvme::pdu::PduType::CapsuleResp) => {
                let cqe = trellis_nvme::Cqe::decode(&p.bytes[8..24]);
                assert!(cqe.status.is_success(), "{:?}", cqe.status);
                break;
            }
            other => panic!("unexpected PDU {other:?}"),
        }
    }
    assert!(d == pattern(0, 8, 7));
    assert!(!log().contains("cancellations issued"));
}

#[test]
fn shutdown_cancels_reads_still_in_flight_after_the_grace() {
    let _g = serial();
    let (t, _dir, mut c) = file_target_with_data(200);
    fault::delay_reads(1, 30_000);
    send_read(&mut c.io[0], 0);
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    t.stop().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "cancelled, not waited for: {:?}",
        t0.elapsed()
    );
    assert!(closed_within(&mut c.io[0].s, Duration::from_secs(1)));
    let l = log();
    assert!(
        l.contains("shutdown grace expired with 1 backend requests"),
        "log:\n{l}"
    );
    assert!(
        !l.contains("leaking"),
        "the cancellation was confirmed; log:\n{l}"
    );
}

#[test]
fn shutdown_leaks_buffers_the_kernel_still_owns_when_cancel_fails() {
    let _g = serial();
    let (t, _dir, mut c) = file_target_with_data(200);
    fault::ignore_cancels(true);
    fault::delay_reads(1, 30_000);
    send_read(&mut c.io[0], 0);
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    t.stop().unwrap();
    let took = t0.elapsed();
    let bound = Duration::from_millis(200 + 100)
        + Duration::from_nanos(trellis_node::data::tcp::reactor::CANCEL_WAIT_NS);
    assert!(took < bound + Duration::from_secs(2), "bounded: {took:?}");
    assert!(
        took >= bound - Duration::from_millis(300),
        "waited for the cancellation: {took:?}"
    );
    assert!(closed_within(&mut c.io[0].s, Duration::from_secs(1)));
    let l = log();
    assert!(l.contains("leaking this connection's buffers"), "log:\n{l}");
}

#[test]
fn new_connections_after_a_failure_are_refused_not_swallowed() {
    let _g = serial();
    let (t, _dir) = target(Setup {
        reactors: 2,
        ..Setup::default()
    });
    let addr = t.local_addrs[0];
    // Admin queue on reactor 0, I/O queue on reactor 1 (round-robin).
    let mut c = controller(addr, NQN, 1, NO, 0);
    fault::panic_next_io();
    send_read(&mut c.io[0], 0);
    assert!(closed_within(&mut c.io[0].s, Duration::from_secs(5)));
    // The target stops as a whole: reactor 0's connections end too.
    assert!(closed_within(&mut c.admin.s, Duration::from_secs(10)));
    let t0 = Instant::now();
    while let Ok(mut s) = TcpStream::connect(addr) {
        // Speak first, as a host does (ICReq): a connection whose handshake
        // raced the listener's close is half-open on our side only, and
        // learns so (a reset) only when it sends; a silent read would wait.
        let _ = s.write_all(&[0u8; 8]);
        assert!(closed_within(&mut s, Duration::from_secs(5)));
        assert!(t0.elapsed() < Duration::from_secs(5), "the listener closes");
    }
    assert!(t.stop().is_err());
    let l = log();
    assert!(l.contains("reactor 1 failed"), "log:\n{l}");
}

// ---- Preempt and Abort (issue 37 item 4; docs/target.md, "Reservations") ----

/// Hosts that register: more than 16 (SPDK's CVE-2025-57275 wrote past a
/// 16-entry table).
const RESV_HOSTS: usize = 20;

fn resv_host(i: usize) -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:preempt-abort-{i:04}")
}

fn resv_register(q: &mut Queue, nrkey: u64) -> trellis_nvme::Status {
    use trellis_nvme::resv::{self, Cptpl, RegisterAction, RegisterCmd};
    let mut reg = Sqe::new(io::RESV_REGISTER, 0, 1);
    RegisterCmd {
        action: RegisterAction::Register,
        iekey: false,
        cptpl: Cptpl::NoChange,
    }
    .encode(&mut reg);
    reg.set_sgl(Sgl::in_capsule(16));
    q.cmd(reg, &resv::encode_keys(0, nrkey), 0, 4096).0.status
}

/// A Reservation Acquire capsule (keys in capsule).
fn acquire_sqe(
    q: &mut Queue,
    action: trellis_nvme::resv::AcquireAction,
    rtype: trellis_nvme::resv::RType,
) -> Sqe {
    use trellis_nvme::resv::AcquireCmd;
    let mut acq = Sqe::new(io::RESV_ACQUIRE, q.next_cid(), 1);
    AcquireCmd {
        action,
        iekey: false,
        rtype,
    }
    .encode(&mut acq);
    acq.set_sgl(Sgl::in_capsule(16));
    acq
}

fn resv_acquire(
    q: &mut Queue,
    action: trellis_nvme::resv::AcquireAction,
    rtype: trellis_nvme::resv::RType,
    crkey: u64,
    prkey: u64,
) -> trellis_nvme::Status {
    let sqe = acquire_sqe(q, action, rtype);
    let keys = trellis_nvme::resv::encode_keys(crkey, prkey);
    q.cmd(sqe, &keys, 0, 4096).0.status
}

/// Sends a write of `data` at `slba` in the capsule, not waiting for it.
fn send_write(q: &mut Queue, slba: u64, data: &[u8]) {
    let cid = q.next_cid();
    let mut sqe = Sqe::rw(io::WRITE, cid, 1, slba, (data.len() / 512) as u32, false);
    sqe.set_sgl(Sgl::in_capsule(data.len() as u32));
    q.send_capsule(&sqe, data);
}

/// The status of the next response on `q`, if one arrives within `limit`.
fn response_within(q: &mut Queue, limit: Duration) -> Option<trellis_nvme::Status> {
    q.s.set_read_timeout(Some(limit)).unwrap();
    let p = q.recv();
    q.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let p = p?;
    assert_eq!(
        p.ch.pdu_type,
        trellis_nvme::pdu::PduType::CapsuleResp as u8,
        "a response capsule"
    );
    Some(trellis_nvme::Cqe::decode(&p.bytes[8..24]).status)
}

/// Waits (bounded) until `done` holds.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < Duration::from_secs(5), "{what} within 5 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The finding: Preempt and Abort changed the state and completed at once,
/// while writes of the preempted hosts already in the backend completed,
/// and landed, after it (nvmet waits for them). 20 hosts register; host 0
/// holds Write Exclusive - All Registrants, so the other 19 may write, and
/// each has a write held in the kernel (an io_uring timeout linked in front
/// of it) when host 0 preempts them all (PRKEY 0). Its Acquire must
/// complete only after those 19 writes did: each response is already in
/// its socket when the Acquire's arrives. Afterwards the 19 are
/// unregistered and their writes conflict, and host 0's data stays. On the
/// old code the Acquire returned in about a millisecond and the 19 writes
/// completed with SUCCESS half a second later.
#[test]
fn preempt_and_abort_completes_after_the_preempted_writes_in_the_backend() {
    use trellis_nvme::resv::{AcquireAction, RType};
    const DELAY_MS: u64 = 500;
    let _g = serial();
    let (t, _dir) = target(Setup {
        backend: BackendKind::File,
        reactors: 2,
        ..Setup::default()
    });
    let addr = t.local_addrs[0];
    // A spare connection before odd hosts shifts the round-robin, so the
    // I/O queues (and the writes) are on both reactors.
    let mut spare = Vec::new();
    let mut hosts: Vec<Ctrl> = (0..RESV_HOSTS)
        .map(|i| {
            if i % 2 == 1 {
                spare.push(Queue::open(addr, NO));
            }
            controller_as(addr, NQN, &resv_host(i), 1, NO, 0)
        })
        .collect();
    for (i, h) in hosts.iter_mut().enumerate() {
        assert!(resv_register(&mut h.io[0], 0x100 + i as u64).is_success());
    }
    let wear = RType::WriteExclusiveAllRegistrants;
    let st = resv_acquire(&mut hosts[0].io[0], AcquireAction::Acquire, wear, 0x100, 0);
    assert!(st.is_success(), "acquire: {st:?}");

    fault::delay_writes((RESV_HOSTS - 1) as u32, DELAY_MS);
    for (i, h) in hosts.iter_mut().enumerate().skip(1) {
        send_write(&mut h.io[0], 8 * i as u64, &pattern(8 * i as u64, 8, 1));
    }
    wait_until("every write is in the kernel", || {
        fault::pending_delayed_writes() == 0
    });

    let t0 = Instant::now();
    let q0 = &mut hosts[0].io[0];
    let sqe = acquire_sqe(q0, AcquireAction::PreemptAndAbort, RType::WriteExclusive);
    q0.send_capsule(&sqe, &trellis_nvme::resv::encode_keys(0x100, 0));
    let st = response_within(q0, Duration::from_secs(5)).expect("the Acquire completes");
    let waited = t0.elapsed();
    assert!(st.is_success(), "preempt and abort: {st:?}");
    eprintln!(
        "Preempt and Abort of {} registrants took {waited:?}",
        RESV_HOSTS - 1
    );
    for (i, h) in hosts.iter_mut().enumerate().skip(1) {
        // Already sent when the Acquire's response was (a small margin for
        // the loopback): it completed before the Acquire did.
        let w = response_within(&mut h.io[0], Duration::from_millis(50));
        assert!(
            w.is_some(),
            "host {i}'s write was still in the backend when Preempt and Abort completed \
             after {waited:?}"
        );
    }
    // The preempted hosts are unregistered: their writes now conflict.
    for h in hosts.iter_mut().skip(1) {
        let w = write(&mut h.io[0], 0, &pattern(0, 8, 2));
        assert_eq!(w.status, generic::RESERVATION_CONFLICT.dnr());
    }
    let new = pattern(0, 8, 3);
    assert!(write(&mut hosts[0].io[0], 0, &new).status.is_success());
    let (r, back) = read(&mut hosts[0].io[0], 0, 8);
    assert!(
        r.status.is_success() && back == new,
        "the holder's data stays"
    );
    drop((hosts, spare));
    t.stop().unwrap();
}

/// Review finding H1 of stop 32: the drain waited for every gated command
/// on the node, so a slow write on another namespace (another tenant's)
/// held up a Preempt and Abort until it finished, or past its timeout.
/// Now a request waits only for commands on its own namespace: with a
/// write held 3 s in the kernel on namespace 2, a Preempt and Abort on
/// namespace 1 completes at once (on the code before the fix, after 3 s).
#[test]
fn a_slow_write_on_another_namespace_does_not_hold_up_a_preempt_and_abort() {
    use trellis_nvme::resv::{AcquireAction, RType};
    let _g = serial();
    let (t, _dir) = target(Setup {
        backend: BackendKind::File,
        namespaces: 2,
        ..Setup::default()
    });
    let addr = t.local_addrs[0];
    let mut other = controller_as(addr, NQN, &resv_host(7), 1, NO, 0);
    let mut a = controller_as(addr, NQN, &resv_host(0), 1, NO, 0);
    let mut b = controller_as(addr, NQN, &resv_host(1), 1, NO, 0);
    let (qa, qb) = (&mut a.io[0], &mut b.io[0]);
    assert!(resv_register(qa, 5).is_success());
    assert!(resv_register(qb, 9).is_success());
    let we = RType::WriteExclusive;
    assert!(resv_acquire(qa, AcquireAction::Acquire, we, 5, 0).is_success());

    fault::delay_writes(1, 3_000);
    let q2 = &mut other.io[0];
    let cid = q2.next_cid();
    let data = pattern(0, 8, 1);
    let mut sqe = Sqe::rw(io::WRITE, cid, 2, 0, 8, false);
    sqe.set_sgl(Sgl::in_capsule(data.len() as u32));
    q2.send_capsule(&sqe, &data);
    wait_until("namespace 2's write is in the kernel", || {
        fault::pending_delayed_writes() == 0
    });
    let t0 = Instant::now();
    let sqe = acquire_sqe(qb, AcquireAction::PreemptAndAbort, we);
    qb.send_capsule(&sqe, &trellis_nvme::resv::encode_keys(9, 5));
    let st = response_within(qb, Duration::from_secs(10)).expect("the Acquire completes");
    let took = t0.elapsed();
    assert!(st.is_success(), "preempt and abort: {st:?}");
    assert!(
        took < Duration::from_millis(1_500),
        "Preempt and Abort on namespace 1 waited {took:?} for namespace 2's write"
    );
    let w = response_within(q2, Duration::from_secs(10)).expect("namespace 2's write completes");
    assert!(w.is_success(), "{w:?}");
    drop((a, b, other));
    t.stop().unwrap();
}

/// Review finding M3: a write that passed its reservation check on one
/// reactor and had not reached the backend yet when another reactor ran
/// Preempt and Abort landed after the Acquire completed, over the new
/// holder's data. The fault hook holds A's write between its check and
/// its submit for 400 ms on A's reactor; B (its I/O queue on the other
/// reactor) preempts A meanwhile. Now B's Acquire completes only once A's
/// reactor has passed a loop boundary with the write finished, so B's
/// write, sent after its Acquire, is the one that stays. On the old code
/// the Acquire completed at once and A's write landed 400 ms later.
#[test]
fn a_write_between_its_check_and_the_backend_on_another_reactor_never_lands_after_the_preempt() {
    use trellis_nvme::resv::{AcquireAction, RType};
    let _g = serial();
    let (t, _dir) = target(Setup {
        reactors: 2,
        ..Setup::default()
    });
    let addr = t.local_addrs[0];
    // Round-robin: A's admin queue on reactor 0, its I/O queue on 1; the
    // spare on 0; B's admin queue on 1, its I/O queue on 0.
    let mut a = controller_as(addr, NQN, &resv_host(0), 1, NO, 0);
    let _spare = Queue::open(addr, NO);
    let mut b = controller_as(addr, NQN, &resv_host(1), 1, NO, 0);
    let (qa, qb) = (&mut a.io[0], &mut b.io[0]);
    assert!(resv_register(qa, 5).is_success());
    assert!(resv_register(qb, 9).is_success());
    let we = RType::WriteExclusive;
    assert!(resv_acquire(qa, AcquireAction::Acquire, we, 5, 0).is_success());

    fault::stall_after_resv_check(400);
    send_write(qa, 0, &pattern(0, 8, 1));
    wait_until("A's write passed its check", || {
        !fault::resv_check_stall_armed()
    });
    let t0 = Instant::now();
    let sqe = acquire_sqe(qb, AcquireAction::PreemptAndAbort, we);
    qb.send_capsule(&sqe, &trellis_nvme::resv::encode_keys(9, 5));
    let st = response_within(qb, Duration::from_secs(5)).expect("the Acquire completes");
    let waited = t0.elapsed();
    assert!(st.is_success(), "preempt and abort: {st:?}");
    eprintln!("Preempt and Abort waited {waited:?} for the write past its check");
    let wa = response_within(qa, Duration::from_millis(50));
    assert!(
        wa.is_some(),
        "A's write was still on its way to the backend when the Acquire completed after {waited:?}"
    );
    let new = pattern(0, 8, 2);
    assert!(write(qb, 0, &new).status.is_success());
    let (r, back) = read(qb, 0, 8);
    assert!(r.status.is_success());
    assert!(back == new, "A's write landed over the new holder's data");
    assert_eq!(
        write(qa, 8, &pattern(8, 8, 3)).status,
        generic::RESERVATION_CONFLICT.dnr(),
        "the preempted host's later writes conflict"
    );
    drop((a, b));
    t.stop().unwrap();
}

/// A backend that does not finish the preempted host's write within
/// `target.preempt_abort_timeout_ms` (here 200 ms against a write held 3 s)
/// makes the Acquire fail with Internal Error (DNR) at that bound, rather
/// than wait without end or claim success: the reservation has moved all
/// the same (the preempted host's next write conflicts), and the log names
/// the setting.
#[test]
fn preempt_and_abort_fails_at_its_timeout_when_the_backend_does_not_drain() {
    use trellis_nvme::resv::{AcquireAction, RType};
    let _g = serial();
    let (t, _dir) = target(Setup {
        backend: BackendKind::File,
        preempt_abort_timeout_ms: Some(200),
        ..Setup::default()
    });
    let addr = t.local_addrs[0];
    let mut a = controller_as(addr, NQN, &resv_host(0), 1, NO, 0);
    let mut b = controller_as(addr, NQN, &resv_host(1), 1, NO, 0);
    let (qa, qb) = (&mut a.io[0], &mut b.io[0]);
    assert!(resv_register(qa, 5).is_success());
    assert!(resv_register(qb, 9).is_success());
    let we = RType::WriteExclusive;
    assert!(resv_acquire(qa, AcquireAction::Acquire, we, 5, 0).is_success());
    fault::delay_writes(1, 3_000);
    send_write(qa, 0, &pattern(0, 8, 1));
    wait_until("A's write is in the kernel", || {
        fault::pending_delayed_writes() == 0
    });
    let t0 = Instant::now();
    let st = resv_acquire(qb, AcquireAction::PreemptAndAbort, we, 9, 5);
    let waited = t0.elapsed();
    eprintln!("Preempt and Abort gave up after {waited:?}");
    assert_eq!(st, generic::INTERNAL_ERROR.dnr(), "after {waited:?}");
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_millis(2_000),
        "failed at the 200 ms bound, not at the write's 3 s: {waited:?}"
    );
    assert!(log().contains("target.preempt_abort_timeout_ms"));
    // The held write completes in its own time; then A is not registered.
    assert!(response_within(qa, Duration::from_secs(5)).is_some());
    assert_eq!(
        write(qa, 8, &pattern(8, 8, 2)).status,
        generic::RESERVATION_CONFLICT.dnr()
    );
    drop((a, b));
    t.stop().unwrap();
}
