//! Finding (issue 32, P0): knowing only a keyed host's NQN, a peer could
//! loop AUTH_Negotiate(ffdhe8192) → Authentication Receive without limit,
//! and every Challenge was a modular exponentiation on the reactor thread,
//! stalling every other connection of that reactor. These tests hold the
//! fix: only the groups configured for the host, a bounded number of
//! transactions per connection and per host NQN, and the exponentiation
//! on the DH worker thread, off the reactor. Raw peers on loopback only,
//! every loop bounded in time.

mod common;
use common::*;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};
use trellis_node::config::{BackendKind, Config, HostConfig as TargetHost, NamespaceConfig};
use trellis_nvme::auth::{failure, AuthCmd, Message};
use trellis_nvme::dhchap::{DhGroup, HashId, Secret};
use trellis_nvme::dhchap_host::HostAuth;
use trellis_nvme::fabrics::CNTLID_DYNAMIC;
use trellis_nvme::pdu::Digests;
use trellis_nvme::status::generic;
use trellis_nvme::Status;

/// The flood test measures a victim's tail read latency, and on a 2-CPU
/// machine another test of this file running beside it (its own target,
/// reactor and DH worker) is load that the latency would wrongly be blamed
/// for: CI once saw 6.3 ms against a 1.1 ms baseline that way. So the flood
/// test runs alone ([`alone`]) and every other test takes [`shared`].
static EXCLUSIVE: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    EXCLUSIVE.read().unwrap_or_else(|e| e.into_inner())
}

fn alone() -> RwLockWriteGuard<'static, ()> {
    EXCLUSIVE.write().unwrap_or_else(|e| e.into_inner())
}

/// The keyed host whose NQN the attacker claims (it knows no secret).
const KEYED: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b";
const OTHER_KEYED: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000c";
const AL: usize = 4096;

fn secret(fill: u8) -> Secret {
    Secret {
        key: vec![fill; 32],
        transform: Some(HashId::Sha256),
    }
}

/// One reactor; `HOST` (no key) may connect, as may `KEYED` and
/// `OTHER_KEYED` with secrets and the DH groups `groups`.
fn auth_config(groups: &[&str]) -> Config {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 16 << 20));
    cfg.target.reactors = 1;
    let keyed = |nqn: &str, fill| TargetHost {
        nqn: nqn.into(),
        dhchap_secret: Some(secret(fill).format().into()),
        dhchap_dhgroups: groups.iter().map(|g| g.to_string()).collect(),
        ..Default::default()
    };
    cfg.subsystems[0].hosts = vec![keyed(KEYED, 1), keyed(OTHER_KEYED, 2)];
    cfg
}

/// An admin queue connected as `hostnqn`, which must authenticate.
fn keyed_queue(addr: SocketAddr, hostnqn: &str) -> Queue {
    let mut q = Queue::open(addr, Digests::default());
    let c = q.fabrics_connect(0, 31, NQN, hostnqn, CNTLID_DYNAMIC, 0);
    assert!(c.status.is_success(), "connect: {:?}", c.status);
    assert_ne!(c.dw0 & trellis_nvme::auth::CONNECT_AUTHREQ_ATR, 0, "ATR");
    q
}

/// AUTH_Negotiate offering SHA-256 and `groups` (in that order).
fn negotiate(q: &mut Queue, hostnqn: &str, groups: &[DhGroup]) -> Status {
    let mut h = HostAuth::new(secret(9), None, hostnqn, NQN);
    h.dhgroups = groups.to_vec();
    let m = h.negotiate();
    q.cmd(AuthCmd::dhchap_sqe(true, 0, m.len() as u32), &m, 0, 8192)
        .0
        .status
}

/// Authentication Receive: the controller's message, or the command status.
fn receive(q: &mut Queue) -> Result<Message, Status> {
    let (c, d) = q.cmd(AuthCmd::dhchap_sqe(false, 0, AL as u32), &[], AL, 0);
    if !c.status.is_success() {
        return Err(c.status);
    }
    Ok(Message::decode(&d).expect("a valid message"))
}

/// The DH group of a Challenge, or the explanation of a Failure1.
fn challenge_group(m: &Message) -> Result<u8, u8> {
    match m {
        Message::Challenge(c) => Ok(c.dh_id),
        Message::Failure1(f) => Err(f.explanation),
        other => panic!("neither Challenge nor Failure1: {other:?}"),
    }
}

