/* xacc.h: exact, order-independent sums of float gradient terms (the bitwise-gradient contract).
 *
 * A float sum's bits depend on the order of its terms, so a key-gradient row summed over queries
 * changes with the thread that took each query. Here each term t is rounded ONCE to a fixed
 * absolute grid of 2^-72 and the grid units are added as integers, which is associative: the total
 * is the same whichever thread adds which terms in which order.
 *
 * Representation of one element: two int64, value = (hi 2^56 + lo) 2^-72 with lo kept in
 * [0, 2^56). A term splits as t 2^16 = a + b, a = rint(t 2^16) (an integer, exact in float) and
 * b = t 2^16 - a (exact, |b| <= 1/2); hi += a, lo += rint(b 2^56), and lo's carry moves into hi.
 * Every step is a plain vector operation (no 128-bit arithmetic in the loop).
 *
 * Range and precision: a term keeps all its 24 bits down to |t| = 2^-48 (smaller ones are rounded
 * to the grid, far below any float sum's own rounding); |t| must stay below 2^24 and an element may
 * take at most 2^23 terms (hi then stays below 2^63). A larger or non-finite term is not added
 * silently: the add returns nonzero and the caller reports an error.
 *
 * Accumulators are arrays of rows of width w: element (r, e) has hi at acc[2 w r + e] and lo at
 * acc[2 w r + w + e] (one row's hi and lo are neighbours in memory). */
#ifndef DSV4_XACC_H
#define DSV4_XACC_H

#include <math.h>
#include <stdint.h>

#define DSV4_XACC_LO_BITS 56
#define DSV4_XACC_IN 0x1p16f       /* t -> grid units of 2^-16 for hi */
#define DSV4_XACC_LIMIT 0x1p40f    /* |t 2^16| < 2^40, i.e. |t| < 2^24 */

/* One term. */
static inline int dsv4_xacc_add1(int64_t *restrict hi, int64_t *restrict lo, float t) {
  const int64_t mask = ((int64_t)1 << DSV4_XACC_LO_BITS) - 1;
  const float u0 = t * DSV4_XACC_IN;
  const int ok = fabsf(u0) < DSV4_XACC_LIMIT; /* false for NaN */
  const float u = ok ? u0 : 0.0f;
  const float a = __builtin_rintf(u);
  const int64_t l = *lo + (int64_t)__builtin_rintf((u - a) * 0x1p56f);
  const int64_t m = l & mask;
  *lo = m;
  *hi += (int64_t)a + ((l - m) >> DSV4_XACC_LO_BITS);
  return !ok;
}

/* hi[e], lo[e] += t[e] for e < n. Returns nonzero when some term was non-finite or |t| >= 2^24
 * (that term is then not added). */
static inline int dsv4_xacc_add(int64_t *restrict hi, int64_t *restrict lo, const float *restrict t, int64_t n) {
  int bad = 0;
  for (int64_t e = 0; e < n; e++) bad |= dsv4_xacc_add1(hi + e, lo + e, t[e]);
  return bad;
}

/* One accumulator row added into another (a thread's partial into the total): exact. */
static inline void dsv4_xacc_merge(int64_t *restrict hi, int64_t *restrict lo, const int64_t *restrict hi2,
                                   const int64_t *restrict lo2, int64_t n) {
  const int64_t mask = ((int64_t)1 << DSV4_XACC_LO_BITS) - 1;
  for (int64_t e = 0; e < n; e++) {
    const int64_t l = lo[e] + lo2[e], m = l & mask;
    lo[e] = m;
    hi[e] += hi2[e] + ((l - m) >> DSV4_XACC_LO_BITS);
  }
}

/* After integer sums of several normalised rows (a reduce-scatter): lo back into [0, 2^56). */
static inline void dsv4_xacc_normalize(int64_t *restrict hi, int64_t *restrict lo, int64_t n) {
  const int64_t mask = ((int64_t)1 << DSV4_XACC_LO_BITS) - 1;
  for (int64_t e = 0; e < n; e++) {
    const int64_t m = lo[e] & mask;
    hi[e] += (lo[e] - m) >> DSV4_XACC_LO_BITS;
    lo[e] = m;
  }
}

/* The value of an element as a float. Deterministic in (hi, lo), and (hi, lo) is unique for a
 * value (lo normalised), so equal exact sums give equal floats. */
static inline float dsv4_xacc_value(int64_t hi, int64_t lo) {
  return (float)((double)hi * 0x1p-16 + (double)lo * 0x1p-72);
}

/* out[e] += value of element e (beta 1) or out[e] = value (beta 0). */
static inline void dsv4_xacc_store(float *restrict out, const int64_t *restrict hi, const int64_t *restrict lo,
                                   int64_t n, int beta) {
  for (int64_t e = 0; e < n; e++) {
    const float v = dsv4_xacc_value(hi[e], lo[e]);
    out[e] = beta ? out[e] + v : v;
  }
}

#endif
