#!/usr/bin/env bash
# Long fuzzing runs, outside CI (a night, say): each cargo-fuzz target in turn for
# DURATION, with the same corpus handling as the CI smoke run (scripts/fuzz-smoke.sh:
# seeds from fuzz/corpus/TARGET, new inputs added there, crashes in fuzz/artifacts/TARGET).
#
#   scripts/fuzz-long.sh DURATION [TARGET...]      DURATION: 90s, 45m, 8h or plain seconds
#
# Env: FUZZ_SANITIZER = address (default) | none. Without AddressSanitizer a run is
# several times faster but catches only what safe Rust and the harness's own checks
# catch; the target crate has `unsafe` blocks, so keep ASan for any run you rely on.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 DURATION [TARGET...]   (DURATION: 90s, 45m, 8h or seconds)" >&2; exit 2; }
case "$1" in
  *[0-9]h) secs=$(( ${1%h} * 3600 ));;
  *[0-9]m) secs=$(( ${1%m} * 60 ));;
  *[0-9]s) secs=${1%s};;
  *) secs=$1;;
esac
case "$secs" in ''|*[!0-9]*|0) echo "fuzz-long.sh: DURATION must be a positive whole number of seconds, minutes (m) or hours (h), got '$1'" >&2; exit 2;; esac
shift
case "${FUZZ_SANITIZER:-address}" in address|none) ;; *)
  echo "fuzz-long.sh: FUZZ_SANITIZER must be address or none, got '${FUZZ_SANITIZER}'" >&2; exit 2;; esac
if [ $# -gt 0 ]; then export FUZZ_TARGETS="$*"; fi
echo "fuzz-long.sh: ${secs}s per target, sanitizer ${FUZZ_SANITIZER:-address}, targets: ${FUZZ_TARGETS:-all}"
exec scripts/fuzz-smoke.sh "$secs"
