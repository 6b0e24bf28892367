//! Eager bandwidth reservation (§3.2): when a command passes a hop, reserve egress
//! bandwidth on the reverse port for the response it will cause.

use serde::{Deserialize, Serialize};
use trellis_units::{IoDir, Nanos};

/// NVMe/TCP bytes controller→host caused by one command (no digests) [R, Ex 3-1]:
/// read = C2HData header + data + CapsuleResp; write (via R2T) = R2T + CapsuleResp.
pub fn response_bytes(dir: IoDir, len: u32) -> u32 {
    match dir {
        IoDir::Read => 24 + len + 24,
        IoDir::Write => 24 + 24,
    }
}

/// NVMe/TCP CapsuleResp PDU (no digest): a write's whole response when its data rode in
/// the command capsule (no R2T, so `response_bytes(Write)` overcounts it by the R2T).
pub const CAPSULE_RESP_BYTES: u32 = 24;

/// NVMe/TCP bytes host→controller of a command whose data, if any, ride in the capsule:
/// CapsuleCmd header plus in-capsule data (no H2CData PDU).
pub fn capsule_bytes(dir: IoDir, len: u32) -> u32 {
    match dir {
        IoDir::Read => 72,
        IoDir::Write => 72 + len,
    }
}

/// NVMe/TCP bytes host→controller: CapsuleCmd, plus H2CData header and data for writes
/// (the R2T path).
pub fn request_bytes(dir: IoDir, len: u32) -> u32 {
    match dir {
        IoDir::Read => 72,
        IoDir::Write => 72 + 24 + len,
    }
}

/// Offline profile of the response time T_prof(dir, size) = base + size / rate [R].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReserveConfig {
    /// Over-commit factor R_over ≤ 1 in permille [R: 800].
    pub over_commit_permille: u32,
    pub read_base_ns: u64,
    pub read_bytes_per_s: u64,
    pub write_base_ns: u64,
    /// Burst allowance of a port's policer, bytes.
    pub burst_bytes: u64,
    /// Admission control: the share of a port's capacity that reservations may
    /// hold in total, permille [R: 900]. Conformant responses are served with
    /// strict priority; with grants up to the whole port they could take all of
    /// it and starve best-effort responses (those that did not conform). Capping
    /// the total keeps at least 10 % of every port for best effort.
    #[serde(default = "default_max_reserved_permille")]
    pub max_reserved_permille: u32,
}

fn default_max_reserved_permille() -> u32 {
    900
}

impl Default for ReserveConfig {
    fn default() -> Self {
        ReserveConfig {
            over_commit_permille: 800,
            read_base_ns: 80_000,
            read_bytes_per_s: 3_000_000_000,
            write_base_ns: 30_000,
            burst_bytes: 65_536,
            max_reserved_permille: default_max_reserved_permille(),
        }
    }
}

impl ReserveConfig {
    pub fn t_prof_ns(&self, dir: IoDir, len: u32) -> u64 {
        match dir {
            IoDir::Read => self.read_base_ns + len as u64 * 1_000_000_000 / self.read_bytes_per_s,
            IoDir::Write => self.write_base_ns,
        }
    }

    /// r = R_over × response_bytes / T_prof, in bytes/s [R, Ex 3-2].
    pub fn reservation_bytes_per_s(&self, dir: IoDir, len: u32) -> u64 {
        let bw =
            response_bytes(dir, len) as u128 * 1_000_000_000 / self.t_prof_ns(dir, len) as u128;
        (bw * self.over_commit_permille as u128 / 1000) as u64
    }
}

/// Reservations on one egress port, with a policer at the reserved rate.
pub struct PortReservation {
    capacity_bytes_per_s: u64,
    reserved_bytes_per_s: u64,
    tokens: u64,
    burst: u64,
    last_ns: u64,
    carry: u128,
}

impl PortReservation {
    /// A port of `capacity_bytes_per_s` whose reservations may hold at most
    /// `max_reserved_permille` ‰ of it (clamped to 1000).
    pub fn new(capacity_bytes_per_s: u64, burst_bytes: u64, max_reserved_permille: u32) -> Self {
        let share = max_reserved_permille.min(1000) as u128;
        PortReservation {
            capacity_bytes_per_s: (capacity_bytes_per_s as u128 * share / 1000) as u64,
            reserved_bytes_per_s: 0,
            tokens: burst_bytes,
            burst: burst_bytes,
            last_ns: 0,
            carry: 0,
        }
    }

    /// Reserve `r` B/s; returns what was granted (capped so Σ ≤ the admitted
    /// share of the port's capacity).
    pub fn reserve(&mut self, r: u64) -> u64 {
        let room = self.capacity_bytes_per_s - self.reserved_bytes_per_s;
        let g = r.min(room);
        self.reserved_bytes_per_s += g;
        g
    }

