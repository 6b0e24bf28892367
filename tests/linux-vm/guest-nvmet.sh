#!/bin/sh
# guest-nvmet.sh - runs INSIDE the test VM (busybox sh): configure the Linux kernel NVMe/TCP
# target (nvmet + nvmet-tcp via configfs) with a RAM-backed namespace.
#
#   sh guest-nvmet.sh          configure, print "@@NVMET-READY@@ ...", serve until stopped, tear down
#   sh guest-nvmet.sh setup    configure only and return (used by guest-initiator.sh SELFTEST=1)
#
# Stop (serve mode): a line written by the host to the control serial port /dev/ttyS2
# (vm.sh --state-dir DIR: `echo stop > DIR/ctl.in`; nvmet-vm.sh stop does that), the file
# /tmp/nvmet-stop, or NVMET_TIMEOUT seconds.
#
# Environment (defaults):
#   NVMET_NQN=nqn.2026-11.io.trellis:linux-nvmet  subsystem NQN
#   NVMET_ADDR=0.0.0.0                            listen address (0.0.0.0 = reachable through QEMU hostfwd)
#   NVMET_PORTS="4420"                            TCP ports, one nvmet port each, all linked to the subsystem
#   NVMET_ALLOWED_HOSTS=""                        host NQNs allowed (space separated); empty = allow_any_host
#   NVMET_BACKEND=brd                             brd (RAM disk, keeps data) | null_blk (discards data; perf only)
#   NVMET_SIZE_MB=256                             namespace size
#   NVMET_SERIAL=TRELLISLNX01                     controller serial number
#   NVMET_INLINE=                                 if set: port param_inline_data_size (bytes)
#   NVMET_TIMEOUT=3600                            serve mode: stop after this many seconds
NVMET_NQN=${NVMET_NQN:-nqn.2026-11.io.trellis:linux-nvmet}
NVMET_ADDR=${NVMET_ADDR:-0.0.0.0}
NVMET_PORTS=${NVMET_PORTS:-4420}
NVMET_ALLOWED_HOSTS=${NVMET_ALLOWED_HOSTS:-}
NVMET_BACKEND=${NVMET_BACKEND:-brd}
NVMET_SIZE_MB=${NVMET_SIZE_MB:-256}
NVMET_SERIAL=${NVMET_SERIAL:-TRELLISLNX01}
NVMET_INLINE=${NVMET_INLINE:-}
NVMET_TIMEOUT=${NVMET_TIMEOUT:-3600}
C=/sys/kernel/config/nvmet
S=$C/subsystems/$NVMET_NQN

log() { echo "guest-nvmet: $*"; }
fail() { log "FAIL: $*"; exit 1; }

