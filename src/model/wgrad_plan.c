/* wgrad_plan.c: the weight gradients' messages of one layer backward, for every rank, from the
 * ranks' layouts alone (the planner's part of wgrad.h: dsv4_wgrad_traffic). It walks the products
 * the backward forms (layer.c, select.c, stage1.c) and the paths wgrad.c takes for each (rows to the
 * blocks' owners, or exact sums reduce-scattered; a recomputed backward's sinks), and counts what
 * each path sends the way cp/exchange.h counts it. The benchmark and the CP sweep test check that
 * this equals what the backward measures, kind by kind. */
#include <stdlib.h>
#include <string.h>

#include "model/weights.h"
#include "util/err.h"
#include "util/gemm.h"
#include "wgrad_int.h"

/* One rank's runs of a product's rows (g0, len pairs: consecutive global rows of one panel), as
 * wgrad.c's runs_of cuts them. */
typedef struct {
  int64_t *run; /* [2 n] */
  int64_t n;
} pruns;

static void pruns_free(pruns *r, int size) {
  for (int q = 0; r && q < size; q++) free(r[q].run);
  free(r);
}

/* Appends [g0, g0 + len) cut at multiples of P; merge: a piece that continues the last run (the next
 * global row, same panel) extends it, as runs of one wpiece do. */
static dsv4_status add_piece(pruns *r, int64_t *cap, int64_t g0, int64_t len, int64_t P, int merge) {
  dsv4_status rc = DSV4_OK;
  for (int64_t g = g0; g < g0 + len;) {
    const int64_t end = (g / P + 1) * P < g0 + len ? (g / P + 1) * P : g0 + len;
    if (merge && g % P && r->n && r->run[2 * (r->n - 1)] + r->run[2 * (r->n - 1) + 1] == g) {
      r->run[2 * (r->n - 1) + 1] += end - g;
    } else {
      if (r->n == *cap) {
        int64_t *t = realloc(r->run, sizeof(int64_t) * (size_t)(2 * (*cap * 2 + 8)));
        DSV4_CHECK(t, DSV4_ERR_NOMEM, "plan: out of memory for weight-gradient runs");
        r->run = t, *cap = *cap * 2 + 8;
      }
      r->run[2 * r->n] = g, r->run[2 * r->n + 1] = end - g, r->n++;
    }
    merge = 1;
    g = end;
  }
fail:
  return rc;
}

typedef enum { ROWS_TOKENS, ROWS_SEGMENTS, ROWS_SLOTS } rows_of;

/* Every rank's runs of a product over its token rows (one piece: layer.c, select.c), over its
 * segments (one piece each: stage1.c's compressors) or over the slots its segments own (V4.1's
 * indexer keys, over compressed ids). */
static dsv4_status runs_all(const dsv4_layout *lays, int size, rows_of what, int64_t P, pruns **out) {
  dsv4_status rc = DSV4_OK;
  pruns *r = NULL;
  DSV4_ALLOC(r, size);
  for (int q = 0; q < size; q++) {
    int64_t cap = 0;
    for (int s = 0; s < lays[q].n_seg; s++) {
      const dsv4_seg *sg = &lays[q].seg[s];
      const int64_t g0 = what == ROWS_SLOTS ? sg->id0 : sg->g0, len = what == ROWS_SLOTS ? sg->n_own : sg->len;
      DSV4_TRY(add_piece(&r[q], &cap, g0, len, P, what == ROWS_TOKENS && s > 0));
    }
  }
  *out = r;
  r = NULL;
fail:
  pruns_free(r, size);
  return rc;
}

static void count(dsv4_cp_stats *st, dsv4_msg_kind k, uint64_t sent, uint64_t recv, uint64_t msgs) {
  st->bytes_sent[k] += sent, st->bytes_recv[k] += recv, st->messages[k] += msgs;
}

/* dsv4_wg_gather_lists with cnt[q] runs on rank q: one all-gather of a fixed record, a second of
 * the longest list when some rank has more than the record holds. */
static void lists(dsv4_cp_stats *out, int size, const int64_t *cnt) {
  const uint64_t N1 = (uint64_t)(size - 1);
  int64_t cmax = 0;
  for (int q = 0; q < size; q++) cmax = cnt[q] > cmax ? cnt[q] : cmax;
  for (int q = 0; q < size; q++) {
    count(&out[q], DSV4_MSG_WGRAD_ROWS, N1 * 8 * (1 + 2 * DSV4_WG_RUNS_INLINE),
          N1 * 8 * (1 + 2 * DSV4_WG_RUNS_INLINE), 1);
    if (cmax > DSV4_WG_RUNS_INLINE) count(&out[q], DSV4_MSG_WGRAD_ROWS, N1 * 16 * cmax, N1 * 16 * cmax, 1);
  }
}

/* wgrad.c's gather_partials: the runs that are not a whole panel go to the panel's owner (the rank
 * of its lowest partial row), A and B rows in two messages. */
