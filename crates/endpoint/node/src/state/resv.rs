//! Persistent reservations (NVMe Base Specification 2.0, §8.19): the state
//! machine of one namespace's registrants and reservation, its I/O access
//! rules, its persistence file, and each controller's Reservation
//! Notification log.
//!
//! [`State`] is deterministic and does no I/O: every command is a method
//! that either changes it and returns the notices other hosts get, or
//! returns the status to fail with and leaves it as it was. [`Resv`] wraps
//! it for a namespace: the I/O path's check (one atomic load while no
//! reservation is held), a lock for the control path, and the file written
//! before a command completes while Persist Through Power Loss is set.
//!
//! A host is its 128-bit Host Identifier (from the Fabrics Connect data):
//! every controller of that host shares its registration (§8.19.1). Here
//! the Host Identifier is bound to the host NQN the controller was admitted
//! as ([`HostId`]), so a controller that claims another host's Host ID under
//! its own NQN (the NQN that DH-HMAC-CHAP or a TLS PSK proved) is another
//! host: it cannot use that host's registration or reservation.

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, RwLock};
use trellis_nvme::resv::{
    notice, AcquireAction, AcquireCmd, Cptpl, Notice, RType, RegisterAction, RegisterCmd,
    ReleaseAction, ReleaseCmd, ReportHeader,
};
use trellis_nvme::status::generic;
use trellis_nvme::Status;

/// A reservation host: the Host Identifier of its Connect data and the
/// first 16 bytes of the SHA-256 of its host NQN. Two controllers are one
/// host only when both match (a host has one NQN: NVMe Base 2.0, §4.7.1, "a
/// host NQN uniquely identifies the host"). Only the Host Identifier goes
/// on the wire (Reservation Report); the digest is the binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct HostId {
    pub id: [u8; 16],
    nqn: [u8; 16],
}

/// The NQN digest of a registrant loaded from a version 1 state file, which
/// saved Host IDs only: bound by Host ID alone until that host registers
/// again (then it takes the registering controller's NQN).
const NQN_UNKNOWN: [u8; 16] = [0; 16];

impl HostId {
    pub fn new(id: [u8; 16], hostnqn: &str) -> HostId {
        use sha2::Digest;
        let d = sha2::Sha256::digest(hostnqn.as_bytes());
        let mut nqn = [0u8; 16];
        nqn.copy_from_slice(&d[..16]);
        debug_assert_ne!(nqn, NQN_UNKNOWN);
        HostId { id, nqn }
    }

    /// A host from its parts, for tests.
    #[cfg(test)]
    pub(crate) const fn raw(id: [u8; 16], nqn: [u8; 16]) -> HostId {
        HostId { id, nqn }
    }

    /// No Host Identifier (all zero): every such host would share one
    /// registration, so reservation commands refuse it.
    pub fn is_zero(&self) -> bool {
        self.id == [0; 16]
    }

    /// Whether this stored host (a registrant, a holder, a notice's
    /// addressee) is the host `h` of a controller.
    pub fn names(&self, h: &HostId) -> bool {
        self.id == h.id && (self.nqn == h.nqn || self.nqn == NQN_UNKNOWN)
    }
}

/// Registration key mismatch, not a registrant, or access denied (§8.19).
pub const CONFLICT: Status = generic::RESERVATION_CONFLICT.dnr();
const INVALID_FIELD: Status = generic::INVALID_FIELD.dnr();
/// A Register that would exceed `target.max_registrants`: the spec has no
/// status for a full registrant table; Capacity Exceeded names it best.
pub const REGISTRANTS_FULL: Status = generic::CAPACITY_EXCEEDED.dnr();

/// One registrant: a host and its registration key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registrant {
    pub hostid: HostId,
    pub rkey: u64,
}

/// The reservation held: its type and the host that acquired it (for the
/// All Registrants types every registrant holds it; `holder` is then only
/// who acquired it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub rtype: RType,
    pub holder: HostId,
}

/// A namespace's reservation state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Generation: +1 on each successful Register, Preempt and Clear.
    pub gen: u32,
    /// At most the configured bound, in registration order.
    pub regs: Vec<Registrant>,
    pub held: Option<Held>,
    /// Persist Through Power Loss State.
    pub ptpl: bool,
}

/// Notices a command leaves for hosts other than the one that sent it:
/// (host, Reservation Notification Log Page Type).
pub type Notices = Vec<(HostId, u8)>;

