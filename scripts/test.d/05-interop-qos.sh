#!/usr/bin/env bash
# The Linux kernel initiator (QEMU guest) against a target with Gimbal on
# every namespace (--qos gimbal): a stock host ignores the I/O credits in
# CQE DW1 and must see no difference. Verified fio, Write Zeroes, large I/O
# and ext4. Skipped with the other VM tests (SKIP_VM=1).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${SKIP_VM:-0}" = 1 ]; then
  echo "skipped: ${TRELLIS_SKIP_VM_REASON:-SKIP_VM=1}"
  exit 77
fi
# Logs: INTEROP_LOG_DIR-qos if set, else this test run's directory, else a new temp dir.
if [ -n "${INTEROP_LOG_DIR:-}" ]; then log_dir=$INTEROP_LOG_DIR-qos
else log_dir=$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/interop-qos.XXXXXX"); fi
tests/linux-vm/run-interop.sh "$TRELLIS" --target-arg --qos --target-arg gimbal \
  --steps "discover-io connect fio-4k fio-128k write-zeroes large-io ext4 disconnect-all" \
  --log-dir "$log_dir"
