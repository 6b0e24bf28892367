//! The NVMe/TCP transport state machine, host engine against target
//! connection in memory (`common/pair.rs`): connect, R2T, digests, the
//! C2HData SUCCESS flag, malformed PDUs and timeouts, each on a virtual
//! clock and byte for byte the same on every run.

#[path = "common/pair.rs"]
mod harness;

use harness::{split_pdus, Link, Pair, Tamper, CC_ENABLE, T0};
use trellis_host::engine::rw_sqe;
use trellis_host::Xfer;
use trellis_node::config::ByteSize;
use trellis_node::data::tcp::conn::CTRL_CHECK_NS;
use trellis_nvme::fabrics::{prop, PropertyCmd, CNTLID_DYNAMIC};
use trellis_nvme::pdu::{
    fes, field, flags, DataHdr, Digests, IcReq, IcResp, PduType, R2t, TermReq, CMD_HLEN, IC_LEN,
    SMALL_HLEN,
};
use trellis_nvme::sqe::{admin, io};
use trellis_nvme::status::generic;
use trellis_nvme::{crc, le16, le32, Cqe, Sqe};

const NO: Digests = Digests {
    header: false,
    data: false,
};
const BOTH: Digests = Digests {
    header: true,
    data: true,
};
const BLOCK: usize = 512;

/// A recognisable pattern: bytes differ with `seed` and position.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// The PDUs of `stream` from byte `mark` on.
fn pdus_from(stream: &[u8], mark: usize) -> Vec<&[u8]> {
    split_pdus(&stream[mark..])
}

/// The CID a capsule carries (SQE bytes 2..4, after the 8-byte header).
fn capsule_cid(p: &[u8]) -> u16 {
    le16(p, 8 + 2)
}

/// Writes `data` at block `slba` on link `l`; returns the status.
fn write(p: &mut Pair, l: usize, slba: u64, data: &[u8]) -> Option<trellis_nvme::Status> {
    let sqe = rw_sqe(io::WRITE, 1, slba, (data.len() / BLOCK) as u32);
    let c = p.exec(l, sqe, Xfer::ToCtrl(data.len() as u32), data)?;
    Some(c.0.status)
}

/// Reads `len` bytes at block `slba` on link `l`, expecting success.
fn read(p: &mut Pair, l: usize, slba: u64, len: usize) -> Vec<u8> {
    let sqe = rw_sqe(io::READ, 1, slba, (len / BLOCK) as u32);
    let (c, data) = p
        .exec(l, sqe, Xfer::FromCtrl(len as u32), &[])
        .expect("read completed");
    assert!(c.status.is_success(), "read failed: {}", c.status);
    data
}

