//! 1,000 hosts with 10 I/O queues each (11,000 connections, 10,000 I/O
//! queue pairs) against one `trellis target` with its default limits but
//! the per-address share (all hosts here are one loopback address)
//! (issue 13, "load and hostile peers"). The target starts with a soft
//! RLIMIT_NOFILE of 1,024, as a process started from a shell would, so it
//! must raise its own. Prints the target's memory per queue pair.

mod common;

use common::*;
use std::time::Instant;
use trellis_host::{Controller, HostConfig};

const NQN: &str = "nqn.2026-11.io.trellis:default";
const HOSTS: usize = 1_000;
const IO_QUEUES: usize = 10;

fn set_nofile(soft: u64, hard: u64) {
    let r = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads one rlimit from a struct we own.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
    assert_eq!(
        rc, 0,
        "cannot set RLIMIT_NOFILE to {soft}/{hard}: run as root or raise `ulimit -Hn`"
    );
}

fn hard_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into a struct we own.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    r.rlim_max
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_thousand_hosts_with_ten_io_queues_each_fit_the_default_limits() {
    let need = (HOSTS * (IO_QUEUES + 1)) as u64 + 1_024;
    let hard = hard_nofile().max(need);
    // The target inherits a shell's soft limit; this process needs the rest.
    set_nofile(1_024, hard);
    // Every host here shares one loopback address, which real hosts do not:
    // the per-address share (a quarter of max_connections by default, tested
    // in the node's tests/hostile.rs) is raised to the whole; every other
    // limit is the default.
    let t = LiveTarget::start_config(&format!(
        "[target]\nreactors = 1\nmax_connections_per_addr = {}\n\n\
         [[listener]]\naddr = \"127.0.0.1:0\"\n\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\n\
         [[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\"\n",
        trellis_node::config::DEFAULT_MAX_CONNECTIONS
    ));
    set_nofile(need, hard);
    let pid = t.child.id();
    let before = rss_kib(pid);
    let cfg = |h: usize| HostConfig {
        hostnqn: format!("nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0002-{h:012}"),
        ..HostConfig::default()
    };
    let started = Instant::now();
    let mut hosts = Vec::with_capacity(HOSTS);
    for h in 0..HOSTS {
        let mut c = Controller::connect(&t.addr(), NQN, &cfg(h))
            .unwrap_or_else(|e| panic!("host {h}: connect: {e}"));
        let qs: Vec<_> = (0..IO_QUEUES)
            .map(|q| {
                c.connect_io_queue(2, 4096)
                    .unwrap_or_else(|e| panic!("host {h}: I/O queue {q}: {e}"))
            })
            .collect();
        hosts.push((c, qs));
    }
    let after = rss_kib(pid);
    let qpairs = (HOSTS * (IO_QUEUES + 1)) as u64;
    eprintln!(
        "{HOSTS} hosts, {} I/O queue pairs ({qpairs} connections) in {:?}; target RSS {} -> {} MiB, {} KiB per queue pair",
        HOSTS * IO_QUEUES,
        started.elapsed(),
        before >> 10,
        after >> 10,
        (after - before) / qpairs
    );
    // Still serving: the last host's first queue completes a command.
    let (c, _) = hosts.last_mut().unwrap();
    c.identify_ns(1).expect("identify on the last host");
}
