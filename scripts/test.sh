#!/usr/bin/env bash
# The README's test command: everything CI checks, in one script.
#   0. prerequisites: what the suites below need and this machine lacks is installed (as root or
#      with passwordless sudo), one line each: "test.sh: installing X (needed for Y)"; without
#      root the suites that need it are skipped, each with its reason;
#   1. unit, protocol, bad-input and random-input tests of the whole workspace,
#      then the fault-injection tests (trellis-node, feature fault-injection),
#      then clippy with warnings as errors (workspace lints in Cargo.toml) and rustfmt --check;
#   2. the Linux NVMe/TCP initiator interop test (QEMU guest, Debian kernel);
#   3. a short cargo-fuzz smoke run of the PDU and command decoders;
#   4. extra suites other crates register in scripts/test.d/*.sh (bench smoke, nvmet interop...).
#      A suite that cannot run here prints "skipped: REASON" as its last line and exits 77.
# Ends with one SKIPPED line per suite that did not run, then "all test suites passed" (or "all
# test suites that ran passed (N skipped, listed above)", or FAILED: ... and exit status 1).
#
# Two runs at once on one machine (two clones, or the same checkout) do not disturb each other:
# each run keeps its logs in its own directory and points TMPDIR at a private directory inside it
# (every mktemp, every cargo test's temp dir); targets listen on random ports reserved for the run
# (tests/port-lib.sh); package installs and the VM cache queue on locks (tests/apt-lib.sh,
# tests/linux-vm/vm.sh); cargo's own lock serialises builds into one target directory.
#
# Environment: SKIP_VM=1 skips the VM suites, SKIP_FUZZ=1 the fuzz smoke run, FUZZ_SECONDS
# (default 20 per target); TRELLIS_TEST_DIR: this run's directory (default: a new
# ${TMPDIR:-/tmp}/trellis-test.XXXXXX; kept, with every suite's log in logs/); INTEROP_LOG_DIR:
# the interop logs (default TRELLIS_TEST_DIR/interop).
set -euo pipefail
cd "$(dirname "$0")/.."
export NO_COLOR=1 CARGO_TERM_COLOR=never
: "${CARGO_TARGET_DIR:=$PWD/target}"
export CARGO_TARGET_DIR
# shellcheck source=../tests/port-lib.sh
. tests/port-lib.sh
# shellcheck source=../tests/apt-lib.sh
. tests/apt-lib.sh

RUN_DIR=${TRELLIS_TEST_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/trellis-test.XXXXXX")}
mkdir -p "$RUN_DIR/logs" "$RUN_DIR/tmp" || { echo "test.sh: cannot create $RUN_DIR (TRELLIS_TEST_DIR)" >&2; exit 2; }
RUN_DIR=$(cd "$RUN_DIR" && pwd)
export TRELLIS_TEST_DIR=$RUN_DIR TMPDIR=$RUN_DIR/tmp
# Ports reserved by anything below belong to this run and are released when it ends.
export TRELLIS_PORT_OWNER=$$
failed=()
skipped=()
# On success the private temp dir goes (the logs stay); on failure it is kept for inspection.
trap 'release_ports "$TRELLIS_PORT_OWNER"; [ ${#failed[@]} -gt 0 ] || rm -rf "$TMPDIR"' EXIT
T_RUN=$SECONDS
echo "test.sh: run directory $RUN_DIR (logs in logs/, temp files in tmp/)"

step() { echo; echo "=== $* ==="; }

# suite NAME LOGNAME CMD...: runs CMD, its output also in logs/LOGNAME.log. Exit 77 = skipped (the
# reason is its last "skipped: " line), other non-zero = failed.
suite() {
  local name=$1 log=$RUN_DIR/logs/$2.log t0=$SECONDS rc reason; shift 2
  step "$name"
  set +e
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" = 77 ]; then
    reason=$(sed -n 's/^skipped: //p' "$log" | tail -1)
    skipped+=("$name (${reason:-no reason given})")
  elif [ "$rc" != 0 ]; then
    failed+=("$name")
  fi
  case $rc in
    0) echo "--- $name: ok after $((SECONDS - t0))s";;
    77) echo "--- $name: skipped after $((SECONDS - t0))s";;
    *) echo "--- $name: FAILED (exit $rc) after $((SECONDS - t0))s";;
  esac
}

