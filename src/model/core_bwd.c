/* core_bwd.c: the core attention backward, chunk by chunk of local queries (the plan's chunks), then
 * once for what every query shares; every forward message is mirrored:
 *   per chunk: (recomputation: the chunk's attention output again, bitwise the forward's, and its
 *              indexer queries) attention backward -> dq, d kv_ext (incl. halo rows), d cmp, d sink;
 *              KL loss gradients (indexer only; its inputs are detached) -> d indexer queries and
 *              weights -> their projections' weight gradients; d KI
 *   end:       window halo rows' gradients go back to their owners and are added there (window.c);
 *              Stage 1 backward of each compressor (stage1.c).
 * V4.1: a consumer adds its gradients of the compressed kv and keys to its kv source's sums in the
 * shared state; the source's backward, which must come after every consumer's, runs Stage 1's
 * backward once on the sums (connect_sums checks the order). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "model/weights.h"
#include "util/err.h"
#include "util/xacc.h"
#include "util/xrows.h"

static dsv4_stage_env env_of(dsv4_core *c) {
  return (dsv4_stage_env){&c->cfg, c->w, c->impl, &c->plan, &c->xfer};
}

static const float *ori_kv(const dsv4_core *c) { return c->plan.lay.ext_kv ? c->run.sv.kv_ext : c->run.kv; }

/* V4.1: the kv source's sums this backward adds to; the order checks of the pass. */
static dsv4_status connect_sums(dsv4_core *c) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  dsv4_shared_kv *e = st->kv_e;
  const int L = c->layer, S = c->info.kv_source;
  DSV4_CHECK(st->sh->gen == st->sh_gen && e->active, DSV4_ERR_STATE,
             "layer %d backward: the shared state of its forward pass was reset since", L);
  DSV4_CHECK(!e->bwd_done, DSV4_ERR_STATE,
             "layer %d backward after its kv source layer %d's: run the backward in reverse layer order", L, S);
  if (c->info.role == DSV4_ROLE_FULL) {
    for (int j = 0; j < DSV4_MAX_LAYERS; j++)
      DSV4_CHECK(!e->reader[j] || e->done[j], DSV4_ERR_STATE,
                 "layer %d backward before layer %d's, which reads its compressed kv: run the backward in reverse "
                 "layer order", L, j);
  } else {
    DSV4_CHECK(e->reader[L] && !e->done[L], DSV4_ERR_STATE, "layer %d backward: %s", L,
               e->done[L] ? "it already ran (or was skipped) for this forward pass"
                          : "no training forward in this pass");
  }
  DSV4_TRY(dsv4_shared_kv_sums(e));
  st->d_KI = e->d_KI;
fail:
  return rc;
}

static dsv4_status begin_sinks(dsv4_core *c);
static void free_kept(dsv4_core_run *st);

dsv4_status dsv4_core_bwd_begin(dsv4_core *c, dsv4_weights *grads, float d_loss) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const dsv4_dims *dm = &st->dm;
  DSV4_CHECK(st->valid, DSV4_ERR_STATE, "core backward called without a training forward (train = 1)");
  DSV4_CHECK(grads, DSV4_ERR_ARG, "core backward: grads is required");
  if (st->kv_e) DSV4_TRY(connect_sums(c));
  st->grads = grads;
  st->d_loss = d_loss;
  dsv4_carve_core_bwd(c->scratch.base, dm, &st->bs); /* the forward reserved the larger phase */
  const size_t X = 2 * sizeof(int64_t) * (size_t)dm->D; /* one exact row */
  memset(st->bs.x_ext, 0, X * (size_t)(dm->nt * dm->R_kv));
  if (st->bs.d_ext) memset(st->bs.d_ext, 0, sizeof(float) * (size_t)(dm->R_kv * dm->D));
  if (c->ratio > 0) {
    memset(st->bs.x_cmp, 0, X * (size_t)dm->n_cmp);
    memset(st->bs.x_lock, 0, (size_t)dm->n_cmp);
    if (st->bs.d_cmp) memset(st->bs.d_cmp, 0, sizeof(float) * (size_t)(dm->n_cmp * dm->D));
  }
  if (dm->own_cmp) {
    st->d_KI = st->bs.d_KI;
    if (dm->v4_keys) memset(st->d_KI, 0, sizeof(float) * (size_t)(dm->n_cmp * dm->Di));
  }
  DSV4_TRY(begin_sinks(c));
