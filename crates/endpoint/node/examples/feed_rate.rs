//! How many inputs per second the `conn_stream` fuzz target's harness
//! (`trellis_node::fuzzing::feed`) runs, outside libFuzzer, on a fixed
//! set of inputs (a seeded generator: every mode, digests on and off, valid
//! prefixes followed by random bytes or by valid read/write commands). Prints
//! one JSON line. A benchmark, not a test:
//!
//!   cargo run --release -p trellis-node --example feed_rate [-- INPUTS]
use std::time::Instant;
use trellis_nvme::pdu::{self, Digests};
use trellis_nvme::sqe::io;
use trellis_nvme::{Sgl, Sqe};

/// xorshift64*: a fixed, dependency-free input generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A read or write capsule for the I/O queue (mode 3 puts the connection there).
fn rw_capsule(r: &mut Rng, cid: u16) -> Vec<u8> {
    let write = r.below(2) == 0;
    // 1-8 blocks of the harness namespace's 512 B LBAs, inside its 1 MiB.
    let nlb = 1 + r.below(8) as u32;
    let slba = r.below(1024);
    let op = if write { io::WRITE } else { io::READ };
    let mut sqe = Sqe::rw(op, cid, 1, slba, nlb, false);
    let len = nlb as usize * 512;
    let icd = if write { vec![0xA5u8; len] } else { Vec::new() };
    sqe.set_sgl(if write {
        Sgl::in_capsule(len as u32)
    } else {
        Sgl::transport(len as u32)
    });
    let mut b = vec![0u8; pdu::MAX_HDR_LEN];
    let n = pdu::encode_capsule_cmd(&mut b, &sqe, icd.len(), Digests::default());
    b.truncate(n);
    b.extend_from_slice(&icd);
    b
}

fn inputs(count: usize) -> Vec<Vec<u8>> {
    let mut r = Rng(0x7E11_1500_F022);
    (0..count)
        .map(|i| {
            let mode = (i % 4) as u8;
            let sel = (mode << 2) | if i % 8 < 4 { 0 } else { r.below(4) as u8 };
            let mut v = vec![sel];
            if mode == 3 && r.below(2) == 0 {
                for k in 0..(1 + r.below(8)) {
                    v.extend_from_slice(&rw_capsule(&mut r, k as u16));
                }
            } else {
                let len = r.below(1024) as usize;
                v.extend((0..len).map(|_| r.next() as u8));
            }
            v
        })
        .collect()
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let set = inputs(n);
    // One warm-up pass over a tenth of the set.
    for d in set.iter().take(n / 10) {
        std::hint::black_box(trellis_node::fuzzing::feed(d));
    }
    let t0 = Instant::now();
    let mut sent = 0usize;
    for d in &set {
        sent += trellis_node::fuzzing::feed(d).sent_bytes;
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{{\"inputs\":{n},\"seconds\":{secs:.3},\"execs_per_s\":{:.0},\"sent_bytes\":{sent}}}",
        n as f64 / secs
    );
}
