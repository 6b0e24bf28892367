//! Test harnesses for Trellis, kept out of the production crates
//! (`publish = false`; used only as a dev-dependency).
//!
//! - [`raw`]: NVMe/TCP over blocking sockets, byte by byte: read whole PDUs,
//!   build well-formed or deliberately malformed ones.
//! - [`initiator`]: a blocking, one-command-at-a-time initiator whose ordinary
//!   I/O runs through the host library's engine (`trellis_host::Engine`),
//!   with raw escape hatches for tests that must forge input.
//! - [`fake_target`]: a small, deliberately breakable target, for tests of
//!   the host library and of `trellis bench`.

pub mod fake_target;
pub mod initiator;
pub mod raw;
