#!/usr/bin/env -S /usr/bin/python3
"""train.py: a few SGD steps of one DeepSeek V4 attention layer in PyTorch, computed by dsv4cp,
with context parallelism when started under mpirun. Every rank count prints the same losses:

    PYTHONPATH=python python3 examples/train.py
    PYTHONPATH=python mpirun -np 4 python3 examples/train.py      # CP = 4 (add --oversubscribe
                                                                  #  --allow-run-as-root as needed)

The layer is the CSA kind (compress ratio 4: sliding window + lightning indexer top-k + KL loss) at
toy size, on two packed documents (the second one padded). The objective is

    0.5 * ||out - y||^2 / (T d)  +  indexer_loss          (y: a fixed random target)

Each rank holds its own T/N rows (dsv4cp.shard_rows says which); cu_seqlens and seqlens_real
describe the whole stream on every rank. The squared error is summed exactly over all rows in row
order, so every step prints the same bits for every N: the forward is bitwise rank-invariant and
the weight gradients come back summed over the ranks as exact sums, the same bits for every N.
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import dsv4cp  # noqa: E402

# A toy V4 layer (V4-Flash has hidden_size 4096, 64 heads x 512, q rank 1024, window 128, top-k 512).
CONFIG = {
    "hidden_size": 32, "num_attention_heads": 4, "head_dim": 16, "qk_rope_head_dim": 8,
    "q_lora_rank": 24, "o_groups": 2, "o_lora_rank": 12, "sliding_window": 8,
    "index_n_heads": 2, "index_head_dim": 16, "index_topk": 4,
    "compress_ratios": [0, 4, 128],
}
DOCS = [(37, 37), (27, 21)]     # (length in the stream, real tokens): any lengths; the second is padded


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layer", type=int, default=1, help="layer of CONFIG (1: CSA, 0: sliding window only)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    comm = None
    if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ:   # started by mpirun
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    rank = comm.Get_rank() if comm else 0

    attn = dsv4cp.Attention(CONFIG, a.layer, comm=comm, seed=a.seed)   # seeded random weights
    opt = torch.optim.SGD(attn.parameters(), lr=a.lr)

    # the whole stream exists on every rank here (seeded); each rank keeps its rows
    cu = torch.tensor([0] + [sum(n for n, _ in DOCS[:i + 1]) for i in range(len(DOCS))], dtype=torch.int32)
    real = torch.tensor([r for _, r in DOCS], dtype=torch.int32)
    T, d = int(cu[-1]), CONFIG["hidden_size"]
    g = torch.Generator().manual_seed(a.seed)
    x_all, y_all = torch.randn(T, d, generator=g), torch.randn(T, d, generator=g)
    rows = attn.shard_rows(T)
    x, y = x_all[rows], y_all[rows]

    for step in range(1, a.steps + 1):
        opt.zero_grad()
        out, topk_ids, indexer_loss = attn(x, cu_seqlens=cu, seqlens_real=real)
        sq = 0.5 * ((out.double() - y.double()) ** 2).sum(dim=1) / (T * d)     # per local row
        local = sq.sum() + (indexer_loss if indexer_loss is not None else 0)   # this rank's part
        local.backward()                     # x.grad: this rank's rows; weight grads: summed over
                                             # the ranks (the same bits for every rank count)
        # the loss over all rows, summed exactly in row order (same bits for every rank count)
        terms = [(rows.tolist(), sq.detach().tolist())]
        if comm is not None:
            terms = comm.allgather(terms[0])
        ordered = sorted((r, v) for rs, vs in terms for r, v in zip(rs, vs))
        loss = math.fsum(v for _, v in ordered) + (indexer_loss.item() if indexer_loss is not None else 0.0)
        if rank == 0:
            print(f"step {step}  loss {loss!r}", flush=True)
        opt.step()                           # in place: the C layer sees the new weights
    return 0


if __name__ == "__main__":
    sys.exit(main())
