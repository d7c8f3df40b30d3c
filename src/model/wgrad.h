/* wgrad.h: weight gradients that are the same bits for every CP degree, split and thread count.
 *
 * A weight gradient is a sum over the stream's token rows, dW = sum_i A_i^T B_i (A_i the row's
 * output gradient, B_i its input). Its rows are taken in the forward's global panels (P rows
 * aligned to global multiples of P, the last one T - k P): each panel's product is one
 * single-threaded BLAS call whose shape only the panel decides, so its fp32 bits do not depend on
 * which rank or thread computes it. The panels' products are then added exactly (util/xacc.h:
 * integers on a fixed grid, inside a rank, and across ranks by an int64 reduce-scatter) and rounded
 * once: the order in which ranks, chunks and threads meet the panels no longer matters. A panel
 * whose rows lie on several ranks (a shard boundary inside it: zigzag at short lengths, odd N) is
 * computed by the rank that holds its first row; the others send it their rows. Where the rows are
 * much smaller than the sums (short streams), a product moves rows instead: each block computed
 * whole by one rank from every rank's rows (wgrad_rows.c; the same bits).
 *
 * Two ways in:
 *   dsv4_wgrad_exact   every row of the product is at hand (the default mode's deferred products,
 *                      the key and compressor weights): streamed block by block of C, each block's
 *                      sums summed over the ranks and rounded at once; memory: a few blocks.
 *   dsv4_wsinks        sums that grow over calls (a recomputed backward's per-chunk products, the
 *                      vector gradients every operator adds into): one exact accumulator per
 *                      registered gradient tensor (16 bytes per element; a product's: doubles
 *                      while exact, 8, half or all of them in zero gradient tensors),
 *                      summed over the ranks and rounded by dsv4_wsinks_finish. While
 *                      sinks are active, an operator's exact row sums (util/xrows.h
 *                      dsv4_xrows_finish) into a registered tensor land in its accumulator
 *                      instead of being rounded. */
#ifndef DSV4_WGRAD_H
#define DSV4_WGRAD_H

#include <stdint.h>

#include "cp/exchange.h"
#include "dsv4cp.h"
#include "plan/plan.h"

/* Rows of one product C [M, N] += sum_i A_i^T B_i: n local rows, row i of A at A + i lda and of B
 * at B + i ldb, global index glob[i] (consecutive inside a piece), keep[i] == 0: the row's A is
 * taken as zero (padding rows, whose output gradient is ignored). */
typedef struct {
  int64_t n;
  const float *A, *B;
  int64_t lda, ldb;
  const int64_t *glob;
  const uint8_t *keep; /* NULL: every row */
} dsv4_wpiece;

typedef struct {
  int64_t M, N; /* C is [M, N], row-major, contiguous */
  int64_t P, T; /* panel rows (the forward's); global rows of the stream (or of the compressed
                   sequence) */
} dsv4_wshape;

/* Collective over x's communicator (x NULL: one rank; its messages are counted in x's stats under
 * the DSV4_MSG_WGRAD_* kinds): C += the rank-summed gradient of the pieces. A bad term
 * (non-finite, or a panel's product not below 2^24) on any rank fails every rank, naming `what`;
 * C may then hold some blocks' sums. */
dsv4_status dsv4_wgrad_exact(dsv4_xfer *x, const dsv4_wshape *s, const dsv4_wpiece *pc, int n_pc, float *C,
                             dsv4_impl impl, const char *what);

/* A recomputed backward (no q, o kept) of n local rows keeps the rows of its chunk-by-chunk weight
 * products (dq, the rotated output, the indexer queries' gradients: n x (2 H D + ...) floats) for
 * products at the end when they take no more memory than whole-weight sinks (half a double per
 * element of wq_b and the indexer's query projections, none for wo_a: a fresh backward's zero
 * tensors hold the rest, each its own high halves, wo_b's, wq_a's and wkv's the low ones of wo_a
 * and of wq_b's first rows) plus the rows the sinks copy meanwhile: both factors' rows of the
 * chunks' partial panel runs, kept until the rank's own rows complete their panel or, for panels
 * other ranks share, until the finish (plan.h dsv4_partial_rows: the most at once; every row of a
 * zigzag rank whose pieces are half panels), counted for partial_max, the most any rank keeps;
 * else sinks. n and partial_max are the same on every rank, so every rank makes the same choice
 * (the collectives follow it). DSV4_WGRAD_KEEP=rows / sums in the environment forces one (tests:
 * both give the same bits). */
