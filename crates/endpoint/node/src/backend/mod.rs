//! Storage backends behind one interface: null, ram and file/block device.
//!
//! A [`Backend`] is shared by all reactors; each reactor opens its own
//! [`BackendQueue`] so the data path takes no lock. Synchronous backends (null,
//! ram) complete in `submit`; the file backend submits to a per-reactor
//! io_uring and completes in `reap`, which the reactor calls every loop.

pub mod file;
pub mod null;
pub mod ram;

use trellis_nvme::Status;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    WriteZeroes,
    Discard,
}

/// One backend request. For Read/Write, `buf` points at `len_bytes` bytes that
/// stay valid and untouched until the request completes.
#[derive(Clone, Copy, Debug)]
pub struct IoReq {
    pub op: Op,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub buf: *mut u8,
    /// Force Unit Access: the write is durable before it completes.
    pub fua: bool,
}

pub trait Backend: Send + Sync {
    fn size_bytes(&self) -> u64;
    /// Deallocated or zeroed ranges read back as zeroes (DLFEAT).
    fn deallocate_reads_zeroes(&self) -> bool {
        true
    }
    /// Every read returns zeroes without touching the buffer (null backend):
    /// the connection then sends from a shared zero buffer.
    fn reads_zero(&self) -> bool {
        false
    }
    /// Requests complete inside `submit`: write data may be read straight
    /// from the receive buffer, which stays put only during the call.
    fn synchronous(&self) -> bool {
        false
    }
    /// A per-reactor submission queue.
    fn open_queue(&self) -> anyhow::Result<Box<dyn BackendQueue>>;
    /// Makes every completed write durable (shutdown path).
    fn sync_all(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String;
}

pub trait BackendQueue {
    /// Submits a request tagged `tag`. Returns `Some(status)` when it completed
    /// synchronously, `None` when its completion will come from `reap`.
    ///
    /// # Safety
    /// For Read/Write, `req.buf` must be valid for `req.len_bytes` bytes until
    /// the request completes, and not be accessed by anyone else meanwhile.
    unsafe fn submit(&mut self, req: &IoReq, tag: u64) -> Option<Status>;
    /// Pushes submitted-but-not-started work to the device (batching point).
    fn kick(&mut self) {}
    /// Appends finished asynchronous requests to `out`; returns how many.
    fn reap(&mut self, out: &mut Vec<(u64, Status)>) -> usize {
        let _ = out;
        0
    }
    fn in_flight(&self) -> usize {
        0
    }
}

/// Opens the backend a namespace config names.
pub fn open(cfg: &crate::config::NamespaceConfig) -> anyhow::Result<std::sync::Arc<dyn Backend>> {
    use crate::config::BackendKind;
    Ok(match cfg.backend {
        BackendKind::Null => {
            std::sync::Arc::new(null::NullBackend::new(cfg.size.expect("validated").0))
        }
        BackendKind::Ram => {
            std::sync::Arc::new(ram::RamBackend::new(cfg.size.expect("validated").0)?)
        }
        BackendKind::File => std::sync::Arc::new(file::FileBackend::open(
            cfg.path.as_deref().expect("validated"),
            cfg.size.map(|s| s.0),
            cfg.block_size,
            cfg.read_only,
            cfg.direct,
        )?),
    })
}
