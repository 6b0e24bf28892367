//! Listeners added and removed while the target runs (`trellis ctl
//! listener add|remove`), with no existing connection dropped.
//!
//! As the subsystems (`livesub`), the listeners are an append-only table of
//! slots: a slot's index is the listener's index in `NewConn::listener` and
//! its PORTID is index + 1, for its life; slots are never reused, so the
//! table bounds the listeners added over a target's life
//! ([`MAX_LISTENERS_ADDED`]). The management socket binds a new listener's
//! socket (so a taken port fails the request) and hands it to the acceptor,
//! which polls it from its next loop (within 100 ms). Removing a listener
//! closes its socket there; connections accepted through it stay until
//! their hosts disconnect (nvmet, removing a port, tears its queues down;
//! we keep the rule that no live change drops a connection). Both raise
//! the Discovery Log Page Change notice: the log lists I/O listeners.
//!
//! ANA states are per listener: a listener added live starts in its
//! `ana_state` for every group if given, else in the states of the first
//! I/O listener (so a group made inaccessible stays so on the new path),
//! copied before it accepts; `ana set` changes it as any. On a node of an
//! HA pair (`[ha]`) I/O listeners are not added live: the lease decides
//! ANA states, and a path it did not set must not serve writes.

use crate::config::{ListenerConfig, ListenerKind};
use crate::subsystem::{ListenerInfo, Registry};
use anyhow::{bail, ensure};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Listeners that may be added over a target's life, beyond the config's
/// (each has its ANA state slots from the start: 1 KiB each).
pub const MAX_LISTENERS_ADDED: usize = 64;

struct Slot {
    info: OnceLock<ListenerInfo>,
    config: OnceLock<ListenerConfig>,
    removed: AtomicBool,
}

/// The registry's listeners (see the module comment).
pub struct ListenerTable {
    slots: Box<[Slot]>,
    len: AtomicUsize,
    /// Sockets bound by `add_listener`, for the acceptor to take.
    pending: Mutex<Vec<(usize, TcpListener)>>,
    change: Mutex<()>,
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

    fn live(&self, i: usize) -> Option<&ListenerInfo> {
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
            let mut p = crate::lock(&self.pending);
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

impl Registry {
    /// Binds and starts serving listener `c`; returns the address bound
    /// (port 0 picks a free one). Notifies discovery hosts.
    pub fn add_listener(&self, mut c: ListenerConfig) -> anyhow::Result<(SocketAddr, usize)> {
        ensure!(
            self.ha.get().is_none() || c.kind() == ListenerKind::Discovery,
            "this node is in an HA pair ([ha]): the lease sets its paths' ANA states, so an I/O listener cannot be added live; put it in the config and restart (a discovery listener, kind = \"discovery\", may be added)"
        );
        let t = &self.listeners;
        let _g = crate::lock(&t.change);
        if let Some(l) = t.iter().find(|l| l.addr == c.addr && c.addr.port() != 0) {
            bail!(
                "already listening on {} (portid {}): pick another address",
                l.addr,
                l.portid
            );
        }
        let idx = t.len.load(Ordering::Acquire);
        ensure!(
            idx < t.slots.len(),
            "{MAX_LISTENERS_ADDED} listeners were added over this target's life (the limit, MAX_LISTENERS_ADDED): restart it to add more"
        );
        let sock = TcpListener::bind(c.addr).map_err(|e| {
            anyhow::anyhow!("cannot listen on {}: {e}: pick a free address", c.addr)
        })?;
        sock.set_nonblocking(true)?;
        c.addr = sock.local_addr()?;
        let portid = idx as u16 + 1;
        // Before any connection: the new path's ANA states.
        let from = match c.ana_state {
            Some(_) => None,
            None => t
                .iter()
                .find(|l| l.kind == ListenerKind::Both)
                .map(|l| l.portid),
        };
        let st = c
            .ana_state
            .unwrap_or(trellis_nvme::ana::AnaState::Optimized);
        ensure!(
            self.ana.copy_listener(from, portid, st),
            "no ANA state slots for portid {portid}: restart to add more listeners"
        );
        let info = ListenerInfo {
            addr: c.addr,
            kind: c.kind(),
            portid,
            secure: c.secure_channel,
        };
        let _ = t.slots[idx].info.set(info);
        let _ = t.slots[idx].config.set(c.clone());
        t.len.store(idx + 1, Ordering::Release);
        crate::lock(&t.pending).push((idx, sock));
        tracing::info!("listening on {} ({:?}), added live", c.addr, c.kind());
        Ok((c.addr, self.discovery_changed(None)))
    }

    /// Stops listening on `addr`; its connections stay. The last listener
    /// cannot be removed (a target needs one, as the config says).
    pub fn remove_listener(&self, addr: SocketAddr) -> anyhow::Result<usize> {
        let t = &self.listeners;
        let _g = crate::lock(&t.change);
        let live: Vec<(usize, SocketAddr)> = (0..t.len.load(Ordering::Acquire))
            .filter_map(|i| Some((i, t.live(i)?.addr)))
            .collect();
        let Some(&(idx, _)) = live.iter().find(|(_, a)| *a == addr) else {
            let v: Vec<String> = live.iter().map(|(_, a)| a.to_string()).collect();
            bail!(
                "not listening on {addr}: the listeners are {}",
                v.join(", ")
            );
        };
        ensure!(
            live.len() > 1,
            "{addr} is the last listener: add another first (a target needs one)"
        );
        t.slots[idx].removed.store(true, Ordering::Release);
        tracing::info!("stopped listening on {addr} (removed live; its connections stay)");
        Ok(self.discovery_changed(None))
    }
}

/// The kind a listener added through the management socket asks for.
pub fn kind_param(s: Option<&str>) -> anyhow::Result<Option<ListenerKind>> {
    match s {
        None => Ok(None),
        Some("both") => Ok(Some(ListenerKind::Both)),
        Some("discovery") => Ok(Some(ListenerKind::Discovery)),
        Some(o) => {
            bail!("unknown listener kind {o:?}: use \"both\" (I/O and discovery) or \"discovery\"")
        }
    }
}
