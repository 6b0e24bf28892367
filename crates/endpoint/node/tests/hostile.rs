//! The hostile-peer suite (docs/security.md): each test plays an attacker
//! against a real target on loopback with a raw NVMe/TCP peer
//! (`trellis_testkit::initiator::Queue`, which sends whatever PDUs it is
//! told), and asserts the guarantee the finding broke. Each is bounded in
//! time and memory.

mod common;
use common::*;
use std::time::Duration;
use trellis_node::config::{
    BackendKind, HostConfig as TargetHost, ListenerConfig, NamespaceConfig, SecureChannel,
};
use trellis_nvme::fabrics::{CNTLID_DYNAMIC, DISCOVERY_NQN};
use trellis_nvme::log::{self, DiscoveryEntry};
use trellis_nvme::pdu::Digests;
use trellis_nvme::status::specific;
use trellis_nvme::tls_psk::{ConfiguredPsk, Derivation, PskHash};

fn listener(secure: Option<SecureChannel>) -> ListenerConfig {
    ListenerConfig {
        name: None,
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: None,
        ana_state: None,
        secure_channel: secure,
    }
}

/// The discovery log a controller of `hostnqn` reads through `addr`.
fn discovery_entries(addr: std::net::SocketAddr, hostnqn: &str) -> Vec<DiscoveryEntry> {
    let mut c = controller_as(addr, DISCOVERY_NQN, hostnqn, 0, Digests::default(), 0);
    let (cqe, page) = get_log(&mut c.admin, log::lid::DISCOVERY, 0, 4096);
    assert!(cqe.status.is_success(), "{:?}", cqe.status);
    let (_, numrec, _) = log::decode_discovery_header(&page);
    (0..numrec as usize)
        .map(|i| DiscoveryEntry::decode(&page[1024 + 1024 * i..]))
        .collect()
}

/// Finding (high): a host known only by a TLS PSK could be impersonated
/// over plain TCP. With a plain and a required listener, a plaintext
/// Connect claiming the PSK host's NQN is refused, its discovery log over
/// the plain port lists nothing of that subsystem, and the host with its
/// key still connects over TLS (so the refusal is about the channel, not a
/// broken configuration).
#[test]
fn a_psk_only_host_is_not_reachable_in_plaintext() {
    let k = ConfiguredPsk {
        key: vec![9; PskHash::Sha256.len_bytes()],
        transform: Some(PskHash::Sha256),
    };
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.listeners = vec![listener(None), listener(Some(SecureChannel::Required))];
    cfg.listeners[0].name = Some("plain".into());
    cfg.listeners[1].name = Some("tls".into());
    let s = &mut cfg.subsystems[0];
    // Both listeners carry it (the default would keep it off the plain
    // one, `ports.rs`): the host check itself must refuse the claim.
    s.listeners = Some(vec!["plain".into(), "tls".into()]);
    s.allowed_hosts.clear();
    s.hosts = vec![TargetHost {
        nqn: HOST.into(),
        tls_key: Some(k.format().into()),
        ..Default::default()
    }];
    let t = trellis_node::Target::start(&cfg).unwrap();
    let (plain, secure) = (t.local_addrs[0], t.local_addrs[1]);

    let mut q = Queue::open(plain, Digests::default());
    let c = q.fabrics_connect(0, 31, NQN, HOST, CNTLID_DYNAMIC, 0);
    assert_eq!(
        c.status,
        specific::CONNECT_INVALID_HOST.dnr(),
        "a plaintext Connect claiming the PSK host: {:?}",
        c.status
    );

    let entries = discovery_entries(plain, HOST);
    assert!(
        entries.iter().all(|e| e.subnqn != NQN),
        "the plain discovery log lists the PSK host's subsystem: {entries:?}"
    );

    let host = trellis_host::HostConfig {
        hostnqn: HOST.into(),
        kato_ms: 0,
        connect_timeout: Duration::from_secs(3),
        tls: Some(trellis_host::HostTls {
            key: k,
            identity_version: 0,
            derivation: Derivation::Spec,
            suites: None,
        }),
        ..Default::default()
    };
    let c = trellis_host::Controller::connect(&secure.to_string(), NQN, &host).unwrap();
    c.shutdown().unwrap();
    // Over TLS the host sees its subsystem, on the secure listener only.
    let entries = trellis_host::discover(&secure.to_string(), &host).unwrap();
    let mine: Vec<_> = entries.iter().filter(|e| e.subnqn == NQN).collect();
    assert_eq!(mine.len(), 1, "{entries:?}");
    assert_eq!(mine[0].trsvcid, secure.port().to_string());
    assert_eq!(mine[0].treq & 3, log::treq::REQUIRED);
    t.stop().unwrap();
}

