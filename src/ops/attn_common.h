/* attn_common.h: pieces shared by the sparse attention, indexer and KL kernels: argument checks,
 * the key list of a query, and a vectorisable exp.
 *
 * Determinism: everything here is plain IEEE arithmetic with a fixed order per element. The build
 * uses -ffp-contract=off so that a loop's vector body and scalar remainder give the same bits, and
 * a value never depends on which lane computed it. */
#ifndef DSV4_ATTN_COMMON_H
#define DSV4_ATTN_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "dsv4cp_ops.h"
#include "util/reduce.h"

/* exp(x) for x <= 0 (callers subtract a maximum first), relative error below 1e-7.
 * x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite split of ln2), exp(r) by its degree-7 Taylor
 * polynomial (truncation error r^8 / 8! < 6e-9), times 2^n built in the exponent bits.
 * n = round(x log2 e) by adding and subtracting 1.5 * 2^23 (exact round-to-nearest for |t| < 2^22,
 * and, unlike floorf, vectorised without -fno-trapping-math: this loop is the softmax's hot spot).
 * Inputs below -87 are clamped (the result, ~1.6e-38, is negligible next to the maximum's 1). */
static inline float dsv4_exp_neg(float x) {
  const float LOG2E = 1.44269504088896341f, LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
  const float ROUND = 12582912.0f; /* 1.5 * 2^23 */
  x = x < -87.0f ? -87.0f : x;
  float n = (x * LOG2E + ROUND) - ROUND;
  float r = x - n * LN2_HI - n * LN2_LO;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  union { int32_t i; float f; } sc = {.i = ((int32_t)n + 127) << 23};
  return p * sc.f;
}

/* x[j] = exp(x[j] - m), j < n: a separate function so the compiler sees one simple loop over a
 * restrict pointer and vectorises it (inside the attention loops it did not). */
static inline void dsv4_exp_shift(float *restrict x, int64_t n, float m) {
  for (int64_t j = 0; j < n; j++) x[j] = dsv4_exp_neg(x[j] - m);
}

/* y[j] = exp(x[j] - m), j < n. */
static inline void dsv4_exp_shift_to(float *restrict y, const float *restrict x, int64_t n, float m) {
  for (int64_t j = 0; j < n; j++) y[j] = dsv4_exp_neg(x[j] - m);
}

/* The KL teacher of one query from its scaled compressed logits Z [H, n]: per-head softmax over the
 * n rows, summed over heads in order, L1-normalised (SPEC 3, "Indexer KL loss"). e: scratch [n].
 * One routine for the attention (which has the logits anyway) and the KL operator, so both give
 * the same bits. */
static inline void dsv4_kl_teacher(const float *Z, int H, int n, float *t, float *e) {
  for (int j = 0; j < n; j++) t[j] = 0;
  for (int h = 0; h < H; h++) {
    const float *z = Z + (int64_t)h * n;
    const float m = dsv4_max(z, n);
    dsv4_exp_shift_to(e, z, n, m);
    const float inv = 1.0f / dsv4_sum(e, n);
    for (int j = 0; j < n; j++) t[j] += e[j] * inv;
  }
  const float tsum = dsv4_sum(t, n);
  for (int j = 0; j < n; j++) t[j] /= tsum;
}

/* Number of compressed keys of query p and, when ids are given, the compacted list of rows. */
static inline int dsv4_attn_cmp_rows(const dsv4_attn_args *a, int64_t p, int32_t *rows) {
  if (!a->cmp_kv) return 0;
  if (a->cmp_ids) {
    int n = 0;
    const int32_t *ids = a->cmp_ids + p * a->n_cmp_ids;
    for (int j = 0; j < a->n_cmp_ids; j++)
      if (ids[j] >= 0) rows[n++] = ids[j];
    return n;
  }
  if (!a->cmp_count) return 0;
  for (int j = 0; j < a->cmp_count[p]; j++) rows[j] = a->cmp_begin[p] + j;
  return a->cmp_count[p];
}

/* Rows of query p's KL set J_p: its selected ids (sparse) or visible range (dense); returns |J_p|. */
static inline int dsv4_kl_rows(const dsv4_kl_args *a, int64_t p, int32_t *rows) {
  int n = 0;
  if (a->dense) {
    for (int j = 0; j < a->vis_count[p]; j++) rows[n++] = a->vis_begin[p] + j;
  } else {
    for (int j = 0; j < a->topk; j++)
      if (a->topk_ids[p * a->topk + j] >= 0) rows[n++] = a->topk_ids[p * a->topk + j];
  }
  return n;
}

/* Largest number of compressed keys any query can have (scratch sizing). */
static inline int64_t dsv4_attn_max_cmp(const dsv4_attn_args *a) {
  if (!a->cmp_kv) return 0;
  if (a->cmp_ids) return a->n_cmp_ids;
  int64_t m = 0;
  if (a->cmp_count)
    for (int64_t p = 0; p < a->S1; p++) m = a->cmp_count[p] > m ? a->cmp_count[p] : m;
  return m;
}

/* The indexer's selection of query p from its scores of its n visible rows (indexer.c): V4.1's
 * candidate blocks (cand_out), then the top-k, inside cand_in's blocks when given. v: scratch [n],
 * bv: scratch [n / block + 2]. One routine for the fast kernel and the reference. */
#include "topk.h"
void dsv4_indexer_select(const dsv4_indexer_args *a, int64_t p, const float *score, int64_t n, dsv4_scored *v,
                         dsv4_scored *bv);

/* Validates shapes, window ranges and compressed rows; errors name the argument. */
dsv4_status dsv4_attn_check(const dsv4_attn_args *a);
dsv4_status dsv4_attn_bwd_check(const dsv4_attn_bwd_args *b);
/* The same, where the caller keeps the key gradients as exact sums (sums_ori, sums_cmp: the
 * d_ori_kv / d_cmp_kv floats are not written and may be NULL). */
dsv4_status dsv4_attn_bwd_check_sums(const dsv4_attn_bwd_args *b, int sums_ori, int sums_cmp);
dsv4_status dsv4_indexer_check(const dsv4_indexer_args *a);
dsv4_status dsv4_kl_check(const dsv4_kl_args *a);

#endif
