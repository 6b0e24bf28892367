//! Workload generators: fio-like jobs, synthetic trace models, trace replay, YCSB over an LSM.
//! A generator produces block I/O specs; the simulator owns timing and routing.

use crate::config::{JobConfig, JobKind, Pattern, Targets};
use crate::engine::Rng;
use crate::trace::{self, TraceRec};
use anyhow::{bail, Result};
use std::sync::Arc;
use trellis_units::IoDir;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoSpec {
    pub ssd: u32,
    pub op: IoDir,
    pub size_bytes: u32,
    pub offset_bytes: u64,
    /// Generator-private context (YCSB op slot, compaction flag).
    pub ctx: u32,
}

/// What the generator wants after an I/O completes (at most two new I/Os, no allocation).
pub type Follow = [Option<IoSpec>; 2];

/// Shared view the generators need of the cluster.
#[derive(Clone, Copy, Debug)]
pub struct Cluster {
    pub n_ssds: u32,
    pub ssd_bytes: u64,
    pub host_index: u32,
    pub n_hosts: u32,
}

pub struct SizeMix {
    sizes: Vec<(u32, u32)>,
    total: u32,
}

impl SizeMix {
    pub fn new(sizes: &[(u32, u32)]) -> Result<Self> {
        let total = sizes.iter().map(|s| s.1).sum();
        if total == 0 || sizes.iter().any(|s| s.0 == 0) {
            bail!("size mix needs positive sizes and weights");
        }
        Ok(SizeMix {
            sizes: sizes.to_vec(),
            total,
        })
    }
    pub fn pick(&self, rng: &mut Rng) -> u32 {
        let mut x = rng.below(self.total as u64) as u32;
        for &(s, w) in &self.sizes {
            if x < w {
                return s;
            }
            x -= w;
        }
        unreachable!()
    }
    pub fn mean(&self) -> f64 {
        self.sizes
            .iter()
            .map(|&(s, w)| s as f64 * w as f64)
            .sum::<f64>()
            / self.total as f64
    }
}

/// Published-statistics approximations (docs/sim.md lists the sources and caveats).
/// Returns (read percent, size mix).
pub fn synthetic_model(name: &str) -> Result<(u32, Vec<(u32, u32)>)> {
    Ok(match name {
        // UMass Financial1 (OLTP): write-dominated (~77% writes), small I/O (mean ~3-4 KB). [R]
        "oltp" | "financial" => (23, vec![(4096, 85), (8192, 10), (16384, 5)]),
        // UMass WebSearch: ~100% reads, mean ~15 KiB (matches the shipped wsrch sample: 15 KiB). [R]
        "websearch" => (100, vec![(8192, 60), (16384, 25), (32768, 10), (65536, 5)]),
        // SNIA Systor'17 (enterprise VDI): mixed, reads ~40%, sizes 4-64 KiB. UNVERIFIED. [R]
        "systor" => (
            40,
            vec![
                (4096, 45),
                (8192, 15),
                (16384, 10),
                (32768, 10),
                (65536, 20),
            ],
        ),
        _ => bail!("unknown synthetic model {name} (oltp, websearch, systor)"),
    })
}

pub enum Gen {
    Fio(FioGen),
    Trace(TraceGen),
    Ycsb(YcsbGen),
}

pub struct FioGen {
    read_pct: u32,
    sizes: SizeMix,
    pattern: Pattern,
    targets: Targets,
    qd: u32,
    mean_gap_ns: f64,
    /// Next byte of the sequential stream in the job's address space: the one SSD's
    /// (`Targets::One`) or the striped volume's (`Targets::All`, [`STRIPE_CHUNK_BYTES`]).
    seq_offset: u64,
    c: Cluster,
}

/// Chunk of the striped volume a sequential job over every SSD writes to: RAID-0 over the
/// cluster's SSDs in index order (node by node), with Linux md's default chunk of 512 KiB
/// (`mdadm(8)`, `--chunk`: "The default when creating an array is 512KB"; docs/sim.md).
pub const STRIPE_CHUNK_BYTES: u64 = 512 << 10;

/// Where byte `offset` of a RAID-0 volume of `n_ssds` members and `chunk`-byte chunks
/// lives: (member, byte on the member), the member's bytes wrapped at `ssd_bytes`.
pub fn stripe(offset: u64, chunk: u64, n_ssds: u32, ssd_bytes: u64) -> (u32, u64) {
    let c = offset / chunk;
    let n = n_ssds.max(1) as u64;
    let on_member = (c / n) * chunk + offset % chunk;
    ((c % n) as u32, on_member % ssd_bytes)
}

