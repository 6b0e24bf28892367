//! `trellis bench takeover`: processor-node takeover under a verified
//! workload (docs/bench.md "Processor-node takeover", issue 37 item 5).
//!
//! Host A, a child process of this one, claims the namespace (Register,
//! Acquire Write Exclusive) and writes verified blocks round robin at queue
//! depth `--iodepth`, printing one line per completion. At `--run-time` this
//! process kills A (SIGKILL) or freezes it (SIGSTOP), and as host B takes
//! the namespace over with Preempt and Abort (`trellis_host::resv::take_over`).
//! Then, as B:
//! 1. reads every block: each holds A's last acknowledged write to it, or a
//!    later one of A's that was in flight (else an acknowledged write of A
//!    was lost);
//! 2. reads every block again after a settle time (nothing may have
//!    changed: B has not written yet), then writes its own marker to every
//!    block;
//! 3. for a freeze, thaws A and lets it run `--thaw-time` (everything A had
//!    in flight or sends now must fail), then kills it;
//! 4. reads every block again: each must still hold B's marker (else a
//!    write of A landed after the takeover). A write A submitted after the
//!    takeover and saw succeed is a violation too.
//!
//! A and B share CLOCK_MONOTONIC, so A's submit times compare with B's
//! takeover time. The result is JSON (`--json`); any violation fails the run.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use trellis_host::resv::{claim, is_conflict, register_key, release, take_over};
use trellis_host::{Controller, HostConfig, Queue, Xfer};
use trellis_nvme::resv::{RType, ReleaseAction};
use trellis_nvme::sqe::io;
use trellis_nvme::Sqe;

/// Reservation keys of the two hosts (any distinct non-zero values).
const KEY_A: u64 = 0xA11CE;
const KEY_B: u64 = 0xB0B;
/// Verify seeds of A's writes and of B's markers.
const SEED_A: u32 = 0xA;
const SEED_B: u32 = 0xB;
/// The most blocks a run tracks (one generation each in memory).
pub const MAX_BLOCKS: u64 = 1 << 20;
/// The deepest queue A may keep.
pub const MAX_IODEPTH: u32 = 128;
/// How long the run waits for A to say it holds the namespace.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(clap::Args, Debug, Clone)]
pub struct TakeoverArgs {
    /// Target address, HOST:PORT.
    #[arg(long)]
    pub addr: String,
    /// Subsystem NQN.
    #[arg(long, default_value = "nqn.2026-11.io.trellis:default")]
    pub nqn: String,
    #[arg(long, default_value_t = 1)]
    pub nsid: u32,
    /// How host A fails: kill (SIGKILL) or freeze (SIGSTOP, thawed after
    /// the takeover).
    #[arg(long, default_value = "kill")]
    pub fault: String,
    /// Blocks A writes round robin, from LBA 0 (at least 2 × --iodepth).
    #[arg(long, default_value_t = 256)]
    pub blocks: u64,
    /// A's writes in flight.
    #[arg(long, default_value_t = 8)]
    pub iodepth: u32,
    /// How long A writes before the fault: 2s, 500ms.
    #[arg(long = "run-time", default_value = "2s")]
    pub run_time: String,
    /// With --fault freeze: how long A runs after it is thawed.
    #[arg(long = "thaw-time", default_value = "1s")]
    pub thaw_time: String,
    /// Write the result as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Internal: run as host A (the child this command starts).
    #[arg(long, hide = true)]
    pub role_a: bool,
}

/// What a takeover run measured.
#[derive(Debug, Default, serde::Serialize)]
pub struct TakeoverReport {
    pub fault: String,
    pub blocks: u64,
    /// From the fault (SIGKILL or SIGSTOP sent) to B's Preempt and Abort
    /// completed: B's connect (TCP, ICReq, Connect, Identify, its I/O
    /// queue) and `acquire_ms`.
    pub takeover_ms: f64,
    /// Register, Preempt and Abort (with its wait for A's commands) and the
    /// Report that confirms B holds the reservation.
    pub acquire_ms: f64,
    /// Writes of A acknowledged before the takeover.
    pub a_writes_acked: u64,
    /// Blocks whose last acknowledged write of A was not there after the takeover.
    pub a_acked_writes_lost: u64,
    /// Writes A submitted after the takeover that still succeeded.
    pub a_writes_acked_after_takeover: u64,
    /// Blocks where a write of A replaced B's marker after the takeover.
    pub a_writes_landed_after_takeover: u64,
    /// A's writes that failed with Reservation Conflict (frozen runs: after the thaw).
    pub a_writes_refused: u64,
    /// A's writes that failed with another status.
    pub a_writes_failed_other: u64,
    /// The first few violations, described.
    pub violations: Vec<String>,
}

