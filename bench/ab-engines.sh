#!/usr/bin/env bash
# Interleaved A/B of the target's socket engines (epoll vs io_uring): the same
# workloads, alternating engines, repeated; prints the median IOPS and p50 of
# each and the uring/epoll ratio. This VM has two performance regimes, so
# only interleaved, repeated runs are compared (fast-data-path.md §0.7).
#
#   bench/ab-engines.sh [REPS=3] [RUNTIME_S=3]      (env TRELLIS: binary to use)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
rt=${2:-3}
T=${TRELLIS:-${CARGO_TARGET_DIR:-target}/release/trellis}
[ -x "$T" ] || cargo build --release -p trellis-cli
out=${OUT:-$(mktemp -d /tmp/trellis-ab.XXXXXX)}
port=${PORT:-15420}
workloads=("randread 4k 1" "randread 4k 32" "randread 4k 128" "randwrite 4k 32" "read 128k 8" "write 128k 8")
for r in $(seq 1 "$reps"); do
  for eng in epoll uring; do
    taskset -c 0 "$T" target --null 1G --listen 127.0.0.1:$port --engine $eng >"$out/target-$eng-$r.log" 2>&1 &
    tp=$!
    sleep 0.5
    for w in "${workloads[@]}"; do
      set -- $w
      name="$1-$2-qd$3"
      taskset -c 1 "$T" bench --addr 127.0.0.1:$port --nqn nqn.2026-11.io.trellis:default --rw "$1" --bs "$2" \
        --iodepth "$3" --runtime "${rt}s" --ramp_time 1s --no_progress --json "$out/$eng-$name-$r.json" >/dev/null 2>&1 || echo "run failed: $eng $name"
    done
    kill -INT $tp; wait $tp || true
  done
done
python3 - "$out" "${workloads[@]}" <<'PY'
import json, sys, glob, statistics
out = sys.argv[1]
print(f"| workload | epoll IOPS | uring IOPS | uring/epoll | epoll p50 µs | uring p50 µs |")
print("|---|---:|---:|---:|---:|---:|")
for w in sys.argv[2:]:
    rw, bs, qd = w.split()
    name = f"{rw}-{bs}-qd{qd}"
    med = {}
    for eng in ("epoll", "uring"):
        iops, p50 = [], []
        for f in glob.glob(f"{out}/{eng}-{name}-*.json"):
            j = json.load(open(f))["jobs"][0]
            iops.append(j["iops"]); p50.append(j["lat_us_p50"])
        med[eng] = (statistics.median(iops), statistics.median(p50)) if iops else (0, 0)
    e, u = med["epoll"], med["uring"]
    ratio = u[0] / e[0] if e[0] else 0
    print(f"| {rw} {bs} QD{qd} | {e[0]:.0f} | {u[0]:.0f} | {ratio:.2f} | {e[1]:.1f} | {u[1]:.1f} |")
PY
echo "raw JSON: $out"
