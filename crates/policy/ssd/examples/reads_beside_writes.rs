//! How much of their standalone bandwidth reads keep beside writes, on the
//! model alone (no network, no scheduler): pm9a3-gen4, clean, 4 KiB random
//! reads at QD 64 beside 4 KiB random writes at QD 64 (and 128 KiB sequential
//! beside 128 KiB sequential), closed loop, 2 s of model time, the first
//! quarter not counted; with read priority off and on. docs/ssd-model.md
//! quotes its output.
//!
//!   cargo run --release -p trellis-ssd --example reads_beside_writes

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use trellis_ssd::{Precondition, Ssd, SsdProfile};
use trellis_units::IoDir;

const QD: usize = 64;
const END_NS: u64 = 2_000_000_000;
const SPAN_BYTES: u64 = 2 << 30;

struct Figures {
    read_mb_s: f64,
    write_mb_s: f64,
    read_lat_us: f64,
}

fn run(read_priority: bool, reader: bool, writer: bool, seq: bool) -> Figures {
    let mut p = SsdProfile::pm9a3();
    p.read_priority = read_priority;
    let mut ssd = Ssd::new(p);
    ssd.precondition(Precondition::Clean, 1);
    let bs: u32 = if seq { 128 << 10 } else { 4096 };
    let mut due = BinaryHeap::new();
    for (on, kind) in [(reader, 0u8), (writer, 1u8)] {
        if on {
            (0..QD).for_each(|_| due.push(Reverse((0u64, kind))));
        }
    }
    let mut x: u64 = 0x12345;
    let mut offset = [0u64, SPAN_BYTES];
    let (mut rb, mut wb, mut rlat, mut rn) = (0u64, 0u64, 0u64, 0u64);
    while let Some(Reverse((t, kind))) = due.pop() {
        if t > END_NS {
            break;
        }
        let k = kind as usize;
        offset[k] = if seq {
            k as u64 * SPAN_BYTES + (offset[k] + bs as u64) % SPAN_BYTES
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            k as u64 * SPAN_BYTES + (x % SPAN_BYTES) / 4096 * 4096
        };
        let dir = if kind == 0 { IoDir::Read } else { IoDir::Write };
        let done = ssd.submit(dir, offset[k], bs, t);
        if t > END_NS / 4 {
            if kind == 0 {
                rb += bs as u64;
                rn += 1;
                rlat += done - t;
            } else {
                wb += bs as u64;
            }
        }
        due.push(Reverse((done, kind)));
    }
    let secs = (END_NS - END_NS / 4) as f64 / 1e9;
    Figures {
        read_mb_s: rb as f64 / secs / 1e6,
        write_mb_s: wb as f64 / secs / 1e6,
        read_lat_us: rlat as f64 / rn.max(1) as f64 / 1e3,
    }
}

fn main() {
    for seq in [false, true] {
        for rp in [false, true] {
            let alone = run(rp, true, false, seq);
            let w_alone = run(rp, false, true, seq);
            let mix = run(rp, true, true, seq);
            println!(
                "{} read_priority={rp}: reads alone {:.0} MB/s ({:.0} µs), writes alone {:.0} MB/s; \
                 together reads {:.0} MB/s ({:.0} µs), writes {:.0} MB/s: reads keep {:.1} %, writes {:.1} %",
                if seq { "128k sequential" } else { "4k random" },
                alone.read_mb_s,
                alone.read_lat_us,
                w_alone.write_mb_s,
                mix.read_mb_s,
                mix.read_lat_us,
                mix.write_mb_s,
                100.0 * mix.read_mb_s / alone.read_mb_s,
                100.0 * mix.write_mb_s / w_alone.write_mb_s,
            );
        }
    }
}
