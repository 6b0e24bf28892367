//! Development entry point until `trellis bench` is wired into crates/app/cli:
//! `trellis-bench-dev [bench flags]` behaves exactly like `trellis bench`.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "trellis-bench-dev",
    about = "trellis bench (development binary)"
)]
struct Cli {
    #[command(flatten)]
    args: trellis_bench::cli::BenchArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match trellis_bench::cli::run(cli.args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
