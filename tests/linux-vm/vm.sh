#!/usr/bin/env bash
# vm.sh - boot a small QEMU VM with the real Linux NVMe/TCP initiator (nvme-tcp)
# and kernel target (nvmet-tcp) from Debian's stock kernel, nvme-cli, fio and
# mke2fs, run one guest script in it and return that script's exit status.
#
# Usage:
#   vm.sh [options] GUEST-SCRIPT        run GUEST-SCRIPT (copied to /run/cmd.sh, run with sh)
#   vm.sh [options] -c 'shell command'  run a command (sh -c)
#   vm.sh --build-only                  only install host packages, fetch the kernel, build the initramfs
#
# Options:
#   --add SRC[:DST]     copy a host file into the guest (default DST=/run/<basename>); repeatable
#   --env KEY=VALUE     export KEY=VALUE to the guest script (written to /run/env); repeatable
#   --timeout S         kill the VM after S seconds (default 600; env TRELLIS_VM_TIMEOUT)
#                       (env TRELLIS_VM_CACHE_LOCK_TIMEOUT: wait for the cache lock, default 900 s)
#   --log FILE          also write the console log (CR stripped) to FILE
#   --hostfwd H:G       QEMU user-net forward hostfwd=tcp:127.0.0.1:H-:G (host port H -> guest port G); repeatable
#   --state-dir DIR     keep run state in DIR (qemu.pid, status, ctl.in/ctl.out control fifos);
#                       default: a temporary directory removed at exit
#   --mem MB            guest memory (default 1024; env TRELLIS_VM_MEM)
#   --smp N             guest CPUs (default 2; env TRELLIS_VM_SMP)
#   --accel A           tcg | kvm | auto (default tcg; env TRELLIS_VM_ACCEL). auto = kvm only when the
#                       host CPU shows vmx/svm (a nested "kvm" without them cannot boot a stock kernel)
#   --quiet             do not copy the console to stdout (use with --log)
#   -v                  verbose: kernel console without 'quiet', build chatter
#   --rebuild           rebuild the cached initramfs
#   --build-only        prepare the cache and exit
# Env TRELLIS_VM_SUITE=trixie: boot Debian 13's kernel (6.12) instead of the host release's (below),
#   and bring Debian 13's NVMe/TCP TLS user space into the guest under /opt/trixie (ktls-utils' tlshd,
#   nvme-cli 2.13 with libnvme 1.13, keyutils' keyctl, and the libraries they load, down to Debian 13's
#   glibc), run through wrappers /usr/sbin/tlshd, /usr/sbin/nvme-trixie and /usr/bin/keyctl that call
#   Debian 13's dynamic loader; downloaded through the same private apt list, never installed on the host.
#
# Guest environment: busybox sh as PID 1; eth0 10.0.2.15/24, the host's loopback is 10.0.2.2
# (QEMU user network; nothing else is reachable by design of the tests). Modules preloaded:
# virtio_net, crc32c, ext4, nvme-tcp; on demand: nvmet, nvmet-tcp, brd, null_blk, loop.
# configfs, debugfs and tracefs are mounted. /etc/nvme/hostnqn and hostid are FIXED:
#   nqn.2014-08.org.nvmexpress:uuid:5472656c-6c69-4073-8000-000000000001
# (override with --env HOSTNQN=... --env HOSTID=...). /run/env is sourced before the script.
# Serial ports: ttyS0 = console, ttyS1 = exit status (written once at the end),
# ttyS2 = control channel from the host (write a line to STATE_DIR/ctl.in to send it to the guest).
# Console markers: "@@TRELLIS-VM-READY@@ uptime=..." and "@@TRELLIS-VM-DONE@@ rc=...".
#
# Exit status: the guest script's exit status; 124 VM timeout; 125 host-side setup error;
# 126 guest ended without reporting a status (kernel panic, QEMU error); 77 host packages are
# missing and cannot be installed (not root, no passwordless sudo): the message names them.
#
# Cache: ${TRELLIS_VM_CACHE:-$HOME/.cache/trellis-vm} holds the kernel .deb (apt-get download of the
# package linux-image-amd64 depends on, or $TRELLIS_VM_KERNEL_PKG), its unpacked tree with an
# uncompressed vmlinux for PVH boot (skips the in-guest XZ decompression), and the base initramfs
# (uncompressed cpio, rebuilt when this script or the host tool versions change). The host's own
# kernel and /boot are never touched. Missing host packages are installed with apt-get (root or
# passwordless sudo; one line per package; tests/apt-lib.sh queues concurrent runs on a lock). The
# cache is locked while it is filled and until this run's initrd is copied out of it, so runs that
# share it (two test runs at once) wait for each other instead of reading a half-built file.
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
CACHE=${TRELLIS_VM_CACHE:-$HOME/.cache/trellis-vm}
ACCEL=${TRELLIS_VM_ACCEL:-tcg}
MEM=${TRELLIS_VM_MEM:-1024}
SMP=${TRELLIS_VM_SMP:-2}
TIMEOUT=${TRELLIS_VM_TIMEOUT:-600}
KPKG=${TRELLIS_VM_KERNEL_PKG:-}
# Which Debian release's kernel the guest boots: empty = the host's apt sources (Debian 12:
# 6.1); "trixie" (Debian 13: 6.12, which has NVMe/TCP TLS and in-band authentication) = that
# release's linux-image-amd64, resolved and downloaded through a private apt list under the
# cache (the host's apt sources, pins and installed packages are not touched).
SUITE=${TRELLIS_VM_SUITE:-}
case "$SUITE" in ''|trixie) ;; *) echo "vm.sh: TRELLIS_VM_SUITE must be empty (the host's release) or trixie, got '$SUITE'" >&2; exit 125;; esac
VERBOSE=0; REBUILD=0; BUILD_ONLY=0; QUIET=0
CMD=""; CMDFILE=""; LOGFILE=""; STATE=""
ADDS=(); ENVS=(); FWDS=()

