/* kl_loss.c: fast indexer KL loss and gradients. Per query, the selected compressed rows of
 * cmp_kv and k_idx are gathered into contiguous blocks once, and every product is a BLAS call:
 *   teacher  [H, D] x [D, n]    (2 H D n FLOPs)
 *   student  [Hi, Di] x [Di, n] (2 Hi Di n)
 *   dq_idx = G [Hi, n] x K [n, Di],  dk_idx = G^T x q_idx  (4 Hi Di n)
 * With V4-Flash sizes (n = 512) that is 34 + 8 + 17 MFLOP per query on 1.25 MiB of gathered rows. */
#include "kl_loss.h"

#include "attn_common.h"
#include "kernels.h"
#include "util/err.h"
#include "util/gemm.h"
#include "util/par.h"
#include "util/reduce.h"
#include "util/workspace.h"
#include "util/xrows.h"

/* Heads whose weight gradients are summed side by side (one add chain each). */
#define KL_HEADS 16

/* Queries whose k_idx gradient rows are added as one group (dsv4_xrows_add_group, as the sparse
 * attention's key gradients): at most KL_GROUP, their buffered rows at most KL_GROUP_BYTES; one
 * when that gradient is not wanted. */
#define KL_GROUP       DSV4_XROWS_LISTS
#define KL_GROUP_BYTES ((int64_t)4 << 20)

static int kl_group(const dsv4_kl_args *a, int64_t nmax) {
  if (!a->d_k_idx) return 1;
  const int64_t per = nmax * a->Di * (int64_t)sizeof(float), g = per > 0 ? KL_GROUP_BYTES / per : KL_GROUP;
  return g < 1 ? 1 : g > KL_GROUP ? KL_GROUP : (int)g;
}

/* Per-thread scratch: one query's n <= nmax selected rows (ids, gathered main and indexer keys,
 * scratch dKi), logits Z [H, n] and SI [Hi, n], teacher t [n], student I [n], a group of heads'
 * weight-gradient products P [KL_HEADS, n]; a group of G queries' row ids and k_idx gradients
 * (rows_g [G, nmax], dKg [G, nmax, Di]) and the group add's scratch over C rows. */
typedef struct {
  int32_t *rows, *rows_g;
  float *Kc, *Ki, *Z, *SI, *t, *I, *dKi, *P, *dKg;
  dsv4_xrows_group grp;
} kl_scratch;

static size_t kl_carve(char *base, const dsv4_kl_args *a, int64_t nmax, int G, kl_scratch *s) {
  dsv4_carver c = {base, 0};
  const size_t n = (size_t)nmax;
  s->rows_g = dsv4_carve(&c, sizeof(int32_t) * n * (size_t)G);
  s->rows = s->rows_g;
  s->Kc = dsv4_carve(&c, sizeof(float) * n * (size_t)a->D);
  s->Ki = dsv4_carve(&c, sizeof(float) * n * (size_t)a->Di);
  s->dKi = dsv4_carve(&c, sizeof(float) * n * (size_t)a->Di);
  s->Z = dsv4_carve(&c, sizeof(float) * n * (size_t)a->H);
  s->SI = dsv4_carve(&c, sizeof(float) * n * (size_t)a->Hi);
  s->t = dsv4_carve(&c, sizeof(float) * n);
  s->I = dsv4_carve(&c, sizeof(float) * (n + 1));
  s->P = dsv4_carve(&c, sizeof(float) * n * KL_HEADS);
  s->dKg = a->d_k_idx ? dsv4_carve(&c, sizeof(float) * n * (size_t)G * (size_t)a->Di) : NULL;
  s->grp = (dsv4_xrows_group){0}; /* no lists: its count picks the query's row slot either way */
  if (a->d_k_idx) dsv4_xrows_group_carve(&c, a->C, nmax * G, &s->grp);
  return c.used;
}

/* Values of a [S1, topk] input at query p's valid (non -1) columns, in order (as dsv4_kl_rows). */
static void compact_row(const dsv4_kl_args *a, const float *v, int64_t p, float *out) {
  int n = 0;
  for (int j = 0; j < a->topk; j++)
    if (a->topk_ids[p * a->topk + j] >= 0) out[n++] = v[p * a->topk + j];
}

size_t dsv4_kl_thread_bytes(int H, int D, int Hi, int Di, int64_t nmax, int64_t C, int k_grad) {
  float one = 0;
  const dsv4_kl_args a = {.H = H, .D = D, .Hi = Hi, .Di = Di, .C = C, .d_k_idx = k_grad ? &one : NULL};
  kl_scratch sc;
  nmax = nmax > 1 ? nmax : 1;
  return kl_carve(NULL, &a, nmax, kl_group(&a, nmax), &sc);
}

