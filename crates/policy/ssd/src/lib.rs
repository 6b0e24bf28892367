//! SSD timing model shared by the simulator and (later) the emulated backend.
//!
//! Sans-IO: `submit` takes the current time in nanoseconds and returns the
//! completion time; the caller schedules it. No threads, no clock, no
//! allocation per I/O (all tables are sized at construction).
//!
//! Model (algorithms.md §4): per-LUN busy time as in FEMU's
//! `ssd_advance_status`, optional channel and PCIe transfer plus firmware
//! overheads and a shared write buffer with early completion as in NVMeVirt,
//! a page-mapped FTL with line-granular greedy GC. Read/write and GC
//! interference arise only from LUN and channel busy time.

mod ledger;
mod profile;
use ledger::Ledger;
pub use profile::{Precondition, SsdProfile};
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;
use trellis_units::{IoDir, Nanos};

const FREE: u32 = u32::MAX;
const INVALID: u32 = u32::MAX - 1;
const UNMAPPED: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LineState {
    Free,
    Open,
    Full,
}

#[derive(Clone, Copy, Debug)]
struct Line {
    vpc: u32,
    ipc: u32,
    state: LineState,
}

/// Counters exported for outputs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SsdStats {
    pub reads: u64,
    pub writes: u64,
    pub pages_read: u64,
    pub pages_written: u64,
    pub gc_runs: u64,
    pub gc_pages_moved: u64,
    pub erases: u64,
    pub write_buffer_stalls: u64,
}

/// One simulated or emulated SSD.
#[derive(Clone)]
pub struct Ssd {
    p: SsdProfile,
    // Geometry, derived once.
    luns: u32,
    subpages: u32,
    pages_per_line: u32,
    logical_pages: u32,
    gc_lo_lines: u32,
    gc_hi_lines: u32,
    // Timing state.
    lun_avail_ns: Vec<u64>,
    channels: Vec<Ledger>,
    pcie: Option<Ledger>,
    /// Latest submit time seen (ledgers forget slots before it).
    now_ns: Nanos,
    // FTL state.
    map: Vec<u32>,
    rmap: Vec<u32>,
    lines: Vec<Line>,
    free_lines: std::collections::VecDeque<u32>,
    wp_line: u32,
    wp_index: u32,
    // Write buffer: (release time, bytes) for flash pages still being programmed.
    wbuf_used_bytes: u64,
    /// Buffered writes by NAND completion time (earliest first): (done, bytes).
    wbuf_pending: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u32)>>,
    stats: SsdStats,
}

impl Ssd {
    pub fn new(profile: SsdProfile) -> Self {
        profile.validate();
        let luns = profile.channels * profile.luns_per_channel;
        let subpages = profile.flash_page_bytes / profile.page_bytes;
        let pages_per_line = luns * profile.pages_per_block;
        let lines_total = profile.blocks_per_lun;
        let physical = pages_per_line as u64 * lines_total as u64;
        assert!(
            physical < INVALID as u64,
            "geometry too large for u32 page addresses"
        );
        // At least two lines stay free so that GC can always relocate a victim.
        let gc_hi_lines = (lines_total * profile.gc_hi_free_permille / 1000).max(2);
        let gc_lo_lines = (lines_total * profile.gc_lo_free_permille / 1000).max(gc_hi_lines);
        assert!(
            gc_lo_lines + 4 < lines_total,
            "too few lines for the GC thresholds"
        );
        // [R] Spare space must exceed the background threshold, or GC could never bring
        // the free-line count back above it and would compact on every write.
        let op_pages = (physical * profile.overprovision_permille as u64 / 1000)
            .max((gc_lo_lines as u64 + 2) * pages_per_line as u64);
        let logical_pages = (physical - op_pages) as u32;
        let wbuf_slots =
            (profile.write_buffer_bytes / profile.flash_page_bytes as u64) as usize + 1;
        let mut ssd = Ssd {
            luns,
            subpages,
            pages_per_line,
            logical_pages,
            gc_hi_lines,
            gc_lo_lines,
            lun_avail_ns: vec![0; luns as usize],
            channels: if profile.channel_mb_s > 0 {
                (0..profile.channels)
                    .map(|_| Ledger::new(profile.channel_mb_s))
                    .collect()
            } else {
                Vec::new()
            },
            pcie: (profile.pcie_mb_s > 0).then(|| Ledger::new(profile.pcie_mb_s)),
            now_ns: 0,
            map: if profile.static_map {
                Vec::new()
            } else {
                vec![UNMAPPED; logical_pages as usize]
            },
            rmap: if profile.static_map {
                Vec::new()
            } else {
                vec![FREE; physical as usize]
            },
            lines: vec![
                Line {
                    vpc: 0,
                    ipc: 0,
                    state: LineState::Free
                };
                lines_total as usize
            ],
            free_lines: (0..lines_total).collect(),
            wp_line: 0,
            wp_index: 0,
            wbuf_used_bytes: 0,
            wbuf_pending: std::collections::BinaryHeap::with_capacity(wbuf_slots),
            stats: SsdStats::default(),
            p: profile,
        };
        ssd.open_next_line();
        ssd
    }

