/* layer.c: the attention layer around the core (docs/spec.md section 3 steps 1-2 and 8-9): q/kv
 * projections with their RMSNorms and RoPE, the core's stages, inverse RoPE and the grouped output
 * projection; and the backward of all of it. Positions, chunks and the RoPE table come from the
 * call's plan (plan/plan.h), so the same code runs on one rank and on a CP shard. What it keeps and
 * what it uses for one phase is carved from its two arenas (model/arenas.h). */
#include <stdlib.h>
#include <string.h>

#include "model/core.h"
#include "model/wgrad.h"
#include "model/weights.h"
#include "ops/rmsnorm.h"
#include "util/abi.h"
#include "util/err.h"
#include "util/gemm.h"
#include "util/par.h"
#include "util/reduce.h"

struct dsv4_layer {
  dsv4_config cfg;
  int layer;
  const dsv4_weights *w;
  dsv4_core *core;
  dsv4_impl impl;
  int threads;               /* OpenMP threads of its calls; 0: the caller's default */
  int recompute;             /* keep neither q nor o: rebuild them in the backward */
  /* the latest forward */
  int valid;                 /* a training forward completed: backward may run */
  const dsv4_plan *plan;     /* the core's plan of that forward */
  const float *x;
  dsv4_dims dm;
  dsv4_layer_saved sv;
  dsv4_arena saved, scratch;
  /* backward: where the rows of the weight products run at the end are kept (model/wgrad.h):
   * default mode q's and o's saved rows; with recomputation two n x H D buffers when they are
   * smaller than whole-weight sums (dsv4_wgrad_keep_rows), else NULL (the products go into sinks
   * chunk by chunk) */
  float *kq, *ko;
};

/* Forgets the saved activations (the arenas stay for the next call). */
static void forget(dsv4_layer *l) {
  l->valid = 0;
  l->plan = NULL;
  l->x = NULL;
}

dsv4_status dsv4_layer_create(dsv4_layer **out, const dsv4_config *cfg, int layer, const dsv4_weights *w) {
  dsv4_status rc = DSV4_OK;
  dsv4_layer *l = NULL;
  DSV4_CHECK(out, DSV4_ERR_ARG, "layer: NULL out");
  *out = NULL;
  DSV4_ALLOC(l, 1);
  DSV4_TRY(dsv4_config_in(&l->cfg, cfg));
  DSV4_TRY(dsv4_core_create(&l->core, &l->cfg, layer, w));
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
  dsv4_arena_free(&l->saved);
  dsv4_arena_free(&l->scratch);
  dsv4_core_free(l->core);
  free(l);
}

dsv4_core *dsv4_layer_core(dsv4_layer *l) { return l->core; }

size_t dsv4_layer_saved_bytes(const dsv4_layer *l) {
  if (!l || !l->valid) return 0;
  return l->saved.used + dsv4_core_saved_bytes(l->core);
}

void dsv4_layer_set_impl(dsv4_layer *l, dsv4_impl impl) {
  l->impl = impl;
  forget(l);
  dsv4_core_set_impl(l->core, impl);
}

dsv4_status dsv4_layer_set_threads(dsv4_layer *l, int threads) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(l, DSV4_ERR_ARG, "layer: NULL");
  DSV4_CHECK(threads >= 0, DSV4_ERR_ARG, "threads must be >= 0 (0: the caller's OpenMP default), got %d", threads);
  l->threads = threads;
  DSV4_TRY(dsv4_core_set_threads(l->core, threads));
fail:
  return rc;
}

dsv4_status dsv4_layer_set_recompute(dsv4_layer *l, int on) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(l, DSV4_ERR_ARG, "layer: NULL");
  forget(l); /* a forward of the other mode cannot be backpropagated */
  l->recompute = on != 0;
  dsv4_core_set_recompute(l->core, on);
fail:
  return rc;
}

/* Y rows [i0, i0 + m) = X rows . W^T in the global projection panels (util/gemm.h): a row's bits do
 * not depend on which rows are computed with it. */
