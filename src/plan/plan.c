/* plan.c: builds the plan of one forward on one rank (plan.h) from its key: every rank's layout
 * from the split, the gather index, the halo plans, then this rank's token map, query windows,
 * visible compressed ranges, owned slot table, chunks and RoPE table. Host arithmetic on global
 * meta only: every rank builds the same plans without a message. */
#include <string.h>

#include "plan.h"
#include "shard.h"
#include "util/err.h"
#include "util/gemm.h"

/* k's own copies of n_docs + 1 cu_seqlens and (when given) n_docs seqlens_real entries. */
static dsv4_status copy_docs(dsv4_plan_key *k, const int32_t *cu, const int32_t *real) {
  dsv4_status rc = DSV4_OK;
  DSV4_ALLOC(k->cu, k->n_docs + 1);
  memcpy(k->cu, cu, sizeof(int32_t) * (size_t)(k->n_docs + 1));
  if (real) {
    DSV4_ALLOC(k->real, k->n_docs);
    memcpy(k->real, real, sizeof(int32_t) * (size_t)k->n_docs);
  }
fail:
  return rc;
}

dsv4_status dsv4_plan_key_set(dsv4_plan_key *k, const dsv4_packing *pk, int64_t n_local, int ratio, int window,
                              dsv4_split split, int rank, int size) {
  dsv4_status rc = DSV4_OK;
  memset(k, 0, sizeof *k);
  DSV4_CHECK(pk, DSV4_ERR_ARG, "packing meta is NULL");
  DSV4_CHECK(pk->T > 0, DSV4_ERR_ARG, "T must be positive (got %lld)", (long long)pk->T);
  DSV4_CHECK(n_local >= 0, DSV4_ERR_ARG, "negative local row count %lld", (long long)n_local);
  DSV4_CHECK(size >= 1 && rank >= 0 && rank < size, DSV4_ERR_ARG, "bad rank %d of %d", rank, size);
  DSV4_CHECK(split == DSV4_SPLIT_CONTIGUOUS || split == DSV4_SPLIT_ZIGZAG, DSV4_ERR_ARG, "unknown split %d",
             (int)split);
  k->T = pk->T;
  k->n_local = n_local;
  k->batched = pk->batched != 0;
  k->ratio = ratio;
  k->window = window;
  k->split = size == 1 ? DSV4_SPLIT_CONTIGUOUS : split; /* one rank holds everything, whatever the split */
  k->rank = rank;
  k->size = size;
  if (pk->cu_seqlens) {
    /* bounded before reading: n_docs entries of documents of at least one token each */
    DSV4_CHECK(pk->n_docs >= 1 && pk->n_docs <= pk->T, DSV4_ERR_ARG,
               "cu_seqlens must describe 1 .. T = %lld documents (n_docs = %d)", (long long)pk->T, pk->n_docs);
    k->n_docs = pk->n_docs;
    k->has_real = pk->seqlens_real != NULL;
    DSV4_TRY(copy_docs(k, pk->cu_seqlens, pk->seqlens_real));
  }
  return DSV4_OK;
fail:
  dsv4_plan_key_free(k);
  return rc;
}

dsv4_status dsv4_plan_key_copy(dsv4_plan_key *dst, const dsv4_plan_key *src) {
  dsv4_status rc = DSV4_OK;
  *dst = *src;
  dst->cu = dst->real = NULL;
  if (src->cu) DSV4_TRY(copy_docs(dst, src->cu, src->real));
  return DSV4_OK;
fail:
  dsv4_plan_key_free(dst);
  return rc;
}

void dsv4_plan_key_free(dsv4_plan_key *k) {
  free(k->cu);
  free(k->real);
  memset(k, 0, sizeof *k);
}

int dsv4_plan_key_equal(const dsv4_plan_key *a, const dsv4_plan_key *b) {
  if (a->T != b->T || a->n_local != b->n_local || a->n_docs != b->n_docs || a->batched != b->batched ||
      a->has_real != b->has_real || a->ratio != b->ratio || a->window != b->window || a->rank != b->rank ||
      a->size != b->size || a->split != b->split)
    return 0;
  if (a->n_docs && memcmp(a->cu, b->cu, sizeof(int32_t) * (size_t)(a->n_docs + 1))) return 0;
  if (a->has_real && memcmp(a->real, b->real, sizeof(int32_t) * (size_t)a->n_docs)) return 0;
  return 1;
}