int dsv4_wgrad_keep_rows(const dsv4_config *cf, int selects, int64_t n, int64_t partial_max);
/* Bytes the weight-gradient sums and rows hold at most during one backward of n local rows of T on
 * `ranks` ranks, for the planner (the choice above with recomputation, the sinks' copies of this
 * rank's `partial` rows, the streamed products' blocks or the rows moved to the blocks' owners). Not
 * counted: the sums path's rows of panels that straddle ranks (a panel's rows of each product, on
 * the rank that computes it). */
uint64_t dsv4_wgrad_bytes(const dsv4_config *cf, int selects, int recompute, int threads, int64_t n,
                          int64_t T, int ranks, int64_t partial, int64_t partial_max);

/* The planner's count of the messages of one layer backward's weight gradients on each of `size`
 * ranks (lays: every rank's layout of the layer's plan; docs its document table; partial_max as the
 * plan's, dsv4_partial_rows_all), added to out[q]
 * under the DSV4_MSG_WGRAD_* kinds: what dsv4_wgrad_exact and dsv4_wsinks_finish send for that
 * layer (wgrad_plan.c), with or without recomputation. */
dsv4_status dsv4_wgrad_traffic(const dsv4_config *cf, const dsv4_layer_info *in, const dsv4_docs *docs,
                               const dsv4_layout *lays, int size, int recompute, int64_t partial_max,
                               dsv4_cp_stats *out);

#define DSV4_WSINKS_MAX 40
/* lent tensors a set takes, and the pieces a product sink's low halves may lie in (one per pool,
 * and the allocated rest) */
#define DSV4_WSINKS_POOLS 3
#define DSV4_WSINK_LO_PIECES (DSV4_WSINKS_POOLS + 1)

/* 32 bits that may live in a float's storage (a product sink's high halves in its tensor) */
typedef uint32_t dsv4_u32a __attribute__((may_alias));

/* A piece of a product sink's low words: rows from `row` on, at p (p: the piece's first row). */
typedef struct {
  dsv4_u32a *p;
  int64_t row;
  int pool; /* the set's lent tensor it lies in (dsv4_wsinks.pool), -1: allocated */
} dsv4_wlo;

/* A lent zero tensor's floats: n, of which the first `used` hold product sinks' low words. */
typedef struct {
  dsv4_u32a *p;
  int64_t n, used;
} dsv4_wpool;

typedef struct {
  float *out;        /* the gradient tensor (zeroed while registered; restored + sum at finish) */
  float *g0;         /* out's value at registration */
  int64_t n, w;      /* elements; accumulator row width */
  int64_t *acc;      /* [n / w rows] x [2 w]: xacc rows */
  int external;      /* acc belongs to the caller (shared across layer calls): not freed */
  int local;         /* an intermediate sum: not summed over ranks, not stored (its user reads acc) */
  dsv4_wshape shape; /* product sinks (M > 0): rows of partial panels kept for finish */
  /* product sinks: [M, N] exact sums as doubles (wgrad.c "double sums"; acc NULL), each double's
   * two words (wgrad.c: it truncated to a float, and its other 29 fraction bits): dhi is out's own
   * storage (cast) when out was zero at registration, else allocated (out keeps its value); the low
   * words lie in pieces of whole rows (n_lo > 0 marks a product sink), piece j rows [lo[j].row,
   * lo[j + 1].row) from lo[j].p (in a lent tensor, dsv4_wsinks_lend, or allocated) */
  dsv4_u32a *dhi;
  dsv4_wlo lo[DSV4_WSINK_LO_PIECES];
  int n_lo;
  int64_t **promo;   /* per C block: NULL, or its xacc rows once a double add was not exact */
  uint8_t *dused;    /* per C block: which of its doubles' words were written (wgrad.c DUSED_*) */
  int64_t n_blocks;
  int64_t rows_left; /* rows still to come on this rank (dsv4_wsinks_last_rows), -1: not counted */
  int done;          /* its last rows came: out holds the rounded sum, finish has nothing to do */
  float *sa, *sb;
  int64_t *sg;
  uint8_t *sk;
  int64_t ns, cap;
} dsv4_wsink;

