//! Controller setup over the admin queue: Connect, enable, Identify, number
//! of queues, I/O queue creation, Keep Alive, shutdown, and discovery.
//!
//! These paths run once per session (or every KATO/2 for Keep Alive), so
//! they favour clarity over speed and block the calling thread.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::RngCore;
use trellis_nvme::ana::{self, AnaLog, AnaLogError, AnaState};
use trellis_nvme::auth::{self, AuthCmd};
use trellis_nvme::dhchap::Secret;
use trellis_nvme::dhchap_host::{HostAuth, HostFailure};
use trellis_nvme::fabrics::{self, prop, ConnectCmd, ConnectData, PropertyCmd, DISCOVERY_NQN};
use trellis_nvme::identify::{cns, IdCtrl, IdNs, IDENTIFY_LEN};
use trellis_nvme::log::{self, DiscoveryEntry, GetLogPage, DISC_ENTRY_LEN, DISC_HDR_LEN};
use trellis_nvme::pdu::Digests;
use trellis_nvme::sqe::admin;
use trellis_nvme::Sqe;

use crate::engine::{EngineConfig, Xfer, MAX_QUEUE_SIZE};
use crate::error::{Error, Result};
use crate::queue::{resolve, Queue, SockOpts};

/// Admin queue depth; both reference hosts use 32.
const ADMIN_QUEUE_SIZE: u16 = 32;
/// Admin buffers hold one Identify page or one 4 KiB log chunk (and Connect data).
const ADMIN_BUF_BYTES: usize = 8192;
/// Discovery logs longer than this many entries are refused (bounded memory).
const MAX_DISCOVERY_ENTRIES: u64 = 1024;
/// Feature identifier of Number of Queues.
const FID_NUM_QUEUES: u32 = 0x07;
/// Feature identifier of Asynchronous Event Configuration.
const FID_ASYNC_EVENT_CONFIG: u32 = 0x0B;

/// Host-wide settings shared by every queue of a controller.
#[derive(Clone, Debug)]
pub struct HostConfig {
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub digests: Digests,
    pub connect_timeout: Duration,
    pub command_timeout: Duration,
    /// Keep Alive Timeout sent in the admin Connect; 0 disables keep-alive
    /// (fine for short-lived tools). With KATO set, [`Controller::tick`] sends a
    /// Keep Alive every KATO/2.
    pub kato_ms: u32,
    pub staging_bytes: usize,
    /// SO_SNDBUF/SO_RCVBUF per connection; 0 = kernel autotuning.
    pub sock_buf_bytes: usize,
    /// Ask I/O queues for the target's I/O credits (see
    /// [`EngineConfig::credit_token`]); None: never.
    pub credit_token: Option<std::num::NonZeroU16>,
    /// See [`EngineConfig::credit_share`].
    pub credit_share: u16,
    /// DH-HMAC-CHAP secret (`DHHC-1:..`, parse with `Secret::parse`): every
    /// queue whose Connect response asks (ATR) authenticates with it.
    pub dhchap_secret: Option<Secret>,
    /// The controller's secret: set, the host authenticates the controller
    /// too (bidirectional).
    pub dhchap_ctrl_secret: Option<Secret>,
    /// NVMe/TCP TLS 1.3 with a PSK on every queue (None: plain TCP).
    pub tls: Option<HostTls>,
}

/// A host's TLS setup: its configured PSK (`NVMeTLSkey-1:..`, parse with
/// `ConfiguredPsk::parse`), from which each connection derives the TLS PSK
/// for (host NQN, subsystem NQN), as nvme-cli does for the Linux host.
#[derive(Clone, Debug)]
pub struct HostTls {
    pub key: trellis_nvme::tls_psk::ConfiguredPsk,
    /// PSK identity format: 0 (`NVMe0R01 <hostnqn> <subnqn>`, what Linux
    /// 6.12 looks up) or 1 (TP 8018: with the PSK digest).
    pub identity_version: u8,
    pub derivation: trellis_nvme::tls_psk::Derivation,
    /// OpenSSL TLS 1.3 suite list to offer (None: both NVMe/TCP suites).
    pub suites: Option<String>,
}

impl HostTls {
    pub fn new(key: trellis_nvme::tls_psk::ConfiguredPsk) -> HostTls {
        HostTls {
            key,
            identity_version: 0,
            derivation: Default::default(),
            suites: None,
        }
    }

