#!/usr/bin/env -S /usr/bin/python3
"""test_determinism.py: the training step's bits do not depend on the thread count or on
recomputation (docs/spec.md section 6.3). For each case and each CP degree and split, `dsv4cp run
--grad-output` with 1 and 2 OpenMP threads, with and without --recompute, writes the same bytes for
every tensor: out, topk_ids, indexer_loss, dx and every weight gradient. Cases: every V4 kind (SWA,
CSA, HCA), an unpadded packing whose documents straddle the ranks, and a V4.1 range (a kv source,
its readers, r = 1 and r = 2).

Across CP degrees (N = 2, 3, both splits; 4 and 8 on the unpadded packing) every tensor, the
rank-summed weight gradients included, is byte for byte the N = 1 run's, and so it is when the
weight products move rows instead of sums between ranks (DSV4_WGRAD_ROWS=always: the path longer
V4-Flash products take at short lengths; these tiny shapes never would), and when a weight block's
panel products are summed one panel at a time through exact sums in memory (DSV4_WGRAD_GROUP=1:
what streams of more than 8 panels do) instead of in one pass, and when a recomputed backward adds
its products chunk by chunk into double sums instead of keeping their rows (DSV4_WGRAD_KEEP=sums).
Under CSA the heavier ranks move the attention of their last rows to lighter ones; every CP run
above does so where the plan says, and on the unpadded packing the moves are checked to happen
(--stats) and to give the bytes of the same run without them (DSV4_OFFLOAD=0)."""
import argparse
import itertools
import os
import sys
import tempfile

import testlib as T

sys.path.insert(0, T.REF)
import numpy as np  # noqa: E402
import st  # noqa: E402

CASES = {  # the same names and arguments as test_cp.py: the generated cases are shared
    "cp_swa_packed": "--ratio 0 --layer 0 --seed 46 --docs 16:16,12:9,20:20",
    "cp_csa_doc_boundary": "--ratio 4 --layer 2 --seed 41 --docs 24:24,24:20",
    "cp_hca_packed": "--ratio 128 --layer 3 --seed 47 --docs 512:500,256:256",
}
UNPADDED = ("cp_csa_unpadded_mix", "--ratio 4 --layer 2 --seed 71 --topk 5 "
            "--docs 1,2,3,5,7:6,9,11,12,13:10,4,6,10,3,1,8,9:2,4,12:7")
V41 = ["--preset", "tiny41", "--layers", "0-9", "--seq", "96", "--seed", "7"]


def same_bytes(a, b):
    """Names of the tensors whose bytes differ (or that only one file has)."""
    ka, kb = set(a), set(b)
    diff = sorted(ka ^ kb)
    for k in sorted(ka & kb):
        x, y = np.ascontiguousarray(a[k]), np.ascontiguousarray(b[k])
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            diff.append(k)
    return diff


def run_one(build, base_args, n, split, threads, recompute, out, env=None):
    args = ["run"] + base_args + ["--split", split, "--threads", str(threads), "--quiet", "--output", out]
    if recompute:
        args.append("--recompute")
    rc, _, err = T.cli(build, args, nranks=n, env={"OMP_NUM_THREADS": str(threads), **(env or {})})
    return rc, err.strip().splitlines()[-1] if err.strip() else ""


def same_as(build, base_args, n, split, threads, recompute, env, out, ref, label):
    """One run with a path forced through the environment: every tensor byte for byte ref's."""
    rc, err = run_one(build, base_args, n, split, threads, recompute, out, env)
    if T.check(rc == 0, f"determinism: {label} runs", err) and ref is not None:
        diff = same_bytes(ref, st.read(out))
        T.check(not diff, f"determinism: {label}: every tensor byte for byte N=1's", "differ: " + " ".join(diff[:6]))


