//! Time-driven, incremental greedy GC (docs/ssd-model.md, "Garbage collection").
//!
//! One victim line at a time. Each LUN walks its block of the victim with its own
//! cursor; a *step* either relocates the valid 4 KiB pages of one flash page (tR and
//! channel transfer on that LUN, then the pages go to the GC write pointer, whose
//! program runs when a flash page of it fills) or, once the block holds no valid page,
//! erases it (tBERS). The line is free when every LUN has erased its block.
//!
//! Background steps run in idle LUN time before the current submit, lazily, at the
//! start of each `submit`; a step starts only on a LUN idle at `now`, so a host
//! operation finds at most one GC operation ahead of it per LUN. Foreground steps run
//! ahead of host writes only when free lines reach the hard floor, in proportion to the
//! pages the write consumes.

use super::*;

/// Marks "no open line" in `Ssd::wp_line` and "no victim" in `GcState::victim`.
pub(crate) const NO_LINE: u32 = u32::MAX;
/// [R] Free lines the host write pointer leaves to the GC write pointer. One suffices:
/// a victim with at least one invalid page holds less than a line of valid data.
pub(crate) const GC_RESERVE_LINES: u32 = 1;
/// [R] Bound on background steps per `submit`, so that one call does bounded work under
/// the emulated backend's lock. Idle time not filled within the bound is not lost: each
/// LUN's clock stays in the past and the next submit continues from there.
const GC_BACKGROUND_STEPS_PER_SUBMIT_MAX: u32 = 256;
/// [R] Bound on foreground steps one host write runs before proceeding; past it the
/// write eats into the floor, and the host's line reserve (`gc_emergency`) is the backstop.
const GC_FOREGROUND_STEPS_PER_WRITE_MAX: u32 = 1024;
/// Largest flash page in 4 KiB pages the relocation scratch holds without allocating.
const SUBPAGES_MAX: usize = 16;

#[derive(Clone, Debug)]
pub(crate) struct GcState {
    pub(crate) victim: u32,
    /// Per LUN: next flash page of the victim's block to scan; `fppb` = erase next;
    /// `fppb + 1` = erased.
    pub(crate) cursor: Vec<u32>,
    pub(crate) luns_erased: u32,
    /// Round-robin start, so a bounded call does not always favour LUN 0.
    next_lun: u32,
    /// Background steps start no earlier than this (when the current victim was picked).
    since_ns: u64,
    /// LPNs of the flash page being relocated (at most `SUBPAGES_MAX`).
    scratch: [u32; SUBPAGES_MAX],
}

impl GcState {
    pub(crate) fn new(luns: u32, subpages: u32) -> Self {
        assert!(subpages as usize <= SUBPAGES_MAX, "flash page too large");
        GcState {
            victim: NO_LINE,
            cursor: vec![0; luns as usize],
            luns_erased: 0,
            next_lun: 0,
            since_ns: 0,
            scratch: [0; SUBPAGES_MAX],
        }
    }
}

/// What one step on a LUN did.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Nothing left on this LUN for the current victim.
    Done,
    /// The LUN (or the LUN the GC program would use) is busy at `now`.
    Busy,
    /// A relocation or erase was scheduled; `reclaimed` invalid pages were passed over
    /// and its NAND work (the GC program included) ends at `end_ns`.
    Ran { reclaimed: u32, end_ns: u64 },
}

impl Ssd {
    /// Fill idle LUN time up to `now` with background steps while free lines are at or
    /// below `gc_lo` (FEMU's background threshold); a started victim is always finished,
    /// which is the hysteresis.
    pub(crate) fn gc_background(&mut self, now: u64) {
        if self.p.static_map {
            return;
        }
        let mut budget = GC_BACKGROUND_STEPS_PER_SUBMIT_MAX;
        while budget > 0 {
            if self.gc.victim == NO_LINE {
                if self.free_lines() > self.gc_lo_lines || !self.gc_pick_victim(false) {
                    return;
                }
                self.gc.since_ns = self.prev_now_ns;
            }
            let ran = self.gc_round(now, &mut budget);
            if ran == 0 {
                return;
            }
        }
    }

    /// One pass over the LUNs, one background step each where possible.
    fn gc_round(&mut self, now: u64, budget: &mut u32) -> u32 {
        let mut ran = 0;
        for i in 0..self.luns {
            let lun = (self.gc.next_lun + i) % self.luns;
            if self.lun_busy_at(lun as usize, now) {
                continue;
            }
            let start = self.gc.since_ns.max(self.lun_avail_ns[lun as usize]);
            if let Step::Ran { .. } = self.gc_step(lun, start, Some(now)) {
                self.stats.gc_background_steps += 1;
                ran += 1;
                *budget -= 1;
                if *budget == 0 || self.gc.victim == NO_LINE {
                    self.gc.next_lun = (lun + 1) % self.luns;
                    break;
                }
            }
        }
        ran
    }

