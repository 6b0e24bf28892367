//! Every decoder in trellis-nvme on arbitrary bytes: layout validation
//! must never return parts outside PLEN, and no decoder may panic once the
//! layout says the bytes are there; nor may the ANA log, reservation and
//! authentication decoders, or the DHHC-1 secret parser, on any bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trellis_nvme::pdu::{self, CommonHeader, Digests};

fuzz_target!(|data: &[u8]| {
    // Log pages a host decodes: any bytes give a value or an error.
    let _ = trellis_nvme::ana::AnaLog::decode(data);
    let _ = trellis_nvme::resv::decode_report_ext(data);
    let _ = trellis_nvme::resv::Notice::decode(data);
    // In-band authentication: a message from a peer, and a DHHC-1 secret from a config.
    let _ = trellis_nvme::auth::Message::decode(data);
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = trellis_nvme::dhchap::Secret::parse(s);
    }
    let Some(ch) = CommonHeader::decode(data) else { return };
    for bits in 0..4u8 {
        for (ctl, bic) in [(true, true), (true, false), (false, true), (false, false)] {
            let Ok(l) = pdu::check_layout(&ch, ctl, bic, Digests::from_bits(bits), 1 << 20) else { continue };
            assert!(l.header_total() <= l.plen);
            if data.len() < l.plen {
                continue;
            }
            let b = &data[..l.plen];
            let _ = pdu::verify_header_digest(&l, b);
            match l.pdu_type {
                pdu::PduType::IcReq => drop(pdu::IcReq::decode(b)),
                pdu::PduType::IcResp => drop(pdu::IcResp::decode(b)),
                pdu::PduType::CapsuleCmd => {
                    let sqe = trellis_nvme::Sqe::from_slice(&b[8..72]);
                    let _ = (sqe.sgl(), sqe.nlb(), sqe.slba());
                    let _ = trellis_nvme::fabrics::ConnectCmd::decode(&sqe);
                    let _ = trellis_nvme::log::GetLogPage::decode(&sqe);
                    let _ = trellis_nvme::resv::RegisterCmd::decode(&sqe);
                    let _ = trellis_nvme::resv::AcquireCmd::decode(&sqe);
                    let _ = trellis_nvme::resv::ReleaseCmd::decode(&sqe);
                    let _ = trellis_nvme::auth::AuthCmd::decode(&sqe);
                    let data = b.get(l.data_off..).unwrap_or_default();
                    let _ = trellis_nvme::resv::decode_keys(data);
                    let _ = trellis_nvme::resv::decode_crkey(data);
                    if l.data_len >= 1024 {
                        let _ = trellis_nvme::fabrics::ConnectData::decode(&b[l.data_off..]);
                    }
                }
                pdu::PduType::CapsuleResp => drop(trellis_nvme::Cqe::decode(&b[8..24])),
                pdu::PduType::H2CData | pdu::PduType::C2HData => drop(pdu::DataHdr::decode(b)),
                pdu::PduType::R2T => drop(pdu::R2t::decode(b)),
                _ => drop(pdu::TermReq::decode(b)),
            }
        }
    }
});
