/* test_blas_probe.c: the BLAS this build links, checked against the reference loops, and the probe
 * that tells the other tests whether CP = N may be demanded bitwise equal to CP = 1 (a row's bits
 * must not depend on its position inside a fixed-shape call; see src/util/gemm.h). */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "util/gemm.h"
#include "util/par.h"

/* The three layouts of the wrappers against the reference loops: fp32 sums of K = 37 terms vs
 * double sums, so 1e-5 relative is a loose bound (K * 2^-24 ~ 2e-6). */
static void wrappers_match_reference(void) {
  enum { M = 13, N = 11, K = 37 };
  float A[M * K], At[K * M], B[N * K], Bn[K * N], C[M * N], R[M * N];
  tu_fill(A, M * K, 1, 1.0f);
  tu_fill(B, N * K, 2, 1.0f);
  for (int i = 0; i < M; i++)
    for (int k = 0; k < K; k++) At[k * M + i] = A[i * K + k];
  for (int j = 0; j < N; j++)
    for (int k = 0; k < K; k++) Bn[k * N + j] = B[j * K + k];
  dsv4_gemm_nt(M, N, K, 0.5f, A, K, B, K, 0.0f, C, N);
  dsv4_gemm_nt_ref(M, N, K, 0.5f, A, K, B, K, 0.0f, R, N);
  tu_close("gemm_nt vs reference loops", C, R, M * N, 1e-5, 1.0);
  dsv4_gemm_nn(M, N, K, 0.5f, A, K, Bn, N, 0.0f, C, N);
  tu_close("gemm_nn vs reference loops", C, R, M * N, 1e-5, 1.0);
  dsv4_gemm_tn(M, N, K, 0.5f, At, M, Bn, N, 0.0f, C, N);
  tu_close("gemm_tn vs reference loops", C, R, M * N, 1e-5, 1.0);
}

/* Rows computed in globally aligned panels equal one whole product to fp32 accuracy, and a row's
 * bits are the same whether its panel is full or partial (the CP guarantee). */
static void panels(void) {
  enum { N = 24, K = 40, T = 100 };
  const int64_t P = dsv4_panel_rows(T);
  float *X = malloc(sizeof(float) * T * K), *W = malloc(sizeof(float) * N * K);
  float *Y = malloc(sizeof(float) * T * N), *Y2 = malloc(sizeof(float) * T * N), *R = malloc(sizeof(float) * T * N);
  int64_t glob[T];
  tu_fill(X, T * K, 3, 1.0f);
  tu_fill(W, N * K, 4, 1.0f);
  for (int i = 0; i < T; i++) glob[i] = i;
  tu_ok(dsv4_proj_rows(Y, N, X, K, W, T, N, K, glob, P, DSV4_IMPL_FAST), "proj_rows");
  dsv4_gemm_nt_ref(T, N, K, 1.0f, X, K, W, K, 0.0f, R, N);
  tu_close("proj_rows in panels vs reference loops", Y, R, T * N, 1e-5, 1.0);
  /* the rows [37, 100) computed alone, as a rank holding them would */
  tu_ok(dsv4_proj_rows(Y2, N, X + 37 * K, K, W, T - 37, N, K, glob + 37, P, DSV4_IMPL_FAST), "proj_rows shard");
  tu_check(memcmp(Y2, Y + 37 * N, sizeof(float) * (T - 37) * N) == 0,
           "proj_rows: a shard's rows are bitwise equal to the whole stream's");
  free(X), free(W), free(Y), free(Y2), free(R);
  dsv4_panel_scratch_release();
}

/* Rows of several partial panels share one call when their positions in their panels do not overlap
 * (util/gemm.c): every shard shape below gives the whole stream's bits. */
