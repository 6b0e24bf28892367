#!/usr/bin/env bash
# run-interop.sh - CI entry point: the Linux kernel NVMe/TCP initiator (in a QEMU VM) against the
# Trellis target running on this host.
#
# Usage:
#   run-interop.sh [options] PATH_TO_TRELLIS_BINARY
#   run-interop.sh [options] --selftest      no Trellis: the guest tests against its own Linux
#                                            kernel target (validates the harness and the steps)
# Options:
#   --config FILE       target config (default: tests/linux-vm/interop.toml)
#   --log-dir DIR       keep target.log, console.log, summary.txt here (default: a new /tmp dir)
#   --timeout S         VM timeout (default 600)
#   --keep-going        run every guest step even after a failure
#   --steps "A B ..."   run only these guest steps (see guest-initiator.sh)
#   --guest-env K=V     extra environment for guest-initiator.sh (repeatable)
#   --target-arg ARG    extra argument for `trellis target` (repeatable)
#   --io-port P         host port of the I/O + discovery listener (default: a free random port)
#   --disc-port P       host port of the discovery-only listener (default: a free random port)
#   --listen-timeout S  how long the target may take to listen (default 30; env INTEROP_LISTEN_TIMEOUT)
#
# Ports: the config names its listeners 127.0.0.1:4420 (I/O + discovery) and 127.0.0.1:8009
# (discovery only); the copy the target reads (LOG_DIR/target.toml) has them replaced by the ports
# picked (tests/port-lib.sh: random, reserved, so two runs can share a machine), and the guest gets
# them as IO_PORT and DISC_PORT. Its step discover-8009 discovers on DISC_PORT.
#
# Flow: pick the ports; start `TRELLIS target --config target.toml` in the
# background (log level from $TRELLIS_LOG, default info plus the target's debug line for each Write
# Zeroes with DEAC); wait until both ports accept TCP (--listen-timeout);
# boot the VM and run guest-initiator.sh (guest sees the host loopback as 10.0.2.2); check the
# target is still alive; SIGTERM it and require exit status 0 within 20 s; if the write-zeroes step
# passed, require the target log to show the kernel's Write Zeroes with DEAC at the LBA the guest
# printed ("expect-deac slba=N"); print a summary.
# Step ha has an HA pair of its own (start_ha below: nodes a and b on one backing file, the file
# store, ports HA_PORT_A/HA_PORT_B passed to the guest); the guest asks for kill -9 of the owner,
# drains and restarts with "@@TRELLIS-HA@@ ..." console lines; the pair is stopped at the end.
# Exit status: 0 only if every guest step passed, the DEAC check held and the target exited cleanly.
set -uo pipefail
DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONFIG=$DIR/interop.toml
LOGDIR=""; TIMEOUT=600; SELFTEST=0; TRELLIS=""; IO_PORT=""; DISC_PORT=""
LISTEN_TIMEOUT=${INTEROP_LISTEN_TIMEOUT:-30}
# shellcheck source=../port-lib.sh
. "$DIR/../port-lib.sh"
GENV=(); TARGS=()

die() { echo "run-interop: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=$2; shift 2;;
    --log-dir) LOGDIR=$2; shift 2;;
    --timeout) TIMEOUT=$2; shift 2;;
    --keep-going) GENV+=(--env KEEP_GOING=1); shift;;
    --steps) GENV+=(--env "STEPS=$2"); shift 2;;
    --guest-env) GENV+=(--env "$2"); shift 2;;
    --target-arg) TARGS+=("$2"); shift 2;;
    --io-port) IO_PORT=$2; shift 2;;
    --disc-port) DISC_PORT=$2; shift 2;;
    --listen-timeout) LISTEN_TIMEOUT=$2; shift 2;;
    --selftest) SELFTEST=1; shift;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/,""); print; next} NR>1 {exit}' "$0"; exit 0;;
    -*) die "unknown option $1";;
    *) TRELLIS=$1; shift;;
  esac
