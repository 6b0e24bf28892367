//! Multipath (`--paths`): a path that fails, or that a completion's ANA
//! status closes, hands its commands to another path; failed paths are
//! re-opened in the background with backoff, and the main thread's ANA
//! readings are applied to the path set.

use std::time::Instant;

use trellis_nvme::ana::AnaState;
use trellis_path::multipath::{PathPolicy, PathSet};

use super::{Io, QueueCtx, Worker, PATH_TICK, RECONNECT_BACKOFF_MAX, RECONNECT_BACKOFF_MIN};
use crate::job::{JobSpec, ReplicaRead};

/// The ANA state a path-related completion status implies (SCT 3h), None for
/// any other status.
pub(super) fn ana_state_of(st: trellis_nvme::Status) -> Option<AnaState> {
    use trellis_nvme::status::path;
    [
        (path::ANA_INACCESSIBLE, AnaState::Inaccessible),
        (path::ANA_PERSISTENT_LOSS, AnaState::PersistentLoss),
        (path::ANA_TRANSITION, AnaState::Change),
    ]
    .into_iter()
    .find(|(p, _)| (p.sct(), p.sc()) == (st.sct(), st.sc()))
    .map(|(_, a)| a)
}

/// A multipath volume's paths, as `--path-policy` and `--path-rate` say.
pub(super) fn path_set(job: &JobSpec, paths: usize) -> PathSet {
    let policy = match job.replica_read {
        ReplicaRead::Isr => PathPolicy::Isr,
        ReplicaRead::QueueDepth => PathPolicy::QueueDepth,
        ReplicaRead::RoundRobin | ReplicaRead::Headroom => PathPolicy::RoundRobin,
    };
    let rate = (job.path_rate_bytes_per_s > 0).then_some(job.path_rate_bytes_per_s);
    PathSet::new(paths.min(trellis_path::replica::MAX_PATHS), policy, rate)
}

impl Worker {
    /// A multipath command ended with a path-related status (NVMe Base 2.0
    /// §8.1.1: the namespace is not accessible through this controller now):
    /// the path takes the ANA state the status implies, and the command goes
    /// to another path, as Linux's `nvme_failover_req` does. Not an error: no
    /// data moved, and another path may serve it.
    pub(super) fn move_off_path(&mut self, qi: usize, slot: u16, io: Io, state: AnaState) -> bool {
        let n = self.groups.len();
        if let Some(ps) = self.pathset.as_mut() {
            ps.set_ana(qi / n, state);
        }
        self.queues[qi].q.free(slot);
        self.retry.push((qi % n, Io { grant: 0, ..io }));
        self.res.ana_moves += 1;
        false
    }

    /// Path `qi` of a multipath volume failed (`why`): it is never used
    /// again, and its commands in flight wait in `retry` for a live path of
    /// their group. Re-sending is safe: a read has no effect, and a write's
    /// blocks stay reserved while it is out (no other command touches them),
    /// so writing the same data again leaves what a completed first attempt
    /// would have. Err only when no path of the group is left.
    pub(super) fn fail_path(&mut self, qi: usize, why: String) -> Result<(), String> {
        let n = self.groups.len();
        let path = qi / n;
        // The path goes down as a whole: its other queues share its link.
        let mut moved = 0;
        for g in 0..n {
            let qc = &mut self.queues[path * n + g];
            // Reset the connection, dropping what the kernel has not sent:
            // a write re-sent below must not be overtaken later by its stale
            // original once the link is back.
            if !qc.down {
                qc.q.abort();
            }
            qc.down = true;
            for (slot, busy) in qc.busy.iter_mut().enumerate() {
                if std::mem::take(busy) {
                    // Its grant dies with the path; it reserves again where it goes.
                    self.retry.push((
                        g,
                        Io {
                            grant: 0,
                            ..qc.ios[slot]
                        },
                    ));
                    moved += 1;
                }
            }
            qc.inflight = 0;
        }
        if let Some(ps) = self.pathset.as_mut() {
            ps.set_down(path, true);
        }
        self.res.path_failures += 1;
        self.res.first_path_error.get_or_insert_with(|| {
            format!("path {} failed: {why}; {moved} commands moved", path + 1)
        });
        if !self.res.failed_paths.contains(&(path as u32)) {
            self.res.failed_paths.push(path as u32);
        }
        if let Some(p) = self.paths.get_mut(path) {
            p.down = true;
            p.ctrl = None;
            p.backoff = RECONNECT_BACKOFF_MIN;
            p.next_try = Instant::now() + RECONNECT_BACKOFF_MIN;
        }
        let live = (0..self.replicas).any(|r| !self.queues[r * n].down);
        if !live {
            return Err(format!("every path failed; the last: {why}"));
        }
        Ok(())
    }

