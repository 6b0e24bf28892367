#!/usr/bin/env bash
# Replica choice by Gimbal's virtual view (issue 14 (c)): a volume replicated on
# two emulated SSDs with Gimbal, replica B loaded by a second tenant; the app's
# reads by round-robin and by headroom (credits − in flight), interleaved;
# medians of the app's p99.9. Writes replicas.json and replicas.md (see
# bench/replicas.py).
#
#   bench/replicas.sh [--quick] [--out DIR] [--time-scale N] [--runtime S] [--reps N]
#
# --quick: 2 pairs of 3 s (default 3 pairs of 6 s). env: TRELLIS (binary,
# default target/release/trellis).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0 out=bench/results/replicas scale=32 runtime="" reps=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    --time-scale) scale=${2:?--time-scale needs a number}; shift ;;
    --runtime) runtime=${2:?--runtime needs seconds}; shift ;;
    --reps) reps=${2:?--reps needs a count}; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "replicas.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$runtime" ] || { [ $quick = 1 ] && runtime=3 || runtime=6; }
[ -n "$reps" ] || { [ $quick = 1 ] && reps=2 || reps=3; }
bin=${TRELLIS:-target/release/trellis}
[ -x "$bin" ] || { echo "replicas.sh: $bin not found: run cargo build --release -p trellis-cli, or set TRELLIS" >&2; exit 2; }
mkdir -p "$out"
# shellcheck source=../tests/bench-lib.sh
. tests/bench-lib.sh
port=$(free_port 15490)
exec python3 bench/replicas.py --bin "$bin" --out "$out" --port "$port" \
  --time-scale "$scale" --runtime "$runtime" --reps "$reps"
