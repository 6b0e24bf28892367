//! A small NVMe/TCP target over plain blocking sockets, for tests only.
//!
//! It serves one RAM namespace well enough for the host library and
//! `trellis bench` to run verified I/O against it (admin enable, Identify,
//! Keep Alive, discovery log, Read, Write in-capsule and via R2T with
//! MAXH2CDATA splitting, Flush, Write Zeroes, Deallocate, digests). Its point
//! is [`Fault`]: on a chosen read it misbehaves the way a broken target would,
//! so tests can check that the host reports a clear error instead of hanging
//! or panicking. It is not fast and does not try to be.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use trellis_nvme::fabrics::{self, prop, ConnectCmd, PropertyCmd};
use trellis_nvme::identify::{self, cns, ControllerInfo, ControllerType, NamespaceInfo};
use trellis_nvme::log::{self, DiscoveryEntry, GetLogPage};
use trellis_nvme::pdu::{
    self, check_layout, flags, DataHdr, Digests, IcReq, IcResp, PduType, R2t, IC_LEN,
};

use crate::raw::{self, Pdu};
use trellis_nvme::sqe::{admin, io};
use trellis_nvme::{crc, Cqe, Fatal, Sqe, Status};

/// How the target misbehaves on the chosen read command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// Sends an H2CData PDU, which only a host may send.
    WrongPduType,
    /// Completes the read with a CID the host never issued.
    WrongCid,
    /// Sends half the data, then a successful CapsuleResp.
    ShortData,
    /// Never answers (the host must time out).
    Silent,
    /// Sends the data with a corrupted data digest (needs data digest on).
    BadDataDigest,
    /// Sends the C2HData header and half the data, then closes the socket.
    CloseMidData,
    /// Sends a C2HTermReq.
    TermReq,
    /// Sends a C2HData whose offset skips ahead.
    BadOffset,
    /// Flips one data byte of the read, with valid digests, and carries on:
    /// a storage bug only end-to-end verification can catch.
    CorruptData,
}

#[derive(Clone, Debug)]
pub struct FakeConfig {
    pub subnqn: String,
    pub block_size: u32,
    pub blocks: u64,
    /// In-capsule data accepted on I/O queues.
    pub icd_bytes: u32,
    pub maxh2cdata: u32,
    pub mqes: u16,
    pub fault: Fault,
    /// The fault hits the I/O read after this many earlier I/O reads.
    pub fault_after_reads: u64,
    /// Every I/O read is answered no sooner than this after it arrived (lets
    /// tests check latency accounting against a known lower bound).
    pub read_delay: Duration,
    /// Connect asks for DH-HMAC-CHAP (ATR); the target sends a Challenge
    /// (SHA-256, NULL group) and, once the host's Reply is in, closes the
    /// connection instead of answering the next Authentication Receive, as
    /// Linux nvmet can when it refuses a host (its teardown races the
    /// AUTH_Failure1).
    pub auth_close_after_reply: bool,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            subnqn: "nqn.2026-11.io.trellis:fake".into(),
            block_size: 512,
            blocks: 64 << 11, // 64 MiB
            icd_bytes: 8192,
            maxh2cdata: 32 << 10,
            mqes: 127,
            fault: Fault::None,
            fault_after_reads: 0,
            read_delay: Duration::ZERO,
            auth_close_after_reply: false,
        }
    }
}

struct Shared {
    cfg: FakeConfig,
    store: Mutex<Vec<u8>>,
    reads: AtomicU64,
    stop: AtomicBool,
}

/// A running fake target; stops accepting when dropped.
pub struct FakeTarget {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FakeTarget {
    pub fn spawn(cfg: FakeConfig) -> FakeTarget {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind fake target");
        let addr = l.local_addr().expect("local addr");
        let shared = Arc::new(Shared {
            store: Mutex::new(vec![0; (cfg.blocks * cfg.block_size as u64) as usize]),
            cfg,
            reads: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let sh = shared.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                if sh.stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(s) = s else { continue };
                let sh = sh.clone();
                std::thread::spawn(move || {
                    let _ = Conn::new(s, sh).run();
                });
            }
        });
        FakeTarget { addr, shared }
    }
    pub fn addr_string(&self) -> String {
        self.addr.to_string()
    }
    pub fn subnqn(&self) -> &str {
        &self.shared.cfg.subnqn
    }
}

