//! SAN traffic control co-designed with NVMe-oF ([NSDI'26]; rules, sources and the
//! §3.1–§3.4 labels used below: docs/isr.md, docs/sources.md).
//!
//! Sans-IO cores, each usable by a fabric node (adapter or switch) that passes
//! in the current time: the paper's three mechanisms (`isr`, `reserve`,
//! `ssd_credit`) and three models of the baseline and the transport the
//! simulator needs (`shared_buffer`, `rto`, `tcp_window`):
//! - [`isr`]: INT-assisted symmetric routing (per-hop telemetry, least-congested next hop,
//!   completion retraces the command's hops).
//! - [`reserve`]: eager bandwidth reservation for the predicted response.
//! - [`shared_buffer`]: a switch's shared packet buffer with dynamic thresholds (not an
//!   NSDI'26 mechanism: the switched baseline's ToR, docs/sim.md).
//! - [`rto`]: the TCP retransmission timeout of one NVMe/TCP connection (transport, not an
//!   NSDI'26 mechanism; docs/sim.md).
//! - [`tcp_window`]: the ACK-clocked send window of one direction of an NVMe/TCP
//!   connection (transport, not an NSDI'26 mechanism; docs/sim.md).
//! - [`ssd_credit`]: storage-driven scheduling: the SSD credit (bandwidth headroom, MiB/s),
//!   host rate limit, packet rank. Not Gimbal's per-tenant I/O credits (`trellis-qos`).
//!
//! Everything concrete that the paper does not publish is a tagged reconstruction [R].

pub mod isr;
pub mod reserve;
pub mod rto;
pub mod shared_buffer;
pub mod ssd_credit;
pub mod tcp_window;
