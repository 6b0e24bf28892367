#!/bin/sh
# guest-initiator.sh - runs INSIDE the test VM (busybox sh): drives the Linux kernel NVMe/TCP
# initiator (nvme-cli + fio + ext4) against an NVMe/TCP target and prints one line per step:
#   STEP <name>: ok (<seconds>s)   |   STEP <name>: FAIL (<seconds>s) <reason>
# followed by "SUMMARY: ok=N fail=M skipped=K total=<seconds>s". Exit status 0 only if every step passed.
# By default the first failing step ends the run (the remaining steps are skipped, then cleanup).
#
# Environment (vm.sh --env KEY=VALUE, or /run/env); defaults in brackets:
#   TARGET_ADDR [10.0.2.2 = host loopback; 127.0.0.1 with SELFTEST=1]
#   IO_PORT [4420]   DISC_PORT [8009]  (run-interop.sh passes the free ports it picked; the step
#                    discover-8009 discovers on DISC_PORT, the target's discovery-only listener)
#   SUBNQN [nqn.2026-11.io.trellis:default]
#   BAD_HOSTNQN [nqn.2014-08.org.example:not-allowed]   a host NQN the target must refuse
#   BAD_HOSTID [5472656c-6c69-4073-8000-0000000000ff]
#   NR_IO_QUEUES [2]  MIN_IO_QUEUES [2] (fail if the controller ends up with fewer I/O queues)
#   FIO_SIZE [32M]  FIO_IODEPTH [16]  FIO_ENGINE [libaio]  FIO_TIMEOUT [300]
#   CTRL_LOSS_TMO [20]  (seconds the kernel keeps reconnecting after a connection loss)
#   LIVE_NSID [2]  the NSID step ns-change adds and removes over the management socket
#   CDC_PORT, NODE2_NQN  step cdc: a `trellis cdc` following this target and a second node
#   HA_NQN, HA_PORT_A, HA_PORT_B  step ha: the HA pair run-interop.sh runs (a owns the lease)
#   HA_FIO_SIZE [32M]  HA_FIO_TIMEOUT [150]  HA_CTRL_LOSS_TMO [5]  HA_RESUME_MAX [10] (s; step ha fails on a longer stall)
#   CRASH_ROUNDS [20]  step crash-ext4: kill -9 rounds of the HA pair's owner under fsync'ed ext4 writes;
#                    then each node's smart-log must count at least its kill -9s as unsafe shutdowns
#   WEAR_NQN [nqn.2026-11.io.trellis:wear]  WEAR_MIB [96]  step wear: smart-log of the emulated femu
#                    drive (interop.toml) before and after WEAR_MIB MiB of O_DIRECT writes
#   AUTH_NQN [nqn.2026-11.io.trellis:auth]  AUTH_SECRET, AUTH_CTRL_SECRET [the two in interop.toml]
#                    step auth: DH-HMAC-CHAP against the subsystem that has this host's keys
#   TLS_PORT  TLS_NQN [nqn.2026-11.io.trellis:tls]  TLS_NQN_384 [..:tls384]  TLS_KEY, TLS_KEY_384 [the two
#                    in interop.toml]  step tls: NVMe/TCP TLS 1.3 with a PSK on the required listener
#   STEPS ["discover-io discover-8009 connect ana wear resv ns-change ns-resize disc-aen cdc ha crash-ext4 fio-4k fio-128k write-zeroes large-io ext4 digest-connect
#           digest-fio-4k digest-fio-128k denied-host auth tls disconnect-all"]  a subset runs only those steps
#   KEEP_GOING [0]  1 = run all steps even after a failure
#   SELFTEST [0]    1 = first configure the Linux kernel target (guest-nvmet.sh setup, must be added
#                   to the guest as /run/guest-nvmet.sh) on 127.0.0.1:IO_PORT and :DISC_PORT with only
#                   this guest's host NQN allowed, and test against it (validates this script)
# The host NQN/ID come from /etc/nvme/hostnqn and /etc/nvme/hostid (fixed by vm.sh).
SELFTEST=${SELFTEST:-0}
if [ "$SELFTEST" = 1 ]; then TARGET_ADDR=${TARGET_ADDR:-127.0.0.1}; fi
TARGET_ADDR=${TARGET_ADDR:-10.0.2.2}
IO_PORT=${IO_PORT:-4420}
DISC_PORT=${DISC_PORT:-8009}
SUBNQN=${SUBNQN:-nqn.2026-11.io.trellis:default}
BAD_HOSTNQN=${BAD_HOSTNQN:-nqn.2014-08.org.example:not-allowed}
BAD_HOSTID=${BAD_HOSTID:-5472656c-6c69-4073-8000-0000000000ff}
NR_IO_QUEUES=${NR_IO_QUEUES:-2}
MIN_IO_QUEUES=${MIN_IO_QUEUES:-2}
FIO_SIZE=${FIO_SIZE:-32M}
FIO_IODEPTH=${FIO_IODEPTH:-16}
FIO_ENGINE=${FIO_ENGINE:-libaio}
FIO_TIMEOUT=${FIO_TIMEOUT:-300}
CTRL_LOSS_TMO=${CTRL_LOSS_TMO:-20}
LIVE_NSID=${LIVE_NSID:-2}
HA_NQN=${HA_NQN:-nqn.2026-11.io.trellis:ha}
HA_FIO_SIZE=${HA_FIO_SIZE:-32M}
HA_CTRL_LOSS_TMO=${HA_CTRL_LOSS_TMO:-5}
HA_RESUME_MAX=${HA_RESUME_MAX:-10}
HA_FIO_TIMEOUT=${HA_FIO_TIMEOUT:-150}
CRASH_ROUNDS=${CRASH_ROUNDS:-20}
WEAR_NQN=${WEAR_NQN:-nqn.2026-11.io.trellis:wear}
WEAR_MIB=${WEAR_MIB:-96}
AUTH_NQN=${AUTH_NQN:-nqn.2026-11.io.trellis:auth}
AUTH_SECRET=${AUTH_SECRET:-DHHC-1:01:NR5My74p5ZqEnJGSMmuiPqAJFFgTb7QjxYtSk7OcR6NnZKX+:}
AUTH_CTRL_SECRET=${AUTH_CTRL_SECRET:-DHHC-1:02:GdMihILgYzDrUyM1H1sKPffNn6d7ktv5X087UjJ3+e/U5vYU014/D09KPicROBVhTFn6dQ==:}
TLS_PORT=${TLS_PORT:-4421}
TLS_NQN=${TLS_NQN:-nqn.2026-11.io.trellis:tls}
TLS_NQN_384=${TLS_NQN_384:-nqn.2026-11.io.trellis:tls384}
TLS_KEY=${TLS_KEY:-NVMeTLSkey-1:01:Ggh0ZeTr4gtcM5ttLtzjFKTkCEGwn/dvDUPXq4L9i7yv4BH+:}
TLS_KEY_384=${TLS_KEY_384:-NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:}
STEPS=${STEPS:-"discover-io discover-8009 connect ana wear resv ns-change ns-resize disc-aen cdc ha crash-ext4 fio-4k fio-128k write-zeroes large-io ext4 digest-connect digest-fio-4k digest-fio-128k denied-host auth tls disconnect-all"}
KEEP_GOING=${KEEP_GOING:-0}
HA_KILLS_A=0; HA_KILLS_B=0   # kill -9 of HA nodes a and b asked for so far (steps ha, crash-ext4)
HOSTNQN=$(cat /etc/nvme/hostnqn)
HOSTID=$(cat /etc/nvme/hostid)
MNT=/mnt/trellis
W=/tmp/gi; mkdir -p $W $MNT

now() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
info() { echo "  | $*"; }
# run CMD..., show its output indented; status of CMD
show() { info "\$ $*"; "$@" > $W/out 2>&1; r=$?; sed 's/^/  |   /' $W/out; [ $r = 0 ] || info "(exit $r)"; return $r; }
REASON=""
why() { REASON="$*"; info "error: $*"; return 1; }
kmsg() { dmesg -c >> $W/dmesg.all 2>/dev/null; }

# ---------------------------------------------------------------- helpers
# controller name (nvmeN) connected to SUBNQN at TARGET_ADDR:IO_PORT, state live
find_ctrl() {
  for c in /sys/class/nvme/nvme*; do
    [ -e "$c/subsysnqn" ] || continue
    [ "$(cat $c/subsysnqn)" = "$SUBNQN" ] || continue
    [ "$(cat $c/transport 2>/dev/null)" = tcp ] || continue
    case "$(cat $c/address 2>/dev/null)" in *"traddr=$TARGET_ADDR,trsvcid=$IO_PORT"*) ;; *) continue;; esac
    [ "$(cat $c/state 2>/dev/null)" = live ] || continue
    basename $c; return 0
  done
  return 1
}
# namespace block device (nvmeXnY, the multipath head if native multipath is on) of SUBNQN
find_ns() {
  for b in /sys/block/nvme*n*; do
    [ -e "$b" ] || continue
    n=$(basename $b)
    case "$n" in nvme*c*n*) continue;; esac           # hidden per-path devices
    [ "$(cat $b/device/subsysnqn 2>/dev/null)" = "$SUBNQN" ] || continue
    [ -b /dev/$n ] || continue
    [ "$(cat $b/size)" -gt 0 ] 2>/dev/null || continue
    echo $n; return 0
  done
  return 1
}
# block device (multipath head) of namespace NSID of SUBNQN
ns_dev() {
  for b in /sys/block/nvme*n*; do
    [ -e "$b" ] || continue
    n=$(basename $b)
    case "$n" in nvme*c*n*) continue;; esac
    [ "$(cat $b/device/subsysnqn 2>/dev/null)" = "$SUBNQN" ] || continue
    [ "$(cat $b/nsid 2>/dev/null)" = "$1" ] || continue
    [ -b /dev/$n ] || continue
    echo $n; return 0
  done
  return 1
}
wait_for() { # SECONDS FUNC -> prints FUNC's output once it succeeds
  _end=$(( $(cut -d. -f1 /proc/uptime) + $1 )); shift
  while :; do
    "$@" && return 0
    [ "$(cut -d. -f1 /proc/uptime)" -ge $_end ] && return 1
    sleep 0.2
  done
}
ctrl_count() { # controllers of SUBNQN (any state)
  k=0
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat $c/subsysnqn 2>/dev/null)" = "$SUBNQN" ] && k=$((k+1))
  done
  echo $k
}

