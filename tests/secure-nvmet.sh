#!/usr/bin/env bash
# Our host library (`trellis bench`) against the Linux kernel target (nvmet-tcp) with in-band
# authentication (DH-HMAC-CHAP) and NVMe/TCP TLS 1.3 with a PSK: issue 13's "against Linux nvmet".
# One VM (tests/linux-vm/nvmet-vm.sh --suite trixie: Debian 13's 6.12 kernel, tlshd from ktls-utils
# 1.0.0, nvme-cli 2.13) serves one subsystem on two guest ports:
#   4420  plain; host AUTH_HOST has a DH-HMAC-CHAP host and controller secret (ffdhe2048, SHA-256)
#   4421  addr_tsas tls1.3, addr_treq required; host TLS_HOST's PSK (nvme-cli 2.13's derivation,
#         identity NVMe0R01) in the guest's .nvme keyring; tlshd does the kernel's handshakes
# Cases (each must end as stated, with the kernel's or tlshd's word for it in the console log):
#   auth                   right secret: randrw 4 KiB --verify passes; nvmet: "... with DH-HMAC-CHAP"
#   auth-bidirectional     right host and controller secrets: the same I/O passes
#   auth-wrong-secret      refused: "DH-HMAC-CHAP on queue 0 failed"; nvmet: "host response mismatch".
#                          (nvmet tears the controller down as it refuses, so the bench gets either
#                          its AUTH_Failure1, "the controller refused the host", or a closed
#                          connection "during the DH-HMAC-CHAP exchange"; the summary says which)
#   auth-no-secret         refused: "requires in-band authentication"
#   auth-wrong-ctrl-secret refused: "the host refused the controller" (nvmet proved another secret)
#   tls-4k, tls-128k       --tls-key --tls-derivation libnvme-compat: randrw --verify passes; tlshd:
#                          "(TLS1.3)--(AES-128-GCM)" and "was successful"
#   tls-plain              no --tls-key on the TLS port: refused; tlshd: handshake failed
#   tls-spec-derivation    the same key derived the RFC 8446 way: refused (PSK binder); tlshd: failed
# Exit 0 only if every case ran and ended as stated on a 6.12+ guest kernel; exit 1 otherwise.
#
#   tests/secure-nvmet.sh [PATH/TO/trellis]       (default: target/debug/trellis)
#
# Env: BENCH, RUNTIME (s per I/O case, default 2), LOG_DIR, CASE_TIMEOUT (s per case, default 120).
# The VM's state and console.log are in LOG_DIR/nvmet-vm (TRELLIS_NVMET_STATE).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench-lib.sh
. "$here/bench-lib.sh"

TRELLIS=${1:-${CARGO_TARGET_DIR:-target}/debug/trellis}
BENCH_CMD=$(bench_cmd "$TRELLIS")
RUNTIME=${RUNTIME:-2}
CASE_TIMEOUT=${CASE_TIMEOUT:-120}
LOG_DIR=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/trellis-secure-nvmet.XXXXXX")}
mkdir -p "$LOG_DIR"
SUMMARY=$LOG_DIR/summary.txt
: >"$SUMMARY"
FAILED=0
T_START=$SECONDS

NQN=nqn.2026-11.io.trellis:linux-nvmet
AUTH_HOST=nqn.2026-11.io.trellis:bench-auth
TLS_HOST=nqn.2026-11.io.trellis:bench-tls
# The secrets and key of tests/linux-vm/interop.toml (nvme gen-dhchap-key -m 1 / -m 2 -l 48,
# nvme gen-tls-key --hmac=1); WRONG is a valid DHHC-1 secret of other bytes.
DHCHAP_KEY='DHHC-1:01:NR5My74p5ZqEnJGSMmuiPqAJFFgTb7QjxYtSk7OcR6NnZKX+:'
DHCHAP_CTRL_KEY='DHHC-1:02:GdMihILgYzDrUyM1H1sKPffNn6d7ktv5X087UjJ3+e/U5vYU014/D09KPicROBVhTFn6dQ==:'
WRONG_KEY='DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:'
TLS_KEY='NVMeTLSkey-1:01:Ggh0ZeTr4gtcM5ttLtzjFKTkCEGwn/dvDUPXq4L9i7yv4BH+:'
EXPECTED_CASES=9

die() { echo "secure-nvmet: $*" >&2; echo "RESULT: FAIL"; exit 1; }

