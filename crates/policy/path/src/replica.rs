//! Replica choice for a replicated volume: which replica serves the next read.
//!
//! Sans-IO and allocation-free: the caller describes each replica's state
//! now (may it take a command, its credit limit, its commands in flight) and
//! gets an index back. The same code serves `trellis bench --replicas` and any
//! program built on this crate.
//!
//! Policies (docs/gimbal.md §1.f):
//! - [`ReadPolicy::Headroom`], Gimbal's replica balancer: the replica whose
//!   credits leave the most room (credit limit minus commands in flight; a
//!   replica that sends no credits stands in with the queue depth), ties to
//!   the fewest in flight, then the next in turn. The paper reads "the copy
//!   whose remote SSD has the least load … rely on the number of allocated
//!   credits"; the tie-break is ours.
//! - [`ReadPolicy::RoundRobin`]: the next replica in turn that may take one.

/// How a read picks its replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPolicy {
    RoundRobin,
    Headroom,
    /// The fewest commands in flight, ties in turn: Linux's `queue-depth`
    /// multipath iopolicy (for paths to one namespace rather than replicas).
    QueueDepth,
}

/// One replica's state as the chooser sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaState {
    /// The replica may take a command now (credits, queue space).
    pub may_submit: bool,
    /// The credit limit of this queue at the replica (`Engine::credit_limit`),
    /// None when the replica sends no credits.
    pub credit_limit: Option<u32>,
    /// Queue depth: the limit standing in when there are no credits.
    pub depth: u32,
    /// Commands in flight on this queue at the replica.
    pub inflight: u32,
}

impl ReplicaState {
    /// Credits (or depth) minus commands in flight; negative when over.
    /// Credits are not capped by the depth: they carry the target's view
    /// (fewer slots per tenant on a shared drive) even when every replica
    /// grants more than this queue ever sends.
    pub fn room(&self) -> i64 {
        self.credit_limit.unwrap_or(self.depth) as i64 - self.inflight as i64
    }
}

/// Picks replicas in turn or by headroom; remembers whose turn is next.
#[derive(Clone, Debug)]
pub struct ReplicaChooser {
    policy: ReadPolicy,
    turn: usize,
}

impl ReplicaChooser {
    pub fn new(policy: ReadPolicy) -> Self {
        ReplicaChooser { policy, turn: 0 }
    }

    pub fn policy(&self) -> ReadPolicy {
        self.policy
    }

    /// The replica for the next read, None when none may take one now. The
    /// turn moves past the chosen replica, so ties rotate.
    pub fn choose(&mut self, replicas: &[ReplicaState]) -> Option<usize> {
        let n = replicas.len();
        let mut best: Option<(i64, u32, usize)> = None;
        for k in 0..n {
            let i = (self.turn + k) % n;
            let r = &replicas[i];
            if !r.may_submit {
                continue;
            }
            if self.policy == ReadPolicy::RoundRobin {
                best = Some((0, 0, i));
                break;
            }
            // Queue depth: only the commands in flight count (room ties at 0).
            let room = if self.policy == ReadPolicy::QueueDepth {
                0
            } else {
                r.room()
            };
            if best.is_none_or(|(b, f, _)| room > b || (room == b && r.inflight < f)) {
                best = Some((room, r.inflight, i));
            }
        }
        let i = best?.2;
        self.turn = (i + 1) % n;
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(may: bool, credits: Option<u32>, inflight: u32) -> ReplicaState {
        ReplicaState {
            may_submit: may,
            credit_limit: credits,
            depth: 32,
            inflight,
        }
    }

    #[test]
    fn headroom_takes_the_replica_with_the_most_credits_left() {
        // Gimbal grants 165 credits to a tenant alone on a drive and 77 when a
        // second tenant is active: the shared drive loses even with fewer in
        // flight, and the depth (32) does not cap the view.
        let mut c = ReplicaChooser::new(ReadPolicy::Headroom);
        let r = [st(true, Some(165), 30), st(true, Some(77), 0)];
        assert_eq!(c.choose(&r), Some(0));
        // Without credits the depth stands in: fewest in flight wins.
        let r = [st(true, None, 5), st(true, None, 3)];
        assert_eq!(c.choose(&r), Some(1));
        // A replica that may not take one is never chosen.
        let r = [st(false, Some(165), 0), st(true, Some(10), 9)];
        assert_eq!(c.choose(&r), Some(1));
        let r = [st(false, Some(165), 0), st(false, Some(10), 9)];
        assert_eq!(c.choose(&r), None);
    }

    #[test]
    fn queue_depth_takes_the_fewest_in_flight_whatever_the_credits() {
        let mut c = ReplicaChooser::new(ReadPolicy::QueueDepth);
        let r = [st(true, Some(165), 3), st(true, Some(10), 1)];
        assert_eq!(c.choose(&r), Some(1));
        // Ties rotate.
        let r = [st(true, None, 2), st(true, None, 2)];
        let a = c.choose(&r).unwrap();
        assert_ne!(c.choose(&r), Some(a));
        let r = [st(true, None, 9), st(false, None, 0)];
        assert_eq!(c.choose(&r), Some(0));
    }

    #[test]
    fn headroom_ties_go_to_fewer_in_flight_then_rotate() {
        let mut c = ReplicaChooser::new(ReadPolicy::Headroom);
        // Same room (credits − in flight), fewer in flight wins.
        let r = [st(true, Some(20), 10), st(true, Some(12), 2)];
        assert_eq!(c.choose(&r), Some(1));
        // Full ties rotate: 0, 1, 0, 1 ...
        let r = [st(true, Some(8), 0); 2];
        let mut c = ReplicaChooser::new(ReadPolicy::Headroom);
        let picks: Vec<_> = (0..4).map(|_| c.choose(&r).unwrap()).collect();
        assert_eq!(picks, [0, 1, 0, 1]);
    }

    #[test]
    fn round_robin_alternates_and_skips_a_replica_that_may_not_take_one() {
        let mut c = ReplicaChooser::new(ReadPolicy::RoundRobin);
        let all = [st(true, Some(1), 99); 3];
        let picks: Vec<_> = (0..6).map(|_| c.choose(&all).unwrap()).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2], "in turn, whatever the room");
        let r = [st(true, None, 0), st(false, None, 0), st(true, None, 0)];
        let picks: Vec<_> = (0..4).map(|_| c.choose(&r).unwrap()).collect();
        assert_eq!(picks, [0, 2, 0, 2]);
    }
}