void dsv4_plan_free(dsv4_plan *p) {
  dsv4_plan_key_free(&p->key);
  dsv4_docs_free(&p->docs);
  dsv4_layout_free(&p->lay);
  for (int k = 0; k < DSV4_HALO_KINDS; k++) dsv4_halo_plan_free(&p->halo[k]);
  free(p->global);
  free(p->doc);
  free(p->pos);
  free(p->real);
  free(p->win_start);
  free(p->win_len);
  free(p->cmp_begin);
  free(p->cmp_count);
  free(p->slot_cur);
  free(p->slot_prev);
  free(p->slot_pos);
  free(p->slot_blk);
  free(p->slot_gid);
  free(p->blk_id);
  free(p->chunk);
  dsv4_rope_free(&p->rope);
  memset(p, 0, sizeof *p);
}

/* Token map: global index, document, position and real flag of each local row, segment by segment. */
static dsv4_status token_map(dsv4_plan *p) {
  dsv4_status rc = DSV4_OK;
  const dsv4_layout *lay = &p->lay;
  const int64_t n = lay->n;
  DSV4_ALLOC(p->global, n);
  DSV4_ALLOC(p->doc, n);
  DSV4_ALLOC(p->pos, n);
  DSV4_ALLOC(p->real, n);
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    int doc = dsv4_docs_find(&p->docs, sg->g0);
    for (int64_t i = 0; i < sg->len; i++) {
      const int64_t row = sg->lo + i, g = sg->g0 + i;
      while (g >= p->docs.cu[doc + 1]) doc++;
      p->global[row] = g;
      p->doc[row] = doc;
      p->pos[row] = (int32_t)(g - p->docs.cu[doc]);
      p->real[row] = p->pos[row] < p->docs.real[doc];
    }
  }
fail:
  return rc;
}

/* Window of every local row in kv_ext (docs/spec.md section 3 step 4, clamped to the document
 * start; padding rows get none), and the visible compressed range: the slots of its document that
 * end at or before it. */
static dsv4_status query_ranges(dsv4_plan *p) {
  dsv4_status rc = DSV4_OK;
  const dsv4_layout *lay = &p->lay;
  const int W = p->key.window, r = p->key.ratio;
  DSV4_ALLOC(p->win_start, p->n);
  DSV4_ALLOC(p->win_len, p->n);
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    for (int64_t i = 0; i < sg->len; i++) {
      const int64_t row = sg->lo + i, ext = sg->kv_row + sg->win_halo + i, pos = p->pos[row];
      const int64_t len = p->real[row] ? (pos < W - 1 ? pos : W - 1) + 1 : 0;
      p->win_len[row] = (int32_t)len;
      p->win_start[row] = (int32_t)(len ? ext - len + 1 : ext);
      p->max_win = len > p->max_win ? len : p->max_win;
    }
  }
  if (r > 0) {
    DSV4_ALLOC(p->cmp_begin, p->n);
    DSV4_ALLOC(p->cmp_count, p->n);
    for (int64_t i = 0; i < p->n; i++) {
      p->cmp_begin[i] = (int32_t)p->docs.cu_cmp[p->doc[i]];
      p->cmp_count[i] = p->real[i] ? (p->pos[i] + 1) / r : 0;
      p->max_cmp = p->cmp_count[i] > p->max_cmp ? p->cmp_count[i] : p->max_cmp;
    }
  }
fail:
  return rc;
}

/* The slots this rank owns, in global id order: the first row of their own window in C/Z_ext, of
 * their previous window (r == 4, j > 0; -1 otherwise), the RoPE position j r and their row in the
 * local slot buffer.
 * Worked example (plan/layout.c): r = 4, one document of 16, N = 8, W = 4; rank 3 holds [6, 8) with
 * c_halo = 6 (global rows 0..5 in C/Z_ext rows 0..5, own rows 6, 7 in rows 6, 7) and owns slot 1:
 * own window [4, 8) -> cur row 4, previous window [0, 4) -> prev row 0, position 4, slot buffer
 * row 0. */
