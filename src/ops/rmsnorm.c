/* rmsnorm.c: RMSNorm forward/backward on one row. */
#include "rmsnorm.h"

#include <math.h>
#include <stddef.h>

#include "util/reduce.h"

float dsv4_rms_inv(const float *v, int n, double eps) {
  return (float)(1.0 / sqrt(dsv4_dot_d(v, NULL, n) / n + eps));
}

float dsv4_rmsnorm_row(float *y, const float *v, const float *w, int n, double eps) {
  const float s = dsv4_rms_inv(v, n, eps);
  if (w)
    for (int i = 0; i < n; i++) y[i] = v[i] * s * w[i];
  else
    for (int i = 0; i < n; i++) y[i] = v[i] * s;
  return s;
}

void dsv4_rmsnorm_bwd_row(float *dv, float *dw, const float *dy, const float *v, const float *w,
                          float s, int n) {
  double gv = 0;
  if (w)
    for (int i = 0; i < n; i++) gv += (double)(dy[i] * w[i]) * v[i];
  else
    gv = dsv4_dot_d(dy, v, n);
  if (dw)
    for (int i = 0; i < n; i++) dw[i] += dy[i] * v[i] * s;
  const float k = (float)((double)s * s * s * gv / n);
  for (int i = 0; i < n; i++) dv[i] = s * (w ? dy[i] * w[i] : dy[i]) - k * v[i];
}