/// Finding (high): any allowed peer could pin unbounded memory with writes
/// parked after R2T (each command's buffer was allocated at its capsule,
/// and nothing timed out a command waiting for data). Now, with the
/// default `target.transfer_pool` (256 MiB, of which one connection holds
/// at most an eighth), 100 parked 1 MiB writes on one connection get R2Ts
/// only for what its share holds, a host on another connection still
/// writes 1 MiB, and at `target.data_wait_timeout_ms` the parked
/// connection is closed and every pool byte comes back.
#[test]
fn writes_parked_after_r2t_are_bounded_by_the_pool_and_timed_out() {
    use std::io::Read;
    use trellis_nvme::pdu::{PduType, R2t};
    use trellis_nvme::{sqe::io, Sgl, Sqe};
    const MIB_BLOCKS: u32 = 2048; // 1 MiB of 512 B blocks: MDTS by default
    const WAIT_MS: u64 = 1_000;
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 16 << 20));
    cfg.target.data_wait_timeout_ms = WAIT_MS;
    let pool = cfg.target.transfer_pool.0;
    assert_eq!(pool, trellis_node::config::DEFAULT_TRANSFER_POOL);
    let share = pool / trellis_node::config::TRANSFER_POOL_SHARE_DIV;
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.local_addrs[0];

    let mut parked = controller(addr, NQN, 1, Digests::default(), 0);
    let q = &mut parked.io[0];
    for _ in 0..100 {
        let cid = q.next_cid();
        let mut s = Sqe::rw(io::WRITE, cid, 1, 0, MIB_BLOCKS, false);
        s.set_sgl(Sgl::transport(MIB_BLOCKS * 512));
        q.send_capsule(&s, &[]);
    }
    // R2Ts come for what the connection's share holds, and no more.
    q.s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut r2ts = 0u64;
    while let Some(p) = q.recv() {
        assert_eq!(p.ch.pdu_type, PduType::R2T as u8, "only R2Ts are due");
        assert_eq!(R2t::decode(&p.bytes).r2tl, MIB_BLOCKS * 512);
        r2ts += 1;
    }
    let held = t.reg.transfer_pool().used();
    eprintln!(
        "100 parked 1 MiB writes: {r2ts} R2Ts, {} MiB of the pool held (share {} MiB, pool {} MiB)",
        held >> 20,
        share >> 20,
        pool >> 20
    );
    assert_eq!(r2ts, share >> 20, "R2Ts beyond the connection's share");
    assert!(held <= share, "pool bytes held {held} > share {share}");

    // Another host's 1 MiB write goes through meanwhile.
    let mut other = controller(addr, NQN, 1, Digests::default(), 0);
    let data = pattern(4096, MIB_BLOCKS as usize, 7);
    assert!(write(&mut other.io[0], 4096, &data).status.is_success());

    // At the data-wait timeout the parked connection closes; the pool empties.
    q.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t0 = std::time::Instant::now();
    let mut b = [0u8; 4096];
    let closed = loop {
        match q.s.read(&mut b) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(e) => panic!("parked connection not closed: {e}"),
        }
    };
    assert!(closed && t0.elapsed() < Duration::from_millis(3 * WAIT_MS + 2_000));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while t.reg.transfer_pool().used() != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "pool bytes not returned: {}",
            t.reg.transfer_pool().used()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    t.stop().unwrap();
}

