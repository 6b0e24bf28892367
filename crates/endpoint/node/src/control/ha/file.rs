//! The embedded store: the lease is an exclusive `flock` on a file, which
//! the kernel drops when the holder's process dies (kill -9 included), so it
//! needs no TTL and no daemon. It serves nodes on one machine (a single
//! node, tests); `flock` over a network file system is not to be trusted,
//! use etcd for nodes on two machines.

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
    /// Open and locked while we hold the lease.
    held: Option<File>,
}

impl FileStore {
    pub fn open(cfg: &HaConfig) -> anyhow::Result<FileStore> {
        let path = cfg
            .path
            .clone()
            .context("[ha] path: no lock file (set [ha] path)")?;
        // Open once now, so a bad path fails the start, not the campaign.
        open(&path)
            .with_context(|| format!("[ha] path {}: cannot open the lock file", path.display()))?;
        Ok(FileStore {
            path,
            node: cfg.node.clone(),
            held: None,
        })
    }
}

fn open(path: &PathBuf) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

impl LeaseStore for FileStore {
    fn try_acquire(&mut self) -> anyhow::Result<bool> {
        if self.held.is_some() {
            return Ok(true);
        }
        let mut f = open(&self.path)?;
        if !try_flock(&f, libc::LOCK_EX)? {
            return Ok(false);
        }
        // The holder's name, for the other node's `ha_get`.
        f.set_len(0)?;
        f.rewind()?;
        f.write_all(self.node.as_bytes())?;
        self.held = Some(f);
        Ok(true)
    }

    fn renew(&mut self) -> anyhow::Result<bool> {
        // The kernel keeps the lock for as long as we keep the file open.
        Ok(self.held.is_some())
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
        let mut f = open(&self.path)?;
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
}
