//! Fault injection in the real I/O path, for tests (Cargo feature
//! `fault-injection`, off by default, as in Mayastor).
//!
//! Tests arm a fault, drive a host against a real target, and check that the
//! failure turns into an NVMe status or a logged, closed connection: never a
//! panic that takes the target down silently, never a hang.
//!
//! The injector is process-global (the reactors that consult it are threads
//! the test does not own), so a test binary that arms it must run its tests
//! one at a time (tests/faults.rs holds a lock). Without the feature every
//! probe is an inlined constant and the data path pays nothing.

#[cfg(feature = "fault-injection")]
mod imp {
    use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering::SeqCst};

    static SUBMIT_FAILURES: AtomicU32 = AtomicU32::new(0);
    static SUBMIT_ERRNO: AtomicI32 = AtomicI32::new(0);
    static PANIC_NEXT_IO: AtomicBool = AtomicBool::new(false);
    static DELAYED_READS: AtomicU32 = AtomicU32::new(0);
    static READ_DELAY_MS: AtomicU64 = AtomicU64::new(0);
    static IGNORE_CANCELS: AtomicBool = AtomicBool::new(false);
    static DELAYED_WRITES: AtomicU32 = AtomicU32::new(0);
    static WRITE_DELAY_MS: AtomicU64 = AtomicU64::new(0);
    static RESV_CHECK_STALL_MS: AtomicU64 = AtomicU64::new(0);

    /// The next `n` io_uring submissions that carry entries (socket engine
    /// and file backend alike) fail with `errno` instead of entering the
    /// kernel; the entries stay queued, as after a real failed submit.
    pub fn fail_submits(n: u32, errno: i32) {
        SUBMIT_ERRNO.store(errno, SeqCst);
        SUBMIT_FAILURES.store(n, SeqCst);
    }

    /// The next backend submission (any backend) panics, as a buggy command
    /// handler would, on the reactor thread that runs it.
    pub fn panic_next_io() {
        PANIC_NEXT_IO.store(true, SeqCst);
    }

    /// The next `n` file-backend reads start only after `ms` milliseconds
    /// (an io_uring timeout hard-linked in front of each): real kernel I/O
    /// that stays in flight, for shutdown tests.
    pub fn delay_reads(n: u32, ms: u64) {
        READ_DELAY_MS.store(ms, SeqCst);
        DELAYED_READS.store(n, SeqCst);
    }

    /// The next `n` file-backend writes start only after `ms` milliseconds,
    /// as `delay_reads` does for reads: writes that are in the kernel, not
    /// yet on the file, for as long as a test needs.
    pub fn delay_writes(n: u32, ms: u64) {
        WRITE_DELAY_MS.store(ms, SeqCst);
        DELAYED_WRITES.store(n, SeqCst);
    }

    /// Delayed writes not handed to the kernel yet.
    pub fn pending_delayed_writes() -> u32 {
        DELAYED_WRITES.load(SeqCst)
    }

    /// The next command that passes its reservation check at execution
    /// (QoS off) sleeps `ms` on its reactor thread before it reaches the
    /// backend: the window between the check and the submit, held open so
    /// another reactor can change the reservation inside it.
    pub fn stall_after_resv_check(ms: u64) {
        RESV_CHECK_STALL_MS.store(ms, SeqCst);
    }

    /// Whether the stall of `stall_after_resv_check` is still to be taken.
    pub fn resv_check_stall_armed() -> bool {
        RESV_CHECK_STALL_MS.load(SeqCst) > 0
    }

    /// Shutdown skips IORING_OP_ASYNC_CANCEL, as if the kernel could not
    /// cancel the I/O (e.g. O_DIRECT I/O stuck on a device).
    pub fn ignore_cancels(on: bool) {
        IGNORE_CANCELS.store(on, SeqCst);
    }

    /// Disarms every fault.
    pub fn reset() {
        SUBMIT_FAILURES.store(0, SeqCst);
        PANIC_NEXT_IO.store(false, SeqCst);
        DELAYED_READS.store(0, SeqCst);
        IGNORE_CANCELS.store(false, SeqCst);
        DELAYED_WRITES.store(0, SeqCst);
        RESV_CHECK_STALL_MS.store(0, SeqCst);
    }

    /// Injected submit failures not consumed yet.
    pub fn pending_submit_failures() -> u32 {
        SUBMIT_FAILURES.load(SeqCst)
    }

    pub(crate) fn submit_error() -> Option<std::io::Error> {
        SUBMIT_FAILURES
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .ok()
            .map(|_| std::io::Error::from_raw_os_error(SUBMIT_ERRNO.load(SeqCst)))
    }

    pub(crate) fn take_io_panic() -> bool {
        PANIC_NEXT_IO.swap(false, SeqCst)
    }

    pub(crate) fn read_delay_ms() -> Option<u64> {
        DELAYED_READS
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .ok()
            .map(|_| READ_DELAY_MS.load(SeqCst))
    }

    pub(crate) fn cancels_ignored() -> bool {
        IGNORE_CANCELS.load(SeqCst)
    }

    pub(crate) fn write_delay_ms() -> Option<u64> {
        DELAYED_WRITES
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .ok()
            .map(|_| WRITE_DELAY_MS.load(SeqCst))
    }

    pub(crate) fn take_resv_check_stall_ms() -> u64 {
        RESV_CHECK_STALL_MS.swap(0, SeqCst)
    }
}

#[cfg(not(feature = "fault-injection"))]
mod imp {
    #[inline(always)]
    pub(crate) fn submit_error() -> Option<std::io::Error> {
        None
    }
    #[inline(always)]
    pub(crate) fn take_io_panic() -> bool {
        false
    }
    #[inline(always)]
    pub(crate) fn read_delay_ms() -> Option<u64> {
        None
    }
    #[inline(always)]
    pub(crate) fn cancels_ignored() -> bool {
        false
    }
    #[inline(always)]
    pub(crate) fn write_delay_ms() -> Option<u64> {
        None
    }
    #[inline(always)]
    pub(crate) fn take_resv_check_stall_ms() -> u64 {
        0
    }
}

#[cfg(feature = "fault-injection")]
pub use imp::*;
#[cfg(not(feature = "fault-injection"))]
pub(crate) use imp::*;

/// Called by every backend's `submit`: the command-handler panic hook.
#[inline(always)]
pub(crate) fn io_panic_point() {
    if take_io_panic() {
        panic!("injected fault: command handler panicked (fault::panic_next_io)");
    }
}

/// Called between a command's reservation check and its backend submit:
/// the stall hook of `stall_after_resv_check`.
#[inline(always)]
pub(crate) fn after_resv_check_point() {
    let ms = take_resv_check_stall_ms();
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}
