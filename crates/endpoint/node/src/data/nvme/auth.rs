//! NVMe in-band authentication, controller side: the DH-HMAC-CHAP
//! transaction of one queue (NVMe Base 2.0 §8.13.5) as a sans-IO state
//! machine. The Authentication Send handler feeds it the host's messages
//! ([`Session::send`]), the Authentication Receive handler takes the
//! controller's ([`Session::receive`]); randomness comes in through a
//! closure, so tests are deterministic and no socket is needed.
//!
//! The two exponentiations of a transaction (the Challenge's public value,
//! the Reply's shared secret) both happen in a Receive: [`Session::start_receive`]
//! says what to compute ([`Work`]), [`Session::resume`] builds the message
//! from its [`Output`]. The handlers hand the work to the DH workers
//! (`auth_work`) and park the Receive; [`Session::receive`] does both
//! inline (tests, the fuzz harness). The Reply's check therefore runs at
//! the Receive of Success1, which is where its result was reported anyway
//! (protocol errors never fail the Send: they become the next Receive's
//! AUTH_Failure1).
//!
//! The sequence, as Linux's nvmet runs it (drivers/nvme/target/
//! fabrics-cmd-auth.c): Negotiate (host) → Challenge (controller) → Reply
//! (host) → Success1 (controller) → Success2 (host, bidirectional only). Any
//! error turns into an AUTH_Failure1 for the host's next Receive, after which
//! the transaction is over: the queue stays unauthenticated and refuses every
//! other command, so the host can only disconnect. A Negotiate on an
//! authenticated queue starts re-authentication.
//!
//! Under `indexing_slicing` and `cast_possible_truncation` (issue 32 item
//! 8); each allowance names its proof.
#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use crate::config::keys::HostKeys;
use crate::data::nvme::auth_work::{Output, Work};
use crate::data::nvme::exec::{Command, Ctx, Exec, Queue, QueueCtx, Request};
use crate::state::subsystem::{Registry, Subsystem};
use crate::sys::loglimit::LogLimit;
use std::sync::Arc;
use trellis_nvme::auth::{failure, BadMessage, Challenge, Failure, Message, Negotiate, Reply};
use trellis_nvme::auth::{AuthCmd, CONNECT_AUTHREQ_ATR};
use trellis_nvme::auth::{Success1, MAX_MSG_LEN};
use trellis_nvme::dhchap::{self, DhGroup, DhKey, HashId, ResponseInput};
use trellis_nvme::fabrics::{fctype, ConnectData};
use trellis_nvme::sqe::admin::FABRICS;
use trellis_nvme::status::generic;
use trellis_nvme::Status;

/// Where the transaction is: what the host must do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Waiting for AUTH_Negotiate (Send).
    Negotiate,
    /// Negotiated: the host receives the Challenge.
    Challenge,
    /// Waiting for the Reply (Send).
    Reply,
    /// A Receive waits for the DH workers: nothing else until it completes.
    Computing,
    /// The host receives Success1.
    Success1,
    /// Waiting for Success2 (Send), bidirectional only.
    Success2,
    /// The host receives AUTH_Failure1 (explanation in `Session::failure`).
    Failure1,
    /// Transaction over, successfully.
    Done,
    /// Transaction over, failed: nothing but Disconnect is left.
    Failed,
}

/// The negotiated parameters and values of the current transaction.
struct Exchange {
    t_id: u16,
    hash: HashId,
    group: DhGroup,
    dh: Option<DhKey>,
    /// Our DH public value (empty for the NULL group).
    dhv: Vec<u8>,
    c1: Vec<u8>,
    s1: u32,
    /// The DH shared secret: wiped when the exchange ends.
    session_key: Option<zeroize::Zeroizing<Vec<u8>>>,
    /// C2 and S2 when the host authenticates the controller too.
    c2: Option<(Vec<u8>, u32)>,
    /// The host's response R1 and DH value, checked at the next Receive.
    response: Vec<u8>,
    host_dhv: Vec<u8>,
}

/// What a Receive starts with: the message, or an exponentiation first.
pub enum Started {
    Msg(Message),
    Work(Work),
}

