//! Fabrics Connect: a new controller on an admin queue, or an I/O queue
//! joining one; every refusal with its status, its invalid-parameter
//! offset and a log line.
//!
//! Under `indexing_slicing` and `cast_possible_truncation` (issue 32 item
//! 8).
#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use crate::config::ListenerKind;
use crate::data::nvme::exec::Request;
use crate::data::nvme::exec::{Ctx, Exec, Queue, QueueCtx, QueueKind};
use crate::state::subsystem::{Controller, QueueInfo, Subsystem};
use std::sync::Arc;
use trellis_nvme::fabrics::{self, ipo, ConnectCmd, ConnectData};
use trellis_nvme::status::{generic, specific};

fn invalid_param(in_data: bool, offset: u16) -> Exec {
    Exec::DoneWith(
        specific::CONNECT_INVALID_PARAMS.dnr(),
        fabrics::invalid_param_dw0(in_data, offset),
        0,
    )
}

/// A refused Connect: the completion to send and the reason to log.
pub(crate) struct Refusal {
    exec: Exec,
    why: &'static str,
}

fn refuse(exec: Exec, why: &'static str) -> Refusal {
    Refusal { exec, why }
}

impl Queue {
    /// Fabrics Connect: creates a controller (admin queue) or attaches an I/O
    /// queue. Every refusal is logged at info (a burst whole, then at a
    /// rate, each line counting those left out): a host that cannot connect
    /// otherwise sees only a status code, and the operator nothing.
    pub(crate) fn connect(&mut self, ctx: &mut Ctx, req: &mut Request) -> Exec {
        let cmd = ConnectCmd::decode(&req.sqe);
        let data = match connect_data(req) {
            Ok(d) => d,
            Err(r) => return self.refused(r, &cmd, None),
        };
        match self.connect_checked(ctx, &cmd, &data) {
            Ok(e) => e,
            Err(r) => self.refused(r, &cmd, Some(&data)),
        }
    }

    /// Logs a refusal (rate-limited: a peer decides how often it happens,
    /// `sys::loglimit`) and returns its completion.
    fn refused(&self, r: Refusal, cmd: &ConnectCmd, data: Option<&ConnectData>) -> Exec {
        let Some(left_out) = self.reg.log_limits().connect.admit() else {
            return r.exec;
        };
        let (host, sub) = data.map_or(("?", "?"), |d| (d.hostnqn.as_str(), d.subnqn.as_str()));
        tracing::info!(
            peer = %self.peer,
            host = ?host,
            subsystem = ?sub,
            qid = cmd.qid,
            left_out,
            "connect refused: {}",
            r.why
        );
        r.exec
    }