static dsv4_status slot_table(dsv4_plan *p) {
  dsv4_status rc = DSV4_OK;
  const dsv4_layout *lay = &p->lay;
  const dsv4_docs *docs = &p->docs;
  const int r = p->key.ratio;
  DSV4_ALLOC(p->slot_cur, lay->n_own);
  DSV4_ALLOC(p->slot_prev, lay->n_own);
  DSV4_ALLOC(p->slot_pos, lay->n_own);
  DSV4_ALLOC(p->slot_blk, lay->n_own);
  DSV4_ALLOC(p->slot_gid, lay->n_own);
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
      p->slot_cur[n] = (int32_t)cur;
      p->slot_prev[n] = (int32_t)(r == 4 && j > 0 ? cur - r : -1);
      p->slot_pos[n] = (int32_t)(j * r);
      p->slot_blk[n] = (int32_t)(sg->blk0 + k);
      p->slot_gid[n] = sg->id0 + k;
      n++;
    }
  }
  p->n_slot = n;
fail:
  return rc;
}

/* A chunk takes local rows while their positions in their global panels (global index mod P) are
 * all different: its rows then fill exactly one panel-shaped call of every row product (util/gemm.c
 * groups partial panels at disjoint positions), so no chunk pays for a panel twice. A zigzag rank's
 * two half panels at complementary positions are one chunk; an aligned shard's chunks are its
 * panels. */
int64_t dsv4_chunk_end_of(const int64_t *g, int64_t n, int64_t P, int64_t i0) {
  uint64_t used[DSV4_CHUNK_ROWS / 64] = {0};
  int64_t i = i0;
  for (; i < n && i - i0 < DSV4_CHUNK_ROWS; i++) {
    const int64_t pos = g[i] % P;
    if (used[pos / 64] >> (pos % 64) & 1) break;
    used[pos / 64] |= (uint64_t)1 << (pos % 64);
  }
  return i;
}

int64_t dsv4_plan_chunk_end(const dsv4_plan *p, int64_t i0) { return dsv4_chunk_end_of(p->global, p->n, p->panel, i0); }

static dsv4_status chunks(dsv4_plan *p) {
  dsv4_status rc = DSV4_OK;
  int64_t n = 0;
  for (int64_t i0 = 0; i0 < p->n; i0 = dsv4_plan_chunk_end(p, i0)) n++;
  DSV4_ALLOC(p->chunk, n + 1);
  n = 0;
  for (int64_t i0 = 0; i0 < p->n; i0 = dsv4_plan_chunk_end(p, i0)) p->chunk[n++] = i0;
  p->chunk[n] = p->n;
  p->n_chunk = n;
fail:
  return rc;
}

/* The RoPE positions this rank uses, as ranges (the same in both modes): per segment and document
 * it overlaps, its rows' document-local positions, from 2r rows earlier for the slots it pools
 * (position j r of a slot whose window starts at most 2r - 1 rows before its segment's first row,
 * plan/layout.c). A zigzag rank's chunks at both ends of the sequence are two ranges: one window
 * from the first to the last would be the whole sequence (256 B per position at V4-Flash sizes, 1
 * GiB per rank at 4M tokens). */
static void rope_ranges(const dsv4_plan *p, dsv4_rope_ranges *rg) {
  const dsv4_docs *d = &p->docs;
  const int64_t r = p->key.ratio;
  *rg = (dsv4_rope_ranges){0};
  for (int s = 0; s < p->lay.n_seg; s++) {
    const dsv4_seg *sg = &p->lay.seg[s];
    const int64_t g1 = sg->g0 + sg->len;
    for (int i = dsv4_docs_find(d, sg->g0); i < d->n_docs && d->cu[i] < g1; i++) {
      const int64_t a = (sg->g0 > d->cu[i] ? sg->g0 : d->cu[i]) - d->cu[i];
      const int64_t b = (g1 < d->cu[i + 1] ? g1 : d->cu[i + 1]) - d->cu[i];
      dsv4_rope_ranges_add(rg, a - 2 * r > 0 ? a - 2 * r : 0, b);
    }
  }
}