pub fn run(a: &TakeoverArgs) -> Result<()> {
    check(a)?;
    if a.role_a {
        return host_a(a);
    }
    if let Some(p) = &a.json {
        crate::cli::check_output_path(p)?;
    }
    let r = drive(a)?;
    println!(
        "takeover ({}): {:.1} ms; A: {} writes acknowledged, {} lost, {} acknowledged after the takeover, {} landed after it, {} refused",
        r.fault,
        r.takeover_ms,
        r.a_writes_acked,
        r.a_acked_writes_lost,
        r.a_writes_acked_after_takeover,
        r.a_writes_landed_after_takeover,
        r.a_writes_refused
    );
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&r)?)
            .with_context(|| format!("writing the result to {}", p.display()))?;
    }
    if !r.violations.is_empty() {
        bail!("takeover broke its guarantees: {}", r.violations.join("; "));
    }
    Ok(())
}

fn check(a: &TakeoverArgs) -> Result<()> {
    if a.fault != "kill" && a.fault != "freeze" {
        bail!("--fault {:?}: use kill or freeze", a.fault);
    }
    if a.iodepth == 0 || a.iodepth > MAX_IODEPTH {
        bail!("--iodepth {}: use 1 to {MAX_IODEPTH}", a.iodepth);
    }
    if a.blocks < 2 * a.iodepth as u64 || a.blocks > MAX_BLOCKS {
        bail!(
            "--blocks {}: use {} to {MAX_BLOCKS} (at least twice --iodepth, so no two writes in flight share a block)",
            a.blocks,
            2 * a.iodepth
        );
    }
    crate::job::parse_duration(&a.run_time).context("--run-time")?;
    crate::job::parse_duration(&a.thaw_time).context("--thaw-time")?;
    Ok(())
}

/// CLOCK_MONOTONIC in ns: the clock A and B share (Instant's epoch is per
/// process, so it cannot be compared across them).
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

fn host_cfg(name: &str) -> HostConfig {
    let hostnqn = format!("nqn.2014-08.org.nvmexpress:uuid:trellis-takeover-{name}");
    HostConfig {
        hostid: trellis_host::ctrl::hostid_from(&hostnqn),
        hostnqn,
        kato_ms: 0,
        ..Default::default()
    }
}

/// A connected host: its controller (kept alive) and one I/O queue, and
/// the namespace's block size.
struct Host {
    _ctrl: Controller,
    q: Queue,
    block_bytes: usize,
}

fn connect(a: &TakeoverArgs, name: &str, qd: u32) -> Result<Host> {
    let mut ctrl = Controller::connect(&a.addr, &a.nqn, &host_cfg(name))
        .with_context(|| format!("host {name}: connecting to {}", a.addr))?;
    let ns = ctrl.identify_ns(a.nsid)?;
    let block_bytes = 1usize << ns.lbads;
    if ns.nsze < a.blocks {
        bail!(
            "--blocks {}: namespace {} has {} blocks",
            a.blocks,
            a.nsid,
            ns.nsze
        );
    }
    ctrl.set_num_queues(1)?;
    let depth = u16::try_from(qd + 1).unwrap_or(u16::MAX);
    let q = ctrl.connect_io_queue(depth, block_bytes.max(4096))?;
    Ok(Host {
        _ctrl: ctrl,
        q,
        block_bytes,
    })
}