/// One queue's authentication state.
pub struct Session {
    keys: Arc<HostKeys>,
    hostnqn: String,
    subnqn: String,
    step: Step,
    failure: u8,
    x: Option<Exchange>,
    authenticated: bool,
    /// Transactions (Negotiates) on this queue so far.
    transactions: u32,
    /// Set by a Negotiate, taken by the handler that admits it.
    started: bool,
    /// The DH job a parked Receive waits for, and its command slot.
    pending: Option<(u64, u16)>,
    /// A failure to log, taken by the handler ([`Session::take_note`]),
    /// which rate-limits it: a peer can fail transactions at will.
    note: Option<Note>,
}

/// A failed transaction, for the log: what happened and the explanation
/// code (AUTH_Failure's reason code explanation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Note {
    pub what: &'static str,
    pub explanation: u8,
}

/// Fills a buffer with cryptographically secure random bytes.
pub type Rng<'a> = &'a mut dyn FnMut(&mut [u8]);

/// The operating system's generator, for the target.
pub fn os_rng(buf: &mut [u8]) {
    use rand::RngCore;
    rand::rngs::OsRng.fill_bytes(buf);
}

impl Session {
    pub fn new(keys: Arc<HostKeys>, hostnqn: &str, subnqn: &str) -> Session {
        Session {
            keys,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            step: Step::Negotiate,
            failure: 0,
            x: None,
            authenticated: false,
            transactions: 0,
            started: false,
            pending: None,
            note: None,
        }
    }

    pub fn hostnqn(&self) -> &str {
        &self.hostnqn
    }

    /// Transactions (Negotiates) this queue has started.
    pub fn transactions(&self) -> u32 {
        self.transactions
    }

    /// Whether the last Send started a transaction (once per Negotiate).
    pub fn take_started(&mut self) -> bool {
        std::mem::take(&mut self.started)
    }

    /// Ends the transaction just started, unauthenticated, with `why` as
    /// the next Receive's AUTH_Failure1: a bound refused it. Not logged
    /// here: the caller logs refusals at a bounded rate.
    pub fn refuse(&mut self, why: u8) {
        self.x = None;
        self.authenticated = false;
        self.failure = why;
        self.step = Step::Failure1;
    }

    /// The failure to log since the last call, if any.
    pub fn take_note(&mut self) -> Option<Note> {
        self.note.take()
    }

    /// Whether the queue may run other commands.
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// Whether the last transaction failed (for logs and tests).
    pub fn failed(&self) -> bool {
        matches!(self.step, Step::Failure1 | Step::Failed)
    }

    /// Authentication Send: one message from the host. Protocol errors are
    /// not command errors: they become the next Receive's AUTH_Failure1.
    pub fn send(&mut self, data: &[u8]) -> Result<(), Status> {
        if matches!(self.step, Step::Failed | Step::Computing) {
            return Err(generic::COMMAND_SEQUENCE_ERROR.dnr());
        }
        let msg = match Message::decode(data) {
            Ok(m) => m,
            Err(BadMessage(why)) => {
                self.fail(why);
                return Ok(());
            }
        };
        let r = match (self.step, msg) {
            // A Negotiate (re)starts a transaction at any step.
            (_, Message::Negotiate(n)) => self.negotiate(&n),
            (Step::Reply, Message::Reply(r)) => self.reply(&r),
            (Step::Success2, Message::Success2 { t_id }) if Some(t_id) == self.t_id() => {
                self.authenticated = true;
                self.step = Step::Done;
                Ok(())
            }
            (_, Message::Failure2(f)) => {
                self.note = Some(Note {
                    what: "host reported authentication failure",
                    explanation: f.explanation,
                });
                self.authenticated = false;
                self.step = Step::Failed;
                Ok(())
            }
            _ => Err(failure::INCORRECT_MESSAGE),
        };
        if let Err(why) = r {
            self.fail(why);
        }
        Ok(())
    }

    /// Authentication Receive of `al` bytes, computing inline: the
    /// controller's next message, zero-padded to `al` as Linux's target does.
    pub fn receive(&mut self, al: usize, rng: Rng) -> Result<Vec<u8>, Status> {
        let msg = match self.start_receive(rng)? {
            Started::Msg(m) => m,
            Started::Work(w) => self.resume(w.run()),
        };
        self.encode(msg, al)
    }

