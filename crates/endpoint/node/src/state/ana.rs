//! Asymmetric Namespace Access state (NVM Express Base Specification 2.0,
//! §8.1.1): one ANA group per namespace by default (ANAGRPID = NSID, or the
//! namespace's `ana_group`), and a state per (listener, group).
//!
//! Group identifiers are node-wide, as Linux nvmet's ANA groups are per
//! port and span subsystems: namespaces of two subsystems with the same
//! ANAGRPID change state together. The I/O path reads one relaxed atomic
//! byte per command ([`AnaTable::state`]); the control path (config at
//! start, `trellis ctl ana set`) writes them.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Mutex;
use trellis_nvme::ana::{AnaGroup, AnaLog, AnaState};

/// ANA groups the node can hold (NANAGRPID), and the largest ANAGRPID a
/// namespace added while running may use (ANAGRPMAX, unless the config
/// names a larger one): as Linux nvmet, the host sizes its ANA log buffer
/// from these once, at connect, so they cannot grow later. 1024 matches
/// `subsystem::MAX_NSID`, so the default group (the NSID) always fits.
pub const MAX_ANA_GROUPS: usize = 1024;

/// ANA Transition Time advertised in Identify Controller (ANATT), seconds:
/// how long a host waits in ANA Change before it gives up on the path. We
/// never stay in Change on our own (only `ana set ... change` puts a group
/// there), so this is the Linux nvmet value.
pub const ANATT_S: u8 = 10;

/// ANACAP: every state may be reported (1Fh, as Linux nvmet). Bit 6 (the
/// ANAGRPID never changes while attached) would be true, but nvme-cli's
/// `ana-log` then sizes its buffer without the NSID lists (seen in the VM
/// test: NSID 0 printed), so it stays clear, as in nvmet.
pub const ANACAP: u8 = trellis_nvme::ana::id::ANACAP_ALL_STATES;

/// The state of every (listener, group) pair, and the change count.
pub struct AnaTable {
    /// Distinct ANAGRPIDs; a group's index is its position (the config's
    /// groups ascending, then groups added while running, in order). Only
    /// the control path locks it; the I/O path uses indexes.
    groups: Mutex<Vec<u32>>,
    /// Group slots per listener (fixed: the I/O path indexes without a lock).
    cap: usize,
    /// The largest ANAGRPID reported (ANAGRPMAX).
    grpmax: u32,
    /// `states[listener * cap + group]`: an `AnaState` as u8.
    states: Vec<AtomicU8>,
    /// Incremented on every change (the log's change count; 0 is never
    /// reported, as the spec reserves it for "no change count").
    chgcnt: AtomicU64,
}

impl AnaTable {
    /// `groups`: the ANAGRPIDs in use (any order, duplicates allowed);
    /// `initial`: each listener's starting state, in listener order.
    pub fn new(groups: impl IntoIterator<Item = u32>, initial: &[AnaState]) -> AnaTable {
        let mut g: Vec<u32> = groups.into_iter().collect();
        g.sort_unstable();
        g.dedup();
        let cap = g.len().max(MAX_ANA_GROUPS);
        // Every slot starts in its listener's initial state, so a group
        // added later needs no initialisation the I/O path could race.
        // One `extend` per listener: a flat_map over (listeners + the 64
        // live-listener slots) × 1,024 groups, element by element, was most
        // of the registry's construction (~400 K instructions), which the
        // fuzz harness pays per input.
        let mut states = Vec::with_capacity(initial.len() * cap);
        for &s in initial {
            states.extend(std::iter::repeat_with(|| AtomicU8::new(s as u8)).take(cap));
        }
        AnaTable {
            grpmax: g.last().copied().unwrap_or(0).max(MAX_ANA_GROUPS as u32),
            groups: Mutex::new(g),
            cap,
            states,
            chgcnt: AtomicU64::new(1),
        }
    }

    /// The dense index of ANAGRPID `grpid`.
    pub fn index_of(&self, grpid: u32) -> Option<usize> {
        crate::sys::lock(&self.groups)
            .iter()
            .position(|&g| g == grpid)
    }

    /// The index of `grpid`, adding the group if it is new; None when
    /// every slot is taken or `grpid` is 0 or above ANAGRPMAX.
    pub fn add_group(&self, grpid: u32) -> Option<usize> {
        if grpid == 0 || grpid > self.grpmax {
            return None;
        }
        let mut g = crate::sys::lock(&self.groups);
        if let Some(i) = g.iter().position(|&x| x == grpid) {
            return Some(i);
        }
        (g.len() < self.cap).then(|| {
            g.push(grpid);
            g.len() - 1
        })
    }

    /// Starts listener `to` (one added live) in the states listener `from`
    /// reports for every group slot, or in `st` for every slot when `from`
    /// is None. False if `to` has no slots.
    pub fn copy_listener(&self, from: Option<u16>, to: u16, st: AnaState) -> bool {
        if self.slot(to, 0).is_none() {
            return false;
        }
        for g in 0..self.cap {
            let v = from
                .and_then(|f| self.slot(f, g))
                .map_or(st as u8, |a| a.load(Relaxed));
            if let Some(a) = self.slot(to, g) {
                a.store(v, Relaxed);
            }
        }
        true
    }