die() { echo "vm.sh: $*" >&2; exit 125; }
say() { if [ "$VERBOSE" = 1 ]; then echo "vm.sh: $*" >&2; fi; }

while [ $# -gt 0 ]; do
  case "$1" in
    -c) CMD=$2; shift 2;;
    -f) CMDFILE=$2; shift 2;;
    --add) ADDS+=("$2"); shift 2;;
    --env) case "$2" in *=*) ENVS+=("$2");; *) die "--env wants KEY=VALUE";; esac; shift 2;;
    --timeout) TIMEOUT=$2; shift 2;;
    --log) LOGFILE=$2; shift 2;;
    --hostfwd) case "$2" in [0-9]*:[0-9]*) FWDS+=("$2");; *) die "--hostfwd wants HOSTPORT:GUESTPORT";; esac; shift 2;;
    --state-dir) STATE=$2; shift 2;;
    --mem) MEM=$2; shift 2;;
    --smp) SMP=$2; shift 2;;
    --accel) ACCEL=$2; shift 2;;
    --quiet) QUIET=1; shift;;
    -v) VERBOSE=1; shift;;
    --rebuild) REBUILD=1; shift;;
    --build-only) BUILD_ONLY=1; shift;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/,""); print; next} NR>1 {exit}' "$SELF"; exit 0;;
    -*) die "unknown option $1 (see --help)";;
    *) [ -z "$CMDFILE" ] || die "only one guest script"; CMDFILE=$1; shift;;
  esac
done
if [ "$BUILD_ONLY" = 0 ] && [ -z "$CMD" ] && [ -z "$CMDFILE" ]; then
  die "nothing to run: give a guest script or -c CMD (see --help)"
fi
[ -z "$CMDFILE" ] || [ -r "$CMDFILE" ] || die "cannot read $CMDFILE"
for a in ${ADDS[@]+"${ADDS[@]}"}; do [ -r "${a%%:*}" ] || die "cannot read ${a%%:*}"; done

