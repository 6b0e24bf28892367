use super::*;
use crate::backend::tag::test_tag;
use crate::config::{BackendKind, NamespaceConfig};
use trellis_ssd::{Precondition, SsdProfile};

fn params(profile: &str, scale: f64) -> EmulatedParams {
    let mut n = NamespaceConfig::sized(BackendKind::Emulated, 1 << 20);
    n.profile = Some(profile.into());
    n.time_scale = Some(scale);
    EmulatedParams::from_config(&n).unwrap().unwrap()
}

#[test]
fn config_values_are_checked_with_the_fix_in_the_message() {
    let mut n = NamespaceConfig::sized(BackendKind::Emulated, 1 << 20);
    let p = EmulatedParams::from_config(&n).unwrap().unwrap();
    assert_eq!(p.profile.name, DEFAULT_PROFILE);
    assert_eq!(p.precondition, Precondition::Clean);
    assert_eq!(p.time_scale, 1.0);
    n.profile = Some("samsung".into());
    let e = EmulatedParams::from_config(&n).unwrap_err();
    assert!(e.contains("\"samsung\"") && e.contains("pm9a3-gen4"), "{e}");
    n.profile = None;
    n.precondition = Some("dirty".into());
    let e = EmulatedParams::from_config(&n).unwrap_err();
    assert!(e.contains("\"dirty\"") && e.contains("fragmented"), "{e}");
    n.precondition = None;
    for bad in [0.5, 0.0, -1.0, f64::NAN, f64::INFINITY, 1e9] {
        n.time_scale = Some(bad);
        let e = EmulatedParams::from_config(&n).unwrap_err();
        assert!(e.contains("time_scale") && e.contains("1 to"), "{bad}: {e}");
    }
    n.time_scale = None;
    for bad in [0, crate::config::emulated::MAX_WEAR_ACCELERATION + 1] {
        n.wear_acceleration = Some(bad);
        let e = EmulatedParams::from_config(&n).unwrap_err();
        assert!(
            e.contains("wear_acceleration") && e.contains("1 to"),
            "{bad}: {e}"
        );
    }
    n.wear_acceleration = Some(7);
    let p = EmulatedParams::from_config(&n).unwrap().unwrap();
    assert_eq!(p.profile.wear.acceleration, 7);
    n.wear_acceleration = None;
    let mut r = NamespaceConfig::sized(BackendKind::Ram, 1 << 20);
    r.time_scale = Some(4.0);
    let e = EmulatedParams::from_config(&r).unwrap_err();
    assert!(e.contains("only to backend = \"emulated\""), "{e}");
}

/// Submits one request and reaps until it completes; returns (status, ns).
fn run_one(q: &mut dyn BackendQueue, req: &IoReq) -> (Status, u64) {
    let t0 = crate::sys::now_ns();
    // SAFETY: req.buf points at a live buffer of len_bytes the caller owns
    // for the whole call, and the request completes before we return.
    if let Some(st) = unsafe { q.submit(req, test_tag(7)) } {
        return (st, crate::sys::now_ns() - t0);
    }
    let mut out = Vec::new();
    while q.reap(&mut out) == 0 {
        std::hint::spin_loop();
    }
    assert_eq!(out[0].tag, test_tag(7));
    (out[0].status, crate::sys::now_ns() - t0)
}

fn req(op: Op, off: u64, buf: &mut [u8]) -> IoReq {
    IoReq {
        op,
        offset_bytes: off,
        len_bytes: buf.len() as u64,
        buf: buf.as_mut_ptr(),
        fua: false,
    }
}

#[test]
fn data_round_trips_and_reads_take_the_model_time_scaled() {
    // femu: a clean 4 KiB read costs exactly one NAND read (40 µs), no
    // transfer or firmware terms.
    let read_ns = SsdProfile::femu().read_lsb_ns;
    for scale in [1.0, 4.0] {
        let b = EmulatedBackend::new(1 << 20, params("femu", scale)).unwrap();
        let mut q = b.open_queue().unwrap();
        let mut w = vec![0xA5u8; 4096];
        let (st, _) = run_one(&mut *q, &req(Op::Write, 8192, &mut w));
        assert_eq!(st, Status::SUCCESS);
        let mut r = vec![0u8; 4096];
        let (st, took) = run_one(&mut *q, &req(Op::Read, 8192, &mut r));
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(r, w);
        let floor = (read_ns as f64 * scale) as u64;
        assert!(took >= floor, "scale {scale}: {took} ns < {floor} ns");
        assert_eq!(q.in_flight(), 0);
        drop(q);
        assert_eq!(b.lateness().completions, 2);
    }
}

