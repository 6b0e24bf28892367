//! NVMe/TCP TLS 1.3 with a PSK over real sockets: the host library against
//! the target with both cipher suites, both socket engines, both identity
//! formats and both derivations; required and optional listeners; wrong
//! keys and identities refused; discovery advertising TREQ and TSAS.

mod common;
use common::*;
use std::time::{Duration, Instant};
use trellis_host::engine::Xfer;
use trellis_host::{HostConfig, HostTls};
use trellis_node::config::{
    BackendKind, HostConfig as TargetHost, ListenerConfig, NamespaceConfig, SecureChannel,
    SocketEngine,
};
use trellis_nvme::log;
use trellis_nvme::sqe::io;
use trellis_nvme::tls_psk::{ConfiguredPsk, Derivation, PskHash};
use trellis_nvme::Sqe;

fn key(fill: u8, hash: PskHash) -> ConfiguredPsk {
    ConfiguredPsk {
        key: vec![fill; hash.len_bytes()],
        transform: Some(hash),
    }
}

/// A host allowed without a key (`allowed_hosts`): plain TCP is its channel.
const PLAIN_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000aa";

/// A target with one listener of `secure` whose subsystem gives `HOST`
/// the PSK `k` (derived per `d`) and allows `PLAIN_HOST` without a key.
fn start(
    secure: Option<SecureChannel>,
    k: &ConfiguredPsk,
    d: Derivation,
    engine: SocketEngine,
) -> trellis_node::Target {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 16 << 20));
    cfg.target.socket_engine = engine;
    cfg.listeners = vec![ListenerConfig {
        name: None,
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: None,
        ana_state: None,
        secure_channel: secure,
    }];
    let s = &mut cfg.subsystems[0];
    s.allowed_hosts = vec![PLAIN_HOST.into()];
    s.hosts = vec![TargetHost {
        nqn: HOST.into(),
        tls_key: Some(k.format().into()),
        tls_key_derivation: Some(d.name().into()),
        ..Default::default()
    }];
    // HOST has only a TLS PSK, so by default only TLS listeners carry the
    // subsystem: PLAIN_HOST's plain listener is named explicitly.
    cfg.listeners[0].name = Some("l".into());
    s.listeners = Some(vec!["l".into()]);
    trellis_node::Target::start(&cfg).unwrap()
}

fn host(tls: Option<HostTls>) -> HostConfig {
    HostConfig {
        hostnqn: HOST.into(),
        kato_ms: 0,
        connect_timeout: Duration::from_secs(3),
        tls,
        ..Default::default()
    }
}

fn tls(k: &ConfiguredPsk, version: u8, d: Derivation) -> Option<HostTls> {
    Some(HostTls {
        key: k.clone(),
        identity_version: version,
        derivation: d,
        suites: None,
    })
}

/// 16 writes of 64 KiB in flight at once, then 16 reads of them, compared:
/// records of many PDUs, R2T/H2CData and C2HData over TLS.
fn io_round_trip(c: &mut trellis_host::Controller) {
    c.set_num_queues(1).unwrap();
    let mut q = c.connect_io_queue(32, 64 << 10).unwrap();
    let blocks = (64 << 10) / 512;
    for dir in [io::WRITE, io::READ] {
        let mut slots = Vec::new();
        for i in 0..16u32 {
            let s = q.alloc().unwrap();
            if dir == io::WRITE {
                q.buf_mut(s)[..64 << 10].fill(i as u8 ^ 0xA5);
            }
            let sqe = Sqe::rw(dir, 0, 1, (i * blocks) as u64, blocks, false);
            let x = if dir == io::WRITE {
                Xfer::ToCtrl(64 << 10)
            } else {
                Xfer::FromCtrl(64 << 10)
            };
            q.submit(s, sqe, x, Instant::now()).unwrap();
            slots.push((s, i));
        }
        let mut done = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while done < 16 {
            q.poll(Instant::now()).unwrap();
            while let Some(cpl) = q.next_completion() {
                assert!(cpl.status.is_success(), "{:?}", cpl.status);
                if dir == io::READ {
                    let i = slots.iter().find(|x| x.0 == cpl.slot).unwrap().1;
                    assert!(
                        q.buf(cpl.slot)[..64 << 10]
                            .iter()
                            .all(|&b| b == i as u8 ^ 0xA5),
                        "read back what was written"
                    );
                }
                q.free(cpl.slot);
                done += 1;
            }
            assert!(Instant::now() < deadline, "I/O over TLS timed out");
        }
    }
    // A 4 KiB read at once, small records.
    let mut out = vec![0u8; 4096];
    q.exec_ok(
        Sqe::rw(io::READ, 0, 1, 0, 8, false),
        Xfer::FromCtrl(4096),
        &[],
        &mut out,
    )
    .unwrap();
    assert!(out.iter().all(|&b| b == 0xA5));
}

