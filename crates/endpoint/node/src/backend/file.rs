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
    /// What fallocate does here, shared by every reactor's queue.
    zero: Arc<ZeroSupport>,
}

/// `BLKGETSIZE64` from <linux/fs.h>: a block device's size in bytes
/// (`_IOR(0x12, 114, size_t)`; libc does not export it).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// Buffer alignment for O_DIRECT: a page satisfies every logical block size.
const DIRECT_ALIGN: usize = 4096;
/// Largest write of zeroes when neither FALLOC_FL_ZERO_RANGE nor
/// FALLOC_FL_PUNCH_HOLE works here: big enough to amortise syscalls, small
/// enough not to hold much memory; never done on the reactor thread (an
/// io_uring write, or the zero worker's pwrite).
pub(crate) const ZERO_FILL_CHUNK: usize = 1 << 20;

/// Which native zeroing this file or device has. Probed at open (regular
/// files, without changing their data) and cleared when a call says it is
/// unsupported after all; read by every queue for each piece.
pub(crate) struct ZeroSupport {
    pub(crate) zero_range: std::sync::atomic::AtomicBool,
    pub(crate) punch: std::sync::atomic::AtomicBool,
}

impl ZeroSupport {
    pub(crate) fn new(zero_range: bool, punch: bool) -> ZeroSupport {
        ZeroSupport {
            zero_range: zero_range.into(),
            punch: punch.into(),
        }
    }
    fn zero_range(&self) -> bool {
        self.zero_range.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn punch(&self) -> bool {
        self.punch.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// A call answered `errno`: if that says the mode is unsupported, stop
    /// using it (logged once per mode) and return true.
    fn unsupported(&self, step: ZeroStep, errno: i32) -> bool {
        if !fallocate_unsupported(errno) {
            return false;
        }
        let (flag, name) = match step {
            ZeroStep::ZeroRange => (&self.zero_range, "FALLOC_FL_ZERO_RANGE"),
            ZeroStep::Punch => (&self.punch, "FALLOC_FL_PUNCH_HOLE"),
            _ => return false,
        };
        if flag.swap(false, std::sync::atomic::Ordering::Relaxed) {
            tracing::info!(
                "{name} unsupported here ({}): falling back",
                std::io::Error::from_raw_os_error(errno)
            );
        }
        true
    }
    /// The first step of a Write Zeroes or Deallocate piece; None: nothing
    /// to do (Deallocate where nothing can deallocate: it is advisory).
    fn first_step(&self, op: Op) -> Option<ZeroStep> {
        match op {
            Op::Discard => self.punch().then_some(ZeroStep::Punch),
            _ if self.zero_range() => Some(ZeroStep::ZeroRange),
            _ if self.punch() => Some(ZeroStep::Punch),
            _ => Some(ZeroStep::Fill),
        }
    }
    /// The step after `step` failed as unsupported for `op`.
    fn next_step(&self, op: Op, step: ZeroStep) -> Option<ZeroStep> {
        match (op, step) {
            (Op::Discard, _) => None,
            (_, ZeroStep::ZeroRange) if self.punch() => Some(ZeroStep::Punch),
            _ => Some(ZeroStep::Fill),
        }
    }
}

/// fallocate's answers that mean "this mode is not available here" (not "this
/// call failed"): EOPNOTSUPP from the file system or device, ENOSYS, and
/// EINVAL, which a kernel without IORING_OP_FALLOCATE and a block device
/// that cannot zero without writing (PUNCH_HOLE) give.
fn fallocate_unsupported(errno: i32) -> bool {
    matches!(errno, libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL)
}

/// How one piece of Write Zeroes or Deallocate is being done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ZeroStep {
    /// fallocate(FALLOC_FL_ZERO_RANGE | KEEP_SIZE): zeroes, keeps the space.
    ZeroRange,
    /// fallocate(FALLOC_FL_PUNCH_HOLE | KEEP_SIZE): deallocates; reads zero.
    Punch,
    /// Writes of zeroes, at most [`ZERO_FILL_CHUNK`] each.
    Fill,
    /// fdatasync after the zeroing, for FUA.
    Sync,
}

/// Probes whether a regular file can punch holes, without changing it: a
/// hole punched at its end with KEEP_SIZE touches no byte and no block.
/// ZERO_RANGE has no such harmless probe (at the end it preallocates), so
/// it is taken as available and corrected at the first call that says
/// otherwise (on a block device the kernel zeroes by writing if the device
/// cannot). A block device punches holes if sysfs says it writes zeroes
/// natively. Any correction happens off the reactor thread.
fn probe_zero_support(file: &File, block_device: bool, read_only: bool) -> ZeroSupport {
    if read_only {
        return ZeroSupport::new(false, false);
    }
    if block_device {
        use std::os::unix::fs::MetadataExt;
        let punch = file.metadata().map_or(true, |m| {
            block_device_writes_zeroes(m.rdev()).unwrap_or(true)
        });
        return ZeroSupport::new(true, punch);
    }
    let Ok(end) = file
        .metadata()
        .map(|m| m.len().next_multiple_of(DIRECT_ALIGN as u64))
    else {
        return ZeroSupport::new(true, false);
    };
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate takes no pointers; the fd stays open for the call.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, end as i64, DIRECT_ALIGN as i64) };
    let punch = rc == 0
        || !fallocate_unsupported(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    ZeroSupport::new(true, punch)
}

