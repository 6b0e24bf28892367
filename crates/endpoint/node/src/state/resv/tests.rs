//! The reservation state machine, without sockets.

use super::*;
use trellis_nvme::resv::{
    AcquireAction as AA, RType::*, RegisterAction as RA, ReleaseAction as RL,
};

const A: HostId = HostId::raw([0xA; 16], [0xA; 16]);
const B: HostId = HostId::raw([0xB; 16], [0xB; 16]);
const C: HostId = HostId::raw([0xC; 16], [0xC; 16]);

/// A host whose Host ID and NQN digest are both `b`s.
const fn host(b: u8) -> HostId {
    HostId::raw([b; 16], [b; 16])
}

fn reg(action: RA, iekey: bool, cptpl: Cptpl) -> RegisterCmd {
    RegisterCmd {
        action,
        iekey,
        cptpl,
    }
}
fn register(s: &mut State, h: &HostId, key: u64) -> Result<Notices, Status> {
    s.register(h, &reg(RA::Register, false, Cptpl::NoChange), 0, key, 128)
}
fn acq(action: AA, rtype: RType) -> AcquireCmd {
    AcquireCmd {
        action,
        iekey: false,
        rtype,
    }
}
fn rel(action: RL, rtype: u8) -> ReleaseCmd {
    ReleaseCmd {
        action,
        iekey: false,
        rtype,
    }
}
/// A holds a reservation of `t`; A (key 1) and B (key 2) are registered, C not.
fn held(t: RType) -> State {
    let mut s = State::default();
    register(&mut s, &A, 1).unwrap();
    register(&mut s, &B, 2).unwrap();
    s.acquire(&A, &acq(AA::Acquire, t), 1, 0).unwrap();
    s
}

#[test]
fn access_table_of_every_type() {
    // (type, [holder read, holder write, registrant read, registrant
    // write, other read, other write]) from the spec's table.
    let table = [
        (WriteExclusive, [true, true, true, false, true, false]),
        (ExclusiveAccess, [true, true, false, false, false, false]),
        (
            WriteExclusiveRegistrantsOnly,
            [true, true, true, true, true, false],
        ),
        (
            ExclusiveAccessRegistrantsOnly,
            [true, true, true, true, false, false],
        ),
        (
            WriteExclusiveAllRegistrants,
            [true, true, true, true, true, false],
        ),
        (
            ExclusiveAccessAllRegistrants,
            [true, true, true, true, false, false],
        ),
    ];
    for (t, want) in table {
        let s = held(t);
        let got = [
            s.allows(&A, false),
            s.allows(&A, true),
            s.allows(&B, false),
            s.allows(&B, true),
            s.allows(&C, false),
            s.allows(&C, true),
        ];
        assert_eq!(got, want, "{t:?}");
        assert_eq!(s.is_holder(&B), t.all_registrants(), "{t:?}");
    }
    // No reservation: everyone, registered or not, has access.
    let mut s = State::default();
    register(&mut s, &A, 1).unwrap();
    assert!(s.allows(&C, true) && s.allows(&A, true));
}

#[test]
fn register_keys_generation_and_iekey() {
    let mut s = State::default();
    register(&mut s, &A, 1).unwrap();
    assert_eq!(s.gen, 1);
    register(&mut s, &A, 1).expect("the same key again succeeds");
    assert_eq!(
        register(&mut s, &A, 9),
        Err(CONFLICT),
        "another key conflicts"
    );
    assert_eq!(s.gen, 2, "a failed command leaves the generation");
    let replace = reg(RA::Replace, false, Cptpl::NoChange);
    assert_eq!(
        s.register(&A, &replace, 7, 5, 128),
        Err(CONFLICT),
        "wrong CRKEY"
    );
    s.register(&A, &replace, 1, 5, 128).unwrap();
    assert_eq!(s.regs[0].rkey, 5);
    let replace_ie = reg(RA::Replace, true, Cptpl::NoChange);
    s.register(&A, &replace_ie, 999, 6, 128)
        .expect("IEKEY skips CRKEY");
    assert_eq!(s.regs[0].rkey, 6);
    assert_eq!(
        s.register(&B, &replace, 0, 1, 128),
        Err(CONFLICT),
        "B is no registrant"
    );
    let unreg = reg(RA::Unregister, false, Cptpl::NoChange);
    assert_eq!(s.register(&A, &unreg, 5, 0, 128), Err(CONFLICT));
    s.register(&A, &unreg, 6, 0, 128).unwrap();
    assert!(s.regs.is_empty());
    assert_eq!(s.gen, 5);
    // CPTPL changes PTPL on success only.
    let set = reg(RA::Register, false, Cptpl::Set);
    s.register(&B, &set, 0, 3, 128).unwrap();
    assert!(s.ptpl);
    let clear = reg(RA::Replace, false, Cptpl::Clear);
    assert_eq!(s.register(&B, &clear, 4, 3, 128), Err(CONFLICT));
    assert!(s.ptpl);
}

