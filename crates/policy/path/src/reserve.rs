//! Eager bandwidth reservation at the host edge (NSDI'26 §3.2, docs/host.md
//! "Multipath").
//!
//! In the network, each hop a command passes reserves on its reverse port the
//! rate the command's response will need ([`trellis_fabric::reserve`]). At the
//! end host the reverse direction of each path is the one port the host owns,
//! so a multipath host keeps one [`PortReservation`] per path: before a read
//! goes out it reserves `r = R_over × response_bytes / T_prof` on the path it
//! takes and releases it when the read completes. A path that cannot grant a
//! read's whole `r` does not take it (its responses would overrun the path);
//! a read that fits on no path waits in the host for a completion. Sans-IO and
//! allocation-free after [`PathReservations::new`]; time is the caller's.
//!
//! Where the end-host version differs from the in-network one:
//! - **T_prof is measured, not profiled offline.** The paper profiles the
//!   response time per I/O type and size offline. The host measures its own
//!   path: `T_prof(len) = base + wire(len)`, where `base` is the smallest round
//!   trip it has seen for a read on that path less that read's wire time (a
//!   path's floor, as TCP keeps its minimum RTT) and `wire(len)` is the
//!   response's bytes at the path's rate. Until a path's first read completes,
//!   `base` is the simulator's profile ([`ReserveConfig::default`]).
//! - **A path with nothing reserved takes any read**, whatever its demand, so a
//!   read larger than a path's share still goes (the in-network policer would
//!   send it as best effort).
//! - **Writes reserve nothing.** Their response is an R2T and a CapsuleResp
//!   (48 bytes); their data flows host → target, paced by the host's own send
//!   queue.

use crate::replica::MAX_PATHS;
use trellis_fabric::reserve::{response_bytes, PortReservation, ReserveConfig};
use trellis_units::IoDir;

/// Per-path response reservations of one multipath volume.
pub struct PathReservations {
    cfg: ReserveConfig,
    /// Each path's rate toward the host, bytes/s.
    rate_bytes_per_s: u64,
    ports: Vec<PortReservation>,
    /// Per path: the measured floor of a read's round trip less its wire time.
    base_ns: [Option<u64>; MAX_PATHS],
    /// Reads that found no path with room (each wait counted once per try).
    pub waits: u64,
}

impl PathReservations {
    /// `paths` paths (1 to [`MAX_PATHS`]) of `rate_bytes_per_s` each, with the
    /// simulator's over-commit (0.8) and admission share (0.9).
    pub fn new(paths: usize, rate_bytes_per_s: u64) -> Self {
        Self::with_config(paths, rate_bytes_per_s, ReserveConfig::default())
    }

    pub fn with_config(paths: usize, rate_bytes_per_s: u64, cfg: ReserveConfig) -> Self {
        assert!((1..=MAX_PATHS).contains(&paths), "1 to {MAX_PATHS} paths");
        assert!(
            rate_bytes_per_s > 0,
            "a path rate of 0 B/s reserves nothing"
        );
        let ports = (0..paths)
            .map(|_| Self::port(&cfg, rate_bytes_per_s))
            .collect();
        PathReservations {
            cfg,
            rate_bytes_per_s,
            ports,
            base_ns: [None; MAX_PATHS],
            waits: 0,
        }
    }

    fn port(cfg: &ReserveConfig, rate_bytes_per_s: u64) -> PortReservation {
        PortReservation::new(rate_bytes_per_s, cfg.burst_bytes, cfg.max_reserved_permille)
    }

    pub fn paths(&self) -> usize {
        self.ports.len()
    }

    /// Time for a read's response of `len` data bytes to cross the path.
    fn wire_ns(&self, len: u32) -> u64 {
        let b = response_bytes(IoDir::Read, len) as u128;
        (b * 1_000_000_000 / self.rate_bytes_per_s as u128) as u64
    }

    /// The response time profile of a `len`-byte read on `path`.
    pub fn t_prof_ns(&self, path: usize, len: u32) -> u64 {
        let base = self.base_ns[path].unwrap_or(self.cfg.read_base_ns);
        (base + self.wire_ns(len)).max(1)
    }

    /// The rate a `len`-byte read reserves on `path`, bytes/s.
    pub fn demand_bytes_per_s(&self, path: usize, len: u32) -> u64 {
        let b = response_bytes(IoDir::Read, len) as u128 * 1_000_000_000;
        let r = b / self.t_prof_ns(path, len) as u128;
        (r * self.cfg.over_commit_permille as u128 / 1000) as u64
    }

