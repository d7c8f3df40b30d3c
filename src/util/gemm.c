/* gemm.c: CBLAS wrappers, reference loops, and the globally aligned projection panels. */
#include "gemm.h"
#include "util/workspace.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "util/hash.h"

/* Upper bound of the projection panel: large enough that re-packing the weight per panel costs
 * under ~5% (512-row panels reach ~95% of one whole-matrix sgemm call; docs/perf.md). */
#define PANEL_MAX_ROWS 512
#define PANEL_MIN_ROWS 8

void dsv4_gemm_nt(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, alpha, A, (int)lda, B,
              (int)ldb, beta, C, (int)ldc);
}

void dsv4_gemm_nn(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, alpha, A, (int)lda,
              B, (int)ldb, beta, C, (int)ldc);
}

void dsv4_gemm_tn(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)M, (int)N, (int)K, alpha, A, (int)lda, B,
              (int)ldb, beta, C, (int)ldc);
}

/* One reference loop for all three layouts: element (i, j) = sum_k a(i, k) * b(k, j). */
static void gemm_ref(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t sai,
                     int64_t sak, const float *B, int64_t sbk, int64_t sbj, float beta, float *C,
                     int64_t ldc) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double acc = 0;
      for (int64_t k = 0; k < K; k++) acc += (double)A[i * sai + k * sak] * B[k * sbk + j * sbj];
      float prev = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
      C[i * ldc + j] = (float)(alpha * acc) + prev;
    }
}

void dsv4_gemm_nt_ref(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  gemm_ref(M, N, K, alpha, A, lda, 1, B, 1, ldb, beta, C, ldc);
}
void dsv4_gemm_nn_ref(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  gemm_ref(M, N, K, alpha, A, lda, 1, B, ldb, 1, beta, C, ldc);
}
void dsv4_gemm_tn_ref(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  gemm_ref(M, N, K, alpha, A, 1, lda, B, ldb, 1, beta, C, ldc);
}

int64_t dsv4_panel_rows(int64_t T_global) {
  int64_t p = PANEL_MIN_ROWS;
  while (p < T_global && p < PANEL_MAX_ROWS) p *= 2;
  return p;
}

/* One BLAS call of P rows. A run of local rows [i, j) (consecutive global indices inside one global
 * panel) that fills its panel is computed in place. Runs that do not ("partial": a shard's or a
 * zigzag chunk's ends) are grouped: runs whose positions in their panels (global index mod P) do
 * not overlap share one zero-padded scratch panel, each row at its own position. That is exact for
 * the same reason the panels are: a row's bits depend on its position in a same-shape call and not
 * on the other rows (dsv4_blas_probe_invariance), so rows of two panels can share a call. A zigzag
 * rank at T = 2 N P holds two half panels at complementary positions: one call instead of two. */
typedef struct {
  int64_t first, count; /* runs order[first .. first + count) */
  int whole;            /* the runs are full panels, contiguous in X and Y: one call of count P rows */
} proj_call;

/* Output row of local row r (yrow NULL: r itself); its input row (xrow NULL: r itself). */
static inline int64_t out_row(const int64_t *yrow, int64_t r) { return yrow ? yrow[r] : r; }
static inline int64_t in_row(const int64_t *xrow, int64_t r) { return xrow ? xrow[r] : r; }

/* The product of a panel call: Y = X W^T (nt: W is [N, K], a Linear weight) or Y = X W (W is
 * [K, N], the backward's dx = dY W), overwriting (beta 0) or added to Y (beta 1). An added panel
 * always goes through the scratch rows and is added there, full or partial, so that a row's bits
 * never depend on whether its panel was full on this rank (BLAS's own beta = 1 would fold the old
 * value into its K blocking). */
typedef struct {
  float *Y;
  int64_t ldy;
  const int64_t *yrow, *xrow;
  const float *X, *W;
  int64_t ldx, ldw, N, K;
  int nt, beta;
} proj_op;

static void panel_gemm(const proj_op *o, int64_t P, const float *X, int64_t ldx, float *Y, int64_t ldy) {
  if (o->nt) dsv4_gemm_nt(P, o->N, o->K, 1.0f, X, ldx, o->W, o->ldw, 0.0f, Y, ldy);
  else dsv4_gemm_nn(P, o->N, o->K, 1.0f, X, ldx, o->W, o->ldw, 0.0f, Y, ldy);
}

