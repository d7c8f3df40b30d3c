/* core_bwd.c: the core attention backward, chunk by chunk of local queries (dsv4_core_chunk_end),
 * then once for what every query shares; every forward message is mirrored:
 *   per chunk: (recomputation: the chunk's attention output again, bitwise the forward's, and its
 *              indexer queries) attention backward -> dq, d kv_ext (incl. halo rows), d cmp, d sink;
 *              KL loss gradients (indexer only; its inputs are detached) -> d indexer queries and
 *              weights -> their projections' weight gradients; d KI
 *   end:       window halo rows' gradients go back to their owners and are added there;
 *              d cmp -> scatter through the gather index -> reduce-scatter to the slots' owners
 *              -> compressor backward -> halo rows' gradients back to the ranks that sent them
 *              -> compressor weight gradients and dx; the indexer keys' gradients take the same
 *              path through the indexer's compressor. */
#include <math.h>
#include <string.h>

#include "core_internal.h"
#include "ops/placement.h"
#include "model/weights.h"
#include "util/err.h"

/* d_all[gather[id]] = d_cmp[id]: the transpose of select-and-pad (each block is selected once). */
static void scatter_blocks(const dsv4_core_saved *sv, const float *d_cmp, float *d_all, int dim) {
  for (int64_t id = 0; id < sv->docs.n_cmp; id++) {
    float *dst = d_all + (int64_t)sv->lay.gather[id] * dim;
    const float *src = d_cmp + id * dim;
    for (int e = 0; e < dim; e++) dst[e] += src[e];
  }
}

/* Stage 1 backward of one compressor: d_cmp [n_cmp, dim] (this rank's partial) -> weight gradients
 * (accumulated into grads) and, when dx is not NULL, dx += dC . Wkv + dZ . Wgate. */
static dsv4_status stage1_backward(dsv4_core *c, const dsv4_exchange *x, int which, const float *d_cmp,
                                   dsv4_weights *grads, float *dx) {
  dsv4_status rc = DSV4_OK;
  const dsv4_core_saved *sv = &c->sv;
  const dsv4_layout *lay = &sv->lay;
  const dsv4_kernels *K = dsv4_kernels_get(c->impl);
  const int r = c->ratio, dim = which ? c->cfg.index_head_dim : c->cfg.head_dim;
  (void)r;
  const int cD = (r == 4 ? 2 : 1) * dim, d = c->cfg.dim;
  float *d_all = NULL, *d_blk = NULL, *dC = NULL, *dZ = NULL;
  DSV4_SLOTZ(d_all, c->slot[CS_D_SLOTS_ALL], lay->n_blk_all * dim);
  DSV4_SLOT(d_blk, c->slot[CS_D_SLOTS], lay->n_blk * dim);
  scatter_blocks(sv, d_cmp, d_all, dim);
  DSV4_TRY(x->blocks_reduce_scatter(x->st, lay, d_all, d_blk, dim, which));
  DSV4_SLOTZ(dC, c->slot[CS_DC], lay->R_c * cD);
  DSV4_SLOTZ(dZ, c->slot[CS_DZ], lay->R_c * cD);
  const dsv4_wid ape = which ? W_I_APE : W_C_APE, norm = which ? W_I_NORM : W_C_NORM;
  const dsv4_wid wkv = which ? W_I_WKV : W_C_WKV, wgate = which ? W_I_WGATE : W_C_WGATE;
  dsv4_compress_bwd_args cb = {
      .dC = dC, .dZ = dZ, .d_ape = dsv4_w(grads, ape), .d_norm_w = dsv4_w(grads, norm), .d_out = d_blk,
      .fwd = {.out_row = sv->slot_blk, .C = which ? sv->CI : sv->C, .Z = which ? sv->ZI : sv->Z,
              .ape = dsv4_w(c->w, ape), .norm_w = dsv4_w(c->w, norm), .cur_row = sv->slot_cur,
              .prev_row = sv->slot_prev, .pos = sv->slot_pos, .rope = &c->rope,
              .n_slots = sv->n_slot, .ratio = r, .D = dim, .eps = c->cfg.eps, .rows = lay->R_c,
              .rows_out = lay->n_blk}};
  DSV4_TRY(K->compress_bwd(&cb));
  DSV4_TRY(x->cmp_halo_bwd(x->st, lay, dC, dZ, cD, which));
  /* dW += dC_own^T x_own per segment; dx_own += dC_own . W */
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    const int64_t row = sg->c_row + sg->c_halo;
    const float *xs = sv->x + sg->lo * d;
    K->gemm_tn(cD, d, sg->len, 1.0f, dC + row * cD, cD, xs, d, 1.0f, dsv4_w(grads, wkv), d);
    K->gemm_tn(cD, d, sg->len, 1.0f, dZ + row * cD, cD, xs, d, 1.0f, dsv4_w(grads, wgate), d);
    if (dx) {
      K->gemm_nn(sg->len, d, cD, 1.0f, dC + row * cD, cD, dsv4_w(c->w, wkv), d, 1.0f, dx + sg->lo * d, d);
      K->gemm_nn(sg->len, d, cD, 1.0f, dZ + row * cD, cD, dsv4_w(c->w, wgate), d, 1.0f, dx + sg->lo * d, d);
    }
  }