impl State {
    fn find(&self, h: &HostId) -> Option<usize> {
        self.regs.iter().position(|r| r.hostid.names(h))
    }

    pub fn is_registered(&self, h: &HostId) -> bool {
        self.find(h).is_some()
    }

    /// Whether `h` holds the reservation (any registrant, for the All
    /// Registrants types).
    pub fn is_holder(&self, h: &HostId) -> bool {
        match self.held {
            Some(r) if r.rtype.all_registrants() => self.is_registered(h),
            Some(r) => r.holder.names(h),
            None => false,
        }
    }

    /// The access table (§8.19, Figure "Command Behavior in the Presence of
    /// a Reservation"): may `h` run a command of the read (`write` false)
    /// or write group?
    pub fn allows(&self, h: &HostId, write: bool) -> bool {
        let Some(r) = self.held else {
            return true;
        };
        if self.is_holder(h) || r.rtype.registrants_have_access() && self.is_registered(h) {
            return true;
        }
        !write && !r.rtype.exclusive_access()
    }

    /// The key check every command but Register makes: `h` is a registrant
    /// and CRKEY is its key.
    /// On success the registrant is bound to `h` (a version 1 one takes
    /// its NQN), so the holder it may become names it exactly.
    fn check_key(&mut self, h: &HostId, crkey: u64) -> Result<usize, Status> {
        match self.find(h) {
            Some(i) if self.regs[i].rkey == crkey => {
                self.bind(i, h);
                Ok(i)
            }
            _ => Err(CONFLICT),
        }
    }

    /// Reservation Register. `max`: the bound on registrants.
    pub fn register(
        &mut self,
        h: &HostId,
        cmd: &RegisterCmd,
        crkey: u64,
        nrkey: u64,
        max: usize,
    ) -> Result<Notices, Status> {
        let at = self.find(h);
        let mut notes = Notices::new();
        match cmd.action {
            // Registering again with the same key succeeds (and changes nothing).
            RegisterAction::Register => match at {
                Some(i) if self.regs[i].rkey == nrkey => self.bind(i, h),
                Some(_) => return Err(CONFLICT),
                None if self.regs.len() >= max => return Err(REGISTRANTS_FULL),
                None => self.regs.push(Registrant {
                    hostid: *h,
                    rkey: nrkey,
                }),
            },
            RegisterAction::Unregister | RegisterAction::Replace => {
                let i = at.ok_or(CONFLICT)?;
                if !cmd.iekey && self.regs[i].rkey != crkey {
                    return Err(CONFLICT);
                }
                self.bind(i, h);
                if cmd.action == RegisterAction::Replace {
                    self.regs[i].rkey = nrkey;
                } else {
                    self.unregister(i, &mut notes);
                }
            }
        }
        match cmd.cptpl {
            Cptpl::NoChange => {}
            Cptpl::Clear => self.ptpl = false,
            Cptpl::Set => self.ptpl = true,
        }
        self.gen = self.gen.wrapping_add(1);
        Ok(notes)
    }

    /// Registrant `i` is host `h` from now on: a version 1 registrant
    /// (NQN unknown) takes the NQN of the host that registered again as it.
    fn bind(&mut self, i: usize, h: &HostId) {
        let was = self.regs[i].hostid;
        if was == *h {
            return;
        }
        if let Some(held) = self.held.as_mut().filter(|r| r.holder == was) {
            held.holder = *h;
        }
        self.regs[i].hostid = *h;
    }

    /// Removes registrant `i` and what it held: a single holder's
    /// reservation is released (a Registrants Only one with a notice to
    /// the remaining registrants); an All Registrants one ends with its
    /// last registrant.
    fn unregister(&mut self, i: usize, notes: &mut Notices) {
        let gone = self.regs.remove(i);
        let Some(r) = self.held else {
            return;
        };
        if r.rtype.all_registrants() {
            if self.regs.is_empty() {
                self.held = None;
            }
        } else if r.holder == gone.hostid {
            self.held = None;
            if r.rtype.registrants_have_access() {
                self.notify_all(&gone.hostid, notice::RESERVATION_RELEASED, notes);
            }
        }
    }

    /// A notice of `kind` for every registrant but `except`.
    fn notify_all(&self, except: &HostId, kind: u8, notes: &mut Notices) {
        for r in self.regs.iter().filter(|r| !r.hostid.names(except)) {
            notes.push((r.hostid, kind));
        }
    }

