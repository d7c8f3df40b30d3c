/* ops_fixtures.h: seeded random problems for the operator tests (test_ops_fwd.c, test_ops_grad.c):
 * sparse attention, lightning indexer, indexer KL loss and compressor, each with its edge cases
 * built in by flags (padding queries, -1 holes anywhere in id lists, repeated ids, empty visible
 * sets, out_row mappings, halo rows), the shared case tables (hand-picked edge cases, then a sweep
 * of seeded random shapes), subsets with shifted row indices for the position invariance checks,
 * comparison helpers and central finite differences.
 * Header-only (static inline) because the Makefile links each test with testutil.o alone. */
#ifndef DSV4_OPS_FIXTURES_H
#define DSV4_OPS_FIXTURES_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4cp_ops.h"
#include "ops/compressor.h"
#include "ops/rope.h"
#include "testutil.h"
#include "util/rng.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* Unit roundoff of fp32 (2^-24): the relative error of one rounded operation. */
#define U32 (1.0 / 16777216.0)

/* ---------------------------------------------------------------------------------------------
 * Small utilities
 * ------------------------------------------------------------------------------------------- */
static inline void *xalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) { fprintf(stderr, "test: out of memory\n"); exit(2); }
  return p;
}
#define FALLOC(n) ((float *)xalloc((size_t)(n), sizeof(float)))
#define IALLOC(n) ((int32_t *)xalloc((size_t)(n), sizeof(int32_t)))
#define DUP(p, n) memcpy(xalloc((size_t)(n), sizeof *(p)), (p), sizeof *(p) * (size_t)(n))

/* Counter-based integers: draw i of stream seed, uniform in [0, n) (0 when n <= 0). */
typedef struct { uint64_t seed, i; } tu_rng;
static inline int64_t rng_below(tu_rng *g, int64_t n) {
  uint64_t h = dsv4_mix64(dsv4_mix64(g->seed) + g->i++);
  return n > 0 ? (int64_t)(h % (uint64_t)n) : 0;
}
static inline int64_t imax64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Bitwise equality of two buffers (the position invariance contract). */
static inline int check_bits(const void *a, const void *b, size_t bytes, const char *name) {
  return tu_check(memcmp(a, b, bytes) == 0, "%s", name);
}

/* Set by each test's main from dsv4_blas_probe_invariance(): this BLAS gives a row the same bits
 * at any position of a fixed-shape call, so position invariance can be demanded bitwise. */
static int g_bitwise;

/* Position invariance: bitwise where the BLAS allows it. Otherwise only the BLAS blocking differs
 * (sums of up to a few hundred terms reordered: ~1e-5 relative); equal values, such as the
 * -INFINITY padding of top-k scores, count as no difference. */
static inline void check_invariant(const char *name, const float *a, const float *b, int64_t n) {
  if (g_bitwise || n == 0) {
    check_bits(a, b, sizeof(float) * (size_t)n, name);
    return;
  }
  double err = 0, ref = 1;
  for (int64_t i = 0; i < n; i++) {
    if (a[i] == b[i]) continue;
    const double d = fabs((double)a[i] - b[i]);
    if (d > err || isnan(d)) err = d; /* a NaN sticks */
    if (isfinite(b[i])) ref = fmax(ref, fabs(b[i]));
  }
  tu_check(err <= 1e-5 * ref, "%s (BLAS not position invariant: max_err %.3g, limit %.3g)", name, err,
           1e-5 * ref);
}

/* tu_close for doubles: max|a - b| <= tol * max(max|b|, floor). */
static inline int close_d(const char *name, const double *a, const double *b, int64_t n, double tol,
                          double floor) {
  double err = 0, ref = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs(a[i] - b[i]);
    if (d > err || isnan(d)) err = d; /* a NaN sticks */
    ref = fabs(b[i]) > ref ? fabs(b[i]) : ref;
  }
  double lim = tol * (ref > floor ? ref : floor);
  return tu_check(err <= lim, "%s: max_err %.3g (limit %.3g, max|ref| %.3g)", name, err, lim, ref);
}

/* A failing call must return DSV4_ERR_ARG and name the argument in dsv4_last_error(). */
static inline int expect_arg_error(dsv4_status st, const char *needle, const char *what) {
  const char *msg = dsv4_last_error();
  int ok = st == DSV4_ERR_ARG && msg && strstr(msg, needle);
  return tu_check(ok, "%s -> DSV4_ERR_ARG naming \"%s\" (got %s: %s)", what, needle,
                  dsv4_status_string(st), msg ? msg : "");
}

/* ---------------------------------------------------------------------------------------------
 * Central finite differences
 * ------------------------------------------------------------------------------------------- */
/* Scalar objective evaluated in double; returns NAN when the point must not be used (kink). */
typedef double (*fd_objective)(void *ctx);

/* g[i] = (f(x + h e_i) - f(x - h e_i)) / (x+ - x-), dividing by the step fp32 actually applied.
 * NAN where f is NAN on either side. x is restored bit for bit. */
static inline void fd_grad(fd_objective f, void *ctx, float *x, int64_t n, float h, double *g) {
  for (int64_t i = 0; i < n; i++) {
    const float x0 = x[i];
    x[i] = x0 + h;
    const double xp = x[i], fp = f(ctx);
    x[i] = x0 - h;
    const double xm = x[i], fm = f(ctx);
    x[i] = x0;
    g[i] = (fp - fm) / (xp - xm);
  }
}

