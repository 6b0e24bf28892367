# TCP ports for test targets, safe when several test runs share one machine (sourced, not run).
#
# free_port [IGNORED]  prints a port on 127.0.0.1 that nothing listens on and that no other
#   cooperating run has reserved. Ports are drawn at random from $TRELLIS_PORT_RANGE (default
#   20000-32767: below Linux's default ephemeral range, so no outgoing connection can be holding
#   one) and reserved by an atomic mkdir of $TRELLIS_PORT_DIR/PORT holding the owner's PID
#   ($TRELLIS_PORT_OWNER, default: the calling script's $$). A reservation whose owner has
#   exited is taken over, so a run that crashed leaks nothing for long. The argument (the old
#   "first free port from N") is accepted and ignored.
# release_ports [OWNER]  drops the reservations of OWNER (default: $TRELLIS_PORT_OWNER or $$).
#
# Env: TRELLIS_PORT_RANGE ("LOW-HIGH"), TRELLIS_PORT_DIR (default /tmp/trellis-ports-UID; not
# under $TMPDIR, which scripts/test.sh makes private to one run), TRELLIS_PORT_TRIES (default 500).

_port_dir() { echo "${TRELLIS_PORT_DIR:-/tmp/trellis-ports-$(id -u)}"; }

# 0 if some process listens on 127.0.0.1:$1
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() {
    local range=${TRELLIS_PORT_RANGE:-20000-32767} tries=${TRELLIS_PORT_TRIES:-500}
    local owner=${TRELLIS_PORT_OWNER:-$$} dir lo hi p i o
    lo=${range%-*} hi=${range#*-}
    case "$lo$hi" in *[!0-9]*|"") echo "free_port: TRELLIS_PORT_RANGE=$range is not LOW-HIGH" >&2; return 1;; esac
    [ "$lo" -ge 1 ] && [ "$hi" -le 65535 ] && [ "$lo" -le "$hi" ] ||
        { echo "free_port: TRELLIS_PORT_RANGE=$range needs 1 <= LOW <= HIGH <= 65535" >&2; return 1; }
    dir=$(_port_dir)
    mkdir -p "$dir" || { echo "free_port: cannot create $dir" >&2; return 1; }
    for ((i = 0; i < tries; i++)); do
        p=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo + 1)))
        if ! mkdir "$dir/$p" 2>/dev/null; then
            # Reserved: take it over only if its owner is gone. The rename is atomic, so of
            # two runs that both see a stale reservation only one removes it.
            o=$(cat "$dir/$p/owner" 2>/dev/null) || continue
            [ -n "$o" ] && [ ! -d "/proc/$o" ] || continue
            mv "$dir/$p" "$dir/$p.stale.$$" 2>/dev/null || continue
            rm -rf "$dir/$p.stale.$$"
            mkdir "$dir/$p" 2>/dev/null || continue
        fi
        echo "$owner" >"$dir/$p/owner"
        if port_in_use "$p"; then continue; fi   # someone else's listener: keep it reserved, skip it
        echo "$p"
        return 0
    done
    echo "free_port: no free port in $range after $tries tries (reservations in $dir)" >&2
    return 1
}

release_ports() {
    local owner=${1:-${TRELLIS_PORT_OWNER:-$$}} dir d
    dir=$(_port_dir)
    for d in "$dir"/*/; do
        [ -f "$d/owner" ] && [ "$(cat "$d/owner" 2>/dev/null)" = "$owner" ] && rm -rf "$d"
    done
    return 0
}
