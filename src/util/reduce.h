/* reduce.h: sums, maxima and dot products over a vector with DSV4_LANES fixed partial results
 * (element j goes to lane j % DSV4_LANES; the lanes are combined in order at the end).
 *
 * Why: a plain `for (...) s += x[j]` is a chain of dependent adds (4 cycles each) that the
 * compiler may not reorder without -ffast-math; 16 independent lanes fill an AVX-512 register and
 * run ~16x faster. The order is still fixed by j alone, so a value never depends on which rank,
 * thread or buffer computed it (the bitwise CP guarantee). Softmax denominators, RMSNorm, the
 * attention backward's dO . O all go through here. */
#ifndef DSV4_REDUCE_H
#define DSV4_REDUCE_H

#include <math.h>
#include <stdint.h>

#define DSV4_LANES 16

static inline float dsv4_sum(const float *x, int64_t n) {
  float acc[DSV4_LANES] = {0};
  int64_t j = 0;
  for (; j + DSV4_LANES <= n; j += DSV4_LANES)
    for (int l = 0; l < DSV4_LANES; l++) acc[l] += x[j + l];
  for (int l = 0; j + l < n; l++) acc[l] += x[j + l];
  float s = 0;
  for (int l = 0; l < DSV4_LANES; l++) s += acc[l];
  return s;
}

static inline float dsv4_max(const float *x, int64_t n) {
  float acc[DSV4_LANES];
  for (int l = 0; l < DSV4_LANES; l++) acc[l] = -INFINITY;
  int64_t j = 0;
  for (; j + DSV4_LANES <= n; j += DSV4_LANES)
    for (int l = 0; l < DSV4_LANES; l++) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  for (int l = 0; j + l < n; l++) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  float m = -INFINITY;
  for (int l = 0; l < DSV4_LANES; l++) m = acc[l] > m ? acc[l] : m;
  return m;
}

static inline float dsv4_dot(const float *x, const float *y, int64_t n) {
  float acc[DSV4_LANES] = {0};
  int64_t j = 0;
  for (; j + DSV4_LANES <= n; j += DSV4_LANES)
    for (int l = 0; l < DSV4_LANES; l++) acc[l] += x[j + l] * y[j + l];
  for (int l = 0; j + l < n; l++) acc[l] += x[j + l] * y[j + l];
  float s = 0;
  for (int l = 0; l < DSV4_LANES; l++) s += acc[l];
  return s;
}

/* sum of x[j] * y[j] in double lanes (y may be NULL: sum of squares of x). */
static inline double dsv4_dot_d(const float *x, const float *y, int64_t n) {
  double acc[DSV4_LANES] = {0};
  int64_t j = 0;
  for (; j + DSV4_LANES <= n; j += DSV4_LANES)
    for (int l = 0; l < DSV4_LANES; l++) acc[l] += (double)x[j + l] * (y ? y[j + l] : x[j + l]);
  for (int l = 0; j + l < n; l++) acc[l] += (double)x[j + l] * (y ? y[j + l] : x[j + l]);
  double s = 0;
  for (int l = 0; l < DSV4_LANES; l++) s += acc[l];
  return s;
}

#endif