impl Drop for FakeTarget {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr); // wake the accept loop
    }
}

struct Conn {
    s: TcpStream,
    sh: Arc<Shared>,
    d: Digests,
    qid: u16,
    cc: u32,
    /// After a fault the connection only drains input.
    broken: bool,
    /// Capsules that arrived while H2CData for an earlier command was awaited.
    pending: std::collections::VecDeque<Pdu>,
    /// Authentication Send commands received (auth_close_after_reply).
    auth_sends: u32,
}

type R<T> = std::io::Result<T>;

/// Largest PDU the fake target reads.
const MAX_PLEN: usize = 4 << 20;

impl Conn {
    fn new(s: TcpStream, sh: Arc<Shared>) -> Conn {
        let _ = s.set_nodelay(true);
        Conn {
            s,
            sh,
            d: Digests::default(),
            qid: 0,
            cc: 0,
            broken: false,
            pending: Default::default(),
            auth_sends: 0,
        }
    }

    fn run(&mut self) -> R<()> {
        let mut ic = [0u8; IC_LEN];
        self.s.read_exact(&mut ic)?;
        self.d = IcReq::decode(&ic).digests;
        let mut resp = [0u8; IC_LEN];
        IcResp {
            pfv: 0,
            cpda: 0,
            digests: self.d,
            maxh2cdata: self.sh.cfg.maxh2cdata,
        }
        .encode(&mut resp);
        self.s.write_all(&resp)?;
        loop {
            let (sqe, icd) = self.read_capsule()?;
            if self.broken {
                continue;
            }
            self.handle(sqe, icd)?;
        }
    }

    /// Reads one whole PDU of at most 4 MiB.
    fn read_pdu(&mut self) -> R<Pdu> {
        raw::read_pdu(&mut self.s, MAX_PLEN)
    }

    fn read_capsule(&mut self) -> R<(Sqe, Vec<u8>)> {
        let p = match self.pending.pop_front() {
            Some(p) => p,
            None => self.read_pdu()?,
        };
        let b = &p.bytes;
        let l = check_layout(&p.ch, true, false, self.d, MAX_PLEN).map_err(|_| bad("layout"))?;
        if l.pdu_type != PduType::CapsuleCmd {
            return Err(bad("expected a capsule"));
        }
        let sqe = Sqe::from_slice(&b[8..72]);
        let icd = b[l.data_off..l.data_off + l.data_len].to_vec();
        if l.ddgst {
            let want = trellis_nvme::le32(b, l.data_off + l.data_len);
            if crc::digest(&icd) != want {
                return Err(bad("capsule data digest"));
            }
        }
        Ok((sqe, icd))
    }

    fn handle(&mut self, sqe: Sqe, icd: Vec<u8>) -> R<()> {
        if sqe.opcode() == admin::FABRICS {
            return self.fabrics(sqe, icd);
        }
        if self.qid == 0 {
            return self.admin(sqe);
        }
        match sqe.opcode() {
            io::READ => self.read(sqe),
            io::WRITE => self.write(sqe, icd),
            io::FLUSH => self.resp(&sqe, Status::SUCCESS, 0),
            io::WRITE_ZEROES => {
                let (off, len) = self.range(&sqe);
                self.sh.store.lock().unwrap()[off..off + len].fill(0);
                self.resp(&sqe, Status::SUCCESS, 0)
            }
            io::DATASET_MANAGEMENT => {
                let data = self.data_out(&sqe, icd)?;
                let nlb = trellis_nvme::le32(&data, 4) as u64;
                let slba = trellis_nvme::le64(&data, 8);
                let bs = self.sh.cfg.block_size as u64;
                let mut st = self.sh.store.lock().unwrap();
                st[(slba * bs) as usize..((slba + nlb) * bs) as usize].fill(0);
                drop(st);
                self.resp(&sqe, Status::SUCCESS, 0)
            }
            _ => self.resp(&sqe, trellis_nvme::status::generic::INVALID_OPCODE.dnr(), 0),
        }
    }