static void put_row(const proj_op *o, int64_t r, const float *src) {
  float *dst = o->Y + out_row(o->yrow, r) * o->ldy;
  if (!o->beta) {
    memcpy(dst, src, sizeof(float) * (size_t)o->N);
    return;
  }
  for (int64_t j = 0; j < o->N; j++) dst[j] += src[j];
}

static void proj_call_run(const proj_op *o, const int64_t *glob, int64_t P, const int64_t *start,
                          const int64_t *order, const proj_call *c, float *xs, float *ys) {
  const int64_t r0 = order[c->first], K = o->K;
  if (c->whole) { /* full panels: X rows in place */
    const float *x = o->X + in_row(o->xrow, start[r0]) * o->ldx;
    if (!o->beta) {
      panel_gemm(o, c->count * P, x, o->ldx, o->Y + out_row(o->yrow, start[r0]) * o->ldy, o->ldy);
      return;
    }
    panel_gemm(o, P, x, o->ldx, ys, o->N);
    for (int64_t r = start[r0]; r < start[r0 + 1]; r++) put_row(o, r, ys + (glob[r] % P) * o->N);
    return;
  }
  memset(xs, 0, sizeof(float) * (size_t)(P * K));
  for (int64_t q = c->first; q < c->first + c->count; q++)
    for (int64_t r = start[order[q]]; r < start[order[q] + 1]; r++)
      memcpy(xs + (glob[r] % P) * K, o->X + in_row(o->xrow, r) * o->ldx, sizeof(float) * (size_t)K);
  panel_gemm(o, P, xs, K, ys, o->N);
  for (int64_t q = c->first; q < c->first + c->count; q++)
    for (int64_t r = start[order[q]]; r < start[order[q] + 1]; r++) put_row(o, r, ys + (glob[r] % P) * o->N);
}

/* Per-thread scratch of a panel call: P rows of X (zero-padded; only when some panel is partial)
 * and of Y. */
static size_t panel_carve(char *base, int64_t P, int64_t N, int64_t K, int partial, float **xs, float **ys) {
  dsv4_carver c = {base, 0};
  *xs = partial ? dsv4_carve(&c, sizeof(float) * (size_t)(P * K)) : NULL;
  *ys = dsv4_carve(&c, sizeof(float) * (size_t)(P * N));
  return c.used;
}

/* The panel scratch stays with the calling thread between calls: a layer's forward and backward
 * run these products dozens of times with the same shapes, and a fresh block per call (tens of MB
 * for the backward's d qr product) would be faulted in and cleared by the kernel every time (10%
 * of a zigzag backward at 1024 tokens). dsv4_panel_scratch_release gives it back (the layer's
 * public calls do, on return). */
static _Thread_local dsv4_workspace panel_cache;

static dsv4_status panel_scratch(size_t per_thread, int nt, dsv4_workspace *ws) {
  dsv4_status rc = DSV4_OK;
  if (!panel_cache.base || panel_cache.per_thread < per_thread || panel_cache.nthreads < nt) {
    const size_t keep = panel_cache.base && panel_cache.per_thread > per_thread ? panel_cache.per_thread : per_thread;
    dsv4_ws_free(&panel_cache);
    DSV4_TRY(dsv4_ws_alloc(&panel_cache, keep, nt, "projection"));
  }
  *ws = panel_cache;
fail:
  return rc;
}

void dsv4_panel_scratch_release(void) { dsv4_ws_free(&panel_cache); }

/* Rows of full panels in one call of several panels get the bits they get in a call of one panel:
 * OpenBLAS's level-3 driver blocks M (our rows) without changing any element's sum (K alone sets
 * the blocking of the sums), so one call per stretch of full panels re-packs the weight once
 * instead of once per panel (docs/perf.md: 4 - 8% faster projections). Only where no size-chosen
 * kernel can differ between P rows and more: OpenBLAS's small-matrix and direct kernels take
 * products below about 7.3 M multiply-adds, so P N K >= 2^23 is asked of the one-panel call; and
 * only when the probe below finds it so on this BLAS. DSV4_PANEL_MERGE=0 turns it off (tests
 * compare both). The same holds for N (columns) in the weight-gradient products A^T B: their 512 x
 * 512 blocks of a row of blocks share one call (dsv4_blocks_merge), which packs the shared operand
 * once instead of once per block; and for their M (dsv4_rowblocks_merge: blocks of a column of
 * blocks, which the CP rows path takes where its lines are columns of blocks). */
