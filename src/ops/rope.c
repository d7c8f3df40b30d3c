/* rope.c: frequencies (with YaRN), the cos/sin table, and in-place rotation. */
#include "rope.h"

#include <math.h>
#include <string.h>

#include "util/err.h"

/* YaRN: the correction dimension for a number of rotations n over the original context L0. */
static double yarn_corr(double n, int R, double theta, double L0) {
  return R * log(L0 / (n * 2.0 * M_PI)) / (2.0 * log(theta));
}

dsv4_status dsv4_rope_init(dsv4_rope *r, const dsv4_config *cfg, int ratio) {
  dsv4_status rc = DSV4_OK;
  memset(r, 0, sizeof *r);
  r->R = cfg->rope_dim;
  const int half = r->R / 2;
  DSV4_ALLOC(r->freq, half);
  const double theta = ratio > 0 ? cfg->compress_rope_theta : cfg->rope_theta;
  for (int i = 0; i < half; i++) r->freq[i] = pow(theta, -2.0 * i / r->R);
  if (ratio > 0 && cfg->rope_orig_max_pos > 0) {
    double lo = fmax(floor(yarn_corr(cfg->beta_fast, r->R, theta, cfg->rope_orig_max_pos)), 0.0);
    double hi = fmin(ceil(yarn_corr(cfg->beta_slow, r->R, theta, cfg->rope_orig_max_pos)), r->R - 1.0);
    double span = (hi == lo) ? hi - lo + 0.001 : hi - lo;
    for (int i = 0; i < half; i++) {
      double ramp = fmin(fmax((i - lo) / span, 0.0), 1.0);
      double smooth = 1.0 - ramp;
      r->freq[i] = r->freq[i] / cfg->rope_factor * (1.0 - smooth) + r->freq[i] * smooth;
    }
  }
fail:
  return rc;
}

void dsv4_rope_free(dsv4_rope *r) {
  free(r->freq);
  free(r->cs);
  memset(r, 0, sizeof *r);
}

dsv4_status dsv4_rope_reserve(dsv4_rope *r, int64_t lo, int64_t hi) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(lo >= 0 && hi >= lo, DSV4_ERR_ARG, "rope: bad position range [%lld, %lld)", (long long)lo, (long long)hi);
  if (r->cs && lo >= r->lo && hi <= r->lo + r->cap) return DSV4_OK;
  if (r->cs && lo <= r->lo + r->cap && hi >= r->lo) { /* overlapping or adjacent: keep the union */
    lo = lo < r->lo ? lo : r->lo;
    hi = hi > r->lo + r->cap ? hi : r->lo + r->cap;
  }
  int64_t cap = 256;
  while (cap < hi - lo) cap *= 2;
  const int half = r->R / 2;
  float *cs = malloc(sizeof(float) * (size_t)(cap * half * 2));
  DSV4_CHECK(cs, DSV4_ERR_NOMEM, "rope: out of memory for %lld positions", (long long)cap);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < cap; k++)
    for (int i = 0; i < half; i++) {
      double a = (double)(lo + k) * r->freq[i];
      cs[(k * half + i) * 2] = (float)cos(a);
      cs[(k * half + i) * 2 + 1] = (float)sin(a);
    }
  free(r->cs);
  r->cs = cs;
  r->lo = lo;
  r->cap = cap;
fail:
  return rc;
}

void dsv4_rope_apply(const dsv4_rope *r, float *v, int dim, int64_t pos, int inverse) {
  const int half = r->R / 2;
  const float *cs = r->cs + (pos - r->lo) * half * 2;
  float *x = v + dim - r->R;
  const float sgn = inverse ? -1.0f : 1.0f;
  for (int i = 0; i < half; i++) {
    float c = cs[2 * i], s = sgn * cs[2 * i + 1];
    float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
  }
}
