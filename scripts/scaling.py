#!/usr/bin/env -S /usr/bin/python3
"""scaling.py [BUILD] [--limits]: the planner's numbers behind docs/scaling.md (dsv4cp plan --json and
--memory-budget on V4-Flash, with recomputation, one thread per rank), printed as Markdown tables:
memory of the largest rank for 128K..4M tokens on 8..1024 ranks, what grows at a fixed shard
length, the longest sequence that fits 80 and 141 GiB, and the bytes each rank moves."""
import json
import os
import subprocess
import sys
import tempfile

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
EXE = os.path.join(BUILD, "dsv4cp")
GiB = 2.0 ** 30
KINDS = {0: "SWA", 4: "CSA", 128: "HCA"}


def plan(seq, ranks, budget=None, extra=()):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [EXE, "plan", "--seq", str(seq), "--ranks", str(ranks), "--recompute", "--json", f.name, *extra]
        if budget:
            cmd += ["--memory-budget", budget]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return json.load(open(f.name))


def worst(layer):
    return max((r["memory"] for r in layer["per_rank"]), key=lambda m: m["total"])


def sent(layer, kind):
    return max(r["messages"].get(kind, {}).get("bytes_sent", 0) for r in layer["per_rank"])


def main():
    seqs = [131072, 262144, 524288, 1048576, 2097152, 4194304]
    ranks = [8, 16, 32, 64, 128, 256, 512, 1024]
    print("### Memory of the largest rank (GiB), CSA / HCA / SWA, with recomputation\n")
    print("| tokens | " + " | ".join(f"N = {n}" for n in ranks) + " |")
    print("|---|" + "---|" * len(ranks))
    for s in seqs:
        cells = []
        for n in ranks:
            if s % n or s // n < 64:
                cells.append("-")
                continue
            p = plan(s, n)
            by = {l["ratio"]: worst(l)["total"] / GiB for l in p["layers"]}
            cells.append(f"{by[4]:.1f} / {by[128]:.1f} / {by[0]:.1f}")
        print(f"| {s // 1024}K | " + " | ".join(cells) + " |")
    print("\n### At a fixed shard of 4096 tokens per rank: what grows (CSA, largest rank, GiB)\n")
    print("| N | tokens | weights + grads | saved (replicated) | transient | total | slot all-gather sent per rank |")
    print("|---|---|---|---|---|---|---|")
    for n in ranks:
        p = plan(4096 * n, n)
        l = [x for x in p["layers"] if x["ratio"] == 4][0]
        m = worst(l)
        print(f"| {n} | {4096 * n // 1024}K | {(m['weights'] + m['grads']) / GiB:.2f} | {m['saved'] / GiB:.2f} "
              f"({m['replicated'] / GiB:.2f}) | {m['transient'] / GiB:.2f} | {m['total'] / GiB:.2f} | "
              f"{sent(l, 'slot_allgather') / GiB:.2f} GiB |")
    print("\n### Longest sequence that fits (tokens), largest rank, with recomputation\n")
    print("| N | CSA in 80 GiB | CSA in 141 GiB | CSA zigzag in 80 GiB | CSA zigzag in 141 GiB | HCA in 80 GiB | "
          "HCA in 141 GiB | SWA in 80 GiB | SWA in 141 GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in ranks:
        fit = {}
        for b in ("80G", "141G"):
            p = plan(4096 * n, n, b)
            for l in p["layers"]:
                fit[(l["ratio"], b)] = l["longest_fit_tokens"]
            p = plan(4096 * n, n, b, ("--split", "zigzag", "--layer", "2"))
            fit[("zz", b)] = p["layers"][0]["longest_fit_tokens"]
        print(f"| {n} | " + " | ".join(f"{fit[(r, b)] / 2**20:.2f}M" for r in (4, "zz", 128, 0) for b in ("80G", "141G"))
              + " |")


if __name__ == "__main__" and (len(sys.argv) < 3 or sys.argv[2] != "--limits"):
    main()


def limits():
    """CSA's per-rank memory as c + b S/N + a S (a: the O(S) bytes per token of the whole sequence a
    rank holds: replicated compressed kv and indexer keys, their gathered buffers, and in the backward
    the exact sums of their gradients), fitted to three plans; then the longest sequence on 1024 ranks
    of 80 / 141 GiB."""
    pts = [(4096 * 64, 64), (4096 * 1024, 1024), (4194304, 256)]
    rows, rhs = [], []
    for S, N in pts:
        p = plan(S, N)
        rows.append([1.0, S / N, float(S)])
        rhs.append(worst([l for l in p["layers"] if l["ratio"] == 4][0])["total"])
    import numpy as np
    c, b, a = np.linalg.solve(np.array(rows), np.array(rhs))
    print(f"\nCSA per rank ~ {c / GiB:.2f} GiB + {b / 1024:.1f} KiB per local token + {a:.0f} B per token of the whole "
          "sequence (fitted to three plans).\n")
    print("| CSA, 1024 ranks | O(S) bytes per token | longest in 80 GiB | longest in 141 GiB |")
    print("|---|---|---|---|")
    fits = [(bud * GiB - c) / (b / 1024 + a) for bud in (80, 141)]
    print(f"| as built (fp32, fetch then select, exact gradient sums) | {a:.0f} | {fits[0] / 2**20:.0f}M | "
          f"{fits[1] / 2**20:.0f}M |")


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[2] == "--limits":
    limits()
