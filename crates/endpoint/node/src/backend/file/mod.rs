//! File and block-device backend: real I/O through a per-reactor io_uring,
//! with O_DIRECT where the filesystem or device accepts it.
//!
//! Durability: Flush is an fdatasync, FUA writes carry RWF_DSYNC, so a
//! completion for either is sent only once the data is on stable storage.
//! When io_uring is unavailable (seccomp, `kernel.io_uring_disabled`) the
//! queue falls back to synchronous pread/pwrite with the same semantics.

use super::{Backend, BackendQueue, Completion, IoReq, Op, Tag};
use crate::sys::ring::Ring;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::sync::Arc;
use trellis_nvme::status::{generic, media};
use trellis_nvme::Status;

pub mod drive;
mod sync;
mod uring;
mod zero;
use sync::*;
use uring::*;
use zero::*;

pub struct FileBackend {
    file: Arc<File>,
    size_bytes: u64,
    path: String,
    direct: bool,
    /// A block device's PCIe link bandwidth, from sysfs; 0 when unknown.
    link_bytes_per_s: u64,
    /// What fallocate does here, shared by every reactor's queue.
    zero: Arc<ZeroSupport>,
    /// The NVMe drive's temperature sensor behind the file or device, and
    /// its last reading (K, 0: none), refreshed by the health thread.
    sensors: Vec<std::path::PathBuf>,
    temperature_k: std::sync::atomic::AtomicU16,
    /// The NVMe drive's own SMART log, for a block device that is one.
    drive: Option<drive::DriveSmart>,
}

/// `BLKGETSIZE64` from <linux/fs.h>: a block device's size in bytes
/// (`_IOR(0x12, 114, size_t)`; libc does not export it).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// Buffer alignment for O_DIRECT: a page satisfies every logical block size.
const DIRECT_ALIGN: usize = 4096;
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
        let sensors = {
            use std::os::unix::fs::MetadataExt;
            let dev = if meta.file_type().is_block_device() {
                meta.rdev()
            } else {
                meta.dev()
            };
            crate::sys::thermal::device_sensors(dev)
        };
        let drive = {
            use std::os::unix::fs::MetadataExt;
            meta.file_type()
                .is_block_device()
                .then(|| drive::nvme_controller_of(meta.rdev()))
                .flatten()
                .map(|c| {
                    tracing::info!("{path}: SMART passes through the health of {}", c.display());
                    let d = drive::DriveSmart::new(c);
                    d.refresh();
                    d
                })
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
            temperature_k: crate::sys::thermal::hottest_k(&sensors).unwrap_or(0).into(),
            sensors,
            drive,
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
    fn temperature_k(&self) -> Option<u16> {
        let k = self
            .temperature_k
            .load(std::sync::atomic::Ordering::Relaxed);
        (k != 0).then_some(k)
    }
    fn refresh_health(&self) {
        let k = crate::sys::thermal::hottest_k(&self.sensors).unwrap_or(0);
        self.temperature_k
            .store(k, std::sync::atomic::Ordering::Relaxed);
        if let Some(d) = &self.drive {
            d.refresh();
        }
    }
    fn drive_smart(&self) -> Option<trellis_nvme::log::Smart> {
        self.drive.as_ref()?.get()
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
    use crate::backend::tag::test_tag;

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
        let st = unsafe { q.submit(&req, test_tag(0)) };
        assert_eq!(st, Some(generic::CAPACITY_EXCEEDED.dnr()));
        // A read of /dev/full succeeds (zeroes): only writes are refused.
        let rd = IoReq {
            op: Op::Read,
            ..req
        };
        // SAFETY: as above.
        assert_eq!(unsafe { q.submit(&rd, test_tag(0)) }, Some(Status::SUCCESS));
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
    use crate::backend::tag::test_tag;
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
        let st = unsafe { q.submit(&req, test_tag(1)) };
        assert_eq!(st, None, "not done in submit");
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
        (out[0].status, worst)
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
        let st = unsafe { q.submit(&req, test_tag(1)) };
        assert_eq!(st, Some(Status::SUCCESS));
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
            sensors: Vec::new(),
            temperature_k: 0.into(),
            drive: None,
        };
        assert!(!fb.deallocate_reads_zeroes());
    }
}
