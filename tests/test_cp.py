#!/usr/bin/env -S /usr/bin/python3
"""test_cp.py: context parallelism end to end. Every case runs with CP = 1 and under
`mpirun -np N` (N = 2, 3, 4 for the padded cases; up to 8 for the unpadded ones; contiguous and
zigzag splits), forward and backward, and is compared
  - with the CP = 1 output: out, top-k and the KL loss bitwise (when this BLAS gives a row the same
    bits at any position of a call under the CLI's kernels, see util/gemm.h and `dsv4cp info`), dx
    1e-5 and rank-summed weight gradients 1e-4 relative (SPEC 6);
  - with the float64 PyTorch reference (SPEC 8).
Splits that SPEC 5 forbids (only T % N, or T % 2N for zigzag) and bad packing meta must fail
loudly: a non-zero exit with one error line on EVERY rank, within seconds. Also: a randomized sweep
of 160 packings in one `mpirun -np 8` (tests/c/mpitest_cp_sweep.c), random packings against the
reference, `dsv4cp check`, the SGD loss equivalence of `dsv4cp train`, and the library-level
checks of tests/c/mpitest_cp_agree.c (ranks given different inputs; the int64 reduce-scatters; the
weight gradients' sums between ranks on weights of several blocks)."""
import argparse
import json
import os
import platform
import random
import re
import sys
import time

import numpy as np

import testlib as T

# name -> gen_case arguments. Tiny dims (gen_case defaults: d 32, 4 heads x 16, window 8, top-k 4).
CP_CASES = {
    # rank boundaries at a document boundary (N = 2), inside documents (N = 3, 4)
    "cp_csa_doc_boundary": "--ratio 4 --layer 2 --seed 41 --docs 24:24,24:20",
    # N = 2: the boundary at 24 falls inside document 0's padding (real 20 of 32)
    "cp_csa_pad_boundary": "--ratio 4 --layer 2 --seed 42 --docs 32:20,16:16",
    # one document over every rank; W - 1 = 7 > L = 4 at N = 4 (the halo spans two ranks)
    "cp_csa_long_doc": "--ratio 4 --layer 2 --seed 43 --docs 16:16",
    # W - 1 = 19 > L: the window halo spans up to 3 ranks, clamped at the document start
    "cp_csa_wide_window": "--ratio 4 --layer 2 --seed 44 --window 20 --docs 48:48",
    "cp_swa_tiny_shards": "--ratio 0 --layer 0 --seed 45 --window 8 --docs 8:8,4:3",
    "cp_swa_packed": "--ratio 0 --layer 0 --seed 46 --docs 16:16,12:9,20:20",
    "cp_hca_packed": "--ratio 128 --layer 3 --seed 47 --docs 512:500,256:256",
    "cp_csa_batch": "--ratio 4 --layer 2 --seed 48 --batch 2 --seq 32",
    "cp_hca_batch": "--ratio 128 --layer 3 --seed 49 --batch 2 --seq 512",
    "cp_csa_topk_large": "--ratio 4 --layer 2 --seed 50 --topk 64 --docs 32:32,16:14",
    "cp_csa_ties": "--ratio 4 --layer 2 --seed 51 --ties --topk 6 --docs 64:64,32:30",
    "cp_csa_dense": "--ratio 4 --layer 2 --seed 52 --loss-mode dense --docs 32:32,16:13",
}
RANKS = (2, 3, 4)

