/* sparse_attn.c: fast sparse_attn_sharedkv, forward (two phases) and backward.
 *
 * Blocking: one query at a time, all heads together, so every product is a BLAS call
 * [H, D] x [D, n_keys] (forward: scores, then [H, n] x [n, D] for the output). Window keys are
 * contiguous rows of ori_kv and need no copy; top-k compressed keys are gathered once per query
 * into a contiguous block (k rows of D floats: 1 MiB at V4-Flash sizes, against 4 H k D = 67 MFLOP
 * of work on it). A query's calls have the same shapes whatever rank computes it, which keeps CP
 * results bitwise equal to one rank (see util/gemm.h).
 *
 * Napkin math (V4-Flash, CSA, per query): window 2 x 2 H W D = 17 MFLOP, compressed 2 x 2 H k D =
 * 67 MFLOP, exp H (W + k) = 41k; M = H = 64 rows keeps sgemm near its peak. */
#include "sparse_attn.h"

#include "attn_common.h"
#include "kernels.h"
#include "util/err.h"
#include "util/gemm.h"
#include "util/par.h"
#include "util/reduce.h"
#include "util/workspace.h"
#include "util/xrows.h"

/* Per-thread scratch of the window phase: scores of one query against its window. */
static size_t win_carve(char *base, int H, int64_t nwmax, float **S) {
  dsv4_carver c = {base, 0};
  *S = dsv4_carve(&c, sizeof(float) * (size_t)H * (size_t)(nwmax ? nwmax : 1));
  return c.used;
}

/* Per-thread scratch of the compressed phase. */
typedef struct {
  float *S;       /* [H, max cmp] scores / probabilities */
  float *Kc;      /* [max cmp, D] gathered compressed keys (top-k ids only) */
  int32_t *rows;  /* [max cmp] */
  float *mc, *lc; /* [H] per-head max and denominator */
  float *t, *e;   /* [max cmp + 1] KL teacher row and its scratch */
} fwd_scratch;

static size_t fwd_carve(char *base, const dsv4_attn_args *a, int64_t ncmax, fwd_scratch *s) {
  dsv4_carver c = {base, 0};
  s->S = dsv4_carve(&c, sizeof(float) * (size_t)a->H * (size_t)(ncmax ? ncmax : 1));
  s->Kc = dsv4_carve(&c, sizeof(float) * (size_t)((a->cmp_ids ? ncmax : 0) * a->D + 1));
  s->rows = dsv4_carve(&c, sizeof(int32_t) * (size_t)(ncmax + 1));
  s->mc = dsv4_carve(&c, sizeof(float) * (size_t)a->H);
  s->lc = dsv4_carve(&c, sizeof(float) * (size_t)a->H);
  s->t = dsv4_carve(&c, sizeof(float) * (size_t)(ncmax + 1));
  s->e = dsv4_carve(&c, sizeof(float) * (size_t)(ncmax + 1));
  return c.used;
}

/* Per-thread scratch of the backward. */
typedef struct {
  float *SP;      /* [2H, max keys] dS and P of one block */
  float *Kc;      /* [max cmp, D] gathered compressed keys (top-k ids only) */
  float *QO;      /* [2H, D] q and dO stacked */
  float *delta;   /* [H] */
  float *tsink;   /* [H] one query's sink gradient terms */
  int32_t *rows;  /* [G, max cmp + 1] the compressed rows of a group's queries */
  float *dKg;     /* [G, max keys, D] their compressed keys' gradients, added as one group; a query's
                     window keys' gradients use its slot first (added at once) */
  dsv4_xrows_group grp;
} bwd_scratch;

/* Queries whose compressed-key gradients are added together (dsv4_xrows_add_group): neighbouring
 * queries select mostly the same rows, and a CSA query's 512 rows of sums (16 bytes per element:
 * 4 MiB) spill the cache, so adding a row's terms of the whole group in one pass cuts the traffic
 * on the sums by about the group's size. At most BWD_GROUP queries, and their buffered gradients
 * at most BWD_GROUP_BYTES per thread (CSA: 4 queries; an HCA query at long lengths has thousands of
 * rows). One query when there are no compressed keys. */
