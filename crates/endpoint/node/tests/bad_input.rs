//! Malformed input, one class per connection, while a healthy connection on
//! the same target keeps doing verified I/O. Each class must get the right
//! NVMe status (connection stays usable) or a C2HTermReq with the right FES
//! followed by close of that connection only.

mod common;
use common::*;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use trellis_nvme::pdu::{self, fes, field, CommonHeader, Digests, PduType, TermReq};
use trellis_nvme::sqe::io;
use trellis_nvme::status::generic;
use trellis_nvme::{Sgl, Sqe, Status};

const NO: Digests = Digests {
    header: false,
    data: false,
};
const BOTH: Digests = Digests {
    header: true,
    data: true,
};

/// Expects a C2HTermReq with `fes` (and `fei` if given), then EOF.
fn expect_term(q: &mut Queue, want_fes: u16, want_fei: Option<u32>) {
    let p = q.recv().expect("a C2HTermReq before close");
    assert_eq!(
        p.ch.pdu_type,
        PduType::C2HTermReq as u8,
        "got PDU type {:#x} instead of C2HTermReq",
        p.ch.pdu_type
    );
    assert!(
        p.ch.plen as usize > pdu::SMALL_HLEN && p.ch.plen as usize <= pdu::TERM_MAX_PLEN,
        "TermReq carries the offending header"
    );
    let t = TermReq::decode(&p.bytes);
    assert_eq!(t.fes, want_fes, "FES");
    if let Some(fei) = want_fei {
        assert_eq!(t.fei, fei, "FEI");
    }
    assert!(q.closed(), "the connection is closed after the TermReq");
}

fn expect_status(q: &mut Queue, sqe: Sqe, out: &[u8], in_len: usize, want: Status) {
    let (cqe, _) = q.cmd(sqe, out, in_len, 8192);
    assert_eq!(cqe.status, want);
}

/// An I/O queue with an enabled controller, for command-level classes.
fn io_queue(addr: std::net::SocketAddr, dg: Digests) -> (Ctrl, Queue) {
    let mut c = controller(addr, NQN, 1, dg, 0);
    let q = c.io.pop().unwrap();
    (c, q)
}

/// Raw capsule bytes: a Write of one block with in-capsule data.
fn write_capsule(hlen: u8, pdo: u8, plen: u32) -> Vec<u8> {
    let mut sqe = Sqe::rw(io::WRITE, 0x77, 1, 0, 1, false);
    sqe.set_sgl(Sgl::in_capsule(512));
    let mut b = vec![0u8; 72];
    CommonHeader {
        pdu_type: 4,
        flags: 0,
        hlen,
        pdo,
        plen,
    }
    .encode(&mut b);
    b[8..72].copy_from_slice(&sqe.0);
    b.resize(plen.max(72) as usize, 0xAB);
    b
}