fail:
  return rc;
}

/* The gradients summed over calls, kept exact until dsv4_core_bwd_finish (model/wgrad.h): the
 * vector ones every operator adds into, the indexer keys' gradients (a local sum, read by Stage 1's
 * backward), and with recomputation the indexer queries' projections (their rows are not kept). */
static dsv4_status begin_sinks(dsv4_core *c) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const dsv4_dims *dm = &st->dm;
  const dsv4_config *cf = &c->cfg;
  dsv4_weights *g = st->grads;
  dsv4_wsinks *ks = &st->sinks;
  const int64_t D = cf->head_dim, Di = cf->index_head_dim, H = cf->n_heads;
  snprintf(st->sink_what, sizeof st->sink_what, "layer %d backward", c->layer);
  dsv4_wsinks_begin(ks, c->impl, st->sink_what);
  if (!c->xfer.comm || c->xfer.comm->size == 1) dsv4_wsinks_last_rows(ks, dm->n);
  DSV4_TRY(dsv4_wsinks_add(ks, dsv4_w(g, W_SINK), H, H, NULL, 0));
  if (dm->compresses) {
    const int64_t cD = (c->ratio == 4 ? 2 : 1) * D;
    if (!cf->v41) DSV4_TRY(dsv4_wsinks_add(ks, dsv4_w(g, W_C_APE), c->ratio * cD, D, NULL, 0));
    DSV4_TRY(dsv4_wsinks_add(ks, dsv4_w(g, W_C_NORM), D, D, NULL, 0));
  }
  if (dm->v4_keys) {
    DSV4_TRY(dsv4_wsinks_add(ks, dsv4_w(g, W_I_APE), 4 * 2 * Di, Di, NULL, 0));
    DSV4_TRY(dsv4_wsinks_add(ks, dsv4_w(g, W_I_NORM), Di, Di, NULL, 0));
  }
  if (dm->v41_keys) DSV4_TRY(dsv4_wsinks_add(ks, dsv4_w(g, W_I_KNORM), Di, Di, NULL, 0));
  st->d_KI_sum = NULL;
  if (st->d_KI && (dm->v4_keys || dm->v41_keys || dm->selects)) {
    DSV4_TRY(dsv4_wsinks_add(ks, st->d_KI, dm->n_cmp * Di, Di, st->kv_e ? st->kv_e->x_KI : NULL, 1));
    st->d_KI_sum = dsv4_wsinks_of(ks, st->d_KI);
  }
  if (dm->selects && c->recompute && st->keep_rows) {
    DSV4_ALLOC(st->kqI, dm->n * (int64_t)cf->index_n_heads * Di);
    DSV4_ALLOC(st->kwI, dm->n * (int64_t)cf->index_n_heads);
  }
  if (dm->selects && c->recompute && !st->keep_rows) {
    const int64_t Hi = cf->index_n_heads, P = c->plan.panel, T = c->plan.key.T;
    const dsv4_wshape sq = {(int64_t)Hi * Di, cf->q_lora_rank, P, T}, sw = {Hi, cf->dim, P, T};
    DSV4_TRY(dsv4_wsinks_add_product(ks, dsv4_w(g, W_I_WQ_B), &sq));
    DSV4_TRY(dsv4_wsinks_add_product(ks, dsv4_w(g, W_I_PROJ), &sw));
  }
