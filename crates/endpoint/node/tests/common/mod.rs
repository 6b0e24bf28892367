//! A deliberately small NVMe/TCP host for tests: blocking sockets, one
//! command at a time, every byte under the test's control (so it can also
//! send malformed input). Built on trellis-nvme only.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;
use trellis_nvme::fabrics::{ConnectCmd, ConnectData, PropertyCmd, CNTLID_DYNAMIC};
use trellis_nvme::pdu::{self, CommonHeader, DataHdr, Digests, IcReq, IcResp, PduType};
use trellis_nvme::{Cqe, Sgl, Sqe};
use trellis_target::config::{
    BackendKind, Config, ListenerConfig, NamespaceConfig, SubsystemConfig,
};

pub const NQN: &str = "nqn.2026-11.io.trellis:test";
pub const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";

/// A target on ephemeral loopback ports with one RAM namespace (16 MiB,
/// 512-byte blocks) that only `HOST` may use.
pub fn start_target() -> trellis_target::Target {
    start_target_with(trellis_target::config::SocketEngine::Epoll)
}

pub fn start_target_with(engine: trellis_target::config::SocketEngine) -> trellis_target::Target {
    let mut cfg = Config::embedded_default();
    cfg.target.socket_engine = engine;
    cfg.listeners = vec![ListenerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: None,
    }];
    cfg.subsystems = vec![SubsystemConfig {
        nqn: NQN.into(),
        serial: "TEST1".into(),
        model: "Trellis test".into(),
        allow_any_host: Some(false),
        allowed_hosts: vec![HOST.into()],
        namespaces: vec![NamespaceConfig::sized(BackendKind::Ram, 16 << 20)],
    }];
    trellis_target::Target::start(&cfg).unwrap()
}

/// One received PDU: common header and all bytes.
pub struct Pdu {
    pub ch: CommonHeader,
    pub bytes: Vec<u8>,
}

pub struct Queue {
    pub s: TcpStream,
    pub dg: Digests,
    pub cid: u16,
}

