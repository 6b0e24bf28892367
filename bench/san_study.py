#!/usr/bin/env python3
"""The study on the emulated SAN (issue 12, item 4): QD sweeps of 4 KiB random
reads and 128 KiB sequential writes from the client to one storage node,
switched (one client path) vs switchless (2x2 torus, 4 paths, ISR), with and
without a second tenant that loads one path; each point run for real on
`trellis san` and in `trellis sim` with the emulator's parameters.

- Emulated: `trellis san up switched|torus2d` with every link at --rate, one
  emulated pm9a3-gen4 drive per node (clean, time scale 1). The measured
  tenant runs `trellis bench` in h0 against st3 (san_sim.emu_bench: the
  switched SAN's one path, or the torus's 4 paths with --path-policy isr).
  The second tenant (san.noisy) streams 128 KiB sequential reads at QD16 over
  st3's one switched path, or over path 0 of the torus (st3's direct link).
- Reps: the fabrics alternate their order over the reps (A B / B A; only one
  SAN can be up at a time), and within a fabric each point's alone / with-
  tenant runs alternate too; medians over the reps.
- Simulated: san_sim.sim_config (link rate, per-hop cost, one pm9a3-gen4 per
  node, QoS off, ISR when switchless); the second tenant is a second job (128
  KiB sequential reads, QD16, to st3). `trellis sim` reports per direction,
  not per job, so a 4 KiB read beside the tenant's 128 KiB reads cannot be
  told apart there: those points have sim = null (the seqwrite points can:
  the tenant only reads).

- Time scale: --time-scale N makes every emulated drive N times slower
  (`trellis san up --time-scale`); the sim then runs the same system N times
  faster (links x N, hops / N, the real drive) and its figures are dilated
  back (latency x N, throughput / N), so the two stay comparable.

Writes san-study.json, san-study.md and san-study.svg to --out.
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import blkswitch as bx  # noqa: E402  (svg_xy)
import san  # noqa: E402  (noisy: the second tenant)
import san_sim  # noqa: E402  (emu_bench, sim_config, sim_run)

FABRICS = {"switched": "switched", "switchless": "torus2d"}
# name: (trellis bench --rw, --bs, bytes, sim read_pct, sim pattern, op in sim results)
WORKLOADS = {
    "randread-4k": ("randread", "4k", 4096, 100, "random", "read"),
    "seqwrite-128k": ("write", "128k", 131072, 0, "sequential", "write"),
}
QDS = {"randread-4k": [1, 4, 16, 64, 128, 256], "seqwrite-128k": [1, 4, 16, 64, 128]}
MAX_QUEUE_DEPTH = 128  # the target's default max_queue_depth
# Second-hand: [NSDI'26] as reported by a third-party summary (docs/sources.md),
# switchless vs switched average latency on the 4-node testbed, FIO.
PAPER = {"randread-4k": {"clean": -32.3, "fragmented": -43.1},
         "seqwrite-128k": {"clean": -18.0, "fragmented": -20.3}}
TENANT_ADDR = {"switched": f"10.81.1.{san_sim.TARGET + 1}:4420", "switchless": san.PATHS[0]}
GAP = 0.30
KNEE_GAIN = 0.10


def args():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--runtime", type=float, required=True)
    p.add_argument("--reps", type=int, required=True)
    p.add_argument("--rate-gbit", type=int, default=1)
    p.add_argument("--qds", default="", help="one list for both workloads (default: QDS)")
    p.add_argument("--sim-ms", type=int, default=1000, help="simulated ms per point")
    p.add_argument("--time-scale", type=int, default=1,
                   help="the emulated drives' --time-scale N (the sim runs the same system N times faster)")
    return p.parse_args()


def cpu_ticks(out):
    """Jiffies so far: the machine's (busy, softirq, total) from /proc/stat,
    and those of this study's `trellis` processes (the targets and the second
    tenant: their command lines name files under out)."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    own = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                st = open(f"/proc/{pid}/stat").read()
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            name, rest = st[st.index("(") + 1:st.rindex(")")], st[st.rindex(")") + 2:].split()
            if name == "trellis" and out in cmd:
                own += int(rest[11]) + int(rest[12])  # utime, stime
    # Children this process has waited for (the measured bench, through
    # `trellis san exec`), which /proc no longer lists.
    ch = os.times()
    hz = os.sysconf("SC_CLK_TCK")
    own += round((ch.children_user + ch.children_system) * hz)
    return {"busy": sum(f) - f[3] - f[4], "softirq": f[6], "total": sum(f), "trellis": own}


