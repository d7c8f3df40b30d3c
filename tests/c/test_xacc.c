/* test_xacc.c: the exact gradient sums (src/util/xacc.h, xrows.h) and the backward's products that
 * make gradients independent of the thread count and the CP degree (src/util/gemm.h: dsv4_rows_nn;
 * src/model/wgrad.h: weight gradients over global panels). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "model/wgrad.h"
#include "model/wgrad_int.h"
#include "util/gemm.h"
#include "util/par.h"
#include "util/xrows.h"

enum { NT = 4000 };

/* Terms over 20 orders of magnitude, both signs, with heavy cancellation. */
static void terms(float *t, int n) {
  uint32_t s = 99;
  for (int i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    const float m = (float)(s >> 8) / (1 << 24) - 0.5f;
    s = s * 1664525u + 1013904223u;
    t[i] = ldexpf(m, (int)(s >> 27) - 24); /* 2^-25 .. 2^6 */
    if (i % 7 == 0) t[i] = 3e5f * m;        /* and some large ones */
  }
}

static float sum_in_order(const float *t, const int *order, int n) {
  int64_t hi = 0, lo = 0;
  int bad = 0;
  for (int i = 0; i < n; i++) bad |= dsv4_xacc_add(&hi, &lo, &t[order[i]], 1);
  tu_check(!bad, "xacc: %d terms in range", n);
  return dsv4_xacc_value(hi, lo);
}

/* Forward, reverse, a shuffled order and two halves merged give the same bits; the value is the
 * double sum rounded (to a float's accuracy). */
static void order_independent(void) {
  float *t = malloc(sizeof(float) * NT);
  int *ord = malloc(sizeof(int) * NT);
  terms(t, NT);
  double ref = 0;
  for (int i = 0; i < NT; i++) ref += t[i], ord[i] = i;
  const float fwd = sum_in_order(t, ord, NT);
  for (int i = 0; i < NT; i++) ord[i] = NT - 1 - i;
  const float rev = sum_in_order(t, ord, NT);
  uint32_t s = 7;
  for (int i = NT - 1; i > 0; i--) {
    s = s * 1664525u + 1013904223u;
    const int j = (int)(s % (uint32_t)(i + 1)), k = ord[i];
    ord[i] = ord[j], ord[j] = k;
  }
  const float shuf = sum_in_order(t, ord, NT);
  int64_t h1 = 0, l1 = 0, h2 = 0, l2 = 0;
  for (int i = 0; i < NT; i++) dsv4_xacc_add(i % 3 ? &h1 : &h2, i % 3 ? &l1 : &l2, &t[i], 1);
  dsv4_xacc_merge(&h1, &l1, &h2, &l2, 1);
  const float merged = dsv4_xacc_value(h1, l1);
  tu_check(!memcmp(&fwd, &rev, 4) && !memcmp(&fwd, &shuf, 4) && !memcmp(&fwd, &merged, 4),
           "xacc: forward %.9g, reverse %.9g, shuffled %.9g, two parts merged %.9g: the same bits", fwd, rev, shuf,
           merged);
  tu_check(fabs(fwd - ref) <= 1e-6 * fabs(ref) + 1e-12, "xacc: the exact sum %.9g is the double sum %.9g rounded", fwd,
           ref);
  /* plain float sums of the same terms in the two orders do differ (what the exact sums are for) */
  float a = 0, b = 0;
  for (int i = 0; i < NT; i++) a += t[i], b += t[NT - 1 - i];
  printf("note: float sums forward %.9g, reverse %.9g\n", a, b);
  free(t), free(ord);
}

/* The vector paths of dsv4_xacc_add (AVX-512 and AVX2 builds) give the scalar reference's bits, bad
 * terms included (refused by both wherever they fall in a vector), over rounds that make carries.
 * N = 16 k + 13: an AVX-512 build runs every path (992 elements by sixteens, 8 by eights, 4 by fours,
 * 1 alone). */
static void vector_is_scalar(void) {
  enum { N = 1005 };
  float *t = malloc(sizeof(float) * N);
  int64_t *v = calloc(4 * N, sizeof(int64_t)), *s = v + 2 * N;
  terms(t, N);
  t[17] = NAN, t[500] = 0x1p30f, t[999] = -INFINITY, t[3] = -0x1p-60f, t[4] = 0x1p23f, t[1002] = -0x1p23f;
  int bv = 0, bs = 0;
  for (int rep = 0; rep < 5; rep++) {
    bv |= dsv4_xacc_add(v, v + N, t, N);
    for (int e = 0; e < N; e++) bs |= dsv4_xacc_add1(s + e, s + N + e, t[e]);
  }
  tu_check(bv && bs && !memcmp(v, s, sizeof(int64_t) * 2 * N),
           "xacc: the %s add equals the scalar reference, bad terms refused by both",
#if defined(__AVX512F__)
           "AVX-512 (and AVX2 tail)"
#elif defined(__AVX2__)
           "AVX2"
#else
           "(this build: scalar)"
#endif
  );
  /* a bad term alone in each path's part is seen (the flags of the paths are combined) */
  for (int at = 0; at < 4; at++) {
    const int e = (const int[]){8, 995, 1001, 1004}[at]; /* by sixteens (or fours), eights, fours, alone */
    memset(v, 0, sizeof(int64_t) * 2 * N);
    for (int i = 0; i < N; i++) t[i] = 0.5f;
    t[e] = NAN;
    tu_check(dsv4_xacc_add(v, v + N, t, N) && v[e] == 0 && v[N + e] == 0 && v[e + 1 - 2 * (e == N - 1)] != 0,
             "xacc: a bad term at element %d alone is refused, its neighbours added", e);
  }
  free(t), free(v);
}

/* k terms per element added in one pass (dsv4_xacc_addk_) and rounded from registers
 * (dsv4_xacc_sumk) give the bits of adding them one at a time (set, add, store), for groups of
 * 1, 3 and 8 and lengths that are not multiples of the vector or the chunk; a bad term in any
 * group is refused by every path. */