    /// The first half of a Receive: the message, or the exponentiation it
    /// needs first (then the session waits in `Computing` for [`Self::resume`]).
    pub fn start_receive(&mut self, rng: Rng) -> Result<Started, Status> {
        let msg = match self.step {
            Step::Computing => return Err(generic::COMMAND_SEQUENCE_ERROR.dnr()),
            Step::Challenge => match self.challenge(rng) {
                Ok(Some(w)) => {
                    self.step = Step::Computing;
                    return Ok(Started::Work(w));
                }
                Ok(None) => self.challenge_msg(),
                Err(why) => self.failure1(why),
            },
            Step::Success1 => match self.x.as_mut().and_then(|x| Some((x.dh.take()?, x))) {
                Some((key, x)) => {
                    let peer = std::mem::take(&mut x.host_dhv);
                    self.step = Step::Computing;
                    return Ok(Started::Work(Work::Shared { key, peer }));
                }
                None => self.check_reply(None),
            },
            Step::Failure1 => {
                let why = self.failure;
                self.failure1(why)
            }
            // Nothing to receive now: the transaction fails (as in nvmet).
            _ => self.failure1(failure::FAILED),
        };
        Ok(Started::Msg(msg))
    }

    /// The second half: the message from what the workers computed.
    pub fn resume(&mut self, out: Output) -> Message {
        if self.step != Step::Computing {
            return self.failure1(failure::FAILED);
        }
        match out {
            Output::Keygen { key, public } => match self.x.as_mut() {
                Some(x) => {
                    x.dh = key;
                    x.dhv = public;
                    self.challenge_msg()
                }
                None => self.failure1(failure::FAILED),
            },
            Output::Shared(Ok(k)) => self.check_reply(Some(k)),
            Output::Shared(Err(_)) => self.failure1(failure::DHGROUP_UNUSABLE),
            Output::Lost => self.failure1(failure::FAILED),
        }
    }

    /// Ends a transaction whose work could not be queued (the workers'
    /// queue is full): AUTH_Failure1, nothing computed.
    pub fn abandon(&mut self) -> Message {
        self.failure1(failure::FAILED)
    }

    /// The message as Receive data of `al` bytes.
    pub fn encode(&mut self, msg: Message, al: usize) -> Result<Vec<u8>, Status> {
        let mut b = msg.encode();
        if b.len() > al || al > MAX_MSG_LEN {
            // The host's buffer cannot hold the message: nothing is sent,
            // and the transaction cannot go on.
            self.step = Step::Failed;
            self.authenticated = false;
            return Err(generic::INVALID_FIELD.dnr());
        }
        b.resize(al, 0);
        Ok(b)
    }

    fn t_id(&self) -> Option<u16> {
        self.x.as_ref().map(|x| x.t_id)
    }

    fn fail(&mut self, why: u8) {
        self.note = Some(Note {
            what: "authentication failed",
            explanation: why,
        });
        self.failure = why;
        self.step = Step::Failure1;
    }

    fn failure1(&mut self, why: u8) -> Message {
        self.step = Step::Failed;
        self.authenticated = false;
        Message::Failure1(Failure {
            t_id: self.t_id().unwrap_or(0),
            reason: failure::REASON_FAILED,
            explanation: why,
        })
    }

    /// Picks the first hash and DH group of ours (the ones configured for
    /// this host, in the target's order of preference) that the host
    /// offers: the host's order does not matter.
    fn negotiate(&mut self, n: &Negotiate) -> Result<(), u8> {
        // A new transaction: forget the old one's values (its transaction
        // ID identifies a Failure1 for this one).
        self.x = None;
        self.transactions = self.transactions.saturating_add(1);
        self.started = true;
        if n.sc_c != 0 {
            return Err(failure::CONCAT_MISMATCH);
        }
        let hash = self
            .keys
            .hashes
            .iter()
            .copied()
            .find(|h| n.hash_ids.contains(&(*h as u8)));
        let hash = hash.ok_or(failure::HASH_UNUSABLE)?;
        let group = self
            .keys
            .dhgroups
            .iter()
            .copied()
            .find(|g| n.dh_ids.contains(&(*g as u8)));
        let group = group.ok_or(failure::DHGROUP_UNUSABLE)?;
        self.x = Some(Exchange {
            t_id: n.t_id,
            hash,
            group,
            dh: None,
            dhv: Vec::new(),
            c1: Vec::new(),
            s1: 0,
            session_key: None,
            c2: None,
            response: Vec::new(),
            host_dhv: Vec::new(),
        });
        self.step = Step::Challenge;
        Ok(())
    }