fail:
  return rc;
}

/* KL backward of local rows [i0, i0 + n): gradients of the chunk's indexer queries and weights,
 * then the indexer projections' weight gradients; d KI accumulates. */
static dsv4_status kl_backward_rows(dsv4_core *c, int64_t i0, int64_t n, const float *q, const float *qI,
                                    const float *wI) {
  dsv4_status rc = DSV4_OK;
  const dsv4_core_saved *sv = &c->sv;
  const dsv4_kernels *K = dsv4_kernels_get(c->impl);
  const int Hi = c->cfg.index_n_heads, Di = c->cfg.index_head_dim, d = c->cfg.dim, k = c->cfg.index_topk;
  const int dq = c->cfg.q_lora_rank;
  float *d_qI = NULL, *d_w = NULL;
  double sum = 0;
  int64_t cnt = 0;
  DSV4_SLOT(d_qI, c->slot[CS_D_QI], n * Hi * Di);
  DSV4_SLOT(d_w, c->slot[CS_D_WI], n * Hi);
  const double gs = sv->n_valid ? c->cfg.index_loss_coeff / (double)sv->n_valid * sv->d_loss : 0.0;
  dsv4_kl_args ka = {.loss_sum = &sum, .n_valid = &cnt, .d_q_idx = d_qI, .d_weights = d_w,
                     .d_k_idx = sv->d_KI, .q = q, .cmp_kv = sv->cmp, .topk_ids = sv->topk + i0 * k,
                     .q_idx = qI, .k_idx = sv->KI, .weights = wI, .vis_begin = sv->cmp_begin + i0,
                     .vis_count = sv->cmp_count + i0, .S1 = n, .C = sv->docs.n_cmp, .H = c->cfg.n_heads,
                     .D = c->cfg.head_dim, .Hi = Hi, .Di = Di, .topk = k,
                     .dense = c->cfg.index_loss_mode == DSV4_KL_DENSE,
                     .scale = (float)(1.0 / sqrt((double)c->cfg.head_dim)), .grad_scale = (float)gs,
                     .teacher = sv->teacher ? sv->teacher + i0 * k : NULL, .scores = sv->scores + i0 * k};
  dsv4_placement places[6];
  dsv4_kl_places(places);
  DSV4_TRY(dsv4_indexer_kl_loss_dist(&ka, sv->xch.nranks, places, c->impl));
  /* w = (weights_proj x) * s  ->  d weights_proj += (s dw)^T x;  qI = RoPE(wq_b qr)  ->  RoPE^T */
  const float wscale = (float)(1.0 / sqrt((double)Di * Hi));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    for (int h = 0; h < Hi; h++) d_w[i * Hi + h] *= wscale;
    for (int h = 0; h < Hi; h++) dsv4_rope_apply(&c->rope, d_qI + (i * Hi + h) * Di, Di, c->tok.pos[i0 + i], 1);
  }
  K->gemm_tn(Hi, d, n, 1.0f, d_w, Hi, sv->x + i0 * d, d, 1.0f, dsv4_w(sv->grads, W_I_PROJ), d);
  K->gemm_tn((int64_t)Hi * Di, dq, n, 1.0f, d_qI, (int64_t)Hi * Di, sv->qr + i0 * dq, dq, 1.0f,
             dsv4_w(sv->grads, W_I_WQ_B), dq);
fail:
  return rc;
}

