//! Node identity: a random UUID generated once per node and kept in a
//! `node-id` file in the state directory. Default serial numbers and
//! namespace identifiers (NGUID, EUI-64, UUID) derive from it, so two nodes
//! on the same configuration never present the same disk: Linux native
//! multipath merges namespaces with equal identifiers into one device.
//!
//! The file is held under an exclusive `flock` while the target runs. A
//! second process with the same state directory takes `node-id.1` (then
//! `.2`, ...), so two targets on one machine differ too, and a restarted
//! process finds its own file again.

use crate::config::{NamespaceConfig, SubsystemConfig};
use crate::sys::{hex, parse_hex_id};
use anyhow::{anyhow, bail, Context};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use uuid::Uuid;

/// Name of the identity file in the state directory.
pub const NODE_ID_FILE: &str = "node-id";
/// Processes sharing one state directory take `node-id`, `node-id.1`, ...
/// up to this many files.
pub const MAX_NODE_ID_FILES: usize = 64;

/// This node's identity, locked for as long as the value lives.
pub struct NodeId {
    id: Uuid,
    path: PathBuf,
    /// Holds the `flock`: closing the file releases it (None: in memory).
    _lock: Option<File>,
}

impl NodeId {
    /// Takes the first `node-id[.N]` file in `dir` that no running process
    /// holds, creating the directory and the file (with a new random
    /// identity) when missing.
    pub fn acquire(dir: &Path) -> anyhow::Result<NodeId> {
        std::fs::create_dir_all(dir).map_err(|e| {
            anyhow!(
                "cannot create state directory {}: {e} (set [target] state_dir or --state-dir to a writable directory)",
                dir.display()
            )
        })?;
        for i in 0..MAX_NODE_ID_FILES {
            let path = match i {
                0 => dir.join(NODE_ID_FILE),
                _ => dir.join(format!("{NODE_ID_FILE}.{i}")),
            };
            let mut f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .open(&path)
                .with_context(|| format!("cannot open node identity file {}", path.display()))?;
            if !try_lock(&f).with_context(|| format!("cannot lock {}", path.display()))? {
                continue; // another running target owns this identity
            }
            let id = read_or_create(&mut f, &path)?;
            return Ok(NodeId {
                id,
                path,
                _lock: Some(f),
            });
        }
        bail!(
            "all {MAX_NODE_ID_FILES} node identity files in {} are held by running targets (give this one its own --state-dir)",
            dir.display()
        )
    }

    /// The identity a target started now would take, without creating,
    /// writing or keeping anything (for `--check`): the first existing
    /// `node-id[.N]` file no running process holds. `None`: a start would
    /// create a new identity.
    pub fn peek(dir: &Path) -> anyhow::Result<Option<NodeId>> {
        for i in 0..MAX_NODE_ID_FILES {
            let path = match i {
                0 => dir.join(NODE_ID_FILE),
                _ => dir.join(format!("{NODE_ID_FILE}.{i}")),
            };
            let Ok(f) = File::open(&path) else {
                return Ok(None); // the first missing file is the one a start creates
            };
            if !try_lock(&f).with_context(|| format!("cannot lock {}", path.display()))? {
                continue;
            }
            let mut text = String::new();
            (&f).read_to_string(&mut text)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let Ok(id) = Uuid::parse_str(text.trim()) else {
                return Ok(None); // empty (a start writes one) or invalid (a start says so)
            };
            // Dropping `f` releases the lock: --check holds nothing.
            return Ok(Some(NodeId {
                id,
                path,
                _lock: None,
            }));
        }
        Ok(None)
    }

    /// An identity kept nowhere, for the fuzz targets and random-input
    /// tests (which build a registry per input and must not touch files).
    /// Two registries built with the same `id` present the same disks.
    pub fn in_memory(id: Uuid) -> NodeId {
        NodeId {
            id,
            path: PathBuf::from("(in memory)"),
            _lock: None,
        }
    }

