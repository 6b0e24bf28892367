//! `trellis bench`: command-line surface. The `trellis` binary (crates/app/cli)
//! flattens [`BenchArgs`] into its `bench` subcommand and calls [`run`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::job::{resolve_jobs, JobOpts};
use crate::report::human_table;
use crate::runner::{run_jobs, RunOpts};
use crate::suite::SuiteArgs;

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub cmd: Option<BenchCmd>,
    /// TOML job file: a [global] table and [[job]] entries with the same
    /// option names as the flags (flags override the file).
    #[arg(long = "jobs", value_name = "FILE.toml")]
    pub jobs: Option<PathBuf>,
    #[command(flatten)]
    pub opts: JobOpts,
    /// Write per-job results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Keep Alive Timeout in ms (0 = no keep-alive).
    #[arg(long = "kato-ms", alias = "kato_ms", default_value_t = 10_000)]
    pub kato_ms: u32,
    /// Per-command timeout in ms; a command outstanding longer fails its queue.
    #[arg(
        long = "cmd-timeout-ms",
        alias = "cmd_timeout_ms",
        default_value_t = 10_000
    )]
    pub cmd_timeout_ms: u64,
    /// CPUs to pin worker threads to, e.g. 1 or 2,3 (round-robin).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// Host stack: `plain` (a thread per worker, today's stack) or
    /// `blk-switch` (per-core, per-class queues; latency-class jobs first;
    /// steering; docs/host.md "Class isolation").
    #[arg(long, default_value = "plain")]
    pub stack: String,
    /// With --stack blk-switch: priority, request-steering or app-steering
    /// (blk-switch's `blk_switch_on` 0, 1, 2).
    #[arg(
        long = "switch-level",
        alias = "switch_level",
        default_value = "app-steering"
    )]
    pub switch_level: String,
    /// With --stack blk-switch: i10 doorbell delay of throughput caravans in
    /// µs (below 25: no batching).
    #[arg(long = "doorbell-us", alias = "doorbell_us", default_value_t = 50)]
    pub doorbell_us: u64,
    /// Never show the live progress line (it is shown only on a terminal anyway).
    #[arg(long = "no-progress", alias = "no_progress")]
    pub no_progress: bool,
    /// NVMe/TCP TLS 1.3 on every queue with this configured PSK
    /// (`NVMeTLSkey-1:01:...:`, as `nvme gen-tls-key` prints); the TLS PSK is
    /// derived per (host NQN, subsystem NQN) as nvme-cli does.
    #[arg(long = "tls-key", value_name = "KEY")]
    pub tls_key: Option<String>,
    /// With --tls-key: spec (default) or libnvme-compat (the HKDF label layout
    /// of libnvme before its 2025 fix; docs/target.md "TLS").
    #[arg(long = "tls-derivation", default_value = "spec")]
    pub tls_derivation: String,
    /// DH-HMAC-CHAP secret (`DHHC-1:..`, as `nvme gen-dhchap-key` prints):
    /// every queue the target asks to authenticate does.
    #[arg(long = "dhchap-secret", value_name = "SECRET")]
    pub dhchap_secret: Option<String>,
    /// With --dhchap-secret: the controller's DH-HMAC-CHAP secret; every
    /// queue then authenticates the controller too (bidirectional) and
    /// fails when the controller's response is wrong.
    #[arg(long = "dhchap-ctrl-secret", value_name = "SECRET")]
    pub dhchap_ctrl_secret: Option<String>,
}

