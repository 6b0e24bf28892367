//! The reactor's part in Preempt and Abort (`state::drain`): once per loop,
//! between handlers (so no command is between its reservation check and
//! its submit), see whether a drain was requested; if so, note every
//! reservation-gated command still executing, and publish the generation
//! once all of them have finished.

use super::*;

/// A command noted for a drain: connection index and generation, slot,
/// and the command's (CID, arrival time) to tell it from a later one;
/// `at`, the first drain generation it was noted for, which it holds up
/// (and every later one: it passed its check before any of them).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Noted {
    idx: u32,
    gen: u32,
    slot: u16,
    cid: u16,
    arrived_ns: u64,
    at: u64,
}

/// The reactor's drain progress.
#[derive(Default)]
pub(super) struct DrainState {
    /// The latest requested generation this reactor has seen.
    seen: u64,
    /// The latest it has published as drained.
    published: u64,
    /// Commands noted for `seen` (and earlier) that had not finished when
    /// last looked at, each once: at most every slot of this reactor's
    /// connections.
    noted: Vec<Noted>,
}

impl Reactor {
    /// One load of the requested generation while nothing is pending.
    #[inline]
    pub(super) fn drain_step(&mut self) {
        let requested = self.shared.reg.drain().requested();
        if requested == self.drain.seen && self.drain.published == self.drain.seen {
            return;
        }
        self.drain_work(requested);
    }

    #[cold]
    fn drain_work(&mut self, requested: u64) {
        if requested != self.drain.seen {
            let scope = self.shared.reg.drain().scope(self.drain.seen, requested);
            // The first generation this reactor had not seen: what is
            // executing now passed its check before it, so holds it up.
            let first_unseen = self.drain.seen + 1;
            self.drain.seen = requested;
            self.note(&scope, first_unseen);
        }
        let conns = &self.conns;
        self.drain.noted.retain(|n| {
            conns
                .get(n.idx as usize)
                .and_then(|e| e.as_ref())
                .is_some_and(|e| {
                    e.gen == n.gen && e.conn.still_executing(n.slot, n.cid, n.arrived_ns)
                })
        });
        // Every generation below the oldest still-noted command's is done:
        // a preempt is held up only by commands that passed their check
        // before it, never by ones noted for a later request.
        let done = match self.drain.noted.iter().map(|n| n.at).min() {
            Some(at) => at - 1,
            None => self.drain.seen,
        };
        if done > self.drain.published {
            self.drain.published = done;
            self.shared.reg.drain().drained(self.id, done);
        }
    }

    /// Notes, for generation `at`, every gated command in `scope` still
    /// executing that is not noted already.
    fn note(&mut self, scope: &crate::state::drain::Scope, at: u64) {
        let key = |n: &Noted| (n.idx, n.gen, n.slot, n.cid, n.arrived_ns);
        let known: std::collections::HashSet<_> = self.drain.noted.iter().map(key).collect();
        let noted = &mut self.drain.noted;
        for (idx, e) in self.conns.iter().enumerate() {
            let Some(e) = e else { continue };
            e.conn.gated_executing(scope, |slot, cid, arrived_ns| {
                let n = Noted {
                    idx: idx as u32,
                    gen: e.gen,
                    slot,
                    cid,
                    arrived_ns,
                    at,
                };
                if !known.contains(&key(&n)) {
                    noted.push(n);
                }
            });
        }
    }
}
