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
 * share T0..T3 (og in the forward; g, du, dop, dkv, dqr in the backward, T1 reused once du is dead). */
enum { LS_GLOB, LS_POS, LS_REAL, LS_A, LS_QR, LS_Q, LS_C, LS_KV, LS_SA, LS_SB, LS_SC, LS_O, LS_U,
       LS_T0, LS_T1, LS_T2, LS_T3, LS_COUNT };

struct dsv4_layer {
  dsv4_config cfg;
  int layer;
  const dsv4_weights *w;
  dsv4_core *core;
  dsv4_impl impl;
  /* saved by a training forward */
  int valid;
  int64_t n;
  const float *x;
  float *a, *qr, *q, *c, *kv, *o, *u;           /* activations, see forward */
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
                                  sv->n_slot, sv->docs.n_cmp);
}

void dsv4_layer_set_impl(dsv4_layer *l, dsv4_impl impl) {
  l->impl = impl;
  dsv4_core_set_impl(l->core, impl);
}

/* dst [n, (H/G) D] = heads of group g of o with the inverse RoPE at each row's position (step 8). */
static void rotated_group(const dsv4_layer *l, float *dst, int64_t g) {
  const int64_t H = l->cfg.n_heads, D = l->cfg.head_dim, HG = H / l->cfg.o_groups;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < l->n; i++)
    for (int64_t h = 0; h < HG; h++) {
      float *v = dst + (i * HG + h) * D;
      memcpy(v, l->o + (i * H + g * HG + h) * D, sizeof(float) * (size_t)D);
      dsv4_rope_apply(&l->core->rope, v, (int)D, l->pos[i], 1);
    }
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
  float *og = NULL;
  saved_free(l);
  DSV4_CHECK(out && x && pk, DSV4_ERR_ARG, "layer forward: out, x and pk are required");
  DSV4_TRY(dsv4_core_token_map(core, pk, n, &map));
  l->n = n;
  l->x = x;
  DSV4_SLOT(l->glob, l->slot[LS_GLOB], n);
  DSV4_SLOT(l->pos, l->slot[LS_POS], n);
  DSV4_SLOT(l->real, l->slot[LS_REAL], n);
  int64_t max_pos = 0;
  for (int64_t i = 0; i < n; i++) {
    l->glob[i] = map.global[i];
    l->pos[i] = map.pos[i];
    l->real[i] = map.real[i];
    max_pos = map.pos[i] > max_pos ? map.pos[i] : max_pos;
  }
  DSV4_TRY(dsv4_rope_reserve(&core->rope, max_pos + 1));
  const int64_t P = dsv4_panel_rows(pk->T);
#define PROJ(Y, ldy, X, ldx, W, N, K) \
  DSV4_TRY(dsv4_proj_rows(Y, ldy, X, ldx, W, n, N, K, l->glob, P, l->impl))
  DSV4_SLOT(l->a, l->slot[LS_A], n * dq);
  DSV4_SLOT(l->qr, l->slot[LS_QR], n * dq);
  DSV4_SLOT(l->q, l->slot[LS_Q], n * H * D);
  DSV4_SLOT(l->c, l->slot[LS_C], n * D);
  DSV4_SLOT(l->kv, l->slot[LS_KV], n * D);
  DSV4_SLOT(l->sa, l->slot[LS_SA], n);
  DSV4_SLOT(l->sb, l->slot[LS_SB], n * H);
  DSV4_SLOT(l->sc, l->slot[LS_SC], n);
  /* step 1: qr = RMSNorm_{q_norm}(wq_a x); q = RoPE(RMSNorm(wq_b qr)) per head */
  PROJ(l->a, dq, x, d, dsv4_w(w, W_WQ_A), dq, d);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++)
    l->sa[i] = dsv4_rmsnorm_row(l->qr + i * dq, l->a + i * dq, dsv4_w(w, W_Q_NORM), (int)dq, cf->eps);
  PROJ(l->q, H * D, l->qr, dq, dsv4_w(w, W_WQ_B), H * D, dq); /* b = wq_b qr, normed in place below */
  /* step 2: kv = RoPE(RMSNorm_{kv_norm}(wkv x)) */
  PROJ(l->c, D, x, d, dsv4_w(w, W_WKV), D, d);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    for (int64_t h = 0; h < H; h++) {
      float *qh = l->q + (i * H + h) * D;
      l->sb[i * H + h] = dsv4_rmsnorm_row(qh, qh, NULL, (int)D, cf->eps);
      dsv4_rope_apply(&core->rope, qh, (int)D, l->pos[i], 0);
    }
    l->sc[i] = dsv4_rmsnorm_row(l->kv + i * D, l->c + i * D, dsv4_w(w, W_KV_NORM), (int)D, cf->eps);
    dsv4_rope_apply(&core->rope, l->kv + i * D, (int)D, l->pos[i], 0);
  }
  /* core: compressor, indexer, sparse attention, KL loss */
  DSV4_SLOT(l->o, l->slot[LS_O], n * H * D);
  dsv4_core_fwd_args ca = {.o = l->o, .topk_ids = topk_ids, .indexer_loss = indexer_loss, .q = l->q,
                           .kv = l->kv, .x = x, .qr = l->qr, .pk = pk, .n = n, .train = train};
  DSV4_TRY(dsv4_core_forward(core, &ca));
  /* step 8: inverse RoPE at the query position; step 9: grouped output projection */
  /* one group at a time through a [n, (H/G) D] buffer: the rotated output is never kept whole (the
   * backward rebuilds it from o) */
  DSV4_SLOT(l->u, l->slot[LS_U], n * G * Ro);
  DSV4_SLOT(og, l->slot[LS_T0], n * HGD);
  for (int64_t g = 0; g < G; g++) {
    rotated_group(l, og, g);
    PROJ(l->u + g * Ro, G * Ro, og, HGD, dsv4_w(w, W_WO_A) + g * Ro * HGD, Ro, HGD);
  }
  PROJ(out, d, l->u, G * Ro, dsv4_w(w, W_WO_B), d, G * Ro);
