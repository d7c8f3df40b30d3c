#!/usr/bin/env -S /usr/bin/python3
"""report.py OUT: turns bench/out/results.jsonl (dsv4cp bench) and peer.jsonl (bench/peer.py) into
report.txt (fixed-width tables and the issue's targets), report.json, and three plots:
time_vs_length.png, scaling.png, bytes_per_rank.png."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KINDS = {0: "SWA (r=0)", 4: "CSA (r=4)", 128: "HCA (r=128)"}
TARGET_SGEMM, TARGET_PEER_SPEED, TARGET_PEER_MEM, TARGET_CP2, TARGET_HIDDEN = 0.75, 1.5, 3.0, 1.8, 0.80
# recomputation: saved activations >= 4x smaller, <= 15% slower, >= half the cut visible in peak RSS,
# at 8192 peak memory <= 1/3 of the peer; packed documents within 5% of the aligned speed
TARGET_RC_SAVED, TARGET_RC_TIME, TARGET_RC_VISIBLE, TARGET_RC_PEER, TARGET_PACKED = 4.0, 1.15, 0.5, 3.0, 0.95


def load(path):
    rows = []
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def find(rows, ratio, seq, ranks, split="contiguous", recompute=False, packed=False):
    """The run of one configuration: default rows are one document without recomputation."""
    for r in rows:
        if (r["ratio"] == ratio and r["seq"] == seq and r["ranks"] == ranks and r["split"] == split and
                bool(r.get("recompute", False)) == recompute and
                (r.get("packing", "one document") != "one document") == packed):
            return r
    return None


def peer_of(peers, ratio, seq):
    for p in peers:
        if p.get("ratio") == ratio and p.get("seq") == seq and "fwdbwd_median" in p:
            return p
    return None


def main(out):
    res, peers = load(os.path.join(out, "results.jsonl")), load(os.path.join(out, "peer.jsonl"))
    longs = load(os.path.join(out, "results_long.jsonl"))
    seqs = sorted({r["seq"] for r in res})
    lines = ["dsv4cp benchmark: V4-Flash layer, forward + backward, one thread per rank", ""]
    hdr = (f"{'kind':<12} {'seq':>5} {'N':>2} {'split':<10} {'fwd s':>8} {'bwd s':>8} {'tok/s':>7} {'GFLOP/s':>8} "
           f"{'%sgemm':>7} {'RSS MB':>7} {'act MB':>7} {'spread':>6} {'hidden':>7} {'plan':>4}")
    lines += [hdr, "-" * len(hdr)]
    for seq in seqs:
        for ratio in KINDS:
            for ranks, split in ((1, "contiguous"), (2, "contiguous"), (2, "zigzag")):
                r = find(res, ratio, seq, ranks, split)
                if not r:
                    continue
                hid = f"{100 * r['allgather_hidden_fraction']:.0f}%" if r["allgather_hidden_fraction"] >= 0 else "-"
                plan = {True: "yes", False: "NO", None: "-"}[r.get("bytes_match_plan")]
                lines.append(f"{KINDS[ratio]:<12} {seq:>5} {ranks:>2} {split:<10} {r['fwd_s']:>8.2f} {r['bwd_s']:>8.2f} "
                             f"{r['tokens_per_s']:>7.0f} {r['gflops']:>8.1f} {100 * r['fraction_of_sgemm']:>6.1f}% "
                             f"{r['peak_rss_mb']:>7.0f} {r['saved_activation_mb']:>7.0f} {r['busy_spread']:>6.2f} "
                             f"{hid:>7} {plan:>4}")
            p = peer_of(peers, ratio, seq)
            if p:
                lines.append(f"{KINDS[ratio]:<12} {seq:>5} {'':>2} {'PyTorch':<10} {p['fwd_median']:>8.2f} "
                             f"{p['fwdbwd_median'] - p['fwd_median']:>8.2f} {seq / p['fwdbwd_median']:>7.0f} "
                             f"{'':>8} {'':>7} {p['peak_rss_bytes'] / 2**20:>7.0f}")
            elif any(q.get("ratio") == ratio and q.get("seq") == seq for q in peers):
                err = [q for q in peers if q.get("ratio") == ratio and q.get("seq") == seq][0].get("error", "failed")
                lines.append(f"{KINDS[ratio]:<12} {seq:>5} {'':>2} {'PyTorch':<10} {err[:60]}")
    kernels = ", ".join(sorted({r.get("blas_kernels", "?") for r in res}))
    lines += ["", "sgemm reference: cblas_sgemm 2048^3 measured in each run with the same threads "
              f"(median over runs: {median([r['sgemm_gflops_per_rank'] for r in res]):.1f} GFLOP/s per rank; "
              f"OpenBLAS kernels: {kernels})", ""]
    lines += recompute_table(res, peers) + packed_table(res) + v41_table(res) + long_table(longs)
    lines += targets(res, peers, longs)
    text = "\n".join(lines) + "\n"
    open(os.path.join(out, "report.txt"), "w").write(text)
    json.dump({"results": res, "peer": peers}, open(os.path.join(out, "report.json"), "w"), indent=1)
    plots(res, peers, out)
    print(text)


def median(v):
    v = sorted(x for x in v if x == x)
    return v[len(v) // 2] if v else float("nan")


def recompute_table(res, peers):
    """Recomputation next to the default (CP = 1, same run)."""
    out = ["recomputation (CP = 1): saved activations, time and peak memory against the default",
           "(slower: wall time; sgemm: against the sgemm measured next to each run, as %sgemm)", "",
           f"{'kind':<12} {'seq':>5} {'act MB':>7} {'rc act':>7} {'smaller':>7} {'fwd+bwd s':>9} {'rc s':>8} "
           f"{'slower':>7} {'sgemm':>7} {'RSS MB':>7} {'rc RSS':>7} {'cut seen':>8} {'peer RSS':>8} {'peer/rc':>7}",
           "-" * 112]
    for seq in sorted({r["seq"] for r in res}):
        for ratio in KINDS:
            d, rc = find(res, ratio, seq, 1), find(res, ratio, seq, 1, recompute=True)
            if not d or not rc:
                continue
            t_d, t_rc = d["fwd_s"] + d["bwd_s"], rc["fwd_s"] + rc["bwd_s"]
            cut = d["saved_activation_mb"] - rc["saved_activation_mb"]
            seen = (d["peak_rss_mb"] - rc["peak_rss_mb"]) / cut if cut > 0 else float("nan")
            p = peer_of(peers, ratio, seq)
            peer = p["peak_rss_bytes"] / 2**20 if p else float("nan")
            vs_sgemm = d["fraction_of_sgemm"] / rc["fraction_of_sgemm"]
            out.append(f"{KINDS[ratio]:<12} {seq:>5} {d['saved_activation_mb']:>7.0f} {rc['saved_activation_mb']:>7.0f} "
                       f"{d['saved_activation_mb'] / rc['saved_activation_mb']:>6.2f}x {t_d:>9.2f} {t_rc:>8.2f} "
                       f"{100 * (t_rc / t_d - 1):>6.1f}% {100 * (vs_sgemm - 1):>6.1f}% "
                       f"{d['peak_rss_mb']:>7.0f} {rc['peak_rss_mb']:>7.0f} "
                       f"{100 * seen:>7.0f}% {peer:>8.0f} {peer / rc['peak_rss_mb']:>6.2f}x")
    return out + [""]


def packed_table(res):
    """Randomly packed documents (50..3000 tokens) next to one document, CP = 2, same run."""
    out = ["packed documents (lengths drawn from 50..3000 tokens) against one document, CP = 2", "",
           f"{'kind':<12} {'seq':>5} {'docs':>5} {'GFLOP/s':>8} {'aligned':>8} {'ratio':>6} {'%sgemm':>7} {'aligned':>8} "
           f"{'plan':>4}", "-" * 72]
    for seq in sorted({r["seq"] for r in res}):
        for ratio in KINDS:
            a, p = find(res, ratio, seq, 2), find(res, ratio, seq, 2, packed=True)
            if not a or not p:
                continue
            plan = {True: "yes", False: "NO", None: "-"}[p.get("bytes_match_plan")]
            out.append(f"{KINDS[ratio]:<12} {seq:>5} {p['packing'].split()[0]:>5} {p['gflops']:>8.1f} {a['gflops']:>8.1f} "
                       f"{p['fraction_of_sgemm'] / a['fraction_of_sgemm']:>6.3f} {100 * p['fraction_of_sgemm']:>6.1f}% "
                       f"{100 * a['fraction_of_sgemm']:>7.1f}% {plan:>4}")
    return out + [""]


def sent_per_rank(r):
    """The largest rank's bytes sent per forward + backward, every message kind."""
    return max(sum(m["bytes_sent"] for m in pr["messages"].values()) for pr in r["per_rank"])


