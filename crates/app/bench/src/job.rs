//! Job options: one struct serves the command line flags, the TOML `[global]`
//! table and each `[[job]]`, so every option is spelled the same everywhere.
//! Merge order: built-in defaults < file `[global]` < `[[job]]` < command-line flags.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Deserializer};

/// Every job option is optional here; [`JobSpec`] is the resolved form.
#[derive(clap::Args, Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobOpts {
    /// Job name (in a job file: the job's own name).
    #[arg(long)]
    pub name: Option<String>,
    /// read, write, randread (default), randwrite, randrw (or rw/readwrite: sequential mix).
    #[arg(long)]
    pub rw: Option<String>,
    /// Block size per I/O, a multiple of 512 up to 4m, e.g. 4k (default), 128k.
    #[arg(long)]
    pub bs: Option<String>,
    /// Size mix instead of --bs, fio style: 4k/70:64k/30 (percentages).
    #[arg(long)]
    pub bssplit: Option<String>,
    /// Outstanding I/Os per worker, 1 to 4096 (default 1), spread over its --queues;
    /// more per queue than the target grants is refused.
    #[arg(long)]
    pub iodepth: Option<u32>,
    /// Worker threads (reactors) for this job, 1 to 256 (default 1).
    #[arg(long)]
    pub numjobs: Option<u32>,
    /// Measured duration after the ramp: 10, 10s, 500ms, 1m (default 10 s).
    #[arg(long)]
    pub runtime: Option<String>,
    /// Warm-up before measuring (I/O runs, nothing is recorded; default 0).
    #[arg(long = "ramp-time", alias = "ramp_time")]
    #[serde(alias = "ramp-time")]
    pub ramp_time: Option<String>,
    /// IOPS cap for the whole job (0 = unlimited).
    #[arg(long = "rate-iops", alias = "rate_iops")]
    #[serde(alias = "rate-iops")]
    pub rate_iops: Option<u64>,
    /// Bytes/s cap for the whole job, e.g. 100m (0 = unlimited).
    #[arg(long)]
    pub rate: Option<String>,
    /// Percentage of reads in randrw/rw, 0 to 100 (default 50).
    #[arg(long)]
    pub rwmixread: Option<u32>,
    /// Start of the I/O range in bytes (e.g. 1g; default 0).
    #[arg(long)]
    pub offset: Option<String>,
    /// Length of the I/O range in bytes (default: to the namespace end; past it is refused).
    #[arg(long)]
    pub size: Option<String>,
    /// Per-block verification (crc32c); `--verify` alone turns it on, `--verify=0` off.
    #[arg(long, num_args = 0..=1, default_missing_value = "crc32c")]
    #[serde(deserialize_with = "bool_or_string")]
    pub verify: Option<String>,
    /// Target address HOST:PORT, a host name or an IP (default 127.0.0.1:4420).
    #[arg(long)]
    pub addr: Option<String>,
    /// Subsystem NQN (default nqn.2026-11.io.trellis:default).
    #[arg(long)]
    pub nqn: Option<String>,
    /// Host NQN (default: derived from --tenant).
    #[arg(long)]
    pub hostnqn: Option<String>,
    /// Tenant name (default "default"; the host NQN identifies it on the wire).
    #[arg(long)]
    pub tenant: Option<String>,
    /// latency or throughput (default).
    #[arg(long)]
    pub class: Option<String>,
    /// I/O queue pairs per worker, 1 to 64 (default 1), at most --iodepth.
    #[arg(long)]
    pub queues: Option<u32>,
    /// Digests: none (default), header, data, header,data.
    #[arg(long)]
    pub digest: Option<String>,
    /// Namespace ID (default 1).
    #[arg(long)]
    pub nsid: Option<u32>,
    /// Random seed (runs with the same seed issue the same offsets).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Credit-based flow control (Gimbal, docs/gimbal.md §1.e): ask the
    /// target for the tenant's I/O credits and never keep more commands
    /// outstanding than they allow (the tenant's queues share them);
    /// `--credits` alone turns it on. A target that sends none (Linux
    /// nvmet, SPDK) leaves --iodepth in force.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub credits: Option<bool>,
    /// A replicated volume: the same namespace (--nsid) on two or more
    /// targets, comma-separated HOST:PORT[/NQN] (instead of --addr; NQN
    /// defaults to --nqn). Writes go to every replica and complete when all
    /// have; each read goes to one.
    #[arg(long)]
    pub replicas: Option<String>,
    /// Which replica serves a read: headroom (default; the replica whose
    /// credits, Gimbal's virtual view, leave the most room: credits minus
    /// this queue's commands in flight there; turns --credits on) or
    /// round-robin.
    #[arg(long = "replica-read", alias = "replica_read")]
    #[serde(alias = "replica-read")]
    pub replica_read: Option<String>,
    /// A multipath volume: one namespace (--nqn, --nsid) reached at two or
    /// more addresses of the same subsystem, comma-separated HOST:PORT
    /// (instead of --addr). Every path must report the same namespace
    /// identity (NGUID or EUI-64). Each read and write goes to one path; when
    /// a path fails, its commands in flight are re-sent on another and the
    /// job goes on while one path lives.
    #[arg(long)]
    pub paths: Option<String>,
    /// Which path serves each command: round-robin (default), queue-depth
    /// (the path with the fewest commands in flight, Linux's iopolicy of that
    /// name) or isr (the least expected delay from each path's measured
    /// round trip and commands in flight: NSDI'26 ISR at the end host).
    #[arg(long = "path-policy", alias = "path_policy")]
    #[serde(alias = "path-policy")]
    pub path_policy: Option<String>,
    /// Eager bandwidth reservation at the host (NSDI'26 §3.2) for a
    /// multipath volume: each path's rate toward the host, as tc writes it
    /// (e.g. 1gbit). A read reserves its response's rate on its path before
    /// it is sent; a path that cannot grant it does not take it, and a read
    /// that fits on no path waits for a completion. Off by default.
    #[arg(long = "path-rate", alias = "path_rate")]
    #[serde(alias = "path-rate")]
    pub path_rate: Option<String>,
}

