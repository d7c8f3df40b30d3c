#!/usr/bin/env -S /usr/bin/python3
"""test_bench_smoke.py: a few seconds of the benchmark machinery (not a timing test): dsv4cp bench
with CP = 1 and CP = 2 on the tiny preset writes its JSON record, measured bytes (sent, and saved for
the backward) equal the plan, and report.py turns the records into the report and plots; dsv4cp plan
prints every message kind."""
import argparse
import json
import os
import re
import shutil
import sys

import testlib as T


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default="build")
    a = p.parse_args()
    out = os.path.join(T.golden_dir(a.build), "bench")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    res = os.path.join(out, "results.jsonl")
    # the last two: randomly packed documents (any length) with windows straddling rank boundaries
    runs = ((1, 1, []), (2, 1, []), (2, 2, []), (3, 1, ["--doc-lengths", "5:40"]),
            (4, 2, ["--doc-lengths", "50:300", "--split", "zigzag"]), (2, 1, ["--recompute"]))
    for n, layer, extra in runs:
        rc, o, e = T.cli(a.build, ["bench", "--preset", "tiny", "--layer", str(layer), "--seq", "768", "--reps", "1",
                                   "--threads", "1", "--sgemm-size", "256", "--json", res] + extra, nranks=n, timeout=120)
        T.check(rc == 0, f"bench smoke N={n} layer {layer} {' '.join(extra)} runs", (e or o).strip()[-200:])
    recs = [json.loads(l) for l in open(res)] if os.path.exists(res) else []
    T.check(len(recs) == len(runs) and all(r["gflops"] > 0 and r["fwd_s"] > 0 for r in recs),
            "bench smoke: JSON records", f"{len(recs)} records")
    rc, o, e = T.cli(a.build, ["info"])
    m = re.search(r"openblas kernels: (\S+)", o)
    core = m.group(1) if m else "?"
    T.check(recs and all(r.get("blas_kernels") == core for r in recs),
            "bench smoke: each record names the OpenBLAS kernels (as dsv4cp info does)",
            f"{core} vs {sorted({r.get('blas_kernels') for r in recs})}")
    multi = [r for r in recs if r["ranks"] > 1]
    T.check(multi and all(r["bytes_match_plan"] is True for r in multi), "bench smoke: measured bytes == plan",
            str([r["bytes_match_plan"] for r in multi]))
    def work_ok(r):  # the spread in work at each rank's own speed, from the per-rank records
        w = [q["busy_s"] * q["sgemm_gflops"] for q in r["per_rank"]]
        g = [q["sgemm_gflops"] for q in r["per_rank"]]
        return (min(g) > 0 and abs(r["work_spread"] - max(w) / min(w)) < 1e-2 * r["work_spread"] and
                abs(r["core_spread"] - max(g) / min(g)) < 1e-2 * r["core_spread"])
    T.check(multi and all(work_ok(r) for r in multi),
            "bench smoke: each rank's own reference sgemm, and the spreads of the cores and of busy time x core speed",
            str([(r.get("core_spread"), r.get("work_spread")) for r in multi]))
    T.check(recs and all(r["saved_bytes_match_plan"] is True for r in recs),
            "bench smoke: bytes saved for the backward == plan (every rank, with and without recomputation)",
            str([r["saved_bytes_match_plan"] for r in recs]))
    T.check(len(recs) == len(runs) and recs[-1]["recompute"] is True and 0 < recs[-1]["saved_activation_mb"] <
            recs[1]["saved_activation_mb"], "bench smoke: --recompute keeps fewer activations than the default",
            str([(r.get("recompute"), r.get("saved_activation_mb")) for r in recs]))
    rc, o, e = T.run([T.PYTHON, os.path.join(T.ROOT, "bench", "report.py"), out], timeout=120)
    T.check(rc == 0 and os.path.exists(os.path.join(out, "report.txt")) and
            f"OpenBLAS kernels: {core})" in open(os.path.join(out, "report.txt")).read() and
            all(os.path.exists(os.path.join(out, f)) for f in ("time_vs_length.png", "scaling.png", "bytes_per_rank.png")),
            "bench smoke: report.py writes the report and plots", e.strip()[-200:])
    rc, o, e = T.cli(a.build, ["plan", "--preset", "flash", "--seq", "4096", "--ranks", "4"])
    T.check(rc == 0 and "slot_allgather" in o and "window_halo" in o and "compressor_halo" in o,
            "plan prints every message kind of each layer kind", e.strip()[-200:])
    # cluster sizing: 1M tokens on 64 ranks, compact (<= 160 columns), full detail in JSON
    pj = os.path.join(out, "plan.json")
    rc, o, e = T.cli(a.build, ["plan", "--seq", "1048576", "--ranks", "64", "--recompute", "--json", pj,
                               "--memory-budget", "80G"])
    width = max((len(l) for l in o.splitlines()), default=0)
    T.check(rc == 0 and width <= 160 and len(o.splitlines()) < 60 and o.count("longest sequence") == 3,
            f"plan at 1M tokens and 64 ranks: {len(o.splitlines())} lines of at most {width} columns, a fit per kind",
            e.strip()[-200:])
    try:
        plan = json.load(open(pj))
        mems = [r["memory"] for l in plan["layers"] for r in l["per_rank"]]
        ok = (len(plan["layers"]) == 3 and all(len(l["per_rank"]) == 64 for l in plan["layers"]) and
              all(m["total"] == m["weights"] + m["grads"] + m["saved"] + m["transient"] + m["io"] and
                  m["replicated"] <= m["saved"] for m in mems))
    except (OSError, ValueError, KeyError) as ex:
        ok, mems = False, str(ex)
    T.check(ok, "plan --json: every rank of every layer kind, memory parts adding up to the total")
    try:  # contiguous at 1M tokens: CSA's indexer and HCA's attention grow with the position, SWA's do not
        bal = {l["ratio"]: [r["flops"]["fwd"] + r["flops"]["bwd"] for r in l["per_rank"]] for l in plan["layers"]}
        skew = {k: max(v) / (sum(v) / len(v)) for k, v in bal.items()}
        ok = o.count("work per rank") == 3 and skew[4] > 1.5 and skew[128] > 1.5 and skew[0] < 1.01
    except (NameError, TypeError, ValueError, KeyError, ZeroDivisionError) as ex:
        ok, skew = False, str(ex)
    T.check(ok, "plan: each rank's work (the FLOP formula over its rows), contiguous at 1M tokens on 64 ranks: max / "
            f"mean {skew}")

    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
