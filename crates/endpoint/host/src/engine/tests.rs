//! Byte-level tests of the queue-pair engine: no sockets, no threads.

use super::*;
use trellis_nvme::sqe::io;

const NO: Digests = Digests {
    header: false,
    data: false,
};
const BOTH: Digests = Digests {
    header: true,
    data: true,
};

fn engine(d: Digests, maxh2cdata: u32) -> Engine {
    let mut e = Engine::new(EngineConfig {
        qid: 1,
        queue_size: 8,
        digests: d,
        buf_bytes: 64 << 10,
        staging_bytes: 8192,
        max_pdu_bytes: (64 << 10) + 512,
        command_timeout: Duration::from_millis(50),
        credit_token: None,
        credit_share: 1,
    });
    e.start();
    let ic = e.take_output();
    assert_eq!(ic.len(), IC_LEN);
    assert_eq!(IcReq::decode(&ic).digests, d);
    let mut r = [0u8; IC_LEN];
    IcResp {
        pfv: 0,
        cpda: 0,
        digests: d,
        maxh2cdata,
    }
    .encode(&mut r);
    e.feed(&r, 0).unwrap();
    assert!(e.ic_done());
    e.set_icd_bytes(4096);
    e
}

fn resp(cid: u16, d: Digests) -> Vec<u8> {
    let mut b = [0u8; 32];
    let n = pdu::encode_capsule_resp(
        &mut b,
        &Cqe {
            cid,
            ..Default::default()
        },
        d,
    );
    b[..n].to_vec()
}

fn c2h(cid: u16, off: u32, data: &[u8], fl: u8, d: Digests) -> Vec<u8> {
    let mut h = [0u8; 32];
    let dh = DataHdr {
        cccid: cid,
        ttag: 0,
        datao: off,
        datal: data.len() as u32,
    };
    let n = pdu::encode_data_hdr(&mut h, PduType::C2HData, &dh, fl, d);
    let mut v = h[..n].to_vec();
    v.extend_from_slice(data);
    if d.data {
        v.extend_from_slice(&crc::digest(data).to_le_bytes());
    }
    v
}

fn submit_read(e: &mut Engine, len: u32) -> (u16, u16) {
    let s = e.alloc().unwrap();
    e.submit(s, rw_sqe(io::READ, 1, 0, len / 512), Xfer::FromCtrl(len), 0)
        .unwrap();
    (s, e.cid_of(s))
}

#[test]
fn icresp_digest_mismatch_is_a_protocol_error() {
    let mut e = Engine::new(EngineConfig {
        digests: BOTH,
        ..Default::default()
    });
    e.start();
    e.take_output();
    let mut r = [0u8; IC_LEN];
    IcResp {
        pfv: 0,
        cpda: 0,
        digests: NO,
        maxh2cdata: 8192,
    }
    .encode(&mut r);
    let err = e.feed(&r, 0).unwrap_err();
    assert!(
        matches!(err, Error::Protocol(ref m) if m.contains("digests")),
        "{err}"
    );
    // The queue stays failed.
    assert!(e.check().is_err());
}

#[test]
fn read_in_several_pdus_fed_one_byte_at_a_time_with_digests() {
    let mut e = engine(BOTH, 8192);
    let (slot, cid) = submit_read(&mut e, 8192);
    let cmd = e.take_output();
    // CapsuleCmd with header digest and no data: 72 + 4 bytes, transport SGL.
    assert_eq!(cmd.len(), 76);
    let sqe = Sqe::from_slice(&cmd[8..72]);
    assert_eq!(sqe.cid(), cid);
    assert_eq!(sqe.sgl(), Sgl::transport(8192));
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    let mut wire = c2h(cid, 0, &data[..3000], 0, BOTH);
    wire.extend(c2h(cid, 3000, &data[3000..], flags::LAST_PDU, BOTH));
    wire.extend(resp(cid, BOTH));
    for b in &wire {
        e.feed(std::slice::from_ref(b), 0).unwrap();
    }
    let c = e.next_completion().expect("completed");
    assert_eq!((c.slot, c.status), (slot, Status::SUCCESS));
    assert_eq!(&e.buf(slot)[..8192], &data[..]);
    assert_eq!(e.inflight(), 0);
}