#[test]
fn out_of_range_and_huge_requests_get_a_status_not_a_panic() {
    let b = EmulatedBackend::new(1 << 20, params("pm9a3-gen4", 1.0)).unwrap();
    let mut q = b.open_queue().unwrap();
    let mut buf = vec![0u8; 4096];
    let (st, _) = run_one(&mut *q, &req(Op::Read, (1 << 20) - 512, &mut buf));
    assert_eq!(st, generic::LBA_OUT_OF_RANGE.dnr());
    let mut r = req(Op::Read, u64::MAX - 10, &mut buf);
    r.len_bytes = 4096;
    assert_eq!(run_one(&mut *q, &r).0, generic::LBA_OUT_OF_RANGE.dnr());
    r.len_bytes = 0;
    assert_eq!(run_one(&mut *q, &r).0, generic::INVALID_FIELD.dnr());
    assert_eq!(q.in_flight(), 0);
}

#[test]
fn cancel_completes_pending_commands_ahead_of_model_time() {
    let b = EmulatedBackend::new(1 << 20, params("pm9a3-gen4", 1000.0)).unwrap();
    let mut q = b.open_queue().unwrap();
    let mut bufs = vec![vec![0u8; 4096]; 8];
    for (i, buf) in bufs.iter_mut().enumerate() {
        let r = req(Op::Read, i as u64 * 4096, buf);
        // SAFETY: the buffers outlive the queue's use of them: every
        // request is reaped below before they are dropped.
        assert!(unsafe { q.submit(&r, test_tag(i as u16)) }.is_none());
    }
    let mut out = Vec::new();
    assert_eq!(q.reap(&mut out), 0, "60 ms reads are not done yet");
    assert_eq!(q.cancel_all(), 8);
    assert_eq!(q.reap(&mut out), 8);
    assert_eq!(q.in_flight(), 0);
}

#[test]
fn a_late_reap_reports_when_the_model_completed_the_read() {
    // femu: a clean 4 KiB read is one 40 µs NAND read. Reaped 30 ms late (a
    // preempted reactor), the due time still says 40 µs × scale after the
    // submit: that, not the reap time, is the device latency Gimbal must see.
    let read_ns = SsdProfile::femu().read_lsb_ns;
    let b = EmulatedBackend::new(1 << 20, params("femu", 2.0)).unwrap();
    let mut q = b.open_queue().unwrap();
    let mut buf = vec![0u8; 4096];
    let t0 = crate::sys::now_ns();
    // SAFETY: buf outlives the request, which is reaped below.
    assert!(unsafe { q.submit(&req(Op::Read, 0, &mut buf), test_tag(3)) }.is_none());
    std::thread::sleep(std::time::Duration::from_millis(30));
    let (mut out, mut due) = (Vec::new(), Vec::new());
    assert_eq!(q.reap_timed(&mut out, &mut due), 1);
    let reaped = crate::sys::now_ns();
    assert_eq!((out[0].tag, due.len()), (test_tag(3), 1));
    let lat = due[0] - t0;
    assert!(lat >= 2 * read_ns, "{lat} ns < the scaled model time");
    assert!(lat < 10_000_000, "{lat} ns: the reap time leaked in");
    assert!(reaped - due[0] > 20_000_000, "the reap was not late");
}

/// The cost of one model call under the drive lock, alone and with a second
/// thread hammering the same drive (run with --ignored --nocapture; prints
/// the figures docs/ssd-model.md quotes, asserts nothing about speed).
#[test]
#[ignore]
fn measure_lock_and_model_cost() {
    let b = EmulatedBackend::new(1 << 30, params("pm9a3-gen4", 1.0)).unwrap();
    let n = 200_000u64;
    let per_call = move |d: &Drive| {
        let t0 = std::time::Instant::now();
        for i in 0..n {
            d.schedule(IoDir::Read, (i * 7919 % 262_144) * 4096, 4096);
        }
        t0.elapsed().as_nanos() as u64 / n
    };
    println!("alone: {} ns per read", per_call(&b.drive));
    let d2 = b.drive.clone();
    let other = std::thread::spawn(move || per_call(&d2));
    let mine = per_call(&b.drive);
    println!(
        "two threads: {mine} / {} ns per read",
        other.join().unwrap()
    );
}

