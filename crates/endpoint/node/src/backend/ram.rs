//! RAM backend: an anonymous private mapping, so untouched space costs no
//! memory and reads back as zeroes; deallocation returns pages to the kernel.
//!
//! The emulated SSD with a `path` keeps its data in a shared mapping of that
//! file instead ([`RamBackend::shared_file`]): what one process writes the
//! next reads at once, so two targets on one machine can serve one drive (an
//! HA pair's dual-ported drive); deallocation punches holes in the file.

use super::{Backend, BackendQueue, IoReq, Op, Tag};
use std::sync::Arc;
use trellis_nvme::status::generic;
use trellis_nvme::Status;

/// The mapping. Concurrent overlapping reads and writes from different
/// reactors may interleave, exactly as on a real device, where the NVMe spec
/// leaves the result of overlapping in-flight commands undefined; the memory
/// itself stays valid for the mapping's whole life.
struct Region {
    ptr: *mut u8,
    len: usize,
    /// The file behind a shared mapping (None: anonymous memory).
    file: Option<std::fs::File>,
}
// SAFETY: the region is plain memory owned by this value for its whole life
// (unmapped only in Drop); sharing the pointer across threads is sound, and
// the resulting data races between overlapping I/Os are those a device has
// too (see above): they change bytes, never memory safety.
unsafe impl Send for Region {}
// SAFETY: as for Send.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly the mapping made in RamBackend::new,
        // and the last Arc is gone, so no queue can still use it.
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
        // SAFETY: an anonymous mapping at an address the kernel picks
        // touches no existing memory; failure is checked below.
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
                file: None,
            }),
        })
    }

    /// `size_bytes` of the file at `path` (created, or grown, to that size),
    /// mapped shared: other processes mapping it see every write at once.
    pub fn shared_file(path: &str, size_bytes: u64) -> anyhow::Result<RamBackend> {
        use anyhow::Context;
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let len = usize::try_from(size_bytes)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("open {path} for the emulated drive's data"))?;
        if file.metadata()?.len() < size_bytes {
            file.set_len(size_bytes)
                .with_context(|| format!("grow {path} to {size_bytes} bytes"))?;
        }
        // SAFETY: a new shared mapping of an open file at an address the
        // kernel picks touches no existing memory; failure is checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        anyhow::ensure!(
            p != libc::MAP_FAILED,
            "mmap of {len} bytes of {path} failed: {}",
            std::io::Error::last_os_error()
        );
        Ok(RamBackend {
            region: Arc::new(Region {
                ptr: p as *mut u8,
                len,
                file: Some(file),
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
    /// No drive: Gimbal's rate ceiling must not stand for one ([`super::NO_DRIVE_LINK_BYTES_PER_S`]).
    fn device_model(&self) -> Option<trellis_qos::DeviceModel> {
        Some(super::no_drive_model())
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

/// Bytes of Write Zeroes or Deallocate one step of a RAM queue does (on the
/// reactor thread: one madvise(MADV_DONTNEED), whose cost is the pages it
/// frees). 16 MiB of written pages take about a millisecond
/// (`ram::tests::zeroing_one_piece_of_written_ram_is_quick` measures it),
/// so the chunking queue's 4 pieces a loop hold the reactor for a few ms at
/// most; untouched pages cost next to nothing.
pub const RAM_ZERO_CHUNK_BYTES: u64 = 16 << 20;

impl RamQueue {
    /// Zeroes a range: whole pages go back to the kernel (they read as zero),
    /// the unaligned edges are cleared by hand.
    ///
    /// # Safety
    /// `off + len` must not exceed the region's length.
    unsafe fn zero(&self, off: usize, len: usize) {
        /// madvise works on whole pages (4 KiB on every platform we run on).
        const PAGE: usize = 4096;
        // SAFETY (below): first_page and last_page lie within [off, off + len],
        // which the caller guarantees is inside the mapping.
        let base = self.region.ptr;
        let first_page = off.div_ceil(PAGE) * PAGE;
        let end = off + len;
        let last_page = end / PAGE * PAGE;
        if last_page > first_page {
            std::ptr::write_bytes(base.add(off), 0, first_page - off);
            self.free_pages(first_page, last_page - first_page);
            std::ptr::write_bytes(base.add(last_page), 0, end - last_page);
        } else {
            std::ptr::write_bytes(base.add(off), 0, len);
        }
    }
}

impl RamQueue {
    /// Whole pages at `off` read back as zeroes from now on, their memory
    /// given back: dropped from an anonymous mapping, punched out of a file
    /// (cleared by hand where its file system cannot punch holes).
    ///
    /// # Safety
    /// `[off, off + len)` is page-aligned and inside the mapping.
    unsafe fn free_pages(&self, off: usize, len: usize) {
        let base = self.region.ptr;
        let Some(f) = &self.region.file else {
            libc::madvise(base.add(off) as *mut _, len, libc::MADV_DONTNEED);
            return;
        };
        use std::os::fd::AsRawFd;
        let (Ok(o), Ok(l)) = (libc::off_t::try_from(off), libc::off_t::try_from(len)) else {
            std::ptr::write_bytes(base.add(off), 0, len);
            return;
        };
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        if libc::fallocate(f.as_raw_fd(), mode, o, l) != 0 {
            std::ptr::write_bytes(base.add(off), 0, len);
        }
    }
}

impl BackendQueue for RamQueue {
    fn completes_in_submit(&self) -> bool {
        true
    }
    fn zero_chunk_bytes(&self) -> u64 {
        RAM_ZERO_CHUNK_BYTES
    }
    unsafe fn submit(&mut self, req: &IoReq, _tag: Tag) -> Option<Status> {
        crate::sys::fault::io_panic_point();
        let (Ok(off), Ok(len)) = (
            usize::try_from(req.offset_bytes),
            usize::try_from(req.len_bytes),
        ) else {
            return Some(generic::LBA_OUT_OF_RANGE.dnr());
        };
        // The controller checked the LBA range; this guards the memory anyway,
        // with a status rather than a panic.
        if off.checked_add(len).is_none_or(|e| e > self.region.len) {
            tracing::error!(
                "ram I/O at {off}+{len} outside the {} byte region",
                self.region.len
            );
            return Some(generic::LBA_OUT_OF_RANGE.dnr());
        }
        // SAFETY (below): [off, off + len) is inside the mapping (checked
        // above), and by this function's contract req.buf is valid for len
        // bytes; a caller's buffer never lies inside the mapping, so the
        // copies do not overlap.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tag::test_tag;

    /// Measures one step of RAM zeroing at its bound, on written pages (the
    /// expensive case: every page is freed). Bounded loosely (a shared CI
    /// machine), printed for docs/target.md.
    #[test]
    fn zeroing_one_piece_of_written_ram_is_quick() {
        let len = RAM_ZERO_CHUNK_BYTES as usize;
        let b = RamBackend::new(len as u64 + 8192).unwrap();
        let mut q = b.open_queue().unwrap();
        let mut data = vec![0xA5u8; len];
        let io = |op, buf: *mut u8| IoReq {
            op,
            offset_bytes: 4096,
            len_bytes: len as u64,
            buf,
            fua: false,
        };
        let mut best = std::time::Duration::MAX;
        for _ in 0..3 {
            // SAFETY: data is live, len bytes, ours for the call.
            let w = unsafe { q.submit(&io(Op::Write, data.as_mut_ptr()), test_tag(0)) };
            assert_eq!(w, Some(Status::SUCCESS));
            let t = std::time::Instant::now();
            // SAFETY: no buffer.
            let z = unsafe { q.submit(&io(Op::WriteZeroes, std::ptr::null_mut()), test_tag(0)) };
            best = best.min(t.elapsed());
            assert_eq!(z, Some(Status::SUCCESS));
        }
        // SAFETY: as above.
        unsafe { q.submit(&io(Op::Read, data.as_mut_ptr()), test_tag(0)) };
        assert!(data.iter().all(|&x| x == 0), "zeroed");
        eprintln!("zeroing {len} bytes of written RAM: {best:?}");
        assert!(best < std::time::Duration::from_millis(20), "{best:?}");
    }
}
