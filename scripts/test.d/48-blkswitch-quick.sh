#!/usr/bin/env bash
# bench/blkswitch.sh at its smallest: an L-app beside two T-apps with
# `--stack plain` and `--stack blk-switch`, alone and together; the JSON has
# both stacks, every figure, the switch's counters and the L-app's CDFs.
# For breakage only: CI never judges the figures (timing).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v python3 >/dev/null || { echo "skipped: python3 missing (it runs bench/blkswitch.py)"; exit 77; }
out=$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/blkswitch.XXXXXX")
TRELLIS="$TRELLIS" bench/blkswitch.sh --quick --reps 1 --runtime 1 --out "$out" >"$out/run.log" 2>&1 \
  || { cat "$out/run.log"; exit 1; }
python3 - "$out/blkswitch.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for st in ("plain", "blk-switch"):
    x = d["stacks"][st]
    for k in ("l_alone_lat_us_p99", "l_together_lat_us_p99", "t_alone_mb_per_s", "t_together_mb_per_s"):
        assert x[k] > 0, (st, k, x[k])
    assert 0 < x["target_busy_t_alone"] <= 1.05, x["target_busy_t_alone"]
assert d["switch"]["caravans"] > 0 and d["switch"]["cores"] == 1, d["switch"]
assert len(d["l_cdf_us"]) == 4 and all(len(v) == 26 for v in d["l_cdf_us"].values())
assert len(d["checks"]) == 4
print("blkswitch.json: both stacks, every figure, switch counters, 4 CDFs")
PY
test -s "$out/blkswitch-cdf.svg"
cat "$out/blkswitch.md"