#define BWD_GROUP       DSV4_XROWS_LISTS
#define BWD_GROUP_BYTES ((int64_t)4 << 20)

static int bwd_group(const dsv4_attn_args *a, int64_t ncmax) {
  const int64_t per = ncmax * a->D * (int64_t)sizeof(float), g = per > 0 ? BWD_GROUP_BYTES / per : 1;
  return g < 1 ? 1 : g > BWD_GROUP ? BWD_GROUP : (int)g;
}

/* C: the rows of the compressed sums; G: the group's size. */
static size_t bwd_carve(char *base, const dsv4_attn_args *a, int64_t nmax, int64_t ncmax, int64_t C, int G,
                        bwd_scratch *s) {
  dsv4_carver c = {base, 0};
  const size_t H = (size_t)a->H, D = (size_t)a->D;
  s->SP = dsv4_carve(&c, sizeof(float) * 2 * H * (size_t)nmax);
  s->Kc = dsv4_carve(&c, sizeof(float) * ((size_t)(a->cmp_ids ? ncmax : 0) * D + 1));
  s->QO = dsv4_carve(&c, sizeof(float) * 2 * H * D);
  s->delta = dsv4_carve(&c, sizeof(float) * H);
  s->tsink = dsv4_carve(&c, sizeof(float) * H);
  s->rows = dsv4_carve(&c, sizeof(int32_t) * (size_t)G * (size_t)(ncmax + 1));
  s->dKg = dsv4_carve(&c, sizeof(float) * ((size_t)G * (size_t)nmax * D + 1));
  dsv4_xrows_group_carve(&c, C, (int64_t)G * ncmax, &s->grp);
  return c.used;
}

size_t dsv4_sparse_attn_bwd_thread_bytes(int H, int D, int64_t nmax, int64_t ncmax, int64_t C, int top_k) {
  static const int32_t any_id = 0;
  const dsv4_attn_args a = {.H = H, .D = D, .cmp_ids = top_k ? &any_id : NULL};
  bwd_scratch sc;
  return bwd_carve(NULL, &a, nmax, ncmax, C, bwd_group(&a, ncmax), &sc);
}

static int64_t max_win(const dsv4_attn_args *a) {
  int64_t m = 0;
  for (int64_t p = 0; p < a->S1; p++) m = a->win_len[p] > m ? a->win_len[p] : m;
  return m;
}

/* Compressed keys of query p: a pointer to n contiguous rows (range or gathered copy). */
static const float *cmp_keys(const dsv4_attn_args *a, int64_t p, int32_t *rows, float *gather, int *n) {
  *n = dsv4_attn_cmp_rows(a, p, rows);
  if (*n == 0) return NULL;
  if (!a->cmp_ids) return a->cmp_kv + (int64_t)rows[0] * a->D;
  for (int j = 0; j < *n; j++)
    memcpy(gather + (int64_t)j * a->D, a->cmp_kv + (int64_t)rows[j] * a->D, sizeof(float) * a->D);
  return gather;
}

/* Row maximum and in-place exp(x - m) of an [H, n] block; returns row sums in l. */
static void softmax_rows(float *S, int H, int n, float *mx, float *l) {
  for (int h = 0; h < H; h++) {
    float *s = S + (int64_t)h * n;
    mx[h] = dsv4_max(s, n);
    dsv4_exp_shift(s, n, mx[h]);
    l[h] = dsv4_sum(s, n);
  }
}

dsv4_status dsv4_sparse_attn_window(const dsv4_attn_args *a, float *m_w, float *l_w) {
  return dsv4_sparse_attn_window_progress(a, m_w, l_w, NULL, NULL);
}

/* Queries between two progress calls: ~1 ms of window attention at V4-Flash sizes. */
#define PROGRESS_EVERY 16

