//! INT-assisted symmetric routing (§3.1).
//!
//! A command records every hop it takes (node, ports, queueing delay, ECN). The
//! target copies the record into the completion, which retraces the hops in
//! reverse; each hop then learns the downstream delay toward that target through
//! the port it chose, and uses it for the next command's choice.

use serde::{Deserialize, Serialize};
use trellis_units::Nanos;

/// Longest path a header can record (a 10×10×10 torus needs 15 hops plus host links).
pub const MAX_HOPS: usize = 24;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HopRec {
    pub node: u32,
    pub in_port: u8,
    pub out_port: u8,
    pub ecn: bool,
    /// Queueing delay at this hop's egress, forward direction (no clock sync needed).
    pub qdelay_ns: u32,
    /// Queueing delay seen by the response at this hop's reverse egress.
    pub rev_qdelay_ns: u32,
}

/// The ISR header carried by a command and copied into its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IsrHeader {
    pub n_hops: u8,
    pub hops: [HopRec; MAX_HOPS],
    pub ssd_latency_ns: u64,
    /// Queueing delay of the completion at the target's own egress, toward the
    /// last hop. The target is no hop of the header (it forwards nothing), yet
    /// its egress is on every path of the choice: on a direct link it is the
    /// only queue the response meets.
    pub target_rev_qdelay_ns: u32,
}

impl Default for IsrHeader {
    fn default() -> Self {
        IsrHeader {
            n_hops: 0,
            hops: [HopRec::default(); MAX_HOPS],
            ssd_latency_ns: 0,
            target_rev_qdelay_ns: 0,
        }
    }
}

impl IsrHeader {
    /// Append one hop on the submission path.
    pub fn push(&mut self, rec: HopRec) {
        assert!(
            (self.n_hops as usize) < MAX_HOPS,
            "ISR header overflow: path longer than {MAX_HOPS}"
        );
        self.hops[self.n_hops as usize] = rec;
        self.n_hops += 1;
    }

    pub fn hops(&self) -> &[HopRec] {
        &self.hops[..self.n_hops as usize]
    }

    /// The hop the completion visits at reverse step `i` (0 = the hop nearest the target).
    pub fn reverse_hop(&self, i: usize) -> HopRec {
        self.hops[self.n_hops as usize - 1 - i]
    }

