#!/usr/bin/env python3
"""The runner behind bench/fairness.sh (run that; it picks a port and checks
the binary). Standard library only.

For each case file in bench/jobs/fairness/ and each mode (off, gimbal):
start `trellis target` on an emulated SSD, run every tenant alone, then all
together, and record per-tenant bandwidth and p99.9. Metrics (docs/bench.md
"Fairness"):

- standalone_mb_per_s: the tenant alone, same mode and device state.
- f: weighted f-Util, BW_i / (BW_i^alone * w_i / sum w) (our reading of the
  Gimbal paper's f-Util, BW_i / (BW_i^alone / N), whose exact definition we
  could not verify; docs/gimbal.md §1.g, docs/sources.md; ideal 1 when each
  tenant alone can use the drive).
- share: keep_i / sum_j keep_j (keep = BW / BW^alone), the tenant's share of drive time (a tenant that
  keeps x % of its standalone bandwidth used x % of the drive's time); its
  fair value is w_i / sum w, and `fair_share_dev` is share / fair - 1.
- utilisation: sum_i BW_i / BW_i^alone(off), drive time used by the run,
  with the same (QoS-off) yardstick for both modes.

Environment: FAIR_TARGET_EXTRA, TOML appended to every target config ("\n"
for line breaks), e.g. '[qos]\ncalibrate = "off"' to run Gimbal with its
published constants instead of the drive-calibrated ones (docs/gimbal.md).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import tomllib

NQN = "nqn.2026-11.io.trellis:fairness"
HOST_PREFIX = "nqn.2026-11.io.trellis:tenant:"
CASES = ["intensity", "size", "pattern_rand", "pattern_seq"]
MODES = ["off", "gimbal"]
# The Gimbal paper's appendix D figures, vanilla SPDK ([Gimbal] in docs/sources.md;
# docs/gimbal.md §1.g).
PAPER = {
    "intensity": "2.0x bandwidth for the stream with 2x the iodepth (4 KiB random read)",
    "size": "4 KiB vs 64 KiB random read: 91 vs 1,473 MB/s (16.2x)",
    "pattern_rand": "random reads beside random writes keep 38.9 % of standalone",
    "pattern_seq": "sequential reads beside sequential writes keep 27.3 % of standalone",
}
# Acceptance (issue #8): QoS off reproduces the direction of each figure,
# Gimbal gives every tenant its weighted fair share within ±15 %.
OFF_RATIO_MIN = {"intensity": 1.6, "size": 5.0}
OFF_READ_KEEP_MAX = 0.60
FAIR_DEV_MAX = 0.15
UTIL_KEEP_MIN = 0.85
TARGET_START_S = 20
PROFILE = "pm9a3-gen4"
NS_SIZE = "4GiB"


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return json.dumps(str(v))


def job_file(jobs, path):
    with open(path, "w") as f:
        for j in jobs:
            f.write("[[job]]\n")
            for k, v in j.items():
                f.write(f"{k} = {toml_value(v)}\n")
            f.write("\n")


def target_config(path, port, mode, scale, tenants, state_dir, reactors=1):
    # Every reactor on CPU 1 (the host's on CPU 0): the drive, not the CPU,
    # is what the tenants share; more reactors split its requests between
    # them, which one Gimbal per namespace must not notice (issue 36).
    cpus = ", ".join(["1"] * reactors)
    with open(path, "w") as f:
        f.write(f'[target]\nreactors = {reactors}\ncpus = [{cpus}]\nstate_dir = "{state_dir}"\n\n')
        f.write(f'[[listener]]\naddr = "127.0.0.1:{port}"\n\n')
        f.write(f'[[subsystem]]\nnqn = "{NQN}"\n\n')
        f.write('[[subsystem.namespace]]\nbackend = "emulated"\n')
        f.write(f'size = "{NS_SIZE}"\nprofile = "{PROFILE}"\nprecondition = "clean"\n')
        f.write(f"time_scale = {scale}\nqos = \"{mode}\"\n\n")
        f.write(os.environ.get("FAIR_TARGET_EXTRA", "").replace("\\n", "\n") + "\n")
        for name, w in tenants:
            f.write(f'[[tenant]]\nhost = "{HOST_PREFIX}{name}"\nname = "{name}"\nweight = {w}\n\n')


def wait_port(port, proc):
    deadline = time.monotonic() + TARGET_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


class Target:
    """One `trellis target` process (one mode, fresh device state)."""

    def __init__(self, a, mode, tenants, work, tag, write_config=None):
        """`write_config(path)` replaces the one-namespace configuration
        (bench/replicas.py serves two subsystems)."""
        self.log = os.path.join(a.out, f"target-{tag}.log")
        cfg = os.path.join(work, f"target-{tag}.toml")
        if write_config:
            write_config(cfg)
        else:
            target_config(cfg, a.port, mode, a.time_scale, tenants, os.path.join(work, "state"),
                          getattr(a, "reactors", 1))
        self.proc = subprocess.Popen(
            [a.bin, "target", "-c", cfg, "--log", "info"],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        if not wait_port(a.port, self.proc):
            self.proc.kill()
            sys.exit(f"fairness: the target did not start; see {self.log}")

    def stop(self):
        self.proc.send_signal(2)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return lateness(self.log)


def lateness(log):
    """The emulated backend's shutdown line: lateness vs model time, µs."""
    for line in open(log, errors="replace"):
        if "lateness vs model time" in line:
            words = line.replace(",", " ").split()
            vals = {}
            for key in ("p50", "p99", "max"):
                if key in words:
                    vals[key] = float(words[words.index(key) + 1])
            return {"p50_us": vals.get("p50"), "p99_us": vals.get("p99"), "max_us": vals.get("max")}
    return None