fn bool_or_string<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum V {
        B(bool),
        S(String),
    }
    Ok(Option::<V>::deserialize(d)?.map(|v| match v {
        V::B(true) => "crc32c".into(),
        V::B(false) => "0".into(),
        V::S(s) => s,
    }))
}

impl JobOpts {
    /// Fills every unset field from `base`.
    pub fn or(mut self, base: &JobOpts) -> JobOpts {
        macro_rules! fill {
            ($($f:ident),*) => { $( if self.$f.is_none() { self.$f = base.$f.clone(); } )* };
        }
        fill!(
            name,
            rw,
            bs,
            bssplit,
            iodepth,
            numjobs,
            runtime,
            ramp_time,
            rate_iops,
            rate,
            rwmixread,
            offset,
            size,
            verify,
            addr,
            nqn,
            hostnqn,
            tenant,
            class,
            queues,
            digest,
            nsid,
            seed,
            credits,
            replicas,
            replica_read,
            paths,
            path_policy,
            path_rate
        );
        self
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct JobFile {
    #[serde(default)]
    global: JobOpts,
    #[serde(default)]
    job: Vec<JobOpts>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    Latency,
    Throughput,
}

/// A fully resolved job.
#[derive(Clone, Debug)]
pub struct JobSpec {
    pub name: String,
    pub rw: String,
    pub random: bool,
    /// Percentage of reads (100 = read only, 0 = write only).
    pub read_pct: u32,
    /// (bytes, weight) pairs; weights sum to 100.
    pub sizes: Vec<(u32, u32)>,
    pub iodepth: u32,
    pub numjobs: u32,
    pub runtime: Duration,
    pub ramp: Duration,
    pub rate_iops: u64,
    pub rate_bytes: u64,
    pub offset_bytes: u64,
    /// None = to the end of the namespace.
    pub size_bytes: Option<u64>,
    pub verify: bool,
    pub addr: String,
    pub nqn: String,
    pub hostnqn: String,
    pub tenant: String,
    pub class: Class,
    pub queues: u32,
    pub header_digest: bool,
    pub data_digest: bool,
    pub nsid: u32,
    pub seed: u64,
    /// Honour the target's I/O credits (`--credits`).
    pub credits: bool,
    /// Replicas (`--replicas`) as given, HOST:PORT[/NQN]; empty: one target
    /// at `addr`. See [`replica_target`].
    pub replicas: Vec<String>,
    pub replica_read: ReplicaRead,
    /// `replicas` are paths to one namespace (`--paths`), not copies: every
    /// command goes to one of them, and a failed path's commands move.
    pub multipath: bool,
    /// `--path-rate` in bytes/s: reserve each read's response rate on its
    /// path (0: no reservation).
    pub path_rate_bytes_per_s: u64,
}

/// How a replicated volume picks the replica of a read (and a multipath
/// volume the path of every command).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplicaRead {
    /// Each queue cycles through the replicas (the baseline).
    RoundRobin,
    /// The replica maximising credits − in flight, ties to the fewest in
    /// flight, then the next in turn (algorithms §1.f, Gimbal's "least load
    /// … the number of allocated credits").
    Headroom,
    /// The fewest commands in flight, ties in turn (Linux's queue-depth
    /// iopolicy; multipath volumes).
    QueueDepth,
    /// ISR at the end host: least expected delay from each path's
    /// round-trip EWMA and commands in flight (`trellis_path::replica::IsrPaths`;
    /// multipath volumes).
    Isr,
}

impl ReplicaRead {
    pub fn label(self) -> &'static str {
        match self {
            ReplicaRead::RoundRobin => "round-robin",
            ReplicaRead::Headroom => "headroom",
            ReplicaRead::QueueDepth => "queue-depth",
            ReplicaRead::Isr => "isr",
        }
    }
}