# Unpadded packings (SPEC 4: any document length and start) -> the rank counts each runs with.
# Documents of 1 .. 3r tokens put compression windows across 1, 2 and 3 rank boundaries.
UNPADDED_CASES = {
    # lengths 1..13 (every tail length of r = 4), a mix of padded and unpadded documents, T = 120
    "cp_csa_unpadded_mix": ("--ratio 4 --layer 2 --seed 71 --topk 5 "
                            "--docs 1,2,3,5,7:6,9,11,12,13:10,4,6,10,3,1,8,9:2,4,12:7", (2, 3, 5, 6, 8)),
    # shards shorter than r: L = 3 at N = 8 (a slot and its previous window span 3 ranks), L = 4 at 6
    "cp_csa_short_shards": ("--ratio 4 --layer 2 --seed 72 --window 5 --docs 24", (3, 6, 8)),
    # r = 128, one document over 65-row shards at N = 6: a window spans up to 3 ranks
    "cp_hca_straddle": ("--ratio 128 --layer 3 --seed 73 --window 16 --docs 390:385", (2, 3, 5, 6)),
    # batch with S % r != 0, windows straddling ranks inside each sequence
    "cp_csa_batch_unaligned": ("--ratio 4 --layer 2 --seed 74 --batch 3 --seq 30", (2, 3, 5)),
    "cp_hca_batch_unaligned": ("--ratio 128 --layer 3 --seed 75 --batch 2 --seq 200", (2, 4, 5, 8)),
    # W - 1 > L with unaligned documents; dense KL loss
    "cp_csa_wide_window_dense": ("--ratio 4 --layer 2 --seed 76 --window 20 --loss-mode dense --docs 7,30:29,11",
                                 (2, 3, 4, 6, 8)),
    "cp_swa_unpadded": ("--ratio 0 --layer 0 --seed 77 --docs 5,1,9:4,13", (2, 4, 7)),
}
FAIL_SECONDS = 30  # a loud failure must end the whole job well within this


def shard_ok(T_total, seq, batched, n, zigzag):
    """Whether SPEC 5 allows this split (unit = the stream, or each sequence when batched): the unit
    must divide into N slices (2N chunks for zigzag); nothing else is required."""
    unit = seq if batched else T_total
    return unit % (2 * n if zigzag else n) == 0


def case_shape(d):
    x = T.load(os.path.join(d, "in.safetensors"))["x"]
    if x.ndim == 3:
        return x.shape[0] * x.shape[1], x.shape[1], True
    return x.shape[0], x.shape[0], False


def expect_loud_failure(name, rc, err, n, seconds):
    lines = [l for l in err.splitlines() if l.startswith("dsv4cp: error:")]
    ok = rc != 0 and len(lines) == n and len(set(lines)) == 1 and seconds < FAIL_SECONDS
    return T.check(ok, name, f"exit {rc}, {len(lines)}/{n} ranks printed one error line in {seconds:.1f} s"
                   + (f" ({lines[0][15:]})" if lines else f" stderr: {err.strip()[-200:]}"))


def run_one(build, d, layer, label):
    """The case's CP = 1 run, checked against the float64 reference: its output path, or None."""
    one = os.path.join(d, "cp1.safetensors")
    rc, out, err = T.cli(build, ["run"] + T.case_files(d, layer) + ["--output", one])
    if not T.check(rc == 0, f"{label} N=1 runs", err.strip()[-200:]):
        return None
    ok, line = T.compare_ref(one, os.path.join(d, "exp.safetensors"), label)
    T.check(ok, f"{label} N=1 vs float64 reference", line)
    return one


def run_case(build, name, args, bitwise, ranks=RANKS, ref_each=True):
    """CP = 1 against the reference, then every N in ranks and both splits against CP = 1 (and,
    with ref_each, each against the reference too). A split SPEC 5 forbids must fail loudly."""
    d, layer = T.make_case(build, name, args)
    total, seq, batched = case_shape(d)
    one = run_one(build, d, layer, f"cp {name}")
    if one is None:
        return
    for n in ranks:
        for zigzag in (False, True):
            if zigzag and n == 3 and ref_each:
                continue
            tag = f"cp {name} N={n}{' zigzag' if zigzag else ''}"
            outp = os.path.join(d, f"cp{n}{'z' if zigzag else ''}.safetensors")
            cmd = ["run"] + T.case_files(d, layer) + ["--output", outp] + (["--split", "zigzag"] if zigzag else [])
            t0 = time.time()
            rc, out, err = T.cli(build, cmd, nranks=n, timeout=120)
            if not shard_ok(total, seq, batched, n, zigzag):
                expect_loud_failure(f"{tag} rejected loudly", rc, err, n, time.time() - t0)
                continue
            if not T.check(rc == 0, f"{tag} runs", err.strip()[-300:]):
                continue
            fails = T.compare_cp(outp, one, tag, bitwise)
            T.check(not fails, f"{tag} vs CP=1 ({'bitwise forward' if bitwise else 'tolerance'})", "; ".join(fails))
            if ref_each:
                ok, line = T.compare_ref(outp, os.path.join(d, "exp.safetensors"), name)
                T.check(ok, f"{tag} vs float64 reference", line)