static dsv4_status partials(dsv4_cp_stats *out, int size, const dsv4_wshape *s, const pruns *r) {
  dsv4_status rc = DSV4_OK;
  const int64_t n_panels = (s->T + s->P - 1) / s->P;
  int64_t *cnt = NULL, *owner = NULL, *low = NULL;
  DSV4_ALLOC(cnt, size);
  DSV4_ALLOC(owner, n_panels + 1);
  DSV4_ALLOC(low, n_panels + 1);
  int64_t total = 0;
  for (int64_t p = 0; p < n_panels; p++) owner[p] = -1, low[p] = INT64_MAX;
  for (int q = 0; q < size; q++)
    for (int64_t j = 0; j < r[q].n; j++) {
      const int64_t g0 = r[q].run[2 * j], p = g0 / s->P;
      if (r[q].run[2 * j + 1] == extent(s, p)) continue;
      cnt[q]++, total++;
      if (g0 < low[p]) low[p] = g0, owner[p] = q;
    }
  lists(out, size, cnt);
  const uint64_t row = sizeof(float) * (uint64_t)(s->M + s->N);
  for (int q = 0; q < size && total; q++)
    for (int64_t j = 0; j < r[q].n; j++) {
      const int64_t p = r[q].run[2 * j] / s->P, len = r[q].run[2 * j + 1];
      if (len == extent(s, p) || owner[p] == q) continue;
      count(&out[q], DSV4_MSG_WGRAD_ROWS, (uint64_t)len * row, 0, 2);
      count(&out[owner[p]], DSV4_MSG_WGRAD_ROWS, 0, (uint64_t)len * row, 0);
    }
fail:
  free(cnt), free(owner), free(low);
  return rc;
}

/* wgrad.c's superblocks: DSV4_WG_SUPER_BLOCKS blocks' int64 sums reduce-scattered in N slices of
 * rows, the rounded floats all-gathered. */
static void superblocks(dsv4_cp_stats *out, int size, const dsv4_wshape *s) {
  const blocking bl = dsv4_wg_blocks(s);
  const int64_t nblocks = bl.bm * bl.bn;
  const uint64_t N1 = (uint64_t)(size - 1);
  for (int64_t b0 = 0; b0 < nblocks; b0 += DSV4_WG_SUPER_BLOCKS) {
    const int64_t nbk = nblocks - b0 < DSV4_WG_SUPER_BLOCKS ? nblocks - b0 : DSV4_WG_SUPER_BLOCKS;
    const wsuper sp = dsv4_wg_super(&bl, nbk, size);
    const uint64_t rs = N1 * sizeof(int64_t) * (uint64_t)(sp.rows * 2 * bl.nb), ag = N1 * sizeof(float) * (uint64_t)sp.fslice;
    for (int q = 0; q < size; q++) {
      count(&out[q], DSV4_MSG_WGRAD_SUMS, rs, rs, 1);
      count(&out[q], DSV4_MSG_WGRAD_ALLGATHER, ag, ag, 1);
    }
  }
}

/* A product sink's sums at finish (wgrad.c dsum_store): per chunk of rows, a reduce-scatter of the
 * int64 sums in N slices and an all-gather of the rounded floats. */
static void sink_sums(dsv4_cp_stats *out, int size, const dsv4_wshape *s) {
  const wdsum ds = dsv4_wg_dsum(s->M, s->N, size);
  const uint64_t N1 = (uint64_t)(size - 1);
  for (int64_t r0 = 0; r0 < s->M; r0 += ds.step) {
    const int64_t nr = s->M - r0 < ds.step ? s->M - r0 : ds.step, R = (nr + size - 1) / size;
    const uint64_t rs = N1 * sizeof(int64_t) * (uint64_t)(R * 2 * s->N), ag = N1 * sizeof(float) * (uint64_t)(R * s->N);
    for (int q = 0; q < size; q++) {
      count(&out[q], DSV4_MSG_WGRAD_SUMS, rs, rs, 1);
      count(&out[q], DSV4_MSG_WGRAD_ALLGATHER, ag, ag, 1);
    }
  }
}

/* One product C [M, N] += sum A^T B over rows `what` of every rank: dsv4_wgrad_exact's messages, or
 * (sink) those of a recomputed backward's product sink. */
