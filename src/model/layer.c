/* layer.c: the attention layer around the core (SPEC 3 steps 1-2 and 8-9): q/kv projections with
 * their RMSNorms and RoPE, the core (through its function pointers, so CP can swap it), inverse
 * RoPE and the grouped output projection; and the backward of all of it. Positions come from the
 * core's token map, so the same code runs on one rank and on a CP shard. */
#include <string.h>

#include "model/core_internal.h"
#include "model/weights.h"
#include "ops/rmsnorm.h"
#include "util/err.h"
#include "util/gemm.h"
#include "util/reduce.h"
#include "util/slot.h"

/* Buffers kept across calls (util/slot.h). Saved activations have their own slots; the temporaries
 * share T0..T4 (forward: og; recomputation: q and o of a chunk and their norms; backward: g, du,
 * dop, dqr of a chunk, dkv of every row). */
enum { LS_GLOB, LS_POS, LS_REAL, LS_A, LS_QR, LS_Q, LS_C, LS_KV, LS_SA, LS_SB, LS_SC, LS_O, LS_U,
       LS_T0, LS_T1, LS_T2, LS_T3, LS_T4, LS_RQ, LS_RO, LS_RSB, LS_COUNT };

struct dsv4_layer {
  dsv4_config cfg;
  int layer;
  const dsv4_weights *w;
  dsv4_core *core;
  dsv4_impl impl;
  int recompute;                                 /* keep neither q nor o: rebuild them in the backward */
  /* saved by a training forward */
  int valid;
  int64_t n;
  const float *x;
  float *a, *qr, *q, *c, *kv, *o, *u;           /* activations, see forward (q, o NULL: recomputation) */
  float *sa, *sb, *sc;                           /* inverse rms of a [n], b [n, H], c [n] */
  int32_t *pos;
  uint8_t *real;
  int64_t *glob;
  dsv4_slot slot[LS_COUNT];
};

/* Forgets the saved activations (their buffers stay in the slots for the next call). */
static void saved_free(dsv4_layer *l) {
  l->a = l->qr = l->q = l->c = l->kv = l->o = l->u = l->sa = l->sb = l->sc = NULL;
  l->pos = NULL;
  l->real = NULL;
  l->glob = NULL;
  l->valid = 0;
}

dsv4_status dsv4_layer_create(dsv4_layer **out, const dsv4_config *cfg, int layer, const dsv4_weights *w) {
  dsv4_status rc = DSV4_OK;
  dsv4_layer *l = NULL;
  DSV4_CHECK(out, DSV4_ERR_ARG, "layer: NULL out");
  *out = NULL;
  DSV4_ALLOC(l, 1);
  DSV4_TRY(dsv4_core_create(&l->core, cfg, layer, w));
  l->cfg = *cfg;
  l->layer = layer;
  l->w = w;
  *out = l;
  return DSV4_OK;
fail:
  dsv4_layer_free(l);
  return rc;
}

void dsv4_layer_free(dsv4_layer *l) {
  if (!l) return;
  for (int i = 0; i < LS_COUNT; i++) dsv4_slot_free(&l->slot[i]);
  dsv4_core_free(l->core);
  free(l);
}

dsv4_core *dsv4_layer_core(dsv4_layer *l) { return l->core; }

size_t dsv4_layer_saved_bytes(const dsv4_layer *l) {
  if (!l || !l->valid) return 0;
  const dsv4_core_saved *sv = &l->core->sv;
  return dsv4_saved_bytes_formula(&l->cfg, l->core->ratio, l->n, sv->lay.R_kv, sv->lay.ext_kv, sv->lay.R_c,
                                  sv->n_slot, sv->docs.n_cmp, l->recompute);
}

void dsv4_layer_set_impl(dsv4_layer *l, dsv4_impl impl) {
  l->impl = impl;
  dsv4_core_set_impl(l->core, impl);
}

