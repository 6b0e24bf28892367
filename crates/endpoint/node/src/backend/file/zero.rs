//! Write Zeroes and Deallocate on a file: what fallocate does here (probed
//! at open, remembered when it refuses), one bounded piece of work, and the
//! zero fill where nothing else works.

use super::*;

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
    pub(super) fn zero_range(&self) -> bool {
        self.zero_range.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub(super) fn punch(&self) -> bool {
        self.punch.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// A call answered `errno`: if that says the mode is unsupported, stop
    /// using it (logged once per mode) and return true.
    pub(super) fn unsupported(&self, step: ZeroStep, errno: i32) -> bool {
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
    pub(super) fn first_step(&self, op: Op) -> Option<ZeroStep> {
        match op {
            Op::Discard => self.punch().then_some(ZeroStep::Punch),
            _ if self.zero_range() => Some(ZeroStep::ZeroRange),
            _ if self.punch() => Some(ZeroStep::Punch),
            _ => Some(ZeroStep::Fill),
        }
    }
    /// The step after `step` failed as unsupported for `op`.
    pub(super) fn next_step(&self, op: Op, step: ZeroStep) -> Option<ZeroStep> {
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
pub(super) fn fallocate_unsupported(errno: i32) -> bool {
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
pub(super) fn probe_zero_support(file: &File, block_device: bool, read_only: bool) -> ZeroSupport {
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
pub(super) struct ZeroBuf {
    pub(super) ptr: *mut u8,
    pub(super) layout: std::alloc::Layout,
}

impl ZeroBuf {
    pub(super) fn new() -> Option<ZeroBuf> {
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

/// One piece of Write Zeroes or Deallocate, done synchronously: by the
/// zero worker of a queue without io_uring, never by a reactor. Natively
/// where the file system or device can (ZERO_RANGE, then PUNCH_HOLE), else
/// (Write Zeroes only) by writes of at most [`ZERO_FILL_CHUNK`] bytes.
pub(super) fn zero_piece(file: &File, zero: &ZeroSupport, req: &IoReq) -> Status {
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
pub(super) fn zero_sync(fd: i32, req: &IoReq) -> Status {
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
pub(super) fn fill_zeroes(fd: i32, off: u64, len: u64) -> Result<(), Status> {
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