#undef PROJ
  for (int64_t i = 0; i < n; i++)
    if (!l->real[i]) memset(out + i * d, 0, sizeof(float) * (size_t)d);
  l->valid = train;
fail:
  if (rc != DSV4_OK || !train) saved_free(l);
  return rc;
}

dsv4_status dsv4_layer_backward(dsv4_layer *l, float *dx, dsv4_weights *grads, const float *dout,
                                float d_loss) {
  dsv4_status rc = DSV4_OK;
  const dsv4_config *cf = &l->cfg;
  const int64_t d = cf->dim, H = cf->n_heads, D = cf->head_dim, dq = cf->q_lora_rank;
  const int64_t G = cf->o_groups, Ro = cf->o_lora_rank, HGD = (H / G) * D, n = l->n;
  const dsv4_weights *w = l->w;
  const dsv4_kernels *K = dsv4_kernels_get(l->impl);
  float *g = NULL, *du = NULL, *dop = NULL, *dq_ = NULL, *dkv = NULL, *dqr = NULL;
  DSV4_CHECK(l->valid, DSV4_ERR_STATE, "layer backward called without a training forward (train = 1)");
  DSV4_CHECK(dx && grads && dout, DSV4_ERR_ARG, "layer backward: dx, grads and dout are required");
  DSV4_CHECK(dsv4_weights_layer(grads) == l->layer, DSV4_ERR_ARG,
             "layer backward: gradient set is for layer %d, not %d", dsv4_weights_layer(grads), l->layer);
  /* padding rows have no output, so their dout is ignored */
  DSV4_SLOTZ(g, l->slot[LS_T0], n * d);
  for (int64_t i = 0; i < n; i++)
    if (l->real[i]) memcpy(g + i * d, dout + i * d, sizeof(float) * (size_t)d);
  /* out = wo_b u;  u_g = wo_a[g] op_g */
  K->gemm_tn(d, G * Ro, n, 1.0f, g, d, l->u, G * Ro, 1.0f, dsv4_w(grads, W_WO_B), G * Ro);
  DSV4_SLOT(du, l->slot[LS_T1], n * G * Ro);
  K->gemm_nn(n, G * Ro, d, 1.0f, g, d, dsv4_w(w, W_WO_B), G * Ro, 0.0f, du, G * Ro);
  /* dop holds the rotated output op group by group; each group's columns serve dW first and are
   * then overwritten by that group's d op */
  DSV4_SLOT(dop, l->slot[LS_T2], n * H * D);
  for (int64_t gi = 0; gi < G; gi++) {
    float *x = dop + gi * HGD;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
      for (int64_t h = 0; h < H / G; h++) {
        float *v = x + i * H * D + h * D;
        memcpy(v, l->o + (i * H + gi * (H / G) + h) * D, sizeof(float) * (size_t)D);
        dsv4_rope_apply(&l->core->rope, v, (int)D, l->pos[i], 1);
      }
    K->gemm_tn(Ro, HGD, n, 1.0f, du + gi * Ro, G * Ro, x, H * D, 1.0f, dsv4_w(grads, W_WO_A) + gi * Ro * HGD, HGD);
    K->gemm_nn(n, HGD, Ro, 1.0f, du + gi * Ro, G * Ro, dsv4_w(w, W_WO_A) + gi * Ro * HGD, HGD, 0.0f, x, H * D);
  }
  /* op = RoPE_{-p}(o)  ->  d o = RoPE_{+p}(d op) */
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++)
    for (int64_t h = 0; h < H; h++) dsv4_rope_apply(&l->core->rope, dop + (i * H + h) * D, (int)D, l->pos[i], 0);
  dq_ = dop; /* the core writes dq over d o, query by query (allowed: dq may alias d_o) */
  DSV4_SLOT(dkv, l->slot[LS_T3], n * D);
  memset(dx, 0, sizeof(float) * (size_t)(n * d));
  dsv4_core_bwd_args cb = {.dq = dq_, .dkv = dkv, .dx = dx, .grads = grads, .d_o = dop, .d_loss = d_loss};
  DSV4_TRY(dsv4_core_backward(l->core, &cb));
  /* q = RoPE(s b) per head (RMSNorm without weight, s = 1/rms(b)); b is not kept. With y = s b and
   * dy = RoPE^T(dq), RMSNorm's backward dv = s dy - s^3 b (dy . b) / D becomes, using
   * b = RoPE^T(q) / s and that a rotation keeps dot products ((RoPE^T dq) . (RoPE^T q) = dq . q):
   *   db = s RoPE^T(dq - (dq . q / D) q)   -- one dot, one update, one inverse rotation.
   * kv = RoPE(RMSNorm_{kv_norm}(c)): d(normed kv) = RoPE^T(dkv). */
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    for (int64_t h = 0; h < H; h++) {
      float *dh = dq_ + (i * H + h) * D;
      const float *qh = l->q + (i * H + h) * D, s = l->sb[i * H + h];
      const float c = (float)(dsv4_dot_d(dh, qh, D) / (double)D);
      for (int64_t e = 0; e < D; e++) dh[e] = s * (dh[e] - c * qh[e]);
      dsv4_rope_apply(&l->core->rope, dh, (int)D, l->pos[i], 1);
    }
    dsv4_rope_apply(&l->core->rope, dkv + i * D, (int)D, l->pos[i], 1);
  }
  float *dkvn = dsv4_w(grads, W_KV_NORM);
  for (int64_t i = 0; i < n; i++) /* serial: accumulates into d kv_norm */
    dsv4_rmsnorm_bwd_row(dkv + i * D, dkvn, dkv + i * D, l->c + i * D, dsv4_w(w, W_KV_NORM), l->sc[i], (int)D);
  /* b = wq_b qr;  qr = RMSNorm_{q_norm}(a);  a = wq_a x;  c = wkv x */
  K->gemm_tn(H * D, dq, n, 1.0f, dq_, H * D, l->qr, dq, 1.0f, dsv4_w(grads, W_WQ_B), dq);
  DSV4_SLOT(dqr, l->slot[LS_T1], n * dq);
  K->gemm_nn(n, dq, H * D, 1.0f, dq_, H * D, dsv4_w(w, W_WQ_B), dq, 0.0f, dqr, dq);
  float *dqn = dsv4_w(grads, W_Q_NORM);
  for (int64_t i = 0; i < n; i++)
    dsv4_rmsnorm_bwd_row(dqr + i * dq, dqn, dqr + i * dq, l->a + i * dq, dsv4_w(w, W_Q_NORM), l->sa[i], (int)dq);
  K->gemm_tn(dq, d, n, 1.0f, dqr, dq, l->x, d, 1.0f, dsv4_w(grads, W_WQ_A), d);
  K->gemm_nn(n, d, dq, 1.0f, dqr, dq, dsv4_w(w, W_WQ_A), d, 1.0f, dx, d);
  K->gemm_tn(D, d, n, 1.0f, dkv, D, l->x, d, 1.0f, dsv4_w(grads, W_WKV), d);
  K->gemm_nn(n, d, D, 1.0f, dkv, D, dsv4_w(w, W_WKV), d, 1.0f, dx, d);
  for (int64_t i = 0; i < n; i++)
    if (!l->real[i]) memset(dx + i * d, 0, sizeof(float) * (size_t)d);
fail:
  return rc;
}
