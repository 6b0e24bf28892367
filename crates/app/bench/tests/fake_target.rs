//! `trellis bench` end to end against the fake target: verified I/O with and
//! without digests at 4 KiB and 128 KiB, job files with several tenants, and
//! a data-integrity failure that must be reported with its LBA and exit non-zero.

use trellis_bench::job::{resolve_jobs, JobOpts};
use trellis_bench::runner::{run_jobs, RunOpts};
use trellis_testkit::fake_target::{FakeConfig, FakeTarget, Fault};

fn opts(t: &FakeTarget, rw: &str, bs: &str, qd: u32, digest: &str) -> JobOpts {
    JobOpts {
        rw: Some(rw.into()),
        bs: Some(bs.into()),
        iodepth: Some(qd),
        runtime: Some("300ms".into()),
        size: Some("4m".into()),
        verify: Some("crc32c".into()),
        addr: Some(t.addr_string()),
        nqn: Some(t.subnqn().into()),
        digest: Some(digest.into()),
        ..Default::default()
    }
}

fn quiet() -> RunOpts {
    RunOpts {
        progress: false,
        ..Default::default()
    }
}

fn verified_run(rw: &str, bs: &str, qd: u32, digest: &str) {
    let t = FakeTarget::spawn(FakeConfig::default());
    let jobs = resolve_jobs(None, &opts(&t, rw, bs, qd, digest)).unwrap();
    let r = run_jobs(&jobs, &quiet()).unwrap();
    let j = &r.jobs[0];
    assert!(
        r.ok,
        "errors: {:?} verify: {:?}",
        j.first_error, j.verify_failure_samples
    );
    assert!(j.ios > 0, "I/O completed");
    assert!(j.verified_blocks > 0, "reads were actually checked");
    assert!(j.lat.lat_us_p50 > 0.0 && j.lat.lat_us_max >= j.lat.lat_us_p99);
}

#[test]
fn randrw_4k_verified_without_digests() {
    verified_run("randrw", "4k", 8, "none");
}

#[test]
fn randrw_128k_verified_with_both_digests() {
    verified_run("randrw", "128k", 4, "header,data");
}

#[test]
fn randread_4k_verified_after_prefill_with_digests() {
    verified_run("randread", "4k", 16, "header,data");
}

#[test]
fn sequential_write_is_read_back_and_verified() {
    verified_run("write", "128k", 4, "none");
}

#[test]
fn corrupted_read_is_a_verify_failure_with_lba_and_generations() {
    let t = FakeTarget::spawn(FakeConfig {
        fault: Fault::CorruptData,
        fault_after_reads: 3,
        ..Default::default()
    });
    let jobs = resolve_jobs(None, &opts(&t, "randread", "4k", 4, "none")).unwrap();
    let r = run_jobs(&jobs, &quiet()).unwrap();
    assert!(!r.ok);
    let j = &r.jobs[0];
    assert_eq!(j.verify_failures, 1);
    let f = &j.verify_failure_samples[0];
    assert_eq!(f.expected_generation, 1, "prefill wrote generation 1");
    assert_eq!(f.found_generation, Some(1));
    assert!(f.reason.contains("checksum"), "{}", f.reason);
    assert!(f.lba < 8192, "LBA inside the 4 MiB range");
}

#[test]
fn a_failing_queue_is_reported_not_hung() {
    let t = FakeTarget::spawn(FakeConfig {
        fault: Fault::WrongCid,
        fault_after_reads: 10,
        ..Default::default()
    });
    let mut o = opts(&t, "randread", "4k", 4, "none");
    o.verify = None;
    let jobs = resolve_jobs(None, &o).unwrap();
    let r = run_jobs(&jobs, &quiet()).unwrap();
    assert!(!r.ok);
    let e = r.jobs[0].first_error.as_deref().unwrap();
    assert!(e.contains("unknown command id"), "{e}");
}

