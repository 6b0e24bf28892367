//! A blocking NVMe/TCP initiator for tests: one command at a time, ordinary
//! I/O through the host library's engine, raw PDUs where a test must forge.
//!
//! [`Queue::cmd`] runs a command through `trellis_host::Engine` (the same
//! code that ships: ICReq, capsules, in-capsule data, R2T/H2CData, C2HData
//! reassembly, digests, CID checks). The raw methods ([`Queue::send_capsule`],
//! [`Queue::send_h2c`], [`Queue::recv`], the public socket `s`) bypass the
//! engine; a test using them consumes their answers itself, so the engine
//! never sees a PDU for a command it did not send.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use trellis_host::{Engine, EngineConfig, Xfer};
use trellis_nvme::fabrics::{ConnectCmd, ConnectData, PropertyCmd};
use trellis_nvme::pdu::{self, DataHdr, Digests, PduType, ADMIN_ICD_BYTES};
use trellis_nvme::{Cqe, Sqe};

pub use crate::raw::Pdu;

/// The largest transfer one command may move (a slot buffer; the engine
/// allocates them zeroed, so untouched pages cost nothing); tests of a
/// target configured with an 8 MiB MDTS move that much in one command.
pub const MAX_XFER: usize = 16 << 20;
/// Socket read timeout: a test that waits longer has failed.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest PDU accepted by the raw [`Queue::recv`].
const RAW_MAX_PLEN: usize = MAX_XFER + 4096;

pub struct Queue {
    pub s: TcpStream,
    pub dg: Digests,
    /// Last CID handed out by [`Queue::next_cid`] (raw commands only).
    pub cid: u16,
    engine: Engine,
}

