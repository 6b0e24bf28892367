//! Trellis storage node: an NVMe/TCP target.
//!
//! Three wings over two foundations, with `server` on top as the only module
//! that sees everything (docs/architecture.md has the picture and the rules):
//!
//! - `sys`: leaves (clock, locks, CPU placement, the io_uring ring, fault
//!   injection); `config`: the configuration's types, serde and
//!   self-contained checks; `backend`: null, ram, file (io_uring) and the
//!   emulated SSD.
//! - `state`: what both planes read: the registry of subsystems,
//!   namespaces and controllers, keys, tenants, ANA, AEN, reservations,
//!   identity, stats. It imports only `sys`, `config` and `backend`.
//! - `data`: the I/O path: `data::tcp` (reactor, the sans-IO connection,
//!   socket engines, TLS) and `data::nvme` (the command table, admin, I/O,
//!   fabrics, authentication handlers), and the Gimbal decorator `data::qos`.
//!   It never imports `control`.
//! - `control`: the management plane: the JSON-RPC socket, the live
//!   changes, the HA lease, metrics. It never imports `data`.
//!
//! Nothing reachable from a peer may panic: unwrap and expect are denied
//! outside tests, and a panic that happens anyway (a bug) is caught by its
//! reactor, logged, and stops the target with an error (see
//! `data::tcp::reactor`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod backend;
pub mod config;
pub mod control;
pub mod data;
#[doc(hidden)]
pub mod fuzzing;
pub mod server;
pub mod state;
pub mod sys;

pub use config::Config;
pub use server::Target;
