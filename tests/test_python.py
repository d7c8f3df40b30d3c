#!/usr/bin/env -S /usr/bin/python3
"""test_python.py: the PyTorch binding (python/dsv4cp, SPEC 9).

  * ctypes mirrors: sizeof/offsetof of every mirrored struct and field, from a compiled C program,
    against python/dsv4cp/_structs.py (drift in include/dsv4cp.h is caught here);
  * CP = 1 against the float64 reference (tests/ref, SPEC 8 tolerances and near-tie rule) for
    r = 0, 4, 128, packed and batched, forward and every gradient including dx; and against
    `dsv4cp run` on the same files (forward and top-k bitwise, gradients SPEC 6);
  * CP with mpi4py under mpirun -np 2 and 3 (contiguous and zigzag): forward and top-k bitwise
    equal to the binding at CP = 1 and to `dsv4cp run` at the same N, gradients within SPEC 6;
  * OpenBLAS kernels: bitwise equal to the CLI whether torch, dsv4cp or a numpy with foreign kernels
    was loaded first; a warning when told not to switch; CP = 1 works without mpi4py;
  * bad input raises on every rank (np 1, 2, 3), nothing hangs, the module stays usable;
  * module semantics (tests/py_checks.py).
The Python processes are helpers (tests/py_runner.py, py_bad_input.py, py_checks.py); this driver
prints the PASS/FAIL lines. Skipped in the sanitizer pass (a ctypes-loaded ASan library needs the
ASan runtime loaded before Python)."""
import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import testlib as T

PY_ENV = {"PYTHONPATH": os.path.join(T.ROOT, "python")}
MPIRUN = ["mpirun", "--quiet", "--oversubscribe", "--allow-run-as-root"]
FAIL_SECONDS = 60   # an mpirun whose ranks all raise must be over well within this

# CP = 1 against the reference: name -> (tests/ref/cases.py name)
REF_CASES = ("swa_packed", "swa_batch", "csa_packed", "csa_batch", "csa_ties", "csa_unpadded", "csa_batch_unaligned",
             "hca_packed", "hca_batch", "hca_unpadded")
# CP cases (test_cp.py's) and the splits run at each N
CP_CASES = {
    "cp_csa_doc_boundary": {2: ("contiguous", "zigzag"), 3: ("contiguous",)},
    "cp_csa_unpadded_mix": {2: ("zigzag",), 3: ("contiguous",)},      # documents of 1..13 tokens
    "cp_hca_straddle": {2: ("contiguous",), 3: ("contiguous",)},      # slots across rank boundaries
    "cp_csa_batch_unaligned": {2: ("contiguous",), 3: ("contiguous",)},  # S % r != 0
    "cp_csa_batch": {2: ("zigzag",)},
    "cp_swa_packed": {3: ("contiguous",)},
}
# with recompute=True as well: every tensor bitwise equal to the same run without it
RECOMPUTE_CP = {"cp_csa_unpadded_mix": (2, "zigzag"), "cp_hca_straddle": (3, "contiguous")}
BAD_CASE = "cp_swa_packed"
# case -> needle of the expected message (lower case; a tuple: any of them); None: any exception
BAD_EXPECT = {
    "wrong width": "width", "wrong width on the last rank only": "width", "integer x": "float",
    "cu_seqlens not increasing": "cu_seqlens", "cu_seqlens not ending at T": None,
    "seqlens_real of the wrong length": "seqlens_real", "seqlens_real longer than its document": "seqlens_real",
    "config file missing": "missing", "layer out of range": "layer 99", "weights file missing on rank 0": "missing",
    "backward of a stale forward": "earlier forward",
}
BAD_EXPECT_CP = {"cu_seqlens different on rank 0": "disagree", "T not divisible by N": ("divisible", "multiple"),
                 "rows not T/N on rank 0": "rows"}


def tail(text, n=300):
    """The end of a process's output as one line (PASS/FAIL details must not span lines)."""
    return " | ".join(l for l in text.strip().splitlines() if l.strip())[-n:]


def cp_case_args(name):
    import test_cp
    return test_cp.CP_CASES[name] if name in test_cp.CP_CASES else test_cp.UNPADDED_CASES[name][0]


# ---- ctypes mirrors ------------------------------------------------------------------------------