static dsv4_status proj(const dsv4_layer *l, float *Y, int64_t ldy, const float *X, int64_t ldx, const float *W,
                        int64_t N, int64_t K, int64_t i0, int64_t m) {
  return dsv4_proj_rows(Y, ldy, X, ldx, W, m, N, K, l->plan->global + i0, l->plan->panel, l->impl);
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
      dsv4_rope_apply(&l->plan->rope, v, (int)D, l->plan->pos[i0 + i], 1);
    }
}

/* Step 1 for rows [i0, i0 + m): q = RoPE(RMSNorm(wq_b qr)) per head, and each head's inverse rms
 * (V4.1: no per-head norm, q = RoPE(wq_b qr), sb unused). */
static dsv4_status queries(const dsv4_layer *l, float *q, float *sb, int64_t i0, int64_t m) {
  dsv4_status rc = DSV4_OK;
  const int64_t H = l->cfg.n_heads, D = l->cfg.head_dim, dq = l->cfg.q_lora_rank;
  const int head_norm = l->dm.head_norm;
  DSV4_TRY(proj(l, q, H * D, l->sv.qr + i0 * dq, dq, dsv4_w(l->w, W_WQ_B), H * D, dq, i0, m));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; i++)
    for (int64_t h = 0; h < H; h++) {
      float *qh = q + (i * H + h) * D;
      if (head_norm) sb[i * H + h] = dsv4_rmsnorm_row(qh, qh, NULL, (int)D, l->cfg.eps);
      dsv4_rope_apply(&l->plan->rope, qh, (int)D, l->plan->pos[i0 + i], 0);
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
    DSV4_TRY(proj(l, l->sv.u + i0 * G * Ro + g * Ro, G * Ro, og, HGD, dsv4_w(l->w, W_WO_A) + g * Ro * HGD, Ro, HGD, i0,
                  m));
  }
  DSV4_TRY(proj(l, out + i0 * d, d, l->sv.u + i0 * G * Ro, G * Ro, dsv4_w(l->w, W_WO_B), d, G * Ro, i0, m));
fail:
  return rc;
}

static dsv4_status layer_forward(dsv4_layer *l, float *out, int32_t *topk_ids, float *indexer_loss, const float *x,
                                 int64_t n, const dsv4_packing *pk, int train, dsv4_shared *shared) {
  dsv4_status rc = DSV4_OK;
  const dsv4_config *cf = &l->cfg;
  const int64_t d = cf->dim, D = cf->head_dim, dq = cf->q_lora_rank;
  const dsv4_weights *w = l->w;
  dsv4_core *core = l->core;
  dsv4_layer_fwd_scratch fs;
  forget(l);
  DSV4_CHECK(out && x && pk, DSV4_ERR_ARG, "layer forward: out, x and pk are required");
  DSV4_TRY(dsv4_core_prepare(core, pk, n, &l->plan));
  const dsv4_plan *p = l->plan;
  l->x = x;
  dsv4_dims_of(&l->dm, cf, &core->info, p, l->recompute, l->impl);
  DSV4_TRY(dsv4_arena_reserve(&l->saved, dsv4_carve_layer_saved(NULL, &l->dm, &l->sv), "layer's saved activations"));
  dsv4_carve_layer_saved(l->saved.base, &l->dm, &l->sv);
  DSV4_TRY(dsv4_arena_reserve(&l->scratch, dsv4_layer_scratch_bytes(&l->dm), "layer's scratch"));
  dsv4_carve_layer_fwd(l->scratch.base, &l->dm, &fs);
  const dsv4_layer_saved *sv = &l->sv;
  /* step 1: qr = RMSNorm_{q_norm}(wq_a x) */
  DSV4_TRY(dsv4_proj_rows(sv->a, dq, x, d, dsv4_w(w, W_WQ_A), n, dq, d, p->global, p->panel, l->impl));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++)
    sv->sa[i] = dsv4_rmsnorm_row(sv->qr + i * dq, sv->a + i * dq, dsv4_w(w, W_Q_NORM), (int)dq, cf->eps);
  /* step 2: kv = RoPE(RMSNorm_{kv_norm}(wkv x)) */
  DSV4_TRY(dsv4_proj_rows(sv->c, D, x, d, dsv4_w(w, W_WKV), n, D, d, p->global, p->panel, l->impl));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    sv->sc[i] = dsv4_rmsnorm_row(sv->kv + i * D, sv->c + i * D, dsv4_w(w, W_KV_NORM), (int)D, cf->eps);
    dsv4_rope_apply(&p->rope, sv->kv + i * D, (int)D, p->pos[i], 0);
  }
  /* the core: Stage 1 starts (its all-gathers overlap the query projection), then the queries in
   * chunks. Default: one chunk, q and o kept whole for the backward. Recomputation: the plan's
   * chunks, q and o of one chunk at a time (the backward rebuilds them). */
  const dsv4_core_begin_args ca = {.q = sv->q, .o = sv->o, .kv = sv->kv, .x = x, .qr = sv->qr, .topk_ids = topk_ids,
                                   .train = train, .shared = shared};
  DSV4_TRY(dsv4_core_fwd_begin(core, &ca));
  const int64_t n_chunk = l->recompute ? p->n_chunk : (n > 0);
  for (int64_t k = 0; k < n_chunk; k++) {
    const int64_t i0 = l->recompute ? p->chunk[k] : 0, i1 = l->recompute ? p->chunk[k + 1] : n;
    float *q = l->recompute ? fs.q : sv->q, *o = l->recompute ? fs.o : sv->o, *sb = l->recompute ? fs.sb : sv->sb;
    DSV4_TRY(queries(l, q, sb, i0, i1 - i0));
    DSV4_TRY(dsv4_core_fwd_rows(core, i0, i1 - i0, q, o));
    DSV4_TRY(output_rows(l, out, o, fs.og, i0, i1 - i0));
  }
  DSV4_TRY(dsv4_core_fwd_end(core, indexer_loss, train));
  for (int64_t i = 0; i < n; i++)
    if (!p->real[i]) memset(out + i * d, 0, sizeof(float) * (size_t)d);
  l->valid = train;
