#!/usr/bin/env -S /usr/bin/python3
"""py_runner41.py: `dsv4cp run --layers A-B` written with the PyTorch binding as a model would use it
(docs/spec.md section 10's snippet: one dsv4cp.Shared per forward pass, the layers called in order,
autograd for the backward), for the tests: same files in, same tensor names out.

  py_runner41.py CONFIG A-B WEIGHTS INPUT GRAD OUTPUT [--split MODE] [--recompute] [--unused L | --zero L]
  (under mpirun -np N: CP = N with mpi4py; every rank takes its own rows, rank 0 writes)

--unused L leaves layer L's outputs out of the objective (autograd never runs its backward; its
dx.{L} and gradients are not written); --zero L keeps them with weight 0 (its backward runs and adds
zeros): every other tensor must be the same bytes either way.

The objective is sum_L sum(out_L * dout_L) + sum of the index layers' losses; each layer reads x.{L}
(or the one x) as a leaf tensor, so dx.{L} is x.{L}'s gradient.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "ref"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import dsv4cp  # noqa: E402
import st  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("config", "layers", "weights", "input", "grad", "output"):
        p.add_argument(name)
    p.add_argument("--split", default="contiguous")
    p.add_argument("--recompute", action="store_true")
    p.add_argument("--unused", type=int, default=-1)
    p.add_argument("--zero", type=int, default=-1)
    a = p.parse_args()
    from mpi4py import MPI
    comm = MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None
    first, last = (int(v) for v in a.layers.split("-"))
    layers = range(first, last + 1)
    attn = {}
    for L in layers:
        attn[L] = dsv4cp.Attention(a.config, L, comm=comm, split=a.split, recompute=a.recompute)
        attn[L].load_weights(a.weights)
    inp, grads_in = st.read(a.input), st.read(a.grad)
    x0 = inp.get("x", inp.get(f"x.{first}"))
    batched = x0.ndim == 3
    T, d = x0.shape[0] * (x0.shape[1] if batched else 1), x0.shape[-1]
    rows = attn[first].shard_rows(T, batch=x0.shape[0] if batched else None).numpy()

    def mine(arr):
        flat = arr.reshape(T, d)[rows]
        return torch.from_numpy(flat.reshape(x0.shape[0], -1, d) if batched else flat)

    cu = torch.from_numpy(inp["cu_seqlens"]) if "cu_seqlens" in inp else None
    real = torch.from_numpy(inp["seqlens_real"]) if "seqlens_real" in inp else None
    state = dsv4cp.Shared()
    xs, res, losses, objective = {}, {}, {}, 0
    for L in layers:   # the snippet of docs/spec.md section 10
        xs[L] = mine(inp.get(f"x.{L}", inp.get("x"))).requires_grad_()
        out, topk_ids, indexer_loss = attn[L](xs[L], cu, real, shared=state)
        dout = mine(grads_in.get(f"dout.{L}", grads_in.get("dout")))
        term = (out * dout).sum() + (indexer_loss if indexer_loss is not None else 0)
        if L != a.unused:
            objective = objective + (term * 0 if L == a.zero else term)
        res[f"out.{L}"] = out.detach().reshape(-1, d).numpy()
        if topk_ids is not None and L != a.unused:
            res[f"topk_ids.{L}"] = topk_ids.numpy()
            losses[L] = indexer_loss.item()
    objective.backward()
    grads = {}
    for L in layers:
        if L == a.unused:
            continue
        dsv4cp.allreduce_grads(attn[L])
        res[f"dx.{L}"] = xs[L].grad.reshape(-1, d).numpy()
        grads.update({f"grad.{attn[L].weights_prefix}{n}": q.grad.numpy() for n, q in attn[L].named_parameters()})
    parts = [(rows, res)] if comm is None else comm.gather((rows, res), root=0)
    if parts is None:
        return 0
    tensors = {}
    for name in res:
        full = np.zeros((T, res[name].shape[1]), dtype=res[name].dtype)
        for r, part in parts:
            full[r] = part[name]
        tensors[name] = full if name.startswith("topk_ids") else full.reshape(x0.shape)
    for L, v in losses.items():
        tensors[f"indexer_loss.{L}"] = np.array([v], dtype=np.float32)
    tensors.update(grads)
    st.write(a.output, tensors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
