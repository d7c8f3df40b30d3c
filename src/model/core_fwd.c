/* core_fwd.c: the core attention forward, two stages over an exchange (see core_internal.h).
 *   prepare  : the agreement check, the validated packing, this rank's layout and token map.
 *   Stage 1  : compressor projections of the local rows, the compressor halo (projected rows of
 *              slots that straddle a segment start), pooling of the slots this rank owns, and the
 *              all-gather of every rank's slot buffer; select by the gather index -> the global
 *              compressed kv (and, for r == 4, the global indexer keys).
 *   Stage 2  : window halo and window attention (overlapping the all-gathers), indexer top-k of the
 *              local queries against the global keys, compressed attention, KL loss reduced over
 *              ranks.
 * Index arithmetic with worked examples: model/layout.c (segments, halos, slot ownership),
 * model/docs.h (slot ids), cp/plan.c (halo plans, gather index) and docs/cp.md. */
#include <math.h>
#include <string.h>

#include "core_internal.h"
#include "model/weights.h"
#include "ops/placement.h"
#include "ops/sparse_attn.h"
#include "util/err.h"
#include "util/gemm.h"

/* Y rows of every segment = X rows . W^T, in the global panels of util/gemm.h. Y's rows for
 * segment s start at its own rows of C/Z_ext (use_c_rows) or at its first local row; X is [n, K]
 * in local row order. */
static dsv4_status proj_segments(const dsv4_core *c, const dsv4_layout *lay, float *Y, int64_t ldy,
                                 int use_c_rows, const float *X, int64_t ldx, const float *W, int64_t N,
                                 int64_t K) {
  dsv4_status rc = DSV4_OK;
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    const int64_t yr = use_c_rows ? sg->c_row + sg->c_halo : sg->lo;
    DSV4_TRY(dsv4_proj_rows(Y + yr * ldy, ldy, X + sg->lo * ldx, ldx, W, sg->len, N, K,
                            c->tok.global + sg->lo, lay->panel, c->impl));
  }
fail:
  return rc;
}

/* Window of every local row in kv_ext (SPEC 3 step 4, clamped to the document start). */
static void window_ranges(const dsv4_core *c, const dsv4_layout *lay, int32_t *ws, int32_t *wl) {
  const int W = c->cfg.window;
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    for (int64_t i = 0; i < sg->len; i++) {
      const int64_t row = sg->lo + i, ext = sg->kv_row + sg->win_halo + i;
      const int64_t pos = c->tok.pos[row];
      const int64_t len = c->tok.real[row] ? (pos < W - 1 ? pos : W - 1) + 1 : 0;
      wl[row] = (int32_t)len;
      ws[row] = (int32_t)(len ? ext - len + 1 : ext);
    }
  }
}

/* The slots this rank owns (core_internal.h), in global id order: the first row of their own
 * window in C/Z_ext, of their previous window (r == 4, j > 0; -1 otherwise), the RoPE position
 * j r and their row in the local slot buffer.
 * Worked example (model/layout.c): r = 4, one document of 16, N = 8, W = 4; rank 3 holds [6, 8)
 * with c_halo = 6 (global rows 0..5 in C/Z_ext rows 0..5, own rows 6, 7 in rows 6, 7) and owns
 * slot 1: own window [4, 8) -> cur row 4, previous window [0, 4) -> prev row 0, position 4, slot
 * buffer row 0. */
static dsv4_status build_slots(dsv4_core *c) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  const dsv4_layout *lay = &sv->lay;
  const dsv4_docs *docs = &sv->docs;
  const int r = c->ratio;
  DSV4_SLOT(sv->slot_cur, c->slot[CS_SLOT_CUR], lay->n_own);
  DSV4_SLOT(sv->slot_prev, c->slot[CS_SLOT_PREV], lay->n_own);
  DSV4_SLOT(sv->slot_pos, c->slot[CS_SLOT_POS], lay->n_own);
  DSV4_SLOT(sv->slot_blk, c->slot[CS_SLOT_BLK], lay->n_own);
  int64_t n = 0;
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    const int64_t first = sg->g0 - sg->c_halo; /* global token of the segment's first C/Z_ext row */
    for (int64_t k = 0; k < sg->n_own; k++) {
      int doc;
      int64_t j;
      dsv4_docs_slot(docs, sg->id0 + k, &doc, &j);
      const int64_t w = docs->cu[doc] + j * r;
      DSV4_CHECK(w >= first && (r != 4 || j == 0 || w - r >= first), DSV4_ERR_STATE,
                 "internal: slot %lld of the segment at token %lld lacks compressor halo rows",
                 (long long)(sg->id0 + k), (long long)sg->g0);
      const int64_t cur = sg->c_row + (w - first);
      sv->slot_cur[n] = (int32_t)cur;
      sv->slot_prev[n] = (int32_t)(r == 4 && j > 0 ? cur - r : -1);
      sv->slot_pos[n] = (int32_t)(j * r);
      sv->slot_blk[n] = (int32_t)(sg->blk0 + k);
      n++;
    }
  }
  sv->n_slot = n;