def cpu_share(t0, t1):
    """Fractions of the machine's CPU time (all vCPUs) between t0 and t1
    (taken while the second tenant, if any, still runs)."""
    tot = max(1, t1["total"] - t0["total"])
    return {k: max(0, t1[k] - t0[k]) / tot for k in ("busy", "softirq", "trellis")}


def emu_point(a, fabric, wl, qd, tenant2, tag):
    rw, bs, size, *_ = WORKLOADS[wl]
    n = None
    if tenant2:
        n = san.noisy(a, a.runtime + 2.5, TENANT_ADDR[fabric])
        time.sleep(1.0)
    load = os.getloadavg()[0]
    c0 = cpu_ticks(a.out)
    try:
        # The targets grant 128 commands per queue: deeper runs use more queues.
        queues = -(-qd // MAX_QUEUE_DEPTH)
        j = san_sim.emu_bench(a, FABRICS[fabric], qd, tag, rw=rw, bs=bs,
                              extra=["--queues", str(queues)] if queues > 1 else [])
        c1 = cpu_ticks(a.out)
    finally:
        if n:
            n.wait(timeout=a.runtime + 30)
    cpu = cpu_share(c0, c1)
    if j["errors"]:
        sys.exit(f"san_study: {tag}: {j['errors']} I/O errors")
    return {"iops": j["iops"], "mb_per_s": j["iops"] * size / 1e6, "lat_us_avg": j["lat_us_mean"],
            "lat_us_p999": j["lat_us_p99_9"], "cpu_busy": cpu["busy"], "cpu_softirq": cpu["softirq"],
            "cpu_trellis": cpu["trellis"], "loadavg_1m_before": load,
            "paths": [p["ios"] for p in j.get("paths") or []]}


def sim_point(a, fabric, wl, qd, tenant2):
    _, _, size, read_pct, pattern, op = WORKLOADS[wl]
    if tenant2 and op == "read":
        return None
    cfg = copy.deepcopy(a.sim_base[fabric])
    job = cfg["workload"]["jobs"][0]
    job.update({"name": wl, "read_pct": read_pct, "sizes": [[size, 1]], "pattern": pattern, "qd": qd,
                "targets": {"one": san_sim.TARGET}})
    if tenant2:
        t = copy.deepcopy(job)
        t.update({"name": "tenant2-read-128k", "read_pct": 100, "sizes": [[131072, 1]],
                  "pattern": "sequential", "qd": 16})
        cfg["workload"]["jobs"].append(t)
    # A drive N times slower behind the same links is, in time N times
    # shorter, the real drive behind links N times faster with hops N times
    # shorter: the sim runs that system, and its figures are dilated back.
    n = a.time_scale
    t = cfg["topology"]
    for k in ("host_gbps", "node_gbps"):
        t[k] *= n
    for k in ("adapter_hop_ns", "switch_hop_ns", "prop_ns"):
        t[k] = max(1, t[k] // n)
    r = san_sim.sim_run(a, cfg, f"{fabric}-{wl}-qd{qd}-{'t2' if tenant2 else 'alone'}",
                        duration_ms=a.sim_ms)[op]
    return {"iops": r["kiops"] * 1000 / n, "mb_per_s": r["mb_s"] / n, "lat_us_avg": r["lat_avg_us"] * n,
            "lat_us_p999": r["lat_p999_us"] * n}


def pct(new, old):
    return (new / old - 1) * 100 if old else None


def knees(rows):
    """Per (fabric, workload, tenant2): the last QD's throughput and average
    latency against the one before: past the knee when throughput grew by
    less than KNEE_GAIN while latency grew."""
    out = []
    for fabric in FABRICS:
        for wl in WORKLOADS:
            for t2 in (False, True):
                rs = sorted((r for r in rows if (r["fabric"], r["workload"], r["tenant2"]) == (fabric, wl, t2)),
                            key=lambda r: r["qd"])
                if len(rs) < 2:
                    continue
                p, q = rs[-2]["emu"], rs[-1]["emu"]
                gain, lat = q["mb_per_s"] / p["mb_per_s"], q["lat_us_avg"] / p["lat_us_avg"]
                out.append({"fabric": fabric, "workload": wl, "tenant2": t2, "qds": [rs[-2]["qd"], rs[-1]["qd"]],
                            "throughput_ratio": gain, "lat_avg_ratio": lat,
                            "past_knee": gain < 1 + KNEE_GAIN and lat > 1.3})
    return out


def cell(e, s, k, f):
    if s is None:
        return f"{f.format(e[k])} / –"
    mark = "*" if s[k] == 0 or abs(e[k] / s[k] - 1) > GAP else ""
    return f"{f.format(e[k])} / {f.format(s[k])}{mark}"


def markdown(doc):
    rows = doc["rows"]
    get = {(r["fabric"], r["workload"], r["qd"], r["tenant2"]): r for r in rows}
    lines = [f"# The study on the emulated SAN: QD sweeps, switched vs switchless (links {doc['rate_gbit']} Gbit/s, "
             f"drive time scale {doc['drive_time_scale']}, "
             f"st{san_sim.TARGET} from h0, {doc['reps']} rep(s) of {doc['runtime_s']} s, medians; "
             f"emulated / simulated, * = differ by more than {GAP:.0%}, – = not available)", "",
             "Paper: [NSDI'26], second-hand (third-party summary), switchless vs switched average latency "
             "on the 4-node testbed, FIO, clean / fragmented drives. Ours: clean emulated drives.", ""]
    for wl in WORKLOADS:
        thr, tf, scale = (("kIOPS", "{:.1f}", lambda x: x["iops"] / 1000) if wl.startswith("randread")
                          else ("MB/s", "{:.0f}", lambda x: x["mb_per_s"]))
        for t2 in (False, True):
            qds = sorted({r["qd"] for r in rows if r["workload"] == wl and r["tenant2"] == t2})
            if not qds:
                continue
            lines += [f"## {wl}, {'with the second tenant on one path' if t2 else 'alone'}", "",
                      f"| QD | switched {thr} | switched avg µs | switched p99.9 µs | switchless {thr} | "
                      "switchless avg µs | switchless p99.9 µs | switchless vs switched, avg (emu / sim) | "
                      "paper (clean / frag) |", "|---|---|---|---|---|---|---|---|---|"]
            p = doc["paper"][wl]
            for qd in qds:
                cells = [str(qd)]
                for fabric in FABRICS:
                    r = get.get((fabric, wl, qd, t2))
                    e = dict(r["emu"], thr=scale(r["emu"]))
                    s = dict(r["sim"], thr=scale(r["sim"])) if r["sim"] else None
                    cells += [cell(e, s, "thr", tf), cell(e, s, "lat_us_avg", "{:.0f}"),
                              cell(e, s, "lat_us_p999", "{:.0f}")]
                sw, sl = get[("switched", wl, qd, t2)], get[("switchless", wl, qd, t2)]
                emu = pct(sl["emu"]["lat_us_avg"], sw["emu"]["lat_us_avg"])
                sim = (pct(sl["sim"]["lat_us_avg"], sw["sim"]["lat_us_avg"]) if sl["sim"] and sw["sim"] else None)
                cells.append(f"{emu:+.1f} % / " + (f"{sim:+.1f} %" if sim is not None else "–"))
                cells.append(f"{p['clean']:+.1f} % / {p['fragmented']:+.1f} %")
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    lines += ["## Knees (emulated): the last QD against the one before", "",
              "| fabric | workload | second tenant | QDs | throughput × | avg latency × | past the knee |",
              "|---|---|---|---|---|---|---|"]
    for k in doc["knees"]:
        lines.append(f"| {k['fabric']} | {k['workload']} | {'yes' if k['tenant2'] else 'no'} | "
                     f"{k['qds'][0]} → {k['qds'][1]} | {k['throughput_ratio']:.2f} | {k['lat_avg_ratio']:.2f} | "
                     f"{'yes' if k['past_knee'] else 'NO'} |")
    if not doc["knees"]:
        lines += ["| (one QD only: no knee to tell) | | | | | | |"]
    lines += ["", "## CPU during the emulated runs: machine busy / the study's trellis processes / softirq (network "
              "forwarding), shares of both vCPUs, medians over reps", "",
              "| fabric | workload | second tenant | " + " | ".join(f"QD {q}" for q in doc["qds_all"]) + " |",
              "|---|---|---|" + "---|" * len(doc["qds_all"])]
    for fabric in FABRICS:
        for wl in WORKLOADS:
            for t2 in (False, True):
                cs = [get.get((fabric, wl, q, t2)) for q in doc["qds_all"]]
                if not any(cs):
                    continue
                lines.append(f"| {fabric} | {wl} | {'yes' if t2 else 'no'} | " +
                             " | ".join(f"{c['emu']['cpu_busy']:.0%} / {c['emu']['cpu_trellis']:.0%} / {c['emu']['cpu_softirq']:.0%}"
                                        if c else "" for c in cs) + " |")
    return "\n".join(lines) + "\n"


def svg(doc, path):
    colours = {("switched", "randread-4k"): "#1f77b4", ("switchless", "randread-4k"): "#d62728",
               ("switched", "seqwrite-128k"): "#2ca02c", ("switchless", "seqwrite-128k"): "#ff7f0e"}
    curves = []
    for wl in WORKLOADS:
        for fabric in FABRICS:
            for t2 in (False, True):
                rs = sorted((r for r in doc["rows"] if (r["fabric"], r["workload"], r["tenant2"]) == (fabric, wl, t2)),
                            key=lambda r: r["qd"])
                if rs:
                    curves.append((f"{fabric}, {wl}{', 2nd tenant' if t2 else ''}", colours[(fabric, wl)], t2,
                                   [(r["emu"]["mb_per_s"], r["emu"]["lat_us_avg"], f"{r['qd']}") for r in rs]))
    bx.svg_xy(curves, path, "throughput of the measured tenant (MB/s, log scale; points labelled with the QD)",
              "average latency (µs, log scale)")


def main():
    a = args()
    os.makedirs(a.out, exist_ok=True)
    qds = {wl: ([int(q) for q in a.qds.split(",")] if a.qds else QDS[wl]) for wl in WORKLOADS}
    runs = {}
    for rep in range(a.reps):
        order = list(FABRICS) if rep % 2 == 0 else list(FABRICS)[::-1]
        for fabric in order:
            st = san_sim.sh([a.bin, "san", "--state-dir", os.path.join(a.out, "state"), "up", FABRICS[fabric],
                             "--rate", f"{a.rate_gbit}gbit", "--backend", "emulated", "--size-mib", "256",
                             "--time-scale", str(a.time_scale)],
                            check=False)
            if st.returncode != 0:
                sys.exit(f"san_study: trellis san up {FABRICS[fabric]} failed:\n{st.stdout[-3000:]}")
            try:
                for wl in WORKLOADS:
                    for i, qd in enumerate(qds[wl]):
                        t2s = [False, True] if (rep + i) % 2 == 0 else [True, False]
                        for t2 in t2s:
                            tag = f"{fabric}-{wl}-qd{qd}-{'t2' if t2 else 'alone'}-{rep}"
                            r = emu_point(a, fabric, wl, qd, t2, tag)
                            runs.setdefault((fabric, wl, qd, t2), []).append(r)
                            print(f"{tag}: {r['iops']:.0f} IOPS, {r['mb_per_s']:.1f} MB/s, avg {r['lat_us_avg']:.0f} µs, "
                                  f"p99.9 {r['lat_us_p999']:.0f} µs, cpu {r['cpu_busy']:.0%}", flush=True)
            finally:
                san_sim.sh([a.bin, "san", "--state-dir", os.path.join(a.out, "state"), "down"], check=False)
    a.sim_base = {f: san_sim.sim_config(a, topo) for f, topo in FABRICS.items()}
    med = statistics.median
    doc = {"paper": PAPER,
           "paper_source": "[NSDI'26], second-hand (third-party summary), docs/sources.md",
           "rate_gbit": a.rate_gbit, "drive_time_scale": a.time_scale, "runtime_s": a.runtime, "reps": a.reps,
           "target": f"st{san_sim.TARGET}",
           "qds": qds, "qds_all": sorted({q for v in qds.values() for q in v}),
           "tenant2": "128 KiB sequential reads, QD16, over st3's switched path or torus path 0",
           "sim": {"adapter_hop_ns": 4500, "switch_hop_ns": 1250, "ssd": "pm9a3-gen4 x1 per node, clean",
                   "duration_ms": a.sim_ms,
                   "time_scale": "with a drive time scale N, the sim runs links x N and hops / N with the "
                                 "real drive, and its figures are dilated back (latency x N, throughput / N)",
                   "note": "null where the measured tenant and the second tenant both read: "
                           "trellis sim reports per direction, not per job"},
           "rows": []}
    for (fabric, wl, qd, t2), rs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][3], kv[0][2])):
        emu = {k: med(r[k] for r in rs) for k in ("iops", "mb_per_s", "lat_us_avg", "lat_us_p999", "cpu_busy",
                                                 "cpu_softirq", "cpu_trellis", "loadavg_1m_before")}
        emu["per_rep"] = {k: [r[k] for r in rs] for k in ("iops", "lat_us_avg", "lat_us_p999")}
        emu["paths_ios_rep0"] = rs[0]["paths"]
        doc["rows"].append({"fabric": fabric, "workload": wl, "qd": qd, "tenant2": t2, "emu": emu,
                            "sim": sim_point(a, fabric, wl, qd, t2)})
    doc["knees"] = knees(doc["rows"])
    del a.sim_base
    json.dump(doc, open(os.path.join(a.out, "san-study.json"), "w"), indent=2)
    md = markdown(doc)
    open(os.path.join(a.out, "san-study.md"), "w").write(md)
    svg(doc, os.path.join(a.out, "san-study.svg"))
    print(md)


if __name__ == "__main__":
    main()
