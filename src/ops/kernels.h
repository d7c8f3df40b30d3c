/* kernels.h: the fast and the naive implementation of every operator and product, as two tables,
 * so model code is written once and runs either path (dsv4_impl). */
#ifndef DSV4_KERNELS_H
#define DSV4_KERNELS_H

#include "compressor.h"
#include "dsv4cp_ops.h"

typedef struct {
  dsv4_status (*compress)(const dsv4_compress_args *);
  dsv4_status (*compress_bwd)(const dsv4_compress_bwd_args *);
  dsv4_status (*indexer)(const dsv4_indexer_args *);
  dsv4_status (*attn)(const dsv4_attn_args *);
  dsv4_status (*attn_bwd)(const dsv4_attn_bwd_args *);
  dsv4_status (*kl)(const dsv4_kl_args *);
  void (*gemm_nt)(int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                  float, float *, int64_t);
  void (*gemm_nn)(int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                  float, float *, int64_t);
  void (*gemm_tn)(int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                  float, float *, int64_t);
} dsv4_kernels;

const dsv4_kernels *dsv4_kernels_get(dsv4_impl impl);

/* Bytes of one thread's workspace in the fast backward kernels (the memory planner counts them):
 * the sparse attention's with queries of at most nmax keys, ncmax of them compressed, over C
 * compressed rows (top_k: the compressed keys are top-k ids, gathered); the indexer KL loss's with at most
 * nmax rows per query (k_grad: with the k_idx gradient, over C rows). */
size_t dsv4_sparse_attn_bwd_thread_bytes(int H, int D, int64_t nmax, int64_t ncmax, int64_t C, int top_k);
size_t dsv4_kl_thread_bytes(int H, int D, int Hi, int Di, int64_t nmax, int64_t C, int k_grad);

#endif