/// ISR path choice at the end host (NSDI'26 §3.1, docs/isr.md), on the same
/// sans-IO core the simulator's switches use ([`trellis_fabric::isr::IsrTable`]).
///
/// The host is an ISR node whose ports are its paths and whose one target is
/// the namespace. Where the end-host version differs from the in-network one:
/// - the telemetry is the command's round trip on the path, measured by the
///   host itself (no INT header rides our NVMe/TCP PDUs), and no ECN;
/// - the local queueing delay is the host's own work on the path: its commands
///   in flight, each weighted by the queueing the path shows now (its
///   round-trip EWMA less the smallest round trip seen on it). In a switch it
///   is the egress backlog; a host sends at once, so its backlog is what it
///   has out. Counting it keeps every command between two completions from
///   herding onto the path that looked best last, once that path queues. The
///   score is `round trip + in flight × (round trip − floor)`: while no path
///   queues it is the round trip alone, so a host does not spread over longer
///   paths for nothing (the shortest-expected-delay rule, `(in flight + 1) ×
///   round trip`, did: on the emulated SAN it sent 3 of 4 light-load reads
///   over paths one or two hops longer, docs/san.md);
/// - a path with no fresh sample (the table's staleness, 10 ms) scores its
///   local part only, so an idle path is tried again;
/// - the SSD credits that completions carry (Gimbal's, `--credits`) are the
///   storage's half of the telemetry. Every path reaches the same namespace
///   as the same tenant, so a credit is the tenant's allowance at the drive,
///   not a path's: each path's controller learns the whole of it. ISR
///   therefore holds a command while the commands in flight over all the
///   paths it is given reach the smallest credit any of them reports
///   (per-path credit checks alone would let n paths send n times the
///   credit). In the network, hops rank packets by the credit instead.
pub struct IsrPaths {
    table: trellis_fabric::isr::IsrTable,
    paths: usize,
    tie: u64,
    /// Per path: the smallest round trip seen (u64::MAX before any).
    floor_ns: [u64; MAX_PATHS],
}

/// Most paths [`IsrPaths`] tracks.
pub const MAX_PATHS: usize = 8;

impl IsrPaths {
    pub fn new(paths: usize) -> Self {
        assert!((1..=MAX_PATHS).contains(&paths), "1 to {MAX_PATHS} paths");
        IsrPaths {
            table: trellis_fabric::isr::IsrTable::new(Default::default(), 1, paths),
            paths,
            tie: 0,
            floor_ns: [u64::MAX; MAX_PATHS],
        }
    }

