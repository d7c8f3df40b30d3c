/* partial.c: how many rows of partial panel runs a product sink (model/wgrad.c) keeps at once. A
 * backward chunk (dsv4_chunk_end_of) cuts its rows into runs of consecutive global rows of one
 * projection panel; a run that does not cover its panel is copied into the sink's stash. As soon as
 * the stash's rows cover a panel (a contiguous shard that does not start on a panel cuts every panel
 * between two chunks) they go into the sums and leave it; rows whose panels other ranks share stay
 * until the finish. The recomputed backward's choice between sinks and kept rows
 * (dsv4_wgrad_keep_rows) needs the most a rank keeps, identically on every rank: the largest over the
 * ranks.
 *
 * Counted from the segments, not row by row: the memory planner asks for it for every rank of a
 * split of up to INT32_MAX tokens. Inside a segment the chunk rule is periodic: from a chunk's first
 * row the global positions mod P run through every value once, so a chunk is P rows unless the
 * segment ends first, and a segment's chunks after the first all start at the same position phi in
 * their panels. Each such chunk adds the rest of the panel the one before began (which then leaves
 * whole) and the first phi rows of the next: after the second one the stash repeats, so only the
 * first two and the last are walked. Segments are in increasing global order, as every split stores
 * them (shard.c).
 *
 * Worked example (P = 512, T = 1536, two ranks, contiguous): rank 0 holds [0, 768): chunks [0, 512)
 * (a whole panel) and [512, 768) (half of panel 1, whose other half is rank 1's): it keeps 256 rows.
 * Rank 1 holds [768, 1536): chunk [768, 1280) keeps [768, 1024) (panel 1) and [1024, 1280), then
 * chunk [1280, 1536) completes panel 2: 768 rows at once, then 256 again. Zigzag at T = 1024 over two
 * ranks: every chunk is two half panels that stay: every row. */
#include "plan.h"
#include "shard.h"
#include "util/err.h"
#include "util/gemm.h"

typedef struct {
  dsv4_range *r; /* runs, in stash order */
  int64_t n, cap, rows, peak;
} stash_runs;

/* The chunk being assembled: its pieces (global runs, in local order; at most P of them, since
 * every piece has a row). */
typedef struct {
  dsv4_range *pc;
  int64_t n_pc, rows;
} open_chunk;

static int whole_run(int64_t g0, int64_t len, int64_t T, int64_t P) {
  const int64_t first = g0 / P * P;
  return len == (T - first < P ? T - first : P);
}

/* Appends rows [g0, g0 + len) (one panel's) to the stash, extending its last run as runs_of would
 * (model/wgrad.c: the next global row, not a panel's first). 0 when out of memory. */
static int stash_add(stash_runs *st, int64_t g0, int64_t len, int64_t P) {
  st->rows += len;
  if (st->n && st->r[st->n - 1].g0 + st->r[st->n - 1].len == g0 && g0 % P != 0) {
    st->r[st->n - 1].len += len;
    return 1;
  }
  if (st->n == st->cap) {
    dsv4_range *t = realloc(st->r, sizeof(dsv4_range) * (size_t)(2 * st->cap + 16));
    if (!t) return 0;
    st->r = t, st->cap = 2 * st->cap + 16;
  }
  st->r[st->n++] = (dsv4_range){g0, len};
  return 1;
}

/* A run of a chunk: into the stash unless it covers its panel; if it then completes the stash's
 * last run to a whole panel, that leaves the stash. 0 when out of memory. */
static int keep_run(stash_runs *st, int64_t r0, int64_t r1, int64_t T, int64_t P) {
  if (whole_run(r0, r1 - r0, T, P)) return 1;
  if (!stash_add(st, r0, r1 - r0, P)) return 0;
  st->peak = st->rows > st->peak ? st->rows : st->peak;
  const dsv4_range *last = &st->r[st->n - 1];
  if (whole_run(last->g0, last->len, T, P)) st->rows -= last->len, st->n--;
  return 1;
}

/* Chunk c's runs, cut at a global gap or a panel's first row as runs_of cuts them, in order. */
static int chunk_done(stash_runs *st, const open_chunk *c, int64_t T, int64_t P) {
  int64_t r0 = -1, r1 = -1; /* the run being extended: [r0, r1) */
  for (int64_t j = 0; j < c->n_pc; j++)
    for (int64_t g = c->pc[j].g0, e = g + c->pc[j].len; g < e;) {
      const int64_t stop = (g / P + 1) * P < e ? (g / P + 1) * P : e;
      if (g == r1 && g % P != 0) {
        r1 = stop;
      } else {
        if (r0 >= 0 && !keep_run(st, r0, r1, T, P)) return 0;
        r0 = g, r1 = stop;
      }
      g = stop;
    }
  return r0 < 0 || keep_run(st, r0, r1, T, P);
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

/* One chunk of P rows from g (a segment's periodic ones). */
static int one_panel_chunk(stash_runs *st, int64_t g, int64_t T, int64_t P) {
  const open_chunk one = {&(dsv4_range){g, P}, 1, P};
  return chunk_done(st, &one, T, P);
}

int64_t dsv4_partial_rows(const dsv4_range *segs, int n_seg, int64_t T, int64_t P) {
  open_chunk c = {NULL, 0, 0};
  stash_runs st = {0};
  int ok = 1;
  if (n_seg <= 0) return 0;
  c.pc = malloc(sizeof(dsv4_range) * (size_t)(P + 1));
  if (!c.pc) return -1;
  for (int s = 0; ok && s < n_seg; s++) {
    int64_t g = segs[s].g0, left = segs[s].len;
    if (c.rows > 0 && left > 0) { /* the open chunk goes on into this segment while positions differ */
      const int64_t room = room_from(&c, g, P), take = room < left ? room : left;
      if (take > 0) c.pc[c.n_pc++] = (dsv4_range){g, take}, c.rows += take, g += take, left -= take;
      if (left == 0) continue;
      ok &= chunk_done(&st, &c, T, P);
      c.n_pc = c.rows = 0;
    }
    /* the segment's chunks of P rows, all at g's position phi in their panels: the first two and
     * the last walked; between them each one takes a whole panel out and leaves phi rows of the
     * next, as the second did (the stash's last run moves on by P) */
    const int64_t whole = left / P, phi = g % P;
    for (int64_t j = 0; ok && j < whole; j++) {
      if (j == 2 && whole > 3) {
        const int64_t skip = whole - 3;
        dsv4_range *last = st.n ? &st.r[st.n - 1] : NULL;
        if (phi == 0 || (last && last->g0 == g + 2 * P - phi && last->len == phi)) {
          if (phi != 0) last->g0 += skip * P;
          j += skip;
        }
      }
      ok &= one_panel_chunk(&st, g + j * P, T, P);
    }
    g += whole * P, left -= whole * P;
    if (left > 0) c.pc[0] = (dsv4_range){g, left}, c.n_pc = 1, c.rows = left;
  }
  if (ok && c.rows > 0) ok &= chunk_done(&st, &c, T, P);
  free(c.pc);
  free(st.r);
  return ok ? st.peak : -1;
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
