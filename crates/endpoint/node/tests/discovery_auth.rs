//! Finding (issue 32, "Trust part 1"): the discovery controller never
//! asked for DH-HMAC-CHAP, so a peer claiming a keyed host's NQN on a
//! plain discovery connection read the discovery log entries that NQN may
//! use. With `target.discovery_dhchap = true` such a Connect gets ATR and
//! nothing but authentication runs until the peer proves the secret; by
//! default discovery stays unauthenticated, as in Linux's nvmet (so `nvme
//! discover` with a keyed host NQN and no secret keeps working). Raw peers
//! on loopback only.

mod common;
use common::*;
use std::net::SocketAddr;
use trellis_node::config::SubsystemConfig;
use trellis_node::config::{BackendKind, Config, HostConfig as TargetHost, NamespaceConfig};
use trellis_nvme::auth::{AuthCmd, CONNECT_AUTHREQ_ATR};
use trellis_nvme::dhchap::{HashId, Secret};
use trellis_nvme::dhchap_host::{HostAuth, HostFailure};
use trellis_nvme::fabrics::{CNTLID_DYNAMIC, DISCOVERY_NQN};
use trellis_nvme::log::{self, lid, DiscoveryEntry};
use trellis_nvme::pdu::Digests;
use trellis_nvme::status::specific;
use trellis_nvme::Status;

/// The keyed host whose NQN the peer claims.
const KEYED: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000d";
const AL: usize = 4096;

fn secret(fill: u8) -> Secret {
    Secret {
        key: vec![fill; 32],
        transform: Some(HashId::Sha256),
    }
}

/// Subsystem `NQN` with `KEYED` (secret 1) and `HOST` (no key) allowed.
fn config(discovery_dhchap: bool) -> Config {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 16 << 20));
    cfg.target.discovery_dhchap = discovery_dhchap;
    cfg.subsystems[0].hosts = vec![TargetHost {
        nqn: KEYED.into(),
        dhchap_secret: Some(secret(1).format().into()),
        ..Default::default()
    }];
    cfg
}

/// A raw admin Connect to the discovery controller as `hostnqn`: the
/// queue, and whether the completion asked for authentication (ATR).
fn disc_connect(addr: SocketAddr, hostnqn: &str) -> (Queue, bool) {
    let mut q = Queue::open(addr, Digests::default());
    let c = q.fabrics_connect(0, 31, DISCOVERY_NQN, hostnqn, CNTLID_DYNAMIC, 0);
    assert!(c.status.is_success(), "connect: {:?}", c.status);
    (q, c.dw0 & CONNECT_AUTHREQ_ATR != 0)
}

fn auth_send(q: &mut Queue, m: &[u8]) -> Status {
    let s = AuthCmd::dhchap_sqe(true, 0, m.len() as u32);
    q.cmd(s, m, 0, 8192).0.status
}

fn auth_recv(q: &mut Queue) -> Vec<u8> {
    let (c, d) = q.cmd(AuthCmd::dhchap_sqe(false, 0, AL as u32), &[], AL, 0);
    assert!(c.status.is_success(), "receive: {:?}", c.status);
    d
}

/// One DH-HMAC-CHAP transaction with the discovery controller as
/// `hostnqn` with `s`: Ok once Success1 checks out, else why it failed.
fn authenticate(q: &mut Queue, hostnqn: &str, s: Secret) -> Result<(), HostFailure> {
    let mut h = HostAuth::new(s, None, hostnqn, DISCOVERY_NQN);
    h.t_id = 0;
    let mut n = 0u8;
    let mut rng = |b: &mut [u8]| {
        for x in b {
            n = n.wrapping_add(37);
            *x = n;
        }
    };
    assert!(auth_send(q, &h.negotiate()).is_success());
    let reply = h.reply(&auth_recv(q), &mut rng)?;
    assert!(auth_send(q, &reply).is_success());
    h.success1(&auth_recv(q)).map(|_| ())
}

/// Get Log Page (discovery log): its status, and the subsystems listed.
fn disc_log(q: &mut Queue) -> (Status, Vec<String>) {
    let (c, page) = get_log(q, lid::DISCOVERY, 0, 8192);
    if !c.status.is_success() {
        return (c.status, Vec::new());
    }
    let (_, n, _) = log::decode_discovery_header(&page);
    let subs = (0..n as usize)
        .filter_map(|i| page.get(1024 * (i + 1)..))
        .map(|e| DiscoveryEntry::decode(e).subnqn)
        .collect();
    (c.status, subs)
}

