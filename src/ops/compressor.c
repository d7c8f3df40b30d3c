/* compressor.c: fast compressor pooling (forward and backward). The projections are the caller's
 * BLAS work (2 r c D d FLOPs per slot); what remains here is O(r c D) per slot, so the fast
 * version parallelises over slots and keeps the channel loops contiguous for vectorisation. */
#include "compressor.h"

#include <math.h>
#include <string.h>

#include "rmsnorm.h"
#include "util/err.h"
#include "util/par.h"
#include "util/workspace.h"
#include "util/xrows.h"

#define MAX_ROWS (2 * 128)

/* The rows of one slot, as (row index, ape row t, channel offset). */
typedef struct {
  int n;
  int32_t row[MAX_ROWS], t[MAX_ROWS], off[MAX_ROWS];
} slot_rows;

/* Per-thread scratch: the slot's rows and per-channel m, den, pooled, d pooled, and the backward's
 * per-slot terms of d norm_w and of one d ape row ([D] each). */
typedef struct {
  slot_rows *sr;
  float *m, *den, *pooled, *dp, *dn, *da;
} pool_scratch;

static size_t pool_carve(char *base, int D, pool_scratch *s) {
  dsv4_carver c = {base, 0};
  s->sr = dsv4_carve(&c, sizeof(slot_rows));
  s->m = dsv4_carve(&c, sizeof(float) * (size_t)D);
  s->den = dsv4_carve(&c, sizeof(float) * (size_t)D);
  s->pooled = dsv4_carve(&c, sizeof(float) * (size_t)D);
  s->dp = dsv4_carve(&c, sizeof(float) * (size_t)D);
  s->dn = dsv4_carve(&c, sizeof(float) * (size_t)D);
  s->da = dsv4_carve(&c, sizeof(float) * (size_t)D);
  return c.used;
}

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

/* Logit of row i of a slot at channel e: Z plus the positional bias (none in V4.1). */
static inline float logit(const dsv4_compress_args *a, const float *z, const float *ap, int e) {
  return a->ape ? z[e] + ap[e] : z[e];
}

/* Per channel e: m = max logit, den = sum exp(logit - m), pooled = sum exp(..) C / den. Without a
 * gate (r == 1) the slot is its one row: pooled = C, den = 1. */
static void pool_slot(const dsv4_compress_args *a, const slot_rows *sr, float *pooled, float *m,
                      float *den) {
  const int D = a->D, cD = (a->ratio == 4 ? 2 : 1) * D;
  if (!a->Z) {
    memcpy(pooled, a->C + (int64_t)sr->row[0] * cD + sr->off[0], sizeof(float) * D);
    for (int e = 0; e < D; e++) m[e] = 0, den[e] = 1;
    return;
  }
  for (int e = 0; e < D; e++) m[e] = -INFINITY;
  for (int i = 0; i < sr->n; i++) {
    const float *z = a->Z + (int64_t)sr->row[i] * cD + sr->off[i];
    const float *ap = a->ape ? a->ape + (int64_t)sr->t[i] * cD + sr->off[i] : NULL;
    for (int e = 0; e < D; e++) m[e] = fmaxf(m[e], logit(a, z, ap, e));
  }
  memset(den, 0, sizeof(float) * D);
  memset(pooled, 0, sizeof(float) * D);
  for (int i = 0; i < sr->n; i++) {
    const float *z = a->Z + (int64_t)sr->row[i] * cD + sr->off[i];
    const float *ap = a->ape ? a->ape + (int64_t)sr->t[i] * cD + sr->off[i] : NULL;
    const float *c = a->C + (int64_t)sr->row[i] * cD + sr->off[i];
    for (int e = 0; e < D; e++) {
      float w = expf(logit(a, z, ap, e) - m[e]);
      den[e] += w;
      pooled[e] += w * c[e];
    }
  }
  for (int e = 0; e < D; e++) pooled[e] /= den[e];
}

/* Every pointer and row index of a compressor call, before any kernel reads them (shared by the
 * fast and the naive path). */
