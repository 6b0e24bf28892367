//! SAN traffic control co-designed with NVMe-oF (NSDI'26, algorithms.md §3).
//!
//! Three sans-IO mechanisms, each usable by a fabric node (adapter or switch)
//! that passes in the current time:
//! - [`isr`]: INT-assisted symmetric routing (per-hop telemetry, least-congested next hop,
//!   completion retraces the command's hops).
//! - [`reserve`]: eager bandwidth reservation for the predicted response.
//! - [`credit`]: storage-driven scheduling: SSD headroom credits, host rate limit, packet rank.
//!
//! Everything concrete that the paper does not publish is a tagged reconstruction [R].

pub mod credit;
pub mod isr;
pub mod reserve;
