//! Storage backends behind one interface: null, ram, file/block device and
//! emulated SSD (RAM data, model timing).
//!
//! A [`Backend`] is shared by all reactors; each reactor opens its own
//! [`BackendQueue`] so the data path takes no lock. Synchronous backends (null,
//! ram) complete in `submit`; the file backend submits to a per-reactor
//! io_uring and completes in `reap`, which the reactor calls every loop.

pub mod emulated;
pub mod file;
pub mod null;
pub mod ram;
pub mod remote;
pub mod tag;
pub mod zero;

pub use tag::{Completion, IoTag, Tag};

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

/// The link of a backend with no drive behind it (null, RAM), reported as
/// its `device_model`: nothing bounds its bandwidth but the reactor's CPU.
/// Gimbal's own rate ceiling, 4 GiB/s, is the PCIe 3.0 ×4 link of its
/// drives; on a null namespace it capped one reactor at 1.05 M 4 KiB reads/s
/// while the reactor serves ~1.1 M here, and that cap (a token bucket that
/// refills at 4 GiB/s and holds 256 KiB), not the scheduler's CPU, was most
/// of what the side-by-side overhead runs measured (docs/gimbal.md,
/// "Overhead"). 2^40 B/s (1.1 TB/s, 268 M 4 KiB I/Os a second) is above any
/// reactor, and keeps the rate's growth (+8 × len per completion) far from
/// overflowing.
pub const NO_DRIVE_LINK_BYTES_PER_S: u64 = 1 << 40;

/// What a drive says of its wear and garbage collection (the emulated
/// model's `Health` and `SsdStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriveWear {
    pub read_retries: u64,
    pub uncorrectable_reads: u64,
    pub gc_runs: u64,
    pub gc_pages_moved: u64,
    pub erases: u64,
    pub gc_foreground_stalls: u64,
    pub pe_cycles_avg: u32,
    pub pe_cycles_max: u32,
    pub rated_pe_cycles: u32,
    pub bad_blocks: u32,
    pub spare_blocks: u32,
}

/// The device model of a backend with no drive: only its link, unbounded.
pub fn no_drive_model() -> trellis_qos::DeviceModel {
    trellis_qos::DeviceModel {
        read_4k_iops: 0,
        read_bytes_per_s: 0,
        read_128k_saturation_qd: 0,
        link_bytes_per_s: NO_DRIVE_LINK_BYTES_PER_S,
    }
}

pub trait Backend: Send + Sync {
    fn size_bytes(&self) -> u64;
    /// Bytes the backing store has allocated, where it is thin (a sparse
    /// file): Identify reports them as NUSE with THINP. None: fully
    /// allocated (or not known).
    fn allocated_bytes(&self) -> Option<u64> {
        None
    }
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
    /// How many times slower than wall time the device's own clock runs: an
    /// emulated SSD's `time_scale`, else 1. A scheduler in front of the
    /// device runs on the device's clock (wall ÷ scale), so its latency
    /// thresholds and rates keep their meaning on a dilated drive.
    fn time_scale(&self) -> f64 {
        1.0
    }
    /// The drive's capacities, when this backend knows them without
    /// measuring a real device (an emulated SSD's model); a scheduler sets
    /// its drive-specific constants from them (`[qos] calibrate`).
    fn device_model(&self) -> Option<trellis_qos::DeviceModel> {
        None
    }
    /// A per-reactor submission queue.
    fn open_queue(&self) -> anyhow::Result<Box<dyn BackendQueue>>;
    /// Makes room for `bytes` (larger than now) where the backend can
    /// (`trellis ctl namespace resize`); the namespace checks ranges.
    fn grow(&self, _bytes: u64) -> anyhow::Result<()> {
        anyhow::bail!("this backend cannot grow: only null and regular-file namespaces can")
    }
    /// The drive's Composite Temperature as last read (SMART), when it has
    /// a sensor of its own (`sys::thermal`); None: the node's stands for it.
    /// Served from what [`Backend::refresh_health`] read: never a device
    /// or sysfs read on a reactor.
    fn temperature_k(&self) -> Option<u16> {
        None
    }
    /// Reads the drive's health again (sensors, its SMART page): called by
    /// the health thread every second, never by a reactor.
    fn refresh_health(&self) {}
    /// The drive's own SMART / Health page, where the backend can read it
    /// (an NVMe block device; the emulated drive's model): merged into the
    /// target's (`backend::file::drive::merge`).
    fn drive_smart(&self) -> Option<trellis_nvme::log::Smart> {
        None
    }
    /// The clock the drive's failure predictor runs on, at wall time
    /// `now_ns`: wall time, except for an emulated drive whose life runs
    /// faster (`age_acceleration`).
    fn health_clock_ns(&self, now_ns: u64) -> u64 {
        now_ns
    }
    /// Reads by their service time on the drive itself, in
    /// `sys::latency::lat_bucket`s (lifetime counts), where the drive reports
    /// it (the emulated model; on real drives a latency-monitor log page
    /// would): the failure predictor then watches the drive, not the
    /// target's queueing in front of it. None: it watches command latency.
    fn drive_read_latency(&self) -> Option<[u64; crate::sys::latency::LAT_BUCKETS]> {
        None
    }
    /// The drive's wear and GC figures for the extended health page
    /// (`trellis_nvme::health`), where the backend models them.
    fn drive_wear(&self) -> Option<DriveWear> {
        None
    }
    /// The device's own fence, where it has one (`nvme-tcp`: NVMe
    /// reservations on the remote namespace), for the HA pair.
    fn device_fence(&self) -> Option<&dyn remote::DeviceFence> {
        None
    }
    /// Makes every completed write durable (shutdown path).
    fn sync_all(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String;
}

pub trait BackendQueue {
    /// Submits a request tagged `tag` (opaque here: [`tag`]). Returns `Some(status)` when it completed
    /// synchronously, `None` when its completion will come from `reap`.
    ///
    /// # Safety
    /// For Read/Write, `req.buf` must be valid for `req.len_bytes` bytes until
    /// the request completes, and not be accessed by anyone else meanwhile.
    unsafe fn submit(&mut self, req: &IoReq, tag: Tag) -> Option<Status>;
    /// Every request completes inside `submit` at zero device time (RAM,
    /// null): a scheduler may then decide and complete it in one pass
    /// (`trellis_qos::sched::Scheduler::run_now`).
    fn completes_in_submit(&self) -> bool {
        false
    }
    /// Write Zeroes or Deallocate (`op`) of several byte ranges (offset,
    /// length) as one request: Dataset Management. Only the chunking queue
    /// ([`zero::Chunked`], which every reactor's queue is wrapped in) takes
    /// them; a bare backend queue refuses.
    fn submit_ranges(
        &mut self,
        op: Op,
        ranges: &[(u64, u64)],
        fua: bool,
        tag: Tag,
    ) -> Option<Status> {
        let _ = (op, ranges, fua, tag);
        Some(trellis_nvme::status::generic::INTERNAL_ERROR)
    }
    /// The most bytes one Write Zeroes or Discard given to `submit` should
    /// cover, beyond `target.zero_chunk` ([`zero::Chunked`] splits larger
    /// ones): what one step of a backend that zeroes on the reactor thread
    /// (RAM) does without holding it long. Unbounded for the others.
    fn zero_chunk_bytes(&self) -> u64 {
        u64::MAX
    }
    /// Pushes submitted-but-not-started work to the device (batching point).
    fn kick(&mut self) {}
    /// Appends finished asynchronous requests to `out`; returns how many.
    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let _ = out;
        0
    }
    /// As [`reap`](Self::reap), and for each completion also the time it
    /// fell due on the device, in wall-clock ns, appended to `due_ns`. A
    /// device that only reports completions when asked says "now"; the
    /// emulated SSD knows the model's time, so the scheduler's latency
    /// signal does not include how late the reactor polled.
    fn reap_timed(&mut self, out: &mut Vec<Completion>, due_ns: &mut Vec<u64>) -> usize {
        let n = self.reap(out);
        if n > 0 {
            let now = crate::sys::now_ns();
            due_ns.extend(std::iter::repeat_n(now, n));
        }
        n
    }
    fn in_flight(&self) -> usize {
        0
    }
    /// Shutdown, grace expired: asks the kernel to cancel every request in
    /// flight (IORING_OP_ASYNC_CANCEL). Their completions still arrive
    /// through `reap` (as errors, or as successes if too late to cancel).
    /// Returns how many cancellations were issued.
    fn cancel_all(&mut self) -> usize {
        0
    }
}

