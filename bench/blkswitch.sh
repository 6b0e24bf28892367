#!/usr/bin/env bash
# blk-switch's interference experiment (issue 14 (a)): one L-app (4 KiB QD1)
# beside T-apps (128 KiB QD32) with `--stack plain` and `--stack blk-switch`,
# each app alone and all together, stacks interleaved; medians. Writes
# blkswitch.json, blkswitch.md and blkswitch-cdf.svg (see bench/blkswitch.py).
#
#   bench/blkswitch.sh [--quick] [--out DIR] [--reps N] [--runtime S] [--tapps 1|2]
#                      [--send-budget SIZE] [--addr HOST:PORT --nqn NQN]
#
# --quick: 2 reps of 2 s (default 5 reps of 4 s). --addr: an external target
# (Linux nvmet) instead of a fresh `trellis target`. env: TRELLIS (binary,
# default target/release/trellis).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0 out=bench/results/blkswitch runtime="" reps="" extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    --runtime) runtime=${2:?--runtime needs seconds}; shift ;;
    --reps) reps=${2:?--reps needs a count}; shift ;;
    --tapps|--send-budget|--addr|--nqn) extra+=("$1" "${2:?$1 needs a value}"); shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "blkswitch.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$runtime" ] || { [ $quick = 1 ] && runtime=2 || runtime=4; }
[ -n "$reps" ] || { [ $quick = 1 ] && reps=2 || reps=5; }
bin=${TRELLIS:-target/release/trellis}
[ -x "$bin" ] || { echo "blkswitch.sh: $bin not found: run cargo build --release -p trellis-cli, or set TRELLIS" >&2; exit 2; }
mkdir -p "$out"
# shellcheck source=../tests/bench-lib.sh
. tests/bench-lib.sh
port=$(free_port 15520)
metrics_port=$(free_port 15521)
exec python3 bench/blkswitch.py --bin "$bin" --out "$out" --port "$port" --metrics-port "$metrics_port" \
  --runtime "$runtime" --reps "$reps" ${extra[@]+"${extra[@]}"}