fail:
  if (rc != DSV4_OK) dsv4_core_fail(core);
  if (rc != DSV4_OK || !train) forget(l);
  return rc;
}

/* The output projection's backward for rows [i0, i0 + m) (steps 9 and 8): d u (kept for wo_a's
 * weight gradient, or with recomputation added to its sinks here; du_ready: already in u's rows,
 * output_du_all) and d o [m, H, D] (written into dop) for the core. */
static dsv4_status output_backward(dsv4_layer *l, dsv4_weights *grads, const float *dout, const float *o,
                                   const dsv4_layer_bwd_scratch *bs, dsv4_wsinks *ks, int64_t i0, int64_t m,
                                   int du_ready) {
  dsv4_status rc = DSV4_OK;
  const dsv4_config *cf = &l->cfg;
  const int64_t d = cf->dim, H = cf->n_heads, D = cf->head_dim, G = cf->o_groups, Ro = cf->o_lora_rank;
  const int64_t HGD = (H / G) * D;
  const dsv4_weights *w = l->w;
  const dsv4_plan *p = l->plan;
  const int64_t *glob = p->global + i0, P = p->panel;
  float *g = bs->g, *dop = bs->dop;
  /* du: into u's rows (wo_b's product is done, u is dead) for wo_a's product at the end; with
   * recomputation o is not kept, so wo_a's product goes into its sinks chunk by chunk */
  float *du = l->ko ? l->sv.u + i0 * G * Ro : bs->du;
  if (!du_ready) {
    /* padding rows have no output, so their dout is ignored */
    for (int64_t i = 0; i < m; i++) {
      if (p->real[i0 + i]) memcpy(g + i * d, dout + (i0 + i) * d, sizeof(float) * (size_t)d);
      else memset(g + i * d, 0, sizeof(float) * (size_t)d);
    }
    /* out = wo_b u;  u_g = wo_a[g] op_g (wo_b's gradient: layer_backward, before the chunks) */
    DSV4_TRY(dsv4_rows_nn(du, G * Ro, g, d, dsv4_w(w, W_WO_B), G * Ro, m, G * Ro, d, glob, P, 0, l->impl));
  }
  /* dop holds the rotated output op group by group; each group's columns serve dW first and are
   * then overwritten by that group's d op */
  for (int64_t gi = 0; gi < G; gi++) {
    float *x = dop + gi * HGD;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; i++)
      for (int64_t h = 0; h < H / G; h++) {
        float *v = x + i * H * D + h * D;
        memcpy(v, o + (i * H + gi * (H / G) + h) * D, sizeof(float) * (size_t)D);
        dsv4_rope_apply(&p->rope, v, (int)D, p->pos[i0 + i], 1);
      }
    if (!l->ko) {
      const dsv4_wpiece pc = {.n = m, .A = du + gi * Ro, .lda = G * Ro, .B = x, .ldb = H * D, .glob = glob};
      DSV4_TRY(dsv4_wsinks_product(ks, dsv4_w(grads, W_WO_A) + gi * Ro * HGD, &pc));
    } else if (l->recompute) { /* the rotated rows kept for wo_a's product (default mode: o itself) */
      for (int64_t i = 0; i < m; i++)
        memcpy(l->ko + (i0 + i) * H * D + gi * HGD, x + i * H * D, sizeof(float) * (size_t)HGD);
    }
    DSV4_TRY(dsv4_rows_nn(x, H * D, du + gi * Ro, G * Ro, dsv4_w(w, W_WO_A) + gi * Ro * HGD, HGD, m, HGD, Ro, glob, P,
                          0, l->impl));
  }
  /* op = RoPE_{-p}(o)  ->  d o = RoPE_{+p}(d op) */
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; i++)
    for (int64_t h = 0; h < H; h++) dsv4_rope_apply(&p->rope, dop + (i * H + h) * D, (int)D, p->pos[i0 + i], 0);