typedef struct {
  dsv4_wsink s[DSV4_WSINKS_MAX];
  int count, bad, active;
  dsv4_wpool pool[DSV4_WSINKS_POOLS]; /* lent zero tensors (dsv4_wsinks_lend) */
  int n_pool;
  int64_t last_rows; /* dsv4_wsinks_last_rows (-1: none) */
  dsv4_impl impl;
  const char *what;
} dsv4_wsinks;

/* Starts a set (and makes it the calling thread's active one for dsv4_xrows_finish). */
void dsv4_wsinks_begin(dsv4_wsinks *s, dsv4_impl impl, const char *what);
/* Registers tensor out [n] with accumulator rows of width w (external: the caller's zeroed
 * accumulator, local: see above). A tensor registered twice is one sink. */
dsv4_status dsv4_wsinks_add(dsv4_wsinks *s, float *out, int64_t n, int64_t w, int64_t *external, int local);
/* A product sink: C [M, N] (row width N), whose exact sums are doubles while they stay exact (a
 * block that needs more moves to xacc sums). A C of zeros (every bit) lends its floats to the
 * doubles' high halves until finish (4 more bytes per element, else 8), then holds the rounded sum;
 * any other C is left as it is until finish adds the rounded sum. Only dsv4_wsinks_product adds to
 * it; an error restores it. */
dsv4_status dsv4_wsinks_add_product(dsv4_wsinks *s, float *C, const dsv4_wshape *shape);
/* Lends the floats of spare [n], a gradient tensor that nothing writes until after finish (its own
 * product deferred, as a recomputed backward does for wo_b's, wq_a's and wkv's), to the low halves
 * of the product sinks registered after this call: each takes whole rows from the lent tensors in the
 * order they were lent, while rows fit, and allocates the rest. Up to DSV4_WSINKS_POOLS tensors;
 * only a spare of zeros (every bit) is taken; finish (or an error) leaves it zero again. Returns
 * whether it was taken. */
int dsv4_wsinks_lend(dsv4_wsinks *s, float *spare, int64_t n);
/* A backward on one rank whose every product sink gets `rows` rows in all (over its chunks): a
 * product sink of a zero tensor registered after this call rounds its sums into the tensor when its
 * last rows come (when no partial panel is kept and they form one group), not at finish, so its
 * low halves are never written when it gets at most two calls (1024 tokens: its pages stay
 * unmapped). The same bits: the same exact sum, rounded once by the same function. Not under CP
 * (the ranks' sums are added at finish). */
void dsv4_wsinks_last_rows(dsv4_wsinks *s, int64_t rows);
/* The sink of out (NULL: none). */
dsv4_wsink *dsv4_wsinks_of(dsv4_wsinks *s, const float *out);
/* Terms t [rows, w'] added to the sink of out element by element (serial). */
dsv4_status dsv4_wsinks_terms(dsv4_wsinks *s, const float *out, const float *t, int64_t n);
/* A chunk's rows of a product into its sink: whole panels now, partial ones kept. */
dsv4_status dsv4_wsinks_product(dsv4_wsinks *s, float *C, const dsv4_wpiece *pc);
/* A local sink's floats (what a reference path added to out) into its sums; out zeroed. */
dsv4_status dsv4_wsinks_settle(dsv4_wsinks *s, dsv4_wsink *k);
/* Collective: partial panels to their owners, sums summed over the ranks, every non-local tensor set to
 * its registered value + the sum (rounded once); frees; the set is inactive after. */
dsv4_status dsv4_wsinks_finish(dsv4_wsinks *s, dsv4_xfer *x);
/* Frees without storing (error paths). */
void dsv4_wsinks_drop(dsv4_wsinks *s);

#endif