/* Analytic gradient a against finite differences g: max|a - g| <= tol * max(max|g|, floor) over the
 * elements with a usable difference; at least half of the elements must be usable. */
static inline int fd_check(const char *name, const float *a, const double *g, int64_t n, double tol,
                           double floor) {
  double err = 0, ref = 0;
  int64_t used = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(g[i])) continue;
    used++;
    double d = fabs((double)a[i] - g[i]);
    if (d > err || isnan(d)) err = d; /* a NaN sticks */
    ref = fabs(g[i]) > ref ? fabs(g[i]) : ref;
  }
  double lim = tol * (ref > floor ? ref : floor);
  return tu_check(err <= lim && 2 * used >= n,
                  "%s: max_err %.3g (limit %.3g, max|fd| %.3g, %lld of %lld elements)", name, err, lim,
                  ref, (long long)used, (long long)n);
}

/* ---------------------------------------------------------------------------------------------
 * Sparse attention problems
 * Query p sits at ori_kv row halo + p and sees the window [max(0, row - W + 1), row]. Padding
 * queries (win_len 0) keep their compressed keys, which must then be ignored.
 * ------------------------------------------------------------------------------------------- */
typedef enum { CMP_NONE, CMP_IDS, CMP_RANGE } cmp_mode;

typedef struct {
  int64_t S1, C;     /* queries, compressed rows */
  int H, D, W, halo; /* heads, head dim, window, ori_kv rows before the first query's row */
  cmp_mode mode;
  int n_ids;         /* CMP_IDS: ids per query */
  int pad_every;     /* queries p % pad_every == pad_every - 1 are padding (0: none) */
  int empty_every;   /* queries p % empty_every == 0 see no compressed keys (0: none) */
  int hole_every;    /* CMP_IDS: about one id in hole_every is -1, anywhere in the row (0: none) */
  int repeat;        /* CMP_IDS: the last id of each row repeats its first (gradients add up) */
  uint64_t seed;
} attn_spec;

typedef struct {
  attn_spec sp;
  int64_t R;
  float *q, *ori_kv, *cmp_kv, *sink, *out, *lse;
  int32_t *win_start, *win_len, *cmp_ids, *cmp_begin, *cmp_count;
  dsv4_attn_args a;
} attn_prob;

static inline int attn_is_pad(const attn_spec *sp, int64_t p) {
  return sp->pad_every && p % sp->pad_every == sp->pad_every - 1;
}

/* Points the argument struct at the problem's buffers. */
static inline void attn_bind(attn_prob *P) {
  const attn_spec *sp = &P->sp;
  P->a = (dsv4_attn_args){P->out, P->lse, P->q, P->ori_kv, P->win_start, P->win_len, P->cmp_kv,
                          P->cmp_ids, P->cmp_begin, P->cmp_count, P->sink, sp->S1, P->R, sp->C,
                          sp->H, sp->D, sp->mode == CMP_IDS ? sp->n_ids : 0,
                          (float)(1.0 / sqrt(sp->D)), NULL, NULL, 0, 0};
}

static inline void attn_make(attn_prob *P, const attn_spec *sp) {
  memset(P, 0, sizeof *P);
  P->sp = *sp;
  const int64_t S1 = sp->S1, C = sp->C, HD = (int64_t)sp->H * sp->D;
  P->R = sp->halo + S1;
  P->q = FALLOC(S1 * HD);
  P->ori_kv = FALLOC(P->R * sp->D);
  P->sink = FALLOC(sp->H);
  P->out = FALLOC(S1 * HD);
  P->lse = FALLOC(S1 * sp->H);
  P->win_start = IALLOC(S1);
  P->win_len = IALLOC(S1);
  tu_fill(P->q, S1 * HD, sp->seed * 16 + 1, 2.0f);
  tu_fill(P->ori_kv, P->R * sp->D, sp->seed * 16 + 2, 1.0f);
  tu_fill(P->sink, sp->H, sp->seed * 16 + 3, 1.0f);
  tu_rng g = {sp->seed * 16 + 4, 0};
  for (int64_t p = 0; p < S1; p++) {
    const int64_t row = sp->halo + p;
    P->win_start[p] = (int32_t)imax64(0, row - sp->W + 1);
    P->win_len[p] = attn_is_pad(sp, p) ? 0 : (int32_t)(row - P->win_start[p] + 1);
  }
  if (sp->mode != CMP_NONE) {
    P->cmp_kv = FALLOC(C * sp->D);
    tu_fill(P->cmp_kv, C * sp->D, sp->seed * 16 + 5, 1.0f);
  }
  if (sp->mode == CMP_IDS) {
    P->cmp_ids = IALLOC(S1 * sp->n_ids);
    for (int64_t p = 0; p < S1; p++) {
      int32_t *ids = P->cmp_ids + p * sp->n_ids;
      const int empty = C == 0 || (sp->empty_every && p % sp->empty_every == 0);
      for (int j = 0; j < sp->n_ids; j++) {
        const int hole = sp->hole_every && rng_below(&g, sp->hole_every) == 0;
        ids[j] = empty || hole ? -1 : (int32_t)rng_below(&g, C);
      }
      if (sp->repeat && !empty && sp->n_ids >= 2) {
        ids[0] = (int32_t)rng_below(&g, C);
        ids[sp->n_ids - 1] = ids[0];
      }
    }
  } else if (sp->mode == CMP_RANGE) {
    P->cmp_begin = IALLOC(S1);
    P->cmp_count = IALLOC(S1);
    for (int64_t p = 0; p < S1; p++) {
      if (C == 0 || (sp->empty_every && p % sp->empty_every == 0)) continue;
      P->cmp_begin[p] = (int32_t)rng_below(&g, C);
      P->cmp_count[p] = (int32_t)rng_below(&g, C - P->cmp_begin[p] + 1);
    }
  }
  attn_bind(P);
}