fail:
  return rc;
}

/* The query path's backward for rows [i0, i0 + m), from dq (the core's, over dop): q = RoPE(s b)
 * per head (RMSNorm without weight, s = 1/rms(b)); b is not kept. With y = s b and dy = RoPE^T(dq),
 * RMSNorm's backward dv = s dy - s^3 b (dy . b) / D becomes, using b = RoPE^T(q) / s and that a
 * rotation keeps dot products ((RoPE^T dq) . (RoPE^T q) = dq . q):
 *   db = s RoPE^T(dq - (dq . q / D) q)   -- one dot, one update, one inverse rotation.
 * (V4.1: no norm, db = RoPE^T(dq).) db is written over dq, added to wq_b's sinks (recomputation)
 * or kept in q's rows (default mode) for wq_b's product at the end. */
static dsv4_status query_backward_db(dsv4_layer *l, dsv4_weights *grads, float *dq_, const float *q, const float *sb,
                                     dsv4_wsinks *ks, int64_t i0, int64_t m) {
  dsv4_status rc = DSV4_OK;
  const dsv4_config *cf = &l->cfg;
  const int64_t H = cf->n_heads, D = cf->head_dim, dq = cf->q_lora_rank;
  const dsv4_plan *p = l->plan;
  const int head_norm = l->dm.head_norm;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; i++)
    for (int64_t h = 0; h < H; h++) {
      float *dh = dq_ + (i * H + h) * D;
      if (head_norm) {
        const float *qh = q + (i * H + h) * D, s = sb[i * H + h];
        const float c = (float)(dsv4_dot_d(dh, qh, D) / (double)D);
        for (int64_t e = 0; e < D; e++) dh[e] = s * (dh[e] - c * qh[e]);
      }
      dsv4_rope_apply(&p->rope, dh, (int)D, p->pos[i0 + i], 1);
    }
  if (!l->kq) {
    const dsv4_wpiece pc = {.n = m, .A = dq_, .lda = H * D, .B = l->sv.qr + i0 * dq, .ldb = dq, .glob = p->global + i0};
    DSV4_TRY(dsv4_wsinks_product(ks, dsv4_w(grads, W_WQ_B), &pc));
  }
  /* dq kept (default mode: in q's rows, dead now) for wq_b's product at the end */
  if (l->kq) memcpy(l->kq + i0 * H * D, dq_, sizeof(float) * (size_t)(m * H * D));
fail:
  return rc;
}

/* The rest of the query path's backward for rows [i0, i0 + m), from their db (rows of H D, over dq):
 * b = wq_b qr, qr = RMSNorm_{q_norm}(a), a = wq_a x: d qr (into dqr, then a's rows), q_norm's terms
 * and the dx rows. Rows of several chunks at once where db is kept (default mode): their products
 * then share calls (util/gemm.h: merged panels, the same bits as one chunk at a time). */
