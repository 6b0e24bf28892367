#!/usr/bin/env bash
# The Linux interop steps that need a newer kernel than Debian 12's 6.1, against Debian 13's
# 6.12 (tests/linux-vm/vm.sh TRELLIS_VM_SUITE=trixie): DH-HMAC-CHAP (step auth: Debian's 6.1
# is built without CONFIG_NVME_AUTH, so the default run reports it SKIPPED), plus connect,
# reservations and I/O on the newer host stack. The kernel .deb comes through a private apt
# list in the VM cache (~100 MB once).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${SKIP_VM:-0}" = 1 ]; then
  echo "skipped: ${TRELLIS_SKIP_VM_REASON:-SKIP_VM=1}"
  exit 77
fi
if [ -n "${INTEROP_LOG_DIR:-}" ]; then log_dir=$INTEROP_LOG_DIR-6.12
else log_dir=$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/interop-6.12.XXXXXX"); fi
out=$log_dir.out
set +e
TRELLIS_VM_SUITE=trixie tests/linux-vm/run-interop.sh "$TRELLIS" \
  --steps "discover-io connect resv fio-4k auth disconnect-all" --log-dir "$log_dir" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" = 0 ] || exit "$rc"
# A kernel without in-band authentication would pass step auth as SKIPPED: not here.
grep -q 'kernel=6\.1[2-9]' "$log_dir/console.log" || { echo "07-interop-6.12: the guest did not boot a 6.12+ kernel"; exit 1; }
if grep -E '^STEP auth: ok' "$out" | grep -q SKIPPED; then echo "07-interop-6.12: step auth was skipped on the newer kernel"; exit 1; fi