/// (address, subsystem NQN) of a replica given as HOST:PORT[/NQN].
pub fn replica_target<'a>(replica: &'a str, default_nqn: &'a str) -> (&'a str, &'a str) {
    replica.split_once('/').unwrap_or((replica, default_nqn))
}

/// Most replicas of one volume.
pub const MAX_REPLICAS: usize = 8;

pub const DEFAULT_ADDR: &str = "127.0.0.1:4420";
pub const DEFAULT_NQN: &str = "nqn.2026-11.io.trellis:default";
/// Limits: keep a typo from allocating the machine away.
const MAX_IODEPTH: u32 = 4096;
const MAX_NUMJOBS: u32 = 256;
const MAX_QUEUES: u32 = 64;
const MAX_BS: u64 = 4 << 20;

impl JobSpec {
    pub fn max_bs(&self) -> u32 {
        self.sizes.iter().map(|s| s.0).max().unwrap_or(4096)
    }
    pub fn min_bs(&self) -> u32 {
        self.sizes.iter().map(|s| s.0).min().unwrap_or(4096)
    }
    /// Human label of the size (or mix).
    pub fn bs_label(&self) -> String {
        self.sizes
            .iter()
            .map(|(b, w)| {
                if self.sizes.len() == 1 {
                    fmt_size(*b as u64)
                } else {
                    format!("{}/{}", fmt_size(*b as u64), w)
                }
            })
            .collect::<Vec<_>>()
            .join(":")
    }
    pub fn digest_label(&self) -> &'static str {
        match (self.header_digest, self.data_digest) {
            (false, false) => "none",
            (true, false) => "header",
            (false, true) => "data",
            (true, true) => "header,data",
        }
    }
}

/// Resolves the jobs to run: from the file (if any) and the flags.
pub fn resolve_jobs(file: Option<&Path>, flags: &JobOpts) -> Result<Vec<JobSpec>> {
    let parsed = match file {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            toml::from_str::<JobFile>(&text).with_context(|| format!("parsing {}", p.display()))?
        }
        None => JobFile::default(),
    };
    let jobs = if parsed.job.is_empty() {
        vec![JobOpts::default()]
    } else {
        parsed.job
    };
    let mut out = Vec::new();
    for (i, j) in jobs.into_iter().enumerate() {
        // Flags win over the file so one can vary a job file from the shell;
        // the job's own name is kept unless --name is given with one job.
        let mut merged = flags.clone();
        if file.is_some() {
            merged.name = None;
        }
        let o = merged.or(&j.or(&parsed.global));
        out.push(resolve(o, i).with_context(|| format!("job {i}"))?);
    }
    Ok(out)
}

