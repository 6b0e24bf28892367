//! The SAN model: hosts, fabric nodes, egress queues, targets with a scheduler and SSDs.
//!
//! Each SSD's queueing, dispatch and headroom belong to its `trellis_qos::sched`
//! scheduler (FIFO or Gimbal), the same core the storage node runs, driven by the
//! same `sched::Driver` (request rows, device latency, credits, timers); this file
//! only maps hosts to tenants and I/Os to the driver's payload.
//!
//! Per packet per hop there is one `Arrive` event, plus one `TxDone` only when the
//! egress was busy. Packets, I/Os and events are plain structs in slabs and a heap.

use crate::config::{SimConfig, TopologyKind};
use crate::engine::{EventQueue, Rng, Slab};
use crate::metrics::Metrics;
use crate::net::rto::RtoEstimator;
use crate::net::shared_buffer::SharedBuffer;
use crate::net::tcp_window::SendWindow;
use crate::topo::{self, Graph, NodeKind};
use crate::workload::{Cluster, Gen, IoSpec};
use anyhow::Result;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;
use rustc_hash::FxBuildHasher;
use std::collections::{HashMap, VecDeque};
use trellis_fabric::isr::{HopRec, IsrHeader, IsrTable};
use trellis_fabric::reserve::{self, PortReservation};
use trellis_fabric::ssd_credit::{self, HostRateLimiter};
use trellis_path::replica::{IsrPaths, ReplicaState, MAX_PATHS};
use trellis_qos::sched::{Driver, Policy, Request, SchedConfig, Submit, TenantId};
use trellis_ssd::Ssd;
use trellis_units::IoDir;

// Event kinds.
const EV_ARRIVE: u8 = 0;
const EV_TXDONE: u8 = 1;
const EV_SSD_DONE: u8 = 2;
const EV_HOST_ARRIVAL: u8 = 3;
const EV_ADMIT: u8 = 4;
const EV_SCHED_WAKE: u8 = 5;
const EV_FAIL: u8 = 6;
const EV_RETRY: u8 = 7;
/// A closed-loop I/O whose issue waits for client CPU (YCSB op work).
const EV_ISSUE: u8 = 8;
/// The nodes next to a failed link notice it (local repair).
const EV_FAIL_DETECT: u8 = 9;
/// Global routes are recomputed after a detected failure.
const EV_FAIL_CONVERGE: u8 = 10;
/// An ACK is back at the sender of a connection direction whose messages wait for it.
const EV_ACK: u8 = 11;

/// Egress classes: 0 = reserved responses and write completions, 1..=8 = rank 0..7.
const NQ: usize = 9;
const NO_PORT: u8 = u8::MAX;
/// NVMe/TCP R2T PDU (header only, no digest).
const R2T_BYTES: u32 = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PktKind {
    /// Host → target: command capsule, possibly with write data.
    Fwd,
    /// Target → host: read data and/or the completion.
    Rev,
}

#[derive(Clone, Copy, Debug)]
struct Packet {
    io: u32,
    gen: u16,
    kind: PktKind,
    /// Carries the completion (last reverse packet) or the command (first forward packet).
    marker: bool,
    wire_bytes: u32,
    /// Forward: index of the hop record for the node being entered; reverse: the hop
    /// record index of the node being entered (counting down), or NO_PORT if routed.
    hop: u8,
    /// Node the packet is travelling to.
    to: u32,
    /// Egress port it left through (to detect loss on a failed link).
    via: u32,
    enq_ns: u64,
    class: u8,
}

struct Io {
    gen: u16,
    host: u32,
    job: u16,
    spec: IoSpec,
    target_node: u32,
    submit_ns: u64,
    rank: u8,
    hdr: IsrHeader,
    target_in_port: u32,
    fwd_expected: u16,
    fwd_arrived: u16,
    rev_expected: u16,
    rev_arrived: u16,
    /// The SSD's headroom at completion, B/s: the NSDI'26 SSD credit it carries home.
    headroom_bytes_per_s: u64,
    ssd_latency_ns: u64,
    /// Reservation grants (port, B/s), released at completion.
    grants: [(u32, u64); 8],
    n_grants: u8,
    lost: bool,
    /// Write data transfer (NVMe/TCP): in-capsule, or R2T round trip (state below).
    r2t: R2t,
    /// End-host ISR: the host's port (local index) this attempt left by, or
    /// `NO_LOCAL_PORT`, and when its command left (the round trip's start).
    host_lp: u8,
    sent_ns: u64,
    /// Bytes of this attempt counted in each direction's send window (`UP`, `DOWN`)
    /// and not yet delivered: acked on delivery, or dropped from the flight at the RTO.
    win_bytes: [u32; 2],
    /// Per direction: the sequence number and send time of this attempt's current PDU
    /// (RACK compares them with later deliveries).
    win_seq: [u64; 2],
    win_sent_ns: [u64; 2],
    /// When the one retry that counts is due (EV_RETRY events at other times are stale:
    /// an RTO timer after RACK already resent the I/O); u64::MAX: none.
    retry_at_ns: u64,
    /// That retry is the connection's RTO expiring (not RACK, not a Busy answer).
    retry_is_rto: bool,
    /// Some attempt was resent: Karn's rule, no RTT sample from its completion.
    retried: bool,
}

const NO_LOCAL_PORT: u8 = u8::MAX;

/// A multi-port host's path choice toward one storage node: the host library's
/// own ISR core (`trellis_path::replica::IsrPaths`, what `trellis bench
/// --path-policy isr` runs), fed with the round trips the host measures and
/// the commands it has out on each port.
struct EndHostPaths {
    isr: IsrPaths,
    inflight: [u32; MAX_PATHS],
}

/// A write larger than the in-capsule limit sends its command alone, waits for the
/// controller's R2T, then sends the data as H2CData ([NVMe/TCP]; docs/sim.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum R2t {
    /// Reads, and writes whose data ride in the command capsule.
    None,
    /// The command is on its way; the target answers it with an R2T.
    Command,
    /// The R2T is on its way back to the host.
    Await,
    /// The H2CData is on its way; once it has arrived the write goes to the SSD.
    Data,
}

