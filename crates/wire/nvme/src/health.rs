//! Trellis's extended health log page (vendor-specific Log Identifier
//! [`EXT_HEALTH_LID`], C1h), in the spirit of vendors' extended SMART: per
//! namespace, what the standard SMART page has no room for: latency
//! percentiles per operation, error counts by kind, the drive's GC activity,
//! its wear distribution and the failure predictor's state.
//!
//! 512 bytes, little-endian, fixed offsets (docs/target.md "Drive health"
//! gives the table); `nvme get-log /dev/nvmeX --log-id=0xc1 --log-len=512
//! --namespace-id=N` reads it. Fields a source cannot give are
//! [`NOT_REPORTED`] (all ones).

use crate::{le16, le32, le64, put16, put32, put64};

/// Log Identifier of the page (C0h is the QoS view).
pub const EXT_HEALTH_LID: u8 = 0xC1;
/// Length of the page.
pub const EXT_HEALTH_LEN: usize = EXT_HEALTH_LEN_U16 as usize;
/// The same, as the page's length field carries it.
const EXT_HEALTH_LEN_U16: u16 = 512;
/// Format version.
pub const EXT_HEALTH_VERSION: u16 = 1;
/// A 32-bit field the source does not report.
pub const NOT_REPORTED: u32 = u32::MAX;

/// Where the wear figures come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Source {
    /// The node only: no wear figures (RAM, null, a file on a disk that
    /// reports none).
    #[default]
    Node = 0,
    /// The drive itself (an NVMe drive's SMART page, the emulated model).
    Drive = 1,
}

/// The failure predictor's verdict on the drive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Verdict {
    /// No predictor watches this drive.
    #[default]
    NotWatched = 0,
    Healthy = 1,
    Degraded = 2,
    PredictedFailure = 3,
    Failed = 4,
}

impl Verdict {
    /// The name `trellis ctl get health` and logs use.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::NotWatched => "not watched",
            Verdict::Healthy => "healthy",
            Verdict::Degraded => "degraded",
            Verdict::PredictedFailure => "predicted failure",
            Verdict::Failed => "failed",
        }
    }
}

/// Latency percentiles of one operation, µs (upper bounds of the target's
/// log2 buckets); [`NOT_REPORTED`] with no command yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Percentiles {
    pub p50_us: u32,
    pub p99_us: u32,
    pub p999_us: u32,
    pub max_us: u32,
}

/// The page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtHealth {
    pub nsid: u32,
    pub source: Source,
    pub critical_warning: u8,
    pub percentage_used: u8,
    pub available_spare_pct: u8,
    pub temperature_k: u16,
    pub read: Percentiles,
    pub write: Percentiles,
    /// Commands failed with a media error (SCT 2h), since start.
    pub media_errors: u64,
    /// Commands the backend failed for any reason, since start.
    pub backend_errors: u64,
    /// The drive's read-retry steps and uncorrectable reads.
    pub read_retries: u64,
    pub uncorrectable_reads: u64,
    pub unsafe_shutdowns: u64,
    pub power_on_hours: u64,
    /// GC: victim lines chosen, pages moved, block erases, host writes
    /// stalled by foreground GC.
    pub gc_runs: u64,
    pub gc_pages_moved: u64,
    pub erases: u64,
    pub gc_foreground_stalls: u64,
    /// Wear: P/E cycles average and maximum over blocks, the rating.
    pub pe_cycles_avg: u32,
    pub pe_cycles_max: u32,
    pub rated_pe_cycles: u32,
    pub bad_blocks: u32,
    pub spare_blocks: u32,
    pub verdict: Verdict,
    /// With [`Verdict::PredictedFailure`]: hours until the predicted
    /// failure at the current trend ([`NOT_REPORTED`] otherwise).
    pub horizon_hours: u32,
}

fn put_pct(b: &mut [u8], off: usize, p: &Percentiles) {
    put32(b, off, p.p50_us);
    put32(b, off + 4, p.p99_us);
    put32(b, off + 8, p.p999_us);
    put32(b, off + 12, p.max_us);
}

fn get_pct(b: &[u8], off: usize) -> Percentiles {
    Percentiles {
        p50_us: le32(b, off),
        p99_us: le32(b, off + 4),
        p999_us: le32(b, off + 8),
        max_us: le32(b, off + 12),
    }
}

