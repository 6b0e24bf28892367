//! `trellis`: one binary for the storage node daemon, the load generator,
//! the SAN simulator and the emulated SAN.

mod cdc_cmd;
mod ctl_cmd;
mod ctl_disc_cmd;
mod target_cmd;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "trellis", version, about = "Trellis: NVMe/TCP storage fabric")]
struct Cli {
    /// Log filter (tracing env-filter syntax), e.g. "info" or "trellis_node=debug".
    #[arg(long, global = true, env = "TRELLIS_LOG", default_value = "info")]
    log: String,
    #[command(subcommand)]
    cmd: Cmd,
}

// Parsed once at startup: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the storage node: an NVMe/TCP target (defaults: 1 GiB RAM namespace on 127.0.0.1:4420, discovery on 4420 and 8009).
    Target(target_cmd::TargetArgs),
    /// Load generator (fio-like) against an NVMe/TCP target, with JSON results.
    Bench(trellis_bench::cli::BenchArgs),
    /// Discrete-event SAN simulator: switched vs switchless, mechanisms, cost.
    Sim(trellis_sim::cli::SimArgs),
    /// Emulated SAN on this machine (network namespaces, root): the 4-node
    /// testbed switched or as a 2x2 torus, a target in every storage node.
    San(trellis_san::cli::SanArgs),
    /// Manage a running target over its management socket (JSON-RPC 2.0):
    /// `trellis ctl ana get`, `trellis ctl ana set --listener ... --group ... --state ...`.
    Ctl(ctl_cmd::CtlArgs),
    /// Central discovery controller: follows storage nodes' discovery
    /// controllers (`--node`, repeatable) and serves their merged log, with
    /// change notices, on one discovery address (docs/target.md).
    Cdc(cdc_cmd::CdcArgs),
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: logs collected by CI or systemd stay plain.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let r = match cli.cmd {
        Cmd::Target(a) => target_cmd::run(a),
        Cmd::Bench(a) => trellis_bench::cli::run(a),
        Cmd::San(a) => trellis_san::cli::run(a),
        Cmd::Ctl(a) => ctl_cmd::run(a),
        Cmd::Cdc(a) => cdc_cmd::run(a),
        Cmd::Sim(a) => {
            // The simulator only prints reports and writes files: like other
            // Unix report tools, `trellis sim ... | head` ends quietly when
            // the reader goes away instead of panicking in println!. (Not for
            // target or bench: their sockets must see EPIPE as an error.)
            // SAFETY: called before any other thread of this command exists;
            // SIG_DFL is a valid disposition for SIGPIPE.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            }
            trellis_sim::cli::run(a)
        }
    };
    if let Err(e) = r {
        eprintln!("trellis: {e:#}");
        std::process::exit(1);
    }
}
