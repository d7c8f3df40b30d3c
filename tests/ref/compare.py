#!/usr/bin/env -S /usr/bin/python3
"""compare.py: compares a C output (OUT, F32) with the reference (EXP, from ref.py), or two C outputs.

  compare.py --got OUT.safetensors --expected EXP.safetensors [--tol-out 1e-4] [--tol-grad 1e-3]
             [--tie-rtol 1e-6] [--label NAME] [--exact] [--loose-zero-ties]

Rules (SPEC 8):
* Every tensor of EXP must be in OUT and vice versa, with the same shape. Exception: tensors that
  EXP's metadata lists as reference_only (topk_scores, index_scores) need not be in OUT.
* Float tensors: err = max|a - b| passes iff err <= tol * max|b| (tol-out for out, indexer_loss and any
  other float; tol-grad for dx and grad.*); if max|b| == 0, a must be exactly 0. Non-finite entries
  of b (the -inf padding of scores) must be identical in a. NaN in a always fails.
* topk_ids: rows must be equal, except near-ties: at a position where the ids differ, the id OUT
  chose must be visible to the query and distinct within its row, the -1 padding must be identical, and
  its reference score (index_scores of EXP) must equal the reference score at that position (EXP's
  topk_scores) within tie-rtol * (largest |score| of the row's visible slots). Both lists are sorted
  by score, so position i holds the i-th largest score: this accepts any order of near-equal scores
  and nothing else. Exception: a tie at exactly 0.0 (ReLU zeros: exact in every precision) must be
  broken towards the smaller id like the reference (--loose-zero-ties turns this off).
  Rows whose ids differ at near-ties are excluded from the `out` comparison (out[t] depends only on
  query t's own selection) and listed; dx, weight gradients and the loss cannot be split by row, so a
  failure there is flagged as possibly caused by the tie.
* Layer ranges (ref41.py, SPEC 10): every name above may carry a layer suffix (out.3, topk_ids.3,
  dx.3, ...) and each layer is judged on its own. topk_ids.{L} near-ties are judged with
  index_scores_masked.{L} when EXP has it (the scores after the candidate mask: an id outside the
  kept blocks is never a near-tie), else index_scores.{L}; rows with accepted near-ties are left out
  of out.{U} for every layer U that attends with L's selection (EXP metadata selection_users).
* --exact: every tensor must be bitwise identical with the same dtype (e.g. CP = N vs CP = 1).
Prints one line per tensor and a summary; exits 1 on any failure.
"""
import argparse
import os
import sys

import numpy as np

sys.dont_write_bytecode = True   # keep tests/ref free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

GRAD_NAMES = ("dx",)
# outputs that a layer range (ref41.py, SPEC 10) writes once per layer as NAME.{L}
LAYER_SUFFIXED = ("out", "topk_ids", "topk_scores", "index_scores", "index_scores_masked", "indexer_loss", "dx")
GRAD_PREFIX = "grad."
NO_ID = -1


class Report:
    def __init__(self, label):
        self.label = f"[{label}] " if label else ""
        self.n_ok = self.n_fail = 0

    def line(self, ok, name, text):
        self.n_ok += ok
        self.n_fail += not ok
        print(f"{self.label}{'ok  ' if ok else 'FAIL'} {name:<52} {text}")

    def note(self, text):
        print(f"{self.label}NOTE {text}")


def is_grad(name):
    return split_layer(name)[0] in GRAD_NAMES or name.startswith(GRAD_PREFIX)


def compare_float(a, b, tol, skip_rows=None):
    """Returns (ok, text). skip_rows: boolean mask over the leading (token) rows to leave out."""
    a = a.astype(np.float64).reshape(-1)
    b = b.astype(np.float64).reshape(-1)
    if skip_rows is not None:           # token rows of out ([T, d] or [B, S, d])
        keep = ~skip_rows
        a = a.reshape(len(skip_rows), -1)[keep].reshape(-1)
        b = b.reshape(len(skip_rows), -1)[keep].reshape(-1)
    if np.isnan(a).any():
        return False, f"{int(np.isnan(a).sum())} NaN"
    finite = np.isfinite(b)
    if not np.array_equal(a[~finite], b[~finite]):
        return False, "non-finite entries of the reference differ"
    if not np.isfinite(a[finite]).all():
        return False, "non-finite values where the reference is finite"
    if a.size == 0 or not finite.any():
        return True, "empty"
    err = float(np.abs(a[finite] - b[finite]).max())
    scale = float(np.abs(b[finite]).max())
    if scale == 0.0:
        return err == 0.0, f"max_err {err:.1e} (reference is exactly 0)"
    return err <= tol * scale, f"max_err {err:.1e} rel {err / scale:.1e} (tol {tol:.0e}, max|ref| {scale:.2e})"