fn classes(addr: std::net::SocketAddr) {
    // Wrong HLEN.
    let mut q = Queue::open(addr, NO);
    q.s.write_all(&write_capsule(70, 72, 72 + 512)).unwrap();
    expect_term(&mut q, fes::INVALID_HEADER_FIELD, Some(field::HLEN));

    // Wrong PLEN (shorter than the header).
    let mut q = Queue::open(addr, NO);
    let mut b = write_capsule(72, 0, 72);
    pdu::CommonHeader {
        pdu_type: 4,
        flags: 0,
        hlen: 72,
        pdo: 0,
        plen: 40,
    }
    .encode(&mut b);
    q.s.write_all(&b).unwrap();
    expect_term(&mut q, fes::INVALID_HEADER_FIELD, Some(field::PLEN));

    // Wrong PDO (inside the header).
    let mut q = Queue::open(addr, NO);
    q.s.write_all(&write_capsule(72, 40, 72 + 512)).unwrap();
    expect_term(&mut q, fes::INVALID_HEADER_FIELD, Some(field::PDO));

    // Unknown PDU type.
    let mut q = Queue::open(addr, NO);
    let mut b = vec![0u8; 24];
    CommonHeader {
        pdu_type: 0x42,
        flags: 0,
        hlen: 24,
        pdo: 0,
        plen: 24,
    }
    .encode(&mut b);
    q.s.write_all(&b).unwrap();
    expect_term(&mut q, fes::INVALID_HEADER_FIELD, Some(field::TYPE));

    // A PDU before ICReq.
    let mut q = Queue::from_stream(Queue::raw(addr), NO);
    q.s.write_all(&write_capsule(72, 72, 72 + 512)).unwrap();
    expect_term(&mut q, fes::PDU_SEQUENCE_ERROR, None);

    // Header digest mismatch.
    let mut q = Queue::open(addr, BOTH);
    let sqe = Sqe::new(trellis_nvme::sqe::admin::KEEP_ALIVE, 1, 0);
    let mut b = vec![0u8; 80];
    let n = pdu::encode_capsule_cmd(&mut b, &sqe, 0, BOTH);
    b.truncate(n);
    b[72] ^= 0xFF; // corrupt the HDGST
    q.s.write_all(&b).unwrap();
    expect_term(&mut q, fes::HEADER_DIGEST_ERROR, None);

    // Data digest mismatch: a retryable command error; the queue stays up.
    let (_c, mut q) = io_queue(addr, BOTH);
    let mut sqe = Sqe::rw(io::WRITE, 0x55, 1, 0, 1, false);
    sqe.set_sgl(Sgl::in_capsule(512));
    let mut b = vec![0u8; 128];
    let n = pdu::encode_capsule_cmd(&mut b, &sqe, 512, BOTH);
    b.truncate(n);
    b.extend_from_slice(&[0x5A; 512]);
    b.extend_from_slice(&0xDEADBEEFu32.to_le_bytes());
    q.s.write_all(&b).unwrap();
    let p = q.recv().unwrap();
    let cqe = trellis_nvme::Cqe::decode(&p.bytes[8..24]);
    assert_eq!(
        cqe.status,
        generic::TRANSIENT_TRANSPORT_ERROR,
        "data digest error is retryable"
    );
    assert!(
        write(&mut q, 0, &pattern(0, 1, 0)).status.is_success(),
        "queue still works after a data digest error"
    );

    // Data longer than announced: in-capsule data larger than SGL1 says.
    let mut q = Queue::open(addr, NO);
    let mut b = write_capsule(72, 72, 72 + 1024); // SGL says 512
    b.truncate(72 + 1024);
    q.s.write_all(&b).unwrap();
    expect_term(&mut q, fes::INVALID_HEADER_FIELD, Some(field::PLEN));

    // Data longer than announced: H2CData past the end of the command.
    let (_c, mut q) = io_queue(addr, NO);
    let mut sqe = Sqe::rw(io::WRITE, 0x66, 1, 0, 64, false);
    sqe.set_sgl(Sgl::transport(64 * 512));
    q.send_capsule(&sqe, &[]);
    let r2t = q.recv().unwrap();
    assert_eq!(r2t.ch.pdu_type, PduType::R2T as u8);
    let r = pdu::R2t::decode(&r2t.bytes);
    q.send_h2c(r.ttag, 0x66, &vec![1u8; 64 * 512 + 512], 0, 64 * 512 + 512);
    expect_term(&mut q, fes::DATA_OUT_OF_RANGE, None);

    // H2CData for an unknown tag.
    let (_c, mut q) = io_queue(addr, NO);
    q.send_h2c(0x1234, 0x99, &[0u8; 512], 0, 512);
    expect_term(&mut q, fes::PDU_SEQUENCE_ERROR, None);

    // Oversize transfer: a command beyond MDTS gets Invalid Field...
    let (_c, mut q) = io_queue(addr, NO);
    let mut sqe = Sqe::rw(io::READ, 0, 1, 0, 4096, false); // 2 MiB > 1 MiB
    sqe.set_sgl(Sgl::transport(4096 * 512));
    expect_status(&mut q, sqe, &[], 4096 * 512, generic::INVALID_FIELD.dnr());
    // ...and a PDU larger than MAXH2CDATA allows ends the connection.
    let mut h = vec![0u8; 24];
    let plen = 24 + (4 << 20);
    CommonHeader {
        pdu_type: 6,
        flags: 0,
        hlen: 24,
        pdo: 24,
        plen,
    }
    .encode(&mut h);
    trellis_nvme::put32(&mut h, 16, 4 << 20);
    q.s.write_all(&h).unwrap();
    expect_term(&mut q, fes::DATA_LIMIT_EXCEEDED, None);

    // Bad SGL: a keyed descriptor type is not valid over TCP.
    let (_c, mut q) = io_queue(addr, NO);
    let mut sqe = Sqe::rw(io::READ, 0x10, 1, 0, 1, false);
    sqe.set_sgl(Sgl {
        address: 0,
        length: 512,
        id: 0x40,
    });
    q.send_capsule(&sqe, &[]);
    let p = q.recv().unwrap();
    assert_eq!(
        trellis_nvme::Cqe::decode(&p.bytes[8..24]).status,
        generic::SGL_TYPE_INVALID.dnr()
    );
    // In-capsule descriptor with a non-zero offset.
    let mut sqe = Sqe::rw(io::WRITE, 0x11, 1, 0, 1, false);
    sqe.set_sgl(Sgl {
        address: 8,
        length: 512,
        id: 0x01,
    });
    let mut b = vec![0u8; 128];
    let n = pdu::encode_capsule_cmd(&mut b, &sqe, 512, NO);
    b.truncate(n);
    b.extend_from_slice(&[0u8; 512]);
    q.s.write_all(&b).unwrap();
    let p = q.recv().unwrap();
    assert_eq!(
        trellis_nvme::Cqe::decode(&p.bytes[8..24]).status,
        generic::SGL_OFFSET_INVALID.dnr()
    );

    // A command for a missing namespace, and an LBA out of range.
    let mut sqe = Sqe::rw(io::READ, 0, 99, 0, 1, false);
    sqe.set_sgl(Sgl::transport(512));
    expect_status(&mut q, sqe, &[], 512, generic::INVALID_NAMESPACE.dnr());
    let blocks = (16u64 << 20) / 512;
    let sqe = Sqe::rw(io::READ, 0, 1, blocks - 1, 2, false);
    expect_status(&mut q, sqe, &[], 1024, generic::LBA_OUT_OF_RANGE.dnr());
    let sqe = Sqe::rw(io::WRITE, 0, 1, u64::MAX - 1, 8, false);
    expect_status(
        &mut q,
        sqe,
        &pattern(0, 8, 0),
        0,
        generic::LBA_OUT_OF_RANGE.dnr(),
    );
    // A wrong transfer length for the block count.
    let mut sqe = Sqe::rw(io::READ, 0, 1, 0, 2, false);
    sqe.set_sgl(Sgl::transport(512));
    q.send_capsule(&sqe, &[]);
    let p = q.recv().unwrap();
    assert_eq!(
        trellis_nvme::Cqe::decode(&p.bytes[8..24]).status,
        generic::DATA_SGL_LENGTH_INVALID.dnr()
    );
    // The queue is still healthy after command-level errors.
    let (cqe, _) = read(&mut q, 0, 8);
    assert!(cqe.status.is_success());

    // A command before Connect.
    let mut q = Queue::open(addr, NO);
    let mut sqe = Sqe::rw(io::READ, 0, 1, 0, 1, false);
    sqe.set_sgl(Sgl::transport(512));
    expect_status(&mut q, sqe, &[], 512, generic::COMMAND_SEQUENCE_ERROR.dnr());

    // TLS ClientHello on a plain port: closed without a reply.
    let mut s = Queue::raw(addr);
    s.write_all(&[0x16, 0x03, 0x01, 0x00, 0x50, 0x01, 0x00, 0x00])
        .unwrap();
    let mut q = Queue::from_stream(s, NO);
    assert!(q.closed());
}

