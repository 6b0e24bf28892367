//! File and block-device backend: real I/O through a per-reactor io_uring,
//! with O_DIRECT where the filesystem or device accepts it.
//!
//! Durability: Flush is an fdatasync, FUA writes carry RWF_DSYNC, so a
//! completion for either is sent only once the data is on stable storage.
//! When io_uring is unavailable (seccomp, `kernel.io_uring_disabled`) the
//! queue falls back to synchronous pread/pwrite with the same semantics.

use super::{Backend, BackendQueue, IoReq, Op};
use crate::sys::ring::Ring;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::sync::Arc;
use trellis_nvme::status::{generic, media};
use trellis_nvme::Status;

pub struct FileBackend {
    file: Arc<File>,
    size_bytes: u64,
    path: String,
    direct: bool,
    /// A block device's PCIe link bandwidth, from sysfs; 0 when unknown.
    link_bytes_per_s: u64,
}

/// `BLKGETSIZE64` from <linux/fs.h>: a block device's size in bytes
/// (`_IOR(0x12, 114, size_t)`; libc does not export it).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// Buffer alignment for O_DIRECT: a page satisfies every logical block size.
const DIRECT_ALIGN: usize = 4096;
/// Largest write of zeroes when fallocate is unsupported: big enough to
/// amortise syscalls, small enough not to hold much memory.
const ZERO_CHUNK: usize = 1 << 20;

impl FileBackend {
    pub fn open(
        path: &str,
        create_size: Option<u64>,
        block_size: u32,
        read_only: bool,
        want_direct: bool,
    ) -> anyhow::Result<FileBackend> {
        use anyhow::Context;
        let exists = std::path::Path::new(path).exists();
        if !exists {
            let size = create_size.with_context(|| {
                format!("{path} does not exist and no size was given to create it")
            })?;
            // Host data: the owner's only (never another user's to read).
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating {path}"))?;
            f.set_len(size)?;
        }
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(!read_only);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        let mut direct = want_direct;
        let file = match open(direct) {
            Ok(f) if direct && !direct_io_works(&f, block_size) => {
                direct = false;
                open(false)?
            }
            Ok(f) => f,
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                direct = false;
                open(false)?
            }
            Err(e) => return Err(e).with_context(|| format!("opening {path}")),
        };
        let meta = file.metadata()?;
        let link_bytes_per_s = if meta.file_type().is_block_device() {
            use std::os::unix::fs::MetadataExt;
            block_device_link_bytes_per_s(meta.rdev()).unwrap_or(0)
        } else {
            0
        };
        let size_bytes = if meta.file_type().is_block_device() {
            let mut sz: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which
            // points to a live local u64; the fd is open for the whole call.
            let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut sz) };
            anyhow::ensure!(
                rc == 0,
                "BLKGETSIZE64 on {path}: {}",
                std::io::Error::last_os_error()
            );
            sz
        } else {
            meta.len()
        };
        let size_bytes = size_bytes / block_size as u64 * block_size as u64;
        anyhow::ensure!(size_bytes > 0, "{path} is smaller than one block");
        Ok(FileBackend {
            file: Arc::new(file),
            size_bytes,
            path: path.into(),
            direct,
            link_bytes_per_s,
        })
    }
}

/// The PCIe link bandwidth of the device behind block device `rdev`, from
/// sysfs (`current_link_speed` and `current_link_width` of the PCI function:
/// for NVMe, `/sys/dev/block/M:m/device/device/`; for a partition, its
/// disk's). None when any of it is missing (not PCIe, a VM's virtio disk).
fn block_device_link_bytes_per_s(rdev: u64) -> Option<u64> {
    let (maj, min) = (libc::major(rdev), libc::minor(rdev));
    let dev = std::path::PathBuf::from(format!("/sys/dev/block/{maj}:{min}"));
    for pci in [dev.join("device/device"), dev.join("../device/device")] {
        let read = |f: &str| std::fs::read_to_string(pci.join(f)).ok();
        if let (Some(s), Some(w)) = (read("current_link_speed"), read("current_link_width")) {
            return pcie_link_bytes_per_s(&s, &w);
        }
    }
    None
}