static inline void attn_free(attn_prob *P) {
  free(P->q); free(P->ori_kv); free(P->cmp_kv); free(P->sink); free(P->out); free(P->lse);
  free(P->win_start); free(P->win_len); free(P->cmp_ids); free(P->cmp_begin); free(P->cmp_count);
  memset(P, 0, sizeof *P);
}

/* The same problem with the compressed ranges given as explicit id lists (-1 padded). */
static inline void attn_ranges_as_ids(const attn_prob *P, attn_prob *Q) {
  attn_spec sp = P->sp;
  int n = 1;
  for (int64_t p = 0; p < sp.S1; p++) n = P->cmp_count[p] > n ? P->cmp_count[p] : n;
  sp.mode = CMP_IDS;
  sp.n_ids = n;
  *Q = *P;
  Q->sp = sp;
  Q->q = DUP(P->q, sp.S1 * sp.H * sp.D); Q->ori_kv = DUP(P->ori_kv, P->R * sp.D);
  Q->cmp_kv = DUP(P->cmp_kv, sp.C * sp.D); Q->sink = DUP(P->sink, sp.H);
  Q->out = FALLOC(sp.S1 * sp.H * sp.D); Q->lse = FALLOC(sp.S1 * sp.H);
  Q->win_start = DUP(P->win_start, sp.S1); Q->win_len = DUP(P->win_len, sp.S1);
  Q->cmp_begin = Q->cmp_count = NULL;
  Q->cmp_ids = IALLOC(sp.S1 * n);
  for (int64_t p = 0; p < sp.S1; p++)
    for (int j = 0; j < n; j++) Q->cmp_ids[p * n + j] = j < P->cmp_count[p] ? P->cmp_begin[p] + j : -1;
  attn_bind(Q);
}

/* Queries [k, S1) of P as a problem of their own, in fresh buffers, with ori_kv starting at the
 * first window row they need and cmp_kv at the first compressed row they use (row indices shifted
 * to match): what another rank would hold. Query p of Q is query p + k of P. */
static inline void attn_subset(const attn_prob *P, int64_t k, attn_prob *Q) {
  attn_spec sp = P->sp;
  const int64_t S1 = sp.S1 - k, HD = (int64_t)sp.H * sp.D;
  int64_t r0 = P->R, c0 = sp.C;
  for (int64_t p = k; p < sp.S1; p++) {
    r0 = imin64(r0, P->win_start[p]);
    if (P->cmp_ids)
      for (int j = 0; j < sp.n_ids; j++)
        if (P->cmp_ids[p * sp.n_ids + j] >= 0) c0 = imin64(c0, P->cmp_ids[p * sp.n_ids + j]);
    if (P->cmp_count && P->cmp_count[p] > 0) c0 = imin64(c0, P->cmp_begin[p]);
  }
  if (!P->cmp_kv) c0 = 0;
  memset(Q, 0, sizeof *Q);
  sp.S1 = S1;
  sp.C -= c0;
  Q->sp = sp;
  Q->R = P->R - r0;
  Q->q = DUP(P->q + k * HD, S1 * HD);
  Q->ori_kv = DUP(P->ori_kv + r0 * sp.D, Q->R * sp.D);
  Q->sink = DUP(P->sink, sp.H);
  Q->out = FALLOC(S1 * HD);
  Q->lse = FALLOC(S1 * sp.H);
  Q->win_start = IALLOC(S1);
  Q->win_len = DUP(P->win_len + k, S1);
  for (int64_t p = 0; p < S1; p++) Q->win_start[p] = (int32_t)(P->win_start[p + k] - r0);
  if (P->cmp_kv) Q->cmp_kv = DUP(P->cmp_kv + c0 * sp.D, sp.C * sp.D);
  if (P->cmp_ids) {
    Q->cmp_ids = DUP(P->cmp_ids + k * sp.n_ids, S1 * sp.n_ids);
    for (int64_t i = 0; i < S1 * sp.n_ids; i++) Q->cmp_ids[i] -= Q->cmp_ids[i] >= 0 ? (int32_t)c0 : 0;
  }
  if (P->cmp_count) {
    Q->cmp_begin = DUP(P->cmp_begin + k, S1);
    Q->cmp_count = DUP(P->cmp_count + k, S1);
    for (int64_t p = 0; p < S1; p++) Q->cmp_begin[p] -= Q->cmp_count[p] > 0 ? (int32_t)c0 : 0;
  }
  attn_bind(Q);
}

/* Short description for check names. */
static inline const char *attn_desc(const attn_prob *P, char *buf, size_t n) {
  const attn_spec *s = &P->sp;
  const char *m = s->mode == CMP_IDS ? "ids" : s->mode == CMP_RANGE ? "ranges" : "window-only";
  snprintf(buf, n, "S1=%lld H=%d D=%d W=%d C=%lld %s%s%s%s", (long long)s->S1, s->H, s->D, s->W,
           (long long)s->C, m, s->pad_every ? " +padding" : "", s->hole_every ? " +holes" : "",
           s->repeat ? " +repeats" : "");
  return buf;
}

