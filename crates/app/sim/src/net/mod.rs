//! Models of the network and the transport that only the simulator needs.
//!
//! Not policies: a real fabric gets these from its switch silicon and the
//! kernel's TCP stack, so no daemon or host runs them. They were in
//! `trellis-fabric` beside the NSDI'26 mechanisms; they live here so that
//! crate holds only what a fabric node would run. Sans-IO and integer-only
//! (time in ns), so runs replay bit-identically.
//! - [`shared_buffer`]: a switch's shared packet buffer with dynamic
//!   thresholds (the switched baseline's ToR, docs/sim.md).
//! - [`rto`]: the TCP retransmission timeout of one NVMe/TCP connection.
//! - [`tcp_window`]: the ACK-clocked send window of one direction of an
//!   NVMe/TCP connection.

pub mod rto;
pub mod shared_buffer;
pub mod tcp_window;
