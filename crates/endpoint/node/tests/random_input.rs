//! Random and mutated byte streams must never panic the connection state
//! machine (the same harness `cargo fuzz` drives; this runs on every test).

use proptest::prelude::*;
use trellis_node::fuzzing::{feed, prefix};

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = feed(&data);
    }

    /// Valid prefixes with random bytes flipped reach deeper states.
    #[test]
    fn mutated_valid_streams_never_panic(sel in 0u8..16, flips in proptest::collection::vec((0usize..2000, any::<u8>()), 0..8), tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let dg = trellis_nvme::pdu::Digests::from_bits(sel & 3);
        let mut v = prefix(dg, Some((0, 0xFFFF)));
        v.extend_from_slice(&tail);
        for (i, b) in flips {
            let n = v.len();
            v[i % n] ^= b;
        }
        let mut input = vec![sel & 3]; // mode 0: the stream as given
        input.extend_from_slice(&v);
        let _ = feed(&input);
    }
}
