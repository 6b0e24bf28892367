//! Trellis storage node: an NVMe/TCP target.
//!
//! Layers, bottom up (as in Linux nvmet): `backend` (null, ram, file via
//! io_uring), `subsystem` (namespaces, controllers), `admin`/`io` (command
//! handlers, dispatched by opcode), `conn` (the sans-IO NVMe/TCP transport of
//! one queue), `reactor` (threads, sockets, polling) and `server` (listeners,
//! lifecycle). Only `reactor` and `server` touch sockets or threads.
//!
//! Nothing reachable from a peer may panic: unwrap and expect are denied
//! outside tests, and a panic that happens anyway (a bug) is caught by its
//! reactor, logged, and stops the target with an error (see `reactor`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod admin;
pub mod aen;
pub mod ana;
pub mod auth;
pub mod backend;
pub mod buf;
pub mod cmd;
pub mod config;
pub mod conn;
pub mod ctl;
pub mod ctl_disc;
pub mod ctl_state;
pub mod discovery;
pub mod exec;
pub mod fault;
#[doc(hidden)]
pub mod fuzzing;
pub mod ha;
pub mod identity;
pub mod io;
pub mod live;
pub mod livelisten;
pub mod livesub;
pub mod metrics;
pub mod nsset;
pub mod qos;
pub mod reactor;
pub mod resv;
pub mod ring;
pub mod rlimit;
pub mod server;
pub mod subsystem;
pub mod tls;
pub mod uring_net;

pub use config::Config;
pub use server::Target;

/// Locks a mutex whether or not it is poisoned. A poisoned lock means a
/// reactor panicked while holding it; that reactor's failure already stops
/// the target with an error, and the guarded data (controller maps, error
/// logs, feature values) stay usable for the other reactors to finish their
/// in-flight commands and tear down cleanly, so recovering the guard beats
/// spreading the panic to every thread that touches the lock.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