/// The target picks the group from the intersection of the host's offer
/// and the groups configured for the host, in the target's order; an offer
/// without a configured group gets AUTH_Failure1 "DH group not usable"
/// (reason code explanation 05h, NVMe Base 2.0 §8.13.5; Linux's
/// `NVME_AUTH_DHCHAP_FAILURE_DHGROUP_UNUSABLE`).
#[test]
fn a_dh_group_not_configured_for_the_host_is_refused() {
    let _exclusive = shared();
    let t = trellis_node::Target::start(&auth_config(&["ffdhe3072", "ffdhe2048"])).unwrap();
    let addr = t.local_addrs[0];
    let mut q = keyed_queue(addr, KEYED);
    // The host prefers ffdhe8192, then 2048, then 3072: 8192 is not
    // configured, and of the rest the target's first (3072) wins.
    let offer = [DhGroup::Ffdhe8192, DhGroup::Ffdhe2048, DhGroup::Ffdhe3072];
    assert!(negotiate(&mut q, KEYED, &offer).is_success());
    assert_eq!(
        challenge_group(&receive(&mut q).unwrap()),
        Ok(DhGroup::Ffdhe3072 as u8)
    );
    // Only unconfigured groups: refused, and the transaction is over.
    let offer = [DhGroup::Ffdhe8192, DhGroup::Ffdhe6144, DhGroup::Null];
    assert!(negotiate(&mut q, KEYED, &offer).is_success());
    assert_eq!(
        challenge_group(&receive(&mut q).unwrap()),
        Err(failure::DHGROUP_UNUSABLE)
    );
    assert_eq!(
        negotiate(&mut q, KEYED, &[DhGroup::Ffdhe2048]),
        generic::COMMAND_SEQUENCE_ERROR.dnr()
    );
    // Without dhchap_dhgroups, 6144 and 8192 are not in the default set.
    t.stop().unwrap();
    let t = trellis_node::Target::start(&auth_config(&[])).unwrap();
    let mut q = keyed_queue(t.local_addrs[0], KEYED);
    assert!(negotiate(&mut q, KEYED, &[DhGroup::Ffdhe8192, DhGroup::Ffdhe6144]).is_success());
    assert_eq!(
        challenge_group(&receive(&mut q).unwrap()),
        Err(failure::DHGROUP_UNUSABLE)
    );
    t.stop().unwrap();
}

/// `target.auth_per_conn_max` transactions on one connection get their
/// Challenge; the next Negotiate is refused (AUTH_Failure1, no exponentiation),
/// after which the connection may only disconnect.
#[test]
fn transactions_past_the_per_connection_bound_are_refused() {
    let _exclusive = shared();
    let mut cfg = auth_config(&["ffdhe2048"]);
    cfg.target.auth_per_conn_max = 3;
    let t = trellis_node::Target::start(&cfg).unwrap();
    let mut q = keyed_queue(t.local_addrs[0], KEYED);
    for i in 0..3 {
        assert!(negotiate(&mut q, KEYED, &[DhGroup::Ffdhe2048]).is_success());
        let m = receive(&mut q).unwrap();
        assert_eq!(
            challenge_group(&m),
            Ok(DhGroup::Ffdhe2048 as u8),
            "transaction {i}"
        );
    }
    let computed = t.auth.computed();
    assert!(negotiate(&mut q, KEYED, &[DhGroup::Ffdhe2048]).is_success());
    assert_eq!(
        challenge_group(&receive(&mut q).unwrap()),
        Err(failure::FAILED)
    );
    assert_eq!(
        t.auth.computed(),
        computed,
        "no exponentiation for a refused one"
    );
    assert_eq!(
        negotiate(&mut q, KEYED, &[DhGroup::Ffdhe2048]),
        generic::COMMAND_SEQUENCE_ERROR.dnr()
    );
    // A new connection starts its own count.
    let mut q = keyed_queue(t.local_addrs[0], KEYED);
    assert!(negotiate(&mut q, KEYED, &[DhGroup::Ffdhe2048]).is_success());
    assert!(challenge_group(&receive(&mut q).unwrap()).is_ok());
    t.stop().unwrap();
}

