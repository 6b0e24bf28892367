# Shared helpers for tests/bench-*.sh (sourced, not run).

# Picks the bench command: $BENCH if set, else `trellis bench` when the given
# trellis binary has it, else trellis-bench-dev next to it or in the usual
# cargo target dirs.
bench_cmd() {
    local trellis=$1
    if [ -n "${BENCH:-}" ]; then echo "$BENCH"; return; fi
    if [ -x "$trellis" ] && "$trellis" bench --help >/dev/null 2>&1; then
        echo "$trellis bench"; return
    fi
    local d
    for d in "$(dirname "$trellis")" "${CARGO_TARGET_DIR:-target}/debug" "${CARGO_TARGET_DIR:-target}/release"; do
        if [ -x "$d/trellis-bench-dev" ]; then echo "$d/trellis-bench-dev"; return; fi
    done
    echo "no bench binary: build with 'cargo build -p trellis-bench' or set BENCH" >&2
    return 1
}

# free_port, release_ports: random reserved ports, safe with concurrent test runs (port-lib.sh).
# shellcheck source=port-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/port-lib.sh"

# Waits until 127.0.0.1:$1 accepts connections (up to $2 seconds).
wait_port() {
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "nothing listening on 127.0.0.1:$1 after $2 s" >&2
    return 1
}

# Runs one verified bench case; records PASS/FAIL lines in $SUMMARY.
bench_case() {
    local name=$1; shift
    local t0=$SECONDS rc=0
    echo "== $name: $BENCH_CMD $*"
    # shellcheck disable=SC2086
    timeout "${CASE_TIMEOUT:-180}" $BENCH_CMD --no-progress --json "$LOG_DIR/$name.json" "$@" || rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "CASE $name: ok ($((SECONDS - t0))s)" | tee -a "$SUMMARY"
    else
        echo "CASE $name: FAIL rc=$rc ($((SECONDS - t0))s)" | tee -a "$SUMMARY"
        FAILED=1
    fi
}