#[derive(clap::Subcommand, Debug)]
pub enum BenchCmd {
    /// The benchmark suite against `trellis target` and the raw TCP baseline.
    Suite(SuiteArgs),
    /// Processor-node takeover under a verified workload: host A writes,
    /// is killed or frozen, host B takes the namespace over with Preempt
    /// and Abort; checks that no acknowledged write of A is lost and none
    /// of A's lands after the takeover (docs/bench.md).
    Takeover(crate::takeover::TakeoverArgs),
    /// Raw TCP baseline server (busy-polling echo-style responder).
    BaselineServer {
        /// Address to listen on, HOST:PORT.
        #[arg(long, default_value = "127.0.0.1:4499")]
        listen: String,
    },
    /// Raw TCP baseline client.
    BaselineClient {
        /// Baseline server address, HOST:PORT.
        #[arg(long, default_value = "127.0.0.1:4499")]
        addr: String,
        /// Payload per request, e.g. 4k, 128k.
        #[arg(long, default_value = "4k")]
        bs: String,
        /// Requests in flight.
        #[arg(long, default_value_t = 1)]
        iodepth: u32,
        /// Send the payload (write-like) instead of receiving it.
        #[arg(long)]
        write: bool,
        /// Measured duration: 5, 5s, 500ms, 1m.
        #[arg(long, default_value = "5")]
        runtime: String,
        /// Warm-up before measuring.
        #[arg(long = "ramp-time", alias = "ramp_time", default_value = "1")]
        ramp_time: String,
        /// Write the result as JSON to FILE (the path is checked first).
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
    },
}

pub fn run(args: BenchArgs) -> Result<()> {
    match args.cmd {
        Some(BenchCmd::Suite(s)) => crate::suite::run(&s, &self_prefix()),
        Some(BenchCmd::Takeover(t)) => crate::takeover::run(&t),
        Some(BenchCmd::BaselineServer { listen }) => crate::baseline::serve(&listen),
        Some(BenchCmd::BaselineClient {
            addr,
            bs,
            iodepth,
            write,
            runtime,
            ramp_time,
            json,
        }) => {
            if let Some(p) = &json {
                check_output_path(p)?;
            }
            let r = crate::baseline::run_client(&crate::baseline::ClientOpts {
                addr,
                bs: crate::job::parse_size(&bs)? as u32,
                iodepth,
                write,
                runtime: crate::job::parse_duration(&runtime)?,
                ramp: crate::job::parse_duration(&ramp_time)?,
            })?;
            println!(
                "baseline {} bs {} qd {}: {:.0} IOPS, {:.1} MiB/s, p50 {:.1} µs, p99 {:.1} µs",
                if write { "write" } else { "read" },
                bs,
                iodepth,
                r.iops,
                r.mib_per_s,
                r.lat.lat_us_p50,
                r.lat.lat_us_p99
            );
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&r)?)
                    .with_context(|| format!("writing the result to {}", p.display()))?;
            }
            Ok(())
        }
        None => run_bench(args),
    }
}

/// `--tls-key` and `--tls-derivation` as the host library's TLS setup.
fn tls_opts(args: &BenchArgs) -> Result<Option<trellis_host::HostTls>> {
    use trellis_nvme::tls_psk::{ConfiguredPsk, Derivation};
    let derivation = match args.tls_derivation.as_str() {
        "spec" => Derivation::Spec,
        "libnvme-compat" => Derivation::LibnvmeCompat,
        o => bail!("--tls-derivation {o:?}: use spec or libnvme-compat"),
    };
    let Some(k) = &args.tls_key else {
        if args.tls_derivation != "spec" {
            bail!("--tls-derivation needs --tls-key");
        }
        return Ok(None);
    };
    let key = ConfiguredPsk::parse(k).map_err(|e| anyhow::anyhow!("--tls-key: {e}"))?;
    let mut t = trellis_host::HostTls::new(key);
    t.derivation = derivation;
    Ok(Some(t))
}

/// `--dhchap-secret` and `--dhchap-ctrl-secret` as the host library's secrets.
type DhchapSecrets = (
    Option<trellis_nvme::dhchap::Secret>,
    Option<trellis_nvme::dhchap::Secret>,
);
fn dhchap_opts(args: &BenchArgs) -> Result<DhchapSecrets> {
    let parse = |flag: &str, s: &Option<String>| {
        s.as_deref()
            .map(|s| {
                trellis_nvme::dhchap::Secret::parse(s).map_err(|e| {
                    anyhow::anyhow!(
                        "{flag}: {e} (use a DHHC-1:..: secret as nvme gen-dhchap-key prints)"
                    )
                })
            })
            .transpose()
    };
    let host = parse("--dhchap-secret", &args.dhchap_secret)?;
    let ctrl = parse("--dhchap-ctrl-secret", &args.dhchap_ctrl_secret)?;
    if ctrl.is_some() && host.is_none() {
        bail!("--dhchap-ctrl-secret needs --dhchap-secret (the host authenticates first)");
    }
    Ok((host, ctrl))
}

