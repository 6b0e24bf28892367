#!/usr/bin/env bash
# nvmet-vm.sh - run the Linux kernel NVMe/TCP target (nvmet-tcp) in the test VM, reachable from
# the host at 127.0.0.1:PORT through a QEMU user-net port forward (host PORT -> guest 4420).
#
# Usage:
#   nvmet-vm.sh start [--port P] [--timeout S] [--ready-timeout S] [--env KEY=VALUE]...
#       Boot the VM in the background (guest-nvmet.sh), wait for its READY marker, check that an
#       NVMe/TCP ICReq through the forward gets an ICResp, then print the port on stdout and exit 0.
#       --port: default $TRELLIS_NVMET_PORT or a free random port (tests/port-lib.sh: reserved,
#       so concurrent test runs never pick the same one).
#       --timeout: the VM stops by itself after S seconds (default 1800).
#       --env: passed to guest-nvmet.sh (e.g. NVMET_SIZE_MB=512, NVMET_BACKEND=null_blk; the
#       DH-HMAC-CHAP and TLS settings NVMET_DHCHAP_KEY, NVMET_TLS_KEY, ... are in its header).
#       --suite trixie: boot Debian 13's 6.12 kernel with tlshd and nvme-cli 2.13 (vm.sh's
#       TRELLIS_VM_SUITE, which is also passed through from the environment); needed for
#       DH-HMAC-CHAP and TLS.
#       --fwd GUESTPORT[=HOSTPORT]: forward one more guest port (e.g. a second nvmet port from
#       NVMET_PORTS); the host port is a free random one unless given. Repeatable.
#       `nvmet-vm.sh port GUESTPORT` prints it. The ICReq probe goes to guest port 4420 only.
#   nvmet-vm.sh stop      ask the guest to stop (control serial), wait, kill if needed; exit = guest status
#   nvmet-vm.sh status    print "running PORT" (exit 0) or "stopped" (exit 1)
#   nvmet-vm.sh probe [PORT]   send an ICReq to 127.0.0.1:PORT and check the ICResp header
#   nvmet-vm.sh port GUESTPORT print the host port forwarded to GUESTPORT (4420 or a --fwd one)
#
# Subsystem: nqn.2026-11.io.trellis:linux-nvmet (by default allow_any_host, one 256 MiB brd namespace, NSID 1).
# State (pid files, console.log, port) lives in ${TRELLIS_NVMET_STATE:-${TMPDIR:-/tmp}/trellis-nvmet-vm};
# one VM per state directory (tests/bench-nvmet.sh gives each run its own).
# Example:
#   PORT=$(tests/linux-vm/nvmet-vm.sh start)
#   trellis bench --addr 127.0.0.1:$PORT --nqn nqn.2026-11.io.trellis:linux-nvmet --verify ...
#   tests/linux-vm/nvmet-vm.sh stop
set -euo pipefail
DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${TRELLIS_NVMET_STATE:-${TMPDIR:-/tmp}/trellis-nvmet-vm}
NQN=nqn.2026-11.io.trellis:linux-nvmet

die() { echo "nvmet-vm: $*" >&2; exit 1; }
say() { echo "nvmet-vm: $*" >&2; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# shellcheck source=../port-lib.sh
. "$DIR/../port-lib.sh"
port_busy() { port_in_use "$1"; }

# ICReq (CH: type 0, flags 0, HLEN 128, PDO 0, PLEN 128; PFV 0, HPDA 0, no digests, MAXR2T 0)
# -> expect an ICResp common header: 01 00 80 00 80 00 00 00
probe() {
  local port=$1 hex
  hex=$(timeout 15 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
    { printf "\x00\x00\x80\x00\x80\x00\x00\x00"; head -c 120 /dev/zero; } >&3
    head -c 8 <&3 | od -An -tx1' "$port" 2>/dev/null || true)
  hex=$(echo $hex)
  if [ "$hex" = "01 00 80 00 80 00 00 00" ]; then
    say "probe 127.0.0.1:$port: ICResp ok ($hex)"; return 0
  fi
  say "probe 127.0.0.1:$port: no valid ICResp (got '${hex}')"; return 1
}

cmd=${1:-}; [ $# -gt 0 ] && shift
case "$cmd" in
start)
  PORT=${TRELLIS_NVMET_PORT:-}; TIMEOUT=1800; READY=300; ENVS=(); XFWD=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --port) PORT=$2; shift 2;;
      --suite) export TRELLIS_VM_SUITE=$2; shift 2;;
      --fwd) case "$2" in [0-9]*) XFWD+=("$2");; *) die "--fwd wants GUESTPORT[=HOSTPORT]";; esac; shift 2;;
      --timeout) TIMEOUT=$2; shift 2;;
      --ready-timeout) READY=$2; shift 2;;
      --env) ENVS+=(--env "$2"); shift 2;;
      *) die "unknown option $1";;
    esac
  done
  if alive "$STATE/launcher.pid"; then die "already running (port $(cat "$STATE/port" 2>/dev/null)); use stop"; fi
  for v in "$TIMEOUT:--timeout" "$READY:--ready-timeout" "${PORT:-1}:--port"; do
    case "${v%%:*}" in ''|*[!0-9]*) die "${v#*:} wants a whole number, got '${v%%:*}'";; esac
  done
  if [ -z "$PORT" ]; then
    PORT=$(free_port) || die "no free port"
  elif port_busy "$PORT"; then
    die "127.0.0.1:$PORT is already in use"
  fi
  FWDS=(--hostfwd "$PORT:4420"); MAP="4420 $PORT"
  for f in ${XFWD[@]+"${XFWD[@]}"}; do
    g=${f%%=*}; h=${f#*=}; [ "$h" = "$f" ] && h=""
    case "$g:${h:-1}" in *[!0-9:]*|:*) die "--fwd $f: want GUESTPORT[=HOSTPORT]";; esac
    [ "$g" != 4420 ] || die "--fwd 4420: guest port 4420 is --port's"
    if [ -z "$h" ]; then h=$(free_port) || die "no free port for guest port $g"
    elif port_busy "$h"; then die "127.0.0.1:$h (for guest port $g) is already in use"; fi
    FWDS+=(--hostfwd "$h:$g"); MAP="$MAP