    /// A command completed on `path` after `round_trip_ns`.
    pub fn on_completion(&mut self, path: usize, round_trip_ns: u64, now_ns: u64) {
        if path < self.paths {
            self.table
                .update(0, path as u8, round_trip_ns, false, now_ns);
            self.floor_ns[path] = self.floor_ns[path].min(round_trip_ns);
        }
    }

    /// The path for the next command, None when none may take one or the
    /// paths together have the tenant's credit in flight. `paths` describes
    /// each path now (`depth` is not used).
    pub fn choose(&mut self, paths: &[ReplicaState], now_ns: u64) -> Option<usize> {
        let paths = &paths[..paths.len().min(self.paths)];
        if let Some(credit) = paths.iter().filter_map(|p| p.credit_limit).min() {
            let inflight: u64 = paths.iter().map(|p| p.inflight as u64).sum();
            if inflight >= credit as u64 {
                return None;
            }
        }
        let mut cand = [0u8; MAX_PATHS];
        let mut n = 0;
        for (i, p) in paths.iter().enumerate() {
            if p.may_submit {
                cand[n] = i as u8;
                n += 1;
            }
        }
        if n == 0 {
            return None;
        }
        self.tie = self.tie.wrapping_add(1);
        let table = &self.table;
        let floor = &self.floor_ns;
        let local = |p: u8| {
            let queueing = table.delay_ns(0, p).saturating_sub(floor[p as usize]);
            paths[p as usize].inflight as u64 * queueing
        };
        Some(table.choose(0, &cand[..n], local, now_ns, self.tie) as usize)
    }
}

#[cfg(test)]
mod isr_tests {
    use super::*;

    fn st(inflight: u32) -> ReplicaState {
        ReplicaState {
            may_submit: true,
            credit_limit: None,
            depth: 32,
            inflight,
        }
    }

    #[test]
    fn isr_keeps_to_the_faster_path_until_it_queues_then_weighs_its_own_commands() {
        let mut c = IsrPaths::new(2);
        // Path 0 answers in 100 µs, path 1 in 400 µs: floors 100 and 400.
        for k in 0..16 {
            c.on_completion(0, 100_000, k * 1_000);
            c.on_completion(1, 400_000, k * 1_000);
        }
        let now = 20_000;
        // Neither path queues: the round trip alone decides, whatever is in flight.
        assert_eq!(c.choose(&[st(0), st(0)], now), Some(0));
        assert_eq!(c.choose(&[st(30), st(0)], now), Some(0));
        // Path 0 starts to queue (300 µs round trips): its EWMA rises to ~277 µs,
        // ~177 µs above its floor. Alone it still wins (277 < 400); one command of
        // ours out on it adds its queueing (277 + 177 > 400): path 1.
        for k in 16..32 {
            c.on_completion(0, 300_000, k * 1_000);
        }
        assert_eq!(c.choose(&[st(0), st(0)], 40_000), Some(0));
        assert_eq!(c.choose(&[st(1), st(0)], 40_000), Some(1));
        // A path that may not take a command is never chosen.
        let mut busy = st(0);
        busy.may_submit = false;
        assert_eq!(c.choose(&[busy, st(9)], now), Some(1));
        assert_eq!(c.choose(&[busy, busy], now), None);
        // After 10 ms without samples each path scores its local part only: the
        // idle one is tried again.
        assert_eq!(c.choose(&[st(1), st(0)], 20_000_000), Some(1));
    }

    #[test]
    fn isr_keeps_the_paths_together_within_the_tenants_credit() {
        let mut c = IsrPaths::new(2);
        let cr = |inflight, credit| ReplicaState {
            credit_limit: credit,
            ..st(inflight)
        };
        // Credit 8 at the drive: 5 + 2 in flight leaves room for one more...
        assert!(c.choose(&[cr(5, Some(8)), cr(2, Some(8))], 0).is_some());
        // ...5 + 3 is the whole credit, although each path alone is under it.
        assert_eq!(c.choose(&[cr(5, Some(8)), cr(3, Some(8))], 0), None);
        // The smallest credit reported counts (the drive got busier).
        assert_eq!(c.choose(&[cr(3, Some(4)), cr(1, Some(8))], 0), None);
        // Without credits only the paths' own limits apply.
        assert!(c.choose(&[cr(30, None), cr(30, None)], 0).is_some());
    }
}