/* ---------------------------------------------------------------------------------------------
 * Lightning indexer problems. Visible range of query p: a random [begin, begin + count) of k_idx
 * (empty for p % empty_every == 0). exact: small integers for q_idx and k_idx and weights in
 * {0, +-1/2, +-1}, so every score is exact in fp32 and in double, and ties are common.
 * ------------------------------------------------------------------------------------------- */
typedef struct {
  int64_t S1, C;
  int Hi, Di, topk, empty_every, exact;
  uint64_t seed;
} idx_spec;

typedef struct {
  idx_spec sp;
  float *q_idx, *k_idx, *weights, *scores;
  int32_t *vis_begin, *vis_count, *ids;
  dsv4_indexer_args a;
} idx_prob;

static inline void idx_bind(idx_prob *P) {
  const idx_spec *s = &P->sp;
  P->a = (dsv4_indexer_args){.topk_ids = P->ids, .topk_scores = P->scores, .q_idx = P->q_idx, .k_idx = P->k_idx,
                             .weights = P->weights, .vis_begin = P->vis_begin, .vis_count = P->vis_count,
                             .S1 = s->S1, .C = s->C, .Hi = s->Hi, .Di = s->Di, .topk = s->topk};
}

/* Values in {-2, ..., 2} (exact mode inputs). */
static inline void fill_small_ints(float *x, int64_t n, uint64_t seed) {
  tu_rng g = {seed, 0};
  for (int64_t i = 0; i < n; i++) x[i] = (float)(rng_below(&g, 5) - 2);
}

static inline void idx_make(idx_prob *P, const idx_spec *sp) {
  memset(P, 0, sizeof *P);
  P->sp = *sp;
  const int64_t S1 = sp->S1, C = sp->C, nq = S1 * sp->Hi * sp->Di;
  P->q_idx = FALLOC(nq);
  P->k_idx = C ? FALLOC(C * sp->Di) : NULL;
  P->weights = FALLOC(S1 * sp->Hi);
  P->scores = FALLOC(S1 * sp->topk);
  P->ids = IALLOC(S1 * sp->topk);
  P->vis_begin = IALLOC(S1);
  P->vis_count = IALLOC(S1);
  if (sp->exact) {
    static const float W5[5] = {0.0f, 0.5f, -0.5f, 1.0f, -1.0f};
    tu_rng g = {sp->seed * 16 + 3, 0};
    fill_small_ints(P->q_idx, nq, sp->seed * 16 + 1);
    if (C) fill_small_ints(P->k_idx, C * sp->Di, sp->seed * 16 + 2);
    for (int64_t i = 0; i < S1 * sp->Hi; i++) P->weights[i] = W5[rng_below(&g, 5)];
  } else {
    tu_fill(P->q_idx, nq, sp->seed * 16 + 1, 1.0f);
    if (C) tu_fill(P->k_idx, C * sp->Di, sp->seed * 16 + 2, 1.0f);
    tu_fill(P->weights, S1 * sp->Hi, sp->seed * 16 + 3, 1.0f);
  }
  tu_rng g = {sp->seed * 16 + 4, 0};
  for (int64_t p = 0; p < S1; p++) {
    if (C == 0 || (sp->empty_every && p % sp->empty_every == 0)) continue;
    P->vis_begin[p] = (int32_t)rng_below(&g, C / 4 + 1);
    P->vis_count[p] = (int32_t)(1 + rng_below(&g, C - P->vis_begin[p]));
  }
  idx_bind(P);
}

static inline void idx_free(idx_prob *P) {
  free(P->q_idx); free(P->k_idx); free(P->weights); free(P->scores); free(P->ids);
  free(P->vis_begin); free(P->vis_count);
  memset(P, 0, sizeof *P);
}

/* Queries [k, S1) in fresh buffers, k_idx starting at their first visible row (ranges shifted). */
static inline void idx_subset(const idx_prob *P, int64_t k, idx_prob *Q, int64_t *c0_out) {
  idx_spec sp = P->sp;
  int64_t c0 = sp.C;
  for (int64_t p = k; p < sp.S1; p++)
    if (P->vis_count[p] > 0) c0 = imin64(c0, P->vis_begin[p]);
  memset(Q, 0, sizeof *Q);
  sp.S1 -= k;
  sp.C -= c0;
  Q->sp = sp;
  Q->q_idx = DUP(P->q_idx + k * sp.Hi * sp.Di, sp.S1 * sp.Hi * sp.Di);
  Q->k_idx = sp.C ? DUP(P->k_idx + c0 * sp.Di, sp.C * sp.Di) : NULL;
  Q->weights = DUP(P->weights + k * sp.Hi, sp.S1 * sp.Hi);
  Q->scores = FALLOC(sp.S1 * sp.topk);
  Q->ids = IALLOC(sp.S1 * sp.topk);
  Q->vis_begin = DUP(P->vis_begin + k, sp.S1);
  Q->vis_count = DUP(P->vis_count + k, sp.S1);
  for (int64_t p = 0; p < sp.S1; p++) Q->vis_begin[p] -= Q->vis_count[p] > 0 ? (int32_t)c0 : 0;
  idx_bind(Q);
  *c0_out = c0;
}

/* ---------------------------------------------------------------------------------------------
 * Indexer KL loss problems: an indexer problem plus main queries / compressed kv (the teacher) and
 * selected ids: distinct visible rows (up to topk) scattered among -1 holes anywhere in the row.
 * ------------------------------------------------------------------------------------------- */
