#!/usr/bin/env bash
# Builds the Trellis fio ioengine, trellis-fio.so (docs/fio.md).
#
# An external fio engine reads fio's own structures (thread_data, io_u,
# fio_file), so it must be compiled against the headers of the very fio
# version that will load it. This script therefore:
#   1. reads the installed fio's Debian package version (dpkg), or uses the
#      configured source tree in FIO_SRC;
#   2. otherwise downloads that version's Debian source package (apt-get
#      source, from a private deb-src list: the system's apt sources are not
#      touched) into a cache and runs fio's ./configure for config-host.h
#      (fio itself is not built);
#   3. builds the static library of crates/app/fio (release) and compiles
#      crates/app/fio/c/engine.c against the headers, linked into one .so.
#
#   scripts/build-fio-engine.sh [OUT_DIR]      (default target/release)
# Env: FIO_SRC (a configured fio source tree; skips 1-2), TRELLIS_FIO_CACHE
# (download cache, default ~/.cache/trellis/fio), CARGO_TARGET_DIR.
# Prints the path of the engine on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${CARGO_TARGET_DIR:-target}/release}
say() { echo "build-fio-engine: $*" >&2; }
die() { say "$*"; exit 1; }

fio_source() {
  if [ -n "${FIO_SRC:-}" ]; then
    [ -f "$FIO_SRC/config-host.h" ] || die "FIO_SRC=$FIO_SRC has no config-host.h: run ./configure there first"
    echo "$FIO_SRC"; return
  fi
  command -v fio >/dev/null || die "fio is not installed: apt-get install fio (the engine must match the fio that loads it)"
  local ver upstream cache dir
  ver=$(dpkg-query -W -f='${Version}' fio 2>/dev/null) ||
    die "fio is not a Debian package here: set FIO_SRC to the configured source of $(fio --version)"
  upstream=${ver%%-*}; upstream=${upstream#*:}
  cache=${TRELLIS_FIO_CACHE:-$HOME/.cache/trellis/fio}
  dir=$cache/fio-$upstream
  mkdir -p "$cache"
  # Two builds at once (two test runs) must not unpack into one tree together.
  exec 9>"$cache/.lock"
  flock -w 600 9 || die "another build has held $cache/.lock for 600 s"
  if [ ! -f "$dir/config-host.h" ]; then
    command -v dpkg-source >/dev/null || die "dpkg-source missing: apt-get install dpkg-dev"
    mkdir -p "$cache/apt/lists/partial" "$cache/apt/parts"
    # A private deb-src list for the release this machine runs.
    . /etc/os-release
    cat >"$cache/apt/parts/src.sources" <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: ${VERSION_CODENAME:-bookworm}
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    local apt=(apt-get -q -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$cache/apt/parts"
               -o "Dir::State::Lists=$cache/apt/lists" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
    say "fetching the Debian source of fio $ver (headers only are used)"
    "${apt[@]}" update >/dev/null || die "apt-get update of the deb-src list failed"
    (cd "$cache" && "${apt[@]}" source --download-only "fio=$ver" >/dev/null 2>&1) ||
      die "apt-get source fio=$ver failed (is deb.debian.org reachable?)"
    rm -rf "$dir"
    # --no-check: apt-get source already checked each file against the hashes in
    # the signed Release and Sources indexes; the .dsc's own signature needs a
    # Debian developer keyring this machine does not have.
    (cd "$cache" && dpkg-source --no-check -x "fio_${ver#*:}.dsc" "$dir" >/dev/null) ||
      die "unpacking fio_${ver}.dsc failed"
    say "configuring fio $upstream for config-host.h"
    (cd "$dir" && ./configure >/dev/null) || die "fio's ./configure failed in $dir"
  fi
  exec 9>&-
  echo "$dir"
}

src=$(fio_source)
cargo build --release -q -p trellis-fio
lib=${CARGO_TARGET_DIR:-target}/release/libtrellis_fio.a
[ -f "$lib" ] || die "cargo did not produce $lib"
mkdir -p "$out"
# fio's own compile flags for engines (its Makefile and engines/skeleton_external.c);
# --exclude-libs keeps the Rust library's symbols out of fio's namespace.
gcc -O2 -g -Wall -fPIC -shared -D_GNU_SOURCE -D_LARGEFILE_SOURCE -D_FILE_OFFSET_BITS=64 \
  -include "$src/config-host.h" -I "$src" -I crates/app/fio/c \
  crates/app/fio/c/engine.c "$lib" -Wl,--exclude-libs,ALL \
  -lpthread -ldl -lm -lgcc_s -lc -o "$out/trellis-fio.so"
echo "$out/trellis-fio.so"
