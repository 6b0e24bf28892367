#!/usr/bin/env bash
# bench/credits.sh --quick: three tenants overload a Gimbal namespace on the
# emulated SSD without and with `trellis bench --credits`; credits.json has
# both modes, every tenant got credits in the credits mode and none in the
# plain one, and no I/O failed. For breakage only: CI never judges the
# figures (timing).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v python3 >/dev/null || { echo "skipped: python3 missing (it runs bench/credits.py)"; exit 77; }
out=$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/credits.XXXXXX")
TRELLIS="$TRELLIS" bench/credits.sh --quick --out "$out" >"$out/run.log" 2>&1 || { cat "$out/run.log"; exit 1; }
python3 - "$out/credits.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for mode in ("plain", "credits"):
    m = d["modes"][mode]
    assert len(m["tenants"]) == 3, mode
    assert m["total_mb_per_s"] > 0, mode
    for name, t in m["tenants"].items():
        assert t["errors"] == 0, (mode, name, t)
        got = t["io_credits_last"]
        assert (got is not None and got > 0) if mode == "credits" else got is None, (mode, name, got)
for k in ("p999_cut", "throughput_loss", "checks"):
    assert k in d, k
print("credits.json: both modes, 3 tenants, credits only where asked, no errors")
PY
cat "$out/credits.md"