def test_recompute_bytes(build):
    """`run --recompute` writes byte for byte the file `run` writes, at N = 1 and 2 (every layer kind,
    a stream of several backward chunks and documents of any length)."""
    x = os.path.join(T.golden_dir(build), "rc_in.safetensors")
    g = os.path.join(T.golden_dir(build), "rc_dout.safetensors")
    rng = np.random.default_rng(7)
    T.st.write(x, {"x": rng.standard_normal((2600, 64)).astype(np.float32),
                   "cu_seqlens": np.array([0, 700, 1503, 2599, 2600], dtype=np.int32)})
    T.st.write(g, {"dout": rng.standard_normal((2600, 64)).astype(np.float32)})
    for layer in (0, 1, 2):
        for n in (1, 2):
            files = []
            for flag in ([], ["--recompute"]):
                out = os.path.join(T.golden_dir(build), f"rc{layer}_{n}{'r' if flag else ''}.safetensors")
                rc, o, e = T.cli(build, ["run", "--preset", "tiny", "--layer", str(layer), "--input", x,
                                         "--grad-output", g, "--output", out] + flag, nranks=n, timeout=300)
                files.append(out if rc == 0 else None)
            same = all(files) and open(files[0], "rb").read() == open(files[1], "rb").read()
            T.check(same, f"cp run --recompute == run byte for byte: tiny layer {layer}, N={n}")


def test_input_memory(build, bitwise):
    """The CLI scales with N: each rank reads only its own rows of x and dout (byte ranges), and rank 0
    writes the gathered file one piece at a time, so per-rank peak memory for 128 MiB inputs falls
    as 1/N (a wide model, d = 4096, with tiny attention dims: the inputs dominate)."""
    d = os.path.join(T.golden_dir(build), "io")
    os.makedirs(d, exist_ok=True)
    cfg = {"hidden_size": 4096, "num_attention_heads": 2, "head_dim": 16, "qk_rope_head_dim": 8, "q_lora_rank": 8,
           "o_groups": 1, "o_lora_rank": 8, "sliding_window": 8, "compress_ratios": [0]}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    rng = np.random.default_rng(3)
    T.st.write(os.path.join(d, "in.safetensors"), {"x": rng.standard_normal((8192, 4096)).astype(np.float32)})
    T.st.write(os.path.join(d, "g.safetensors"), {"dout": rng.standard_normal((8192, 4096)).astype(np.float32)})
    peak, outs = {}, {}
    for n in (1, 4):
        outs[n] = os.path.join(d, f"out{n}.safetensors")
        rc, out, err = T.cli(build, ["run", "--config", os.path.join(d, "config.json"), "--layer", "0", "--input",
                                     os.path.join(d, "in.safetensors"), "--grad-output", os.path.join(d, "g.safetensors"),
                                     "--output", outs[n], "--stats"], nranks=n, timeout=300)
        mib = [float(m.group(1)) for m in re.finditer(r"peak resident memory ([0-9.]+) MiB", out)]
        peak[n] = max(mib) if rc == 0 and len(mib) == n else None
        if not T.check(peak[n] is not None, f"cp input memory: N={n} runs and reports each rank's peak memory",
                       err.strip()[-200:]):
            return
    if T.sanitized():  # ASan's quarantine keeps freed buffers resident (256 MiB by default): no 1/N to see
        print(f"note: cp input memory ratio not judged in the sanitizer pass ({peak[4]:.0f} vs {peak[1]:.0f} MiB)")
    else:
        T.check(peak[4] < 0.45 * peak[1],
                f"cp input memory: 4 x 128 MiB of x, dout, out, dx per rank fall as 1/N (largest rank "
                f"{peak[4]:.0f} MiB at N=4 against {peak[1]:.0f} MiB at N=1)")
    fails = T.compare_cp(outs[4], outs[1], "io", bitwise)
    T.check(not fails, "cp input memory: the file rank 0 streams at N=4 equals N=1's", "; ".join(fails))
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            os.remove(os.path.join(d, f))


