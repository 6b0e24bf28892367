//! Stand-in for `trellis sim ...` until crates/app/cli wires it in.
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "trellis-sim-dev",
    about = "Trellis SAN simulator (dev entry point for `trellis sim`)"
)]
struct Cli {
    #[command(flatten)]
    args: trellis_sim::cli::SimArgs,
}

fn main() -> anyhow::Result<()> {
    trellis_sim::cli::run(Cli::parse().args)
}
