#!/usr/bin/env bash
# User-space instructions per I/O of the target's reactor, counted by callgrind:
# repeatable for the same binary and load, whatever else the machine is doing
# (wall-clock A/B on these VMs cannot resolve a few percent; bench/ab-simul.sh
# is the wall-clock counterpart). The target (one reactor, null namespace,
# idle_spin_us 0 so idle loops do not count) runs under valgrind; `trellis bench`
# drives it from outside; the reactor thread's instruction total is divided by
# the I/Os the bench completed.
#
#   bench/callgrind-io.sh [--qos off|gimbal] [--rw RW] [--bs BS] [--qd N] [--seconds S] [--out DIR]
#
# Prints one JSON line: {"qos", "rw", "bs", "qd", "ios", "reactor_instructions",
# "instructions_per_io"}; the callgrind files stay in DIR for callgrind_annotate.
# env: TRELLIS (binary, default target/release/trellis).
set -euo pipefail
cd "$(dirname "$0")/.."
qos=off rw=randread bs=4k qd=32 secs=8 out=""
while [ $# -gt 0 ]; do
  case $1 in
    --qos) qos=${2:?}; shift ;;
    --rw) rw=${2:?}; shift ;;
    --bs) bs=${2:?}; shift ;;
    --qd) qd=${2:?}; shift ;;
    --seconds) secs=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "callgrind-io.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case $qos in off|gimbal) ;; *) echo "callgrind-io.sh: --qos must be off or gimbal, got '$qos'" >&2; exit 2 ;; esac
bin=${TRELLIS:-target/release/trellis}
[ -x "$bin" ] || { echo "callgrind-io.sh: $bin not found: cargo build --release -p trellis-cli, or set TRELLIS" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "callgrind-io.sh: valgrind missing (apt-get install valgrind)" >&2; exit 2; }
out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/trellis-cg.XXXXXX")}
mkdir -p "$out"
# shellcheck source=../tests/bench-lib.sh
. tests/bench-lib.sh
port=$(free_port 15460)
nqn=nqn.2026-11.io.trellis:cg
cat >"$out/target.toml" <<EOF
[target]
reactors = 1
idle_spin_us = 0
state_dir = "$out/state"

[[listener]]
addr = "127.0.0.1:$port"

[[subsystem]]
nqn = "$nqn"

[[subsystem.namespace]]
backend = "null"
size = "1GiB"
qos = "$qos"
EOF
valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out/cg.%p" \
  "$bin" target --config "$out/target.toml" >"$out/target.log" 2>&1 &
tpid=$!
trap 'kill $tpid 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  kill -0 $tpid 2>/dev/null || { cat "$out/target.log" >&2; exit 1; }
  sleep 0.1
done
"$bin" bench --addr "127.0.0.1:$port" --nqn "$nqn" --rw "$rw" --bs "$bs" --iodepth "$qd" \
  --runtime "${secs}s" --ramp_time 0s --no_progress --json "$out/bench.json" >"$out/bench.log" 2>&1 ||
  { cat "$out/bench.log" >&2; exit 1; }
kill -TERM $tpid
wait $tpid || true
trap - EXIT
python3 - "$out" "$qos" "$rw" "$bs" "$qd" <<'PY'
import glob, json, sys
out, qos, rw, bs, qd = sys.argv[1:]
ios = sum(j["ios"] for j in json.load(open(f"{out}/bench.json"))["jobs"])
totals = []
for f in glob.glob(f"{out}/cg.*"):
    for line in open(f, errors="replace"):
        if line.startswith("summary:") or line.startswith("totals:"):
            totals.append(int(line.split()[1]))
            break
reactor = max(totals)  # the reactor thread does almost all of the work
print(json.dumps({"qos": qos, "rw": rw, "bs": bs, "qd": int(qd), "ios": ios,
                  "reactor_instructions": reactor, "instructions_per_io": round(reactor / max(ios, 1), 1)}))
PY