do_connect() { # extra nvme-connect args...
  show timeout 90 nvme connect -t tcp -a "$TARGET_ADDR" -s "$IO_PORT" -n "$SUBNQN" -i "$NR_IO_QUEUES" \
       --ctrl-loss-tmo="$CTRL_LOSS_TMO" --reconnect-delay=2 "$@" || { kmsg; why "nvme connect failed"; return 1; }
  CTRL=$(wait_for 30 find_ctrl) || why "no live controller for $SUBNQN at $TARGET_ADDR:$IO_PORT" || return 1
  DEV=$(wait_for 30 find_ns) || why "no namespace block device for $SUBNQN" || return 1
  info "controller /dev/$CTRL, namespace /dev/$DEV ($(( $(cat /sys/block/$DEV/size) / 2048 )) MiB)," \
       "address: $(cat /sys/class/nvme/$CTRL/address)"
  if [ -r /sys/class/nvme/$CTRL/queue_count ]; then
    q=$(( $(cat /sys/class/nvme/$CTRL/queue_count) - 1 ))
    info "I/O queues: $q (requested $NR_IO_QUEUES), sqsize $(cat /sys/class/nvme/$CTRL/sqsize 2>/dev/null)"
    [ $q -ge "$MIN_IO_QUEUES" ] || why "only $q I/O queues (want >= $MIN_IO_QUEUES)" || return 1
  fi
  return 0
}
do_disconnect() {
  show timeout 60 nvme disconnect -n "$SUBNQN" || why "nvme disconnect failed" || return 1
  wait_for 20 sh -c '[ "$(ls /sys/class/nvme 2>/dev/null | wc -l)" = 0 ] || ! grep -qxF "$0" /sys/class/nvme/*/subsysnqn' "$SUBNQN" ||
    why "controller still present after disconnect" || return 1
  CTRL=""; DEV=""
}

run_fio() { # NAME BS
  [ -n "$DEV" ] || why "not connected" || return 1
  out=$W/fio-$1.txt
  info "\$ fio --rw=randrw --bs=$2 --size=$FIO_SIZE --iodepth=$FIO_IODEPTH --ioengine=$FIO_ENGINE --direct=1 --verify=crc32c --verify_fatal=1 /dev/$DEV"
  timeout "$FIO_TIMEOUT" fio --name="$1" --filename=/dev/$DEV --rw=randrw --rwmixread=50 --bs="$2" \
      --size="$FIO_SIZE" --iodepth="$FIO_IODEPTH" --ioengine="$FIO_ENGINE" --direct=1 \
      --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_dump=0 \
      --numjobs=1 --group_reporting --output="$out" > $W/fio.stdout 2>&1
  r=$?
  cat $W/fio.stdout >> "$out"
  grep -E 'err=|READ:|WRITE:|verify|bad magic|crc32c|error' "$out" | sed 's/^ */  |   /'
  [ $r = 0 ] || { kmsg; why "fio exit status $r"; return 1; }
  grep -q 'err= *0' "$out" || why "fio reported a job error" || return 1
  if grep -qiE 'verify failed|bad magic|verify: bad|crc32c: verify|got [0-9a-fx]*, wanted|checksum mismatch' "$out"; then
    why "fio verify errors"; return 1
  fi
  grep -qE 'READ:.*io=' "$out" && grep -qE 'WRITE:.*io=' "$out" || why "fio did no I/O?" || return 1
  return 0
}

# SMART / Health log (02h, NSID FFFFFFFFh) of controller CTRL (nvmeN: one controller, so one
# node), shown and kept in $W/smart; a real or nominal Composite Temperature, never 0 K (printed
# as -273 C), and plausible: 1 to 99 C.
smart_read() { # CTRL
  show nvme smart-log /dev/$1 || why "nvme smart-log /dev/$1 failed" || return 1
  cp $W/out $W/smart
  grep -iE '^temperature[[:space:]]*:' $W/smart > $W/temp || why "smart-log shows no temperature" || return 1
  ! grep -qE -- '-27[0-9]' $W/temp || why "smart-log temperature is 0 K: $(cat $W/temp)" || return 1
  _tc=$(smart_field temperature)
  [ "${_tc:-0}" -ge 1 ] && [ "$_tc" -le 99 ] || why "smart-log temperature is not plausible: $(cat $W/temp)" || return 1
}
# NAME -> the first number of that field in $W/smart (nvme-cli: "percentage_used : 26%",
# "critical_warning : 0x9", "temperature : 35 C (308 Kelvin)"), hex as 0x..; empty if none
smart_field() {
  awk -F: -v k="$1" '{f = $1; gsub(/[[:space:]]/, "", f)}
    f == k {v = $2; sub(/^[^-0-9]*/, "", v); if (match(v, /^-?(0x[0-9a-fA-F]+|[0-9]+)/)) print substr(v, 1, RLENGTH); exit}' $W/smart
}