/// A page-aligned buffer of zeroes that io_uring writes read from.
struct ZeroBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl ZeroBuf {
    fn new() -> Option<ZeroBuf> {
        let layout = std::alloc::Layout::from_size_align(ZERO_FILL_CHUNK, DIRECT_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size; null is checked below.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(ZeroBuf { ptr, layout })
    }
}

impl Drop for ZeroBuf {
    fn drop(&mut self) {
        // SAFETY: ptr came from alloc_zeroed with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Creates `path` as a sparse file of `size` bytes, mode 0600 (host data:
/// the owner's only, never another user's to read), and says it is thin.
fn create_sparse(path: &str, size: u64) -> anyhow::Result<()> {
    use anyhow::Context;
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {path}"))?;
    f.set_len(size)?;
    tracing::info!(
        path,
        size_bytes = size,
        "created a sparse (thin) backing file: blocks are allocated as hosts write them, so its file system must keep room for them (Identify reports THINP and NUSE)"
    );
    Ok(())
}

impl FileBackend {
    pub fn open(
        path: &str,
        create_size: Option<u64>,
        block_size: u32,
        read_only: bool,
        want_direct: bool,
    ) -> anyhow::Result<FileBackend> {
        use anyhow::Context;
        if !std::path::Path::new(path).exists() {
            let size = create_size.with_context(|| {
                format!("{path} does not exist and no size was given to create it")
            })?;
            create_sparse(path, size)?;
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
        let zero = probe_zero_support(&file, meta.file_type().is_block_device(), read_only);
        if !read_only && !zero.punch() {
            tracing::warn!(
                "{path}: fallocate cannot punch holes here: Deallocate does nothing (it is \
                 advisory; Identify's DLFEAT then reports no read-zeroes), and Write Zeroes \
                 falls back to writing zeroes (off the reactor, {ZERO_FILL_CHUNK} bytes a write) \
                 where FALLOC_FL_ZERO_RANGE is missing too"
            );
        }
        Ok(FileBackend {
            file: Arc::new(file),
            size_bytes,
            path: path.into(),
            direct,
            link_bytes_per_s,
            zero: Arc::new(zero),
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

/// Whether block device `rdev` zeroes natively, which PUNCH_HOLE on a
/// block device needs (the kernel turns it into Write Zeroes with unmap
/// allowed, and refuses it without falling back to writing): its queue's
/// `write_zeroes_max_bytes` in sysfs is not 0 (a partition's is its
/// disk's). None when sysfs does not say.
fn block_device_writes_zeroes(rdev: u64) -> Option<bool> {
    let (maj, min) = (libc::major(rdev), libc::minor(rdev));
    let dev = std::path::PathBuf::from(format!("/sys/dev/block/{maj}:{min}"));
    for q in [dev.join("queue"), dev.join("../queue")] {
        if let Ok(v) = std::fs::read_to_string(q.join("write_zeroes_max_bytes")) {
            return v.trim().parse::<u64>().ok().map(|n| n > 0);
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
    /// A regular file's allocated bytes (st_blocks is in 512-byte units,
    /// stat(2)); None for a block device, which is not thin to us.
    fn allocated_bytes(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let m = self.file.metadata().ok()?;
        m.file_type()
            .is_file()
            .then(|| m.blocks().saturating_mul(512).min(self.size_bytes))
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
    /// Deallocated blocks read zeroes only where Deallocate really punches
    /// holes (DLFEAT); elsewhere Deallocate is a no-op, as the spec allows.
    fn deallocate_reads_zeroes(&self) -> bool {
        self.zero.punch()
    }
    fn open_queue(&self) -> anyhow::Result<Box<dyn BackendQueue>> {
        match UringQueue::new(self.file.clone(), self.zero.clone()) {
            Ok(q) => Ok(Box::new(q)),
            Err(e) => {
                tracing::warn!(
                    "io_uring unavailable ({e}); {} uses synchronous I/O",
                    self.path
                );
                Ok(Box::new(SyncQueue::new(
                    self.file.clone(),
                    self.zero.clone(),
                )))
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

/// One piece of Write Zeroes or Deallocate, done synchronously: by the
/// zero worker of a queue without io_uring, never by a reactor. Natively
/// where the file system or device can (ZERO_RANGE, then PUNCH_HOLE), else
/// (Write Zeroes only) by writes of at most [`ZERO_FILL_CHUNK`] bytes.
fn zero_piece(file: &File, zero: &ZeroSupport, req: &IoReq) -> Status {
    let fd = file.as_raw_fd();
    let mut step = zero.first_step(req.op);
    while let Some(st) = step {
        let mode = match st {
            ZeroStep::ZeroRange => libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            ZeroStep::Punch => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            _ => break,
        };
        // SAFETY: fallocate takes no pointers; fd stays open for the call.
        let rc =
            unsafe { libc::fallocate(fd, mode, req.offset_bytes as i64, req.len_bytes as i64) };
        if rc == 0 {
            return zero_sync(fd, req);
        }
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        if !zero.unsupported(st, errno) {
            return io_error_status(req.op, Some(errno));
        }
        step = zero.next_step(req.op, st);
    }
    if step.is_none() {
        return Status::SUCCESS; // Deallocate where nothing deallocates: advisory
    }
    match fill_zeroes(fd, req.offset_bytes, req.len_bytes) {
        Ok(()) => zero_sync(fd, req),
        Err(st) => st,
    }
}

/// FUA on zeroing: durable before it completes.
fn zero_sync(fd: i32, req: &IoReq) -> Status {
    // SAFETY: fdatasync only takes an fd, which the caller keeps open.
    if req.fua && unsafe { libc::fdatasync(fd) } != 0 {
        return media::WRITE_FAULT;
    }
    Status::SUCCESS
}

#[cfg(test)]
thread_local! {
    /// Bytes of zeroes written from user space on this thread (tests: the
    /// reactor's thread must never be one that writes them).
    pub(crate) static FILLED_ON_THIS_THREAD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Writes `len` zero bytes at `off` from an aligned buffer (O_DIRECT files
/// need one), [`ZERO_FILL_CHUNK`] bytes a call.
fn fill_zeroes(fd: i32, off: u64, len: u64) -> Result<(), Status> {
    let buf = ZeroBuf::new().ok_or(generic::INTERNAL_ERROR)?;
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(ZERO_FILL_CHUNK as u64) as usize;
        // SAFETY: buf holds ZERO_FILL_CHUNK >= n initialised bytes; pwrite
        // only reads them, synchronously.
        let rc = unsafe { libc::pwrite(fd, buf.ptr as *const _, n, (off + done) as i64) };
        if rc <= 0 {
            let errno = (rc < 0)
                .then(|| std::io::Error::last_os_error().raw_os_error())
                .flatten();
            return Err(io_error_status(Op::WriteZeroes, errno));
        }
        #[cfg(test)]
        FILLED_ON_THIS_THREAD.with(|c| c.set(c.get() + rc as u64));
        done += rc as u64;
    }
    Ok(())
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

/// Synchronous fallback queue. Reads, writes and flushes run inline, as
/// before io_uring; Write Zeroes and Deallocate pieces go to a zero worker
/// thread (started at the first), so fallocate's time, and a fill's, is
/// never the reactor's.
struct SyncQueue {
    file: Arc<File>,
    zero: Arc<ZeroSupport>,
    worker: Option<ZeroWorker>,
}

/// The thread one [`SyncQueue`] hands zeroing pieces to. Its channels hold
/// at most `ZERO_CHUNKS_IN_FLIGHT_MAX` pieces, the most the chunking queue
/// above may send at once; it exits when the queue drops its sender.
struct ZeroWorker {
    tx: std::sync::mpsc::SyncSender<Piece>,
    rx: std::sync::mpsc::Receiver<(u64, Status)>,
    in_flight: usize,
}

/// IoReq holds a raw pointer; the pieces sent to the worker carry none
/// (Write Zeroes and Discard have no buffer).
struct Piece(u64, IoReq);
// SAFETY: a zeroing piece's buf is null; nothing is shared through it.
unsafe impl Send for Piece {}

impl ZeroWorker {
    fn start(file: Arc<File>, zero: Arc<ZeroSupport>) -> std::io::Result<ZeroWorker> {
        let n = crate::config::ZERO_CHUNKS_IN_FLIGHT_MAX;
        let (tx, work) = std::sync::mpsc::sync_channel::<Piece>(n);
        let (done_tx, rx) = std::sync::mpsc::sync_channel(n);
        std::thread::Builder::new()
            .name("trellis-zero".into())
            .spawn(move || {
                while let Ok(Piece(tag, req)) = work.recv() {
                    if done_tx.send((tag, zero_piece(&file, &zero, &req))).is_err() {
                        return;
                    }
                }
            })?;
        Ok(ZeroWorker {
            tx,
            rx,
            in_flight: 0,
        })
    }
}

impl SyncQueue {
    fn new(file: Arc<File>, zero: Arc<ZeroSupport>) -> SyncQueue {
        SyncQueue {
            file,
            zero,
            worker: None,
        }
    }

    /// Hands a zeroing piece to the worker; Some(status) if it cannot.
    fn zero_to_worker(&mut self, req: &IoReq, tag: u64) -> Option<Status> {
        if self.worker.is_none() {
            match ZeroWorker::start(self.file.clone(), self.zero.clone()) {
                Ok(w) => self.worker = Some(w),
                Err(e) => {
                    tracing::error!("cannot start a zero worker thread: {e}");
                    return Some(super::SUBMIT_FAILED);
                }
            }
        }
        let w = self.worker.as_mut()?;
        match w.tx.try_send(Piece(tag, *req)) {
            Ok(()) => {
                w.in_flight += 1;
                None
            }
            // More pieces than the chunking queue sends at once: a bug
            // elsewhere; fail the piece rather than block the reactor.
            Err(_) => Some(super::SUBMIT_FAILED),
        }
    }
}

impl BackendQueue for SyncQueue {
    fn reap(&mut self, out: &mut Vec<(u64, Status)>) -> usize {
        let Some(w) = self.worker.as_mut() else {
            return 0;
        };
        let before = out.len();
        while let Ok(done) = w.rx.try_recv() {
            w.in_flight = w.in_flight.saturating_sub(1);
            out.push(done);
        }
        out.len() - before
    }

    fn in_flight(&self) -> usize {
        self.worker.as_ref().map_or(0, |w| w.in_flight)
    }

    unsafe fn submit(&mut self, req: &IoReq, tag: u64) -> Option<Status> {
        crate::sys::fault::io_panic_point();
        if matches!(req.op, Op::WriteZeroes | Op::Discard) {
            return self.zero_to_worker(req, tag);
        }
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
            Op::WriteZeroes | Op::Discard => return Some(generic::INTERNAL_ERROR), // above
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
    /// Write Zeroes and Discard: how the piece is being done.
    step: ZeroStep,
}

/// Requests go to a per-reactor io_uring. When a submit fails for good the
/// ring is retired (see [`crate::sys::ring`]): requests it never consumed fail
/// with [`super::SUBMIT_FAILED`], its running requests are still reaped, and
/// the next request opens a new ring.
struct UringQueue {
    file: Arc<File>,
    zero: Arc<ZeroSupport>,
    /// What zero fills write from, made at the first fill.
    zero_buf: Option<ZeroBuf>,
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
    fn new(file: Arc<File>, zero: Arc<ZeroSupport>) -> std::io::Result<UringQueue> {
        let ring = build_ring()?;
        let n = RING_ENTRIES as usize * SLOTS_PER_RING_ENTRY;
        Ok(UringQueue {
            file,
            zero,
            zero_buf: None,
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
            Op::WriteZeroes | Op::Discard => self.zero_entry(&p, off)?,
        };
        Some(e.user_data(idx as u64))
    }

    /// The entry for the next part of a zeroing piece: an fallocate (the
    /// kernel runs it on its own worker, never on this thread), a write of
    /// at most [`ZERO_FILL_CHUNK`] zeroes, or the FUA fdatasync.
    fn zero_entry(&self, p: &Pending, off: u64) -> Option<io_uring::squeue::Entry> {
        use io_uring::{opcode, types};
        let fd = types::Fd(self.file.as_raw_fd());
        let rest = p.req.len_bytes - p.done_bytes;
        let falloc = |mode| {
            opcode::Fallocate::new(fd, rest)
                .offset(off)
                .mode(mode)
                .build()
        };
        Some(match p.step {
            ZeroStep::ZeroRange => falloc(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE),
            ZeroStep::Punch => falloc(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE),
            ZeroStep::Fill => {
                let n = rest.min(ZERO_FILL_CHUNK as u64) as u32;
                opcode::Write::new(fd, self.zero_buf.as_ref()?.ptr, n)
                    .offset(off)
                    .build()
            }
            ZeroStep::Sync => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
        })
    }

    /// Moves a zeroing piece to `step` from its start and queues it; on
    /// Err the caller fails the slot.
    fn restart_zero(&mut self, idx: u32, step: ZeroStep) -> Result<(), Status> {
        if step == ZeroStep::Fill && self.zero_buf.is_none() {
            self.zero_buf = Some(ZeroBuf::new().ok_or(generic::INTERNAL_ERROR)?);
        }
        let p = self.slots[idx as usize]
            .as_mut()
            .ok_or(super::SUBMIT_FAILED)?;
        p.step = step;
        if step != ZeroStep::Sync {
            p.done_bytes = 0;
        }
        self.push(idx)
    }

    /// Handles one completion of a zeroing piece: None while it goes on
    /// (the next fill write, a fallback after "unsupported", the FUA sync).
    fn complete_zero(&mut self, idx: u32, mut p: Pending, res: i32) -> Option<Status> {
        let next = if res < 0 {
            if !self.zero.unsupported(p.step, -res) {
                return Some(io_error_status(p.req.op, Some(-res)));
            }
            match self.zero.next_step(p.req.op, p.step) {
                Some(step) => step,
                None => return Some(Status::SUCCESS), // Deallocate is advisory
            }
        } else {
            match p.step {
                ZeroStep::Sync => return Some(Status::SUCCESS),
                ZeroStep::Fill if res == 0 => return Some(io_error_status(p.req.op, None)),
                ZeroStep::Fill => p.done_bytes += res as u64,
                _ => p.done_bytes = p.req.len_bytes,
            }
            if p.done_bytes < p.req.len_bytes {
                self.slots[idx as usize] = Some(p);
                return self.push(idx).err();
            }
            if !p.req.fua {
                return Some(Status::SUCCESS);
            }
            ZeroStep::Sync
        };
        self.slots[idx as usize] = Some(p);
        self.restart_zero(idx, next).err()
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
    /// A failed request, in the log at most every 10 s with a count.
    fn log_failure(&self, p: &Pending, res: i32) {
        if let Some(quiet) = io_error_log_allowed() {
            tracing::warn!(
                not_logged_since_last = quiet,
                "{:?} at {} failed: {}",
                p.req.op,
                p.req.offset_bytes,
                if res < 0 {
                    std::io::Error::from_raw_os_error(-res).to_string()
                } else {
                    "short transfer".into()
                }
            );
        }
    }

    fn complete(&mut self, idx: u32, res: i32) -> Option<(u64, Status)> {
        let mut p = self.slots.get(idx as usize).copied().flatten()?;
        let status = if matches!(p.req.op, Op::WriteZeroes | Op::Discard) {
            let st = self.complete_zero(idx, p, res)?;
            if !st.is_success() {
                self.log_failure(&p, res);
            }
            st
        } else if res < 0 {
            self.log_failure(&p, res);
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
        let zeroing = matches!(req.op, Op::WriteZeroes | Op::Discard);
        let step = if zeroing {
            match self.zero.first_step(req.op) {
                Some(s) => s,
                None => return Some(Status::SUCCESS), // Deallocate is advisory
            }
        } else {
            ZeroStep::ZeroRange // unused
        };
        if step == ZeroStep::Fill && self.zero_buf.is_none() {
            self.zero_buf = ZeroBuf::new();
            if self.zero_buf.is_none() {
                return Some(generic::INTERNAL_ERROR);
            }
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
            step,
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
        let mut q = SyncQueue::new(Arc::new(f), Arc::new(ZeroSupport::new(false, false)));
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

#[cfg(test)]
mod zero_tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    const LEN: u64 = 128 << 20;

    fn sparse_file(d: &tempfile::TempDir) -> Arc<File> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(d.path().join("z.img"))
            .unwrap();
        f.set_len(LEN + (1 << 20)).unwrap();
        // Data at both ends of the range, which must read zero afterwards.
        use std::os::unix::fs::FileExt;
        f.write_all_at(&[0x5A; 4096], 4096).unwrap();
        f.write_all_at(&[0x5A; 4096], LEN).unwrap();
        Arc::new(f)
    }

    /// Runs a Write Zeroes of `LEN` bytes through the chunking queue over
    /// `q` until it completes: its status and the longest single loop step.
    fn run(q: Box<dyn BackendQueue>) -> (Status, std::time::Duration) {
        let mut q = super::super::zero::Chunked::wrap(q, Default::default());
        let req = IoReq {
            op: Op::WriteZeroes,
            offset_bytes: 4096,
            len_bytes: LEN,
            buf: std::ptr::null_mut(),
            fua: false,
        };
        // SAFETY: no buffer.
        assert_eq!(unsafe { q.submit(&req, 1) }, None, "not done in submit");
        let (started, mut worst) = (std::time::Instant::now(), std::time::Duration::ZERO);
        let mut out = Vec::new();
        while out.is_empty() {
            assert!(
                started.elapsed().as_secs() < 60,
                "Write Zeroes never completed"
            );
            let t = std::time::Instant::now();
            q.kick();
            q.reap(&mut out);
            worst = worst.max(t.elapsed());
        }
        assert_eq!(q.in_flight(), 0);
        (out[0].1, worst)
    }

    fn check_zeroed(f: &File) {
        use std::os::unix::fs::FileExt;
        let mut b = vec![1u8; 4096];
        for off in [4096, LEN] {
            f.read_exact_at(&mut b, off).unwrap();
            assert!(b.iter().all(|&x| x == 0), "zeroed at {off}");
        }
        // Written, not punched: the fill really ran (sparse before).
        assert!(f.metadata().unwrap().blocks() * 512 >= LEN);
    }

    /// Issue 32: where neither ZERO_RANGE nor PUNCH_HOLE works, Write
    /// Zeroes wrote the whole range from user space on the reactor thread.
    /// Now the calling (reactor) thread writes no zero byte itself: the
    /// io_uring queue's fills are kernel writes of at most 1 MiB, the sync
    /// queue's run on its zero worker; the command completes, zeroed.
    #[test]
    fn a_huge_write_zeroes_without_fallocate_is_never_filled_on_the_reactor_thread() {
        for uring in [true, false] {
            let d = tempfile::tempdir().unwrap();
            let f = sparse_file(&d);
            let zero = Arc::new(ZeroSupport::new(false, false));
            let q: Box<dyn BackendQueue> = if uring {
                Box::new(UringQueue::new(f.clone(), zero).unwrap())
            } else {
                Box::new(SyncQueue::new(f.clone(), zero))
            };
            let before = FILLED_ON_THIS_THREAD.with(|c| c.get());
            let (st, worst) = run(q);
            assert_eq!(st, Status::SUCCESS);
            assert_eq!(
                FILLED_ON_THIS_THREAD.with(|c| c.get()),
                before,
                "zeroes written from user space on the calling thread (uring: {uring})"
            );
            check_zeroed(&f);
            eprintln!("fill of {LEN} bytes, uring {uring}: longest loop step {worst:?}");
        }
    }

    /// The probe finds the local file system's modes (ext4, xfs, btrfs and
    /// tmpfs all punch holes) without changing the file's size or data.
    #[test]
    fn the_fallocate_probe_changes_nothing_and_finds_punch_hole() {
        let d = tempfile::tempdir().unwrap();
        let f = sparse_file(&d);
        let before = (f.metadata().unwrap().len(), f.metadata().unwrap().blocks());
        let z = probe_zero_support(&f, false, false);
        assert!(z.punch(), "{} cannot punch holes?", d.path().display());
        assert_eq!(
            before,
            (f.metadata().unwrap().len(), f.metadata().unwrap().blocks())
        );
        assert!(
            !probe_zero_support(&f, false, true).punch(),
            "read-only: nothing"
        );
    }

    /// Deallocate where nothing deallocates completes, changing nothing
    /// (it is advisory); the backend then reports no read-zeroes (DLFEAT).
    #[test]
    fn deallocate_without_punch_hole_is_a_no_op_and_dlfeat_says_so() {
        let d = tempfile::tempdir().unwrap();
        let f = sparse_file(&d);
        let zero = Arc::new(ZeroSupport::new(true, false));
        let mut q = UringQueue::new(f.clone(), zero.clone()).unwrap();
        let req = IoReq {
            op: Op::Discard,
            offset_bytes: 4096,
            len_bytes: 4096,
            buf: std::ptr::null_mut(),
            fua: false,
        };
        // SAFETY: no buffer.
        assert_eq!(unsafe { q.submit(&req, 1) }, Some(Status::SUCCESS));
        use std::os::unix::fs::FileExt;
        let mut b = vec![0u8; 4096];
        f.read_exact_at(&mut b, 4096).unwrap();
        assert!(b.iter().all(|&x| x == 0x5A), "left alone");
        let fb = FileBackend {
            file: f,
            size_bytes: LEN,
            path: "t".into(),
            direct: false,
            link_bytes_per_s: 0,
            zero,
        };
        assert!(!fb.deallocate_reads_zeroes());
    }
}