pub struct TraceGen {
    recs: Arc<Vec<TraceRec>>,
    cursor: usize,
    loops: u64,
    span_ns: u64,
    time_scale: f64,
    c: Cluster,
}

impl Gen {
    pub fn new(job: &JobConfig, c: Cluster) -> Result<Self> {
        Ok(match &job.job {
            JobKind::Fio => Gen::Fio(FioGen::new(job, job.read_pct, &job.sizes, c)?),
            JobKind::Synthetic { model } => {
                let (read_pct, sizes) = synthetic_model(model)?;
                Gen::Fio(FioGen::new(job, read_pct, &sizes, c)?)
            }
            JobKind::Trace {
                path,
                format,
                time_scale,
            } => {
                let recs = trace::load(path, format)?;
                if recs.is_empty() {
                    bail!("trace {path} is empty");
                }
                let span_ns = recs.last().unwrap().t_ns - recs[0].t_ns + 1;
                Gen::Trace(TraceGen {
                    recs,
                    cursor: 0,
                    loops: 0,
                    span_ns,
                    time_scale: *time_scale,
                    c,
                })
            }
            JobKind::Ycsb {
                workload,
                record_bytes,
                cores,
                cpu_ns_per_op,
            } => {
                let mut y = YcsbGen::new(*workload, *record_bytes, job.qd, c)?;
                y.set_client_cpu(*cores, *cpu_ns_per_op);
                Gen::Ycsb(y)
            }
        })
    }

    /// Closed-loop depth (0 = open loop).
    pub fn qd(&self) -> u32 {
        match self {
            Gen::Fio(f) => f.qd,
            Gen::Trace(_) => 0,
            Gen::Ycsb(y) => y.threads,
        }
    }

    /// Closed loop: the I/O that starts slot `ctx`.
    pub fn first(&mut self, ctx: u32, rng: &mut Rng) -> IoSpec {
        match self {
            Gen::Fio(f) => f.next(rng, ctx),
            Gen::Trace(_) => unreachable!("trace replay is open loop"),
            Gen::Ycsb(y) => y.start_op(ctx, rng),
        }
    }

    /// Open loop: next arrival time (absolute) and its I/O.
    pub fn next_arrival(&mut self, now_ns: u64, rng: &mut Rng) -> Option<(u64, IoSpec)> {
        match self {
            Gen::Fio(f) => {
                if f.mean_gap_ns <= 0.0 {
                    return None;
                }
                let t = now_ns + rng.exp_ns(f.mean_gap_ns).max(1);
                Some((t, f.next(rng, 0)))
            }
            Gen::Trace(tg) => Some(tg.next()),
            Gen::Ycsb(_) => None,
        }
    }

    /// An I/O finished; returns follow-up I/Os (closed loops) and records KV latency.
    pub fn on_complete(&mut self, spec: &IoSpec, now_ns: u64, rng: &mut Rng) -> Follow {
        match self {
            Gen::Fio(f) if f.qd > 0 => [Some(f.next(rng, spec.ctx)), None],
            Gen::Fio(_) | Gen::Trace(_) => [None, None],
            Gen::Ycsb(y) => y.on_complete(spec, now_ns, rng),
        }
    }

    /// When the I/O `spec` may be issued: a YCSB op's first I/O waits for the op's
    /// client CPU time (and for a free core); everything else goes at once.
    pub fn ready_ns(&self, spec: &IoSpec) -> u64 {
        match self {
            Gen::Ycsb(y) if spec.ctx != BG_CTX => y.ready_ns[spec.ctx as usize],
            _ => 0,
        }
    }

    pub fn ycsb(&self) -> Option<&YcsbGen> {
        match self {
            Gen::Ycsb(y) => Some(y),
            _ => None,
        }
    }
}

impl FioGen {
    fn new(job: &JobConfig, read_pct: u32, sizes: &[(u32, u32)], c: Cluster) -> Result<Self> {
        if read_pct > 100 {
            bail!("read_pct > 100");
        }
        if job.qd == 0 && job.iops == 0 {
            bail!(
                "job {} needs qd > 0 (closed loop) or iops > 0 (open loop)",
                job.name
            );
        }
        Ok(FioGen {
            read_pct,
            sizes: SizeMix::new(sizes)?,
            pattern: job.pattern,
            targets: job.targets.clone(),
            qd: job.qd,
            mean_gap_ns: if job.iops > 0 {
                1e9 / job.iops as f64
            } else {
                0.0
            },
            // Host h's stream starts h GiB into each member (wrapped at its size) and on
            // member h: hosts start on different SSDs. One SSD: h GiB, as before striping.
            seq_offset: ((c.host_index as u64 * c.n_ssds.max(1) as u64) << 30)
                + (c.host_index % c.n_ssds.max(1)) as u64 * STRIPE_CHUNK_BYTES,
            c,
        })
    }