/// A TCP connection to `dst` from source address `src` (any of 127/8 on
/// loopback), so one test can be two peers.
/// Finding (medium): sockets that never send an ICReq held a connection
/// slot for the 10 s connect timeout, and past `max_connections` every new
/// connection was reset, legitimate hosts included. Now one address holds
/// at most its share (`target.max_connections_per_addr`, a quarter of
/// `max_connections` by default): with `max_connections` idle sockets
/// opened from 127.0.0.1, a host from 127.0.0.2 still connects and does
/// I/O; and the idle sockets are closed at `target.icreq_timeout_ms`.
#[test]
fn idle_sockets_from_one_address_do_not_lock_out_another_host() {
    use std::io::Read;
    const MAX: usize = 64;
    const ICREQ_MS: u64 = 1_000;
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.target.max_connections = MAX;
    cfg.target.icreq_timeout_ms = ICREQ_MS;
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.local_addrs[0];
    let attacker: std::net::Ipv4Addr = "127.0.0.1".parse().unwrap();
    let idle: Vec<_> = (0..MAX).map(|_| connect_from(attacker, addr)).collect();
    let share = cfg.target.connections_per_addr();
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while t.reg.peer_budget().open_from(attacker.into()) < share {
        assert!(
            std::time::Instant::now() < deadline,
            "the idle sockets were not accepted"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        t.reg.peer_budget().open_from(attacker.into()),
        share,
        "one address took more than its share"
    );

    let s = connect_from("127.0.0.2".parse().unwrap(), addr);
    let mut admin = Queue::open_stream(s, Digests::default());
    let c = admin.fabrics_connect(0, 31, NQN, HOST, CNTLID_DYNAMIC, 0);
    assert!(
        c.status.is_success(),
        "the host from another address: {:?}",
        c.status
    );
    assert!(admin.prop_set(0x14, 0x0046_0001).status.is_success());
    let mut io = Queue::open_stream(
        connect_from("127.0.0.2".parse().unwrap(), addr),
        Digests::default(),
    );
    assert!(io
        .fabrics_connect(1, 31, NQN, HOST, c.dw0 as u16, 0)
        .status
        .is_success());
    let data = pattern(0, 8, 3);
    assert!(write(&mut io, 0, &data).status.is_success());

    // The idle sockets the target took are closed once their ICReq is late.
    let t0 = std::time::Instant::now();
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("an idle socket was not closed: {other:?}"),
        }
    }
    assert!(
        t0.elapsed() < Duration::from_millis(ICREQ_MS + 3_000),
        "{:?}",
        t0.elapsed()
    );
    t.stop().unwrap();
}

/// Finding (low): host NQNs could carry control characters and ANSI
/// escapes, printed raw by `trellis ctl get controllers` and in log lines
/// (terminal and log injection). A Connect whose host NQN has a control
/// character is refused with Connect Invalid Parameters naming the host NQN
/// field, so no controller, log line or table ever holds it; the same host
/// without the escape connects.
#[test]
fn a_host_nqn_with_control_characters_is_refused_at_connect() {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.subsystems[0].allow_any_host = Some(true);
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.local_addrs[0];
    for bad in [
        "nqn.2014-08.org.nvmexpress:uuid:\u{1b}[2J\u{1b}[31mowned",
        "nqn.2014-08.org.nvmexpress:uuid:x\nWARN forged log line",
    ] {
        let mut q = Queue::open(addr, Digests::default());
        let c = q.fabrics_connect(0, 31, NQN, bad, CNTLID_DYNAMIC, 0);
        assert_eq!(
            c.status,
            specific::CONNECT_INVALID_PARAMS.dnr(),
            "{bad:?}: {:?}",
            c.status
        );
        assert_eq!(
            c.dw0,
            trellis_nvme::fabrics::invalid_param_dw0(
                true,
                trellis_nvme::fabrics::ipo::DATA_HOSTNQN
            ),
            "the refusal names the host NQN field"
        );
    }
    let made: usize = t
        .reg
        .subsystems()
        .iter()
        .map(|s| s.controllers.lock().unwrap().len())
        .sum();
    assert_eq!(made, 0, "a controller was created for a refused NQN");
    let mut q = Queue::open(addr, Digests::default());
    let c = q.fabrics_connect(0, 31, NQN, HOST, CNTLID_DYNAMIC, 0);
    assert!(c.status.is_success(), "{:?}", c.status);
    t.stop().unwrap();
}

