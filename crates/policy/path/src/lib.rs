//! Trellis path policy: the sans-IO cores that decide where an initiator's
//! I/O goes, shared by the host library's users (`trellis bench`) and the
//! simulator.
//!
//! - [`switch`]: blk-switch on the compute node: per-(core, class) egress queues,
//!   latency before throughput, i10 caravans, request and application steering.
//! - [`replica`]: which replica of a replicated volume serves a read (round-robin,
//!   Gimbal's credit headroom, queue depth), and ISR at the end host
//!   ([`replica::IsrPaths`]).
//! - [`multipath`]: the paths of a multipath volume: ANA states, reservations
//!   and the path policy (round-robin, queue-depth, ISR) in one sans-IO core.
//! - [`reserve`]: eager bandwidth reservation at the host edge: each path's
//!   response rate reserved before a read goes out (NSDI'26 §3.2).
//!
//! Like every crate under `crates/policy/`, no socket, thread, clock or C
//! library: time is a u64 of ns passed in, so `trellis bench` drives these
//! cores on the wall clock and `trellis sim` on a virtual one. The host's
//! reservation *commands* (NVMe Reservation Register and the rest) do I/O and
//! stay in `trellis_host::resv`. docs/host.md walks through each core.

// No unwrap/expect outside tests: a peer or a caller must never panic the host.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod multipath;
pub mod replica;
pub mod reserve;
pub mod switch;