/// Bytes per second a PCIe link carries: transfer rate × lanes × line-code
/// efficiency ÷ 8 (8b/10b below 8 GT/s, 128b/130b for 8–32 GT/s, 242/256
/// FLIT mode at 64 GT/s; PCI Express Base Specification). `speed` as the
/// kernel prints it ("16.0 GT/s PCIe", "8 GT/s"), `width` a lane count.
pub fn pcie_link_bytes_per_s(speed: &str, width: &str) -> Option<u64> {
    let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
    let lanes: u32 = width.trim().parse().ok()?;
    // NaN fails the comparisons, so it is refused too.
    let plausible = gts > 0.0 && gts <= 256.0 && (1..=32).contains(&lanes);
    if !plausible {
        return None;
    }
    let eff = if gts < 8.0 {
        8.0 / 10.0
    } else if gts < 64.0 {
        128.0 / 130.0
    } else {
        242.0 / 256.0
    };
    Some((gts * 1e9 * lanes as f64 * eff / 8.0) as u64)
}

/// O_DIRECT needs offsets and lengths aligned to the device's logical block;
/// probe with one block-sized read at an odd block offset.
fn direct_io_works(f: &File, block_size: u32) -> bool {
    let Ok(layout) = std::alloc::Layout::from_size_align(block_size as usize, DIRECT_ALIGN) else {
        return false;
    };
    // SAFETY: the layout has a non-zero size (block sizes are validated to
    // be at least 512); the pointer is checked for null before use.
    let p = unsafe { std::alloc::alloc(layout) };
    if p.is_null() {
        return false;
    }
    // SAFETY: p points to block_size writable bytes that nothing else
    // references; pread is synchronous, so they are not used after the call.
    let rc = unsafe {
        libc::pread(
            f.as_raw_fd(),
            p as *mut _,
            block_size as usize,
            block_size as i64,
        )
    };
    // SAFETY: p came from alloc with this same layout and is freed once.
    unsafe { std::alloc::dealloc(p, layout) };
    rc >= 0
}

impl Backend for FileBackend {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    /// A regular file is extended (sparse); a block device's size is the
    /// device's.
    fn grow(&self, bytes: u64) -> anyhow::Result<()> {
        use std::os::unix::fs::FileTypeExt;
        let meta = self.file.metadata()?;
        anyhow::ensure!(
            !meta.file_type().is_block_device(),
            "{} is a block device: its size is the device's",
            self.path
        );
        if meta.len() < bytes {
            self.file.set_len(bytes).map_err(|e| {
                anyhow::anyhow!("cannot extend {} to {bytes} bytes: {e}", self.path)
            })?;
        }
        Ok(())
    }
    fn open_queue(&self) -> anyhow::Result<Box<dyn BackendQueue>> {
        match UringQueue::new(self.file.clone()) {
            Ok(q) => Ok(Box::new(q)),
            Err(e) => {
                tracing::warn!(
                    "io_uring unavailable ({e}); {} uses synchronous I/O",
                    self.path
                );
                Ok(Box::new(SyncQueue {
                    file: self.file.clone(),
                }))
            }
        }
    }
    fn sync_all(&self) -> std::io::Result<()> {
        self.file.sync_all()
    }
    /// Only the link is known (sysfs): Gimbal's rate ceiling rises to it;
    /// its per-I/O cost and slot count stay as configured (docs/gimbal.md).
    fn device_model(&self) -> Option<trellis_qos::DeviceModel> {
        (self.link_bytes_per_s > 0).then_some(trellis_qos::DeviceModel {
            read_4k_iops: 0,
            read_bytes_per_s: 0,
            read_128k_saturation_qd: 0,
            link_bytes_per_s: self.link_bytes_per_s,
        })
    }
    fn describe(&self) -> String {
        format!(
            "file {} ({} bytes{})",
            self.path,
            self.size_bytes,
            if self.direct { ", O_DIRECT" } else { "" }
        )
    }
}