dsv4_status dsv4_sparse_attn_window_progress(const dsv4_attn_args *a, float *m_w, float *l_w,
                                             void (*progress)(void *), void *ctx) {
  dsv4_status rc = DSV4_OK;
  dsv4_workspace ws = {0};
  DSV4_TRY(dsv4_attn_check(a));
  const int H = a->H, D = a->D;
  const int64_t nwmax = max_win(a);
  const int nt = dsv4_team(a->threads);
  float *S = NULL;
  DSV4_TRY(dsv4_ws_alloc(&ws, win_carve(NULL, H, nwmax, &S), nt, "sparse_attn"));
#pragma omp parallel num_threads(nt) private(S)
  {
    dsv4_blas_serial();
    win_carve(dsv4_ws_thread(&ws), H, nwmax, &S);
#pragma omp for schedule(dynamic, PROGRESS_EVERY)
    for (int64_t p = 0; p < a->S1; p++) {
      if (progress && p % PROGRESS_EVERY == 0 && dsv4_thread_id() == 0) progress(ctx);
      const int nw = a->win_len[p];
      const float *q = a->q + p * H * D, *Kw = a->ori_kv + (int64_t)a->win_start[p] * D;
      float *o = a->out + p * H * D;
      if (nw == 0) {
        memset(o, 0, sizeof(float) * H * D);
        for (int h = 0; h < H; h++) { m_w[p * H + h] = -INFINITY; l_w[p * H + h] = 0; }
        continue;
      }
      dsv4_gemm_nt(H, nw, D, a->scale, q, D, Kw, D, 0.0f, S, nw);
      if (a->scores_out) memcpy(a->scores_out + p * a->score_stride, S, sizeof(float) * (size_t)H * nw);
      softmax_rows(S, H, nw, m_w + p * H, l_w + p * H);
      dsv4_gemm_nn(H, D, nw, 1.0f, S, nw, Kw, D, 0.0f, o, D);
    }
  }
fail:
  dsv4_ws_free(&ws);
  return rc;
}

/* The KL teacher of query p from its compressed logits S [H, nc], written at the columns of its
 * non -1 ids (0 elsewhere); t, e: scratch [nc]. */
static void write_teacher(const dsv4_attn_args *a, int64_t p, const float *S, int nc, float *t, float *e) {
  float *row = a->teacher + p * a->n_cmp_ids;
  if (nc > 0) dsv4_kl_teacher(S, a->H, nc, t, e);
  for (int c = 0, j = 0; c < a->n_cmp_ids; c++) row[c] = a->cmp_ids[p * a->n_cmp_ids + c] >= 0 ? t[j++] : 0.0f;
}

dsv4_status dsv4_sparse_attn_finish(const dsv4_attn_args *a, const float *m_w, const float *l_w) {
  return dsv4_sparse_attn_finish_progress(a, m_w, l_w, NULL, NULL);
}