#[test]
fn malformed_input_gets_the_right_answer_and_spares_other_connections() {
    malformed_input_on(trellis_node::config::SocketEngine::Epoll);
}

#[test]
fn malformed_input_with_the_io_uring_socket_engine() {
    malformed_input_on(trellis_node::config::SocketEngine::Uring);
}

fn malformed_input_on(engine: trellis_node::config::SocketEngine) {
    let t = start_target_with(engine);
    let addr = t.local_addrs[0];
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    // The healthy connection: write a pattern, read it back, over and over.
    let healthy = {
        let (stop, ops) = (stop.clone(), ops.clone());
        std::thread::spawn(move || {
            let mut c = controller(addr, NQN, 1, NO, 0);
            let q = &mut c.io[0];
            let mut gen = 0u64;
            while !stop.load(Ordering::Relaxed) || gen < 50 {
                gen += 1;
                let slba = 4096 + (gen % 64) * 256;
                let blocks = if gen.is_multiple_of(2) { 8 } else { 256 }; // in-capsule and R2T
                let data = pattern(slba, blocks, gen);
                let w = write(q, slba, &data);
                assert!(
                    w.status.is_success(),
                    "healthy write failed: {:?}",
                    w.status
                );
                let (r, back) = read(q, slba, blocks as u32);
                assert!(r.status.is_success(), "healthy read failed: {:?}", r.status);
                assert!(
                    back == data,
                    "healthy connection read wrong data at LBA {slba}"
                );
                ops.fetch_add(2, Ordering::Relaxed);
            }
        })
    };
    classes(addr);
    stop.store(true, Ordering::Relaxed);
    healthy.join().expect("the healthy connection saw no error");
    assert!(
        ops.load(Ordering::Relaxed) >= 100,
        "the healthy connection kept working"
    );
    t.stop().unwrap();
}
