#!/usr/bin/env bash
# `trellis sim reproduce nsdi26 --quick`: the whole preset runs, and
# nsdi26.json carries a row with a numeric paper and Trellis value and a unit
# for every id the study's comparison needs (issue: machine-readable output).
# Figures are not judged here (the determinism test is in cargo test).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v python3 >/dev/null || { echo "skipped: python3 missing (it checks nsdi26.json)"; exit 77; }
out=$(mktemp -d "${TRELLIS_TEST_DIR:-${TMPDIR:-/tmp}}/reproduce.XXXXXX")
"$TRELLIS" sim reproduce nsdi26 --quick --out "$out" >"$out/run.log" 2>&1 || { cat "$out/run.log"; exit 1; }
python3 - "$out/nsdi26.json" <<'PY'
import json, sys
rows = {r["id"]: r for r in json.load(open(sys.argv[1]))["rows"]}
need = ["t4.randread4k.clean", "t4.randread4k.frag", "t4.seqwrite128k.clean", "t4.seqwrite128k.frag",
        "ycsb.thpt_ratio", "ycsb.read_avg", "ycsb.read_p999", "capex20.saving",
        "fail.torus3d.4k.drop", "fail.torus3d.mixed.drop"]
for i in need:
    r = rows[i]
    assert isinstance(r["paper"], (int, float)) and isinstance(r["trellis"], (int, float)), r
    assert r["unit"] in ("%", "x"), r
sens = [i for i in rows if i.startswith("sens.")]
assert len(sens) >= 7 and all(isinstance(rows[i]["trellis"], (int, float)) for i in sens), sens
print(f"nsdi26.json: {len(rows)} rows, the {len(need)} required ids numeric, {len(sens)} sensitivity rows")
PY
cat "$out/table.txt"
# `trellis sim fairness`: the CLI runs a case in both modes and fairness.json has its fields.
"$TRELLIS" sim fairness --case intensity --runtime-ms 20 --ramp-ms 5 --out "$out/fairness" >"$out/fairness.log" 2>&1 ||
  { cat "$out/fairness.log"; exit 1; }
python3 - "$out/fairness/fairness.json" <<'PY'
import json, sys
modes = json.load(open(sys.argv[1]))
assert [m["mode"] for m in modes] == ["off", "gimbal"], modes
for m in modes:
    assert m["case"] == "intensity" and isinstance(m["utilisation"], float), m
    assert [t["name"] for t in m["tenants"]] == ["deep", "shallow"], m
    for t in m["tenants"]:
        assert t["mb_per_s"] > 0 and t["standalone_mb_per_s"] > 0 and t["lat_us_p999"] > 0, t
print("sim fairness: both modes, both tenants, fields present")
PY
