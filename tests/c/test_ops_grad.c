/* test_ops_grad.c: backward checks of the operators in src/ops (the forward ones are in
 * test_ops_fwd.c): fast vs naive backward on many shapes and edge cases (padding queries, -1 holes,
 * repeated ids, HCA ranges vs the same keys as ids, r = 4 and 128 compressors, sparse and dense KL),
 * central finite differences on tiny shapes for every backward (each checked against the naive AND
 * the fast backward), the overwritten / accumulated contract of every gradient buffer, and position
 * invariance of the fast sparse attention's dq. Usage: test_ops_grad [FILTER | --list] (as
 * test_ops_fwd). */
#include "ops_fixtures.h"
#include "ops/rmsnorm.h"
#include "util/gemm.h"

/* Finite differences of an objective computed from fp32 outputs, with O(1) inputs and weights R:
 * step h = 1e-2 gives truncation error h^2/6 |f'''| ~ 2e-5 relative; rounding: each of the N <= ~100
 * outputs carries u/2 relative error, so the difference quotient has noise <= N u max|out R| / (2h)
 * ~ N 3e-6 <= 3e-4. A relative tolerance of 1e-2 on the gradient vector sits well above both, and far
 * below the O(1) relative error of a wrong or missing term. Floor 1e-2: below that an O(1) objective's
 * gradient is ~0 at this noise level. */
#define FD_H 1e-2f
#define FD_TOL 1e-2
#define FD_FLOOR 1e-2

/* Fills the accumulated gradient buffers with a base B, and returns B + G0 (G0: result from zeros)
 * in expect, for "accumulated" checks. */
static void add_base(float *g, float *expect, const float *g0, int64_t n, uint64_t seed) {
  tu_fill(g, n, seed, 1.0f);
  for (int64_t i = 0; i < n; i++) expect[i] = g[i] + g0[i];
}

/* ============================================================================================
 * RMSNorm backward
 * ========================================================================================== */
typedef struct { float *v, *w, *R, *y; int n; } rms_ctx;
#define RMS_EPS 1e-6

static double rms_objective(void *c) {
  rms_ctx *x = c;
  dsv4_rmsnorm_row(x->y, x->v, x->w, x->n, RMS_EPS);
  double L = 0;
  for (int i = 0; i < x->n; i++) L += (double)x->y[i] * x->R[i];
  return L;
}

/* dv and dw vs finite differences (FD_TOL, see top); dw accumulates (second call: exactly 2x, as
 * 0 + g + g is exact); dv may alias dy (same bits). No n = 1: y = v / sqrt(v^2 + eps) w is then a
 * near step function of v, and a difference quotient of it says nothing. */
static void test_rmsnorm_grad(void) {
  static const int NS[] = {2, 5, 33};
  for (int c = 0; c < 3; c++)
    for (int with_w = 0; with_w < 2; with_w++) {
      const int n = NS[c];
      float *v = FALLOC(n), *w = FALLOC(n), *R = FALLOC(n), *y = FALLOC(n), *dv = FALLOC(n);
      float *dw = FALLOC(n), *dw2 = FALLOC(n), *buf = FALLOC(n);
      double *g = (double *)xalloc((size_t)n, sizeof(double));
      tu_fill(v, n, 10 + c, 2.0f);
      tu_fill(w, n, 20 + c, 0.5f);
      for (int i = 0; i < n; i++) w[i] += 1.0f;
      tu_fill(R, n, 30 + c, 1.0f);
      float *wp = with_w ? w : NULL;
      const float s = dsv4_rms_inv(v, n, RMS_EPS);
      dsv4_rmsnorm_bwd_row(dv, wp ? dw : NULL, R, v, wp, s, n);
      rms_ctx ctx = {v, wp, R, y, n};
      char name[128];
      const char *wd = with_w ? "weight" : "no weight";
      fd_grad(rms_objective, &ctx, v, n, FD_H, g);
      snprintf(name, sizeof name, "rmsnorm backward dv vs finite differences: n=%d %s", n, wd);
      fd_check(name, dv, g, n, FD_TOL, FD_FLOOR);
      memcpy(buf, R, sizeof(float) * n);
      dsv4_rmsnorm_bwd_row(buf, NULL, buf, v, wp, s, n);
      tu_check(!memcmp(buf, dv, sizeof(float) * n), "rmsnorm backward: dv aliasing dy, same bits: n=%d %s", n, wd);
      if (with_w) {
        fd_grad(rms_objective, &ctx, w, n, FD_H, g);
        snprintf(name, sizeof name, "rmsnorm backward dw vs finite differences: n=%d", n);
        fd_check(name, dw, g, n, FD_TOL, FD_FLOOR);
        memcpy(dw2, dw, sizeof(float) * n);
        dsv4_rmsnorm_bwd_row(buf, dw2, R, v, wp, s, n);
        int ok = 1;
        for (int i = 0; i < n; i++) ok &= dw2[i] == 2 * dw[i];
        tu_check(ok, "rmsnorm backward: dw accumulated (second call doubles it exactly): n=%d", n);
      }
      free(v); free(w); free(R); free(y); free(dv); free(dw); free(dw2); free(buf); free(g);
    }
}

