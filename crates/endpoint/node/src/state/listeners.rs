//! The listener table: append-only slots, one per listener over the
//! target's life (`control::listeners` adds and removes them live).

use crate::config::ListenerConfig;
use crate::state::subsystem::ListenerInfo;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Listeners that may be added over a target's life, beyond the config's
/// (each has its ANA state slots from the start: 1 KiB each).
pub const MAX_LISTENERS_ADDED: usize = 64;

pub(crate) struct Slot {
    pub(crate) info: OnceLock<ListenerInfo>,
    pub(crate) config: OnceLock<ListenerConfig>,
    pub(crate) removed: AtomicBool,
}

/// The registry's listeners (see the module comment).
pub struct ListenerTable {
    pub(crate) slots: Box<[Slot]>,
    pub(crate) len: AtomicUsize,
    /// Sockets bound by `add_listener`, for the acceptor to take.
    pub(crate) pending: Mutex<Vec<(usize, TcpListener)>>,
    pub(crate) change: Mutex<()>,
}

impl ListenerTable {
    /// The config's listeners (addresses as bound), in order.
    pub fn new(infos: Vec<ListenerInfo>, cfgs: &[ListenerConfig]) -> ListenerTable {
        let n = infos.len();
        let slots: Box<[Slot]> = (0..n + MAX_LISTENERS_ADDED)
            .map(|_| Slot {
                info: OnceLock::new(),
                config: OnceLock::new(),
                removed: AtomicBool::new(false),
            })
            .collect();
        for (i, (l, c)) in infos.into_iter().zip(cfgs).enumerate() {
            let _ = slots[i].info.set(l);
            let _ = slots[i].config.set(c.clone());
        }
        ListenerTable {
            slots,
            len: AtomicUsize::new(n),
            pending: Mutex::new(Vec::new()),
            change: Mutex::new(()),
        }
    }

    /// Every live (not removed) listener, in index order.
    pub fn iter(&self) -> impl Iterator<Item = &ListenerInfo> + '_ {
        let n = self.len.load(Ordering::Acquire);
        (0..n).filter_map(|i| self.live(i))
    }

    pub(crate) fn live(&self, i: usize) -> Option<&ListenerInfo> {
        let s = self.slots.get(i)?;
        (!s.removed.load(Ordering::Acquire))
            .then(|| s.info.get())
            .flatten()
    }

    /// Listener `i`, removed or not: connections accepted through a
    /// listener outlive its removal.
    pub fn get(&self, i: usize) -> Option<&ListenerInfo> {
        self.slots.get(i)?.info.get()
    }

    /// The listener of PORTID `portid` (index + 1), removed or not.
    pub fn by_portid(&self, portid: u16) -> Option<&ListenerInfo> {
        self.get(usize::from(portid).checked_sub(1)?)
    }

    /// The live listeners' configurations (`ctl save`).
    pub fn configs(&self) -> Vec<ListenerConfig> {
        let n = self.len.load(Ordering::Acquire);
        (0..n)
            .filter(|&i| self.live(i).is_some())
            .filter_map(|i| self.slots[i].config.get().cloned())
            .collect()
    }

    /// The acceptor's sockets follow the table: listeners added since are
    /// appended, removed ones dropped (closed). True if `socks` changed.
    pub fn sync_sockets(&self, socks: &mut Vec<(usize, TcpListener)>) -> bool {
        let mut changed = false;
        {
            let mut p = crate::sys::lock(&self.pending);
            if !p.is_empty() {
                socks.append(&mut p);
                changed = true;
            }
        }
        let before = socks.len();
        socks.retain(|(i, _)| self.live(*i).is_some());
        changed || socks.len() != before
    }
}

impl<'a> IntoIterator for &'a ListenerTable {
    type Item = &'a ListenerInfo;
    type IntoIter = Box<dyn Iterator<Item = &'a ListenerInfo> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl std::ops::Index<usize> for ListenerTable {
    type Output = ListenerInfo;
    /// As `Vec` indexing (tests): panics past the filled slots.
    fn index(&self, i: usize) -> &ListenerInfo {
        self.slots[i]
            .info
            .get()
            .unwrap_or_else(|| panic!("no listener {i}"))
    }
}
