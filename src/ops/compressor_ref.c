/* compressor_ref.c: naive reference of the compressor, written straight from SPEC 3 step 3:
 * one channel at a time, softmax in double, no shared scratch, no parallelism. */
#include <math.h>
#include <string.h>

#include "compressor.h"
#include "rmsnorm.h"
#include "util/err.h"

/* Row i of slot s's pooling set: returns 0 when i is past the end. (row, t, channel offset). */
static int slot_row(const dsv4_compress_args *a, int64_t s, int i, int64_t *row, int *t, int *off) {
  const int r = a->ratio;
  const int has_prev = r == 4 && a->prev_row && a->prev_row[s] >= 0;
  if (has_prev && i < r) {
    *row = a->prev_row[s] + i; *t = i; *off = 0;
    return 1;
  }
  i -= has_prev ? r : 0;
  if (i >= r) return 0;
  *row = a->cur_row[s] + i; *t = i; *off = (r == 4) ? a->D : 0;
  return 1;
}

/* The logit of a pooled row: gate plus positional bias (none in V4.1; no gate at r = 1: 0). */
static double logit(const dsv4_compress_args *a, int64_t row, int t, int off, int e) {
  const int cD = (a->ratio == 4 ? 2 : 1) * a->D;
  const double z = a->Z ? a->Z[row * cD + off + e] : 0.0;
  return a->ape ? z + a->ape[(int64_t)t * cD + off + e] : z;
}

/* pooled[e] and the softmax weights' normaliser for channel e, in double. */
static void pool_channel(const dsv4_compress_args *a, int64_t s, int e, double *pooled, double *mx,
                         double *den) {
  const int cD = (a->ratio == 4 ? 2 : 1) * a->D;
  int64_t row; int t, off;
  double m = -INFINITY;
  for (int i = 0; slot_row(a, s, i, &row, &t, &off); i++) m = fmax(m, logit(a, row, t, off, e));
  double num = 0, sum = 0;
  for (int i = 0; slot_row(a, s, i, &row, &t, &off); i++) {
    double w = exp(logit(a, row, t, off, e) - m);
    sum += w;
    num += w * a->C[row * cD + off + e];
  }
  *pooled = num / sum;
  *mx = m;
  *den = sum;
}

dsv4_status dsv4_compress_ref(const dsv4_compress_args *a) {
  dsv4_status rc = DSV4_OK;
  float *pooled = NULL;
  const int D = a->D;
  DSV4_TRY(dsv4_compress_check(a));
  DSV4_CHECK(a->out, DSV4_ERR_ARG, "compressor: out is NULL");
  DSV4_ALLOC(pooled, D);
  for (int64_t s = 0; s < a->n_slots; s++) {
    for (int e = 0; e < D; e++) {
      double p, m, den;
      pool_channel(a, s, e, &p, &m, &den);
      pooled[e] = (float)p;
    }
    dsv4_rmsnorm_row(a->out + dsv4_compress_out_row(a, s) * D, pooled, a->norm_w, D, a->eps);
    if (a->latent) memcpy(a->latent + dsv4_compress_out_row(a, s) * D, a->out + dsv4_compress_out_row(a, s) * D,
                          sizeof(float) * D);
    dsv4_rope_apply(a->rope, a->out + dsv4_compress_out_row(a, s) * D, D, a->pos[s], 0);
  }
fail:
  free(pooled);
  return rc;
}

dsv4_status dsv4_compress_bwd_ref(const dsv4_compress_bwd_args *b) {
  dsv4_status rc = DSV4_OK;
  const dsv4_compress_args *a = &b->fwd;
  const int D = a->D, cD = (a->ratio == 4 ? 2 : 1) * D;
  float *pooled = NULL, *dp = NULL;
  DSV4_TRY(dsv4_compress_check(a));
  DSV4_ALLOC(pooled, D);
  DSV4_ALLOC(dp, D);
  for (int64_t s = 0; s < a->n_slots; s++) {
    for (int e = 0; e < D; e++) {
      double p, m, den;
      pool_channel(a, s, e, &p, &m, &den);
      pooled[e] = (float)p;
    }
    memcpy(dp, b->d_out + dsv4_compress_out_row(a, s) * D, sizeof(float) * D);
    dsv4_rope_apply(a->rope, dp, D, a->pos[s], 1);
    dsv4_rmsnorm_bwd_row(dp, b->d_norm_w, dp, pooled, a->norm_w, dsv4_rms_inv(pooled, D, a->eps), D);
    for (int e = 0; e < D; e++) {
      double p, m, den;
      pool_channel(a, s, e, &p, &m, &den);
      int64_t row; int t, off;
      for (int i = 0; slot_row(a, s, i, &row, &t, &off); i++) {
        const int64_t o = row * cD + off + e, oa = (int64_t)t * cD + off + e;
        double w = exp(logit(a, row, t, off, e) - m) / den;
        double dl = w * dp[e] * (a->C[o] - p);
        b->dC[o] += (float)(w * dp[e]);
        if (b->dZ) b->dZ[o] += (float)dl;
        if (b->d_ape) b->d_ape[oa] += (float)dl;
      }
    }
  }
fail:
  free(pooled);
  free(dp);
  return rc;
}
