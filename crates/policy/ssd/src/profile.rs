//! SSD profiles (docs/ssd-model.md §4.1). Sources: [F] = FEMU, [V] = NVMeVirt, [R] = our
//! choice, [D] = derived (docs/sources.md).

use crate::WearProfile;
use serde::{Deserialize, Serialize};

/// Device state before a run (Gimbal and the NSDI paper compare clean and fragmented SSDs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precondition {
    /// Nothing mapped.
    Empty,
    /// Whole logical space written sequentially once.
    Clean,
    /// Sequential fill, then `overwrite_permille`/1000 × capacity random 4 KiB overwrites,
    /// issued on the model clock; their GC debt and backlog carry into the run.
    Fragmented { overwrite_permille: u32 },
}

/// Timing and geometry of one SSD. All times in ns, all rates in MB/s (2^20 B/s, NVMeVirt's unit).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SsdProfile {
    pub name: String,
    pub channels: u32,
    pub luns_per_channel: u32,
    /// Blocks per LUN = lines in the device (one line = one block index across all LUNs).
    pub blocks_per_lun: u32,
    /// Flash pages per block times sub-pages per flash page (i.e. mapping pages per block).
    pub pages_per_block: u32,
    /// Mapping unit (4 KiB).
    pub page_bytes: u32,
    /// Program unit (FEMU: 4 KiB; NVMeVirt 970 PRO: 32 KiB one-shot page).
    pub flash_page_bytes: u32,
    pub read_lsb_ns: u64,
    pub read_msb_ns: u64,
    pub read_full_lsb_ns: u64,
    pub read_full_msb_ns: u64,
    pub program_ns: u64,
    pub erase_ns: u64,
    /// NAND channel bandwidth; 0 = channel transfer not modelled (FEMU default).
    pub channel_mb_s: u32,
    /// Host interface bandwidth; 0 = not modelled.
    pub pcie_mb_s: u32,
    pub fw_read_small_ns: u64,
    pub fw_read_large_ns: u64,
    /// A read of ≤ 4 KiB × this many partitions pays the small firmware cost (NVMeVirt).
    pub fw_read_small_partitions: u32,
    pub fw_write_ns: u64,
    pub fw_write_per_4k_ns: u64,
    /// Shared DRAM write buffer; 0 = off (writes complete when programmed).
    pub write_buffer_bytes: u64,
    pub early_completion: bool,
    pub overprovision_permille: u32,
    /// Background GC when free lines ≤ this share of lines (at least the forced threshold).
    pub gc_lo_free_permille: u32,
    /// Forced (foreground) GC when free lines ≤ this share of lines (at least 2 lines).
    pub gc_hi_free_permille: u32,
    /// [R] Static mapping: LPN → fixed striped page, no FTL tables, no GC. The same
    /// timing as a clean FTL drive whose GC has not started (test
    /// `static_map_matches_a_clean_ftl_drive_until_gc`), except that rewritten pages are
    /// read from their home LUN; used for very large simulations where per-SSD tables
    /// would not fit in memory.
    #[serde(default)]
    pub static_map: bool,
    /// Reads go ahead of buffered programs that have not started on their LUN (the
    /// controller schedules a program only when its LUN has no read waiting). Real
    /// controllers do (Wu and He, FAST 2012: read-priority scheduling is their
    /// baseline); FEMU's and NVMeVirt's LUN models serve operations in arrival order.
    /// Needs a write buffer with early completion (a write that waits for its program
    /// cannot be reordered after it was answered). Suspend is separate (below).
    #[serde(default)]
    pub read_priority: bool,
    /// Program suspend: a host read that reaches a LUN while a program runs there
    /// suspends it, waits this long for the suspend to take effect, runs, and the
    /// program resumes after it (its end moves by this plus the read). 0 = off: the
    /// read waits for the program. Once per program (later reads queue behind the
    /// suspension's reads or, after the program resumed, behind the program); only
    /// when more of the program remains than the suspend costs. Default off in every
    /// profile. Sources: MQSim's default `Suspend_Program_Time` is 100 µs (FAST'18,
    /// `ssdconfig.xml`); FEMU's `pe_suspend` pushes the suspended operation's end back
    /// by the read's array time plus `tsusp_ns` (docs/ssd-model.md "Suspend").
    #[serde(default)]
    pub program_suspend_ns: u64,
    /// The same for a block erase (MQSim's default `Suspend_Erase_Time`: 700 µs).
    #[serde(default)]
    pub erase_suspend_ns: u64,
    /// Wear and failure (docs/ssd-model.md, "Wear and failure"); the defaults keep a
    /// fresh drive's timing unchanged.
    #[serde(default)]
    pub wear: WearProfile,
}

impl SsdProfile {
    /// FEMU bbssd defaults [F]: 8 ch × 8 LUN, 256 blocks × 256 pages of 4 KiB (16 GiB),
    /// read 40 µs, program 200 µs, erase 2 ms, no channel model, GC at 25% / 5% free lines.
    pub fn femu() -> Self {
        SsdProfile {
            name: "femu".into(),
            channels: 8,
            luns_per_channel: 8,
            blocks_per_lun: 256,
            pages_per_block: 256,
            page_bytes: 4096,
            flash_page_bytes: 4096,
            read_lsb_ns: 40_000,
            read_msb_ns: 40_000,
            read_full_lsb_ns: 40_000,
            read_full_msb_ns: 40_000,
            program_ns: 200_000,
            erase_ns: 2_000_000,
            channel_mb_s: 0,
            pcie_mb_s: 0,
            fw_read_small_ns: 0,
            fw_read_large_ns: 0,
            fw_read_small_partitions: 1,
            fw_write_ns: 0,
            fw_write_per_4k_ns: 0,
            write_buffer_bytes: 0,
            early_completion: false,
            // FEMU exposes the whole device; [R] 7% spare so that greedy GC can make progress.
            overprovision_permille: 70,
            gc_lo_free_permille: 250,
            gc_hi_free_permille: 50,
            static_map: false,
            read_priority: false,
            program_suspend_ns: 0,
            erase_suspend_ns: 0,
            wear: WearProfile::default(),
        }
    }

