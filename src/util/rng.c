/* rng.c: bulk fill from the counter-based generator of rng.h. */
#include "rng.h"

void dsv4_random_fill(float *dst, int64_t n, uint64_t seed, uint64_t stream, int64_t offset, float scale) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t j = 0; j < n; j++) dst[j] = scale * dsv4_uniform(seed, stream, (uint64_t)(offset + j));
}

uint64_t dsv4_random_stream(const char *name) { return dsv4_name_stream(name); }
