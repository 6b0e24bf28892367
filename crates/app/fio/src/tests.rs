use super::*;
use trellis_testkit::fake_target::{FakeConfig, FakeTarget};

fn spec_for(t: &FakeTarget) -> Spec {
    let (ip, port) = t
        .addr_string()
        .rsplit_once(':')
        .map(|(a, p)| (a.to_string(), p.to_string()))
        .unwrap();
    Spec::parse(&format!(
        "traddr={ip} trsvcid={port} subnqn={} ns=1",
        t.subnqn()
    ))
    .unwrap()
}

/// Reaps until `n` I/Os finished (or 5 s), returning them.
fn reap_all(d: &mut Device, n: usize) -> Vec<Done> {
    let mut out = Vec::with_capacity(n);
    let deadline = Instant::now() + Duration::from_secs(5);
    while out.len() < n && Instant::now() < deadline {
        let room = n - out.len();
        d.reap(&mut out, room).unwrap();
    }
    out
}

#[test]
fn spec_reads_spdk_style_keys_and_defaults() {
    let s = Spec::parse("trtype=tcp adrfam=IPv4 traddr=10.0.0.2 trsvcid=4421 subnqn=nqn.x:y ns=3")
        .unwrap();
    assert_eq!(s.addr, "10.0.0.2:4421");
    assert_eq!((s.subnqn.as_str(), s.nsid), ("nqn.x:y", 3));
    let d = Spec::parse("traddr=::1").unwrap();
    assert_eq!(d.addr, "[::1]:4420");
    assert_eq!(
        (d.subnqn.as_str(), d.hostnqn.as_str(), d.nsid),
        (spec::DEFAULT_SUBNQN, spec::DEFAULT_HOSTNQN, 1)
    );
}

#[test]
fn bad_specs_name_the_key_and_the_fix() {
    for (s, want) in [
        ("", "no traddr"),
        ("traddr=1.2.3.4 trsvcid=http", "trsvcid=http"),
        ("traddr=1.2.3.4 ns=0", "ns=0"),
        ("traddr=1.2.3.4 trtype=rdma", "only tcp"),
        ("traddr=1.2.3.4 colour=blue", "unknown key \"colour\""),
        ("traddr", "not key=value"),
    ] {
        let e = Spec::parse(s).unwrap_err();
        assert!(e.contains(want), "{s:?}: {e}");
    }
}

#[test]
fn writes_then_reads_return_the_same_bytes_into_the_callers_buffers() {
    let t = FakeTarget::spawn(FakeConfig::default());
    let mut d = Device::open(&spec_for(&t), 8, 64 << 10).unwrap();
    assert_eq!(d.size_bytes(), FakeConfig::default().blocks * 512);
    let mut bufs: Vec<Vec<u8>> = (0..8u8)
        .map(|i| vec![i.wrapping_mul(37) ^ 0x5a; 8192])
        .collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        // SAFETY: each buffer outlives its I/O (reaped below).
        unsafe {
            d.submit(
                IoKind::Write,
                i as u64 * 8192,
                8192,
                b.as_mut_ptr(),
                100 + i as u64,
            )
        }
        .unwrap();
    }
    d.send().unwrap();
    let w = reap_all(&mut d, 8);
    assert_eq!(w.len(), 8);
    assert!(w
        .iter()
        .all(|x| x.result == 0 && (100..108).contains(&x.cookie)));
    let mut back: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 8192]).collect();
    for (i, b) in back.iter_mut().enumerate() {
        // SAFETY: as above.
        unsafe {
            d.submit(
                IoKind::Read,
                i as u64 * 8192,
                8192,
                b.as_mut_ptr(),
                i as u64,
            )
        }
        .unwrap();
    }
    let r = reap_all(&mut d, 8);
    assert_eq!(r.len(), 8);
    assert_eq!(back, bufs);
    assert_eq!(d.inflight(), 0);
    d.close().unwrap();
}

#[test]
fn a_full_queue_is_busy_until_reaped_and_bad_io_is_refused() {
    let t = FakeTarget::spawn(FakeConfig::default());
    let mut d = Device::open(&spec_for(&t), 2, 4096).unwrap();
    let mut b = vec![0u8; 4096];
    let p = b.as_mut_ptr();
    // SAFETY: `b` outlives every I/O below (all reaped before it drops).
    unsafe {
        assert_eq!(d.submit(IoKind::Read, 0, 4096, p, 1), Ok(()));
        assert_eq!(
            d.submit(IoKind::Flush, 0, 0, std::ptr::null_mut(), 2),
            Ok(())
        );
        assert_eq!(
            d.submit(IoKind::Read, 0, 4096, p, 3),
            Err(SubmitError::Busy)
        );
    }
    assert_eq!(reap_all(&mut d, 2).len(), 2);
    let size = d.size_bytes();
    for (off, len, why) in [
        (1, 512, "whole 512-byte blocks"),
        (0, 100, "whole 512-byte blocks"),
        (0, 8192, "largest transfer"),
        (size - 512, 1024, "runs past"),
    ] {
        // SAFETY: refused before any transfer.
        let e = unsafe { d.submit(IoKind::Write, off, len, p, 9) };
        assert!(
            matches!(&e, Err(SubmitError::Invalid(m)) if m.contains(why)),
            "{off}+{len}: {e:?}"
        );
    }
    d.close().unwrap();
}

#[test]
fn open_refuses_depths_and_sizes_out_of_range_with_the_fix() {
    let t = FakeTarget::spawn(FakeConfig::default());
    let s = spec_for(&t);
    let e = Device::open(&s, 0, 4096).err().unwrap();
    assert!(e.contains("iodepth 0 out of range"), "{e}");
    let e = Device::open(&s, 8, MAX_TRANSFER_BYTES + 1).err().unwrap();
    assert!(e.contains("out of range"), "{e}");
}