fn run_bench(args: BenchArgs) -> Result<()> {
    let jobs = resolve_jobs(args.jobs.as_deref(), &args.opts)?;
    // Checked before the run: a typo must not cost the results of a long one.
    if let Some(p) = &args.json {
        check_output_path(p)?;
    }
    let (dhchap_secret, dhchap_ctrl_secret) = dhchap_opts(&args)?;
    let mut opts = RunOpts {
        kato_ms: args.kato_ms,
        command_timeout: Duration::from_millis(args.cmd_timeout_ms),
        cpus: args.cpus.clone(),
        stack: stack_opts(&args)?,
        tls: tls_opts(&args)?,
        dhchap_secret,
        dhchap_ctrl_secret,
        ..Default::default()
    };
    if args.no_progress {
        opts.progress = false;
    }
    on_signals_stop(&opts.interrupted)?;
    let report = run_jobs(&jobs, &opts)?;
    print!("{}", human_table(&report));
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing the results to {}", p.display()))?;
    }
    if report.interrupted {
        bail!("interrupted: the results above are partial (\"partial\": true in the JSON)");
    }
    if let Some(j) = report.jobs.iter().find(|j| j.partial) {
        bail!(
            "job {} stopped after {:.2} s: {}; the results above cover the I/O done until then (\"partial\": true in the JSON)",
            j.name,
            j.runtime_s,
            j.first_error.as_deref().unwrap_or("a queue failed")
        );
    }
    let errors: u64 = report.jobs.iter().map(|j| j.errors).sum();
    let verify: u64 = report.jobs.iter().map(|j| j.verify_failures).sum();
    if verify > 0 {
        let first = report
            .jobs
            .iter()
            .flat_map(|j| j.verify_failure_samples.first())
            .next()
            .map(|f| f.to_string())
            .unwrap_or_default();
        bail!(
            "data integrity failure: {verify} block(s) failed verification; first: {first}{}",
            null_hint(&report)
        );
    }
    if errors > 0 {
        bail!("{errors} I/O error(s)");
    }
    if report.jobs.iter().any(|j| j.ios == 0) {
        bail!("a job completed no I/O");
    }
    Ok(())
}

/// `--stack`, `--switch-level`, `--doorbell-us`.
fn stack_opts(args: &BenchArgs) -> Result<Option<crate::switch_run::SwitchOpts>> {
    const DOORBELL_US_MAX: u64 = 10_000;
    match args.stack.as_str() {
        "plain" => Ok(None),
        "blk-switch" => {
            if args.doorbell_us > DOORBELL_US_MAX {
                bail!(
                    "--doorbell-us {} is too long: at most {DOORBELL_US_MAX} (i10 uses 50)",
                    args.doorbell_us
                );
            }
            Ok(Some(crate::switch_run::SwitchOpts {
                level: crate::switch_run::parse_level(&args.switch_level)?,
                doorbell_us: args.doorbell_us,
            }))
        }
        other => bail!("--stack {other:?} is not a host stack: use plain or blk-switch"),
    }
}

/// Fails, naming the path, if the results could not be written there: the
/// directory must exist and the file be creatable. Leaves nothing behind.
pub(crate) fn check_output_path(p: &std::path::Path) -> Result<()> {
    let existed = p.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(p)
        .with_context(|| {
            format!(
                "cannot write results to {}: give --json a path in an existing, writable directory",
                p.display()
            )
        })?;
    if !existed {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// SIGINT and SIGTERM stop the run, which then prints and writes what it
/// has; a second signal ends the process at once (exit 1), as usual.
fn on_signals_stop(flag: &std::sync::Arc<std::sync::atomic::AtomicBool>) -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    for sig in [SIGINT, SIGTERM] {
        // Order matters: the conditional exit sees the flag set by the first signal.
        signal_hook::flag::register_conditional_shutdown(sig, 1, flag.clone())?;
        signal_hook::flag::register(sig, flag.clone())?;
    }
    Ok(())
}

/// Blocks that read back without any verify header were never stored: the
/// likeliest cause is a null namespace, which discards writes.
fn null_hint(r: &crate::report::RunReport) -> &'static str {
    let samples = || r.jobs.iter().flat_map(|j| &j.verify_failure_samples);
    if samples().next().is_some() && samples().all(|f| f.found_generation.is_none()) {
        " (the blocks read back hold no data the bench wrote: a null namespace discards writes, so --verify needs a ram, file or emulated namespace)"
    } else {
        ""
    }
}

