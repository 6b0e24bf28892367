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
use crate::state::listeners::MAX_LISTENERS_ADDED;
use crate::state::subsystem::{ListenerInfo, Registry};
use anyhow::{bail, ensure};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::Ordering;

impl Registry {
    /// Binds and starts serving listener `c`; returns the address bound
    /// (port 0 picks a free one). Notifies discovery hosts.
    pub fn add_listener(
        &self,
        mut c: ListenerConfig,
        in_ha_pair: bool,
    ) -> anyhow::Result<(SocketAddr, usize)> {
        ensure!(
            !in_ha_pair || c.kind() == ListenerKind::Discovery,
            "this node is in an HA pair ([ha]): the lease sets its paths' ANA states, so an I/O listener cannot be added live; put it in the config and restart (a discovery listener, kind = \"discovery\", may be added)"
        );
        let t = &self.listeners();
        let _g = crate::sys::lock(&t.change);
        let mut all = t.configs();
        all.push(c.clone());
        crate::config::check_listener_names(&all)?;
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
            self.ana().copy_listener(from, portid, st),
            "no ANA state slots for portid {portid}: restart to add more listeners"
        );
        let info = ListenerInfo {
            name: c.name.clone(),
            addr: c.addr,
            kind: c.kind(),
            portid,
            secure: c.secure_channel,
        };
        let _ = t.slots[idx].info.set(info);
        let _ = t.slots[idx].config.set(c.clone());
        t.len.store(idx + 1, Ordering::Release);
        crate::sys::lock(&t.pending).push((idx, sock));
        tracing::info!("listening on {} ({:?}), added live", c.addr, c.kind());
        Ok((c.addr, self.discovery_changed(None)))
    }

    /// Stops listening on `addr`; its connections stay. The last listener
    /// cannot be removed (a target needs one, as the config says).
    pub fn remove_listener(&self, addr: SocketAddr) -> anyhow::Result<usize> {
        let t = &self.listeners();
        let _g = crate::sys::lock(&t.change);
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
