/* indexer_ref.c: naive reference of the lightning indexer (SPEC 3 step 5): every score as a
 * double sum straight from the formula, then a full insertion sort under the contract's order. */
#include "attn_common.h"
#include "topk.h"
#include "util/err.h"

/* I[p, row] = sum_h w[p,h] ReLU(q_idx[p,h] . k_idx[row]) in double. */
static double index_score(const dsv4_indexer_args *a, int64_t p, int64_t row) {
  double s = 0;
  for (int h = 0; h < a->Hi; h++) {
    const float *q = a->q_idx + (p * a->Hi + h) * a->Di, *k = a->k_idx + row * a->Di;
    double d = 0;
    for (int e = 0; e < a->Di; e++) d += (double)q[e] * k[e];
    s += a->weights[p * a->Hi + h] * (d > 0 ? d : 0);
  }
  return s;
}

/* V4.1's candidate blocks of query p (docs/spec.md section 10 step 5), from its scores: the max
 * per block, the newest visible block pinned, the n_cand best by insertion sort. */
static void candidates(const dsv4_indexer_args *a, int64_t p, const float *score, int64_t n, dsv4_scored *bv) {
  const int64_t nb = (n + a->block - 1) / a->block;
  for (int64_t b = 0; b < nb; b++) {
    float m = -INFINITY;
    for (int64_t j = b * a->block; j < n && j < (b + 1) * a->block; j++) m = fmaxf(m, score[j]);
    dsv4_scored s = {b == nb - 1 ? INFINITY : m, (int32_t)b};
    int64_t i = b;
    while (i > 0 && dsv4_scored_before(s, bv[i - 1])) { bv[i] = bv[i - 1]; i--; }
    bv[i] = s;
  }
  for (int c = 0; c < a->n_cand; c++) a->cand_out[p * a->n_cand + c] = c < nb ? bv[c].id : -1;
}

/* 1 when visible row j of query p is inside one of its cand_in blocks (always without them). */
static int eligible(const dsv4_indexer_args *a, int64_t p, int64_t j) {
  if (!a->cand_in) return 1;
  for (int c = 0; c < a->n_cand; c++)
    if (a->cand_in[p * a->n_cand + c] >= 0 && a->cand_in[p * a->n_cand + c] == j / a->block) return 1;
  return 0;
}

dsv4_status dsv4_lightning_indexer_ref(const dsv4_indexer_args *a) {
  dsv4_status rc = DSV4_OK;
  dsv4_scored *v = NULL, *bv = NULL;
  float *score = NULL;
  DSV4_TRY(dsv4_indexer_check(a));
  DSV4_ALLOC(v, a->C + 1);
  DSV4_ALLOC(bv, a->C + 1);
  DSV4_ALLOC(score, a->C + 1);
  for (int64_t p = 0; p < a->S1; p++) {
    const int64_t n = a->vis_count[p];
    for (int64_t j = 0; j < n; j++) score[j] = (float)index_score(a, p, a->vis_begin[p] + j);
    if (a->cand_out) candidates(a, p, score, n, bv);
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++) {
      if (!eligible(a, p, j)) continue; /* outside the candidates: -inf, never selected */
      dsv4_scored s = {score[j], (int32_t)(a->vis_begin[p] + j)};
      int64_t i = m++; /* insertion sort: obviously ordered, quadratic is fine for a reference */
      while (i > 0 && dsv4_scored_before(s, v[i - 1])) { v[i] = v[i - 1]; i--; }
      v[i] = s;
    }
    for (int j = 0; j < a->topk; j++) {
      a->topk_ids[p * a->topk + j] = j < m ? v[j].id : -1;
      if (a->topk_scores) a->topk_scores[p * a->topk + j] = j < m ? v[j].score : -INFINITY;
    }
  }
fail:
  free(v);
  free(bv);
  free(score);
  return rc;
}