dsv4_status dsv4_layer_set_recompute(dsv4_layer *l, int on) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(l, DSV4_ERR_ARG, "layer: NULL");
  saved_free(l); /* a forward of the other mode cannot be backpropagated */
  dsv4_core_saved_free(&l->core->sv);
  l->recompute = on != 0;
  l->core->recompute = on != 0;
fail:
  return rc;
}

/* dst [m, (H/G) D] = heads of group g of the m rows of o (local rows i0..) with the inverse RoPE at
 * each row's position (step 8). */
static void rotated_group(const dsv4_layer *l, float *dst, const float *o, int64_t i0, int64_t m, int64_t g) {
  const int64_t H = l->cfg.n_heads, D = l->cfg.head_dim, HG = H / l->cfg.o_groups;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; i++)
    for (int64_t h = 0; h < HG; h++) {
      float *v = dst + (i * HG + h) * D;
      memcpy(v, o + (i * H + g * HG + h) * D, sizeof(float) * (size_t)D);
      dsv4_rope_apply(&l->core->rope, v, (int)D, l->pos[i0 + i], 1);
    }
}

/* Y rows [i0, i0 + m) = X rows . W^T in the global projection panels (util/gemm.h): a row's bits
 * do not depend on which rows are computed with it. */
static dsv4_status proj(const dsv4_layer *l, float *Y, int64_t ldy, const float *X, int64_t ldx, const float *W,
                        int64_t N, int64_t K, int64_t i0, int64_t m) {
  return dsv4_proj_rows(Y, ldy, X, ldx, W, m, N, K, l->glob + i0, dsv4_panel_rows(l->core->sv.docs.T), l->impl);
}

/* Step 1 for rows [i0, i0 + m): q = RoPE(RMSNorm(wq_b qr)) per head, and each head's inverse rms. */
static dsv4_status queries(const dsv4_layer *l, float *q, float *sb, int64_t i0, int64_t m) {
  dsv4_status rc = DSV4_OK;
  const int64_t H = l->cfg.n_heads, D = l->cfg.head_dim, dq = l->cfg.q_lora_rank;
  DSV4_TRY(proj(l, q, H * D, l->qr + i0 * dq, dq, dsv4_w(l->w, W_WQ_B), H * D, dq, i0, m));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; i++)
    for (int64_t h = 0; h < H; h++) {
      float *qh = q + (i * H + h) * D;
      sb[i * H + h] = dsv4_rmsnorm_row(qh, qh, NULL, (int)D, l->cfg.eps);
      dsv4_rope_apply(&l->core->rope, qh, (int)D, l->pos[i0 + i], 0);
    }
fail:
  return rc;
}

/* Steps 8-9 for rows [i0, i0 + m): inverse RoPE and the grouped output projection, one group at a
 * time through og [m, (H/G) D] (the rotated output is never kept whole; the backward rebuilds it). */
static dsv4_status output_rows(dsv4_layer *l, float *out, const float *o, float *og, int64_t i0, int64_t m) {
  dsv4_status rc = DSV4_OK;
  const dsv4_config *cf = &l->cfg;
  const int64_t d = cf->dim, H = cf->n_heads, D = cf->head_dim, G = cf->o_groups, Ro = cf->o_lora_rank;
  const int64_t HGD = (H / G) * D;
  for (int64_t g = 0; g < G; g++) {
    rotated_group(l, og, o, i0, m, g);
    DSV4_TRY(proj(l, l->u + i0 * G * Ro + g * Ro, G * Ro, og, HGD, dsv4_w(l->w, W_WO_A) + g * Ro * HGD, Ro, HGD, i0, m));
  }
  DSV4_TRY(proj(l, out + i0 * d, d, l->u + i0 * G * Ro, G * Ro, dsv4_w(l->w, W_WO_B), d, G * Ro, i0, m));
fail:
  return rc;
}