    pub fn profile(&self) -> &SsdProfile {
        &self.p
    }

    pub fn stats(&self) -> SsdStats {
        self.stats
    }

    /// Usable (logical) capacity in bytes.
    pub fn logical_bytes(&self) -> u64 {
        self.logical_pages as u64 * self.p.page_bytes as u64
    }

    pub fn free_lines(&self) -> u32 {
        self.free_lines.len() as u32
    }

    /// Bring the device to a known state without charging time: a sequential
    /// fill (clean) or a fill plus random overwrites (fragmented), as fio-based
    /// preconditioning does before Gimbal's and the NSDI paper's clean/fragmented runs.
    pub fn precondition(&mut self, state: Precondition, seed: u64) {
        if self.p.static_map {
            return;
        }
        match state {
            Precondition::Empty => {}
            Precondition::Clean => self.fill_sequential(),
            Precondition::Fragmented { overwrite_permille } => {
                self.fill_sequential();
                let n = self.logical_pages as u64 * overwrite_permille as u64 / 1000;
                let mut rng = SplitMix64::seed_from_u64(seed ^ 0x9E37_79B9_7F4A_7C15);
                for _ in 0..n {
                    let lpn = (rng.next_u64() % self.logical_pages as u64) as u32;
                    self.write_page(lpn, 0);
                    self.gc_if_needed(0);
                }
            }
        }
        self.reset_timing();
    }

    fn fill_sequential(&mut self) {
        for lpn in 0..self.logical_pages {
            self.write_page(lpn, 0);
            self.gc_if_needed(0);
        }
    }

    fn reset_timing(&mut self) {
        self.lun_avail_ns.iter_mut().for_each(|t| *t = 0);
        if self.p.channel_mb_s > 0 {
            self.channels = (0..self.p.channels)
                .map(|_| Ledger::new(self.p.channel_mb_s))
                .collect();
        }
        self.pcie = (self.p.pcie_mb_s > 0).then(|| Ledger::new(self.p.pcie_mb_s));
        self.now_ns = 0;
        self.wbuf_used_bytes = 0;
        self.wbuf_pending.clear();
        self.stats = SsdStats::default();
    }

    /// Submit one I/O at `now_ns`; returns its completion time in ns.
    /// The offset wraps modulo the logical capacity so that any trace can be replayed.
    pub fn submit(
        &mut self,
        dir: IoDir,
        offset_bytes: u64,
        size_bytes: u32,
        now_ns: Nanos,
    ) -> Nanos {
        assert!(size_bytes > 0, "zero-length I/O");
        assert!(now_ns >= self.now_ns, "SSD time went backwards");
        self.now_ns = now_ns;
        let pb = self.p.page_bytes as u64;
        let first = (offset_bytes / pb) % self.logical_pages as u64;
        let n_pages = (offset_bytes % pb + size_bytes as u64).div_ceil(pb) as u32;
        match dir {
            IoDir::Read => self.read(first as u32, n_pages, size_bytes, now_ns),
            IoDir::Write => self.write(first as u32, n_pages, size_bytes, now_ns),
        }
    }