# The bench must have every flag the cases use: a missing one is a failure, not a skip.
# shellcheck disable=SC2086
help=$($BENCH_CMD --help 2>&1) || die "$BENCH_CMD --help failed"
for f in --dhchap-secret --dhchap-ctrl-secret --tls-key --tls-derivation; do
    grep -q -- "$f" <<<"$help" || die "$BENCH_CMD has no $f"
done

export TRELLIS_NVMET_STATE=$LOG_DIR/nvmet-vm
CONSOLE=$TRELLIS_NVMET_STATE/console.log
PORT=$("$here/linux-vm/nvmet-vm.sh" start --suite trixie --timeout 900 --fwd 4421 \
    --env NVMET_PORTS="4420 4421" --env NVMET_TLS_PORTS=4421 \
    --env NVMET_ALLOWED_HOSTS="$AUTH_HOST $TLS_HOST" \
    --env NVMET_DHCHAP_HOSTS="$AUTH_HOST" --env NVMET_DHCHAP_KEY="$DHCHAP_KEY" \
    --env NVMET_DHCHAP_CTRL_KEY="$DHCHAP_CTRL_KEY" \
    --env NVMET_TLS_HOSTS="$TLS_HOST" --env NVMET_TLS_KEY="$TLS_KEY") ||
    die "the nvmet VM did not start (console: $CONSOLE)"
trap '"$here/linux-vm/nvmet-vm.sh" stop >"$LOG_DIR/vm-stop.log" 2>&1 || true' EXIT
TLS_PORT=$("$here/linux-vm/nvmet-vm.sh" port 4421)
T_READY=$SECONDS

# A kernel older than 6.12 (Debian 12's 6.1 has neither nvmet auth nor TLS) must not get here
# quietly: guest-nvmet.sh refuses such a setup, and this checks what the guest said it runs.
ready=$(grep -m1 '@@NVMET-READY@@' "$CONSOLE") || die "no READY line in $CONSOLE"
echo "secure-nvmet: $ready"
kver=$(sed -n 's/.* kernel=\([0-9]*\.[0-9]*\).*/\1/p' <<<"$ready")
[ -n "$kver" ] || die "the READY line names no kernel"
[ "${kver%%.*}" -gt 6 ] || { [ "${kver%%.*}" = 6 ] && [ "${kver#*.}" -ge 12 ]; } ||
    die "guest kernel $kver: want 6.12+ (TRELLIS_VM_SUITE=trixie)"
grep -q ' dhchap=on tls=4421 ' <<<"$ready" || die "the guest did not set up DH-HMAC-CHAP and TLS on 4421: $ready"

# waits up to 10 s for a console line matching the ERE $2 after line $1
console_has() {
    local from=$1 pat=$2 i
    for ((i = 0; i < 50; i++)); do
        tail -n +"$((from + 1))" "$CONSOLE" | grep -qE -- "$pat" && return 0
        sleep 0.2
    done
    return 1
}

# run_case NAME ok|refused NEEDLE LOG-ERE [bench args...]
#   ok: the bench must exit 0 with "ok" in its verify column; refused: it must exit non-zero with
#   NEEDLE in its stderr. Either way a console line matching LOG-ERE must follow.
run_case() {
    local name=$1 want=$2 needle=$3 pat=$4 rc=0 t0=$SECONDS from why=""
    shift 4
    from=$(wc -l <"$CONSOLE")
    echo "== $name: $BENCH_CMD $*"
    # shellcheck disable=SC2086
    timeout "$CASE_TIMEOUT" $BENCH_CMD --no-progress --json "$LOG_DIR/$name.json" "$@" \
        >"$LOG_DIR/$name.out" 2>"$LOG_DIR/$name.err" || rc=$?
    sed 's/^/   /' "$LOG_DIR/$name.out" "$LOG_DIR/$name.err"
    if [ "$want" = ok ]; then
        if [ "$rc" != 0 ]; then why="rc=$rc"
        elif ! awk 'NR == 2 && $(NF-1) == "ok" {f = 1} END {exit !f}' "$LOG_DIR/$name.out"; then
            why="verify column is not ok"
        fi
    else
        if [ "$rc" = 0 ]; then why="the bench ran (rc=0): it should have been refused"
        elif [ "$rc" = 124 ]; then why="timed out instead of being refused"
        elif ! grep -qF -- "$needle" "$LOG_DIR/$name.err"; then why="stderr lacks '$needle'"
        fi
    fi
    if [ -z "$why" ] && ! console_has "$from" "$pat"; then why="no console line /$pat/"; fi
    if [ -z "$why" ]; then
        echo "CASE $name: ok ($((SECONDS - t0))s)" | tee -a "$SUMMARY"
    else
        echo "CASE $name: FAIL ($((SECONDS - t0))s) $why" | tee -a "$SUMMARY"
        FAILED=1
    fi
}