dsv4_status dsv4_layer_forward(dsv4_layer *l, float *out, int32_t *topk_ids, float *indexer_loss,
                               const float *x, int64_t n, const dsv4_packing *pk, int train) {
  dsv4_status rc = DSV4_OK;
  dsv4_token_map map;
  const dsv4_config *cf = &l->cfg;
  const int64_t d = cf->dim, H = cf->n_heads, D = cf->head_dim, dq = cf->q_lora_rank;
  const int64_t G = cf->o_groups, Ro = cf->o_lora_rank, HGD = (H / G) * D;
  const dsv4_weights *w = l->w;
  dsv4_core *core = l->core;
  float *og = NULL, *qc = NULL, *oc = NULL, *sbc = NULL;
  saved_free(l);
  DSV4_CHECK(out && x && pk, DSV4_ERR_ARG, "layer forward: out, x and pk are required");
  DSV4_TRY(dsv4_core_token_map(core, pk, n, &map));
  l->n = n;
  l->x = x;
  DSV4_SLOT(l->glob, l->slot[LS_GLOB], n);
  DSV4_SLOT(l->pos, l->slot[LS_POS], n);
  DSV4_SLOT(l->real, l->slot[LS_REAL], n);
  for (int64_t i = 0; i < n; i++) {
    l->glob[i] = map.global[i];
    l->pos[i] = map.pos[i];
    l->real[i] = map.real[i];
  }
  DSV4_TRY(dsv4_core_reserve_rope(core, l->pos, n));
  const int64_t P = dsv4_panel_rows(pk->T);
  DSV4_SLOT(l->a, l->slot[LS_A], n * dq);
  DSV4_SLOT(l->qr, l->slot[LS_QR], n * dq);
  DSV4_SLOT(l->c, l->slot[LS_C], n * D);
  DSV4_SLOT(l->kv, l->slot[LS_KV], n * D);
  DSV4_SLOT(l->sa, l->slot[LS_SA], n);
  DSV4_SLOT(l->sc, l->slot[LS_SC], n);
  DSV4_SLOT(l->u, l->slot[LS_U], n * G * Ro);
  /* step 1: qr = RMSNorm_{q_norm}(wq_a x) */
  DSV4_TRY(dsv4_proj_rows(l->a, dq, x, d, dsv4_w(w, W_WQ_A), n, dq, d, l->glob, P, l->impl));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++)
    l->sa[i] = dsv4_rmsnorm_row(l->qr + i * dq, l->a + i * dq, dsv4_w(w, W_Q_NORM), (int)dq, cf->eps);
  /* step 2: kv = RoPE(RMSNorm_{kv_norm}(wkv x)) */
  DSV4_TRY(dsv4_proj_rows(l->c, D, x, d, dsv4_w(w, W_WKV), n, D, d, l->glob, P, l->impl));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    l->sc[i] = dsv4_rmsnorm_row(l->kv + i * D, l->c + i * D, dsv4_w(w, W_KV_NORM), (int)D, cf->eps);
    dsv4_rope_apply(&core->rope, l->kv + i * D, (int)D, l->pos[i], 0);
  }
  /* the core: Stage 1 starts (its all-gathers overlap the query projection), then the queries in
   * chunks. Default: one chunk, q and o kept whole for the backward. Recomputation: chunks of
   * DSV4_CHUNK_ROWS, q and o of one chunk at a time (the backward rebuilds them). */
  dsv4_core_fwd_args ca = {.topk_ids = topk_ids, .kv = l->kv, .x = x, .qr = l->qr, .pk = pk, .n = n, .train = train};
  if (!l->recompute) {
    DSV4_SLOT(l->q, l->slot[LS_Q], n * H * D);
    DSV4_SLOT(l->o, l->slot[LS_O], n * H * D);
    DSV4_SLOT(l->sb, l->slot[LS_SB], n * H);
    ca.q = l->q, ca.o = l->o;
  }
  DSV4_TRY(dsv4_core_fwd_begin(core, &ca));
  const int64_t chunk = l->recompute ? DSV4_CHUNK_ROWS : (n > 0 ? n : 1);
  DSV4_SLOT(og, l->slot[LS_T0], (chunk < n ? chunk : n) * HGD);
  if (l->recompute) {
    DSV4_SLOT(qc, l->slot[LS_RQ], (chunk < n ? chunk : n) * H * D);
    DSV4_SLOT(oc, l->slot[LS_RO], (chunk < n ? chunk : n) * H * D);
    DSV4_SLOT(sbc, l->slot[LS_RSB], (chunk < n ? chunk : n) * H);
  }
  for (int64_t i0 = 0, i1; i0 < n; i0 = i1) {
    i1 = l->recompute ? dsv4_core_chunk_end(core, i0, chunk) : n;
    float *q = l->recompute ? qc : l->q + i0 * H * D, *o = l->recompute ? oc : l->o + i0 * H * D;
    float *sb = l->recompute ? sbc : l->sb + i0 * H;
    DSV4_TRY(queries(l, q, sb, i0, i1 - i0));
    DSV4_TRY(dsv4_core_fwd_rows(core, i0, i1 - i0, q, o));
    DSV4_TRY(output_rows(l, out, o, og, i0, i1 - i0));
  }
  DSV4_TRY(dsv4_core_fwd_end(core, indexer_loss, train));
  for (int64_t i = 0; i < n; i++)
    if (!l->real[i]) memset(out + i * d, 0, sizeof(float) * (size_t)d);
  l->valid = train;
