//! The client side of an I/O: open- and closed-loop generation, admission
//! through the SSD-credit rate limiter, the command and the write data out,
//! the end-host ISR port choice of a multi-port host, and completion (or
//! giving up) back to the workload generator.

use super::{
    EndHostPaths, Host, Io, Limited, Msg, Packet, PktKind, R2t, Sim, EV_ADMIT, EV_HOST_ARRIVAL,
    EV_ISSUE, NO_LOCAL_PORT, NO_PORT,
};
use crate::config::SimConfig;
use crate::net::rto::RtoEstimator;
use crate::topo::Graph;
use crate::workload::{Cluster, Gen, IoSpec};
use anyhow::Result;
use std::collections::{HashMap, VecDeque};
use trellis_fabric::isr::{HopRec, IsrHeader};
use trellis_fabric::ssd_credit;
use trellis_fabric::ssd_credit::HostRateLimiter;
use trellis_path::replica::{IsrPaths, ReplicaState, MAX_PATHS};
use trellis_units::IoDir;

impl Sim {
    pub(super) fn schedule_arrival(&mut self, h: u32, j: u16, now: u64) {
        // Pending open-loop arrivals live in the host's job; encode (host, job) in the event.
        let gen = self.hosts[h as usize].jobs[j as usize]
            .as_mut()
            .expect("arrival for a job the host does not run");
        if let Some((t, spec)) = gen.next_arrival(now, &mut self.rng) {
            let io = self.alloc_io(h, j, spec, t);
            self.q.push(t, EV_HOST_ARRIVAL, io);
        }
    }

    pub(super) fn alloc_io(&mut self, host: u32, job: u16, spec: IoSpec, now: u64) -> u32 {
        let target_node = self.ssds[spec.ssd as usize].node;
        let io = self.ios.insert(Io {
            gen: 0,
            host,
            job,
            spec,
            target_node,
            submit_ns: now,
            rank: 0,
            hdr: IsrHeader::default(),
            target_in_port: u32::MAX,
            fwd_expected: 0,
            fwd_arrived: 0,
            rev_expected: 0,
            rev_arrived: 0,
            headroom_bytes_per_s: 0,
            ssd_latency_ns: 0,
            grants: [(0, 0); 8],
            n_grants: 0,
            lost: false,
            r2t: R2t::None,
            host_lp: NO_LOCAL_PORT,
            sent_ns: 0,
            win_bytes: [0; 2],
            win_seq: [0; 2],
            win_sent_ns: [0; 2],
            retry_at_ns: u64::MAX,
            retry_is_rto: false,
            retried: false,
        });
        // A slot keeps counting generations across the I/Os that use it, so a packet of
        // an earlier I/O still in a queue never matches the new one.
        let g = self.slot_gen.get(io as usize).copied().unwrap_or(0);
        self.ios.get_mut(io).gen = g;
        io
    }

    pub(super) fn new_io(&mut self, host: u32, job: u16, spec: IoSpec, now: u64) {
        let io = self.alloc_io(host, job, spec, now);
        self.metrics.on_start(now);
        self.admit(io);
    }

    /// Closed loop: issue now, or at the time the generator's client CPU lets it.
    pub(super) fn issue_when_ready(&mut self, host: u32, job: u16, spec: IoSpec, now: u64) {
        let ready = self.hosts[host as usize].jobs[job as usize]
            .as_ref()
            .map_or(0, |g| g.ready_ns(&spec));
        if ready <= now {
            self.new_io(host, job, spec, now);
        } else {
            let io = self.alloc_io(host, job, spec, ready);
            self.q.push(ready, EV_ISSUE, io);
        }
    }

    pub(super) fn on_host_arrival(&mut self, io: u32) {
        let (h, j) = {
            let o = self.ios.get(io);
            (o.host, o.job)
        };
        let now = self.q.now;
        // Open-loop I/Os are allocated when their arrival is scheduled; the
        // application submits them now.
        self.metrics.on_start(now);
        self.schedule_arrival(h, j, now);
        self.admit(io);
    }

