//! Ownership as the data plane checks it when a command is about to reach
//! the backend (docs/target.md, "HA pair: the fence at execution").
//!
//! The HA lease (`control::ha`) may serve until its fence deadline: the
//! send time of its last confirmed keepalive plus `fence_ms`, which is
//! shorter than the lease TTL. The ANA byte says the same thing, but it is
//! flipped by a watchdog thread, and it is read when a command is parsed:
//! a command that then waits for its data (R2T), in the scheduler, or in a
//! process that was frozen (SIGSTOP) past the deadline would run on a word
//! that was true when it was read. So every command that reaches a backend
//! checks this fence with a fresh read of the monotonic clock, at that
//! moment, and fails with a path error once it has passed.
//!
//! Without `[ha]` the fence always allows, and the check is one relaxed
//! load of a constant: nothing on the I/O path pays for it.

use std::sync::atomic::{AtomicU64, Ordering};

/// `serve_until_ns` of a node that is not in an HA pair: no deadline.
const ALWAYS: u64 = u64::MAX;

pub struct Fence {
    /// Serve while `sys::now_ns()` is below this; 0: not serving.
    serve_until_ns: AtomicU64,
}

impl Fence {
    /// A node without `[ha]`: always serves.
    pub fn always() -> Fence {
        Fence {
            serve_until_ns: AtomicU64::new(ALWAYS),
        }
    }

    /// A node of an HA pair, before it holds the lease: serves nothing.
    pub fn stopped() -> Fence {
        Fence {
            serve_until_ns: AtomicU64::new(0),
        }
    }

    /// The lease was confirmed: serve until `until_ns` (`sys::now_ns`
    /// clock). Never called on an `always` fence.
    pub fn serve_until(&self, until_ns: u64) {
        debug_assert!(until_ns != ALWAYS, "a deadline, not 'always'");
        self.serve_until_ns.store(until_ns, Ordering::Release);
    }

    /// Stop serving at once (lease lost, drain, shutdown).
    pub fn stop(&self) {
        self.serve_until_ns.store(0, Ordering::Release);
    }

    /// Whether a command may reach the backend now. Reads the clock itself
    /// (not the reactor loop's cached time), so a reactor that was frozen
    /// between reading its clock and getting here cannot pass on a stale
    /// time.
    #[inline]
    pub fn allows_now(&self) -> bool {
        let until = self.serve_until_ns.load(Ordering::Acquire);
        until == ALWAYS || (until != 0 && crate::sys::now_ns() < until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_allows_until_its_deadline_and_not_after_stop() {
        assert!(Fence::always().allows_now());
        let f = Fence::stopped();
        assert!(
            !f.allows_now(),
            "an HA node serves nothing before the lease"
        );
        let now = crate::sys::now_ns();
        f.serve_until(now + 60_000_000_000);
        assert!(f.allows_now());
        f.serve_until(now.saturating_sub(1).max(1));
        assert!(!f.allows_now(), "past the deadline");
        f.serve_until(now + 60_000_000_000);
        f.stop();
        assert!(!f.allows_now(), "stopped");
    }
}