static dsv4_status query_backward_rows(dsv4_layer *l, dsv4_weights *grads, const float *db, float *dqr, float *dx,
                                       float *t, dsv4_wsinks *ks, int64_t i0, int64_t m) {
  dsv4_status rc = DSV4_OK;
  const dsv4_config *cf = &l->cfg;
  const int64_t d = cf->dim, H = cf->n_heads, D = cf->head_dim, dq = cf->q_lora_rank;
  const dsv4_weights *w = l->w;
  const dsv4_plan *p = l->plan;
  const int64_t *glob = p->global + i0, P = p->panel;
  DSV4_TRY(dsv4_rows_nn(dqr, dq, db, H * D, dsv4_w(w, W_WQ_B), dq, m, dq, H * D, glob, P, 0, l->impl));
  float *dqn = dsv4_w(grads, W_Q_NORM);
  for (int64_t i = 0; i < m; i++) { /* serial: d q_norm's terms in row order (exact sums) */
    memset(t, 0, sizeof(float) * (size_t)dq);
    dsv4_rmsnorm_bwd_row(dqr + i * dq, t, dqr + i * dq, l->sv.a + (i0 + i) * dq, dsv4_w(w, W_Q_NORM),
                         l->sv.sa[i0 + i], (int)dq);
    DSV4_TRY(dsv4_wsinks_terms(ks, dqn, t, dq));
  }
  /* d qr into a's rows (dead now) for wq_a's product at the end */
  memcpy(l->sv.a + i0 * dq, dqr, sizeof(float) * (size_t)(m * dq));
  DSV4_TRY(dsv4_rows_nn(dx + i0 * d, d, dqr, dq, dsv4_w(w, W_WQ_A), d, m, d, dq, glob, P, 1, l->impl));
fail:
  return rc;
}

/* Default mode's products over many rows (no recomputation: u's rows and dq are kept whole). d u =
 * dout wo_b for every row at once, into u's rows once wo_b's gradient has read them; padding rows
 * have no output: their d u is zero, as a zero dout row gives (a zero row of a product is +0). */
static dsv4_status output_du_all(dsv4_layer *l, const float *dout) {
  dsv4_status rc = DSV4_OK;
  const dsv4_config *cf = &l->cfg;
  const int64_t d = cf->dim, GRo = cf->o_groups * cf->o_lora_rank;
  const dsv4_plan *p = l->plan;
  float *du = l->sv.u;
  DSV4_TRY(dsv4_rows_nn(du, GRo, dout, d, dsv4_w(l->w, W_WO_B), GRo, p->n, GRo, d, p->global, p->panel, 0, l->impl));
  for (int64_t i = 0; i < p->n; i++)
    if (!p->real[i]) memset(du + i * GRo, 0, sizeof(float) * (size_t)GRo);
fail:
  return rc;
}

/* ... and the query path's rows after the chunks, in stretches of whole chunks whose d qr fits the
 * chunk's d o scratch (dead now; at V4-Flash sizes it holds 16 chunks' d qr). */
static dsv4_status query_rows_all(dsv4_layer *l, dsv4_weights *grads, float *scratch, int64_t cap, float *dx,
                                  float *t, dsv4_wsinks *ks) {
  dsv4_status rc = DSV4_OK;
  const dsv4_plan *p = l->plan;
  const int64_t HD = l->cfg.n_heads * l->cfg.head_dim;
  for (int64_t k = 0; k < p->n_chunk;) {
    int64_t e = k + 1;
    while (e < p->n_chunk && p->chunk[e + 1] - p->chunk[k] <= cap) e++;
    const int64_t i0 = p->chunk[k], m = p->chunk[e] - i0;
    DSV4_TRY(query_backward_rows(l, grads, l->kq + i0 * HD, scratch, dx, t, ks, i0, m));
    k = e;
  }
fail:
  return rc;
}

/* The layer's gradients summed over calls: q_norm's and kv_norm's terms, and with recomputation
 * (no q, o kept) the wo_a groups' and wq_b's products chunk by chunk (model/wgrad.h). */