/// Writes `n` 128 KiB blocks over the namespace, 32 at a time, cycling
/// through it; returns how many were refused with Namespace Write Protected.
fn wear_writes(q: &mut dyn BackendQueue, size: u64, n: u64, start: u64) -> u64 {
    const BS: usize = 128 << 10;
    let mut bufs: Vec<Vec<u8>> = (0..32).map(|i| vec![i as u8; BS]).collect();
    let (mut refused, mut i) = (0, start);
    let end = start + n;
    while i < end {
        let batch = (end - i).min(32) as usize;
        let mut out = Vec::new();
        for (k, b) in bufs.iter_mut().take(batch).enumerate() {
            let off = (i + k as u64) * BS as u64 % size;
            let r = req(Op::Write, off, b);
            // SAFETY: b lives until every request of the batch is reaped.
            if let Some(st) = unsafe { q.submit(&r, test_tag(k as u16)) } {
                out.push(crate::backend::Completion::new(test_tag(k as u16), st));
            }
        }
        while out.len() < batch {
            q.reap(&mut out);
        }
        refused += out
            .iter()
            .filter(|c| c.status == generic::NS_WRITE_PROTECTED.dnr())
            .count() as u64;
        i += batch as u64;
    }
    refused
}

/// Issue 33: the emulated drive's wear reaches SMART. With a high
/// `wear_acceleration`, overwrites of a full drive (a clean precondition:
/// GC must erase to make room) raise Percentage Used, retire blocks until
/// Available Spare falls below its threshold (critical warning bit 0), then
/// exhaust the spares: bit 3 (read-only) sets and writes fail with
/// Namespace Write Protected, and nothing of them lands.
#[test]
fn a_worn_emulated_drive_reports_its_wear_in_smart_and_goes_read_only() {
    let size: u64 = 64 << 20;
    let mut n = NamespaceConfig::sized(BackendKind::Emulated, size);
    n.profile = Some("femu".into());
    n.wear_acceleration = Some(WEAR_ACCELERATION_FOR_TEST);
    let p = EmulatedParams::from_config(&n).unwrap().unwrap();
    let b = EmulatedBackend::new(size, p).unwrap();
    let first = b.drive_smart().unwrap();
    let mut q = b.open_queue().unwrap();
    let mut last = first;
    let (mut written, mut refused) = (0u64, 0u64);
    while refused == 0 && written < 2_000_000 {
        refused += wear_writes(q.as_mut(), size, 1024, written);
        written += 1024;
        let s = b.drive_smart().unwrap();
        assert!(s.percent_used >= last.percent_used, "wear never falls");
        assert!(
            s.available_spare_pct <= last.available_spare_pct,
            "nor spare grows"
        );
        eprintln!(
            "{written} writes: used {} %, spare {} %, warning {:#x}",
            s.percent_used, s.available_spare_pct, s.critical_warning
        );
        last = s;
    }
    assert!(
        refused > 0,
        "the drive went read-only within {written} writes"
    );
    assert!(
        last.percent_used > first.percent_used,
        "{first:?} -> {last:?}"
    );
    assert_eq!(
        last.critical_warning & 0x09,
        0x09,
        "spare low and read-only: {last:?}"
    );
    assert!(last.available_spare_pct < 10);
    // The wear sits in the blocks GC recycles (no wear levelling), so the
    // spares run out long before the average reaches the rating.
    assert!(last.percent_used < 100, "{last:?}");
    // A write to the read-only drive is refused and writes nothing.
    let mut before = vec![0u8; 4096];
    assert_eq!(
        run_one(q.as_mut(), &req(Op::Read, 0, &mut before)).0,
        Status::SUCCESS
    );
    let mut new = vec![0xEE; 4096];
    let st = run_one(q.as_mut(), &req(Op::Write, 0, &mut new)).0;
    assert_eq!(st, generic::NS_WRITE_PROTECTED.dnr());
    let mut after = vec![0u8; 4096];
    assert_eq!(
        run_one(q.as_mut(), &req(Op::Read, 0, &mut after)).0,
        Status::SUCCESS
    );
    assert_eq!(after, before, "the refused write did not land");
    // Nor do Write Zeroes and Deallocate.
    for op in [Op::WriteZeroes, Op::Discard] {
        let mut none = vec![0u8; 4096];
        let r = IoReq {
            buf: std::ptr::null_mut(),
            ..req(op, 0, &mut none)
        };
        assert_eq!(
            run_one(q.as_mut(), &r).0,
            generic::NS_WRITE_PROTECTED.dnr(),
            "{op:?}"
        );
    }
    let mut after = vec![0u8; 4096];
    assert_eq!(
        run_one(q.as_mut(), &req(Op::Read, 0, &mut after)).0,
        Status::SUCCESS
    );
    assert_eq!(after, before, "zeroes and deallocation did not land either");
}