    fn read(&mut self, first: u32, n_pages: u32, size_bytes: u32, now_ns: Nanos) -> u64 {
        self.stats.reads += 1;
        let fw = if size_bytes <= 4096 * self.p.fw_read_small_partitions {
            self.p.fw_read_small_ns
        } else {
            self.p.fw_read_large_ns
        };
        let t0 = now_ns + fw;
        let mut done = t0;
        let mut last_flash_page = u64::MAX;
        for i in 0..n_pages {
            let lpn = (first + i) % self.logical_pages;
            let ppa = self.ppa_for_read(lpn);
            // NVMeVirt groups the 4 KiB pages of one flash page into one NAND operation.
            let flash_page = ppa as u64 / self.subpages as u64;
            if flash_page == last_flash_page {
                continue;
            }
            last_flash_page = flash_page;
            let group = self.group_len(first, i, n_pages, ppa);
            done = done.max(self.read_flash(ppa, group, t0));
        }
        done
    }

    /// How many of the requested pages (from index i) live in the same flash page as `ppa`.
    fn group_len(&self, first: u32, i: u32, n_pages: u32, ppa: u32) -> u32 {
        if self.subpages == 1 {
            return 1;
        }
        let fp = ppa / self.subpages;
        let mut n = 1;
        while i + n < n_pages {
            let next = self.ppa_for_read((first + i + n) % self.logical_pages);
            if next / self.subpages != fp {
                break;
            }
            n += 1;
        }
        n
    }

    /// Unmapped pages are read from their striped home location: real drives
    /// answer them fast, but charging a read keeps an un-preconditioned device honest.
    fn ppa_for_read(&self, lpn: u32) -> u32 {
        if self.p.static_map {
            return lpn % self.pages_per_line;
        }
        let ppa = self.map[lpn as usize];
        if ppa != UNMAPPED {
            return ppa;
        }
        lpn % self.pages_per_line
    }

    fn read_flash(&mut self, ppa: u32, pages: u32, t0: u64) -> u64 {
        self.stats.pages_read += pages as u64;
        let (ch, lun, fpage) = self.locate(ppa);
        let full = pages == self.subpages && self.subpages > 1;
        let lsb = fpage % 2 == 0;
        let t_r = match (full, lsb) {
            (false, true) => self.p.read_lsb_ns,
            (false, false) => self.p.read_msb_ns,
            (true, true) => self.p.read_full_lsb_ns,
            (true, false) => self.p.read_full_msb_ns,
        };
        let l = lun as usize;
        let s = t0.max(self.lun_avail_ns[l]);
        let e = s + t_r;
        self.lun_avail_ns[l] = e;
        let bytes = pages as u64 * self.p.page_bytes as u64;
        let e = self.channel_xfer(ch, e, bytes);
        self.pcie_xfer(e, bytes)
    }

    fn write(&mut self, first: u32, n_pages: u32, size_bytes: u32, now_ns: Nanos) -> u64 {
        self.stats.writes += 1;
        self.gc_if_needed(now_ns);
        if self.p.write_buffer_bytes == 0 {
            let mut done = now_ns;
            for i in 0..n_pages {
                let e = self.write_page((first + i) % self.logical_pages, now_ns);
                done = done.max(e);
            }
            return done;
        }
        let t_admit = self.wbuf_admit(size_bytes as u64, now_ns);
        let t1 = t_admit
            + self.p.fw_write_ns
            + self.p.fw_write_per_4k_ns * (size_bytes as u64).div_ceil(4096);
        let t1 = self.pcie_xfer(t1, size_bytes as u64);
        let mut done = t1;
        for i in 0..n_pages {
            let e = self.write_page((first + i) % self.logical_pages, t1);
            done = done.max(e);
        }
        self.wbuf_used_bytes += size_bytes as u64;
        // The buffer drains as flash pages finish; release the bytes at NAND completion.
        self.wbuf_pending
            .push(std::cmp::Reverse((done, size_bytes)));
        if self.p.early_completion {
            t1
        } else {
            done
        }
    }

