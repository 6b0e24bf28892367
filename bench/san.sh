#!/usr/bin/env bash
# Path choice on the emulated switchless SAN (issue 12): a second tenant
# streams 128 KiB reads over one path of the 2x2 torus while the measured
# tenant reads 4 KiB at random over the single path, round-robin over 4, or
# with ISR; interleaved reps, medians. Needs root (trellis san). Writes
# san.json, san.md and san-cdf.svg (see bench/san.py).
#
#   bench/san.sh [--quick] [--out DIR] [--reps N] [--runtime S] [--rate 1gbit]
#
# --quick: 1 rep of 2 s (default 5 reps of 4 s). env: TRELLIS (binary,
# default target/release/trellis).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0 out=bench/results/san runtime="" reps="" rate=1gbit
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    --runtime) runtime=${2:?--runtime needs seconds}; shift ;;
    --reps) reps=${2:?--reps needs a count}; shift ;;
    --rate) rate=${2:?--rate needs a rate, e.g. 1gbit}; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "san.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$runtime" ] || { [ $quick = 1 ] && runtime=2 || runtime=4; }
[ -n "$reps" ] || { [ $quick = 1 ] && reps=1 || reps=5; }
bin=${TRELLIS:-target/release/trellis}
[ -x "$bin" ] || { echo "san.sh: $bin not found: run cargo build --release -p trellis-cli, or set TRELLIS" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "san.sh: needs root (trellis san makes network namespaces)" >&2; exit 2; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
mkdir -p "$out"
exec python3 bench/san.py --bin "$bin" --out "$out" --runtime "$runtime" --reps "$reps" --rate "$rate"
