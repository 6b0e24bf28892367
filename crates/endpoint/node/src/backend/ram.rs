//! RAM backend: an anonymous private mapping, so untouched space costs no
//! memory and reads back as zeroes; deallocation returns pages to the kernel.

use super::{Backend, BackendQueue, IoReq, Op};
use std::sync::Arc;
use trellis_nvme::Status;

/// The mapping. Concurrent overlapping reads and writes from different
/// reactors may interleave, exactly as on a real device, where the NVMe spec
/// leaves the result of overlapping in-flight commands undefined; the memory
/// itself stays valid for the mapping's whole life.
struct Region {
    ptr: *mut u8,
    len: usize,
}
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr as *mut _, self.len) };
    }
}

pub struct RamBackend {
    region: Arc<Region>,
}

impl RamBackend {
    pub fn new(size_bytes: u64) -> anyhow::Result<RamBackend> {
        let len = usize::try_from(size_bytes)?;
        // MAP_NORESERVE: a 1 GiB default namespace costs nothing until written.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        anyhow::ensure!(
            p != libc::MAP_FAILED,
            "mmap of {len} bytes failed: {}",
            std::io::Error::last_os_error()
        );
        Ok(RamBackend {
            region: Arc::new(Region {
                ptr: p as *mut u8,
                len,
            }),
        })
    }
}

impl Backend for RamBackend {
    fn size_bytes(&self) -> u64 {
        self.region.len as u64
    }
    fn synchronous(&self) -> bool {
        true
    }
    fn open_queue(&self) -> anyhow::Result<Box<dyn BackendQueue>> {
        Ok(Box::new(RamQueue {
            region: self.region.clone(),
        }))
    }
    fn describe(&self) -> String {
        format!("ram {} bytes", self.region.len)
    }
}

struct RamQueue {
    region: Arc<Region>,
}

impl RamQueue {
    /// Zeroes a range: whole pages go back to the kernel (they read as zero),
    /// the unaligned edges are cleared by hand.
    unsafe fn zero(&self, off: usize, len: usize) {
        const PAGE: usize = 4096;
        let base = self.region.ptr;
        let first_page = off.div_ceil(PAGE) * PAGE;
        let end = off + len;
        let last_page = end / PAGE * PAGE;
        if last_page > first_page {
            std::ptr::write_bytes(base.add(off), 0, first_page - off);
            libc::madvise(
                base.add(first_page) as *mut _,
                last_page - first_page,
                libc::MADV_DONTNEED,
            );
            std::ptr::write_bytes(base.add(last_page), 0, end - last_page);
        } else {
            std::ptr::write_bytes(base.add(off), 0, len);
        }
    }
}

impl BackendQueue for RamQueue {
    unsafe fn submit(&mut self, req: &IoReq, _tag: u64) -> Option<Status> {
        let off = req.offset_bytes as usize;
        let len = req.len_bytes as usize;
        // The controller checked the LBA range; this guards the memory anyway.
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.region.len),
            "ram I/O out of range"
        );
        let p = self.region.ptr.add(off);
        match req.op {
            Op::Read => std::ptr::copy_nonoverlapping(p, req.buf, len),
            Op::Write => std::ptr::copy_nonoverlapping(req.buf, p, len),
            Op::Flush => {}
            Op::WriteZeroes | Op::Discard => self.zero(off, len),
        }
        Some(Status::SUCCESS)
    }
}
