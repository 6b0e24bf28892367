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
# In-band authentication (DH-HMAC-CHAP; needs CONFIG_NVME_TARGET_AUTH: Debian 13's 6.12, not 12's 6.1):
#   NVMET_DHCHAP_KEY=                             host secret (DHHC-1:..:) of each NVMET_DHCHAP_HOSTS host
#   NVMET_DHCHAP_CTRL_KEY=                        controller secret: bidirectional authentication
#   NVMET_DHCHAP_HOSTS=$NVMET_ALLOWED_HOSTS       hosts that get the secrets (each must be allowed:
#                                                 allow_any_host skips authentication, so it is refused here)
#   NVMET_DHCHAP_HASH="hmac(sha256)"              configfs dhchap_hash
#   NVMET_DHCHAP_DHGROUP=ffdhe2048                configfs dhchap_dhgroup (null: no DH exchange)
# NVMe/TCP TLS 1.3 with a PSK (needs CONFIG_NVME_TARGET_TCP_TLS and tlshd: TRELLIS_VM_SUITE=trixie):
#   NVMET_TLS_KEY=                                configured PSK (NVMeTLSkey-1:01:..:); nvme-cli 2.13 derives
#                                                 the TLS PSK of each NVMET_TLS_HOSTS host and puts it into the
#                                                 .nvme keyring as "NVMe0R01 <hostnqn> <subnqn>"
#   NVMET_TLS_HOSTS=$NVMET_ALLOWED_HOSTS          hosts that get the key (required with allow_any_host)
#   NVMET_TLS_PORTS=$NVMET_PORTS                  ports with addr_tsas tls1.3 and addr_treq required
NVMET_NQN=${NVMET_NQN:-nqn.2026-11.io.trellis:linux-nvmet}
NVMET_ADDR=${NVMET_ADDR:-0.0.0.0}
NVMET_PORTS=${NVMET_PORTS:-4420}
NVMET_ALLOWED_HOSTS=${NVMET_ALLOWED_HOSTS:-}
NVMET_BACKEND=${NVMET_BACKEND:-brd}
NVMET_SIZE_MB=${NVMET_SIZE_MB:-256}
NVMET_SERIAL=${NVMET_SERIAL:-TRELLISLNX01}
NVMET_INLINE=${NVMET_INLINE:-}
NVMET_TIMEOUT=${NVMET_TIMEOUT:-3600}
NVMET_DHCHAP_KEY=${NVMET_DHCHAP_KEY:-}
NVMET_DHCHAP_CTRL_KEY=${NVMET_DHCHAP_CTRL_KEY:-}
NVMET_DHCHAP_HOSTS=${NVMET_DHCHAP_HOSTS:-$NVMET_ALLOWED_HOSTS}
NVMET_DHCHAP_HASH=${NVMET_DHCHAP_HASH:-hmac(sha256)}
NVMET_DHCHAP_DHGROUP=${NVMET_DHCHAP_DHGROUP:-ffdhe2048}
NVMET_TLS_KEY=${NVMET_TLS_KEY:-}
NVMET_TLS_HOSTS=${NVMET_TLS_HOSTS:-$NVMET_ALLOWED_HOSTS}
NVMET_TLS_PORTS=${NVMET_TLS_PORTS:-$NVMET_PORTS}
C=/sys/kernel/config/nvmet
S=$C/subsystems/$NVMET_NQN

log() { echo "guest-nvmet: $*"; }
fail() { log "FAIL: $*"; exit 1; }
in_list() { case " $(echo $2) " in *" $1 "*) return 0;; esac; return 1; }