    /// Paths that were down when the run started: their place-holder queues
    /// are never polled, and `tend_paths` opens them as soon as it can.
    pub(super) fn mark_down_at_start(&mut self) {
        let n = self.groups.len();
        for r in 0..self.paths.len() {
            if self.paths[r].down {
                for g in 0..n {
                    self.queues[r * n + g].down = true;
                }
                if let Some(ps) = self.pathset.as_mut() {
                    ps.set_down(r, true);
                }
                if !self.res.failed_paths.contains(&(r as u32)) {
                    self.res.failed_paths.push(r as u32);
                }
            }
        }
    }

    /// Re-opens failed paths in the background (backoff from
    /// RECONNECT_BACKOFF_MIN doubling to RECONNECT_BACKOFF_MAX), puts a
    /// re-opened path back in use, and lets re-opened controllers send their
    /// Keep Alives. A Keep Alive failure takes the path down again.
    pub(super) fn tend_paths(&mut self, now: Instant) -> Result<(), String> {
        self.sync_ana();
        let n = self.groups.len();
        for r in 0..self.paths.len() {
            let p = &mut self.paths[r];
            if !p.down {
                if now.saturating_duration_since(p.last_tick) >= PATH_TICK {
                    p.last_tick = now;
                    if let Some(Err(e)) = p.ctrl.as_mut().map(|c| c.tick()) {
                        self.fail_path(r * n, format!("keep alive: {e}"))?;
                    }
                }
                continue;
            }
            if let Some(rx) = &p.pending {
                match rx.try_recv() {
                    Err(std::sync::mpsc::TryRecvError::Empty) => continue,
                    Ok(Ok((ctrl, qs, ana))) if qs.len() == n => {
                        if let (Some(ps), Some(a)) = (self.pathset.as_mut(), ana) {
                            ps.set_ana(r, a);
                        }
                        p.pending = None;
                        p.down = false;
                        p.ctrl = Some(ctrl);
                        p.last_tick = now;
                        for (g, (q, depth)) in qs.into_iter().enumerate() {
                            self.queues[r * n + g] = QueueCtx::new(q, depth);
                        }
                        p.ios_since_reopen = 0;
                        if let Some(ps) = self.pathset.as_mut() {
                            ps.set_down(r, false);
                        }
                        self.res.path_reconnects.push(r as u32);
                        continue;
                    }
                    _ => {
                        // Failed (or the helper died): wait longer.
                        p.pending = None;
                        p.backoff = (p.backoff * 2).min(RECONNECT_BACKOFF_MAX);
                        p.next_try = now + p.backoff;
                        continue;
                    }
                }
            }
            if now >= p.next_try {
                let (tx, rx) = std::sync::mpsc::channel();
                let c = p.connector.clone();
                std::thread::spawn(move || {
                    let _ = tx.send(c.connect());
                });
                p.pending = Some(rx);
            }
        }
        Ok(())
    }

    /// Applies the main thread's latest reading of the paths' ANA states
    /// (known ones only: a path whose controller the main thread lost keeps
    /// the state this worker saw when it re-opened it).
    pub(super) fn sync_ana(&mut self) {
        let (Some(board), Some(ps)) = (self.ana.as_ref(), self.pathset.as_mut()) else {
            return;
        };
        let seq = board.seq();
        if seq == self.ana_seq {
            return;
        }
        self.ana_seq = seq;
        for p in 0..board.paths().min(ps.paths()) {
            if let Some(a) = board.state(p) {
                ps.set_ana(p, a);
            }
        }
    }

    /// Re-sends the moved I/Os of group `g` on live paths; false while some
    /// still wait (then nothing new is issued before them).
    pub(super) fn resend_moved(&mut self, g: usize) -> Result<bool, String> {
        let mut k = 0;
        let now = Instant::now();
        while k < self.retry.len() {
            if self.retry[k].0 != g {
                k += 1;
                continue;
            }
            let (op, nlb) = (self.retry[k].1.op, self.retry[k].1.nlb);
            let Some(qi) = self.pick_replica(g, op, nlb) else {
                return Ok(false);
            };
            let (_, mut io) = self.retry.swap_remove(k);
            self.res.path_retries += 1;
            io.sent = now;
            io.grant = self.reserve_for(qi / self.groups.len(), &io);
            self.issue(qi, io)?;
        }
        Ok(true)
    }
}