#[test]
fn job_file_with_two_tenants_runs_both_jobs() {
    let t = FakeTarget::spawn(FakeConfig::default());
    let dir = std::env::temp_dir().join(format!("trellis-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("mix.toml");
    std::fs::write(
        &p,
        format!(
            r#"
[global]
addr = "{}"
nqn = "{}"
runtime = "300ms"
verify = true

[[job]]
name = "lapp"
class = "latency"
tenant = "alice"
rw = "randread"
bs = "4k"
iodepth = 1
offset = "0"
size = "2m"

[[job]]
name = "tapp"
class = "throughput"
tenant = "bob"
rw = "randrw"
bssplit = "4k/50:64k/50"
iodepth = 8
offset = "8m"
size = "8m"
"#,
            t.addr_string(),
            t.subnqn()
        ),
    )
    .unwrap();
    let jobs = resolve_jobs(Some(&p), &JobOpts::default()).unwrap();
    let r = run_jobs(&jobs, &quiet()).unwrap();
    assert!(
        r.ok,
        "{:?}",
        r.jobs.iter().map(|j| &j.first_error).collect::<Vec<_>>()
    );
    assert_eq!(r.jobs.len(), 2);
    assert_ne!(r.jobs[0].hostnqn, r.jobs[1].hostnqn);
    assert!(r.jobs.iter().all(|j| j.ios > 0));
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["jobs"][0]["lat_us_p99_99"].is_number());
    assert_eq!(json["jobs"][0]["class"], "latency");
}

#[test]
fn latency_is_measured_from_submission_to_the_completion_that_arrived() {
    // Every read takes at least 2 ms at the target, so no completion latency
    // can be below that; a timestamp taken before the receive would be.
    let t = FakeTarget::spawn(FakeConfig {
        read_delay: std::time::Duration::from_millis(2),
        ..Default::default()
    });
    let mut o = opts(&t, "randread", "4k", 1, "none");
    o.verify = None;
    let jobs = resolve_jobs(None, &o).unwrap();
    let r = run_jobs(&jobs, &quiet()).unwrap();
    let j = &r.jobs[0];
    assert!(r.ok && j.ios > 0);
    let min_us = 2000.0;
    assert!(j.lat.lat_us_p50 >= min_us, "p50 {} µs", j.lat.lat_us_p50);
    assert!(j.read.lat.lat_us_p50 >= min_us);
}

/// Issue 10: a target that goes away mid-run gave `runtime_s` 0.0 and IOPS
/// in the trillions. The report must cover the I/O done until then, over
/// the time it took, and be marked partial.
#[test]
fn losing_the_target_mid_run_reports_sane_partial_figures() {
    let t = FakeTarget::spawn(FakeConfig {
        fault: Fault::CloseMidData,
        fault_after_reads: 200,
        ..Default::default()
    });
    let mut o = opts(&t, "randread", "4k", 1, "none");
    o.verify = None;
    o.runtime = Some("5s".into());
    let jobs = resolve_jobs(None, &o).unwrap();
    let r = run_jobs(&jobs, &quiet()).unwrap();
    let j = &r.jobs[0];
    assert!(!r.ok && r.partial && j.partial, "marked partial");
    assert!(
        j.ios >= 150,
        "the reads done before the loss count: {}",
        j.ios
    );
    assert!(j.runtime_s > 0.0 && j.runtime_s < 5.0, "{}", j.runtime_s);
    let iops = j.ios as f64 / j.runtime_s;
    assert!((j.iops - iops).abs() < 1e-6 * iops, "{} vs {iops}", j.iops);
    assert!(j.errors > 0);
}

/// Issue 10: `--size 1G` on a smaller namespace was clipped silently.
#[test]
fn a_range_past_the_namespace_end_is_refused_with_the_limit() {
    let t = FakeTarget::spawn(FakeConfig::default()); // 64 MiB
    let mut o = opts(&t, "randread", "4k", 1, "none");
    o.size = Some("1g".into());
    let jobs = resolve_jobs(None, &o).unwrap();
    let e = format!("{:#}", run_jobs(&jobs, &quiet()).expect_err("refused"));
    assert!(e.contains("--size 1073741824"), "{e}");
    assert!(e.contains("use --size 67108864 or less"), "{e}");
}

/// Issue 10: `--iodepth 1000` ran at the target's queue limit while the
/// report said 1000.
#[test]
fn an_iodepth_above_the_targets_queue_limit_is_refused() {
    let t = FakeTarget::spawn(FakeConfig {
        mqes: 31,
        ..Default::default()
    });
    let mut o = opts(&t, "randread", "4k", 1000, "none");
    o.verify = None;
    let jobs = resolve_jobs(None, &o).unwrap();
    let e = format!("{:#}", run_jobs(&jobs, &quiet()).expect_err("refused"));
    assert!(e.contains("--iodepth 1000"), "{e}");
    assert!(e.contains("use --iodepth 32 or less"), "{e}");
}

/// SIGINT/SIGTERM set the interrupt flag: the run stops early, and the
/// report says it is partial and covers what was done.
#[test]
fn an_interrupted_run_reports_what_it_did_as_partial() {
    let t = FakeTarget::spawn(FakeConfig::default());
    let mut o = opts(&t, "randread", "4k", 4, "none");
    o.verify = None;
    o.runtime = Some("30s".into());
    let jobs = resolve_jobs(None, &o).unwrap();
    let ro = quiet();
    let flag = ro.interrupted.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(400));
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let t0 = std::time::Instant::now();
    let r = run_jobs(&jobs, &ro).unwrap();
    assert!(t0.elapsed().as_secs() < 10, "stopped early");
    assert!(r.interrupted && r.partial);
    assert!(r.jobs[0].ios > 0 && r.jobs[0].runtime_s > 0.0);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["partial"], true);
}