    /// Release a grant when the last PDU of the response has left.
    pub fn release(&mut self, granted: u64) {
        assert!(
            granted <= self.reserved_bytes_per_s,
            "releasing more than reserved"
        );
        self.reserved_bytes_per_s -= granted;
    }

    pub fn reserved_bytes_per_s(&self) -> u64 {
        self.reserved_bytes_per_s
    }

    /// What a new reservation could still be granted: the admitted share of
    /// the port's capacity less what is reserved.
    pub fn room_bytes_per_s(&self) -> u64 {
        self.capacity_bytes_per_s - self.reserved_bytes_per_s
    }

    /// Does a response packet of `bytes` conform to the reserved rate now? Conformant
    /// packets use the reserved queue; the rest fall back to best effort.
    pub fn conform(&mut self, bytes: u64, now_ns: Nanos) -> bool {
        if now_ns > self.last_ns {
            let num =
                self.reserved_bytes_per_s as u128 * (now_ns - self.last_ns) as u128 + self.carry;
            self.carry = num % 1_000_000_000;
            self.tokens = (self.tokens + (num / 1_000_000_000) as u64).min(self.burst);
            self.last_ns = now_ns;
        }
        if self.tokens >= bytes {
            self.tokens -= bytes;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_sizes_match_example_3_1() {
        assert_eq!(response_bytes(IoDir::Read, 4096), 4_144);
        assert_eq!(request_bytes(IoDir::Read, 4096), 72);
        assert_eq!(response_bytes(IoDir::Write, 4096), 48);
        assert_eq!(request_bytes(IoDir::Write, 4096), 4_192);
        assert_eq!(response_bytes(IoDir::Read, 131_072), 131_120);
    }

    #[test]
    fn reservation_matches_example_3_2() {
        // T_prof = 250 µs for a 128 KiB read: BW_est = 524.48 MB/s, × 0.8 = 419.58 MB/s.
        let cfg = ReserveConfig {
            read_base_ns: 250_000,
            read_bytes_per_s: u64::MAX,
            ..ReserveConfig::default()
        };
        assert_eq!(cfg.t_prof_ns(IoDir::Read, 131_072), 250_000);
        let r = cfg.reservation_bytes_per_s(IoDir::Read, 131_072);
        assert_eq!(r, 419_584_000);
        // Ten in flight on a 100 Gb/s (12.5 GB/s) port reserve 4,195.84 MB/s = 33.6 Gb/s.
        let mut port = PortReservation::new(12_500_000_000, 65_536, 1000);
        for _ in 0..10 {
            assert_eq!(port.reserve(r), r);
        }
        assert_eq!(port.reserved_bytes_per_s(), 4_195_840_000);
        for _ in 0..10 {
            port.release(r);
        }
        assert_eq!(port.reserved_bytes_per_s(), 0);
    }

    #[test]
    fn reservations_never_exceed_port_capacity() {
        let mut port = PortReservation::new(1_000, 0, 1000);
        assert_eq!(port.reserve(700), 700);
        assert_eq!(port.room_bytes_per_s(), 300);
        assert_eq!(port.reserve(700), 300);
        assert_eq!(port.room_bytes_per_s(), 0);
        assert_eq!(port.reserve(1), 0);
    }

    #[test]
    fn admission_control_keeps_a_share_of_the_port_for_best_effort() {
        // Reservations ask for twice a 10 GB/s port; at 900 ‰ the policer lets
        // conformant bytes take at most 90 % (plus one burst) over a second, so
        // strict priority for them still leaves ≥ 10 % to best effort.
        let cap = 10_000_000_000u64;
        let cfg = ReserveConfig::default();
        let mut port = PortReservation::new(cap, cfg.burst_bytes, cfg.max_reserved_permille);
        let granted: u64 = (0..20).map(|_| port.reserve(cap / 10)).sum();
        assert_eq!(granted, cap * 9 / 10);
        let pkt = 4_144; // a 4 KiB read response
        let (mut t, mut conform_bytes) = (0u64, 0u64);
        while t < 1_000_000_000 {
            // Offer far more than the port: one packet every 100 ns (41 GB/s).
            if port.conform(pkt, t) {
                conform_bytes += pkt;
            }
            t += 100;
        }
        assert!(
            conform_bytes <= cap * 9 / 10 + cfg.burst_bytes,
            "{conform_bytes} B conformed in 1 s"
        );
        assert!(
            conform_bytes >= cap * 9 / 10 - pkt,
            "the reserved rate is honoured"
        );
    }

    #[test]
    fn policer_admits_at_reserved_rate() {
        let mut port = PortReservation::new(10_000_000_000, 9_000, 1000);
        port.reserve(1_000_000_000); // 1 B/ns
        assert!(port.conform(9_000, 0), "burst");
        assert!(!port.conform(4_000, 3_999));
        assert!(port.conform(4_000, 4_000));
    }
}
