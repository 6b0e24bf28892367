//! In-band authentication (DH-HMAC-CHAP) over real sockets: the host
//! library against the target, and a raw initiator that tries to skip it.

mod common;
use common::*;
use trellis_node::config::{BackendKind, HostConfig as TargetHost, NamespaceConfig};
use trellis_nvme::dhchap::{HashId, Secret};
use trellis_nvme::fabrics::CNTLID_DYNAMIC;
use trellis_nvme::pdu::Digests;
use trellis_nvme::status::specific;

fn secret(fill: u8, transform: Option<HashId>) -> Secret {
    Secret {
        key: vec![fill; 48],
        transform,
    }
}

/// A target whose subsystem has `HOST`'s secret, the controller's secret
/// and a DH group order given by `groups` (empty: the default).
fn start_auth_target(groups: &[&str]) -> trellis_node::Target {
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 16 << 20));
    let s = &mut cfg.subsystems[0];
    s.allowed_hosts.clear();
    s.hosts = vec![TargetHost {
        nqn: HOST.into(),
        dhchap_secret: Some(secret(1, Some(HashId::Sha384)).format().into()),
        dhchap_ctrl_secret: Some(secret(2, None).format().into()),
        dhchap_hashes: vec![],
        dhchap_dhgroups: groups.iter().map(|g| g.to_string()).collect(),
        ..Default::default()
    }];
    trellis_node::Target::start(&cfg).unwrap()
}

fn host(s: Option<Secret>, ctrl: Option<Secret>) -> trellis_host::HostConfig {
    trellis_host::HostConfig {
        hostnqn: HOST.into(),
        kato_ms: 0,
        dhchap_secret: s,
        dhchap_ctrl_secret: ctrl,
        ..Default::default()
    }
}

#[test]
fn the_host_library_authenticates_every_queue() {
    for groups in [&["ffdhe3072"][..], &["null"][..]] {
        let t = start_auth_target(groups);
        let addr = t.local_addrs[0].to_string();
        for ctrl in [None, Some(secret(2, None))] {
            let cfg = host(Some(secret(1, Some(HashId::Sha384))), ctrl);
            let mut c = trellis_host::Controller::connect(&addr, NQN, &cfg).unwrap();
            assert!(
                c.identify_ns(1).is_ok(),
                "admin commands run once authenticated"
            );
            c.set_num_queues(2).unwrap();
            c.connect_io_queue(16, 4096).unwrap();
            c.connect_io_queue(16, 512).unwrap();
        }
        t.stop().unwrap();
    }
}

#[test]
fn wrong_or_missing_secrets_are_refused() {
    let t = start_auth_target(&[]);
    let addr = t.local_addrs[0].to_string();
    // Refusals are their own error kind, not a protocol violation.
    let err = |cfg| match trellis_host::Controller::connect(&addr, NQN, &cfg) {
        Ok(_) => panic!("connected"),
        Err(e @ trellis_host::Error::Auth(_)) => e.to_string(),
        Err(e) => panic!("not an authentication error: {e}"),
    };
    let e = err(host(Some(secret(9, Some(HashId::Sha384))), None));
    assert!(e.contains("the controller refused the host"), "{e}");
    let e = err(host(None, None));
    assert!(e.contains("requires in-band authentication"), "{e}");
    let e = err(host(
        Some(secret(1, Some(HashId::Sha384))),
        Some(secret(3, None)),
    ));
    assert!(e.contains("the host refused the controller"), "{e}");
    t.stop().unwrap();
}

#[test]
fn nothing_but_authentication_runs_before_it_succeeds() {
    let t = start_auth_target(&[]);
    let mut q = Queue::open(t.local_addrs[0], Digests::default());
    let c = q.fabrics_connect(0, 31, NQN, HOST, CNTLID_DYNAMIC, 0);
    assert!(c.status.is_success());
    assert_ne!(
        c.dw0 & trellis_nvme::auth::CONNECT_AUTHREQ_ATR,
        0,
        "ATR set"
    );
    // Property Get (a Fabrics command) and Identify are refused alike.
    let s = trellis_nvme::fabrics::PropertyCmd {
        size8: true,
        offset: 0,
        value: 0,
    }
    .to_sqe(0, false);
    let (c, _) = q.cmd(s, &[], 0, 0);
    assert_eq!(c.status, specific::AUTH_REQUIRED.dnr());
    let mut s = trellis_nvme::Sqe::new(trellis_nvme::sqe::admin::IDENTIFY, 0, 0);
    s.set_cdw(10, 1);
    let (c, _) = q.cmd(s, &[], 4096, 0);
    assert_eq!(c.status, specific::AUTH_REQUIRED.dnr());
    // A Receive with another security protocol is an invalid field.
    let mut s = trellis_nvme::auth::AuthCmd::dhchap_sqe(false, 0, 64);
    s.0[43] = 0xEA;
    let (c, _) = q.cmd(s, &[], 64, 0);
    assert_eq!(c.status, trellis_nvme::status::generic::INVALID_FIELD.dnr());
    t.stop().unwrap();
}
