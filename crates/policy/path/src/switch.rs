//! blk-switch on the compute node: the host's I/O stack built like a switch.
//!
//! Haecki et al., "Rearchitecting Linux Storage Stack for µs Latency and High
//! Throughput" (blk-switch, OSDI'21) and its artifact (`blk-switch.h`,
//! `blk-mq.c`, `tcp.c`). Every (core, class) has its own egress queue, as a
//! kernel host connected with `nvme connect -W <cores>` has one default and
//! one read queue set; the latency class (L-apps) is served strictly before
//! the throughput class (T-apps); throughput requests leave in i10 caravans
//! (a doorbell batch of up to 16 requests or 50 µs); request steering moves
//! single throughput requests off a core with a transient backlog, and
//! application steering moves whole apps between cores under persistent load.
//!
//! Sans-IO, like the target's scheduler core: the caller passes time in as
//! u64 ns and gets decisions out (which core's queue a request joins, which
//! request a core sends next, when to wake up). No socket, thread or clock
//! here: `trellis bench --stack blk-switch` drives it on the wall clock and
//! the tests on a simulated one. docs/host.md, "Class isolation (blk-switch)",
//! lists every rule with its source and where ours differs.

use std::collections::VecDeque;

/// Most cores one switch serves (`BLK_SWITCH_NR_CPUS` in the artifact).
pub const MAX_CORES: usize = 64;
/// Most applications one switch tracks.
pub const MAX_APPS: usize = 1024;
/// Most requests waiting in one (core, class) egress queue by default.
pub const EGRESS_DEPTH_DEFAULT: u32 = 4096;

/// Traffic class of an application (blk-switch: ioprio class RT makes an
/// L-app, anything else a T-app).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    Latency = 0,
    Throughput = 1,
}

impl Class {
    fn idx(self) -> usize {
        self as usize
    }
    fn other(self) -> Class {
        match self {
            Class::Latency => Class::Throughput,
            Class::Throughput => Class::Latency,
        }
    }
}

/// How much of blk-switch runs (`blk_switch_on`: 0, 1, 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Per-class queues with strict priority and i10 caravans only.
    Priority = 0,
    /// And request steering of throughput requests (transient load).
    RequestSteering = 1,
    /// And application steering (persistent load). The artifact's setting.
    AppSteering = 2,
}

/// Every threshold of the switch, named; defaults from the artifact
/// (algorithms §2, docs/host.md).
#[derive(Clone, Debug)]
pub struct SwitchConfig {
    pub cores: usize,
    pub level: Level,
    /// `blk_switch_thresh_B`: a core keeps its throughput requests local
    /// while it has at most 2 × this many in flight (artifact: 16, so 32).
    pub thresh_b: u32,
    /// A steering candidate has fewer than this many throughput requests in
    /// flight (TCP: 16).
    pub candidate_active_max: u32,
    /// i10 doorbell batch (`I10_AGGREGATION_SIZE`): a caravan leaves at once
    /// when this many throughput requests wait.
    pub batch_requests: u32,
    /// i10 delayed doorbell: the longest a throughput request waits for its
    /// caravan (50 µs; below 25 µs batching is off, as in i10).
    pub doorbell_delay_ns: u64,
    /// Bytes on the wire in one caravan (one sendmsg): 64 KiB.
    pub caravan_bytes_max: u32,
    /// `BLK_SWITCH_THRESH_L`: a core with more latency bytes outstanding than
    /// this takes no moved app (24 × 4 KiB).
    pub thresh_l_bytes: u64,
    /// `BLK_SWITCH_APPSTR_INTERVAL`: snapshot and turn period (10 ms).
    pub appstr_interval_ns: u64,
    /// `BLK_SWITCH_RESET_METRICS`: metrics reset after this long with no
    /// request (1 s).
    pub reset_ns: u64,
    /// Requests one (core, class) egress queue holds; beyond it `submit`
    /// says busy.
    pub egress_depth_max: u32,
    /// Seed of the coin flips (ties, power of two choices).
    pub seed: u64,
}