/// A block then retires after about three erases (rated 3,000 cycles).
const WEAR_ACCELERATION_FOR_TEST: u32 = 1_000;

/// Issue 33: the fault keys are checked together, each refusal naming the fix.
#[test]
fn fault_keys_are_checked_with_the_fix_in_the_message() {
    let mut n = NamespaceConfig::sized(BackendKind::Emulated, 1 << 20);
    n.fault = Some("degrade".into());
    let e = EmulatedParams::from_config(&n).unwrap_err();
    assert!(e.contains("fault_onset_days"), "{e}");
    n.fault_onset_days = Some(9.0);
    let e = EmulatedParams::from_config(&n).unwrap_err();
    assert!(e.contains("fault_ramp_days"), "{e}");
    for bad in [0.0, -1.0, f64::NAN, 1e9] {
        n.fault_ramp_days = Some(bad);
        let e = EmulatedParams::from_config(&n).unwrap_err();
        assert!(
            e.contains("fault_ramp_days") && e.contains("days"),
            "{bad}: {e}"
        );
    }
    n.fault_ramp_days = Some(27.0);
    let p = EmulatedParams::from_config(&n).unwrap().unwrap();
    let f = p.fault.unwrap();
    assert_eq!(f.fails_at_ns(), 36 * 86_400_000_000_000);
    n.fault = Some("slow".into());
    let e = EmulatedParams::from_config(&n).unwrap_err();
    assert!(
        e.contains("\"slow\"") && e.contains("degrade or silent"),
        "{e}"
    );
    n.fault = Some("silent".into());
    let e = EmulatedParams::from_config(&n).unwrap_err();
    assert!(e.contains("fault_ramp_days applies only"), "{e}");
    n.fault = None;
    let e = EmulatedParams::from_config(&n).unwrap_err();
    assert!(e.contains("need fault"), "{e}");
    n.fault_onset_days = None;
    n.fault_ramp_days = None;
    for bad in [0.5, f64::NAN, 1e7] {
        n.age_acceleration = Some(bad);
        let e = EmulatedParams::from_config(&n).unwrap_err();
        assert!(
            e.contains("age_acceleration") && e.contains("1 to"),
            "{bad}: {e}"
        );
    }
    let mut r = NamespaceConfig::sized(BackendKind::Ram, 1 << 20);
    r.fault = Some("degrade".into());
    let e = EmulatedParams::from_config(&r).unwrap_err();
    assert!(
        e.contains("fault applies only to backend = \"emulated\""),
        "{e}"
    );
}

/// With a `path`, two emulated drives over one file share their data (an
/// HA pair's dual-ported drive), and a deallocated range reads zeroes
/// through both.
#[test]
fn two_emulated_drives_over_one_file_share_their_data() {
    let d = tempfile::tempdir().unwrap();
    let mut p = params("femu", 1.0);
    p.path = Some(d.path().join("drive.img").to_str().unwrap().into());
    let a = EmulatedBackend::new(1 << 20, p.clone()).unwrap();
    let b = EmulatedBackend::new(1 << 20, p).unwrap();
    let (mut qa, mut qb) = (a.open_queue().unwrap(), b.open_queue().unwrap());
    let mut data = vec![0xA7u8; 8192];
    let io = |op, buf: *mut u8| IoReq {
        op,
        offset_bytes: 4096,
        len_bytes: 8192,
        buf,
        fua: false,
    };
    let run = |q: &mut Box<dyn BackendQueue>, r: IoReq| {
        // SAFETY: the buffer outlives the request, which is reaped below.
        if let Some(st) = unsafe { q.submit(&r, test_tag(1)) } {
            return st;
        }
        let mut out = Vec::new();
        while out.is_empty() {
            q.reap(&mut out);
        }
        out[0].status
    };
    assert!(run(&mut qa, io(Op::Write, data.as_mut_ptr())).is_success());
    let mut back = vec![0u8; 8192];
    assert!(run(&mut qb, io(Op::Read, back.as_mut_ptr())).is_success());
    assert_eq!(back, data, "B reads what A wrote");
    assert!(run(&mut qb, io(Op::Discard, std::ptr::null_mut())).is_success());
    assert!(run(&mut qa, io(Op::Read, back.as_mut_ptr())).is_success());
    assert!(
        back.iter().all(|&x| x == 0),
        "A reads the zeroes B deallocated"
    );
}