    /// Reservation Acquire. IEKEY set is Invalid Field: since revision 1.3
    /// (RESCAP bit 7) it no longer skips the key check of Acquire and
    /// Release, and nvmet refuses it the same way. Preempt and Abort is a
    /// Preempt here, the state change only: the preempted hosts' commands
    /// that have not reached the backend fail their check there
    /// (`data::nvme::io`), and its completion waits for those already past
    /// it (`state::drain`).
    pub fn acquire(
        &mut self,
        h: &HostId,
        cmd: &AcquireCmd,
        crkey: u64,
        prkey: u64,
    ) -> Result<Notices, Status> {
        if cmd.iekey {
            return Err(INVALID_FIELD);
        }
        self.check_key(h, crkey)?;
        match cmd.action {
            AcquireAction::Acquire => match self.held {
                None => {
                    self.held = Some(Held {
                        rtype: cmd.rtype,
                        holder: *h,
                    });
                    Ok(Notices::new())
                }
                // Acquiring again what one holds succeeds; anything else conflicts.
                Some(r) if self.is_holder(h) && r.rtype == cmd.rtype => Ok(Notices::new()),
                Some(_) => Err(CONFLICT),
            },
            AcquireAction::Preempt | AcquireAction::PreemptAndAbort => {
                let notes = self.preempt(h, cmd.rtype, prkey)?;
                self.gen = self.gen.wrapping_add(1);
                Ok(notes)
            }
        }
    }

    /// Preempt (§8.19, "Preempting a Reservation or Registrants"), case by
    /// case as Linux nvmet reads the spec:
    /// - no reservation: the registrants with key PRKEY are unregistered;
    /// - All Registrants: PRKEY 0 takes the reservation and unregisters
    ///   every other host; another PRKEY only unregisters;
    /// - PRKEY the holder's key: the reservation is taken over (or, by the
    ///   holder itself, its type changed) and the other hosts with that key
    ///   unregistered (nvmet unregisters nobody when the holder preempts
    ///   itself; the spec's rule has no such exception);
    /// - another PRKEY only unregisters; PRKEY 0 is Invalid Field.
    ///
    /// Unregistered hosts get Registration Preempted; when the type
    /// changes, the remaining registrants get Reservation Released. A
    /// command that would only unregister and names no registrant is a
    /// conflict.
    fn preempt(&mut self, h: &HostId, rtype: RType, prkey: u64) -> Result<Notices, Status> {
        let mut notes = Notices::new();
        let Some(r) = self.held else {
            return self.unregister_by_key(h, prkey, notes);
        };
        let take_over = if r.rtype.all_registrants() {
            prkey == 0
        } else {
            let holder_key = self.find(&r.holder).map(|i| self.regs[i].rkey);
            if holder_key != Some(prkey) && prkey == 0 {
                return Err(INVALID_FIELD);
            }
            holder_key == Some(prkey)
        };
        if !take_over {
            return self.unregister_by_key(h, prkey, notes);
        }
        self.held = Some(Held { rtype, holder: *h });
        if r.rtype.all_registrants() {
            self.unregister_where(h, |_| true, &mut notes);
        } else {
            self.unregister_where(h, |x| x.rkey == prkey, &mut notes);
        }
        if r.rtype != rtype {
            self.notify_all(h, notice::RESERVATION_RELEASED, &mut notes);
        }
        Ok(notes)
    }

    /// Unregisters every registrant with key `prkey`, `h` included (then
    /// without a notice to itself); a conflict when there is none.
    fn unregister_by_key(
        &mut self,
        h: &HostId,
        prkey: u64,
        mut notes: Notices,
    ) -> Result<Notices, Status> {
        let mut any = false;
        while let Some(i) = self.regs.iter().position(|r| r.rkey == prkey) {
            let host = self.regs[i].hostid;
            self.unregister(i, &mut notes);
            if host != *h {
                notes.push((host, notice::REGISTRATION_PREEMPTED));
            }
            any = true;
        }
        if any {
            Ok(notes)
        } else {
            Err(CONFLICT)
        }
    }

    /// Unregisters every registrant but `keep` that `pred` selects, each
    /// with a Registration Preempted notice (the reservation was just
    /// given to `keep`, so no unregistration releases it).
    fn unregister_where(
        &mut self,
        keep: &HostId,
        pred: impl Fn(&Registrant) -> bool,
        notes: &mut Notices,
    ) {
        self.regs.retain(|r| {
            let go = !r.hostid.names(keep) && pred(r);
            if go {
                notes.push((r.hostid, notice::REGISTRATION_PREEMPTED));
            }
            !go
        });
    }