typedef struct {
  idx_prob ix;
  int H, D, dense;
  float *q, *cmp_kv, *d_q_idx, *d_weights, *d_k_idx;
  int32_t *sel;
  double loss, *loss_rows;
  int64_t n_valid;
  dsv4_kl_args a;
} kl_prob;

static inline void kl_bind(kl_prob *K, float grad_scale) {
  const idx_spec *s = &K->ix.sp;
  K->a = (dsv4_kl_args){&K->loss, &K->n_valid, K->loss_rows, K->d_q_idx, K->d_weights, K->d_k_idx,
                        K->q, K->cmp_kv, K->sel, K->ix.q_idx, K->ix.k_idx, K->ix.weights,
                        K->ix.vis_begin, K->ix.vis_count, s->S1, s->C, K->H, K->D, s->Hi, s->Di,
                        s->topk, K->dense, (float)(1.0 / sqrt(K->D)), grad_scale, NULL, NULL, 0};
}

static inline void kl_make(kl_prob *K, const idx_spec *sp, int H, int D, int dense, float grad_scale) {
  memset(K, 0, sizeof *K);
  idx_make(&K->ix, sp);
  K->H = H; K->D = D; K->dense = dense;
  const int64_t S1 = sp->S1, C = sp->C;
  K->q = FALLOC(S1 * H * D);
  K->cmp_kv = C ? FALLOC(C * D) : NULL;
  tu_fill(K->q, S1 * H * D, sp->seed * 16 + 5, 2.0f);
  if (C) tu_fill(K->cmp_kv, C * D, sp->seed * 16 + 6, 1.0f);
  K->d_q_idx = FALLOC(S1 * sp->Hi * sp->Di);
  K->d_weights = FALLOC(S1 * sp->Hi);
  K->d_k_idx = FALLOC(C * sp->Di);
  K->loss_rows = (double *)xalloc((size_t)S1, sizeof(double));
  K->sel = IALLOC(S1 * sp->topk);
  int32_t *perm = IALLOC(C);
  tu_rng g = {sp->seed * 16 + 7, 0};
  for (int64_t p = 0; p < S1; p++) {
    int32_t *ids = K->sel + p * sp->topk;
    const int n = K->ix.vis_count[p], b = K->ix.vis_begin[p];
    for (int j = 0; j < n; j++) perm[j] = b + j;
    for (int j = 0; j < sp->topk; j++) ids[j] = -1;
    /* up to topk distinct visible rows, then shuffle the row so that -1 holes land anywhere */
    for (int j = 0; j < sp->topk && j < n; j++) {
      int64_t r = j + rng_below(&g, n - j);
      int32_t t = perm[j]; perm[j] = perm[r]; perm[r] = t;
      if (j < sp->topk - 1 || rng_below(&g, 2)) ids[j] = perm[j];
    }
    for (int j = sp->topk - 1; j > 0; j--) {
      int64_t r = rng_below(&g, j + 1);
      int32_t t = ids[j]; ids[j] = ids[r]; ids[r] = t;
    }
  }
  free(perm);
  kl_bind(K, grad_scale);
}

static inline void kl_free(kl_prob *K) {
  idx_free(&K->ix);
  free(K->q); free(K->cmp_kv); free(K->d_q_idx); free(K->d_weights); free(K->d_k_idx);
  free(K->loss_rows); free(K->sel);
  memset(K, 0, sizeof *K);
}

/* Queries [k, S1) of K with shifted rows, as idx_subset (selected ids lie in the visible ranges,
 * so the same first row serves both modes); the teacher's cmp_kv is shifted alike. */
static inline void kl_subset(const kl_prob *K, int64_t k, kl_prob *Q) {
  const int64_t S1 = K->ix.sp.S1 - k, topk = K->ix.sp.topk;
  int64_t c0;
  memset(Q, 0, sizeof *Q);
  idx_subset(&K->ix, k, &Q->ix, &c0);
  const idx_spec *s = &Q->ix.sp;
  Q->H = K->H; Q->D = K->D; Q->dense = K->dense;
  Q->q = DUP(K->q + k * K->H * K->D, S1 * K->H * K->D);
  Q->cmp_kv = s->C ? DUP(K->cmp_kv + c0 * K->D, s->C * K->D) : NULL;
  Q->d_q_idx = FALLOC(S1 * s->Hi * s->Di);
  Q->d_weights = FALLOC(S1 * s->Hi);
  Q->d_k_idx = FALLOC(s->C * s->Di);
  Q->loss_rows = (double *)xalloc((size_t)S1, sizeof(double));
  Q->sel = DUP(K->sel + k * topk, S1 * topk);
  for (int64_t i = 0; i < S1 * topk; i++) Q->sel[i] -= Q->sel[i] >= 0 ? (int32_t)c0 : 0;
  kl_bind(Q, K->a.grad_scale);
}

/* ---------------------------------------------------------------------------------------------
 * Compressor problems. Slot s pools rows halo + s r .. + r - 1 (its own window) and, for r == 4,
 * the previous window (slot 0 too when the halo holds one). RoPE position s r. Ratios 1 and 2 are
 * V4.1's compressors: no APE (ape NULL), and r = 1 no gate (Z NULL).
 * ------------------------------------------------------------------------------------------- */
typedef enum { PREV_NULL, PREV_ROWS, PREV_ALL_NONE } prev_mode;