def v41_table(res):
    """DeepSeek V4.1-Flash source groups (dsv4cp bench --layers): time, fraction of sgemm, and the
    bytes each rank sends per layer of the group next to a V4 CSA layer's at the same length."""
    rows = [r for r in res if r.get("preset") == "v41"]
    if not rows:
        return []
    out = ["V4.1-Flash source groups (a kv source and the layers reading its compressed kv), forward + backward",
           f"{'layers':<8} {'seq':>5} {'N':>2} {'fwd s':>8} {'bwd s':>8} {'tok/s':>7} {'GFLOP/s':>8} {'%sgemm':>7} "
           f"{'RSS MB':>7} {'KiB/rank':>9} {'per layer':>9} {'V4 CSA':>7} {'plan':>4}"]
    for r in sorted(rows, key=lambda r: (r["layers"], r["seq"], r["ranks"])):
        a, b = (int(v) for v in r["layers"].split("-"))
        n_lay = b - a + 1
        sent = sent_per_rank(r) / 1024 if r["ranks"] > 1 else 0
        csa = find(res, 4, r["seq"], r["ranks"])
        csa_s = f"{sent_per_rank(csa) / 1024:>7.0f}" if csa and r["ranks"] > 1 else f"{'-':>7}"
        plan = {True: "yes", False: "NO", None: "-"}[r.get("bytes_match_plan")]
        out.append(f"{r['layers']:<8} {r['seq']:>5} {r['ranks']:>2} {r['fwd_s']:>8.2f} {r['bwd_s']:>8.2f} "
                   f"{r['tokens_per_s']:>7.0f} {r['gflops']:>8.1f} {100 * r['fraction_of_sgemm']:>6.1f}% "
                   f"{r['peak_rss_mb']:>7.0f} {sent:>9.0f} {sent / n_lay:>9.0f} {csa_s} {plan:>4}")
    return out + [""]


