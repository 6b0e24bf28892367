//! `trellis san`: the NSDI'26 study's 4-node SAN, switched or switchless,
//! emulated on one machine with network namespaces, veth links shaped by
//! `tc tbf`, and a `trellis target` in every storage node.
//!
//! - [`topo`]: the shared testbed description (`trellis_topology::testbed`)
//!   laid out as namespaces, veths, addresses and the client's paths;
//! - [`plan`]: the commands that build them (pure, tested without root);
//! - [`cli`]: `up`, `status`, `link`, `exec`, `down`, and the state file.
//!
//! docs/san.md.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod cli;
pub mod plan;
pub mod topo;