#[test]
fn large_payload_is_received_directly_into_the_slot_buffer() {
    let mut e = engine(NO, 8192);
    let (slot, cid) = submit_read(&mut e, 32768);
    e.take_output();
    let data: Vec<u8> = (0..32768u32).map(|i| (i % 251) as u8).collect();
    let mut wire = c2h(cid, 0, &data, flags::LAST_PDU | flags::SUCCESS, NO);
    // Header only first, so staging is empty when the payload arrives.
    let rest = wire.split_off(24);
    e.feed(&wire, 0).unwrap();
    let space = e.recv_space();
    assert!(
        space.len() >= 32768,
        "direct receive covers the whole payload"
    );
    space[..32768].copy_from_slice(&rest);
    e.recv_done(32768, 0).unwrap();
    let c = e
        .next_completion()
        .expect("SUCCESS flag completes without a CapsuleResp");
    assert_eq!(c.slot, slot);
    assert_eq!(&e.buf(slot)[..32768], &data[..]);
}

#[test]
fn small_write_goes_in_capsule_and_large_write_answers_r2t_in_maxh2cdata_chunks() {
    let mut e = engine(BOTH, 4096);
    let s = e.alloc().unwrap();
    e.buf_mut(s)[..4096].fill(0xAB);
    e.submit(s, rw_sqe(io::WRITE, 1, 8, 8), Xfer::ToCtrl(4096), 0)
        .unwrap();
    let out = e.take_output();
    // 72 header + 4 HDGST + 4096 data + 4 DDGST.
    assert_eq!(out.len(), 72 + 4 + 4096 + 4);
    assert_eq!(Sqe::from_slice(&out[8..72]).sgl(), Sgl::in_capsule(4096));
    assert_eq!(out[3] as usize, 76, "PDO right after the header digest");

    let s2 = e.alloc().unwrap();
    e.buf_mut(s2)[..10000].fill(0xCD);
    e.submit(s2, rw_sqe(io::WRITE, 1, 0, 20), Xfer::ToCtrl(10240), 0)
        .unwrap();
    let out = e.take_output();
    assert_eq!(out.len(), 76, "no in-capsule data above the ICD limit");
    let cid = e.cid_of(s2);
    let mut r = [0u8; 32];
    let n = pdu::encode_r2t(
        &mut r,
        &R2t {
            cccid: cid,
            ttag: 9,
            r2to: 0,
            r2tl: 10240,
        },
        BOTH,
    );
    e.feed(&r[..n], 0).unwrap();
    let out = e.take_output();
    // Three H2CData PDUs: 4096, 4096, 2048 bytes, LAST only on the final one.
    let mut off = 0;
    let mut seen = vec![];
    while off < out.len() {
        let ch = CommonHeader::decode(&out[off..]).unwrap();
        assert_eq!(ch.pdu_type, PduType::H2CData as u8);
        let dh = DataHdr::decode(&out[off..]);
        assert_eq!((dh.cccid, dh.ttag), (cid, 9));
        seen.push((dh.datao, dh.datal, ch.flags & flags::LAST_PDU != 0));
        off += ch.plen as usize;
    }
    assert_eq!(
        seen,
        vec![(0, 4096, false), (4096, 4096, false), (8192, 2048, true)]
    );
    e.feed(&resp(cid, BOTH), 0).unwrap();
    assert_eq!(e.next_completion().unwrap().slot, s2);
}

#[test]
fn unknown_cid_fails_the_queue_and_keeps_failing() {
    let mut e = engine(NO, 8192);
    let (_, cid) = submit_read(&mut e, 512);
    e.take_output();
    let err = e.feed(&resp(cid ^ 0x8000, NO), 0).unwrap_err();
    assert!(
        matches!(err, Error::Protocol(ref m) if m.contains("unknown command id")),
        "{err}"
    );
    let again = e.feed(&resp(cid, NO), 0).unwrap_err();
    assert!(matches!(again, Error::Protocol(_)));
    let s = e.alloc().unwrap();
    assert!(e
        .submit(s, rw_sqe(io::READ, 1, 0, 1), Xfer::FromCtrl(512), 0)
        .is_err());
}

#[test]
fn completion_before_all_read_data_is_short_data() {
    let mut e = engine(NO, 8192);
    let (_, cid) = submit_read(&mut e, 4096);
    e.take_output();
    let mut wire = c2h(cid, 0, &[1; 2048], 0, NO);
    wire.extend(resp(cid, NO));
    let err = e.feed(&wire, 0).unwrap_err();
    assert!(
        matches!(err, Error::Protocol(ref m) if m.contains("short data")),
        "{err}"
    );
}

