#!/usr/bin/env -S /usr/bin/python3
"""oracle.py: dsv4cp as the oracle for another implementation of DeepSeek V4's attention layer
(a Megatron-LM, torchtitan or MindFormers kernel, a GPU port, ...).

Give it the same config, weights and input the other implementation used, and that
implementation's results in one safetensors file (CANDIDATE):

    PYTHONPATH=python python3 examples/oracle.py --config config.json --layer 2 \\
        --weights w.safetensors --input in.safetensors [--grad-output g.safetensors] \\
        --candidate theirs.safetensors

CANDIDATE holds what it has of: out (the shape of x), topk_ids (int [T, index_topk], global
compressed ids, -1 padded), indexer_loss ([1] or scalar), and with --grad-output (gradients of
sum(out * dout) + indexer_loss) dx and grad.<weight name> (with any prefix: layers.L., mtp.0., none).
The file formats are those of `dsv4cp run` (SPEC 7), so a `dsv4cp run` output is a valid candidate.

It prints one line per tensor: the worst absolute difference, where it is, the largest |value| of
the oracle, the relative error and a verdict against SPEC 8's tolerances (out 1e-4, gradients 1e-3
relative to the tensor's largest value; --tol-out / --tol-grad to change). Top-k lists must be
equal except at near-ties, judged exactly as tests/ref/compare.py does: a differing id must be a
visible slot whose score is within --tie-rtol of the score it replaced (relative to the row's
largest |score|), exact 0.0 ties go to the smaller id; rows that differ at near-ties are left out
of the `out` comparison (out[t] depends only on row t's selection). dsv4cp does not export indexer
scores, so when (and only when) the lists differ the scores come from tests/ref's float64
reference. Exit status 0 when every compared tensor is within tolerance, 1 otherwise (also when
nothing could be compared).
"""
import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
REF_DIR = os.path.join(HERE, "..", "tests", "ref")
sys.path.insert(0, REF_DIR)
import dsv4cp  # noqa: E402
import st  # noqa: E402   tests/ref/st.py: safetensors on numpy

GRAD = "grad."


def oracle(a):
    """dsv4cp's results on the case, named like `dsv4cp run` writes them (numpy arrays)."""
    attn = dsv4cp.Attention(a.config, a.layer)
    attn.load_weights(a.weights)
    inp = st.read(a.input)
    x = torch.from_numpy(inp["x"].astype(np.float32)).requires_grad_(a.grad_output is not None)
    cu = torch.from_numpy(inp["cu_seqlens"]) if "cu_seqlens" in inp else None
    real = torch.from_numpy(inp["seqlens_real"]) if "seqlens_real" in inp else None
    out, topk, loss = attn(x, cu, real)
    res = {"out": out.detach().numpy()}
    if topk is not None:
        res["topk_ids"] = topk.numpy()
        res["indexer_loss"] = np.array([loss.item()], dtype=np.float32)
    if a.grad_output:
        dout = torch.from_numpy(st.read(a.grad_output)["dout"].astype(np.float32))
        ((out * dout).sum() + (loss if loss is not None else 0)).backward()
        res["dx"] = x.grad.numpy()
        for name, p in attn.named_parameters():
            res[GRAD + name] = p.grad.numpy()
    return res, attn


def candidate_tensors(path):
    """The candidate's tensors with gradient names reduced to the short form: grad.<anything>.attn.x
    (layers.L., model.layers.L., mtp.0., ...) -> grad.attn.x."""
    got = {}
    for name, v in st.read(path).items():
        if name.startswith(GRAD) and ".attn." in name:
            name = GRAD + name[name.index(".attn.") + 1:]
        got[name] = v
    return got


def worst(a, b):
    """(max |a - b|, index of it as a tuple, max |b|); NaN in a counts as infinitely wrong."""
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    diff[np.isnan(diff)] = np.inf
    i = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
    return (float(diff[i]) if diff.size else 0.0), tuple(int(k) for k in i), (float(np.abs(b).max()) if b.size else 0.0)


