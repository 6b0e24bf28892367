#!/usr/bin/env bash
# CI: `trellis bench` (our initiator) against `trellis target` (RAM namespace)
# with verify on, at 4 KiB (in-capsule) and 128 KiB (R2T/H2CData), without and
# with header+data digests, plus a two-tenant job file. Exit 0 = all passed.
#
#   tests/bench-target.sh [PATH/TO/trellis]      (default: target/debug/trellis)
#
# Env: BENCH (bench command, default `trellis bench` or trellis-bench-dev),
# RUNTIME (seconds per case, default 2), LOG_DIR, PORT (default: a free random port, tests/port-lib.sh),
# LISTEN_TIMEOUT (s for the target to listen, default 30), CASE_TIMEOUT (s per case, default 180).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench-lib.sh
. "$here/bench-lib.sh"

TRELLIS=${1:-${CARGO_TARGET_DIR:-target}/debug/trellis}
BENCH_CMD=$(bench_cmd "$TRELLIS")
RUNTIME=${RUNTIME:-2}
PORT=${PORT:-$(free_port 14600)}
LOG_DIR=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/trellis-bench-target.XXXXXX")}
SUMMARY=$LOG_DIR/summary.txt
FAILED=0
: >"$SUMMARY"

"$TRELLIS" target --listen "127.0.0.1:$PORT" --ram 256M --state-dir "$LOG_DIR/state" >"$LOG_DIR/target.log" 2>&1 &
TPID=$!
trap 'kill $TPID 2>/dev/null || true' EXIT
wait_port "$PORT" "${LISTEN_TIMEOUT:-30}"

common=(--addr "127.0.0.1:$PORT" --nqn nqn.2026-11.io.trellis:default --runtime "$RUNTIME" --size 64m --verify)
for digest in none header,data; do
    for bs in 4k 128k; do
        bench_case "randrw-$bs-digest-${digest/,/+}" "${common[@]}" --rw randrw --bs "$bs" --iodepth 16 --digest "$digest"
    done
done
bench_case "randread-4k-qd32-prefilled" "${common[@]}" --rw randread --bs 4k --iodepth 32
bench_case "write-128k-readback" "${common[@]}" --rw write --bs 128k --iodepth 8 --digest header,data

cat >"$LOG_DIR/tenants.toml" <<TOML
[global]
addr = "127.0.0.1:$PORT"
runtime = "$RUNTIME"
verify = true

[[job]]
name = "lapp"
class = "latency"
tenant = "alice"
rw = "randread"
bs = "4k"
iodepth = 1
offset = "0"
size = "16m"

[[job]]
name = "tapp"
class = "throughput"
tenant = "bob"
rw = "randrw"
bssplit = "4k/50:128k/50"
iodepth = 16
offset = "64m"
size = "64m"
TOML
bench_case "two-tenants-jobfile" --jobs "$LOG_DIR/tenants.toml"

kill "$TPID"
wait "$TPID" || true
trap - EXIT
echo "logs: $LOG_DIR"
if [ "$FAILED" -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; exit 1; fi
