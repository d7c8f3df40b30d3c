/* gemm.h: the matrix products of the library, on CBLAS, plus naive loops for the reference path.
 *
 * Bitwise reproducibility across shardings: a BLAS call's result for one row depends on the
 * call's shape (M, N, K pick different kernels) but, with the shape fixed, not on which row of
 * the call it is, and not on the other rows (checked at run time by dsv4_blas_probe_invariance).
 * dsv4_proj_rows therefore computes token rows in panels of P rows aligned to GLOBAL multiples of
 * P, padding partial panels with zero rows: a token gets the same bits whether one rank or N
 * ranks compute it. Full panels next to each other in a rank's shard (a zigzag rank's two chunks
 * too) share one call of a large forward projection or of a backward row product that is not added
 * to its output (its rows get their one-panel bits: dsv4_panels_merge, dsv4_nn_panels_merge), which
 * packs the weight once instead of per panel. */
#ifndef DSV4_GEMM_H
#define DSV4_GEMM_H

#include <stdint.h>
#include "dsv4cp.h"

/* C[M,N] = alpha * A[M,K] . B[N,K]^T + beta * C   ("NT": B is a PyTorch Linear weight [out, in]) */
void dsv4_gemm_nt(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* C[M,N] = alpha * A[M,K] . B[K,N] + beta * C */
void dsv4_gemm_nn(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* C[M,N] = alpha * A[K,M]^T . B[K,N] + beta * C   (weight gradients dW = dY^T X) */
void dsv4_gemm_tn(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* Naive triple loops with double accumulation (the reference path), same contracts. */
void dsv4_gemm_nt_ref(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
void dsv4_gemm_nn_ref(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
void dsv4_gemm_tn_ref(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* Whether adjacent full panels of a P x N x K projection (X W^T) may share one BLAS call: the
 * product is large enough and this BLAS gives a row the same bits in a call of several panels as
 * in a call of one (probed once per process). DSV4_PANEL_MERGE=0 in the environment: never. */
int dsv4_panels_merge(int64_t P, int64_t N, int64_t K);
/* The same for the backward's row products that overwrite their output (dx = dY W, beta 0: NN). */
int dsv4_nn_panels_merge(int64_t P, int64_t N, int64_t K);
/* The same along N for weight-gradient products (A^T B, K rows): whether blocks of nb columns of an
 * M x nb x K product may share one call, each getting the bits of a call of its own (the same rule,
 * its own probe; DSV4_PANEL_MERGE=0: never). */
int dsv4_blocks_merge(int64_t M, int64_t nb, int64_t K);
/* The same for mb-row blocks of a TN product (rows of A^T B, N columns, K rows of A and B). */
int dsv4_rowblocks_merge(int64_t mb, int64_t N, int64_t K);

/* Rows per projection panel for a stream of T_global tokens (same on every rank). */
int64_t dsv4_panel_rows(int64_t T_global);

/* Y[i, :] = X[i, :] . W^T for the n local rows (W: [N, K]); glob[i] is row i's global token index.
 * Rows are computed in panels of P rows aligned to global multiples of P (see top of file).
 * X has leading dimension ldx, Y ldy. impl NAIVE uses the reference loops. */
dsv4_status dsv4_proj_rows(float *Y, int64_t ldy, const float *X, int64_t ldx, const float *W,
                           int64_t n, int64_t N, int64_t K, const int64_t *glob, int64_t P,
                           dsv4_impl impl);

/* The same with output row yrow[i] for local row i (NULL: i), so that rows bound for several
 * places (a layout's segments) are computed together: partial panels of different segments then
 * share calls. */
dsv4_status dsv4_proj_rows_map(float *Y, int64_t ldy, const int64_t *yrow, const float *X, int64_t ldx,
                               const float *W, int64_t n, int64_t N, int64_t K, const int64_t *glob, int64_t P,
                               dsv4_impl impl);

/* Y[i, :] (beta 0: =, 1: +=) X[i, :] . W for the n local rows (W: [K, N], leading dimension ldw):
 * the backward's row products (dx = dY W) in the same global panels, so a row's bits depend
 * neither on the shard nor on the thread count. */
dsv4_status dsv4_rows_nn(float *Y, int64_t ldy, const float *X, int64_t ldx, const float *W, int64_t ldw, int64_t n,
                         int64_t N, int64_t K, const int64_t *glob, int64_t P, int beta, dsv4_impl impl);

/* The same with local row i's input at row xrow[i] of X (NULL: i), so that rows read from several
 * places (a layout's segments, each after its halo) are computed together: partial panels of
 * different segments then share calls. */
dsv4_status dsv4_rows_nn_map(float *Y, int64_t ldy, const float *X, int64_t ldx, const int64_t *xrow, const float *W,
                             int64_t ldw, int64_t n, int64_t N, int64_t K, const int64_t *glob, int64_t P, int beta,
                             dsv4_impl impl);

/* Frees the calling thread's panel scratch, which dsv4_proj_rows / dsv4_rows_nn keep between calls
 * (the layer's public calls release it on return). */
void dsv4_panel_scratch_release(void);

/* dsv4_blas_probe_invariance and dsv4_blas_fingerprint (what the CP agreement compares) are public
 * (dsv4cp.h). */

/* The kernel family OpenBLAS runs (openblas_get_corename), for messages. */
const char *dsv4_blas_kernels(void);

#endif
