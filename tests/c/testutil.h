/* testutil.h: the small test harness shared by the C tests: named checks that count passes and
 * failures, and the final "N passed, M failed" line (non-zero exit on any failure). */
#ifndef DSV4_TESTUTIL_H
#define DSV4_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>

#include "dsv4cp.h"

/* Records one check: prints "PASS name" or "FAIL name: why". Returns ok. */
int tu_check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records a failure with a message (for checks that compute their own verdict). */
void tu_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "N passed, M failed"; returns the process exit code. */
int tu_finish(void);

/* Deterministic uniform values in [-scale, scale). */
void tu_fill(float *x, int64_t n, uint64_t seed, float scale);
/* max |a - b| and max |b| over n values. */
double tu_max_abs_diff(const float *a, const float *b, int64_t n);
double tu_max_abs(const float *a, int64_t n);
/* max|a - b| <= tol * max(max|b|, floor): the relative check used throughout (floor avoids
 * demanding exactness of tensors that are legitimately ~0). */
int tu_close(const char *name, const float *a, const float *b, int64_t n, double tol, double floor);
/* Checks a library status: "PASS what", or "FAIL what: status (the library's last error)". */
int tu_ok(dsv4_status st, const char *what);

/* The tests of a binary, declared once as a table: each entry names the operator (or unit) it
 * checks and which property (ggml's test-backend-ops model):
 *   fast-vs-naive        the fast kernel against the naive reference on the case sweep
 *   backward             the fast backward against the naive one, overwrite / accumulate contracts
 *   finite-differences   both backwards against central differences of the naive forward
 *   position-invariance  a row's bits do not depend on the other rows of the call
 *   thread-invariance    nor on the thread count
 *   contract             edge cases, validation, documented semantics
 * tu_run runs the entries whose "op/property" contains the filter (argv[1]; all without one), or
 * lists them (--list), then prints the summary line. */
typedef struct {
  const char *op, *property;
  void (*run)(void);
} tu_test;
int tu_run(int argc, char **argv, const tu_test *tests, int n);

/* A packing (the versioned struct, dsv4cp.h) from its five values. */
#define TU_PACKING(cu, real, n, T_, b) \
  ((dsv4_packing){DSV4_HEAD(dsv4_packing), .cu_seqlens = (cu), .seqlens_real = (real), .n_docs = (n), .T = (T_), .batched = (b)})
/* The layer calls with their arguments spelled out (what most tests want). */
dsv4_status tu_forward(dsv4_layer *l, float *out, int32_t *topk, float *loss, const float *x, int64_t n,
                       const dsv4_packing *pk, int train);
dsv4_status tu_backward(dsv4_layer *l, float *dx, dsv4_weights *g, const float *dout, float d_loss);
/* The i-th tensor of a weight set (a failure is a FAIL line and a zeroed tensor). */
dsv4_tensor tu_tensor(const dsv4_weights *w, int i);

#endif
