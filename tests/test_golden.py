#!/usr/bin/env -S /usr/bin/python3
"""test_golden.py: the single-rank layer against the independent float64 PyTorch reference
(tests/ref) on every standard case, with the fast path and with the naive path (SPEC 8 tolerances:
out 1e-4, gradients 1e-3 relative; top-k identical except reference near-ties)."""
import argparse
import os
import sys

import testlib as T


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default="build")
    p.add_argument("cases", nargs="*", help="case names (default: all)")
    a = p.parse_args()
    names = a.cases or list(T.cases.CASES)
    for name in names:
        try:
            d, layer = T.make_case(a.build, name, T.cases.CASES[name])
        except RuntimeError as e:
            T.check(False, f"golden {name}: reference", str(e))
            continue
        for path, flag in (("fast", []), ("naive", ["--naive"])):
            got = os.path.join(d, f"got_{path}.safetensors")
            if os.path.exists(got):
                os.remove(got)
            rc, out, err = T.cli(a.build, ["run"] + T.case_files(d, layer) + ["--output", got] + flag, timeout=600)
            if rc != 0:
                T.check(False, f"golden {name} {path}", f"dsv4cp run exit {rc}: {err.strip()[-300:]}")
                continue
            ok, line = T.compare_ref(got, os.path.join(d, "exp.safetensors"), name)
            T.check(ok, f"golden {name} {path} vs float64 reference", line)
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