/* SI [Hi, n] = q_idx[p] . k_idx rows^T (the rows gathered into s->Ki). */
static void student_logits(const dsv4_kl_args *a, int64_t p, int n, kl_scratch *s) {
  const int Hi = a->Hi, Di = a->Di;
  for (int j = 0; j < n; j++)
    memcpy(s->Ki + (int64_t)j * Di, a->k_idx + (int64_t)s->rows[j] * Di, sizeof(float) * Di);
  dsv4_gemm_nt(Hi, n, Di, 1.0f, a->q_idx + p * Hi * Di, Di, s->Ki, Di, 0.0f, s->SI, n);
}

/* nh heads' rows si [nh, n] of the student logits: dw_h = sum_j dI_j ReLU(si_hj), summed in j
 * order from 0 one product at a time (the products rounded first, as a product and an add), then
 * si_hj = dI_j w_h where si_hj > 0, else 0. The products of a group of heads go to P [nh, n] first
 * so that the nh sums run as independent chains: one head's chain alone waits on each add and on a
 * branch that the sign of si mispredicts half the time. dw: NULL when not wanted. */
static void weight_grads(float *restrict si, const float *restrict dI, const float *restrict w, int nh, int n,
                         float *restrict P, float *restrict dw) {
  if (dw) {
    for (int h = 0; h < nh; h++)
      for (int j = 0; j < n; j++) {
        const float x = si[(int64_t)h * n + j];
        P[(int64_t)h * n + j] = dI[j] * (x > 0 ? x : 0.0f);
      }
    float acc[KL_HEADS] = {0};
    for (int j = 0; j < n; j++)
      for (int h = 0; h < nh; h++) acc[h] += P[(int64_t)h * n + j];
    for (int h = 0; h < nh; h++) dw[h] = acc[h];
  }
  for (int h = 0; h < nh; h++) {
    float *restrict x = si + (int64_t)h * n;
    const float wh = w[h];
    for (int j = 0; j < n; j++) {
      const float v = dI[j] * wh;
      x[j] = x[j] > 0 ? v : 0.0f;
    }
  }
}

/* One query: returns its loss term and writes its gradients; its k_idx gradient rows [n, Di] go to
 * dk (NULL: not wanted; the caller adds them exactly).
 * The teacher and the student scores come from the caller when given (sparse mode), else from
 * products here; the gradient needs the per-head student logits (ReLU mask), recomputed here. */
static double one_query(const dsv4_kl_args *a, int64_t p, int n, kl_scratch *s, float *dk) {
  const int H = a->H, D = a->D, Hi = a->Hi, Di = a->Di;
  const int given = !a->dense;
  int have_si = 0;
  if (given && a->teacher) {
    compact_row(a, a->teacher, p, s->t);
  } else {
    for (int j = 0; j < n; j++)
      memcpy(s->Kc + (int64_t)j * D, a->cmp_kv + (int64_t)s->rows[j] * D, sizeof(float) * D);
    dsv4_gemm_nt(H, n, D, a->scale, a->q + p * H * D, D, s->Kc, D, 0.0f, s->Z, n);
    dsv4_kl_teacher(s->Z, H, n, s->t, s->dKi);
  }
  const float *w = a->weights + p * Hi;
  if (given && a->scores) {
    compact_row(a, a->scores, p, s->I);
  } else {
    student_logits(a, p, n, s);
    have_si = 1;
    for (int j = 0; j < n; j++) s->I[j] = 0;
    for (int h = 0; h < Hi; h++) {
      const float *si = s->SI + (int64_t)h * n;
      for (int j = 0; j < n; j++) s->I[j] += w[h] * (si[j] > 0 ? si[j] : 0);
    }
  }
  /* loss = sum_j t_j (log t_j - log s_j), log s = I - logsumexp(I) */
  const float m = dsv4_max(s->I, n);
  double loss = 0;
  dsv4_exp_shift_to(s->dKi, s->I, n, m);
  const double lse = m + log(dsv4_sum(s->dKi, n));
  for (int j = 0; j < n; j++)
    if (s->t[j] > 0) loss += s->t[j] * (log(s->t[j]) - (s->I[j] - lse));
  if (!a->d_q_idx && !a->d_weights && !dk) return loss;
  /* dI_j = grad_scale (s_j - t_j);  d w_h = sum_j dI_j ReLU(SI_hj);  G_hj = dI_j w_h [SI_hj > 0] */
  if (!have_si) student_logits(a, p, n, s);
  float *dI = s->I;
  for (int j = 0; j < n; j++) dI[j] = a->grad_scale * ((float)exp(s->I[j] - lse) - s->t[j]);
  for (int h0 = 0; h0 < Hi; h0 += KL_HEADS) {
    const int nh = Hi - h0 < KL_HEADS ? Hi - h0 : KL_HEADS;
    weight_grads(s->SI + (int64_t)h0 * n, dI, w + h0, nh, n, s->P, a->d_weights ? a->d_weights + p * Hi + h0 : NULL);
  }
  if (a->d_q_idx) dsv4_gemm_nn(Hi, Di, n, 1.0f, s->SI, n, s->Ki, Di, 0.0f, a->d_q_idx + p * Hi * Di, Di);
  if (dk) dsv4_gemm_tn(n, Di, Hi, 1.0f, s->SI, n, a->q_idx + p * Hi * Di, Di, 0.0f, dk, Di);
  return loss;
}