static void panel_groups(void) {
  enum { N = 24, K = 40, T = 1024 };
  const int64_t P = dsv4_panel_rows(T);
  float *X = malloc(sizeof(float) * T * K), *W = malloc(sizeof(float) * N * K);
  float *Y = malloc(sizeof(float) * T * N), *Xs = malloc(sizeof(float) * T * K), *Ys = malloc(sizeof(float) * T * N);
  int64_t glob[T], gs[T];
  tu_fill(X, T * K, 5, 1.0f);
  tu_fill(W, N * K, 6, 1.0f);
  for (int i = 0; i < T; i++) glob[i] = i;
  tu_ok(dsv4_proj_rows(Y, N, X, K, W, T, N, K, glob, P, DSV4_IMPL_FAST), "proj_rows whole stream");
  static const struct { const char *what; int64_t seg[4][2]; } cases[] = {
    {"zigzag rank 0 of 2 (two half panels at complementary positions)", {{0, 256}, {768, 1024}}},
    {"zigzag rank 1 of 2", {{256, 512}, {512, 768}}},
    {"a contiguous shard of 3 (its two ends share a call)", {{341, 682}}},
    {"overlapping positions (two calls)", {{100, 200}, {600, 700}}},
    {"four short segments", {{3, 9}, {500, 530}, {530, 541}, {900, 1000}}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int64_t n = 0;
    for (int s = 0; s < 4; s++)
      for (int64_t g = cases[c].seg[s][0]; g < cases[c].seg[s][1]; g++) {
        gs[n] = g;
        memcpy(Xs + n++ * K, X + g * K, sizeof(float) * K);
      }
    tu_ok(dsv4_proj_rows(Ys, N, Xs, K, W, n, N, K, gs, P, DSV4_IMPL_FAST), "proj_rows shard");
    int same = 1;
    for (int64_t i = 0; i < n; i++) same &= !memcmp(Ys + i * N, Y + gs[i] * N, sizeof(float) * N);
    tu_check(same, "proj_rows: %s: %lld rows bitwise the whole stream's", cases[c].what, (long long)n);
    /* the same rows written elsewhere: each segment 7 rows further than the last (proj_rows_map), and
     * every row to its own place in reverse order (every run one row long) */
    int64_t yrow[T], m = 0, rev[T];
    for (int s = 0; s < 4; s++)
      for (int64_t g = cases[c].seg[s][0]; g < cases[c].seg[s][1]; g++) { yrow[m] = m + 7 * s; m++; }
    for (int64_t i = 0; i < n; i++) rev[i] = n - 1 - i;
    float *Ym = calloc((size_t)(n + 28) * N, sizeof(float));
    tu_ok(dsv4_proj_rows_map(Ym, N, yrow, Xs, K, W, n, N, K, gs, P, DSV4_IMPL_FAST), "proj_rows_map");
    for (int64_t i = 0; i < n; i++) same &= !memcmp(Ym + yrow[i] * N, Y + gs[i] * N, sizeof(float) * N);
    tu_ok(dsv4_proj_rows_map(Ym, N, rev, Xs, K, W, n, N, K, gs, P, DSV4_IMPL_FAST), "proj_rows_map reversed");
    for (int64_t i = 0; i < n; i++) same &= !memcmp(Ym + rev[i] * N, Y + gs[i] * N, sizeof(float) * N);
    tu_check(same, "proj_rows_map: %s: mapped and reversed output rows bitwise the whole stream's", cases[c].what);
    free(Ym);
  }
  free(X), free(W), free(Y), free(Xs), free(Ys);
  dsv4_panel_scratch_release();
}

/* Shards whose full panels merge (T = 2560, P = 512), and the check every merged product makes:
 * each shard's rows, on its thread count, bitwise Y0 (one call per panel). nn: the backward's
 * overwriting row product (dsv4_rows_nn, W [K, N]), else the forward projection (W [N, K]). */
static const struct { const char *what; int64_t lo, hi; int threads; } merge_cases[] = {
  {"the whole stream, one thread (five panels in one call)", 0, 2560, 1},
  {"the whole stream, two threads (three and two panels)", 0, 2560, 2},
  {"panels 1 - 4 of a shard", 512, 2560, 1},
  {"a shard with partial ends and three full panels between", 300, 2300, 1},
  {"a shard with partial ends, two threads", 300, 2300, 2},
};

static void merged_shards(int nn, const float *X, const float *W, float *Y, const float *Y0, const int64_t *glob,
                          int64_t P, int64_t N, int64_t K) {
  for (size_t c = 0; c < sizeof merge_cases / sizeof merge_cases[0]; c++) {
    const int64_t lo = merge_cases[c].lo, n = merge_cases[c].hi - lo;
    const int old = dsv4_threads_enter(merge_cases[c].threads);
    memset(Y, 0, sizeof(float) * (size_t)n * N);
    if (nn) tu_ok(dsv4_rows_nn(Y, N, X + lo * K, K, W, N, n, N, K, glob + lo, P, 0, DSV4_IMPL_FAST), "rows_nn");
    else tu_ok(dsv4_proj_rows(Y, N, X + lo * K, K, W, n, N, K, glob + lo, P, DSV4_IMPL_FAST), "proj_rows");
    tu_check(!memcmp(Y, Y0 + lo * N, sizeof(float) * (size_t)n * N), "%s: %s: bitwise one call per panel",
             nn ? "rows_nn (beta 0)" : "proj_rows", merge_cases[c].what);
    dsv4_threads_leave(old);
  }
}

/* Consecutive full panels of a large projection share one BLAS call (util/gemm.c: dsv4_panels_merge).
 * Every shard shape, thread count and output mapping below must give the bits of one call per panel
 * (DSV4_PANEL_MERGE=0), which is what a rank holding a single panel of the stream computes. */
static void merged_panels(void) {
  enum { N = 64, K = 256, T = 2560 }; /* P N K = 2^23: the smallest product that merges */
  const int64_t P = dsv4_panel_rows(T);
  float *X = malloc(sizeof(float) * T * K), *W = malloc(sizeof(float) * N * K);
  float *Y0 = malloc(sizeof(float) * T * N), *Y = malloc(sizeof(float) * (T + 64) * N);
  int64_t *glob = malloc(sizeof(int64_t) * T), *yrow = malloc(sizeof(int64_t) * T);
  tu_fill(X, T * K, 7, 1.0f);
  tu_fill(W, N * K, 8, 1.0f);
  for (int i = 0; i < T; i++) glob[i] = i;
  const int merges = dsv4_panels_merge(P, N, K);
  printf("note: full panels share a call here: %s\n", merges ? "yes" : "no (one call per panel)");
  tu_check(!dsv4_panels_merge(P, N / 2, K), "panels_merge: a product under 2^23 multiply-adds never merges");
  setenv("DSV4_PANEL_MERGE", "0", 1);
  tu_check(!dsv4_panels_merge(P, N, K), "panels_merge: DSV4_PANEL_MERGE=0 turns it off");
  tu_ok(dsv4_proj_rows(Y0, N, X, K, W, T, N, K, glob, P, DSV4_IMPL_FAST), "proj_rows one call per panel");
  unsetenv("DSV4_PANEL_MERGE");
  merged_shards(0, X, W, Y, Y0, glob, P, N, K);
  /* a zigzag rank's chunks (panels 0 and 4: not consecutive in the stream but next to each other in
   * the shard, so one call where panels merge) and output rows that jump by 64 after two panels (the
   * third panel must not join the second's call) */
  int64_t gz[1024];
  for (int i = 0; i < 512; i++) gz[i] = i, gz[512 + i] = 2048 + i;
  float *Xz = malloc(sizeof(float) * 1024 * K);
  for (int i = 0; i < 1024; i++) memcpy(Xz + i * K, X + gz[i] * K, sizeof(float) * K);
  tu_ok(dsv4_proj_rows(Y, N, Xz, K, W, 1024, N, K, gz, P, DSV4_IMPL_FAST), "proj_rows zigzag");
  int same = 1;
  for (int i = 0; i < 1024; i++) same &= !memcmp(Y + i * N, Y0 + gz[i] * N, sizeof(float) * N);
  tu_check(same, "proj_rows: a zigzag rank's two chunks bitwise one call per panel");
  for (int i = 0; i < T; i++) yrow[i] = i + (i >= 1024 ? 64 : 0);
  tu_ok(dsv4_proj_rows_map(Y, N, yrow, X, K, W, T, N, K, glob, P, DSV4_IMPL_FAST), "proj_rows_map");
  same = 1;
  for (int i = 0; i < T; i++) same &= !memcmp(Y + yrow[i] * N, Y0 + i * N, sizeof(float) * N);
  tu_check(same, "proj_rows_map: output rows that jump after two panels bitwise one call per panel");
  free(X), free(W), free(Y0), free(Y), free(Xz), free(glob), free(yrow);
  dsv4_panel_scratch_release();
}

/* The backward's row products that overwrite their output (dsv4_rows_nn, beta 0: dx = dY W) merge
 * full panels the same way (dsv4_nn_panels_merge): every shard and thread count below gives the bits
 * of one call per panel; products added to their output (beta 1) never merge, and give the bits of
 * the beta 0 rows added to what the rows held. */
static void merged_nn_panels(void) {
  enum { N = 64, K = 256, T = 2560 }; /* P N K = 2^23 */
  const int64_t P = dsv4_panel_rows(T);
  float *X = malloc(sizeof(float) * T * K), *W = malloc(sizeof(float) * K * N);
  float *Y0 = malloc(sizeof(float) * T * N), *Y = malloc(sizeof(float) * T * N), *Y1 = malloc(sizeof(float) * T * N);
  int64_t *glob = malloc(sizeof(int64_t) * T);
  tu_fill(X, T * K, 17, 1.0f);
  tu_fill(W, K * N, 18, 1.0f);
  for (int i = 0; i < T; i++) glob[i] = i;
  printf("note: NN row panels share a call here: %s\n",
         dsv4_nn_panels_merge(P, N, K) ? "yes" : "no (one call per panel)");
  tu_check(!dsv4_nn_panels_merge(P, N / 2, K), "nn_panels_merge: a product under 2^23 multiply-adds never merges");
  setenv("DSV4_PANEL_MERGE", "0", 1);
  tu_check(!dsv4_nn_panels_merge(P, N, K), "nn_panels_merge: DSV4_PANEL_MERGE=0 turns it off");
  tu_ok(dsv4_rows_nn(Y0, N, X, K, W, N, T, N, K, glob, P, 0, DSV4_IMPL_FAST), "rows_nn one call per panel");
  unsetenv("DSV4_PANEL_MERGE");
  merged_shards(1, X, W, Y, Y0, glob, P, N, K);
  /* beta 1 onto rows holding Y1: each row is Y1 + its beta 0 row, rounded once */
  tu_fill(Y1, T * N, 19, 1.0f);
  memcpy(Y, Y1, sizeof(float) * T * N);
  tu_ok(dsv4_rows_nn(Y, N, X, K, W, N, T, N, K, glob, P, 1, DSV4_IMPL_FAST), "rows_nn beta 1");
  int same = 1;
  for (int64_t i = 0; i < (int64_t)T * N; i++) same &= Y[i] == Y1[i] + Y0[i];
  tu_check(same, "rows_nn (beta 1): every row its one-panel product added to what it held");
  free(X), free(W), free(Y0), free(Y), free(Y1), free(glob);
  dsv4_panel_scratch_release();
}

static void probe(void) {
  printf("note: BLAS rows independent at a fixed position: %s\n", dsv4_blas_probe_invariance() ? "yes" : "no");
}

static const tu_test TESTS[] = {
  {"blas", "wrappers-match-reference", wrappers_match_reference},
  {"blas", "panels", panels},
  {"blas", "panel-groups", panel_groups},
  {"blas", "merged-panels", merged_panels},
  {"blas", "merged-nn-panels", merged_nn_panels},
  {"blas", "probe", probe},
};

int main(int argc, char **argv) { return tu_run(argc, argv, TESTS, (int)(sizeof TESTS / sizeof TESTS[0])); }