impl SwitchConfig {
    pub fn new(cores: usize) -> SwitchConfig {
        SwitchConfig {
            cores,
            level: Level::AppSteering,
            thresh_b: 16,
            candidate_active_max: 16,
            batch_requests: 16,
            doorbell_delay_ns: 50_000,
            caravan_bytes_max: 65_536,
            thresh_l_bytes: 98_304,
            appstr_interval_ns: 10_000_000,
            reset_ns: 1_000_000_000,
            egress_depth_max: EGRESS_DEPTH_DEFAULT,
            seed: 0x626c_6b2d_7377_6974,
        }
    }

    /// i10 turns batching off below a 25 µs doorbell.
    pub fn batching(&self) -> bool {
        self.doorbell_delay_ns >= 25_000 && self.batch_requests > 1
    }
}

/// Why a configuration or an app was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("blk-switch needs 1 to {MAX_CORES} cores, got {0}")]
    Cores(usize),
    #[error("core {core} does not exist (the switch has {cores})")]
    NoSuchCore { core: usize, cores: usize },
    #[error("at most {MAX_APPS} applications per switch")]
    TooManyApps,
    #[error("egress queues must hold at least one request (egress_depth_max = 0)")]
    EgressDepth,
}

/// The egress queue was full: retry after a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

pub type AppId = u16;

/// One request as the switch sees it; `tag` is the caller's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Req {
    pub app: AppId,
    pub class: Class,
    /// Data bytes (the per-core load statistics count these).
    pub io_bytes: u32,
    /// Bytes the request puts on the wire (command PDU, plus data for a
    /// write): what fills a caravan.
    pub wire_bytes: u32,
    pub tag: u64,
    /// The core the app lived on when this request was made.
    pub home: u16,
    /// Sent through another core's queue by request steering.
    pub steered: bool,
}

/// What a core should put on the wire next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Send {
    pub req: Req,
    /// Flush the queue after this one: the caravan is full or complete (a
    /// latency request is always flushed at once).
    pub flush: bool,
}

/// Counters for the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwitchStats {
    pub steered_requests: u64,
    pub app_moves: u64,
    pub caravans: u64,
    pub doorbell_timeouts: u64,
    pub busy: u64,
}

#[derive(Debug)]
struct CoreState {
    egress: [VecDeque<Req>; 2],
    /// Requests in flight through this core's queue of each class.
    active: [u32; 2],
    /// Outstanding bytes of the apps living here, not steered (`X_bytes`).
    bytes: [u64; 2],
    /// EWMA of `bytes + size` on each request (`X_metric`).
    metric: [u64; 2],
    /// `metric` at the last interval tick (`X_appstr`).
    snap: [u64; 2],
    /// Throughput requests that joined since the last caravan (`nr_req`).
    batch_reqs: u32,
    /// When the pending caravan must leave (the doorbell timer).
    doorbell_ns: Option<u64>,
    /// The pending caravan has been released: send until the queue is empty.
    releasing: bool,
    /// Wire bytes in the caravan being sent.
    caravan_bytes: u32,
}

#[derive(Clone, Copy, Debug)]
struct AppState {
    class: Class,
    core: u16,
}

/// The switch: all cores of one host.
#[derive(Debug)]
pub struct Switch {
    cfg: SwitchConfig,
    cores: Vec<CoreState>,
    apps: Vec<AppState>,
    /// Which class may move apps in this interval (toggled every tick).
    turn: Class,
    next_tick_ns: u64,
    /// One app move per interval: the snapshots do not change inside one.
    moved_this_interval: bool,
    last_req_ns: Option<u64>,
    rng: u64,
    pub stats: SwitchStats,
}

impl Switch {
    pub fn new(cfg: SwitchConfig) -> Result<Switch, ConfigError> {
        if cfg.cores == 0 || cfg.cores > MAX_CORES {
            return Err(ConfigError::Cores(cfg.cores));
        }
        if cfg.egress_depth_max == 0 {
            return Err(ConfigError::EgressDepth);
        }
        let depth = cfg.egress_depth_max as usize;
        let cores = (0..cfg.cores)
            .map(|_| CoreState {
                egress: [
                    VecDeque::with_capacity(depth),
                    VecDeque::with_capacity(depth),
                ],
                active: [0; 2],
                bytes: [0; 2],
                metric: [0; 2],
                snap: [0; 2],
                batch_reqs: 0,
                doorbell_ns: None,
                releasing: false,
                caravan_bytes: 0,
            })
            .collect();
        Ok(Switch {
            next_tick_ns: cfg.appstr_interval_ns,
            rng: cfg.seed | 1,
            cfg,
            cores,
            apps: Vec::new(),
            turn: Class::Throughput,
            moved_this_interval: false,
            last_req_ns: None,
            stats: SwitchStats::default(),
        })
    }

