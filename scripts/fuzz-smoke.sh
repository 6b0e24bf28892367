#!/usr/bin/env bash
# Runs each cargo-fuzz target for N seconds (default 20). cargo-fuzz needs
# nightly-only compiler flags; the machine has one stable toolchain, so
# RUSTC_BOOTSTRAP=1 lets stable accept them (for the fuzz build only).
#
# Safe to run twice at once: cargo-fuzz is installed under a lock (the second
# run waits, then finds it installed); each run fuzzes into a private corpus
# directory, reading fuzz/corpus/TARGET as seeds, and only then adds the inputs
# it found to fuzz/corpus/TARGET (libFuzzer names them by their SHA-1, so two
# runs can only ever write the same content under one name; each is moved
# into place whole). Crash inputs go to fuzz/artifacts/TARGET as before.
# Env: FUZZ_INSTALL_LOCK_TIMEOUT (seconds to wait for another run's
# `cargo install cargo-fuzz`, default 1800); FUZZ_TARGETS (space-separated
# subset of `cargo fuzz list`, default all); FUZZ_SANITIZER (address, the
# default, or none: scripts/fuzz-long.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
case "$secs" in ''|*[!0-9]*) echo "fuzz-smoke.sh: seconds per target must be a whole number, got '$secs'" >&2; exit 2;; esac
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  lock=${CARGO_HOME:-$HOME/.cargo}/.trellis-cargo-fuzz-install.lock
  mkdir -p "$(dirname "$lock")"
  exec 8>"$lock"
  flock -w "${FUZZ_INSTALL_LOCK_TIMEOUT:-1800}" 8 ||
    { echo "fuzz-smoke.sh: another run has held $lock for ${FUZZ_INSTALL_LOCK_TIMEOUT:-1800}s (FUZZ_INSTALL_LOCK_TIMEOUT)" >&2; exit 1; }
  if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "fuzz-smoke.sh: installing cargo-fuzz (needed for the fuzz smoke run; cargo install --locked into ${CARGO_HOME:-$HOME/.cargo}/bin)"
    cargo install cargo-fuzz --locked --quiet
  fi
  exec 8>&-
fi
export RUSTC_BOOTSTRAP=1
work=$(mktemp -d "${TMPDIR:-/tmp}/trellis-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
all=$(cd fuzz && cargo fuzz list)
for t in ${FUZZ_TARGETS:-$all}; do
  case " $(echo $all) " in *" $t "*) ;; *) echo "fuzz-smoke.sh: no fuzz target '$t' (targets: $(echo $all))" >&2; exit 2;; esac
done
for t in ${FUZZ_TARGETS:-$all}; do
  echo "fuzz target $t: ${secs}s"
  shared=$PWD/fuzz/corpus/$t
  mkdir -p "$shared" "$work/$t"
  (cd fuzz && cargo fuzz run -s "${FUZZ_SANITIZER:-address}" "$t" "$work/$t" "$shared" -- -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 2>&1 | tail -5)
  n=0
  for f in "$work/$t"/*; do
    [ -f "$f" ] || continue
    b=$(basename "$f")
    [ -e "$shared/$b" ] && continue
    cp "$f" "$shared/.$b.tmp.$$" && mv -f "$shared/.$b.tmp.$$" "$shared/$b" && n=$((n + 1))
  done
  echo "fuzz target $t: $n new corpus inputs kept in fuzz/corpus/$t"
done
