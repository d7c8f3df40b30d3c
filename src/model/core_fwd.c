/* core_fwd.c: the core attention forward, the stages of core.h in order over the prepared plan:
 *   prepare  : the agreement check and this call's plan (cached while its key repeats);
 *   begin    : Stage 1 started (compressor projections, compressor halo, pooling of the owned slots,
 *              all-gather of every rank's slot buffer; for r == 4 the indexer keys too), the window
 *              halo exchanged;
 *   rows     : per chunk of queries: the window phase (overlapping the all-gathers), the indexer
 *              queries, the end of Stage 1 (first chunk: select-and-pad into the global compressed
 *              kv), top-k against the global keys, the compressed phase, the KL terms;
 *   end      : the KL loss reduced over ranks.
 * V4.1 (docs/spec.md section 10): a kv source's Stage 1 writes the global compressed kv and indexer
 * keys into the forward pass's shared state (model/shared.h), an index source its top-k there; the
 * other layers of the group skip Stage 1 and read them (connect_shared). */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "model/weights.h"
#include "util/err.h"

static dsv4_stage_env env_of(dsv4_core *c) {
  return (dsv4_stage_env){&c->cfg, c->w, c->impl, &c->plan, &c->xfer};
}

/* This rank's part of the attention offload (plan/offload.h), kept with the plan. */
static dsv4_status plan_offload(dsv4_core *c, const dsv4_packing *pk) {
  dsv4_status rc = DSV4_OK;
  dsv4_offload *all = NULL;
  dsv4_token_cost tc;
  const int N = c->xfer.comm->size, me = c->xfer.comm->rank;
  dsv4_offload_free(&c->off);
  if (N < 2) return DSV4_OK;
  DSV4_TRY(dsv4_token_cost_of(&c->cfg, c->layer, &tc));
  DSV4_ALLOC(all, N);
  DSV4_TRY(dsv4_offload_plan(&tc, &c->plan.docs, pk, c->split, N, all));
  c->off = all[me];
  all[me] = (dsv4_offload){.peer = -1};
fail:
  dsv4_offload_free_all(all, N);
  if (rc != DSV4_OK) c->have_plan = 0, dsv4_plan_free(&c->plan);
  return rc;
}