dsv4_status dsv4_sparse_attn_finish_progress(const dsv4_attn_args *a, const float *m_w, const float *l_w,
                                             void (*progress)(void *), void *ctx) {
  dsv4_status rc = DSV4_OK;
  dsv4_workspace ws = {0};
  DSV4_TRY(dsv4_attn_check(a));
  const int H = a->H, D = a->D;
  const int64_t ncmax = dsv4_attn_max_cmp(a);
  const int nt = dsv4_team(a->threads);
  fwd_scratch sc;
  DSV4_TRY(dsv4_ws_alloc(&ws, fwd_carve(NULL, a, ncmax, &sc), nt, "sparse_attn"));
#pragma omp parallel num_threads(nt) private(sc)
  {
    dsv4_blas_serial();
    fwd_carve(dsv4_ws_thread(&ws), a, ncmax, &sc);
    float *mc = sc.mc, *lc = sc.lc;
#pragma omp for schedule(dynamic, 16)
    for (int64_t p = 0; p < a->S1; p++) {
      if (progress && dsv4_thread_id() == 0) progress(ctx);
      float *o = a->out + p * H * D, *lse = a->lse + p * H;
      if (a->win_len[p] == 0) {
        for (int h = 0; h < H; h++) lse[h] = 0;
        if (a->teacher && a->cmp_ids) memset(a->teacher + p * a->n_cmp_ids, 0, sizeof(float) * a->n_cmp_ids);
        continue;
      }
      int nc;
      const float *Kc = cmp_keys(a, p, sc.rows, sc.Kc, &nc);
      if (nc > 0) {
        dsv4_gemm_nt(H, nc, D, a->scale, a->q + p * H * D, D, Kc, D, 0.0f, sc.S, nc);
        if (a->scores_out)
          memcpy(a->scores_out + p * a->score_stride + (int64_t)H * a->win_len[p], sc.S, sizeof(float) * (size_t)H * nc);
        for (int h = 0; h < H; h++) mc[h] = dsv4_max(sc.S + (int64_t)h * nc, nc);
      }
      if (a->teacher && a->cmp_ids) write_teacher(a, p, sc.S, nc, sc.t, sc.e);
      for (int h = 0; h < H; h++) {
        const float mw = m_w[p * H + h];
        float m = mw > a->sink[h] ? mw : a->sink[h];
        if (nc > 0 && mc[h] > m) m = mc[h];
        const float aw = dsv4_exp_neg(mw - m);
        float sum = 0;
        if (nc > 0) {
          float *s = sc.S + (int64_t)h * nc;
          dsv4_exp_shift(s, nc, m);
          sum = dsv4_sum(s, nc);
        }
        lc[h] = aw * l_w[p * H + h] + sum + dsv4_exp_neg(a->sink[h] - m);
        for (int e = 0; e < D; e++) o[(int64_t)h * D + e] *= aw;
        lse[h] = m + logf(lc[h]);
      }
      if (nc > 0) dsv4_gemm_nn(H, D, nc, 1.0f, sc.S, nc, Kc, D, 1.0f, o, D);
      for (int h = 0; h < H; h++) {
        const float inv = 1.0f / lc[h];
        for (int e = 0; e < D; e++) o[(int64_t)h * D + e] *= inv;
      }
    }
  }
fail:
  dsv4_ws_free(&ws);
  return rc;
}

dsv4_status dsv4_sparse_attn(const dsv4_attn_args *a) {
  dsv4_status rc = DSV4_OK;
  float *ml = NULL;
  DSV4_TRY(dsv4_attn_check(a));
  DSV4_ALLOC(ml, 2 * a->S1 * a->H);
  DSV4_TRY(dsv4_sparse_attn_window(a, ml, ml + a->S1 * a->H));
  DSV4_TRY(dsv4_sparse_attn_finish(a, ml, ml + a->S1 * a->H));
fail:
  free(ml);
  return rc;
}

/* Backward of one block of n keys K (contiguous rows) for one query, FlashAttention style with the
 * forward's lse (the probabilities are recomputed, not stored):
 *   P = exp(scale q K^T - lse);  dS = scale P (dO K^T - delta)   (delta = dO . O per head)
 *   dq += dS K;   dK = dS^T q + P^T dO  (key and value are one vector: both terms land on K).
 * QO is [q; dO] stacked [2H, D] and SP the scratch [dS; P] stacked [2H, n], so dK is ONE product
 * with inner dimension 2H (128 at V4-Flash sizes) instead of two with H: half the output passes.
 * S_fwd: the forward's scaled logits of this block (dsv4_attn_args.scores_out), or NULL.
 * dK [n, D] receives this query's key gradients (overwritten; the caller adds them exactly). */
