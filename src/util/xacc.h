/* xacc.h: exact, order-independent sums of float gradient terms (the bitwise-gradient contract).
 *
 * A float sum's bits depend on the order of its terms, so a key-gradient row summed over queries
 * changes with the thread (or rank) that took each query. Here each term t is rounded ONCE to a
 * fixed absolute grid of 2^-66 and the grid units are added as integers, which is associative: the
 * total is the same whichever thread or rank adds which terms in which order.
 *
 * Representation of one element: two int64, value = (hi 2^50 + lo) 2^-66 with lo kept in
 * [0, 2^50). A term splits as u = t 2^16 = a + b with a = rint(u) (an integer) and b = u - a
 * (exact, |b| <= 1/2); hi += a, lo += rint(b 2^50), and lo's carry moves into hi (after each
 * term, or after an element's k terms: the same integers, so the same normalised pair).
 * Every step is exact IEEE double arithmetic (rint by the 1.5 2^52 trick, which rounds to nearest
 * even as rint does), so the AVX-512, AVX2 and scalar paths give the same bits.
 *
 * Range and precision: a term keeps all its 24 bits down to |t| = 2^-42 (smaller ones are rounded
 * to the grid, far below any float sum's own rounding); |t| must stay below 2^24 and an element may
 * take at most 2^23 terms (hi then stays below 2^63); up to 2^12 rows may be summed by integer adds
 * before a normalisation (lo below 2^62). A larger or non-finite term is not added silently: the
 * add returns nonzero and the caller reports an error.
 *
 * Accumulators are arrays of rows of width w: element (r, e) has hi at acc[2 w r + e] and lo at
 * acc[2 w r + w + e] (one row's hi and lo are neighbours in memory). */
#ifndef DSV4_XACC_H
#define DSV4_XACC_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define DSV4_XACC_LO_BITS 50
#define DSV4_XACC_IN 0x1p16        /* t -> grid units of 2^-16 for hi */
#define DSV4_XACC_LIMIT 0x1p40     /* |t 2^16| < 2^40, i.e. |t| < 2^24 */
#define DSV4_XACC_MAGIC 0x1.8p52   /* x + MAGIC: x rounded to an integer in the low bits (|x| < 2^51) */