    /// C1, S1 and the private key: the exponentiation to do, None for the
    /// NULL group.
    fn challenge(&mut self, rng: Rng) -> Result<Option<Work>, u8> {
        let x = self.x.as_mut().ok_or(failure::FAILED)?;
        x.c1 = vec![0u8; x.hash.len_bytes()];
        rng(&mut x.c1);
        let mut s = [0u8; 4];
        // S1 is never 0 (0 means "no sequence number" in a Reply's S2).
        while x.s1 == 0 {
            rng(&mut s);
            x.s1 = u32::from_le_bytes(s);
        }
        if x.group == DhGroup::Null {
            return Ok(None);
        }
        let mut random = zeroize::Zeroizing::new([0u8; dhchap::PRIVATE_KEY_LEN]);
        rng(&mut random[..]);
        Ok(Some(Work::Keygen {
            group: x.group,
            random,
        }))
    }

    fn challenge_msg(&mut self) -> Message {
        let Some(x) = self.x.as_ref() else {
            return self.failure1(failure::FAILED);
        };
        let msg = Message::Challenge(Challenge {
            t_id: x.t_id,
            hash_id: x.hash as u8,
            dh_id: x.group as u8,
            seqnum: x.s1,
            c1: x.c1.clone(),
            dhv: x.dhv.clone(),
        });
        self.step = Step::Reply;
        msg
    }

    /// Takes the Reply's values; they are checked at the next Receive,
    /// after the shared secret is computed (off the reactor).
    fn reply(&mut self, r: &Reply) -> Result<(), u8> {
        let x = self.x.as_mut().ok_or(failure::FAILED)?;
        if r.t_id != x.t_id || r.response.len() != x.hash.len_bytes() {
            return Err(failure::INCORRECT_PAYLOAD);
        }
        if x.dh.is_some() == r.dhv.is_empty() {
            // A DH value for the NULL group, or none for a DH group.
            return Err(failure::INCORRECT_PAYLOAD);
        }
        x.response = r.response.clone();
        x.host_dhv = r.dhv.clone();
        // S2 = 0 with a C2 is no controller authentication (§8.13.5.5).
        x.c2 =
            r.c2.clone()
                .filter(|_| r.seqnum != 0)
                .map(|c| (c, r.seqnum));
        if x.c2.is_some() && self.keys.ctrl_secret.is_none() {
            // The host wants us to prove ourselves; we have no key to.
            return Err(failure::FAILED);
        }
        self.step = Step::Success1;
        Ok(())
    }

    /// Checks the host's response with the session key (None: NULL group)
    /// and answers Success1, or Failure1.
    fn check_reply(&mut self, session_key: Option<zeroize::Zeroizing<Vec<u8>>>) -> Message {
        let Some(x) = self.x.as_mut() else {
            return self.failure1(failure::FAILED);
        };
        x.session_key = session_key;
        let challenge =
            dhchap::challenge_for(x.hash, &x.c1, x.session_key.as_deref().map(Vec::as_slice));
        let key = zeroize::Zeroizing::new(self.keys.secret.transformed(&self.hostnqn));
        let want = dhchap::host_response(&ResponseInput {
            hash: x.hash,
            key: &key,
            challenge: &challenge,
            seqnum: x.s1,
            t_id: x.t_id,
            hostnqn: &self.hostnqn,
            subnqn: &self.subnqn,
        });
        if !dhchap::same(&want, &x.response) {
            self.note = Some(Note {
                what: "authentication failed: wrong response",
                explanation: failure::FAILED,
            });
            return self.failure1(failure::FAILED);
        }
        if x.c2.is_none() {
            self.authenticated = true;
        }
        self.success1()
    }

