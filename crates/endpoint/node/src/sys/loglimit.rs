//! Rate limits for the log lines a remote peer can trigger.
//!
//! A refused Connect, a refused connection or authentication, a new QoS
//! tenant: each is worth a line, because the operator otherwise sees nothing
//! of why a host cannot connect. But a peer decides how often they happen,
//! so unbounded they let any peer that reaches a port fill the disk behind
//! the log and crowd out every other line. A [`LineBucket`] lets a burst
//! through whole (a host that mistypes its NQN and retries is logged every
//! time) and then one line per interval; each line carries `left_out`, the
//! lines of its kind not written since the one before, so nothing is lost
//! from the count.
//!
//! The bucket is sans-IO (time in as ns); [`LogLimit`] wraps it in a lock
//! and the process clock for the sites that several reactors share.

use std::sync::Mutex;

/// Default of `target.log_burst`: lines of one kind written at once before
/// the rate applies. Covers a host retrying a refused Connect on every path
/// and queue of a reconnect (a few tens of lines), not a flood.
pub const DEFAULT_LOG_BURST: u32 = 20;
/// Default of `target.log_lines_per_sec`: lines of one kind per second once
/// the burst is spent.
pub const DEFAULT_LOG_LINES_PER_SEC: u32 = 1;
/// Upper bound of `target.log_burst` and `target.log_lines_per_sec`.
pub const LOG_LIMIT_MAX: u32 = 100_000;

const NS_PER_SEC: u64 = 1_000_000_000;

/// A token bucket of log lines, `burst` deep and refilled at `per_sec`,
/// kept as the generic cell rate algorithm (GCRA): one time, when the
/// bucket would next be empty, instead of a token count that integer
/// refills would round away between closely spaced calls.
#[derive(Clone, Debug)]
pub struct LineBucket {
    /// Time one line's token takes to refill.
    interval_ns: u64,
    /// How far ahead of now `tat_ns` may run: burst − 1 intervals.
    tolerance_ns: u64,
    /// Theoretical arrival time: the bucket is full at or after it.
    tat_ns: u64,
    left_out: u64,
}

impl LineBucket {
    /// A full bucket. `burst` and `per_sec` are at least 1 (a bucket that
    /// never admits would hide every line, which a limit must not do).
    pub fn new(burst: u32, per_sec: u32) -> LineBucket {
        let interval_ns = NS_PER_SEC / u64::from(per_sec.max(1));
        LineBucket {
            interval_ns,
            tolerance_ns: interval_ns.saturating_mul(u64::from(burst.max(1) - 1)),
            tat_ns: 0,
            left_out: 0,
        }
    }

    /// Whether a line may be written at `now_ns`: `Some(left_out)`, the lines
    /// refused since the last one admitted (and the count restarts), or
    /// `None` (this line is counted, not written). Time going backwards
    /// refills nothing.
    pub fn admit(&mut self, now_ns: u64) -> Option<u64> {
        if self.tat_ns.saturating_sub(self.tolerance_ns) > now_ns {
            self.left_out = self.left_out.saturating_add(1);
            return None;
        }
        self.tat_ns = self.tat_ns.max(now_ns).saturating_add(self.interval_ns);
        Some(std::mem::take(&mut self.left_out))
    }

    /// Lines refused since the last one admitted.
    pub fn left_out(&self) -> u64 {
        self.left_out
    }
}

/// A [`LineBucket`] shared by threads, on the process clock. Taken only on
/// the paths it limits (refusals, new tenants), never per I/O.
#[derive(Debug)]
pub struct LogLimit(Mutex<LineBucket>);

impl LogLimit {
    pub fn new(burst: u32, per_sec: u32) -> LogLimit {
        LogLimit(Mutex::new(LineBucket::new(burst, per_sec)))
    }

    /// [`LineBucket::admit`] at `now_ns`.
    pub fn admit_at(&self, now_ns: u64) -> Option<u64> {
        super::lock(&self.0).admit(now_ns)
    }

    /// [`LineBucket::admit`] now.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(super::now_ns())
    }
}

impl Default for LogLimit {
    fn default() -> LogLimit {
        LogLimit::new(DEFAULT_LOG_BURST, DEFAULT_LOG_LINES_PER_SEC)
    }
}

