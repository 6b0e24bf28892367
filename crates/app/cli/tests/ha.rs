//! HA pair (docs/target.md, "HA pair"): two `trellis target` processes
//! export one backing file under one subsystem and namespace identity; the
//! lease holder is optimized, the other inaccessible. Failover after kill -9
//! of the owner, fencing when the store goes silent, drain and failback, with
//! `trellis bench --paths A,B --verify` running through them where the host
//! side matters.
//!
//! The etcd tests run etcd (Debian's etcd-server) as a real process on
//! loopback (the store is in every build). Without an `etcd` binary they
//! print "SKIPPED <test>: ..." (uncaptured, so plain `cargo test` shows it)
//! and pass, unless TRELLIS_REQUIRE_ETCD=1 (scripts/test.d/70-ha.sh sets
//! it, and also checks that every etcd test ran), where a missing etcd
//! fails them.

mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.io.trellis:ha";

/// One node's config: a listener on a free port, the shared file with a
/// fixed identity (both nodes must report the same one), a management
/// socket, and `[ha]` with `ha`'s lines.
fn node_config(disk: &Path, sock: &Path, ha: &str) -> String {
    node_config_ns(
        &format!("backend = \"file\"\npath = \"{}\"", disk.display()),
        sock,
        ha,
    )
}

/// As [`node_config`], the namespace's backend lines `backend`.
fn node_config_ns(backend: &str, sock: &Path, ha: &str) -> String {
    format!(
        "[ctl]\nsocket = \"{}\"\n\n[ha]\n{ha}\n\n\
         [[listener]]\naddr = \"127.0.0.1:0\"\n\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nserial = \"TRELLISHA\"\n\n\
         [[subsystem.namespace]]\n{backend}\nsize = \"16MiB\"\n\
         uuid = \"5472656c-6c69-4073-8000-00000000a001\"\n\
         nguid = \"5472656c6c6940738000000000a00001\"\neui64 = \"0254726c6c690001\"\n",
        sock.display(),
    )
}

struct Node {
    t: LiveTarget,
    sock: PathBuf,
}

impl Node {
    fn start(dir: &Path, name: &str, ha: &str) -> Node {
        let disk = format!(
            "backend = \"file\"\npath = \"{}\"",
            dir.join("disk.img").display()
        );
        Node::start_ns(dir, name, ha, &disk)
    }

    /// As [`Node::start`], the namespace's backend lines `backend`.
    fn start_ns(dir: &Path, name: &str, ha: &str, backend: &str) -> Node {
        let sock = dir.join(format!("{name}.sock"));
        let ha = format!("node = \"{name}\"\n{ha}");
        // Disjoint controller IDs, as a Linux host connected to both needs.
        let ids = if name == "a" {
            (1, 32767)
        } else {
            (32768, 65519)
        };
        // A long data wait: the held-write tests hold write data back past a
        // failover, and must meet the fence at execution, not this timeout.
        let target = format!(
            "[target]\ncntlid_min = {}\ncntlid_max = {}\ndata_wait_timeout_ms = 60000\n\n",
            ids.0, ids.1
        );
        let config = node_config_ns(backend, &sock, &ha);
        let t = LiveTarget::start_config(&(target + &config));
        Node { t, sock }
    }

    fn ctl(&self, args: &[&str]) -> std::process::Output {
        let mut a = vec!["ctl", "--socket", self.sock.to_str().unwrap()];
        a.extend_from_slice(args);
        trellis_within(&a, Duration::from_secs(30))
    }

