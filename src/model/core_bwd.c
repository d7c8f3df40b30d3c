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
#include <string.h>

#include "core.h"
#include "model/weights.h"
#include "util/err.h"

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
  st->d_cmp = e->d_cmp, st->d_KI = e->d_KI;
fail:
  return rc;
}

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
  memset(st->bs.d_ext, 0, sizeof(float) * (size_t)(dm->R_kv * dm->D));
  if (dm->own_cmp) {
    st->d_cmp = st->bs.d_cmp, st->d_KI = st->bs.d_KI;
    if (c->ratio > 0) memset(st->d_cmp, 0, sizeof(float) * (size_t)(dm->n_cmp * dm->D));
    if (dm->v4_keys) memset(st->d_KI, 0, sizeof(float) * (size_t)(dm->n_cmp * dm->Di));
  }
fail:
  return rc;
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
  /* the fast path keeps the chunk's logits for the backward: the same product of the same values,
   * so the backward skips recomputing it (its q.K^T is 2 H D flops per key and query) */
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
  DSV4_CHECK(st->valid && st->grads, DSV4_ERR_STATE, "core backward: rows before dsv4_core_bwd_begin");
  DSV4_CHECK(q && o && d_o && dq && i0 >= 0 && n >= 0 && i0 + n <= c->plan.n, DSV4_ERR_ARG,
             "core backward: bad rows [%lld, %lld) or NULL buffers", (long long)i0, (long long)(i0 + n));
  const dsv4_attn_bwd_args ab = {
      .dq = dq, .d_ori_kv = st->bs.d_ext, .d_cmp_kv = st->d_cmp, .d_sink = dsv4_w(st->grads, W_SINK),
      .dout = d_o, .out = o, .lse = st->sv.lse + i0 * H, .scores = c->recompute ? st->bs.rc_scores : NULL,
      .fwd = dsv4_attend_args(&e, i0, n, q, NULL, NULL, ori_kv(c), st->cmp, st->topk)};
  dsv4_attn_bwd_args abs = ab;
  abs.fwd.score_stride = st->bs.rc_stride;
  DSV4_TRY(dsv4_attend_bwd(&e, &abs));
  if (st->dm.selects) {
    /* recomputation left this chunk's indexer queries in the chunk-sized buffers */
    const float *qI = c->recompute ? st->bs.qI : st->sv.qI + i0 * Hi * Di;
    const float *wI = c->recompute ? st->bs.wI : st->sv.wI + i0 * Hi;
    const double gs = st->n_valid ? c->cfg.index_loss_coeff / (double)st->n_valid * st->d_loss : 0.0;
    const dsv4_loss_in in = {.q = q, .cmp = st->cmp, .qI = qI, .wI = wI, .KI = st->KI, .teacher = st->sv.teacher,
                             .scores = st->sv.scores, .topk = st->topk, .kl_rows = st->sv.kl_rows};
    DSV4_TRY(dsv4_loss_bwd_rows(&e, i0, n, &in, (float)gs, st->bs.d_qI, st->bs.d_wI, st->d_KI));
    DSV4_TRY(dsv4_select_queries_bwd(&e, i0, n, st->bs.d_qI, st->bs.d_wI, st->qr, st->x, st->grads));
  }
fail:
  return rc;
}

dsv4_status dsv4_core_bwd_end(dsv4_core *c, float *dkv, float *dx) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const dsv4_stage_env e = env_of(c);
  DSV4_CHECK(st->valid && st->grads, DSV4_ERR_STATE, "core backward: end before dsv4_core_bwd_begin");
  DSV4_CHECK(dkv && (c->ratio == 0 || dx), DSV4_ERR_ARG, "core backward: dkv (and dx for a compressed layer) required");
  DSV4_TRY(dsv4_window_halo_bwd(&e, st->bs.d_ext, dkv));
  if (st->dm.compresses)
    DSV4_TRY(dsv4_stage1_backward(&e, 0, st->d_cmp, st->x, st->sv.C, st->sv.Z, st->bs.d_all, st->bs.d_blk,
                                  st->bs.dC, st->bs.dZ, st->grads, dx));
  if (st->dm.v4_keys)
    DSV4_TRY(dsv4_stage1_backward(&e, 1, st->d_KI, st->x, st->sv.CI, st->sv.ZI, st->bs.d_all, st->bs.d_blk,
                                  st->bs.dC, st->bs.dZ, st->grads, NULL));
  if (st->dm.v41_keys)
    DSV4_TRY(dsv4_stage1_keys_bwd(&e, st->d_KI, st->sv.lat, st->sv.kpre, st->bs.d_all, st->bs.d_blk, st->grads));
  if (st->kv_e) { /* the pass's order: a consumer is done; the source's sums are spent */
    if (c->info.role == DSV4_ROLE_FULL)
      st->kv_e->bwd_done = 1;
    else
      st->kv_e->done[c->layer] = 1;
  }
fail:
  return rc;
}