/// ICReq, ICResp, Connect of the admin queue, enable, then Connect of an
/// I/O queue to the same controller: each step's PDUs and the state both
/// sides reach.
#[test]
fn connect_admin_and_io_queue() {
    let mut p = Pair::new();
    let admin = p.open(0, NO);
    let l = &p.links[admin];
    let sent = split_pdus(&l.h2c);
    assert_eq!(sent.len(), 1, "the host sent only its ICReq");
    assert_eq!(sent[0][0], PduType::IcReq as u8);
    assert_eq!(IcReq::decode(sent[0]).digests, NO);
    let got = split_pdus(&l.c2h);
    assert_eq!(got.len(), 1, "the target answered with one ICResp");
    assert_eq!((got[0][0], got[0].len()), (PduType::IcResp as u8, IC_LEN));
    let r = IcResp::decode(got[0]);
    assert_eq!((r.pfv, r.cpda, r.digests), (0, 0, NO));
    assert_eq!(r.maxh2cdata as u64, p.reg.limits().max_h2c_data.0);
    assert!(l.host.ic_done());
    assert_eq!(l.host.maxh2cdata(), r.maxh2cdata);
    assert_eq!(l.conn.qid(), None, "not connected before Connect");

    let c = p.connect(admin, CNTLID_DYNAMIC, 0, 0);
    assert!(c.status.is_success(), "admin Connect: {}", c.status);
    let ctrl = p.links[admin].conn.ctrl().expect("a controller").clone();
    assert_eq!(
        c.dw0 as u16,
        ctrl.cntlid(),
        "Connect returns the controller ID"
    );
    assert_eq!(p.links[admin].conn.qid(), Some(0));

    // An I/O queue may not connect to a controller not yet enabled.
    let early = p.open(1, NO);
    let c = p.connect(early, ctrl.cntlid(), 0, 0);
    assert_eq!(c.status, generic::COMMAND_SEQUENCE_ERROR.dnr());
    assert_eq!(p.links[early].conn.qid(), None);

    assert!(p.enable(admin).status.is_success());
    let csts = PropertyCmd {
        size8: false,
        offset: prop::CSTS,
        value: 0,
    }
    .to_sqe(0, false);
    let (c, _) = p.exec(admin, csts, Xfer::None, &[]).expect("Property Get");
    assert_eq!(c.dw0 & 1, 1, "CSTS.RDY after CC.EN ({CC_ENABLE:#x})");

    let io = p.open(1, NO);
    let c = p.connect(io, ctrl.cntlid(), 0, 0);
    assert!(c.status.is_success(), "I/O Connect: {}", c.status);
    assert_eq!(p.links[io].conn.qid(), Some(1));
    let io_ctrl = p.links[io].conn.ctrl().expect("I/O queue's controller");
    assert!(std::sync::Arc::ptr_eq(io_ctrl, &ctrl), "same controller");
    assert!(p.links.iter().all(|l| l.host_error.is_none()));
}

/// A write longer than the in-capsule limit goes as a capsule without
/// data, an R2T for all of it, and H2CData PDUs of at most MAXH2CDATA
/// with the R2T's tag; one within the limit goes in the capsule. Whole
/// PDUs per step, and PDUs cut into 7-byte pieces.
#[test]
fn write_beyond_in_capsule_data_takes_r2t_and_h2cdata() {
    for chunk in [usize::MAX, 7] {
        let mut p = Pair::with_config(|c| c.target.max_h2c_data = ByteSize(16 << 10));
        p.chunk = chunk;
        let (_admin, io) = p.controller(NO, 0);
        let icd = p.reg.limits().in_capsule_data.0 as usize;
        p.links[io].host.set_icd_bytes(icd as u32);

        let small = pattern(icd, 1);
        let (h, c) = (p.links[io].h2c.len(), p.links[io].c2h.len());
        assert_eq!(
            write(&mut p, io, 0, &small),
            Some(trellis_nvme::Status::SUCCESS)
        );
        let sent = pdus_from(&p.links[io].h2c, h);
        assert_eq!(sent.len(), 1, "one capsule with its data (chunk {chunk})");
        assert_eq!(sent[0].len(), CMD_HLEN + icd);
        let got = pdus_from(&p.links[io].c2h, c);
        assert_eq!(got.len(), 1, "no R2T, only the response");
        assert_eq!(got[0][0], PduType::CapsuleResp as u8);

        let large = pattern(40 << 10, 2);
        let (h, c) = (p.links[io].h2c.len(), p.links[io].c2h.len());
        assert_eq!(
            write(&mut p, io, 64, &large),
            Some(trellis_nvme::Status::SUCCESS)
        );
        let sent = pdus_from(&p.links[io].h2c, h);
        assert_eq!(sent[0][0], PduType::CapsuleCmd as u8);
        assert_eq!(sent[0].len(), CMD_HLEN, "no data in the capsule");
        let cid = capsule_cid(sent[0]);
        let got = pdus_from(&p.links[io].c2h, c);
        assert_eq!(got.len(), 2, "R2T, then the response");
        assert_eq!(got[0][0], PduType::R2T as u8);
        let r2t = R2t::decode(got[0]);
        assert_eq!(
            (r2t.cccid, r2t.r2to, r2t.r2tl),
            (cid, 0, large.len() as u32)
        );
        assert_eq!(Cqe::decode(&got[1][8..24]).cid, cid);
        check_h2c_data(&sent[1..], &r2t, &large, 16 << 10);

        assert_eq!(read(&mut p, io, 0, small.len()), small);
        assert_eq!(read(&mut p, io, 64, large.len()), large);
    }
}

