//! The paths of a multipath volume, sans-IO: which path takes the next
//! command, given each path's state (up or down, its ANA state, its
//! reservations) and what the caller sees of its queues now.
//!
//! One namespace reached at several addresses, as Linux's native NVMe
//! multipath groups them (same subsystem NQN and namespace identity). The
//! caller owns the connections and tells this core what happens to them: a
//! path fails or comes back ([`PathSet::set_down`]), a controller reports an
//! ANA state ([`PathSet::set_ana`]), a command completes
//! ([`PathSet::on_completion`]). Time is the caller's, in ns.
//!
//! Choice, in order:
//! 1. **ANA** (NVMe Base 2.0 §8.1.1): only paths whose group is optimized
//!    take commands while any such path is up; otherwise the non-optimized
//!    ones. Inaccessible, persistent-loss and change paths take none. That is
//!    Linux's rule (`nvme_find_path`: a non-optimized path only when no
//!    optimized one is usable). A controller that does not report ANA counts
//!    as optimized.
//! 2. **Reservation** (`path_rate`, [`crate::reserve`]): a read goes only to
//!    a path that can grant its response rate.
//! 3. **Policy**: round-robin, queue-depth (fewest in flight) or ISR
//!    ([`crate::replica::IsrPaths`]: shortest expected delay, within the
//!    tenant's credit).

use crate::replica::{IsrPaths, ReadPolicy, ReplicaChooser, ReplicaState, MAX_PATHS};
use crate::reserve::PathReservations;
use trellis_nvme::ana::AnaState;

/// How a multipath volume picks the path of each command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathPolicy {
    RoundRobin,
    QueueDepth,
    Isr,
}

/// The paths of one volume and the choice among them.
pub struct PathSet {
    paths: usize,
    chooser: ReplicaChooser,
    isr: Option<IsrPaths>,
    reserve: Option<PathReservations>,
    ana: [AnaState; MAX_PATHS],
    down: [bool; MAX_PATHS],
    /// Reads that no path could take for want of reservation room.
    reserve_waits: u64,
}

impl PathSet {
    /// `paths` paths (1 to [`MAX_PATHS`]), all up and optimized. With
    /// `path_rate_bytes_per_s`, reads reserve their responses on their path.
    pub fn new(paths: usize, policy: PathPolicy, path_rate_bytes_per_s: Option<u64>) -> Self {
        assert!((1..=MAX_PATHS).contains(&paths), "1 to {MAX_PATHS} paths");
        let chooser = ReplicaChooser::new(match policy {
            PathPolicy::RoundRobin => ReadPolicy::RoundRobin,
            // ISR decides below; queue depth stands behind it.
            PathPolicy::QueueDepth | PathPolicy::Isr => ReadPolicy::QueueDepth,
        });
        PathSet {
            paths,
            chooser,
            isr: (policy == PathPolicy::Isr).then(|| IsrPaths::new(paths)),
            reserve: path_rate_bytes_per_s.map(|r| PathReservations::new(paths, r)),
            ana: [AnaState::Optimized; MAX_PATHS],
            down: [false; MAX_PATHS],
            reserve_waits: 0,
        }
    }

    pub fn paths(&self) -> usize {
        self.paths
    }

    /// `path` failed (`true`: its grants are void) or is back.
    pub fn set_down(&mut self, path: usize, down: bool) {
        if path >= self.paths {
            return;
        }
        self.down[path] = down;
        if let (true, Some(r)) = (down, self.reserve.as_mut()) {
            r.reset(path);
        }
    }

    pub fn is_down(&self, path: usize) -> bool {
        path >= self.paths || self.down[path]
    }

    /// `path`'s controller reports `state` for the volume's ANA group.
    pub fn set_ana(&mut self, path: usize, state: AnaState) {
        if let Some(s) = self.ana.get_mut(path) {
            *s = state;
        }
    }

    pub fn ana(&self, path: usize) -> Option<AnaState> {
        self.ana.get(path).copied()
    }

    /// The ANA state whose paths may take commands now: optimized while any
    /// optimized path is up, else non-optimized.
    fn tier(&self) -> AnaState {
        let up_optimized =
            (0..self.paths).any(|p| !self.down[p] && self.ana[p] == AnaState::Optimized);
        if up_optimized {
            AnaState::Optimized
        } else {
            AnaState::NonOptimized
        }
    }