    fn fabrics(&mut self, sqe: Sqe, icd: Vec<u8>) -> R<()> {
        let auth = self.sh.cfg.auth_close_after_reply;
        match sqe.fctype() {
            fabrics::fctype::CONNECT => {
                self.qid = ConnectCmd::decode(&sqe).qid;
                let atr = if auth {
                    trellis_nvme::auth::CONNECT_AUTHREQ_ATR
                } else {
                    0
                };
                self.resp(&sqe, Status::SUCCESS, 1 | atr)
            }
            fabrics::fctype::AUTH_SEND if auth => {
                self.data_out(&sqe, icd)?;
                self.auth_sends += 1;
                self.resp(&sqe, Status::SUCCESS, 0)
            }
            fabrics::fctype::AUTH_RECV if auth => {
                if self.auth_sends >= 2 {
                    // Negotiate and Reply are in: go away without an answer.
                    let _ = self.s.shutdown(std::net::Shutdown::Both);
                    return Err(bad("closed after the host's DH-HMAC-CHAP Reply"));
                }
                use trellis_nvme::auth::{AuthCmd, Challenge, Message};
                let mut m = Message::Challenge(Challenge {
                    t_id: self.qid,
                    hash_id: 1,
                    dh_id: 0,
                    seqnum: 1,
                    c1: vec![0x5a; 32],
                    dhv: Vec::new(),
                })
                .encode();
                m.resize(AuthCmd::decode(&sqe).len as usize, 0);
                self.send_read(&sqe, &m, false)
            }
            fabrics::fctype::PROPERTY_GET => {
                let p = PropertyCmd::decode(&sqe);
                let v: u64 = match p.offset {
                    prop::CAP => fabrics::cap(self.sh.cfg.mqes, 15),
                    prop::VS => fabrics::VS_1_4 as u64,
                    prop::CC => self.cc as u64,
                    prop::CSTS => {
                        let shn = self.cc & fabrics::cc::SHN_MASK != 0;
                        if shn {
                            fabrics::csts::SHST_COMPLETE as u64
                        } else {
                            (self.cc & 1) as u64
                        }
                    }
                    _ => 0,
                };
                self.resp64(&sqe, v)
            }
            fabrics::fctype::PROPERTY_SET => {
                let p = PropertyCmd::decode(&sqe);
                if p.offset == prop::CC {
                    self.cc = p.value as u32;
                }
                self.resp(&sqe, Status::SUCCESS, 0)
            }
            _ => self.resp(&sqe, trellis_nvme::status::generic::INVALID_OPCODE.dnr(), 0),
        }
    }

    fn admin(&mut self, sqe: Sqe) -> R<()> {
        let cfg = &self.sh.cfg;
        match sqe.opcode() {
            admin::IDENTIFY => {
                let mut page = vec![0u8; identify::IDENTIFY_LEN];
                match (sqe.cdw10() & 0xff) as u8 {
                    cns::CONTROLLER => identify::encode_controller(
                        &ControllerInfo {
                            kind: ControllerType::Io,
                            serial: "fake0001".into(),
                            model: "trellis fake target".into(),
                            firmware: "0.1".into(),
                            cntlid: 1,
                            version: fabrics::VS_1_4,
                            mdts: 5,
                            subnqn: cfg.subnqn.clone(),
                            nn: 1,
                            icd_bytes: cfg.icd_bytes,
                            maxcmd: cfg.mqes + 1,
                            vwc: true,
                            kas: 10,
                            aerl: 3,
                            oaes: 0,
                            ana: None,
                            reservations: false,
                        },
                        &mut page,
                    ),
                    cns::NAMESPACE => identify::encode_namespace(
                        &NamespaceInfo {
                            size_blocks: cfg.blocks,
                            lbads: cfg.block_size.trailing_zeros() as u8,
                            nguid: [7; 16],
                            eui64: [0; 8],
                            uuid: [0; 16],
                            read_only: false,
                            deallocate_reads_zeroes: true,
                            anagrpid: 0,
                            rescap: 0,
                            used_blocks: None,
                        },
                        &mut page,
                    ),
                    _ => {}
                }
                self.send_read(&sqe, &page, false)
            }
            admin::SET_FEATURES => self.resp(&sqe, Status::SUCCESS, 0x000f_000f),
            admin::KEEP_ALIVE => self.resp(&sqe, Status::SUCCESS, 0),
            admin::GET_LOG_PAGE => {
                let g = GetLogPage::decode(&sqe);
                let mut logb = Vec::new();
                let e = DiscoveryEntry {
                    adrfam: 1,
                    subtype: log::subtype::NVME,
                    treq: 0,
                    portid: 1,
                    trsvcid: self.s.local_addr()?.port().to_string(),
                    subnqn: cfg.subnqn.clone(),
                    traddr: "127.0.0.1".into(),
                    sectype: 0,
                };
                log::encode_discovery_log(1, &[e], &mut logb);
                let mut out = vec![0u8; g.len_bytes as usize];
                log::copy_window(&logb, g.offset_bytes, &mut out);
                self.send_read(&sqe, &out, false)
            }
            _ => self.resp(&sqe, trellis_nvme::status::generic::INVALID_OPCODE.dnr(), 0),
        }
    }

