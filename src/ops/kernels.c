/* kernels.c: the two kernel tables. */
#include "kernels.h"

#include "util/gemm.h"

static const dsv4_kernels FAST = {dsv4_compress, dsv4_compress_bwd, dsv4_lightning_indexer,
                                  dsv4_sparse_attn, dsv4_sparse_attn_bwd, dsv4_indexer_kl_loss,
                                  dsv4_gemm_nt, dsv4_gemm_nn, dsv4_gemm_tn};
static const dsv4_kernels NAIVE = {dsv4_compress_ref, dsv4_compress_bwd_ref,
                                   dsv4_lightning_indexer_ref, dsv4_sparse_attn_ref,
                                   dsv4_sparse_attn_bwd_ref, dsv4_indexer_kl_loss_ref,
                                   dsv4_gemm_nt_ref, dsv4_gemm_nn_ref, dsv4_gemm_tn_ref};

const dsv4_kernels *dsv4_kernels_get(dsv4_impl impl) { return impl == DSV4_IMPL_NAIVE ? &NAIVE : &FAST; }