dsv4_status dsv4_core_prepare(dsv4_core *c, const dsv4_packing *pk, int64_t n, const dsv4_plan **plan) {
  dsv4_status rc = DSV4_OK;
  dsv4_plan_key key = {0};
  dsv4_core_forget(c);
  DSV4_CHECK(pk, DSV4_ERR_ARG, "packing meta is NULL");
  /* the kernel path is agreed with the configuration: the ranks must run the same products (and
   * only the fast path moves attention rows between them) */
  const uint64_t path = c->impl == DSV4_IMPL_FAST ? 0 : 0x9e3779b97f4a7c15ull;
  DSV4_TRY(dsv4_xfer_agree(&c->xfer, c->cfg_hash ^ path, pk, n, c->split));
  DSV4_TRY(dsv4_plan_key_set(&key, pk, n, c->ratio, c->cfg.window, c->split, c->xfer.comm->rank, c->xfer.comm->size));
  if (!c->have_plan || !dsv4_plan_key_equal(&key, &c->plan.key)) {
    if (c->have_plan) dsv4_plan_free(&c->plan);
    c->have_plan = 0;
    DSV4_TRY(dsv4_plan_build(&c->plan, &c->cfg, &key, DSV4_PLAN_FULL));
    c->have_plan = 1;
    DSV4_TRY(plan_offload(c, pk));
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
  DSV4_CHECK(!c->info.selects || a->qr, DSV4_ERR_ARG, "core forward: qr is required for a layer that selects");
fail:
  return rc;
}

static const char *role_name(dsv4_role r) {
  return r == DSV4_ROLE_FULL ? "kv source" : r == DSV4_ROLE_REINDEX ? "reindex layer" : "reuse layer";
}

/* V4.1: where this forward's compressed kv, keys and top-k live. A kv source writes a new entry of
 * the shared state (its own state when the caller gives none); a consumer reads its sources'
 * entries, which must come from this pass, this packing and, for training, a training forward. */
static dsv4_status connect_shared(dsv4_core *c, const dsv4_core_begin_args *a) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const dsv4_layer_info *in = &c->info;
  const int L = c->layer, D = c->cfg.head_dim, Di = c->cfg.index_head_dim;
  dsv4_shared *sh = a->shared;
  if (in->role == DSV4_ROLE_FULL && !sh) { /* it needs no other layer: a pass of its own */
    if (!c->own_shared) DSV4_TRY(dsv4_shared_create(&c->own_shared));
    sh = c->own_shared;
    dsv4_shared_reset(sh);
  }
  DSV4_CHECK(sh, DSV4_ERR_ARG,
             "layer %d (a %s) reads layer %d's compressed kv: pass this forward pass's shared state "
             "(dsv4_layer_fwd_args.shared), in which layer %d ran first", L, role_name(in->role), in->kv_source,
             in->kv_source);
  st->sh = sh;
  st->sh_gen = sh->gen;
  if (in->role == DSV4_ROLE_FULL) {
    DSV4_TRY(dsv4_shared_kv_new(sh, L, c->ratio, c->group_hash, &c->plan.key, c->plan.docs.n_cmp, D, Di, a->train,
                                &st->kv_e));
  } else {
    dsv4_shared_kv *e = dsv4_shared_kv_of(sh, in->kv_source);
    DSV4_CHECK(e && e->complete, DSV4_ERR_STATE,
               "layer %d (a %s) reads layer %d's compressed kv, but layer %d has not run in this forward pass of "
               "the shared state (call the layers in order, one shared state per pass)", L, role_name(in->role),
               in->kv_source, in->kv_source);
    DSV4_CHECK(e->cfg_hash == c->group_hash, DSV4_ERR_ARG,
               "layer %d and its kv source layer %d were created with different configurations", L, in->kv_source);
    DSV4_CHECK(dsv4_plan_key_equal(&e->key, &c->plan.key), DSV4_ERR_ARG,
               "layer %d's packing, row count or CP split differs from its kv source layer %d's in this forward pass",
               L, in->kv_source);
    DSV4_CHECK(!a->train || (e->train && !e->bwd_done), DSV4_ERR_STATE,
               "layer %d trains but its kv source layer %d %s", L, in->kv_source,
               e->bwd_done ? "already ran its backward in this pass" : "ran without train");
    st->kv_e = e;
  }
  st->cmp = st->kv_e->cmp, st->KI = st->kv_e->KI;
  if (in->selects) {
    dsv4_shared_sel *se = NULL;
    DSV4_TRY(dsv4_shared_sel_new(sh, L, c->plan.n, c->cfg.index_topk,
                                 in->candidate_source ? c->cfg.candidate_topk_blocks : 0, &se));
    st->topk = se->topk;
    st->cand_out = se->cand;
    st->sel_e = se;
  } else {
    const dsv4_shared_sel *se = dsv4_shared_sel_of(sh, in->index_source);
    DSV4_CHECK(se && se->complete, DSV4_ERR_STATE,
               "layer %d (a reuse layer) attends with layer %d's top-k, but layer %d has not run in this forward "
               "pass of the shared state", L, in->index_source, in->index_source);
    st->topk = se->topk;
  }
  if (in->uses_candidates) {
    const int cs = c->cfg.candidate_source;
    const dsv4_shared_sel *ce = dsv4_shared_sel_of(sh, cs);
    DSV4_CHECK(ce && ce->complete && ce->cand, DSV4_ERR_STATE,
               "layer %d selects inside the candidate blocks of layer %d, which has not run in this forward pass "
               "of the shared state", L, cs);
    st->cand_in = ce->cand;
  }
  if (a->train && in->role != DSV4_ROLE_FULL) st->kv_e->reader[L] = 1; /* its source's backward waits for it */
fail:
  return rc;
}

