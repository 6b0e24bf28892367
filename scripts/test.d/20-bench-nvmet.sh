#!/usr/bin/env bash
# Our initiator against the Linux kernel target (nvmet-tcp in the QEMU guest).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${SKIP_VM:-0}" = 1 ]; then echo "SKIP_VM=1: skipped"; exit 0; fi
tests/bench-nvmet.sh "$TRELLIS"
