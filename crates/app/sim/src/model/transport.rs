//! NVMe/TCP, one connection per (host, storage node): each direction's send
//! window and the PDUs waiting behind it, PDU sizes on the wire, ACK timing,
//! and loss: RACK detection, the RTO and the retry that resends the I/O.

use super::{LostPdu, Msg, PktKind, R2t, Sim, TcpDir, DOWN, EV_ACK, EV_RETRY, R2T_BYTES, UP};
use crate::config::SimConfig;
use crate::net::tcp_window::SendWindow;
use anyhow::Result;
use std::collections::VecDeque;
use trellis_fabric::isr::IsrHeader;
use trellis_fabric::reserve;
use trellis_units::IoDir;

/// Linux TCP_RTO_MAX: the backed-off RTO never exceeds 120 s.
const RTO_MAX_NS: u64 = 120_000_000_000;

impl Sim {
    /// Hand a PDU of `io` to its connection direction: it leaves now if the send
    /// window lets it and nothing waits ahead of it; otherwise it waits in order.
    pub(super) fn tcp_send(&mut self, io: u32, msg: Msg) {
        if !self.cfg.topology.tcp_window {
            self.transmit(io, msg, 0, 0);
            return;
        }
        let now = self.q.now;
        let gen = self.ios.get(io).gen;
        let ix = self.tcp_ix(io, msg.dir());
        let bytes = self.msg_bytes(io, msg);
        let td = &mut self.tcp[ix];
        td.win.poll(now);
        if td.waiting.is_empty() && td.win.fits(bytes) {
            let seq = td.win.on_send(bytes);
            self.transmit(io, msg, bytes, seq);
        } else {
            td.waiting.push_back((io, gen, msg));
            self.arm_ack_timer(ix);
        }
    }

    /// Direction `d` of the connection from `io`'s host to its target, in `self.tcp`.
    pub(super) fn tcp_ix(&self, io: u32, d: usize) -> usize {
        let o = self.ios.get(io);
        (o.host as usize * self.g.storage.len() + o.target_node as usize) * 2 + d
    }

    /// The PDU leaves: `bytes` join its direction's flight (0 with windows off) as PDU `seq`.
    pub(super) fn transmit(&mut self, io: u32, msg: Msg, bytes: u32, seq: u64) {
        let (d, now) = (msg.dir(), self.q.now);
        let o = self.ios.get_mut(io);
        o.win_bytes[d] += bytes;
        o.win_seq[d] = seq;
        o.win_sent_ns[d] = now;
        match msg {
            Msg::Command => self.send_command(io),
            Msg::WriteData => self.send_write_data(io),
            Msg::R2t => self.send_rev(io, R2T_BYTES),
            Msg::Response => self.send_response(io),
        }
    }

    /// Send the PDUs that now fit, in order; wait for the next ACK if some still wait.
    pub(super) fn tcp_pump(&mut self, ix: usize) {
        let now = self.q.now;
        self.tcp[ix].win.poll(now);
        while let Some(&(io, gen, msg)) = self.tcp[ix].waiting.front() {
            // A waiting PDU's I/O has nothing in flight, so it cannot have been lost.
            debug_assert!(self.ios.get(io).gen == gen && !self.ios.get(io).lost);
            let bytes = self.msg_bytes(io, msg);
            let td = &mut self.tcp[ix];
            if !td.win.fits(bytes) {
                break;
            }
            td.waiting.pop_front();
            let seq = td.win.on_send(bytes);
            self.transmit(io, msg, bytes, seq);
        }
        self.arm_ack_timer(ix);
    }

    /// PDUs wait and an ACK is on its way: wake when it is back (one timer per direction).
    pub(super) fn arm_ack_timer(&mut self, ix: usize) {
        let td = &mut self.tcp[ix];
        if td.timer_armed || td.waiting.is_empty() {
            return;
        }
        if let Some(at) = td.win.next_ack_ns() {
            td.timer_armed = true;
            self.q.push(at, EV_ACK, ix as u32);
        }
    }

    /// The last byte of the current PDU of `io` in direction `d` reached its receiver:
    /// its ACK is back at the sender after the path's unloaded one-way delay.
    pub(super) fn tcp_delivered(&mut self, io: u32, d: usize) {
        let bytes = std::mem::take(&mut self.ios.get_mut(io).win_bytes[d]);
        if bytes == 0 {
            return;
        }
        let at = self.q.now + self.ack_delay_ns(io);
        let ix = self.tcp_ix(io, d);
        self.tcp[ix].win.on_delivered(at, bytes);
        if !self.tcp[ix].lost.is_empty() {
            self.rack_detect(ix, io, d, at);
        }
        self.arm_ack_timer(ix);
    }

