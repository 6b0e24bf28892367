//! NVMe commands: the opcode table (`cmd`), the execution context
//! (`exec`), and the admin, I/O and DH-HMAC-CHAP handlers (with the DH
//! workers, `auth_work`).

pub mod admin;
pub mod auth;
pub mod auth_work;
pub mod cmd;
pub mod connect;
pub mod exec;
pub mod health_log;
pub mod io;
