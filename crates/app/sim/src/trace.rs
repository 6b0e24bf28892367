//! Block-trace parsers: MQSim ASCII, SPC (UMass) CSV, SNIA/MSR Cambridge CSV.

use anyhow::{bail, Context, Result};
use std::sync::Arc;
use trellis_units::IoDir;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRec {
    pub t_ns: u64,
    pub device: u32,
    pub offset_bytes: u64,
    pub size_bytes: u32,
    pub op: IoDir,
}

const WSRCH: &str = include_str!("../data/wsrch-sample.trace");
const TPCC: &str = include_str!("../data/tpcc-sample.trace");

/// Load a trace; `builtin:wsrch` and `builtin:tpcc` are compiled in.
pub fn load(path: &str, format: &str) -> Result<Arc<Vec<TraceRec>>> {
    let text = match path {
        "builtin:wsrch" => WSRCH.to_string(),
        "builtin:tpcc" => TPCC.to_string(),
        p => std::fs::read_to_string(p).with_context(|| format!("reading trace {p}"))?,
    };
    let fmt = if path.starts_with("builtin:") {
        "mqsim"
    } else {
        format
    };
    let mut recs = parse(&text, fmt)?;
    recs.sort_by_key(|r| r.t_ns);
    Ok(Arc::new(recs))
}

pub fn parse(text: &str, format: &str) -> Result<Vec<TraceRec>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let rec = match format {
            "mqsim" => parse_mqsim(line),
            "spc" => parse_spc(line),
            "msr" | "snia" => parse_msr(line),
            f => bail!("unknown trace format {f} (mqsim, spc, msr)"),
        };
        match rec {
            Ok(r) => out.push(r),
            // CSV headers and comments: skip the first line if it does not parse.
            Err(_) if i == 0 => continue,
            Err(e) => return Err(e.context(format!("line {}", i + 1))),
        }
    }
    Ok(out)
}

/// `arrival_ns device lba_512 size_512 type(0=write,1=read)`.
fn parse_mqsim(line: &str) -> Result<TraceRec> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 5 {
        bail!("mqsim line needs 5 fields");
    }
    Ok(TraceRec {
        t_ns: f[0].parse()?,
        device: f[1].parse()?,
        offset_bytes: f[2].parse::<u64>()? * 512,
        size_bytes: f[3].parse::<u32>()? * 512,
        op: if f[4] == "1" {
            IoDir::Read
        } else {
            IoDir::Write
        },
    })
}

/// SPC: `ASU,LBA(512 B),Size(bytes),Opcode(r|w),Timestamp(s)`.
fn parse_spc(line: &str) -> Result<TraceRec> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() < 5 {
        bail!("SPC line needs 5 fields");
    }
    Ok(TraceRec {
        t_ns: (f[4].parse::<f64>()? * 1e9) as u64,
        device: f[0].parse()?,
        offset_bytes: f[1].parse::<u64>()? * 512,
        size_bytes: f[2].parse()?,
        op: if f[3].eq_ignore_ascii_case("r") {
            IoDir::Read
        } else {
            IoDir::Write
        },
    })
}

/// SNIA/MSR: `Timestamp(100 ns ticks),Hostname,DiskNumber,Type(Read|Write),Offset,Size,ResponseTime`.
fn parse_msr(line: &str) -> Result<TraceRec> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() < 6 {
        bail!("MSR line needs at least 6 fields");
    }
    Ok(TraceRec {
        t_ns: f[0].parse::<u64>()? * 100,
        device: f[2].parse()?,
        offset_bytes: f[4].parse()?,
        size_bytes: f[5].parse()?,
        op: if f[3].eq_ignore_ascii_case("read") {
            IoDir::Read
        } else {
            IoDir::Write
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_three_formats() {
        let m = parse("11413000 0 657728 16 1\n", "mqsim").unwrap();
        assert_eq!(
            m[0],
            TraceRec {
                t_ns: 11_413_000,
                device: 0,
                offset_bytes: 657_728 * 512,
                size_bytes: 8192,
                op: IoDir::Read
            }
        );
        let s = parse(
            "ASU,LBA,Size,Opcode,Timestamp\n0,303567,3584,w,0.000000\n1,55590,4096,R,0.5\n",
            "spc",
        )
        .unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[1].t_ns, s[1].op, s[1].size_bytes),
            (500_000_000, IoDir::Read, 4096)
        );
        let r = parse(
            "128166372003061629,wdev,0,Write,3221225472,4096,1342\n",
            "msr",
        )
        .unwrap();
        assert_eq!(
            (r[0].op, r[0].offset_bytes, r[0].t_ns),
            (IoDir::Write, 3_221_225_472, 12_816_637_200_306_162_900)
        );
    }

    #[test]
    fn builtin_samples_load() {
        let w = load("builtin:wsrch", "").unwrap();
        assert_eq!(w.len(), 3000);
        assert!(
            w.iter().filter(|r| r.op == IoDir::Read).count() >= 2_970,
            "WebSearch is ~100% reads"
        );
        let t = load("builtin:tpcc", "").unwrap();
        assert!(t.iter().any(|r| r.op == IoDir::Write));
    }
}
