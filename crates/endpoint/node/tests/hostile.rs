//! The hostile-peer suite (docs/security.md): each test plays an attacker
//! against a real target on loopback with a raw NVMe/TCP peer
//! (`trellis_testkit::initiator::Queue`, which sends whatever PDUs it is
//! told), and asserts the guarantee the finding broke. Each is bounded in
//! time and memory.

mod common;
use common::*;
use std::time::Duration;
use trellis_nvme::fabrics::{CNTLID_DYNAMIC, DISCOVERY_NQN};
use trellis_nvme::log::{self, DiscoveryEntry};
use trellis_nvme::pdu::Digests;
use trellis_nvme::status::specific;
use trellis_nvme::tls_psk::{ConfiguredPsk, Derivation, PskHash};
use trellis_target::config::{
    BackendKind, HostConfig as TargetHost, ListenerConfig, NamespaceConfig, SecureChannel,
};

fn listener(secure: Option<SecureChannel>) -> ListenerConfig {
    ListenerConfig {
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
    let s = &mut cfg.subsystems[0];
    s.allowed_hosts.clear();
    s.hosts = vec![TargetHost {
        nqn: HOST.into(),
        tls_key: Some(k.format()),
        ..Default::default()
    }];
    let t = trellis_target::Target::start(&cfg).unwrap();
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
