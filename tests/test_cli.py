#!/usr/bin/env -S /usr/bin/python3
"""test_cli.py: the command-line contract (SPEC 7) on bad input: every case must exit non-zero
with ONE line on stderr (per rank) that names the problem, and never crash (no sanitizer report, no signal).
Also: --help on every command lists exactly the options it reads, run's summary line and --quiet,
the progress line (only on a terminal), one naming of gradients, and output files written with the
exact tensor names."""
import argparse
import json
import os
import re
import shutil
import sys

import numpy as np

import testlib as T

COMMANDS = ("run", "demo", "check", "train", "bench", "plan", "info", "weights")


def expect_error(build, name, args, needle, nranks=1):
    rc, out, err = T.cli(build, args, nranks=nranks, timeout=120)
    lines = [l for l in err.splitlines() if l.strip()]
    # one line per rank, all the same
    ok = rc not in (0, -9) and rc < 128 and len(lines) == nranks and len(set(lines)) == 1 \
        and lines[0].startswith("dsv4cp: error:") and needle.lower() in lines[0].lower()
    return T.check(ok, f"cli bad input: {name}", f"exit {rc}: {' | '.join(lines)[:300]}")


OPTION = re.compile(r"^  --([a-z][a-z-]*)( [A-Z][A-Z:-]*)?\s", re.M)
# options of the shared job table (tools/job.c) and the output file: the ones commands used to list
# without reading them
SHARED = ("config", "preset", "layer", "weights", "input", "grad-output", "seed", "seq", "batch", "split",
          "threads", "output")


def help_options(build, cmd):
    """{option: takes a value} as `dsv4cp CMD --help` lists them."""
    rc, out, err = T.cli(build, [cmd, "--help"])
    return {m.group(1): bool(m.group(2)) for m in OPTION.finditer(out) if m.group(1) != "help"}


def test_help_lists_what_is_read(build):
    """--help prints the same table the parser reads (tools/cli.c), so: every listed option is
    accepted (all at once, then --help: exit 0), and no shared option is accepted unlisted. Plus
    the descriptions the issue found wrong."""
    listed = {c: help_options(build, c) for c in COMMANDS}
    for c in COMMANDS:
        args = [c]
        for name, val in listed[c].items():
            args += [f"--{name}"] + (["1"] if val else [])
        rc, out, err = T.cli(build, args + ["--help"])
        T.check(rc == 0 and "usage:" in out, f"cli {c}: every option --help lists is accepted ({len(listed[c])})",
                err.strip()[-200:])
        for name in SHARED:
            if name in listed[c]:
                continue
            rc, out, err = T.cli(build, [c, f"--{name}", "1", "--help"])
            T.check(rc != 0 and "unknown option" in err, f"cli {c}: --{name} is not listed and not accepted",
                    f"exit {rc} {err.strip()[-120:]}")
    rc, out, err = T.cli(build, ["plan", "--help"])
    T.check("(required)" not in out.split("--layer", 1)[1].splitlines()[0], "cli plan --help: --layer is optional")
    rc, out, err = T.cli(build, ["check", "--help"])
    line = next((l for l in out.splitlines() if l.strip().startswith("--grad-output")), "")
    T.check("dout" in line and "backward too" not in line, "cli check --help: --grad-output is the backward's dout", line)
    expect_error(build, "check: --grad-output with --forward-only", ["check", "--preset", "tiny", "--layer", "0",
                 "--forward-only", "--grad-output", "g.safetensors"], "--forward-only")