/// Write Zeroes and Deallocate are rare and not latency critical: both are
/// done synchronously with fallocate, falling back to writing zeroes.
fn zero_range(file: &File, off: u64, len: u64, punch: bool, fua: bool) -> Status {
    let s = zero_range_inner(file, off, len, punch);
    // SAFETY: fdatasync only takes an fd, which `file` keeps open.
    if s.is_success() && fua && unsafe { libc::fdatasync(file.as_raw_fd()) } != 0 {
        return media::WRITE_FAULT;
    }
    s
}

fn zero_range_inner(file: &File, off: u64, len: u64, punch: bool) -> Status {
    let fd = file.as_raw_fd();
    let mode = if punch {
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
    } else {
        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
    };
    // SAFETY: fallocate takes no pointers; fd stays open for the call.
    if unsafe { libc::fallocate(fd, mode, off as i64, len as i64) } == 0 {
        return Status::SUCCESS;
    }
    // Not supported here (some filesystems, some devices): write zeroes from
    // an aligned buffer (O_DIRECT files need one).
    let Ok(layout) = std::alloc::Layout::from_size_align(ZERO_CHUNK, DIRECT_ALIGN) else {
        return generic::INTERNAL_ERROR;
    };
    // SAFETY: the layout has a non-zero size; null is checked below.
    let buf = unsafe { std::alloc::alloc_zeroed(layout) };
    if buf.is_null() {
        return generic::INTERNAL_ERROR;
    }
    let mut done = 0u64;
    let mut status = Status::SUCCESS;
    while done < len {
        let n = (len - done).min(ZERO_CHUNK as u64) as usize;
        // SAFETY: buf holds ZERO_CHUNK >= n initialised bytes; pwrite only
        // reads them, synchronously.
        let rc = unsafe { libc::pwrite(fd, buf as *const _, n, (off + done) as i64) };
        if rc <= 0 {
            let errno = (rc < 0)
                .then(|| std::io::Error::last_os_error().raw_os_error())
                .flatten();
            status = io_error_status(Op::WriteZeroes, errno);
            break;
        }
        done += rc as u64;
    }
    // SAFETY: buf came from alloc_zeroed with this layout and is freed once.
    unsafe { std::alloc::dealloc(buf, layout) };
    status
}

/// Write Zeroes and Deallocate, done synchronously by both queue kinds;
/// `None` for every other operation.
fn zero_or_discard(file: &File, req: &IoReq) -> Option<Status> {
    match req.op {
        Op::WriteZeroes => Some(zero_range(
            file,
            req.offset_bytes,
            req.len_bytes,
            false,
            req.fua,
        )),
        Op::Discard => Some(zero_range(
            file,
            req.offset_bytes,
            req.len_bytes,
            true,
            req.fua,
        )),
        _ => None,
    }
}

/// The status of a failed `op` that ended with `errno` (None: a short
/// transfer, no error code). A full file system or quota is not a failing
/// medium: Capacity Exceeded with DNR, as nvmet maps -ENOSPC
/// (`errno_to_nvme_status`), so hosts stop retrying and report a full
/// device, not a dying one. Media errors leave DNR clear: a retry may work.
fn io_error_status(op: Op, errno: Option<i32>) -> Status {
    if matches!(errno, Some(libc::ENOSPC | libc::EDQUOT)) && op != Op::Read {
        return generic::CAPACITY_EXCEEDED.dnr();
    }
    match op {
        Op::Read => media::UNRECOVERED_READ_ERROR,
        Op::Write | Op::WriteZeroes => media::WRITE_FAULT,
        Op::Flush | Op::Discard => generic::INTERNAL_ERROR,
    }
}

