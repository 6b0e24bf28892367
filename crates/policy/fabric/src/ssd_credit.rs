//! Storage-driven traffic scheduling (§3.3): the target's SSD headroom rides in
//! completions; hosts rate-limit per SSD on it; hops rank packets by it.
//!
//! The **SSD credit** is that headroom, a bandwidth: B/s inside Trellis
//! (`headroom_bytes_per_s`), MiB/s in 16 bits on the wire (`ssd_credit_mib_per_s`).
//! It is per SSD and unrelated to Gimbal's per-tenant **I/O credits** (a count of
//! I/Os, `trellis_qos`).

use serde::{Deserialize, Serialize};
use trellis_units::Nanos;

const MIB: u64 = 1 << 20;

/// The SSD credit: headroom encoded in 16 bits, MiB/s, saturating at 65,535 [R] (§3.3).
pub fn ssd_credit_mib_per_s(headroom_bytes_per_s: u64) -> u16 {
    (headroom_bytes_per_s / MIB).min(65_535) as u16
}

/// Headroom in B/s from an SSD credit in MiB/s.
pub fn headroom_bytes_per_s(ssd_credit_mib_per_s: u16) -> u64 {
    ssd_credit_mib_per_s as u64 * MIB
}

/// Rank of an I/O's packets, 0 (served first) to 7, from its SSD's headroom [R]:
/// rank = 7 − min(7, ⌊8 × headroom / capacity⌋). Computed once per I/O at the host.
pub fn rank(headroom_bytes_per_s: u64, capacity_bytes_per_s: u64) -> u8 {
    assert!(capacity_bytes_per_s > 0);
    let level = (8 * headroom_bytes_per_s as u128 / capacity_bytes_per_s as u128).min(7) as u8;
    7 - level
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimiterConfig {
    pub min_bytes_per_s: u64,
    pub max_bytes_per_s: u64,
    /// Assumed number of competing hosts sharing the headroom [R: 4].
    pub competitors: u64,
    pub burst_bytes: u64,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        LimiterConfig {
            min_bytes_per_s: 50 * MIB,
            max_bytes_per_s: 8_000 * MIB,
            competitors: 4,
            burst_bytes: 256 * 1024,
        }
    }
}

/// Per-(host, SSD) rate cap driven by credits [R].
#[derive(Clone, Debug)]
pub struct HostRateLimiter {
    limit_bytes_per_s: u64,
    tokens: u64,
    last_ns: u64,
    carry: u128,
    last_headroom: u64,
}

impl HostRateLimiter {
    pub fn new(cfg: &LimiterConfig) -> Self {
        HostRateLimiter {
            limit_bytes_per_s: cfg.max_bytes_per_s,
            tokens: cfg.burst_bytes,
            last_ns: 0,
            carry: 0,
            last_headroom: u64::MAX,
        }
    }

    pub fn limit_bytes_per_s(&self) -> u64 {
        self.limit_bytes_per_s
    }

    /// Latest headroom seen for this SSD (u64::MAX before the first completion).
    pub fn last_headroom(&self) -> u64 {
        self.last_headroom
    }

    /// A completion carried the SSD credit `headroom_bytes_per_s`: grow by headroom/k, or
    /// shrink by 1/8 when none is left.
    pub fn on_ssd_credit(&mut self, cfg: &LimiterConfig, headroom_bytes_per_s: u64) {
        self.last_headroom = headroom_bytes_per_s;
        let l = self.limit_bytes_per_s;
        self.limit_bytes_per_s = if headroom_bytes_per_s > 0 {
            (l + headroom_bytes_per_s / cfg.competitors).min(cfg.max_bytes_per_s)
        } else {
            (l * 7 / 8).max(cfg.min_bytes_per_s)
        };
    }

    fn refill(&mut self, cfg: &LimiterConfig, now_ns: Nanos) {
        if now_ns <= self.last_ns {
            return;
        }
        let num = self.limit_bytes_per_s as u128 * (now_ns - self.last_ns) as u128 + self.carry;
        self.carry = num % 1_000_000_000;
        self.tokens = (self.tokens + (num / 1_000_000_000) as u64).min(cfg.burst_bytes);
        self.last_ns = now_ns;
    }

    /// Admit an I/O of `bytes` now, or return the time at which it would conform.
    pub fn admit(&mut self, cfg: &LimiterConfig, bytes: u64, now_ns: Nanos) -> Result<(), Nanos> {
        self.refill(cfg, now_ns);
        let need = bytes.min(cfg.burst_bytes);
        if self.tokens >= need {
            self.tokens -= need;
            return Ok(());
        }
        let missing = (need - self.tokens) as u128;
        let wait = (missing * 1_000_000_000).div_ceil(self.limit_bytes_per_s as u128) as u64;
        Err(now_ns + wait.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_matches_example_3_4() {
        let cap = 3000 * MIB;
        assert_eq!(rank(3000 * MIB, cap), 0, "clean SSD B");
        assert_eq!(rank(0, cap), 7, "busy SSD C");
        assert_eq!(rank(400 * MIB, cap), 6);
    }

    #[test]
    fn ssd_credit_saturates() {
        assert_eq!(ssd_credit_mib_per_s(3000 * MIB + 5), 3000);
        assert_eq!(ssd_credit_mib_per_s(u64::MAX), 65_535);
        assert_eq!(headroom_bytes_per_s(3000), 3000 * MIB);
    }

    #[test]
    fn limiter_shrinks_without_headroom_and_grows_with_it() {
        let cfg = LimiterConfig {
            min_bytes_per_s: 100,
            max_bytes_per_s: 8_000,
            competitors: 4,
            burst_bytes: 10,
        };
        let mut l = HostRateLimiter::new(&cfg);
        l.on_ssd_credit(&cfg, 0);
        assert_eq!(l.limit_bytes_per_s(), 7_000);
        l.on_ssd_credit(&cfg, 0);
        assert_eq!(l.limit_bytes_per_s(), 6_125);
        l.on_ssd_credit(&cfg, 400);
        assert_eq!(l.limit_bytes_per_s(), 6_225);
        for _ in 0..100 {
            l.on_ssd_credit(&cfg, 0);
        }
        assert_eq!(l.limit_bytes_per_s(), 100);
    }

    #[test]
    fn limiter_paces_at_its_limit() {
        let cfg = LimiterConfig {
            min_bytes_per_s: 1,
            max_bytes_per_s: 1_000_000_000,
            competitors: 4,
            burst_bytes: 4096,
        };
        let mut l = HostRateLimiter::new(&cfg);
        assert_eq!(l.admit(&cfg, 4096, 0), Ok(()));
        // 1 B/ns: the next 4 KiB conforms 4,096 ns later.
        assert_eq!(l.admit(&cfg, 4096, 0), Err(4096));
        assert_eq!(l.admit(&cfg, 4096, 4096), Ok(()));
    }
}
