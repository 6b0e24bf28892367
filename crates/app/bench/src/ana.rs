//! ANA states of a multipath volume's paths (NVMe Base 2.0 §8.1.1), shared
//! between the main thread, which reads each path's ANA log page, and the
//! job's workers, which route by them (`trellis_path::multipath::PathSet`).
//!
//! Linux re-reads a controller's ANA log when an ANA-change event arrives or
//! when a command fails with a path-related status. This host has no
//! asynchronous event requests outstanding yet, so the main thread re-reads
//! the log of every path every [`ANA_REFRESH`] instead; a worker that gets a
//! path-related status marks the path at once and moves the command.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::Duration;
use trellis_host::Controller;
use trellis_nvme::ana::AnaState;

/// How often the main thread re-reads each path's ANA state: a path made
/// accessible again is used within this, one made inaccessible at once (the
/// first command it refuses moves).
pub const ANA_REFRESH: Duration = Duration::from_millis(200);

/// One byte per path (0: not known, else the ANA state byte) and a counter
/// bumped after every refresh, so a worker re-reads only what changed hands.
pub struct AnaBoard {
    states: Vec<AtomicU8>,
    seq: AtomicU64,
}

impl AnaBoard {
    pub fn new(paths: usize) -> AnaBoard {
        AnaBoard {
            states: (0..paths).map(|_| AtomicU8::new(0)).collect(),
            seq: AtomicU64::new(0),
        }
    }

    /// Path `path`'s state; None: not known (the path reports no ANA, or its
    /// controller is gone), which leaves a worker's own view in place.
    pub fn set(&self, path: usize, state: Option<AnaState>) {
        if let Some(s) = self.states.get(path) {
            s.store(state.map_or(0, |a| a as u8), Ordering::Relaxed);
        }
    }

    /// Makes the states set since the last call visible to the workers.
    pub fn publish(&self) {
        self.seq.fetch_add(1, Ordering::Release);
    }

    pub fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    pub fn state(&self, path: usize) -> Option<AnaState> {
        let v = self.states.get(path)?.load(Ordering::Relaxed);
        (v != 0).then(|| AnaState::from_u8(v)).flatten()
    }

    pub fn paths(&self) -> usize {
        self.states.len()
    }
}

/// The ANA state of namespace `nsid` through `c`; None when the controller
/// does not report ANA (Identify Controller CMIC bit 3 clear) or the log
/// cannot be read now.
pub fn read_state(c: &mut Controller, nsid: u32) -> Option<AnaState> {
    if !c.reports_ana() {
        return None;
    }
    c.ana_state(nsid).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_board_publishes_known_states_and_leaves_unknown_ones_out() {
        let b = AnaBoard::new(2);
        assert_eq!((b.seq(), b.state(0), b.state(1)), (0, None, None));
        b.set(0, Some(AnaState::Inaccessible));
        b.set(1, Some(AnaState::Optimized));
        b.publish();
        assert_eq!(b.seq(), 1);
        assert_eq!(b.state(0), Some(AnaState::Inaccessible));
        b.set(1, None);
        b.set(9, Some(AnaState::Optimized)); // no such path: ignored
        b.publish();
        assert_eq!((b.seq(), b.state(1), b.paths()), (2, None, 2));
    }
}
