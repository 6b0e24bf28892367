//! Helper threads (acceptor, metrics, DH workers) keep off the CPUs reactors are pinned
//! to. Its own test binary: threads are found by name in this process, and
//! a target started by a test running alongside would have threads of the
//! same names.
mod common;
use common::*;
use std::time::Duration;
use trellis_node::config::{BackendKind, NamespaceConfig};

/// `Cpus_allowed_list` of this process's thread named `name`.
fn allowed_cpus(name: &str) -> Option<String> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .flatten()
        .find_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            if comm.trim() != name {
                return None;
            }
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            status.lines().find_map(|l| {
                l.strip_prefix("Cpus_allowed_list:")
                    .map(|v| v.trim().to_string())
            })
        })
}

#[test]
fn helper_threads_stay_off_the_cpus_reactors_are_pinned_to() {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n < 2 {
        eprintln!("skipped: one CPU, nowhere else to put helper threads");
        return;
    }
    let mut cfg = test_config(NamespaceConfig::sized(BackendKind::Ram, 1 << 20));
    cfg.target.reactors = 1;
    cfg.target.cpus = vec![0];
    cfg.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    let t = trellis_node::Target::start(&cfg).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for name in ["acceptor", "metrics", "dh-worker-0"] {
        let cpus = allowed_cpus(name).unwrap_or_else(|| panic!("no {name} thread"));
        let has0 = cpus.split(',').any(|r| {
            let (a, _) = r.split_once('-').unwrap_or((r, r));
            a == "0"
        });
        assert!(!has0, "{name} may run on reactor CPU 0: {cpus}");
    }
    assert_eq!(allowed_cpus("reactor-0").as_deref(), Some("0"));
    t.stop().unwrap();
}
