//! Trellis host: a user-space NVMe/TCP initiator.
//!
//! - [`engine`]: the sans-IO queue pair (slots, PDUs in and out, checks).
//! - [`queue`]: one queue pair on a non-blocking socket, busy-polled by the
//!   thread that owns it (one gathered `sendmsg` and one `recv` per poll).
//! - [`ctrl`]: admin queue, controller enable/identify, I/O queue creation,
//!   Keep Alive, discovery.
//! - [`resv`]: NVMe persistent reservations (Register, Acquire, Release,
//!   Report, the notification log and PTPL).
//!
//! The sans-IO cores that decide where a host's I/O goes (blk-switch class
//! isolation, multipath and replica choice, per-path bandwidth reservation)
//! live in `trellis-path` (`crates/policy/path`): they need no socket, thread
//! or OpenSSL, and the simulator runs them too. A program drives them beside
//! this crate's queues, as `trellis bench` does.
//!
//! Every encode and decode goes through `trellis-nvme`, the same crate the
//! target uses. See `docs/host.md` for the design and API walk-through.

// No unwrap/expect outside tests: a peer or a caller must never panic the host.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod ctrl;
pub mod engine;
pub mod error;
pub mod queue;
pub mod resv;

pub use ctrl::{discover, Controller, HostConfig, HostTls};
pub use engine::{Completion, Engine, EngineConfig, Xfer};
pub use error::{Error, Result};
pub use queue::{PollStats, Queue};
pub use trellis_nvme::pdu::Digests;

/// docs/host.md, included so that `cargo test --doc` compiles its examples.
#[cfg(doctest)]
#[doc = include_str!("../../../../docs/host.md")]
pub struct HostMdExamples;