    fn success1(&mut self) -> Message {
        let Some(x) = self.x.as_ref() else {
            return self.failure1(failure::FAILED);
        };
        let response = match (&x.c2, &self.keys.ctrl_secret) {
            (Some((c2, s2)), Some(secret)) => {
                let challenge =
                    dhchap::challenge_for(x.hash, c2, x.session_key.as_deref().map(Vec::as_slice));
                let key = zeroize::Zeroizing::new(secret.transformed(&self.subnqn));
                Some(dhchap::ctrl_response(&ResponseInput {
                    hash: x.hash,
                    key: &key,
                    challenge: &challenge,
                    seqnum: *s2,
                    t_id: x.t_id,
                    hostnqn: &self.hostnqn,
                    subnqn: &self.subnqn,
                }))
            }
            _ => None,
        };
        self.step = if response.is_some() {
            Step::Success2
        } else {
            Step::Done
        };
        #[allow(
            clippy::cast_possible_truncation,
            reason = "HashId::len_bytes is 32, 48 or 64"
        )]
        let hl = x.hash.len_bytes() as u8;
        Message::Success1(Success1 {
            t_id: x.t_id,
            hl,
            response,
        })
    }
}

/// The session a new queue of `data.hostnqn` starts with: Some when the
/// subsystem has keys for the host; on a discovery controller (`sub`
/// None), only with `target.discovery_dhchap` (`Registry::discovery_keys`).
pub fn session_for(
    reg: &Registry,
    sub: Option<&Subsystem>,
    data: &ConnectData,
) -> Option<Box<Session>> {
    let keys = match sub {
        Some(s) => s.dhchap.get(&data.hostnqn).cloned(),
        None => reg.discovery_keys(&data.hostnqn),
    }?;
    Some(Box::new(Session::new(keys, &data.hostnqn, &data.subnqn)))
}

/// The Connect completion: CNTLID, and ATR when the queue must authenticate.
pub fn connected(q: Option<&QueueCtx>, cntlid: u16) -> Exec {
    let atr = q.is_some_and(|q| q.auth.is_some());
    let dw0 = cntlid as u32 | if atr { CONNECT_AUTHREQ_ATR } else { 0 };
    Exec::DoneWith(Status::SUCCESS, dw0, 0)
}

/// Whether `cmd` must wait for authentication on this queue: everything but
/// Authentication Send/Receive does until it succeeds (NVMe Base 2.0
/// §8.13.1; Linux's nvmet refuses with the same status).
#[inline]
pub fn refuses(q: &Queue, cmd: &Command) -> bool {
    let pending =
        q.q.as_ref()
            .is_some_and(|c| c.auth.as_ref().is_some_and(|s| !s.authenticated()));
    pending
        && !(cmd.opcode == FABRICS && matches!(cmd.fctype, fctype::AUTH_SEND | fctype::AUTH_RECV))
}

/// SECP/SPSP and the length in CDW11 (TL or AL), checked against the SGL.
fn check_cmd(req: &Request) -> Result<usize, Status> {
    let c = AuthCmd::decode(&req.sqe);
    let invalid = generic::INVALID_FIELD.dnr();
    if !c.is_dhchap() || c.len == 0 || c.len as usize > MAX_MSG_LEN {
        return Err(invalid);
    }
    if c.len != req.xfer_len {
        return Err(generic::DATA_SGL_LENGTH_INVALID.dnr());
    }
    Ok(c.len as usize)
}

/// The queue's session, or the status for a host that has no key here.
fn session(q: &mut Queue) -> Result<(&mut Session, u16), Status> {
    let c = q.q.as_mut().ok_or(generic::COMMAND_SEQUENCE_ERROR.dnr())?;
    let qid = c.qid;
    let s = c
        .auth
        .as_deref_mut()
        .ok_or(generic::COMMAND_SEQUENCE_ERROR.dnr())?;
    Ok((s, qid))
}

/// Fabrics Authentication Send (05h).
pub(crate) fn auth_send(q: &mut Queue, ctx: &mut Ctx, req: &mut Request) -> Exec {
    let peer = q.peer;
    let reg = q.reg.clone();
    let log = &reg.log_limits().auth;
    let per_conn_max = q.reg.limits().auth_per_conn_max;
    let r = check_cmd(req).and_then(|len| {
        let (s, qid) = session(q)?;
        let was = s.authenticated();
        s.send(req.buf.slice(len))?;
        if s.take_started() {
            admit(s, ctx, per_conn_max, peer);
        }
        log_change(s, was, qid, peer, log);
        Ok(())
    });
    Exec::Done(r.err().unwrap_or(Status::SUCCESS))
}