def compare_topk(got, exp, exp_scores, index_scores, tie_rtol, strict_zero_ties):
    """Returns (ok, text, rows whose ids differ at accepted near-ties)."""
    tie_rows = np.zeros(exp.shape[0], dtype=bool)
    problems, n_diff_pos, worst_gap = [], 0, 0.0
    for t in np.nonzero((got != exp).any(axis=1))[0]:
        g, e = got[t], exp[t]
        n_e = int((e != NO_ID).sum())
        if not np.array_equal(g[n_e:], e[n_e:]) or (g[:n_e] == NO_ID).any():
            problems.append(f"row {t}: {int((g != NO_ID).sum())} ids where the reference has {n_e}")
            continue
        if len(set(g[:n_e].tolist())) != n_e:
            problems.append(f"row {t}: repeated id {g[:n_e].tolist()}")
            continue
        visible = np.isfinite(index_scores[t]) if index_scores is not None else None
        scale = float(np.abs(index_scores[t][visible]).max()) if visible is not None and visible.any() else 0.0
        for i in np.nonzero(g[:n_e] != e[:n_e])[0]:
            n_diff_pos += 1
            gid = int(g[i])
            if index_scores is None or not (0 <= gid < index_scores.shape[1]) or not visible[gid]:
                problems.append(f"row {t} pos {i}: id {gid} is not a visible slot of this query "
                                f"(or no index_scores to judge it); reference {e[:n_e].tolist()}")
                break
            s_got = float(index_scores[t, gid])
            s_exp = float(exp_scores[t, i] if exp_scores is not None else index_scores[t, e[i]])
            if strict_zero_ties and s_got == 0.0 and s_exp == 0.0:
                problems.append(f"row {t} pos {i}: exact 0.0 tie broken towards id {gid}, reference "
                                f"{int(e[i])} (ties go to the smaller id)")
                break
            gap = abs(s_got - s_exp)
            if gap > tie_rtol * scale:
                problems.append(f"row {t} pos {i}: id {gid} (score {s_got:.9g}) instead of {int(e[i])} "
                                f"(score {s_exp:.9g}); got {g[:n_e].tolist()} reference {e[:n_e].tolist()}")
                break
            worst_gap = max(worst_gap, gap / scale if scale else 0.0)
        else:
            tie_rows[t] = True
    if problems:
        shown = "; ".join(problems[:3]) + (f"; ... {len(problems) - 3} more" if len(problems) > 3 else "")
        return False, f"{len(problems)} bad rows: {shown}", tie_rows
    if tie_rows.any():
        return True, (f"{n_diff_pos} positions in {int(tie_rows.sum())} rows differ, all near-ties "
                      f"(largest gap {worst_gap:.1e} of the row's scale)"), tie_rows
    return True, f"identical ({exp.shape[0]} rows)", tie_rows


def compare_exact(rep, got, got_dt, exp, exp_dt):
    for name in exp:
        if name not in got:
            rep.line(False, name, "missing from --got")
            continue
        a, b = got[name], exp[name]
        if got_dt[name] != exp_dt[name] or a.shape != b.shape:
            rep.line(False, name, f"{got_dt[name]}{list(a.shape)} vs {exp_dt[name]}{list(b.shape)}")
            continue
        same = a.tobytes() == b.tobytes()
        if same:
            rep.line(True, name, "bitwise identical")
        else:
            bits = f"u{a.itemsize}"
            differ = int((a.reshape(-1).view(bits) != b.reshape(-1).view(bits)).sum())
            err = np.abs(a.astype(np.float64) - b.astype(np.float64))
            worst = float(np.nanmax(err)) if err.size else 0.0
            rep.line(False, name, f"{differ} of {a.size} elements differ, max_err {worst:.1e}")
    for name in got:
        if name not in exp:
            rep.line(False, name, "in --got but not in --expected")


def split_layer(name):
    """'out.3' -> ('out', '.3'); V4 names and grad.* names -> (name, '')."""
    base, dot, tail = name.rpartition(".")
    if dot and tail.isdigit() and base in LAYER_SUFFIXED:
        return base, "." + tail
    return name, ""


