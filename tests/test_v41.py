#!/usr/bin/env -S /usr/bin/python3
"""test_v41.py: DeepSeek V4.1 (CSA2, docs/spec.md section 10) end to end through `dsv4cp run
--layers A-B`:
  - golden: every standard V4.1 case of tests/ref/cases41.py (every role, packed / padded / batched
    inputs, windows longer than documents, top-k larger than the visible set, candidates that bind,
    a kept set smaller than top-k, ties, dense loss, bf16 / f16 weights, the released nesting and
    the ModelArgs names, sub-ranges) against the independent float64 reference (ref41.py), fast path
    and naive path;
  - CP: packings whose r = 2 groups straddle rank boundaries, 1-row shards, both splits, N = 2..4:
    out, topk_ids and indexer_loss of every layer bitwise equal to N = 1, dx and gradients within
    docs/spec.md section 6; recomputation byte for byte; measured bytes == plan (bench);
  - released checkpoints: a hand-written V4.1-format sharded checkpoint (nested config, FP8 E4M3
    with E8M0 32 x 32 block scales, BF16 compressor / indexer weights, F32 sinks, Engram / expert /
    vision / DSpark tensors the attention never reads) loaded by `run --layers 0-9` at N = 1 and 2
    against the reference on its dequantised values; `dsv4cp weights` lists what a range needs;
  - Python: the binding as docs/spec.md section 10 writes it (dsv4cp.Shared, the layers in order,
    autograd), at N = 1 against the reference and under mpirun -np 2, 3 bitwise equal to the CLI;
  - commands: check, train and plan over a range;
  - errors: a layer whose source lies outside the range, a consumer run alone, a DSpark stage, a
    missing x.{L}: one error line on every rank naming the layers."""
import argparse
import json
import os
import shlex
import sys
import time

import testlib as T

sys.path.insert(0, T.REF)
import cases41  # noqa: E402
import numpy as np  # noqa: E402
import st  # noqa: E402

# CP cases: T a multiple of 24 (N = 2, 3, 4 with both splits). Documents of odd lengths put r = 2
# groups across rank boundaries; each case lists the layers it runs.
_R1_CHAIN = ("--ratios 0,1,1,1,1,0 --kv-sources 1 --index-sources 1,3 --candidate-source 1 "
             "--candidate-topk-blocks 2 --candidate-block-size 3 --topk 5")
CP41_CASES = {
    "cp41_unpadded": "--layers 0-9 --coeff 0.5 --seed 201 --docs 1,2,3,4,5,6,7,8,9,10,11,6",
    "cp41_padded": "--layers 0-9 --coeff 0.5 --seed 202 --docs 24:17,24:24,24:9",
    "cp41_batch": "--layers 0-9 --coeff 0.5 --seed 203 --batch 2 --seq 24",
    "cp41_wide_window": "--layers 0-9 --coeff 0.5 --seed 204 --window 30 --docs 47,25",
    "cp41_candidates_bind": "--layers 0-9 --coeff 0.5 --seed 205 --docs 72",
    "cp41_dense": "--layers 1-8 --coeff 0.5 --seed 206 --loss-mode dense --docs 31,41",
    "cp41_r1_chain": f"--layers 0-5 --coeff 0.5 --seed 207 {_R1_CHAIN} --docs 37,35",
    # T = 8 at N = 4: 2-row shards, zigzag 1-row chunks (r = 2 groups split in two everywhere)
    "cp41_one_row_chunks": "--layers 0-9 --coeff 0.5 --seed 208 --docs 8",
}
RANKS = (2, 3, 4)
FAIL_SECONDS = 30


def make_case41(build, name, args):
    """gen_case41 + ref41 into the golden directory unless an up-to-date copy exists. Returns
    (dir, 'A-B')."""
    d = os.path.join(T.golden_dir(build), name)
    with T.case_lock(d):
        return _make_case41(d, name, args)