def matrix(build, name, base_args, configs, tmp):
    """Per (N, split): every (threads, recompute) variant byte for byte the (1 thread, default)
    run; then every (N, split) baseline byte for byte N = 1's."""
    base = {}
    for n, split in configs:
        ref = None
        for threads, recompute in itertools.product((1, 2), (0, 1)):
            out = os.path.join(tmp, f"{name}_n{n}_{split}_t{threads}_r{recompute}.st")
            rc, err = run_one(build, base_args, n, split, threads, recompute, out)
            label = f"{name} N={n} {split} threads={threads}{' --recompute' if recompute else ''}"
            if not T.check(rc == 0, f"determinism: {label} runs", err):
                continue
            got = st.read(out)
            if ref is None:
                ref = got
                base[(n, split)] = got
                continue
            diff = same_bytes(ref, got)
            T.check(not diff, f"determinism: {label}: every tensor's bytes equal threads=1 default "
                              f"({len(got)} tensors)", "differ: " + " ".join(diff[:6]))
    one = base.get((1, "contiguous"))

    def forced(n, split, threads, recompute, env, tag, what):
        out = os.path.join(tmp, f"{name}_n{n}_{split}_t{threads}_r{recompute}_{tag}.st")
        label = f"{name} N={n} {split} threads={threads}{' --recompute' if recompute else ''} {what}"
        same_as(build, base_args, n, split, threads, recompute, env, out, one, label)

    # the weight products' other path under CP (rows to the block's owner instead of exact sums
    # reduced; what longer V4-Flash streams take): the same bytes
    for n, split in [c for c in configs if c[0] > 1][:2]:
        for threads, recompute in ((1, 0), (2, 1)):
            forced(n, split, threads, recompute, {"DSV4_WGRAD_ROWS": "always"}, "rows", "weight rows path")
    # weight sums kept in memory between groups of one panel (what streams of more than 8 panels
    # take; the default adds a block's panels in one pass): the same bytes
    for (n, split), (threads, recompute) in zip(configs[:2], ((2, 1), (1, 0))):
        forced(n, split, threads, recompute, {"DSV4_WGRAD_GROUP": "1"}, "g1", "one panel per group")
    # a recomputed backward's chunk-by-chunk weight products into double sums (what V4-Flash takes
    # from about 420 (SWA, HCA) or 490 (CSA) rows per rank on; these tiny shapes keep the rows): the
    # same bytes; and under zigzag, whose half panels' stashed rows go to their panels' owners as
    # they lie (gather_partials)
    zig = [c for c in configs[2:] if c[1] == "zigzag"][:1]
    for (n, split), threads in zip(configs[:2] + zig, (2, 1, 1)):
        forced(n, split, threads, 1, {"DSV4_WGRAD_KEEP": "sums"}, "sums", "products into double sums")
    if one is not None:
        for (n, split), got in base.items():
            if n == 1:
                continue
            diff = same_bytes(one, got)
            T.check(not diff, f"determinism: {name} N={n} {split}: every tensor (forward, top-k, losses, dx, weight "
                              f"gradients) byte for byte N=1's", "differ: " + " ".join(diff[:6]))


def offload_bytes(err):
    """Bytes each rank sent in the attention offload's messages (forward, backward), from --stats."""
    got = {}
    for line in err.splitlines():
        f = line.split()
        if len(f) >= 6 and f[0] in ("attn_offload", "attn_offload_bwd"):
            got.setdefault(f[0], 0)
            got[f[0]] += int(f[2])
    return got.get("attn_offload", 0), got.get("attn_offload_bwd", 0)


