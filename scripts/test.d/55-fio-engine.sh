#!/usr/bin/env bash
# The fio ioengine (docs/fio.md): builds trellis-fio.so against the installed
# fio's own headers (scripts/build-fio-engine.sh), then runs fio through it
# against `trellis target`:
#   1. random 4 KiB writes at iodepth 16 with crc32c verify, as threads;
#   2. sequential 128 KiB writes at iodepth 4 with verify, as a process
#      (transfers of several H2CData PDUs);
#   3. a second fio process verifies what the first ones wrote (verify_only):
#      the data is on the target, not in the engine;
#   4. the same verify_only against a fresh target must FAIL: the check can fail;
#   5. a bad filename stops fio with the engine's one-line reason.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench-lib.sh
. tests/apt-lib.sh
APT_LIB_PROG=55-fio-engine.sh
if ! command -v fio >/dev/null || ! command -v dpkg-source >/dev/null; then
  can_install || { echo "skipped: fio or dpkg-dev missing and not root"; exit 77; }
  apt_install_for "the fio ioengine test (fio, and dpkg-source for fio's headers)" fio dpkg-dev
fi
work=$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/fio-engine.XXXXXX")
engine=$(scripts/build-fio-engine.sh "$work" | tail -1)
[ -f "$engine" ] || { echo "no engine built" >&2; exit 1; }
echo "engine: $engine (for $(fio --version))"

port=$(free_port)
tpid=
start_target() {
  "$TRELLIS" target --ram 256M --listen "127.0.0.1:$port" --log warn >>"$work/target.log" 2>&1 &
  tpid=$!
  wait_port "$port" 20
}
stop_target() { kill -INT "$tpid"; wait "$tpid" || { echo "target exited with $?" >&2; exit 1; }; tpid=; }
trap 'if [ -n "$tpid" ]; then kill "$tpid" 2>/dev/null || true; fi; release_ports' EXIT

job() { # NAME EXTRA-LINES...: writes $work/NAME.fio
  local name=$1; shift
  {
    echo "[global]"
    echo "ioengine=external:$engine"
    echo "filename=traddr=127.0.0.1 trsvcid=$port subnqn=nqn.2026-11.io.trellis\\:default ns=1"
    echo "size=32m"
    echo "verify=crc32c"
    echo "[$name]"
    printf '%s\n' "$@"
  } >"$work/$name.fio"
}
run_fio() { # NAME: runs it, output in $work/NAME.out
  timeout 120 fio --output-format=normal "$work/$1.fio" >"$work/$1.out" 2>&1
}

start_target
job rand4k thread=1 rw=randwrite bs=4k iodepth=16 do_verify=1 verify_state_save=0
run_fio rand4k || { cat "$work/rand4k.out"; exit 1; }
grep -q "err= 0" "$work/rand4k.out"
grep -E "issued rwts" "$work/rand4k.out"
job seq128k rw=write bs=128k iodepth=4 do_verify=1 verify_state_save=0 offset=64m
run_fio seq128k || { cat "$work/seq128k.out"; exit 1; }
grep -q "err= 0" "$work/seq128k.out"
echo "PASS: verified writes through the engine (4 KiB random, threads; 128 KiB sequential, process)"

job again rw=randread bs=4k iodepth=8 verify_only=1 verify_state_save=0
run_fio again || { cat "$work/again.out"; exit 1; }
grep -q "err= 0" "$work/again.out"
echo "PASS: a later fio process verified the data on the target"
stop_target

start_target
if run_fio again; then
  echo "verify_only passed against a fresh target: the engine's verification cannot fail" >&2
  exit 1
fi
grep -q "bad magic header" "$work/again.out"
echo "PASS: verification fails against a target that never saw the data"

cat >"$work/bad.fio" <<EOF
[bad]
ioengine=external:$engine
filename=traddr=127.0.0.1 trsvcid=notaport
rw=read
size=1m
EOF
if timeout 60 fio "$work/bad.fio" >"$work/bad.out" 2>&1; then echo "a bad filename ran" >&2; exit 1; fi
grep -q "trsvcid=notaport is not a port number" "$work/bad.out" || { cat "$work/bad.out"; exit 1; }
echo "PASS: a bad filename is refused with the engine's reason"
stop_target
if grep -E " (ERROR|WARN) " "$work/target.log"; then echo "the target logged errors" >&2; exit 1; fi
echo "fio engine: all checks passed"
