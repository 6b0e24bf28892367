#!/usr/bin/env python3
"""A link failure under load on the emulated SAN (issue 12): throughput dip and
recovery time, switched vs switchless.

The client reads 4 KiB at random (QD16) from st3 for --runtime seconds; at
--down-at s the link that carries the traffic goes down, and --outage s
later it comes back:
  - torus2d: the direct h0-st3 link (path 0 of 4), with round-robin and with
    ISR path choice; `--cmd-timeout-ms 500` makes a stuck command fail its
    path, whose commands then move to the others;
  - switched: the client's only link (h0-tor); nothing to fail over to, so
    the default 10 s command timeout lets TCP carry on once the link returns.
From each job's `ios_timeline` (100 ms samples): IOPS before the failure, the
lowest 100 ms interval after it, the mean during the outage, and the time from
the failure until an interval is back at >= 90 % of before. Modes alternate
over --reps; medians. Writes san-failure.json and san-failure.md to --out.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

NQN = "nqn.2026-11.io.trellis:default"
PAPER = "NSDI'26: a link failure costs the switchless SAN a 1.6-6.8 % throughput drop, recovered in 0.5-2 ms"
MODES = [("torus2d", "round-robin"), ("torus2d", "isr"), ("switched", "single")]


def args():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--runtime", type=float, default=8.0)
    p.add_argument("--down-at", type=float, default=3.0)
    p.add_argument("--outage", type=float, default=2.0)
    p.add_argument("--reps", type=int, default=3)
    return p.parse_args()


def san(a, *rest, check=True):
    r = subprocess.run([a.bin, "san", "--state-dir", os.path.join(a.out, "state"), *rest],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        sys.exit(f"san_failure: trellis san {' '.join(rest)} failed:\n{r.stdout}")
    return r


def one(a, topo, policy, tag):
    out = os.path.join(a.out, f"bench-{tag}.json")
    if topo == "torus2d":
        where = ["--paths", ",".join(f"10.83.{k}.4:4420" for k in range(4)), "--path-policy", policy,
                 "--cmd-timeout-ms", "500"]
        link = ["h0", "st3"]
    else:
        where = ["--addr", "10.81.1.4:4420"]
        link = ["h0", "tor"]
    cmd = [a.bin, "san", "--state-dir", os.path.join(a.out, "state"), "exec", "h0", "--",
           a.bin, "bench", *where, "--nqn", NQN, "--rw", "randread", "--bs", "4k", "--iodepth", "16",
           "--runtime", f"{a.runtime}s", "--ramp_time", "0", "--no_progress", "--json", out, "--log", "warn"]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(a.down_at)
    t_down = time.monotonic() - t0
    san(a, "link", *link, "down")
    time.sleep(a.outage)
    t_up = time.monotonic() - t0
    san(a, "link", *link, "up")
    text, _ = p.communicate(timeout=a.runtime + 60)
    if not os.path.exists(out):
        sys.exit(f"san_failure: bench {tag} wrote no results ({p.returncode}):\n{text[-2000:]}")
    j = json.load(open(out))["jobs"][0]
    return analyse(j, t_down, t_up)


def analyse(j, t_down, t_up):
    """Rates per 100 ms interval from the cumulative timeline. The timeline's
    clock starts when the workers start, a little after the process does;
    the failure times are the process's, so they are upper bounds there."""
    pts = j["ios_timeline"]
    iv = [((t0 + t1) / 2000, (n1 - n0) / ((t1 - t0) / 1000)) for (t0, n0), (t1, n1) in zip(pts, pts[1:]) if t1 > t0]
    before = [r for t, r in iv if 1.0 <= t < t_down - 0.2]
    base = statistics.median(before) if before else 0
    during = [r for t, r in iv if t_down <= t < t_up]
    after_fail = [(t, r) for t, r in iv if t >= t_down - 0.1]
    low = min((r for _, r in after_fail), default=0)
    rec = next((t - t_down for t, r in after_fail if t > t_down and r >= 0.9 * base), None)
    return {
        "iops_before": base,
        "iops_min_100ms": low,
        "iops_mean_outage": statistics.mean(during) if during else 0,
        "drop_mean_outage": 1 - (statistics.mean(during) / base) if during and base else None,
        "recovery_s": rec,
        "errors": j["errors"],
        "path_failures": j.get("path_failures", 0),
        "path_retries": j.get("path_retries", 0),
        "t_down_s": t_down, "t_up_s": t_up,
        "timeline_iops": iv,
    }


def main():
    a = args()
    os.makedirs(a.out, exist_ok=True)
    runs = {f"{t}/{p}": [] for t, p in MODES}
    current = None
    try:
        for rep in range(a.reps):
            order = MODES if rep % 2 == 0 else MODES[::-1]
            for topo, policy in order:
                if current != topo:
                    if current:
                        san(a, "down")
                    san(a, "up", topo, "--rate", "1gbit", "--backend", "ram", "--size-mib", "256")
                    current = topo
                runs[f"{topo}/{policy}"].append(one(a, topo, policy, f"{topo}-{policy}-{rep}"))
    finally:
        san(a, "down", check=False)
    med = statistics.median
    doc = {"paper": PAPER, "runtime_s": a.runtime, "down_at_s": a.down_at, "outage_s": a.outage,
           "reps": a.reps, "modes": {}}
    for m, rs in runs.items():
        recs = [r["recovery_s"] for r in rs]
        doc["modes"][m] = {
            "iops_before": med(r["iops_before"] for r in rs),
            "iops_min_100ms": med(r["iops_min_100ms"] for r in rs),
            "drop_mean_outage": med(r["drop_mean_outage"] for r in rs if r["drop_mean_outage"] is not None),
            "recovery_s": recs,
            "errors": sum(r["errors"] for r in rs),
            "runs": rs,
        }
    json.dump(doc, open(os.path.join(a.out, "san-failure.json"), "w"), indent=2)
    lines = [f"# A link failure under load ({a.outage} s outage at {a.down_at} s of {a.runtime} s, "
             f"4 KiB randread QD16 to st3, links 1 Gbit/s, {a.reps} reps, medians)", "", f"Paper: {PAPER}.", "",
             "| topology / policy | IOPS before | lowest 100 ms | mean drop during the outage | "
             "back to 90 % after (s, per rep) | I/O errors |", "|---|---|---|---|---|---|"]
    for m, x in doc["modes"].items():
        rec = ", ".join("never" if r is None else f"{r:.1f}" for r in x["recovery_s"])
        lines.append(f"| {m} | {x['iops_before']:.0f} | {x['iops_min_100ms']:.0f} | "
                     f"{x['drop_mean_outage']:.1%} | {rec} | {x['errors']} |")
    md = "\n".join(lines) + "\n"
    open(os.path.join(a.out, "san-failure.md"), "w").write(md)
    print(md)


if __name__ == "__main__":
    main()