fail:
  return rc;
}

/* Stage 1 for one compressor (which = 0 main, 1 indexer): projections, halo, pooling of the owned
 * slots into the local slot buffer, then the all-gather is started; *all receives
 * [n_blk_all, dim] when it completes. */
static dsv4_status stage1_start(dsv4_core *c, const dsv4_exchange *x, int which, float **Cp, float **Zp,
                                float **all) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  const dsv4_layout *lay = &sv->lay;
  const int r = c->ratio, dim = which ? c->cfg.index_head_dim : c->cfg.head_dim;
  const int cD = (r == 4 ? 2 : 1) * dim;
  const dsv4_weights *w = c->w;
  DSV4_SLOT(*Cp, c->slot[which ? CS_CI : CS_C], lay->R_c * cD);
  DSV4_SLOT(*Zp, c->slot[which ? CS_ZI : CS_Z], lay->R_c * cD);
  float *blocks = NULL;
  DSV4_TRY(proj_segments(c, lay, *Cp, cD, 1, sv->x, c->cfg.dim, dsv4_w(w, which ? W_I_WKV : W_C_WKV),
                         cD, c->cfg.dim));
  DSV4_TRY(proj_segments(c, lay, *Zp, cD, 1, sv->x, c->cfg.dim, dsv4_w(w, which ? W_I_WGATE : W_C_WGATE),
                         cD, c->cfg.dim));
  DSV4_TRY(x->cmp_halo(x->st, lay, *Cp, *Zp, cD, which));
  DSV4_SLOTZ(blocks, c->slot[which ? CS_SLOTS_IDX : CS_SLOTS_MAIN], lay->n_blk * dim); /* unused rows stay 0 */
  DSV4_SLOT(*all, c->slot[which ? CS_SLOTS_IDX_ALL : CS_SLOTS_MAIN_ALL], lay->n_blk_all * dim);
  dsv4_compress_args ca = {
      .out = blocks, .out_row = sv->slot_blk, .C = *Cp, .Z = *Zp,
      .ape = dsv4_w(w, which ? W_I_APE : W_C_APE), .norm_w = dsv4_w(w, which ? W_I_NORM : W_C_NORM),
      .cur_row = sv->slot_cur, .prev_row = sv->slot_prev, .pos = sv->slot_pos, .rope = &c->rope,
      .n_slots = sv->n_slot, .ratio = r, .D = dim, .eps = c->cfg.eps, .rows = lay->R_c,
      .rows_out = lay->n_blk};
  DSV4_TRY(dsv4_kernels_get(c->impl)->compress(&ca));
  DSV4_TRY(x->gather_start(x->st, lay, blocks, *all, dim, which));
fail:
  return rc;
}

/* Waits for the all-gather and selects the global compressed sequence: out[id] = all[gather[id]]. */
static dsv4_status stage1_finish(dsv4_core *c, const dsv4_exchange *x, int which, const float *all,
                                 float **out) {
  dsv4_status rc = DSV4_OK;
  const int dim = which ? c->cfg.index_head_dim : c->cfg.head_dim;
  const int64_t n_cmp = c->sv.docs.n_cmp;
  DSV4_TRY(x->gather_wait(x->st, which));
  DSV4_SLOT(*out, c->slot[which ? CS_KI : CS_CMP], n_cmp * dim);
  for (int64_t id = 0; id < n_cmp; id++)
    memcpy(*out + id * dim, all + (int64_t)c->sv.lay.gather[id] * dim, sizeof(float) * dim);
fail:
  return rc;
}

