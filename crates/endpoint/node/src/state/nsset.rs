//! The live set of namespaces, changed while the target runs (`trellis ctl
//! namespace add|remove`) without a lock or allocation on the I/O path.
//!
//! RCU-style: the set is an immutable [`NsSet`] behind an `Arc`. A change
//! builds a new set and publishes it with a generation number; each
//! connection keeps the `Arc` it last took and compares generations once
//! per received batch (one relaxed load of a line written only by the
//! control path), taking the new set (a lock and a refcount increment)
//! only when it changed. A removed namespace stays alive while any
//! connection still holds a set that names it, so a command in flight on it
//! never touches freed memory: it finishes on the old set, or, resolved
//! against the new one, fails with Invalid Namespace.
//!
//! Namespaces are numbered by `uid`, never reused, since reactors key their
//! backend queues by it: a new namespace never inherits a removed one's
//! queue.

use crate::state::subsystem::Namespace;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Namespace uids handed out over the node's life (adds included): the
/// per-reactor queue table is indexed by uid, so this bounds it.
pub const MAX_NAMESPACE_UIDS: usize = 1 << 16;

/// One subsystem's namespaces.
#[derive(Clone, Default)]
pub struct SubNs {
    /// Sorted by NSID.
    pub namespaces: Vec<Arc<Namespace>>,
    /// (ANAGRPID, its NSIDs here), ascending by ANAGRPID: the groups this
    /// subsystem's ANA log lists.
    pub ana_groups: Vec<(u32, Vec<u32>)>,
}

impl SubNs {
    pub fn new(mut namespaces: Vec<Arc<Namespace>>) -> SubNs {
        namespaces.sort_by_key(|n| n.nsid());
        let mut m: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
        for n in &namespaces {
            m.entry(n.anagrpid()).or_default().push(n.nsid());
        }
        SubNs {
            namespaces,
            ana_groups: m.into_iter().collect(),
        }
    }

    pub fn namespace(&self, nsid: u32) -> Option<&Arc<Namespace>> {
        self.namespaces
            .binary_search_by_key(&nsid, |n| n.nsid())
            .ok()
            .map(|i| &self.namespaces[i])
    }
}

/// Every namespace of the node at one generation.
#[derive(Clone, Default)]
pub struct NsSet {
    pub gen: u64,
    /// By uid; None once removed (or for a uid not yet used).
    pub by_uid: Vec<Option<Arc<Namespace>>>,
    /// By subsystem index (`Subsystem::idx`).
    pub subs: Vec<SubNs>,
}

/// The empty set a subsystem index outside the table resolves to.
static NO_NAMESPACES: SubNs = SubNs {
    namespaces: Vec::new(),
    ana_groups: Vec::new(),
};

impl NsSet {
    /// Namespace `uid`, if it is still in this set.
    #[inline]
    pub fn by_uid(&self, uid: u32) -> Option<&Namespace> {
        self.by_uid.get(uid as usize)?.as_deref()
    }

    /// Subsystem `idx`'s namespaces (none for an unknown index).
    #[inline]
    pub fn sub(&self, idx: usize) -> &SubNs {
        self.subs.get(idx).unwrap_or(&NO_NAMESPACES)
    }

    /// Every live namespace.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Namespace>> {
        self.by_uid.iter().flatten()
    }
}

/// The published set and its generation.
pub struct NsCell {
    gen: AtomicU64,
    cur: Mutex<Arc<NsSet>>,
}

impl NsCell {
    pub fn new(set: NsSet) -> NsCell {
        NsCell {
            gen: AtomicU64::new(set.gen),
            cur: Mutex::new(Arc::new(set)),
        }
    }

    /// The generation of the current set: compare with a held set's `gen`.
    #[inline]
    pub fn gen(&self) -> u64 {
        self.gen.load(Ordering::Acquire)
    }

    /// The current set (control path, or a connection refreshing).
    pub fn load(&self) -> Arc<NsSet> {
        crate::sys::lock(&self.cur).clone()
    }

    /// Builds the next set from the current one with `f` and publishes it;
    /// changes are serialised by the lock. `f`'s error leaves the set as is.
    pub fn update<T, E>(&self, f: impl FnOnce(&NsSet) -> Result<(NsSet, T), E>) -> Result<T, E> {
        let mut cur = crate::sys::lock(&self.cur);
        let (mut next, out) = f(&cur)?;
        next.gen = cur.gen + 1;
        let gen = next.gen;
        *cur = Arc::new(next);
        // After the set: a reader that sees the new generation finds the
        // new set (or a newer one) when it takes the lock.
        self.gen.store(gen, Ordering::Release);
        Ok(out)
    }
}
