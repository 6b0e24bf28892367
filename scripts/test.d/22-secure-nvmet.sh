#!/usr/bin/env bash
# Our initiator against the Linux kernel target with DH-HMAC-CHAP and NVMe/TCP TLS (Debian 13's
# 6.12 nvmet-tcp with tlshd in the QEMU guest; tests/secure-nvmet.sh). Fails, not skips, when
# the guest is older than 6.12 or a case did not run.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${SKIP_VM:-0}" = 1 ]; then echo "skipped: ${TRELLIS_SKIP_VM_REASON:-SKIP_VM=1}"; exit 77; fi
LOG_DIR=${LOG_DIR:-$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/secure-nvmet.XXXXXX")} \
  tests/secure-nvmet.sh "${TRELLIS:-${CARGO_TARGET_DIR:-target}/debug/trellis}"