    /// The TLS setup of a connection of `hostnqn` to `subnqn`.
    pub fn client(&self, hostnqn: &str, subnqn: &str) -> Result<trellis_tls::ClientConfig> {
        let id = self
            .key
            .identity(self.identity_version, hostnqn, subnqn, self.derivation);
        let psk = self
            .key
            .tls_psk(&id, self.derivation)
            .map_err(|e| Error::protocol(format!("TLS PSK: {e}")))?;
        trellis_tls::ClientConfig::new(id.format(), psk, id.hash, self.suites.as_deref())
            .map_err(|e| Error::protocol(format!("TLS setup: {e}")))
    }
}

impl Default for HostConfig {
    fn default() -> Self {
        let hostnqn = "nqn.2026-11.io.trellis:host".to_string();
        HostConfig {
            hostid: hostid_from(&hostnqn),
            hostnqn,
            digests: Digests::default(),
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(10),
            kato_ms: 10_000,
            staging_bytes: 256 << 10,
            sock_buf_bytes: 2 << 20,
            credit_token: None,
            credit_share: 1,
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
            tls: None,
        }
    }
}

/// A stable 16-byte host ID derived from the host NQN, so one tenant keeps
/// one ID across runs (targets may compare HOSTID between queues).
pub fn hostid_from(hostnqn: &str) -> [u8; 16] {
    let a = crc32c::crc32c(hostnqn.as_bytes());
    let b = crc32c::crc32c_append(a, b"trellis-hostid-1");
    let c = crc32c::crc32c_append(b, b"trellis-hostid-2");
    let d = crc32c::crc32c_append(c, b"trellis-hostid-3");
    let mut id = [0u8; 16];
    for (i, w) in [a, b, c, d].iter().enumerate() {
        id[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
    }
    id[6] = (id[6] & 0x0f) | 0x40; // shaped like a v4 UUID
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

/// A connected, enabled controller and its admin queue.
pub struct Controller {
    admin: Queue,
    addr: SocketAddr,
    subnqn: String,
    cfg: HostConfig,
    pub cntlid: u16,
    pub cap: u64,
    pub id: IdCtrl,
    /// Whether the admin queue ran DH-HMAC-CHAP (the controller's Connect
    /// response asked for it, ATR). With `dhchap_ctrl_secret` it also
    /// proved the controller; a caller that must know the controller is
    /// who it claims checks this, since a controller that never asks
    /// proves nothing (as with Linux, the exchange is the controller's call).
    pub authenticated: bool,
    next_qid: u16,
    last_keep_alive: Instant,
    /// The slot of our outstanding Asynchronous Event Request, if any.
    aer_slot: Option<u16>,
}

impl Controller {
    /// Connects the admin queue to `subnqn` at `addr`, enables the controller
    /// and reads Identify Controller.
    pub fn connect(addr: &str, subnqn: &str, cfg: &HostConfig) -> Result<Controller> {
        let addr = resolve(addr)?;
        let ecfg = EngineConfig {
            qid: 0,
            queue_size: ADMIN_QUEUE_SIZE,
            digests: cfg.digests,
            buf_bytes: ADMIN_BUF_BYTES,
            staging_bytes: 64 << 10,
            max_pdu_bytes: ADMIN_BUF_BYTES + 512,
            command_timeout: cfg.command_timeout,
            credit_token: None, // admin commands carry no credits
            credit_share: 1,
        };
        let mut admin = Queue::connect(addr, ecfg, sock_opts(cfg, subnqn)?)?;
        let (cntlid, authenticated) =
            fabric_connect(&mut admin, cfg, subnqn, 0, ADMIN_QUEUE_SIZE - 1, 0xFFFF)?;
        let cap = prop_get(&mut admin, prop::CAP, true)?;
        enable(&mut admin, cap, cfg.connect_timeout)?;
        let mut page = vec![0u8; IDENTIFY_LEN];
        let mut sqe = Sqe::new(admin::IDENTIFY, 0, 0);
        sqe.set_cdw(10, cns::CONTROLLER as u32);
        admin.exec_ok(sqe, Xfer::FromCtrl(IDENTIFY_LEN as u32), &[], &mut page)?;
        let id = IdCtrl::decode(&page);
        Ok(Controller {
            admin,
            addr,
            subnqn: subnqn.to_string(),
            cfg: cfg.clone(),
            cntlid,
            cap,
            id,
            authenticated,
            next_qid: 1,
            last_keep_alive: Instant::now(),
            aer_slot: None,
        })
    }

    /// Runs one admin command to completion (setup paths in other modules).
    pub(crate) fn admin_exec(
        &mut self,
        sqe: Sqe,
        xfer: Xfer,
        out: &mut [u8],
    ) -> Result<crate::engine::Completion> {
        self.admin.exec_ok(sqe, xfer, &[], out)
    }

    /// Maximum I/O queue entries the controller allows (CAP.MQES + 1).
    pub fn max_queue_entries(&self) -> u32 {
        (self.cap & 0xffff) as u32 + 1
    }

    /// In-capsule data the controller accepts on I/O queues (IOCCSZ·16 − 64).
    pub fn icd_bytes(&self) -> u32 {
        (self.id.ioccsz.saturating_mul(16)).saturating_sub(64)
    }

    pub fn identify_ns(&mut self, nsid: u32) -> Result<IdNs> {
        let mut page = vec![0u8; IDENTIFY_LEN];
        let mut sqe = Sqe::new(admin::IDENTIFY, 0, nsid);
        sqe.set_cdw(10, cns::NAMESPACE as u32);
        self.admin
            .exec_ok(sqe, Xfer::FromCtrl(IDENTIFY_LEN as u32), &[], &mut page)?;
        let ns = IdNs::decode(&page);
        if ns.ncap == 0 {
            return Err(Error::protocol(format!(
                "namespace {nsid} is not allocated (NCAP 0)"
            )));
        }
        Ok(ns)
    }

    /// Set Features Number of Queues. Returns how many I/O queues were granted.
    pub fn set_num_queues(&mut self, n: u16) -> Result<u16> {
        let n = n.max(1) - 1;
        let mut sqe = Sqe::new(admin::SET_FEATURES, 0, 0);
        sqe.set_cdw(10, FID_NUM_QUEUES);
        sqe.set_cdw(11, n as u32 | (n as u32) << 16);
        let c = self.admin.exec_ok(sqe, Xfer::None, &[], &mut [])?;
        let granted = (c.dw0 & 0xffff).min(c.dw0 >> 16) as u16;
        Ok(granted.min(n) + 1)
    }

    /// Opens the next I/O queue: its own TCP connection, ICReq, Connect.
    /// `queue_size` is clamped to what the controller allows; `buf_bytes` is
    /// the largest transfer one command on this queue may move.
    pub fn connect_io_queue(&mut self, queue_size: u16, buf_bytes: usize) -> Result<Queue> {
        let qid = self.next_qid;
        self.next_qid += 1;
        let mut size = (queue_size as u32).min(self.max_queue_entries());
        if self.id.maxcmd > 0 {
            size = size.min(self.id.maxcmd as u32);
        }
        let size = size.clamp(2, MAX_QUEUE_SIZE as u32) as u16;
        // The queue's first command is Connect, whose 1 KiB of data travels in
        // a slot buffer: smaller I/O sizes (512-byte blocks) still need that.
        let mut buf_bytes = buf_bytes.max(fabrics::CONNECT_DATA_LEN);
        if self.cfg.dhchap_secret.is_some() {
            // Authentication messages travel in slot buffers too.
            buf_bytes = buf_bytes.max(auth::MAX_MSG_LEN);
        }
        let ecfg = EngineConfig {
            qid,
            queue_size: size,
            digests: self.cfg.digests,
            buf_bytes,
            staging_bytes: self.cfg.staging_bytes,
            max_pdu_bytes: buf_bytes + 512,
            command_timeout: self.cfg.command_timeout,
            credit_token: self.cfg.credit_token,
            credit_share: self.cfg.credit_share,
        };
        let mut q = Queue::connect(self.addr, ecfg, sock_opts(&self.cfg, &self.subnqn)?)?;
        // SQSIZE is 0-based and a queue of N entries holds N−1 commands, so ask
        // for one entry more than the slots we use (within MQES).
        let sqsize = (size as u32).min(self.max_queue_entries() - 1) as u16;
        fabric_connect(&mut q, &self.cfg, &self.subnqn, qid, sqsize, self.cntlid)?;
        q.engine_mut().set_icd_bytes(self.icd_bytes());
        Ok(q)
    }

    /// Sends a Keep Alive if KATO/2 has passed since the last one. Call it
    /// from the thread that owns the controller at least every KATO/4.
    pub fn tick(&mut self) -> Result<()> {
        if self.cfg.kato_ms == 0 {
            return Ok(());
        }
        let half = Duration::from_millis(self.cfg.kato_ms as u64 / 2);
        if self.last_keep_alive.elapsed() >= half {
            self.keep_alive()?;
        }
        Ok(())
    }

    pub fn keep_alive(&mut self) -> Result<()> {
        let sqe = Sqe::new(admin::KEEP_ALIVE, 0, 0);
        self.admin.exec_ok(sqe, Xfer::None, &[], &mut [])?;
        self.last_keep_alive = Instant::now();
        Ok(())
    }

    /// Enables the asynchronous events in `mask` (Set Features 0Bh,
    /// Asynchronous Event Configuration; e.g. bit 31, Discovery Log Page
    /// Change notices, on a discovery controller whose OAES has it).
    pub fn enable_events(&mut self, mask: u32) -> Result<()> {
        let mut sqe = Sqe::new(admin::SET_FEATURES, 0, 0);
        sqe.set_cdw(10, FID_ASYNC_EVENT_CONFIG);
        sqe.set_cdw(11, mask);
        self.admin.exec_ok(sqe, Xfer::None, &[], &mut [])?;
        Ok(())
    }

    /// Leaves one Asynchronous Event Request outstanding (if none is):
    /// [`Controller::poll_event`] returns its completion. Commands run
    /// meanwhile (Keep Alive, Get Log Page) keep it queued for the poll.
    pub fn arm_event(&mut self) -> Result<()> {
        if self.aer_slot.is_some() {
            return Ok(());
        }
        let slot = self.admin.alloc().ok_or_else(|| {
            Error::protocol("no free admin slot for an Asynchronous Event Request")
        })?;
        let sqe = Sqe::new(admin::ASYNC_EVENT_REQUEST, 0, 0);
        if let Err(e) = self.admin.submit(slot, sqe, Xfer::None, Instant::now()) {
            self.admin.free(slot);
            return Err(e);
        }
        self.aer_slot = Some(slot);
        Ok(())
    }

    /// Polls the admin queue once without blocking: the completion DW0 of
    /// the outstanding AER once it completed (type, information and log
    /// page, NVMe Base 2.0 §5.2.1), else None. An AER failing is an Err.
    pub fn poll_event(&mut self) -> Result<Option<u32>> {
        self.admin.poll(Instant::now())?;
        while let Some(c) = self.admin.next_completion() {
            self.admin.free(c.slot);
            if Some(c.slot) != self.aer_slot {
                continue; // nothing else is outstanding between commands
            }
            self.aer_slot = None;
            if !c.status.is_success() {
                return Err(Error::Nvme(c.status));
            }
            return Ok(Some(c.dw0));
        }
        Ok(None)
    }

    /// Reads the whole discovery log (on a discovery controller). RAE is
    /// clear, as Linux reads it: the read re-arms the target's Discovery
    /// Log Page Change notice (NVMe Base 2.0 §5.2).
    pub fn discovery_log(&mut self) -> Result<Vec<DiscoveryEntry>> {
        let mut chunk = vec![0u8; 4096];
        self.get_log_with(log::lid::DISCOVERY, 0, false, 0, &mut chunk)?;
        let (_gen, numrec, recfmt) = log::decode_discovery_header(&chunk);
        if recfmt != 0 {
            return Err(Error::protocol(format!("discovery log RECFMT {recfmt}")));
        }
        if numrec > MAX_DISCOVERY_ENTRIES {
            return Err(Error::protocol(format!(
                "discovery log has {numrec} entries"
            )));
        }
        let total = DISC_HDR_LEN + numrec as usize * DISC_ENTRY_LEN;
        let mut whole = chunk.clone();
        while whole.len() < total {
            let at = whole.len() as u64;
            self.get_log_with(log::lid::DISCOVERY, 0, false, at, &mut chunk)?;
            whole.extend_from_slice(&chunk);
        }
        Ok((0..numrec as usize)
            .map(|i| DiscoveryEntry::decode(&whole[DISC_HDR_LEN + i * DISC_ENTRY_LEN..]))
            .collect())
    }

    fn get_log_with(
        &mut self,
        lid: u8,
        lsp: u8,
        rae: bool,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let nsid = if lid == log::lid::ANA { 0xFFFF_FFFF } else { 0 };
        let sqe = GetLogPage {
            lid,
            lsp,
            rae,
            len_bytes: out.len() as u64,
            offset_bytes: offset,
        }
        .to_sqe(0, nsid);
        self.admin
            .exec_ok(sqe, Xfer::FromCtrl(out.len() as u32), &[], out)?;
        Ok(())
    }

    /// Reads the SMART / Health Information log (LID 02h) of namespace
    /// `nsid`, or of the controller for 0xFFFFFFFF (NVMe Base 2.0 §5.16.1.3).
    pub fn smart_log(&mut self, nsid: u32) -> Result<log::Smart> {
        let mut page = vec![0u8; log::SMART_LEN];
        let sqe = GetLogPage {
            lid: log::lid::SMART,
            lsp: 0,
            rae: false,
            len_bytes: page.len() as u64,
            offset_bytes: 0,
        }
        .to_sqe(0, nsid);
        self.admin
            .exec_ok(sqe, Xfer::FromCtrl(page.len() as u32), &[], &mut page)?;
        Ok(log::Smart::decode(&page))
    }

    /// Identify Controller CMIC bit 3: the controller reports Asymmetric
    /// Namespace Access (NVMe Base 2.0 §8.1.1), so [`Controller::ana_log`]
    /// may be read and I/O may fail with path-related status (SCT 3h).
    pub fn reports_ana(&self) -> bool {
        self.id.reports_ana()
    }

    /// Reads and decodes the ANA log page (LID 0Ch): every ANA group with
    /// its state, and its NSIDs unless `groups_only` (RGO). Read in 4 KiB
    /// chunks up to the size Identify allows (16 + NANAGRPID × 32 + MNAN × 4
    /// bytes, as Linux sizes it; at most [`MAX_ANA_LOG_BYTES`]); read again
    /// if the change count moved between chunks. RAE is clear, as Linux
    /// reads it, which re-arms the target's ANA change event.
    pub fn ana_log(&mut self, groups_only: bool) -> Result<AnaLog> {
        if !self.reports_ana() {
            return Err(Error::protocol(
                "the controller does not report ANA (Identify Controller CMIC bit 3 clear)",
            ));
        }
        let lsp = if groups_only { ana::LSP_RGO } else { 0 };
        let max = ana_log_max_bytes(&self.id);
        for _ in 0..ANA_LOG_ATTEMPTS {
            let (log, chunks) = self.ana_log_once(lsp, max)?;
            if chunks == 1 || self.ana_log_once(lsp, 4096)?.0.chgcnt == log.chgcnt {
                return Ok(log);
            }
        }
        Err(Error::protocol(format!(
            "the ANA log kept changing during {ANA_LOG_ATTEMPTS} reads"
        )))
    }

    /// One read of the ANA log, chunk by chunk until it decodes. Returns the
    /// log and how many chunks it took.
    fn ana_log_once(&mut self, lsp: u8, max: usize) -> Result<(AnaLog, usize)> {
        let mut chunk = vec![0u8; 4096];
        let mut whole = Vec::new();
        loop {
            self.get_log_with(log::lid::ANA, lsp, false, whole.len() as u64, &mut chunk)?;
            whole.extend_from_slice(&chunk);
            match AnaLog::decode(&whole) {
                Ok(l) => return Ok((l, whole.len() / chunk.len())),
                Err(AnaLogError::ShortDescriptor { .. }) if whole.len() < max => continue,
                Err(e) => return Err(Error::protocol(format!("ANA log: {e}"))),
            }
        }
    }

    /// The ANA state of namespace `nsid` through this controller; None when
    /// no ANA group lists it.
    pub fn ana_state(&mut self, nsid: u32) -> Result<Option<AnaState>> {
        let log = self.ana_log(false)?;
        Ok(log
            .groups
            .iter()
            .find(|g| g.nsids.contains(&nsid))
            .map(|g| g.state))
    }

    /// Normal shutdown (CC.SHN = 01), waiting briefly for CSTS.SHST = complete.
    /// I/O queues should be dropped first.
    pub fn shutdown(mut self) -> Result<()> {
        let cc = cc_value(false) | 1 << fabrics::cc::SHN_SHIFT;
        prop_set(&mut self.admin, prop::CC, cc)?;
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let csts = prop_get(&mut self.admin, prop::CSTS, false)? as u32;
            if csts & (0x3 << 2) == fabrics::csts::SHST_COMPLETE {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Err(Error::Timeout("controller shutdown (CSTS.SHST)".into()))
    }
}

/// Largest ANA log read ([`Controller::ana_log`]), whatever Identify says.
pub const MAX_ANA_LOG_BYTES: usize = 1 << 20;
/// Reads of the ANA log before giving up on one that keeps changing.
const ANA_LOG_ATTEMPTS: usize = 3;

/// The ANA log's largest size for this controller (Linux's
/// `nvme_mpath_init_identify` formula), bounded by [`MAX_ANA_LOG_BYTES`].
fn ana_log_max_bytes(id: &IdCtrl) -> usize {
    let n = ana::HDR_LEN as u64
        + id.nanagrpid as u64 * ana::DESC_LEN as u64
        + id.mnan.max(id.nn) as u64 * 4;
    n.min(MAX_ANA_LOG_BYTES as u64) as usize
}

/// Connects to a discovery controller and returns its log entries.
pub fn discover(addr: &str, cfg: &HostConfig) -> Result<Vec<DiscoveryEntry>> {
    let cfg = HostConfig {
        kato_ms: 0, // one-shot discovery, as `nvme discover` does
        ..cfg.clone()
    };
    let mut c = Controller::connect(addr, DISCOVERY_NQN, &cfg)?;
    let entries = c.discovery_log()?;
    let _ = c.shutdown();
    Ok(entries)
}

fn sock_opts(cfg: &HostConfig, subnqn: &str) -> Result<SockOpts> {
    Ok(SockOpts {
        connect_timeout: cfg.connect_timeout,
        sock_buf_bytes: cfg.sock_buf_bytes,
        tls: match &cfg.tls {
            Some(t) => Some(t.client(&cfg.hostnqn, subnqn)?),
            None => None,
        },
    })
}

/// Fabrics Connect on `q`, then DH-HMAC-CHAP if the controller asks.
/// Returns the controller ID and whether the queue authenticated.
fn fabric_connect(
    q: &mut Queue,
    cfg: &HostConfig,
    subnqn: &str,
    qid: u16,
    sqsize: u16,
    cntlid: u16,
) -> Result<(u16, bool)> {
    let cmd = ConnectCmd {
        recfmt: 0,
        qid,
        sqsize,
        cattr: 0,
        kato_ms: if qid == 0 { cfg.kato_ms } else { 0 },
    };
    let mut data = [0u8; fabrics::CONNECT_DATA_LEN];
    ConnectData {
        hostid: cfg.hostid,
        cntlid,
        subnqn: subnqn.to_string(),
        hostnqn: cfg.hostnqn.clone(),
    }
    .encode(&mut data);
    let len = data.len() as u32;
    let c = q.exec_ok(cmd.to_sqe(0), Xfer::ToCtrl(len), &data, &mut [])?;
    let atr = c.dw0 & auth::CONNECT_AUTHREQ_ATR != 0;
    if atr {
        authenticate(q, cfg, subnqn, qid)?;
    }
    Ok(((c.dw0 & 0xffff) as u16, atr))
}

/// DH-HMAC-CHAP on a queue whose Connect asked for it (NVMe Base 2.0
/// §8.13.5): Negotiate, Challenge → Reply, Success1 (→ Success2 when the
/// host authenticates the controller too). A connection lost or a command
/// timed out during the exchange is reported as the exchange's failure:
/// Linux nvmet, refusing a host, tears the controller down at once, and that
/// may close the connection before its AUTH_Failure1 arrives.
fn authenticate(q: &mut Queue, cfg: &HostConfig, subnqn: &str, qid: u16) -> Result<()> {
    let during = "during the DH-HMAC-CHAP exchange (a controller that refuses the host may drop the connection before its AUTH_Failure1 arrives)";
    exchange(q, cfg, subnqn, qid).map_err(|e| match e {
        Error::Transport(io) => Error::Transport(std::io::Error::new(
            io.kind(),
            format!("DH-HMAC-CHAP on queue {qid} failed: {io} {during}"),
        )),
        Error::Timeout(t) => {
            Error::Timeout(format!("DH-HMAC-CHAP on queue {qid} failed: {t} {during}"))
        }
        e => e,
    })
}

fn exchange(q: &mut Queue, cfg: &HostConfig, subnqn: &str, qid: u16) -> Result<()> {
    let Some(secret) = cfg.dhchap_secret.clone() else {
        return Err(Error::Auth(format!(
            "{subnqn} requires in-band authentication (DH-HMAC-CHAP) of host {}: give its DHHC-1 secret",
            cfg.hostnqn
        )));
    };
    let ctrl = cfg.dhchap_ctrl_secret.clone();
    let mut h = HostAuth::new(secret, ctrl, &cfg.hostnqn, subnqn);
    h.t_id = qid;
    let mut rng = |b: &mut [u8]| rand::rngs::OsRng.fill_bytes(b);
    auth_send(q, &h.negotiate())?;
    let challenge = auth_receive(q)?;
    let reply = match h.reply(&challenge, &mut rng) {
        Ok(r) => r,
        Err(f) => return auth_failed(q, &h, f, qid),
    };
    auth_send(q, &reply)?;
    match h.success1(&auth_receive(q)?) {
        Ok(Some(s2)) => auth_send(q, &s2),
        Ok(None) => Ok(()),
        Err(f) => auth_failed(q, &h, f, qid),
    }
}

fn auth_failed(q: &mut Queue, h: &HostAuth, f: HostFailure, qid: u16) -> Result<()> {
    let (who, code) = match f {
        HostFailure::Controller(e) => ("the controller refused the host", e),
        HostFailure::Host(e) => {
            // Tell the controller why, as the spec asks (AUTH_Failure2).
            let _ = auth_send(q, &h.failure2(f));
            ("the host refused the controller", e)
        }
    };
    Err(Error::Auth(format!(
        "DH-HMAC-CHAP on queue {qid} failed: {who} (AUTH_Failure explanation {code:#04x})"
    )))
}

fn auth_send(q: &mut Queue, msg: &[u8]) -> Result<()> {
    let len = msg.len() as u32;
    q.exec_ok(
        AuthCmd::dhchap_sqe(true, 0, len),
        Xfer::ToCtrl(len),
        msg,
        &mut [],
    )?;
    Ok(())
}

fn auth_receive(q: &mut Queue) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; auth::MAX_MSG_LEN];
    let al = buf.len() as u32;
    q.exec_ok(
        AuthCmd::dhchap_sqe(false, 0, al),
        Xfer::FromCtrl(al),
        &[],
        &mut buf,
    )?;
    Ok(buf)
}

fn prop_get(q: &mut Queue, offset: u32, size8: bool) -> Result<u64> {
    let sqe = PropertyCmd {
        size8,
        offset,
        value: 0,
    }
    .to_sqe(0, false);
    let c = q.exec_ok(sqe, Xfer::None, &[], &mut [])?;
    Ok(c.dw0 as u64 | (c.dw1 as u64) << 32)
}

fn prop_set(q: &mut Queue, offset: u32, value: u32) -> Result<()> {
    let sqe = PropertyCmd {
        size8: false,
        offset,
        value: value as u64,
    }
    .to_sqe(0, true);
    q.exec_ok(sqe, Xfer::None, &[], &mut [])?;
    Ok(())
}

/// CC with IOSQES = 6 (64 B), IOCQES = 4 (16 B), NVM command set, 4 KiB pages.
fn cc_value(enable: bool) -> u32 {
    6 << 16 | 4 << 20 | enable as u32
}

/// Writes CC with EN=0 then EN=1 and waits for CSTS.RDY within CAP.TO.
fn enable(q: &mut Queue, cap: u64, limit: Duration) -> Result<()> {
    prop_set(q, prop::CC, cc_value(false))?;
    prop_set(q, prop::CC, cc_value(true))?;
    let to = Duration::from_millis(((cap >> 24) & 0xff) * 500).max(limit);
    let deadline = Instant::now() + to;
    loop {
        let csts = prop_get(q, prop::CSTS, false)? as u32;
        if csts & fabrics::csts::CFS != 0 {
            return Err(Error::protocol(
                "controller fatal status (CSTS.CFS) during enable",
            ));
        }
        if csts & fabrics::csts::RDY != 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout("controller ready (CSTS.RDY)".into()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
