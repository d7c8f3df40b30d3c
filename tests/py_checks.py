#!/usr/bin/env -S /usr/bin/python3
"""py_checks.py CSA_CASE_DIR LAYER: the module semantics of dsv4cp.Attention at CP = 1 that the
file comparisons cannot see: parameters as views of the C weights (load_state_dict, optimizer
updates, a rebound .data), dtype/layout of x (float32 only: nothing is converted silently; NaN
refused), module conversions refused (the C weights stay untouched), autograd (accumulation,
retain_graph, a no_grad forward between forward and backward, the indexer's gradients only from the
KL loss, no double backward), the named result, threads (per module; concurrent calls from two
Python threads serialised), recompute. Prints PASS/FAIL lines (test_python.py relays them)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "ref"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import dsv4cp  # noqa: E402
import st  # noqa: E402

case_dir, layer = sys.argv[1], int(sys.argv[2])
cfg_path = os.path.join(case_dir, "config.json")
wpath = os.path.join(case_dir, "weights.safetensors")
inp = st.read(os.path.join(case_dir, "in.safetensors"))
x0 = torch.from_numpy(inp["x"])
cu = torch.from_numpy(inp["cu_seqlens"])
real = torch.from_numpy(inp["seqlens_real"])
dout = torch.from_numpy(st.read(os.path.join(case_dir, "grad.safetensors"))["dout"])
prefix = f"layers.{layer}."
stored = {k[len(prefix):] if k.startswith(prefix) else k: torch.from_numpy(v.astype(np.float32))
          for k, v in st.read(wpath).items()}
fails = 0


def check(ok, name, detail=""):
    global fails
    fails += not ok
    print(f"{'PASS' if ok else 'FAIL'} python module: {name}{': ' + detail if detail else ''}", flush=True)


def module():
    m = dsv4cp.Attention(cfg_path, layer)
    m.load_weights(wpath)
    return m


def run(m, x=None, with_loss=True, backward=True):
    """forward (+ backward of sum(out * dout) + indexer_loss); returns out, topk, loss, dx, grads."""
    x = (x0 if x is None else x).clone().requires_grad_()
    out, topk, loss = m(x, cu, real)
    if backward:
        ((out * dout).sum() + (loss if with_loss else 0)).backward()
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in m.named_parameters()}
    return out.detach(), topk, loss, x.grad, grads


def same(a, b):
    return all(torch.equal(a[n], b[n]) for n in a)


# names and shapes: DeepSeek's short names, exactly the weight file's tensors
m = module()
names = {n: tuple(p.shape) for n, p in m.named_parameters()}
want = {k: tuple(v.shape) for k, v in stored.items()}
check(names == want, "named_parameters are the checkpoint's short names and shapes",
      "" if names == want else f"differ: {sorted(set(names) ^ set(want))[:4]}")
check(all(p.dtype == torch.float32 and isinstance(p, torch.nn.Parameter) for p in m.parameters()),
      "parameters are fp32 torch.nn.Parameter")
base = run(m)

# load_state_dict writes into the C weights (a module with other weights first)
m2 = dsv4cp.Attention(cfg_path, layer, seed=7)
m2.load_state_dict(stored)
r2 = run(m2)
check(torch.equal(r2[0], base[0]) and torch.equal(r2[3], base[3]) and same(r2[4], base[4]),
      "load_state_dict reaches the C layer (same out, dx, grads as load_weights)")
check(set(m2.state_dict()) == set(stored), "state_dict keys are the short names")

# an optimizer's in-place step reaches the C layer: compare with a module given the stepped weights
opt = torch.optim.SGD(m2.parameters(), lr=0.1)
opt.step()
stepped = {n: p.detach().clone() for n, p in m2.named_parameters()}
m2.zero_grad(set_to_none=True)
r3 = run(m2, backward=False)
m3 = dsv4cp.Attention(cfg_path, layer)
m3.load_state_dict(stepped)
check(torch.equal(run(m3, backward=False)[0], r3[0]) and not torch.equal(r3[0], base[0]),
      "optimizer.step() updates reach the C layer")

# a rebound .data is copied into the C buffer before the next forward
m4 = module()
for n, p in m4.named_parameters():
    p.data = stepped[n].clone()
check(torch.equal(run(m4, backward=False)[0], r3[0]), "a parameter whose .data was rebound is used")
m4.load_weights(wpath)
check(torch.equal(run(m4, backward=False)[0], base[0]), "load_weights after a rebind: parameters view the loaded weights")

# a sharded checkpoint (index file, tensors split over two shards) through the library's loader
import json  # noqa: E402
import tempfile  # noqa: E402
with tempfile.TemporaryDirectory() as ck:
    full = st.read(wpath)
    names = sorted(full)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        st.write(os.path.join(ck, shard), {k: full[k] for k in keys})
    with open(os.path.join(ck, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}, fh)
    m5 = dsv4cp.Attention(cfg_path, layer, seed=3)
    m5.load_weights(ck)
    check(torch.equal(run(m5, backward=False)[0], base[0]), "load_weights of a sharded checkpoint directory")

# x in another dtype is refused naming it (no silent cast); non-contiguous fp32 gives the same bits
for dt in (torch.float64, torch.bfloat16, torch.float16):
    try:
        m(x0.to(dt), cu, real)
        check(False, f"{dt} x raises TypeError", "no exception")
    except TypeError as e:
        check(str(dt).split(".")[-1] in str(e), f"{dt} x raises TypeError naming the dtype", str(e)[:90])
xn = x0.clone()
xn[3, 1] = float("nan")
try:
    m(xn, cu, real)
    check(False, "a NaN in x raises ValueError", "no exception")
except ValueError as e:
    check("non-finite" in str(e) and "row 3" in str(e), "a NaN in x raises ValueError naming the row", str(e)[:90])

# module conversions: refused, the C weights untouched; float32-on-CPU conversions are no-ops
for conv in ("double", "half", "bfloat16"):
    try:
        getattr(m, conv)()
        check(False, f"attn.{conv}() raises TypeError", "no exception")
    except TypeError as e:
        check("float32" in str(e), f"attn.{conv}() raises TypeError", str(e)[:90])
try:
    m.to("meta")
    check(False, "attn.to('meta') raises TypeError", "no exception")
except (TypeError, RuntimeError) as e:
    check(isinstance(e, TypeError), "attn.to('meta') raises TypeError", str(e)[:90])
check(m.float() is m and m.cpu() is m and m.to(torch.float32) is m, "float(), cpu(), to(float32) are allowed no-ops")
check(torch.equal(run(m, backward=False)[0], base[0]) and all(p.dtype == torch.float32 for p in m.parameters()),
      "after the refused conversions the module computes exactly as before")

# the result is a named tuple that unpacks as before
res = m(x0, cu, real)
check(isinstance(res, dsv4cp.AttentionOutput) and res.out is res[0] and res.topk_ids is res[1] and
      res.indexer_loss is res[2], "forward returns AttentionOutput(out, topk_ids, indexer_loss)")

# the backward is the library's, once: a double backward raises instead of dropping terms (an
# objective whose gradient wrt out depends on out, so create_graph would need second derivatives)
x = x0.clone().requires_grad_()
out, topk, loss = m(x, cu, real)
(gx,) = torch.autograd.grad((out * out).sum(), x, create_graph=True)
try:
    gx.sum().backward()
    check(False, "a double backward raises", "no exception")
except RuntimeError as e:
    check("once_differentiable" in str(e) or "twice" in str(e), "a double backward raises", str(e)[:90])

# threads are the module's own setting: the process's OpenMP default is left alone
import ctypes  # noqa: E402
gomp = ctypes.CDLL("libgomp.so.1")
before = gomp.omp_get_max_threads()
m.threads = 1
run(m, backward=False)
m.threads = 2
r_t2 = run(m, backward=False)
check(gomp.omp_get_max_threads() == before and m.threads == 2 and torch.equal(r_t2[0], base[0]),
      "threads per module: forward bits the same, the process's OpenMP setting untouched",
      f"omp {before} -> {gomp.omp_get_max_threads()}")

# two Python threads on one module: serialised (no crash), every result the single-thread one
import threading  # noqa: E402
outs, errs = [], []


def worker():
    try:
        with torch.no_grad():
            for _ in range(3):
                outs.append(m(x0, cu, real)[0])
    except Exception as e:  # noqa: BLE001
        errs.append(e)


ts = [threading.Thread(target=worker) for _ in range(2)]
for t in ts:
    t.start()
for t in ts:
    t.join()
check(not errs and len(outs) == 6 and all(torch.equal(o, base[0]) for o in outs),
      "two Python threads calling one module: no crash, every output the sequential one", str(errs[:1]))

xt = x0.t().contiguous().t()   # same values, column-major storage
r6 = run(m, xt)
check(not xt.is_contiguous() and torch.equal(r6[0], base[0]) and torch.equal(r6[3], base[3]), "non-contiguous x")

# gradient accumulation over two backward calls, retain_graph
m.zero_grad(set_to_none=True)
x = x0.clone().requires_grad_()
out, topk, loss = m(x, cu, real)
obj = (out * dout).sum() + loss
obj.backward(retain_graph=True)
first = {n: p.grad.clone() for n, p in m.named_parameters()}
obj.backward()
check(all(torch.equal(p.grad, 2 * first[n]) for n, p in m.named_parameters()) and torch.equal(x.grad, 2 * base[3]),
      "a second backward (retain_graph) accumulates the same gradients")
check(same(first, base[4]), "gradients equal those of a fresh module")

# a no_grad forward in between drops the training forward's activations: its backward must raise
m.zero_grad(set_to_none=True)
x = x0.clone().requires_grad_()
out, topk, loss = m(x, cu, real)
with torch.no_grad():
    m(x0, cu, real)
try:
    (out.sum() + loss).backward()
    check(False, "backward after a no_grad forward raises", "no exception")
except RuntimeError as e:
    check("earlier forward" in str(e), "backward after a no_grad forward raises", str(e)[:80])

# the indexer's parameters get gradients only from the KL loss
m.zero_grad(set_to_none=True)
r7 = run(m, with_loss=False)
idx = [n for n in r7[4] if n.startswith("attn.indexer.")]
check(idx and all(float(r7[4][n].abs().max()) == 0 for n in idx) and all(float(base[4][n].abs().max()) > 0 for n in idx),
      "indexer gradients: zero without the KL loss, non-zero with it", f"{len(idx)} indexer tensors")
check(torch.equal(r7[0], base[0]) and torch.equal(r7[3], base[3]) and all(
    torch.equal(r7[4][n], base[4][n]) for n in r7[4] if not n.startswith("attn.indexer.")),
    "without the KL loss every other gradient is unchanged (the indexer path is detached)")

# topk / loss types
check(base[1].dtype == torch.int32 and tuple(base[1].shape) == (x0.shape[0], m.index_topk) and base[2].dim() == 0,
      "topk_ids int32 [n, index_topk], indexer_loss 0-dim")

# recompute: bitwise the same
mr = dsv4cp.Attention(cfg_path, layer, recompute=True)
mr.load_weights(wpath)
rr = run(mr)
check(mr.recompute and torch.equal(rr[0], base[0]) and torch.equal(rr[3], base[3]) and same(rr[4], base[4]),
      "recompute=True gives bitwise the same results")
sys.exit(1 if fails else 0)