dsv4_status dsv4_core_indexer_queries(dsv4_core *c, int64_t i0, int64_t n, float *qI, float *wI) {
  dsv4_status rc = DSV4_OK;
  const dsv4_core_saved *sv = &c->sv;
  const int Hi = c->cfg.index_n_heads, Di = c->cfg.index_head_dim, dq = c->cfg.q_lora_rank, d = c->cfg.dim;
  DSV4_TRY(dsv4_proj_rows(qI, (int64_t)Hi * Di, sv->qr + i0 * dq, dq, dsv4_w(c->w, W_I_WQ_B), n, (int64_t)Hi * Di,
                          dq, c->tok.global + i0, sv->lay.panel, c->impl));
  DSV4_TRY(dsv4_proj_rows(wI, Hi, sv->x + i0 * d, d, dsv4_w(c->w, W_I_PROJ), n, Hi, d, c->tok.global + i0,
                          sv->lay.panel, c->impl));
  const float wscale = (float)(1.0 / sqrt((double)Di * Hi));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    for (int h = 0; h < Hi; h++) dsv4_rope_apply(&c->rope, qI + (i * Hi + h) * Di, Di, c->tok.pos[i0 + i], 0);
    for (int h = 0; h < Hi; h++) wI[i * Hi + h] *= wscale;
  }
fail:
  return rc;
}

/* The RoPE positions this rank uses: its rows' positions, and the slots it pools (position j r of a
 * slot whose window starts at most 2r - 1 rows before the segment's first row, model/layout.c). */
dsv4_status dsv4_core_reserve_rope(dsv4_core *c, const int32_t *pos, int64_t n) {
  int64_t lo = INT64_MAX, hi = 0;
  for (int64_t i = 0; i < n; i++) {
    lo = pos[i] < lo ? pos[i] : lo;
    hi = pos[i] + 1 > hi ? pos[i] + 1 : hi;
  }
  if (n == 0) lo = 0;
  lo -= 2 * c->ratio;
  return dsv4_rope_reserve(&c->rope, lo > 0 ? lo : 0, hi);
}

int64_t dsv4_core_chunk_end(const dsv4_core *c, int64_t i0, int64_t max_rows) {
  const int64_t *g = c->tok.global, n = c->sv.n;
  int64_t i = i0 + 1;
  while (i < n && i - i0 < max_rows && g[i] == g[i - 1] + 1 && g[i] % DSV4_CHUNK_ROWS != 0) i++;
  return i;
}

/* The attention arguments of local rows [i0, i0 + n) with queries q and output o: the window rows in
 * kv_ext, and, with_cmp (Stage 1 finished, top-k selected), the global compressed kv with each
 * query's visible range (r == 128) or top-k ids (r == 4). */
static dsv4_attn_args attn_rows(const dsv4_core *c, int64_t i0, int64_t n, const float *q, float *o, float *lse,
                                int with_cmp) {
  const dsv4_core_saved *sv = &c->sv;
  const int H = c->cfg.n_heads, D = c->cfg.head_dim, k = c->cfg.index_topk;
  dsv4_attn_args at = {.out = o, .lse = lse, .q = q, .ori_kv = sv->kv_ext ? sv->kv_ext : sv->kv,
                       .win_start = sv->win_start + i0, .win_len = sv->win_len + i0,
                       .sink = dsv4_w(c->w, W_SINK), .S1 = n, .R = sv->lay.R_kv, .H = H, .D = D,
                       .scale = (float)(1.0 / sqrt((double)D))};
  if (c->ratio > 0 && with_cmp) {
    at.cmp_kv = sv->cmp;
    at.C = sv->docs.n_cmp;
    at.cmp_begin = sv->cmp_begin + i0;
    at.cmp_count = sv->cmp_count + i0;
  }
  if (c->ratio == 4 && with_cmp) {
    at.cmp_ids = sv->topk + i0 * k;
    at.n_cmp_ids = k;
  }
  return at;
}

/* The placements of a chunk's attention call: queries SHARD(seq), raw kv WINDOW(the rows around
 * them), compressed keys REPLICATE. */
static void attn_places(const dsv4_core *c, int64_t n, dsv4_placement places[5]) {
  dsv4_attn_places(places, c->sv.lay.R_kv - n);
}