impl ExtHealth {
    /// Writes the page at the front of `b` (at least [`EXT_HEALTH_LEN`]).
    pub fn encode(&self, b: &mut [u8]) {
        let Some(b) = crate::front_mut::<EXT_HEALTH_LEN>(b) else {
            return;
        };
        b.fill(0);
        put16(b, 0, EXT_HEALTH_VERSION);
        put16(b, 2, EXT_HEALTH_LEN_U16);
        put32(b, 4, self.nsid);
        b[8] = self.source as u8;
        b[9] = self.critical_warning;
        b[10] = self.percentage_used;
        b[11] = self.available_spare_pct;
        put16(b, 12, self.temperature_k);
        b[14] = self.verdict as u8;
        put_pct(b, 16, &self.read);
        put_pct(b, 32, &self.write);
        for (i, v) in [
            self.media_errors,
            self.backend_errors,
            self.read_retries,
            self.uncorrectable_reads,
            self.unsafe_shutdowns,
            self.power_on_hours,
            self.gc_runs,
            self.gc_pages_moved,
            self.erases,
            self.gc_foreground_stalls,
        ]
        .into_iter()
        .enumerate()
        {
            put64(b, 48 + 8 * i, v);
        }
        for (i, v) in [
            self.pe_cycles_avg,
            self.pe_cycles_max,
            self.rated_pe_cycles,
            self.bad_blocks,
            self.spare_blocks,
            self.horizon_hours,
        ]
        .into_iter()
        .enumerate()
        {
            put32(b, 128 + 4 * i, v);
        }
    }

    /// Decodes a page; bytes past a short `b` read as zero.
    pub fn decode(b: &[u8]) -> ExtHealth {
        let b = &crate::padded::<EXT_HEALTH_LEN>(b);
        let u = |i: usize| le64(b, 48 + 8 * i);
        let w = |i: usize| le32(b, 128 + 4 * i);
        ExtHealth {
            nsid: le32(b, 4),
            source: if b[8] == 1 {
                Source::Drive
            } else {
                Source::Node
            },
            critical_warning: b[9],
            percentage_used: b[10],
            available_spare_pct: b[11],
            temperature_k: le16(b, 12),
            verdict: match b[14] {
                1 => Verdict::Healthy,
                2 => Verdict::Degraded,
                3 => Verdict::PredictedFailure,
                4 => Verdict::Failed,
                _ => Verdict::NotWatched,
            },
            read: get_pct(b, 16),
            write: get_pct(b, 32),
            media_errors: u(0),
            backend_errors: u(1),
            read_retries: u(2),
            uncorrectable_reads: u(3),
            unsafe_shutdowns: u(4),
            power_on_hours: u(5),
            gc_runs: u(6),
            gc_pages_moved: u(7),
            erases: u(8),
            gc_foreground_stalls: u(9),
            pe_cycles_avg: w(0),
            pe_cycles_max: w(1),
            rated_pe_cycles: w(2),
            bad_blocks: w(3),
            spare_blocks: w(4),
            horizon_hours: w(5),
        }
    }
}

/// The version and length at the page's front, for a reader that checks
/// them before trusting the rest.
pub fn ext_health_header(b: &[u8]) -> (u16, u16) {
    let b = &crate::padded::<4>(b);
    (le16(b, 0), le16(b, 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_round_trips_at_its_documented_offsets() {
        let h = ExtHealth {
            nsid: 3,
            source: Source::Drive,
            critical_warning: 0x09,
            percentage_used: 42,
            available_spare_pct: 7,
            temperature_k: 318,
            read: Percentiles {
                p50_us: 64,
                p99_us: 512,
                p999_us: 2048,
                max_us: 8192,
            },
            write: Percentiles::default(),
            media_errors: 5,
            erases: 1 << 40,
            bad_blocks: 17,
            verdict: Verdict::PredictedFailure,
            horizon_hours: 240,
            ..Default::default()
        };
        let mut b = vec![0xFF; EXT_HEALTH_LEN];
        h.encode(&mut b);
        assert_eq!(ExtHealth::decode(&b), h);
        assert_eq!(ext_health_header(&b), (1, 512));
        assert_eq!(b[9], 0x09, "critical warning at byte 9");
        assert_eq!(le32(&b, 20), 512, "read p99 at 20");
        assert_eq!(le64(&b, 48), 5, "media errors at 48");
        assert_eq!(le64(&b, 48 + 8 * 8), 1 << 40, "erases at 112");
        assert_eq!(le32(&b, 140), 17, "bad blocks at 140");
        assert_eq!(b[14], 3, "verdict at 14");
        assert!(b[152..].iter().all(|&x| x == 0), "reserved bytes are zero");
    }

    #[test]
    fn a_short_or_garbage_page_decodes_without_panicking() {
        let h = ExtHealth::decode(&[1, 0, 0]);
        assert_eq!(h.nsid, 0);
        let h = ExtHealth::decode(&[0xEE; 600]);
        assert_eq!(h.verdict, Verdict::NotWatched);
        assert_eq!(h.source, Source::Node);
    }
}
