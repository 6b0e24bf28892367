#!/usr/bin/env python3
"""blk-switch's interference experiment (issue 14 (a)) at this machine's scale.

One L-app (4 KiB random reads, QD1) beside one or two T-apps (128 KiB random
reads, QD32) on one host against one target (bench/jobs/blkswitch/l1t2.toml).
For each host stack (`--stack plain`, today's thread per job, and
`--stack blk-switch`), the L-app alone, the T-apps alone, and all together;
the stacks alternate A B A B over `--reps` repetitions, and medians are
compared. Blk-switch (Haecki et al., OSDI'21) keeps the L-app's latency at
µs scale with the T-apps near full throughput; the acceptance asks the L-app's
p99 within 1.5x of alone and the T-apps at >= 90 % of alone.

The target is `trellis target` (RAM namespace, one reactor on CPU 1, the
send budget given) unless --addr/--nqn name another one (Linux nvmet).
The host runs on CPU 0 in both stacks. Writes blkswitch.json, blkswitch.md
and blkswitch-cdf.svg (the L-app's latency CDFs) to --out.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fairness as fx  # noqa: E402  (Target, job_file: the same runner)

L_P99_RATIO_MAX = 1.5
METRICS_WAIT_S = 5.0
T_KEEP_MIN = 0.90
NQN = "nqn.2026-11.io.trellis:default"
PAPER = ("blk-switch (OSDI'21, Fig. 8): L-app p99 stays at tens of µs beside T-apps, "
         "which keep near-full throughput; Linux: L-app p99 in ms")
STACKS = ["plain", "blk-switch"]


def args():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument("--runtime", type=float, required=True)
    p.add_argument("--reps", type=int, required=True)
    p.add_argument("--tapps", type=int, choices=[1, 2], default=2)
    p.add_argument("--send-budget", default="32KiB")
    p.add_argument("--addr", help="an external target (HOST:PORT); no trellis target is started")
    p.add_argument("--nqn", default=NQN)
    return p.parse_args()


def start_target(a, work):
    """A fresh `trellis target` (fairness.Target) with one RAM namespace, the
    send budget asked, and /metrics for the reactor's busy time."""
    def write(path):
        open(path, "w").write(
            f'[target]\nreactors = 1\ncpus = [1]\nsend_budget = "{a.send_budget}"\n'
            f'state_dir = "{work}"\n\n'
            f'[metrics]\nlisten = "127.0.0.1:{a.metrics_port}"\n\n'
            f'[[listener]]\naddr = "127.0.0.1:{a.port}"\n\n'
            f'[[subsystem]]\nnqn = "{NQN}"\n\n'
            f'[[subsystem.namespace]]\nbackend = "ram"\nsize = "1G"\n')
    return fx.Target(a, "off", [], work, "blkswitch", write_config=write)


def target_busy_s(a):
    """The target reactor's busy seconds so far (None: an external target).
    The metrics endpoint comes up just after the NVMe listener: retried for
    up to METRICS_WAIT_S."""
    if a.addr:
        return None
    deadline = time.monotonic() + METRICS_WAIT_S
    while True:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{a.metrics_port}/metrics", timeout=5).read().decode()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("trellis_reactor_busy_seconds"))


def bench(a, jobs, glob, stack, work, tag):
    jf = os.path.join(work, f"jobs-{tag}.toml")
    out = os.path.join(a.out, f"bench-{tag}.json")
    fx.job_file([dict(glob, **j) for j in jobs], jf)
    cmd = [a.bin, "bench", "--jobs", jf, "--stack", stack, "--cpus", "0",
           "--runtime", f"{a.runtime}s", "--ramp_time", "1s", "--no_progress",
           "--json", out, "--log", "warn"]
    b0, t0 = target_busy_s(a), time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    b1, t1 = target_busy_s(a), time.monotonic()
    if r.returncode != 0 or not os.path.exists(out):
        sys.exit(f"blkswitch: bench {tag} failed ({r.returncode}):\n{r.stdout[-2000:]}")
    doc = json.load(open(out))
    jobs = {j["name"]: j for j in doc["jobs"]}
    # The target reactor's busy share over the whole command (setup and ramp
    # included): near 1, the target's one core is what limits the T-apps.
    busy = None if b0 is None else (b1 - b0) / (t1 - t0)
    for j in jobs.values():
        j["target_busy"] = busy
    return jobs, doc.get("switch")