static dsv4_status layer_sinks(dsv4_layer *l, dsv4_weights *grads, dsv4_wsinks *ks) {
  dsv4_status rc = DSV4_OK;
  const dsv4_config *cf = &l->cfg;
  const int64_t H = cf->n_heads, D = cf->head_dim, G = cf->o_groups, Ro = cf->o_lora_rank, dq = cf->q_lora_rank;
  const int64_t HGD = (H / G) * D, P = l->plan->panel, T = l->plan->key.T;
  DSV4_TRY(dsv4_wsinks_add(ks, dsv4_w(grads, W_Q_NORM), dq, dq, NULL, 0));
  DSV4_TRY(dsv4_wsinks_add(ks, dsv4_w(grads, W_KV_NORM), D, D, NULL, 0));
  if (!l->kq) {
    /* wo_b's, wq_a's and wkv's products wait for the sums' finish (their rows u, a, x and d kv stay
     * whole here: d u is chunk scratch, d qr goes into a's rows, d kv into its own), so a fresh
     * backward's zero wo_b, wq_a and wkv gradients hold these sinks' low halves meanwhile */
    dsv4_wsinks_lend(ks, dsv4_w(grads, W_WO_B), cf->dim * G * Ro);
    dsv4_wsinks_lend(ks, dsv4_w(grads, W_WQ_A), dq * cf->dim);
    dsv4_wsinks_lend(ks, dsv4_w(grads, W_WKV), D * cf->dim);
    const dsv4_wshape so = {Ro, HGD, P, T}, sq = {H * D, dq, P, T};
    for (int64_t gi = 0; gi < G; gi++) DSV4_TRY(dsv4_wsinks_add_product(ks, dsv4_w(grads, W_WO_A) + gi * Ro * HGD, &so));
    DSV4_TRY(dsv4_wsinks_add_product(ks, dsv4_w(grads, W_WQ_B), &sq));
  }
fail:
  return rc;
}

/* Collective: a product over every local row into C (model/wgrad.h). */
static dsv4_status wprod(dsv4_layer *l, float *C, int64_t M, int64_t N, const float *A, int64_t lda, const float *B,
                         int64_t ldb, const uint8_t *keep, const char *what) {
  const dsv4_plan *p = l->plan;
  const dsv4_wpiece pc = {.n = p->n, .A = A, .lda = lda, .B = B, .ldb = ldb, .glob = p->global, .keep = keep};
  const dsv4_wshape ws = {M, N, p->panel, p->key.T};
  return dsv4_wgrad_exact(&l->core->xfer, &ws, &pc, 1, C, l->impl, what);
}