void dsv4_core_fail(dsv4_core *c) {
  dsv4_core_run *st = &c->run;
  dsv4_offload_drain(c);
  dsv4_xfer_drain(&c->xfer);
  /* a failed source leaves nothing for its consumers (the shared state is alive: this is the call
   * that connected it) */
  if (st->sh && st->sh->gen == st->sh_gen) {
    if (c->info.role == DSV4_ROLE_FULL && st->kv_e && !st->kv_e->complete) dsv4_shared_drop_kv(st->kv_e);
    if (st->sel_e && !st->sel_e->complete) dsv4_shared_drop_sel(st->sel_e);
  }
  dsv4_core_forget(c);
}

dsv4_status dsv4_core_fwd_begin(dsv4_core *c, const dsv4_core_begin_args *a) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  DSV4_TRY(check_args(c, a));
  const dsv4_stage_env e = env_of(c);
  memset(st, 0, sizeof *st);
  st->q = a->q, st->o = a->o, st->kv = a->kv, st->x = a->x, st->qr = a->qr, st->topk_out = a->topk_ids;
  dsv4_dims_of(&st->dm, &c->cfg, &c->info, &c->plan, c->recompute, c->impl);
  const dsv4_dims *dm = &st->dm;
  /* both arenas carved now: saved pieces live until the backward, scratch until the end */
  DSV4_TRY(dsv4_arena_reserve(&c->saved, dsv4_carve_core_saved(NULL, dm, &st->sv), "core's saved activations"));
  dsv4_carve_core_saved(c->saved.base, dm, &st->sv);
  DSV4_TRY(dsv4_arena_reserve(&c->scratch, dsv4_core_scratch_bytes(dm), "core's scratch"));
  dsv4_carve_core_fwd(c->scratch.base, dm, &st->fs);
  if (dm->own_cmp)
    st->cmp = st->sv.cmp, st->KI = st->sv.KI, st->topk = st->sv.topk;
  else if (c->ratio > 0)
    DSV4_TRY(connect_shared(c, a));
  if (dm->compresses)
    DSV4_TRY(dsv4_stage1_start(&e, 0, a->x, st->sv.C, st->sv.Z, st->fs.blk[0], st->sv.lat, st->fs.all[0]));
  if (dm->v4_keys)
    DSV4_TRY(dsv4_stage1_start(&e, 1, a->x, st->sv.CI, st->sv.ZI, st->fs.blk[1], NULL, st->fs.all[1]));
  if (dm->v41_keys) DSV4_TRY(dsv4_stage1_keys(&e, st->sv.lat, st->sv.kpre, st->fs.blk[1], st->fs.all[1]));
  DSV4_TRY(dsv4_window_halo(&e, a->kv, st->sv.kv_ext));
  return DSV4_OK;
fail:
  dsv4_core_fail(c);
  return rc;
}

