#!/usr/bin/env bash
# Our initiator (trellis bench, verify on) against our target: 4 KiB and 128 KiB, with and without digests.
set -euo pipefail
cd "$(dirname "$0")/../.."
LOG_DIR=${LOG_DIR:-$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/bench-target.XXXXXX")} \
  tests/bench-target.sh "$TRELLIS"
