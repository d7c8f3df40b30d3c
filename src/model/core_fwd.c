/* core_fwd.c: the core attention forward, the stages of core.h in order over the prepared plan:
 *   prepare  : the agreement check and this call's plan (cached while its key repeats);
 *   begin    : Stage 1 started (compressor projections, compressor halo, pooling of the owned slots,
 *              all-gather of every rank's slot buffer; for r == 4 the indexer keys too), the window
 *              halo exchanged;
 *   rows     : per chunk of queries: the window phase (overlapping the all-gathers), the indexer
 *              queries, the end of Stage 1 (first chunk: select-and-pad into the global compressed
 *              kv), top-k against the global keys, the compressed phase, the KL terms;
 *   end      : the KL loss reduced over ranks. */
#include <string.h>

#include "core.h"
#include "model/weights.h"
#include "util/err.h"

static dsv4_stage_env env_of(dsv4_core *c) {
  return (dsv4_stage_env){&c->cfg, c->w, c->impl, &c->plan, &c->xfer};
}

dsv4_status dsv4_core_prepare(dsv4_core *c, const dsv4_packing *pk, int64_t n, const dsv4_plan **plan) {
  dsv4_status rc = DSV4_OK;
  dsv4_plan_key key = {0};
  dsv4_core_forget(c);
  DSV4_CHECK(pk, DSV4_ERR_ARG, "packing meta is NULL");
  DSV4_TRY(dsv4_xfer_agree(&c->xfer, c->cfg_hash, pk, n, c->split));
  DSV4_TRY(dsv4_plan_key_set(&key, pk, n, c->ratio, c->cfg.window, c->split, c->xfer.comm->rank, c->xfer.comm->size));
  if (!c->have_plan || !dsv4_plan_key_equal(&key, &c->plan.key)) {
    if (c->have_plan) dsv4_plan_free(&c->plan);
    c->have_plan = 0;
    DSV4_TRY(dsv4_plan_build(&c->plan, &c->cfg, &key, DSV4_PLAN_FULL));
    c->have_plan = 1;
  }
  if (plan) *plan = &c->plan;
fail:
  dsv4_plan_key_free(&key);
  return rc;
}

static dsv4_status check_args(const dsv4_core *c, const dsv4_core_begin_args *a) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(c->have_plan, DSV4_ERR_STATE, "core forward: no plan (dsv4_core_prepare first)");
  DSV4_CHECK(a && a->kv, DSV4_ERR_ARG, "core forward: kv is required");
  DSV4_CHECK(c->ratio == 0 || a->x, DSV4_ERR_ARG, "core forward: x is required for a compressed layer");
  DSV4_CHECK(c->ratio != 4 || a->qr, DSV4_ERR_ARG, "core forward: qr is required for a ratio-4 layer");
fail:
  return rc;
}

void dsv4_core_fail(dsv4_core *c) {
  dsv4_xfer_drain(&c->xfer);
  dsv4_core_forget(c);
}

dsv4_status dsv4_core_fwd_begin(dsv4_core *c, const dsv4_core_begin_args *a) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  DSV4_TRY(check_args(c, a));
  const dsv4_stage_env e = env_of(c);
  memset(st, 0, sizeof *st);
  st->q = a->q, st->o = a->o, st->kv = a->kv, st->x = a->x, st->qr = a->qr, st->topk_out = a->topk_ids;
  dsv4_dims_of(&st->dm, &c->cfg, &c->plan, c->recompute, c->impl);
  /* both arenas carved now: saved pieces live until the backward, scratch until the end */
  DSV4_TRY(dsv4_arena_reserve(&c->saved, dsv4_carve_core_saved(NULL, &st->dm, &st->sv), "core's saved activations"));
  dsv4_carve_core_saved(c->saved.base, &st->dm, &st->sv);
  DSV4_TRY(dsv4_arena_reserve(&c->scratch, dsv4_core_scratch_bytes(&st->dm), "core's scratch"));
  dsv4_carve_core_fwd(c->scratch.base, &st->dm, &st->fs);
  if (c->ratio > 0) {
    DSV4_TRY(dsv4_stage1_start(&e, 0, a->x, st->sv.C, st->sv.Z, st->fs.blk[0], st->fs.all[0]));
    if (c->ratio == 4) DSV4_TRY(dsv4_stage1_start(&e, 1, a->x, st->sv.CI, st->sv.ZI, st->fs.blk[1], st->fs.all[1]));
  }
  DSV4_TRY(dsv4_window_halo(&e, a->kv, st->sv.kv_ext));
  return DSV4_OK;
