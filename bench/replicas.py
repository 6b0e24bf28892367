#!/usr/bin/env python3
"""Replica choice by Gimbal's virtual view (issue 14 (c)).

Two storage targets, A and B, each a subsystem with its own emulated
pm9a3-gen4 drive (time-scaled, qos = "gimbal"), served by one `trellis target`
process with one reactor: on this 2-vCPU VM two target processes would share
one CPU and time-slice each other's completions by milliseconds (measured:
lateness p99 ~4 ms), which would swamp what replica choice changes. The "app"
tenant of bench/jobs/replicas/busy.toml reads a volume replicated on A and B,
while the "noisy" tenant loads replica B alone. The app runs alternately
with replica_read = "round-robin" and "headroom" (A B A B ..., `--reps` pairs,
order alternating), both with credits on; the medians of the app's p99.9 and
throughput are compared. Gimbal's paper: the credit-based replica balancer cuts
tail latency a further 18.8 % on top of the rate limiter; the acceptance asks
>= 15 %. Writes replicas.json and replicas.md. Standard library only.
"""
import json
import os
import statistics
import sys
import tempfile
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fairness as fx  # noqa: E402  (Target, bench, runner_args: the same runner)

P999_CUT_MIN = 0.15
PAPER = "Gimbal: the replica balancer cuts tail latency a further 18.8 % (on top of credits)"
MODES = ["round-robin", "headroom"]


def nqn(name):
    return f"{fx.NQN}-replica-{name.lower()}"


def resolve(jobs, addr, mode):
    """The job file's "A"/"B" placeholders replaced by the targets (address/NQN)."""
    out = []
    for j in jobs:
        j = dict(j)
        if "replicas" in j:
            j["replicas"] = ",".join(f"{addr}/{nqn(x.strip())}" for x in j["replicas"].split(","))
            j["replica_read"] = mode
        if "addr" in j:
            j["nqn"] = nqn(j["addr"])
            j["addr"] = addr
        out.append(j)
    return out


class Targets(fx.Target):
    """One `trellis target` serving subsystems A and B, one emulated drive each."""

    def __init__(self, a, tenants, work):
        def config(path):
            with open(path, "w") as f:
                f.write(f'[target]\nreactors = 1\ncpus = [1]\nstate_dir = "{work}/state"\n\n')
                f.write(f'[[listener]]\naddr = "127.0.0.1:{a.port}"\n\n')
                for name in ("A", "B"):
                    f.write(f'[[subsystem]]\nnqn = "{nqn(name)}"\n\n')
                    f.write('[[subsystem.namespace]]\nbackend = "emulated"\n')
                    f.write(f'size = "{fx.NS_SIZE}"\nprofile = "{fx.PROFILE}"\nprecondition = "clean"\n')
                    f.write(f'time_scale = {a.time_scale}\nqos = "gimbal"\n\n')
                for name, w in tenants:
                    f.write(f'[[tenant]]\nhost = "{fx.HOST_PREFIX}{name}"\nname = "{name}"\nweight = {w}\n\n')
        super().__init__(a, "gimbal", tenants, work, "replicas", write_config=config)

    def stop(self):
        """Both drives' lateness lines (the base class reads the first)."""
        super().stop()
        return [l for l in open(self.log, errors="replace") if "lateness vs model time" in l]


def summary(rs):
    app = [r["app"] for r in rs]
    reads = [[x["reads"] for x in j["replicas"]] for j in app]
    return {
        "app_mb_per_s": statistics.median(j["mib_per_s"] * 1.048576 for j in app),
        "app_lat_us_p50": statistics.median(j["lat_us_p50"] for j in app),
        "app_lat_us_p99": statistics.median(j["lat_us_p99"] for j in app),
        "app_lat_us_p999": statistics.median(j["lat_us_p99_9"] for j in app),
        "app_reads_on_b_share": statistics.median(r[1] / max(1, sum(r)) for r in reads),
        "noisy_mb_per_s": statistics.median(r["noisy"]["mib_per_s"] * 1.048576 for r in rs),
        "errors": sum(j["errors"] for r in rs for j in r.values()),
    }


def main():
    p = fx.runner_args()
    p.add_argument("--reps", type=int, required=True)
    a = p.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    jobs = tomllib.load(open(os.path.join(here, "jobs", "replicas", "busy.toml"), "rb"))["job"]
    tenants = [(j["name"], 1) for j in jobs]
    addr = f"127.0.0.1:{a.port}"
    runs = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="trellis-replicas.") as work:
        t = Targets(a, tenants, work)
        try:
            for r in range(a.reps):
                order = MODES if r % 2 == 0 else MODES[::-1]
                for m in order:
                    runs[m].append(fx.bench(a, resolve(jobs, addr, m), work, f"{m}-{r}", own_targets=True))
        finally:
            late = t.stop()
    doc = {"profile": fx.PROFILE, "time_scale": a.time_scale, "runtime_s": a.runtime,
           "reps": a.reps, "paper": PAPER, "lateness": [l.split("emulated ")[-1].strip() for l in late],
           "modes": {m: summary(rs) for m, rs in runs.items()}}
    rr, hd = doc["modes"]["round-robin"], doc["modes"]["headroom"]
    cut = 1 - hd["app_lat_us_p999"] / rr["app_lat_us_p999"] if rr["app_lat_us_p999"] else 0.0
    doc["p999_cut"] = round(cut, 4)
    errors = rr["errors"] + hd["errors"]
    doc["checks"] = [
        {"rule": f"headroom cuts the app's p99.9 by >= {P999_CUT_MIN:.0%} against round-robin",
         "measured": round(cut, 3), "pass": cut >= P999_CUT_MIN},
        {"rule": "no I/O errors", "measured": errors, "pass": errors == 0},
    ]
    json.dump(doc, open(os.path.join(a.out, "replicas.json"), "w"), indent=2)
    lines = [f"# Replica choice on two emulated SSDs, one busy ({fx.PROFILE}, time_scale "
             f"{a.time_scale:g}, {a.reps} interleaved pairs of {a.runtime:g} s, medians)", "",
             "| app reads | app MB/s | p50 µs | p99 µs | p99.9 µs | share of reads on busy B | noisy MB/s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for m, d in doc["modes"].items():
        lines.append(f"| {m} | {d['app_mb_per_s']:.1f} | {d['app_lat_us_p50']:.0f} | "
                     f"{d['app_lat_us_p99']:.0f} | {d['app_lat_us_p999']:.0f} | "
                     f"{d['app_reads_on_b_share']:.2f} | {d['noisy_mb_per_s']:.1f} |")
    lines += ["", f"Paper: {PAPER}. Measured: p99.9 cut {cut:.1%} (time-scaled: MB/s are the "
              f"drive's / {a.time_scale:g}).", "", "| rule | measured | |", "|---|---|---|"]
    for c in doc["checks"]:
        lines.append(f"| {c['rule']} | {c['measured']} | {'pass' if c['pass'] else 'FAIL'} |")
    md = "\n".join(lines) + "\n"
    open(os.path.join(a.out, "replicas.md"), "w").write(md)
    print(md)
    print(f"replicas: wrote {a.out}/replicas.json and replicas.md")


if __name__ == "__main__":
    main()