setup() {
  modprobe nvmet || fail "modprobe nvmet"
  modprobe nvmet-tcp || fail "modprobe nvmet-tcp"
  [ -d $C ] || mount -t configfs configfs /sys/kernel/config
  [ -d $C ] || fail "no $C"
  case "$NVMET_BACKEND" in
    brd)
      if [ ! -b /dev/ram0 ]; then
        modprobe brd rd_nr=1 rd_size=$((NVMET_SIZE_MB * 1024)) max_part=0 || fail "modprobe brd"
      fi
      DEV=/dev/ram0;;
    null_blk)
      if [ ! -b /dev/nullb0 ]; then
        modprobe null_blk nr_devices=1 gb=$(( (NVMET_SIZE_MB + 1023) / 1024 )) bs=4096 queue_mode=2 irqmode=0 ||
          fail "modprobe null_blk"
      fi
      DEV=/dev/nullb0;;
    *) fail "unknown NVMET_BACKEND $NVMET_BACKEND";;
  esac
  n=0; while [ ! -b $DEV ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n+1)); done
  [ -b $DEV ] || fail "no $DEV"

  mkdir -p $S || fail "mkdir subsystem"
  if [ -z "$NVMET_ALLOWED_HOSTS" ]; then
    echo 1 > $S/attr_allow_any_host
  else
    echo 0 > $S/attr_allow_any_host
    for h in $NVMET_ALLOWED_HOSTS; do
      mkdir -p $C/hosts/$h || fail "mkdir host $h"
      [ -e $S/allowed_hosts/$h ] || ln -s $C/hosts/$h $S/allowed_hosts/$h || fail "allow host $h"
    done
  fi
  [ -w $S/attr_serial ] && echo "$NVMET_SERIAL" > $S/attr_serial
  [ -w $S/attr_model ] && echo "Linux nvmet (trellis test VM)" > $S/attr_model 2>/dev/null
  mkdir -p $S/namespaces/1 || fail "mkdir namespace"
  echo -n $DEV > $S/namespaces/1/device_path
  echo 1 > $S/namespaces/1/enable || fail "enable namespace"
  i=0
  for p in $NVMET_PORTS; do
    i=$((i+1))
    P=$C/ports/$i
    mkdir -p $P || fail "mkdir port $i"
    if [ "$(cat $P/addr_trtype 2>/dev/null)" != tcp ]; then
      echo ipv4 > $P/addr_adrfam
      echo tcp > $P/addr_trtype
      echo "$NVMET_ADDR" > $P/addr_traddr
      echo "$p" > $P/addr_trsvcid
      [ -n "$NVMET_INLINE" ] && echo "$NVMET_INLINE" > $P/param_inline_data_size
    fi
    [ -e $P/subsystems/$NVMET_NQN ] || ln -s $S $P/subsystems/$NVMET_NQN || fail "link port $p (is it in use?)"
  done
  log "configured $NVMET_NQN on $NVMET_ADDR ports [$NVMET_PORTS] backend=$NVMET_BACKEND ${NVMET_SIZE_MB}MiB" \
      "hosts=${NVMET_ALLOWED_HOSTS:-any}"
}

teardown() {
  for P in $C/ports/*; do
    [ -e $P/subsystems/$NVMET_NQN ] && rm $P/subsystems/$NVMET_NQN
    rmdir $P 2>/dev/null
  done
  [ -d $S ] || return 0
  echo 0 > $S/namespaces/1/enable 2>/dev/null
  rmdir $S/namespaces/1 2>/dev/null
  for h in $S/allowed_hosts/*; do [ -L "$h" ] && rm "$h"; done
  rmdir $S 2>/dev/null
  for h in $C/hosts/*; do [ -d "$h" ] && rmdir "$h" 2>/dev/null; done
  return 0
}

case "${1:-serve}" in
  setup) setup; exit 0;;
  teardown) teardown; exit 0;;
  serve) ;;
  *) fail "usage: guest-nvmet.sh [setup|teardown|serve]";;
esac

setup
rm -f /tmp/nvmet-stop
if [ -c /dev/ttyS2 ]; then
  ( read -r line < /dev/ttyS2; log "control channel: '$line'"; : > /tmp/nvmet-stop ) &
fi
dmesg -c > /dev/null
echo "@@NVMET-READY@@ nqn=$NVMET_NQN addr=$NVMET_ADDR ports=$(echo $NVMET_PORTS | tr ' ' ,) uptime=$(cut -d' ' -f1 /proc/uptime)"
t=0
while [ ! -e /tmp/nvmet-stop ] && [ $t -lt "$NVMET_TIMEOUT" ]; do
  sleep 1; t=$((t+1))
  dmesg -c | sed 's/^/guest-nvmet: kernel: /'   # nvmet connect/disconnect messages on the console
done
[ -e /tmp/nvmet-stop ] && log "stop requested after ${t}s" || log "NVMET_TIMEOUT (${NVMET_TIMEOUT}s) reached"
teardown
dmesg -c | sed 's/^/guest-nvmet: kernel: /'
log "done"
exit 0