/// Finding (medium): Set Features Volatile Write Cache with WCE = 0 was
/// accepted, reported back, and ignored: writes still completed from
/// caches, so a host that turned the cache off in order to skip flushes
/// lost acknowledged writes on power loss. Now every write (and Write
/// Zeroes) of that controller goes to the backend with Force Unit Access
/// while the cache is off, and not once it is back on.
#[test]
fn turning_the_write_cache_off_makes_every_write_force_unit_access() {
    use std::sync::atomic::Ordering::Relaxed;
    use trellis_nvme::sqe::admin;
    let d = tempfile::tempdir().unwrap();
    let mut ns = NamespaceConfig::sized(BackendKind::File, 1 << 20);
    ns.path = Some(d.path().join("disk.img").to_string_lossy().into_owned());
    let t = trellis_node::Target::start(&test_config(ns)).unwrap();
    let mut c = controller(t.local_addrs[0], NQN, 1, Digests::default(), 0);
    let through = || {
        let set = t.reg.ns().load();
        set.by_uid[0]
            .as_ref()
            .unwrap()
            .stats()
            .write_through
            .load(Relaxed)
    };
    let feature = |c: &mut Ctrl, wce: Option<u32>| {
        let op = if wce.is_some() {
            admin::SET_FEATURES
        } else {
            admin::GET_FEATURES
        };
        let mut s = trellis_nvme::Sqe::new(op, 0, 0);
        s.set_cdw(10, 0x06);
        s.set_cdw(11, wce.unwrap_or(0));
        let (cqe, _) = c.admin.cmd(s, &[], 0, 0);
        assert!(cqe.status.is_success(), "{:?}", cqe.status);
        cqe.dw0
    };
    assert_eq!(feature(&mut c, None) & 1, 1, "the cache starts on");
    assert!(write(&mut c.io[0], 0, &pattern(0, 8, 1))
        .status
        .is_success());
    assert_eq!(through(), 0, "with the cache on, writes may be cached");
    feature(&mut c, Some(0));
    assert_eq!(feature(&mut c, None) & 1, 0);
    for i in 0..3u64 {
        assert!(write(&mut c.io[0], 8 * i, &pattern(8 * i, 8, 2))
            .status
            .is_success());
    }
    assert_eq!(
        through(),
        3,
        "each write with the cache off went through with FUA"
    );
    feature(&mut c, Some(1));
    assert!(write(&mut c.io[0], 0, &pattern(0, 8, 3))
        .status
        .is_success());
    assert_eq!(through(), 3, "the cache is on again");
    t.stop().unwrap();
}

/// Finding (low): tenant ids were handed out per host NQN on every
/// Connect, even on subsystems without QoS, and never released, so
/// throw-away NQNs used them up and later hosts shared the catch-all
/// tenant, defeating isolation. Now a host takes an id only with its first
/// I/O to a QoS namespace, and gives it back when its controller goes.
#[test]
fn throw_away_host_nqns_do_not_use_up_the_qos_tenants() {
    use trellis_node::config::qos::QosMode;
    use trellis_node::data::qos::VIEW_LID;
    const PLAIN: &str = "nqn.2026-11.io.trellis:plain";
    let mut qos_ns = NamespaceConfig::sized(BackendKind::Ram, 1 << 20);
    qos_ns.qos = QosMode::Gimbal;
    let mut cfg = test_config(qos_ns);
    cfg.qos.limits.max_tenants = 4; // ids 0..=2, then the catch-all 3
    cfg.subsystems[0].allow_any_host = Some(true);
    let mut plain = cfg.subsystems[0].clone();
    plain.nqn = PLAIN.into();
    plain.serial = "TEST2".into();
    plain.namespaces = vec![NamespaceConfig::sized(BackendKind::Ram, 1 << 20)];
    cfg.subsystems.push(plain);
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.local_addrs[0];
    let catch_all = t.reg.tenants().catch_all();
    let host = |i: usize| format!("nqn.2014-08.org.nvmexpress:uuid:throwaway-{i}");
    let released = |why: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !t.reg.tenants().in_use().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "{why}: {:?}",
                t.reg.tenants().in_use()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    for i in 0..10 {
        let mut c = controller_as(addr, PLAIN, &host(i), 1, Digests::default(), 0);
        assert!(read(&mut c.io[0], 0, 1).0.status.is_success());
        assert!(
            t.reg.tenants().in_use().is_empty(),
            "a host of a subsystem without QoS took a tenant id"
        );
    }
    for i in 10..20 {
        let mut c = controller_as(addr, NQN, &host(i), 1, Digests::default(), 0);
        assert!(read(&mut c.io[0], 0, 1).0.status.is_success());
        let (cqe, page) = get_log(&mut c.admin, VIEW_LID, 0, 4096);
        assert!(cqe.status.is_success(), "{:?}", cqe.status);
        let me = trellis_nvme::le16(&page, 4);
        assert_eq!(
            me, 0,
            "host {i} got tenant {me} (catch-all {catch_all}), not the freed id 0"
        );
        drop(c);
        released(&format!("host {i}'s tenant after its controller went"));
    }
    t.stop().unwrap();
}

