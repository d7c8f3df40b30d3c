"""testlib.py: what the Python test drivers share: PASS/FAIL lines (counted by tests/run_all.sh),
running the CLI (under mpirun for N > 1), golden cases from tests/ref (generated once per build
directory and reused by the sanitizer run), and array comparisons.

Tolerances (SPEC 6 and 8):
  against the float64 reference: out 1e-4, gradients 1e-3 relative to the tensor's max |value|
  CP = N against CP = 1: out, top-k and loss bitwise (when the BLAS probe says rows are position
  invariant), dx 1e-5 and weight gradients 1e-4 relative to max(1, max |value|)."""
import contextlib
import fcntl
import hashlib
import os
import shlex
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REF = os.path.join(HERE, "ref")
sys.path.insert(0, REF)
import cases  # noqa: E402
import st  # noqa: E402

PYTHON = "/usr/bin/python3"
TOL_CP_OUT, TOL_CP_GRAD = 1e-5, 1e-4

_counts = {"pass": 0, "fail": 0}


def check(ok, name, detail=""):
    """Prints one PASS/FAIL line (the runner counts them)."""
    _counts["pass" if ok else "fail"] += 1
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    return ok


def finish():
    print(f"{_counts['pass']} passed, {_counts['fail']} failed", flush=True)
    return 1 if _counts["fail"] else 0


def sanitized():
    return os.environ.get("DSV4_SANITIZED") == "1"


def run(cmd, timeout=300, env=None):
    """Runs a command; returns (returncode, stdout, stderr). A timeout is returncode -9."""
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    if env:
        e.update(env)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as ex:
        return -9, ex.stdout or "", (ex.stderr or "") + "\n[timeout]"


def cli(build, args, nranks=1, timeout=300, env=None):
    """dsv4cp with args, under mpirun when nranks > 1."""
    exe = os.path.join(build, "dsv4cp")
    cmd = [exe] + args
    if nranks > 1:
        cmd = ["mpirun", "--quiet", "--oversubscribe", "--allow-run-as-root", "-np", str(nranks)] + cmd
    return run(cmd, timeout=timeout, env=env)


def golden_dir(build):
    d = os.environ.get("DSV4_GOLDEN") or os.path.join(build, "golden")
    os.makedirs(d, exist_ok=True)
    return d


def _ref_stamp(args):
    h = hashlib.sha256(args.encode())
    for f in sorted(os.listdir(REF)):
        if f.endswith(".py"):
            with open(os.path.join(REF, f), "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


@contextlib.contextmanager
def case_lock(d):
    """Holds an exclusive lock on golden case directory d (its sibling file d.lock) while a case is
    checked and made: run_all.sh runs two test programs at once, and several make the same cases."""
    os.makedirs(os.path.dirname(d), exist_ok=True)
    with open(d + ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def make_case(build, name, args, with_ref=True):
    """Generates case `name` from gen_case arguments (and ref.py's expected output) unless an
    up-to-date copy exists. Returns (dir, layer)."""
    d = os.path.join(golden_dir(build), name)
    with case_lock(d):
        return _make_case(d, name, args, with_ref)


def _make_case(d, name, args, with_ref):
    stamp_file = os.path.join(d, "stamp")
    stamp = _ref_stamp(args + (" +ref" if with_ref else ""))
    layer = cases.layer_of_args(args) if hasattr(cases, "layer_of_args") else _layer_of(args)
    if os.path.exists(stamp_file) and open(stamp_file).read() == stamp:
        return d, layer
    os.makedirs(d, exist_ok=True)
    rc, out, err = run([PYTHON, os.path.join(REF, "gen_case.py"), "--out", d] + shlex.split(args), timeout=120)
    if rc != 0:
        raise RuntimeError(f"gen_case {name} failed: {err.strip()}")
    if with_ref:
        cmd = [PYTHON, os.path.join(REF, "ref.py")] + case_files(d, layer) + ["--output", os.path.join(d, "exp.safetensors")]
        rc, out, err = run(cmd, timeout=300)
        if rc != 0:
            raise RuntimeError(f"ref.py {name} failed: {err.strip()}")
    with open(stamp_file, "w") as fh:
        fh.write(stamp)
    return d, layer


def _layer_of(args):
    a = shlex.split(args)
    return int(a[a.index("--layer") + 1]) if "--layer" in a else 2


def case_files(d, layer, grad=True):
    """The run/ref arguments of a case directory."""
    a = ["--config", os.path.join(d, "config.json"), "--layer", str(layer),
         "--weights", os.path.join(d, "weights.safetensors"), "--input", os.path.join(d, "in.safetensors")]
    g = os.path.join(d, "grad.safetensors")
    if grad and os.path.exists(g):
        a += ["--grad-output", g]
    return a


def compare_ref(got, exp, label):
    """compare.py against the float64 reference; returns (ok, last line)."""
    rc, out, err = run([PYTHON, os.path.join(REF, "compare.py"), "--got", got, "--expected", exp, "--label", label])
    lines = [l for l in out.splitlines() if l.strip()]
    bad = [l for l in lines if l.startswith("FAIL")]
    return rc == 0, (bad[0] if bad else (lines[-1] if lines else err.strip()))


def load(path):
    return st.read(path) if hasattr(st, "read") else st.load(path)


def max_rel(a, b, floor):
    """max|a - b| / max(floor, max|b|); inf when the shapes differ or either side has a NaN (a NaN
    must never pass a `<= tol` check: `nan > tol` is false)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or np.isnan(a).any() or np.isnan(b).any():
        return float("inf")
    m = float(np.max(np.abs(b))) if b.size else 0.0
    return float(np.max(np.abs(a - b))) / max(floor, m) if a.size else 0.0


def forward_name(name):
    """out, topk_ids, indexer_loss, or their per-layer names out.{L} ... (--layers)."""
    base, _, tail = name.rpartition(".")
    return name in ("out", "topk_ids", "indexer_loss") or (tail.isdigit() and base in ("out", "topk_ids", "indexer_loss"))


def compare_cp(got, one, label, bitwise):
    """CP = N output file against the CP = 1 output file (SPEC 6). Returns a list of failures."""
    a, b = load(got), load(one)
    fails = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            fails.append(f"{name} missing in one output")
            continue
        x, y = np.asarray(a[name]), np.asarray(b[name])
        if x.shape != y.shape:
            fails.append(f"{name} shape {x.shape} vs {y.shape}")
        elif forward_name(name):
            if name == "topk_ids" or bitwise:
                if not np.array_equal(x.view(np.uint8) if x.dtype != np.int32 else x,
                                      y.view(np.uint8) if y.dtype != np.int32 else y):
                    fails.append(f"{name} not bitwise equal (max rel {max_rel(x, y, 1.0):.2g})")
            elif max_rel(x, y, 1.0) > TOL_CP_OUT:
                fails.append(f"{name} rel {max_rel(x, y, 1.0):.2g}")
        else:
            tol = TOL_CP_OUT if name == "dx" or name.startswith("dx.") else TOL_CP_GRAD
            r = max_rel(x, y, 1.0)
            if r > tol:
                fails.append(f"{name} rel {r:.2g} > {tol}")
    return fails
