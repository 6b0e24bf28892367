//! Every top-level parser of trellis-nvme on arbitrary bytes: each returns
//! a value or an error and none panics (the crate denies indexing, slicing
//! and truncating casts outside tests; this checks the behaviour, not the
//! lint). The cargo-fuzz target `fuzz/fuzz_targets/pdu_decode.rs` covers
//! the same decoders at depth; this runs on every `cargo test`.
//!
//! Inputs are plain random bytes, and random bytes behind a prefix that
//! steers them past the first check (a known PDU type and HLEN, an
//! authentication message type), so the decoders' later branches run too.
//! Bounded: inputs are at most 5 KiB (one byte past an Identify page and a
//! MAX_MSG_LEN authentication message), 512 cases per property.

use proptest::prelude::*;
use trellis_nvme::pdu::{self, CommonHeader, Digests, PduType};
use trellis_nvme::{ana, auth, dhchap, dhchap_host, fabrics, identify, log, resv, tls_psk};
use trellis_nvme::{Cqe, Sgl, Sqe};

/// Longest input: past a 4096-byte Identify page and MAX_MSG_LEN (4096).
const MAX_INPUT_BYTES: usize = 5 * 1024;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        ..ProptestConfig::default()
    }
}

/// Random bytes, or random bytes behind one of `prefixes`.
fn steered(prefixes: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let raw = proptest::collection::vec(any::<u8>(), 0..MAX_INPUT_BYTES);
    (
        proptest::sample::select(prefixes),
        raw.clone(),
        any::<bool>(),
    )
        .prop_map(|(p, mut b, steer)| {
            if steer {
                let n = p.len().min(b.len());
                b[..n].copy_from_slice(&p[..n]);
            }
            b
        })
}

/// A common header of each PDU type with its HLEN and a PLEN equal to the
/// bytes that follow (so check_layout often accepts it).
fn pdu_prefixes() -> Vec<Vec<u8>> {
    (0u8..=9)
        .flat_map(|t| {
            let hlen = PduType::from_u8(t).map_or(24, |t| t.hlen());
            [0u8, 0x01, 0x02, 0x03].map(|flags| {
                let mut h = vec![t, flags, hlen as u8, 0];
                h.extend_from_slice(&(hlen as u32 + 64).to_le_bytes());
                h
            })
        })
        .collect()
}

/// The (type, id) pairs of every authentication message.
fn auth_prefixes() -> Vec<Vec<u8>> {
    use auth::{auth_id, auth_type};
    [
        (auth_type::COMMON, auth_id::NEGOTIATE),
        (auth_type::COMMON, auth_id::FAILURE1),
        (auth_type::COMMON, auth_id::FAILURE2),
        (auth_type::DHCHAP, auth_id::CHALLENGE),
        (auth_type::DHCHAP, auth_id::REPLY),
        (auth_type::DHCHAP, auth_id::SUCCESS1),
        (auth_type::DHCHAP, auth_id::SUCCESS2),
    ]
    .into_iter()
    .flat_map(|(t, id)| {
        // NAPD 1 and a DH-HMAC-CHAP descriptor for Negotiate; small HL and
        // DHVLEN for the others, so the variable fields sometimes fit.
        [
            vec![t, id, 0, 0, 1, 0, 0, 1, 1],
            vec![t, id, 0, 0, 1, 0, 32, 0, 1, 0, 8, 0],
        ]
    })
    .collect()
}

/// Every decoder a PDU's bytes reach once `check_layout` accepts its header.
fn decode_pdu(data: &[u8]) {
    let Some(ch) = CommonHeader::decode(data) else {
        return;
    };
    for bits in 0..4u8 {
        for (ctl, bic) in [(true, true), (true, false), (false, true), (false, false)] {
            let Ok(l) = pdu::check_layout(&ch, ctl, bic, Digests::from_bits(bits), 1 << 20) else {
                continue;
            };
            assert!(l.header_total() <= l.plen, "layout past PLEN: {l:?}");
            let b = &data[..l.plen.min(data.len())];
            let _ = pdu::verify_header_digest(&l, b);
            match l.pdu_type {
                PduType::IcReq => drop(pdu::IcReq::decode(b)),
                PduType::IcResp => drop(pdu::IcResp::decode(b)),
                PduType::CapsuleCmd => decode_sqe(&Sqe::from_slice(b.get(8..).unwrap_or_default())),
                PduType::CapsuleResp => drop(Cqe::decode(b.get(8..).unwrap_or_default())),
                PduType::H2CData | PduType::C2HData => drop(pdu::DataHdr::decode(b)),
                PduType::R2T => drop(pdu::R2t::decode(b)),
                _ => drop(pdu::TermReq::decode(b)),
            }
        }
    }
}