fn resolve(o: JobOpts, index: usize) -> Result<JobSpec> {
    let (rw, random, read_pct) = parse_rw(&o)?;
    let sizes = parse_sizes(&o)?;
    let (iodepth, numjobs, queues) = parse_depths(&o)?;
    let verify = match o.verify.as_deref() {
        None | Some("0") | Some("false") | Some("none") | Some("off") => false,
        Some("crc32c") | Some("1") | Some("true") | Some("on") | Some("") => true,
        Some(other) => bail!("unsupported verify {other:?} (crc32c)"),
    };
    let (header_digest, data_digest) = parse_digest(o.digest.as_deref().unwrap_or("none"))?;
    let (tenant, hostnqn) = tenant_and_hostnqn(&o);
    let (replicas, replica_read, multipath) = parse_targets(&o)?;
    let class = match o.class.as_deref().unwrap_or("throughput") {
        "latency" | "L" | "l" => Class::Latency,
        "throughput" | "T" | "t" => Class::Throughput,
        other => bail!("unknown class {other:?} (latency, throughput)"),
    };
    Ok(JobSpec {
        name: o.name.clone().unwrap_or_else(|| format!("job{index}")),
        rw,
        random,
        read_pct,
        sizes,
        iodepth,
        numjobs,
        runtime: parse_duration(o.runtime.as_deref().unwrap_or("10"))?,
        ramp: parse_duration(o.ramp_time.as_deref().unwrap_or("0"))?,
        rate_iops: o.rate_iops.unwrap_or(0),
        rate_bytes: o.rate.as_deref().map(parse_size).transpose()?.unwrap_or(0),
        offset_bytes: o
            .offset
            .as_deref()
            .map(parse_size)
            .transpose()?
            .unwrap_or(0),
        size_bytes: o.size.as_deref().map(parse_size).transpose()?,
        verify,
        addr: replicas
            .first()
            .map(|r| r.split_once('/').map_or(r.as_str(), |(a, _)| a).to_string())
            .or_else(|| o.addr.clone())
            .unwrap_or_else(|| DEFAULT_ADDR.into()),
        nqn: o.nqn.clone().unwrap_or_else(|| DEFAULT_NQN.into()),
        hostnqn,
        tenant,
        class,
        queues,
        header_digest,
        data_digest,
        nsid: o.nsid.unwrap_or(1),
        seed: o.seed.unwrap_or(0x007e_1115),
        credits: o.credits.unwrap_or(false)
            || (!multipath && replica_read == ReplicaRead::Headroom),
        path_rate_bytes_per_s: parse_path_rate(&o, multipath)?,
        replicas,
        replica_read,
        multipath,
    })
}

/// `--rw` (default randread): the pattern, whether it is random, and the read
/// share (`--rwmixread` for mixed patterns, default 50).
fn parse_rw(o: &JobOpts) -> Result<(String, bool, u32)> {
    let rw = o.rw.clone().unwrap_or_else(|| "randread".into());
    let (random, read_pct) = match rw.as_str() {
        "read" => (false, 100),
        "write" => (false, 0),
        "randread" => (true, 100),
        "randwrite" => (true, 0),
        "randrw" => (true, o.rwmixread.unwrap_or(50)),
        "rw" | "readwrite" => (false, o.rwmixread.unwrap_or(50)),
        other => bail!("unknown rw {other:?} (read, write, randread, randwrite, randrw, rw)"),
    };
    if read_pct > 100 {
        bail!("--rwmixread {read_pct} is not a percentage: use 0 to 100");
    }
    Ok((rw, random, read_pct))
}

/// `--bssplit` or `--bs` (default 4k): (block size, weight) pairs, each a
/// multiple of 512 up to `MAX_BS`.
fn parse_sizes(o: &JobOpts) -> Result<Vec<(u32, u32)>> {
    let sizes = match (&o.bssplit, &o.bs) {
        (Some(s), _) => parse_bssplit(s)?,
        (None, Some(b)) => vec![(parse_bs(b)?, 100)],
        (None, None) => vec![(4096, 100)],
    };
    for (b, _) in &sizes {
        if *b == 0 || *b as u64 > MAX_BS || b % 512 != 0 {
            bail!("block size {b} must be a multiple of 512 up to {MAX_BS} (4m): use e.g. --bs 4k");
        }
    }
    Ok(sizes)
}