fail:
  if (rc != DSV4_OK) dsv4_core_fail(core);
  if (rc != DSV4_OK || !train) saved_free(l);
  return rc;
}

/* The output projection's backward for rows [i0, i0 + m) (steps 9 and 8): weight gradients of wo_b
 * and wo_a, and d o [m, H, D] (written into dop) for the core. */
static void output_backward(dsv4_layer *l, dsv4_weights *grads, const float *dout, const float *o, float *g,
                            float *du, float *dop, int64_t i0, int64_t m) {
  const dsv4_config *cf = &l->cfg;
  const int64_t d = cf->dim, H = cf->n_heads, D = cf->head_dim, G = cf->o_groups, Ro = cf->o_lora_rank;
  const int64_t HGD = (H / G) * D;
  const dsv4_weights *w = l->w;
  const dsv4_kernels *K = dsv4_kernels_get(l->impl);
  /* padding rows have no output, so their dout is ignored */
  for (int64_t i = 0; i < m; i++) {
    if (l->real[i0 + i]) memcpy(g + i * d, dout + (i0 + i) * d, sizeof(float) * (size_t)d);
    else memset(g + i * d, 0, sizeof(float) * (size_t)d);
  }
  /* out = wo_b u;  u_g = wo_a[g] op_g */
  K->gemm_tn(d, G * Ro, m, 1.0f, g, d, l->u + i0 * G * Ro, G * Ro, 1.0f, dsv4_w(grads, W_WO_B), G * Ro);
  K->gemm_nn(m, G * Ro, d, 1.0f, g, d, dsv4_w(w, W_WO_B), G * Ro, 0.0f, du, G * Ro);
  /* dop holds the rotated output op group by group; each group's columns serve dW first and are
   * then overwritten by that group's d op */
  for (int64_t gi = 0; gi < G; gi++) {
    float *x = dop + gi * HGD;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; i++)
      for (int64_t h = 0; h < H / G; h++) {
        float *v = x + i * H * D + h * D;
        memcpy(v, o + (i * H + gi * (H / G) + h) * D, sizeof(float) * (size_t)D);
        dsv4_rope_apply(&l->core->rope, v, (int)D, l->pos[i0 + i], 1);
      }
    K->gemm_tn(Ro, HGD, m, 1.0f, du + gi * Ro, G * Ro, x, H * D, 1.0f, dsv4_w(grads, W_WO_A) + gi * Ro * HGD, HGD);
    K->gemm_nn(m, HGD, Ro, 1.0f, du + gi * Ro, G * Ro, dsv4_w(w, W_WO_A) + gi * Ro * HGD, HGD, 0.0f, x, H * D);
  }
  /* op = RoPE_{-p}(o)  ->  d o = RoPE_{+p}(d op) */
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; i++)
    for (int64_t h = 0; h < H; h++) dsv4_rope_apply(&l->core->rope, dop + (i * H + h) * D, (int)D, l->pos[i0 + i], 0);
}

