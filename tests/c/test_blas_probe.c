/* test_blas_probe.c: the BLAS this build links, checked against the reference loops, and the probe
 * that tells the other tests whether CP = N may be demanded bitwise equal to CP = 1 (a row's bits
 * must not depend on its position inside a fixed-shape call; see src/util/gemm.h). */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "util/gemm.h"

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
}

static void probe(void) {
  printf("note: BLAS rows independent at a fixed position: %s\n", dsv4_blas_probe_invariance() ? "yes" : "no");
}

static const tu_test TESTS[] = {
  {"blas", "wrappers-match-reference", wrappers_match_reference},
  {"blas", "panels", panels},
  {"blas", "probe", probe},
};

int main(int argc, char **argv) { return tu_run(argc, argv, TESTS, (int)(sizeof TESTS / sizeof TESTS[0])); }
