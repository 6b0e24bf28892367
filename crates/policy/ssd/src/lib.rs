//! SSD timing model shared by the simulator and the target's emulated backend
//! (`backend = "emulated"`, crates/endpoint/node/src/backend/emulated.rs).
//!
//! Sans-IO: `submit` takes the current time in nanoseconds and returns the
//! completion time; the caller schedules it. No threads, no clock, no
//! allocation per I/O (all tables are sized at construction).
//!
//! Model (docs/ssd-model.md; sources in docs/sources.md): per-LUN busy time as in FEMU's
//! `ssd_advance_status`, optional channel and PCIe transfer plus firmware
//! overheads and a shared write buffer with early completion as in NVMeVirt,
//! a page-mapped FTL with greedy GC that relocates one flash page per LUN at a
//! time in idle LUN time (background) or ahead of host writes at the hard floor
//! (foreground). Read/write and GC interference arise only from LUN and channel
//! busy time.

mod calibrate;
mod gc;
mod ledger;
mod profile;
pub use calibrate::{calibrate, Calibration, SATURATION_PERMILLE};
use ledger::Ledger;
pub use profile::{Precondition, SsdProfile};
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;
use trellis_units::{IoDir, Nanos};

/// [R] Queue depth of the fragmenting overwrites (fio preconditioning scripts commonly
/// run random writes at iodepth 32); deep enough to keep every LUN of the profiles busy.
const PRECONDITION_QD: usize = 32;

const FREE: u32 = u32::MAX;
const INVALID: u32 = u32::MAX - 1;
const UNMAPPED: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LineState {
    Free,
    Open,
    Full,
    /// Being collected.
    Victim,
}

/// Which write pointer a page goes to: host data and GC relocations fill separate
/// open lines (NVMeVirt `conv_ftl`: `USER_IO` and `GC_IO` write pointers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    Host = 0,
    Gc = 1,
}

#[derive(Clone, Copy, Debug)]
struct Line {
    vpc: u32,
    ipc: u32,
    state: LineState,
}

/// A buffered program waiting for its LUN (read priority).
#[derive(Clone, Copy, Debug)]
struct Deferred {
    /// When its data is in the buffer (the write's early completion).
    ready_ns: Nanos,
    /// Write-buffer bytes its end releases.
    release_bytes: u32,
}

/// Counters exported for outputs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SsdStats {
    pub reads: u64,
    pub writes: u64,
    pub pages_read: u64,
    pub pages_written: u64,
    /// Victim lines chosen (each is collected incrementally, then freed).
    pub gc_runs: u64,
    pub gc_pages_moved: u64,
    /// Block erases (one per LUN per victim line).
    pub erases: u64,
    pub write_buffer_stalls: u64,
    /// GC steps (one flash page relocated or one block erased) run in idle LUN time.
    pub gc_background_steps: u64,
    /// GC steps run ahead of host writes because free lines reached the hard floor.
    pub gc_foreground_steps: u64,
    /// Host writes that had to run foreground GC first.
    pub gc_foreground_stalls: u64,
    /// Programs and erases suspended for a host read.
    pub suspends: u64,
}

