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

/* One rank's rows in local order (global indices), its estimated work and its row chunks. */
typedef struct {
  int64_t n, *g;
  uint8_t *seg_first;      /* [n] 1: the row starts a segment */
  int64_t n_chunk, *chunk; /* [n_chunk + 1] boundaries */
  double work;
} rank_rows;

static void rank_rows_free(rank_rows *r) {
  free(r->g), free(r->seg_first), free(r->chunk);
  memset(r, 0, sizeof *r);
}

static dsv4_status rank_summary(const dsv4_token_cost *tc, const dsv4_docs *d, const dsv4_packing *pk,
                                dsv4_split split, int q, int size, rank_rows *r) {
  dsv4_status rc = DSV4_OK;
  dsv4_range *segs = NULL;
  int ns = 0;
  double moved;
  memset(r, 0, sizeof *r);
  DSV4_TRY(dsv4_shard_segments(pk, split, q, size, &segs, &ns));
  for (int s = 0; s < ns; s++) r->n += segs[s].len;
  DSV4_ALLOC(r->g, r->n + 1);
  DSV4_ALLOC(r->seg_first, r->n + 1);
  int64_t n = 0;
  for (int s = 0; s < ns; s++) {
    int i = dsv4_docs_find(d, segs[s].g0);
    r->seg_first[n] = 1;
    for (int64_t j = 0; j < segs[s].len; j++) {
      const int64_t x = segs[s].g0 + j;
      while (x >= d->cu[i + 1]) i++;
      r->g[n++] = x;
      r->work += work_of(tc, d, i, x, &moved);
    }
  }
  const int64_t P = dsv4_panel_rows(d->T);
  for (int64_t i0 = 0; i0 < r->n; i0 = dsv4_chunk_end_of(r->g, r->n, P, i0)) r->n_chunk++;
  DSV4_ALLOC(r->chunk, r->n_chunk + 1);
  r->n_chunk = 0;
  for (int64_t i0 = 0; i0 < r->n; i0 = dsv4_chunk_end_of(r->g, r->n, P, i0)) r->chunk[r->n_chunk++] = i0;
  r->chunk[r->n_chunk] = r->n;
fail:
  free(segs);
  if (rc != DSV4_OK) rank_rows_free(r);
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

void dsv4_offload_window(const dsv4_docs *docs, int W, const dsv4_offload_part *p, int64_t j, int32_t *start,
                         int32_t *len) {
  const int64_t g = p->g0 + j;
  const int i = dsv4_docs_find(docs, g);
  const int64_t t = g - docs->cu[i];
  const int64_t nw = t < docs->real[i] ? (t < W - 1 ? t : W - 1) + 1 : 0;
  *start = nw ? (int32_t)(g - nw + 1 - p->kv_g0) : 0;
  *len = (int32_t)nw;
}

/* The end of heavy chunk [c0, c1) whose moved work comes nearest `want` (the shortest such run of
 * rows of one segment); *got: its moved work. 0 rows when none helps. */
static int64_t pick_rows(const dsv4_token_cost *tc, const dsv4_docs *d, const rank_rows *h, int64_t c0, int64_t c1,
                         double want, double *got) {
  double cum = 0, best_gap = want, moved;
  int64_t best = 0;
  *got = 0;
  for (int64_t j = 1; j <= c1 - c0; j++) {
    const int64_t i = c1 - j, g = h->g[i];
    /* one segment's rows (the kv rows their windows read are then one run of its extended buffer) */
    if (j > 1 && h->seg_first[i + 1]) break;
    work_of(tc, d, dsv4_docs_find(d, g), g, &moved);
    cum += moved;
    const double gap = cum > want ? cum - want : want - cum;
    if (gap < best_gap) best_gap = gap, best = j, *got = cum;
    if (cum >= want) break;
  }
  return best;
}

/* The part of rows [f, f + m) of the heavy rank: global start and kv range (0 rows: only padding). */
static dsv4_offload_part part_of(const dsv4_docs *d, int W, const rank_rows *h, int64_t f, int64_t m) {
  dsv4_offload_part p = {.f = f, .m = m, .g0 = h->g[f]};
  int64_t lo = INT64_MAX, hi = 0;
  for (int64_t j = 0; j < m; j++) {
    int32_t s, n;
    dsv4_offload_window(d, W, &p, j, &s, &n); /* kv_g0 = 0: absolute rows */
    if (!n) continue;
    lo = s < lo ? s : lo;
    hi = s + n > hi ? s + n : hi;
  }
  p.kv_g0 = lo == INT64_MAX ? 0 : lo;
  p.kv_rows = lo == INT64_MAX ? 0 : hi - lo;
  return p;
}

/* The pair's parts: each heavy chunk's end carries an equal share of half the gap (cumulative
 * targets, so the shares' rounding does not add up), computed by the light rank after its chunk of
 * the same index. */
static dsv4_status pair_parts(const dsv4_token_cost *tc, const dsv4_docs *d, const rank_rows *h, const rank_rows *l,
                              double half, dsv4_offload *o) {
  dsv4_status rc = DSV4_OK;
  DSV4_ALLOC(o->part, h->n_chunk + 1);
  double done = 0;
  for (int64_t k = 0; k < h->n_chunk; k++) {
    const double want = half * (double)(k + 1) / (double)h->n_chunk - done;
    double got;
    if (want <= 0) continue;
    const int64_t m = pick_rows(tc, d, h, h->chunk[k], h->chunk[k + 1], want, &got);
    if (m == 0) continue;
    const dsv4_offload_part p = part_of(d, tc->W, h, h->chunk[k + 1] - m, m);
    if (p.kv_rows == 0) continue; /* only padding: nothing worth a message */
    const int64_t j = k < l->n_chunk ? k : l->n_chunk - 1;
    o->part[o->n_part] = p;
    o->part[o->n_part++].light_end = l->chunk[j + 1];
    o->m += m;
    done += got;
  }
  o->work_moved = done;
fail:
  return rc;
}

void dsv4_offload_free(dsv4_offload *o) {
  free(o->part);
  *o = (dsv4_offload){.peer = -1};
}

void dsv4_offload_free_all(dsv4_offload *all, int n) {
  if (all)
    for (int q = 0; q < n; q++) dsv4_offload_free(&all[q]);
  free(all);
}

dsv4_status dsv4_offload_plan(const dsv4_token_cost *tc, const dsv4_docs *docs, const dsv4_packing *pk,
                              dsv4_split split, int size, dsv4_offload *out) {
  dsv4_status rc = DSV4_OK;
  ranked *rk = NULL;
  rank_rows *rows = NULL;
  for (int q = 0; q < size; q++) out[q] = (dsv4_offload){.peer = -1};
  if (!dsv4_offload_enabled(tc, size)) return DSV4_OK;
  DSV4_ALLOC(rk, size);
  DSV4_ALLOC(rows, size);
  for (int q = 0; q < size; q++) {
    rk[q].q = q;
    DSV4_TRY(rank_summary(tc, docs, pk, split, q, size, &rows[q]));
    rk[q].w = rows[q].work;
  }
  qsort(rk, (size_t)size, sizeof *rk, heavier_first);
  for (int i = 0; i < size / 2; i++) {
    const int h = rk[i].q, l = rk[size - 1 - i].q;
    const double half = (rk[i].w - rk[size - 1 - i].w) / 2;
    if (!(rk[i].w > DSV4_OFFLOAD_MIN_GAP * rk[size - 1 - i].w)) continue;
    dsv4_offload o = {.peer = l, .heavy = 1, .work = {rk[i].w, rk[size - 1 - i].w}};
    rc = pair_parts(tc, docs, &rows[h], &rows[l], half, &o);
    if (rc != DSV4_OK || o.n_part == 0) {
      free(o.part);
      DSV4_TRY(rc);
      continue;
    }
    out[h] = o;
    out[l] = o;
    out[l].peer = h, out[l].heavy = 0;
    DSV4_ALLOC(out[l].part, o.n_part);
    memcpy(out[l].part, o.part, sizeof *o.part * (size_t)o.n_part);
  }
fail:
  if (rows)
    for (int q = 0; q < size; q++) rank_rows_free(&rows[q]);
  free(rows);
  free(rk);
  if (rc != DSV4_OK)
    for (int q = 0; q < size; q++) dsv4_offload_free(&out[q]);
  return rc;
}

int dsv4_offload_enabled(const dsv4_token_cost *tc, int size) {
  const char *env = getenv("DSV4_OFFLOAD"); /* "0": never (to time the split alone) */
  return size > 1 && tc->sparse && !(env && !strcmp(env, "0"));
}

size_t dsv4_offload_bytes_max(const dsv4_token_cost *tc, int64_t n_local, int H, int D, int teacher, int threads) {
  const size_t f = sizeof(float), nt = threads > 1 ? (size_t)threads : 1, B = DSV4_OFFLOAD_BATCH;
  const size_t HD = (size_t)H * (size_t)D, K = (size_t)tc->topk;
  const size_t m = (size_t)(n_local < DSV4_CHUNK_ROWS ? n_local : DSV4_CHUNK_ROWS), kv = m + (size_t)tc->W - 1;
  const size_t x = 2 * sizeof(int64_t) * (size_t)D * kv; /* a part's window sums (the heavy rank's too) */
  /* both directions: ids, windows, kv rows, lse; forward: two sets of q and o, the window state
   * and the teacher rows; backward: two sets of q, d o, o and d q, and the window sums' copies */
  const size_t common = sizeof(int32_t) * (m * K + 2 * m) + f * (kv * (size_t)D + m * (size_t)H);
  const size_t fwd = f * (4 * B * HD + 2 * B * (size_t)H + (teacher ? m * K : 0));
  const size_t bwd = f * 8 * B * HD + nt * x;
  return common + (fwd > bwd ? fwd : bwd);
}

void dsv4_offload_traffic(const dsv4_offload *o, int H, int D, int topk, int teacher, dsv4_cp_stats *s) {
  const uint64_t f = sizeof(float), HD = (uint64_t)H * (uint64_t)D, K = (uint64_t)topk, st = sizeof(int64_t);
  const int F = DSV4_MSG_ATTN_OFFLOAD, B = DSV4_MSG_ATTN_OFFLOAD_BWD;
  for (int i = 0; i < o->n_part; i++) {
    const dsv4_offload_part *p = &o->part[i];
    const uint64_t m = (uint64_t)p->m, nb = (m + DSV4_OFFLOAD_BATCH - 1) / DSV4_OFFLOAD_BATCH;
    const uint64_t common = sizeof(int32_t) * m * K + f * (uint64_t)p->kv_rows * (uint64_t)D; /* ids, kv rows */
    /* heavy -> light, light -> heavy: bytes and messages, forward then backward */
    const uint64_t fwd_out = common + f * m * HD, fwd_back = f * m * (HD + (uint64_t)H + (teacher ? K : 0)) + st;
    const uint64_t bwd_out = common + f * m * ((uint64_t)H + 3 * HD);
    const uint64_t bwd_back = f * m * HD + 2 * sizeof(int64_t) * (uint64_t)D * (uint64_t)p->kv_rows + st;
    const uint64_t n_fwd_out = 2 + nb, n_fwd_back = nb + 2 + (teacher ? 1 : 0), n_bwd_out = 3 + 3 * nb;
    const uint64_t n_bwd_back = nb + 2;
    s->bytes_sent[F] += o->heavy ? fwd_out : fwd_back, s->bytes_recv[F] += o->heavy ? fwd_back : fwd_out;
    s->bytes_sent[B] += o->heavy ? bwd_out : bwd_back, s->bytes_recv[B] += o->heavy ? bwd_back : bwd_out;
    s->messages[F] += o->heavy ? n_fwd_out : n_fwd_back;
    s->messages[B] += o->heavy ? n_bwd_out : n_bwd_back;
  }
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
  dsv4_offload_free_all(all, size);
  dsv4_docs_free(&docs);
  return rc;
}