/* The query path's backward for rows [i0, i0 + m), from dq (the core's, over dop): q = RoPE(s b)
 * per head (RMSNorm without weight, s = 1/rms(b)); b is not kept. With y = s b and dy = RoPE^T(dq),
 * RMSNorm's backward dv = s dy - s^3 b (dy . b) / D becomes, using b = RoPE^T(q) / s and that a
 * rotation keeps dot products ((RoPE^T dq) . (RoPE^T q) = dq . q):
 *   db = s RoPE^T(dq - (dq . q / D) q)   -- one dot, one update, one inverse rotation.
 * Then b = wq_b qr, qr = RMSNorm_{q_norm}(a), a = wq_a x: weight gradients and dx rows. */
static dsv4_status query_backward(dsv4_layer *l, dsv4_weights *grads, float *dq_, const float *q, const float *sb,
                                  float *dqr, float *dx, int64_t i0, int64_t m) {
  dsv4_status rc = DSV4_OK;
  const dsv4_config *cf = &l->cfg;
  const int64_t d = cf->dim, H = cf->n_heads, D = cf->head_dim, dq = cf->q_lora_rank;
  const dsv4_weights *w = l->w;
  const dsv4_kernels *K = dsv4_kernels_get(l->impl);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; i++)
    for (int64_t h = 0; h < H; h++) {
      float *dh = dq_ + (i * H + h) * D;
      const float *qh = q + (i * H + h) * D, s = sb[i * H + h];
      const float c = (float)(dsv4_dot_d(dh, qh, D) / (double)D);
      for (int64_t e = 0; e < D; e++) dh[e] = s * (dh[e] - c * qh[e]);
      dsv4_rope_apply(&l->core->rope, dh, (int)D, l->pos[i0 + i], 1);
    }
  K->gemm_tn(H * D, dq, m, 1.0f, dq_, H * D, l->qr + i0 * dq, dq, 1.0f, dsv4_w(grads, W_WQ_B), dq);
  K->gemm_nn(m, dq, H * D, 1.0f, dq_, H * D, dsv4_w(w, W_WQ_B), dq, 0.0f, dqr, dq);
  float *dqn = dsv4_w(grads, W_Q_NORM);
  for (int64_t i = 0; i < m; i++) /* serial: accumulates into d q_norm */
    dsv4_rmsnorm_bwd_row(dqr + i * dq, dqn, dqr + i * dq, l->a + (i0 + i) * dq, dsv4_w(w, W_Q_NORM), l->sa[i0 + i],
                         (int)dq);
  K->gemm_tn(dq, d, m, 1.0f, dqr, dq, l->x + i0 * d, d, 1.0f, dsv4_w(grads, W_WQ_A), d);
  K->gemm_nn(m, d, dq, 1.0f, dqr, dq, dsv4_w(w, W_WQ_A), d, 1.0f, dx + i0 * d, d);
  return rc;
}