$g $h"
  done
  rm -rf "$STATE"; mkdir -p "$STATE"
  echo "$MAP" > "$STATE/ports"
  # the guest stops itself shortly before vm.sh's hard timeout
  setsid "$DIR/vm.sh" --state-dir "$STATE" --quiet --log "$STATE/console.log" --timeout "$TIMEOUT" \
    "${FWDS[@]}" --env "NVMET_TIMEOUT=$((TIMEOUT > 60 ? TIMEOUT - 30 : TIMEOUT))" \
    ${ENVS[@]+"${ENVS[@]}"} "$DIR/guest-nvmet.sh" > "$STATE/vm.out" 2>&1 < /dev/null &
  echo $! > "$STATE/launcher.pid"
  echo "$PORT" > "$STATE/port"
  say "booting the VM${TRELLIS_VM_SUITE:+ ($TRELLIS_VM_SUITE)} (forward $(awk '{printf "%s127.0.0.1:%s -> guest :%s", (NR > 1 ? ", " : ""), $2, $1}' "$STATE/ports")), state in $STATE"
  T0=$SECONDS
  while ! grep -q '@@NVMET-READY@@' "$STATE/console.log" 2>/dev/null; do
    if ! alive "$STATE/launcher.pid"; then
      sed 's/^/  /' "$STATE/vm.out" >&2; tail -40 "$STATE/console.log" 2>/dev/null | sed 's/^/  console: /' >&2
      die "the VM exited before the target was ready"
    fi
    if [ $((SECONDS - T0)) -ge "$READY" ]; then
      tail -40 "$STATE/console.log" 2>/dev/null | sed 's/^/  console: /' >&2
      "$0" stop >/dev/null 2>&1 || true
      die "no READY marker after ${READY}s"
    fi
    sleep 0.5
  done
  grep '@@NVMET-READY@@' "$STATE/console.log" | head -1 | sed 's/^/nvmet-vm: /' >&2
  if ! probe "$PORT"; then "$0" stop >/dev/null 2>&1 || true; die "target not reachable through the forward"; fi
  say "ready after $((SECONDS - T0))s: 127.0.0.1:$PORT subsystem $NQN"
  echo "$PORT"
  ;;
stop)
  if ! alive "$STATE/launcher.pid"; then say "not running"; exit 0; fi
  LPID=$(cat "$STATE/launcher.pid")
  if [ -p "$STATE/ctl.in" ]; then timeout 5 bash -c 'echo stop > "$0"' "$STATE/ctl.in" || true; fi
  n=0; while kill -0 "$LPID" 2>/dev/null && [ $n -lt 60 ]; do sleep 0.5; n=$((n + 1)); done
  if kill -0 "$LPID" 2>/dev/null; then
    say "guest did not stop in 30s; terminating the VM"
    kill -TERM "$LPID" 2>/dev/null || true
    n=0; while kill -0 "$LPID" 2>/dev/null && [ $n -lt 20 ]; do sleep 0.5; n=$((n + 1)); done
    if kill -0 "$LPID" 2>/dev/null; then
      [ -s "$STATE/qemu.pid" ] && kill -KILL "$(cat "$STATE/qemu.pid")" 2>/dev/null || true
      kill -KILL "$LPID" 2>/dev/null || true
    fi
  fi
  grep 'guest-nvmet:' "$STATE/console.log" 2>/dev/null | tail -20 >&2 || true
  tail -1 "$STATE/vm.out" >&2 || true
  RC=$(sed -n 's/.*vm.sh: accel=.* rc=\([0-9]*\)$/\1/p' "$STATE/vm.out" | tail -1)
  rm -f "$STATE/launcher.pid"
  exit "${RC:-1}"
  ;;
status)
  if alive "$STATE/launcher.pid"; then echo "running $(cat "$STATE/port")"; exit 0; fi
  echo stopped; exit 1
  ;;
probe)
  probe "${1:-$(cat "$STATE/port" 2>/dev/null || echo 4420)}"
  ;;
port)
  [ $# = 1 ] || die "usage: nvmet-vm.sh port GUESTPORT"
  h=$(awk -v g="$1" '$1 == g {print $2}' "$STATE/ports" 2>/dev/null || true)
  [ -n "$h" ] || die "guest port $1 is not forwarded (started with --fwd $1?; state $STATE)"
  echo "$h"
  ;;
-h|--help|"")
  awk 'NR>1 && /^#/ {sub(/^# ?/,""); print; next} NR>1 {exit}' "$0"; [ -n "$cmd" ]
  ;;
*) die "unknown command $cmd (start|stop|status|probe|port)";;
esac