/// The node-wide token bucket of one host NQN (`target.auth_per_host_burst`
/// transactions at once, `auth_per_host_per_sec` more each second) refuses
/// past its bound on any connection, without an exponentiation; another
/// host's bucket is its own; the bucket refills.
#[test]
fn transactions_past_the_per_host_rate_are_refused_across_connections() {
    let _exclusive = shared();
    let mut cfg = auth_config(&["ffdhe2048"]);
    cfg.target.auth_per_host_burst = 4;
    cfg.target.auth_per_host_per_sec = 2;
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.local_addrs[0];
    let start = Instant::now();
    let mut queues = Vec::new();
    for _ in 0..4 {
        let mut q = keyed_queue(addr, KEYED);
        assert!(negotiate(&mut q, KEYED, &[DhGroup::Ffdhe2048]).is_success());
        assert!(challenge_group(&receive(&mut q).unwrap()).is_ok());
        queues.push(q);
    }
    let computed = t.auth.computed();
    let mut q = keyed_queue(addr, KEYED);
    assert!(negotiate(&mut q, KEYED, &[DhGroup::Ffdhe2048]).is_success());
    assert_eq!(
        challenge_group(&receive(&mut q).unwrap()),
        Err(failure::FAILED)
    );
    assert_eq!(
        t.auth.computed(),
        computed,
        "no exponentiation for a refused one"
    );
    assert!(
        start.elapsed() < Duration::from_millis(400),
        "too slow for the bucket to be empty: {:?}",
        start.elapsed()
    );
    // Another host NQN has its own bucket.
    let mut o = keyed_queue(addr, OTHER_KEYED);
    assert!(negotiate(&mut o, OTHER_KEYED, &[DhGroup::Ffdhe2048]).is_success());
    assert!(challenge_group(&receive(&mut o).unwrap()).is_ok());
    // Half a second later (2 per second) the host has one again.
    std::thread::sleep(Duration::from_millis(600));
    let mut q = keyed_queue(addr, KEYED);
    assert!(negotiate(&mut q, KEYED, &[DhGroup::Ffdhe2048]).is_success());
    assert!(challenge_group(&receive(&mut q).unwrap()).is_ok());
    t.stop().unwrap();
}

/// What the victim saw in one phase: the worst 4 KiB read, how many
/// reads ran, and how many took longer than a threshold.
#[derive(Clone, Copy, Debug, Default)]
struct Phase {
    worst: Duration,
    /// The 99.9th percentile: the phase's tail without the one or two
    /// reads the victim's own thread was descheduled for (2 vCPUs shared
    /// with four attacker threads and the DH worker).
    p999: Duration,
    reads: u64,
    slow: u64,
}

/// Largest latencies a phase keeps for its p99.9 (about 40 000 reads a
/// phase put it at the 40th).
const TAIL_KEPT: usize = 512;

/// Back-to-back 4 KiB reads on `q` for `dur`; a read longer than `slow`
/// counts as slow.
fn reads_for(q: &mut Queue, dur: Duration, slow: Duration) -> Phase {
    use std::cmp::Reverse;
    let mut p = Phase::default();
    let mut tail = std::collections::BinaryHeap::with_capacity(TAIL_KEPT + 1);
    let end = Instant::now() + dur;
    while Instant::now() < end {
        let t0 = Instant::now();
        let (c, _) = read(q, (p.reads % 512) * 8, 8);
        let d = t0.elapsed();
        assert!(c.status.is_success(), "victim read: {:?}", c.status);
        p.worst = p.worst.max(d);
        p.slow += u64::from(d > slow);
        p.reads += 1;
        tail.push(Reverse(d));
        if tail.len() > TAIL_KEPT {
            tail.pop();
        }
    }
    // The ⌈reads / 1000⌉-th largest.
    let rank = (p.reads.div_ceil(1000) as usize).clamp(1, tail.len().max(1));
    let mut largest: Vec<Duration> = tail.into_iter().map(|Reverse(d)| d).collect();
    largest.sort_unstable_by(|a, b| b.cmp(a));
    p.p999 = largest.get(rank - 1).copied().unwrap_or_default();
    p
}