/// One simulated or emulated SSD.
#[derive(Clone)]
pub struct Ssd {
    p: SsdProfile,
    // Geometry, derived once.
    luns: u32,
    subpages: u32,
    pages_per_line: u32,
    flash_pages_per_block: u32,
    logical_pages: u32,
    gc_lo_lines: u32,
    gc_hi_lines: u32,
    // Timing state.
    /// When each LUN finishes the operations started on it.
    lun_avail_ns: Vec<u64>,
    /// With `read_priority`: buffered host programs per LUN, not yet started, in order.
    /// A read that reaches the LUN before one starts goes ahead of it.
    lun_deferred: Vec<std::collections::VecDeque<Deferred>>,
    deferred_programs: u32,
    /// During the untimed sequential fill: no write-buffer accounting.
    filling: bool,
    channels: Vec<Ledger>,
    pcie: Option<Ledger>,
    /// Latest submit time seen, model clock (ledgers forget slots before it).
    now_ns: Nanos,
    /// The submit before the latest one (background GC starts no earlier).
    prev_now_ns: Nanos,
    /// Model clock = `epoch_int_ns + (caller clock − epoch_ext_ns)`. Identity unless
    /// preconditioning ran on the model clock: then the caller's first submit is the
    /// moment preconditioning ended, so its GC debt carries over.
    epoch_int_ns: Nanos,
    epoch_ext_ns: Nanos,
    epoch_pending: bool,
    // FTL state.
    map: Vec<u32>,
    rmap: Vec<u32>,
    lines: Vec<Line>,
    free_lines: std::collections::VecDeque<u32>,
    /// Open line and next page index per `Stream`; `gc::NO_LINE` when not open.
    wp_line: [u32; 2],
    wp_index: [u32; 2],
    gc: gc::GcState,
    /// Write buffer bytes held: host pages admitted and not yet programmed.
    wbuf_used_bytes: u64,
    /// Host bytes in the open flash page: held until that page's program ends.
    wbuf_open_bytes: u64,
    /// Flash-page programs by NAND completion time (earliest first): (done, bytes
    /// they release).
    wbuf_pending: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u32)>>,
    /// Per LUN: the program or erase that ends its timeline, while a host read may
    /// still suspend it (`program_suspend_ns`, `erase_suspend_ns`).
    suspendable: Vec<Option<Suspendable>>,

    /// Write-buffer releases (end, bytes) whose program was suspended: their entry
    /// in `wbuf_pending` is stale and skipped; the moved one was pushed anew.
    wbuf_moved: Vec<(u64, u32)>,
    /// Every write-buffer release ending by then has been counted (a write was
    /// admitted on it): such a program can no longer be moved later.
    wbuf_released_ns: Nanos,
    stats: SsdStats,
}

/// A running program or erase a host read may suspend ([`SsdProfile::program_suspend_ns`]).
#[derive(Clone, Copy, Debug)]
struct Suspendable {
    start_ns: Nanos,
    end_ns: Nanos,
    /// What a suspend costs the first read (the profile's program or erase figure).
    suspend_ns: Nanos,
    /// The reads of its one suspension run until then; 0 = not suspended yet.
    reads_end_ns: Nanos,
    /// Write-buffer bytes its end releases (a buffered host program), else 0.
    release_bytes: u32,
}

impl Ssd {
    pub fn new(profile: SsdProfile) -> Self {
        profile.validate();
        let luns = profile.channels * profile.luns_per_channel;
        let subpages = profile.flash_page_bytes / profile.page_bytes;
        let pages_per_line = luns * profile.pages_per_block;
        let flash_pages_per_block = profile.pages_per_block / subpages;
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
            flash_pages_per_block,
            logical_pages,
            gc_hi_lines,
            gc_lo_lines,
            lun_avail_ns: vec![0; luns as usize],
            lun_deferred: vec![std::collections::VecDeque::new(); luns as usize],
            deferred_programs: 0,
            filling: false,
            channels: if profile.channel_mb_s > 0 {
                (0..profile.channels)
                    .map(|_| Ledger::new(profile.channel_mb_s))
                    .collect()
            } else {
                Vec::new()
            },
            pcie: (profile.pcie_mb_s > 0).then(|| Ledger::new(profile.pcie_mb_s)),
            now_ns: 0,
            prev_now_ns: 0,
            epoch_int_ns: 0,
            epoch_ext_ns: 0,
            epoch_pending: false,
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
            wp_line: [gc::NO_LINE; 2],
            wp_index: [0; 2],
            gc: gc::GcState::new(luns, subpages),
            wbuf_used_bytes: 0,
            wbuf_open_bytes: 0,
            wbuf_pending: std::collections::BinaryHeap::with_capacity(wbuf_slots),
            suspendable: vec![None; luns as usize],

            wbuf_moved: Vec::new(),
            wbuf_released_ns: 0,
            stats: SsdStats::default(),
            p: profile,
        };
        ssd.open_next_line(Stream::Host);
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
    fn flash_idle_ns(&mut self) -> Nanos {
        self.start_deferred_before(u64::MAX);
        self.lun_avail_ns.iter().copied().max().unwrap_or(0)
    }

