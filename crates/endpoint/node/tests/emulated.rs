//! The emulated SSD backend through the wire: data round-trips, reads take
//! at least the model's time (scaled), and bad parameters are refused.
mod common;
use common::*;
use trellis_node::config::{BackendKind, Config, NamespaceConfig};
use trellis_nvme::pdu::Digests;

/// One 16 MiB emulated namespace; `f` sets its emulation fields.
fn config(f: impl FnOnce(&mut NamespaceConfig)) -> Config {
    let mut ns = NamespaceConfig::sized(BackendKind::Emulated, 16 << 20);
    f(&mut ns);
    test_config(ns)
}

fn start(f: impl FnOnce(&mut NamespaceConfig)) -> trellis_node::Target {
    trellis_node::Target::start(&config(f)).unwrap()
}

/// Fastest of `n` QD1 4 KiB reads, in ns (the floor is what the model sets).
fn min_read_ns(q: &mut Queue, n: u64) -> u64 {
    (0..n)
        .map(|i| {
            let t0 = std::time::Instant::now();
            let (c, _) = read(q, i * 64, 8);
            assert!(c.status.is_success(), "{:?}", c.status);
            t0.elapsed().as_nanos() as u64
        })
        .min()
        .unwrap()
}

#[test]
fn written_data_reads_back_through_the_wire() {
    let t = start(|n| n.profile = Some("nvmevirt-970pro".into()));
    let mut c = controller(t.local_addrs[0], NQN, 1, Digests::default(), 0);
    let q = &mut c.io[0];
    for (slba, blocks) in [(0u64, 8usize), (4096, 16), (9, 3)] {
        let data = pattern(slba, blocks, 1);
        assert!(write(q, slba, &data).status.is_success());
        let (cqe, back) = read(q, slba, blocks as u32);
        assert!(cqe.status.is_success());
        assert_eq!(back, data, "slba {slba}");
    }
    drop(c);
    t.stop().unwrap();
}

#[test]
fn qd1_reads_take_at_least_the_model_time_and_scale() {
    // A clean pm9a3-gen4 4 KiB read: firmware + NAND page read + channel
    // and PCIe transfer; the first two alone are a lower bound.
    let p = trellis_ssd::SsdProfile::pm9a3();
    let idle_ns = p.fw_read_small_ns + p.read_lsb_ns.min(p.read_msb_ns);
    for scale in [1.0, 4.0] {
        let t = start(|n| n.time_scale = Some(scale));
        let mut c = controller(t.local_addrs[0], NQN, 1, Digests::default(), 0);
        let got = min_read_ns(&mut c.io[0], 20);
        let floor = (idle_ns as f64 * scale) as u64;
        assert!(got >= floor, "time_scale {scale}: {got} ns < {floor} ns");
        drop(c);
        t.stop().unwrap();
    }
}

#[test]
fn fragmented_femu_is_accepted_and_serves_io() {
    let t = start(|n| {
        n.profile = Some("femu".into());
        n.precondition = Some("fragmented".into());
    });
    let mut c = controller(t.local_addrs[0], NQN, 1, Digests::default(), 0);
    let data = pattern(100, 8, 3);
    assert!(write(&mut c.io[0], 100, &data).status.is_success());
    assert_eq!(read(&mut c.io[0], 100, 8).1, data);
    drop(c);
    t.stop().unwrap();
}

#[test]
fn bad_emulation_values_are_refused_with_the_fix() {
    let bad = |f: fn(&mut NamespaceConfig), want: &str| {
        let e = config(f).validate().unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    };
    bad(
        |n| n.profile = Some("970evo".into()),
        "unknown profile \"970evo\": use",
    );
    bad(
        |n| n.precondition = Some("used".into()),
        "unknown precondition \"used\": use clean or fragmented",
    );
    bad(
        |n| n.time_scale = Some(0.25),
        "time_scale 0.25 out of range",
    );
    bad(
        |n| {
            n.backend = BackendKind::Ram;
            n.profile = Some("femu".into());
        },
        "profile applies only to backend = \"emulated\"",
    );
    // And from TOML, integers and floats for time_scale alike.
    let toml = |v: &str| {
        Config::from_toml(&format!(
            "[[listener]]\naddr = \"127.0.0.1:0\"\n[[subsystem]]\nnqn = \"{NQN}\"\n\
             [[subsystem.namespace]]\nbackend = \"emulated\"\nsize = \"16MiB\"\ntime_scale = {v}\n"
        ))
    };
    assert_eq!(
        toml("4").unwrap().subsystems[0].namespaces[0].time_scale,
        Some(4.0)
    );
    assert!(toml("2.5").is_ok());
    let e = toml("0").unwrap_err().to_string();
    assert!(e.contains("time_scale 0 out of range"), "{e}");
}

