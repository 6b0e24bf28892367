#!/usr/bin/env bash
# The study on the emulated SAN (issue 12, item 4): 4 KiB random reads and
# 128 KiB sequential writes to one storage node, QD sweeps from light to past
# the knee, switched (one path) vs switchless (2x2 torus, 4 paths, ISR), with
# and without a second tenant on one path; every point also in `trellis sim`
# with the emulator's parameters. Needs root. Writes san-study.json,
# san-study.md and san-study.svg (see bench/san_study.py).
#
#   bench/san-study.sh [--quick] [--out DIR] [--reps N] [--runtime S] [--qds 1,4,16]
#                      [--time-scale N]  (emulated drives N times slower; see san_study.py)
#
# Default: 3 reps of 3 s, QD 1,4,16,64,128,256 (reads), 1,4,16,64,128 (writes),
# 1 s simulated per point, about 12 minutes. --quick: QD 16 only, 1 rep of
# 1 s, 50 ms simulated (CI: 66-san-study-quick.sh). Takes the SAN test lock
# (/run/lock/trellis-san-test.lock) unless TRELLIS_SAN_LOCK_HELD=1 says the
# caller holds it.
# env: TRELLIS (binary, default target/release/trellis).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0 out=bench/results/san-study runtime="" reps="" qds="" simms="" scale=1
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    --runtime) runtime=${2:?--runtime needs seconds}; shift ;;
    --reps) reps=${2:?--reps needs a count}; shift ;;
    --qds) qds=${2:?--qds needs a list, e.g. 1,4,16}; shift ;;
    --time-scale) scale=${2:?--time-scale needs a factor}; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "san-study.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ $quick = 1 ]; then
  : "${runtime:=1}" "${reps:=1}" "${qds:=16}" "${simms:=50}"
else
  : "${runtime:=3}" "${reps:=3}" "${simms:=1000}"
fi
bin=${TRELLIS:-target/release/trellis}
[ -x "$bin" ] || { echo "san-study.sh: $bin not found: run cargo build --release -p trellis-cli, or set TRELLIS" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "san-study.sh: needs root (trellis san makes network namespaces)" >&2; exit 2; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
# One `trellis san` at a time on a machine (fixed tsan-* names): the same lock
# as the test suite's 65-san.sh.
if [ "${TRELLIS_SAN_LOCK_HELD:-}" != 1 ]; then
  lockdir=/run/lock; [ -d "$lockdir" ] && [ -w "$lockdir" ] || lockdir=/tmp
  exec 9>"$lockdir/trellis-san-test.lock"
  flock 9
fi
mkdir -p "$out"
exec python3 bench/san_study.py --bin "$bin" --out "$out" --runtime "$runtime" --reps "$reps" \
  ${qds:+--qds "$qds"} --sim-ms "$simms" --time-scale "$scale"