/// At most one warning per this long about failed backend I/O; the rest are
/// counted and the count goes into the next warning.
const IO_ERROR_WARN_INTERVAL_NS: u64 = 10_000_000_000;

/// Whether to log a failed I/O now, and how many were not logged since the
/// last one: a failing device must not flood the log with a line per I/O.
fn io_error_log_allowed() -> Option<u64> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static LAST_NS: AtomicU64 = AtomicU64::new(0);
    static QUIET: AtomicU64 = AtomicU64::new(0);
    let now = crate::sys::now_ns().max(1);
    let last = LAST_NS.load(Relaxed);
    if last != 0 && now.saturating_sub(last) < IO_ERROR_WARN_INTERVAL_NS {
        QUIET.fetch_add(1, Relaxed);
        return None;
    }
    // One reactor wins the slot; the others count themselves quiet.
    if LAST_NS
        .compare_exchange(last, now, Relaxed, Relaxed)
        .is_err()
    {
        QUIET.fetch_add(1, Relaxed);
        return None;
    }
    Some(QUIET.swap(0, Relaxed))
}

/// Synchronous fallback queue.
struct SyncQueue {
    file: Arc<File>,
}

impl BackendQueue for SyncQueue {
    unsafe fn submit(&mut self, req: &IoReq, _tag: u64) -> Option<Status> {
        crate::sys::fault::io_panic_point();
        let fd = self.file.as_raw_fd();
        let mut done = 0u64;
        let mut errno = None;
        // SAFETY (the calls below): by this function's contract req.buf is
        // valid for len_bytes bytes and ours alone during the call; pread and
        // pwritev2 are synchronous and stay within [buf + done, buf + len).
        let ok = match req.op {
            Op::Read | Op::Write => {
                while done < req.len_bytes {
                    let p = req.buf.add(done as usize);
                    let n = (req.len_bytes - done) as usize;
                    let off = (req.offset_bytes + done) as i64;
                    let rc = if req.op == Op::Read {
                        libc::pread(fd, p as *mut _, n, off)
                    } else {
                        let iov = libc::iovec {
                            iov_base: p as *mut _,
                            iov_len: n,
                        };
                        libc::pwritev2(fd, &iov, 1, off, if req.fua { libc::RWF_DSYNC } else { 0 })
                    };
                    if rc <= 0 {
                        errno = (rc < 0)
                            .then(|| std::io::Error::last_os_error().raw_os_error())
                            .flatten();
                        break;
                    }
                    done += rc as u64;
                }
                done == req.len_bytes
            }
            Op::Flush => {
                let ok = libc::fdatasync(fd) == 0;
                if !ok {
                    errno = std::io::Error::last_os_error().raw_os_error();
                }
                ok
            }
            Op::WriteZeroes | Op::Discard => return zero_or_discard(&self.file, req),
        };
        Some(if ok {
            Status::SUCCESS
        } else {
            io_error_status(req.op, errno)
        })
    }
}

/// Submission queue entries of one backend ring (one per reactor and file
/// namespace).
const RING_ENTRIES: u32 = 256;
/// Requests a queue holds at once: twice the ring, because a request keeps
/// its slot from submit to reap while the ring holds it only until the
/// kernel consumes it.
const SLOTS_PER_RING_ENTRY: usize = 2;
/// User data: the low 32 bits are a slot index; these bits mark our own
/// auxiliary operations so their completions are not taken for requests.
const CANCEL_BIT: u64 = 1 << 62;
const DELAY_BIT: u64 = 1 << 61;
const SLOT_MASK: u64 = u32::MAX as u64;

/// One in-flight io_uring request; partial transfers are resubmitted.
#[derive(Clone, Copy)]
struct Pending {
    tag: u64,
    req: IoReq,
    done_bytes: u64,
    /// The ring generation the request's current operation went to.
    gen: u32,
    /// Fault injection: how long a hard-linked timeout holds the read back.
    /// Read by the kernel when the timeout is submitted, so it lives here.
    delay: io_uring::types::Timespec,
}