fail:
  if (rc != DSV4_OK) dsv4_wsinks_drop(ks), free_kept(st);
  return rc;
}

static void free_kept(dsv4_core_run *st) {
  free(st->kqI), free(st->kwI);
  st->kqI = st->kwI = NULL;
  st->keep_rows = 0;
}

dsv4_status dsv4_core_bwd_finish(dsv4_core *c) {
  free_kept(&c->run);
  return dsv4_wsinks_finish(&c->run.sinks, &c->xfer);
}

void dsv4_core_bwd_abort(dsv4_core *c) {
  dsv4_offload_drain(c);
  free_kept(&c->run);
  dsv4_wsinks_drop(&c->run.sinks);
}

/* The chunk's attention output from its queries, with the forward's kernels on the forward's saved
 * inputs (window rows, compressed kv, top-k): every query is computed alone, so this is bitwise the
 * forward's output. The KL teacher is not recomputed (it was kept); the indexer queries are. */
dsv4_status dsv4_core_bwd_recompute(dsv4_core *c, int64_t i0, int64_t n, const float *q, float *o) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const dsv4_stage_env e = env_of(c);
  DSV4_CHECK(st->valid && c->recompute && st->grads, DSV4_ERR_STATE,
             "core: recomputation without a recomputing forward and dsv4_core_bwd_begin");
  dsv4_attn_args at = dsv4_attend_args(&e, i0, n, q, o, st->bs.rc_lse, ori_kv(c), st->cmp, st->topk);
  /* the fast path keeps the chunk's logits for the backward when they are small enough (arenas.c):
   * the same product of the same values, so the backward skips recomputing it */
  at.scores_out = st->bs.rc_scores;
  at.score_stride = st->bs.rc_stride;
  DSV4_TRY(dsv4_kernels_get(c->impl)->attn(&at));
  if (st->dm.selects) DSV4_TRY(dsv4_select_queries(&e, i0, n, st->qr, st->x, st->bs.qI, st->bs.wI));
fail:
  return rc;
}