    /// RACK (RFC 8985, Linux's default loss detection with SACK): the ACK of `io`'s PDU,
    /// back at `ack_at`, also tells the sender that every PDU sent before it and still
    /// unacknowledged is lost once it is older than that PDU's round trip plus the
    /// reordering window. Each such I/O is resent then, without waiting for the RTO.
    pub(super) fn rack_detect(&mut self, ix: usize, io: u32, d: usize, ack_at: u64) {
        let (seq, sent_ns, h, t) = {
            let o = self.ios.get(io);
            let (h, t) = (o.host as usize, o.target_node as usize);
            (o.win_seq[d], o.win_sent_ns[d], h, t)
        };
        let rack_rtt_ns = ack_at - sent_ns;
        let reo_ns = self.hosts[h].rto[t].reo_wnd_ns();
        let mut i = 0;
        while i < self.tcp[ix].lost.len() {
            let e = self.tcp[ix].lost[i];
            if e.seq >= seq {
                i += 1;
                continue;
            }
            let o = self.ios.get_mut(e.io);
            debug_assert!(o.gen == e.gen && o.lost, "an RTO retry removes its entries");
            let at = ack_at.max(e.sent_ns + rack_rtt_ns + reo_ns);
            if at >= o.retry_at_ns {
                i += 1; // its RTO comes first; that retry removes the entry
                continue;
            }
            self.tcp[ix].lost.swap_remove(i);
            let bytes = std::mem::take(&mut o.win_bytes[d]);
            o.retry_at_ns = at;
            o.retry_is_rto = false;
            let now = self.q.now;
            self.tcp[ix].win.poll(now);
            self.tcp[ix].win.on_loss_detected(e.seq, bytes);
            self.metrics.rack_recoveries += 1;
            self.q.push(at, EV_RETRY, e.io);
        }
    }

    /// The RTO of a lost attempt expired: each direction that lost bytes of it
    /// collapses to the loss window, and what waited may go.
    pub(super) fn tcp_timeout(&mut self, io: u32) {
        if !self.cfg.topology.tcp_window {
            return;
        }
        let lost = std::mem::take(&mut self.ios.get_mut(io).win_bytes);
        let seqs = self.ios.get(io).win_seq;
        for (d, &b) in lost.iter().enumerate() {
            let ix = self.tcp_ix(io, d);
            // Resent now: RACK must not find this attempt lost again later.
            if !self.tcp[ix].lost.is_empty() {
                self.tcp[ix].lost.retain(|e| e.io != io);
            }
            if b > 0 {
                let now = self.q.now;
                self.tcp[ix].win.poll(now);
                self.tcp[ix].win.on_timeout(seqs[d], b);
                self.tcp_pump(ix);
            }
        }
    }

    /// Bytes of a PDU in TCP's sequence space (headers and data, no framing). A write up
    /// to the in-capsule limit is one CapsuleCmd with its data and one CapsuleResp; a
    /// larger one is a bare CapsuleCmd, an R2T, H2CData and a CapsuleResp.
    pub(super) fn msg_bytes(&self, io: u32, msg: Msg) -> u32 {
        let o = self.ios.get(io);
        let (op, size) = (o.spec.op, o.spec.size_bytes);
        let r2t = op == IoDir::Write && size > self.cfg.topology.inline_data_bytes;
        let capsule = reserve::capsule_bytes(IoDir::Read, 0);
        match msg {
            Msg::Command if r2t => capsule,
            Msg::Command => reserve::capsule_bytes(op, size),
            Msg::WriteData => reserve::request_bytes(IoDir::Write, size) - capsule,
            Msg::R2t => R2T_BYTES,
            Msg::Response if op == IoDir::Write => reserve::CAPSULE_RESP_BYTES,
            Msg::Response => reserve::response_bytes(op, size),
        }
    }

    /// An ACK's way back: propagation and forwarding over the I/O's recorded hops,
    /// without queueing (ACKs are not simulated as packets; docs/sim.md).
    /// Every link has the topology's `prop_ns` (topo.rs); the hop records hold the host
    /// and the transit nodes, one link each.
    pub(super) fn ack_delay_ns(&self, io: u32) -> u64 {
        let hdr = &self.ios.get(io).hdr;
        let hops = &hdr.hops[..hdr.n_hops as usize];
        let mut t = hops.len() as u64 * self.cfg.topology.prop_ns;
        for rec in hops.iter().skip(1) {
            t += self.forwarding_ns(rec.node, io);
        }
        t
    }

    pub(super) fn drop_packet(&mut self, p: u32) {
        let pk = *self.pkts.get(p);
        self.pkts.remove(p);
        let d = match pk.kind {
            PktKind::Fwd => UP,
            PktKind::Rev => DOWN,
        };
        self.lose_io(pk.io, pk.gen, d);
    }