static void bwd_block(const dsv4_attn_args *a, const float *QO, const float *lse, const float *delta,
                      const float *K, int n, const float *S_fwd, float *SP, float *dq, int first, float *dK) {
  const int H = a->H, D = a->D;
  float *dS = SP, *P = SP + (int64_t)H * n;
  /* the forward's logits when it kept them: the same product of the same values, so the same bits */
  if (S_fwd) memcpy(P, S_fwd, sizeof(float) * (size_t)H * n);
  else dsv4_gemm_nt(H, n, D, a->scale, QO, D, K, D, 0.0f, P, n);
  dsv4_gemm_nt(H, n, D, 1.0f, QO + (int64_t)H * D, D, K, D, 0.0f, dS, n);
  for (int h = 0; h < H; h++) {
    float *pr = P + (int64_t)h * n, *ds = dS + (int64_t)h * n;
    for (int j = 0; j < n; j++) {
      pr[j] = dsv4_exp_neg(pr[j] - lse[h]);
      ds[j] = a->scale * pr[j] * (ds[j] - delta[h]);
    }
  }
  dsv4_gemm_nn(H, D, n, 1.0f, dS, n, K, D, first ? 0.0f : 1.0f, dq, D);
  dsv4_gemm_tn(n, D, 2 * H, 1.0f, SP, n, QO, D, 0.0f, dK, D);
}

/* Key gradients are sums over queries, which the threads share out: each thread adds its queries'
 * terms into its own exact accumulator (util/xrows.h), merged after the loop, so d_ori_kv, d_cmp_kv
 * and d_sink are the same bits for every thread count and every split of the queries into calls
 * that add the same terms. Window rows are accumulated only over the range the queries touch; the
 * compressed rows' terms of a group of neighbouring queries are added together (bwd_group).
 * x_ori / x_cmp (views, may be NULL): the caller's sums over several calls, left unrounded; the
 * float outputs d_ori_kv / d_cmp_kv are then not written. */
dsv4_status dsv4_sparse_attn_bwd_into(const dsv4_attn_bwd_args *b, dsv4_xrows *x_ori, dsv4_xrows *x_cmp) {
  return dsv4_sparse_attn_bwd_into_progress(b, x_ori, x_cmp, NULL, NULL);
}