#[test]
fn data_beyond_the_command_or_out_of_order_is_rejected() {
    let mut e = engine(NO, 8192);
    let (_, cid) = submit_read(&mut e, 1024);
    e.take_output();
    let err = e
        .feed(&c2h(cid, 512, &[0; 512], flags::LAST_PDU, NO), 0)
        .unwrap_err();
    assert!(
        matches!(err, Error::Protocol(ref m) if m.contains("out of range")),
        "{err}"
    );
}

#[test]
fn bad_data_digest_and_host_only_pdu_are_protocol_errors() {
    let mut e = engine(BOTH, 8192);
    let (_, cid) = submit_read(&mut e, 512);
    e.take_output();
    let mut w = c2h(cid, 0, &[3; 512], flags::LAST_PDU, BOTH);
    let n = w.len();
    w[n - 1] ^= 0xff;
    let err = e.feed(&w, 0).unwrap_err();
    assert!(
        matches!(err, Error::Protocol(ref m) if m.contains("digest")),
        "{err}"
    );

    let mut e = engine(NO, 8192);
    let (_, cid) = submit_read(&mut e, 512);
    e.take_output();
    let mut h = [0u8; 32];
    let dh = DataHdr {
        cccid: cid,
        ttag: 0,
        datao: 0,
        datal: 4,
    };
    let n = pdu::encode_data_hdr(&mut h, PduType::H2CData, &dh, 0, NO);
    let mut w = h[..n].to_vec();
    w.extend([0; 4]);
    let err = e.feed(&w, 0).unwrap_err();
    assert!(
        matches!(err, Error::Protocol(ref m) if m.contains("bad PDU header")),
        "{err}"
    );
}

#[test]
fn term_req_is_reported_with_its_fes() {
    let mut e = engine(NO, 8192);
    let mut b = [0u8; 200];
    let n = pdu::encode_term_req(
        &mut b,
        PduType::C2HTermReq,
        trellis_nvme::Fatal::new(pdu::fes::HEADER_DIGEST_ERROR, 0),
        &[0xAA; 30],
    );
    let err = e.feed(&b[..n], 0).unwrap_err();
    assert!(
        matches!(err, Error::Protocol(ref m) if m.contains("Header Digest Error")),
        "{err}"
    );
}

#[test]
fn outstanding_command_times_out() {
    let mut e = engine(NO, 8192);
    let t0 = 0;
    let s = e.alloc().unwrap();
    e.submit(s, rw_sqe(io::READ, 1, 0, 1), Xfer::FromCtrl(512), t0)
        .unwrap();
    e.check_timeouts(t0 + 10_000_000).unwrap();
    let err = e.check_timeouts(t0 + 60_000_000).unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err}");
}

#[test]
fn partial_sends_resume_mid_segment() {
    let mut e = engine(NO, 8192);
    let s = e.alloc().unwrap();
    e.buf_mut(s)[..512].fill(0x5A);
    e.submit(s, rw_sqe(io::WRITE, 1, 0, 1), Xfer::ToCtrl(512), 0)
        .unwrap();
    let mut all = Vec::new();
    // Take 50 bytes at a time, as a socket with a tiny buffer would.
    while e.has_output() {
        let mut chunk = Vec::new();
        e.for_each_output(|b| {
            chunk.extend_from_slice(b);
            chunk.len() < 50
        });
        chunk.truncate(50);
        e.sent(chunk.len());
        all.extend(chunk);
    }
    assert_eq!(all.len(), 72 + 512);
    assert!(all[72..].iter().all(|&b| b == 0x5A));
}

#[test]
fn slots_are_reused_with_a_new_generation() {
    let mut e = engine(NO, 8192);
    let (slot, cid1) = submit_read(&mut e, 512);
    e.take_output();
    let mut w = c2h(cid1, 0, &[0; 512], flags::LAST_PDU, NO);
    w.extend(resp(cid1, NO));
    e.feed(&w, 0).unwrap();
    e.next_completion().unwrap();
    e.submit(slot, rw_sqe(io::READ, 1, 0, 1), Xfer::FromCtrl(512), 0)
        .unwrap();
    let cid2 = e.cid_of(slot);
    assert_ne!(cid1, cid2);
    assert_eq!(cid1 & 0xfff, cid2 & 0xfff);
    // A late duplicate completion for the old generation is a protocol error.
    assert!(e.feed(&resp(cid1, NO), 0).is_err());
}

