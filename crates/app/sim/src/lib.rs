//! Trellis SAN simulator: switched vs switchless NVMe-oF fabrics with the policy cores
//! that the target daemon (trellis-ssd, trellis-qos, trellis-fabric) and the host
//! (trellis-path) run, and its own models of switch buffers and TCP ([`net`]).

pub mod cli;
pub mod config;
pub mod cost;
pub mod engine;
pub mod fairness;
pub mod health_fleet;
pub mod metrics;
pub mod model;
pub mod net;
pub mod reproduce;
pub mod run;
pub mod svg;
pub mod sweep;
pub mod topo;
pub mod trace;
pub mod workload;

#[cfg(test)]
mod tests;