step "prerequisites"
# The VM suites (interop, interop with QoS, bench against nvmet) need QEMU, nvme-cli, fio, ...
# and a Debian kernel; vm.sh --build-only installs what is missing and fills its cache.
if [ "${SKIP_VM:-0}" = 1 ]; then
  export TRELLIS_SKIP_VM_REASON=${TRELLIS_SKIP_VM_REASON:-SKIP_VM=1}
else
  set +e
  tests/linux-vm/vm.sh --build-only 2>&1 | tee "$RUN_DIR/logs/vm-build.log"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" = 77 ]; then
    export SKIP_VM=1 TRELLIS_SKIP_VM_REASON
    TRELLIS_SKIP_VM_REASON=$(grep 'vm.sh: missing host packages' "$RUN_DIR/logs/vm-build.log" | tail -1 | sed 's/^vm.sh: //')
  elif [ "$rc" != 0 ]; then
    failed+=("VM prerequisites (tests/linux-vm/vm.sh --build-only, exit $rc)")
    export SKIP_VM=1 TRELLIS_SKIP_VM_REASON="the VM prerequisites failed (see above)"
  fi
fi
# python3 checks the JSON the bench and simulator suites write (scripts/test.d/40-*, 50-*).
if ! command -v python3 >/dev/null; then
  if can_install; then
    apt_install_for "the fairness and simulator suites' JSON checks (scripts/test.d)" python3 ||
      failed+=("prerequisites (apt-get install python3)")
  else
    echo "test.sh: python3 missing and not root: the suites that need it will be skipped"
  fi
fi
# cargo-fuzz is installed by scripts/fuzz-smoke.sh itself (cargo install, no root needed).

# The etcd tests of crates/app/cli/tests/ha.rs run in scripts/test.d/70-ha.sh
# (with etcd required, and counted), not here as well: once is enough, and
# their timing bounds want the binary to themselves.
suite "cargo test --workspace" cargo-test cargo test --workspace -- --skip etcd::etcd_

# Failing io_uring submits, a panicking handler, I/O in flight at shutdown.
suite "cargo test -p trellis-node --features fault-injection --test faults" cargo-test-faults \
  cargo test -p trellis-node --features fault-injection --test faults

suite "cargo clippy --workspace --all-targets -- -D warnings" clippy \
  cargo clippy --workspace --all-targets -- -D warnings
# The fault-injection code and tests/faults.rs exist only with the feature.
suite "cargo clippy -p trellis-node --all-targets --features fault-injection -- -D warnings" clippy-faults \
  cargo clippy -p trellis-node --all-targets --features fault-injection -- -D warnings

# Formatting: the workspace stays as rustfmt writes it (cargo fmt --all fixes it).
suite "cargo fmt --all -- --check" fmt cargo fmt --all -- --check

suite "build the trellis binary" build cargo build -p trellis-cli
export TRELLIS="$CARGO_TARGET_DIR/debug/trellis"

interop() {
  if [ "${SKIP_VM:-0}" = 1 ]; then echo "skipped: ${TRELLIS_SKIP_VM_REASON:-SKIP_VM=1}"; return 77; fi
  tests/linux-vm/run-interop.sh "$TRELLIS" --log-dir "${INTEROP_LOG_DIR:-$RUN_DIR/interop}"
}
suite "Linux initiator interop (QEMU)" interop interop

fuzz() {
  if [ "${SKIP_FUZZ:-0}" = 1 ]; then echo "skipped: SKIP_FUZZ=1"; return 77; fi
  scripts/fuzz-smoke.sh "${FUZZ_SECONDS:-20}"
}
suite "cargo fuzz smoke" fuzz-smoke fuzz

for extra in scripts/test.d/*.sh; do
  [ -e "$extra" ] || continue
  suite "$extra" "$(basename "$extra" .sh)" bash "$extra"
done

echo
echo "test.sh: ${#failed[@]} failed, ${#skipped[@]} skipped, $((SECONDS - T_RUN))s; logs in $RUN_DIR/logs"
for s in ${skipped[@]+"${skipped[@]}"}; do
  echo "SKIPPED: $s"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
if [ ${#skipped[@]} -gt 0 ]; then
  echo "all test suites that ran passed (${#skipped[@]} skipped, listed above)"
else
  echo "all test suites passed"
fi
