#!/usr/bin/env bash
# Runs each cargo-fuzz target for N seconds (default 20). cargo-fuzz needs
# nightly-only compiler flags; the machine has one stable toolchain, so
# RUSTC_BOOTSTRAP=1 lets stable accept them (for the fuzz build only).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "installing cargo-fuzz"
  cargo install cargo-fuzz --locked --quiet
fi
export RUSTC_BOOTSTRAP=1
for t in $(cd fuzz && cargo fuzz list); do
  echo "fuzz target $t: ${secs}s"
  (cd fuzz && cargo fuzz run "$t" -- -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 2>&1 | tail -5)
done