dsv4_status dsv4_layer_backward(dsv4_layer *l, float *dx, dsv4_weights *grads, const float *dout,
                                float d_loss) {
  dsv4_status rc = DSV4_OK;
  const dsv4_config *cf = &l->cfg;
  const int64_t d = cf->dim, H = cf->n_heads, D = cf->head_dim, dq = cf->q_lora_rank;
  const int64_t G = cf->o_groups, Ro = cf->o_lora_rank, n = l->n;
  const dsv4_weights *w = l->w;
  const dsv4_kernels *K = dsv4_kernels_get(l->impl);
  dsv4_core *core = l->core;
  float *g = NULL, *du = NULL, *dop = NULL, *dkv = NULL, *dqr = NULL, *qc = NULL, *oc = NULL, *sbc = NULL;
  DSV4_CHECK(l->valid, DSV4_ERR_STATE, "layer backward called without a training forward (train = 1)");
  DSV4_CHECK(dx && grads && dout, DSV4_ERR_ARG, "layer backward: dx, grads and dout are required");
  DSV4_CHECK(dsv4_weights_layer(grads) == l->layer, DSV4_ERR_ARG,
             "layer backward: gradient set is for layer %d, not %d", dsv4_weights_layer(grads), l->layer);
  /* every chunk-sized temporary once; the same chunks with or without recomputation, so both give
   * the same bits (core_internal.h) */
  const int64_t m_max = n < DSV4_CHUNK_ROWS ? n : DSV4_CHUNK_ROWS;
  DSV4_SLOT(g, l->slot[LS_T0], m_max * d);
  DSV4_SLOT(du, l->slot[LS_T1], m_max * G * Ro);
  DSV4_SLOT(dop, l->slot[LS_T2], m_max * H * D);
  DSV4_SLOT(dqr, l->slot[LS_T3], m_max * dq);
  if (l->recompute) {
    DSV4_SLOT(qc, l->slot[LS_RQ], m_max * H * D);
    DSV4_SLOT(oc, l->slot[LS_RO], m_max * H * D);
    DSV4_SLOT(sbc, l->slot[LS_RSB], m_max * H);
  }
  memset(dx, 0, sizeof(float) * (size_t)(n * d));
  DSV4_TRY(dsv4_core_bwd_begin(core, grads, d_loss));
  for (int64_t i0 = 0, i1; i0 < n; i0 = i1) {
    i1 = dsv4_core_chunk_end(core, i0, DSV4_CHUNK_ROWS);
    const int64_t m = i1 - i0;
    const float *q = l->recompute ? qc : l->q + i0 * H * D, *o = l->recompute ? oc : l->o + i0 * H * D;
    const float *sb = l->recompute ? sbc : l->sb + i0 * H;
    if (l->recompute) { /* the chunk's q and o again, bitwise the forward's */
      DSV4_TRY(queries(l, qc, sbc, i0, m));
      DSV4_TRY(dsv4_core_bwd_recompute(core, i0, m, qc, oc));
    }
    output_backward(l, grads, dout, o, g, du, dop, i0, m);
    /* the core writes dq over d o, query by query (allowed: dq may alias d_o) */
    DSV4_TRY(dsv4_core_bwd_rows(core, i0, m, q, o, dop, dop));
    DSV4_TRY(query_backward(l, grads, dop, q, sb, dqr, dx, i0, m));
  }
  /* kv = RoPE(RMSNorm_{kv_norm}(c)), c = wkv x: once every query (and other ranks' halos) added to dkv */
  DSV4_SLOT(dkv, l->slot[LS_T4], n * D);
  DSV4_TRY(dsv4_core_bwd_end(core, dkv, dx));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) dsv4_rope_apply(&core->rope, dkv + i * D, (int)D, l->pos[i], 1);
  float *dkvn = dsv4_w(grads, W_KV_NORM);
  for (int64_t i = 0; i < n; i++) /* serial: accumulates into d kv_norm */
    dsv4_rmsnorm_bwd_row(dkv + i * D, dkvn, dkv + i * D, l->c + i * D, dsv4_w(w, W_KV_NORM), l->sc[i], (int)D);
  K->gemm_tn(D, d, n, 1.0f, dkv, D, l->x, d, 1.0f, dsv4_w(grads, W_WKV), d);
  K->gemm_nn(n, d, D, 1.0f, dkv, D, dsv4_w(w, W_WKV), d, 1.0f, dx, d);
  for (int64_t i = 0; i < n; i++)
    if (!l->real[i]) memset(dx + i * d, 0, sizeof(float) * (size_t)d);
fail:
  return rc;
}
