#!/usr/bin/env python3
"""The emulated SAN beside the simulator (issue 12): the same 4-node testbed,
switched (one client link) and switchless (2x2 torus, 4 client ports, ISR),
4 KiB random reads from the client to one storage node at a sweep of queue
depths, run for real on `trellis san` (emulated pm9a3-gen4 drive, one per
node) and in `trellis sim` with the emulator's parameters:

- link rate: --rate on every link (sim: host_gbps per client port, node_gbps
  = rate x ports, split over them);
- per-hop cost: a forwarding namespace adds ~4.5 µs of round trip on this VM
  and the bridge ~2.5 µs (docs/san.md), so adapter_hop_ns = 4,500 (half per
  direction) and switch_hop_ns = 1,250 per direction;
- drive: one pm9a3-gen4, clean, per node; no Gimbal, credits or reservation
  (the SAN's targets run without QoS); ISR on in the switchless case.

Writes san-sim.json and san-sim.md to --out; rows where the two differ by more
than 30 % are marked, and docs/san.md says why.
"""
import argparse
import json
import os
import subprocess
import sys

NQN = "nqn.2026-11.io.trellis:default"
TARGET = 3
QDS = [1, 4, 16, 64]
GAP = 0.30


def args():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--runtime", type=float, required=True)
    p.add_argument("--rate-gbit", type=int, default=1)
    p.add_argument("--qds", default=",".join(map(str, QDS)))
    return p.parse_args()


def sh(cmd, check=True):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        sys.exit(f"san_sim: {' '.join(cmd)} failed:\n{r.stdout[-3000:]}")
    return r


def emulated(a, topo, qds):
    st = os.path.join(a.out, "state")
    san = [a.bin, "san", "--state-dir", st]
    sh(san + ["up", topo, "--rate", f"{a.rate_gbit}gbit", "--backend", "emulated", "--size-mib", "256"])
    rows = {}
    try:
        for qd in qds:
            if topo == "switched":
                where = ["--addr", f"10.81.1.{TARGET + 1}:4420"]
            else:
                paths = ",".join(f"10.83.{k}.{TARGET + 1}:4420" for k in range(4))
                where = ["--paths", paths, "--path-policy", "isr"]
            out = os.path.join(a.out, f"san-{topo}-qd{qd}.json")
            sh(san + ["exec", "h0", "--", a.bin, "bench", *where, "--nqn", NQN, "--rw", "randread",
                      "--bs", "4k", "--iodepth", str(qd), "--runtime", f"{a.runtime}s", "--ramp_time", "1s",
                      "--no_progress", "--json", out, "--log", "warn"])
            j = json.load(open(out))["jobs"][0]
            rows[qd] = {"kiops": j["iops"] / 1000, "lat_avg_us": j["lat_us_mean"],
                        "lat_p999_us": j["lat_us_p99_9"]}
    finally:
        sh(san + ["down"], check=False)
    return rows


def simulated(a, topo, qds):
    preset = "testbed-switched" if topo == "switched" else "testbed-switchless"
    base = sh([a.bin, "sim", "config", preset]).stdout
    import tomllib
    cfg = tomllib.loads(base)
    t = cfg["topology"]
    t["host_gbps"] = a.rate_gbit
    if topo == "switched":
        t["uplinks"] = 1
        t["node_gbps"] = a.rate_gbit
        t["host_ports"] = 1
    else:
        t["node_gbps"] = 4 * a.rate_gbit
        t["host_ports"] = 4
    t["adapter_hop_ns"] = 4500
    t["switch_hop_ns"] = 1250
    cfg["ssd"]["per_node"] = 1
    cfg["mechanisms"] = {"isr": topo != "switched", "reservation": False, "credits": False, "gimbal": False}
    rows = {}
    for qd in qds:
        job = cfg["workload"]["jobs"][0]
        job["qd"] = qd
        job["targets"] = {"one": TARGET}
        path = os.path.join(a.out, f"sim-{topo}-qd{qd}.json")
        json.dump(cfg, open(path, "w"))
        out = os.path.join(a.out, f"sim-{topo}-qd{qd}")
        sh([a.bin, "sim", "run", "--config", path, "--out", out, "--duration-ms", "200", "--no-progress",
            "--log", "warn"])
        r = json.load(open(os.path.join(out, "results.json")))["read"]
        rows[qd] = {"kiops": r["kiops"], "lat_avg_us": r["lat_avg_us"], "lat_p999_us": r["lat_p999_us"]}
    return rows


def main():
    a = args()
    os.makedirs(a.out, exist_ok=True)
    qds = [int(q) for q in a.qds.split(",")]
    doc = {"rate_gbit": a.rate_gbit, "runtime_s": a.runtime, "target": f"st{TARGET}", "rows": []}
    for topo in ("switched", "torus2d"):
        em = emulated(a, topo, qds)
        si = simulated(a, topo, qds)
        for qd in qds:
            row = {"topology": topo, "qd": qd, "emulated": em[qd], "simulated": si[qd], "ratio": {}}
            for k in ("kiops", "lat_avg_us", "lat_p999_us"):
                s = si[qd][k]
                row["ratio"][k] = em[qd][k] / s if s else None
            doc["rows"].append(row)
    json.dump(doc, open(os.path.join(a.out, "san-sim.json"), "w"), indent=2)
    lines = [f"# Emulated SAN vs simulator (4 KiB randread to st{TARGET}, links {a.rate_gbit} Gbit/s, "
             f"{a.runtime} s runs; emulated / simulated; * = differ by more than {GAP:.0%})", "",
             "| topology | QD | kIOPS emu / sim | avg µs emu / sim | p99.9 µs emu / sim |",
             "|---|---|---|---|---|"]
    for r in doc["rows"]:
        cells = []
        for k, f in (("kiops", "{:.1f}"), ("lat_avg_us", "{:.0f}"), ("lat_p999_us", "{:.0f}")):
            ratio = r["ratio"][k]
            mark = "*" if ratio is None or abs(ratio - 1) > GAP else ""
            cells.append(f"{f.format(r['emulated'][k])} / {f.format(r['simulated'][k])}{mark}")
        lines.append(f"| {r['topology']} | {r['qd']} | " + " | ".join(cells) + " |")
    md = "\n".join(lines) + "\n"
    open(os.path.join(a.out, "san-sim.md"), "w").write(md)
    print(md)


if __name__ == "__main__":
    main()
