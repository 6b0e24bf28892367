//! SAN traffic control co-designed with NVMe-oF ([NSDI'26]; rules, sources and the
//! §3.1–§3.4 labels used below: docs/isr.md, docs/sources.md).
//!
//! Sans-IO cores, each usable by a fabric node (adapter or switch) that passes
//! in the current time: the paper's three mechanisms and nothing else.
//! - [`isr`]: INT-assisted symmetric routing (per-hop telemetry, least-congested next hop,
//!   completion retraces the command's hops).
//! - [`reserve`]: eager bandwidth reservation for the predicted response.
//! - [`ssd_credit`]: storage-driven scheduling: the SSD credit (bandwidth headroom, MiB/s),
//!   host rate limit, packet rank. Not Gimbal's per-tenant I/O credits (`trellis-qos`).
//!
//! The end host's use of `isr` and `reserve` is `trellis-path`; the models of the
//! baseline and the transport that only the simulator needs (a switch's shared buffer,
//! TCP's RTO and send window) are `trellis_sim::net`.
//!
//! Everything concrete that the paper does not publish is a tagged reconstruction [R].

pub mod isr;
pub mod reserve;
pub mod ssd_credit;