def offload(build, name, base_args, tmp, one, configs=((2, "zigzag"), (3, "contiguous"), (4, "zigzag"))):
    """The attention rows a heavier rank moves to a lighter one (docs/cp.md, "Attention offload"):
    they do move (--stats counts their bytes, forward and backward), and the results are the same
    bytes with the move turned off (DSV4_OFFLOAD=0, which moves none) and as at N = 1."""
    for n, split in configs:
        outs = []
        for env in ({}, {"DSV4_OFFLOAD": "0"}):
            out = os.path.join(tmp, f"{name}_off_n{n}_{split}_{len(env)}.st")
            rc, so, err = T.cli(build, ["run"] + base_args + ["--split", split, "--threads", "1", "--stats", "--output",
                                                              out], nranks=n, env=env)
            label = f"{name} N={n} {split}{' DSV4_OFFLOAD=0' if env else ''}"
            if not T.check(rc == 0, f"offload: {label} runs", err.strip()[-300:]):
                return
            fwd, bwd = offload_bytes(so)
            if env:
                T.check(fwd == 0 and bwd == 0, f"offload: {label} moves nothing", f"{fwd} + {bwd} bytes")
            else:
                T.check(fwd > 0 and bwd > 0, f"offload: {label} moves attention rows ({fwd} B forward, {bwd} B "
                                             f"backward)")
            outs.append(st.read(out))
        diff = same_bytes(outs[0], outs[1]) + (same_bytes(one, outs[0]) if one is not None else ["(no N=1 run)"])
        T.check(not diff, f"offload: {name} N={n} {split}: with and without the move, and N=1, every tensor the same "
                          f"bytes", "differ: " + " ".join(diff[:6]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    light = T.sanitized()  # the sanitizer pass: fewer configurations (each run is ~5x slower)
    with tempfile.TemporaryDirectory() as tmp:
        cases = dict(CASES)
        cases[UNPADDED[0]] = UNPADDED[1]
        if light:
            cases = {k: cases[k] for k in ("cp_csa_doc_boundary", UNPADDED[0])}
        for name, args in cases.items():
            d, layer = T.make_case(a.build, name, args)
            configs = [(1, "contiguous"), (2, "contiguous")] if light else \
                [(1, "contiguous"), (2, "contiguous"), (2, "zigzag"), (3, "contiguous")]
            if name == UNPADDED[0] and not light:  # T = 120: 15-row shards at N = 8
                configs += [(4, "zigzag"), (8, "contiguous")]
            matrix(a.build, name, T.case_files(d, layer), configs, tmp)
            if name == UNPADDED[0] and not light:
                one = os.path.join(tmp, f"{name}_n1_contiguous_t1_r0.st")
                offload(a.build, name, T.case_files(d, layer), tmp, st.read(one) if os.path.exists(one) else None)
        # the attention offload over several row chunks (a part per chunk: 768 rows per rank at N = 2);
        # one document, so the contiguous split's later ranks are heavier by more than the planner's 2%
        if not light:
            long_csa = ["--preset", "tiny", "--layer", "1", "--seq", "1536", "--seed", "5"]
            fwd = os.path.join(tmp, "long_fwd.st")
            rc, _, err = T.cli(a.build, ["run"] + long_csa + ["--quiet", "--output", fwd])
            if T.check(rc == 0, "determinism: tiny CSA 1536 forward for the shapes", err.strip()):
                dout = os.path.join(tmp, "long_dout.st")
                rng = np.random.default_rng(5)
                st.write(dout, {"dout": rng.standard_normal(st.read(fwd)["out"].shape).astype(np.float32)})
                one = os.path.join(tmp, "long_one.st")
                rc, err = run_one(a.build, long_csa + ["--grad-output", dout], 1, "contiguous", 1, 0, one)
                if T.check(rc == 0, "determinism: tiny CSA 1536 N=1 runs", err):
                    offload(a.build, "tiny_csa_1536", long_csa + ["--grad-output", dout], tmp, st.read(one),
                            ((2, "contiguous"), (3, "contiguous"), (4, "contiguous")))
                    # recomputed into double sums over 512-row panels that shards cut: rank 1's
                    # chunks (rows 768 - 1279, then 1280 - 1535) complete panel 2 between them, and
                    # the zigzag rank 1 (rows 384 - 1151) panel 1; such a panel goes into the sums
                    # when its last rows come, the shared ones at the end: the same bytes
                    for n, split in ((2, "contiguous"), (2, "zigzag")):
                        same_as(a.build, long_csa + ["--grad-output", dout], n, split, 1, 1,
                                {"DSV4_WGRAD_KEEP": "sums"}, os.path.join(tmp, f"long_sums_{n}_{split}.st"),
                                st.read(one), f"tiny CSA 1536 N={n} {split} --recompute, products into double sums")
        # V4.1: the forward once for the shapes, then dout.{L} for every layer of the range
        fwd = os.path.join(tmp, "v41_fwd.st")
        rc, _, err = T.cli(a.build, ["run"] + V41 + ["--quiet", "--output", fwd])
        if T.check(rc == 0, "determinism: v41 forward for the shapes", err.strip()):
            rng = np.random.default_rng(3)
            outs = {k: v for k, v in st.read(fwd).items() if k.startswith("out.")}
            dout = os.path.join(tmp, "v41_dout.st")
            st.write(dout, {"dout." + k[4:]: rng.standard_normal(v.shape).astype(np.float32) for k, v in outs.items()})
            matrix(a.build, "v41_tiny", V41 + ["--grad-output", dout],
                   [(1, "contiguous"), (2, "contiguous")] if light else [(1, "contiguous"), (2, "zigzag")], tmp)
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