/// The log, as served: enable the controller (CC.EN), read the log, and
/// it must list `nqn`.
fn log_lists(q: &mut Queue, nqn: &str) {
    assert!(q.prop_set(0x14, 1).status.is_success(), "CC.EN");
    let (st, subs) = disc_log(q);
    assert!(st.is_success(), "the log is served: {st:?}");
    assert!(subs.iter().any(|s| s == nqn), "{subs:?}");
}

fn log_lists_nqn(q: &mut Queue) {
    log_lists(q, NQN)
}

#[test]
fn with_discovery_dhchap_a_keyed_nqn_must_authenticate_before_the_log() {
    let t = trellis_node::Target::start(&config(true)).unwrap();
    let addr = t.local_addrs[0];
    // The claimant without the secret: ATR, and the log is refused.
    let (mut q, atr) = disc_connect(addr, KEYED);
    assert!(atr, "ATR in the discovery Connect completion");
    assert_eq!(disc_log(&mut q).0, specific::AUTH_REQUIRED.dnr());
    assert_eq!(
        q.prop_set(0x14, 1).status,
        specific::AUTH_REQUIRED.dnr(),
        "Property Set (CC.EN) is refused too"
    );
    // A wrong secret fails the transaction; the log stays refused.
    let e = authenticate(&mut q, KEYED, secret(9)).expect_err("wrong secret");
    assert!(matches!(e, HostFailure::Controller(_)), "{e:?}");
    assert_eq!(disc_log(&mut q).0, specific::AUTH_REQUIRED.dnr());
    // The right secret, on a new connection: the log is served.
    let (mut q, atr) = disc_connect(addr, KEYED);
    assert!(atr);
    authenticate(&mut q, KEYED, secret(1)).expect("the right secret");
    log_lists_nqn(&mut q);
    // A host without a key: no ATR, the log at once.
    let (mut q, atr) = disc_connect(addr, HOST);
    assert!(!atr, "no ATR for a host without a key");
    log_lists_nqn(&mut q);
    t.stop().unwrap();
}

/// The default, pinned: discovery is never authenticated (nvmet's
/// `nvmet_setup_auth` skips discovery controllers), whoever connects.
#[test]
fn by_default_discovery_asks_no_host_to_authenticate() {
    let t = trellis_node::Target::start(&config(false)).unwrap();
    for host in [KEYED, HOST] {
        let (mut q, atr) = disc_connect(t.local_addrs[0], host);
        assert!(!atr, "{host}: no ATR by default");
        log_lists_nqn(&mut q);
    }
    t.stop().unwrap();
}

/// A subsystem `nqn` whose only host is `host` with secret `fill`.
fn keyed_subsystem(nqn: &str, serial: &str, host: &str, fill: u8) -> SubsystemConfig {
    SubsystemConfig {
        nqn: nqn.into(),
        serial: serial.into(),
        model: "Trellis test".into(),
        allow_any_host: Some(false),
        allowed_hosts: vec![],
        hosts: vec![TargetHost {
            nqn: host.into(),
            dhchap_secret: Some(secret(fill).format().into()),
            ..Default::default()
        }],
        namespaces: vec![NamespaceConfig::sized(BackendKind::Ram, 1 << 20)],
        listeners: None,
    }
}

/// Keys come from the subsystems live at Connect: one added while the
/// target runs makes its keyed host authenticate discovery, and one that
/// would give a host a second secret is refused as the config would be.
#[test]
fn a_subsystem_added_live_counts_for_discovery_keys() {
    const NEW: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000e";
    const TWO: &str = "nqn.2026-11.io.trellis:two";
    let t = trellis_node::Target::start(&config(true)).unwrap();
    let addr = t.local_addrs[0];
    assert!(!disc_connect(addr, NEW).1, "no key anywhere yet");
    t.reg
        .add_subsystem(keyed_subsystem(TWO, "TEST2", NEW, 2))
        .unwrap();
    let (mut q, atr) = disc_connect(addr, NEW);
    assert!(atr, "keyed by the live-added subsystem");
    assert_eq!(disc_log(&mut q).0, specific::AUTH_REQUIRED.dnr());
    authenticate(&mut q, NEW, secret(2)).expect("its secret");
    log_lists(&mut q, TWO);
    let three = keyed_subsystem("nqn.2026-11.io.trellis:three", "TEST3", KEYED, 3);
    let e = format!("{:#}", t.reg.add_subsystem(three).unwrap_err());
    assert!(e.contains(KEYED) && e.contains("discovery_dhchap"), "{e}");
    t.stop().unwrap();
}
