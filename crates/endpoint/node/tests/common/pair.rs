//! `Pair`: the host library's sans-IO [`Engine`] wired to the target's
//! sans-IO [`Conn`] through in-memory byte buffers, one [`Link`] per queue.
//!
//! No sockets, no threads, no wall clock: time is a virtual `u64` of
//! nanoseconds (`Pair::now`) that only moves when a test calls
//! [`Pair::tick`] or [`Pair::advance_to`], and every byte takes the same
//! path on every run, so each test is deterministic. [`Pair::drive`] moves
//! bytes both ways until neither side has anything left to send (as
//! quinn-proto's test `Pair` does); a test may tamper with each PDU the
//! host sends ([`Link::tamper`]) to corrupt a digest or break a header,
//! and every byte sent either way is kept ([`Link::h2c`], [`Link::c2h`])
//! for the tests to decode.
//!
//! The namespace is a RAM backend, whose commands complete synchronously
//! inside `Conn::process`: no `backend_done` is ever due, which is why the
//! harness has no completion queue to poll.
//!
//! Used by `tests/pair.rs` only (not declared in `common/mod.rs`, so the
//! socket-based test binaries do not build it).
#![allow(dead_code)] // not every test uses every helper

use std::net::SocketAddr;
use std::sync::Arc;
use trellis_host::{Completion, Engine, EngineConfig, Xfer};
use trellis_node::config::{BackendKind, Config, ListenerConfig, ListenerKind, NamespaceConfig};
use trellis_node::data::nvme::exec::{Ctx, NsQueue};
use trellis_node::data::tcp::conn::Conn;
use trellis_node::state::identity::NodeId;
use trellis_node::state::subsystem::Registry;
use trellis_nvme::fabrics::{ConnectCmd, ConnectData, PropertyCmd};
use trellis_nvme::pdu::Digests;
use trellis_nvme::{le32, Sqe};

pub const NQN: &str = "nqn.2026-11.io.trellis:pair";
pub const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000fa11";
/// The namespace: 1 MiB of RAM in 512-byte blocks.
pub const NS_BYTES: u64 = 1 << 20;
/// Where the virtual clock starts (not 0: a zero time would hide a
/// deadline computed from an unset timestamp).
pub const T0: u64 = 1_000_000_000;
/// The host's data buffer per slot.
pub const BUF_BYTES: usize = 64 << 10;
/// CC as the host library writes it: IOSQES 6, IOCQES 4, EN.
pub const CC_ENABLE: u32 = 6 << 16 | 4 << 20 | 1;

/// Rewrites one whole PDU the host sends (clearing it drops the PDU).
pub type Tamper = Box<dyn FnMut(&mut Vec<u8>)>;

/// One queue: a host engine, the target connection it talks to, and what
/// went over the "wire" between them.
pub struct Link {
    pub host: Engine,
    pub conn: Conn,
    /// Every byte the target received from the host (after `tamper`).
    pub h2c: Vec<u8>,
    /// Every byte the target sent.
    pub c2h: Vec<u8>,
    /// Called with each whole PDU the host sends, before the target sees
    /// it: it may change bytes, or clear the PDU to drop it.
    pub tamper: Option<Tamper>,
    /// The host engine's terminal error, once it failed.
    pub host_error: Option<String>,
    /// The target closed the connection (`wants_close`, then `on_close`),
    /// at this virtual time.
    pub closed_at: Option<u64>,
}

/// A target registry, a virtual clock, and the queues between one host and it.
pub struct Pair {
    pub now: u64,
    pub reg: Arc<Registry>,
    queues: Vec<Option<NsQueue>>,
    scratch: Vec<u8>,
    pub links: Vec<Link>,
    /// The most bytes moved in one step either way: small values cut PDUs
    /// into pieces, as a socket may.
    pub chunk: usize,
}

impl Pair {
    pub fn new() -> Pair {
        Pair::with_config(|_| {})
    }

    /// A pair whose target configuration is `tune`d first.
    pub fn with_config(tune: impl FnOnce(&mut Config)) -> Pair {
        let mut cfg = Config::embedded_default();
        cfg.listeners = vec![ListenerConfig {
            name: None,
            addr: "127.0.0.1:4420".parse().unwrap(),
            kind: None,
            ana_state: None,
            secure_channel: None,
        }];
        cfg.subsystems[0].nqn = NQN.into();
        cfg.subsystems[0].namespaces = vec![NamespaceConfig::sized(BackendKind::Ram, NS_BYTES)];
        tune(&mut cfg);
        // An identity in memory: no state directory is read or written.
        let node = NodeId::in_memory(uuid::Uuid::from_u128(0xFA11));
        let reg = Registry::build_with(&cfg, node).expect("registry");
        Pair {
            now: T0,
            reg: Arc::new(reg),
            queues: Vec::new(),
            scratch: Vec::new(),
            links: Vec::new(),
            chunk: usize::MAX,
        }
    }