/// `--iodepth`, `--numjobs` and `--queues` (default 1 each), within their
/// limits and with every queue given at least one I/O of the depth.
fn parse_depths(o: &JobOpts) -> Result<(u32, u32, u32)> {
    let iodepth = o.iodepth.unwrap_or(1);
    let numjobs = o.numjobs.unwrap_or(1);
    let queues = o.queues.unwrap_or(1);
    for (flag, v, max) in [
        ("iodepth", iodepth, MAX_IODEPTH),
        ("numjobs", numjobs, MAX_NUMJOBS),
        ("queues", queues, MAX_QUEUES),
    ] {
        if !(1..=max).contains(&v) {
            bail!("--{flag} {v} is out of range: use 1 to {max}");
        }
    }
    if queues > iodepth {
        bail!("--queues {queues} is more than --iodepth {iodepth}: every queue needs at least one I/O in flight; use --queues {iodepth} or less");
    }
    Ok((iodepth, numjobs, queues))
}

/// The tenant (`--tenant`, else the host NQN, else "default") and the host
/// NQN (`--hostnqn`, else the tenant's own).
fn tenant_and_hostnqn(o: &JobOpts) -> (String, String) {
    let tenant = o
        .tenant
        .clone()
        .or_else(|| o.hostnqn.clone())
        .unwrap_or_else(|| "default".into());
    let hostnqn = o.hostnqn.clone().unwrap_or_else(|| {
        if tenant.starts_with("nqn.") {
            tenant.clone()
        } else {
            format!("nqn.2026-11.io.trellis:tenant:{tenant}")
        }
    });
    (tenant, hostnqn)
}

/// Where the job's I/O goes: the paths of a multipath volume (`--paths`), or
/// the replicas, with the read policy and whether it is multipath.
fn parse_targets(o: &JobOpts) -> Result<(Vec<String>, ReplicaRead, bool)> {
    Ok(match o.paths.as_deref() {
        Some(list) => {
            let (paths, policy) = parse_paths(o, list)?;
            (paths, policy, true)
        }
        None => {
            if let Some(p) = &o.path_policy {
                bail!("--path-policy {p:?} needs --paths HOST:PORT,HOST:PORT");
            }
            let (r, read) = parse_replicas(o)?;
            (r, read, false)
        }
    })
}

/// Slowest and fastest `--path-rate`: a path below 1 Mbit/s is no SAN path,
/// and 400 Gbit/s is the fastest Ethernet port sold today.
const PATH_RATE_BITS_MIN: u64 = 1_000_000;
const PATH_RATE_BITS_MAX: u64 = 400_000_000_000;

/// `--path-rate RATE` (multipath only) in bytes/s; 0 when not given.
fn parse_path_rate(o: &JobOpts, multipath: bool) -> Result<u64> {
    let Some(r) = o.path_rate.as_deref() else {
        return Ok(0);
    };
    if !multipath {
        bail!("--path-rate {r:?} reserves bandwidth on the paths of a multipath volume: give --paths HOST:PORT,HOST:PORT too");
    }
    let bits = trellis_units::parse_bit_rate(r).map_err(|e| anyhow::anyhow!("--path-rate: {e}"))?;
    if !(PATH_RATE_BITS_MIN..=PATH_RATE_BITS_MAX).contains(&bits) {
        bail!("--path-rate {r:?} is out of range: give 1mbit to 400gbit");
    }
    Ok(bits / 8)
}

/// `--paths` and `--path-policy`: 2 to MAX_REPLICAS distinct HOST:PORT of one
/// subsystem (--nqn), not with --addr or --replicas.
fn parse_paths(o: &JobOpts, list: &str) -> Result<(Vec<String>, ReplicaRead)> {
    if o.addr.is_some() || o.replicas.is_some() {
        bail!("--paths with --addr or --replicas: name every address of the volume in --paths");
    }
    if o.replica_read.is_some() {
        bail!("--replica-read is for --replicas; a multipath volume takes --path-policy");
    }
    let addrs = address_list(
        "--paths",
        list,
        "HOST:PORT addresses",
        "path is a different address",
    )?;
    if let Some(a) = addrs.iter().find(|a| a.contains('/')) {
        bail!("--paths {list:?}: {a:?} names a subsystem; every path reaches --nqn's, so give HOST:PORT only");
    }
    let policy = match o.path_policy.as_deref().unwrap_or("round-robin") {
        "round-robin" | "rr" => ReplicaRead::RoundRobin,
        "queue-depth" | "qd" => ReplicaRead::QueueDepth,
        "isr" => ReplicaRead::Isr,
        other => bail!("--path-policy {other:?}: use round-robin, queue-depth or isr"),
    };
    Ok((addrs, policy))
}

