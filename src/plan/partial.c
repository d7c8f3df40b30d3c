/* partial.c: how many of a rank's rows the backward's chunks (dsv4_chunk_end_of) put into partial
 * panel runs: runs of consecutive global rows of one projection panel that do not cover it. A
 * product sink (model/wgrad.c) keeps a copy of exactly those rows of every product until its finish,
 * so the recomputed backward's choice between sinks and kept rows (dsv4_wgrad_keep_rows) needs the
 * count, identically on every rank: the largest over the ranks.
 *
 * Counted from the segments, not row by row: the memory planner asks for it for every rank of a
 * split of up to INT32_MAX tokens. Inside a segment the chunk rule is periodic: from a chunk's first
 * row the global positions mod P run through every value once, so a chunk is P rows unless the
 * segment ends first, and a segment's chunks after the first all start at the same position in their
 * panels. Only a chunk that reaches over a segment's end looks at several segments.
 *
 * Worked example (P = 512, T = 1536, two ranks, contiguous): rank 0 holds [0, 768): chunks [0, 512)
 * (a whole panel) and [512, 768) (half of panel 1): 256 rows. Rank 1 holds [768, 1536): chunks
 * [768, 1280) and [1280, 1536); panel 1's [768, 1024), panel 2's [1024, 1280) and [1280, 1536) are
 * each half a panel: 768 rows. Zigzag at T = 1024 over two ranks: every chunk is half a panel. */
#include <string.h>

#include "plan.h"
#include "shard.h"
#include "util/err.h"
#include "util/gemm.h"

/* The chunk being assembled: its pieces (global runs, in local order; at most P of them, since
 * every piece has a row). */
typedef struct {
  dsv4_range *pc;
  int64_t n_pc, rows;
} open_chunk;

/* Rows of chunk c in partial runs. runs_of (model/wgrad.c) cuts a chunk's rows into runs at a
 * global gap and at a panel's first row; a run is whole when it covers its panel's extent (the
 * last panel may be short of P). */
static int64_t chunk_partial(const open_chunk *c, int64_t T, int64_t P) {
  int64_t partial = 0, r0 = -1, r1 = -1; /* the run being extended: global [r0, r1) */
  for (int64_t j = 0; j < c->n_pc; j++) {
    for (int64_t g = c->pc[j].g0, e = g + c->pc[j].len; g < e;) {
      const int64_t stop = (g / P + 1) * P < e ? (g / P + 1) * P : e;
      if (g == r1 && g % P != 0) {
        r1 = stop;
      } else {
        if (r0 >= 0) {
          const int64_t first = r0 / P * P, ext = T - first < P ? T - first : P;
          if (r1 - r0 != ext) partial += r1 - r0;
        }
        r0 = g, r1 = stop;
      }
      g = stop;
    }
  }
  if (r0 >= 0) {
    const int64_t first = r0 / P * P, ext = T - first < P ? T - first : P;
    if (r1 - r0 != ext) partial += r1 - r0;
  }
  return partial;
}

/* Rows from global row g on that the open chunk can still take: up to the first position (mod P)
 * one of its pieces holds. */
static int64_t room_from(const open_chunk *c, int64_t g, int64_t P) {
  int64_t room = P;
  for (int64_t j = 0; j < c->n_pc; j++) {
    const int64_t a = c->pc[j].g0, into = ((g - a) % P + P) % P; /* g's position past the piece's first */
    if (into < c->pc[j].len) return 0;
    const int64_t ahead = P - into; /* rows from g to the piece's first position */
    if (ahead < room) room = ahead;
  }
  return room;
}

