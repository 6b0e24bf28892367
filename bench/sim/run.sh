#!/bin/sh
# Simulator benchmark: events/s per core and memory per simulated node (JSON output).
# Not a test: wall-clock figures depend on the machine.
set -e
cd "$(dirname "$0")/../.."
cargo build --release -p trellis-cli
exec "${CARGO_TARGET_DIR:-target}"/release/trellis sim bench --out "${1:-bench/sim/results.json}"