/// `--replicas` and `--replica-read`: at least two distinct addresses, and
/// not together with --addr (which one would be meant?).
fn parse_replicas(o: &JobOpts) -> Result<(Vec<String>, ReplicaRead)> {
    let Some(list) = o.replicas.as_deref() else {
        if let Some(r) = &o.replica_read {
            bail!("--replica-read {r:?} needs --replicas HOST:PORT[/NQN],HOST:PORT[/NQN]");
        }
        return Ok((Vec::new(), ReplicaRead::RoundRobin));
    };
    if o.addr.is_some() {
        bail!("--replicas and --addr both given: name every target in --replicas (the first is listed as the job's address)");
    }
    let addrs = address_list(
        "--replicas",
        list,
        "HOST:PORT[/NQN] targets",
        "replica is a different target",
    )?;
    if let Some(a) = addrs
        .iter()
        .find(|a| a.ends_with('/') || a.starts_with('/'))
    {
        bail!("--replicas {list:?}: {a:?} is not HOST:PORT or HOST:PORT/NQN");
    }
    let read = match o.replica_read.as_deref().unwrap_or("headroom") {
        "headroom" | "credits" => ReplicaRead::Headroom,
        "round-robin" | "rr" => ReplicaRead::RoundRobin,
        other => bail!("--replica-read {other:?}: use headroom or round-robin"),
    };
    Ok((addrs, read))
}

/// The comma-separated list of `flag`: 2 to MAX_REPLICAS non-empty entries
/// (`what`, for the message), none twice ("each {each}").
fn address_list(flag: &str, list: &str, what: &str, each: &str) -> Result<Vec<String>> {
    let addrs: Vec<String> = list.split(',').map(|a| a.trim().to_string()).collect();
    if addrs.len() < 2 || addrs.len() > MAX_REPLICAS || addrs.iter().any(String::is_empty) {
        bail!("{flag} {list:?}: give 2 to {MAX_REPLICAS} comma-separated {what}");
    }
    for (i, a) in addrs.iter().enumerate() {
        if addrs[..i].contains(a) {
            bail!("{flag} {list:?} names {a} twice: each {each}");
        }
    }
    Ok(addrs)
}

pub fn parse_digest(s: &str) -> Result<(bool, bool)> {
    let mut h = false;
    let mut d = false;
    for p in s.split(',').map(str::trim) {
        match p {
            "none" | "" => {}
            "header" | "hdgst" => h = true,
            "data" | "ddgst" => d = true,
            "both" => {
                h = true;
                d = true
            }
            other => bail!("unknown digest {other:?} (none, header, data, header,data)"),
        }
    }
    Ok((h, d))
}

/// Sizes with fio-style binary suffixes: 512, 4k, 128K, 1m, 1GiB. The same
/// grammar as the node's `ByteSize` (the `parse-size` crate in binary mode:
/// every unit a power of 1024, any case, with or without "B"/"iB").
pub fn parse_size(s: &str) -> Result<u64> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .with_context(|| format!("bad size {s:?} (use e.g. 512, 4k, 128K, 1m)"))
}

/// A block size: a size that fits u32 (larger ones are refused by the
/// range check after, instead of wrapping to a small one here).
fn parse_bs(s: &str) -> Result<u32> {
    Ok(u32::try_from(parse_size(s)?).unwrap_or(u32::MAX))
}

pub fn fmt_size(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}m", b >> 20)
    } else if b >= 1024 && b.is_multiple_of(1024) {
        format!("{}k", b >> 10)
    } else {
        b.to_string()
    }
}

/// Durations: a plain number of seconds ("10", "0.5", as fio), or anything
/// `humantime` reads ("500ms", "30s", "2m", "1h 30m"); at most a week.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let s = s.trim();
    let d = match s.parse::<f64>() {
        Ok(secs) if (0.0..=MAX_DURATION.as_secs_f64()).contains(&secs) => {
            Duration::from_secs_f64(secs)
        }
        Ok(_) => bail!("duration {s:?} out of range"),
        Err(_) => humantime::parse_duration(s)
            .with_context(|| format!("bad duration {s:?} (use e.g. 10, 500ms, 30s, 2m)"))?,
    };
    if d > MAX_DURATION {
        bail!("duration {s:?} out of range");
    }
    Ok(d)
}

/// The longest run or ramp accepted.
const MAX_DURATION: Duration = Duration::from_secs(7 * 86400);

