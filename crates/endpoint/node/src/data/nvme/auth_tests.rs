//! The target's DH-HMAC-CHAP state machine against the host side of
//! `trellis_nvme::dhchap_host`, message by message, without sockets.

use super::*;
use trellis_nvme::dhchap::Secret;
use trellis_nvme::dhchap_host::{HostAuth, HostFailure};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0e0c1d7b-0000-4000-8000-000000000001";
const SUB: &str = "nqn.2026-11.io.trellis:auth";
const AL: usize = 4096;

/// A deterministic generator (xorshift), seeded per test.
fn rng(seed: u64) -> impl FnMut(&mut [u8]) {
    let mut s = seed | 1;
    move |buf: &mut [u8]| {
        for b in buf {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *b = s as u8;
        }
    }
}

fn secret(fill: u8, transform: Option<HashId>) -> Secret {
    Secret {
        key: vec![fill; 32],
        transform,
    }
}

/// A session whose host may use every DH group (the default set leaves
/// out ffdhe6144 and ffdhe8192).
fn target(ctrl: Option<Secret>) -> Session {
    let mut keys = HostKeys::new(secret(1, Some(HashId::Sha256)), ctrl);
    keys.dhgroups = vec![
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
        DhGroup::Null,
    ];
    Session::new(Arc::new(keys), HOST, SUB)
}

fn host(s: Secret, ctrl: Option<Secret>) -> HostAuth {
    HostAuth::new(s, ctrl, HOST, SUB)
}