/// The H2CData PDUs answering `r2t`: its tag and command, contiguous
/// offsets, at most `max` bytes each, LAST_PDU on the last only, and
/// `data` as their payload.
fn check_h2c_data(pdus: &[&[u8]], r2t: &R2t, data: &[u8], max: usize) {
    assert_eq!(pdus.len(), data.len().div_ceil(max), "H2CData PDUs");
    let mut off = 0;
    for (i, pdu) in pdus.iter().enumerate() {
        assert_eq!(pdu[0], PduType::H2CData as u8);
        let h = DataHdr::decode(pdu);
        assert_eq!(
            (h.cccid, h.ttag, h.datao),
            (r2t.cccid, r2t.ttag, off as u32)
        );
        assert!(h.datal as usize <= max);
        let last = i + 1 == pdus.len();
        assert_eq!(pdu[1] & flags::LAST_PDU != 0, last, "LAST_PDU on PDU {i}");
        let pdo = pdu[3] as usize;
        assert_eq!(
            &pdu[pdo..pdo + h.datal as usize],
            &data[off..off + h.datal as usize]
        );
        off += h.datal as usize;
    }
    assert_eq!(off, data.len());
}

/// Checks every digest in a stream by recomputing it: after the IC
/// exchange, each digest-eligible PDU has its header digest flag and a
/// correct CRC32C, and each that carries data its data digest. Returns
/// how many header and data digests it checked.
fn check_digests(stream: &[u8]) -> (usize, usize) {
    let (mut hd, mut dd) = (0, 0);
    for p in split_pdus(stream) {
        let t = PduType::from_u8(p[0]).expect("a known PDU type");
        if matches!(t, PduType::IcReq | PduType::IcResp) {
            continue;
        }
        let hlen = p[2] as usize;
        assert_ne!(p[1] & flags::HDGSTF, 0, "{t:?} without HDGSTF");
        assert_eq!(
            le32(p, hlen),
            crc::digest(&p[..hlen]),
            "{t:?} header digest"
        );
        hd += 1;
        let pdo = p[3] as usize;
        if pdo != 0 {
            assert_ne!(p[1] & flags::DDGSTF, 0, "{t:?} with data but no DDGSTF");
            let end = p.len() - 4;
            assert_eq!(le32(p, end), crc::digest(&p[pdo..end]), "{t:?} data digest");
            dd += 1;
        }
    }
    (hd, dd)
}

/// Header and data digests asked for are echoed in ICResp, carried on
/// every PDU both ways with correct CRCs, and data moves intact with them
/// (in-capsule and R2T writes, reads).
#[test]
fn header_and_data_digests_are_negotiated_and_verified() {
    let mut p = Pair::new();
    let (admin, io) = p.controller(BOTH, 0);
    for l in [admin, io] {
        let icresp = split_pdus(&p.links[l].c2h)[0];
        assert_eq!(IcResp::decode(icresp).digests, BOTH, "ICResp echoes");
    }
    p.links[io]
        .host
        .set_icd_bytes(p.reg.limits().in_capsule_data.0 as u32);
    let small = pattern(4096, 3);
    let large = pattern(32 << 10, 4);
    assert!(write(&mut p, io, 0, &small).unwrap().is_success());
    assert!(write(&mut p, io, 32, &large).unwrap().is_success());
    assert_eq!(read(&mut p, io, 0, small.len()), small);
    assert_eq!(read(&mut p, io, 32, large.len()), large);

    let io_link: &Link = &p.links[io];
    assert!(io_link.host_error.is_none() && !io_link.conn.is_closing());
    // Host: Connect, 2 writes, R2T's H2CData, 2 reads: 6 headers, 3 with data.
    assert_eq!(check_digests(&io_link.h2c), (6, 3));
    // Target: Connect resp, 2 write resps, R2T, 2 C2HData + 2 resps.
    assert_eq!(check_digests(&io_link.c2h), (8, 2));
    let (hd, dd) = check_digests(&p.links[admin].c2h);
    assert!(hd >= 2 && dd == 0, "admin: {hd} header, {dd} data digests");
}

