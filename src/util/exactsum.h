/* exactsum.h: order-independent summation of doubles in 128-bit fixed point.
 * Each term is rounded once to a multiple of 2^-EXACTSUM_FRAC_BITS (the same way on every rank);
 * integer addition is associative, so the total is the same bits whichever rank or thread adds
 * which terms. Range: |total| < 2^(127 - EXACTSUM_FRAC_BITS) = 2^57. Used for the KL loss so that
 * CP = N returns exactly the CP = 1 value. */
#ifndef DSV4_EXACTSUM_H
#define DSV4_EXACTSUM_H

#include <math.h>

#define EXACTSUM_FRAC_BITS 70

typedef __int128 dsv4_exactsum;

static inline dsv4_exactsum dsv4_exactsum_term(double v) {
  return (dsv4_exactsum)ldexp(v, EXACTSUM_FRAC_BITS);
}

static inline double dsv4_exactsum_value(dsv4_exactsum s) {
  return ldexp((double)s, -EXACTSUM_FRAC_BITS);
}

#endif