dsv4_status dsv4_sparse_attn_bwd_into_progress(const dsv4_attn_bwd_args *b, dsv4_xrows *x_ori, dsv4_xrows *x_cmp,
                                               void (*progress)(void *), void *ctx) {
  dsv4_status rc = DSV4_OK;
  const dsv4_attn_args *a = &b->fwd;
  dsv4_workspace ws = {0};
  dsv4_xrows xo = {0}, xc = {0}, xs = {0};
  DSV4_TRY(dsv4_attn_bwd_check_sums(b, x_ori != NULL, x_cmp != NULL));
  const int H = a->H, D = a->D;
  const int64_t ncmax = dsv4_attn_max_cmp(a), nmax = (max_win(a) > ncmax ? max_win(a) : ncmax) + 1;
  const int64_t C = a->cmp_kv ? a->C : 0;
  int nt = dsv4_team(a->threads);
  if (x_ori) nt = nt < x_ori->nt ? nt : x_ori->nt;
  if (x_cmp && C) nt = nt < x_cmp->nt ? nt : x_cmp->nt;
  int64_t w_lo = a->R, w_hi = 0;
  for (int64_t p = 0; p < a->S1; p++)
    if (a->win_len[p] > 0) {
      w_lo = a->win_start[p] < w_lo ? a->win_start[p] : w_lo;
      w_hi = a->win_start[p] + a->win_len[p] > w_hi ? a->win_start[p] + a->win_len[p] : w_hi;
    }
  if (x_ori) {
    DSV4_CHECK(x_ori->rows >= a->R && x_ori->w == D, DSV4_ERR_ARG, "sparse_attn backward: window sums of %lld rows",
               (long long)x_ori->rows);
    xo = *x_ori;
  } else {
    DSV4_TRY(dsv4_xrows_alloc(&xo, w_lo, w_hi - w_lo, D, nt, "sparse_attn backward"));
  }
  if (x_cmp && C) {
    DSV4_CHECK(x_cmp->rows >= C && x_cmp->w == D, DSV4_ERR_ARG, "sparse_attn backward: compressed sums of %lld rows",
               (long long)x_cmp->rows);
    xc = *x_cmp;
  } else {
    DSV4_TRY(dsv4_xrows_alloc_locked(&xc, 0, C, D, nt, "sparse_attn backward"));
  }
  DSV4_TRY(dsv4_xrows_alloc(&xs, 0, 1, H, nt, "sparse_attn backward"));
  bwd_scratch sc;
  const int G = bwd_group(a, ncmax);
  DSV4_TRY(dsv4_ws_alloc(&ws, bwd_carve(NULL, a, nmax, ncmax, xc.rows, G, &sc), nt, "sparse_attn backward"));
  int bad = 0;
#pragma omp parallel num_threads(nt) private(sc) reduction(| : bad)
  {
    dsv4_blas_serial();
    bwd_carve(dsv4_ws_thread(&ws), a, nmax, ncmax, xc.rows, G, &sc);
    dsv4_xrows_group_clear(&sc.grp, xc.rows);
    float *Kc = sc.Kc, *QO = sc.QO, *delta = sc.delta, *tsink = sc.tsink;
#pragma omp for schedule(dynamic, 1)
    for (int64_t p0 = 0; p0 < a->S1; p0 += G) {
      for (int64_t p = p0; p < p0 + G && p < a->S1; p++) {
        if (progress && dsv4_thread_id() == 0) progress(ctx);
        const float *q = a->q + p * H * D, *dO = b->dout + p * H * D, *O = b->out + p * H * D;
        const float *lse = b->lse + p * H;
        float *dq = b->dq + p * H * D;
        const int nw = a->win_len[p];
        if (nw == 0) {
          memset(dq, 0, sizeof(float) * H * D);
          continue;
        }
        for (int h = 0; h < H; h++) {
          const float s = dsv4_dot(dO + (int64_t)h * D, O + (int64_t)h * D, D);
          delta[h] = s;
          tsink[h] = -(dsv4_exp_neg(a->sink[h] - lse[h]) * s);
        }
        bad |= dsv4_xrows_add(&xs, 0, tsink, 1);
        memcpy(QO, q, sizeof(float) * H * D);
        memcpy(QO + H * D, dO, sizeof(float) * H * D);
        const int64_t ws0 = a->win_start[p];
        const float *S_w = b->scores ? b->scores + p * a->score_stride : NULL;
        const float *S_c = S_w ? S_w + (int64_t)H * nw : NULL;
        float *dKg = sc.dKg + (int64_t)sc.grp.nl * nmax * D;
        bwd_block(a, QO, lse, delta, a->ori_kv + ws0 * D, nw, S_w, sc.SP, dq, 1, dKg);
        bad |= dsv4_xrows_add(&xo, ws0, dKg, nw);
        int32_t *rows = sc.rows + (int64_t)sc.grp.nl * (ncmax + 1);
        int nc;
        const float *K = cmp_keys(a, p, rows, Kc, &nc);
        if (nc == 0) continue;
        bwd_block(a, QO, lse, delta, K, nc, S_c, sc.SP, dq, 0, dKg);
        dsv4_xrows_group_push(&sc.grp, rows, nc, dKg);
      }
      bad |= dsv4_xrows_add_group(&xc, &sc.grp);
    }
  }
  DSV4_CHECK(!bad, DSV4_ERR_ARG, "sparse_attn backward: a gradient term is not finite or not below 2^24 (the exact "
             "sums' range)");
  if (!x_ori) DSV4_TRY(dsv4_xrows_finish(&xo, b->d_ori_kv + w_lo * D, "sparse_attn backward"));
  if (C && !x_cmp) DSV4_TRY(dsv4_xrows_finish(&xc, b->d_cmp_kv, "sparse_attn backward"));
  DSV4_TRY(dsv4_xrows_finish(&xs, b->d_sink, "sparse_attn backward"));
fail:
  dsv4_ws_free(&ws);
  dsv4_xrows_free(&xo);
  dsv4_xrows_free(&xc);
  dsv4_xrows_free(&xs);
  return rc;
}

dsv4_status dsv4_sparse_attn_bwd(const dsv4_attn_bwd_args *b) { return dsv4_sparse_attn_bwd_into(b, NULL, NULL); }