/// Finding (low): a reservation registrant was identified by the Connect
/// Host ID alone, not bound to the host NQN the controller was admitted
/// as, so a host admitted under its own NQN could claim the holder's Host
/// ID and write through a Write Exclusive reservation. Both raw peers here
/// send the same Host ID (the testkit's); only the NQNs differ.
#[test]
fn another_nqn_claiming_the_holders_host_id_cannot_write_through_its_reservation() {
    use trellis_nvme::resv::{self, AcquireAction, AcquireCmd, RType, RegisterAction, RegisterCmd};
    use trellis_nvme::sqe::{io, Sgl};
    use trellis_nvme::Sqe;
    const IMPOSTOR: &str = "nqn.2014-08.org.nvmexpress:uuid:impostor";
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.subsystems[0].allow_any_host = Some(true);
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.local_addrs[0];
    let mut holder = controller(addr, NQN, 1, Digests::default(), 0);
    let q = &mut holder.io[0];
    let mut reg = Sqe::new(io::RESV_REGISTER, 0, 1);
    RegisterCmd {
        action: RegisterAction::Register,
        iekey: false,
        cptpl: resv::Cptpl::NoChange,
    }
    .encode(&mut reg);
    reg.set_sgl(Sgl::in_capsule(16));
    assert!(q
        .cmd(reg, &resv::encode_keys(0, 5), 0, 4096)
        .0
        .status
        .is_success());
    let mut acq = Sqe::new(io::RESV_ACQUIRE, 0, 1);
    AcquireCmd {
        action: AcquireAction::Acquire,
        iekey: false,
        rtype: RType::WriteExclusive,
    }
    .encode(&mut acq);
    acq.set_sgl(Sgl::in_capsule(16));
    assert!(q
        .cmd(acq, &resv::encode_keys(5, 0), 0, 4096)
        .0
        .status
        .is_success());
    assert!(
        write(q, 0, &[0xAA; 512]).status.is_success(),
        "the holder writes"
    );

    let mut imp = controller_as(addr, NQN, IMPOSTOR, 1, Digests::default(), 0);
    let w = write(&mut imp.io[0], 0, &[0x66; 512]);
    assert_eq!(
        w.status,
        trellis_nvme::status::generic::RESERVATION_CONFLICT.dnr(),
        "the impostor's write: {:?}",
        w.status
    );
    let (r, data) = read(&mut holder.io[0], 0, 1);
    assert!(r.status.is_success());
    assert_eq!(data, vec![0xAA; 512], "the holder's data stays");
    t.stop().unwrap();
}

/// Reservation Register (`crkey` → `nrkey`) or Acquire (`action`, `rtype`,
/// CRKEY, PRKEY) on NSID 1 through `q`: the completion's status.
fn resv_register(q: &mut Queue, nrkey: u64) -> trellis_nvme::Status {
    use trellis_nvme::resv::{self, Cptpl, RegisterAction, RegisterCmd};
    use trellis_nvme::sqe::{io, Sgl};
    let mut reg = trellis_nvme::Sqe::new(io::RESV_REGISTER, 0, 1);
    RegisterCmd {
        action: RegisterAction::Register,
        iekey: false,
        cptpl: Cptpl::NoChange,
    }
    .encode(&mut reg);
    reg.set_sgl(Sgl::in_capsule(16));
    q.cmd(reg, &resv::encode_keys(0, nrkey), 0, 4096).0.status
}

fn resv_acquire(
    q: &mut Queue,
    action: trellis_nvme::resv::AcquireAction,
    crkey: u64,
    prkey: u64,
) -> trellis_nvme::Status {
    use trellis_nvme::resv::{self, AcquireCmd, RType};
    use trellis_nvme::sqe::{io, Sgl};
    let mut acq = trellis_nvme::Sqe::new(io::RESV_ACQUIRE, 0, 1);
    AcquireCmd {
        action,
        iekey: false,
        rtype: RType::WriteExclusive,
    }
    .encode(&mut acq);
    acq.set_sgl(Sgl::in_capsule(16));
    q.cmd(acq, &resv::encode_keys(crkey, prkey), 0, 4096)
        .0
        .status
}