impl Queue {
    /// TCP connect only (no ICReq), for tests that misbehave from byte 0.
    pub fn raw(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    pub fn open(addr: SocketAddr, dg: Digests) -> Queue {
        let mut s = Self::raw(addr);
        let mut b = [0u8; pdu::IC_LEN];
        IcReq {
            pfv: 0,
            hpda: 0,
            digests: dg,
            maxr2t: 0,
        }
        .encode(&mut b);
        s.write_all(&b).unwrap();
        let mut r = [0u8; pdu::IC_LEN];
        s.read_exact(&mut r).unwrap();
        assert_eq!(r[0], PduType::IcResp as u8);
        let resp = IcResp::decode(&r);
        assert_eq!(resp.digests, dg, "ICResp echoes the requested digests");
        assert_eq!(resp.cpda, 0);
        assert!(resp.maxh2cdata >= 4096 && resp.maxh2cdata.is_multiple_of(4));
        Queue { s, dg, cid: 0 }
    }

    pub fn next_cid(&mut self) -> u16 {
        // Exercise CIDs with high bits set, like Linux's generation counter.
        self.cid = self.cid.wrapping_add(0x1001);
        self.cid
    }

    pub fn send_capsule(&mut self, sqe: &Sqe, icd: &[u8]) {
        let mut b = vec![0u8; pdu::MAX_HDR_LEN + icd.len() + 4];
        let n = pdu::encode_capsule_cmd(&mut b, sqe, icd.len(), self.dg);
        b.truncate(n);
        b.extend_from_slice(icd);
        if self.dg.data && !icd.is_empty() {
            b.extend_from_slice(&trellis_nvme::crc::digest(icd).to_le_bytes());
        }
        self.s.write_all(&b).unwrap();
    }

    /// Reads one whole PDU, or None on EOF.
    pub fn recv(&mut self) -> Option<Pdu> {
        let mut h = [0u8; 8];
        if self.s.read_exact(&mut h).is_err() {
            return None;
        }
        let ch = CommonHeader::decode(&h).unwrap();
        let mut bytes = h.to_vec();
        bytes.resize(ch.plen as usize, 0);
        self.s.read_exact(&mut bytes[8..]).ok()?;
        Some(Pdu { ch, bytes })
    }

    /// True if the target closed the connection (after any queued PDUs).
    pub fn closed(&mut self) -> bool {
        loop {
            match self.recv() {
                None => return true,
                Some(_) => continue,
            }
        }
    }

    /// Runs one command to completion: sends `out` in-capsule (if it fits in
    /// `icd_max`) or via R2T/H2CData, collects `in_len` bytes of C2HData.
    pub fn cmd(
        &mut self,
        mut sqe: Sqe,
        out: &[u8],
        in_len: usize,
        icd_max: usize,
    ) -> (Cqe, Vec<u8>) {
        let cid = self.next_cid();
        sqe.set_cid(cid);
        let inline = !out.is_empty() && out.len() <= icd_max;
        let len = if out.is_empty() { in_len } else { out.len() };
        sqe.set_sgl(if inline {
            Sgl::in_capsule(len as u32)
        } else {
            Sgl::transport(len as u32)
        });
        self.send_capsule(&sqe, if inline { out } else { &[] });
        let mut data = Vec::new();
        loop {
            let p = self
                .recv()
                .expect("connection closed while waiting for a completion");
            let off = 8 + 16 + self.dg.hd_len();
            match PduType::from_u8(p.ch.pdu_type) {
                Some(PduType::CapsuleResp) => {
                    let cqe = Cqe::decode(&p.bytes[8..24]);
                    assert_eq!(cqe.cid, cid, "completion for our command");
                    return (cqe, data);
                }
                Some(PduType::C2HData) => {
                    let h = DataHdr::decode(&p.bytes);
                    assert_eq!(h.cccid, cid);
                    assert_eq!(h.datao as usize, data.len(), "C2HData in order");
                    let d = &p.bytes[off..off + h.datal as usize];
                    if self.dg.data {
                        let want = trellis_nvme::le32(&p.bytes, off + h.datal as usize);
                        assert_eq!(trellis_nvme::crc::digest(d), want, "C2H data digest");
                    }
                    data.extend_from_slice(d);
                    if p.ch.flags & pdu::flags::SUCCESS != 0 {
                        return (
                            Cqe {
                                cid,
                                ..Default::default()
                            },
                            data,
                        );
                    }
                }
                Some(PduType::R2T) => {
                    let r = pdu::R2t::decode(&p.bytes);
                    assert_eq!(r.cccid, cid);
                    self.send_h2c(
                        r.ttag,
                        cid,
                        &out[r.r2to as usize..(r.r2to + r.r2tl) as usize],
                        r.r2to,
                        32 << 10,
                    );
                }
                other => panic!("unexpected PDU {other:?} (type {:#x})", p.ch.pdu_type),
            }
        }
    }

    pub fn send_h2c(&mut self, ttag: u16, cid: u16, data: &[u8], base: u32, chunk: usize) {
        for (i, c) in data.chunks(chunk).enumerate() {
            let last = (i + 1) * chunk >= data.len();
            let h = DataHdr {
                cccid: cid,
                ttag,
                datao: base + (i * chunk) as u32,
                datal: c.len() as u32,
            };
            let mut b = vec![0u8; 64];
            let n = pdu::encode_data_hdr(
                &mut b,
                PduType::H2CData,
                &h,
                if last { pdu::flags::LAST_PDU } else { 0 },
                self.dg,
            );
            b.truncate(n);
            b.extend_from_slice(c);
            if self.dg.data {
                b.extend_from_slice(&trellis_nvme::crc::digest(c).to_le_bytes());
            }
            self.s.write_all(&b).unwrap();
        }
    }

    pub fn fabrics_connect(
        &mut self,
        qid: u16,
        sqsize: u16,
        subnqn: &str,
        hostnqn: &str,
        cntlid: u16,
        kato_ms: u32,
    ) -> Cqe {
        self.fabrics_connect_attr(qid, sqsize, subnqn, hostnqn, cntlid, kato_ms, 0)
    }

    /// Connect with connection attributes (CATTR bit 2 = SQ flow control disabled).
    #[allow(clippy::too_many_arguments)]
    pub fn fabrics_connect_attr(
        &mut self,
        qid: u16,
        sqsize: u16,
        subnqn: &str,
        hostnqn: &str,
        cntlid: u16,
        kato_ms: u32,
        cattr: u8,
    ) -> Cqe {
        let sqe = ConnectCmd {
            recfmt: 0,
            qid,
            sqsize,
            cattr,
            kato_ms,
        }
        .to_sqe(0);
        let mut d = vec![0u8; 1024];
        ConnectData {
            hostid: [7; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .encode(&mut d);
        self.cmd(sqe, &d, 0, 8192).0
    }

    pub fn prop_get(&mut self, offset: u32, size8: bool) -> u64 {
        let (c, _) = self.cmd(
            PropertyCmd {
                size8,
                offset,
                value: 0,
            }
            .to_sqe(0, false),
            &[],
            0,
            0,
        );
        assert!(
            c.status.is_success(),
            "property get {offset:#x}: {:?}",
            c.status
        );
        c.dw0 as u64 | (c.dw1 as u64) << 32
    }

    pub fn prop_set(&mut self, offset: u32, value: u64) -> Cqe {
        self.cmd(
            PropertyCmd {
                size8: false,
                offset,
                value,
            }
            .to_sqe(0, true),
            &[],
            0,
            0,
        )
        .0
    }
}

/// An enabled controller: admin queue plus `ios` connected I/O queues.
pub struct Ctrl {
    pub admin: Queue,
    pub io: Vec<Queue>,
    pub cntlid: u16,
}

pub fn controller(addr: SocketAddr, subnqn: &str, ios: u16, dg: Digests, kato_ms: u32) -> Ctrl {
    let mut admin = Queue::open(addr, dg);
    let c = admin.fabrics_connect(0, 31, subnqn, HOST, CNTLID_DYNAMIC, kato_ms);
    assert!(c.status.is_success(), "admin connect: {:?}", c.status);
    let cntlid = c.dw0 as u16;
    admin.prop_get(0, true);
    assert!(admin.prop_set(0x14, 0x0046_0001).status.is_success());
    assert_eq!(admin.prop_get(0x1c, false) & 1, 1, "CSTS.RDY after CC.EN");
    let mut io = Vec::new();
    for qid in 1..=ios {
        let mut q = Queue::open(addr, dg);
        let c = q.fabrics_connect(qid, 127, subnqn, HOST, cntlid, 0);
        assert!(
            c.status.is_success(),
            "I/O connect qid {qid}: {:?}",
            c.status
        );
        io.push(q);
    }
    Ctrl { admin, io, cntlid }
}

pub fn read(q: &mut Queue, slba: u64, nlb: u32) -> (Cqe, Vec<u8>) {
    q.cmd(
        Sqe::rw(trellis_nvme::sqe::io::READ, 0, 1, slba, nlb, false),
        &[],
        nlb as usize * 512,
        8192,
    )
}

pub fn write(q: &mut Queue, slba: u64, data: &[u8]) -> Cqe {
    let nlb = (data.len() / 512) as u32;
    q.cmd(
        Sqe::rw(trellis_nvme::sqe::io::WRITE, 0, 1, slba, nlb, false),
        data,
        0,
        8192,
    )
    .0
}

/// Deterministic test pattern that encodes LBA and a generation.
pub fn pattern(slba: u64, blocks: usize, gen: u64) -> Vec<u8> {
    let mut v = vec![0u8; blocks * 512];
    for (i, w) in v.chunks_mut(8).enumerate() {
        let x = (slba * 64 + i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ gen;
        w.copy_from_slice(&x.to_le_bytes());
    }
    v
}