def _make_case41(d, name, args):
    stamp_file = os.path.join(d, "stamp")
    stamp = T._ref_stamp(args + " +ref41")
    a = shlex.split(args)
    layers = a[a.index("--layers") + 1]
    if os.path.exists(stamp_file) and open(stamp_file).read() == stamp:
        return d, layers
    os.makedirs(d, exist_ok=True)
    rc, out, err = T.run([T.PYTHON, os.path.join(T.REF, "gen_case41.py"), "--out", d] + a, timeout=120)
    if rc != 0:
        raise RuntimeError(f"gen_case41 {name} failed: {err.strip()[-300:]}")
    rc, out, err = T.run([T.PYTHON, os.path.join(T.REF, "ref41.py")] + files41(d, layers) +
                         ["--output", os.path.join(d, "exp.safetensors")], timeout=300)
    if rc != 0:
        raise RuntimeError(f"ref41 {name} failed: {err.strip()[-300:]}")
    with open(stamp_file, "w") as fh:
        fh.write(stamp)
    return d, layers


def files41(d, layers, grad=True):
    a = ["--config", os.path.join(d, "config.json"), "--layers", layers,
         "--weights", os.path.join(d, "weights.safetensors"), "--input", os.path.join(d, "in.safetensors")]
    g = os.path.join(d, "grad.safetensors")
    if grad and os.path.exists(g):
        a += ["--grad-output", g]
    return a


def test_golden(build, names):
    for name in names:
        try:
            d, layers = make_case41(build, name, cases41.CASES[name])
        except RuntimeError as e:
            T.check(False, f"v41 golden {name}: reference", str(e))
            continue
        # the sanitizer pass: the fast path only (the naive operators run under the sanitizers in test_ops_*)
        for path, flag in (("fast", []),) + ((("naive", ["--naive"]),) if not T.sanitized() else ()):
            got = os.path.join(d, f"got_{path}.safetensors")
            rc, out, err = T.cli(build, ["run"] + files41(d, layers) + ["--output", got, "--quiet"] + flag, timeout=300)
            if not T.check(rc == 0, f"v41 golden {name} {path} runs", err.strip()[-300:]):
                continue
            ok, line = T.compare_ref(got, os.path.join(d, "exp.safetensors"), name)
            T.check(ok, f"v41 golden {name} {path} (layers {layers}) vs float64 reference", line)


def case_tokens(d):
    x = [v for k, v in T.load(os.path.join(d, "in.safetensors")).items() if k == "x" or k.startswith("x.")][0]
    return (x.shape[0] * x.shape[1], x.shape[1], True) if x.ndim == 3 else (x.shape[0], x.shape[0], False)


def test_cp(build, bitwise):
    for name, args in CP41_CASES.items():
        try:
            d, layers = make_case41(build, name, args)
        except RuntimeError as e:
            T.check(False, f"v41 cp {name}: reference", str(e))
            continue
        total, seq, batched = case_tokens(d)
        one = os.path.join(d, "cp1.safetensors")
        rc, out, err = T.cli(build, ["run"] + files41(d, layers) + ["--output", one, "--quiet"])
        if not T.check(rc == 0, f"v41 cp {name} N=1 runs", err.strip()[-300:]):
            continue
        ok, line = T.compare_ref(one, os.path.join(d, "exp.safetensors"), name)
        T.check(ok, f"v41 cp {name} N=1 vs float64 reference", line)
        for n in RANKS:
            for zigzag in (False, True):
                tag = f"v41 cp {name} N={n}{' zigzag' if zigzag else ''}"
                outp = os.path.join(d, f"cp{n}{'z' if zigzag else ''}.safetensors")
                if os.path.exists(outp):  # the recompute check below reads this run's file, never an old one
                    os.remove(outp)
                cmd = ["run"] + files41(d, layers) + ["--output", outp, "--quiet"]
                cmd += ["--split", "zigzag"] if zigzag else []
                t0 = time.time()
                rc, out, err = T.cli(build, cmd, nranks=n, timeout=120)
                unit = seq if batched else total
                if unit % (2 * n if zigzag else n):
                    lines = [l for l in err.splitlines() if l.startswith("dsv4cp: error:")]
                    T.check(rc != 0 and len(lines) == n and time.time() - t0 < FAIL_SECONDS,
                            f"{tag} rejected loudly on every rank", err.strip()[-200:])
                    continue
                if not T.check(rc == 0, f"{tag} runs", err.strip()[-300:]):
                    continue
                fails = T.compare_cp(outp, one, tag, bitwise)
                T.check(not fails, f"{tag} vs CP=1 ({'bitwise forward' if bitwise else 'tolerance'}, every layer)",
                        "; ".join(fails))
        # recomputation writes the same bytes (N = 1 and 2) as the runs above
        for n in (1, 2):
            base = one if n == 1 else os.path.join(d, f"cp{n}.safetensors")
            outp = os.path.join(d, f"rc{n}r.safetensors")
            rc, out, err = T.cli(build, ["run"] + files41(d, layers) + ["--output", outp, "--quiet", "--recompute"],
                                 nranks=n, timeout=120)
            same = rc == 0 and os.path.exists(base) and open(base, "rb").read() == open(outp, "rb").read()
            T.check(same, f"v41 cp {name} N={n}: --recompute writes the same bytes", err.strip()[-200:])