    /// May `path` take a read of `len` bytes now (a whole grant, or a path
    /// with nothing reserved)?
    pub fn fits(&self, path: usize, len: u32) -> bool {
        let Some(p) = self.ports.get(path) else {
            return false;
        };
        p.reserved_bytes_per_s() == 0 || p.room_bytes_per_s() >= self.demand_bytes_per_s(path, len)
    }

    /// Reserves for a read of `len` bytes on `path`; returns the grant to
    /// hand back to [`Self::release`]. Call only after [`Self::fits`].
    pub fn reserve(&mut self, path: usize, len: u32) -> u64 {
        let r = self.demand_bytes_per_s(path, len);
        self.ports.get_mut(path).map_or(0, |p| p.reserve(r))
    }

    /// A read on `path` completed after `round_trip_ns`: hands back its grant
    /// and updates the path's floor.
    pub fn release(&mut self, path: usize, grant: u64, len: u32, round_trip_ns: u64) {
        let Some(p) = self.ports.get_mut(path) else {
            return;
        };
        p.release(grant.min(p.reserved_bytes_per_s()));
        let base = round_trip_ns.saturating_sub(self.wire_ns(len));
        let b = &mut self.base_ns[path];
        *b = Some(b.map_or(base, |old| old.min(base)));
    }

    /// `path` failed: every grant on it is void (its reads move to other
    /// paths and reserve there).
    pub fn reset(&mut self, path: usize) {
        if let Some(p) = self.ports.get_mut(path) {
            *p = Self::port(&self.cfg, self.rate_bytes_per_s);
        }
    }

    pub fn reserved_bytes_per_s(&self, path: usize) -> u64 {
        self.ports.get(path).map_or(0, |p| p.reserved_bytes_per_s())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GBIT: u64 = 125_000_000; // 1 Gbit/s in bytes/s

    #[test]
    fn a_read_reserves_its_response_rate_from_the_measured_floor() {
        let mut r = PathReservations::new(2, GBIT);
        // Before any sample: the profile's 80 µs base plus 4,144 B at 1 Gbit/s
        // (33.152 µs) = 113.152 µs; r = 0.8 × 4,144 B / 113.152 µs.
        assert_eq!(r.t_prof_ns(0, 4096), 113_152);
        assert_eq!(r.demand_bytes_per_s(0, 4096), 29_298_642);
        // A read that took 233.152 µs sets path 0's floor to 200 µs.
        let g = r.reserve(0, 4096);
        assert_eq!(r.reserved_bytes_per_s(0), g);
        r.release(0, g, 4096, 233_152);
        assert_eq!(r.reserved_bytes_per_s(0), 0);
        assert_eq!(r.t_prof_ns(0, 4096), 233_152);
        // A slower one does not raise it; path 1 keeps the profile.
        r.release(0, 0, 4096, 900_000);
        assert_eq!(r.t_prof_ns(0, 4096), 233_152);
        assert_eq!(r.t_prof_ns(1, 4096), 113_152);
    }

    #[test]
    fn reads_beyond_the_paths_admitted_rate_wait_and_a_lone_read_always_goes() {
        let mut r = PathReservations::new(1, GBIT);
        // 90 % of 125 MB/s = 112.5 MB/s admitted; 29.3 MB/s each: 3 fit.
        let mut grants = Vec::new();
        while r.fits(0, 4096) {
            grants.push(r.reserve(0, 4096));
            assert!(grants.len() < 10, "the port never fills");
        }
        assert_eq!(grants.len(), 3);
        assert!(r.reserved_bytes_per_s(0) <= GBIT * 9 / 10);
        // One completes: one more fits.
        r.release(0, grants.pop().unwrap(), 4096, 113_152);
        assert!(r.fits(0, 4096));
        // A 1 MiB read wants more than the whole port, yet goes when alone.
        let mut r = PathReservations::new(1, GBIT);
        assert!(r.demand_bytes_per_s(0, 1 << 20) > r.reserved_bytes_per_s(0));
        assert!(r.fits(0, 1 << 20));
        let g = r.reserve(0, 1 << 20);
        assert!(g > 0 && !r.fits(0, 4096), "the big read holds the path");
        r.reset(0);
        assert!(r.fits(0, 4096) && r.reserved_bytes_per_s(0) == 0);
        assert!(!r.fits(5, 4096), "no such path");
    }
}