#[test]
fn registrants_are_bounded_and_all_reported() {
    let mut s = State::default();
    let max = 40;
    for i in 0..max {
        let h = host(i as u8 + 1);
        s.register(
            &h,
            &reg(RA::Register, false, Cptpl::NoChange),
            0,
            i as u64 + 100,
            max,
        )
        .unwrap();
    }
    let over = host(0xEE);
    let r = s.register(&over, &reg(RA::Register, false, Cptpl::NoChange), 0, 1, max);
    assert_eq!(r, Err(REGISTRANTS_FULL));
    // Re-registering an existing host with its key still works when full.
    s.register(
        &host(1),
        &reg(RA::Register, false, Cptpl::NoChange),
        0,
        100,
        max,
    )
    .unwrap();
    s.acquire(&host(3), &acq(AA::Acquire, WriteExclusive), 102, 0)
        .unwrap();
    let (h, regs) = s.report();
    assert_eq!((h.regctl, h.rtype, regs.len()), (40, 1, 40));
    assert_eq!(regs.iter().filter(|r| r.holds).count(), 1);
    assert!(regs[2].holds && regs[2].rkey == 102);
    // The Report of more than 16 registrants into a host buffer of any
    // size: no write past it.
    let mut buf = vec![0u8; 64 + 17 * 64 + 10];
    trellis_nvme::resv::encode_report_ext(&h, &regs, &mut buf);
    let (_, got) = trellis_nvme::resv::decode_report_ext(&buf).unwrap();
    assert_eq!(got.len(), 17);
}

#[test]
fn acquire_rules() {
    let mut s = State::default();
    register(&mut s, &A, 1).unwrap();
    register(&mut s, &B, 2).unwrap();
    let we = acq(AA::Acquire, WriteExclusive);
    assert_eq!(s.acquire(&C, &we, 0, 0), Err(CONFLICT), "not a registrant");
    assert_eq!(s.acquire(&A, &we, 2, 0), Err(CONFLICT), "wrong key");
    s.acquire(&A, &we, 1, 0).unwrap();
    s.acquire(&A, &we, 1, 0)
        .expect("the holder acquiring again");
    let ea = acq(AA::Acquire, ExclusiveAccess);
    assert_eq!(s.acquire(&A, &ea, 1, 0), Err(CONFLICT), "another type");
    assert_eq!(s.acquire(&B, &we, 2, 0), Err(CONFLICT), "held by A");
    assert_eq!(s.gen, 2, "Acquire leaves the generation");
    // All Registrants: any registrant acquiring the same type succeeds.
    let mut s = held(WriteExclusiveAllRegistrants);
    s.acquire(&B, &acq(AA::Acquire, WriteExclusiveAllRegistrants), 2, 0)
        .unwrap();
}

