/* offload.c: which attention rows move between ranks (offload.h). */
#include "offload.h"

#include <stdlib.h>
#include <string.h>

#include "plan/plan.h"
#include "plan/shard.h"
#include "util/abi.h"
#include "util/err.h"
#include "util/gemm.h"

/* The estimated work of global token g in document i (and *moved: what moving its attention moves). */
static double work_of(const dsv4_token_cost *tc, const dsv4_docs *d, int i, int64_t g, double *moved) {
  const int64_t t = g - d->cu[i];
  *moved = 0;
  if (t >= d->real[i]) return 0; /* padding: no work anywhere */
  double attention;
  const double w = dsv4_token_flops(tc, t, &attention);
  *moved = DSV4_OFFLOAD_KEY_COST * attention;
  return w + (DSV4_OFFLOAD_KEY_COST - 1) * attention;
}

/* The rank's work, its last segment and the length of its last row chunk. */
static dsv4_status rank_summary(const dsv4_token_cost *tc, const dsv4_docs *d, const dsv4_packing *pk,
                                dsv4_split split, int q, int size, double *work, dsv4_range *last, int64_t *chunk) {
  dsv4_status rc = DSV4_OK;
  dsv4_range *segs = NULL;
  int64_t *g = NULL, n = 0;
  int ns = 0;
  double moved;
  DSV4_TRY(dsv4_shard_segments(pk, split, q, size, &segs, &ns));
  for (int s = 0; s < ns; s++) n += segs[s].len;
  DSV4_ALLOC(g, n + 1);
  *work = 0;
  n = 0;
  for (int s = 0; s < ns; s++) {
    int i = dsv4_docs_find(d, segs[s].g0);
    for (int64_t j = 0; j < segs[s].len; j++) {
      const int64_t x = segs[s].g0 + j;
      while (x >= d->cu[i + 1]) i++;
      g[n++] = x;
      *work += work_of(tc, d, i, x, &moved);
    }
  }
  *last = ns ? segs[ns - 1] : (dsv4_range){0, 0};
  int64_t i0 = 0, P = dsv4_panel_rows(d->T);
  while (i0 < n) {
    const int64_t e = dsv4_chunk_end_of(g, n, P, i0);
    if (e == n) break;
    i0 = e;
  }
  *chunk = n - i0;
fail:
  free(segs);
  free(g);
  return rc;
}

typedef struct {
  double w;
  int q;
} ranked;

static int heavier_first(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->w != y->w) return x->w > y->w ? -1 : 1;
  return x->q - y->q;
}

void dsv4_offload_window(const dsv4_docs *docs, int W, const dsv4_offload *o, int64_t j, int32_t *start,
                         int32_t *len) {
  const int64_t g = o->g0 + j;
  const int i = dsv4_docs_find(docs, g);
  const int64_t t = g - docs->cu[i];
  const int64_t nw = t < docs->real[i] ? (t < W - 1 ? t : W - 1) + 1 : 0;
  *start = nw ? (int32_t)(g - nw + 1 - o->kv_g0) : 0;
  *len = (int32_t)nw;
}

/* The pair's moved rows: the suffix of the heavy rank's last segment (at most cap rows) whose moved
 * work comes nearest half the difference (the shortest such suffix); its kv range. */
static void pick_rows(const dsv4_token_cost *tc, const dsv4_docs *d, dsv4_range last, int64_t cap, double half,
                      dsv4_offload *o) {
  double cum = 0, best_gap = half, moved;
  int64_t best = 0;
  for (int64_t j = 1; j <= cap; j++) {
    const int64_t g = last.g0 + last.len - j;
    work_of(tc, d, dsv4_docs_find(d, g), g, &moved);
    cum += moved;
    const double gap = cum > half ? cum - half : half - cum;
    if (gap < best_gap) best_gap = gap, best = j, o->work_moved = cum;
    if (cum >= half) break;
  }
  o->m = best;
  o->g0 = last.g0 + last.len - best;
  int64_t lo = INT64_MAX, hi = 0;
  for (int64_t j = 0; j < best; j++) {
    int32_t s, n;
    dsv4_offload o1 = {.g0 = o->g0, .kv_g0 = 0};
    dsv4_offload_window(d, tc->W, &o1, j, &s, &n);
    if (!n) continue;
    lo = s < lo ? s : lo;
    hi = s + n > hi ? s + n : hi;
  }
  o->kv_g0 = lo == INT64_MAX ? 0 : lo;
  o->kv_rows = lo == INT64_MAX ? 0 : hi - lo;
}