/// What one ffdhe8192 public value costs this machine (median of 5): the
/// stall a Challenge computed on the reactor would cause.
fn ffdhe8192_exponentiation() -> Duration {
    median(
        (0..5u8)
            .map(|i| {
                let t0 = Instant::now();
                let k = trellis_nvme::dhchap::DhKey::new(DhGroup::Ffdhe8192, &[i + 7; 64]).unwrap();
                assert!(!k.public_value().is_empty());
                t0.elapsed()
            })
            .collect(),
    )
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The attacker: connections claiming `KEYED` that ask for ffdhe8192
/// Challenges as fast as the target answers, reconnecting whenever a
/// transaction is refused, until `stop`. Counts the Challenges it got.
fn flood(addr: SocketAddr, stop: Arc<AtomicBool>, challenges: Arc<AtomicU64>) {
    while !stop.load(Ordering::Relaxed) {
        let mut q = keyed_queue(addr, KEYED);
        while !stop.load(Ordering::Relaxed) {
            if !negotiate(&mut q, KEYED, &[DhGroup::Ffdhe8192]).is_success() {
                break;
            }
            match receive(&mut q) {
                Ok(Message::Challenge(_)) => challenges.fetch_add(1, Ordering::Relaxed),
                _ => break,
            };
        }
    }
}

/// Starts `n` flooding threads; the returned closure stops and joins them.
fn start_flood(addr: SocketAddr, n: usize, challenges: &Arc<AtomicU64>) -> impl FnOnce() {
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (s, c) = (stop.clone(), challenges.clone());
            std::thread::spawn(move || flood(addr, s, c))
        })
        .collect();
    move || {
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
    }
}

/// Acceptance: a host reading 4 KiB blocks on the same (single, pinned)
/// reactor as a peer flooding ffdhe8192 Challenges from several
/// connections keeps its tail read latency within 2 × its baseline tail
/// plus 2 ms. Baseline and flood phases alternate (A B A B), so both see
/// the same background load of the shared machine, and each phase's tail
/// is compared as a median over the rounds: one scheduler hiccup of this
/// 2-vCPU VM (baselines alone range 1–13 ms) must not decide it. The tail
/// is the 99.9th percentile, not the maximum: with ~40 000 reads a phase
/// the maximum is one read the victim's own thread waited for a CPU (CI
/// failed twice on a single 9 ms read), while a Challenge computed on the
/// reactor stalls one read per Challenge, ~160 a phase, which p99.9 (the
/// 40th largest) still sees.
///
/// The worst read alone is a weak witness here, so the test also counts
/// what a stall would leave: every Challenge computed on the reactor holds
/// the read in flight for about one exponentiation (measured here), so
/// with the bug the flood phases would have about one slow read per
/// Challenge (hundreds); off the reactor, no more than the baseline's few.
/// The bounds are raised so the flood is as hard as the worker can serve,
/// and the test checks that the flood did get Challenges computed.
#[test]
fn an_ffdhe8192_challenge_flood_does_not_stall_another_hosts_reads() {
    let _exclusive = alone();
    const PHASE: Duration = Duration::from_millis(1_000);
    const ROUNDS: usize = 5;
    const ATTACKERS: usize = 4;
    let exp = ffdhe8192_exponentiation();
    let slow = exp / 2;
    let mut cfg = auth_config(&["ffdhe8192"]);
    // The reactor on CPU 0, as a production node pins them; the DH worker
    // keeps off it. The victim's and the attacker's threads may run anywhere.
    cfg.target.cpus = vec![0];
    cfg.target.auth_per_conn_max = 1_000_000;
    cfg.target.auth_per_host_per_sec = 1_000_000;
    cfg.target.auth_per_host_burst = 1_000_000;
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.local_addrs[0];
    let mut victim = controller(addr, NQN, 1, Digests::default(), 0);
    let io = &mut victim.io[0];
    reads_for(io, Duration::from_millis(300), slow); // warm up
    let challenges = Arc::new(AtomicU64::new(0));
    let (mut base, mut under) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        base.push(reads_for(io, PHASE, slow));
        let stop = start_flood(addr, ATTACKERS, &challenges);
        // Let the flood reach its rate before measuring.
        std::thread::sleep(Duration::from_millis(100));
        under.push(reads_for(io, PHASE, slow));
        stop();
    }
    let got = challenges.load(Ordering::Relaxed);
    let worst = |v: &[Phase]| median(v.iter().map(|p| p.p999).collect());
    let sum = |v: &[Phase], f: fn(&Phase) -> u64| v.iter().map(f).sum::<u64>();
    let (base_w, under_w) = (worst(&base), worst(&under));
    let bound = base_w * 2 + Duration::from_millis(2);
    let (base_slow, under_slow) = (sum(&base, |p| p.slow), sum(&under, |p| p.slow));
    eprintln!(
        "ffdhe8192 exponentiation {exp:?}; victim p99.9 4 KiB read (median of {ROUNDS} phases): \
         baseline {base_w:?} ({} reads), under the flood {under_w:?} ({} reads); bound {bound:?}; \
         reads over {slow:?}: baseline {base_slow}, under the flood {under_slow}; \
         ffdhe8192 Challenges served to the attacker: {got}; phases' p99.9: base {:?} flood {:?}; \
         phases' max: base {:?} flood {:?}",
        sum(&base, |p| p.reads),
        sum(&under, |p| p.reads),
        base.iter().map(|p| p.p999).collect::<Vec<_>>(),
        under.iter().map(|p| p.p999).collect::<Vec<_>>(),
        base.iter().map(|p| p.worst).collect::<Vec<_>>(),
        under.iter().map(|p| p.worst).collect::<Vec<_>>(),
    );
    assert!(
        got >= 20,
        "the flood got only {got} Challenges: it tested nothing"
    );
    assert!(
        under_w <= bound,
        "victim p99.9 read {under_w:?} > 2 × baseline {base_w:?} + 2 ms"
    );
    assert!(
        under_slow <= base_slow + got / 20,
        "{under_slow} reads over {slow:?} under the flood (baseline {base_slow}) for {got} \
         Challenges: exponentiations stall the reactor"
    );
    t.stop().unwrap();
}