/* ============================================================================================
 * Sparse attention backward
 * ========================================================================================== */
typedef struct { float *dq, *d_ori, *d_cmp, *d_sink; } attn_grads;

static void attn_grads_alloc(const attn_prob *P, attn_grads *g) {
  const attn_spec *s = &P->sp;
  g->dq = FALLOC(s->S1 * s->H * s->D);
  g->d_ori = FALLOC(P->R * s->D);
  g->d_cmp = FALLOC(s->C * s->D);
  g->d_sink = FALLOC(s->H);
  for (int64_t i = 0; i < s->S1 * s->H * s->D; i++) g->dq[i] = 1e3f; /* overwritten */
}
static void attn_grads_free(attn_grads *g) { free(g->dq); free(g->d_ori); free(g->d_cmp); free(g->d_sink); }

/* Forward then backward of one implementation (its own out / lse), gradients of sum(out * dout). */
static void attn_fwd_bwd(attn_prob *P, int naive, const float *dout, attn_grads *g) {
  tu_ok((naive ? dsv4_sparse_attn_ref : dsv4_sparse_attn)(&P->a), "sparse_attn");
  dsv4_attn_bwd_args b = {g->dq, g->d_ori, P->cmp_kv ? g->d_cmp : NULL, g->d_sink, dout, P->out,
                          P->lse, NULL, P->a};
  tu_ok((naive ? dsv4_sparse_attn_bwd_ref : dsv4_sparse_attn_bwd)(&b), "sparse_attn_bwd");
}

/* Compares two gradient sets: tu_close on each buffer (tol relative to max(max|b|, 1)), or same
 * bits when tol < 0. */
static void attn_grads_compare(const attn_prob *P, const attn_grads *a, const attn_grads *b, double tol,
                               const char *what, const char *d) {
  const attn_spec *s = &P->sp;
  const struct { const char *name; const float *x, *y; int64_t n; } t[] = {
      {"dq", a->dq, b->dq, s->S1 * s->H * s->D}, {"d_ori_kv", a->d_ori, b->d_ori, P->R * s->D},
      {"d_cmp_kv", a->d_cmp, b->d_cmp, s->C * s->D}, {"d_sink", a->d_sink, b->d_sink, s->H}};
  char name[320];
  for (int i = 0; i < 4; i++) {
    if (i == 2 && !P->cmp_kv) continue;
    snprintf(name, sizeof name, "sparse_attn backward %s %s: %s", what, t[i].name, d);
    if (tol < 0) check_bits(t[i].x, t[i].y, sizeof(float) * (size_t)t[i].n, name);
    else tu_close(name, t[i].x, t[i].y, t[i].n, tol, 1.0);
  }
}

/* Fast vs naive on every shared case. Tolerance: as the forward (D-term dot products, n_keys-term
 * softmax sums), plus the key gradients' sums over up to S1 H (query, head) contributions:
 * 8 (D + n_keys + S1 H) u relative to max(max|ref|, 1). Also: padding queries get dq == 0 exactly and
 * contribute nothing (garbage dout on their rows changes nothing); d_ori_kv / d_cmp_kv / d_sink
 * accumulate onto what the buffers hold; ranges == the same keys as ids. The naive side of these is
 * checked bitwise, the fast side within tol: the fast key gradients are per-thread partial sums
 * over a dynamic schedule, so their last bits vary from run to run. */