/// A CapsuleResp for `cid` with result DW1 = `dw1`.
fn resp_dw1(cid: u16, dw1: u32) -> Vec<u8> {
    let mut b = [0u8; 32];
    let cqe = Cqe {
        cid,
        dw1,
        ..Default::default()
    };
    let n = pdu::encode_capsule_resp(&mut b, &cqe, NO);
    b[..n].to_vec()
}

#[test]
fn credits_are_taken_only_from_completions_that_echo_the_token() {
    let token = std::num::NonZeroU16::new(0x7e11).unwrap();
    let mut e = engine(NO, 8192);
    e.cfg.credit_token = Some(token);
    let s = e.alloc().unwrap();
    e.submit(s, rw_sqe(io::WRITE, 1, 0, 1), Xfer::None, 0)
        .unwrap();
    let out = e.take_output();
    // The capsule's SQE starts after the 8-byte common header; CDW2 is byte 8 of it.
    let cdw2 = trellis_nvme::le32(&out[8..], 8);
    assert_eq!(cdw2 & 0xFFFF, 0x7e11, "the token rides in CDW2[15:0]");
    // A target without credits (DW1 = 0): nothing learnt.
    e.feed(&resp_dw1(e.cid_of(s), 0), 0).unwrap();
    assert_eq!(e.io_credits(), None);
    // A result that does not echo the token is not a credit.
    e.submit(s, rw_sqe(io::WRITE, 1, 0, 1), Xfer::None, 0)
        .unwrap();
    e.feed(&resp_dw1(e.cid_of(s), 0x1234_0040), 0).unwrap();
    assert_eq!(e.io_credits(), None);
    // The echo: DW1[15:0] is the tenant's credit.
    e.submit(s, rw_sqe(io::WRITE, 1, 0, 1), Xfer::None, 0)
        .unwrap();
    e.feed(&resp_dw1(e.cid_of(s), 0x7e11_0080), 0).unwrap();
    assert_eq!(e.io_credits(), Some(0x80));
    // Without a token, CDW2 is left as the caller set it and nothing is read.
    let mut plain = engine(NO, 8192);
    let s = plain.alloc().unwrap();
    plain
        .submit(s, rw_sqe(io::WRITE, 1, 0, 1), Xfer::None, 0)
        .unwrap();
    assert_eq!(trellis_nvme::le32(&plain.take_output()[8..], 8), 0);
    plain
        .feed(&resp_dw1(plain.cid_of(s), 0x7e11_0080), 0)
        .unwrap();
    assert_eq!(plain.io_credits(), None);
}

#[test]
fn submissions_beyond_the_credit_are_refused_busy_and_send_nothing() {
    let token = std::num::NonZeroU16::new(0x7e11).unwrap();
    let mut e = engine(NO, 8192);
    e.cfg.credit_token = Some(token);
    e.cfg.credit_share = 2;
    let s: Vec<u16> = (0..4).map(|_| e.alloc().unwrap()).collect();
    let w = || rw_sqe(io::WRITE, 1, 0, 1);
    // No credit yet: only the queue size bounds the queue.
    assert_eq!(e.credit_limit(), None);
    e.submit(s[0], w(), Xfer::None, 0).unwrap();
    // 4 credits for the tenant, shared by 2 queues: 2 each.
    e.feed(&resp_dw1(e.cid_of(s[0]), 0x7e11_0004), 0).unwrap();
    while e.next_completion().is_some() {}
    assert_eq!(e.credit_limit(), Some(2));
    e.take_output();
    e.submit(s[1], w(), Xfer::None, 0).unwrap();
    e.submit(s[2], w(), Xfer::None, 0).unwrap();
    let sent = e.take_output().len();
    assert!(!e.may_submit());
    match e.submit(s[3], w(), Xfer::None, 0) {
        Err(Error::Busy(2)) => {}
        other => panic!("expected Busy(2), got {other:?}"),
    }
    assert!(
        e.take_output().is_empty(),
        "a refused command sends nothing"
    );
    assert!(sent > 0);
    // The credit shrinks to 2 (1 per queue): one completion is not enough.
    e.feed(&resp_dw1(e.cid_of(s[1]), 0x7e11_0002), 0).unwrap();
    assert_eq!((e.credit_limit(), e.inflight()), (Some(1), 1));
    assert!(!e.may_submit());
    e.feed(&resp_dw1(e.cid_of(s[2]), 0x7e11_0002), 0).unwrap();
    assert!(e.may_submit());
    e.submit(s[3], w(), Xfer::None, 0).unwrap();
    // A credit of 0 still lets one command through (at least one per queue).
    e.feed(&resp_dw1(e.cid_of(s[3]), 0x7e11_0000), 0).unwrap();
    assert_eq!(e.credit_limit(), Some(1));
}