/// Every decoder that reads fields of a submission queue entry.
fn decode_sqe(sqe: &Sqe) {
    let _ = (sqe.sgl(), sqe.nlb(), sqe.slba(), format!("{sqe:?}"));
    let _ = fabrics::ConnectCmd::decode(sqe);
    let _ = fabrics::PropertyCmd::decode(sqe);
    let _ = log::GetLogPage::decode(sqe);
    let _ = resv::RegisterCmd::decode(sqe);
    let _ = resv::AcquireCmd::decode(sqe);
    let _ = resv::ReleaseCmd::decode(sqe);
    let _ = auth::AuthCmd::decode(sqe);
}

/// Every decoder of a data buffer: log pages, Identify pages, Connect and
/// reservation data, as a host or a target receives them.
fn decode_data(b: &[u8]) {
    let _ = fabrics::ConnectData::decode(b);
    let _ = identify::IdCtrl::decode(b);
    let id_ns = identify::IdNs::decode(b);
    let _ = (id_ns.identity(), id_ns.block_size());
    let _ = log::DiscoveryEntry::decode(b);
    let _ = log::Smart::decode(b);
    let _ = ana::AnaLog::decode(b);
    let _ = resv::decode_keys(b);
    let _ = resv::decode_crkey(b);
    let _ = resv::decode_report_ext(b);
    let _ = resv::Notice::decode(b);
    let _ = trellis_nvme::get_cstr(b);
    // These read fixed offsets of a buffer their callers size (a debug build
    // asserts on a shorter one, a release build reads zeroes): fed the
    // minimum they document.
    if b.len() >= 24 {
        let _ = log::decode_discovery_header(b);
    }
    if b.len() >= 16 {
        let _ = (Sgl::decode(b), Cqe::decode(b));
    }
    for i in 0..b.len() / 4 {
        let _ = log::entry32(b, i);
    }
}

/// A host's DH-HMAC-CHAP state machine fed a peer's Challenge and Success1.
fn host_auth(b: &[u8]) {
    let secret = dhchap::Secret {
        key: vec![7; 32],
        transform: None,
    };
    let mut h = dhchap_host::HostAuth::new(
        secret,
        None,
        "nqn.2014-08.org.example:h",
        "nqn.2014-08.org.example:s",
    );
    let _ = h.reply(b, &mut |r| r.fill(3));
    let _ = h.success1(b);
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn pdu_decoders_never_panic(b in steered(pdu_prefixes())) {
        decode_pdu(&b);
    }

    #[test]
    fn data_decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..MAX_INPUT_BYTES)) {
        decode_data(&b);
    }

    #[test]
    fn auth_decoders_never_panic(b in steered(auth_prefixes())) {
        let _ = auth::Message::decode(&b);
        host_auth(&b);
    }

    #[test]
    fn key_and_identity_parsers_never_panic(b in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = tls_psk::Identity::parse(&b);
        let s = String::from_utf8_lossy(&b);
        let _ = dhchap::Secret::parse(&s);
        let _ = tls_psk::ConfiguredPsk::parse(&s);
        // Steered past the prefix checks to the indicator and base64 parts.
        let _ = dhchap::Secret::parse(&format!("DHHC-1:{s}"));
        let _ = tls_psk::ConfiguredPsk::parse(&format!("NVMeTLSkey-1:{s}"));
        let _ = tls_psk::Identity::parse(format!("NVMe1R0{s}").as_bytes());
    }
}

/// A peer's DH public value of any length and content gives a secret or
/// BadPublicValue (one modular exponentiation per case, hence fewer cases).
#[test]
fn dh_public_values_never_panic() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    let key = dhchap::DhKey::new(dhchap::DhGroup::Ffdhe2048, &[5; dhchap::PRIVATE_KEY_LEN])
        .expect("FFDHE group");
    let len = dhchap::DhGroup::Ffdhe2048.value_len_bytes();
    let value = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..2 * len),
        proptest::collection::vec(any::<u8>(), len..=len),
    ];
    runner
        .run(&value, |v| {
            let _ = key.shared_secret(&v);
            Ok(())
        })
        .expect("no panic");
}