done
if [ "$SELFTEST" = 0 ]; then
  [ -n "$TRELLIS" ] || die "usage: run-interop.sh PATH_TO_TRELLIS_BINARY | --selftest (see --help)"
  [ -x "$TRELLIS" ] || die "$TRELLIS is not executable"
  TRELLIS=$(readlink -f "$TRELLIS")
  [ -r "$CONFIG" ] || die "cannot read $CONFIG"
fi
for v in "$TIMEOUT:--timeout" "$LISTEN_TIMEOUT:--listen-timeout" "${IO_PORT:-1}:--io-port" "${DISC_PORT:-1}:--disc-port"; do
  case "${v%%:*}" in ''|*[!0-9]*) die "${v#*:} wants a whole number, got '${v%%:*}'";; esac
done
[ -n "$LOGDIR" ] || LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/trellis-interop.XXXXXX")
mkdir -p "$LOGDIR"; LOGDIR=$(cd "$LOGDIR" && pwd)
: > "$LOGDIR/console.log"

T0=$SECONDS
TPID=""; TARGET_RC="-"; TARGET_NOTE=""
port_open() { port_in_use "$1"; }
# alive and not a zombie (kill -0 succeeds on an unreaped child)
running() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -c1)" != Z ]; }
stop_target() {
  [ -n "$TPID" ] || return 0
  if ! running "$TPID"; then
    wait "$TPID"; TARGET_RC=$?; TARGET_NOTE="target died during the test (exit $TARGET_RC)"; TPID=""; return 1
  fi
  kill -TERM "$TPID"
  local n=0
  while running "$TPID" && [ $n -lt 40 ]; do sleep 0.5; n=$((n + 1)); done
  if running "$TPID"; then
    kill -KILL "$TPID" 2>/dev/null; wait "$TPID" 2>/dev/null
    TARGET_RC=137; TARGET_NOTE="target did not exit within 20 s of SIGTERM (killed)"; TPID=""; return 1
  fi
  wait "$TPID"; TARGET_RC=$?; TPID=""
  if [ "$TARGET_RC" != 0 ]; then TARGET_NOTE="target exited with status $TARGET_RC after SIGTERM"; return 1; fi
  TARGET_NOTE="target exited cleanly after SIGTERM"
  return 0
}
# Step cdc: a second node (one RAM namespace, NODE2_NQN) and `trellis cdc` following the
# target's discovery-only listener and the second node; the guest runs `nvme discover` against
# the CDC and must see both nodes' subsystems (docs/target.md "Central discovery controller").
# The CDC connects as the guest's host NQN (vm.sh's fixed one): the target allows only that host,
# and a node's discovery log shows a host only the (subsystem, listener) pairs it may use. The CDC
# reads it over plain TCP, so it sees nothing of step tls's two subsystems, where this host's only
# credential is a TLS PSK (docs/security.md, "Who may connect"): the default subsystem, step
# auth's and step wear's, each on the two I/O listeners (plain and TLS): 6 entries.
CDC_PIDS=""; CDC_PORT=""; NODE2_NQN=nqn.2026-11.io.trellis:interop-node2
CDC_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:5472656c-6c69-4073-8000-000000000001
start_cdc() {
  local n2 n=0
  n2=$(free_port) && CDC_PORT=$(free_port) || return 1
  "$TRELLIS" target --ram 16M --nqn "$NODE2_NQN" --listen "127.0.0.1:$n2" --state-dir "$LOGDIR/state-node2" \
    > "$LOGDIR/node2.log" 2>&1 < /dev/null &
  CDC_PIDS=$!
  "$TRELLIS" cdc --listen "127.0.0.1:$CDC_PORT" --node "127.0.0.1:$DISC_PORT" --node "127.0.0.1:$n2" \
    --hostnqn "$CDC_HOSTNQN" --state-dir "$LOGDIR/state-cdc" > "$LOGDIR/cdc.log" 2>&1 < /dev/null &
  CDC_PIDS="$CDC_PIDS $!"
  until grep -q 'merged node="127.0.0.1:'"$n2"'" subsystems=1' "$LOGDIR/cdc.log" 2>/dev/null &&
        grep -q 'merged node="127.0.0.1:'"$DISC_PORT"'" subsystems=6' "$LOGDIR/cdc.log"; do
    [ $n -lt 100 ] || return 1
    sleep 0.1; n=$((n + 1))
  done
  echo "run-interop: trellis cdc on port $CDC_PORT follows ports $DISC_PORT and $n2" >&2
}
stop_cdc() {
  local p
  for p in $CDC_PIDS; do kill -TERM "$p" 2>/dev/null; done
  for p in $CDC_PIDS; do wait "$p" 2>/dev/null; done
  CDC_PIDS=""
}
# Step ha: an HA pair of its own (docs/target.md "HA pair"), apart from the main target: nodes a
# and b export HA_NQN with one namespace from one backing file (LOG_DIR/ha-disk.img, 256 MiB) with
# fixed identifiers, HA with the file store on LOG_DIR/ha.lock, disjoint cntlid ranges, each on its
# own port (HA_PORT_A, HA_PORT_B) and management socket. a starts first and owns the lease. The
# guest asks for kill -9, drains and restarts with "@@TRELLIS-HA@@ VERB [NODE]" console lines,
# which the console watcher below runs (ha_action); LOG_DIR/ha.log records each with its time.
HA_NQN=nqn.2026-11.io.trellis:ha; HA_PORT_A=""; HA_PORT_B=""
ha_config() { # NODE PORT CNTLID_MIN CNTLID_MAX
  cat <<EOT
[target]
reactors = 1
cntlid_min = $3
cntlid_max = $4

[ctl]
socket = "$LOGDIR/ha-$1.sock"

[ha]
node = "$1"
store = "file"
path = "$LOGDIR/ha.lock"

[[listener]]
addr = "127.0.0.1:$2"
kind = "both"

[[subsystem]]
nqn = "$HA_NQN"
serial = "TRELLISHAVM"
model = "Trellis HA"
allow_any_host = false
allowed_hosts = ["$CDC_HOSTNQN"]

[[subsystem.namespace]]
backend = "file"
path = "$LOGDIR/ha-disk.img"
size = "256MiB"
uuid = "5472656c-6c69-4073-8000-00000000b001"
nguid = "5472656c6c6940738000000000b00001"
eui64 = "0254726c6c690b01"
EOT
}
ha_log() { echo "$(date +%s.%N | cut -c1-14) $*" >> "$LOGDIR/ha.log"; }
ha_pid() { cat "$LOGDIR/ha-$1.pid" 2>/dev/null; }
ha_role() { "$TRELLIS" ctl --socket "$LOGDIR/ha-$1.sock" --json ha 2>/dev/null | tr -d ' \n' | grep -o '"role":"[a-z]*"' | cut -d'"' -f4; }
ha_start_node() { # NODE: start it (appending to LOG_DIR/ha-NODE.log), wait until it listens
  local port n=0
  [ "$1" = a ] && port=$HA_PORT_A || port=$HA_PORT_B
  NO_COLOR=1 TRELLIS_LOG=${TRELLIS_LOG:-info} "$TRELLIS" target --config "$LOGDIR/ha-$1.toml" \
    --state-dir "$LOGDIR/state-ha-$1" >> "$LOGDIR/ha-$1.log" 2>&1 < /dev/null &
  echo $! > "$LOGDIR/ha-$1.pid"
  until port_open "$port"; do
    running "$(ha_pid "$1")" && [ $n -lt 100 ] || { ha_log "start $1: FAIL (not listening on $port)"; return 1; }
    sleep 0.1; n=$((n + 1))
  done
  ha_log "start $1: pid $(ha_pid "$1") listening on $port"
}
ha_stop_node() { # NODE: SIGTERM, wait up to 20 s, then SIGKILL
  local p n=0; p=$(ha_pid "$1")
  [ -n "$p" ] && running "$p" || return 0
  kill -TERM "$p"
  while running "$p" && [ $n -lt 200 ]; do sleep 0.1; n=$((n + 1)); done
  if running "$p"; then kill -KILL "$p"; ha_log "stop $1: no exit within 20 s of SIGTERM, killed"; return 1; fi
  ha_log "stop $1: exited after SIGTERM"
}
start_ha() {
  local n=0
  HA_PORT_A=$(free_port) && HA_PORT_B=$(free_port) || return 1
  truncate -s 256M "$LOGDIR/ha-disk.img" || return 1
  ha_config a "$HA_PORT_A" 1 32767 > "$LOGDIR/ha-a.toml"
  ha_config b "$HA_PORT_B" 32768 65519 > "$LOGDIR/ha-b.toml"
  # (in a subshell: the nodes are not this shell's jobs, as those the watcher restarts are not)
  (ha_start_node a) || return 1
  until [ "$(ha_role a)" = owner ]; do [ $n -lt 100 ] || return 1; sleep 0.1; n=$((n + 1)); done
  (ha_start_node b) || return 1
  n=0
  until "$TRELLIS" ctl --socket "$LOGDIR/ha-b.sock" --json ha 2>/dev/null | tr -d ' \n' | grep -q '"holder":"a"'; do
    [ $n -lt 100 ] || return 1; sleep 0.1; n=$((n + 1))
  done
  echo "run-interop: HA pair for step ha: node a (owner) on port $HA_PORT_A, node b (standby) on port $HA_PORT_B, $HA_NQN on $LOGDIR/ha-disk.img" >&2
}
stop_ha() { ha_stop_node a; ha_stop_node b; }
ha_action() { # VERB [NODE], from the guest's @@TRELLIS-HA@@ line
  local o
  case "$1" in
    kill-owner)
      for o in a b; do [ "$(ha_role $o)" = owner ] && break; o=""; done
      [ -n "$o" ] || { ha_log "kill-owner: FAIL (no node is the owner)"; return; }
      kill -KILL "$(ha_pid $o)" && ha_log "kill-owner: kill -9 $o (pid $(ha_pid $o))";;
    drain-owner)
      for o in a b; do [ "$(ha_role $o)" = owner ] && break; o=""; done
      [ -n "$o" ] || { ha_log "drain-owner: FAIL (no node is the owner)"; return; }
      ha_log "drain-owner: trellis ctl drain on $o"
      "$TRELLIS" ctl --socket "$LOGDIR/ha-$o.sock" drain >> "$LOGDIR/ha.log" 2>&1 ||
        ha_log "drain-owner: FAIL (trellis ctl drain on $o: exit $?)";;
    start|restart)
      case "${2:-}" in a|b) ;; *) ha_log "$1: FAIL (node '${2:-}' is not a or b)"; return;; esac
      [ "$1" = start ] || ha_stop_node "$2"
      ha_start_node "$2";;
    *) ha_log "unknown request: $*";;
  esac
}
trap 'stop_ha >/dev/null 2>&1; stop_cdc >/dev/null 2>&1; stop_target >/dev/null 2>&1; exit 130' INT TERM