    /// The path for the next command, None when none may take it now.
    /// `views[p]` is what the caller sees of path `p`'s queue (may it take a
    /// command, its credit, its commands in flight); `read_len` is the
    /// length of a read (None for anything else). Reserve with
    /// [`Self::reserve`] once the command is sure to go.
    pub fn choose(
        &mut self,
        views: &[ReplicaState],
        read_len: Option<u32>,
        now_ns: u64,
    ) -> Option<usize> {
        let n = views.len().min(self.paths);
        let tier = self.tier();
        let mut v = [views.first().copied()?; MAX_PATHS];
        let mut short_of_room = false;
        for p in 0..n {
            v[p] = views[p];
            let usable = !self.down[p] && self.ana[p] == tier && views[p].may_submit;
            let fits = match (&self.reserve, read_len) {
                (Some(r), Some(len)) => r.fits(p, len),
                _ => true,
            };
            short_of_room |= usable && !fits;
            v[p].may_submit = usable && fits;
        }
        let pick = match self.isr.as_mut() {
            Some(isr) => isr.choose(&v[..n], now_ns),
            None => self.chooser.choose(&v[..n]),
        };
        if pick.is_none() && short_of_room {
            self.reserve_waits += 1;
        }
        pick
    }

    /// Reserves a read's response rate on `path` (0 without `path_rate`
    /// or for anything but a read); hand it back to [`Self::on_completion`].
    pub fn reserve(&mut self, path: usize, read_len: Option<u32>) -> u64 {
        match (self.reserve.as_mut(), read_len) {
            (Some(r), Some(len)) => r.reserve(path, len),
            _ => 0,
        }
    }

    /// A command on `path` completed `round_trip_ns` after it went out;
    /// `grant` is what [`Self::reserve`] gave it.
    pub fn on_completion(
        &mut self,
        path: usize,
        read_len: Option<u32>,
        grant: u64,
        round_trip_ns: u64,
        now_ns: u64,
    ) {
        if let Some(isr) = self.isr.as_mut() {
            isr.on_completion(path, round_trip_ns, now_ns);
        }
        if let (Some(r), Some(len)) = (self.reserve.as_mut(), read_len) {
            r.release(path, grant, len, round_trip_ns);
        }
    }

    /// Reads that found no path with reservation room (per try).
    pub fn reserve_waits(&self) -> u64 {
        self.reserve_waits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(inflight: u32) -> ReplicaState {
        ReplicaState {
            may_submit: true,
            credit_limit: None,
            depth: 32,
            inflight,
        }
    }

    #[test]
    fn optimized_paths_take_everything_and_non_optimized_only_when_none_is_up() {
        let mut s = PathSet::new(3, PathPolicy::RoundRobin, None);
        s.set_ana(0, AnaState::NonOptimized);
        let views = [v(0); 3];
        let picks: Vec<_> = (0..4).map(|_| s.choose(&views, None, 0).unwrap()).collect();
        assert_eq!(picks, [1, 2, 1, 2], "the non-optimized path waits");
        // A busy optimized path does not open the non-optimized one.
        let mut busy = views;
        busy[1].may_submit = false;
        busy[2].may_submit = false;
        assert_eq!(s.choose(&busy, None, 0), None);
        // Both optimized paths down (or inaccessible): the non-optimized one serves.
        s.set_down(1, true);
        s.set_ana(2, AnaState::Inaccessible);
        assert_eq!(s.choose(&views, None, 0), Some(0));
        // Nothing usable at all: no path.
        s.set_ana(0, AnaState::PersistentLoss);
        assert_eq!(s.choose(&views, None, 0), None);
        // The optimized path returns and takes over.
        s.set_down(1, false);
        assert_eq!(s.choose(&views, None, 0), Some(1));
        assert!(s.is_down(7), "no such path");
    }

    #[test]
    fn change_and_inaccessible_paths_take_nothing() {
        let mut s = PathSet::new(2, PathPolicy::QueueDepth, None);
        s.set_ana(0, AnaState::Change);
        assert_eq!(s.choose(&[v(0), v(9)], None, 0), Some(1));
        s.set_ana(1, AnaState::Inaccessible);
        assert_eq!(s.choose(&[v(0), v(9)], None, 0), None);
        s.set_ana(0, AnaState::Optimized);
        assert_eq!(s.choose(&[v(5), v(0)], None, 0), Some(0));
    }

    #[test]
    fn reads_go_where_their_response_fits_and_writes_need_no_room() {
        // Two 1 Gbit/s paths: three 4 KiB reads fill one (reserve.rs).
        let mut s = PathSet::new(2, PathPolicy::RoundRobin, Some(125_000_000));
        let views = [v(0); 2];
        let mut grants = Vec::new();
        while let Some(p) = s.choose(&views, Some(4096), 0) {
            grants.push((p, s.reserve(p, Some(4096))));
            assert!(grants.len() < 10);
        }
        assert_eq!(grants.len(), 6, "{grants:?}");
        assert_eq!(s.reserve_waits(), 1);
        assert!(s.choose(&views, None, 0).is_some(), "a write still goes");
        let (p, g) = grants[0];
        s.on_completion(p, Some(4096), g, 100_000, 0);
        assert_eq!(s.choose(&views, Some(4096), 0), Some(p));
        // A failed path's grants are void: it takes reads again when back.
        s.set_down(1 - p, true);
        s.set_down(1 - p, false);
        assert!(s.choose(&views, Some(4096), 0).is_some());
    }
}
