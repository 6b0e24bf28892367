//! NVMe/TCP: the reactor (threads, sockets, polling), the sans-IO
//! connection state machine of one queue (`conn`), the io_uring socket
//! engine, and TLS (PSK lookup and server configuration).

pub mod conn;
pub mod reactor;
pub mod tls;
pub mod uring_net;
