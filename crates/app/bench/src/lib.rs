//! `trellis bench`: a fio-like NVMe/TCP load generator built on
//! `trellis-host`, plus the benchmark suite and its raw TCP baseline.
//!
//! - [`cli`]: flags and subcommands (`suite`, `baseline-server`, `baseline-client`).
//! - [`job`]: job options from flags or a TOML job file.
//! - [`worker`]: one reactor thread per worker, owning its queue pairs.
//! - [`switch_run`]: `--stack blk-switch`, the jobs as apps on per-core,
//!   per-class queues (`trellis_path::switch`).
//! - [`verify`]: per-block header (LBA, generation, checksum).
//! - [`report`]: HDR histograms, the human table and the JSON.
//! - [`baseline`], [`suite`]: the raw TCP baseline and the suite runner.
//! - [`takeover`]: processor-node takeover under a verified workload.
//!
//! See `docs/bench.md`.

pub mod ana;
pub mod baseline;
pub mod cli;
pub mod job;
pub mod report;
pub mod runner;
pub mod suite;
pub mod switch_run;
pub mod takeover;
pub mod verify;
pub mod wakeup;
pub mod worker;
