#!/usr/bin/env bash
# trellis san (issue 12): both 4-node topologies come up, a verified bench
# runs through them from the client namespace (over the torus: all 4 paths of
# one storage node, with one link taken down and brought back mid-run: no
# error, no verify failure), and `down` leaves no namespace of ours behind.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "skipped: needs root (network namespaces)"; exit 77; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "skipped: iproute2 missing"; exit 77; }
command -v python3 >/dev/null || { echo "skipped: python3 missing (it checks the JSON)"; exit 77; }
# A container without CAP_SYS_ADMIN cannot make namespaces: say so, do not fail.
probe=tsan-probe-$$
if ! ip netns add "$probe" 2>/dev/null; then echo "skipped: cannot create network namespaces here"; exit 77; fi
ip netns del "$probe"
# The namespaces have fixed names (tsan-*): two test runs at once take turns.
# A fixed lock path: each test run has its own TMPDIR.
lockdir=/run/lock; [ -d "$lockdir" ] && [ -w "$lockdir" ] || lockdir=/tmp
exec 9>"$lockdir/trellis-san-test.lock"
flock 9
dir=$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/san.XXXXXX")
san() { "$TRELLIS" san --state-dir "$dir/state" "$@"; }
trap 'san down >/dev/null 2>&1 || true' EXIT
nqn=nqn.2026-11.io.trellis:default

san up switched --backend ram --size-mib 64
san exec h0 -- "$TRELLIS" bench --addr 10.81.1.2:4420 --nqn "$nqn" --runtime 1 --rw randrw \
  --bs 4k --iodepth 8 --verify --no-progress --json "$dir/switched.json"
san down
ip netns list | grep -q '^tsan-' && { echo "FAIL: namespaces left after down"; ip netns list; exit 1; }

san up torus2d --backend ram --size-mib 64
paths=10.83.0.4:4420,10.83.1.4:4420,10.83.2.4:4420,10.83.3.4:4420
san exec h0 -- "$TRELLIS" bench --paths "$paths" --nqn "$nqn" --runtime 4 --rw randrw \
  --bs 4k --iodepth 16 --verify --no-progress --cmd-timeout-ms 500 --json "$dir/torus.json" &
bench=$!
sleep 2
# st3's direct link to the client carries path 0.
san link h0 st3 down
sleep 1
san link h0 st3 up
wait "$bench"
python3 - "$dir/torus.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
j = d["jobs"][0]
assert j["errors"] == 0 and j["verify_failures"] == 0, j
paths = j["paths"]
assert len(paths) == 4 and all(p["ios"] > 0 for p in paths), paths
assert j["path_failures"] >= 1, "the link went down under load but no path failed"
print(f"torus: 4 paths, {j['path_failures']} path failure(s), {j['path_retries']} re-sent, 0 errors, verify clean;",
      "per path:", [(p["addr"], p["ios"], p["reconnects"]) for p in paths])
PY

# A path down when the run starts: the run starts on the other three, and
# uses the fourth once its link comes up.
san link h0 st3 down
san exec h0 -- "$TRELLIS" bench --paths "$paths" --nqn "$nqn" --runtime 3 --rw randrw \
  --bs 4k --iodepth 16 --verify --no-progress --cmd-timeout-ms 500 --json "$dir/late.json" &
bench=$!
sleep 1.5
san link h0 st3 up
wait "$bench"
python3 - "$dir/late.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
assert j["errors"] == 0 and j["verify_failures"] == 0, j
p0 = j["paths"][0]
assert p0["reconnects"] >= 1 and p0["ios"] > 0, p0
print(f"path down at the start: opened once its link came up, then carried {p0['ios']} I/Os; 0 errors")
PY
san down
ip netns list | grep -q '^tsan-' && { echo "FAIL: namespaces left after down"; ip netns list; exit 1; }
echo "san: switched and torus2d up, verified I/O, a link failure with 0 errors, down clean"

# The path-choice study at its smallest (bench/san.sh): a second tenant on one
# path; single path, round-robin and ISR all run and write their figures.
# For breakage only: CI never judges the figures (timing).
TRELLIS="$TRELLIS" bench/san.sh --quick --runtime 1 --out "$dir/study" >"$dir/study.log" 2>&1 \
  || { cat "$dir/study.log"; exit 1; }
python3 - "$dir/study/san.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for m in ("single", "round-robin", "isr"):
    x = d["modes"][m]
    assert x["iops"] > 0 and x["lat_us_p99_9"] > 0 and x["errors"] == 0, (m, x)
assert d["modes"]["single"]["share_on_loaded_path"] == 1.0
assert len(d["checks"]) == 3
print("san.json: single, round-robin and isr ran with no errors")
PY
cat "$dir/study/san.md"
ip netns list | grep -q '^tsan-' && { echo "FAIL: namespaces left after the study"; ip netns list; exit 1; }
echo "san study: ok"