/// Requests go to a per-reactor io_uring. When a submit fails for good the
/// ring is retired (see [`crate::sys::ring`]): requests it never consumed fail
/// with [`super::SUBMIT_FAILED`], its running requests are still reaped, and
/// the next request opens a new ring.
struct UringQueue {
    file: Arc<File>,
    ring: Option<Ring>,
    gen: u32,
    retired: Vec<(u32, Ring)>,
    slots: Vec<Option<Pending>>,
    free: Vec<u32>,
    /// Requests failed without the kernel, reported at the next `reap`.
    failed: Vec<(u64, Status)>,
    /// Reused between reaps so the hot path does not allocate.
    scratch: Vec<(u64, i32)>,
}

fn build_ring() -> std::io::Result<Ring> {
    let ring = io_uring::IoUring::builder()
        .setup_single_issuer()
        .build(RING_ENTRIES)?;
    Ok(Ring::new(ring))
}

impl UringQueue {
    fn new(file: Arc<File>) -> std::io::Result<UringQueue> {
        let ring = build_ring()?;
        let n = RING_ENTRIES as usize * SLOTS_PER_RING_ENTRY;
        Ok(UringQueue {
            file,
            ring: Some(ring),
            gen: 0,
            retired: Vec::new(),
            slots: vec![None; n],
            free: (0..n as u32).rev().collect(),
            failed: Vec::new(),
            scratch: Vec::with_capacity(n),
        })
    }

    /// The current ring, opening a new one after a retirement.
    fn ring(&mut self) -> Result<&mut Ring, Status> {
        if self.ring.is_none() {
            match build_ring() {
                Ok(r) => self.ring = Some(r),
                Err(e) => {
                    tracing::error!("cannot open a backend io_uring ({e}); failing the request");
                    return Err(super::SUBMIT_FAILED);
                }
            }
        }
        self.ring.as_mut().ok_or(super::SUBMIT_FAILED)
    }

    /// The entry for the next part of slot `idx`'s request.
    fn entry(&self, idx: u32) -> Option<io_uring::squeue::Entry> {
        use io_uring::{opcode, types};
        let p = self.slots[idx as usize]?;
        let fd = types::Fd(self.file.as_raw_fd());
        let r = p.req;
        let rest = (r.len_bytes - p.done_bytes) as u32;
        let off = r.offset_bytes + p.done_bytes;
        // SAFETY: done_bytes < len_bytes, so the pointer stays inside the
        // request's buffer, which the submitter keeps valid (BackendQueue::submit).
        let buf = unsafe { r.buf.add(p.done_bytes as usize) };
        let e = match r.op {
            Op::Read => opcode::Read::new(fd, buf, rest).offset(off).build(),
            Op::Write => opcode::Write::new(fd, buf, rest)
                .offset(off)
                .rw_flags(if r.fua { libc::RWF_DSYNC } else { 0 })
                .build(),
            Op::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            // Done synchronously by zero_or_discard, never queued.
            Op::WriteZeroes | Op::Discard => return None,
        };
        Some(e.user_data(idx as u64))
    }

    /// Queues the next part of slot `idx`'s request. On Err the slot is
    /// still held: the caller frees it and reports the status.
    fn push(&mut self, idx: u32) -> Result<(), Status> {
        let e = self.entry(idx).ok_or(super::SUBMIT_FAILED)?;
        let is_read = matches!(self.slots[idx as usize], Some(p) if p.req.op == Op::Read);
        if let Some(ms) = is_read.then(crate::sys::fault::read_delay_ms).flatten() {
            return self.push_delayed(idx, e, ms);
        }
        for _ in 0..2 {
            let gen = self.gen;
            let ring = self.ring()?;
            // SAFETY: the request's buffer stays valid until it completes (the
            // BackendQueue::submit contract); if this entry is lost, the slot
            // is failed only once the ring is retired and can no longer run it.
            if unsafe { ring.push(&e) }.is_ok() {
                if let Some(p) = self.slots[idx as usize].as_mut() {
                    p.gen = gen;
                }
                return Ok(());
            }
            self.kick(); // full: submit what is queued (may retire the ring)
        }
        Err(super::SUBMIT_FAILED)
    }

