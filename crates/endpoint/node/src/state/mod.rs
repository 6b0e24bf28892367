//! What both planes read: the registry (subsystems, namespaces,
//! controllers, listeners), keys, tenants, ANA, AEN, reservations, the
//! discovery state, identity and stats. Control writes it through
//! snapshots and atomics (`nsset`); the data plane reads it. Imports only
//! `sys`, `config` and `backend`.

pub mod aen;
pub mod ana;
pub mod buf;
pub mod conns;
pub mod controller;
pub mod discovery;
pub mod drain;
pub mod fence;
pub mod gimbal;
pub mod health;
pub mod identity;
pub mod listeners;
pub mod nsset;
pub mod resv;
pub mod stats;
pub mod subsystem;
pub mod subsystems;
pub mod tenants;