dsv4_status dsv4_core_bwd_begin(dsv4_core *c, dsv4_weights *grads, float d_loss) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  DSV4_CHECK(sv->valid, DSV4_ERR_STATE, "core backward called without a training forward (train = 1)");
  DSV4_CHECK(grads, DSV4_ERR_ARG, "core backward: grads is required");
  sv->grads = grads;
  sv->d_loss = d_loss;
  DSV4_SLOTZ(sv->d_ext, c->slot[CS_D_EXT], sv->lay.R_kv * c->cfg.head_dim);
  if (c->ratio > 0) DSV4_SLOTZ(sv->d_cmp, c->slot[CS_D_CMP], sv->docs.n_cmp * c->cfg.head_dim);
  if (c->ratio == 4) DSV4_SLOTZ(sv->d_KI, c->slot[CS_D_KI], sv->docs.n_cmp * c->cfg.index_head_dim);
fail:
  return rc;
}

/* The chunk's attention output from its queries, with the forward's kernels on the forward's saved
 * inputs (window rows, compressed kv, top-k): every query is computed alone, so this is bitwise the
 * forward's output. The KL teacher is not recomputed (it was kept); the indexer queries are. */
dsv4_status dsv4_core_bwd_recompute(dsv4_core *c, int64_t i0, int64_t n, const float *q, float *o) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  const int H = c->cfg.n_heads, D = c->cfg.head_dim, k = c->cfg.index_topk;
  float *lse = NULL;
  DSV4_CHECK(sv->valid && c->recompute, DSV4_ERR_STATE, "core: recomputation without a recomputing forward");
  DSV4_SLOT(lse, c->slot[CS_RC_LSE], n * H);
  dsv4_attn_args at = {.out = o, .lse = lse, .q = q, .ori_kv = sv->kv_ext ? sv->kv_ext : sv->kv,
                       .win_start = sv->win_start + i0, .win_len = sv->win_len + i0,
                       .sink = dsv4_w(c->w, W_SINK), .S1 = n, .R = sv->lay.R_kv, .H = H, .D = D,
                       .scale = (float)(1.0 / sqrt((double)D))};
  if (c->ratio > 0) {
    at.cmp_kv = sv->cmp;
    at.C = sv->docs.n_cmp;
    at.cmp_begin = sv->cmp_begin + i0;
    at.cmp_count = sv->cmp_count + i0;
  }
  if (c->ratio == 4) {
    at.cmp_ids = sv->topk + i0 * k;
    at.n_cmp_ids = k;
  }
  /* the fast path keeps the chunk's logits for the backward: the same product of the same values,
   * so the backward skips recomputing it (its q.K^T is 2 H D flops per key and query) */
  sv->rc_scores = NULL;
  if (c->impl == DSV4_IMPL_FAST) {
    int64_t keys = 0;
    for (int64_t i = 0; i < n; i++) {
      const int64_t k_i = sv->win_len[i0 + i] + (c->ratio == 4 ? k : c->ratio > 0 ? sv->cmp_count[i0 + i] : 0);
      keys = k_i > keys ? k_i : keys;
    }
    sv->rc_stride = (int64_t)H * keys;
    DSV4_SLOT(sv->rc_scores, c->slot[CS_RC_SCORES], n * sv->rc_stride);
    at.scores_out = sv->rc_scores;
    at.score_stride = sv->rc_stride;
  }
  DSV4_TRY(dsv4_kernels_get(c->impl)->attn(&at));
  if (c->ratio == 4) {
    const int Hi = c->cfg.index_n_heads, Di = c->cfg.index_head_dim;
    DSV4_SLOT(sv->qI, c->slot[CS_QI], n * Hi * Di);
    DSV4_SLOT(sv->wI, c->slot[CS_WI], n * Hi);
    DSV4_TRY(dsv4_core_indexer_queries(c, i0, n, sv->qI, sv->wI));
  }
fail:
  return rc;
}