dsv4_status dsv4_compress_check(const dsv4_compress_args *a) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(a && a->C && a->norm_w && a->cur_row && a->pos && a->rope, DSV4_ERR_ARG,
             "compressor: a required pointer is NULL");
  DSV4_CHECK(a->ratio == 1 || a->ratio == 2 || a->ratio == 4 || a->ratio == 128, DSV4_ERR_ARG,
             "compressor: ratio %d (expected 1, 2, 4 or 128)", a->ratio);
  DSV4_CHECK(a->Z || a->ratio == 1, DSV4_ERR_ARG, "compressor: Z (the gate logits) is NULL at ratio %d", a->ratio);
  DSV4_CHECK(a->ape || a->ratio <= 2, DSV4_ERR_ARG, "compressor: ape is NULL at ratio %d", a->ratio);
  for (int64_t s = 0; s < a->n_slots; s++) {
    DSV4_CHECK(a->cur_row[s] >= 0 && a->cur_row[s] + a->ratio <= a->rows, DSV4_ERR_ARG,
               "compressor: cur_row[%lld] = %d: window outside C/Z rows [0, %lld)", (long long)s, a->cur_row[s],
               (long long)a->rows);
    if (a->ratio == 4 && a->prev_row)
      DSV4_CHECK(a->prev_row[s] >= -1 && a->prev_row[s] + 4 <= a->rows, DSV4_ERR_ARG,
                 "compressor: prev_row[%lld] = %d: window outside C/Z rows [0, %lld)", (long long)s,
                 a->prev_row[s], (long long)a->rows);
    const int64_t o = dsv4_compress_out_row(a, s);
    DSV4_CHECK(o >= 0 && o < (a->out_row ? a->rows_out : a->n_slots), DSV4_ERR_ARG,
               "compressor: out_row[%lld] = %lld outside out rows [0, %lld)", (long long)s, (long long)o,
               (long long)(a->out_row ? a->rows_out : a->n_slots));
  }
fail:
  return rc;
}

dsv4_status dsv4_compress(const dsv4_compress_args *a) {
  dsv4_status rc = DSV4_OK;
  dsv4_workspace ws = {0};
  const int D = a->D;
  DSV4_TRY(dsv4_compress_check(a));
  DSV4_CHECK(a->out, DSV4_ERR_ARG, "compressor: out is NULL");
  const int nt = dsv4_nthreads();
  pool_scratch sc;
  DSV4_TRY(dsv4_ws_alloc(&ws, pool_carve(NULL, D, &sc), nt, "compressor"));
#pragma omp parallel num_threads(nt) private(sc)
  {
    dsv4_blas_serial();
    pool_carve(dsv4_ws_thread(&ws), D, &sc);
#pragma omp for schedule(static)
    for (int64_t s = 0; s < a->n_slots; s++) {
      float *out = a->out + dsv4_compress_out_row(a, s) * D;
      rows_of(a, s, sc.sr);
      pool_slot(a, sc.sr, sc.pooled, sc.m, sc.den);
      dsv4_rmsnorm_row(out, sc.pooled, a->norm_w, D, a->eps);
      if (a->latent) memcpy(a->latent + dsv4_compress_out_row(a, s) * D, out, sizeof(float) * D);
      dsv4_rope_apply(a->rope, out, D, a->pos[s], 0);
    }
  }
fail:
  dsv4_ws_free(&ws);
  return rc;
}

/* Backward of one slot, recomputing the forward pooling:
 *   dp = RMSNorm backward of RoPE^T(d_out)  (gives d pooled, and d norm_w);
 *   pooled[e] = sum_i a_i v_i, a = softmax(l):  dv_i = a_i dp[e],  dl_i = a_i dp[e] (v_i - pooled[e]);
 *   dl_i goes to both Z[row] and ape[t] (logit = Z + ape).
 * dC and dZ rows belong to one slot each (a row shared by two slots of the overlapping r = 4
 * compressor is split by channel offset), so plain adds are exact there. d ape and d norm_w are sums
 * over slots, which the threads share out: exact per-thread accumulators (util/xrows.h), so they
 * do not depend on the thread count. */
