//! Which listeners carry a subsystem (`[[subsystem]] listeners`, the nvmet
//! `ports/*/subsystems` model; docs/security.md "Who may connect"): each
//! test plays a raw NVMe/TCP peer against a real target on loopback and
//! asserts what a listener that does not carry a subsystem refuses and
//! hides. Each is bounded in time (the raw peer's socket timeouts) and
//! memory (one 1 MiB RAM namespace).

mod common;
use common::*;
use std::time::Duration;
use trellis_node::config::{
    BackendKind, HostConfig as TargetHost, ListenerConfig, NamespaceConfig, SecureChannel,
};
use trellis_nvme::fabrics::{ipo, CNTLID_DYNAMIC, DISCOVERY_NQN};
use trellis_nvme::log::{self, DiscoveryEntry};
use trellis_nvme::pdu::Digests;
use trellis_nvme::status::specific;
use trellis_nvme::tls_psk::{ConfiguredPsk, Derivation, PskHash};

const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002";

/// What nvmet answers a Connect for a subsystem its port does not carry:
/// Connect Invalid Parameters (DNR), IATTR 1 (Connect data), IPO 256
/// (SUBNQN's offset in the Connect data).
const NOT_CARRIED_DW0: u32 = (1 << 16) | ipo::DATA_SUBNQN as u32;

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
    let (cqe, page) = get_log(&mut c.admin, log::lid::DISCOVERY, 0, 8192);
    assert!(cqe.status.is_success(), "{:?}", cqe.status);
    let (_, numrec, _) = log::decode_discovery_header(&page);
    (0..numrec as usize)
        .map(|i| DiscoveryEntry::decode(&page[1024 + 1024 * i..]))
        .collect()
}

fn psk() -> ConfiguredPsk {
    ConfiguredPsk {
        key: vec![9; PskHash::Sha256.len_bytes()],
        transform: Some(PskHash::Sha256),
    }
}

