#!/usr/bin/env bash
# Credit-based flow control on an overloaded emulated SSD (issue 14 (b)): three
# tenants at iodepth 128 on one Gimbal namespace, without and with
# `trellis bench --credits`, interleaved; medians of p99.9 and throughput.
# Writes credits.json and credits.md (see bench/credits.py).
#
#   bench/credits.sh [--quick] [--out DIR] [--time-scale N] [--runtime S] [--reps N]
#
# --quick: 2 pairs of 3 s (default 3 pairs of 6 s). env: TRELLIS (binary,
# default target/release/trellis).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0 out=bench/results/credits scale=32 runtime="" reps=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    --time-scale) scale=${2:?--time-scale needs a number}; shift ;;
    --runtime) runtime=${2:?--runtime needs seconds}; shift ;;
    --reps) reps=${2:?--reps needs a count}; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "credits.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$runtime" ] || { [ $quick = 1 ] && runtime=3 || runtime=6; }
[ -n "$reps" ] || { [ $quick = 1 ] && reps=2 || reps=3; }
bin=${TRELLIS:-target/release/trellis}
[ -x "$bin" ] || { echo "credits.sh: $bin not found: run cargo build --release -p trellis-cli, or set TRELLIS" >&2; exit 2; }
mkdir -p "$out"
# shellcheck source=../tests/bench-lib.sh
. tests/bench-lib.sh
port=$(free_port 15480)
exec python3 bench/credits.py --bin "$bin" --out "$out" --port "$port" \
  --time-scale "$scale" --runtime "$runtime" --reps "$reps"
