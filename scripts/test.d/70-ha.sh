#!/usr/bin/env bash
# HA pair with etcd as a real process (Debian's etcd-server) on loopback:
# crates/app/cli/tests/ha.rs: kill -9 of the lease holder under
# `trellis bench --verify`, fencing on a silent etcd (SIGSTOP), drain and
# failback, etcd with auth and with client-certificate TLS (its throwaway CA
# is made with the openssl command); TRELLIS_REQUIRE_ETCD=1 makes a missing
# etcd a failure, and the suite fails unless every etcd test in ha.rs ran
# and passed. The etcd store is in every build (no feature, no protoc).
# Then crates/app/cli/tests/nemesis.rs's etcd run (issue 37 item 6: kills,
# freezes, drains and partitions (host-owner, owner-etcd, standby-etcd, as
# nftables rules: root and nft required) against a pair on a 2 s etcd lease, every block checked
# against the write history; its file-store run is in `cargo test
# --workspace`). About 90 s plus the build.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=../../tests/apt-lib.sh
. tests/apt-lib.sh
APT_LIB_PROG=70-ha
need=()
command -v etcd >/dev/null || need+=(etcd-server)
command -v openssl >/dev/null || need+=(openssl)
command -v nft >/dev/null || need+=(nftables)
if [ ${#need[@]} -gt 0 ]; then
  if can_install; then
    apt_install_for "the HA pair tests (etcd as a real process; openssl makes the TLS test's CA; nft cuts the fault harness's partitions)" "${need[@]}"
  else
    echo "skipped: ${need[*]} missing and not root (apt-get install etcd-server openssl)"
    exit 77
  fi
fi
etcd --version | sed -n 1p  # sed reads it all: head would leave etcd a SIGPIPE, and pipefail fails the suite (exit 141)
cargo clippy -p trellis-node -p trellis-cli --all-targets -- -D warnings
log=$(mktemp "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/ha.XXXXXX")
status=0
TRELLIS_REQUIRE_ETCD=1 cargo test -p trellis-cli --test ha -- --nocapture >"$log" 2>&1 || status=$?
# The measured figures and the verdicts; the whole log on a failure.
grep -E '^test |test result|failover|fenced|drain to|bench:|refused start' "$log" || true
[ "$status" = 0 ] || { cat "$log"; exit 1; }
# Passing is not enough: every etcd test must have run (not been filtered
# away or skipped).
want=$(grep -c '^    fn etcd_' crates/app/cli/tests/ha.rs || true)
ran=$(grep -cE '^test etcd::etcd_[a-z0-9_]+ \.\.\. ok$' "$log" || true)
if [ "$want" = 0 ] || [ "$ran" != "$want" ] || grep -q '^SKIPPED' "$log"; then
  cat "$log"
  echo "70-ha: $ran of the $want etcd tests in crates/app/cli/tests/ha.rs ran and passed; etcd is required here"
  exit 1
fi
# The fault harness with etcd (the file-store run is in cargo test --workspace).
nlog=$(mktemp "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/nemesis.XXXXXX")
status=0
TRELLIS_REQUIRE_ETCD=1 TRELLIS_REQUIRE_PARTITIONS=1 cargo test -p trellis-cli --test nemesis etcd:: -- --nocapture >"$nlog" 2>&1 || status=$?
grep -E '^test |test result|^nemesis' "$nlog" || true
[ "$status" = 0 ] || { cat "$nlog"; exit 1; }
if ! grep -qE '^test etcd::etcd_nemesis_[a-z0-9_]+ \.\.\. ok$' "$nlog" || grep -q '^SKIPPED' "$nlog"; then
  cat "$nlog"
  echo "70-ha: the etcd run of crates/app/cli/tests/nemesis.rs did not run and pass"
  exit 1
fi