static void test_attn_bwd(void) {
  char d[160];
  for (int c = 0; c < N_ATTN_ALL; c++) {
    const attn_spec sp = attn_case(c);
    attn_prob P;
    attn_make(&P, &sp);
    attn_desc(&P, d, sizeof d);
    const attn_spec *s = &P.sp;
    const int64_t HD = (int64_t)s->H * s->D, nq = s->S1 * HD;
    const int64_t n_keys = s->W + (s->mode == CMP_IDS ? s->n_ids : s->mode == CMP_RANGE ? s->C : 0);
    const double tol = 8 * (s->D + n_keys + s->S1 * s->H) * U32;
    float *dout = FALLOC(nq), *dout2 = FALLOC(nq);
    tu_fill(dout, nq, s->seed * 16 + 9, 1.0f);
    attn_grads gF, gN, g2;
    attn_grads_alloc(&P, &gF);
    attn_grads_alloc(&P, &gN);
    attn_fwd_bwd(&P, 0, dout, &gF);
    attn_fwd_bwd(&P, 1, dout, &gN);
    attn_grads_compare(&P, &gF, &gN, tol, "fast vs naive", d);
    if (s->pad_every) {
      int zero = 1;
      for (int64_t p = 0; p < s->S1; p++)
        for (int64_t i = 0; !P.win_len[p] && i < HD; i++) zero &= gF.dq[p * HD + i] == 0 && gN.dq[p * HD + i] == 0;
      tu_check(zero, "sparse_attn backward: padding queries get dq == 0 exactly (fast, naive): %s", d);
      memcpy(dout2, dout, sizeof(float) * nq);
      for (int64_t p = 0; p < s->S1; p++)
        for (int64_t i = 0; !P.win_len[p] && i < HD; i++) dout2[p * HD + i] = 5.0f;
      for (int naive = 0; naive < 2; naive++) {
        attn_grads_alloc(&P, &g2);
        attn_fwd_bwd(&P, naive, dout2, &g2);
        attn_grads_compare(&P, &g2, naive ? &gN : &gF, naive ? -1 : tol,
                           naive ? "naive: padding rows' dout ignored (same bits)"
                                 : "fast: padding rows' dout ignored", d);
        attn_grads_free(&g2);
      }
    }
    /* accumulated buffers: start from a base B, expect B + (result from zeros) */
    attn_grads_alloc(&P, &g2);
    attn_grads ex;
    attn_grads_alloc(&P, &ex);
    memcpy(ex.dq, gF.dq, sizeof(float) * nq);
    add_base(g2.d_ori, ex.d_ori, gF.d_ori, P.R * s->D, 41);
    add_base(g2.d_cmp, ex.d_cmp, gF.d_cmp, s->C * s->D, 42);
    add_base(g2.d_sink, ex.d_sink, gF.d_sink, s->H, 43);
    attn_fwd_bwd(&P, 0, dout, &g2);
    attn_grads_compare(&P, &g2, &ex, tol, "fast accumulates (base + grads)", d);
    attn_grads_free(&g2);
    attn_grads_free(&ex);
    if (s->mode == CMP_RANGE) { /* the same keys as explicit ids */
      attn_prob Q;
      attn_ranges_as_ids(&P, &Q);
      for (int naive = 0; naive < 2; naive++) {
        attn_grads_alloc(&Q, &g2);
        attn_fwd_bwd(&Q, naive, dout, &g2);
        attn_grads_compare(&P, &g2, naive ? &gN : &gF, naive ? -1 : tol,
                           naive ? "naive: ranges == same keys as ids (same bits)"
                                 : "fast: ranges == same keys as ids", d);
        attn_grads_free(&g2);
      }
      attn_free(&Q);
    }
    attn_grads_free(&gF);
    attn_grads_free(&gN);
    free(dout); free(dout2);
    attn_free(&P);
  }
}

typedef struct { attn_prob *P; const float *R; } attn_ctx;

/* L = sum(out * R) from the naive forward, in double. */
static double attn_objective(void *c) {
  attn_ctx *x = c;
  dsv4_sparse_attn_ref(&x->P->a);
  const int64_t n = x->P->sp.S1 * x->P->sp.H * x->P->sp.D;
  double L = 0;
  for (int64_t i = 0; i < n; i++) L += (double)x->P->out[i] * x->R[i];
  return L;
}

