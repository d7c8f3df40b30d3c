/* docs.c: packed-sequence validation and the slot arithmetic (see docs.h). */
#include "docs.h"

#include <string.h>

#include "util/err.h"

dsv4_status dsv4_docs_build(dsv4_docs *d, const dsv4_packing *pk, int ratio) {
  dsv4_status rc = DSV4_OK;
  memset(d, 0, sizeof *d);
  DSV4_CHECK(pk, DSV4_ERR_ARG, "packing meta is NULL");
  DSV4_CHECK(pk->T > 0, DSV4_ERR_ARG, "T must be positive (got %lld)", (long long)pk->T);
  const int n = pk->cu_seqlens ? pk->n_docs : 1;
  DSV4_CHECK(n >= 1, DSV4_ERR_ARG, "cu_seqlens must describe at least one document (n_docs = %d)", n);
  d->n_docs = n;
  d->T = pk->T;
  d->ratio = ratio;
  d->batched = pk->batched;
  DSV4_ALLOC(d->cu, n + 1);
  DSV4_ALLOC(d->real, n);
  DSV4_ALLOC(d->cu_cmp, n + 1);
  if (pk->cu_seqlens) {
    DSV4_CHECK(pk->cu_seqlens[0] == 0, DSV4_ERR_ARG, "cu_seqlens[0] must be 0 (got %d)",
               pk->cu_seqlens[0]);
    for (int i = 0; i < n; i++)
      DSV4_CHECK(pk->cu_seqlens[i + 1] > pk->cu_seqlens[i], DSV4_ERR_ARG,
                 "cu_seqlens not increasing at index %d (%d then %d)", i + 1, pk->cu_seqlens[i],
                 pk->cu_seqlens[i + 1]);
    DSV4_CHECK(pk->cu_seqlens[n] == pk->T, DSV4_ERR_ARG,
               "cu_seqlens ends at %d but there are %lld tokens", pk->cu_seqlens[n], (long long)pk->T);
    for (int i = 0; i <= n; i++) d->cu[i] = pk->cu_seqlens[i];
  } else {
    d->cu[1] = pk->T;
  }
  for (int i = 0; i < n; i++) {
    const int64_t padded = d->cu[i + 1] - d->cu[i];
    d->real[i] = pk->seqlens_real ? pk->seqlens_real[i] : padded;
    DSV4_CHECK(d->real[i] > 0 && d->real[i] <= padded, DSV4_ERR_ARG,
               "seqlens_real[%d] = %lld out of range (1..%lld, the padded length)", i,
               (long long)d->real[i], (long long)padded);
    d->cu_cmp[i + 1] = d->cu_cmp[i] + (ratio > 0 ? d->real[i] / ratio : 0);
  }
  d->n_cmp = d->cu_cmp[n];
  return DSV4_OK;
fail:
  dsv4_docs_free(d);
  return rc;
}

/* Worked example (r = 4): documents [0, 10) all real and [10, 17) with 6 real tokens; slots are
 * doc 0: [0,4) [4,8) (tokens 8, 9 form no slot), doc 1: [10,14) (tokens 14, 15 no slot, 16 is
 * padding). Slot ends: 3, 7, 13. slots_before(8) = 2 (ends 3 and 7 < 8), slots_before(13) = 2,
 * slots_before(14) = 3: a segment [8, 14) owns exactly slot id 2. */
int64_t dsv4_docs_slots_before(const dsv4_docs *d, int64_t g) {
  if (d->ratio <= 0 || g <= 0) return 0;
  if (g >= d->T) return d->n_cmp;
  const int i = dsv4_docs_find(d, g);
  const int64_t n_c = d->cu_cmp[i + 1] - d->cu_cmp[i], in_doc = (g - d->cu[i]) / d->ratio;
  return d->cu_cmp[i] + (in_doc < n_c ? in_doc : n_c);
}

void dsv4_docs_slot(const dsv4_docs *d, int64_t id, int *doc, int64_t *j) {
  int lo = 0, hi = d->n_docs - 1;
  while (lo < hi) { /* last document whose first slot id is <= id (documents without slots skipped) */
    int mid = (lo + hi + 1) / 2;
    if (d->cu_cmp[mid] <= id) lo = mid; else hi = mid - 1;
  }
  while (lo < d->n_docs - 1 && d->cu_cmp[lo + 1] <= id) lo++;
  *doc = lo;
  *j = id - d->cu_cmp[lo];
}

void dsv4_docs_pos_range(const dsv4_docs *d, int64_t g0, int64_t len, int64_t *lo, int64_t *hi) {
  int i = dsv4_docs_find(d, g0);
  *lo = g0 - d->cu[i];
  *hi = 0;
  for (; i < d->n_docs && d->cu[i] < g0 + len; i++) {
    const int64_t a = g0 > d->cu[i] ? g0 : d->cu[i], b = g0 + len < d->cu[i + 1] ? g0 + len : d->cu[i + 1];
    if (a - d->cu[i] < *lo) *lo = a - d->cu[i];
    if (b - d->cu[i] > *hi) *hi = b - d->cu[i];
  }
}

void dsv4_docs_free(dsv4_docs *d) {
  free(d->cu);
  free(d->real);
  free(d->cu_cmp);
  memset(d, 0, sizeof *d);
}

int dsv4_docs_find(const dsv4_docs *d, int64_t g) {
  int lo = 0, hi = d->n_docs - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (d->cu[mid] <= g) lo = mid; else hi = mid - 1;
  }
  return lo;
}