    fn next(&mut self, rng: &mut Rng, ctx: u32) -> IoSpec {
        let size = self.sizes.pick(rng);
        let op = if (rng.below(100) as u32) < self.read_pct {
            IoDir::Read
        } else {
            IoDir::Write
        };
        let n = self.c.n_ssds;
        let (ssd, offset) = match self.pattern {
            Pattern::Random => {
                let ssd = match self.targets {
                    Targets::One(s) => s % n,
                    Targets::All => rng.below(n as u64) as u32,
                };
                (ssd, rng.below(self.c.ssd_bytes / 4096) * 4096)
            }
            Pattern::Sequential => {
                let at = match self.targets {
                    Targets::One(s) => (s % n, self.seq_offset % self.c.ssd_bytes),
                    Targets::All => {
                        stripe(self.seq_offset, STRIPE_CHUNK_BYTES, n, self.c.ssd_bytes)
                    }
                };
                self.seq_offset += size as u64;
                at
            }
        };
        IoSpec {
            ssd,
            op,
            size_bytes: size,
            offset_bytes: offset,
            ctx,
        }
    }
}

impl TraceGen {
    fn next(&mut self) -> (u64, IoSpec) {
        let r = self.recs[self.cursor];
        let t0 = self.recs[0].t_ns;
        let t = ((r.t_ns - t0 + self.loops * self.span_ns) as f64 * self.time_scale) as u64;
        self.cursor += 1;
        if self.cursor == self.recs.len() {
            self.cursor = 0;
            self.loops += 1;
        }
        // Spread the trace's devices over the cluster, shifted per host.
        let ssd =
            ((r.device as u64 * 7 + self.c.host_index as u64 * 13) % self.c.n_ssds as u64) as u32;
        let offset = (r.offset_bytes % self.c.ssd_bytes) & !4095;
        (
            t,
            IoSpec {
                ssd,
                op: r.op,
                size_bytes: r.size_bytes.max(512),
                offset_bytes: offset,
                ctx: 0,
            },
        )
    }
}

/// YCSB over an LSM-style block-I/O model (RocksDB on remote block storage) [R]:
/// - read: one 4 KiB data-block read (bloom filters avoid most misses; index in memory);
/// - update/insert: one WAL append of the record rounded to 4 KiB;
/// - scan: `SCAN_BLOCKS` sequential 16 KiB block reads;
/// - read-modify-write: a read then a WAL append;
/// - flush and compaction: every written byte causes `COMPACTION_AMP` bytes of 128 KiB
///   background reads and as many writes, issued by one background thread per host.
pub struct YcsbGen {
    mix: [u32; 5], // read, update, insert, scan, rmw percentages
    record_bytes: u32,
    threads: u32,
    c: Cluster,
    /// Per thread: KV op kind, start time, remaining steps.
    slots: Vec<(u8, u64, u8)>,
    /// Per thread: when its current op's CPU work ends (its first I/O goes then).
    ready_ns: Vec<u64>,
    /// Per client core: when it is next free. A thread that starts an op takes the core
    /// that frees first, so with more threads than cores ops queue for CPU and
    /// throughput is bounded by cores / cpu_ns_per_op, not by threads / latency.
    core_free_ns: Vec<u64>,
    cpu_ns_per_op: u64,
    compaction_debt_bytes: u64,
    compaction_busy: bool,
    pub kv_ops: u64,
    pub kv_read_lat: Vec<u64>,
    pub measure_from_ns: u64,
}

const SCAN_BLOCKS: u8 = 4;
const COMPACTION_AMP: u64 = 4;
const COMPACTION_IO: u32 = 128 * 1024;
const BG_CTX: u32 = u32::MAX;