/// Finding (high, the guide's "reservation takeover that lets the
/// preempted host's write land"): the reservation was checked once, when
/// the command was parsed. A holder's write admitted and sent R2T, its data
/// held back while another host took the reservation over with Preempt and
/// Abort and wrote new data, then landed over the new data with SUCCESS.
/// Now the check is made again when the command reaches the backend (and
/// when the scheduler releases it), so the held write fails with
/// Reservation Conflict and the new data stays. Both with QoS off and on.
#[test]
fn a_write_held_after_r2t_by_a_preempted_host_never_lands() {
    use trellis_node::config::qos::QosMode;
    use trellis_nvme::pdu::{PduType, R2t};
    use trellis_nvme::resv::AcquireAction;
    use trellis_nvme::sqe::{io, Sgl};
    const TAKER: &str = "nqn.2014-08.org.nvmexpress:uuid:taker";
    for qos in [QosMode::Off, QosMode::Gimbal] {
        let mut ns = NamespaceConfig::sized(BackendKind::Ram, 1 << 20);
        ns.qos = qos;
        let mut cfg = test_config(ns);
        cfg.subsystems[0].allow_any_host = Some(true);
        let t = trellis_node::Target::start(&cfg).unwrap();
        let addr = t.local_addrs[0];
        let mut a = controller(addr, NQN, 1, Digests::default(), 0);
        let qa = &mut a.io[0];
        assert!(resv_register(qa, 5).is_success());
        assert!(resv_acquire(qa, AcquireAction::Acquire, 5, 0).is_success());
        // A's write of STALE data is admitted; its data is held back.
        let cid = qa.next_cid();
        let mut w = trellis_nvme::Sqe::rw(io::WRITE, cid, 1, 0, 8, false);
        w.set_sgl(Sgl::transport(4096));
        qa.send_capsule(&w, &[]);
        let r2t = qa.recv().expect("an R2T");
        assert_eq!(r2t.ch.pdu_type, PduType::R2T as u8, "{qos:?}");
        let ttag = R2t::decode(&r2t.bytes).ttag;

        // B takes the reservation over and writes NEW data, acknowledged.
        let mut b = controller_as(addr, NQN, TAKER, 1, Digests::default(), 0);
        let qb = &mut b.io[0];
        assert!(resv_register(qb, 9).is_success());
        let st = resv_acquire(qb, AcquireAction::PreemptAndAbort, 9, 5);
        assert!(st.is_success(), "{qos:?} preempt and abort: {st:?}");
        let new = vec![0x4E; 4096];
        assert!(write(qb, 0, &new).status.is_success(), "{qos:?}");

        // A's held data arrives: refused, and the new data stays.
        qa.send_h2c(ttag, cid, &[0x5A; 4096], 0, 4096);
        let resp = qa.recv().expect("the held write's response");
        assert_eq!(resp.ch.pdu_type, PduType::CapsuleResp as u8);
        let cqe = trellis_nvme::Cqe::decode(&resp.bytes[8..24]);
        assert_eq!(
            cqe.status,
            trellis_nvme::status::generic::RESERVATION_CONFLICT.dnr(),
            "{qos:?}: the preempted host's held write completed {:?}",
            cqe.status
        );
        let (r, data) = read(qb, 0, 8);
        assert!(r.status.is_success());
        assert!(data == new, "{qos:?}: block 0 lost the new data");
        t.stop().unwrap();
    }
}