def long_table(longs):
    """make bench-long: long sequences with recomputation, and the planner's memory next to the measured."""
    if not longs:
        return []
    out = ["long context (make bench-long): one forward + backward, recomputation, no warm-up", "",
           f"{'kind':<12} {'seq':>6} {'N':>2} {'fwd s':>8} {'bwd s':>8} {'tok/s':>7} {'GFLOP/s':>8} {'RSS MB':>7} "
           f"{'base MB':>7} {'planned':>7} {'measured':>8} {'plan/meas':>9}", "-" * 100]
    for r in longs:
        meas = r.get("rss_above_base_mb", float("nan"))
        out.append(f"{KINDS[r['ratio']]:<12} {r['seq']:>6} {r['ranks']:>2} {r['fwd_s']:>8.1f} {r['bwd_s']:>8.1f} "
                   f"{r['tokens_per_s']:>7.0f} {r['gflops']:>8.1f} {r['peak_rss_mb']:>7.0f} {r.get('rss_base_mb', 0):>7.0f} "
                   f"{r.get('planned_mb', 0):>7.0f} {meas:>8.0f} {r.get('planned_mb', 0) / meas:>9.3f}")
    return out + ["  (RSS MB: peak resident memory of the largest rank; measured = peak minus the runtime's base before",
                  "   the layer's first allocation; planned = dsv4cp plan --recompute's total for that rank)", ""]


def work_note(*rows):
    """The spreads again in work at each rank's own speed (busy time times the reference sgemm its core
    ran), when the ranks' cores differ in speed: the code's imbalance without the machine's."""
    if not all(r.get("work_spread", 0) > 0 for r in rows) or max(r.get("core_spread", 1) for r in rows) <= 1.03:
        return ""
    works = ", ".join(f"{r['work_spread']:.3f}" for r in rows)
    return (f" (the cores' sgemm differ by up to {max(r['core_spread'] for r in rows):.3f}x; in work at each "
            f"rank's own speed: {works})")