def test_bytes_plan(build):
    """Measured message bytes and saved activations equal the plan for a whole V4.1 range."""
    for n, split, docs in ((2, "contiguous", "1:12"), (3, "zigzag", "3:40"), (4, "contiguous", "1:5")):
        j = os.path.join(T.golden_dir(build), f"v41_bench_{n}.json")
        if os.path.exists(j):
            os.remove(j)
        rc, out, err = T.cli(build, ["bench", "--preset", "tiny41", "--layers", "0-9", "--seq", "96", "--doc-lengths",
                                     docs, "--split", split, "--reps", "1", "--sgemm-size", "256", "--json", j], nranks=n, timeout=120)
        rec = json.loads(open(j).read().splitlines()[-1]) if rc == 0 and os.path.exists(j) else {}
        T.check(rec.get("bytes_match_plan") is True and rec.get("saved_bytes_match_plan") is True,
                f"v41 bench N={n} {split} docs {docs}: measured bytes and saved activations == plan",
                err.strip()[-200:] if rc else json.dumps({k: rec.get(k) for k in ("bytes_match_plan",
                                                                                    "saved_bytes_match_plan")}))


SWEEP_RUNS = 24  # 12 in the sanitizer pass (the suite's time budget; test_determinism covers V4.1 across N too)