    /// A new queue for `qid` asking for `digests`: the target's connection
    /// is created now (its connect timer starts), the host has queued its
    /// ICReq, and nothing has moved yet. Returns the link's index.
    pub fn open_raw(&mut self, qid: u16, digests: Digests) -> usize {
        let idx = self.links.len();
        let host = Engine::new(EngineConfig {
            qid,
            digests,
            buf_bytes: BUF_BYTES,
            ..EngineConfig::default()
        });
        let peer: SocketAddr = format!("127.0.0.1:{}", 40_000 + idx).parse().unwrap();
        let local: SocketAddr = "127.0.0.1:4420".parse().unwrap();
        let conn = Conn::new(
            idx as u32,
            self.reg.clone(),
            peer,
            local,
            ListenerKind::Both,
            1,
            self.now,
        );
        self.links.push(Link {
            host,
            conn,
            h2c: Vec::new(),
            c2h: Vec::new(),
            tamper: None,
            host_error: None,
            closed_at: None,
        });
        idx
    }

    /// As [`Pair::open_raw`], then the ICReq/ICResp exchange.
    pub fn open(&mut self, qid: u16, digests: Digests) -> usize {
        let l = self.open_raw(qid, digests);
        self.links[l].host.start();
        self.drive();
        l
    }

    /// Moves bytes both ways on every open link until no side has output
    /// left. Panics on a livelock (a bound on the rounds).
    pub fn drive(&mut self) {
        for _ in 0..10_000 {
            let mut moved = false;
            for l in 0..self.links.len() {
                moved |= self.host_to_target(l);
                moved |= self.target_to_host(l);
            }
            if !moved {
                return;
            }
        }
        panic!("drive: the pair did not become quiescent");
    }

    /// The host's queued output, PDU by PDU through `tamper`, into the
    /// target's receive space. True when anything moved.
    fn host_to_target(&mut self, l: usize) -> bool {
        let link = &mut self.links[l];
        if link.closed_at.is_some() || link.host_error.is_some() || !link.host.has_output() {
            return false;
        }
        let out = link.host.take_output();
        let mut bytes = Vec::with_capacity(out.len());
        for mut p in split_pdus(&out).into_iter().map(<[u8]>::to_vec) {
            if let Some(t) = link.tamper.as_mut() {
                t(&mut p);
            }
            bytes.extend_from_slice(&p);
        }
        link.h2c.extend_from_slice(&bytes);
        let mut off = 0;
        while off < bytes.len() && !link.conn.is_closing() {
            let space = link.conn.rx_space();
            let n = space.len().min(self.chunk).min(bytes.len() - off);
            assert!(n > 0, "the target has no receive space");
            space[..n].copy_from_slice(&bytes[off..off + n]);
            link.conn.rx_commit(n);
            off += n;
            let mut ctx = Ctx {
                icd: &[],
                auth: None,
                now_ns: self.now,
                queues: &mut self.queues,
                reg: &self.reg,
                scratch: &mut self.scratch,
            };
            link.conn.process(&mut ctx);
        }
        true
    }