/// Finding (high): every subsystem was carried by every I/O listener, so a
/// subsystem with a PSK-only host was reachable in plaintext by any other
/// host it admits. Now, by default (no `listeners`), a subsystem with a
/// host whose only credential is a TLS PSK is carried by the TLS listeners
/// only: another host's plaintext Connect over the plain port is refused as
/// nvmet refuses a subsystem its port does not carry, the discovery log
/// never lists it at the plain port, and over TLS it is listed on the secure listener
/// with TREQ "required". (On the code before bindings the plaintext Connect
/// succeeded and the log listed it at the plain port.)
#[test]
fn a_subsystem_with_a_psk_only_host_is_not_carried_by_a_plain_listener() {
    let k = psk();
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.listeners = vec![listener(None), listener(Some(SecureChannel::Required))];
    let s = &mut cfg.subsystems[0];
    s.allow_any_host = Some(true);
    s.allowed_hosts.clear();
    s.hosts = vec![TargetHost {
        nqn: HOST.into(),
        tls_key: Some(k.format().into()),
        ..Default::default()
    }];
    let t = trellis_node::Target::start(&cfg).unwrap();
    let (plain, secure) = (t.local_addrs[0], t.local_addrs[1]);

    let mut q = Queue::open(plain, Digests::default());
    let c = q.fabrics_connect(0, 31, NQN, OTHER, CNTLID_DYNAMIC, 0);
    assert_eq!(
        (c.status, c.dw0),
        (specific::CONNECT_INVALID_PARAMS.dnr(), NOT_CARRIED_DW0),
        "a plaintext Connect to a subsystem only TLS listeners carry"
    );

    // Listed only where it is carried: at the TLS port, TLS required.
    let entries = discovery_entries(plain, OTHER);
    let listed: Vec<_> = entries.iter().filter(|e| e.subnqn == NQN).collect();
    assert!(
        listed
            .iter()
            .all(|e| e.trsvcid == secure.port().to_string() && e.treq & 3 == log::treq::REQUIRED),
        "the discovery log lists a subsystem at a port that does not carry it: {entries:?}"
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
    let entries = trellis_host::discover(&secure.to_string(), &host).unwrap();
    let mine: Vec<_> = entries.iter().filter(|e| e.subnqn == NQN).collect();
    assert_eq!(mine.len(), 1, "{entries:?}");
    assert_eq!(mine[0].trsvcid, secure.port().to_string());
    assert_eq!(mine[0].treq & 3, log::treq::REQUIRED);
    let c = trellis_host::Controller::connect(&secure.to_string(), NQN, &host).unwrap();
    c.shutdown().unwrap();
    t.stop().unwrap();
}

/// Two named plain listeners, subsystem `NQN` bound to "a" only.
fn two_listeners_a_carries() -> trellis_node::Target {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.listeners = vec![listener(None), listener(None)];
    cfg.listeners[0].name = Some("a".into());
    cfg.listeners[1].name = Some("b".into());
    cfg.subsystems[0].listeners = Some(vec!["a".into()]);
    trellis_node::Target::start(&cfg).unwrap()
}

/// A subsystem bound to listener A is not reachable through listener B:
/// neither an admin Connect nor an I/O queue of a controller made on A,
/// and B's discovery log lists it only at A's port.
#[test]
fn a_subsystem_bound_to_listener_a_is_not_reachable_through_b() {
    let t = two_listeners_a_carries();
    let (a, b) = (t.local_addrs[0], t.local_addrs[1]);
    let mut q = Queue::open(b, Digests::default());
    let c = q.fabrics_connect(0, 31, NQN, HOST, CNTLID_DYNAMIC, 0);
    assert_eq!(
        (c.status, c.dw0),
        (specific::CONNECT_INVALID_PARAMS.dnr(), NOT_CARRIED_DW0),
        "an admin Connect through B"
    );
    let ctrl = controller(a, NQN, 1, Digests::default(), 0);
    let mut q = Queue::open(b, Digests::default());
    let c = q.fabrics_connect(2, 127, NQN, HOST, ctrl.cntlid, 0);
    assert_eq!(
        (c.status, c.dw0),
        (specific::CONNECT_INVALID_PARAMS.dnr(), NOT_CARRIED_DW0),
        "an I/O queue Connect through B for A's controller"
    );
    let entries = discovery_entries(b, HOST);
    let mine: Vec<_> = entries.iter().filter(|e| e.subnqn == NQN).collect();
    assert_eq!(mine.len(), 1, "{entries:?}");
    assert_eq!(mine[0].trsvcid, a.port().to_string());
    t.stop().unwrap();
}

/// Back-compatibility: a config without keys and without `listeners`
/// serves its subsystem on every I/O listener, plain and TLS-optional.
#[test]
fn a_keyless_config_is_served_on_every_listener() {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.listeners = vec![
        listener(None),
        listener(None),
        listener(Some(SecureChannel::Optional)),
    ];
    let t = trellis_node::Target::start(&cfg).unwrap();
    for &addr in &t.local_addrs {
        let mut c = controller(addr, NQN, 1, Digests::default(), 0);
        let (cqe, _) = read(&mut c.io[0], 0, 1);
        assert!(
            cqe.status.is_success(),
            "read through {addr}: {:?}",
            cqe.status
        );
    }
    let entries = discovery_entries(t.local_addrs[0], HOST);
    let ports: Vec<_> = entries
        .iter()
        .filter(|e| e.subnqn == NQN)
        .map(|e| e.trsvcid.clone())
        .collect();
    let want: Vec<_> = t.local_addrs.iter().map(|a| a.port().to_string()).collect();
    assert_eq!(ports, want);
    t.stop().unwrap();
}

/// `--check` and start refuse a binding that names no listener, and one
/// that puts a subsystem whose hosts all have only a TLS PSK on plain
/// listeners only, each naming the value.
#[test]
fn unknown_listeners_and_psk_only_subsystems_on_plain_ports_are_refused() {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.listeners[0].name = Some("a".into());
    cfg.subsystems[0].listeners = Some(vec!["nope".into()]);
    let e = cfg.validate().unwrap_err().to_string();
    assert!(
        e.contains("\"nope\"") && e.contains("names no [[listener]]"),
        "{e}"
    );
    cfg.subsystems[0].listeners = Some(vec!["a".into()]);
    assert!(cfg.validate().is_ok());
    let s = &mut cfg.subsystems[0];
    s.allowed_hosts.clear();
    s.hosts = vec![TargetHost {
        nqn: HOST.into(),
        tls_key: Some(psk().format().into()),
        ..Default::default()
    }];
    let e = cfg.validate().unwrap_err().to_string();
    assert!(
        e.contains("only a TLS PSK") && e.contains("secure_channel"),
        "{e}"
    );
    cfg.subsystems[0].listeners = None;
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("by default only TLS listeners"), "{e}");
    cfg.listeners[0].secure_channel = Some(SecureChannel::Required);
    assert!(cfg.validate().is_ok());
}