    /// A packet of generation `gen` of `io`, in connection direction `d`, was lost (or
    /// could not be routed).
    pub(super) fn lose_io(&mut self, io: u32, gen: u16, d: usize) {
        let now = self.q.now;
        let rack = self.cfg.topology.tcp_window && self.cfg.topology.tcp_rack;
        let o = self.ios.get_mut(io);
        if o.gen != gen || o.lost {
            return;
        }
        // The host's TCP notices by its retransmission timeout and the I/O is sent again,
        // unless RACK finds the loss first from later deliveries (`rack_detect`).
        o.lost = true;
        let (host, target) = (o.host as usize, o.target_node as usize);
        let lost = LostPdu {
            seq: o.win_seq[d],
            sent_ns: o.win_sent_ns[d],
            io,
            gen,
        };
        let counted = o.win_bytes[d] > 0;
        self.metrics.lost_ios += 1;
        let conn = &self.hosts[host].rto[target];
        let t = now + conn.rto_ns(self.cfg.topology.tcp_rto_min_ns, RTO_MAX_NS);
        let o = self.ios.get_mut(io);
        o.retry_at_ns = t;
        o.retry_is_rto = true;
        self.q.push(t, EV_RETRY, io);
        if rack && counted {
            let ix = self.tcp_ix(io, d);
            self.tcp[ix].lost.push(lost);
        }
    }

    pub(super) fn on_retry(&mut self, io: u32) {
        let o = self.ios.get_mut(io);
        if o.retry_at_ns != self.q.now {
            return; // superseded: RACK resent it earlier (or it has completed since)
        }
        o.retry_at_ns = u64::MAX;
        o.retried = true;
        if std::mem::take(&mut o.retry_is_rto) {
            let (h, t) = (o.host as usize, o.target_node as usize);
            let (min, now) = (self.cfg.topology.tcp_rto_min_ns, self.q.now);
            self.hosts[h].rto[t].on_timeout(now, min, RTO_MAX_NS);
        }
        self.end_host_done(io, false);
        self.release_grants(io);
        self.tcp_timeout(io);
        let o = self.ios.get_mut(io);
        o.gen = o.gen.wrapping_add(1);
        o.lost = false;
        o.hdr = IsrHeader::default();
        o.fwd_arrived = 0;
        o.rev_arrived = 0;
        o.target_in_port = u32::MAX;
        o.r2t = R2t::None;
        let ssd = o.spec.ssd as usize;
        if !self.ssds[ssd].alive {
            self.metrics.failed_ios += 1;
            self.finish_io_without_completion(io);
            return;
        }
        self.tcp_send(io, Msg::Command);
    }
}

/// Most connection directions a run may hold (160 B each: 2.7 GB), so a huge cluster
/// fails with an error naming the fix instead of an allocation abort.
const MAX_TCP_DIRS: u64 = 1 << 24;

/// Checks the transport settings; returns the segment payload and, with windows on, one
/// send window per (host, storage node, direction) (empty with `tcp_window = false`).
pub(super) fn tcp_table(
    cfg: &SimConfig,
    hosts: usize,
    targets: usize,
) -> Result<(u32, Vec<TcpDir>)> {
    let t = &cfg.topology;
    let capsule = reserve::request_bytes(IoDir::Read, 0);
    anyhow::ensure!(
        t.mtu_bytes >= t.frame_overhead_bytes + capsule,
        "mtu_bytes {} must hold frame_overhead_bytes {} plus a {capsule} B command capsule",
        t.mtu_bytes,
        t.frame_overhead_bytes
    );
    let payload_max = t.mtu_bytes - t.frame_overhead_bytes;
    if !t.tcp_window {
        return Ok((payload_max, Vec::new()));
    }
    anyhow::ensure!(
        t.tcp_init_cwnd_segments > 0 && t.tcp_rwnd_bytes >= payload_max as u64,
        "tcp_init_cwnd_segments must be at least 1 and tcp_rwnd_bytes at least one \
         segment ({payload_max} B); got {} and {}",
        t.tcp_init_cwnd_segments,
        t.tcp_rwnd_bytes
    );
    let n_dirs = hosts as u64 * targets as u64 * 2;
    anyhow::ensure!(
        n_dirs <= MAX_TCP_DIRS,
        "{hosts} hosts × {targets} storage nodes need {n_dirs} TCP send windows, more than \
         {MAX_TCP_DIRS}; set tcp_window = false to run without them"
    );
    let dir = || TcpDir {
        win: SendWindow::new(payload_max, t.tcp_init_cwnd_segments, t.tcp_rwnd_bytes),
        waiting: VecDeque::new(),
        timer_armed: false,
        lost: Vec::new(),
    };
    Ok((payload_max, (0..n_dirs).map(|_| dir()).collect()))
}