    /// The target's queued output into the host engine; closes the link
    /// once the target wants it closed. True when anything moved.
    fn target_to_host(&mut self, l: usize) -> bool {
        let link = &mut self.links[l];
        if link.closed_at.is_some() {
            return false;
        }
        let mut out = Vec::new();
        while link.conn.has_output() {
            let mut iov = Vec::new();
            link.conn.tx_iovecs(&mut iov, 64);
            let mut n = 0;
            for v in &iov {
                // SAFETY: the iovecs point at bytes the connection keeps
                // unchanged until tx_advance, which comes after this copy.
                let b = unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) };
                out.extend_from_slice(b);
                n += v.iov_len;
            }
            link.conn.tx_advance(n);
        }
        for piece in out.chunks(self.chunk.max(1)) {
            if link.host_error.is_none() {
                if let Err(e) = link.host.feed(piece, self.now) {
                    link.host_error = Some(e.to_string());
                }
            }
        }
        link.c2h.extend_from_slice(&out);
        if link.conn.wants_close() {
            link.conn.on_close();
            link.closed_at = Some(self.now);
        }
        // Answers that waited for output room, or input that did.
        if link.conn.rx_pending() {
            let mut ctx = Ctx {
                icd: &[],
                auth: None,
                now_ns: self.now,
                queues: &mut self.queues,
                reg: &self.reg,
                scratch: &mut self.scratch,
            };
            link.conn.process(&mut ctx);
        }
        !out.is_empty()
    }

    /// The earliest deadline of any open target connection.
    pub fn next_timeout(&self) -> Option<u64> {
        let open = self.links.iter().filter(|l| l.closed_at.is_none());
        open.filter_map(|l| l.conn.next_timeout()).min()
    }

    /// Sets the clock to `t` (never backwards), runs every open
    /// connection's timers and the host engines' command timeouts, then
    /// drives the pair.
    pub fn advance_to(&mut self, t: u64) {
        self.now = self.now.max(t);
        for link in self.links.iter_mut().filter(|l| l.closed_at.is_none()) {
            link.conn.handle_timeout(self.now);
            if link.host_error.is_none() {
                if let Err(e) = link.host.check_timeouts(self.now) {
                    link.host_error = Some(e.to_string());
                }
            }
        }
        self.drive();
    }

    /// Advances to the next deadline, or by 1 ns when the deadline is now
    /// (a timer fires only once its limit is exceeded, not reached).
    /// Returns the new time, or None when no connection has a timer.
    pub fn tick(&mut self) -> Option<u64> {
        let t = self.next_timeout()?.max(self.now + 1);
        self.advance_to(t);
        Some(self.now)
    }

    /// Submits `sqe` on link `l` with `data` in the slot buffer (writes) or
    /// `xfer`'s length to read, drives the pair, and returns the completion
    /// and the slot buffer's first bytes (read data). None when the
    /// command did not complete.
    pub fn exec(
        &mut self,
        l: usize,
        sqe: Sqe,
        xfer: Xfer,
        data: &[u8],
    ) -> Option<(Completion, Vec<u8>)> {
        let host = &mut self.links[l].host;
        let slot = host.alloc().expect("a free host slot");
        host.buf_mut(slot)[..data.len()].copy_from_slice(data);
        host.submit(slot, sqe, xfer, self.now).expect("submit");
        self.drive();
        self.completion(l, slot, xfer)
    }

    /// The completion of `slot` on link `l`, if it arrived, with its data;
    /// frees the slot. Other completions stay queued.
    pub fn completion(&mut self, l: usize, slot: u16, xfer: Xfer) -> Option<(Completion, Vec<u8>)> {
        let host = &mut self.links[l].host;
        let mut found = None;
        for _ in 0..host.completions_pending() {
            let c = host.next_completion()?;
            if c.slot == slot && found.is_none() {
                found = Some(c);
            } else {
                host.push_completion(c);
            }
        }
        let c = found?;
        let len = match xfer {
            Xfer::FromCtrl(n) => n as usize,
            _ => 0,
        };
        let data = host.buf(slot)[..len].to_vec();
        host.free(slot);
        Some((c, data))
    }

    /// Fabrics Connect on link `l` (queue `qid` of controller `cntlid`)
    /// with `cattr` (bit 2: SQ flow control disabled) and `kato_ms`.
    pub fn connect(&mut self, l: usize, cntlid: u16, cattr: u8, kato_ms: u32) -> Completion {
        let qid = self.links[l].host.config().qid;
        let cmd = ConnectCmd {
            recfmt: 0,
            qid,
            sqsize: self.links[l].host.queue_size() - 1,
            cattr,
            kato_ms,
        };
        let mut d = vec![0u8; trellis_nvme::fabrics::CONNECT_DATA_LEN];
        ConnectData {
            hostid: [0xFA; 16],
            cntlid,
            subnqn: NQN.into(),
            hostnqn: HOST.into(),
        }
        .encode(&mut d);
        let xfer = Xfer::ToCtrl(d.len() as u32);
        self.exec(l, cmd.to_sqe(0), xfer, &d)
            .expect("Connect answered")
            .0
    }

    /// Property Set of CC (EN=1) on admin link `l`: the controller ready.
    pub fn enable(&mut self, l: usize) -> Completion {
        let sqe = PropertyCmd {
            size8: false,
            offset: trellis_nvme::fabrics::prop::CC,
            value: CC_ENABLE as u64,
        }
        .to_sqe(0, true);
        self.exec(l, sqe, Xfer::None, &[])
            .expect("Property Set answered")
            .0
    }

    /// An enabled controller's admin queue and one I/O queue (`io_cattr`
    /// on its Connect), both asking for `digests`: (admin, io) links.
    pub fn controller(&mut self, digests: Digests, io_cattr: u8) -> (usize, usize) {
        let admin = self.open(0, digests);
        let c = self.connect(admin, trellis_nvme::fabrics::CNTLID_DYNAMIC, 0, 0);
        assert!(c.status.is_success(), "admin Connect: {}", c.status);
        let cntlid = c.dw0 as u16;
        assert!(self.enable(admin).status.is_success(), "enable");
        let io = self.open(1, digests);
        let c = self.connect(io, cntlid, io_cattr, 0);
        assert!(c.status.is_success(), "I/O Connect: {}", c.status);
        (admin, io)
    }
}

/// The PDUs in a byte stream, split by their PLEN (a partial PDU at the
/// end is left out).
pub fn split_pdus(stream: &[u8]) -> Vec<&[u8]> {
    let mut v = Vec::new();
    let mut at = 0;
    while at + 8 <= stream.len() {
        let plen = le32(stream, at + 4) as usize;
        if plen < 8 || at + plen > stream.len() {
            break;
        }
        v.push(&stream[at..at + plen]);
        at += plen;
    }
    v
}