static void grouped_is_serial(void) {
  enum { N = 1001, K = 8 };
  float *t = malloc(sizeof(float) * K * N), *base = malloc(sizeof(float) * N);
  float *o1 = malloc(sizeof(float) * N), *o2 = malloc(sizeof(float) * N);
  int64_t *s = calloc(4 * N, sizeof(int64_t)), *g = s + 2 * N;
  terms(t, K * N);
  tu_fill(base, N, 5, 10.0f);
  const float *tk[K];
  for (int j = 0; j < K; j++) tk[j] = t + j * N;
  for (int k = 1; k <= K; k += k < 3 ? 2 : 5) {
    int bs = 0, bg = 0;
    for (int j = 0; j < k; j++) bs |= j ? dsv4_xacc_add(s, s + N, tk[j], N) : dsv4_xacc_set(s, s + N, tk[j], N);
    bg |= dsv4_xacc_addk_(g, g + N, tk, k, N, 1);
    tu_check(!bs && !bg && !memcmp(s, g, sizeof(int64_t) * 2 * N), "xacc: %d terms per element in one pass: the serial sums", k);
    memcpy(o1, base, sizeof(float) * N);
    memcpy(o2, base, sizeof(float) * N);
    dsv4_xacc_store(o1, s, s + N, N, 1);
    bg |= dsv4_xacc_sumk(o2, tk, k, N, 1);
    tu_check(!bg && !memcmp(o1, o2, sizeof(float) * N), "xacc: %d terms rounded from registers, added to out: the same bits", k);
    dsv4_xacc_store(o1, s, s + N, N, 0);
    dsv4_xacc_sumk(o2, tk, k, N, 0);
    tu_check(!memcmp(o1, o2, sizeof(float) * N), "xacc: %d terms rounded from registers, stored: the same bits", k);
  }
  memset(o2, 0, sizeof(float) * N);
  tu_check(!dsv4_xacc_sumk(o2, tk, 0, N, 0) && o2[0] == 0.0f && o2[N - 1] == 0.0f, "xacc: no terms store zeros");
  t[5 * N + 998] = NAN;       /* in a vector */
  t[2 * N + N - 1] = INFINITY; /* in the scalar tail */
  for (int e = 998; e <= N - 1; e += N - 1 - 998) {
    const float *one[K];
    for (int j = 0; j < K; j++) one[j] = tk[j] + e;
    tu_check(dsv4_xacc_addk_(g, g + N, one, K, 1, 1) && dsv4_xacc_sumk(o2, one, K, 1, 0),
             "xacc: the bad term of element %d refused by both grouped paths", e);
  }
  tu_check(dsv4_xacc_addk_(g, g + N, tk, K, N, 1) && dsv4_xacc_sumk(o2, tk, K, N, 0),
           "xacc: bad terms in a vector and in the scalar tail refused by both grouped paths");
  free(t), free(base), free(o1), free(o2), free(s);
}

/* Terms out of range are refused (never added silently): NaN, infinities, |t| >= 2^24. */
static void refuses_bad_terms(void) {
  static const float bad[] = {NAN, INFINITY, -INFINITY, 0x1p24f, -0x1p24f, 1e30f};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int64_t hi = 0, lo = 0;
    const int r = dsv4_xacc_add(&hi, &lo, &bad[i], 1);
    tu_check(r && hi == 0 && lo == 0, "xacc: term %g refused and not added", (double)bad[i]);
  }
  const float good[] = {0x1p24f - 1.0f, 0x1p-80f, -0x1p-30f, 0.0f};
  int64_t hi = 0, lo = 0;
  int refused = 0;
  for (int i = 0; i < 4; i++) refused |= dsv4_xacc_add(&hi, &lo, &good[i], 1); /* four terms, one element */
  tu_check(!refused, "xacc: 2^24 - 1, 2^-80, -2^-30 and 0 accepted");
  const float v = dsv4_xacc_value(hi, lo);
  tu_check(v == (float)((double)(0x1p24f - 1.0f) - 0x1p-30), "xacc: their sum %.9g", (double)v);
}

/* Rows accumulated by 1 and by 3 threads (each thread its own copy) give the same bits. */
static void rows_any_threads(void) {
  enum { R = 37, W = 19, Q = 600 };
  float *t = malloc(sizeof(float) * Q * W), *o1 = calloc(R * W, sizeof(float)), *o3 = calloc(R * W, sizeof(float));
  int32_t row[Q];
  tu_fill(t, Q * W, 11, 100.0f);
  for (int q = 0; q < Q; q++) row[q] = (q * 7 + q / 5) % R;
  for (int nt = 1; nt <= 3; nt += 2) {
    dsv4_xrows x;
    tu_ok(dsv4_xrows_alloc(&x, 0, R, W, nt, "test"), "xrows alloc");
    int bad = 0;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 3) reduction(| : bad)
    for (int q = 0; q < Q; q++) bad |= dsv4_xrows_add(&x, row[q], t + q * W, 1);
    x.bad = bad;
    tu_ok(dsv4_xrows_finish(&x, nt == 1 ? o1 : o3, "test"), "xrows finish");
  }
  tu_check(!memcmp(o1, o3, sizeof(float) * R * W), "xrows: 1 and 3 threads give the same bits");
  dsv4_xrows x;
  tu_ok(dsv4_xrows_alloc(&x, 0, 1, 1, 1, "test op"), "xrows alloc");
  x.bad = 1;
  tu_check(dsv4_xrows_finish(&x, o1, "test op") == DSV4_ERR_ARG, "xrows: a bad term is an error at the finish");
  free(t), free(o1), free(o3);
}

/* Lists of rows added as groups (dsv4_xrows_add_group: a row named by several lists, or twice by
 * one, takes its terms in one pass) give the bits of adding them row by row; the row map is clear
 * after each group, and a bad term is reported. */