#define MERGE_MIN_MNK (1LL << 23)
/* At most 8 panels (4096 rows) per call: the weight is then packed once per 4096 rows; OpenBLAS's
 * packing buffer, which a call touches for about 1.2 KB per row (4.5 MB at 4096 rows, 0.6 MB for
 * one panel: measured on SkylakeX), stays small; and a call stays inside one of OpenBLAS's column
 * blocks (GEMM_R, some 10^4 rows; the bits were checked equal up to 40960 rows on SkylakeX). */
#define MERGE_MAX_PANELS 8

/* The probes' operands: n values in [-0.5, 0.5) from a fixed LCG (the same on every run). */
static void probe_fill(float *x, int n, uint32_t seed) {
  for (int i = 0; i < n; i++) x[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) / (1 << 24) - 0.5f;
}

/* One call against three calls of a third each, as the library makes them (single-threaded BLAS
 * inside a parallel region): tn 0, an NT projection's rows in three panels of 64 (N 256, K 512);
 * tn 1, a TN weight-gradient product's columns in three blocks of 128 (M 128, K 512); tn 2, its
 * rows in three blocks of 128 (N 128); tn 3, an NN row product's rows (the backward's dx = dY W) in
 * three panels of 64 (N 256, K 512). Each third is 2^23 multiply-adds, the smallest product that
 * merges. */
static int merge_probe(int tn) {
  const int M = tn == 1 ? 128 : tn == 2 ? 384 : 192, N = tn == 1 ? 384 : tn == 2 ? 128 : 256, K = 512;
  float *A = malloc(sizeof(float) * ((size_t)M * K + (size_t)N * K + 2 * (size_t)M * N));
  if (!A) return 0;
  float *B = A + M * K, *C1 = B + N * K, *C2 = C1 + M * N;
  probe_fill(A, M * K + N * K, tn ? 4343 : 4242);
#pragma omp parallel num_threads(2)
  {
#pragma omp master
    {
      dsv4_blas_serial();
      if (tn == 1) {
        dsv4_gemm_tn(M, N, K, 1.0f, A, M, B, N, 0.0f, C1, N);
        for (int c = 0; c < N; c += N / 3) dsv4_gemm_tn(M, N / 3, K, 1.0f, A, M, B + c, N, 0.0f, C2 + c, N);
      } else if (tn == 2) {
        dsv4_gemm_tn(M, N, K, 1.0f, A, M, B, N, 0.0f, C1, N);
        for (int r = 0; r < M; r += M / 3) dsv4_gemm_tn(M / 3, N, K, 1.0f, A + r, M, B, N, 0.0f, C2 + r * N, N);
      } else if (tn == 3) {
        dsv4_gemm_nn(M, N, K, 1.0f, A, K, B, N, 0.0f, C1, N);
        for (int r = 0; r < M; r += M / 3) dsv4_gemm_nn(M / 3, N, K, 1.0f, A + r * K, K, B, N, 0.0f, C2 + r * N, N);
      } else {
        dsv4_gemm_nt(M, N, K, 1.0f, A, K, B, K, 0.0f, C1, N);
        for (int r = 0; r < M; r += M / 3) dsv4_gemm_nt(M / 3, N, K, 1.0f, A + r * K, K, B, K, 0.0f, C2 + r * N, N);
      }
    }
  }
  const int same = memcmp(C1, C2, sizeof(float) * M * N) == 0;
  free(A);
  return same;
}

/* The rule every merge shares: the one-part call is large enough, DSV4_PANEL_MERGE is not 0, and the
 * probe of that kind passed (once per process; the race of two first callers is benign). */
static int merges(int tn, int64_t M, int64_t N, int64_t K) {
  static int probed[4] = {-1, -1, -1, -1};
  if (M * N * K < MERGE_MIN_MNK) return 0;
  const char *e = getenv("DSV4_PANEL_MERGE");
  if (e && e[0] == '0') return 0;
  int ok = __atomic_load_n(&probed[tn], __ATOMIC_ACQUIRE);
  if (ok < 0) {
    ok = merge_probe(tn);
    __atomic_store_n(&probed[tn], ok, __ATOMIC_RELEASE);
  }
  return ok;
}

int dsv4_panels_merge(int64_t P, int64_t N, int64_t K) { return merges(0, P, N, K); }

int dsv4_nn_panels_merge(int64_t P, int64_t N, int64_t K) { return merges(3, P, N, K); }

int dsv4_blocks_merge(int64_t M, int64_t nb, int64_t K) { return merges(1, M, nb, K); }