    fn range(&self, sqe: &Sqe) -> (usize, usize) {
        let bs = self.sh.cfg.block_size as usize;
        (sqe.slba() as usize * bs, sqe.nlb() as usize * bs)
    }

    fn read(&mut self, sqe: Sqe) -> R<()> {
        let (off, len) = self.range(&sqe);
        if off + len > self.sh.store.lock().unwrap().len() {
            return self.resp(
                &sqe,
                trellis_nvme::status::generic::LBA_OUT_OF_RANGE.dnr(),
                0,
            );
        }
        let data = self.sh.store.lock().unwrap()[off..off + len].to_vec();
        if !self.sh.cfg.read_delay.is_zero() {
            std::thread::sleep(self.sh.cfg.read_delay);
        }
        let n = self.sh.reads.fetch_add(1, Ordering::Relaxed);
        let fault = if n == self.sh.cfg.fault_after_reads {
            self.sh.cfg.fault
        } else {
            Fault::None
        };
        if fault != Fault::None && fault != Fault::CorruptData {
            self.broken = true;
        }
        self.send_read_with(sqe, data, fault)
    }

    /// Answers a read of `data` the way `fault` says: the happy path, or
    /// the one misbehaviour a host test asked for.
    fn send_read_with(&mut self, sqe: Sqe, data: Vec<u8>, fault: Fault) -> R<()> {
        match fault {
            Fault::None => self.send_read(&sqe, &data, false),
            Fault::CorruptData => {
                let mut d = data;
                let i = d.len() / 2 + 100;
                d[i] ^= 0x40;
                self.send_read(&sqe, &d, false)
            }
            Fault::WrongPduType => {
                let dh = DataHdr {
                    cccid: sqe.cid(),
                    ttag: 0,
                    datao: 0,
                    datal: 4,
                };
                let v = raw::data_pdu(PduType::H2CData, &dh, 0, self.d, &[0; 4], 0);
                self.s.write_all(&v)
            }
            Fault::WrongCid => {
                let mut bad = sqe;
                bad.set_cid(sqe.cid() ^ 0x8000);
                self.send_read(&bad, &data, false)
            }
            Fault::ShortData => {
                let half = &data[..data.len() / 2];
                self.send_c2h(&sqe, 0, half, 0, false)?;
                self.resp(&sqe, Status::SUCCESS, 0)
            }
            Fault::Silent => Ok(()),
            Fault::BadDataDigest => self.send_read(&sqe, &data, true),
            Fault::CloseMidData => {
                let mut h = [0u8; 32];
                let dh = DataHdr {
                    cccid: sqe.cid(),
                    ttag: 0,
                    datao: 0,
                    datal: data.len() as u32,
                };
                let n =
                    pdu::encode_data_hdr(&mut h, PduType::C2HData, &dh, flags::LAST_PDU, self.d);
                self.s.write_all(&h[..n])?;
                self.s.write_all(&data[..data.len() / 2])?;
                self.s.shutdown(std::net::Shutdown::Both)
            }
            Fault::TermReq => {
                let mut b = [0u8; 200];
                let n = pdu::encode_term_req(
                    &mut b,
                    PduType::C2HTermReq,
                    Fatal::new(pdu::fes::INVALID_HEADER_FIELD, 4),
                    &sqe.0,
                );
                self.s.write_all(&b[..n])
            }
            Fault::BadOffset => {
                self.send_c2h(
                    &sqe,
                    512,
                    &data[..data.len().min(512)],
                    flags::LAST_PDU,
                    false,
                )?;
                self.resp(&sqe, Status::SUCCESS, 0)
            }
        }
    }