# A secure setup that nvmet would accept but not enforce (keys for a host of an allow_any_host
# subsystem, a TLS port that is not served) fails here, before anything is configured.
check_secure() {
  if [ -n "$NVMET_DHCHAP_KEY$NVMET_DHCHAP_CTRL_KEY" ]; then
    [ -n "$NVMET_DHCHAP_KEY" ] || fail "NVMET_DHCHAP_CTRL_KEY without NVMET_DHCHAP_KEY"
    [ -n "$NVMET_ALLOWED_HOSTS" ] ||
      fail "NVMET_DHCHAP_KEY needs NVMET_ALLOWED_HOSTS (nvmet authenticates no host of an allow_any_host subsystem)"
    [ -n "$NVMET_DHCHAP_HOSTS" ] || fail "NVMET_DHCHAP_KEY but NVMET_DHCHAP_HOSTS is empty"
    for h in $NVMET_DHCHAP_HOSTS; do
      in_list "$h" "$NVMET_ALLOWED_HOSTS" || fail "NVMET_DHCHAP_HOSTS: $h is not in NVMET_ALLOWED_HOSTS"
    done
  fi
  if [ -n "$NVMET_TLS_KEY" ]; then
    case "$NVMET_TLS_KEY" in NVMeTLSkey-1:0[12]:*:) ;; *) fail "NVMET_TLS_KEY is not NVMeTLSkey-1:01:..: or :02:";; esac
    [ -n "$NVMET_TLS_HOSTS" ] || fail "NVMET_TLS_KEY needs NVMET_TLS_HOSTS (or NVMET_ALLOWED_HOSTS)"
    for h in $NVMET_TLS_HOSTS; do
      [ -z "$NVMET_ALLOWED_HOSTS" ] || in_list "$h" "$NVMET_ALLOWED_HOSTS" ||
        fail "NVMET_TLS_HOSTS: $h is not in NVMET_ALLOWED_HOSTS"
    done
    [ -n "$NVMET_TLS_PORTS" ] || fail "NVMET_TLS_KEY but NVMET_TLS_PORTS is empty"
    for p in $NVMET_TLS_PORTS; do in_list "$p" "$NVMET_PORTS" || fail "NVMET_TLS_PORTS: $p is not in NVMET_PORTS"; done
    command -v tlshd >/dev/null 2>&1 && command -v nvme-trixie >/dev/null 2>&1 ||
      fail "NVMET_TLS_KEY needs tlshd and nvme-cli >= 2.4 in the guest (vm.sh brings them with TRELLIS_VM_SUITE=trixie)"
  fi
  return 0
}

# tlshd's new log lines on the console (GnuTLS record chatter left out)
TLSHD_SEEN=0
tlshd_log() {
  [ -f /tmp/nvmet-tlshd.log ] || return 0
  n=$(wc -l < /tmp/nvmet-tlshd.log)
  [ "$n" -gt "$TLSHD_SEEN" ] || return 0
  sed -n "$((TLSHD_SEEN + 1)),${n}p" /tmp/nvmet-tlshd.log | grep -vE 'REC\[|BUF\[|WRITE|READ|ASSERT' |
    sed 's/^/guest-nvmet: tlshd: /'
  TLSHD_SEEN=$n
}

# The kernel hands each TLS port's handshake to tlshd (server side; it finds the PSK by the
# host's identity in the .nvme keyring, which /etc/tlshd.conf links in), then runs the records
# in kTLS, whose AES-GCM needs the gcm(aes) modules.
start_tls() {
  modprobe tls || fail "modprobe tls (kTLS)"
  modprobe -a gcm ghash-generic aesni-intel 2>/dev/null
  grep -q '^keyrings *= *\.nvme' /etc/tlshd.conf 2>/dev/null || fail "/etc/tlshd.conf does not link the .nvme keyring"
  hh=$(echo "$NVMET_TLS_KEY" | cut -d: -f2)
  for h in $NVMET_TLS_HOSTS; do
    nvme-trixie check-tls-key --insert -d "$NVMET_TLS_KEY" -n "$h" -c "$NVMET_NQN" > /tmp/nvmet-tls-key.out 2>&1 ||
      { sed 's/^/guest-nvmet:   /' /tmp/nvmet-tls-key.out; fail "nvme check-tls-key --insert for $h"; }
    grep -q "psk .*NVMe0R$hh $h $NVMET_NQN" /proc/keys ||
      { grep psk /proc/keys | sed 's/^/guest-nvmet:   /'; fail "no psk key NVMe0R$hh $h $NVMET_NQN in /proc/keys"; }
    log "TLS PSK NVMe0R$hh $h $NVMET_NQN in .nvme ($(tr '\n' ' ' < /tmp/nvmet-tls-key.out))"
  done
  if [ -s /tmp/nvmet-tlshd.pid ] && kill -0 "$(cat /tmp/nvmet-tlshd.pid)" 2>/dev/null; then return 0; fi
  tlshd -s > /tmp/nvmet-tlshd.log 2>&1 &
  echo $! > /tmp/nvmet-tlshd.pid
  sleep 1
  kill -0 "$(cat /tmp/nvmet-tlshd.pid)" 2>/dev/null ||
    { sed 's/^/guest-nvmet:   /' /tmp/nvmet-tlshd.log; fail "tlshd exited"; }
  log "tlshd running (pid $(cat /tmp/nvmet-tlshd.pid), $(tlshd -v 2>&1 | head -1))"
}

