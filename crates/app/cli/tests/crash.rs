//! Acknowledged writes survive a crash of the target (issue 13, crash
//! consistency, first part): `trellis target` serving a file namespace is
//! killed with SIGKILL while a host writes, restarted on the same file, and
//! every write the host saw acknowledged with FUA, or acknowledged before a
//! Flush that completed, must read back intact. Several rounds, each killing
//! the target at a different moment and writing a fresh LBA range.
//!
//! A process crash is not a power loss: what the kernel accepted survives in
//! the page cache either way. So this checks the target's side of the
//! contract (it never acknowledges a write the kernel has not taken, and a
//! Flush only after what it covers), not the drive's.

mod common;

use common::*;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use trellis_host::engine::Xfer;
use trellis_host::{Controller, HostConfig};
use trellis_nvme::sqe::{io, Sqe};

const NQN: &str = "nqn.2026-11.io.trellis:default";
const ROUNDS: u64 = 20;
/// Writes in each round's LBA range; a writer that gets round it starts
/// again (same data: the pattern depends on LBA and round only).
const BLOCKS_PER_ROUND: u64 = 4096;
const WRITE_BYTES: u32 = 4096;
/// A Flush after this many plain (non-FUA) writes.
const FLUSH_EVERY: u64 = 8;

fn pattern(lba: u64, gen: u64, len: usize) -> Vec<u8> {
    let mut x =
        lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ gen.wrapping_mul(0xc2b2_ae3d_27d4_eb4f) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes `WRITE_BYTES` blocks from `first` on, every other one with FUA and
/// a Flush after every `FLUSH_EVERY` plain ones, until the target goes away;
/// sends each LBA on `tx` once it is durable: a FUA write when acknowledged,
/// a plain one when a later Flush completes. Returns how many writes were
/// acknowledged.
fn writer(addr: String, first: u64, gen: u64, tx: mpsc::Sender<u64>) -> u64 {
    let cfg = HostConfig {
        command_timeout: Duration::from_secs(2),
        ..HostConfig::default()
    };
    let Ok(mut ctrl) = Controller::connect(&addr, NQN, &cfg) else {
        return 0;
    };
    let lbads = ctrl.identify_ns(1).map(|n| n.lbads).unwrap_or(9);
    let nlb = WRITE_BYTES >> lbads;
    let Ok(mut q) = ctrl.connect_io_queue(32, 128 << 10) else {
        return 0;
    };
    let (mut acked, mut unflushed) = (0u64, Vec::new());
    for k in 0.. {
        let lba = first + (k % BLOCKS_PER_ROUND) * nlb as u64;
        let fua = k % 2 == 0;
        let data = pattern(lba, gen, WRITE_BYTES as usize);
        let sqe = Sqe::rw(io::WRITE, 0, 1, lba, nlb, fua);
        match q.exec(sqe, Xfer::ToCtrl(WRITE_BYTES), &data) {
            Ok((c, slot)) if c.status.is_success() => q.free(slot),
            _ => break, // the target is gone
        }
        acked += 1;
        if fua {
            let _ = tx.send(lba);
            continue;
        }
        unflushed.push(lba);
        if unflushed.len() as u64 == FLUSH_EVERY {
            match q.exec(Sqe::new(io::FLUSH, 0, 1), Xfer::None, &[]) {
                Ok((c, slot)) if c.status.is_success() => q.free(slot),
                _ => break,
            }
            for l in unflushed.drain(..) {
                let _ = tx.send(l);
            }
        }
    }
    acked
}

/// Reads `lba` back through a fresh controller of a restarted target.
fn read_back(q: &mut trellis_host::Queue, lba: u64, nlb: u32) -> Vec<u8> {
    let sqe = Sqe::rw(io::READ, 0, 1, lba, nlb, false);
    let (c, slot) = q
        .exec(sqe, Xfer::FromCtrl(WRITE_BYTES), &[])
        .expect("read after restart");
    assert!(
        c.status.is_success(),
        "read of LBA {lba} after restart: {:?}",
        c.status
    );
    let v = q.buf(slot)[..WRITE_BYTES as usize].to_vec();
    q.free(slot);
    v
}

#[test]
fn writes_acknowledged_with_fua_or_before_a_flush_survive_a_sigkill_of_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ns.img");
    let file = file.to_str().unwrap();
    let args = ["--file", file, "--file-size", "320M", "--reactors", "1"];
    // (lba, gen) that must hold their pattern.
    let mut durable: Vec<(u64, u64)> = Vec::new();
    for gen in 0..ROUNDS {
        let mut t = LiveTarget::start(&args);
        let (tx, rx) = mpsc::channel();
        let addr = t.addr.to_string();
        // Disjoint per round even at 512-byte blocks (8 LBAs per write).
        let first = gen * BLOCKS_PER_ROUND * 8;
        let w = std::thread::spawn(move || writer(addr, first, gen, tx));
        // Once writes flow (a Flush has completed), kill at a different
        // moment each round.
        let flowing = Instant::now() + Duration::from_secs(30);
        while durable.iter().filter(|d| d.1 == gen).count() < 2 * FLUSH_EVERY as usize {
            match rx.recv_timeout(flowing.saturating_duration_since(Instant::now())) {
                Ok(lba) => durable.push((lba, gen)),
                Err(e) => panic!("round {gen}: writes did not start: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(20 + 37 * (gen % 8)));
        t.child.kill().unwrap(); // SIGKILL
        t.child.wait().unwrap();
        let acked = w.join().unwrap();
        assert!(
            acked >= FLUSH_EVERY * 2,
            "round {gen}: only {acked} writes before the kill"
        );
        durable.extend(rx.try_iter().map(|lba| (lba, gen)));
        // A writer that wrapped round its range reports an LBA twice.
        durable.sort_unstable();
        durable.dedup();
        // Restart on the same file and check every durable write so far.
        let t = LiveTarget::start(&args);
        let mut ctrl = Controller::connect(&t.addr.to_string(), NQN, &HostConfig::default())
            .expect("connect after restart");
        let nlb = WRITE_BYTES >> ctrl.identify_ns(1).unwrap().lbads;
        let mut q = ctrl.connect_io_queue(32, 128 << 10).unwrap();
        let started = Instant::now();
        for &(lba, g) in &durable {
            assert!(
                read_back(&mut q, lba, nlb) == pattern(lba, g, WRITE_BYTES as usize),
                "round {gen}: LBA {lba} (written in round {g}, acknowledged durable) lost after SIGKILL"
            );
        }
        eprintln!(
            "round {gen}: {acked} writes acknowledged before SIGKILL; {} durable writes so far read back intact in {:?}",
            durable.len(),
            started.elapsed()
        );
    }
}

/// Issue 33: SMART's Unsafe Shutdowns counts a SIGKILL of the target and
/// not a clean stop (SIGINT), and Power On Hours and the count survive
/// restarts (`node-id.health.json` in the state directory). Before, the
/// field was declared and never counted, and the temperature was 0 K.
#[test]
fn unsafe_shutdowns_count_a_sigkill_and_not_a_clean_stop() {
    let state = tempfile::tempdir().unwrap();
    let args = ["--ram", "16M", "--reactors", "1"];
    let unsafe_shutdowns = |t: &LiveTarget| {
        let mut c =
            Controller::connect(&t.addr.to_string(), NQN, &HostConfig::default()).expect("connect");
        let ns = c.smart_log(1).expect("SMART log of nsid 1");
        let all = c
            .smart_log(0xFFFF_FFFF)
            .expect("SMART log of the controller");
        assert_eq!(ns.unsafe_shutdowns, all.unsafe_shutdowns, "one namespace");
        // Never 0 K (nvme-cli printed -273 °C): a sensor's, or the nominal.
        assert!(
            (233..=473).contains(&ns.temperature_k),
            "{} K",
            ns.temperature_k
        );
        c.shutdown().unwrap();
        ns.unsafe_shutdowns
    };
    let mut t = LiveTarget::start_in(state.path(), &args);
    assert_eq!(unsafe_shutdowns(&t), 0, "a new node");
    t.child.kill().unwrap(); // SIGKILL
    t.child.wait().unwrap();
    let mut t = LiveTarget::start_in(state.path(), &args);
    assert_eq!(unsafe_shutdowns(&t), 1, "after a SIGKILL");
    t.wait_log("counted as an unsafe shutdown").unwrap();
    // SIGINT: the target stops cleanly, flushing, and says so.
    // SAFETY: kill(2) on our own child's pid, which has not been reaped.
    assert_eq!(unsafe { libc::kill(t.child.id() as i32, libc::SIGINT) }, 0);
    assert!(t.child.wait().unwrap().success(), "a clean stop");
    let t = LiveTarget::start_in(state.path(), &args);
    assert_eq!(unsafe_shutdowns(&t), 1, "a clean stop counts nothing");
}
