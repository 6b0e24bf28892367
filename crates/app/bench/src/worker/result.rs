//! What a worker reports: latency histograms, bytes, errors, verify
//! failures, credits, and the multipath counters.

use std::time::Duration;

use hdrhistogram::Histogram;

use crate::verify::VerifyFailure;

/// Latency histogram range: 100 ns .. 60 s, 3 significant digits.
const HIST_MAX_NS: u64 = 60_000_000_000;

pub struct WorkerResult {
    pub read_hist: Histogram<u64>,
    pub write_hist: Histogram<u64>,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// The worker stopped early because a queue failed.
    pub fatal: bool,
    pub verify_failures: u64,
    pub verify_samples: Vec<VerifyFailure>,
    pub verified_blocks: u64,
    pub measured: Duration,
    pub polls: u64,
    pub idle_polls: u64,
    /// Times a queue below its depth held back because the target's I/O
    /// credits were all in use (`--credits`; "device busy", Algorithm 3).
    pub credit_busy: u64,
    /// The smallest and latest credit a queue of this worker was granted.
    pub io_credits_min: Option<u32>,
    pub io_credits_last: Option<u32>,
    /// Reads sent to each replica (one entry without replicas).
    pub replica_reads: Vec<u64>,
    /// The latest I/O credits each replica granted (None: it sent none).
    pub replica_credits_last: Vec<Option<u32>>,
    /// Multipath: paths that failed, commands re-sent, the first failure,
    /// and which paths (0-based) failed.
    pub path_failures: u64,
    pub path_retries: u64,
    /// `--path-rate`: reads that found no path with room (per try).
    pub reserve_waits: u64,
    /// Multipath: commands a path refused with an ANA status (inaccessible,
    /// persistent loss, transition) and that moved to another path.
    pub ana_moves: u64,
    pub first_path_error: Option<String>,
    pub failed_paths: Vec<u32>,
    /// Paths (0-based) re-opened and put back in use, once per re-open.
    pub path_reconnects: Vec<u32>,
    /// Per path: commands sent on it since its last re-open (all of them
    /// when it never failed).
    pub path_ios_since_reopen: Vec<u64>,
}

pub(super) fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(100, HIST_MAX_NS, 3).expect("valid histogram bounds")
}

pub fn empty_result() -> WorkerResult {
    WorkerResult {
        read_hist: hist(),
        write_hist: hist(),
        read_bytes: 0,
        write_bytes: 0,
        errors: 0,
        first_error: None,
        fatal: false,
        verify_failures: 0,
        verify_samples: Vec::new(),
        verified_blocks: 0,
        measured: Duration::ZERO,
        polls: 0,
        idle_polls: 0,
        credit_busy: 0,
        io_credits_min: None,
        io_credits_last: None,
        replica_reads: Vec::new(),
        replica_credits_last: Vec::new(),
        path_failures: 0,
        path_retries: 0,
        reserve_waits: 0,
        ana_moves: 0,
        first_path_error: None,
        failed_paths: Vec::new(),
        path_reconnects: Vec::new(),
        path_ios_since_reopen: Vec::new(),
    }
}