static void rows_group(void) {
  enum { R = 29, R0 = 5, W = 37, L = DSV4_XROWS_LISTS, N = 40, GROUPS = 9 };
  float *t = malloc(sizeof(float) * GROUPS * L * N * W), *o1 = calloc(R * W, sizeof(float));
  float *o2 = calloc(R * W, sizeof(float));
  int32_t *rows = malloc(sizeof(int32_t) * GROUPS * L * N);
  tu_fill(t, GROUPS * L * N * W, 21, 300.0f);
  uint32_t s = 7;
  for (int i = 0; i < GROUPS * L * N; i++) {
    s = s * 1664525u + 1013904223u;
    rows[i] = R0 + (int32_t)((s >> 8) % R);
  }
  dsv4_xrows x1, x2;
  tu_ok(dsv4_xrows_alloc(&x1, R0, R, W, 1, "test"), "xrows alloc");
  tu_ok(dsv4_xrows_alloc(&x2, R0, R, W, 1, "test"), "xrows alloc");
  dsv4_xrows_group g;
  dsv4_carver c = {NULL, 0};
  dsv4_xrows_group_carve(&c, R, L * N, &g);
  char *ws = malloc(c.used);
  c = (dsv4_carver){ws, 0};
  dsv4_xrows_group_carve(&c, R, L * N, &g);
  dsv4_xrows_group_clear(&g, R);
  int bad = 0, clear = 1;
  for (int gi = 0; gi < GROUPS; gi++) {
    const int nl = 1 + gi % L; /* 1 to L lists of 0 to N - 1 rows */
    for (int l = 0; l < nl; l++) {
      const int64_t i = ((int64_t)gi * L + l) * N;
      const int n = (gi + 3 * l) % N;
      for (int j = 0; j < n; j++) bad |= dsv4_xrows_add(&x1, rows[i + j], t + (i + j) * W, 1);
      dsv4_xrows_group_push(&g, rows + i, n, t + i * W);
    }
    bad |= dsv4_xrows_add_group(&x2, &g);
    for (int r = 0; r < R; r++) clear &= g.slot[r] == -1;
  }
  tu_check(!bad, "xrows group: terms in range");
  tu_check(clear, "xrows group: the row map is clear after each group");
  tu_ok(dsv4_xrows_finish(&x1, o1, "test"), "xrows finish");
  tu_ok(dsv4_xrows_finish(&x2, o2, "test"), "xrows finish");
  tu_check(!memcmp(o1, o2, sizeof(float) * R * W), "xrows group: the bits of adding row by row");
  tu_ok(dsv4_xrows_alloc(&x2, R0, R, W, 1, "test"), "xrows alloc");
  t[3 * W + 4] = INFINITY;
  dsv4_xrows_group_push(&g, rows, 4, t);
  tu_check(dsv4_xrows_add_group(&x2, &g) != 0, "xrows group: a non-finite term is reported");
  dsv4_xrows_free(&x2);
  free(ws), free(rows), free(t), free(o1), free(o2);
}

/* One copy that 3 threads add into under its row locks (dsv4_xrows_alloc_locked: the compressed rows'
 * sums), row by row and as groups of lists over a few rows (so that the threads contend for them),
 * gives the bits of one thread adding into its own copy; every lock is free afterwards. */
static void rows_locked(void) {
  enum { R = 7, W = 67, L = DSV4_XROWS_LISTS, N = 24, GROUPS = 48, NT = 3 };
  const int64_t nterms = (int64_t)GROUPS * L * N;
  float *t = malloc(sizeof(float) * nterms * W), *o[3];
  int32_t *rows = malloc(sizeof(int32_t) * nterms);
  for (int i = 0; i < 3; i++) o[i] = calloc(R * W, sizeof(float));
  tu_fill(t, nterms * W, 31, 200.0f);
  uint32_t s = 11;
  for (int64_t i = 0; i < nterms; i++) {
    s = s * 1664525u + 1013904223u;
    rows[i] = (int32_t)((s >> 8) % R);
  }
  dsv4_xrows x[3];
  tu_ok(dsv4_xrows_alloc(&x[0], 0, R, W, 1, "test"), "xrows alloc");
  tu_ok(dsv4_xrows_alloc_locked(&x[1], 0, R, W, NT, "test"), "xrows alloc locked");
  tu_ok(dsv4_xrows_alloc_locked(&x[2], 0, R, W, NT, "test"), "xrows alloc locked");
  int bad = 0;
  for (int64_t i = 0; i < nterms; i++) bad |= dsv4_xrows_add(&x[0], rows[i], t + i * W, 1);
#pragma omp parallel for num_threads(NT) schedule(dynamic, 1) reduction(| : bad)
  for (int64_t i = 0; i < nterms; i++) bad |= dsv4_xrows_add(&x[1], rows[i], t + i * W, 1);
  dsv4_carver c = {NULL, 0};
  dsv4_xrows_group g;
  dsv4_xrows_group_carve(&c, R, L * N, &g);
  const size_t per = c.used;
  char *ws = malloc(per * NT);
#pragma omp parallel num_threads(NT) reduction(| : bad)
  {
    dsv4_xrows_group gt;
    dsv4_carver ct = {ws + per * (size_t)omp_get_thread_num(), 0};
    dsv4_xrows_group_carve(&ct, R, L * N, &gt);
    dsv4_xrows_group_clear(&gt, R);
#pragma omp for schedule(dynamic, 1)
    for (int gi = 0; gi < GROUPS; gi++) {
      for (int l = 0; l < L; l++) {
        const int64_t i = ((int64_t)gi * L + l) * N;
        dsv4_xrows_group_push(&gt, rows + i, N, t + i * W);
      }
      bad |= dsv4_xrows_add_group(&x[2], &gt);
    }
  }
  int free_locks = 1;
  for (int k = 1; k < 3; k++)
    for (int r = 0; r < R; r++) free_locks &= x[k].lock[r] == 0;
  tu_check(!bad && free_locks, "xrows locked: terms in range, every lock free after the adds");
  for (int k = 0; k < 3; k++) tu_ok(dsv4_xrows_finish(&x[k], o[k], "test"), "xrows finish");
  tu_check(!memcmp(o[0], o[1], sizeof(float) * R * W) && !memcmp(o[0], o[2], sizeof(float) * R * W),
           "xrows locked: %d threads on one copy, row by row and in groups, give one thread's bits", NT);
  free(ws), free(rows), free(t);
  for (int i = 0; i < 3; i++) free(o[i]);
}

/* dx-style row products in global panels, added to what the rows hold: a shard's rows equal the whole
 * stream's bits, with 1 and 2 threads. */
static void rows_nn_panels(void) {
  enum { N = 24, K = 40, T = 300 };
  const int64_t P = dsv4_panel_rows(T);
  float *X = malloc(sizeof(float) * T * K), *W = malloc(sizeof(float) * K * N), *Y0 = malloc(sizeof(float) * T * N);
  float *Y = malloc(sizeof(float) * T * N), *Ys = malloc(sizeof(float) * T * N), *R = malloc(sizeof(float) * T * N);
  int64_t glob[T];
  tu_fill(X, T * K, 1, 1.0f);
  tu_fill(W, K * N, 2, 1.0f);
  tu_fill(Y0, T * N, 3, 1.0f);
  for (int i = 0; i < T; i++) glob[i] = i;
  memcpy(Y, Y0, sizeof(float) * T * N);
  memcpy(R, Y0, sizeof(float) * T * N);
  tu_ok(dsv4_rows_nn(Y, N, X, K, W, N, T, N, K, glob, P, 1, DSV4_IMPL_FAST), "rows_nn");
  dsv4_gemm_nn_ref(T, N, K, 1.0f, X, K, W, N, 1.0f, R, N);
  tu_close("rows_nn (beta 1) vs reference loops", Y, R, T * N, 1e-5, 1.0);
  const int old = dsv4_threads_enter(2);
  static const int64_t cut[][2] = {{0, 100}, {100, 300}, {37, 263}, {299, 300}};
  int same = 1;
  for (size_t c = 0; c < sizeof cut / sizeof cut[0]; c++) {
    const int64_t a = cut[c][0], n = cut[c][1] - a;
    memcpy(Ys, Y0 + a * N, sizeof(float) * n * N);
    tu_ok(dsv4_rows_nn(Ys, N, X + a * K, K, W, N, n, N, K, glob + a, P, 1, DSV4_IMPL_FAST), "rows_nn shard");
    same &= !memcmp(Ys, Y + a * N, sizeof(float) * n * N);
  }
  dsv4_threads_leave(old);
  tu_check(same, "rows_nn: shards [0,100) [100,300) [37,263) [299,300) on 2 threads: the whole stream's bits");
  free(X), free(W), free(Y0), free(Y), free(Ys), free(R);
  dsv4_panel_scratch_release();
}

