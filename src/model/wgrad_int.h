/* wgrad_int.h: what wgrad.c and wgrad_rows.c share (not part of the library's interface). */
#ifndef DSV4_WGRAD_INT_H
#define DSV4_WGRAD_INT_H

#include "wgrad.h"

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
/* Whether some row of r is padding (its A then read through the mask). */
int dsv4_wg_run_masked(const wrun *r);
/* Columns [c0, c0 + w) of the runs' rows (A's, padding rows as zeros, or B's) into dst [rows, w],
 * in run order. */
void dsv4_wg_pack_cols(const wrun *runs, int64_t n_runs, int side_a, int64_t c0, int64_t w, float *dst);
/* One panel's product restricted to block (m0, n0) [mb, nb] (m0, n0: the block's columns counted
 * from A's and B's first): fp32 into t, then added exactly into acc rows of width wacc (a row's hi,
 * then its lo). fresh: the sums are set, not added. za: room for len x mb floats (the masked A).
 * Returns nonzero on a bad term. */
int dsv4_wg_add_panel(int64_t m0, int64_t mb, int64_t n0, int64_t nb, const float *A, int64_t lda, const float *B,
                      int64_t ldb, const uint8_t *keep, int64_t len, float *t, float *za, int64_t *acc,
                      int64_t wacc, int fresh, dsv4_impl impl);
/* Every rank's list of `mine` runs (pairs g0, len): rank r's k-th at all[2 (r cmax + k)], cnt[r]
 * of them, total in all. Collective. */
dsv4_status dsv4_wg_gather_lists(dsv4_comm *comm, const int64_t *pairs, int64_t mine, int64_t **all,
                                 int64_t **cnt, int64_t *cmax, int64_t *total);

/* Whether moving rows beats reducing sums for this product on N ranks (the same answer on every
 * rank: it reads the shape only). */
int dsv4_wg_rows_cheaper(const dsv4_wshape *s, int N);
/* The most bytes dsv4_wg_by_rows holds for this product on a rank of `mine` rows (0: the sums path). */
uint64_t dsv4_wg_rows_bytes(const dsv4_wshape *s, int N, int64_t mine, int threads);
/* The product with every block computed whole by one rank from all the rows (wgrad_rows.c): C +=
 * the sum of the panels' products, rounded once, on every rank. *bad: some rank had a bad term.
 * Collective. */
dsv4_status dsv4_wg_by_rows(dsv4_comm *comm, const dsv4_wshape *s, const wrun *runs, int64_t n_runs, float *C,
                            dsv4_impl impl, int *bad);

#endif