    /// Fault injection: queues `e` behind a hard-linked timeout of `ms`, so
    /// the read starts late but is real kernel I/O meanwhile.
    fn push_delayed(
        &mut self,
        idx: u32,
        e: io_uring::squeue::Entry,
        ms: u64,
    ) -> Result<(), Status> {
        if self.ring()?.room() < 2 {
            self.kick();
        }
        let gen = self.gen;
        let Some(p) = self.slots[idx as usize].as_mut() else {
            return Err(super::SUBMIT_FAILED);
        };
        p.gen = gen;
        p.delay = std::time::Duration::from_millis(ms).into();
        let ts = &p.delay as *const io_uring::types::Timespec;
        let ring = self.ring()?;
        if ring.room() < 2 {
            return Err(super::SUBMIT_FAILED);
        }
        let t = io_uring::opcode::Timeout::new(ts)
            .build()
            .flags(io_uring::squeue::Flags::IO_HARDLINK)
            .user_data(DELAY_BIT | idx as u64);
        // SAFETY: the timespec lives in the slot, which stays put until the
        // request completes or is failed as lost; the read is as in `push`.
        unsafe {
            ring.push(&t).map_err(|_| super::SUBMIT_FAILED)?;
            ring.push(&e).map_err(|_| super::SUBMIT_FAILED)
        }
    }

    /// A submit failed for good: every entry the ring never consumed will
    /// never run, so its request fails now; running ones are still reaped.
    fn retire(&mut self, e: std::io::Error) {
        let Some(mut old) = self.ring.take() else {
            return;
        };
        let lost = old.take_lost();
        tracing::error!(
            "backend io_uring submit failed after {} attempts ({e}); failing {} queued \
             requests with {} and opening a new ring",
            crate::sys::ring::SUBMIT_ATTEMPTS,
            lost.iter()
                .filter(|&&ud| ud & (CANCEL_BIT | DELAY_BIT) == 0)
                .count(),
            super::SUBMIT_FAILED
        );
        for ud in lost {
            if ud & (CANCEL_BIT | DELAY_BIT) == 0 {
                self.fail(ud as u32, super::SUBMIT_FAILED);
            }
        }
        if old.in_flight() > 0 {
            self.retired.push((self.gen, old));
        }
        self.gen = self.gen.wrapping_add(1);
    }

    /// Frees slot `idx` and reports `st` for its request at the next reap.
    fn fail(&mut self, idx: u32, st: Status) {
        if let Some(p) = self.slots.get_mut(idx as usize).and_then(Option::take) {
            self.free.push(idx);
            self.failed.push((p.tag, st));
        }
    }

    /// Handles one completion of a request operation; returns the request's
    /// final status, or None while parts remain (resubmitted here).
    fn complete(&mut self, idx: u32, res: i32) -> Option<(u64, Status)> {
        let mut p = self.slots.get(idx as usize).copied().flatten()?;
        let status = if res < 0 {
            if let Some(quiet) = io_error_log_allowed() {
                tracing::warn!(
                    not_logged_since_last = quiet,
                    "{:?} at {} failed: {}",
                    p.req.op,
                    p.req.offset_bytes,
                    std::io::Error::from_raw_os_error(-res)
                );
            }
            io_error_status(p.req.op, Some(-res))
        } else if p.req.op == Op::Flush {
            Status::SUCCESS
        } else if res == 0 {
            io_error_status(p.req.op, None) // EOF inside the namespace
        } else {
            p.done_bytes += res as u64;
            if p.done_bytes < p.req.len_bytes {
                self.slots[idx as usize] = Some(p);
                match self.push(idx) {
                    Ok(()) => return None,
                    Err(st) => st,
                }
            } else {
                Status::SUCCESS
            }
        };
        self.slots[idx as usize] = None;
        self.free.push(idx);
        Some((p.tag, status))
    }
}