def one_rep(a, lapp, tapps, glob, stack, work, r):
    alone_l, _ = bench(a, [lapp], glob, stack, work, f"{stack}-{r}-lalone")
    alone_t, _ = bench(a, tapps, glob, stack, work, f"{stack}-{r}-talone")
    both, sw = bench(a, [lapp] + tapps, glob, stack, work, f"{stack}-{r}-together")
    tnames = [t["name"] for t in tapps]
    mb = lambda js: sum(js[n]["mib_per_s"] * 1.048576 for n in tnames)  # noqa: E731
    return {
        "l_alone": alone_l[lapp["name"]], "l_together": both[lapp["name"]],
        "t_alone_mb_per_s": mb(alone_t), "t_together_mb_per_s": mb(both),
        "target_busy": {"l_alone": alone_l[lapp["name"]]["target_busy"],
                        "t_alone": alone_t[tnames[0]]["target_busy"],
                        "together": both[tnames[0]]["target_busy"]},
        "switch": sw,
    }


def summarise(reps):
    med = statistics.median
    out = {}
    for phase in ("l_alone", "l_together"):
        for k in ("lat_us_p50", "lat_us_p99", "lat_us_p99_9"):
            out[f"{phase}_{k}"] = med(r[phase][k] for r in reps)
    out["t_alone_mb_per_s"] = med(r["t_alone_mb_per_s"] for r in reps)
    out["t_together_mb_per_s"] = med(r["t_together_mb_per_s"] for r in reps)
    out["l_p99_ratio"] = out["l_together_lat_us_p99"] / out["l_alone_lat_us_p99"]
    out["t_keep"] = out["t_together_mb_per_s"] / out["t_alone_mb_per_s"]
    if reps[0]["target_busy"]["together"] is not None:
        for k in ("l_alone", "t_alone", "together"):
            out[f"target_busy_{k}"] = med(r["target_busy"][k] for r in reps)
    # Per-pair ratios too: the machine's regime drifts between runs.
    out["l_p99_ratio_per_rep"] = [r["l_together"]["lat_us_p99"] / r["l_alone"]["lat_us_p99"] for r in reps]
    out["t_keep_per_rep"] = [r["t_together_mb_per_s"] / r["t_alone_mb_per_s"] for r in reps]
    return out


def svg_frame(w, h, m, xlabel, ylabel, right=None):
    """The opening of every bench SVG: canvas, both axes and their labels;
    the x axis ends at right (default w - m: room for a legend beyond)."""
    right = w - m if right is None else right
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
            f'<rect width="{w}" height="{h}" fill="white"/>',
            f'<line x1="{m}" y1="{h - m}" x2="{right}" y2="{h - m}" stroke="black"/>',
            f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
            f'<text x="{(m + right) / 2}" y="{h - 20}" text-anchor="middle">{xlabel}</text>',
            f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">{ylabel}</text>']


def svg_log_ticks_x(lo, hi, fx, h, m):
    """Tick marks and labels at every power of ten in [lo, hi] (log10) on the x axis."""
    el = []
    for d in range(math.floor(lo), math.ceil(hi) + 1):
        if lo <= d <= hi:
            x = fx(10 ** d)
            el.append(f'<line x1="{x:.1f}" y1="{h - m}" x2="{x:.1f}" y2="{h - m + 5}" stroke="black"/>')
            el.append(f'<text x="{x:.1f}" y="{h - m + 18}" text-anchor="middle">{10 ** d:g}</text>')
    return el


