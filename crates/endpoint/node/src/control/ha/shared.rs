//! The HA pair's shared reservation state: each namespace's registrants and
//! reservation kept where the ownership lease lives, so a drain or a
//! failover keeps them (docs/target.md, "HA pair: reservations").
//!
//! - The owner saves a namespace's state before a reservation command
//!   completes ([`crate::state::resv::Resv::apply_with`]).
//! - The node about to serve loads every namespace's state after its lease
//!   is confirmed and before its ANA state goes optimized (`Ha::confirm`).
//!
//! Only the lease holder may save:
//! - etcd: a transaction that puts the state only while the lease's key
//!   still names this node, so a deposed owner's late write is refused
//!   by the store itself;
//! - file: the shared directory beside the lock file, written only while
//!   the node's fence allows (the same check, and the same guard, as a
//!   data write).

use super::{HaConfig, StoreKind};
use crate::state::fence::Fence;
use crate::state::resv::{NotOwner, SharedResv};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The shared state for `cfg`'s store.
pub fn open(cfg: &HaConfig, fence: Arc<Fence>) -> anyhow::Result<Arc<dyn SharedResv>> {
    Ok(match cfg.store {
        StoreKind::File => Arc::new(FileShared::open(cfg, fence)?),
        StoreKind::Etcd => Arc::new(EtcdShared {
            store: Mutex::new(super::etcd::EtcdStore::connect(cfg)?),
        }),
    })
}

/// A directory beside the lock file (`PATH.resv/`, one file per namespace
/// named by its NGUID): on the same file system as the lock, which the
/// file store already requires both nodes to share.
pub struct FileShared {
    dir: PathBuf,
    fence: Arc<Fence>,
}

impl FileShared {
    pub fn open(cfg: &HaConfig, fence: Arc<Fence>) -> anyhow::Result<FileShared> {
        use std::os::unix::fs::DirBuilderExt;
        let lock = cfg.path.as_ref().ok_or_else(|| {
            anyhow::anyhow!("[ha] store = \"file\" needs path (the lock file both nodes share)")
        })?;
        let mut name = lock.file_name().unwrap_or_default().to_os_string();
        name.push(".resv");
        let dir = lock.with_file_name(name);
        // 0700: the files name hosts and hold their reservation keys.
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                anyhow::bail!("[ha] shared reservation directory {}: {e}", dir.display())
            }
            _ => {}
        }
        Ok(FileShared { dir, fence })
    }

    fn file(&self, name: &str) -> anyhow::Result<PathBuf> {
        anyhow::ensure!(
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_hexdigit()),
            "namespace name {name:?}: want its NGUID in hex"
        );
        Ok(self.dir.join(format!("{name}.json")))
    }
}

impl SharedResv for FileShared {
    fn save(&self, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
        if !self.fence.allows_now() {
            return Err(NotOwner.into());
        }
        crate::state::resv::write_atomic(&self.file(name)?, bytes)?;
        Ok(())
    }

    fn load(&self, name: &str) -> anyhow::Result<Option<Vec<u8>>> {
        let p = self.file(name)?;
        match std::fs::read(&p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(anyhow::anyhow!("{}: {e}", p.display())),
        }
    }
}

/// A key per namespace under the lease's key (`KEY/resv/NGUID`), on a
/// connection of its own (the lease thread's is busy with keepalives).
pub struct EtcdShared {
    store: Mutex<super::etcd::EtcdStore>,
}

impl SharedResv for EtcdShared {
    fn save(&self, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
        match crate::sys::lock(&self.store).put_if_holder(&format!("resv/{name}"), bytes)? {
            true => Ok(()),
            false => Err(NotOwner.into()),
        }
    }

    fn load(&self, name: &str) -> anyhow::Result<Option<Vec<u8>>> {
        crate::sys::lock(&self.store).get_under_key(&format!("resv/{name}"))
    }
}
