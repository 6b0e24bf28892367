//! Preconditioning: the sequential fill of a clean drive, and the random
//! overwrites that fragment it on the model clock so GC carries its debt
//! into the run.

use super::*;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;

impl Ssd {
    /// Bring the device to a known state, as fio-based preconditioning does before
    /// Gimbal's and the NSDI paper's clean/fragmented runs. `Clean` is a sequential
    /// fill of the logical space (no time charged: it leaves nothing for GC to do).
    /// `Fragmented` is that fill, then `overwrite_permille`/1000 × capacity random 4 KiB
    /// writes issued through `submit` at queue depth `PRECONDITION_QD` on the model
    /// clock, so GC runs exactly as it would in a run. The caller's first `submit`
    /// after it is the moment the overwrites are all on flash (the last program done,
    /// as when the measured job follows the preconditioning job): the GC debt (free
    /// lines at or below the background threshold, a victim half relocated) carries
    /// over, and background GC has used the drain's idle LUN time as it would.
    pub fn precondition(&mut self, state: Precondition, seed: u64) {
        if matches!(state, Precondition::Empty) {
            return;
        }
        self.fill_sequential();
        self.reset_timing();
        let Precondition::Fragmented { overwrite_permille } = state else {
            return;
        };
        if self.p.static_map {
            return;
        }
        let n = self.logical_pages as u64 * overwrite_permille as u64 / 1000;
        let end_ns = self.overwrite_random(n, seed).max(self.flash_idle_ns());
        self.stats = SsdStats::default();
        self.epoch_int_ns = end_ns;
        self.epoch_pending = true;
    }

    /// When every LUN has finished the work queued so far.
    pub(crate) fn flash_idle_ns(&mut self) -> Nanos {
        self.start_deferred_before(u64::MAX);
        self.lun_avail_ns.iter().copied().max().unwrap_or(0)
    }

    /// `n` random 4 KiB writes from t = 0, closed loop at `PRECONDITION_QD`: the next
    /// write is issued when the oldest of the last QD completes. Returns the time the
    /// next write would have been issued.
    pub(crate) fn overwrite_random(&mut self, n: u64, seed: u64) -> Nanos {
        let mut rng = SplitMix64::seed_from_u64(seed ^ 0x9E37_79B9_7F4A_7C15);
        let mut done = [0u64; PRECONDITION_QD];
        let mut t = 0;
        for i in 0..n {
            let lpn = rng.next_u64() % self.logical_pages as u64;
            let slot = (i % PRECONDITION_QD as u64) as usize;
            t = t.max(done[slot]);
            done[slot] = self.submit(
                IoDir::Write,
                lpn * self.p.page_bytes as u64,
                self.p.page_bytes,
                t,
            );
        }
        t.max(done[(n % PRECONDITION_QD as u64) as usize])
    }

    /// Sequential fill of an empty drive: every line ends 100 % valid, so GC has
    /// nothing to collect and the fill's timing would not matter.
    pub(crate) fn fill_sequential(&mut self) {
        if self.p.static_map {
            // The static map reads from the same striped addresses a filled FTL maps to;
            // start its write pointer where the FTL's would be after the fill.
            self.wp_index[Stream::Host as usize] = self.logical_pages % self.pages_per_line;
            return;
        }
        self.filling = true;
        for lpn in 0..self.logical_pages {
            self.write_page(Stream::Host, lpn, 0);
        }
        self.filling = false;
    }

    /// Forget the fill's NAND time: the drive is idle when the run (or the timed
    /// overwrites) begin.
    pub(crate) fn reset_timing(&mut self) {
        self.lun_avail_ns.iter_mut().for_each(|t| *t = 0);
        self.lun_deferred.iter_mut().for_each(|q| q.clear());
        self.deferred_programs = 0;
        if self.p.channel_mb_s > 0 {
            self.channels = (0..self.p.channels)
                .map(|_| Ledger::new(self.p.channel_mb_s))
                .collect();
        }
        self.pcie = (self.p.pcie_mb_s > 0).then(|| Ledger::new(self.p.pcie_mb_s));
        self.now_ns = 0;
        self.prev_now_ns = 0;
        self.wbuf_used_bytes = 0;
        self.wbuf_open_bytes = 0;
        self.wbuf_pending.clear();
        self.suspendable.iter_mut().for_each(|s| *s = None);

        self.wbuf_moved.clear();
        self.wbuf_released_ns = 0;
        self.stats = SsdStats::default();
    }
}
