/* xrows.c: per-thread exact accumulators of gradient rows (xrows.h). */
#include "xrows.h"

#include <stdlib.h>

#include "util/err.h"

dsv4_status dsv4_xrows_alloc(dsv4_xrows *x, int64_t r0, int64_t rows, int64_t w, int nt, const char *what) {
  dsv4_status rc = DSV4_OK;
  *x = (dsv4_xrows){.r0 = r0, .rows = rows > 0 ? rows : 0, .w = w, .nt = nt};
  const size_t n = (size_t)nt * (size_t)x->rows * 2 * (size_t)w;
  x->base = dsv4_calloc(n ? n : 1, sizeof(int64_t));
  DSV4_CHECK(x->base, DSV4_ERR_NOMEM, "%s: out of memory for %zu bytes of exact gradient sums", what,
             sizeof(int64_t) * n);
fail:
  return rc;
}

void dsv4_xrows_merge(dsv4_xrows *x) {
  const int64_t w = x->w, per = x->rows * 2 * w;
  if (x->nt < 2) return;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < x->rows; r++) {
    int64_t *a = x->base + r * 2 * w;
    for (int t = 1; t < x->nt; t++) dsv4_xacc_merge(a, a + w, a + t * per, a + t * per + w, w);
  }
}

dsv4_status dsv4_xrows_finish(dsv4_xrows *x, float *out, const char *what) {
  dsv4_status rc = DSV4_OK;
  const int64_t w = x->w;
  DSV4_CHECK(!x->bad, DSV4_ERR_ARG,
             "%s: a gradient term is not finite or not below 2^24 (the exact sums' range)", what);
  dsv4_xrows_merge(x);
  if (dsv4_xrows_redirect(out, x->base, x->rows, w)) goto fail; /* not rounded: summed with the other ranks' */
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < x->rows; r++) dsv4_xacc_store(out + r * w, x->base + r * 2 * w, x->base + r * 2 * w + w, w, 1);
fail:
  dsv4_xrows_free(x);
  return rc;
}

void dsv4_xrows_free(dsv4_xrows *x) {
  if (!x->view) free(x->base);
  x->base = NULL;
}
