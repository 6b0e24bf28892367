//! Drives one connection's state machine with arbitrary bytes, without
//! sockets or threads: the entry point of the `cargo fuzz` targets and of
//! the random-input tests. Nothing here runs in the daemon.
// A test harness: a broken setup must crash the fuzzer loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::config::{BackendKind, Config, ListenerConfig, NamespaceConfig};
use crate::data::nvme::exec::Ctx;
use crate::data::tcp::conn::Conn;
use crate::state::subsystem::Registry;
use std::sync::Arc;
use trellis_nvme::fabrics::{ConnectCmd, ConnectData, PropertyCmd, CNTLID_DYNAMIC};
use trellis_nvme::framing::RxBuf;
use trellis_nvme::pdu::{self, Digests, IcReq};
use trellis_nvme::{Sgl, Sqe};

pub const NQN: &str = "nqn.2026-11.io.trellis:fuzz";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz";

#[cfg(test)]
fn registry() -> Arc<Registry> {
    registry_with(|_| {})
}

/// The harness's registry, `tune` applied to its configuration first.
fn registry_with(tune: impl FnOnce(&mut Config)) -> Arc<Registry> {
    let mut cfg = Config::embedded_default();
    cfg.listeners = vec![ListenerConfig {
        name: None,
        addr: "127.0.0.1:4420".parse().unwrap(),
        kind: None,
        ana_state: None,
        secure_channel: None,
    }];
    cfg.subsystems[0].nqn = NQN.into();
    cfg.subsystems[0].namespaces = vec![NamespaceConfig::sized(BackendKind::Ram, 1 << 20)];
    tune(&mut cfg);
    // An identity in memory: a registry per input must not touch files.
    let node = crate::state::identity::NodeId::in_memory(uuid::Uuid::from_u128(0xF022));
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

thread_local! {
    /// One registry per thread, reused by every input: building one (its
    /// tables for live subsystems, listeners and ANA groups, the RAM
    /// namespace) and dropping it again was most of an input's time
    /// (`examples/feed_rate.rs`; docs/target.md, "Fuzzing").
    // A smaller largest PDU than the daemon's default (128 KiB of H2CData):
    // every connection allocates a receive buffer of one PDU + 64 KiB, per
    // input; inputs are at most a few KiB, and the limit checks are the same.
    static REGISTRY: Arc<Registry> =
        registry_with(|c| c.target.max_h2c_data = crate::config::ByteSize(16 << 10));
    /// The two connections' receive buffers, handed from one input to the
    /// next (`Conn::with_rx`): allocating and zeroing them per input was
    /// most of an input's time under AddressSanitizer.
    static RX: std::cell::RefCell<[Option<RxBuf>; 2]> = const { std::cell::RefCell::new([None, None]) };
}

/// Feeds `data` to fresh connections. The first byte picks digests and how
/// far a valid prefix takes the connection (raw, after ICReq, admin queue,
/// I/O queue); the rest arrives in chunks whose sizes come from the input.
/// Panics (the fuzzer's signal) only if an invariant of the state machine breaks.
pub fn feed(data: &[u8]) -> Report {
    REGISTRY.with(|reg| {
        let report = feed_with(reg, data);
        reset(reg);
        report
    })
}

/// Returns the shared registry to the state a fresh one has, as far as a
/// host can change it: every connection of the input is closed, so its
/// controllers must be gone (a controller lives as long as its admin
/// queue: checked, a leak panics), the controller ID counter restarts and
/// the tenants assigned at Connect are forgotten, and so are the
/// namespaces' reservations (registrants and holder change which I/O the
/// target refuses). What is left is the RAM namespace's data, on which no
/// branch of the target depends, and statistics counters.
fn reset(reg: &Registry) {
    for s in reg.subsystems().iter() {
        let n = crate::sys::lock(&s.controllers).len();
        assert_eq!(
            n, 0,
            "{n} controllers of {} outlived their connections",
            s.nqn
        );
    }
    let n = crate::sys::lock(reg.discovery_controllers()).len();
    assert_eq!(n, 0, "{n} discovery controllers outlived their connections");
    reg.reset_cntlids();
    reg.tenants().forget_assigned();
    for ns in reg.ns().load().by_uid.iter().flatten() {
        ns.resv().forget();
    }
}

fn feed_with(reg: &Arc<Registry>, data: &[u8]) -> Report {
    let Some((&sel, rest)) = data.split_first() else {
        return Report::default();
    };
    let dg = Digests::from_bits(sel & 3);
    let mut queues = Vec::new();
    let mut scratch = Vec::new();
    let addr = "127.0.0.1:1".parse().unwrap();
    let mut now = 1_000u64;
    let kind = reg.listeners()[0].kind;
    let [rx_admin, rx_io] = RX.with(|r| std::mem::take(&mut *r.borrow_mut()));
    // An admin connection that owns controller 1, for I/O-queue mode.
    let mut admin = Conn::with_rx(0, reg.clone(), addr, addr, kind, 1, now, rx_admin);
    let mode = (sel >> 2) % 4;
    let input = match mode {
        0 => rest.to_vec(),
        1 => [prefix(dg, None), rest.to_vec()].concat(),
        2 => [prefix(dg, Some((0, CNTLID_DYNAMIC))), rest.to_vec()].concat(),
        _ => {
            let p = prefix(dg, Some((0, CNTLID_DYNAMIC)));
            let _ = run(&mut admin, &p, &mut queues, reg, &mut scratch, &mut now);
            let cntlid = admin.ctrl().map_or(1, |c| c.cntlid());
            [prefix(dg, Some((1, cntlid))), rest.to_vec()].concat()
        }
    };
    let mut c = Conn::with_rx(1, reg.clone(), addr, addr, kind, 1, now, rx_io);
    let sent_bytes = run(&mut c, &input, &mut queues, reg, &mut scratch, &mut now);
    let report = Report {
        sent_bytes,
        connected_qid: c.qid(),
        closing: c.is_closing(),
    };
    c.on_close();
    admin.on_close();
    RX.with(|r| *r.borrow_mut() = [Some(admin.into_rx()), Some(c.into_rx())]);
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
    queues: &mut Vec<Option<crate::data::nvme::exec::NsQueue>>,
    reg: &Registry,
    scratch: &mut Vec<u8>,
    now: &mut u64,
) -> usize {
    let mut off = 0;
    let mut sent = 0;
    while off < input.len() && !c.is_closing() {
        let space = c.rx_space();
        // Vary chunking to exercise partial PDUs.
        let n = space
            .len()
            .min(input.len() - off)
            .min(1 + (input[off] as usize * 37) % 4096);
        space[..n].copy_from_slice(&input[off..off + n]);
        c.rx_commit(n);
        off += n;
        *now += 1_000;
        let mut ctx = Ctx {
            icd: &[],
            auth: None,
            now_ns: *now,
            queues,
            reg,
            scratch,
        };
        c.process(&mut ctx);
        // Pretend the socket took everything queued.
        let bytes = c.output_bytes();
        sent += bytes;
        c.tx_advance(bytes);
        c.handle_timeout(*now);
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

    /// Receive buffers handed from input to input change nothing: the same
    /// input answers alike whatever went through the buffers before it.
    #[test]
    fn reused_receive_buffers_answer_as_fresh_ones() {
        let mut sqe = Sqe::rw(trellis_nvme::sqe::io::READ, 9, 1, 0, 8, false);
        sqe.set_sgl(Sgl::transport(4096));
        let mut read = vec![3 << 2];
        push_capsule(&mut read, &sqe, &[], Digests::default());
        RX.with(|r| *r.borrow_mut() = [None, None]);
        let fresh = feed(&read);
        // Leave garbage (a long, unparsed tail) in both buffers first.
        let _ = feed(&[0u8; 4000]);
        let _ = feed(&[3 << 2, 0x04, 0x00, 0x80, 0x00, 0xff, 0xff, 0, 0]);
        assert!(
            RX.with(|r| r.borrow().iter().all(|b| b.is_some())),
            "buffers kept"
        );
        assert_eq!(feed(&read), fresh);
    }

    /// The thread's registry is reused: after any input it is back where a
    /// fresh one starts (no controller, the first controller ID next, no
    /// tenant assigned), so an input's answer does not depend on the inputs
    /// before it.
    #[test]
    fn a_reused_registry_answers_as_a_fresh_one() {
        let mut sqe = Sqe::rw(trellis_nvme::sqe::io::READ, 9, 1, 0, 8, false);
        sqe.set_sgl(Sgl::transport(4096));
        let mut read = vec![3 << 2];
        push_capsule(&mut read, &sqe, &[], Digests::default());
        // As if an earlier input's host had taken the first tenant.
        REGISTRY.with(|reg| reg.tenants().tenant_of("nqn.2026-11.io.trellis:earlier"));
        let first = feed(&read);
        for sel in [2u8 << 2, 3 << 2, 1] {
            feed(&[sel, 0xFF, 0, 0x7F]);
        }
        assert_eq!(feed(&read), first);
        REGISTRY.with(|reg| {
            assert_eq!(reg.next_cntlid(), reg.limits().cntlid_min);
            assert!(reg
                .subsystems()
                .iter()
                .all(|s| crate::sys::lock(&s.controllers).is_empty()));
            // The harness's host would get the first dynamic tenant again.
            assert_eq!(reg.tenants().tenant_of(HOST), 0);
        });
        reset_for_next_test();
    }

    /// An input may register and acquire a reservation: the reset drops it,
    /// or the next input's I/O would be judged against it.
    #[test]
    fn reservations_do_not_outlive_an_input() {
        use trellis_nvme::resv::{self, AcquireAction, AcquireCmd, Cptpl, RType};
        use trellis_nvme::resv::{RegisterAction, RegisterCmd};
        let mut v = vec![3 << 2]; // mode 3: I/O queue, no digests
        let mut reg_sqe = Sqe::new(trellis_nvme::sqe::io::RESV_REGISTER, 9, 1);
        RegisterCmd {
            action: RegisterAction::Register,
            iekey: false,
            cptpl: Cptpl::NoChange,
        }
        .encode(&mut reg_sqe);
        reg_sqe.set_sgl(Sgl::in_capsule(16));
        push_capsule(
            &mut v,
            &reg_sqe,
            &resv::encode_keys(0, 5),
            Digests::default(),
        );
        let mut acq = Sqe::new(trellis_nvme::sqe::io::RESV_ACQUIRE, 10, 1);
        AcquireCmd {
            action: AcquireAction::Acquire,
            iekey: false,
            rtype: RType::ExclusiveAccess,
        }
        .encode(&mut acq);
        acq.set_sgl(Sgl::in_capsule(16));
        push_capsule(&mut v, &acq, &resv::encode_keys(5, 0), Digests::default());
        REGISTRY.with(|reg| {
            feed_with(reg, &v);
            let ns = reg.ns().load().by_uid[0].clone().expect("the namespace");
            let held = ns.resv().snapshot().held.map(|h| h.rtype);
            assert_eq!(held, Some(RType::ExclusiveAccess), "the input acquired");
            reset(reg);
            assert_eq!(ns.resv().snapshot(), crate::state::resv::State::default());
            assert!(!ns.resv().any_held());
        });
    }

    fn reset_for_next_test() {
        REGISTRY.with(|reg| reset(reg));
    }
}

#[cfg(test)]
mod timer_tests {
    use super::*;

    /// A connection's timers are data: its deadline is reported, nothing
    /// happens before it, and the timeout fires at it. A connection that
    /// sends nothing meets the ICReq deadline (`target.icreq_timeout_ms`),
    /// well before the connect timeout.
    #[test]
    fn connect_timeout_is_a_deadline_not_a_scan() {
        let reg = registry();
        let addr = "127.0.0.1:1".parse().unwrap();
        let t0 = 5_000_000_000u64;
        let mut c = Conn::new(7, reg.clone(), addr, addr, reg.listeners()[0].kind, 1, t0);
        let limit = reg.limits().icreq_timeout_ms * 1_000_000;
        assert!(limit < reg.limits().connect_timeout_ms * 1_000_000);
        assert_eq!(c.next_timeout(), Some(t0 + limit));
        c.handle_timeout(t0 + limit - 1);
        assert!(!c.is_closing(), "closed before its deadline");
        c.handle_timeout(t0 + limit + 1);
        assert!(c.is_closing());
        assert_eq!(c.close_reason(), "no ICReq within target.icreq_timeout_ms");
        assert_eq!(c.next_timeout(), None, "a closing connection has no timer");
    }

    /// After Connect the admin queue's deadline is the keep-alive limit
    /// (KATO rounded up to whole seconds) or its next controller check
    /// (every 100 ms), and batched statistics add a flush deadline.
    #[test]
    fn admin_queue_deadline_follows_keep_alive() {
        let reg = registry();
        let addr = "127.0.0.1:1".parse().unwrap();
        let mut now = 1_000u64;
        let mut c = Conn::new(0, reg.clone(), addr, addr, reg.listeners()[0].kind, 1, now);
        let mut queues = Vec::new();
        let mut scratch = Vec::new();
        let p = prefix(Digests::default(), Some((0, CNTLID_DYNAMIC)));
        run(&mut c, &p, &mut queues, &reg, &mut scratch, &mut now);
        let ctrl = c.ctrl().expect("connected").clone();
        // No KATO (the prefix connects with 0): no keep-alive deadline, only
        // the check for a controller torn down by the control path.
        let check = c
            .next_timeout()
            .expect("the admin queue checks its controller");
        c.handle_timeout(check);
        assert!(!c.is_closing());
        assert_eq!(
            c.next_timeout(),
            Some(check + crate::data::tcp::conn::CTRL_CHECK_NS)
        );
        let kato_ms = 4_500u64; // rounds up to 5 s
        ctrl.set_kato_ms(kato_ms as u32, ctrl.last_keepalive_ns());
        let last = ctrl.last_keepalive_ns();
        let want = last + kato_ms.div_ceil(1000) * 1_000_000_000;
        c.handle_timeout(want - 1);
        assert!(!c.is_closing());
        assert_eq!(c.next_timeout(), Some(want), "before the next check");
        c.handle_timeout(want + 1);
        assert!(c.is_closing());
        assert_eq!(c.close_reason(), "keep-alive timeout");
        c.on_close();
    }
}

#[cfg(test)]
mod direct_h2c_tests {
    use super::*;
    use trellis_nvme::pdu::{flags, DataHdr, PduType};
    use trellis_nvme::sqe::io;
    use trellis_nvme::Cqe;

    const LEN: usize = 32 << 10;

    struct Drive {
        reg: Arc<Registry>,
        queues: Vec<Option<crate::data::nvme::exec::NsQueue>>,
        scratch: Vec<u8>,
        now: u64,
    }

    impl Drive {
        /// Feeds `input` in `chunk`-byte pieces and returns what the
        /// connection sent meanwhile.
        fn feed(&mut self, c: &mut Conn, input: &[u8], chunk: usize) -> Vec<u8> {
            let mut out = Vec::new();
            let mut off = 0;
            while off < input.len() {
                let space = c.rx_space();
                let n = space.len().min(chunk).min(input.len() - off);
                space[..n].copy_from_slice(&input[off..off + n]);
                c.rx_commit(n);
                off += n;
                self.now += 1_000;
                let mut ctx = Ctx {
                    icd: &[],
                    auth: None,
                    now_ns: self.now,
                    queues: &mut self.queues,
                    reg: &self.reg,
                    scratch: &mut self.scratch,
                };
                c.process(&mut ctx);
                let mut iov = Vec::new();
                c.tx_iovecs(&mut iov, 1024);
                for v in &iov {
                    // SAFETY: the iovecs point at bytes the connection keeps
                    // unchanged until tx_advance, which comes after this copy.
                    out.extend_from_slice(unsafe {
                        std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
                    });
                }
                c.tx_advance(c.output_bytes());
            }
            out
        }
    }

    /// The PDUs in `out` as (type, bytes).
    fn pdus(out: &[u8]) -> Vec<(u8, &[u8])> {
        let mut v = Vec::new();
        let mut at = 0;
        while at + 8 <= out.len() {
            let plen = trellis_nvme::le32(out, at + 4) as usize;
            v.push((out[at], &out[at..at + plen]));
            at += plen;
        }
        v
    }

    fn capsule(sqe: &Sqe, dg: Digests) -> Vec<u8> {
        let mut v = Vec::new();
        push_capsule(&mut v, sqe, &[], dg);
        v
    }

    /// A 32 KiB write whose H2CData arrives in small pieces lands in the
    /// command's buffer directly (rx_space is that buffer), is executed once
    /// complete, reads back intact, and a bad data digest fails it with a
    /// retryable status.
    #[test]
    fn large_h2c_data_is_received_straight_into_the_command_buffer() {
        for (dg, corrupt) in [
            (Digests::default(), false),
            (Digests::from_bits(3), false),
            (Digests::from_bits(3), true),
        ] {
            let reg = registry();
            let addr = "127.0.0.1:1".parse().unwrap();
            let kind = reg.listeners()[0].kind;
            let mut d = Drive {
                reg: reg.clone(),
                queues: Vec::new(),
                scratch: Vec::new(),
                now: 1_000,
            };
            let mut admin = Conn::new(0, reg.clone(), addr, addr, kind, 1, d.now);
            d.feed(&mut admin, &prefix(dg, Some((0, CNTLID_DYNAMIC))), 4096);
            let cntlid = admin.ctrl().expect("admin connected").cntlid();
            let mut c = Conn::new(1, reg.clone(), addr, addr, kind, 1, d.now);
            d.feed(&mut c, &prefix(dg, Some((1, cntlid))), 4096);
            assert_eq!(c.qid(), Some(1));

            let nlb = (LEN / 512) as u32;
            let mut w = Sqe::rw(io::WRITE, 5, 1, 0, nlb, false);
            w.set_sgl(Sgl::transport(LEN as u32));
            let out = d.feed(&mut c, &capsule(&w, dg), 4096);
            let r2t = pdus(&out)
                .into_iter()
                .find(|p| p.0 == PduType::R2T as u8)
                .expect("R2T");
            let ttag = pdu::R2t::decode(r2t.1).ttag;

            let pattern: Vec<u8> = (0..LEN).map(|i| (i * 7 + 3) as u8).collect();
            let mut h2c = vec![0u8; pdu::MAX_HDR_LEN];
            let h = DataHdr {
                cccid: 5,
                ttag,
                datao: 0,
                datal: LEN as u32,
            };
            let n = pdu::encode_data_hdr(&mut h2c, PduType::H2CData, &h, flags::LAST_PDU, dg);
            h2c.truncate(n);
            h2c.extend_from_slice(&pattern);
            if dg.data {
                let crc = trellis_nvme::crc::digest(&pattern) ^ corrupt as u32;
                h2c.extend_from_slice(&crc.to_le_bytes());
            }
            // Header and 100 payload bytes: the rest now goes straight to the buffer.
            let first = n + 100;
            d.feed(&mut c, &h2c[..first], first);
            assert_eq!(
                c.rx_space().len(),
                LEN - 100,
                "rx_space is the command's buffer"
            );
            let out = d.feed(&mut c, &h2c[first..], 1000);
            let resp = pdus(&out)
                .into_iter()
                .find(|p| p.0 == PduType::CapsuleResp as u8);
            let cqe = Cqe::decode(&resp.expect("write response").1[8..24]);
            if corrupt {
                assert_eq!(
                    cqe.status,
                    trellis_nvme::status::generic::TRANSIENT_TRANSPORT_ERROR
                );
                continue;
            }
            assert!(cqe.status.is_success(), "write failed: {}", cqe.status);

            let mut r = Sqe::rw(io::READ, 6, 1, 0, nlb, false);
            r.set_sgl(Sgl::transport(LEN as u32));
            let out = d.feed(&mut c, &capsule(&r, dg), 4096);
            let c2h = pdus(&out)
                .into_iter()
                .find(|p| p.0 == PduType::C2HData as u8);
            let c2h = c2h.expect("read data").1;
            let off = pdu::SMALL_HLEN + dg.hd_len(); // C2HData header: 24 bytes
            assert_eq!(&c2h[off..off + LEN], &pattern[..], "data read back");
            c.on_close();
            admin.on_close();
        }
    }
}