if [ "$SELFTEST" = 0 ]; then
  [ -n "$IO_PORT" ] || IO_PORT=$(free_port) || die "no free port for the I/O listener"
  [ -n "$DISC_PORT" ] || DISC_PORT=$(free_port) || die "no free port for the discovery listener"
  [ "$IO_PORT" != "$DISC_PORT" ] || die "--io-port and --disc-port are both $IO_PORT"
  TLS_PORT=$(free_port) || die "no free port for the TLS listener"
  for p in "$IO_PORT" "$DISC_PORT"; do port_open "$p" && die "127.0.0.1:$p is already in use (a stale target?)"; done
  # The target reads a copy of CONFIG with the conventional ports moved to the ones picked.
  TCONFIG=$LOGDIR/target.toml
  # Private, as the target requires of a file that holds keys (docs/security.md).
  : > "$TCONFIG" && chmod 600 "$TCONFIG"
  sed -e "s/^\(addr *= *\"127\.0\.0\.1:\)4420\"/\1$IO_PORT\"/" \
      -e "s/^\(addr *= *\"127\.0\.0\.1:\)8009\"/\1$DISC_PORT\"/" \
      -e "s/^\(addr *= *\"127\.0\.0\.1:\)4421\"/\1$TLS_PORT\"/" "$CONFIG" > "$TCONFIG"
  for p in "$IO_PORT" "$DISC_PORT"; do
    grep -q "^addr *= *\"127\.0\.0\.1:$p\"" "$TCONFIG" ||
      die "$CONFIG needs [[listener]] lines addr = \"127.0.0.1:4420\" and addr = \"127.0.0.1:8009\" (run-interop.sh moves them to free ports)"
  done
  echo "run-interop: starting $TRELLIS target --config $TCONFIG (from $CONFIG; I/O port $IO_PORT, discovery port $DISC_PORT) ${TARGS[*]:-}" >&2
  # The node identity file goes with the logs, not beside the config in the source tree.
  CTL_SOCK=$LOGDIR/ctl.sock
  NO_COLOR=1 TRELLIS_LOG=${TRELLIS_LOG:-info,trellis_node::data::nvme::io=debug} "$TRELLIS" target --config "$TCONFIG" --state-dir "$LOGDIR/state" \
    --ctl-socket "$CTL_SOCK" ${TARGS[@]+"${TARGS[@]}"} \
    > "$LOGDIR/target.log" 2>&1 < /dev/null &
  TPID=$!
  n=0
  until port_open "$IO_PORT" && port_open "$DISC_PORT"; do
    if ! running "$TPID"; then
      wait "$TPID"; rc=$?; TPID=""
      sed 's/^/  target: /' "$LOGDIR/target.log" | tail -30 >&2
      die "the target exited (status $rc) before listening"
    fi
    [ $n -lt $((LISTEN_TIMEOUT * 10)) ] || { stop_target; sed 's/^/  target: /' "$LOGDIR/target.log" | tail -30 >&2; die "target not listening on $IO_PORT and $DISC_PORT after $LISTEN_TIMEOUT s (--listen-timeout)"; }
    sleep 0.1; n=$((n + 1))
  done
  echo "run-interop: target listening (pid $TPID) after $((SECONDS - T0))s" >&2
  start_cdc || { stop_cdc; stop_target; die "could not start the second node and trellis cdc for step cdc (logs in $LOGDIR)"; }
  start_ha || { stop_ha; stop_cdc; stop_target; die "could not start the HA pair for step ha (logs in $LOGDIR/ha-*.log, ha.log)"; }
  GENV=(--env TARGET_ADDR=10.0.2.2 --env "IO_PORT=$IO_PORT" --env "DISC_PORT=$DISC_PORT" --env "TLS_PORT=$TLS_PORT"
        --env "CDC_PORT=$CDC_PORT" --env "NODE2_NQN=$NODE2_NQN"
        --env "HA_NQN=$HA_NQN" --env "HA_PORT_A=$HA_PORT_A" --env "HA_PORT_B=$HA_PORT_B" ${GENV[@]+"${GENV[@]}"})