typedef struct {
  int ratio, D, rope_dim;
  int64_t n_slots;
  int halo;          /* rows in front of slot 0's window (a CP halo); r == 4: slot 0 uses them if >= 4 */
  prev_mode prev;    /* r == 4: prev_row NULL, real previous windows, or all -1 */
  int out_map;       /* 1: slot s goes to row 2 (n_slots - 1 - s) + 1 of a 2 n_slots + 1 row output */
  uint64_t seed;
} cmp_spec;

typedef struct {
  cmp_spec sp;
  int64_t rows, rows_out;
  int cD;
  float *C, *Z, *ape, *norm_w, *out;
  int32_t *out_row, *cur_row, *prev_row, *pos;
  dsv4_rope rope;
  dsv4_compress_args a;
} cmp_prob;

static inline void cmp_bind(cmp_prob *P) {
  dsv4_config cfg = DSV4_CONFIG_INIT;
  dsv4_config_preset(&cfg, "tiny");
  P->a = (dsv4_compress_args){.out = P->out, .out_row = P->out_row, .C = P->C, .Z = P->Z, .ape = P->ape,
                              .norm_w = P->norm_w, .cur_row = P->cur_row, .prev_row = P->prev_row, .pos = P->pos,
                              .rope = &P->rope, .n_slots = P->sp.n_slots, .ratio = P->sp.ratio, .D = P->sp.D,
                              .eps = cfg.eps, .rows = P->rows, .rows_out = P->rows_out};
}

/* RoPE tables of the tiny preset with rope_dim R for a layer of this ratio (YaRN for r > 0). */
static inline void rope_make(dsv4_rope *r, int R, int ratio, int64_t n_pos) {
  dsv4_config cfg = DSV4_CONFIG_INIT;
  dsv4_config_preset(&cfg, "tiny");
  cfg.rope_dim = R;
  if (dsv4_rope_init(r, &cfg, ratio) != DSV4_OK || dsv4_rope_reserve(r, 0, n_pos) != DSV4_OK) {
    fprintf(stderr, "test: rope setup failed: %s\n", dsv4_last_error());
    exit(2);
  }
}

static inline void cmp_make(cmp_prob *P, const cmp_spec *sp) {
  memset(P, 0, sizeof *P);
  P->sp = *sp;
  const int r = sp->ratio, D = sp->D;
  const int64_t n = sp->n_slots;
  P->cD = (r == 4 ? 2 : 1) * D;
  P->rows = sp->halo + n * r;
  P->rows_out = sp->out_map ? 2 * n + 1 : n;
  P->C = FALLOC(P->rows * P->cD);
  if (r > 1) P->Z = FALLOC(P->rows * P->cD);
  if (r > 2) P->ape = FALLOC((int64_t)r * P->cD);
  P->norm_w = FALLOC(D);
  P->out = FALLOC(P->rows_out * D);
  P->cur_row = IALLOC(n);
  P->pos = IALLOC(n);
  tu_fill(P->C, P->rows * P->cD, sp->seed * 16 + 1, 1.0f);
  if (P->Z) tu_fill(P->Z, P->rows * P->cD, sp->seed * 16 + 2, 1.0f);
  if (P->ape) tu_fill(P->ape, (int64_t)r * P->cD, sp->seed * 16 + 3, 1.0f);
  tu_fill(P->norm_w, D, sp->seed * 16 + 4, 0.5f);
  for (int e = 0; e < D; e++) P->norm_w[e] += 1.0f;
  if (r == 4 && sp->prev != PREV_NULL) P->prev_row = IALLOC(n);
  if (sp->out_map) P->out_row = IALLOC(n);
  for (int64_t s = 0; s < n; s++) {
    P->cur_row[s] = (int32_t)(sp->halo + s * r);
    P->pos[s] = (int32_t)(s * r);
    if (P->prev_row)
      P->prev_row[s] = sp->prev == PREV_ROWS && P->cur_row[s] >= r ? P->cur_row[s] - r : -1;
    if (P->out_row) P->out_row[s] = (int32_t)(2 * (n - 1 - s) + 1);
  }
  rope_make(&P->rope, sp->rope_dim, r, n * r + 1);
  cmp_bind(P);
}

static inline void cmp_free(cmp_prob *P) {
  free(P->C); free(P->Z); free(P->ape); free(P->norm_w); free(P->out);
  free(P->out_row); free(P->cur_row); free(P->prev_row); free(P->pos);
  dsv4_rope_free(&P->rope);
  memset(P, 0, sizeof *P);
}

static inline const char *cmp_desc(const cmp_prob *P, char *buf, size_t n) {
  const cmp_spec *s = &P->sp;
  static const char *PREV[] = {"prev_row NULL", "prev rows", "prev all -1"};
  snprintf(buf, n, "r=%d D=%d slots=%lld halo=%d %s%s", s->ratio, s->D, (long long)s->n_slots,
           s->halo, s->ratio == 4 ? PREV[s->prev] : "", s->out_map ? " out_row map" : "");
  return buf;
}

/* ---------------------------------------------------------------------------------------------
 * Shared case tables (fast vs naive, forward and backward)
 * ------------------------------------------------------------------------------------------- */
