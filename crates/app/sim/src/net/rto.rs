//! TCP retransmission timeout of one connection, as Linux computes it (RFC 6298's
//! estimator with Linux's floor; docs/sim.md, [RFC 6298], [Linux tcp]).
//!
//! - First RTT sample R: srtt = R, rttvar = R/2. Later ones: rttvar = 3/4 rttvar +
//!   1/4 |srtt − R|, srtt = 7/8 srtt + 1/8 R (RFC 6298 §2.2–2.3).
//! - RTO = srtt + max(4·rttvar, rto_min): Linux floors the variance term, not the sum
//!   (`tcp_rtt_estimator`/`__tcp_set_rto`), so the RTO is rto_min *plus* the smoothed RTT.
//! - Before any sample the RTO is the initial 1 s (RFC 6298 §2.1, Linux TCP_TIMEOUT_INIT).
//! - Each expiry doubles it (§5.5) up to `rto_max`; a new sample ends the back-off. A
//!   connection has one retransmission timer: several I/Os lost together expire as one
//!   (the first expiry backs off; the others within that backed-off RTO do not).
//! - Karn's rule (§3): the caller takes no sample from a retransmitted I/O.
//!
//! Sans-IO and integer-only (time in ns), so simulations replay bit-identically.

/// Linux's initial RTO before the first RTT sample.
pub const RTO_INIT_NS: u64 = 1_000_000_000;

#[derive(Clone, Copy, Debug, Default)]
pub struct RtoEstimator {
    srtt_ns: u64,
    rttvar_ns: u64,
    min_rtt_ns: u64,
    has_sample: bool,
    backoff: u8,
    /// Until then, another expiry is the same timer's (no further back-off).
    backoff_until_ns: u64,
}

impl RtoEstimator {
    pub fn on_rtt_sample(&mut self, rtt_ns: u64) {
        if self.has_sample {
            let err = self.srtt_ns.abs_diff(rtt_ns);
            self.rttvar_ns = (3 * self.rttvar_ns + err) / 4;
            self.srtt_ns = (7 * self.srtt_ns + rtt_ns) / 8;
            self.min_rtt_ns = self.min_rtt_ns.min(rtt_ns);
        } else {
            self.srtt_ns = rtt_ns;
            self.rttvar_ns = rtt_ns / 2;
            self.min_rtt_ns = rtt_ns;
            self.has_sample = true;
        }
        self.backoff = 0;
        self.backoff_until_ns = 0;
    }

    /// The retransmission timer expired at `now_ns`: back off exponentially, once per
    /// expiry of the connection's one timer.
    pub fn on_timeout(&mut self, now_ns: u64, rto_min_ns: u64, rto_max_ns: u64) {
        if now_ns < self.backoff_until_ns {
            return;
        }
        self.backoff = self.backoff.saturating_add(1).min(30);
        self.backoff_until_ns = now_ns + self.rto_ns(rto_min_ns, rto_max_ns);
    }

    /// RACK's reordering window (RFC 8985 §6.2): a quarter of the minimum RTT, at most
    /// srtt / 8, as Linux's `tcp_rack_reo_wnd` once reordering has been seen (a client
    /// that spreads one connection's PDUs over several paths reorders them). 0 before any
    /// sample.
    pub fn reo_wnd_ns(&self) -> u64 {
        (self.min_rtt_ns / 4).min(self.srtt_ns / 8)
    }

    pub fn rto_ns(&self, rto_min_ns: u64, rto_max_ns: u64) -> u64 {
        let base = if self.has_sample {
            self.srtt_ns + (4 * self.rttvar_ns).max(rto_min_ns)
        } else {
            RTO_INIT_NS
        };
        base.saturating_mul(1 << self.backoff).min(rto_max_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 200_000_000;
    const MAX: u64 = 120_000_000_000;

    #[test]
    fn before_a_sample_the_rto_is_one_second() {
        assert_eq!(RtoEstimator::default().rto_ns(MIN, MAX), 1_000_000_000);
    }

    #[test]
    fn a_datacenter_rtt_gives_rto_min_plus_srtt() {
        // 100 µs RTTs: 4·rttvar (≤ 200 µs) is far below the 200 ms floor.
        let mut e = RtoEstimator::default();
        for _ in 0..10 {
            e.on_rtt_sample(100_000);
        }
        assert_eq!(e.rto_ns(MIN, MAX), 200_100_000);
        // With a 1 ms floor (a tuned route) the variance still does not bind.
        assert_eq!(e.rto_ns(1_000_000, MAX), 1_100_000);
    }

    #[test]
    fn the_reordering_window_is_a_quarter_of_the_minimum_rtt_capped_by_srtt_over_8() {
        let mut e = RtoEstimator::default();
        assert_eq!(e.reo_wnd_ns(), 0, "no sample yet");
        e.on_rtt_sample(40_000);
        assert_eq!(
            e.reo_wnd_ns(),
            5_000,
            "srtt/8 = 5 µs binds before min_rtt/4 = 10 µs"
        );
        for _ in 0..40 {
            e.on_rtt_sample(200_000);
        }
        assert_eq!(e.reo_wnd_ns(), 10_000, "min_rtt/4 once srtt has grown");
    }

    #[test]
    fn rfc6298_update_and_back_off() {
        let mut e = RtoEstimator::default();
        e.on_rtt_sample(8_000); // srtt 8000, rttvar 4000
        e.on_rtt_sample(16_000); // rttvar (12000 + 8000)/4 = 5000, srtt (56000 + 16000)/8 = 9000
        assert_eq!(e.rto_ns(0, MAX), 9_000 + 20_000);
        e.on_timeout(0, 0, MAX);
        e.on_timeout(1, 0, MAX); // the same expiry of the one timer: no second back-off
        assert_eq!(e.rto_ns(0, MAX), 2 * 29_000);
        e.on_timeout(58_000, 0, MAX); // the backed-off timer expires again
        assert_eq!(e.rto_ns(0, MAX), 4 * 29_000);
        assert_eq!(e.rto_ns(0, 100_000), 100_000, "capped at rto_max");
        e.on_rtt_sample(9_000);
        assert!(e.rto_ns(0, MAX) < 29_000, "a new sample ends the back-off");
    }
}