    /// Wait until the shared write buffer can hold `bytes`; returns the admission time.
    fn wbuf_admit(&mut self, bytes: u64, now_ns: Nanos) -> u64 {
        let cap = self.p.write_buffer_bytes;
        let bytes = bytes.min(cap);
        let mut t = now_ns;
        loop {
            self.wbuf_release_until(t);
            if self.wbuf_used_bytes + bytes <= cap {
                return t;
            }
            self.stats.write_buffer_stalls += 1;
            let next = self
                .wbuf_pending
                .peek()
                .expect("buffer full with nothing pending")
                .0
                 .0;
            t = t.max(next);
        }
    }

    fn wbuf_release_until(&mut self, t: u64) {
        while let Some(&std::cmp::Reverse((done, bytes))) = self.wbuf_pending.peek() {
            if done > t {
                break;
            }
            self.wbuf_used_bytes -= bytes as u64;
            self.wbuf_pending.pop();
        }
    }

    /// Map `lpn` to the write pointer and charge the program; returns when the page is durable.
    fn write_page(&mut self, lpn: u32, t: u64) -> u64 {
        self.stats.pages_written += 1;
        if self.p.static_map {
            // Log-structured placement without tables: writes fill flash pages in write-pointer
            // order (full-page programs, striped over channels), reads use the static home.
            let _ = lpn;
            let ppa = self.wp_index;
            self.wp_index = (self.wp_index + 1) % self.pages_per_line;
            return if ppa % self.subpages == self.subpages - 1 {
                self.program(ppa, t)
            } else {
                t
            };
        }
        self.invalidate(lpn);
        let ppa = self.wp_line * self.pages_per_line + self.wp_index;
        self.map[lpn as usize] = ppa;
        self.rmap[ppa as usize] = lpn;
        self.lines[self.wp_line as usize].vpc += 1;
        let sub = ppa % self.subpages;
        let done = if sub == self.subpages - 1 {
            self.program(ppa, t)
        } else {
            t
        };
        self.advance_wp();
        done
    }

    /// Program the flash page holding `ppa` (FEMU: per page; NVMeVirt: per one-shot page).
    fn program(&mut self, ppa: u32, t: u64) -> u64 {
        let (ch, lun, _) = self.locate(ppa);
        let bytes = self.p.flash_page_bytes as u64;
        let l = lun as usize;
        let start = t.max(self.lun_avail_ns[l]);
        let xfer_end = self.channel_xfer(ch, start, bytes);
        let e = xfer_end + self.p.program_ns;
        self.lun_avail_ns[l] = e;
        e
    }

    fn invalidate(&mut self, lpn: u32) {
        let old = self.map[lpn as usize];
        if old == UNMAPPED {
            return;
        }
        self.rmap[old as usize] = INVALID;
        let line = &mut self.lines[(old / self.pages_per_line) as usize];
        line.vpc -= 1;
        line.ipc += 1;
        self.map[lpn as usize] = UNMAPPED;
    }

    fn advance_wp(&mut self) {
        self.wp_index += 1;
        if self.wp_index < self.pages_per_line {
            return;
        }
        self.lines[self.wp_line as usize].state = LineState::Full;
        self.open_next_line();
    }

    fn open_next_line(&mut self) {
        let next = self
            .free_lines
            .pop_front()
            .expect("SSD out of free lines: GC thresholds too low");
        self.lines[next as usize].state = LineState::Open;
        self.wp_line = next;
        self.wp_index = 0;
    }

    /// ppa -> (channel, global LUN index, flash page within block).
    /// Write order stripes channel first, then LUN, then page (FEMU's wp rule).
    fn locate(&self, ppa: u32) -> (u32, u32, u32) {
        let idx = (ppa % self.pages_per_line) / self.subpages;
        let ch = idx % self.p.channels;
        let lun_in_ch = (idx / self.p.channels) % self.p.luns_per_channel;
        let fpage = idx / (self.p.channels * self.p.luns_per_channel);
        (ch, ch * self.p.luns_per_channel + lun_in_ch, fpage)
    }

    fn channel_xfer(&mut self, ch: u32, t: u64, bytes: u64) -> u64 {
        let now = self.now_ns;
        match self.channels.get_mut(ch as usize) {
            Some(l) => l.reserve(now, t, bytes),
            None => t,
        }
    }