    /// Reservation Release. IEKEY set is Invalid Field, as for Acquire.
    pub fn release(&mut self, h: &HostId, cmd: &ReleaseCmd, crkey: u64) -> Result<Notices, Status> {
        if cmd.iekey {
            return Err(INVALID_FIELD);
        }
        self.check_key(h, crkey)?;
        let mut notes = Notices::new();
        match cmd.action {
            ReleaseAction::Release => {
                let Some(r) = self.held else {
                    return Ok(notes); // nothing held: success, no change
                };
                if !self.is_holder(h) {
                    return Ok(notes); // not the holder: success, no change
                }
                if r.rtype as u8 != cmd.rtype {
                    return Err(INVALID_FIELD);
                }
                self.held = None;
                if r.rtype.registrants_have_access() {
                    self.notify_all(h, notice::RESERVATION_RELEASED, &mut notes);
                }
            }
            ReleaseAction::Clear => {
                self.notify_all(h, notice::RESERVATION_PREEMPTED, &mut notes);
                self.regs.clear();
                self.held = None;
                self.gen = self.gen.wrapping_add(1);
            }
        }
        Ok(notes)
    }

    /// What Reservation Report lists: the header and one entry per
    /// registrant. CNTLID is FFFFh: a registration belongs to a host, not
    /// to one of its (dynamic) controllers.
    pub fn report(&self) -> (ReportHeader, Vec<trellis_nvme::resv::Registrant>) {
        let h = ReportHeader {
            gen: self.gen,
            rtype: self.held.map_or(0, |r| r.rtype as u8),
            regctl: self.regs.len().min(u16::MAX as usize) as u16,
            ptpls: self.ptpl,
        };
        let regs = self
            .regs
            .iter()
            .map(|r| trellis_nvme::resv::Registrant {
                cntlid: 0xFFFF,
                holds: self.is_holder(&r.hostid),
                hostid: r.hostid.id,
                rkey: r.rkey,
            })
            .collect();
        (h, regs)
    }
}

/// Where an HA pair keeps each namespace's reservations: with its
/// ownership lease (`control::ha::shared`), so the node that takes over
/// serves the registrations and the holder the hosts were told of.
/// Only the lease holder saves; the node about to serve loads.
pub trait SharedResv: Send + Sync {
    /// Saves `bytes` as namespace `name`'s state. Ok only once it is where
    /// the other node will read it, and only while this node holds the
    /// lease ([`NotOwner`] otherwise).
    fn save(&self, name: &str, bytes: &[u8]) -> anyhow::Result<()>;
    /// Namespace `name`'s saved state; None: never saved.
    fn load(&self, name: &str) -> anyhow::Result<Option<Vec<u8>>>;
}

/// A [`SharedResv::save`] refused because this node does not hold the
/// lease (any more): the command fails with a path error.
#[derive(Debug)]
pub struct NotOwner;

impl std::fmt::Display for NotOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("this node does not hold the HA lease")
    }
}

impl std::error::Error for NotOwner {}

/// The most bytes a namespace's shared state may take: the JSON of
/// `MAX_REGISTRANTS_LIMIT` registrants is far below it.
pub const MAX_SHARED_BYTES: usize = 1 << 20;

/// One namespace's reservations.
pub struct Resv {
    /// RTYPE of the reservation held, 0 while none is: the I/O path reads
    /// only this while no reservation is held.
    active: AtomicU8,
    /// Read by the I/O check while a reservation is held (readers do not
    /// wait for each other); written only to swap in a new state.
    state: RwLock<State>,
    /// Serializes reservation commands, file writes included, so that I/O
    /// checks never wait for an fsync.
    commands: Mutex<()>,
    /// The persistence file (used while PTPL is set); None: never persisted.
    path: Option<PathBuf>,
    /// Its name in the HA pair's shared state (the NGUID in hex, the same
    /// on both nodes); empty: none.
    name: String,
    max_registrants: usize,
}

