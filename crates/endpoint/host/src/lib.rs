//! Trellis host: a user-space NVMe/TCP initiator.
//!
//! - [`engine`]: the sans-IO queue pair (slots, PDUs in and out, checks).
//! - [`queue`]: one queue pair on a non-blocking socket, busy-polled by the
//!   thread that owns it (one gathered `sendmsg` and one `recv` per poll).
//! - [`ctrl`]: admin queue, controller enable/identify, I/O queue creation,
//!   Keep Alive, discovery.
//! - [`switch`]: blk-switch on the compute node: per-(core, class) egress queues,
//!   latency before throughput, i10 caravans, request and application steering.
//! - [`replica`]: which replica of a replicated volume serves a read (round-robin,
//!   or Gimbal's credit headroom).
//! - [`multipath`]: the paths of a multipath volume: ANA states, reservations
//!   and the path policy (round-robin, queue-depth, ISR) in one sans-IO core.
//! - [`resv`]: NVMe persistent reservations (Register, Acquire, Release,
//!   Report, the notification log and PTPL).
//! - [`reserve`]: eager bandwidth reservation at the host edge: each path's
//!   response rate reserved before a read goes out (NSDI'26 §3.2).
//!
//! Every encode and decode goes through `trellis-nvme`, the same crate the
//! target uses. See `docs/host.md` for the design and API walk-through.

// No unwrap/expect outside tests: a peer or a caller must never panic the host.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod ctrl;
pub mod engine;
pub mod error;
pub mod multipath;
pub mod queue;
pub mod replica;
pub mod reserve;
pub mod resv;
pub mod switch;

pub use ctrl::{discover, Controller, HostConfig, HostTls};
pub use engine::{Completion, Engine, EngineConfig, Xfer};
pub use error::{Error, Result};
pub use queue::{PollStats, Queue};
pub use trellis_nvme::pdu::Digests;

/// docs/host.md, included so that `cargo test --doc` compiles its examples.
#[cfg(doctest)]
#[doc = include_str!("../../../../docs/host.md")]
pub struct HostMdExamples;
