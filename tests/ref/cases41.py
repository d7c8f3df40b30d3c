#!/usr/bin/env -S /usr/bin/python3
"""cases41.py: the standard DeepSeek V4.1 (CSA2) test cases (name -> gen_case41.py arguments) that a
test driver runs through the C program (`dsv4cp run --layers A-B`) and ref41.py. Dimensions are the
tiny41 preset unless a case says otherwise; every case has T <= ~120 tokens.

  cases41.py                 prints the case names, one per line
  cases41.py NAME            prints NAME's gen_case41.py arguments (without --out)
  cases41.py --run-ref DIR [NAME...]
                             generates each case into DIR/NAME and runs ref41.py on it (expected
                             output DIR/NAME/exp.safetensors), printing timings

Every case passes --layers explicitly so a driver can read it back with layers_of(). The loss
coefficient is raised (--coeff 0.5) in most cases so the KL gradients are not tiny next to the rest.

Coverage (tiny41 roles: 0 window, 1 Full r=2, 2 Reuse, 3 Reindex, 4 Reuse, 5 Full r=1 + candidate
source, 6 Reuse, 7 Reindex with candidates, 8 Reuse, 9 window):
  every role (all cases with --layers 0-9); packed unpadded documents of lengths 1..12 (= 3 bs r for
  r = 2); padded documents; a batch; windows longer than documents; top-k larger than the visible
  set; candidates that bind (the default: 2 kept blocks of 2 entries) and a kept set smaller than
  top-k (pinned partial block, bs 3); exact score ties; dense loss; coeff 0; bf16 and f16 weights;
  the released nesting; ModelArgs names; one shared x; sub-ranges starting at a kv source; a
  ratio-1 candidate source followed by a Reindex layer; no candidates; small YaRN; `model.` names.
"""
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/usr/bin/python3"

_ALL = "--layers 0-9 --coeff 0.5"
# YaRN with a tiny original length: the ramp changes frequencies that matter at positions < 100
_YARN_SMALL = "--compress-rope-theta 1000 --yarn-orig 64 --yarn-factor 8"
# one kv source (r = 1), which is also the candidate source, then a Reindex layer using candidates
_R1_CHAIN = ("--ratios 0,1,1,1,1,0 --kv-sources 1 --index-sources 1,3 --candidate-source 1 "
             "--candidate-topk-blocks 2 --candidate-block-size 3 --topk 5")

CASES = {
    # ---- the whole tiny41 stack ----
    "v41_packed": f"{_ALL} --seed 101 --docs 24:24,17,30:27,12:9",
    "v41_unpadded": f"{_ALL} --seed 102 --docs 1,2,3,4,5,6,7,8,9,10,11,12",
    "v41_padded": f"{_ALL} --seed 103 --docs 20:13,16:16,12:5,24:23,9:1",
    "v41_batch": f"{_ALL} --seed 104 --batch 3 --seq 20",
    "v41_batch_odd": f"{_ALL} --seed 105 --batch 2 --seq 23",
    "v41_window_gt_doc": f"{_ALL} --seed 106 --window 40 --docs 24:24,16:11,30:30",
    "v41_topk_large": f"{_ALL} --seed 107 --topk 40 --candidate-topk-blocks 20 --docs 32:32,20:18,9",
    "v41_candidates_bind": f"{_ALL} --seed 108 --docs 48:48,40:37",
    "v41_kept_lt_topk": f"{_ALL} --seed 109 --topk 5 --candidate-block-size 3 --docs 40:40,25:22",
    "v41_ties": f"{_ALL} --seed 110 --ties --topk 3 --docs 40:40,30:27,16",
    "v41_dense": f"{_ALL} --seed 111 --loss-mode dense --docs 24:24,17,30:27",
    "v41_coeff0": "--layers 0-9 --coeff 0 --seed 112 --docs 24:24,17:15",
    "v41_bf16": f"{_ALL} --seed 113 --weights-dtype bf16 --docs 24:24,17,30:27",
    "v41_f16": f"{_ALL} --seed 114 --weights-dtype f16 --docs 20:20,19:16",
    "v41_nested": f"{_ALL} --seed 115 --nested --docs 24:24,17,30:27",
    "v41_modelargs": f"{_ALL} --seed 116 --modelargs --docs 24:24,17,30:27",
    "v41_shared_x": f"{_ALL} --seed 117 --shared-x --docs 24:24,17,30:27",
    "v41_model_prefix": f"{_ALL} --seed 118 --model-prefix --docs 26:25,20",
    "v41_single_bare": f"{_ALL} --seed 119 --no-cu --docs 41",
    "v41_no_seqlens_real": f"{_ALL} --seed 120 --omit-seqlens-real --docs 21,19,33",
    "v41_yarn_small": f"{_ALL} --seed 121 {_YARN_SMALL} --docs 40:40,30:29",
    "v41_no_candidates": f"{_ALL} --seed 122 --candidate-source none --docs 30:30,25:21",
    # ---- sub-ranges (a range must start at or before the sources it reads) ----
    "v41_range_1_4": "--layers 1-4 --coeff 0.5 --seed 131 --docs 24:24,17,30:27",
    "v41_range_5_8": "--layers 5-8 --coeff 0.5 --seed 132 --docs 24:24,17,30:27",
    "v41_range_9": "--layers 9-9 --seed 133 --docs 24:24,17:12",
    "v41_range_5": "--layers 5-5 --coeff 0.5 --seed 134 --docs 30:30,12:9",
    # ---- other schedules ----
    "v41_r1_chain": f"--layers 0-5 --coeff 0.5 --seed 141 {_R1_CHAIN} --docs 30:30,23:20,7",
    "v41_r2_only": ("--layers 0-4 --coeff 0.5 --seed 142 --ratios 0,2,2,2,0 --kv-sources 1 --index-sources 1,3 "
                    "--candidate-source none --docs 33:33,26:21,5"),
}


def args_of(name):
    return shlex.split(CASES[name])


def layers_of(name):
    """The range of a case, as the string 'A-B' that --layers takes."""
    a = args_of(name)
    return a[a.index("--layers") + 1]


def generate_and_reference(name, case_dir):
    """gen_case41.py then ref41.py for one case; returns (seconds for gen, seconds for ref)."""
    t0 = time.perf_counter()
    subprocess.run([PYTHON, os.path.join(HERE, "gen_case41.py"), "--out", case_dir] + args_of(name), check=True)
    t1 = time.perf_counter()
    files = {k: os.path.join(case_dir, f) for k, f in
             (("config", "config.json"), ("weights", "weights.safetensors"), ("input", "in.safetensors"),
              ("grad-output", "grad.safetensors"), ("output", "exp.safetensors"))}
    cmd = [PYTHON, os.path.join(HERE, "ref41.py"), "--layers", layers_of(name)]
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
        if len(argv) < 2:
            print("cases41.py: --run-ref needs a directory", file=sys.stderr)
            return 2
        names = argv[2:] or list(CASES)
        total = 0.0
        for name in names:
            t_gen, t_ref = generate_and_reference(name, os.path.join(argv[1], name))
            total += t_gen + t_ref
            print(f"{name:<22} gen {t_gen:5.2f} s  ref {t_ref:5.2f} s")
        print(f"{len(names)} cases, {total:.1f} s")
        return 0
    if argv[0] not in CASES:
        print(f"cases41.py: unknown case '{argv[0]}'", file=sys.stderr)
        return 2
    print(CASES[argv[0]])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