else
  GENV=(--env SELFTEST=1 ${GENV[@]+"${GENV[@]}"})
fi

# The guest's step ns-change asks for live namespace changes by printing
# "@@TRELLIS-CTL@@ namespace add|remove ARGS" (it cannot reach the management socket); this runs
# them as `trellis ctl` while the VM runs. Only `namespace` and `referral` commands are accepted
# (step disc-aen asks for a referral). Step ha's "@@TRELLIS-HA@@ kill-owner | drain-owner |
# start NODE | restart NODE" lines go to ha_action.
WATCH_PID=""
if [ "$SELFTEST" = 0 ]; then
  (
    seen=0
    while :; do
      n=$(wc -l < "$LOGDIR/console.log")
      if [ "$n" -gt "$seen" ]; then
        sed -n "$((seen + 1)),${n}p" "$LOGDIR/console.log" | grep -E '^@@TRELLIS-CTL@@ (namespace|referral) ' |
          while IFS= read -r line; do
            # shellcheck disable=SC2086  # the guest's words are the arguments
            set -- ${line#@@TRELLIS-CTL@@ }
            echo "run-interop: trellis ctl $*" >> "$LOGDIR/ctl.log"
            "$TRELLIS" ctl --socket "$CTL_SOCK" "$@" >> "$LOGDIR/ctl.log" 2>&1 ||
              echo "run-interop: trellis ctl failed (exit $?)" >> "$LOGDIR/ctl.log"
          done
        sed -n "$((seen + 1)),${n}p" "$LOGDIR/console.log" | tr -d '\r' | grep -E '^@@TRELLIS-HA@@ ' |
          while IFS= read -r line; do
            # shellcheck disable=SC2086  # the guest's words are the arguments
            ha_action ${line#@@TRELLIS-HA@@ }
          done
        seen=$n
      fi
      sleep 0.2
    done
  ) &
  WATCH_PID=$!
fi
T_VM=$SECONDS
"$DIR/vm.sh" --timeout "$TIMEOUT" --log "$LOGDIR/console.log" --add "$DIR/guest-nvmet.sh" \
  ${GENV[@]+"${GENV[@]}"} "$DIR/guest-initiator.sh" 2> >(tee "$LOGDIR/vm.err" >&2)
VM_RC=$?
if [ -n "$WATCH_PID" ]; then kill "$WATCH_PID" 2>/dev/null; wait "$WATCH_PID" 2>/dev/null; fi
sleep 0.3   # let the stderr tee finish
T_VM=$((SECONDS - T_VM))
TARGET_OK=1
if [ "$SELFTEST" = 0 ]; then stop_ha; stop_cdc; stop_target || TARGET_OK=0; fi
# The guest cannot see the target: check here that the Write Zeroes it expects carried DEAC.
DEAC_NOTE=""
if [ "$SELFTEST" = 0 ] && grep -q '^STEP write-zeroes: ok' "$LOGDIR/console.log"; then
  for slba in $(grep -o 'expect-deac slba=[0-9]*' "$LOGDIR/console.log" | cut -d= -f2); do
    if grep -q "write zeroes with deallocate (DEAC) nsid=1 slba=$slba " "$LOGDIR/target.log"; then
      DEAC_NOTE="$DEAC_NOTE ok@$slba"
    else
      DEAC_NOTE="$DEAC_NOTE FAIL@$slba"; TARGET_OK=0
    fi
  done
  DEAC_NOTE="Write Zeroes with DEAC expected at LBA:${DEAC_NOTE:- (none)}; $(grep -c 'write zeroes with deallocate' "$LOGDIR/target.log") logged"
fi
{
  echo "==================== Linux NVMe/TCP initiator interop summary"
  if [ "$SELFTEST" = 1 ]; then echo "target : Linux nvmet inside the guest (--selftest)"
  else echo "target : $TRELLIS ($CONFIG; I/O port $IO_PORT, discovery-only port $DISC_PORT)"; fi
  grep -E '^STEP |^SUMMARY' "$LOGDIR/console.log" || echo "(no guest step output)"
  echo "vm     : exit $VM_RC, ${T_VM}s ($(grep -o 'vm.sh: accel=.*' "$LOGDIR/vm.err" | tail -1))"
  [ "$SELFTEST" = 1 ] || echo "target : $TARGET_NOTE"
  [ -z "$DEAC_NOTE" ] || echo "deac   : $DEAC_NOTE"
  [ ! -s "$LOGDIR/ctl.log" ] || echo "ctl    : $(grep -cE '^run-interop: trellis ctl (namespace|referral)' "$LOGDIR/ctl.log") request(s) from the guest: $(grep -v '^run-interop:' "$LOGDIR/ctl.log" | tr '\n' ';')"
  [ ! -s "$LOGDIR/ha.log" ] || echo "ha     : $(grep -E '^[0-9.]+ (kill-owner|drain-owner|start|stop|unknown)' "$LOGDIR/ha.log" | cut -d' ' -f2- | tr '\n' ';')"
  echo "total  : $((SECONDS - T0))s; logs in $LOGDIR"
} | tee "$LOGDIR/summary.txt"
if [ "$SELFTEST" = 0 ] && [ "$TARGET_OK" = 0 ]; then
  echo "--- target log (last 40 lines)"; tail -40 "$LOGDIR/target.log"
fi
if [ "$VM_RC" = 0 ] && [ "$TARGET_OK" = 1 ]; then echo "RESULT: PASS"; exit 0; fi
echo "RESULT: FAIL"
[ "$VM_RC" = 0 ] && exit 1 || exit "$VM_RC"
