#!/usr/bin/env bash
# Simultaneous A/B of two target commands: both targets run AT THE SAME TIME
# on one shared core (taskset -c 0), each with its own client (`trellis
# bench`, both on core 1). Each target busy-polls, so the kernel splits the
# core evenly between them and each one's IOPS is set by its own cost per
# I/O; the ratio B/A is therefore a ratio of per-core efficiency.
#
# Why: this VM flips between fast and slow regimes from second to second, so
# sequential A/B pairs (bench/ab.sh) scatter from 0.5 to 2.0 and cannot
# resolve a few percent. Run side by side, both see the same regime: an A/A
# run here stays within ±1.5 %, where the sequential one spreads ±40 %.
# What it does not show: latency at low load (the core is shared) — use
# bench/ab.sh for QD1 latency. With `--qos gimbal` use only backends that
# complete inside submit (null, ram): they are charged zero device time, so
# the other reactor's time slices do not look like device latency (before
# that rule Gimbal vs Gimbal ran at a third of its standalone rate here). On
# an emulated or file backend they would, and would throttle it.
#
#   bench/ab-simul.sh "A_TARGET_CMD" "B_TARGET_CMD" [REPS=5] [RUNTIME_S=4]
# Each command is a `trellis target` invocation; `--null 1G --listen ADDR
# --reactors 1` is appended. Which side starts first alternates per rep.
# env: CLIENT (trellis binary for both clients, default B's), OUT (result
# dir), WORKLOADS ("RW BS QD" entries separated by ';'). Writes $OUT/ab.json.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 A_TARGET_CMD B_TARGET_CMD [REPS] [RUNTIME_S]" >&2; exit 2; }
A=$1 B=$2
reps=${3:-5}
rt=${4:-4}
client=${CLIENT:-${B%% *}}
[ -x "$client" ] || { echo "client binary not executable: $client (set CLIENT)" >&2; exit 2; }
# shellcheck source=../tests/bench-lib.sh
. tests/bench-lib.sh
out=${OUT:-$(mktemp -d /tmp/trellis-abs.XXXXXX)}
mkdir -p "$out"
port_a=$(free_port 15430)
port_b=$(free_port $((port_a + 1)))
workloads=("randread 4k 32" "randread 4k 128" "randwrite 4k 32" "read 128k 8" "write 128k 8")
if [ -n "${WORKLOADS:-}" ]; then IFS=';' read -r -a workloads <<<"$WORKLOADS"; fi
pids=()
cleanup() { for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
start() { # side cmd port
  # shellcheck disable=SC2086
  taskset -c 0 $2 --null 1G --listen 127.0.0.1:$3 --reactors 1 >"$out/target-$1-$r.log" 2>&1 &
  pids+=($!)
}
for r in $(seq 1 "$reps"); do
  pids=()
  if [ $((r % 2)) -eq 1 ]; then start a "$A" "$port_a"; start b "$B" "$port_b"
  else start b "$B" "$port_b"; start a "$A" "$port_a"; fi
  for p in "$port_a" "$port_b"; do
    wait_port "$p" 10 || { echo "a target did not start; see $out/target-*-$r.log" >&2; exit 1; }
  done
  for w in "${workloads[@]}"; do
    # shellcheck disable=SC2086
    set -- $w
    name="$1-$2-qd$3"
    cpids=()
    for side in a b; do
      port=$port_a; [ $side = b ] && port=$port_b
      taskset -c 1 "$client" bench --addr 127.0.0.1:$port --nqn nqn.2026-11.io.trellis:default --rw "$1" --bs "$2" \
        --iodepth "$3" --runtime "${rt}s" --ramp_time 1s --no_progress --json "$out/$side-$name-$r.json" \
        >/dev/null 2>&1 &
      cpids+=($!)
    done
    for c in "${cpids[@]}"; do wait "$c" || echo "run failed: $name rep $r" >&2; done
  done
  for p in "${pids[@]}"; do kill -INT "$p"; wait "$p" || true; done
  pids=()
done
python3 - "$out" "${workloads[@]}" <<'PY'
import json, sys, glob, statistics
out = sys.argv[1]
print("| workload | pairs | B/A median | min | max | A IOPS median | B IOPS median |")
print("|---|---:|---:|---:|---:|---:|---:|")
doc = {}
for w in sys.argv[2:]:
    rw, bs, qd = w.split()
    name = f"{rw}-{bs}-qd{qd}"
    runs = {"a": {}, "b": {}}
    for side in runs:
        for f in glob.glob(f"{out}/{side}-{name}-*.json"):
            runs[side][int(f.rsplit("-", 1)[1].split(".")[0])] = json.load(open(f))["jobs"][0]["iops"]
    ra, rb = runs["a"], runs["b"]
    pairs = [rb[r] / ra[r] for r in sorted(ra) if r in rb and ra[r]]
    if not pairs:
        print(f"| {rw} {bs} QD{qd} | 0 | - | - | - | - | - |")
        continue
    pm = statistics.median(pairs)
    am, bm = statistics.median(ra.values()), statistics.median(rb.values())
    print(f"| {rw} {bs} QD{qd} | {len(pairs)} | {pm:.3f} | {min(pairs):.3f} | {max(pairs):.3f} | {am:.0f} | {bm:.0f} |")
    doc[name] = {"pair_ratios": [round(x, 4) for x in pairs], "pair_ratio_median": round(pm, 4),
                 "a_iops_median": am, "b_iops_median": bm, "mode": "simultaneous, shared core"}
json.dump(doc, open(f"{out}/ab.json", "w"), indent=2)
PY
echo "raw JSON: $out" >&2