impl BackendQueue for UringQueue {
    unsafe fn submit(&mut self, req: &IoReq, tag: u64) -> Option<Status> {
        crate::sys::fault::io_panic_point();
        if let Some(st) = zero_or_discard(&self.file, req) {
            return Some(st);
        }
        let Some(idx) = self.free.pop() else {
            // More requests than slots: the reactor bounds queue depth, so
            // this means a bug elsewhere; fail the command rather than block.
            return Some(generic::INTERNAL_ERROR);
        };
        self.slots[idx as usize] = Some(Pending {
            tag,
            req: *req,
            done_bytes: 0,
            gen: self.gen,
            delay: io_uring::types::Timespec::new(),
        });
        match self.push(idx) {
            Ok(()) => None,
            Err(st) => {
                self.slots[idx as usize] = None;
                self.free.push(idx);
                Some(st)
            }
        }
    }

    fn kick(&mut self) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        if ring.staged() == 0 {
            return;
        }
        if let Err(e) = ring.submit(0, &mut self.scratch) {
            self.retire(e);
        }
    }

    fn reap(&mut self, out: &mut Vec<(u64, Status)>) -> usize {
        let before = out.len();
        out.append(&mut self.failed);
        let mut cqes = std::mem::take(&mut self.scratch);
        if let Some(r) = self.ring.as_mut() {
            r.reap(&mut cqes);
        }
        for (_, r) in &mut self.retired {
            r.reap_retired(&mut cqes);
        }
        self.retired.retain(|(_, r)| r.in_flight() > 0);
        for &(ud, res) in &cqes {
            if ud & (CANCEL_BIT | DELAY_BIT) != 0 {
                continue; // our cancel or fault-delay operations
            }
            if let Some(done) = self.complete((ud & SLOT_MASK) as u32, res) {
                out.push(done);
            }
        }
        cqes.clear();
        self.scratch = cqes;
        // Resubmissions inside `complete` may have failed as lost.
        out.append(&mut self.failed);
        out.len() - before
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len() + self.failed.len()
    }

    fn cancel_all(&mut self) -> usize {
        if crate::sys::fault::cancels_ignored() {
            return 0;
        }
        self.kick();
        let gen = self.gen;
        let targets: Vec<u64> = (0..self.slots.len() as u64)
            .filter(|&i| matches!(self.slots[i as usize], Some(p) if p.gen == gen))
            .flat_map(|i| [i, DELAY_BIT | i])
            .collect();
        // Requests on retired rings cannot be cancelled: cancelling means
        // submitting, and a retired ring is never submitted again.
        let Some(ring) = self.ring.as_mut() else {
            return 0;
        };
        let mut issued = 0;
        for t in targets {
            if ring.room() == 0 && ring.submit(0, &mut self.scratch).is_err() {
                break;
            }
            let e = io_uring::opcode::AsyncCancel::new(t)
                .build()
                .user_data(CANCEL_BIT | t);
            // SAFETY: a cancel request points to no memory.
            if unsafe { ring.push(&e) }.is_ok() {
                issued += 1;
            }
        }
        if let Err(e) = ring.submit(0, &mut self.scratch) {
            tracing::error!("cannot submit cancellations: {e}");
            return 0;
        }
        // Completions reaped during retries belong to the next reap.
        issued
    }
}

#[cfg(test)]
mod link_tests {
    use super::pcie_link_bytes_per_s as link;