static inline int64_t dsv4_xacc_bits(double x) {
  int64_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

/* One term. */
static inline int dsv4_xacc_add1(int64_t *restrict hi, int64_t *restrict lo, float t) {
  const int64_t mask = ((int64_t)1 << DSV4_XACC_LO_BITS) - 1, mb = dsv4_xacc_bits(DSV4_XACC_MAGIC);
  const double u0 = (double)t * DSV4_XACC_IN;
  const int ok = fabs(u0) < DSV4_XACC_LIMIT; /* false for NaN */
  const double u = ok ? u0 : 0.0;
  const double ra = u + DSV4_XACC_MAGIC, a = ra - DSV4_XACC_MAGIC;
  const double rb = (u - a) * 0x1p50 + DSV4_XACC_MAGIC;
  const int64_t l = *lo + (dsv4_xacc_bits(rb) - mb);
  const int64_t carry = (l > mask) - (l < 0);
  *lo = l & mask;
  *hi += (dsv4_xacc_bits(ra) - mb) + carry;
  return !ok;
}

/* hi[e], lo[e] += t[0][e] + ... + t[k - 1][e] for e < n, the k terms of an element added while its
 * sums stay in registers (one pass over hi, lo for k terms). fresh: hi, lo are first set to zero,
 * without reading them: the first terms of a new sum. Returns nonzero when some term was
 * non-finite or |t| >= 2^24 (that term is then not added). The sums are integers, so the result
 * does not depend on k or on how terms are grouped into calls. */
static inline int dsv4_xacc_addk_(int64_t *restrict hi, int64_t *restrict lo, const float *const *t, int k,
                                  int64_t n, const int fresh) {
  int bad = 0;
  int64_t e = 0;
#ifdef __AVX512F__
  /* Sixteen elements per step, in two chains of eight (the same integers as the AVX2 loop below):
   * - the scaling by 2^16 and 2^50 rides in the rounding constants: t + 1.5 2^36 rounds t to the
   *   2^-16 grid (its integer count is a's) and b + 1.5 2^-14 rounds b to the 2^-66 grid (b's);
   * - each term adds the raw bit patterns; the constants' patterns (k of each) are taken off once
   *   per element, and int64 adds wrap, so the total is the same integer;
   * - lo's carries go into hi once per element after its k terms (an arithmetic shift: lo then holds
   *   at most 2^50 + k 2^49 in magnitude, far inside int64 for the k <= DSV4_WG_GROUP the library
   *   passes), not after every term: the same integers, so the same normalised (hi, lo);
   * - the range check is made on the floats, sixteen at a time (|t| < 2^24; false for NaN). */
  const __m512d ma = _mm512_set1_pd(0x1.8p36), mlo = _mm512_set1_pd(0x1.8p-14);
  const __m512 lim16 = _mm512_set1_ps(0x1p24f);
  const __m512i ka = _mm512_set1_epi64((int64_t)((uint64_t)k * (uint64_t)dsv4_xacc_bits(0x1.8p36)));
  const __m512i klo = _mm512_set1_epi64((int64_t)((uint64_t)k * (uint64_t)dsv4_xacc_bits(0x1.8p-14)));
  const __m512i mask8 = _mm512_set1_epi64(((int64_t)1 << DSV4_XACC_LO_BITS) - 1), zero8 = _mm512_setzero_si512();
  __mmask16 bad16 = 0;
  for (; e + 8 <= n; e += 16) {
    const int two = e + 16 <= n; /* else the last eight */
    const __mmask16 lanes = two ? 0xffff : 0x00ff;
    __m512i l0 = fresh ? zero8 : _mm512_loadu_si512((const void *)(lo + e));
    __m512i h0 = fresh ? zero8 : _mm512_loadu_si512((const void *)(hi + e));
    __m512i l1 = zero8, h1 = zero8;
    if (two && !fresh) {
      l1 = _mm512_loadu_si512((const void *)(lo + e + 8));
      h1 = _mm512_loadu_si512((const void *)(hi + e + 8));
    }
    h0 = _mm512_sub_epi64(h0, ka), h1 = _mm512_sub_epi64(h1, ka);
    l0 = _mm512_sub_epi64(l0, klo), l1 = _mm512_sub_epi64(l1, klo);
    for (int j = 0; j < k; j++) {
      const __m512 x = _mm512_maskz_loadu_ps(lanes, t[j] + e);
      const __mmask16 ok = _mm512_cmp_ps_mask(_mm512_abs_ps(x), lim16, _CMP_LT_OQ);
      bad16 |= (__mmask16)(~ok & lanes);
      const __m512 y = _mm512_maskz_mov_ps(ok, x); /* a bad term adds zero */
      const __m512d u0 = _mm512_cvtps_pd(_mm512_castps512_ps256(y));
      const __m512d u1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1)));
      const __m512d ra0 = _mm512_add_pd(u0, ma), ra1 = _mm512_add_pd(u1, ma);
      const __m512d rb0 = _mm512_add_pd(_mm512_sub_pd(u0, _mm512_sub_pd(ra0, ma)), mlo);
      const __m512d rb1 = _mm512_add_pd(_mm512_sub_pd(u1, _mm512_sub_pd(ra1, ma)), mlo);
      h0 = _mm512_add_epi64(h0, _mm512_castpd_si512(ra0)), h1 = _mm512_add_epi64(h1, _mm512_castpd_si512(ra1));
      l0 = _mm512_add_epi64(l0, _mm512_castpd_si512(rb0)), l1 = _mm512_add_epi64(l1, _mm512_castpd_si512(rb1));
    }
    h0 = _mm512_add_epi64(h0, _mm512_srai_epi64(l0, DSV4_XACC_LO_BITS)); /* lo's carries: floor(lo / 2^50) */
    l0 = _mm512_and_si512(l0, mask8);
    _mm512_storeu_si512((void *)(lo + e), l0);
    _mm512_storeu_si512((void *)(hi + e), h0);
    if (!two) {
      e += 8;
      break;
    }
    h1 = _mm512_add_epi64(h1, _mm512_srai_epi64(l1, DSV4_XACC_LO_BITS));
    l1 = _mm512_and_si512(l1, mask8);
    _mm512_storeu_si512((void *)(lo + e + 8), l1);
    _mm512_storeu_si512((void *)(hi + e + 8), h1);
  }
  bad = bad16 != 0;