    /// At the hard floor (`gc_hi`), a host write of `pages` pages first runs steps until
    /// they have passed over as many invalid pages as it will consume, so the free space
    /// does not shrink further. Steps queue on their LUNs from `now` like host operations
    /// and the write is admitted when they end (returned): the host is throttled to the
    /// rate GC frees space, instead of queueing GC work without bound ahead of it.
    pub(crate) fn gc_foreground(&mut self, pages: u32, now: u64) -> u64 {
        let mut end = now;
        if self.p.static_map || self.free_lines() > self.gc_hi_lines {
            return end;
        }
        // Foreground steps queue behind the host's deferred programs, as before them.
        self.start_all_deferred();
        let mut need = pages as u64;
        let mut steps = 0;
        while need > 0 && steps < GC_FOREGROUND_STEPS_PER_WRITE_MAX {
            if self.gc.victim == NO_LINE && !self.gc_pick_victim(true) {
                break;
            }
            let Some(lun) = self.gc_least_busy_lun() else {
                break;
            };
            let Step::Ran { reclaimed, end_ns } = self.gc_step(lun, now, None) else {
                break;
            };
            need = need.saturating_sub(reclaimed as u64);
            end = end.max(end_ns);
            steps += 1;
        }
        if steps > 0 {
            self.stats.gc_foreground_steps += steps as u64;
            self.stats.gc_foreground_stalls += 1;
        }
        end
    }

    /// The host needs a line and only the GC reserve is left: finish victims now
    /// (blocking, from `t`) until a line is free for the host. Bounded by the line count.
    pub(crate) fn gc_emergency(&mut self, t: u64) {
        self.start_all_deferred();
        let mut victims = 0;
        let mut steps = 0u64;
        while self.free_lines() <= GC_RESERVE_LINES && victims <= self.lines.len() {
            if self.gc.victim == NO_LINE {
                if !self.gc_pick_victim(true) {
                    break;
                }
                victims += 1;
            }
            let Some(lun) = self.gc_least_busy_lun() else {
                break;
            };
            if let Step::Ran { .. } = self.gc_step(lun, t, None) {
                steps += 1;
            }
        }
        self.stats.gc_foreground_steps += steps;
        self.stats.gc_foreground_stalls += (steps > 0) as u64;
    }

    /// The LUN with victim work left that frees up first. Foreground steps go there so
    /// that a relocation's read rarely finishes after the LUN its program goes to has
    /// gone idle (the busy-until model cannot fill such a gap with other work).
    fn gc_least_busy_lun(&self) -> Option<u32> {
        let fppb = self.flash_pages_per_block;
        (0..self.luns)
            .filter(|&l| self.gc.cursor[l as usize] <= fppb)
            .min_by_key(|&l| self.lun_avail_ns[l as usize])
    }

    /// Greedy victim: the full line with the fewest valid pages. Background GC skips
    /// lines with fewer than 1/8 invalid pages (FEMU); no GC picks a line without any.
    fn gc_pick_victim(&mut self, force: bool) -> bool {
        let mut best: Option<usize> = None;
        for (i, l) in self.lines.iter().enumerate() {
            if l.state == LineState::Full && best.is_none_or(|b| l.vpc < self.lines[b].vpc) {
                best = Some(i);
            }
        }
        let Some(v) = best else {
            return false;
        };
        let ipc = self.lines[v].ipc;
        if ipc == 0 || (!force && ipc < self.pages_per_line / 8) {
            return false;
        }
        self.lines[v].state = LineState::Victim;
        self.gc.victim = v as u32;
        self.gc.cursor.iter_mut().for_each(|c| *c = 0);
        self.gc.luns_erased = 0;
        self.stats.gc_runs += 1;
        true
    }

    /// First ppa of flash page `fpage` of the victim's block on global LUN `lun`
    /// (inverse of `locate`: channel first, then LUN within channel, then page).
    fn victim_ppa(&self, lun: u32, fpage: u32) -> u32 {
        let lpc = self.p.luns_per_channel;
        let (ch, lun_in_ch) = (lun / lpc, lun % lpc);
        let idx = fpage * self.luns + lun_in_ch * self.p.channels + ch;
        self.gc.victim * self.pages_per_line + idx * self.subpages
    }

