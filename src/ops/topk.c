/* topk.c: quickselect + merge (or heap) sort under the (score desc, id asc) total order. The order
 * is strict (ids are distinct), so every correct sort gives the same sequence: the algorithm is a
 * matter of speed only. */
#include "topk.h"

#include <math.h>

static void swap(dsv4_scored *a, dsv4_scored *b) {
  dsv4_scored t = *a;
  *a = *b;
  *b = t;
}

/* Sorts v[0..n) by the total order (heap sort: no recursion, no scratch; for lists longer than
 * merge_sort's buffer). */
static void heap_sort(dsv4_scored *v, int64_t n) {
  /* max-heap w.r.t. "comes later", so popping puts the last elements at the end */
  for (int64_t start = n / 2 - 1; start >= 0; start--) {
    int64_t root = start;
    for (;;) {
      int64_t c = 2 * root + 1;
      if (c >= n) break;
      if (c + 1 < n && dsv4_scored_before(v[c], v[c + 1])) c++;
      if (!dsv4_scored_before(v[root], v[c])) break;
      swap(&v[root], &v[c]);
      root = c;
    }
  }
  for (int64_t end = n - 1; end > 0; end--) {
    swap(&v[0], &v[end]);
    int64_t root = 0;
    for (;;) {
      int64_t c = 2 * root + 1;
      if (c >= end) break;
      if (c + 1 < end && dsv4_scored_before(v[c], v[c + 1])) c++;
      if (!dsv4_scored_before(v[root], v[c])) break;
      swap(&v[root], &v[c]);
      root = c;
    }
  }
}

/* Merge sort's scratch (on the stack): top-k lists are index_topk (512) or V4.1's candidate blocks
 * (2048) long. The heap sort it replaced took about 0.5% of a CSA step at 4096 tokens (its branches
 * mispredict on every other comparison); runs of RUN sorted by insertion, then merged without
 * branches on the comparison. */
#define MERGE_MAX 4096
#define RUN 8

static void merge_sort(dsv4_scored *v, int64_t n) {
  dsv4_scored buf[MERGE_MAX];
  for (int64_t r0 = 0; r0 < n; r0 += RUN) { /* insertion sort of each run */
    const int64_t r1 = r0 + RUN < n ? r0 + RUN : n;
    for (int64_t i = r0 + 1; i < r1; i++) {
      const dsv4_scored x = v[i];
      int64_t j = i;
      for (; j > r0 && dsv4_scored_before(x, v[j - 1]); j--) v[j] = v[j - 1];
      v[j] = x;
    }
  }
  dsv4_scored *src = v, *dst = buf;
  for (int64_t w = RUN; w < n; w *= 2) {
    for (int64_t a = 0; a < n; a += 2 * w) {
      const int64_t m = a + w < n ? a + w : n, e = a + 2 * w < n ? a + 2 * w : n;
      int64_t i = a, j = m, o = a;
      while (i < m && j < e) {
        const int t = dsv4_scored_before(src[j], src[i]);
        dst[o++] = t ? src[j] : src[i];
        j += t;
        i += !t;
      }
      while (i < m) dst[o++] = src[i++];
      while (j < e) dst[o++] = src[j++];
    }
    dsv4_scored *t = src;
    src = dst;
    dst = t;
  }
  if (src != v)
    for (int64_t i = 0; i < n; i++) v[i] = src[i];
}

static void sort_scored(dsv4_scored *v, int64_t n) {
  if (n <= MERGE_MAX) merge_sort(v, n);
  else heap_sort(v, n);
}

/* Partitions so that v[k-1] is the k-th in order and everything before it comes before it. */
static void quickselect(dsv4_scored *v, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1;
  while (hi > lo) {
    /* median of three as the pivot, moved to hi */
    int64_t mid = lo + (hi - lo) / 2;
    if (dsv4_scored_before(v[mid], v[lo])) swap(&v[mid], &v[lo]);
    if (dsv4_scored_before(v[hi], v[lo])) swap(&v[hi], &v[lo]);
    if (dsv4_scored_before(v[mid], v[hi])) swap(&v[mid], &v[hi]);
    dsv4_scored pivot = v[hi];
    int64_t store = lo;
    for (int64_t i = lo; i < hi; i++)
      if (dsv4_scored_before(v[i], pivot)) swap(&v[i], &v[store++]);
    swap(&v[store], &v[hi]);
    if (store == k - 1) return;
    if (store < k - 1) lo = store + 1; else hi = store - 1;
  }
}

void dsv4_topk_select(dsv4_scored *v, int64_t n, int64_t k) {
  if (k <= 0 || n <= 0) return;
  if (k < n) quickselect(v, n, k);
  sort_scored(v, k < n ? k : n);
}

void dsv4_topk_write(dsv4_scored *v, int64_t n, int w, int32_t *ids, float *scores) {
  const int64_t k = n < w ? n : w;
  dsv4_topk_select(v, n, k);
  for (int64_t j = 0; j < w; j++) {
    ids[j] = j < k ? v[j].id : -1;
    if (scores) scores[j] = j < k ? v[j].score : -INFINITY;
  }
}