def test_summary_and_progress(build, tmp):
    out_file = os.path.join(tmp, "summary.safetensors")
    rc, out, err = T.cli(build, ["run", "--preset", "tiny", "--layer", "1", "--seq", "64", "--output", out_file])
    lines = out.strip().splitlines()
    T.check(rc == 0 and len(lines) == 1 and re.match(r"run: 64 tokens, 1 rank, layer 1 CSA \(r = 4\), forward [0-9.]+ s, "
                                                    r"wrote " + re.escape(out_file) + "$", lines[0]),
            "cli run prints one summary line", " | ".join(lines))
    rc, out, err = T.cli(build, ["run", "--preset", "tiny", "--layer", "0", "--seq", "64", "--quiet", "--output",
                                 out_file], nranks=2)
    T.check(rc == 0 and out == "" and err == "", "cli run --quiet under mpirun -np 2 prints nothing",
            repr(out[-100:] + err[-100:]))
    # not a terminal: no progress line anywhere
    for args in (["train", "--preset", "tiny", "--layer", "0", "--seq", "64", "--steps", "2"],
                 ["check", "--preset", "tiny", "--layer", "0", "--seq", "64"],
                 ["bench", "--preset", "tiny", "--layer", "0", "--seq", "64", "--reps", "1", "--sgemm-size", "256"]):
        rc, out, err = T.cli(build, args, nranks=2)
        T.check(rc == 0 and "\r" not in out + err and "elapsed" not in out + err,
                f"cli {args[0]}: no progress line when output is not a terminal", f"exit {rc} {err.strip()[-120:]}")
    if not shutil.which("script"):
        print("note: no `script` command: progress on a terminal not tested")
        return
    cmd = " ".join([os.path.join(build, "dsv4cp"), "train", "--preset", "tiny", "--layer", "0", "--seq", "64",
                    "--steps", "2"])
    rc, out, err = T.run(["script", "-qec", cmd, "/dev/null"], timeout=120)   # text mode: "\r" reads as "\n"
    T.check(rc == 0 and "\033[Kdsv4cp train: step 2 of 2" in out and "elapsed" in out and "step 2  loss" in out,
            "cli train on a terminal: progress line with elapsed time and estimate", repr(out[-160:]))


def test_gradient_names(build):
    """check reports gradients with the names run writes: grad.<full tensor name>."""
    rc, out, err = T.cli(build, ["check", "--preset", "tiny", "--layer", "0", "--seq", "64"], nranks=2)
    names = re.findall(r"^\s+(grad\.\S+)", out, re.M)
    T.check(rc == 0 and names and all(n.startswith("grad.layers.0.attn.") for n in names),
            "cli check names gradients grad.layers.L.attn.* like run", " ".join(names[:2]))


def cpu_kernels():
    """The kernel family the CLI picks for this CPU when OPENBLAS_CORETYPE is unset (tools/cli.c),
    restated from /proc/cpuinfo as the test's own oracle (the binding's _lib has the same rule, but
    importing it loads the library)."""
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return "SkylakeX" if "avx512f" in flags else "Haswell" if "avx2" in flags else None


def test_info_kernel_note(build):
    """info names the kernels in use, and says so when OPENBLAS_CORETYPE picks narrower ones than the
    CPU runs (an inherited Haswell on an AVX-512 machine halves the large products)."""
    exe = os.path.join(build, "dsv4cp")
    best = cpu_kernels()
    if not best:  # no AVX2: OpenBLAS's own choice stands, nothing to compare against
        return
    def show(out, err):
        return (out + err).strip().replace("\n", " | ")[:300]

    rc, out, err = T.run(["env", "-u", "OPENBLAS_CORETYPE", exe, "info"])
    T.check(rc == 0 and f"openblas kernels: {best}\n" in out and "note:" not in out,
            "cli info: the CPU's own kernels when OPENBLAS_CORETYPE is unset, no note", show(out, err))
    rc, out, err = T.run([exe, "info"], env={"OPENBLAS_CORETYPE": best})
    T.check(rc == 0 and "note:" not in out, f"cli info: no note when OPENBLAS_CORETYPE={best}", show(out, err))
    narrow = "Haswell" if best == "SkylakeX" else "Sandybridge"
    rc, out, err = T.run([exe, "info"], env={"OPENBLAS_CORETYPE": narrow})
    note = [l for l in out.splitlines() if l.startswith("note:")]
    T.check(rc == 0 and len(note) == 1 and best in note[0] and f"OPENBLAS_CORETYPE={narrow}" in note[0],
            f"cli info: a one-line note when OPENBLAS_CORETYPE={narrow} on a {best} CPU", show(out, err))