/* dx-style row products read from mapped input rows (dsv4_rows_nn_map: a layout's segments, each
 * after its halo rows, in one call): a zigzag rank's two half panels, a shard of three segments, a
 * full panel whose rows are not contiguous in X, and every row from its own place in reverse order
 * give the whole stream's bits, on 1 and 2 threads; the naive path reads the same rows. */
static void rows_nn_mapped(void) {
  enum { N = 24, K = 40, T = 1024, GAP = 3 };
  const int64_t P = dsv4_panel_rows(T);
  float *X = malloc(sizeof(float) * T * K), *W = malloc(sizeof(float) * K * N), *Y0 = malloc(sizeof(float) * T * N);
  float *Y = malloc(sizeof(float) * T * N), *Xm = calloc((size_t)(T + 8 * GAP) * K, sizeof(float));
  float *Ym = malloc(sizeof(float) * T * N), *R = malloc(sizeof(float) * T * N);
  int64_t glob[T], gs[T], xrow[T];
  tu_fill(X, T * K, 11, 1.0f);
  tu_fill(W, K * N, 12, 1.0f);
  tu_fill(Y0, T * N, 13, 1.0f);
  for (int i = 0; i < T; i++) glob[i] = i;
  memcpy(Y, Y0, sizeof(float) * T * N);
  tu_ok(dsv4_rows_nn(Y, N, X, K, W, N, T, N, K, glob, P, 1, DSV4_IMPL_FAST), "rows_nn whole stream");
  static const struct { const char *what; int64_t seg[3][2]; int rev; } cases[] = {
    {"zigzag rank 0 of 2 (half panels at complementary positions)", {{0, 256}, {768, 1024}}, 0},
    {"zigzag rank 1 of 2", {{256, 512}, {512, 768}}, 0},
    {"three segments, one across a panel boundary", {{5, 90}, {400, 700}, {1000, 1024}}, 0},
    {"zigzag rank 0 of 2, rows read in reverse order", {{0, 256}, {768, 1024}}, 1},
    {"a full panel read from two segments, then a full panel", {{0, 300}, {300, 1024}}, 0},
    {"a full panel read in reverse order", {{0, 512}}, 1},
  };
  int same = 1, close = 1;
  for (int threads = 1; threads <= 2; threads++)
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      int64_t n = 0;
      for (int s = 0; s < 3; s++)
        for (int64_t g = cases[c].seg[s][0]; g < cases[c].seg[s][1]; g++, n++) gs[n] = g, xrow[n] = n + GAP * (s + 1);
      for (int64_t i = 0; cases[c].rev && i < n; i++) xrow[i] = n + 4 * GAP - 1 - i;
      for (int64_t i = 0; i < n; i++) memcpy(Xm + xrow[i] * K, X + gs[i] * K, sizeof(float) * K);
      for (int64_t i = 0; i < n; i++) memcpy(Ym + i * N, Y0 + gs[i] * N, sizeof(float) * N);
      memcpy(R, Ym, sizeof(float) * (size_t)n * N);
      const int old = dsv4_threads_enter(threads);
      tu_ok(dsv4_rows_nn_map(Ym, N, Xm, K, xrow, W, N, n, N, K, gs, P, 1, DSV4_IMPL_FAST), "rows_nn_map");
      tu_ok(dsv4_rows_nn_map(R, N, Xm, K, xrow, W, N, n, N, K, gs, P, 1, DSV4_IMPL_NAIVE), "rows_nn_map naive");
      dsv4_threads_leave(old);
      for (int64_t i = 0; i < n; i++) same &= !memcmp(Ym + i * N, Y + gs[i] * N, sizeof(float) * N);
      for (int64_t i = 0; i < n * N; i++) close &= fabsf(R[i] - Ym[i]) <= 1e-4f * (1.0f + fabsf(R[i]));
    }
  tu_check(same, "rows_nn_map: zigzag halves, three segments, split and reversed full panels, 1 and 2 threads: the "
                 "whole stream's bits");
  tu_check(close, "rows_nn_map: the naive path reads the same mapped rows (within 1e-4)");
  free(X), free(W), free(Y0), free(Y), free(Xm), free(Ym), free(R);
  dsv4_panel_scratch_release();
}

/* Weight gradients over global panels (model/wgrad.h), one rank: the rows given whole, or in
 * pieces that cut panels (assembled again), or chunk by chunk into a sink, on 1 or 2 threads, give
 * the same bits; and they are the product (reference loops, tolerance). Shapes of 1 and several
 * C blocks; T = 1300 with P = 512 leaves a last panel of 276 rows. */