dsv4_status dsv4_core_bwd_rows(dsv4_core *c, int64_t i0, int64_t n, const float *q, const float *o,
                               const float *d_o, float *dq) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  const int r = c->ratio, H = c->cfg.n_heads, D = c->cfg.head_dim, k = c->cfg.index_topk;
  DSV4_CHECK(sv->valid && sv->grads, DSV4_ERR_STATE, "core backward: rows before dsv4_core_bwd_begin");
  DSV4_CHECK(q && o && d_o && dq && i0 >= 0 && n >= 0 && i0 + n <= sv->n, DSV4_ERR_ARG,
             "core backward: bad rows [%lld, %lld) or NULL buffers", (long long)i0, (long long)(i0 + n));
  dsv4_attn_bwd_args ab = {
      .dq = dq, .d_ori_kv = sv->d_ext, .d_cmp_kv = sv->d_cmp, .d_sink = dsv4_w(sv->grads, W_SINK),
      .dout = d_o, .out = o, .lse = sv->lse + i0 * H, .scores = c->recompute ? sv->rc_scores : NULL,
      .fwd = {.q = q, .ori_kv = sv->kv_ext ? sv->kv_ext : sv->kv, .win_start = sv->win_start + i0,
              .win_len = sv->win_len + i0, .cmp_kv = sv->cmp, .cmp_ids = r == 4 ? sv->topk + i0 * k : NULL,
              .cmp_begin = sv->cmp_begin ? sv->cmp_begin + i0 : NULL,
              .cmp_count = sv->cmp_count ? sv->cmp_count + i0 : NULL, .sink = dsv4_w(c->w, W_SINK), .S1 = n,
              .R = sv->lay.R_kv, .C = sv->docs.n_cmp, .H = H, .D = D, .n_cmp_ids = r == 4 ? k : 0,
              .scale = (float)(1.0 / sqrt((double)D)), .score_stride = sv->rc_stride}};
  dsv4_placement places[5];
  dsv4_attn_places(places, sv->lay.R_kv - n);
  DSV4_TRY(dsv4_sparse_attn_bwd_dist(&ab, sv->xch.nranks, places, c->impl));
  if (r == 4) {
    const int Hi = c->cfg.index_n_heads, Di = c->cfg.index_head_dim;
    /* recomputation left this chunk's indexer queries in the chunk-sized buffers */
    const float *qI = c->recompute ? sv->qI : sv->qI + i0 * Hi * Di, *wI = c->recompute ? sv->wI : sv->wI + i0 * Hi;
    DSV4_TRY(kl_backward_rows(c, i0, n, q, qI, wI));
  }
fail:
  return rc;
}

dsv4_status dsv4_core_bwd_end(dsv4_core *c, float *dkv, float *dx) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  const dsv4_layout *lay = &sv->lay;
  const int D = c->cfg.head_dim;
  DSV4_CHECK(sv->valid && sv->grads, DSV4_ERR_STATE, "core backward: end before dsv4_core_bwd_begin");
  DSV4_CHECK(dkv && (c->ratio == 0 || dx), DSV4_ERR_ARG, "core backward: dkv (and dx for a compressed layer) required");
  if (lay->ext_kv) DSV4_TRY(sv->xch.win_halo_bwd(sv->xch.st, lay, sv->d_ext, D));
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    memcpy(dkv + sg->lo * D, sv->d_ext + (sg->kv_row + sg->win_halo) * D, sizeof(float) * sg->len * D);
  }
  if (c->ratio > 0) DSV4_TRY(stage1_backward(c, &sv->xch, 0, sv->d_cmp, sv->grads, dx));
  if (c->ratio == 4) DSV4_TRY(stage1_backward(c, &sv->xch, 1, sv->d_KI, sv->grads, NULL));
fail:
  return rc;
}

/* The public entry point: the whole backward with q, o, d_o and dq whole (saved q and o). */
dsv4_status dsv4_core_run_backward(dsv4_core *c, const dsv4_core_bwd_args *a) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  const int64_t HD = (int64_t)c->cfg.n_heads * c->cfg.head_dim;
  DSV4_CHECK(sv->valid, DSV4_ERR_STATE, "core backward called without a training forward (train = 1)");
  DSV4_CHECK(a && a->dq && a->dkv && a->grads && a->d_o, DSV4_ERR_ARG,
             "core backward: dq, dkv, grads and d_o are required");
  DSV4_CHECK(c->ratio == 0 || a->dx, DSV4_ERR_ARG, "core backward: dx is required for a compressed layer");
  DSV4_CHECK(sv->q && sv->o, DSV4_ERR_STATE,
             "core backward: the forward kept no q and o (recomputation is driven by dsv4_layer_backward)");
  DSV4_TRY(dsv4_core_bwd_begin(c, a->grads, a->d_loss));
  for (int64_t i0 = 0, i1; i0 < sv->n; i0 = i1) {
    i1 = dsv4_core_chunk_end(c, i0, DSV4_CHUNK_ROWS);
    DSV4_TRY(dsv4_core_bwd_rows(c, i0, i1 - i0, sv->q + i0 * HD, sv->o + i0 * HD, a->d_o + i0 * HD, a->dq + i0 * HD));
  }
  DSV4_TRY(dsv4_core_bwd_end(c, a->dkv, a->dx));
fail:
  return rc;
}
