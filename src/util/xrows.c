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

dsv4_status dsv4_xrows_alloc_locked(dsv4_xrows *x, int64_t r0, int64_t rows, int64_t w, int nt,
                                    const char *what) {
  dsv4_status rc = DSV4_OK;
  DSV4_TRY(dsv4_xrows_alloc(x, r0, rows, w, 1, what));
  x->nt = nt;
  x->lock = dsv4_calloc((size_t)(x->rows > 0 ? x->rows : 1), 1);
  DSV4_CHECK(x->lock, DSV4_ERR_NOMEM, "%s: out of memory for the exact sums' row locks", what);
fail:
  if (rc != DSV4_OK) dsv4_xrows_free(x);
  return rc;
}

void dsv4_xrows_group_carve(dsv4_carver *c, int64_t rows, int64_t cap, dsv4_xrows_group *g) {
  const size_t r = (size_t)(rows > 0 ? rows : 1), k = (size_t)(cap > 0 ? cap : 1);
  g->slot = dsv4_carve(c, sizeof(int32_t) * r);
  g->uniq = dsv4_carve(c, sizeof(int32_t) * k);
  g->cnt = dsv4_carve(c, sizeof(int32_t) * k);
  g->defer = dsv4_carve(c, sizeof(int32_t) * k);
  g->start = dsv4_carve(c, sizeof(int64_t) * k);
  g->terms = dsv4_carve(c, sizeof(const float *) * k);
}

void dsv4_xrows_group_clear(dsv4_xrows_group *g, int64_t rows) {
  for (int64_t r = 0; r < rows; r++) g->slot[r] = -1;
  g->nl = 0;
}

int dsv4_xrows_add_group(dsv4_xrows *x, dsv4_xrows_group *g) {
  const int64_t w = x->w;
  int32_t nu = 0;
  /* the distinct rows and how many terms each takes, then the terms in place by row (a counting sort) */
  for (int l = 0; l < g->nl; l++)
    for (int j = 0; j < g->list_n[l]; j++) {
      const int64_t r = g->list_rows[l][j] - x->r0;
      int32_t s = g->slot[r];
      if (s < 0) {
        s = g->slot[r] = nu++;
        g->uniq[s] = (int32_t)r;
        g->cnt[s] = 0;
      }
      g->cnt[s]++;
    }
  int64_t off = 0;
  for (int32_t u = 0; u < nu; u++) {
    g->start[u] = off;
    off += g->cnt[u];
    g->cnt[u] = 0;
  }
  for (int l = 0; l < g->nl; l++)
    for (int j = 0; j < g->list_n[l]; j++) {
      const int32_t s = g->slot[g->list_rows[l][j] - x->r0];
      g->terms[g->start[s] + g->cnt[s]++] = g->list_t[l] + (int64_t)j * w;
    }
  g->nl = 0;
  const size_t copy = x->lock ? 0 : (size_t)dsv4_thread_id();
  int64_t *base = x->base + copy * (size_t)x->rows * 2 * (size_t)w;
  int bad = 0;
  if (!x->lock || x->nt < 2) {
    for (int32_t u = 0; u < nu; u++) {
      int64_t *acc = base + (int64_t)g->uniq[u] * 2 * w;
      bad |= dsv4_xacc_addk_(acc, acc + w, g->terms + g->start[u], g->cnt[u], w, 0);
      g->slot[g->uniq[u]] = -1;
    }
    return bad;
  }
  int32_t nd = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int32_t i = 0, n = pass ? nd : nu; i < n; i++) {
      const int32_t u = pass ? g->defer[i] : i, r = g->uniq[u];
      if (!pass && !dsv4_xrows_trylock(x->lock + r)) {
        g->defer[nd++] = u;
        continue;
      }
      if (pass) dsv4_xrows_lock(x->lock + r);
      int64_t *acc = base + (int64_t)r * 2 * w;
      bad |= dsv4_xacc_addk_(acc, acc + w, g->terms + g->start[u], g->cnt[u], w, 0);
      dsv4_xrows_unlock(x->lock + r);
      g->slot[r] = -1;
    }
  return bad;
}

void dsv4_xrows_merge(dsv4_xrows *x) {
  const int64_t w = x->w, per = x->rows * 2 * w;
  if (x->nt < 2 || x->lock) return;
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
  if (!x->view) free(x->base), free(x->lock);
  x->base = NULL;
  x->lock = NULL;
}