# ------------------------------------------------------------------ steps
step_discover_io() {
  show timeout 60 nvme discover -t tcp -a "$TARGET_ADDR" -s "$IO_PORT" || { kmsg; why "nvme discover on $IO_PORT failed"; return 1; }
  grep -qF "$SUBNQN" $W/out || why "$SUBNQN not in the discovery log from port $IO_PORT"
}
step_discover_8009() {
  show timeout 60 nvme discover -t tcp -a "$TARGET_ADDR" -s "$DISC_PORT" || { kmsg; why "nvme discover on $DISC_PORT failed"; return 1; }
  grep -qF "$SUBNQN" $W/out || why "$SUBNQN not in the discovery log from port $DISC_PORT"
}
step_connect() {
  do_connect || return 1
  show nvme list || why "nvme list failed" || return 1
  grep -q "$DEV" $W/out || why "nvme list does not show /dev/$DEV" || return 1
  show nvme id-ctrl /dev/$CTRL || why "nvme id-ctrl failed" || return 1
  grep -qE "^subnqn *: *$SUBNQN\$" $W/out || why "id-ctrl subnqn differs from $SUBNQN" || return 1
  show nvme id-ns /dev/$DEV || why "nvme id-ns failed" || return 1
  smart_read $CTRL || return 1
  # Trellis's extended health page (vendor LID C1h, docs/target.md "Drive health").
  show nvme get-log /dev/$CTRL --log-id=0xc1 --log-len=512 --namespace-id=1 || why "nvme get-log of the extended health page (C1h) failed" || return 1
  return 0
}
# ANA (docs/target.md "ANA"): the target sets CMIC bit 3, so the kernel reads the ANA log at
# connect and shows each path's state in sysfs; nvme-cli decodes the same log page (LID 0Ch).
step_ana() {
  [ -n "$CTRL" ] || why "not connected" || return 1
  show nvme ana-log /dev/$CTRL || why "nvme ana-log failed" || return 1
  grep -qi "optimized" $W/out || why "ana-log shows no optimized group" || return 1
  # The group lists its namespace (nvme-cli sizes the log from NANAGRPID, MNAN and ANACAP).
  grep -qE "^[[:space:]]*nsid[[:space:]]*:[[:space:]]*1\$" $W/out || why "ana-log lists no NSID 1" || return 1
  # ANATT 10 s and ANACAP 1Fh (decimal 31) where nvme-cli reads them.
  show nvme id-ctrl /dev/$CTRL || why "nvme id-ctrl failed" || return 1
  grep -qE "^anatt *: *10\$" $W/out || why "id-ctrl anatt is not 10" || return 1
  grep -qE "^anacap *: *(31|0x1f)\$" $W/out || why "id-ctrl anacap is not 1Fh" || return 1
  # (busybox sh has no locals: the main loop's $s must not be touched)
  for _ap in /sys/block/nvme*c${CTRL#nvme}n*; do
    [ -r "$_ap/ana_state" ] || continue
    _as=$(cat $_ap/ana_state); info "$(basename $_ap): ana_state $_as, ana_grpid $(cat $_ap/ana_grpid 2>/dev/null)"
    [ "$_as" = optimized ] || why "path $(basename $_ap) ana_state is $_as, want optimized" || return 1
    return 0
  done
  info "no per-path ana_state in sysfs (native multipath off): the log check above stands"
}
# Drive health of the emulated SSD (docs/target.md "Drive health", issue 33): WEAR_NQN's namespace
# is a femu drive at wear_acceleration 100,000 (interop.toml), whose blocks retire at their first
# erase. smart-log before and after WEAR_MIB MiB of O_DIRECT writes (fio, 1 MiB, over and over the
# 64 MiB namespace): Percentage Used must rise, Available Spare fall, the drive stay writable
# (critical warning bit 3 clear), the temperature be plausible.
wear_off() { nvme disconnect -n "$WEAR_NQN" > /dev/null 2>&1; return 1; }
wear_moved() { # CTRL USED SPARE: smart-log shows more than USED % used and less than SPARE % spare
  nvme smart-log /dev/$1 > $W/smart 2>&1 || return 1
  [ "$(smart_field percentage_used)" -gt "$2" ] 2>/dev/null && [ "$(smart_field available_spare)" -lt "$3" ] 2>/dev/null
}
step_wear() {
  if [ "$SELFTEST" = 1 ]; then info "selftest: the Linux target has no emulated drive"; return 0; fi
  show timeout 90 nvme connect -t tcp -a "$TARGET_ADDR" -s "$IO_PORT" -n "$WEAR_NQN" -i "$NR_IO_QUEUES" --ctrl-loss-tmo=0 ||
    { kmsg; why "nvme connect -n $WEAR_NQN failed"; return 1; }
  _s=$SUBNQN; SUBNQN=$WEAR_NQN
  _wc=$(wait_for 30 find_ctrl); _wd=$(wait_for 30 find_ns); _rc=$?
  SUBNQN=$_s
  [ -n "$_wc" ] && [ $_rc = 0 ] || { why "no live controller and namespace for $WEAR_NQN"; wear_off; return 1; }
  info "$WEAR_NQN: /dev/$_wd ($(( $(cat /sys/block/$_wd/size) / 2048 )) MiB) on /dev/$_wc"
  smart_read $_wc || { wear_off; return 1; }
  _u0=$(smart_field percentage_used); _a0=$(smart_field available_spare); _w0=$(smart_field critical_warning)
  info "before: percentage_used ${_u0}%, available_spare ${_a0}%, critical_warning $_w0, temperature $(smart_field temperature) C"
  [ -n "$_u0" ] && [ -n "$_a0" ] || { why "smart-log shows no percentage_used or available_spare"; wear_off; return 1; }
  _t=$(now)
  info "\$ fio --rw=write --bs=1M --iodepth=8 --ioengine=$FIO_ENGINE --direct=1 --io_size=${WEAR_MIB}M /dev/$_wd"
  timeout 120 fio --name=wear --filename=/dev/$_wd --rw=write --bs=1M --iodepth=8 --ioengine="$FIO_ENGINE" \
    --direct=1 --io_size="${WEAR_MIB}M" --numjobs=1 --output=$W/wear.txt > $W/wear.stdout 2>&1
  _r=$?
  cat $W/wear.stdout >> $W/wear.txt
  grep -E 'err=|WRITE:|error' $W/wear.txt | sed 's/^ */  |   /'
  [ $_r = 0 ] && grep -q 'err= *0' $W/wear.txt || { kmsg; why "fio: $WEAR_MIB MiB of writes to the emulated drive failed (exit $_r)"; wear_off; return 1; }
  info "$WEAR_MIB MiB written in $(since $_t)s"
  # The target re-reads the drive's health every second: after two periods the page has all of it.
  sleep 2
  wait_for 10 wear_moved $_wc "$_u0" "$_a0"
  smart_read $_wc || { wear_off; return 1; }
  _u1=$(smart_field percentage_used); _a1=$(smart_field available_spare); _w1=$(smart_field critical_warning)
  info "after:  percentage_used ${_u1}%, available_spare ${_a1}%, critical_warning $_w1"
  [ "${_u1:-0}" -gt "$_u0" ] || { why "percentage_used did not rise: ${_u0}% -> ${_u1}% after $WEAR_MIB MiB"; wear_off; return 1; }
  [ "${_a1:-100}" -lt "$_a0" ] || { why "available_spare did not fall: ${_a0}% -> ${_a1}% after $WEAR_MIB MiB"; wear_off; return 1; }
  [ $(( ${_w1:-0} & 8 )) = 0 ] || { why "the drive went read only (critical_warning $_w1): lower WEAR_MIB"; wear_off; return 1; }
  show timeout 60 nvme disconnect -n "$WEAR_NQN" || why "nvme disconnect -n $WEAR_NQN failed" || return 1
  NOTE="$WEAR_MIB MiB written: percentage used ${_u0} -> ${_u1} %, available spare ${_a0} -> ${_a1} %, temperature $(smart_field temperature) C"
}
# Persistent reservations (docs/target.md "Reservations") with nvme-cli through the kernel's
# passthrough: ONCS bit 5 and RESCAP, register with PTPL, Report (EDS=1; EDS=0 refused with Host
# Identifier Inconsistent Format), acquire Write Exclusive, a wrong key conflicts, the holder
# writes, release, unregister (clearing PTPL). One host ID here: conflicts between hosts are
# checked by crates/endpoint/node/tests/resv.rs.
resv_field() { awk -v k="$1" '$1 == k && $2 == ":" {print $3; exit}' $W/out; }
step_resv() {
  [ -n "$DEV" ] || why "not connected" || return 1
  if [ "$SELFTEST" = 1 ]; then info "selftest: the Linux target's reservations are not what is tested"; return 0; fi
  show nvme id-ctrl /dev/$CTRL || why "nvme id-ctrl failed" || return 1
  _oncs=$(resv_field oncs)
  [ $(( ${_oncs:-0} & 0x20 )) != 0 ] || why "id-ctrl oncs $_oncs lacks bit 5 (Reservations)" || return 1
  show nvme id-ns /dev/$DEV || why "nvme id-ns failed" || return 1
  _rescap=$(resv_field rescap)
  [ $(( ${_rescap:-0} )) = 255 ] || why "id-ns rescap $_rescap, want 0xff" || return 1
  show nvme resv-register /dev/$DEV -n 1 --nrkey=0xa1 --rrega=0 --cptpl=3 || why "resv-register failed" || return 1
  show nvme resv-report /dev/$DEV -n 1 --eds || why "resv-report --eds failed" || return 1
  [ "$(resv_field regctl)" = 1 ] || why "resv-report: regctl $(resv_field regctl), want 1" || return 1
  [ "$(resv_field ptpls)" = 1 ] || why "resv-report: ptpls $(resv_field ptpls), want 1" || return 1
  grep -qi "$(echo $HOSTID | tr -d -)" $W/out || why "resv-report does not list this host ID" || return 1
  show nvme resv-report /dev/$DEV -n 1 && { why "resv-report without --eds (EDS=0) succeeded"; return 1; }
  show nvme resv-acquire /dev/$DEV -n 1 --crkey=0xbad --rtype=1 --racqa=0 && { why "resv-acquire with a wrong key succeeded"; return 1; }
  grep -qi conflict $W/out || why "a wrong key did not fail with Reservation Conflict" || return 1
  show nvme resv-acquire /dev/$DEV -n 1 --crkey=0xa1 --rtype=1 --racqa=0 || why "resv-acquire failed" || return 1
  show nvme resv-report /dev/$DEV -n 1 --eds || why "resv-report --eds failed" || return 1
  [ "$(resv_field rtype)" = 1 ] || why "resv-report: rtype $(resv_field rtype), want 1" || return 1
  [ "$(resv_field rcsts)" = 1 ] || why "resv-report: rcsts $(resv_field rcsts), want 1 (holder)" || return 1
  dd if=/dev/urandom of=$W/rblk bs=4k count=4 2>/dev/null
  dd if=$W/rblk of=/dev/$DEV bs=4k seek=1024 count=4 oflag=direct 2>/dev/null || why "the holder's write failed" || return 1
  show nvme get-feature /dev/$CTRL -f 0x83 -n 1 || why "get-feature 0x83 failed" || return 1
  grep -qiE 'value: *(0x0*1|1)$' $W/out || why "get-feature 0x83: PTPL not set" || return 1
  show nvme resv-release /dev/$DEV -n 1 --crkey=0xa1 --rtype=1 --rrela=0 || why "resv-release failed" || return 1
  show nvme resv-register /dev/$DEV -n 1 --crkey=0xa1 --rrega=1 --cptpl=2 || why "resv-register (unregister) failed" || return 1
  show nvme resv-report /dev/$DEV -n 1 --eds || why "resv-report --eds failed" || return 1
  [ "$(resv_field regctl)" = 0 ] && [ "$(resv_field rtype)" = 0 ] || why "registrants or a reservation left after release and unregister" || return 1
  [ "$(resv_field ptpls)" = 0 ] || why "PTPL still set after CPTPL=2" || return 1
  return 0
}
# Live namespace add and remove (docs/target.md "Management socket"). The guest cannot reach the
# target's management socket: it prints an @@TRELLIS-CTL@@ line, which run-interop.sh (watching the
# console) runs as `trellis ctl ...`. The kernel must find the namespace through the AEN alone
# (Namespace Attribute Changed -> Changed Namespace List -> rescan), on the same controller
# (same name, cntlid, state live) and with no reconnect or reset in the kernel log.
ctl_request() { echo "@@TRELLIS-CTL@@ $*"; }
step_ns_change() {
  [ -n "$CTRL" ] || why "not connected" || return 1
  if [ "$SELFTEST" = 1 ]; then info "selftest: the Linux target has no trellis management socket"; return 0; fi
  _cntlid=$(cat /sys/class/nvme/$CTRL/cntlid)
  kmsg
  ns_dev $LIVE_NSID >/dev/null && { why "nsid $LIVE_NSID exists before the add"; return 1; }
  ctl_request namespace add --nqn "$SUBNQN" --nsid "$LIVE_NSID" --backend ram --size 64MiB
  _nd=$(wait_for 30 ns_dev $LIVE_NSID) || { kmsg; why "nsid $LIVE_NSID did not appear within 30 s of the add"; return 1; }
  info "nsid $LIVE_NSID appeared as /dev/$_nd ($(( $(cat /sys/block/$_nd/size) / 2048 )) MiB)"
  show nvme list || why "nvme list failed" || return 1
  grep -q "/dev/$_nd" $W/out || why "nvme list does not show /dev/$_nd" || return 1
  dd if=/dev/urandom of=$W/blk bs=4k count=16 2>/dev/null
  dd if=$W/blk of=/dev/$_nd bs=4k count=16 oflag=direct 2>/dev/null || why "write to /dev/$_nd failed" || return 1
  dd if=/dev/$_nd of=$W/blk2 bs=4k count=16 iflag=direct 2>/dev/null || why "read from /dev/$_nd failed" || return 1
  cmp -s $W/blk $W/blk2 || why "/dev/$_nd read back differs from what was written" || return 1
  ctl_request namespace remove --nqn "$SUBNQN" --nsid "$LIVE_NSID"
  wait_for 30 sh -c '[ ! -e /sys/block/$0 ]' $_nd || { kmsg; why "/dev/$_nd still there 30 s after the remove"; return 1; }
  info "/dev/$_nd is gone"
  show nvme list || why "nvme list failed" || return 1
  grep -q "/dev/$_nd " $W/out && { why "nvme list still shows /dev/$_nd"; return 1; }
  [ "$(find_ctrl)" = "$CTRL" ] || why "controller $CTRL is no longer live" || return 1
  [ "$(cat /sys/class/nvme/$CTRL/cntlid)" = "$_cntlid" ] || why "cntlid changed: a new controller" || return 1
  [ "$(find_ns)" = "$DEV" ] || why "namespace 1 (/dev/$DEV) is gone" || return 1
  dmesg -c > $W/dmesg.ns 2>/dev/null; cat $W/dmesg.ns >> $W/dmesg.all
  sed 's/^/  | kernel: /' $W/dmesg.ns | grep -iE 'nvme' | tail -10
  grep -qiE 'reconnect|resetting|error recovery|keep-alive' $W/dmesg.ns && { why "the kernel log shows a reconnect or reset"; return 1; }
  return 0
}
# Live resize: a null namespace (NSID LIVE_NSID+1) added at 32 MiB, grown to 64 MiB over the
# management socket; the kernel re-reads its size through the same notice, on the same controller.
sectors_are() { [ "$(cat /sys/block/$1/size 2>/dev/null)" = "$2" ]; }
step_ns_resize() {
  [ -n "$CTRL" ] || why "not connected" || return 1
  if [ "$SELFTEST" = 1 ]; then info "selftest: the Linux target has no trellis management socket"; return 0; fi
  _id=$((LIVE_NSID + 1)); _cntlid=$(cat /sys/class/nvme/$CTRL/cntlid)
  kmsg
  ctl_request namespace add --nqn "$SUBNQN" --nsid "$_id" --backend null --size 32MiB
  _nd=$(wait_for 30 ns_dev $_id) || { kmsg; why "nsid $_id did not appear within 30 s of the add"; return 1; }
  sectors_are $_nd 65536 || why "/dev/$_nd is $(cat /sys/block/$_nd/size) sectors, want 65536 (32 MiB)" || return 1
  ctl_request namespace resize --nqn "$SUBNQN" --nsid "$_id" --size 64MiB
  wait_for 30 sectors_are $_nd 131072 || { kmsg; why "/dev/$_nd is $(cat /sys/block/$_nd/size) sectors 30 s after the resize, want 131072 (64 MiB)"; return 1; }
  info "/dev/$_nd grew to $(( $(cat /sys/block/$_nd/size) / 2048 )) MiB"
  dd if=/dev/$_nd of=/dev/null bs=4k skip=12288 count=16 iflag=direct 2>/dev/null || why "read past the old end of /dev/$_nd failed" || return 1
  ctl_request namespace remove --nqn "$SUBNQN" --nsid "$_id"
  wait_for 30 sh -c '[ ! -e /sys/block/$0 ]' $_nd || { kmsg; why "/dev/$_nd still there 30 s after the remove"; return 1; }
  [ "$(find_ctrl)" = "$CTRL" ] && [ "$(cat /sys/class/nvme/$CTRL/cntlid)" = "$_cntlid" ] || why "not the same live controller" || return 1
  dmesg -c > $W/dmesg.ns 2>/dev/null; cat $W/dmesg.ns >> $W/dmesg.all
  sed 's/^/  | kernel: /' $W/dmesg.ns | grep -iE 'nvme' | tail -6
  grep -qiE 'reconnect|resetting|error recovery|keep-alive' $W/dmesg.ns && { why "the kernel log shows a reconnect or reset"; return 1; }
  return 0
}
step_fio_4k() { run_fio fio-4k 4k; }
step_fio_128k() { run_fio fio-128k 128k; }
# Zeroes three ranges of an 8 MiB pattern through the kernel and checks they read back as zeroes
# while the data around them is intact:
#   [1, 3) MiB  fallocate --punch-hole on the block device: blkdev_issue_zeroout() without NOUNMAP,
#               so Linux >= 6.2 (commit 1b96f862eccc) sends Write Zeroes with DEAC when Identify
#               Namespace DLFEAT allows it; older kernels never set DEAC;
#   [4, 5) MiB  blkdiscard -z (BLKZEROOUT: Write Zeroes with NOUNMAP, so without DEAC);
#   [6, 6.5) MiB nvme write-zeroes --deac (passthrough, DEAC set by nvme-cli).
# For each "expect-deac slba=N" line printed, run-interop.sh checks the target logged a Write
# Zeroes with DEAC at LBA N (the guest cannot see the target).
step_write_zeroes() {
  [ -n "$DEV" ] || why "not connected" || return 1
  bs=$(cat /sys/block/$DEV/queue/logical_block_size)
  info "logical_block_size=$bs write_zeroes_max_bytes=$(cat /sys/block/$DEV/queue/write_zeroes_max_bytes 2>/dev/null)"
  head -c 8388608 /dev/urandom > $W/wz.pat
  show dd if=$W/wz.pat of=/dev/$DEV bs=1M oflag=direct conv=fsync || why "writing the pattern failed" || return 1
  show /usr/bin/fallocate --punch-hole --keep-size --offset 1048576 --length 2097152 /dev/$DEV ||
    { kmsg; why "fallocate --punch-hole on /dev/$DEV failed"; return 1; }
  kv=$(uname -r); kmaj=${kv%%.*}; kmin=${kv#*.}; kmin=${kmin%%.*}
  if [ "$kmaj" -gt 6 ] || { [ "$kmaj" = 6 ] && [ "$kmin" -ge 2 ]; }; then
    info "expect-deac slba=$((1048576 / bs)) (the kernel's punch hole)"
  else
    info "kernel $kv predates DEAC in Write Zeroes (Linux 6.2): its punch hole is checked for zeroes only"
  fi
  show /usr/sbin/blkdiscard -z -o 4194304 -l 1048576 /dev/$DEV || { kmsg; why "blkdiscard -z failed"; return 1; }
  show nvme write-zeroes /dev/$DEV --start-block=$((6291456 / bs)) --block-count=$((524288 / bs - 1)) --deac ||
    why "nvme write-zeroes --deac failed" || return 1
  info "expect-deac slba=$((6291456 / bs)) (nvme-cli)"
  cp $W/wz.pat $W/wz.want
  dd if=/dev/zero of=$W/wz.want bs=1M seek=1 count=2 conv=notrunc 2>/dev/null
  dd if=/dev/zero of=$W/wz.want bs=1M seek=4 count=1 conv=notrunc 2>/dev/null
  dd if=/dev/zero of=$W/wz.want bs=512K seek=12 count=1 conv=notrunc 2>/dev/null
  show dd if=/dev/$DEV of=$W/wz.got bs=1M count=8 iflag=direct || why "reading back failed" || return 1
  cmp $W/wz.want $W/wz.got > $W/cmp 2>&1 || why "read back differs from the zeroed pattern: $(head -1 $W/cmp)" || return 1
  info "8 MiB read back: three ranges zero, the rest intact"
}
# A single 512 KiB and 1 MiB command each way through nvme-cli's passthrough (no splitting by the
# block layer): a transfer above MDTS fails in the host with "Invalid argument".
step_large_io() {
  [ -n "$DEV" ] || why "not connected" || return 1
  bs=$(cat /sys/block/$DEV/queue/logical_block_size)
  info "max_hw_sectors_kb=$(cat /sys/block/$DEV/queue/max_hw_sectors_kb)"
  for sz in 524288 1048576; do
    head -c $sz /dev/urandom > $W/big.in
    show nvme write /dev/$DEV --start-block=0 --block-count=$((sz / bs - 1)) --data-size=$sz --data=$W/big.in ||
      { kmsg; why "nvme write of $sz bytes failed"; return 1; }
    show nvme read /dev/$DEV --start-block=0 --block-count=$((sz / bs - 1)) --data-size=$sz --data=$W/big.out ||
      { kmsg; why "nvme read of $sz bytes failed"; return 1; }
    cmp $W/big.in $W/big.out > $W/cmp 2>&1 || why "$sz-byte read differs from the write: $(head -1 $W/cmp)" || return 1
    info "$sz bytes written and read back in one command each"
  done
}
step_ext4() {
  [ -n "$DEV" ] || why "not connected" || return 1
  show mkfs.ext4 -q -F /dev/$DEV || why "mkfs.ext4 failed" || return 1
  show mount -t ext4 /dev/$DEV $MNT || why "mount failed" || return 1
  mkdir -p $MNT/dir
  head -c 8388608 /dev/urandom > $MNT/big.bin
  head -c 123457 /dev/urandom > $MNT/odd.bin
  i=0; while [ $i -lt 40 ]; do head -c $((i * 517 + 1)) /dev/urandom > $MNT/dir/f$i; i=$((i+1)); done
  echo "trellis ext4 round trip $(date)" > $MNT/hello.txt
  (cd $MNT && find . -type f | sort | xargs md5sum) > $W/sums || why "md5sum failed" || return 1
  info "$(wc -l < $W/sums) files, $(du -sk $MNT | cut -f1) KiB written"
  sync
  show umount $MNT || why "umount failed" || return 1
  do_disconnect || return 1
  do_connect || return 1
  show mount -t ext4 -o ro /dev/$DEV $MNT || why "mount after reconnect failed" || return 1
  (cd $MNT && md5sum -c $W/sums) > $W/check 2>&1; r=$?
  grep -v ': OK$' $W/check | sed 's/^/  |   /'
  info "md5sum -c: $(grep -c ': OK$' $W/check) OK of $(wc -l < $W/sums)"
  show umount $MNT || why "umount failed" || return 1
  [ $r = 0 ] || why "checksums differ after reconnect" || return 1
  show e2fsck -fn /dev/$DEV || why "e2fsck found problems" || return 1
  do_disconnect
}
step_digest_connect() {
  do_connect -g -G || return 1
  show nvme id-ctrl /dev/$CTRL -H >/dev/null || why "id-ctrl over digest connection failed"
}
step_digest_fio_4k() { run_fio digest-fio-4k 4k; }
step_digest_fio_128k() { run_fio digest-fio-128k 128k && do_disconnect; }
step_denied_host() {
  kmsg
  before=$(ctrl_count)
  show timeout 90 nvme connect -t tcp -a "$TARGET_ADDR" -s "$IO_PORT" -n "$SUBNQN" -i "$NR_IO_QUEUES" \
       --hostnqn="$BAD_HOSTNQN" --hostid="$BAD_HOSTID" --ctrl-loss-tmo=0
  r=$?
  dmesg -c > $W/dmesg.denied; cat $W/dmesg.denied >> $W/dmesg.all
  sed 's/^/  |   kernel: /' $W/dmesg.denied
  if [ $r = 0 ]; then
    nvme disconnect -n "$SUBNQN" >/dev/null 2>&1
    why "connect with disallowed host NQN $BAD_HOSTNQN succeeded"; return 1
  fi
  [ "$(ctrl_count)" = "$before" ] || why "a controller appeared for the refused host" || return 1
  # Linux logs this for status 0x184 (Connect Invalid Host) only
  grep -q 'is not allowed' $W/dmesg.denied || why "refused, but not with Connect Invalid Host (status 0x184)" || return 1
  return 0
}
# In-band authentication (DH-HMAC-CHAP, docs/target.md "Authentication"). AUTH_NQN has keys for
# this host: the right secret connects and does I/O on every queue (each one authenticates), a
# wrong one, none at all, or a wrong controller secret (bidirectional) must not connect.
auth_connect() { # NAME nvme-connect-args... -> status of nvme connect; kernel log in $W/dmesg.auth
  kmsg
  info "\$ nvme connect -n $AUTH_NQN $(echo "$*" | sed 's/DHHC-1:[0-9]*:[^ ]*/DHHC-1:…/g')"
  timeout 120 nvme connect -t tcp -a "$TARGET_ADDR" -s "$IO_PORT" -n "$AUTH_NQN" -i "$NR_IO_QUEUES" \
    --ctrl-loss-tmo=0 "$@" > $W/out 2>&1
  _r=$?
  sed 's/^/  |   /' $W/out
  dmesg -c > $W/dmesg.auth; cat $W/dmesg.auth >> $W/dmesg.all
  sed 's/^/  |   kernel: /' $W/dmesg.auth
  return $_r
}
auth_io() { # the namespace of AUTH_NQN takes a 1 MiB write and reads it back; then disconnect
  _s=$SUBNQN; SUBNQN=$AUTH_NQN
  _d=$(wait_for 30 find_ns); _rc=$?
  _c=$(wait_for 5 find_ctrl)
  SUBNQN=$_s
  [ $_rc = 0 ] || why "no namespace block device for $AUTH_NQN" || return 1
  _q=$(( $(cat /sys/class/nvme/$_c/queue_count 2>/dev/null || echo 1) - 1 ))
  info "/dev/$_d on /dev/$_c, $_q I/O queues (each authenticated)"
  [ $_q -ge "$MIN_IO_QUEUES" ] || why "only $_q I/O queues (want >= $MIN_IO_QUEUES)" || return 1
  dd if=/dev/urandom of=$W/auth.in bs=64k count=16 2>/dev/null
  dd if=$W/auth.in of=/dev/$_d bs=64k oflag=direct 2>/dev/null || why "write to /dev/$_d failed" || return 1
  dd if=/dev/$_d of=$W/auth.out bs=64k count=16 iflag=direct 2>/dev/null || why "read from /dev/$_d failed" || return 1
  cmp -s $W/auth.in $W/auth.out || why "read back differs from what was written" || return 1
  show timeout 60 nvme disconnect -n "$AUTH_NQN" || why "nvme disconnect -n $AUTH_NQN failed" || return 1
}
auth_refused() { # NAME: the connect just failed and left no controller
  wait_for 10 sh -c '! grep -qxF "$0" /sys/class/nvme/*/subsysnqn 2>/dev/null' "$AUTH_NQN" ||
    why "$1: a controller of $AUTH_NQN remains" || return 1
}
step_auth() {
  if [ "$SELFTEST" = 1 ]; then info "no keys on the selftest target"; return 0; fi
  # Debian 12's 6.1 kernel is built without CONFIG_NVME_AUTH (its nvme_auth_negotiate is a stub
  # that fails every authenticated connect); the bookworm-backports 6.12 kernel has it.
  modprobe nvme-tcp 2>/dev/null
  if ! grep -qw nvme_auth_negotiate /proc/kallsyms 2>/dev/null; then
    NOTE="SKIPPED: kernel $(uname -r) has no CONFIG_NVME_AUTH (Debian 13's 6.12 has it: TRELLIS_VM_SUITE=trixie, scripts/test.d/07-interop-6.12.sh)"
    return 0
  fi
  # nvme-cli makes keys in the format the target reads (the config's came from it too).
  show nvme gen-dhchap-key -m 1 -n "$HOSTNQN" || why "nvme gen-dhchap-key failed" || return 1
  grep -qE '^DHHC-1:01:[A-Za-z0-9+/=]{48}:$' $W/out || why "gen-dhchap-key printed no DHHC-1 key" || return 1
  WRONG=$(cat $W/out)
  auth_connect --dhchap-secret="$AUTH_SECRET" || { why "connect with the right secret failed"; return 1; }
  grep -q 'qid 0: authenticated' $W/dmesg.auth || why "the kernel did not log 'qid 0: authenticated'" || return 1
  auth_io || return 1
  auth_connect --dhchap-secret="$WRONG" && { nvme disconnect -n "$AUTH_NQN" >/dev/null 2>&1; why "connect with a wrong secret succeeded"; return 1; }
  grep -q 'qid 0: authentication failed' $W/dmesg.auth || why "wrong secret: the kernel did not log 'qid 0: authentication failed'" || return 1
  auth_refused "wrong secret" || return 1
  auth_connect && { nvme disconnect -n "$AUTH_NQN" >/dev/null 2>&1; why "connect without a secret succeeded"; return 1; }
  auth_refused "no secret" || return 1
  auth_connect --dhchap-secret="$AUTH_SECRET" --dhchap-ctrl-secret="$AUTH_CTRL_SECRET" ||
    { why "bidirectional connect with the right secrets failed"; return 1; }
  grep -q 'qid 0: controller authenticated' $W/dmesg.auth ||
    why "bidirectional: the kernel did not log 'qid 0: controller authenticated'" || return 1
  auth_io || return 1
  auth_connect --dhchap-secret="$AUTH_SECRET" --dhchap-ctrl-secret="$WRONG" &&
    { nvme disconnect -n "$AUTH_NQN" >/dev/null 2>&1; why "connect with a wrong controller secret succeeded"; return 1; }
  grep -q 'qid 0: controller authentication failed' $W/dmesg.auth ||
    why "wrong controller secret: the kernel did not log 'qid 0: controller authentication failed'" || return 1
  auth_refused "wrong controller secret" || return 1
  NOTE="right secret: I/O ok; wrong secret, no secret, wrong controller secret: refused; bidirectional: I/O ok"
}
# NVMe/TCP TLS 1.3 with a PSK (docs/target.md "TLS") on the target's secure_channel = "required"
# listener (TLS_PORT). The kernel hands the handshake to tlshd (Debian 13's ktls-utils, brought in by
# vm.sh with TRELLIS_VM_SUITE=trixie) and runs the records in kTLS; nvme-cli 2.13 (nvme-trixie)
# derives the TLS PSK from the configured key and puts it into the .nvme keyring, where the
# kernel looks it up by identity ("NVMe0R01 <hostnqn> <subnqn>").
tls_connect() { # NQN extra-args... -> status of nvme connect; kernel log in $W/dmesg.tls
  kmsg
  info "\$ nvme connect -s $TLS_PORT -n $1 ${2:-}"
  timeout 120 nvme-trixie connect -t tcp -a "$TARGET_ADDR" -s "$TLS_PORT" -n "$@" -i "$NR_IO_QUEUES" \
    --ctrl-loss-tmo=0 > $W/out 2>&1
  _r=$?
  sed 's/^/  |   /' $W/out
  dmesg -c > $W/dmesg.tls; cat $W/dmesg.tls >> $W/dmesg.all
  sed 's/^/  |   kernel: /' $W/dmesg.tls
  return $_r
}
step_tls() {
  if [ "$SELFTEST" = 1 ]; then info "no TLS keys on the selftest target"; return 0; fi
  if ! command -v tlshd >/dev/null 2>&1 || ! command -v nvme-trixie >/dev/null 2>&1; then
    NOTE="SKIPPED: no tlshd / nvme-cli with --tls in this guest (TRELLIS_VM_SUITE=trixie brings them; scripts/test.d/07-interop-6.12.sh)"
    return 0
  fi
  modprobe tls || why "modprobe tls (kTLS) failed" || return 1
  # kTLS takes the record cipher from the crypto API: gcm(aes) (aesni-intel under TCG's -cpu max).
  modprobe -a gcm ghash-generic aesni-intel 2>/dev/null
  sed -i "s/^tls=0/tls=${TLSHD_GNUTLS_DEBUG:-0}/" /etc/tlshd.conf 2>/dev/null
  tlshd -s > $W/tlshd.log 2>&1 &
  TLSHD=$!
  sleep 1
  # Plain NVMe/TCP on the required listener: the target closes it before ICResp.
  kmsg
  info "\$ nvme connect -s $TLS_PORT -n $TLS_NQN (no --tls)"
  timeout 60 nvme connect -t tcp -a "$TARGET_ADDR" -s "$TLS_PORT" -n "$TLS_NQN" --ctrl-loss-tmo=0 > $W/out 2>&1 &&
    { nvme disconnect -n "$TLS_NQN" >/dev/null 2>&1; kill $TLSHD; why "a plain connect to the TLS-required listener succeeded"; return 1; }
  sed 's/^/  |   /' $W/out
  wait_for 10 sh -c '! grep -qxF "$0" /sys/class/nvme/*/subsysnqn 2>/dev/null' "$TLS_NQN" ||
    { kill $TLSHD; why "plain connect: a controller of $TLS_NQN remains"; return 1; }
  _ok=1 _refused384=0
  for spec in "$TLS_NQN $TLS_KEY 01 AES_128_GCM_SHA256" "$TLS_NQN_384 $TLS_KEY_384 02 AES_256_GCM_SHA384"; do
    set -- $spec
    show nvme-trixie check-tls-key --insert -d "$2" -n "$HOSTNQN" -c "$1" || { why "nvme check-tls-key --insert failed for $1"; _ok=0; break; }
    if ! tls_connect "$1" --tls; then
      # Debian 13's tlshd (ktls-utils 1.0) binds a SHA-384 (02) PSK with SHA-256 but offers only
      # TLS_AES_256_GCM_SHA384: no TLS 1.3 server can accept that, and the target refuses it
      # naming the cause (docs/target.md "TLS"). Accepted here only for the 02 key, and only
      # once tlshd got as far as offering its identity; a newer tlshd must then connect.
      if [ "$3" = 02 ] && grep -q "Using psk identity NVMe0R02 $HOSTNQN $1" $W/tlshd.log 2>/dev/null; then
        info "$1: refused (tlshd offered NVMe0R02 but binds it with SHA-256; see the target log)"
        _refused384=1
        continue
      fi
      why "nvme connect --tls to $1 failed"; _ok=0; break
    fi
    _s=$SUBNQN; _p=$IO_PORT; SUBNQN=$1; IO_PORT=$TLS_PORT
    CTRL=$(wait_for 30 find_ctrl); DEV=$(wait_for 30 find_ns); _rc=$?
    SUBNQN=$_s; IO_PORT=$_p
    [ $_rc = 0 ] || { why "no namespace block device for $1 over TLS"; _ok=0; break; }
    info "$1: /dev/$DEV on /dev/$CTRL, tls_key $(cat /sys/class/nvme/$CTRL/tls_key 2>/dev/null), $(( $(cat /sys/class/nvme/$CTRL/queue_count) - 1 )) I/O queues"
    grep -q "NVMe0R$3 $HOSTNQN $1" $W/tlshd.log 2>/dev/null || info "(tlshd log does not name the identity)"
    if [ "$1" = "$TLS_NQN" ]; then
      FIO_SIZE=64M run_fio tls-fio-4k 4k || { _ok=0; break; }
      run_fio tls-fio-128k 128k || { _ok=0; break; }
    else
      dd if=/dev/urandom of=$W/tls.in bs=64k count=16 2>/dev/null
      dd if=$W/tls.in of=/dev/$DEV bs=64k oflag=direct 2>/dev/null || { why "write over TLS ($1) failed"; _ok=0; break; }
      dd if=/dev/$DEV of=$W/tls.out bs=64k count=16 iflag=direct 2>/dev/null || { why "read over TLS ($1) failed"; _ok=0; break; }
      cmp -s $W/tls.in $W/tls.out || { why "read back over TLS ($1) differs"; _ok=0; break; }
    fi
    show timeout 60 nvme disconnect -n "$1" || { why "nvme disconnect -n $1 failed"; _ok=0; break; }
    DEV=""; CTRL=""
  done
  sed 's/^/  |   tlshd: /' $W/tlshd.log | grep -vE 'REC\[|BUF\[|WRITE|READ|ASSERT' | tail -${TLSHD_LOG_LINES:-12}
  kill $TLSHD 2>/dev/null
  [ $_ok = 1 ] || return 1
  NOTE="plain connect to the required listener refused; --tls with a SHA-256 key (TLS_AES_128_GCM_SHA256, fio verify 4k+128k) ok"
  if [ $_refused384 = 1 ]; then NOTE="$NOTE; SHA-384 key refused (this tlshd binds it with SHA-256)"
  else NOTE="$NOTE; SHA-384 key (1 MiB write/read) ok"; fi
}
step_disconnect_all() {
  show timeout 60 nvme disconnect-all || why "nvme disconnect-all failed" || return 1
  wait_for 20 sh -c '[ -z "$(ls /sys/class/nvme 2>/dev/null)" ]' || why "controllers left: $(ls /sys/class/nvme)" || return 1
  CTRL=""; DEV=""
}

# ------------------------------------------------------------------ main
T_START=$(now)
echo "guest-initiator: target $TARGET_ADDR io=$IO_PORT disc=$DISC_PORT subnqn=$SUBNQN hostnqn=$HOSTNQN selftest=$SELFTEST"
# Discovery Log Page Change notices (docs/target.md "Discovery log change notices"): a
# persistent discovery controller (`nvme discover --persistent`) stays connected; a referral
# added over the management socket changes the log, and the kernel turns the target's AEN
# (DW0 0070F002h) into a uevent NVME_AEN=0x70f002, which busybox `uevent` records here. The
# log then lists the referral (SUBTYPE 1h), and the controller is the same one, still live.
disc_ctrl() {
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat $c/subsysnqn 2>/dev/null)" = nqn.2014-08.org.nvmexpress.discovery ] || continue
    case "$(cat $c/address 2>/dev/null)" in *"trsvcid=$DISC_PORT"*) ;; *) continue;; esac
    [ "$(cat $c/state 2>/dev/null)" = live ] || continue
    basename $c; return 0
  done
  return 1
}
step_disc_aen() {
  if [ "$SELFTEST" = 1 ]; then info "selftest: the Linux target has no trellis management socket"; return 0; fi
  : > $W/uevents
  uevent sh -c 'echo "uevent $ACTION ${DEVNAME:-} NVME_AEN=${NVME_AEN:-} ${NVME_EVENT:-}" >> /tmp/gi/uevents' &
  _up=$!
  show timeout 60 nvme discover -t tcp -a "$TARGET_ADDR" -s "$DISC_PORT" --persistent ||
    { kill $_up; kmsg; why "nvme discover --persistent failed"; return 1; }
  _dc=$(wait_for 10 disc_ctrl) || { kill $_up; why "no live persistent discovery controller"; return 1; }
  info "persistent discovery controller $_dc (cntlid $(cat /sys/class/nvme/$_dc/cntlid), kato $(cat /sys/class/nvme/$_dc/kato 2>/dev/null || echo ?))"
  _t=$(now)
  ctl_request referral add --addr 10.0.2.99:8009
  wait_for 20 grep -qi 'NVME_AEN=0x0*70f002' $W/uevents ||
    { kill $_up; sed 's/^/  | /' $W/uevents; why "no Discovery Log Page Change uevent within 20 s"; return 1; }
  info "uevent NVME_AEN=0x70f002 on $(grep -i 70f002 $W/uevents | head -1 | cut -d' ' -f3) after $(since $_t)s"
  kill $_up
  show timeout 60 nvme discover -t tcp -a "$TARGET_ADDR" -s "$DISC_PORT" || { why "nvme discover failed"; return 1; }
  grep -q '10\.0\.2\.99' $W/out && grep -qi 'referral' $W/out || why "the log does not list the referral" || return 1
  ctl_request referral remove --addr 10.0.2.99:8009
  [ "$(disc_ctrl)" = "$_dc" ] || why "the persistent discovery controller is gone" || return 1
  show nvme disconnect -d "$_dc" || why "nvme disconnect -d $_dc failed" || return 1
  return 0
}
# HA pair (docs/target.md "HA pair"): run-interop.sh runs two nodes a (HA_PORT_A, the lease
# owner) and b (HA_PORT_B) exporting HA_NQN from one backing file. The guest connects to both
# (one multipath head, two paths: optimized + inaccessible), runs fio verify and asks the host
# (@@TRELLIS-HA@@ lines) to kill -9 the owner; fio must finish with 0 errors and 0 verify
# failures. The resume time is the longest gap between completions of 4 KiB O_DIRECT probe
# writes (beyond fio's range) around the kill. Then, under a second fio verify: drain the owner
# (b), restart b, drain a (failback to b): 0 errors again.
ha_ctrl() { # PORT -> controller of HA_NQN at that port (any state)
  for _c in /sys/class/nvme/nvme*; do
    [ "$(cat $_c/subsysnqn 2>/dev/null)" = "$HA_NQN" ] || continue
    case "$(cat $_c/address 2>/dev/null)" in *"trsvcid=$1"*) basename $_c; return 0;; esac
  done
  return 1
}
ha_state() { # PORT -> ANA state of the path through that port ("none" if no live controller)
  _hc=$(ha_ctrl $1) && [ "$(cat /sys/class/nvme/$_hc/state 2>/dev/null)" = live ] || { echo none; return 0; }
  for _p in /sys/block/nvme*c${_hc#nvme}n*; do
    [ -r "$_p/ana_state" ] && { cat $_p/ana_state; return 0; }
  done
  echo none
}
ha_is() { [ "$(ha_state $1)" = "$2" ]; }     # PORT STATE
ha_head() {
  for b in /sys/block/nvme*n*; do
    n=$(basename $b)
    case "$n" in nvme*c*n*) continue;; esac
    [ "$(cat $b/device/subsysnqn 2>/dev/null)" = "$HA_NQN" ] && [ -b /dev/$n ] && { echo $n; return 0; }
  done
  return 1
}
ha_connect() { # PORT
  show timeout 60 nvme connect -t tcp -a "$TARGET_ADDR" -s "$1" -n "$HA_NQN" -i 2 \
    --ctrl-loss-tmo="$HA_CTRL_LOSS_TMO" --reconnect-delay=1 || { kmsg; why "nvme connect to port $1 failed"; return 1; }
}
ha_paths() { info "paths: a ($HA_PORT_A) $(ha_state $HA_PORT_A), b ($HA_PORT_B) $(ha_state $HA_PORT_B)"; }
ha_fio_start() { # NAME
  _fo=$W/$1.txt
  info "\$ fio --rw=randwrite --bs=4k --size=$HA_FIO_SIZE --iodepth=16 --direct=1 --ioengine=$FIO_ENGINE --verify=crc32c --verify_fatal=1 /dev/$HD (background)"
  timeout "$HA_FIO_TIMEOUT" fio --name="$1" --filename=/dev/$HD --rw=randwrite --bs=4k --size="$HA_FIO_SIZE" \
    --iodepth=16 --ioengine="$FIO_ENGINE" --direct=1 --verify=crc32c --do_verify=1 --verify_fatal=1 \
    --verify_dump=0 --numjobs=1 --output="$_fo" > $W/$1.stdout 2>&1 &
  FIO_PID=$!
}
ha_fio_check() { # NAME: wait for fio; 0 errors, 0 verify failures
  wait $FIO_PID; _r=$?; FIO_PID=""
  _fo=$W/$1.txt; cat $W/$1.stdout >> $_fo
  grep -E 'err=|READ:|WRITE:|verify|bad magic|crc32c|error' $_fo | sed 's/^ */  |   /'
  [ $_r = 0 ] || { kmsg; why "$1: fio exit status $_r"; return 1; }
  grep -q 'err= *0' $_fo || why "$1: fio reported a job error" || return 1
  grep -qiE 'verify failed|bad magic|verify: bad|crc32c: verify|got [0-9a-fx]*, wanted|checksum mismatch' $_fo &&
    { why "$1: fio verify errors"; return 1; }
  grep -qE 'WRITE:.*io=' $_fo && grep -qE 'READ:.*io=' $_fo || why "$1: fio did no writes or no verify reads" || return 1
}
ha_probe() { # background: one 4 KiB O_DIRECT write at a time at 64 MiB + i*4 KiB; completion times
  _i=0; : > $W/probe.t
  while [ ! -e $W/probe.stop ]; do
    dd if=$W/probe.blk of=/dev/$HD bs=4096 count=1 seek=$((16384 + _i % 256)) oflag=direct conv=notrunc 2>/dev/null ||
      echo "err $(now)" >> $W/probe.t
    now >> $W/probe.t; _i=$((_i + 1))
  done
}
ha_probe_gap() { # KILL_TIME -> longest gap between probe completions ending after it
  grep -v err $W/probe.t | awk -v k="$1" 'NR>1 && $1>k && $1-p>m {m=$1-p} {p=$1} END {printf "%.2f", m}'
}
ha_wait() { # SECONDS PORT STATE WHAT
  wait_for $1 ha_is $2 $3 || { ha_paths; kmsg; why "$4: port $2 not $3 within $1 s"; return 1; }
}
ha_back() { # PORT: the path through PORT is back after a node restart (the kernel reconnects
  # within HA_CTRL_LOSS_TMO, else connect again), and inaccessible (standby)
  _t=$(( $(cut -d. -f1 /proc/uptime) + 20 ))
  until ha_is $1 inaccessible; do
    if ! ha_ctrl $1 >/dev/null; then timeout 30 nvme connect -t tcp -a "$TARGET_ADDR" -s "$1" -n "$HA_NQN" -i 2 \
        --ctrl-loss-tmo="$HA_CTRL_LOSS_TMO" --reconnect-delay=1 > /dev/null 2>&1 && info "reconnected port $1"; fi
    [ "$(cut -d. -f1 /proc/uptime)" -lt $_t ] || { ha_paths; why "the path through port $1 is not back (inaccessible) 20 s after the restart"; return 1; }
    sleep 0.3
  done
}
ha_request() { echo "@@TRELLIS-HA@@ $*"; }
step_ha() {
  if [ "$SELFTEST" = 1 ] || [ -z "${HA_PORT_A:-}" ]; then info "no HA pair in this run (HA_PORT_A unset)"; return 0; fi
  _mp=$(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null)
  [ "$_mp" = Y ] || why "native multipath is off (nvme_core multipath=$_mp)" || return 1
  kmsg
  ha_connect $HA_PORT_A || return 1
  ha_connect $HA_PORT_B || return 1
  HD=$(wait_for 20 ha_head) || why "no multipath block device for $HA_NQN" || return 1
  # head nvmeXnY, its paths nvmeXcZnY (one per controller)
  _pl=$(cd /sys/block && ls -d ${HD%n*}c*n${HD##*n} 2>/dev/null | tr '\n' ' ')
  _np=$(echo $_pl | wc -w)
  info "multipath head /dev/$HD ($(( $(cat /sys/block/$HD/size) / 2048 )) MiB), paths: $_pl"
  [ "$_np" = 2 ] || why "/dev/$HD has $_np paths, want 2" || return 1
  ha_wait 10 $HA_PORT_A optimized "before the kill" || return 1
  ha_wait 10 $HA_PORT_B inaccessible "before the kill" || return 1
  ha_paths
  show nvme list-subsys /dev/$HD
  # kill -9 of the owner (a) under fio verify and the probe writes
  head -c 4096 /dev/urandom > $W/probe.blk; rm -f $W/probe.stop
  ha_fio_start ha-kill
  ha_probe & _pp=$!
  sleep 3
  kill -0 $FIO_PID 2>/dev/null || { wait $FIO_PID; why "fio ended before the kill ($(tail -3 $W/ha-kill.stdout | tr '\n' ' '))"; return 1; }
  _k=$(now); ha_request kill-owner; HA_KILLS_A=$((HA_KILLS_A + 1))
  ha_wait 30 $HA_PORT_B optimized "after kill -9 of a" || { touch $W/probe.stop; wait $_pp; wait $FIO_PID; return 1; }
  _flip=$(since $_k)
  ha_fio_check ha-kill; _r=$?
  touch $W/probe.stop; wait $_pp
  HA_RESUME=$(ha_probe_gap $_k)
  info "kill -9: path b optimized $_flip s after the request; longest stall of the probe writes: $HA_RESUME s; probe errors: $(grep -c err $W/probe.t)"
  [ $_r = 0 ] || return 1
  grep -q err $W/probe.t && { why "a probe write failed after kill -9"; return 1; }
  awk -v r="$HA_RESUME" -v m="$HA_RESUME_MAX" 'BEGIN {exit !(r < m)}' || why "I/O stalled $HA_RESUME s after kill -9 (limit $HA_RESUME_MAX s)" || return 1
  _hc=$(ha_ctrl $HA_PORT_A) && info "dead path $_hc: $(cat /sys/class/nvme/$_hc/state 2>/dev/null)" || info "dead path: controller removed"
  # restart a (standby), then under fio verify: drain b, restart b, drain a (failback to b)
  ha_request start a
  ha_back $HA_PORT_A || return 1
  ha_paths
  ha_fio_start ha-drain
  sleep 2
  _k=$(now); ha_request drain-owner
  ha_wait 20 $HA_PORT_A optimized "drain of b" || { wait $FIO_PID; return 1; }
  HA_DRAIN1=$(since $_k)
  ha_request restart b
  ha_back $HA_PORT_B || { wait $FIO_PID; return 1; }
  _k=$(now); ha_request drain-owner
  ha_wait 20 $HA_PORT_B optimized "failback (drain of a)" || { wait $FIO_PID; return 1; }
  HA_DRAIN2=$(since $_k)
  ha_wait 10 $HA_PORT_A inaccessible "failback (drain of a)" || { wait $FIO_PID; return 1; }
  kill -0 $FIO_PID 2>/dev/null || { wait $FIO_PID; why "fio ended before the cycle did: raise HA_FIO_SIZE"; return 1; }
  ha_paths
  ha_fio_check ha-drain || return 1
  info "drain b -> a optimized after $HA_DRAIN1 s; restart b; drain a -> b optimized after $HA_DRAIN2 s"
  dmesg -c > $W/dmesg.ha 2>/dev/null; cat $W/dmesg.ha >> $W/dmesg.all
  grep -iE 'I/O error|Buffer I/O' $W/dmesg.ha && { why "the kernel logged I/O errors"; return 1; }
  show timeout 60 nvme disconnect -n "$HA_NQN" || why "nvme disconnect -n $HA_NQN failed" || return 1
  NOTE="resume after kill -9 ${HA_RESUME}s (b optimized after ${_flip}s), drain ${HA_DRAIN1}s, failback ${HA_DRAIN2}s"
}
# Crash consistency with a real file system: ext4 on the HA pair's multipath head. Each round a
# writer creates 64 KiB files, each with dd conv=fsync, and logs a file's checksum only once its
# fsync returned (acknowledged); meanwhile the host kill -9s the owner node. The kernel fails the
# I/O over to the other node (one backing file), the writer goes on, and after the round every
# logged file of every round so far is read back with the guest's page cache dropped, so the
# data comes from the target. Then the killed node restarts as the standby. At the end: umount,
# e2fsck -fn, and every file once more from a fresh read-only mount.
crash_writer() { # ROUND: until $W/crash.stop, one fsync'ed file at a time
  _j=0
  while [ ! -e $W/crash.stop ]; do
    head -c 65536 /dev/urandom > $W/crash.blob
    _f=r$1-$_j
    dd if=$W/crash.blob of=$MNT/crash/$_f bs=65536 conv=fsync 2>/dev/null &&
      echo "$(md5sum < $W/crash.blob | cut -c1-32)  crash/$_f" >> $W/crash.sums || echo "$_f" >> $W/crash.err
    _j=$((_j + 1))
  done
}
crash_verify() { # WHAT: every acknowledged file, read from the target
  sync; echo 3 > /proc/sys/vm/drop_caches
  (cd $MNT && md5sum -c $W/crash.sums) > $W/crash.check 2>&1 && return 0
  grep -v ': OK$' $W/crash.check | head -5 | sed 's/^/  |   /'
  why "$1: $(grep -c ': FAILED' $W/crash.check) of $(wc -l < $W/crash.sums) acknowledged files differ or are missing"
}
crash_round() { # ROUND
  for _o in $HA_PORT_A $HA_PORT_B; do ha_is $_o optimized && break; _o=""; done
  [ -n "$_o" ] || { ha_paths; why "round $1: no optimized path"; return 1; }
  _kn=a _sp=$HA_PORT_B; [ "$_o" = "$HA_PORT_B" ] && _kn=b _sp=$HA_PORT_A
  rm -f $W/crash.stop; crash_writer $1 & _wp=$!
  sleep 1
  _n0=$(wc -l < $W/crash.sums); _k=$(now); ha_request kill-owner
  if [ $_kn = a ]; then HA_KILLS_A=$((HA_KILLS_A + 1)); else HA_KILLS_B=$((HA_KILLS_B + 1)); fi
  ha_wait 30 $_sp optimized "round $1, after kill -9 of $_kn" || { touch $W/crash.stop; wait $_wp; return 1; }
  _fl=$(since $_k)
  sleep 1; touch $W/crash.stop; wait $_wp
  [ -s $W/crash.err ] && { why "round $1: a write or fsync failed: $(cat $W/crash.err | tr '\n' ' ')"; return 1; }
  crash_verify "round $1" || return 1
  CRASH_FLIPS="$CRASH_FLIPS $_fl"
  info "round $1: kill -9 $_kn, other path optimized after $_fl s; $(( $(wc -l < $W/crash.sums) - _n0 )) files fsync'ed since the kill request; $(wc -l < $W/crash.sums) verified"
  ha_request start $_kn
  ha_back $_o
}
# Unsafe Shutdowns (docs/target.md "Drive health"): a node counts a kill -9 at its next start, in
# its state directory, which run-interop.sh keeps across restarts (LOG_DIR/state-ha-a, -b). The
# smart-log of each node's own controller (not the multipath head: one path, one node) must
# count at least the kill -9s of that node asked for in this run (steps ha and crash-ext4).
crash_unsafe() {
  CRASH_UNSAFE=""
  for _x in "a $HA_PORT_A $HA_KILLS_A" "b $HA_PORT_B $HA_KILLS_B"; do
    set -- $_x
    _hc=$(ha_ctrl $2) || why "no controller of $HA_NQN at port $2 (node $1)" || return 1
    smart_read $_hc || return 1
    _us=$(smart_field unsafe_shutdowns)
    info "node $1 (/dev/$_hc): unsafe_shutdowns ${_us:-?}, kill -9 of $1 so far: $3"
    [ "${_us:-0}" -ge "$3" ] || why "node $1 reports ${_us:-no} unsafe shutdowns after $3 kill -9" || return 1
    CRASH_UNSAFE="$CRASH_UNSAFE $1 $_us (kill -9: $3)"
  done
  CRASH_UNSAFE=$(echo "$CRASH_UNSAFE" | sed 's/) /), /g')
}
step_crash_ext4() {
  if [ "$SELFTEST" = 1 ] || [ -z "${HA_PORT_A:-}" ]; then info "no HA pair in this run (HA_PORT_A unset)"; return 0; fi
  kmsg
  ha_connect $HA_PORT_A || return 1
  ha_connect $HA_PORT_B || return 1
  HD=$(wait_for 20 ha_head) || why "no multipath block device for $HA_NQN" || return 1
  show mkfs.ext4 -q -F /dev/$HD || why "mkfs.ext4 failed" || return 1
  show mount -t ext4 /dev/$HD $MNT || why "mount failed" || return 1
  mkdir -p $MNT/crash; : > $W/crash.sums; rm -f $W/crash.err; CRASH_FLIPS=""
  _r=1
  while [ $_r -le "$CRASH_ROUNDS" ]; do
    crash_round $_r || { umount $MNT 2>/dev/null; return 1; }
    _r=$((_r + 1))
  done
  show umount $MNT || why "umount failed" || return 1
  show e2fsck -fn /dev/$HD || why "e2fsck found problems after $CRASH_ROUNDS kill -9 rounds" || return 1
  show mount -t ext4 -o ro /dev/$HD $MNT || why "read-only mount failed" || return 1
  crash_verify "after remount" || { umount $MNT; return 1; }
  show umount $MNT || why "umount failed" || return 1
  dmesg -c > $W/dmesg.crash 2>/dev/null; cat $W/dmesg.crash >> $W/dmesg.all
  grep -iE 'I/O error|Buffer I/O|EXT4-fs error' $W/dmesg.crash && { why "the kernel logged I/O or ext4 errors"; return 1; }
  crash_unsafe || return 1
  show timeout 60 nvme disconnect -n "$HA_NQN" || why "nvme disconnect -n $HA_NQN failed" || return 1
  _max=$(echo $CRASH_FLIPS | tr ' ' '\n' | sort -n | tail -1)
  NOTE="$CRASH_ROUNDS kill -9 rounds, $(wc -l < $W/crash.sums) fsync'ed files intact, e2fsck clean, failover <= ${_max}s, unsafe_shutdowns$CRASH_UNSAFE"
}
# Central discovery controller: run-interop.sh starts a second node and `trellis cdc` following
# both nodes (CDC_PORT); one `nvme discover` there lists both nodes' subsystems.
step_cdc() {
  if [ "$SELFTEST" = 1 ] || [ -z "${CDC_PORT:-}" ]; then info "no trellis cdc in this run (CDC_PORT unset)"; return 0; fi
  show timeout 60 nvme discover -t tcp -a "$TARGET_ADDR" -s "$CDC_PORT" || { kmsg; why "nvme discover on the CDC failed"; return 1; }
  grep -qF "$SUBNQN" $W/out || why "$SUBNQN (this node) not in the CDC's log" || return 1
  grep -qF "$NODE2_NQN" $W/out || why "$NODE2_NQN (the second node) not in the CDC's log" || return 1
}
kmsg
if [ "$SELFTEST" = 1 ]; then
  [ -f /run/guest-nvmet.sh ] || { echo "guest-initiator: SELFTEST=1 needs /run/guest-nvmet.sh (vm.sh --add guest-nvmet.sh)"; exit 2; }
  NVMET_NQN=$SUBNQN NVMET_ADDR=$TARGET_ADDR NVMET_PORTS="$IO_PORT $DISC_PORT" NVMET_ALLOWED_HOSTS=$HOSTNQN \
    sh /run/guest-nvmet.sh setup || { echo "guest-initiator: SELFTEST target setup failed"; exit 2; }
fi

OK=0; FAIL=0; SKIP=0; STOP=0; FAILED=""
for s in $STEPS; do
  if [ $STOP = 1 ]; then echo "STEP $s: skipped"; SKIP=$((SKIP+1)); continue; fi
  fn=step_$(echo $s | tr - _)
  if ! type $fn >/dev/null 2>&1; then echo "STEP $s: FAIL unknown step"; FAIL=$((FAIL+1)); FAILED="$FAILED $s"; continue; fi
  echo "--- $s"
  t0=$(now); REASON=""; NOTE=""
  if $fn; then
    echo "STEP $s: ok ($(since $t0)s)${NOTE:+ $NOTE}"; OK=$((OK+1))
  else
    echo "STEP $s: FAIL ($(since $t0)s) ${REASON:-}"; FAIL=$((FAIL+1)); FAILED="$FAILED $s"
    [ "$KEEP_GOING" = 1 ] || STOP=1
  fi
done

# cleanup: never leave controllers behind (the kernel would keep reconnecting)
mountpoint -q $MNT 2>/dev/null && umount $MNT
if [ -n "$(ls /sys/class/nvme 2>/dev/null)" ]; then
  echo "--- cleanup"; timeout 60 nvme disconnect-all >/dev/null 2>&1
fi
kmsg
if [ $FAIL -gt 0 ]; then
  echo "--- kernel log (nvme lines, last 60)"
  grep -iE 'nvme|nvmet|tcp|blk|I/O error|EXT4' $W/dmesg.all | tail -60 | sed 's/^/  | /'
fi
echo "SUMMARY: ok=$OK fail=$FAIL skipped=$SKIP total=$(since $T_START)s${FAILED:+ failed:$FAILED}"
[ $FAIL = 0 ]