    /// `n` random 4 KiB writes from t = 0, closed loop at `PRECONDITION_QD`: the next
    /// write is issued when the oldest of the last QD completes. Returns the time the
    /// next write would have been issued.
    fn overwrite_random(&mut self, n: u64, seed: u64) -> Nanos {
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
    fn fill_sequential(&mut self) {
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
    fn reset_timing(&mut self) {
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
        if self.epoch_pending {
            self.epoch_pending = false;
            self.epoch_ext_ns = now_ns;
        }
        let now = self.epoch_int_ns + now_ns.saturating_sub(self.epoch_ext_ns);
        assert!(
            now >= self.now_ns && now_ns >= self.epoch_ext_ns,
            "SSD time went backwards"
        );
        if now > self.now_ns {
            self.prev_now_ns = self.now_ns;
        }
        self.now_ns = now;
        self.start_deferred_before(now);
        self.gc_background(now);
        let pb = self.p.page_bytes as u64;
        let first = (offset_bytes / pb) % self.logical_pages as u64;
        let n_pages = (offset_bytes % pb + size_bytes as u64).div_ceil(pb) as u32;
        let done = match dir {
            IoDir::Read => self.read(first as u32, n_pages, size_bytes, now),
            IoDir::Write => self.write(first as u32, n_pages, size_bytes, now),
        };
        self.epoch_ext_ns + (done - self.epoch_int_ns)
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
        let t_r = self.t_read_ns(pages, fpage);
        let l = lun as usize;
        // Programs whose LUN frees before the read arrives there have started.
        self.start_deferred_on(l, t0);
        let e = match self.suspend_for_read(l, t0, t_r) {
            Some(e) => e,
            None => {
                let e = t0.max(self.lun_avail_ns[l]) + t_r;
                self.lun_avail_ns[l] = e;
                self.suspendable[l] = None;
                e
            }
        };
        let bytes = pages as u64 * self.p.page_bytes as u64;
        let e = self.channel_xfer(ch, e, bytes);
        self.pcie_xfer(e, bytes)
    }

    /// tR for `pages` 4 KiB pages of flash page `fpage` (LSB/MSB alternate by index).
    fn t_read_ns(&self, pages: u32, fpage: u32) -> u64 {
        let full = pages == self.subpages && self.subpages > 1;
        let lsb = fpage.is_multiple_of(2);
        match (full, lsb) {
            (false, true) => self.p.read_lsb_ns,
            (false, false) => self.p.read_msb_ns,
            (true, true) => self.p.read_full_lsb_ns,
            (true, false) => self.p.read_full_msb_ns,
        }
    }

    fn write(&mut self, first: u32, n_pages: u32, size_bytes: u32, now_ns: Nanos) -> u64 {
        self.stats.writes += 1;
        // At the floor the write first waits for the GC it triggers.
        let now_ns = self.gc_foreground(n_pages, now_ns);
        if self.p.write_buffer_bytes == 0 {
            let mut done = now_ns;
            for i in 0..n_pages {
                let e = self.write_page(Stream::Host, (first + i) % self.logical_pages, now_ns);
                done = done.max(e);
            }
            return done;
        }
        // A page occupies the buffer from admission until the program of its flash page
        // ends (NVMeVirt `conv_write`: `buffer_allocate` per write, and each one-shot
        // page program releases the whole page at its NAND completion).
        let pb = self.p.page_bytes as u64;
        let held_bytes = n_pages as u64 * pb;
        let t_admit = self.wbuf_admit(held_bytes, now_ns);
        let t1 = t_admit
            + self.p.fw_write_ns
            + self.p.fw_write_per_4k_ns * (size_bytes as u64).div_ceil(4096);
        let t1 = self.pcie_xfer(t1, size_bytes as u64);
        self.wbuf_used_bytes += held_bytes;
        let mut done = t1;
        for i in 0..n_pages {
            let e = self.write_page(Stream::Host, (first + i) % self.logical_pages, t1);
            done = done.max(e);
        }
        if self.p.early_completion {
            t1
        } else {
            done
        }
    }

    /// Wait until the shared write buffer can hold `bytes`; returns the admission time.
    /// With read priority, a full buffer starts the deferred program that would end
    /// first if it ends before every started one: the controller must drain its buffer.
    fn wbuf_admit(&mut self, bytes: u64, now_ns: Nanos) -> u64 {
        let cap = self.p.write_buffer_bytes;
        let bytes = bytes.min(cap);
        let mut t = now_ns;
        loop {
            self.wbuf_release_until(t);
            if self.wbuf_used_bytes + bytes <= cap {
                return t;
            }
            self.wbuf_skip_moved();
            let started = self.wbuf_pending.peek().map(|r| r.0 .0);
            let deferred = self.first_deferred_end();
            match (started, deferred) {
                // Nothing being or to be programmed: the held bytes are all in the open
                // flash page, which only this write can close; admit it.
                (None, None) => return t,
                (s, Some((l, end))) if s.is_none_or(|s| end < s) => self.start_deferred(l),
                (Some(s), _) => t = t.max(s),
                (None, Some(_)) => unreachable!("matched above"),
            }
            self.stats.write_buffer_stalls += 1;
        }
    }

    fn wbuf_release_until(&mut self, t: u64) {
        self.wbuf_released_ns = self.wbuf_released_ns.max(t);
        self.wbuf_skip_moved();
        while let Some(&std::cmp::Reverse((done, bytes))) = self.wbuf_pending.peek() {
            if done > t {
                break;
            }
            self.wbuf_used_bytes -= bytes as u64;
            self.wbuf_pending.pop();
            self.wbuf_skip_moved();
        }
    }

    /// Map `lpn` to the stream's write pointer and charge the program; returns when
    /// the page is durable.
    fn write_page(&mut self, stream: Stream, lpn: u32, t: u64) -> u64 {
        self.stats.pages_written += 1;
        let k = stream as usize;
        if self.p.static_map {
            // Log-structured placement without tables: writes fill flash pages in write-pointer
            // order (full-page programs, striped over channels), reads use the static home.
            let ppa = self.wp_index[k];
            self.wp_index[k] = (ppa + 1) % self.pages_per_line;
            return self.page_written(stream, ppa, t);
        }
        if self.wp_line[k] == gc::NO_LINE {
            self.open_next_line(stream);
        }
        self.invalidate(lpn);
        let ppa = self.wp_line[k] * self.pages_per_line + self.wp_index[k];
        self.map[lpn as usize] = ppa;
        self.rmap[ppa as usize] = lpn;
        self.lines[self.wp_line[k] as usize].vpc += 1;
        let done = self.page_written(stream, ppa, t);
        self.advance_wp(stream, t);
        done
    }

    /// A page was placed at `ppa` at `t`: if it closes its flash page, program that
    /// page; returns when the page is durable (`t` while its flash page is open, or
    /// while its program is deferred). A host page holds write-buffer space until the
    /// program of its flash page ends (NVMeVirt `conv_write`: `buffer_allocate` per
    /// write; each one-shot page program releases the whole page at its NAND end).
    fn page_written(&mut self, stream: Stream, ppa: u32, t: u64) -> u64 {
        let buffered = stream == Stream::Host && self.p.write_buffer_bytes > 0 && !self.filling;
        if buffered {
            self.wbuf_open_bytes += self.p.page_bytes as u64;
        }
        if ppa % self.subpages != self.subpages - 1 {
            return t;
        }
        if !buffered {
            return self.program(ppa, t);
        }
        let release_bytes = std::mem::take(&mut self.wbuf_open_bytes) as u32;
        if self.p.read_priority {
            let (_, lun, _) = self.locate(ppa);
            self.lun_deferred[lun as usize].push_back(Deferred {
                ready_ns: t,
                release_bytes,
            });
            self.deferred_programs += 1;
            return t;
        }
        let e = self.program(ppa, t);
        self.wbuf_pending
            .push(std::cmp::Reverse((e, release_bytes)));
        e
    }

    /// Start every deferred program whose LUN frees (or whose data arrives) before
    /// `before`: a read arriving then finds it running.
    fn start_deferred_before(&mut self, before: Nanos) {
        if self.deferred_programs == 0 {
            return;
        }
        for l in 0..self.luns as usize {
            self.start_deferred_on(l, before);
        }
    }

    fn start_deferred_on(&mut self, l: usize, before: Nanos) {
        while let Some(d) = self.lun_deferred[l].front() {
            if d.ready_ns.max(self.lun_avail_ns[l]) >= before {
                return;
            }
            self.start_deferred(l);
        }
    }

    /// Start LUN `l`'s first deferred program when the LUN frees.
    fn start_deferred(&mut self, l: usize) {
        let Some(d) = self.lun_deferred[l].pop_front() else {
            return;
        };
        self.deferred_programs -= 1;
        let ch = l as u32 / self.p.luns_per_channel;
        let start = d.ready_ns.max(self.lun_avail_ns[l]);
        let xfer_end = self.channel_xfer(ch, start, self.p.flash_page_bytes as u64);
        let e = xfer_end + self.p.program_ns;
        self.lun_avail_ns[l] = e;
        self.wbuf_pending
            .push(std::cmp::Reverse((e, d.release_bytes)));
        self.mark_suspendable(l, start, e, self.p.program_suspend_ns, d.release_bytes);
    }

    /// The deferred program that would end first if started now: (LUN, end).
    fn first_deferred_end(&self) -> Option<(usize, Nanos)> {
        if self.deferred_programs == 0 {
            return None;
        }
        let flash_xfer_ns = match self.p.channel_mb_s {
            0 => 0,
            mb_s => xfer_ns(self.p.flash_page_bytes as u64, mb_s),
        };
        (0..self.luns as usize)
            .filter_map(|l| {
                let d = self.lun_deferred[l].front()?;
                let start = d.ready_ns.max(self.lun_avail_ns[l]);
                Some((l, start + flash_xfer_ns + self.p.program_ns))
            })
            .min_by_key(|&(_, end)| end)
    }

    /// Whether LUN `l` has work at `now` (started, or deferred programs waiting).
    pub(crate) fn lun_busy_at(&self, l: usize, now: Nanos) -> bool {
        self.lun_avail_ns[l] > now || !self.lun_deferred[l].is_empty()
    }

    /// Start every deferred program now, in order (before foreground GC queues work).
    pub(crate) fn start_all_deferred(&mut self) {
        self.start_deferred_before(u64::MAX);
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
        self.mark_suspendable(l, start, e, self.p.program_suspend_ns, 0);
        e
    }

    /// LUN `l`'s timeline now ends with a program or erase over [start, end).
    pub(crate) fn mark_suspendable(
        &mut self,
        l: usize,
        start: Nanos,
        end: Nanos,
        cost: Nanos,
        release_bytes: u32,
    ) {
        self.suspendable[l] = (cost > 0).then_some(Suspendable {
            start_ns: start,
            end_ns: end,
            suspend_ns: cost,
            reads_end_ns: 0,
            release_bytes,
        });
    }

    /// A host read of `t_r` reaching LUN `l` at `t`: if the program or erase running
    /// there can be suspended for it, the read runs in the suspension and the
    /// operation's end (and its write-buffer release) moves back; returns the read's
    /// end. Otherwise None, and the read queues as usual.
    fn suspend_for_read(&mut self, l: usize, t: Nanos, t_r: Nanos) -> Option<Nanos> {
        let mut s = self.suspendable[l]?;
        if t < s.start_ns
            || t >= s.end_ns
            || self.lun_avail_ns[l] != s.end_ns
            || self.release_taken(s.end_ns, s.release_bytes)
        {
            return None;
        }
        let (start, shift) = if s.reads_end_ns > t {
            // The suspension's reads are still running: this one follows them.
            (s.reads_end_ns, t_r)
        } else if s.reads_end_ns != 0 || s.end_ns - t <= s.suspend_ns {
            // Once per operation; and not when finishing is quicker than suspending.
            return None;
        } else {
            (t + s.suspend_ns, s.suspend_ns + t_r)
        };
        let old_end = s.end_ns;
        s.end_ns += shift;
        s.reads_end_ns = start + t_r;
        self.lun_avail_ns[l] = s.end_ns;
        if s.release_bytes > 0 {
            self.wbuf_moved.push((old_end, s.release_bytes));
            self.wbuf_pending
                .push(std::cmp::Reverse((s.end_ns, s.release_bytes)));
        }
        self.suspendable[l] = Some(s);
        self.stats.suspends += (start == t + s.suspend_ns) as u64;
        Some(start + t_r)
    }

    /// Whether a program ending at `end` already had its write-buffer bytes counted
    /// free by an admitted write: moving it later would free them twice.
    fn release_taken(&self, end: Nanos, release_bytes: u32) -> bool {
        release_bytes > 0 && end <= self.wbuf_released_ns
    }

    /// Drops stale releases (moved by a suspend) from the top of `wbuf_pending`.
    fn wbuf_skip_moved(&mut self) {
        while let Some(&std::cmp::Reverse(top)) = self.wbuf_pending.peek() {
            let Some(i) = self.wbuf_moved.iter().position(|&m| m == top) else {
                return;
            };
            self.wbuf_moved.swap_remove(i);
            self.wbuf_pending.pop();
        }
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

    /// Move the stream's write pointer; a full line closes. The host opens its next
    /// line at once and never takes the last `gc::GC_RESERVE_LINES` free lines (they are
    /// the GC's, as NVMeVirt keeps two lines for "host write, gc"); the GC opens its next
    /// line lazily, at its next relocation.
    fn advance_wp(&mut self, stream: Stream, t: u64) {
        let k = stream as usize;
        self.wp_index[k] += 1;
        if self.wp_index[k] < self.pages_per_line {
            return;
        }
        self.lines[self.wp_line[k] as usize].state = LineState::Full;
        self.wp_line[k] = gc::NO_LINE;
        self.wp_index[k] = 0;
        if stream == Stream::Host {
            if self.free_lines() <= gc::GC_RESERVE_LINES {
                self.gc_emergency(t);
            }
            self.open_next_line(stream);
        }
    }

    /// Geometry guarantees a free line here: spare space is at least `gc_lo` + 2 lines,
    /// the host leaves the reserve to GC, and GC needs at most one new line per victim
    /// (a victim with an invalid page holds less than a line of valid data).
    fn open_next_line(&mut self, stream: Stream) {
        let next = self
            .free_lines
            .pop_front()
            .expect("SSD out of free lines: GC reserve exhausted");
        self.lines[next as usize].state = LineState::Open;
        self.wp_line[stream as usize] = next;
        self.wp_index[stream as usize] = 0;
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
            // Background GC fills idle time before `now`; the ledger has forgotten those
            // slots, so such transfers are charged the uncontended time ([R]).
            Some(_) if t < now => t + xfer_ns(bytes, self.p.channel_mb_s),
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

    /// Check FTL invariants (used by tests; O(capacity)).
    pub fn check_invariants(&self) {
        self.check_write_buffer();
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
        for (i, l) in self.lines.iter().enumerate() {
            assert!(l.vpc + l.ipc <= self.pages_per_line, "line {i} over-full");
            let free = self.free_lines.contains(&(i as u32));
            assert_eq!(free, l.state == LineState::Free, "line {i} free list");
            assert!(
                l.state != LineState::Free || l.vpc + l.ipc == 0,
                "free line {i} used"
            );
        }
        for (k, &w) in self.wp_line.iter().enumerate() {
            assert!(
                w == gc::NO_LINE || self.lines[w as usize].state == LineState::Open,
                "wp {k}"
            );
        }
        let victims = self
            .lines
            .iter()
            .filter(|l| l.state == LineState::Victim)
            .count();
        assert!(victims <= 1, "{victims} victims");
    }
}

impl Ssd {
    /// Write-buffer accounting: every byte held is in the open flash page, in a
    /// started program not yet released, or in a deferred program; nothing is
    /// deferred without read priority; the count of deferred programs matches.
    fn check_write_buffer(&self) {
        let started: u64 = self.wbuf_pending.iter().map(|r| r.0 .1 as u64).sum::<u64>()
            - self.wbuf_moved.iter().map(|&(_, b)| b as u64).sum::<u64>();
        let deferred: u64 = self
            .lun_deferred
            .iter()
            .flatten()
            .map(|d| d.release_bytes as u64)
            .sum();
        assert_eq!(
            self.wbuf_used_bytes,
            self.wbuf_open_bytes + started + deferred,
            "write buffer bytes: held vs open + programming + deferred"
        );
        let n: usize = self.lun_deferred.iter().map(|q| q.len()).sum();
        assert_eq!(n, self.deferred_programs as usize, "deferred program count");
        assert!(
            self.p.read_priority || n == 0,
            "deferred without read priority"
        );
        assert!(
            self.wbuf_open_bytes < self.p.flash_page_bytes as u64,
            "open flash page holds a whole page"
        );
    }
}

/// NVMeVirt's transfer rule: each 128 B unit costs ⌊128·10⁹ / (MB/s · 2²⁰)⌋ ns.
pub fn xfer_ns(bytes: u64, mb_s: u32) -> u64 {
    let unit = 128 * 1_000_000_000u64 / (mb_s as u64 * 1_048_576);
    bytes.div_ceil(128) * unit
}

#[cfg(test)]
mod tests;