    /// One step on `lun` starting no earlier than `start`. With `gate = Some(now)` the
    /// step runs only if its LUN, and the LUN its GC program would use, are idle at `now`.
    fn gc_step(&mut self, lun: u32, start: u64, gate: Option<u64>) -> Step {
        let fppb = self.flash_pages_per_block;
        let l = lun as usize;
        if self.gc.victim == NO_LINE || self.gc.cursor[l] > fppb {
            return Step::Done;
        }
        if gate.is_some_and(|now| self.lun_busy_at(l, now)) {
            return Step::Busy;
        }
        // Pass over flash pages without valid data: nothing to read.
        let mut reclaimed = 0;
        let mut valid = 0;
        while self.gc.cursor[l] < fppb {
            valid = self.collect_valid(lun, self.gc.cursor[l]);
            if valid > 0 {
                break;
            }
            reclaimed += self.subpages;
            self.gc.cursor[l] += 1;
        }
        if valid == 0 {
            let end_ns = self.gc_erase_block(lun, start);
            return Step::Ran { reclaimed, end_ns };
        }
        if let (Some(now), Some(m)) = (gate, self.gc_program_lun(valid)) {
            if self.lun_busy_at(m as usize, now) {
                return Step::Busy;
            }
        }
        let fpage = self.gc.cursor[l];
        self.gc.cursor[l] += 1;
        let end_ns = self.gc_relocate(lun, fpage, valid, start);
        Step::Ran {
            reclaimed: reclaimed + self.subpages - valid,
            end_ns,
        }
    }

    /// Copy the valid LPNs of the victim's flash page into the scratch; returns how many.
    fn collect_valid(&mut self, lun: u32, fpage: u32) -> u32 {
        let base = self.victim_ppa(lun, fpage);
        let mut n = 0;
        for ppa in base..base + self.subpages {
            let lpn = self.rmap[ppa as usize];
            if lpn != FREE && lpn != INVALID {
                self.gc.scratch[n] = lpn;
                n += 1;
            }
        }
        n as u32
    }

    /// The LUN whose flash page the GC write pointer completes after `valid` more pages.
    fn gc_program_lun(&self, valid: u32) -> Option<u32> {
        let idx = self.wp_index[Stream::Gc as usize];
        (idx % self.subpages + valid >= self.subpages).then(|| self.locate(idx).1)
    }

    /// Read `valid` pages of the victim's flash page (tR + channel transfer on `lun`) and
    /// write them to the GC write pointer; its program is charged when a page fills.
    /// Returns when the pages are durable.
    fn gc_relocate(&mut self, lun: u32, fpage: u32, valid: u32, start: u64) -> u64 {
        let l = lun as usize;
        let s = start.max(self.lun_avail_ns[l]);
        let e = s + self.t_read_ns(valid, fpage);
        self.lun_avail_ns[l] = e;
        self.suspendable[l] = None;
        let ch = lun / self.p.luns_per_channel;
        let x = self.channel_xfer(ch, e, valid as u64 * self.p.page_bytes as u64);
        let mut done = x;
        for i in 0..valid as usize {
            let lpn = self.gc.scratch[i];
            done = done.max(self.write_page(Stream::Gc, lpn, x));
        }
        self.stats.gc_pages_moved += valid as u64;
        done
    }

    /// Erase the victim's block on `lun`; returns when the erase ends.
    fn gc_erase_block(&mut self, lun: u32, start: u64) -> u64 {
        let l = lun as usize;
        let s = start.max(self.lun_avail_ns[l]);
        let end = s + self.p.erase_ns;
        self.lun_avail_ns[l] = end;
        self.mark_suspendable(l, s, end, self.p.erase_suspend_ns, 0);
        self.stats.erases += 1;
        let block = (lun * self.lines.len() as u32 + self.gc.victim) as usize;
        self.wear.on_erase(&self.p.wear, block);
        self.gc.cursor[l] = self.flash_pages_per_block + 1;
        self.gc.luns_erased += 1;
        if self.gc.luns_erased == self.luns {
            self.gc_free_victim();
        }
        end
    }

    fn gc_free_victim(&mut self) {
        let v = self.gc.victim;
        let base = (v * self.pages_per_line) as usize;
        self.rmap[base..base + self.pages_per_line as usize].fill(FREE);
        let line = &mut self.lines[v as usize];
        debug_assert_eq!(line.vpc, 0, "erasing a line with valid pages");
        *line = Line {
            vpc: 0,
            ipc: 0,
            state: LineState::Free,
        };
        self.free_lines.push_back(v);
        self.gc.victim = NO_LINE;
    }
}