    /// NVMeVirt's calibrated Samsung 970 PRO [V]: 8 ch × 2 LUN, 32 KiB one-shot pages,
    /// 800 MB/s channels, 3360 MB/s PCIe, 1 MiB write buffer with early completion.
    /// `blocks_per_lun` is reduced from 8192 to keep the simulator's tables small;
    /// timing does not depend on it, GC frequency does (scale with `with_blocks`).
    pub fn nvmevirt_970pro() -> Self {
        SsdProfile {
            name: "nvmevirt-970pro".into(),
            channels: 8,
            luns_per_channel: 2,
            blocks_per_lun: 512,
            pages_per_block: 8 * 192,
            page_bytes: 4096,
            flash_page_bytes: 32768,
            read_lsb_ns: 29_760,
            read_msb_ns: 41_760,
            read_full_lsb_ns: 30_013,
            read_full_msb_ns: 42_013,
            program_ns: 185_000,
            erase_ns: 0,
            channel_mb_s: 800,
            pcie_mb_s: 3360,
            fw_read_small_ns: 21_500,
            fw_read_large_ns: 30_490,
            fw_read_small_partitions: 4,
            fw_write_ns: 4_000,
            fw_write_per_4k_ns: 460,
            write_buffer_bytes: 2 * 8 * 2 * 32768,
            early_completion: true,
            overprovision_permille: 70,
            gc_lo_free_permille: 0,
            gc_hi_free_permille: 0,
            static_map: false,
            read_priority: false,
            program_suspend_ns: 0,
            erase_suspend_ns: 0,
            wear: WearProfile::default(),
        }
    }

    /// A PCIe Gen4 x4 datacenter TLC SSD shaped after the Samsung PM9A3 960 GB of the
    /// NSDI'26 testbed. [R]: geometry and NAND times are chosen so that the model's
    /// ceilings approximate the vendor datasheet (see docs/ssd-model.md for the arithmetic
    /// and the caveats): ~6.5 GB/s sequential read, ~580 K random-read IOPS, ~1.5 GB/s write.
    pub fn pm9a3() -> Self {
        SsdProfile {
            name: "pm9a3-gen4".into(),
            channels: 8,
            luns_per_channel: 4,
            blocks_per_lun: 256,
            pages_per_block: 4 * 128,
            page_bytes: 4096,
            flash_page_bytes: 16384,
            read_lsb_ns: 55_000,
            read_msb_ns: 55_000,
            read_full_lsb_ns: 60_000,
            read_full_msb_ns: 60_000,
            program_ns: 350_000,
            erase_ns: 3_500_000,
            channel_mb_s: 1200,
            pcie_mb_s: 6700,
            fw_read_small_ns: 5_000,
            fw_read_large_ns: 7_000,
            fw_read_small_partitions: 1,
            fw_write_ns: 3_000,
            fw_write_per_4k_ns: 200,
            write_buffer_bytes: 4 << 20,
            early_completion: true,
            overprovision_permille: 70,
            gc_lo_free_permille: 100,
            gc_hi_free_permille: 30,
            static_map: false,
            // A real controller's scheduling (see the field); FEMU and NVMeVirt keep
            // arrival order, so their profiles leave it off.
            read_priority: true,
            program_suspend_ns: 0,
            erase_suspend_ns: 0,
            wear: WearProfile::default(),
        }
    }

    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "femu" => Some(Self::femu()),
            "nvmevirt-970pro" | "970pro" => Some(Self::nvmevirt_970pro()),
            "pm9a3-gen4" | "pm9a3" => Some(Self::pm9a3()),
            _ => None,
        }
    }

    /// Same timing, fewer lines (smaller tables, proportionally scaled GC thresholds).
    pub fn with_blocks(mut self, blocks_per_lun: u32) -> Self {
        self.blocks_per_lun = blocks_per_lun;
        self
    }

    pub fn validate(&self) {
        self.wear.validate();
        assert!(self.channels > 0 && self.luns_per_channel > 0);
        assert!(self.page_bytes > 0 && self.flash_page_bytes.is_multiple_of(self.page_bytes));
        let sub = self.flash_page_bytes / self.page_bytes;
        assert!(
            self.pages_per_block.is_multiple_of(sub),
            "pages_per_block must hold whole flash pages"
        );
        assert!(self.blocks_per_lun >= 8, "need at least 8 lines");
        assert!(self.overprovision_permille < 1000);
        assert!(
            self.write_buffer_bytes == 0
                || self.write_buffer_bytes >= 2 * self.flash_page_bytes as u64,
            "a write buffer must hold at least two flash pages"
        );
        assert!(
            !self.read_priority || (self.write_buffer_bytes > 0 && self.early_completion),
            "read_priority needs a write buffer with early completion"
        );
        assert!(
            self.gc_hi_free_permille <= self.gc_lo_free_permille || self.gc_lo_free_permille == 0
        );
    }
}