    fn ha(&self) -> Value {
        let o = self.ctl(&["--json", "ha"]);
        assert!(o.status.success(), "ctl ha: {}", stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn role(&self) -> String {
        self.ha()["role"].as_str().unwrap_or("?").to_string()
    }

    /// Every (listener, group) state the node reports.
    fn ana_states(&self) -> Vec<String> {
        let o = self.ctl(&["--json", "ana", "get"]);
        assert!(o.status.success(), "ctl ana get: {}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["state"].as_str().unwrap().to_string())
            .collect()
    }

    /// Waits up to `limit` for `role`; how long it took.
    fn wait_role(&self, role: &str, limit: Duration) -> Duration {
        let t0 = Instant::now();
        while self.role() != role {
            assert!(
                t0.elapsed() < limit,
                "not {role} within {limit:?}: {}",
                self.ha()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        t0.elapsed()
    }

    fn kill9(&mut self) {
        self.t.child.kill().unwrap(); // SIGKILL
        self.t.child.wait().unwrap();
    }
}

fn shared_disk(dir: &Path) {
    let f = std::fs::File::create(dir.join("disk.img")).unwrap();
    f.set_len(16 << 20).unwrap();
}

/// `trellis bench --paths a,b --verify` for `secs`, in the background.
fn spawn_bench(paths: &str, secs: u32, json: &Path) -> Child {
    spawn_bench_mix(paths, secs, json, 50)
}

/// As [`spawn_bench`], `read_pct` % of the I/Os reads.
fn spawn_bench_mix(paths: &str, secs: u32, json: &Path, read_pct: u32) -> Child {
    Command::new(bin())
        .args([
            "bench",
            "--no-progress",
            "--paths",
            paths,
            "--rw",
            "randrw",
            "--bs",
            "4k",
        ])
        .args(["--nqn", NQN, "--size", "8m", "--iodepth", "16", "--verify"])
        .args(["--rwmixread", &read_pct.to_string()])
        .args([
            "--runtime",
            &secs.to_string(),
            "--json",
            json.to_str().unwrap(),
        ])
        .env("TRELLIS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The bench's figures that tell a failover: errors, stalls, per-path I/O.
fn brief(j: &Value) -> String {
    let ios: Vec<&Value> = (0..2).map(|i| &j["paths"][i]["ios"]).collect();
    format!(
        "errors {} verify_failures {} verified_blocks {} ana_moves {} path_failures {} max latency {} us, ios per path {ios:?}",
        j["errors"], j["verify_failures"], j["verified_blocks"], j["ana_moves"], j["path_failures"], j["lat_us_max"]
    )
}

/// Waits for the bench; requires 0 errors and 0 verify failures; the job.
fn bench_result(b: Child, json: &Path) -> Value {
    let out = b.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {err}");
    let j: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let j = j["jobs"][0].clone();
    assert_eq!(
        (j["errors"].as_u64(), j["verify_failures"].as_u64()),
        (Some(0), Some(0)),
        "{j}"
    );
    assert!(j["verified_blocks"].as_u64().unwrap() > 0, "{j}");
    j
}

/// A, then B (standby) once A owns the lease.
fn pair(dir: &Path, ha: &str) -> (Node, Node) {
    shared_disk(dir);
    let a = Node::start(dir, "a", ha);
    a.wait_role("owner", Duration::from_secs(10));
    let b = Node::start(dir, "b", ha);
    // B saw A as the holder: it is a standby by choice, not by accident.
    let t0 = Instant::now();
    while b.ha()["holder"] != "a" {
        assert!(t0.elapsed() < Duration::from_secs(10), "{}", b.ha());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(b.role(), "standby");
    assert!(a.ana_states().iter().all(|s| s == "optimized"));
    assert!(b.ana_states().iter().all(|s| s == "inaccessible"));
    (a, b)
}

/// Kill -9 of the owner under verified load: the standby becomes optimized
/// within `limit`, and the host loses nothing. Returns the failover time.
fn kill_owner_under_load(dir: &Path, ha: &str, limit: Duration) -> Duration {
    let (mut a, b) = pair(dir, ha);
    let json = dir.join("bench.json");
    let bench = spawn_bench(&format!("{},{}", a.t.addr(), b.t.addr()), 12, &json);
    std::thread::sleep(Duration::from_secs(2));
    a.kill9();
    let took = b.wait_role("owner", limit);
    assert!(b.ana_states().iter().all(|s| s == "optimized"));
    let j = bench_result(bench, &json);
    eprintln!(
        "failover (kill -9 to standby optimized): {took:?}; bench: {}",
        brief(&j)
    );
    assert!(j["paths"][1]["ios"].as_u64().unwrap() > 0, "B served: {j}");
    took
}

#[test]
fn file_store_kill9_of_the_owner_moves_the_lease_at_once_and_the_host_loses_nothing() {
    let d = tempfile::tempdir().unwrap();
    let ha = format!("path = \"{}\"", d.path().join("ha.lock").display());
    // flock is dropped at the owner's death: the standby's next try (100 ms) wins.
    let took = kill_owner_under_load(d.path(), &ha, Duration::from_secs(3));
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// A raw NVMe/TCP host (it can hold write data back): an enabled
/// controller on `addr` with one I/O queue.
fn raw_host(
    addr: std::net::SocketAddr,
) -> (
    trellis_testkit::initiator::Queue,
    trellis_testkit::initiator::Queue,
) {
    use trellis_nvme::fabrics::CNTLID_DYNAMIC;
    use trellis_testkit::initiator::Queue;
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:5472656c-6c69-4073-8000-0000000000f0";
    let dg = trellis_nvme::pdu::Digests::default();
    let mut admin = Queue::open(addr, dg);
    let c = admin.fabrics_connect(0, 31, NQN, HOST, CNTLID_DYNAMIC, 0);
    assert!(c.status.is_success(), "admin connect: {:?}", c.status);
    assert!(admin.prop_set(0x14, 0x0046_0001).status.is_success());
    let mut io = Queue::open(addr, dg);
    let c2 = io.fabrics_connect(1, 31, NQN, HOST, c.dw0 as u16, 0);
    assert!(c2.status.is_success(), "I/O connect: {:?}", c2.status);
    (admin, io)
}

/// Sends a 4 KiB write of block 0 on `q` without its data and takes the
/// owner's R2T: the write is admitted and its data held back. (cid, ttag).
fn hold_a_write(q: &mut trellis_testkit::initiator::Queue) -> (u16, u16) {
    use trellis_nvme::pdu::{PduType, R2t};
    use trellis_nvme::{sqe::io, Sgl, Sqe};
    let cid = q.next_cid();
    let mut sqe = Sqe::rw(io::WRITE, cid, 1, 0, 8, false);
    sqe.set_sgl(Sgl::transport(4096));
    q.send_capsule(&sqe, &[]);
    let r2t = q.recv().expect("an R2T");
    assert_eq!(r2t.ch.pdu_type, PduType::R2T as u8);
    (cid, R2t::decode(&r2t.bytes).ttag)
}

/// Writes NEW data to block 0 through the new owner `b`, acknowledged; its
/// I/O queue (kept for the read back) and the data.
fn write_new_through(b: &Node) -> (Vec<trellis_testkit::initiator::Queue>, Vec<u8>) {
    use trellis_nvme::{sqe::io, Sqe};
    let (admin, mut qb) = raw_host(b.t.addr);
    let new = vec![0x4E; 4096];
    let w = Sqe::rw(io::WRITE, qb.next_cid(), 1, 0, 8, false);
    let (c, _) = qb.cmd(w, &new, 0, 0);
    assert!(
        c.status.is_success(),
        "the new owner's write: {:?}",
        c.status
    );
    (vec![admin, qb], new)
}

/// The held data reaches the old owner on `qa`: the write fails with ANA
/// Inaccessible (not success), and block 0 read through `qb` is `new`.
fn held_write_refused_and_new_kept(
    qa: &mut trellis_testkit::initiator::Queue,
    qb: &mut trellis_testkit::initiator::Queue,
    new: &[u8],
) {
    use trellis_nvme::pdu::PduType;
    use trellis_nvme::{sqe::io, Cqe, Sqe};
    qa.s.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let resp = qa.recv().expect("a response to the held write");
    assert_eq!(resp.ch.pdu_type, PduType::CapsuleResp as u8);
    let st = Cqe::decode(&resp.bytes[8..24]).status;
    assert!(
        !st.is_success(),
        "the old owner completed the held write with success"
    );
    assert_eq!(st, trellis_nvme::status::path::ANA_INACCESSIBLE, "{st:?}");
    let rd = Sqe::rw(io::READ, qb.next_cid(), 1, 0, 8, false);
    let (c, back) = qb.cmd(rd, &[], 4096, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
    assert!(
        back == new,
        "block 0 does not hold the acknowledged NEW data"
    );
}

/// Issue 37's stale write: the owner admits a 4 KiB write and sends its R2T;
/// the host holds the data back; ownership moves (a drain) and the host
/// writes NEW data to the block through the new owner, acknowledged; then
/// the held data reaches the old owner. It must not land: the old owner
/// fails the command with a path error (ANA Inaccessible), and the block
/// keeps the NEW data. On the old code the held write completed with
/// success and the block read back STALE.
#[test]
fn a_write_held_after_r2t_never_lands_after_ownership_moves() {
    let d = tempfile::tempdir().unwrap();
    let ha = format!("path = \"{}\"", d.path().join("ha.lock").display());
    let (a, b) = pair(d.path(), &ha);
    let (_admin_a, mut qa) = raw_host(a.t.addr);
    let held = hold_a_write(&mut qa);
    let o = a.ctl(&["drain"]);
    assert!(o.status.success(), "drain: {}", stderr(&o));
    b.wait_role("owner", Duration::from_secs(5));
    let (mut qs, new) = write_new_through(&b);
    qa.send_h2c(held.1, held.0, &[0x5A; 4096], 0, 4096);
    held_write_refused_and_new_kept(&mut qa, &mut qs[1], &new);
}

#[test]
fn drain_hands_over_without_a_host_error_and_failback_after_a_restart() {
    let d = tempfile::tempdir().unwrap();
    let ha = format!("path = \"{}\"", d.path().join("ha.lock").display());
    drain_and_failback(d.path(), &ha);
}

/// Drain A under verified load (B takes over), restart A (standby), drain
/// B (A owns again): 0 errors throughout.
fn drain_and_failback(dir: &Path, ha: &str) {
    let (mut a, b) = pair(dir, ha);
    let json = dir.join("drain.json");
    let bench = spawn_bench(&format!("{},{}", a.t.addr(), b.t.addr()), 6, &json);
    std::thread::sleep(Duration::from_secs(1));
    let t0 = Instant::now();
    let o = a.ctl(&["drain"]);
    assert!(o.status.success(), "drain: {}", stderr(&o));
    assert_eq!(a.role(), "standby");
    assert!(a.ana_states().iter().all(|s| s == "inaccessible"));
    b.wait_role("owner", Duration::from_secs(5));
    eprintln!("drain to other node optimized: {:?}", t0.elapsed());
    let j = bench_result(bench, &json);
    eprintln!("bench through the drain: {}", brief(&j));
    // The drained node is not the holder: a second drain there is refused.
    let o = a.ctl(&["drain"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("does not hold the lease (holder: b)"),
        "{}",
        stderr(&o)
    );
    // Restart A (a rolling update), then fail back by draining B.
    a.kill9();
    let a = Node::start(dir, "a", ha);
    let t0 = Instant::now();
    while a.ha()["holder"] != "b" {
        assert!(t0.elapsed() < Duration::from_secs(10), "{}", a.ha());
        std::thread::sleep(Duration::from_millis(20));
    }
    let json = dir.join("failback.json");
    let bench = spawn_bench(&format!("{},{}", a.t.addr(), b.t.addr()), 6, &json);
    std::thread::sleep(Duration::from_secs(1));
    let o = b.ctl(&["drain"]);
    assert!(o.status.success(), "drain: {}", stderr(&o));
    a.wait_role("owner", Duration::from_secs(5));
    let j = bench_result(bench, &json);
    assert!(
        j["paths"][0]["ios"].as_u64().unwrap() > 0,
        "A served again: {j}"
    );
}

/// Issue 33, I/O path failure detection with auto recovery: both nodes
/// serve one emulated drive (its data in a shared file); through A it
/// degrades (`fault = "degrade"`: from day 9 of its age reads need more and
/// more read retries, uncorrectable from about day 31, silent on day 36; a
/// day a second). With `drive_failover = "predicted"`, A's failure
/// predictor flags it by its read latency and A hands the pair to B, under
/// `trellis bench --verify` on both paths: B becomes optimized, A says why
/// in its timeline and `ctl get health`, and the host sees 0 errors.
#[test]
fn a_drive_predicted_to_fail_hands_the_pair_to_the_peer_without_a_host_error() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let ha = format!(
        "path = \"{}\"\ndrive_failover = \"predicted\"",
        dir.join("ha.lock").display()
    );
    let drive = format!(
        "backend = \"emulated\"\nprofile = \"femu\"\npath = \"{}\"",
        dir.join("drive.img").display()
    );
    let faulty = format!(
        "{drive}\nfault = \"degrade\"\nfault_onset_days = 9.0\nfault_ramp_days = 27.0\nage_acceleration = 86400.0"
    );
    let born = Instant::now();
    let a = Node::start_ns(dir, "a", &ha, &faulty);
    a.wait_role("owner", Duration::from_secs(10));
    let b = Node::start_ns(dir, "b", &ha, &drive);
    let t0 = Instant::now();
    while b.ha()["holder"] != "a" {
        assert!(t0.elapsed() < Duration::from_secs(10), "{}", b.ha());
        std::thread::sleep(Duration::from_millis(20));
    }
    let json = dir.join("bench.json");
    // Mostly reads: the read tail is then the drive's reads (retries and
    // reads queued behind them), not reads waiting for programs.
    let bench = spawn_bench_mix(&format!("{},{}", a.t.addr(), b.t.addr()), 26, &json, 90);
    // Predicted around day 17 here; its first uncorrectable read would be near day 31.
    b.wait_role("owner", Duration::from_secs(29));
    let day = born.elapsed().as_secs_f64();
    assert_eq!(a.role(), "standby");
    assert!(a.ana_states().iter().all(|s| s == "inaccessible"));
    let timeline = a.ha()["events"].to_string();
    assert!(timeline.contains("drive failover"), "{timeline}");
    let o = a.ctl(&["--json", "get", "health"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let h: Value = serde_json::from_slice(&o.stdout).unwrap();
    let ns = &h["namespaces"][0];
    assert_eq!(ns["prediction"], "predicted failure", "{h}");
    assert_eq!(ns["critical_warning"].as_u64().unwrap() & 0x04, 0x04, "{h}");
    let j = bench_result(bench, &json);
    eprintln!("A handed over on drive day {day:.1}; bench: {}", brief(&j));
    assert!(j["paths"][1]["ios"].as_u64().unwrap() > 0, "B served: {j}");
}

/// Registrants of the reservation tests: more than 16 (SPDK's
/// CVE-2025-57275 wrote past a 16-entry table).
const RESV_HOSTS: usize = 20;

fn resv_nqn(i: usize) -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:ha-resv-host-{i:04}")
}

fn resv_key(i: usize) -> u64 {
    0xA000 + i as u64
}

/// Host `i` of the reservation tests on `n`: its own NQN and host ID, one
/// I/O queue.
fn resv_host(n: &Node, i: usize) -> (trellis_host::Controller, trellis_host::Queue) {
    let hostnqn = resv_nqn(i);
    let cfg = trellis_host::HostConfig {
        hostid: trellis_host::ctrl::hostid_from(&hostnqn),
        hostnqn,
        kato_ms: 0,
        ..Default::default()
    };
    let mut c = trellis_host::Controller::connect(&n.t.addr(), NQN, &cfg).unwrap();
    c.set_num_queues(1).unwrap();
    let q = c.connect_io_queue(8, 8192).unwrap();
    (c, q)
}

fn resv_write(q: &mut trellis_host::Queue) -> trellis_host::Result<()> {
    use trellis_nvme::{sqe::io, Sqe};
    let data = vec![0x5Au8; 512];
    let sqe = Sqe::rw(io::WRITE, 0, 1, 64, 1, false);
    q.exec_ok(sqe, trellis_host::Xfer::ToCtrl(512), &data, &mut [])
        .map(drop)
}

/// Through `n`, the node serving: every registrant with its key, host 0
/// holding Write Exclusive; host 0's write lands and host 1's conflicts.
fn assert_reservation_served(n: &Node, what: &str) {
    use trellis_nvme::resv::RType;
    let (_c0, mut q0) = resv_host(n, 0);
    let (h, regs) = trellis_host::resv::report(&mut q0, 1, 64).unwrap();
    assert_eq!(h.rtype, RType::WriteExclusive as u8, "{what}: {h:?}");
    assert_eq!(h.regctl as usize, RESV_HOSTS, "{what}: {h:?}");
    for i in 0..RESV_HOSTS {
        let id = trellis_host::ctrl::hostid_from(&resv_nqn(i));
        let r = regs.iter().find(|r| r.hostid == id);
        let r = r.unwrap_or_else(|| panic!("{what}: host {i} is not registered: {regs:?}"));
        assert_eq!((r.rkey, r.holds), (resv_key(i), i == 0), "{what}: host {i}");
    }
    resv_write(&mut q0).unwrap_or_else(|e| panic!("{what}: the holder's write: {e}"));
    let (_c1, mut q1) = resv_host(n, 1);
    match resv_write(&mut q1) {
        Err(trellis_host::Error::Nvme(st)) if trellis_host::resv::is_conflict(st) => {}
        other => panic!("{what}: a registrant's write under Write Exclusive: {other:?}"),
    }
}

/// Issue 37 item 4: the pair's reservations live with its lease. 20 hosts
/// register on A, host 0 acquires; after a drain B serves them all, and
/// after kill -9 of B, A (which last saw them before the drain) serves
/// what B acknowledged since: host 1's key replaced on B survives too.
fn reservations_survive_drain_and_failover(dir: &Path, ha: &str) {
    use trellis_nvme::resv::RType;
    let (a, mut b) = pair(dir, ha);
    for i in 0..RESV_HOSTS {
        let (_c, mut q) = resv_host(&a, i);
        trellis_host::resv::register_key(&mut q, 1, resv_key(i) - 1).unwrap();
        if i == 0 {
            trellis_host::resv::claim(&mut q, 1, resv_key(i) - 1, RType::WriteExclusive).unwrap();
        }
    }
    let o = a.ctl(&["drain"]);
    assert!(o.status.success(), "drain: {}", stderr(&o));
    b.wait_role("owner", Duration::from_secs(10));
    // On B: every key moves to its final value, acknowledged by B alone.
    for i in 0..RESV_HOSTS {
        let (_c, mut q) = resv_host(&b, i);
        trellis_host::resv::register_key(&mut q, 1, resv_key(i)).unwrap();
    }
    assert_reservation_served(&b, "after the drain, on B");
    b.kill9();
    let took = a.wait_role("owner", Duration::from_secs(15));
    eprintln!("reservations: A owner {took:?} after kill -9 of B");
    assert_reservation_served(&a, "after kill -9 of B, on A");
    let ev = a.ha()["events"].to_string();
    assert!(
        ev.contains(&format!(
            "reservations loaded from the store: {RESV_HOSTS} registrants"
        )),
        "{ev}"
    );
}

#[test]
fn file_store_reservations_survive_a_drain_and_a_kill9_failover() {
    let d = tempfile::tempdir().unwrap();
    let ha = format!("path = \"{}\"", d.path().join("ha.lock").display());
    reservations_survive_drain_and_failover(d.path(), &ha);
}

#[test]
fn a_node_without_ha_refuses_drain_and_bad_ha_settings_name_the_fix() {
    let t = LiveTarget::start(&[]);
    drop(t);
    let o = trellis(&["target", "--check", "--ha-store", "zookeeper"]);
    assert_refused(&o, &["--ha-store \"zookeeper\": use file or etcd"]);
    let o = trellis(&["target", "--check", "--ha-fence-ms", "4900"]);
    assert_refused(&o, &["fence_ms = 4900", "lease_ttl_ms - 500 = 4500"]);
    // Issue 37: with no shared path, each node locked ha.lock in its own
    // state directory and both owned the lease. A file store needs a path.
    let o = trellis(&["target", "--check", "--ha-store", "file"]);
    assert_refused(&o, &["needs a path both nodes share", "--ha-path"]);
    let d = tempfile::tempdir().unwrap();
    let sock = d.path().join("c.sock");
    let _t = LiveTarget::start(&["--ctl-socket", sock.to_str().unwrap()]);
    let o = trellis(&["ctl", "--socket", sock.to_str().unwrap(), "drain"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no [ha] section"), "{}", stderr(&o));
}

mod etcd {
    use super::*;

    /// etcd on two free loopback ports with its data in a temporary
    /// directory; SIGKILLed when dropped.
    pub struct Etcd {
        child: Child,
        pub endpoint: String,
        _dir: tempfile::TempDir,
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// False (the test is skipped, and says so) when there is no etcd
    /// binary, unless TRELLIS_REQUIRE_ETCD=1: then the test fails.
    fn found() -> bool {
        let found = Command::new("etcd").arg("--version").output().is_ok();
        if !found {
            let required = std::env::var("TRELLIS_REQUIRE_ETCD").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "TRELLIS_REQUIRE_ETCD=1 but there is no etcd binary in PATH \
                 (Debian: apt-get install etcd-server)"
            );
            // Straight to the stderr handle, not eprintln!: libtest
            // captures the macros' output of a passing test, which
            // would hide the skip behind an "ok".
            use std::io::Write;
            let test = std::thread::current().name().unwrap_or("?").to_string();
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: no etcd binary (apt-get install etcd-server); \
                 TRELLIS_REQUIRE_ETCD=1 makes this a failure"
            );
        }
        found
    }

    /// A throwaway CA, a server certificate for 127.0.0.1 and a client
    /// certificate, made with the `openssl` command (valid one day). No
    /// extended key usage: etcd's gateway presents the server certificate
    /// as a client to etcd's own gRPC port.
    fn make_pki(dir: &Path) {
        let run = |args: &[&str]| {
            let o = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .expect("the openssl command (Debian: apt-get install openssl)");
            assert!(o.status.success(), "openssl {args:?}: {}", stderr(&o));
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509", "-days", "1", "-subj", "/CN=trellis-test-ca"];
        ca.extend(ec);
        ca.extend(["-keyout", "ca.key", "-out", "ca.crt"]);
        run(&ca);
        std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        for who in ["server", "client"] {
            let (key, csr, crt) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.crt"),
            );
            let subj = format!("/CN=trellis-test-{who}");
            let mut req = vec!["req", "-subj", &subj];
            req.extend(ec);
            req.extend(["-keyout", &key, "-out", &csr]);
            run(&req);
            run(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                "san.ext",
                "-out",
                &crt,
            ]);
        }
        // The node refuses a key file that others may read.
        use std::os::unix::fs::PermissionsExt;
        let key = dir.join("client.key");
        std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    /// `trellis target` with `[ha]` = `ha` that must not start: its output.
    fn refused_start(dir: &Path, ha: &str) -> std::process::Output {
        shared_disk(dir);
        let cfg = dir.join("refused.toml");
        let ha = format!("node = \"r\"\n{ha}");
        write_private(
            &cfg,
            &node_config(&dir.join("disk.img"), &dir.join("r.sock"), &ha),
        );
        let state = tempfile::tempdir().unwrap();
        let (cfg, state) = (
            cfg.display().to_string(),
            state.path().display().to_string(),
        );
        let o = trellis_within(
            &["target", "--config", &cfg, "--state-dir", &state],
            Duration::from_secs(30),
        );
        eprintln!("refused start: {}", stderr(&o).trim());
        o
    }

    impl Etcd {
        pub fn start() -> Option<Etcd> {
            found().then(|| Etcd::launch(tempfile::tempdir().unwrap(), false))
        }

        /// etcd serving https only to clients with a certificate of a
        /// throwaway CA made here (`pki`: ca.crt, client.crt, client.key).
        pub fn start_tls() -> Option<Etcd> {
            if !found() {
                return None;
            }
            let dir = tempfile::tempdir().unwrap();
            make_pki(dir.path());
            Some(Etcd::launch(dir, true))
        }

        pub fn pki(&self, name: &str) -> String {
            self._dir.path().join(name).display().to_string()
        }

        fn launch(dir: tempfile::TempDir, tls: bool) -> Etcd {
            let (c, p) = (free_port(), free_port());
            let scheme = if tls { "https" } else { "http" };
            let client = format!("{scheme}://127.0.0.1:{c}");
            let peer = format!("http://127.0.0.1:{p}");
            let mut cmd = Command::new("etcd");
            cmd.args(["--name", "t", "--data-dir"])
                .arg(dir.path().join("data"))
                .args([
                    "--listen-client-urls",
                    &client,
                    "--advertise-client-urls",
                    &client,
                ])
                .args([
                    "--listen-peer-urls",
                    &peer,
                    "--initial-advertise-peer-urls",
                    &peer,
                ])
                .args(["--initial-cluster", &format!("t={peer}")]);
            if tls {
                let f = |n: &str| dir.path().join(n);
                cmd.arg("--cert-file")
                    .arg(f("server.crt"))
                    .arg("--key-file")
                    .arg(f("server.key"))
                    .arg("--trusted-ca-file")
                    .arg(f("ca.crt"))
                    .arg("--client-cert-auth");
            }
            let child = cmd
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.path().join("etcd.log")).unwrap())
                .spawn()
                .unwrap();
            let e = Etcd {
                child,
                endpoint: format!("127.0.0.1:{c}"),
                _dir: dir,
            };
            let t0 = Instant::now();
            while std::net::TcpStream::connect(&e.endpoint).is_err() {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "etcd did not listen"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            e
        }

        /// One call to etcd's JSON gateway (plain http), as `token`'s user.
        fn gw(&self, path: &str, body: Value, token: Option<&str>) -> Value {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(10)))
                .build()
                .into();
            let mut r = agent.post(format!("http://{}{path}", self.endpoint));
            if let Some(t) = token {
                r = r.header("Authorization", t);
            }
            let mut resp = r.send(body.to_string()).unwrap();
            let ok = resp.status().is_success();
            let v: Value =
                serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
            assert!(ok, "{path}: {v}");
            v
        }

        /// etcd auth on: root (etcd wants it, with the root role, first),
        /// and `user` whose role may read and write /trellis/ha/ only.
        pub fn enable_auth(&self, user: &str, password: &str) {
            use serde_json::json;
            let gw = |p: &str, b: Value| self.gw(p, b, None);
            gw(
                "/v3/auth/user/add",
                json!({"name": "root", "password": "root-pw"}),
            );
            gw("/v3/auth/role/add", json!({"name": "root"}));
            gw(
                "/v3/auth/user/grant",
                json!({"user": "root", "role": "root"}),
            );
            gw("/v3/auth/role/add", json!({"name": "trellis-ha"}));
            // Keys base64: "/trellis/ha/" up to (not including) "/trellis/ha0".
            let perm = json!({"permType": "READWRITE", "key": "L3RyZWxsaXMvaGEv", "range_end": "L3RyZWxsaXMvaGEw"});
            gw(
                "/v3/auth/role/grant",
                json!({"name": "trellis-ha", "perm": perm}),
            );
            gw(
                "/v3/auth/user/add",
                json!({"name": user, "password": password}),
            );
            gw(
                "/v3/auth/user/grant",
                json!({"user": user, "role": "trellis-ha"}),
            );
            gw("/v3/auth/enable", json!({}));
        }

        pub fn ha(&self) -> String {
            format!("store = \"etcd\"\nendpoints = [\"{}\"]", self.endpoint)
        }

        pub fn signal(&self, sig: &str) {
            let s = Command::new("kill")
                .args([sig, &self.child.id().to_string()])
                .status()
                .unwrap();
            assert!(s.success());
        }
    }

    impl Drop for Etcd {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    #[test]
    fn etcd_kill9_of_the_owner_gives_the_standby_the_lease_within_the_ttl() {
        let Some(e) = Etcd::start() else { return };
        let d = tempfile::tempdir().unwrap();
        // Default timing: TTL 5 s, keepalive 1 s. The lease ends 4-5 s after
        // the kill (the last keepalive was up to 1 s before it); the watch
        // hands it over at once.
        let took = kill_owner_under_load(d.path(), &e.ha(), Duration::from_secs(9));
        assert!(
            took > Duration::from_secs(3),
            "not before the lease could expire: {took:?}"
        );
        // TTL + 3 s: the watch, one transaction, and this test's polling
        // over ctl on a loaded CI machine (measured 4.9-5.5 s).
        assert!(took < Duration::from_secs(8), "{took:?}");
    }

    /// Issue 37: the owner admits a write and sends its R2T, then freezes
    /// (SIGSTOP) past the lease TTL; the standby takes over and the host
    /// writes NEW data through it, acknowledged; the held data is sent to
    /// the frozen owner, which is then thawed. Its reactor must not apply
    /// the write: the fence at execution reads a fresh clock past the serve
    /// deadline, whatever the ANA byte said when the process froze.
    #[test]
    fn etcd_a_frozen_owner_thawed_after_failover_never_lands_its_held_write() {
        let Some(e) = Etcd::start() else { return };
        let d = tempfile::tempdir().unwrap();
        let (a, b) = pair(d.path(), &e.ha());
        let (_admin_a, mut qa) = raw_host(a.t.addr);
        let held = hold_a_write(&mut qa);
        let pid = a.t.child.id().to_string();
        let kill = |sig: &str| {
            let s = Command::new("kill").args([sig, &pid]).status().unwrap();
            assert!(s.success(), "kill {sig}");
        };
        kill("-STOP");
        let took = b.wait_role("owner", Duration::from_secs(15));
        eprintln!("owner frozen: standby owner after {took:?}");
        let (mut qs, new) = write_new_through(&b);
        qa.send_h2c(held.1, held.0, &[0x5A; 4096], 0, 4096); // the kernel holds it
        kill("-CONT");
        held_write_refused_and_new_kept(&mut qa, &mut qs[1], &new);
        a.wait_role("standby", Duration::from_secs(10));
    }

    #[test]
    fn etcd_owner_fences_itself_when_its_keepalives_go_unconfirmed() {
        let Some(e) = Etcd::start() else { return };
        let d = tempfile::tempdir().unwrap();
        let (a, b) = pair(d.path(), &e.ha());
        // etcd stops answering (SIGSTOP): no keepalive is confirmed.
        e.signal("-STOP");
        let took = a.wait_role("standby", Duration::from_secs(6));
        assert!(a.ana_states().iter().all(|s| s == "inaccessible"));
        assert_eq!(
            b.role(),
            "standby",
            "nobody serves while the store is silent"
        );
        // fence_ms (3.5 s) after the last confirmed keepalive, which was up to
        // keepalive_ms (1 s) before the stop.
        assert!(
            took >= Duration::from_millis(2400),
            "fenced too early: {took:?}"
        );
        assert!(took <= Duration::from_millis(3700), "fenced late: {took:?}");
        let ev = a.ha()["events"].to_string();
        assert!(ev.contains("fenced: no keepalive confirmed"), "{ev}");
        eprintln!("fenced {took:?} after etcd stopped");
        e.signal("-CONT");
        // Then exactly one node serves again.
        let t = Instant::now();
        while a.role() != "owner" && b.role() != "owner" {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{} {}",
                a.ha(),
                b.ha()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_ne!(a.role(), b.role());
    }

    /// Issue 37 item 4 with etcd: the reservations live under the lease's
    /// key, written only while the key names the writer.
    #[test]
    fn etcd_reservations_survive_a_drain_and_a_kill9_failover() {
        let Some(e) = Etcd::start() else { return };
        let d = tempfile::tempdir().unwrap();
        reservations_survive_drain_and_failover(d.path(), &e.ha());
    }

    /// Drains `a` (the owner): `b` takes the lease (revoke, watch, grant and
    /// txn all went through the store's security).
    fn drain_to_b(a: &Node, b: &Node) {
        let o = a.ctl(&["drain"]);
        assert!(o.status.success(), "drain: {}", stderr(&o));
        b.wait_role("owner", Duration::from_secs(10));
        assert_eq!(a.role(), "standby");
    }

    /// Issue 32: anyone who reached etcd could revoke or take the lease.
    /// With etcd's auth on, a node with the user's password holds the lease;
    /// one without credentials, with a wrong password or with a password
    /// file others may read does not start, and says why.
    #[test]
    fn etcd_auth_the_right_password_holds_the_lease_a_wrong_or_none_is_refused() {
        let Some(e) = Etcd::start() else { return };
        e.enable_auth("trellis", "pw-of-trellis");
        let d = tempfile::tempdir().unwrap();
        let auth = |f: &Path| {
            format!(
                "{}\netcd_user = \"trellis\"\netcd_password_file = \"{}\"",
                e.ha(),
                f.display()
            )
        };
        let o = refused_start(d.path(), &e.ha());
        assert_refused(
            &o,
            &[
                "set [ha] etcd_user and etcd_password_file",
                "etcd refused: etcdserver: user name is empty",
            ],
        );
        let wrong = d.path().join("wrong.pw");
        write_private(&wrong, "not-the-password\n");
        let o = refused_start(d.path(), &auth(&wrong));
        assert_refused(
            &o,
            &[
                "etcd_user \"trellis\": authentication",
                "authentication failed",
            ],
        );
        assert!(!stderr(&o).contains("not-the-password"), "{}", stderr(&o));
        let open = d.path().join("open.pw");
        std::fs::write(&open, "pw-of-trellis\n").unwrap(); // 0644 by the umask
        let o = refused_start(d.path(), &auth(&open));
        assert_refused(&o, &["etcd_password_file", "chmod 600"]);
        let pw = d.path().join("etcd.pw");
        write_private(&pw, "pw-of-trellis\n");
        let (a, b) = pair(d.path(), &auth(&pw));
        drain_to_b(&a, &b);
    }

    /// etcd with `--client-cert-auth` on https: a node with the CA and a
    /// client certificate holds the lease; one with the CA alone is refused.
    #[test]
    fn etcd_tls_with_a_client_certificate_holds_the_lease_and_without_is_refused() {
        let Some(e) = Etcd::start_tls() else { return };
        let d = tempfile::tempdir().unwrap();
        let ca_only = format!(
            "store = \"etcd\"\nendpoints = [\"https://{}\"]\netcd_ca_file = \"{}\"",
            e.endpoint,
            e.pki("ca.crt")
        );
        let o = refused_start(d.path(), &ca_only);
        assert_refused(&o, &["cannot use it", "https://"]);
        let tls = format!(
            "{ca_only}\netcd_cert_file = \"{}\"\netcd_key_file = \"{}\"",
            e.pki("client.crt"),
            e.pki("client.key")
        );
        let (a, b) = pair(d.path(), &tls);
        drain_to_b(&a, &b);
    }

    /// A first endpoint nobody listens on is passed over, at start and after.
    #[test]
    fn etcd_a_dead_first_endpoint_is_passed_over() {
        let Some(e) = Etcd::start() else { return };
        let d = tempfile::tempdir().unwrap();
        let dead = format!("127.0.0.1:{}", free_port());
        let ha = format!(
            "store = \"etcd\"\nendpoints = [\"{dead}\", \"{}\"]",
            e.endpoint
        );
        let (a, b) = pair(d.path(), &ha);
        drain_to_b(&a, &b);
    }

    #[test]
    fn etcd_drain_and_failback_lose_nothing() {
        let Some(e) = Etcd::start() else { return };
        let d = tempfile::tempdir().unwrap();
        drain_and_failback(d.path(), &e.ha());
    }
}
