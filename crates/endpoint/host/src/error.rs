//! The one error type of the host library. Every failure is one of a few kinds,
//! so callers can decide what to do without parsing messages:
//! the transport broke, the controller said no, nobody answered in time, the
//! peer broke the NVMe/TCP protocol, in-band authentication failed, or the
//! caller misused the API.

use trellis_nvme::Status;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The TCP connection failed (connect refused, reset, EOF, ...).
    // Not `#[from]`: that would also make the io::Error the `source`, and
    // reports that print the chain (anyhow's `{:#}`) would show it twice.
    #[error("transport error: {0}")]
    Transport(std::io::Error),
    /// The controller completed a command with a non-success status.
    #[error("NVMe status: {0}")]
    Nvme(Status),
    /// A connect, command or keep-alive did not complete in time.
    #[error("timeout: {0}")]
    Timeout(String),
    /// The controller sent something NVMe/TCP does not allow (bad PDU, unknown
    /// CID, short data, bad digest, TermReq). The queue is unusable afterwards.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// DH-HMAC-CHAP failed: the controller refused the host, the host refused
    /// the controller, or the subsystem asks for a secret the host was not
    /// given. Nothing is wrong with the protocol: a key or the configuration is.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The caller broke the API contract (a slot it does not own, a transfer
    /// larger than the slot buffer). Nothing was sent; the queue is intact.
    #[error("invalid use: {0}")]
    Usage(String),
    /// The target's I/O credits are all in use (Gimbal's Algorithm 3: the
    /// device is "busy"); nothing was sent and the queue is intact. Submit
    /// again after a completion.
    #[error("busy: the target's I/O credits ({0}) are all in use")]
    Busy(u32),
}

impl Error {
    pub fn protocol(what: impl Into<String>) -> Error {
        Error::Protocol(what.into())
    }
    /// A copy for re-reporting a queue's terminal error on every later call
    /// (io::Error is not Clone, so the kind and message are carried over).
    pub fn duplicate(&self) -> Error {
        match self {
            Error::Transport(e) => Error::Transport(std::io::Error::new(e.kind(), e.to_string())),
            Error::Nvme(s) => Error::Nvme(*s),
            Error::Timeout(s) => Error::Timeout(s.clone()),
            Error::Protocol(s) => Error::Protocol(s.clone()),
            Error::Auth(s) => Error::Auth(s.clone()),
            Error::Usage(s) => Error::Usage(s.clone()),
            Error::Busy(n) => Error::Busy(*n),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Transport(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;