/* The table of those positions; every row's and owned slot's position is checked to be in it. */
static dsv4_status rope_table(dsv4_plan *p, const dsv4_config *cfg) {
  dsv4_status rc = DSV4_OK;
  dsv4_rope_ranges rg;
  rope_ranges(p, &rg);
  DSV4_TRY(dsv4_rope_init(&p->rope, cfg, p->key.ratio));
  DSV4_TRY(dsv4_rope_reserve_ranges(&p->rope, &rg));
  for (int64_t i = 0; i < p->n; i++)
    DSV4_CHECK(dsv4_rope_has(&p->rope, p->pos[i]), DSV4_ERR_STATE,
               "internal: row %lld's position %d not in the RoPE table", (long long)i, p->pos[i]);
  for (int64_t s = 0; s < p->n_slot; s++)
    DSV4_CHECK(dsv4_rope_has(&p->rope, p->slot_pos[s]), DSV4_ERR_STATE,
               "internal: slot %lld's position %d not in the RoPE table", (long long)s, p->slot_pos[s]);
fail:
  return rc;
}

/* LOCAL mode: the longest window and visible compressed range of this rank's queries and the size
 * of the RoPE table, segment by segment over the documents each overlaps (no per-row tables). */
static void local_sizes(dsv4_plan *p, int64_t *rope_cap) {
  const dsv4_docs *d = &p->docs;
  const int W = p->key.window, r = p->key.ratio;
  for (int s = 0; s < p->lay.n_seg; s++) {
    const dsv4_seg *sg = &p->lay.seg[s];
    const int64_t g1 = sg->g0 + sg->len;
    for (int i = dsv4_docs_find(d, sg->g0); i < d->n_docs && d->cu[i] < g1; i++) {
      const int64_t a = sg->g0 > d->cu[i] ? sg->g0 : d->cu[i], b = g1 < d->cu[i + 1] ? g1 : d->cu[i + 1];
      const int64_t last_real = (b < d->cu[i] + d->real[i] ? b : d->cu[i] + d->real[i]) - 1 - d->cu[i];
      if (last_real < a - d->cu[i]) continue; /* only padding of this document here */
      const int64_t nw = (last_real < W - 1 ? last_real : W - 1) + 1;
      p->max_win = nw > p->max_win ? nw : p->max_win;
      if (r > 0 && (last_real + 1) / r > p->max_cmp) p->max_cmp = (last_real + 1) / r;
    }
  }
  dsv4_rope_ranges rg;
  rope_ranges(p, &rg);
  *rope_cap = rg.n ? dsv4_rope_ranges_positions(&rg) : 1; /* dsv4_rope_reserve_ranges's table */
  p->n_chunk = p->n / DSV4_CHUNK_ROWS + p->lay.n_seg + 1; /* an upper bound */
}

static size_t halo_bytes(const dsv4_halo_plan *h) {
  size_t b = sizeof(int32_t) * 2 * (size_t)h->n_self;
  for (int i = 0; i < h->n_send; i++) b += sizeof(int32_t) * (size_t)h->send[i].n;
  for (int i = 0; i < h->n_recv; i++) b += sizeof(int32_t) * (size_t)h->recv[i].n;
  return b;
}