impl YcsbGen {
    fn new(w: char, record_bytes: u32, threads: u32, c: Cluster) -> Result<Self> {
        let mix = match w.to_ascii_uppercase() {
            'A' => [50, 50, 0, 0, 0],
            'B' => [95, 5, 0, 0, 0],
            'C' => [100, 0, 0, 0, 0],
            'D' => [95, 0, 5, 0, 0],
            'E' => [0, 0, 5, 95, 0],
            'F' => [50, 0, 0, 0, 50],
            _ => bail!("YCSB workload must be A-F"),
        };
        if threads == 0 {
            bail!("YCSB needs qd (threads) > 0");
        }
        Ok(YcsbGen {
            mix,
            record_bytes,
            threads,
            c,
            slots: vec![(0, 0, 0); threads as usize],
            ready_ns: vec![0; threads as usize],
            core_free_ns: vec![0; threads as usize],
            cpu_ns_per_op: 0,
            compaction_debt_bytes: 0,
            compaction_busy: false,
            kv_ops: 0,
            kv_read_lat: Vec::new(),
            measure_from_ns: 0,
        })
    }

    fn block(&self, rng: &mut Rng, op: IoDir, size: u32, ctx: u32) -> IoSpec {
        let ssd = rng.below(self.c.n_ssds as u64) as u32;
        let offset = rng.below(self.c.ssd_bytes / size as u64) * size as u64;
        IoSpec {
            ssd,
            op,
            size_bytes: size,
            offset_bytes: offset,
            ctx,
        }
    }

    /// `cores` = 0 means one core per thread (YCSB's usual setup: threads <= cores).
    pub fn set_client_cpu(&mut self, cores: u32, cpu_ns_per_op: u64) {
        let n = if cores == 0 { self.threads } else { cores };
        self.core_free_ns = vec![0; n as usize];
        self.cpu_ns_per_op = cpu_ns_per_op;
    }

    /// Run one op's CPU work on the core that frees first; returns when it ends.
    fn run_on_core(&mut self, now_ns: u64) -> u64 {
        let (i, &free) = self
            .core_free_ns
            .iter()
            .enumerate()
            .min_by_key(|&(i, &t)| (t, i))
            .expect("at least one core");
        let done = free.max(now_ns) + self.cpu_ns_per_op;
        self.core_free_ns[i] = done;
        done
    }

    fn wal_bytes(&self) -> u32 {
        self.record_bytes.div_ceil(4096) * 4096
    }

    fn start_op(&mut self, ctx: u32, rng: &mut Rng) -> IoSpec {
        self.start_op_at(ctx, rng, 0)
    }

    fn start_op_at(&mut self, ctx: u32, rng: &mut Rng, now_ns: u64) -> IoSpec {
        let mut x = rng.below(100) as u32;
        let mut kind = 0u8;
        for (i, &p) in self.mix.iter().enumerate() {
            if x < p {
                kind = i as u8;
                break;
            }
            x -= p;
        }
        let (op, size, steps) = match kind {
            0 => (IoDir::Read, 4096, 1),
            1 | 2 => (IoDir::Write, self.wal_bytes(), 1),
            3 => (IoDir::Read, 16384, SCAN_BLOCKS),
            _ => (IoDir::Read, 4096, 2),
        };
        self.slots[ctx as usize] = (kind, now_ns, steps);
        self.ready_ns[ctx as usize] = self.run_on_core(now_ns);
        self.block(rng, op, size, ctx)
    }

    fn on_complete(&mut self, spec: &IoSpec, now_ns: u64, rng: &mut Rng) -> Follow {
        if spec.ctx == BG_CTX {
            self.compaction_busy = false;
            return [self.maybe_compact(rng), None];
        }
        if spec.op == IoDir::Write {
            self.compaction_debt_bytes += COMPACTION_AMP * spec.size_bytes as u64;
        }
        let (kind, start, steps) = self.slots[spec.ctx as usize];
        if steps > 1 {
            self.slots[spec.ctx as usize].2 = steps - 1;
            let next = match kind {
                4 => self.block(rng, IoDir::Write, self.wal_bytes(), spec.ctx),
                _ => IoSpec {
                    offset_bytes: (spec.offset_bytes + 16384) % self.c.ssd_bytes,
                    ..*spec
                },
            };
            return [Some(next), None];
        }
        if now_ns >= self.measure_from_ns {
            self.kv_ops += 1;
            if kind == 0 || kind == 4 {
                self.kv_read_lat.push(now_ns - start);
            }
        }
        let fg = self.start_op_at(spec.ctx, rng, now_ns);
        [Some(fg), self.maybe_compact(rng)]
    }