/// Runs a whole transaction; the host's failure, if any.
fn run(t: &mut Session, h: &mut HostAuth, seed: u64) -> Result<(), HostFailure> {
    let mut r = rng(seed);
    t.send(&h.negotiate()).unwrap();
    let reply = h.reply(&t.receive(AL, &mut r).unwrap(), &mut r)?;
    t.send(&reply).unwrap();
    match h.success1(&t.receive(AL, &mut r).unwrap()) {
        Ok(Some(s2)) => t.send(&s2).unwrap(),
        Ok(None) => {}
        Err(e @ HostFailure::Host(_)) => {
            t.send(&h.failure2(e)).unwrap();
            return Err(e);
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

#[test]
fn unidirectional_null_group() {
    let mut t = target(None);
    let mut h = host(secret(1, Some(HashId::Sha256)), None);
    h.dhgroups = vec![DhGroup::Null];
    assert!(!t.authenticated());
    run(&mut t, &mut h, 1).unwrap();
    assert!(t.authenticated());
}

#[test]
fn every_hash_and_group_bidirectional() {
    for hash in HashId::ALL {
        for group in DhGroup::ALL {
            let mut t = target(Some(secret(2, None)));
            let mut h = host(secret(1, Some(HashId::Sha256)), Some(secret(2, None)));
            h.hashes = vec![hash];
            h.dhgroups = vec![group];
            run(&mut t, &mut h, hash as u64 * 10 + group as u64).unwrap();
            assert!(t.authenticated(), "{hash:?} {group:?}");
        }
    }
}

#[test]
fn the_challenge_follows_the_target_preference_and_pads_to_al() {
    let mut t = target(None);
    let h = host(secret(1, Some(HashId::Sha256)), None);
    t.send(&h.negotiate()).unwrap();
    let b = t.receive(AL, &mut rng(3)).unwrap();
    assert_eq!(b.len(), AL);
    let Ok(Message::Challenge(c)) = Message::decode(&b) else {
        panic!("no challenge");
    };
    assert_eq!((c.hash_id, c.dh_id), (1, DhGroup::Ffdhe2048 as u8));
    assert_eq!((c.c1.len(), c.dhv.len()), (32, 256));
    assert_ne!(c.seqnum, 0);
}

#[test]
fn wrong_host_secret_gets_failure1_and_ends_the_transaction() {
    let mut t = target(None);
    let mut h = host(secret(9, Some(HashId::Sha256)), None);
    assert_eq!(
        run(&mut t, &mut h, 4),
        Err(HostFailure::Controller(failure::FAILED))
    );
    assert!(!t.authenticated());
    assert!(t.failed());
    // One failure to log (the handler rate-limits it), taken once.
    let n = t.take_note().expect("the failure is noted for the log");
    assert_eq!(n.what, "authentication failed: wrong response");
    assert_eq!(n.explanation, failure::FAILED);
    assert_eq!(t.take_note(), None);
    // Nothing more: not even a new Negotiate.
    assert_eq!(
        t.send(&h.negotiate()),
        Err(generic::COMMAND_SEQUENCE_ERROR.dnr())
    );
}

#[test]
fn a_transform_mismatch_is_a_wrong_secret() {
    // Same key bytes, but the host transforms with SHA-384.
    let mut t = target(None);
    let mut h = host(secret(1, Some(HashId::Sha384)), None);
    assert_eq!(
        run(&mut t, &mut h, 5),
        Err(HostFailure::Controller(failure::FAILED))
    );
}

#[test]
fn wrong_controller_secret_is_caught_by_the_host() {
    let mut t = target(Some(secret(2, None)));
    let mut h = host(secret(1, Some(HashId::Sha256)), Some(secret(3, None)));
    assert_eq!(
        run(&mut t, &mut h, 6),
        Err(HostFailure::Host(failure::FAILED))
    );
    // The host's Failure2 leaves the queue unauthenticated.
    assert!(!t.authenticated());
    let n = t
        .take_note()
        .expect("the host's failure is noted for the log");
    assert_eq!(n.what, "host reported authentication failure");
}

#[test]
fn bidirectional_without_a_controller_key_fails() {
    let mut t = target(None);
    let mut h = host(secret(1, Some(HashId::Sha256)), Some(secret(2, None)));
    assert_eq!(
        run(&mut t, &mut h, 7),
        Err(HostFailure::Controller(failure::FAILED))
    );
    assert!(!t.authenticated());
}

#[test]
fn no_common_hash_or_group() {
    let keys = HostKeys {
        hashes: vec![HashId::Sha512],
        dhgroups: vec![DhGroup::Ffdhe4096],
        ..HostKeys::new(secret(1, Some(HashId::Sha256)), None)
    };
    let mut t = Session::new(Arc::new(keys.clone()), HOST, SUB);
    let mut h = host(secret(1, Some(HashId::Sha256)), None);
    h.hashes = vec![HashId::Sha256];
    assert_eq!(
        run(&mut t, &mut h, 8),
        Err(HostFailure::Controller(failure::HASH_UNUSABLE))
    );
    let mut t = Session::new(Arc::new(keys), HOST, SUB);
    let mut h = host(secret(1, Some(HashId::Sha256)), None);
    h.dhgroups = vec![DhGroup::Null];
    assert_eq!(
        run(&mut t, &mut h, 9),
        Err(HostFailure::Controller(failure::DHGROUP_UNUSABLE))
    );
}

fn failure1_of(t: &mut Session) -> u8 {
    match Message::decode(&t.receive(AL, &mut rng(1)).unwrap()) {
        Ok(Message::Failure1(f)) => f.explanation,
        m => panic!("expected Failure1, got {m:?}"),
    }
}

#[test]
fn out_of_order_and_malformed_messages() {
    // A Reply before any Negotiate.
    let mut t = target(None);
    let reply = Message::Reply(Reply {
        t_id: 1,
        response: vec![0; 32],
        c2: None,
        seqnum: 0,
        dhv: vec![],
    });
    t.send(&reply.encode()).unwrap();
    assert_eq!(failure1_of(&mut t), failure::INCORRECT_MESSAGE);
    // Garbage.
    let mut t = target(None);
    t.send(&[1, 9, 3, 4, 5, 6, 7, 8]).unwrap();
    assert_eq!(failure1_of(&mut t), failure::INCORRECT_MESSAGE);
    // A truncated Negotiate.
    let mut t = target(None);
    let h = host(secret(1, Some(HashId::Sha256)), None);
    t.send(&h.negotiate()[..40]).unwrap();
    assert_eq!(failure1_of(&mut t), failure::INCORRECT_PAYLOAD);
    // Secure channel concatenation is not offered.
    let mut t = target(None);
    let mut n = h.negotiate();
    n[6] = 1;
    t.send(&n).unwrap();
    assert_eq!(failure1_of(&mut t), failure::CONCAT_MISMATCH);
}

#[test]
fn reply_with_another_transaction_id_or_dh_value() {
    for tweak in 0..3 {
        let mut t = target(None);
        let mut h = host(secret(1, Some(HashId::Sha256)), None);
        let mut r = rng(11);
        t.send(&h.negotiate()).unwrap();
        let mut reply = h.reply(&t.receive(AL, &mut r).unwrap(), &mut r).unwrap();
        match tweak {
            // T_ID
            0 => reply[4] ^= 1,
            // DHVLEN 0 in a DH group
            1 => reply[10..12].fill(0),
            // DH value 1: not in the group
            _ => {
                let n = reply.len();
                reply[n - 256..].fill(0);
                reply[n - 1] = 1;
            }
        }
        t.send(&reply).unwrap();
        let want = [
            failure::INCORRECT_PAYLOAD,
            failure::INCORRECT_PAYLOAD,
            failure::DHGROUP_UNUSABLE,
        ];
        assert_eq!(failure1_of(&mut t), want[tweak]);
        assert!(!t.authenticated());
    }
}

#[test]
fn reauthentication_keeps_the_queue_usable() {
    let mut t = target(Some(secret(2, None)));
    let mut h = host(secret(1, Some(HashId::Sha256)), Some(secret(2, None)));
    run(&mut t, &mut h, 12).unwrap();
    h.t_id = 2;
    t.send(&h.negotiate()).unwrap();
    assert!(
        t.authenticated(),
        "still authenticated while re-authenticating"
    );
    let mut r = rng(13);
    let reply = h.reply(&t.receive(AL, &mut r).unwrap(), &mut r).unwrap();
    t.send(&reply).unwrap();
    let s2 = h
        .success1(&t.receive(AL, &mut r).unwrap())
        .unwrap()
        .unwrap();
    t.send(&s2).unwrap();
    assert!(t.authenticated());
}

#[test]
fn a_receive_buffer_too_small_for_the_message() {
    let mut t = target(None);
    let h = host(secret(1, Some(HashId::Sha256)), None);
    t.send(&h.negotiate()).unwrap();
    assert_eq!(
        t.receive(64, &mut rng(1)),
        Err(generic::INVALID_FIELD.dnr())
    );
    assert!(t.failed());
}

#[test]
fn the_targets_order_wins_over_the_hosts() {
    let keys = HostKeys {
        dhgroups: vec![DhGroup::Ffdhe3072, DhGroup::Ffdhe2048],
        ..HostKeys::new(secret(1, Some(HashId::Sha256)), None)
    };
    let mut t = Session::new(Arc::new(keys), HOST, SUB);
    let mut h = host(secret(1, Some(HashId::Sha256)), None);
    h.dhgroups = vec![DhGroup::Ffdhe8192, DhGroup::Ffdhe2048, DhGroup::Ffdhe3072];
    t.send(&h.negotiate()).unwrap();
    let Ok(Message::Challenge(c)) = Message::decode(&t.receive(AL, &mut rng(2)).unwrap()) else {
        panic!("no challenge");
    };
    assert_eq!(c.dh_id, DhGroup::Ffdhe3072 as u8);
}

#[test]
fn the_default_groups_leave_out_the_two_largest() {
    let keys = HostKeys::new(secret(1, Some(HashId::Sha256)), None);
    assert!(!keys.dhgroups.contains(&DhGroup::Ffdhe6144));
    assert!(!keys.dhgroups.contains(&DhGroup::Ffdhe8192));
    let mut t = Session::new(Arc::new(keys), HOST, SUB);
    let mut h = host(secret(1, Some(HashId::Sha256)), None);
    h.dhgroups = vec![DhGroup::Ffdhe8192, DhGroup::Ffdhe6144];
    assert_eq!(
        run(&mut t, &mut h, 20),
        Err(HostFailure::Controller(failure::DHGROUP_UNUSABLE))
    );
}

/// Both exponentiations come out as work for the DH workers; while one is
/// computed the session takes no other message and no other Receive, and
/// the Reply counts only once its check has run.
#[test]
fn the_exponentiations_are_handed_out_and_nothing_runs_meanwhile() {
    let mut t = target(None);
    let mut h = host(secret(1, Some(HashId::Sha256)), None);
    let mut r = rng(21);
    let busy = generic::COMMAND_SEQUENCE_ERROR.dnr();
    t.send(&h.negotiate()).unwrap();
    assert!(t.take_started());
    assert!(!t.take_started(), "once per Negotiate");
    let Ok(Started::Work(w)) = t.start_receive(&mut r) else {
        panic!("no work for a DH group");
    };
    assert!(matches!(
        w,
        Work::Keygen {
            group: DhGroup::Ffdhe2048,
            ..
        }
    ));
    assert_eq!(t.send(&h.negotiate()), Err(busy));
    assert!(matches!(t.start_receive(&mut r), Err(s) if s == busy));
    let m = t.resume(w.run());
    let challenge = t.encode(m, AL).unwrap();
    let reply = h.reply(&challenge, &mut r).unwrap();
    t.send(&reply).unwrap();
    assert!(!t.authenticated(), "not before the reply is checked");
    let Ok(Started::Work(w)) = t.start_receive(&mut r) else {
        panic!("no work for the shared secret");
    };
    assert!(matches!(w, Work::Shared { .. }));
    let m = t.resume(w.run());
    let success1 = t.encode(m, AL).unwrap();
    assert_eq!(h.success1(&success1), Ok(None));
    assert!(t.authenticated());
    assert_eq!(t.transactions(), 1);
}

#[test]
fn a_refused_transaction_fails_without_work() {
    let mut t = target(None);
    let h = host(secret(1, Some(HashId::Sha256)), None);
    t.send(&h.negotiate()).unwrap();
    t.refuse(failure::FAILED);
    assert!(matches!(
        t.start_receive(&mut rng(1)),
        Ok(Started::Msg(Message::Failure1(f))) if f.explanation == failure::FAILED
    ));
    assert_eq!(
        t.send(&h.negotiate()),
        Err(generic::COMMAND_SEQUENCE_ERROR.dnr())
    );
}

#[test]
fn the_workers_lost_result_fails_the_transaction() {
    let mut t = target(None);
    let h = host(secret(1, Some(HashId::Sha256)), None);
    t.send(&h.negotiate()).unwrap();
    assert!(matches!(t.start_receive(&mut rng(1)), Ok(Started::Work(_))));
    assert!(matches!(
        t.resume(Output::Lost),
        Message::Failure1(f) if f.explanation == failure::FAILED
    ));
    assert!(t.failed());
}
