# Installing host packages for the tests, safe when several test runs share one machine
# (sourced, not run; used by .ci/run, scripts/test.sh and tests/linux-vm/vm.sh).
#
# can_install        0 if we are root or have passwordless sudo (apt-get can run)
# as_root CMD...     CMD as root (directly or with sudo -n); status 1 if neither is possible
# apt_get ARGS...    apt-get as root, one at a time: our own flock on $TRELLIS_APT_LOCK (concurrent
#                    test runs queue there) and dpkg's own lock timeout (any other apt user)
# apt_install PKG... installs PKGs quietly; runs `apt-get update` once and retries if the first
#                    attempt fails (a fresh machine has no package lists)
# apt_install_for WHY PKG...
#                    installs the PKGs that are not installed, printing one line per package
#                    ("<prog>: installing PKG (needed for WHY)")
#
# Env: TRELLIS_APT_LOCK_TIMEOUT (seconds to wait for either lock, default 900),
# TRELLIS_APT_LOCK (default /var/lock/trellis-apt.lock), APT_LIB_PROG (the name in messages).

can_install() {
    [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }
}

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo -n "$@"
    else return 1; fi
}

apt_get() {
    local t=${TRELLIS_APT_LOCK_TIMEOUT:-900}
    as_root env DEBIAN_FRONTEND=noninteractive \
        flock -w "$t" "${TRELLIS_APT_LOCK:-/var/lock/trellis-apt.lock}" \
        apt-get -o DPkg::Lock::Timeout="$t" "$@"
}

pkg_installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

apt_install_for() {
    local why=$1 p need=(); shift
    for p in "$@"; do pkg_installed "$p" || need+=("$p"); done
    [ ${#need[@]} -gt 0 ] || return 0
    for p in "${need[@]}"; do echo "${APT_LIB_PROG:-test.sh}: installing $p (needed for $why)" >&2; done
    apt_install "${need[@]}"
}

apt_install() {
    can_install || { echo "${APT_LIB_PROG:-test.sh}: cannot install $*: not root and no passwordless sudo" >&2; return 1; }
    apt_get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 ||
        { apt_get update -qq >/dev/null 2>&1 || echo "${APT_LIB_PROG:-test.sh}: apt-get update failed; trying the cached lists" >&2
          apt_get install -y -qq --no-install-recommends "$@" >/dev/null; } ||
        { echo "${APT_LIB_PROG:-test.sh}: apt-get install $* failed" >&2; return 1; }
}