static dsv4_status product(dsv4_cp_stats *out, const dsv4_layout *lays, int size, int64_t M, int64_t N, int64_t P,
                           int64_t T, rows_of what, int sink) {
  dsv4_status rc = DSV4_OK;
  pruns *r = NULL;
  int64_t *cnt = NULL;
  if (M <= 0 || N <= 0) return DSV4_OK;
  const dsv4_wshape s = {M, N, P, T};
  DSV4_TRY(runs_all(lays, size, what, P, &r));
  if (!sink && dsv4_wg_rows_cheaper(&s, size)) { /* every run's rows to the owners of the blocks */
    DSV4_ALLOC(cnt, size);
    for (int q = 0; q < size; q++) cnt[q] = r[q].n;
    lists(out, size, cnt);
    for (int q = 0; q < size; q++) { /* now rows per rank */
      cnt[q] = 0;
      for (int64_t j = 0; j < r[q].n; j++) cnt[q] += r[q].run[2 * j + 1];
    }
    dsv4_wg_rows_traffic(&s, size, cnt, out);
    goto fail;
  }
  DSV4_TRY(partials(out, size, &s, r));
  if (sink) sink_sums(out, size, &s);
  else superblocks(out, size, &s);
fail:
  pruns_free(r, size);
  free(cnt);
  return rc;
}

dsv4_status dsv4_wgrad_traffic(const dsv4_config *cf, const dsv4_layer_info *in, const dsv4_docs *docs,
                               const dsv4_layout *lays, int size, int recompute, int64_t partial_max,
                               dsv4_cp_stats *out) {
  dsv4_status rc = DSV4_OK;
  if (size < 2) return DSV4_OK;
  const int r = docs->ratio, v41 = cf->v41 != 0;
  const int64_t d = cf->dim, H = cf->n_heads, D = cf->head_dim, G = cf->o_groups, Ro = cf->o_lora_rank;
  const int64_t dq = cf->q_lora_rank, Hi = cf->index_n_heads, Di = cf->index_head_dim, HGD = H / G * D;
  const int64_t T = docs->T, P = dsv4_panel_rows(T);
  /* what the layer's backward forms (model/arenas.c dsv4_dims_of) */
  const int compresses = v41 ? in->role == DSV4_ROLE_FULL : r > 0, gate = !v41 || r > 1;
  const int v4_keys = !v41 && r == 4, v41_keys = v41 && in->role == DSV4_ROLE_FULL, selects = in->selects;
  /* recomputation without kept rows: wo_a's groups, wq_b and the indexer queries' projections go into
   * product sinks (layer.c layer_sinks, core_bwd.c begin_sinks) */
  const int sinks = recompute && !dsv4_wgrad_keep_rows(cf, selects, lays[0].n, partial_max);
  DSV4_TRY(product(out, lays, size, d, G * Ro, P, T, ROWS_TOKENS, 0)); /* wo_b */
  DSV4_TRY(product(out, lays, size, D, d, P, T, ROWS_TOKENS, 0));      /* wkv */
  DSV4_TRY(product(out, lays, size, dq, d, P, T, ROWS_TOKENS, 0));     /* wq_a */
  for (int64_t g = 0; g < G; g++) DSV4_TRY(product(out, lays, size, Ro, HGD, P, T, ROWS_TOKENS, sinks)); /* wo_a */
  DSV4_TRY(product(out, lays, size, H * D, dq, P, T, ROWS_TOKENS, sinks)); /* wq_b */
  if (selects) { /* the indexer's query projections: weights_proj, wq_b */
    DSV4_TRY(product(out, lays, size, Hi, d, P, T, ROWS_TOKENS, sinks));
    DSV4_TRY(product(out, lays, size, Hi * Di, dq, P, T, ROWS_TOKENS, sinks));
  }
  if (compresses) { /* the compressor's wkv and wgate over each segment's rows */
    const int64_t cD = (r == 4 ? 2 : 1) * D;
    DSV4_TRY(product(out, lays, size, cD, d, P, T, ROWS_SEGMENTS, 0));
    if (gate) DSV4_TRY(product(out, lays, size, cD, d, P, T, ROWS_SEGMENTS, 0));
  }
  if (v4_keys) { /* the indexer's compressor, c = 2 */
    DSV4_TRY(product(out, lays, size, 2 * Di, d, P, T, ROWS_SEGMENTS, 0));
    DSV4_TRY(product(out, lays, size, 2 * Di, d, P, T, ROWS_SEGMENTS, 0));
  }
  if (v41_keys) /* indexer.wk over the owned slots' compressed ids */
    DSV4_TRY(product(out, lays, size, Di, D, dsv4_panel_rows(docs->n_cmp), docs->n_cmp, ROWS_SLOTS, 0));
  /* the vector gradients' exact sums and the ranks' bad-term flags, one all-reduce (wgrad.c
   * dsv4_wsinks_finish): sink, compressor ape and norm, indexer ape and norm or k_norm, q_norm,
   * kv_norm */
  int64_t nv = H + dq + D;
  if (compresses) nv += (v41 ? 0 : r * (r == 4 ? 2 : 1) * D) + D;
  if (v4_keys) nv += 4 * 2 * Di + Di;
  if (v41_keys) nv += Di;
  const uint64_t v = dsv4_xfer_allreduce_volume(sizeof(int64_t) * (uint64_t)(2 * nv + 1), size);
  for (int q = 0; q < size; q++) count(&out[q], DSV4_MSG_WGRAD_SUMS, v, v, 1);
fail:
  return rc;
}