impl Queue {
    /// TCP connect only (no ICReq), for tests that misbehave from byte 0.
    pub fn raw(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).expect("connect to the target");
        s.set_read_timeout(Some(READ_TIMEOUT))
            .expect("read timeout");
        s.set_nodelay(true).expect("TCP_NODELAY");
        s
    }

    /// Wraps a connected socket without sending anything (no ICReq yet).
    pub fn from_stream(s: TcpStream, dg: Digests) -> Queue {
        let engine = Engine::new(EngineConfig {
            // Not the admin queue: the in-capsule limit is then the one each
            // command passes to `cmd` (Fabrics commands always get 8 KiB).
            qid: 1,
            queue_size: 4,
            digests: dg,
            buf_bytes: MAX_XFER,
            staging_bytes: 256 << 10,
            max_pdu_bytes: RAW_MAX_PLEN,
            command_timeout: READ_TIMEOUT,
            credit_token: None,
            credit_share: 1,
        });
        Queue {
            s,
            dg,
            cid: 0,
            engine,
        }
    }

    /// Connects and exchanges ICReq/ICResp (the engine checks the ICResp:
    /// echoed digests, CPDA 0, a valid MAXH2CDATA).
    pub fn open(addr: SocketAddr, dg: Digests) -> Queue {
        Self::open_stream(Self::raw(addr), dg)
    }

    /// As [`open`](Self::open) on a socket the caller connected (from a
    /// chosen source address, say).
    pub fn open_stream(s: TcpStream, dg: Digests) -> Queue {
        s.set_read_timeout(Some(READ_TIMEOUT))
            .expect("read timeout");
        s.set_nodelay(true).expect("TCP_NODELAY");
        let mut q = Queue::from_stream(s, dg);
        q.engine.start();
        q.flush();
        while !q.engine.ic_done() {
            if let Err(e) = q.pump() {
                panic!("no valid ICResp: {e}");
            }
        }
        q
    }

    pub fn next_cid(&mut self) -> u16 {
        // High bits set, like Linux's generation counter; the engine's own
        // CIDs are never in flight while raw commands are.
        self.cid = self.cid.wrapping_add(0x1001);
        self.cid
    }

    /// Sends what the engine queued (commands, H2CData answering R2Ts).
    fn flush(&mut self) {
        let out = self.engine.take_output();
        if !out.is_empty() {
            self.s.write_all(&out).expect("send to the target");
        }
    }

    /// One blocking read into the engine, which parses what arrived.
    fn pump(&mut self) -> Result<(), String> {
        let space = self.engine.recv_space();
        let n = self.s.read(space).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed".into());
        }
        self.engine
            .recv_done(n, trellis_host::queue::now_ns())
            .map_err(|e| e.to_string())
    }

    /// Runs one command to completion through the engine: `out` goes in the
    /// capsule if it fits in `icd_max` (Fabrics commands: 8 KiB), else on
    /// R2T; `in_len` bytes come back by C2HData.
    pub fn cmd(&mut self, sqe: Sqe, out: &[u8], in_len: usize, icd_max: usize) -> (Cqe, Vec<u8>) {
        assert!(
            out.len() <= MAX_XFER && in_len <= MAX_XFER,
            "transfer too large"
        );
        let slot = self.engine.alloc().expect("a free engine slot");
        self.engine.buf_mut(slot)[..out.len()].copy_from_slice(out);
        let xfer = match (out.len(), in_len) {
            (0, 0) => Xfer::None,
            (0, n) => Xfer::FromCtrl(n as u32),
            (n, _) => Xfer::ToCtrl(n as u32),
        };
        self.engine
            .set_icd_bytes(icd_max.min(u32::MAX as usize) as u32);
        if let Err(e) = self
            .engine
            .submit(slot, sqe, xfer, trellis_host::queue::now_ns())
        {
            panic!("submit: {e}");
        }
        let cid = self.engine.cid_of(slot);
        loop {
            self.flush();
            if let Some(c) = self.engine.next_completion() {
                assert_eq!(c.slot, slot, "completion for our command");
                let data = if c.status.is_success() && in_len > 0 {
                    self.engine.buf(slot)[..in_len].to_vec()
                } else {
                    Vec::new()
                };
                self.engine.free(slot);
                let cqe = Cqe {
                    dw0: c.dw0,
                    dw1: c.dw1,
                    sqhd: c.sqhd,
                    sqid: 0,
                    cid,
                    status: c.status,
                };
                return (cqe, data);
            }
            if let Err(e) = self.pump() {
                panic!("waiting for the completion of CID {cid:#06x}: {e}");
            }
        }
    }

    // ---- raw PDUs ------------------------------------------------------------

    /// Sends a capsule as given (CID and SGL untouched).
    pub fn send_capsule(&mut self, sqe: &Sqe, icd: &[u8]) {
        let b = crate::raw::capsule(sqe, icd, self.dg);
        self.s.write_all(&b).expect("send a capsule");
    }

    /// Sends `data` as H2CData PDUs of `chunk` bytes from offset `base`,
    /// whatever the target asked for (tests forge out-of-range data so).
    pub fn send_h2c(&mut self, ttag: u16, cid: u16, data: &[u8], base: u32, chunk: usize) {
        for (i, c) in data.chunks(chunk).enumerate() {
            let last = (i + 1) * chunk >= data.len();
            let h = DataHdr {
                cccid: cid,
                ttag,
                datao: base + (i * chunk) as u32,
                datal: c.len() as u32,
            };
            let fl = if last { pdu::flags::LAST_PDU } else { 0 };
            let b = crate::raw::data_pdu(PduType::H2CData, &h, fl, self.dg, c, 0);
            self.s.write_all(&b).expect("send H2CData");
        }
    }

    /// Reads one whole PDU straight from the socket, or None on EOF/error.
    pub fn recv(&mut self) -> Option<Pdu> {
        crate::raw::read_pdu(&mut self.s, RAW_MAX_PLEN).ok()
    }

    /// True once the target has closed the connection (after any PDUs).
    pub fn closed(&mut self) -> bool {
        while self.recv().is_some() {}
        true
    }

    // ---- Fabrics helpers -----------------------------------------------------

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
        self.cmd(sqe, &d, 0, ADMIN_ICD_BYTES).0
    }

    pub fn prop_get(&mut self, offset: u32, size8: bool) -> u64 {
        let sqe = PropertyCmd {
            size8,
            offset,
            value: 0,
        }
        .to_sqe(0, false);
        let (c, _) = self.cmd(sqe, &[], 0, 0);
        assert!(
            c.status.is_success(),
            "property get {offset:#x}: {:?}",
            c.status
        );
        c.dw0 as u64 | (c.dw1 as u64) << 32
    }

    pub fn prop_set(&mut self, offset: u32, value: u64) -> Cqe {
        let sqe = PropertyCmd {
            size8: false,
            offset,
            value,
        }
        .to_sqe(0, true);
        self.cmd(sqe, &[], 0, 0).0
    }
}