int dsv4_rowblocks_merge(int64_t mb, int64_t N, int64_t K) { return merges(2, mb, N, K); }

/* Groups of partial runs, first fit over the last few groups (a shard has a handful of partial runs:
 * its ends, a zigzag chunk's ends). Positions in use are bits of a P-bit mask per group. */
#define GROUP_LOOKBACK 8
#define MASK_WORDS (PANEL_MAX_ROWS / 64)

static int mask_free(const uint64_t *m, int64_t a, int64_t b) {
  for (int64_t p = a; p < b; p++)
    if (m[p / 64] >> (p % 64) & 1) return 0;
  return 1;
}

static void mask_set(uint64_t *m, int64_t a, int64_t b) {
  for (int64_t p = a; p < b; p++) m[p / 64] |= (uint64_t)1 << (p % 64);
}

/* Whether full run r continues full run r - 1 in one call of several panels: the next local rows and
 * (mapped) the next input and output rows, at most `cap` panels per call. The global panels need
 * not be consecutive: a row's bits do not depend on the other rows of its call (the probe), so a
 * zigzag rank's two chunks, which lie next to each other in its shard, share a call and the weight
 * is packed once for both. */
static int joins(const proj_op *o, const int64_t *start, int64_t r, const proj_call *last, int64_t P, int64_t cap) {
  const int64_t i = start[r];
  return last && last->whole && last->count < cap && start[r - 1] + P == i &&
         out_row(o->yrow, i) == out_row(o->yrow, i - 1) + 1 && in_row(o->xrow, i) == in_row(o->xrow, i - 1) + 1;
}

/* Fills calls (full runs first, then the groups) and order; returns the number of calls. Adjacent
 * full panels share one call of up to `cap` panels (cap 1: one call per panel). */
static int64_t plan_calls(const int64_t *glob, const proj_op *o, const int64_t *start, int64_t runs, int64_t P,
                          int64_t cap, proj_call *calls, int64_t *order, uint64_t (*mask)[MASK_WORDS],
                          int64_t *group_of) {
  int64_t nc = 0, ng = 0, no = 0;
  for (int64_t r = 0; r < runs; r++) {
    if (start[r + 1] - start[r] != P) continue;
    proj_call *last = nc && order[no - 1] == r - 1 ? &calls[nc - 1] : NULL;
    if (joins(o, start, r, last, P, cap)) last->count++;
    else calls[nc++] = (proj_call){no, 1, 1};
    order[no++] = r;
  }
  const int64_t first_group = nc;
  for (int64_t r = 0; r < runs; r++) {
    if (start[r + 1] - start[r] == P) continue;
    const int64_t a = glob[start[r]] % P, b = a + start[r + 1] - start[r];
    int64_t g = ng;
    for (int64_t h = ng > GROUP_LOOKBACK ? ng - GROUP_LOOKBACK : 0; h < ng && g == ng; h++)
      if (mask_free(mask[h], a, b)) g = h;
    if (g == ng) memset(mask[ng++], 0, sizeof mask[0]);
    mask_set(mask[g], a, b);
    group_of[r] = g;
  }
  /* order the partial runs by group (stable: runs keep their order inside a group) */
  for (int64_t g = 0; g < ng; g++) {
    calls[first_group + g] = (proj_call){no, 0, 0};
    for (int64_t r = 0; r < runs; r++)
      if (start[r + 1] - start[r] != P && group_of[r] == g) order[no++] = r, calls[first_group + g].count++;
  }
  return first_group + ng;
}

dsv4_status dsv4_proj_rows(float *Y, int64_t ldy, const float *X, int64_t ldx, const float *W,
                           int64_t n, int64_t N, int64_t K, const int64_t *glob, int64_t P,
                           dsv4_impl impl) {
  return dsv4_proj_rows_map(Y, ldy, NULL, X, ldx, W, n, N, K, glob, P, impl);
}

