#!/usr/bin/env bash
# bench/san-study.sh at its smallest (issue 12): on `trellis san`, switched and
# switchless, 4 KiB randread and 128 KiB seqwrite at one QD, alone and beside a
# second tenant on one path, and the same points in `trellis sim`; the JSON
# has every point with its emulated and simulated figures, and the Markdown
# and SVG are written. For breakage only: CI never judges the figures (timing).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "skipped: needs root (network namespaces)"; exit 77; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "skipped: iproute2 missing"; exit 77; }
command -v python3 >/dev/null || { echo "skipped: python3 missing (it runs bench/san_study.py)"; exit 77; }
probe=tsan-probe-$$
if ! ip netns add "$probe" 2>/dev/null; then echo "skipped: cannot create network namespaces here"; exit 77; fi
ip netns del "$probe"
# The namespaces have fixed names (tsan-*): the same lock as 65-san.sh.
lockdir=/run/lock; [ -d "$lockdir" ] && [ -w "$lockdir" ] || lockdir=/tmp
exec 9>"$lockdir/trellis-san-test.lock"
flock 9
out=$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/san-study.XXXXXX")
trap '"$TRELLIS" san --state-dir "$out/state" down >/dev/null 2>&1 || true' EXIT
TRELLIS_SAN_LOCK_HELD=1 TRELLIS="$TRELLIS" bench/san-study.sh --quick --out "$out" >"$out/run.log" 2>&1 \
  || { cat "$out/run.log"; exit 1; }
python3 - "$out/san-study.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["rows"]
keys = {(r["fabric"], r["workload"], r["qd"], r["tenant2"]) for r in rows}
want = {(f, w, 16, t) for f in ("switched", "switchless") for w in ("randread-4k", "seqwrite-128k")
        for t in (False, True)}
assert keys == want, keys ^ want
for r in rows:
    e = r["emu"]
    for k in ("iops", "mb_per_s", "lat_us_avg", "lat_us_p999"):
        assert e[k] > 0, (r["fabric"], r["workload"], r["tenant2"], k, e[k])
    # trellis sim reports per direction: a read beside the tenant's reads has no sim figure.
    if r["workload"] == "randread-4k" and r["tenant2"]:
        assert r["sim"] is None, r
    else:
        assert all(r["sim"][k] > 0 for k in ("iops", "mb_per_s", "lat_us_avg", "lat_us_p999")), r
sl = [r for r in rows if r["fabric"] == "switchless"]
assert all(len(r["emu"]["paths_ios_rep0"]) == 4 for r in sl), "switchless runs use the 4 paths"
print(f"san-study.json: {len(rows)} points, emulated and simulated")
PY
test -s "$out/san-study.svg"
grep -q "switchless vs switched" "$out/san-study.md"
cat "$out/san-study.md"
ip netns list | grep -q '^tsan-' && { echo "FAIL: namespaces left after the study"; ip netns list; exit 1; }
echo "san study (quick): ok"
