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
use trellis_nvme::pdu::Digests;
use trellis_nvme::sqe::io;
use trellis_nvme::status::generic;
use trellis_nvme::{Sgl, Sqe};
use trellis_target::config::*;
use trellis_target::sys::fault;
use trellis_target::sys::ring::SUBMIT_ATTEMPTS;

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
        }
    }
}

/// A target on an ephemeral port with one 8 MiB namespace any host may use.
fn target(s: Setup) -> (trellis_target::Target, tempfile::TempDir) {
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
    cfg.listeners = vec![ListenerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: None,
        ana_state: None,
        secure_channel: None,
    }];
    let mut ns = NamespaceConfig::sized(s.backend, 8 << 20);
    if s.backend == BackendKind::File {
        ns.path = Some(dir.path().join("ns.img").to_str().unwrap().into());
    }
    cfg.subsystems = vec![SubsystemConfig {
        nqn: NQN.into(),
        serial: "FAULT1".into(),
        model: "Trellis faults".into(),
        allow_any_host: Some(true),
        allowed_hosts: vec![],
        hosts: vec![],
        namespaces: vec![ns],
    }];
    cfg.target.state_dir = Some(dir.path().to_path_buf());
    (trellis_target::Target::start(&cfg).unwrap(), dir)
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
    let ns = t.reg.ns.load().by_uid[0].clone().expect("the namespace");
    let failed = ns
        .stats
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
fn file_target_with_data(grace_ms: u64) -> (trellis_target::Target, tempfile::TempDir, Ctrl) {
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
        + Duration::from_nanos(trellis_target::data::tcp::reactor::CANCEL_WAIT_NS);
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