static void wgrad_panels(void) {
  static const int64_t shape[][2] = {{40, 30}, {700, 900}, {24, 2100}};
  const int64_t T = 1300, P = 512;
  int64_t *glob = malloc(sizeof(int64_t) * T);
  for (int64_t i = 0; i < T; i++) glob[i] = i;
  for (size_t c = 0; c < sizeof shape / sizeof shape[0]; c++) {
    const int64_t M = shape[c][0], N = shape[c][1];
    float *A = malloc(sizeof(float) * T * M), *B = malloc(sizeof(float) * T * N), *R = calloc(M * N, 4);
    float *C[4];
    for (int k = 0; k < 4; k++) C[k] = calloc(M * N, 4);
    tu_fill(A, T * M, 5 + c, 1.0f);
    tu_fill(B, T * N, 6 + c, 1.0f);
    const dsv4_wshape sh = {M, N, P, T};
    int old = dsv4_threads_enter(1);
    const dsv4_wpiece whole = {.n = T, .A = A, .B = B, .lda = M, .ldb = N, .glob = glob};
    tu_ok(dsv4_wgrad_exact(NULL, &sh, &whole, 1, C[0], DSV4_IMPL_FAST, "test"), "wgrad whole");
    dsv4_threads_leave(old);
    old = dsv4_threads_enter(2);
    static const int64_t cut[] = {0, 100, 700, 1030, 1300}; /* pieces inside panels 0, 1 and 2 */
    dsv4_wpiece pc[4];
    for (int k = 0; k < 4; k++)
      pc[k] = (dsv4_wpiece){.n = cut[k + 1] - cut[k], .A = A + cut[k] * M, .B = B + cut[k] * N, .lda = M, .ldb = N,
                            .glob = glob + cut[k]};
    tu_ok(dsv4_wgrad_exact(NULL, &sh, pc, 4, C[1], DSV4_IMPL_FAST, "test"), "wgrad in pieces");
    dsv4_wsinks ks;
    dsv4_wsinks_begin(&ks, DSV4_IMPL_FAST, "test");
    tu_ok(dsv4_wsinks_add_product(&ks, C[2], &sh), "sink");
    for (int k = 0; k < 4; k++) tu_ok(dsv4_wsinks_product(&ks, C[2], &pc[k]), "sink chunk");
    tu_ok(dsv4_wsinks_finish(&ks, NULL), "sink finish");
    dsv4_threads_leave(old);
    dsv4_gemm_tn_ref(M, N, T, 1.0f, A, M, B, N, 1.0f, R, N);
    tu_close("wgrad vs reference loops", C[0], R, M * N, 1e-5, 1.0);
    const size_t bytes = sizeof(float) * (size_t)(M * N);
    tu_check(!memcmp(C[0], C[1], bytes) && !memcmp(C[0], C[2], bytes),
             "wgrad %lld x %lld: whole (1 thread), pieces and chunked sinks (2 threads): the same bits", (long long)M,
             (long long)N);
    /* a padding row's A counts as zero whatever it holds */
    uint8_t *keep = malloc((size_t)T);
    for (int64_t i = 0; i < T; i++) keep[i] = i % 97 != 5;
    for (int64_t i = 0; i < T; i++)
      if (!keep[i]) A[i * M] = NAN;
    const dsv4_wpiece masked = {.n = T, .A = A, .B = B, .lda = M, .ldb = N, .glob = glob, .keep = keep};
    tu_ok(dsv4_wgrad_exact(NULL, &sh, &masked, 1, C[3], DSV4_IMPL_FAST, "test"), "wgrad masked");
    int finite = 1;
    for (int64_t e = 0; e < M * N; e++) finite &= isfinite(C[3][e]);
    tu_check(finite, "wgrad: padding rows (NaN in their A) contribute nothing");
    A[0] = INFINITY;
    memset(C[3], 0, bytes);
    tu_check(dsv4_wgrad_exact(NULL, &sh, &whole, 1, C[3], DSV4_IMPL_FAST, "wq_b") == DSV4_ERR_ARG &&
                 strstr(dsv4_last_error(), "wq_b"),
             "wgrad: a non-finite term is an error naming the product (%s)", dsv4_last_error());
    free(keep);
    for (int k = 0; k < 4; k++) free(C[k]);
    free(A), free(B), free(R);
  }
  free(glob);
}

/* A thread sums a strip of a superblock's blocks at once when the panels fit one group
 * (model/wgrad.c strip_cap): one BLAS call per panel for the strip where dsv4_blocks_merge allows,
 * else one per block. Against one block at a time (DSV4_WGRAD_STRIP=1, the old way) on one and two
 * threads (strips of 4 and 2 blocks), with and without merged calls (DSV4_PANEL_MERGE=0), masked
 * rows included, and with the sums in memory (DSV4_WGRAD_GROUP=1: a group of one panel, whose
 * strip's blocks each keep their own sums): the same bits. M 600 x N 1700 has edge blocks both ways (88 rows, 164 columns);
 * T = 1324 gives three panels (the last 300 rows: strips of 2), T = 900 two (strips of 4); the
 * 88-row strip's narrow block is under 2^23 multiply-adds, so its strip is never merged. */
static void wgrad_strips(void) {
  const int64_t M = 600, N = 1700, P = 512, Ts[] = {1324, 900};
  printf("note: weight-gradient blocks share a call here: %s\n",
         dsv4_blocks_merge(512, 512, 512) ? "yes" : "no (one call per block)");
  tu_check(!dsv4_blocks_merge(88, 164, 300), "blocks_merge: a block under 2^23 multiply-adds never merges");
  for (int c = 0; c < 2; c++) {
    const int64_t T = Ts[c];
    float *A = malloc(sizeof(float) * T * M), *B = malloc(sizeof(float) * T * N), *C[5];
    int64_t *glob = malloc(sizeof(int64_t) * T);
    uint8_t *keep = malloc((size_t)T);
    for (int64_t i = 0; i < T; i++) glob[i] = i, keep[i] = i % 61 != 7;
    for (int k = 0; k < 5; k++) C[k] = calloc(M * N, 4);
    tu_fill(A, T * M, 31 + c, 1.0f);
    tu_fill(B, T * N, 32 + c, 1.0f);
    const dsv4_wshape sh = {M, N, P, T};
    const dsv4_wpiece pc = {.n = T, .A = A, .B = B, .lda = M, .ldb = N, .glob = glob, .keep = keep};
    setenv("DSV4_WGRAD_STRIP", "1", 1);
    int old = dsv4_threads_enter(1);
    tu_ok(dsv4_wgrad_exact(NULL, &sh, &pc, 1, C[0], DSV4_IMPL_FAST, "test"), "wgrad one block at a time");
    unsetenv("DSV4_WGRAD_STRIP");
    tu_ok(dsv4_wgrad_exact(NULL, &sh, &pc, 1, C[1], DSV4_IMPL_FAST, "test"), "wgrad strips, one thread");
    dsv4_threads_leave(old);
    old = dsv4_threads_enter(2);
    tu_ok(dsv4_wgrad_exact(NULL, &sh, &pc, 1, C[2], DSV4_IMPL_FAST, "test"), "wgrad strips, two threads");
    setenv("DSV4_PANEL_MERGE", "0", 1);
    tu_check(!dsv4_blocks_merge(512, 512, 512), "blocks_merge: DSV4_PANEL_MERGE=0 turns it off");
    tu_ok(dsv4_wgrad_exact(NULL, &sh, &pc, 1, C[3], DSV4_IMPL_FAST, "test"), "wgrad strips, a call per block");
    unsetenv("DSV4_PANEL_MERGE");
    setenv("DSV4_WGRAD_GROUP", "1", 1);
    tu_ok(dsv4_wgrad_exact(NULL, &sh, &pc, 1, C[4], DSV4_IMPL_FAST, "test"), "wgrad strips, sums in memory");
    unsetenv("DSV4_WGRAD_GROUP");
    dsv4_threads_leave(old);
    static const char *what[] = {"", "strips on one thread", "strips on two threads", "strips without merged calls",
                                 "strips with their sums in memory"};
    const size_t bytes = sizeof(float) * (size_t)(M * N);
    for (int k = 1; k < 5; k++)
      tu_check(!memcmp(C[0], C[k], bytes), "wgrad T = %lld: %s: the bits of one block at a time", (long long)T,
               what[k]);
    for (int k = 0; k < 5; k++) free(C[k]);
    free(A), free(B), free(glob), free(keep);
  }
}

