#!/bin/sh
# Simulator benchmark: events/s per core and memory per simulated node (JSON output).
# Not a test: wall-clock figures depend on the machine.
set -e
cd "$(dirname "$0")/../.."
cargo build --release -p trellis-sim --bin trellis-sim-dev
exec target/release/trellis-sim-dev bench --out "${1:-bench/sim/results.json}"