#endif
#ifdef __AVX2__
  const __m256d in = _mm256_set1_pd(DSV4_XACC_IN), lim = _mm256_set1_pd(DSV4_XACC_LIMIT);
  const __m256d magic = _mm256_set1_pd(DSV4_XACC_MAGIC), s50 = _mm256_set1_pd(0x1p50);
  const __m256d absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(INT64_MAX));
  const __m256i mb = _mm256_set1_epi64x(dsv4_xacc_bits(DSV4_XACC_MAGIC));
  const __m256i mask = _mm256_set1_epi64x(((int64_t)1 << DSV4_XACC_LO_BITS) - 1), zero = _mm256_setzero_si256();
  __m256d badv = _mm256_setzero_pd();
  for (; e + 4 <= n; e += 4) {
    __m256i l = fresh ? zero : _mm256_loadu_si256((const __m256i *)(lo + e));
    __m256i h = fresh ? zero : _mm256_loadu_si256((const __m256i *)(hi + e));
    for (int j = 0; j < k; j++) {
      const __m256d u0 = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(t[j] + e)), in);
      const __m256d ok = _mm256_cmp_pd(_mm256_and_pd(u0, absmask), lim, _CMP_LT_OQ); /* false for NaN */
      badv = _mm256_or_pd(badv, _mm256_andnot_pd(ok, _mm256_castsi256_pd(_mm256_set1_epi64x(-1))));
      const __m256d u = _mm256_and_pd(u0, ok);
      const __m256d ra = _mm256_add_pd(u, magic), a = _mm256_sub_pd(ra, magic);
      const __m256d rb = _mm256_add_pd(_mm256_mul_pd(_mm256_sub_pd(u, a), s50), magic);
      const __m256i ia = _mm256_sub_epi64(_mm256_castpd_si256(ra), mb);
      l = _mm256_add_epi64(l, _mm256_sub_epi64(_mm256_castpd_si256(rb), mb));
      /* carry = (l > mask) - (l < 0): compare results are -1 / 0 */
      const __m256i carry = _mm256_sub_epi64(_mm256_cmpgt_epi64(zero, l), _mm256_cmpgt_epi64(l, mask));
      l = _mm256_and_si256(l, mask);
      h = _mm256_add_epi64(h, _mm256_add_epi64(ia, carry));
    }
    _mm256_storeu_si256((__m256i *)(lo + e), l);
    _mm256_storeu_si256((__m256i *)(hi + e), h);
  }
  bad |= _mm256_movemask_pd(badv) != 0;
#endif
  for (; e < n; e++) {
    if (fresh) hi[e] = lo[e] = 0;
    for (int j = 0; j < k; j++) bad |= dsv4_xacc_add1(hi + e, lo + e, t[j][e]);
  }
  return bad;
}

static inline int dsv4_xacc_add_(int64_t *restrict hi, int64_t *restrict lo, const float *restrict t, int64_t n,
                                 const int fresh) {
  const float *one[1] = {t};
  return dsv4_xacc_addk_(hi, lo, one, 1, n, fresh);
}

static inline int dsv4_xacc_add(int64_t *restrict hi, int64_t *restrict lo, const float *restrict t, int64_t n) {
  return dsv4_xacc_add_(hi, lo, t, n, 0);
}

/* hi, lo = the exact value of t (bitwise zeroing them, then dsv4_xacc_add). */
static inline int dsv4_xacc_set(int64_t *restrict hi, int64_t *restrict lo, const float *restrict t, int64_t n) {
  return dsv4_xacc_add_(hi, lo, t, n, 1);
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

/* After integer sums of several normalised rows (a reduce-scatter): lo back into [0, 2^50). */
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
  return (float)((double)hi * 0x1p-16 + (double)lo * 0x1p-66);
}

/* out[e] += value of element e (beta 1) or out[e] = value (beta 0). */
static inline void dsv4_xacc_store(float *restrict out, const int64_t *restrict hi, const int64_t *restrict lo,
                                   int64_t n, int beta) {
  for (int64_t e = 0; e < n; e++) {
    const float v = dsv4_xacc_value(hi[e], lo[e]);
    out[e] = beta ? out[e] + v : v;
  }
}

/* out[e] (beta 0: =, 1: +=) the value of t[0][e] + ... + t[k - 1][e]: the same bits as adding the
 * terms into fresh sums and storing them (dsv4_xacc_set, _add, _store), without sums in memory
 * (they live in a stack chunk of DSV4_XACC_CHUNK elements). Returns nonzero on a bad term. */
#define DSV4_XACC_CHUNK 64
static inline int dsv4_xacc_sumk(float *restrict out, const float *const *t, int k, int64_t n, int beta) {
  int64_t hi[DSV4_XACC_CHUNK], lo[DSV4_XACC_CHUNK];
  const float *tj[k > 0 ? k : 1];
  int bad = 0;
  for (int64_t e0 = 0; e0 < n; e0 += DSV4_XACC_CHUNK) {
    const int64_t c = n - e0 < DSV4_XACC_CHUNK ? n - e0 : DSV4_XACC_CHUNK;
    for (int j = 0; j < k; j++) tj[j] = t[j] + e0;
    bad |= dsv4_xacc_addk_(hi, lo, tj, k, c, 1);
    dsv4_xacc_store(out + e0, hi, lo, c, beta);
  }
  return bad;
}

#endif