def svg_xy(curves, path, xlabel, ylabel, w=1000, h=480, m=70, legend_w=300):
    """Log-log curves through points, e.g. latency against throughput over a
    queue-depth sweep. curves: (name, colour, dashed, [(x, y, label), ...]);
    every point is marked, and labelled with its label (e.g. the QD) if any;
    the legend is right of the plot."""
    right = w - legend_w
    xs = [x for *_, pts in curves for x, _, _ in pts if x > 0]
    ys = [y for *_, pts in curves for _, y, _ in pts if y > 0]
    lx, hx = math.log10(min(xs) / 1.3), math.log10(max(xs) * 1.3)
    ly, hy = math.log10(min(ys) / 1.3), math.log10(max(ys) * 1.3)
    fx = lambda v: m + (math.log10(max(v, 1e-9)) - lx) / (hx - lx) * (right - m)  # noqa: E731
    fy = lambda v: h - m - (math.log10(max(v, 1e-9)) - ly) / (hy - ly) * (h - 2 * m)  # noqa: E731
    el = svg_frame(w, h, m, xlabel, ylabel, right) + svg_log_ticks_x(lx, hx, fx, h, m)
    for d in range(math.floor(ly), math.ceil(hy) + 1):
        for k in (1, 2, 5):
            v = k * 10 ** d
            if ly <= math.log10(v) <= hy:
                y = fy(v)
                el.append(f'<line x1="{m - 5}" y1="{y:.1f}" x2="{m}" y2="{y:.1f}" stroke="black"/>')
                el.append(f'<text x="{m - 8}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>')
    for i, (name, colour, dashed, pts) in enumerate(curves):
        dash = ' stroke-dasharray="6,4"' if dashed else ""
        poly = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y, _ in pts)
        el.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{poly}"/>')
        for x, y, label in pts:
            el.append(f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="3" fill="{colour}"/>')
            if label:
                el.append(f'<text x="{fx(x) + 5:.1f}" y="{fy(y) - 5:.1f}" font-size="9" fill="{colour}">{label}</text>')
        y = m + 18 * i
        el.append(f'<line x1="{right + 15}" y1="{y - 4}" x2="{right + 40}" y2="{y - 4}" stroke="{colour}" stroke-width="2"{dash}/>')
        el.append(f'<text x="{right + 45}" y="{y}" fill="{colour}">{name}</text>')
    el.append("</svg>")
    open(path, "w").write("\n".join(el) + "\n")


def svg_cdf(curves, path, xlabel="L-app latency (µs, log scale)"):
    """Latency CDFs, one polyline per curve: log-x µs, and y in "nines"
    (-log10(1 - q)) so that the tail, where the stacks differ, is visible."""
    w, h, m = 640, 400, 60
    xs = [x for _, pts in curves for _, x in pts if x > 0]
    lo, hi = math.log10(max(min(xs), 1.0)), math.log10(max(xs) * 1.2)
    colours = ["#1f77b4", "#aec7e8", "#d62728", "#ff9896"]
    fx = lambda v: m + (math.log10(max(v, 1.0)) - lo) / (hi - lo) * (w - 2 * m)  # noqa: E731
    nines_max = 4.5  # q = 1 (the max) is drawn just above 99.99 %
    nines = lambda q: min(-math.log10(max(1.0 - q, 1e-12)), nines_max)  # noqa: E731
    fy = lambda q: h - m - nines(q) / nines_max * (h - 2 * m)  # noqa: E731
    el = svg_frame(w, h, m, xlabel, "fraction of I/Os at or below (log tail scale)")
    el += svg_log_ticks_x(lo, hi, fx, h, m)
    for q in (0.0, 0.9, 0.99, 0.999, 0.9999):
        el.append(f'<text x="{m - 5}" y="{fy(q) + 4:.1f}" text-anchor="end">{q:g}</text>')
    for i, (name, pts) in enumerate(curves):
        c = colours[i % len(colours)]
        poly = " ".join(f"{fx(x):.1f},{fy(q):.1f}" for q, x in pts)
        el.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{poly}"/>')
        el.append(f'<text x="{w - m - 170}" y="{h - m - 60 + 15 * i}" fill="{c}">{name}</text>')
    el.append("</svg>")
    open(path, "w").write("\n".join(el) + "\n")


def checks_md(checks):
    """The checks as Markdown table lines (a blank line first)."""
    lines = ["", "| check | measured | |", "|---|---|---|"]
    for c in checks:
        lines.append(f"| {c['rule']} | {c['measured']:.3f} | {'pass' if c['pass'] else 'FAIL'} |")
    return lines


def markdown(doc):
    s = doc["stacks"]
    lines = [f"# blk-switch interference ({doc['tapps']} T-app(s), {doc['reps']} interleaved reps of "
             f"{doc['runtime_s']} s, medians; target send budget {doc['send_budget']})", "",
             f"Paper: {PAPER}.", "",
             "| stack | L p50 alone / together (µs) | L p99 alone / together (µs) | L p99.9 alone / together (µs) | "
             "L p99 ratio | T MB/s alone / together | T keep |",
             "|---|---|---|---|---|---|---|"]
    for st in STACKS:
        x = s[st]
        lines.append(
            f"| {st} | {x['l_alone_lat_us_p50']:.1f} / {x['l_together_lat_us_p50']:.1f} | "
            f"{x['l_alone_lat_us_p99']:.1f} / {x['l_together_lat_us_p99']:.1f} | "
            f"{x['l_alone_lat_us_p99_9']:.1f} / {x['l_together_lat_us_p99_9']:.1f} | "
            f"{x['l_p99_ratio']:.2f} | {x['t_alone_mb_per_s']:.0f} / {x['t_together_mb_per_s']:.0f} | "
            f"{x['t_keep']:.2f} |")
    if "target_busy_together" in s["plain"]:
        lines += ["", "Target reactor busy (share of the bench command's wall time; setup and ramp included):", "",
                  "| stack | L alone | T alone | together |", "|---|---|---|---|"]
        for st in STACKS:
            x = s[st]
            lines.append(f"| {st} | {x['target_busy_l_alone']:.2f} | {x['target_busy_t_alone']:.2f} | "
                         f"{x['target_busy_together']:.2f} |")
    lines += checks_md(doc["checks"])
    return "\n".join(lines) + "\n"


def main():
    a = args()
    here = os.path.dirname(os.path.abspath(__file__))
    spec = tomllib.load(open(os.path.join(here, "jobs", "blkswitch", "l1t2.toml"), "rb"))
    glob = dict(spec["global"])
    glob["nqn"] = a.nqn
    glob["addr"] = a.addr or f"127.0.0.1:{a.port}"
    lapp = spec["job"][0]
    tapps = spec["job"][1:1 + a.tapps]
    if a.addr:
        # An external target's namespace may be small (the Linux VM's is
        # 256 MiB): 64 MiB per app.
        for i, j in enumerate([lapp] + tapps):
            j["offset"], j["size"] = f"{64 * i}m", "64m"
    runs = {st: [] for st in STACKS}
    with tempfile.TemporaryDirectory(prefix="trellis-blkswitch.") as work:
        t = None if a.addr else start_target(a, work)
        try:
            for r in range(a.reps):
                order = STACKS if r % 2 == 0 else STACKS[::-1]
                for st in order:
                    runs[st].append(one_rep(a, lapp, tapps, glob, st, work, r))
        finally:
            if t:
                t.stop()
    doc = {"paper": PAPER, "tapps": a.tapps, "reps": a.reps, "runtime_s": a.runtime,
           "target": a.addr or "trellis target (ram)", "send_budget": None if a.addr else a.send_budget,
           "stacks": {st: summarise(rs) for st, rs in runs.items()},
           "switch": runs["blk-switch"][-1]["switch"]}
    b, p = doc["stacks"]["blk-switch"], doc["stacks"]["plain"]
    doc["checks"] = [
        {"rule": f"blk-switch: L-app p99 together / alone <= {L_P99_RATIO_MAX}",
         "measured": b["l_p99_ratio"], "pass": b["l_p99_ratio"] <= L_P99_RATIO_MAX},
        {"rule": f"blk-switch: T-apps keep >= {T_KEEP_MIN:.0%} of alone",
         "measured": b["t_keep"], "pass": b["t_keep"] >= T_KEEP_MIN},
        {"rule": "plain: L-app p99 together / alone (the interference, reported)",
         "measured": p["l_p99_ratio"], "pass": True},
        {"rule": "plain: T-apps keep of alone (reported)", "measured": p["t_keep"], "pass": True},
    ]
    # The CDFs of the median-p99 rep of each stack and phase.
    curves = []
    for st in STACKS:
        for phase in ("l_alone", "l_together"):
            rs = sorted(runs[st], key=lambda r: r[phase]["lat_us_p99"])
            pick = rs[len(rs) // 2][phase]
            curves.append((f"{st}, {'alone' if phase == 'l_alone' else 'with T-apps'}", pick["lat_us_cdf"]))
    doc["l_cdf_us"] = {name: pts for name, pts in curves}
    json.dump(doc, open(os.path.join(a.out, "blkswitch.json"), "w"), indent=2)
    md = markdown(doc)
    open(os.path.join(a.out, "blkswitch.md"), "w").write(md)
    svg_cdf(curves, os.path.join(a.out, "blkswitch-cdf.svg"))
    print(md)


if __name__ == "__main__":
    main()