    fn write(&mut self, sqe: Sqe, icd: Vec<u8>) -> R<()> {
        let data = self.data_out(&sqe, icd)?;
        let (off, len) = self.range(&sqe);
        if off + len > self.sh.store.lock().unwrap().len() || data.len() != len {
            return self.resp(
                &sqe,
                trellis_nvme::status::generic::LBA_OUT_OF_RANGE.dnr(),
                0,
            );
        }
        self.sh.store.lock().unwrap()[off..off + len].copy_from_slice(&data);
        self.resp(&sqe, Status::SUCCESS, 0)
    }

    /// The command's host-to-controller data: in the capsule, or fetched with
    /// one R2T for the whole length (answered by H2CData PDUs).
    fn data_out(&mut self, sqe: &Sqe, icd: Vec<u8>) -> R<Vec<u8>> {
        let len = sqe.sgl().length as usize;
        if !icd.is_empty() || len == 0 {
            return Ok(icd);
        }
        let mut h = [0u8; 32];
        let r = R2t {
            cccid: sqe.cid(),
            ttag: 1,
            r2to: 0,
            r2tl: len as u32,
        };
        let n = pdu::encode_r2t(&mut h, &r, self.d);
        self.s.write_all(&h[..n])?;
        let mut data = Vec::with_capacity(len);
        while data.len() < len {
            let p = self.read_pdu()?;
            let l =
                check_layout(&p.ch, true, false, self.d, MAX_PLEN).map_err(|_| bad("layout"))?;
            if l.pdu_type == PduType::CapsuleCmd {
                // The host keeps submitting while we wait for this command's data.
                self.pending.push_back(p);
                continue;
            }
            let b = &p.bytes;
            let dh = DataHdr::decode(b);
            if l.pdu_type != PduType::H2CData
                || dh.cccid != sqe.cid()
                || dh.ttag != 1
                || dh.datao as usize != data.len()
                || dh.datal > self.sh.cfg.maxh2cdata
            {
                return Err(bad("H2CData"));
            }
            let chunk = &b[l.data_off..l.data_off + l.data_len];
            if l.ddgst && crc::digest(chunk) != trellis_nvme::le32(b, l.data_off + l.data_len) {
                return Err(bad("H2CData digest"));
            }
            data.extend_from_slice(chunk);
            let last = l.flags & flags::LAST_PDU != 0;
            if last != (data.len() == len) {
                return Err(bad("LAST_PDU"));
            }
        }
        Ok(data)
    }

    fn send_read(&mut self, sqe: &Sqe, data: &[u8], corrupt: bool) -> R<()> {
        // Split in 16 KiB PDUs so hosts see multi-PDU reads too.
        let mut off = 0;
        while off < data.len() {
            let n = (data.len() - off).min(16 << 10);
            let last = off + n == data.len();
            let fl = if last { flags::LAST_PDU } else { 0 };
            self.send_c2h(sqe, off, &data[off..off + n], fl, corrupt)?;
            off += n;
        }
        self.resp(sqe, Status::SUCCESS, 0)
    }

    fn send_c2h(&mut self, sqe: &Sqe, off: usize, d: &[u8], fl: u8, corrupt: bool) -> R<()> {
        let dh = DataHdr {
            cccid: sqe.cid(),
            ttag: 0,
            datao: off as u32,
            datal: d.len() as u32,
        };
        let v = raw::data_pdu(PduType::C2HData, &dh, fl, self.d, d, corrupt as u32);
        self.s.write_all(&v)
    }

    fn resp(&mut self, sqe: &Sqe, status: Status, dw0: u32) -> R<()> {
        self.send_cqe(Cqe {
            dw0,
            dw1: 0,
            sqhd: 0,
            sqid: self.qid,
            cid: sqe.cid(),
            status,
        })
    }
    fn resp64(&mut self, sqe: &Sqe, v: u64) -> R<()> {
        self.send_cqe(Cqe {
            dw0: v as u32,
            dw1: (v >> 32) as u32,
            sqhd: 0,
            sqid: self.qid,
            cid: sqe.cid(),
            status: Status::SUCCESS,
        })
    }
    fn send_cqe(&mut self, c: Cqe) -> R<()> {
        let mut b = [0u8; 32];
        let n = pdu::encode_capsule_resp(&mut b, &c, self.d);
        self.s.write_all(&b[..n])
    }
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}
