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


def client_where(topo):
    """`trellis bench` arguments that reach st<TARGET> from h0: the switched
    SAN's one path, or the torus's 4 paths with ISR."""
    if topo == "switched":
        return ["--addr", f"10.81.1.{TARGET + 1}:4420"]
    paths = ",".join(f"10.83.{k}.{TARGET + 1}:4420" for k in range(4))
    return ["--paths", paths, "--path-policy", "isr"]


def emu_bench(a, topo, qd, tag, rw="randread", bs="4k", extra=()):
    """One `trellis bench` run from h0 on the SAN that is up (extra: more
    bench arguments); its JSON is --out/san-TAG.json; returns its job."""
    san = [a.bin, "san", "--state-dir", os.path.join(a.out, "state")]
    out = os.path.join(a.out, f"san-{tag}.json")
    sh(san + ["exec", "h0", "--", a.bin, "bench", *client_where(topo), "--nqn", NQN, "--rw", rw,
              "--bs", bs, "--iodepth", str(qd), "--runtime", f"{a.runtime}s", "--ramp_time", "1s",
              "--no_progress", "--json", out, "--log", "warn", *extra])
    return json.load(open(out))["jobs"][0]


def emulated(a, topo, qds):
    st = os.path.join(a.out, "state")
    san = [a.bin, "san", "--state-dir", st]
    sh(san + ["up", topo, "--rate", f"{a.rate_gbit}gbit", "--backend", "emulated", "--size-mib", "256"])
    rows = {}
    try:
        for qd in qds:
            j = emu_bench(a, topo, qd, f"{topo}-qd{qd}")
            rows[qd] = {"kiops": j["iops"] / 1000, "lat_avg_us": j["lat_us_mean"],
                        "lat_p999_us": j["lat_us_p99_9"]}
    finally:
        sh(san + ["down"], check=False)
    return rows


def sim_config(a, topo):
    """`trellis sim`'s testbed preset with the emulated SAN's parameters (see
    the module doc): a dict to edit and pass to sim_run."""
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
    return cfg


def sim_run(a, cfg, tag, duration_ms=200):
    """Runs cfg as --out/sim-TAG; returns its results.json."""
    path = os.path.join(a.out, f"sim-{tag}.json")
    json.dump(cfg, open(path, "w"))
    out = os.path.join(a.out, f"sim-{tag}")
    sh([a.bin, "sim", "run", "--config", path, "--out", out, "--duration-ms", str(duration_ms), "--no-progress",
        "--log", "warn"])
    return json.load(open(os.path.join(out, "results.json")))


def simulated(a, topo, qds):
    cfg = sim_config(a, topo)
    rows = {}
    for qd in qds:
        job = cfg["workload"]["jobs"][0]
        job["qd"] = qd
        job["targets"] = {"one": TARGET}
        r = sim_run(a, cfg, f"{topo}-qd{qd}")["read"]
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
