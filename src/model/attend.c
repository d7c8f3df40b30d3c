/* attend.c: the sparse attention stage of a chunk of local queries (core.h), behind the operator's
 * layout rule (queries SHARD(seq), raw kv WINDOW(the halo rows in front of the chunk), compressed
 * keys REPLICATE). It always runs as a window phase then a compressed phase, also on one rank, so
 * overlapping the Stage-1 all-gather with the window phase changes no bit. */
#include <math.h>

#include "core.h"
#include "model/weights.h"
#include "ops/placement.h"
#include "ops/sparse_attn.h"
#include "util/err.h"

dsv4_attn_args dsv4_attend_args(const dsv4_stage_env *e, int64_t i0, int64_t n, const float *q, float *o, float *lse,
                                const float *ori_kv, const float *cmp, const int32_t *topk) {
  const dsv4_plan *p = e->p;
  const int H = e->cfg->n_heads, D = e->cfg->head_dim, k = e->cfg->index_topk, r = p->key.ratio;
  dsv4_attn_args at = {.out = o, .lse = lse, .q = q, .ori_kv = ori_kv, .win_start = p->win_start + i0,
                       .win_len = p->win_len + i0, .sink = dsv4_w(e->w, W_SINK), .S1 = n, .R = p->lay.R_kv, .H = H,
                       .D = D, .scale = (float)(1.0 / sqrt((double)D))};
  if (r > 0 && cmp) {
    at.cmp_kv = cmp;
    at.C = p->docs.n_cmp;
    at.cmp_begin = p->cmp_begin + i0;
    at.cmp_count = p->cmp_count + i0;
  }
  if (dsv4_env_sparse(e) && cmp) {
    at.cmp_ids = topk + i0 * k;
    at.n_cmp_ids = k;
  }
  return at;
}

static void places_of(const dsv4_stage_env *e, int64_t n, dsv4_placement places[5]) {
  dsv4_attn_places(places, e->p->lay.R_kv - n);
}

static void progress(void *x) { dsv4_xfer_progress(x); }

dsv4_status dsv4_attend_window(const dsv4_stage_env *e, const dsv4_attn_args *at, float *m_w, float *l_w,
                               int with_progress) {
  dsv4_status rc = DSV4_OK;
  dsv4_placement places[5];
  places_of(e, at->S1, places);
  DSV4_TRY(dsv4_attn_layout_check(at, e->x->comm->size, places));
  DSV4_TRY(dsv4_sparse_attn_window_progress(at, m_w, l_w, with_progress ? progress : NULL, e->x));
fail:
  return rc;
}

dsv4_status dsv4_attend_finish(const dsv4_stage_env *e, const dsv4_attn_args *at, const float *m_w,
                               const float *l_w, void (*progress)(void *), void *ctx) {
  (void)e;
  return dsv4_sparse_attn_finish_progress(at, m_w, l_w, progress, ctx);
}

dsv4_status dsv4_attend_whole(const dsv4_stage_env *e, const dsv4_attn_args *at) {
  dsv4_placement places[5];
  places_of(e, at->S1, places);
  return dsv4_sparse_attn_dist(at, e->x->comm->size, places, e->impl);
}

dsv4_status dsv4_attend_bwd(const dsv4_stage_env *e, const dsv4_attn_bwd_args *ab, dsv4_xrows *x_ori,
                            dsv4_xrows *x_cmp, void (*progress)(void *), void *ctx) {
  dsv4_status rc = DSV4_OK;
  dsv4_placement places[5];
  places_of(e, ab->fwd.S1, places);
  if (e->impl == DSV4_IMPL_NAIVE || (!x_ori && !x_cmp)) return dsv4_sparse_attn_bwd_dist(ab, e->x->comm->size, places, e->impl);
  DSV4_TRY(dsv4_attn_layout_check(&ab->fwd, e->x->comm->size, places));
  DSV4_TRY(dsv4_sparse_attn_bwd_into_progress(ab, x_ori, x_cmp, progress, ctx));
fail:
  return rc;
}