#[test]
fn both_suites_both_engines_both_identity_versions_carry_io() {
    for engine in [SocketEngine::Epoll, SocketEngine::Uring] {
        for hash in [PskHash::Sha256, PskHash::Sha384] {
            let k = key(7, hash);
            let t = start(Some(SecureChannel::Required), &k, Derivation::Spec, engine);
            let addr = t.local_addrs[0].to_string();
            for version in [0, 1] {
                let cfg = host(tls(&k, version, Derivation::Spec));
                let mut c = trellis_host::Controller::connect(&addr, NQN, &cfg)
                    .unwrap_or_else(|e| panic!("{engine:?} {hash:?} v{version}: {e}"));
                io_round_trip(&mut c);
                c.shutdown().unwrap();
            }
            t.stop().unwrap();
        }
    }
}

#[test]
fn a_required_listener_refuses_plain_and_an_optional_one_takes_both() {
    // Both channels on an optional listener, each for the host it fits: TLS
    // for the host that has a PSK, plain TCP for the host allowed without a
    // key. The PSK host over plain TCP is refused: its NQN alone proves
    // nothing (docs/security.md, "Who may connect").
    let k = key(3, PskHash::Sha256);
    let t = start(
        Some(SecureChannel::Required),
        &k,
        Derivation::Spec,
        SocketEngine::Epoll,
    );
    let addr = t.local_addrs[0].to_string();
    let e = match trellis_host::Controller::connect(&addr, NQN, &host(None)) {
        Ok(_) => panic!("plain connect to a required listener succeeded"),
        Err(e) => e.to_string(),
    };
    assert!(!e.is_empty());
    t.stop().unwrap();
    for engine in [SocketEngine::Epoll, SocketEngine::Uring] {
        let t = start(Some(SecureChannel::Optional), &k, Derivation::Spec, engine);
        let addr = t.local_addrs[0].to_string();
        let plain = HostConfig {
            hostnqn: PLAIN_HOST.into(),
            ..host(None)
        };
        let mut c = trellis_host::Controller::connect(&addr, NQN, &plain).unwrap();
        io_round_trip(&mut c);
        c.shutdown().unwrap();
        let e = match trellis_host::Controller::connect(&addr, NQN, &host(None)) {
            Ok(_) => panic!("the PSK host connected over plain TCP"),
            Err(e) => format!("{e:#}"),
        };
        assert!(e.to_lowercase().contains("host"), "{e}");
        let cfg = host(tls(&k, 0, Derivation::Spec));
        let mut c = trellis_host::Controller::connect(&addr, NQN, &cfg).unwrap();
        io_round_trip(&mut c);
        c.shutdown().unwrap();
        t.stop().unwrap();
    }
}

#[test]
fn a_plain_listener_closes_a_tls_client() {
    let k = key(3, PskHash::Sha256);
    let t = start(None, &k, Derivation::Spec, SocketEngine::Epoll);
    let addr = t.local_addrs[0].to_string();
    let cfg = host(tls(&k, 0, Derivation::Spec));
    assert!(trellis_host::Controller::connect(&addr, NQN, &cfg).is_err());
    t.stop().unwrap();
}

#[test]
fn wrong_keys_identities_and_derivations_are_refused() {
    let k = key(3, PskHash::Sha384);
    let t = start(
        Some(SecureChannel::Required),
        &k,
        Derivation::Spec,
        SocketEngine::Epoll,
    );
    let addr = t.local_addrs[0].to_string();
    let refused =
        |cfg: HostConfig, sub: &str| match trellis_host::Controller::connect(&addr, sub, &cfg) {
            Ok(_) => panic!("connected"),
            Err(e) => e.to_string(),
        };
    // Another key under the same identity: the PSK binder does not verify.
    let e = refused(
        host(tls(&key(4, PskHash::Sha384), 0, Derivation::Spec)),
        NQN,
    );
    assert!(e.contains("TLS"), "{e}");
    // The right key derived the other way (libnvme before its 2025 fix).
    let e = refused(host(tls(&k, 0, Derivation::LibnvmeCompat)), NQN);
    assert!(e.contains("TLS"), "{e}");
    // A version-1 identity whose digest is another key's.
    let e = refused(
        host(tls(&key(4, PskHash::Sha384), 1, Derivation::Spec)),
        NQN,
    );
    assert!(e.contains("TLS"), "{e}");
    // A host with no key here, and a subsystem that does not exist.
    let mut other = host(tls(&k, 0, Derivation::Spec));
    other.hostnqn = "nqn.2014-08.org.example:other".into();
    let e = refused(other, NQN);
    assert!(e.contains("TLS"), "{e}");
    let e = refused(
        host(tls(&k, 0, Derivation::Spec)),
        "nqn.2026-11.io.trellis:none",
    );
    assert!(e.contains("TLS"), "{e}");
    // And the right one still works.
    let cfg = host(tls(&k, 0, Derivation::Spec));
    trellis_host::Controller::connect(&addr, NQN, &cfg)
        .unwrap()
        .shutdown()
        .unwrap();
    t.stop().unwrap();
}