/* d_k_idx rows are sums over queries: exact sums (util/xrows.h), one copy that the threads add into
 * under row locks (or the caller's, dsv4_indexer_kl_loss_into), so they do not depend on the thread
 * count. */
dsv4_status dsv4_indexer_kl_loss(const dsv4_kl_args *a) { return dsv4_indexer_kl_loss_into(a, NULL); }

dsv4_status dsv4_indexer_kl_loss_into(const dsv4_kl_args *a, dsv4_xrows *x_k) {
  dsv4_status rc = DSV4_OK;
  double *terms = NULL;
  dsv4_xrows xk = {0};
  dsv4_workspace ws = {0};
  DSV4_TRY(dsv4_kl_check(a));
  const int Hi = a->Hi, Di = a->Di;
  int64_t nmax = 1;
  for (int64_t p = 0; p < a->S1; p++) {
    int64_t n = a->dense ? a->vis_count[p] : a->topk;
    nmax = n > nmax ? n : nmax;
  }
  int nt = dsv4_team(a->threads);
  DSV4_ALLOC(terms, a->S1 + 1);
  if (a->d_k_idx && x_k) {
    DSV4_CHECK(x_k->r0 == 0 && x_k->rows >= a->C && x_k->w == Di, DSV4_ERR_ARG,
               "indexer_kl_loss: k_idx gradient sums of %lld rows of %lld", (long long)x_k->rows,
               (long long)x_k->w);
    xk = *x_k;
    nt = nt < xk.nt ? nt : xk.nt;
  } else if (a->d_k_idx) {
    DSV4_TRY(dsv4_xrows_alloc_locked(&xk, 0, a->C, Di, nt, "indexer_kl_loss"));
  }
  kl_scratch sc;
  const int G = kl_group(a, nmax);
  DSV4_TRY(dsv4_ws_alloc(&ws, kl_carve(NULL, a, nmax, G, &sc), nt, "indexer_kl_loss"));
  int64_t valid = 0;
  int bad = 0;
#pragma omp parallel num_threads(nt) reduction(+ : valid) reduction(| : bad) private(sc)
  {
    dsv4_blas_serial();
    kl_carve(dsv4_ws_thread(&ws), a, nmax, G, &sc);
    if (a->d_k_idx) dsv4_xrows_group_clear(&sc.grp, a->C);
#pragma omp for schedule(dynamic, 1)
    for (int64_t p0 = 0; p0 < a->S1; p0 += G) {
      for (int64_t p = p0; p < p0 + G && p < a->S1; p++) {
        terms[p] = 0;
        sc.rows = sc.rows_g + (int64_t)sc.grp.nl * nmax;
        const int n = dsv4_kl_rows(a, p, sc.rows);
        if (n == 0) {
          if (a->d_q_idx) memset(a->d_q_idx + p * Hi * Di, 0, sizeof(float) * Hi * Di);
          if (a->d_weights) memset(a->d_weights + p * Hi, 0, sizeof(float) * Hi);
          continue;
        }
        valid++;
        float *dk = a->d_k_idx ? sc.dKg + (int64_t)sc.grp.nl * nmax * Di : NULL;
        terms[p] = one_query(a, p, n, &sc, dk);
        if (dk) dsv4_xrows_group_push(&sc.grp, sc.rows, n, dk);
      }
      if (a->d_k_idx) bad |= dsv4_xrows_add_group(&xk, &sc.grp);
    }
  }
  DSV4_CHECK(!(x_k && bad), DSV4_ERR_ARG,
             "indexer_kl_loss: a k_idx gradient term is not finite or not below 2^24 "
             "(the exact sums' range)");
  xk.bad = bad;
  if (a->d_k_idx && !x_k) DSV4_TRY(dsv4_xrows_finish(&xk, a->d_k_idx, "indexer_kl_loss"));
  double total = 0;
  for (int64_t p = 0; p < a->S1; p++) total += terms[p];
  if (a->loss_rows) memcpy(a->loss_rows, terms, sizeof(double) * (size_t)a->S1);
  *a->loss_sum = total;
  *a->n_valid = valid;
fail:
  dsv4_ws_free(&ws);
  free(terms);
  dsv4_xrows_free(&xk); /* a view (x_k) is left to its owner */
  return rc;
}
