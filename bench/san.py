#!/usr/bin/env python3
"""Path choice on the emulated switchless SAN (issue 12): a second tenant loads
one path, and the measured tenant reads over the four paths with ISR or
round-robin, or over the single direct path.

`trellis san up torus2d` (2x2 torus, client with one port to each storage
node, links shaped to --rate); both tenants run in the client namespace h0
against st3. The noisy tenant streams 128 KiB sequential reads over st3's
direct link (path 0, the client's shortest). The measured tenant does 4 KiB
random reads at --iodepth over:
  - single: path 0 only (what a host without multipath would use),
  - round-robin: all 4 paths in turn,
  - isr: all 4 paths, ISR's least expected delay (docs/isr.md).
The three alternate their order over --reps repetitions; medians of p50,
p99.9 and IOPS. Writes san.json, san.md and san-cdf.svg to --out.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import blkswitch as bx  # noqa: E402  (svg_cdf)

NQN = "nqn.2026-11.io.trellis:default"
TARGET = "st3"
PATHS = [f"10.83.{k}.4:4420" for k in range(4)]
MODES = ["single", "round-robin", "isr"]
PAPER = ("NSDI'26: ISR picks the least congested of the torus's paths; switchless "
         "average read latency -28.3 % vs switched on YCSB")


def args():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--runtime", type=float, required=True)
    p.add_argument("--reps", type=int, required=True)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--iodepth", type=int, default=16)
    return p.parse_args()


def san(a, *rest, check=True):
    return subprocess.run([a.bin, "san", "--state-dir", os.path.join(a.out, "state"), *rest],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=check)


def in_h0(a, argv, **kw):
    return [a.bin, "san", "--state-dir", os.path.join(a.out, "state"), "exec", "h0", "--", *argv]


def noisy(a, secs, addr=PATHS[0]):
    """The second tenant: 128 KiB sequential reads (QD16) for secs over addr
    (default path 0 of st3 on the torus), in the client namespace."""
    cmd = in_h0(a, [a.bin, "bench", "--addr", addr, "--nqn", NQN, "--rw", "read", "--bs", "128k",
                    "--iodepth", "16", "--runtime", f"{secs}s", "--ramp_time", "0", "--no_progress",
                    "--json", os.path.join(a.out, "noisy.json"), "--log", "warn"])
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measured(a, mode, tag):
    out = os.path.join(a.out, f"bench-{tag}.json")
    where = (["--addr", PATHS[0]] if mode == "single"
             else ["--paths", ",".join(PATHS), "--path-policy", mode])
    cmd = in_h0(a, [a.bin, "bench", *where, "--nqn", NQN, "--rw", "randread", "--bs", "4k",
                    "--iodepth", str(a.iodepth), "--runtime", f"{a.runtime}s", "--ramp_time", "1s",
                    "--no_progress", "--json", out, "--log", "warn"])
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0 or not os.path.exists(out):
        sys.exit(f"san: bench {tag} failed ({r.returncode}):\n{r.stdout[-2000:]}")
    return json.load(open(out))["jobs"][0]


def main():
    a = args()
    os.makedirs(a.out, exist_ok=True)
    r = san(a, "up", "torus2d", "--rate", a.rate, "--host-rate", a.rate, "--backend", "ram",
            "--size-mib", "256", check=False)
    if r.returncode != 0:
        sys.exit(f"san: trellis san up failed:\n{r.stdout}")
    runs = {m: [] for m in MODES}
    try:
        for rep in range(a.reps):
            order = MODES[rep % 3:] + MODES[:rep % 3]
            for m in order:
                n = noisy(a, a.runtime + 3)
                time.sleep(1.0)
                try:
                    runs[m].append(measured(a, m, f"{m}-{rep}"))
                finally:
                    n.wait(timeout=a.runtime + 30)
    finally:
        san(a, "down", check=False)
    med = statistics.median
    doc = {"paper": PAPER, "rate": a.rate, "runtime_s": a.runtime, "reps": a.reps,
           "iodepth": a.iodepth, "target": TARGET, "paths": PATHS, "modes": {}}
    for m, rs in runs.items():
        doc["modes"][m] = {
            "iops": med(x["iops"] for x in rs),
            "lat_us_p50": med(x["lat_us_p50"] for x in rs),
            "lat_us_p99": med(x["lat_us_p99"] for x in rs),
            "lat_us_p99_9": med(x["lat_us_p99_9"] for x in rs),
            "lat_us_p99_9_per_rep": [x["lat_us_p99_9"] for x in rs],
            "errors": sum(x["errors"] for x in rs),
            "share_on_loaded_path": med((x["paths"][0]["ios"] / max(1, sum(p["ios"] for p in x["paths"])))
                                        if x.get("paths") else 1.0 for x in rs),
        }
    d = doc["modes"]
    doc["checks"] = [
        {"rule": "isr p99.9 below round-robin", "measured": d["isr"]["lat_us_p99_9"] / d["round-robin"]["lat_us_p99_9"],
         "pass": d["isr"]["lat_us_p99_9"] < d["round-robin"]["lat_us_p99_9"]},
        {"rule": "isr p99.9 below the single path", "measured": d["isr"]["lat_us_p99_9"] / d["single"]["lat_us_p99_9"],
         "pass": d["isr"]["lat_us_p99_9"] < d["single"]["lat_us_p99_9"]},
        {"rule": "no I/O errors", "measured": sum(x["errors"] for x in d.values()), "pass": all(x["errors"] == 0 for x in d.values())},
    ]
    curves = []
    for m in MODES:
        rs = sorted(runs[m], key=lambda x: x["lat_us_p99_9"])
        curves.append((m, rs[len(rs) // 2]["lat_us_cdf"]))
    json.dump(doc, open(os.path.join(a.out, "san.json"), "w"), indent=2)
    bx.svg_cdf(curves, os.path.join(a.out, "san-cdf.svg"), xlabel="4 KiB read latency (µs, log scale)")
    lines = [f"# Path choice with a second tenant on one path (torus2d, links {a.rate}, {a.reps} reps of "
             f"{a.runtime} s, medians)", "", f"Paper: {PAPER}.", "",
             "| mode | IOPS | p50 µs | p99 µs | p99.9 µs | share on the loaded path |", "|---|---|---|---|---|---|"]
    for m in MODES:
        x = d[m]
        lines.append(f"| {m} | {x['iops']:.0f} | {x['lat_us_p50']:.1f} | {x['lat_us_p99']:.1f} | "
                     f"{x['lat_us_p99_9']:.1f} | {x['share_on_loaded_path']:.2f} |")
    lines += bx.checks_md(doc["checks"])
    md = "\n".join(lines) + "\n"
    open(os.path.join(a.out, "san.md"), "w").write(md)
    print(md)


if __name__ == "__main__":
    main()