def test_sweep(build, bitwise):
    """160 random packings (any document lengths, batches, N = 1..8, both splits) in one
    `mpirun -np 8`: each CP = N result against CP = 1 computed by the same ranks."""
    exe = os.path.join(build, "tests", "mpitest_cp_sweep")
    # the sanitizer pass: 16 (8 sanitized ranks on 2 cores: 40 took 105 s of its 25-minute budget;
    # the normal pass runs all 160)
    iters = "160" if not T.sanitized() else "16"
    t0 = time.time()
    rc, out, err = T.run(["mpirun", "--quiet", "--oversubscribe", "--allow-run-as-root", "-np", "8", exe, iters, "1"],
                         timeout=600)
    lines = [l for l in out.splitlines() if l.startswith(("PASS", "FAIL"))]
    fails = [l for l in lines if l.startswith("FAIL")]
    for l in fails[:20]:
        T.check(False, "cp sweep: " + l[5:])
    if not bitwise:
        print("note: the sweep demands bitwise forwards; this BLAS is not position invariant")
    T.check(rc == 0 and len(lines) == int(iters) and not fails,
            f"cp sweep: {len(lines) - len(fails)} of {iters} random packings equal CP = 1 ({time.time() - t0:.0f} s)",
            (err.strip()[-300:] if rc else ""))


def random_docs(rng, ratio, pieces):
    """A random packing (padded:real list) of total length divisible by pieces."""
    unit = ratio or 8
    docs = []
    for _ in range(rng.randint(1, 3 if ratio == 128 else 8)):
        padded = rng.randint(1, 3 * unit)
        real = rng.randint(1, padded) if rng.random() < 0.3 else padded
        docs.append((padded, real))
    total = sum(p for p, _ in docs)
    if total % pieces:
        docs.append((pieces - total % pieces,) * 2)
    return ",".join(f"{p}:{r}" for p, r in docs)


def test_random_against_reference(build, bitwise, count=6):
    """A sample of random packings through the float64 reference: CP = 1 against it, and one random
    CP = N (N <= 8, random split) against CP = 1."""
    rng = random.Random(2026)
    for i in range(count):
        ratio = rng.choice((0, 4, 4, 128))
        n = rng.randint(2, 8)
        zigzag = rng.random() < 0.5
        docs = random_docs(rng, ratio, 2 * n if zigzag else n)
        layer = {0: 0, 4: 2, 128: 3}[ratio]
        name = f"cp_random_{i}"
        args = f"--ratio {ratio} --layer {layer} --seed {80 + i} --window {rng.randint(1, 20)} --docs {docs}"
        d, _ = T.make_case(build, name, args)
        one = run_one(build, d, layer, f"{name} (r={ratio} docs {docs})")
        if one is None:
            continue
        outp = os.path.join(d, "cpn.safetensors")
        rc, out, err = T.cli(build, ["run"] + T.case_files(d, layer) + ["--output", outp]
                             + (["--split", "zigzag"] if zigzag else []), nranks=n, timeout=120)
        tag = f"{name} N={n}{' zigzag' if zigzag else ''}"
        if T.check(rc == 0, f"{tag} runs", err.strip()[-200:]):
            fails = T.compare_cp(outp, one, tag, bitwise)
            T.check(not fails, f"{tag} vs CP=1", "; ".join(fails))


def test_loud_failures(build):
    """What SPEC 5 forbids (and bad packing meta), on random or file input: every rank must print
    the same error and exit."""
    bad = [
        ("T % N != 0", ["--preset", "tiny", "--layer", "0", "--seq", "50"], 4, "multiple of 4 (e.g. pad to 52)"),
        ("zigzag needs T % 2N", ["--preset", "tiny", "--layer", "1", "--seq", "36", "--split", "zigzag"], 4,
         "multiple of 8"),
        ("batched S % N", ["--preset", "tiny", "--layer", "2", "--seq", "10", "--batch", "2"], 4, "sequence length"),
    ]
    d, layer = T.make_case(build, "cp_csa_doc_boundary", CP_CASES["cp_csa_doc_boundary"])
    inp = T.load(os.path.join(d, "in.safetensors"))
    x, cu, real = inp["x"], inp["cu_seqlens"], inp["seqlens_real"]
    def with_input(tag, tensors):
        path = os.path.join(T.golden_dir(build), f"bad_{tag}.safetensors")
        T.st.write(path, tensors)
        a = T.case_files(d, layer, grad=False)
        a[a.index("--input") + 1] = path
        return a
    not_inc = cu.copy()
    not_inc[1] = not_inc[2]
    bad.append(("cu_seqlens not increasing", with_input("inc", {"x": x, "cu_seqlens": not_inc}), 2, "cu_seqlens"))
    short = cu.copy()
    short[-1] -= 2
    bad.append(("cu_seqlens not ending at T", with_input("end", {"x": x, "cu_seqlens": short}), 2, "cu_seqlens ends"))
    over = real.copy()
    over[0] = cu[1] - cu[0] + 1
    bad.append(("seqlens_real above the padded length", with_input("real", {"x": x, "cu_seqlens": cu, "seqlens_real": over}),
                2, "seqlens_real[0]"))
    zero = real.copy()
    zero[1] = 0
    bad.append(("seqlens_real zero", with_input("real0", {"x": x, "cu_seqlens": cu, "seqlens_real": zero}), 3,
                "seqlens_real[1]"))
    for what, args, n, expect in bad:
        t0 = time.time()
        rc, out, err = T.cli(build, ["run"] + args + ["--output", os.path.join(T.golden_dir(build), "bad.safetensors")],
                             nranks=n, timeout=2 * FAIL_SECONDS)
        if expect_loud_failure(f"cp loud failure: {what}", rc, err, n, time.time() - t0):
            T.check(expect in err, f"cp loud failure: {what} names the problem", err.strip().splitlines()[0][:160])