dsv4_status dsv4_offload_plan(const dsv4_token_cost *tc, const dsv4_docs *docs, const dsv4_packing *pk,
                              dsv4_split split, int size, dsv4_offload *out) {
  dsv4_status rc = DSV4_OK;
  ranked *rk = NULL;
  dsv4_range *last = NULL;
  int64_t *chunk = NULL;
  for (int q = 0; q < size; q++) out[q] = (dsv4_offload){.peer = -1};
  const char *env = getenv("DSV4_OFFLOAD"); /* "0": never (to time the split alone) */
  if (size < 2 || !tc->sparse || (env && !strcmp(env, "0"))) return DSV4_OK;
  DSV4_ALLOC(rk, size);
  DSV4_ALLOC(last, size);
  DSV4_ALLOC(chunk, size);
  for (int q = 0; q < size; q++) {
    rk[q].q = q;
    DSV4_TRY(rank_summary(tc, docs, pk, split, q, size, &rk[q].w, &last[q], &chunk[q]));
  }
  qsort(rk, (size_t)size, sizeof *rk, heavier_first);
  for (int i = 0; i < size / 2; i++) {
    const int h = rk[i].q, l = rk[size - 1 - i].q;
    const double half = (rk[i].w - rk[size - 1 - i].w) / 2;
    if (!(half > 0)) continue;
    dsv4_offload o = {.peer = l, .heavy = 1, .work = {rk[i].w, rk[size - 1 - i].w}};
    pick_rows(tc, docs, last[h], last[h].len < chunk[h] ? last[h].len : chunk[h], half, &o);
    if (o.m == 0 || o.kv_rows == 0) continue; /* nothing worth a message */
    out[h] = o;
    out[l] = o;
    out[l].peer = h, out[l].heavy = 0;
  }
fail:
  free(rk);
  free(last);
  free(chunk);
  return rc;
}

size_t dsv4_offload_bytes(const dsv4_offload *o, int H, int D, int topk, int teacher, int threads) {
  if (o->peer < 0) return 0;
  const size_t f = sizeof(float), x = 2 * sizeof(int64_t) * (size_t)D * (size_t)o->kv_rows;
  const size_t nt = threads > 1 ? (size_t)threads : 1;
  if (o->heavy) return x; /* the window rows' exact sums as they come back */
  const size_t B = DSV4_OFFLOAD_BATCH, m = (size_t)o->m, HD = (size_t)H * (size_t)D;
  /* both directions: ids, windows, kv rows, lse; forward: two sets of q and o, the window state
   * and the teacher rows; backward: two sets of q, d o, o and d q, and the window sums' copies */
  const size_t common = sizeof(int32_t) * (m * (size_t)topk + 2 * m) + f * ((size_t)o->kv_rows * (size_t)D + m * (size_t)H);
  const size_t fwd = f * (4 * B * HD + 2 * B * (size_t)H + (teacher ? m * (size_t)topk : 0));
  const size_t bwd = f * 8 * B * HD + nt * x;
  return common + (fwd > bwd ? fwd : bwd);
}