fail:
  dsv4_core_fail(c);
  return rc;
}

static dsv4_status stage1_finish(dsv4_core *c, const dsv4_stage_env *e) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  if (c->ratio > 0 && !st->stage1_done) {
    DSV4_TRY(dsv4_stage1_finish(e, 0, st->fs.all[0], st->sv.cmp));
    if (c->ratio == 4) DSV4_TRY(dsv4_stage1_finish(e, 1, st->fs.all[1], st->sv.KI));
  }
  st->stage1_done = 1;
fail:
  return rc;
}

static const float *ori_kv(const dsv4_core *c) { return c->plan.lay.ext_kv ? c->run.sv.kv_ext : c->run.kv; }

/* The chunk's queries: the window phase (overlapping the all-gathers while they are in flight), the
 * indexer queries, the end of Stage 1 (first chunk), top-k, the compressed phase, the KL terms. */
dsv4_status dsv4_core_fwd_rows(dsv4_core *c, int64_t i0, int64_t n, const float *q, float *o) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const dsv4_stage_env e = env_of(c);
  const int r = c->ratio, H = c->cfg.n_heads, k = c->cfg.index_topk;
  const int Hi = c->cfg.index_n_heads, Di = c->cfg.index_head_dim;
  float *qI = NULL, *wI = NULL;
  DSV4_CHECK(q && o && i0 >= 0 && n >= 0 && i0 + n <= c->plan.n, DSV4_ERR_ARG,
             "core forward: bad rows [%lld, %lld)", (long long)i0, (long long)(i0 + n));
  float *lse = st->sv.lse + i0 * H;
  dsv4_attn_args at = dsv4_attend_args(&e, i0, n, q, o, lse, ori_kv(c), NULL, NULL); /* the window phase's */
  float *m_w = st->fs.win_state ? st->fs.win_state + i0 * H : NULL, *l_w = m_w ? m_w + c->plan.n * H : NULL;
  if (c->impl == DSV4_IMPL_FAST) DSV4_TRY(dsv4_attend_window(&e, &at, m_w, l_w, !st->stage1_done));
  if (r == 4) { /* more local work before waiting for the gathers */
    qI = c->recompute ? st->fs.qI : st->sv.qI + i0 * Hi * Di;
    wI = c->recompute ? st->fs.wI : st->sv.wI + i0 * Hi;
    DSV4_TRY(dsv4_select_queries(&e, i0, n, st->qr, st->x, qI, wI));
  }
  DSV4_TRY(stage1_finish(c, &e));
  if (r == 4) { /* top-k over the GLOBAL indexer keys (ids in the global compressed sequence) */
    DSV4_TRY(dsv4_select_topk(&e, i0, n, qI, wI, st->sv.KI, st->sv.topk, st->sv.scores));
    if (st->topk_out) memcpy(st->topk_out + i0 * k, st->sv.topk + i0 * k, sizeof(int32_t) * (size_t)(n * k));
  }
  at = dsv4_attend_args(&e, i0, n, q, o, lse, ori_kv(c), st->sv.cmp, st->sv.topk);
  at.teacher = st->sv.teacher ? st->sv.teacher + i0 * k : NULL; /* the KL teacher from the attention's logits */
  if (c->impl == DSV4_IMPL_FAST)
    DSV4_TRY(dsv4_attend_finish(&e, &at, m_w, l_w));
  else
    DSV4_TRY(dsv4_attend_whole(&e, &at));
  if (r == 4) {
    const dsv4_loss_in in = {.q = q, .cmp = st->sv.cmp, .qI = qI, .wI = wI, .KI = st->sv.KI, .teacher = st->sv.teacher,
                             .scores = st->sv.scores, .topk = st->sv.topk, .kl_rows = st->sv.kl_rows};
    DSV4_TRY(dsv4_loss_rows(&e, i0, n, &in, &st->kl_valid));
  }
  return DSV4_OK;
fail:
  dsv4_core_fail(c);
  return rc;
}

dsv4_status dsv4_core_fwd_end(dsv4_core *c, float *loss, int train) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const dsv4_stage_env e = env_of(c);
  DSV4_TRY(stage1_finish(c, &e)); /* no rows at all: the collectives still complete */
  if (c->ratio == 4) DSV4_TRY(dsv4_loss_reduce(&e, st->sv.kl_rows, st->kl_valid, &st->n_valid, loss));
  st->valid = train;
  return DSV4_OK;
fail:
  dsv4_core_fail(c);
  return rc;
}