#[test]
fn preempt_takes_over_and_unregisters() {
    let mut s = held(WriteExclusive);
    register(&mut s, &C, 3).unwrap();
    let g = s.gen;
    let notes = s
        .acquire(&B, &acq(AA::Preempt, ExclusiveAccess), 2, 1)
        .unwrap();
    assert_eq!(
        s.held,
        Some(Held {
            rtype: ExclusiveAccess,
            holder: B
        })
    );
    assert!(!s.is_registered(&A), "the preempted holder is unregistered");
    assert!(s.is_registered(&C));
    // The type changed: the registrant left is told the old one was released.
    assert_eq!(
        notes,
        vec![
            (A, notice::REGISTRATION_PREEMPTED),
            (C, notice::RESERVATION_RELEASED)
        ]
    );
    assert_eq!(s.gen, g + 1);
    // PRKEY not the holder's: unregisters that registrant only.
    let notes = s
        .acquire(&B, &acq(AA::Preempt, ExclusiveAccess), 2, 3)
        .unwrap();
    assert_eq!(notes, vec![(C, notice::REGISTRATION_PREEMPTED)]);
    assert_eq!(s.held.unwrap().holder, B);
    // PRKEY naming nobody: a conflict, and nothing changes.
    let before = s.clone();
    assert_eq!(
        s.acquire(&B, &acq(AA::Preempt, ExclusiveAccess), 2, 77),
        Err(CONFLICT)
    );
    // PRKEY 0 with a single holder other than the holder's key: invalid.
    register(&mut s, &A, 1).unwrap();
    assert_eq!(
        s.acquire(&A, &acq(AA::Preempt, WriteExclusive), 1, 0),
        Err(INVALID_FIELD)
    );
    assert_eq!(s.regs.len(), before.regs.len() + 1);
    // Preempt and Abort changes the state as Preempt does; its wait for the
    // preempted hosts' commands is the I/O path's (`state::drain`, tested
    // in tests/faults.rs).
    s.acquire(&A, &acq(AA::PreemptAndAbort, WriteExclusive), 1, 2)
        .unwrap();
    assert_eq!(
        s.held,
        Some(Held {
            rtype: WriteExclusive,
            holder: A
        })
    );
    assert!(!s.is_registered(&B));
}

#[test]
fn preempt_of_all_registrants_with_zero_key_clears_the_others() {
    let mut s = held(ExclusiveAccessAllRegistrants);
    register(&mut s, &C, 3).unwrap();
    let notes = s
        .acquire(&C, &acq(AA::Preempt, WriteExclusive), 3, 0)
        .unwrap();
    assert_eq!(s.regs.len(), 1);
    assert_eq!(
        s.held,
        Some(Held {
            rtype: WriteExclusive,
            holder: C
        })
    );
    assert_eq!(notes.len(), 2);
    assert!(notes.iter().all(|n| n.1 == notice::REGISTRATION_PREEMPTED));
    // With no reservation, preempt only unregisters.
    let mut s = State::default();
    register(&mut s, &A, 1).unwrap();
    register(&mut s, &B, 2).unwrap();
    s.acquire(&A, &acq(AA::Preempt, WriteExclusive), 1, 2)
        .unwrap();
    assert_eq!((s.held, s.regs.len()), (None, 1));
}

#[test]
fn preempt_without_take_over_and_by_the_holder_itself() {
    // The holder preempting itself (PRKEY its own key) changes the type;
    // another host with that key is unregistered, as for any takeover.
    let mut s = held(WriteExclusive);
    register(&mut s, &C, 1).unwrap();
    let notes = s
        .acquire(&A, &acq(AA::Preempt, ExclusiveAccess), 1, 1)
        .unwrap();
    assert_eq!(
        s.held,
        Some(Held {
            rtype: ExclusiveAccess,
            holder: A
        })
    );
    assert_eq!(s.regs.len(), 2);
    assert_eq!(
        notes,
        vec![
            (C, notice::REGISTRATION_PREEMPTED),
            (B, notice::RESERVATION_RELEASED)
        ]
    );
    // The holder preempting another key only unregisters it.
    let notes = s
        .acquire(&A, &acq(AA::Preempt, ExclusiveAccess), 1, 2)
        .unwrap();
    assert_eq!(notes, vec![(B, notice::REGISTRATION_PREEMPTED)]);
    assert_eq!(s.held.map(|r| r.holder), Some(A));
    // With no reservation, the issuer's own key unregisters it too (without
    // a notice to itself).
    let mut s = State::default();
    register(&mut s, &A, 7).unwrap();
    register(&mut s, &B, 7).unwrap();
    let notes = s
        .acquire(&A, &acq(AA::Preempt, WriteExclusive), 7, 7)
        .unwrap();
    assert!(s.regs.is_empty() && s.held.is_none());
    assert_eq!(notes, vec![(B, notice::REGISTRATION_PREEMPTED)]);
    // IEKEY on Acquire and Release: Invalid Field (RESCAP bit 7).
    let mut s = held(WriteExclusive);
    let ie = AcquireCmd {
        iekey: true,
        ..acq(AA::Acquire, WriteExclusive)
    };
    assert_eq!(s.acquire(&A, &ie, 1, 0), Err(INVALID_FIELD));
    let ie = ReleaseCmd {
        iekey: true,
        ..rel(RL::Release, 1)
    };
    assert_eq!(s.release(&A, &ie, 1), Err(INVALID_FIELD));
}