/// Status of a request that could not be handed to the kernel: a submit
/// failed for good (after the retries of [`crate::sys::ring::SUBMIT_ATTEMPTS`]) or
/// no ring could be opened.
///
/// Internal Error (generic 06h, NVMe Base 2.1 §4.2.3.1: "not completed
/// successfully due to an internal error"), with Do Not Retry clear: the
/// next request goes to a fresh ring and may well succeed, and hosts
/// (Linux, SPDK) retry a status without DNR. Not Command Interrupted (21h),
/// which would say exactly "retry" but may only be returned to hosts that
/// enabled ACRE in Host Behavior Support; not Namespace Not Ready (82h),
/// which describes the whole namespace; not Transient Transport Error (22h),
/// as no transport failed; not a media error (sct 2): the medium was never
/// touched.
pub const SUBMIT_FAILED: Status = trellis_nvme::status::generic::INTERNAL_ERROR;

/// Opens the backend a namespace config names.
pub fn open(cfg: &crate::config::NamespaceConfig) -> anyhow::Result<std::sync::Arc<dyn Backend>> {
    use crate::config::BackendKind;
    use anyhow::Context;
    // Config::validate guarantees size (null, ram) and path (file); checked
    // again here so a caller that skipped validation gets an error, not a panic.
    let size = || cfg.size.map(|s| s.0).context("namespace needs a size");
    Ok(match cfg.backend {
        BackendKind::Null => std::sync::Arc::new(null::NullBackend::new(size()?)),
        BackendKind::Ram => std::sync::Arc::new(ram::RamBackend::new(size()?)?),
        BackendKind::File => std::sync::Arc::new(file::FileBackend::open(
            cfg.path.as_deref().context("file namespace needs a path")?,
            cfg.size.map(|s| s.0),
            cfg.block_size,
            cfg.read_only,
            cfg.direct,
        )?),
        BackendKind::Emulated => {
            let params = emulated::EmulatedParams::from_config(cfg)
                .map_err(anyhow::Error::msg)?
                .context("emulated namespace without emulation parameters")?;
            std::sync::Arc::new(emulated::EmulatedBackend::new(size()?, params)?)
        }
        BackendKind::NvmeTcp => {
            let spec = remote::RemoteSpec {
                addr: cfg.addr.clone().context("nvme-tcp namespace needs addr")?,
                subnqn: cfg
                    .subnqn
                    .clone()
                    .context("nvme-tcp namespace needs subnqn")?,
                nsid: cfg.remote_nsid.unwrap_or(1),
                // open_namespace fills in the node's default.
                hostnqn: cfg
                    .hostnqn
                    .clone()
                    .context("nvme-tcp namespace needs hostnqn")?,
            };
            std::sync::Arc::new(remote::RemoteBackend::open(spec, cfg.block_size)?)
        }
    })
}
