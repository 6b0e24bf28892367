//! Filling the queues: the rate limit, which replica or path each I/O goes
//! to (and the response rate it reserves there), and the submission itself
//! with the verify header written into each block.

use std::time::Instant;

use trellis_host::engine::rw_sqe;
use trellis_host::Xfer;
use trellis_nvme::sqe::io;
use trellis_path::replica::ReplicaState;

use super::{ns_since, Io, Op, Phase, ReplicatedWrite, Worker, BUSY, NO_WRITE};
use crate::job::MAX_REPLICAS;
use crate::verify::fill_block;

impl Worker {
    pub(super) fn rate_allows(&self, bytes: u64) -> bool {
        if self.rate_iops == 0.0 && self.rate_bytes == 0.0 {
            return true;
        }
        let t = self.rate_start.elapsed().as_secs_f64();
        (self.rate_iops == 0.0 || (self.issued_ios as f64) < self.rate_iops * t + 1.0)
            && (self.rate_bytes == 0.0
                || (self.issued_bytes as f64) < self.rate_bytes * t + bytes as f64)
    }

    /// Fills group `g` up to its depth.
    pub(super) fn top_up(&mut self, g: usize, phase: Phase) -> Result<(), String> {
        if self.replicas > 1 {
            return self.top_up_replicated(g, phase);
        }
        let t0 = Instant::now();
        while self.groups[g].inflight < self.groups[g].depth {
            if !self.queues[g].q.engine().may_submit() {
                // Busy: retried after this queue's next completion.
                self.res.credit_busy += 1;
                return Ok(());
            }
            // Ask the limiter before picking, so a refused I/O reserves nothing.
            if phase == Phase::Main && !self.rate_allows(self.job.min_bs() as u64) {
                return Ok(());
            }
            let Some((op, lba, nlb)) = self.next_io(phase) else {
                return Ok(());
            };
            let io = Io {
                op,
                lba,
                nlb,
                t0,
                sent: t0,
                write: NO_WRITE,
                grant: 0,
            };
            self.issue(g, io)?;
            self.count_issued(g, nlb);
        }
        Ok(())
    }

    pub(super) fn count_issued(&mut self, g: usize, nlb: u32) {
        self.groups[g].inflight += 1;
        self.issued_ios += 1;
        self.issued_bytes += nlb as u64 * self.block_size as u64;
    }

    /// A replicated group: a read goes to the replica `pick_replica` chooses,
    /// a write to every replica once each can take it. The operation is drawn
    /// before knowing whether a replica can take it, and kept until one can,
    /// so busy replicas do not bend the read/write mix.
    pub(super) fn top_up_replicated(&mut self, g: usize, phase: Phase) -> Result<(), String> {
        let t0 = Instant::now();
        let n = self.groups.len();
        if self.multipath && !self.resend_moved(g)? {
            return Ok(());
        }
        while self.groups[g].inflight < self.groups[g].depth {
            if phase == Phase::Main && !self.rate_allows(self.job.min_bs() as u64) {
                return Ok(());
            }
            let (op, nlb, drawn) = match self.groups[g].next_op.take() {
                Some(held) => held,
                None => {
                    let op = self.phase_op(phase);
                    (op, self.draw_nlb(phase), t0)
                }
            };
            let target = match op {
                Op::Read => self.pick_replica(g, op, nlb),
                Op::Write if self.multipath => self.pick_replica(g, op, nlb),
                Op::Write => (0..self.replicas)
                    .all(|r| self.queues[r * n + g].q.engine().may_submit())
                    .then_some(g),
            };
            let Some(qi) = target else {
                self.groups[g].next_op = Some((op, nlb, drawn));
                self.res.credit_busy += 1;
                return Ok(());
            };
            let Some((op, lba, nlb)) = self.next_io_sized(phase, op, nlb) else {
                return Ok(());
            };
            let mut io = Io {
                op,
                lba,
                nlb,
                t0: drawn,
                sent: t0,
                write: NO_WRITE,
                grant: 0,
            };
            if op == Op::Read || self.multipath {
                self.res.replica_reads[qi / n] += 1;
                if let Some(p) = self.paths.get_mut(qi / n) {
                    p.ios_since_reopen += 1;
                }
                io.grant = self.reserve_for(qi / n, &io);
                self.issue(qi, io)?;
            } else {
                let id = self
                    .free_writes
                    .pop()
                    .ok_or("no free replicated-write entry below the depth")?;
                self.writes[id as usize] = ReplicatedWrite {
                    parts_left: self.replicas as u32,
                    ok: true,
                };
                io.write = id;
                for r in 0..self.replicas {
                    self.issue(r * n + g, io)?;
                }
            }
            self.count_issued(g, nlb);
        }
        Ok(())
    }

    /// The queue (of group `g`) a read goes to, None when no replica may take
    /// one now: the group's `ReplicaChooser` (trellis_path::replica) decides
    /// from each replica's credits, depth and commands in flight.
    pub(super) fn pick_replica(&mut self, g: usize, op: Op, nlb: u32) -> Option<usize> {
        let n = self.groups.len();
        let mut states = [ReplicaState {
            may_submit: false,
            credit_limit: None,
            depth: 0,
            inflight: 0,
        }; MAX_REPLICAS];
        for (r, s) in states.iter_mut().enumerate().take(self.replicas) {
            let qc = &self.queues[r * n + g];
            let e = qc.q.engine();
            *s = ReplicaState {
                may_submit: !qc.down && e.may_submit(),
                credit_limit: e.credit_limit(),
                depth: qc.depth,
                inflight: qc.inflight,
            };
        }
        let read_len = (op == Op::Read).then_some(nlb * self.block_size);
        let now = ns_since(self.t_start);
        let r = match self.pathset.as_mut() {
            Some(ps) => ps.choose(&states[..self.replicas], read_len, now),
            None => self.groups[g].chooser.choose(&states[..self.replicas]),
        }?;
        Some(r * n + g)
    }

    /// Multipath: reserves a read's response rate on `path` (`--path-rate`;
    /// 0 otherwise). `pick_replica` checked that it fits.
    pub(super) fn reserve_for(&mut self, path: usize, io: &Io) -> u64 {
        let read_len = (io.op == Op::Read).then_some(io.nlb * self.block_size);
        self.pathset
            .as_mut()
            .map_or(0, |ps| ps.reserve(path, read_len))
    }

    pub(super) fn issue(&mut self, qi: usize, io: Io) -> Result<(), String> {
        let bsz = self.block_size as usize;
        let seed = self.seed;
        let verify = self.job.verify;
        let qc = &mut self.queues[qi];
        let slot = qc.q.alloc().ok_or("no free slot below queue depth")?;
        let len = io.nlb * self.block_size;
        let (opc, x) = match io.op {
            Op::Read => (io::READ, Xfer::FromCtrl(len)),
            Op::Write => (io::WRITE, Xfer::ToCtrl(len)),
        };
        if verify && io.op == Op::Write {
            let buf = qc.q.buf_mut(slot);
            for i in 0..io.nlb as u64 {
                let idx = (io.lba + i - self.first_lba) as usize;
                let gen = self.gens[idx] & !BUSY;
                fill_block(&mut buf[i as usize * bsz..][..bsz], io.lba + i, gen, seed);
            }
        }
        qc.ios[slot as usize] = io;
        qc.busy[slot as usize] = true;
        qc.inflight += 1;
        qc.q.submit(slot, rw_sqe(opc, self.job.nsid, io.lba, io.nlb), x, io.sent)
            .map_err(|e| e.to_string())
    }
}
