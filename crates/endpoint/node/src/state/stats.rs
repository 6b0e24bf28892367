//! Counters and histogram buckets shared by the data plane (which writes
//! them) and `/metrics` (which reads them).

use std::sync::atomic::AtomicU64;

/// A counter alone on its cache line: one reactor writes it, scrapes read it.
#[derive(Default)]
#[repr(align(64))]
pub struct PaddedCounter(pub AtomicU64);

pub use crate::sys::latency::{lat_bucket, LAT_BUCKETS};

/// Why a connection closed, in the classes `/metrics` counts
/// (`trellis_connections_closed_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseKind {
    /// The host closed the socket (after a clean shutdown or not).
    PeerClosed,
    /// A malformed or forbidden PDU: C2HTermReq sent, or H2CTermReq received.
    ProtocolError,
    /// No Connect in time, or the keep-alive timer expired.
    Timeout,
    /// The socket failed (reset, send or receive error).
    TransportError,
    /// Its controller was torn down (its admin queue went away).
    ControllerGone,
    /// Anything else (target shutdown, a reactor failure).
    Other,
}

impl CloseKind {
    pub const ALL: [CloseKind; 6] = [
        CloseKind::PeerClosed,
        CloseKind::ProtocolError,
        CloseKind::Timeout,
        CloseKind::TransportError,
        CloseKind::ControllerGone,
        CloseKind::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CloseKind::PeerClosed => "peer_closed",
            CloseKind::ProtocolError => "protocol_error",
            CloseKind::Timeout => "timeout",
            CloseKind::TransportError => "transport_error",
            CloseKind::ControllerGone => "controller_gone",
            CloseKind::Other => "other",
        }
    }
}