#[test]
fn preempt_of_a_holder_with_key_zero_removes_only_key_zero() {
    let mut s = State::default();
    register(&mut s, &A, 0).unwrap();
    register(&mut s, &B, 5).unwrap();
    register(&mut s, &C, 9).unwrap();
    s.acquire(&A, &acq(AA::Acquire, WriteExclusive), 0, 0)
        .unwrap();
    s.acquire(&B, &acq(AA::Preempt, WriteExclusive), 5, 0)
        .unwrap();
    assert_eq!(
        s.held,
        Some(Held {
            rtype: WriteExclusive,
            holder: B
        })
    );
    assert!(!s.is_registered(&A));
    assert!(s.is_registered(&C), "C's key is not PRKEY");
}

#[test]
fn release_and_clear() {
    let mut s = held(WriteExclusiveRegistrantsOnly);
    register(&mut s, &C, 3).unwrap();
    assert_eq!(
        s.release(&B, &rel(RL::Release, 3), 1),
        Err(CONFLICT),
        "wrong key"
    );
    s.release(&B, &rel(RL::Release, 3), 2)
        .expect("not the holder: no-op");
    assert!(s.held.is_some());
    assert_eq!(
        s.release(&A, &rel(RL::Release, 1), 1),
        Err(INVALID_FIELD),
        "wrong type"
    );
    let g = s.gen;
    let notes = s.release(&A, &rel(RL::Release, 3), 1).unwrap();
    assert_eq!(s.held, None);
    assert_eq!(s.gen, g, "Release leaves the generation");
    assert_eq!(
        notes,
        vec![
            (B, notice::RESERVATION_RELEASED),
            (C, notice::RESERVATION_RELEASED)
        ]
    );
    // Releasing a Write Exclusive reservation notifies nobody.
    let mut s = held(WriteExclusive);
    assert!(s.release(&A, &rel(RL::Release, 1), 1).unwrap().is_empty());
    // Clear: everything goes, the others are told it was preempted.
    let mut s = held(ExclusiveAccess);
    let notes = s.release(&B, &rel(RL::Clear, 0), 2).unwrap();
    assert_eq!(notes, vec![(A, notice::RESERVATION_PREEMPTED)]);
    assert!(s.regs.is_empty() && s.held.is_none());
    assert_eq!(s.gen, 3);
}

#[test]
fn unregistering_the_holder_releases() {
    let unreg = reg(RA::Unregister, false, Cptpl::NoChange);
    let mut s = held(ExclusiveAccessRegistrantsOnly);
    let notes = s.register(&A, &unreg, 1, 0, 128).unwrap();
    assert_eq!(s.held, None);
    assert_eq!(notes, vec![(B, notice::RESERVATION_RELEASED)]);
    // All Registrants: held until the last registrant goes.
    let mut s = held(WriteExclusiveAllRegistrants);
    s.register(&A, &unreg, 1, 0, 128).unwrap();
    assert!(s.held.is_some());
    s.register(&B, &unreg, 2, 0, 128).unwrap();
    assert_eq!(s.held, None);
}

#[test]
fn io_check_is_enforced_and_failed_commands_change_nothing() {
    let r = Resv::open(None, 4).unwrap();
    assert_eq!(r.check_io(&C, true), Ok(()));
    r.apply(|s, max| s.register(&A, &reg(RA::Register, false, Cptpl::NoChange), 0, 1, max))
        .unwrap();
    r.apply(|s, _| s.acquire(&A, &acq(AA::Acquire, ExclusiveAccess), 1, 0))
        .unwrap();
    assert_eq!(r.check_io(&C, false), Err(CONFLICT));
    assert_eq!(r.check_io(&A, true), Ok(()));
    let before = r.snapshot();
    assert_eq!(
        r.apply(|s, _| s.acquire(&A, &acq(AA::Acquire, WriteExclusive), 1, 0)),
        Err(CONFLICT)
    );
    assert_eq!(r.snapshot(), before);
    r.apply(|s, _| s.release(&A, &rel(RL::Release, 2), 1))
        .unwrap();
    assert_eq!(
        r.check_io(&C, true),
        Ok(()),
        "released: the fast path again"
    );
}