/* KL terms of local rows [i0, i0 + n) (summed exactly over ranks in dsv4_core_fwd_end). */
static dsv4_status kl_rows(dsv4_core *c, const dsv4_exchange *x, int64_t i0, int64_t n, const float *q,
                           const float *qI, const float *wI) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  const int k = c->cfg.index_topk;
  double sum = 0;
  int64_t n_valid = 0;
  dsv4_kl_args ka = {.loss_sum = &sum, .n_valid = &n_valid, .loss_rows = sv->kl_rows + i0, .q = q,
                     .cmp_kv = sv->cmp, .topk_ids = sv->topk + i0 * k, .q_idx = qI, .k_idx = sv->KI,
                     .weights = wI, .vis_begin = sv->cmp_begin + i0, .vis_count = sv->cmp_count + i0,
                     .S1 = n, .C = sv->docs.n_cmp, .H = c->cfg.n_heads, .D = c->cfg.head_dim,
                     .Hi = c->cfg.index_n_heads, .Di = c->cfg.index_head_dim, .topk = k,
                     .dense = c->cfg.index_loss_mode == DSV4_KL_DENSE,
                     .scale = (float)(1.0 / sqrt((double)c->cfg.head_dim)),
                     .teacher = sv->teacher ? sv->teacher + i0 * k : NULL, .scores = sv->scores + i0 * k};
  dsv4_placement places[6];
  dsv4_kl_places(places);
  DSV4_TRY(dsv4_indexer_kl_loss_dist(&ka, x->nranks, places, c->impl));
  sv->kl_valid += n_valid;
fail:
  return rc;
}

/* The agreement check, the validated packing meta, this rank's layout and token map, and the
 * RoPE table up to the longest document. */
static dsv4_status prepare(dsv4_core *c, const dsv4_core_fwd_args *a, const dsv4_exchange *x) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  DSV4_TRY(x->agree(x->st, c, a->pk, a->n));
  DSV4_TRY(dsv4_docs_build(&sv->docs, a->pk, c->ratio));
  DSV4_TRY(x->layout(x->st, &sv->docs, a->n, c->cfg.window, &sv->lay));
  DSV4_TRY(dsv4_core_fill_tokmap(c, &sv->docs, &sv->lay, NULL));
  DSV4_TRY(dsv4_core_reserve_rope(c, c->tok.pos, a->n));
  sv->n = a->n;
  sv->q = a->q, sv->o = a->o, sv->kv = a->kv, sv->x = a->x, sv->qr = a->qr;
  sv->topk_out = a->topk_ids;
fail:
  return rc;
}

/* Stage 1: start the all-gathers of both compressors' slots; the visible compressed range of every
 * local query (SPEC 3 step 4: the slots of its document that end at or before it). */
static dsv4_status stage1(dsv4_core *c, const dsv4_exchange *x) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  const int r = c->ratio;
  const int64_t n = sv->n;
  DSV4_TRY(build_slots(c));
  DSV4_TRY(stage1_start(c, x, 0, &sv->C, &sv->Z, &sv->all_main));
  if (r == 4) DSV4_TRY(stage1_start(c, x, 1, &sv->CI, &sv->ZI, &sv->all_idx));
  DSV4_SLOT(sv->cmp_begin, c->slot[CS_CMP_BEGIN], n);
  DSV4_SLOT(sv->cmp_count, c->slot[CS_CMP_COUNT], n);
  for (int64_t i = 0; i < n; i++) {
    sv->cmp_begin[i] = (int32_t)sv->docs.cu_cmp[c->tok.doc[i]];
    sv->cmp_count[i] = c->tok.real[i] ? (c->tok.pos[i] + 1) / r : 0;
  }
fail:
  return rc;
}

/* Stage 2 set-up: window ranges, kv_ext with its halo from the left neighbours, and the per-query
 * buffers every chunk writes into. */
