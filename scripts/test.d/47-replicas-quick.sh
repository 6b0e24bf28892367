#!/usr/bin/env bash
# bench/replicas.sh --quick: a volume replicated on two Gimbal drives, one made
# busy by a second tenant; the app's reads by round-robin and by headroom.
# replicas.json has both modes, headroom reads the busy replica less than
# round-robin's half, and no I/O failed. For breakage only: CI never judges
# the latency figures (timing).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v python3 >/dev/null || { echo "skipped: python3 missing (it runs bench/replicas.py)"; exit 77; }
out=$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/replicas.XXXXXX")
TRELLIS="$TRELLIS" bench/replicas.sh --quick --out "$out" >"$out/run.log" 2>&1 || { cat "$out/run.log"; exit 1; }
python3 - "$out/replicas.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rr, hd = d["modes"]["round-robin"], d["modes"]["headroom"]
for name, m in (("round-robin", rr), ("headroom", hd)):
    assert m["errors"] == 0, (name, m)
    assert m["app_mb_per_s"] > 0 and m["noisy_mb_per_s"] > 0, (name, m)
assert abs(rr["app_reads_on_b_share"] - 0.5) < 0.01, rr
assert hd["app_reads_on_b_share"] < 0.4, hd
for k in ("p999_cut", "checks"):
    assert k in d, k
print("replicas.json: both modes, round-robin splits reads evenly, headroom avoids the busy replica, no errors")
PY
cat "$out/replicas.md"
