#!/usr/bin/env bash
# A few seconds of the benchmark suite (Trellis vs the raw TCP baseline), for
# breakage only: CI never judges speed. Uses the already built binary.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/bench-smoke.XXXXXX")
TRELLIS="$TRELLIS" bench/run.sh --smoke --out "$out"
test -s "$out/suite.json" && test -s "$out/summary.md"
cat "$out/summary.md"