def judge_topk(a, cand, mine, tie_rtol):
    """(ok, text, rows to leave out of `out`) by tests/ref/compare.py's rule."""
    if cand.shape != mine.shape:
        return False, f"shape {list(cand.shape)}, expected {list(mine.shape)}", None
    if np.array_equal(cand, mine):
        return True, f"identical ({mine.shape[0]} rows)", None
    import compare   # tests/ref/compare.py
    import ref       # tests/ref/ref.py: float64 scores of every visible slot
    outputs, _ = ref.run_files(a.config, a.layer, a.weights, a.input)
    scores = outputs["index_scores"]
    ids = np.where(mine >= 0, mine, 0)
    mine_scores = np.where(mine >= 0, np.take_along_axis(scores, ids, axis=1), -np.inf)
    ok, text, tie_rows = compare.compare_topk(cand.astype(np.int64), mine.astype(np.int64), mine_scores, scores,
                                              tie_rtol, strict_zero_ties=True)
    return ok, text, (tie_rows if ok and tie_rows.any() else None)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("--weights", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--grad-output", help="dout: compare dx and the weight gradients too")
    p.add_argument("--candidate", required=True, help="the other implementation's results")
    p.add_argument("--tol-out", type=float, default=1e-4)
    p.add_argument("--tol-grad", type=float, default=1e-3)
    p.add_argument("--tie-rtol", type=float, default=1e-6)
    a = p.parse_args()

    mine, attn = oracle(a)
    cand = candidate_tensors(a.candidate)
    print(f"oracle: dsv4cp {dsv4cp.version()}, layer {a.layer} (compress ratio {attn.ratio}), "
          f"{mine['out'].shape[0] if mine['out'].ndim == 2 else mine['out'].shape[0] * mine['out'].shape[1]} tokens")
    print(f"  {'tensor':<44} {'max|diff|':>10} {'at':>14} {'max|oracle|':>11} {'rel':>9}  verdict")
    failed = compared = 0
    skip_rows = None
    if "topk_ids" in mine and "topk_ids" in cand:
        ok, text, skip_rows = judge_topk(a, cand["topk_ids"], mine["topk_ids"], a.tie_rtol)
        print(f"  {'topk_ids':<44} {text}  {'ok' if ok else 'FAIL'}")
        failed += not ok
        compared += 1
    for name, b in mine.items():
        if name == "topk_ids":
            continue
        if name not in cand:
            print(f"  {name:<44} not in the candidate: not compared")
            continue
        c = np.asarray(cand[name], dtype=np.float64).reshape(-1) if name == "indexer_loss" else np.asarray(cand[name])
        if c.shape != b.shape:
            print(f"  {name:<44} shape {list(c.shape)}, expected {list(b.shape)}  FAIL")
            failed += 1
            continue
        note = ""
        if name == "out" and skip_rows is not None:   # rows that chose other near-tied slots
            keep = ~skip_rows
            c, b = c.reshape(len(keep), -1)[keep], b.reshape(len(keep), -1)[keep]
            note = f" ({int(skip_rows.sum())} near-tie rows left out)"
        err, at, scale = worst(c, b)
        tol = a.tol_grad if name == "dx" or name.startswith(GRAD) else a.tol_out
        ok = err <= tol * scale if scale > 0 else err == 0
        failed += not ok
        compared += 1
        rel = err / scale if scale > 0 else float("inf") if err else 0.0
        print(f"  {name:<44} {err:10.3g} {str(list(at)):>14} {scale:11.3g} {rel:9.2g}  {'ok' if ok else 'FAIL'}{note}")
    for name in sorted(set(cand) - set(mine)):
        print(f"  {name:<44} in the candidate only: not compared")
    if not compared:   # e.g. a candidate whose names match nothing: never a silent PASS
        print("  no tensor of the candidate matches the oracle's names (out, topk_ids, dx, grad.*)")
        failed = 1
    print(f"verdict: {'PASS' if not failed else f'FAIL ({failed} tensors)' if compared else 'FAIL (nothing compared)'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
