/* compressor.c: fast compressor pooling (forward and backward). The projections are the caller's
 * BLAS work (2 r c D d FLOPs per slot); what remains here is O(r c D) per slot, so the fast
 * version parallelises over slots and keeps the channel loops contiguous for vectorisation. */
#include "compressor.h"

#include <math.h>
#include <string.h>

#include "rmsnorm.h"
#include "util/err.h"
#include "util/par.h"

#define MAX_ROWS (2 * 128)

/* The rows of one slot, as (row index, ape row t, channel offset). */
typedef struct {
  int n;
  int32_t row[MAX_ROWS], t[MAX_ROWS], off[MAX_ROWS];
} slot_rows;

/* Rows of slot s in the fixed order the pooling sums them: previous window, then own window. */
static void rows_of(const dsv4_compress_args *a, int64_t s, slot_rows *sr) {
  const int r = a->ratio, D = a->D;
  sr->n = 0;
  if (r == 4 && a->prev_row && a->prev_row[s] >= 0)
    for (int t = 0; t < r; t++) {
      sr->row[sr->n] = a->prev_row[s] + t; sr->t[sr->n] = t; sr->off[sr->n] = 0; sr->n++;
    }
  for (int t = 0; t < r; t++) {
    sr->row[sr->n] = a->cur_row[s] + t; sr->t[sr->n] = t; sr->off[sr->n] = (r == 4) ? D : 0; sr->n++;
  }
}

/* Per channel e: m = max logit, den = sum exp(logit - m), pooled = sum exp(..) C / den. */
static void pool_slot(const dsv4_compress_args *a, const slot_rows *sr, float *pooled, float *m,
                      float *den) {
  const int D = a->D, cD = (a->ratio == 4 ? 2 : 1) * D;
  for (int e = 0; e < D; e++) m[e] = -INFINITY;
  for (int i = 0; i < sr->n; i++) {
    const float *z = a->Z + (int64_t)sr->row[i] * cD + sr->off[i];
    const float *ap = a->ape + (int64_t)sr->t[i] * cD + sr->off[i];
    for (int e = 0; e < D; e++) m[e] = fmaxf(m[e], z[e] + ap[e]);
  }
  memset(den, 0, sizeof(float) * D);
  memset(pooled, 0, sizeof(float) * D);
  for (int i = 0; i < sr->n; i++) {
    const float *z = a->Z + (int64_t)sr->row[i] * cD + sr->off[i];
    const float *ap = a->ape + (int64_t)sr->t[i] * cD + sr->off[i];
    const float *c = a->C + (int64_t)sr->row[i] * cD + sr->off[i];
    for (int e = 0; e < D; e++) {
      float w = expf(z[e] + ap[e] - m[e]);
      den[e] += w;
      pooled[e] += w * c[e];
    }
  }
  for (int e = 0; e < D; e++) pooled[e] /= den[e];
}

dsv4_status dsv4_compress(const dsv4_compress_args *a) {
  dsv4_status rc = DSV4_OK;
  const int D = a->D;
  DSV4_TRY(dsv4_compress_check(a));
  DSV4_CHECK(a->out, DSV4_ERR_ARG, "compressor: out is NULL");
  int failed = 0;
#pragma omp parallel
  {
    float *scr = malloc(sizeof(float) * 3 * (size_t)D);
    slot_rows *sr = malloc(sizeof *sr);
    if (!scr || !sr) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(static)
    for (int64_t s = 0; s < a->n_slots; s++) {
      if (!scr || !sr) continue;
      float *m = scr, *den = scr + D, *pooled = scr + 2 * D, *out = a->out + dsv4_compress_out_row(a, s) * D;
      rows_of(a, s, sr);
      pool_slot(a, sr, pooled, m, den);
      dsv4_rmsnorm_row(out, pooled, a->norm_w, D, a->eps);
      dsv4_rope_apply(a->rope, out, D, a->pos[s], 0);
    }
    free(scr);
    free(sr);
  }
  DSV4_CHECK(!failed, DSV4_ERR_NOMEM, "compressor: out of memory for scratch");
fail:
  return rc;
}

/* Backward of one slot, recomputing the forward pooling:
 *   dp = RMSNorm backward of RoPE^T(d_out)  (gives d pooled, and d norm_w);
 *   pooled[e] = sum_i a_i v_i, a = softmax(l):  dv_i = a_i dp[e],  dl_i = a_i dp[e] (v_i - pooled[e]);
 *   dl_i goes to both Z[row] and ape[t] (logit = Z + ape). */
dsv4_status dsv4_compress_bwd(const dsv4_compress_bwd_args *b) {
  dsv4_status rc = DSV4_OK;
  const dsv4_compress_args *a = &b->fwd;
  const int D = a->D, r = a->ratio, cD = (r == 4 ? 2 : 1) * D;
  const size_t n_ape = (size_t)r * cD;
  float *priv = NULL;
  DSV4_TRY(dsv4_compress_check(a));
  DSV4_CHECK(b->dC && b->dZ && b->d_ape && b->d_norm_w && b->d_out, DSV4_ERR_ARG, "compressor backward: a gradient pointer is NULL");
  const int nt = dsv4_nthreads();
  DSV4_ALLOC(priv, (size_t)nt * (n_ape + D));
  int failed = 0;
#pragma omp parallel num_threads(nt)
  {
    float *scr = malloc(sizeof(float) * 4 * (size_t)D);
    slot_rows *sr = malloc(sizeof *sr);
    float *dape = priv + (size_t)dsv4_thread_id() * (n_ape + D), *dnorm = dape + n_ape;
    if (!scr || !sr) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(static)
    for (int64_t s = 0; s < a->n_slots; s++) {
      if (!scr || !sr) continue;
      float *m = scr, *den = scr + D, *pooled = scr + 2 * D, *dp = scr + 3 * D;
      rows_of(a, s, sr);
      pool_slot(a, sr, pooled, m, den);
      memcpy(dp, b->d_out + dsv4_compress_out_row(a, s) * D, sizeof(float) * D);
      dsv4_rope_apply(a->rope, dp, D, a->pos[s], 1);
      dsv4_rmsnorm_bwd_row(dp, dnorm, dp, pooled, a->norm_w, dsv4_rms_inv(pooled, D, a->eps), D);
      for (int i = 0; i < sr->n; i++) {
        const int64_t o = (int64_t)sr->row[i] * cD + sr->off[i];
        const int64_t oa = (int64_t)sr->t[i] * cD + sr->off[i];
        const float *z = a->Z + o, *c = a->C + o, *ap = a->ape + oa;
        float *dC = b->dC + o, *dZ = b->dZ + o, *da = dape + oa;
        for (int e = 0; e < D; e++) {
          float w = expf(z[e] + ap[e] - m[e]) / den[e];
          float dv = w * dp[e];
          float dl = dv * (c[e] - pooled[e]);
          dC[e] += dv;
          dZ[e] += dl;
          da[e] += dl;
        }
      }
    }
    free(scr);
    free(sr);
  }
  DSV4_CHECK(!failed, DSV4_ERR_NOMEM, "compressor backward: out of memory for scratch");
  for (int t = 0; t < nt; t++) {
    const float *p = priv + (size_t)t * (n_ape + D);
    for (size_t i = 0; i < n_ape; i++) b->d_ape[i] += p[i];
    for (int e = 0; e < D; e++) b->d_norm_w[e] += p[n_ape + e];
  }
fail:
  free(priv);
  return rc;
}
