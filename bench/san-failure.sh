#!/usr/bin/env bash
# A link failure under load on the emulated SAN (issue 12): throughput dip and
# recovery time, switched vs switchless (round-robin and ISR), from each run's
# I/O timeline. Needs root. Writes san-failure.json and san-failure.md (see
# bench/san_failure.py).
#
#   bench/san-failure.sh [--out DIR] [--reps N] [--runtime S] [--down-at S] [--outage S]
#
# env: TRELLIS (binary, default target/release/trellis).
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/san-failure extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a directory}; shift ;;
    --reps|--runtime|--down-at|--outage) extra+=("$1" "${2:?$1 needs a value}"); shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "san-failure.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
bin=${TRELLIS:-target/release/trellis}
[ -x "$bin" ] || { echo "san-failure.sh: $bin not found: run cargo build --release -p trellis-cli, or set TRELLIS" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "san-failure.sh: needs root (trellis san makes network namespaces)" >&2; exit 2; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
mkdir -p "$out"
exec python3 bench/san_failure.py --bin "$bin" --out "$out" ${extra[@]+"${extra[@]}"}
