//! Waiting for the commands already past their reservation check: what a
//! Reservation Acquire with Preempt and Abort needs before it completes
//! (NVMe Base 2.0 §8.19.7; docs/target.md, "Reservations").
//!
//! The I/O path pays nothing for it. A reactor checks a command's
//! reservation and hands it to its backend queue in one call, never
//! across loops, so at the top of a loop no command of that reactor sits
//! between its check and its submit. That makes each loop boundary a
//! quiescent state (as in quiescent-state-based RCU):
//!
//! 1. The preempt changes the namespace's reservation state, then calls
//!    [`Drain::request`] (a Release increment after the state's Release
//!    stores), and parks its completion.
//! 2. Every reactor, once per loop, loads the requested generation
//!    (Acquire). Seeing a new one, it notes every reservation-gated command
//!    it has executing (at the backend, or held by a scheduler, whose
//!    release checks again); commands it checks from then on see the new
//!    state, since that load synchronized with the preempt's increment.
//! 3. When those noted commands have all completed, the reactor publishes
//!    the generation it saw ([`Drain::drained`], Release).
//! 4. The parked Acquire completes once every reactor has published its
//!    generation, or fails at `target.preempt_abort_timeout_ms`.
//!
//! A command checked before step 2 on any reactor is thus either finished
//! or among the noted ones; one checked after is refused. One load of a
//! rarely written counter per loop is the whole steady-state cost.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Requests remembered with their namespace, so a reactor that missed
/// several notes only that namespace's commands; one that missed more
/// than this many notes every gated command (still safe, only slower).
pub const DRAIN_REQUESTS_KEPT: usize = 256;

/// Which namespaces a reactor's new drain requests name.
#[derive(Debug, PartialEq, Eq)]
pub enum Scope {
    /// These namespace uids (deduplicated).
    Namespaces(Vec<u32>),
    /// Older requests were forgotten: every namespace.
    All,
}

impl Scope {
    pub fn includes(&self, ns_uid: u32) -> bool {
        match self {
            Scope::All => true,
            Scope::Namespaces(v) => v.contains(&ns_uid),
        }
    }
}

/// One reactor's published generation, on a cache line of its own so
/// reactors never write one line.
#[repr(align(64))]
#[derive(Default)]
struct Published(AtomicU64);

/// The node's drain requests and each reactor's progress through them.
pub struct Drain {
    /// Bumped by each Preempt and Abort that changed the state.
    requested: AtomicU64,
    /// Per reactor (by id): the latest requested generation whose noted
    /// commands have all completed on it.
    drained: Box<[Published]>,
    /// The last [`DRAIN_REQUESTS_KEPT`] requests: (generation, namespace uid).
    recent: Mutex<VecDeque<(u64, u32)>>,
}

impl Drain {
    /// The drain of a node with `reactors` reactors (0: a harness without
    /// reactors, where every request is drained at once).
    pub fn new(reactors: usize) -> Drain {
        Drain {
            requested: AtomicU64::new(0),
            drained: (0..reactors).map(|_| Published::default()).collect(),
            recent: Mutex::new(VecDeque::with_capacity(DRAIN_REQUESTS_KEPT)),
        }
    }

    /// Asks every reactor to drain what it has past its reservation
    /// checks; returns the generation to wait for with [`Drain::is_done`].
    /// Call after the state change is stored.
    /// Only commands on namespace `ns_uid` are waited for: a slow command
    /// elsewhere (another tenant's) cannot hold this preempt up.
    pub fn request(&self, ns_uid: u32) -> u64 {
        let mut recent = crate::sys::lock(&self.recent);
        // Release: a reactor that loads this value (Acquire) also sees the
        // new reservation state stored before it. Under the lock, so
        // `recent` holds generations in order.
        let gen = self.requested.fetch_add(1, Ordering::Release) + 1;
        if recent.len() == DRAIN_REQUESTS_KEPT {
            recent.pop_front();
        }
        recent.push_back((gen, ns_uid));
        gen
    }

    /// The namespaces of the requests after `seen` up to `upto`.
    pub fn scope(&self, seen: u64, upto: u64) -> Scope {
        let recent = crate::sys::lock(&self.recent);
        if recent.front().is_none_or(|&(g, _)| g > seen + 1) {
            return Scope::All;
        }
        let mut v: Vec<u32> = recent
            .iter()
            .filter(|&&(g, _)| g > seen && g <= upto)
            .map(|&(_, ns)| ns)
            .collect();
        v.sort_unstable();
        v.dedup();
        Scope::Namespaces(v)
    }

    /// The latest requested generation: a reactor's once-per-loop load.
    #[inline]
    pub fn requested(&self) -> u64 {
        self.requested.load(Ordering::Acquire)
    }

    /// Reactor `id` has no command left that it noted for generations up
    /// to `gen`.
    pub fn drained(&self, id: usize, gen: u64) {
        if let Some(p) = self.drained.get(id) {
            p.0.fetch_max(gen, Ordering::Release);
        }
    }

    /// Whether every reactor has drained generation `gen`.
    pub fn is_done(&self, gen: u64) -> bool {
        self.drained
            .iter()
            .all(|p| p.0.load(Ordering::Acquire) >= gen)
    }
}

#[cfg(test)]
mod tests {
    use super::Drain;

    #[test]
    fn a_request_is_done_only_once_every_reactor_drained_it() {
        let d = Drain::new(3);
        let g1 = d.request(0);
        assert_eq!(d.requested(), g1);
        d.drained(0, g1);
        d.drained(2, g1);
        assert!(!d.is_done(g1), "reactor 1 has not drained");
        let g2 = d.request(0);
        d.drained(1, g2);
        assert!(d.is_done(g1), "a later generation covers an earlier one");
        assert!(!d.is_done(g2), "reactors 0 and 2 saw only g1");
        // A late publication of an older generation does not go back.
        d.drained(1, g1);
        d.drained(0, g2);
        d.drained(2, g2);
        assert!(d.is_done(g2));
        d.drained(7, g2); // no such reactor: ignored, no panic
    }

    #[test]
    fn without_reactors_every_request_is_done_at_once() {
        let d = Drain::new(0);
        assert!(d.is_done(d.request(0)));
    }

    #[test]
    fn a_reactor_learns_which_namespaces_its_missed_requests_name() {
        use super::{Scope, DRAIN_REQUESTS_KEPT};
        let d = Drain::new(1);
        let g1 = d.request(4);
        let g2 = d.request(7);
        let g3 = d.request(4);
        assert_eq!(d.scope(0, g3), Scope::Namespaces(vec![4, 7]));
        assert_eq!(d.scope(g1, g2), Scope::Namespaces(vec![7]));
        assert!(d.scope(g1, g3).includes(4) && !d.scope(g2, g3).includes(7));
        for _ in 0..DRAIN_REQUESTS_KEPT {
            d.request(1);
        }
        // g1..g3 are forgotten: a reactor that saw none of them notes all.
        assert_eq!(d.scope(0, d.requested()), Scope::All);
        assert!(d.scope(d.requested() - 1, d.requested()).includes(1));
    }
}
