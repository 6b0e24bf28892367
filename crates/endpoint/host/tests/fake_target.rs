//! The host library against the fake target over real loopback sockets:
//! happy paths (every command kind, with and without digests) and a target
//! that misbehaves (each fault must give a clear error on that queue, never a
//! hang or a panic).

use std::time::{Duration, Instant};

use trellis_host::engine::{deallocate_sqe, rw_sqe, write_zeroes_sqe};
use trellis_host::{discover, Controller, Digests, Error, HostConfig, Queue, Xfer};
use trellis_nvme::sqe::io;
use trellis_nvme::Sqe;
use trellis_testkit::fake_target::{FakeConfig, FakeTarget, Fault};

fn host(d: Digests) -> HostConfig {
    HostConfig {
        digests: d,
        command_timeout: Duration::from_millis(300),
        connect_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

fn digests(h: bool, d: bool) -> Digests {
    Digests { header: h, data: d }
}

/// Polls until the slot's command completes or the queue fails; a 5 s cap
/// turns a hang into a test failure.
fn wait(q: &mut Queue, slot: u16) -> Result<trellis_host::Completion, Error> {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        q.poll(Instant::now())?;
        while let Some(c) = q.next_completion() {
            if c.slot == slot {
                return Ok(c);
            }
        }
        assert!(Instant::now() < end, "host hung waiting for a completion");
    }
}

fn run(q: &mut Queue, slot: u16, sqe: Sqe, x: Xfer) -> Result<(), Error> {
    q.submit(slot, sqe, x, Instant::now())?;
    let c = wait(q, slot)?;
    if !c.status.is_success() {
        return Err(Error::Nvme(c.status));
    }
    Ok(())
}

fn roundtrip(d: Digests, len: usize) {
    let t = FakeTarget::spawn(FakeConfig::default());
    let mut c = Controller::connect(&t.addr_string(), t.subnqn(), &host(d)).unwrap();
    assert_eq!(c.id.subnqn, t.subnqn());
    let ns = c.identify_ns(1).unwrap();
    assert_eq!(ns.block_size(), 512);
    assert!(c.set_num_queues(2).unwrap() >= 1);
    let mut q = c.connect_io_queue(16, 128 << 10).unwrap();
    let nlb = (len / 512) as u32;
    let s = q.alloc().unwrap();
    for (i, b) in q.buf_mut(s)[..len].iter_mut().enumerate() {
        *b = (i * 31 + 7) as u8;
    }
    let want = q.buf(s)[..len].to_vec();
    run(
        &mut q,
        s,
        rw_sqe(io::WRITE, 1, 100, nlb),
        Xfer::ToCtrl(len as u32),
    )
    .unwrap();
    q.buf_mut(s).fill(0);
    run(
        &mut q,
        s,
        rw_sqe(io::READ, 1, 100, nlb),
        Xfer::FromCtrl(len as u32),
    )
    .unwrap();
    assert_eq!(&q.buf(s)[..len], &want[..], "read returns what was written");
    c.keep_alive().unwrap();
    drop(q);
    c.shutdown().unwrap();
}

#[test]
fn write_read_4k_in_capsule_no_digests() {
    roundtrip(digests(false, false), 4096);
}

#[test]
fn write_read_128k_via_r2t_with_both_digests() {
    roundtrip(digests(true, true), 128 << 10);
}

#[test]
fn write_read_with_header_digest_only() {
    roundtrip(digests(true, false), 16 << 10);
}

#[test]
fn flush_write_zeroes_and_deallocate() {
    let t = FakeTarget::spawn(FakeConfig::default());
    let mut c =
        Controller::connect(&t.addr_string(), t.subnqn(), &host(Digests::default())).unwrap();
    let mut q = c.connect_io_queue(8, 64 << 10).unwrap();
    let s = q.alloc().unwrap();
    q.buf_mut(s)[..8192].fill(0xEE);
    run(&mut q, s, rw_sqe(io::WRITE, 1, 0, 16), Xfer::ToCtrl(8192)).unwrap();
    run(&mut q, s, Sqe::new(io::FLUSH, 0, 1), Xfer::None).unwrap();
    run(&mut q, s, write_zeroes_sqe(1, 0, 8, false), Xfer::None).unwrap();
    let sqe = deallocate_sqe(1, 8, 8, q.buf_mut(s));
    run(&mut q, s, sqe, Xfer::ToCtrl(16)).unwrap();
    run(&mut q, s, rw_sqe(io::READ, 1, 0, 16), Xfer::FromCtrl(8192)).unwrap();
    assert!(
        q.buf(s)[..8192].iter().all(|&b| b == 0),
        "zeroed and deallocated ranges read zero"
    );
}

#[test]
fn nvme_error_status_is_reported_not_fatal() {
    let t = FakeTarget::spawn(FakeConfig::default());
    let mut c =
        Controller::connect(&t.addr_string(), t.subnqn(), &host(Digests::default())).unwrap();
    let mut q = c.connect_io_queue(8, 64 << 10).unwrap();
    let s = q.alloc().unwrap();
    let err = run(
        &mut q,
        s,
        rw_sqe(io::READ, 1, 1 << 40, 1),
        Xfer::FromCtrl(512),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Nvme(st) if st.sc() == 0x80), "{err}");
    // The queue still works.
    run(&mut q, s, rw_sqe(io::READ, 1, 0, 1), Xfer::FromCtrl(512)).unwrap();
}

#[test]
fn discovery_log_lists_the_subsystem() {
    let t = FakeTarget::spawn(FakeConfig::default());
    let e = discover(&t.addr_string(), &host(Digests::default())).unwrap();
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].subnqn, t.subnqn());
    assert_eq!(e[0].trsvcid, t.addr.port().to_string());
}

