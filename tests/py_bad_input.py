#!/usr/bin/env -S /usr/bin/python3
"""py_bad_input.py CASE_DIR LAYER (a packed case): bad input to dsv4cp.Attention, run under `mpirun -np N` (or
alone). For every case each rank prints one line

    rank R case NAME: raised TYPE: MESSAGE        or        rank R case NAME: no exception

and test_python.py checks that every rank raised, with the expected message, and that nothing hung
(a rank left waiting in a collective would stop the job at the driver's timeout). Some cases are bad
on ONE rank only: the others must raise too. At the end a valid forward + backward must still work
and give the result of a fresh module (a failed call leaves nothing behind)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "ref"))

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

import dsv4cp  # noqa: E402
import st  # noqa: E402

comm = MPI.COMM_WORLD
rank, N = comm.Get_rank(), comm.Get_size()
case_dir, layer = sys.argv[1], int(sys.argv[2])
cfg = os.path.join(case_dir, "config.json")


def say(line):
    """One write per line: lines of several ranks sharing a pipe never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def attempt(name, fn):
    try:
        fn()
        say(f"rank {rank} case {name}: no exception")
    except Exception as e:  # noqa: BLE001 (the test is about which exception)
        msg = str(e).replace("\n", " ")
        say(f"rank {rank} case {name}: raised {type(e).__name__}: {msg}")


attn = dsv4cp.Attention(cfg, layer, comm=comm if N > 1 else None)
attn.load_weights(os.path.join(case_dir, "weights.safetensors"))
inp = st.read(os.path.join(case_dir, "in.safetensors"))
x_all, cu, real = (torch.from_numpy(inp[k]) for k in ("x", "cu_seqlens", "seqlens_real"))
T, d = x_all.shape
rows = attn.shard_rows(T)
x = x_all[rows].clone()

attempt("wrong width", lambda: attn(x[:, :-2].contiguous(), cu, real))
attempt("wrong width on the last rank only", lambda: attn(x[:, :-2].contiguous() if rank == N - 1 else x, cu, real))
attempt("integer x", lambda: attn(x.to(torch.int32), cu, real))
bad = cu.clone()
bad[2] = bad[1]
attempt("cu_seqlens not increasing", lambda: attn(x, bad, real))
short = cu.clone()
short[-1] -= 1
attempt("cu_seqlens not ending at T", lambda: attn(x, short, real))
attempt("seqlens_real of the wrong length", lambda: attn(x, cu, real[:-1]))
too_long = real.clone()
too_long[0] = int(cu[1] - cu[0]) + 1
attempt("seqlens_real longer than its document", lambda: attn(x, cu, too_long))
one_doc = torch.tensor([0, int(cu[-1])], dtype=torch.int32)
attempt("cu_seqlens different on rank 0", lambda: attn(x, cu if rank else one_doc, real if rank else None))
if N > 1:
    # T = N * rows + 1: no shard rule divides it (the library's message, on every rank)
    odd = torch.tensor([0, N * x.shape[0] + 1], dtype=torch.int32)
    attempt("T not divisible by N", lambda: attn(x, odd, None))
    attempt("rows not T/N on rank 0", lambda: attn(x[:-4] if rank == 0 else x, cu, real))
attempt("config file missing", lambda: dsv4cp.Attention(cfg + ".missing", layer, comm=comm if N > 1 else None))
attempt("layer out of range", lambda: dsv4cp.Attention(cfg, 99, comm=comm if N > 1 else None))
attempt("weights file missing on rank 0", lambda: attn.load_weights(
    os.path.join(case_dir, "weights.safetensors" + (".missing" if rank == 0 else ""))))


def stale():
    xa = x.clone().requires_grad_()
    out1, _, _ = attn(xa, cu, real)
    attn(xa, cu, real)                 # a second training forward replaces the first's activations
    out1.sum().backward()


attempt("backward of a stale forward", stale)

# still healthy: the same result as a fresh module
fresh = dsv4cp.Attention(cfg, layer, comm=comm if N > 1 else None)
fresh.load_weights(os.path.join(case_dir, "weights.safetensors"))
results = []
for m in (attn, fresh):
    xg = x.clone().requires_grad_()
    out, topk, loss = m(xg, cu, real)
    (out.sum() + (loss if loss is not None else 0)).backward()
    if loss is None:   # r != 4 returns None for both
        assert topk is None
    dsv4cp.allreduce_grads(m)
    results.append((out.detach(), topk, xg.grad, [p.grad.clone() for p in m.parameters()]))
(a, b) = results
same = torch.equal(a[0], b[0]) and (a[1] is None) == (b[1] is None) and (a[1] is None or torch.equal(a[1], b[1])) \
    and torch.equal(a[2], b[2]) and all(
    torch.equal(g, h) for g, h in zip(a[3], b[3]))
say(f"rank {rank} healthy after the errors: {'yes' if same else 'no'}")
