#!/usr/bin/env bash
# CI: `trellis bench` (our initiator) against the Linux kernel target
# (nvmet-tcp in the QEMU VM, tests/linux-vm/nvmet-vm.sh), verify on, 4 KiB and
# 128 KiB, without and with header+data digests. The VM is software-emulated,
# so each case moves only a few MiB. Exit 0 = all passed.
#
#   tests/bench-nvmet.sh [PATH/TO/trellis]       (default: target/debug/trellis)
#
# Env: BENCH, RUNTIME (default 2), LOG_DIR, CASE_TIMEOUT (s per case, default 300). Uses a running
# VM if NVMET_PORT is set (then does not start or stop it); otherwise starts its own, with its state
# in LOG_DIR/nvmet-vm (TRELLIS_NVMET_STATE), so two runs at once each have their own VM.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench-lib.sh
. "$here/bench-lib.sh"

TRELLIS=${1:-${CARGO_TARGET_DIR:-target}/debug/trellis}
BENCH_CMD=$(bench_cmd "$TRELLIS")
RUNTIME=${RUNTIME:-2}
LOG_DIR=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/trellis-bench-nvmet.XXXXXX")}
SUMMARY=$LOG_DIR/summary.txt
FAILED=0
CASE_TIMEOUT=${CASE_TIMEOUT:-300}
: >"$SUMMARY"

if [ -n "${NVMET_PORT:-}" ]; then
    PORT=$NVMET_PORT
else
    export TRELLIS_NVMET_STATE=${TRELLIS_NVMET_STATE:-$LOG_DIR/nvmet-vm}
    PORT=$("$here/linux-vm/nvmet-vm.sh" start)
    trap '"$here/linux-vm/nvmet-vm.sh" stop >/dev/null 2>&1 || true' EXIT
fi

common=(--addr "127.0.0.1:$PORT" --nqn nqn.2026-11.io.trellis:linux-nvmet --runtime "$RUNTIME"
    --size 8m --verify --cmd_timeout_ms 30000)
for digest in none header,data; do
    bench_case "nvmet-randrw-4k-digest-${digest/,/+}" "${common[@]}" --rw randrw --bs 4k --iodepth 8 --digest "$digest"
    bench_case "nvmet-randrw-128k-digest-${digest/,/+}" "${common[@]}" --rw randrw --bs 128k --iodepth 4 --digest "$digest"
done

# The blk-switch host stack against a stock target (issue 14 (a)): an L-app
# and a T-app on per-core class queues; nvmet knows nothing of classes.
jobs=$LOG_DIR/blkswitch.toml
printf '%s\n' '[[job]]' 'name = "lapp"' 'class = "latency"' 'rw = "randread"' 'bs = "4k"' \
    'iodepth = 1' 'size = "8m"' '' '[[job]]' 'name = "tapp"' 'class = "throughput"' \
    'rw = "randread"' 'bs = "128k"' 'iodepth = 8' 'offset = "8m"' 'size = "16m"' >"$jobs"
bench_case "nvmet-blk-switch" --addr "127.0.0.1:$PORT" --nqn nqn.2026-11.io.trellis:linux-nvmet \
    --runtime "$RUNTIME" --cmd_timeout_ms 30000 --jobs "$jobs" --stack blk-switch

echo "logs: $LOG_DIR"
if [ "$FAILED" -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; exit 1; fi