#[test]
fn the_libnvme_compat_derivation_works_when_configured() {
    let k = key(5, PskHash::Sha256);
    let t = start(
        Some(SecureChannel::Required),
        &k,
        Derivation::LibnvmeCompat,
        SocketEngine::Epoll,
    );
    let addr = t.local_addrs[0].to_string();
    let cfg = host(tls(&k, 0, Derivation::LibnvmeCompat));
    let mut c = trellis_host::Controller::connect(&addr, NQN, &cfg).unwrap();
    io_round_trip(&mut c);
    c.shutdown().unwrap();
    assert!(
        trellis_host::Controller::connect(&addr, NQN, &host(tls(&k, 0, Derivation::Spec))).is_err()
    );
    t.stop().unwrap();
}

#[test]
fn discovery_over_tls_advertises_treq_and_tsas() {
    let k = key(6, PskHash::Sha256);
    for (secure, treq) in [
        (SecureChannel::Required, log::treq::REQUIRED),
        (SecureChannel::Optional, log::treq::NOT_REQUIRED),
    ] {
        let t = start(Some(secure), &k, Derivation::Spec, SocketEngine::Epoll);
        let addr = t.local_addrs[0].to_string();
        // The discovery NQN in the identity: the host's first tls_key.
        let entries = trellis_host::discover(&addr, &host(tls(&k, 0, Derivation::Spec))).unwrap();
        assert!(!entries.is_empty());
        for e in &entries {
            assert_eq!(e.sectype, log::sectype::TLS13, "{e:?}");
            assert_eq!(e.treq & 3, treq, "{e:?}");
        }
        assert!(entries.iter().any(|e| e.subnqn == NQN));
        t.stop().unwrap();
    }
    let t = start(None, &k, Derivation::Spec, SocketEngine::Epoll);
    let addr = t.local_addrs[0].to_string();
    let entries = trellis_host::discover(&addr, &host(None)).unwrap();
    for e in &entries {
        assert_eq!(e.sectype, log::sectype::NONE);
        assert_eq!(e.treq & 3, log::treq::NOT_REQUIRED);
    }
    t.stop().unwrap();
}

#[test]
fn a_silent_client_is_closed_at_the_handshake_timeout() {
    use std::io::Read;
    let k = key(6, PskHash::Sha256);
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.target.tls_handshake_timeout_ms = 300;
    cfg.listeners[0].secure_channel = Some(SecureChannel::Optional);
    cfg.subsystems[0].hosts = vec![TargetHost {
        nqn: HOST.into(),
        tls_key: Some(k.format().into()),
        ..Default::default()
    }];
    let t = trellis_node::Target::start(&cfg).unwrap();
    // Half a TLS record header, then nothing.
    let mut s = std::net::TcpStream::connect(t.local_addrs[0]).unwrap();
    std::io::Write::write_all(&mut s, &[0x16, 0x03]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t0 = Instant::now();
    let mut b = [0u8; 64];
    let n = loop {
        match s.read(&mut b) {
            Ok(0) => break 0,
            Ok(_) => continue,
            Err(e) => panic!("not closed: {e}"),
        }
    };
    assert_eq!(n, 0);
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    t.stop().unwrap();
}

/// A refused handshake ends with the target's alert reaching the host, on
/// both socket engines: the connection closes only once its last ciphertext
/// is out (io_uring used to close before its queued send reached the kernel).
#[test]
fn a_refused_host_gets_the_target_s_alert_on_both_engines() {
    let k = key(3, PskHash::Sha256);
    for engine in [SocketEngine::Epoll, SocketEngine::Uring] {
        let t = start(Some(SecureChannel::Required), &k, Derivation::Spec, engine);
        let addr = t.local_addrs[0].to_string();
        let cfg = host(tls(&key(4, PskHash::Sha256), 0, Derivation::Spec));
        let e = match trellis_host::Controller::connect(&addr, NQN, &cfg) {
            Ok(_) => panic!("{engine:?}: connected with a wrong key"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("alert"), "{engine:?}: {e}");
        t.stop().unwrap();
    }
}
