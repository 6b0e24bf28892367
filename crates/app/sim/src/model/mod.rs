//! The SAN model: hosts, fabric nodes, egress queues, targets with a scheduler and SSDs.
//!
//! Each SSD's queueing, dispatch and headroom belong to its `trellis_qos::sched`
//! scheduler (FIFO or Gimbal), the same core the storage node runs, driven by the
//! same `sched::Driver` (request rows, device latency, credits, timers); this model
//! only maps hosts to tenants and I/Os to the driver's payload.
//!
//! Per packet per hop there is one `Arrive` event, plus one `TxDone` only when the
//! egress was busy. Packets, I/Os and events are plain structs in slabs and a heap.
//!
//! This file holds the state (packets, I/Os, ports, connections, SSD slots,
//! hosts, the `Sim` itself), its construction and the event loop; each
//! mechanism's handlers are `impl Sim` blocks in their own file:
//!
//! | file | mechanism |
//! |---|---|
//! | `hosts.rs` | the client side of an I/O: generation, SSD-credit admission, command and write data out, end-host ISR, completion |
//! | `transport.rs` | NVMe/TCP: send windows, PDU sizes, ACK timing, loss, RACK and the RTO retry |
//! | `routing.rs` | the next hop at each node (ECMP, LAG, ISR) and forwarding of arriving packets |
//! | `egress.rs` | egress port queues: buffer admission, priority classes, reservation, serialisation |
//! | `storage.rs` | the targets: each SSD's scheduler and device, and the response back |
//! | `failures.rs` | link and node failures, their detection and route convergence |

mod egress;
mod failures;
mod hosts;
mod routing;
mod storage;
mod transport;

use egress::build_ports;
use hosts::build_hosts;
use routing::build_isr;
use storage::build_ssds;
use transport::tcp_table;

#[cfg(test)]
mod tests;

use crate::config::{SimConfig, TopologyKind};
use crate::engine::{EventQueue, Rng, Slab};
use crate::metrics::Metrics;
use crate::net::rto::RtoEstimator;
use crate::net::shared_buffer::SharedBuffer;
use crate::net::tcp_window::SendWindow;
use crate::topo::{self, Graph};
use crate::workload::{Gen, IoSpec};
use anyhow::Result;
use rustc_hash::FxBuildHasher;
use std::collections::{HashMap, VecDeque};
use trellis_fabric::isr::{IsrHeader, IsrTable};
use trellis_fabric::reserve::PortReservation;
use trellis_fabric::ssd_credit::HostRateLimiter;
use trellis_path::replica::{IsrPaths, MAX_PATHS};
use trellis_qos::sched::Driver;
use trellis_ssd::Ssd;

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
        let (ports, pools) = build_ports(&cfg, &g);
        // Storage nodes are numbered first, so a storage node's id is its target index.
        let n_targets = g.storage.len();
        let isr = build_isr(&cfg, &g, n_targets);
        let (payload_max, tcp) = tcp_table(&cfg, g.hosts.len(), n_targets)?;
        let hosts = build_hosts(&cfg, &g, ssds.len() as u32, ssd_bytes)?;
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
