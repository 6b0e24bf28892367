#!/usr/bin/env bash
# The Trellis benchmark suite, one command:
#
#   bench/run.sh            # full suite (~3 minutes): 6 workloads x (Trellis + raw TCP baseline)
#   bench/run.sh --smoke    # a few seconds, same workloads (CI)
#   bench/run.sh --runtime 20 --ramp_time 3 --out /tmp/suite   # any `trellis bench suite` flag
#
# Builds the release `trellis` binary and the bench, starts `trellis target` with a 1 GiB null
# namespace pinned to CPU $TARGET_CPU (default 0), runs the client pinned to CPU $CLIENT_CPU
# (default 1), and writes suite.json + summary.md to bench/results/<timestamp>/ (or --out).
# Env: CARGO_TARGET_DIR, TARGET_CPU, CLIENT_CPU, PORT (default: first free from 4420),
# TRELLIS (use this binary instead of building), TARGET_ARGS (extra `trellis target` flags).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=../tests/bench-lib.sh
. tests/bench-lib.sh

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
if [ -z "${TRELLIS:-}" ]; then
    cargo build --release -p trellis-cli -p trellis-bench >&2
    TRELLIS=$CARGO_TARGET_DIR/release/trellis
fi
BENCH_CMD=${BENCH:-}
if [ -z "$BENCH_CMD" ]; then
    if "$TRELLIS" bench --help >/dev/null 2>&1; then
        BENCH_CMD="$TRELLIS bench"
    else
        BENCH_CMD=$(dirname "$TRELLIS")/trellis-bench-dev
        [ -x "$BENCH_CMD" ] || BENCH_CMD=$CARGO_TARGET_DIR/release/trellis-bench-dev
    fi
fi
TARGET_CPU=${TARGET_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
PORT=${PORT:-$(free_port 4420)}
out=(--out "bench/results/$(date +%Y%m%d-%H%M%S)")
for a in "$@"; do [ "$a" = "--out" ] && out=(); done

# shellcheck disable=SC2086
exec $BENCH_CMD suite \
    --target_cmd "$TRELLIS target --null 1G --listen 127.0.0.1:$PORT --reactors 1 ${TARGET_ARGS:-}" \
    --addr "127.0.0.1:$PORT" --target_cpu "$TARGET_CPU" --client_cpu "$CLIENT_CPU" \
    --baseline_port "$(free_port 4499)" "${out[@]}" "$@"