void dsv4_offload_traffic(const dsv4_offload *o, int H, int D, int topk, int teacher, dsv4_cp_stats *s) {
  if (o->peer < 0) return;
  const uint64_t f = sizeof(float), m = (uint64_t)o->m, HD = (uint64_t)H * (uint64_t)D, K = (uint64_t)topk;
  const uint64_t nb = (m + DSV4_OFFLOAD_BATCH - 1) / DSV4_OFFLOAD_BATCH, st = sizeof(int64_t);
  const uint64_t common = sizeof(int32_t) * m * K + f * (uint64_t)o->kv_rows * (uint64_t)D; /* ids, kv rows */
  /* heavy -> light, light -> heavy: bytes and messages, forward then backward */
  const uint64_t fwd_out = common + f * m * HD, fwd_back = f * m * (HD + (uint64_t)H + (teacher ? K : 0)) + st;
  const uint64_t bwd_out = common + f * m * ((uint64_t)H + 3 * HD);
  const uint64_t bwd_back = f * m * HD + 2 * sizeof(int64_t) * (uint64_t)D * (uint64_t)o->kv_rows + st;
  const uint64_t n_fwd_out = 2 + nb, n_fwd_back = nb + 2 + (teacher ? 1 : 0), n_bwd_out = 3 + 3 * nb, n_bwd_back = nb + 2;
  const int F = DSV4_MSG_ATTN_OFFLOAD, B = DSV4_MSG_ATTN_OFFLOAD_BWD;
  s->bytes_sent[F] += o->heavy ? fwd_out : fwd_back, s->bytes_recv[F] += o->heavy ? fwd_back : fwd_out;
  s->bytes_sent[B] += o->heavy ? bwd_out : bwd_back, s->bytes_recv[B] += o->heavy ? bwd_back : bwd_out;
  s->messages[F] += o->heavy ? n_fwd_out : n_fwd_back;
  s->messages[B] += o->heavy ? n_bwd_out : n_bwd_back;
}

dsv4_status dsv4_cp_plan_offload(const dsv4_config *cfg, int layer, const dsv4_packing *pk, const dsv4_cp_config *cp,
                                 int size, dsv4_cp_offload *out) {
  static const dsv4_cp_config cp_defaults = DSV4_CP_CONFIG_INIT;
  dsv4_status rc = DSV4_OK;
  dsv4_config c;
  dsv4_packing p;
  dsv4_cp_config k = cp_defaults;
  dsv4_docs docs = {0};
  dsv4_offload *all = NULL;
  dsv4_token_cost tc;
  DSV4_CHECK(cfg && pk && out, DSV4_ERR_ARG, "plan: NULL argument");
  DSV4_CHECK(size >= 1, DSV4_ERR_ARG, "plan: bad rank count %d", size);
  DSV4_TRY(dsv4_config_in(&c, cfg));
  DSV4_TRY(DSV4_STRUCT_IN(&p, pk, dsv4_packing, NULL));
  if (cp) DSV4_TRY(DSV4_STRUCT_IN(&k, cp, dsv4_cp_config, &cp_defaults));
  DSV4_TRY(DSV4_STRUCT_CHECK(out, dsv4_cp_offload));
  const size_t stride = out->struct_size; /* the caller's array (its first element's size) */
  DSV4_TRY(dsv4_token_cost_of(&c, layer, &tc));
  DSV4_TRY(dsv4_docs_build(&docs, &p, tc.r));
  DSV4_ALLOC(all, size);
  DSV4_TRY(dsv4_offload_plan(&tc, &docs, &p, k.split, size, all));
  for (int q = 0; q < size; q++) {
    const dsv4_offload *o = &all[q];
    dsv4_cp_offload r = {DSV4_HEAD(dsv4_cp_offload), .peer = o->peer, .heavy = o->heavy, .rows = o->m,
                         .work_heavy = o->work[0], .work_light = o->work[1], .work_moved = o->work_moved};
    dsv4_cp_offload *dst = (dsv4_cp_offload *)((char *)out + stride * (size_t)q);
    dst->struct_size = (uint32_t)stride;
    dst->struct_version = DSV4_STRUCT_VERSION;
    DSV4_TRY(DSV4_STRUCT_OUT(dst, &r, dsv4_cp_offload));
  }
fail:
  free(all);
  dsv4_docs_free(&docs);
  return rc;
}