static dsv4_status stage1_finish(dsv4_core *c, const dsv4_stage_env *e) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  if (st->dm.compresses && !st->stage1_done) {
    DSV4_TRY(dsv4_stage1_finish(e, 0, st->fs.all[0], st->cmp));
    if (st->dm.v4_keys || st->dm.v41_keys) DSV4_TRY(dsv4_stage1_finish(e, 1, st->fs.all[1], st->KI));
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
  const int sel = st->dm.selects, H = c->cfg.n_heads, k = c->cfg.index_topk;
  const int Hi = c->cfg.index_n_heads, Di = c->cfg.index_head_dim;
  const int64_t D = c->cfg.head_dim;
  float *qI = NULL, *wI = NULL;
  int64_t *lo = NULL, *hi = NULL;
  DSV4_CHECK(q && o && i0 >= 0 && n >= 0 && i0 + n <= c->plan.n, DSV4_ERR_ARG,
             "core forward: bad rows [%lld, %lld)", (long long)i0, (long long)(i0 + n));
  /* attention rows moved to the offload peer (heavy: the call computes the others, `own`), or the
   * peer's computed here after the call's own rows (light) */
  const int moves = dsv4_core_offloads(c), heavy = moves && c->off.heavy;
  DSV4_ALLOC(lo, c->off.n_part + 1);
  DSV4_ALLOC(hi, c->off.n_part + 1);
  const int n_own = dsv4_offload_own(c, i0, n, lo, hi);
  /* the window phase's running max and sum, [n, H] each (fast path) */
  float *m_w = st->fs.win_state, *l_w = m_w ? m_w + c->plan.n * H : NULL;
  if (c->impl == DSV4_IMPL_FAST)
    for (int r = 0; r < n_own; r++) {
      const dsv4_attn_args at = dsv4_attend_args(&e, lo[r], hi[r] - lo[r], q + (lo[r] - i0) * H * D,
                                                 o + (lo[r] - i0) * H * D, st->sv.lse + lo[r] * H, ori_kv(c), NULL, NULL);
      DSV4_TRY(dsv4_attend_window(&e, &at, m_w + lo[r] * H, l_w + lo[r] * H, !st->stage1_done));
    }
  if (sel) { /* more local work before waiting for the gathers */
    qI = c->recompute ? st->fs.qI : st->sv.qI + i0 * Hi * Di;
    wI = c->recompute ? st->fs.wI : st->sv.wI + i0 * Hi;
    DSV4_TRY(dsv4_select_queries(&e, i0, n, st->qr, st->x, qI, wI));
  }
  DSV4_TRY(stage1_finish(c, &e));
  if (sel) /* top-k over the GLOBAL indexer keys (ids in the global compressed sequence) */
    DSV4_TRY(dsv4_select_topk(&e, i0, n, qI, wI, st->KI, st->topk, st->sv.scores, st->cand_in, st->cand_out));
  if (sel && st->topk_out)
    memcpy(st->topk_out + i0 * k, st->topk + i0 * k, sizeof(int32_t) * (size_t)(n * k));
  if (heavy) DSV4_TRY(dsv4_offload_fwd_post(c, i0, n, q, o));
  for (int r = 0; r < n_own; r++) {
    dsv4_attn_args at = dsv4_attend_args(&e, lo[r], hi[r] - lo[r], q + (lo[r] - i0) * H * D, o + (lo[r] - i0) * H * D,
                                         st->sv.lse + lo[r] * H, ori_kv(c), st->cmp, st->topk);
    at.teacher = st->sv.teacher ? st->sv.teacher + lo[r] * k : NULL; /* the KL teacher from the attention's logits */
    if (c->impl == DSV4_IMPL_FAST)
      DSV4_TRY(dsv4_attend_finish(&e, &at, m_w + lo[r] * H, l_w + lo[r] * H, heavy ? dsv4_offload_progress : NULL, c));
    else
      DSV4_TRY(dsv4_attend_whole(&e, &at));
  }
  if (heavy) DSV4_TRY(dsv4_offload_fwd_wait(c));
  if (moves && !heavy) DSV4_TRY(dsv4_offload_fwd_serve(c, i0, n));
  if (sel) {
    const dsv4_loss_in in = {.q = q, .cmp = st->cmp, .qI = qI, .wI = wI, .KI = st->KI, .teacher = st->sv.teacher,
                             .scores = st->sv.scores, .topk = st->topk, .kl_rows = st->sv.kl_rows};
    DSV4_TRY(dsv4_loss_rows(&e, i0, n, &in, &st->kl_valid));
  }
  free(lo), free(hi);
  return DSV4_OK;
fail:
  free(lo), free(hi);
  dsv4_core_fail(c);
  return rc;
}

dsv4_status dsv4_core_fwd_end(dsv4_core *c, float *loss, int train) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const dsv4_stage_env e = env_of(c);
  DSV4_TRY(stage1_finish(c, &e)); /* no rows at all: the collectives still complete */
  if (st->dm.selects) DSV4_TRY(dsv4_loss_reduce(&e, st->sv.kl_rows, st->kl_valid, &st->n_valid, loss));
  if (c->info.role == DSV4_ROLE_FULL) st->kv_e->complete = 1;
  if (st->sel_e) st->sel_e->complete = 1;
  st->valid = train;
  return DSV4_OK;
fail:
  dsv4_core_fail(c);
  return rc;
}