    fn pcie_xfer(&mut self, t: u64, bytes: u64) -> u64 {
        let now = self.now_ns;
        match self.pcie.as_mut() {
            Some(l) => l.reserve(now, t, bytes),
            None => t,
        }
    }

    /// FEMU: forced GC while free lines ≤ gc_hi; one background pass when ≤ gc_lo.
    fn gc_if_needed(&mut self, now_ns: Nanos) {
        if self.p.static_map {
            return;
        }
        while self.free_lines() <= self.gc_hi_lines {
            let before = self.free_lines();
            // Stop when a pass gains nothing: relocation ate the line it freed.
            if !self.do_gc(true, now_ns) || self.free_lines() <= before {
                break;
            }
        }
        if self.free_lines() <= self.gc_lo_lines {
            self.do_gc(false, now_ns);
        }
    }

    /// Greedy GC of one victim line. Returns false when nothing could be reclaimed.
    fn do_gc(&mut self, force: bool, now_ns: Nanos) -> bool {
        let Some(victim) = self.pick_victim() else {
            return false;
        };
        let line = self.lines[victim as usize];
        if line.ipc == 0 {
            return false;
        }
        // Background GC skips lines that would free little (FEMU: ipc < pages_per_line / 8).
        if !force && line.ipc < self.pages_per_line / 8 {
            return false;
        }
        self.stats.gc_runs += 1;
        let base = victim * self.pages_per_line;
        for i in 0..self.pages_per_line {
            let lpn = self.rmap[(base + i) as usize];
            if lpn == FREE || lpn == INVALID {
                continue;
            }
            let (_, lun, _) = self.locate(base + i);
            let s = now_ns.max(self.lun_avail_ns[lun as usize]);
            self.lun_avail_ns[lun as usize] = s + self.p.read_lsb_ns;
            self.stats.gc_pages_moved += 1;
            self.write_page(lpn, now_ns);
        }
        self.erase_line(victim, now_ns);
        true
    }

    fn pick_victim(&self) -> Option<u32> {
        let mut best: Option<u32> = None;
        for (i, l) in self.lines.iter().enumerate() {
            if l.state != LineState::Full {
                continue;
            }
            if best.is_none_or(|b| l.vpc < self.lines[b as usize].vpc) {
                best = Some(i as u32);
            }
        }
        best
    }

    fn erase_line(&mut self, victim: u32, now_ns: Nanos) {
        let base = victim * self.pages_per_line;
        for i in 0..self.pages_per_line {
            self.rmap[(base + i) as usize] = FREE;
        }
        for lun in 0..self.luns as usize {
            let s = now_ns.max(self.lun_avail_ns[lun]);
            self.lun_avail_ns[lun] = s + self.p.erase_ns;
        }
        self.stats.erases += self.luns as u64;
        let l = &mut self.lines[victim as usize];
        debug_assert_eq!(l.vpc, 0, "erasing a line with valid pages");
        *l = Line {
            vpc: 0,
            ipc: 0,
            state: LineState::Free,
        };
        self.free_lines.push_back(victim);
    }

    /// Check FTL invariants (used by tests; O(capacity)).
    pub fn check_invariants(&self) {
        if self.p.static_map {
            return;
        }
        let mut valid = 0u64;
        for (lpn, &ppa) in self.map.iter().enumerate() {
            if ppa != UNMAPPED {
                assert_eq!(self.rmap[ppa as usize], lpn as u32, "map/rmap disagree");
                valid += 1;
            }
        }
        let vpc: u64 = self.lines.iter().map(|l| l.vpc as u64).sum();
        assert_eq!(valid, vpc, "valid page count mismatch");
    }
}

/// NVMeVirt's transfer rule: each 128 B unit costs ⌊128·10⁹ / (MB/s · 2²⁰)⌋ ns.
pub fn xfer_ns(bytes: u64, mb_s: u32) -> u64 {
    let unit = 128 * 1_000_000_000u64 / (mb_s as u64 * 1_048_576);
    bytes.div_ceil(128) * unit
}

#[cfg(test)]
mod tests;
