//! The subsystem table: append-only slots, never moved or refilled, so
//! code holding `&Arc<Subsystem>` needs no lock (`control::subsystems`
//! adds and removes them live).

use crate::config::SubsystemConfig;
use crate::state::subsystem::Subsystem;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Subsystems that may be added over a target's life, beyond the config's.
pub const MAX_SUBSYSTEMS_ADDED: usize = 1024;

pub(crate) struct Slot {
    pub(crate) sub: OnceLock<Arc<Subsystem>>,
    /// Serial, model and host settings as configured (namespaces and hosts
    /// are read live for `ctl save`).
    pub(crate) config: OnceLock<SubsystemConfig>,
    pub(crate) removed: AtomicBool,
}

/// The registry's subsystems (see the module comment).
pub struct SubsystemTable {
    pub(crate) slots: Box<[Slot]>,
    /// Filled slots; a slot is filled before this moves past it.
    pub(crate) len: AtomicUsize,
    /// Serialises adds and removes (control path only).
    pub(crate) change: Mutex<()>,
}

impl SubsystemTable {
    /// The config's subsystems, in order (`subs[i].idx == i`).
    pub fn new(subs: Vec<Arc<Subsystem>>, cfgs: &[SubsystemConfig]) -> SubsystemTable {
        let cap = subs.len() + MAX_SUBSYSTEMS_ADDED;
        let slots: Box<[Slot]> = (0..cap)
            .map(|_| Slot {
                sub: OnceLock::new(),
                config: OnceLock::new(),
                removed: AtomicBool::new(false),
            })
            .collect();
        let n = subs.len();
        for (i, (s, c)) in subs.into_iter().zip(cfgs).enumerate() {
            let _ = slots[i].sub.set(s);
            let _ = slots[i].config.set(c.clone());
        }
        SubsystemTable {
            slots,
            len: AtomicUsize::new(n),
            change: Mutex::new(()),
        }
    }

    /// Every live (not removed) subsystem, in index order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            t: self,
            i: 0,
            n: self.len.load(Ordering::Acquire),
        }
    }

    /// The first live subsystem (as `Vec::first` of the former list).
    pub fn first(&self) -> Option<&Arc<Subsystem>> {
        self.iter().next()
    }

    /// The live subsystem at `idx`.
    pub fn get(&self, idx: usize) -> Option<&Arc<Subsystem>> {
        let s = self.slots.get(idx)?;
        (!s.removed.load(Ordering::Acquire))
            .then(|| s.sub.get())
            .flatten()
    }

    /// True once subsystem `idx` was removed.
    pub fn is_removed(&self, idx: usize) -> bool {
        self.slots
            .get(idx)
            .is_some_and(|s| s.removed.load(Ordering::Acquire))
    }

    /// How subsystem `idx` was configured (or added).
    pub fn config_of(&self, idx: usize) -> Option<&SubsystemConfig> {
        self.slots.get(idx)?.config.get()
    }
}

pub struct Iter<'a> {
    pub(crate) t: &'a SubsystemTable,
    pub(crate) i: usize,
    pub(crate) n: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Arc<Subsystem>;
    fn next(&mut self) -> Option<&'a Arc<Subsystem>> {
        while self.i < self.n {
            self.i += 1;
            if let Some(s) = self.t.get(self.i - 1) {
                return Some(s);
            }
        }
        None
    }
}

impl<'a> IntoIterator for &'a SubsystemTable {
    type Item = &'a Arc<Subsystem>;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}