def targets(res, peers, longs=()):
    """The issue's targets, each with the figure it was judged on."""
    t = ["targets:"]

    def line(ok, what, detail):
        t.append(f"  [{'met ' if ok else 'MISS'}] {what}: {detail}")

    for ratio in KINDS:
        r1 = find(res, ratio, 4096, 1)
        if r1:
            line(r1["fraction_of_sgemm"] >= TARGET_SGEMM, f"{KINDS[ratio]} S=4096 CP=1 >= 75% of sgemm",
                 f"{100 * r1['fraction_of_sgemm']:.1f}% ({r1['gflops']:.1f} of {r1['sgemm_gflops_per_rank']:.1f} GFLOP/s)")
    for ratio in KINDS:
        for seq in sorted({r["seq"] for r in res}):
            r1, p = find(res, ratio, seq, 1), peer_of(peers, ratio, seq)
            if r1 and p:
                ours = r1["fwd_s"] + r1["bwd_s"]
                line(p["fwdbwd_median"] / ours >= TARGET_PEER_SPEED, f"{KINDS[ratio]} S={seq} vs PyTorch speed >= 1.5x",
                     f"{p['fwdbwd_median'] / ours:.2f}x ({p['fwdbwd_median']:.1f} s vs {ours:.1f} s)")
                mem = p["peak_rss_bytes"] / 2**20 / r1["peak_rss_mb"]
                line(mem >= TARGET_PEER_MEM, f"{KINDS[ratio]} S={seq} vs PyTorch peak memory >= 3x less",
                     f"{mem:.2f}x ({p['peak_rss_bytes'] / 2**20:.0f} MB vs {r1['peak_rss_mb']:.0f} MB)")
    for ratio in KINDS:
        for seq in sorted({r["seq"] for r in res}):
            r1, r2 = find(res, ratio, seq, 1), find(res, ratio, seq, 2)
            if r1 and r2:
                sp = (r1["fwd_s"] + r1["bwd_s"]) / (r2["fwd_s"] + r2["bwd_s"])
                line(sp >= TARGET_CP2, f"{KINDS[ratio]} S={seq} CP=2 >= 1.8x faster than CP=1", f"{sp:.2f}x")
                act = r2["saved_activation_mb"] / r1["saved_activation_mb"]
                line(act <= 0.55, f"{KINDS[ratio]} S={seq} activation memory per rank falls as 1/N",
                     f"CP=2 / CP=1 = {act:.3f} ({r2['saved_activation_mb']:.0f} of {r1['saved_activation_mb']:.0f} MB)")
                if r2["allgather_hidden_fraction"] >= 0:
                    line(r2["allgather_hidden_fraction"] >= TARGET_HIDDEN, f"{KINDS[ratio]} S={seq} all-gather hidden >= 80%",
                         f"{100 * r2['allgather_hidden_fraction']:.0f}% "
                         f"(blocking all-gather {1e3 * r2['allgather_blocking_s']:.2f} ms)")
                z = find(res, ratio, seq, 2, "zigzag")
                if z:
                    t.append(f"  [info] {KINDS[ratio]} S={seq} per-rank busy-time spread (max/min): contiguous "
                             f"{r2['busy_spread']:.3f}, zigzag {z['busy_spread']:.3f}{work_note(r2, z)}")
    for ratio in KINDS:
        for seq in sorted({r["seq"] for r in res}):
            d, rc = find(res, ratio, seq, 1), find(res, ratio, seq, 1, recompute=True)
            if not d or not rc:
                continue
            k = f"{KINDS[ratio]} S={seq} recomputation"
            sm = d["saved_activation_mb"] / rc["saved_activation_mb"]
            line(sm >= TARGET_RC_SAVED, f"{k}: saved activations >= 4x smaller", f"{sm:.2f}x")
            # judged against the sgemm measured next to each run, as every %sgemm figure here (both rows
            # count the same FLOPs: recomputation counts nothing), so a drifting machine is compared
            # with itself; the wall-time ratio is shown beside it
            sl = d["fraction_of_sgemm"] / rc["fraction_of_sgemm"]
            wall = (rc["fwd_s"] + rc["bwd_s"]) / (d["fwd_s"] + d["bwd_s"])
            line(sl <= TARGET_RC_TIME, f"{k}: at most 15% slower",
                 f"{100 * (sl - 1):+.1f}% against each run's sgemm ({100 * (wall - 1):+.1f}% in wall time)")
            cut = d["saved_activation_mb"] - rc["saved_activation_mb"]
            seen = (d["peak_rss_mb"] - rc["peak_rss_mb"]) / cut
            line(seen >= TARGET_RC_VISIBLE, f"{k}: >= half the saved cut visible in peak RSS",
                 f"{100 * seen:.0f}% ({d['peak_rss_mb'] - rc['peak_rss_mb']:.0f} of {cut:.0f} MB)")
            p = peer_of(peers, ratio, seq)
            if p and seq == 8192:
                pr = p["peak_rss_bytes"] / 2**20 / rc["peak_rss_mb"]
                line(pr >= TARGET_RC_PEER, f"{k}: peak memory <= 1/3 of the PyTorch peer",
                     f"{pr:.2f}x ({rc['peak_rss_mb']:.0f} MB vs {p['peak_rss_bytes'] / 2**20:.0f} MB)")
    for ratio in KINDS:
        for seq in sorted({r["seq"] for r in res}):
            a, p = find(res, ratio, seq, 2), find(res, ratio, seq, 2, packed=True)
            if a and p:
                q = p["fraction_of_sgemm"] / a["fraction_of_sgemm"]
                line(q >= TARGET_PACKED, f"{KINDS[ratio]} S={seq} CP=2 packed documents within 5% of the aligned speed",
                     f"{100 * p['fraction_of_sgemm']:.1f}% vs {100 * a['fraction_of_sgemm']:.1f}% of sgemm ({q:.3f})")
    plans = [r.get("bytes_match_plan") for r in list(res) + list(longs) if r["ranks"] > 1]
    if plans:
        line(all(plans), "measured bytes per rank and message kind == dsv4cp plan",
             f"{sum(1 for p in plans if p)} of {len(plans)} multi-rank runs match exactly")
    saved = [r["saved_bytes_match_plan"] for r in res if "saved_bytes_match_plan" in r]
    if saved:
        line(all(saved), "bytes saved for the backward per rank == dsv4cp plan",
             f"{sum(1 for v in saved if v)} of {len(saved)} runs match exactly")
    return t


