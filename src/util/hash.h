/* hash.h: FNV-1a over bytes, the one hash of the library: the agreement check's config, packing and
 * BLAS fingerprints (equal inputs give equal values on every rank) and the random streams' names.
 * Not a cryptographic hash: a collision (about 2^-63 for two different inputs) would let a
 * disagreement between ranks through unnoticed. */
#ifndef DSV4_HASH_H
#define DSV4_HASH_H

#include <stddef.h>
#include <stdint.h>

#define DSV4_FNV_OFFSET 1469598103934665603ull

static inline uint64_t dsv4_fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

#endif