fn parse_bssplit(s: &str) -> Result<Vec<(u32, u32)>> {
    let mut v = Vec::new();
    for part in s.split(':') {
        let (b, w) = part
            .split_once('/')
            .with_context(|| format!("bssplit entry {part:?} is not SIZE/PERCENT"))?;
        let w = w
            .trim()
            .parse::<u32>()
            .with_context(|| format!("bssplit entry {part:?}: {w:?} is not a percentage"))?;
        v.push((parse_bs(b)?, w));
    }
    // u64: weights near u32::MAX must not overflow the sum.
    let total: u64 = v.iter().map(|x| x.1 as u64).sum();
    if total != 100 {
        bail!("bssplit percentages add up to {total}, not 100");
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse_like_fio() {
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("128K").unwrap(), 131072);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert!(parse_size("4q").is_err());
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("8days").is_err(), "more than a week");
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("2mb").unwrap(), 2 << 20);
    }

    #[test]
    fn job_file_merges_global_job_and_flags() {
        let dir = std::env::temp_dir().join(format!("trellis-jobs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("j.toml");
        std::fs::write(
            &p,
            r#"
[global]
addr = "127.0.0.1:9999"
runtime = "5"
verify = true
[[job]]
name = "lat"
class = "latency"
tenant = "alice"
rw = "randread"
iodepth = 1
[[job]]
name = "bulk"
rw = "write"
bs = "128k"
iodepth = 8
"#,
        )
        .unwrap();
        let flags = JobOpts {
            runtime: Some("2".into()),
            ..Default::default()
        };
        // Job file keys are the flag names, in either spelling.
        let hy: JobFile = toml::from_str("[global]\nramp-time = \"1\"\nrate-iops = 5\n").unwrap();
        assert_eq!(hy.global.ramp_time.as_deref(), Some("1"));
        assert_eq!(hy.global.rate_iops, Some(5));
        let j = resolve_jobs(Some(&p), &flags).unwrap();
        assert_eq!(j.len(), 2);
        assert_eq!(j[0].name, "lat");
        assert_eq!(j[0].class, Class::Latency);
        assert_eq!(j[0].hostnqn, "nqn.2026-11.io.trellis:tenant:alice");
        assert_eq!(j[1].max_bs(), 128 << 10);
        assert_eq!(j[1].read_pct, 0);
        assert!(j[0].verify && j[1].verify);
        assert_eq!(j[0].addr, "127.0.0.1:9999");
        assert_eq!(
            j[1].runtime,
            Duration::from_secs(2),
            "flags override the file"
        );
    }

    #[test]
    fn bad_options_are_rejected() {
        let bad = |o: JobOpts| resolve(o, 0).is_err();
        assert!(bad(JobOpts {
            rw: Some("randfoo".into()),
            ..Default::default()
        }));
        assert!(bad(JobOpts {
            bs: Some("1000".into()),
            ..Default::default()
        }));
        assert!(bad(JobOpts {
            bssplit: Some("4k/50:8k/40".into()),
            ..Default::default()
        }));
        assert!(bad(JobOpts {
            iodepth: Some(0),
            ..Default::default()
        }));
        assert!(bad(JobOpts {
            digest: Some("hdr".into()),
            ..Default::default()
        }));
    }

    #[test]
    fn out_of_range_values_are_named_with_the_fix() {
        let err = |o: JobOpts| resolve(o, 0).unwrap_err().to_string();
        let e = err(JobOpts {
            iodepth: Some(5000),
            ..Default::default()
        });
        assert!(
            e.contains("--iodepth 5000") && e.contains("use 1 to 4096"),
            "{e}"
        );
        let e = err(JobOpts {
            iodepth: Some(2),
            queues: Some(4),
            ..Default::default()
        });
        assert!(
            e.contains("--queues 4") && e.contains("--queues 2 or less"),
            "{e}"
        );
        // 4 GiB + 512 used to wrap to a 512-byte block size.
        let e = err(JobOpts {
            bs: Some("4294967808".into()),
            ..Default::default()
        });
        assert!(e.contains("up to 4194304"), "{e}");
        // Weights whose sum overflows u32 panicked (debug) or wrapped to 100.
        let e = err(JobOpts {
            bssplit: Some("4k/4294967295:8k/101".into()),
            ..Default::default()
        });
        assert!(e.contains("add up to 4294967396, not 100"), "{e}");
    }
}