static dsv4_status stage2_setup(dsv4_core *c, const dsv4_exchange *x) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  const int H = c->cfg.n_heads, D = c->cfg.head_dim, k = c->cfg.index_topk;
  const int Hi = c->cfg.index_n_heads, Di = c->cfg.index_head_dim;
  const int64_t n = sv->n;
  DSV4_SLOT(sv->win_start, c->slot[CS_WIN_START], n);
  DSV4_SLOT(sv->win_len, c->slot[CS_WIN_LEN], n);
  window_ranges(c, &sv->lay, sv->win_start, sv->win_len);
  if (sv->lay.ext_kv) {
    DSV4_SLOT(sv->kv_ext, c->slot[CS_KV_EXT], sv->lay.R_kv * D);
    for (int s = 0; s < sv->lay.n_seg; s++) {
      const dsv4_seg *sg = &sv->lay.seg[s];
      memcpy(sv->kv_ext + (sg->kv_row + sg->win_halo) * D, sv->kv + sg->lo * D, sizeof(float) * sg->len * D);
    }
    DSV4_TRY(x->win_halo(x->st, &sv->lay, sv->kv_ext, D));
  }
  DSV4_SLOT(sv->lse, c->slot[CS_LSE], n * H);
  if (c->impl == DSV4_IMPL_FAST) DSV4_SLOT(sv->win_state, c->slot[CS_WIN_STATE], 2 * n * H);
  if (c->ratio == 4) {
    DSV4_SLOT(sv->topk, c->slot[CS_TOPK], n * k);
    DSV4_SLOT(sv->scores, c->slot[CS_SCORES], n * k);
    if (c->cfg.index_loss_mode == DSV4_KL_SPARSE) DSV4_SLOT(sv->teacher, c->slot[CS_TEACHER], n * k);
    DSV4_SLOT(sv->kl_rows, c->slot[CS_KL_ROWS], n);
    if (!c->recompute) { /* kept whole for the backward; recomputation makes them chunk by chunk */
      DSV4_SLOT(sv->qI, c->slot[CS_QI], n * Hi * Di);
      DSV4_SLOT(sv->wI, c->slot[CS_WI], n * Hi);
    }
  }
fail:
  return rc;
}

static dsv4_status check_args(const dsv4_core *c, const dsv4_core_fwd_args *a) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(a && a->kv && a->pk, DSV4_ERR_ARG, "core forward: kv and pk are required");
  DSV4_CHECK(a->n >= 0, DSV4_ERR_ARG, "core forward: n < 0");
  DSV4_CHECK(c->ratio == 0 || a->x, DSV4_ERR_ARG, "core forward: x is required for a compressed layer");
  DSV4_CHECK(c->ratio != 4 || a->qr, DSV4_ERR_ARG, "core forward: qr is required for a ratio-4 layer");
fail:
  return rc;
}

void dsv4_core_fail(dsv4_core *c) {
  if (c->sv.xch.drain) c->sv.xch.drain(c->sv.xch.st);
  dsv4_core_saved_free(&c->sv);
}

dsv4_status dsv4_core_fwd_begin(dsv4_core *c, const dsv4_core_fwd_args *a) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  dsv4_core_saved_free(sv);
  DSV4_TRY(check_args(c, a));
  const dsv4_exchange *x = c->ops.exchange(c, &sv->xch);
  if (x != &sv->xch) sv->xch = *x;
  DSV4_TRY(prepare(c, a, &sv->xch));
  if (c->ratio > 0) DSV4_TRY(stage1(c, &sv->xch));
  DSV4_TRY(stage2_setup(c, &sv->xch));
  return DSV4_OK;
fail:
  dsv4_core_fail(c);
  return rc;
}

/* The chunk's queries: the window phase (overlapping the all-gathers while they are in flight), the
 * indexer queries, the end of Stage 1 (first chunk), top-k, the compressed phase, the KL terms. */