/* Central differences on tiny shapes: dq, d_ori_kv, d_cmp_kv, d_sink of fast and naive. */
static void test_attn_fd(void) {
  static const attn_spec CASES[] = {
      /* S1 C H D W halo mode n_ids pad empty hole repeat seed */
      {5, 4, 2, 8, 3, 1, CMP_IDS, 4, 4, 0, 3, 1, 21},   /* ids: -1 holes, repeated ids, a padding query */
      {5, 5, 2, 8, 3, 2, CMP_RANGE, 0, 0, 5, 0, 0, 22}, /* HCA ranges, query 0 sees none */
      {4, 0, 1, 8, 3, 0, CMP_NONE, 0, 0, 0, 0, 0, 23},  /* window only, one head */
  };
  char d[160], name[320];
  for (int c = 0; c < 3; c++) {
    attn_prob P;
    attn_make(&P, &CASES[c]);
    attn_desc(&P, d, sizeof d);
    const attn_spec *s = &P.sp;
    const int64_t nq = s->S1 * s->H * s->D;
    float *R = FALLOC(nq);
    tu_fill(R, nq, 99 + c, 1.0f);
    attn_grads g[2];
    for (int naive = 0; naive < 2; naive++) {
      attn_grads_alloc(&P, &g[naive]);
      attn_fwd_bwd(&P, naive, R, &g[naive]);
    }
    attn_ctx ctx = {&P, R};
    struct { const char *name; float *x; int64_t n; int k; } in[] = {
        {"dq", P.q, nq, 0}, {"d_ori_kv", P.ori_kv, P.R * s->D, 1},
        {"d_cmp_kv", P.cmp_kv, P.cmp_kv ? s->C * s->D : 0, 2}, {"d_sink", P.sink, s->H, 3}};
    for (int i = 0; i < 4; i++) {
      if (!in[i].n) continue;
      double *fd = (double *)xalloc((size_t)in[i].n, sizeof(double));
      fd_grad(attn_objective, &ctx, in[i].x, in[i].n, FD_H, fd);
      for (int naive = 0; naive < 2; naive++) {
        const float *an[4] = {g[naive].dq, g[naive].d_ori, g[naive].d_cmp, g[naive].d_sink};
        snprintf(name, sizeof name, "sparse_attn backward %s %s vs finite differences: %s",
                 naive ? "naive" : "fast", in[i].name, d);
        fd_check(name, an[in[i].k], fd, in[i].n, FD_TOL, FD_FLOOR);
      }
      free(fd);
    }
    attn_grads_free(&g[0]);
    attn_grads_free(&g[1]);
    free(R);
    attn_free(&P);
  }
}

/* The fast backward's dq of a query has the same bits whatever other queries share the call. */
static void test_attn_dq_invariance(void) {
  char d[160], name[320];
  for (int c = 0; c < N_ATTN_ALL; c++) {
    const attn_spec sp = attn_case(c);
    if (sp.S1 < 2) continue;
    attn_prob P, Q;
    attn_make(&P, &sp);
    attn_desc(&P, d, sizeof d);
    const int64_t HD = (int64_t)P.sp.H * P.sp.D, nq = P.sp.S1 * HD, k = P.sp.S1 / 2;
    float *dout = FALLOC(nq);
    tu_fill(dout, nq, 7 + c, 1.0f);
    attn_grads gP, gQ;
    attn_grads_alloc(&P, &gP);
    attn_fwd_bwd(&P, 0, dout, &gP);
    attn_subset(&P, k, &Q);
    attn_grads_alloc(&Q, &gQ);
    attn_fwd_bwd(&Q, 0, dout + k * HD, &gQ);
    snprintf(name, sizeof name, "sparse_attn backward fast dq position invariance (drop first %lld): %s",
             (long long)k, d);
    check_invariant(name, gQ.dq, gP.dq + k * HD, Q.sp.S1 * HD);
    attn_grads_free(&gP); attn_grads_free(&gQ);
    free(dout);
    attn_free(&P); attn_free(&Q);
  }
}

/* ============================================================================================
 * Compressor backward
 * ========================================================================================== */
typedef struct { float *dC, *dZ, *d_ape, *d_norm; } cmp_grads;

static void cmp_grads_alloc(const cmp_prob *P, cmp_grads *g) {
  g->dC = FALLOC(P->rows * P->cD);
  g->dZ = P->Z ? FALLOC(P->rows * P->cD) : NULL;     /* V4.1 r = 1: no gate */
  g->d_ape = P->ape ? FALLOC((int64_t)P->sp.ratio * P->cD) : NULL; /* V4.1: no APE */
  g->d_norm = FALLOC(P->sp.D);
}
static void cmp_grads_free(cmp_grads *g) { free(g->dC); free(g->dZ); free(g->d_ape); free(g->d_norm); }

static void cmp_bwd(cmp_prob *P, int naive, const float *dout, cmp_grads *g) {
  dsv4_compress_bwd_args b = {g->dC, g->dZ, g->d_ape, g->d_norm, dout, P->a};
  tu_ok((naive ? dsv4_compress_bwd_ref : dsv4_compress_bwd)(&b), "compress_bwd");
}