/* A strip down a column of blocks (what the CP rows path's lines take: model/wgrad_rows.c): rows
 * of 1100 (blocks of 512, 512 and 76) by one 512-column block, over two panels (512 + 388 rows, some
 * rows masked as padding), in one call per panel where this BLAS merges row blocks
 * (dsv4_rowblocks_merge; the suite runs this test under a kernel family where it does too), else
 * one call per block: each block the bits of its own dsv4_wg_block_sum. Also with the sums in
 * memory (groups of one panel). */
static void wgrad_row_strips(void) {
  const int64_t M = 1100, N = 512, P = 512, T = 900, mb = 512;
  printf("note: weight-gradient row blocks share a call here: %s\n",
         dsv4_rowblocks_merge(512, 512, 512) ? "yes" : "no (one call per block)");
  tu_check(!dsv4_rowblocks_merge(64, 256, 500), "rowblocks_merge: a block under 2^23 multiply-adds never merges");
  float *A = malloc(sizeof(float) * T * M), *B = malloc(sizeof(float) * T * N);
  float *C0 = malloc(sizeof(float) * M * N), *C1 = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
  const int64_t tf = 8 * M * N + P * M; /* the widest group's products and masked A */
  float *t = malloc(sizeof(float) * tf);
  int64_t *acc = malloc(sizeof(int64_t) * 2 * M * N);
  uint8_t *keep = malloc((size_t)T);
  for (int64_t i = 0; i < T; i++) keep[i] = i % 53 != 11;
  tu_fill(A, T * M, 41, 1.0f);
  tu_fill(B, T * N, 42, 1.0f);
  const wview v[2] = {{A, B, M, N, 0, 0, 512, keep}, {A + 512 * M, B + 512 * N, M, N, 0, 0, T - 512, keep + 512}};
  int bad = 0;
  for (int64_t m0 = 0; m0 < M; m0 += mb) {
    const int64_t h = M - m0 < mb ? M - m0 : mb;
    bad |= dsv4_wg_block_sum(v, 2, m0, h, 0, N, t, acc, N, 1, C0 + m0 * N, N, 0, DSV4_IMPL_FAST);
  }
  bad |= dsv4_wg_strip_sum(v, 2, 0, M, mb, 0, N, N, 2, t, acc, N, 0, 1, C1, N, 0, DSV4_IMPL_FAST);
  bad |= dsv4_wg_strip_sum(v, 2, 0, M, mb, 0, N, N, 1, t, acc, N, 0, 1, C2, N, 0, DSV4_IMPL_FAST);
  tu_check(!bad, "row strips: no bad term");
  const size_t bytes = sizeof(float) * (size_t)(M * N);
  tu_check(!memcmp(C0, C1, bytes), "row strips: three row blocks, one group: the bits of a block at a time");
  tu_check(!memcmp(C0, C2, bytes), "row strips: three row blocks, sums in memory: the bits of a block at a time");
  /* not a tautology: the masked rows count as zero, so unmasking one row must change the sums */
  keep[11] = 1;
  dsv4_wg_strip_sum(v, 2, 0, M, mb, 0, N, N, 2, t, acc, N, 0, 1, C2, N, 0, DSV4_IMPL_FAST);
  tu_check(memcmp(C0, C2, bytes) != 0, "row strips: a masked row counts as zero (unmasked, the sums change)");
  free(A), free(B), free(C0), free(C1), free(C2), free(t), free(acc), free(keep);
}

/* A recomputed backward's product sinks hold doubles while they are exact and move a block to xacc
 * sums once an add is not (model/wgrad.c "double sums"). Against the whole product (xacc sums all
 * the way), chunk by chunk on 2 threads: a panel scaled by 2^-40 against the others in the first
 * block column (a double cannot hold the sum: that block moves), by 2^-10 in the second (exact in
 * a double: it stays), every term near 2^-57 (below xacc's grid's 24 bits: rounded to it as xacc
 * does), and chunks that cut panels; the tensor zero or not, the low halves in a lent zero tensor
 * or not (dsv4_wsinks_lend: zero again after), the last chunk rounded into the tensor at once or at
 * finish (dsv4_wsinks_last_rows). Every case: the same bits. Random terms rarely tell an
 * inexact double from an exact sum once rounded to a float, so one element is built where they
 * differ (a double without the exactness test fails it). */