int64_t dsv4_partial_rows(const dsv4_range *segs, int n_seg, int64_t T, int64_t P) {
  open_chunk c = {NULL, 0, 0};
  int64_t partial = 0;
  if (n_seg <= 0) return 0;
  c.pc = malloc(sizeof(dsv4_range) * (size_t)(P + 1));
  if (!c.pc) return -1;
  for (int s = 0; s < n_seg; s++) {
    int64_t g = segs[s].g0, left = segs[s].len;
    if (c.rows > 0 && left > 0) { /* the open chunk goes on into this segment while positions differ */
      const int64_t room = room_from(&c, g, P), take = room < left ? room : left;
      if (take > 0) c.pc[c.n_pc++] = (dsv4_range){g, take}, c.rows += take, g += take, left -= take;
      if (left == 0) continue;
      partial += chunk_partial(&c, T, P);
      c.n_pc = c.rows = 0;
    }
    /* chunks of P rows, all at g's position in their panels: a whole panel each when that is 0, else
     * two partial runs (the last one is counted as it is: it may end at T, in a short last panel) */
    const int64_t whole = left / P;
    if (whole > 1 && g % P != 0) partial += (whole - 1) * P;
    g += (whole > 1 ? whole - 1 : 0) * P, left -= (whole > 1 ? whole - 1 : 0) * P;
    if (left >= P) {
      open_chunk one = {&(dsv4_range){g, P}, 1, P};
      partial += chunk_partial(&one, T, P);
      g += P, left -= P;
    }
    if (left > 0) c.pc[0] = (dsv4_range){g, left}, c.n_pc = 1, c.rows = left;
  }
  if (c.rows > 0) partial += chunk_partial(&c, T, P);
  free(c.pc);
  return partial;
}

/* Rows of rank q of the split (-1: out of memory; *rc: the shard's error). */
static int64_t rank_partial(const dsv4_packing *pk, dsv4_split split, int q, int size, dsv4_status *rc) {
  dsv4_range *segs = NULL;
  int ns = 0;
  *rc = dsv4_shard_segments(pk, split, q, size, &segs, &ns);
  if (*rc != DSV4_OK) return 0;
  const int64_t k = dsv4_partial_rows(segs, ns, pk->T, dsv4_panel_rows(pk->T));
  free(segs);
  if (k < 0) *rc = dsv4__err(DSV4_ERR_NOMEM, __FILE__, __LINE__, "out of memory counting partial panel rows");
  return k;
}

/* The most over the ranks depends on T, the units (one stream, or B sequences of equal length:
 * shard.c), the split and the rank count only. The memory planner asks once per rank of a split
 * (and --memory-budget for dozens of lengths), which would make its cost grow as the square of the
 * ranks: the last answer is kept, per thread. */
static _Thread_local struct {
  int64_t T, units, most;
  dsv4_split split;
  int size, valid;
} last;

dsv4_status dsv4_partial_rows_all(const dsv4_packing *pk, dsv4_split split, int size, int rank, int64_t *mine,
                                  int64_t *most) {
  dsv4_status rc = DSV4_OK;
  const int64_t units = pk->batched && pk->cu_seqlens && pk->n_docs > 1 ? pk->n_docs : 1;
  *mine = *most = 0;
  *mine = rank_partial(pk, split, rank, size, &rc);
  if (rc != DSV4_OK) return rc;
  if (last.valid && last.T == pk->T && last.units == units && last.split == split && last.size == size) {
    *most = last.most;
    return DSV4_OK;
  }
  for (int q = 0; q < size; q++) {
    const int64_t k = q == rank ? *mine : rank_partial(pk, split, q, size, &rc);
    if (rc != DSV4_OK) return rc;
    *most = k > *most ? k : *most;
  }
  last.T = pk->T, last.units = units, last.split = split, last.size = size, last.most = *most, last.valid = 1;
  return DSV4_OK;
}

int64_t dsv4_layout_partial_rows(const dsv4_layout *lay, int64_t T) {
  dsv4_range *r = malloc(sizeof(dsv4_range) * (size_t)(lay->n_seg > 0 ? lay->n_seg : 1));
  if (!r) return -1;
  for (int s = 0; s < lay->n_seg; s++) r[s] = (dsv4_range){lay->seg[s].g0, lay->seg[s].len};
  const int64_t k = dsv4_partial_rows(r, lay->n_seg, T, dsv4_panel_rows(T));
  free(r);
  return k;
}