/// Flips the last byte (the data digest) of the next `kind` PDU that
/// carries data, once.
fn corrupt_next_data_digest(kind: PduType) -> Tamper {
    let mut armed = true;
    Box::new(move |p: &mut Vec<u8>| {
        if armed && p[0] == kind as u8 && p[3] != 0 {
            let n = p.len();
            p[n - 1] ^= 0x01;
            armed = false;
        }
    })
}

/// A bad data digest on write data, in the capsule or in H2CData, fails
/// that command with Transient Transport Error and no DNR (retryable,
/// NVMe/TCP §7.4.6.1), leaves the data unwritten and the connection up;
/// the retry succeeds.
#[test]
fn corrupted_data_digest_fails_the_write_retryably() {
    let mut p = Pair::new();
    let (_admin, io) = p.controller(BOTH, 0);
    p.links[io]
        .host
        .set_icd_bytes(p.reg.limits().in_capsule_data.0 as u32);
    // In the capsule (4 KiB) and through R2T (32 KiB).
    for (slba, len) in [(0u64, 4096usize), (64, 32 << 10)] {
        let old = pattern(len, 5);
        assert!(write(&mut p, io, slba, &old).unwrap().is_success());
        let kind = match len <= p.reg.limits().in_capsule_data.0 as usize {
            true => PduType::CapsuleCmd,
            false => PduType::H2CData,
        };
        p.links[io].tamper = Some(corrupt_next_data_digest(kind));
        let new = pattern(len, 6);
        let st = write(&mut p, io, slba, &new).expect("answered");
        assert_eq!(st, generic::TRANSIENT_TRANSPORT_ERROR, "{kind:?}");
        assert!(!st.is_dnr(), "a digest error may be retried");
        let l = &p.links[io];
        assert!(!l.conn.is_closing() && l.host_error.is_none(), "{kind:?}");
        assert_eq!(read(&mut p, io, slba, len), old, "nothing written");
        assert!(write(&mut p, io, slba, &new).unwrap().is_success());
        assert_eq!(read(&mut p, io, slba, len), new, "the retry wrote");
    }
}

/// The last PDU of `stream`, which must be a C2HTermReq: (FES, FEI, the
/// offending header it carries).
fn term_req(stream: &[u8]) -> (u16, u32, Vec<u8>) {
    let pdus = split_pdus(stream);
    let t = pdus.last().expect("a PDU");
    assert_eq!(t[0], PduType::C2HTermReq as u8, "last PDU is C2HTermReq");
    let r = TermReq::decode(t);
    (r.fes, r.fei, t[SMALL_HLEN..].to_vec())
}

/// Asserts link `l` was ended by a C2HTermReq with `fes`/`fei` whose
/// offending header is the start of the host's last PDU; the host saw it.
fn assert_terminated(p: &Pair, l: usize, fes: u16, fei: u32, case: &str) {
    let link = &p.links[l];
    let (got_fes, got_fei, offending) = term_req(&link.c2h);
    assert_eq!((got_fes, got_fei), (fes, fei), "{case}: FES, FEI");
    let culprit = *split_pdus(&link.h2c).last().expect("a host PDU");
    assert_eq!(&offending[..8], &culprit[..8], "{case}: offending header");
    assert!(link.closed_at.is_some(), "{case}: the target closed");
    let reason = link.conn.close_reason();
    assert!(
        reason.contains(&format!("FES {fes:#x}")),
        "{case}: {reason}"
    );
    let e = link.host_error.as_deref().unwrap_or("");
    assert!(e.contains("C2HTermReq"), "{case}: host error {e:?}");
}