    pub fn config(&self) -> &SwitchConfig {
        &self.cfg
    }

    /// Registers an application of `class` living on `core`.
    pub fn add_app(&mut self, class: Class, core: usize) -> Result<AppId, ConfigError> {
        if core >= self.cores.len() {
            return Err(ConfigError::NoSuchCore {
                core,
                cores: self.cores.len(),
            });
        }
        if self.apps.len() >= MAX_APPS {
            return Err(ConfigError::TooManyApps);
        }
        self.apps.push(AppState {
            class,
            core: core as u16,
        });
        Ok((self.apps.len() - 1) as AppId)
    }

    /// The core an app lives on now (application steering may move it).
    pub fn app_core(&self, app: AppId) -> usize {
        self.apps[app as usize].core as usize
    }

    pub fn app_class(&self, app: AppId) -> Class {
        self.apps[app as usize].class
    }

    /// Requests in flight through `core`'s queue of `class`.
    pub fn active(&self, core: usize, class: Class) -> u32 {
        self.cores[core].active[class.idx()]
    }

    /// Requests waiting in `core`'s egress queue of `class`.
    pub fn waiting(&self, core: usize, class: Class) -> usize {
        self.cores[core].egress[class.idx()].len()
    }

    /// One request of `app` arrives: it joins the egress queue of its own
    /// core, or of another one if request steering moves it. Returns the
    /// core whose queue will carry it.
    pub fn submit(
        &mut self,
        app: AppId,
        io_bytes: u32,
        wire_bytes: u32,
        tag: u64,
        now_ns: u64,
    ) -> Result<usize, Busy> {
        self.tick(now_ns);
        if let Some(last) = self.last_req_ns {
            if now_ns.saturating_sub(last) >= self.cfg.reset_ns {
                self.reset_metrics();
            }
        }
        self.last_req_ns = Some(now_ns);
        let a = self.apps[app as usize];
        let home = a.core as usize;
        let dest = match a.class {
            Class::Throughput if self.cfg.level >= Level::RequestSteering => self.steer(home),
            _ => home,
        };
        let ci = a.class.idx();
        if self.cores[dest].egress[ci].len() >= self.cfg.egress_depth_max as usize {
            self.stats.busy += 1;
            return Err(Busy);
        }
        let steered = dest != home;
        if steered {
            self.stats.steered_requests += 1;
        } else {
            self.account(home, a.class, io_bytes);
        }
        let batching = self.cfg.batching();
        let req = Req {
            app,
            class: a.class,
            io_bytes,
            wire_bytes,
            tag,
            home: home as u16,
            steered,
        };
        let c = &mut self.cores[dest];
        c.egress[ci].push_back(req);
        if a.class == Class::Throughput {
            c.batch_reqs += 1;
            if batching && c.doorbell_ns.is_none() && !c.releasing {
                c.doorbell_ns = Some(now_ns + self.cfg.doorbell_delay_ns);
            }
        }
        if self.cfg.level >= Level::AppSteering && !steered {
            self.consider_move(app);
        }
        Ok(dest)
    }

    /// The next request `core` puts on the wire: every waiting latency
    /// request first; throughput requests only once their caravan is
    /// released (16 waiting or the doorbell timer), then until none wait.
    pub fn next_send(&mut self, core: usize, now_ns: u64) -> Option<Send> {
        let batching = self.cfg.batching();
        let c = &mut self.cores[core];
        if let Some(req) = c.egress[Class::Latency.idx()].pop_front() {
            c.active[Class::Latency.idx()] += 1;
            return Some(Send { req, flush: true });
        }
        let t = Class::Throughput.idx();
        if c.egress[t].is_empty() {
            return None;
        }
        if !c.releasing {
            let due = c.doorbell_ns.is_some_and(|d| now_ns >= d);
            if batching && c.batch_reqs < self.cfg.batch_requests && !due {
                return None;
            }
            if batching && due && c.batch_reqs < self.cfg.batch_requests {
                self.stats.doorbell_timeouts += 1;
            }
            c.releasing = true;
            c.doorbell_ns = None;
            c.caravan_bytes = 0;
        }
        let req = c.egress[t].pop_front()?;
        c.active[t] += 1;
        c.caravan_bytes = c.caravan_bytes.saturating_add(req.wire_bytes);
        let last = c.egress[t].is_empty();
        let full = c.caravan_bytes >= self.cfg.caravan_bytes_max;
        if full || last {
            self.stats.caravans += 1;
            c.caravan_bytes = 0;
        }
        if last {
            c.releasing = false;
            c.batch_reqs = 0;
        }
        Some(Send {
            req,
            flush: full || last,
        })
    }

