#!/usr/bin/env bash
# bench/fairness.sh --quick: every interference case runs with QoS off and
# Gimbal on the emulated SSD, and fairness.json carries every field the
# issue names. For breakage only: CI never judges the figures (timing).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v python3 >/dev/null || { echo "skipped: python3 missing (it runs bench/fairness.py)"; exit 77; }
out=$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/fairness.XXXXXX")
TRELLIS="$TRELLIS" bench/fairness.sh --quick --out "$out" >"$out/run.log" 2>&1 || { cat "$out/run.log"; exit 1; }
python3 - "$out/fairness.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for case in ("intensity", "size", "pattern_rand", "pattern_seq"):
    c = d["cases"][case]
    for mode in ("off", "gimbal"):
        m = c[mode]
        assert set(m["f_util"]) == {"min", "mean"}, (case, mode)
        assert len(m["tenants"]) == 2, (case, mode)
        for t in m["tenants"]:
            for k in ("name", "weight", "mb_per_s", "lat_us_p999", "standalone_mb_per_s", "f", "share"):
                assert k in t, (case, mode, k)
            assert isinstance(t["errors"], int), (case, mode, t["name"])
            assert t["standalone_mb_per_s"] > 0, (case, mode, t["name"])
    assert c["checks"], case
print("fairness.json: 4 cases x 2 modes, every field present")
PY
cat "$out/fairness.md"