    #[test]
    fn pcie_link_bandwidth_follows_rate_lanes_and_line_code() {
        // Gen3 x4 (Gimbal's drives): 8 GT/s × 4 × 128/130 / 8 = 3.938 GB/s,
        // just under Gimbal's 4 GiB/s ceiling.
        assert_eq!(link("8.0 GT/s PCIe\n", "4\n"), Some(3_938_461_538));
        assert_eq!(link("8 GT/s", "4"), Some(3_938_461_538));
        // Gen4 x4 (PM9A3): 7.877 GB/s; Gen2 x1 with 8b/10b: 500 MB/s.
        assert_eq!(link("16.0 GT/s PCIe", "4"), Some(7_876_923_076));
        assert_eq!(link("5.0 GT/s PCIe", "1"), Some(500_000_000));
        // Gen6's FLIT mode.
        assert_eq!(link("64.0 GT/s PCIe", "4"), Some(30_250_000_000));
    }

    #[test]
    fn what_sysfs_may_say_when_there_is_no_link_gives_nothing() {
        for (s, w) in [
            ("Unknown", "4"),
            ("", "4"),
            ("8.0 GT/s", "0"),
            ("8.0 GT/s", "x4"),
            ("-8 GT/s", "4"),
            ("NaN GT/s", "4"),
            ("8.0 GT/s", "64"),
        ] {
            assert_eq!(link(s, w), None, "{s:?} {w:?}");
        }
    }

    #[test]
    fn a_link_alone_raises_only_gimbals_rate_ceiling() {
        let g = trellis_qos::GimbalConfig::default();
        let m = trellis_qos::DeviceModel {
            read_4k_iops: 0,
            read_bytes_per_s: 0,
            read_128k_saturation_qd: 0,
            link_bytes_per_s: link("16.0 GT/s", "4").unwrap(),
        };
        let c = g.calibrated(&m);
        assert_eq!(c.rate_max_bytes_per_s, 7_876_923_076);
        assert_eq!(
            (c.io_cost_bytes, c.slots_per_ssd),
            (g.io_cost_bytes, g.slots_per_ssd)
        );
        // Gen3 x4 is below 4 GiB/s: Gimbal's ceiling stays.
        let m3 = trellis_qos::DeviceModel {
            link_bytes_per_s: link("8.0 GT/s", "4").unwrap(),
            ..m
        };
        assert_eq!(
            g.calibrated(&m3).rate_max_bytes_per_s,
            g.rate_max_bytes_per_s
        );
    }
}

#[cfg(test)]
mod enospc_tests {
    use super::*;

    /// Issue 32: a full backing file system turned writes into media Write
    /// Faults (DNR clear): hosts retried, then reported a failing disk.
    /// `/dev/full` fails every write with the kernel's own ENOSPC.
    #[test]
    fn a_full_file_system_is_capacity_exceeded_with_dnr_not_a_media_error() {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/full")
            .unwrap();
        let mut q = SyncQueue { file: Arc::new(f) };
        let mut buf = vec![0x5Au8; 4096];
        let req = IoReq {
            op: Op::Write,
            offset_bytes: 0,
            len_bytes: 4096,
            buf: buf.as_mut_ptr(),
            fua: false,
        };
        // SAFETY: buf is live and ours for the synchronous call.
        let st = unsafe { q.submit(&req, 0) };
        assert_eq!(st, Some(generic::CAPACITY_EXCEEDED.dnr()));
        // A read of /dev/full succeeds (zeroes): only writes are refused.
        let rd = IoReq {
            op: Op::Read,
            ..req
        };
        // SAFETY: as above.
        assert_eq!(unsafe { q.submit(&rd, 0) }, Some(Status::SUCCESS));
        // A real media error keeps its status and DNR clear.
        assert_eq!(
            io_error_status(Op::Write, Some(libc::EIO)),
            media::WRITE_FAULT
        );
        assert!(!io_error_status(Op::Write, Some(libc::EIO)).is_dnr());
    }
}