#[test]
fn connect_refused_is_a_transport_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let err = Controller::connect(&addr, "nqn.x", &host(Digests::default()))
        .err()
        .unwrap();
    assert!(matches!(err, Error::Transport(_)), "{err}");
}

/// Runs one read against a target with `fault` and returns the error.
fn faulty_read(fault: Fault, d: Digests) -> Error {
    let t = FakeTarget::spawn(FakeConfig {
        fault,
        fault_after_reads: 1,
        ..Default::default()
    });
    let mut c = Controller::connect(&t.addr_string(), t.subnqn(), &host(d)).unwrap();
    let mut q = c.connect_io_queue(8, 64 << 10).unwrap();
    let s = q.alloc().unwrap();
    // The first read is served correctly; the second hits the fault.
    run(&mut q, s, rw_sqe(io::READ, 1, 0, 8), Xfer::FromCtrl(4096)).unwrap();
    let err = run(&mut q, s, rw_sqe(io::READ, 1, 0, 8), Xfer::FromCtrl(4096)).unwrap_err();
    // The queue stays failed with the same kind of error; the admin queue is unaffected.
    assert!(q.poll(Instant::now()).is_err());
    c.keep_alive().unwrap();
    err
}

#[test]
fn wrong_pdu_type_is_a_protocol_error() {
    let e = faulty_read(Fault::WrongPduType, Digests::default());
    assert!(
        matches!(e, Error::Protocol(ref m) if m.contains("bad PDU header")),
        "{e}"
    );
}

#[test]
fn wrong_cid_is_a_protocol_error() {
    let e = faulty_read(Fault::WrongCid, Digests::default());
    assert!(
        matches!(e, Error::Protocol(ref m) if m.contains("unknown command id")),
        "{e}"
    );
}

#[test]
fn short_data_is_a_protocol_error() {
    let e = faulty_read(Fault::ShortData, Digests::default());
    assert!(
        matches!(e, Error::Protocol(ref m) if m.contains("short data")),
        "{e}"
    );
}

#[test]
fn data_offset_gap_is_a_protocol_error() {
    let e = faulty_read(Fault::BadOffset, Digests::default());
    assert!(
        matches!(e, Error::Protocol(ref m) if m.contains("out of range")),
        "{e}"
    );
}

#[test]
fn silent_target_times_out() {
    let e = faulty_read(Fault::Silent, Digests::default());
    assert!(matches!(e, Error::Timeout(_)), "{e}");
}

#[test]
fn corrupt_data_digest_is_a_protocol_error() {
    let e = faulty_read(Fault::BadDataDigest, digests(true, true));
    assert!(
        matches!(e, Error::Protocol(ref m) if m.contains("digest")),
        "{e}"
    );
}

#[test]
fn close_in_the_middle_of_data_is_a_transport_error() {
    let e = faulty_read(Fault::CloseMidData, Digests::default());
    assert!(matches!(e, Error::Transport(_)), "{e}");
}

#[test]
fn term_req_is_a_protocol_error() {
    let e = faulty_read(Fault::TermReq, Digests::default());
    assert!(
        matches!(e, Error::Protocol(ref m) if m.contains("C2HTermReq")),
        "{e}"
    );
}

/// Issue 10: `connect_io_queue(n, 512)` (512-byte blocks) panicked, because
/// the slot buffers were smaller than the 1 KiB Connect data.
#[test]
fn io_queue_for_512_byte_transfers_connects_and_works() {
    let t = FakeTarget::spawn(FakeConfig::default());
    let mut c =
        Controller::connect(&t.addr_string(), t.subnqn(), &host(digests(false, false))).unwrap();
    c.set_num_queues(1).unwrap();
    let mut q = c.connect_io_queue(4, 512).unwrap();
    let s = q.alloc().unwrap();
    q.buf_mut(s)[..512].fill(0xa5);
    run(&mut q, s, rw_sqe(io::WRITE, 1, 3, 1), Xfer::ToCtrl(512)).unwrap();
    q.buf_mut(s).fill(0);
    run(&mut q, s, rw_sqe(io::READ, 1, 3, 1), Xfer::FromCtrl(512)).unwrap();
    assert!(q.buf(s)[..512].iter().all(|&b| b == 0xa5));
}

/// A transport error names its OS error once, even when the whole error
/// chain is printed (anyhow's `{:#}`), as the CLI does.
#[test]
fn transport_error_chain_names_the_os_error_once() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let Err(e) = Controller::connect(&addr, "nqn.x", &host(digests(false, false))) else {
        panic!("connected to a closed port");
    };
    let shown = format!("{:#}", anyhow::Error::from(e));
    assert_eq!(shown.matches("os error").count(), 1, "{shown}");
}

/// Linux nvmet, refusing a host's DH-HMAC-CHAP response, may close the
/// connection before its AUTH_Failure1 arrives: the error must still say
/// that authentication failed, not only that the connection closed.
#[test]
fn a_connection_closed_during_dh_hmac_chap_is_reported_as_its_failure() {
    let t = FakeTarget::spawn(FakeConfig {
        auth_close_after_reply: true,
        ..Default::default()
    });
    let secret = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    let cfg = HostConfig {
        dhchap_secret: Some(trellis_nvme::dhchap::Secret::parse(secret).unwrap()),
        ..host(Digests::default())
    };
    let Err(e) = Controller::connect(&t.addr_string(), t.subnqn(), &cfg) else {
        panic!("connected to a target that closed the connection during authentication");
    };
    assert!(matches!(e, Error::Transport(_)), "{e}");
    let shown = e.to_string();
    assert!(
        shown.contains("DH-HMAC-CHAP on queue 0 failed: controller closed the connection"),
        "{shown}"
    );
}