    fn maybe_compact(&mut self, rng: &mut Rng) -> Option<IoSpec> {
        if self.compaction_busy || self.compaction_debt_bytes < 2 * COMPACTION_IO as u64 {
            return None;
        }
        self.compaction_busy = true;
        // Alternate reads and writes of compaction input/output.
        self.compaction_debt_bytes -= COMPACTION_IO as u64;
        let op = if (self.compaction_debt_bytes / COMPACTION_IO as u64).is_multiple_of(2) {
            IoDir::Read
        } else {
            IoDir::Write
        };
        Some(self.block(rng, op, COMPACTION_IO, BG_CTX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> Cluster {
        Cluster {
            n_ssds: 8,
            ssd_bytes: 1 << 30,
            host_index: 0,
            n_hosts: 1,
        }
    }

    #[test]
    fn fio_read_ratio_and_sizes_follow_config() {
        let job = JobConfig {
            read_pct: 70,
            sizes: vec![(4096, 3), (65536, 1)],
            ..JobConfig::default()
        };
        let mut g = Gen::new(&job, cluster()).unwrap();
        let mut rng = Rng::new(3);
        let (mut reads, mut big) = (0, 0);
        for i in 0..20_000 {
            let s = g.first(i % 32, &mut rng);
            reads += (s.op == IoDir::Read) as u32;
            big += (s.size_bytes == 65536) as u32;
            assert!(s.offset_bytes.is_multiple_of(4096) && s.ssd < 8);
        }
        assert!((13_600..14_400).contains(&reads), "{reads}");
        assert!((4_600..5_400).contains(&big), "{big}");
    }

    /// A sequential job over every SSD is a RAID-0 stream: 512 KiB on one member, then the
    /// next, each member's bytes contiguous; a second host starts on another member.
    #[test]
    fn a_sequential_job_over_every_ssd_writes_a_striped_volume() {
        let job = JobConfig {
            read_pct: 0,
            sizes: vec![(131072, 1)],
            pattern: Pattern::Sequential,
            qd: 8,
            ..JobConfig::default()
        };
        let mut g = Gen::new(&job, cluster()).unwrap();
        let mut rng = Rng::new(5);
        let per_chunk = (STRIPE_CHUNK_BYTES / 131072) as u32;
        let mut next_on = [None::<u64>; 8];
        for i in 0..(8 * per_chunk * 3) {
            let s = g.first(i % 8, &mut rng);
            assert_eq!(s.ssd, (i / per_chunk) % 8, "I/O {i}");
            if let Some(want) = next_on[s.ssd as usize] {
                assert_eq!(s.offset_bytes, want, "I/O {i} on SSD {}", s.ssd);
            }
            next_on[s.ssd as usize] = Some(s.offset_bytes + 131072);
        }
        let mut other = Gen::new(
            &job,
            Cluster {
                host_index: 1,
                ..cluster()
            },
        )
        .unwrap();
        let s = other.first(0, &mut rng);
        assert_eq!(s.ssd, 1);
        assert_eq!(
            s.offset_bytes, 0,
            "8 GiB + 512 KiB on 8 members: 1 GiB into member 1, wrapped"
        );
        assert_eq!(
            stripe(
                3 * STRIPE_CHUNK_BYTES + 4096,
                STRIPE_CHUNK_BYTES,
                2,
                1 << 30
            ),
            (1, STRIPE_CHUNK_BYTES + 4096)
        );
    }

    #[test]
    fn ycsb_c_is_read_only_and_a_has_half_writes() {
        let mut rng = Rng::new(1);
        for (w, lo, hi) in [('C', 0, 0), ('A', 4_500, 5_500)] {
            let job = JobConfig {
                job: JobKind::Ycsb {
                    workload: w,
                    record_bytes: 1024,
                    cores: 0,
                    cpu_ns_per_op: crate::config::ycsb_cpu_ns_per_op(),
                },
                qd: 4,
                ..JobConfig::default()
            };
            let mut g = Gen::new(&job, cluster()).unwrap();
            let mut writes = 0;
            for i in 0..10_000 {
                let s = g.first(i % 4, &mut rng);
                writes += (s.op == IoDir::Write) as u32;
            }
            assert!((lo..=hi).contains(&writes), "{w}: {writes}");
        }
    }

    #[test]
    fn synthetic_websearch_matches_trace_mean_size() {
        // The shipped wsrch sample has a mean request of 30.1 sectors = 15.4 KB.
        let (r, sizes) = synthetic_model("websearch").unwrap();
        assert_eq!(r, 100);
        let m = SizeMix::new(&sizes).unwrap().mean();
        assert!((14_000.0..17_000.0).contains(&m), "{m}");
    }
}