    fn connect_checked(
        &mut self,
        ctx: &mut Ctx,
        cmd: &ConnectCmd,
        data: &ConnectData,
    ) -> Result<Exec, Refusal> {
        if cmd.recfmt != 0 {
            let e = Exec::Done(specific::CONNECT_INCOMPATIBLE_FORMAT.dnr());
            return Err(refuse(e, "unsupported record format"));
        }
        let discovery = data.subnqn == fabrics::DISCOVERY_NQN;
        if let Some((host, subnqn)) = &self.tls_peer {
            // The TLS PSK was the one for (host, subsystem): a Connect for
            // another host or subsystem on this channel is refused, as the
            // key vouches for nothing else.
            if *host != data.hostnqn {
                let e = Exec::DoneWith(
                    specific::CONNECT_INVALID_HOST.dnr(),
                    fabrics::invalid_param_dw0(true, ipo::DATA_HOSTNQN),
                    0,
                );
                return Err(refuse(e, "host NQN is not the one of the TLS PSK identity"));
            }
            if *subnqn != data.subnqn {
                let e = invalid_param(true, ipo::DATA_SUBNQN);
                return Err(refuse(
                    e,
                    "subsystem NQN is not the one of the TLS PSK identity",
                ));
            }
        }
        let sub = if discovery {
            None
        } else {
            let Some(sub) = self.reg.subsystem(&data.subnqn).cloned() else {
                let e = invalid_param(true, ipo::DATA_SUBNQN);
                return Err(refuse(e, "no such subsystem"));
            };
            if self.listener_kind == ListenerKind::Discovery {
                let e = invalid_param(true, ipo::DATA_SUBNQN);
                return Err(refuse(e, "subsystem not exposed on a discovery-only port"));
            }
            // A subsystem this listener does not carry is, to this port, a
            // subsystem that does not exist: Connect Invalid Parameters
            // with IATTR 1 and IPO at SUBNQN (NVMe over Fabrics 1.1 §3.3,
            // Figure 20 and the Connect status values), as Linux nvmet
            // answers when `nvmet_find_get_subsys` finds the NQN in no
            // subsystem linked to the port; checked for I/O queues too,
            // so a controller made on one port gets no queue on another.
            // Before the host check, also as nvmet, so the answer does not
            // say which hosts another port would admit.
            let here = self.reg.listeners().by_portid(self.portid);
            if !here.is_some_and(|l| sub.carried_by(l)) {
                let e = invalid_param(true, ipo::DATA_SUBNQN);
                return Err(refuse(
                    e,
                    "subsystem not carried by this listener (its listeners)",
                ));
            }
            // An empty host NQN (SPDK's perf sends one) is refused only
            // when an allow-list applies: it can never be on the list. A
            // host with only a TLS PSK must come over TLS with its PSK.
            let tls_host = self.tls_peer.as_ref().map(|(h, _)| h.as_str());
            if !sub.admits(&data.hostnqn, tls_host) {
                let e = Exec::DoneWith(
                    specific::CONNECT_INVALID_HOST.dnr(),
                    fabrics::invalid_param_dw0(true, ipo::DATA_HOSTNQN),
                    0,
                );
                return Err(refuse(e, "host not allowed"));
            }
            Some(sub)
        };
        if cmd.sqsize == 0 || cmd.sqsize >= self.reg.limits().max_queue_depth {
            let e = invalid_param(false, ipo::SQE_SQSIZE);
            return Err(refuse(
                e,
                "queue size out of range (target.max_queue_depth)",
            ));
        }
        if cmd.qid == 0 {
            self.connect_admin(ctx, cmd, data, sub)
        } else {
            self.connect_io(cmd, data, sub)
        }
    }

    fn connect_admin(
        &mut self,
        ctx: &mut Ctx,
        cmd: &ConnectCmd,
        data: &ConnectData,
        sub: Option<Arc<Subsystem>>,
    ) -> Result<Exec, Refusal> {
        if data.cntlid != fabrics::CNTLID_DYNAMIC {
            let e = invalid_param(true, ipo::DATA_CNTLID);
            return Err(refuse(e, "static controller model is not offered"));
        }
        let max = self.reg.limits().max_controllers;
        let map = match &sub {
            Some(s) => &s.controllers,
            None => self.reg.discovery_controllers(),
        };
        let busy = || Exec::Done(specific::CONNECT_CTRL_BUSY.dnr());
        let mut ctrls = crate::sys::lock(map);
        // Checked under the lock a subsystem removal holds (`livesub`).
        if sub
            .as_ref()
            .is_some_and(|s| self.reg.subsystems().is_removed(s.idx))
        {
            let e = invalid_param(true, ipo::DATA_SUBNQN);
            return Err(refuse(e, "subsystem removed"));
        }
        if ctrls.len() >= max {
            return Err(refuse(
                busy(),
                "controller limit reached (target.max_controllers)",
            ));
        }
        let Some(cntlid) = self.reg.alloc_cntlid(&|id| ctrls.contains_key(&id)) else {
            return Err(refuse(busy(), "no free controller ID"));
        };
        let ctrl = Arc::new(self.new_controller(ctx, cmd, data, sub.clone(), cntlid));
        ctrls.insert(cntlid, ctrl.clone());
        drop(ctrls);
        if let Some(left_out) = self.reg.log_limits().ctrl.admit() {
            tracing::info!(cntlid, host = ?data.hostnqn, subsystem = %data.subnqn, peer = %self.peer, kato_ms = cmd.kato_ms, left_out, "controller created");
        }
        self.q = Some(QueueCtx {
            qid: 0,
            sqsize: cmd.sqsize,
            kind: QueueKind::Admin,
            ctrl,
            sqflow_disabled: cmd.disable_sqflow(),
            sqhd: 0,
            auth: crate::data::nvme::auth::session_for(&self.reg, sub.as_deref(), data),
        });
        Ok(crate::data::nvme::auth::connected(self.q.as_ref(), cntlid))
    }

