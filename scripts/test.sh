#!/usr/bin/env bash
# The README's test command: everything CI checks, in one script.
#   1. unit, protocol, bad-input and random-input tests of the whole workspace,
#      then the fault-injection tests (trellis-target, feature fault-injection),
#      then clippy with warnings as errors (workspace lints in Cargo.toml);
#   2. the Linux NVMe/TCP initiator interop test (QEMU guest, Debian kernel);
#   3. a short cargo-fuzz smoke run of the PDU and command decoders;
#   4. extra suites other crates register in scripts/test.d/*.sh (bench smoke, nvmet interop...).
# Environment: SKIP_VM=1 skips step 2, SKIP_FUZZ=1 step 3, FUZZ_SECONDS (default 20 per target).
set -euo pipefail
cd "$(dirname "$0")/.."
export NO_COLOR=1 CARGO_TERM_COLOR=never
: "${CARGO_TARGET_DIR:=$PWD/target}"
export CARGO_TARGET_DIR
failed=()
skipped=()

step() { echo; echo "=== $* ==="; }

step "cargo test --workspace"
cargo test --workspace 2>&1 | tee /tmp/trellis-cargo-test.log || failed+=("cargo test")

step "cargo test -p trellis-target --features fault-injection --test faults"
# Failing io_uring submits, a panicking handler, I/O in flight at shutdown.
cargo test -p trellis-target --features fault-injection --test faults 2>&1 \
  | tee /tmp/trellis-cargo-test-faults.log || failed+=("fault injection tests")

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings || failed+=("clippy")
# The fault-injection code and tests/faults.rs exist only with the feature.
cargo clippy -p trellis-target --all-targets --features fault-injection -- -D warnings \
  || failed+=("clippy (fault-injection)")

step "build the trellis binary"
cargo build -p trellis-cli
TRELLIS="$CARGO_TARGET_DIR/debug/trellis"

if [ "${SKIP_VM:-0}" != 1 ]; then
  step "Linux initiator interop (QEMU)"
  tests/linux-vm/run-interop.sh "$TRELLIS" --log-dir "${INTEROP_LOG_DIR:-/tmp/trellis-interop}" || failed+=("linux interop")
else
  skipped+=("Linux initiator interop (SKIP_VM=1)")
fi

if [ "${SKIP_FUZZ:-0}" != 1 ]; then
  step "cargo fuzz smoke"
  scripts/fuzz-smoke.sh "${FUZZ_SECONDS:-20}" || failed+=("fuzz smoke")
else
  skipped+=("cargo fuzz smoke (SKIP_FUZZ=1)")
fi

for extra in scripts/test.d/*.sh; do
  [ -e "$extra" ] || continue
  step "$extra"
  TRELLIS="$TRELLIS" bash "$extra" || failed+=("$extra")
done

echo
for s in "${skipped[@]}"; do
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