dsv4_status dsv4_core_bwd_rows(dsv4_core *c, int64_t i0, int64_t n, const float *q, const float *o,
                               const float *d_o, float *dq) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const dsv4_stage_env e = env_of(c);
  const int H = c->cfg.n_heads, Hi = c->cfg.index_n_heads, Di = c->cfg.index_head_dim;
  int64_t *lo = NULL, *hi = NULL;
  DSV4_CHECK(st->valid && st->grads, DSV4_ERR_STATE, "core backward: rows before dsv4_core_bwd_begin");
  DSV4_CHECK(q && o && d_o && dq && i0 >= 0 && n >= 0 && i0 + n <= c->plan.n, DSV4_ERR_ARG,
             "core backward: bad rows [%lld, %lld) or NULL buffers", (long long)i0, (long long)(i0 + n));
  /* attention rows moved to the offload peer (heavy: the call computes the others), or the peer's
   * computed here after the call's own rows (light) */
  const int moves = dsv4_core_offloads(c), heavy = moves && c->off.heavy;
  DSV4_ALLOC(lo, c->off.n_part + 1);
  DSV4_ALLOC(hi, c->off.n_part + 1);
  const int n_own = dsv4_offload_own(c, i0, n, lo, hi);
  if (heavy) DSV4_TRY(dsv4_offload_bwd_post(c, i0, n, q, o, d_o, dq));
  /* the fast path adds the key gradients into the exact sums over all chunks; the naive path into
   * d_ext / d_cmp (floats, added to the sums at the end) */
  dsv4_xrows xo = dsv4_xrows_view(st->bs.x_ext, st->dm.R_kv, st->dm.D, st->dm.nt);
  dsv4_xrows xc = dsv4_xrows_view_locked(st->bs.x_cmp, st->bs.x_lock, st->dm.n_cmp, st->dm.D, st->dm.nt);
  const int fast = c->impl != DSV4_IMPL_NAIVE;
  for (int r = 0; r < n_own; r++) {
    const int64_t a = lo[r] - i0, HD = (int64_t)H * c->cfg.head_dim;
    dsv4_attn_bwd_args ab = {
        .dq = dq + a * HD, .d_ori_kv = st->bs.d_ext, .d_cmp_kv = st->bs.d_cmp, .d_sink = dsv4_w(st->grads, W_SINK),
        .dout = d_o + a * HD, .out = o + a * HD, .lse = st->sv.lse + lo[r] * H,
        .scores = st->bs.rc_scores ? st->bs.rc_scores + a * st->bs.rc_stride : NULL,
        .fwd = dsv4_attend_args(&e, lo[r], hi[r] - lo[r], q + a * HD, NULL, NULL, ori_kv(c), st->cmp, st->topk)};
    ab.fwd.score_stride = st->bs.rc_stride;
    DSV4_TRY(dsv4_attend_bwd(&e, &ab, fast ? &xo : NULL, fast && c->ratio > 0 ? &xc : NULL,
                             heavy ? dsv4_offload_progress : NULL, c));
  }
  if (st->dm.selects) {
    /* recomputation left this chunk's indexer queries in the chunk-sized buffers */
    const float *qI = c->recompute ? st->bs.qI : st->sv.qI + i0 * Hi * Di;
    const float *wI = c->recompute ? st->bs.wI : st->sv.wI + i0 * Hi;
    const double gs = st->n_valid ? c->cfg.index_loss_coeff / (double)st->n_valid * st->d_loss : 0.0;
    const dsv4_loss_in in = {.q = q, .cmp = st->cmp, .qI = qI, .wI = wI, .KI = st->KI, .teacher = st->sv.teacher,
                             .scores = st->sv.scores, .topk = st->topk, .kl_rows = st->sv.kl_rows};
    /* the KL adds d KI into its sink's exact sums, their only copy, under the compressed rows' locks
     * (the attention above has released them) */
    const dsv4_wsink *ks = st->d_KI_sum;
    dsv4_xrows xk = {0};
    const int into = fast && ks && ks->acc && !ks->n_lo && ks->n / ks->w == st->dm.n_cmp;
    if (into) xk = dsv4_xrows_view_locked(ks->acc, st->bs.x_lock, ks->n / ks->w, ks->w, st->dm.nt);
    DSV4_TRY(
        dsv4_loss_bwd_rows(&e, i0, n, &in, (float)gs, st->bs.d_qI, st->bs.d_wI, st->d_KI, into ? &xk : NULL));
    /* default mode: the saved queries' rows (dead after this chunk) keep d qI, d w for the end */
    float *kq = c->recompute ? st->kqI : st->sv.qI, *kw = c->recompute ? st->kwI : st->sv.wI;
    DSV4_TRY(dsv4_select_queries_bwd(&e, i0, n, st->bs.d_qI, st->bs.d_wI, st->qr, st->x, st->grads, &st->sinks, kq,
                                     kw));
  }
  if (heavy) DSV4_TRY(dsv4_offload_bwd_wait(c));
  if (moves && !heavy) DSV4_TRY(dsv4_offload_bwd_serve(c, i0, n));
fail:
  if (rc != DSV4_OK) dsv4_offload_drain(c);
  free(lo), free(hi);
  return rc;
}

/* The exact sums of rows [rows, 2 w] (copy 0 of the copies: nt of them, or 1): the fast path merges
 * the copies; the naive path adds its float sums f [rows, w] as terms. */