    /// The controller an admin Connect creates, with its ID `cntlid`.
    fn new_controller(
        &self,
        ctx: &Ctx,
        cmd: &ConnectCmd,
        data: &ConnectData,
        sub: Option<Arc<Subsystem>>,
        cntlid: u16,
    ) -> Controller {
        Controller::new(crate::state::subsystem::NewController {
            cntlid,
            kato_ms: kato_ms(cmd.kato_ms, sub.is_none(), self.reg.limits()),
            subsys: sub,
            hostnqn: data.hostnqn.clone(),
            hostid: data.hostid,
            now_ns: ctx.now_ns,
            io_queues: self.reg.limits().max_io_queues,
            portid: self.portid,
            admin: QueueInfo {
                sqsize: cmd.sqsize,
                peer: self.peer,
            },
            tenants: self.reg.tenants().clone(),
            tls_proven: self
                .tls_peer
                .as_ref()
                .is_some_and(|(h, _)| *h == data.hostnqn),
        })
    }

    fn connect_io(
        &mut self,
        cmd: &ConnectCmd,
        data: &ConnectData,
        sub: Option<Arc<Subsystem>>,
    ) -> Result<Exec, Refusal> {
        let seq_error = || Exec::Done(generic::COMMAND_SEQUENCE_ERROR.dnr());
        let Some(sub) = sub else {
            let e = invalid_param(false, ipo::SQE_QID);
            return Err(refuse(e, "discovery controllers have no I/O queues"));
        };
        let ctrl = crate::sys::lock(&sub.controllers)
            .get(&data.cntlid)
            .cloned();
        let Some(ctrl) = ctrl.filter(|c| c.hostnqn() == data.hostnqn && !c.is_dead()) else {
            let e = invalid_param(true, ipo::DATA_CNTLID);
            return Err(refuse(e, "no live controller with this ID for this host"));
        };
        if cmd.qid > ctrl.io_queues() {
            let e = invalid_param(false, ipo::SQE_QID);
            return Err(refuse(e, "queue ID above the granted number of I/O queues"));
        }
        if !ctrl.ready() {
            return Err(refuse(seq_error(), "controller not enabled (CSTS.RDY 0)"));
        }
        let info = QueueInfo {
            sqsize: cmd.sqsize,
            peer: self.peer,
        };
        match ctrl.queues().entry(cmd.qid) {
            std::collections::hash_map::Entry::Occupied(_) => {
                return Err(refuse(seq_error(), "queue already connected"));
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(info);
            }
        }
        tracing::debug!(
            cntlid = ctrl.cntlid(),
            qid = cmd.qid,
            sqsize = cmd.sqsize,
            "I/O queue connected"
        );
        self.q = Some(QueueCtx {
            qid: cmd.qid,
            sqsize: cmd.sqsize,
            kind: QueueKind::Io,
            ctrl,
            sqflow_disabled: cmd.disable_sqflow(),
            sqhd: 0,
            auth: crate::data::nvme::auth::session_for(&self.reg, Some(&sub), data),
        });
        Ok(crate::data::nvme::auth::connected(
            self.q.as_ref(),
            data.cntlid,
        ))
    }
}

/// KATO from Connect; a discovery controller connected with 0 gets the
/// discovery idle timeout, as nvmet gives NVMET_DISC_KATO_MS (120 s), so
/// Get Features KATO reports what reaps the controller.
fn kato_ms(asked: u32, discovery: bool, l: &crate::config::TargetConfig) -> u32 {
    match asked {
        0 if discovery => {
            u32::try_from(l.discovery_idle_timeout_s.saturating_mul(1000)).unwrap_or(u32::MAX)
        }
        k => k,
    }
}

/// The Connect data (the command table admits exactly its 1024 bytes).
fn connect_data(req: &Request) -> Result<ConnectData, Refusal> {
    ConnectData::decode(req.buf.slice(fabrics::CONNECT_DATA_LEN))
        .map_err(|bad| refuse(invalid_param(true, bad.0), "malformed Connect data"))
}