/// Connection directions: host → target (commands, H2CData) and target → host (R2T,
/// C2HData, completions).
const UP: usize = 0;
const DOWN: usize = 1;

/// An NVMe/TCP PDU that waits for its connection's send window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Msg {
    Command,
    WriteData,
    R2t,
    Response,
}

impl Msg {
    fn dir(self) -> usize {
        match self {
            Msg::Command | Msg::WriteData => UP,
            Msg::R2t | Msg::Response => DOWN,
        }
    }
}

/// One direction of an NVMe/TCP connection: its send window, and the PDUs queued
/// behind it in order (TCP's send buffer: a later PDU never overtakes an earlier one).
struct TcpDir {
    win: SendWindow,
    waiting: VecDeque<(u32, u16, Msg)>,
    timer_armed: bool,
    /// PDUs lost and not yet found lost by the sender (usually empty).
    lost: Vec<LostPdu>,
}

#[derive(Clone, Copy, Debug)]
struct LostPdu {
    seq: u64,
    sent_ns: u64,
    io: u32,
    gen: u16,
}

struct PortQ {
    q: [VecDeque<u32>; NQ],
    bytes: u64,
    busy_until: u64,
    tx_pending: bool,
    tx_bytes: u64,
    resv: PortReservation,
    /// The switch buffer pool this egress queue draws on (NO_POOL: a private buffer).
    pool: u32,
}

const NO_POOL: u32 = u32::MAX;

struct SsdSlot {
    ssd: Ssd,
    node: u32,
    /// The scheduler and its request rows (grown to the peak slot).
    drv: Driver<IoRef>,
    alive: bool,
}

/// The I/O a scheduler slot stands for, and which incarnation of it.
#[derive(Clone, Copy)]
struct IoRef {
    io: u32,
    gen: u16,
}

struct Limited {
    lim: HostRateLimiter,
    waiting: VecDeque<u32>,
    timer_armed: bool,
}

struct Host {
    node: u32,
    port: u32,
    /// Per storage node (target index): the end-host path choice of a
    /// multi-port host with ISR on (empty otherwise).
    paths: Vec<EndHostPaths>,
    jobs: Vec<Option<Gen>>,
    /// Per target SSD: the SSD-credit-driven limiter and the I/Os waiting on it, in order
    /// (one timer per limiter, so a backlog costs one event per admission, not per waiter).
    /// Never iterated, so the hasher cannot change any result.
    limiters: HashMap<u32, Limited, FxBuildHasher>,
    /// Per storage node: the retransmission timeout of this host's NVMe/TCP connection.
    rto: Vec<RtoEstimator>,
}

/// Linux TCP_RTO_MAX: the backed-off RTO never exceeds 120 s.
const RTO_MAX_NS: u64 = 120_000_000_000;

pub struct Sim {
    pub cfg: SimConfig,
    pub g: Graph,
    pub q: EventQueue,
    rng: Rng,
    ports: Vec<PortQ>,
    pkts: Slab<Packet>,
    ios: Slab<Io>,
    ssds: Vec<SsdSlot>,
    hosts: Vec<Host>,
    isr: Vec<Option<IsrTable>>,
    /// Per port: the link is physically down. Routing learns it only at detection
    /// (`g.port_up`), so until then packets routed onto it are lost (a blackhole).
    link_dead: Vec<bool>,
    /// Switch buffer pools (dynamic thresholds), indexed by `PortQ::pool`.
    pools: Vec<SharedBuffer>,
    /// Per configured failure: the ports it took down.
    failed_ports: Vec<Vec<u32>>,
    /// Storage node → its index among storage nodes (ISR tables are per target node).
    pub metrics: Metrics,
    payload_max: u32,
    retry_ns: u64,
    /// Test hook: verify that each completion enters every hop through the link its
    /// command left by (ISR symmetry).
    pub trace_paths: bool,
    pub path_checks: u64,
    pub path_mismatches: u64,
    cand: [u32; 64],
    /// NVMe/TCP connection directions, indexed by `tcp_ix` (host, storage node, direction):
    /// one flat table, so a PDU costs one lookup.
    tcp: Vec<TcpDir>,
    /// Bytes still counted in a send window when their I/O left (always 0; tests read it).
    pub tcp_leaked_bytes: u64,
    /// Per I/O slot: the generation its next I/O starts at.
    slot_gen: Vec<u16>,
    /// Switched fabric (ToR or leaf-spine): parallel links are LAGs hashed per flow.
    switched: bool,
}