# ------------------------------------------------------------------ host tools
# shellcheck source=../apt-lib.sh
. "$(dirname "$SELF")/../apt-lib.sh"
APT_LIB_PROG=vm.sh
ensure_packages() {
  local need=() why=() i
  command -v qemu-system-x86_64 >/dev/null || { need+=(qemu-system-x86); why+=("qemu-system-x86_64, the VM"); }
  [ -x /usr/sbin/nvme ] || { need+=(nvme-cli); why+=("nvme, copied into the guest"); }
  [ -x /usr/bin/fio ] || { need+=(fio); why+=("fio, copied into the guest"); }
  { [ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx modprobe; } ||
    { need+=(busybox-static); why+=("busybox, the guest's shell and init"); }
  command -v cpio >/dev/null || { need+=(cpio); why+=("cpio, to build the guest initramfs"); }
  { [ -x /sbin/depmod ] || [ -x /usr/sbin/depmod ]; } || { need+=(kmod); why+=("depmod, the guest kernel modules"); }
  command -v xz >/dev/null || { need+=(xz-utils); why+=("xz, to unpack the guest kernel"); }
  [ -x /sbin/mke2fs ] || [ -x /usr/sbin/mke2fs ] || { need+=(e2fsprogs); why+=("mke2fs, the guest's ext4 step"); }
  command -v dpkg-deb >/dev/null || die "dpkg-deb missing: this harness needs a Debian/Ubuntu host"
  [ ${#need[@]} -gt 0 ] || return 0
  if ! can_install; then
    echo "vm.sh: missing host packages ${need[*]} and not root (no passwordless sudo): install them, or run as root" >&2
    exit 77
  fi
  for i in "${!need[@]}"; do echo "vm.sh: installing ${need[$i]} (needed for the Linux VM tests: ${why[$i]})" >&2; done
  apt_install "${need[@]}" || die "apt-get install ${need[*]} failed"
}
PATH=$PATH:/usr/sbin:/sbin

# ---------------------------------------------------------------------- kernel
# apt-get/apt-cache options for $SUITE's private package lists (none for the host's release).
SUITE_APT=()
suite_apt_setup() {
  [ -n "$SUITE" ] || return 0
  local d=$CACHE/apt-$SUITE
  mkdir -p "$d/parts" "$d/lists/partial" "$d/cache/archives/partial"
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$SUITE" > "$d/parts/$SUITE.sources"
  SUITE_APT=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$d/parts" -o "Dir::State::Lists=$d/lists"
             -o "Dir::Cache=$d/cache" -o Dir::State::status=/dev/null)
}
suite_update() {
  if [ -n "$SUITE" ]; then apt-get "${SUITE_APT[@]}" update; else apt_get update; fi
}
resolve_kpkg() {
  apt-cache ${SUITE_APT[@]+"${SUITE_APT[@]}"} depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/{print $2; exit}'
}
fetch_kernel() {
  mkdir -p "$CACHE/debs"
  suite_apt_setup
  local last=$CACHE/kpkg-${SUITE:-host}
  if [ -z "$KPKG" ]; then
    # reuse what is cached when the package lists are gone or moved on (keeps runs deterministic)
    KPKG=$(resolve_kpkg || true)
    if [ -z "$KPKG" ]; then
      suite_update >/dev/null 2>&1 || true
      KPKG=$(resolve_kpkg || true)
    fi
    if [ -z "$KPKG" ] && [ -s "$last" ]; then KPKG=$(cat "$last"); fi
    if [ -z "$KPKG" ] && [ -z "$SUITE" ]; then
      KPKG=$(ls -d "$CACHE"/kroot-*/ 2>/dev/null | tail -1 | sed 's,.*/kroot-\(.*\)/,linux-image-\1,')
    fi
    [ -n "$KPKG" ] || die "cannot resolve the linux-image-amd64 dependency${SUITE:+ of $SUITE} (set TRELLIS_VM_KERNEL_PKG)"
    echo "$KPKG" > "$last"
  fi
  KVER=${KPKG#linux-image-}
  KROOT=$CACHE/kroot-$KVER
  if [ ! -f "$KROOT/.done" ]; then
    local deb
    deb=$(ls "$CACHE/debs/${KPKG}_"*.deb 2>/dev/null | head -1 || true)
    if [ -z "$deb" ]; then
      echo "vm.sh: installing $KPKG into $CACHE (needed for the Linux VM tests: the guest kernel; apt-get download, not installed on the host)" >&2
      # into a private directory first: a download cut short never looks like a cached .deb
      local dl=$CACHE/debs/.download.$$
      rm -rf "$dl"; mkdir -p "$dl"
      (cd "$dl" && apt-get ${SUITE_APT[@]+"${SUITE_APT[@]}"} download "$KPKG" >/dev/null 2>&1) ||
        { suite_update >/dev/null 2>&1; (cd "$dl" && apt-get ${SUITE_APT[@]+"${SUITE_APT[@]}"} download "$KPKG" >/dev/null); } ||
        { rm -rf "$dl"; die "apt-get download $KPKG failed"; }
      mv "$dl"/*.deb "$CACHE/debs/" && rm -rf "$dl"
      deb=$(ls "$CACHE/debs/${KPKG}_"*.deb | head -1)
    fi
    rm -rf "$KROOT"; mkdir -p "$KROOT"
    dpkg-deb -x "$deb" "$KROOT"
    # Debian 13 has merged /usr: its modules are under usr/lib/modules.
    if [ ! -d "$KROOT/lib/modules" ] && [ -d "$KROOT/usr/lib/modules" ]; then
      mkdir -p "$KROOT/lib"; ln -s ../usr/lib/modules "$KROOT/lib/modules"
    fi
    depmod -b "$KROOT" "$KVER"
    touch "$KROOT/.done"
  fi
  local vmlinuz=$KROOT/boot/vmlinuz-$KVER
  [ -f "$vmlinuz" ] || die "no $vmlinuz in $KPKG"
  # Uncompressed ELF vmlinux for QEMU's PVH entry (-kernel with an ELF that has a PVH note):
  # skips real-mode setup and the XZ decompression, which take seconds under TCG.
  if [ ! -s "$KROOT/vmlinux" ]; then
    local pos
    pos=$(LC_ALL=C grep -abo $'\xfd7zXZ' "$vmlinuz" 2>/dev/null | head -1 | cut -d: -f1 || true)
    if [ -n "$pos" ]; then
      tail -c +"$((pos + 1))" "$vmlinuz" | xz -dc 2>/dev/null > "$KROOT/vmlinux.tmp" || true
      if [ "$(head -c 4 "$KROOT/vmlinux.tmp" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then
        mv "$KROOT/vmlinux.tmp" "$KROOT/vmlinux"
      fi
      rm -f "$KROOT/vmlinux.tmp"
    fi
  fi
  KIMG=$vmlinuz
  if [ "${TRELLIS_VM_PVH:-1}" = 1 ] && [ -s "$KROOT/vmlinux" ]; then KIMG=$KROOT/vmlinux; fi
}

# The Debian 13 user space NVMe/TCP TLS needs on the Linux host side (trixie only): tlshd does the
# kernel's TLS handshakes, nvme-cli 2.13 knows --tls and puts derived PSKs into the .nvme keyring.
# Their closure of shared libraries (apt-cache depends --recurse, library packages only, plus the
# tools) is unpacked into $CACHE/userland-trixie; the guest runs it with Debian 13's own loader, so
# the guest's Debian 12 user space is untouched.
TLS_TOOLS="ktls-utils nvme-cli keyutils"
USERLAND=""
fetch_tls_userland() {
  [ "$SUITE" = trixie ] || return 0
  USERLAND=$CACHE/userland-$SUITE
  [ -f "$USERLAND/.done" ] && return 0
  local pkgs dl=$CACHE/debs/.userland.$$ p
  pkgs=$(apt-cache "${SUITE_APT[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
           --no-breaks --no-replaces --no-enhances --no-pre-depends $TLS_TOOLS 2>/dev/null |
         grep -v '^[ <]' | sort -u | grep -E '^(lib|ktls-utils$|nvme-cli$|keyutils$)' | grep -v -E '^lib(pam|semanage|audit|debian|newt|slang|textwrap|readline|systemd)' || true)
  if [ -z "$pkgs" ]; then suite_update >/dev/null 2>&1 || true; pkgs=$(apt-cache "${SUITE_APT[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
           --no-breaks --no-replaces --no-enhances --no-pre-depends $TLS_TOOLS 2>/dev/null |
         grep -v '^[ <]' | sort -u | grep -E '^(lib|ktls-utils$|nvme-cli$|keyutils$)' | grep -v -E '^lib(pam|semanage|audit|debian|newt|slang|textwrap|readline|systemd)' || true); fi
  [ -n "$pkgs" ] || die "cannot resolve $TLS_TOOLS in $SUITE"
  echo "vm.sh: installing $TLS_TOOLS and their libraries from $SUITE into $USERLAND (needed for the Linux VM TLS step: tlshd and nvme-cli --tls in the guest; apt-get download, not installed on the host)" >&2
  rm -rf "$dl" "$USERLAND"; mkdir -p "$dl" "$USERLAND"
  # shellcheck disable=SC2086
  (cd "$dl" && apt-get "${SUITE_APT[@]}" download $pkgs >/dev/null 2>&1) || { rm -rf "$dl"; die "apt-get download of $SUITE's $TLS_TOOLS failed"; }
  for p in "$dl"/*.deb; do dpkg-deb -x "$p" "$USERLAND"; done
  rm -rf "$dl"
  touch "$USERLAND/.done"
}

# ------------------------------------------------------------------- initramfs
MODULES="virtio_pci virtio_net crc32c_generic crc32c-intel crct10dif_generic nvme-tcp nvmet-tcp
         null_blk brd loop configfs ext4 tls gcm ghash-generic aesni-intel"
# util-linux's fallocate and blkdiscard shadow busybox's (which lack --punch-hole and -z).
GUEST_BINS="/usr/sbin/nvme /usr/bin/fio /sbin/mke2fs /sbin/e2fsck /usr/bin/fallocate /usr/sbin/blkdiscard"
FIXED_HOSTID=5472656c-6c69-4073-8000-000000000001

copy_with_libs() { # ROOT BIN...
  local root=$1 f l; shift
  for f in "$@"; do
    mkdir -p "$root$(dirname "$f")"; cp -L "$f" "$root$f"
    for l in $(ldd "$f" | awk '/=>/ {print $3} /^[[:space:]]*\/lib/ {print $1}' | grep '^/'); do
      [ -e "$root$l" ] && continue
      mkdir -p "$root$(dirname "$l")"; cp -L "$l" "$root$l"
    done
  done
}

write_init() { cat > "$1" <<EOF
#!/bin/sh
# PID 1 of the trellis test VM (generated by tests/linux-vm/vm.sh)
FIXED_HOSTID=$FIXED_HOSTID
EOF
cat >> "$1" <<'EOF'
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
finish() {
  sync
  stty -F /dev/ttyS1 raw -echo 2>/dev/null
  echo "@@STATUS@@ $1" > /dev/ttyS1
  sleep 1
  # isa-debug-exit: QEMU exits at once with status (v << 1) | 1; v = 1 + (rc & 0x7f) marks a guest status
  printf "\\$(printf %o $(( 1 + ($1 & 127) )))" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
  poweroff -f; sleep 5; echo o > /proc/sysrq-trigger
}
for m in configfs crc32c_generic virtio_pci virtio_net ext4; do modprobe -q $m || echo "init: modprobe $m failed"; done
modprobe -q crc32c-intel 2>/dev/null
mount -t configfs configfs /sys/kernel/config 2>/dev/null
modprobe nvme-tcp || echo "init: modprobe nvme-tcp failed"
stty -F /dev/ttyS2 raw -echo 2>/dev/null   # control channel from the host
ip link set lo up
n=0; while [ ! -e /sys/class/net/eth0 ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n+1)); done
ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2 ||
  echo "init: network setup failed"
[ -f /run/env ] && { set -a; . /run/env; set +a; }
mkdir -p /etc/nvme
echo "${HOSTNQN:-nqn.2014-08.org.nvmexpress:uuid:$FIXED_HOSTID}" > /etc/nvme/hostnqn
echo "${HOSTID:-$FIXED_HOSTID}" > /etc/nvme/hostid
echo "@@TRELLIS-VM-READY@@ uptime=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r)"
cd /run
if [ -f /run/cmd.sh ]; then sh /run/cmd.sh; rc=$?; else echo "init: no /run/cmd.sh"; rc=126; fi
echo "@@TRELLIS-VM-DONE@@ rc=$rc uptime=$(cut -d' ' -f1 /proc/uptime)"
finish $rc
EOF
chmod +x "$1"; }

build_initramfs() {
  local key
  key=$( { sha256sum "$SELF"; dpkg-query -W busybox-static nvme-cli libnvme1 fio e2fsprogs 2>/dev/null; [ -z "$USERLAND" ] || ls "$USERLAND/usr/sbin"; } |
         sha256sum | cut -c1-12)
  BASE=$CACHE/initramfs-$KVER-$key.cpio
  if [ "$REBUILD" = 0 ] && [ -s "$BASE" ]; then return; fi
  echo "vm.sh: building $BASE" >&2
  local r=$CACHE/root.tmp m f
  rm -rf "$r"; mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,root,mnt,lib/modules}
  cp /bin/busybox "$r/bin/busybox"
  for a in $(/bin/busybox --list); do [ -e "$r/bin/$a" ] || ln -s busybox "$r/bin/$a"; done
  for a in modprobe insmod rmmod poweroff; do ln -sf ../bin/busybox "$r/sbin/$a"; done
  local bins=()
  for f in $GUEST_BINS; do [ -e "$f" ] || f=/usr$f; bins+=("$f"); done
  copy_with_libs "$r" "${bins[@]}"
  [ -e "$r/sbin/mke2fs" ] || ln -s ../usr/sbin/mke2fs "$r/sbin/mke2fs"
  ln -sf mke2fs "$r/sbin/mkfs.ext4"
  [ -f /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$r/etc/"
  # kernel modules: closure of MODULES over modules.dep
  local md=$r/lib/modules/$KVER
  mkdir -p "$md"
  for f in $(modprobe -d "$KROOT" -S "$KVER" --show-depends -a $MODULES 2>/dev/null |
             awk '$1=="insmod"{print $2}' | sort -u); do
    m=${f#"$KROOT"}; mkdir -p "$r$(dirname "$m")"
    # Debian 13 ships modules compressed; busybox's modprobe in the guest may not read them.
    case "$f" in
      *.ko.xz) xz -dc "$f" > "$r${m%.xz}";;
      *.ko.zst) zstd -qdc "$f" > "$r${m%.zst}";;
      *) cp "$f" "$r$m";;
    esac
  done
  cp "$KROOT/lib/modules/$KVER/modules.builtin"* "$KROOT/lib/modules/$KVER/modules.order" "$md/"
  depmod -b "$r" "$KVER"
  if [ -n "$USERLAND" ]; then
    # Debian 13's tools under /opt/trixie, each behind a wrapper that uses Debian 13's loader.
    mkdir -p "$r/opt/trixie" "$r/etc"
    cp -a "$USERLAND/usr" "$r/opt/trixie/"
    [ -d "$USERLAND/etc" ] && cp -a "$USERLAND/etc" "$r/opt/trixie/"
    rm -rf "$r/opt/trixie/usr/share/doc" "$r/opt/trixie/usr/share/man" "$r/opt/trixie/usr/share/locale"
    local ld libs
    ld=$(cd "$r/opt/trixie" && find usr -name 'ld-linux-x86-64.so.2' | head -1)
    [ -n "$ld" ] || die "no ld-linux-x86-64.so.2 in $USERLAND"
    libs=/opt/trixie/usr/lib/x86_64-linux-gnu
    for f in sbin/tlshd:tlshd sbin/nvme:nvme-trixie bin/keyctl:keyctl; do
      printf '#!/bin/sh\nexec /opt/trixie/%s --library-path %s /opt/trixie/usr/%s "$@"\n' "$ld" "$libs" "${f%%:*}" \
        > "$r/usr/${f%%/*}/${f#*:}"
      chmod +x "$r/usr/${f%%/*}/${f#*:}"
    done
    # tlshd reads the PSKs that nvme-cli inserts into the .nvme keyring.
    printf '[debug]\nloglevel=1\ntls=0\nnl=0\n[authenticate]\nkeyrings=.nvme\n[authenticate.client]\n[authenticate.server]\n' > "$r/etc/tlshd.conf"
  fi
  write_init "$r/init"
  echo "root:x:0:0:root:/root:/bin/sh" > "$r/etc/passwd"; echo "root:x:0:" > "$r/etc/group"
  # uncompressed on purpose: gunzip of ~100 MB costs seconds under TCG
  (cd "$r" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) > "$BASE.tmp"
  mv "$BASE.tmp" "$BASE"
  rm -rf "$r"
  # drop initramfs images of older script versions
  # (of every kernel: the key is the last part of the name; two suites' images may both be current)
  ls "$CACHE"/initramfs-*.cpio 2>/dev/null | grep -v -- "-$key.cpio\$" | xargs -r rm -f || true
}

# ------------------------------------------------------------------------ main
ensure_packages
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
CACHE_LOCK_TIMEOUT=${TRELLIS_VM_CACHE_LOCK_TIMEOUT:-900}
flock -w "$CACHE_LOCK_TIMEOUT" 9 || die "cache lock $CACHE/.lock still held by another run after ${CACHE_LOCK_TIMEOUT}s (TRELLIS_VM_CACHE_LOCK_TIMEOUT)"
T_PREP=$(date +%s.%N)
fetch_kernel
fetch_tls_userland
build_initramfs
# The lock stays held until this run's initrd is copied out of the cache (below): a run of a
# different vm.sh version would otherwise delete $BASE in between.
if [ "$BUILD_ONLY" = 1 ]; then echo "kernel: $KIMG"; echo "initramfs: $BASE"; exit 0; fi

if [ "$ACCEL" = auto ]; then
  if [ -r /dev/kvm ] && [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then ACCEL=kvm; else ACCEL=tcg; fi
fi
case "$ACCEL" in
  kvm) ACCEL_ARGS=(-accel kvm -cpu "${TRELLIS_VM_CPU:-host}");;
  tcg) ACCEL_ARGS=(-accel tcg,thread=multi,tb-size=256 -cpu "${TRELLIS_VM_CPU:-max}");;
  *) die "bad --accel $ACCEL";;
esac

WORK=$(mktemp -d "${TMPDIR:-/tmp}/trellis-vm.XXXXXX")
QPID=""
cleanup() {
  if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then kill "$QPID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
if [ -z "$STATE" ]; then STATE=$WORK/state; fi
mkdir -p "$STATE"
rm -f "$STATE/ctl.in" "$STATE/ctl.out" "$STATE/status" "$STATE/qemu.pid"
mkfifo "$STATE/ctl.in" "$STATE/ctl.out"
: > "$STATE/status"

mkdir -p "$WORK/extra/run"
if [ -n "$CMDFILE" ]; then cp "$CMDFILE" "$WORK/extra/run/cmd.sh"; else printf '%s\n' "$CMD" > "$WORK/extra/run/cmd.sh"; fi
for a in ${ADDS[@]+"${ADDS[@]}"}; do
  src=${a%%:*}; dst=${a#*:}; [ "$dst" = "$a" ] && dst=/run/$(basename "$src")
  mkdir -p "$WORK/extra$(dirname "$dst")"; cp -L "$src" "$WORK/extra$dst"
done
for e in ${ENVS[@]+"${ENVS[@]}"}; do
  k=${e%%=*}; v=${e#*=}
  printf "%s='%s'\n" "$k" "$(printf '%s' "$v" | sed "s/'/'\\\\''/g")" >> "$WORK/extra/run/env"
done
(cd "$WORK/extra" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) > "$WORK/extra.cpio"
cat "$BASE" "$WORK/extra.cpio" > "$WORK/initrd"
flock -u 9
exec 9>&-

NETDEV="user,id=n0,net=10.0.2.0/24,host=10.0.2.2,dns=10.0.2.3,restrict=off"
for f in ${FWDS[@]+"${FWDS[@]}"}; do NETDEV="$NETDEV,hostfwd=tcp:127.0.0.1:${f%%:*}-:${f#*:}"; done
APPEND="console=ttyS0,115200 panic=-1 oops=panic rdinit=/init mitigations=off tsc=reliable no_timer_check"
[ "$VERBOSE" = 1 ] || APPEND="$APPEND quiet"

say "accel=$ACCEL mem=$MEM smp=$SMP kernel=$KIMG prep=$(awk -v a="$T_PREP" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')s"
T0=$(date +%s.%N)
exec 7>&1; if [ "$QUIET" = 1 ]; then exec 7>/dev/null; fi
echo $$ > "$STATE/vm.pid"
set +e
# QEMU runs under timeout(1) in the background: a SIGTERM to vm.sh reaches it via the trap/cleanup,
# and timeout(1) forwards it to QEMU, which then exits.
{
  timeout -k 5 "$TIMEOUT" qemu-system-x86_64 "${ACCEL_ARGS[@]}" -m "$MEM" -smp "$SMP" \
    -nodefaults -no-user-config -display none -monitor none -no-reboot \
    -kernel "$KIMG" -initrd "$WORK/initrd" -append "$APPEND" \
    -chardev stdio,id=con,signal=off -serial chardev:con \
    -serial "file:$STATE/status" \
    -chardev "pipe,id=ctl,path=$STATE/ctl" -serial chardev:ctl \
    -netdev "$NETDEV" -device virtio-net-pci,netdev=n0 \
    -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
    </dev/null 2>"$WORK/qemu.err" &
  echo $! > "$STATE/qemu.pid"
  wait $!
  echo $? > "$WORK/qrc"
} | stdbuf -o0 tr -d '\r' | tee "$WORK/console.log" | tee -a "${LOGFILE:-/dev/null}" >&7 &
PIPE=$!
QPID=$(n=0; while [ ! -s "$STATE/qemu.pid" ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n+1)); done; cat "$STATE/qemu.pid")
wait "$PIPE"
QPID=""
set -e
T1=$(date +%s.%N)
QRC=$(cat "$WORK/qrc" 2>/dev/null || echo 255)
RC=$(sed -n 's/.*@@STATUS@@ \([0-9]*\).*/\1/p' "$STATE/status" | tail -1)
if [ -z "$RC" ]; then
  # fallback: the console marker (the status port has been seen to lose its last write on a loaded host)
  RC=$(sed -n 's/^@@TRELLIS-VM-DONE@@ rc=\([0-9]*\).*/\1/p' "$WORK/console.log" | tail -1)
  [ -z "$RC" ] || echo "vm.sh: status port empty, using the console marker rc=$RC" >&2
fi
if [ -z "$RC" ] && [ "$QRC" -ge 5 ] && [ "$QRC" -le 255 ] && [ $((QRC & 1)) = 1 ]; then
  RC=$(( (QRC >> 1) - 1 ))   # isa-debug-exit, see finish() in the guest init
  echo "vm.sh: status port and console marker missing, using isa-debug-exit rc=$RC" >&2
fi
[ -s "$WORK/qemu.err" ] && sed 's/^/qemu: /' "$WORK/qemu.err" >&2
WALL=$(awk -v a="$T0" -v b="$T1" 'BEGIN{printf "%.1f", b-a}')
if [ -z "$RC" ]; then
  if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
    RC=124; echo "vm.sh: VM killed after the ${TIMEOUT}s timeout" >&2
  else
    RC=126; echo "vm.sh: guest ended without reporting a status (qemu rc=$QRC)" >&2
  fi
fi
echo >&7; exec 7>&-
echo "vm.sh: accel=$ACCEL wall=${WALL}s rc=$RC" >&2
exit "$RC"