#[test]
fn ptpl_state_survives_reopen_and_clearing_deletes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resv.json");
    let r = Resv::open(Some(path.clone()), 32).unwrap();
    r.apply(|s, max| s.register(&A, &reg(RA::Register, false, Cptpl::NoChange), 0, 1, max))
        .unwrap();
    assert!(!path.exists(), "PTPL clear: nothing written");
    for i in 0..20u8 {
        r.apply(|s, max| {
            s.register(
                &host(i + 0x20),
                &reg(RA::Register, false, Cptpl::Set),
                0,
                i as u64,
                max,
            )
        })
        .unwrap();
    }
    r.apply(|s, _| s.acquire(&A, &acq(AA::Acquire, ExclusiveAccessRegistrantsOnly), 1, 0))
        .unwrap();
    assert!(path.exists());
    let want = r.snapshot();
    drop(r);
    let r = Resv::open(Some(path.clone()), 32).unwrap();
    assert_eq!(r.snapshot(), want);
    assert_eq!(
        r.check_io(&C, false),
        Err(CONFLICT),
        "enforced after reopen"
    );
    // Fewer registrants allowed than saved: refused, naming the file.
    let e = Resv::open(Some(path.clone()), 8).err().unwrap().to_string();
    assert!(
        e.contains("resv.json") && e.contains("21 registrants"),
        "{e}"
    );
    r.set_ptpl(None, false).unwrap();
    assert!(!path.exists(), "PTPL cleared: the file goes");
    // A state no command sequence reaches is refused too.
    let a = crate::sys::hex(&A.id);
    let twice = format!(
        r#"{{"version":1,"gen":1,"rtype":0,"holder":"","registrants":[{{"hostid":"{a}","rkey":1}},{{"hostid":"{a}","rkey":2}}]}}"#
    );
    std::fs::write(&path, twice).unwrap();
    let e = Resv::open(Some(path.clone()), 32)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("registered twice"), "{e}");
    let orphan = format!(r#"{{"version":1,"gen":1,"rtype":1,"holder":"{a}","registrants":[]}}"#);
    std::fs::write(&path, orphan).unwrap();
    let e = Resv::open(Some(path.clone()), 32)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not registered"), "{e}");
    std::fs::write(&path, "{not json").unwrap();
    let e = Resv::open(Some(path.clone()), 32)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not valid"), "{e}");
}

#[test]
fn notice_log_masks_bounds_and_counts() {
    let mut l = NoticeLog::default();
    assert_eq!(l.pop(), Notice::default(), "empty: an empty page");
    l.set_mask(
        1,
        trellis_nvme::resv::mask_bit(notice::RESERVATION_RELEASED),
    );
    assert!(!l.push(1, notice::RESERVATION_RELEASED), "masked");
    assert!(l.push(2, notice::RESERVATION_RELEASED));
    assert!(l.push(1, notice::REGISTRATION_PREEMPTED));
    let n = l.pop();
    assert_eq!((n.count, n.nsid, n.available), (1, 2, 1));
    for _ in 0..NOTICE_QUEUE_MAX + 5 {
        l.push(3, notice::RESERVATION_PREEMPTED);
    }
    let n = l.pop();
    // Counts 2..=71 were queued, 64 kept: 2..=7 were dropped.
    assert_eq!(n.count, 8, "the oldest were dropped: a gap in the count");
    assert_eq!(n.available as usize, NOTICE_QUEUE_MAX - 1);
    l.set_mask(u32::MAX, MASK_BITS);
    assert!(!l.push(1, notice::REGISTRATION_PREEMPTED));
    assert!(!l.push(9, notice::RESERVATION_PREEMPTED));
}