def load_structs():
    """python/dsv4cp/_structs.py alone (not the package: that would load the library and torch)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("dsv4cp_structs", os.path.join(T.ROOT, "python", "dsv4cp", "_structs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_struct_mirrors(build):
    S = load_structs()
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "dsv4cp.h"', "int main(void) {"]
    for cname, mirror in S.MIRRORED.items():
        lines.append(f'  printf("{cname} sizeof %zu\\n", sizeof({cname}));')
        for field, _ in mirror._fields_:
            lines.append(f'  printf("{cname}.{field} %zu %zu\\n", offsetof({cname}, {field}), '
                         f'sizeof((({cname} *)0)->{field}));')
    lines += ["  return 0;", "}"]
    tmp = tempfile.mkdtemp(dir=build)
    src, exe = os.path.join(tmp, "layout.c"), os.path.join(tmp, "layout")
    open(src, "w").write("\n".join(lines) + "\n")
    rc, out, err = T.run(["cc", "-std=c17", "-I" + os.path.join(T.ROOT, "include"), src, "-o", exe])
    if not T.check(rc == 0, "python struct mirrors: layout probe compiles", tail(err, 300)):
        return
    rc, out, err = T.run([exe])
    got = dict(l.split(" ", 1) for l in out.splitlines())
    for cname, mirror in S.MIRRORED.items():
        bad = []
        if int(got[f"{cname}"].split()[1]) != ctypes.sizeof(mirror):
            bad.append(f"sizeof C {got[cname].split()[1]} vs ctypes {ctypes.sizeof(mirror)}")
        for field, _ in mirror._fields_:
            off, size = (int(v) for v in got[f"{cname}.{field}"].split())
            desc = getattr(mirror, field)
            if (off, size) != (desc.offset, desc.size):
                bad.append(f"{field}: C offset {off} size {size}, ctypes {desc.offset} {desc.size}")
        T.check(not bad, f"python struct mirror {cname} matches include/dsv4cp.h ({len(mirror._fields_)} fields)",
                "; ".join(bad[:4]))


# ---- files in, files out ---------------------------------------------------------------------------

def job_file(d, layer, output, jobs_dir, split="contiguous", state_dict=False, grad=True, recompute=False):
    job = {"config": os.path.join(d, "config.json"), "layer": layer,
           "weights": os.path.join(d, "weights.safetensors"), "input": os.path.join(d, "in.safetensors"),
           "output": output, "split": split, "state_dict": state_dict, "recompute": recompute}
    g = os.path.join(d, "grad.safetensors")
    if grad and os.path.exists(g):
        job["grad"] = g
    path = os.path.join(jobs_dir, os.path.basename(output) + ".json")
    with open(path, "w") as fh:
        json.dump(job, fh)
    return path


def runner(jobs, nranks=1, order="torch-first", extra=(), env=None, timeout=300):
    cmd = [T.PYTHON, os.path.join(T.HERE, "py_runner.py")] + list(jobs) + ["--order", order] + list(extra)
    if nranks > 1:
        cmd = MPIRUN + ["-np", str(nranks)] + cmd
    e = dict(PY_ENV)
    e.update(env or {})
    return T.run(cmd, timeout=timeout, env=e)


def cli_out(build, d, layer, output, nranks=1, split="contiguous"):
    args = ["run"] + T.case_files(d, layer) + ["--output", output] + (["--split", split] if split != "contiguous" else [])
    rc, out, err = T.cli(build, args, nranks=nranks, timeout=300)
    return rc == 0, tail(err, 300)


def test_reference(build, work):
    """CP = 1: every case in one Python process, judged against the reference and the CLI."""
    cases = {name: T.make_case(build, name, T.cases.CASES[name]) for name in REF_CASES}
    jobs = [job_file(d, layer, os.path.join(work, f"py1_{name}.safetensors"), work,
                     state_dict=(name == "csa_packed")) for name, (d, layer) in cases.items()]
    rc, out, err = runner(jobs)
    if not T.check(rc == 0, "python CP=1 runs every reference case", tail(err, 400)):
        return
    for name, (d, layer) in cases.items():
        got = os.path.join(work, f"py1_{name}.safetensors")
        ok, line = T.compare_ref(got, os.path.join(d, "exp.safetensors"), name)
        T.check(ok, f"python {name} CP=1 vs float64 reference (forward and every gradient)", line)
        cli = os.path.join(work, f"cli1_{name}.safetensors")
        ok, why = cli_out(build, d, layer, cli)
        if T.check(ok, f"python {name}: dsv4cp run on the same files", why):
            fails = T.compare_cp(got, cli, name, bitwise=True)
            T.check(not fails, f"python {name} CP=1 vs dsv4cp run (forward and top-k bitwise, grads SPEC 6)",
                    "; ".join(fails))


def test_cp(build, work):
    """mpirun -np 2 and 3 with mpi4py: against the binding at CP = 1 and the CLI at the same N."""
    cases = {name: T.make_case(build, name, cp_case_args(name)) for name in CP_CASES}
    one = {}
    jobs = []
    for name, (d, layer) in cases.items():
        one[name] = os.path.join(work, f"py1_{name}.safetensors")
        jobs.append(job_file(d, layer, one[name], work))
    rc, out, err = runner(jobs)
    if not T.check(rc == 0, "python CP cases at CP=1", tail(err, 300)):
        return
    for name, (d, layer) in cases.items():
        ok, line = T.compare_ref(one[name], os.path.join(d, "exp.safetensors"), name)
        T.check(ok, f"python {name} CP=1 vs float64 reference", line)
    for n in (2, 3):
        todo = [(name, split) for name, per in CP_CASES.items() for split in per.get(n, ())]
        jobs = [job_file(*cases[name], os.path.join(work, f"py{n}_{split}_{name}.safetensors"), work, split=split)
                for name, split in todo]
        again = [(name, split) for name, (rn, split) in RECOMPUTE_CP.items() if rn == n]
        jobs += [job_file(*cases[name], os.path.join(work, f"py{n}_{split}_{name}_recompute.safetensors"), work,
                          split=split, recompute=True) for name, split in again]
        t0 = time.time()
        rc, out, err = runner(jobs, nranks=n)
        if not T.check(rc == 0, f"python CP={n} with mpi4py runs {len(jobs)} cases",
                       f"{time.time() - t0:.1f} s " + tail(err, 400)):
            continue
        for name, split in todo:
            d, layer = cases[name]
            got = os.path.join(work, f"py{n}_{split}_{name}.safetensors")
            tag = f"python {name} CP={n} {split}"
            fails = T.compare_cp(got, one[name], tag, bitwise=True)
            T.check(not fails, f"{tag} vs python CP=1 (forward and top-k bitwise, grads SPEC 6)", "; ".join(fails))
            cli = os.path.join(work, f"cli{n}_{split}_{name}.safetensors")
            ok, why = cli_out(build, d, layer, cli, nranks=n, split=split)
            if T.check(ok, f"{tag}: dsv4cp run under mpirun -np {n}", why):
                fails = T.compare_cp(got, cli, tag, bitwise=True)
                T.check(not fails, f"{tag} vs dsv4cp run at the same N (forward and top-k bitwise)", "; ".join(fails))
        for name, split in again:
            base = os.path.join(work, f"py{n}_{split}_{name}.safetensors")
            rec = os.path.join(work, f"py{n}_{split}_{name}_recompute.safetensors")
            a, b = T.load(rec), T.load(base)
            differ = sorted(k for k in set(a) | set(b) if k not in a or k not in b or a[k].tobytes() != b[k].tobytes())
            T.check(not differ, f"python {name} CP={n} {split} recompute=True: every tensor bitwise as without",
                    f"differ: {differ[:4]}" if differ else "")


def test_blas_order(build, work):
    """The OpenBLAS kernels: whatever was imported first, the binding's bits are the CLI's."""
    d, layer = T.make_case(build, "csa_packed", T.cases.CASES["csa_packed"])
    cli = os.path.join(work, "cli1_csa_packed.safetensors")
    if not os.path.exists(cli):
        cli_out(build, d, layer, cli)
    rc, out, err = T.cli(build, ["info"])
    cli_fp = re.search(r"BLAS fingerprint: ([0-9a-f]{16})", out)
    cli_fp = cli_fp.group(1) if cli_fp else None
    T.check(rc == 0 and cli_fp, "python blas: dsv4cp info prints the program's BLAS fingerprint", tail(out + err, 200))
    for order, extra, env, what in (
            ("dsv4cp-first", [], {}, "dsv4cp imported before torch"),
            ("numpy-prescott", [], {}, "numpy loaded OpenBLAS with SSE3 kernels first: dsv4cp re-selects the CLI's"),
            ("torch-first", ["--no-mpi"], {}, "CP = 1 without mpi4py")):
        got = os.path.join(work, f"py_order_{order}{extra[0] if extra else ''}.safetensors")
        job = job_file(d, layer, got, work)
        rc, out, err = runner([job], order=order, extra=extra, env=env)
        if not T.check(rc == 0, f"python blas: {what}: runs", tail(err, 300)):
            continue
        info = re.search(r"blas (\{.*\})", out)
        info = json.loads(info.group(1)) if info else {}
        fails = T.compare_cp(got, cli, order, bitwise=True)
        T.check(not fails, f"python blas: {what}: bitwise equal to dsv4cp run",
                f"{'; '.join(fails)} kernels {info.get('core')} (CLI: {info.get('target')}, switched {info.get('switched')})")
        T.check(cli_fp and info.get("fingerprint") == cli_fp,
                f"python blas: {what}: the binding's BLAS fingerprint is the program's",
                f"{info.get('fingerprint')} against {cli_fp}")
        if order == "numpy-prescott":
            T.check(info.get("core_at_import", "").lower() == "prescott" and info.get("switched"),
                    "python blas: the foreign kernels were seen and switched", json.dumps(info))
    # told not to switch: a loud warning, never silence
    job = job_file(d, layer, os.path.join(work, "py_noswitch.safetensors"), work, grad=False)
    rc, out, err = runner([job], order="numpy-prescott", env={"DSV4CP_BLAS_SWITCH": "0"})
    T.check(rc == 0 and "RuntimeWarning" in err and "kernels" in err,
            "python blas: DSV4CP_BLAS_SWITCH=0 with other kernels loaded warns", tail(err, 200))


def test_bad_input(build):
    d, layer = T.make_case(build, BAD_CASE, cp_case_args(BAD_CASE))
    for n in (1, 2, 3):
        cmd = [T.PYTHON, os.path.join(T.HERE, "py_bad_input.py"), d, str(layer)]
        if n > 1:
            cmd = MPIRUN + ["-np", str(n)] + cmd
        t0 = time.time()
        rc, out, err = T.run(cmd, timeout=FAIL_SECONDS, env=PY_ENV)
        seconds = time.time() - t0
        if not T.check(rc == 0 and seconds < FAIL_SECONDS, f"python bad input N={n}: every call returns, no hang",
                       f"exit {rc}, {seconds:.1f} s {tail(err, 300)}"):
            continue
        results = {}
        for m in re.finditer(r"^rank (\d+) case (.+?): (no exception|raised (\w+): (.*))$", out, re.M):
            results.setdefault(m.group(2), {})[int(m.group(1))] = (m.group(4), m.group(5) or "")
        expect = dict(BAD_EXPECT, **(BAD_EXPECT_CP if n > 1 else {}))
        for case, needle in expect.items():
            per = results.get(case, {})
            needles = (needle,) if isinstance(needle, str) else needle
            raised = [r for r, (typ, msg) in per.items()
                      if typ and (needles is None or any(k in msg.lower() for k in needles))]
            msg = next(iter(per.values()), ("", ""))[1] if per else "no output"
            T.check(len(raised) == n and len(per) == n, f"python bad input N={n}: {case}: raises on every rank",
                    f"{len(raised)}/{n} ranks: {msg[:120]}")
        healthy = re.findall(r"^rank \d+ healthy after the errors: yes$", out, re.M)
        T.check(len(healthy) == n, f"python bad input N={n}: afterwards the module gives a fresh module's results",
                f"{len(healthy)}/{n} ranks")


def test_module(build):
    d, layer = T.make_case(build, "csa_packed", T.cases.CASES["csa_packed"])
    rc, out, err = T.run([T.PYTHON, os.path.join(T.HERE, "py_checks.py"), d, str(layer)], timeout=300, env=PY_ENV)
    lines = [l for l in out.splitlines() if l.startswith(("PASS", "FAIL"))]
    for l in lines:
        T.check(l.startswith("PASS"), l[5:])
    T.check(rc == 0 and lines, "python module checks exit cleanly", f"exit {rc} {tail(err, 300)}")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default="build")
    a = p.parse_args()
    if T.sanitized():
        print("note: the Python binding is not tested in the sanitizer pass (libdsv4cp.so built with ASan "
              "can be loaded by ctypes only when the ASan runtime is loaded before the interpreter)")
        return T.finish()
    build = os.path.abspath(a.build)
    work = os.path.join(T.golden_dir(build), "python")
    os.makedirs(work, exist_ok=True)
    test_struct_mirrors(build)
    test_reference(build, work)
    test_cp(build, work)
    test_blas_order(build, work)
    test_bad_input(build)
    test_module(build)
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