/// (time, sequence, what): an arrival's index (Ok), or a CID to answer (Err).
type ReplayEvent = (u64, u64, std::result::Result<usize, u16>);

/// Replays `arrivals.csv` through the engine on a virtual clock against a
/// scripted target (no socket, no thread, no wall clock): each command is
/// served by one of four "dies" in 20–38 µs and answered with a credit that
/// varies between 4 and 8; commands beyond the credit wait in the
/// application's FIFO until a completion. Returns every completion as
/// (time, CID, ns from arrival to completion) and the number of waits.
fn replay_arrivals() -> (Vec<(u64, u16, u64)>, u64) {
    use std::cmp::Reverse;
    use std::collections::{BinaryHeap, VecDeque};
    const LINK_NS: u64 = 5_000;
    let token = std::num::NonZeroU16::new(0x7e11).unwrap();
    let arrivals: Vec<(u64, u64)> = include_str!("arrivals.csv")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (t, lba) = l.split_once(',').unwrap();
            (t.parse().unwrap(), lba.parse().unwrap())
        })
        .collect();
    let mut e = engine(NO, 8192);
    e.cfg.credit_token = Some(token);
    let mut ev: BinaryHeap<Reverse<ReplayEvent>> = BinaryHeap::new();
    for (i, &(t, _)) in arrivals.iter().enumerate() {
        ev.push(Reverse((t, i as u64, Ok(i))));
    }
    let (mut fifo, mut seq, mut waits) = (VecDeque::new(), 1u64 << 32, 0u64);
    let mut die_free_ns = [0u64; 4];
    let mut arrived_at = std::collections::HashMap::new();
    let mut out = Vec::new();
    while let Some(Reverse((now, _, what))) = ev.pop() {
        match what {
            Ok(i) => fifo.push_back(i),
            Err(cid) => {
                let credit = 4 + (out.len() as u32 % 5);
                e.feed(&resp_dw1(cid, 0x7e11_0000 | credit), now).unwrap();
                while let Some(c) = e.next_completion() {
                    let t0: u64 = arrived_at.remove(&c.slot).unwrap();
                    out.push((now, e.cid_of(c.slot), now - t0));
                    e.free(c.slot);
                }
            }
        }
        // Drain the application's FIFO as far as credits and slots allow.
        while let Some(&i) = fifo.front() {
            if !e.may_submit() {
                waits += 1;
                break;
            }
            let Some(s) = e.alloc() else { break };
            let (t_arr, lba) = arrivals[i];
            e.submit(s, rw_sqe(io::WRITE, 1, lba, 1), Xfer::None, now)
                .unwrap();
            if let Some(l) = e.credit_limit() {
                assert!(e.inflight() as u32 <= l, "more in flight than the credit");
            }
            fifo.pop_front();
            arrived_at.insert(s, t_arr);
            let die = (lba % 4) as usize;
            let start = (now + LINK_NS).max(die_free_ns[die]);
            die_free_ns[die] = start + 20_000 + (lba % 7) * 3_000;
            seq += 1;
            ev.push(Reverse((die_free_ns[die] + LINK_NS, seq, Err(e.cid_of(s)))));
            e.take_output();
        }
    }
    assert_eq!(
        out.len(),
        arrivals.len(),
        "every recorded arrival completed"
    );
    (out, waits)
}

#[test]
fn a_recorded_arrival_trace_replays_bit_identically_on_a_virtual_clock() {
    let (a, waits) = replay_arrivals();
    let (b, _) = replay_arrivals();
    assert_eq!(a, b, "two replays of the same trace differ");
    // The credits (4..8, below the 8 slots) held commands back.
    assert!(waits > 0);
    // Times are the virtual clock's: the last completion is after the last arrival.
    let last_arrival: u64 = include_str!("arrivals.csv")
        .lines()
        .rfind(|l| !l.starts_with('#'))
        .and_then(|l| l.split(',').next()?.parse().ok())
        .unwrap();
    assert!(a.last().unwrap().0 > last_arrival);
}