    /// Every ANAGRPID in use, by index.
    pub fn groups(&self) -> Vec<u32> {
        crate::sys::lock(&self.groups).clone()
    }

    /// NANAGRPID and ANAGRPMAX as Identify Controller reports them.
    pub fn limits(&self) -> (u32, u32) {
        (self.cap as u32, self.grpmax)
    }

    pub fn listeners(&self) -> usize {
        self.states.len() / self.cap
    }

    /// The state of group index `g` on listener `portid` (1-based, as the
    /// registry numbers listeners). Out of range: Optimized, so a queue
    /// that belongs to no listener (fuzzing, tests) is never refused.
    #[inline]
    pub fn state(&self, portid: u16, g: usize) -> AnaState {
        match self.slot(portid, g) {
            Some(a) => AnaState::from_u8(a.load(Relaxed)).unwrap_or(AnaState::Optimized),
            None => AnaState::Optimized,
        }
    }

    /// The path status an I/O command gets on group index `g` through
    /// listener `portid`; None (the common case, decided on the raw byte)
    /// where I/O is served.
    #[inline]
    pub fn io_status(&self, portid: u16, g: usize) -> Option<trellis_nvme::Status> {
        let v = self.slot(portid, g)?.load(Relaxed);
        if v <= AnaState::NonOptimized as u8 {
            return None;
        }
        AnaState::from_u8(v).and_then(AnaState::io_status)
    }

    #[inline]
    fn slot(&self, portid: u16, g: usize) -> Option<&AtomicU8> {
        let l = (portid as usize).checked_sub(1)?;
        if g >= self.cap {
            return None;
        }
        // l < 65536 and g < cap: no overflow.
        self.states.get(l * self.cap + g)
    }

    /// Sets group index `g` on listener `portid`; true if it changed.
    pub fn set(&self, portid: u16, g: usize, st: AnaState) -> bool {
        let Some(a) = self.slot(portid, g) else {
            return false;
        };
        let changed = a.swap(st as u8, Relaxed) != st as u8;
        if changed {
            self.chgcnt.fetch_add(1, Relaxed);
        }
        changed
    }

    pub fn change_count(&self) -> u64 {
        self.chgcnt.load(Relaxed)
    }

    /// The ANA log as listener `portid` reports it for `groups` (a
    /// subsystem's (ANAGRPID, NSIDs), ascending by ANAGRPID).
    pub fn log(&self, portid: u16, groups: &[(u32, Vec<u32>)]) -> AnaLog {
        let chgcnt = self.change_count();
        let groups = groups
            .iter()
            .map(|(grpid, nsids)| AnaGroup {
                grpid: *grpid,
                chgcnt,
                state: self
                    .index_of(*grpid)
                    .map_or(AnaState::Optimized, |g| self.state(portid, g)),
                nsids: nsids.clone(),
            })
            .collect();
        AnaLog { chgcnt, groups }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_per_listener_and_group() {
        let t = AnaTable::new([5, 1, 5], &[AnaState::Optimized, AnaState::NonOptimized]);
        assert_eq!(t.groups(), vec![1, 5]);
        assert_eq!(t.listeners(), 2);
        let g5 = t.index_of(5).unwrap();
        assert_eq!(t.state(2, g5), AnaState::NonOptimized);
        let c = t.change_count();
        assert!(t.set(1, g5, AnaState::Inaccessible));
        assert!(!t.set(1, g5, AnaState::Inaccessible), "no change, no count");
        assert_eq!(t.change_count(), c + 1);
        assert_eq!(t.state(1, g5), AnaState::Inaccessible);
        assert_eq!(t.state(1, 0), AnaState::Optimized);
        assert_eq!(t.state(2, g5), AnaState::NonOptimized);
        assert_eq!(t.io_status(2, g5), None);
        let st = t.io_status(1, g5).unwrap();
        assert_eq!((st.sct(), st.sc()), (3, 0x02));
        assert_eq!(t.io_status(0, 0), None);
        // Outside the table: served, never a panic.
        assert_eq!(t.state(0, 0), AnaState::Optimized);
        assert_eq!(t.state(9, 1), AnaState::Optimized);
        assert!(!t.set(0, 0, AnaState::Change));
        // A group added while running starts in its listener's state.
        assert_eq!(t.add_group(7), Some(2));
        assert_eq!(t.add_group(5), Some(g5));
        assert_eq!(t.state(2, 2), AnaState::NonOptimized);
        assert_eq!(t.add_group(0), None);
        assert_eq!(t.add_group(MAX_ANA_GROUPS as u32 + 1), None);
        let log = t.log(1, &[(1, vec![1]), (5, vec![2, 3])]);
        assert_eq!(log.groups[1].state, AnaState::Inaccessible);
        assert_eq!(log.groups[1].nsids, vec![2, 3]);
    }
}
