//! The target's whole per-connection state machine (framing, ICReq,
//! Connect, admin and I/O commands, R2T/H2CData) fed arbitrary byte streams.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = trellis_node::fuzzing::feed(data);
});