def test_sweep(build, bitwise):
    """Random unpadded packings of tiny41 (every role; 1-token documents and r = 2 groups across rank
    boundaries included), each at a random N = 2..4, split and recomputation setting, through
    `dsv4cp check --layers 0-9`: forward, top-k, losses, dx and the weight gradients bitwise equal
    to CP = 1 (where the BLAS probe allows bitwise), within SPEC 6's tolerance. Seeded: a failure
    names the command that reproduces it."""
    rng = np.random.default_rng(41)
    for i in range(SWEEP_RUNS // 2 if T.sanitized() else SWEEP_RUNS):
        seq = int(rng.choice([24, 48, 72, 96]))
        lo = int(rng.integers(1, 4))
        hi = int(rng.integers(lo, 40))
        n = int(rng.integers(2, 5))
        args = ["check", "--preset", "tiny41", "--layers", "0-9", "--seq", str(seq), "--doc-lengths", f"{lo}:{hi}",
                "--seed", str(1000 + i), "--split", str(rng.choice(["contiguous", "zigzag"]))]
        if rng.random() < 0.5:
            args.append("--recompute")
        rc, out, err = T.cli(build, args, nranks=n, timeout=120)
        ok = rc == 0 and "verdict: PASS" in out and (not bitwise or (
            "forward and top-k bitwise equal to CP = 1: yes" in out and
            "dx and weight gradients bitwise equal to CP = 1: yes" in out))
        T.check(ok, f"v41 sweep {i}: mpirun -np {n} dsv4cp {' '.join(args)}",
                "" if ok else (out + err).strip()[-300:])


def test_commands(build, bitwise):
    """check, train and plan over a V4.1 range."""
    rc, out, err = T.cli(build, ["check", "--preset", "tiny41", "--layers", "0-9", "--seq", "48", "--doc-lengths",
                                 "1:12", "--seed", "4"], nranks=3, timeout=120)
    want = "forward and top-k bitwise equal to CP = 1: yes" if bitwise else "verdict: PASS"
    T.check(rc == 0 and "verdict: PASS" in out and want in out and "out.9" in out and "topk_ids.7" in out,
            "v41 check --layers 0-9 at N=3: every layer's tensors reported, PASS", (out + err).strip()[-300:])
    lines = {}
    for n in (1, 2, 4):
        rc, out, err = T.cli(build, ["train", "--preset", "tiny41", "--layers", "0-9", "--seq", "48", "--steps", "3",
                                     "--doc-lengths", "3:20"], nranks=n, timeout=120)
        lines[n] = [l for l in out.splitlines() if l.startswith("step ")] if rc == 0 else None
    ok = all(lines[n] and len(lines[n]) == 3 for n in lines) and lines[1][0] == lines[2][0] == lines[4][0]
    T.check(ok, "v41 train --layers 0-9: 3 steps at N = 1, 2, 4, the first step's loss line identical",
            " | ".join(str(lines[n][:1] if lines[n] else None) for n in lines))
    rc, out, err = T.cli(build, ["plan", "--preset", "flash41", "--seq", "4096", "--ranks", "2", "--layers", "20-23"])
    T.check(rc == 0 and "layer 21: reuse (compress ratio 1)" in out and "layers 20-23 together" in out and
            "slot_allgather" in out.split("layer 21:")[0] and "slot_allgather" not in out.split("layer 21:")[1],
            "v41 plan --layers 20-23: the kv source gathers, its readers do not; the group's sum",
            (out + err).strip()[-300:])


def test_checkpoint(build):
    sys.path.insert(0, T.HERE)
    import ckptlib41
    import numpy as np
    d = os.path.join(T.golden_dir(build), "v41_released")
    os.makedirs(d, exist_ok=True)
    ck = ckptlib41.write_released(d, seed=5)
    deq = ck.write_dequantized(os.path.join(d, "dequantized.safetensors"))
    rng = np.random.default_rng(9)
    cu = np.array([0, 24, 41, 72], dtype=np.int32)
    dim = ck.config["text_config"]["hidden_size"]
    T.st.write(os.path.join(d, "in.safetensors"), {**{f"x.{L}": rng.standard_normal((72, dim)).astype(np.float32)
                                                      for L in range(10)}, "cu_seqlens": cu,
                                                   "seqlens_real": np.array([24, 15, 31], dtype=np.int32)})
    T.st.write(os.path.join(d, "grad.safetensors"), {f"dout.{L}": rng.standard_normal((72, dim)).astype(np.float32)
                                                     for L in range(10)})
    common = ["--config", ck.config_path, "--layers", "0-9", "--input", os.path.join(d, "in.safetensors"),
              "--grad-output", os.path.join(d, "grad.safetensors")]
    exp = os.path.join(d, "exp.safetensors")
    rc, out, err = T.run([T.PYTHON, os.path.join(T.REF, "ref41.py")] + common + ["--weights", deq, "--output", exp],
                         timeout=300)
    if not T.check(rc == 0, "v41 checkpoint: reference on the dequantised weights", err.strip()[-300:]):
        return
    for n in (1, 2):
        got = os.path.join(d, f"got{n}.safetensors")
        rc, out, err = T.cli(build, ["run"] + common + ["--weights", ck.index_path, "--output", got, "--quiet"],
                             nranks=n, timeout=300)
        if T.check(rc == 0, f"v41 checkpoint: run --layers 0-9 on the released layout at N={n}", err.strip()[-300:]):
            ok, line = T.compare_ref(got, exp, "v41_released")
            T.check(ok, f"v41 checkpoint N={n}: FP8 32 x 32, BF16, shards, unrelated tensors vs reference", line)
    rc, out, err = T.cli(build, ["weights", "--config", ck.config_path, "--layers", "5-8", "--weights", ck.index_path])
    T.check(rc == 0 and "layers.5.attn.indexer.wk.weight" in out and "layers.7.attn.indexer.wq_b.weight" in out
            and "layers.6.attn.compressor" not in out, "v41 weights --layers 5-8 lists what each role reads",
            (out + err).strip()[-300:])


def test_python(build):
    if T.sanitized():
        print("note: the Python binding is not tested in the sanitizer pass")
        return
    env = {"PYTHONPATH": os.path.join(T.ROOT, "python")}
    for name, runs in (("v41_packed", ((1, "contiguous"),)), ("v41_batch", ((1, "contiguous"),)),
                       ("cp41_unpadded", ((2, "zigzag"), (3, "contiguous"))),
                       ("cp41_r1_chain", ((2, "contiguous"),))):
        args = cases41.CASES.get(name) or CP41_CASES[name]
        d, layers = make_case41(build, name, args)
        files = [os.path.join(d, f) for f in ("config.json",)] + [layers] + \
                [os.path.join(d, f) for f in ("weights.safetensors", "in.safetensors", "grad.safetensors")]
        for n, split in runs:
            got = os.path.join(d, f"py{n}{split[0]}.safetensors")
            cmd = [T.PYTHON, os.path.join(T.HERE, "py_runner41.py")] + files + [got, "--split", split]
            if n > 1:
                cmd = ["mpirun", "--quiet", "--oversubscribe", "--allow-run-as-root", "-np", str(n)] + cmd
            rc, out, err = T.run(cmd, timeout=300, env=env)
            tag = f"v41 python {name} N={n} {split} (Shared, layers {layers} in order, autograd)"
            if not T.check(rc == 0, f"{tag} runs", err.strip()[-300:]):
                continue
            ok, line = T.compare_ref(got, os.path.join(d, "exp.safetensors"), name)
            T.check(ok, f"{tag} vs float64 reference", line)
            cli = os.path.join(d, f"cli{n}{split[0]}.safetensors")
            rc, out, err = T.cli(build, ["run"] + files41(d, layers) + ["--output", cli, "--quiet", "--split", split],
                                 nranks=n, timeout=120)
            fails = T.compare_cp(got, cli, tag, True) if rc == 0 else [err.strip()[-200:]]
            T.check(not fails, f"{tag}: forward bitwise the CLI's at the same N", "; ".join(fails))


def test_python_unused(build):
    """A reader whose outputs never reach the loss: autograd skips its backward, and its kv source's
    backward (told by the binding) must neither wait for it nor change: every other tensor is the
    bytes of the run that keeps the reader with weight 0."""
    if T.sanitized():
        return
    env = {"PYTHONPATH": os.path.join(T.ROOT, "python")}
    name = "cp41_unpadded"
    d, layers = make_case41(build, name, CP41_CASES[name])
    first, last = (int(v) for v in layers.split("-"))
    files = [os.path.join(d, "config.json"), layers] + \
        [os.path.join(d, f) for f in ("weights.safetensors", "in.safetensors", "grad.safetensors")]
    reader = 3   # tiny41: a reindex layer reading layer 1's compressed kv (its own top-k and loss)
    for n in (1, 2):
        got = {}
        for mode in ("--unused", "--zero"):
            got[mode] = os.path.join(d, f"py_{mode[2:]}{n}.safetensors")
            cmd = [T.PYTHON, os.path.join(T.HERE, "py_runner41.py")] + files + [got[mode], mode, str(reader)]
            if n > 1:
                cmd = ["mpirun", "--quiet", "--oversubscribe", "--allow-run-as-root", "-np", str(n)] + cmd
            rc, out, err = T.run(cmd, timeout=300, env=env)
            if not T.check(rc == 0, f"v41 python N={n}: layer {reader} {mode[2:]} in the loss, layers {layers}",
                           err.strip()[-300:]):
                break
        else:
            a, b = st.read(got["--unused"]), st.read(got["--zero"])
            mine = {k for k in b if k.endswith(f".{reader}") or f"layers.{reader}." in k}
            same = [k for k in a if k in b and np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8))]
            T.check(set(a) <= set(b) and set(b) - set(a) <= mine and f"dx.{reader}" not in a
                    and len(same) == len(a),
                    f"v41 python N={n}: a reader left out of the loss changes no other tensor (its source's "
                    f"gradients included)", f"{len(same)} of {len(a)} equal; only in one: {sorted(set(a) ^ set(b))[:4]}")


