/* kl_loss_ref.c: naive reference of the indexer KL loss and its gradients (SPEC 3, "Indexer KL
 * loss"), one query at a time in double, straight from the formulas. */
#include "attn_common.h"
#include "util/err.h"

static double dotf(const float *x, const float *y, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += (double)x[i] * y[i];
  return s;
}

dsv4_status dsv4_indexer_kl_loss_ref(const dsv4_kl_args *a) {
  dsv4_status rc = DSV4_OK;
  int32_t *rows = NULL;
  double *t = NULL, *I = NULL, *z = NULL;
  DSV4_TRY(dsv4_kl_check(a));
  const int64_t nmax = (a->dense ? a->C : a->topk) + 1;
  const int H = a->H, D = a->D, Hi = a->Hi, Di = a->Di;
  DSV4_ALLOC(rows, nmax);
  DSV4_ALLOC(t, nmax);
  DSV4_ALLOC(I, nmax);
  DSV4_ALLOC(z, nmax);
  double total = 0;
  int64_t valid = 0;
  for (int64_t p = 0; p < a->S1; p++) {
    const int n = dsv4_kl_rows(a, p, rows);
    if (a->d_q_idx) memset(a->d_q_idx + p * Hi * Di, 0, sizeof(float) * Hi * Di);
    if (a->d_weights) memset(a->d_weights + p * Hi, 0, sizeof(float) * Hi);
    if (a->loss_rows) a->loss_rows[p] = 0;
    if (n == 0) continue;
    valid++;
    /* teacher: per-head softmax over J of scale q.cmp, summed over heads, L1-normalised (or the
     * caller's, sparse mode) */
    for (int j = 0; j < n; j++) t[j] = 0;
    for (int h = 0; h < H && (a->dense || !a->teacher); h++) {
      double m = -INFINITY, sum = 0;
      for (int j = 0; j < n; j++) {
        z[j] = a->scale * dotf(a->q + (p * H + h) * D, a->cmp_kv + (int64_t)rows[j] * D, D);
        m = fmax(m, z[j]);
      }
      for (int j = 0; j < n; j++) sum += exp(z[j] - m);
      for (int j = 0; j < n; j++) t[j] += exp(z[j] - m) / sum;
    }
    if (!a->dense && a->teacher)
      for (int j = 0, c = 0; c < a->topk; c++)
        if (a->topk_ids[p * a->topk + c] >= 0) t[j++] = a->teacher[p * a->topk + c];
    double tsum = 0;
    for (int j = 0; j < n; j++) tsum += t[j];
    for (int j = 0; j < n; j++) t[j] /= tsum;
    /* student: softmax of the index scores over J */
    double m = -INFINITY, sum = 0;
    for (int j = 0; j < n; j++) {
      I[j] = 0;
      for (int h = 0; h < Hi; h++) {
        double d = dotf(a->q_idx + (p * Hi + h) * Di, a->k_idx + (int64_t)rows[j] * Di, Di);
        I[j] += a->weights[p * Hi + h] * (d > 0 ? d : 0);
      }
      m = fmax(m, I[j]);
    }
    if (!a->dense && a->scores) { /* the caller's scores replace the recomputed ones */
      m = -INFINITY;
      for (int j = 0, c = 0; c < a->topk; c++)
        if (a->topk_ids[p * a->topk + c] >= 0) {
          I[j] = a->scores[p * a->topk + c];
          m = fmax(m, I[j++]);
        }
    }
    for (int j = 0; j < n; j++) sum += exp(I[j] - m);
    const double lse = m + log(sum);
    double loss = 0;
    for (int j = 0; j < n; j++)
      if (t[j] > 0) loss += t[j] * (log(t[j]) - (I[j] - lse));
    total += loss;
    if (a->loss_rows) a->loss_rows[p] = loss;
    /* gradients of grad_scale * loss: dI_j = grad_scale (s_j - t_j), through ReLU and the weights */
    for (int j = 0; j < n; j++) {
      const double dI = a->grad_scale * (exp(I[j] - lse) - t[j]);
      for (int h = 0; h < Hi; h++) {
        const float *qi = a->q_idx + (p * Hi + h) * Di, *ki = a->k_idx + (int64_t)rows[j] * Di;
        const double d = dotf(qi, ki, Di);
        if (a->d_weights) a->d_weights[p * Hi + h] += (float)(dI * (d > 0 ? d : 0));
        if (d <= 0) continue;
        const double g = dI * a->weights[p * Hi + h];
        for (int e = 0; e < Di; e++) {
          if (a->d_q_idx) a->d_q_idx[(p * Hi + h) * Di + e] += (float)(g * ki[e]);
          if (a->d_k_idx) a->d_k_idx[(int64_t)rows[j] * Di + e] += (float)(g * qi[e]);
        }
      }
    }
  }
  *a->loss_sum = total;
  *a->n_valid = valid;
fail:
  free(rows);
  free(t);
  free(I);
  free(z);
  return rc;
}
