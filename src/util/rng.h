/* rng.h: counter-based random numbers. Value i of stream s under seed k depends only on (k, s, i),
 * so every rank can generate exactly its own shard of a tensor the one-rank run generates whole. */
#ifndef DSV4_RNG_H
#define DSV4_RNG_H

#include <stdint.h>
#include <string.h>

#include "util/hash.h"

/* splitmix64 finaliser: a bijective 64-bit mix. */
static inline uint64_t dsv4_mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in [-1, 1) with 24 random bits (exact in fp32). */
static inline float dsv4_uniform(uint64_t seed, uint64_t stream, uint64_t i) {
  uint64_t h = dsv4_mix64(dsv4_mix64(seed ^ dsv4_mix64(stream)) + i);
  return (float)((int64_t)(h >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}

/* Stream id of a name (FNV-1a), so each weight tensor has its own stream. */
static inline uint64_t dsv4_name_stream(const char *s) { return dsv4_fnv1a(DSV4_FNV_OFFSET, s, strlen(s)); }

/* dsv4_random_fill and dsv4_random_stream (= dsv4_name_stream) are public: dsv4cp_io.h. */
#include "dsv4cp_io.h"

#endif