    /// Host-side admission: the storage-driven rate limiter (if on), then send.
    pub(super) fn admit(&mut self, io: u32) {
        if !self.ssds[self.ios.get(io).spec.ssd as usize].alive {
            // The target is gone: the application sees an error; count it and drop.
            self.metrics.failed_ios += 1;
            self.finish_io_without_completion(io);
            return;
        }
        if self.cfg.mechanisms.credits {
            let (host, ssd) = {
                let o = self.ios.get(io);
                (o.host, o.spec.ssd)
            };
            let lcfg = &self.cfg.limiter;
            let l = self.hosts[host as usize]
                .limiters
                .entry(ssd)
                .or_insert_with(|| Limited {
                    lim: HostRateLimiter::new(lcfg),
                    waiting: VecDeque::new(),
                    timer_armed: false,
                });
            l.waiting.push_back(io);
            if !l.timer_armed {
                self.drain_limiter(host, ssd);
            }
            return;
        }
        self.tcp_send(io, Msg::Command);
    }

    /// Admit waiting I/Os of (host, ssd) in order while the limiter allows; else arm its timer.
    pub(super) fn drain_limiter(&mut self, host: u32, ssd: u32) {
        let now = self.q.now;
        let cap = self.cfg.gimbal.rate_init_bytes_per_s;
        loop {
            let lcfg = &self.cfg.limiter;
            let l = self.hosts[host as usize]
                .limiters
                .get_mut(&ssd)
                .expect("limiter");
            l.timer_armed = false;
            let Some(&io) = l.waiting.front() else { return };
            let bytes = self.ios.get(io).spec.size_bytes as u64;
            if let Err(t) = l.lim.admit(lcfg, bytes, now) {
                l.timer_armed = true;
                let key = host as u64 * self.ssds.len() as u64 + ssd as u64;
                assert!(
                    key <= u32::MAX as u64,
                    "host × SSD index overflows the event payload"
                );
                self.q.push(t, EV_ADMIT, key as u32);
                return;
            }
            l.waiting.pop_front();
            let headroom = l.lim.last_headroom();
            // The rank is fixed once per I/O, from the latest SSD credit: all its packets share it.
            self.ios.get_mut(io).rank = if headroom == u64::MAX {
                0
            } else {
                ssd_credit::rank(headroom, cap)
            };
            self.tcp_send(io, Msg::Command);
        }
    }

    pub(super) fn send_command(&mut self, io: u32) {
        let (host, op, size, gen) = {
            let o = self.ios.get(io);
            (o.host, o.spec.op, o.spec.size_bytes, o.gen)
        };
        let r2t = op == IoDir::Write && size > self.cfg.topology.inline_data_bytes;
        self.ios.get_mut(io).r2t = if r2t { R2t::Command } else { R2t::None };
        let fwd = self.msg_bytes(io, Msg::Command); // with an R2T, the capsule alone
        let n = fwd.div_ceil(self.payload_max);
        let hnode = self.hosts[host as usize].node;
        let mut hport = self.hosts[host as usize].port;
        if let Some(p) = self.end_host_port(io) {
            hport = p;
        } else if self.g.node_ports[hnode as usize].len() > 1 {
            // A client with several ports picks one per I/O (per-flow ECMP).
            let target = self.ios.get(io).target_node;
            if let Some(p) = self.route(hnode, target, io) {
                hport = p;
            }
        }
        let out_port = self.local_of(hnode, hport);
        {
            let o = self.ios.get_mut(io);
            o.fwd_expected = n as u16;
            o.hdr.push(HopRec {
                node: hnode,
                in_port: NO_PORT,
                out_port,
                ..Default::default()
            });
        }
        let rank = self.ios.get(io).rank;
        self.send_fwd(io, gen, rank, hport, fwd, true);
    }

    /// Sends `bytes` of I/O `io` from its host as forward packets of at most
    /// `payload_max` through `hport`; `marker` flags the first one (the one
    /// that carries the command).
    pub(super) fn send_fwd(
        &mut self,
        io: u32,
        gen: u16,
        rank: u8,
        hport: u32,
        bytes: u32,
        marker: bool,
    ) {
        let n = bytes.div_ceil(self.payload_max);
        let mut left = bytes;
        for i in 0..n {
            let payload = left.min(self.payload_max);
            left -= payload;
            let p = self.pkts.insert(Packet {
                io,
                gen,
                kind: PktKind::Fwd,
                marker: marker && i == 0,
                wire_bytes: payload + self.cfg.topology.frame_overhead_bytes,
                hop: 1,
                to: self.g.peer_node(hport),
                via: hport,
                enq_ns: 0,
                class: 1 + rank,
            });
            self.enqueue(p, hport);
        }
    }