    pub fn uuid(&self) -> Uuid {
        self.id
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A file named `name` next to the identity file, where this node keeps
    /// its other state (reservations); None for an identity kept nowhere.
    pub fn state_file(&self, name: &str) -> Option<PathBuf> {
        self._lock.as_ref()?;
        Some(self.path.with_file_name(name))
    }

    /// A name-based (v5) UUID under this node's identity.
    fn derive(&self, kind: &str, nqn: &str, nsid: u32) -> [u8; 16] {
        let name = format!("{kind}\0{nqn}\0{nsid}");
        *Uuid::new_v5(&self.id, name.as_bytes()).as_bytes()
    }

    /// The subsystem's serial: `serial` from the config, else 16 hex digits
    /// derived from (node, subsystem NQN), as long as nvmet's.
    pub fn serial(&self, s: &SubsystemConfig) -> String {
        if !s.serial.is_empty() {
            return s.serial.clone();
        }
        hex(&self.derive("serial", &s.nqn, 0)[..8]).to_ascii_uppercase()
    }

    /// A namespace's identifiers: the configured ones, else derived from
    /// (node, subsystem NQN, NSID). Config values were checked by
    /// `Config::validate`.
    pub fn namespace_ids(&self, nqn: &str, nsid: u32, n: &NamespaceConfig) -> NamespaceIds {
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&self.derive("eui64", nqn, nsid)[..8]);
        // A locally administered, unicast EUI-64 (IEEE 802 U/L and I/G bits):
        // we own no OUI, and so collide with no vendor's assignments.
        eui64[0] = (eui64[0] & 0xfc) | 0x02;
        let explicit =
            |v: &Option<String>, len| v.as_deref().and_then(|t| parse_hex_id(t, len).ok());
        let mut ids = NamespaceIds {
            nguid: self.derive("nguid", nqn, nsid),
            eui64,
            uuid: self.derive("uuid", nqn, nsid),
        };
        if let Some(v) = explicit(&n.nguid, 16) {
            ids.nguid.copy_from_slice(&v);
        }
        if let Some(v) = explicit(&n.eui64, 8) {
            ids.eui64.copy_from_slice(&v);
        }
        if let Some(u) = n.uuid.as_deref().and_then(|t| Uuid::parse_str(t).ok()) {
            ids.uuid = *u.as_bytes();
        }
        ids
    }
}

/// The three namespace identifiers hosts compare (NVMe Base 2.0, Unique Identifier).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NamespaceIds {
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    pub uuid: [u8; 16],
}

impl std::fmt::Display for NamespaceIds {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "uuid {}, nguid {}, eui64 {}",
            Uuid::from_bytes(self.uuid),
            hex(&self.nguid),
            hex(&self.eui64)
        )
    }
}

/// An exclusive, non-blocking `flock`: Ok(false) if another open file
/// description holds it (another process, or another target in this one).
fn try_lock(f: &File) -> std::io::Result<bool> {
    try_flock(f, libc::LOCK_EX)
}

/// A non-blocking `flock` with `op` (`LOCK_EX` or `LOCK_SH`): Ok(false) if
/// another open file description holds it. Also the HA file store's lease.
pub(crate) fn try_flock(f: &File, op: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: flock takes a descriptor number and flags; `f` keeps the
    // descriptor open for the duration of the call.
    let r = unsafe { libc::flock(f.as_raw_fd(), op | libc::LOCK_NB) };
    if r == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Reads the UUID in a locked identity file, or writes a new random one
/// into an empty file (new, or left empty by a crash before the write).
fn read_or_create(f: &mut File, path: &Path) -> anyhow::Result<Uuid> {
    let mut text = String::new();
    f.read_to_string(&mut text)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let t = text.trim();
    if !t.is_empty() {
        return Uuid::parse_str(t).map_err(|_| {
            anyhow!(
                "node identity file {} holds {t:?}, not a UUID (restore it, or delete it to make a new identity: hosts then see new namespace IDs)",
                path.display()
            )
        });
    }
    let id = Uuid::new_v4();
    f.set_len(0)?;
    f.rewind()?;
    writeln!(f, "{id}")?;
    f.sync_all()
        .with_context(|| format!("cannot write {}", path.display()))?;
    // Make the new directory entry durable too, or a crash could lose it.
    if let Some(dir) = path.parent() {
        File::open(dir).and_then(|d| d.sync_all()).ok();
    }
    tracing::info!("new node identity {id} in {}", path.display());
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_ids_parse_with_separators_and_refuse_bad_lengths_and_zero() {
        assert_eq!(parse_hex_id("00:11:22:33:44:55:66:77", 8).unwrap()[7], 0x77);
        assert_eq!(parse_hex_id("0011223344556677", 8).unwrap()[0], 0x00);
        assert!(parse_hex_id("0011", 8).is_err());
        assert!(parse_hex_id("zz11223344556677", 8).is_err());
        assert!(parse_hex_id("0000000000000000", 8).is_err());
    }

    #[test]
    fn identity_file_is_kept_reused_and_locked() {
        let dir = tempfile::tempdir().unwrap();
        let a = NodeId::acquire(dir.path()).unwrap();
        let b = NodeId::acquire(dir.path()).unwrap();
        assert_ne!(a.uuid(), b.uuid(), "a held identity is not shared");
        assert_eq!(b.path(), dir.path().join("node-id.1"));
        let (ida, idb) = (a.uuid(), b.uuid());
        drop(b);
        let b2 = NodeId::acquire(dir.path()).unwrap();
        assert_eq!(b2.uuid(), idb, "a restarted target gets its identity back");
        drop((a, b2));
        assert_eq!(NodeId::acquire(dir.path()).unwrap().uuid(), ida);
    }

    #[test]
    fn a_corrupt_identity_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(NODE_ID_FILE), "garbage\n").unwrap();
        let e = NodeId::acquire(dir.path()).err().unwrap().to_string();
        assert!(e.contains("node-id") && e.contains("garbage"), "{e}");
    }
}