static void cmp_grads_compare(const cmp_prob *P, const cmp_grads *a, const cmp_grads *b, double tol,
                              const char *what, const char *d) {
  const int64_t nc = P->rows * P->cD;
  const struct { const char *name; const float *x, *y; int64_t n; } t[] = {
      {"dC", a->dC, b->dC, nc}, {"dZ", a->dZ, b->dZ, nc},
      {"d_ape", a->d_ape, b->d_ape, (int64_t)P->sp.ratio * P->cD}, {"d_norm_w", a->d_norm, b->d_norm, P->sp.D}};
  char name[320];
  for (int i = 0; i < 4; i++) {
    if (!t[i].x) continue;
    snprintf(name, sizeof name, "compressor backward %s %s: %s", what, t[i].name, d);
    tu_close(name, t[i].x, t[i].y, t[i].n, tol, 1.0);
  }
}

/* Fast vs naive on the shared cases. Tolerance: the forward's pooling bound (n_rows fp32 terms,
 * amplified by max|C| / rms(pooled)), plus the d_ape / d_norm_w sums over n_slots slots and the
 * RMSNorm backward's D-term products: 8 (n_rows + D + n_slots) u amp. Accumulation onto a base. */
static void test_cmp_bwd(void) {
  char d[128];
  for (int c = 0; c < N_CMP_ALL; c++) {
    const cmp_spec sp = cmp_case(c);
    cmp_prob P;
    cmp_make(&P, &sp);
    cmp_desc(&P, d, sizeof d);
    const int n_rows = P.sp.ratio == 4 ? (P.prev_row ? 8 : 4) : P.sp.ratio;
    const double tol = 8 * (n_rows + P.sp.D + P.sp.n_slots) * U32 * cmp_amplification(&P);
    float *dout = FALLOC(P.rows_out * P.sp.D);
    tu_fill(dout, P.rows_out * P.sp.D, 50 + c, 1.0f);
    cmp_grads gF, gN, g2, ex;
    cmp_grads_alloc(&P, &gF);
    cmp_grads_alloc(&P, &gN);
    cmp_bwd(&P, 0, dout, &gF);
    cmp_bwd(&P, 1, dout, &gN);
    cmp_grads_compare(&P, &gF, &gN, tol, "fast vs naive", d);
    cmp_grads_alloc(&P, &g2);
    cmp_grads_alloc(&P, &ex);
    add_base(g2.dC, ex.dC, gF.dC, P.rows * P.cD, 61);
    if (P.Z) add_base(g2.dZ, ex.dZ, gF.dZ, P.rows * P.cD, 62);
    if (P.ape) add_base(g2.d_ape, ex.d_ape, gF.d_ape, (int64_t)P.sp.ratio * P.cD, 63);
    add_base(g2.d_norm, ex.d_norm, gF.d_norm, P.sp.D, 64);
    cmp_bwd(&P, 0, dout, &g2);
    cmp_grads_compare(&P, &g2, &ex, tol, "fast accumulates (base + grads)", d);
    cmp_grads_free(&gF); cmp_grads_free(&gN); cmp_grads_free(&g2); cmp_grads_free(&ex);
    free(dout);
    cmp_free(&P);
  }
}

typedef struct { cmp_prob *P; const float *R; } cmp_ctx;

/* L = sum(out * R) over the output rows, from the naive forward. */
static double cmp_objective(void *c) {
  cmp_ctx *x = c;
  dsv4_compress_ref(&x->P->a);
  double L = 0;
  for (int64_t i = 0; i < x->P->rows_out * x->P->sp.D; i++) L += (double)x->P->out[i] * x->R[i];
  return L;
}

/* Central differences on tiny compressors: r = 4 with previous windows (slot 0's from a halo) and
 * an out_row map; r = 128 with D = 4; V4.1's r = 2 (no APE) and r = 1 (no gate). */