/// A whole transaction goes through the DH workers on both socket engines:
/// the host library authenticates (both exponentiations computed off the
/// reactor, which the worker's count shows) and its commands then run.
#[test]
fn the_host_library_authenticates_through_the_workers_on_both_engines() {
    let _exclusive = shared();
    use trellis_node::config::SocketEngine;
    for engine in [SocketEngine::Epoll, SocketEngine::Uring] {
        let mut cfg = auth_config(&["ffdhe2048"]);
        cfg.target.socket_engine = engine;
        let t = trellis_node::Target::start(&cfg).unwrap();
        let host = trellis_host::HostConfig {
            hostnqn: KEYED.into(),
            kato_ms: 0,
            dhchap_secret: Some(secret(1)),
            ..Default::default()
        };
        let addr = t.local_addrs[0].to_string();
        let mut c = trellis_host::Controller::connect(&addr, NQN, &host).unwrap();
        assert!(c.identify_ns(1).is_ok(), "{engine:?}: admin commands run");
        c.set_num_queues(1).unwrap();
        c.connect_io_queue(16, 4096).unwrap();
        // Two queues, two exponentiations each.
        assert_eq!(t.auth.computed(), 4, "{engine:?}");
        t.stop().unwrap();
    }
}

/// Review finding on the per-host bucket: keyed by the NQN a peer claims
/// alone, a flood in a keyed host's name from anywhere emptied it and
/// locked the real host out of authentication for as long as the flood
/// went on. The bucket is per (host NQN, source address): a flood from
/// 127.0.0.2 empties its own, and the host at 127.0.0.1 still
/// authenticates.
#[test]
fn a_flood_in_a_hosts_name_from_another_address_does_not_lock_it_out() {
    let _exclusive = shared();
    let mut cfg = auth_config(&["ffdhe2048"]);
    cfg.target.auth_per_host_burst = 4;
    cfg.target.auth_per_host_per_sec = 1;
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.local_addrs[0];
    let from = |ip: [u8; 4]| {
        let s = connect_from(std::net::Ipv4Addr::from(ip), addr);
        let mut q = Queue::open_stream(s, Digests::default());
        let c = q.fabrics_connect(0, 31, NQN, KEYED, CNTLID_DYNAMIC, 0);
        assert!(c.status.is_success(), "connect: {:?}", c.status);
        q
    };
    let mut flood = Vec::new();
    for _ in 0..4 {
        let mut q = from([127, 0, 0, 2]);
        assert!(negotiate(&mut q, KEYED, &[DhGroup::Ffdhe2048]).is_success());
        assert!(challenge_group(&receive(&mut q).unwrap()).is_ok());
        flood.push(q);
    }
    let mut q = from([127, 0, 0, 2]);
    assert!(negotiate(&mut q, KEYED, &[DhGroup::Ffdhe2048]).is_success());
    assert_eq!(
        challenge_group(&receive(&mut q).unwrap()),
        Err(failure::FAILED),
        "the flooding address is past its bucket"
    );
    let mut real = from([127, 0, 0, 1]);
    assert!(negotiate(&mut real, KEYED, &[DhGroup::Ffdhe2048]).is_success());
    assert!(
        challenge_group(&receive(&mut real).unwrap()).is_ok(),
        "the host at its own address was locked out by the flood"
    );
    t.stop().unwrap();
}