/// Malformed PDUs on a connected I/O queue: each makes the target answer
/// C2HTermReq naming the bad field and close that connection only; the
/// command never completes.
#[test]
fn malformed_pdu_gets_c2h_term_req_and_close() {
    type Mutate = fn(&mut Vec<u8>);
    let cases: [(&str, PduType, Mutate, u16, u32); 4] = [
        (
            "wrong HLEN",
            PduType::CapsuleCmd,
            |p| p[2] = 0x40,
            fes::INVALID_HEADER_FIELD,
            field::HLEN,
        ),
        (
            "unknown type",
            PduType::CapsuleCmd,
            |p| p[0] = 0x0A,
            fes::INVALID_HEADER_FIELD,
            field::TYPE,
        ),
        (
            "PDO not dword aligned",
            PduType::H2CData,
            |p| p[3] += 2,
            fes::INVALID_HEADER_FIELD,
            field::PDO,
        ),
        (
            "controller-only type",
            PduType::CapsuleCmd,
            |p| p[0] = PduType::CapsuleResp as u8,
            fes::PDU_SEQUENCE_ERROR,
            0,
        ),
    ];
    for (case, kind, mutate, fes, fei) in cases {
        let mut p = Pair::new();
        let (admin, io) = p.controller(NO, 0);
        let mut armed = true;
        p.links[io].tamper = Some(Box::new(move |b: &mut Vec<u8>| {
            if armed && b[0] == kind as u8 {
                mutate(b);
                armed = false;
            }
        }));
        // A 4 KiB write goes through R2T (no in-capsule data set): both
        // its capsule and its H2CData are on the wire.
        let done = write(&mut p, io, 0, &pattern(4096, 7));
        assert_eq!(done, None, "{case}: the command must not complete");
        assert_terminated(&p, io, fes, fei, case);
        let a = &p.links[admin];
        assert!(
            a.closed_at.is_none() && !a.conn.is_closing(),
            "{case}: admin up"
        );
    }
}

/// A header digest that does not match its header is fatal: C2HTermReq
/// with FES Header Digest Error, then close (NVMe/TCP §7.4.6.1).
#[test]
fn corrupted_header_digest_is_fatal() {
    let mut p = Pair::new();
    let (_admin, io) = p.controller(BOTH, 0);
    let mut armed = true;
    p.links[io].tamper = Some(Box::new(move |b: &mut Vec<u8>| {
        if armed && b[0] == PduType::CapsuleCmd as u8 {
            b[CMD_HLEN] ^= 0x80; // the first byte of the header digest
            armed = false;
        }
    }));
    assert_eq!(write(&mut p, io, 0, &pattern(4096, 8)), None);
    assert_terminated(&p, io, fes::HEADER_DIGEST_ERROR, 0, "header digest");
}