static dsv4_status layer_backward(dsv4_layer *l, float *dx, dsv4_weights *grads, const float *dout, float d_loss) {
  dsv4_status rc = DSV4_OK;
  const dsv4_config *cf = &l->cfg;
  const int64_t d = cf->dim, H = cf->n_heads, D = cf->head_dim, G = cf->o_groups, Ro = cf->o_lora_rank;
  const int64_t dq = cf->q_lora_rank, HGD = (H / G) * D;
  const dsv4_weights *w = l->w;
  dsv4_core *core = l->core;
  dsv4_layer_bwd_scratch bs;
  float *t = NULL;
  int begun = 0, consumed = 0;
  DSV4_CHECK(l->valid, DSV4_ERR_STATE,
             "layer %d backward called without a training forward (train = 1), or a second time for one forward",
             l->layer);
  DSV4_CHECK(dx && grads && dout, DSV4_ERR_ARG, "layer backward: dx, grads and dout are required");
  DSV4_CHECK(dsv4_weights_layer(grads) == l->layer, DSV4_ERR_ARG,
             "layer backward: gradient set is for layer %d, not %d", dsv4_weights_layer(grads), l->layer);
  const dsv4_plan *p = l->plan;
  const int64_t n = p->n;
  dsv4_carve_layer_bwd(l->scratch.base, &l->dm, &bs); /* the forward reserved the larger phase */
  memset(dx, 0, sizeof(float) * (size_t)(n * d));
  DSV4_ALLOC(t, dq > D ? dq : D);
  l->kq = l->recompute ? NULL : l->sv.q;
  l->ko = l->recompute ? NULL : l->sv.o;
  const int keep = l->recompute && dsv4_wgrad_keep_rows(cf, l->dm.selects, n, p->partial_max);
  if (keep) {
    DSV4_ALLOC(l->kq, n * H * D);
    DSV4_ALLOC(l->ko, n * H * D);
  }
  core->run.keep_rows = keep;
  DSV4_TRY(dsv4_core_bwd_begin(core, grads, d_loss));
  begun = consumed = 1;
  dsv4_wsinks *ks = &core->run.sinks;
  DSV4_TRY(layer_sinks(l, grads, ks));
  /* The backward consumes the forward's saved rows: u, a and (default mode) q, o, the indexer
   * queries keep the output gradients of the weight products that run over every row at the end.
   * wo_b's first, while u is still u (its dout rows are the caller's: padding rows count as zero);
   * recomputed with sums (u stays u) wo_b's, wq_a's and wkv's after the sums' finish, their
   * tensors lent to them meanwhile. */
  const int wo_b_last = !l->kq;
  if (!wo_b_last) DSV4_TRY(wprod(l, dsv4_w(grads, W_WO_B), d, G * Ro, dout, d, l->sv.u, G * Ro, p->real, "wo_b"));
  /* Default mode: d u and the query path's rows over many chunks at once (output_du_all,
   * query_rows_all), which the chunks' row products give bit for bit; the d qr of a stretch lives
   * in the chunk's d o scratch, dead after the chunks */
  const int64_t stretch = l->dm.m * H * D / dq;
  const int many = !l->recompute && stretch >= l->dm.m;
  if (many) DSV4_TRY(output_du_all(l, dout));
  /* the same chunks with or without recomputation, so both give the same bits (plan.h) */
  for (int64_t k = 0; k < p->n_chunk; k++) {
    const int64_t i0 = p->chunk[k], m = p->chunk[k + 1] - i0;
    const float *q = l->recompute ? bs.q : l->sv.q + i0 * H * D, *o = l->recompute ? bs.o : l->sv.o + i0 * H * D;
    const float *sb = l->recompute ? bs.sb : l->sv.sb ? l->sv.sb + i0 * H : NULL;
    if (l->recompute) { /* the chunk's q and o again, bitwise the forward's */
      DSV4_TRY(queries(l, bs.q, bs.sb, i0, m));
      DSV4_TRY(dsv4_core_bwd_recompute(core, i0, m, bs.q, bs.o));
    }
    DSV4_TRY(output_backward(l, grads, dout, o, &bs, ks, i0, m, many));
    /* the core writes dq over d o, query by query (allowed: dq may alias d_o) */
    DSV4_TRY(dsv4_core_bwd_rows(core, i0, m, q, o, bs.dop, bs.dop));
    DSV4_TRY(query_backward_db(l, grads, bs.dop, q, sb, ks, i0, m));
    if (!many) DSV4_TRY(query_backward_rows(l, grads, bs.dop, bs.dqr, dx, t, ks, i0, m));
  }
  /* (before the core's end: every row's first dx term is still wq_a's, as one chunk at a time) */
  if (many) DSV4_TRY(query_rows_all(l, grads, bs.dop, stretch, dx, t, ks));
  /* kv = RoPE(RMSNorm_{kv_norm}(c)), c = wkv x: once every query (and other ranks' halos) added to dkv */
  float *dkv = bs.dkv;
  DSV4_TRY(dsv4_core_bwd_end(core, dkv, dx));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) dsv4_rope_apply(&p->rope, dkv + i * D, (int)D, p->pos[i], 1);
  float *dkvn = dsv4_w(grads, W_KV_NORM);
  for (int64_t i = 0; i < n; i++) { /* serial: d kv_norm's terms in row order (exact sums) */
    memset(t, 0, sizeof(float) * (size_t)D);
    dsv4_rmsnorm_bwd_row(dkv + i * D, t, dkv + i * D, l->sv.c + i * D, dsv4_w(w, W_KV_NORM), l->sv.sc[i], (int)D);
    DSV4_TRY(dsv4_wsinks_terms(ks, dkvn, t, D));
  }
  if (!wo_b_last) DSV4_TRY(wprod(l, dsv4_w(grads, W_WKV), D, d, dkv, D, l->x, d, NULL, "wkv"));
  DSV4_TRY(dsv4_rows_nn(dx, d, dkv, D, dsv4_w(w, W_WKV), d, n, d, D, p->global, p->panel, 1, l->impl));
  /* the last row product: the cached panel scratch (up to P (N + K) floats per thread, 66 MB for a
   * zigzag rank's partial wq_b panels) goes back before the weight gradients, whose partial panels'
   * gathered rows would otherwise come on top of it at the backward's peak */
  dsv4_panel_scratch_release();
  if (!wo_b_last) DSV4_TRY(wprod(l, dsv4_w(grads, W_WQ_A), dq, d, l->sv.a, dq, l->x, d, NULL, "wq_a"));
  if (l->kq) {
    if (!l->recompute) { /* o rotated back in place: op = RoPE_{-p}(o), wo_a's input */
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < H; h++) dsv4_rope_apply(&p->rope, l->ko + (i * H + h) * D, (int)D, p->pos[i], 1);
    }
    for (int64_t gi = 0; gi < G; gi++)
      DSV4_TRY(wprod(l, dsv4_w(grads, W_WO_A) + gi * Ro * HGD, Ro, HGD, l->sv.u + gi * Ro, G * Ro, l->ko + gi * HGD,
                     H * D, NULL, "wo_a"));
    DSV4_TRY(wprod(l, dsv4_w(grads, W_WQ_B), H * D, dq, l->kq, H * D, l->sv.qr, dq, NULL, "wq_b"));
  }
  for (int64_t i = 0; i < n; i++)
    if (!p->real[i]) memset(dx + i * d, 0, sizeof(float) * (size_t)d);
  begun = 0;
  DSV4_TRY(dsv4_core_bwd_finish(core));
  if (wo_b_last) {
    DSV4_TRY(wprod(l, dsv4_w(grads, W_WO_B), d, G * Ro, dout, d, l->sv.u, G * Ro, p->real, "wo_b"));
    DSV4_TRY(wprod(l, dsv4_w(grads, W_WQ_A), dq, d, l->sv.a, dq, l->x, d, NULL, "wq_a"));
    DSV4_TRY(wprod(l, dsv4_w(grads, W_WKV), D, d, dkv, D, l->x, d, NULL, "wkv"));
  }