impl Resv {
    /// A namespace's reservations: those saved in `path` if it exists (they
    /// were persisted with PTPL set), else none.
    pub fn open(path: Option<PathBuf>, max_registrants: usize) -> anyhow::Result<Resv> {
        let state = match &path {
            Some(p) if p.exists() => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))?;
                let saved: Saved = serde_json::from_str(&text).map_err(|e| {
                    anyhow::anyhow!("reservation state {} is not valid: {e} (restore it, or delete it to drop the reservations)", p.display())
                })?;
                State::from_saved(saved, max_registrants)
                    .map_err(|e| anyhow::anyhow!("reservation state {}: {e}", p.display()))?
            }
            _ => State::default(),
        };
        if let (Some(p), true) = (&path, state.ptpl) {
            tracing::info!(
                "reservations restored from {}: {} registrants, type {}",
                p.display(),
                state.regs.len(),
                state.held.map_or(0, |r| r.rtype as u8)
            );
        }
        Ok(Resv {
            active: AtomicU8::new(state.held.map_or(0, |r| r.rtype as u8)),
            state: RwLock::new(state),
            commands: Mutex::new(()),
            path,
            name: String::new(),
            max_registrants,
        })
    }

    /// Names the namespace in the HA pair's shared state.
    pub fn named(mut self, name: String) -> Resv {
        self.name = name;
        self
    }

    /// Replaces the state with the HA pair's shared copy, before this node
    /// serves: what the last owner acknowledged. With no copy saved yet,
    /// this node's state becomes the copy. Returns the registrant count.
    pub fn load_shared(&self, shared: &dyn SharedResv) -> anyhow::Result<usize> {
        let _one_at_a_time = crate::sys::lock(&self.commands);
        let Some(bytes) = shared.load(&self.name)? else {
            let cur = self.snapshot();
            shared.save(&self.name, &shared_bytes(&cur)?)?;
            return Ok(cur.regs.len());
        };
        anyhow::ensure!(
            bytes.len() <= MAX_SHARED_BYTES,
            "{} bytes, over {MAX_SHARED_BYTES}",
            bytes.len()
        );
        let saved: Saved = serde_json::from_slice(&bytes)?;
        let next = State::from_saved(saved, self.max_registrants)?;
        let n = next.regs.len();
        self.install(next);
        Ok(n)
    }

    /// Makes `next` the state: the I/O path's flag after it.
    fn install(&self, next: State) {
        let active = next.held.map_or(0, |r| r.rtype as u8);
        *self
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = next;
        // After the state: an I/O that still sees the old flag finds
        // the new state under the lock, which `allows` checks anyway.
        self.active.store(active, Ordering::Release);
    }

    /// Whether a reservation is held: the I/O path's one load.
    #[inline]
    pub fn any_held(&self) -> bool {
        // Acquire pairs with the Release store in `apply`: a host told of
        // an acquisition sees it enforced on every reactor.
        self.active.load(Ordering::Acquire) != 0
    }

    /// The I/O path's check (read or write command group). While no
    /// reservation is held it is one load and a compare.
    #[inline]
    pub fn check_io(&self, h: &HostId, write: bool) -> Result<(), Status> {
        if !self.any_held() {
            return Ok(());
        }
        self.check_held(h, write)
    }

    #[cold]
    fn check_held(&self, h: &HostId, write: bool) -> Result<(), Status> {
        if self.read().allows(h, write) {
            Ok(())
        } else {
            Err(CONFLICT)
        }
    }

    /// A copy of the state (Report, tests).
    pub fn snapshot(&self) -> State {
        self.read().clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn max_registrants(&self) -> usize {
        self.max_registrants
    }

    /// Back to no registrants and no reservation, without touching the
    /// file: for the fuzz harness, whose registry outlives each input and
    /// keeps no files (an in-memory node identity gives no path).
    pub(crate) fn forget(&self) {
        let _one_at_a_time = crate::sys::lock(&self.commands);
        *self
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = State::default();
        self.active.store(0, Ordering::Release);
    }

    /// Runs `f` on a copy of the state and, when it succeeds, saves the
    /// copy (while PTPL is set, or to delete the file when it was cleared)
    /// before making it the state: a command completes only once durable.
    pub fn apply(
        &self,
        f: impl FnOnce(&mut State, usize) -> Result<Notices, Status>,
    ) -> Result<Notices, Status> {
        self.apply_with(None, f)
    }

    /// [`Resv::apply`] on a node of an HA pair: the state is also saved in
    /// the pair's shared copy before the command completes, so an
    /// acknowledged reservation survives a failover or a drain.
    pub fn apply_with(
        &self,
        shared: Option<&dyn SharedResv>,
        f: impl FnOnce(&mut State, usize) -> Result<Notices, Status>,
    ) -> Result<Notices, Status> {
        let _one_at_a_time = crate::sys::lock(&self.commands);
        let cur = self.snapshot();
        let mut next = cur.clone();
        let notes = f(&mut next, self.max_registrants)?;
        if next != cur {
            self.persist(&cur, &next).map_err(|e| {
                tracing::error!("cannot save reservation state: {e}");
                generic::INTERNAL_ERROR
            })?;
            // Last: the shared copy is what the next owner serves, and the
            // one a host may rely on once this command completes.
            if let Some(sh) = shared {
                save_shared(sh, &self.name, &next)?;
            }
            self.install(next);
        }
        Ok(notes)
    }

    /// Set Features Reservation Persistence (83h).
    pub fn set_ptpl(&self, shared: Option<&dyn SharedResv>, on: bool) -> Result<(), Status> {
        self.apply_with(shared, |s, _| {
            s.ptpl = on;
            Ok(Notices::new())
        })
        .map(drop)
    }

    fn persist(&self, old: &State, new: &State) -> std::io::Result<()> {
        let Some(p) = &self.path else {
            return Ok(());
        };
        if new.ptpl {
            let text = serde_json::to_vec_pretty(&new.to_saved()).map_err(std::io::Error::other)?;
            write_atomic(p, &text)
        } else if old.ptpl {
            // Cleared: nothing may survive a power loss any more.
            match std::fs::remove_file(p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => sync_dir(p),
            }
        } else {
            Ok(())
        }
    }
}