static void test_cmp_fd(void) {
  static const cmp_spec CASES[] = {
      {4, 8, 4, 3, 4, PREV_ROWS, 1, 31},
      {4, 4, 2, 2, 0, PREV_ROWS, 0, 32},
      {128, 4, 2, 2, 0, PREV_NULL, 0, 33},
      {2, 4, 2, 3, 1, PREV_NULL, 1, 34},
      {1, 4, 2, 3, 0, PREV_NULL, 0, 35},
  };
  char d[128], name[320];
  for (int c = 0; c < (int)(sizeof CASES / sizeof CASES[0]); c++) {
    cmp_prob P;
    cmp_make(&P, &CASES[c]);
    cmp_desc(&P, d, sizeof d);
    float *R = FALLOC(P.rows_out * P.sp.D);
    tu_fill(R, P.rows_out * P.sp.D, 70 + c, 1.0f);
    cmp_grads g[2];
    for (int naive = 0; naive < 2; naive++) {
      cmp_grads_alloc(&P, &g[naive]);
      cmp_bwd(&P, naive, R, &g[naive]);
    }
    cmp_ctx ctx = {&P, R};
    const int64_t nc = P.rows * P.cD;
    struct { const char *name; float *x; int64_t n; int k; } in[] = {
        {"dC", P.C, nc, 0}, {"dZ", P.Z, nc, 1}, {"d_ape", P.ape, (int64_t)P.sp.ratio * P.cD, 2},
        {"d_norm_w", P.norm_w, P.sp.D, 3}};
    for (int i = 0; i < 4; i++) {
      if (!in[i].x) continue; /* no gate (r = 1) or no APE (V4.1) */
      double *fd = (double *)xalloc((size_t)in[i].n, sizeof(double));
      fd_grad(cmp_objective, &ctx, in[i].x, in[i].n, FD_H, fd);
      for (int naive = 0; naive < 2; naive++) {
        const float *an[4] = {g[naive].dC, g[naive].dZ, g[naive].d_ape, g[naive].d_norm};
        snprintf(name, sizeof name, "compressor backward %s %s vs finite differences: %s",
                 naive ? "naive" : "fast", in[i].name, d);
        fd_check(name, an[in[i].k], fd, in[i].n, FD_TOL, FD_FLOOR);
      }
      free(fd);
    }
    cmp_grads_free(&g[0]);
    cmp_grads_free(&g[1]);
    free(R);
    cmp_free(&P);
  }
}

/* ============================================================================================
 * KL loss gradients
 * ========================================================================================== */
/* Rows of J_p: selected ids (sparse) or the visible range (dense). */
static int kl_rows(const kl_prob *K, int64_t p, int32_t *rows) {
  const idx_spec *s = &K->ix.sp;
  int n = 0;
  if (K->dense)
    for (int j = 0; j < K->ix.vis_count[p]; j++) rows[n++] = K->ix.vis_begin[p] + j;
  else
    for (int j = 0; j < s->topk; j++)
      if (K->sel[p * s->topk + j] >= 0) rows[n++] = K->sel[p * s->topk + j];
  return n;
}

/* Signs of every ReLU argument q_idx[p,h] . k_idx[j] over j in J_p (written to signs when not NULL;
 * returns how many), and the smallest |arg| / sum |q k| (how close to the kink, relative to its
 * rounding scale). */
static int64_t kl_relu_signs(const kl_prob *K, uint8_t *signs, double *min_margin) {
  const idx_spec *s = &K->ix.sp;
  int32_t *rows = IALLOC(s->C + s->topk + 1);
  int64_t m = 0;
  *min_margin = INFINITY;
  for (int64_t p = 0; p < s->S1; p++) {
    const int n = kl_rows(K, p, rows);
    for (int h = 0; h < s->Hi; h++)
      for (int j = 0; j < n; j++) {
        double dt = 0, da = 0;
        for (int e = 0; e < s->Di; e++) {
          const double t = (double)K->ix.q_idx[(p * s->Hi + h) * s->Di + e] * K->ix.k_idx[(int64_t)rows[j] * s->Di + e];
          dt += t;
          da += fabs(t);
        }
        if (signs) signs[m] = dt > 0;
        m++;
        *min_margin = fmin(*min_margin, fabs(dt) / (da > 0 ? da : 1));
      }
  }
  free(rows);
  return m;
}

static void kl_grads_compare(const kl_prob *K, const float *dq, const float *dw, const float *dk,
                             double tol, double floor, const char *what, const char *d) {
  const idx_spec *s = &K->ix.sp;
  char name[320];
  snprintf(name, sizeof name, "kl_loss %s d_q_idx: %s", what, d);
  tu_close(name, dq, K->d_q_idx, s->S1 * s->Hi * s->Di, tol, floor);
  snprintf(name, sizeof name, "kl_loss %s d_weights: %s", what, d);
  tu_close(name, dw, K->d_weights, s->S1 * s->Hi, tol, floor);
  snprintf(name, sizeof name, "kl_loss %s d_k_idx: %s", what, d);
  tu_close(name, dk, K->d_k_idx, s->C * s->Di, tol, floor);
}

