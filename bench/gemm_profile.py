#!/usr/bin/env -S /usr/bin/python3
"""gemm_profile.py BINARY SITES RUN_JSONL: the table of bench/gemm_profile.sh. For the last timed
forward + backward of `dsv4cp bench` (rank 0's file under mpirun): each GEMM call site (the library
function that called util/gemm.c, and its line), its shapes (M x N x K rounded up to powers of two),
calls, GFLOP, seconds and GFLOP/s against the reference sgemm timed just before the run; then the
GEMMs' share of the run and what is left outside them (softmax, norms, RoPE, gathers, exact adds,
top-k, copies, messages)."""
import collections
import json
import subprocess
import sys


def main():
    binary, sites, runs = sys.argv[1:4]
    try:
        rows = [line.split() for line in open(sites)]
    except FileNotFoundError:  # under mpirun: rank 0's
        rows = [line.split() for line in open(sites + ".0")]
    run = [json.loads(line) for line in open(runs)][-1]
    addrs = sorted({r[0] for r in rows})
    out = subprocess.run(["addr2line", "-f", "-s", "-e", binary] + addrs, capture_output=True, text=True).stdout
    lines = out.split("\n")
    name = {a: lines[2 * i].split(".")[0] + ":" + lines[2 * i + 1].split(":")[-1].split(" ")[0]
            for i, a in enumerate(addrs)}
    ref_s = ref_f = 0.0
    agg = collections.defaultdict(lambda: [0.0, 0.0, 0, set()])
    for a, kind, m, n, k, sec, fl, calls, ref in rows:
        if ref == "1":
            ref_s += float(sec)
            ref_f += float(fl)
            continue
        g = agg[(name[a], kind)]
        g[0] += float(sec)
        g[1] += float(fl)
        g[2] += int(calls)
        g[3].add(f"{m}x{n}x{k}")
    ref_rate = ref_f / ref_s / 1e9 if ref_s else float("nan")
    wall = run["fwd_s"] + run["bwd_s"]
    print(f"dsv4cp bench layers {run['layers']} seq {run['seq']} ranks {run['ranks']} {run['split']}"
          f"{' recompute' if run['recompute'] else ''}: fwd + bwd {wall:.2f} s, {run['fraction_of_sgemm'] * 100:.1f}% "
          f"of the reference sgemm ({ref_rate:.1f} GFLOP/s, {run['seq']} tokens)")
    print(f"{'call site':<44} {'':2} {'calls':>7} {'GFLOP':>8} {'s':>7} {'GF/s':>6} {'ref':>5}  shapes (M x N x K)")
    tot_s = tot_f = 0.0
    for (site, kind), (sec, fl, calls, shapes) in sorted(agg.items(), key=lambda kv: -kv[1][0]):
        tot_s += sec
        tot_f += fl
        print(f"{site:<44} {kind:2} {calls:>7} {fl / 1e9:>8.1f} {sec:>7.3f} {fl / sec / 1e9:>6.1f} "
              f"{fl / sec / 1e9 / ref_rate * 100:>4.0f}%  {' '.join(sorted(shapes))[:60]}")
    print(f"{'GEMMs':<47} {'':>7} {tot_f / 1e9:>8.1f} {tot_s:>7.3f} {tot_f / tot_s / 1e9:>6.1f} "
          f"{tot_f / tot_s / 1e9 / ref_rate * 100:>4.0f}%  ({tot_s / wall * 100:.1f}% of the run)")
    print(f"{'outside the GEMMs':<47} {'':>7} {'':>8} {wall - tot_s:>7.3f} {'':>6} {'':>5}  "
          f"({(wall - tot_s) / wall * 100:.1f}% of the run)")
    counted = (run["gflop_fwd"] + run["gflop_bwd"]) / run["ranks"]  # a rank's share
    print(f"FLOPs the formula counts ({'per rank' if run['ranks'] > 1 else 'the layer'}): {counted:.1f} GFLOP; the GEMMs"
          f" did {tot_f / 1e9:.1f} (+{(tot_f / 1e9 / counted - 1) * 100:.1f}%: the KL logits, padding rows, recomputation)")


if __name__ == "__main__":
    main()