dsv4_status dsv4_compress_bwd(const dsv4_compress_bwd_args *b) {
  dsv4_status rc = DSV4_OK;
  const dsv4_compress_args *a = &b->fwd;
  const int D = a->D, r = a->ratio, cD = (r == 4 ? 2 : 1) * D;
  dsv4_xrows xa = {0}, xn = {0};
  dsv4_workspace ws = {0};
  DSV4_TRY(dsv4_compress_check(a));
  DSV4_CHECK(b->dC && (b->dZ || !a->Z) && (b->d_ape || !a->ape) && b->d_norm_w && b->d_out, DSV4_ERR_ARG,
             "compressor backward: a gradient pointer is NULL");
  const int nt = dsv4_nthreads();
  /* d ape [r, cD] as r cD / D rows of D: row t cD / D + off / D */
  DSV4_TRY(dsv4_xrows_alloc(&xa, 0, a->ape ? (int64_t)r * cD / D : 0, D, nt, "compressor backward"));
  DSV4_TRY(dsv4_xrows_alloc(&xn, 0, 1, D, nt, "compressor backward"));
  pool_scratch sc;
  DSV4_TRY(dsv4_ws_alloc(&ws, pool_carve(NULL, D, &sc), nt, "compressor backward"));
  int bad = 0;
#pragma omp parallel num_threads(nt) private(sc) reduction(| : bad)
  {
    dsv4_blas_serial();
    pool_carve(dsv4_ws_thread(&ws), D, &sc);
    float *m = sc.m, *den = sc.den, *pooled = sc.pooled, *dp = sc.dp, *dn = sc.dn, *da = sc.da;
    slot_rows *sr = sc.sr;
#pragma omp for schedule(static)
    for (int64_t s = 0; s < a->n_slots; s++) {
      rows_of(a, s, sr);
      pool_slot(a, sr, pooled, m, den);
      memcpy(dp, b->d_out + dsv4_compress_out_row(a, s) * D, sizeof(float) * D);
      dsv4_rope_apply(a->rope, dp, D, a->pos[s], 1);
      memset(dn, 0, sizeof(float) * D);
      dsv4_rmsnorm_bwd_row(dp, dn, dp, pooled, a->norm_w, dsv4_rms_inv(pooled, D, a->eps), D);
      bad |= dsv4_xrows_add(&xn, 0, dn, 1);
      if (!a->Z) { /* the slot is its row: dC = d pooled */
        float *dC = b->dC + (int64_t)sr->row[0] * cD + sr->off[0];
        for (int e = 0; e < D; e++) dC[e] += dp[e];
        continue;
      }
      for (int i = 0; i < sr->n; i++) {
        const int64_t o = (int64_t)sr->row[i] * cD + sr->off[i];
        const int64_t oa = (int64_t)sr->t[i] * cD + sr->off[i];
        const float *z = a->Z + o, *c = a->C + o, *ap = a->ape ? a->ape + oa : NULL;
        float *dC = b->dC + o, *dZ = b->dZ + o;
        for (int e = 0; e < D; e++) {
          float w = expf(logit(a, z, ap, e) - m[e]) / den[e];
          float dv = w * dp[e];
          float dl = dv * (c[e] - pooled[e]);
          dC[e] += dv;
          dZ[e] += dl;
          da[e] = dl;
        }
        if (a->ape) bad |= dsv4_xrows_add(&xa, oa / D, da, 1);
      }
    }
  }
  xa.bad = xn.bad = bad;
  if (a->ape) DSV4_TRY(dsv4_xrows_finish(&xa, b->d_ape, "compressor backward"));
  DSV4_TRY(dsv4_xrows_finish(&xn, b->d_norm_w, "compressor backward"));
fail:
  dsv4_ws_free(&ws);
  dsv4_xrows_free(&xa);
  dsv4_xrows_free(&xn);
  return rc;
}
