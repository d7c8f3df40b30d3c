/* core_bwd.c: the core attention backward; every forward message is mirrored:
 *   attention backward (local queries)  -> dq, d kv_ext (incl. halo rows), d cmp, d sink
 *   window halo rows' gradients go back to their owners and are added there
 *   d cmp -> scatter through the gather index -> reduce-scatter to the owners' blocks
 *         -> compressor backward -> halo rows' gradients back to the left neighbour
 *         -> compressor weight gradients and dx
 *   KL loss gradients (indexer only; its inputs are detached) -> indexer weight gradients, with the
 *   indexer keys' gradients taking the same path back as the main compressed kv. */
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

/* Indexer backward: KL gradients of q_idx, weights and k_idx, then the indexer's weights. */
static dsv4_status indexer_backward(dsv4_core *c, const dsv4_core_bwd_args *a, const dsv4_exchange *x) {
  dsv4_status rc = DSV4_OK;
  const dsv4_core_saved *sv = &c->sv;
  const dsv4_kernels *K = dsv4_kernels_get(c->impl);
  const int Hi = c->cfg.index_n_heads, Di = c->cfg.index_head_dim, d = c->cfg.dim;
  const int dq = c->cfg.q_lora_rank;
  const int64_t n = sv->n;
  float *d_qI = NULL, *d_w = NULL, *d_KI = NULL;
  double sum = 0;
  int64_t cnt = 0;
  DSV4_SLOT(d_qI, c->slot[CS_D_QI], n * Hi * Di);
  DSV4_SLOT(d_w, c->slot[CS_D_WI], n * Hi);
  DSV4_SLOTZ(d_KI, c->slot[CS_D_KI], sv->docs.n_cmp * Di);
  const double gs = sv->n_valid ? c->cfg.index_loss_coeff / (double)sv->n_valid * a->d_loss : 0.0;
  dsv4_kl_args ka = {.loss_sum = &sum, .n_valid = &cnt, .d_q_idx = d_qI, .d_weights = d_w,
                     .d_k_idx = d_KI, .q = sv->q, .cmp_kv = sv->cmp, .topk_ids = sv->topk,
                     .q_idx = sv->qI, .k_idx = sv->KI, .weights = sv->wI, .vis_begin = sv->cmp_begin,
                     .vis_count = sv->cmp_count, .S1 = n, .C = sv->docs.n_cmp, .H = c->cfg.n_heads,
                     .D = c->cfg.head_dim, .Hi = Hi, .Di = Di, .topk = c->cfg.index_topk,
                     .dense = c->cfg.index_loss_mode == DSV4_KL_DENSE,
                     .scale = (float)(1.0 / sqrt((double)c->cfg.head_dim)), .grad_scale = (float)gs,
                     .teacher = sv->teacher, .scores = sv->scores};
  dsv4_placement places[6];
  dsv4_kl_places(places);
  DSV4_TRY(dsv4_indexer_kl_loss_dist(&ka, x->nranks, places, c->impl));
  /* w = (weights_proj x) * s  ->  d weights_proj += (s dw)^T x;  qI = RoPE(wq_b qr)  ->  RoPE^T */
  const float wscale = (float)(1.0 / sqrt((double)Di * Hi));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    for (int h = 0; h < Hi; h++) d_w[i * Hi + h] *= wscale;
    for (int h = 0; h < Hi; h++) dsv4_rope_apply(&c->rope, d_qI + (i * Hi + h) * Di, Di, c->tok.pos[i], 1);
  }
  K->gemm_tn(Hi, d, n, 1.0f, d_w, Hi, sv->x, d, 1.0f, dsv4_w(a->grads, W_I_PROJ), d);
  K->gemm_tn((int64_t)Hi * Di, dq, n, 1.0f, d_qI, (int64_t)Hi * Di, sv->qr, dq, 1.0f,
             dsv4_w(a->grads, W_I_WQ_B), dq);
  DSV4_TRY(stage1_backward(c, x, 1, d_KI, a->grads, NULL));
fail:
  return rc;
}

dsv4_status dsv4_core_run_backward(dsv4_core *c, const dsv4_core_bwd_args *a, const dsv4_exchange *x) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  const int r = c->ratio, H = c->cfg.n_heads, D = c->cfg.head_dim;
  float *d_ext = NULL, *d_cmp = NULL;
  DSV4_CHECK(sv->valid, DSV4_ERR_STATE, "core backward called without a training forward (train = 1)");
  DSV4_CHECK(a && a->dq && a->dkv && a->grads && a->d_o, DSV4_ERR_ARG,
             "core backward: dq, dkv, grads and d_o are required");
  DSV4_CHECK(r == 0 || a->dx, DSV4_ERR_ARG, "core backward: dx is required for a compressed layer");
  const int64_t n = sv->n;
  const dsv4_layout *lay = &sv->lay;
  float *d_kv = a->dkv;
  if (sv->kv_ext) DSV4_SLOTZ(d_ext, c->slot[CS_D_KV_EXT], lay->R_kv * D);
  else memset(a->dkv, 0, sizeof(float) * (size_t)(n * D));
  if (r > 0) DSV4_SLOTZ(d_cmp, c->slot[CS_D_CMP], sv->docs.n_cmp * D);
  dsv4_attn_bwd_args ab = {
      .dq = a->dq, .d_ori_kv = sv->kv_ext ? d_ext : d_kv, .d_cmp_kv = d_cmp,
      .d_sink = dsv4_w(a->grads, W_SINK), .dout = a->d_o, .out = sv->o, .lse = sv->lse,
      .fwd = {.q = sv->q, .ori_kv = sv->kv_ext ? sv->kv_ext : sv->kv, .win_start = sv->win_start,
              .win_len = sv->win_len, .cmp_kv = sv->cmp, .cmp_ids = r == 4 ? sv->topk : NULL,
              .cmp_begin = sv->cmp_begin, .cmp_count = sv->cmp_count, .sink = dsv4_w(c->w, W_SINK),
              .S1 = n, .R = lay->R_kv, .C = sv->docs.n_cmp, .H = H, .D = D,
              .n_cmp_ids = r == 4 ? c->cfg.index_topk : 0, .scale = (float)(1.0 / sqrt((double)D))}};
  dsv4_placement places[5];
  dsv4_attn_places(places, lay->R_kv - n);
  DSV4_TRY(dsv4_sparse_attn_bwd_dist(&ab, x->nranks, places, c->impl));
  if (sv->kv_ext) {
    DSV4_TRY(x->win_halo_bwd(x->st, lay, d_ext, D));
    for (int s = 0; s < lay->n_seg; s++) {
      const dsv4_seg *sg = &lay->seg[s];
      memcpy(a->dkv + sg->lo * D, d_ext + (sg->kv_row + sg->win_halo) * D, sizeof(float) * sg->len * D);
    }
  }
  if (r > 0) DSV4_TRY(stage1_backward(c, x, 0, d_cmp, a->grads, a->dx));
  if (r == 4) DSV4_TRY(indexer_backward(c, a, x));
fail:
  return rc;
}