def expect_error(build, name, args, want, n=1):
    t0 = time.time()
    rc, out, err = T.cli(build, args, nranks=n, timeout=60)
    lines = [l for l in err.splitlines() if l.startswith("dsv4cp: error:")]
    ok = rc != 0 and len(lines) == n and len(set(lines)) == 1 and all(w in lines[0] for w in want)
    T.check(ok and time.time() - t0 < FAIL_SECONDS, f"v41 error: {name}",
            f"exit {rc}: {lines[0] if lines else err.strip()[-200:]}")


def test_errors(build):
    base = ["run", "--preset", "tiny41", "--seq", "24", "--output", os.path.join(T.golden_dir(build), "e.st")]
    expect_error(build, "a reuse layer run alone names its kv source", base + ["--layer", "2"],
                 ["layer 2", "layer 1", "--layers 1-2"])
    expect_error(build, "a range starting after a source names both", base + ["--layers", "3-6"],
                 ["layer 3", "layer 1", "outside the range"], n=2)
    expect_error(build, "a range after the candidate source", base + ["--layers", "6-8"], ["layer 6", "layer 5"])
    expect_error(build, "--layer and --layers together", base + ["--layer", "1", "--layers", "1-2"],
                 ["--layer and --layers"])
    expect_error(build, "a bad range", base + ["--layers", "4-2"], ["--layers", "4-2"])
    expect_error(build, "a DSpark draft stage is refused",
                 ["run", "--preset", "flash41", "--seq", "8", "--layer", "41", "--output",
                  os.path.join(T.golden_dir(build), "e.st")], ["layer 41", "DSpark"])
    # a missing x.{L}: the first layer's x found, another's absent
    d, layers = make_case41(build, "v41_range_1_4", cases41.CASES["v41_range_1_4"])
    x = T.load(os.path.join(d, "in.safetensors"))
    bad = os.path.join(d, "in_missing.safetensors")
    T.st.write(bad, {k: v for k, v in x.items() if k != "x.3"})
    args = files41(d, layers)
    args[args.index("--input") + 1] = bad
    expect_error(build, "a missing x.{L} is named", ["run"] + args + ["--output", os.path.join(d, "e.st")],
                 ["x.3"])


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default="build")
    p.add_argument("--only", choices=["golden", "cp", "sweep", "bytes", "commands", "checkpoint", "python",
                                      "errors"])
    p.add_argument("cases", nargs="*", help="golden case names (default: all)")
    a = p.parse_args()
    rc, out, err = T.cli(a.build, ["info"])
    bitwise = rc == 0 and "position invariant: yes" in out
    if a.only in (None, "golden"):
        test_golden(a.build, a.cases or list(cases41.CASES))
    if a.only in (None, "cp"):
        test_cp(a.build, bitwise)
    if a.only in (None, "sweep"):
        test_sweep(a.build, bitwise)
    if a.only in (None, "bytes"):
        test_bytes_plan(a.build)
    if a.only in (None, "commands"):
        test_commands(a.build, bitwise)
    if a.only in (None, "checkpoint"):
        test_checkpoint(a.build)
    if a.only in (None, "python"):
        test_python(a.build)
        test_python_unused(a.build)
    if a.only in (None, "errors"):
        test_errors(a.build)
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