def test_agreement(build):
    """Library level: ranks that disagree on their inputs all get an error, nobody hangs; the int64
    reduce-scatters and the weight gradients' sums between ranks give one rank's bits."""
    exe = os.path.join(build, "tests", "mpitest_cp_agree")
    for n in (2, 3):
        t0 = time.time()
        rc, out, err = T.run(["mpirun", "--quiet", "--oversubscribe", "--allow-run-as-root", "-np", str(n), exe],
                             timeout=2 * FAIL_SECONDS)
        for line in out.splitlines():
            if line.startswith(("PASS", "FAIL")):
                T.check(line.startswith("PASS"), f"agreement N={n}: {line[5:]}")
        T.check(rc == 0 and time.time() - t0 < FAIL_SECONDS, f"agreement N={n} program exits cleanly",
                f"exit {rc}, {time.time() - t0:.1f} s {err.strip()[-200:]}")


def mpmd(exe, fams, args):
    """One mpirun with a process per kernel family, each given OPENBLAS_CORETYPE=family."""
    cmd = ["mpirun", "--quiet", "--oversubscribe", "--allow-run-as-root"]
    for i, fam in enumerate(fams):
        cmd += ([":"] if i else []) + ["-np", "1", "-x", f"OPENBLAS_CORETYPE={fam}", exe] + args
    return cmd


def test_mixed_blas(build):
    """Ranks whose OpenBLAS kernels round differently (OPENBLAS_CORETYPE differs between them) would
    give results within tolerance of CP = 1 but not its bits, top-k ids included: the agreement check
    makes every rank fail at once, naming rank 0's family and the first rank whose differs."""
    if platform.machine() not in ("x86_64", "AMD64"):
        print("note: mixed-kernel check skipped (the kernel family names are x86's)")
        return
    exe = os.path.join(build, "dsv4cp")
    args = ["run", "--preset", "tiny", "--layer", "1", "--seq", "96", "--quiet",
            "--output", os.path.join(T.golden_dir(build), "mixed_blas.safetensors")]
    for fams in (("Prescott", "Prescott"), ("Prescott", "Nehalem"), ("Nehalem", "Nehalem", "Prescott")):
        t0 = time.time()
        rc, out, err = T.run(mpmd(exe, fams, args), timeout=2 * FAIL_SECONDS)
        label = f"cp mixed kernels {'/'.join(fams)}"
        if len(set(fams)) == 1:
            T.check(rc == 0, f"{label}: the same family on every rank runs", err.strip()[-200:])
            continue
        lines = [l for l in err.splitlines() if "BLAS kernels that round differently" in l]
        odd = next(i for i, f in enumerate(fams) if f != fams[0])
        T.check(rc != 0 and time.time() - t0 < FAIL_SECONDS and len(lines) == len(fams),
                f"{label}: every rank fails at once with the message", f"exit {rc}, {len(lines)} lines, "
                f"{time.time() - t0:.1f} s {err.strip()[-200:]}")
        T.check(bool(lines) and f"'{fams[0]}' on rank 0, '{fams[odd]}' on rank {odd}" in lines[0],
                f"{label}: the message names both families and ranks", lines[0][:200] if lines else "")
    # `dsv4cp info` before a job: the fingerprint on one rank, and under mpirun whether the ranks share it
    for fams in (("Prescott", "Prescott"), ("Prescott", "Nehalem", "Prescott")):
        rc, out, err = T.run(mpmd(exe, fams, ["info"]), timeout=2 * FAIL_SECONDS)
        line = next((l for l in out.splitlines() if l.startswith("BLAS fingerprint:")), "")
        want = ("on every rank",) if len(set(fams)) == 1 else ("the ranks differ", "rank 0 'Prescott'", "rank 1 'Nehalem'")
        T.check(rc == 0 and all(w in line for w in want) and "rank 2" not in line,
                f"cp info {'/'.join(fams)}: the BLAS fingerprint line says whether the ranks share it",
                line or (out + err).strip()[-200:])