setup() {
  check_secure
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
  if [ -n "$NVMET_DHCHAP_KEY" ]; then
    for h in $NVMET_DHCHAP_HOSTS; do
      H=$C/hosts/$h
      [ -e $H/dhchap_key ] ||
        fail "kernel $(uname -r): nvmet has no in-band authentication (CONFIG_NVME_TARGET_AUTH; Debian 13's 6.12 has it: TRELLIS_VM_SUITE=trixie)"
      echo "$NVMET_DHCHAP_HASH" > $H/dhchap_hash || fail "dhchap_hash $NVMET_DHCHAP_HASH for $h"
      echo "$NVMET_DHCHAP_DHGROUP" > $H/dhchap_dhgroup || fail "dhchap_dhgroup $NVMET_DHCHAP_DHGROUP for $h"
      echo "$NVMET_DHCHAP_KEY" > $H/dhchap_key || fail "dhchap_key for $h"
      [ -z "$NVMET_DHCHAP_CTRL_KEY" ] || echo "$NVMET_DHCHAP_CTRL_KEY" > $H/dhchap_ctrl_key ||
        fail "dhchap_ctrl_key for $h"
      [ "$(cat $H/dhchap_key)" = "$NVMET_DHCHAP_KEY" ] || fail "dhchap_key of $h reads back as '$(cat $H/dhchap_key)'"
      log "DH-HMAC-CHAP for $h: $(cat $H/dhchap_hash) $(cat $H/dhchap_dhgroup)" \
          "$([ -n "$NVMET_DHCHAP_CTRL_KEY" ] && echo bidirectional || echo host-only)"
    done
  fi
  [ -z "$NVMET_TLS_KEY" ] || start_tls
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
      if [ -n "$NVMET_TLS_KEY" ] && in_list "$p" "$NVMET_TLS_PORTS"; then
        # the port's keyring is the .nvme one (taken when the port was made); tsas before treq
        echo tls1.3 > $P/addr_tsas || fail "addr_tsas tls1.3 on port $p (CONFIG_NVME_TARGET_TCP_TLS? .nvme keyring?)"
        echo required > $P/addr_treq || fail "addr_treq required on port $p"
      fi
    fi
    if [ -n "$NVMET_TLS_KEY" ] && in_list "$p" "$NVMET_TLS_PORTS"; then
      [ "$(cat $P/addr_tsas)" = tls1.3 ] && [ "$(cat $P/addr_treq)" = required ] ||
        fail "port $p: addr_tsas '$(cat $P/addr_tsas)', addr_treq '$(cat $P/addr_treq)' (want tls1.3, required)"
    fi
    [ -e $P/subsystems/$NVMET_NQN ] || ln -s $S $P/subsystems/$NVMET_NQN || fail "link port $p (is it in use?)"
  done
  log "configured $NVMET_NQN on $NVMET_ADDR ports [$NVMET_PORTS] backend=$NVMET_BACKEND ${NVMET_SIZE_MB}MiB" \
      "hosts=${NVMET_ALLOWED_HOSTS:-any}" \
      "dhchap=$([ -n "$NVMET_DHCHAP_KEY" ] && echo "$NVMET_DHCHAP_HOSTS" | tr ' ' , || echo off)" \
      "tls=$([ -n "$NVMET_TLS_KEY" ] && echo "$NVMET_TLS_PORTS" | tr ' ' , || echo off)"
}

teardown() {
  if [ -s /tmp/nvmet-tlshd.pid ]; then
    kill "$(cat /tmp/nvmet-tlshd.pid)" 2>/dev/null
    tlshd_log
    rm -f /tmp/nvmet-tlshd.pid
  fi
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
echo "@@NVMET-READY@@ nqn=$NVMET_NQN addr=$NVMET_ADDR ports=$(echo $NVMET_PORTS | tr ' ' ,)" \
  "dhchap=$([ -n "$NVMET_DHCHAP_KEY" ] && echo on || echo off) tls=$([ -n "$NVMET_TLS_KEY" ] && echo "$NVMET_TLS_PORTS" | tr ' ' , || echo off)" \
  "kernel=$(uname -r) uptime=$(cut -d' ' -f1 /proc/uptime)"
t=0
while [ ! -e /tmp/nvmet-stop ] && [ $t -lt "$NVMET_TIMEOUT" ]; do
  sleep 1; t=$((t+1))
  dmesg -c | sed 's/^/guest-nvmet: kernel: /'   # nvmet connect/disconnect messages on the console
  tlshd_log
done
[ -e /tmp/nvmet-stop ] && log "stop requested after ${t}s" || log "NVMET_TIMEOUT (${NVMET_TIMEOUT}s) reached"
teardown
dmesg -c | sed 's/^/guest-nvmet: kernel: /'
log "done"
exit 0