dsv4_status dsv4_plan_build(dsv4_plan *p, const dsv4_config *cfg, dsv4_plan_key *key, dsv4_plan_mode mode) {
  dsv4_status rc = DSV4_OK;
  dsv4_layout *lays = NULL;
  dsv4_range *segs = NULL;
  int ns = 0;
  memset(p, 0, sizeof *p);
  p->key = *key;
  memset(key, 0, sizeof *key);
  const dsv4_plan_key *k = &p->key;
  const int N = k->size, me = k->rank;
  const dsv4_packing pk = {.cu_seqlens = k->cu, .seqlens_real = k->real, .n_docs = k->n_docs, .T = k->T,
                           .batched = k->batched};
  p->mode = mode;
  DSV4_TRY(dsv4_docs_build(&p->docs, &pk, k->ratio));
  if (mode == DSV4_PLAN_LOCAL) {
    DSV4_TRY(dsv4_shard_segments(&pk, k->split, me, N, &segs, &ns));
    DSV4_TRY(dsv4_layout_build(&p->lay, &p->docs, segs, ns, k->window));
    p->lay.n_blk_all = p->lay.n_blk * N; /* every rank has the same segment lengths */
  } else {
    DSV4_TRY(dsv4_layouts_all(&p->docs, &pk, k->split, N, k->window, &lays));
    for (int h = 0; h < DSV4_HALO_KINDS; h++)
      if (h == DSV4_HALO_WINDOW || k->ratio > 0)
        DSV4_TRY(dsv4_halo_plan_build(lays, N, me, (dsv4_halo_kind)h, &p->halo[h]));
    p->lay = lays[me];
    memset(&lays[me], 0, sizeof lays[me]);
  }
  DSV4_CHECK(p->lay.n == k->n_local, DSV4_ERR_ARG,
             "x has %lld local rows but rank %d of %d holds %lld rows (T = %lld)", (long long)k->n_local, me, N,
             (long long)p->lay.n, (long long)k->T);
  if (mode == DSV4_PLAN_FULL && k->ratio > 0) { /* every slot is owned by exactly one segment of one rank */
    DSV4_ALLOC(p->lay.gather, p->docs.n_cmp + 1);
    for (int q = 0; q < N; q++) dsv4_layout_set_gather(q == me ? &p->lay : &lays[q], q, p->lay.gather);
  }
  p->n = p->lay.n;
  p->panel = dsv4_panel_rows(k->T);
  int64_t rope_cap = 0;
  if (mode == DSV4_PLAN_LOCAL) {
    local_sizes(p, &rope_cap);
    p->n_slot = p->lay.n_own;
  } else {
    DSV4_TRY(token_map(p));
    DSV4_TRY(query_ranges(p));
    DSV4_TRY(slot_table(p));
    DSV4_TRY(chunks(p));
    DSV4_TRY(rope_table(p, cfg));
    rope_cap = p->rope.cap;
  }
  DSV4_TRY(dsv4_partial_rows_all(&pk, k->split, N, me, &p->partial, &p->partial_max));
  /* Rank q's slot blocks are rows [q n_blk, (q + 1) n_blk) of the all-gather. When every rank owns
   * n_blk slots (no unused rows) of one stream split contiguously, rank q owns the ids [q n_blk,
   * (q + 1) n_blk) in order: the all-gathered rows are the global ids, and the backward's exact
   * reduce-scatter reads the compressed rows' sums as they lie (stage1.c). The same rule in both
   * modes; the full plan checks it against the gather index. */
  const int one_stream = N == 1 || (k->split == DSV4_SPLIT_CONTIGUOUS && !(k->batched && k->n_docs > 1));
  p->gather_identity = k->ratio > 0 && one_stream && p->lay.n_blk * N == p->docs.n_cmp;
  for (int64_t id = 0; p->gather_identity && p->lay.gather && id < p->docs.n_cmp; id++)
    DSV4_CHECK(p->lay.gather[id] == id, DSV4_ERR_STATE, "internal: slot %lld is row %d of the all-gather",
               (long long)id, p->lay.gather[id]);
  if (p->lay.gather && !p->gather_identity) { /* the backward's reduce-scatter reads rows through it */
    DSV4_ALLOC(p->blk_id, p->lay.n_blk_all + 1);
    for (int64_t g = 0; g < p->lay.n_blk_all; g++) p->blk_id[g] = -1;
    for (int64_t id = 0; id < p->docs.n_cmp; id++) p->blk_id[p->lay.gather[id]] = (int32_t)id;
  }
  const size_t n = (size_t)p->n;
  p->bytes = n * (sizeof(int64_t) + 2 * sizeof(int32_t) + 1) + 2 * n * sizeof(int32_t) +
             (k->ratio > 0 ? 2 * n * sizeof(int32_t) + sizeof(int32_t) * (size_t)p->docs.n_cmp : 0) +
             (k->ratio > 0 && !p->gather_identity ? sizeof(int32_t) * (size_t)p->lay.n_blk_all : 0) +
             (4 * sizeof(int32_t) + sizeof(int64_t)) * (size_t)p->n_slot +
             sizeof(int64_t) * (size_t)(p->n_chunk + 1) + sizeof(float) * (size_t)(rope_cap * cfg->rope_dim);
  for (int h = 0; h < DSV4_HALO_KINDS; h++) p->bytes += halo_bytes(&p->halo[h]);
fail:
  if (lays)
    for (int q = 0; q < N; q++) dsv4_layout_free(&lays[q]);
  free(lays);
  free(segs);
  if (rc != DSV4_OK) dsv4_plan_free(p);
  return rc;
}
