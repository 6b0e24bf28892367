//! The persistence file of a namespace's reservations (JSON, host IDs and
//! NQN digests in hex; version 1 files still load), written atomically
//! while Persist Through Power Loss is set.

use super::*;

/// The persistence file's contents (JSON; host IDs in hex).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Saved {
    version: u32,
    gen: u32,
    /// 0: no reservation.
    rtype: u8,
    holder: String,
    /// Version 2: hex of the holder's NQN digest ([`HostId`]).
    #[serde(default)]
    holder_nqn: String,
    registrants: Vec<SavedReg>,
    /// The Persist Through Power Loss state, written in the HA pair's
    /// shared copy (saved whatever PTPL says). Absent in a local file,
    /// which exists only while PTPL is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ptpl: Option<bool>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SavedReg {
    hostid: String,
    /// Version 2: hex of the host's NQN digest ([`HostId`]).
    #[serde(default)]
    nqn: String,
    rkey: u64,
}

/// 2: hosts bound to their NQN digest. Version 1 files (Host IDs only)
/// still load, their hosts bound by Host ID alone ([`NQN_UNKNOWN`]).
pub(super) const SAVED_VERSION: u32 = 2;

pub(super) fn saved_host(id: &str, nqn: &str, version: u32) -> anyhow::Result<HostId> {
    let nqn = match version {
        1 => NQN_UNKNOWN,
        _ => hostid_of(nqn)?,
    };
    Ok(HostId {
        id: hostid_of(id)?,
        nqn,
    })
}

pub(super) fn hostid_of(s: &str) -> anyhow::Result<[u8; 16]> {
    let bad = || anyhow::anyhow!("host ID {s:?}: want 32 hex digits");
    if s.len() != 32 || !s.is_ascii() {
        return Err(bad());
    }
    let mut h = [0u8; 16];
    for (i, b) in h.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[i * 2..i * 2 + 2], 16).map_err(|_| bad())?;
    }
    Ok(h)
}

impl State {
    pub(super) fn to_saved(&self) -> Saved {
        let hex = crate::sys::hex;
        Saved {
            version: SAVED_VERSION,
            gen: self.gen,
            rtype: self.held.map_or(0, |r| r.rtype as u8),
            holder: self.held.map_or(String::new(), |r| hex(&r.holder.id)),
            holder_nqn: self.held.map_or(String::new(), |r| hex(&r.holder.nqn)),
            registrants: self
                .regs
                .iter()
                .map(|r| SavedReg {
                    hostid: hex(&r.hostid.id),
                    nqn: hex(&r.hostid.nqn),
                    rkey: r.rkey,
                })
                .collect(),
            ptpl: None,
        }
    }

    /// The HA pair's shared copy: the local file's contents and the PTPL state.
    pub(super) fn to_shared(&self) -> Saved {
        Saved {
            ptpl: Some(self.ptpl),
            ..self.to_saved()
        }
    }

    pub(super) fn from_saved(s: Saved, max: usize) -> anyhow::Result<State> {
        anyhow::ensure!(
            (1..=SAVED_VERSION).contains(&s.version),
            "version {} (want 1..={SAVED_VERSION})",
            s.version
        );
        anyhow::ensure!(
            s.registrants.len() <= max,
            "{} registrants, more than target.max_registrants = {max}",
            s.registrants.len()
        );
        let mut regs = Vec::with_capacity(s.registrants.len());
        for r in &s.registrants {
            regs.push(Registrant {
                hostid: saved_host(&r.hostid, &r.nqn, s.version)?,
                rkey: r.rkey,
            });
        }
        let held = match s.rtype {
            0 => None,
            t => Some(Held {
                rtype: RType::from_u8(t).ok_or_else(|| anyhow::anyhow!("reservation type {t}"))?,
                holder: saved_host(&s.holder, &s.holder_nqn, s.version)?,
            }),
        };
        let st = State {
            gen: s.gen,
            regs,
            held,
            // A local file exists only while PTPL is set.
            ptpl: s.ptpl.unwrap_or(true),
        };
        // Only states the commands can reach: one entry per host, and a
        // holder that is registered.
        for (i, r) in st.regs.iter().enumerate() {
            anyhow::ensure!(
                st.find(&r.hostid) == Some(i),
                "host {} registered twice",
                crate::sys::hex(&r.hostid.id)
            );
        }
        if let Some(h) = st.held {
            anyhow::ensure!(
                st.is_registered(&h.holder),
                "the reservation's holder is not registered"
            );
        }
        Ok(st)
    }
}

/// Writes `bytes` to `path` so that a crash leaves the old file or the new
/// one, never a torn one: a temp file, fsync, rename, fsync of the directory.
/// Mode 0600: the file names hosts and holds their reservation keys.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    // `mode` applies only to a file created now: a stale tmp keeps its own.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    sync_dir(path)
}

pub(super) fn sync_dir(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(d) => std::fs::File::open(d)?.sync_all(),
        None => Ok(()),
    }
}
