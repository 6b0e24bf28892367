#!/usr/bin/env bash
# The Linux kernel initiator (QEMU guest) against a target with Gimbal on
# every namespace (--qos gimbal): a stock host ignores the I/O credits in
# CQE DW1 and must see no difference. Verified fio, Write Zeroes, large I/O
# and ext4. Skipped with the other VM tests (SKIP_VM=1).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${SKIP_VM:-0}" = 1 ]; then
  echo "skipped (SKIP_VM=1)"
  exit 0
fi
tests/linux-vm/run-interop.sh "$TRELLIS" --target-arg --qos --target-arg gimbal \
  --steps "discover-io connect fio-4k fio-128k write-zeroes large-io ext4 disconnect-all" \
  --log-dir "${INTEROP_LOG_DIR:-/tmp/trellis-interop}-qos"