def plots(res, peers, out):
    seqs = sorted({r["seq"] for r in res})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, ratio in zip(axes, KINDS):
        for ranks, split, style in ((1, "contiguous", "o-"), (2, "contiguous", "s-"), (2, "zigzag", "^--")):
            pts = [(s, find(res, ratio, s, ranks, split)) for s in seqs]
            pts = [(s, r["fwd_s"] + r["bwd_s"]) for s, r in pts if r]
            if pts:
                ax.plot(*zip(*pts), style, label=f"dsv4cp CP={ranks} {split if ranks > 1 else ''}".strip())
        pts = [(s, peer_of(peers, ratio, s)) for s in seqs]
        pts = [(s, p["fwdbwd_median"]) for s, p in pts if p]
        if pts:
            ax.plot(*zip(*pts), "x:", label="PyTorch peer (1 thread)")
        ax.set_title(f"{KINDS[ratio]}: forward + backward")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("seconds")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "time_vs_length.png"), dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.2))
    labels, cont, zig = [], [], []
    for ratio in KINDS:
        for s in seqs:
            r1, r2, z = find(res, ratio, s, 1), find(res, ratio, s, 2), find(res, ratio, s, 2, "zigzag")
            if r1 and r2:
                labels.append(f"{KINDS[ratio].split()[0]} {s}")
                t1 = r1["fwd_s"] + r1["bwd_s"]
                cont.append(t1 / (r2["fwd_s"] + r2["bwd_s"]))
                zig.append(t1 / (z["fwd_s"] + z["bwd_s"]) if z else 0)
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], cont, 0.4, label="CP=2 contiguous")
    ax.bar([i + 0.2 for i in x], zig, 0.4, label="CP=2 zigzag")
    ax.axhline(2.0, color="gray", lw=0.8, ls="--")
    ax.axhline(TARGET_CP2, color="red", lw=0.8, ls=":", label="target 1.8x")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=30, fontsize=8)
    ax.set_ylabel("speed-up over CP=1")
    ax.set_title("scaling with N (2 cores, one thread per rank)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scaling.png"), dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 4.2))
    s = 4096 if 4096 in seqs else (seqs[-1] if seqs else 0)
    kinds = ["window_halo", "compressor_halo", "slot_allgather", "loss_reduce", "meta_check", "window_halo_bwd",
             "compressor_halo_bwd", "slot_reduce_scatter"]
    for i, ratio in enumerate(KINDS):
        r2 = find(res, ratio, s, 2)
        if not r2:
            continue
        vals = [max(pr["messages"][k]["bytes_sent"] for pr in r2["per_rank"]) / 1024 for k in kinds]
        ax.bar([j + 0.27 * (i - 1) for j in range(len(kinds))], vals, 0.27, label=KINDS[ratio])
    ax.set_xticks(range(len(kinds)))
    ax.set_xticklabels(kinds, rotation=30, fontsize=8)
    ax.set_ylabel("KiB sent per rank (max over ranks)")
    ax.set_yscale("symlog")
    ax.set_title(f"bytes per rank and message kind, S={s}, CP=2")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bytes_per_rank.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/out")