#[test]
fn gimbal_on_a_time_scaled_drive_sees_the_drive_s_own_latency() {
    // Gimbal runs on the device's clock (wall ÷ time_scale): on a drive 8×
    // slower its latency EWMA is the unscaled model latency, so the 250 µs /
    // 1500 µs thresholds keep their meaning. On the wall clock it would be 8×.
    let p = trellis_ssd::SsdProfile::pm9a3();
    let idle_us = (p.fw_read_small_ns + p.read_lsb_ns.min(p.read_msb_ns)) / 1000;
    let scale = 8.0;
    let t = start(|n| {
        n.time_scale = Some(scale);
        n.qos = trellis_node::config::qos::QosMode::Gimbal;
    });
    let mut c = controller(t.local_addrs[0], NQN, 1, Digests::default(), 0);
    let wall_us = min_read_ns(&mut c.io[0], 20) / 1000;
    let (cqe, page) = get_log(&mut c.admin, trellis_node::data::qos::VIEW_LID, 1, 4096);
    assert!(cqe.status.is_success(), "{:?}", cqe.status);
    let e = &page[trellis_node::data::qos::VIEW_HEADER_BYTES..];
    let ewma_us = trellis_nvme::le32(e, 32) as u64;
    assert!(
        ewma_us >= idle_us && ewma_us * 4 < wall_us,
        "read EWMA {ewma_us} µs: want the drive's own latency (≥ {idle_us} µs), not the wall's {wall_us} µs"
    );
    drop(c);
    t.stop().unwrap();
}

/// Issue 33: a host's SMART log shows the emulated drive's wear. A
/// fragmented femu drive with `wear_acceleration` 200 has erased blocks by
/// the end of its preconditioning, so Percentage Used is above 0 over the
/// wire (0 before: the field was a constant); a new drive reads 0 % used
/// and 100 % spare, and the temperature is never 0 K.
#[test]
fn smart_over_the_wire_shows_the_emulated_drives_wear() {
    use trellis_nvme::log::{lid, Smart, SMART_LEN};
    let smart = |t: &trellis_node::Target| {
        let mut c = controller(t.local_addrs[0], NQN, 0, Digests::default(), 0);
        let (cqe, page) = get_log(&mut c.admin, lid::SMART, 1, SMART_LEN as u64);
        assert!(cqe.status.is_success(), "{:?}", cqe.status);
        Smart::decode(&page)
    };
    let t = start(|n| n.profile = Some("femu".into()));
    let fresh = smart(&t);
    t.stop().unwrap();
    assert_eq!((fresh.percent_used, fresh.available_spare_pct), (0, 100));
    assert_ne!(fresh.temperature_k, 0);
    let t = start(|n| {
        n.profile = Some("femu".into());
        n.precondition = Some("fragmented".into());
        n.wear_acceleration = Some(200);
    });
    let worn = smart(&t);
    t.stop().unwrap();
    eprintln!("fragmented femu, wear_acceleration 200: {worn:?}");
    assert!(worn.percent_used > 0, "{worn:?}");
    assert!(worn.available_spare_pct <= 100);
}

