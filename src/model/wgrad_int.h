/* wgrad_int.h: what wgrad.c and wgrad_rows.c share (not part of the library's interface). */
#ifndef DSV4_WGRAD_INT_H
#define DSV4_WGRAD_INT_H

#include "cp/exchange.h"
#include "wgrad.h"

/* What the messages are made of (wgrad.c, wgrad_rows.c; wgrad_plan.c counts the same):
 *   DSV4_WG_SUPER_BLOCKS  blocks of C whose sums one rank rounds per superblock (N ranks: N times
 *                         as many blocks are reduce-scattered at once, then all-gathered as floats)
 *   DSV4_WG_DSUM_MSG      elements of a product sink's sums summed over the ranks at once at
 *                         finish (16 MiB of int64 pairs)
 *   DSV4_WG_RUNS_INLINE   runs a rank's first run-list all-gather record holds (a rank has a few:
 *                         its shard's two ends, a zigzag rank's four, a batch's per sequence); a
 *                         second all-gather of the longest list when some rank has more */
#define DSV4_WG_SUPER_BLOCKS 4
#define DSV4_WG_DSUM_MSG (1 << 20)
#define DSV4_WG_RUNS_INLINE 16

/* Ranks of the transport (NULL: one). */
static inline int dsv4_wg_size(const dsv4_xfer *x) { return x ? x->comm->size : 1; }

/* Consecutive local rows of one global panel: row i's A at A + i lda, B at B + i ldb; keep: NULL
 * or the rows' padding mask (0: A counts as zero). */
typedef struct {
  const float *A, *B;
  int64_t lda, ldb;
  const uint8_t *keep;
  int64_t g0, len;
} wrun;

/* C's blocks: mb x nb elements, bm along M and bn along N; block b is (b / bn, b % bn). The grid
 * depends on the shape only (never on N): a block's panel products have the same bits anywhere. */
typedef struct {
  int64_t mb, nb, bm, bn;
} blocking;

static inline int64_t extent(const dsv4_wshape *s, int64_t panel) {
  const int64_t left = s->T - panel * s->P;
  return left < s->P ? left : s->P;
}

blocking dsv4_wg_blocks(const dsv4_wshape *s);

/* A superblock of nbk blocks under CP (N > 1): its sums are nbk bl.mb rows of 2 bl.nb int64 (a
 * block's row: hi, then lo at bl.nb), reduce-scattered in N slices of `rows` rows (the last ones
 * padded with zeros); each rank rounds its slice into fslice floats (rows x bl.nb, then its bad-term
 * flag), which are all-gathered. */
typedef struct {
  int64_t rows, fslice;
} wsuper;
static inline wsuper dsv4_wg_super(const blocking *bl, int64_t nbk, int N) {
  const int64_t rows = (nbk * bl->mb + N - 1) / N;
  return (wsuper){rows, rows * bl->nb + 1};
}

/* A product sink's rows at finish (wgrad.c dsum_store) go in chunks of `step` rows (about
 * DSV4_WG_DSUM_MSG elements), each reduce-scattered in N slices of ceil(rows / N) rows (slice: the
 * largest), rounded by the slice's rank and all-gathered as floats. */
typedef struct {
  int64_t step, slice;
} wdsum;
static inline wdsum dsv4_wg_dsum(int64_t rows, int64_t w, int N) {
  int64_t step = DSV4_WG_DSUM_MSG / w > 1 ? DSV4_WG_DSUM_MSG / w : 1;
  if (step > rows) step = rows > 0 ? rows : 1;
  return (wdsum){step, (step + N - 1) / N};
}

/* Block b of grid bl: its first row and column and its extent (the last ones are cut at M, N). */
typedef struct {
  int64_t m0, n0, mb, nb;
} wblock;
static inline wblock dsv4_wg_block(const dsv4_wshape *s, const blocking *bl, int64_t b) {
  wblock k = {(b / bl->bn) * bl->mb, (b % bl->bn) * bl->nb, bl->mb, bl->nb};
  if (k.m0 + k.mb > s->M) k.mb = s->M - k.m0;
  if (k.n0 + k.nb > s->N) k.nb = s->N - k.n0;
  return k;
}
/* Whether some row of r is padding (its A then read through the mask). */
int dsv4_wg_run_masked(const wrun *r);
/* Columns [c0, c0 + w) of the runs' rows (A's, padding rows as zeros, or B's) into dst [rows, w],
 * in run order. */
void dsv4_wg_pack_cols(const wrun *runs, int64_t n_runs, int side_a, int64_t c0, int64_t w, float *dst);
/* One panel's rows as a product reads them: A's column a0 at A[0], B's column b0 at B[0]; keep:
 * NULL or the rows' padding mask (0: A counts as zero). */
typedef struct {
  const float *A, *B;
  int64_t lda, ldb, a0, b0, len;
  const uint8_t *keep;
} wview;

/* Panels whose fp32 products a block holds side by side and adds in one pass (their exact sums stay
 * in registers for the group instead of being read and written once per panel). */