io=(--nqn "$NQN" --rw randrw --size 8m --runtime "$RUNTIME" --verify --cmd_timeout_ms 30000)
auth=(--addr "127.0.0.1:$PORT" --hostnqn "$AUTH_HOST" "${io[@]}" --bs 4k --iodepth 8)
tls=(--addr "127.0.0.1:$TLS_PORT" --hostnqn "$TLS_HOST" "${io[@]}")
created="nvmet: creating nvm controller [0-9]+ for subsystem $NQN for NQN $AUTH_HOST with DH-HMAC-CHAP"

run_case auth ok "" "$created" "${auth[@]}" --dhchap-secret "$DHCHAP_KEY"
run_case auth-bidirectional ok "" "$created" "${auth[@]}" \
    --dhchap-secret "$DHCHAP_KEY" --dhchap-ctrl-secret "$DHCHAP_CTRL_KEY"
run_case auth-wrong-secret refused "DH-HMAC-CHAP on queue 0 failed: " \
    "nvmet: ctrl [0-9]+ qid 0 host response mismatch" "${auth[@]}" --dhchap-secret "$WRONG_KEY"
if grep -q 'the controller refused the host' "$LOG_DIR/auth-wrong-secret.err"; then
    echo "  (auth-wrong-secret: AUTH_Failure1 arrived: the controller refused the host)" | tee -a "$SUMMARY"
elif grep -q 'during the DH-HMAC-CHAP exchange' "$LOG_DIR/auth-wrong-secret.err"; then
    echo "  (auth-wrong-secret: nvmet closed the connection before its AUTH_Failure1)" | tee -a "$SUMMARY"
fi
run_case auth-no-secret refused "requires in-band authentication (DH-HMAC-CHAP) of host $AUTH_HOST" \
    "$created" "${auth[@]}"
run_case auth-wrong-ctrl-secret refused "DH-HMAC-CHAP on queue 0 failed: the host refused the controller" \
    "$created" "${auth[@]}" --dhchap-secret "$DHCHAP_KEY" --dhchap-ctrl-secret "$WRONG_KEY"

handshake_ok='tlshd: tlshd\[[0-9]+\]: Handshake with .* was successful'
run_case tls-4k ok "" "$handshake_ok" "${tls[@]}" --bs 4k --iodepth 8 \
    --tls-key "$TLS_KEY" --tls-derivation libnvme-compat
run_case tls-128k ok "" "$handshake_ok" "${tls[@]}" --bs 128k --iodepth 4 \
    --tls-key "$TLS_KEY" --tls-derivation libnvme-compat
grep -q 'Session description: (TLS1.3)--(AES-128-GCM)' "$CONSOLE" || {
    echo "CASE tls-suite: FAIL tlshd did not report a TLS 1.3 AES-128-GCM session" | tee -a "$SUMMARY"; FAILED=1; }
handshake_failed="tlshd: tlshd\[[0-9]+\]: Handshake with .* failed"
run_case tls-plain refused "controller closed the connection" "$handshake_failed" "${tls[@]}" --bs 4k
run_case tls-spec-derivation refused "TLS handshake failed" "$handshake_failed" "${tls[@]}" --bs 4k \
    --tls-key "$TLS_KEY" --tls-derivation spec

T_CASES=$SECONDS
"$here/linux-vm/nvmet-vm.sh" stop >"$LOG_DIR/vm-stop.log" 2>&1 || { echo "nvmet VM: stop reported a guest failure"; FAILED=1; }
trap - EXIT
ran=$(grep -c '^CASE [a-z0-9-]*: ' "$SUMMARY" || true)
[ "$ran" -ge "$EXPECTED_CASES" ] || { echo "only $ran of $EXPECTED_CASES cases ran"; FAILED=1; }
echo "secure-nvmet: kernel $kver, $ran cases, VM ready after $((T_READY - T_START))s," \
    "cases $((T_CASES - T_READY))s, wall $((SECONDS - T_START))s; logs: $LOG_DIR"
if [ "$FAILED" -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; exit 1; fi
