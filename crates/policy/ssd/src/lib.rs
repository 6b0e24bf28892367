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

//!
//! This file holds the drive's state, its construction, `submit` and the
//! transfer timing; `read.rs` and `write.rs` are the two I/O paths, `lun.rs`
//! the LUN timelines (deferred programs, suspends), `gc.rs` garbage
//! collection, `precondition.rs` the clean and fragmented states, `wear.rs`
//! P/E cycles, bad blocks, read retries and the SMART health snapshot (`health`,
//! `submit_checked`), `fault.rs` injected failure modes (a degrading or silent drive),
//! and `invariants.rs` the checks tests run.

mod calibrate;
pub mod fault;
mod gc;
mod invariants;
mod ledger;
mod lun;
mod precondition;
mod profile;
mod read;
mod wear;
mod write;
pub use calibrate::{calibrate, Calibration, SATURATION_PERMILLE};
use ledger::Ledger;
pub use profile::{Precondition, SsdProfile};
use trellis_units::{IoDir, Nanos};
pub use wear::{Health, WearProfile, AVAILABLE_SPARE_THRESHOLD_PCT, MEDIA_ERRORS_DEGRADED};

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

/// What `Ssd::submit_checked` tells the caller about one I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Completion {
    /// Completion time in ns (the caller's clock, as `submit` returns).
    pub done_ns: Nanos,
    /// A read of at least one flash page was uncorrectable after `read_retry_max`
    /// read-retry steps (NVMe status "Unrecovered Read Error").
    pub media_error: bool,
    /// A write refused because the drive is read-only (spares exhausted); nothing was
    /// written (NVMe status "Attempted Write to Read Only Range" or similar is the
    /// caller's choice).
    pub read_only: bool,
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
    /// P/E cycles, bad blocks, spares, read errors (`wear.rs`).
    wear: wear::Wear,
    /// Set by a read path when a flash read of the current I/O was uncorrectable.
    io_media_error: bool,
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

/// The drive's geometry, derived once from its profile.
#[derive(Clone, Copy)]
struct Geometry {
    luns: u32,
    subpages: u32,
    pages_per_line: u32,
    flash_pages_per_block: u32,
    lines_total: u32,
    physical: u64,
    gc_hi_lines: u32,
    gc_lo_lines: u32,
    logical_pages: u32,
}

impl Geometry {
    /// Panics on a geometry the model cannot hold (u32 page addresses, room
    /// for the GC thresholds), as `SsdProfile::validate` does on bad fields.
    fn of(profile: &SsdProfile) -> Geometry {
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
        Geometry {
            luns,
            subpages,
            pages_per_line,
            flash_pages_per_block,
            lines_total,
            physical,
            gc_hi_lines,
            gc_lo_lines,
            logical_pages,
        }
    }
}

impl Ssd {
    pub fn new(profile: SsdProfile) -> Self {
        profile.validate();
        let g = Geometry::of(&profile);
        let wbuf_slots =
            (profile.write_buffer_bytes / profile.flash_page_bytes as u64) as usize + 1;
        let mut ssd = Ssd {
            luns: g.luns,
            subpages: g.subpages,
            pages_per_line: g.pages_per_line,
            flash_pages_per_block: g.flash_pages_per_block,
            logical_pages: g.logical_pages,
            gc_hi_lines: g.gc_hi_lines,
            gc_lo_lines: g.gc_lo_lines,
            lun_avail_ns: vec![0; g.luns as usize],
            lun_deferred: vec![std::collections::VecDeque::new(); g.luns as usize],
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
                vec![UNMAPPED; g.logical_pages as usize]
            },
            rmap: if profile.static_map {
                Vec::new()
            } else {
                vec![FREE; g.physical as usize]
            },
            lines: vec![
                Line {
                    vpc: 0,
                    ipc: 0,
                    state: LineState::Free
                };
                g.lines_total as usize
            ],
            free_lines: (0..g.lines_total).collect(),
            wp_line: [gc::NO_LINE; 2],
            wp_index: [0; 2],
            gc: gc::GcState::new(g.luns, g.subpages),
            wbuf_used_bytes: 0,
            wbuf_open_bytes: 0,
            wbuf_pending: std::collections::BinaryHeap::with_capacity(wbuf_slots),
            suspendable: vec![None; g.luns as usize],

            wbuf_moved: Vec::new(),
            wbuf_released_ns: 0,
            stats: SsdStats::default(),
            wear: wear::Wear::new(&profile.wear, g.luns * g.lines_total),
            io_media_error: false,
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

    /// NVMe SMART / Health snapshot (see [`Health`]). O(blocks): not for every I/O.
    pub fn health(&self) -> Health {
        self.wear.health(&self.p.wear)
    }

    /// Sets the least raw bit-error rate of every host read from now on (an injected
    /// fault's, [`fault::FaultPlan::effect`]; 0 = none): reads past the ECC limit take
    /// read-retry steps, past the last one they are uncorrectable.
    pub fn set_rber_floor(&mut self, rber: f64) {
        self.wear.rber_floor = if rber.is_finite() { rber.max(0.0) } else { 0.0 };
    }

    /// Whether the drive is read-only (a block retired with no spare left),
    /// without computing the whole health snapshot.
    pub fn read_only(&self) -> bool {
        self.wear.read_only()
    }

    /// Submit one I/O at `now_ns`; returns its completion time in ns.
    /// The offset wraps modulo the logical capacity so that any trace can be replayed.
    /// Media errors and read-only refusals are visible through `submit_checked`.
    pub fn submit(
        &mut self,
        dir: IoDir,
        offset_bytes: u64,
        size_bytes: u32,
        now_ns: Nanos,
    ) -> Nanos {
        self.submit_checked(dir, offset_bytes, size_bytes, now_ns)
            .done_ns
    }

    /// `submit`, also reporting an uncorrectable read or a write refused by a
    /// read-only drive.
    pub fn submit_checked(
        &mut self,
        dir: IoDir,
        offset_bytes: u64,
        size_bytes: u32,
        now_ns: Nanos,
    ) -> Completion {
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
        self.io_media_error = false;
        let read_only = dir == IoDir::Write && self.wear.read_only();
        let done = match dir {
            IoDir::Read => self.read(first as u32, n_pages, size_bytes, now),
            // [R] A read-only drive answers a write after its firmware overhead only.
            IoDir::Write if read_only => now + self.p.fw_write_ns,
            IoDir::Write => self.write(first as u32, n_pages, size_bytes, now),
        };
        Completion {
            done_ns: self.epoch_ext_ns + (done - self.epoch_int_ns),
            media_error: self.io_media_error,
            read_only,
        }
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
}

/// NVMeVirt's transfer rule: each 128 B unit costs ⌊128·10⁹ / (MB/s · 2²⁰)⌋ ns.
pub fn xfer_ns(bytes: u64, mb_s: u32) -> u64 {
    let unit = 128 * 1_000_000_000u64 / (mb_s as u64 * 1_048_576);
    bytes.div_ceil(128) * unit
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod wear_tests;
