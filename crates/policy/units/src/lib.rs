//! Vocabulary shared by every policy crate (`trellis-qos`, `trellis-ssd`,
//! `trellis-fabric`) and their callers.
//!
//! It is a crate of its own because none of the policy crates depends on another:
//! putting the enum in one of them would make, say, the fabric depend on the SSD
//! timing model just to name a direction.
//!
//! Conventions, used across all policy crates:
//! - **Time** is [`Nanos`]: a `u64` count of nanoseconds, passed in by the caller
//!   (virtual time in the simulator, a monotonic clock in the daemon). Names end in
//!   `_ns`. Gimbal's latency ticks are µs inside `trellis-qos` (so that the worked
//!   examples of docs/gimbal.md §1.a reproduce bit-exactly); its API still takes ns.
//! - **Direction** is [`IoDir`].
//! - **A drive's capacities** are [`DeviceModel`]: `trellis-ssd` measures them on its
//!   model, `trellis-qos` sets Gimbal's drive-specific constants from them.

use serde::{Deserialize, Serialize};

/// The process's one monotonic clock, for the endpoints (the node's reactors
/// and control plane, the host library): every `_ns` time they take counts
/// from one epoch, so a node and a host in one process (the tests, `trellis
/// san`) agree on "now". Policy cores never read it; their time is passed in.
pub mod clock {
    use super::Nanos;
    use std::time::Instant;

    fn epoch() -> Instant {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *EPOCH.get_or_init(Instant::now)
    }

    /// Monotonic nanoseconds since the process's first call.
    pub fn now_ns() -> Nanos {
        instant_ns(Instant::now())
    }

    /// `t` on the clock of [`now_ns`] (0 for an instant before the epoch;
    /// saturates after 584 years).
    pub fn instant_ns(t: Instant) -> Nanos {
        let d = t.saturating_duration_since(epoch());
        Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX)
    }
}

/// A point in time or a duration, in nanoseconds. An alias, not a newtype: the
/// policy code does arithmetic on it everywhere and the unit is carried by the `_ns`
/// suffix of every name.
pub type Nanos = u64;

/// Direction of an I/O as the policy code sees it. Only NVMe WRITE is a write;
/// Flush, Write Zeroes, Dataset Management and the rest are scheduled, charged and
/// modelled as reads ([G] = Gimbal's traffic manager, docs/gimbal.md §1.a step 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoDir {
    Read,
    Write,
}

impl IoDir {
    /// 0 for reads, 1 for writes: an index into per-direction arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// What a scheduler needs to know of its drive to set Gimbal's drive-specific constants:
/// measured on the drive, or on its model (`trellis_ssd::calibrate`); used by
/// `trellis_qos::GimbalConfig::calibrated`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceModel {
    /// 4 KiB random reads per second at a deep queue (blk-iocost `rrandiops`).
    pub read_4k_iops: u64,
    /// Bytes per second of large (128 KiB) random reads at a deep queue (`rbps`).
    pub read_bytes_per_s: u64,
    /// Fewest 128 KiB reads in flight that reach 99 % of `read_bytes_per_s`.
    pub read_128k_saturation_qd: u32,
    /// Host-interface bandwidth, bytes per second; 0 when unknown.
    pub link_bytes_per_s: u64,
}

/// Parses a link rate as `tc` writes it: a whole number with `kbit`, `mbit` or
/// `gbit` (decimal units, bits per second), e.g. "1gbit", "500mbit". Returns
/// bits per second; the caller checks the range it accepts.
pub fn parse_bit_rate(s: &str) -> Result<u64, String> {
    let (num, mult) = [
        ("gbit", 1_000_000_000u64),
        ("mbit", 1_000_000),
        ("kbit", 1_000),
    ]
    .iter()
    .find_map(|(u, m)| s.strip_suffix(u).map(|n| (n, *m)))
    .ok_or_else(|| format!("rate {s:?}: give a number with kbit, mbit or gbit (e.g. 1gbit)"))?;
    let n: u64 = num
        .parse()
        .map_err(|_| format!("rate {s:?}: {num:?} is not a whole number (e.g. 1gbit, 500mbit)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("rate {s:?} is too large"))
}

#[cfg(test)]
mod rate_tests {
    use super::parse_bit_rate;

    #[test]
    fn bit_rates_parse_in_decimal_units_and_bad_ones_say_why() {
        assert_eq!(parse_bit_rate("1gbit"), Ok(1_000_000_000));
        assert_eq!(parse_bit_rate("500mbit"), Ok(500_000_000));
        assert_eq!(parse_bit_rate("100kbit"), Ok(100_000));
        assert!(parse_bit_rate("1g")
            .unwrap_err()
            .contains("kbit, mbit or gbit"));
        assert!(parse_bit_rate("1.5gbit")
            .unwrap_err()
            .contains("whole number"));
        assert!(parse_bit_rate("99999999999999gbit")
            .unwrap_err()
            .contains("too large"));
    }
}
