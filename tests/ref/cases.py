#!/usr/bin/env -S /usr/bin/python3
"""cases.py: the standard test cases (name -> gen_case.py arguments) that the test driver runs
through the C program and ref.py. Each is small enough for ref.py to finish in a few seconds.

  cases.py                 prints the case names, one per line
  cases.py NAME            prints NAME's gen_case.py arguments (without --out)
  cases.py --run-ref DIR [NAME...]
                           generates each case into DIR/NAME and runs ref.py on it (expected output
                           DIR/NAME/exp.safetensors), printing timings

The layer index is always passed explicitly (--layer) so a driver can read it back with layer_of().
"""
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/usr/bin/python3"

_WIDE = ("--dim 64 --heads 8 --head-dim 32 --rope-dim 16 --q-lora 48 --o-groups 4 --o-lora 16 "
         "--window 16 --index-heads 4 --index-head-dim 32")
# YaRN with a tiny original length: the ramp changes frequencies that matter at positions < 100
_YARN_SMALL = "--compress-rope-theta 1000 --yarn-orig 64 --yarn-factor 8"
# corr(beta_slow) in (-1, 0]: hi == lo == 0, the "+ 0.001" branch of the ramp
_YARN_DEGENERATE = "--compress-rope-theta 1000 --yarn-orig 4 --yarn-factor 4"

CASES = {
    # ---- r = 0: sliding window only (rope_theta, no YaRN) ----
    "swa_packed": "--ratio 0 --layer 0 --seed 1 --docs 16:16,12:9,20:20,8:3",
    "swa_batch": "--ratio 0 --layer 1 --seed 2 --batch 2 --seq 16 --o-groups 4",
    "swa_window_gt_doc": "--ratio 0 --layer 0 --seed 3 --window 40 --docs 16:16,32:30,8:1",
    "swa_small_theta": "--ratio 0 --layer 0 --seed 4 --rope-theta 100 --docs 24:20,24:24",
    # ---- r = 4: CSA with the lightning indexer and its KL loss ----
    "csa_packed": "--ratio 4 --layer 2 --seed 11 --docs 32:32,24:21,40:40,16:13",
    "csa_batch": "--ratio 4 --layer 2 --seed 12 --batch 3 --seq 24",
    "csa_short_docs": "--ratio 4 --layer 2 --seed 13 --window 8 --docs 4:4,8:6,12:12,8:8,4:3,4:1,12:10",
    "csa_window_gt_doc": "--ratio 4 --layer 2 --seed 14 --window 64 --docs 24:24,16:11,40:37",
    "csa_topk_large": "--ratio 4 --layer 2 --seed 15 --topk 64 --docs 32:32,20:18",
    "csa_ties": "--ratio 4 --layer 2 --seed 16 --ties --topk 6 --docs 64:64,48:45,32:32",
    "csa_dense": "--ratio 4 --layer 2 --seed 17 --loss-mode dense --docs 32:32,24:21,40:40",
    "csa_coeff0": "--ratio 4 --layer 2 --seed 18 --coeff 0 --docs 32:32,24:21",
    "csa_bf16": "--ratio 4 --layer 2 --seed 19 --weights-dtype bf16 --docs 32:32,24:21",
    "csa_noprefix": "--ratio 4 --layer 4 --seed 20 --no-prefix --docs 28:28,20:17",
    "csa_yarn_small": f"--ratio 4 --layer 2 --seed 21 {_YARN_SMALL} --docs 48:48,32:29",
    "csa_yarn_degenerate": f"--ratio 4 --layer 2 --seed 25 {_YARN_DEGENERATE} --docs 32:30,16:16",
    "csa_xscale": "--ratio 4 --layer 2 --seed 22 --x-scale 8 --docs 32:32,24:22",
    "csa_single_bare": "--ratio 4 --layer 2 --seed 23 --no-cu --docs 40",
    "csa_wide": f"--ratio 4 --layer 2 --seed 24 {_WIDE} --topk 8 --docs 128:128,96:90,64:61",
    # documents of any length (SPEC 4): every tail length 0..3, padded and unpadded mixed
    "csa_unpadded": "--ratio 4 --layer 2 --seed 26 --topk 5 --docs 1,2,3,5,6:4,7,9,10:9,11,13",
    "csa_batch_unaligned": "--ratio 4 --layer 2 --seed 27 --batch 2 --seq 22",
    # ---- r = 128: HCA (documents need >= 128 real tokens for a slot) ----
    "hca_packed": "--ratio 128 --layer 3 --seed 31 --docs 384:300,256:256,128:100",
    "hca_batch": "--ratio 128 --layer 3 --seed 32 --batch 2 --seq 256 --o-groups 1",
    "hca_f16": "--ratio 128 --layer 0 --seed 33 --weights-dtype f16 --docs 256:256,128:128",
    "hca_yarn_small": (f"--ratio 128 --layer 3 --seed 34 {_YARN_SMALL} --window 16 "
                       "--docs 384:384 --omit-seqlens-real"),
    "hca_unpadded": "--ratio 128 --layer 3 --seed 35 --docs 130,200:150,127,300",
    "hca_batch_unaligned": "--ratio 128 --layer 3 --seed 36 --batch 2 --seq 300",
}


def args_of(name):
    return shlex.split(CASES[name])


def layer_of(name):
    a = args_of(name)
    return int(a[a.index("--layer") + 1])


def generate_and_reference(name, case_dir):
    """gen_case.py then ref.py for one case; returns (seconds for gen, seconds for ref)."""
    t0 = time.perf_counter()
    subprocess.run([PYTHON, os.path.join(HERE, "gen_case.py"), "--out", case_dir] + args_of(name), check=True)
    t1 = time.perf_counter()
    files = {k: os.path.join(case_dir, f) for k, f in
             (("config", "config.json"), ("weights", "weights.safetensors"), ("input", "in.safetensors"),
              ("grad-output", "grad.safetensors"), ("output", "exp.safetensors"))}
    cmd = [PYTHON, os.path.join(HERE, "ref.py"), "--layer", str(layer_of(name))]
    for key, path in files.items():
        if key != "grad-output" or os.path.exists(path):
            cmd += [f"--{key}", path]
    subprocess.run(cmd, check=True)
    return t1 - t0, time.perf_counter() - t1


def main(argv):
    if not argv:
        print("\n".join(CASES))
        return 0
    if argv[0] == "--run-ref":
        root, names = argv[1], argv[2:] or list(CASES)
        total = 0.0
        for name in names:
            t_gen, t_ref = generate_and_reference(name, os.path.join(root, name))
            total += t_gen + t_ref
            print(f"{name:<22} gen {t_gen:5.2f} s  ref {t_ref:5.2f} s")
        print(f"{len(names)} cases, {total:.1f} s")
        return 0
    if argv[0] not in CASES:
        print(f"cases.py: unknown case '{argv[0]}'", file=sys.stderr)
        return 2
    print(CASES[argv[0]])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
