"""dsv4cp: PyTorch binding of libdsv4cp, DeepSeek V4's hybrid attention layer (sliding window, CSA
with the lightning indexer, HCA; V4.1's CSA2, whose layers share compressed kv) with rank-invariant
two-stage context parallelism. SPEC sections 9 and 10.

    import dsv4cp
    attn = dsv4cp.Attention("config.json", layer=2)            # or comm=MPI.COMM_WORLD for CP
    attn.load_weights("model.safetensors.index.json")          # or load_state_dict(short names)
    out, topk_ids, indexer_loss = attn(x, cu_seqlens, seqlens_real)
    ((out * dout).sum() + indexer_loss).backward()             # x.grad, every parameter's .grad
                                                               # (under CP: summed over the ranks)

    # DeepSeek V4.1: layers of a source group share one state per forward pass
    state = dsv4cp.Shared()
    for L in range(a, b + 1):
        out, topk_ids, indexer_loss = attn[L](x[L], cu_seqlens, seqlens_real, shared=state)

All the math runs in the C library through ctypes; this package only moves pointers. The library is
loaded from $DSV4CP_LIBRARY, else the source tree's build/libdsv4cp.so, else the system's. Importing
dsv4cp makes OpenBLAS use the kernels the dsv4cp program uses (see _lib.py and blas_info()), so that
results are bitwise those of `dsv4cp run`.
"""
from ._lib import DSV4Error, blas_info  # first: loads libdsv4cp (and OpenBLAS) before torch does
from .attention import Attention, AttentionOutput, Shared, allreduce_grads, shard_rows, version

__all__ = ["Attention", "AttentionOutput", "DSV4Error", "Shared", "allreduce_grads", "blas_info", "shard_rows",
           "version"]