static dsv4_status panel_rows(const proj_op *o, int64_t n, const int64_t *glob, int64_t P) {
  dsv4_status rc = DSV4_OK;
  int64_t *start = NULL, *order = NULL, *group_of = NULL;
  proj_call *calls = NULL;
  uint64_t (*mask)[MASK_WORDS] = NULL;
  dsv4_workspace ws = {0};
  const int64_t *yrow = o->yrow, *xrow = o->xrow;
  DSV4_CHECK(P >= 1 && P <= PANEL_MAX_ROWS, DSV4_ERR_ARG, "projection: panel of %lld rows (1 .. %d)", (long long)P,
             PANEL_MAX_ROWS);
  /* Cut the rows into panel runs: a run ends at a global panel boundary, a gap in glob or (mapped
   * rows) a jump in yrow or xrow. */
  DSV4_ALLOC(start, n + 2);
  int64_t runs = 0;
  for (int64_t i = 0; i < n; i++)
    if (i == 0 || glob[i] != glob[i - 1] + 1 || glob[i] % P == 0 || (yrow && yrow[i] != yrow[i - 1] + 1) ||
        (xrow && xrow[i] != xrow[i - 1] + 1))
      start[runs++] = i;
  start[runs] = n;
  DSV4_ALLOC(order, runs + 1);
  DSV4_ALLOC(group_of, runs + 1);
  DSV4_ALLOC(calls, runs + 1);
  DSV4_ALLOC(mask, runs + 1);
  /* One single-threaded BLAS call per panel (or per stretch of full panels), calls spread over the
   * threads: a row's bits then depend neither on its position nor on the thread count (OpenBLAS's
   * own threading splits a call into thread-count-dependent sub-blocks). */
  const int nt = dsv4_nthreads();
  int64_t full = 0; /* full panels; the rest are partial */
  for (int64_t r = 0; r < runs; r++) full += start[r + 1] - start[r] == P;
  const int partial = full < runs;
  const int merge = !o->beta && (o->nt ? dsv4_panels_merge(P, o->N, o->K) : dsv4_nn_panels_merge(P, o->N, o->K));
  int64_t cap = merge ? (full + nt - 1) / nt : 1;
  cap = cap < MERGE_MAX_PANELS ? cap : MERGE_MAX_PANELS;
  const int64_t ncalls = plan_calls(glob, o, start, runs, P, cap > 1 ? cap : 1, calls, order, mask, group_of);
  const int scratch = o->beta || partial;
  float *xs = NULL, *ys = NULL;
  if (scratch) DSV4_TRY(panel_scratch(panel_carve(NULL, P, o->N, o->K, partial, &xs, &ys), nt, &ws));
#pragma omp parallel num_threads(nt) private(xs, ys)
  {
    dsv4_blas_serial();
    xs = ys = NULL;
    if (scratch) panel_carve(dsv4_ws_thread(&ws), P, o->N, o->K, partial, &xs, &ys);
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < ncalls; c++) proj_call_run(o, glob, P, start, order, &calls[c], xs, ys);
  }
fail:
  free(start);
  free(order);
  free(group_of);
  free(calls);
  free(mask);
  return rc;
}

dsv4_status dsv4_proj_rows_map(float *Y, int64_t ldy, const int64_t *yrow, const float *X, int64_t ldx,
                               const float *W, int64_t n, int64_t N, int64_t K, const int64_t *glob, int64_t P,
                               dsv4_impl impl) {
  if (impl == DSV4_IMPL_NAIVE) {
    if (!yrow) dsv4_gemm_nt_ref(n, N, K, 1.0f, X, ldx, W, K, 0.0f, Y, ldy);
    for (int64_t i = 0; yrow && i < n; i++)
      dsv4_gemm_nt_ref(1, N, K, 1.0f, X + i * ldx, ldx, W, K, 0.0f, Y + yrow[i] * ldy, ldy);
    return DSV4_OK;
  }
  const proj_op o = {.Y = Y, .ldy = ldy, .yrow = yrow, .X = X, .W = W, .ldx = ldx, .ldw = K, .N = N, .K = K, .nt = 1};
  return panel_rows(&o, n, glob, P);
}

dsv4_status dsv4_rows_nn(float *Y, int64_t ldy, const float *X, int64_t ldx, const float *W, int64_t ldw, int64_t n,
                         int64_t N, int64_t K, const int64_t *glob, int64_t P, int beta, dsv4_impl impl) {
  return dsv4_rows_nn_map(Y, ldy, X, ldx, NULL, W, ldw, n, N, K, glob, P, beta, impl);
}

