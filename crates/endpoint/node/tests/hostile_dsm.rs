//! Hostile peer, issue 32 (docs/security.md): Dataset Management
//! (deallocate) and Write Zeroes used to run synchronously on the reactor
//! thread, and where the file system had no FALLOC_FL_ZERO_RANGE the
//! fallback wrote zeroes from user space over the whole range, so one
//! host's `mkfs` or `fstrim` (or an attacker's burst of them) stalled every
//! other host of that reactor. Each test here is a raw NVMe/TCP attacker
//! and a victim host on one reactor of a real target on loopback, bounded
//! in time (a few seconds) and memory (the file is sparse; Write Zeroes
//! all cover the same 256 MiB).

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use trellis_node::config::{BackendKind, NamespaceConfig};
use trellis_nvme::pdu::Digests;
use trellis_nvme::sqe::{admin, io};
use trellis_nvme::{Cqe, Sgl, Sqe};

const VICTIM: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002";
const BLOCK: u64 = 4096;
/// The namespace's apparent size: 4 TiB of sparse file (ext4 allows 16 TiB).
const NS_BYTES: u64 = 4 << 40;
/// Write Zeroes NLB is 16 bits, 0-based: 65536 blocks, 256 MiB at 4 KiB.
const WZ_MAX_NLB0: u32 = 0xFFFF;
/// DSM NR is 8 bits, 0-based: 256 ranges, the spec's maximum.
const DSM_RANGES: usize = 256;
/// Rounds of (one DSM of 256 whole-namespace ranges + WZ_PER_ROUND Write
/// Zeroes of the maximum length), each sent as one pipelined burst.
const ROUNDS: usize = 3;
const WZ_PER_ROUND: usize = 8;
/// The victim's keep-alive timeout: a stall longer than this kills its
/// controller.
const VICTIM_KATO_MS: u32 = 1_000;
/// The bound on the victim's worst command latency while the attack runs.
/// The reactor does no zeroing or deallocation on its own thread now; what
/// remains is scheduling on a shared machine: 6–27 ms measured on 2 cores
/// at load 8 (before the fix: 1.7 s, and a 1 s keep-alive expired).
/// The bound is a fifth of the victim's 1 s keep-alive timeout.
const VICTIM_WORST_MS: u128 = 200;

/// One Dataset Management (AD) capsule: `DSM_RANGES` ranges, each the whole
/// namespace (overlapping, the worst case for the work a command asks).
fn dsm_all(cid: u16, size_blocks: u64) -> (Sqe, Vec<u8>) {
    let nlb = size_blocks.min(u32::MAX as u64) as u32;
    let mut ranges = vec![0u8; DSM_RANGES * 16];
    for r in ranges.chunks_mut(16) {
        r[4..8].copy_from_slice(&nlb.to_le_bytes());
        r[8..16].copy_from_slice(&0u64.to_le_bytes());
    }
    let mut s = Sqe::new(io::DATASET_MANAGEMENT, cid, 1);
    s.set_cdw(10, DSM_RANGES as u32 - 1);
    s.set_cdw(11, 1 << 2); // AD: deallocate
    s.set_sgl(Sgl::in_capsule(ranges.len() as u32));
    (s, ranges)
}

fn write_zeroes_max(cid: u16) -> Sqe {
    let mut s = Sqe::new(io::WRITE_ZEROES, cid, 1);
    s.set_cdw(12, WZ_MAX_NLB0);
    s
}

/// The victim: keep-alives and 4 KiB reads on the same reactor until
/// `stop`; its worst latency, and whether every command succeeded.
fn victim(addr: std::net::SocketAddr, stop: Arc<AtomicBool>) -> (Duration, usize, bool) {
    let mut c = controller_as(addr, NQN, VICTIM, 1, Digests::default(), VICTIM_KATO_MS);
    let (mut worst, mut n, mut ok) = (Duration::ZERO, 0usize, true);
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let (cqe, _) = c.admin.cmd(Sqe::new(admin::KEEP_ALIVE, 0, 0), &[], 0, 0);
        ok &= cqe.status.is_success();
        worst = worst.max(t.elapsed());
        let t = Instant::now();
        let slba = (n as u64 * 7919) % (NS_BYTES / BLOCK);
        let (cqe, _) = c.io[0].cmd(
            Sqe::rw(io::READ, 0, 1, slba, 1, false),
            &[],
            BLOCK as usize,
            0,
        );
        ok &= cqe.status.is_success();
        worst = worst.max(t.elapsed());
        n += 2;
        std::thread::sleep(Duration::from_millis(5));
    }
    // Still alive after the attack: its controller was never torn down.
    let (cqe, _) = c.admin.cmd(Sqe::new(admin::KEEP_ALIVE, 0, 0), &[], 0, 0);
    ok &= cqe.status.is_success();
    (worst, n, ok)
}