/// What a 4 KiB read sends on an I/O queue connected with `cattr`, after
/// a write of the same blocks: the read's PDUs from the target, its
/// completion and data, the write response's SQHD, and the read's CID.
fn read_on_queue(cattr: u8) -> (Vec<Vec<u8>>, trellis_host::Completion, Vec<u8>, u16, u16) {
    let mut p = Pair::new();
    let (_admin, io) = p.controller(NO, cattr);
    let data = pattern(4096, 9);
    let c = p.links[io].c2h.len();
    assert!(write(&mut p, io, 8, &data).unwrap().is_success());
    let resp = *pdus_from(&p.links[io].c2h, c).last().unwrap();
    let write_sqhd = Cqe::decode(&resp[8..24]).sqhd;
    let (h, c) = (p.links[io].h2c.len(), p.links[io].c2h.len());
    let sqe = rw_sqe(io::READ, 1, 8, 8);
    let (done, got) = p.exec(io, sqe, Xfer::FromCtrl(4096), &[]).expect("read");
    assert_eq!(got, data, "data read back (cattr {cattr:#x})");
    let cid = capsule_cid(pdus_from(&p.links[io].h2c, h)[0]);
    let pdus = pdus_from(&p.links[io].c2h, c);
    let pdus = pdus.into_iter().map(<[u8]>::to_vec).collect();
    (pdus, done, got, write_sqhd, cid)
}

/// With SQ flow control disabled (Connect CATTR bit 2) a successful read
/// ends with a C2HData carrying LAST_PDU and SUCCESS and no CapsuleResp,
/// and the host completes it from that; with flow control on, the
/// C2HData has no SUCCESS and a CapsuleResp follows.
#[test]
fn read_completes_with_c2h_data_success_flag_when_sq_flow_control_is_off() {
    let (pdus, done, _, write_sqhd, cid) = read_on_queue(0x4);
    assert_eq!(pdus.len(), 1, "one C2HData, no CapsuleResp");
    let c2h = &pdus[0];
    assert_eq!(c2h[0], PduType::C2HData as u8);
    assert_eq!(c2h[1], flags::LAST_PDU | flags::SUCCESS);
    let h = DataHdr::decode(c2h);
    assert_eq!((h.cccid, h.datao, h.datal), (cid, 0, 4096));
    assert!(done.status.is_success());
    assert_eq!(done.sqhd, 0, "completed by the C2HData, not a CQE");
    assert_eq!(write_sqhd, 0xFFFF, "no SQ head kept");

    let (pdus, done, _, write_sqhd, cid) = read_on_queue(0);
    let types: Vec<u8> = pdus.iter().map(|p| p[0]).collect();
    assert_eq!(types, [PduType::C2HData as u8, PduType::CapsuleResp as u8]);
    assert_eq!(pdus[0][1], flags::LAST_PDU, "no SUCCESS with flow control");
    let cqe = Cqe::decode(&pdus[1][8..24]);
    assert_eq!((cqe.cid, cqe.status), (cid, trellis_nvme::Status::SUCCESS));
    assert_eq!(done.sqhd, cqe.sqhd);
    assert_ne!(write_sqhd, 0xFFFF);
}

/// Ticks the clock until `stop` holds; panics if it does not by `limit`.
fn run_until(p: &mut Pair, limit: u64, stop: impl Fn(&Pair) -> bool) {
    while !stop(p) {
        let t = p.tick().expect("a timer is pending");
        assert!(t <= limit, "still waiting at {t} ns (limit {limit})");
    }
}

/// A queue with no Connect is closed once the connect timeout since the
/// connection began has passed, whether or not ICReq came: not before,
/// silently (no TermReq: no PDU was wrong).
#[test]
fn no_connect_within_the_connect_timeout_closes_the_queue() {
    for send_icreq in [false, true] {
        let mut p = Pair::new();
        let l = match send_icreq {
            true => p.open(0, NO),
            false => p.open_raw(0, NO),
        };
        // Silent from the start: the ICReq deadline; after an ICReq: the
        // connect deadline.
        let (limit_ms, why) = match send_icreq {
            false => (
                p.reg.limits().icreq_timeout_ms,
                "no ICReq within target.icreq_timeout_ms",
            ),
            true => (
                p.reg.limits().connect_timeout_ms,
                "no Connect within the connect timeout",
            ),
        };
        let deadline = T0 + limit_ms * 1_000_000;
        assert_eq!(p.next_timeout(), Some(deadline));
        run_until(&mut p, deadline + 1, |p| p.links[l].closed_at.is_some());
        let closed = p.links[l].closed_at.unwrap();
        assert!(
            closed >= deadline,
            "closed at {closed}, deadline {deadline}"
        );
        let link = &p.links[l];
        assert_eq!(link.conn.close_reason(), why);
        let sent: Vec<u8> = split_pdus(&link.c2h).iter().map(|p| p[0]).collect();
        let want: &[u8] = if send_icreq {
            &[PduType::IcResp as u8]
        } else {
            &[]
        };
        assert_eq!(
            sent, want,
            "nothing sent but the ICResp (ICReq: {send_icreq})"
        );
    }
}