static const attn_spec ATTN_CASES[] = {
    /* S1 C H D W halo mode n_ids pad empty hole repeat seed */
    {1, 0, 1, 8, 4, 0, CMP_NONE, 0, 0, 0, 0, 0, 1},     /* one token, window only */
    {1, 1, 1, 8, 4, 0, CMP_IDS, 1, 0, 0, 0, 0, 2},      /* one token, one compressed key */
    {7, 9, 3, 16, 4, 0, CMP_IDS, 5, 3, 4, 3, 1, 3},
    {7, 9, 3, 16, 4, 2, CMP_RANGE, 0, 3, 4, 0, 0, 4},
    {16, 0, 4, 32, 8, 0, CMP_NONE, 0, 5, 0, 0, 0, 5},
    {33, 20, 1, 64, 16, 7, CMP_IDS, 12, 0, 5, 4, 1, 6},
    {24, 17, 2, 24, 6, 3, CMP_RANGE, 0, 7, 3, 0, 0, 7},
    {50, 64, 4, 64, 32, 16, CMP_IDS, 24, 9, 6, 5, 1, 8},
    {5, 3, 2, 8, 2, 0, CMP_IDS, 6, 0, 0, 2, 1, 9},      /* more ids than rows: repeats, holes */
    {9, 4, 2, 8, 3, 0, CMP_IDS, 3, 1, 0, 0, 0, 10},     /* every query is padding */
    {12, 0, 2, 8, 4, 0, CMP_IDS, 4, 0, 0, 0, 0, 11},    /* C = 0: every id is -1 */
    {20, 40, 16, 16, 5, 0, CMP_RANGE, 0, 0, 0, 0, 0, 12},
    {6, 3, 2, 8, 3, 0, CMP_IDS, 0, 0, 0, 0, 0, 13},     /* id lists of width 0 */
};
#define N_ATTN_CASES (int)(sizeof ATTN_CASES / sizeof ATTN_CASES[0])

static const idx_spec IDX_CASES[] = {
    /* S1 C Hi Di topk empty_every exact seed */
    {1, 1, 1, 8, 1, 0, 0, 1},       /* one token, one key */
    {9, 13, 4, 16, 5, 3, 0, 2},     /* some empty visible sets */
    {6, 5, 2, 8, 12, 0, 0, 3},      /* topk larger than every visible set */
    {20, 64, 1, 32, 8, 4, 0, 4},    /* one head */
    {7, 0, 2, 8, 4, 0, 0, 5},       /* C = 0: nothing visible anywhere */
    {3, 1500, 4, 16, 40, 0, 0, 6},  /* more keys than one KEY_CHUNK (1024) */
    {30, 200, 8, 32, 16, 5, 0, 7},
    {25, 300, 2, 4, 17, 0, 1, 8},   /* exact scores, few distinct values: many ties */
    {12, 40, 1, 2, 9, 0, 1, 9},     /* exact, one head: about half the scores are ReLU zeros */
};
#define N_IDX_CASES (int)(sizeof IDX_CASES / sizeof IDX_CASES[0])

static const cmp_spec CMP_CASES[] = {
    /* ratio D rope slots halo prev out_map seed */
    {4, 8, 4, 1, 0, PREV_ROWS, 0, 1},      /* one slot: no previous window */
    {4, 8, 4, 5, 0, PREV_ROWS, 0, 2},
    {4, 32, 16, 33, 0, PREV_ROWS, 1, 3},
    {4, 16, 8, 6, 4, PREV_ROWS, 0, 4},     /* halo: slot 0 pools a previous window too */
    {4, 16, 8, 6, 0, PREV_NULL, 1, 5},
    {4, 16, 8, 6, 2, PREV_ALL_NONE, 0, 6},
    {4, 8, 4, 0, 0, PREV_ROWS, 0, 7},      /* no slots */
    {128, 4, 2, 1, 0, PREV_NULL, 0, 8},
    {128, 16, 8, 3, 0, PREV_NULL, 1, 9},
    {128, 32, 16, 2, 5, PREV_NULL, 0, 10},
    {2, 8, 4, 1, 0, PREV_NULL, 0, 11},     /* V4.1: r = 2 (no APE), one slot */
    {2, 16, 8, 9, 1, PREV_NULL, 1, 12},    /* r = 2 after a one-row halo, out_row map */
    {1, 8, 4, 1, 0, PREV_NULL, 0, 13},     /* V4.1: r = 1 (no gate: the slot is its row) */
    {1, 32, 16, 17, 3, PREV_NULL, 1, 14},
    {2, 8, 4, 0, 0, PREV_NULL, 0, 15},     /* no slots */
};
#define N_CMP_CASES (int)(sizeof CMP_CASES / sizeof CMP_CASES[0])

typedef struct { idx_spec ix; int H, D; } kl_case;
static const kl_case KL_CASES[] = {
    {{1, 1, 1, 8, 1, 0, 0, 1}, 1, 8},      /* one token, one key */
    {{9, 13, 4, 16, 5, 3, 0, 2}, 2, 16},   /* empty sets, -1 holes */
    {{6, 5, 2, 8, 12, 0, 0, 3}, 3, 8},     /* topk larger than the visible sets */
    {{20, 64, 1, 32, 8, 4, 0, 4}, 4, 32},  /* one indexer head */
    {{7, 0, 2, 8, 4, 0, 0, 5}, 2, 8},      /* C = 0: no valid query */
    {{16, 100, 8, 16, 24, 5, 0, 6}, 1, 64},/* one main head */
    {{10, 60, 37, 8, 20, 4, 0, 7}, 2, 16}, /* indexer heads in groups of 16 and a last one of 5 (kl_loss.c) */
};
#define N_KL_CASES (int)(sizeof KL_CASES / sizeof KL_CASES[0])

