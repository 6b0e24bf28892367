//! Idle cost and wake-up (issue 36 item 6): what an idle target costs per
//! reactor, and how much slower the first read after an idle gap is than a
//! warm one. Pollers that spin on idle cores are the complaint operators
//! have of SPDK-style targets (Mayastor's io-engine burns whole cores when
//! idle); a reactor that sleeps instead pays on the first I/O after it.
//!
//! One host, one I/O queue, 4 KiB reads at QD1, busy-polled on the host
//! side so the host adds no wake-up of its own: `warm_reads` back to back
//! (the warm figure is their median), then per gap: the target's reactor
//! threads' CPU time over `gap` of silence, then one read (the wake-up
//! figure), then the warm reads again.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use trellis_host::{Controller, HostConfig, Queue, Xfer};
use trellis_nvme::sqe::io;
use trellis_nvme::Sqe;

/// What one wake-up run measured.
#[derive(Serialize, Clone, Debug, Default)]
pub struct WakeupReport {
    pub gap_s: f64,
    pub gaps: usize,
    /// Median latency of back-to-back 4 KiB QD1 reads, µs.
    pub warm_lat_us_p50: f64,
    /// Latency of the first read after each gap, µs.
    pub wake_lat_us: Vec<f64>,
    pub wake_lat_us_median: f64,
    /// wake median / warm median.
    pub wake_over_warm: f64,
    /// Per reactor thread: CPU share over the idle gaps, % of one CPU.
    pub idle_cpu_pct_per_reactor: Vec<f64>,
}

/// Bounds: a gap of 0.1 to 600 s, 1 to 100 gaps, 10 to 1 M warm reads.
pub const MAX_GAP_S: f64 = 600.0;
pub const MAX_GAPS: usize = 100;
pub const MAX_WARM_READS: usize = 1_000_000;

/// Runs the measurement against `addr`/`nqn`, namespace 1, with the
/// target's PID (for its reactor threads' CPU time).
pub fn run(
    addr: &str,
    nqn: &str,
    pid: u32,
    gap: Duration,
    gaps: usize,
    warm_reads: usize,
) -> Result<WakeupReport> {
    check(gap, gaps, warm_reads)?;
    let hostnqn = "nqn.2014-08.org.nvmexpress:uuid:trellis-bench-wakeup".to_string();
    let cfg = HostConfig {
        hostid: trellis_host::ctrl::hostid_from(&hostnqn),
        hostnqn,
        kato_ms: 0, // no keep-alive in the gap: the gap stays silent
        ..Default::default()
    };
    let mut ctrl = Controller::connect(addr, nqn, &cfg)
        .with_context(|| format!("wake-up: connecting to {addr}"))?;
    let ns = ctrl.identify_ns(1)?;
    let blocks = (READ_BYTES >> ns.lbads.min(12)).max(1) as u32;
    ctrl.set_num_queues(1)?;
    let mut q = ctrl.connect_io_queue(2, READ_BYTES as usize)?;
    let mut q = Reader { q: &mut q, blocks };
    let mut warm = Vec::with_capacity(warm_reads * (gaps + 1));
    let (mut wake, mut idle_s) = (Vec::new(), Vec::<f64>::new());
    warm_batch(&mut q, warm_reads, &mut warm)?;
    for _ in 0..gaps {
        let before = reactor_cpu_s(pid)?;
        let t0 = Instant::now();
        std::thread::sleep(gap);
        let after = reactor_cpu_s(pid)?;
        let secs = t0.elapsed().as_secs_f64();
        if idle_s.is_empty() {
            idle_s = vec![0.0; after.len()];
        }
        for (k, (a, b)) in after.iter().zip(before.iter()).enumerate() {
            if let Some(s) = idle_s.get_mut(k) {
                *s += (a - b) / secs;
            }
        }
        wake.push(read_once(&mut q, 0)?);
        warm_batch(&mut q, warm_reads, &mut warm)?;
    }
    let (w, k) = (median(&mut warm), median(&mut wake.clone()));
    Ok(WakeupReport {
        gap_s: gap.as_secs_f64(),
        gaps,
        warm_lat_us_p50: w,
        wake_lat_us: wake,
        wake_lat_us_median: k,
        wake_over_warm: if w > 0.0 { k / w } else { 0.0 },
        idle_cpu_pct_per_reactor: idle_s
            .iter()
            .map(|s| 100.0 * s / gaps.max(1) as f64)
            .collect(),
    })
}