def bench(a, jobs, work, tag, own_targets=False):
    """Runs `jobs` together; with `own_targets` the jobs name their targets
    (addr/nqn or replicas) and the runner's --addr/--nqn are not added."""
    jf = os.path.join(work, f"jobs-{tag}.toml")
    out = os.path.join(a.out, f"bench-{tag}.json")
    if getattr(a, "reactors", 1) > 1:
        # A queue pair per reactor for each tenant: the target hands
        # connections out round-robin, so a tenant's I/O spans reactors.
        jobs = [{**j, "queues": a.reactors} for j in jobs]
    job_file(jobs, jf)
    target = [] if own_targets else ["--addr", f"127.0.0.1:{a.port}", "--nqn", NQN]
    cmd = [a.bin, "bench", "--jobs", jf, *target,
           "--runtime", f"{a.runtime}s", "--ramp_time", "1s", "--no_progress",
           "--cpus", "0", "--json", out, "--log", "warn"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not os.path.exists(out):
        sys.exit(f"fairness: bench {tag} failed ({r.returncode}) without results:\n{r.stdout[-2000:]}")
    jobs = {j["name"]: j for j in json.load(open(out))["jobs"]}
    if r.returncode != 0:
        # I/O errors (a command timed out behind the drive): kept in the
        # results and in the checks, not hidden, and the run goes on.
        errs = "; ".join(f"{n}: {j.get('first_error')}" for n, j in jobs.items() if j["errors"])
        print(f"fairness: bench {tag}: I/O errors: {errs}", flush=True)
    return jobs


def run_mode(a, case, jobs, weights, mode, work):
    tenants = [(j["name"], weights.get(j["name"], 1)) for j in jobs]
    tag = f"{case}-{mode}"
    t = Target(a, mode, tenants, work, tag)
    try:
        alone = {j["name"]: bench(a, [j], work, f"{tag}-alone-{j['name']}")[j["name"]] for j in jobs}
        both = bench(a, jobs, work, f"{tag}-shared")
    finally:
        late = t.stop()
    return tenants, alone, both, late


def metrics(case, tenants, alone, both, off_alone):
    wsum = sum(w for _, w in tenants)
    rows = []
    for name, w in tenants:
        bw, bw1 = both[name]["mib_per_s"] * 1.048576, alone[name]["mib_per_s"] * 1.048576
        rows.append({
            "name": name, "weight": w,
            "mb_per_s": round(bw, 2), "lat_us_p999": both[name]["lat_us_p99_9"],
            "lat_us_p50": both[name]["lat_us_p50"],
            "standalone_mb_per_s": round(bw1, 2),
            "standalone_lat_us_p999": alone[name]["lat_us_p99_9"],
            "keep": round(bw / bw1, 4) if bw1 else 0.0,
            "f": round(bw / (bw1 * w / wsum), 4) if bw1 else 0.0,
            "errors": both[name]["errors"] + alone[name]["errors"],
            "first_error": both[name].get("first_error") or alone[name].get("first_error"),
        })
    # Drive-time share: each tenant's fraction of its standalone bandwidth, normalised
    # (f already divides by the weight, so it would make every fair share 1/N).
    ksum = sum(r["keep"] or 0 for r in rows)
    for r in rows:
        fair = r["weight"] / wsum
        r["share"] = round((r["keep"] or 0) / ksum, 4) if ksum else None
        r["fair_share"] = round(fair, 4)
        r["fair_share_dev"] = round(r["share"] / fair - 1, 4) if r["share"] is not None else None
    fs = [r["f"] for r in rows]
    util = sum(both[n]["mib_per_s"] / off_alone[n]["mib_per_s"]
               for n, _ in tenants if off_alone[n]["mib_per_s"])
    return rows, {"min": round(min(fs), 4), "mean": round(sum(fs) / len(fs), 4)}, round(util, 4)


def checks(case, res):
    """The acceptance rules, each as (rule, measured, pass)."""
    off, gim = res["off"], res["gimbal"]
    out = []
    t = {r["name"]: r for r in off["tenants"]}
    names = [r["name"] for r in off["tenants"]]
    if case in OFF_RATIO_MIN:
        a, b = (t[names[0]], t[names[1]]) if case == "intensity" else (t["large"], t["small"])
        ratio = a["mb_per_s"] / b["mb_per_s"] if b["mb_per_s"] else float("inf")
        out.append((f"off: {a['name']}/{b['name']} bandwidth >= {OFF_RATIO_MIN[case]}",
                    round(ratio, 2), ratio >= OFF_RATIO_MIN[case]))
    else:
        keep = t["reader"]["keep"]
        out.append((f"off: reads keep <= {OFF_READ_KEEP_MAX:.0%} of standalone", keep,
                    keep is not None and keep <= OFF_READ_KEEP_MAX))
    for r in gim["tenants"]:
        dev = r["fair_share_dev"]
        out.append((f"gimbal: {r['name']} within ±{FAIR_DEV_MAX:.0%} of its fair share", dev,
                    dev is not None and abs(dev) <= FAIR_DEV_MAX))
    keep_util = gim["utilisation"] / off["utilisation"] if off["utilisation"] else 0
    out.append((f"gimbal: drive utilisation >= {UTIL_KEEP_MIN:.0%} of off", round(keep_util, 3),
                keep_util >= UTIL_KEEP_MIN))
    if case.startswith("pattern"):
        g = {r["name"]: r for r in gim["tenants"]}["reader"]["lat_us_p999"]
        o = t["reader"]["lat_us_p999"]
        out.append(("gimbal: reader p99.9 below off", f"{g:.0f} vs {o:.0f} µs", g < o))
    for mode in MODES:
        bad = [f"{r['name']}: {r['first_error']}" for r in res[mode]["tenants"] if r["errors"]]
        out.append((f"{mode}: no I/O errors", "; ".join(bad) or "none", not bad))
    return [{"rule": r, "measured": m, "pass": bool(p)} for r, m, p in out]


def markdown(doc):
    lines = [f"# Fairness: emulated {doc['profile']}, time_scale {doc['time_scale']}, "
             f"{doc['runtime_s']} s runs\n",
             "| case | mode | tenant | w | MB/s | alone MB/s | keep | f | share (fair) | p99.9 µs |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for case, res in doc["cases"].items():
        for mode in MODES:
            for r in res[mode]["tenants"]:
                lines.append(
                    f"| {case} | {mode} | {r['name']} | {r['weight']} | {r['mb_per_s']:.1f} | "
                    f"{r['standalone_mb_per_s']:.1f} | {r['keep']:.2f} | {r['f']:.2f} | "
                    f"{r['share']:.2f} ({r['fair_share']:.2f}) | {r['lat_us_p999']:.0f} |")
    lines += ["", "| case | paper (vanilla SPDK) | f-Util off min/mean | f-Util gimbal min/mean | utilisation off / gimbal |",
              "|---|---|---|---|---|"]
    for case, res in doc["cases"].items():
        o, g = res["off"], res["gimbal"]
        lines.append(f"| {case} | {res['paper']} | {o['f_util']['min']:.2f} / {o['f_util']['mean']:.2f} | "
                     f"{g['f_util']['min']:.2f} / {g['f_util']['mean']:.2f} | "
                     f"{o['utilisation']:.2f} / {g['utilisation']:.2f} |")
    lines += ["", "| case | rule | measured | |", "|---|---|---|---|"]
    for case, res in doc["cases"].items():
        for c in res["checks"]:
            lines.append(f"| {case} | {c['rule']} | {c['measured']} | {'pass' if c['pass'] else 'FAIL'} |")
    lines += ["", "Lateness of completions vs model time (µs, p50 / p99 / max), per target run:", ""]
    for case, res in doc["cases"].items():
        for mode in MODES:
            l = res[mode]["lateness"] or {}
            lines.append(f"- {case} {mode}: {l.get('p50_us')} / {l.get('p99_us')} / {l.get('max_us')}")
    return "\n".join(lines) + "\n"


def runner_args():
    """The arguments every runner on this module's Target and bench takes
    (bench/fairness.sh and bench/credits.sh fill them in)."""
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--time-scale", type=float, required=True)
    p.add_argument("--runtime", type=float, required=True)
    return p


def main():
    p = runner_args()
    p.add_argument("--quick", type=int, default=0)
    p.add_argument("--reactors", type=int, default=1)
    p.add_argument("--weight", action="append", default=[])
    p.add_argument("--case", action="append", default=[], choices=CASES)
    a = p.parse_args()
    weights = {}
    for w in a.weight:
        name, _, val = w.partition("=")
        if not val.isdigit() or int(val) < 1:
            sys.exit(f"fairness: --weight {w!r}: use NAME=W with W a positive integer")
        weights[name] = int(val)
    here = os.path.dirname(os.path.abspath(__file__))
    if not 1 <= a.reactors <= 8:
        sys.exit(f"fairness: --reactors {a.reactors}: use 1 to 8")
    doc = {"profile": PROFILE, "time_scale": a.time_scale, "runtime_s": a.runtime,
           "reactors": a.reactors,
           "quick": bool(a.quick), "cases": {}}
    with tempfile.TemporaryDirectory(prefix="trellis-fairness.") as work:
        for case in a.case or CASES:
            jobs = tomllib.load(open(os.path.join(here, "jobs", "fairness", f"{case}.toml"), "rb"))["job"]
            res = {"paper": PAPER[case]}
            runs = {m: run_mode(a, case, jobs, weights, m, work) for m in MODES}
            off_alone = runs["off"][1]
            for m, (tenants, alone, both, late) in runs.items():
                rows, f_util, util = metrics(case, tenants, alone, both, off_alone)
                res[m] = {"tenants": rows, "f_util": f_util, "utilisation": util, "lateness": late}
            res["checks"] = checks(case, res)
            doc["cases"][case] = res
            print(f"fairness: {case}: " + "; ".join(
                f"{c['rule']}: {c['measured']} {'pass' if c['pass'] else 'FAIL'}" for c in res["checks"]),
                flush=True)
    json.dump(doc, open(os.path.join(a.out, "fairness.json"), "w"), indent=2)
    md = markdown(doc)
    open(os.path.join(a.out, "fairness.md"), "w").write(md)
    print(md)
    print(f"fairness: wrote {a.out}/fairness.json and fairness.md")


if __name__ == "__main__":
    main()
