/* sparse_attn_ref.c: naive reference of sparse_attn_sharedkv, forward and backward, written straight
 * from SPEC 3 steps 6-7: one (query, head) at a time, every sum in double, keys in the order
 * window then compressed. */
#include "attn_common.h"
#include "util/err.h"

/* Key rows of query p: pointers into ori_kv (window) then cmp_kv; grads the matching gradient rows. */
static int key_list(const dsv4_attn_args *a, int64_t p, int32_t *rows, const float **keys,
                    float *d_ori, float *d_cmp, float **grads) {
  int n = 0;
  for (int j = 0; j < a->win_len[p]; j++) {
    const int64_t row = a->win_start[p] + j;
    keys[n] = a->ori_kv + row * a->D;
    if (grads) grads[n] = d_ori + row * a->D;
    n++;
  }
  const int nc = dsv4_attn_cmp_rows(a, p, rows);
  for (int j = 0; j < nc; j++) {
    keys[n] = a->cmp_kv + (int64_t)rows[j] * a->D;
    if (grads) grads[n] = d_cmp ? d_cmp + (int64_t)rows[j] * a->D : NULL;
    n++;
  }
  return n;
}

static double dot(const float *x, const float *y, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += (double)x[i] * y[i];
  return s;
}

/* The KL teacher of query p over its nc compressed keys, in double (see dsv4_attn_args.teacher);
 * z: scratch [2 nc]. Padding queries get zeros. */
static void teacher_ref(const dsv4_attn_args *a, int64_t p, const float **keys, int nc, double *z) {
  double *t = z + nc;
  for (int j = 0; j < nc; j++) t[j] = 0;
  for (int h = 0; h < a->H && a->win_len[p] > 0; h++) {
    double m = -INFINITY, sum = 0;
    for (int j = 0; j < nc; j++) {
      z[j] = a->scale * dot(a->q + (p * a->H + h) * a->D, keys[j], a->D);
      m = fmax(m, z[j]);
    }
    for (int j = 0; j < nc; j++) sum += exp(z[j] - m);
    for (int j = 0; j < nc; j++) t[j] += exp(z[j] - m) / sum;
  }
  double tsum = 0;
  for (int j = 0; j < nc; j++) tsum += t[j];
  for (int c = 0, j = 0; c < a->n_cmp_ids; c++)
    a->teacher[p * a->n_cmp_ids + c] = a->cmp_ids[p * a->n_cmp_ids + c] >= 0 && tsum > 0 ? (float)(t[j++] / tsum) : 0.0f;
}

dsv4_status dsv4_sparse_attn_ref(const dsv4_attn_args *a) {
  dsv4_status rc = DSV4_OK;
  int32_t *rows = NULL;
  const float **keys = NULL;
  double *z = NULL, *acc = NULL;
  DSV4_TRY(dsv4_attn_check(a));
  const int64_t maxk = a->R + dsv4_attn_max_cmp(a) + 1;
  const int H = a->H, D = a->D;
  DSV4_ALLOC(rows, maxk);
  DSV4_ALLOC(keys, maxk);
  DSV4_ALLOC(z, 2 * maxk);
  DSV4_ALLOC(acc, D);
  for (int64_t p = 0; p < a->S1; p++) {
    const int n = key_list(a, p, rows, keys, NULL, NULL, NULL);
    if (a->teacher && a->cmp_ids) teacher_ref(a, p, keys + a->win_len[p], n - a->win_len[p], z);
    for (int h = 0; h < H; h++) {
      const float *q = a->q + (p * H + h) * D;
      float *o = a->out + (p * H + h) * D;
      if (a->win_len[p] == 0) { /* padding query */
        memset(o, 0, sizeof(float) * D);
        a->lse[p * H + h] = 0;
        continue;
      }
      double m = a->sink[h];
      for (int j = 0; j < n; j++) {
        z[j] = a->scale * dot(q, keys[j], D);
        m = fmax(m, z[j]);
      }
      double den = exp(a->sink[h] - m);
      for (int e = 0; e < D; e++) acc[e] = 0;
      for (int j = 0; j < n; j++) {
        double w = exp(z[j] - m);
        den += w;
        for (int e = 0; e < D; e++) acc[e] += w * keys[j][e];
      }
      for (int e = 0; e < D; e++) o[e] = (float)(acc[e] / den);
      a->lse[p * H + h] = (float)(m + log(den));
    }
  }
fail:
  free(rows);
  free(keys);
  free(z);
  free(acc);
  return rc;
}

/* Per (query, head), with P_j = exp(z_j - lse), dP_j = dO . k_j, delta = dO . O:
 *   dz_j = P_j (dP_j - delta);  dq = scale sum_j dz_j k_j;
 *   dk_j += scale dz_j q + P_j dO  (key and value are the same vector);
 *   d sink = -P_sink delta  with P_sink = exp(sink - lse)  (the sink's logit has no value). */
dsv4_status dsv4_sparse_attn_bwd_ref(const dsv4_attn_bwd_args *b) {
  dsv4_status rc = DSV4_OK;
  const dsv4_attn_args *a = &b->fwd;
  int32_t *rows = NULL;
  const float **keys = NULL;
  float **grads = NULL;
  double *dq = NULL;
  DSV4_TRY(dsv4_attn_bwd_check(b));
  const int64_t maxk = a->R + dsv4_attn_max_cmp(a) + 1;
  const int H = a->H, D = a->D;
  DSV4_ALLOC(rows, maxk);
  DSV4_ALLOC(keys, maxk);
  DSV4_ALLOC(grads, maxk);
  DSV4_ALLOC(dq, D);
  for (int64_t p = 0; p < a->S1; p++) {
    const int n = key_list(a, p, rows, keys, b->d_ori_kv, b->d_cmp_kv, grads);
    for (int h = 0; h < H; h++) {
      const int64_t ph = p * H + h;
      const float *q = a->q + ph * D, *dO = b->dout + ph * D, *O = b->out + ph * D;
      float *dqo = b->dq + ph * D;
      if (a->win_len[p] == 0) {
        memset(dqo, 0, sizeof(float) * D);
        continue;
      }
      const double lse = b->lse[ph], delta = dot(dO, O, D);
      for (int e = 0; e < D; e++) dq[e] = 0;
      for (int j = 0; j < n; j++) {
        double P = exp(a->scale * dot(q, keys[j], D) - lse);
        double dz = P * (dot(dO, keys[j], D) - delta);
        for (int e = 0; e < D; e++) {
          dq[e] += a->scale * dz * keys[j][e];
          grads[j][e] += (float)(a->scale * dz * q[e] + P * dO[e]);
        }
      }
      for (int e = 0; e < D; e++) dqo[e] = (float)dq[e];
      b->d_sink[h] += (float)(-exp(a->sink[h] - lse) * delta);
    }
  }
fail:
  free(rows);
  free(keys);
  free(grads);
  free(dq);
  return rc;
}
