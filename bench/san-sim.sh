#!/usr/bin/env bash
# The emulated SAN beside the simulator (issue 12): 4 KiB random reads to one
# storage node at QD 1, 4, 16, 64, switched and switchless, on `trellis san`
# and in `trellis sim` with the emulator's parameters. Needs root. Writes
# san-sim.json and san-sim.md (see bench/san_sim.py).
#
#   bench/san-sim.sh [--out DIR] [--runtime S] [--qds 1,4,16,64]
#
# env: TRELLIS (binary, default target/release/trellis).
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/san-sim runtime=3 qds=1,4,16,64
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a directory}; shift ;;
    --runtime) runtime=${2:?--runtime needs seconds}; shift ;;
    --qds) qds=${2:?--qds needs a list, e.g. 1,4,16}; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "san-sim.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
bin=${TRELLIS:-target/release/trellis}
[ -x "$bin" ] || { echo "san-sim.sh: $bin not found: run cargo build --release -p trellis-cli, or set TRELLIS" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "san-sim.sh: needs root (trellis san makes network namespaces)" >&2; exit 2; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
mkdir -p "$out"
exec python3 bench/san_sim.py --bin "$bin" --out "$out" --runtime "$runtime" --qds "$qds"
