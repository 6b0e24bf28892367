//! Trellis storage node: an NVMe/TCP target.
//!
//! Layers, bottom up (as in Linux nvmet): `backend` (null, ram, file via
//! io_uring), `subsystem` (namespaces, controllers), `admin`/`io` (command
//! handlers, dispatched by opcode), `conn` (the sans-IO NVMe/TCP transport of
//! one queue), `reactor` (threads, sockets, polling) and `server` (listeners,
//! lifecycle). Only `reactor` and `server` touch sockets or threads.

pub mod admin;
pub mod backend;
pub mod buf;
pub mod config;
pub mod conn;
#[doc(hidden)]
pub mod fuzzing;
pub mod identity;
pub mod io;
pub mod reactor;
pub mod server;
pub mod subsystem;
pub mod tx;
pub mod uring_net;

pub use config::Config;
pub use server::Target;
