//! A peer that stops reading ("slowloris", issue 13): it sends reads and
//! never takes their data. The target must keep that connection's output
//! bounded, close it after `target.send_stall_timeout_ms`, and meanwhile
//! serve a healthy host on the same reactor without an error.

mod common;

use common::*;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use trellis_node::config::{BackendKind, NamespaceConfig};
use trellis_nvme::pdu::Digests;
use trellis_nvme::sqe::io;
use trellis_nvme::{Sgl, Sqe};

const NO: Digests = Digests {
    header: false,
    data: false,
};
const STALL_MS: u64 = 500;
/// 1 MiB reads (MDTS) the slow peer asks for: far more than loopback's
/// socket buffers hold, so the target's output to it stalls.
const SLOW_READS: u32 = 120;
const READ_BLOCKS: u32 = 2048;

#[test]
fn a_peer_that_stops_reading_is_closed_after_the_stall_timeout_while_a_healthy_host_runs_on() {
    use trellis_node::config::SocketEngine;
    for engine in [SocketEngine::Epoll, SocketEngine::Uring] {
        eprintln!("socket engine {engine:?}");
        slow_peer_beside_a_healthy_host(engine);
    }
}

fn slow_peer_beside_a_healthy_host(engine: trellis_node::config::SocketEngine) {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 16 << 20));
    cfg.target.send_stall_timeout_ms = STALL_MS;
    cfg.target.socket_engine = engine;
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.local_addrs[0];
    // The healthy host: verified 4 KiB writes and reads until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let healthy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = controller(addr, NQN, 1, NO, 0);
            let (q, mut n) = (&mut c.io[0], 0u64);
            while !stop.load(Relaxed) {
                let slba = 8 * (n % 256);
                let data = pattern(slba, 8, n);
                assert!(
                    write(q, slba, &data).status.is_success(),
                    "healthy write {n}"
                );
                let (c, back) = read(q, slba, 8);
                assert!(c.status.is_success(), "healthy read {n}");
                assert!(back == data, "healthy read {n} returned other data");
                n += 1;
            }
            n
        })
    };
    // The slow peer: an enabled controller whose I/O queue asks for
    // SLOW_READS MiB and reads none of it.
    let mut slow = controller(addr, NQN, 1, NO, 0);
    let q = &mut slow.io[0];
    for _ in 0..SLOW_READS {
        let cid = q.next_cid();
        let mut s = Sqe::rw(io::READ, cid, 1, 0, READ_BLOCKS, false);
        s.set_sgl(Sgl::transport(READ_BLOCKS * 512));
        q.send_capsule(&s, &[]);
    }
    let sent = Instant::now();
    std::thread::sleep(Duration::from_millis(3 * STALL_MS + 500));
    // Now read: what the socket buffers held, then the end of the stream.
    q.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut got, mut buf) = (0usize, vec![0u8; 1 << 20]);
    let closed = loop {
        match q.s.read(&mut buf) {
            Ok(0) => break true,
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(e) => {
                eprintln!("slow peer: read failed after {got} bytes: {e}");
                break false;
            }
        }
    };
    let asked = SLOW_READS as usize * READ_BLOCKS as usize * 512;
    eprintln!(
        "slow peer: asked for {} MiB, {:.1} MiB had reached its socket when the target closed it ({:?} after the reads were sent)",
        asked >> 20,
        got as f64 / (1 << 20) as f64,
        sent.elapsed()
    );
    assert!(
        closed,
        "the target kept a peer that read nothing for {:?}",
        sent.elapsed()
    );
    assert!(got < asked, "the peer took everything: no stall happened");
    stop.store(true, Relaxed);
    let n = healthy.join().expect("the healthy host failed");
    assert!(
        n > 100,
        "the healthy host completed only {n} write+read pairs"
    );
    eprintln!("healthy host: {n} verified write+read pairs meanwhile");
}