    /// The R2T arrived: send the H2CData along the command's recorded path (an R2T and
    /// its data belong to one command and take one path).
    pub(super) fn send_write_data(&mut self, io: u32) {
        let (host, gen, rank) = {
            let o = self.ios.get(io);
            (o.host, o.gen, o.rank)
        };
        let hnode = self.hosts[host as usize].node;
        let first = self.ios.get(io).hdr.hops[0].out_port;
        let hport = self.g.node_ports[hnode as usize][first as usize];
        let bytes = self.msg_bytes(io, Msg::WriteData);
        let n = bytes.div_ceil(self.payload_max);
        {
            let o = self.ios.get_mut(io);
            o.r2t = R2t::Data;
            o.fwd_expected = n as u16;
            o.fwd_arrived = 0;
        }
        self.send_fwd(io, gen, rank, hport, bytes, false);
    }

    /// ISR at a multi-port host: any live port toward the target (paths need
    /// not be shortest: the testbed's client reaches each node over 4 disjoint
    /// paths), chosen by the host library's core from its round trips and its
    /// commands out per port. None for other hosts (ECMP or one port).
    pub(super) fn end_host_port(&mut self, io: u32) -> Option<u32> {
        let now = self.q.now;
        let (host, target) = {
            let o = self.ios.get(io);
            (o.host as usize, o.target_node)
        };
        let hnode = self.hosts[host].node;
        let mut cand = self.cand;
        let k = self.g.host_candidates(hnode, target, &mut cand);
        let ports = &self.g.node_ports[hnode as usize];
        let e = self.hosts[host].paths.get_mut(target as usize)?;
        let mut views = [ReplicaState {
            may_submit: false,
            credit_limit: None,
            depth: 0,
            inflight: 0,
        }; MAX_PATHS];
        for (lp, v) in views.iter_mut().enumerate().take(ports.len()) {
            v.may_submit = cand[..k].contains(&ports[lp]);
            v.inflight = e.inflight[lp];
        }
        let lp = e.isr.choose(&views[..ports.len()], now)?;
        e.inflight[lp] += 1;
        let o = self.ios.get_mut(io);
        o.host_lp = lp as u8;
        o.sent_ns = now;
        Some(ports[lp])
    }

    /// The attempt of `io` that left by an end-host ISR port is over: with
    /// its round trip when it completed (`done`), without when it was lost.
    pub(super) fn end_host_done(&mut self, io: u32, done: bool) {
        let now = self.q.now;
        let o = self.ios.get_mut(io);
        let lp = std::mem::replace(&mut o.host_lp, NO_LOCAL_PORT);
        // The fabric's part of the round trip: the ISR header carries the
        // device time home (`ssd_latency_ns`), and the device is the same
        // whichever path the I/O took, so it would only blur the paths apart.
        let rtt = (now - o.sent_ns).saturating_sub(o.ssd_latency_ns);
        let (host, target) = (o.host as usize, o.target_node as usize);
        if lp == NO_LOCAL_PORT {
            return;
        }
        if let Some(e) = self.hosts[host].paths.get_mut(target) {
            e.inflight[lp as usize] = e.inflight[lp as usize].saturating_sub(1);
            if done {
                e.isr.on_completion(lp as usize, rtt, now);
            }
        }
    }

    pub(super) fn host_complete(&mut self, io: u32) {
        self.end_host_done(io, true);
        let now = self.q.now;
        let (host, job, spec, submit, headroom) = {
            let o = self.ios.get(io);
            (o.host, o.job, o.spec, o.submit_ns, o.headroom_bytes_per_s)
        };
        self.release_grants(io);
        if self.cfg.mechanisms.credits {
            let lcfg = &self.cfg.limiter;
            if let Some(l) = self.hosts[host as usize].limiters.get_mut(&spec.ssd) {
                l.lim.on_ssd_credit(lcfg, headroom);
            }
        }
        let ssd_lat = self.ios.get(io).ssd_latency_ns;
        // RTT sample of the connection: the I/O's time outside the device (it includes
        // the target's queueing, so the RTO errs long; with a 200 ms floor it hardly matters).
        let target = self.ios.get(io).target_node as usize;
        let rtt_ns = (now - submit).saturating_sub(ssd_lat);
        if !self.ios.get(io).retried {
            self.hosts[host as usize].rto[target].on_rtt_sample(rtt_ns);
        }
        self.metrics
            .on_complete(spec.op, spec.size_bytes, now - submit, ssd_lat, submit, now);
        self.metrics.on_finish(submit, now);
        self.free_io(io);
        let gen = self.hosts[host as usize].jobs[job as usize]
            .as_mut()
            .expect("job");
        let follow = gen.on_complete(&spec, now, &mut self.rng);
        for s in follow.into_iter().flatten() {
            self.issue_when_ready(host, job, s, now);
        }
    }