/// The node's limited log lines, one bucket per kind, so that a flood of
/// one kind (refused Connects, say) does not hide the lines of another
/// (the acceptor's). Refused authentication transactions have theirs in
/// the DH pool (`data::nvme::auth_work`), new tenants in `state::tenants`.
#[derive(Debug)]
pub struct NodeLogLimits {
    /// Refused Connects, and commands refused before a Connect.
    pub connect: LogLimit,
    /// Connections the acceptor refuses (`max_connections`, per address).
    pub accept: LogLimit,
    /// Failed DH-HMAC-CHAP transactions (refused ones, before any
    /// exponentiation, are the DH pool's: `data::nvme::auth_work`).
    pub auth: LogLimit,
    /// Connections closed for their peer's fault: fatal PDU errors,
    /// timeouts, TLS failures, plain TCP on a TLS-only listener.
    pub close: LogLimit,
    /// Controllers created, and an invalid CC a host set: any peer can
    /// loop them on an open discovery controller.
    pub ctrl: LogLimit,
}

impl NodeLogLimits {
    pub fn new(burst: u32, per_sec: u32) -> NodeLogLimits {
        NodeLogLimits {
            connect: LogLimit::new(burst, per_sec),
            accept: LogLimit::new(burst, per_sec),
            auth: LogLimit::new(burst, per_sec),
            close: LogLimit::new(burst, per_sec),
            ctrl: LogLimit::new(burst, per_sec),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    #[test]
    fn a_burst_passes_whole_then_one_line_a_second_with_the_count_left_out() {
        let mut b = LineBucket::new(20, 1);
        for i in 0..20 {
            assert_eq!(b.admit(i * MS), Some(0), "line {i} of the burst");
        }
        assert_eq!(b.admit(20 * MS), None, "the 21st at once is left out");
        assert_eq!(b.left_out(), 1);
        // One line refills 1 s after the burst began, not 1 s after the
        // line left out.
        assert_eq!(b.admit(999 * MS), None);
        assert_eq!(b.admit(1_000 * MS), Some(2), "it reports the two left out");
        assert_eq!(b.admit(1_001 * MS), None);
    }

    #[test]
    fn a_flood_of_100_000_lines_over_10_s_writes_the_burst_and_about_ten_more() {
        let mut b = LineBucket::new(20, 1);
        let (mut written, mut reported) = (0u64, 0u64);
        let attempts = 100_000u64;
        for i in 0..attempts {
            if let Some(n) = b.admit(i * 100_000) {
                written += 1;
                reported += n;
            }
        }
        // The last attempt is at 9.9999 s: lines at 1 s, 2 s, ... 9 s.
        assert_eq!(written, 29, "20 at once, then one a second");
        assert_eq!(
            written + reported + b.left_out(),
            attempts,
            "every line is written or counted"
        );
    }

    #[test]
    fn an_idle_bucket_refills_to_its_burst_and_no_further() {
        let mut b = LineBucket::new(3, 1);
        for _ in 0..3 {
            assert!(b.admit(0).is_some());
        }
        assert!(b.admit(0).is_none());
        let n = (0..10).filter(|_| b.admit(3600 * S).is_some()).count();
        assert_eq!(n, 3, "an hour idle refills 3 lines, not 3600");
    }

    #[test]
    fn time_going_backwards_refills_nothing() {
        let mut b = LineBucket::new(1, 1);
        assert!(b.admit(10 * S).is_some());
        assert!(b.admit(5 * S).is_none());
        assert!(b.admit(10 * S).is_none(), "the clock's maximum is kept");
        assert!(b.admit(11 * S).is_some());
    }

    #[test]
    fn a_zero_burst_or_rate_still_writes_a_line() {
        let mut b = LineBucket::new(0, 0);
        assert_eq!(b.admit(0), Some(0));
        assert_eq!(b.admit(0), None);
        assert_eq!(b.admit(S), Some(1));
    }

    #[test]
    fn the_largest_rate_and_times_do_not_overflow() {
        let mut b = LineBucket::new(LOG_LIMIT_MAX, LOG_LIMIT_MAX);
        assert!(b.admit(u64::MAX).is_some());
        assert!(b.admit(u64::MAX).is_some());
    }
}
