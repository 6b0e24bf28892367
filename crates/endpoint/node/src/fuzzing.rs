//! Drives one connection's state machine with arbitrary bytes, without
//! sockets or threads: the entry point of the `cargo fuzz` targets and of
//! the random-input tests. Nothing here runs in the daemon.

use crate::config::{BackendKind, Config, ListenerConfig, NamespaceConfig};
use crate::conn::{Conn, Ctx, State};
use crate::subsystem::Registry;
use std::sync::Arc;
use trellis_nvme::fabrics::{ConnectCmd, ConnectData, PropertyCmd, CNTLID_DYNAMIC};
use trellis_nvme::pdu::{self, Digests, IcReq};
use trellis_nvme::{Sgl, Sqe};

pub const NQN: &str = "nqn.2026-11.io.trellis:fuzz";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz";

fn registry() -> Arc<Registry> {
    let mut cfg = Config::embedded_default();
    cfg.listeners = vec![ListenerConfig {
        addr: "127.0.0.1:4420".parse().unwrap(),
        kind: None,
    }];
    cfg.subsystems[0].nqn = NQN.into();
    cfg.subsystems[0].namespaces = vec![NamespaceConfig::sized(BackendKind::Ram, 1 << 20)];
    // An identity in memory: a registry per input must not touch files.
    let node = crate::identity::NodeId::in_memory(uuid::Uuid::from_u128(0xF022));
    Arc::new(Registry::build_with(&cfg, node).expect("fuzz registry"))
}

/// A valid byte prefix: ICReq, then optionally Connect (+ enable) for the admin queue.
pub fn prefix(dg: Digests, qid: Option<(u16, u16)>) -> Vec<u8> {
    let mut v = vec![0u8; pdu::IC_LEN];
    let mut ic = [0u8; pdu::IC_LEN];
    IcReq {
        pfv: 0,
        hpda: 0,
        digests: dg,
        maxr2t: 0,
    }
    .encode(&mut ic);
    v.copy_from_slice(&ic);
    if let Some((qid, cntlid)) = qid {
        let mut sqe = ConnectCmd {
            recfmt: 0,
            qid,
            sqsize: 31,
            cattr: 0,
            kato_ms: 0,
        }
        .to_sqe(1);
        sqe.set_sgl(Sgl::in_capsule(1024));
        let mut d = vec![0u8; 1024];
        ConnectData {
            hostid: [1; 16],
            cntlid,
            subnqn: NQN.into(),
            hostnqn: HOST.into(),
        }
        .encode(&mut d);
        push_capsule(&mut v, &sqe, &d, dg);
        if qid == 0 {
            let en = PropertyCmd {
                size8: false,
                offset: 0x14,
                value: 0x0046_0001,
            }
            .to_sqe(2, true);
            push_capsule(&mut v, &en, &[], dg);
        }
    }
    v
}

fn push_capsule(v: &mut Vec<u8>, sqe: &Sqe, icd: &[u8], dg: Digests) {
    let mut b = vec![0u8; pdu::MAX_HDR_LEN];
    let n = pdu::encode_capsule_cmd(&mut b, sqe, icd.len(), dg);
    v.extend_from_slice(&b[..n]);
    v.extend_from_slice(icd);
    if dg.data && !icd.is_empty() {
        v.extend_from_slice(&trellis_nvme::crc::digest(icd).to_le_bytes());
    }
}

/// Feeds `data` to fresh connections. The first byte picks digests and how
/// far a valid prefix takes the connection (raw, after ICReq, admin queue,
/// I/O queue); the rest arrives in chunks whose sizes come from the input.
/// Panics (the fuzzer's signal) only if an invariant of the state machine breaks.
pub fn feed(data: &[u8]) -> Report {
    let Some((&sel, rest)) = data.split_first() else {
        return Report::default();
    };
    let reg = registry();
    let dg = Digests::from_bits(sel & 3);
    let mut queues = Vec::new();
    let mut scratch = Vec::new();
    let addr = "127.0.0.1:1".parse().unwrap();
    let mut now = 1_000u64;
    let kind = reg.listeners[0].kind;
    // An admin connection that owns controller 1, for I/O-queue mode.
    let mut admin = Conn::new(0, reg.clone(), addr, addr, kind, 1, now);
    let mode = (sel >> 2) % 4;
    let input = match mode {
        0 => rest.to_vec(),
        1 => [prefix(dg, None), rest.to_vec()].concat(),
        2 => [prefix(dg, Some((0, CNTLID_DYNAMIC))), rest.to_vec()].concat(),
        _ => {
            let p = prefix(dg, Some((0, CNTLID_DYNAMIC)));
            let _ = run(&mut admin, &p, &mut queues, &reg, &mut scratch, &mut now);
            let cntlid = admin.ctrl().map_or(1, |c| c.cntlid);
            [prefix(dg, Some((1, cntlid))), rest.to_vec()].concat()
        }
    };
    let mut c = Conn::new(1, reg.clone(), addr, addr, kind, 1, now);
    let sent_bytes = run(&mut c, &input, &mut queues, &reg, &mut scratch, &mut now);
    let report = Report {
        sent_bytes,
        connected_qid: c.q.as_ref().map(|q| q.qid),
        closing: c.state == State::Closing,
    };
    c.on_close();
    admin.on_close();
    report
}

/// What one feed did, so tests can check the harness reaches deep states.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub sent_bytes: usize,
    pub connected_qid: Option<u16>,
    pub closing: bool,
}

fn run(
    c: &mut Conn,
    input: &[u8],
    queues: &mut Vec<Option<Box<dyn crate::backend::BackendQueue>>>,
    reg: &Registry,
    scratch: &mut Vec<u8>,
    now: &mut u64,
) -> usize {
    let mut off = 0;
    let mut sent = 0;
    while off < input.len() && c.state != State::Closing {
        let space = c.rx_space();
        // Vary chunking to exercise partial PDUs.
        let n = space
            .len()
            .min(input.len() - off)
            .min(1 + (input[off] as usize * 37) % 4096);
        space[..n].copy_from_slice(&input[off..off + n]);
        c.rx_commit(n, *now);
        off += n;
        *now += 1_000;
        let mut ctx = Ctx {
            now_ns: *now,
            queues,
            reg,
            scratch,
        };
        c.process(&mut ctx);
        // Pretend the socket took everything queued.
        let bytes = c.tx.pending_bytes();
        sent += bytes;
        c.tx_advance(bytes);
        c.tick(*now);
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harness_reaches_io_queue_and_serves_a_read() {
        let mut sqe = Sqe::rw(trellis_nvme::sqe::io::READ, 9, 1, 0, 8, false);
        sqe.set_sgl(Sgl::transport(4096));
        let mut v = vec![3 << 2]; // mode 3: I/O queue, no digests
        push_capsule(&mut v, &sqe, &[], Digests::default());
        let r = feed(&v);
        assert_eq!(r.connected_qid, Some(1));
        assert!(!r.closing);
        // ICResp + Connect response + C2HData header + 4 KiB + CapsuleResp.
        assert_eq!(r.sent_bytes, 128 + 24 + 24 + 4096 + 24);
    }
}