/* Fast vs naive gradients of grad_scale * loss_sum (grad_scale 0.7), sparse and dense. Tolerance:
 * dI = grad_scale (s - t) carries the loss's (D + Di + H + Hi + n) u error; d_q_idx sums n terms,
 * d_k_idx S1 Hi: 8 (D + Di + H + Hi + n + S1 Hi) u relative to max(max|ref|, grad_scale).
 * Precondition: no ReLU argument q_idx . k_idx within twice its fp32 rounding bound Di u sum|q k| of
 * the kink (else fast and naive may legitimately disagree on the ReLU mask). d_q_idx / d_weights are overwritten, d_k_idx
 * accumulated; grad_scale 0 gives exact zeros. */
static void test_kl_grad(void) {
  char d[160];
  const float gs = 0.7f;
  for (int c = 0; c < N_KL_ALL; c++)
    for (int dense = 0; dense < 2; dense++) {
      const kl_case kcv = kl_case_at(c), *kc = &kcv;
      kl_prob K;
      kl_make(&K, &kc->ix, kc->H, kc->D, dense, gs);
      const idx_spec *s = &K.ix.sp;
      snprintf(d, sizeof d, "S1=%lld C=%lld H=%d D=%d Hi=%d Di=%d topk=%d %s", (long long)s->S1,
               (long long)s->C, K.H, K.D, s->Hi, s->Di, s->topk, dense ? "dense" : "sparse");
      double margin;
      kl_relu_signs(&K, NULL, &margin);
      tu_check(margin > 2 * s->Di * U32, "kl_loss fixture: ReLU arguments away from the kink (margin %.2g, "
               "rounding %.2g): %s", margin, s->Di * U32, d);
      const int64_t nq = s->S1 * s->Hi * s->Di, nw = s->S1 * s->Hi, nk = s->C * s->Di;
      const int64_t nmax = dense ? s->C : s->topk;
      const double tol = 8 * (K.D + s->Di + K.H + s->Hi + nmax + s->S1 * s->Hi) * U32;
      float *dq = FALLOC(nq), *dw = FALLOC(nw), *dk = FALLOC(nk), *ex = FALLOC(nk);
      for (int64_t i = 0; i < nq; i++) K.d_q_idx[i] = 1e3f; /* overwritten */
      for (int64_t i = 0; i < nw; i++) K.d_weights[i] = 1e3f;
      tu_ok(dsv4_indexer_kl_loss(&K.a), "kl_loss");
      memcpy(dq, K.d_q_idx, sizeof(float) * nq);
      memcpy(dw, K.d_weights, sizeof(float) * nw);
      memcpy(dk, K.d_k_idx, sizeof(float) * nk);
      for (int64_t i = 0; i < nq; i++) K.d_q_idx[i] = 1e3f;
      for (int64_t i = 0; i < nw; i++) K.d_weights[i] = 1e3f;
      memset(K.d_k_idx, 0, sizeof(float) * nk);
      tu_ok(dsv4_indexer_kl_loss_ref(&K.a), "kl_loss_ref");
      kl_grads_compare(&K, dq, dw, dk, tol, gs, "fast vs naive", d);
      /* d_k_idx accumulates onto a base (fast) */
      add_base(K.d_k_idx, ex, dk, nk, 81);
      tu_ok(dsv4_indexer_kl_loss(&K.a), "kl_loss");
      tu_close("kl_loss fast d_k_idx accumulates (base + grads)", K.d_k_idx, ex, nk, tol, 1.0);
      /* grad_scale 0: the loss is off but the gradients exist, as exact zeros */
      for (int naive = 0; naive < 2; naive++) {
        kl_bind(&K, 0.0f);
        memset(K.d_k_idx, 0, sizeof(float) * nk);
        tu_ok((naive ? dsv4_indexer_kl_loss_ref : dsv4_indexer_kl_loss)(&K.a), "kl_loss");
        int zero = 1;
        for (int64_t i = 0; i < nq; i++) zero &= K.d_q_idx[i] == 0;
        for (int64_t i = 0; i < nw; i++) zero &= K.d_weights[i] == 0;
        for (int64_t i = 0; i < nk; i++) zero &= K.d_k_idx[i] == 0;
        tu_check(zero, "kl_loss %s: grad_scale 0 gives zero gradients: %s", naive ? "naive" : "fast", d);
      }
      free(dq); free(dw); free(dk); free(ex);
      kl_free(&K);
    }
}

typedef struct { kl_prob *K; uint8_t *base_signs, *signs; } kl_ctx;

