//! A connection storm against a live target while a healthy host runs
//! verified I/O (issue 13, "load and hostile peers"): other "hosts" connect
//! and go away in a loop, in every way a peer can (a clean shutdown, a
//! dropped admin connection with an I/O queue open, a socket closed before
//! ICReq, garbage instead of ICReq, a connection left half-open), and the
//! healthy host must see no error and no verify failure. The target must
//! still accept a new host afterwards.

mod common;

use common::*;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use trellis_host::{Controller, HostConfig};

const NQN: &str = "nqn.2026-11.io.trellis:default";
const STORM_S: u64 = 4;

/// One storm peer's visit, by kind; Ok(true) when it got a controller.
fn visit(addr: &str, kind: u64, n: u64) -> bool {
    let cfg = HostConfig {
        hostnqn: format!("nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0001-{n:012}"),
        connect_timeout: Duration::from_secs(2),
        command_timeout: Duration::from_secs(2),
        ..HostConfig::default()
    };
    match kind % 5 {
        // A host that connects, opens an I/O queue and shuts down cleanly.
        0 => Controller::connect(addr, NQN, &cfg).is_ok_and(|mut c| {
            let _ = c.connect_io_queue(32, 64 << 10);
            c.shutdown().is_ok()
        }),
        // A host that vanishes with an I/O queue open (sockets just close).
        1 => Controller::connect(addr, NQN, &cfg)
            .is_ok_and(|mut c| c.connect_io_queue(32, 64 << 10).is_ok()),
        // A socket closed before ICReq.
        2 => {
            drop(TcpStream::connect(addr));
            false
        }
        // Garbage where ICReq belongs: the target must end this one connection.
        3 => {
            if let Ok(mut s) = TcpStream::connect(addr) {
                let _ = s.write_all(&[0xAB; 200]);
            }
            false
        }
        // Half an ICReq, then gone.
        _ => {
            if let Ok(mut s) = TcpStream::connect(addr) {
                let _ = s.write_all(&[0x00, 0x00, 0x80, 0x00]);
            }
            false
        }
    }
}

#[test]
fn a_connection_storm_leaves_a_healthy_hosts_verified_io_without_error() {
    let t = LiveTarget::start(&["--ram", "64M", "--reactors", "1"]);
    let addr = t.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let (visits, ctrls) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let storm = {
        let (addr, stop, visits, ctrls) =
            (addr.clone(), stop.clone(), visits.clone(), ctrls.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Relaxed) {
                if visit(&addr, n, n) {
                    ctrls.fetch_add(1, Relaxed);
                }
                visits.fetch_add(1, Relaxed);
                n += 1;
            }
        })
    };
    let started = Instant::now();
    let runtime = format!("{STORM_S}s");
    let job = bench_json(&[
        "--addr",
        &addr,
        "--nqn",
        NQN,
        "--rw",
        "randrw",
        "--bs",
        "4k",
        "--iodepth",
        "16",
        "--size",
        "32M",
        "--verify",
        "--runtime",
        &runtime,
    ]);
    stop.store(true, Relaxed);
    storm.join().unwrap();
    let (visits, ctrls) = (visits.load(Relaxed), ctrls.load(Relaxed));
    eprintln!(
        "storm: {visits} visits ({ctrls} got a controller) in {:?}; healthy host: {} I/Os, {} verified blocks",
        started.elapsed(),
        job["ios"],
        job["verified_blocks"]
    );
    assert_eq!(
        job["errors"], 0,
        "the healthy host saw errors: {}",
        job["first_error"]
    );
    assert_eq!(
        job["verify_failures"], 0,
        "verify failures: {}",
        job["verify_failure_samples"]
    );
    assert!(
        job["ios"].as_u64().unwrap_or(0) > 1_000,
        "the healthy host hardly ran: {job}"
    );
    assert!(
        visits > 50 && ctrls > 10,
        "the storm hardly ran: {visits} visits, {ctrls} controllers"
    );
    // Every storm controller is gone or going; a new host still gets one.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Controller::connect(&addr, NQN, &HostConfig::default()) {
            Ok(c) => {
                c.shutdown().unwrap();
                break;
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("after the storm: {e}; retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("no controller for a new host after the storm: {e}"),
        }
    }
}