    /// Downstream delay from hop `h` toward the target: Σ_{k>h} forward + reverse qdelay
    /// of later hops, the target's own reverse egress, plus the reverse delay at h itself,
    /// and whether any of them marked ECN.
    pub fn downstream(&self, h: usize) -> (u64, bool) {
        let mut d = self.hops[h].rev_qdelay_ns as u64 + self.target_rev_qdelay_ns as u64;
        let mut ecn = false;
        for r in &self.hops[h + 1..self.n_hops as usize] {
            d += r.qdelay_ns as u64 + r.rev_qdelay_ns as u64;
            ecn |= r.ecn;
        }
        (d, ecn)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IsrConfig {
    /// Weight of an ECN fraction of 1.0, in ns of delay [R: 50 µs].
    pub p_ecn_ns: u64,
    /// Entries older than this score 0, forcing exploration [R: 10 ms].
    pub stale_ns: u64,
    /// EWMA shift: new = old + (sample − old) >> shift [R: 1/8].
    pub ewma_shift: u32,
    /// ECN marking threshold on egress queue bytes [R: 64 KiB].
    pub ecn_threshold_bytes: u64,
}

impl Default for IsrConfig {
    fn default() -> Self {
        IsrConfig {
            p_ecn_ns: 50_000,
            stale_ns: 10_000_000,
            ewma_shift: 3,
            ecn_threshold_bytes: 65_536,
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Tele {
    delay_ns: u64,
    /// ECN fraction in FP10.
    ecn_fp10: u64,
    updated_ns: u64,
    valid: bool,
}

/// One fabric node's telemetry: per (target, egress port).
pub struct IsrTable {
    cfg: IsrConfig,
    ports: usize,
    entries: Vec<Tele>,
}

impl IsrTable {
    pub fn new(cfg: IsrConfig, targets: usize, ports: usize) -> Self {
        IsrTable {
            cfg,
            ports,
            entries: vec![Tele::default(); targets * ports],
        }
    }

    pub fn config(&self) -> &IsrConfig {
        &self.cfg
    }

    fn idx(&self, target: u32, port: u8) -> usize {
        let i = target as usize * self.ports + port as usize;
        assert!(
            (port as usize) < self.ports && i < self.entries.len(),
            "ISR table index out of range"
        );
        i
    }

    /// Score of a candidate: local queueing + remembered downstream delay + ECN penalty.
    pub fn score(&self, target: u32, port: u8, local_qdelay_ns: Nanos, now_ns: Nanos) -> u64 {
        let e = self.entries[self.idx(target, port)];
        if !e.valid || now_ns.saturating_sub(e.updated_ns) > self.cfg.stale_ns {
            return local_qdelay_ns;
        }
        local_qdelay_ns + e.delay_ns + ((self.cfg.p_ecn_ns * e.ecn_fp10) >> 10)
    }

    /// Least-congested productive port toward `target`. `local_qdelay_ns(port)` is this
    /// node's own egress backlog; ties go to the candidate picked by `tie_rand`.
    pub fn choose(
        &self,
        target: u32,
        candidates: &[u8],
        local_qdelay_ns: impl Fn(u8) -> u64,
        now_ns: Nanos,
        tie_rand: u64,
    ) -> u8 {
        assert!(!candidates.is_empty(), "no route candidates");
        let mut best = u64::MAX;
        let mut n_best = 0u64;
        let mut pick = candidates[0];
        for &p in candidates {
            let s = self.score(target, p, local_qdelay_ns(p), now_ns);
            if s < best {
                best = s;
                n_best = 1;
                pick = p;
            } else if s == best {
                // Reservoir choice among ties: deterministic given tie_rand.
                n_best += 1;
                if mix(tie_rand, n_best).is_multiple_of(n_best) {
                    pick = p;
                }
            }
        }
        pick
    }

    /// Completion passing back through this node: learn the delay toward `target` via `port`.
    pub fn update(
        &mut self,
        target: u32,
        port: u8,
        downstream_ns: Nanos,
        ecn: bool,
        now_ns: Nanos,
    ) {
        let shift = self.cfg.ewma_shift;
        let i = self.idx(target, port);
        let e = &mut self.entries[i];
        let ecn_sample = if ecn { 1024 } else { 0 };
        if !e.valid {
            *e = Tele {
                delay_ns: downstream_ns,
                ecn_fp10: ecn_sample,
                updated_ns: now_ns,
                valid: true,
            };
            return;
        }
        e.delay_ns = ewma(e.delay_ns, downstream_ns, shift);
        e.ecn_fp10 = ewma(e.ecn_fp10, ecn_sample, shift);
        e.updated_ns = now_ns;
    }

    pub fn delay_ns(&self, target: u32, port: u8) -> u64 {
        self.entries[self.idx(target, port)].delay_ns
    }
}

fn ewma(old: u64, sample: u64, shift: u32) -> u64 {
    if sample >= old {
        old + ((sample - old) >> shift)
    } else {
        old - ((old - sample) >> shift)
    }
}

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chooses_less_loaded_of_two_paths_after_feedback() {
        // Node 0 reaches target 7 via port 1 or port 2. Completions via port 1 report
        // 40 µs downstream queueing, via port 2 report 5 µs: the next command takes port 2.
        let mut t = IsrTable::new(IsrConfig::default(), 8, 4);
        t.update(7, 1, 40_000, false, 0);
        t.update(7, 2, 5_000, false, 0);
        assert_eq!(t.choose(7, &[1, 2], |_| 0, 1_000, 0), 2);
        // Local congestion counts too: 50 µs of backlog on port 2 flips the choice.
        assert_eq!(
            t.choose(7, &[1, 2], |p| if p == 2 { 50_000 } else { 0 }, 1_000, 0),
            1
        );
        // ECN on port 1's path adds 50 µs × fraction.
        t.update(7, 1, 0, true, 2_000);
        // delay_1 = 40,000 − 40,000/8 = 35,000; ecn = 1024/8 = 128 → +6,250 ns.
        assert_eq!(t.score(7, 1, 0, 2_000), 35_000 + 6_250);
    }

    #[test]
    fn stale_entries_score_zero() {
        let mut t = IsrTable::new(IsrConfig::default(), 2, 2);
        t.update(1, 0, 100_000, false, 0);
        t.update(1, 1, 10_000, false, 20_000_000);
        // Port 0's entry is 20 ms old (> 10 ms): it scores 0 and wins.
        assert_eq!(t.choose(1, &[0, 1], |_| 0, 20_000_001, 0), 0);
    }

    #[test]
    fn completion_retraces_hops_and_sums_downstream_delay() {
        let mut h = IsrHeader::default();
        for (node, q) in [(10u32, 1_000u32), (11, 2_000), (12, 3_000)] {
            h.push(HopRec {
                node,
                in_port: 0,
                out_port: 1,
                ecn: node == 12,
                qdelay_ns: q,
                rev_qdelay_ns: 100,
            });
        }
        let back: Vec<u32> = (0..3).map(|i| h.reverse_hop(i).node).collect();
        assert_eq!(back, vec![12, 11, 10]);
        // From hop 0: its own reverse 100 + hops 1, 2 forward (2,000 + 3,000) and reverse (200).
        assert_eq!(h.downstream(0), (5_300, true));
        assert_eq!(h.downstream(2), (100, false));
        // The completion waited 700 at the target's own egress: on every path.
        h.target_rev_qdelay_ns = 700;
        assert_eq!(h.downstream(0), (6_000, true));
        assert_eq!(h.downstream(2), (800, false));
    }
}
