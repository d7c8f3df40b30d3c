/* select.c: the selection stage of CSA (core.h): the indexer's queries of local rows, their top-k
 * against the GLOBAL indexer keys with global causal visibility (ids in the global compressed
 * sequence, the same width on every rank), and the backward of the queries' projections (the KL
 * loss is their only source of gradient: the indexer's inputs are detached). */
#include <math.h>
#include <string.h>

#include "core.h"
#include "model/weights.h"
#include "ops/placement.h"
#include "util/err.h"
#include "util/gemm.h"

dsv4_status dsv4_select_queries(const dsv4_stage_env *e, int64_t i0, int64_t n, const float *qr, const float *x,
                                float *qI, float *wI) {
  dsv4_status rc = DSV4_OK;
  const dsv4_plan *p = e->p;
  const int Hi = e->cfg->index_n_heads, Di = e->cfg->index_head_dim, dq = e->cfg->q_lora_rank, d = e->cfg->dim;
  DSV4_TRY(dsv4_proj_rows(qI, (int64_t)Hi * Di, qr + i0 * dq, dq, dsv4_w(e->w, W_I_WQ_B), n, (int64_t)Hi * Di, dq,
                          p->global + i0, p->panel, e->impl));
  DSV4_TRY(dsv4_proj_rows(wI, Hi, x + i0 * d, d, dsv4_w(e->w, W_I_PROJ), n, Hi, d, p->global + i0, p->panel, e->impl));
  const float wscale = (float)(1.0 / sqrt((double)Di * Hi));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    for (int h = 0; h < Hi; h++) dsv4_rope_apply(&p->rope, qI + (i * Hi + h) * Di, Di, p->pos[i0 + i], 0);
    for (int h = 0; h < Hi; h++) wI[i * Hi + h] *= wscale;
  }
fail:
  return rc;
}

dsv4_status dsv4_select_topk(const dsv4_stage_env *e, int64_t i0, int64_t n, const float *qI, const float *wI,
                             const float *KI, int32_t *topk, float *scores, const int32_t *cand_in,
                             int32_t *cand_out) {
  const dsv4_plan *p = e->p;
  const int k = e->cfg->index_topk;
  dsv4_indexer_args ia = {.topk_ids = topk + i0 * k, .topk_scores = scores + i0 * k, .q_idx = qI, .k_idx = KI,
                                .weights = wI, .vis_begin = p->cmp_begin + i0, .vis_count = p->cmp_count + i0,
                                .S1 = n, .C = p->docs.n_cmp, .Hi = e->cfg->index_n_heads,
                                .Di = e->cfg->index_head_dim, .topk = k};
  const int nc = e->cfg->candidate_topk_blocks;
  if (cand_in || cand_out) {
    ia.block = e->cfg->candidate_block_size;
    ia.n_cand = nc;
    ia.cand_in = cand_in ? cand_in + i0 * nc : NULL;
    ia.cand_out = cand_out ? cand_out + i0 * nc : NULL;
  }
  dsv4_placement places[3];
  dsv4_indexer_places(places);
  return dsv4_lightning_indexer_dist(&ia, e->x->comm->size, places, e->impl);
}

/* w = (weights_proj x) * s  ->  d weights_proj += (s dw)^T x;  qI = RoPE(wq_b qr)  ->  RoPE^T.
 * The weight products run over whole global panels (model/wgrad.h): with keep_qI / keep_wI the
 * rows are kept there (the saved queries' rows, dead after their chunk) for dsv4_select_wgrad at the
 * end; without (recomputation), they go into the product sinks chunk by chunk. */
dsv4_status dsv4_select_queries_bwd(const dsv4_stage_env *e, int64_t i0, int64_t n, float *d_qI, float *d_w,
                                    const float *qr, const float *x, dsv4_weights *grads, dsv4_wsinks *ks,
                                    float *keep_qI, float *keep_wI) {
  dsv4_status rc = DSV4_OK;
  const dsv4_plan *p = e->p;
  const int Hi = e->cfg->index_n_heads, Di = e->cfg->index_head_dim, d = e->cfg->dim, dq = e->cfg->q_lora_rank;
  const float wscale = (float)(1.0 / sqrt((double)Di * Hi));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    for (int h = 0; h < Hi; h++) d_w[i * Hi + h] *= wscale;
    for (int h = 0; h < Hi; h++) dsv4_rope_apply(&p->rope, d_qI + (i * Hi + h) * Di, Di, p->pos[i0 + i], 1);
  }
  if (keep_qI) {
    memcpy(keep_qI + i0 * Hi * Di, d_qI, sizeof(float) * (size_t)(n * Hi * Di));
    memcpy(keep_wI + i0 * Hi, d_w, sizeof(float) * (size_t)(n * Hi));
    return DSV4_OK;
  }
  const dsv4_wpiece pw = {.n = n, .A = d_w, .lda = Hi, .B = x + i0 * d, .ldb = d, .glob = p->global + i0};
  const dsv4_wpiece pq = {.n = n, .A = d_qI, .lda = (int64_t)Hi * Di, .B = qr + i0 * dq, .ldb = dq, .glob = p->global + i0};
  DSV4_TRY(dsv4_wsinks_product(ks, dsv4_w(grads, W_I_PROJ), &pw));
  DSV4_TRY(dsv4_wsinks_product(ks, dsv4_w(grads, W_I_WQ_B), &pq));
fail:
  return rc;
}

dsv4_status dsv4_select_wgrad(const dsv4_stage_env *e, const float *d_qI, const float *d_w, const float *qr,
                              const float *x, dsv4_weights *grads) {
  dsv4_status rc = DSV4_OK;
  const dsv4_plan *p = e->p;
  const int64_t Hi = e->cfg->index_n_heads, Di = e->cfg->index_head_dim, d = e->cfg->dim, dq = e->cfg->q_lora_rank;
  const dsv4_wpiece pw = {.n = p->n, .A = d_w, .lda = Hi, .B = x, .ldb = d, .glob = p->global};
  const dsv4_wpiece pq = {.n = p->n, .A = d_qI, .lda = Hi * Di, .B = qr, .ldb = dq, .glob = p->global};
  const dsv4_wshape sw = {Hi, d, p->panel, p->key.T}, sq = {Hi * Di, dq, p->panel, p->key.T};
  DSV4_TRY(dsv4_wgrad_exact(e->x, &sw, &pw, 1, dsv4_w(grads, W_I_PROJ), e->impl, "indexer weights_proj"));
  DSV4_TRY(dsv4_wgrad_exact(e->x, &sq, &pq, 1, dsv4_w(grads, W_I_WQ_B), e->impl, "indexer wq_b"));
fail:
  return rc;
}
