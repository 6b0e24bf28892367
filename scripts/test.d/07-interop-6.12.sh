#!/usr/bin/env bash
# The Linux interop steps that need a newer kernel than Debian 12's 6.1, against Debian 13's
# 6.12 (tests/linux-vm/vm.sh TRELLIS_VM_SUITE=trixie): DH-HMAC-CHAP (step auth: Debian's 6.1
# is built without CONFIG_NVME_AUTH, so the default run reports it SKIPPED), NVMe/TCP TLS
# (step tls: needs kernel >= 6.7 and tlshd, which the trixie suite brings), plus connect,
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
  --steps "discover-io connect resv fio-4k auth tls disconnect-all" --log-dir "$log_dir" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" = 0 ] || exit "$rc"
# A kernel without in-band authentication would pass step auth as SKIPPED: not here.
grep -q 'kernel=6\.1[2-9]' "$log_dir/console.log" || { echo "07-interop-6.12: the guest did not boot a 6.12+ kernel"; exit 1; }
for s in auth tls; do
  if grep -E "^STEP $s: ok" "$out" | grep -q SKIPPED; then echo "07-interop-6.12: step $s was skipped on the newer kernel"; exit 1; fi
done
# A refused SHA-384 key must have been refused for the reason the step accepts, said by the target.
if grep -E '^STEP tls: ok' "$out" | grep -q 'SHA-384 key refused'; then
  grep -q 'does not offer TLS_AES_128_GCM_SHA256' "$log_dir/target.log" ||
    { echo "07-interop-6.12: the SHA-384 key was refused, but not because the host bound it with SHA-256 (target.log)"; exit 1; }
fi