/// How this process was invoked up to the bench command, so the suite can
/// start `<prefix> baseline-server` (works for both `trellis bench suite`
/// and `trellis-bench-dev suite`).
fn self_prefix() -> Vec<String> {
    let args: Vec<String> = std::env::args().collect();
    let pos = args.iter().position(|a| a == "suite").unwrap_or(1);
    let mut v = args[..pos].to_vec();
    if let Ok(exe) = std::env::current_exe() {
        v[0] = exe.to_string_lossy().into_owned();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Top {
        #[command(flatten)]
        args: BenchArgs,
    }

    #[test]
    fn flags_use_fio_names_and_the_command_is_well_formed() {
        Top::command().debug_assert();
        let t = Top::try_parse_from([
            "t",
            "--rw",
            "randrw",
            "--bs",
            "4k",
            "--iodepth",
            "32",
            "--numjobs",
            "2",
            "--runtime",
            "5",
            "--ramp_time",
            "1",
            "--rate_iops",
            "1000",
            "--rwmixread",
            "70",
            "--verify",
            "--addr",
            "127.0.0.1:4420",
            "--nqn",
            "nqn.x",
            "--hostnqn",
            "nqn.h",
            "--queues",
            "2",
            "--digest",
            "header,data",
            "--json",
            "out.json",
            "--class",
            "latency",
            "--tenant",
            "alice",
        ])
        .unwrap();
        let o = &t.args.opts;
        assert_eq!(o.verify.as_deref(), Some("crc32c"));
        assert_eq!(o.rate_iops, Some(1000));
        assert_eq!(o.ramp_time.as_deref(), Some("1"));
        let t = Top::try_parse_from(["t", "suite", "--smoke", "--target_cmd", ""]).unwrap();
        assert!(matches!(t.args.cmd, Some(BenchCmd::Suite(ref s)) if s.smoke));
    }

    /// Hyphens are the canonical spelling (as in `target` and `sim`); the
    /// underscore spellings that bench/*.sh, bench/fairness.py and
    /// tests/bench-nvmet.sh use must keep working, with the same meaning.
    #[test]
    fn hyphenated_flags_and_their_underscore_aliases_mean_the_same() {
        let pairs = [
            ("--ramp-time", "--ramp_time", "1s"),
            ("--rate-iops", "--rate_iops", "5"),
            ("--kato-ms", "--kato_ms", "7"),
            ("--cmd-timeout-ms", "--cmd_timeout_ms", "9"),
        ];
        for (hy, us, v) in pairs {
            let a = Top::try_parse_from(["t", hy, v]).unwrap();
            let b = Top::try_parse_from(["t", us, v]).unwrap();
            assert_eq!(
                format!("{:?}", a.args),
                format!("{:?}", b.args),
                "{hy} vs {us}"
            );
        }
        let a = Top::try_parse_from(["t", "--no-progress"]).unwrap();
        let b = Top::try_parse_from(["t", "--no_progress"]).unwrap();
        assert!(a.args.no_progress && b.args.no_progress);
        let suite = |flags: &[&str]| {
            let mut v = vec!["t", "suite"];
            v.extend_from_slice(flags);
            match Top::try_parse_from(v).unwrap().args.cmd {
                Some(BenchCmd::Suite(s)) => format!("{s:?}"),
                other => panic!("not the suite: {other:?}"),
            }
        };
        let hy = [
            "--target-cmd",
            "x",
            "--target-pid",
            "3",
            "--target-cpu",
            "1",
        ];
        let us = [
            "--target_cmd",
            "x",
            "--target_pid",
            "3",
            "--target_cpu",
            "1",
        ];
        assert_eq!(suite(&hy), suite(&us));
        let hy = [
            "--client-cpu",
            "2",
            "--ramp-time",
            "3",
            "--baseline-port",
            "5",
        ];
        let us = [
            "--client_cpu",
            "2",
            "--ramp_time",
            "3",
            "--baseline_port",
            "5",
        ];
        assert_eq!(suite(&hy), suite(&us));
    }
}