/// Issue 33: a drive that wears out tells its hosts. A host enables the
/// SMART / Health critical-warning events (Set Features 0Bh, bits 0, 2, 3)
/// and leaves an AER outstanding; another of its queues overwrites a femu
/// drive whose blocks retire at their first erase (`wear_acceleration`
/// 1,000,000). When the spares run out, the AER completes with a SMART /
/// Health event (type 1h, log page 02h), the SMART log says read only, and
/// writes fail with Namespace Write Protected.
#[test]
fn a_drive_that_wears_out_raises_the_smart_event_and_goes_read_only() {
    use trellis_nvme::log::{lid, Smart, SMART_LEN};
    use trellis_nvme::status::generic;
    use trellis_nvme::Cqe;
    let t = trellis_node::Target::start(&{
        let mut ns = NamespaceConfig::sized(BackendKind::Emulated, 64 << 20);
        ns.profile = Some("femu".into());
        ns.wear_acceleration = Some(1_000_000);
        let mut cfg = test_config(ns);
        cfg.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
        cfg
    })
    .unwrap();
    let mut c = controller(t.local_addrs[0], NQN, 1, Digests::default(), 0);
    let cid = await_smart_events(&mut c.admin);
    let data = vec![0x5A; 128 << 10];
    let blocks = (64u64 << 20) / 512;
    let (mut written, mut refused) = (0u64, None);
    let started = std::time::Instant::now();
    while written < 200_000 && started.elapsed() < std::time::Duration::from_secs(120) {
        let slba = (written * 256) % blocks;
        let cqe = write(&mut c.io[0], slba, &data);
        if !cqe.status.is_success() {
            refused = Some(cqe.status);
            break;
        }
        written += 1;
    }
    eprintln!(
        "{written} writes of 128 KiB in {:?} before {refused:?}",
        started.elapsed()
    );
    assert_eq!(
        refused,
        Some(generic::NS_WRITE_PROTECTED.dnr()),
        "after {written} writes"
    );
    let p = c.admin.recv().expect("the AER completes");
    let cqe = Cqe::decode(&p.bytes[8..24]);
    assert_eq!(cqe.cid, cid);
    assert_eq!(cqe.dw0 & 0x7, 0x1, "a SMART / Health event: {:#x}", cqe.dw0);
    assert_eq!(
        (cqe.dw0 >> 16) & 0xFF,
        u32::from(lid::SMART),
        "{:#x}",
        cqe.dw0
    );
    let (st, page) = get_log(&mut c.admin, lid::SMART, 0xFFFF_FFFF, SMART_LEN as u64);
    assert!(st.status.is_success());
    let smart = Smart::decode(&page);
    assert_eq!(
        smart.critical_warning & 0x09,
        0x09,
        "spare low and read only: {smart:?}"
    );
    // The extended health page (C1h) says why: blocks retired, erases,
    // and the write latencies seen.
    use trellis_nvme::health::{ExtHealth, Source, EXT_HEALTH_LEN, EXT_HEALTH_LID};
    let (st, page) = get_log(&mut c.admin, EXT_HEALTH_LID, 1, EXT_HEALTH_LEN as u64);
    assert!(st.status.is_success(), "{:?}", st.status);
    let ext = ExtHealth::decode(&page);
    eprintln!("{ext:?}");
    assert_eq!((ext.nsid, ext.source), (1, Source::Drive));
    assert_eq!(ext.critical_warning, smart.critical_warning);
    assert!(
        ext.bad_blocks > ext.spare_blocks,
        "retired more blocks than the spare pool holds: {ext:?}"
    );
    assert!(ext.erases > 0 && ext.gc_runs > 0, "{ext:?}");
    assert!(ext.write.p50_us <= ext.write.p99_us && ext.write.p99_us <= ext.write.max_us);
    assert_ne!(ext.write.p50_us, trellis_nvme::health::NOT_REPORTED);
    // `/metrics` shows the same warning.
    let scrape = {
        use std::io::{Read, Write};
        let mut h = std::net::TcpStream::connect(t.metrics_addr.unwrap()).unwrap();
        write!(h, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        h.read_to_string(&mut body).unwrap();
        body
    };
    let line = scrape
        .lines()
        .find(|l| l.starts_with("trellis_namespace_drive_critical_warning{"))
        .unwrap_or_else(|| panic!("no drive warning gauge in:\n{scrape}"));
    let v: i64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(v, i64::from(smart.critical_warning), "{line}");
    // A host that connects after the drive wore out and enables the events
    // hears of it at once.
    let mut late = controller(t.local_addrs[0], NQN, 0, Digests::default(), 0);
    let cid = await_smart_events(&mut late.admin);
    let p = late.admin.recv().expect("the late host's AER completes");
    let cqe = Cqe::decode(&p.bytes[8..24]);
    assert_eq!((cqe.cid, cqe.dw0 & 0x7), (cid, 0x1), "{:#x}", cqe.dw0);
    drop(late);
    drop(c);
    t.stop().unwrap();
}

/// `/metrics` of `t`, whole.
fn scrape(t: &trellis_node::Target) -> String {
    use std::io::{Read, Write};
    let mut h = std::net::TcpStream::connect(t.metrics_addr.unwrap()).unwrap();
    write!(h, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    h.read_to_string(&mut body).unwrap();
    body
}

/// The value of the first sample of `family` in a scrape, if any.
fn gauge(scrape: &str, family: &str) -> Option<i64> {
    scrape
        .lines()
        .find(|l| l.starts_with(&format!("{family}{{")))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Issue 33: a fault-injected drive (`fault = "degrade"`: from day 9 of its
/// age every read needs one more read retry each 3 days, the last steps
/// uncorrectable, silent on day 36; `age_acceleration` 86,400, a day a
/// second) is predicted to fail by its latency before the host sees its
/// first media error: `/metrics` shows "predicted failure" (3), the host's
/// AER completes with a SMART / Health event, and the SMART page sets
/// "reliability degraded". Its error rate then climbs, and once it stops
/// answering the predictor calls it failed (4).
#[test]
fn a_degrading_drive_is_predicted_to_fail_before_its_errors_and_the_host_hears_of_it() {
    use std::time::{Duration, Instant};
    use trellis_nvme::log::{lid, Smart, SMART_LEN};
    use trellis_nvme::Cqe;
    const DAY: Duration = Duration::from_secs(1);
    let t = trellis_node::Target::start(&{
        let mut cfg = config(|n| {
            n.profile = Some("femu".into());
            n.fault = Some("degrade".into());
            n.fault_onset_days = Some(9.0);
            n.fault_ramp_days = Some(27.0);
            n.age_acceleration = Some(86_400.0);
        });
        cfg.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
        cfg
    })
    .unwrap();
    let born = Instant::now();
    let mut c = controller(t.local_addrs[0], NQN, 1, Digests::default(), 0);
    let cid = await_smart_events(&mut c.admin);
    let mut admin = std::mem::replace(
        &mut c.admin,
        Queue::open(t.local_addrs[0], Digests::default()),
    );
    let aen = std::thread::spawn(move || {
        let until = Instant::now() + 60 * DAY;
        while Instant::now() < until {
            if let Some(p) = admin.recv() {
                return Some((Instant::now(), Cqe::decode(&p.bytes[8..24]), admin));
            }
        }
        None
    });
    // QD1 reads until day 33 (before the drive goes silent on day 36).
    let (mut predicted, mut first_error, mut errors, mut reads) = (None, None, 0u64, 0u64);
    let mut last_scrape = Instant::now();
    let blocks = (16u64 << 20) / 512;
    while born.elapsed() < 33 * DAY {
        let (cqe, _) = read(&mut c.io[0], (reads * 8 * 7919) % blocks, 8);
        reads += 1;
        if !cqe.status.is_success() {
            assert_eq!(cqe.status.sct(), 2, "a media error: {:?}", cqe.status);
            errors += 1;
            first_error.get_or_insert(born.elapsed());
        }
        if last_scrape.elapsed() >= DAY / 4 {
            last_scrape = Instant::now();
            if gauge(&scrape(&t), "trellis_namespace_drive_prediction") == Some(3) {
                predicted.get_or_insert(born.elapsed());
            }
        }
    }
    eprintln!("{reads} reads; predicted on day {predicted:?}; first media error on day {first_error:?}; {errors} errors");
    let predicted = predicted.expect("predicted to fail before the drive stops answering");
    let first_error = first_error.expect("the error rate degrades: media errors before day 33");
    assert!(
        predicted < first_error,
        "predicted on {predicted:?}, first error {first_error:?}"
    );
    let (at, cqe, mut admin) = aen.join().unwrap().expect("the AER completes");
    assert_eq!(
        (cqe.cid, cqe.dw0 & 0x7),
        (cid, 0x1),
        "a SMART / Health event: {:#x}",
        cqe.dw0
    );
    assert_eq!(
        (cqe.dw0 >> 16) & 0xFF,
        u32::from(lid::SMART),
        "{:#x}",
        cqe.dw0
    );
    let aen_day = at.duration_since(born);
    assert!(
        aen_day < first_error,
        "the event ({aen_day:?}) comes from the prediction, before the first error"
    );
    let (st, page) = get_log(&mut admin, lid::SMART, 1, SMART_LEN as u64);
    assert!(st.status.is_success());
    let smart = Smart::decode(&page);
    assert_eq!(
        smart.critical_warning & 0x04,
        0x04,
        "reliability degraded: {smart:?}"
    );
    assert!(smart.media_errors > 0, "{smart:?}");
    // Silent from day 36: the health poll goes unanswered, the drive is failed.
    let until = born + 45 * DAY;
    while gauge(&scrape(&t), "trellis_namespace_drive_prediction") != Some(4) {
        assert!(
            Instant::now() < until,
            "not failed by day 45:\n{}",
            scrape(&t)
        );
        std::thread::sleep(DAY / 4);
    }
    eprintln!("failed on day {:?}", born.elapsed());
    drop(admin);
    drop(c);
    t.stop().unwrap();
}

/// Enables the SMART / Health events (Set Features 0Bh: spare, reliability,
/// read only) on `admin` and leaves an AER outstanding; its CID.
fn await_smart_events(admin: &mut Queue) -> u16 {
    use trellis_nvme::sqe::admin as op;
    use trellis_nvme::{Sgl, Sqe};
    let mut s = Sqe::new(op::SET_FEATURES, 0, 0);
    s.set_cdw(10, 0x0B);
    s.set_cdw(11, 0x0D);
    assert!(admin.cmd(s, &[], 0, 0).0.status.is_success());
    let cid = admin.next_cid();
    let mut aer = Sqe::new(op::ASYNC_EVENT_REQUEST, cid, 0);
    aer.set_sgl(Sgl::transport(0));
    admin.send_capsule(&aer, &[]);
    cid
}