static dsv4_status sums_of(const dsv4_core *c, int64_t *x, const float *f, int64_t rows, int64_t w,
                           int copies) {
  dsv4_status rc = DSV4_OK;
  dsv4_xrows v = dsv4_xrows_view(x, rows, w, copies);
  if (c->impl != DSV4_IMPL_NAIVE) {
    dsv4_xrows_merge(&v);
    return DSV4_OK;
  }
  int bad = 0;
  for (int64_t r = 0; r < rows; r++) bad |= dsv4_xacc_add(x + r * 2 * w, x + r * 2 * w + w, f + r * w, w);
  DSV4_CHECK(!bad, DSV4_ERR_ARG, "layer %d backward: a key gradient is not finite or not below 2^24", c->layer);
fail:
  return rc;
}

dsv4_status dsv4_core_bwd_end(dsv4_core *c, float *dkv, float *dx) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const dsv4_stage_env e = env_of(c);
  const dsv4_dims *dm = &st->dm;
  DSV4_CHECK(st->valid && st->grads, DSV4_ERR_STATE, "core backward: end before dsv4_core_bwd_begin");
  DSV4_CHECK(dkv && (c->ratio == 0 || dx), DSV4_ERR_ARG, "core backward: dkv (and dx for a compressed layer) required");
  DSV4_TRY(sums_of(c, st->bs.x_ext, st->bs.d_ext, dm->R_kv, dm->D, dm->nt));
  DSV4_TRY(dsv4_window_halo_bwd(&e, st->bs.x_ext, dkv));
  /* the compressed rows' sums: this layer's own (V4), or added to its kv source's (V4.1) */
  const int64_t *x_src = st->bs.x_cmp;
  if (c->ratio > 0) {
    DSV4_TRY(sums_of(c, st->bs.x_cmp, st->bs.d_cmp, dm->n_cmp, dm->D, 1));
    if (st->kv_e) {
      int64_t *sum = st->kv_e->x_cmp;
      const int64_t D = dm->D;
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < dm->n_cmp; r++)
        dsv4_xacc_merge(sum + r * 2 * D, sum + r * 2 * D + D, st->bs.x_cmp + r * 2 * D, st->bs.x_cmp + r * 2 * D + D, D);
      x_src = sum;
    }
  }
  if (st->dm.selects && (!c->recompute || st->kqI))
    DSV4_TRY(dsv4_select_wgrad(&e, c->recompute ? st->kqI : st->sv.qI, c->recompute ? st->kwI : st->sv.wI, st->qr,
                               st->x, st->grads));
  if (st->d_KI_sum) DSV4_TRY(dsv4_wsinks_settle(&st->sinks, st->d_KI_sum));
  if (dm->compresses) {
    const dsv4_stage1_grad g = {.x_out = x_src, .x_ring = st->bs.x_ring, .x_blk = st->bs.x_blk};
    DSV4_TRY(dsv4_stage1_backward(&e, 0, &g, st->x, st->sv.C, st->sv.Z, st->bs.d_blk, st->bs.dC,
                                  st->bs.dZ, st->grads, dx));
  }
  if (dm->v4_keys) {
    const dsv4_stage1_grad g = {.x_out = st->d_KI_sum ? st->d_KI_sum->acc : NULL, /* NULL: no slots */
                                .x_ring = st->bs.x_ring, .x_blk = st->bs.x_blk};
    DSV4_TRY(dsv4_stage1_backward(&e, 1, &g, st->x, st->sv.CI, st->sv.ZI, st->bs.d_blk, st->bs.dC,
                                  st->bs.dZ, st->grads, NULL));
  }
  if (st->dm.v41_keys)
    DSV4_TRY(dsv4_stage1_keys_bwd(&e, st->d_KI_sum ? st->d_KI_sum->acc : NULL, st->sv.lat, st->sv.kpre,
                                  st->bs.x_ring, st->bs.x_blk, st->bs.d_blk, &st->sinks, st->grads));
  if (st->kv_e) { /* the pass's order: a consumer is done; the source's sums are spent */
    if (c->info.role == DSV4_ROLE_FULL)
      st->kv_e->bwd_done = 1;
    else
      st->kv_e->done[c->layer] = 1;
  }
fail:
  return rc;
}
