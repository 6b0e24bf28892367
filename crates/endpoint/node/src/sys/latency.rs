//! The log2 latency buckets every histogram of the node shares: the data
//! plane's per-namespace counters (`state::stats`), `/metrics`, and a
//! drive's own service times (`Backend::drive_read_latency`). Here, below
//! every wing, so the backends can count in them too.

/// Latency histogram buckets: bucket i counts commands that took less than
/// 2^i µs (the last one everything longer), from 1 µs to 2^25 µs ≈ 34 s.
pub const LAT_BUCKETS: usize = 26;

/// The bucket of a latency in ns: ⌈log2(µs)⌉, one instruction plus a clamp.
#[inline]
pub fn lat_bucket(ns: u64) -> usize {
    let us = ns / 1000;
    ((u64::BITS - us.leading_zeros()) as usize).min(LAT_BUCKETS - 1)
}