def selection_users(meta):
    """{'.I': ['.L', ...]} from ref41.py's metadata 'I:L L;...' (which layers attend with index
    source I's selection); empty for V4 (then topk_ids only ever affects out)."""
    users = {}
    for item in filter(None, meta.get("selection_users", "").split(";")):
        src, _, layers = item.partition(":")
        users["." + src] = ["." + L for L in layers.split()]
    return users


def check_topk(rep, got, exp, suffix, a):
    """Compares topk_ids<suffix>; returns the rows that differ at accepted near-ties, or None.
    Near-ties are judged with the scores the selection was made from: index_scores_masked<suffix>
    (after the candidate mask) when the reference wrote it, else index_scores<suffix>."""
    name = "topk_ids" + suffix
    g, e = got[name], exp[name]
    if g.shape != e.shape:
        rep.line(False, name, f"shape {list(g.shape)} vs {list(e.shape)}")
        return None
    if not np.issubdtype(g.dtype, np.integer):
        rep.line(False, name, f"dtype {g.dtype} is not an integer type")
        return None
    scores = exp.get("index_scores_masked" + suffix, exp.get("index_scores" + suffix))
    ok, text, tie_rows = compare_topk(g, e, exp.get("topk_scores" + suffix), scores, a.tie_rtol,
                                      not a.loose_zero_ties)
    rep.line(ok, name, text)
    if not (ok and tie_rows.any()):
        return None
    rep.note(f"{name}: rows {np.nonzero(tie_rows)[0].tolist()[:20]} select different near-tied entries: "
             "they are left out of the out comparison of every layer using this selection; dx, grads "
             "and the loss include them")
    return tie_rows


def compare_to_reference(rep, got, exp, meta, a):
    reference_only = {n for n in meta.get("reference_only", "").split(",") if n}
    users = selection_users(meta)
    skip = {}          # out name -> token rows to leave out (near-ties of the selection it used)
    for name in exp:
        base, suffix = split_layer(name)
        if base == "topk_ids" and name in got:
            tie_rows = check_topk(rep, got, exp, suffix, a)
            if tie_rows is not None:
                for user in users.get(suffix, [suffix]):
                    prev = skip.get("out" + user)
                    skip["out" + user] = tie_rows if prev is None else (prev | tie_rows)
    for name, b in exp.items():
        base, _ = split_layer(name)
        if base == "topk_ids":
            if name not in got:
                rep.line(False, name, "missing from --got")
            continue
        if name not in got:
            if name not in reference_only:
                rep.line(False, name, "missing from --got")
            continue
        a_ = got[name]
        if a_.shape != b.shape:
            rep.line(False, name, f"shape {list(a_.shape)} vs expected {list(b.shape)}")
            continue
        if not np.issubdtype(b.dtype, np.floating):
            ok = np.array_equal(a_, b)
            rep.line(ok, name, "equal" if ok else "integer tensors differ")
            continue
        rows = skip.get(name)
        ok, text = compare_float(a_, b, a.tol_grad if is_grad(name) else a.tol_out, rows)
        if not ok and skip:
            text += "  (top-k near-tie differences may explain this)"
        rep.line(ok, name, text)
    for name in got:
        if name not in exp:
            rep.line(False, name, "in --got but not in --expected")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--got", required=True)
    p.add_argument("--expected", required=True)
    p.add_argument("--tol-out", type=float, default=1e-4)
    p.add_argument("--tol-grad", type=float, default=1e-3)
    p.add_argument("--tie-rtol", type=float, default=1e-6)
    p.add_argument("--label", default="")
    p.add_argument("--exact", action="store_true", help="require bitwise identity (two C outputs)")
    p.add_argument("--loose-zero-ties", action="store_true",
                   help="accept any order among slots whose reference score is exactly 0.0")
    a = p.parse_args(argv)
    got, got_dt, _ = st.read_full(a.got)
    exp, exp_dt, meta = st.read_full(a.expected)
    rep = Report(a.label)
    if a.exact:
        compare_exact(rep, got, got_dt, exp, exp_dt)
    else:
        compare_to_reference(rep, got, exp, meta, a)
    verdict = "PASS" if rep.n_fail == 0 else "FAIL"
    print(f"{rep.label}{verdict}: {rep.n_ok} ok, {rep.n_fail} failed")
    return 0 if rep.n_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