fn check(gap: Duration, gaps: usize, warm_reads: usize) -> Result<()> {
    let g = gap.as_secs_f64();
    if !(0.1..=MAX_GAP_S).contains(&g) {
        bail!("wake-up gap {g} s: use 0.1 to {MAX_GAP_S} s");
    }
    if !(1..=MAX_GAPS).contains(&gaps) {
        bail!("wake-up gaps {gaps}: use 1 to {MAX_GAPS}");
    }
    if !(10..=MAX_WARM_READS).contains(&warm_reads) {
        bail!("wake-up warm reads {warm_reads}: use 10 to {MAX_WARM_READS}");
    }
    Ok(())
}

/// Bytes per read.
const READ_BYTES: u64 = 4096;

/// The I/O queue and the read's length in the namespace's blocks.
struct Reader<'a> {
    q: &'a mut Queue,
    blocks: u32,
}

fn warm_batch(r: &mut Reader, n: usize, out: &mut Vec<f64>) -> Result<()> {
    for i in 0..n {
        out.push(read_once(r, (i as u64 * 7919) % 4096)?);
    }
    Ok(())
}

/// One 4 KiB read at the `k`th 4 KiB of the namespace, busy-polled; its
/// latency in µs.
fn read_once(r: &mut Reader, k: u64) -> Result<f64> {
    let q = &mut *r.q;
    let slot = q.alloc().context("wake-up: no free slot")?;
    let sqe = Sqe::rw(io::READ, 0, 1, k * r.blocks as u64, r.blocks, false);
    let t0 = Instant::now();
    q.submit(slot, sqe, Xfer::FromCtrl(READ_BYTES as u32), t0)?;
    let deadline = t0 + Duration::from_secs(10);
    loop {
        let now = Instant::now();
        q.poll(now)?;
        if let Some(c) = q.next_completion() {
            let us = t0.elapsed().as_secs_f64() * 1e6;
            q.free(c.slot);
            if !c.status.is_success() {
                bail!("wake-up read failed: {:?}", c.status);
            }
            return Ok(us);
        }
        if now > deadline {
            bail!("wake-up read: no completion in 10 s");
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// CPU seconds (user + system) of each `reactor-*` thread of `pid`, in
/// thread-name order.
fn reactor_cpu_s(pid: u32) -> Result<Vec<f64>> {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let p = e?.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if !comm.starts_with("reactor-") {
            continue;
        }
        let stat = std::fs::read_to_string(p.join("stat"))?;
        out.push((comm.trim().to_string(), stat_cpu_s(&stat)?));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out.into_iter().map(|(_, s)| s).collect())
}

/// utime + stime of a /proc stat line, in seconds.
fn stat_cpu_s(stat: &str) -> Result<f64> {
    let at = stat.rfind(')').context("malformed stat")?;
    let f: Vec<&str> = stat
        .get(at + 2..)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    // f[0] is field 3 (state); utime is field 14, stime field 15.
    let (u, s) = (
        f.get(11).context("stat: no utime")?,
        f.get(12).context("stat: no stime")?,
    );
    // SAFETY: sysconf takes no pointers and is always safe to call.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((u.parse::<f64>()? + s.parse::<f64>()?) / hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_user_plus_system_time() {
        // A thread name with a space and a parenthesis, as comm allows.
        let line = "123 (reactor-0 (x)) S 1 1 1 0 -1 0 0 0 0 0 250 50 0 0 20 0 1 0";
        // SAFETY: sysconf takes no pointers and is always safe to call.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        assert_eq!(stat_cpu_s(line).unwrap(), 300.0 / hz);
        assert!(
            stat_cpu_s("123 (x) S 1").is_err(),
            "a short line is an error, not a panic"
        );
    }

    #[test]
    fn bounds_are_checked_with_the_range_named() {
        let e = check(Duration::from_millis(10), 1, 100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("0.1 to 600"), "{e}");
        assert!(check(Duration::from_secs(1), 0, 100).is_err());
        assert!(check(Duration::from_secs(1), 1, 5).is_err());
        assert!(check(Duration::from_secs(10), 3, 1000).is_ok());
    }
}
