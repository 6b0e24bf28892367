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