static void wgrad_double_sums(void) {
  const int64_t T = 1300, P = 512, M = 40, N = 900;
  static const struct {
    float every;      /* of every row of B */
    float cols, rest; /* then of panel 1's rows of B: columns below 512 (the first block column), the rest */
    const char *what;
  } cases[] = {{1.0f, 0x1p-40f, 0x1p-10f, "2^-40 in the first block column (moves to xacc), 2^-10 in the second"},
               {0x1p-60f, 1.0f, 1.0f, "every panel at 2^-60: terms below the 2^-66 grid's 24 bits"},
               {1.0f, 1.0f, 1.0f, "one scale"}};
  int64_t *glob = malloc(sizeof(int64_t) * T);
  for (int64_t i = 0; i < T; i++) glob[i] = i;
  float *A = malloc(sizeof(float) * T * M), *B = malloc(sizeof(float) * T * N);
  float *C0 = malloc(sizeof(float) * M * N), *C1 = malloc(sizeof(float) * M * N);
  float *spare = malloc(sizeof(float) * (M * N + 1));
  /* lent ranges of spare: one tensor for every row; or two that hold 13 rows (and 5 floats more:
   * not a row) and 11, with floats between and after that are not lent; the other 16 rows allocated */
  static const int64_t lent_ranges[3][2][2] = {{{0, 0}, {0, 0}}, {{0, 40 * 900}, {0, 0}},
                                               {{0, 13 * 900 + 5}, {14 * 900, 25 * 900}}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    tu_fill(A, T * M, 11 + c, 1.0f);
    tu_fill(B, T * N, 12 + c, 1.0f);
    for (int64_t i = 0; i < T; i++)
      for (int64_t e = 0; e < N; e++)
        B[i * N + e] *= cases[c].every * (i / P != 1 ? 1.0f : e < 512 ? cases[c].cols : cases[c].rest);
    for (int v = 0; v < 18; v++) {
      /* the tensor's value before: finish adds the sum to it; zeros lend their floats to the sums'
       * high halves; lend: another zero tensor holds the low halves; last: a one-rank backward's
       * count of rows (dsv4_wsinks_last_rows), whole-panel chunks, the last rounded at once (the
       * scaled panel 1 in a middle chunk, or in the last with panel 2) */
      const int zero = v % 2, lend = v / 2 % 3, last = v / 6;
      if (zero) memset(C0, 0, sizeof(float) * M * N);
      else tu_fill(C0, M * N, 13, 1.0f);
      memcpy(C1, C0, sizeof(float) * M * N);
      const dsv4_wshape sh = {M, N, P, T};
      int old = dsv4_threads_enter(1);
      const dsv4_wpiece whole = {.n = T, .A = A, .B = B, .lda = M, .ldb = N, .glob = glob};
      tu_ok(dsv4_wgrad_exact(NULL, &sh, &whole, 1, C0, DSV4_IMPL_FAST, "test"), "wgrad whole");
      dsv4_threads_leave(old);
      old = dsv4_threads_enter(2);
      static const int64_t cuts[3][5] = {{0, 512, 700, 1024, 1300}, /* a whole panel, then pieces of panel 1 */
                                         {0, 512, 1024, 1300, 1300},
                                         {0, 512, 1300, 1300, 1300}};
      const int64_t *cut = cuts[last];
      dsv4_wsinks ks;
      dsv4_wsinks_begin(&ks, DSV4_IMPL_FAST, "test");
      if (last) dsv4_wsinks_last_rows(&ks, T);
      for (int64_t e = 0; e <= M * N; e++) spare[e] = 1.0f; /* not lent: must stay */
      for (int j = 0; j < 2; j++) {
        const int64_t *r = lent_ranges[lend][j];
        if (r[1] <= r[0]) continue;
        memset(spare + r[0], 0, sizeof(float) * (size_t)(r[1] - r[0]));
        tu_check(dsv4_wsinks_lend(&ks, spare + r[0], r[1] - r[0]), "double sums: a zero spare tensor is lent");
      }
      tu_ok(dsv4_wsinks_add_product(&ks, C1, &sh), "sink");
      const dsv4_wsink *k1 = dsv4_wsinks_of(&ks, C1);
      tu_check(((void *)k1->dhi == (void *)C1) == zero, "double sums: the high halves in the tensor iff it is zero");
      if (lend == 0)
        tu_check(k1->n_lo == 1 && k1->lo[0].pool < 0, "double sums: the low halves allocated when nothing is lent");
      if (lend == 1)
        tu_check(k1->n_lo == 1 && k1->lo[0].pool == 0 && (void *)k1->lo[0].p == spare,
                 "double sums: the low halves in the lent tensor that holds them all");
      if (lend == 2)
        tu_check(k1->n_lo == 3 && k1->lo[0].pool == 0 && (void *)k1->lo[0].p == spare && k1->lo[1].row == 13 &&
                     k1->lo[1].pool == 1 && (void *)k1->lo[1].p == spare + 14 * N && k1->lo[2].row == 24 && k1->lo[2].pool < 0,
                 "double sums: rows 0 - 12 in the first lent tensor, 13 - 23 in the second, the rest allocated");
      for (int k = 0; k < 4 && cut[k + 1] > cut[k]; k++) {
        const dsv4_wpiece pc = {.n = cut[k + 1] - cut[k], .A = A + cut[k] * M, .B = B + cut[k] * N, .lda = M,
                                .ldb = N, .glob = glob + cut[k]};
        tu_ok(dsv4_wsinks_product(&ks, C1, &pc), "sink chunk");
        const dsv4_wsink *kk = dsv4_wsinks_of(&ks, C1);
        if (k == 0 && c > 0) { /* one product's floats so far (no block moved): every rest word 0 */
          int rests = 0;
          for (int j = 0; j < kk->n_lo; j++)
            for (int64_t e = 0; e < ((j + 1 < kk->n_lo ? kk->lo[j + 1].row : M) - kk->lo[j].row) * N; e++)
              rests |= kk->lo[j].p[e] != 0;
          tu_check(!rests, "double sums, %s: after one panel every low word is zero (a float's sum needs none)",
                   cases[c].what);
        }
        if (cut[k + 1] == T)
          tu_check(kk->done == (last && zero), "double sums: the last rows %s at once",
                   last && zero ? "rounded into the zero tensor" : "left for finish");
      }
      tu_ok(dsv4_wsinks_finish(&ks, NULL), "sink finish");
      dsv4_threads_leave(old);
      tu_check(!memcmp(C0, C1, sizeof(float) * (size_t)(M * N)), "double sums, %s, %s tensor%s%s: the bits of the xacc sums",
               cases[c].what, zero ? "a zero" : "an accumulating",
               lend == 1 ? ", low halves lent" : lend == 2 ? ", low halves in two lent tensors and allocated" : "",
               last == 1 ? ", the last of 3 chunks rounded at once" : last == 2 ? ", the last of 2 chunks rounded at once" : "");
      int clear = 1;
      for (int64_t e = 0; e <= M * N; e++) {
        int in = 0;
        for (int j = 0; j < 2; j++) in |= e >= lent_ranges[lend][j][0] && e < lent_ranges[lend][j][1];
        clear &= in ? spare[e] == 0.0f && !signbit(spare[e]) : spare[e] == 1.0f;
      }
      tu_check(clear, "double sums: the lent tensors are zero again after finish (and nothing beside them written)");
    }
  }
  { /* what is not lent: a spare that is not zero, one too small for the sink */
    dsv4_wsinks ks;
    const dsv4_wshape sh = {M, N, P, T};
    dsv4_wsinks_begin(&ks, DSV4_IMPL_FAST, "test");
    memset(spare, 0, sizeof(float) * M * N);
    spare[7] = -0.0f;
    tu_check(!dsv4_wsinks_lend(&ks, spare, M * N) && !ks.n_pool, "double sums: a spare with a bit set is not lent");
    spare[7] = 0.0f;
    tu_check(dsv4_wsinks_lend(&ks, spare, N - 1), "lend");
    tu_ok(dsv4_wsinks_add_product(&ks, C1, &sh), "sink");
    tu_check(dsv4_wsinks_of(&ks, C1)->n_lo == 1 && dsv4_wsinks_of(&ks, C1)->lo[0].pool < 0,
             "double sums: a lent tensor smaller than one row is not used");
    dsv4_wsinks_drop(&ks);
  }
  /* a sum whose order a double would change decides the rounding: 1, 2^-53, 2^-53, 2^-24, one
   * term per panel in element (0, 0) (4 panels of 512). Exactly 1 + 2^-24 + 2^-52: 1 + 2^-23 as a
   * float (above the tie); a double summed in panel order without the exactness test loses both
   * 2^-53 (ties to even) and gives 1 + 2^-24, a tie: 1 */
  {
    enum { T4 = 2048, M4 = 8, N4 = 8 };
    float *A4 = calloc(T4 * M4, sizeof(float)), *B4 = calloc(T4 * N4, sizeof(float));
    float c4[2][M4 * N4] = {{0}};
    int64_t g4[T4];
    for (int64_t i = 0; i < T4; i++) g4[i] = i;
    static const int64_t row[4] = {0, 600, 1100, 1600};
    static const float term[4] = {1.0f, 0x1p-53f, 0x1p-53f, 0x1p-24f};
    for (int j = 0; j < 4; j++) A4[row[j] * M4] = 1.0f, B4[row[j] * N4] = term[j];
    const dsv4_wshape sh = {M4, N4, P, T4};
    const dsv4_wpiece whole = {.n = T4, .A = A4, .B = B4, .lda = M4, .ldb = N4, .glob = g4};
    tu_ok(dsv4_wgrad_exact(NULL, &sh, &whole, 1, c4[0], DSV4_IMPL_FAST, "test"), "wgrad whole");
    for (int last = 0; last < 2; last++) { /* rounded at finish, or with the last chunk */
      dsv4_wsinks ks;
      memset(c4[1], 0, sizeof c4[1]);
      dsv4_wsinks_begin(&ks, DSV4_IMPL_FAST, "test");
      if (last) dsv4_wsinks_last_rows(&ks, T4);
      tu_ok(dsv4_wsinks_add_product(&ks, c4[1], &sh), "sink");
      for (int k = 0; k < 4; k++) { /* chunk by chunk, one panel each, as a recomputed backward */
        const dsv4_wpiece pc = {.n = P, .A = A4 + k * P * M4, .B = B4 + k * P * N4, .lda = M4, .ldb = N4,
                                .glob = g4 + k * P};
        tu_ok(dsv4_wsinks_product(&ks, c4[1], &pc), "sink chunk");
      }
      tu_ok(dsv4_wsinks_finish(&ks, NULL), "sink finish");
      tu_check(c4[0][0] == 1.0f + 0x1p-23f && c4[1][0] == c4[0][0],
               "double sums: 1 + 2^-53 + 2^-53 + 2^-24 over 4 chunks is the exact sums' 1 + 2^-23 (got 1 + %g, 1 + %g "
               "ulp)%s",
               (double)((c4[0][0] - 1.0f) / 0x1p-23f), (double)((c4[1][0] - 1.0f) / 0x1p-23f),
               last ? ", the last chunk rounded at once" : "");
    }
    free(A4), free(B4);
  }
  /* a bad term leaves the tensor as it was (an accumulating one, and a zero one whose floats held
   * the high halves) and names the set */
  A[3 * M] = INFINITY;
  for (int v = 0; v < 12; v++) {
    const int zero = v % 2, lend = v / 2 % 3, last = v / 6;
    if (zero) memset(C0, 0, sizeof(float) * M * N);
    else tu_fill(C0, M * N, 13, 1.0f);
    memcpy(C1, C0, sizeof(float) * M * N);
    const dsv4_wshape sh = {M, N, P, T};
    const dsv4_wpiece whole = {.n = T, .A = A, .B = B, .lda = M, .ldb = N, .glob = glob};
    dsv4_wsinks ks;
    dsv4_wsinks_begin(&ks, DSV4_IMPL_FAST, "wq_b sinks");
    if (last) dsv4_wsinks_last_rows(&ks, T); /* one call, the last: a zero tensor is written, then restored */
    memset(spare, 0, sizeof(float) * M * N);
    for (int j = 0; j < 2; j++) /* (the floats between two lent ranges stay zero too) */
      if (lent_ranges[lend][j][1] > lent_ranges[lend][j][0])
        dsv4_wsinks_lend(&ks, spare + lent_ranges[lend][j][0], lent_ranges[lend][j][1] - lent_ranges[lend][j][0]);
    tu_ok(dsv4_wsinks_add_product(&ks, C1, &sh), "sink");
    tu_ok(dsv4_wsinks_product(&ks, C1, &whole), "sink rows");
    tu_check(dsv4_wsinks_finish(&ks, NULL) == DSV4_ERR_ARG && strstr(dsv4_last_error(), "wq_b sinks") &&
                 !memcmp(C0, C1, sizeof(float) * (size_t)(M * N)),
             "double sums: a non-finite term is an error naming the set, the %s tensor untouched%s (%s)",
             zero ? "zero" : "accumulating", last ? " (last rows rounded at once)" : "", dsv4_last_error());
    int clear = 1;
    for (int64_t e = 0; e < M * N; e++) clear &= spare[e] == 0.0f && !signbit(spare[e]);
    tu_check(clear, "double sums: an error leaves the lent tensor%s zero", lend == 2 ? "s" : "");
  }
  free(A), free(B), free(C0), free(C1), free(spare), free(glob);
}

static const tu_test TESTS[] = {
  {"xacc", "order-independent", order_independent},
  {"xacc", "vector-is-scalar", vector_is_scalar},
  {"xacc", "grouped-is-serial", grouped_is_serial},
  {"xacc", "refuses-bad-terms", refuses_bad_terms},
  {"xacc", "rows-any-threads", rows_any_threads},
  {"xacc", "rows-group", rows_group},
  {"xacc", "rows-locked", rows_locked},
  {"backward", "rows-nn-panels", rows_nn_panels},
  {"backward", "rows-nn-mapped", rows_nn_mapped},
  {"backward", "wgrad-panels", wgrad_panels},
  {"backward", "wgrad-strips", wgrad_strips},
  {"backward", "wgrad-row-strips", wgrad_row_strips},
  {"backward", "wgrad-double-sums", wgrad_double_sums},
};

int main(int argc, char **argv) { return tu_run(argc, argv, TESTS, (int)(sizeof TESTS / sizeof TESTS[0])); }