/// As above for Dataset Management, whose range list may come by R2T too:
/// its check at execution was only the HA fence, so a deallocate its host
/// sent before being preempted (Preempt and Abort), its ranges held back,
/// zeroed the new holder's data when they arrived. Now it fails with
/// Reservation Conflict and the data stays.
#[test]
fn a_deallocate_held_after_r2t_by_a_preempted_host_never_lands() {
    use trellis_nvme::pdu::{PduType, R2t};
    use trellis_nvme::resv::AcquireAction;
    use trellis_nvme::sqe::{io, Sgl};
    const TAKER: &str = "nqn.2014-08.org.nvmexpress:uuid:taker";
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.subsystems[0].allow_any_host = Some(true);
    let t = trellis_node::Target::start(&cfg).unwrap();
    let addr = t.local_addrs[0];
    let mut a = controller(addr, NQN, 1, Digests::default(), 0);
    let qa = &mut a.io[0];
    assert!(resv_register(qa, 5).is_success());
    assert!(resv_acquire(qa, AcquireAction::Acquire, 5, 0).is_success());
    // A's Deallocate of blocks 0..8 is admitted; its range is held back.
    let cid = qa.next_cid();
    let mut d = trellis_nvme::Sqe::new(io::DATASET_MANAGEMENT, cid, 1);
    d.set_cdw(10, 0); // one range
    d.set_cdw(11, 1 << 2); // AD: deallocate
    d.set_sgl(Sgl::transport(16));
    qa.send_capsule(&d, &[]);
    let r2t = qa.recv().expect("an R2T");
    assert_eq!(r2t.ch.pdu_type, PduType::R2T as u8);
    let ttag = R2t::decode(&r2t.bytes).ttag;

    let mut b = controller_as(addr, NQN, TAKER, 1, Digests::default(), 0);
    let qb = &mut b.io[0];
    assert!(resv_register(qb, 9).is_success());
    let st = resv_acquire(qb, AcquireAction::PreemptAndAbort, 9, 5);
    assert!(st.is_success(), "preempt and abort: {st:?}");
    let new = vec![0x4E; 4096];
    assert!(write(qb, 0, &new).status.is_success());

    // The range: context attributes, 8 blocks, SLBA 0.
    let mut range = [0u8; 16];
    range[4..8].copy_from_slice(&8u32.to_le_bytes());
    qa.send_h2c(ttag, cid, &range, 0, 16);
    let resp = qa.recv().expect("the held deallocate's response");
    assert_eq!(resp.ch.pdu_type, PduType::CapsuleResp as u8);
    let cqe = trellis_nvme::Cqe::decode(&resp.bytes[8..24]);
    assert_eq!(
        cqe.status,
        trellis_nvme::status::generic::RESERVATION_CONFLICT.dnr(),
        "the preempted host's held deallocate completed {:?}",
        cqe.status
    );
    let (r, data) = read(qb, 0, 8);
    assert!(r.status.is_success());
    assert!(data == new, "block 0 lost the new data");
    t.stop().unwrap();
}

/// Finding (medium): the backing file the target creates is sparse, and
/// nothing said so: a host saw a fully provisioned namespace, and a full
/// file system came as a surprise. Now Identify Namespace reports thin
/// provisioning (NSFEAT bit 0, THINP) with NUSE the blocks the file holds,
/// growing as hosts write (and the log says so when the file is created).
#[test]
fn a_thin_backing_file_says_so_in_identify() {
    use trellis_nvme::sqe::admin;
    let dir = tempfile::tempdir().unwrap();
    let mut ns = NamespaceConfig::sized(BackendKind::File, 64 << 20);
    ns.path = Some(dir.path().join("thin.img").to_str().unwrap().into());
    let t = trellis_node::Target::start(&test_config(ns)).unwrap();
    let mut c = controller(t.local_addrs[0], NQN, 1, Digests::default(), 0);
    let id_ns = |q: &mut Queue| {
        let mut s = trellis_nvme::Sqe::new(admin::IDENTIFY, 0, 1);
        s.set_cdw(10, 0); // CNS 00h: Identify Namespace
        let (cqe, d) = q.cmd(s, &[], 4096, 0);
        assert!(cqe.status.is_success(), "{:?}", cqe.status);
        (trellis_nvme::le64(&d, 0), trellis_nvme::le64(&d, 16), d[24])
    };
    let (nsze, nuse, nsfeat) = id_ns(&mut c.admin);
    assert_eq!(nsze, (64 << 20) / 512);
    assert_eq!(nsfeat & 1, 1, "THINP");
    assert!(nuse < 2048, "a fresh sparse file holds {nuse} blocks");
    assert!(write(&mut c.io[0], 0, &pattern(0, 2048, 1))
        .status
        .is_success());
    let (_, after, _) = id_ns(&mut c.admin);
    assert!(
        after >= nuse + 2048,
        "NUSE {nuse} -> {after} after 1 MiB written"
    );
    t.stop().unwrap();
}