#[test]
fn reservation_state_files_are_the_owners_only() {
    // The file names hosts and holds their reservation keys: mode 0600,
    // also when a stale temp file of another mode is in the way.
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resv.json");
    let stale = path.with_extension("tmp");
    std::fs::write(&stale, "stale").unwrap();
    std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o644)).unwrap();
    let r = Resv::open(Some(path.clone()), 32).unwrap();
    r.apply(|s, max| s.register(&A, &reg(RA::Register, false, Cptpl::Set), 0, 7, max))
        .unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "reservation state file mode {mode:o}");
}

#[test]
fn the_same_host_id_under_another_nqn_is_another_host() {
    let s = held(WriteExclusive);
    // A's Host ID claimed by a controller admitted under another NQN.
    let impostor = HostId::new(A.id, "nqn.2014-08.org.example:impostor");
    let a = HostId::new(A.id, "nqn.2014-08.org.example:a");
    let mut s2 = State::default();
    register(&mut s2, &a, 1).unwrap();
    s2.acquire(&a, &acq(AA::Acquire, WriteExclusive), 1, 0)
        .unwrap();
    assert!(s2.allows(&a, true), "the holder writes");
    assert!(!s2.allows(&impostor, true), "the impostor does not");
    assert!(!s2.is_registered(&impostor));
    assert_eq!(
        s2.release(&impostor, &rel(RL::Release, WriteExclusive as u8), 1),
        Err(CONFLICT),
        "nor can it use the holder's key"
    );
    assert!(s.allows(&A, true));
}

#[test]
fn a_version_1_registrant_is_bound_by_host_id_until_it_registers_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resv.json");
    let a = crate::sys::hex(&A.id);
    let v1 = format!(
        r#"{{"version":1,"gen":3,"rtype":1,"holder":"{a}","registrants":[{{"hostid":"{a}","rkey":9}}]}}"#
    );
    std::fs::write(&path, v1).unwrap();
    let r = Resv::open(Some(path.clone()), 32).unwrap();
    let a1 = HostId::new(A.id, "nqn.first");
    let a2 = HostId::new(A.id, "nqn.second");
    assert!(r.check_io(&a1, true).is_ok() && r.check_io(&a2, true).is_ok());
    r.apply(|s, max| s.register(&a1, &reg(RA::Register, false, Cptpl::NoChange), 0, 9, max))
        .unwrap();
    assert!(
        r.check_io(&a1, true).is_ok(),
        "bound to the NQN that registered"
    );
    assert_eq!(r.check_io(&a2, true), Err(CONFLICT), "and only to it");
    // Saved as version 2, the binding survives a restart.
    drop(r);
    let saved = std::fs::read_to_string(&path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&saved).unwrap();
    assert_eq!(v["version"], 2, "{saved}");
    let r = Resv::open(Some(path), 32).unwrap();
    assert!(r.check_io(&a1, true).is_ok());
    assert_eq!(r.check_io(&a2, true), Err(CONFLICT));
}

#[test]
fn a_version_1_registrant_that_acquires_then_unregisters_releases_and_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resv.json");
    let a = crate::sys::hex(&A.id);
    let v1 = format!(
        r#"{{"version":1,"gen":1,"rtype":0,"holder":"","registrants":[{{"hostid":"{a}","rkey":5}}]}}"#
    );
    std::fs::write(&path, v1).unwrap();
    let r = Resv::open(Some(path.clone()), 32).unwrap();
    let a1 = HostId::new(A.id, "nqn.first");
    r.apply(|s, _| s.acquire(&a1, &acq(AA::Acquire, WriteExclusive), 5, 0))
        .unwrap();
    let s = r.snapshot();
    assert_eq!(s.held.map(|h| h.holder), Some(a1));
    assert_eq!(s.regs[0].hostid, a1, "bound by the Acquire");
    let unreg = reg(RA::Unregister, false, Cptpl::NoChange);
    r.apply(|s, max| s.register(&a1, &unreg, 5, 0, max))
        .unwrap();
    assert_eq!(r.snapshot().held, None, "its reservation went with it");
    drop(r);
    let r = Resv::open(Some(path), 32).expect("the saved state loads");
    assert_eq!(r.snapshot().held, None);
}

