#!/usr/bin/env -S /usr/bin/python3
"""py_runner.py: `dsv4cp run` written with the PyTorch binding (python/dsv4cp), for the tests:
same files in, same tensor names out, so testlib.compare_ref / compare_cp judge it like the CLI.

  py_runner.py JOB.json [JOB.json ...]  [--order torch-first|dsv4cp-first|numpy-prescott]
  (under mpirun -np N: CP = N with mpi4py; every rank reads its own rows, rank 0 writes)

JOB.json: {"config", "layer", "weights", "input", "grad" (optional), "output", "split" (optional),
"state_dict": true to load the weights through load_state_dict instead of load_weights, "recompute": true
for recompute=True}.

--order decides what is imported before dsv4cp (the OpenBLAS kernel question, see
python/dsv4cp/_lib.py): torch first (default, what users do), dsv4cp first, or numpy loaded with
OPENBLAS_CORETYPE=Prescott (kernels unlike the CLI's) and the variable restored (removed, or the
user's value) before dsv4cp is imported, so that dsv4cp must re-select the CLI's kernels. Prints one line per job with
dsv4cp.blas_info().
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "ref"))


def imports(order):
    if order == "numpy-prescott":
        # the user's own choice (OPENBLAS_CORETYPE set in the environment, which the CLI honours too)
        # comes back afterwards: it is the target dsv4cp must re-select
        had = os.environ.get("OPENBLAS_CORETYPE")
        os.environ["OPENBLAS_CORETYPE"] = "Prescott"
        import numpy  # noqa: F401  (loads OpenBLAS with the SSE3 kernels)
        if had is None:
            del os.environ["OPENBLAS_CORETYPE"]
        else:
            os.environ["OPENBLAS_CORETYPE"] = had
    if order == "dsv4cp-first":
        import dsv4cp  # noqa: F401
    import torch  # noqa: F401
    import dsv4cp  # noqa: F401


def run_job(job, comm):
    import numpy as np
    import torch
    import dsv4cp
    import st
    attn = dsv4cp.Attention(job["config"], job["layer"], comm=comm, split=job.get("split", "contiguous"),
                            recompute=bool(job.get("recompute")))
    if job.get("state_dict"):
        stored = st.read(job["weights"])
        prefix = f"layers.{job['layer']}."
        sd = {k[len(prefix):] if k.startswith(prefix) else k: torch.from_numpy(v.astype(np.float32))
              for k, v in stored.items()}
        attn.load_state_dict(sd)
        prefix_out = prefix if any(k.startswith(prefix) for k in stored) else ""
    else:
        attn.load_weights(job["weights"])
        prefix_out = attn.weights_prefix
    inp = st.read(job["input"])
    x_all = inp["x"]
    batched = x_all.ndim == 3
    T = x_all.shape[0] * (x_all.shape[1] if batched else 1)
    rows = attn.shard_rows(T, batch=x_all.shape[0] if batched else None).numpy()
    d = x_all.shape[-1]
    flat = x_all.reshape(T, d)
    if batched:
        x = torch.from_numpy(flat[rows].reshape(x_all.shape[0], -1, d))
    else:
        x = torch.from_numpy(flat[rows])
    x.requires_grad_(bool(job.get("grad")))
    cu = torch.from_numpy(inp["cu_seqlens"]) if "cu_seqlens" in inp else None
    real = torch.from_numpy(inp["seqlens_real"]) if "seqlens_real" in inp else None
    out, topk, loss = attn(x, cu, real)
    res = {"out": out.detach().reshape(-1, d).numpy()}
    if topk is not None:
        res["topk_ids"] = topk.numpy()
    grads = {}
    if job.get("grad"):
        dout = torch.from_numpy(st.read(job["grad"])["dout"].reshape(T, d)[rows].reshape(x.shape))
        objective = (out * dout).sum() + (loss if loss is not None else 0)
        objective.backward()
        dsv4cp.allreduce_grads(attn)
        res["dx"] = x.grad.reshape(-1, d).numpy()
        grads = {f"grad.{prefix_out}{n}": p.grad.numpy() for n, p in attn.named_parameters()}
    # rank 0 puts every rank's rows back in place
    parts = [(rows, res)] if comm is None else comm.gather((rows, res), root=0)
    if parts is None:
        return
    full = {}
    for name in res:
        width = res[name].shape[1]
        full[name] = np.zeros((T, width), dtype=res[name].dtype)
        for r, part in parts:
            full[name][r] = part[name]
    shape = x_all.shape
    tensors = {"out": full["out"].reshape(shape)}
    if "topk_ids" in full:
        tensors["topk_ids"] = full["topk_ids"]
        tensors["indexer_loss"] = np.array([loss.item()], dtype=np.float32)
    if "dx" in full:
        tensors["dx"] = full["dx"].reshape(shape)
    tensors.update(grads)
    st.write(job["output"], tensors)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("jobs", nargs="+")
    p.add_argument("--order", choices=("torch-first", "dsv4cp-first", "numpy-prescott"), default="torch-first")
    p.add_argument("--no-mpi", action="store_true", help="CP = 1 without importing mpi4py at all")
    a = p.parse_args()
    if a.no_mpi:
        sys.modules["mpi4py"] = None   # any import of mpi4py now fails
    imports(a.order)
    import dsv4cp
    comm = None
    if not a.no_mpi:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None
    rank = 0 if comm is None else comm.Get_rank()
    for path in a.jobs:
        with open(path) as fh:
            job = json.load(fh)
        run_job(job, comm)
        if rank == 0:
            print(f"job {os.path.basename(path)}: ok; blas {json.dumps(dsv4cp.blas_info(), sort_keys=True)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