/* Sweeps: case c is the table's hand-picked case c, then N_RANDOM_CASES cases with sizes and
 * edge-case flags drawn from c (fixed seeds: every run checks the same shapes). */
#define N_RANDOM_CASES 24
#define N_ATTN_ALL (N_ATTN_CASES + N_RANDOM_CASES)
#define N_IDX_ALL (N_IDX_CASES + N_RANDOM_CASES)
#define N_CMP_ALL (N_CMP_CASES + N_RANDOM_CASES)
#define N_KL_ALL (N_KL_CASES + N_RANDOM_CASES)

static inline int pick(tu_rng *g, const int *v, int n) { return v[rng_below(g, n)]; }
/* 0 (flag off) or a period in [lo, lo + span). */
static inline int maybe_every(tu_rng *g, int lo, int span) { return rng_below(g, 2) ? lo + (int)rng_below(g, span) : 0; }

static inline attn_spec attn_case(int c) {
  if (c < N_ATTN_CASES) return ATTN_CASES[c];
  static const int DS[] = {4, 8, 16, 24, 40, 64};
  tu_rng g = {1000 + (uint64_t)c, 0};
  attn_spec s = {0};
  s.S1 = 1 + rng_below(&g, 40); s.C = rng_below(&g, 48); s.H = 1 + (int)rng_below(&g, 8);
  s.D = pick(&g, DS, 6); s.W = 1 + (int)rng_below(&g, 24); s.halo = (int)rng_below(&g, 2 * s.W);
  s.mode = (cmp_mode)rng_below(&g, 3); s.n_ids = (int)rng_below(&g, 20);
  s.pad_every = maybe_every(&g, 2, 6); s.empty_every = maybe_every(&g, 2, 5);
  s.hole_every = maybe_every(&g, 2, 4); s.repeat = (int)rng_below(&g, 2); s.seed = 1000 + c;
  return s;
}

static inline idx_spec idx_case(int c) {
  if (c < N_IDX_CASES) return IDX_CASES[c];
  static const int DIS[] = {2, 4, 8, 16, 32};
  tu_rng g = {2000 + (uint64_t)c, 0};
  idx_spec s = {0};
  s.S1 = 1 + rng_below(&g, 30); s.C = rng_below(&g, 300); s.Hi = 1 + (int)rng_below(&g, 8);
  s.Di = pick(&g, DIS, 5); s.topk = 1 + (int)rng_below(&g, 40); s.empty_every = maybe_every(&g, 2, 5);
  s.exact = rng_below(&g, 4) == 0; s.seed = 2000 + c;
  return s;
}

static inline cmp_spec cmp_case(int c) {
  if (c < N_CMP_CASES) return CMP_CASES[c];
  static const int D4[] = {4, 8, 16, 32}, D128[] = {4, 8};
  tu_rng g = {3000 + (uint64_t)c, 0};
  cmp_spec s = {0};
  static const int RATIOS[] = {4, 4, 4, 128, 2, 1};
  s.ratio = pick(&g, RATIOS, 6);
  s.D = s.ratio != 128 ? pick(&g, D4, 4) : pick(&g, D128, 2);
  s.rope_dim = 2 * (1 + (int)rng_below(&g, s.D / 2));
  s.n_slots = s.ratio != 128 ? rng_below(&g, 20) : rng_below(&g, 4);
  s.halo = (int)rng_below(&g, 9); s.prev = (prev_mode)rng_below(&g, 3); s.out_map = (int)rng_below(&g, 2);
  s.seed = 3000 + c;
  return s;
}

static inline kl_case kl_case_at(int c) {
  if (c < N_KL_CASES) return KL_CASES[c];
  static const int DS[] = {8, 16, 32};
  tu_rng g = {4000 + (uint64_t)c, 0};
  kl_case k = {idx_case(N_IDX_CASES + c), 1 + (int)rng_below(&g, 4), pick(&g, DS, 3)};
  k.ix.exact = 0; /* integer inputs put ReLU arguments exactly on the kink (see test_kl_grad) */
  k.ix.C = imin64(k.ix.C, 120);
  return k;
}

/* max|C| / rms(pooled) over slots, in double: how much the RMSNorm amplifies pooling error. */
static inline double cmp_amplification(const cmp_prob *P) {
  const int r = P->sp.ratio, D = P->sp.D;
  double amp = 1, cmax = tu_max_abs(P->C, P->rows * P->cD);
  for (int64_t s = 0; s < P->sp.n_slots; s++) {
    double ss = 0;
    for (int e = 0; e < D; e++) {
      double num = 0, den = 0;
      for (int half = 0; half < 2; half++) {
        const int64_t r0 = half == 0 ? (P->prev_row ? P->prev_row[s] : -1) : P->cur_row[s];
        const int off = (r == 4 && half == 1) ? D : 0;
        if (r0 < 0) continue;
        for (int t = 0; t < r; t++) {
          const int64_t o = (r0 + t) * P->cD + off + e;
          const double w = exp((P->Z ? (double)P->Z[o] : 0.0) + (P->ape ? P->ape[(int64_t)t * P->cD + off + e] : 0.0));
          num += w * P->C[o];
          den += w;
        }
      }
      ss += (num / den) * (num / den);
    }
    amp = fmax(amp, cmax / sqrt(ss / D));
  }
  return amp;
}

#endif
