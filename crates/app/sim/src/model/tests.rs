//! Unit tests of the model's internals: the ECMP hash, I/O slot generations
//! and PDU sizes.

use super::routing::mix64;
use super::*;
use trellis_units::IoDir;

/// ECMP choices in recorded results depend on this hash: it must stay
/// the former hand-written splitmix64 finalizer.
#[test]
fn mix64_is_the_splitmix64_finalizer() {
    let former = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    for z in [0u64, 1, 42, 1 << 32 | 7, u64::MAX, 0x9E37_79B9_7F4A_7C15] {
        assert_eq!(mix64(z), former(z), "{z:#x}");
    }
}

/// A freed I/O slot is reused at once (the free list is last in, first out): the new
/// I/O must start at a later generation, or a packet of the earlier I/O (one of a
/// lost attempt, still queued somewhere) would be taken for one of the new I/O's.
#[test]
fn a_reused_io_slot_starts_at_the_next_generation() {
    let mut sim = Sim::new(SimConfig::default()).unwrap();
    let spec = IoSpec {
        ssd: 0,
        op: IoDir::Read,
        size_bytes: 4096,
        offset_bytes: 0,
        ctx: 0,
    };
    let a = sim.alloc_io(0, 0, spec, 0);
    sim.ios.get_mut(a).gen = 7; // resent 7 times
    sim.free_io(a);
    let b = sim.alloc_io(0, 0, spec, 0);
    assert_eq!(a, b, "the slot is reused");
    assert_eq!(sim.ios.get(b).gen, 8);
}

/// PDU sizes as NVMe/TCP puts them on the wire (no digests): CapsuleCmd 72 B (+ data
/// in the capsule), C2HData / H2CData / R2T / CapsuleResp headers 24 B.
#[test]
fn pdu_sizes_follow_nvme_tcp() {
    let mut sim = Sim::new(SimConfig::default()).unwrap();
    let mut size_of = |op: IoDir, size_bytes: u32, msg: Msg| {
        let spec = IoSpec {
            ssd: 0,
            op,
            size_bytes,
            offset_bytes: 0,
            ctx: 0,
        };
        let io = sim.alloc_io(0, 0, spec, 0);
        let b = sim.msg_bytes(io, msg);
        sim.free_io(io);
        b
    };
    assert_eq!(size_of(IoDir::Read, 4096, Msg::Command), 72);
    assert_eq!(size_of(IoDir::Read, 4096, Msg::Response), 24 + 4096 + 24);
    // In-capsule (16 KiB limit): one CapsuleCmd with the data, one CapsuleResp.
    assert_eq!(size_of(IoDir::Write, 4096, Msg::Command), 72 + 4096);
    assert_eq!(size_of(IoDir::Write, 4096, Msg::Response), 24);
    // Beyond it: bare command, R2T, H2CData, CapsuleResp.
    assert_eq!(size_of(IoDir::Write, 65536, Msg::Command), 72);
    assert_eq!(size_of(IoDir::Write, 65536, Msg::R2t), 24);
    assert_eq!(size_of(IoDir::Write, 65536, Msg::WriteData), 24 + 65536);
    assert_eq!(size_of(IoDir::Write, 65536, Msg::Response), 24);
}