impl Sim {
    pub fn new(cfg: SimConfig) -> Result<Self> {
        let g = topo::build(&cfg.topology)?;
        anyhow::ensure!(!g.hosts.is_empty(), "need at least one host");
        let mut rng = Rng::new(cfg.seed);
        let ssds = build_ssds(&cfg, &g)?;
        let ssd_bytes = ssds[0].ssd.logical_bytes();
        // One shared buffer per switch; adapters and hosts keep private port buffers.
        let mut pool_of_node = vec![NO_POOL; g.n()];
        let mut pools = Vec::new();
        for (n, k) in g.kinds.iter().enumerate() {
            if *k == NodeKind::Switch {
                pool_of_node[n] = pools.len() as u32;
                pools.push(SharedBuffer::new(
                    cfg.topology.switch_buffer_bytes,
                    cfg.topology.switch_dt_alpha_log2,
                ));
            }
        }
        let ports = g
            .ports
            .iter()
            .map(|p| PortQ {
                pool: pool_of_node[p.node as usize],
                q: Default::default(),
                bytes: 0,
                busy_until: 0,
                tx_pending: false,
                tx_bytes: 0,
                resv: PortReservation::new(
                    p.bits_per_s / 8,
                    cfg.reserve.burst_bytes,
                    cfg.reserve.max_reserved_permille,
                ),
            })
            .collect();
        // Storage nodes are numbered first, so a storage node's id is its target index.
        let n_targets = g.storage.len();
        let isr = (0..g.n())
            .map(|u| {
                // Multi-port clients choose their port per I/O like any node (ISR at the
                // end host); single-port ones have nothing to choose.
                let multi = g.node_ports[u].len() > 1;
                (cfg.mechanisms.isr && multi)
                    .then(|| IsrTable::new(cfg.isr.clone(), n_targets, g.node_ports[u].len()))
            })
            .collect();
        let (payload_max, tcp) = tcp_table(&cfg, g.hosts.len(), n_targets)?;
        let mut hosts = Vec::new();
        for (hi, &node) in g.hosts.iter().enumerate() {
            let c = Cluster {
                n_ssds: ssds.len() as u32,
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
        let _ = rng.next_u64();
        let metrics = Metrics::new(&cfg, g.ports.len());
        let (n_ports, n_failures) = (g.ports.len(), cfg.failures.len());
        Ok(Sim {
            payload_max,
            retry_ns: 1_000_000,
            trace_paths: false,
            path_checks: 0,
            path_mismatches: 0,
            g,
            q: EventQueue::new(),
            rng,
            ports,
            pkts: Slab::new(1 << 26),
            ios: Slab::new(1 << 24),
            ssds,
            hosts,
            isr,
            link_dead: vec![false; n_ports],
            pools,
            failed_ports: vec![Vec::new(); n_failures],
            metrics,
            cand: [0; 64],
            tcp,
            tcp_leaked_bytes: 0,
            slot_gen: Vec::new(),
            switched: matches!(
                cfg.topology.kind,
                TopologyKind::Tor | TopologyKind::LeafSpine
            ),
            cfg,
        })
    }

    pub fn n_ssds(&self) -> usize {
        self.ssds.len()
    }

    /// Schedule the workloads and failures.
    pub fn start(&mut self) {
        for h in 0..self.hosts.len() {
            for j in 0..self.hosts[h].jobs.len() {
                let Some(gen) = self.hosts[h].jobs[j].as_ref() else {
                    continue;
                };
                let qd = gen.qd();
                if qd > 0 {
                    for ctx in 0..qd {
                        let spec = self.hosts[h].jobs[j]
                            .as_mut()
                            .unwrap()
                            .first(ctx, &mut self.rng);
                        self.issue_when_ready(h as u32, j as u16, spec, 0);
                    }
                } else {
                    self.schedule_arrival(h as u32, j as u16, 0);
                }
            }
        }
        for (i, f) in self.cfg.failures.clone().iter().enumerate() {
            self.q.push(f.at_ns, EV_FAIL, i as u32);
        }
    }

    fn schedule_arrival(&mut self, h: u32, j: u16, now: u64) {
        // Pending open-loop arrivals live in the host's job; encode (host, job) in the event.
        let gen = self.hosts[h as usize].jobs[j as usize]
            .as_mut()
            .expect("arrival for a job the host does not run");
        if let Some((t, spec)) = gen.next_arrival(now, &mut self.rng) {
            let io = self.alloc_io(h, j, spec, t);
            self.q.push(t, EV_HOST_ARRIVAL, io);
        }
    }

    /// Run until `until_ns` (or the queue empties); `tick` is called every ~2^16 events.
    pub fn run_until(&mut self, until_ns: u64, mut tick: impl FnMut(u64)) {
        while let Some(e) = self.q.pop_until(until_ns) {
            if self.q.processed & 0xFFFF == 0 {
                tick(e.t);
            }
            match e.kind {
                EV_ARRIVE => self.on_arrive(e.a),
                EV_TXDONE => self.on_txdone(e.a),
                EV_SSD_DONE => self.on_ssd_done(e.a),
                EV_HOST_ARRIVAL => self.on_host_arrival(e.a),
                EV_ADMIT => {
                    let n = self.ssds.len() as u32;
                    self.drain_limiter(e.a / n, e.a % n)
                }
                EV_SCHED_WAKE => {
                    self.ssds[e.a as usize].drv.timer_fired();
                    self.pump(e.a)
                }
                EV_FAIL => self.on_fail(e.a as usize),
                EV_FAIL_DETECT => self.on_fail_detected(e.a as usize),
                EV_FAIL_CONVERGE => self.g.compute_routes(),
                EV_RETRY => self.on_retry(e.a),
                EV_ACK => {
                    self.tcp[e.a as usize].timer_armed = false;
                    self.tcp_pump(e.a as usize);
                }
                EV_ISSUE => {
                    self.metrics.on_start(e.t);
                    self.admit(e.a)
                }
                k => unreachable!("event kind {k}"),
            }
        }
        self.q.now = self
            .q
            .now
            .max(until_ns.min(self.q.peek_t().unwrap_or(until_ns)));
    }

    // ---------------------------------------------------------------- hosts

    fn alloc_io(&mut self, host: u32, job: u16, spec: IoSpec, now: u64) -> u32 {
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

    fn new_io(&mut self, host: u32, job: u16, spec: IoSpec, now: u64) {
        let io = self.alloc_io(host, job, spec, now);
        self.metrics.on_start(now);
        self.admit(io);
    }

    /// Closed loop: issue now, or at the time the generator's client CPU lets it.
    fn issue_when_ready(&mut self, host: u32, job: u16, spec: IoSpec, now: u64) {
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

    fn on_host_arrival(&mut self, io: u32) {
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
    fn admit(&mut self, io: u32) {
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
    fn drain_limiter(&mut self, host: u32, ssd: u32) {
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

    fn send_command(&mut self, io: u32) {
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
    fn send_fwd(&mut self, io: u32, gen: u16, rank: u8, hport: u32, bytes: u32, marker: bool) {
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
    fn send_write_data(&mut self, io: u32) {
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
    fn end_host_port(&mut self, io: u32) -> Option<u32> {
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
    fn end_host_done(&mut self, io: u32, done: bool) {
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

    fn host_complete(&mut self, io: u32) {
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

    fn finish_io_without_completion(&mut self, io: u32) {
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

    fn release_grants(&mut self, io: u32) {
        let o = self.ios.get_mut(io);
        let n = o.n_grants as usize;
        let grants = o.grants;
        o.n_grants = 0;
        for &(p, r) in &grants[..n] {
            self.ports[p as usize].resv.release(r);
        }
    }

    // ---------------------------------------------------------------- NVMe/TCP

    /// Hand a PDU of `io` to its connection direction: it leaves now if the send
    /// window lets it and nothing waits ahead of it; otherwise it waits in order.
    fn tcp_send(&mut self, io: u32, msg: Msg) {
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
    fn tcp_ix(&self, io: u32, d: usize) -> usize {
        let o = self.ios.get(io);
        (o.host as usize * self.g.storage.len() + o.target_node as usize) * 2 + d
    }

    /// The PDU leaves: `bytes` join its direction's flight (0 with windows off) as PDU `seq`.
    fn transmit(&mut self, io: u32, msg: Msg, bytes: u32, seq: u64) {
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
    fn tcp_pump(&mut self, ix: usize) {
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
    fn arm_ack_timer(&mut self, ix: usize) {
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
    fn tcp_delivered(&mut self, io: u32, d: usize) {
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
    fn rack_detect(&mut self, ix: usize, io: u32, d: usize, ack_at: u64) {
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
    fn tcp_timeout(&mut self, io: u32) {
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

    /// An I/O leaves with none of its bytes in a send window: each was acked, or left the
    /// flight at its loss (counted, not only asserted, so a test can check release builds).
    /// Its slot's next I/O starts at the next generation.
    fn free_io(&mut self, io: u32) {
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

    /// Bytes of a PDU in TCP's sequence space (headers and data, no framing). A write up
    /// to the in-capsule limit is one CapsuleCmd with its data and one CapsuleResp; a
    /// larger one is a bare CapsuleCmd, an R2T, H2CData and a CapsuleResp.
    fn msg_bytes(&self, io: u32, msg: Msg) -> u32 {
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
    fn ack_delay_ns(&self, io: u32) -> u64 {
        let hdr = &self.ios.get(io).hdr;
        let hops = &hdr.hops[..hdr.n_hops as usize];
        let mut t = hops.len() as u64 * self.cfg.topology.prop_ns;
        for rec in hops.iter().skip(1) {
            t += self.forwarding_ns(rec.node, io);
        }
        t
    }

    // ---------------------------------------------------------------- fabric

    fn local_of(&self, node: u32, port: u32) -> u8 {
        self.g.node_ports[node as usize]
            .iter()
            .position(|&p| p == port)
            .expect("port not on node") as u8
    }

    fn qdelay_ns(&self, port: u32) -> u64 {
        let bytes = self.ports[port as usize].bytes;
        let backlog = self.ports[port as usize]
            .busy_until
            .saturating_sub(self.q.now);
        backlog + bytes * 8_000_000_000 / self.g.ports[port as usize].bits_per_s
    }

    /// Choose the egress of `node` toward `dest`: ISR (least congested) or per-flow ECMP.
    fn route(&mut self, node: u32, dest: u32, io: u32) -> Option<u32> {
        let mut cand = self.cand;
        let k = self.g.candidates(node, dest, &mut cand);
        if k == 0 {
            return None;
        }
        if k == 1 {
            return Some(cand[0]);
        }
        let now = self.q.now;
        // ISR tables are kept per target storage node; routes toward hosts use ECMP.
        let to_storage = (dest as usize) < self.g.storage.len();
        // A team of parallel links to one switch is a LAG (NIC teaming, IEEE 802.1AX):
        // it hashes each flow onto one member, so no I/O of a flow picks its own link.
        let lag = self.switched && self.same_peer(&cand[..k]);
        if let (true, false, Some(t)) = (to_storage, lag, &self.isr[node as usize]) {
            let mut locals = [0u8; 64];
            for (i, &p) in cand[..k].iter().enumerate() {
                locals[i] = self.local_of(node, p);
            }
            let ports = &self.g.node_ports[node as usize];
            let tie = self.rng.next_u64();
            let pick = t.choose(
                dest,
                &locals[..k],
                |lp| self.qdelay_ns(ports[lp as usize]),
                now,
                tie,
            );
            return Some(ports[pick as usize]);
        }
        // ECMP: hash of the flow (host, SSD) and the node, fixed for the flow's life.
        let o = self.ios.get(io);
        let h = mix64((o.host as u64) << 32 | o.spec.ssd as u64 ^ (node as u64) << 48);
        Some(cand[(h % k as u64) as usize])
    }

    /// Do all these ports lead to the same node (parallel links, a team)?
    fn same_peer(&self, ports: &[u32]) -> bool {
        let first = self.g.peer_node(ports[0]);
        ports[1..].iter().all(|&p| self.g.peer_node(p) == first)
    }

    fn enqueue(&mut self, p: u32, port: u32) {
        let now = self.q.now;
        if self.link_dead[port as usize] {
            self.drop_packet(p);
            return;
        }
        let bytes = self.pkts.get(p).wire_bytes as u64;
        let class = self.classify(p, port);
        let pq = &mut self.ports[port as usize];
        let fits = match pq.pool {
            NO_POOL => pq.bytes + bytes <= self.cfg.topology.queue_bytes,
            i => self.pools[i as usize].admits(pq.bytes, bytes),
        };
        if !fits {
            self.metrics.drops += 1;
            self.drop_packet(p);
            return;
        }
        {
            let pk = self.pkts.get_mut(p);
            pk.enq_ns = now;
            pk.via = port;
            pk.class = class;
        }
        let idle = !pq.tx_pending && pq.busy_until <= now && pq.bytes == 0;
        if idle {
            self.start_tx(p, port);
            return;
        }
        pq.q[class as usize].push_back(p);
        pq.bytes += bytes;
        if pq.pool != NO_POOL {
            self.pools[pq.pool as usize].add(bytes);
        }
        if !pq.tx_pending {
            pq.tx_pending = true;
            let t = pq.busy_until.max(now);
            self.q.push(t, EV_TXDONE, port);
        }
    }

    fn classify(&mut self, p: u32, port: u32) -> u8 {
        let now = self.q.now;
        let pk = *self.pkts.get(p);
        let rank = self.ios.get(pk.io).rank;
        let base = if self.cfg.mechanisms.credits {
            1 + rank
        } else {
            1
        };
        if !self.cfg.mechanisms.reservation || pk.kind != PktKind::Rev {
            return base;
        }
        let op = self.ios.get(pk.io).spec.op;
        // Write completions are tiny and always go first (Q_wcpl).
        if op == IoDir::Write {
            return 0;
        }
        if self.ports[port as usize]
            .resv
            .conform(pk.wire_bytes as u64, now)
        {
            0
        } else {
            base
        }
    }

    fn start_tx(&mut self, p: u32, port: u32) {
        let now = self.q.now;
        let pk = *self.pkts.get(p);
        let info = &self.g.ports[port as usize];
        let ser = (pk.wire_bytes as u64 * 8_000_000_000).div_ceil(info.bits_per_s);
        let node = info.node;
        let fwd_ns = self.forwarding_ns(node, pk.io);
        let arrive = now + ser + info.prop_ns + fwd_ns;
        let pq = &mut self.ports[port as usize];
        pq.busy_until = now + ser;
        if now >= self.cfg.warmup_ns {
            pq.tx_bytes += pk.wire_bytes as u64;
        }
        self.record_qdelay(&pk, node, now.saturating_sub(pk.enq_ns), port);
        self.q.push(arrive, EV_ARRIVE, p);
    }

    /// Forwarding latency charged when `node` passes a packet on (not at its endpoints).
    fn forwarding_ns(&self, node: u32, io: u32) -> u64 {
        match self.g.kinds[node as usize] {
            NodeKind::Switch => self.cfg.topology.switch_hop_ns,
            NodeKind::Host => 0,
            NodeKind::Storage => {
                // The paper's 2.9 µs ([NSDI'26], second-hand) is per extra hop of a whole
                // I/O (command and response), so each direction pays half.
                if self.ios.get(io).target_node == node {
                    0
                } else {
                    self.cfg.topology.adapter_hop_ns / 2
                }
            }
        }
    }

    /// The ISR header records queueing per hop (command and completion packets only).
    fn record_qdelay(&mut self, pk: &Packet, node: u32, qdelay: u64, port: u32) {
        if !pk.marker || pk.gen != self.ios.get(pk.io).gen {
            return;
        }
        let ecn = self.ports[port as usize].bytes > self.cfg.isr.ecn_threshold_bytes;
        let o = self.ios.get_mut(pk.io);
        let q = qdelay.min(u32::MAX as u64) as u32;
        match pk.kind {
            PktKind::Fwd => {
                let i = pk.hop as usize - 1;
                if i < o.hdr.n_hops as usize && o.hdr.hops[i].node == node {
                    o.hdr.hops[i].qdelay_ns = q;
                    o.hdr.hops[i].ecn |= ecn;
                }
            }
            PktKind::Rev => {
                let i = pk.hop as usize + 1;
                if pk.hop != NO_PORT && i < o.hdr.n_hops as usize && o.hdr.hops[i].node == node {
                    o.hdr.hops[i].rev_qdelay_ns = q;
                } else if pk.hop != NO_PORT && i == o.hdr.n_hops as usize && node == o.target_node {
                    // The target's own egress: no hop record of its own.
                    o.hdr.target_rev_qdelay_ns = q;
                }
            }
        }
    }

    fn on_txdone(&mut self, port: u32) {
        let pq = &mut self.ports[port as usize];
        pq.tx_pending = false;
        let Some(p) = pq.q.iter_mut().find_map(|q| q.pop_front()) else {
            return;
        };
        let bytes = self.pkts.get(p).wire_bytes as u64;
        pq.bytes -= bytes;
        if pq.pool != NO_POOL {
            self.pools[pq.pool as usize].remove(bytes);
        }
        self.start_tx(p, port);
        let pq = &mut self.ports[port as usize];
        if pq.bytes > 0 {
            pq.tx_pending = true;
            let t = pq.busy_until;
            self.q.push(t, EV_TXDONE, port);
        }
    }

    fn on_arrive(&mut self, p: u32) {
        let pk = *self.pkts.get(p);
        let stale = pk.gen != self.ios.get(pk.io).gen || self.ios.get(pk.io).lost;
        if stale {
            self.pkts.remove(p);
            return;
        }
        if self.link_dead[pk.via as usize] {
            // The link failed while the packet was on the wire.
            self.drop_packet(p);
            return;
        }
        match pk.kind {
            PktKind::Fwd => self.arrive_fwd(p, pk),
            PktKind::Rev => self.arrive_rev(p, pk),
        }
    }

    fn arrive_fwd(&mut self, p: u32, pk: Packet) {
        let node = pk.to;
        let in_port = self.g.ports[pk.via as usize].peer;
        let target = self.ios.get(pk.io).target_node;
        if node == target {
            self.pkts.remove(p);
            let o = self.ios.get_mut(pk.io);
            o.target_in_port = in_port;
            o.fwd_arrived += 1;
            if o.fwd_arrived == o.fwd_expected {
                self.tcp_delivered(pk.io, UP);
                if pk.marker {
                    self.reserve_at(pk.io, in_port);
                }
                if self.ios.get(pk.io).r2t == R2t::Command {
                    self.ios.get_mut(pk.io).r2t = R2t::Await;
                    self.tcp_send(pk.io, Msg::R2t);
                } else {
                    self.ssd_enqueue(pk.io);
                }
            } else if pk.marker {
                self.reserve_at(pk.io, in_port);
            }
            return;
        }
        // Transit: the first packet of the I/O to reach hop `hop` decides; the rest follow.
        let hop = pk.hop as usize;
        let decided = self.ios.get(pk.io).hdr.n_hops as usize > hop;
        let out = if decided {
            let rec = self.ios.get(pk.io).hdr.hops[hop];
            if rec.node == node {
                Some(self.g.node_ports[node as usize][rec.out_port as usize])
            } else {
                self.route(node, target, pk.io)
            }
        } else {
            let out = self.route(node, target, pk.io);
            if let Some(o) = out {
                let rec = HopRec {
                    node,
                    in_port: self.local_of(node, in_port),
                    out_port: self.local_of(node, o),
                    ..Default::default()
                };
                self.ios.get_mut(pk.io).hdr.push(rec);
                if pk.marker {
                    self.reserve_at(pk.io, in_port);
                }
            }
            out
        };
        let Some(out) = out else {
            self.drop_packet(p);
            return;
        };
        let nxt = self.g.peer_node(out);
        let pkm = self.pkts.get_mut(p);
        pkm.hop += 1;
        pkm.to = nxt;
        self.enqueue(p, out);
    }

    /// Eager reservation: bandwidth for the response on the reverse egress (`in_port`).
    fn reserve_at(&mut self, io: u32, in_port: u32) {
        if !self.cfg.mechanisms.reservation {
            return;
        }
        let (op, size, n) = {
            let o = self.ios.get(io);
            (o.spec.op, o.spec.size_bytes, o.n_grants)
        };
        if n as usize >= 8 || op == IoDir::Write {
            // Write completions are tiny: they use the priority queue, not a reservation.
            return;
        }
        let r = self.cfg.reserve.reservation_bytes_per_s(IoDir::Read, size);
        let granted = self.ports[in_port as usize].resv.reserve(r);
        let o = self.ios.get_mut(io);
        o.grants[n as usize] = (in_port, granted);
        o.n_grants += 1;
    }

    fn arrive_rev(&mut self, p: u32, pk: Packet) {
        let node = pk.to;
        let (host_node, target, n_hops) = {
            let o = self.ios.get(pk.io);
            (
                self.hosts[o.host as usize].node,
                o.target_node,
                o.hdr.n_hops,
            )
        };
        if node == host_node {
            self.pkts.remove(p);
            if self.ios.get(pk.io).r2t == R2t::Await {
                self.tcp_delivered(pk.io, DOWN);
                self.tcp_send(pk.io, Msg::WriteData);
                return;
            }
            if pk.marker && n_hops > 0 && self.isr[node as usize].is_some() {
                // ISR at the end host: the completion's telemetry updates the client's table.
                self.isr_learn(pk.io, 0, target);
            }
            let o = self.ios.get_mut(pk.io);
            o.rev_arrived += 1;
            if o.rev_arrived == o.rev_expected {
                self.tcp_delivered(pk.io, DOWN);
                self.host_complete(pk.io);
            }
            return;
        }
        let symmetric = pk.hop != NO_PORT && (pk.hop as usize) < n_hops as usize;
        if self.trace_paths && pk.marker {
            self.check_symmetry(&pk, node);
        }
        let mut out = None;
        if symmetric {
            let rec = self.ios.get(pk.io).hdr.hops[pk.hop as usize];
            if rec.node == node && rec.in_port != NO_PORT {
                let port = self.g.node_ports[node as usize][rec.in_port as usize];
                if self.g.port_up[port as usize] {
                    out = Some(port);
                }
                if pk.marker {
                    self.isr_learn(pk.io, pk.hop as usize, target);
                }
            }
        }
        let routed = out.is_none();
        let out = match out {
            Some(o) => Some(o),
            None => self.route(node, host_node, pk.io),
        };
        let Some(out) = out else {
            self.drop_packet(p);
            return;
        };
        let nxt = self.g.peer_node(out);
        let pkm = self.pkts.get_mut(p);
        pkm.hop = if routed || pkm.hop == 0 {
            NO_PORT
        } else {
            pkm.hop - 1
        };
        pkm.to = nxt;
        self.enqueue(p, out);
    }

    fn check_symmetry(&mut self, pk: &Packet, node: u32) {
        self.path_checks += 1;
        let o = self.ios.get(pk.io);
        if pk.hop == NO_PORT || pk.hop >= o.hdr.n_hops {
            self.path_mismatches += 1;
            return;
        }
        let rec = o.hdr.hops[pk.hop as usize];
        let entered_by = self.g.ports[pk.via as usize].peer;
        let left_by = self.g.node_ports[node as usize][rec.out_port as usize];
        if rec.node != node || entered_by != left_by {
            self.path_mismatches += 1;
        }
    }

    /// The completion passes hop `h`: update that node's telemetry toward the target.
    fn isr_learn(&mut self, io: u32, h: usize, target: u32) {
        let now = self.q.now;
        let o = self.ios.get(io);
        let rec = o.hdr.hops[h];
        let (d, ecn) = o.hdr.downstream(h);
        if let Some(t) = self.isr[rec.node as usize].as_mut() {
            t.update(target, rec.out_port, d, ecn, now);
        }
    }

    fn drop_packet(&mut self, p: u32) {
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
    fn lose_io(&mut self, io: u32, gen: u16, d: usize) {
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

    fn on_retry(&mut self, io: u32) {
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

    /// The link (or node) dies now; the nodes next to it notice only after the
    /// detection delay, and the other nodes after convergence on top of that.
    fn on_fail(&mut self, i: usize) {
        let f = self.cfg.failures[i].clone();
        let mut down = Vec::new();
        match f.what.as_str() {
            "node" => {
                let node = self.g.storage[f.a as usize];
                down.extend(self.g.node_ports[node as usize].iter().copied());
                for s in self.ssds.iter_mut().filter(|s| s.node == node) {
                    s.alive = false;
                }
            }
            _ => {
                let a = self.g.storage[f.a as usize];
                let port = match f.b {
                    Some(b) => self.g.port_between(a, self.g.storage[b as usize]),
                    None => self.busiest_fabric_port(a),
                };
                down.extend(port);
            }
        }
        for &p in &down {
            let peer = self.g.ports[p as usize].peer;
            for port in [p, peer] {
                self.link_dead[port as usize] = true;
                let pq = &mut self.ports[port as usize];
                if pq.pool != NO_POOL {
                    self.pools[pq.pool as usize].remove(pq.bytes);
                }
                pq.bytes = 0;
                let queued: Vec<u32> = pq.q.iter_mut().flat_map(|q| q.drain(..)).collect();
                for pk in queued {
                    self.drop_packet(pk);
                }
            }
        }
        self.failed_ports[i] = down;
        self.q.push(f.at_ns + f.detect_ns, EV_FAIL_DETECT, i as u32);
        self.metrics.failure_at_ns = Some(f.at_ns);
    }

    /// Detection: the two ends stop offering the port as a next hop (local repair: ISR
    /// and ECMP choose among the remaining productive ports); global tables follow later.
    fn on_fail_detected(&mut self, i: usize) {
        for p in std::mem::take(&mut self.failed_ports[i]) {
            self.g.fail_port(p);
        }
        let f = &self.cfg.failures[i];
        let t = f.at_ns + f.detect_ns + f.converge_ns;
        self.q.push(t, EV_FAIL_CONVERGE, i as u32);
    }

    /// The storage-to-storage port of `node` that has sent the most bytes so far (lowest
    /// index on ties): failing it hits the traffic a real failure would, not an idle link.
    fn busiest_fabric_port(&self, node: u32) -> Option<u32> {
        self.g.node_ports[node as usize]
            .iter()
            .copied()
            .filter(|&p| self.g.kinds[self.g.peer_node(p) as usize] == NodeKind::Storage)
            .max_by_key(|&p| (self.ports[p as usize].tx_bytes, std::cmp::Reverse(p)))
    }

    // ---------------------------------------------------------------- targets

    /// The scheduler tenant of a host: the host index, folded into the tenant table.
    fn tenant_of(&self, host: u32) -> TenantId {
        (host % self.cfg.sched.max_tenants as u32) as TenantId
    }

    /// The command has fully arrived at its target: offer it to the SSD's scheduler.
    fn ssd_enqueue(&mut self, io: u32) {
        let now = self.q.now;
        let (ssd, host, op, size, gen) = {
            let o = self.ios.get(io);
            (o.spec.ssd, o.host, o.spec.op, o.spec.size_bytes, o.gen)
        };
        let tenant = self.tenant_of(host);
        let req = Request {
            tenant,
            dir: op,
            len_bytes: size,
            payload: IoRef { io, gen },
        };
        match self.ssds[ssd as usize].drv.submit(req, now) {
            Ok(Submit::Run(slot)) => self.dispatch(ssd, slot, io),
            Ok(Submit::Held) => {}
            Ok(Submit::Busy) => {
                // A bound is full: the target answers "busy, retry" and the host resends
                // the command after the retry timeout [R].
                self.metrics.sched_busy += 1;
                self.ios.get_mut(io).retry_at_ns = now + self.retry_ns;
                self.q.push(now + self.retry_ns, EV_RETRY, io);
                return;
            }
            Err(e) => unreachable!("tenant {tenant} is inside the table: {e:?}"),
        }
        self.pump(ssd);
    }

    /// Send to the device what the scheduler releases; arm its timer if it holds back.
    fn pump(&mut self, ssd: u32) {
        let now = self.q.now;
        while let Some(r) = self.ssds[ssd as usize].drv.release(now) {
            self.dispatch(ssd, r.slot, r.req.payload.io);
        }
        if let Some(t) = self.ssds[ssd as usize].drv.arm_timer() {
            self.q.push(t, EV_SCHED_WAKE, ssd);
        }
    }

    /// Send I/O `io`, in driver slot `slot`, to the SSD now.
    fn dispatch(&mut self, ssd: u32, slot: usize, io: u32) {
        let now = self.q.now;
        let spec = self.ios.get(io).spec;
        let done =
            self.ssds[ssd as usize]
                .ssd
                .submit(spec.op, spec.offset_bytes, spec.size_bytes, now);
        self.q.push(done, EV_SSD_DONE, ssd << 20 | slot as u32);
    }

    fn on_ssd_done(&mut self, a: u32) {
        let now = self.q.now;
        let (ssd, slot) = (a >> 20, (a & 0xF_FFFF) as usize);
        let s = &mut self.ssds[ssd as usize];
        let done = s
            .drv
            .complete(slot, now, now)
            .expect("the SSD completes each dispatched command once");
        let headroom = s.drv.scheduler().headroom_bytes_per_s();
        let (IoRef { io, gen }, lat) = (done.req.payload, done.device_latency_ns);
        let o = self.ios.get(io);
        if o.gen == gen && !o.lost {
            let o = self.ios.get_mut(io);
            o.headroom_bytes_per_s = headroom;
            o.ssd_latency_ns = lat;
            o.hdr.ssd_latency_ns = lat;
            self.tcp_send(io, Msg::Response);
        }
        self.pump(ssd);
    }

    fn send_response(&mut self, io: u32) {
        // After an R2T, which went back on its own, the rest of the response.
        let total = self.msg_bytes(io, Msg::Response);
        self.send_rev(io, total);
    }

    /// Send `total` bytes target -> host: the completion (its last packet carries the
    /// marker), or an R2T, which travels the same way.
    fn send_rev(&mut self, io: u32, total: u32) {
        let (gen, in_port, n_hops, rank) = {
            let o = self.ios.get(io);
            (o.gen, o.target_in_port, o.hdr.n_hops, o.rank)
        };
        let is_r2t = self.ios.get(io).r2t == R2t::Await;
        let n = total.div_ceil(self.payload_max);
        if !is_r2t {
            self.ios.get_mut(io).rev_expected = n as u16;
        }
        let symmetric = self.cfg.mechanisms.isr;
        let target = self.ios.get(io).target_node;
        let host_node = self.hosts[self.ios.get(io).host as usize].node;
        let out = if symmetric && self.g.port_up[in_port as usize] {
            Some(in_port)
        } else {
            self.route(target, host_node, io)
        };
        let mut left = total;
        for i in 0..n {
            let payload = left.min(self.payload_max);
            left -= payload;
            let Some(out) = out else {
                // No route back (a failure not yet converged): the host times out.
                self.lose_io(io, gen, DOWN);
                return;
            };
            let p = self.pkts.insert(Packet {
                io,
                gen,
                kind: PktKind::Rev,
                marker: i + 1 == n && !is_r2t,
                wire_bytes: payload + self.cfg.topology.frame_overhead_bytes,
                hop: if symmetric && out == in_port {
                    n_hops - 1
                } else {
                    NO_PORT
                },
                to: self.g.peer_node(out),
                via: out,
                enq_ns: 0,
                class: 1 + rank,
            });
            self.enqueue(p, out);
        }
    }

    // ---------------------------------------------------------------- reporting

    pub fn port_tx_bytes(&self) -> Vec<u64> {
        self.ports.iter().map(|p| p.tx_bytes).collect()
    }

    pub fn ycsb_stats(&self) -> (u64, Vec<u64>) {
        let mut ops = 0;
        let mut lat = Vec::new();
        for h in &self.hosts {
            for j in h.jobs.iter().flatten() {
                if let Some(y) = j.ycsb() {
                    ops += y.kv_ops;
                    lat.extend_from_slice(&y.kv_read_lat);
                }
            }
        }
        (ops, lat)
    }

    pub fn live_ios(&self) -> usize {
        self.ios.live()
    }

    pub fn is_switched(&self) -> bool {
        matches!(
            self.cfg.topology.kind,
            TopologyKind::Tor | TopologyKind::LeafSpine
        )
    }

    pub fn ssd_stats(&self) -> Vec<trellis_ssd::SsdStats> {
        self.ssds.iter().map(|s| s.ssd.stats()).collect()
    }
}

/// Most connection directions a run may hold (160 B each: 2.7 GB), so a huge cluster
/// fails with an error naming the fix instead of an allocation abort.
const MAX_TCP_DIRS: u64 = 1 << 24;

/// Checks the transport settings; returns the segment payload and, with windows on, one
/// send window per (host, storage node, direction) (empty with `tcp_window = false`).
fn tcp_table(cfg: &SimConfig, hosts: usize, targets: usize) -> Result<(u32, Vec<TcpDir>)> {
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

/// One SSD model and one scheduler (the shared core) per SSD of every storage node.
fn build_ssds(cfg: &SimConfig, g: &Graph) -> Result<Vec<SsdSlot>> {
    let profile = cfg.ssd.profile()?;
    let sched_cfg = SchedConfig {
        policy: if cfg.mechanisms.gimbal {
            Policy::Gimbal
        } else {
            Policy::Fifo
        },
        limits: cfg.sched.clone(),
        device_qd: cfg.ssd.device_qd,
        gimbal: cfg.gimbal_for(&profile),
    };
    // Device events carry (SSD, tag index) in 12 + 20 bits.
    anyhow::ensure!(
        cfg.sched.max_requests <= 1 << 20,
        "sched.max_requests above 2^20"
    );
    let mut ssds = Vec::new();
    for (i, &node) in g.storage.iter().enumerate() {
        for k in 0..cfg.ssd.per_node {
            let mut ssd = Ssd::new(profile.clone());
            ssd.precondition(
                cfg.ssd.precondition,
                cfg.seed ^ ((i as u64) << 16 | k as u64),
            );
            ssds.push(SsdSlot {
                ssd,
                node,
                drv: Driver::build(&sched_cfg, 0).map_err(anyhow::Error::msg)?,
                alive: true,
            });
        }
    }
    anyhow::ensure!(!ssds.is_empty(), "need at least one SSD");
    anyhow::ensure!(
        ssds.len() <= 1 << 12,
        "device events index at most 4096 SSDs"
    );
    Ok(ssds)
}

/// The splitmix64 output function applied to `z` (a stateless hash for
/// ECMP): SplitMix64 adds its increment before mixing, so start one below.
fn mix64(z: u64) -> u64 {
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    SplitMix64::seed_from_u64(z.wrapping_sub(GOLDEN)).next_u64()
}

#[cfg(test)]
mod mix_tests {
    /// ECMP choices in recorded results depend on this hash: it must stay
    /// the former hand-written splitmix64 finalizer.
    #[test]
    fn mix64_is_the_splitmix64_finalizer() {
        let former = |mut z: u64| {
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        for z in [0u64, 1, 42, 1 << 32 | 7, u64::MAX, 0x9E37_79B9_7F4A_7C15] {
            assert_eq!(super::mix64(z), former(z), "{z:#x}");
        }
    }
}

#[cfg(test)]
mod slot_tests {
    use super::*;

    /// A freed I/O slot is reused at once (the free list is last in, first out): the new
    /// I/O must start at a later generation, or a packet of the earlier I/O (one of a
    /// lost attempt, still queued somewhere) would be taken for one of the new I/O's.
    #[test]
    fn a_reused_io_slot_starts_at_the_next_generation() {
        let mut sim = Sim::new(SimConfig::default()).unwrap();
        let spec = IoSpec {
            ssd: 0,
            op: IoDir::Read,
            size_bytes: 4096,
            offset_bytes: 0,
            ctx: 0,
        };
        let a = sim.alloc_io(0, 0, spec, 0);
        sim.ios.get_mut(a).gen = 7; // resent 7 times
        sim.free_io(a);
        let b = sim.alloc_io(0, 0, spec, 0);
        assert_eq!(a, b, "the slot is reused");
        assert_eq!(sim.ios.get(b).gen, 8);
    }

    /// PDU sizes as NVMe/TCP puts them on the wire (no digests): CapsuleCmd 72 B (+ data
    /// in the capsule), C2HData / H2CData / R2T / CapsuleResp headers 24 B.
    #[test]
    fn pdu_sizes_follow_nvme_tcp() {
        let mut sim = Sim::new(SimConfig::default()).unwrap();
        let mut size_of = |op: IoDir, size_bytes: u32, msg: Msg| {
            let spec = IoSpec {
                ssd: 0,
                op,
                size_bytes,
                offset_bytes: 0,
                ctx: 0,
            };
            let io = sim.alloc_io(0, 0, spec, 0);
            let b = sim.msg_bytes(io, msg);
            sim.free_io(io);
            b
        };
        assert_eq!(size_of(IoDir::Read, 4096, Msg::Command), 72);
        assert_eq!(size_of(IoDir::Read, 4096, Msg::Response), 24 + 4096 + 24);
        // In-capsule (16 KiB limit): one CapsuleCmd with the data, one CapsuleResp.
        assert_eq!(size_of(IoDir::Write, 4096, Msg::Command), 72 + 4096);
        assert_eq!(size_of(IoDir::Write, 4096, Msg::Response), 24);
        // Beyond it: bare command, R2T, H2CData, CapsuleResp.
        assert_eq!(size_of(IoDir::Write, 65536, Msg::Command), 72);
        assert_eq!(size_of(IoDir::Write, 65536, Msg::R2t), 24);
        assert_eq!(size_of(IoDir::Write, 65536, Msg::WriteData), 24 + 65536);
        assert_eq!(size_of(IoDir::Write, 65536, Msg::Response), 24);
    }
}
