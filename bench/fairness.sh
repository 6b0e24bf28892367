#!/usr/bin/env bash
# Interference and fairness on an emulated SSD, QoS off vs Gimbal: the
# Gimbal paper's appendix D cases (docs/sources.md), then fairness restored. For each case
# of bench/jobs/fairness/*.toml and each mode (off, gimbal) it runs the
# tenants together, and each tenant alone (its standalone bandwidth, in the
# same mode and device state), each tenant a `trellis bench` job with its own
# host NQN. Writes fairness.json and fairness.md. See docs/bench.md
# "Fairness" for the metrics and the acceptance rules.
#
#   bench/fairness.sh [--quick] [--out DIR] [--time-scale N] [--runtime S] [--reactors N] [--weight NAME=W]... [--case C]...
#
# --quick: 3 s runs (default 8 s), for CI. --time-scale: the emulated drive's
# slow-down (default 32: the drive, not the 2-core VM's CPU, is the
# bottleneck; docs/ssd-model.md). --reactors: target reactors (default 1; all on
# CPU 1, each tenant with a queue pair per reactor). --weight: a tenant's Gimbal weight
# (default 1). env: TRELLIS (binary, default target/release/trellis).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0 out=bench/results/fairness scale=32 runtime="" reactors=1 weights=() cases=()
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    --time-scale) scale=${2:?--time-scale needs a number}; shift ;;
    --runtime) runtime=${2:?--runtime needs seconds}; shift ;;
    --reactors) reactors=${2:?--reactors needs a number}; shift ;;
    --weight) weights+=("${2:?--weight needs NAME=W}"); shift ;;
    --case) cases+=("${2:?--case needs intensity, size, pattern_rand or pattern_seq}"); shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "fairness.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$runtime" ] || { [ $quick = 1 ] && runtime=3 || runtime=8; }
bin=${TRELLIS:-target/release/trellis}
[ -x "$bin" ] || { echo "fairness.sh: $bin not found: run cargo build --release -p trellis-cli, or set TRELLIS" >&2; exit 2; }
mkdir -p "$out"
# shellcheck source=../tests/bench-lib.sh
. tests/bench-lib.sh
port=$(free_port 15440)
exec python3 bench/fairness.py --bin "$bin" --out "$out" --port "$port" \
  --time-scale "$scale" --runtime "$runtime" --quick "$quick" --reactors "$reactors" ${weights[@]/#/--weight=} ${cases[@]/#/--case=}