#define DSV4_WG_GROUP 8
/* Blocks of products a thread's room holds: one block's group of DSV4_WG_GROUP panels, or a strip of
 * c blocks with groups of DSV4_WG_ROOM / c panels (dsv4_wg_strip_group). Twice a block's group, so
 * that a rank's eight panels (4096 tokens at CP = 1) still make strips of two blocks summed in one
 * group, and four panels (CP = 2) strips of four: 16 MiB at 512 x 512 blocks (docs/perf.md, "... and
 * twice the room for weight-gradient strips"). */
#define DSV4_WG_ROOM 16

/* The group size in use: DSV4_WG_GROUP, or DSV4_WGRAD_GROUP=k (1 .. DSV4_WG_GROUP) from the
 * environment, which a test sets to send short streams through the sums-in-memory path (the bits
 * are the same for every k). */
int dsv4_wg_group(void);

/* Floats of dsv4_wg_block_sum's per-thread room: DSV4_WG_ROOM blocks of products and the masked A. */
static inline int64_t dsv4_wg_tfloats(const blocking *bl, int64_t P) {
  return DSV4_WG_ROOM * bl->mb * bl->nb + P * bl->mb;
}

/* Block (m0, n0) [mb, nb] (counted in the whole product's columns) of the sum of the views'
 * products, added exactly. out given: the value, rounded once, into rows of out (ldo apart; beta
 * 0: =, 1: +=); acc then serves only as the intermediate, needed when nv > dsv4_wg_group(). out
 * NULL: into the exact sums acc (rows of width wacc, a row's hi then its lo; fresh: set, not
 * added). Groups of dsv4_wg_group() panels. t: dsv4_wg_tfloats floats. Returns nonzero on a bad term. */
int dsv4_wg_block_sum(const wview *v, int64_t nv, int64_t m0, int64_t mb, int64_t n0, int64_t nb, float *t,
                      int64_t *acc, int64_t wacc, int fresh, float *out, int64_t ldo, int beta, dsv4_impl impl);
/* A strip of blocks: rows [m0, m0 + mb) in blocks of sm, columns [n0, n0 + nb) in blocks of sw (the
 * last ones smaller; blocks in one direction only), each block with the bits of its own call, in
 * one BLAS call per panel where this BLAS allows. Groups of G panels, G mb nb <= DSV4_WG_ROOM x
 * one block (the products fit the thread's room); acc: block i's sums at
 * acc + i astride (rows of 2 wacc) when nv > G; za, the masked A, after the group's products (t:
 * G mb nb + P mb floats). Otherwise as dsv4_wg_block_sum. */
int dsv4_wg_strip_sum(const wview *v, int64_t nv, int64_t m0, int64_t mb, int64_t sm, int64_t n0, int64_t nb,
                      int64_t sw, int64_t G, float *t, int64_t *acc, int64_t wacc, int64_t astride, int fresh,
                      float *out, int64_t ldo, int beta, dsv4_impl impl);
/* Blocks per strip for nv panels on nt threads (at most DSV4_WG_SUPER_BLOCKS / nt and
 * DSV4_WG_ROOM / nv; DSV4_WGRAD_STRIP=c caps it), and the group of panels such a strip sums. */
int64_t dsv4_wg_strip_cap(int nt, int64_t nv);
int64_t dsv4_wg_strip_group(int64_t c);
/* Every rank's list of `mine` runs (pairs g0, len): rank r's k-th at all[2 (r cmax + k)], cnt[r]
 * of them, total in all. Collective. */
dsv4_status dsv4_wg_gather_lists(dsv4_xfer *x, const int64_t *pairs, int64_t mine, int64_t **all,
                                 int64_t **cnt, int64_t *cmax, int64_t *total);

/* Whether moving rows beats reducing sums for this product on N ranks (the same answer on every
 * rank: it reads the shape only). */
int dsv4_wg_rows_cheaper(const dsv4_wshape *s, int N);
/* The most bytes dsv4_wg_by_rows holds for this product on a rank of `mine` rows (0: the sums path). */
uint64_t dsv4_wg_rows_bytes(const dsv4_wshape *s, int N, int64_t mine, int threads);
/* What dsv4_wg_by_rows sends on each of N ranks holding nrows[q] rows of the product, added to
 * out[q] (the planner's count; the run lists' all-gathers are the caller's). */
void dsv4_wg_rows_traffic(const dsv4_wshape *s, int N, const int64_t *nrows, dsv4_cp_stats *out);
/* The product with every block computed whole by one rank from all the rows (wgrad_rows.c): C +=
 * the sum of the panels' products, rounded once, on every rank. *bad: some rank had a bad term.
 * Collective. */
dsv4_status dsv4_wg_by_rows(dsv4_xfer *x, const dsv4_wshape *s, const wrun *runs, int64_t n_runs, float *C,
                            dsv4_impl impl, int *bad);

#endif