/// Sends the attack as pipelined bursts and collects every completion.
fn attack(q: &mut Queue, size_blocks: u64) -> Vec<Cqe> {
    q.s.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut cqes = Vec::new();
    for _ in 0..ROUNDS {
        let (s, ranges) = dsm_all(q.next_cid(), size_blocks);
        q.send_capsule(&s, &ranges);
        for _ in 0..WZ_PER_ROUND {
            let s = write_zeroes_max(q.next_cid());
            q.send_capsule(&s, &[]);
        }
        for _ in 0..1 + WZ_PER_ROUND {
            let p = q.recv().expect("a completion for every attack command");
            cqes.push(Cqe::decode(&p.bytes[8..24]));
        }
    }
    cqes
}

/// Runs the attack against a file namespace in `dir`; returns the victim's
/// worst latency after checking everything else the guarantee says.
fn run(dir: &std::path::Path) -> Duration {
    let mut ns = NamespaceConfig::sized(BackendKind::File, NS_BYTES);
    ns.block_size = BLOCK as u32;
    ns.path = Some(dir.join("big.img").to_string_lossy().into_owned());
    let mut cfg = test_config(ns);
    cfg.subsystems[0].allowed_hosts.push(VICTIM.into());
    assert_eq!(
        cfg.target.reactors, 1,
        "attacker and victim share the reactor"
    );
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.local_addrs[0];
    let mut att = controller(addr, NQN, 1, Digests::default(), 0);
    // Identify tells what Deallocate does here: both file systems punch
    // holes, so deallocated blocks read zeroes and WZ DEAC is supported.
    let mut id = Sqe::new(admin::IDENTIFY, 0, 1);
    id.set_cdw(10, 0); // CNS 00h: Identify Namespace
    let (cqe, page) = att.admin.cmd(id, &[], 4096, 0);
    assert!(cqe.status.is_success());
    assert_eq!(
        page[33], 0x09,
        "DLFEAT: deallocated blocks read zeroes, WZ DEAC"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let v = {
        let stop = stop.clone();
        std::thread::spawn(move || victim(addr, stop))
    };
    std::thread::sleep(Duration::from_millis(200)); // the victim is connected
    let started = Instant::now();
    let cqes = attack(&mut att.io[0], NS_BYTES / BLOCK);
    let attack_time = started.elapsed();
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    let (worst, n, ok) = v.join().unwrap();
    eprintln!(
        "{}: attack of {} commands took {:?}; victim: {n} commands, worst latency {:?}",
        dir.display(),
        cqes.len(),
        attack_time,
        worst
    );
    for c in &cqes {
        assert!(
            c.status.is_success(),
            "attack command {:#x}: {:?}",
            c.cid,
            c.status
        );
    }
    assert!(
        ok,
        "a victim command failed or its controller was torn down"
    );
    assert!(n >= 10, "the victim ran during the attack ({n} commands)");
    // The data reads back as zeroes where it was zeroed.
    let (cqe, data) = att.io[0].cmd(Sqe::rw(io::READ, 0, 1, 0, 1, false), &[], 4096, 0);
    assert!(cqe.status.is_success());
    assert!(data.iter().all(|&b| b == 0));
    drop(att);
    t.stop().unwrap();
    worst
}

/// The namespace on the local file system (ext4 here, which has
/// ZERO_RANGE and PUNCH_HOLE): nothing is zeroed from user space, but the
/// reactor must still not wait for the file system's work.
#[test]
fn dsm_and_write_zeroes_do_not_stall_another_host_on_a_sparse_file() {
    let d = tempfile::tempdir().unwrap();
    let worst = run(d.path());
    assert!(
        worst.as_millis() < VICTIM_WORST_MS,
        "victim's worst latency {worst:?} (bound {VICTIM_WORST_MS} ms)"
    );
}

/// The namespace on tmpfs, which has PUNCH_HOLE but no ZERO_RANGE: the
/// case of the finding, where Write Zeroes fell back to writing zeroes
/// from user space on the reactor thread.
#[test]
fn dsm_and_write_zeroes_do_not_stall_another_host_without_zero_range() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm: skipped");
        return;
    }
    let d = tempfile::tempdir_in(shm).unwrap();
    let worst = run(d.path());
    assert!(
        worst.as_millis() < VICTIM_WORST_MS,
        "victim's worst latency {worst:?} (bound {VICTIM_WORST_MS} ms)"
    );
}