dsv4_status dsv4_rows_nn_map(float *Y, int64_t ldy, const float *X, int64_t ldx, const int64_t *xrow, const float *W,
                             int64_t ldw, int64_t n, int64_t N, int64_t K, const int64_t *glob, int64_t P, int beta,
                             dsv4_impl impl) {
  if (n <= 0 || N <= 0) return DSV4_OK;
  if (impl == DSV4_IMPL_NAIVE) {
    if (!xrow) dsv4_gemm_nn_ref(n, N, K, 1.0f, X, ldx, W, ldw, beta ? 1.0f : 0.0f, Y, ldy);
    for (int64_t i = 0; xrow && i < n; i++)
      dsv4_gemm_nn_ref(1, N, K, 1.0f, X + xrow[i] * ldx, ldx, W, ldw, beta ? 1.0f : 0.0f, Y + i * ldy, ldy);
    return DSV4_OK;
  }
  const proj_op o = {.Y = Y, .ldy = ldy, .xrow = xrow, .X = X, .W = W, .ldx = ldx, .ldw = ldw, .N = N, .K = K,
                     .beta = beta != 0};
  return panel_rows(&o, n, glob, P);
}

int dsv4_blas_probe_invariance(void) {
  /* What the library relies on (docs/design.md): a row at the same position of a same-shape call
   * gets the same bits whatever the other rows hold (zero rows of a padded panel, other tokens).
   * Rows 1, 3, 5, ... of A2 differ from A1 (every third one zero, as padding); even rows are the
   * same and must give the same output rows. */
  enum { M = 64, N = 96, K = 160 };
  float *A1 = malloc(sizeof(float) * (2 * M * K + N * K + 2 * M * N));
  if (!A1) return 0;
  float *A2 = A1 + M * K, *B = A2 + M * K, *C1 = B + N * K, *C2 = C1 + M * N;
  probe_fill(A1, 2 * M * K + N * K, 12345);
  for (int r = 0; r < M; r += 2) memcpy(A2 + r * K, A1 + r * K, sizeof(float) * K);
  for (int r = 3; r < M; r += 6) memset(A2 + r * K, 0, sizeof(float) * K);
  /* inside an active parallel region (two threads, one working), as the library calls BLAS for
   * per-token products: OpenBLAS then runs each call on one thread */
#pragma omp parallel num_threads(2)
  {
#pragma omp master
    {
      dsv4_gemm_nt(M, N, K, 1.0f, A1, K, B, K, 0.0f, C1, N);
      dsv4_gemm_nt(M, N, K, 1.0f, A2, K, B, K, 0.0f, C2, N);
    }
  }
  int same = 1;
  for (int r = 0; r < M; r += 2) same &= memcmp(C1 + r * N, C2 + r * N, sizeof(float) * N) == 0;
  free(A1);
  return same;
}

const char *dsv4_blas_kernels(void) { return openblas_get_corename(); }

/* The products' shapes cross the kernels' edge tiles in M and N (37, 29: no multiple of 4 or 8)
 * and, with K = 1031, more than one K block of the usual kernels (where a family rounds its
 * partial sums): two families, or two BLAS builds under one name, that round differently are very
 * likely to differ here; and the family's name is hashed too. Called as the library calls BLAS
 * (one thread, inside a parallel region). The operands are static (285 KB, written once under
 * pthread_once): no allocation that could fail on one rank only and leave the others waiting. */
enum { FP_M = 37, FP_N = 29, FP_K = 1031 };
static float fp_buf[FP_M * FP_K + FP_N * FP_K + 3 * FP_M * FP_N];

static uint64_t fingerprint(void) {
  const int M = FP_M, N = FP_N, K = FP_K;
  const char *core = openblas_get_corename();
  uint64_t h = dsv4_fnv1a(DSV4_FNV_OFFSET, core ? core : "?", core ? strlen(core) : 1);
  float *A = fp_buf, *B = A + M * K, *C = B + N * K;
  probe_fill(A, M * K + N * K, 2718);
#pragma omp parallel num_threads(2)
  {
#pragma omp master
    {
      dsv4_blas_serial();
      dsv4_gemm_nt(M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);             /* A [M, K], B [N, K] */
      dsv4_gemm_nn(M, N, K, 1.0f, A, K, B, N, 0.0f, C + M * N, N);     /* B read as [K, N] */
      dsv4_gemm_tn(M, N, K, 1.0f, A, M, B, N, 0.0f, C + 2 * M * N, N); /* A read as [K, M] */
    }
  }
  return dsv4_fnv1a(h, C, sizeof(float) * 3 * (size_t)M * N);
}

static pthread_once_t fingerprint_once = PTHREAD_ONCE_INIT;
static uint64_t fingerprint_value;

static void fingerprint_init(void) { fingerprint_value = fingerprint(); }

uint64_t dsv4_blas_fingerprint(void) {
  pthread_once(&fingerprint_once, fingerprint_init);
  return fingerprint_value;
}