/// Host A: claims the namespace, then writes round robin until killed,
/// printing `ACK lba gen submit_ns`, `CONFLICT lba gen submit_ns` or
/// `FAIL lba gen submit_ns status` per completion.
fn host_a(a: &TakeoverArgs) -> Result<()> {
    let mut h = connect(a, "a", a.iodepth)?;
    claim(&mut h.q, a.nsid, KEY_A, RType::WriteExclusive).context("host A: claiming")?;
    let out = std::io::stdout();
    let mut out = out.lock();
    writeln!(out, "READY")?;
    out.flush()?;
    // slot -> (lba, gen, submit_ns)
    let mut inflight = std::collections::HashMap::new();
    let mut next: u64 = 0;
    loop {
        while inflight.len() < a.iodepth as usize {
            let (lba, gen) = (next % a.blocks, (next / a.blocks + 1) as u32);
            let Some(slot) = h.q.alloc() else { break };
            let bs = h.block_bytes;
            crate::verify::fill_block(&mut h.q.buf_mut(slot)[..bs], lba, gen, SEED_A);
            let sqe = Sqe::rw(io::WRITE, 0, a.nsid, lba, 1, false);
            let t = mono_ns();
            h.q.submit(slot, sqe, Xfer::ToCtrl(bs as u32), Instant::now())?;
            inflight.insert(slot, (lba, gen, t));
            next += 1;
        }
        h.q.poll(Instant::now())?;
        while let Some(c) = h.q.next_completion() {
            h.q.free(c.slot);
            let Some((lba, gen, t)) = inflight.remove(&c.slot) else {
                continue;
            };
            match c.status {
                s if s.is_success() => writeln!(out, "ACK {lba} {gen} {t}")?,
                s if is_conflict(s) => writeln!(out, "CONFLICT {lba} {gen} {t}")?,
                s => writeln!(out, "FAIL {lba} {gen} {t} {}", s.name())?,
            }
        }
        out.flush()?;
    }
}

/// One line of A's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ack,
    Conflict,
    Fail,
}

#[derive(Clone, Copy, Debug)]
struct Line {
    what: Outcome,
    lba: u64,
    gen: u32,
    submit_ns: u64,
}

fn parse_line(l: &str) -> Option<Line> {
    let mut w = l.split_whitespace();
    let what = match w.next()? {
        "ACK" => Outcome::Ack,
        "CONFLICT" => Outcome::Conflict,
        "FAIL" => Outcome::Fail,
        _ => return None,
    };
    Some(Line {
        what,
        lba: w.next()?.parse().ok()?,
        gen: w.next()?.parse().ok()?,
        submit_ns: w.next()?.parse().ok()?,
    })
}

/// Host A as a child process and the lines it printed so far.
struct ChildA {
    child: Child,
    /// Waited for: its pid may belong to another process now.
    reaped: bool,
    lines: Arc<Mutex<Vec<Line>>>,
    ready: Arc<Mutex<bool>>,
}

fn spawn_a(a: &TakeoverArgs) -> Result<ChildA> {
    let exe = std::env::current_exe().context("finding this program to start host A")?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "bench", "takeover", "--role-a", "--addr", &a.addr, "--nqn", &a.nqn,
    ])
    .args([
        "--nsid",
        &a.nsid.to_string(),
        "--blocks",
        &a.blocks.to_string(),
    ])
    .args(["--iodepth", &a.iodepth.to_string()])
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    let mut child = cmd.spawn().context("starting host A")?;
    let stdout = child.stdout.take().context("host A's output")?;
    let (lines, ready) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(Mutex::new(false)),
    );
    let (l2, r2) = (lines.clone(), ready.clone());
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            if l == "READY" {
                *r2.lock().unwrap_or_else(|e| e.into_inner()) = true;
            } else if let Some(x) = parse_line(&l) {
                l2.lock().unwrap_or_else(|e| e.into_inner()).push(x);
            }
        }
    });
    Ok(ChildA {
        child,
        reaped: false,
        lines,
        ready,
    })
}