def test_check_command(build):
    for layer in (0, 1, 2):
        seq = "512" if layer == 2 else "128"
        rc, out, err = T.cli(build, ["check", "--preset", "tiny", "--layer", str(layer), "--seq", seq], nranks=4, timeout=300)
        T.check(rc == 0 and "verdict: PASS" in out, f"dsv4cp check N=4 tiny layer {layer}",
                (out + err).strip().splitlines()[-1] if (out + err).strip() else f"exit {rc}")
        T.check("forward and top-k bitwise equal to CP = 1: yes" in out, f"dsv4cp check N=4 tiny layer {layer} forward bitwise",
                " ".join(l for l in out.splitlines() if "bitwise equal" in l))
        T.check("dx and weight gradients bitwise equal to CP = 1: yes" in out,
                f"dsv4cp check N=4 tiny layer {layer} dx and weight gradients bitwise",
                " ".join(l for l in out.splitlines() if "bitwise equal" in l))


def train_lines(build, n, layer):
    """The loss line of every step and the trained weights' hash line of `dsv4cp train`."""
    rc, out, err = T.cli(build, ["train", "--preset", "tiny", "--layer", str(layer), "--seq", "128", "--steps", "5"],
                         nranks=n, timeout=300)
    return rc, [l for l in out.splitlines() if re.match(r"^(step \d+\s+loss |layer \d+ weights fnv1a64 )", l)], err


def test_train(build):
    """5 SGD steps: the same loss bits at every step and the same trained weights (their hash) for
    N = 1, 2, 4: the rank-summed gradients are the same bits for every N (docs/spec.md 6)."""
    for layer in (0, 1, 2):
        rc, base, err = train_lines(build, 1, layer)
        if not T.check(rc == 0 and len(base) == 6, f"train N=1 layer {layer} prints 5 losses and a weight hash",
                       err.strip()[-200:]):
            continue
        for n in (2, 4):
            rc, got, err = train_lines(build, n, layer)
            T.check(rc == 0 and got == base, f"train N={n} layer {layer}: every loss and the trained weights' hash "
                                             f"byte for byte CP=1's", f"{got} vs {base} {err.strip()[-200:]}")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default="build")
    p.add_argument("cases", nargs="*")
    a = p.parse_args()
    # the probe runs inside the CLI, under the OpenBLAS kernels the CLI itself chooses
    rc, out, err = T.cli(a.build, ["info"])
    if not T.check(rc == 0 and "position invariant:" in out, "dsv4cp info reports the BLAS probe",
                   "" if rc == 0 else (out + err).strip()[-200:]):
        return T.finish()
    bitwise = "position invariant: yes" in out
    kernels = next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("openblas kernels")), "?")
    print(f"note: BLAS rows position invariant under the CLI's kernels ({kernels}): "
          f"{'yes (forward must be bitwise)' if bitwise else 'no (tolerance only)'}")
    for name in a.cases or list(CP_CASES) + list(UNPADDED_CASES):
        if name in CP_CASES:
            run_case(a.build, name, CP_CASES[name], bitwise)
        else:
            args, ranks = UNPADDED_CASES[name]
            run_case(a.build, name, args, bitwise, ranks=ranks, ref_each=False)
    if not a.cases:
        test_recompute_bytes(a.build)
        test_input_memory(a.build, bitwise)
        test_sweep(a.build, bitwise)
        test_random_against_reference(a.build, bitwise)
        test_loud_failures(a.build)
        test_agreement(a.build)
        test_mixed_blas(a.build)
        test_check_command(a.build)
        test_train(a.build)
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
