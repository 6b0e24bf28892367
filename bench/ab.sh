#!/usr/bin/env bash
# Interleaved A/B of two target commands: the same client (`trellis bench` of
# $CLIENT, default B's binary), the same workloads, targets alternating
# A B B A A B ..., repeated; prints the median IOPS and p50 of each and the B/A
# ratio. This VM flips between a fast and a slow regime from process to
# process, so only interleaved, repeated runs are compared, and medians quoted.
#
#   bench/ab.sh "A_TARGET_CMD" "B_TARGET_CMD" [REPS=3] [RUNTIME_S=3]
# Each command is a `trellis target` invocation; `--null 1G --listen ADDR
# --reactors 1` is appended. Examples:
#   bench/ab.sh "old/trellis target" "target/release/trellis target"        # previous main vs now
#   bench/ab.sh "T target --engine epoll" "T target --engine uring"         # see ab-engines.sh
# env: CLIENT (trellis binary for the client), OUT (result dir), WORKLOADS
# ("RW BS QD" entries separated by ';', default the six below). Writes
# $OUT/ab.json: per workload the medians, each pair's B/A and their median.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 A_TARGET_CMD B_TARGET_CMD [REPS] [RUNTIME_S]" >&2; exit 2; }
A=$1 B=$2
reps=${3:-3}
rt=${4:-3}
client=${CLIENT:-${B%% *}}
[ -x "$client" ] || { echo "client binary not executable: $client (set CLIENT)" >&2; exit 2; }
# shellcheck source=../tests/bench-lib.sh
. tests/bench-lib.sh
out=${OUT:-$(mktemp -d /tmp/trellis-ab.XXXXXX)}
mkdir -p "$out"
port=$(free_port 15420)
workloads=("randread 4k 1" "randread 4k 32" "randread 4k 128" "randwrite 4k 32" "read 128k 8" "write 128k 8")
if [ -n "${WORKLOADS:-}" ]; then IFS=';' read -r -a workloads <<<"$WORKLOADS"; fi
for r in $(seq 1 "$reps"); do
  # Counterbalanced order (A B, then B A, ...): an A/A run of this script
  # with a fixed order favoured the second side by about 4 %.
  order="a b"; [ $((r % 2)) -eq 0 ] && order="b a"
  for side in $order; do
    cmd=$A; [ $side = b ] && cmd=$B
    # shellcheck disable=SC2086
    taskset -c 0 $cmd --null 1G --listen 127.0.0.1:$port --reactors 1 >"$out/target-$side-$r.log" 2>&1 &
    tp=$!
    wait_port "$port" 10 || { echo "target $side did not start; see $out/target-$side-$r.log" >&2; kill $tp; exit 1; }
    for w in "${workloads[@]}"; do
      # shellcheck disable=SC2086
      set -- $w
      name="$1-$2-qd$3"
      taskset -c 1 "$client" bench --addr 127.0.0.1:$port --nqn nqn.2026-11.io.trellis:default --rw "$1" --bs "$2" \
        --iodepth "$3" --runtime "${rt}s" --ramp_time 1s --no_progress --json "$out/$side-$name-$r.json" \
        >/dev/null 2>&1 || echo "run failed: $side $name" >&2
    done
    kill -INT $tp; wait $tp || true
  done
done
python3 - "$out" "${workloads[@]}" <<'PY'
import json, sys, glob, statistics
out = sys.argv[1]
print("| workload | A IOPS | B IOPS | B/A | pairs B/A median (min-max) | A p50 µs | B p50 µs |")
print("|---|---:|---:|---:|---:|---:|---:|")
doc = {}
for w in sys.argv[2:]:
    rw, bs, qd = w.split()
    name = f"{rw}-{bs}-qd{qd}"
    med = {}
    runs = {}
    for side in ("a", "b"):
        iops, p50 = [], []
        for f in glob.glob(f"{out}/{side}-{name}-*.json"):
            j = json.load(open(f))["jobs"][0]
            iops.append(j["iops"]); p50.append(j["lat_us_p50"])
            runs.setdefault(side, {})[int(f.rsplit("-", 1)[1].split(".")[0])] = j["iops"]
        med[side] = (statistics.median(iops), statistics.median(p50)) if iops else (0, 0)
    a, b = med["a"], med["b"]
    ratio = b[0] / a[0] if a[0] else 0
    ra, rb = runs.get("a", {}), runs.get("b", {})
    pairs = [rb[r] / ra[r] for r in sorted(ra) if r in rb and ra[r]]
    pm = statistics.median(pairs) if pairs else 0
    span = f"{min(pairs):.2f}-{max(pairs):.2f}" if pairs else "-"
    print(f"| {rw} {bs} QD{qd} | {a[0]:.0f} | {b[0]:.0f} | {ratio:.2f} | {pm:.2f} ({span}) | {a[1]:.1f} | {b[1]:.1f} |")
    doc[name] = {"a_iops_median": a[0], "b_iops_median": b[0], "b_over_a": round(ratio, 4),
                 "pair_ratios": [round(x, 4) for x in pairs], "pair_ratio_median": round(pm, 4),
                 "a_lat_us_p50_median": a[1], "b_lat_us_p50_median": b[1]}
json.dump(doc, open(f"{out}/ab.json", "w"), indent=2)
PY
echo "raw JSON: $out" >&2
