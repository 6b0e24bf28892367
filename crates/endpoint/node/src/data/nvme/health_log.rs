//! The extended health log page (LID C1h, `trellis_nvme::health`): one
//! namespace's latency percentiles, error counts, unsafe shutdowns, and
//! what its drive says of its wear and GC (issue 33).

use crate::state::nsset::SubNs;
use crate::state::stats::LAT_BUCKETS;
use crate::state::subsystem::{Namespace, Registry};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use trellis_nvme::health::{ExtHealth, Percentiles, Source, NOT_REPORTED};
use trellis_nvme::status::generic;
use trellis_nvme::Status;

/// The page of namespace `nsid`; for 0 or FFFFFFFFh, of the namespace
/// whose drive is most worn (highest critical warning, then percentage
/// used), so a host that asks for the controller sees the worst.
pub fn ext_health(reg: &Registry, sub: &SubNs, nsid: u32) -> Result<ExtHealth, Status> {
    if nsid == 0 || nsid == 0xFFFF_FFFF {
        return sub
            .namespaces
            .iter()
            .map(|ns| of(reg, ns))
            .max_by_key(|h| (h.critical_warning, h.percentage_used))
            .ok_or(generic::INVALID_NAMESPACE.dnr());
    }
    let ns = sub
        .namespace(nsid)
        .ok_or(generic::INVALID_NAMESPACE.dnr())?;
    Ok(of(reg, ns))
}

fn of(reg: &Registry, ns: &Namespace) -> ExtHealth {
    let s = ns.stats();
    let c = reg.health().counters(&ns.info().nguid);
    let smart = ns.backend().drive_smart();
    let w = ns.backend().drive_wear().unwrap_or_default();
    let has_wear = ns.backend().drive_wear().is_some();
    let nr = |v: u32| if has_wear { v } else { NOT_REPORTED };
    let (verdict, horizon_hours) = reg
        .verdicts()
        .get(ns.uid())
        .unwrap_or((Default::default(), NOT_REPORTED));
    ExtHealth {
        nsid: ns.nsid(),
        source: if smart.is_some() {
            Source::Drive
        } else {
            Source::Node
        },
        critical_warning: smart.map_or(0, |d| d.critical_warning)
            | reg.verdicts().warning_bits(ns.uid()),
        percentage_used: smart.map_or(0, |d| d.percent_used),
        available_spare_pct: smart.map_or(100, |d| d.available_spare_pct),
        temperature_k: ns
            .backend()
            .temperature_k()
            .or(smart.map(|d| d.temperature_k).filter(|&t| t != 0))
            .unwrap_or_else(|| reg.node_temperature_k()),
        read: percentiles(&s.latency[0]),
        write: percentiles(&s.latency[1]),
        media_errors: s.media_errors.load(Relaxed),
        backend_errors: s.backend_errors.load(Relaxed),
        read_retries: w.read_retries,
        uncorrectable_reads: w.uncorrectable_reads,
        unsafe_shutdowns: c.unsafe_shutdowns,
        power_on_hours: c.power_on_hours,
        gc_runs: w.gc_runs,
        gc_pages_moved: w.gc_pages_moved,
        erases: w.erases,
        gc_foreground_stalls: w.gc_foreground_stalls,
        pe_cycles_avg: nr(w.pe_cycles_avg),
        pe_cycles_max: nr(w.pe_cycles_max),
        rated_pe_cycles: nr(w.rated_pe_cycles),
        bad_blocks: nr(w.bad_blocks),
        spare_blocks: nr(w.spare_blocks),
        verdict,
        horizon_hours,
    }
}

/// p50, p99, p99.9 and max from the log2 µs buckets (bucket i holds
/// latencies up to 2^i µs): each the upper bound of the bucket the rank
/// falls in; all [`NOT_REPORTED`] with no command yet.
pub fn percentiles(b: &[AtomicU64; LAT_BUCKETS]) -> Percentiles {
    let counts: Vec<u64> = b.iter().map(|c| c.load(Relaxed)).collect();
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return Percentiles {
            p50_us: NOT_REPORTED,
            p99_us: NOT_REPORTED,
            p999_us: NOT_REPORTED,
            max_us: NOT_REPORTED,
        };
    }
    let at = |q_permille: u64| {
        // The rank of the quantile, 1-based, rounded up.
        let rank = (total * q_permille).div_ceil(1000).max(1);
        let mut seen = 0;
        for (i, n) in counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return 1u32 << i.min(31);
            }
        }
        1u32 << (LAT_BUCKETS - 1).min(31)
    };
    Percentiles {
        p50_us: at(500),
        p99_us: at(990),
        p999_us: at(999),
        max_us: at(1000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_the_upper_bounds_of_the_buckets_their_ranks_fall_in() {
        let b: [AtomicU64; LAT_BUCKETS] = Default::default();
        assert_eq!(percentiles(&b).p50_us, NOT_REPORTED);
        b[6].store(990, Relaxed); // ≤ 64 µs
        b[9].store(9, Relaxed); // ≤ 512 µs
        b[13].store(1, Relaxed); // ≤ 8192 µs
        let p = percentiles(&b);
        assert_eq!(
            (p.p50_us, p.p99_us, p.p999_us, p.max_us),
            (64, 64, 512, 8192)
        );
    }
}