def write_st(path, tensors):
    T.st.write(path, tensors)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default="build")
    a = p.parse_args()
    b = a.build
    tmp = os.path.join(T.golden_dir(b), "cli")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    out = os.path.join(tmp, "out.safetensors")

    # --help everywhere
    for c in COMMANDS:
        rc, o, e = T.cli(b, [c, "--help"])
        T.check(rc == 0 and "usage:" in o and "--help" in o, f"cli {c} --help")
    rc, o, e = T.cli(b, ["--help"])
    T.check(rc == 0 and all(c in o for c in COMMANDS), "cli --help lists every command")
    test_help_lists_what_is_read(b)
    test_summary_and_progress(b, tmp)
    test_gradient_names(b)
    test_info_kernel_note(b)
    expect_error(b, "unknown command", ["frobnicate"], "unknown command")
    expect_error(b, "unknown option", ["run", "--bogus", "1"], "--bogus")
    expect_error(b, "option without its value", ["run", "--config"], "--config")
    expect_error(b, "unknown CP split", ["run", "--preset", "tiny", "--layer", "0", "--split", "zigzga",
                                         "--output", out], "--split")
    expect_error(b, "plan: unknown CP split", ["plan", "--preset", "flash", "--split", "zigzga"], "--split")
    expect_error(b, "plan: more tokens than int32 cu_seqlens hold",
                 ["plan", "--preset", "flash", "--seq", "2000000000", "--batch", "4"], "--seq x --batch")

    d, layer = T.make_case(b, "csa_packed", T.cases.CASES["csa_packed"])
    base = T.case_files(d, layer)
    cfg = json.load(open(os.path.join(d, "config.json")))
    weights = T.load(os.path.join(d, "weights.safetensors"))
    inp = T.load(os.path.join(d, "in.safetensors"))

    def with_config(name, change):
        c = dict(cfg)
        change(c)
        path = os.path.join(tmp, name + ".json")
        json.dump(c, open(path, "w"))
        return ["run", "--config", path] + base[2:] + ["--output", out]

    def with_weights(name, change):
        w = dict(weights)
        change(w)
        path = os.path.join(tmp, name + ".safetensors")
        write_st(path, w)
        args = list(base)
        args[args.index("--weights") + 1] = path
        return ["run"] + args + ["--output", out]

    def with_input(name, tensors):
        path = os.path.join(tmp, name + ".safetensors")
        write_st(path, tensors)
        args = list(base)
        args[args.index("--input") + 1] = path
        return ["run"] + args + ["--output", out]

    wq = "layers.2.attn.wq_a.weight"
    expect_error(b, "missing config file", ["run", "--config", os.path.join(tmp, "nope.json"), "--layer", "0",
                                            "--output", out], "nope.json")
    bad_json = os.path.join(tmp, "bad.json")
    open(bad_json, "w").write('{"hidden_size": 32,,}')
    expect_error(b, "config not JSON", ["run", "--config", bad_json] + base[2:] + ["--output", out], "JSON")
    expect_error(b, "config key missing", with_config("nokey", lambda c: c.pop("head_dim")), "head_dim")
    expect_error(b, "config impossible value", with_config("groups", lambda c: c.update(o_groups=3)), "o_groups")
    expect_error(b, "config odd rope dim", with_config("rope", lambda c: c.update(qk_rope_head_dim=7)), "qk_rope_head_dim")
    expect_error(b, "config bad ratio", with_config("ratio", lambda c: c.update(compress_ratios=[0, 0, 5, 0])), "compress_ratios")
    expect_error(b, "layer out of range", ["run"] + base[:2] + ["--layer", "9"] + base[4:] + ["--output", out], "--layer")
    expect_error(b, "missing weights file", ["run"] + base[:4] + ["--weights", os.path.join(tmp, "none.st")] + base[6:]
                 + ["--output", out], "none.st")
    expect_error(b, "missing tensor", with_weights("missing", lambda w: w.pop(wq)), wq)
    expect_error(b, "wrong-shaped tensor", with_weights("shape", lambda w: w.update({wq: w[wq][:, :-1]})), wq)
    expect_error(b, "wrong-dtype tensor", with_weights("dtype", lambda w: w.update({wq: w[wq].astype(np.int32)})), wq)
    garbage = os.path.join(tmp, "garbage.safetensors")
    open(garbage, "wb").write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    args = list(base)
    args[args.index("--weights") + 1] = garbage
    expect_error(b, "garbage safetensors", ["run"] + args + ["--output", out], "garbage.safetensors")
    trunc = os.path.join(tmp, "trunc.safetensors")
    data = open(os.path.join(d, "weights.safetensors"), "rb").read()
    open(trunc, "wb").write(data[: len(data) // 2])
    args[args.index("--weights") + 1] = trunc
    expect_error(b, "truncated safetensors", ["run"] + args + ["--output", out], "trunc.safetensors")
    x = inp["x"]
    cu = inp["cu_seqlens"]
    expect_error(b, "x of the wrong width", with_input("width", {"x": x[:, :-2], "cu_seqlens": cu}), "width")
    bad_cu = cu.copy()
    bad_cu[2] = bad_cu[1]
    expect_error(b, "cu_seqlens not increasing", with_input("cu_inc", {"x": x, "cu_seqlens": bad_cu}), "cu_seqlens")
    short = cu.copy()
    short[-1] -= 4
    expect_error(b, "cu_seqlens not ending at T", with_input("cu_end", {"x": x, "cu_seqlens": short}), "cu_seqlens")
    real = inp["seqlens_real"].copy()
    real[0] = int(cu[1] - cu[0]) + 1
    expect_error(b, "seqlens_real out of range", with_input("real", {"x": x, "cu_seqlens": cu, "seqlens_real": real}),
                 "seqlens_real")
    odd = np.array([0, 30, x.shape[0]], dtype=np.int32)  # no alignment rule (SPEC 4): accepted
    rc, o, e = T.cli(b, with_input("pad", {"x": x, "cu_seqlens": odd}))
    T.check(rc == 0, "cli accepts documents whose length is not a multiple of r", e.strip()[-200:])
    expect_error(b, "input without x", with_input("nox", {"cu_seqlens": cu}), "'x'")
    expect_error(b, "missing input file", ["run"] + base[:6] + ["--input", os.path.join(tmp, "none.st"), "--output", out],
                 "none.st")
    gbad = os.path.join(tmp, "gbad.safetensors")
    write_st(gbad, {"dout": np.zeros((3, 3), np.float32)})
    args = list(base)
    args[args.index("--grad-output") + 1] = gbad
    expect_error(b, "dout of the wrong shape", ["run"] + args + ["--output", out], "dout")
    expect_error(b, "unwritable output", ["run"] + base + ["--output", "/nonexistent/dir/out.safetensors"], "--output")
    expect_error(b, "non-numeric --seed", ["run", "--preset", "tiny", "--layer", "0", "--seed", "x", "--output", out], "--seed")
    expect_error(b, "bench --sgemm-size out of range", ["bench", "--preset", "tiny", "--layer", "0", "--sgemm-size",
                                                         "9"], "--sgemm-size")
    expect_error(b, "bad --split", ["run", "--preset", "tiny", "--layer", "0", "--split", "diagonal", "--output", out],
                 "--split")
    expect_error(b, "bad input on 2 ranks", with_input("width2", {"x": x[:, :-2], "cu_seqlens": cu}), "width", nranks=2)

    # the output file: exact names (SPEC 7)
    rc, o, e = T.cli(b, ["run"] + base + ["--output", out])
    names = set(T.load(out)) if rc == 0 else set()
    want = {"out", "topk_ids", "indexer_loss", "dx"} | {"grad." + n for n in weights}
    T.check(names == want, "cli run writes exactly out, topk_ids, indexer_loss, dx and grad.<weight name>",
            f"missing {sorted(want - names)[:3]} extra {sorted(names - want)[:3]}")
    rc, o, e = T.cli(b, ["run", "--preset", "tiny", "--layer", "1", "--seq", "64", "--output", out])
    names = set(T.load(out)) if rc == 0 else set()
    T.check(names == {"out", "topk_ids", "indexer_loss"}, "cli run without dout writes the forward tensors only",
            str(sorted(names)))
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
