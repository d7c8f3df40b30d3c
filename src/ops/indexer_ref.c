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

dsv4_status dsv4_lightning_indexer_ref(const dsv4_indexer_args *a) {
  dsv4_status rc = DSV4_OK;
  dsv4_scored *v = NULL;
  DSV4_TRY(dsv4_indexer_check(a));
  DSV4_ALLOC(v, a->C + 1);
  for (int64_t p = 0; p < a->S1; p++) {
    const int64_t n = a->vis_count[p];
    for (int64_t j = 0; j < n; j++) {
      dsv4_scored s = {(float)index_score(a, p, a->vis_begin[p] + j), (int32_t)(a->vis_begin[p] + j)};
      int64_t i = j; /* insertion sort: obviously ordered, quadratic is fine for a reference */
      while (i > 0 && dsv4_scored_before(s, v[i - 1])) { v[i] = v[i - 1]; i--; }
      v[i] = s;
    }
    for (int j = 0; j < a->topk; j++) {
      a->topk_ids[p * a->topk + j] = j < n ? v[j].id : -1;
      if (a->topk_scores) a->topk_scores[p * a->topk + j] = j < n ? v[j].score : -INFINITY;
    }
  }
fail:
  free(v);
  return rc;
}