fn shared_bytes(st: &State) -> anyhow::Result<Vec<u8>> {
    Ok(serde_json::to_vec(&st.to_shared())?)
}

/// Saves `st` as `name` in the pair's shared copy. Not the lease holder: a
/// path error (the host retries on the node that serves); the store
/// failing: an internal error the host may retry (no DNR).
fn save_shared(sh: &dyn SharedResv, name: &str, st: &State) -> Result<(), Status> {
    let r = shared_bytes(st).and_then(|b| sh.save(name, &b));
    r.map_err(|e| {
        if e.downcast_ref::<NotOwner>().is_some() {
            trellis_nvme::status::path::ANA_INACCESSIBLE
        } else {
            tracing::error!("cannot save reservation state in the HA store: {e:#}");
            generic::INTERNAL_ERROR
        }
    })
}

/// Reservation notices a controller keeps for its host to read (log page
/// 80h): nvmet keeps 64 as well. Older ones are dropped, which the host
/// sees as a gap in Log Page Count.
pub const NOTICE_QUEUE_MAX: usize = 64;

/// A controller's Reservation Notification log and mask (feature 82h).
#[derive(Default)]
pub struct NoticeLog {
    count: u64,
    pending: VecDeque<Notice>,
    /// Per NSID mask bits (`trellis_nvme::resv::mask_bit`).
    masks: HashMap<u32, u32>,
    /// The mask of namespaces not in `masks` (set with NSID FFFFFFFFh).
    mask_all: u32,
}

impl NoticeLog {
    /// Queues a notice of `kind` for `nsid` unless masked; true if queued.
    pub fn push(&mut self, nsid: u32, kind: u8) -> bool {
        if self.mask(nsid) & trellis_nvme::resv::mask_bit(kind) != 0 {
            return false;
        }
        // Log Page Count never reads 0 for a real entry: it wraps to 1.
        self.count = self.count.checked_add(1).unwrap_or(1);
        if self.pending.len() == NOTICE_QUEUE_MAX {
            self.pending.pop_front();
        }
        self.pending.push_back(Notice {
            count: self.count,
            kind,
            available: 0,
            nsid,
        });
        true
    }

    /// The next notice (an empty page when none), taken from the queue.
    pub fn pop(&mut self) -> Notice {
        let mut n = self.pending.pop_front().unwrap_or_default();
        n.available = self.pending.len().min(u8::MAX as usize) as u8;
        n
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn mask(&self, nsid: u32) -> u32 {
        *self.masks.get(&nsid).unwrap_or(&self.mask_all)
    }

    /// Sets the mask of `nsid`, or of every namespace for FFFFFFFFh.
    /// Callers pass only NSIDs of the subsystem (bounded).
    pub fn set_mask(&mut self, nsid: u32, mask: u32) {
        if nsid == u32::MAX {
            self.masks.clear();
            self.mask_all = mask;
        } else {
            self.masks.insert(nsid, mask);
        }
    }
}

/// Feature 82h's mask bits: Registration Preempted, Reservation Released,
/// Reservation Preempted (bits 1..3).
pub const MASK_BITS: u32 = 0b1110;

pub(crate) mod persist;
pub(crate) use persist::write_atomic;
use persist::{sync_dir, Saved};

#[cfg(test)]
mod tests;
