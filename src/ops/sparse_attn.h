/* sparse_attn.h: the two phases of the fast sparse attention, exposed so the CP core can run the
 * window phase while the Stage-1 all-gather is in flight. dsv4_sparse_attn is exactly
 * window phase + finish phase, so one rank and N ranks compute every query the same way. */
#ifndef DSV4_SPARSE_ATTN_H
#define DSV4_SPARSE_ATTN_H

#include "dsv4cp_ops.h"
#include "util/xrows.h"

/* Window keys only: out <- unnormalised sum_j e^{z_j - m_w} k_j, m_w = max_j z_j, l_w = sum e^{..}.
 * m_w, l_w: [S1, H]. cmp_* and sink are not read. */
dsv4_status dsv4_sparse_attn_window(const dsv4_attn_args *a, float *m_w, float *l_w);
/* The same, calling progress(ctx) from the calling thread every few queries (so that non-blocking
 * messages move while the phase runs); progress may be NULL. */
dsv4_status dsv4_sparse_attn_window_progress(const dsv4_attn_args *a, float *m_w, float *l_w,
                                             void (*progress)(void *), void *ctx);
/* Compressed keys and sink, merged with the window phase's state; writes normalised out and lse. */
dsv4_status dsv4_sparse_attn_finish(const dsv4_attn_args *a, const float *m_w, const float *l_w);
/* The same, calling progress(ctx) from the calling thread between queries (may be NULL). */
dsv4_status dsv4_sparse_attn_finish_progress(const dsv4_attn_args *a, const float *m_w, const float *l_w,
                                             void (*progress)(void *), void *ctx);

/* The backward adding its window-row and compressed-row key gradients into the caller's exact sums
 * (util/xrows.h views; NULL: written to d_ori_kv / d_cmp_kv as dsv4_sparse_attn_bwd does). */
dsv4_status dsv4_sparse_attn_bwd_into(const dsv4_attn_bwd_args *b, dsv4_xrows *x_ori, dsv4_xrows *x_cmp);
/* The same, calling progress(ctx) from the calling thread between queries (may be NULL). */
dsv4_status dsv4_sparse_attn_bwd_into_progress(const dsv4_attn_bwd_args *b, dsv4_xrows *x_ori, dsv4_xrows *x_cmp,
                                               void (*progress)(void *), void *ctx);

#endif