    pub(super) fn finish_io_without_completion(&mut self, io: u32) {
        self.end_host_done(io, false);
        let (host, job, spec, submit) = {
            let o = self.ios.get(io);
            (o.host, o.job, o.spec, o.submit_ns)
        };
        self.release_grants(io);
        self.free_io(io);
        // Keep closed loops alive: the application moves on to its next I/O.
        let now = self.q.now;
        self.metrics.on_finish(submit, now);
        let gen = self.hosts[host as usize].jobs[job as usize]
            .as_mut()
            .expect("job");
        let follow = gen.on_complete(&spec, now, &mut self.rng);
        if let Some(s) = follow[0] {
            if self.ssds[s.ssd as usize].alive {
                self.issue_when_ready(host, job, s, now);
            }
        }
    }

    pub(super) fn release_grants(&mut self, io: u32) {
        let o = self.ios.get_mut(io);
        let n = o.n_grants as usize;
        let grants = o.grants;
        o.n_grants = 0;
        for &(p, r) in &grants[..n] {
            self.ports[p as usize].resv.release(r);
        }
    }

    /// An I/O leaves with none of its bytes in a send window: each was acked, or left the
    /// flight at its loss (counted, not only asserted, so a test can check release builds).
    /// Its slot's next I/O starts at the next generation.
    pub(super) fn free_io(&mut self, io: u32) {
        let o = self.ios.get(io);
        let (b, gen) = (o.win_bytes, o.gen);
        debug_assert_eq!(b, [0, 0], "an I/O leaves with bytes in its send windows");
        self.tcp_leaked_bytes += (b[0] + b[1]) as u64;
        let i = io as usize;
        if i >= self.slot_gen.len() {
            self.slot_gen.resize(i + 1, 0);
        }
        self.slot_gen[i] = gen.wrapping_add(1);
        self.ios.remove(io);
    }
}

/// Each host with its workload generators (a job may be limited to some hosts), its
/// end-host ISR paths, and one RTO estimator per storage node.
pub(super) fn build_hosts(
    cfg: &SimConfig,
    g: &Graph,
    n_ssds: u32,
    ssd_bytes: u64,
) -> Result<Vec<Host>> {
    let n_targets = g.storage.len();
    let mut hosts = Vec::new();
    for (hi, &node) in g.hosts.iter().enumerate() {
        let c = Cluster {
            n_ssds,
            ssd_bytes,
            host_index: hi as u32,
            n_hosts: g.hosts.len() as u32,
        };
        let mut jobs = Vec::new();
        for job in &cfg.workload.jobs {
            if job.hosts.is_empty() || job.hosts.contains(&(hi as u32)) {
                let mut gen = Gen::new(job, c)?;
                if let Gen::Ycsb(y) = &mut gen {
                    y.measure_from_ns = cfg.warmup_ns;
                }
                jobs.push(Some(gen));
            } else {
                jobs.push(None);
            }
        }
        let np = &g.node_ports[node as usize];
        let ports = np.len();
        // A team of ports to one switch is a LAG (per-flow hashing, below);
        // ports to different nodes are paths the host chooses among.
        let team = np.iter().all(|&p| g.peer_node(p) == g.peer_node(np[0]));
        let end_host = cfg.mechanisms.isr && (2..=MAX_PATHS).contains(&ports) && !team;
        hosts.push(Host {
            node,
            port: g.node_ports[node as usize][0],
            paths: (0..if end_host { n_targets } else { 0 })
                .map(|_| EndHostPaths {
                    isr: IsrPaths::new(ports),
                    inflight: [0; MAX_PATHS],
                })
                .collect(),
            jobs,
            limiters: HashMap::default(),
            rto: vec![RtoEstimator::default(); n_targets],
        });
    }
    Ok(hosts)
}