impl ChildA {
    fn wait_ready(&mut self) -> Result<()> {
        let end = Instant::now() + READY_TIMEOUT;
        while !*self.ready.lock().unwrap_or_else(|e| e.into_inner()) {
            if let Some(st) = self.child.try_wait()? {
                bail!("host A exited ({st}) before it claimed the namespace");
            }
            if Instant::now() > end {
                bail!("host A did not claim the namespace within {READY_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
    fn signal(&self, sig: libc::c_int) {
        if self.reaped {
            return;
        }
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on our own child's pid, which we have not reaped.
        unsafe { libc::kill(pid, sig) };
    }
    /// Every line A printed, once its output is drained (`settle`: how long
    /// to wait for more).
    fn lines_after(&self, settle: Duration) -> Vec<Line> {
        let mut n = usize::MAX;
        loop {
            let now = self.lines.lock().unwrap_or_else(|e| e.into_inner()).len();
            if now == n {
                return self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone();
            }
            n = now;
            std::thread::sleep(settle);
        }
    }
}

impl ChildA {
    /// Kills A (SIGKILL) and waits for it.
    fn kill(&mut self) -> Result<()> {
        if !self.reaped {
            self.signal(libc::SIGCONT);
            self.child.kill().context("killing host A")?;
            self.child.wait()?;
            self.reaped = true;
        }
        Ok(())
    }
}

impl Drop for ChildA {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

fn drive(a: &TakeoverArgs) -> Result<TakeoverReport> {
    let run_time = crate::job::parse_duration(&a.run_time)?;
    let thaw_time = crate::job::parse_duration(&a.thaw_time)?;
    clear(a, &mut connect(a, "b", 1)?)?;
    let mut child = spawn_a(a)?;
    child.wait_ready()?;
    std::thread::sleep(run_time);
    let freeze = a.fault == "freeze";
    let t_fault = Instant::now();
    if freeze {
        child.signal(libc::SIGSTOP);
    } else {
        child.kill()?;
    }
    let mut b = connect(a, "b", 1)?;
    let t_acquire = Instant::now();
    take_over(&mut b.q, a.nsid, KEY_B, KEY_A, RType::WriteExclusive)
        .context("host B: Preempt and Abort")?;
    let takeover_ns = mono_ns();
    let mut r = TakeoverReport {
        fault: a.fault.clone(),
        blocks: a.blocks,
        takeover_ms: t_fault.elapsed().as_secs_f64() * 1e3,
        acquire_ms: t_acquire.elapsed().as_secs_f64() * 1e3,
        ..Default::default()
    };
    let before = child.lines_after(Duration::from_millis(100));
    let seen = check_acked(a, &mut b, &before, &mut r)?;
    // A write of A landing between the takeover and B's marker would be
    // overwritten unseen: read again after a settle time first.
    std::thread::sleep(SETTLE);
    check_unchanged(a, &mut b, &seen, &mut r)?;
    write_markers(a, &mut b)?;
    if freeze {
        child.signal(libc::SIGCONT);
        std::thread::sleep(thaw_time);
        child.kill()?;
    }
    let all = child.lines_after(Duration::from_millis(100));
    count_outcomes(&all, takeover_ns, &mut r);
    check_markers(a, &mut b, &mut r)?;
    clear(a, &mut b)?;
    Ok(r)
}

/// Clears every registration and the reservation (Reservation Release,
/// Clear), so each run starts from, and leaves, a namespace nobody holds.
fn clear(a: &TakeoverArgs, b: &mut Host) -> Result<()> {
    register_key(&mut b.q, a.nsid, KEY_B).context("host B: registering")?;
    release(&mut b.q, a.nsid, ReleaseAction::Clear, 0, KEY_B)
        .context("host B: clearing the reservation")?;
    Ok(())
}

/// The last acknowledged generation of A's writes to each block.
fn acked_gens(blocks: u64, lines: &[Line]) -> Vec<u32> {
    let mut g = vec![0u32; blocks as usize];
    for l in lines.iter().filter(|l| l.what == Outcome::Ack) {
        if let Some(x) = g.get_mut(l.lba as usize) {
            *x = (*x).max(l.gen);
        }
    }
    g
}

fn read_block(a: &TakeoverArgs, h: &mut Host, lba: u64) -> Result<Vec<u8>> {
    let mut out = vec![0u8; h.block_bytes];
    let sqe = Sqe::rw(io::READ, 0, a.nsid, lba, 1, false);
    h.q.exec_ok(sqe, Xfer::FromCtrl(h.block_bytes as u32), &[], &mut out)
        .with_context(|| format!("host B: reading LBA {lba}"))?;
    Ok(out)
}

/// The generation of A's write a block holds (None: no write of A).
fn a_generation(b: &[u8], lba: u64) -> Option<u32> {
    let gen = u32::from_le_bytes(b.get(16..20)?.try_into().ok()?);
    crate::verify::check_block(b, lba, gen, SEED_A).ok()?;
    Some(gen)
}

fn violation(r: &mut TakeoverReport, what: String) {
    if r.violations.len() < 8 {
        r.violations.push(what);
    }
}

/// Checks every block holds A's last acknowledged write or a later one;
/// returns what each block held.
fn check_acked(
    a: &TakeoverArgs,
    b: &mut Host,
    lines: &[Line],
    r: &mut TakeoverReport,
) -> Result<Vec<Vec<u8>>> {
    let acked = acked_gens(a.blocks, lines);
    let mut seen = Vec::with_capacity(a.blocks as usize);
    r.a_writes_acked = lines.iter().filter(|l| l.what == Outcome::Ack).count() as u64;
    for (lba, &want) in (0..a.blocks).zip(&acked) {
        seen.push(read_block(a, b, lba)?);
        if want == 0 {
            continue;
        }
        let found = seen.last().and_then(|blk| a_generation(blk, lba));
        if found.is_none_or(|g| g < want) {
            r.a_acked_writes_lost += 1;
            violation(
                r,
                format!("LBA {lba}: A's acknowledged generation {want} lost (found {found:?})"),
            );
        }
    }
    Ok(seen)
}

/// How long after the takeover B reads every block a second time.
const SETTLE: Duration = Duration::from_millis(300);

/// No block changed since `seen` was read, after the takeover: nothing of
/// A's landed in between (B wrote nothing yet).
fn check_unchanged(
    a: &TakeoverArgs,
    b: &mut Host,
    seen: &[Vec<u8>],
    r: &mut TakeoverReport,
) -> Result<()> {
    for (lba, old) in (0..a.blocks).zip(seen) {
        let now = read_block(a, b, lba)?;
        if &now != old {
            r.a_writes_landed_after_takeover += 1;
            let (was, is) = (a_generation(old, lba), a_generation(&now, lba));
            violation(
                r,
                format!(
                    "LBA {lba} changed after the takeover: A's generation {was:?} became {is:?}"
                ),
            );
        }
    }
    Ok(())
}

fn write_markers(a: &TakeoverArgs, b: &mut Host) -> Result<()> {
    let mut buf = vec![0u8; b.block_bytes];
    for lba in 0..a.blocks {
        crate::verify::fill_block(&mut buf, lba, 0, SEED_B);
        let sqe = Sqe::rw(io::WRITE, 0, a.nsid, lba, 1, false);
        b.q.exec_ok(sqe, Xfer::ToCtrl(b.block_bytes as u32), &buf, &mut [])
            .with_context(|| format!("host B: writing its marker to LBA {lba}"))?;
    }
    Ok(())
}

fn count_outcomes(lines: &[Line], takeover_ns: u64, r: &mut TakeoverReport) {
    for l in lines {
        match l.what {
            Outcome::Ack if l.submit_ns > takeover_ns => {
                r.a_writes_acked_after_takeover += 1;
                let what = format!("A's write of LBA {} generation {} was submitted after the takeover and succeeded", l.lba, l.gen);
                violation(r, what);
            }
            Outcome::Ack => {}
            Outcome::Conflict => r.a_writes_refused += 1,
            Outcome::Fail => r.a_writes_failed_other += 1,
        }
    }
}

fn check_markers(a: &TakeoverArgs, b: &mut Host, r: &mut TakeoverReport) -> Result<()> {
    for lba in 0..a.blocks {
        let blk = read_block(a, b, lba)?;
        if crate::verify::check_block(&blk, lba, 0, SEED_B).is_err() {
            r.a_writes_landed_after_takeover += 1;
            let found = a_generation(&blk, lba);
            violation(
                r,
                format!(
                    "LBA {lba}: B's marker replaced after the takeover (A's generation {found:?})"
                ),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_the_last_ack_per_block_counts() {
        let l = |s| parse_line(s).unwrap();
        let lines = [
            l("ACK 3 1 10"),
            l("ACK 3 2 20"),
            l("CONFLICT 3 3 30"),
            l("FAIL 1 1 5 Internal Error"),
        ];
        assert_eq!(acked_gens(4, &lines), vec![0, 0, 0, 2]);
        assert!(parse_line("READY").is_none() && parse_line("ACK x 1 2").is_none());
        let mut r = TakeoverReport::default();
        count_outcomes(&lines, 15, &mut r);
        assert_eq!(
            r.a_writes_acked_after_takeover, 1,
            "ACK 3 2 was submitted at 20 > 15"
        );
        assert_eq!((r.a_writes_refused, r.a_writes_failed_other), (1, 1));
        assert_eq!(r.violations.len(), 1);
    }

    #[test]
    fn a_generation_reads_only_a_writes() {
        let mut b = vec![0u8; 512];
        crate::verify::fill_block(&mut b, 7, 5, SEED_A);
        assert_eq!(a_generation(&b, 7), Some(5));
        assert_eq!(a_generation(&b, 8), None);
        crate::verify::fill_block(&mut b, 7, 0, SEED_B);
        assert_eq!(a_generation(&b, 7), None);
    }
}
