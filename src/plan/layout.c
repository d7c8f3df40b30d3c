/* layout.c: the layout of a rank's local rows (plan.h): for each segment, its window and compressor
 * halos, where its rows sit in the extended buffers, and which compressed slots it owns. One rank
 * (segments without halos) and every CP rank use the same code, so a token and a slot are computed
 * the same way whoever holds them.
 *
 * Worked example (the one docs/cp.md draws): r = 4, one document of 16 real tokens, N = 8 ranks,
 * contiguous split (L = 2 rows per rank), W = 4. Slots: [0,4) [4,8) [8,12) [12,16), ends 3, 7, 11,
 * 15. Rank 1 holds [2,4) and owns slot 0 (end 3): its window starts at 0 < g0 = 2, so c_halo =
 * c_full = 2 (rows 0, 1 with every channel). Rank 3 holds [6,8) and owns slot 1: own window [4,8)
 * and previous window [0,4) -> c_halo = 6, of which rows 4, 5 carry every channel (c_full = 2) and
 * rows 0..3 only the first half: that halo straddles three ranks (0, 1, 2). Ranks 0, 2, 4, 6 own
 * no slot (c_halo = 0) but still have slot buffer capacity ceil(2 / 4) = 1, so n_blk = 1
 * everywhere and the all-gathered buffer has 8 rows, 4 of them selected. */
#include <string.h>

#include "plan.h"
#include "shard.h"
#include "util/err.h"

/* Compressor halo of a segment starting at g0 whose first owned slot is global id `id`: the rows
 * of that slot's window (and, for r == 4 and j > 0, of the previous window) before g0. */
static void cmp_halo_of(const dsv4_docs *docs, int64_t g0, int64_t id, int64_t *c_halo, int64_t *c_full) {
  const int r = docs->ratio;
  int doc;
  int64_t j;
  dsv4_docs_slot(docs, id, &doc, &j);
  const int64_t w = docs->cu[doc] + j * r;           /* first token of the slot's own window */
  const int64_t h0 = (r == 4 && j > 0) ? w - r : w;   /* first token the slot reads */
  *c_halo = g0 > h0 ? g0 - h0 : 0;
  *c_full = g0 > w ? g0 - w : 0;
}

dsv4_status dsv4_layout_build(dsv4_layout *lay, const dsv4_docs *docs, const dsv4_range *segs, int n_seg, int W) {
  dsv4_status rc = DSV4_OK;
  const int r = docs->ratio;
  memset(lay, 0, sizeof *lay);
  lay->ratio = r;
  lay->n_seg = n_seg;
  DSV4_ALLOC(lay->seg, n_seg);
  for (int s = 0; s < n_seg; s++) {
    dsv4_seg *sg = &lay->seg[s];
    sg->g0 = segs[s].g0;
    sg->len = segs[s].len;
    sg->lo = lay->n;
    { /* a segment whose first token is real looks back min(t0, W - 1) rows */
      const int doc = dsv4_docs_find(docs, sg->g0);
      const int64_t t0 = sg->g0 - docs->cu[doc];
      sg->win_halo = t0 < docs->real[doc] ? (t0 < W - 1 ? t0 : W - 1) : 0;
    }
    if (r > 0) {
      sg->id0 = dsv4_docs_slots_before(docs, sg->g0);
      sg->n_own = dsv4_docs_slots_before(docs, sg->g0 + sg->len) - sg->id0;
      const int64_t cap = (sg->len + r - 1) / r;
      DSV4_CHECK(sg->n_own <= cap, DSV4_ERR_STATE, "internal: segment at %lld owns %lld slots (capacity %lld)",
                 (long long)sg->g0, (long long)sg->n_own, (long long)cap);
      if (sg->n_own > 0) cmp_halo_of(docs, sg->g0, sg->id0, &sg->c_halo, &sg->c_full);
      sg->blk0 = lay->n_blk;
      lay->n_blk += cap;
      lay->n_own += sg->n_own;
    }
    sg->kv_row = lay->R_kv;
    sg->c_row = lay->R_c;
    lay->R_kv += sg->win_halo + sg->len;
    lay->R_c += sg->c_halo + sg->len;
    lay->n += sg->len;
  }
  lay->n_blk_all = lay->n_blk;
  lay->ext_kv = lay->R_kv > lay->n;
  return DSV4_OK;
fail:
  dsv4_layout_free(lay);
  return rc;
}

void dsv4_layout_set_gather(const dsv4_layout *lay, int rank, int32_t *gather) {
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    for (int64_t k = 0; k < sg->n_own; k++) gather[sg->id0 + k] = (int32_t)(rank * lay->n_blk + sg->blk0 + k);
  }
}

void dsv4_layout_free(dsv4_layout *lay) {
  free(lay->seg);
  free(lay->gather);
  memset(lay, 0, sizeof *lay);
}

dsv4_status dsv4_layouts_all(const dsv4_docs *docs, const dsv4_packing *pk, dsv4_split split, int size, int W,
                             dsv4_layout **lays) {
  dsv4_status rc = DSV4_OK;
  dsv4_range *segs = NULL;
  int ns = 0;
  *lays = NULL;
  DSV4_ALLOC(*lays, size);
  for (int q = 0; q < size; q++) {
    DSV4_TRY(dsv4_shard_segments(pk, split, q, size, &segs, &ns));
    DSV4_TRY(dsv4_layout_build(&(*lays)[q], docs, segs, ns, W));
    free(segs);
    segs = NULL;
    /* every rank has the same segment lengths, so the same slot buffer */
    DSV4_CHECK((*lays)[q].n_blk == (*lays)[0].n_blk, DSV4_ERR_STATE,
               "internal: ranks 0 and %d have different slot buffers", q);
    (*lays)[q].n_blk_all = (*lays)[q].n_blk * size;
  }
fail:
  free(segs);
  if (rc != DSV4_OK && *lays) {
    for (int q = 0; q < size; q++) dsv4_layout_free(&(*lays)[q]);
    free(*lays);
    *lays = NULL;
  }
  return rc;
}