fail:
  if (begun) dsv4_core_bwd_abort(core);
  if (consumed) l->valid = 0; /* the saved rows now hold gradients */
  if (l->recompute) free(l->kq), free(l->ko);
  l->kq = l->ko = NULL;
  free(t);
  return rc;
}

dsv4_status dsv4_layer_forward(dsv4_layer *l, const dsv4_layer_fwd_args *args) {
  dsv4_status rc = DSV4_OK;
  dsv4_layer_fwd_args a;
  dsv4_packing pk;
  DSV4_CHECK(l, DSV4_ERR_ARG, "layer forward: NULL layer");
  DSV4_TRY(DSV4_STRUCT_IN(&a, args, dsv4_layer_fwd_args, NULL));
  DSV4_TRY(DSV4_STRUCT_IN(&pk, a.pk, dsv4_packing, NULL));
  const int old = dsv4_threads_enter(l->threads);
  rc = layer_forward(l, a.out, a.topk_ids, a.indexer_loss, a.x, a.n, &pk, a.train, a.shared);
  dsv4_panel_scratch_release();
  dsv4_threads_leave(old);
fail:
  return rc;
}

dsv4_status dsv4_layer_backward(dsv4_layer *l, const dsv4_layer_bwd_args *args) {
  static const dsv4_layer_bwd_args defaults = DSV4_LAYER_BWD_ARGS_INIT;
  dsv4_status rc = DSV4_OK;
  dsv4_layer_bwd_args a;
  DSV4_CHECK(l, DSV4_ERR_ARG, "layer backward: NULL layer");
  DSV4_TRY(DSV4_STRUCT_IN(&a, args, dsv4_layer_bwd_args, &defaults));
  const int old = dsv4_threads_enter(l->threads);
  rc = layer_backward(l, a.dx, a.grads, a.dout, a.d_loss);
  dsv4_panel_scratch_release();
  dsv4_threads_leave(old);
fail:
  return rc;
}