    /// A request sent by `core` completed.
    pub fn complete(&mut self, core: usize, req: &Req, now_ns: u64) {
        self.tick(now_ns);
        let ci = req.class.idx();
        let c = &mut self.cores[core];
        debug_assert!(c.active[ci] > 0, "completion without a request in flight");
        c.active[ci] = c.active[ci].saturating_sub(1);
        if !req.steered {
            let h = &mut self.cores[req.home as usize];
            h.bytes[ci] = h.bytes[ci].saturating_sub(req.io_bytes as u64);
        }
    }

    /// The earliest time the switch needs to be called again: a doorbell
    /// timer, or the next interval tick while apps may move.
    pub fn next_timeout(&self) -> Option<u64> {
        let doorbell = self.cores.iter().filter_map(|c| c.doorbell_ns).min();
        let tick = (self.cfg.level >= Level::AppSteering).then_some(self.next_tick_ns);
        match (doorbell, tick) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Time passes with no request or completion: interval ticks. Doorbell
    /// timers need no call (`next_send` checks them).
    pub fn handle_timeout(&mut self, now_ns: u64) {
        self.tick(now_ns);
    }

    fn tick(&mut self, now_ns: u64) {
        if now_ns < self.next_tick_ns {
            return;
        }
        for c in &mut self.cores {
            c.snap = c.metric;
        }
        self.turn = self.turn.other();
        self.moved_this_interval = false;
        let period = self.cfg.appstr_interval_ns.max(1);
        // Skip whole periods missed while idle: one snapshot per call.
        let missed = (now_ns - self.next_tick_ns) / period;
        self.next_tick_ns += (missed + 1) * period;
    }

    /// Outstanding bytes and the 1/8 EWMA of a request of `class` on `core`.
    fn account(&mut self, core: usize, class: Class, io_bytes: u32) {
        let c = &mut self.cores[core];
        let ci = class.idx();
        let sample = c.bytes[ci] + io_bytes as u64;
        c.bytes[ci] = sample;
        let m = &mut c.metric[ci];
        if *m == 0 {
            *m = sample;
        } else {
            *m -= *m >> 3;
            *m += sample >> 3;
        }
        if *m < 10 {
            *m = 0;
        }
    }

    fn reset_metrics(&mut self) {
        for c in &mut self.cores {
            c.metric = [0; 2];
            c.snap = [0; 2];
        }
    }

    fn coin(&mut self) -> u64 {
        // xorshift64*: deterministic per seed, no allocation.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Request steering (artifact `blk-mq.c`): keep a throughput request on
    /// its core unless that core has more than 2 × thresh_b in flight, then
    /// prefer a core with no latency load and a short backlog whose caravan
    /// is fullest; with none, the less loaded of two random cores.
    fn steer(&mut self, home: usize) -> usize {
        let n = self.cores.len();
        let t = Class::Throughput.idx();
        let req_thresh = 2 * self.cfg.thresh_b;
        if n < 2 || self.cores[home].active[t] <= req_thresh {
            return home;
        }
        let mut best: Option<(u32, u32, bool, usize)> = None;
        let mut ties = 0u32;
        for j in 0..n {
            let c = &self.cores[j];
            if c.metric[Class::Latency.idx()] != 0 || c.active[t] >= self.cfg.candidate_active_max {
                continue;
            }
            let two_nr = self.cfg.batch_requests.saturating_sub(c.batch_reqs);
            let key = (two_nr, c.active[t], j != home, j);
            match best {
                Some(b) if (key.0, key.1, key.2) > (b.0, b.1, b.2) => {}
                Some(b) if (key.0, key.1, key.2) == (b.0, b.1, b.2) => {
                    ties += 1;
                    if self.coin().is_multiple_of(ties as u64 + 1) {
                        best = Some(key);
                    }
                }
                _ => {
                    ties = 0;
                    best = Some(key);
                }
            }
        }
        if let Some(b) = best {
            return b.3;
        }
        // Power of two choices over distinct random cores.
        let a = (self.coin() % n as u64) as usize;
        let mut b = (self.coin() % (n as u64 - 1)) as usize;
        if b >= a {
            b += 1;
        }
        let load = |j: usize| self.cores[j].active[t];
        if load(b) < load(a) {
            b
        } else {
            a
        }
    }

    /// Application steering (artifact `blk-mq.c`), on the interval's
    /// snapshots: an L-app moves to the least loaded core that already hosts
    /// L-apps; a T-app moves to the core with less latency load and the least
    /// throughput load, unless an L-app should move first.
    fn consider_move(&mut self, app: AppId) {
        let a = self.apps[app as usize];
        if a.class != self.turn || self.moved_this_interval || self.cores.len() < 2 {
            return;
        }
        let c = a.core as usize;
        let (l, t) = (Class::Latency.idx(), Class::Throughput.idx());
        let (lc, tc) = (self.cores[c].snap[l], self.cores[c].snap[t]);
        let thresh_l = self.cfg.thresh_l_bytes;
        let others = || (0..self.cores.len()).filter(move |&j| j != c);
        let mut to: Option<(u64, usize)> = None;
        match a.class {
            Class::Latency => {
                for j in others() {
                    let (lj, tj) = (self.cores[j].snap[l], self.cores[j].snap[t]);
                    if lj > thresh_l || tc == 0 || lj == 0 || lc + tc <= lj + tj {
                        continue;
                    }
                    if to.is_none_or(|(s, _)| lj + tj < s) {
                        to = Some((lj + tj, j));
                    }
                }
            }
            Class::Throughput => {
                let l_first = others().any(|j| {
                    let lj = self.cores[j].snap[l];
                    lc < lj && lj < thresh_l
                });
                if l_first {
                    return;
                }
                let mut min_t = 8_388_608u64;
                for j in others() {
                    let (lj, tj) = (self.cores[j].snap[l], self.cores[j].snap[t]);
                    if lj > thresh_l || lc <= lj || tj >= min_t {
                        continue;
                    }
                    min_t = tj;
                    to = Some((tj, j));
                }
            }
        }
        let Some((_, j)) = to else {
            return;
        };
        self.apps[app as usize].core = j as u16;
        self.moved_this_interval = true;
        self.stats.app_moves += 1;
        // The artifact resets the mover's class metric on the old core when
        // no other queue of that class is active there.
        let alone = !self
            .apps
            .iter()
            .any(|o| o.core as usize == c && o.class == a.class);
        if alone {
            self.cores[c].metric[a.class.idx()] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(cores: usize, level: Level) -> SwitchConfig {
        let mut c = SwitchConfig::new(cores);
        c.level = level;
        c
    }

    fn drain(s: &mut Switch, core: usize, now: u64) -> Vec<Send> {
        std::iter::from_fn(|| s.next_send(core, now)).collect()
    }

    #[test]
    fn latency_requests_leave_before_waiting_throughput_and_are_never_batched() {
        let mut s = Switch::new(cfg(1, Level::Priority)).unwrap();
        let t = s.add_app(Class::Throughput, 0).unwrap();
        let l = s.add_app(Class::Latency, 0).unwrap();
        for i in 0..16 {
            s.submit(t, 131_072, 72, i, 0).unwrap();
        }
        s.submit(l, 4096, 72, 100, 1).unwrap();
        let out = drain(&mut s, 0, 1);
        assert_eq!(out.len(), 17);
        assert_eq!(out[0].req.tag, 100, "the latency request goes first");
        assert!(out[0].flush, "and is flushed on its own");
        assert!(out[1..].iter().all(|x| x.req.class == Class::Throughput));
        assert!(out.last().unwrap().flush);
    }

    #[test]
    fn a_caravan_leaves_at_16_requests_or_after_the_doorbell_delay() {
        // Ex 2-6: arrivals at 0, 10, 20 µs leave together at 50 µs.
        let mut s = Switch::new(cfg(1, Level::Priority)).unwrap();
        let t = s.add_app(Class::Throughput, 0).unwrap();
        for (i, at) in [0u64, 10_000, 20_000].into_iter().enumerate() {
            s.submit(t, 65_536, 72, i as u64, at).unwrap();
            assert!(s.next_send(0, at).is_none(), "held for the caravan");
        }
        assert_eq!(s.next_timeout(), Some(50_000));
        assert!(s.next_send(0, 49_999).is_none());
        let out = drain(&mut s, 0, 50_000);
        assert_eq!(out.len(), 3);
        assert_eq!(s.stats.doorbell_timeouts, 1);
        // Sixteen before the timer: the sixteenth kicks the send.
        for i in 0..15 {
            s.submit(t, 65_536, 72, i, 60_000).unwrap();
        }
        assert!(s.next_send(0, 60_000).is_none());
        s.submit(t, 65_536, 72, 15, 60_001).unwrap();
        assert_eq!(drain(&mut s, 0, 60_001).len(), 16);
    }

    #[test]
    fn a_caravan_is_cut_at_64_kib_on_the_wire() {
        let mut s = Switch::new(cfg(1, Level::Priority)).unwrap();
        let t = s.add_app(Class::Throughput, 0).unwrap();
        // Writes of 16 KiB + a 72-byte command: four fill a caravan.
        for i in 0..16 {
            s.submit(t, 16_384, 16_384 + 72, i, 0).unwrap();
        }
        let flushes: Vec<bool> = drain(&mut s, 0, 0).iter().map(|x| x.flush).collect();
        let cut: Vec<usize> = (0..16).filter(|&i| flushes[i]).collect();
        assert_eq!(cut, vec![3, 7, 11, 15]);
    }

    #[test]
    fn below_25_us_the_doorbell_is_off_and_nothing_waits() {
        let mut c = cfg(1, Level::Priority);
        c.doorbell_delay_ns = 20_000;
        let mut s = Switch::new(c).unwrap();
        let t = s.add_app(Class::Throughput, 0).unwrap();
        s.submit(t, 4096, 72, 0, 0).unwrap();
        assert!(s.next_send(0, 0).is_some());
        assert_eq!(
            s.next_timeout(),
            None,
            "no doorbell timer (and no tick below app steering)"
        );
        assert_eq!(s.stats.doorbell_timeouts, 0);
    }

    #[test]
    fn request_steering_keeps_a_core_with_32_in_flight_local_and_steers_past_it_to_the_fullest_caravan(
    ) {
        // Ex 2-1 / 2-2 with thresh_b 16: 32 in flight stay local.
        let mut s = Switch::new(cfg(3, Level::RequestSteering)).unwrap();
        let t = s.add_app(Class::Throughput, 0).unwrap();
        let t2 = s.add_app(Class::Throughput, 2).unwrap();
        for i in 0..33 {
            assert_eq!(s.submit(t, 4096, 72, i, 0).unwrap(), 0, "request {i}");
            s.next_send(0, 100_000);
        }
        assert_eq!(s.active(0, Class::Throughput), 33);
        // Core 2 has a caravan of 9 building (two_nr 7), core 1 none (16).
        for i in 0..9 {
            s.submit(t2, 4096, 72, 100 + i, 0).unwrap();
        }
        assert_eq!(s.submit(t, 4096, 72, 50, 1).unwrap(), 2);
        assert_eq!(s.stats.steered_requests, 1);
    }

    #[test]
    fn request_steering_skips_cores_with_latency_load() {
        let mut s = Switch::new(cfg(2, Level::RequestSteering)).unwrap();
        let t = s.add_app(Class::Throughput, 0).unwrap();
        let l = s.add_app(Class::Latency, 1).unwrap();
        s.submit(l, 4096, 72, 0, 0).unwrap();
        for i in 0..40 {
            s.submit(t, 4096, 72, i, 0).unwrap();
            s.next_send(0, 1_000_000);
        }
        // Core 1 has latency load, so it is no candidate; the power of two
        // choices over the two cores then picks core 1 (nothing in flight)
        // over core 0 for every request past the 32nd.
        assert_eq!(s.stats.steered_requests, 7);
        assert_eq!(s.waiting(1, Class::Throughput), 7);
        assert_eq!(s.active(0, Class::Throughput), 33);
    }

    #[test]
    fn the_metric_is_an_eighth_weighted_average() {
        // Ex 2-3: metric 80,000, outstanding 150,000, a 10,000-byte request.
        let mut s = Switch::new(cfg(1, Level::Priority)).unwrap();
        s.cores[0].metric[1] = 80_000;
        s.cores[0].bytes[1] = 150_000;
        s.account(0, Class::Throughput, 10_000);
        assert_eq!(s.cores[0].metric[1], 90_000);
    }

    fn with_snaps(snaps: &[(u64, u64)], turn: Class) -> Switch {
        let mut s = Switch::new(cfg(snaps.len(), Level::AppSteering)).unwrap();
        for (c, &(l, t)) in snaps.iter().enumerate() {
            s.cores[c].snap = [l, t];
        }
        s.turn = turn;
        s
    }

    #[test]
    fn an_l_app_moves_to_the_least_loaded_core_already_hosting_l_apps() {
        // Ex 2-4: c (8192, 524288); j1 (4096, 65536); j2 (0, -); j3 over THRESH_L.
        let mut s = with_snaps(
            &[(8192, 524_288), (4096, 65_536), (0, 0), (131_072, 0)],
            Class::Latency,
        );
        let l = s.add_app(Class::Latency, 0).unwrap();
        s.consider_move(l);
        assert_eq!(s.app_core(l), 1);
        assert_eq!(s.stats.app_moves, 1);
    }

    #[test]
    fn a_t_app_moves_to_less_latency_load_and_least_throughput_unless_an_l_app_goes_first() {
        // Ex 2-5.
        let mut s = with_snaps(
            &[(16_384, 262_144), (0, 131_072), (4096, 65_536)],
            Class::Throughput,
        );
        let t = s.add_app(Class::Throughput, 0).unwrap();
        s.consider_move(t);
        assert_eq!(s.app_core(t), 2);
        let mut s = with_snaps(
            &[(16_384, 262_144), (0, 131_072), (20_000, 65_536)],
            Class::Throughput,
        );
        let t = s.add_app(Class::Throughput, 0).unwrap();
        s.consider_move(t);
        assert_eq!(s.app_core(t), 0, "an L-app on c must move first");
    }

    #[test]
    fn only_the_class_whose_turn_it_is_moves_and_turns_alternate_every_10_ms() {
        let mut s = with_snaps(&[(16_384, 262_144), (0, 65_536)], Class::Latency);
        let t = s.add_app(Class::Throughput, 0).unwrap();
        s.consider_move(t);
        assert_eq!(s.app_core(t), 0);
        s.next_tick_ns = 10_000_000;
        s.handle_timeout(10_000_000);
        assert_eq!(s.turn, Class::Throughput);
        // The tick copied the (empty) live metrics; put the loads back.
        s.cores[0].snap = [16_384, 262_144];
        s.cores[1].snap = [0, 65_536];
        s.consider_move(t);
        assert_eq!(s.app_core(t), 1);
    }

    #[test]
    fn a_full_egress_queue_says_busy_and_bad_configs_are_refused() {
        let mut c = cfg(1, Level::Priority);
        c.egress_depth_max = 2;
        let mut s = Switch::new(c).unwrap();
        let t = s.add_app(Class::Throughput, 0).unwrap();
        s.submit(t, 4096, 72, 0, 0).unwrap();
        s.submit(t, 4096, 72, 1, 0).unwrap();
        assert_eq!(s.submit(t, 4096, 72, 2, 0), Err(Busy));
        assert_eq!(s.stats.busy, 1);
        assert_eq!(
            s.add_app(Class::Latency, 1),
            Err(ConfigError::NoSuchCore { core: 1, cores: 1 })
        );
        assert!(matches!(
            Switch::new(cfg(0, Level::Priority)),
            Err(ConfigError::Cores(0))
        ));
        assert!(matches!(
            Switch::new(cfg(65, Level::Priority)),
            Err(ConfigError::Cores(65))
        ));
    }

    #[test]
    fn completions_return_bytes_to_the_home_core_not_the_carrying_one() {
        let mut s = Switch::new(cfg(1, Level::Priority)).unwrap();
        let l = s.add_app(Class::Latency, 0).unwrap();
        s.submit(l, 4096, 72, 0, 0).unwrap();
        let x = s.next_send(0, 0).unwrap();
        assert_eq!(s.cores[0].bytes[0], 4096);
        s.complete(0, &x.req, 10);
        assert_eq!(s.cores[0].bytes[0], 0);
        assert_eq!(s.active(0, Class::Latency), 0);
    }
}