/// The bounds a new transaction must pass before any exponentiation:
/// `target.auth_per_conn_max` on this queue, then the host NQN's token
/// bucket. A refused one fails at the next Receive (AUTH_Failure1 01h).
fn admit(s: &mut Session, ctx: &Ctx, per_conn_max: u32, peer: std::net::SocketAddr) {
    let why = if s.transactions() > per_conn_max {
        "past target.auth_per_conn_max transactions on this connection"
    } else if ctx
        .auth
        .is_some_and(|p| !p.pool.admit_host(s.hostnqn(), peer.ip(), ctx.now_ns))
    {
        "past the host's rate (target.auth_per_host_per_sec, auth_per_host_burst)"
    } else {
        return;
    };
    s.refuse(failure::FAILED);
    match ctx.auth {
        Some(p) => p.pool.note_refusal(s.hostnqn(), peer, why, ctx.now_ns),
        None => {
            tracing::debug!(host = %s.hostnqn(), %peer, "refusing an authentication transaction: {why}")
        }
    }
}

/// Fabrics Authentication Receive (06h). An exponentiation goes to the DH
/// workers when the reactor has them (`Ctx::auth`): the command is parked
/// and [`resume`] completes it.
pub(crate) fn auth_receive(q: &mut Queue, ctx: &mut Ctx, req: &mut Request) -> Exec {
    let peer = q.peer;
    let reg = q.reg.clone();
    let log = &reg.log_limits().auth;
    let r = check_cmd(req).and_then(|al| {
        let (s, qid) = session(q)?;
        let was = s.authenticated();
        let msg = match s.start_receive(&mut os_rng)? {
            Started::Msg(m) => m,
            Started::Work(w) => match ctx.auth {
                None => s.resume(w.run()),
                Some(p) => match p.submit(req.tag.conn(), w) {
                    Ok(job) => {
                        s.pending = Some((job, req.slot()));
                        return Ok(None);
                    }
                    Err(_) => {
                        p.pool.note_refusal(
                            s.hostnqn(),
                            peer,
                            "the DH workers' queue is full (target.auth_queue_max)",
                            ctx.now_ns,
                        );
                        s.abandon()
                    }
                },
            },
        };
        // Logged before the `?`: a failure noted by this step is this
        // command's, even when its message does not fit the host's buffer.
        let b = s.encode(msg, al);
        log_change(s, was, qid, peer, log);
        Ok(Some(b?))
    });
    match r {
        Ok(Some(msg)) => req.reply_data(&msg),
        Ok(None) => Exec::Held,
        Err(st) => Exec::Done(st),
    }
}

/// The slot of the Receive parked for DH job `job` on this queue, if any.
pub(crate) fn parked(q: &Queue, job: u64) -> Option<u16> {
    let s = q.q.as_ref()?.auth.as_deref()?;
    s.pending.filter(|p| p.0 == job).map(|p| p.1)
}

/// Completes the Receive parked for `job` (see [`parked`]) with the
/// workers' result.
pub(crate) fn resume(q: &mut Queue, req: &mut Request, job: u64, out: Output) -> Exec {
    let peer = q.peer;
    let reg = q.reg.clone();
    let log = &reg.log_limits().auth;
    let al = AuthCmd::decode(&req.sqe).len as usize;
    let r = session(q).and_then(|(s, qid)| {
        if s.pending.take().map(|p| p.0) != Some(job) {
            return Err(generic::COMMAND_SEQUENCE_ERROR.dnr());
        }
        let was = s.authenticated();
        let msg = s.resume(out);
        let b = s.encode(msg, al);
        log_change(s, was, qid, peer, log);
        b
    });
    match r {
        Ok(msg) => req.reply_data(&msg),
        Err(st) => Exec::Done(st),
    }
}

/// Logs a queue that became authenticated, and (rate-limited, with the
/// count left out: any peer can fail transactions) a failed transaction.
fn log_change(s: &mut Session, was: bool, qid: u16, peer: std::net::SocketAddr, log: &LogLimit) {
    if s.authenticated() && !was {
        tracing::info!(host = %s.hostnqn, subsystem = %s.subnqn, qid, %peer, "queue authenticated (DH-HMAC-CHAP)");
    }
    if let Some(n) = s.take_note() {
        if let Some(left_out) = log.admit() {
            tracing::info!(host = %s.hostnqn.escape_debug(), subsystem = %s.subnqn, qid, %peer, explanation = n.explanation, left_out, "{}", n.what);
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::cast_possible_truncation,
    reason = "tests: a panic is a failed test"
)]
#[path = "auth_tests.rs"]
mod tests;
