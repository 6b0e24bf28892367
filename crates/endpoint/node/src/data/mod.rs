//! The I/O path: the NVMe/TCP transport (`tcp`), the command handlers
//! (`nvme`), and the Gimbal scheduler decorator (`qos`). Reads `state`;
//! never imports `control`.

pub mod nvme;
pub mod qos;
pub mod tcp;
