//! The I/O stream: each I/O's operation, size and offset as the job asks,
//! and, with verify, the reservation of its blocks (busy marks and the new
//! generation of a write).

use rand::Rng;

use super::{Op, Phase, Worker, BUSY, UNKNOWN};

impl Worker {
    /// Picks the next I/O and, with verify, reserves its blocks (marks them
    /// busy; writes also take their new generation). None when nothing can be
    /// issued now.
    pub(super) fn next_io(&mut self, phase: Phase) -> Option<(Op, u64, u32)> {
        let op = self.phase_op(phase);
        self.next_io_as(phase, op)
    }

    pub(super) fn phase_op(&mut self, phase: Phase) -> Op {
        match phase {
            Phase::Prefill => Op::Write,
            Phase::Readback => Op::Read,
            Phase::Main => self.pick_op(),
        }
    }

    /// `next_io` with the operation already drawn.
    pub(super) fn next_io_as(&mut self, phase: Phase, op: Op) -> Option<(Op, u64, u32)> {
        let nlb = self.draw_nlb(phase);
        self.next_io_sized(phase, op, nlb)
    }

    /// The blocks of the next I/O of `phase`.
    pub(super) fn draw_nlb(&mut self, phase: Phase) -> u32 {
        let nlb = match phase {
            Phase::Main => self.pick_nlb(),
            _ => self.chunk_blocks(),
        };
        nlb.min(self.nblocks as u32)
    }

    /// `next_io` with the operation and its size already drawn.
    pub(super) fn next_io_sized(
        &mut self,
        phase: Phase,
        op: Op,
        nlb: u32,
    ) -> Option<(Op, u64, u32)> {
        let tries = if self.job.verify { 8 } else { 1 };
        for _ in 0..tries {
            let off = self.pick_offset(phase, nlb)?;
            if self.reserve(op, off, nlb) {
                return Some((op, self.first_lba + off, nlb));
            }
        }
        None
    }

    pub(super) fn chunk_blocks(&self) -> u32 {
        let max = self.job.max_bs() / self.block_size;
        max.min((self.nblocks - self.cursor.min(self.nblocks)).max(1) as u32)
    }

    pub(super) fn pick_op(&mut self) -> Op {
        match self.job.read_pct {
            100 => Op::Read,
            0 => Op::Write,
            p => {
                if self.rng.gen_range(0..100) < p {
                    Op::Read
                } else {
                    Op::Write
                }
            }
        }
    }

    pub(super) fn pick_nlb(&mut self) -> u32 {
        let sizes = &self.job.sizes;
        if sizes.len() == 1 {
            return sizes[0].0 / self.block_size;
        }
        let mut r = self.rng.gen_range(0..100);
        for &(b, w) in sizes {
            if r < w {
                return b / self.block_size;
            }
            r -= w;
        }
        sizes[0].0 / self.block_size
    }

    /// Block offset within this worker's range.
    pub(super) fn pick_offset(&mut self, phase: Phase, nlb: u32) -> Option<u64> {
        let span = self.nblocks.checked_sub(nlb as u64)? + 1;
        if phase == Phase::Main && self.job.random {
            let slots = span.div_ceil(self.align_blocks);
            let off = self.rng.gen_range(0..slots) * self.align_blocks;
            return Some(off.min(span - 1));
        }
        if phase != Phase::Main && self.cursor >= self.nblocks {
            return None;
        }
        let mut off = self.cursor;
        if off + nlb as u64 > self.nblocks {
            off = 0; // wrap (main phase) — prefill/readback chunks never cross the end
        }
        self.cursor = off + nlb as u64;
        Some(off)
    }

    pub(super) fn reserve(&mut self, op: Op, off: u64, nlb: u32) -> bool {
        if !self.job.verify {
            return true;
        }
        let r = off as usize..off as usize + nlb as usize;
        if self.gens[r.clone()].iter().any(|g| g & BUSY != 0) {
            return false;
        }
        for g in &mut self.gens[r] {
            *g = match op {
                Op::Read => *g | BUSY,
                Op::Write if *g == UNKNOWN => 1 | BUSY,
                Op::Write => (*g + 1).min(UNKNOWN - 1) | BUSY,
            };
        }
        true
    }
}