dsv4_status dsv4_core_fwd_rows(dsv4_core *c, int64_t i0, int64_t n, const float *q, float *o) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  const dsv4_exchange *x = &sv->xch;
  const int r = c->ratio, H = c->cfg.n_heads, k = c->cfg.index_topk;
  const int Hi = c->cfg.index_n_heads, Di = c->cfg.index_head_dim;
  float *qI = NULL, *wI = NULL;
  DSV4_CHECK(q && o && i0 >= 0 && n >= 0 && i0 + n <= sv->n, DSV4_ERR_ARG, "core forward: bad rows [%lld, %lld)",
             (long long)i0, (long long)(i0 + n));
  dsv4_attn_args at = attn_rows(c, i0, n, q, o, sv->lse + i0 * H, 0); /* the window phase's */
  dsv4_placement places[5];
  attn_places(c, n, places);
  float *m_w = sv->win_state ? sv->win_state + i0 * H : NULL, *l_w = m_w ? m_w + sv->n * H : NULL;
  if (c->impl == DSV4_IMPL_FAST) {
    DSV4_TRY(dsv4_attn_layout_check(&at, x->nranks, places));
    DSV4_TRY(dsv4_sparse_attn_window_progress(&at, m_w, l_w, sv->stage1_done ? NULL : x->progress, x->st));
  }
  if (r == 4) { /* more local work before waiting for the gathers */
    if (c->recompute) {
      DSV4_SLOT(qI, c->slot[CS_QI], n * Hi * Di);
      DSV4_SLOT(wI, c->slot[CS_WI], n * Hi);
    } else {
      qI = sv->qI + i0 * Hi * Di, wI = sv->wI + i0 * Hi;
    }
    DSV4_TRY(dsv4_core_indexer_queries(c, i0, n, qI, wI));
  }
  if (r > 0 && !sv->stage1_done) {
    DSV4_TRY(stage1_finish(c, x, 0, sv->all_main, &sv->cmp));
    if (r == 4) DSV4_TRY(stage1_finish(c, x, 1, sv->all_idx, &sv->KI));
    sv->stage1_done = 1;
  }
  if (r == 4) { /* top-k over the GLOBAL indexer keys (ids in the global compressed sequence) */
    dsv4_indexer_args ia = {.topk_ids = sv->topk + i0 * k, .topk_scores = sv->scores + i0 * k, .q_idx = qI,
                            .k_idx = sv->KI, .weights = wI, .vis_begin = sv->cmp_begin + i0,
                            .vis_count = sv->cmp_count + i0, .S1 = n, .C = sv->docs.n_cmp, .Hi = Hi, .Di = Di,
                            .topk = k};
    dsv4_placement iplaces[3];
    dsv4_indexer_places(iplaces);
    DSV4_TRY(dsv4_lightning_indexer_dist(&ia, x->nranks, iplaces, c->impl));
    if (sv->topk_out) memcpy(sv->topk_out + i0 * k, sv->topk + i0 * k, sizeof(int32_t) * (size_t)(n * k));
  }
  at = attn_rows(c, i0, n, q, o, sv->lse + i0 * H, 1);
  at.teacher = sv->teacher ? sv->teacher + i0 * k : NULL; /* the KL teacher from the attention's logits */
  if (c->impl == DSV4_IMPL_FAST)
    DSV4_TRY(dsv4_sparse_attn_finish(&at, m_w, l_w));
  else
    DSV4_TRY(dsv4_sparse_attn_dist(&at, x->nranks, places, c->impl));
  if (r == 4) DSV4_TRY(kl_rows(c, x, i0, n, q, qI, wI));
  return DSV4_OK;
fail:
  dsv4_core_fail(c);
  return rc;
}

dsv4_status dsv4_core_fwd_end(dsv4_core *c, float *loss, int train) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_saved *sv = &c->sv;
  if (c->ratio > 0 && !sv->stage1_done) { /* no rows at all: the collectives still complete */
    DSV4_TRY(stage1_finish(c, &sv->xch, 0, sv->all_main, &sv->cmp));
    if (c->ratio == 4) DSV4_TRY(stage1_finish(c, &sv->xch, 1, sv->all_idx, &sv->KI));
    sv->stage1_done = 1;
  }
  if (c->ratio == 4) { /* KL loss: coeff * sum / n_valid, summed exactly over ranks */
    dsv4_exactsum total = 0;
    int64_t n_valid = sv->kl_valid;
    for (int64_t i = 0; i < sv->n; i++) total += dsv4_exactsum_term(sv->kl_rows[i]);
    DSV4_TRY(sv->xch.reduce_loss(sv->xch.st, &total, &n_valid));
    sv->n_valid = n_valid;
    if (loss)
      *loss = n_valid ? (float)(c->cfg.index_loss_coeff * dsv4_exactsum_value(total) / (double)n_valid) : 0.0f;
  }
  sv->valid = train;
  if (!train) dsv4_core_saved_free(sv);
  return DSV4_OK;
fail:
  dsv4_core_fail(c);
  return rc;
}

/* The whole forward in one chunk (the public entry point: q and o whole). */
dsv4_status dsv4_core_run_forward(dsv4_core *c, const dsv4_core_fwd_args *a) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(a && a->q && a->o, DSV4_ERR_ARG, "core forward: q and o are required");
  DSV4_TRY(dsv4_core_fwd_begin(c, a));
  DSV4_TRY(dsv4_core_fwd_rows(c, 0, a->n, a->q, a->o));
  DSV4_TRY(dsv4_core_fwd_end(c, a->indexer_loss, a->train));
fail:
  return rc;
}