/// An HA pair's shared copy in memory: saves only while `owner` is set.
#[derive(Default)]
struct MemShared {
    owner: std::sync::atomic::AtomicBool,
    fail: std::sync::atomic::AtomicBool,
    saved: Mutex<HashMap<String, Vec<u8>>>,
}

impl SharedResv for MemShared {
    fn save(&self, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
        if !self.owner.load(Ordering::SeqCst) {
            return Err(NotOwner.into());
        }
        anyhow::ensure!(!self.fail.load(Ordering::SeqCst), "store unreachable");
        self.saved
            .lock()
            .unwrap()
            .insert(name.to_string(), bytes.to_vec());
        Ok(())
    }
    fn load(&self, name: &str) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(self.saved.lock().unwrap().get(name).cloned())
    }
}

/// Issue 37 item 4: what one node of the pair acknowledged, the other
/// serves once it takes over, whatever PTPL says; a node that does not
/// hold the lease (or cannot reach the store) changes nothing.
#[test]
fn a_reservation_saved_by_one_node_is_served_by_the_node_that_takes_over() {
    let sh = MemShared::default();
    sh.owner.store(true, Ordering::SeqCst);
    let a = Resv::open(None, 32).unwrap().named("ab12".into());
    for i in 0..20u8 {
        a.apply_with(Some(&sh), |s, max| {
            s.register(
                &host(i + 0x20),
                &reg(RA::Register, false, Cptpl::NoChange),
                0,
                i as u64 + 1,
                max,
            )
        })
        .unwrap();
    }
    let holder = host(0x20);
    a.apply_with(Some(&sh), |s, _| {
        s.acquire(&holder, &acq(AA::Acquire, WriteExclusive), 1, 0)
    })
    .unwrap();
    let want = a.snapshot();
    assert!(!want.ptpl, "PTPL clear: the pair keeps it all the same");
    // The other node: its own (empty) state until it loads.
    let b = Resv::open(None, 32).unwrap().named("ab12".into());
    assert_eq!(b.load_shared(&sh).unwrap(), 20);
    assert_eq!(b.snapshot(), want);
    assert_eq!(
        b.check_io(&host(0x21), true),
        Err(CONFLICT),
        "enforced there"
    );
    assert_eq!(b.check_io(&holder, true), Ok(()));
    // The deposed node: refused with a path error, its state unchanged.
    sh.owner.store(false, Ordering::SeqCst);
    let r = a.apply_with(Some(&sh), |s, _| {
        s.release(&holder, &rel(RL::Release, 1), 1)
    });
    assert_eq!(r, Err(trellis_nvme::status::path::ANA_INACCESSIBLE));
    assert_eq!(a.snapshot(), want);
    // The store failing: an internal error the host may retry (no DNR).
    sh.owner.store(true, Ordering::SeqCst);
    sh.fail.store(true, Ordering::SeqCst);
    let r = b.apply_with(Some(&sh), |s, _| {
        s.release(&holder, &rel(RL::Release, 1), 1)
    });
    assert_eq!(r, Err(generic::INTERNAL_ERROR));
    assert_eq!(b.snapshot(), want);
    sh.fail.store(false, Ordering::SeqCst);
    assert_eq!(b.load_shared(&sh).unwrap(), 20, "the copy never moved");
}

#[test]
fn with_no_shared_copy_yet_the_node_that_serves_first_seeds_it() {
    let sh = MemShared::default();
    sh.owner.store(true, Ordering::SeqCst);
    let a = Resv::open(None, 32).unwrap().named("cd34".into());
    a.apply(|s, max| s.register(&A, &reg(RA::Register, false, Cptpl::NoChange), 0, 7, max))
        .unwrap();
    assert_eq!(
        a.load_shared(&sh).unwrap(),
        1,
        "kept, and saved as the copy"
    );
    let b = Resv::open(None, 32).unwrap().named("cd34".into());
    b.load_shared(&sh).unwrap();
    assert_eq!(b.snapshot(), a.snapshot());
    // A copy that is not a state is refused, naming why; the state stays.
    sh.saved
        .lock()
        .unwrap()
        .insert("cd34".into(), b"{\"version\": 9}".to_vec());
    assert!(b.load_shared(&sh).is_err());
    assert_eq!(b.snapshot(), a.snapshot());
}
