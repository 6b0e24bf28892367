#!/usr/bin/env bash
# Interleaved A/B of the target's socket engines: A = epoll, B = io_uring
# (see bench/ab.sh for the method and the table).
#
#   bench/ab-engines.sh [REPS=3] [RUNTIME_S=3]      (env TRELLIS: binary to use)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TRELLIS:-${CARGO_TARGET_DIR:-target}/release/trellis}
[ -x "$T" ] || cargo build --release -p trellis-cli
exec bench/ab.sh "$T target --engine epoll" "$T target --engine uring" "${1:-3}" "${2:-3}"