/* grad_scale * loss_sum from the naive loss (double); NAN when a ReLU argument changed sign. */
static double kl_objective(void *c) {
  kl_ctx *x = c;
  double margin;
  const int64_t m = kl_relu_signs(x->K, x->signs, &margin);
  if (memcmp(x->signs, x->base_signs, (size_t)m)) return NAN;
  dsv4_kl_args a = x->K->a;
  a.d_q_idx = NULL; a.d_weights = NULL; a.d_k_idx = NULL; a.loss_rows = NULL;
  dsv4_indexer_kl_loss_ref(&a);
  return a.grad_scale * *a.loss_sum;
}

/* Central differences of grad_scale * loss_sum (sparse and dense). The objective is a double
 * computation on fp32 inputs, so h = 1e-3 (truncation ~h^2 = 1e-6 relative) and tolerance 1e-3.
 * Elements whose +-h step flips a ReLU argument's sign are skipped (the argument is linear in any
 * one input element, so equal signs at both ends mean no kink in between). */
static void test_kl_fd(void) {
  static const kl_case CASES[] = {
      {{5, 7, 2, 4, 4, 3, 0, 41}, 2, 8},   /* a query with an empty set, -1 holes */
      {{4, 6, 1, 8, 3, 0, 0, 42}, 3, 4},   /* one indexer head */
  };
  const float gs = 0.7f, h = 1e-3f;
  const double tol = 1e-3;
  char d[160], name[320];
  for (int c = 0; c < 2; c++)
    for (int dense = 0; dense < 2; dense++) {
      kl_prob K;
      kl_make(&K, &CASES[c].ix, CASES[c].H, CASES[c].D, dense, gs);
      const idx_spec *s = &K.ix.sp;
      snprintf(d, sizeof d, "S1=%lld C=%lld H=%d D=%d Hi=%d Di=%d topk=%d %s", (long long)s->S1,
               (long long)s->C, K.H, K.D, s->Hi, s->Di, s->topk, dense ? "dense" : "sparse");
      const int64_t nq = s->S1 * s->Hi * s->Di, nw = s->S1 * s->Hi, nk = s->C * s->Di;
      float *an[2][3];
      for (int naive = 0; naive < 2; naive++) {
        memset(K.d_k_idx, 0, sizeof(float) * nk);
        tu_ok((naive ? dsv4_indexer_kl_loss_ref : dsv4_indexer_kl_loss)(&K.a), "kl_loss");
        an[naive][0] = DUP(K.d_q_idx, nq);
        an[naive][1] = DUP(K.d_weights, nw);
        an[naive][2] = DUP(K.d_k_idx, nk);
      }
      double margin;
      const int64_t m = kl_relu_signs(&K, NULL, &margin);
      kl_ctx ctx = {&K, xalloc((size_t)m + 1, 1), xalloc((size_t)m + 1, 1)};
      kl_relu_signs(&K, ctx.base_signs, &margin);
      struct { const char *name; float *x; int64_t n; } in[] = {
          {"d_q_idx", K.ix.q_idx, nq}, {"d_weights", K.ix.weights, nw}, {"d_k_idx", K.ix.k_idx, nk}};
      for (int i = 0; i < 3; i++) {
        double *fd = (double *)xalloc((size_t)in[i].n, sizeof(double));
        fd_grad(kl_objective, &ctx, in[i].x, in[i].n, h, fd);
        for (int naive = 0; naive < 2; naive++) {
          snprintf(name, sizeof name, "kl_loss backward %s %s vs finite differences: %s",
                   naive ? "naive" : "fast", in[i].name, d);
          fd_check(name, an[naive][i], fd, in[i].n, tol, gs * FD_FLOOR);
        }
        free(fd);
      }
      for (int naive = 0; naive < 2; naive++)
        for (int i = 0; i < 3; i++) free(an[naive][i]);
      free(ctx.base_signs); free(ctx.signs);
      kl_free(&K);
    }
}

static const tu_test TESTS[] = {
    {"rmsnorm", "finite-differences", test_rmsnorm_grad},
    {"sparse_attn", "backward", test_attn_bwd},
    {"sparse_attn", "finite-differences", test_attn_fd},
    {"sparse_attn", "position-invariance", test_attn_dq_invariance},
    {"compressor", "backward", test_cmp_bwd},
    {"compressor", "finite-differences", test_cmp_fd},
    {"kl_loss", "backward", test_kl_grad},
    {"kl_loss", "finite-differences", test_kl_fd},
};

int main(int argc, char **argv) {
  g_bitwise = dsv4_blas_probe_invariance();
  if (!g_bitwise) printf("note: this BLAS is not row-position invariant: invariance checked to 1e-5\n");
  return tu_run(argc, argv, TESTS, (int)(sizeof TESTS / sizeof TESTS[0]));
}