/// KATO 2 s: a Keep Alive restarts the timer; 2 s without one after it
/// kill the controller and close the admin queue, and its I/O queue closes
/// at its next controller check.
#[test]
fn keep_alive_expiry_closes_the_admin_and_io_queues() {
    let mut p = Pair::new();
    let admin = p.open(0, NO);
    let c = p.connect(admin, CNTLID_DYNAMIC, 0, 2_000);
    assert!(c.status.is_success());
    assert!(p.enable(admin).status.is_success());
    let io = p.open(1, NO);
    assert!(p.connect(io, c.dw0 as u16, 0, 0).status.is_success());

    let half = p.now + 1_500_000_000;
    run_until(&mut p, half + CTRL_CHECK_NS, |p| p.now >= half);
    assert!(
        p.links.iter().all(|l| l.closed_at.is_none()),
        "alive at 1.5 s"
    );
    let ka = Sqe::new(admin::KEEP_ALIVE, 0, 0);
    let (c, _) = p.exec(admin, ka, Xfer::None, &[]).expect("Keep Alive");
    assert!(c.status.is_success());
    let expiry = p.now + 2_000_000_000;

    run_until(&mut p, expiry + 1, |p| p.links[admin].closed_at.is_some());
    let closed = p.links[admin].closed_at.unwrap();
    assert!(closed > expiry, "closed at {closed}, before {expiry}");
    assert_eq!(p.links[admin].conn.close_reason(), "keep-alive timeout");
    let ctrl = p.links[io].conn.ctrl().unwrap().clone();
    assert!(ctrl.is_dead());

    run_until(&mut p, closed + CTRL_CHECK_NS, |p| {
        p.links[io].closed_at.is_some()
    });
    assert_eq!(p.links[io].conn.close_reason(), "controller torn down");
}

/// Write data lost on the way (the H2CData dropped): the target waits for
/// it `target.data_wait_timeout_ms` after its R2T, no longer, and then
/// closes the connection (which frees the command's buffer), before the
/// host's own command timeout would have failed the queue.
#[test]
fn lost_write_data_closes_the_connection_at_the_data_wait_timeout() {
    let mut p = Pair::new();
    let (_admin, io) = p.controller(NO, 0);
    p.links[io].tamper = Some(Box::new(|b: &mut Vec<u8>| {
        if b[0] == PduType::H2CData as u8 {
            b.clear();
        }
    }));
    let submitted = p.now;
    assert_eq!(write(&mut p, io, 0, &pattern(4096, 10)), None);
    let c2h = split_pdus(&p.links[io].c2h);
    assert_eq!(c2h.last().unwrap()[0], PduType::R2T as u8, "R2T sent");
    let wait_ns = p.reg.limits().data_wait_timeout_ms * 1_000_000;
    let host_limit = p.links[io].host.config().command_timeout.as_nanos() as u64;
    assert!(wait_ns < host_limit, "the target's wait ends first");
    let deadline = submitted + wait_ns;
    run_until(&mut p, deadline + CTRL_CHECK_NS, |p| {
        p.links[io].closed_at.is_some()
    });
    assert!(p.now >= deadline, "closed at {} before {deadline}", p.now);
    assert_eq!(
        p.links[io].conn.close_reason(),
        "write data not received in time after R2T"
    );
}
