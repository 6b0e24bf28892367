//! The embedded store: the lease is an exclusive `flock` on a file, which
//! the kernel drops when the holder's process dies (kill -9 included), so it
//! needs no TTL and no daemon. It serves nodes on one machine (a single
//! node, tests); `flock` over a network file system is not to be trusted,
//! use etcd for nodes on two machines.
//!
//! A lock on a file is a lock on its inode, not its name: if the file is
//! deleted or replaced (a tmp cleaner, an operator), a second node would
//! lock a new inode while the first still holds the old one, and both would
//! own the lease. So the store remembers the inode it opened at start and
//! never creates the file after that: a node acquires only that inode, and
//! a holder that finds the path no longer names its inode reports the lease
//! lost at its next renew (within `keepalive_ms`), and fences.

use super::{HaConfig, LeaseStore};
use crate::state::identity::try_flock;
use anyhow::Context;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::PathBuf;
use std::time::Duration;

/// How often a waiting standby tries the lock (the file cannot be watched
/// for an unlock): the most this store adds to a failover.
pub const POLL: Duration = Duration::from_millis(100);

pub struct FileStore {
    path: PathBuf,
    node: String,
    /// The lock file's (device, inode) when the store opened it at start.
    inode: (u64, u64),
    /// Open and locked while we hold the lease.
    held: Option<File>,
    /// The file of a lease found lost, kept open until the next store call:
    /// the lease thread steps down before it makes one, and while the old
    /// inode is open no new file at the path can reuse its number.
    stale: Option<File>,
}

impl FileStore {
    pub fn open(cfg: &HaConfig) -> anyhow::Result<FileStore> {
        let path = cfg
            .path
            .clone()
            .context("[ha] path: no lock file (set [ha] path)")?;
        // Created (if missing) only now, so a bad path fails the start,
        // and the inode both nodes lock is the one that was there at start.
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("[ha] path {}: cannot open the lock file", path.display()))?;
        let inode = file_id(&f.metadata()?);
        Ok(FileStore {
            path,
            node: cfg.node.clone(),
            inode,
            held: None,
            stale: None,
        })
    }

    /// Opens the lock file at the path, refusing one that is not the inode
    /// of the start (deleted, or deleted and created again).
    fn open_same(&self) -> anyhow::Result<File> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .with_context(|| {
                format!(
                    "[ha] path {}: the lock file is gone: the lease cannot be taken until both nodes restart with it in place",
                    self.path.display()
                )
            })?;
        anyhow::ensure!(
            file_id(&f.metadata()?) == self.inode,
            "[ha] path {}: the lock file was replaced since start: the lease cannot be trusted until both nodes restart with one file",
            self.path.display()
        );
        Ok(f)
    }

    /// Whether the path still names the inode `f` has open.
    fn still_at_path(&self, f: &File) -> bool {
        let at_path = std::fs::metadata(&self.path).map(|m| file_id(&m));
        matches!((at_path, f.metadata()), (Ok(p), Ok(m)) if p == file_id(&m))
    }
}

fn file_id(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

impl LeaseStore for FileStore {
    fn try_acquire(&mut self) -> anyhow::Result<bool> {
        if self.held.is_some() {
            return Ok(true);
        }
        self.stale = None; // stepped down since it was found lost
        let mut f = self.open_same()?;
        if !try_flock(&f, libc::LOCK_EX)? {
            return Ok(false);
        }
        if !self.still_at_path(&f) {
            return Ok(false); // replaced between the open and the lock
        }
        // The holder's name, for the other node's `ha_get`.
        f.set_len(0)?;
        f.rewind()?;
        f.write_all(self.node.as_bytes())?;
        self.held = Some(f);
        Ok(true)
    }

    fn renew(&mut self) -> anyhow::Result<bool> {
        // The kernel keeps the lock for as long as we keep the file open,
        // but it is worth something only while the path names that file.
        let Some(f) = &self.held else {
            return Ok(false);
        };
        if self.still_at_path(f) {
            return Ok(true);
        }
        tracing::error!(
            path = %self.path.display(),
            "ha: the lock file was deleted or replaced while we held it: lease lost"
        );
        self.stale = self.held.take();
        Ok(false)
    }

    fn release(&mut self) -> anyhow::Result<()> {
        if let Some(f) = self.held.take() {
            f.set_len(0)?;
        } // closing the file drops the lock
        Ok(())
    }

    fn holder(&mut self) -> anyhow::Result<Option<String>> {
        if self.held.is_some() {
            return Ok(Some(self.node.clone()));
        }
        self.stale = None;
        let mut f = self.open_same()?;
        // A shared lock we can take means no exclusive holder.
        if try_flock(&f, libc::LOCK_SH)? {
            return Ok(None);
        }
        let mut name = String::new();
        f.read_to_string(&mut name)?;
        Ok(Some(if name.is_empty() { "?".into() } else { name }))
    }

    fn wait_change(&mut self, max: Duration) -> anyhow::Result<()> {
        std::thread::sleep(max.min(POLL));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_release_hands_over() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = |n: &str| HaConfig {
            node: n.into(),
            path: Some(dir.path().join("ha.lock")),
            ..HaConfig::default()
        };
        let (mut a, mut b) = (
            FileStore::open(&cfg("a")).unwrap(),
            FileStore::open(&cfg("b")).unwrap(),
        );
        assert_eq!(b.holder().unwrap(), None);
        assert!(a.try_acquire().unwrap());
        assert!(!b.try_acquire().unwrap());
        assert_eq!(b.holder().unwrap().as_deref(), Some("a"));
        assert!(a.renew().unwrap());
        a.release().unwrap();
        assert!(!a.renew().unwrap());
        assert!(b.try_acquire().unwrap());
        assert_eq!(a.holder().unwrap().as_deref(), Some("b"));
    }

    /// Issue 37: deleting the lock file (or deleting and creating it
    /// again) let the standby lock a new inode while the owner held the
    /// old one: two owners. Now the holder loses the lease at its next
    /// renew, and nobody acquires a file that is not the one of the start.
    #[test]
    fn deleting_or_replacing_the_lock_file_never_yields_two_owners() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ha.lock");
        let cfg = |n: &str| HaConfig {
            node: n.into(),
            path: Some(path.clone()),
            ..HaConfig::default()
        };
        let (mut a, mut b) = (
            FileStore::open(&cfg("a")).unwrap(),
            FileStore::open(&cfg("b")).unwrap(),
        );
        assert!(a.try_acquire().unwrap());
        std::fs::remove_file(&path).unwrap();
        assert!(b.try_acquire().is_err(), "b acquired a deleted lock file");
        assert!(!path.exists(), "acquiring must not create the file again");
        assert!(!a.renew().unwrap(), "a kept the lease on a deleted file");
        std::fs::write(&path, b"").unwrap(); // an operator puts one back
        let e = b.try_acquire().unwrap_err().to_string();
        assert!(e.contains("replaced since start"), "{e}");
        assert!(a.try_acquire().is_err(), "a acquired a replaced file");
        // Restarted together with the new file, they share it again.
        let (mut a, mut b) = (
            FileStore::open(&cfg("a")).unwrap(),
            FileStore::open(&cfg("b")).unwrap(),
        );
        assert!(a.try_acquire().unwrap());
        assert!(!b.try_acquire().unwrap());
    }
}
