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

void dsv4_rope_ranges_add(dsv4_rope_ranges *s, int64_t lo, int64_t hi) {
  int64_t L[DSV4_ROPE_RANGES + 1], H[DSV4_ROPE_RANGES + 1];
  int n = 0, put = 0;
  if (hi <= lo) return;
  for (int j = 0; j < s->n; j++) {
    if (s->hi[j] < lo) { /* before, apart */
      L[n] = s->lo[j], H[n++] = s->hi[j];
    } else if (s->lo[j] > hi) { /* after, apart */
      if (!put) L[n] = lo, H[n++] = hi, put = 1;
      L[n] = s->lo[j], H[n++] = s->hi[j];
    } else { /* overlapping or touching: one range */
      lo = s->lo[j] < lo ? s->lo[j] : lo;
      hi = s->hi[j] > hi ? s->hi[j] : hi;
    }
  }
  if (!put) L[n] = lo, H[n++] = hi;
  if (n > DSV4_ROPE_RANGES) { /* the closest two become one */
    int k = 0;
    for (int j = 1; j + 1 < n; j++)
      if (L[j + 1] - H[j] < L[k + 1] - H[k]) k = j;
    H[k] = H[k + 1];
    for (int j = k + 1; j + 1 < n; j++) L[j] = L[j + 1], H[j] = H[j + 1];
    n--;
  }
  s->n = n;
  memcpy(s->lo, L, sizeof(int64_t) * (size_t)n);
  memcpy(s->hi, H, sizeof(int64_t) * (size_t)n);
}

int64_t dsv4_rope_ranges_positions(const dsv4_rope_ranges *s) {
  int64_t n = 0;
  for (int j = 0; j < s->n; j++) n += s->hi[j] - s->lo[j];
  return n;
}

/* The table of exactly the positions of s (at least one range), in range order. */
static dsv4_status build(dsv4_rope *r, const dsv4_rope_ranges *s) {
  dsv4_status rc = DSV4_OK;
  const int half = r->R / 2;
  const int64_t cap = dsv4_rope_ranges_positions(s);
  int64_t off[DSV4_ROPE_RANGES], o = 0;
  for (int j = 0; j < s->n; j++) off[j] = o, o += s->hi[j] - s->lo[j];
  float *cs = malloc(sizeof(float) * (size_t)(cap * half * 2));
  DSV4_CHECK(cs, DSV4_ERR_NOMEM, "rope: out of memory for %lld positions", (long long)cap);
  for (int j = 0; j < s->n; j++) {
    const int64_t lo = s->lo[j], len = s->hi[j] - lo;
    float *t = cs + off[j] * half * 2;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < len; k++)
      for (int i = 0; i < half; i++) {
        double a = (double)(lo + k) * r->freq[i];
        t[(k * half + i) * 2] = (float)cos(a);
        t[(k * half + i) * 2 + 1] = (float)sin(a);
      }
  }
  free(r->cs);
  r->cs = cs;
  r->rg = *s;
  memcpy(r->off, off, sizeof(int64_t) * (size_t)s->n);
  r->lo = s->lo[0];
  r->cap = cap;
fail:
  return rc;
}

dsv4_status dsv4_rope_reserve(dsv4_rope *r, int64_t lo, int64_t hi) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(lo >= 0 && hi >= lo, DSV4_ERR_ARG, "rope: bad position range [%lld, %lld)", (long long)lo,
             (long long)hi);
  const int one = r->cs && r->rg.n == 1; /* a window (not ranges) */
  if (one && lo >= r->lo && hi <= r->lo + r->cap) return DSV4_OK;
  if (one && lo <= r->lo + r->cap && hi >= r->lo) { /* overlapping or adjacent: keep the union */
    lo = lo < r->lo ? lo : r->lo;
    hi = hi > r->lo + r->cap ? hi : r->lo + r->cap;
  }
  int64_t cap = 256;
  while (cap < hi - lo) cap *= 2;
  const dsv4_rope_ranges s = {1, {lo}, {lo + cap}};
  DSV4_TRY(build(r, &s));
fail:
  return rc;
}

dsv4_status dsv4_rope_reserve_ranges(dsv4_rope *r, const dsv4_rope_ranges *s) {
  static const dsv4_rope_ranges none = {1, {0}, {1}};
  const dsv4_rope_ranges *t = s->n ? s : &none;
  return build(r, t);
}

int dsv4_rope_has(const dsv4_rope *r, int64_t pos) {
  for (int j = 0; j < r->rg.n; j++)
    if (pos >= r->rg.lo[j] && pos < r->rg.hi[j]) return 1;
  return 0;
}

void dsv4_rope_apply(const dsv4_rope *r, float *v, int dim, int64_t pos, int inverse) {
  const int half = r->R / 2;
  int j = 0; /* the range holding pos (sorted: the first that ends after it) */
  while (j + 1 < r->rg.n && pos >= r->rg.hi[j]) j++;
  const float *cs = r->cs + (r->off[j] + pos - r->rg.lo[j]) * half * 2;
  float *x = v + dim - r->R;
  const float sgn = inverse ? -1.0f : 1.0f;
  for (int i = 0; i < half; i++) {
    float c = cs[2 * i], s = sgn * cs[2 * i + 1];
    float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
  }
}
