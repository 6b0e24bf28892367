//! The blk-switch core under a simulated clock: a recorded block trace
//! (TPC-C excerpt, MQSim format, the simulator's built-in sample) replayed
//! through `trellis_path::switch` with a modelled wire and target, twice,
//! must give the same decisions bit for bit, and the decisions must keep the
//! switch's promises (latency requests never wait, throughput requests wait
//! at most one doorbell delay, every request completes once).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use trellis_path::switch::{Class, Req, Switch, SwitchConfig};

const TRACE: &str = include_str!("../../../app/sim/data/tpcc-sample.trace");
/// Host cores in the replay.
const CORES: usize = 2;
/// The trace is replayed this many times faster than recorded so that the
/// cores see backlogs (the excerpt's own rate leaves the queues near empty).
const SPEEDUP: u64 = 40;
/// Modelled round trip of a command (wire + target), plus its data at
/// 1 GB/s: a plain stand-in for the fabric, the same in both replays.
const RTT_NS: u64 = 20_000;
const NS_PER_BYTE_X1000: u64 = 1_000;

struct Arrival {
    at_ns: u64,
    app: usize,
    bytes: u32,
    write: bool,
}

fn arrivals() -> (Vec<Arrival>, BTreeMap<usize, Class>) {
    let mut out = Vec::new();
    let mut sizes: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    let mut t0 = None;
    for line in TRACE.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<u64> = line
            .split_whitespace()
            .map(|x| x.parse().expect("trace field"))
            .collect();
        let t = *t0.get_or_insert(f[0]);
        let bytes = (f[3] * 512) as u32;
        let app = f[1] as usize;
        sizes.entry(app).or_default().push(bytes);
        out.push(Arrival {
            at_ns: (f[0] - t) / SPEEDUP,
            app,
            bytes,
            write: f[4] == 0,
        });
    }
    // An app (a device of the trace) whose median request is 8 KiB or less
    // is latency-sensitive: 15 of the 16; the 16th, with requests up to
    // 55 KiB, is the throughput app.
    let classes = sizes
        .into_iter()
        .map(|(a, mut v)| {
            v.sort_unstable();
            let c = if v[v.len() / 2] <= 8192 {
                Class::Latency
            } else {
                Class::Throughput
            };
            (a, c)
        })
        .collect();
    (out, classes)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Arrive(usize),
    Done(usize, u64),
    Timer,
}

#[derive(Debug, PartialEq, Eq)]
struct Replay {
    /// (time, what, app, core, tag) for every decision, in order.
    log: Vec<(u64, u8, u16, u16, u64)>,
    stats: trellis_path::switch::SwitchStats,
    /// Per request: arrival, send, class.
    timing: Vec<(u64, u64, Class)>,
}

fn replay() -> Replay {
    let (arr, classes) = arrivals();
    let mut s = Switch::new(SwitchConfig::new(CORES)).expect("config");
    let mut app_ids = BTreeMap::new();
    for (&a, &c) in &classes {
        app_ids.insert(a, s.add_app(c, a % CORES).expect("app"));
    }
    let mut heap: BinaryHeap<Reverse<(u64, u64, Ev)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<_>, t: u64, e: Ev| {
        seq += 1;
        heap.push(Reverse((t, seq, e)));
    };
    for (i, a) in arr.iter().enumerate() {
        push(&mut heap, a.at_ns, Ev::Arrive(i));
    }
    let mut log = Vec::new();
    let mut timing = vec![(0u64, u64::MAX, Class::Latency); arr.len()];
    let mut in_flight: BTreeMap<u64, Req> = BTreeMap::new();
    // The wire of each core is busy until this time (requests serialise).
    let mut wire_free = [0u64; CORES];
    let mut timer_at: Option<u64> = None;
    while let Some(Reverse((now, _, ev))) = heap.pop() {
        match ev {
            Ev::Arrive(i) => {
                let a = &arr[i];
                let wire = if a.write { 72 + a.bytes } else { 72 };
                let app = app_ids[&a.app];
                let core = s
                    .submit(app, a.bytes, wire, i as u64, now)
                    .expect("egress room");
                timing[i] = (now, u64::MAX, s.app_class(app));
                log.push((now, 0, app, core as u16, i as u64));
            }
            Ev::Done(core, tag) => {
                let r = in_flight.remove(&tag).expect("one completion per request");
                s.complete(core, &r, now);
                log.push((now, 2, r.app, core as u16, tag));
            }
            Ev::Timer => {
                if timer_at == Some(now) {
                    timer_at = None;
                }
                s.handle_timeout(now);
            }
        }
        for (core, free_at) in wire_free.iter_mut().enumerate() {
            while let Some(x) = s.next_send(core, now) {
                let tag = x.req.tag;
                timing[tag as usize].1 = now;
                log.push((now, 1, x.req.app, core as u16, tag));
                let start = (*free_at).max(now);
                let wire_ns = x.req.io_bytes as u64 * NS_PER_BYTE_X1000 / 1000;
                let end = start + RTT_NS + wire_ns;
                *free_at = start + wire_ns;
                in_flight.insert(tag, x.req);
                push(&mut heap, end, Ev::Done(core, tag));
            }
        }
        if let Some(t) = s.next_timeout() {
            let waiting = (0..CORES).any(|c| s.waiting(c, Class::Throughput) > 0);
            let more = !heap.is_empty() || waiting;
            if t > now && more && timer_at.is_none_or(|x| t < x) {
                timer_at = Some(t);
                push(&mut heap, t, Ev::Timer);
            }
        }
        if heap.len() > 4 * arr.len() {
            panic!("timer events pile up");
        }
    }
    assert!(in_flight.is_empty(), "every request completed");
    for core in 0..CORES {
        assert_eq!(s.active(core, Class::Latency), 0);
        assert_eq!(s.active(core, Class::Throughput), 0);
    }
    Replay {
        log,
        stats: s.stats,
        timing,
    }
}

#[test]
fn a_recorded_trace_replays_bit_identically_and_keeps_the_switch_promises() {
    let a = replay();
    let b = replay();
    assert_eq!(a, b, "two replays of one trace differ");
    let n = a.timing.len();
    assert_eq!(n, TRACE.lines().filter(|l| !l.trim().is_empty()).count());
    let (mut l, mut t) = (0, 0);
    for &(arrive, sent, class) in &a.timing {
        assert!(sent != u64::MAX, "a request was never sent");
        match class {
            Class::Latency => {
                l += 1;
                assert_eq!(sent, arrive, "a latency request waited");
            }
            Class::Throughput => {
                t += 1;
                assert!(
                    sent - arrive <= 50_000,
                    "a caravan held a request past the doorbell"
                );
            }
        }
    }
    assert!(l > 0 && t > 0, "the trace has both classes ({l} L, {t} T)");
    assert!(a.stats.caravans > 0);
    eprintln!("replayed {n} requests ({l} L, {t} T): {:?}", a.stats);
}
