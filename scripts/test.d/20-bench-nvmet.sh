#!/usr/bin/env bash
# Our initiator against the Linux kernel target (nvmet-tcp in the QEMU guest).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${SKIP_VM:-0}" = 1 ]; then echo "skipped: ${TRELLIS_SKIP_VM_REASON:-SKIP_VM=1}"; exit 77; fi
LOG_DIR=${LOG_DIR:-$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/bench-nvmet.XXXXXX")} \
  tests/bench-nvmet.sh "$TRELLIS"
