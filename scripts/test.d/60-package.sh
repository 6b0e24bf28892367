#!/usr/bin/env bash
# The Debian package (cargo deb -p trellis-cli): builds it, checks its control
# data and contents, verifies the systemd unit (systemd-analyze, when present),
# then runs the packaged binary on the packaged configuration as the unit
# would (--check, start, a verified bench, SIGTERM, clean exit). The package is
# unpacked into a private directory, not installed: two test runs at once
# must not fight over /usr/bin or ports 4420/8009/9464, so the configuration's
# state path and ports are rewritten (tests/port-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench-lib.sh
command -v dpkg-deb >/dev/null || { echo "skipped: dpkg-deb missing (not a Debian system)"; exit 77; }
if ! command -v cargo-deb >/dev/null 2>&1; then
  lock=${CARGO_HOME:-$HOME/.cargo}/.trellis-cargo-deb-install.lock
  mkdir -p "$(dirname "$lock")"
  exec 8>"$lock"
  flock -w 1800 8 || { echo "60-package.sh: another run has held $lock for 1800 s" >&2; exit 1; }
  if ! command -v cargo-deb >/dev/null 2>&1; then
    echo "60-package.sh: installing cargo-deb (needed to build the Debian package; cargo install --locked into ${CARGO_HOME:-$HOME/.cargo}/bin)"
    cargo install cargo-deb --locked --quiet
  fi
  exec 8>&-
fi
work=$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/package.XXXXXX")
cargo deb -p trellis-cli --output "$work/deb" --quiet
deb=$(ls "$work"/deb/trellis_*.deb)
echo "built $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)"
dpkg-deb -f "$deb" Package | grep -qx trellis
dpkg-deb -I "$deb" conffiles | grep -qx /etc/trellis/target.toml
for f in ./usr/bin/trellis ./lib/systemd/system/trellis-target.service ./etc/trellis/target.toml \
         ./usr/share/trellis/grafana/trellis-target.json ./usr/share/doc/trellis/README.md; do
  dpkg-deb -c "$deb" | awk '{print $NF}' | grep -qx "$f" || { echo "package lacks $f" >&2; exit 1; }
done
# The configuration holds keys once an operator adds them: owner-only.
dpkg-deb -c "$deb" | awk '$NF == "./etc/trellis/target.toml" {print $1}' | grep -qx -- '-rw-------' \
  || { echo "package installs /etc/trellis/target.toml with another mode than 0600" >&2; exit 1; }
root=$work/root
dpkg-deb -x "$deb" "$root"
bin=$root/usr/bin/trellis
"$bin" --version
unit=$work/trellis-target.service
sed -e "s|/usr/bin/trellis|$bin|g; s|/etc/trellis/target.toml|$work/target.toml|g" \
  "$root/lib/systemd/system/trellis-target.service" >"$unit"
if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify "$unit"
  echo "systemd-analyze verify: the unit is valid"
else
  echo "systemd-analyze missing: unit not verified"
fi
io=$(free_port) disc=$(free_port) met=$(free_port)
mkdir -p "$work/state"   # what the unit's StateDirectory= creates
sed -e "s|/var/lib/trellis|$work/state|; s|127.0.0.1:4420|127.0.0.1:$io|; s|127.0.0.1:8009|127.0.0.1:$disc|; s|127.0.0.1:9464|127.0.0.1:$met|" \
  "$root/etc/trellis/target.toml" >"$work/target.toml"
grep -q "$work/state/disk0.img" "$work/target.toml"
"$bin" target --config "$work/target.toml" --check >/dev/null
[ -z "$("$bin" target --config "$work/target.toml" --check --quiet)" ] \
  || { echo "target --check --quiet (the unit's ExecStartPre) printed the configuration" >&2; exit 1; }
STATE_DIRECTORY=$work/state "$bin" target --config "$work/target.toml" >"$work/target.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; release_ports' EXIT
wait_port "$io" 30
"$bin" bench --addr "127.0.0.1:$io" --rw randrw --bs 4k --iodepth 8 --size 16m --verify --runtime 1 --no_progress | tail -3
kill -TERM $pid
rc=0; wait $pid || rc=$?
[ "$rc" = 0 ] || { echo "the packaged target exited $rc on SIGTERM:" >&2; tail -20 "$work/target.log" >&2; exit 1; }
size=$(stat -c %s "$work/state/disk0.img")
[ "$size" = $((1 << 30)) ] || { echo "disk0.img is $size bytes, want 1 GiB" >&2; exit 1; }
echo "package: control, contents, unit and default configuration ok; the packaged target served a verified bench and stopped cleanly on SIGTERM"
